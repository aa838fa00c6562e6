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
use crate::directory::{AcquireMode, DirectoryError, ReserveItem};
use crate::model::{LeaseId, NamespaceDescriptor, NamespaceId, ObjectId, Timestamp};
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
    /// Acquire leases (restoring from SSD what only the SSD holds).
    Acquire {
        objects: Vec<ObjectId>,
        mode: AcquireMode,
    },
    /// Release the leases marked `true` in `owned` (the client's own).
    Release {
        leases: Vec<LeaseId>,
        owned: Vec<bool>,
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
        (true, request) => admit(books, now, caller, batch_items_max, request),
    }
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
    batch_items_max: usize,
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
                work(Work::Acquire { objects, mode }, slots)
            }
            Err(refusal) => refused(refusal),
        },
        Request::Release { leases } => release(books, batch_items_max, leases),
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
        Request::Retire { object, replica } => {
            let retire = DirectoryRequest::Retire { object, replica };
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

/// Only the client's own leases are released on its behalf: another engine's are not its
/// to end.
fn release(books: &mut ClientBooks, batch_items_max: usize, leases: Vec<LeaseId>) -> Decision {
    match books.release(&leases, batch_items_max) {
        Ok(owned) => work(Work::Release { leases, owned }, Slots::None),
        Err(ClientRefusal::BatchTooLarge { items, max }) => {
            refuse(ProtocolError::Directory(DirectoryError::BatchTooLarge {
                items,
                max,
            }))
        }
        Err(refusal) => refused(refusal),
    }
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
mod tests {
    use super::*;
    use crate::model::{NamespaceId, PrefixDigest, ReplicaId};
    use crate::node::tenants::ModelAccess;
    use crate::workload::namespace::demo_namespace;

    const NOW: Timestamp = Timestamp::ZERO;

    fn tenant(models: ModelAccess) -> Tenant {
        Tenant {
            name: "a".into(),
            uids: vec![1000],
            gids: vec![],
            models,
            salt: Some("salt-a".into()),
        }
    }

    /// A core with one greeted client, and that client.
    fn greeted() -> (NodeCore, ClientId) {
        let mut core = NodeCore::default();
        let client = core.connect_client(0).unwrap();
        let tenant = tenant(ModelAccess::Any);
        let hello = ClientRequest::Hello(Hello::ours());
        let decision = handle(&mut core, NOW, caller(client, &tenant, false), 64, hello);
        assert!(matches!(decision, Decision::Reply(ClientReply::Hello(_))));
        (core, client)
    }

    fn caller(client: ClientId, tenant: &Tenant, operator: bool) -> Caller<'_> {
        Caller {
            client,
            tenant,
            operator,
        }
    }

    fn object(namespace: u8) -> ObjectId {
        ObjectId {
            namespace: NamespaceId([namespace; 16]),
            prefix: PrefixDigest::ROOT,
            shard: 0,
            part: 0,
        }
    }

    fn refusal(decision: &Decision) -> Option<&ProtocolError> {
        match decision {
            Decision::Reply(ClientReply::Error(error)) => Some(error),
            _ => None,
        }
    }

    #[test]
    fn nothing_but_a_hello_is_served_before_the_hello_and_no_second_one_after() {
        let mut core = NodeCore::default();
        let client = core.connect_client(0).unwrap();
        let tenant = tenant(ModelAccess::Any);
        let early = handle(
            &mut core,
            NOW,
            caller(client, &tenant, false),
            64,
            ClientRequest::Describe,
        );
        assert!(
            matches!(refusal(&early), Some(ProtocolError::Sequence(_))),
            "{early:?}"
        );
        let hello = ClientRequest::Hello(Hello::ours());
        let first = handle(
            &mut core,
            NOW,
            caller(client, &tenant, false),
            64,
            hello.clone(),
        );
        assert!(
            matches!(first, Decision::Reply(ClientReply::Hello(_))),
            "{first:?}"
        );
        let second = handle(&mut core, NOW, caller(client, &tenant, false), 64, hello);
        assert!(
            matches!(refusal(&second), Some(ProtocolError::Sequence(_))),
            "{second:?}"
        );
        let describe = handle(
            &mut core,
            NOW,
            caller(client, &tenant, false),
            64,
            ClientRequest::Describe,
        );
        assert_eq!(describe, Decision::Describe);
    }

    #[test]
    fn a_hello_of_no_common_version_is_refused_and_closes() {
        let mut core = NodeCore::default();
        let client = core.connect_client(0).unwrap();
        let tenant = tenant(ModelAccess::Any);
        let mut hello = Hello::ours();
        hello.versions = vec![u16::MAX];
        let decision = handle(
            &mut core,
            NOW,
            caller(client, &tenant, false),
            64,
            ClientRequest::Hello(hello),
        );
        assert!(matches!(
            decision,
            Decision::ReplyAndClose(ClientReply::Error(ProtocolError::UnsupportedVersion { .. }))
        ));
    }

    #[test]
    fn a_namespace_is_registered_salted_with_the_tenants_salt_and_only_if_permitted() {
        let (mut core, client) = greeted();
        let mut descriptor = demo_namespace();
        descriptor.salt = Some("the client's own".into());
        let allowed = tenant(ModelAccess::Any);
        let request = ClientRequest::RegisterNamespace(descriptor.clone());
        match handle(&mut core, NOW, caller(client, &allowed, false), 64, request) {
            Decision::Work(Work::RegisterNamespace(salted), Slots::Namespace) => {
                assert_eq!(salted.salt.as_deref(), Some("salt-a"));
            }
            other => panic!("{other:?}"),
        }
        let denied = tenant(ModelAccess::Models(vec!["another-model".into()]));
        let request = ClientRequest::RegisterNamespace(descriptor);
        let decision = handle(&mut core, NOW, caller(client, &denied, false), 64, request);
        assert!(
            matches!(refusal(&decision), Some(ProtocolError::Tenant(_))),
            "{decision:?}"
        );
    }

    /// A tenant varying its namespaces (a revision, a layer count) runs out at its own
    /// bound however many clients it connects; an id it holds stays registrable, and
    /// another tenant is untouched.
    #[test]
    fn a_tenants_namespaces_are_bounded_on_the_node_across_its_clients() {
        use crate::node::tenants::NAMESPACES_PER_TENANT_MAX;
        let mut core = NodeCore::default();
        let noisy = tenant(ModelAccess::Any);
        let register = |core: &mut NodeCore, tenant: &Tenant, revision: usize| {
            let client = core.connect_client(0).unwrap();
            core.client(client).unwrap().set_greeted();
            let descriptor = NamespaceDescriptor {
                revision: format!("r{revision}"),
                ..demo_namespace()
            };
            let request = ClientRequest::RegisterNamespace(descriptor);
            handle(core, NOW, caller(client, tenant, false), 64, request)
        };
        for revision in 0..NAMESPACES_PER_TENANT_MAX {
            let decision = register(&mut core, &noisy, revision);
            assert!(
                matches!(decision, Decision::Work(..)),
                "{revision}: {decision:?}"
            );
        }
        let over = register(&mut core, &noisy, NAMESPACES_PER_TENANT_MAX);
        assert!(
            matches!(
                refusal(&over),
                Some(ProtocolError::Tenant(
                    TenantRefusal::TooManyNamespaces { .. }
                ))
            ),
            "{over:?}"
        );
        assert!(matches!(register(&mut core, &noisy, 0), Decision::Work(..)));
        let quiet = Tenant {
            name: "quiet".into(),
            ..tenant(ModelAccess::Any)
        };
        assert!(matches!(
            register(&mut core, &quiet, 999),
            Decision::Work(..)
        ));
    }

    #[test]
    fn objects_of_namespaces_not_registered_here_are_refused() {
        let (mut core, client) = greeted();
        let tenant = tenant(ModelAccess::Any);
        let requests = [
            ClientRequest::Probe {
                objects: vec![object(9)],
            },
            ClientRequest::Acquire {
                objects: vec![object(9)],
                mode: AcquireMode::Each,
            },
            ClientRequest::BeginStore {
                object: object(9),
                length_bytes: 4096,
            },
            ClientRequest::Prefetch {
                objects: vec![object(9)],
            },
            ClientRequest::PinOnSsd {
                objects: vec![object(9)],
            },
            ClientRequest::Retire {
                object: object(9),
                replica: ReplicaId(1),
            },
        ];
        for request in requests {
            let decision = handle(
                &mut core,
                NOW,
                caller(client, &tenant, false),
                64,
                request.clone(),
            );
            assert!(
                matches!(
                    refusal(&decision),
                    Some(ProtocolError::Client(
                        ClientRefusal::NamespaceNotRegistered(_)
                    ))
                ),
                "{request:?}: {decision:?}"
            );
        }
    }

    #[test]
    fn the_cluster_status_is_the_nodes_own_users_only() {
        let (mut core, client) = greeted();
        let tenant = tenant(ModelAccess::Any);
        let request = ClientRequest::ClusterStatus;
        let engine = handle(
            &mut core,
            NOW,
            caller(client, &tenant, false),
            64,
            request.clone(),
        );
        assert!(
            matches!(refusal(&engine), Some(ProtocolError::NotPermitted(_))),
            "{engine:?}"
        );
        let operator = handle(&mut core, NOW, caller(client, &tenant, true), 64, request);
        assert!(
            matches!(operator, Decision::Work(Work::Forward(_), Slots::None)),
            "{operator:?}"
        );
    }

    #[test]
    fn batches_over_their_bounds_are_refused_whole() {
        let (mut core, client) = greeted();
        let tenant = tenant(ModelAccess::Any);
        let over = STORE_BATCH_ITEMS_MAX + 1;
        let tickets = ClientRequest::CommitStoreMany {
            tickets: vec![1; over],
        };
        let decision = handle(&mut core, NOW, caller(client, &tenant, false), 64, tickets);
        assert!(matches!(
            refusal(&decision),
            Some(ProtocolError::Client(ClientRefusal::BatchTooLarge { .. }))
        ));
        let leases = ClientRequest::Release {
            leases: vec![LeaseId(1); 65],
        };
        let decision = handle(&mut core, NOW, caller(client, &tenant, false), 64, leases);
        assert!(matches!(
            refusal(&decision),
            Some(ProtocolError::Directory(DirectoryError::BatchTooLarge {
                items: 65,
                max: 64
            }))
        ));
        let unknown = ClientRequest::CommitStore { ticket: 77 };
        let decision = handle(&mut core, NOW, caller(client, &tenant, false), 64, unknown);
        assert!(matches!(
            refusal(&decision),
            Some(ProtocolError::Sequence(_))
        ));
    }

    #[test]
    fn finished_work_fills_the_books_and_a_gone_client_gets_its_change_back() {
        let (mut core, client) = greeted();
        let namespace = NamespaceId([3; 16]);
        dispatch_namespace(&mut core, client, namespace);
        let tenant = tenant(ModelAccess::Any);
        let acquire = ClientRequest::Acquire {
            objects: vec![object(3), object(3)],
            mode: AcquireMode::Each,
        };
        let Decision::Work(_, slots) =
            handle(&mut core, NOW, caller(client, &tenant, false), 64, acquire)
        else {
            panic!("acquire not admitted");
        };
        assert_eq!(slots, Slots::Leases(2));
        let leases = Change::Leases(vec![(LeaseId(5), NOW + std::time::Duration::from_secs(1))]);
        assert_eq!(finish(&mut core, client, NOW, slots, leases), None);
        assert_eq!(
            core.client(client).map(|books| books.leases_held()),
            Some(1)
        );
        // The client's own lease is released; another's is not.
        let release = ClientRequest::Release {
            leases: vec![LeaseId(5), LeaseId(6)],
        };
        match handle(&mut core, NOW, caller(client, &tenant, false), 64, release) {
            Decision::Work(Work::Release { owned, .. }, Slots::None) => {
                assert_eq!(owned, [true, false])
            }
            other => panic!("{other:?}"),
        }
        core.disconnect_client(client);
        let granted = Change::Leases(vec![(LeaseId(7), NOW + std::time::Duration::from_secs(1))]);
        assert_eq!(
            finish(&mut core, client, NOW, Slots::Leases(1), granted.clone()),
            Some(granted)
        );
        let after = handle(
            &mut core,
            NOW,
            caller(client, &tenant, false),
            64,
            ClientRequest::Describe,
        );
        assert!(matches!(refusal(&after), Some(ProtocolError::Node(_))));
    }

    /// Registers `namespace` for `client` through the dispatch and its finish.
    fn dispatch_namespace(core: &mut NodeCore, client: ClientId, namespace: NamespaceId) {
        let tenant = tenant(ModelAccess::Any);
        let request = ClientRequest::RegisterNamespace(demo_namespace());
        let Decision::Work(_, slots) =
            handle(core, NOW, caller(client, &tenant, false), 64, request)
        else {
            panic!("register not admitted");
        };
        assert_eq!(
            finish(core, client, NOW, slots, Change::Namespace(namespace)),
            None
        );
    }
}
