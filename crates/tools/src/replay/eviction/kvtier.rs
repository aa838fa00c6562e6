//! kvtier's order as one of the replay's policies: the per-class recency lists of one
//! replayed tier, and the directory's own [`choose`] over their heads.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::{Access, Eviction};
use kvtier_core::policy::eviction::{choose, KvtierConfig, VictimCandidate, EVICTION_WINDOW};
use kvtier_core::policy::history::{frequency_class, History, FREQUENCY_CLASSES};
use kvtier_core::policy::BlockId;

/// What [`Kvtier`] remembers of a held block.
#[derive(Clone, Copy, Debug)]
struct Held {
    class: usize,
    /// Position in its class's recency list (a touch counter).
    sequence: u64,
    /// Time of its latest access, in milliseconds.
    last_ms: u64,
}

/// kvtier's order over the blocks of one replayed tier: one recency list per frequency
/// class, as the directory keeps per pool, and [`choose`] over their heads.
#[derive(Debug)]
pub struct Kvtier {
    config: KvtierConfig,
    capacity: usize,
    block_bytes: u64,
    /// Per class: touch counter → block, least recent first.
    classes: [BTreeMap<u64, BlockId>; FREQUENCY_CLASSES],
    held: HashMap<BlockId, Held>,
    next_sequence: u64,
}

impl Kvtier {
    /// An empty order holding at most `capacity` blocks of `block_bytes` each.
    pub fn new(capacity: usize, block_bytes: u64, config: KvtierConfig) -> Self {
        Self {
            config,
            capacity,
            block_bytes,
            classes: std::array::from_fn(|_| BTreeMap::new()),
            held: HashMap::new(),
            next_sequence: 0,
        }
    }

    /// The least recently used blocks of each class ([`EVICTION_WINDOW`] of each, least
    /// recent first), priced at `now_ms`. The replay's clock is both the policy's and the
    /// caller's, so idle time and age are the same.
    fn window(&self, now_ms: u64, history: &History) -> Vec<(BlockId, VictimCandidate)> {
        let mut window = Vec::with_capacity(FREQUENCY_CLASSES * EVICTION_WINDOW);
        for (class, list) in self.classes.iter().enumerate() {
            let reuse_probability = history.reuse_probability(class as u32 + 1);
            for block in list.values().take(EVICTION_WINDOW) {
                let last_ms = self.held.get(block).map_or(now_ms, |held| held.last_ms);
                let idle = Duration::from_millis(now_ms.saturating_sub(last_ms));
                let candidate = VictimCandidate {
                    bytes: self.block_bytes,
                    reuse_probability,
                    idle,
                    age: idle,
                    leased: false,
                };
                window.push((*block, candidate));
            }
        }
        window
    }

    /// Puts the block of `access` at the most recent end of its class's list.
    fn place(&mut self, access: &Access) {
        self.remove(access.block);
        let held = Held {
            class: frequency_class(access.frequency),
            sequence: self.next_sequence,
            last_ms: access.now_ms,
        };
        self.next_sequence += 1;
        self.classes[held.class].insert(held.sequence, access.block);
        self.held.insert(access.block, held);
    }
}

impl Eviction for Kvtier {
    fn name(&self) -> &'static str {
        "kvtier"
    }

    fn len(&self) -> usize {
        self.held.len()
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    /// Every block deserves a slot: placement decides where a block goes, and a full tier
    /// makes room by [`choose`].
    fn admit(&self, _access: &Access, _now_ms: u64, _history: &History) -> bool {
        self.capacity > 0
    }

    fn insert(&mut self, access: &Access) {
        self.place(access);
    }

    fn touch(&mut self, access: &Access) {
        self.place(access);
    }

    fn evict(&mut self, now_ms: u64, history: &History) -> Option<BlockId> {
        let window = self.window(now_ms, history);
        let candidates: Vec<VictimCandidate> =
            window.iter().map(|(_, candidate)| *candidate).collect();
        let (chosen, _) = choose(&candidates, &self.config);
        let block = window[chosen?].0;
        self.remove(block);
        Some(block)
    }

    fn remove(&mut self, block: BlockId) -> bool {
        match self.held.remove(&block) {
            Some(held) => self.classes[held.class].remove(&held.sequence).is_some(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::eviction::tests::{access, contract};
    use kvtier_core::policy::eviction::touch_order;

    fn kvtier(capacity: usize) -> Kvtier {
        Kvtier::new(
            capacity,
            1 << 20,
            KvtierConfig {
                horizon: Duration::from_millis(100),
                min_residency: Duration::ZERO,
            },
        )
    }

    #[test]
    fn contract_holds() {
        contract(Box::new(kvtier(2)));
    }

    #[test]
    fn tail_goes_before_head_and_frequent_outlives_recent() {
        let mut history = History::new();
        for now in 0..4 {
            history.record(100, now);
            history.record(101, now);
        }
        history.record(200, 5);
        let mut cache = kvtier(3);
        // A prompt's leading blocks 100, 101 touched in `touch_order`: tail first.
        let prompt = [100, 101];
        for position in touch_order(prompt.len()) {
            cache.touch(&access(prompt[position], 0));
        }
        assert_eq!(cache.evict(0, &history), Some(101), "the tail first");
        let frequent = |block, now_ms| Access {
            frequency: 4,
            ..access(block, now_ms)
        };
        cache.touch(&frequent(101, 40));
        cache.touch(&frequent(100, 40));
        cache.insert(&access(200, 50));
        // A frequent block idle for a while outlives a block seen once just now.
        assert_eq!(cache.evict(60, &history), Some(200));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn young_blocks_are_kept_and_an_empty_window_evicts_nothing() {
        let history = History::new();
        let mut cache = Kvtier::new(2, 1, KvtierConfig::for_capacity(2));
        cache.insert(&access(1, 100));
        cache.insert(&access(2, 110));
        assert_eq!(cache.evict(115, &history), None, "both younger than 20 ms");
        assert_eq!(cache.evict(125, &history), Some(1));
        assert_eq!(cache.evict(125, &history), None, "2 is 15 ms old");
        assert_eq!(cache.evict(130, &history), Some(2));
        assert!(cache.is_empty());
        assert!(!kvtier(0).admit(&access(1, 0), 0, &history), "no capacity");
    }
}
