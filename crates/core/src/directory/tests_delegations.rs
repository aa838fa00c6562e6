//! Delegations: granted with an acquire to a node that maps the replica, held as a lease
//! (retire, eviction and reclaim wait for it), recalled before a retire or an eviction,
//! handed out again until released, and ended with their deadline.

use super::tests::{Fixture, NodeHandle, MIB};
use super::*;
use crate::model::{LeaseId, ObjectId};
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
fn eviction_recalls_the_cold_delegated_replicas_it_cannot_choose() {
    let mut fixture = Fixture::with_watermarks(90, 50);
    let a = fixture.node("a", 10 * MIB);
    for index in 0..10 {
        fixture.store(&a, fixture.object(index), MIB);
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
    assert_eq!(
        fixture.advance(Duration::from_secs(1), &a).evicted,
        0,
        "all delegated"
    );
    let recalled = recalls(&mut fixture, &a);
    assert!(!recalled.is_empty(), "the coldest are recalled");
    assert!(recalled.iter().all(|lease| delegations.contains(lease)));
    fixture.directory.release(a.session, &recalled).unwrap();
    assert!(
        fixture.advance(Duration::from_secs(1), &a).evicted > 0,
        "released, then evicted"
    );
    assert_eq!(
        fixture.directory.recalls_by_reason()[1].1,
        recalled.len() as u64
    );
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
