//! The engine-side API (`kvtier::client`): what an inference engine's connector links.
//! It talks to the local node over its Unix socket, maps the node's pools itself and
//! copies bytes directly into and out of them (memcpy today; GPU DMA is a later backend).
//!
//! Store: `begin` (the node reserves room and allocates pages) → the client writes the
//! bytes into its own mapping → `commit` (READY). Load: `acquire` (leases) → the client
//! reads from its mapping → `release`. A full cluster answers a store with
//! [`StoreOutcome::Skipped`] (with its [`StoreSkip`] reason), never an error: the engine simply recomputes later.

mod batches;
mod blocking;
mod load;
mod releases;
pub mod spin;
mod store;

pub use batches::batch_lengths;
pub use blocking::{STORE_RESERVES_HELD_MAX, STORE_RESERVE_BYTES_MAX};
pub use load::{LOAD_BATCHES_IN_FLIGHT, LOAD_BATCH_BYTES_MAX, LOAD_BATCH_ITEMS_MAX};
pub use releases::DROPPED_LEASES_QUEUED_MAX;
pub use store::{STORE_BATCHES_IN_FLIGHT, STORE_BATCH_BYTES_MAX};

use crate::backends::{Access, PoolError, SharedMemory};
pub use crate::directory::StoreSkip;

use crate::directory::{DirectoryError, Lease, NodeRun, ProbeOutcome, RetireOutcome};
use crate::model::{
    Epoch, LeaseId, Medium, NamespaceDescriptor, NamespaceId, NodeId, ObjectId, PoolId, ReplicaId,
};
use crate::protocol::messages::{ClientReply, ClientRequest, Hello, ProtocolError, SsdExtent};
use crate::wire::{handoff, uds, RpcClient, RpcConfig, WireError};
use releases::DroppedLeases;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::mpsc;

/// Requests one client keeps in flight to its node.
pub const CLIENT_INFLIGHT_MAX: usize = 256;
/// How long one request to the node may take.
pub const CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Store tickets queued for the background aborter (grants of a `store_many` future
/// dropped before it committed them); past this a ticket expires at the node.
pub const DROPPED_TICKETS_QUEUED_MAX: usize = 1024;
/// A view (or a store grant) stops one `LEASE_MARGIN_DIVISOR`th of its lifetime early
/// (clock-rate drift).
const LEASE_MARGIN_DIVISOR: u32 = 50;

/// Why a client call failed. A full cluster is not an error (see [`StoreOutcome`]).
#[derive(Debug, Error)]
pub enum ClientError {
    /// The node or the directory refused the request.
    #[error("refused: {0}")]
    Refused(ProtocolError),
    /// The node could not be reached or the connection broke.
    #[error("node unreachable: {0}")]
    Wire(#[from] WireError),
    /// A pool the node named could not be mapped or verified.
    #[error("pool {pool}: {source}")]
    Pool { pool: PoolId, source: PoolError },
    /// The node answered with a reply of the wrong kind.
    #[error("unexpected reply from the node: {0}")]
    Unexpected(String),
    /// The view's lease ended: its bytes may already belong to another object. Load again.
    #[error("the lease of this view has expired")]
    LeaseExpired,
}

/// What became of one store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOutcome {
    /// Written and READY.
    Stored,
    /// Already cached where this node can read it (nothing written).
    AlreadyPresent,
    /// Being written by someone else right now (nothing written).
    Pending,
    /// Not stored, for the reason given (most often no room in any eligible pool);
    /// existing hits stay.
    Skipped(StoreSkip),
}

/// A connection to the local node, with the node's pools mapped. Cheap to share: clone it
/// per task.
#[derive(Clone)]
pub struct Client {
    rpc: RpcClient<ClientRequest, ClientReply>,
    pools: Arc<HashMap<PoolId, SharedMemory>>,
    dropped_leases: DroppedLeases,
    dropped_tickets: mpsc::Sender<u64>,
    /// The directory's `batch_items_max` once a refusal named it (`usize::MAX` before):
    /// acquires of `load_into` and releases split by it.
    batch_items_max: Arc<AtomicUsize>,
    node: NodeId,
    epoch: Epoch,
}

impl Client {
    /// Connects to the node at `socket`, negotiates the protocol and maps its pools
    /// (verifying each pool's header and UUID).
    pub async fn connect(socket: &Path) -> Result<Client, ClientError> {
        let stream = uds::connect(socket).await?;
        // The memory files the node hands this connection (its CPU pool), each mapped once.
        let mut handed: Vec<Option<std::os::fd::OwnedFd>> =
            handoff::receive(&stream, CLIENT_REQUEST_TIMEOUT)
                .await?
                .into_iter()
                .map(Some)
                .collect();
        let rpc = RpcClient::spawn_unix(
            stream,
            RpcConfig {
                inflight_requests_max: CLIENT_INFLIGHT_MAX,
                request_timeout: CLIENT_REQUEST_TIMEOUT,
            },
        )?;
        match rpc.call(ClientRequest::Hello(Hello::ours())).await? {
            ClientReply::Hello(_) => {}
            other => return Err(unexpected(other)),
        }
        let description = match rpc.call(ClientRequest::Describe).await? {
            ClientReply::Described(description) => description,
            other => return Err(unexpected(other)),
        };
        // This process's copy routines, measured now rather than in the first load's time.
        tokio::task::spawn_blocking(crate::backends::copy::routines)
            .await
            .map_err(|error| ClientError::Unexpected(format!("choosing copy routines: {error}")))?;
        let mut pools = HashMap::new();
        for mapping in &description.pools {
            let index = mapping.handed as usize;
            let Some(file) = handed.get_mut(index).and_then(Option::take) else {
                return Err(ClientError::Unexpected(format!(
                    "pool {} names file {index} of the handoff, which did not carry it",
                    mapping.pool
                )));
            };
            // The CPU pool must be sealed against resizing; a CXL pool cannot be. A pool the
            // client never writes comes read-only, and is mapped so.
            let sealed = mapping.medium == Medium::Cpu;
            let access = if mapping.writable {
                Access::ReadWrite
            } else {
                Access::ReadOnly
            };
            let memory = SharedMemory::from_handle(file, Some(mapping.pool_uuid), sealed, access)
                .map_err(|source| ClientError::Pool {
                pool: mapping.pool,
                source,
            })?;
            pools.insert(mapping.pool, memory);
        }
        let batch_items_max = Arc::new(AtomicUsize::new(usize::MAX));
        let dropped_leases = DroppedLeases::spawn(rpc.clone(), batch_items_max.clone());
        let (dropped_tickets, queue) = mpsc::channel(DROPPED_TICKETS_QUEUED_MAX);
        tokio::spawn(store::abort_dropped(rpc.clone(), queue));
        Ok(Client {
            rpc,
            pools: Arc::new(pools),
            dropped_leases,
            dropped_tickets,
            batch_items_max,
            node: description.node,
            epoch: description.epoch,
        })
    }

    /// The node this client is connected to, and the node's epoch when it connected.
    pub fn node(&self) -> (NodeId, Epoch) {
        (self.node, self.epoch)
    }

    async fn call(&self, request: ClientRequest) -> Result<ClientReply, ClientError> {
        call(&self.rpc, request).await
    }

    /// The directory's batch bound, as far as this client learned it (`usize::MAX` until a
    /// refusal named it).
    fn batch_items_max(&self) -> usize {
        self.batch_items_max.load(Ordering::Relaxed)
    }

    /// The bound `error` names when it is the directory's refusal of a batch too large
    /// (remembered for the later calls), else `None`.
    fn learn_batch_items_max(&self, error: &ClientError) -> Option<usize> {
        learn_batch_items_max(&self.batch_items_max, error)
    }

    /// Registers (or looks up) a namespace; objects carry the returned id.
    pub async fn register_namespace(
        &self,
        descriptor: NamespaceDescriptor,
    ) -> Result<NamespaceId, ClientError> {
        match self
            .call(ClientRequest::RegisterNamespace(descriptor))
            .await?
        {
            ClientReply::Namespace(id) => Ok(id),
            other => Err(unexpected(other)),
        }
    }

    /// Which objects are cached where this node can read them. Reserves nothing.
    pub async fn probe(&self, objects: &[ObjectId]) -> Result<Vec<ProbeOutcome>, ClientError> {
        match self
            .call(ClientRequest::Probe {
                objects: objects.to_vec(),
            })
            .await?
        {
            ClientReply::Probed(outcomes) => Ok(outcomes),
            other => Err(unexpected(other)),
        }
    }

    /// For each node of the cluster, how many leading `objects` (a prompt's chunks, in
    /// order) it can load without a network transfer, and from which tiers: the
    /// directory's answer from its index, longest run first; empty while the directory is
    /// out of reach. For a router choosing where to send a request. At most the
    /// directory's `batch_items_max` objects, in namespaces this client registered.
    pub async fn locate(&self, objects: &[ObjectId]) -> Result<Vec<NodeRun>, ClientError> {
        match self
            .call(ClientRequest::Locate {
                objects: objects.to_vec(),
            })
            .await?
        {
            ClientReply::Located(runs) => Ok(runs),
            other => Err(unexpected(other)),
        }
    }

    /// Starts restoring the objects only the node's SSD holds (those `probe` says are on
    /// SSD) into a memory pool and returns at once with how many restores it started. A
    /// later `load` of them waits for the restores still under way instead of starting
    /// others.
    pub async fn prefetch(&self, objects: &[ObjectId]) -> Result<u32, ClientError> {
        match self
            .call(ClientRequest::Prefetch {
                objects: objects.to_vec(),
            })
            .await?
        {
            ClientReply::Prefetching(started) => Ok(started),
            other => Err(unexpected(other)),
        }
    }

    /// Where each object's bytes are in the node's SSD files (`None` for one its SSD store
    /// does not hold), for a reader that reads them itself, as GPUDirect Storage does: open
    /// the file read-only and read `length_bytes` at `offset`, then check `data_crc`. Each
    /// region stays protected from reuse until [`Client::unpin_on_ssd`], the pin's
    /// `lasts_ms` or this connection's end. At most
    /// [`STORE_BATCH_ITEMS_MAX`](crate::protocol::messages::STORE_BATCH_ITEMS_MAX) objects
    /// per call, of namespaces this client registered.
    pub async fn pin_on_ssd(
        &self,
        objects: &[ObjectId],
    ) -> Result<Vec<Option<SsdExtent>>, ClientError> {
        match self
            .call(ClientRequest::PinOnSsd {
                objects: objects.to_vec(),
            })
            .await?
        {
            ClientReply::PinnedOnSsd(extents) if extents.len() == objects.len() => Ok(extents),
            other => Err(unexpected(other)),
        }
    }

    /// Ends pins [`Client::pin_on_ssd`] gave; how many it ended.
    pub async fn unpin_on_ssd(&self, pins: &[u64]) -> Result<u32, ClientError> {
        match self
            .call(ClientRequest::UnpinOnSsd {
                pins: pins.to_vec(),
            })
            .await?
        {
            ClientReply::Unpinned(ended) => Ok(ended),
            other => Err(unexpected(other)),
        }
    }

    /// Starts retiring `replica` of `object`, a replica this client's node wrote (its id
    /// comes from a lease): new loads miss it at once; its pages are reused only after the
    /// last reader released it. The object must be of a namespace this client registered.
    pub async fn retire(
        &self,
        object: ObjectId,
        replica: ReplicaId,
    ) -> Result<RetireOutcome, ClientError> {
        // This client's own dropped views must not count as readers of the replica.
        self.dropped_leases
            .flush(&self.rpc, &self.batch_items_max)
            .await?;
        match self.call(ClientRequest::Retire { object, replica }).await? {
            ClientReply::Retired(outcome) => Ok(outcome),
            other => Err(unexpected(other)),
        }
    }

    /// Releases leases explicitly (views released this way are not released again on drop),
    /// in parts within the directory's batch bound.
    pub async fn release(&self, leases: &[LeaseId]) -> Result<(), ClientError> {
        release(&self.rpc, &self.batch_items_max, leases).await
    }

    fn memory(&self, pool: PoolId) -> Result<&SharedMemory, ClientError> {
        self.pools.get(&pool).ok_or_else(|| {
            ClientError::Unexpected(format!(
                "the node named pool {pool}, which this client has not mapped"
            ))
        })
    }
}

/// A leased, zero-copy view of one cached object in a mapped pool. The bytes stay valid
/// and unchanged while the lease lives: until release, drop, or the lease deadline, after
/// which [`LoadedView::bytes`] refuses (the pages may hold another object by then).
pub struct LoadedView {
    pools: Arc<HashMap<PoolId, SharedMemory>>,
    valid_until: Instant,
    lease: Lease,
    dropped_leases: Option<DroppedLeases>,
}

impl LoadedView {
    /// The object's bytes, while the lease lives. A caller that reads past the deadline
    /// checks [`LoadedView::is_valid`] after reading.
    pub fn bytes(&self) -> Result<&[u8], ClientError> {
        if !self.is_valid() {
            return Err(ClientError::LeaseExpired);
        }
        let location = self.lease.location;
        let memory = self
            .pools
            .get(&location.pool)
            .ok_or(ClientError::Unexpected(format!(
                "pool {} is not mapped",
                location.pool
            )))?;
        memory
            .slice(location.offset_bytes, location.length_bytes)
            .map_err(|source| ClientError::Pool {
                pool: location.pool,
                source,
            })
    }

    /// Whether the lease still protects the bytes.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    /// The lease this view holds.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Gives up the view, returning its lease id for an explicit (batched) release.
    pub fn into_lease(mut self) -> LeaseId {
        self.dropped_leases = None;
        self.lease.lease
    }
}

impl Drop for LoadedView {
    fn drop(&mut self) {
        if let Some(queue) = self.dropped_leases.take() {
            // Full queue: the lease expires at the directory instead (bounded, never blocks).
            queue.push(self.lease.lease);
        }
    }
}

/// Sends `request`; a refusal is an error.
pub(super) async fn call(
    rpc: &RpcClient<ClientRequest, ClientReply>,
    request: ClientRequest,
) -> Result<ClientReply, ClientError> {
    match rpc.call(request).await? {
        ClientReply::Error(error) => Err(ClientError::Refused(error)),
        reply => Ok(reply),
    }
}

/// Releases `leases` in parts of at most `batch_items_max` (learning a smaller bound from a
/// refusal, then sending that part again in smaller ones).
async fn release(
    rpc: &RpcClient<ClientRequest, ClientReply>,
    batch_items_max: &AtomicUsize,
    leases: &[LeaseId],
) -> Result<(), ClientError> {
    let mut left = leases;
    while !left.is_empty() {
        let (part, rest) = left.split_at(left.len().min(batch_items_max.load(Ordering::Relaxed)));
        let leases = part.to_vec();
        match call(rpc, ClientRequest::Release { leases }).await {
            Ok(ClientReply::Released(_)) => left = rest,
            Ok(other) => return Err(unexpected(other)),
            Err(error) => match learn_batch_items_max(batch_items_max, &error) {
                Some(max) if max < part.len() => {}
                _ => return Err(error),
            },
        }
    }
    Ok(())
}

/// The bound `error` names when it is the directory's refusal of a batch too large (kept
/// in `batch_items_max`, never raised), else `None`.
fn learn_batch_items_max(batch_items_max: &AtomicUsize, error: &ClientError) -> Option<usize> {
    match error {
        ClientError::Refused(ProtocolError::Directory(DirectoryError::BatchTooLarge {
            max,
            ..
        })) if *max > 0 => {
            batch_items_max.fetch_min(*max, Ordering::Relaxed);
            Some(*max)
        }
        _ => None,
    }
}

impl ClientError {
    /// The same failure for one item of a batch that failed whole (a wire error keeps its
    /// kind, node unreachable, and its message).
    fn for_item(&self) -> ClientError {
        match self {
            ClientError::Refused(refused) => ClientError::Refused(refused.clone()),
            ClientError::Wire(error) => ClientError::Wire(WireError::ConnectionLost {
                reason: error.to_string(),
            }),
            ClientError::Pool { pool, source } => {
                ClientError::Unexpected(format!("pool {pool}: {source}"))
            }
            ClientError::Unexpected(reply) => ClientError::Unexpected(reply.clone()),
            ClientError::LeaseExpired => ClientError::LeaseExpired,
        }
    }
}

fn unexpected(reply: ClientReply) -> ClientError {
    match reply {
        ClientReply::Error(error) => ClientError::Refused(error),
        other => ClientError::Unexpected(format!("{other:?}")),
    }
}
