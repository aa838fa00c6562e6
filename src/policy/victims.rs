//! Victim choice for pool eviction: among the least recently used READY replicas of a pool
//! under pressure, which one is worth least. Pure: candidates in, a choice and its reason
//! out; the directory retires the choice.
//!
//! Worth is expected reuse per byte held: `(accesses + 1) / (idle + horizon) / bytes`.
//! Frequency protects hot prefixes that were not touched in the last moments, recency
//! protects new ones, size makes a large cold object go before a small cold one. Leased
//! replicas and replicas younger than the minimum residency are never chosen.

use std::time::Duration;

/// Settings of victim choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimConfig {
    /// Idle time added to every candidate's, so a replica never idle is not infinitely
    /// valuable; about the reuse distance of a hot prefix.
    pub horizon: Duration,
    /// A replica committed or read more recently than this is not evicted: the engine that
    /// stored a chunk usually reads it back within moments (a burst of stores must not
    /// evict each other before that), while a longer guard would let a full pool refuse
    /// stores instead of making room.
    pub min_residency: Duration,
}

impl Default for VictimConfig {
    fn default() -> Self {
        VictimConfig {
            horizon: Duration::from_secs(120),
            min_residency: Duration::from_millis(20),
        }
    }
}

/// One eviction candidate, as the directory sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VictimCandidate {
    pub bytes: u64,
    pub accesses: u32,
    /// Time since its last access (or its commit, if never read).
    pub idle: Duration,
    /// Time since its commit.
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
    let idle_seconds = (candidate.idle + config.horizon).as_secs_f64();
    (f64::from(candidate.accesses) + 1.0) / idle_seconds / candidate.bytes.max(1) as f64
}

/// The index of the candidate to evict, or `None` with the reason.
pub fn choose(
    candidates: &[VictimCandidate],
    config: &VictimConfig,
) -> (Option<usize>, VictimReason) {
    let chosen = candidates
        .iter()
        .enumerate()
        .filter(|(_, candidate)| !candidate.leased && candidate.age >= config.min_residency)
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

    fn candidate(bytes: u64, accesses: u32, idle_seconds: u64) -> VictimCandidate {
        VictimCandidate {
            bytes,
            accesses,
            idle: Duration::from_secs(idle_seconds),
            age: Duration::from_secs(600),
            leased: false,
        }
    }

    #[test]
    fn table_of_choices() {
        let config = VictimConfig::default();
        let cases: Vec<(&str, Vec<VictimCandidate>, Option<usize>)> = vec![
            ("empty", vec![], None),
            (
                "colder goes first",
                vec![candidate(1 << 20, 1, 10), candidate(1 << 20, 1, 500)],
                Some(1),
            ),
            (
                "frequency protects",
                vec![candidate(1 << 20, 50, 300), candidate(1 << 20, 0, 100)],
                Some(1),
            ),
            (
                "larger goes first",
                vec![candidate(1 << 20, 1, 100), candidate(4 << 20, 1, 100)],
                Some(1),
            ),
            (
                "leased never",
                vec![
                    VictimCandidate {
                        leased: true,
                        ..candidate(1, 0, 9999)
                    },
                    candidate(1 << 20, 9, 1),
                ],
                Some(1),
            ),
            (
                "young never",
                vec![VictimCandidate {
                    age: Duration::ZERO,
                    ..candidate(1, 0, 9999)
                }],
                None,
            ),
            (
                "all leased",
                vec![VictimCandidate {
                    leased: true,
                    ..candidate(1, 0, 1)
                }],
                None,
            ),
        ];
        for (name, candidates, expected) in cases {
            assert_eq!(choose(&candidates, &config).0, expected, "{name}");
        }
        assert_eq!(choose(&[], &config).1, VictimReason::NoneEligible);
    }
}
