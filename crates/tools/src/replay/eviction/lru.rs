//! Least recently used: evicts the block whose last access is oldest.

use std::collections::{BTreeMap, HashMap};

use super::{Access, Eviction};
use kvtier_core::policy::history::History;
use kvtier_core::policy::BlockId;

/// LRU over a logical clock that ticks once per insert or touch.
#[derive(Debug)]
pub struct Lru {
    capacity: usize,
    tick: u64,
    by_tick: BTreeMap<u64, BlockId>,
    ticks: HashMap<BlockId, u64>,
}

impl Lru {
    /// An empty LRU holding at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            tick: 0,
            by_tick: BTreeMap::new(),
            ticks: HashMap::new(),
        }
    }

    fn stamp(&mut self, block: BlockId) {
        self.tick += 1;
        if let Some(old) = self.ticks.insert(block, self.tick) {
            self.by_tick.remove(&old);
        }
        self.by_tick.insert(self.tick, block);
    }
}

impl Eviction for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn len(&self) -> usize {
        self.ticks.len()
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    /// LRU admits everything.
    fn admit(&self, _access: &Access, _now_ms: u64, _history: &History) -> bool {
        self.capacity > 0
    }

    fn insert(&mut self, access: &Access) {
        self.stamp(access.block);
    }

    fn touch(&mut self, access: &Access) {
        self.stamp(access.block);
    }

    fn evict(&mut self, _now_ms: u64, _history: &History) -> Option<BlockId> {
        let (_, block) = self.by_tick.pop_first()?;
        self.ticks.remove(&block);
        Some(block)
    }

    fn remove(&mut self, block: BlockId) -> bool {
        match self.ticks.remove(&block) {
            Some(tick) => self.by_tick.remove(&tick).is_some(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::eviction::tests::{access, contract};

    #[test]
    fn contract_holds() {
        contract(Box::new(Lru::new(2)));
    }

    #[test]
    fn evicts_least_recently_touched() {
        let history = History::new();
        let mut lru = Lru::new(3);
        for block in [1, 2, 3] {
            lru.insert(&access(block, 0));
        }
        lru.touch(&access(1, 1));
        assert_eq!(lru.evict(2, &history), Some(2));
        assert_eq!(lru.evict(2, &history), Some(3));
        assert_eq!(lru.evict(2, &history), Some(1));
        assert!(!Lru::new(0).admit(&access(1, 0), 0, &history));
    }
}
