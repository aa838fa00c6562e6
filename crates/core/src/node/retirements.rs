//! Replicas a node's SSD store dropped (their region was reclaimed) and still to retire at
//! the directory: a `RetireHeld` that was lost or refused is sent again from the node's task
//! loop, so a probe stops saying "on SSD" for bytes that are gone. Bounded in entries and in
//! attempts; what either bound drops is counted (the replica then stays at the directory
//! until its own eviction, and a load of it misses on the store).

use crate::directory::Holding;
use std::collections::VecDeque;

/// Most holdings waiting to be retired: a few regions' worth at the smallest objects (a
/// 64 MiB region holds at most 8,191 objects of one block), about 2.5 MiB of entries.
pub const RETIREMENTS_PENDING_MAX: usize = 32_768;

/// Sends of one holding before it is given up: at the node's task interval (50 ms), about
/// three seconds of a directory that does not answer or refuses.
pub const RETIRE_ATTEMPTS_MAX: u32 = 64;

/// The queue of holdings still to retire, in the order they were dropped.
#[derive(Debug, Default)]
pub struct Retirements {
    /// Each holding with the sends it has had.
    pending: VecDeque<(Holding, u32)>,
    /// Holdings given up: over [`RETIREMENTS_PENDING_MAX`] or [`RETIRE_ATTEMPTS_MAX`].
    dropped: u64,
}

/// A batch taken to send; give what was not retired back with [`Retirements::failed`].
#[derive(Debug, PartialEq)]
pub struct RetireBatch {
    /// The holdings, to name in one `RetireHeld`.
    pub holdings: Vec<Holding>,
    attempts: Vec<u32>,
}

impl Retirements {
    /// Holdings the store just dropped, to retire; those past the bound are dropped (the
    /// oldest waiting stay first in line). Returns how many were dropped.
    pub fn push(&mut self, holdings: impl IntoIterator<Item = Holding>) -> usize {
        let mut dropped = 0;
        for holding in holdings {
            if self.pending.len() < RETIREMENTS_PENDING_MAX {
                self.pending.push_back((holding, 0));
            } else {
                dropped += 1;
            }
        }
        self.dropped += dropped as u64;
        dropped
    }

    /// The next at most `items` holdings to send (`None` when none waits).
    pub fn take(&mut self, items: usize) -> Option<RetireBatch> {
        let count = items.max(1).min(self.pending.len());
        if count == 0 {
            return None;
        }
        let (holdings, attempts) = self
            .pending
            .drain(..count)
            .map(|(holding, attempts)| (holding, attempts + 1))
            .unzip();
        Some(RetireBatch { holdings, attempts })
    }

    /// `batch` was not retired (the call failed or was refused): its holdings go back to the
    /// front, in order, except those sent [`RETIRE_ATTEMPTS_MAX`] times or that no longer
    /// fit. Returns how many were dropped.
    pub fn failed(&mut self, batch: RetireBatch) -> usize {
        let mut dropped = 0;
        for (holding, attempts) in batch.holdings.into_iter().zip(batch.attempts).rev() {
            if attempts < RETIRE_ATTEMPTS_MAX && self.pending.len() < RETIREMENTS_PENDING_MAX {
                self.pending.push_front((holding, attempts));
            } else {
                dropped += 1;
            }
        }
        self.dropped += dropped as u64;
        dropped
    }

    /// Holdings waiting.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Holdings given up so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PrefixDigest;
    use crate::model::{AllocationId, Generation, Location, NamespaceId, ObjectId, PoolId};

    fn holding(index: u64) -> Holding {
        Holding {
            object: ObjectId {
                namespace: NamespaceId([3; 16]),
                prefix: PrefixDigest::ROOT.chain(&[index as u32]),
                shard: 0,
                part: 0,
            },
            location: Location {
                pool: PoolId(1),
                allocation: AllocationId(index * 8192),
                generation: Generation(1),
                offset_bytes: index * 8192,
                length_bytes: 4096,
            },
        }
    }

    #[test]
    fn a_failed_batch_is_sent_again_first_and_in_order() {
        let mut retirements = Retirements::default();
        retirements.push((0..5).map(holding));
        let first = retirements.take(3).unwrap();
        assert_eq!(first.holdings, (0..3).map(holding).collect::<Vec<_>>());
        assert_eq!(retirements.failed(first), 0);
        assert_eq!(retirements.len(), 5);
        let again = retirements.take(10).unwrap();
        assert_eq!(again.holdings, (0..5).map(holding).collect::<Vec<_>>());
        assert!(retirements.is_empty() && retirements.take(10).is_none());
    }

    #[test]
    fn a_holding_is_given_up_after_its_attempts() {
        let mut retirements = Retirements::default();
        retirements.push([holding(0)]);
        for _ in 1..RETIRE_ATTEMPTS_MAX {
            let batch = retirements.take(1).unwrap();
            assert_eq!(retirements.failed(batch), 0);
        }
        let last = retirements.take(1).unwrap();
        assert_eq!(
            retirements.failed(last),
            1,
            "sent {RETIRE_ATTEMPTS_MAX} times"
        );
        assert!(retirements.is_empty());
        assert_eq!(retirements.dropped(), 1);
    }

    #[test]
    fn the_queue_keeps_its_bound_and_counts_what_it_drops() {
        let mut retirements = Retirements::default();
        let over = 10;
        let pushed = retirements.push((0..(RETIREMENTS_PENDING_MAX + over) as u64).map(holding));
        assert_eq!(pushed, over);
        assert_eq!(retirements.len(), RETIREMENTS_PENDING_MAX);
        let batch = retirements.take(4).unwrap();
        retirements.push((0..2).map(holding));
        assert_eq!(
            retirements.failed(batch),
            2,
            "only what fits goes back: the batch's last two, the first two are dropped"
        );
        assert_eq!(retirements.len(), RETIREMENTS_PENDING_MAX);
        assert_eq!(retirements.dropped(), over as u64 + 2);
        let next = retirements.take(2).unwrap();
        assert_eq!(next.holdings, vec![holding(2), holding(3)]);
    }
}
