//! What a node re-reports when it rejoins the directory: the READY replicas it published
//! (by pool and allocation) and the namespaces its clients registered. Kept as it happens
//! — a replica enters when its commit is published and leaves when its pages are freed —
//! so a rejoin reports exactly what the node's pools hold.

use crate::directory::Holding;
use crate::model::Timestamp;
use crate::model::{AllocationId, Location, NamespaceDescriptor, NamespaceId, PoolId};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

/// Namespaces a node remembers for re-registration: the directory's own table bound.
pub const NAMESPACES_MAX: usize = 1024;

/// The node's published replicas and registered namespaces. Replicas are bounded by the
/// pools' allocation tables (one entry per live allocation).
#[derive(Debug, Default)]
pub struct Holdings {
    replicas: HashMap<(PoolId, AllocationId), Holding>,
    namespaces: BTreeMap<NamespaceId, NamespaceDescriptor>,
    /// Namespaces among `namespaces` the node answered while the directory was out of
    /// reach, which it has not registered there yet.
    pending: BTreeSet<NamespaceId>,
    /// Replicas the directory did not adopt, forgotten but with their pages kept until the
    /// given time: an engine may still read them under a lease of the previous incarnation.
    /// In time order; bounded by the replicas a rejoin reports.
    refused: VecDeque<(Timestamp, Location)>,
    /// Pages freed before their replica was published here: a reclaim that overtook its
    /// commit's answer (the directory retired the replica meanwhile), or a store that
    /// failed. A publication that comes after is not held. The latest
    /// [`FREED_UNPUBLISHED_MAX`], oldest first.
    freed_unpublished: VecDeque<FreedPlace>,
    freed_unpublished_set: HashSet<FreedPlace>,
}

/// A location's pool, allocation, generation and offset: what tells two occupancies apart.
type FreedPlace = (PoolId, AllocationId, crate::model::Generation, u64);

fn freed_place(location: &Location) -> FreedPlace {
    (
        location.pool,
        location.allocation,
        location.generation,
        location.offset_bytes,
    )
}

/// Locations freed before their publication that a node remembers: far more than the
/// commits it has in flight at once.
pub const FREED_UNPUBLISHED_MAX: usize = 4096;

impl Holdings {
    /// A replica was published at its location: held from now on, unless its pages were
    /// freed already (`false`: a reclaim overtook the commit's answer, and nothing here
    /// may answer for it).
    pub fn published(&mut self, holding: Holding) -> bool {
        if self
            .freed_unpublished_set
            .remove(&freed_place(&holding.location))
        {
            // Its entry in the queue goes when it comes to the front.
            return false;
        }
        let key = (holding.location.pool, holding.location.allocation);
        self.replicas.insert(key, holding);
        true
    }

    /// The pages at `location` were freed (reclaimed, or the store failed): no longer held.
    pub fn freed(&mut self, location: &Location) {
        let key = (location.pool, location.allocation);
        if self
            .replicas
            .get(&key)
            .is_some_and(|held| same_place(&held.location, location))
        {
            self.replicas.remove(&key);
        } else if self.freed_unpublished_set.insert(freed_place(location)) {
            if self.freed_unpublished.len() >= FREED_UNPUBLISHED_MAX {
                if let Some(oldest) = self.freed_unpublished.pop_front() {
                    self.freed_unpublished_set.remove(&oldest);
                }
            }
            self.freed_unpublished.push_back(freed_place(location));
        }
    }

    /// The extent `[offset, offset + length)` of `pool` was lost (not this node's in the
    /// new session): forgets the replicas inside and returns how many.
    pub fn extent_lost(&mut self, pool: PoolId, offset_bytes: u64, length_bytes: u64) -> usize {
        let before = self.replicas.len();
        self.replicas.retain(|(held_pool, _), held| {
            *held_pool != pool
                || held.location.offset_bytes < offset_bytes
                || held.location.offset_bytes >= offset_bytes.saturating_add(length_bytes)
        });
        before - self.replicas.len()
    }

    /// The object whose published replica is at `location`, if this node holds it: the
    /// same allocation, generation and offset. An allocation id names an allocation of one
    /// node process only (a restarted process numbers its allocations from the start again),
    /// so a location of an earlier process never names what this one wrote elsewhere.
    pub fn object_at(&self, location: &Location) -> Option<crate::model::ObjectId> {
        self.replicas
            .get(&(location.pool, location.allocation))
            .filter(|held| same_place(&held.location, location))
            .map(|held| held.object)
    }

    /// The directory did not adopt the replica at `location`: it is no longer held, and its
    /// pages are freed at `free_at` (see [`Holdings::due_frees`]), not before.
    pub fn refused(&mut self, location: Location, free_at: Timestamp) {
        self.freed(&location);
        let at = self
            .refused
            .back()
            .map_or(free_at, |(last, _)| free_at.max(*last));
        self.refused.push_back((at, location));
    }

    /// Pages of refused replicas that may be freed now.
    pub fn due_frees(&mut self, now: Timestamp) -> Vec<Location> {
        let mut due = Vec::new();
        while let Some((at, location)) = self.refused.front().copied() {
            if at > now {
                break;
            }
            self.refused.pop_front();
            due.push(location);
        }
        due
    }

    /// Every held replica, for the rejoin report (in no particular order).
    pub fn replicas(&self) -> Vec<Holding> {
        self.replicas.values().copied().collect()
    }

    /// Replicas held now.
    pub fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    /// A namespace a client registered; the oldest-registered stay once the bound is met
    /// (the directory's table has the same bound).
    pub fn namespace_registered(&mut self, id: NamespaceId, descriptor: NamespaceDescriptor) {
        self.pending.remove(&id);
        if self.namespaces.len() < NAMESPACES_MAX || self.namespaces.contains_key(&id) {
            self.namespaces.insert(id, descriptor);
        }
    }

    /// A namespace a client registered while the directory was out of reach (its id is
    /// the descriptor's own): registered there later, by [`Holdings::pending_namespaces`]
    /// or a rejoin. `false` when the bound leaves no room for it.
    pub fn namespace_pending(&mut self, id: NamespaceId, descriptor: NamespaceDescriptor) -> bool {
        if self.namespaces.contains_key(&id) {
            // Registered before (or pending already): nothing more to do.
            return true;
        }
        if self.namespaces.len() >= NAMESPACES_MAX {
            return false;
        }
        self.namespaces.insert(id, descriptor);
        self.pending.insert(id);
        true
    }

    /// The directory answered `UnknownNamespace` for these namespaces (it forgot one no
    /// replica named, or restarted): those the node holds are registered again.
    pub fn reregister(&mut self, namespaces: impl IntoIterator<Item = NamespaceId>) {
        for id in namespaces {
            if self.namespaces.contains_key(&id) {
                self.pending.insert(id);
            }
        }
    }

    /// The namespaces still to register with the directory.
    pub fn pending_namespaces(&self) -> Vec<(NamespaceId, NamespaceDescriptor)> {
        self.pending
            .iter()
            .filter_map(|id| Some((*id, self.namespaces.get(id)?.clone())))
            .collect()
    }

    /// The namespaces to register again, with the ids the node's clients use.
    pub fn namespaces(&self) -> Vec<(NamespaceId, NamespaceDescriptor)> {
        self.namespaces
            .iter()
            .map(|(id, descriptor)| (*id, descriptor.clone()))
            .collect()
    }
}

/// Whether two locations of one allocation id name the same pages: the same generation at
/// the same offset.
fn same_place(held: &Location, asked: &Location) -> bool {
    held.generation == asked.generation && held.offset_bytes == asked.offset_bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Generation, ObjectId, PrefixDigest};

    fn holding(pool: u32, allocation: u64, generation: u64, offset_bytes: u64) -> Holding {
        Holding {
            object: ObjectId {
                namespace: NamespaceId([7; 16]),
                prefix: PrefixDigest::ROOT.chain(&[allocation as u32]),
                shard: 0,
                part: 0,
            },
            location: Location {
                pool: PoolId(pool),
                allocation: AllocationId(allocation),
                generation: Generation(generation),
                offset_bytes,
                length_bytes: 100,
            },
        }
    }

    #[test]
    fn a_freed_allocation_leaves_only_at_its_generation() {
        let mut holdings = Holdings::default();
        holdings.published(holding(0, 1, 5, 0));
        holdings.freed(&holding(0, 1, 4, 0).location);
        assert_eq!(
            holdings.replica_count(),
            1,
            "an older generation is not this replica"
        );
        holdings.freed(&holding(0, 1, 5, 0).location);
        assert_eq!(holdings.replica_count(), 0);
    }

    /// Found by the simulation over directory shards, where pools' shares fill fast: the
    /// reclaim of a replica (retired and evicted at once) reached the node before its
    /// commit's answer. The pages were freed; the late answer must not make the node hold
    /// them again (it would report them on rejoining, and answer hits on them).
    #[test]
    fn pages_freed_before_their_publication_are_not_held_after_it() {
        let mut holdings = Holdings::default();
        let late = holding(0, 1, 5, 0);
        holdings.freed(&late.location);
        assert!(!holdings.published(late), "a reclaim overtook the commit");
        assert_eq!(holdings.replica_count(), 0);
        // The allocation's next occupancy (a new generation) is held as usual.
        assert!(holdings.published(holding(0, 1, 6, 0)));
        assert_eq!(holdings.replica_count(), 1);
        // The remembered places are bounded.
        for allocation in 0..2 * FREED_UNPUBLISHED_MAX as u64 {
            holdings.freed(&holding(1, allocation, 1, 0).location);
        }
        assert_eq!(holdings.freed_unpublished.len(), FREED_UNPUBLISHED_MAX);
        assert_eq!(holdings.freed_unpublished_set.len(), FREED_UNPUBLISHED_MAX);
    }

    /// Found by the simulation: a restarted node numbers its allocations from the start, so
    /// a demotion task naming a replica the previous process wrote (same allocation id and
    /// generation, another offset) named the new process's object there, and the spill
    /// wrote one object's bytes under another's id.
    #[test]
    fn a_location_of_another_offset_is_not_the_held_replica() {
        let mut holdings = Holdings::default();
        holdings.published(holding(0, 1, 1, 262_144));
        let earlier_process = holding(0, 1, 1, 0).location;
        assert_eq!(holdings.object_at(&earlier_process), None);
        holdings.freed(&earlier_process);
        assert_eq!(holdings.replica_count(), 1, "not the held replica");
        assert!(holdings
            .object_at(&holding(0, 1, 1, 262_144).location)
            .is_some());
    }

    #[test]
    fn a_refused_replica_is_forgotten_at_once_and_freed_only_when_due() {
        let mut holdings = Holdings::default();
        let refused = holding(0, 1, 1, 0);
        holdings.published(refused);
        holdings.refused(refused.location, Timestamp(30));
        assert_eq!(holdings.replica_count(), 0, "not reported again");
        assert_eq!(holdings.due_frees(Timestamp(29)), vec![]);
        assert_eq!(holdings.due_frees(Timestamp(30)), vec![refused.location]);
        assert_eq!(holdings.due_frees(Timestamp(31)), vec![], "freed once");
    }

    #[test]
    fn a_lost_extent_takes_exactly_its_replicas() {
        let mut holdings = Holdings::default();
        holdings.published(holding(1, 1, 0, 0));
        holdings.published(holding(1, 2, 0, 4096));
        holdings.published(holding(1, 3, 0, 8192));
        holdings.published(holding(0, 4, 0, 4096));
        assert_eq!(holdings.extent_lost(PoolId(1), 4096, 4096), 1);
        let mut left: Vec<u64> = holdings
            .replicas()
            .iter()
            .map(|held| held.location.allocation.0)
            .collect();
        left.sort_unstable();
        assert_eq!(left, vec![1, 3, 4]);
    }
}
