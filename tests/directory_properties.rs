//! Property tests of the directory core: random sequences of operations from several
//! sessions (crashes and restarts, duplicated commits, resolves of lost replies, expiry)
//! keep every invariant after every step, and shrink to a minimal failing sequence.

use kvtier::directory::*;
use kvtier::model::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

const NODES: usize = 3;
const BYTES: u64 = 16 << 10;

#[derive(Clone, Debug)]
enum Action {
    Restart(usize),
    Store {
        node: usize,
        object: u8,
        commit: bool,
    },
    RetryCommit(usize),
    ResolveLast(usize),
    Acquire {
        node: usize,
        objects: Vec<u8>,
        manifest: bool,
    },
    Release {
        node: usize,
        index: usize,
    },
    Retire {
        node: usize,
        index: usize,
    },
    PollAndAck(usize),
    Heartbeat(usize),
    Advance(u16),
}

fn action() -> impl Strategy<Value = Action> {
    let node = 0..NODES;
    prop_oneof![
        1 => node.clone().prop_map(Action::Restart),
        6 => (node.clone(), 0..12u8, any::<bool>()).prop_map(|(node, object, commit)| Action::Store { node, object, commit }),
        2 => node.clone().prop_map(Action::RetryCommit),
        2 => node.clone().prop_map(Action::ResolveLast),
        5 => (node.clone(), prop::collection::vec(0..12u8, 1..4), any::<bool>())
            .prop_map(|(node, objects, manifest)| Action::Acquire { node, objects, manifest }),
        4 => (node.clone(), 0..8usize).prop_map(|(node, index)| Action::Release { node, index }),
        3 => (node.clone(), 0..8usize).prop_map(|(node, index)| Action::Retire { node, index }),
        3 => node.clone().prop_map(Action::PollAndAck),
        3 => node.clone().prop_map(Action::Heartbeat),
        2 => (1..3000u16).prop_map(Action::Advance),
    ]
}

struct NodeState {
    session: SessionId,
    next_operation: u64,
    leases: Vec<Lease>,
    committed: Vec<ReplicaId>,
    reserved: Vec<(ReplicaId, PoolId)>,
    last_commit: Option<(OperationId, ReplicaId, Location, CommitOutcome)>,
}

struct Harness {
    directory: Directory,
    now: Timestamp,
    nodes: Vec<NodeState>,
    namespace: NamespaceId,
    /// First location seen for each replica: content (and its place) never changes.
    locations: HashMap<ReplicaId, Location>,
    cpu_owner: HashMap<PoolId, NodeId>,
}

fn descriptor() -> NamespaceDescriptor {
    NamespaceDescriptor {
        model: "prop".into(),
        revision: "1".into(),
        adapter: None,
        kv_dtype: KvDtype::Int8,
        quantization: None,
        layers: 1,
        kv_heads: 1,
        head_dim: 16,
        block_tokens: 16,
        format_version: 1,
        chunk_tokens: 16,
        tensor_parallel: 1,
        pipeline_parallel: 1,
    }
}

impl Harness {
    fn new() -> Harness {
        let mut directory = Directory::new(DirectoryConfig {
            lease_duration: Duration::from_secs(2),
            reservation_duration: Duration::from_secs(2),
            suspect_after: Duration::from_secs(3),
            fence_after: Duration::from_secs(6),
            ..DirectoryConfig::default()
        });
        directory
            .register_pool(
                None,
                PoolSpec {
                    name: "cxl".into(),
                    medium: Medium::Cxl,
                    scope: Scope::Domain(DomainId(1)),
                    capacity_bytes: 5 * BYTES,
                    page_bytes: 4096,
                    extent_bytes: Some(BYTES),
                },
            )
            .unwrap();
        let mut harness = Harness {
            directory,
            now: Timestamp::ZERO,
            nodes: Vec::new(),
            namespace: descriptor().id().unwrap(),
            locations: HashMap::new(),
            cpu_owner: HashMap::new(),
        };
        for node in 0..NODES {
            let state = harness.open(node);
            harness.nodes.push(state);
        }
        harness
    }

    fn open(&mut self, node: usize) -> NodeState {
        let request = OpenRequest {
            node_name: format!("n{node}"),
            write_order: if node == 0 {
                vec![Medium::Cpu, Medium::Cxl]
            } else {
                vec![Medium::Cxl, Medium::Cpu]
            },
            read_order: vec![Medium::Cpu, Medium::Cxl],
            domains: if node == 2 { vec![] } else { vec![DomainId(1)] },
            namespaces: NamespaceAccess::Any,
        };
        let reply = self.directory.open(self.now, request).unwrap();
        let spec = PoolSpec {
            name: format!("cpu{node}"),
            medium: Medium::Cpu,
            scope: Scope::Host(reply.node),
            capacity_bytes: 3 * BYTES,
            page_bytes: 4096,
            extent_bytes: None,
        };
        let pool = self
            .directory
            .register_pool(Some(reply.session), spec)
            .unwrap();
        self.cpu_owner.insert(pool, reply.node);
        self.directory
            .register_namespace(reply.session, descriptor())
            .unwrap();
        NodeState {
            session: reply.session,
            next_operation: 0,
            leases: vec![],
            committed: vec![],
            reserved: vec![],
            last_commit: None,
        }
    }

    fn object(&self, index: u8) -> ObjectId {
        ObjectId {
            namespace: self.namespace,
            prefix: PrefixDigest::ROOT.chain(&[u32::from(index)]),
            shard: 0,
            part: 0,
        }
    }

    fn operation(&mut self, node: usize) -> OperationId {
        self.nodes[node].next_operation += 1;
        OperationId(self.nodes[node].next_operation)
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Restart(node) => self.nodes[node] = self.open(node),
            Action::Store {
                node,
                object,
                commit,
            } => self.store(node, object, commit),
            Action::RetryCommit(node) => {
                if let Some((operation, replica, location, outcome)) = self.nodes[node].last_commit
                {
                    let again = self.directory.commit(
                        self.now,
                        self.nodes[node].session,
                        operation,
                        replica,
                        location,
                    );
                    if let Ok(again) = again {
                        assert_eq!(again, outcome, "a retried commit changed its outcome");
                    }
                }
            }
            Action::ResolveLast(node) => {
                let session = self.nodes[node].session;
                let lost = self.operation(node);
                if let Ok(outcome) = self.directory.resolve(session, session, lost) {
                    assert_eq!(outcome, ResolveOutcome::NotApplied);
                }
            }
            Action::Acquire {
                node,
                objects,
                manifest,
            } => self.acquire(node, &objects, manifest),
            Action::Release { node, index } => {
                if index < self.nodes[node].leases.len() {
                    let lease = self.nodes[node].leases.swap_remove(index);
                    let _ = self
                        .directory
                        .release(self.nodes[node].session, &[lease.lease]);
                }
            }
            Action::Retire { node, index } => {
                if index < self.nodes[node].committed.len() {
                    let replica = self.nodes[node].committed.swap_remove(index);
                    let _ = self
                        .directory
                        .retire(Some(self.nodes[node].session), replica);
                }
            }
            Action::PollAndAck(node) => {
                let session = self.nodes[node].session;
                for task in self
                    .directory
                    .poll_tasks(self.now, session, 8)
                    .unwrap_or_default()
                {
                    let replica = match task.kind {
                        TaskKind::Reclaim { replica, .. } => replica,
                        TaskKind::Demote {
                            source,
                            target,
                            target_pool,
                        } => {
                            self.demote(session, source, target, target_pool);
                            continue;
                        }
                    };
                    for state in &self.nodes {
                        assert!(
                            state.leases.iter().all(|lease| lease.replica != replica || lease.deadline <= self.now),
                            "reclaim while leased"
                        );
                    }
                    assert_eq!(
                        self.directory.reclaim_ack(session, replica),
                        Ok(ReclaimOutcome::Freed)
                    );
                }
            }
            Action::Heartbeat(node) => {
                let session = self.nodes[node].session;
                if self.directory.heartbeat(self.now, session, None).is_err() {
                    self.nodes[node] = self.open(node);
                }
            }
            Action::Advance(milliseconds) => {
                self.now = self.now + Duration::from_millis(u64::from(milliseconds));
                self.directory.tick(self.now);
                for state in &mut self.nodes {
                    state.leases.retain(|lease| lease.deadline > self.now);
                }
            }
        }
        self.directory.check_invariants();
    }

    /// Carries out a demotion: the copy lands in a fresh extent, or the target is aborted.
    fn demote(
        &mut self,
        session: SessionId,
        source: Location,
        target: ReplicaId,
        target_pool: PoolId,
    ) {
        let node = self
            .nodes
            .iter()
            .position(|state| state.session == session)
            .expect("a live node polled");
        let grant_operation = self.operation(node);
        match self
            .directory
            .grant_extent(self.now, session, grant_operation, target_pool)
        {
            Ok(ExtentGrant::Granted(extent)) => {
                let location = Location {
                    pool: target_pool,
                    offset_bytes: extent.offset_bytes,
                    ..source
                };
                let node = self
                    .nodes
                    .iter()
                    .position(|state| state.session == session)
                    .expect("a live node polled");
                let operation = self.operation(node);
                let outcome = self
                    .directory
                    .commit(self.now, session, operation, target, location);
                if outcome == Ok(CommitOutcome::Committed) {
                    assert!(
                        self.locations.insert(target, location).is_none(),
                        "replica committed twice"
                    );
                    self.nodes[node].committed.push(target);
                }
            }
            _ => {
                let _ = self.directory.abort(session, target);
            }
        }
    }

    fn store(&mut self, node: usize, object: u8, commit: bool) {
        let session = self.nodes[node].session;
        let item = ReserveItem {
            object: self.object(object),
            length_bytes: BYTES,
        };
        let operation = self.operation(node);
        let outcome = self.directory.reserve(self.now, session, operation, item);
        if let Ok(ReserveOutcome::Granted { replica, pool, .. }) = outcome {
            self.nodes[node].reserved.push((replica, pool));
        }
        if !commit {
            return;
        }
        let Some((replica, pool)) = self.nodes[node].reserved.pop() else {
            return;
        };
        let location = Location {
            pool,
            allocation: AllocationId(replica.0),
            generation: Generation(1),
            offset_bytes: 0,
            length_bytes: BYTES,
        };
        let operation = self.operation(node);
        if let Ok(outcome) = self
            .directory
            .commit(self.now, session, operation, replica, location)
        {
            self.nodes[node].last_commit = Some((operation, replica, location, outcome));
            if outcome == CommitOutcome::Committed {
                self.nodes[node].committed.push(replica);
                assert!(
                    self.locations.insert(replica, location).is_none(),
                    "replica committed twice"
                );
            }
        }
    }

    fn acquire(&mut self, node: usize, objects: &[u8], manifest: bool) {
        let session = self.nodes[node].session;
        let ids: Vec<ObjectId> = objects.iter().map(|index| self.object(*index)).collect();
        let probed = self.directory.probe(session, &ids);
        let mode = if manifest {
            AcquireMode::Manifest
        } else {
            AcquireMode::Each
        };
        let Ok(outcomes) = self.directory.acquire(self.now, session, &ids, mode) else {
            return;
        };
        let Ok(probed) = probed else { return };
        assert_eq!(outcomes.len(), ids.len(), "one result per item");
        let leased = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, AcquireOutcome::Leased(_)))
            .count();
        assert!(
            !manifest || leased == 0 || leased == ids.len(),
            "manifest partly leased"
        );
        for (outcome, probe) in outcomes.into_iter().zip(probed) {
            assert_eq!(
                matches!(probe, ProbeOutcome::Hit { .. }),
                !matches!(outcome, AcquireOutcome::Miss),
                "probe and acquire disagree without anything in between"
            );
            if let AcquireOutcome::Leased(lease) = outcome {
                assert_eq!(
                    self.locations.get(&lease.replica),
                    Some(&lease.location),
                    "content moved"
                );
                if let Some(owner) = self.cpu_owner.get(&lease.location.pool) {
                    assert_eq!(
                        owner.0 as usize, node,
                        "private replica leased to another node"
                    );
                }
                self.nodes[node].leases.push(lease);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_every_invariant(actions in prop::collection::vec(action(), 1..160)) {
        let mut harness = Harness::new();
        for action in actions {
            harness.apply(action);
        }
    }
}
