//! Property tests of the directory core: random sequences of operations from several
//! sessions (crashes and restarts, duplicated commits, resolves of lost replies, expiry,
//! CXL extents granted, written into and given back) keep every invariant after every step,
//! and shrink to a minimal failing sequence.
//!
//! The harness is also a model of the calls, so a regression that makes operations fail
//! cannot pass by making every check vacuous:
//! * it predicts each session's state (fenced exactly when silent for `fence_after` at a
//!   tick, suspect when silent for `suspect_after`), and every call of a fenced session
//!   must be refused as `Fenced` while every call of an open one must be answered;
//! * for an open session it predicts the calls that must succeed and how: committing its own
//!   unexpired reservation at a place it owns, retrying that commit, resolving an unseen
//!   operation, releasing a lease it holds, giving back an extent (`Returned` exactly when
//!   none of its committed replicas is inside, else `InUse`; `NotOwner` for one it does not
//!   hold), and refusing a commit into an extent it does not hold;
//! * it checks domain isolation: the node outside the CXL pool's domain is refused extents,
//!   is never granted CXL bytes, never sees or leases a CXL replica and never gets a
//!   demotion into CXL;
//! * outcomes that depend on the directory's eviction choices (a reserve granted or skipped,
//!   a retire, an extent granted or full, a demotion) are counted over the whole run, and
//!   each kind must succeed a meaningful share of the time.

use kvtier_core::directory::*;
use kvtier_core::model::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

const NODES: usize = 3;
/// The node whose session maps no sharing domain: it must never touch the CXL pool.
const OUTSIDE_DOMAIN: usize = 2;
const BYTES: u64 = 16 << 10;
/// Two objects per extent, four extents in the CXL pool.
const EXTENT_BYTES: u64 = 2 * BYTES;
const CXL_BYTES: u64 = 4 * EXTENT_BYTES;
const RESERVATION: Duration = Duration::from_secs(2);
const LEASE: Duration = Duration::from_secs(2);
const SUSPECT_AFTER: Duration = Duration::from_secs(3);
const FENCE_AFTER: Duration = Duration::from_secs(6);

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
    GrantExtent(usize),
    ReturnExtent {
        node: usize,
        index: usize,
    },
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
        1 => node.clone().prop_map(Action::GrantExtent),
        1 => (node.clone(), 0..8usize).prop_map(|(node, index)| Action::ReturnExtent { node, index }),
        2 => (1..3000u16).prop_map(Action::Advance),
    ]
}

/// Successes per kind of call whose outcome the model does not predict exactly, summed
/// over every case of the run.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    reserves: u64,
    reserves_granted: u64,
    cpu_commits: u64,
    cxl_commits: u64,
    acquires: u64,
    acquires_leased: u64,
    releases: u64,
    retires: u64,
    retires_done: u64,
    reclaims: u64,
    extent_grants: u64,
    extents_granted: u64,
    extents_returned: u64,
    extents_in_use: u64,
    demotions: u64,
    demotions_committed: u64,
    stray_commits_refused: u64,
    fenced_refusals: u64,
    /// Replication tasks: copies into the CXL pool, pushes, and receives committed.
    replications: u64,
    pushes: u64,
    receives_committed: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.reserves += other.reserves;
        self.reserves_granted += other.reserves_granted;
        self.cpu_commits += other.cpu_commits;
        self.cxl_commits += other.cxl_commits;
        self.acquires += other.acquires;
        self.acquires_leased += other.acquires_leased;
        self.releases += other.releases;
        self.retires += other.retires;
        self.retires_done += other.retires_done;
        self.reclaims += other.reclaims;
        self.extent_grants += other.extent_grants;
        self.extents_granted += other.extents_granted;
        self.extents_returned += other.extents_returned;
        self.extents_in_use += other.extents_in_use;
        self.demotions += other.demotions;
        self.demotions_committed += other.demotions_committed;
        self.stray_commits_refused += other.stray_commits_refused;
        self.fenced_refusals += other.fenced_refusals;
        self.replications += other.replications;
        self.pushes += other.pushes;
        self.receives_committed += other.receives_committed;
    }

    /// Every kind of call succeeded often enough for its checks to mean something. Each
    /// floor is about a third of the lowest count (or share) seen over a dozen seeds of 96
    /// cases, so it holds for the default seed and others while a kind of call that stopped
    /// working fails it.
    fn check(&self) {
        let shares = [
            ("reserves granted", self.reserves_granted, self.reserves, 40),
            (
                "acquires that leased",
                self.acquires_leased,
                self.acquires,
                3,
            ),
            ("retires applied", self.retires_done, self.retires, 50),
            (
                "extent grants granted",
                self.extents_granted,
                self.extent_grants,
                40,
            ),
        ];
        for (what, done, of, percent_min) in shares {
            assert!(
                done > 0 && done * 100 >= of * percent_min,
                "{what}: only {done} of {of} (at least {percent_min}% expected)\n{self:#?}"
            );
        }
        let floors = [
            ("CPU commits", self.cpu_commits, 100),
            ("CXL commits", self.cxl_commits, 60),
            ("releases", self.releases, 8),
            ("reclaims", self.reclaims, 40),
            ("extents returned", self.extents_returned, 3),
            ("extents still in use", self.extents_in_use, 4),
            ("demotions committed", self.demotions_committed, 1),
            ("stray CXL commits refused", self.stray_commits_refused, 60),
            ("calls of fenced sessions refused", self.fenced_refusals, 90),
            ("replications into CXL", self.replications, 1),
            ("replication pushes", self.pushes, 1),
            ("replications received", self.receives_committed, 1),
        ];
        for (what, count, floor) in floors {
            assert!(count >= floor, "{what}: {count} < {floor}\n{self:#?}");
        }
    }
}

/// A reservation the node holds, with the deadline the directory gave it.
#[derive(Clone, Copy, Debug)]
struct Reservation {
    replica: ReplicaId,
    pool: PoolId,
    deadline: Timestamp,
}

struct NodeState {
    session: SessionId,
    /// The model's view: open until fenced by silence (a restart replaces the state).
    open: bool,
    last_heartbeat: Timestamp,
    next_operation: u64,
    leases: Vec<Lease>,
    committed: Vec<ReplicaId>,
    reserved: Vec<Reservation>,
    last_commit: Option<(OperationId, ReplicaId, Location, CommitOutcome)>,
    /// CXL extents this session holds (start offsets).
    extents: Vec<u64>,
    /// Occupied object slots inside them: offset → committed replica.
    slots: HashMap<u64, ReplicaId>,
}

struct Harness {
    directory: Directory,
    now: Timestamp,
    nodes: Vec<NodeState>,
    /// An unsalted namespace and a salted one: objects alternate between the two, and each
    /// node's CPU memory is a partition per salt group.
    namespaces: [NamespaceId; 2],
    cxl_pool: PoolId,
    /// First location seen for each replica: content (and its place) never changes.
    locations: HashMap<ReplicaId, Location>,
    cpu_owner: HashMap<PoolId, NodeId>,
    /// The salt group (index into `namespaces`) of each CPU partition.
    partition_of: HashMap<PoolId, usize>,
    /// Leases on CXL replicas of sessions that ended: they stay until their deadline.
    orphan_leases: Vec<Lease>,
    tally: Tally,
}

/// The salt of group `group` (0: unsalted).
fn salt(group: usize) -> Option<String> {
    (group == 1).then(|| "tenant-b".to_string())
}

fn descriptor(group: usize) -> NamespaceDescriptor {
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
        salt: salt(group),
    }
}

fn in_domain(node: usize) -> bool {
    node != OUTSIDE_DOMAIN
}

impl Harness {
    fn new() -> Harness {
        // The salted group may hold at most one extent's worth of the CXL pool.
        let quota = TierQuota {
            cxl_bytes: Some(EXTENT_BYTES),
            ssd_bytes: None,
        };
        let mut directory = Directory::new(DirectoryConfig {
            lease_duration: LEASE,
            reservation_duration: RESERVATION,
            suspect_after: SUSPECT_AFTER,
            fence_after: FENCE_AFTER,
            hash_seed: Some(7),
            group_quotas: [(SaltGroup::of(salt(1).as_deref()), quota)].into(),
            ..DirectoryConfig::default()
        });
        let cxl_pool = directory
            .register_pool(
                None,
                PoolSpec {
                    name: "cxl".into(),
                    medium: Medium::Cxl,
                    scope: Scope::Domain(DomainId(1)),
                    capacity_bytes: CXL_BYTES,
                    page_bytes: 4096,
                    extent_bytes: Some(EXTENT_BYTES),
                    tenancy: kvtier_core::model::PoolTenancy::Shared,
                },
            )
            .unwrap();
        let mut harness = Harness {
            directory,
            now: Timestamp::ZERO,
            nodes: Vec::new(),
            namespaces: [descriptor(0).id().unwrap(), descriptor(1).id().unwrap()],
            cxl_pool,
            locations: HashMap::new(),
            cpu_owner: HashMap::new(),
            partition_of: HashMap::new(),
            orphan_leases: Vec::new(),
            tally: Tally::default(),
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
            domains: if in_domain(node) {
                vec![DomainId(1)]
            } else {
                vec![]
            },
            namespaces: NamespaceAccess::Any,
        };
        let reply = self.directory.open(self.now, request).unwrap();
        for group in 0..2 {
            let spec = PoolSpec {
                name: format!("cpu{node}-{group}"),
                medium: Medium::Cpu,
                scope: Scope::Host(reply.node),
                capacity_bytes: 3 * BYTES,
                page_bytes: 4096,
                extent_bytes: None,
                tenancy: PoolTenancy::Partition(SaltGroup::of(salt(group).as_deref())),
            };
            let pool = self
                .directory
                .register_pool(Some(reply.session), spec)
                .unwrap();
            self.cpu_owner.insert(pool, reply.node);
            self.partition_of.insert(pool, group);
            self.directory
                .register_namespace(reply.session, descriptor(group))
                .unwrap();
        }
        NodeState {
            session: reply.session,
            open: true,
            last_heartbeat: self.now,
            next_operation: 0,
            leases: vec![],
            committed: vec![],
            reserved: vec![],
            last_commit: None,
            extents: vec![],
            slots: HashMap::new(),
        }
    }

    /// Opens a new session for `node`; the leases its old one held on CXL replicas stay
    /// with the directory until their deadline.
    fn reopen(&mut self, node: usize) {
        let state = self.open(node);
        let old = std::mem::replace(&mut self.nodes[node], state);
        let cxl_pool = self.cxl_pool;
        self.orphan_leases.extend(
            old.leases
                .into_iter()
                .filter(|lease| lease.location.pool == cxl_pool),
        );
    }

    fn object(&self, index: u8) -> ObjectId {
        ObjectId {
            namespace: self.namespaces[usize::from(index % 2)],
            prefix: PrefixDigest::ROOT.chain(&[u32::from(index)]),
            shard: 0,
            part: 0,
        }
    }

    fn operation(&mut self, node: usize) -> OperationId {
        self.nodes[node].next_operation += 1;
        OperationId(self.nodes[node].next_operation)
    }

    /// Checks a call's result against the model's view of the session: answered while it
    /// is open, refused as `Fenced` once it is not. Returns whether it is open.
    fn answered<T: std::fmt::Debug>(
        &mut self,
        node: usize,
        what: &str,
        result: &Result<T, DirectoryError>,
    ) -> bool {
        if self.nodes[node].open {
            assert!(
                result.is_ok(),
                "{what} of node {node}'s open session was refused: {result:?}"
            );
            true
        } else {
            assert!(
                matches!(result, Err(DirectoryError::Fenced { .. })),
                "{what} of node {node}'s fenced session got {result:?}"
            );
            self.tally.fenced_refusals += 1;
            false
        }
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Restart(node) => self.reopen(node),
            Action::Store {
                node,
                object,
                commit,
            } => self.store(node, object, commit),
            Action::RetryCommit(node) => self.retry_commit(node),
            Action::ResolveLast(node) => {
                let session = self.nodes[node].session;
                let lost = self.operation(node);
                let result = self.directory.resolve(session, session, lost);
                if self.answered(node, "resolve", &result) {
                    assert_eq!(result, Ok(ResolveOutcome::NotApplied));
                }
            }
            Action::Acquire {
                node,
                objects,
                manifest,
            } => self.acquire(node, &objects, manifest),
            Action::Release { node, index } => self.release(node, index),
            Action::Retire { node, index } => self.retire(node, index),
            Action::PollAndAck(node) => self.poll_and_ack(node),
            Action::Heartbeat(node) => {
                let session = self.nodes[node].session;
                let result = self.directory.heartbeat(self.now, session, None);
                if self.answered(node, "heartbeat", &result) {
                    self.nodes[node].last_heartbeat = self.now;
                } else {
                    self.reopen(node);
                }
            }
            Action::GrantExtent(node) => {
                self.grant_extent(node);
            }
            Action::ReturnExtent { node, index } => self.return_extent(node, index),
            Action::Advance(milliseconds) => self.advance(milliseconds),
        }
        self.directory.check_invariants();
    }

    /// Moves time on and ticks; leases and reservations past their deadline are gone and
    /// sessions silent for `fence_after` are fenced, exactly as the model predicts.
    fn advance(&mut self, milliseconds: u16) {
        self.now = self.now + Duration::from_millis(u64::from(milliseconds));
        self.directory.tick(self.now);
        let now = self.now;
        self.orphan_leases.retain(|lease| lease.deadline > now);
        for (node, state) in self.nodes.iter_mut().enumerate() {
            state.leases.retain(|lease| lease.deadline > now);
            state
                .reserved
                .retain(|reservation| reservation.deadline > now);
            let silence = now.saturating_since(state.last_heartbeat);
            if state.open && silence >= FENCE_AFTER {
                state.open = false;
                state.reserved.clear();
                state.extents.clear();
                state.slots.clear();
            }
            let expected = if !state.open {
                SessionState::Fenced
            } else if silence >= SUSPECT_AFTER {
                SessionState::Suspect
            } else {
                SessionState::Live
            };
            assert_eq!(
                self.directory.session_state(state.session),
                Some(expected),
                "node {node} after {silence:?} of silence"
            );
        }
    }

    fn retry_commit(&mut self, node: usize) {
        let Some((operation, replica, location, outcome)) = self.nodes[node].last_commit else {
            return;
        };
        let again = self.directory.commit(
            self.now,
            self.nodes[node].session,
            operation,
            replica,
            location,
        );
        if self.answered(node, "retried commit", &again) {
            assert_eq!(again, Ok(outcome), "a retried commit changed its outcome");
        }
    }

    fn release(&mut self, node: usize, index: usize) {
        let held = self.nodes[node].leases.len();
        if held == 0 {
            return;
        }
        let lease = self.nodes[node].leases.swap_remove(index % held);
        let result = self
            .directory
            .release(self.nodes[node].session, &[lease.lease]);
        if self.answered(node, "release", &result) {
            assert_eq!(
                result,
                Ok(vec![ReleaseOutcome::Released]),
                "a held lease before its deadline"
            );
            self.tally.releases += 1;
        }
    }

    fn retire(&mut self, node: usize, index: usize) {
        let committed = self.nodes[node].committed.len();
        if committed == 0 {
            return;
        }
        let replica = self.nodes[node].committed.swap_remove(index % committed);
        let result = self
            .directory
            .retire(Some(self.nodes[node].session), replica);
        // Eviction may have retired or freed it already; nothing else may refuse the owner.
        let expected = match &result {
            Ok(_) => self.nodes[node].open,
            Err(DirectoryError::UnknownReplica(_) | DirectoryError::InvalidState { .. }) => true,
            Err(DirectoryError::Fenced { .. }) => !self.nodes[node].open,
            Err(_) => false,
        };
        assert!(expected, "node {node} retiring {replica:?}: {result:?}");
        if self.nodes[node].open {
            self.tally.retires += 1;
            self.tally.retires_done += u64::from(result.is_ok());
        }
    }

    fn poll_and_ack(&mut self, node: usize) {
        let session = self.nodes[node].session;
        let polled = self.directory.poll_tasks(self.now, session, 8);
        if !self.answered(node, "poll", &polled) {
            return;
        }
        for task in polled.unwrap() {
            let replica = match task.kind {
                TaskKind::Reclaim { replica, .. } => replica,
                // This model's engines ask for no delegation, and give an offered one
                // (only ever to a node that maps the shared pool) back at once.
                TaskKind::Recall { .. } => continue,
                TaskKind::Delegate { delegation, .. } => {
                    assert!(in_domain(node), "node {node} was offered a delegation");
                    let released = self.directory.release(session, &[delegation.lease]);
                    assert!(
                        released.is_ok(),
                        "releasing an offered delegation: {released:?}"
                    );
                    continue;
                }
                TaskKind::Demote {
                    source,
                    target,
                    target_pool,
                } => {
                    assert!(
                        in_domain(node) && target_pool == self.cxl_pool,
                        "node {node} was asked to demote into {target_pool:?}"
                    );
                    self.demote(node, source, target);
                    continue;
                }
                TaskKind::Replicate {
                    source,
                    target,
                    target_pool,
                } => {
                    assert!(
                        in_domain(node) && target_pool == self.cxl_pool,
                        "node {node} was asked to replicate into {target_pool:?}"
                    );
                    self.tally.replications += 1;
                    self.demote(node, source, target);
                    continue;
                }
                TaskKind::Push { to, .. } => {
                    assert_ne!(to.0 as usize, node, "node {node} asked to push to itself");
                    self.tally.pushes += 1;
                    continue;
                }
                TaskKind::Receive {
                    target,
                    target_pool,
                    from,
                    ..
                } => {
                    assert_ne!(
                        from.0 as usize, node,
                        "node {node} asked to receive from itself"
                    );
                    self.receive(node, target, target_pool);
                    continue;
                }
            };
            let leases = self.nodes.iter().flat_map(|state| &state.leases);
            for lease in leases.chain(&self.orphan_leases) {
                assert!(
                    lease.replica != replica || lease.deadline <= self.now,
                    "reclaim while leased"
                );
            }
            assert_eq!(
                self.directory.reclaim_ack(session, replica),
                Ok(ReclaimOutcome::Freed)
            );
            self.tally.reclaims += 1;
            self.nodes[node].slots.retain(|_, held| *held != replica);
        }
    }

    /// Asks for a CXL extent. The node outside the domain is refused; an open node of the
    /// domain gets an extent no other open node holds, or `Full`.
    fn grant_extent(&mut self, node: usize) -> Option<u64> {
        let session = self.nodes[node].session;
        let operation = self.operation(node);
        let result = self
            .directory
            .grant_extent(self.now, session, operation, self.cxl_pool);
        if !in_domain(node) {
            let refused = if self.nodes[node].open {
                matches!(result, Err(DirectoryError::InvalidPool(_)))
            } else {
                matches!(result, Err(DirectoryError::Fenced { .. }))
            };
            assert!(
                refused,
                "node {node} outside the domain asked for an extent: {result:?}"
            );
            return None;
        }
        if !self.answered(node, "extent grant", &result) {
            return None;
        }
        self.tally.extent_grants += 1;
        let ExtentGrant::Granted(extent) = result.unwrap() else {
            return None;
        };
        self.tally.extents_granted += 1;
        assert_eq!(
            (
                extent.pool,
                extent.length_bytes,
                extent.offset_bytes % EXTENT_BYTES
            ),
            (self.cxl_pool, EXTENT_BYTES, 0)
        );
        assert!(extent.offset_bytes < CXL_BYTES);
        for (other, state) in self.nodes.iter().enumerate() {
            assert!(
                !(state.open && state.extents.contains(&extent.offset_bytes)),
                "extent at {} granted to node {node} while node {other} holds it",
                extent.offset_bytes
            );
        }
        self.nodes[node].extents.push(extent.offset_bytes);
        Some(extent.offset_bytes)
    }

    /// Gives back one of the node's extents (`Returned` when none of its committed replicas
    /// is inside, else `InUse`), or one it does not hold (`NotOwner`).
    fn return_extent(&mut self, node: usize, index: usize) {
        let held = &self.nodes[node].extents;
        // Mostly one it holds; else (or when it holds none) one it does not.
        let (offset, held_index) = match held.get(index % held.len().max(1)) {
            Some(offset) if index < 6 => (*offset, Some(index)),
            _ => {
                let Some(offset) = (0..CXL_BYTES / EXTENT_BYTES)
                    .map(|extent| {
                        ((extent + index as u64) % (CXL_BYTES / EXTENT_BYTES)) * EXTENT_BYTES
                    })
                    .find(|offset| !held.contains(offset))
                else {
                    return;
                };
                (offset, None)
            }
        };
        let occupied = self.nodes[node]
            .slots
            .keys()
            .any(|slot| (offset..offset + EXTENT_BYTES).contains(slot));
        let session = self.nodes[node].session;
        let operation = self.operation(node);
        let result =
            self.directory
                .return_extent(self.now, session, operation, self.cxl_pool, offset);
        if !self.answered(node, "extent return", &result) {
            return;
        }
        let expected = match held_index {
            None => ExtentReturn::NotOwner,
            Some(_) if occupied => ExtentReturn::InUse,
            Some(_) => ExtentReturn::Returned,
        };
        assert_eq!(result, Ok(expected), "node {node} giving back {offset}");
        match expected {
            ExtentReturn::Returned => {
                self.tally.extents_returned += 1;
                self.nodes[node].extents.retain(|held| *held != offset);
            }
            ExtentReturn::InUse => self.tally.extents_in_use += 1,
            ExtentReturn::NotOwner => {}
        }
    }

    /// A free object slot in the node's extents, asking for a new extent when all are full.
    fn cxl_slot(&mut self, node: usize) -> Option<u64> {
        let state = &self.nodes[node];
        let free = state.extents.iter().find_map(|extent| {
            (0..EXTENT_BYTES / BYTES)
                .map(|slot| extent + slot * BYTES)
                .find(|offset| !state.slots.contains_key(offset))
        });
        free.or_else(|| self.grant_extent(node))
    }

    /// Carries out a demotion: the copy lands in a slot of the node's extents, or the target
    /// is aborted. The target may have expired since the directory queued the task.
    fn demote(&mut self, node: usize, source: Location, target: ReplicaId) {
        let session = self.nodes[node].session;
        self.tally.demotions += 1;
        let Some(offset) = self.cxl_slot(node) else {
            let aborted = self.directory.abort(session, target);
            assert!(aborted.is_ok(), "{aborted:?}");
            return;
        };
        let location = Location {
            pool: self.cxl_pool,
            allocation: AllocationId(target.0),
            generation: Generation(1),
            offset_bytes: offset,
            length_bytes: source.length_bytes,
        };
        let operation = self.operation(node);
        match self
            .directory
            .commit(self.now, session, operation, target, location)
        {
            Ok(CommitOutcome::Committed) => {
                self.tally.demotions_committed += 1;
                self.publish(node, target, location);
            }
            Ok(CommitOutcome::AlreadyPresent) => {}
            Err(DirectoryError::UnknownReplica(_) | DirectoryError::NotOwner(_)) => {}
            Err(error) => panic!("node {node} committing demotion target {target:?}: {error}"),
        }
    }

    /// Carries out the receiving half of a network replication (the bytes arrive at
    /// once): the copy lands at offset 0 of the node's own CPU pool and is committed. The
    /// target may have expired or been cancelled since the directory queued the task.
    fn receive(&mut self, node: usize, target: ReplicaId, target_pool: PoolId) {
        assert_eq!(
            self.cpu_owner
                .get(&target_pool)
                .map(|owner| owner.0 as usize),
            Some(node),
            "node {node} asked to receive into {target_pool:?}"
        );
        let location = Location {
            pool: target_pool,
            allocation: AllocationId(target.0),
            generation: Generation(1),
            offset_bytes: 0,
            length_bytes: BYTES,
        };
        let operation = self.operation(node);
        let session = self.nodes[node].session;
        match self
            .directory
            .commit(self.now, session, operation, target, location)
        {
            Ok(CommitOutcome::Committed) => {
                self.tally.receives_committed += 1;
                self.publish(node, target, location);
            }
            Ok(CommitOutcome::AlreadyPresent) => {}
            Err(DirectoryError::UnknownReplica(_) | DirectoryError::NotOwner(_)) => {}
            Err(error) => panic!("node {node} committing received target {target:?}: {error}"),
        }
    }

    /// Books a replica the node committed.
    fn publish(&mut self, node: usize, replica: ReplicaId, location: Location) {
        assert!(
            self.locations.insert(replica, location).is_none(),
            "replica committed twice"
        );
        self.nodes[node].committed.push(replica);
        if location.pool == self.cxl_pool {
            self.nodes[node]
                .slots
                .insert(location.offset_bytes, replica);
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
        if !self.answered(node, "reserve", &outcome) {
            return;
        }
        self.tally.reserves += 1;
        if let Ok(ReserveOutcome::Granted {
            replica,
            pool,
            medium,
            allocated_bytes,
        }) = outcome
        {
            self.tally.reserves_granted += 1;
            assert_eq!(allocated_bytes, BYTES);
            assert_eq!(medium == Medium::Cxl, pool == self.cxl_pool);
            assert!(
                self.partition_of
                    .get(&pool)
                    .is_none_or(|group| *group == usize::from(object % 2)),
                "object {object} granted in the CPU partition of another salt group"
            );
            assert!(
                in_domain(node) || pool != self.cxl_pool,
                "node {node} outside the domain was granted CXL bytes"
            );
            self.nodes[node].reserved.push(Reservation {
                replica,
                pool,
                deadline: self.now + RESERVATION,
            });
        }
        if !commit {
            return;
        }
        let Some(reservation) = self.nodes[node].reserved.pop() else {
            return;
        };
        self.commit(node, reservation);
    }

    /// Commits the node's own unexpired reservation: at offset 0 of its CPU pool, or in a
    /// slot of an extent it holds (after checking that one it does not hold is refused).
    /// Must succeed; with no room for a CXL slot the reservation is aborted instead.
    fn commit(&mut self, node: usize, reservation: Reservation) {
        let Reservation { replica, pool, .. } = reservation;
        let session = self.nodes[node].session;
        let offset_bytes = if pool == self.cxl_pool {
            self.stray_commit(node, replica);
            match self.cxl_slot(node) {
                Some(offset) => offset,
                None => {
                    assert_eq!(
                        self.directory.abort(session, replica),
                        Ok(AbortOutcome::Aborted)
                    );
                    return;
                }
            }
        } else {
            0
        };
        let location = Location {
            pool,
            allocation: AllocationId(replica.0),
            generation: Generation(1),
            offset_bytes,
            length_bytes: BYTES,
        };
        let operation = self.operation(node);
        let outcome = self
            .directory
            .commit(self.now, session, operation, replica, location)
            .unwrap_or_else(|error| {
                panic!("node {node} committing its live reservation at {location:?}: {error}")
            });
        self.nodes[node].last_commit = Some((operation, replica, location, outcome));
        if outcome == CommitOutcome::Committed {
            if pool == self.cxl_pool {
                self.tally.cxl_commits += 1;
            } else {
                self.tally.cpu_commits += 1;
            }
            self.publish(node, replica, location);
        }
    }

    /// A commit into an extent the node does not hold is refused and changes nothing.
    fn stray_commit(&mut self, node: usize, replica: ReplicaId) {
        let held = &self.nodes[node].extents;
        let Some(offset) = (0..CXL_BYTES / EXTENT_BYTES)
            .map(|extent| extent * EXTENT_BYTES)
            .find(|offset| !held.contains(offset))
        else {
            return;
        };
        let location = Location {
            pool: self.cxl_pool,
            allocation: AllocationId(replica.0),
            generation: Generation(1),
            offset_bytes: offset,
            length_bytes: BYTES,
        };
        let operation = self.operation(node);
        let session = self.nodes[node].session;
        assert_eq!(
            self.directory
                .commit(self.now, session, operation, replica, location),
            Err(DirectoryError::LocationMismatch(replica)),
            "node {node} committed into an extent it does not hold"
        );
        self.tally.stray_commits_refused += 1;
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
        let outcomes = self.directory.acquire(self.now, session, &ids, mode);
        let open = self.answered(node, "probe", &probed);
        assert_eq!(open, self.answered(node, "acquire", &outcomes));
        if !open {
            return;
        }
        let (outcomes, probed) = (outcomes.unwrap(), probed.unwrap());
        assert_eq!(outcomes.len(), ids.len(), "one result per item");
        let leased = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, AcquireOutcome::Leased(_)))
            .count();
        assert!(
            !manifest || leased == 0 || leased == ids.len(),
            "manifest partly leased"
        );
        self.tally.acquires += 1;
        self.tally.acquires_leased += u64::from(leased > 0);
        for (outcome, probe) in outcomes.into_iter().zip(probed) {
            assert_eq!(
                matches!(probe, ProbeOutcome::Hit { .. }),
                !matches!(outcome, AcquireOutcome::Miss),
                "probe and acquire disagree without anything in between"
            );
            assert!(
                in_domain(node)
                    || !matches!(
                        probe,
                        ProbeOutcome::Hit {
                            medium: Medium::Cxl,
                            ..
                        }
                    ),
                "node {node} outside the domain sees a CXL replica"
            );
            if let AcquireOutcome::Leased(lease) = outcome {
                assert_eq!(
                    self.locations.get(&lease.replica),
                    Some(&lease.location),
                    "content moved"
                );
                assert_eq!(
                    lease.medium == Medium::Cxl,
                    lease.location.pool == self.cxl_pool
                );
                assert!(
                    in_domain(node) || lease.location.pool != self.cxl_pool,
                    "node {node} outside the domain leased a CXL replica"
                );
                assert_eq!(lease.deadline, self.now + LEASE);
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

/// The seed of the run unless `PROPTEST_RNG_SEED` names another: a fixed seed makes the
/// run, and the tally the floors are checked against, the same on every machine.
const SEED: u64 = 0x6b76_7469_6572_0001;

#[test]
fn random_operations_keep_every_invariant() {
    let mut config = Config {
        cases: 96,
        // A failure prints its minimal sequence of actions; nothing is written to disk.
        failure_persistence: None,
        ..Config::default()
    };
    if config.rng_seed == RngSeed::Random {
        config.rng_seed = RngSeed::Fixed(SEED);
    }
    println!(
        "seed: {:?} (set PROPTEST_RNG_SEED to replay another)",
        config.rng_seed
    );
    let mut runner = TestRunner::new(config);
    let tally = RefCell::new(Tally::default());
    let outcome = runner.run(&prop::collection::vec(action(), 1..160), |actions| {
        let mut harness = Harness::new();
        for action in actions {
            harness.apply(action);
        }
        tally.borrow_mut().add(&harness.tally);
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    let tally = tally.into_inner();
    println!("{tally:#?}");
    tally.check();
}
