//! Nodes and their sessions. A node is a name with a stable id and an epoch counter; a
//! session is one epoch of one node. Opening a new session fences the node's previous one.

use super::ledger::Ledger;
use super::ops::{NamespaceAccess, Task};
use crate::model::{DomainId, Epoch, Medium, NodeId, ObjectId, ReplicaId, SessionId, Timestamp};
use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;

/// A session's liveness, driven by heartbeats and `tick`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SessionState {
    /// Heartbeats arrive.
    Live,
    /// Heartbeats stopped: its host replicas are hidden, nothing it may touch is freed.
    Suspect,
    /// Its epoch ended (a newer epoch opened, or it stayed silent past `fence_after`):
    /// it can change nothing; its host pools and reservations were dropped.
    Fenced,
    /// Closed after draining.
    Closed,
    /// Ended by the directory at the end of a drain (`kvtier ctl drain`, or the node's
    /// section removed from `cluster.toml`): the node exits cleanly and does not rejoin.
    Drained,
}

impl SessionState {
    /// The state's name in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            SessionState::Live => "live",
            SessionState::Suspect => "suspect",
            SessionState::Fenced => "fenced",
            SessionState::Closed => "closed",
            SessionState::Drained => "drained",
        }
    }
}

/// One session.
#[derive(Debug)]
pub struct Session {
    pub node: NodeId,
    pub epoch: Epoch,
    pub state: SessionState,
    pub last_heartbeat: Timestamp,
    pub write_order: Vec<Medium>,
    pub read_order: Vec<Medium>,
    pub domains: Vec<DomainId>,
    pub namespaces: NamespaceAccess,
    pub ledger: Ledger,
    /// Leases this session holds.
    pub leases: u32,
    /// Reservations this session holds (bounded by `reservations_per_session_max`).
    pub reservations: HashSet<ReplicaId>,
}

impl Session {
    /// Whether the session may still change state.
    pub fn is_open(&self) -> bool {
        matches!(self.state, SessionState::Live | SessionState::Suspect)
    }

    /// The rank of `medium` in the read order (lower is cheaper); unknown media rank last.
    pub fn read_rank(&self, medium: Medium) -> usize {
        self.read_order
            .iter()
            .position(|candidate| *candidate == medium)
            .unwrap_or(self.read_order.len())
    }
}

/// Acknowledged reclaims a node's `handed_out` may hold before a compaction.
pub const HANDED_OUT_COMPACTION_MIN: usize = 64;

/// A node: its epoch counter, its current session and its pending tasks.
#[derive(Debug)]
pub struct NodeRecord {
    pub epoch: Epoch,
    pub session: Option<SessionId>,
    /// Reclaim tasks for replicas this node owns, not yet handed out. A replica is in at
    /// most one of `tasks` and `handed_out`, so both are bounded by the replica table.
    pub tasks: VecDeque<Task>,
    /// Tasks handed out and not yet acknowledged, with the time after which they are
    /// handed out again (a lost reply or a failed step must not leak the bytes). An
    /// acknowledged reclaim stays until the next compaction (see
    /// [`NodeRecord::acknowledged_reclaims`]) or its time, and is then dropped, its replica
    /// gone.
    pub handed_out: VecDeque<(Timestamp, Task)>,
    /// Delegations to offer this node at its next poll: replicas it maps that it is about
    /// to read ([`super::Directory::offer_delegation`]). Bounded by
    /// [`super::delegations::OFFERS_QUEUED_MAX`].
    pub offers: VecDeque<(ObjectId, ReplicaId)>,
    /// Acknowledged reclaims still in `handed_out` (at most; some may have left on their
    /// time). Once they are more than half of it, and more than
    /// [`HANDED_OUT_COMPACTION_MIN`], one pass drops them: an acknowledgement costs O(1)
    /// amortized, not a scan of every task handed out, and `handed_out` stays within twice
    /// its awaited tasks plus that minimum.
    pub acknowledged_reclaims: usize,
    /// Whether the node serves a peer endpoint, so copies over the network may come from
    /// or go to it. True until the configuration that declared it says otherwise
    /// ([`super::Directory::set_peer_endpoint`]).
    pub peer_endpoint: bool,
    /// Where the other nodes reach that endpoint, as the configuration says; `None` when
    /// it serves none or no configuration declared it.
    pub peer_address: Option<SocketAddr>,
    /// When the leases of this node's last fenced or replaced session have surely ended:
    /// the directory's and the node's local ones, all granted before the session ended and
    /// none longer than `lease_duration`.
    pub fenced_leases_end: Timestamp,
    /// Reclaim tasks for this node wait until then: it adopted memory replicas again in a
    /// new session while its engines may still read them under the fenced session's leases
    /// (`fenced_leases_end`). A restarted process, whose pool is new memory, adopts none.
    pub reclaims_held_until: Timestamp,
}
