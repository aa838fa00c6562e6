//! Access history: per-object frequency and recency, and the reuse probability per
//! frequency class learned from it — the online stand-in for Belady's knowledge of the
//! future. Bounded by [`HISTORY_ENTRIES_MAX`].

use std::collections::HashMap;

use super::BlockId;

/// Most objects whose history is remembered. 2^21 entries (about 48 MiB of metadata) is
/// eleven times the distinct blocks of the bundled trace; past it new objects are counted
/// as dropped and treated as first seen.
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
#[derive(Debug, Default)]
pub struct History {
    entries: HashMap<BlockId, AccessStats>,
    class_entered: [u64; FREQUENCY_CLASSES],
    class_reused: [u64; FREQUENCY_CLASSES],
    dropped: u64,
}

/// The class of an object accessed `count` times (1-based; 0 is treated as 1).
pub fn frequency_class(count: u32) -> usize {
    (count.max(1) as usize).min(FREQUENCY_CLASSES) - 1
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an access to `block` at `now_ms` and returns its stats including it.
    /// When the history is full a new object is not remembered (counted in
    /// [`History::dropped`]) and reported as first seen.
    pub fn record(&mut self, block: BlockId, now_ms: u64) -> AccessStats {
        let full = self.entries.len() >= HISTORY_ENTRIES_MAX;
        let stats = match self.entries.get_mut(&block) {
            Some(stats) => {
                self.class_reused[frequency_class(stats.count)] += 1;
                stats.count = stats.count.saturating_add(1);
                stats.last_ms = stats.last_ms.max(now_ms);
                *stats
            }
            None => {
                let stats = AccessStats {
                    count: 1,
                    last_ms: now_ms,
                };
                if full {
                    self.dropped += 1;
                } else {
                    self.entries.insert(block, stats);
                }
                stats
            }
        };
        self.class_entered[frequency_class(stats.count)] += 1;
        stats
    }

    /// The stats of `block`, if remembered.
    pub fn stats(&self, block: BlockId) -> Option<AccessStats> {
        self.entries.get(&block).copied()
    }

    /// Objects not remembered because the history was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
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
}
