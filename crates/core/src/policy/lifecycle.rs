//! The lifecycle of one object in one tier, with a per-tier TTL:
//! `filling -> resident -> expiring -> expired | spilled -> evicted`.
//!
//! Each tier's clock starts when the object entered that tier (moving it starts a new
//! life there). An access while resident restarts the idle clock; an access while expiring
//! revives the object to resident. Time only enters through the `now_ms` arguments.

/// Per-tier lifecycle settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LifecyclePolicy {
    /// Idle time after which a resident object starts expiring, in milliseconds.
    /// `u64::MAX` means never.
    pub resident_ttl_ms: u64,
    /// How long an expiring object waits for an access before it leaves, in milliseconds.
    #[serde(default)]
    pub expiring_grace_ms: u64,
    /// Whether an object leaving this tier is spilled to a colder tier (true) or expires.
    #[serde(default)]
    pub spill_on_expiry: bool,
}

/// Where an object stands in one tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifeState {
    /// Bytes are being written; not readable, never chosen by a policy.
    Filling,
    /// Readable; the idle clock runs.
    Resident,
    /// Readable but past its TTL; an access revives it.
    Expiring,
    /// Past its grace period with no colder tier to go to: to be freed.
    Expired,
    /// Past its grace period and copied to a colder tier: this copy is to be freed.
    Spilled,
    /// Freed; terminal.
    Evicted,
}

/// One object's life in one tier. Plain value: every transition returns a new value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Life {
    /// The current state.
    pub state: LifeState,
    /// When the object entered this tier, in milliseconds.
    pub entered_ms: u64,
    /// Start of the current clock (entry, last access while resident, or revival), in ms.
    pub clock_ms: u64,
}

impl Life {
    /// A new life in a tier: filling since `now_ms`.
    pub fn filling(now_ms: u64) -> Self {
        Self {
            state: LifeState::Filling,
            entered_ms: now_ms,
            clock_ms: now_ms,
        }
    }

    /// The fill completed at `now_ms`: filling becomes resident and the clock starts.
    /// Any other state is returned unchanged (a late completion changes nothing).
    pub fn filled(self, now_ms: u64) -> Self {
        match self.state {
            LifeState::Filling => Self {
                state: LifeState::Resident,
                clock_ms: now_ms,
                ..self
            },
            _ => self,
        }
    }

    /// The object was read at `now_ms`: a resident one restarts its idle clock, an
    /// expiring one is revived to resident; other states are unchanged. Safe to repeat.
    pub fn access(self, now_ms: u64) -> Self {
        match self.state {
            LifeState::Resident | LifeState::Expiring => Self {
                state: LifeState::Resident,
                clock_ms: self.clock_ms.max(now_ms),
                ..self
            },
            _ => self,
        }
    }

    /// Its bytes were freed: terminal.
    pub fn evicted(self) -> Self {
        Self {
            state: LifeState::Evicted,
            ..self
        }
    }

    /// The state at `now_ms` under `policy`, pure and deterministic: resident turns
    /// expiring once idle for `resident_ttl_ms`, expiring turns spilled or expired once
    /// `expiring_grace_ms` more have passed. A `now_ms` earlier than the clock changes
    /// nothing; calling it twice with the same arguments gives the same value.
    pub fn advance(self, policy: &LifecyclePolicy, now_ms: u64) -> Self {
        let expiring_at = self.clock_ms.saturating_add(policy.resident_ttl_ms);
        let leaving_at = expiring_at.saturating_add(policy.expiring_grace_ms);
        let state = match self.state {
            LifeState::Resident | LifeState::Expiring
                if now_ms >= leaving_at && leaving_at < u64::MAX =>
            {
                if policy.spill_on_expiry {
                    LifeState::Spilled
                } else {
                    LifeState::Expired
                }
            }
            LifeState::Resident if now_ms >= expiring_at && expiring_at < u64::MAX => {
                LifeState::Expiring
            }
            state => state,
        };
        Self { state, ..self }
    }

    /// The next time `advance` would change this life, in milliseconds; `None` when no
    /// time-driven transition is pending. Callers arm one timer for it.
    pub fn next_deadline_ms(&self, policy: &LifecyclePolicy) -> Option<u64> {
        let expiring_at = self.clock_ms.saturating_add(policy.resident_ttl_ms);
        let deadline = match self.state {
            LifeState::Resident => expiring_at,
            LifeState::Expiring => expiring_at.saturating_add(policy.expiring_grace_ms),
            _ => return None,
        };
        (deadline < u64::MAX).then_some(deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POLICY: LifecyclePolicy = LifecyclePolicy {
        resident_ttl_ms: 100,
        expiring_grace_ms: 50,
        spill_on_expiry: false,
    };

    #[test]
    fn full_life_table() {
        let spill = LifecyclePolicy {
            spill_on_expiry: true,
            ..POLICY
        };
        let resident = Life::filling(10).filled(20);
        // (policy, start, now, expected state)
        let rows = [
            (POLICY, Life::filling(10), 1_000, LifeState::Filling),
            (POLICY, resident, 119, LifeState::Resident),
            (POLICY, resident, 120, LifeState::Expiring),
            (POLICY, resident, 169, LifeState::Expiring),
            (POLICY, resident, 170, LifeState::Expired),
            (spill, resident, 170, LifeState::Spilled),
            (POLICY, resident, 5, LifeState::Resident),
            (POLICY, resident.evicted(), 1_000, LifeState::Evicted),
        ];
        for (policy, life, now, expected) in rows {
            assert_eq!(
                life.advance(&policy, now).state,
                expected,
                "{life:?} at {now}"
            );
        }
    }

    #[test]
    fn access_while_expiring_revives_and_restarts_the_clock() {
        let expiring = Life::filling(0).filled(0).advance(&POLICY, 120);
        assert_eq!(expiring.state, LifeState::Expiring);
        let revived = expiring.access(130);
        assert_eq!(revived.state, LifeState::Resident);
        assert_eq!(revived.advance(&POLICY, 229).state, LifeState::Resident);
        assert_eq!(revived.next_deadline_ms(&POLICY), Some(230));
        assert_eq!(revived.entered_ms, 0);
    }

    #[test]
    fn access_does_not_resurrect_expired_or_filling() {
        let expired = Life::filling(0).filled(0).advance(&POLICY, 1_000);
        assert_eq!(expired.access(1_001).state, LifeState::Expired);
        assert_eq!(Life::filling(0).access(5).state, LifeState::Filling);
        assert_eq!(expired.next_deadline_ms(&POLICY), None);
        assert_eq!(expired.filled(2_000), expired);
    }

    #[test]
    fn infinite_ttl_never_expires() {
        let forever = LifecyclePolicy {
            resident_ttl_ms: u64::MAX,
            ..POLICY
        };
        let life = Life::filling(0).filled(0);
        assert_eq!(life.advance(&forever, u64::MAX).state, LifeState::Resident);
        assert_eq!(life.next_deadline_ms(&forever), None);
    }

    proptest! {
        #[test]
        fn advance_is_monotone_and_idempotent(start in 0u64..1_000, a in 0u64..2_000, b in 0u64..2_000) {
            let life = Life::filling(start).filled(start);
            let (early, late) = (a.min(b), a.max(b));
            let rank = |state: LifeState| match state {
                LifeState::Filling => 0,
                LifeState::Resident => 1,
                LifeState::Expiring => 2,
                _ => 3,
            };
            let at_early = life.advance(&POLICY, early);
            prop_assert!(rank(at_early.state) <= rank(life.advance(&POLICY, late).state));
            prop_assert_eq!(at_early.advance(&POLICY, early), at_early);
            prop_assert_eq!(at_early.advance(&POLICY, late), life.advance(&POLICY, late));
        }
    }
}
