//! The node's half of delegations ([`crate::directory`]'s `delegations` has the contract):
//! the replicas this node answers hits on itself, the local leases it granted under each,
//! and what it owes the directory (delegations to release, hits to report).
//!
//! A local hit costs one lookup here and no message to the directory. The rules that keep
//! it safe, each checked by the tests below and by the simulation:
//!
//! * a local lease is granted only while its whole length fits in what is left of the
//!   delegation (on this node's clock, measured from before the delegation was asked for,
//!   so never later than the directory's deadline);
//! * once recalled, a delegation grants nothing more, and it is released only when no local
//!   lease under it is live (released, or its deadline passed);
//! * a recall of a delegation this node has not heard of yet is remembered, so a grant
//!   that arrives after its recall is released at once instead of served.
//!
//! The node also answers hits on the replicas it published in its own CPU pools
//! ([`Delegations::owned`]) from the moment their commit is answered, with no delegation:
//! only this node frees those pages, and only when the directory hands it their reclaim
//! ([`Delegations::may_reclaim`]). That reclaim is the recall: from it the replica grants
//! nothing more, and it is done (pages freed, acknowledged) only once no local lease on it
//! is live, then at once ([`Delegations::take_reclaims_ready`]); until then it is not
//! acknowledged (the directory hands it out again, and finds it done).
//!
//! Bounds: [`DELEGATIONS_MAX`] delegations, [`OWNED_MAX`] owned replicas, the local leases
//! of the clients' books (each client's and each user's lease bounds), [`EARLY_RECALLS_MAX`]
//! early recalls, and the outboxes by the entries they come from.

use crate::directory::{Delegation, Lease, LocalHits, ProbeOutcome};
use crate::model::{LeaseId, Location, ObjectId, ReplicaId, Timestamp};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// The top bit of a local lease's id: directory lease ids never set it.
pub const LOCAL_LEASE_BIT: u64 = 1 << 63;
/// Delegations one node holds: the directory's default bound for a session.
pub const DELEGATIONS_MAX: usize = 1 << 16;
/// Replicas of its own CPU pools a node answers hits on without a delegation: 2^18, a
/// 512 GiB pool of 2 MiB chunks, about 40 MiB of index. Past it, a published replica's
/// hits go to the directory (and bring a delegation) as any other's.
pub const OWNED_MAX: usize = 1 << 18;
/// Tags the index's key of an owned replica (with [`LOCAL_LEASE_BIT`], which no
/// directory lease sets): a key only this node uses, never sent.
const OWNED_BIT: u64 = 1 << 62;
/// Recalls remembered for delegations whose grant has not arrived yet.
pub const EARLY_RECALLS_MAX: usize = 4096;
/// An early recall is kept at least this long (or as long as the longest delegation).
const EARLY_RECALL_KEPT_MIN: Duration = Duration::from_secs(120);

/// Whether `lease` is a local lease (granted by a node under a delegation).
pub fn is_local(lease: LeaseId) -> bool {
    lease.0 & LOCAL_LEASE_BIT != 0
}

#[derive(Debug)]
struct Delegated {
    object: ObjectId,
    /// The lease the delegation came with: what a local lease says (replica, medium,
    /// location), and the length of a local lease.
    template: Lease,
    /// Until when the delegation lasts, on this node's clock.
    valid_until: Timestamp,
    /// When its recall arrived (for an owned replica: its reclaim).
    recalled: Option<Timestamp>,
    /// A replica this node published in its own CPU pool, not a delegation: nothing to
    /// release at the directory, and no end but its reclaim or the session's.
    owned: bool,
    /// Whether it is the one `index` names for its object (a newer grant supersedes it).
    current: bool,
    /// Local leases under it still live.
    readers: u32,
    unreported_hits: u32,
}

impl Delegated {
    fn local_duration(&self) -> Duration {
        Duration::from_millis(self.template.duration_ms)
    }

    /// Whether a local lease granted at `now` fits in what is left.
    fn grants_at(&self, now: Timestamp) -> bool {
        self.recalled.is_none() && now + self.local_duration() <= self.valid_until
    }
}

/// What the node counted since its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DelegationCounts {
    /// Objects acquired under a delegation, with no message to the directory.
    pub local_hits: u64,
    /// Recalls received (a repeated recall of one delegation counts once).
    pub recalls: u64,
    /// Probes and acquires this node asked the directory for (its clients' misses of the
    /// index).
    pub directory_lookups: u64,
    /// Of those, the ones the directory answered with a hit (an object held, or leased):
    /// the hits that needed the directory, one count per request.
    pub directory_hit_lookups: u64,
    /// Reclaims of owned replicas put off because a local lease read them (each counted
    /// once, however often its task comes back).
    pub reclaims_deferred: u64,
}

/// The delegations this node holds. See the module documentation.
#[derive(Debug, Default)]
pub struct Delegations {
    delegated: HashMap<LeaseId, Delegated, foldhash::fast::RandomState>,
    /// The delegation each object's hits are answered under.
    index: HashMap<ObjectId, LeaseId, foldhash::fast::RandomState>,
    /// The key in `delegated` of each owned replica ([`Delegations::owned`]).
    owned: HashMap<ReplicaId, LeaseId, foldhash::fast::RandomState>,
    next_owned: u64,
    /// Sessions ended so far ([`Delegations::clear`]): an owned replica is recorded only
    /// in the session its commit was sent in.
    sessions_ended: u64,
    /// Owned replicas whose reclaim waited for their last local lease, which has ended:
    /// to free and acknowledge now (bounded by the owned replicas).
    reclaims_ready: Vec<(ReplicaId, Location)>,
    /// Each live local lease's delegation.
    local: HashMap<LeaseId, LeaseId, foldhash::fast::RandomState>,
    /// Local leases in grant order, with their deadlines.
    local_deadlines: VecDeque<(Timestamp, LeaseId)>,
    /// Delegations in grant order, with their ends (about in order: a late end only
    /// forgets late, it never lets a lease be granted past it).
    delegation_ends: VecDeque<(Timestamp, LeaseId)>,
    next_local: u64,
    /// Recalls of delegations not heard of yet, each kept until this node's instant.
    early_recalls: HashMap<LeaseId, Timestamp>,
    /// Delegations to release at the directory.
    releases: Vec<LeaseId>,
    /// Delegations with hits not reported yet.
    hit_list: Vec<LeaseId>,
    /// How long recalled delegations took to be released, not yet taken for metrics
    /// (at most one per delegation).
    recall_latencies: Vec<Duration>,
    counts: DelegationCounts,
    /// The longest delegation granted so far: how long an early recall is kept.
    longest: Duration,
}

impl Delegations {
    /// The answers to a probe of `objects` at `now` when every one is a hit under a
    /// delegation; `None` (ask the directory) otherwise.
    pub fn probe(&self, now: Timestamp, objects: &[ObjectId]) -> Option<Vec<ProbeOutcome>> {
        self.probe_each(now, objects).into_iter().collect()
    }

    /// The outcome of each of `objects` that is a hit under a delegation at `now`, `None`
    /// for the others (the directory's to answer), in order.
    pub fn probe_each(&self, now: Timestamp, objects: &[ObjectId]) -> Vec<Option<ProbeOutcome>> {
        objects
            .iter()
            .map(|object| {
                let delegated = self.usable(now, object)?;
                Some(ProbeOutcome::Hit {
                    medium: delegated.template.medium,
                    length_bytes: delegated.template.location.length_bytes,
                })
            })
            .collect()
    }

    /// Whether every one of `objects` is a hit under a delegation at `now`.
    pub fn covers(&self, now: Timestamp, objects: &[ObjectId]) -> bool {
        objects
            .iter()
            .all(|object| self.usable(now, object).is_some())
    }

    fn usable(&self, now: Timestamp, object: &ObjectId) -> Option<&Delegated> {
        let lease = self.index.get(object)?;
        self.delegated
            .get(lease)
            .filter(|delegated| delegated.grants_at(now))
    }

    /// Local leases on `objects` at `now`, one per object in order, when every one is a
    /// hit under a delegation; `None` (and nothing granted) otherwise. Each lease's
    /// `deadline` is on this node's clock.
    pub fn acquire(&mut self, now: Timestamp, objects: &[ObjectId]) -> Option<Vec<Lease>> {
        if !self.covers(now, objects) {
            return None;
        }
        objects
            .iter()
            .map(|object| self.grant_local(now, object))
            .collect()
    }

    /// Whether any of `objects` is a hit under a delegation at `now`.
    pub fn covers_any(&self, now: Timestamp, objects: &[ObjectId]) -> bool {
        objects
            .iter()
            .any(|object| self.usable(now, object).is_some())
    }

    /// A local lease on each of `objects` that is a hit under a delegation at `now`,
    /// `None` for the others (the directory's to lease), in order.
    pub fn acquire_each(&mut self, now: Timestamp, objects: &[ObjectId]) -> Vec<Option<Lease>> {
        objects
            .iter()
            .map(|object| {
                self.usable(now, object)?;
                self.grant_local(now, object)
            })
            .collect()
    }

    /// A local lease on `object`, which [`Delegations::covers`] just found delegated.
    fn grant_local(&mut self, now: Timestamp, object: &ObjectId) -> Option<Lease> {
        let delegation = *self.index.get(object)?;
        let delegated = self.delegated.get_mut(&delegation)?;
        self.next_local = self.next_local.wrapping_add(1) & !LOCAL_LEASE_BIT;
        let lease = LeaseId(LOCAL_LEASE_BIT | self.next_local);
        let deadline = now + delegated.local_duration();
        delegated.readers += 1;
        if delegated.unreported_hits == 0 {
            self.hit_list.push(delegation);
        }
        delegated.unreported_hits = delegated.unreported_hits.saturating_add(1);
        self.local.insert(lease, delegation);
        self.local_deadlines.push_back((deadline, lease));
        self.counts.local_hits += 1;
        Some(Lease {
            lease,
            deadline,
            ..delegated.template
        })
    }

    /// A delegation arrived for `object` with `lease` (asked for at `asked`, on this
    /// node's clock). It answers the object's hits from now on; the one it supersedes is
    /// released once no local lease under it is live. An object this node answers from a
    /// replica in its own CPU pool (owned, not reclaimed) keeps it, the cheapest to read:
    /// the delegation (one offered on a copy in shared memory) is released at once.
    pub fn granted(
        &mut self,
        asked: Timestamp,
        object: ObjectId,
        lease: &Lease,
        delegation: Delegation,
    ) {
        if self.delegated.contains_key(&delegation.lease) {
            // The same grant twice: it is held already (releasing it would end it).
            return;
        }
        let owned_answers = self
            .index
            .get(&object)
            .and_then(|current| self.delegated.get(current))
            .is_some_and(|current| current.owned && current.recalled.is_none());
        if self.early_recalls.remove(&delegation.lease).is_some()
            || owned_answers
            || self.delegated.len() - self.owned.len() >= DELEGATIONS_MAX
        {
            self.releases.push(delegation.lease);
            return;
        }
        let length = Duration::from_millis(delegation.duration_ms);
        self.longest = self.longest.max(length);
        if let Some(previous) = self.index.insert(object, delegation.lease) {
            if let Some(superseded) = self.delegated.get_mut(&previous) {
                superseded.current = false;
            }
            self.release_if_idle(asked, previous);
        }
        self.delegation_ends
            .push_back((asked + length, delegation.lease));
        self.delegated.insert(
            delegation.lease,
            Delegated {
                object,
                template: *lease,
                valid_until: asked + length,
                recalled: None,
                owned: false,
                current: true,
                readers: 0,
                unreported_hits: 0,
            },
        );
    }

    /// The client gave a local lease back (or its deadline passed, or its client left):
    /// `true` when it was a live local lease.
    pub fn release_local(&mut self, now: Timestamp, lease: LeaseId) -> bool {
        let Some(delegation) = self.local.remove(&lease) else {
            return false;
        };
        if let Some(delegated) = self.delegated.get_mut(&delegation) {
            delegated.readers = delegated.readers.saturating_sub(1);
        }
        self.release_if_idle(now, delegation);
        true
    }

    /// Releases `delegation` when it grants no more (recalled or superseded) and no local
    /// lease under it is live.
    fn release_if_idle(&mut self, now: Timestamp, delegation: LeaseId) {
        let Some(delegated) = self.delegated.get(&delegation) else {
            return;
        };
        if delegated.readers > 0 || (delegated.current && delegated.recalled.is_none()) {
            return;
        }
        let (owned, replica, location) = (
            delegated.owned,
            delegated.template.replica,
            delegated.template.location,
        );
        match (owned, delegated.recalled) {
            (false, Some(recalled)) => self.recall_latencies.push(now.saturating_since(recalled)),
            // Its reclaim came while it was read: it is done now, not when handed out again.
            (true, Some(_)) => self.reclaims_ready.push((replica, location)),
            _ => {}
        }
        self.forget(delegation);
        if !owned {
            self.releases.push(delegation);
        }
    }

    fn forget(&mut self, delegation: LeaseId) {
        if let Some(delegated) = self.delegated.remove(&delegation) {
            if delegated.current && self.index.get(&delegated.object) == Some(&delegation) {
                self.index.remove(&delegated.object);
            }
            if delegated.owned {
                self.owned.remove(&delegated.template.replica);
            }
        }
    }

    /// Which session the node is in, for [`Delegations::owned`]: read before a commit is
    /// sent. It changes when the session ends ([`Delegations::clear`]).
    pub fn session_mark(&self) -> u64 {
        self.sessions_ended
    }

    /// This node published `template`'s replica of `object` in one of its own CPU pools
    /// and the directory answered its commit, sent in the session `mark` says
    /// ([`Delegations::session_mark`]): its hits are answered here from now on, each local
    /// lease as long as `template`'s `duration_ms` (the directory's lease length), until
    /// [`Delegations::may_reclaim`] or the session's end. Nothing is recorded when that
    /// session has ended (a later one may number the replica otherwise), when the object
    /// is answered here already, or when [`OWNED_MAX`] are held.
    pub fn owned(&mut self, mark: u64, object: ObjectId, template: Lease) {
        if mark != self.sessions_ended
            || self.index.contains_key(&object)
            || self.owned.len() >= OWNED_MAX
            || self.owned.contains_key(&template.replica)
        {
            return;
        }
        self.next_owned = self.next_owned.wrapping_add(1) & !(LOCAL_LEASE_BIT | OWNED_BIT);
        let key = LeaseId(LOCAL_LEASE_BIT | OWNED_BIT | self.next_owned);
        self.index.insert(object, key);
        self.owned.insert(template.replica, key);
        self.delegated.insert(
            key,
            Delegated {
                object,
                template,
                valid_until: Timestamp(u64::MAX),
                recalled: None,
                owned: true,
                current: true,
                readers: 0,
                unreported_hits: 0,
            },
        );
    }

    /// The directory hands this node the reclaim of `replica` at `now`: whether its pages
    /// may be freed and the reclaim acknowledged now. Any replica but an owned one may go
    /// at once (its readers held directory leases, which ended); so may an owned one no
    /// local lease reads. One that is read grants no local lease from this call on, and
    /// once its last reader is gone it is among [`Delegations::take_reclaims_ready`].
    pub fn may_reclaim(&mut self, now: Timestamp, replica: ReplicaId) -> bool {
        let Some(key) = self.owned.get(&replica).copied() else {
            return true;
        };
        let Some(delegated) = self.delegated.get_mut(&key) else {
            return true;
        };
        if delegated.readers == 0 {
            self.forget(key);
            return true;
        }
        if delegated.recalled.is_none() {
            delegated.recalled = Some(now);
            self.counts.reclaims_deferred += 1;
        }
        if delegated.current {
            delegated.current = false;
            if self.index.get(&delegated.object) == Some(&key) {
                self.index.remove(&delegated.object);
            }
        }
        false
    }

    /// Owned replicas whose reclaim was put off and whose last local lease has ended, taken:
    /// the caller frees their pages and acknowledges their reclaims.
    pub fn take_reclaims_ready(&mut self) -> Vec<(ReplicaId, Location)> {
        std::mem::take(&mut self.reclaims_ready)
    }

    /// The directory recalls `delegation` at `now`: it grants nothing more, and is
    /// released once no local lease under it is live. One not heard of yet is remembered
    /// (until it would have ended) so that its grant is released on arrival.
    pub fn recall(&mut self, now: Timestamp, delegation: LeaseId) {
        match self.delegated.get_mut(&delegation) {
            Some(delegated) => {
                if delegated.recalled.is_none() {
                    delegated.recalled = Some(now);
                    self.counts.recalls += 1;
                }
                if delegated.current {
                    delegated.current = false;
                    let object = delegated.object;
                    if self.index.get(&object) == Some(&delegation) {
                        self.index.remove(&object);
                    }
                }
                self.release_if_idle(now, delegation);
            }
            None if self.early_recalls.len() < EARLY_RECALLS_MAX => {
                let longest = self.longest.max(EARLY_RECALL_KEPT_MIN);
                self.early_recalls.insert(delegation, now + longest);
            }
            // Full: the directory hands the recall out again.
            None => {}
        }
    }

    /// A client of this node retires `object`: its delegation here grants nothing more and
    /// is released at once if no local lease under it is live, so that the retire does not
    /// wait for a recall of it.
    pub fn give_up(&mut self, now: Timestamp, object: &ObjectId) {
        let Some(delegation) = self.index.remove(object) else {
            return;
        };
        if let Some(delegated) = self.delegated.get_mut(&delegation) {
            delegated.current = false;
        }
        self.release_if_idle(now, delegation);
    }

    /// Ends the local leases whose deadline passed and forgets the delegations that ended
    /// (the directory's copy of each has ended too, so nothing is released for them).
    pub fn expire(&mut self, now: Timestamp) {
        while let Some(&(deadline, lease)) = self.local_deadlines.front() {
            if deadline > now {
                break;
            }
            self.local_deadlines.pop_front();
            self.release_local(now, lease);
        }
        let mut ended = false;
        while let Some(&(end, delegation)) = self.delegation_ends.front() {
            if end > now {
                break;
            }
            self.delegation_ends.pop_front();
            if self.delegated.contains_key(&delegation) {
                self.forget(delegation);
                ended = true;
            }
        }
        if self.delegation_ends.len() > 2 * self.delegated.len() + 1024 {
            let delegated = &self.delegated;
            self.delegation_ends
                .retain(|(_, delegation)| delegated.contains_key(delegation));
        }
        if ended {
            let delegated = &self.delegated;
            self.local
                .retain(|_, delegation| delegated.contains_key(delegation));
        }
        self.early_recalls.retain(|_, until| *until > now);
        self.hit_list
            .retain(|delegation| self.delegated.contains_key(delegation));
    }

    /// The delegations to release at the directory, taken.
    pub fn take_releases(&mut self) -> Vec<LeaseId> {
        std::mem::take(&mut self.releases)
    }

    /// Up to `max` reports of hits answered here, taken (the rest wait for the next).
    pub fn take_hit_reports(&mut self, max: usize) -> Vec<LocalHits> {
        let count = max.min(self.hit_list.len());
        self.hit_list
            .drain(..count)
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|delegation| {
                let delegated = self.delegated.get_mut(&delegation)?;
                let hits = std::mem::take(&mut delegated.unreported_hits);
                (hits > 0).then_some(LocalHits {
                    delegation,
                    replica: delegated.template.replica,
                    object: delegated.object,
                    hits,
                })
            })
            .collect()
    }

    /// How long recalls took to be released, taken.
    pub fn take_recall_latencies(&mut self) -> Vec<Duration> {
        std::mem::take(&mut self.recall_latencies)
    }

    /// The session that held the delegations ended: they ended with it.
    pub fn clear(&mut self) {
        *self = Delegations {
            next_local: self.next_local,
            sessions_ended: self.sessions_ended + 1,
            counts: self.counts,
            longest: self.longest,
            ..Delegations::default()
        };
    }

    /// Delegations held.
    pub fn len(&self) -> usize {
        self.delegated.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.delegated.is_empty()
    }

    /// Local leases live.
    pub fn local_leases(&self) -> usize {
        self.local.len()
    }

    /// A probe or an acquire went to the directory; `found` when its answer had a hit.
    pub fn count_directory_lookup(&mut self, found: bool) {
        self.counts.directory_lookups += 1;
        self.counts.directory_hit_lookups += u64::from(found);
    }

    /// What was counted since the start.
    pub fn counts(&self) -> DelegationCounts {
        self.counts
    }
}

#[cfg(test)]
mod tests;
