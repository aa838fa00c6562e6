//! Belady's offline optimum for block caches: evict the block whose next use is farthest
//! in the future, and never admit a block used no more or later than every resident one.
//! It reads [`Access::next_use`], so it only runs in replays.

use std::collections::{BTreeSet, HashMap};

use super::{Access, Eviction};
use kvtier_core::policy::history::History;
use kvtier_core::policy::BlockId;

/// Next-use key of a block never used again.
const NEVER: u64 = u64::MAX;

/// Belady's MIN with bypass. Ties on the next use evict the larger block id.
#[derive(Debug)]
pub struct Belady {
    capacity: usize,
    by_next_use: BTreeSet<(u64, BlockId)>,
    next_uses: HashMap<BlockId, u64>,
}

impl Belady {
    /// An empty Belady cache holding at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            by_next_use: BTreeSet::new(),
            next_uses: HashMap::new(),
        }
    }

    fn set(&mut self, access: &Access) {
        let key = access.next_use.unwrap_or(NEVER);
        if let Some(old) = self.next_uses.insert(access.block, key) {
            self.by_next_use.remove(&(old, access.block));
        }
        self.by_next_use.insert((key, access.block));
    }
}

impl Eviction for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }

    fn len(&self) -> usize {
        self.next_uses.len()
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    /// Admits a block with a next use, if there is room or it is needed sooner than the
    /// farthest resident block.
    fn admit(&self, access: &Access, _now_ms: u64, _history: &History) -> bool {
        let Some(next_use) = access.next_use else {
            return false;
        };
        if self.len() < self.capacity {
            return true;
        }
        self.by_next_use
            .last()
            .is_some_and(|farthest| (next_use, access.block) < *farthest)
    }

    fn insert(&mut self, access: &Access) {
        self.set(access);
    }

    fn touch(&mut self, access: &Access) {
        self.set(access);
    }

    fn evict(&mut self, _now_ms: u64, _history: &History) -> Option<BlockId> {
        let (_, block) = self.by_next_use.pop_last()?;
        self.next_uses.remove(&block);
        Some(block)
    }

    fn remove(&mut self, block: BlockId) -> bool {
        match self.next_uses.remove(&block) {
            Some(key) => self.by_next_use.remove(&(key, block)),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::eviction::tests::{access, contract};

    fn at(block: BlockId, next_use: Option<u64>) -> Access {
        Access {
            next_use,
            ..access(block, 0)
        }
    }

    #[test]
    fn contract_holds() {
        contract(Box::new(Belady::new(2)));
    }

    #[test]
    fn evicts_farthest_and_bypasses_useless_blocks() {
        let history = History::new();
        let mut belady = Belady::new(2);
        belady.insert(&at(1, Some(10)));
        belady.insert(&at(2, Some(5)));
        assert!(!belady.admit(&at(3, None), 0, &history), "never used again");
        assert!(
            !belady.admit(&at(3, Some(20)), 0, &history),
            "needed later than all"
        );
        assert!(belady.admit(&at(3, Some(7)), 0, &history));
        belady.touch(&at(2, None));
        assert_eq!(
            belady.evict(0, &history),
            Some(2),
            "a block never used again goes first"
        );
        assert_eq!(belady.evict(0, &history), Some(1));
    }
}
