//! Unit tests: one per operation and error, and one per invariant of docs/design.md.

use super::*;
use crate::model::{
    DomainId, Epoch, KvDtype, LeaseId, Location, Medium, NamespaceDescriptor, ObjectId,
    OperationId, OwnerWord, PrefixDigest,
};
use crate::policy::lifecycle::LifecyclePolicy;
use crate::policy::profiles::{Measurement, ProfileFigures, TierKind};
use std::time::Duration;

pub(super) const MIB: u64 = 1 << 20;

pub(crate) fn descriptor() -> NamespaceDescriptor {
    NamespaceDescriptor {
        model: "llama".into(),
        revision: "r1".into(),
        adapter: None,
        kv_dtype: KvDtype::BFloat16,
        quantization: None,
        layers: 2,
        kv_heads: 2,
        head_dim: 64,
        block_tokens: 16,
        format_version: 1,
        chunk_tokens: 256,
        tensor_parallel: 1,
        pipeline_parallel: 1,
        salt: None,
    }
}

pub(super) struct Fixture {
    pub(super) directory: Directory,
    namespace: NamespaceId,
    pub(super) now: Timestamp,
    next_operation: u64,
}

pub(super) struct NodeHandle {
    pub(super) session: SessionId,
    pub(super) node: NodeId,
    pub(super) cpu: PoolId,
}

fn open_request(name: &str, write_order: Vec<Medium>, domains: Vec<DomainId>) -> OpenRequest {
    OpenRequest {
        node_name: name.into(),
        write_order,
        read_order: vec![Medium::Cpu, Medium::Cxl, Medium::Ssd],
        domains,
        namespaces: NamespaceAccess::Any,
    }
}

impl Fixture {
    pub(super) fn new() -> Fixture {
        Fixture::with_config(DirectoryConfig::default())
    }

    pub(super) fn with_config(config: DirectoryConfig) -> Fixture {
        Fixture {
            directory: Directory::new(config),
            namespace: descriptor().id().unwrap(),
            now: Timestamp::ZERO,
            next_operation: 1,
        }
    }

    /// A directory evicting above `high` percent of a pool down to `low`.
    pub(super) fn with_watermarks(high: u8, low: u8) -> Fixture {
        Fixture::with_config(DirectoryConfig {
            high_watermark_percent: high,
            low_watermark_percent: low,
            ..DirectoryConfig::default()
        })
    }

    /// Moves time on by `by`, `node` heartbeats, and the directory ticks.
    pub(super) fn advance(&mut self, by: Duration, node: &NodeHandle) -> TickReport {
        self.now = self.now + by;
        self.directory
            .heartbeat(self.now, node.session, None)
            .unwrap();
        self.directory.tick(self.now)
    }

    /// The kinds of the tasks `node` polls now (see [`Fixture::poll`]).
    pub(super) fn polled(&mut self, node: &NodeHandle) -> Vec<TaskKind> {
        self.poll(node, 64)
            .into_iter()
            .map(|task| task.kind)
            .collect()
    }

    /// Up to `max` of the tasks `node` polls now; the delegations offered with them are
    /// given back at once, as by a node that takes no offer (`tests_delegations` takes
    /// them).
    pub(super) fn poll(&mut self, node: &NodeHandle, max: u32) -> Vec<Task> {
        let (offered, tasks): (Vec<Task>, Vec<Task>) = self
            .directory
            .poll_tasks(self.now, node.session, max)
            .unwrap()
            .into_iter()
            .partition(|task| matches!(task.kind, TaskKind::Delegate { .. }));
        let leases: Vec<LeaseId> = offered
            .iter()
            .filter_map(|task| match task.kind {
                TaskKind::Delegate { delegation, .. } => Some(delegation.lease),
                _ => None,
            })
            .collect();
        if !leases.is_empty() {
            self.directory.release(node.session, &leases).unwrap();
        }
        tasks
    }

    pub(super) fn node(&mut self, name: &str, cpu_bytes: u64) -> NodeHandle {
        self.node_with(
            name,
            cpu_bytes,
            vec![Medium::Cpu, Medium::Cxl],
            vec![DomainId(0)],
        )
    }

    pub(super) fn node_with(
        &mut self,
        name: &str,
        cpu_bytes: u64,
        write_order: Vec<Medium>,
        domains: Vec<DomainId>,
    ) -> NodeHandle {
        let reply = self
            .directory
            .open(self.now, open_request(name, write_order, domains))
            .unwrap();
        let cpu = self
            .directory
            .register_pool(
                Some(reply.session),
                PoolSpec {
                    name: format!("{name}-cpu"),
                    medium: Medium::Cpu,
                    scope: Scope::Host(reply.node),
                    capacity_bytes: cpu_bytes,
                    page_bytes: 4096,
                    extent_bytes: None,
                    tenancy: crate::model::PoolTenancy::Shared,
                },
            )
            .unwrap();
        self.directory
            .register_namespace(reply.session, descriptor())
            .unwrap();
        NodeHandle {
            session: reply.session,
            node: reply.node,
            cpu,
        }
    }

    pub(super) fn cxl(&mut self, bytes: u64) -> PoolId {
        self.directory
            .register_pool(
                None,
                PoolSpec {
                    name: "cxl0".into(),
                    medium: Medium::Cxl,
                    scope: Scope::Domain(DomainId(0)),
                    capacity_bytes: bytes,
                    page_bytes: 4096,
                    extent_bytes: Some(MIB),
                    tenancy: crate::model::PoolTenancy::Shared,
                },
            )
            .unwrap()
    }

    pub(super) fn object(&self, index: u32) -> ObjectId {
        ObjectId {
            namespace: self.namespace,
            prefix: PrefixDigest::ROOT.chain(&[index]),
            shard: 0,
            part: 0,
        }
    }

    pub(super) fn operation(&mut self) -> OperationId {
        self.next_operation += 1;
        OperationId(self.next_operation)
    }

    pub(super) fn reserve(
        &mut self,
        node: &NodeHandle,
        object: ObjectId,
        length_bytes: u64,
    ) -> ReserveOutcome {
        let operation = self.operation();
        self.directory
            .reserve(
                self.now,
                node.session,
                operation,
                ReserveItem {
                    object,
                    length_bytes,
                },
            )
            .unwrap()
    }

    pub(super) fn store(
        &mut self,
        node: &NodeHandle,
        object: ObjectId,
        length_bytes: u64,
    ) -> (ReplicaId, Location) {
        let granted = self.reserve(node, object, length_bytes);
        self.commit_granted(node, granted, length_bytes)
    }

    /// Writes and commits what `granted` (a reserve's outcome) granted, in a fresh extent
    /// of a shared pool; panics on any other outcome.
    pub(super) fn commit_granted(
        &mut self,
        node: &NodeHandle,
        granted: ReserveOutcome,
        length_bytes: u64,
    ) -> (ReplicaId, Location) {
        let ReserveOutcome::Granted {
            replica,
            pool,
            medium,
            ..
        } = granted
        else {
            panic!("expected a grant, not {granted:?}");
        };
        let mut location = location(pool, replica.0, length_bytes);
        if medium == Medium::Cxl {
            let Ok(ExtentGrant::Granted(extent)) = self.grant_extent(self.now, node.session, pool)
            else {
                panic!("no extent left for a CXL store");
            };
            location.offset_bytes = extent.offset_bytes;
        }
        let operation = self.operation();
        assert_eq!(
            self.directory
                .commit(self.now, node.session, operation, replica, location),
            Ok(CommitOutcome::Committed)
        );
        self.directory.check_invariants();
        (replica, location)
    }

    /// Probes `object` for `node` after taking and releasing a lease on it.
    pub(super) fn acquire_one_release(
        &mut self,
        node: &NodeHandle,
        object: ObjectId,
    ) -> ProbeOutcome {
        if let AcquireOutcome::Leased(lease) = self.acquire_one(node, object) {
            self.directory
                .release(node.session, &[lease.lease])
                .unwrap();
        }
        self.directory.probe(node.session, &[object]).unwrap()[0]
    }

    fn return_extent(
        &mut self,
        session: SessionId,
        pool: PoolId,
        offset_bytes: u64,
    ) -> Result<ExtentReturn, DirectoryError> {
        let operation = self.operation();
        self.directory
            .return_extent(self.now, session, operation, pool, offset_bytes)
    }

    pub(super) fn grant_extent(
        &mut self,
        now: Timestamp,
        session: SessionId,
        pool: PoolId,
    ) -> Result<ExtentGrant, DirectoryError> {
        let operation = self.operation();
        self.directory.grant_extent(now, session, operation, pool)
    }

    pub(super) fn acquire_one(&mut self, node: &NodeHandle, object: ObjectId) -> AcquireOutcome {
        self.directory
            .acquire(self.now, node.session, &[object], AcquireMode::Each)
            .unwrap()[0]
    }
}

pub(super) fn location(pool: PoolId, allocation: u64, length_bytes: u64) -> Location {
    Location {
        pool,
        allocation: crate::model::AllocationId(allocation),
        generation: crate::model::Generation(1),
        offset_bytes: 0,
        length_bytes,
    }
}

#[test]
fn store_then_load_on_the_same_node() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 64 * MIB);
    let object = fixture.object(1);
    assert_eq!(
        fixture.directory.probe(a.session, &[object]).unwrap(),
        vec![ProbeOutcome::Miss]
    );
    let (replica, location) = fixture.store(&a, object, MIB);
    assert_eq!(
        fixture.directory.probe(a.session, &[object]).unwrap(),
        vec![ProbeOutcome::Hit {
            medium: Medium::Cpu,
            length_bytes: MIB
        }]
    );
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&a, object) else {
        panic!("miss")
    };
    assert_eq!((lease.replica, lease.location), (replica, location));
    let usage = &fixture.directory.usage()[a.cpu.0 as usize].usage;
    assert_eq!(
        (usage.ready_bytes, usage.pinned_bytes, usage.allocated_bytes),
        (MIB, MIB, MIB)
    );
    assert_eq!(
        fixture
            .directory
            .release(a.session, &[lease.lease])
            .unwrap(),
        vec![ReleaseOutcome::Released]
    );
    assert_eq!(
        fixture
            .directory
            .release(a.session, &[lease.lease])
            .unwrap(),
        vec![ReleaseOutcome::Unknown]
    );
    fixture.directory.check_invariants();
}

#[test]
fn reserved_replica_is_pending_not_a_hit() {
    // Invariant 1: READY only after commit.
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 64 * MIB);
    let object = fixture.object(1);
    let ReserveOutcome::Granted { .. } = fixture.reserve(&a, object, MIB) else {
        panic!()
    };
    assert_eq!(
        fixture.directory.probe(a.session, &[object]).unwrap(),
        vec![ProbeOutcome::Pending]
    );
    assert_eq!(fixture.acquire_one(&a, object), AcquireOutcome::Miss);
    assert_eq!(fixture.reserve(&a, object, MIB), ReserveOutcome::Pending);
}

#[test]
fn full_pools_skip_and_existing_hits_stay() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 2 * MIB);
    fixture.store(&a, fixture.object(1), MIB);
    fixture.store(&a, fixture.object(2), MIB);
    assert_eq!(
        fixture.reserve(&a, fixture.object(3), 1),
        ReserveOutcome::Skip(StoreSkip::NoRoom)
    );
    assert!(matches!(
        fixture.acquire_one(&a, fixture.object(1)),
        AcquireOutcome::Leased(_)
    ));
    assert_eq!(
        fixture.reserve(&a, fixture.object(1), MIB),
        ReserveOutcome::AlreadyPresent
    );
}

#[test]
fn write_order_fills_cpu_then_cxl() {
    let mut fixture = Fixture::new();
    fixture.cxl(2 * MIB);
    let a = fixture.node("a", MIB);
    let media: Vec<Medium> = (0..3)
        .map(
            |index| match fixture.reserve(&a, fixture.object(index), MIB) {
                ReserveOutcome::Granted { medium, .. } => medium,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    assert_eq!(media, vec![Medium::Cpu, Medium::Cxl, Medium::Cxl]);
    assert_eq!(
        fixture.reserve(&a, fixture.object(9), MIB),
        ReserveOutcome::Skip(StoreSkip::NoRoom)
    );
    assert_eq!(
        fixture.reserve(&a, fixture.object(10), 4 * MIB),
        ReserveOutcome::Skip(StoreSkip::TooLarge),
        "larger than the CPU pool and the CXL pool"
    );
}

#[test]
fn private_cpu_replica_is_a_miss_for_another_node_but_cxl_is_shared() {
    // Invariant 6. Without replication (`tests_replication` covers what a miss plans).
    let mut fixture = Fixture::with_config(DirectoryConfig {
        replicate_after_misses: 0,
        ..DirectoryConfig::default()
    });
    fixture.cxl(16 * MIB);
    let a = fixture.node("a", 16 * MIB);
    let b = fixture.node_with("b", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let outsider = fixture.node_with("c", 16 * MIB, vec![Medium::Cpu], vec![]);
    let object = fixture.object(1);
    fixture.store(&a, object, MIB);
    assert_eq!(
        fixture.directory.probe(b.session, &[object]).unwrap(),
        vec![ProbeOutcome::Miss]
    );
    assert_eq!(fixture.acquire_one(&b, object), AcquireOutcome::Miss);
    // B may store its own copy: ALREADY_PRESENT is scoped to what B can read.
    assert!(matches!(
        fixture.reserve(&b, object, MIB),
        ReserveOutcome::Granted { .. }
    ));
    let a_cxl = fixture.node_with("a", 16 * MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let shared = fixture.object(2);
    fixture.store(&a_cxl, shared, MIB);
    assert!(matches!(
        fixture.acquire_one(&b, shared),
        AcquireOutcome::Leased(Lease {
            medium: Medium::Cxl,
            ..
        })
    ));
    assert_eq!(fixture.acquire_one(&outsider, shared), AcquireOutcome::Miss);
    fixture.directory.check_invariants();
}

#[test]
fn cheapest_replica_is_selected() {
    let mut fixture = Fixture::new();
    fixture.cxl(16 * MIB);
    let reader = fixture.node_with("r", 16 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let object = fixture.object(1);
    let (cpu_replica, _) = fixture.store(&reader, object, MIB);
    // The writer cannot read the reader's CPU replica, so it stores its own CXL copy.
    let writer = fixture.node_with("w", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let (cxl_replica, _) = fixture.store(&writer, object, MIB);
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&reader, object) else {
        panic!()
    };
    assert_eq!(
        (lease.replica, lease.medium),
        (cpu_replica, Medium::Cpu),
        "CPU ranks first in the read order"
    );
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&writer, object) else {
        panic!()
    };
    assert_eq!((lease.replica, lease.medium), (cxl_replica, Medium::Cxl));
    fixture.directory.check_invariants();
}

#[test]
fn commit_is_idempotent_and_late_retries_are_refused() {
    // Invariant 7.
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    let reserve_op = fixture.operation();
    let item = ReserveItem {
        object,
        length_bytes: MIB,
    };
    let grant = fixture
        .directory
        .reserve(fixture.now, a.session, reserve_op, item)
        .unwrap();
    assert_eq!(
        fixture
            .directory
            .reserve(fixture.now, a.session, reserve_op, item),
        Ok(grant),
        "retried reserve"
    );
    let ReserveOutcome::Granted { replica, pool, .. } = grant else {
        panic!()
    };
    let commit_op = fixture.operation();
    let location = location(pool, 7, MIB);
    assert_eq!(
        fixture
            .directory
            .commit(fixture.now, a.session, commit_op, replica, location),
        Ok(CommitOutcome::Committed)
    );
    assert_eq!(
        fixture
            .directory
            .commit(fixture.now, a.session, commit_op, replica, location),
        Ok(CommitOutcome::Committed)
    );
    assert_eq!(
        fixture.directory.resolve(a.session, a.session, commit_op),
        Ok(ResolveOutcome::Committed(CommitOutcome::Committed))
    );
    fixture
        .directory
        .heartbeat(fixture.now, a.session, Some(commit_op))
        .unwrap();
    assert_eq!(
        fixture
            .directory
            .commit(fixture.now, a.session, commit_op, replica, location),
        Err(DirectoryError::OperationAcknowledged(commit_op))
    );
    assert_eq!(
        fixture.directory.resolve(a.session, a.session, commit_op),
        Ok(ResolveOutcome::Unknown)
    );
    // A commit with a new operation id for an already committed replica is refused.
    let again = fixture.operation();
    assert!(matches!(
        fixture
            .directory
            .commit(fixture.now, a.session, again, replica, location),
        Err(DirectoryError::NotOwner(_) | DirectoryError::InvalidState { .. })
    ));
    fixture.directory.check_invariants();
}

#[test]
fn resolve_burns_an_unseen_operation() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let lost = fixture.operation();
    assert_eq!(
        fixture.directory.resolve(a.session, a.session, lost),
        Ok(ResolveOutcome::NotApplied)
    );
    let item = ReserveItem {
        object: fixture.object(1),
        length_bytes: MIB,
    };
    assert_eq!(
        fixture
            .directory
            .reserve(fixture.now, a.session, lost, item),
        Err(DirectoryError::OperationAcknowledged(lost)),
        "the late original arrives after resolve said NotApplied"
    );
    let other = fixture.node("b", MIB);
    assert_eq!(
        fixture.directory.resolve(other.session, a.session, lost),
        Err(DirectoryError::ForeignSession)
    );
}

#[test]
fn new_epoch_fences_the_old_session_and_its_late_commit() {
    // Invariants 7 and 8.
    let mut fixture = Fixture::new();
    let old = fixture.node("a", 16 * MIB);
    fixture.store(&old, fixture.object(1), MIB);
    let ReserveOutcome::Granted { replica, pool, .. } =
        fixture.reserve(&old, fixture.object(2), MIB)
    else {
        panic!()
    };
    let commit_op = fixture.operation();
    let restarted = fixture.node("a", 16 * MIB);
    assert_eq!(restarted.node, old.node);
    assert_eq!(restarted.cpu, old.cpu, "same pool name, same pool id");
    assert_eq!(
        fixture.directory.commit(
            fixture.now,
            old.session,
            commit_op,
            replica,
            location(pool, 1, MIB)
        ),
        Err(DirectoryError::Fenced { epoch: Epoch(1) })
    );
    assert_eq!(
        fixture
            .directory
            .resolve(restarted.session, old.session, commit_op),
        Ok(ResolveOutcome::NotApplied)
    );
    assert_eq!(
        fixture
            .directory
            .probe(restarted.session, &[fixture.object(1)])
            .unwrap(),
        vec![ProbeOutcome::Miss]
    );
    assert_eq!(
        fixture.directory.usage()[restarted.cpu.0 as usize]
            .usage
            .allocated_bytes,
        0
    );
    fixture.directory.check_invariants();
}

#[test]
fn silence_hides_then_fences_and_a_heartbeat_revives_a_suspect() {
    // Invariant 8: suspect hides but frees nothing; fencing frees.
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    fixture.store(&a, object, MIB);
    let suspect_at = fixture.now + fixture.directory.config().suspect_after;
    let report = fixture.directory.tick(suspect_at);
    assert_eq!(
        report.transitions,
        vec![SessionTransition {
            session: a.session,
            node: a.node,
            state: SessionState::Suspect
        }]
    );
    assert_eq!(
        fixture.directory.probe(a.session, &[object]).unwrap(),
        vec![ProbeOutcome::Miss],
        "hidden"
    );
    let usage = fixture.directory.usage()[a.cpu.0 as usize].usage;
    assert_eq!(
        (usage.allocated_bytes, usage.quarantined_bytes),
        (MIB, MIB),
        "not freed"
    );
    fixture
        .directory
        .heartbeat(suspect_at, a.session, None)
        .unwrap();
    assert!(matches!(
        fixture.directory.probe(a.session, &[object]).unwrap()[0],
        ProbeOutcome::Hit { .. }
    ));
    let fence_at = suspect_at + fixture.directory.config().fence_after;
    fixture.directory.tick(fence_at);
    assert_eq!(
        fixture.directory.session_state(a.session),
        Some(SessionState::Fenced)
    );
    assert_eq!(
        fixture.directory.usage()[a.cpu.0 as usize]
            .usage
            .allocated_bytes,
        0
    );
    assert_eq!(
        fixture.directory.heartbeat(fence_at, a.session, None),
        Err(DirectoryError::Fenced { epoch: Epoch(1) })
    );
    fixture.directory.check_invariants();
}

#[test]
fn a_retire_naming_another_object_is_refused_as_unknown() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let (victim, mine) = (fixture.object(1), fixture.object(2));
    let (replica, _) = fixture.store(&a, victim, MIB);
    assert_eq!(
        fixture.directory.retire_object(a.session, &mine, replica),
        Err(DirectoryError::UnknownReplica(replica)),
        "a replica of another object"
    );
    assert_eq!(
        fixture.directory.retire_object(a.session, &victim, replica),
        Ok(RetireOutcome::Reclaimable)
    );
}

#[test]
fn retire_blocks_acquires_and_frees_only_after_release_and_ack() {
    // Invariant 4.
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    let (replica, _) = fixture.store(&a, object, MIB);
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&a, object) else {
        panic!()
    };
    assert_eq!(
        fixture.directory.retire(Some(a.session), replica),
        Ok(RetireOutcome::AwaitingReaders { leases: 1 })
    );
    assert_eq!(
        fixture.acquire_one(&a, object),
        AcquireOutcome::Miss,
        "retiring blocks new acquires"
    );
    assert_eq!(fixture.poll(&a, 10), vec![], "no reclaim while read");
    assert!(matches!(
        fixture.directory.reclaim_ack(a.session, replica),
        Err(DirectoryError::InvalidState { .. })
    ));
    assert_eq!(
        fixture.directory.usage()[a.cpu.0 as usize]
            .usage
            .retiring_bytes,
        MIB
    );
    fixture
        .directory
        .release(a.session, &[lease.lease])
        .unwrap();
    let tasks = fixture.poll(&a, 10);
    assert!(
        matches!(tasks.as_slice(), [Task { kind: TaskKind::Reclaim { replica: r, .. }, .. }] if *r == replica)
    );
    assert_eq!(
        fixture.directory.usage()[a.cpu.0 as usize]
            .usage
            .allocated_bytes,
        MIB,
        "not free before the ack"
    );
    assert_eq!(
        fixture.directory.reclaim_ack(a.session, replica),
        Ok(ReclaimOutcome::Freed)
    );
    assert_eq!(
        fixture.directory.reclaim_ack(a.session, replica),
        Ok(ReclaimOutcome::Unknown),
        "idempotent"
    );
    assert_eq!(
        fixture.directory.usage()[a.cpu.0 as usize]
            .usage
            .allocated_bytes,
        0
    );
    fixture.directory.check_invariants();
}

#[test]
fn stale_replica_and_lease_ids_are_refused() {
    // Invariant 5, for directory ids (allocation generations are checked by the pools).
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let (replica, _) = fixture.store(&a, fixture.object(1), MIB);
    fixture.directory.retire(Some(a.session), replica).unwrap();
    fixture.directory.reclaim_ack(a.session, replica).unwrap();
    let (reused, _) = fixture.store(&a, fixture.object(2), MIB);
    assert_ne!(reused, replica, "the reused slot has a new id");
    assert_eq!(
        fixture.directory.retire(Some(a.session), replica),
        Err(DirectoryError::UnknownReplica(replica))
    );
    assert_eq!(
        fixture.directory.replica_state(reused),
        Some(ReplicaState::Ready)
    );
}

#[test]
fn manifest_is_all_or_nothing() {
    // Invariant 3, batch form.
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    fixture.store(&a, fixture.object(1), MIB);
    let objects = [fixture.object(1), fixture.object(2)];
    let outcomes = fixture
        .directory
        .acquire(fixture.now, a.session, &objects, AcquireMode::Manifest)
        .unwrap();
    assert_eq!(
        outcomes,
        vec![AcquireOutcome::Withheld, AcquireOutcome::Miss]
    );
    assert_eq!(fixture.directory.counts().leases, 0);
    let outcomes = fixture
        .directory
        .acquire(fixture.now, a.session, &objects, AcquireMode::Each)
        .unwrap();
    assert!(matches!(
        outcomes.as_slice(),
        [AcquireOutcome::Leased(_), AcquireOutcome::Miss]
    ));
}

#[test]
fn leases_and_reservations_expire() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    let (replica, _) = fixture.store(&a, object, MIB);
    fixture.acquire_one(&a, object);
    fixture.directory.retire(Some(a.session), replica).unwrap();
    let ReserveOutcome::Granted {
        replica: reserved, ..
    } = fixture.reserve(&a, fixture.object(2), MIB)
    else {
        panic!()
    };
    let later = fixture.now + Duration::from_secs(31);
    fixture.directory.heartbeat(later, a.session, None).unwrap();
    let report = fixture.directory.tick(later);
    assert_eq!((report.expired_leases, report.expired_reservations), (1, 1));
    assert_eq!(fixture.directory.replica_state(reserved), None);
    assert_eq!(fixture.poll(&a, 10).len(), 1, "expiry queued the reclaim");
    fixture.directory.check_invariants();
}

#[test]
fn bad_input_gets_typed_errors() {
    let mut fixture = Fixture::with_config(DirectoryConfig {
        batch_items_max: 2,
        ..DirectoryConfig::default()
    });
    let a = fixture.node("a", 16 * MIB);
    let foreign = ObjectId {
        namespace: NamespaceId([9; 16]),
        ..fixture.object(1)
    };
    assert_eq!(
        fixture.directory.probe(a.session, &[foreign]),
        Err(DirectoryError::UnknownNamespace)
    );
    assert_eq!(
        fixture.directory.probe(a.session, &[fixture.object(1); 3]),
        Err(DirectoryError::BatchTooLarge { items: 3, max: 2 })
    );
    let operation = fixture.operation();
    assert_eq!(
        fixture.directory.reserve(
            fixture.now,
            a.session,
            operation,
            ReserveItem {
                object: fixture.object(1),
                length_bytes: 0
            }
        ),
        Err(DirectoryError::InvalidLength { length_bytes: 0 })
    );
    assert_eq!(
        fixture.directory.probe(SessionId(999), &[]),
        Err(DirectoryError::UnknownSession)
    );
    let bad_pool = PoolSpec {
        name: "x".into(),
        medium: Medium::Cpu,
        scope: Scope::Host(a.node),
        capacity_bytes: MIB,
        page_bytes: 3000,
        extent_bytes: None,
        tenancy: crate::model::PoolTenancy::Shared,
    };
    assert!(matches!(
        fixture.directory.register_pool(Some(a.session), bad_pool),
        Err(DirectoryError::InvalidPool(_))
    ));
    let other_node = PoolSpec {
        scope: Scope::Host(NodeId(77)),
        page_bytes: 4096,
        extent_bytes: None,
        tenancy: crate::model::PoolTenancy::Shared,
        name: "y".into(),
        medium: Medium::Cpu,
        capacity_bytes: MIB,
    };
    assert!(matches!(
        fixture.directory.register_pool(Some(a.session), other_node),
        Err(DirectoryError::InvalidPool(_))
    ));
    let bad_namespace = NamespaceDescriptor {
        layers: 0,
        ..descriptor()
    };
    assert!(matches!(
        fixture
            .directory
            .register_namespace(a.session, bad_namespace),
        Err(DirectoryError::InvalidNamespace(_))
    ));
}

#[test]
fn namespace_access_is_enforced() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let request = OpenRequest {
        namespaces: NamespaceAccess::Models(vec!["mistral".into()]),
        ..open_request("m", vec![Medium::Cpu], vec![])
    };
    let restricted = fixture.directory.open(fixture.now, request).unwrap();
    assert_eq!(
        fixture
            .directory
            .register_namespace(restricted.session, descriptor()),
        Err(DirectoryError::NamespaceDenied)
    );
    assert_eq!(
        fixture
            .directory
            .probe(restricted.session, &[fixture.object(1)]),
        Err(DirectoryError::NamespaceDenied)
    );
    assert!(fixture
        .directory
        .probe(a.session, &[fixture.object(1)])
        .is_ok());
}

#[test]
fn bounds_refuse_instead_of_growing() {
    let config = DirectoryConfig {
        leases_per_session_max: 1,
        ledger_entries_per_session_max: 3,
        ..DirectoryConfig::default()
    };
    let mut fixture = Fixture::with_config(config);
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    fixture.store(&a, object, MIB);
    fixture.acquire_one(&a, object);
    assert_eq!(
        fixture
            .directory
            .acquire(fixture.now, a.session, &[object], AcquireMode::Each),
        Err(DirectoryError::Full(Table::SessionLeases))
    );
    fixture.reserve(&a, fixture.object(2), MIB);
    let operation = fixture.operation();
    assert_eq!(
        fixture.directory.reserve(
            fixture.now,
            a.session,
            operation,
            ReserveItem {
                object: fixture.object(3),
                length_bytes: MIB
            }
        ),
        Err(DirectoryError::Full(Table::Ledger)),
        "a full ledger stops admission rather than dropping replay protection"
    );
    fixture
        .directory
        .heartbeat(
            fixture.now,
            a.session,
            Some(OperationId(fixture.next_operation - 1)),
        )
        .unwrap();
    assert!(fixture
        .directory
        .reserve(
            fixture.now,
            a.session,
            operation,
            ReserveItem {
                object: fixture.object(3),
                length_bytes: MIB
            }
        )
        .is_ok());
}

#[test]
fn close_requires_drained_session() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    let object = fixture.object(1);
    fixture.store(&a, object, MIB);
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&a, object) else {
        panic!()
    };
    assert_eq!(
        fixture.directory.close(fixture.now, a.session),
        Err(DirectoryError::NotDrained {
            leases: 1,
            reservations: 0
        })
    );
    fixture
        .directory
        .release(a.session, &[lease.lease])
        .unwrap();
    assert_eq!(fixture.directory.close(fixture.now, a.session), Ok(()));
    assert_eq!(
        fixture.directory.session_state(a.session),
        Some(SessionState::Closed)
    );
    fixture.directory.check_invariants();
}

#[test]
fn extents_are_disjoint_and_commits_stay_inside_their_own() {
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(3 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let b = fixture.node_with("b", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let outsider = fixture.node_with("c", MIB, vec![Medium::Cpu], vec![]);
    let grant = |fixture: &mut Fixture, node: &NodeHandle| {
        fixture
            .grant_extent(fixture.now, node.session, cxl)
            .unwrap()
    };
    let ExtentGrant::Granted(first) = grant(&mut fixture, &a) else {
        panic!()
    };
    let ExtentGrant::Granted(second) = grant(&mut fixture, &b) else {
        panic!()
    };
    let ExtentGrant::Granted(third) = grant(&mut fixture, &a) else {
        panic!()
    };
    let mut ranges = [first, second, third].map(|extent| {
        (
            extent.offset_bytes,
            extent.offset_bytes + extent.length_bytes,
        )
    });
    ranges.sort();
    assert!(
        ranges.windows(2).all(|pair| pair[0].1 <= pair[1].0),
        "overlapping extents {ranges:?}"
    );
    assert_eq!(grant(&mut fixture, &b), ExtentGrant::Full);
    assert!(matches!(
        fixture.grant_extent(fixture.now, outsider.session, cxl),
        Err(DirectoryError::InvalidPool(_))
    ));
    // B commits into A's extent: refused.
    let ReserveOutcome::Granted { replica, .. } = fixture.reserve(&b, fixture.object(1), MIB)
    else {
        panic!()
    };
    let mut wrong = location(cxl, 1, MIB);
    wrong.offset_bytes = first.offset_bytes;
    let operation = fixture.operation();
    assert_eq!(
        fixture
            .directory
            .commit(fixture.now, b.session, operation, replica, wrong),
        Err(DirectoryError::LocationMismatch(replica))
    );
    let mut right = wrong;
    right.offset_bytes = second.offset_bytes;
    let operation = fixture.operation();
    assert_eq!(
        fixture
            .directory
            .commit(fixture.now, b.session, operation, replica, right),
        Ok(CommitOutcome::Committed)
    );
    fixture.directory.check_invariants();
}

#[test]
fn a_dead_writers_cxl_replicas_stay_readable_and_are_reclaimed_by_the_directory() {
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(2 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let b = fixture.node_with("b", MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let object = fixture.object(1);
    let (replica, _) = fixture.store(&a, object, MIB);
    // A dies and is fenced by silence; B keeps heartbeating.
    let later = fixture.now + fixture.directory.config().fence_after;
    fixture.directory.heartbeat(later, b.session, None).unwrap();
    fixture.directory.tick(later);
    assert_eq!(
        fixture.directory.session_state(a.session),
        Some(SessionState::Fenced)
    );
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&b, object) else {
        panic!("CXL replica lost with its writer")
    };
    fixture.directory.retire(None, replica).unwrap();
    assert_eq!(
        fixture.directory.replica_state(replica),
        Some(ReplicaState::Retiring),
        "a reader still holds it"
    );
    fixture
        .directory
        .release(b.session, &[lease.lease])
        .unwrap();
    assert_eq!(
        fixture.directory.replica_state(replica),
        None,
        "freed by the directory: its writer is gone"
    );
    // The dead writer's extent cools down first (its engines may still hold grants in
    // it), then it is free again: two grants fit.
    let ExtentGrant::Granted(_) = fixture.grant_extent(later, b.session, cxl).unwrap() else {
        panic!()
    };
    assert_eq!(
        fixture.grant_extent(later, b.session, cxl),
        Ok(ExtentGrant::Full),
        "granted while cooling"
    );
    let cooled = later + fixture.directory.config().reservation_duration;
    fixture
        .directory
        .heartbeat(cooled, b.session, None)
        .unwrap();
    fixture.directory.tick(cooled);
    assert!(matches!(
        fixture.grant_extent(cooled, b.session, cxl),
        Ok(ExtentGrant::Granted(_))
    ));
    fixture.directory.check_invariants();
}

#[test]
fn pressure_evicts_the_least_valuable_unleased_replicas_down_to_the_low_watermark() {
    let mut fixture = Fixture::with_watermarks(90, 50);
    let a = fixture.node("a", 10 * MIB);
    for index in 0..10 {
        fixture.store(&a, fixture.object(index), MIB);
    }
    // Object 0 is leased, object 1 was read often: both must survive.
    let AcquireOutcome::Leased(_) = fixture.acquire_one(&a, fixture.object(0)) else {
        panic!()
    };
    for _ in 0..5 {
        let AcquireOutcome::Leased(lease) = fixture.acquire_one(&a, fixture.object(1)) else {
            panic!()
        };
        fixture
            .directory
            .release(a.session, &[lease.lease])
            .unwrap();
    }
    fixture.now = fixture.now + Duration::from_secs(1);
    fixture
        .directory
        .heartbeat(fixture.now, a.session, None)
        .unwrap();
    let report = fixture.directory.tick(fixture.now);
    assert_eq!(report.evicted, 5, "from 10 MiB down to 5 MiB");
    let usage = fixture.directory.usage()[a.cpu.0 as usize].usage;
    assert_eq!(usage.ready_bytes, 5 * MIB);
    for kept in [0, 1] {
        assert!(
            matches!(
                fixture
                    .directory
                    .probe(a.session, &[fixture.object(kept)])
                    .unwrap()[0],
                ProbeOutcome::Hit { .. }
            ),
            "object {kept} evicted"
        );
    }
    assert_eq!(
        fixture.poll(&a, 100).len(),
        5,
        "reclaims queued for the owner"
    );
    assert_eq!(
        fixture.directory.tick(fixture.now).evicted,
        0,
        "below the high watermark: nothing more"
    );
    fixture.directory.check_invariants();
}

#[test]
fn a_reclaim_acknowledged_before_a_restart_is_not_handed_to_the_new_incarnation() {
    let mut fixture = Fixture::new();
    fixture.cxl(2 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let (replica, _) = fixture.store(&a, fixture.object(1), 4096);
    fixture.directory.retire(Some(a.session), replica).unwrap();
    assert_eq!(fixture.poll(&a, 10).len(), 1);
    fixture.directory.reclaim_ack(a.session, replica).unwrap();
    let reopened = fixture
        .directory
        .open(
            fixture.now,
            open_request("a", vec![Medium::Cxl], vec![DomainId(0)]),
        )
        .unwrap();
    let stale = fixture
        .directory
        .poll_tasks(fixture.now, reopened.session, 10)
        .unwrap();
    assert!(
        stale.is_empty(),
        "a stale task reached the new incarnation: {stale:?}"
    );
    fixture.directory.check_invariants();
}

/// Acknowledged reclaims leave the handed-out tasks in amortized passes, not one scan
/// each: the queue stays within twice its awaited tasks plus the compaction minimum, and a
/// reclaim handed out but never acknowledged is still handed out again on its time. A
/// batch of acknowledgements past the batch bound is refused whole.
#[test]
fn acknowledged_reclaims_leave_the_handed_out_tasks_in_bounded_passes() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 64 * MIB);
    let count = 600u32;
    let replicas: Vec<ReplicaId> = (0..count)
        .map(|index| fixture.store(&a, fixture.object(index), 4096).0)
        .collect();
    for replica in &replicas {
        fixture.directory.retire(Some(a.session), *replica).unwrap();
    }
    let mut handed = Vec::new();
    while handed.len() < count as usize {
        let tasks = fixture.poll(&a, 1000);
        assert!(!tasks.is_empty());
        handed.extend(tasks);
    }
    let (unacknowledged, acknowledged) = replicas.split_last().unwrap();
    let max = fixture.directory.config().batch_items_max as usize;
    let too_many = vec![*unacknowledged; max + 1];
    assert!(matches!(
        fixture.directory.reclaim_ack_many(a.session, &too_many),
        Err(DirectoryError::BatchTooLarge { .. })
    ));
    // Every reclaim but the last acknowledged, seven at a time.
    let mut awaited = count as usize;
    for batch in acknowledged.chunks(7) {
        let outcomes = fixture
            .directory
            .reclaim_ack_many(a.session, batch)
            .unwrap();
        assert_eq!(outcomes, vec![Ok(ReclaimOutcome::Freed); batch.len()]);
        awaited -= batch.len();
        let queued = fixture.directory.nodes[a.node.0 as usize].handed_out.len();
        assert!(
            queued <= 2 * awaited + sessions::HANDED_OUT_COMPACTION_MIN + batch.len(),
            "{queued} tasks handed out for {awaited} awaited"
        );
    }
    assert_eq!(
        fixture
            .directory
            .reclaim_ack(a.session, acknowledged[0])
            .unwrap(),
        ReclaimOutcome::Unknown
    );
    fixture.directory.check_invariants();
    let later = fixture.now + fixture.directory.config().task_ack_timeout;
    fixture.directory.heartbeat(later, a.session, None).unwrap();
    fixture.directory.tick(later);
    let again = fixture
        .directory
        .poll_tasks(later, a.session, 1000)
        .unwrap();
    assert_eq!(
        again.len(),
        1,
        "only the unacknowledged reclaim again: {again:?}"
    );
    assert!(
        matches!(again[0].kind, TaskKind::Reclaim { replica, .. } if replica == *unacknowledged)
    );
    fixture.directory.check_invariants();
}

#[test]
fn fencing_a_reader_keeps_its_shared_pool_leases_until_their_deadline() {
    let mut fixture = Fixture::new();
    fixture.cxl(MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let b = fixture.node_with("b", MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let object = fixture.object(1);
    let (replica, _) = fixture.store(&a, object, 4096);
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&b, object) else {
        panic!()
    };
    let later = fixture.now + fixture.directory.config().fence_after;
    assert!(later < lease.deadline);
    fixture.directory.heartbeat(later, a.session, None).unwrap();
    fixture.directory.tick(later);
    assert_eq!(
        fixture.directory.session_state(b.session),
        Some(SessionState::Fenced)
    );
    assert!(
        matches!(
            fixture.directory.retire(Some(a.session), replica),
            Ok(RetireOutcome::AwaitingReaders { .. })
        ),
        "the fenced reader's engines may still read under their lease"
    );
    fixture.directory.check_invariants();
    fixture
        .directory
        .heartbeat(lease.deadline, a.session, None)
        .unwrap();
    fixture.directory.tick(lease.deadline);
    assert_eq!(
        fixture
            .directory
            .poll_tasks(lease.deadline, a.session, 10)
            .unwrap()
            .len(),
        1,
        "reclaim after the deadline"
    );
    fixture.directory.check_invariants();
}

#[test]
fn an_owner_gives_back_empty_extents() {
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(2 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let b = fixture.node_with("b", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let (replica, location) = fixture.store(&a, fixture.object(1), 4096);
    let ExtentGrant::Granted(second) = fixture.grant_extent(fixture.now, a.session, cxl).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        fixture.grant_extent(fixture.now, b.session, cxl),
        Ok(ExtentGrant::Full)
    );
    assert_eq!(
        fixture.return_extent(a.session, cxl, location.offset_bytes),
        Ok(ExtentReturn::InUse),
        "holds a replica"
    );
    assert_eq!(
        fixture.return_extent(b.session, cxl, second.offset_bytes),
        Ok(ExtentReturn::NotOwner),
        "not B's"
    );
    assert_eq!(
        fixture.return_extent(a.session, cxl, second.offset_bytes + 4096),
        Ok(ExtentReturn::NotOwner),
        "not an extent's start"
    );
    let operation = fixture.operation();
    let now = fixture.now;
    let returned =
        fixture
            .directory
            .return_extent(now, a.session, operation, cxl, second.offset_bytes);
    assert_eq!(returned, Ok(ExtentReturn::Returned));
    assert_eq!(
        fixture
            .directory
            .return_extent(now, a.session, operation, cxl, second.offset_bytes),
        Ok(ExtentReturn::Returned),
        "a retry gets the first answer"
    );
    assert_eq!(
        fixture.directory.resolve(a.session, a.session, operation),
        Ok(ResolveOutcome::ExtentReturned(ExtentReturn::Returned)),
        "a lost reply is resolved"
    );
    assert!(
        matches!(
            fixture.grant_extent(fixture.now, b.session, cxl),
            Ok(ExtentGrant::Granted(_))
        ),
        "a live owner's empty extent may go to another node at once"
    );
    fixture.directory.retire(Some(a.session), replica).unwrap();
    fixture.directory.reclaim_ack(a.session, replica).unwrap();
    assert_eq!(
        fixture.return_extent(a.session, cxl, location.offset_bytes),
        Ok(ExtentReturn::Returned)
    );
    fixture.directory.check_invariants();
}

#[test]
fn pressure_demotes_a_cpu_replica_into_shared_memory_instead_of_dropping_it() {
    let mut fixture = Fixture::with_watermarks(90, 50);
    let cxl = fixture.cxl(8 * MIB);
    let a = fixture.node_with("a", 4 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let b = fixture.node_with("b", MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let objects: Vec<ObjectId> = (0..4).map(|index| fixture.object(index)).collect();
    for object in &objects {
        fixture.store(&a, *object, MIB);
    }
    assert_eq!(
        fixture.directory.probe(b.session, &objects).unwrap(),
        vec![ProbeOutcome::Miss; 4],
        "private to A"
    );
    fixture.now = fixture.now + Duration::from_secs(1);
    fixture
        .directory
        .heartbeat(fixture.now, a.session, None)
        .unwrap();
    fixture
        .directory
        .heartbeat(fixture.now, b.session, None)
        .unwrap();
    let report = fixture.directory.tick(fixture.now);
    assert_eq!(report.evicted, 2, "from 4 MiB down to 2 MiB");
    fixture.directory.check_invariants();
    let tasks = fixture.poll(&a, 10);
    let demotions: Vec<(Location, ReplicaId, PoolId)> = tasks
        .iter()
        .filter_map(|task| match task.kind {
            TaskKind::Demote {
                source,
                target,
                target_pool,
            } => Some((source, target, target_pool)),
            _ => None,
        })
        .collect();
    assert_eq!(
        demotions.len(),
        2,
        "both victims are worth keeping one tier colder: {tasks:?}"
    );
    assert_eq!(
        fixture.directory.tick(fixture.now).evicted,
        0,
        "sources in flight are not chosen again"
    );
    // The sources stay readable while the copies are made.
    assert!(objects.iter().all(|object| matches!(
        fixture.acquire_one_release(&a, *object),
        ProbeOutcome::Hit { .. }
    )));
    let (source, target, target_pool) = demotions[0];
    assert_eq!(target_pool, cxl);
    let ExtentGrant::Granted(extent) = fixture.grant_extent(fixture.now, a.session, cxl).unwrap()
    else {
        panic!()
    };
    let copy = Location {
        pool: cxl,
        offset_bytes: extent.offset_bytes,
        ..source
    };
    let operation = fixture.operation();
    assert_eq!(
        fixture
            .directory
            .commit(fixture.now, a.session, operation, target, copy),
        Ok(CommitOutcome::Committed)
    );
    // The demoted copy is now a hit for B; A's CPU source retires and is reclaimed.
    let hits = fixture.directory.probe(b.session, &objects).unwrap();
    assert_eq!(
        hits.iter()
            .filter(|outcome| matches!(
                outcome,
                ProbeOutcome::Hit {
                    medium: Medium::Cxl,
                    ..
                }
            ))
            .count(),
        1
    );
    let reclaims = fixture.poll(&a, 10);
    assert!(
        matches!(reclaims.as_slice(), [Task { kind: TaskKind::Reclaim { location, .. }, .. }] if *location == source)
    );
    // The other copy fails: its source stays READY and may be chosen again.
    let (_, failed, _) = demotions[1];
    assert_eq!(
        fixture.directory.abort(a.session, failed),
        Ok(AbortOutcome::Aborted)
    );
    fixture.directory.check_invariants();
}

#[test]
fn an_extent_grant_whose_reply_was_lost_is_resolved_not_leaked() {
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(2 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let operation = fixture.operation();
    let first = fixture
        .directory
        .grant_extent(fixture.now, a.session, operation, cxl)
        .unwrap();
    assert_eq!(
        fixture
            .directory
            .grant_extent(fixture.now, a.session, operation, cxl),
        Ok(first),
        "a retry gets the same extent"
    );
    assert_eq!(
        fixture.directory.resolve(a.session, a.session, operation),
        Ok(ResolveOutcome::ExtentGranted(first))
    );
    assert!(
        matches!(
            fixture.grant_extent(fixture.now, a.session, cxl),
            Ok(ExtentGrant::Granted(_))
        ),
        "one extent was left"
    );
    fixture.directory.check_invariants();
}

/// Fills A's CPU pool (4 MiB, watermarks 90/50) with four 1 MiB objects, ticks, and
/// counts the demote tasks the pressure produced.
fn demotions_under_pressure(fixture: &mut Fixture, a: &NodeHandle) -> usize {
    for index in 0..4 {
        let object = fixture.object(index);
        fixture.store(a, object, MIB);
    }
    fixture.now = fixture.now + Duration::from_secs(1);
    fixture
        .directory
        .heartbeat(fixture.now, a.session, None)
        .unwrap();
    assert_eq!(fixture.directory.tick(fixture.now).evicted, 2);
    fixture
        .poll(a, 10)
        .iter()
        .filter(|task| matches!(task.kind, TaskKind::Demote { .. }))
        .count()
}

#[test]
fn measured_profiles_price_demotion_and_operator_overrides_win() {
    let config = DirectoryConfig {
        high_watermark_percent: 90,
        low_watermark_percent: 50,
        ..DirectoryConfig::default()
    };
    let crawling = Measurement {
        read_latency_ns: 1_000,
        read_bandwidth_bytes_per_s: 1_000,
        write_bandwidth_bytes_per_s: Some(1_000),
    };
    // Who may report what.
    let mut fixture = Fixture::with_config(config.clone());
    let cxl = fixture.cxl(8 * MIB);
    let a = fixture.node_with("a", 4 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let outsider = fixture.node_with("o", MIB, vec![Medium::Cpu], vec![]);
    let directory = &mut fixture.directory;
    assert!(directory.report_profile(a.session, a.cpu, crawling).is_ok());
    for (session, pool) in [(a.session, outsider.cpu), (outsider.session, cxl)] {
        assert!(matches!(
            directory.report_profile(session, pool, crawling),
            Err(DirectoryError::InvalidPool(_))
        ));
    }
    assert_eq!(
        directory.report_profile(a.session, PoolId(99), crawling),
        Err(DirectoryError::UnknownPool)
    );
    let zero = Measurement {
        read_bandwidth_bytes_per_s: 0,
        ..crawling
    };
    assert!(matches!(
        directory.report_profile(a.session, cxl, zero),
        Err(DirectoryError::InvalidProfile(_))
    ));
    let usage = directory.usage();
    assert_eq!(
        usage[a.cpu.0 as usize].profile.read_bandwidth_bytes_per_s,
        1e3
    );
    assert_eq!(
        usage[cxl.0 as usize].profile,
        TierProfile::representative(TierKind::Cxl),
        "a refused report changes nothing"
    );
    // A CXL pool measured far too slow to pay back 256 tokens: victims are evicted.
    directory.report_profile(a.session, cxl, crawling).unwrap();
    assert_eq!(demotions_under_pressure(&mut fixture, &a), 0);
    // The operator knows better: the override wins over the measurement.
    let mut fixture = Fixture::with_config(DirectoryConfig {
        profiles: [(
            Medium::Cxl,
            ProfileFigures {
                read_bandwidth_bytes_per_s: Some(5e9),
                write_bandwidth_bytes_per_s: Some(5e9),
                ..ProfileFigures::default()
            },
        )]
        .into(),
        ..config
    });
    let cxl = fixture.cxl(8 * MIB);
    let a = fixture.node_with("a", 4 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let in_force = fixture
        .directory
        .report_profile(a.session, cxl, crawling)
        .unwrap();
    assert_eq!(in_force.read_bandwidth_bytes_per_s, 5e9);
    assert_eq!(in_force.read_latency_us, 1.0, "measured, not overridden");
    assert_eq!(demotions_under_pressure(&mut fixture, &a), 2);
    fixture.directory.check_invariants();
}

impl Fixture {
    /// Leases `objects` in one batch (a prompt's chunks in order) and releases them.
    fn load_batch(&mut self, node: &NodeHandle, objects: &[ObjectId]) {
        let leases: Vec<LeaseId> = self
            .directory
            .acquire(self.now, node.session, objects, AcquireMode::Each)
            .unwrap()
            .into_iter()
            .map(|outcome| match outcome {
                AcquireOutcome::Leased(lease) => lease.lease,
                other => panic!("expected a lease: {other:?}"),
            })
            .collect();
        self.directory.release(node.session, &leases).unwrap();
    }

    /// Advances the clock by `seconds`, keeps `node` alive, ticks, and returns which of
    /// `objects` are still hits.
    fn tick_after(&mut self, seconds: u64, node: &NodeHandle, objects: &[ObjectId]) -> Vec<bool> {
        self.now = self.now + Duration::from_secs(seconds);
        self.directory
            .heartbeat(self.now, node.session, None)
            .unwrap();
        self.directory.tick(self.now);
        self.directory.check_invariants();
        self.directory
            .probe(node.session, objects)
            .unwrap()
            .iter()
            .map(|outcome| matches!(outcome, ProbeOutcome::Hit { .. }))
            .collect()
    }
}

#[test]
fn eviction_keeps_what_is_reused_over_what_is_recent() {
    let mut fixture = Fixture::with_watermarks(90, 50);
    let a = fixture.node_with("a", 4 * MIB, vec![Medium::Cpu], vec![]);
    let objects: Vec<ObjectId> = (0..4).map(|index| fixture.object(index)).collect();
    for object in &objects[..2] {
        fixture.store(&a, *object, MIB);
    }
    for _ in 0..3 {
        fixture.now = fixture.now + Duration::from_secs(1);
        fixture.load_batch(&a, &objects[..2]);
    }
    // Two one-timers, stored after the reused pair was last read.
    fixture.now = fixture.now + Duration::from_secs(5);
    for object in &objects[2..] {
        fixture.store(&a, *object, MIB);
    }
    assert_eq!(
        fixture.tick_after(1, &a, &objects),
        [true, true, false, false],
        "the one-timers go although they are the most recent"
    );
}

#[test]
fn a_prefix_loses_its_tail_before_its_head() {
    let mut fixture = Fixture::with_watermarks(90, 75);
    let a = fixture.node_with("a", 4 * MIB, vec![Medium::Cpu], vec![]);
    let objects: Vec<ObjectId> = (0..4).map(|index| fixture.object(index)).collect();
    for object in &objects {
        fixture.store(&a, *object, MIB);
    }
    // Two prompts of two chunks each, read at the same moment: equal frequency and age.
    fixture.now = fixture.now + Duration::from_secs(1);
    fixture.load_batch(&a, &objects[..2]);
    fixture.load_batch(&a, &objects[2..]);
    assert_eq!(
        fixture.tick_after(1, &a, &objects),
        [true, false, true, true],
        "one eviction takes the first prompt's tail, not its head"
    );
}

#[test]
fn replicas_past_their_tiers_time_to_live_leave_without_pressure() {
    let lifetime = |spill_on_expiry| LifecyclePolicy {
        resident_ttl_ms: 10_000,
        expiring_grace_ms: 5_000,
        spill_on_expiry,
    };
    for spill_on_expiry in [true, false] {
        let config = DirectoryConfig {
            ttl: [(Medium::Cpu, lifetime(spill_on_expiry))].into(),
            ..DirectoryConfig::default()
        };
        let mut fixture = Fixture::with_config(config);
        let cxl = fixture.cxl(8 * MIB);
        let a = fixture.node_with("a", 64 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
        let objects: Vec<ObjectId> = (0..2).map(|index| fixture.object(index)).collect();
        let locations: Vec<Location> = objects
            .iter()
            .map(|object| fixture.store(&a, *object, MIB).1)
            .collect();
        // 12 s idle: expiring, still readable; reading the first revives it.
        assert_eq!(fixture.tick_after(12, &a, &objects), [true, true]);
        fixture.load_batch(&a, &objects[..1]);
        // 16 s: the second is past its grace and leaves; the first lives on.
        assert_eq!(
            fixture.tick_after(4, &a, &objects),
            [true, spill_on_expiry],
            "spill={spill_on_expiry}: a spilled replica stays readable until its copy commits"
        );
        let tasks = fixture.poll(&a, 10);
        let demoted = tasks.iter().any(
            |task| matches!(task.kind, TaskKind::Demote { target_pool, .. } if target_pool == cxl),
        );
        let reclaimed = tasks
            .iter()
            .any(|task| matches!(task.kind, TaskKind::Reclaim { .. }));
        assert_eq!((demoted, reclaimed), (spill_on_expiry, !spill_on_expiry));
        // 34 s: the revived one's time is up too.
        assert_eq!(fixture.tick_after(18, &a, &objects[..1]), [spill_on_expiry]);
        let tasks = fixture.poll(&a, 10);
        let first_leaves = tasks.iter().any(|task| match task.kind {
            TaskKind::Demote { source, .. } => spill_on_expiry && source == locations[0],
            TaskKind::Reclaim { location, .. } => !spill_on_expiry && location == locations[0],
            _ => false,
        });
        assert!(first_leaves, "{tasks:?}");
    }
    let refused = DirectoryConfig {
        ttl: [(
            Medium::Cpu,
            LifecyclePolicy {
                resident_ttl_ms: 0,
                ..lifetime(false)
            },
        )]
        .into(),
        ..DirectoryConfig::default()
    };
    assert!(refused.validate().is_err());
}

#[test]
fn storing_an_object_already_ready_counts_as_an_access() {
    let config = DirectoryConfig {
        ttl: [(
            Medium::Cpu,
            LifecyclePolicy {
                resident_ttl_ms: 10_000,
                expiring_grace_ms: 0,
                spill_on_expiry: false,
            },
        )]
        .into(),
        ..DirectoryConfig::default()
    };
    let mut fixture = Fixture::with_config(config);
    let a = fixture.node_with("a", 8 * MIB, vec![Medium::Cpu], vec![]);
    let objects: Vec<ObjectId> = (0..2).map(|index| fixture.object(index)).collect();
    for object in &objects {
        fixture.store(&a, *object, MIB);
    }
    fixture.now = fixture.now + Duration::from_secs(8);
    assert_eq!(
        fixture.reserve(&a, objects[0], MIB),
        ReserveOutcome::AlreadyPresent
    );
    assert_eq!(
        fixture.tick_after(4, &a, &objects),
        [true, false],
        "the one stored again 4 s ago stays; the other is 12 s idle"
    );
}

/// A restarted directory: incarnation 2 over the same pools, nodes rejoined, what they
/// held reported; the recovery window is 30 s.
fn restarted(fixture: &Fixture, cxl_bytes: u64) -> (Fixture, PoolId) {
    let config = DirectoryConfig {
        incarnation: 2,
        ..fixture.directory.config().clone()
    };
    let mut restarted = Fixture::with_config(config);
    restarted.now = fixture.now;
    let cxl = restarted.cxl(cxl_bytes);
    let until = restarted.now + restarted.directory.recovery_window();
    restarted.directory.hold_extents_until(cxl, until).unwrap();
    restarted.directory.recover_until(until);
    (restarted, cxl)
}

fn holding(object: ObjectId, location: Location) -> Holding {
    Holding { object, location }
}

#[test]
fn a_rejoined_node_gets_its_cache_back_and_reclaims_wait_for_the_recovery_window() {
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(8 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let (_, in_cpu) = fixture.store(&a, fixture.object(1), 4096);
    let b = fixture.node_with("b", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let (_, in_cxl) = fixture.store(&b, fixture.object(2), 4096);
    assert_eq!(in_cxl.pool, cxl);

    let (mut restarted, cxl) = restarted(&fixture, 8 * MIB);
    let a2 = restarted.node_with("a", MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let b2 = restarted.node_with("b", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    assert_ne!(a2.session.incarnation(), a.session.incarnation());
    assert_eq!(
        a2.cpu, a.cpu,
        "pools registered in the same order keep their ids"
    );
    let extent = in_cxl.offset_bytes - in_cxl.offset_bytes % (4 * MIB);
    let claim = |word: u64| ExtentClaim {
        offset_bytes: extent,
        owner_word: Some(OwnerWord(word)),
    };
    assert_eq!(
        restarted
            .directory
            .claim_extents(a2.session, cxl, &[claim(5 << 32 | 1)]),
        Ok(vec![true]),
        "an extent held at start is claimable"
    );
    assert_eq!(
        restarted
            .directory
            .claim_extents(b2.session, cxl, &[claim(6 << 32 | 2)]),
        Ok(vec![false]),
        "never one another node claimed"
    );
    let adopted = restarted.directory.adopt(
        restarted.now,
        b2.session,
        &[holding(restarted.object(2), in_cxl)],
    );
    assert_eq!(
        adopted,
        Ok(vec![AdoptOutcome::Refused]),
        "not in b's extent"
    );
    let adopted = restarted.directory.adopt(
        restarted.now,
        a2.session,
        &[
            holding(restarted.object(1), in_cpu),
            holding(restarted.object(1), in_cpu),
        ],
    );
    assert_eq!(
        adopted,
        Ok(vec![AdoptOutcome::Adopted, AdoptOutcome::Known]),
        "a repeated report is known, not doubled"
    );
    restarted.directory.check_invariants();
    let probed = restarted
        .directory
        .probe(a2.session, &[restarted.object(1)]);
    assert!(matches!(probed.unwrap()[0], ProbeOutcome::Hit { .. }));

    // Retired during the recovery window: the reclaim waits until the window ends.
    let AcquireOutcome::Leased(lease) = restarted.acquire_one(&a2, restarted.object(1)) else {
        panic!("the adopted replica is readable");
    };
    restarted
        .directory
        .release(a2.session, &[lease.lease])
        .unwrap();
    restarted
        .directory
        .retire(Some(a2.session), lease.replica)
        .unwrap();
    let now = restarted.now + Duration::from_secs(1);
    assert_eq!(
        restarted.directory.poll_tasks(now, a2.session, 16),
        Ok(vec![])
    );
    let after = restarted.now + restarted.directory.recovery_window();
    let tasks = restarted
        .directory
        .poll_tasks(after, a2.session, 16)
        .unwrap();
    assert!(matches!(
        tasks.as_slice(),
        [Task {
            kind: TaskKind::Reclaim { .. },
            ..
        }]
    ));
    restarted.directory.check_invariants();
}

#[test]
fn rejoin_reports_are_paced_per_tick() {
    let config = DirectoryConfig {
        adopt_items_per_tick: 2,
        ..DirectoryConfig::default()
    };
    let mut fixture = Fixture::with_config(config);
    let a = fixture.node_with("a", MIB, vec![Medium::Cpu], vec![]);
    let report: Vec<Holding> = (0..3)
        .map(|index| holding(fixture.object(index), location(a.cpu, index.into(), 4096)))
        .collect();
    assert_eq!(
        fixture.directory.adopt(fixture.now, a.session, &report),
        Err(DirectoryError::Paced),
        "more than a tick's budget is refused whole"
    );
    let first = fixture
        .directory
        .adopt(fixture.now, a.session, &report[..2]);
    assert_eq!(first.map(|outcomes| outcomes.len()), Ok(2));
    assert_eq!(
        fixture
            .directory
            .adopt(fixture.now, a.session, &report[2..]),
        Err(DirectoryError::Paced)
    );
    fixture.directory.tick(fixture.now);
    assert!(fixture
        .directory
        .adopt(fixture.now, a.session, &report[2..])
        .is_ok());
}

#[test]
fn a_holding_outside_the_nodes_own_storage_is_refused() {
    let mut fixture = Fixture::new();
    let a = fixture.node_with("a", MIB, vec![Medium::Cpu], vec![]);
    let b = fixture.node_with("b", MIB, vec![Medium::Cpu], vec![]);
    let object = fixture.object(1);
    let mut past_the_end = location(a.cpu, 1, 4096);
    past_the_end.offset_bytes = MIB;
    for (session, at) in [
        (b.session, location(a.cpu, 1, 4096)),
        (a.session, past_the_end),
        (a.session, location(PoolId(99), 1, 4096)),
    ] {
        let adopted = fixture
            .directory
            .adopt(fixture.now, session, &[holding(object, at)]);
        assert_eq!(adopted, Ok(vec![AdoptOutcome::Refused]), "{at:?}");
    }
    fixture.directory.check_invariants();
}
fn host_pool(node: NodeId, name: &str, capacity_bytes: u64) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        medium: Medium::Ssd,
        scope: Scope::Host(node),
        capacity_bytes,
        page_bytes: 4096,
        extent_bytes: None,
        tenancy: crate::model::PoolTenancy::Shared,
    }
}

#[test]
fn a_node_registers_a_bounded_number_of_pools() {
    let config = DirectoryConfig {
        pools_per_node_max: 3,
        ..DirectoryConfig::default()
    };
    let mut fixture = Fixture::with_config(config);
    let a = fixture.node("a", 16 * MIB);
    for index in 0..2 {
        let spec = host_pool(a.node, &format!("a-ssd-{index}"), 16 * MIB);
        fixture
            .directory
            .register_pool(Some(a.session), spec)
            .unwrap();
    }
    let refused = fixture
        .directory
        .register_pool(Some(a.session), host_pool(a.node, "a-ssd-2", 16 * MIB));
    assert_eq!(refused, Err(DirectoryError::Full(Table::PoolsOfNode)));
    // Registering a pool it has again is not a new pool; another node has its own bound.
    assert_eq!(
        fixture
            .directory
            .register_pool(Some(a.session), host_pool(a.node, "a-ssd-1", 16 * MIB)),
        Ok(PoolId(2))
    );
    let b = fixture.node("b", 16 * MIB);
    fixture
        .directory
        .register_pool(Some(b.session), host_pool(b.node, "b-ssd", 16 * MIB))
        .unwrap();
}

#[test]
fn a_capacity_past_the_bound_is_refused_and_the_bound_is_safe_under_pressure() {
    let mut fixture = Fixture::new();
    let a = fixture.node("a", 16 * MIB);
    for capacity_bytes in [u64::MAX - 4095, POOL_CAPACITY_BYTES_MAX + 4096] {
        let refused = fixture
            .directory
            .register_pool(Some(a.session), host_pool(a.node, "huge", capacity_bytes));
        assert!(
            matches!(refused, Err(DirectoryError::InvalidPool(_))),
            "{capacity_bytes}: {refused:?}"
        );
    }
    // The largest accepted capacity: storing and evicting compute watermarks without
    // overflow (a debug build panics on overflow).
    let b = fixture.node_with("b", POOL_CAPACITY_BYTES_MAX, vec![Medium::Cpu], vec![]);
    let object = fixture.object(1);
    fixture.store(&b, object, MIB);
    fixture.now = fixture.now + Duration::from_millis(10);
    fixture.directory.tick(fixture.now);
    fixture.directory.check_invariants();
}

#[test]
fn the_replica_index_seed_is_random_unless_injected() {
    let random = DirectoryConfig::default();
    assert_ne!(random.hash_seed_or_random(), random.hash_seed_or_random());
    let injected = DirectoryConfig {
        hash_seed: Some(42),
        ..DirectoryConfig::default()
    };
    assert_eq!(injected.hash_seed_or_random(), 42);
    assert_eq!(injected.hash_seed_or_random(), 42);
}

#[test]
fn a_shared_pool_is_priced_by_its_most_conservative_report() {
    let slow = Measurement {
        read_latency_ns: 5_000,
        read_bandwidth_bytes_per_s: 1_000_000,
        write_bandwidth_bytes_per_s: Some(1_000_000),
    };
    let fast = Measurement {
        read_latency_ns: 100,
        read_bandwidth_bytes_per_s: 100_000_000_000,
        write_bandwidth_bytes_per_s: Some(100_000_000_000),
    };
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(8 * MIB);
    let a = fixture.node_with("a", 4 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let b = fixture.node_with("b", 4 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let directory = &mut fixture.directory;
    let after_a = directory.report_profile(a.session, cxl, slow).unwrap();
    assert_eq!(after_a.read_bandwidth_bytes_per_s, 1e6);
    // B claims a far faster pool: the price stays at A's measurement.
    let after_b = directory.report_profile(b.session, cxl, fast).unwrap();
    assert_eq!(after_b.read_bandwidth_bytes_per_s, 1e6);
    assert_eq!(after_b.read_latency_us, 5.0);
    assert_eq!(directory.usage()[cxl.0 as usize].profile, after_b);
    // A replaces its own report: only then does the price move.
    let after_a_again = directory.report_profile(a.session, cxl, fast).unwrap();
    assert_eq!(after_a_again.read_bandwidth_bytes_per_s, 1e11);
    assert_eq!(after_a_again.read_latency_us, 0.1);
}

/// Runs the demote tasks `node` has: each copy is committed into `cxl` at a fresh extent.
pub(super) fn commit_demotions(fixture: &mut Fixture, node: &NodeHandle, cxl: PoolId) -> usize {
    let tasks = fixture.poll(node, 16);
    let mut committed = 0;
    for task in tasks {
        let TaskKind::Demote { source, target, .. } = task.kind else {
            continue;
        };
        let ExtentGrant::Granted(extent) = fixture
            .grant_extent(fixture.now, node.session, cxl)
            .unwrap()
        else {
            panic!("no extent for the demotion")
        };
        let copy = Location {
            pool: cxl,
            offset_bytes: extent.offset_bytes,
            ..source
        };
        let operation = fixture.operation();
        assert_eq!(
            fixture
                .directory
                .commit(fixture.now, node.session, operation, target, copy),
            Ok(CommitOutcome::Committed)
        );
        committed += 1;
    }
    committed
}

#[test]
fn a_drain_relocates_what_is_worth_keeping_waits_for_leases_then_ends_as_drained() {
    let mut fixture = Fixture::new();
    let cxl = fixture.cxl(8 * MIB);
    let a = fixture.node_with("a", 4 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let b = fixture.node_with("b", MIB, vec![Medium::Cpu], vec![DomainId(0)]);
    let objects: Vec<ObjectId> = (0..2).map(|index| fixture.object(index)).collect();
    for object in &objects {
        fixture.store(&a, *object, MIB);
    }
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&a, objects[1]) else {
        panic!("a hit")
    };
    let progress = fixture.directory.drain("a").unwrap();
    assert_eq!(progress.state, DrainState::Relocating);
    assert_eq!(
        (progress.replicas_left, progress.leases_outstanding),
        (2, 1)
    );
    assert_eq!(
        fixture.directory.drain("a"),
        Ok(progress),
        "draining again reports the drain under way"
    );
    assert_eq!(
        fixture.reserve(&a, fixture.object(9), MIB),
        ReserveOutcome::Skip(StoreSkip::Draining),
        "nothing new is placed on a draining node"
    );
    fixture.directory.tick(fixture.now);
    fixture.directory.check_invariants();
    assert_eq!(
        commit_demotions(&mut fixture, &a, cxl),
        1,
        "the leased replica waits"
    );
    fixture.directory.tick(fixture.now);
    let progress = fixture.directory.drain_progress(a.node).unwrap();
    assert_eq!(
        (progress.state, progress.replicas_left),
        (DrainState::Relocating, 1)
    );
    fixture
        .directory
        .release(a.session, &[lease.lease])
        .unwrap();
    fixture.directory.tick(fixture.now);
    assert_eq!(commit_demotions(&mut fixture, &a, cxl), 1);
    fixture.directory.tick(fixture.now);
    fixture.directory.check_invariants();
    let progress = fixture.directory.drain_progress(a.node).unwrap();
    assert_eq!(
        (progress.state, progress.replicas_left),
        (DrainState::Drained, 0)
    );
    assert_eq!(
        fixture.directory.heartbeat(fixture.now, a.session, None),
        Err(DirectoryError::Drained),
        "the node learns it was drained, distinct from fenced"
    );
    assert_eq!(
        fixture.directory.probe(b.session, &objects).unwrap(),
        vec![
            ProbeOutcome::Hit {
                medium: Medium::Cxl,
                length_bytes: MIB
            };
            2
        ],
        "what a kept is a hit for b"
    );
    let statuses = fixture.directory.node_statuses();
    assert_eq!(statuses[0].state, "drained");
    assert_eq!(statuses[1].state, "live");
}

#[test]
fn a_drain_waits_for_leases_of_shared_replicas_and_a_reopen_interrupts_it() {
    let mut fixture = Fixture::new();
    fixture.cxl(8 * MIB);
    let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
    let object = fixture.object(1);
    fixture.store(&a, object, MIB);
    let AcquireOutcome::Leased(lease) = fixture.acquire_one(&a, object) else {
        panic!("a hit")
    };
    fixture.directory.drain("a").unwrap();
    assert_eq!(fixture.directory.node_statuses()[0].state, "draining");
    fixture.directory.tick(fixture.now);
    let progress = fixture.directory.drain_progress(a.node).unwrap();
    assert_eq!(progress.state, DrainState::AwaitingLeases);
    assert_eq!(progress.leases_outstanding, 1);
    fixture
        .directory
        .release(a.session, &[lease.lease])
        .unwrap();
    fixture.directory.tick(fixture.now);
    assert_eq!(
        fixture.directory.drain_progress(a.node).unwrap().state,
        DrainState::Drained
    );
    assert!(matches!(
        fixture.directory.probe(a.session, &[object]),
        Err(DirectoryError::Drained)
    ));
    assert_eq!(
        fixture.directory.drain("nobody"),
        Err(DirectoryError::UnknownNode("nobody".into()))
    );
    assert_eq!(
        fixture.directory.drain("a"),
        Err(DirectoryError::UnknownNode("a".into())),
        "a drained node has no session left to drain"
    );
    let c = fixture.node("c", MIB);
    fixture.directory.drain("c").unwrap();
    let reopened = fixture.node("c", MIB);
    fixture.directory.tick(fixture.now);
    assert_eq!(
        fixture.directory.drain_progress(c.node).unwrap().state,
        DrainState::Interrupted
    );
    assert!(
        matches!(
            fixture.reserve(&reopened, fixture.object(2), MIB),
            ReserveOutcome::Granted { .. }
        ),
        "the new session is not drained"
    );
    fixture.directory.check_invariants();
}

#[test]
fn one_salt_cannot_take_the_whole_namespace_table() {
    let config = DirectoryConfig {
        namespaces_max: 8,
        namespaces_per_salt_max: 3,
        ..DirectoryConfig::default()
    };
    let mut fixture = Fixture::with_config(config);
    let a = fixture.node("a", 16 * MIB);
    let salted = |salt: Option<&str>, revision: u32| NamespaceDescriptor {
        revision: format!("r{revision}"),
        salt: salt.map(str::to_string),
        ..descriptor()
    };
    // Registers a namespace and stores an object in it: a namespace a replica names is
    // never forgotten to make room.
    let used = |fixture: &mut Fixture, descriptor: NamespaceDescriptor| {
        let registered = fixture.directory.register_namespace(a.session, descriptor);
        if let Ok(namespace) = registered {
            let object = ObjectId {
                namespace,
                ..fixture.object(0)
            };
            // The node's own namespace (revision r1) holds one already.
            let granted = fixture.reserve(&a, object, 4096);
            if matches!(granted, ReserveOutcome::Granted { .. }) {
                fixture.commit_granted(&a, granted, 4096);
            }
        }
        registered
    };
    let default = fixture.object(0);
    fixture.store(&a, default, 4096);
    for revision in 0..3 {
        used(&mut fixture, salted(Some("greedy"), revision)).unwrap();
    }
    // A fourth descriptor of that salt is refused; one it registered already is not.
    assert_eq!(
        used(&mut fixture, salted(Some("greedy"), 3)),
        Err(DirectoryError::Full(Table::NamespacesOfSalt))
    );
    fixture
        .directory
        .register_namespace(a.session, salted(Some("greedy"), 0))
        .unwrap();
    // Other salts, and unsalted namespaces, still register.
    for revision in 0..3 {
        used(&mut fixture, salted(Some("other"), revision)).unwrap();
    }
    used(&mut fixture, salted(None, 0)).unwrap();
    used(&mut fixture, salted(None, 1)).unwrap();
    // The whole table binds first where it is smaller.
    assert_eq!(
        used(&mut fixture, salted(None, 2)),
        Err(DirectoryError::Full(Table::Namespaces))
    );
}

#[test]
fn a_namespace_no_replica_names_makes_room_for_a_new_one_least_recent_first() {
    let config = DirectoryConfig {
        namespaces_max: 4,
        ..DirectoryConfig::default()
    };
    let mut fixture = Fixture::with_config(config);
    let a = fixture.node("a", 16 * MIB);
    let revision = |revision: u32| NamespaceDescriptor {
        revision: format!("v{revision}"),
        ..descriptor()
    };
    let register = |fixture: &mut Fixture, index: u32| {
        fixture
            .directory
            .register_namespace(a.session, revision(index))
    };
    // The node's own namespace holds a replica; v0, v1 and v2 fill the table unused.
    let held = fixture.object(0);
    fixture.store(&a, held, 4096);
    let ids: Vec<NamespaceId> = (0..3)
        .map(|index| register(&mut fixture, index).unwrap())
        .collect();
    // v0 is registered again, so v1 is the least recent unused one: v3 takes its place.
    register(&mut fixture, 0).unwrap();
    let r3 = register(&mut fixture, 3).unwrap();
    let known = |fixture: &Fixture, namespace: NamespaceId| {
        let object = ObjectId {
            namespace,
            ..fixture.object(1)
        };
        fixture.directory.probe(a.session, &[object]).is_ok()
    };
    assert!(known(&fixture, ids[0]) && known(&fixture, ids[2]) && known(&fixture, r3));
    assert_eq!(
        fixture.directory.probe(
            a.session,
            &[ObjectId {
                namespace: ids[1],
                ..fixture.object(1)
            }]
        ),
        Err(DirectoryError::UnknownNamespace),
        "the forgotten namespace"
    );
    // Registering it again works (v2, unused and now least recent, makes room).
    assert_eq!(register(&mut fixture, 1), Ok(ids[1]));
    // Once every namespace holds a replica, a new one finds the table full.
    for namespace in [ids[0], ids[1], r3] {
        let object = ObjectId {
            namespace,
            ..fixture.object(2)
        };
        fixture.store(&a, object, 4096);
    }
    assert_eq!(
        register(&mut fixture, 4),
        Err(DirectoryError::Full(Table::Namespaces))
    );
    fixture.directory.check_invariants();
}
