//! Delegations: granted with an acquire to a node that maps the replica, or on offer to every
//! node that maps a new shared replica; held as a lease (retire and reclaim wait for it),
//! recalled before a retire or an eviction (which chooses delegated replicas like others),
//! handed out again until released, and ended with their deadline.

use super::tests::{Fixture, NodeHandle, MIB};
use super::*;
use crate::model::{DomainId, LeaseId, Medium, ObjectId, ReplicaId};
use std::time::Duration;

fn acquire_delegating(
    fixture: &mut Fixture,
    node: &NodeHandle,
    object: ObjectId,
) -> (Lease, Option<Delegation>) {
    let (outcomes, delegations) = fixture
        .directory
        .acquire_delegating(fixture.now, node.session, &[object], AcquireMode::Each)
        .unwrap();
    let AcquireOutcome::Leased(lease) = outcomes[0] else {
        panic!("expected a lease, got {:?}", outcomes[0]);
    };
    (lease, delegations[0])
}

fn object(index: u32) -> ObjectId {
    Fixture::new().object(index)
}

fn recalls(fixture: &mut Fixture, node: &NodeHandle) -> Vec<LeaseId> {
    fixture
        .polled(node)
        .into_iter()
        .filter_map(|kind| match kind {
            TaskKind::Recall { delegation, .. } => Some(delegation),
            _ => None,
        })
        .collect()
}

#[test]
fn a_delegation_holds_its_replica_until_recalled_and_released() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    let (replica, _) = fixture.store(&a, object, MIB);
    let (lease, delegation) = acquire_delegating(&mut fixture, &a, object);
    let delegation = delegation.expect("a node that maps the replica is delegated it");
    assert_eq!(
        Duration::from_millis(delegation.duration_ms),
        2 * fixture.directory.config().lease_duration
    );
    // A second acquire while the delegation is fresh brings no second one.
    let (second, none) = acquire_delegating(&mut fixture, &a, object);
    assert_eq!(none, None);
    fixture
        .directory
        .release(a.session, &[lease.lease, second.lease])
        .unwrap();
    assert_eq!(
        fixture.directory.retire(Some(a.session), replica),
        Ok(RetireOutcome::AwaitingReaders { leases: 0 }),
        "the delegation holds it, no engine does"
    );
    assert_eq!(recalls(&mut fixture, &a), vec![delegation.lease]);
    assert_eq!(fixture.directory.recalls_by_reason()[0].1, 1);
    // Not released: the recall is handed out again once its acknowledgement is overdue.
    let overdue = fixture.directory.config().task_ack_timeout;
    fixture.advance(overdue, &a);
    assert_eq!(recalls(&mut fixture, &a), vec![delegation.lease]);
    fixture
        .directory
        .release(a.session, &[delegation.lease])
        .unwrap();
    let tasks = fixture
        .directory
        .poll_tasks(fixture.now, a.session, 10)
        .unwrap();
    assert!(matches!(
        tasks.as_slice(),
        [Task { kind: TaskKind::Reclaim { replica: r, .. }, .. }] if *r == replica
    ));
    assert_eq!(fixture.directory.delegations_live(), 0);
    fixture.directory.check_invariants();
}

#[test]
fn a_delegation_not_released_ends_at_its_deadline() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    let (replica, _) = fixture.store(&a, object, MIB);
    let (lease, delegation) = acquire_delegating(&mut fixture, &a, object);
    assert!(delegation.is_some());
    fixture
        .directory
        .release(a.session, &[lease.lease])
        .unwrap();
    fixture.directory.retire(Some(a.session), replica).unwrap();
    let lease_duration = fixture.directory.config().lease_duration;
    // Past an engine lease the delegation still holds the replica; past its own, not.
    let reclaims = |fixture: &mut Fixture| {
        let kinds = fixture.polled(&a);
        kinds
            .iter()
            .filter(|kind| matches!(kind, TaskKind::Reclaim { .. }))
            .count()
    };
    fixture.advance(lease_duration + Duration::from_millis(1), &a);
    assert_eq!(fixture.directory.delegations_live(), 1);
    assert_eq!(reclaims(&mut fixture), 0, "the delegation still holds it");
    fixture.advance(lease_duration, &a);
    assert_eq!(fixture.directory.delegations_live(), 0);
    assert_eq!(reclaims(&mut fixture), 1, "freed once the delegation ended");
    fixture.directory.check_invariants();
}

#[test]
fn eviction_chooses_a_delegated_replica_by_its_order_and_frees_it_once_released() {
    let mut fixture = Fixture::with_watermarks(90, 50);
    let a = fixture.node("a", 10 * MIB);
    let mut replicas = Vec::new();
    for index in 0..10 {
        replicas.push(fixture.store(&a, fixture.object(index), MIB).0);
    }
    let mut delegations = Vec::new();
    for index in 0..10 {
        let (lease, delegation) = acquire_delegating(&mut fixture, &a, object(index));
        fixture
            .directory
            .release(a.session, &[lease.lease])
            .unwrap();
        delegations.push(delegation.unwrap().lease);
    }
    // An engine's lease on the coldest keeps it; the delegations alone keep nothing.
    let AcquireOutcome::Leased(read) = fixture.acquire_one(&a, object(0)) else {
        panic!("object 0 is READY");
    };
    let evicted = fixture.advance(Duration::from_secs(1), &a).evicted;
    assert!(evicted > 0, "delegated replicas are chosen");
    let kinds = fixture.polled(&a);
    let recalled: Vec<LeaseId> = kinds
        .iter()
        .filter_map(|kind| match kind {
            TaskKind::Recall { delegation, .. } => Some(*delegation),
            _ => None,
        })
        .collect();
    assert_eq!(
        recalled.len(),
        evicted as usize,
        "each victim's delegation recalled"
    );
    assert!(
        !recalled.contains(&delegations[0]),
        "the replica an engine reads stays"
    );
    assert!(
        !kinds
            .iter()
            .any(|kind| matches!(kind, TaskKind::Reclaim { .. })),
        "nothing freed while a delegation holds it"
    );
    assert_eq!(
        fixture.directory.recalls_by_reason()[1].1,
        u64::from(evicted)
    );
    fixture.directory.release(a.session, &recalled).unwrap();
    let reclaimed = fixture
        .polled(&a)
        .into_iter()
        .filter(|kind| matches!(kind, TaskKind::Reclaim { .. }))
        .count();
    assert_eq!(reclaimed, evicted as usize, "freed once released");
    fixture.directory.release(a.session, &[read.lease]).unwrap();
    fixture.directory.check_invariants();
}

/// The `Delegate` tasks among `node`'s polled tasks: (object, replica, delegation).
fn offered(fixture: &mut Fixture, node: &NodeHandle) -> Vec<(ObjectId, ReplicaId, LeaseId)> {
    fixture
        .directory
        .poll_tasks(fixture.now, node.session, 64)
        .unwrap()
        .into_iter()
        .filter_map(|task| match task.kind {
            TaskKind::Delegate {
                object,
                lease,
                delegation,
            } => {
                assert_eq!(lease.lease, delegation.lease);
                Some((object, lease.replica, delegation.lease))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_replica_new_in_shared_memory_is_offered_to_every_node_that_maps_it() {
    let mut fixture = Fixture::new();
    fixture.cxl(16 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let b = fixture.node("b", MIB);
    let c = fixture.node_with("c", MIB, vec![Medium::Cpu], vec![DomainId(1)]);
    let object = fixture.object(1);
    let (replica, _) = fixture.store(&a, object, MIB);
    assert!(fixture.directory.has_tasks(fixture.now, b.session));
    assert!(
        !fixture.directory.has_tasks(fixture.now, c.session),
        "c maps no such pool"
    );
    let to_b = offered(&mut fixture, &b);
    assert_eq!(to_b.len(), 1);
    assert_eq!((to_b[0].0, to_b[0].1), (object, replica));
    assert_eq!(offered(&mut fixture, &a).len(), 1, "its writer's too");
    assert!(
        offered(&mut fixture, &b).is_empty(),
        "never handed out again"
    );
    assert_eq!(fixture.directory.delegations_live(), 2);
    assert_eq!(fixture.directory.delegations_offered(), 2);
    // The offered delegation is a lease like an acquire's: a retire recalls it.
    assert_eq!(
        fixture.directory.retire(Some(a.session), replica),
        Ok(RetireOutcome::AwaitingReaders { leases: 0 })
    );
    assert_eq!(recalls(&mut fixture, &b), vec![to_b[0].2]);
    fixture.directory.check_invariants();
}

#[test]
fn an_offer_that_no_longer_holds_is_dropped_and_host_memory_is_never_offered() {
    let mut fixture = Fixture::new();
    fixture.cxl(16 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let b = fixture.node("b", 4 * MIB);
    let (replica, _) = fixture.store(&a, fixture.object(1), MIB);
    fixture.directory.retire(Some(a.session), replica).unwrap();
    assert!(
        offered(&mut fixture, &b).is_empty(),
        "retired before the poll"
    );
    // b's own CPU store is answered by b as its own, and offered to nobody.
    fixture.store(&b, fixture.object(2), MIB);
    assert!(offered(&mut fixture, &a).is_empty());
    assert!(offered(&mut fixture, &b).is_empty());
    assert_eq!(fixture.directory.delegations_live(), 0);
    fixture.directory.check_invariants();
}

#[test]
fn local_hits_reported_count_as_accesses_and_stale_reports_are_ignored() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let b = fixture.node("b", 16 * MIB);
    let object = fixture.object(1);
    fixture.store(&a, object, MIB);
    let (lease, delegation) = acquire_delegating(&mut fixture, &a, object);
    let delegation = delegation.unwrap().lease;
    let before = fixture.directory.access_count(&object);
    let report = LocalHits {
        delegation,
        replica: lease.replica,
        object,
        hits: 3,
    };
    fixture
        .directory
        .report_local_hits(fixture.now, a.session, &[report])
        .unwrap();
    assert_eq!(fixture.directory.access_count(&object), before + 3);
    // Another session's report of it, or one naming another object, counts nothing.
    let wrong_object = LocalHits {
        object: fixture.object(2),
        ..report
    };
    fixture
        .directory
        .report_local_hits(fixture.now, b.session, &[report])
        .unwrap();
    fixture
        .directory
        .report_local_hits(fixture.now, a.session, &[wrong_object])
        .unwrap();
    assert_eq!(fixture.directory.access_count(&object), before + 3);
    // Hits `a` answered on the replica in its own CPU pool with no delegation (its own key,
    // unknown here) count; the same report from `b`, which does not own the pool, does not.
    let owned = LocalHits {
        delegation: LeaseId(u64::MAX),
        hits: 2,
        ..report
    };
    fixture
        .directory
        .report_local_hits(fixture.now, b.session, &[owned])
        .unwrap();
    assert_eq!(fixture.directory.access_count(&object), before + 3);
    fixture
        .directory
        .report_local_hits(fixture.now, a.session, &[owned])
        .unwrap();
    assert_eq!(fixture.directory.access_count(&object), before + 5);
    // Once the replica is no longer READY, its reports count nothing.
    fixture
        .directory
        .retire_object(a.session, &object, lease.replica)
        .unwrap();
    fixture
        .directory
        .report_local_hits(fixture.now, a.session, &[owned])
        .unwrap();
    assert_eq!(fixture.directory.access_count(&object), before + 5);
}

#[test]
fn delegations_are_bounded_per_session_and_zero_turns_them_off() {
    let config = DirectoryConfig {
        delegations_per_session_max: 1,
        ..DirectoryConfig::default()
    };
    let mut fixture = Fixture::with_config(config);
    let a = fixture.node("a", 16 * MIB);
    fixture.store(&a, fixture.object(1), MIB);
    fixture.store(&a, fixture.object(2), MIB);
    assert!(acquire_delegating(&mut fixture, &a, object(1)).1.is_some());
    assert!(acquire_delegating(&mut fixture, &a, object(2)).1.is_none());
    let config = DirectoryConfig {
        delegations_per_session_max: 0,
        ..DirectoryConfig::default()
    };
    let mut fixture = Fixture::with_config(config);
    let a = fixture.node("a", 16 * MIB);
    fixture.store(&a, fixture.object(1), MIB);
    assert!(acquire_delegating(&mut fixture, &a, object(1)).1.is_none());
}

#[test]
fn a_drained_node_is_recalled_its_delegations_and_granted_none() {
    let mut fixture = Fixture::new();
    fixture.cxl(16 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let b = fixture.node("b", MIB);
    fixture.store(&a, fixture.object(1), MIB);
    let held = offered(&mut fixture, &b);
    assert_eq!(held.len(), 1);
    fixture.directory.drain("b").unwrap();
    assert_eq!(recalls(&mut fixture, &b), vec![held[0].2]);
    assert_eq!(fixture.directory.recalls_by_reason()[2].1, 1);
    // While it drains: no offer, and no delegation with an acquire.
    let second = fixture.object(2);
    fixture.store(&a, second, MIB);
    assert!(offered(&mut fixture, &b).is_empty());
    let (lease, delegation) = acquire_delegating(&mut fixture, &b, second);
    assert_eq!(delegation, None);
    fixture
        .directory
        .release(b.session, &[lease.lease])
        .unwrap();
    fixture.directory.check_invariants();
}
