//! Whole-state invariant checks, run after every step of the unit, property and simulation
//! tests. Each failure is a bug: it panics with the broken invariant.

use super::replicas::ReplicaState;
use super::sessions::SessionState;
use super::Directory;
use crate::model::Scope;
use std::collections::HashMap;

impl Directory {
    /// Checks every cross-record invariant in O(records). Panics on the first violation.
    pub fn check_invariants(&self) {
        let mut per_pool: HashMap<u32, [u64; 4]> = HashMap::new();
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
        let mut extent_replicas: HashMap<(u32, usize), u32> = HashMap::new();
        self.replicas.check_recency();
        let mut listed: HashMap<u32, u64> = HashMap::new();
        let mut listed_count: HashMap<u32, u64> = HashMap::new();
        for (index, pool) in self.pools.iter().enumerate() {
            let pool_id = crate::model::PoolId(index as u32);
            let listed_replicas = (0..crate::policy::history::FREQUENCY_CLASSES)
                .flat_map(|class| self.replicas.coldest(pool_id, class));
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
                *listed.entry(index as u32).or_default() += replica.allocated_bytes;
                *listed_count.entry(index as u32).or_default() += 1;
            }
            if let Some(extents) = &pool.extents {
                for (id, replica) in self
                    .replicas
                    .iter()
                    .filter(|(_, replica)| replica.pool.0 as usize == index)
                {
                    if matches!(replica.state, ReplicaState::Ready | ReplicaState::Retiring) {
                        assert!(
                            extents.owner_of(replica.offset_bytes).is_some(),
                            "{id:?} outside any granted extent"
                        );
                        *extent_replicas
                            .entry((index as u32, extents.index_of(replica.offset_bytes)))
                            .or_default() += 1;
                    }
                }
                for (extent, owner, count) in extents.replica_counts() {
                    assert_eq!(
                        count,
                        extent_replicas
                            .get(&(index as u32, extent))
                            .copied()
                            .unwrap_or(0),
                        "replicas of extent {extent} of pool {index}"
                    );
                    if let Some(owner) = owner {
                        let open = self
                            .sessions
                            .get(&owner)
                            .is_some_and(|session| session.is_open());
                        assert!(open || count > 0, "extent {extent} of pool {index} held by an ended session with no replica");
                    }
                }
            }
        }
        for (index, pool) in self.pools.iter().enumerate() {
            assert_eq!(
                listed.get(&(index as u32)).copied().unwrap_or(0),
                pool.ready_bytes,
                "recency list of pool {index} misses READY replicas"
            );
            assert_eq!(
                listed_count.get(&(index as u32)).copied().unwrap_or(0),
                pool.ready_replicas,
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
                reserved + ready + retiring <= pool.spec.capacity_bytes,
                "pool {index} over capacity"
            );
        }
        let mut open_per_node: HashMap<u32, u32> = HashMap::new();
        for (id, session) in &self.sessions {
            let leases = leases_per_session.get(&id.0).copied().unwrap_or(0);
            assert_eq!(session.leases, leases, "lease count of session {id:?}");
            if session.is_open() {
                *open_per_node.entry(session.node.0).or_default() += 1;
            } else {
                assert!(
                    session.reservations.is_empty(),
                    "an ended session holds reservations"
                );
                assert!(matches!(
                    session.state,
                    SessionState::Fenced | SessionState::Closed
                ));
            }
        }
        assert!(
            open_per_node.values().all(|&count| count <= 1),
            "two open sessions of one node"
        );
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
        assert!(self.replicas.len() <= self.config.replicas_max);
        assert!(self.leases.len() <= self.config.leases_max);
    }
}
