//! How long a node waits for the directory to answer a heartbeat before it looks for the
//! leader again on a fresh connection to every directory address.
//!
//! A leader that died never answers, and nothing else tells the node: the wait is the
//! node's part of every failover. A fixed wait is either too long for a fast network (the
//! node learns of a new leader a whole heartbeat period late) or too short for a loaded
//! one. So the node learns it from the round trips of the heartbeats the directory
//! answered, as TCP learns its retransmission timeout (RFC 6298): the smoothed round trip
//! plus four times its mean deviation, never under [`REPLY_TIMEOUT_MIN`] and never over the
//! heartbeat period. A wait that ran out on a directory that was only slow costs a
//! reconnect to the same leader, never a lost session.

use std::time::Duration;

/// The shortest wait: what scheduling alone may add to a round trip on a loaded host.
pub const REPLY_TIMEOUT_MIN: Duration = Duration::from_millis(100);

/// The round-trip estimate of one session's heartbeats.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplyTimer {
    /// Smoothed round trip and mean deviation; none before the first answer.
    estimate: Option<(Duration, Duration)>,
}

impl ReplyTimer {
    /// A heartbeat was answered `round_trip` after it was sent.
    pub fn answered(&mut self, round_trip: Duration) {
        self.estimate = Some(match self.estimate {
            None => (round_trip, round_trip / 2),
            Some((smoothed, deviation)) => {
                let error = smoothed.abs_diff(round_trip);
                // RFC 6298's gains: 1/4 for the deviation, 1/8 for the mean.
                let deviation = deviation - deviation / 4 + error / 4;
                let smoothed = smoothed - smoothed / 8 + round_trip / 8;
                (smoothed, deviation)
            }
        });
    }

    /// How long to wait for the answer to a heartbeat sent every `period`: the whole period
    /// until a round trip was measured.
    pub fn timeout(&self, period: Duration) -> Duration {
        let floor = REPLY_TIMEOUT_MIN.min(period);
        match self.estimate {
            None => period,
            Some((smoothed, deviation)) => (smoothed + deviation * 4).clamp(floor, period),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PERIOD: Duration = Duration::from_secs(1);

    fn ms(value: u64) -> Duration {
        Duration::from_millis(value)
    }

    #[test]
    fn the_wait_is_the_period_until_a_round_trip_is_known_then_follows_the_round_trips() {
        let mut timer = ReplyTimer::default();
        assert_eq!(timer.timeout(PERIOD), PERIOD);
        for _ in 0..50 {
            timer.answered(ms(2));
        }
        assert_eq!(timer.timeout(PERIOD), REPLY_TIMEOUT_MIN, "fast: the floor");
        for _ in 0..50 {
            timer.answered(ms(300));
        }
        let slow = timer.timeout(PERIOD);
        assert!(
            slow >= ms(300) && slow < PERIOD,
            "slow: above the round trip, {slow:?}"
        );
        // A jittery directory widens the wait beyond its mean.
        let mut jittery = ReplyTimer::default();
        for index in 0..50 {
            jittery.answered(if index % 2 == 0 { ms(20) } else { ms(180) });
        }
        assert!(
            jittery.timeout(PERIOD) > ms(250),
            "{:?}",
            jittery.timeout(PERIOD)
        );
        assert_eq!(jittery.timeout(ms(50)), ms(50), "never over the period");
    }

    proptest! {
        /// Whatever the round trips, the wait stays within the floor and the period, and
        /// after a steady run of one round trip it is at least that round trip (within the
        /// nanoseconds integer division leaves).
        #[test]
        fn the_wait_stays_between_the_floor_and_the_period(
            round_trips in proptest::collection::vec(0u64..5_000, 1..60),
            steady in 0u64..2_000,
        ) {
            let mut timer = ReplyTimer::default();
            for round_trip in round_trips {
                timer.answered(ms(round_trip));
                let timeout = timer.timeout(PERIOD);
                prop_assert!(timeout >= REPLY_TIMEOUT_MIN && timeout <= PERIOD);
            }
            for _ in 0..200 {
                timer.answered(ms(steady));
            }
            prop_assert!(timer.timeout(PERIOD) + ms(1) >= ms(steady).min(PERIOD));
        }
    }
}
