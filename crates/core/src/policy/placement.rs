//! kvtier's placement, the one implementation: where a new object is written (the first
//! tier of the writer's write order that admits it and has room), which replica a reader
//! gets (the cheapest it can map) and where an eviction victim goes (one tier colder when
//! keeping it there costs less than recomputing it — "demote, don't evict" — else
//! nowhere). Pure: a snapshot in, a decision and its reason out; the caller executes it.
//!
//! The directory core calls it from `reserve` (write), `probe` and `acquire` (read) and
//! its demotions (pressure); the replay's `kvtier` row from its stack of tiers (write and
//! pressure; a replayed block has one copy, so there is no read to choose). Which tiers a
//! caller offers — those the writer may write, those the reader can map, those colder
//! than the victim's — and whether each has room are the caller's snapshot.
//!
//! Admission: a partial block seen once (the ragged end of a prompt, a prefix of no other
//! prompt unless the same one comes again) is not written, and a wear-limited tier (SSD)
//! only takes an object accessed [`PlacementConfig::wear_admit_frequency_min`] times,
//! written or demoted.

use super::cost::{CostModel, KeepVerdict};
use super::profiles::TierProfile;

/// Settings of placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementConfig {
    /// Least accesses, the current one included, before a wear-limited tier admits an
    /// object. 1 admits every object; 2 only objects already reused.
    pub wear_admit_frequency_min: u32,
}

impl Default for PlacementConfig {
    /// Admit to a wear-limited tier what was used twice: a one-timer would only wear it.
    fn default() -> Self {
        Self {
            wear_admit_frequency_min: 2,
        }
    }
}

impl PlacementConfig {
    /// Whether a tier (wear-limited or not) admits an object accessed `frequency` times.
    pub fn admits(&self, wear_limited: bool, frequency: u32) -> bool {
        !wear_limited || frequency >= self.wear_admit_frequency_min
    }
}

/// One tier (or pool) of a writer's write order, as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteCandidate {
    /// The tier wears with writes (its profile's `wear_limited`).
    pub wear_limited: bool,
    /// The object fits now (the directory: free bytes; the replay: a tier that can make
    /// room by eviction).
    pub has_room: bool,
}

/// The object to be written, as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// Accesses so far, this one included.
    pub frequency: u32,
    /// It holds fewer tokens than a full block (the ragged end of a prompt). A caller that
    /// cannot tell says false.
    pub partial: bool,
}

/// Why a write went where it did, or nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteReason {
    /// The first tier of the write order that admits the object and has room.
    FirstAdmitting,
    /// A partial block seen once is not worth a slot anywhere.
    PartialOnce,
    /// No tier of the write order admits the object with room: the store is skipped.
    NoRoom,
}

/// Where `incoming` is written: nowhere when it is a partial block seen once, else the
/// first of `candidates` — the tiers the writer may write, in its write order, each with
/// the caller's handle `T` — that admits it and has room; `None` when none does.
pub fn write_target<T>(
    candidates: impl IntoIterator<Item = (T, WriteCandidate)>,
    incoming: &Incoming,
    config: &PlacementConfig,
) -> (Option<T>, WriteReason) {
    if incoming.partial && incoming.frequency <= 1 {
        return (None, WriteReason::PartialOnce);
    }
    let chosen = candidates.into_iter().find(|(_, candidate)| {
        candidate.has_room && config.admits(candidate.wear_limited, incoming.frequency)
    });
    match chosen {
        Some((target, _)) => (Some(target), WriteReason::FirstAdmitting),
        None => (None, WriteReason::NoRoom),
    }
}

/// The replica a reader is served from: among `candidates` — the READY replicas it can
/// map, each with the rank of its tier in the reader's read order (lower is cheaper) and
/// the caller's handle `T` — the lowest rank, the first offered on a tie; `None` for none.
pub fn read_choice<T>(candidates: impl IntoIterator<Item = (T, usize)>) -> Option<T> {
    candidates
        .into_iter()
        .fold(
            None,
            |best: Option<(T, usize)>, (target, rank)| match best {
                Some((_, best_rank)) if best_rank <= rank => best,
                _ => Some((target, rank)),
            },
        )
        .map(|(target, _)| target)
}

/// The object an eviction chose, as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Victim {
    /// Bytes it occupies.
    pub bytes: u64,
    /// Tokens it saves when read instead of recomputed.
    pub tokens: u32,
    /// Accesses so far.
    pub frequency: u32,
}

/// A tier colder than the victim's, as placement sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ColderTier<'a> {
    /// Its profile (prices keeping the victim there).
    pub profile: &'a TierProfile,
    /// The victim fits there now (the directory: free bytes below its high watermark; the
    /// replay: a tier that can make room by eviction).
    pub has_room: bool,
    /// It already holds a copy of the victim.
    pub holds_object: bool,
}

/// What becomes of a victim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<T> {
    /// Move it to the colder attendable tier `to` (memory a GPU can read: CXL, DRAM).
    Demote {
        /// The target, as the caller named it.
        to: T,
    },
    /// Move it to the colder staged tier `to` (SSD).
    Spill {
        /// The target, as the caller named it.
        to: T,
    },
    /// Drop it; a later request recomputes it.
    Evict,
}

/// Why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Reason {
    /// Keeping it in the target costs less than recomputing it.
    KeepPays(KeepVerdict),
    /// No colder tier admits it with room (and without a copy already).
    NoTarget,
    /// Some colder tier could take it, but keeping it there costs more than recomputing.
    RecomputeCheaper,
}

/// A decision on a victim and its reason.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision<T> {
    /// What to do.
    pub action: Action<T>,
    /// Why.
    pub reason: Reason,
}

/// Where a victim goes: the first of `colder` — the tiers colder than its own that its
/// owner may write, each with the caller's handle `T` — attendable ones before staged
/// ones, each kind in the order given, that admits it, has room, holds no copy yet, and
/// where staging plus reading back costs less than recomputing by `cost`. Demote
/// (attendable) or spill (staged) there; evict if none qualifies. Pure.
pub fn on_pressure<T: Copy>(
    victim: &Victim,
    colder: &[(T, ColderTier<'_>)],
    config: &PlacementConfig,
    cost: &CostModel,
) -> Decision<T> {
    let attendable = colder
        .iter()
        .filter(|(_, tier)| tier.profile.is_attendable());
    let staged = colder
        .iter()
        .filter(|(_, tier)| !tier.profile.is_attendable());
    let mut reason = Reason::NoTarget;
    for (target, tier) in attendable.chain(staged) {
        let possible = tier.has_room
            && !tier.holds_object
            && config.admits(tier.profile.wear_limited, victim.frequency);
        if !possible {
            continue;
        }
        let verdict = cost.keep_in(tier.profile, victim.bytes, victim.tokens);
        if !verdict.keep_pays() {
            reason = Reason::RecomputeCheaper;
            continue;
        }
        let action = if tier.profile.is_attendable() {
            Action::Demote { to: *target }
        } else {
            Action::Spill { to: *target }
        };
        return Decision {
            action,
            reason: Reason::KeepPays(verdict),
        };
    }
    Decision {
        action: Action::Evict,
        reason,
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
        wear_admit_frequency_min: 2,
    };

    /// (name, write order, incoming, expected target, expected reason)
    type WriteRow = (
        &'static str,
        Vec<WriteCandidate>,
        Incoming,
        Option<usize>,
        WriteReason,
    );
    /// (name, replicas offered with their ranks, expected choice)
    type ReadRow = (&'static str, Vec<(char, usize)>, Option<char>);
    /// (name, victim frequency, colder tiers, cost, expected action)
    type PressureRow<'a> = (
        &'static str,
        u32,
        Vec<(usize, ColderTier<'a>)>,
        CostModel,
        Action<usize>,
    );

    fn write(wear_limited: bool, has_room: bool) -> WriteCandidate {
        WriteCandidate {
            wear_limited,
            has_room,
        }
    }

    #[test]
    fn write_table() {
        let full = |frequency| Incoming {
            frequency,
            partial: false,
        };
        let partial = |frequency| Incoming {
            frequency,
            partial: true,
        };
        let roomy = vec![write(false, true), write(false, true)];
        let rows: [WriteRow; 8] = [
            (
                "empty write order",
                vec![],
                full(1),
                None,
                WriteReason::NoRoom,
            ),
            (
                "first with room",
                roomy.clone(),
                full(1),
                Some(0),
                WriteReason::FirstAdmitting,
            ),
            (
                "first full",
                vec![write(false, false), write(false, true)],
                full(1),
                Some(1),
                WriteReason::FirstAdmitting,
            ),
            (
                "all full",
                vec![write(false, false), write(false, false)],
                full(5),
                None,
                WriteReason::NoRoom,
            ),
            (
                "ssd refuses a one-timer",
                vec![write(true, true)],
                full(1),
                None,
                WriteReason::NoRoom,
            ),
            (
                "ssd takes a reused object",
                vec![write(true, true)],
                full(2),
                Some(0),
                WriteReason::FirstAdmitting,
            ),
            (
                "a partial one-timer nowhere",
                roomy.clone(),
                partial(1),
                None,
                WriteReason::PartialOnce,
            ),
            (
                "a reused partial block",
                roomy,
                partial(2),
                Some(0),
                WriteReason::FirstAdmitting,
            ),
        ];
        for (name, order, incoming, expected, expected_reason) in rows {
            let decision = write_target(order.into_iter().enumerate(), &incoming, &CONFIG);
            assert_eq!(decision, (expected, expected_reason), "{name}");
        }
    }

    #[test]
    fn read_table() {
        let rows: [ReadRow; 4] = [
            ("nothing mappable", vec![], None),
            ("one", vec![('a', 3)], Some('a')),
            (
                "cheapest rank",
                vec![('a', 1), ('b', 0), ('c', 2)],
                Some('b'),
            ),
            ("first on a tie", vec![('a', 1), ('b', 1)], Some('a')),
        ];
        for (name, candidates, expected) in rows {
            assert_eq!(read_choice(candidates), expected, "{name}");
        }
    }

    fn victim(frequency: u32) -> Victim {
        Victim {
            bytes: BLOCK,
            tokens: 512,
            frequency,
        }
    }

    #[test]
    fn pressure_table() {
        let cxl = TierProfile::representative(TierKind::Cxl);
        let ssd = TierProfile::representative(TierKind::Ssd);
        let tier = |profile, has_room, holds_object| ColderTier {
            profile,
            has_room,
            holds_object,
        };
        let cheap = CostModel {
            prefill_us_per_token: 0.01,
        };
        let both = vec![(1, tier(&ssd, true, false)), (2, tier(&cxl, true, false))];
        let rows: Vec<PressureRow> = vec![
            ("nothing colder", 1, vec![], COST, Action::Evict),
            (
                "attendable cxl before ssd",
                1,
                both.clone(),
                COST,
                Action::Demote { to: 2 },
            ),
            ("recompute cheaper", 3, both.clone(), cheap, Action::Evict),
            (
                "ssd refuses a one-timer",
                1,
                vec![both[0]],
                COST,
                Action::Evict,
            ),
            (
                "ssd takes a reused one",
                2,
                vec![both[0]],
                COST,
                Action::Spill { to: 1 },
            ),
            (
                "cxl full",
                2,
                vec![both[0], (2, tier(&cxl, false, false))],
                COST,
                Action::Spill { to: 1 },
            ),
            (
                "cxl holds a copy",
                1,
                vec![(2, tier(&cxl, true, true))],
                COST,
                Action::Evict,
            ),
        ];
        for (name, frequency, colder, cost, expected) in rows {
            let decision = on_pressure(&victim(frequency), &colder, &CONFIG, &cost);
            assert_eq!(decision.action, expected, "{name}");
        }
    }

    #[test]
    fn pressure_reasons_say_why() {
        let cxl = TierProfile::representative(TierKind::Cxl);
        let colder = [(
            0,
            ColderTier {
                profile: &cxl,
                has_room: true,
                holds_object: false,
            },
        )];
        let Reason::KeepPays(verdict) = on_pressure(&victim(1), &colder, &CONFIG, &COST).reason
        else {
            panic!("keeping in cxl pays at 100 µs a token");
        };
        assert!(verdict.keep_cost_us < verdict.recompute_cost_us);
        let cheap = CostModel {
            prefill_us_per_token: 0.01,
        };
        assert_eq!(
            on_pressure(&victim(1), &colder, &CONFIG, &cheap).reason,
            Reason::RecomputeCheaper
        );
        assert_eq!(
            on_pressure(&victim(1), &colder[..0], &CONFIG, &COST).reason,
            Reason::NoTarget
        );
    }
}
