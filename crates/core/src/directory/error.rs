//! Errors of the directory boundary. Expected outcomes (miss, skip, already present) are
//! values of the operation's result, not errors; an error means the request was refused
//! and changed nothing.

use crate::model::{Epoch, NamespaceError, OperationId, ReplicaId};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Which bounded table refused an insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Table {
    Replicas,
    Leases,
    SessionLeases,
    Nodes,
    Sessions,
    Pools,
    Namespaces,
    Ledger,
    Reservations,
    Extents,
    /// Host pools of one node (`pools_per_node_max`).
    PoolsOfNode,
    /// Namespaces of one salt, that is of one tenant (`namespaces_per_salt_max`).
    NamespacesOfSalt,
}

/// A refused directory request. Nothing changed; the doc of each variant says what the
/// caller does.
#[derive(Clone, Debug, Error, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirectoryError {
    /// The session id is not known (never opened, or forgotten long after fencing).
    /// The node opens a new session.
    #[error("unknown session")]
    UnknownSession,
    /// The session was fenced by a newer epoch or a heartbeat timeout. The node opens a
    /// new session and resolves its operations in flight.
    #[error("session fenced (epoch {epoch:?})")]
    Fenced { epoch: Epoch },
    /// A bounded table is full. The caller backs off (or acknowledges its ledger) and
    /// retries; admitted state is never dropped to make room.
    #[error("{0:?} table is full")]
    Full(Table),
    /// The batch has more items than `batch_items_max`; split it.
    #[error("batch of {items} items exceeds the limit of {max}")]
    BatchTooLarge { items: usize, max: usize },
    /// The namespace descriptor is incomplete or unsupported.
    #[error("invalid namespace: {0}")]
    InvalidNamespace(NamespaceError),
    /// The namespace was never registered; register it first.
    #[error("unknown namespace")]
    UnknownNamespace,
    /// The session may not use this namespace.
    #[error("namespace not permitted for this node")]
    NamespaceDenied,
    /// The pool id is not registered (or was dropped with its node's old epoch).
    #[error("unknown pool")]
    UnknownPool,
    /// The pool description is unusable (zero capacity, page size not a power of two,
    /// a host pool for another node, an unknown domain...).
    #[error("invalid pool: {0}")]
    InvalidPool(String),
    /// A measured tier profile is unusable (a zero or non-finite figure). The node keeps
    /// serving; the pool keeps its previous profile.
    #[error("invalid profile: {0}")]
    InvalidProfile(String),
    /// The replica id names no live replica: it was freed, or its slot was reused.
    #[error("unknown or stale replica {0:?}")]
    UnknownReplica(ReplicaId),
    /// The replica belongs to another node.
    #[error("replica {0:?} is owned by another node")]
    NotOwner(ReplicaId),
    /// The replica is not in a state that permits the operation.
    #[error("replica {replica:?} is {state}, operation needs {needed}")]
    InvalidState {
        replica: ReplicaId,
        state: String,
        needed: String,
    },
    /// The committed location does not match the reservation (pool, or length).
    #[error("location does not match the reservation of {0:?}")]
    LocationMismatch(ReplicaId),
    /// A zero or oversized object length.
    #[error("object length {length_bytes} bytes is not accepted")]
    InvalidLength { length_bytes: u64 },
    /// The operation id was already acknowledged by the node; a retry of an old
    /// operation is refused, never applied twice.
    #[error("operation {0:?} was already acknowledged")]
    OperationAcknowledged(OperationId),
    /// `resolve` asked about another node's session.
    #[error("cannot resolve another node's operations")]
    ForeignSession,
    /// Too many nodes are rejoining at once: the directory takes this report later. The
    /// node waits a tick or more and sends it again.
    #[error("rejoin reports are paced; send again shortly")]
    Paced,
    /// `close` while the session still holds leases or reservations; release them first.
    #[error("session not drained: {leases} leases, {reservations} reservations")]
    NotDrained { leases: u32, reservations: u32 },
    /// The directory drained this node and ended its session. The node exits cleanly and
    /// removes its files; it does not rejoin (unlike after `UnknownSession` or `Fenced`).
    #[error("this node was drained; its session ended")]
    Drained,
    /// No node of that name has an open session to drain.
    #[error("no node `{0}` with an open session")]
    UnknownNode(String),
    /// A shard of a sharded directory answered its part of a batch with another number of
    /// items than it was asked: a fault of the directory, never of the request.
    #[error("shard {shard} answered {answered} items of {asked}")]
    ShardAnswer {
        shard: usize,
        answered: usize,
        asked: usize,
    },
}
