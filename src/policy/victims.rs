//! Victim choice for pool eviction: among the least recently used READY replicas of each
//! frequency class of a pool under pressure, which one is worth least. Pure: candidates in,
//! a choice and its reason out; the directory retires (or demotes) the choice.
//!
//! Worth is kvtier's value ([`super::eviction::Kvtier`]) per byte held:
//! `reuse_probability / (idle + horizon) / bytes`. The reuse probability is learned per
//! frequency class from the access history, the hazard `1 / (idle + horizon)` decays with
//! idle time, and size makes a large cold object go before a small cold one. Leased
//! replicas and replicas younger than the minimum residency are never chosen.

use std::time::Duration;

use super::eviction::horizon_ms_for_capacity;

/// Settings of victim choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimConfig {
    /// Idle time at which a replica's hazard has halved; see [`VictimConfig::for_capacity`].
    pub horizon: Duration,
    /// A replica committed or read more recently than this is not evicted: the engine that
    /// stored a chunk usually reads it back within moments (a burst of stores must not
    /// evict each other before that), while a longer guard would let a full pool refuse
    /// stores instead of making room.
    pub min_residency: Duration,
}

/// The shortest residency before a replica may be evicted.
pub const MIN_RESIDENCY: Duration = Duration::from_millis(20);

impl VictimConfig {
    /// The settings for a pool holding about `objects` objects: the horizon kvtier's
    /// order uses for a cache of that many blocks (a small cache weighs frequency, a
    /// large one recency).
    pub fn for_capacity(objects: u64) -> Self {
        VictimConfig {
            horizon: Duration::from_millis(horizon_ms_for_capacity(objects)),
            min_residency: MIN_RESIDENCY,
        }
    }
}

/// One eviction candidate, as the directory sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VictimCandidate {
    pub bytes: u64,
    /// The learned probability that an object of its frequency class is accessed again.
    pub reuse_probability: f64,
    /// Time since its last access (or its commit, if never read), on the policy's clock.
    pub idle: Duration,
    /// Time since its last access or commit, on the directory's clock.
    pub age: Duration,
    pub leased: bool,
}

/// Why a candidate was skipped or chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VictimReason {
    /// The least expected reuse per byte among the eligible candidates.
    LeastValuable,
    /// No candidate is eligible (all leased or too young).
    NoneEligible,
}

/// Expected reuse per byte of a candidate (higher is more valuable).
pub fn worth(candidate: &VictimCandidate, config: &VictimConfig) -> f64 {
    let hazard = 1.0 / (candidate.idle + config.horizon).as_secs_f64().max(1e-9);
    candidate.reuse_probability * hazard / candidate.bytes.max(1) as f64
}

/// Whether the candidate may be evicted at all.
pub fn eligible(candidate: &VictimCandidate, config: &VictimConfig) -> bool {
    !candidate.leased && candidate.age >= config.min_residency
}

/// The index of the candidate to evict, or `None` with the reason.
pub fn choose(
    candidates: &[VictimCandidate],
    config: &VictimConfig,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::eviction::{HORIZON_MS_MAX, HORIZON_MS_MIN};

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
        let config = VictimConfig {
            horizon: Duration::from_secs(120),
            min_residency: MIN_RESIDENCY,
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
                "leased never",
                vec![
                    VictimCandidate {
                        leased: true,
                        ..candidate(1, 0.01, 9999)
                    },
                    candidate(1 << 20, 0.9, 1),
                ],
                Some(1),
            ),
            (
                "young never",
                vec![VictimCandidate {
                    age: Duration::ZERO,
                    ..candidate(1, 0.01, 9999)
                }],
                None,
            ),
            (
                "all leased",
                vec![VictimCandidate {
                    leased: true,
                    ..candidate(1, 0.01, 1)
                }],
                None,
            ),
        ];
        for (name, candidates, expected) in cases {
            assert_eq!(choose(&candidates, &config).0, expected, "{name}");
        }
        assert_eq!(choose(&[], &config).1, VictimReason::NoneEligible);
    }

    #[test]
    fn the_horizon_follows_kvtiers_order() {
        assert_eq!(
            VictimConfig::for_capacity(3_000).horizon,
            Duration::from_millis(160_000)
        );
        assert_eq!(
            VictimConfig::for_capacity(0).horizon,
            Duration::from_millis(HORIZON_MS_MAX)
        );
        assert_eq!(
            VictimConfig::for_capacity(u64::MAX).horizon,
            Duration::from_millis(HORIZON_MS_MIN)
        );
    }
}
