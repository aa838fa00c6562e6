use super::*;
use crate::model::demo_namespace;
use crate::model::{NamespaceId, PrefixDigest, ReplicaId};
use crate::node::tenants::ModelAccess;

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
    core.disconnect_client(client, NOW);
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
    let Decision::Work(_, slots) = handle(core, NOW, caller(client, &tenant, false), 64, request)
    else {
        panic!("register not admitted");
    };
    assert_eq!(
        finish(core, client, NOW, slots, Change::Namespace(namespace)),
        None
    );
}
