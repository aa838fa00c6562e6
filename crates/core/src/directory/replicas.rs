//! The replica table: a slab of compact replica records plus an index from object id to
//! the object's first replica. An object's replicas form an intrusive list through their
//! records, so a single-replica object costs one slab record and one 4-byte index entry.
//! Replica ids carry the slot's reuse count, so an id kept after its replica was freed
//! never names the slot's next occupant. READY replicas are also on recency lists, one per
//! pool and frequency class, so eviction finds each class's least recent replica at once.
//! Every live replica is on its pool's list, so dropping a pool costs what it holds.

use crate::model::{
    shard_stamp, AllocationId, Generation, Location, NodeId, ObjectId, PoolId, ReplicaId,
    Timestamp, ID_GENERATION_BITS,
};
use crate::policy::history::FREQUENCY_CLASSES;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// The end of an intrusive list.
const NONE: u32 = u32::MAX;

/// A replica's publication state. `Reserved -> Ready -> Retiring -> (freed)`; a reservation
/// that is abandoned, expires or loses its owner is aborted, which frees it at once because
/// no reader could have seen it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaState {
    /// Capacity granted to a writer; no reader may see it.
    Reserved,
    /// Written and committed; immutable; readable by every node that maps its pool.
    Ready,
    /// Blocks new acquires; freed once the last lease is released and the owner
    /// acknowledges the reclaim.
    Retiring,
    /// The slot is on the free list.
    Free,
}

impl ReplicaState {
    /// The state's name in errors and logs.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaState::Reserved => "reserved",
            ReplicaState::Ready => "ready",
            ReplicaState::Retiring => "retiring",
            ReplicaState::Free => "free",
        }
    }
}

/// One replica record. Kept compact (about 120 bytes): the directory holds tens of
/// millions of them.
#[derive(Clone, Debug)]
pub struct Replica {
    pub object: ObjectId,
    pub pool: PoolId,
    /// The node that wrote the replica and reclaims its storage.
    pub owner: NodeId,
    pub state: ReplicaState,
    pub lease_count: u32,
    /// Last acquire; while reserved, the reservation deadline.
    pub last_access: Timestamp,
    /// Logical length in bytes.
    pub length_bytes: u64,
    /// Bytes held in the pool (page-rounded).
    pub allocated_bytes: u64,
    /// Set at commit; meaningless while reserved.
    pub allocation: AllocationId,
    pub generation: Generation,
    pub offset_bytes: u64,
    /// The shard's bits and the reuse count: the upper half of the slot's replica ids.
    slot_generation: u32,
    /// Next replica of the same object, or next free slot.
    next: u32,
    /// Neighbours in its pool's recency list (READY replicas only), or `NONE`.
    newer: u32,
    older: u32,
    /// The frequency class whose recency list holds it (meaningful while listed).
    class: u8,
    /// Neighbours on its pool's list of live replicas, or `NONE`.
    pool_previous: u32,
    pool_next: u32,
}

impl Replica {
    /// The replica's location (meaningful once committed).
    pub fn location(&self) -> Location {
        Location {
            pool: self.pool,
            allocation: self.allocation,
            generation: self.generation,
            offset_bytes: self.offset_bytes,
            length_bytes: self.length_bytes,
        }
    }
}

/// The fields of a new reservation.
pub struct NewReplica {
    pub object: ObjectId,
    pub pool: PoolId,
    pub owner: NodeId,
    pub length_bytes: u64,
    pub allocated_bytes: u64,
    pub deadline: Timestamp,
}

/// The slab and the object index. Grows by a quarter at a time (not doubling) so that
/// slack stays under 25% of the records at tens of millions of replicas.
pub struct ReplicaTable {
    slots: Vec<Replica>,
    /// Free slots, reused oldest-freed first, so a slot's generation advances as slowly as
    /// possible (a stale id could only alias after 2^32 reuses of that very slot).
    free_head: u32,
    free_tail: u32,
    live: u32,
    index: HashTable<u32>,
    hasher: foldhash::fast::FixedState,
    replicas_max: u32,
    /// Per pool and frequency class: the most and least recently used READY replica (slot
    /// indices).
    recency: Vec<[(u32, u32); FREQUENCY_CLASSES]>,
    /// Per pool: the first of its live replicas (a slot index), or `NONE`.
    pool_heads: Vec<u32>,
    /// The upper half of the ids of the shard that owns this table ([`shard_stamp`]): a
    /// replica id names its shard, and another shard's id never validates here.
    stamp: u32,
}

/// A slot's reuse count, below the shard bits of its ids ([`crate::model::SHARD_SHIFT`]).
const GENERATION_MASK: u32 = (1 << ID_GENERATION_BITS) - 1;

fn split(id: ReplicaId) -> (u32, u32) {
    ((id.0 & u64::from(u32::MAX)) as u32, (id.0 >> 32) as u32)
}

impl ReplicaTable {
    /// An empty table holding at most `replicas_max` live replicas.
    pub fn new(replicas_max: u32, hash_seed: u64, shard: usize) -> ReplicaTable {
        ReplicaTable {
            slots: Vec::new(),
            free_head: NONE,
            free_tail: NONE,
            live: 0,
            index: HashTable::new(),
            hasher: foldhash::fast::FixedState::with_seed(hash_seed),
            replicas_max: replicas_max.min(NONE - 1),
            recency: Vec::new(),
            pool_heads: Vec::new(),
            stamp: (shard_stamp(shard) >> 32) as u32,
        }
    }

    /// Live replicas.
    pub fn len(&self) -> u32 {
        self.live
    }

    /// Distinct objects with at least one replica.
    pub fn object_count(&self) -> usize {
        self.index.len()
    }

    /// Whether another replica fits under `replicas_max`.
    pub fn has_room(&self) -> bool {
        self.live < self.replicas_max
    }

    fn hash(&self, object: &ObjectId) -> u64 {
        self.hasher.hash_one(object)
    }

    /// A 64-bit key of `object` (its index hash), for tables that outlive its replicas.
    pub fn key_of(&self, object: &ObjectId) -> u64 {
        self.hash(object)
    }

    /// The replica named by `id`, if it is live and the id is current.
    pub fn get(&self, id: ReplicaId) -> Option<&Replica> {
        let (slot, generation) = split(id);
        self.slots.get(slot as usize).filter(|replica| {
            replica.slot_generation == generation && replica.state != ReplicaState::Free
        })
    }

    /// Mutable access to the replica named by `id`, if it is live and the id is current.
    pub fn get_mut(&mut self, id: ReplicaId) -> Option<&mut Replica> {
        let (slot, generation) = split(id);
        self.slots.get_mut(slot as usize).filter(|replica| {
            replica.slot_generation == generation && replica.state != ReplicaState::Free
        })
    }

    fn id_of(&self, slot: u32) -> ReplicaId {
        ReplicaId(u64::from(self.slots[slot as usize].slot_generation) << 32 | u64::from(slot))
    }

    fn head(&self, object: &ObjectId) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(self.hash(object), |&slot| {
                slots[slot as usize].object == *object
            })
            .copied()
    }

    /// The replicas of `object`, newest first.
    pub fn of_object<'a>(
        &'a self,
        object: &ObjectId,
    ) -> impl Iterator<Item = (ReplicaId, &'a Replica)> + 'a {
        let mut cursor = self.head(object).unwrap_or(NONE);
        std::iter::from_fn(move || {
            if cursor == NONE {
                return None;
            }
            let slot = cursor;
            let replica = &self.slots[slot as usize];
            cursor = replica.next;
            Some((self.id_of(slot), replica))
        })
    }

    /// Inserts a reserved replica. The caller checked [`ReplicaTable::has_room`].
    pub fn insert(&mut self, new: NewReplica) -> ReplicaId {
        assert!(self.has_room(), "replica table over its bound");
        let head = self.head(&new.object);
        let record = Replica {
            object: new.object,
            pool: new.pool,
            owner: new.owner,
            state: ReplicaState::Reserved,
            lease_count: 0,
            last_access: new.deadline,
            length_bytes: new.length_bytes,
            allocated_bytes: new.allocated_bytes,
            allocation: AllocationId(0),
            generation: Generation(0),
            offset_bytes: 0,
            slot_generation: self.stamp,
            next: head.unwrap_or(NONE),
            newer: NONE,
            older: NONE,
            class: 0,
            pool_previous: NONE,
            pool_next: NONE,
        };
        let slot = if self.free_head != NONE {
            let slot = self.free_head;
            let entry = &mut self.slots[slot as usize];
            self.free_head = entry.next;
            if self.free_head == NONE {
                self.free_tail = NONE;
            }
            let slot_generation = entry.slot_generation;
            *entry = Replica {
                slot_generation,
                ..record
            };
            slot
        } else {
            if self.slots.len() == self.slots.capacity() {
                self.slots.reserve_exact(self.slots.len() / 4 + 1024);
            }
            self.slots.push(record);
            (self.slots.len() - 1) as u32
        };
        self.live += 1;
        self.link_pool(slot);
        let hash = self.hash(&new.object);
        match head {
            Some(old_head) => {
                let slots = &self.slots;
                if let Ok(mut entry) = self.index.find_entry(hash, |&candidate| {
                    candidate == old_head && slots[candidate as usize].object == new.object
                }) {
                    *entry.get_mut() = slot;
                }
            }
            None => {
                let slots = &self.slots;
                let hasher = &self.hasher;
                self.index.insert_unique(hash, slot, |&existing| {
                    hasher.hash_one(slots[existing as usize].object)
                });
            }
        }
        self.id_of(slot)
    }

    /// Removes a live replica, unlinking it from its object and bumping its slot's
    /// generation so the id goes stale. Returns the removed record.
    pub fn remove(&mut self, id: ReplicaId) -> Option<Replica> {
        self.unlink_recency(id);
        let removed = self.get(id)?.clone();
        let (slot, _) = split(id);
        self.unlink_pool(slot);
        let hash = self.hash(&removed.object);
        let head = self.head(&removed.object).unwrap_or(NONE);
        if head == slot {
            let slots = &self.slots;
            if let Ok(entry) = self.index.find_entry(hash, |&candidate| {
                candidate == slot && slots[candidate as usize].object == removed.object
            }) {
                if removed.next == NONE {
                    entry.remove();
                } else {
                    *entry.into_mut() = removed.next;
                }
            }
        } else {
            let mut cursor = head;
            while cursor != NONE {
                let next = self.slots[cursor as usize].next;
                if next == slot {
                    self.slots[cursor as usize].next = removed.next;
                    break;
                }
                cursor = next;
            }
        }
        let entry = &mut self.slots[slot as usize];
        entry.state = ReplicaState::Free;
        entry.slot_generation =
            self.stamp | (entry.slot_generation.wrapping_add(1) & GENERATION_MASK);
        entry.next = NONE;
        entry.lease_count = 0;
        if self.free_tail == NONE {
            self.free_head = slot;
        } else {
            self.slots[self.free_tail as usize].next = slot;
        }
        self.free_tail = slot;
        self.live -= 1;
        Some(removed)
    }

    /// Puts a READY replica at the most recent end of the recency list of its pool and
    /// frequency `class` (clamped to the last class), moving it from the list it was on.
    pub fn touch(&mut self, id: ReplicaId, class: usize) {
        let Some(pool) = self.get(id).map(|replica| replica.pool.0 as usize) else {
            return;
        };
        let class = class.min(FREQUENCY_CLASSES - 1);
        self.unlink_recency(id);
        let (slot, _) = split(id);
        if self.recency.len() <= pool {
            self.recency
                .resize(pool + 1, [(NONE, NONE); FREQUENCY_CLASSES]);
        }
        let (newest, oldest) = self.recency[pool][class];
        let entry = &mut self.slots[slot as usize];
        entry.newer = NONE;
        entry.older = newest;
        entry.class = class as u8;
        if newest != NONE {
            self.slots[newest as usize].newer = slot;
        }
        self.recency[pool][class] = (slot, if oldest == NONE { slot } else { oldest });
    }

    /// Takes a replica off its pool's recency list (no-op when not listed).
    pub fn unlink_recency(&mut self, id: ReplicaId) {
        let Some(replica) = self.get(id) else {
            return;
        };
        let (slot, _) = split(id);
        let (pool, class, newer, older) = (
            replica.pool.0 as usize,
            replica.class as usize,
            replica.newer,
            replica.older,
        );
        let Some(&(newest, oldest)) = self.recency.get(pool).map(|lists| &lists[class]) else {
            return;
        };
        if newer == NONE && older == NONE && newest != slot {
            return;
        }
        if newer == NONE {
            self.recency[pool][class].0 = older;
        } else {
            self.slots[newer as usize].older = older;
        }
        if older == NONE {
            self.recency[pool][class].1 = newer;
        } else {
            self.slots[older as usize].newer = newer;
        }
        debug_assert!(oldest != NONE);
        let entry = &mut self.slots[slot as usize];
        entry.newer = NONE;
        entry.older = NONE;
    }

    /// READY replicas of `pool` in frequency `class`, least recently used first.
    pub fn coldest(
        &self,
        pool: PoolId,
        class: usize,
    ) -> impl Iterator<Item = (ReplicaId, &Replica)> + '_ {
        let mut cursor = self
            .recency
            .get(pool.0 as usize)
            .and_then(|lists| lists.get(class))
            .map_or(NONE, |(_, oldest)| *oldest);
        std::iter::from_fn(move || {
            if cursor == NONE {
                return None;
            }
            let slot = cursor;
            cursor = self.slots[slot as usize].newer;
            Some((self.id_of(slot), &self.slots[slot as usize]))
        })
    }

    /// Panics unless every recency list is well linked: each entry's older neighbour links
    /// back to it, the recorded ends are the list's ends, each entry is on the list of its
    /// pool and class. Walks at most `live + 1` entries a list, so a cycle fails, not hangs.
    pub fn check_recency(&self) {
        for (pool, lists) in self.recency.iter().enumerate() {
            for (class, &(newest, oldest)) in lists.iter().enumerate() {
                let (mut cursor, mut previous, mut steps) = (oldest, NONE, 0u32);
                while cursor != NONE {
                    assert!(
                        steps <= self.live,
                        "recency list {pool}/{class} has a cycle"
                    );
                    let entry = &self.slots[cursor as usize];
                    assert_eq!(entry.older, previous, "broken link in list {pool}/{class}");
                    assert_eq!(
                        (entry.pool.0 as usize, entry.class as usize),
                        (pool, class),
                        "replica on another pool's or class's list"
                    );
                    (previous, cursor, steps) = (cursor, entry.newer, steps + 1);
                }
                assert_eq!(previous, newest, "newest end of list {pool}/{class}");
            }
        }
    }

    /// Puts the live replica in `slot` at the head of its pool's list.
    fn link_pool(&mut self, slot: u32) {
        let pool = self.slots[slot as usize].pool.0 as usize;
        if self.pool_heads.len() <= pool {
            self.pool_heads.resize(pool + 1, NONE);
        }
        let head = self.pool_heads[pool];
        let entry = &mut self.slots[slot as usize];
        entry.pool_previous = NONE;
        entry.pool_next = head;
        if head != NONE {
            self.slots[head as usize].pool_previous = slot;
        }
        self.pool_heads[pool] = slot;
    }

    /// Takes the live replica in `slot` off its pool's list.
    fn unlink_pool(&mut self, slot: u32) {
        let entry = &self.slots[slot as usize];
        let (pool, previous, next) = (entry.pool.0 as usize, entry.pool_previous, entry.pool_next);
        if next != NONE {
            self.slots[next as usize].pool_previous = previous;
        }
        if previous != NONE {
            self.slots[previous as usize].pool_next = next;
        } else if let Some(head) = self.pool_heads.get_mut(pool) {
            *head = next;
        }
        let entry = &mut self.slots[slot as usize];
        entry.pool_previous = NONE;
        entry.pool_next = NONE;
    }

    /// The live replicas of `pool`, newest first, in time proportional to their number.
    pub fn in_pool(&self, pool: PoolId) -> impl Iterator<Item = (ReplicaId, &Replica)> + '_ {
        let mut cursor = self
            .pool_heads
            .get(pool.0 as usize)
            .copied()
            .unwrap_or(NONE);
        std::iter::from_fn(move || {
            if cursor == NONE {
                return None;
            }
            let slot = cursor;
            cursor = self.slots[slot as usize].pool_next;
            Some((self.id_of(slot), &self.slots[slot as usize]))
        })
    }

    /// Every live replica, in slot order (for invariant checks and bulk decisions).
    pub fn iter(&self) -> impl Iterator<Item = (ReplicaId, &Replica)> + '_ {
        (0..self.slots.len() as u32)
            .filter(|&slot| self.slots[slot as usize].state != ReplicaState::Free)
            .map(|slot| (self.id_of(slot), &self.slots[slot as usize]))
    }

    /// Bytes of memory the table's arrays hold (slab and index), for capacity planning.
    pub fn memory_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Replica>()
            + self.index.capacity() * (std::mem::size_of::<u32>() + 1)
    }
}
