//! Staged (SSD) pools in the directory core: never a store target nor a hit, chosen by
//! demote-not-evict for objects the pool admits, probed on SSD once the spill commits, and
//! adopted without holding reclaims back.

use super::tests::descriptor;
use super::*;
use crate::model::{
    AllocationId, Generation, Location, Medium, ObjectId, OperationId, PrefixDigest,
};
use std::time::Duration;

const CHUNK: u64 = 256 << 10;

struct Node {
    directory: Directory,
    session: SessionId,
    cpu: PoolId,
    ssd: PoolId,
    namespace: NamespaceId,
    now: Timestamp,
    operation: u64,
}

impl Node {
    /// One node whose write order names the SSD first (it must be ignored), a CPU pool of
    /// four chunks and an SSD pool admitting objects after `admit` accesses.
    fn new(admit: u32) -> Node {
        let mut directory = Directory::new(DirectoryConfig::default());
        let now = Timestamp::ZERO;
        let reply = directory
            .open(
                now,
                OpenRequest {
                    node_name: "a".into(),
                    write_order: vec![Medium::Ssd, Medium::Cpu],
                    read_order: vec![Medium::Cpu, Medium::Ssd],
                    domains: Vec::new(),
                    namespaces: NamespaceAccess::Any,
                },
            )
            .unwrap();
        let pool = |name: &str, medium, capacity_bytes| PoolSpec {
            name: name.into(),
            medium,
            scope: Scope::Host(reply.node),
            capacity_bytes,
            page_bytes: 4096,
            extent_bytes: None,
            tenancy: crate::model::PoolTenancy::Shared,
        };
        let session = Some(reply.session);
        let cpu = directory
            .register_pool(session, pool("a-cpu", Medium::Cpu, 4 * CHUNK))
            .unwrap();
        let ssd = directory
            .register_pool(session, pool("a-ssd", Medium::Ssd, 64 * CHUNK))
            .unwrap();
        directory.admit_after(reply.session, ssd, admit).unwrap();
        let namespace = directory
            .register_namespace(reply.session, descriptor())
            .unwrap();
        Node {
            directory,
            session: reply.session,
            cpu,
            ssd,
            namespace,
            now,
            operation: 0,
        }
    }

    fn object(&self, index: u32) -> ObjectId {
        ObjectId {
            namespace: self.namespace,
            prefix: PrefixDigest::ROOT.chain(&[index]),
            shard: 0,
            part: 0,
        }
    }

    fn operation(&mut self) -> OperationId {
        self.operation += 1;
        OperationId(self.operation)
    }

    fn commit(&mut self, replica: ReplicaId, location: Location) -> CommitOutcome {
        let operation = self.operation();
        self.directory
            .commit(self.now, self.session, operation, replica, location)
            .unwrap()
    }

    /// Stores chunk `index` at slot `index` modulo 4: it must land in the CPU pool.
    fn store(&mut self, index: u32) {
        let operation = self.operation();
        let item = ReserveItem {
            object: self.object(index),
            length_bytes: CHUNK,
        };
        let granted = self
            .directory
            .reserve(self.now, self.session, operation, item)
            .unwrap();
        let ReserveOutcome::Granted { replica, pool, .. } = granted else {
            panic!("expected a grant, got {granted:?}");
        };
        assert_eq!(pool, self.cpu, "a store never lands in the SSD pool");
        let location = at(pool, u64::from(index % 4) * CHUNK);
        assert_eq!(self.commit(replica, location), CommitOutcome::Committed);
    }

    /// Reads chunk `index` once (an access).
    fn read(&mut self, index: u32) {
        let object = self.object(index);
        let outcomes = self
            .directory
            .acquire(self.now, self.session, &[object], AcquireMode::Each)
            .unwrap();
        let AcquireOutcome::Leased(lease) = &outcomes[0] else {
            panic!("expected a hit, got {outcomes:?}");
        };
        self.directory
            .release(self.session, &[lease.lease])
            .unwrap();
    }

    /// Advances the clock past the young-replica protection and ticks (eviction runs);
    /// acknowledges the reclaims handed out and returns every task.
    fn tick_later(&mut self) -> Vec<Task> {
        self.now = self.now + Duration::from_secs(30);
        self.directory
            .heartbeat(self.now, self.session, None)
            .unwrap();
        self.directory.tick(self.now);
        self.directory.check_invariants();
        self.acknowledge()
    }

    /// Polls the node's tasks, acknowledges the reclaims among them and returns them all.
    fn acknowledge(&mut self) -> Vec<Task> {
        let tasks = self
            .directory
            .poll_tasks(self.now, self.session, 64)
            .unwrap();
        for task in &tasks {
            if let TaskKind::Reclaim { replica, .. } = task.kind {
                self.directory.reclaim_ack(self.session, replica).unwrap();
            }
        }
        tasks
    }

    fn probe(&self, index: u32) -> ProbeOutcome {
        self.directory
            .probe(self.session, &[self.object(index)])
            .unwrap()[0]
    }
}

fn at(pool: PoolId, offset_bytes: u64) -> Location {
    Location {
        pool,
        allocation: AllocationId(offset_bytes),
        generation: Generation(1),
        offset_bytes,
        length_bytes: CHUNK,
    }
}

fn demotions(tasks: &[Task]) -> Vec<(Location, ReplicaId, PoolId)> {
    tasks
        .iter()
        .filter_map(|task| match task.kind {
            TaskKind::Demote {
                source,
                target,
                target_pool,
            } => Some((source, target, target_pool)),
            _ => None,
        })
        .collect()
}

#[test]
fn an_evicted_chunk_spills_to_the_ssd_pool_and_probes_on_ssd_never_as_a_hit() {
    let mut node = Node::new(1);
    for index in 0..4 {
        node.store(index);
    }
    let spills = demotions(&node.tick_later());
    assert!(!spills.is_empty(), "a full CPU pool spills its victims");
    for (source, target, target_pool) in spills {
        assert_eq!(target_pool, node.ssd);
        let index = (source.offset_bytes / CHUNK) as u32;
        // The source stays a hit while it is written.
        assert!(matches!(node.probe(index), ProbeOutcome::Hit { .. }));
        let copy = at(node.ssd, source.offset_bytes);
        // Not a duplicate of the memory copy: another tier of the same scope.
        assert_eq!(node.commit(target, copy), CommitOutcome::Committed);
        assert_eq!(
            node.probe(index),
            ProbeOutcome::OnSsd {
                length_bytes: CHUNK
            }
        );
        let object = node.object(index);
        let acquired = node
            .directory
            .acquire(node.now, node.session, &[object], AcquireMode::Each)
            .unwrap();
        assert_eq!(
            acquired,
            vec![AcquireOutcome::Miss],
            "nothing maps an SSD replica"
        );
    }
    node.directory.check_invariants();
}

#[test]
fn the_ssd_pool_admits_an_object_only_after_enough_accesses() {
    let mut node = Node::new(2);
    for index in 0..4 {
        node.store(index);
    }
    // Chunks 0 and 1 are read once more: two accesses. 2 and 3 were only stored.
    node.read(0);
    node.read(1);
    let mut spilled = Vec::new();
    let mut evicted = 0;
    for index in 4..12 {
        let tasks = node.tick_later();
        evicted += tasks.len();
        for (_, target, _) in demotions(&tasks) {
            let object = node.directory.replicas.get(target).unwrap().object;
            spilled.push(object);
            assert_eq!(
                node.commit(target, at(node.ssd, u64::from(index) * CHUNK)),
                CommitOutcome::Committed
            );
        }
        node.acknowledge();
        node.store(index);
    }
    assert!(evicted > 0, "the full pool evicted");
    let twice = [node.object(0), node.object(1)];
    assert!(
        spilled.iter().all(|object| twice.contains(object)),
        "only chunks accessed twice are spilled: {spilled:?}"
    );
    assert!(!spilled.is_empty(), "a chunk accessed twice is spilled");
    for index in [2, 3] {
        assert!(!matches!(node.probe(index), ProbeOutcome::OnSsd { .. }));
    }
}

#[test]
fn adopting_ssd_replicas_holds_no_reclaim_back() {
    let mut node = Node::new(1);
    let holding = Holding {
        object: node.object(7),
        location: at(node.ssd, 0),
    };
    node.directory
        .recover_until(Timestamp::ZERO + Duration::from_secs(3600));
    node.directory.tick(node.now);
    let adopted = node
        .directory
        .adopt(node.now, node.session, &[holding])
        .unwrap();
    assert_eq!(adopted, vec![AdoptOutcome::Adopted]);
    assert!(!node.directory.holding_reclaims(node.now));
    assert_eq!(
        node.probe(7),
        ProbeOutcome::OnSsd {
            length_bytes: CHUNK
        }
    );
}
