use super::*;
use crate::model::demo_namespace;
use crate::model::{NamespaceId, PrefixDigest, ReplicaId};
use crate::node::tenants::ModelAccess;
use std::time::Duration;

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

/// A greeted client's core whose node holds a delegation on the first of two objects of a
/// registered namespace: `(core, client, delegated, other)`.
fn delegated_on_one() -> (NodeCore, ClientId, ObjectId, ObjectId) {
    use crate::directory::Delegation;
    use crate::model::{AllocationId, Generation, Location, Medium, PoolId};
    let (mut core, client) = greeted();
    dispatch_namespace(&mut core, client, NamespaceId([3; 16]));
    let (held, other) = (
        object(3),
        ObjectId {
            part: 1,
            ..object(3)
        },
    );
    let lease = Lease {
        lease: LeaseId(5),
        duration_ms: 30_000,
        replica: ReplicaId(1),
        medium: Medium::Cpu,
        location: Location {
            pool: PoolId(0),
            allocation: AllocationId(1),
            generation: Generation(1),
            offset_bytes: 0,
            length_bytes: 4096,
        },
        deadline: NOW + Duration::from_secs(30),
    };
    let delegation = Delegation {
        lease: LeaseId(77),
        duration_ms: 60_000,
    };
    core.delegations.granted(NOW, held, &lease, delegation);
    (core, client, held, other)
}

#[test]
fn a_probe_partly_delegated_asks_the_directory_only_the_rest() {
    let (mut core, client, held, other) = delegated_on_one();
    let tenant = tenant(ModelAccess::Any);
    let probe = ClientRequest::Probe {
        objects: vec![other, held, other],
    };
    match handle(&mut core, NOW, caller(client, &tenant, false), 64, probe) {
        Decision::Work(Work::ProbeRest { objects, answered }, Slots::None) => {
            assert_eq!(objects, [other, other]);
            assert!(matches!(
                answered[..],
                [None, Some(ProbeOutcome::Hit { .. }), None]
            ));
            let merged = merge_answers(answered, vec![ProbeOutcome::Miss], ProbeOutcome::Miss);
            assert!(matches!(
                merged[..],
                [
                    ProbeOutcome::Miss,
                    ProbeOutcome::Hit { .. },
                    ProbeOutcome::Miss
                ]
            ));
        }
        other => panic!("{other:?}"),
    }
    // Nothing delegated: the whole probe goes, as before.
    let probe = ClientRequest::Probe {
        objects: vec![other],
    };
    let decision = handle(&mut core, NOW, caller(client, &tenant, false), 64, probe);
    assert!(
        matches!(&decision, Decision::Work(Work::Forward(DirectoryRequest::Probe { objects }), _) if objects == &[other]),
        "{decision:?}"
    );
}

#[test]
fn an_acquire_of_each_partly_delegated_leases_here_what_it_can_and_asks_the_rest() {
    let (mut core, client, held, other) = delegated_on_one();
    let tenant = tenant(ModelAccess::Any);
    let acquire = ClientRequest::Acquire {
        objects: vec![held, other],
        mode: AcquireMode::Each,
    };
    let (rest, answered, slots) =
        match handle(&mut core, NOW, caller(client, &tenant, false), 64, acquire) {
            Decision::Work(
                Work::Acquire {
                    objects,
                    mode: AcquireMode::Each,
                    answered,
                },
                slots,
            ) => (objects, answered, slots),
            other => panic!("{other:?}"),
        };
    assert_eq!(rest, [other]);
    assert_eq!(slots, Slots::Leases(1), "the local lease is booked already");
    let local = answered[0].expect("the delegated object is leased here");
    assert!(is_local(local.lease));
    assert!(answered[1].is_none());
    assert_eq!(core.delegations.local_leases(), 1);
    assert_eq!(
        core.client(client).map(|books| books.leases_held()),
        Some(1)
    );
    // The directory's lease of the rest joins it; both are the client's.
    let deadline = NOW + Duration::from_secs(1);
    let change = Change::Leases(vec![(LeaseId(9), deadline)]);
    assert_eq!(finish(&mut core, client, NOW, slots, change), None);
    assert_eq!(
        core.client(client).map(|books| books.leases_held()),
        Some(2)
    );
    let merged = merge_answers(
        answered
            .into_iter()
            .map(|lease| lease.map(AcquireOutcome::Leased))
            .collect(),
        vec![AcquireOutcome::Miss],
        AcquireOutcome::Miss,
    );
    assert!(matches!(
        merged[..],
        [AcquireOutcome::Leased(_), AcquireOutcome::Miss]
    ));
}

#[test]
fn a_manifest_partly_delegated_goes_whole_to_the_directory() {
    let (mut core, client, held, other) = delegated_on_one();
    let tenant = tenant(ModelAccess::Any);
    let acquire = ClientRequest::Acquire {
        objects: vec![held, other],
        mode: AcquireMode::Manifest,
    };
    match handle(&mut core, NOW, caller(client, &tenant, false), 64, acquire) {
        Decision::Work(
            Work::Acquire {
                objects, answered, ..
            },
            Slots::Leases(2),
        ) => {
            assert_eq!(objects, [held, other]);
            assert!(answered.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(core.delegations.local_leases(), 0);
}

#[test]
fn merged_answers_fill_the_gaps_in_order_and_a_short_reply_with_the_missing_value() {
    assert_eq!(merge_answers(Vec::new(), vec![1, 2], 0), [1, 2]);
    assert_eq!(
        merge_answers(vec![None, Some(7), None, None], vec![1, 2], 0),
        [1, 7, 2, 0]
    );
}
