//! Whether a node may still act on its session. The directory fences a node it has not
//! heard from for its fence window and may then hand the node's extents to others; the node
//! cannot know it was fenced before it hears so. So a node whose heartbeats went unanswered
//! for that window stops on its own: it was heard from last no earlier than it sent its
//! last answered heartbeat, so it stops no later than the directory fences it.

use crate::model::Timestamp;
use std::time::Duration;

/// The node's view of its session's liveness.
#[derive(Clone, Copy, Debug)]
pub struct Liveness {
    fence_after: Duration,
    /// When the newest heartbeat the directory answered was sent.
    last_answered_sent_at: Timestamp,
}

impl Liveness {
    /// A session opened by a request sent at `opened_at`, which the directory fences after
    /// `fence_after` of silence.
    pub fn new(opened_at: Timestamp, fence_after: Duration) -> Liveness {
        Liveness {
            fence_after,
            last_answered_sent_at: opened_at,
        }
    }

    /// The directory answered a heartbeat sent at `sent_at` (replies may come out of order).
    pub fn answered(&mut self, sent_at: Timestamp) {
        self.last_answered_sent_at = self.last_answered_sent_at.max(sent_at);
    }

    /// Whether the directory may have fenced the session by `now`: the node must stop
    /// writing and start over as a new epoch.
    pub fn may_be_fenced(&self, now: Timestamp) -> bool {
        now.saturating_since(self.last_answered_sent_at) >= self.fence_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp::ZERO + Duration::from_millis(ms)
    }

    #[test]
    fn a_node_stops_once_its_heartbeats_went_unanswered_for_the_fence_window() {
        let mut liveness = Liveness::new(at(0), Duration::from_millis(100));
        assert!(!liveness.may_be_fenced(at(99)));
        liveness.answered(at(50));
        liveness.answered(at(20));
        assert!(
            !liveness.may_be_fenced(at(149)),
            "measured from the newest send"
        );
        assert!(liveness.may_be_fenced(at(150)));
    }
}
