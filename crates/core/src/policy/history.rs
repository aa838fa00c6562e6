//! Access history: per-object frequency and recency, and the reuse probability per
//! frequency class learned from it — the online stand-in for Belady's knowledge of the
//! future. Bounded by [`HISTORY_ENTRIES_MAX`] with two generations: when the current one
//! is full it becomes the previous one and the older is forgotten, so a long-running
//! directory keeps learning new objects and forgets those unseen for two generations.

use std::collections::HashMap;

use foldhash::fast::FixedState;

use super::BlockId;

/// Most objects whose history is remembered, over both generations. 2^21 entries (about
/// 64 MiB of metadata) is seven times the distinct blocks of the bundled trace.
pub const HISTORY_ENTRIES_MAX: usize = 1 << 21;

/// Number of frequency classes: seen once, twice, three times, four or more. More classes
/// split the evidence thinner without changing decisions on the bundled trace.
pub const FREQUENCY_CLASSES: usize = 4;

/// What is remembered of one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessStats {
    /// Accesses so far, including the latest.
    pub count: u32,
    /// Time of the latest access, in milliseconds.
    pub last_ms: u64,
}

/// Frequency and recency of every object seen, and per-class reuse counters.
#[derive(Debug)]
pub struct History {
    entries: HashMap<BlockId, AccessStats, FixedState>,
    /// The generation before `entries`; consulted (and moved from) on an access.
    previous: HashMap<BlockId, AccessStats, FixedState>,
    /// Entries per generation: `HISTORY_ENTRIES_MAX / 2` unless built smaller for a test.
    generation_entries: usize,
    class_entered: [u64; FREQUENCY_CLASSES],
    class_reused: [u64; FREQUENCY_CLASSES],
    forgotten: u64,
}

/// The class of an object accessed `count` times (1-based; 0 is treated as 1).
pub fn frequency_class(count: u32) -> usize {
    (count.max(1) as usize).min(FREQUENCY_CLASSES) - 1
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history of at most [`HISTORY_ENTRIES_MAX`] entries.
    pub fn new() -> Self {
        Self::with_entries(HISTORY_ENTRIES_MAX)
    }

    /// An empty history of at most `entries` entries (at least 2).
    pub fn with_entries(entries: usize) -> Self {
        Self {
            entries: HashMap::default(),
            previous: HashMap::default(),
            generation_entries: (entries / 2).max(1),
            class_entered: [0; FREQUENCY_CLASSES],
            class_reused: [0; FREQUENCY_CLASSES],
            forgotten: 0,
        }
    }

    /// Records an access to `block` at `now_ms` and returns its stats including it.
    pub fn record(&mut self, block: BlockId, now_ms: u64) -> AccessStats {
        let known = match self.entries.get(&block) {
            Some(stats) => Some(*stats),
            None => self.previous.remove(&block),
        };
        let stats = match known {
            Some(stats) => {
                self.class_reused[frequency_class(stats.count)] += 1;
                AccessStats {
                    count: stats.count.saturating_add(1),
                    last_ms: stats.last_ms.max(now_ms),
                }
            }
            None => AccessStats {
                count: 1,
                last_ms: now_ms,
            },
        };
        if !self.entries.contains_key(&block) && self.entries.len() >= self.generation_entries {
            self.forgotten += self.previous.len() as u64;
            self.previous = std::mem::take(&mut self.entries);
        }
        self.entries.insert(block, stats);
        self.class_entered[frequency_class(stats.count)] += 1;
        stats
    }

    /// The stats of `block`, if remembered.
    pub fn stats(&self, block: BlockId) -> Option<AccessStats> {
        self.entries
            .get(&block)
            .or_else(|| self.previous.get(&block))
            .copied()
    }

    /// Objects forgotten because two newer generations filled up since their last access.
    pub fn forgotten(&self) -> u64 {
        self.forgotten
    }

    /// Objects remembered now.
    pub fn len(&self) -> usize {
        self.entries.len() + self.previous.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The learned probability that an object accessed `count` times is accessed again:
    /// reuses over entries of its class with a uniform prior (one reuse in two entries).
    /// Never lower than the estimate of a less frequent class, so more accesses never
    /// lower an object's value. Always in (0, 1).
    pub fn reuse_probability(&self, count: u32) -> f64 {
        let class = frequency_class(count);
        (0..=class)
            .map(|index| {
                (self.class_reused[index] as f64 + 1.0) / (self.class_entered[index] as f64 + 2.0)
            })
            .fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_counts_and_keeps_the_latest_time() {
        let mut history = History::new();
        assert_eq!(
            history.record(7, 10),
            AccessStats {
                count: 1,
                last_ms: 10
            }
        );
        assert_eq!(
            history.record(7, 5),
            AccessStats {
                count: 2,
                last_ms: 10
            }
        );
        assert_eq!(history.stats(7).map(|stats| stats.count), Some(2));
        assert_eq!(history.stats(8), None);
    }

    #[test]
    fn reuse_probability_is_learned_and_monotone() {
        let mut history = History::new();
        assert_eq!(history.reuse_probability(1), 0.5);
        for block in 0..10 {
            history.record(block, 0);
        }
        history.record(0, 1);
        // class 0: 10 entered, 1 reused -> 2/12; class 1: 1 entered, 0 reused -> 1/3.
        assert!((history.reuse_probability(1) - 2.0 / 12.0).abs() < 1e-12);
        assert!((history.reuse_probability(2) - 1.0 / 3.0).abs() < 1e-12);
        assert!(history.reuse_probability(100) >= history.reuse_probability(2));
        assert_eq!(frequency_class(0), 0);
        assert_eq!(frequency_class(u32::MAX), FREQUENCY_CLASSES - 1);
    }

    #[test]
    fn a_full_history_ages_by_generations_and_stays_bounded() {
        let mut history = History::with_entries(4);
        history.record(1, 0);
        history.record(1, 1);
        history.record(2, 2);
        // Generation full (2 entries): 3 starts a new one; 1 and 2 are still known.
        history.record(3, 3);
        assert_eq!(history.stats(1).map(|stats| stats.count), Some(2));
        // An access moves 1 into the current generation with its count.
        assert_eq!(history.record(1, 4).count, 3);
        // The next rotation forgets 2, never accessed since.
        history.record(4, 5);
        assert_eq!(history.stats(2), None);
        assert_eq!(history.forgotten(), 1);
        assert_eq!(history.stats(1).map(|stats| stats.count), Some(3));
        for block in 10..1_000 {
            history.record(block, block);
            assert!(history.len() <= 4);
        }
    }
}
