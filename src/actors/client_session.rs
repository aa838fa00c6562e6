//! The `ClientSessionActor`: one per local engine connection on the node's Unix socket.
//! It turns the engine's store and load requests into directory operations and pool
//! allocations, and keeps the books of the grants and leases it handed out, so that a
//! client that disconnects gives them back.
//!
//! Each request's work runs as a detached task that always finishes: if the connection is
//! gone when it does, the task itself frees what it allocated and releases what it leased.
//! The actor only counts, checks bounds and applies the finished work to its books.

use super::directory::error_label;
use super::frames::{frame_stream, incoming, spawn_writer, Incoming};
use super::link::{DirectoryLink, LinkError};
use super::pool::{AddExtent, Allocate, Free, PoolActor};
use super::session::INFLIGHT_REQUESTS_MAX;
use crate::backends::PoolError;
use crate::directory::{
    AcquireOutcome, CommitOutcome, ReleaseOutcome, ReserveItem, ReserveOutcome,
};
use crate::metrics::{Metrics, Operation};
use crate::model::{LeaseId, Location, PoolId, ReplicaId};
use crate::wire::messages::{
    ClientReply, ClientRequest, DirectoryReply, DirectoryRequest, Hello, NodeDescription,
    PoolMapping, ProtocolError, StoreGrant, SUPPORTED_VERSIONS,
};
use crate::wire::{RawFrame, WireError};
use actix::prelude::*;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::mpsc;

/// Stores one client may have granted and not yet committed (in flight included).
pub const TICKETS_MAX: usize = 1024;
/// Leases one client may hold through this node (in flight included).
pub const CLIENT_LEASES_MAX: usize = 65536;
/// A grant not committed within this long is taken back (the directory's reservation
/// expires at about the same time).
pub const TICKET_DURATION: Duration = Duration::from_secs(30);
/// How often expired leases and grants are dropped from the books.
const PRUNE_INTERVAL: Duration = Duration::from_secs(1);

/// What the node shares with every client session.
#[derive(Clone)]
pub struct NodeServices {
    pub link: Arc<DirectoryLink>,
    pub pools: HashMap<PoolId, Addr<PoolActor>>,
    pub mappings: Vec<PoolMapping>,
    pub metrics: Arc<Metrics>,
    /// The shared (CXL) pools among `pools`, whose pages come in extents, each with the
    /// lock that serializes this node's extent requests for it.
    pub shared_pools: HashMap<PoolId, Arc<tokio::sync::Mutex<()>>>,
}

/// A granted, unwritten store.
#[derive(Clone, Copy, Debug)]
struct Ticket {
    replica: ReplicaId,
    location: Location,
}

/// How a finished request changes the session's books.
enum Change {
    None,
    Ticket(u64, Ticket),
    /// Leases granted, valid on this node's clock until the given instant.
    Leases(Vec<(LeaseId, Instant)>),
}

/// What a finished request needs from the books: the slots it reserved at dispatch.
#[derive(Clone, Copy)]
enum Slots {
    None,
    Ticket,
    Leases(usize),
}

/// The result of a detached request, sent back to the actor.
struct Finished {
    request_id: u64,
    reply: ClientReply,
    change: Change,
    slots: Slots,
    operation: Option<Operation>,
    started: Instant,
}

impl Message for Finished {
    type Result = ();
}

type Work = Pin<Box<dyn Future<Output = (ClientReply, Change)>>>;

/// One engine connection. See the module documentation.
pub struct ClientSessionActor {
    services: NodeServices,
    replies: mpsc::Sender<(u64, ClientReply)>,
    reader: Option<OwnedReadHalf>,
    greeted: bool,
    inflight: usize,
    tickets: HashMap<u64, (Ticket, Instant)>,
    pending_tickets: usize,
    next_ticket: u64,
    leases: HashMap<LeaseId, Instant>,
    pending_leases: usize,
    /// Pages of grants that expired uncommitted, freed when the connection ends.
    expired_pages: Vec<Location>,
}

impl ClientSessionActor {
    /// A session over an accepted Unix socket connection.
    pub fn new(services: NodeServices, stream: tokio::net::UnixStream) -> ClientSessionActor {
        let (reader, writer) = stream.into_split();
        ClientSessionActor {
            services,
            replies: spawn_writer(writer, |error| {
                ClientReply::Error(ProtocolError::Node(error))
            }),
            reader: Some(reader),
            greeted: false,
            inflight: 0,
            tickets: HashMap::new(),
            pending_tickets: 0,
            next_ticket: 1,
            leases: HashMap::new(),
            pending_leases: 0,
            expired_pages: Vec::new(),
        }
    }

    fn reply(&self, request_id: u64, reply: ClientReply, context: &mut Context<Self>) {
        if self.replies.try_send((request_id, reply)).is_err() {
            context.stop();
        }
    }

    /// Drops expired leases and takes back expired grants (freeing their pages).
    fn prune(&mut self) {
        let now = Instant::now();
        self.leases.retain(|_, valid_until| *valid_until > now);
        let expired: Vec<u64> = self
            .tickets
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(ticket, _)| *ticket)
            .collect();
        for ticket in expired {
            if let Some((granted, _)) = self.tickets.remove(&ticket) {
                // The reservation goes back now; the pages only when the connection ends,
                // since a stalled client might still be writing into them.
                self.expired_pages.push(granted.location);
                let services = self.services.clone();
                actix_rt::spawn(async move { services.link.abort(granted.replica).await });
            }
        }
    }

    /// Tickets live, being granted, and expired with their pages still held.
    fn tickets_held(&self) -> usize {
        self.tickets.len() + self.pending_tickets + self.expired_pages.len()
    }

    fn dispatch(&mut self, request_id: u64, request: ClientRequest, context: &mut Context<Self>) {
        if self.inflight >= INFLIGHT_REQUESTS_MAX {
            return self.reply(request_id, ClientReply::Error(ProtocolError::Busy), context);
        }
        let operation = operation_label(&request);
        let started = Instant::now();
        let services = self.services.clone();
        let (work, slots): (Work, Slots) = match request {
            ClientRequest::Hello(_) => {
                let error = ProtocolError::Sequence("hello sent twice".into());
                return self.reply(request_id, ClientReply::Error(error), context);
            }
            ClientRequest::Describe => {
                let description = NodeDescription {
                    node: services.link.node,
                    epoch: services.link.epoch,
                    pools: services.mappings.clone(),
                };
                return self.reply(request_id, ClientReply::Described(description), context);
            }
            ClientRequest::RegisterNamespace(descriptor) => (
                Box::pin(async move {
                    let reply = match services
                        .link
                        .call(DirectoryRequest::RegisterNamespace(descriptor))
                        .await
                    {
                        Ok(DirectoryReply::Namespace(id)) => ClientReply::Namespace(id),
                        other => ClientReply::Error(refusal(other)),
                    };
                    (reply, Change::None)
                }),
                Slots::None,
            ),
            ClientRequest::BeginStore {
                object,
                length_bytes,
            } => {
                if self.tickets_held() >= TICKETS_MAX {
                    self.prune();
                    if self.tickets_held() >= TICKETS_MAX {
                        return self.reply(
                            request_id,
                            ClientReply::Error(ProtocolError::Busy),
                            context,
                        );
                    }
                }
                let ticket = self.next_ticket;
                self.next_ticket += 1;
                self.pending_tickets += 1;
                (
                    Box::pin(begin_store(
                        services,
                        ticket,
                        ReserveItem {
                            object,
                            length_bytes,
                        },
                    )),
                    Slots::Ticket,
                )
            }
            ClientRequest::CommitStore { ticket } => match self.tickets.remove(&ticket) {
                None => {
                    return self.reply(request_id, ClientReply::Error(unknown_ticket()), context)
                }
                Some((granted, _)) => (Box::pin(commit_store(services, granted)), Slots::None),
            },
            ClientRequest::AbortStore { ticket } => match self.tickets.remove(&ticket) {
                None => {
                    return self.reply(request_id, ClientReply::Error(unknown_ticket()), context)
                }
                Some((granted, _)) => (
                    Box::pin(async move {
                        give_back(&services, granted).await;
                        (ClientReply::Aborted, Change::None)
                    }),
                    Slots::None,
                ),
            },
            ClientRequest::Probe { objects } => (
                Box::pin(async move {
                    let reply = match services
                        .link
                        .call(DirectoryRequest::Probe { objects })
                        .await
                    {
                        Ok(DirectoryReply::Probed(outcomes)) => ClientReply::Probed(outcomes),
                        other => ClientReply::Error(refusal(other)),
                    };
                    (reply, Change::None)
                }),
                Slots::None,
            ),
            ClientRequest::Acquire { objects, mode } => {
                let wanted = objects.len();
                if self.leases.len() + self.pending_leases + wanted > CLIENT_LEASES_MAX {
                    self.prune();
                    if self.leases.len() + self.pending_leases + wanted > CLIENT_LEASES_MAX {
                        return self.reply(
                            request_id,
                            ClientReply::Error(ProtocolError::Busy),
                            context,
                        );
                    }
                }
                self.pending_leases += wanted;
                (
                    Box::pin(acquire(services, objects, mode)),
                    Slots::Leases(wanted),
                )
            }
            ClientRequest::Retire { replica } => (
                Box::pin(async move {
                    let reply = match services
                        .link
                        .call(DirectoryRequest::Retire { replica })
                        .await
                    {
                        Ok(DirectoryReply::Retired(outcome)) => ClientReply::Retired(outcome),
                        other => ClientReply::Error(refusal(other)),
                    };
                    (reply, Change::None)
                }),
                Slots::None,
            ),
            ClientRequest::Release { leases } => {
                // Only this client's own leases: another engine's are not its to end.
                let owned: Vec<bool> = leases
                    .iter()
                    .map(|lease| self.leases.remove(lease).is_some())
                    .collect();
                (Box::pin(release(services, leases, owned)), Slots::None)
            }
        };
        self.inflight += 1;
        let address = context.address();
        let services = self.services.clone();
        actix_rt::spawn(async move {
            let (reply, change) = work.await;
            let finished = Finished {
                request_id,
                reply,
                change,
                slots,
                operation,
                started,
            };
            if let Err(SendError::Full(finished) | SendError::Closed(finished)) =
                address.try_send(finished)
            {
                undo(&services, finished.change).await;
            }
        });
    }
}

impl Handler<Finished> for ClientSessionActor {
    type Result = ();

    fn handle(&mut self, finished: Finished, context: &mut Context<Self>) {
        self.inflight -= 1;
        match finished.slots {
            Slots::None => {}
            Slots::Ticket => self.pending_tickets -= 1,
            Slots::Leases(count) => self.pending_leases -= count,
        }
        match finished.change {
            Change::None => {}
            Change::Ticket(ticket, granted) => {
                self.tickets
                    .insert(ticket, (granted, Instant::now() + TICKET_DURATION));
            }
            Change::Leases(leases) => self.leases.extend(leases),
        }
        let error = match &finished.reply {
            ClientReply::Error(error) => Some(error_label(error)),
            _ => None,
        };
        if let Some(operation) = finished.operation {
            self.services
                .metrics
                .observe_request(operation, finished.started.elapsed(), error);
        }
        self.reply(finished.request_id, finished.reply, context);
    }
}

/// Gives back what a finished request obtained for a client that is gone.
async fn undo(services: &NodeServices, change: Change) {
    match change {
        Change::None => {}
        Change::Ticket(_, granted) => give_back(services, granted).await,
        Change::Leases(leases) => {
            let leases = leases.into_iter().map(|(lease, _)| lease).collect();
            let _ = services
                .link
                .call(DirectoryRequest::Release { leases })
                .await;
        }
    }
}

/// The metrics label of a client request (none for what the node answers itself).
fn operation_label(request: &ClientRequest) -> Option<Operation> {
    Some(match request {
        ClientRequest::Hello(_) | ClientRequest::Describe => return None,
        ClientRequest::RegisterNamespace(_) => Operation::Open,
        ClientRequest::BeginStore { .. } => Operation::Reserve,
        ClientRequest::CommitStore { .. } | ClientRequest::AbortStore { .. } => Operation::Commit,
        ClientRequest::Probe { .. } => Operation::Probe,
        ClientRequest::Acquire { .. } => Operation::Acquire,
        ClientRequest::Release { .. } => Operation::Release,
        ClientRequest::Retire { .. } => Operation::Retire,
    })
}

fn unknown_ticket() -> ProtocolError {
    ProtocolError::Sequence("unknown store ticket".into())
}

/// The protocol error a failed directory call becomes for the client.
fn refusal(result: Result<DirectoryReply, LinkError>) -> ProtocolError {
    match result {
        Err(LinkError::Refused(error)) => error,
        Err(error) => ProtocolError::Node(error.to_string()),
        Ok(reply) => ProtocolError::Node(format!("unexpected directory reply {reply:?}")),
    }
}

async fn free(services: &NodeServices, location: Location) {
    if let Some(pool) = services.pools.get(&location.pool) {
        let freed = pool
            .send(Free {
                allocation: location.allocation,
                generation: location.generation,
            })
            .await;
        if !matches!(freed, Ok(Ok(_))) {
            tracing::error!(?location, "could not free an allocation");
        }
    }
}

/// Frees an unwritten grant's pages and gives its reservation back to the directory.
async fn give_back(services: &NodeServices, granted: Ticket) {
    free(services, granted.location).await;
    services.link.abort(granted.replica).await;
}

async fn begin_store(
    services: NodeServices,
    ticket: u64,
    item: ReserveItem,
) -> (ClientReply, Change) {
    let grant = match services.link.reserve(item).await {
        Ok(grant) => grant,
        Err(error) => return (ClientReply::Error(refusal(Err(error))), Change::None),
    };
    let (replica, pool) = match grant {
        ReserveOutcome::Granted { replica, pool, .. } => (replica, pool),
        ReserveOutcome::AlreadyPresent => {
            return (ClientReply::Grant(StoreGrant::AlreadyPresent), Change::None)
        }
        ReserveOutcome::Pending => return (ClientReply::Grant(StoreGrant::Pending), Change::None),
        ReserveOutcome::Skip => return (ClientReply::Grant(StoreGrant::Skip), Change::None),
    };
    let allocated = match services.pools.get(&pool) {
        Some(actor) => allocate(&services, actor, pool, item.length_bytes).await,
        None => {
            services.link.abort(replica).await;
            return (
                ClientReply::Error(ProtocolError::Node(format!(
                    "pool {pool} is not mapped by this node"
                ))),
                Change::None,
            );
        }
    };
    match allocated {
        Ok(Ok(allocation)) => {
            let location = Location {
                pool,
                allocation: allocation.id,
                generation: allocation.generation,
                offset_bytes: allocation.offset,
                length_bytes: item.length_bytes,
            };
            (
                ClientReply::Grant(StoreGrant::Write {
                    ticket,
                    location,
                    valid_ms: TICKET_DURATION.as_millis() as u64,
                }),
                Change::Ticket(ticket, Ticket { replica, location }),
            )
        }
        // The pool's hard limit holds even when the directory's budget lags: skip the store
        // and give the reservation back.
        other => {
            tracing::debug!(
                ?other,
                "local pool refused an allocation the directory granted"
            );
            services.link.abort(replica).await;
            (ClientReply::Grant(StoreGrant::Skip), Change::None)
        }
    }
}

/// Allocates in a pool; in a shared pool whose granted extents are full, asks the
/// directory for another extent and retries. Extent requests of one pool are serialized,
/// so a burst of stores that finds the extents full asks for one extent, not one each.
pub(super) async fn allocate(
    services: &NodeServices,
    actor: &Addr<PoolActor>,
    pool: PoolId,
    length_bytes: u64,
) -> Result<Result<crate::backends::Allocation, PoolError>, MailboxError> {
    let first = actor.send(Allocate { length_bytes }).await?;
    let Some(extent_lock) = services.shared_pools.get(&pool) else {
        return Ok(first);
    };
    if !matches!(first, Err(PoolError::Full { .. })) {
        return Ok(first);
    }
    let _serialized = extent_lock.lock().await;
    let again = actor.send(Allocate { length_bytes }).await?;
    if !matches!(again, Err(PoolError::Full { .. })) {
        return Ok(again);
    }
    match services.link.grant_extent(pool).await {
        Ok(crate::directory::ExtentGrant::Granted(extent)) => {
            match actor
                .send(AddExtent {
                    offset_bytes: extent.offset_bytes,
                    length_bytes: extent.length_bytes,
                })
                .await?
            {
                Ok(()) => actor.send(Allocate { length_bytes }).await,
                Err(error) => {
                    // Never keep an extent this node cannot use: give it back.
                    let offset_bytes = extent.offset_bytes;
                    let _ = services
                        .link
                        .call(DirectoryRequest::ReturnExtent { pool, offset_bytes })
                        .await;
                    Ok(Err(error))
                }
            }
        }
        _ => Ok(again),
    }
}

async fn commit_store(services: NodeServices, granted: Ticket) -> (ClientReply, Change) {
    match services
        .link
        .commit(granted.replica, granted.location)
        .await
    {
        Ok(Some(CommitOutcome::Committed)) => {
            (ClientReply::Stored(CommitOutcome::Committed), Change::None)
        }
        Ok(Some(CommitOutcome::AlreadyPresent)) => {
            free(&services, granted.location).await;
            (
                ClientReply::Stored(CommitOutcome::AlreadyPresent),
                Change::None,
            )
        }
        Ok(None) => {
            free(&services, granted.location).await;
            (
                ClientReply::Error(ProtocolError::Node("the commit was not applied".into())),
                Change::None,
            )
        }
        Err(LinkError::Refused(error)) => {
            give_back(&services, granted).await;
            (ClientReply::Error(error), Change::None)
        }
        // Unknown outcome: the pages stay allocated, never reused on a guess.
        Err(error) => (
            ClientReply::Error(ProtocolError::Node(error.to_string())),
            Change::None,
        ),
    }
}

async fn acquire(
    services: NodeServices,
    objects: Vec<crate::model::ObjectId>,
    mode: crate::directory::AcquireMode,
) -> (ClientReply, Change) {
    let sent = Instant::now();
    match services
        .link
        .call(DirectoryRequest::Acquire { objects, mode })
        .await
    {
        Ok(DirectoryReply::Acquired(outcomes)) => {
            let leases = outcomes
                .iter()
                .filter_map(|outcome| match outcome {
                    AcquireOutcome::Leased(lease) => {
                        Some((lease.lease, sent + Duration::from_millis(lease.duration_ms)))
                    }
                    _ => None,
                })
                .collect();
            (ClientReply::Acquired(outcomes), Change::Leases(leases))
        }
        other => (ClientReply::Error(refusal(other)), Change::None),
    }
}

async fn release(
    services: NodeServices,
    leases: Vec<LeaseId>,
    owned: Vec<bool>,
) -> (ClientReply, Change) {
    let mine: Vec<LeaseId> = leases
        .iter()
        .zip(&owned)
        .filter(|(_, owned)| **owned)
        .map(|(lease, _)| *lease)
        .collect();
    let mut outcomes = match services
        .link
        .call(DirectoryRequest::Release { leases: mine })
        .await
    {
        Ok(DirectoryReply::Released(outcomes)) => outcomes.into_iter(),
        other => return (ClientReply::Error(refusal(other)), Change::None),
    };
    let merged = owned
        .iter()
        .map(|owned| {
            if *owned {
                outcomes.next().unwrap_or(ReleaseOutcome::Unknown)
            } else {
                ReleaseOutcome::Unknown
            }
        })
        .collect();
    (ClientReply::Released(merged), Change::None)
}

impl Actor for ClientSessionActor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        // Every request in flight may finish at once.
        context.set_mailbox_capacity(INFLIGHT_REQUESTS_MAX);
        context.run_interval(PRUNE_INTERVAL, |actor, _| actor.prune());
        if let Some(reader) = self.reader.take() {
            context.add_stream(frame_stream(reader));
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let services = self.services.clone();
        let tickets: Vec<Ticket> = self
            .tickets
            .drain()
            .map(|(_, (ticket, _))| ticket)
            .collect();
        let expired_pages = std::mem::take(&mut self.expired_pages);
        let leases: Vec<LeaseId> = self.leases.drain().map(|(lease, _)| lease).collect();
        actix_rt::spawn(async move {
            for ticket in tickets {
                give_back(&services, ticket).await;
            }
            for location in expired_pages {
                free(&services, location).await;
            }
            for chunk in leases.chunks(1024) {
                let _ = services
                    .link
                    .call(DirectoryRequest::Release {
                        leases: chunk.to_vec(),
                    })
                    .await;
            }
        });
    }
}

impl StreamHandler<Result<RawFrame, WireError>> for ClientSessionActor {
    fn handle(&mut self, frame: Result<RawFrame, WireError>, context: &mut Context<Self>) {
        let (request_id, request) = match incoming::<ClientRequest>(frame) {
            Incoming::Request(request_id, request) => (request_id, request),
            Incoming::Refuse(request_id, error) => {
                return self.reply(request_id, ClientReply::Error(error), context)
            }
            Incoming::Close(error) => {
                tracing::warn!(%error, "closing a client connection that broke the framing");
                return context.stop();
            }
        };
        match (self.greeted, request) {
            (false, ClientRequest::Hello(hello)) => match Hello::ours().negotiate(&hello) {
                Some(agreed) => {
                    self.greeted = true;
                    self.reply(request_id, ClientReply::Hello(agreed), context);
                }
                None => {
                    let error = ProtocolError::UnsupportedVersion {
                        supported: SUPPORTED_VERSIONS.to_vec(),
                    };
                    self.reply(request_id, ClientReply::Error(error), context);
                    context.stop();
                }
            },
            (false, _) => {
                let error = ProtocolError::Sequence("the first frame must be hello".into());
                self.reply(request_id, ClientReply::Error(error), context);
            }
            (true, request) => self.dispatch(request_id, request, context),
        }
    }

    fn finished(&mut self, context: &mut Context<Self>) {
        context.stop();
    }
}
