//! Delegations: read authority over a READY replica, granted to a node that maps its pool,
//! so that the node answers probes and acquires of it from its own index without a round
//! trip here (`crate::node::delegations` is the node's half).
//!
//! A delegation *is* a lease, held by the node's session, with the longer
//! `2 × lease_duration`: everything that waits for a replica's readers (retire, eviction,
//! demotion, drain, reclaim) waits for it as for any lease, and a session's end voids it as
//! it voids that session's leases. The node grants a local lease under a delegation only
//! while at least one `lease_duration` of the delegation is left (measured on its own clock
//! from before it asked, so never later than here), and releases the delegation only once
//! no local lease under it is live. So no local lease outlives the delegation it was granted
//! under, and bytes the directory frees are bytes no lease, local or not, may read: the
//! lease invariant covers local hits too.
//!
//! Before the directory retires, demotes or evicts a delegated replica it *recalls* its
//! delegations: a `Recall` task to each holder, handed out again until the delegation
//! ends (a lost or duplicated recall changes nothing). A holder that never answers loses
//! its delegations at their deadline, or with its session when it is fenced.

use super::leases::LeaseRecord;
use super::ops::{Task, TaskKind};
use super::{AcquireMode, AcquireOutcome, Directory, DirectoryError, ReplicaState};
use crate::model::{LeaseId, ObjectId, ReplicaId, Scope, SessionId, TaskId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Why a delegation was recalled (a metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecallReason {
    /// Its replica was retired by its owner (or after a demotion or a drain's move).
    Retire,
    /// Its replica is among the coldest the eviction order looks at under pressure.
    Evict,
}

impl RecallReason {
    /// Every reason, in metrics order.
    pub const ALL: [RecallReason; 2] = [RecallReason::Retire, RecallReason::Evict];

    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            RecallReason::Retire => "retire",
            RecallReason::Evict => "evict",
        }
    }
}

/// A delegation granted with a lease: the node answers hits on the lease's replica under
/// `lease` for `duration_ms`, measured on its clock from before it asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    pub lease: LeaseId,
    pub duration_ms: u64,
}

/// Hits a node answered itself since its last report: under one of its delegations, or on
/// a replica in one of its own CPU pools (then `delegation` is the node's own key, unknown
/// here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalHits {
    pub delegation: LeaseId,
    pub replica: ReplicaId,
    pub object: ObjectId,
    pub hits: u32,
}

/// Accesses one report counts per object at most: a frequency class is reached long before.
const REPORTED_HITS_PER_OBJECT_MAX: u32 = 16;

/// The delegations in force, by replica and by session, and those recalled. Every entry is
/// a live delegation lease, so all are bounded by `leases_max`; a session holds at most
/// `delegations_per_session_max`.
#[derive(Default)]
pub(super) struct Delegations {
    by_replica: HashMap<ReplicaId, Vec<LeaseId>>,
    per_session: HashMap<SessionId, u32>,
    recalled: HashSet<LeaseId>,
    recalls: [u64; RecallReason::ALL.len()],
}

impl Directory {
    /// [`Directory::acquire`], and with each lease a delegation to the session where
    /// [`Directory::delegate`] grants one.
    pub fn acquire_delegating(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        objects: &[ObjectId],
        mode: AcquireMode,
    ) -> Result<(Vec<AcquireOutcome>, Vec<Option<Delegation>>), DirectoryError> {
        let outcomes = self.acquire(now, session_id, objects, mode)?;
        let leased: Vec<Option<ReplicaId>> = outcomes
            .iter()
            .map(|outcome| match outcome {
                AcquireOutcome::Leased(lease) => Some(lease.replica),
                _ => None,
            })
            .collect();
        let delegations = self.delegate(now, session_id, &leased);
        Ok((outcomes, delegations))
    }

    /// The leases of `objects`' outcomes, each with a delegation to `session_id` where the
    /// session holds none fresh on its replica and has room for one (the acquire already
    /// checked the session may map each replica). Returns one entry per outcome.
    pub fn delegate(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        leased: &[Option<ReplicaId>],
    ) -> Vec<Option<Delegation>> {
        let max = self.config.delegations_per_session_max;
        let duration = 2 * self.config.lease_duration;
        let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        leased
            .iter()
            .map(|replica| {
                let replica = (*replica)?;
                let held = self
                    .delegations
                    .per_session
                    .get(&session_id)
                    .copied()
                    .unwrap_or(0);
                if held >= max || !self.leases.has_room(1) || self.demoting.contains(&replica) {
                    return None;
                }
                if self.holds_fresh_delegation(now, session_id, replica) {
                    return None;
                }
                let lease = self.grant_delegation(now, session_id, replica, now + duration)?;
                Some(Delegation { lease, duration_ms })
            })
            .collect()
    }

    /// Whether `session_id` holds a delegation on `replica` with a lease's length or more
    /// left, under which it still grants.
    fn holds_fresh_delegation(
        &self,
        now: Timestamp,
        session_id: SessionId,
        replica: ReplicaId,
    ) -> bool {
        let fresh_until = now + self.config.lease_duration;
        self.delegations
            .by_replica
            .get(&replica)
            .into_iter()
            .flatten()
            .filter_map(|lease| self.leases.get(*lease))
            .any(|record| record.session == session_id && record.deadline >= fresh_until)
    }

    fn grant_delegation(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        replica_id: ReplicaId,
        deadline: Timestamp,
    ) -> Option<LeaseId> {
        self.replicas.get(replica_id)?;
        let lease = self.hold(
            now,
            LeaseRecord {
                replica: replica_id,
                session: session_id,
                deadline,
                delegation: true,
            },
        );
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.leases += 1;
        }
        self.delegations
            .by_replica
            .entry(replica_id)
            .or_default()
            .push(lease);
        *self.delegations.per_session.entry(session_id).or_default() += 1;
        Some(lease)
    }

    /// A delegation lease ended (released, expired or voided): its books go.
    pub(super) fn delegation_ended(&mut self, lease: LeaseId, record: &LeaseRecord) {
        let books = &mut self.delegations;
        if let Some(leases) = books.by_replica.get_mut(&record.replica) {
            leases.retain(|each| *each != lease);
            if leases.is_empty() {
                books.by_replica.remove(&record.replica);
            }
        }
        if let Some(held) = books.per_session.get_mut(&record.session) {
            *held -= 1;
            if *held == 0 {
                books.per_session.remove(&record.session);
            }
        }
        books.recalled.remove(&lease);
    }

    /// Recalls every delegation on `replica` not recalled yet: a `Recall` task to each
    /// holder's node. Returns how many were recalled now.
    pub(super) fn recall_delegations(&mut self, replica: ReplicaId, reason: RecallReason) -> u32 {
        let Some(leases) = self.delegations.by_replica.get(&replica) else {
            return 0;
        };
        let fresh: Vec<LeaseId> = leases
            .iter()
            .filter(|lease| !self.delegations.recalled.contains(lease))
            .copied()
            .collect();
        for lease in &fresh {
            let Some(node) = self
                .leases
                .get(*lease)
                .and_then(|record| self.sessions.get(&record.session))
                .map(|session| session.node)
            else {
                continue;
            };
            self.delegations.recalled.insert(*lease);
            self.delegations.recalls[reason as usize] += 1;
            let task = Task {
                id: TaskId(self.next_task),
                kind: TaskKind::Recall {
                    delegation: *lease,
                    replica,
                },
            };
            self.next_task += 1;
            self.queue_task(node, task);
        }
        fresh.len() as u32
    }

    /// Delegations on `replica`.
    pub(super) fn delegations_on(&self, replica: ReplicaId) -> u32 {
        self.delegations
            .by_replica
            .get(&replica)
            .map_or(0, |leases| leases.len() as u32)
    }

    /// Whether every lease on `replica` is a delegation (so recalling them frees it).
    pub(super) fn only_delegated(&self, replica: ReplicaId, lease_count: u32) -> bool {
        lease_count > 0
            && self
                .delegations
                .by_replica
                .get(&replica)
                .is_some_and(|leases| leases.len() as u32 == lease_count)
    }

    /// Whether the delegation `lease` is still in force (a recall of it is still awaited).
    pub(super) fn delegation_live(&self, lease: LeaseId) -> bool {
        self.leases
            .get(lease)
            .is_some_and(|record| record.delegation)
    }

    /// Counts the hits a session's node answered itself (under its delegations, or on
    /// replicas in its own CPU pools) as accesses, as the directory counts the hits it
    /// answers: the eviction order and the access history see them. Reports of
    /// delegations the session no longer holds, and of replicas no longer READY, are
    /// ignored.
    pub fn report_local_hits(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        hits: &[LocalHits],
    ) -> Result<(), DirectoryError> {
        self.check_batch(hits.len())?;
        self.open_session(session_id)?;
        let node = self.sessions.get(&session_id).map(|session| session.node);
        for report in hits {
            let delegated = self.leases.get(report.delegation).is_some_and(|record| {
                record.delegation
                    && record.session == session_id
                    && record.replica == report.replica
            });
            let replica_id = report.replica;
            let matches = self.replicas.get(replica_id).is_some_and(|replica| {
                replica.object == report.object
                    && replica.state == ReplicaState::Ready
                    && (delegated
                        || node.is_some_and(|node| {
                            self.pools[replica.pool.0 as usize].spec.scope == Scope::Host(node)
                        }))
            });
            if !matches {
                continue;
            }
            let mut class = 0;
            for _ in 0..report.hits.min(REPORTED_HITS_PER_OBJECT_MAX) {
                class = self.record_access(now, &report.object);
            }
            if report.hits > 0 {
                if let Some(replica) = self.replicas.get_mut(replica_id) {
                    replica.last_access = now;
                }
                self.replicas.touch(replica_id, class);
            }
        }
        Ok(())
    }

    /// Delegations recalled so far, by reason (in the order of [`RecallReason::ALL`]).
    pub fn recalls_by_reason(&self) -> [(RecallReason, u64); RecallReason::ALL.len()] {
        std::array::from_fn(|index| (RecallReason::ALL[index], self.delegations.recalls[index]))
    }

    /// Delegations in force.
    pub fn delegations_live(&self) -> u64 {
        self.delegations
            .per_session
            .values()
            .map(|held| u64::from(*held))
            .sum()
    }

    /// The length of a delegation: twice a lease's.
    pub fn delegation_duration(&self) -> Duration {
        2 * self.config.lease_duration
    }
}
