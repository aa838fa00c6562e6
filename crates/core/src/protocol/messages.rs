//! The protocol's messages: node ↔ directory over QUIC, and engine client ↔ node over a
//! Unix socket. Both start with [`Hello`], which fixes the protocol version and the
//! capabilities for the connection; every later frame is a request answered by exactly
//! one reply with the same request id.

use crate::directory::reload::{ConfigChange, ReloadRefusal};
use crate::directory::{
    AcquireMode, AcquireOutcome, CommitOutcome, Delegation, DirectoryError, DrainProgress,
    ExtentReturn, LocalHits, NodeStatus, OpenReply, ProbeOutcome, ReclaimOutcome, ReleaseOutcome,
    ReserveItem, ResolveOutcome, RetireOutcome, Task,
};
use crate::model::{
    Epoch, LeaseId, Location, Medium, NamespaceDescriptor, NamespaceId, NodeId, ObjectId,
    OperationId, PoolId, PoolSpec, PoolUsage, ReplicaId, SessionId,
};
use crate::node::{ClientRefusal, TenantRefusal};
use crate::policy::profiles::Measurement;
use serde::{Deserialize, Serialize};

/// Message-set versions this build speaks, newest last. 2 added profile reports and the
/// profile in usage reports; 3 gave extent returns an operation id and a typed outcome; 5
/// added replication tasks (Replicate, Push, Receive), staged (SSD) pools (admission,
/// probe's on SSD) and prefetch; 6 added batched stores (BeginStoreMany, CommitStoreMany,
/// ReserveMany, CommitMany), the directory's task wait (AwaitTasks), RetireHeld and each
/// node's peer address in the cluster status; 7 added SSD pins (PinOnSsd, UnpinOnSsd:
/// where an object's bytes are in the node's SSD files, for a reader such as GPUDirect
/// Storage); 8 took drain and reload off the node's socket (an operator certificate asks the
/// directory); 9 hands the pools' files over the node's socket before hello
/// ([`crate::wire::handoff`]) instead of naming paths, gives a skipped store its reason
/// (reserve and store grants) and a reload its repriced namespaces; 10 added delegations
/// (AcquireDelegating, ReportHits, the Recall task, local leases); 11 partitions a node's
/// CPU memory by salt group (a pool's tenancy, a mapping's write permission); 12 records
/// each extent's owner in the shared pool ([`crate::model::extent_owner`]): a grant carries
/// the owner word the directory knew, a claim the word the node wrote; 13 added `Locate`
/// (which nodes can load how much of a prefix, for routers); 14 added `ReclaimAckMany`; 15
/// lets a batch's commit say a store ended as pending or skipped (grants handed out before
/// their reserve was answered); 16 writes the 128-bit identities (namespaces, prefix
/// digests, salt groups) as one byte string each instead of 16 numbers
/// ([`crate::model::object`]); 17 adds the `Delegate` task (a delegation on offer); 18 adds
/// the refusal of a sharded directory's shard that answered a batch short
/// ([`crate::directory::DirectoryError::ShardAnswer`]). An older peer is refused at hello
/// rather than misread.
pub const SUPPORTED_VERSIONS: &[u16] = &[18];
/// Capabilities this build offers; the connection uses the intersection with the peer's.
pub const CAPABILITIES: &[&str] = &["batch-probe", "manifest-acquire", "resolve"];

/// The first frame on every connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Versions the sender speaks.
    pub versions: Vec<u16>,
    pub capabilities: Vec<String>,
}

impl Hello {
    /// This build's hello.
    pub fn ours() -> Hello {
        Hello {
            versions: SUPPORTED_VERSIONS.to_vec(),
            capabilities: CAPABILITIES
                .iter()
                .map(|capability| capability.to_string())
                .collect(),
        }
    }

    /// The version and capabilities both sides share, or `None` when no version is common.
    pub fn negotiate(&self, peer: &Hello) -> Option<Hello> {
        let version = self
            .versions
            .iter()
            .filter(|version| peer.versions.contains(version))
            .max()?;
        Some(Hello {
            versions: vec![*version],
            capabilities: self
                .capabilities
                .iter()
                .filter(|capability| peer.capabilities.contains(capability))
                .cloned()
                .collect(),
        })
    }
}

/// A node's request to the directory. The session is the connection's: `Open` binds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirectoryRequest {
    Hello(Hello),
    /// Opens a session for the node named by the connection's certificate. Media orders come
    /// from the node; domains and namespace access from the directory's configuration.
    Open {
        write_order: Vec<Medium>,
        read_order: Vec<Medium>,
    },
    /// Binds a new connection to the node's still-open session after a connection loss.
    Resume {
        session: SessionId,
    },
    Heartbeat {
        acknowledged_through: Option<OperationId>,
    },
    Close,
    RegisterPool(PoolSpec),
    RegisterNamespace(NamespaceDescriptor),
    Reserve {
        operation: OperationId,
        item: ReserveItem,
    },
    Commit {
        operation: OperationId,
        replica: ReplicaId,
        location: Location,
    },
    Resolve {
        target: SessionId,
        operation: OperationId,
    },
    Probe {
        objects: Vec<ObjectId>,
    },
    Acquire {
        objects: Vec<ObjectId>,
        mode: AcquireMode,
    },
    Release {
        leases: Vec<LeaseId>,
    },
    /// `Acquire`, and with each lease a delegation where the session holds none fresh on
    /// its replica ([`crate::directory::Delegation`]).
    AcquireDelegating {
        objects: Vec<ObjectId>,
        mode: AcquireMode,
    },
    /// The hits the node answered under its delegations since its last report.
    ReportHits {
        hits: Vec<LocalHits>,
    },
    /// Releases the session's `released` leases (delegations the node gave up for this
    /// retire), then retires `replica`, which must be a replica of `object`.
    Retire {
        object: ObjectId,
        replica: ReplicaId,
        released: Vec<LeaseId>,
    },
    /// Gives an unwritten reservation back.
    Abort {
        replica: ReplicaId,
    },
    /// Asks for an extent of a shared pool to allocate in.
    GrantExtent {
        operation: OperationId,
        pool: PoolId,
    },
    /// Gives back an extent the node no longer allocates in; idempotent by operation id
    /// and resolvable like a store, so a lost reply never lets the node guess.
    /// An extent given back: one that emptied, or one a grant could not take because its
    /// owner word had moved on (`owner_word`: the word found, which the directory grants it
    /// from next).
    ReturnExtent {
        operation: OperationId,
        pool: PoolId,
        offset_bytes: u64,
        owner_word: Option<crate::model::OwnerWord>,
    },
    ReclaimAck {
        replica: ReplicaId,
    },
    /// `ReclaimAck` for each replica, in order, answered with `ReclaimedMany`; at most the
    /// session's `batch_items_max` replicas. A node acknowledges a batch of reclaim tasks
    /// in one request: under a full cache, every store is an eviction.
    ReclaimAckMany {
        replicas: Vec<ReplicaId>,
    },
    /// What the node's start-up probe measured of a pool it maps.
    ReportProfile {
        pool: PoolId,
        measured: Measurement,
    },
    Usage,
    PollTasks {
        max: u32,
    },
    /// A rejoining node claims the extents of a shared pool it still allocates in, each
    /// with the owner word it wrote (`None` past the pool's owner table).
    ClaimExtents {
        pool: PoolId,
        claims: Vec<crate::directory::ExtentClaim>,
    },
    /// A rejoining node reports READY replicas it still holds, in bounded batches.
    Adopt {
        holdings: Vec<crate::directory::Holding>,
    },
    /// The cluster as the directory sees it (`kvtier ctl status`).
    ClusterStatus,
    /// Re-read `cluster.toml` (`kvtier ctl reload`): an operator's connection only.
    Reload,
    /// Drain node `node` (`kvtier ctl drain`): an operator's connection only.
    Drain {
        node: String,
    },
    /// Sets the accesses an object needs before it is spilled into `pool`, the session's
    /// node's SSD pool (`[nodes.ssd] admit_after_accesses`). Answered with `Pool`.
    AdmitAfter {
        pool: PoolId,
        accesses: u32,
    },
    /// The node's storage at these locations is gone (its SSD store reclaimed the region
    /// that held them): retire the node's READY replica at each. Answered with
    /// `RetiredHeld`.
    RetireHeld {
        holdings: Vec<crate::directory::Holding>,
    },
    /// `PollTasks`, answered once the session has a task to hand out or after `wait_ms`
    /// (at most [`AWAIT_TASKS_WAIT_MS_MAX`]), whichever comes first: the directory wakes a
    /// node the moment it plans work for it instead of at its next poll. Answered with
    /// `Tasks` (empty when the wait ended with none).
    AwaitTasks {
        max: u32,
        wait_ms: u32,
    },
    /// Reserves for many objects at once, each item with its own operation id (idempotent
    /// and resolvable one by one, like `Reserve`). Answered with `ReservedMany`; at most
    /// the session's `batch_items_max` items.
    ReserveMany {
        items: Vec<crate::directory::ReserveBatchItem>,
    },
    /// Commits many written replicas at once, each item with its own operation id.
    /// Answered with `CommittedMany`; at most the session's `batch_items_max` items.
    CommitMany {
        items: Vec<crate::directory::CommitBatchItem>,
    },
    /// For each live node, how many leading `objects` (a prompt's chunks, in order) it can
    /// load without a network transfer ([`crate::directory::Directory::locate`]). Answered
    /// with `Located`; at most the session's `batch_items_max` objects.
    Locate {
        objects: Vec<ObjectId>,
    },
}

/// Longest an `AwaitTasks` waits before it is answered: well below a node's request
/// timeout, so a wait is never taken for a lost reply.
pub const AWAIT_TASKS_WAIT_MS_MAX: u32 = 1_000;

/// The cluster as the directory sees it: every node and every pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub nodes: Vec<NodeStatus>,
    pub pools: Vec<PoolUsageReport>,
}

/// One registered pool's usage, as reported by `usage`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolUsageReport {
    pub pool: PoolId,
    pub spec: PoolSpec,
    pub usage: PoolUsage,
    /// The profile the directory's policy prices the pool by.
    pub profile: Measurement,
}

/// The directory's reply, one per request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirectoryReply {
    Hello(Hello),
    Opened(OpenReply),
    Resumed(SessionId),
    Alive(Epoch),
    Closed,
    Pool(PoolId),
    Namespace(NamespaceId),
    Reserved(crate::directory::ReserveOutcome),
    Committed(CommitOutcome),
    Resolved(ResolveOutcome),
    Probed(Vec<ProbeOutcome>),
    Acquired(Vec<AcquireOutcome>),
    /// An `AcquireDelegating`'s outcomes, and per outcome its delegation if one was granted.
    AcquiredDelegating {
        outcomes: Vec<AcquireOutcome>,
        delegations: Vec<Option<Delegation>>,
    },
    /// A `ReportHits` was counted.
    HitsReported,
    Released(Vec<ReleaseOutcome>),
    Retired(RetireOutcome),
    Aborted(crate::directory::AbortOutcome),
    Extent(crate::directory::ExtentGrant),
    /// Whether a returned extent was taken back.
    ExtentReturned(ExtentReturn),
    Reclaimed(ReclaimOutcome),
    /// Per replica of a `ReclaimAckMany`, in order: its outcome or why it was refused.
    ReclaimedMany(Vec<Result<ReclaimOutcome, DirectoryError>>),
    /// The profile in force after a report.
    Profile(Measurement),
    Usage(Vec<PoolUsageReport>),
    Tasks(Vec<Task>),
    /// Per claimed extent, whether it is the session's now.
    Claimed(Vec<bool>),
    Adopted(Vec<crate::directory::AdoptOutcome>),
    ClusterStatus(ClusterStatus),
    /// What a reload applied.
    Reloaded(ConfigChange),
    /// A drain started (or under way), with its progress.
    Draining(DrainProgress),
    Error(ProtocolError),
    /// How many replicas a `RetireHeld` retired.
    RetiredHeld(u32),
    /// Per item of a `ReserveMany`, in order: its outcome or why it was refused.
    ReservedMany(Vec<Result<crate::directory::ReserveOutcome, DirectoryError>>),
    /// Per item of a `CommitMany`, in order: its outcome or why it was refused.
    CommittedMany(Vec<Result<CommitOutcome, DirectoryError>>),
    /// A `Locate`'s runs, longest first.
    Located(Vec<crate::directory::NodeRun>),
}

/// A request refused at the protocol layer or by the directory. Typed so the caller can act.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ProtocolError {
    /// The directory refused the operation; nothing changed.
    #[error("directory: {0}")]
    Directory(DirectoryError),
    /// No common protocol version; the connection closes.
    #[error("no common protocol version; this side speaks {supported:?}")]
    UnsupportedVersion { supported: Vec<u16> },
    /// The first frame was not `Hello`, or `Open` was sent twice, or an operation came
    /// before `Open`.
    #[error("protocol violation: {0}")]
    Sequence(String),
    /// The frame could not be decoded (the connection stays usable).
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// The peer's certificate names no node of this cluster.
    #[error("peer `{0}` is not a node of this cluster")]
    UnknownPeer(String),
    /// Too many requests in flight on this connection; retry after a reply arrives.
    #[error("too many requests in flight")]
    Busy,
    /// The node could not complete a local step (pool allocation, reaching the directory).
    #[error("node: {0}")]
    Node(String),
    /// The node's tenant rules refuse this client or this namespace.
    #[error("tenant: {0}")]
    Tenant(TenantRefusal),
    /// A per-client quota, or an object outside the client's namespaces; nothing changed.
    #[error("client: {0}")]
    Client(ClientRefusal),
    /// The directory refused a reload as a whole; the configuration in force stays.
    #[error("reload refused: {0}")]
    Reload(ReloadRefusal),
    /// An administrative request (reload, drain) from a client that may not make it: only
    /// a process of the node's own user may.
    #[error("not permitted: {0}")]
    NotPermitted(String),
}

/// What an engine asks its local node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientRequest {
    Hello(Hello),
    /// The node's identity and epoch, and the pools this client may map.
    Describe,
    RegisterNamespace(NamespaceDescriptor),
    /// Reserves room for an object; on a grant, the client writes the bytes at the returned
    /// location in its own mapping, then sends `CommitStore`.
    BeginStore {
        object: ObjectId,
        length_bytes: u64,
    },
    CommitStore {
        ticket: u64,
    },
    /// Gives a grant back unwritten.
    AbortStore {
        ticket: u64,
    },
    Probe {
        objects: Vec<ObjectId>,
    },
    Acquire {
        objects: Vec<ObjectId>,
        mode: AcquireMode,
    },
    Release {
        leases: Vec<LeaseId>,
    },
    /// Starts retiring a replica of `object` this node wrote (the engine knows its id from
    /// a lease). The object must be in a namespace this connection registered, and the
    /// directory checks the replica is that object's.
    Retire {
        object: ObjectId,
        replica: ReplicaId,
    },
    /// The cluster as the directory sees it (`kvtier top`, `kvtier ctl status`): the node's
    /// own user only. Drain and reload are not asked of a node: they need an operator
    /// certificate at the directory.
    ClusterStatus,
    /// Starts restoring the objects only the node's SSD holds into a memory pool, and
    /// answers at once with how many restores it started (`Prefetching`). A later `Acquire`
    /// of them joins the restores still under way.
    Prefetch {
        objects: Vec<ObjectId>,
    },
    /// `BeginStore` for up to [`STORE_BATCH_ITEMS_MAX`] objects in one round trip; answered
    /// with `Grants`, one per item in order. More items are refused whole (`BatchTooLarge`).
    BeginStoreMany {
        items: Vec<ReserveItem>,
    },
    /// `CommitStore` for up to [`STORE_BATCH_ITEMS_MAX`] tickets in one round trip; answered
    /// with `StoredMany`, one per ticket in order.
    CommitStoreMany {
        tickets: Vec<u64>,
    },
    /// Where each object's bytes are in the node's SSD store, for a reader that reads the
    /// file itself (GPUDirect Storage): up to [`STORE_BATCH_ITEMS_MAX`] objects, answered
    /// with `PinnedOnSsd`. Each region named stays protected from reuse until `UnpinOnSsd`,
    /// the pin's time is up or the connection ends.
    PinOnSsd {
        objects: Vec<ObjectId>,
    },
    /// Ends pins `PinOnSsd` gave this connection (others are ignored); answered with
    /// `Unpinned` and how many it ended.
    UnpinOnSsd {
        pins: Vec<u64>,
    },
    /// Which nodes of the cluster can load how much of a prefix (`objects`, a prompt's
    /// chunks in order) without a network transfer, for a router; answered with `Located`
    /// (none while the directory is out of reach).
    Locate {
        objects: Vec<ObjectId>,
    },
}

/// An object's bytes in place in a node's SSD store, protected from reuse while its pin
/// lasts. The file is the node's (private to its user and group): open it read-only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SsdExtent {
    /// The pin to end with `UnpinOnSsd`.
    pub pin: u64,
    /// The region file.
    pub path: String,
    /// Offset of the object's bytes in the file (4 KiB-aligned).
    pub offset: u64,
    /// The object's length.
    pub length_bytes: u64,
    /// crc32c of the object's bytes, for the reader to check.
    pub data_crc: u32,
    /// How long the pin lasts from its grant, unless ended earlier.
    pub lasts_ms: u64,
}

/// Items one `BeginStoreMany` or `CommitStoreMany` may carry: a client splits larger
/// batches. Bounds the node's work and reply per request (64 grants of a few hundred bytes).
pub const STORE_BATCH_ITEMS_MAX: usize = 64;

/// What became of one commit of a `CommitStoreMany`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreCommitted {
    /// As `Stored` answers a `CommitStore`.
    Stored(CommitOutcome),
    /// As `NotStored` answers a `CommitStore`: not published, pages freed.
    NotStored,
    /// The commit was refused (an unknown ticket, say).
    Refused(ProtocolError),
    /// Not published: another writer was storing the object when the grant's reserve
    /// reached the directory (pages freed).
    Pending,
    /// Not published, for this reason, found when the grant's reserve reached the
    /// directory (pages freed).
    Skipped(crate::directory::StoreSkip),
}

/// A pool the client can map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMapping {
    pub pool: PoolId,
    pub medium: Medium,
    /// The position of the pool's file among those the connection's handoff carried
    /// ([`crate::wire::handoff`]): the sealed CPU partition of the client's tenant, and the
    /// CXL pools the node maps. The client opens no path.
    pub handed: u32,
    /// Whether the client may write the pool (its medium is in the node's write order).
    /// Otherwise the handed file is open read-only and the client maps it read-only: a
    /// load's view cannot change the bytes, nor the client truncate the file.
    pub writable: bool,
    pub pool_uuid: u128,
    pub data_bytes: u64,
}

/// The answer to `Describe`. A client that sees the epoch change knows the node restarted
/// and its pools were created anew.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDescription {
    pub node: NodeId,
    pub epoch: Epoch,
    pub pools: Vec<PoolMapping>,
}

/// The answer to `BeginStore`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreGrant {
    /// Write `location.length_bytes` bytes at `location.offset_bytes` of the pool, then commit,
    /// both within `valid_ms` of sending the request (on the client's clock); past that the
    /// node takes the grant back and the client must neither write nor commit.
    Write {
        ticket: u64,
        location: Location,
        valid_ms: u64,
    },
    AlreadyPresent,
    Pending,
    /// The store is skipped, for the reason given; existing hits stay.
    Skip(crate::directory::StoreSkip),
}

/// The node's reply to a client, one per request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientReply {
    Hello(Hello),
    Described(NodeDescription),
    Namespace(NamespaceId),
    Grant(StoreGrant),
    Stored(CommitOutcome),
    /// The written store was not published (the node's session was replaced meanwhile,
    /// or the directory could not be reached): its pages are freed; recompute later.
    NotStored,
    Aborted,
    Probed(Vec<ProbeOutcome>),
    Acquired(Vec<AcquireOutcome>),
    Released(Vec<ReleaseOutcome>),
    Retired(RetireOutcome),
    ClusterStatus(ClusterStatus),
    Error(ProtocolError),
    /// Restores a `Prefetch` started.
    Prefetching(u32),
    /// Per item of a `BeginStoreMany`, in order: its grant or why it was refused.
    Grants(Vec<Result<StoreGrant, ProtocolError>>),
    /// Per ticket of a `CommitStoreMany`, in order.
    StoredMany(Vec<StoreCommitted>),
    /// Per object of a `PinOnSsd`, in order: where its bytes are, or `None` when the node's
    /// SSD store does not hold it.
    PinnedOnSsd(Vec<Option<SsdExtent>>),
    /// Pins an `UnpinOnSsd` ended.
    Unpinned(u32),
    /// A `Locate`'s runs, longest first.
    Located(Vec<crate::directory::NodeRun>),
}

impl ProtocolError {
    /// A bounded label for the error (its variant, never its payload), for metrics.
    pub fn label(&self) -> &'static str {
        use DirectoryError as Error;
        match self {
            ProtocolError::Directory(error) => match error {
                Error::UnknownSession => "unknown_session",
                Error::Fenced { .. } => "fenced",
                Error::Full(_) => "full",
                Error::BatchTooLarge { .. } => "batch_too_large",
                Error::InvalidNamespace(_) => "invalid_namespace",
                Error::UnknownNamespace => "unknown_namespace",
                Error::NamespaceDenied => "namespace_denied",
                Error::UnknownPool => "unknown_pool",
                Error::InvalidPool(_) => "invalid_pool",
                Error::InvalidProfile(_) => "invalid_profile",
                Error::UnknownReplica(_) => "unknown_replica",
                Error::NotOwner(_) => "not_owner",
                Error::InvalidState { .. } => "invalid_state",
                Error::LocationMismatch(_) => "location_mismatch",
                Error::InvalidLength { .. } => "invalid_length",
                Error::OperationAcknowledged(_) => "operation_acknowledged",
                Error::ForeignSession => "foreign_session",
                Error::NotDrained { .. } => "not_drained",
                Error::Paced => "paced",
                Error::Drained => "drained",
                Error::UnknownNode(_) => "unknown_node",
                Error::ShardAnswer { .. } => "shard_answer",
            },
            ProtocolError::UnsupportedVersion { .. } => "unsupported_version",
            ProtocolError::Sequence(_) => "sequence",
            ProtocolError::Malformed(_) => "malformed",
            ProtocolError::UnknownPeer(_) => "unknown_peer",
            ProtocolError::Busy => "busy",
            ProtocolError::Node(_) => "node",
            ProtocolError::Tenant(TenantRefusal::UnknownPeer { .. }) => "unknown_peer",
            ProtocolError::Tenant(TenantRefusal::NamespaceDenied { .. }) => "namespace_denied",
            ProtocolError::Tenant(TenantRefusal::TooManyNamespaces { .. }) => "tenant_namespaces",
            ProtocolError::Tenant(TenantRefusal::NotInCxlPool { .. }) => "tenant_not_in_cxl_pool",
            ProtocolError::Tenant(TenantRefusal::NoPartition { .. }) => "tenant_without_partition",
            ProtocolError::Client(refusal) => refusal.label(),
            ProtocolError::Reload(_) => "reload",
            ProtocolError::NotPermitted(_) => "not_permitted",
        }
    }
}
