//! Whether an elected directory may still serve: the leader lease's clock, without I/O.
//!
//! A directory leads while it holds the election key in etcd under a lease of `ttl`. etcd
//! expires the lease `ttl` after it last heard a renewal, and only then can a standby win
//! the key; a renewal is heard no earlier than it was sent. So a leader that stops serving
//! `ttl` (less a margin for scheduling) after it *sent* its last successful renewal has
//! always stopped before any successor starts, whatever etcd's or the network's delays:
//! two leaders never serve at once. It needs only that the two clocks run at about the
//! same rate, which [`LEASE_MARGIN_DIVISOR`] covers. A leader whose lease lapsed (killed,
//! stopped, cut off from etcd) stops serving and never serves again under its term.

use crate::model::Timestamp;
use std::time::Duration;

/// The part of the lease kept as a margin: a leader stops serving `ttl / 10` before the
/// lease could expire at etcd (200 ms of a 2 s lease).
pub const LEASE_MARGIN_DIVISOR: u32 = 10;
/// Renewals per lease period: a leader renews every `ttl / 4`, so three renewals in a row
/// may fail (an etcd member restarting) before it stops.
pub const RENEWALS_PER_TTL: u32 = 4;

/// One term of leadership and until when it may serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    term: u64,
    ttl: Duration,
    valid_until: Timestamp,
    lost: bool,
}

impl Leadership {
    /// Leadership won in `term` under a lease of `ttl` whose grant was sent at `granted_at`.
    pub fn won(term: u64, granted_at: Timestamp, ttl: Duration) -> Leadership {
        Leadership {
            term,
            ttl,
            valid_until: granted_at + usable(ttl),
            lost: false,
        }
    }

    /// The term: the election key's creation revision, larger than every earlier term.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// A renewal sent at `sent_at` succeeded with the lease's `ttl`: serving may go on until
    /// `sent_at + ttl` (less the margin). A late answer never shortens what a later one
    /// gave; a lost leadership is never renewed.
    pub fn renewed(&mut self, sent_at: Timestamp, ttl: Duration) {
        if self.lost {
            return;
        }
        self.ttl = ttl;
        self.valid_until = self.valid_until.max(sent_at + usable(ttl));
    }

    /// etcd says the lease is gone: serving ends now, for good.
    pub fn lose(&mut self) {
        self.lost = true;
    }

    /// Whether the leader may answer a request at `now`.
    pub fn serving(&self, now: Timestamp) -> bool {
        !self.lost && now < self.valid_until
    }

    /// Until when serving may go on (a past time once lost).
    pub fn valid_until(&self) -> Timestamp {
        if self.lost {
            Timestamp::ZERO
        } else {
            self.valid_until
        }
    }

    /// How long to wait between renewals.
    pub fn renew_interval(&self) -> Duration {
        self.ttl / RENEWALS_PER_TTL
    }
}

fn usable(ttl: Duration) -> Duration {
    ttl - ttl / LEASE_MARGIN_DIVISOR
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TTL: Duration = Duration::from_secs(2);

    fn at(ms: u64) -> Timestamp {
        Timestamp::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn a_leader_serves_until_its_last_renewal_plus_the_ttl_less_the_margin() {
        let mut leadership = Leadership::won(7, at(0), TTL);
        assert!(leadership.serving(at(1_799)));
        assert!(!leadership.serving(at(1_800)));
        leadership.renewed(at(500), TTL);
        assert!(leadership.serving(at(2_299)) && !leadership.serving(at(2_300)));
        // A late answer to an earlier renewal does not shorten it.
        leadership.renewed(at(100), TTL);
        assert!(leadership.serving(at(2_299)));
        assert_eq!(leadership.renew_interval(), Duration::from_millis(500));
        leadership.lose();
        assert!(!leadership.serving(at(600)));
        leadership.renewed(at(600), TTL);
        assert!(!leadership.serving(at(700)), "a lost term is never renewed");
        assert_eq!(leadership.valid_until(), Timestamp::ZERO);
        assert_eq!(leadership.term(), 7);
    }

    proptest! {
        /// etcd expires the lease `ttl` after the last renewal it heard, and hears each
        /// renewal after it was sent: the leader has stopped serving by then, however the
        /// renewals were delayed, answered late or lost.
        #[test]
        fn the_leader_stops_before_etcd_could_elect_another(
            renewals in proptest::collection::vec((0u64..3_000, 0u64..2_000, any::<bool>()), 0..20),
        ) {
            let mut leadership = Leadership::won(1, at(0), TTL);
            let mut etcd_heard = 0;
            let mut sent = 0;
            for (gap, delay, answered) in renewals {
                sent += gap;
                // etcd renews only a lease it has not expired yet.
                if sent + delay >= etcd_heard + TTL.as_millis() as u64 {
                    break;
                }
                etcd_heard = etcd_heard.max(sent + delay);
                if answered {
                    leadership.renewed(at(sent), TTL);
                }
            }
            let expiry = etcd_heard + TTL.as_millis() as u64;
            prop_assert!(!leadership.serving(at(expiry)));
        }
    }
}
