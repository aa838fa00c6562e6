//! Whole-state invariant checks, run after every step of the unit, property and simulation
//! tests. Each failure is a bug: it panics with the broken invariant.

use super::pools::ExtentTable;
use super::replicas::ReplicaState;
use super::sessions::SessionState;
use super::Directory;
use crate::model::{Epoch, NamespaceId, NodeId, PoolId, PoolSpec, Scope, SessionId, Timestamp};
use crate::policy::history::FREQUENCY_CLASSES;
use std::collections::HashMap;

/// Leases counted per replica and per session (by raw id).
type LeaseCounts = (HashMap<u64, u32>, HashMap<u64, u32>);

/// The state every shard of a sharded directory keeps alike
/// ([`crate::protocol::shards::Shards::check_invariants`]): nodes, sessions with their
/// states and epochs, pools and who registered them, namespaces. Ordered, for comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicatedState {
    pub nodes: Vec<(String, NodeId, Epoch, Option<SessionId>)>,
    pub sessions: Vec<(SessionId, NodeId, Epoch, SessionState, Timestamp)>,
    pub pools: Vec<(PoolId, PoolSpec, Option<SessionId>)>,
    pub namespaces: Vec<NamespaceId>,
    /// Each shared pool's extents ([`super::pools::ExtentTable::agreed`]).
    pub extents: Vec<(PoolId, Vec<AgreedExtent>)>,
}

/// An extent as every shard must see it: owner, committed replicas over all shards,
/// cooling deadline, whether it may be claimed, owner word.
pub type AgreedExtent = (
    Option<SessionId>,
    u32,
    Timestamp,
    bool,
    Option<crate::model::OwnerWord>,
);

impl Directory {
    /// The state that is not per object, ordered ([`ReplicatedState`]).
    pub fn replicated_state(&self) -> ReplicatedState {
        let mut nodes: Vec<_> = self
            .node_ids
            .iter()
            .map(|(name, node)| {
                let record = &self.nodes[node.0 as usize];
                (name.clone(), *node, record.epoch, record.session)
            })
            .collect();
        nodes.sort();
        let mut sessions: Vec<_> = self
            .sessions
            .iter()
            .map(|(id, session)| {
                (
                    *id,
                    session.node,
                    session.epoch,
                    session.state,
                    session.last_heartbeat,
                )
            })
            .collect();
        sessions.sort_by_key(|session| session.0);
        let pools = self
            .pools
            .iter()
            .enumerate()
            .map(|(index, record)| {
                (
                    PoolId(index as u32),
                    record.spec.clone(),
                    record.owner_session,
                )
            })
            .collect();
        let mut namespaces: Vec<NamespaceId> = self.namespaces.keys().copied().collect();
        namespaces.sort();
        let extents = self
            .pools
            .iter()
            .enumerate()
            .filter_map(|(index, record)| {
                Some((PoolId(index as u32), record.extents.as_ref()?.agreed()))
            })
            .collect();
        ReplicatedState {
            nodes,
            sessions,
            pools,
            namespaces,
            extents,
        }
    }

    /// Checks every cross-record invariant in O(records). Panics on the first violation.
    pub fn check_invariants(&self) {
        let (leases_per_replica, leases_per_session) = self.check_leases();
        let per_pool = self.check_replicas(&leases_per_replica);
        self.replicas.check_recency();
        self.check_pool_lists();
        let listed: Vec<(u64, u64)> = self
            .pools
            .iter()
            .enumerate()
            .map(|(index, pool)| {
                let listed = self.check_recency_list(index);
                if let Some(extents) = &pool.extents {
                    self.check_extents(index, extents);
                }
                listed
            })
            .collect();
        self.check_pool_books(&per_pool, &listed);
        self.check_group_bytes();
        self.check_namespace_replicas();
        self.check_sessions(&leases_per_session);
        self.check_demotions();
        self.check_replications();
        assert!(self.replicas.len() <= self.config.replicas_max);
        assert!(self.leases.len() <= self.config.leases_max);
    }

    /// Every lease is on a READY or RETIRING replica, held by a remembered session, open
    /// unless the replica is in a shared pool. Returns the leases per replica and session.
    fn check_leases(&self) -> LeaseCounts {
        let mut leases_per_replica: HashMap<u64, u32> = HashMap::new();
        let mut leases_per_session: HashMap<u64, u32> = HashMap::new();
        for (_, lease) in self.leases.iter() {
            let replica = self
                .replicas
                .get(lease.replica)
                .unwrap_or_else(|| panic!("lease on a missing replica {:?}", lease.replica));
            assert!(
                matches!(replica.state, ReplicaState::Ready | ReplicaState::Retiring),
                "lease on a {} replica",
                replica.state.name()
            );
            let session = self
                .sessions
                .get(&lease.session)
                .expect("lease of a forgotten session");
            assert!(
                session.is_open() || self.pools[replica.pool.0 as usize].extents.is_some(),
                "an ended session still leases a replica of a host pool"
            );
            *leases_per_replica.entry(lease.replica.0).or_default() += 1;
            *leases_per_session.entry(lease.session.0).or_default() += 1;
        }
        (leases_per_replica, leases_per_session)
    }

    /// Every replica's lease count, object index entry, host pool owner and reservation
    /// owner agree with the other tables. Returns the reserved, READY, retiring and pinned
    /// bytes per pool.
    fn check_replicas(&self, leases_per_replica: &HashMap<u64, u32>) -> HashMap<u32, [u64; 4]> {
        let mut per_pool: HashMap<u32, [u64; 4]> = HashMap::new();
        for (id, replica) in self.replicas.iter() {
            let counters = per_pool.entry(replica.pool.0).or_default();
            let slot = match replica.state {
                ReplicaState::Reserved => 0,
                ReplicaState::Ready => 1,
                ReplicaState::Retiring => 2,
                ReplicaState::Free => unreachable!("iter yields live replicas"),
            };
            counters[slot] += replica.allocated_bytes;
            if replica.lease_count > 0 {
                counters[3] += replica.allocated_bytes;
            }
            assert_eq!(
                leases_per_replica.get(&id.0).copied().unwrap_or(0),
                replica.lease_count,
                "lease count of {id:?}"
            );
            assert!(
                self.replicas
                    .of_object(&replica.object)
                    .any(|(other, _)| other == id),
                "replica {id:?} not reachable from its object"
            );
            assert!(
                self.pool_admits(replica.pool, &replica.object),
                "replica {id:?} in the CPU partition of another salt group"
            );
            let pool = &self.pools[replica.pool.0 as usize];
            if let Scope::Host(node) = pool.spec.scope {
                assert_eq!(node, replica.owner, "host replica owned by another node");
                assert!(
                    pool.owner_session.is_some(),
                    "replica in a dropped host pool"
                );
            }
            if replica.state == ReplicaState::Reserved {
                let owner_session = self.nodes[replica.owner.0 as usize]
                    .session
                    .and_then(|session| self.sessions.get(&session));
                assert!(
                    owner_session.is_some_and(
                        |session| session.is_open() && session.reservations.contains(&id)
                    ),
                    "reservation {id:?} without an open owner session"
                );
            }
        }
        per_pool
    }

    /// Every replica's namespace is registered, and counts exactly its replicas.
    fn check_namespace_replicas(&self) {
        let mut counted: HashMap<crate::model::NamespaceId, u64> = HashMap::new();
        for (_, replica) in self.replicas.iter() {
            *counted.entry(replica.object.namespace).or_default() += 1;
        }
        for (namespace, known) in &self.namespaces {
            assert_eq!(
                counted.remove(namespace).unwrap_or(0),
                known.replicas,
                "replicas of a namespace"
            );
        }
        assert!(
            counted.is_empty(),
            "replicas of unregistered namespaces: {counted:?}"
        );
        assert!(self.namespaces.len() <= self.config.namespaces_max as usize);
    }

    /// Each pool's live bytes per salt group (for quotas) are those of its reserved and
    /// READY replicas of that group's objects, and it lists no group without any.
    fn check_group_bytes(&self) {
        let mut counted: HashMap<(u32, crate::model::SaltGroup), u64> = HashMap::new();
        for (_, replica) in self.replicas.iter() {
            if matches!(replica.state, ReplicaState::Reserved | ReplicaState::Ready) {
                *counted
                    .entry((replica.pool.0, self.group_of_object(&replica.object)))
                    .or_default() += replica.allocated_bytes;
            }
        }
        for (index, record) in self.pools.iter().enumerate() {
            for (group, bytes) in record.groups() {
                assert_eq!(
                    counted.remove(&(index as u32, group)),
                    Some(bytes),
                    "pool {index}'s bytes of a salt group"
                );
            }
        }
        assert!(
            counted.is_empty(),
            "live bytes of a group no pool counts: {counted:?}"
        );
    }

    /// Every replica on pool `index`'s recency lists is READY and of that pool. Returns the
    /// bytes and the count listed.
    fn check_recency_list(&self, index: usize) -> (u64, u64) {
        let (mut listed_bytes, mut listed_count) = (0, 0);
        let listed_replicas = (0..FREQUENCY_CLASSES)
            .flat_map(|class| self.replicas.coldest(PoolId(index as u32), class));
        for (id, replica) in listed_replicas {
            assert_eq!(
                replica.state,
                ReplicaState::Ready,
                "{id:?} on a recency list but not READY"
            );
            assert_eq!(
                replica.pool.0 as usize, index,
                "{id:?} on another pool's recency list"
            );
            listed_bytes += replica.allocated_bytes;
            listed_count += 1;
        }
        (listed_bytes, listed_count)
    }

    /// Every committed replica of shared pool `index` lies in a granted extent, each
    /// extent's replica count is right, and an ended session holds only extents with
    /// replicas.
    fn check_extents(&self, index: usize, extents: &ExtentTable) {
        let mut extent_replicas: HashMap<usize, u32> = HashMap::new();
        for (id, replica) in self.replicas.in_pool(PoolId(index as u32)) {
            if matches!(replica.state, ReplicaState::Ready | ReplicaState::Retiring) {
                assert!(
                    extents.owner_of(replica.offset_bytes).is_some(),
                    "{id:?} outside any granted extent"
                );
                *extent_replicas
                    .entry(extents.index_of(replica.offset_bytes))
                    .or_default() += 1;
            }
        }
        for (extent, owner, count, elsewhere) in extents.replica_counts() {
            assert_eq!(
                count,
                extent_replicas.get(&extent).copied().unwrap_or(0),
                "replicas of extent {extent} of pool {index}"
            );
            if let Some(owner) = owner {
                let open = self
                    .sessions
                    .get(&owner)
                    .is_some_and(|session| session.is_open());
                assert!(
                    open || count + elsewhere > 0,
                    "extent {extent} of pool {index} held by an ended session with no replica"
                );
            }
        }
    }

    /// Every pool's byte counters equal the sums over its replicas (`per_pool`) and its
    /// recency lists (`listed`: bytes and count per pool), within its capacity.
    fn check_pool_books(&self, per_pool: &HashMap<u32, [u64; 4]>, listed: &[(u64, u64)]) {
        for (index, pool) in self.pools.iter().enumerate() {
            let (listed_bytes, listed_count) = listed[index];
            assert_eq!(
                listed_bytes, pool.ready_bytes,
                "recency list of pool {index} misses READY replicas"
            );
            assert_eq!(
                listed_count, pool.ready_replicas,
                "READY replicas of pool {index}"
            );
            let [reserved, ready, retiring, pinned] =
                per_pool.get(&(index as u32)).copied().unwrap_or_default();
            assert_eq!(
                pool.reserved_bytes, reserved,
                "reserved bytes of pool {index}"
            );
            assert_eq!(pool.ready_bytes, ready, "ready bytes of pool {index}");
            assert_eq!(
                pool.retiring_bytes, retiring,
                "retiring bytes of pool {index}"
            );
            assert_eq!(pool.pinned_bytes, pinned, "pinned bytes of pool {index}");
            assert!(
                reserved + ready + retiring <= pool.budget_bytes,
                "pool {index} over capacity"
            );
        }
    }

    /// Every session's lease count is right, an ended session holds no reservation, and a
    /// node has at most one open session.
    fn check_sessions(&self, leases_per_session: &HashMap<u64, u32>) {
        let mut open_per_node: HashMap<u32, u32> = HashMap::new();
        for (id, session) in &self.sessions {
            let leases = leases_per_session.get(&id.0).copied().unwrap_or(0);
            assert_eq!(session.leases, leases, "lease count of session {id:?}");
            let indexed = self
                .leases
                .of_session(*id)
                .take(self.leases.len() as usize + 1)
                .inspect(|(_, lease)| {
                    assert_eq!(lease.session, *id, "lease on another session's list")
                })
                .count();
            assert_eq!(indexed, leases as usize, "session index of {id:?}");
            if session.is_open() {
                *open_per_node.entry(session.node.0).or_default() += 1;
            } else {
                assert!(
                    session.reservations.is_empty(),
                    "an ended session holds reservations"
                );
                assert!(matches!(
                    session.state,
                    SessionState::Fenced | SessionState::Closed | SessionState::Drained
                ));
            }
        }
        assert!(
            open_per_node.values().all(|&count| count <= 1),
            "two open sessions of one node"
        );
    }

    /// Every live replica is on its pool's list, and on no other.
    fn check_pool_lists(&self) {
        let bound = self.replicas.len() as usize + 1;
        let mut listed = 0;
        for index in 0..self.pools.len() {
            let pool = PoolId(index as u32);
            for (id, replica) in self.replicas.in_pool(pool).take(bound) {
                assert_eq!(replica.pool, pool, "{id:?} on another pool's list");
                listed += 1;
            }
        }
        assert_eq!(
            listed,
            self.replicas.len() as usize,
            "replicas off their pool's list"
        );
    }

    /// The demotion books agree: every target is reserved and every source marked.
    fn check_demotions(&self) {
        assert_eq!(
            self.demotions.len(),
            self.demoting.len(),
            "demotion books disagree"
        );
        for (target, source) in &self.demotions {
            assert_eq!(
                self.replicas.get(*target).map(|replica| replica.state),
                Some(ReplicaState::Reserved),
                "demotion target {target:?} not reserved"
            );
            assert!(
                self.demoting.contains(source),
                "demotion source {source:?} not marked"
            );
        }
    }
}
