//! kvtier's eviction order, the one implementation: the directory's eviction
//! (`Directory::evict`, over its per-pool recency lists) and the replay's `kvtier` row
//! (`replay::eviction::Kvtier`, over the per-class recency lists it keeps for one tier)
//! both choose their victim with [`choose`].
//!
//! A candidate's worth is its expected reuse per byte held:
//! `reuse_probability / (idle + horizon) / bytes`. The reuse probability is learned per
//! frequency class from the access history ([`History::reuse_probability`]), the hazard
//! `1 / (idle + horizon)` decays with idle time (a Belady-like estimate of how soon it is
//! needed, from history only), and size makes a large cold object go before a small cold
//! one. The caller offers the least recently used objects of each frequency class (the
//! head of each class's recency list, [`EVICTION_WINDOW`] deep), least recent first; the
//! least worth goes, the first offered on a tie. Within a class every candidate shares one
//! probability, so a class's least recent object of a given size is its least valuable.
//!
//! Prefix tails go first: a request's cached blocks are touched in [`touch_order`], last
//! block first, so the head of a prefix ends the most recent and its tail is offered
//! before it (a tail is worthless without its head). Leased candidates and candidates
//! younger than the minimum residency are never chosen.

use std::time::Duration;

/// Horizon times capacity, in block-milliseconds: the horizon a tier of one object would
/// use. A tier of `n` objects uses `HORIZON_BLOCK_MS / n` (160 s at 3k, 16 s at 30k): a
/// small cache keeps only what is reused often (a long horizon weighs frequency), a large
/// one can afford recency (a short horizon weighs idle time). Chosen on the bundled trace.
pub const HORIZON_BLOCK_MS: u64 = 480_000_000;
/// Shortest horizon [`horizon_ms_for_capacity`] picks, in milliseconds.
pub const HORIZON_MS_MIN: u64 = 10_000;
/// Longest horizon [`horizon_ms_for_capacity`] picks, in milliseconds.
pub const HORIZON_MS_MAX: u64 = 600_000;
/// The shortest residency before an object may be evicted. The engine that stored a chunk
/// usually reads it back within moments, so a burst of stores must not evict each other
/// before that; a longer guard would let a full pool refuse stores instead of making room.
pub const MIN_RESIDENCY: Duration = Duration::from_millis(20);
/// Least recently used objects offered per frequency class and eviction: deep enough to
/// step over leased and young heads, short enough that one choice stays a few dozen
/// comparisons.
pub const EVICTION_WINDOW: usize = 16;

/// The horizon of a tier of `objects` objects, in milliseconds: `HORIZON_BLOCK_MS /
/// objects` clamped to [`HORIZON_MS_MIN`, `HORIZON_MS_MAX`].
pub fn horizon_ms_for_capacity(objects: u64) -> u64 {
    (HORIZON_BLOCK_MS / objects.max(1)).clamp(HORIZON_MS_MIN, HORIZON_MS_MAX)
}

/// Settings of kvtier's eviction order for one tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvtierConfig {
    /// Idle time at which a candidate's hazard has halved. Longer favours frequency,
    /// shorter favours recency.
    pub horizon: Duration,
    /// A candidate accessed (or stored) more recently than this is not evicted.
    pub min_residency: Duration,
}

impl KvtierConfig {
    /// The settings for a tier holding about `objects` objects: the horizon of
    /// [`horizon_ms_for_capacity`] and [`MIN_RESIDENCY`].
    pub fn for_capacity(objects: u64) -> Self {
        Self {
            horizon: Duration::from_millis(horizon_ms_for_capacity(objects)),
            min_residency: MIN_RESIDENCY,
        }
    }
}

/// One eviction candidate, as its caller's snapshot has it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VictimCandidate {
    /// Bytes it holds in the tier.
    pub bytes: u64,
    /// The learned probability that an object of its frequency class is accessed again.
    pub reuse_probability: f64,
    /// Time since its last access (or its store, if never read), on the policy's clock.
    pub idle: Duration,
    /// Time since its last access or store, on the caller's clock (the minimum residency
    /// is measured on it).
    pub age: Duration,
    /// A reader holds it, or it is being moved: it may not be chosen.
    pub leased: bool,
}

/// Why a candidate was chosen, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VictimReason {
    /// The least expected reuse per byte among the eligible candidates.
    LeastValuable,
    /// No candidate is eligible (none offered, or all leased or too young).
    NoneEligible,
}

/// Expected reuse per byte of `candidate` (higher is more valuable).
pub fn worth(candidate: &VictimCandidate, config: &KvtierConfig) -> f64 {
    let hazard = 1.0 / (candidate.idle + config.horizon).as_secs_f64().max(1e-9);
    candidate.reuse_probability * hazard / candidate.bytes.max(1) as f64
}

/// Whether `candidate` may be evicted at all: not leased, and at least the minimum
/// residency old.
pub fn eligible(candidate: &VictimCandidate, config: &KvtierConfig) -> bool {
    !candidate.leased && candidate.age >= config.min_residency
}

/// The index of the candidate to evict, or `None`, with the reason. The caller offers each
/// frequency class's least recently used candidates, least recent first; the eligible
/// candidate of least [`worth`] is chosen, the first offered on a tie. Pure.
pub fn choose(
    candidates: &[VictimCandidate],
    config: &KvtierConfig,
) -> (Option<usize>, VictimReason) {
    let chosen = candidates
        .iter()
        .enumerate()
        .filter(|(_, candidate)| eligible(candidate, config))
        .min_by(|(_, left), (_, right)| worth(left, config).total_cmp(&worth(right, config)))
        .map(|(index, _)| index);
    match chosen {
        Some(index) => (Some(index), VictimReason::LeastValuable),
        None => (None, VictimReason::NoneEligible),
    }
}

/// The order in which a request touches its `hits` leading cached blocks (indices into
/// the prompt): last first, so the head of the prefix ends the most recent and is offered
/// for eviction after its tail.
pub fn touch_order(hits: usize) -> impl Iterator<Item = usize> {
    (0..hits).rev()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: KvtierConfig = KvtierConfig {
        horizon: Duration::from_secs(120),
        min_residency: MIN_RESIDENCY,
    };

    fn candidate(bytes: u64, reuse_probability: f64, idle_seconds: u64) -> VictimCandidate {
        VictimCandidate {
            bytes,
            reuse_probability,
            idle: Duration::from_secs(idle_seconds),
            age: Duration::from_secs(600),
            leased: false,
        }
    }

    #[test]
    fn table_of_choices() {
        let young = VictimCandidate {
            age: Duration::ZERO,
            ..candidate(1, 0.01, 9999)
        };
        let leased = VictimCandidate {
            leased: true,
            ..candidate(1, 0.01, 9999)
        };
        let cases: Vec<(&str, Vec<VictimCandidate>, Option<usize>)> = vec![
            ("empty", vec![], None),
            (
                "colder goes first",
                vec![candidate(1 << 20, 0.2, 10), candidate(1 << 20, 0.2, 500)],
                Some(1),
            ),
            (
                "a likely reuse protects",
                vec![candidate(1 << 20, 0.9, 300), candidate(1 << 20, 0.1, 100)],
                Some(1),
            ),
            (
                "larger goes first",
                vec![candidate(1 << 20, 0.2, 100), candidate(4 << 20, 0.2, 100)],
                Some(1),
            ),
            (
                "a tie goes to the first offered",
                vec![candidate(1 << 20, 0.2, 100), candidate(1 << 20, 0.2, 100)],
                Some(0),
            ),
            (
                "leased never",
                vec![leased, candidate(1 << 20, 0.9, 1)],
                Some(1),
            ),
            ("young never", vec![young], None),
            ("all leased", vec![leased, leased], None),
        ];
        for (name, candidates, expected) in cases {
            assert_eq!(choose(&candidates, &CONFIG).0, expected, "{name}");
        }
        assert_eq!(choose(&[], &CONFIG).1, VictimReason::NoneEligible);
        assert_eq!(
            choose(&[candidate(1, 0.5, 1)], &CONFIG).1,
            VictimReason::LeastValuable
        );
    }

    #[test]
    fn horizon_shrinks_with_capacity_within_bounds() {
        let horizon = |objects| KvtierConfig::for_capacity(objects).horizon;
        assert_eq!(horizon(0), Duration::from_millis(HORIZON_MS_MAX));
        assert_eq!(horizon(1_000), Duration::from_secs(480));
        assert_eq!(horizon(3_000), Duration::from_secs(160));
        assert_eq!(horizon(30_000), Duration::from_secs(16));
        assert_eq!(horizon(u64::MAX), Duration::from_millis(HORIZON_MS_MIN));
        assert_eq!(KvtierConfig::for_capacity(1).min_residency, MIN_RESIDENCY);
    }
}
