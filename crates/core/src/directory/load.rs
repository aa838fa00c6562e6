//! The load path: probe, acquire (the atomic READY check and lease), release, and the
//! per-request read view that decides which replicas a node may see. Leases and their
//! expiry live here too.

use super::leases::LeaseRecord;
use super::replication::Asked;
use super::sessions::Session;
use super::{
    AcquireMode, AcquireOutcome, Directory, DirectoryError, Lease, ProbeOutcome, ReleaseOutcome,
    ReplicaState, SessionState, Table,
};
use crate::model::{LeaseId, ObjectId, PoolId, ReplicaId, Scope, SessionId, Tier, Timestamp};
use crate::policy::eviction::touch_order;
use crate::policy::placement;

impl Directory {
    /// For each object, in order: a hit when a READY replica the requester can map exists,
    /// pending when one is being written, on SSD when only its node's SSD holds one, else a
    /// miss. Reserves and leases nothing.
    pub fn probe(
        &self,
        session_id: SessionId,
        objects: &[ObjectId],
    ) -> Result<Vec<ProbeOutcome>, DirectoryError> {
        self.check_batch(objects.len())?;
        let session = self.open_session(session_id)?;
        self.check_namespaces(session, objects.iter().map(|object| object.namespace))?;
        let view = self.read_view(session);
        Ok(objects
            .iter()
            .map(|object| self.probe_one(&view, object))
            .collect())
    }

    /// [`Directory::probe`] as an engine's lookup: the misses of objects held only where the
    /// session cannot map them name its node as a consumer wanting a copy
    /// ([`super::replication`]); a repeated lookup adds no demand, an acquire's miss does.
    /// The answers are the probe's.
    pub fn probe_noting_demand(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        objects: &[ObjectId],
    ) -> Result<Vec<ProbeOutcome>, DirectoryError> {
        let outcomes = self.probe(session_id, objects)?;
        let missed: Vec<ObjectId> = objects
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| matches!(outcome, ProbeOutcome::Miss))
            .map(|(object, _)| *object)
            .collect();
        self.record_remote_misses(now, session_id, &missed, Asked::Lookup);
        Ok(outcomes)
    }

    /// One object's probe, in one pass over its replicas (the hot path of every lookup):
    /// the replica [`placement::read_choice`] picks, else whether one is being written.
    /// Inlined into both callers: the probe loop is the directory's hottest path, and a
    /// second caller (`locate`) made the compiler stop inlining it (probes 30 % slower).
    #[inline(always)]
    pub(super) fn probe_one(&self, view: &ReadView, object: &ObjectId) -> ProbeOutcome {
        let mut pending = false;
        let candidates = self.replicas.of_object(object).filter_map(|(_, replica)| {
            let rank = view.rank(replica.pool)?;
            match replica.state {
                ReplicaState::Ready => Some(((replica.pool, replica.length_bytes), rank)),
                ReplicaState::Reserved => {
                    pending = true;
                    None
                }
                ReplicaState::Retiring | ReplicaState::Free => None,
            }
        });
        match placement::read_choice(candidates) {
            Some((pool, length_bytes)) => ProbeOutcome::Hit {
                medium: self.pools[pool.0 as usize].spec.medium,
                length_bytes,
            },
            None if pending => ProbeOutcome::Pending,
            None => match self.on_staged_pool(view.node, object) {
                Some(length_bytes) => ProbeOutcome::OnSsd { length_bytes },
                None => ProbeOutcome::Miss,
            },
        }
    }

    /// The cheapest READY replica of `object` the session can map, by kvtier's read
    /// selection ([`placement::read_choice`]) over the ranks of the session's read order.
    pub(super) fn select_replica(&self, view: &ReadView, object: &ObjectId) -> Option<ReplicaId> {
        placement::read_choice(
            self.replicas
                .of_object(object)
                .filter(|(_, replica)| replica.state == ReplicaState::Ready)
                .filter_map(|(id, replica)| view.rank(replica.pool).map(|rank| (id, rank))),
        )
    }

    /// Whether a replica of `object` the session could map is being written.
    pub(super) fn pending_for(&self, view: &ReadView, object: &ObjectId) -> bool {
        self.replicas.of_object(object).any(|(_, replica)| {
            replica.state == ReplicaState::Reserved && view.rank(replica.pool).is_some()
        })
    }

    /// Leases, for each object in order, the cheapest READY replica the requester can map.
    /// The check and the lease are one step: no retire can come between them. In
    /// `Manifest` mode, one miss means no item is leased (`Withheld`).
    pub fn acquire(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        objects: &[ObjectId],
        mode: AcquireMode,
    ) -> Result<Vec<AcquireOutcome>, DirectoryError> {
        self.check_batch(objects.len())?;
        let session = self.open_session(session_id)?;
        self.check_namespaces(session, objects.iter().map(|object| object.namespace))?;
        let view = self.read_view(session);
        let selected: Vec<Option<ReplicaId>> = objects
            .iter()
            .map(|object| self.select_replica(&view, object))
            .collect();
        let found = selected.iter().flatten().count() as u32;
        if (found as usize) < objects.len() {
            // The answer stays a miss now; a copy towards this node may be planned.
            let missed: Vec<ObjectId> = objects
                .iter()
                .zip(&selected)
                .filter(|(_, choice)| choice.is_none())
                .map(|(object, _)| *object)
                .collect();
            self.record_remote_misses(now, session_id, &missed, Asked::Load);
        }
        let session = self.open_session(session_id)?;
        if mode == AcquireMode::Manifest && (found as usize) < objects.len() {
            return Ok(selected
                .iter()
                .map(|choice| {
                    if choice.is_some() {
                        AcquireOutcome::Withheld
                    } else {
                        AcquireOutcome::Miss
                    }
                })
                .collect());
        }
        if !self.leases.has_room(found) {
            return Err(DirectoryError::Full(Table::Leases));
        }
        if session.leases.saturating_add(found) > self.config.leases_per_session_max {
            return Err(DirectoryError::Full(Table::SessionLeases));
        }
        let deadline = now + self.config.lease_duration;
        let outcomes = selected
            .iter()
            .map(|choice| match choice {
                None => AcquireOutcome::Miss,
                Some(replica_id) => {
                    AcquireOutcome::Leased(self.grant_lease(now, session_id, *replica_id, deadline))
                }
            })
            .collect();
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.leases += found;
        }
        // Every read is an access. The batch is a prompt's chunks in order, so they are
        // touched in kvtier's `touch_order`, last chunk first: a prefix loses its tail
        // before its head (a tail is worthless without its head).
        for position in touch_order(objects.len()) {
            if let Some(replica_id) = selected[position] {
                let class = self.record_access(now, &objects[position]);
                self.replicas.touch(replica_id, class);
            }
        }
        Ok(outcomes)
    }

    fn grant_lease(
        &mut self,
        now: Timestamp,
        session: SessionId,
        replica_id: ReplicaId,
        deadline: Timestamp,
    ) -> Lease {
        let record = LeaseRecord {
            replica: replica_id,
            session,
            deadline,
            delegation: false,
        };
        let lease = self.hold(now, record);
        let location = self
            .replicas
            .get(replica_id)
            .expect("selected replica is live")
            .location();
        Lease {
            lease,
            duration_ms: u64::try_from(self.config.lease_duration.as_millis()).unwrap_or(u64::MAX),
            replica: replica_id,
            medium: self.pools[location.pool.0 as usize].spec.medium,
            location,
            deadline,
        }
    }

    /// Inserts the lease `record` of a live replica (an engine's or a delegation): the
    /// replica counts it and is accessed, and its first lease pins its bytes.
    pub(super) fn hold(&mut self, now: Timestamp, record: LeaseRecord) -> LeaseId {
        let lease = self.leases.insert(record);
        let replica = self
            .replicas
            .get_mut(record.replica)
            .expect("a leased replica is live");
        replica.lease_count += 1;
        replica.last_access = now;
        if replica.lease_count == 1 {
            let (pool, bytes) = (replica.pool, replica.allocated_bytes);
            self.pools[pool.0 as usize].pin(bytes, true);
        }
        lease
    }

    /// Releases leases held by this session. The last release of a retiring replica
    /// queues its reclaim. Releasing an unknown or expired lease is harmless.
    pub fn release(
        &mut self,
        session_id: SessionId,
        leases: &[LeaseId],
    ) -> Result<Vec<ReleaseOutcome>, DirectoryError> {
        self.check_batch(leases.len())?;
        self.open_session(session_id)?;
        Ok(leases
            .iter()
            .map(|&lease| match self.leases.get(lease) {
                Some(record) if record.session == session_id => {
                    self.drop_lease(lease);
                    if let Some(session) = self.sessions.get_mut(&session_id) {
                        session.leases -= 1;
                    }
                    ReleaseOutcome::Released
                }
                _ => ReleaseOutcome::Unknown,
            })
            .collect())
    }

    /// Removes a lease and updates its replica; does not touch the session's count.
    pub(super) fn drop_lease(&mut self, lease: LeaseId) {
        let Some(record) = self.leases.remove(lease) else {
            return;
        };
        self.after_lease_removed(lease, &record);
    }

    /// Removes the leases whose deadline passed, with their sessions' counts; returns how
    /// many.
    pub(super) fn expire_leases(&mut self, now: Timestamp) -> u32 {
        let mut expired = 0;
        while let Some((id, lease)) = self.leases.pop_expired(now) {
            expired += 1;
            if let Some(session) = self.sessions.get_mut(&lease.session) {
                session.leases = session.leases.saturating_sub(1);
            }
            self.after_lease_removed(id, &lease);
        }
        expired
    }

    /// `lease` (`record`) was removed (released, voided or expired): a delegation leaves its
    /// books; the replica's last lease unpins its bytes and lets a retiring replica be
    /// reclaimed.
    fn after_lease_removed(&mut self, lease: LeaseId, record: &LeaseRecord) {
        if record.delegation {
            self.delegation_ended(lease, record);
        }
        let replica_id = record.replica;
        let Some(replica) = self.replicas.get_mut(replica_id) else {
            return;
        };
        replica.lease_count -= 1;
        if replica.lease_count == 0 {
            let (pool, bytes, state) = (replica.pool, replica.allocated_bytes, replica.state);
            self.pools[pool.0 as usize].pin(bytes, false);
            if state == ReplicaState::Retiring {
                self.queue_reclaim(replica_id);
            }
        }
    }

    pub(super) fn check_batch(&self, items: usize) -> Result<(), DirectoryError> {
        let max = self.config.batch_items_max as usize;
        if items > max {
            return Err(DirectoryError::BatchTooLarge { items, max });
        }
        Ok(())
    }

    /// What `session` can read, pool by pool: a host pool only by its own node while the
    /// owner session is live; a domain pool by every node of the domain. Computed once per
    /// request, so per-object checks are an array index.
    pub(super) fn read_view(&self, session: &Session) -> ReadView {
        ReadView {
            ranks: self
                .pools
                .iter()
                .map(|record| {
                    let readable = match record.spec.scope {
                        Scope::Host(owner) => {
                            owner == session.node
                                && record
                                    .owner_session
                                    .and_then(|owner_session| self.sessions.get(&owner_session))
                                    .is_some_and(|owner_session| {
                                        owner_session.state == SessionState::Live
                                    })
                        }
                        Scope::Domain(domain) => session.domains.contains(&domain),
                    };
                    // Staged (L2) pools are never mapped: their replicas are restored first.
                    (readable && record.spec.medium.tier() == Tier::L1)
                        .then(|| session.read_rank(record.spec.medium))
                })
                .collect(),
            node: session.node,
        }
    }
}

/// A requester's read rank per pool (`None`: it cannot map the pool or the pool's
/// replicas are hidden).
pub(super) struct ReadView {
    ranks: Vec<Option<usize>>,
    /// The requester's node, whose SSD replicas a probe reports.
    node: crate::model::NodeId,
}

impl ReadView {
    pub(super) fn rank(&self, pool: PoolId) -> Option<usize> {
        self.ranks.get(pool.0 as usize).copied().flatten()
    }
}
