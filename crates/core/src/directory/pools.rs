//! Registered pools and their byte accounting. Counters change only through the methods
//! here, each of which moves bytes between states, so `reserved + allocated <= capacity`
//! holds by construction and is asserted.

use super::ops::{ExtentClaim, ExtentReturn};
use crate::model::{NodeId, OwnerWord, PoolSpec, PoolUsage, SaltGroup, SessionId, Timestamp};
use crate::policy::profiles::TierProfile;
use std::collections::{BTreeMap, HashMap};

/// The extents of a shared pool: fixed-size ranges the directory grants to one session at a
/// time, so two nodes never allocate the same bytes. An extent whose session ended stays
/// held until its last replica is freed, then cools down (a partitioned node's engines may
/// still write into grants they hold) before it is granted again.
#[derive(Debug)]
pub struct ExtentTable {
    extent_bytes: u64,
    slots: Vec<ExtentSlot>,
}

/// An extent [`ExtentTable::grant`] handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantedExtent {
    pub offset_bytes: u64,
    pub length_bytes: u64,
    /// The owner word the grantee takes the extent from, when this incarnation knows it.
    pub owner_word: Option<OwnerWord>,
}

impl ExtentSlot {
    /// An extent given back: no owner, cooling until `cool_until`, its word kept.
    fn released(cool_until: Timestamp, word: Option<OwnerWord>) -> ExtentSlot {
        ExtentSlot {
            owner: None,
            replicas: 0,
            elsewhere: 0,
            cool_until,
            claimable: false,
            word,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct ExtentSlot {
    owner: Option<SessionId>,
    /// Committed replicas inside, of this shard's objects.
    replicas: u32,
    /// Committed replicas inside of the other shards' objects (a sharded directory keeps
    /// each shard told, [`super::ExtentDelta`]): the extent is empty only when both are 0.
    elsewhere: u32,
    /// Not granted again before this time.
    cool_until: Timestamp,
    /// Held at start because a previous incarnation may have granted it: the node that
    /// held it may claim it back when it rejoins.
    claimable: bool,
    /// The extent's owner word in shared memory as this incarnation last learnt it (from a
    /// grant it made or a claim it heard); `None` until then.
    word: Option<OwnerWord>,
}

impl ExtentTable {
    /// `capacity_bytes / extent_bytes` free extents.
    pub fn new(capacity_bytes: u64, extent_bytes: u64) -> ExtentTable {
        let count = capacity_bytes / extent_bytes.max(1);
        let free = ExtentSlot {
            owner: None,
            replicas: 0,
            elsewhere: 0,
            cool_until: Timestamp::ZERO,
            claimable: false,
            word: None,
        };
        ExtentTable {
            extent_bytes,
            slots: vec![free; count as usize],
        }
    }

    /// Grants the lowest free, cooled extent to `session` (of `node`): its offset, length
    /// and the owner word the node takes it from.
    pub fn grant(
        &mut self,
        session: SessionId,
        node: NodeId,
        now: Timestamp,
    ) -> Option<GrantedExtent> {
        let index = self
            .slots
            .iter()
            .position(|slot| slot.owner.is_none() && slot.cool_until <= now)?;
        let known = self.slots[index].word;
        self.slots[index] = ExtentSlot {
            owner: Some(session),
            replicas: 0,
            elsewhere: 0,
            cool_until: Timestamp::ZERO,
            claimable: false,
            word: known.map(|word| word.taken_by(node)),
        };
        Some(GrantedExtent {
            offset_bytes: index as u64 * self.extent_bytes,
            length_bytes: self.extent_bytes,
            owner_word: known,
        })
    }

    /// The extent holding `[offset, offset + length)` if `session` owns it entirely.
    pub fn owned_extent(
        &self,
        offset_bytes: u64,
        length_bytes: u64,
        session: SessionId,
    ) -> Option<usize> {
        let index = (offset_bytes / self.extent_bytes) as usize;
        let end = offset_bytes.checked_add(length_bytes)?;
        let extent_end = (index as u64 + 1) * self.extent_bytes;
        (self.slots.get(index)?.owner == Some(session) && end <= extent_end).then_some(index)
    }

    /// The session owning the extent at `offset_bytes`.
    pub fn owner_of(&self, offset_bytes: u64) -> Option<SessionId> {
        self.slots
            .get(self.index_of(offset_bytes))
            .and_then(|slot| slot.owner)
    }

    /// Extents held by `session`.
    pub fn held_by(&self, session: SessionId) -> u32 {
        self.slots
            .iter()
            .filter(|slot| slot.owner == Some(session))
            .count() as u32
    }

    /// A replica was committed at `offset_bytes`.
    pub fn add_replica(&mut self, offset_bytes: u64) {
        let index = self.index_of(offset_bytes);
        if let Some(slot) = self.slots.get_mut(index) {
            slot.replicas += 1;
        }
    }

    /// A replica of another shard's object was committed at `offset_bytes`.
    pub fn add_elsewhere(&mut self, offset_bytes: u64) {
        let index = self.index_of(offset_bytes);
        if let Some(slot) = self.slots.get_mut(index) {
            slot.elsewhere += 1;
        }
    }

    /// A committed replica at `offset_bytes` was freed (of this shard's objects, or of
    /// another shard's when `elsewhere`); the extent is released (to cool until
    /// `cool_until`) when it was the last one and its owner (per `open`) has ended.
    pub fn remove_replica(
        &mut self,
        offset_bytes: u64,
        elsewhere: bool,
        open: impl Fn(SessionId) -> bool,
        cool_until: Timestamp,
    ) {
        let index = self.index_of(offset_bytes);
        if let Some(slot) = self.slots.get_mut(index) {
            let count = if elsewhere {
                &mut slot.elsewhere
            } else {
                &mut slot.replicas
            };
            *count = count
                .checked_sub(1)
                .expect("extent replica count underflow");
            if slot.replicas + slot.elsewhere == 0 && slot.owner.is_some_and(|owner| !open(owner)) {
                *slot = ExtentSlot::released(cool_until, slot.word);
            }
        }
    }

    /// `session` ended: its empty extents are released, to cool until `cool_until`; the
    /// others wait for their replicas.
    pub fn release_empty(&mut self, session: SessionId, cool_until: Timestamp) {
        for slot in &mut self.slots {
            if slot.owner == Some(session) && slot.replicas + slot.elsewhere == 0 {
                *slot = ExtentSlot::released(cool_until, slot.word);
            }
        }
    }

    /// Every extent as the shards of a sharded directory must agree on it: its owner, its
    /// committed replicas over all shards, its cooling and claim state, its owner word.
    pub fn agreed(&self) -> Vec<super::invariants::AgreedExtent> {
        self.slots
            .iter()
            .map(|slot| {
                (
                    slot.owner,
                    slot.replicas + slot.elsewhere,
                    slot.cool_until,
                    slot.claimable,
                    slot.word,
                )
            })
            .collect()
    }

    /// The live owner gives back an extent it no longer allocates in: released to cool
    /// until `cool_until` when it holds no committed replica; `InUse` when it still does;
    /// `NotOwner` when it is not `session`'s or `offset_bytes` is not its start.
    pub fn give_back(
        &mut self,
        session: SessionId,
        offset_bytes: u64,
        cool_until: Timestamp,
    ) -> ExtentReturn {
        let index = self.index_of(offset_bytes);
        match self.slots.get_mut(index) {
            Some(slot) if slot.owner == Some(session) && offset_bytes % self.extent_bytes == 0 => {
                if slot.replicas + slot.elsewhere > 0 {
                    return ExtentReturn::InUse;
                }
                *slot = ExtentSlot::released(cool_until, slot.word);
                ExtentReturn::Returned
            }
            _ => ExtentReturn::NotOwner,
        }
    }

    /// No free extent is granted before `until` (extents cooling longer keep their time);
    /// until one is granted, the node that held it may claim it.
    pub fn hold_until(&mut self, until: Timestamp) {
        for slot in self.slots.iter_mut().filter(|slot| slot.owner.is_none()) {
            slot.cool_until = slot.cool_until.max(until);
            slot.claimable = true;
        }
    }

    /// A rejoining `session` claims `claim`'s extent: true when it is the session's now —
    /// already its own, held at start and not yet granted or claimed, or held by an ended
    /// session for which `same_node_ended` holds (the same node's earlier session). Never
    /// another node's, nor one given back or released. The owner word the node wrote is
    /// learnt either way.
    pub fn claim(
        &mut self,
        session: SessionId,
        claim: &ExtentClaim,
        same_node_ended: impl Fn(SessionId) -> bool,
    ) -> bool {
        if claim.offset_bytes % self.extent_bytes != 0 {
            return false;
        }
        let index = self.index_of(claim.offset_bytes);
        let Some(slot) = self.slots.get_mut(index) else {
            return false;
        };
        let claimed = match slot.owner {
            Some(owner) if owner == session => true,
            Some(owner) if same_node_ended(owner) => {
                slot.owner = Some(session);
                true
            }
            None if slot.claimable => {
                *slot = ExtentSlot {
                    owner: Some(session),
                    replicas: 0,
                    elsewhere: 0,
                    cool_until: Timestamp::ZERO,
                    claimable: false,
                    word: slot.word,
                };
                true
            }
            None | Some(_) => false,
        };
        // A claim carries a word only when the node's swap to it succeeded, so it is what
        // shared memory holds (a grant still in flight from an older word fails to take it).
        if claim.owner_word.is_some() {
            slot.word = claim.owner_word;
        }
        claimed
    }

    /// The holder `session` of the extent at `offset_bytes` found `word` in shared memory.
    pub fn learn_word(&mut self, session: SessionId, offset_bytes: u64, word: OwnerWord) {
        let index = self.index_of(offset_bytes);
        if let Some(slot) = self.slots.get_mut(index) {
            if slot.owner == Some(session) {
                slot.word = Some(word);
            }
        }
    }

    /// Committed replicas per extent, this shard's and the other shards', for invariant
    /// checks.
    pub fn replica_counts(
        &self,
    ) -> impl Iterator<Item = (usize, Option<SessionId>, u32, u32)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .map(|(index, slot)| (index, slot.owner, slot.replicas, slot.elsewhere))
    }

    /// The extent index of `offset_bytes`.
    pub fn index_of(&self, offset_bytes: u64) -> usize {
        (offset_bytes / self.extent_bytes) as usize
    }
}

/// A registered pool.
#[derive(Debug)]
pub struct PoolRecord {
    pub spec: PoolSpec,
    /// For a host pool, the session that registered it in the current epoch; `None` once
    /// that session is gone (the pool then accepts nothing until re-registered).
    pub owner_session: Option<SessionId>,
    pub reserved_bytes: u64,
    pub ready_bytes: u64,
    /// READY replicas, counted beside `ready_bytes` for the pool's mean object size.
    pub ready_replicas: u64,
    pub retiring_bytes: u64,
    pub pinned_bytes: u64,
    /// For a shared pool, who may allocate where.
    pub extents: Option<ExtentTable>,
    /// The profile the policy prices this pool by: representative, then the most
    /// conservative of the measurements its nodes reported, then the operator's overrides.
    pub profile: TierProfile,
    /// The latest measurement each node reported of this pool, at most one per node (so
    /// bounded by `nodes_max`): a node replaces its own report, never another's.
    pub reports: BTreeMap<NodeId, TierProfile>,
    /// For a node's SSD pool, the accesses an object needs before it is spilled there (the
    /// node's `[nodes.ssd] admit_after_accesses`); `None`: the directory's
    /// `wear_admit_frequency_min`.
    pub admit_after_accesses: Option<u32>,
    /// Live bytes (reserved and READY) of each salt group here, for the groups' quotas;
    /// only groups with bytes here (at most one per registered namespace).
    group_bytes: HashMap<SaltGroup, u64, foldhash::fast::RandomState>,
    /// This shard's part of the capacity ([`super::ShardPlace::share`]): what it reserves
    /// against. All of it when the directory has one shard.
    pub budget_bytes: u64,
}

impl PoolRecord {
    /// A pool with nothing in it, of which this shard may use `budget_bytes`.
    pub fn new(
        spec: PoolSpec,
        owner_session: Option<SessionId>,
        profile: TierProfile,
        budget_bytes: u64,
    ) -> PoolRecord {
        let extents = spec
            .extent_bytes
            .map(|extent_bytes| ExtentTable::new(spec.capacity_bytes, extent_bytes));
        PoolRecord {
            extents,
            spec,
            owner_session,
            reserved_bytes: 0,
            ready_bytes: 0,
            ready_replicas: 0,
            retiring_bytes: 0,
            pinned_bytes: 0,
            profile,
            reports: BTreeMap::new(),
            admit_after_accesses: None,
            group_bytes: HashMap::default(),
            budget_bytes,
        }
    }

    /// Counts `bytes` more of `group` here.
    pub fn charge(&mut self, group: SaltGroup, bytes: u64) {
        *self.group_bytes.entry(group).or_default() += bytes;
    }

    /// Counts `bytes` fewer of `group` here; a group left with none is forgotten.
    pub fn refund(&mut self, group: SaltGroup, bytes: u64) {
        if let Some(held) = self.group_bytes.get_mut(&group) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                self.group_bytes.remove(&group);
            }
        }
    }

    /// Live bytes of `group` here.
    pub fn group_bytes(&self, group: SaltGroup) -> u64 {
        self.group_bytes.get(&group).copied().unwrap_or(0)
    }

    /// The groups with live bytes here, and those bytes.
    pub fn groups(&self) -> impl Iterator<Item = (SaltGroup, u64)> + '_ {
        self.group_bytes
            .iter()
            .map(|(group, bytes)| (*group, *bytes))
    }

    /// Bytes of this shard's budget not reserved and not allocated.
    pub fn free_bytes(&self) -> u64 {
        self.budget_bytes - self.reserved_bytes - self.ready_bytes - self.retiring_bytes
    }

    /// Grants `bytes`; the caller checked [`PoolRecord::free_bytes`].
    pub fn reserve(&mut self, bytes: u64) {
        assert!(bytes <= self.free_bytes(), "pool reservation over capacity");
        self.reserved_bytes += bytes;
    }

    /// Returns an uncommitted reservation.
    pub fn abort(&mut self, bytes: u64) {
        self.reserved_bytes = self
            .reserved_bytes
            .checked_sub(bytes)
            .expect("reserved bytes underflow");
    }

    /// A reservation became READY.
    pub fn commit(&mut self, bytes: u64) {
        self.abort(bytes);
        self.ready_bytes += bytes;
        self.ready_replicas += 1;
    }

    /// A READY replica starts retiring.
    pub fn retire(&mut self, bytes: u64) {
        self.drop_ready(bytes);
        self.retiring_bytes += bytes;
    }

    fn drop_ready(&mut self, bytes: u64) {
        self.ready_bytes = self
            .ready_bytes
            .checked_sub(bytes)
            .expect("ready bytes underflow");
        self.ready_replicas = self
            .ready_replicas
            .checked_sub(1)
            .expect("ready replicas underflow");
    }

    /// About how many objects this shard's budget holds when full: the budget over the mean
    /// size of its READY objects (over its page size while it holds none).
    pub fn object_capacity(&self) -> u64 {
        let object_bytes = self
            .ready_bytes
            .checked_div(self.ready_replicas)
            .unwrap_or(self.spec.page_bytes);
        self.budget_bytes / object_bytes.max(1)
    }

    /// A replica's storage was reclaimed (or dropped with its owner's epoch).
    pub fn free(&mut self, bytes: u64, retiring: bool) {
        if retiring {
            self.retiring_bytes = self
                .retiring_bytes
                .checked_sub(bytes)
                .expect("retiring bytes underflow");
        } else {
            self.drop_ready(bytes);
        }
    }

    /// A replica's first lease was granted (`pinned`) or its last released.
    pub fn pin(&mut self, bytes: u64, pinned: bool) {
        if pinned {
            self.pinned_bytes += bytes;
        } else {
            self.pinned_bytes = self
                .pinned_bytes
                .checked_sub(bytes)
                .expect("pinned bytes underflow");
        }
    }

    /// The usage report; `quarantined` is everything allocated while the owner is away.
    pub fn usage(&self, owner_reachable: bool) -> PoolUsage {
        let allocated_bytes = self.ready_bytes + self.retiring_bytes;
        PoolUsage {
            capacity_bytes: self.budget_bytes,
            reserved_bytes: self.reserved_bytes,
            allocated_bytes,
            ready_bytes: self.ready_bytes,
            retiring_bytes: self.retiring_bytes,
            quarantined_bytes: if owner_reachable { 0 } else { allocated_bytes },
            pinned_bytes: self.pinned_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Timestamp {
        Timestamp(ms * 1_000_000)
    }

    #[test]
    fn a_grant_hands_on_the_owner_word_the_directory_learnt() {
        let (a, b) = (SessionId::new(1, 1), SessionId::new(1, 2));
        let (node_a, node_b) = (NodeId(0), NodeId(1));
        let mut table = ExtentTable::new(2 * 4096, 4096);
        let first = table.grant(a, node_a, at(0)).unwrap();
        assert_eq!(first.owner_word, None, "a new incarnation knows no word");
        table.hold_until(at(10));
        // A restart: `a` claims its extent back with the word it wrote.
        let written = OwnerWord(9 << 32 | 1);
        let claim = ExtentClaim {
            offset_bytes: first.offset_bytes,
            owner_word: Some(written),
        };
        assert!(table.claim(a, &claim, |_| false));
        assert_eq!(
            table.give_back(a, first.offset_bytes, at(20)),
            ExtentReturn::Returned
        );
        // The other extent was never claimed: unknown; this one's word is handed on.
        let second = table.grant(b, node_b, at(20)).unwrap();
        assert_eq!((second.offset_bytes, second.owner_word), (0, Some(written)));
        let third = table.grant(a, node_a, at(20)).unwrap();
        assert_eq!(third.owner_word, None);
        // The word after b took it is what the next grant of it starts from.
        assert_eq!(table.give_back(b, 0, at(30)), ExtentReturn::Returned);
        let again = table.grant(a, node_a, at(30)).unwrap();
        assert_eq!(again.owner_word, Some(written.taken_by(node_b)));
    }
}
