//! Session operations: opening (which fences a node's previous epoch), heartbeats, closing,
//! and ending a session with everything it held; the session lookups every operation starts
//! with. The session and node records themselves are in `sessions`.

use super::ledger::Ledger;
use super::sessions::{NodeRecord, Session};
use super::{
    Directory, DirectoryError, OpenReply, OpenRequest, SessionState, SessionTransition, Table,
    Task, TaskKind, NAME_BYTES_MAX,
};
use crate::model::{
    Epoch, LeaseId, Medium, NodeId, OperationId, PoolId, ReplicaId, SessionId, Timestamp,
};
use std::collections::{HashSet, VecDeque};

impl Directory {
    /// Opens a session for a node. A node opening again gets a larger epoch and its
    /// previous session is fenced (its host pools dropped, its leases and reservations
    /// void), so nothing the old incarnation sends can change state any more.
    pub fn open(
        &mut self,
        now: Timestamp,
        request: OpenRequest,
    ) -> Result<OpenReply, DirectoryError> {
        if request.node_name.is_empty() || request.node_name.len() > NAME_BYTES_MAX {
            return Err(DirectoryError::InvalidPool(
                "node name empty or too long".into(),
            ));
        }
        let open_sessions = self
            .sessions
            .values()
            .filter(|session| session.is_open())
            .count();
        let node = self.node_named(&request.node_name)?;
        let previous = self.nodes[node.0 as usize].session;
        let replaces_open =
            previous.is_some_and(|id| self.sessions.get(&id).is_some_and(Session::is_open));
        if !replaces_open && open_sessions >= self.config.sessions_max as usize {
            return Err(DirectoryError::Full(Table::Sessions));
        }
        if let Some(previous) = previous {
            self.end_session(now, previous, SessionState::Fenced);
        }
        let session = SessionId::new(self.config.incarnation, self.next_session);
        self.next_session += 1;
        let record = &mut self.nodes[node.0 as usize];
        record.epoch = Epoch(record.epoch.0 + 1);
        record.session = Some(session);
        let epoch = record.epoch;
        self.sessions.insert(
            session,
            Session {
                node,
                epoch,
                state: SessionState::Live,
                last_heartbeat: now,
                write_order: distinct_media(&request.write_order),
                read_order: distinct_media(&request.read_order),
                domains: request.domains,
                namespaces: request.namespaces,
                ledger: Ledger::new(self.config.ledger_entries_per_session_max as usize),
                leases: 0,
                reservations: HashSet::new(),
            },
        );
        Ok(OpenReply {
            session,
            node,
            epoch,
            fenced_session: previous,
            lease_duration_ms: self.config.lease_duration.as_millis() as u64,
            heartbeat_interval_ms: (self.config.suspect_after.as_millis() / 3) as u64,
            fence_after_ms: self.config.fence_after.as_millis() as u64,
            batch_items_max: self.config.batch_items_max,
            recovery_window_ms: self.recovery_window().as_millis() as u64,
        })
    }

    /// The id of the node called `name`, registering it on its first session.
    pub(super) fn node_named(&mut self, name: &str) -> Result<NodeId, DirectoryError> {
        if let Some(node) = self.node_ids.get(name) {
            return Ok(*node);
        }
        if self.nodes.len() >= self.config.nodes_max as usize {
            return Err(DirectoryError::Full(Table::Nodes));
        }
        let node = NodeId(self.nodes.len() as u32);
        self.nodes.push(NodeRecord {
            epoch: Epoch(0),
            session: None,
            tasks: VecDeque::new(),
            handed_out: VecDeque::new(),
            offers: VecDeque::new(),
            acknowledged_reclaims: 0,
            peer_endpoint: true,
            peer_address: None,
            fenced_leases_end: Timestamp::ZERO,
            reclaims_held_until: Timestamp::ZERO,
        });
        self.node_ids.insert(name.to_owned(), node);
        Ok(node)
    }

    /// Records a heartbeat: a suspect session becomes live again (its replicas reappear).
    /// `acknowledged_through`, when given, drops ledger entries the node no longer needs.
    pub fn heartbeat(
        &mut self,
        now: Timestamp,
        session: SessionId,
        acknowledged_through: Option<OperationId>,
    ) -> Result<Epoch, DirectoryError> {
        let record = self.open_session_mut(session)?;
        record.last_heartbeat = now;
        record.state = SessionState::Live;
        if let Some(through) = acknowledged_through {
            record.ledger.acknowledge(through);
        }
        Ok(record.epoch)
    }

    /// The leases and reservations `session` holds here, while it is open. A sharded
    /// directory closes a session only when no shard's count is above 0.
    pub fn session_holds(&self, session: SessionId) -> Option<(u32, u32)> {
        let record = self.open_session(session).ok()?;
        Some((record.leases, record.reservations.len() as u32))
    }

    /// Closes a drained session (no leases, no reservations). Its host pools and their
    /// replicas are dropped: the node is leaving.
    pub fn close(&mut self, now: Timestamp, session: SessionId) -> Result<(), DirectoryError> {
        let record = self.open_session(session)?;
        if record.leases > 0 || !record.reservations.is_empty() {
            return Err(DirectoryError::NotDrained {
                leases: record.leases,
                reservations: record.reservations.len() as u32,
            });
        }
        self.end_session(now, session, SessionState::Closed);
        Ok(())
    }

    pub(super) fn open_session(&self, session: SessionId) -> Result<&Session, DirectoryError> {
        match self.sessions.get(&session) {
            None => Err(DirectoryError::UnknownSession),
            Some(record) if record.state == SessionState::Drained => Err(DirectoryError::Drained),
            Some(record) if !record.is_open() => Err(DirectoryError::Fenced {
                epoch: record.epoch,
            }),
            Some(record) => Ok(record),
        }
    }

    pub(super) fn open_session_mut(
        &mut self,
        session: SessionId,
    ) -> Result<&mut Session, DirectoryError> {
        match self.sessions.get_mut(&session) {
            None => Err(DirectoryError::UnknownSession),
            Some(record) if record.state == SessionState::Drained => Err(DirectoryError::Drained),
            Some(record) if !record.is_open() => Err(DirectoryError::Fenced {
                epoch: record.epoch,
            }),
            Some(record) => Ok(record),
        }
    }

    /// Ends a session: voids its leases, aborts its reservations, drops its host pools
    /// with their replicas, and keeps the record (with its ledger) for `resolve`.
    pub(super) fn end_session(&mut self, now: Timestamp, session: SessionId, state: SessionState) {
        let Some(record) = self.sessions.get_mut(&session) else {
            return;
        };
        if !record.is_open() {
            return;
        }
        record.state = state;
        let node = record.node;
        if state == SessionState::Fenced {
            let end = &mut self.nodes[node.0 as usize].fenced_leases_end;
            *end = (*end).max(now + self.config.lease_duration);
        }
        let reservations: Vec<ReplicaId> = record.reservations.drain().collect();
        let leases = self.host_pool_leases(session);
        for lease in &leases {
            self.drop_lease(*lease);
        }
        if let Some(record) = self.sessions.get_mut(&session) {
            record.leases -= leases.len() as u32;
        }
        let cool_until = now + self.config.reservation_duration;
        for replica in reservations {
            self.abort_reservation(replica);
        }
        self.cancel_replications_of(node);
        for record in &mut self.pools {
            if let Some(extents) = &mut record.extents {
                extents.release_empty(session, cool_until);
            }
        }
        let dropped = self.host_pools_of(session);
        for pool in &dropped {
            self.pools[pool.0 as usize].owner_session = None;
        }
        if !dropped.is_empty() {
            for replica in self.replicas_in(&dropped) {
                self.free_replica(replica);
            }
        }
        if self.nodes[node.0 as usize].session == Some(session) {
            self.nodes[node.0 as usize].session = None;
            self.requeue_tasks_of_ended_session(node, &dropped);
        }
        self.retired_sessions.push_back(session);
        self.forget_oldest_sessions();
    }

    /// The leases of `session` that end with it. Leases on shared-pool replicas stay until
    /// their deadline: the node's engines map that memory themselves and may still read
    /// under them. Leases on this node's own pools go with the pools.
    fn host_pool_leases(&self, session: SessionId) -> Vec<LeaseId> {
        self.leases
            .of_session(session)
            .filter(|(_, lease)| {
                self.replicas
                    .get(lease.replica)
                    .is_none_or(|replica| self.pools[replica.pool.0 as usize].extents.is_none())
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// The host pools `session` registered.
    pub(super) fn host_pools_of(&self, session: SessionId) -> Vec<PoolId> {
        (0..self.pools.len())
            .filter(|&index| self.pools[index].owner_session == Some(session))
            .map(|index| PoolId(index as u32))
            .collect()
    }

    /// The replicas in `pools`.
    fn replicas_in(&self, pools: &[PoolId]) -> Vec<ReplicaId> {
        pools
            .iter()
            .flat_map(|&pool| self.replicas.in_pool(pool).map(|(id, _)| id))
            .collect()
    }

    /// The node's session ended (its host pools `dropped`): of its pending and handed-out
    /// tasks, only the reclaims still awaited outside the dropped pools stay queued for the
    /// next incarnation; one in an extent of an ended session the directory frees itself.
    fn requeue_tasks_of_ended_session(&mut self, node: NodeId, dropped: &[PoolId]) {
        let node_record = &mut self.nodes[node.0 as usize];
        let pending: Vec<Task> = node_record
            .tasks
            .drain(..)
            .chain(node_record.handed_out.drain(..).map(|(_, task)| task))
            .collect();
        node_record.acknowledged_reclaims = 0;
        for task in pending {
            // A demotion's target was one of the session's reservations: aborted above.
            let TaskKind::Reclaim { replica, location } = task.kind else {
                continue;
            };
            if dropped.contains(&location.pool) || !self.awaits_reclaim(replica) {
                continue;
            }
            // The session that owned the extent is gone: nobody else will free it.
            if self
                .replicas
                .get(replica)
                .is_some_and(|record| self.reclaimed_by_directory(record))
            {
                self.free_replica(replica);
            } else {
                self.queue_task(node, task);
            }
        }
    }

    /// Forgets the oldest ended sessions beyond `retired_sessions_max`, except one still
    /// holding (shared-pool) leases: those expire within `lease_duration`, so the excess is
    /// bounded by that window.
    fn forget_oldest_sessions(&mut self) {
        let mut kept = VecDeque::new();
        while self.retired_sessions.len() + kept.len() > self.config.retired_sessions_max as usize {
            let Some(oldest) = self.retired_sessions.pop_front() else {
                break;
            };
            if self
                .sessions
                .get(&oldest)
                .is_some_and(|record| record.leases > 0)
            {
                kept.push_back(oldest);
            } else {
                self.sessions.remove(&oldest);
            }
        }
        while let Some(session) = kept.pop_back() {
            self.retired_sessions.push_front(session);
        }
    }

    /// Marks sessions silent past `suspect_after` suspect (hiding their host replicas) and
    /// fences those silent past `fence_after`; returns the changes in session order.
    pub(super) fn advance_silent_sessions(&mut self, now: Timestamp) -> Vec<SessionTransition> {
        let mut changes: Vec<SessionTransition> = self
            .sessions
            .iter()
            .filter(|(_, session)| session.is_open())
            .filter_map(|(&id, session)| {
                let silence = now.saturating_since(session.last_heartbeat);
                let state = if silence >= self.config.fence_after {
                    SessionState::Fenced
                } else if silence >= self.config.suspect_after
                    && session.state == SessionState::Live
                {
                    SessionState::Suspect
                } else {
                    return None;
                };
                Some(SessionTransition {
                    session: id,
                    node: session.node,
                    state,
                })
            })
            .collect();
        changes.sort_by_key(|change| change.session);
        for change in &changes {
            match change.state {
                SessionState::Fenced => self.end_session(now, change.session, SessionState::Fenced),
                _ => {
                    if let Some(record) = self.sessions.get_mut(&change.session) {
                        record.state = change.state;
                    }
                }
            }
        }
        changes
    }

    /// A session's state, if the directory still remembers it.
    pub fn session_state(&self, session: SessionId) -> Option<SessionState> {
        self.sessions.get(&session).map(|record| record.state)
    }

    /// The node name of a session, if the directory still remembers the session.
    pub fn session_node_name(&self, session: SessionId) -> Option<&str> {
        let node = self.sessions.get(&session)?.node;
        self.node_ids
            .iter()
            .find(|(_, id)| **id == node)
            .map(|(name, _)| name.as_str())
    }
}

/// `order` without repeats, at most one entry per medium: what a node sends is bounded
/// before the directory iterates it on every request.
fn distinct_media(order: &[Medium]) -> Vec<Medium> {
    let mut distinct = Vec::with_capacity(Medium::ALL.len());
    for medium in order {
        if !distinct.contains(medium) {
            distinct.push(*medium);
        }
        if distinct.len() == Medium::ALL.len() {
            break;
        }
    }
    distinct
}
