//! The store path: reserve capacity, commit (publish) or abort it, resolve an operation
//! whose reply was lost, and the reservation deadlines that expire unwritten reservations.

use super::idempotency::LedgerStep;
use super::ledger::{LedgerCheck, LedgerEntry};
use super::replicas::NewReplica;
use super::sessions::Session;
use super::{
    AbortOutcome, CommitOutcome, Directory, DirectoryError, ReplicaState, ReserveItem,
    ReserveOutcome, ResolveOutcome, StoreSkip, Table, OBJECT_BYTES_MAX,
};
use crate::model::{
    Location, ObjectId, OperationId, PoolId, ReplicaId, Scope, SessionId, Timestamp,
};
use crate::policy::placement::{self, Incoming, WriteCandidate};

impl Directory {
    /// Grants capacity for one object in the first pool of the node's write order that
    /// has room. Idempotent by operation id. A replica the node can already read makes
    /// the store unnecessary (`AlreadyPresent` or `Pending`); no room anywhere is `Skip`.
    pub fn reserve(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        operation: OperationId,
        item: ReserveItem,
    ) -> Result<ReserveOutcome, DirectoryError> {
        let session = match self.check_ledger(session_id, operation)? {
            LedgerStep::Replay(outcome) => return Ok(outcome),
            LedgerStep::Proceed(session) => session,
        };
        if item.length_bytes == 0 || item.length_bytes > OBJECT_BYTES_MAX {
            return Err(DirectoryError::InvalidLength {
                length_bytes: item.length_bytes,
            });
        }
        self.check_namespace(session, item.object.namespace)?;
        let (outcome, present) = match self.existing_for(session, &item.object) {
            Some(existing) => existing,
            None => match self.placement(session_id, session, &item.object, item.length_bytes)? {
                Err(skip) => (ReserveOutcome::Skip(skip), None),
                Ok((pool, allocated_bytes)) => {
                    let replica = NewReplica {
                        object: item.object,
                        pool,
                        owner: session.node,
                        length_bytes: item.length_bytes,
                        allocated_bytes,
                        deadline: now + self.config.reservation_duration,
                    };
                    (self.grant_reservation(session_id, replica), None)
                }
            },
        };
        self.record_store(now, &item.object, present);
        if outcome == ReserveOutcome::Skip(StoreSkip::NoRoom) {
            // Make room now rather than at the next tick: this store is skipped, the next
            // ones find the space once the owners reclaim.
            self.evictions_unreported += self.evict(now);
        }
        self.record_outcome(session_id, operation, outcome);
        Ok(outcome)
    }

    /// Where a new reservation of `length_bytes` for `object` goes ([`Directory::place`]):
    /// why it is skipped when no pool admits it with room, `Full` when the replica table or
    /// the session's reservations are at their bound.
    fn placement(
        &self,
        session_id: SessionId,
        session: &Session,
        object: &ObjectId,
        length_bytes: u64,
    ) -> Result<Result<(PoolId, u64), StoreSkip>, DirectoryError> {
        let placed = match self.place(session_id, session, object, length_bytes) {
            Ok(placed) => placed,
            Err(skip) => return Ok(Err(skip)),
        };
        if !self.replicas.has_room() {
            return Err(DirectoryError::Full(Table::Replicas));
        }
        if session.reservations.len() >= self.config.reservations_per_session_max as usize {
            return Err(DirectoryError::Full(Table::Reservations));
        }
        Ok(Ok(placed))
    }

    /// Grants `replica` to `session_id`, whose bounds [`Directory::placement`] checked.
    fn grant_reservation(&mut self, session_id: SessionId, replica: NewReplica) -> ReserveOutcome {
        let (pool, allocated_bytes) = (replica.pool, replica.allocated_bytes);
        let replica = self.insert_reservation(replica);
        self.compact_reservation_deadlines();
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.reservations.insert(replica);
        }
        ReserveOutcome::Granted {
            replica,
            pool,
            medium: self.pools[pool.0 as usize].spec.medium,
            allocated_bytes,
        }
    }

    /// Inserts a reservation and counts it in its pool and the deadline queue. The caller
    /// checked the bounds and adds it to the owner session's reservations.
    pub(super) fn insert_reservation(&mut self, replica: NewReplica) -> ReplicaId {
        let (pool, allocated_bytes, deadline, object) = (
            replica.pool,
            replica.allocated_bytes,
            replica.deadline,
            replica.object,
        );
        let replica = self.replicas.insert(replica);
        self.pools[pool.0 as usize].reserve(allocated_bytes);
        self.replica_added(pool, &object, allocated_bytes);
        self.reservation_deadlines.push_back((deadline, replica));
        replica
    }

    /// A store is an access: the engine needed the chunk (and a READY copy it did not
    /// look for, `present`, is as good as read).
    fn record_store(&mut self, now: Timestamp, object: &ObjectId, present: Option<ReplicaId>) {
        let class = self.record_access(now, object);
        if let Some(ready) = present {
            if let Some(replica) = self.replicas.get_mut(ready) {
                replica.last_access = now;
            }
            self.replicas.touch(ready, class);
        }
    }

    /// `AlreadyPresent` (with the READY replica it would read, [`Directory::select_replica`])
    /// or `Pending` when the session can already read the object.
    fn existing_for(
        &self,
        session: &Session,
        object: &ObjectId,
    ) -> Option<(ReserveOutcome, Option<ReplicaId>)> {
        let view = self.read_view(session);
        match self.select_replica(&view, object) {
            Some(ready) => Some((ReserveOutcome::AlreadyPresent, Some(ready))),
            None => self
                .pending_for(&view, object)
                .then_some((ReserveOutcome::Pending, None)),
        }
    }

    /// Where kvtier's placement ([`placement::write_target`]) writes `object`: the first
    /// pool of the node's write order that it may write, that may hold the object's salt
    /// group, that admits the object (a wear-limited pool only once it is reused) and has room for `length_bytes` rounded
    /// to the pool's pages. Returns the pool and the rounded bytes, or why the store is
    /// skipped. The directory cannot tell a partial chunk, so placement's partial rule
    /// never refuses here.
    fn place(
        &self,
        session_id: SessionId,
        session: &Session,
        object: &ObjectId,
        length_bytes: u64,
    ) -> Result<(PoolId, u64), StoreSkip> {
        // A node being drained gets nothing new: its stores are skipped.
        if self.is_draining(session_id) {
            return Err(StoreSkip::Draining);
        }
        let group = self.group_of_object(object);
        // Lazily, as the placement walks them: a reserve allocates nothing. Only a store
        // that is skipped walks them again, to say why.
        let candidates = || {
            session
                .write_order
                .iter()
                .flat_map(|medium| {
                    self.pools
                        .iter()
                        .enumerate()
                        // A client's store never lands in a staged (L2) pool: only spills do.
                        .filter(move |(_, record)| {
                            record.spec.medium == *medium && medium.tier() == crate::model::Tier::L1
                        })
                })
                .map(|(index, record)| (PoolId(index as u32), record))
                .filter(move |(pool, record)| {
                    record.spec.tenancy.admits(group) && self.can_write(session_id, session, *pool)
                })
                .map(|(pool, record)| {
                    let bytes = record.spec.rounded_bytes(length_bytes);
                    let candidate = WriteCandidate {
                        wear_limited: record.profile.wear_limited,
                        has_room: record.free_bytes() >= bytes
                            && self.within_quota_of(pool, group, bytes),
                    };
                    ((pool, bytes, bytes <= record.budget_bytes), candidate)
                })
        };
        let incoming = Incoming {
            // This store is an access too.
            frequency: self.access_count(object).saturating_add(1),
            // A reservation carries the chunk's length, not its tokens.
            partial: false,
        };
        if let Some((pool, bytes, _)) =
            placement::write_target(candidates(), &incoming, &self.config.placement()).0
        {
            return Ok((pool, bytes));
        }
        let mut fits = candidates().map(|((_, _, fits), _)| fits).peekable();
        if fits.peek().is_none() {
            return Err(StoreSkip::NoPool);
        }
        if fits.any(|fits| fits) {
            Err(StoreSkip::NoRoom)
        } else {
            Err(StoreSkip::TooLarge)
        }
    }

    fn can_write(&self, session_id: SessionId, session: &Session, pool: PoolId) -> bool {
        let record = &self.pools[pool.0 as usize];
        match record.spec.scope {
            Scope::Host(owner) => owner == session.node && record.owner_session == Some(session_id),
            Scope::Domain(domain) => session.domains.contains(&domain),
        }
    }

    /// Publishes a written replica: READY, visible to every reader its pool admits.
    /// Idempotent by operation id. If a READY replica of the object already exists in the
    /// same placement scope and tier, this one is aborted and `AlreadyPresent` returned (a
    /// node's SSD copy and its memory copy are two tiers of one scope).
    pub fn commit(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        operation: OperationId,
        replica_id: ReplicaId,
        location: Location,
    ) -> Result<CommitOutcome, DirectoryError> {
        let session = match self.check_ledger(session_id, operation)? {
            LedgerStep::Replay(outcome) => return Ok(outcome),
            LedgerStep::Proceed(session) => session,
        };
        let (object, scope) = self.check_commit(session_id, session, replica_id, &location)?;
        let tier = self.pools[location.pool.0 as usize].spec.medium.tier();
        let duplicate = self.replicas.of_object(&object).any(|(other, candidate)| {
            let spec = &self.pools[candidate.pool.0 as usize].spec;
            other != replica_id
                && candidate.state == ReplicaState::Ready
                && spec.scope == scope
                && spec.medium.tier() == tier
        });
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.reservations.remove(&replica_id);
        }
        let outcome = if duplicate {
            self.abort_reservation(replica_id);
            CommitOutcome::AlreadyPresent
        } else {
            self.publish(now, replica_id, &object, &location);
            CommitOutcome::Committed
        };
        self.record_outcome(session_id, operation, outcome);
        Ok(outcome)
    }

    /// Checks that `session` may commit `replica_id` at `location`: its own reservation,
    /// still reserved, at the reserved pool and length, inside the pool (and inside an
    /// extent the session holds). Returns the replica's object and its pool's scope.
    fn check_commit(
        &self,
        session_id: SessionId,
        session: &Session,
        replica_id: ReplicaId,
        location: &Location,
    ) -> Result<(ObjectId, Scope), DirectoryError> {
        let replica = self
            .replicas
            .get(replica_id)
            .ok_or(DirectoryError::UnknownReplica(replica_id))?;
        if replica.owner != session.node || !session.reservations.contains(&replica_id) {
            return Err(DirectoryError::NotOwner(replica_id));
        }
        if replica.state != ReplicaState::Reserved {
            return Err(DirectoryError::InvalidState {
                replica: replica_id,
                state: replica.state.name().into(),
                needed: "reserved".into(),
            });
        }
        let pool = &self.pools[replica.pool.0 as usize];
        if location.pool != replica.pool
            || location.length_bytes != replica.length_bytes
            || location
                .offset_bytes
                .checked_add(replica.allocated_bytes)
                .is_none_or(|end| end > pool.spec.capacity_bytes)
        {
            return Err(DirectoryError::LocationMismatch(replica_id));
        }
        if let Some(extents) = &pool.extents {
            if extents
                .owned_extent(location.offset_bytes, replica.allocated_bytes, session_id)
                .is_none()
            {
                return Err(DirectoryError::LocationMismatch(replica_id));
            }
        }
        Ok((replica.object, pool.spec.scope))
    }

    /// Makes a checked reservation READY at `location`, counts it in its pool (and its
    /// extent), and finishes the demotion it was the target of.
    pub(super) fn publish(
        &mut self,
        now: Timestamp,
        replica_id: ReplicaId,
        object: &ObjectId,
        location: &Location,
    ) {
        if let Some(replica) = self.replicas.get_mut(replica_id) {
            replica.state = ReplicaState::Ready;
            replica.allocation = location.allocation;
            replica.generation = location.generation;
            replica.offset_bytes = location.offset_bytes;
            replica.last_access = now;
            let bytes = replica.allocated_bytes;
            let record = &mut self.pools[location.pool.0 as usize];
            record.commit(bytes);
            if let Some(extents) = &mut record.extents {
                extents.add_replica(location.offset_bytes);
                self.note_extent_delta(super::ExtentDelta {
                    pool: location.pool,
                    offset_bytes: location.offset_bytes,
                    added: true,
                    cool_until: Timestamp::ZERO,
                });
            }
        }
        let class = self.access_class(object);
        self.replicas.touch(replica_id, class);
        self.finish_demotion(replica_id);
        self.finish_replication(now, replica_id);
        self.offer_to_domain(*object, replica_id);
    }

    /// Tells a node what became of an operation whose reply it lost, in `target` (its
    /// current session or one it had before). An operation not yet seen in an open session
    /// is burnt, so its late arrival is refused and the answer `NotApplied` stays true.
    pub fn resolve(
        &mut self,
        session_id: SessionId,
        target: SessionId,
        operation: OperationId,
    ) -> Result<ResolveOutcome, DirectoryError> {
        let node = self.open_session(session_id)?.node;
        let Some(record) = self.sessions.get_mut(&target) else {
            return Ok(ResolveOutcome::Unknown);
        };
        if record.node != node {
            return Err(DirectoryError::ForeignSession);
        }
        if record.ledger.is_acknowledged(operation) {
            return Ok(ResolveOutcome::Unknown);
        }
        Ok(match record.ledger.get(operation) {
            Some(LedgerEntry::Reserve(outcome)) => ResolveOutcome::Reserved(outcome),
            Some(LedgerEntry::Commit(outcome)) => ResolveOutcome::Committed(outcome),
            Some(LedgerEntry::Extent(grant)) => ResolveOutcome::ExtentGranted(grant),
            Some(LedgerEntry::ExtentReturn(answer)) => ResolveOutcome::ExtentReturned(answer),
            Some(LedgerEntry::Burnt) => ResolveOutcome::NotApplied,
            None if !record.is_open() => ResolveOutcome::NotApplied,
            None => match record.ledger.check(operation) {
                LedgerCheck::New => {
                    record.ledger.record(operation, LedgerEntry::Burnt);
                    ResolveOutcome::NotApplied
                }
                LedgerCheck::Full => return Err(DirectoryError::Full(Table::Ledger)),
                LedgerCheck::Recorded(_) | LedgerCheck::Acknowledged => ResolveOutcome::Unknown,
            },
        })
    }

    /// Aborts the reservations whose deadline passed, unwritten; returns how many.
    pub(super) fn expire_reservations(&mut self, now: Timestamp) -> u32 {
        let mut expired = 0;
        while let Some(&(deadline, replica)) = self.reservation_deadlines.front() {
            if deadline > now {
                break;
            }
            self.reservation_deadlines.pop_front();
            let Some(record) = self.replicas.get(replica) else {
                continue;
            };
            if record.state != ReplicaState::Reserved {
                continue;
            }
            let owner_session = self.nodes[record.owner.0 as usize].session;
            if let Some(session) = owner_session.and_then(|id| self.sessions.get_mut(&id)) {
                session.reservations.remove(&replica);
            }
            self.abort_reservation(replica);
            expired += 1;
        }
        expired
    }

    /// Drops the deadline entries of reservations that were committed or aborted once they
    /// outnumber the live ones, which bounds the queue at twice the live reservations
    /// (each bounded per session) plus a constant.
    fn compact_reservation_deadlines(&mut self) {
        let live: usize = self
            .sessions
            .values()
            .map(|session| session.reservations.len())
            .sum();
        if self.reservation_deadlines.len() > 2 * live + 1024 {
            let replicas = &self.replicas;
            self.reservation_deadlines.retain(|(_, replica)| {
                replicas
                    .get(*replica)
                    .is_some_and(|record| record.state == ReplicaState::Reserved)
            });
        }
    }

    /// Gives a reservation back unwritten (the node could not allocate, or the engine
    /// abandoned the store). Idempotent: an unknown or already resolved reservation is
    /// `Unknown`.
    pub fn abort(
        &mut self,
        session_id: SessionId,
        replica: ReplicaId,
    ) -> Result<AbortOutcome, DirectoryError> {
        let session = self.open_session_mut(session_id)?;
        if !session.reservations.remove(&replica) {
            return Ok(AbortOutcome::Unknown);
        }
        self.abort_reservation(replica);
        Ok(AbortOutcome::Aborted)
    }

    /// Returns a reservation's bytes and removes it. Safe because no reader saw it.
    pub(super) fn abort_reservation(&mut self, replica_id: ReplicaId) {
        let Some(replica) = self.replicas.get(replica_id) else {
            return;
        };
        if replica.state != ReplicaState::Reserved {
            return;
        }
        let (pool, bytes, object) = (replica.pool, replica.allocated_bytes, replica.object);
        self.pools[pool.0 as usize].abort(bytes);
        self.replica_removed(pool, &object, bytes, true);
        self.replicas.remove(replica_id);
        self.cancel_demotion(replica_id);
        self.cancel_replication(replica_id);
    }
}
