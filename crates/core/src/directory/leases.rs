//! The lease table: a slab of leases with ids that go stale on reuse, and a deadline queue.
//! Leases of one kind have the same duration, so each kind's queue is in deadline order (a
//! node's delegation lasts longer than an engine's lease, see [`super::delegations`]); released leases
//! leave dead entries that are skipped on expiry and compacted when they outnumber the
//! live ones, which bounds the queue at twice the live leases. Each session's leases form an
//! intrusive list through their slots, so ending a session costs what it holds, not a scan
//! of every lease.

use crate::model::{shard_stamp, LeaseId, ReplicaId, SessionId, Timestamp, ID_GENERATION_BITS};
use std::collections::{HashMap, VecDeque};

const NONE: u32 = u32::MAX;

/// A live lease.
#[derive(Clone, Copy, Debug)]
pub struct LeaseRecord {
    pub replica: ReplicaId,
    pub session: SessionId,
    pub deadline: Timestamp,
    /// A delegation: the node's own lease, under which it grants local leases.
    pub delegation: bool,
}

/// A slot's reuse count, below the shard bits of its ids ([`crate::model::SHARD_SHIFT`]).
/// Lease ids leave their top bit clear: a node numbers its local leases with it set, so the
/// two never meet ([`crate::node::delegations`]).
const GENERATION_MASK: u32 = (1 << ID_GENERATION_BITS) - 1;

#[derive(Clone, Copy, Debug)]
struct Slot {
    lease: Option<LeaseRecord>,
    /// The shard's bits and the reuse count: the upper half of the slot's lease ids.
    generation: u32,
    next_free: u32,
    /// Neighbours among the leases of the same session (meaningful while live), or `NONE`.
    session_previous: u32,
    session_next: u32,
}

/// Leases by id, bounded by `leases_max`.
pub struct LeaseTable {
    slots: Vec<Slot>,
    /// Free slots, reused oldest-freed first (see the replica table).
    free_head: u32,
    free_tail: u32,
    live: u32,
    leases_max: u32,
    /// The deadline queues of engine leases and of delegations.
    deadlines: [VecDeque<(Timestamp, LeaseId)>; 2],
    /// The first lease slot of each session holding a lease: at most one entry per live
    /// lease, removed with the session's last lease.
    session_heads: HashMap<SessionId, u32>,
    /// The upper half of the ids of the shard that owns this table ([`shard_stamp`]).
    stamp: u32,
}

fn split(id: LeaseId) -> (usize, u32) {
    ((id.0 & u64::from(u32::MAX)) as usize, (id.0 >> 32) as u32)
}

impl LeaseTable {
    /// An empty table holding at most `leases_max` live leases.
    pub fn new(leases_max: u32, shard: usize) -> LeaseTable {
        LeaseTable {
            slots: Vec::new(),
            free_head: NONE,
            free_tail: NONE,
            live: 0,
            leases_max: leases_max.min(NONE - 1),
            deadlines: [VecDeque::new(), VecDeque::new()],
            session_heads: HashMap::new(),
            stamp: (shard_stamp(shard) >> 32) as u32,
        }
    }

    /// Live leases.
    pub fn len(&self) -> u32 {
        self.live
    }

    /// Whether `count` more leases fit.
    pub fn has_room(&self, count: u32) -> bool {
        self.live.saturating_add(count) <= self.leases_max
    }

    /// Grants a lease; the caller checked [`LeaseTable::has_room`] and that deadlines are
    /// granted in non-decreasing order.
    pub fn insert(&mut self, record: LeaseRecord) -> LeaseId {
        assert!(self.has_room(1), "lease table over its bound");
        let slot = if self.free_head != NONE {
            let slot = self.free_head as usize;
            self.free_head = self.slots[slot].next_free;
            if self.free_head == NONE {
                self.free_tail = NONE;
            }
            self.slots[slot].lease = Some(record);
            slot
        } else {
            self.slots.push(Slot {
                lease: Some(record),
                generation: self.stamp,
                next_free: NONE,
                session_previous: NONE,
                session_next: NONE,
            });
            self.slots.len() - 1
        };
        let head = self
            .session_heads
            .insert(record.session, slot as u32)
            .unwrap_or(NONE);
        self.slots[slot].session_previous = NONE;
        self.slots[slot].session_next = head;
        if head != NONE {
            self.slots[head as usize].session_previous = slot as u32;
        }
        self.live += 1;
        let id = LeaseId(u64::from(self.slots[slot].generation) << 32 | slot as u64);
        self.deadlines[usize::from(record.delegation)].push_back((record.deadline, id));
        id
    }

    /// The live lease named by `id`.
    pub fn get(&self, id: LeaseId) -> Option<&LeaseRecord> {
        let (slot, generation) = split(id);
        self.slots
            .get(slot)
            .filter(|slot| slot.generation == generation)
            .and_then(|slot| slot.lease.as_ref())
    }

    /// Removes a live lease; its id goes stale.
    pub fn remove(&mut self, id: LeaseId) -> Option<LeaseRecord> {
        self.get(id)?;
        let (index, _) = split(id);
        let (previous, next) = (
            self.slots[index].session_previous,
            self.slots[index].session_next,
        );
        if next != NONE {
            self.slots[next as usize].session_previous = previous;
        }
        if previous != NONE {
            self.slots[previous as usize].session_next = next;
        } else if let Some(session) = self.slots[index].lease.map(|lease| lease.session) {
            if next == NONE {
                self.session_heads.remove(&session);
            } else {
                self.session_heads.insert(session, next);
            }
        }
        let slot = &mut self.slots[index];
        let record = slot.lease.take();
        slot.generation = self.stamp | (slot.generation.wrapping_add(1) & GENERATION_MASK);
        slot.next_free = NONE;
        if self.free_tail == NONE {
            self.free_head = index as u32;
        } else {
            self.slots[self.free_tail as usize].next_free = index as u32;
        }
        self.free_tail = index as u32;
        self.live -= 1;
        let queued = self.deadlines[0].len() + self.deadlines[1].len();
        if queued > 2 * self.live as usize + 1024 {
            let slots = &self.slots;
            for queue in &mut self.deadlines {
                queue.retain(|(_, id)| {
                    let (slot, generation) = split(*id);
                    slots[slot].generation == generation && slots[slot].lease.is_some()
                });
            }
        }
        record
    }

    /// Removes and returns one lease whose deadline is at or before `now`, if any.
    pub fn pop_expired(&mut self, now: Timestamp) -> Option<(LeaseId, LeaseRecord)> {
        loop {
            let due = (0..2)
                .filter_map(|kind| Some((self.deadlines[kind].front()?.0, kind)))
                .filter(|(deadline, _)| *deadline <= now)
                .min()?;
            let (_, id) = self.deadlines[due.1].pop_front()?;
            if let Some(record) = self.remove(id) {
                return Some((id, record));
            }
        }
    }

    /// The live leases of `session`, newest first, in time proportional to their number.
    pub fn of_session(
        &self,
        session: SessionId,
    ) -> impl Iterator<Item = (LeaseId, &LeaseRecord)> + '_ {
        let mut cursor = self.session_heads.get(&session).copied().unwrap_or(NONE);
        std::iter::from_fn(move || {
            let index = cursor as usize;
            let slot = self.slots.get(index)?;
            cursor = slot.session_next;
            let lease = slot.lease.as_ref()?;
            Some((
                LeaseId(u64::from(slot.generation) << 32 | index as u64),
                lease,
            ))
        })
    }

    /// Every live lease.
    pub fn iter(&self) -> impl Iterator<Item = (LeaseId, &LeaseRecord)> + '_ {
        self.slots.iter().enumerate().filter_map(|(index, slot)| {
            slot.lease.as_ref().map(|lease| {
                (
                    LeaseId(u64::from(slot.generation) << 32 | index as u64),
                    lease,
                )
            })
        })
    }
}
