//! The engine-side API (`kvtier::client`): what an inference engine's connector links.
//! It talks to the local node over its Unix socket, maps the node's pools itself and
//! copies bytes directly into and out of them (memcpy today; GPU DMA is a later backend).
//!
//! Store: `begin` (the node reserves room and allocates pages) → the client writes the
//! bytes into its own mapping → `commit` (READY). Load: `acquire` (leases) → the client
//! reads from its mapping → `release`. A full cluster answers a store with
//! [`StoreOutcome::Skipped`], never an error: the engine simply recomputes later.

use crate::backends::{PoolError, SharedMemory};
use crate::directory::{
    AcquireMode, AcquireOutcome, CommitOutcome, Lease, ProbeOutcome, ReserveItem, RetireOutcome,
};
use crate::model::{
    Epoch, LeaseId, Location, NamespaceDescriptor, NamespaceId, NodeId, ObjectId, PoolId, ReplicaId,
};
use crate::protocol::messages::{
    ClientReply, ClientRequest, Hello, ProtocolError, StoreCommitted, StoreGrant,
    STORE_BATCH_ITEMS_MAX,
};
use crate::wire::{uds, RpcClient, RpcConfig, WireError};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;
use tokio::sync::mpsc;

/// Requests one client keeps in flight to its node.
pub const CLIENT_INFLIGHT_MAX: usize = 256;
/// How long one request to the node may take.
pub const CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Store batches one `store_many` keeps in flight: 4 × 64 = 256 tickets, well under what
/// a node admits per client (`tickets_max`, 1024).
pub const STORE_BATCHES_IN_FLIGHT: usize = 4;
/// Leases queued for the background releaser (dropped views, finished copies); past this
/// a dropped view's lease expires at the directory and a copy releases inline.
pub const DROPPED_LEASES_QUEUED_MAX: usize = 4096;
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
    /// No room in any eligible pool: skipped; existing hits stay.
    Skipped,
}

/// A connection to the local node, with the node's pools mapped. Cheap to share: clone it
/// per task.
#[derive(Clone)]
pub struct Client {
    rpc: RpcClient<ClientRequest, ClientReply>,
    pools: Arc<HashMap<PoolId, SharedMemory>>,
    dropped_leases: mpsc::Sender<LeaseId>,
    node: NodeId,
    epoch: Epoch,
}

impl Client {
    /// Connects to the node at `socket`, negotiates the protocol and maps its pools
    /// (verifying each pool's header and UUID).
    pub async fn connect(socket: &Path) -> Result<Client, ClientError> {
        let stream = uds::connect(socket).await?;
        let (reader, writer) = stream.into_split();
        let rpc = RpcClient::spawn(
            reader,
            writer,
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
        let mut pools = HashMap::new();
        for mapping in &description.pools {
            let memory = SharedMemory::open(Path::new(&mapping.path), Some(mapping.pool_uuid))
                .map_err(|source| ClientError::Pool {
                    pool: mapping.pool,
                    source,
                })?;
            pools.insert(mapping.pool, memory);
        }
        let (dropped_leases, queue) = mpsc::channel(DROPPED_LEASES_QUEUED_MAX);
        tokio::spawn(release_dropped(rpc.clone(), queue));
        Ok(Client {
            rpc,
            pools: Arc::new(pools),
            dropped_leases,
            node: description.node,
            epoch: description.epoch,
        })
    }

    /// The node this client is connected to, and the node's epoch when it connected.
    pub fn node(&self) -> (NodeId, Epoch) {
        (self.node, self.epoch)
    }

    async fn call(&self, request: ClientRequest) -> Result<ClientReply, ClientError> {
        match self.rpc.call(request).await? {
            ClientReply::Error(error) => Err(ClientError::Refused(error)),
            reply => Ok(reply),
        }
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

    /// Stores one object's bytes.
    pub async fn store(&self, object: ObjectId, bytes: &[u8]) -> Result<StoreOutcome, ClientError> {
        let sent = Instant::now();
        let grant = self
            .call(ClientRequest::BeginStore {
                object,
                length_bytes: bytes.len() as u64,
            })
            .await?;
        let (ticket, location, valid_until) = match grant {
            ClientReply::Grant(grant) => match granted(sent, Ok(grant)) {
                Granted::Write {
                    ticket,
                    location,
                    valid_until,
                } => (ticket, location, valid_until),
                Granted::Done(outcome) => return outcome,
            },
            other => return Err(unexpected(other)),
        };
        match self.write_granted(location, bytes, valid_until) {
            Ok(true) => {}
            written => {
                let _ = self.call(ClientRequest::AbortStore { ticket }).await;
                return written.map(|_| StoreOutcome::Skipped);
            }
        }
        match self.call(ClientRequest::CommitStore { ticket }).await? {
            ClientReply::Stored(committed) => outcome(StoreCommitted::Stored(committed)),
            ClientReply::NotStored => outcome(StoreCommitted::NotStored),
            other => Err(unexpected(other)),
        }
    }

    /// Stores several objects; one outcome per item, in order. Batches of up to
    /// [`STORE_BATCH_ITEMS_MAX`] items each take one round trip to reserve (the node then one
    /// to the directory) and one to commit; at most [`STORE_BATCHES_IN_FLIGHT`] batches are
    /// in flight at once, so the node's ticket bound is never reached by one call.
    pub async fn store_many(
        &self,
        items: &[(ObjectId, &[u8])],
    ) -> Vec<Result<StoreOutcome, ClientError>> {
        use futures_util::StreamExt;
        // A window of batches kept by hand rather than a stream combinator with a closure:
        // the future stays `Send` for any lifetime of `items`, so it can be spawned.
        let mut batches = items.chunks(STORE_BATCH_ITEMS_MAX);
        let mut in_flight = futures_util::stream::FuturesOrdered::new();
        let mut outcomes = Vec::with_capacity(items.len());
        loop {
            while in_flight.len() < STORE_BATCHES_IN_FLIGHT {
                let Some(batch) = batches.next() else {
                    break;
                };
                in_flight.push_back(self.store_batch(batch));
            }
            match in_flight.next().await {
                Some(done) => outcomes.extend(done),
                None => return outcomes,
            }
        }
    }

    /// One `BeginStoreMany`, the copies of the granted items, one `CommitStoreMany`.
    async fn store_batch(
        &self,
        items: &[(ObjectId, &[u8])],
    ) -> Vec<Result<StoreOutcome, ClientError>> {
        let sent = Instant::now();
        let request = ClientRequest::BeginStoreMany {
            items: items
                .iter()
                .map(|(object, bytes)| ReserveItem {
                    object: *object,
                    length_bytes: bytes.len() as u64,
                })
                .collect(),
        };
        let grants = match self.call(request).await {
            Ok(ClientReply::Grants(grants)) if grants.len() == items.len() => grants,
            Ok(other) => return every_item(items.len(), &unexpected(other)),
            Err(error) => return every_item(items.len(), &error),
        };
        let mut outcomes: Vec<Result<StoreOutcome, ClientError>> = Vec::with_capacity(items.len());
        let mut commits = Vec::new();
        let mut aborts = Vec::new();
        for (index, (grant, (_, bytes))) in grants.into_iter().zip(items).enumerate() {
            outcomes.push(match granted(sent, grant) {
                Granted::Done(outcome) => outcome,
                Granted::Write {
                    ticket,
                    location,
                    valid_until,
                } => match self.write_granted(location, bytes, valid_until) {
                    Ok(true) => {
                        commits.push((index, ticket));
                        Ok(StoreOutcome::Stored)
                    }
                    written => {
                        aborts.push(ticket);
                        written.map(|_| StoreOutcome::Skipped)
                    }
                },
            });
        }
        let aborted = futures_util::future::join_all(
            aborts
                .into_iter()
                .map(|ticket| self.call(ClientRequest::AbortStore { ticket })),
        );
        let commit = async {
            if commits.is_empty() {
                return Ok(ClientReply::StoredMany(Vec::new()));
            }
            let tickets = commits.iter().map(|(_, ticket)| *ticket).collect();
            self.call(ClientRequest::CommitStoreMany { tickets }).await
        };
        let (committed, _) = futures_util::join!(commit, aborted);
        match committed {
            Ok(ClientReply::StoredMany(committed)) if committed.len() == commits.len() => {
                for ((index, _), committed) in commits.iter().zip(committed) {
                    outcomes[*index] = outcome(committed);
                }
            }
            other => {
                let error = match other {
                    Ok(reply) => unexpected(reply),
                    Err(error) => error,
                };
                for (index, _) in &commits {
                    outcomes[*index] = Err(error.for_item());
                }
            }
        }
        outcomes
    }

    /// Copies `bytes` into a granted `location`; `Ok(false)` when the grant ran out before
    /// or while writing (the pages may be another store's by then: abort, do not commit).
    fn write_granted(
        &self,
        location: Location,
        bytes: &[u8],
        valid_until: Instant,
    ) -> Result<bool, ClientError> {
        if Instant::now() >= valid_until {
            return Ok(false);
        }
        self.memory(location.pool).and_then(|memory| {
            memory
                .write_at(location.offset_bytes, bytes)
                .map_err(|source| ClientError::Pool {
                    pool: location.pool,
                    source,
                })
        })?;
        Ok(Instant::now() < valid_until)
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

    /// Leases the objects and returns zero-copy views into the mapped pools, one per item
    /// (`None` for a miss). Each view holds its lease until [`LoadedView::release`] or drop.
    pub async fn load(
        &self,
        objects: &[ObjectId],
        mode: AcquireMode,
    ) -> Result<Vec<Option<LoadedView>>, ClientError> {
        let sent = Instant::now();
        let outcomes = match self
            .call(ClientRequest::Acquire {
                objects: objects.to_vec(),
                mode,
            })
            .await?
        {
            ClientReply::Acquired(outcomes) => outcomes,
            other => return Err(unexpected(other)),
        };
        let mut views = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            views.push(match outcome {
                AcquireOutcome::Leased(lease) => Some(self.view(lease, sent)?),
                AcquireOutcome::Miss | AcquireOutcome::Withheld => None,
            });
        }
        Ok(views)
    }

    /// Loads the objects into `buffers` (one per object, each at least the object's length)
    /// and gives the leases back; returns which were hits (a copy that outlived its lease
    /// is a miss). The leases are released in the
    /// background in batches (inline when that queue is full): the copies are done, so
    /// nothing waits on the release.
    pub async fn load_into(
        &self,
        objects: &[ObjectId],
        buffers: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, ClientError> {
        let views = self.load(objects, AcquireMode::Each).await?;
        let mut hits = Vec::with_capacity(views.len());
        let mut leases = Vec::new();
        for (view, buffer) in views.into_iter().zip(buffers.iter_mut()) {
            let Some(view) = view else {
                hits.push(false);
                continue;
            };
            // A copy that finished after the lease's deadline may have read reused pages:
            // it counts as a miss.
            let copied = match view.bytes() {
                Ok(bytes) if buffer.len() >= bytes.len() => {
                    buffer[..bytes.len()].copy_from_slice(bytes);
                    view.is_valid()
                }
                _ => false,
            };
            hits.push(copied);
            let lease = view.into_lease();
            if self.dropped_leases.try_send(lease).is_err() {
                leases.push(lease);
            }
        }
        self.release(&leases).await?;
        Ok(hits)
    }

    /// Starts retiring `replica` of `object`, a replica this client's node wrote (its id
    /// comes from a lease): new loads miss it at once; its pages are reused only after the
    /// last reader released it. The object must be of a namespace this client registered.
    pub async fn retire(
        &self,
        object: ObjectId,
        replica: ReplicaId,
    ) -> Result<RetireOutcome, ClientError> {
        match self.call(ClientRequest::Retire { object, replica }).await? {
            ClientReply::Retired(outcome) => Ok(outcome),
            other => Err(unexpected(other)),
        }
    }

    /// Releases leases explicitly (views released this way are not released again on drop).
    pub async fn release(&self, leases: &[LeaseId]) -> Result<(), ClientError> {
        if leases.is_empty() {
            return Ok(());
        }
        match self
            .call(ClientRequest::Release {
                leases: leases.to_vec(),
            })
            .await?
        {
            ClientReply::Released(_) => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn memory(&self, pool: PoolId) -> Result<&SharedMemory, ClientError> {
        self.pools.get(&pool).ok_or_else(|| {
            ClientError::Unexpected(format!(
                "the node named pool {pool}, which this client has not mapped"
            ))
        })
    }

    fn view(&self, lease: Lease, sent: Instant) -> Result<LoadedView, ClientError> {
        let memory = self.memory(lease.location.pool)?;
        // Validate the range now; the view re-borrows it from the shared pool map.
        memory
            .slice(lease.location.offset_bytes, lease.location.length_bytes)
            .map_err(|source| ClientError::Pool {
                pool: lease.location.pool,
                source,
            })?;
        // The directory started the lease after this client sent the acquire, so this local
        // deadline is never later than the directory's; the margin covers clock-rate drift.
        let duration = Duration::from_millis(lease.duration_ms);
        let valid_until = sent + duration.saturating_sub(duration / LEASE_MARGIN_DIVISOR);
        Ok(LoadedView {
            pools: self.pools.clone(),
            valid_until,
            lease,
            dropped_leases: Some(self.dropped_leases.clone()),
        })
    }
}

/// What a store's grant asks of the client: a copy to make, or nothing more (the store's
/// outcome is known).
enum Granted {
    Write {
        ticket: u64,
        location: Location,
        valid_until: Instant,
    },
    Done(Result<StoreOutcome, ClientError>),
}

/// Reads a grant (or its refusal) the node sent in answer to a request sent at `sent`.
fn granted(sent: Instant, grant: Result<StoreGrant, ProtocolError>) -> Granted {
    match grant {
        Ok(StoreGrant::Write {
            ticket,
            location,
            valid_ms,
        }) => Granted::Write {
            ticket,
            location,
            valid_until: grant_deadline(sent, valid_ms),
        },
        Ok(StoreGrant::AlreadyPresent) => Granted::Done(Ok(StoreOutcome::AlreadyPresent)),
        Ok(StoreGrant::Pending) => Granted::Done(Ok(StoreOutcome::Pending)),
        Ok(StoreGrant::Skip) => Granted::Done(Ok(StoreOutcome::Skipped)),
        Err(refused) => Granted::Done(Err(ClientError::Refused(refused))),
    }
}

/// The store's outcome for how its commit ended.
fn outcome(committed: StoreCommitted) -> Result<StoreOutcome, ClientError> {
    match committed {
        StoreCommitted::Stored(CommitOutcome::Committed) => Ok(StoreOutcome::Stored),
        StoreCommitted::Stored(CommitOutcome::AlreadyPresent) => Ok(StoreOutcome::AlreadyPresent),
        StoreCommitted::NotStored => Ok(StoreOutcome::Skipped),
        StoreCommitted::Refused(refused) => Err(ClientError::Refused(refused)),
    }
}

/// A leased, zero-copy view of one cached object in a mapped pool. The bytes stay valid
/// and unchanged while the lease lives: until release, drop, or the lease deadline, after
/// which [`LoadedView::bytes`] refuses (the pages may hold another object by then).
pub struct LoadedView {
    pools: Arc<HashMap<PoolId, SharedMemory>>,
    valid_until: Instant,
    lease: Lease,
    dropped_leases: Option<mpsc::Sender<LeaseId>>,
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
            let _ = queue.try_send(self.lease.lease);
        }
    }
}

/// Releases leases of dropped views in batches.
async fn release_dropped(
    rpc: RpcClient<ClientRequest, ClientReply>,
    mut queue: mpsc::Receiver<LeaseId>,
) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, 256).await > 0 {
        let _ = rpc
            .call(ClientRequest::Release {
                leases: std::mem::take(&mut batch),
            })
            .await;
    }
}

/// The local deadline of a grant valid for `valid_ms` from the request sent at `sent`:
/// measured from before the request, so never later than the node's deadline.
fn grant_deadline(sent: Instant, valid_ms: u64) -> Instant {
    let valid = Duration::from_millis(valid_ms);
    sent + valid.saturating_sub(valid / LEASE_MARGIN_DIVISOR)
}

/// `error` as the outcome of each of `items` items of a batch that failed whole.
fn every_item(items: usize, error: &ClientError) -> Vec<Result<StoreOutcome, ClientError>> {
    (0..items).map(|_| Err(error.for_item())).collect()
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
