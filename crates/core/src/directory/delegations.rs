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
//!
//! A node's first hit on a replica in shared memory would still need the directory: the
//! delegation comes with the acquire. So when such a replica becomes READY the directory
//! *offers* a delegation on it to every node that maps it: the offer waits in the node's
//! queue and is granted when the node next polls its tasks, as a `Delegate` task. The node
//! measures it from before that poll, as it measures an acquire's from before the acquire;
//! so the same rules hold, and the first hit is local too. Offers take at most half of a
//! session's delegations, so the ones its acquires bring always have room.
//!
//! A delegation does not keep its replica from eviction: a replica only delegations hold is
//! chosen by the eviction order like an unleased one, and retiring it recalls them; its
//! bytes go once the holders released them.

use super::leases::LeaseRecord;
use super::ops::{Lease, Task, TaskKind};
use super::{AcquireMode, AcquireOutcome, Delegation, Directory, DirectoryError, ReplicaState};
use crate::model::{LeaseId, ObjectId, ReplicaId, Scope, SessionId, TaskId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Why a delegation was recalled (a metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecallReason {
    /// Its replica was retired by its owner (or after a demotion or a drain's move).
    Retire,
    /// Its replica was chosen by the eviction order under pressure.
    Evict,
    /// Its holder is being drained: it reads nothing more under delegations.
    Drain,
}

impl RecallReason {
    /// Every reason, in metrics order.
    pub const ALL: [RecallReason; 3] = [
        RecallReason::Retire,
        RecallReason::Evict,
        RecallReason::Drain,
    ];

    /// The metrics label.
    pub fn label(self) -> &'static str {
        match self {
            RecallReason::Retire => "retire",
            RecallReason::Evict => "evict",
            RecallReason::Drain => "drain",
        }
    }
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

/// Delegation offers one node's queue holds ([`Directory::offer_delegation`]); past it the
/// oldest goes: an offer only saves a first hit's round trip, and the newest replicas are
/// the likeliest to be read next.
pub const OFFERS_QUEUED_MAX: usize = 1024;

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
    /// Delegations granted on offer ([`Directory::hand_out_offers`]).
    offered: u64,
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
        let draining = self.draining(session_id);
        let duration = 2 * self.config.lease_duration;
        let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        leased
            .iter()
            .map(|replica| {
                let replica = (*replica)?;
                let held = self.delegations_held(session_id);
                if held >= max
                    || draining
                    || !self.leases.has_room(1)
                    || self.demoting.contains(&replica)
                {
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

    /// `object`'s `replica` was just made READY: in a shared pool, every node with an open
    /// session that maps the pool's domain is offered a delegation on it, handed out with
    /// its next poll of tasks ([`Directory::hand_out_offers`]), which wakes for it. One pass
    /// over the node records (at most `nodes_max`).
    pub(super) fn offer_to_domain(&mut self, object: ObjectId, replica: ReplicaId) {
        let Some(pool) = self.replicas.get(replica).map(|replica| replica.pool) else {
            return;
        };
        let Scope::Domain(domain) = self.pools[pool.0 as usize].spec.scope else {
            return;
        };
        let mut offered = false;
        for index in 0..self.nodes.len() {
            let maps = self.nodes[index]
                .session
                .and_then(|session| self.sessions.get(&session))
                .is_some_and(|session| session.is_open() && session.domains.contains(&domain));
            if !maps {
                continue;
            }
            let offers = &mut self.nodes[index].offers;
            if offers.len() >= OFFERS_QUEUED_MAX {
                offers.pop_front();
            }
            offers.push_back((object, replica));
            offered = true;
        }
        if offered {
            self.tasks_queued += 1;
        }
    }

    /// Up to `max` of the offers queued for `session_id`'s node, each a `Delegate` task
    /// whose delegation is granted now, as an acquire's would be. An offer that no longer
    /// holds (its replica not READY, not the session's to map, a delegation on it held
    /// fresh, the session holding half its `delegations_per_session_max` or more, or no
    /// room for a lease) is dropped.
    pub(super) fn hand_out_offers(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        max: usize,
    ) -> Vec<Task> {
        let Some(session) = self.sessions.get(&session_id) else {
            return Vec::new();
        };
        let node = session.node.0 as usize;
        if self.draining(session_id) {
            self.nodes[node].offers.clear();
            return Vec::new();
        }
        let view = self.read_view(session);
        let offers_max = self.config.delegations_per_session_max / 2;
        let lease_ms = u64::try_from(self.config.lease_duration.as_millis()).unwrap_or(u64::MAX);
        let mut tasks = Vec::new();
        while tasks.len() < max {
            let Some((object, replica_id)) = self.nodes[node].offers.pop_front() else {
                break;
            };
            let Some(replica) = self.replicas.get(replica_id) else {
                continue;
            };
            let readable = self.sessions.get(&session_id).is_some_and(|session| {
                self.check_namespaces(session, std::iter::once(object.namespace))
                    .is_ok()
            });
            let held = self.delegations_held(session_id);
            if replica.object != object
                || replica.state != ReplicaState::Ready
                || view.rank(replica.pool).is_none()
                || !readable
                || held >= offers_max
            {
                continue;
            }
            let template = Lease {
                lease: LeaseId(0),
                duration_ms: lease_ms,
                replica: replica_id,
                medium: self.pools[replica.pool.0 as usize].spec.medium,
                location: replica.location(),
                deadline: now + self.config.lease_duration,
            };
            let Some(Some(delegation)) = self.delegate(now, session_id, &[Some(replica_id)]).pop()
            else {
                continue;
            };
            tasks.push(Task {
                id: TaskId(self.next_task),
                kind: TaskKind::Delegate {
                    object,
                    lease: Lease {
                        lease: delegation.lease,
                        ..template
                    },
                    delegation,
                },
            });
            self.next_task += 1;
            self.delegations.offered += 1;
        }
        tasks
    }

    /// Delegations `session_id` holds.
    fn delegations_held(&self, session_id: SessionId) -> u32 {
        self.delegations
            .per_session
            .get(&session_id)
            .copied()
            .unwrap_or(0)
    }

    /// Delegations granted on offer so far.
    pub fn delegations_offered(&self) -> u64 {
        self.delegations.offered
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

    /// Recalls every delegation `session_id` holds not recalled yet (its node is being
    /// drained): one pass over the delegations in force.
    pub(super) fn recall_session_delegations(&mut self, session_id: SessionId) {
        let Some(node) = self.sessions.get(&session_id).map(|session| session.node) else {
            return;
        };
        let held: Vec<(ReplicaId, LeaseId)> = self
            .delegations
            .by_replica
            .iter()
            .flat_map(|(replica, leases)| leases.iter().map(move |lease| (*replica, *lease)))
            .filter(|(_, lease)| !self.delegations.recalled.contains(lease))
            .filter(|(_, lease)| {
                self.leases
                    .get(*lease)
                    .is_some_and(|record| record.session == session_id)
            })
            .collect();
        for (replica, delegation) in held {
            self.delegations.recalled.insert(delegation);
            self.delegations.recalls[RecallReason::Drain as usize] += 1;
            let task = Task {
                id: TaskId(self.next_task),
                kind: TaskKind::Recall {
                    delegation,
                    replica,
                },
            };
            self.next_task += 1;
            self.queue_task(node, task);
        }
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
