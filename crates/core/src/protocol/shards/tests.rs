//! The router over shards, against the cores it routes to.

use super::*;
use crate::directory::{AcquireMode, AcquireOutcome};
use crate::directory::{CommitOutcome, NamespaceAccess, ReserveItem, ReserveOutcome};
use crate::model::{
    AllocationId, DomainId, Generation, Location, Medium, OperationId, PoolId, PoolSpec,
    PoolTenancy, PrefixDigest, Scope,
};
use crate::model::{LeaseId, ReplicaId};
const MIB: u64 = 1 << 20;

/// Two nodes (`a`, `b`) on `count` shards, each with a CPU pool of `cpu_bytes`, both
/// mapping one shared pool of `cxl_bytes` in extents of 1 MiB.
struct Cluster {
    shards: Shards,
    now: Timestamp,
    sessions: Vec<SessionId>,
    cpu: Vec<PoolId>,
    cxl: PoolId,
    namespace: crate::model::NamespaceId,
    operation: u64,
}

fn grant() -> PeerRole {
    PeerRole::Node(NodeGrant {
        domains: vec![DomainId(0)],
        namespaces: NamespaceAccess::Any,
    })
}

impl Cluster {
    fn new(count: usize, cpu_bytes: u64, cxl_bytes: u64) -> Cluster {
        let config = DirectoryConfig {
            hash_seed: Some(7),
            ..DirectoryConfig::default()
        };
        let mut shards = Shards::new(config, count);
        let cxl = shards
            .register_shared_pool(PoolSpec {
                name: "cxl0".into(),
                medium: Medium::Cxl,
                scope: Scope::Domain(DomainId(0)),
                capacity_bytes: cxl_bytes,
                page_bytes: 4096,
                extent_bytes: Some(MIB),
                tenancy: PoolTenancy::Shared,
            })
            .unwrap();
        let mut cluster = Cluster {
            shards,
            now: Timestamp::ZERO,
            sessions: Vec::new(),
            cpu: Vec::new(),
            cxl,
            namespace: crate::model::demo_namespace().id().unwrap(),
            operation: 1,
        };
        for name in ["a", "b"] {
            let reply = cluster.shards.handle(
                cluster.now,
                name,
                grant(),
                None,
                DirectoryRequest::Open {
                    write_order: vec![Medium::Cpu, Medium::Cxl],
                    read_order: vec![Medium::Cpu, Medium::Cxl],
                },
            );
            let DirectoryReply::Opened(opened) = reply else {
                panic!("open refused: {reply:?}");
            };
            cluster.sessions.push(opened.session);
            let node = cluster.sessions.len() - 1;
            let spec = PoolSpec {
                name: "cpu".into(),
                medium: Medium::Cpu,
                scope: Scope::Host(opened.node),
                capacity_bytes: cpu_bytes,
                page_bytes: 4096,
                extent_bytes: None,
                tenancy: PoolTenancy::Shared,
            };
            match cluster.call(node, DirectoryRequest::RegisterPool(spec)) {
                DirectoryReply::Pool(pool) => cluster.cpu.push(pool),
                other => panic!("pool refused: {other:?}"),
            }
            let registered = cluster.call(
                node,
                DirectoryRequest::RegisterNamespace(crate::model::demo_namespace()),
            );
            assert!(
                matches!(registered, DirectoryReply::Namespace(_)),
                "{registered:?}"
            );
        }
        cluster.shards.check_invariants();
        cluster
    }

    fn call(&mut self, node: usize, request: DirectoryRequest) -> DirectoryReply {
        let name = ["a", "b"][node];
        let reply = self
            .shards
            .handle(self.now, name, grant(), Some(self.sessions[node]), request);
        self.shards.check_invariants();
        reply
    }

    fn object(&self, index: u32) -> ObjectId {
        ObjectId {
            namespace: self.namespace,
            prefix: PrefixDigest::ROOT.chain(&[index]),
            shard: 0,
            part: 0,
        }
    }

    /// Objects `0..` until each shard owns at least `per_shard` of them.
    fn objects_on_every_shard(&self, per_shard: usize) -> Vec<ObjectId> {
        let mut counts = vec![0; self.shards.count()];
        let mut objects = Vec::new();
        for index in 0.. {
            if counts.iter().all(|count| *count >= per_shard) {
                break;
            }
            let object = self.object(index);
            let shard = self.shards.shard_of(&object);
            if counts[shard] < per_shard {
                counts[shard] += 1;
                objects.push(object);
            }
        }
        objects
    }

    /// Reserves and commits `objects` from `node` as one batch each, at consecutive
    /// offsets of the granted pools (a shared pool's in an extent granted first).
    fn store(&mut self, node: usize, objects: &[ObjectId]) -> Vec<ReplicaId> {
        let items = objects
            .iter()
            .map(|object| crate::directory::ReserveBatchItem {
                operation: self.next_operation(),
                item: ReserveItem {
                    object: *object,
                    length_bytes: 64 << 10,
                },
            })
            .collect();
        let DirectoryReply::ReservedMany(reserved) =
            self.call(node, DirectoryRequest::ReserveMany { items })
        else {
            panic!("reserve refused");
        };
        let mut extent = None;
        let mut commits = Vec::new();
        for (index, outcome) in reserved.into_iter().enumerate() {
            let Ok(ReserveOutcome::Granted { replica, pool, .. }) = outcome else {
                panic!("not granted: {outcome:?}");
            };
            let base = if pool == self.cxl {
                *extent.get_or_insert_with(|| self.grant_extent(node))
            } else {
                0
            };
            commits.push(crate::directory::CommitBatchItem {
                operation: self.next_operation(),
                replica,
                location: Location {
                    pool,
                    allocation: AllocationId(index as u64),
                    generation: Generation(1),
                    offset_bytes: base + index as u64 * (64 << 10),
                    length_bytes: 64 << 10,
                },
            });
        }
        let replicas = commits.iter().map(|item| item.replica).collect();
        let DirectoryReply::CommittedMany(committed) =
            self.call(node, DirectoryRequest::CommitMany { items: commits })
        else {
            panic!("commit refused");
        };
        assert!(committed
            .iter()
            .all(|outcome| *outcome == Ok(CommitOutcome::Committed)));
        replicas
    }

    fn grant_extent(&mut self, node: usize) -> u64 {
        let operation = self.next_operation();
        let pool = self.cxl;
        match self.call(node, DirectoryRequest::GrantExtent { operation, pool }) {
            DirectoryReply::Extent(crate::directory::ExtentGrant::Granted(extent)) => {
                extent.offset_bytes
            }
            other => panic!("no extent: {other:?}"),
        }
    }

    fn next_operation(&mut self) -> OperationId {
        self.operation += 1;
        OperationId(self.operation)
    }
}

#[test]
fn each_object_lives_in_its_shard_and_batches_answer_in_order() {
    let mut cluster = Cluster::new(3, 64 * MIB, 8 * MIB);
    let objects = cluster.objects_on_every_shard(4);
    let replicas = cluster.store(0, &objects);
    for (object, replica) in objects.iter().zip(&replicas) {
        let shard = cluster.shards.shard_of(object);
        assert_eq!(replica.shard(), shard, "a replica id names its shard");
        for (index, core) in cluster.shards.cores().iter().enumerate() {
            assert_eq!(
                !core.ready_locations(object).is_empty(),
                index == shard,
                "{object:?} is READY in its shard only"
            );
        }
    }
    let probed = cluster.call(
        1,
        DirectoryRequest::Probe {
            objects: objects.clone(),
        },
    );
    let DirectoryReply::Probed(outcomes) = probed else {
        panic!("{probed:?}");
    };
    assert_eq!(outcomes.len(), objects.len());
    // The writer reads them: its own CPU pool, which the other node cannot map.
    let acquired = cluster.call(
        0,
        DirectoryRequest::Acquire {
            objects: objects.clone(),
            mode: AcquireMode::Each,
        },
    );
    let DirectoryReply::Acquired(outcomes) = acquired else {
        panic!("{acquired:?}");
    };
    let leases: Vec<LeaseId> = outcomes
        .iter()
        .zip(&replicas)
        .map(|(outcome, replica)| match outcome {
            AcquireOutcome::Leased(lease) => {
                assert_eq!(lease.replica, *replica, "answers in the request's order");
                assert_eq!(lease.lease.shard(), replica.shard());
                lease.lease
            }
            other => panic!("a miss: {other:?}"),
        })
        .collect();
    assert_eq!(cluster.shards.counts().leases, leases.len() as u64);
    let released = cluster.call(0, DirectoryRequest::Release { leases });
    assert!(
        matches!(released, DirectoryReply::Released(_)),
        "{released:?}"
    );
    assert_eq!(cluster.shards.counts().leases, 0);
}

#[test]
fn each_shard_reserves_against_its_share_and_usage_adds_up() {
    let mut cluster = Cluster::new(2, 10 * MIB + 1, 8 * MIB);
    let usage = cluster.shards.usage();
    let cpu = usage
        .iter()
        .find(|report| report.pool == cluster.cpu[0])
        .unwrap();
    assert_eq!(cpu.usage.capacity_bytes, 10 * MIB + 1);
    let budgets: Vec<u64> = cluster
        .shards
        .cores()
        .iter()
        .map(|core| {
            core.usage()
                .into_iter()
                .find(|report| report.pool == cluster.cpu[0])
                .unwrap()
                .usage
                .capacity_bytes
        })
        .collect();
    assert_eq!(budgets, vec![5 * MIB + 1, 5 * MIB]);
    let objects = cluster.objects_on_every_shard(2);
    cluster.store(0, &objects);
    let usage = cluster.shards.usage();
    let cpu = usage
        .iter()
        .find(|report| report.pool == cluster.cpu[0])
        .unwrap();
    assert_eq!(cpu.usage.allocated_bytes, objects.len() as u64 * (64 << 10));
}

#[test]
fn a_manifest_one_shard_cannot_lease_whole_leaves_no_lease_anywhere() {
    let mut cluster = Cluster::new(2, 64 * MIB, 8 * MIB);
    let objects = cluster.objects_on_every_shard(2);
    cluster.store(0, &objects[..objects.len() - 1]);
    let acquired = cluster.call(
        0,
        DirectoryRequest::Acquire {
            objects: objects.clone(),
            mode: AcquireMode::Manifest,
        },
    );
    let DirectoryReply::Acquired(outcomes) = acquired else {
        panic!("{acquired:?}");
    };
    assert!(outcomes
        .iter()
        .all(|outcome| !matches!(outcome, AcquireOutcome::Leased(_))));
    assert_eq!(cluster.shards.counts().leases, 0, "no lease is left behind");
}

/// A node's extent holds replicas of objects of both shards: every shard refuses its
/// return while any of them, in either shard, is left, and all take it back after the
/// last reclaim (`check_invariants` compares the shards' extents after every call).
#[test]
fn an_extent_returns_only_once_its_last_replica_of_any_shard_is_reclaimed() {
    // CPU pools hold one object each: the rest goes to the shared pool.
    let mut cluster = Cluster::new(2, 0x10000, 4 * MIB);
    let objects = cluster.objects_on_every_shard(3);
    let replicas = cluster.store(0, &objects);
    let mut in_cxl: Vec<(ObjectId, ReplicaId, Location)> = Vec::new();
    for (object, replica) in objects.iter().zip(replicas) {
        let shard = cluster.shards.shard_of(object);
        if let Some(location) = cluster.shards.cores()[shard]
            .ready_locations(object)
            .into_iter()
            .find(|location| location.pool == cluster.cxl)
        {
            in_cxl.push((*object, replica, location));
        }
    }
    let shards: std::collections::BTreeSet<usize> = in_cxl
        .iter()
        .map(|(_, replica, _)| replica.shard())
        .collect();
    assert_eq!(shards.len(), 2, "both shards hold replicas in the extent");
    let extent = in_cxl[0].2.offset_bytes / MIB * MIB;
    // The last to go is of the other shard than the first ones.
    let first_shard = in_cxl[0].1.shard();
    in_cxl.sort_by_key(|(_, replica, _)| replica.shard() != first_shard);
    let give_back = |cluster: &mut Cluster| {
        let operation = cluster.next_operation();
        let request = DirectoryRequest::ReturnExtent {
            operation,
            pool: cluster.cxl,
            offset_bytes: extent,
            owner_word: None,
        };
        match cluster.call(0, request) {
            DirectoryReply::ExtentReturned(answer) => answer,
            other => panic!("{other:?}"),
        }
    };
    for (object, replica, _) in &in_cxl {
        let retired = cluster.call(
            0,
            DirectoryRequest::Retire {
                object: *object,
                replica: *replica,
                released: Vec::new(),
            },
        );
        assert!(matches!(retired, DirectoryReply::Retired(_)), "{retired:?}");
    }
    let DirectoryReply::Tasks(tasks) = cluster.call(0, DirectoryRequest::PollTasks { max: 64 })
    else {
        panic!("no tasks");
    };
    let reclaims: Vec<ReplicaId> = in_cxl
        .iter()
        .map(|(_, replica, _)| {
            assert!(tasks.iter().any(|task| matches!(
                task.kind,
                crate::directory::TaskKind::Reclaim { replica: reclaimed, .. }
                    if reclaimed == *replica
            )));
            *replica
        })
        .collect();
    for (acked, replica) in reclaims.iter().enumerate() {
        assert_eq!(
            give_back(&mut cluster),
            crate::directory::ExtentReturn::InUse,
            "returned with {} replicas left",
            reclaims.len() - acked
        );
        let acknowledged = cluster.call(0, DirectoryRequest::ReclaimAck { replica: *replica });
        assert!(
            matches!(acknowledged, DirectoryReply::Reclaimed(_)),
            "{acknowledged:?}"
        );
    }
    assert_eq!(
        give_back(&mut cluster),
        crate::directory::ExtentReturn::Returned
    );
}
