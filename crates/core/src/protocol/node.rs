//! The dispatch of one local client's request into the node core, as [`super::directory`]
//! is the directory's: the hello, the caller's rights (its tenant, whether it holds the
//! node's own user, who may read the cluster's status), the books' bounds and namespaces, then a decision the session
//! shell carries out: an answer now, or work for the shell to run (the directory round
//! trips and pool allocations), holding slots in the books until it ends. When the work
//! ends, [`finish`] applies its change to the books. Pure: the caller supplies `now` and
//! owns the core; the actor, the tests and the simulation call the same functions.

use super::messages::{
    ClientReply, ClientRequest, DirectoryRequest, Hello, ProtocolError, STORE_BATCH_ITEMS_MAX,
    SUPPORTED_VERSIONS,
};
use crate::directory::{
    AcquireMode, AcquireOutcome, DirectoryError, Lease, ProbeOutcome, ReleaseOutcome, ReserveItem,
};
use crate::model::{LeaseId, NamespaceDescriptor, NamespaceId, ObjectId, Timestamp};
use crate::node::delegations::is_local;
use crate::node::{ClientBooks, ClientId, ClientRefusal, NodeCore, Tenant, TenantRefusal, Ticket};
use std::time::Duration;

/// Who sent a request: the client's books, its tenant, and whether it is of the node's own
/// user (who may read the cluster's status).
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    pub client: ClientId,
    pub tenant: &'a Tenant,
    pub operator: bool,
}

/// One store the client's books admitted: its ticket number and what to reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmittedStore {
    pub ticket: u64,
    pub item: ReserveItem,
}

/// What the shell does for an admitted request.
#[derive(Debug, PartialEq)]
pub enum Work {
    /// Register the namespace (salted with the caller's tenant's salt) at the directory.
    RegisterNamespace(NamespaceDescriptor),
    /// Reserve, allocate and grant one store; a grant lasts `valid`.
    BeginStore {
        admitted: AdmittedStore,
        valid: Duration,
    },
    /// The same for each item the books admitted (a refused item keeps its refusal).
    BeginStoreMany {
        admitted: Vec<Result<AdmittedStore, ClientRefusal>>,
        valid: Duration,
    },
    /// Commit a written grant.
    CommitStore(Ticket),
    /// Commit each written grant (`None` for a ticket the client does not hold).
    CommitStoreMany(Vec<Option<Ticket>>),
    /// Free an unwritten grant's pages and abort its reservation.
    AbortStore(Ticket),
    /// Acquire leases (restoring from SSD what only the SSD holds) on `objects`, the
    /// objects of the request not leased here: `answered` is empty when none was, else it
    /// has one entry per object of the request, the local lease of each leased here.
    Acquire {
        objects: Vec<ObjectId>,
        mode: AcquireMode,
        answered: Vec<Option<Lease>>,
    },
    /// Ask the directory about `objects`, the objects of a probe not answered here;
    /// `answered` has one entry per object of the probe, the outcome of each answered here.
    ProbeRest {
        objects: Vec<ObjectId>,
        answered: Vec<Option<ProbeOutcome>>,
    },
    /// Release at the directory the leases marked `true` in `owned` (the client's own);
    /// those marked in `released_here` were local leases, already released.
    Release {
        leases: Vec<LeaseId>,
        owned: Vec<bool>,
        released_here: Vec<bool>,
    },
    /// Pass a checked request to the directory (probe, retire, status, reload, drain).
    Forward(DirectoryRequest),
    /// Start restores of the objects only the SSD holds.
    Prefetch(Vec<ObjectId>),
    /// Pin where the objects' bytes are in the SSD files, for this client.
    PinOnSsd(Vec<ObjectId>),
    /// End pins this client holds.
    UnpinOnSsd(Vec<u64>),
}

/// What the books hold for a request in flight: released or filled by [`finish`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slots {
    None,
    /// The ticket number admitted.
    Ticket(u64),
    /// The ticket numbers a batch admitted.
    Tickets(Vec<u64>),
    /// Leases being acquired.
    Leases(usize),
    /// A namespace being registered.
    Namespace,
}

/// How finished work changes the client's books.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// The core's decision on one request.
#[derive(Debug, PartialEq)]
pub enum Decision {
    /// Answer now.
    Reply(ClientReply),
    /// Answer now, then close the connection.
    ReplyAndClose(ClientReply),
    /// Answer with the node's description (its identity and pools: the shell's to say).
    Describe,
    /// Run the work, holding the slots until [`finish`].
    Work(Work, Slots),
}

/// Decides one request of `caller` at `now`. `batch_items_max` is the directory's batch
/// bound. Every refusal is a typed [`ProtocolError`] in a [`Decision::Reply`]; nothing
/// here waits or fails otherwise.
pub fn handle(
    core: &mut NodeCore,
    now: Timestamp,
    caller: Caller<'_>,
    batch_items_max: usize,
    request: ClientRequest,
) -> Decision {
    let Some(books) = core.client(caller.client) else {
        return refuse(gone());
    };
    if let (true, ClientRequest::RegisterNamespace(descriptor)) = (books.greeted(), &request) {
        return register(core, caller, descriptor.clone());
    }
    if let ClientRequest::Acquire { objects, .. } = &request {
        if let Err(refusal) = core.admit_user_leases(caller.client, objects.len()) {
            return refused(refusal);
        }
    }
    let Some(books) = core.client(caller.client) else {
        return refuse(gone());
    };
    match (books.greeted(), request) {
        (false, ClientRequest::Hello(hello)) => greet(books, &hello),
        (false, _) => refuse(ProtocolError::Sequence(
            "the first frame must be hello".into(),
        )),
        (true, ClientRequest::Hello(_)) => {
            refuse(ProtocolError::Sequence("hello sent twice".into()))
        }
        (true, ClientRequest::Describe) => Decision::Describe,
        (true, request) => match local(core, caller.client, now, batch_items_max, request) {
            Ok(decision) => decision,
            Err(request) => match core.client(caller.client) {
                Some(books) => admit(books, now, caller, *request),
                None => refuse(gone()),
            },
        },
    }
}

/// A probe, acquire or release the node answers itself under its delegations
/// ([`crate::node::delegations`]): a probe or acquire only when every object is a local
/// hit, a release of local leases wholly, of others by sending them on. Anything else is
/// given back for [`admit`].
fn local(
    core: &mut NodeCore,
    client: ClientId,
    now: Timestamp,
    batch_items_max: usize,
    request: ClientRequest,
) -> Result<Decision, Box<ClientRequest>> {
    // A node that may have been fenced (or whose directory may have restarted) grants
    // nothing on its own: the directory's recovery window counts on it.
    let fresh = !core.liveness.may_be_fenced(now);
    let Some((books, delegations)) = core.client_with_delegations(client) else {
        return Ok(refuse(gone()));
    };
    match request {
        ClientRequest::Probe { objects } if fresh && books.check_objects(&objects).is_ok() => {
            Ok(probe_locally(delegations, now, objects))
        }
        ClientRequest::Acquire { objects, mode } if fresh && delegations.covers(now, &objects) => {
            acquire_locally(books, delegations, now, objects, mode)
        }
        // Items leased one by one: those delegated here are leased here, the rest asked.
        ClientRequest::Acquire {
            objects,
            mode: AcquireMode::Each,
        } if fresh && delegations.covers_any(now, &objects) => {
            Ok(acquire_partly(books, delegations, now, objects))
        }
        ClientRequest::Release { leases } => Ok(release_locally(
            books,
            delegations,
            now,
            batch_items_max,
            leases,
        )),
        ClientRequest::Retire { object, replica }
            if books.check_objects(std::slice::from_ref(&object)).is_ok() =>
        {
            // The delegation this node holds on it goes first, in the same message, so the
            // retire does not wait for a recall of it.
            delegations.give_up(now, &object);
            let released = delegations.take_releases();
            let retire = DirectoryRequest::Retire {
                object,
                replica,
                released,
            };
            Ok(work(Work::Forward(retire), Slots::None))
        }
        request => Err(Box::new(request)),
    }
}

/// An acquire every object of which is a local hit under the node's delegations: leased
/// here, or given back for [`admit`] when the delegations no longer cover it.
fn acquire_locally(
    books: &mut ClientBooks,
    delegations: &mut crate::node::delegations::Delegations,
    now: Timestamp,
    objects: Vec<ObjectId>,
    mode: AcquireMode,
) -> Result<Decision, Box<ClientRequest>> {
    if let Err(refusal) = books.admit_acquire(&objects, now) {
        return Ok(refused(refusal));
    }
    let Some(leases) = delegations.acquire(now, &objects) else {
        // Covered a moment ago at the same instant: not reached. The admission
        // goes back and the directory answers.
        books.leases_granted(objects.len(), Vec::new());
        return Err(Box::new(ClientRequest::Acquire { objects, mode }));
    };
    let granted = leases.iter().map(|lease| (lease.lease, lease.deadline));
    books.leases_granted(objects.len(), granted.collect());
    let outcomes = leases.into_iter().map(AcquireOutcome::Leased).collect();
    Ok(Decision::Reply(ClientReply::Acquired(outcomes)))
}

/// A probe whose objects the delegations answer: at once when they answer every one, else
/// the rest goes to the directory (all of it when they answer none).
fn probe_locally(
    delegations: &crate::node::delegations::Delegations,
    now: Timestamp,
    objects: Vec<ObjectId>,
) -> Decision {
    let answered = delegations.probe_each(now, &objects);
    if answered.iter().all(Option::is_some) {
        return Decision::Reply(ClientReply::Probed(
            answered.into_iter().flatten().collect(),
        ));
    }
    let rest: Vec<ObjectId> = unanswered(&objects, &answered);
    if rest.len() == objects.len() {
        return work(
            Work::Forward(DirectoryRequest::Probe { objects }),
            Slots::None,
        );
    }
    work(
        Work::ProbeRest {
            objects: rest,
            answered,
        },
        Slots::None,
    )
}

/// An acquire of items leased one by one, some of them local hits: those leased here, the
/// rest asked of the directory; the whole acquire is admitted at once.
fn acquire_partly(
    books: &mut ClientBooks,
    delegations: &mut crate::node::delegations::Delegations,
    now: Timestamp,
    objects: Vec<ObjectId>,
) -> Decision {
    if let Err(refusal) = books.admit_acquire(&objects, now) {
        return refused(refusal);
    }
    let answered = delegations.acquire_each(now, &objects);
    let local: Vec<(LeaseId, Timestamp)> = answered
        .iter()
        .flatten()
        .map(|lease| (lease.lease, lease.deadline))
        .collect();
    books.leases_granted(local.len(), local);
    let rest = unanswered(&objects, &answered);
    let slots = Slots::Leases(rest.len());
    let acquire = Work::Acquire {
        objects: rest,
        mode: AcquireMode::Each,
        answered,
    };
    work(acquire, slots)
}

/// The objects whose entry in `answered` is `None`, in order.
fn unanswered<T>(objects: &[ObjectId], answered: &[Option<T>]) -> Vec<ObjectId> {
    objects
        .iter()
        .zip(answered)
        .filter(|(_, answer)| answer.is_none())
        .map(|(object, _)| *object)
        .collect()
}

/// `answered` (one entry per object of a request, empty when none was answered here)
/// with its gaps filled, in order, by `rest`, the outcomes of the objects not answered
/// here; a missing outcome (a short reply) becomes `missing`.
pub fn merge_answers<T>(answered: Vec<Option<T>>, rest: Vec<T>, missing: T) -> Vec<T>
where
    T: Clone,
{
    if answered.is_empty() {
        return rest;
    }
    let mut rest = rest.into_iter();
    answered
        .into_iter()
        .map(|answer| answer.unwrap_or_else(|| rest.next().unwrap_or_else(|| missing.clone())))
        .collect()
}

/// A release: local leases end here; the others go on to the directory.
fn release_locally(
    books: &mut ClientBooks,
    delegations: &mut crate::node::delegations::Delegations,
    now: Timestamp,
    batch_items_max: usize,
    leases: Vec<LeaseId>,
) -> Decision {
    let owned = match books.release(&leases, batch_items_max) {
        Ok(owned) => owned,
        Err(ClientRefusal::BatchTooLarge { items, max }) => {
            return refuse(ProtocolError::Directory(DirectoryError::BatchTooLarge {
                items,
                max,
            }))
        }
        Err(refusal) => return refused(refusal),
    };
    let released_here: Vec<bool> = leases
        .iter()
        .zip(&owned)
        .map(|(lease, owned)| *owned && delegations.release_local(now, *lease))
        .collect();
    let owned: Vec<bool> = owned
        .iter()
        .zip(&leases)
        .map(|(owned, lease)| *owned && !is_local(*lease))
        .collect();
    if !owned.contains(&true) {
        let outcomes = released_here
            .iter()
            .map(|here| match here {
                true => ReleaseOutcome::Released,
                false => ReleaseOutcome::Unknown,
            })
            .collect();
        return Decision::Reply(ClientReply::Released(outcomes));
    }
    let release = Work::Release {
        leases,
        owned,
        released_here,
    };
    work(release, Slots::None)
}

/// The hello: the protocol version both speak, or a refusal that closes the connection.
fn greet(books: &mut ClientBooks, hello: &Hello) -> Decision {
    match Hello::ours().negotiate(hello) {
        Some(agreed) => {
            books.set_greeted();
            Decision::Reply(ClientReply::Hello(agreed))
        }
        None => Decision::ReplyAndClose(ClientReply::Error(ProtocolError::UnsupportedVersion {
            supported: SUPPORTED_VERSIONS.to_vec(),
        })),
    }
}

/// A request after the hello: the caller's rights, then the books.
fn admit(
    books: &mut ClientBooks,
    now: Timestamp,
    caller: Caller<'_>,
    request: ClientRequest,
) -> Decision {
    use ClientRequest as Request;
    match request {
        Request::Hello(_) | Request::Describe => {
            refuse(ProtocolError::Sequence("out of sequence".into()))
        }
        Request::BeginStore {
            object,
            length_bytes,
        } => match books.admit_store(&object, length_bytes, now) {
            Ok(ticket) => {
                let item = ReserveItem {
                    object,
                    length_bytes,
                };
                let admitted = AdmittedStore { ticket, item };
                let valid = books.ticket_duration();
                work(Work::BeginStore { admitted, valid }, Slots::Ticket(ticket))
            }
            Err(refusal) => refused(refusal),
        },
        Request::BeginStoreMany { items } => begin_store_many(books, now, items),
        Request::CommitStore { ticket } => match books.take_ticket(ticket) {
            Some(granted) => work(Work::CommitStore(granted), Slots::None),
            None => refuse(unknown_ticket()),
        },
        Request::CommitStoreMany { tickets } => {
            if let Err(refusal) = store_batch_bound(tickets.len()) {
                return refused(refusal);
            }
            let granted = tickets.iter().map(|ticket| books.take_ticket(*ticket));
            work(Work::CommitStoreMany(granted.collect()), Slots::None)
        }
        Request::AbortStore { ticket } => match books.take_ticket(ticket) {
            Some(granted) => work(Work::AbortStore(granted), Slots::None),
            None => refuse(unknown_ticket()),
        },
        Request::Acquire { objects, mode } => match books.admit_acquire(&objects, now) {
            Ok(()) => {
                let slots = Slots::Leases(objects.len());
                let answered = Vec::new();
                work(
                    Work::Acquire {
                        objects,
                        mode,
                        answered,
                    },
                    slots,
                )
            }
            Err(refusal) => refused(refusal),
        },
        request => admit_other(books, caller, request),
    }
}

/// The requests that check objects or rights only: probes, retires, SSD pins and
/// prefetches, and the cluster's status.
fn admit_other(books: &mut ClientBooks, caller: Caller<'_>, request: ClientRequest) -> Decision {
    use ClientRequest as Request;
    let checked = |objects: &[ObjectId], work_of: Work| match books.check_objects(objects) {
        Ok(()) => work(work_of, Slots::None),
        Err(refusal) => refused(refusal),
    };
    match request {
        Request::Probe { objects } => {
            let probe = DirectoryRequest::Probe {
                objects: objects.clone(),
            };
            checked(&objects, Work::Forward(probe))
        }
        Request::Locate { objects } => {
            let locate = DirectoryRequest::Locate {
                objects: objects.clone(),
            };
            checked(&objects, Work::Forward(locate))
        }
        Request::Retire { object, replica } => {
            let retire = DirectoryRequest::Retire {
                object,
                replica,
                released: Vec::new(),
            };
            checked(std::slice::from_ref(&object), Work::Forward(retire))
        }
        Request::Prefetch { objects } => checked(&objects.clone(), Work::Prefetch(objects)),
        Request::PinOnSsd { objects } => match store_batch_bound(objects.len()) {
            Ok(()) => checked(&objects.clone(), Work::PinOnSsd(objects)),
            Err(refusal) => refused(refusal),
        },
        Request::UnpinOnSsd { pins } => work(Work::UnpinOnSsd(pins), Slots::None),
        Request::ClusterStatus if !caller.operator => refuse(ProtocolError::NotPermitted(
            "the cluster's status is for the node's own user".into(),
        )),
        Request::ClusterStatus => work(Work::Forward(DirectoryRequest::ClusterStatus), Slots::None),
        // The requests `admit` decides never reach here.
        other => refuse(ProtocolError::Sequence(format!(
            "{} is not decided here",
            request_name(&other)
        ))),
    }
}

/// A namespace the caller's tenant may use, salted with the tenant's salt (never one the
/// client sent), within the books' bound.
/// A namespace registration: the tenant may use the model and has room for one more
/// namespace on this node, and the client's books for one more.
fn register(core: &mut NodeCore, caller: Caller<'_>, descriptor: NamespaceDescriptor) -> Decision {
    let tenant = caller.tenant;
    if !tenant.permits(&descriptor) {
        return refuse(ProtocolError::Tenant(TenantRefusal::NamespaceDenied {
            tenant: tenant.name.clone(),
            model: descriptor.model,
        }));
    }
    let salted = tenant.salted(descriptor);
    // A descriptor without an id is the directory's to refuse (`InvalidNamespace`).
    let id = salted.id().ok();
    if let Some(id) = id {
        if let Err(refusal) = core.tenant_namespaces.admits(tenant, id) {
            return refuse(ProtocolError::Tenant(refusal));
        }
    }
    let Some(books) = core.client(caller.client) else {
        return refuse(gone());
    };
    if let Err(refusal) = books.admit_namespace() {
        return refused(refusal);
    }
    if let Some(id) = id {
        core.tenant_namespaces.record(tenant, id);
    }
    work(Work::RegisterNamespace(salted), Slots::Namespace)
}

/// Each item of a `BeginStoreMany` admitted as a `BeginStore`; the batch reserves in one
/// round trip.
fn begin_store_many(books: &mut ClientBooks, now: Timestamp, items: Vec<ReserveItem>) -> Decision {
    if let Err(refusal) = store_batch_bound(items.len()) {
        return refused(refusal);
    }
    let admitted: Vec<Result<AdmittedStore, ClientRefusal>> = items
        .into_iter()
        .map(|item| {
            let ticket = books.admit_store(&item.object, item.length_bytes, now)?;
            Ok(AdmittedStore { ticket, item })
        })
        .collect();
    let tickets = admitted
        .iter()
        .filter_map(|entry| entry.as_ref().ok().map(|store| store.ticket))
        .collect();
    let valid = books.ticket_duration();
    work(
        Work::BeginStoreMany { admitted, valid },
        Slots::Tickets(tickets),
    )
}

/// Applies finished work's `change` to the client's books at `now`, releasing the slots
/// it held. Returns the change to undo when the client's books are gone (what the work
/// obtained must be given back), else `None`.
pub fn finish(
    core: &mut NodeCore,
    client: ClientId,
    now: Timestamp,
    slots: Slots,
    change: Change,
) -> Option<Change> {
    let Some(books) = core.client(client) else {
        return Some(change);
    };
    match (slots, change) {
        (Slots::Ticket(_), Change::Ticket(ticket, granted)) => {
            books.store_granted(ticket, granted, now)
        }
        (Slots::Ticket(ticket), _) => books.store_ended(ticket),
        (Slots::Tickets(admitted), change) => {
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
        (Slots::Leases(count), Change::Leases(leases)) => books.leases_granted(count, leases),
        (Slots::Leases(count), _) => books.leases_granted(count, Vec::new()),
        (Slots::Namespace, Change::Namespace(namespace)) => {
            books.namespace_registered(Some(namespace))
        }
        (Slots::Namespace, _) => books.namespace_registered(None),
        (Slots::None, _) => {}
    }
    None
}

/// Refuses a store batch over [`STORE_BATCH_ITEMS_MAX`] items (the link splits one into
/// chunks of what one directory request may carry).
fn store_batch_bound(items: usize) -> Result<(), ClientRefusal> {
    let max = STORE_BATCH_ITEMS_MAX;
    if items > max {
        return Err(ClientRefusal::BatchTooLarge { items, max });
    }
    Ok(())
}

fn work(work: Work, slots: Slots) -> Decision {
    Decision::Work(work, slots)
}

fn refuse(error: ProtocolError) -> Decision {
    Decision::Reply(ClientReply::Error(error))
}

fn refused(refusal: ClientRefusal) -> Decision {
    tracing::debug!(
        ?refusal,
        "client request refused by its bounds or namespaces"
    );
    refuse(ProtocolError::Client(refusal))
}

/// The refusal of a request from a client whose books were removed.
pub fn gone() -> ProtocolError {
    ProtocolError::Node("this client's books were removed".into())
}

/// The refusal of a commit or abort of a ticket the client does not hold.
pub fn unknown_ticket() -> ProtocolError {
    ProtocolError::Sequence("unknown store ticket".into())
}

fn request_name(request: &ClientRequest) -> &'static str {
    match request {
        ClientRequest::Hello(_) => "hello",
        ClientRequest::Describe => "describe",
        _ => "this request",
    }
}

#[cfg(test)]
mod tests;
