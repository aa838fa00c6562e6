//! Who writes in an extent of a shared pool, recorded in the shared memory itself, so that
//! a node that was out of reach for longer than its fence window can tell, without any
//! directory, whether another node was granted its extent meanwhile.
//!
//! Each extent has one 64-bit owner word in the pool's header page (`backends::
//! shared_memory`): the owning node's id plus one in the low half (0: nobody yet), a
//! generation in the high half. A node changes the word only by compare-and-swap, and only
//! in two ways: when the directory grants it the extent (from the word the directory last
//! knew; when it knows none, only from a word naming nobody or the grantee) and when it
//! claims the extent back in a rejoin (from a word that still names it). Every change bumps
//! the generation, so of two nodes that race for one extent from the same word exactly one
//! wins, and a grant a dead directory sent before a claim to its successor fails once the
//! claim moved the word on. A node writes bytes in an extent only after its swap succeeded.
//! Every extent given back carries its word, so the directory learns the words of the
//! extents it hands out.

use super::NodeId;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

/// The owner word of one extent (see the module documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OwnerWord(pub u64);

impl OwnerWord {
    /// The word of an extent nobody has owned since the pool was formatted.
    pub const NOBODY: OwnerWord = OwnerWord(0);

    /// The node the word names, if any.
    pub fn owner(self) -> Option<NodeId> {
        let low = self.0 as u32;
        low.checked_sub(1).map(NodeId)
    }

    /// How many times the word changed (wrapping).
    pub fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The word after `node` takes the extent: the next generation, naming `node`.
    pub fn taken_by(self, node: NodeId) -> OwnerWord {
        let generation = u64::from(self.generation().wrapping_add(1));
        OwnerWord(generation << 32 | u64::from(node.0.wrapping_add(1)))
    }
}

/// The owner words of a shared pool, indexed by extent (offset / extent length).
pub trait OwnerTable {
    /// The word of extent `index`; `None` when the table does not reach it.
    fn owner_word(&self, index: u64) -> Option<OwnerWord>;

    /// Sets the word of extent `index` to `new` if it still equals `expected`; otherwise
    /// the word found (`None` when the table does not reach the extent).
    fn replace_owner_word(
        &self,
        index: u64,
        expected: OwnerWord,
        new: OwnerWord,
    ) -> Result<(), Option<OwnerWord>>;
}

/// Which word a node takes an extent from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeFrom {
    /// A grant, from the word the directory last knew.
    Known(OwnerWord),
    /// A grant of an extent whose word the directory never learnt (a new incarnation's
    /// first grant of it): from a word that names nobody or the grantee, never another
    /// node (the grantee gives the extent back with the word it found, which the directory
    /// grants it from next). So a grant a dead incarnation sent never takes an extent a node
    /// claimed from its successor, known word or not.
    Unknown,
    /// A claim in a rejoin: from a word that names the claiming node, and only such a word.
    Held,
}

/// How taking an extent ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The word now names the node: it may write in the extent. Carries the new word.
    Taken(OwnerWord),
    /// The table does not reach this extent (a header page too small for the pool's
    /// extent count): nothing in shared memory records its owner.
    Untracked,
    /// Another node took it, or the word moved on since the directory knew it: the node
    /// must not write in it. Carries the word found.
    Refused(OwnerWord),
}

/// Takes extent `index` of `table` for `node` (see [`TakeFrom`]).
pub fn take_extent(table: &dyn OwnerTable, index: u64, node: NodeId, from: TakeFrom) -> Ownership {
    let Some(current) = table.owner_word(index) else {
        return Ownership::Untracked;
    };
    let expected = match from {
        TakeFrom::Known(word) => word,
        TakeFrom::Unknown if current.owner().is_none_or(|owner| owner == node) => current,
        TakeFrom::Unknown => return Ownership::Refused(current),
        TakeFrom::Held if current.owner() == Some(node) => current,
        TakeFrom::Held => return Ownership::Refused(current),
    };
    let new = expected.taken_by(node);
    match table.replace_owner_word(index, expected, new) {
        Ok(()) => Ownership::Taken(new),
        Err(Some(found)) => Ownership::Refused(found),
        Err(None) => Ownership::Untracked,
    }
}

/// Owner words in process memory, `extents` of them, all naming nobody: the simulation's
/// shared pools, and the tests'.
#[derive(Debug)]
pub struct OwnerWordsInMemory(RefCell<Vec<OwnerWord>>);

impl OwnerWordsInMemory {
    pub fn new(extents: usize) -> OwnerWordsInMemory {
        OwnerWordsInMemory(RefCell::new(vec![OwnerWord::NOBODY; extents]))
    }
}

impl OwnerTable for OwnerWordsInMemory {
    fn owner_word(&self, index: u64) -> Option<OwnerWord> {
        self.0.borrow().get(index as usize).copied()
    }

    fn replace_owner_word(
        &self,
        index: u64,
        expected: OwnerWord,
        new: OwnerWord,
    ) -> Result<(), Option<OwnerWord>> {
        let mut words = self.0.borrow_mut();
        let word = words
            .get_mut(usize::try_from(index).map_err(|_| None)?)
            .ok_or(None)?;
        if *word != expected {
            return Err(Some(*word));
        }
        *word = new;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn table(extents: usize) -> OwnerWordsInMemory {
        OwnerWordsInMemory::new(extents)
    }

    const A: NodeId = NodeId(0);
    const B: NodeId = NodeId(7);

    #[test]
    fn a_word_names_its_owner_and_counts_its_changes() {
        assert_eq!(OwnerWord::NOBODY.owner(), None);
        let word = OwnerWord::NOBODY.taken_by(A);
        assert_eq!((word.owner(), word.generation()), (Some(A), 1));
        let word = word.taken_by(B);
        assert_eq!((word.owner(), word.generation()), (Some(B), 2));
        let wrapped = OwnerWord(u64::from(u32::MAX) << 32 | 1).taken_by(A);
        assert_eq!((wrapped.owner(), wrapped.generation()), (Some(A), 0));
    }

    #[test]
    fn a_claim_loses_to_a_grant_that_moved_the_word() {
        let table = table(2);
        let Ownership::Taken(a_word) = take_extent(&table, 0, A, TakeFrom::Unknown) else {
            panic!("a fresh extent is taken");
        };
        // The directory fenced A and granted the extent to B, from the word it knew.
        assert!(matches!(
            take_extent(&table, 0, B, TakeFrom::Known(a_word)),
            Ownership::Taken(_)
        ));
        assert_eq!(
            take_extent(&table, 0, A, TakeFrom::Held),
            Ownership::Refused(a_word.taken_by(B))
        );
    }

    #[test]
    fn a_stale_grant_loses_to_a_claim_that_moved_the_word() {
        let table = table(1);
        let Ownership::Taken(a_word) = take_extent(&table, 0, A, TakeFrom::Unknown) else {
            panic!("a fresh extent is taken");
        };
        // A claims it back from a new directory before B acts on the old one's grant.
        let Ownership::Taken(claimed) = take_extent(&table, 0, A, TakeFrom::Held) else {
            panic!("A still holds it");
        };
        assert_eq!(
            take_extent(&table, 0, B, TakeFrom::Known(a_word)),
            Ownership::Refused(claimed)
        );
        assert_eq!(
            take_extent(&table, 1, A, TakeFrom::Held),
            Ownership::Untracked,
            "past the table"
        );
    }

    #[test]
    fn a_grant_of_an_unknown_word_never_takes_another_nodes_extent() {
        let table = table(1);
        let Ownership::Taken(claimed) = take_extent(&table, 0, A, TakeFrom::Unknown) else {
            panic!("a fresh extent is taken");
        };
        assert_eq!(
            take_extent(&table, 0, B, TakeFrom::Unknown),
            Ownership::Refused(claimed),
            "a grant whose sender never knew the word leaves A's extent alone"
        );
        // Given back with the word found, the directory grants it from that word next.
        assert!(matches!(
            take_extent(&table, 0, B, TakeFrom::Known(claimed)),
            Ownership::Taken(_)
        ));
    }
}
