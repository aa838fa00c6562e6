//! Unit tests of replication on demand (`replication`): the demand, the two paths, the
//! policy's skips, every way a replication in flight is cancelled, and the task hint that
//! wakes its nodes.

use super::tests::{location, Fixture, NodeHandle, MIB};
use super::*;
use crate::model::{DomainId, Location, Medium, ObjectId, TransferToken};
use std::time::Duration;

/// Node A (CPU first, domain 0) and the shared pool; A holds `object` in its CPU pool.
fn cluster(config: DirectoryConfig) -> (Fixture, NodeHandle, PoolId, ObjectId) {
    let mut fixture = Fixture::with_config(config);
    let cxl = fixture.cxl(16 * MIB);
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    let (_, stored) = fixture.store(&a, object, MIB);
    assert_eq!(stored.pool, a.cpu);
    (fixture, a, cxl, object)
}

/// Commits a replication target at the start of a fresh extent of `pool` (CXL) or at
/// offset 0 (a CPU pool).
fn commit_target(
    fixture: &mut Fixture,
    node: &NodeHandle,
    target: ReplicaId,
    pool: PoolId,
) -> Result<CommitOutcome, DirectoryError> {
    let mut at = location(pool, target.0, MIB);
    if pool != node.cpu {
        let now = fixture.now;
        let Ok(ExtentGrant::Granted(extent)) = fixture.grant_extent(now, node.session, pool) else {
            panic!("no extent for the copy");
        };
        at.offset_bytes = extent.offset_bytes;
    }
    let operation = fixture.operation();
    fixture
        .directory
        .commit(fixture.now, node.session, operation, target, at)
}

fn replicate_task(tasks: &[TaskKind]) -> (Location, ReplicaId, PoolId) {
    match tasks {
        [TaskKind::Replicate {
            source,
            target,
            target_pool,
        }] => (*source, *target, *target_pool),
        other => panic!("expected one replicate task, got {other:?}"),
    }
}

#[test]
fn a_remote_miss_copies_into_the_shared_pool_and_the_source_stays() {
    let (mut fixture, a, cxl, object) = cluster(DirectoryConfig::default());
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    fixture.now = fixture.now + Duration::from_millis(5);
    // The forward path never waits: a miss at once, and the copy is being written.
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    assert_eq!(
        fixture.directory.probe(b.session, &[object]).unwrap(),
        vec![ProbeOutcome::Pending]
    );
    assert!(fixture.polled(&b).is_empty());
    let (source, target, target_pool) = replicate_task(&fixture.polled(&a));
    assert_eq!((source.pool, target_pool), (a.cpu, cxl));
    fixture.directory.check_invariants();
    // A second miss while the copy runs plans nothing more.
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    assert_eq!(fixture.directory.replication_counts().planned, 1);
    fixture.now = fixture.now + Duration::from_millis(7);
    assert_eq!(
        commit_target(&mut fixture, &a, target, cxl),
        Ok(CommitOutcome::Committed)
    );
    assert!(matches!(
        fixture.acquire_one(&b, object),
        AcquireOutcome::Leased(Lease {
            medium: Medium::Cxl,
            ..
        })
    ));
    // A copy, not a move: A still reads its CPU replica.
    assert!(matches!(
        fixture.acquire_one(&a, object),
        AcquireOutcome::Leased(Lease {
            medium: Medium::Cpu,
            ..
        })
    ));
    let counts = fixture.directory.replication_counts();
    assert_eq!(
        (
            counts.planned,
            counts.completed,
            counts.cancelled,
            counts.in_flight
        ),
        (1, 1, 0, 0)
    );
    assert_eq!(counts.completed_bytes, MIB);
    assert_eq!(
        fixture.directory.take_replication_latencies(),
        vec![Duration::from_millis(7)]
    );
    assert!(fixture.directory.take_replication_latencies().is_empty());
    fixture.directory.check_invariants();
}

/// The token of the first network copy planned under `config`, and its target.
fn first_network_copy(config: DirectoryConfig) -> (ReplicaId, TransferToken) {
    let (mut fixture, a, _, object) = cluster(config);
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![]);
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    match fixture.polled(&a).as_slice() {
        [TaskKind::Push { target, token, .. }] => (*target, *token),
        other => panic!("expected a push, got {other:?}"),
    }
}

#[test]
fn a_network_copys_token_is_keyed_by_the_directory_not_by_the_replica_id() {
    let seeded = |seed| DirectoryConfig {
        hash_seed: Some(seed),
        ..DirectoryConfig::default()
    };
    let (target, token) = first_network_copy(seeded(1));
    // Replayable under one seed; the same replica id under another key has another token.
    assert_eq!(first_network_copy(seeded(1)), (target, token));
    let (other_target, other_token) = first_network_copy(seeded(2));
    assert_eq!(other_target, target);
    assert_ne!(other_token, token);
    assert_ne!(token.0, target.0);
    // In service the key is random per directory.
    let (_, random) = first_network_copy(DirectoryConfig::default());
    let (_, random_again) = first_network_copy(DirectoryConfig::default());
    assert_ne!(random, random_again);
}

#[test]
fn without_a_shared_domain_the_copy_goes_over_the_network_into_the_requesters_cpu() {
    let (mut fixture, a, _, object) = cluster(DirectoryConfig::default());
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![]);
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    let (target, token) = match fixture.polled(&a).as_slice() {
        [TaskKind::Push {
            source,
            target,
            token,
            length_bytes,
            to,
        }] => {
            assert_eq!((source.pool, *length_bytes, *to), (a.cpu, MIB, b.node));
            (*target, *token)
        }
        other => panic!("expected a push, got {other:?}"),
    };
    assert_eq!(
        fixture.polled(&b),
        vec![TaskKind::Receive {
            object,
            target,
            token,
            target_pool: b.cpu,
            length_bytes: MIB,
            from: a.node,
        }]
    );
    // The source's owner cannot commit the receiver's reservation.
    let stray = location(b.cpu, target.0, MIB);
    let operation = fixture.operation();
    assert_eq!(
        fixture
            .directory
            .commit(fixture.now, a.session, operation, target, stray),
        Err(DirectoryError::NotOwner(target))
    );
    assert_eq!(
        commit_target(&mut fixture, &b, target, b.cpu),
        Ok(CommitOutcome::Committed)
    );
    assert!(matches!(
        fixture.acquire_one(&b, object),
        AcquireOutcome::Leased(Lease {
            medium: Medium::Cpu,
            ..
        })
    ));
    assert_eq!(fixture.directory.replication_counts().completed, 1);
    fixture.directory.check_invariants();
}

#[test]
fn the_threshold_and_the_switches_decide_whether_a_miss_replicates() {
    // (misses before a copy, over the network, shared domain of B, tasks for A after
    // each of three misses, skipped by reason)
    type Row = (u32, bool, bool, [usize; 3], [u64; 4]);
    let rows: [Row; 4] = [
        (0, true, true, [0, 0, 0], [0; 4]),
        (2, true, true, [0, 1, 0], [0; 4]),
        (1, false, false, [0, 0, 0], [0, 0, 3, 0]),
        (1, true, false, [1, 0, 0], [0; 4]),
    ];
    for (after, network, shared, tasks, skipped) in rows {
        let (mut fixture, a, _, object) = cluster(DirectoryConfig {
            replicate_after_misses: after,
            replicate_over_network: network,
            ..DirectoryConfig::default()
        });
        let domains = if shared { vec![DomainId(0)] } else { vec![] };
        let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], domains);
        let seen: Vec<usize> = (0..3)
            .map(|_| {
                assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
                fixture.polled(&a).len()
            })
            .collect();
        assert_eq!(seen, tasks, "row {after} {network} {shared}");
        assert_eq!(
            fixture.directory.replication_counts().skipped,
            skipped,
            "row {after} {network} {shared}"
        );
        fixture.directory.check_invariants();
    }
}

#[test]
fn a_lookup_names_a_consumer_once_and_repeated_lookups_add_no_demand() {
    let (mut fixture, a, _, object) = cluster(DirectoryConfig {
        replicate_after_misses: 2,
        ..DirectoryConfig::default()
    });
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    for _ in 0..5 {
        let now = fixture.now;
        let probed = fixture
            .directory
            .probe_noting_demand(now, b.session, &[object])
            .unwrap();
        assert_eq!(probed, vec![ProbeOutcome::Miss]);
        assert!(fixture.polled(&a).is_empty(), "polling inflated demand");
    }
    // The lookup counted once; one load's miss makes two.
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    replicate_task(&fixture.polled(&a));
    fixture.directory.check_invariants();
}

#[test]
fn a_full_target_or_a_copy_that_does_not_pay_is_skipped_and_counted() {
    // Room: a shared pool already at its high watermark.
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(MIB);
    let a = fixture.node("a", 16 * MIB);
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let filler = fixture.object(9);
    let (_, stored) = fixture.store(&b, filler, MIB);
    assert_eq!(stored.pool, cxl);
    let object = fixture.object(1);
    fixture.store(&a, object, MIB);
    let no_network = DirectoryConfig {
        replicate_over_network: false,
        ..DirectoryConfig::default()
    };
    fixture.directory.config = no_network;
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    assert_eq!(
        fixture.directory.replication_counts().skipped[SkipReason::NoRoom.index()],
        1
    );
    // Worth: recomputing is nearly free.
    let (mut fixture, a, _, object) = cluster(DirectoryConfig {
        prefill_us_per_token: 1e-6,
        ..DirectoryConfig::default()
    });
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    assert!(fixture.polled(&a).is_empty());
    assert_eq!(
        fixture.directory.replication_counts().skipped,
        [0, 1, 0, 0],
        "not worth, by {:?}",
        SkipReason::ALL.map(SkipReason::name)
    );
    fixture.directory.check_invariants();
}

#[test]
fn retiring_the_source_cancels_the_copy_and_frees_the_target() {
    let (mut fixture, a, cxl, object) = cluster(DirectoryConfig::default());
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    let (_, target, _) = replicate_task(&fixture.polled(&a));
    let source = fixture
        .directory
        .replicas
        .of_object(&object)
        .find(|(_, replica)| replica.state == ReplicaState::Ready)
        .map(|(id, _)| id)
        .unwrap();
    fixture.directory.retire(Some(a.session), source).unwrap();
    fixture.directory.check_invariants();
    let counts = fixture.directory.replication_counts();
    assert_eq!((counts.cancelled, counts.in_flight), (1, 0));
    assert_eq!(
        fixture.directory.usage()[cxl.0 as usize]
            .usage
            .reserved_bytes,
        0
    );
    // The owner's late commit of the copy is refused: never READY.
    assert_eq!(
        commit_target(&mut fixture, &a, target, cxl),
        Err(DirectoryError::UnknownReplica(target))
    );
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    fixture.directory.check_invariants();
}

#[test]
fn a_fenced_sender_or_receiver_or_an_expired_reservation_cancels_the_copy() {
    for case in ["sender", "receiver", "expiry"] {
        let (mut fixture, a, _, object) = cluster(DirectoryConfig::default());
        let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![]);
        assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
        assert_eq!(fixture.directory.replication_counts().in_flight, 1);
        let b_cpu_reserved = |fixture: &Fixture| {
            fixture.directory.usage()[b.cpu.0 as usize]
                .usage
                .reserved_bytes
        };
        assert_eq!(b_cpu_reserved(&fixture), MIB);
        let config = fixture.directory.config().clone();
        match case {
            "sender" => {
                // Only B heartbeats: A is fenced.
                let step = config.fence_after / 4;
                for _ in 0..5 {
                    fixture.now = fixture.now + step;
                    fixture
                        .directory
                        .heartbeat(fixture.now, b.session, None)
                        .unwrap();
                    fixture.directory.tick(fixture.now);
                }
            }
            "receiver" => {
                // B restarts: its old session is fenced by the new epoch.
                fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![]);
            }
            _ => {
                let step = config.reservation_duration / 2 + Duration::from_millis(1);
                for _ in 0..2 {
                    fixture.now = fixture.now + step;
                    fixture
                        .directory
                        .heartbeat(fixture.now, a.session, None)
                        .unwrap();
                    fixture
                        .directory
                        .heartbeat(fixture.now, b.session, None)
                        .unwrap();
                    fixture.directory.tick(fixture.now);
                }
            }
        }
        let counts = fixture.directory.replication_counts();
        assert_eq!((counts.cancelled, counts.in_flight), (1, 0), "{case}");
        if case != "receiver" {
            assert_eq!(b_cpu_reserved(&fixture), 0, "{case}");
            // The survivor's queue holds no half of the cancelled copy.
            let survivor = if case == "sender" { &b } else { &a };
            assert!(fixture.polled(survivor).is_empty(), "{case}");
        }
        fixture.directory.check_invariants();
    }
}

#[test]
fn one_copy_per_object_at_a_time_and_a_waiting_demand_is_planned_by_a_tick() {
    let (mut fixture, a, cxl, object) = cluster(DirectoryConfig::default());
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let c = fixture.node_with("c", 16 * MIB, vec![Medium::Cpu], vec![]);
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    assert_eq!(fixture.acquire_one(&c, object), AcquireOutcome::Miss);
    let (_, target, _) = replicate_task(&fixture.polled(&a));
    assert_eq!(fixture.directory.replication_counts().planned, 1);
    assert_eq!(
        commit_target(&mut fixture, &a, target, cxl),
        Ok(CommitOutcome::Committed)
    );
    fixture.directory.tick(fixture.now);
    // C's demand waited; now it goes over the network.
    assert!(matches!(
        fixture.polled(&a).as_slice(),
        [TaskKind::Push { to, .. }] if *to == c.node
    ));
    assert_eq!(fixture.directory.replication_counts().planned, 2);
    fixture.directory.check_invariants();
}

#[test]
fn a_replica_made_by_replication_is_evicted_like_any_other() {
    let (mut fixture, a, cxl, object) = cluster(DirectoryConfig::default());
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    let (_, target, _) = replicate_task(&fixture.polled(&a));
    commit_target(&mut fixture, &a, target, cxl).unwrap();
    assert_eq!(
        fixture.directory.retire(None, target),
        Ok(RetireOutcome::Reclaimable)
    );
    assert!(fixture
        .polled(&a)
        .iter()
        .any(|task| matches!(task, TaskKind::Reclaim { replica, .. } if *replica == target)));
    fixture.directory.check_invariants();
}

#[test]
fn a_planned_copy_tells_each_of_its_nodes_it_has_a_task_until_it_polls() {
    let (mut fixture, a, _, object) = cluster(DirectoryConfig::default());
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![]);
    let has_tasks = |fixture: &Fixture, node: &NodeHandle| {
        fixture.directory.has_tasks(fixture.now, node.session)
    };
    fixture.polled(&a);
    fixture.polled(&b);
    assert!(!has_tasks(&fixture, &a) && !has_tasks(&fixture, &b));
    let queued = fixture.directory.tasks_queued();
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    assert_eq!(
        fixture.directory.tasks_queued(),
        queued + 2,
        "a push and a receive"
    );
    assert!(has_tasks(&fixture, &a) && has_tasks(&fixture, &b));
    assert_eq!(fixture.polled(&a).len(), 1);
    assert!(!has_tasks(&fixture, &a) && has_tasks(&fixture, &b));
    assert_eq!(fixture.polled(&b).len(), 1);
    assert!(!has_tasks(&fixture, &b));
}
