//! The `ClientSessionActor`: one per local engine connection on the node's Unix socket.
//! It turns the engine's store and load requests into directory operations and pool
//! allocations, and keeps the books of the grants and leases it handed out, so that a
//! client that disconnects gives them back. The client was admitted as a tenant from its
//! peer credentials: it registers only namespaces its tenant may use (salted with the
//! tenant's salt by the node), and touches only objects of namespaces it registered.
//!
//! Every decision is the node core's ([`crate::protocol::node`]): the actor reads the
//! clock, calls `handle`, and answers or runs the work it returns as a detached task that
//! always finishes: if the connection is gone when it does, what the work obtained is
//! given back. When the work ends, `finish` applies it to the books.

use super::link::LinkError;
use super::services::NodeServices;
use super::ssd_pins::SsdPins;
use super::store::{
    begin_store, begin_store_many, commit_store, commit_store_many, StorePlacement,
};
use crate::actors::frames::{
    frame_stream, incoming, spawn_writer, Incoming, INFLIGHT_REQUESTS_MAX,
};
use crate::directory::{AcquireOutcome, Lease, ProbeOutcome, ReleaseOutcome};
use crate::metrics::{Direction, Operation};
use crate::model::{LeaseId, ObjectId};
use crate::node::{ClientId, ClientRefusal, Reservation, Resolution, Tenant, Ticket};
use crate::protocol::messages::{
    ClientReply, ClientRequest, DirectoryReply, DirectoryRequest, NodeDescription, ProtocolError,
};
use crate::protocol::node::{
    self as dispatch, merge_answers, Caller, Change, Decision, Slots, Work,
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
/// How long an admitted connection has to say hello before it is closed: a client that
/// connects and says nothing does not hold one of the node's slots.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// The result of detached work, sent back to the actor.
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

type Running = Pin<Box<dyn Future<Output = (ClientReply, Change)>>>;

/// One engine connection. See the module documentation.
pub struct ClientSessionActor {
    services: NodeServices,
    /// This client's books in the node core.
    client: ClientId,
    /// What the client's peer credentials admitted it as.
    tenant: Arc<Tenant>,
    replies: mpsc::Sender<(u64, ClientReply)>,
    reader: Option<OwnedReadHalf>,
    inflight: usize,
    /// Whether this client may read the cluster's status: see [`may_administer`].
    operator: bool,
    /// Where objects' bytes are in the node's SSD files, handed to this client.
    ssd_pins: SsdPins,
    /// The pool this client's stores were last placed in, where its next batch's pages
    /// are granted before the directory answers.
    placement: Arc<StorePlacement>,
}

/// Whether the peer of `stream` may read the cluster's status: only a process of the node
/// process's own user (its effective uid, from the socket's peer credentials). Drain and
/// reload are never a node's to grant: they need an operator certificate at the directory.
pub fn may_administer(stream: &tokio::net::UnixStream) -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    stream.peer_cred().is_ok_and(|peer| peer.uid() == own)
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
        let operator = may_administer(&stream);
        let (reader, writer) = stream.into_split();
        ClientSessionActor {
            services,
            client,
            tenant,
            replies: spawn_writer(writer, |error| {
                ClientReply::Error(ProtocolError::Node(error))
            }),
            reader: Some(reader),
            inflight: 0,
            operator,
            ssd_pins: SsdPins::default(),
            placement: Arc::default(),
        }
    }

    fn reply(&self, request_id: u64, reply: ClientReply, context: &mut Context<Self>) {
        if self.replies.try_send((request_id, reply)).is_err() {
            context.stop();
        }
    }

    /// Aborts, at the directory, the reservations of grants the books took back, and frees
    /// the pages of expired grants whose time came.
    fn send_aborts(&self) {
        let (aborts, due) = self
            .services
            .core()
            .client(self.client)
            .map(|books| (books.take_aborts(), books.take_due_pages()))
            .unwrap_or_default();
        for reservation in aborts {
            let services = self.services.clone();
            actix_rt::spawn(async move { abort_reservation(&services, reservation).await });
        }
        if !due.is_empty() {
            let services = self.services.clone();
            actix_rt::spawn(async move {
                for location in due {
                    services.free(location).await;
                }
            });
        }
    }

    /// Drops expired leases and takes back expired grants.
    fn prune(&mut self) {
        let now = self.services.clock.now();
        if let Some(books) = self.services.core().client(self.client) {
            books.prune(now);
        }
        self.send_aborts();
        if let Some(ssd) = &self.services.ssd {
            self.ssd_pins.expire(ssd, now);
        }
    }

    /// Reads the clock, asks the core, and answers or runs what it decided.
    fn dispatch(&mut self, request_id: u64, request: ClientRequest, context: &mut Context<Self>) {
        if self.inflight >= INFLIGHT_REQUESTS_MAX {
            return self.reply(request_id, ClientReply::Error(ProtocolError::Busy), context);
        }
        let operation = operation_label(&request);
        let started = Instant::now();
        let caller = Caller {
            client: self.client,
            tenant: &self.tenant,
            operator: self.operator,
        };
        let now = self.services.clock.now();
        let batch_items_max = self.services.link.batch_items_max();
        let decision = dispatch::handle(
            &mut self.services.core(),
            now,
            caller,
            batch_items_max,
            request,
        );
        self.send_aborts();
        self.services.send_delegation_releases();
        let (running, slots) = match decision {
            Decision::Reply(reply) => {
                if let ClientReply::Acquired(outcomes) = &reply {
                    // Answered here, under the node's delegations.
                    count_lookups(&self.services, outcomes);
                }
                // Answered here without an error: observed as the directory's answers are.
                if let (Some(operation), false) =
                    (operation, matches!(reply, ClientReply::Error(_)))
                {
                    self.services
                        .metrics
                        .observe_request(operation, started.elapsed(), None);
                }
                return self.reply(request_id, reply, context);
            }
            Decision::ReplyAndClose(reply) => {
                self.reply(request_id, reply, context);
                return context.stop();
            }
            Decision::Describe => return self.reply(request_id, self.describe(), context),
            Decision::Work(work, slots) => match self.run(work) {
                Ok(running) => (running, slots),
                Err(reply) => return self.reply(request_id, reply, context),
            },
        };
        self.inflight += 1;
        let address = context.address();
        let services = self.services.clone();
        actix_rt::spawn(async move {
            let (reply, change) = running.await;
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

    /// The node's identity and the pools this client maps: those its handoff carried (its
    /// tenant's CPU partition and the CXL pools).
    fn describe(&self) -> ClientReply {
        let binding = self.services.link.binding();
        let pools = self
            .services
            .handoffs
            .of(self.tenant.group())
            .map(|handoff| handoff.mappings.clone())
            .unwrap_or_default();
        ClientReply::Described(NodeDescription {
            node: binding.node,
            epoch: binding.epoch,
            pools,
        })
    }

    /// The work the core decided, as a detached future; or the answer at once for what
    /// needs no round trip (the SSD pins of this connection).
    fn run(&mut self, work: Work) -> Result<Running, ClientReply> {
        let services = self.services.clone();
        Ok(match work {
            Work::RegisterNamespace(salted) => Box::pin(register_namespace(services, salted)),
            Work::BeginStore { admitted, valid } => {
                Box::pin(begin_store(services, self.client, admitted, valid))
            }
            Work::BeginStoreMany { admitted, valid } => {
                let placement = self.placement.clone();
                Box::pin(begin_store_many(
                    services,
                    self.client,
                    admitted,
                    valid,
                    placement,
                ))
            }
            Work::CommitStore(granted) => Box::pin(commit_store(services, granted)),
            Work::CommitStoreMany(granted) => Box::pin(commit_store_many(services, granted)),
            Work::AbortStore(granted) => Box::pin(async move {
                give_back(&services, granted).await;
                (ClientReply::Aborted, Change::None)
            }),
            Work::Acquire {
                objects,
                mode,
                answered,
            } => Box::pin(acquire(services, objects, mode, answered)),
            Work::ProbeRest { objects, answered } => {
                Box::pin(probe_rest(services, objects, answered))
            }
            Work::Release {
                leases,
                owned,
                released_here,
            } => Box::pin(release(services, leases, owned, released_here)),
            Work::Forward(request) => Box::pin(forward(services, request)),
            Work::Prefetch(objects) => Box::pin(async move {
                let started = super::ssd_restore::prefetch(&services, &objects).await;
                (ClientReply::Prefetching(started), Change::None)
            }),
            Work::PinOnSsd(objects) => return Err(self.pin_on_ssd(&objects)),
            Work::UnpinOnSsd(pins) => {
                let ended = match &self.services.ssd {
                    Some(ssd) => self.ssd_pins.unpin(ssd, &pins),
                    None => 0,
                };
                return Err(ClientReply::Unpinned(ended));
            }
        })
    }

    /// Pins where the objects' bytes are in the node's SSD files, for this client to read
    /// the files itself: answered at once (the store's index is in memory).
    fn pin_on_ssd(&mut self, objects: &[ObjectId]) -> ClientReply {
        let Some(ssd) = self.services.ssd.clone() else {
            return refused(ClientRefusal::NoSsd);
        };
        match self.ssd_pins.pin(&ssd, objects, self.services.clock.now()) {
            Ok(extents) => ClientReply::PinnedOnSsd(extents),
            Err(refusal) => refused(refusal),
        }
    }
}

impl Handler<Finished> for ClientSessionActor {
    type Result = ();

    fn handle(&mut self, finished: Finished, context: &mut Context<Self>) {
        self.inflight -= 1;
        let now = self.services.clock.now();
        let core = &mut self.services.core();
        let undone = dispatch::finish(core, self.client, now, finished.slots, finished.change);
        if let Some(change) = undone {
            // The client's books are gone: give back what the request obtained.
            let services = self.services.clone();
            actix_rt::spawn(async move { undo(&services, change).await });
        }
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
    ClientReply::Error(ProtocolError::Client(refusal))
}

/// Registers a (salted) namespace for the client; on success it joins the client's books,
/// and the node's holdings (a rejoin registers it again). While the directory is out of
/// reach or being rejoined, the node answers with the descriptor's own id and registers it
/// once the directory answers: the engine's lookups are misses meanwhile, not errors.
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
        Err(unavailable) if unavailable.is_unavailable() => match descriptor.id() {
            Ok(id) if services.core().holdings.namespace_pending(id, descriptor) => {
                (ClientReply::Namespace(id), Change::Namespace(id))
            }
            Ok(_) => (error(refusal(Err(unavailable))), Change::None),
            Err(invalid) => (
                error(ProtocolError::Directory(
                    crate::directory::DirectoryError::InvalidNamespace(invalid),
                )),
                Change::None,
            ),
        },
        other => (error(refusal(other)), Change::None),
    }
}

/// A probe or retire the node checked and passes to the directory, and the client reply
/// it becomes.
async fn forward(services: NodeServices, request: DirectoryRequest) -> (ClientReply, Change) {
    // The namespaces the request names, registered again if the directory forgot one.
    let locating = matches!(request, DirectoryRequest::Locate { .. });
    let (probed, mut namespaces) = match &request {
        DirectoryRequest::Probe { objects } => (
            objects.len(),
            objects.iter().map(|object| object.namespace).collect(),
        ),
        DirectoryRequest::Locate { objects } => {
            (0, objects.iter().map(|object| object.namespace).collect())
        }
        DirectoryRequest::Retire { object, .. } => (0, vec![object.namespace]),
        _ => (0, Vec::new()),
    };
    namespaces.dedup();
    let answer = services.link.call(request).await;
    if probed > 0 {
        let found = matches!(&answer, Ok(DirectoryReply::Probed(outcomes))
            if outcomes.iter().any(|outcome| *outcome != ProbeOutcome::Miss));
        services.core().delegations.count_directory_lookup(found);
    }
    if let Err(error) = &answer {
        services.reregister_if_unknown(error, namespaces);
    }
    let reply = match answer {
        Ok(DirectoryReply::Probed(outcomes)) => ClientReply::Probed(outcomes),
        Ok(DirectoryReply::Located(runs)) => ClientReply::Located(runs),
        // Out of reach or rejoining: no node is known to hold anything.
        Err(unavailable) if locating && unavailable.is_unavailable() => {
            ClientReply::Located(Vec::new())
        }
        Ok(DirectoryReply::Retired(outcome)) => ClientReply::Retired(outcome),
        // The directory is out of reach or being rejoined: every object is a miss.
        Err(unavailable) if probed > 0 && unavailable.is_unavailable() => {
            ClientReply::Probed(vec![ProbeOutcome::Miss; probed])
        }
        Ok(DirectoryReply::ClusterStatus(status)) => ClientReply::ClusterStatus(status),
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
        ClientRequest::Locate { .. } => Operation::Locate,
        ClientRequest::Acquire { .. } | ClientRequest::PinOnSsd { .. } => Operation::Acquire,
        ClientRequest::Release { .. } | ClientRequest::UnpinOnSsd { .. } => Operation::Release,
        ClientRequest::Retire { .. } => Operation::Retire,
        ClientRequest::ClusterStatus => Operation::Admin,
    })
}

/// The protocol error a failed directory call becomes for the client.
pub fn refusal(result: Result<DirectoryReply, LinkError>) -> ProtocolError {
    match result {
        Err(LinkError::Refused(error)) => error,
        Err(error) => ProtocolError::Node(error.to_string()),
        Ok(reply) => ProtocolError::Node(format!("unexpected directory reply {reply:?}")),
    }
}

/// Frees an unwritten grant's pages and gives its reservation back to the directory (once
/// its awaited reserve answered, if it has one).
pub async fn give_back(services: &NodeServices, granted: Ticket) {
    services.free(granted.location).await;
    abort_reservation(services, granted.reservation).await;
}

/// Gives a grant's reservation back to the directory, if the directory made one.
pub async fn abort_reservation(services: &NodeServices, reservation: Reservation) {
    if let Resolution::Made { session, replica } = services.resolve(reservation).await {
        services.link.abort(session, replica).await;
    }
}

async fn acquire(
    services: NodeServices,
    objects: Vec<crate::model::ObjectId>,
    mode: crate::directory::AcquireMode,
    answered: Vec<Option<Lease>>,
) -> (ClientReply, Change) {
    let sent = services.clock.now();
    let mark = services.core().delegations.session_mark();
    let wanted = objects.len();
    let request = DirectoryRequest::AcquireDelegating {
        objects: objects.clone(),
        mode,
    };
    let (outcomes, leases) = match services.link.call(request).await {
        Ok(DirectoryReply::AcquiredDelegating {
            outcomes,
            delegations,
        }) => {
            take_delegations(&services, (sent, mark), &objects, &outcomes, &delegations);
            let outcomes =
                super::ssd_restore::restore_misses(&services, &objects, mode, outcomes).await;
            services.core().delegations.count_directory_lookup(
                outcomes
                    .iter()
                    .any(|outcome| matches!(outcome, AcquireOutcome::Leased(_))),
            );
            let leases = outcomes
                .iter()
                .filter_map(|outcome| match outcome {
                    AcquireOutcome::Leased(lease) => {
                        Some((lease.lease, sent + Duration::from_millis(lease.duration_ms)))
                    }
                    _ => None,
                })
                .collect();
            (outcomes, leases)
        }
        // Out of reach, or (for a request some of whose objects were leased here, under
        // the node's delegations) refused: the rest are misses.
        other if other.as_ref().is_err_and(LinkError::is_unavailable) || !answered.is_empty() => {
            if let Err(error) = &other {
                services
                    .reregister_if_unknown(error, objects.iter().map(|object| object.namespace));
            }
            services.core().delegations.count_directory_lookup(false);
            (vec![AcquireOutcome::Miss; wanted], Vec::new())
        }
        other => return (ClientReply::Error(refusal(other)), Change::None),
    };
    let outcomes = merge_answers(
        answered
            .into_iter()
            .map(|lease| lease.map(AcquireOutcome::Leased))
            .collect(),
        outcomes,
        AcquireOutcome::Miss,
    );
    count_lookups(&services, &outcomes);
    (ClientReply::Acquired(outcomes), Change::Leases(leases))
}

/// The objects of a probe the node's delegations did not answer, asked of the directory;
/// the reply is every object's outcome in order (the rest are misses when the directory
/// is out of reach).
async fn probe_rest(
    services: NodeServices,
    objects: Vec<ObjectId>,
    answered: Vec<Option<ProbeOutcome>>,
) -> (ClientReply, Change) {
    let wanted = objects.len();
    match forward(services, DirectoryRequest::Probe { objects }).await {
        (ClientReply::Probed(outcomes), change) => {
            let outcomes = merge_answers(answered, outcomes, ProbeOutcome::Miss);
            (ClientReply::Probed(outcomes), change)
        }
        // Refused: the objects answered here still are.
        (_, change) => {
            let rest = vec![ProbeOutcome::Miss; wanted];
            let outcomes = merge_answers(answered, rest, ProbeOutcome::Miss);
            (ClientReply::Probed(outcomes), change)
        }
    }
}

/// Keeps the delegations an acquire brought (asked for at a time and in a session:
/// [`crate::node::delegations::Delegations::session_mark`]): later hits on their objects
/// are answered here.
fn take_delegations(
    services: &NodeServices,
    (asked, mark): (crate::model::Timestamp, u64),
    objects: &[ObjectId],
    outcomes: &[AcquireOutcome],
    delegations: &[Option<crate::directory::Delegation>],
) {
    let mut core = services.core();
    if core.delegations.session_mark() != mark {
        // Granted in a session that has ended since: they ended with it.
        return;
    }
    for ((object, outcome), delegation) in objects.iter().zip(outcomes).zip(delegations) {
        if let (AcquireOutcome::Leased(lease), Some(delegation)) = (outcome, delegation) {
            core.delegations.granted(asked, *object, lease, *delegation);
        }
    }
    drop(core);
    services.send_delegation_releases();
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
    released_here: Vec<bool>,
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
        .zip(&released_here)
        .map(|(owned, here)| match (owned, here) {
            (true, _) => outcomes.next().unwrap_or(ReleaseOutcome::Unknown),
            (false, true) => ReleaseOutcome::Released,
            (false, false) => ReleaseOutcome::Unknown,
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
        // A connection that never says hello does not keep its slot.
        context.run_later(HELLO_TIMEOUT, |actor, context| {
            let greeted = actor
                .services
                .core()
                .client(actor.client)
                .is_some_and(|books| books.greeted());
            if !greeted {
                tracing::info!(client = ?actor.client, "a client sent no hello in time; closing it");
                context.stop();
            }
        });
        if let Some(reader) = self.reader.take() {
            context.add_stream(frame_stream(reader));
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let Some(ssd) = &self.services.ssd {
            self.ssd_pins.end_all(ssd);
        }
        let services = self.services.clone();
        let cleanup = services
            .core()
            .disconnect_client(self.client, services.clock.now());
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
        self.dispatch(request_id, request, context);
    }

    fn finished(&mut self, context: &mut Context<Self>) {
        context.stop();
    }
}
