//! The `ClientSessionActor`: one per local engine connection on the node's Unix socket.
//! It turns the engine's store and load requests into directory operations and pool
//! allocations, and keeps the books of the grants and leases it handed out, so that a
//! client that disconnects gives them back. The client was admitted as a tenant from its
//! peer credentials: it registers only namespaces its tenant may use (salted with the
//! tenant's salt by the node), and touches only objects of namespaces it registered.
//!
//! Each request's work runs as a detached task that always finishes: if the connection is
//! gone when it does, the task itself frees what it allocated and releases what it leased.
//! The actor only counts, checks bounds and applies the finished work to its books.

use super::link::LinkError;
use super::services::NodeServices;
use super::ssd_pins::SsdPins;
use super::store::{
    begin_store, begin_store_many, commit_store, commit_store_many, unknown_ticket, AdmittedStore,
};
use crate::actors::frames::{
    frame_stream, incoming, spawn_writer, Incoming, INFLIGHT_REQUESTS_MAX,
};
use crate::directory::{AcquireOutcome, DirectoryError, ProbeOutcome, ReleaseOutcome, ReserveItem};
use crate::metrics::{Direction, Operation};
use crate::model::{LeaseId, NamespaceId, ObjectId, Timestamp};
use crate::node::{ClientId, ClientRefusal, Tenant, TenantRefusal, Ticket};
use crate::protocol::messages::{
    ClientReply, ClientRequest, DirectoryReply, DirectoryRequest, Hello, NodeDescription,
    ProtocolError, STORE_BATCH_ITEMS_MAX, SUPPORTED_VERSIONS,
};
use crate::wire::{RawFrame, WireError};
use actix::prelude::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::mpsc;

/// How often expired leases and grants are dropped from the books.
const PRUNE_INTERVAL: Duration = Duration::from_secs(1);

/// How a finished request changes the client's books.
pub enum Change {
    None,
    /// A store was granted (its ticket number and grant).
    Ticket(u64, Ticket),
    /// Stores of a batch were granted (their ticket numbers and grants).
    Tickets(Vec<(u64, Ticket)>),
    /// Leases granted, valid on this node's clock until the given instant.
    Leases(Vec<(LeaseId, Timestamp)>),
    /// A namespace registered for this client.
    Namespace(NamespaceId),
}

/// What a finished request needs from the books: the slots it reserved at dispatch.
enum Slots {
    None,
    /// The ticket number admitted.
    Ticket(u64),
    /// The ticket numbers a batch admitted.
    Tickets(Vec<u64>),
    Leases(usize),
    Namespace,
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
    /// This client's books in the node core.
    client: ClientId,
    /// What the client's peer credentials admitted it as.
    tenant: Arc<Tenant>,
    replies: mpsc::Sender<(u64, ClientReply)>,
    reader: Option<OwnedReadHalf>,
    greeted: bool,
    inflight: usize,
    /// Whether this client may make administrative requests (reload, drain): see
    /// [`may_administer`].
    admin: bool,
    /// Where objects' bytes are in the node's SSD files, handed to this client.
    ssd_pins: SsdPins,
}

/// Whether the peer of `stream` may make administrative requests: only a process of the
/// node process's own user (its effective uid, from the socket's peer credentials).
pub fn may_administer(stream: &tokio::net::UnixStream) -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    stream.peer_cred().is_ok_and(|peer| peer.uid() == own)
}

/// What admission made of a request: an answer now, or work to run detached.
enum Admitted {
    Reply(ClientReply),
    Work(Work, Slots),
}

impl ClientSessionActor {
    /// A session over an accepted Unix socket connection, whose books the node core
    /// admitted as `client`, of `tenant`.
    pub fn new(
        services: NodeServices,
        stream: tokio::net::UnixStream,
        client: ClientId,
        tenant: Arc<Tenant>,
    ) -> ClientSessionActor {
        let admin = may_administer(&stream);
        let (reader, writer) = stream.into_split();
        ClientSessionActor {
            services,
            client,
            tenant,
            replies: spawn_writer(writer, |error| {
                ClientReply::Error(ProtocolError::Node(error))
            }),
            reader: Some(reader),
            greeted: false,
            inflight: 0,
            admin,
            ssd_pins: SsdPins::default(),
        }
    }

    fn reply(&self, request_id: u64, reply: ClientReply, context: &mut Context<Self>) {
        if self.replies.try_send((request_id, reply)).is_err() {
            context.stop();
        }
    }

    /// Calls this client's books in the node core (`None` once the client was removed).
    fn books<T>(&self, call: impl FnOnce(&mut crate::node::ClientBooks) -> T) -> Option<T> {
        self.services.core().client(self.client).map(call)
    }

    /// Aborts, at the directory, the reservations of grants the books took back.
    fn send_aborts(&self) {
        let aborts = self.books(|books| books.take_aborts()).unwrap_or_default();
        for (session, replica) in aborts {
            let services = self.services.clone();
            actix_rt::spawn(async move { services.link.abort(session, replica).await });
        }
    }

    /// Drops expired leases and takes back expired grants.
    fn prune(&mut self) {
        let now = self.services.clock.now();
        self.books(|books| books.prune(now));
        self.send_aborts();
        if let Some(ssd) = &self.services.ssd {
            self.ssd_pins.expire(ssd, Instant::now());
        }
    }

    fn dispatch(&mut self, request_id: u64, request: ClientRequest, context: &mut Context<Self>) {
        if self.inflight >= INFLIGHT_REQUESTS_MAX {
            return self.reply(request_id, ClientReply::Error(ProtocolError::Busy), context);
        }
        let operation = operation_label(&request);
        let started = Instant::now();
        let admitted = self.admit(request);
        self.send_aborts();
        let (work, slots) = match admitted {
            Admitted::Reply(reply) => return self.reply(request_id, reply, context),
            Admitted::Work(work, slots) => (work, slots),
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

    /// Checks a request against the books and turns it into a reply or detached work.
    fn admit(&mut self, request: ClientRequest) -> Admitted {
        let services = self.services.clone();
        let now = services.clock.now();
        match request {
            ClientRequest::Hello(_) => {
                Admitted::Reply(error(ProtocolError::Sequence("hello sent twice".into())))
            }
            ClientRequest::Describe => {
                let binding = services.link.binding();
                Admitted::Reply(ClientReply::Described(NodeDescription {
                    node: binding.node,
                    epoch: binding.epoch,
                    pools: services.mappings.clone(),
                }))
            }
            ClientRequest::RegisterNamespace(descriptor) => {
                if !self.tenant.permits(&descriptor) {
                    return Admitted::Reply(error(ProtocolError::Tenant(
                        TenantRefusal::NamespaceDenied {
                            tenant: self.tenant.name.clone(),
                            model: descriptor.model,
                        },
                    )));
                }
                match self.books(|books| books.admit_namespace()) {
                    Some(Ok(())) => {
                        // The tenant's salt, never one the client sent.
                        let salted = self.tenant.salted(descriptor);
                        let work = register_namespace(services, salted);
                        Admitted::Work(Box::pin(work), Slots::Namespace)
                    }
                    Some(Err(refusal)) => Admitted::Reply(refused(refusal)),
                    None => Admitted::Reply(error(gone())),
                }
            }
            ClientRequest::BeginStore {
                object,
                length_bytes,
            } => match self.books(|books| {
                let admitted = books.admit_store(&object, length_bytes, now);
                (admitted, books.ticket_duration())
            }) {
                Some((Ok(ticket), valid)) => {
                    let item = ReserveItem {
                        object,
                        length_bytes,
                    };
                    let admitted = AdmittedStore { ticket, item };
                    let work = begin_store(services, self.client, admitted, valid);
                    Admitted::Work(Box::pin(work), Slots::Ticket(ticket))
                }
                Some((Err(refusal), _)) => Admitted::Reply(refused(refusal)),
                None => Admitted::Reply(error(gone())),
            },
            ClientRequest::CommitStore { ticket } => match self.take_ticket(ticket) {
                Some(granted) => {
                    Admitted::Work(Box::pin(commit_store(services, granted)), Slots::None)
                }
                None => Admitted::Reply(error(unknown_ticket())),
            },
            ClientRequest::AbortStore { ticket } => match self.take_ticket(ticket) {
                Some(granted) => Admitted::Work(
                    Box::pin(async move {
                        give_back(&services, granted).await;
                        (ClientReply::Aborted, Change::None)
                    }),
                    Slots::None,
                ),
                None => Admitted::Reply(error(unknown_ticket())),
            },
            ClientRequest::Acquire { objects, mode } => {
                let wanted = objects.len();
                match self.books(|books| books.admit_acquire(&objects, now)) {
                    Some(Ok(())) => Admitted::Work(
                        Box::pin(acquire(services, objects, mode)),
                        Slots::Leases(wanted),
                    ),
                    Some(Err(refusal)) => Admitted::Reply(refused(refusal)),
                    None => Admitted::Reply(error(gone())),
                }
            }
            ClientRequest::Probe { objects } => {
                match self.books(|books| books.check_objects(&objects)) {
                    Some(Ok(())) => {
                        let request = DirectoryRequest::Probe { objects };
                        Admitted::Work(Box::pin(forward(services, request)), Slots::None)
                    }
                    Some(Err(refusal)) => Admitted::Reply(refused(refusal)),
                    None => Admitted::Reply(error(gone())),
                }
            }
            ClientRequest::Retire { object, replica } => {
                match self.books(|books| books.check_objects(std::slice::from_ref(&object))) {
                    Some(Ok(())) => {
                        let request = DirectoryRequest::Retire { object, replica };
                        Admitted::Work(Box::pin(forward(services, request)), Slots::None)
                    }
                    Some(Err(refusal)) => Admitted::Reply(refused(refusal)),
                    None => Admitted::Reply(error(gone())),
                }
            }
            ClientRequest::Release { leases } => {
                // Only this client's own leases: another engine's are not its to end.
                let max = services.link.batch_items_max();
                match self.books(|books| books.release(&leases, max)) {
                    Some(Ok(owned)) => {
                        Admitted::Work(Box::pin(release(services, leases, owned)), Slots::None)
                    }
                    Some(Err(ClientRefusal::BatchTooLarge { items, max })) => {
                        Admitted::Reply(error(ProtocolError::Directory(
                            DirectoryError::BatchTooLarge { items, max },
                        )))
                    }
                    Some(Err(refusal)) => Admitted::Reply(refused(refusal)),
                    None => Admitted::Reply(error(gone())),
                }
            }
            ClientRequest::Reload | ClientRequest::Drain { .. } if !self.admin => {
                Admitted::Reply(error(ProtocolError::NotPermitted(
                    "reload and drain are for the node's own user".into(),
                )))
            }
            ClientRequest::ClusterStatus => {
                let request = DirectoryRequest::ClusterStatus;
                Admitted::Work(Box::pin(forward(services, request)), Slots::None)
            }
            ClientRequest::Reload => Admitted::Work(
                Box::pin(forward(services, DirectoryRequest::Reload)),
                Slots::None,
            ),
            ClientRequest::Drain { node } => {
                let request = DirectoryRequest::Drain { node };
                Admitted::Work(Box::pin(forward(services, request)), Slots::None)
            }
            ClientRequest::BeginStoreMany { items } => self.admit_store_many(items),
            ClientRequest::CommitStoreMany { tickets } => {
                if let Err(refused) = store_batch_bound(tickets.len()) {
                    return Admitted::Reply(refused);
                }
                let granted = tickets.iter().map(|ticket| self.take_ticket(*ticket));
                let work = commit_store_many(services, granted.collect());
                Admitted::Work(Box::pin(work), Slots::None)
            }
            ClientRequest::PinOnSsd { objects } => self.admit_pin_on_ssd(&objects),
            ClientRequest::UnpinOnSsd { pins } => {
                let ended = match &services.ssd {
                    Some(ssd) => self.ssd_pins.unpin(ssd, &pins),
                    None => 0,
                };
                Admitted::Reply(ClientReply::Unpinned(ended))
            }
            ClientRequest::Prefetch { objects } => {
                match self.books(|books| books.check_objects(&objects)) {
                    Some(Ok(())) => Admitted::Work(
                        Box::pin(async move {
                            let started = super::ssd_restore::prefetch(&services, &objects).await;
                            (ClientReply::Prefetching(started), Change::None)
                        }),
                        Slots::None,
                    ),
                    Some(Err(refusal)) => Admitted::Reply(refused(refusal)),
                    None => Admitted::Reply(error(gone())),
                }
            }
        }
    }

    /// Pins where the objects' bytes are in the node's SSD store, for this client to read
    /// the files itself: answered at once (the store's index is in memory).
    fn admit_pin_on_ssd(&mut self, objects: &[ObjectId]) -> Admitted {
        if let Err(refused) = store_batch_bound(objects.len()) {
            return Admitted::Reply(refused);
        }
        match self.books(|books| books.check_objects(objects)) {
            Some(Ok(())) => {}
            Some(Err(refusal)) => return Admitted::Reply(refused(refusal)),
            None => return Admitted::Reply(error(gone())),
        }
        let Some(ssd) = self.services.ssd.clone() else {
            return Admitted::Reply(refused(ClientRefusal::NoSsd));
        };
        match self.ssd_pins.pin(&ssd, objects, Instant::now()) {
            Ok(extents) => Admitted::Reply(ClientReply::PinnedOnSsd(extents)),
            Err(refusal) => Admitted::Reply(refused(refusal)),
        }
    }

    /// Admits each item of a `BeginStoreMany` as a `BeginStore`; the batch reserves in one
    /// round trip.
    fn admit_store_many(&self, items: Vec<ReserveItem>) -> Admitted {
        if let Err(refused) = store_batch_bound(items.len()) {
            return Admitted::Reply(refused);
        }
        let now = self.services.clock.now();
        let admitted = self.books(|books| {
            let admitted: Vec<_> = items
                .into_iter()
                .map(|item| {
                    let ticket = books.admit_store(&item.object, item.length_bytes, now)?;
                    Ok(AdmittedStore { ticket, item })
                })
                .collect();
            (admitted, books.ticket_duration())
        });
        let Some((admitted, valid)) = admitted else {
            return Admitted::Reply(error(gone()));
        };
        let tickets = admitted
            .iter()
            .filter_map(|entry| entry.as_ref().ok().map(|store| store.ticket))
            .collect();
        let work = begin_store_many(self.services.clone(), self.client, admitted, valid);
        Admitted::Work(Box::pin(work), Slots::Tickets(tickets))
    }

    fn take_ticket(&self, ticket: u64) -> Option<Ticket> {
        self.books(|books| books.take_ticket(ticket)).flatten()
    }
}

impl Handler<Finished> for ClientSessionActor {
    type Result = ();

    fn handle(&mut self, finished: Finished, context: &mut Context<Self>) {
        self.inflight -= 1;
        let now = self.services.clock.now();
        let mut core = self.services.core();
        match (core.client(self.client), finished.slots, finished.change) {
            (Some(books), Slots::Ticket(_), Change::Ticket(ticket, granted)) => {
                books.store_granted(ticket, granted, now)
            }
            (Some(books), Slots::Ticket(ticket), _) => books.store_ended(ticket),
            (Some(books), Slots::Tickets(admitted), change) => {
                if let Change::Tickets(granted) = change {
                    for (ticket, granted) in granted {
                        books.store_granted(ticket, granted, now);
                    }
                }
                // Those granted just left the pending set; this ends the others.
                for ticket in admitted {
                    books.store_ended(ticket);
                }
            }
            (Some(books), Slots::Leases(count), Change::Leases(leases)) => {
                books.leases_granted(count, leases)
            }
            (Some(books), Slots::Leases(count), _) => books.leases_granted(count, Vec::new()),
            (Some(books), Slots::Namespace, Change::Namespace(namespace)) => {
                books.namespace_registered(Some(namespace))
            }
            (Some(books), Slots::Namespace, _) => books.namespace_registered(None),
            (Some(_), Slots::None, _) => {}
            // The client's books are gone: give back what the request obtained.
            (None, _, change) => {
                let services = self.services.clone();
                actix_rt::spawn(async move { undo(&services, change).await });
            }
        }
        drop(core);
        let error = match &finished.reply {
            ClientReply::Error(error) => Some(error.label()),
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
        Change::None | Change::Namespace(_) => {}
        Change::Ticket(_, granted) => give_back(services, granted).await,
        Change::Tickets(granted) => {
            for (_, granted) in granted {
                give_back(services, granted).await;
            }
        }
        Change::Leases(leases) => {
            let leases = leases.into_iter().map(|(lease, _)| lease).collect();
            let _ = services
                .link
                .call(DirectoryRequest::Release { leases })
                .await;
        }
    }
}

fn error(error: ProtocolError) -> ClientReply {
    ClientReply::Error(error)
}

fn refused(refusal: ClientRefusal) -> ClientReply {
    tracing::debug!(
        ?refusal,
        "client request refused by its bounds or namespaces"
    );
    ClientReply::Error(ProtocolError::Client(refusal))
}

fn gone() -> ProtocolError {
    ProtocolError::Node("this client's books were removed".into())
}

/// Registers a (salted) namespace for the client; on success it joins the client's books,
/// and the node's holdings (a rejoin registers it again).
async fn register_namespace(
    services: NodeServices,
    descriptor: crate::model::NamespaceDescriptor,
) -> (ClientReply, Change) {
    let request = DirectoryRequest::RegisterNamespace(descriptor.clone());
    match services.link.call(request).await {
        Ok(DirectoryReply::Namespace(id)) => {
            services
                .core()
                .holdings
                .namespace_registered(id, descriptor);
            (ClientReply::Namespace(id), Change::Namespace(id))
        }
        other => (error(refusal(other)), Change::None),
    }
}

/// A probe or retire the node checked and passes to the directory, and the client reply
/// it becomes.
async fn forward(services: NodeServices, request: DirectoryRequest) -> (ClientReply, Change) {
    let probed = match &request {
        DirectoryRequest::Probe { objects } => objects.len(),
        _ => 0,
    };
    let reply = match services.link.call(request).await {
        Ok(DirectoryReply::Probed(outcomes)) => ClientReply::Probed(outcomes),
        Ok(DirectoryReply::Retired(outcome)) => ClientReply::Retired(outcome),
        // The directory is out of reach or being rejoined: every object is a miss.
        Err(unavailable) if probed > 0 && unavailable.is_unavailable() => {
            ClientReply::Probed(vec![ProbeOutcome::Miss; probed])
        }
        Ok(DirectoryReply::ClusterStatus(status)) => ClientReply::ClusterStatus(status),
        Ok(DirectoryReply::Reloaded(change)) => ClientReply::Reloaded(change),
        Ok(DirectoryReply::Draining(progress)) => ClientReply::Draining(progress),
        other => error(refusal(other)),
    };
    (reply, Change::None)
}

/// The metrics label of a client request (none for what the node answers itself).
fn operation_label(request: &ClientRequest) -> Option<Operation> {
    Some(match request {
        ClientRequest::Hello(_) | ClientRequest::Describe => return None,
        ClientRequest::RegisterNamespace(_) => Operation::Open,
        ClientRequest::BeginStore { .. } | ClientRequest::BeginStoreMany { .. } => {
            Operation::Reserve
        }
        ClientRequest::CommitStore { .. }
        | ClientRequest::CommitStoreMany { .. }
        | ClientRequest::AbortStore { .. } => Operation::Commit,
        ClientRequest::Probe { .. } | ClientRequest::Prefetch { .. } => Operation::Probe,
        ClientRequest::Acquire { .. } | ClientRequest::PinOnSsd { .. } => Operation::Acquire,
        ClientRequest::Release { .. } | ClientRequest::UnpinOnSsd { .. } => Operation::Release,
        ClientRequest::Retire { .. } => Operation::Retire,
        ClientRequest::ClusterStatus | ClientRequest::Reload | ClientRequest::Drain { .. } => {
            Operation::Admin
        }
    })
}

/// Refuses a store batch over [`STORE_BATCH_ITEMS_MAX`] items (the link splits one into
/// chunks of what one directory request may carry).
fn store_batch_bound(items: usize) -> Result<(), ClientReply> {
    let max = STORE_BATCH_ITEMS_MAX;
    if items > max {
        return Err(refused(ClientRefusal::BatchTooLarge { items, max }));
    }
    Ok(())
}

/// The protocol error a failed directory call becomes for the client.
pub fn refusal(result: Result<DirectoryReply, LinkError>) -> ProtocolError {
    match result {
        Err(LinkError::Refused(error)) => error,
        Err(error) => ProtocolError::Node(error.to_string()),
        Ok(reply) => ProtocolError::Node(format!("unexpected directory reply {reply:?}")),
    }
}

/// Frees an unwritten grant's pages and gives its reservation back to the directory.
pub async fn give_back(services: &NodeServices, granted: Ticket) {
    services.free(granted.location).await;
    services.link.abort(granted.session, granted.replica).await;
}

async fn acquire(
    services: NodeServices,
    objects: Vec<crate::model::ObjectId>,
    mode: crate::directory::AcquireMode,
) -> (ClientReply, Change) {
    let sent = services.clock.now();
    let wanted = objects.len();
    let request = DirectoryRequest::Acquire {
        objects: objects.clone(),
        mode,
    };
    match services.link.call(request).await {
        Ok(DirectoryReply::Acquired(outcomes)) => {
            let outcomes =
                super::ssd_restore::restore_misses(&services, &objects, mode, outcomes).await;
            count_lookups(&services, &outcomes);
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
        Err(unavailable) if unavailable.is_unavailable() => {
            services.metrics.add_lookups(0, wanted as u64);
            (
                ClientReply::Acquired(vec![AcquireOutcome::Miss; wanted]),
                Change::None,
            )
        }
        other => (ClientReply::Error(refusal(other)), Change::None),
    }
}

/// Counts an acquire's hits and misses, and the bytes its leases let the client load.
fn count_lookups(services: &NodeServices, outcomes: &[AcquireOutcome]) {
    let mut hits = 0;
    let mut loaded_bytes = 0;
    for outcome in outcomes {
        if let AcquireOutcome::Leased(lease) = outcome {
            hits += 1;
            loaded_bytes += lease.location.length_bytes;
        }
    }
    let misses = outcomes.len() as u64 - hits;
    services.metrics.add_lookups(hits, misses);
    services
        .metrics
        .add_bytes_moved(Direction::Load, loaded_bytes);
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
        // The session that granted them is gone, and the leases with it.
        Err(unavailable) if unavailable.is_unavailable() => Vec::new().into_iter(),
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
        if let Some(ssd) = &self.services.ssd {
            self.ssd_pins.end_all(ssd);
        }
        let services = self.services.clone();
        let cleanup = services.core().disconnect_client(self.client);
        actix_rt::spawn(async move {
            for ticket in cleanup.tickets {
                give_back(&services, ticket).await;
            }
            for location in cleanup.expired_pages {
                services.free(location).await;
            }
            for chunk in cleanup.leases.chunks(1024) {
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
