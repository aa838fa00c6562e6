//! Retirement and reclaim: retiring READY replicas, the owners' reclaim task queues
//! (handed out, re-handed when overdue, acknowledged), and freeing a replica's bytes.

use super::delegations::RecallReason;
use super::replicas::Replica;
use super::sessions::{Session, HANDED_OUT_COMPACTION_MIN};
use super::{
    Directory, DirectoryError, ReclaimOutcome, ReplicaState, RetireOutcome, Task, TaskKind,
};
use crate::model::{Medium, NodeId, ObjectId, ReplicaId, Scope, SessionId, TaskId, Timestamp};
use std::collections::VecDeque;

impl Directory {
    /// A node's retire on behalf of a client: `replica` must be a replica of `object`, in a
    /// namespace the session may use, so a client that names an object it may touch can
    /// retire no other object's replica. A replica of another object is refused as unknown
    /// (replica ids are enumerable; whether one exists is not the client's to learn).
    pub fn retire_object(
        &mut self,
        session_id: SessionId,
        object: &ObjectId,
        replica_id: ReplicaId,
    ) -> Result<RetireOutcome, DirectoryError> {
        self.check_namespace(self.open_session(session_id)?, object.namespace)?;
        match self.replicas.get(replica_id) {
            Some(replica) if replica.object == *object => self.retire(Some(session_id), replica_id),
            _ => Err(DirectoryError::UnknownReplica(replica_id)),
        }
    }

    /// The node's storage at the locations of `holdings` is gone (its SSD store reclaimed
    /// the region that held them, whether it wrote or adopted what was there): the READY
    /// replica of each holding's object at exactly that location (pool, allocation,
    /// generation) in the node's own SSD pool (medium SSD, scope its host) that the
    /// session's node owns retires. Anything else is left alone (a replica already
    /// retiring, another generation, another node's, one in a memory pool). Safe to repeat.
    /// Returns how many retired.
    pub fn retire_held(
        &mut self,
        session_id: SessionId,
        holdings: &[super::Holding],
    ) -> Result<u32, DirectoryError> {
        self.check_batch(holdings.len())?;
        let node = self.open_session(session_id)?.node;
        let mut retired = 0;
        for holding in holdings {
            let own_ssd = self
                .pools
                .get(holding.location.pool.0 as usize)
                .is_some_and(|pool| {
                    pool.spec.medium == Medium::Ssd && pool.spec.scope == Scope::Host(node)
                });
            if !own_ssd {
                continue;
            }
            let held = self
                .replicas
                .of_object(&holding.object)
                .find(|(_, replica)| {
                    replica.owner == node
                        && replica.state == ReplicaState::Ready
                        && replica.location() == holding.location
                })
                .map(|(id, _)| id);
            if let Some(replica) = held {
                if self.retire(Some(session_id), replica).is_ok() {
                    retired += 1;
                }
            }
        }
        Ok(retired)
    }

    /// Starts retiring a READY replica: new acquires no longer see it. Once no lease
    /// remains, its owner gets a reclaim task. The owner node, or the directory's own
    /// policy (with `session = None`), may retire.
    pub fn retire(
        &mut self,
        session_id: Option<SessionId>,
        replica_id: ReplicaId,
    ) -> Result<RetireOutcome, DirectoryError> {
        let replica = self
            .replicas
            .get(replica_id)
            .ok_or(DirectoryError::UnknownReplica(replica_id))?;
        if let Some(session_id) = session_id {
            if self.open_session(session_id)?.node != replica.owner {
                return Err(DirectoryError::NotOwner(replica_id));
            }
        }
        if replica.state != ReplicaState::Ready {
            return Err(DirectoryError::InvalidState {
                replica: replica_id,
                state: replica.state.name().into(),
                needed: "ready".into(),
            });
        }
        let (pool, bytes, leases, object) = (
            replica.pool,
            replica.allocated_bytes,
            replica.lease_count,
            replica.object,
        );
        self.replicas.unlink_recency(replica_id);
        if let Some(replica) = self.replicas.get_mut(replica_id) {
            replica.state = ReplicaState::Retiring;
        }
        self.pools[pool.0 as usize].retire(bytes);
        // Retiring bytes are on their way out: they no longer count against a quota.
        self.replica_retiring(pool, &object, bytes);
        self.cancel_replications_from(replica_id);
        if leases == 0 {
            self.queue_reclaim(replica_id);
            Ok(RetireOutcome::Reclaimable)
        } else {
            let reason = if session_id.is_some() {
                RecallReason::Retire
            } else {
                RecallReason::Evict
            };
            self.recall_delegations(replica_id, reason);
            let delegated = self.delegations_on(replica_id);
            Ok(RetireOutcome::AwaitingReaders {
                leases: leases - delegated,
            })
        }
    }

    pub(super) fn queue_reclaim(&mut self, replica_id: ReplicaId) {
        let Some(replica) = self.replicas.get(replica_id) else {
            return;
        };
        if self.reclaimed_by_directory(replica) {
            self.free_replica(replica_id);
            return;
        }
        let task = Task {
            id: TaskId(self.next_task),
            kind: TaskKind::Reclaim {
                replica: replica_id,
                location: replica.location(),
            },
        };
        self.next_task += 1;
        self.queue_task(replica.owner, task);
    }

    /// Whether the directory itself may free `replica`: its bytes are in an extent whose
    /// owning session has ended, so no node sub-allocates there any more and nothing but
    /// the directory's books needs to change.
    pub(super) fn reclaimed_by_directory(&self, replica: &Replica) -> bool {
        let Some(extents) = &self.pools[replica.pool.0 as usize].extents else {
            return false;
        };
        extents
            .owner_of(replica.offset_bytes)
            .is_none_or(|session| !self.sessions.get(&session).is_some_and(Session::is_open))
    }

    /// Hands the node up to `tasks_per_poll_max` of its pending tasks (at most `max`). A
    /// task not acknowledged within `task_ack_timeout` is handed out again, so acting on a
    /// task must be idempotent (freeing an already freed allocation is acknowledged).
    pub fn poll_tasks(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        max: u32,
    ) -> Result<Vec<Task>, DirectoryError> {
        let node = self.open_session(session_id)?.node;
        let wanted = max.min(self.config.tasks_per_poll_max) as usize;
        let holding_reclaims = self.holding_reclaims_of(now, node);
        let record = &mut self.nodes[node.0 as usize];
        let count = wanted.min(record.tasks.len());
        let tasks: Vec<Task> = if holding_reclaims {
            // Recovery: reclaims wait in the queue (see `adoption`); demotions go out.
            let (reclaims, others): (VecDeque<Task>, VecDeque<Task>) = record
                .tasks
                .drain(..)
                .partition(|task| matches!(task.kind, TaskKind::Reclaim { .. }));
            record.tasks = reclaims;
            let mut others = others;
            let handed: Vec<Task> = others.drain(..count.min(others.len())).collect();
            record.tasks.extend(others);
            handed
        } else {
            record.tasks.drain(..count).collect()
        };
        let retry_at = now + self.config.task_ack_timeout;
        record
            .handed_out
            .extend(tasks.iter().map(|task| (retry_at, *task)));
        let mut tasks = tasks;
        let room = wanted - tasks.len();
        if room > 0 {
            // Offers last, granted now and never handed out again.
            tasks.extend(self.hand_out_offers(now, session_id, room));
        }
        Ok(tasks)
    }

    /// Queues `task` for `node`'s next poll.
    pub(super) fn queue_task(&mut self, node: NodeId, task: Task) {
        self.nodes[node.0 as usize].tasks.push_back(task);
        self.tasks_queued += 1;
    }

    /// How many tasks were ever queued for nodes: it changes whenever some node may have
    /// tasks to fetch, so a caller waking nodes waiting for tasks checks
    /// [`Directory::has_tasks`] only then (and after a `tick`, which may end a recovery's
    /// hold on reclaims).
    pub fn tasks_queued(&self) -> u64 {
        self.tasks_queued
    }

    /// Whether a `poll_tasks` of `session_id` at `now` would hand out a task; `false` for
    /// a session that is not open.
    pub fn has_tasks(&self, now: Timestamp, session_id: SessionId) -> bool {
        let Ok(session) = self.open_session(session_id) else {
            return false;
        };
        let record = &self.nodes[session.node.0 as usize];
        if !record.offers.is_empty() {
            return true;
        }
        let tasks = &record.tasks;
        if self.holding_reclaims_of(now, session.node) {
            tasks
                .iter()
                .any(|task| !matches!(task.kind, TaskKind::Reclaim { .. }))
        } else {
            !tasks.is_empty()
        }
    }

    /// Hands out again the tasks whose acknowledgement is overdue and whose replica still
    /// waits for its reclaim.
    pub(super) fn requeue_overdue_tasks(&mut self, now: Timestamp) {
        for index in 0..self.nodes.len() {
            while let Some(&(retry_at, task)) = self.nodes[index].handed_out.front() {
                if retry_at > now {
                    break;
                }
                self.nodes[index].handed_out.pop_front();
                let waiting = match task.kind {
                    TaskKind::Reclaim { replica, .. } => {
                        let awaited = self.awaits_reclaim(replica);
                        if !awaited {
                            let acknowledged = &mut self.nodes[index].acknowledged_reclaims;
                            *acknowledged = acknowledged.saturating_sub(1);
                        }
                        awaited
                    }
                    TaskKind::Recall { delegation, .. } => self.delegation_live(delegation),
                    // Never in `handed_out`: an offer is not handed out again.
                    TaskKind::Delegate { .. } => false,
                    TaskKind::Demote { target, .. } => self.demotions.contains_key(&target),
                    TaskKind::Replicate { target, .. }
                    | TaskKind::Push { target, .. }
                    | TaskKind::Receive { target, .. } => self.replicating_into(target),
                };
                if waiting {
                    self.queue_task(NodeId(index as u32), task);
                }
            }
        }
    }

    /// Whether `replica` waits for its owner's reclaim: retiring, with no lease left.
    pub(super) fn awaits_reclaim(&self, replica: ReplicaId) -> bool {
        self.replicas
            .get(replica)
            .is_some_and(|record| record.state == ReplicaState::Retiring && record.lease_count == 0)
    }

    /// The owner freed the replica's storage (its allocation generation moved on): the
    /// bytes count as free and the replica is gone. Only a retiring replica with no lease
    /// is reclaimed; repeating the ack is harmless.
    pub fn reclaim_ack(
        &mut self,
        session_id: SessionId,
        replica_id: ReplicaId,
    ) -> Result<ReclaimOutcome, DirectoryError> {
        let node = self.open_session(session_id)?.node;
        let Some(replica) = self.replicas.get(replica_id) else {
            return Ok(ReclaimOutcome::Unknown);
        };
        if replica.owner != node {
            return Err(DirectoryError::NotOwner(replica_id));
        }
        if replica.state != ReplicaState::Retiring || replica.lease_count > 0 {
            return Err(DirectoryError::InvalidState {
                replica: replica_id,
                state: replica.state.name().into(),
                needed: "retiring without leases".into(),
            });
        }
        self.free_replica(replica_id);
        // Its task stays handed out until a compaction: no scan per acknowledgement.
        let record = &mut self.nodes[node.0 as usize];
        record.acknowledged_reclaims += 1;
        if record.acknowledged_reclaims > HANDED_OUT_COMPACTION_MIN.max(record.handed_out.len() / 2)
        {
            self.compact_handed_out(node);
        }
        Ok(ReclaimOutcome::Freed)
    }

    /// [`Directory::reclaim_ack`] for each replica, in order; one outcome (or refusal)
    /// per replica. `BatchTooLarge` (nothing applied) past `batch_items_max` replicas.
    pub fn reclaim_ack_many(
        &mut self,
        session_id: SessionId,
        replicas: &[ReplicaId],
    ) -> Result<Vec<Result<ReclaimOutcome, DirectoryError>>, DirectoryError> {
        self.check_batch(replicas.len())?;
        self.open_session(session_id)?;
        Ok(replicas
            .iter()
            .map(|replica| self.reclaim_ack(session_id, *replica))
            .collect())
    }

    /// Drops from `node`'s handed-out tasks the reclaims no longer awaited (acknowledged).
    fn compact_handed_out(&mut self, node: NodeId) {
        let mut handed_out = std::mem::take(&mut self.nodes[node.0 as usize].handed_out);
        handed_out.retain(|(_, task)| match task.kind {
            TaskKind::Reclaim { replica, .. } => self.awaits_reclaim(replica),
            _ => true,
        });
        let record = &mut self.nodes[node.0 as usize];
        record.handed_out = handed_out;
        record.acknowledged_reclaims = 0;
    }

    /// Removes a committed replica and returns its bytes; its leases must be gone.
    pub(super) fn free_replica(&mut self, replica_id: ReplicaId) {
        let Some(replica) = self.replicas.remove(replica_id) else {
            return;
        };
        self.replica_removed(
            replica.pool,
            &replica.object,
            replica.allocated_bytes,
            matches!(replica.state, ReplicaState::Reserved | ReplicaState::Ready),
        );
        let record = &mut self.pools[replica.pool.0 as usize];
        match replica.state {
            ReplicaState::Reserved => record.abort(replica.allocated_bytes),
            ReplicaState::Ready | ReplicaState::Retiring => record.free(
                replica.allocated_bytes,
                replica.state == ReplicaState::Retiring,
            ),
            ReplicaState::Free => {}
        }
        if replica.lease_count > 0 {
            record.pin(replica.allocated_bytes, false);
        }
        if let (Some(extents), ReplicaState::Ready | ReplicaState::Retiring) =
            (&mut record.extents, replica.state)
        {
            let sessions = &self.sessions;
            let cool_until = self.latest_tick + self.config.reservation_duration;
            extents.remove_replica(
                replica.offset_bytes,
                false,
                |session| sessions.get(&session).is_some_and(Session::is_open),
                cool_until,
            );
            self.note_extent_delta(super::ExtentDelta {
                pool: replica.pool,
                offset_bytes: replica.offset_bytes,
                added: false,
                cool_until,
            });
        }
    }
}
