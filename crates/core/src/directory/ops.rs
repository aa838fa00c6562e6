//! Requests and outcomes of the directory's operations. They are serializable because the
//! wire carries them unchanged; the directory core is their only interpreter.

use crate::model::{
    DomainId, Epoch, LeaseId, Location, Medium, NodeId, ObjectId, OwnerWord, PoolId, ReplicaId,
    SessionId, TaskId, Timestamp, TransferToken,
};
use serde::{Deserialize, Serialize};

/// Which namespaces a node may use; decided by the operator's configuration, not by the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NamespaceAccess {
    /// Every registered namespace.
    Any,
    /// Only these models (by model name).
    Models(Vec<String>),
}

/// What a node declares when it opens a session. `domains` and `namespaces` come from the
/// directory's configuration for the authenticated node name, never from the node itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenRequest {
    pub node_name: String,
    /// The node's store placement order over media, e.g. `[Cpu, Cxl]`.
    pub write_order: Vec<Medium>,
    /// The node's read preference over media, cheapest first.
    pub read_order: Vec<Medium>,
    /// Sharing domains whose pools this node maps.
    pub domains: Vec<DomainId>,
    pub namespaces: NamespaceAccess,
}

/// The directory's answer to `open`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenReply {
    pub session: SessionId,
    pub node: NodeId,
    /// Larger than every earlier epoch of this node; the earlier session is fenced.
    pub epoch: Epoch,
    /// The session the new one fenced, so the node can resolve that session's operations.
    pub fenced_session: Option<SessionId>,
    pub lease_duration_ms: u64,
    pub heartbeat_interval_ms: u64,
    /// Silence after which the directory fences the session: a node whose heartbeats went
    /// unanswered this long stops on its own (`node::Liveness`).
    pub fence_after_ms: u64,
    /// Items one probe, acquire or release may carry: a node refuses larger batches itself,
    /// before changing its books.
    pub batch_items_max: u32,
    /// The directory's recovery window ([`crate::directory::Directory::recovery_window`]):
    /// a rejoining node frees a replica the directory did not adopt only this long after
    /// its session was lost, when no lease of the previous incarnation can be read any more.
    pub recovery_window_ms: u64,
}

/// One object to store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveItem {
    pub object: ObjectId,
    pub length_bytes: u64,
}

/// The outcome of `reserve`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReserveOutcome {
    /// Write `allocated_bytes` into `pool`, then commit `replica`.
    Granted {
        replica: ReplicaId,
        pool: PoolId,
        medium: Medium,
        allocated_bytes: u64,
    },
    /// A replica this node can read is already READY: nothing to store.
    AlreadyPresent,
    /// A replica this node can read is being written by someone: nothing to store.
    Pending,
    /// The store is skipped, for the reason given; existing hits stay.
    Skip(StoreSkip),
}

/// Why a store was skipped: nothing was written, and an engine recomputes later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum StoreSkip {
    /// The node is being drained: it takes no new objects.
    #[error("the node is being drained and takes no new objects")]
    Draining,
    /// No pool of the node's write order may take the object: the node writes none (its
    /// write order names no medium it has, or it holds no extent of a shared pool), or
    /// none admits it.
    #[error("no pool of the node's write order may take it")]
    NoPool,
    /// The object is larger than every pool the node may write.
    #[error("it is larger than every pool the node may write")]
    TooLarge,
    /// Every pool the node may write is full; room is being made (evictions and
    /// demotions started): a later store may find it.
    #[error("every pool the node may write is full; room is being made, try again")]
    NoRoom,
    /// The node could not reach the directory, or is rejoining it.
    #[error("the node cannot reach the directory now")]
    DirectoryUnavailable,
    /// The node's own pool refused the pages the directory granted (its figures lagged).
    #[error("the node's pool had no pages for it")]
    PoolRefused,
    /// The grant ran out before the bytes were written.
    #[error("the grant ran out before the bytes were written")]
    GrantExpired,
    /// The written object was not published: the node's session was replaced, or the
    /// directory could not be reached.
    #[error("the written object was not published (the node's session changed or the directory was unreachable)")]
    NotPublished,
}

impl StoreSkip {
    /// Whether the same store may pass if asked again shortly: room being made, a
    /// directory being reached again, a grant or session that changed. A draining node,
    /// no pool to write, or an object larger than every pool skip it again.
    pub fn is_transient(self) -> bool {
        !matches!(
            self,
            StoreSkip::Draining | StoreSkip::NoPool | StoreSkip::TooLarge
        )
    }

    /// Its label in metrics and JSON: `no_room`, `draining`, ...
    pub fn label(self) -> &'static str {
        match self {
            StoreSkip::Draining => "draining",
            StoreSkip::NoPool => "no_pool",
            StoreSkip::TooLarge => "too_large",
            StoreSkip::NoRoom => "no_room",
            StoreSkip::DirectoryUnavailable => "directory_unavailable",
            StoreSkip::PoolRefused => "pool_refused",
            StoreSkip::GrantExpired => "grant_expired",
            StoreSkip::NotPublished => "not_published",
        }
    }
}

/// The outcome of `commit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommitOutcome {
    /// The replica is READY.
    Committed,
    /// Another READY replica in the same placement scope won the race; this reservation
    /// was aborted and the writer frees its pages.
    AlreadyPresent,
}

/// The answer of `resolve` about an operation whose reply was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResolveOutcome {
    /// It was applied; here is its outcome.
    Reserved(ReserveOutcome),
    Committed(CommitOutcome),
    ExtentGranted(ExtentGrant),
    ExtentReturned(ExtentReturn),
    /// It was not applied and never will be: the session is fenced, or the operation id
    /// is now burnt so a late arrival is refused.
    NotApplied,
    /// The directory no longer knows (acknowledged or forgotten). The node must not reuse
    /// the storage on that basis: it keeps the pages allocated (and counts them as lost)
    /// until its pool is created anew.
    Unknown,
}

/// The outcome of probing one object for one requester.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeOutcome {
    /// A READY replica the requester can map exists (its cheapest medium).
    Hit {
        medium: Medium,
        length_bytes: u64,
    },
    /// A replica the requester could map is being written.
    Pending,
    Miss,
    /// No replica the requester can map, but its node's SSD holds one: a prefetch or a
    /// load restores it into memory.
    OnSsd {
        length_bytes: u64,
    },
}

/// All-or-nothing or per item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquireMode {
    /// Lease every available item.
    Each,
    /// The items are parts of one manifest: lease all or none.
    Manifest,
}

/// A read lease: the replica stays READY (or RETIRING) and its storage is not reused
/// until the lease is released or its deadline passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub lease: LeaseId,
    /// How long the lease lasts from its grant. A reader measures it on its own clock from
    /// before it sent the acquire, so its local deadline is never later than the directory's.
    pub duration_ms: u64,
    pub replica: ReplicaId,
    pub medium: Medium,
    pub location: Location,
    pub deadline: Timestamp,
}

/// The outcome of acquiring one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquireOutcome {
    Leased(Lease),
    /// No READY replica this requester can map.
    Miss,
    /// Available, but not leased because another part of the manifest missed.
    Withheld,
}

/// The outcome of releasing one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseOutcome {
    Released,
    /// Not held by this session (expired, already released, or never granted).
    Unknown,
}

/// The outcome of `abort`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AbortOutcome {
    /// The reservation is gone and its bytes are free.
    Aborted,
    /// Not a reservation of this session (already committed, aborted or expired).
    Unknown,
}

/// The outcome of `retire`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetireOutcome {
    /// No reader holds it: a reclaim task is queued for its owner.
    Reclaimable,
    /// Readers hold it; the reclaim is queued when the last one releases. `leases` counts
    /// engines' leases; nodes' delegations on it, recalled now, hold it too (and may be
    /// all that does: then `leases` is 0).
    AwaitingReaders { leases: u32 },
}

/// Work the directory asks a node to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskKind {
    /// Free the replica's storage (bump the allocation's generation), then `reclaim_ack`.
    Reclaim {
        replica: ReplicaId,
        location: Location,
    },
    /// Demote, don't evict: copy the replica at `source` into `target_pool` (a colder tier
    /// other nodes can map), then commit the reserved `target`; the source then retires.
    /// If the copy cannot be made, `abort` the target: the source is evicted later instead.
    Demote {
        source: Location,
        target: ReplicaId,
        target_pool: PoolId,
    },
    /// Replicate on demand into shared memory: copy the replica at `source` into
    /// `target_pool` (a domain pool the source's owner and the requesting node both map),
    /// then commit the reserved `target`. Unlike `Demote`, the source stays. If the copy
    /// cannot be made, `abort` the target.
    Replicate {
        source: Location,
        target: ReplicaId,
        target_pool: PoolId,
    },
    /// Replicate on demand over the network, the source's half: stream the replica at
    /// `source` (`length_bytes`) to node `to`, which received the matching `Receive`.
    Push {
        source: Location,
        target: ReplicaId,
        /// Presented in the stream's header: the receiver accepts no other.
        token: TransferToken,
        length_bytes: u64,
        to: NodeId,
    },
    /// Replicate on demand over the network, the requester's half: allocate
    /// `length_bytes` in `target_pool` (this node's own CPU pool), accept the stream for
    /// `target` only from node `from` with `token`, write it, then commit `target`; on any failure
    /// free the pages and `abort` the target. Once committed the node holds `object`
    /// there, as after any store.
    Receive {
        object: ObjectId,
        target: ReplicaId,
        /// The token the sender's stream must present.
        token: TransferToken,
        target_pool: PoolId,
        length_bytes: u64,
        from: NodeId,
    },
    /// Stop granting local leases under `delegation` (on `replica`) and release it once no
    /// local lease under it is live ([`super::delegations`]). Handed out again until the
    /// delegation ends: acting on it twice changes nothing.
    Recall {
        delegation: LeaseId,
        replica: ReplicaId,
    },
    /// A delegation on `object`'s READY replica (`lease` says which and where, and how
    /// long a local lease under it lasts), granted when this task was handed out: the node
    /// answers the object's hits under it from then on, as under a delegation an acquire
    /// brought, measured from before it asked for its tasks. Never handed out again and
    /// never acknowledged: lost, it ends at its deadline or with the session.
    Delegate {
        object: ObjectId,
        lease: Lease,
        delegation: Delegation,
    },
}

/// A delegation granted with a lease: the node answers hits on the lease's replica under
/// `lease` for `duration_ms`, measured on its clock from before it asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    pub lease: LeaseId,
    pub duration_ms: u64,
}

/// A queued task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub kind: TaskKind,
}

/// The outcome of `reclaim_ack`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReclaimOutcome {
    /// The replica is freed and its bytes count as free.
    Freed,
    /// Unknown or already freed: nothing to do (acks are idempotent).
    Unknown,
}

/// A range of a shared pool granted to one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub pool: PoolId,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    /// The extent's owner word as the directory last knew it: the node takes the extent
    /// from this word (`model::extent_owner`); `None` when this incarnation never learnt it.
    pub owner_word: Option<OwnerWord>,
}

/// An extent a rejoining node claims: its offset and the owner word the node wrote when it
/// took it back (`None` when the pool's owner table does not reach it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentClaim {
    pub offset_bytes: u64,
    pub owner_word: Option<OwnerWord>,
}

/// The outcome of `grant_extent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExtentGrant {
    Granted(Extent),
    /// Every extent is held: the pool is full for new writers.
    Full,
}

/// The outcome of a node giving an extent back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExtentReturn {
    /// The directory took it back: it cools down, then may be granted to any node. The
    /// node must never allocate in it again.
    Returned,
    /// It is still the node's (committed replicas inside, not yet reclaimed): the node may
    /// keep allocating in it.
    InUse,
    /// It is not the node's (another session's, not an extent boundary, or already
    /// returned): the node must never allocate in it.
    NotOwner,
}
