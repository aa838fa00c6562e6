//! kvtier's eviction order: prefix-aware and reuse-aware.
//!
//! A block's value is the learned probability that a block of its frequency class is used
//! again ([`History::reuse_probability`]) times a hazard that decays with idle time,
//! `1 / (idle + horizon)`: a Belady-like estimate of how soon it is needed, from history
//! only. The block with the lowest value goes first; on a tie the deeper block goes first,
//! so a prefix loses its tail before its head (a tail is worthless without its head).
//! Because a parent is accessed whenever its child is, it is never less frequent nor
//! older, so the order only evicts leaves of the prefix tree.
//!
//! Admission: a partial block seen once (a prompt's ragged end, never a prefix of a later
//! prompt), a block whose parent is gone, and a block worth less than the current victim
//! are refused.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, HashMap};

use super::{Access, Eviction};
use crate::policy::history::{frequency_class, History, FREQUENCY_CLASSES};
use crate::policy::BlockId;

/// Settings of kvtier's eviction order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvtierConfig {
    /// Idle time at which a block's hazard has halved, in milliseconds. Longer favours
    /// frequency, shorter favours recency. 120 s is about the median reuse gap of the
    /// bundled trace.
    pub horizon_ms: u64,
    /// Tokens in a full block; a block with fewer is partial.
    pub block_tokens: u32,
}

/// Horizon times capacity, in block-milliseconds: the horizon a tier of one block would
/// use. A tier of `n` blocks uses `HORIZON_BLOCK_MS / n` (160 s at 3k blocks, 16 s at
/// 30k): a small cache keeps only what is reused often (a long horizon weighs frequency),
/// a large one can afford recency (a short horizon weighs idle time). Chosen on the
/// bundled trace; see [`KvtierConfig::for_capacity`].
pub const HORIZON_BLOCK_MS: u64 = 480_000_000;
/// Shortest horizon [`KvtierConfig::for_capacity`] picks, in milliseconds.
pub const HORIZON_MS_MIN: u64 = 10_000;
/// Longest horizon [`KvtierConfig::for_capacity`] picks, in milliseconds.
pub const HORIZON_MS_MAX: u64 = 600_000;

impl KvtierConfig {
    /// The settings for a cache of `blocks` blocks in all (the sum over the tiers of a
    /// stack, so every tier ranks blocks alike): the horizon shrinks as the capacity grows,
    /// `HORIZON_BLOCK_MS / blocks` clamped to [`HORIZON_MS_MIN`, `HORIZON_MS_MAX`].
    pub fn for_capacity(blocks: usize) -> Self {
        Self {
            horizon_ms: horizon_ms_for_capacity(u64::try_from(blocks).unwrap_or(u64::MAX)),
            ..Self::default()
        }
    }
}

/// The horizon of a cache of `blocks` blocks, in milliseconds: `HORIZON_BLOCK_MS / blocks`
/// clamped to [`HORIZON_MS_MIN`, `HORIZON_MS_MAX`].
pub fn horizon_ms_for_capacity(blocks: u64) -> u64 {
    (HORIZON_BLOCK_MS / blocks.max(1)).clamp(HORIZON_MS_MIN, HORIZON_MS_MAX)
}

impl Default for KvtierConfig {
    fn default() -> Self {
        Self {
            horizon_ms: 120_000,
            block_tokens: 512,
        }
    }
}

/// Position of a held block in its class, oldest and deepest first.
type Key = (u64, Reverse<u32>, BlockId);

/// kvtier's order over the blocks of one tier.
#[derive(Debug)]
pub struct Kvtier {
    config: KvtierConfig,
    capacity: usize,
    classes: [BTreeSet<Key>; FREQUENCY_CLASSES],
    held: HashMap<BlockId, (usize, Key)>,
}

impl Kvtier {
    /// An empty order holding at most `capacity` blocks.
    pub fn new(capacity: usize, config: KvtierConfig) -> Self {
        Self {
            config,
            capacity,
            classes: std::array::from_fn(|_| BTreeSet::new()),
            held: HashMap::new(),
        }
    }

    /// The value of a block of `frequency` idle since `last_ms`, at `now_ms`.
    fn value(&self, history: &History, frequency: u32, last_ms: u64, now_ms: u64) -> f64 {
        let idle_ms = now_ms.saturating_sub(last_ms) as f64;
        history.reuse_probability(frequency) / (idle_ms + self.config.horizon_ms.max(1) as f64)
    }

    /// The least valuable held block: the cheapest head among the classes (within a class
    /// the head is the least valuable, since all share one probability).
    fn victim(&self, now_ms: u64, history: &History) -> Option<(f64, usize, Key)> {
        let mut best: Option<(f64, usize, Key)> = None;
        for (class, keys) in self.classes.iter().enumerate() {
            let Some(key) = keys.first() else { continue };
            let value = self.value(history, class as u32 + 1, key.0, now_ms);
            let better = match &best {
                None => true,
                Some((best_value, _, best_key)) => match value.total_cmp(best_value) {
                    Ordering::Less => true,
                    Ordering::Equal => key.1 < best_key.1,
                    Ordering::Greater => false,
                },
            };
            if better {
                best = Some((value, class, *key));
            }
        }
        best
    }

    fn place(&mut self, access: &Access) {
        self.remove(access.block);
        let class = frequency_class(access.frequency);
        let key = (access.now_ms, Reverse(access.depth), access.block);
        self.classes[class].insert(key);
        self.held.insert(access.block, (class, key));
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

    fn admit(&self, access: &Access, now_ms: u64, history: &History) -> bool {
        let partial_once = access.tokens < self.config.block_tokens && access.frequency <= 1;
        if self.capacity == 0 || partial_once || !access.parent_resident {
            return false;
        }
        if self.len() < self.capacity {
            return true;
        }
        let incoming = self.value(history, access.frequency, access.now_ms, now_ms);
        self.victim(now_ms, history)
            .is_none_or(|(value, _, _)| incoming > value)
    }

    fn insert(&mut self, access: &Access) {
        self.place(access);
    }

    fn touch(&mut self, access: &Access) {
        self.place(access);
    }

    fn evict(&mut self, now_ms: u64, history: &History) -> Option<BlockId> {
        let (_, class, key) = self.victim(now_ms, history)?;
        self.classes[class].remove(&key);
        self.held.remove(&key.2);
        Some(key.2)
    }

    fn remove(&mut self, block: BlockId) -> bool {
        match self.held.remove(&block) {
            Some((class, key)) => self.classes[class].remove(&key),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::eviction::tests::{access, contract};

    fn kvtier(capacity: usize) -> Kvtier {
        Kvtier::new(
            capacity,
            KvtierConfig {
                horizon_ms: 100,
                block_tokens: 512,
            },
        )
    }

    #[test]
    fn contract_holds() {
        contract(Box::new(kvtier(2)));
    }

    #[test]
    fn horizon_shrinks_with_capacity_within_bounds() {
        let horizon = |blocks| KvtierConfig::for_capacity(blocks).horizon_ms;
        assert_eq!(horizon(0), HORIZON_MS_MAX);
        assert_eq!(horizon(1_000), 480_000);
        assert_eq!(horizon(3_000), 160_000);
        assert_eq!(horizon(30_000), 16_000);
        assert_eq!(horizon(usize::MAX), HORIZON_MS_MIN);
        assert!(horizon(10_000) < horizon(3_000));
    }

    #[test]
    fn admission_table() {
        let mut history = History::new();
        for _ in 0..3 {
            history.record(9, 0);
        }
        let full_access = access(1, 0);
        // (access, admitted by an empty cache of capacity 1)
        let rows = [
            (full_access, true),
            (
                Access {
                    tokens: 100,
                    ..full_access
                },
                false,
            ),
            (
                Access {
                    tokens: 100,
                    frequency: 2,
                    ..full_access
                },
                true,
            ),
            (
                Access {
                    parent_resident: false,
                    ..full_access
                },
                false,
            ),
        ];
        for (candidate, admitted) in rows {
            assert_eq!(
                kvtier(1).admit(&candidate, candidate.now_ms, &history),
                admitted,
                "{candidate:?}"
            );
        }
        assert!(
            !kvtier(0).admit(&full_access, full_access.now_ms, &history),
            "invalid: no capacity"
        );
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
        cache.insert(&Access {
            depth: 0,
            ..access(100, 0)
        });
        cache.insert(&Access {
            depth: 1,
            ..access(101, 0)
        });
        assert_eq!(cache.evict(0, &history), Some(101), "the tail first");
        cache.insert(&Access {
            depth: 1,
            ..access(101, 0)
        });
        // A frequent block idle for a while beats a block seen once just now.
        let frequent = Access {
            frequency: 4,
            depth: 0,
            ..access(100, 40)
        };
        cache.touch(&frequent);
        cache.touch(&Access {
            frequency: 4,
            depth: 1,
            ..access(101, 40)
        });
        cache.insert(&access(200, 50));
        assert_eq!(cache.evict(60, &history), Some(200));
        // Exactly full: a newcomer worth less than the victim is refused.
        cache.insert(&access(200, 50));
        assert_eq!(cache.len(), 3);
        let stale = Access {
            now_ms: 60,
            ..access(300, 60)
        };
        assert!(
            cache.admit(&stale, stale.now_ms, &history),
            "a fresh block outranks an idle one-timer"
        );
        assert_eq!(cache.evict(60, &history), Some(200));
        let mut hot = kvtier(2);
        hot.insert(&frequent);
        hot.insert(&Access {
            frequency: 4,
            depth: 1,
            ..access(101, 40)
        });
        assert!(
            !hot.admit(&access(300, 40), 40, &history),
            "one over: a one-timer is refused"
        );
    }
}
