//! Placement decisions for one object: keep, promote, demote, spill or evict, each with a
//! reason. Pure: a snapshot of the object and of every tier in, a [`Decision`] out; the
//! caller executes it.
//!
//! Under pressure an object moves one step colder instead of being dropped ("demote,
//! don't evict") when the cost model says keeping it there is cheaper than recomputing it.
//! Attendable tiers (DRAM, NUMA-far, CXL) are preferred over staged ones (SSD); a
//! wear-limited tier only admits objects already reused. Leased, filling and young
//! objects are never chosen; watermarks and a cooldown stop ping-pong.

use super::cost::{CostModel, KeepVerdict};
use super::profiles::TierProfile;

/// The object a decision is about.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Bytes it occupies.
    pub bytes: u64,
    /// Tokens it saves when read instead of recomputed.
    pub tokens: u32,
    /// Accesses so far.
    pub frequency: u32,
    /// Index of the tier holding it (0 is the hottest).
    pub tier: usize,
    /// When it entered its tier, in milliseconds.
    pub entered_tier_ms: u64,
    /// When it last moved between tiers, in milliseconds; `None` if never.
    pub moved_ms: Option<u64>,
    /// A reader holds a lease on it.
    pub leased: bool,
    /// Its bytes are still being written.
    pub filling: bool,
}

/// One tier as the policy sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct TierState {
    /// The tier's profile.
    pub profile: TierProfile,
    /// Capacity, in bytes.
    pub capacity_bytes: u64,
    /// Bytes in use, including reservations.
    pub used_bytes: u64,
    /// Bytes waiting to enter (the write that caused the pressure).
    pub pending_bytes: u64,
}

/// Settings of the placement policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlacementConfig {
    /// A tier is under pressure above this fraction of its capacity. In (0, 1].
    pub high_watermark: f64,
    /// Promotion into a tier below this fraction needs no proof of heat. In [0, high].
    pub low_watermark: f64,
    /// An object is not moved or evicted before it spent this long in its tier, in ms.
    pub min_residency_ms: u64,
    /// An object is not promoted within this long of its last move, in milliseconds.
    pub cooldown_ms: u64,
    /// Least accesses for admission to a wear-limited tier.
    pub wear_admit_frequency_min: u32,
    /// Least accesses for a promotion into a tier above its low watermark.
    pub promote_frequency_min: u32,
}

impl Default for PlacementConfig {
    /// Evict from 95% down, promote freely below 80%, 1 s residency, 10 s cooldown,
    /// admit to SSD what was used twice, promote what was used twice.
    fn default() -> Self {
        Self {
            high_watermark: 0.95,
            low_watermark: 0.80,
            min_residency_ms: 1_000,
            cooldown_ms: 10_000,
            wear_admit_frequency_min: 2,
            promote_frequency_min: 2,
        }
    }
}

/// What to do with the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Leave it where it is.
    Keep,
    /// Copy it to the hotter tier `to`, then retire this copy.
    Promote {
        /// Target tier index.
        to: usize,
    },
    /// Move it to the colder attendable tier `to`.
    Demote {
        /// Target tier index.
        to: usize,
    },
    /// Move it to the colder staged tier `to`.
    Spill {
        /// Target tier index.
        to: usize,
    },
    /// Drop it; a later request recomputes it.
    Evict,
}

/// Why the action was chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reason {
    /// A reader holds a lease.
    Leased,
    /// Its bytes are still being written.
    Filling,
    /// It entered its tier less than the minimum residency ago.
    MinResidency,
    /// Its tier is not above the high watermark.
    NoPressure,
    /// It moved less than the cooldown ago.
    Cooldown,
    /// It is already in the hottest tier.
    Hottest,
    /// The hotter tier is above its low watermark and the object is not hot enough.
    NotHotEnough,
    /// It was accessed in a colder tier and is worth the hotter one.
    Hot,
    /// Keeping it in the target tier costs less than recomputing it.
    KeepPays(KeepVerdict),
    /// No colder tier admits it or keeping it costs more than recomputing it.
    RecomputeCheaper,
}

/// A decision and its reason.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// What to do.
    pub action: Action,
    /// Why.
    pub reason: Reason,
}

/// Why no decision could be made; the caller's snapshot is wrong.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlacementError {
    /// The candidate names a tier the snapshot does not have.
    #[error("candidate tier {tier} is not among the {tiers} tiers")]
    UnknownTier {
        /// The candidate's tier.
        tier: usize,
        /// Tiers in the snapshot.
        tiers: usize,
    },
    /// Watermarks are not `0 <= low <= high <= 1` with `high > 0`.
    #[error("watermarks must satisfy 0 <= low <= high <= 1 and high > 0")]
    Watermarks,
}

fn decision(action: Action, reason: Reason) -> Decision {
    Decision { action, reason }
}

fn check(
    candidate: &Candidate,
    tiers: &[TierState],
    config: &PlacementConfig,
) -> Result<(), PlacementError> {
    if candidate.tier >= tiers.len() {
        return Err(PlacementError::UnknownTier {
            tier: candidate.tier,
            tiers: tiers.len(),
        });
    }
    let ordered = 0.0 <= config.low_watermark
        && config.low_watermark <= config.high_watermark
        && config.high_watermark <= 1.0
        && config.high_watermark > 0.0;
    if !ordered {
        return Err(PlacementError::Watermarks);
    }
    Ok(())
}

fn above(tier: &TierState, fraction: f64) -> bool {
    (tier.used_bytes.saturating_add(tier.pending_bytes)) as f64
        > fraction * tier.capacity_bytes as f64
}

/// Where an object goes when its tier needs room.
///
/// Keeps it (with the reason) when it is leased, filling, inside its minimum residency or
/// its tier is not above the high watermark; the caller then picks another victim.
/// Otherwise tries the colder tiers, attendable ones first, each in index order: a
/// wear-limited tier only admits an object accessed `wear_admit_frequency_min` times, and a
/// tier is chosen only if staging plus reading back costs less than recomputing. Demote
/// (attendable) or spill (staged) there; evict if none qualifies.
pub fn on_pressure(
    candidate: &Candidate,
    tiers: &[TierState],
    config: &PlacementConfig,
    cost: &CostModel,
    now_ms: u64,
) -> Result<Decision, PlacementError> {
    check(candidate, tiers, config)?;
    if let Some(reason) = pinned(candidate, config, now_ms) {
        return Ok(decision(Action::Keep, reason));
    }
    if !above(&tiers[candidate.tier], config.high_watermark) {
        return Ok(decision(Action::Keep, Reason::NoPressure));
    }
    let colder = || tiers.iter().enumerate().skip(candidate.tier + 1);
    let attendable = colder().filter(|(_, tier)| tier.profile.is_attendable());
    let staged = colder().filter(|(_, tier)| !tier.profile.is_attendable());
    for (index, tier) in attendable.chain(staged) {
        let admitted =
            !tier.profile.wear_limited || candidate.frequency >= config.wear_admit_frequency_min;
        let verdict = cost.keep_in(&tier.profile, candidate.bytes, candidate.tokens);
        if admitted && tier.capacity_bytes >= candidate.bytes && verdict.keep_pays() {
            let action = if tier.profile.is_attendable() {
                Action::Demote { to: index }
            } else {
                Action::Spill { to: index }
            };
            return Ok(decision(action, Reason::KeepPays(verdict)));
        }
    }
    Ok(decision(Action::Evict, Reason::RecomputeCheaper))
}

/// Whether an object just read from its tier moves to the hottest tier.
///
/// Keeps it when it is already there, leased, filling, inside its minimum residency or
/// its cooldown, or when the hottest tier is above its low watermark and the object has
/// fewer than `promote_frequency_min` accesses. Otherwise promotes it to tier 0.
pub fn on_access(
    candidate: &Candidate,
    tiers: &[TierState],
    config: &PlacementConfig,
    now_ms: u64,
) -> Result<Decision, PlacementError> {
    check(candidate, tiers, config)?;
    if candidate.tier == 0 {
        return Ok(decision(Action::Keep, Reason::Hottest));
    }
    if let Some(reason) = pinned(candidate, config, now_ms) {
        return Ok(decision(Action::Keep, reason));
    }
    let cooling = candidate
        .moved_ms
        .is_some_and(|moved| now_ms.saturating_sub(moved) < config.cooldown_ms);
    if cooling {
        return Ok(decision(Action::Keep, Reason::Cooldown));
    }
    if above(&tiers[0], config.low_watermark) && candidate.frequency < config.promote_frequency_min
    {
        return Ok(decision(Action::Keep, Reason::NotHotEnough));
    }
    Ok(decision(Action::Promote { to: 0 }, Reason::Hot))
}

/// Why the object may not move now, if it may not.
fn pinned(candidate: &Candidate, config: &PlacementConfig, now_ms: u64) -> Option<Reason> {
    if candidate.leased {
        Some(Reason::Leased)
    } else if candidate.filling {
        Some(Reason::Filling)
    } else if now_ms.saturating_sub(candidate.entered_tier_ms) < config.min_residency_ms {
        Some(Reason::MinResidency)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::profiles::TierKind;

    const BLOCK: u64 = 64 << 20;
    const COST: CostModel = CostModel {
        prefill_us_per_token: 100.0,
    };
    const CONFIG: PlacementConfig = PlacementConfig {
        high_watermark: 0.95,
        low_watermark: 0.80,
        min_residency_ms: 1_000,
        cooldown_ms: 10_000,
        wear_admit_frequency_min: 2,
        promote_frequency_min: 2,
    };

    fn tier(kind: TierKind, blocks: u64, used_blocks: u64) -> TierState {
        TierState {
            profile: TierProfile::representative(kind),
            capacity_bytes: blocks * BLOCK,
            used_bytes: used_blocks * BLOCK,
            pending_bytes: BLOCK,
        }
    }

    fn tiers() -> Vec<TierState> {
        vec![
            tier(TierKind::Dram, 10, 10),
            tier(TierKind::Ssd, 100, 0),
            tier(TierKind::Cxl, 30, 0),
        ]
    }

    fn candidate() -> Candidate {
        Candidate {
            bytes: BLOCK,
            tokens: 512,
            frequency: 1,
            tier: 0,
            entered_tier_ms: 0,
            moved_ms: None,
            leased: false,
            filling: false,
        }
    }

    fn action(result: Result<Decision, PlacementError>) -> Action {
        result
            .map(|decision| decision.action)
            .unwrap_or(Action::Keep)
    }

    /// (name, candidate, tiers, cost, expected action, expected reason)
    type PressureRow = (
        &'static str,
        Candidate,
        Vec<TierState>,
        CostModel,
        Action,
        Reason,
    );

    #[test]
    fn pressure_table() {
        let cheap = CostModel {
            prefill_us_per_token: 0.01,
        };
        let mut empty = tiers();
        empty[0].used_bytes = 0;
        empty[0].pending_bytes = 0;
        let mut exactly_full = tiers();
        exactly_full[0].used_bytes = exactly_full[0].capacity_bytes * 95 / 100;
        exactly_full[0].pending_bytes = 0;
        let mut no_cxl = tiers();
        no_cxl.pop();
        let c = candidate();
        // (name, candidate, tiers, cost, expected action, expected reason)
        let rows: Vec<PressureRow> = vec![
            (
                "empty pool",
                c,
                empty,
                COST,
                Action::Keep,
                Reason::NoPressure,
            ),
            (
                "exactly at the watermark",
                c,
                exactly_full,
                COST,
                Action::Keep,
                Reason::NoPressure,
            ),
            (
                "leased",
                Candidate { leased: true, ..c },
                tiers(),
                COST,
                Action::Keep,
                Reason::Leased,
            ),
            (
                "filling",
                Candidate { filling: true, ..c },
                tiers(),
                COST,
                Action::Keep,
                Reason::Filling,
            ),
            (
                "young",
                Candidate {
                    entered_tier_ms: 9_500,
                    ..c
                },
                tiers(),
                COST,
                Action::Keep,
                Reason::MinResidency,
            ),
            (
                "recompute cheaper",
                c,
                tiers(),
                cheap,
                Action::Evict,
                Reason::RecomputeCheaper,
            ),
            (
                "ssd refuses a one-timer",
                c,
                no_cxl.clone(),
                COST,
                Action::Evict,
                Reason::RecomputeCheaper,
            ),
            (
                "cxl out of the last tier",
                Candidate { tier: 2, ..c },
                tiers(),
                COST,
                Action::Keep,
                Reason::NoPressure,
            ),
        ];
        for (name, candidate, tiers, cost, expected_action, expected_reason) in rows {
            let decision = on_pressure(&candidate, &tiers, &CONFIG, &cost, 10_000);
            assert_eq!(
                decision.map(|d| (d.action, d.reason)),
                Ok((expected_action, expected_reason)),
                "{name}"
            );
        }
        let reused = Candidate { frequency: 2, ..c };
        assert_eq!(
            action(on_pressure(&reused, &no_cxl, &CONFIG, &COST, 10_000)),
            Action::Spill { to: 1 }
        );
    }

    #[test]
    fn one_over_prefers_attendable_cxl_over_ssd() {
        let decision = on_pressure(&candidate(), &tiers(), &CONFIG, &COST, 10_000);
        let Ok(Decision {
            action: Action::Demote { to: 2 },
            reason: Reason::KeepPays(verdict),
        }) = decision
        else {
            panic!("{decision:?}");
        };
        assert!(verdict.keep_cost_us < verdict.recompute_cost_us);
        let mut last = tiers();
        last[2].used_bytes = last[2].capacity_bytes;
        last[2].pending_bytes = BLOCK;
        let cxl_victim = Candidate {
            tier: 2,
            frequency: 3,
            ..candidate()
        };
        assert_eq!(
            action(on_pressure(&cxl_victim, &last, &CONFIG, &COST, 10_000)),
            Action::Evict,
            "nothing colder"
        );
    }

    #[test]
    fn access_table() {
        let c = Candidate {
            tier: 2,
            frequency: 2,
            ..candidate()
        };
        let mut roomy = tiers();
        roomy[0].used_bytes = 0;
        roomy[0].pending_bytes = 0;
        // (name, candidate, tiers, expected action, expected reason)
        let rows = [
            (
                "hottest already",
                Candidate { tier: 0, ..c },
                tiers(),
                Action::Keep,
                Reason::Hottest,
            ),
            (
                "leased",
                Candidate { leased: true, ..c },
                tiers(),
                Action::Keep,
                Reason::Leased,
            ),
            (
                "cooldown",
                Candidate {
                    moved_ms: Some(5_000),
                    ..c
                },
                tiers(),
                Action::Keep,
                Reason::Cooldown,
            ),
            (
                "cold one-timer, full top",
                Candidate { frequency: 1, ..c },
                tiers(),
                Action::Keep,
                Reason::NotHotEnough,
            ),
            (
                "one-timer, roomy top",
                Candidate { frequency: 1, ..c },
                roomy,
                Action::Promote { to: 0 },
                Reason::Hot,
            ),
            ("hot", c, tiers(), Action::Promote { to: 0 }, Reason::Hot),
        ];
        for (name, candidate, tiers, expected_action, expected_reason) in rows {
            let decision = on_access(&candidate, &tiers, &CONFIG, 10_000);
            assert_eq!(
                decision.map(|d| (d.action, d.reason)),
                Ok((expected_action, expected_reason)),
                "{name}"
            );
        }
    }

    #[test]
    fn invalid_input_is_an_error() {
        let lost = Candidate {
            tier: 7,
            ..candidate()
        };
        assert!(matches!(
            on_access(&lost, &tiers(), &CONFIG, 0),
            Err(PlacementError::UnknownTier { .. })
        ));
        assert!(matches!(
            on_pressure(&lost, &[], &CONFIG, &COST, 0),
            Err(PlacementError::UnknownTier { .. })
        ));
        let inverted = PlacementConfig {
            low_watermark: 0.99,
            ..CONFIG
        };
        assert_eq!(
            on_pressure(&candidate(), &tiers(), &inverted, &COST, 0),
            Err(PlacementError::Watermarks)
        );
    }
}
