//! Draining a node: the graceful way out of the cluster (`kvtier ctl drain`, or the node's
//! section removed from `cluster.toml`). The state machine, advanced by `tick`:
//!
//! `Relocating` — the directory places nothing new for the node (its stores are skipped);
//! each tick, the READY unleased replicas of its host pools leave them, at most
//! `evictions_per_tick_max` per tick: one tier colder into a shared pool the node maps when
//! placement says keeping them pays (the demotion tasks of `demotion`, carried out by the
//! node), retired otherwise. Once its host pools hold no READY replica and no demotion of
//! its is in flight → `AwaitingLeases` — the node's leases and reservations run out (each
//! lease within `lease_duration`) → `Drained`: its session ends in
//! [`SessionState::Drained`], and the node, refused with [`DirectoryError::Drained`],
//! exits cleanly. A session that is fenced or replaced meanwhile ends the drain as
//! `Interrupted`.
//!
//! A drain always ends or says why not: one that makes no progress (no replica leaves its
//! host pools, its leases and reservations do not end) for `drain_stall_ms` is reported
//! `Stuck` with a [`DrainStuck`] reason (demotions that never complete into a full pool,
//! replicas that readers keep leased, ...). It keeps trying, and is reported as before once
//! it progresses again.

use super::demotion::Departure;
use super::{Directory, DirectoryError, ReplicaState, SessionState};
use crate::model::{NodeId, PoolId, ReplicaId, SessionId, Timestamp};
use crate::policy::history::FREQUENCY_CLASSES;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where a node's drain is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainState {
    /// Moving or retiring the replicas of its host pools.
    Relocating,
    /// Everything relocated; waiting for its leases and reservations to end.
    AwaitingLeases,
    /// No progress for `drain_stall_ms` ([`DrainProgress::stuck`] says why); still trying.
    Stuck,
    /// Its session ended as drained.
    Drained,
    /// Its session was fenced or replaced before the drain finished.
    Interrupted,
}

impl DrainState {
    /// Every state, for metrics.
    pub const ALL: [DrainState; 5] = [
        DrainState::Relocating,
        DrainState::AwaitingLeases,
        DrainState::Stuck,
        DrainState::Drained,
        DrainState::Interrupted,
    ];

    /// The state's name in metrics, status and logs.
    pub fn name(self) -> &'static str {
        match self {
            DrainState::Relocating => "relocating",
            DrainState::AwaitingLeases => "awaiting_leases",
            DrainState::Stuck => "stuck",
            DrainState::Drained => "drained",
            DrainState::Interrupted => "interrupted",
        }
    }

    /// Whether the drain is still under way.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            DrainState::Relocating | DrainState::AwaitingLeases | DrainState::Stuck
        )
    }
}

/// Why a drain made no progress for `drain_stall_ms`: what the operator can change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Error)]
pub enum DrainStuck {
    /// Demotions out of the node's pools were started and none completed: the node cannot
    /// write into the target pool (full, or no extent free for it). Free room there, or
    /// stop the node (its CPU replicas are then dropped).
    #[error("{demotions} demotions into pool `{pool}` did not complete (is it full?)")]
    DemotionsFail { pool: String, demotions: u64 },
    /// Replicas stay leased by readers, which renew their leases.
    #[error("{replicas} replicas stay leased by readers")]
    Leased { replicas: u64 },
    /// The node's own session keeps leases or reservations.
    #[error("the node keeps {leases} leases and {reservations} reservations")]
    Held { leases: u32, reservations: u32 },
    /// Replicas neither leased nor demoted stay (none of the above).
    #[error("{replicas} replicas do not leave the node's pools")]
    Unmoved { replicas: u64 },
}

/// A drain's progress, as `kvtier ctl status` and `drain` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainProgress {
    pub state: DrainState,
    /// READY replicas still in the node's host pools.
    pub replicas_left: u64,
    /// Demotions out of its host pools in flight.
    pub demotions_in_flight: u64,
    /// Leases the node's session holds.
    pub leases_outstanding: u32,
    /// Reservations the node's session holds.
    pub reservations_outstanding: u32,
    /// Why the drain is [`DrainState::Stuck`]; `None` in every other state.
    pub stuck: Option<DrainStuck>,
}

/// One node's drain: the session it drains and where it is. At most one per node, so the
/// table is bounded by `nodes_max`.
#[derive(Clone, Copy, Debug)]
pub(super) struct DrainRecord {
    pub session: SessionId,
    /// Never `Stuck`: that is `stall.stuck`, reported over this state.
    pub state: DrainState,
    pub stall: Stall,
}

impl DrainRecord {
    fn new(session: SessionId) -> DrainRecord {
        DrainRecord {
            session,
            state: DrainState::Relocating,
            stall: Stall::default(),
        }
    }
}

/// Whether a drain progresses: since when it did not, and why.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Stall {
    /// When the drain last progressed (its first step, a replica gone, a state changed).
    since: Option<Timestamp>,
    /// The fewest replicas left seen since: progress is going below it.
    replicas_left_min: u64,
    /// Demotions started since the drain last progressed, and the pool of the last one.
    demotions_started: u64,
    demotion_pool: Option<PoolId>,
    /// Why it is stuck, once `drain_stall` passed without progress.
    stuck: Option<StuckCause>,
}

/// [`DrainStuck`] as the core keeps it (a pool by id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StuckCause {
    DemotionsFail {
        pool: Option<PoolId>,
        demotions: u64,
    },
    Leased {
        replicas: u64,
    },
    Held {
        leases: u32,
        reservations: u32,
    },
    Unmoved {
        replicas: u64,
    },
}

impl Directory {
    /// Starts draining the node called `name` (idempotent: a drain under way is reported
    /// as it is). Refused with `UnknownNode` when the node has no open session.
    pub fn drain(&mut self, name: &str) -> Result<DrainProgress, DirectoryError> {
        let unknown = || DirectoryError::UnknownNode(name.to_owned());
        let node = *self.node_ids.get(name).ok_or_else(unknown)?;
        let session = self.nodes[node.0 as usize].session.ok_or_else(unknown)?;
        self.open_session(session).map_err(|_| unknown())?;
        let under_way = self
            .drains
            .get(&node)
            .is_some_and(|record| record.session == session && record.state.is_active());
        if !under_way {
            self.drains.insert(node, DrainRecord::new(session));
            // Its delegations would keep it waiting to their deadline: they go now, and
            // it is granted none while draining.
            self.recall_session_delegations(session);
        }
        Ok(self.drain_progress(node).unwrap_or_else(|| unreachable!()))
    }

    /// Whether `session_id` is being drained (granted no delegation meanwhile).
    pub(super) fn draining(&self, session_id: SessionId) -> bool {
        self.sessions
            .get(&session_id)
            .and_then(|session| self.drains.get(&session.node))
            .is_some_and(|record| record.session == session_id && record.state.is_active())
    }

    /// The drain of node `node`, if one was started.
    pub fn drain_progress(&self, node: NodeId) -> Option<DrainProgress> {
        let record = self.drains.get(&node)?;
        let pools = self.host_pools_of(record.session);
        let (replicas_left, demotions_in_flight) = self.host_replicas_left(&pools);
        let session = self.sessions.get(&record.session);
        let stuck = record
            .stall
            .stuck
            .filter(|_| record.state.is_active())
            .map(|cause| self.stuck_reason(cause));
        Some(DrainProgress {
            state: if stuck.is_some() {
                DrainState::Stuck
            } else {
                record.state
            },
            replicas_left,
            demotions_in_flight,
            leases_outstanding: session.map_or(0, |session| session.leases),
            reservations_outstanding: session
                .map_or(0, |session| session.reservations.len() as u32),
            stuck,
        })
    }

    /// A stuck cause as the operator reads it (pools by name).
    fn stuck_reason(&self, cause: StuckCause) -> DrainStuck {
        match cause {
            StuckCause::DemotionsFail { pool, demotions } => DrainStuck::DemotionsFail {
                pool: pool.map_or_else(
                    || "unknown".to_string(),
                    |pool| self.pools[pool.0 as usize].spec.name.clone(),
                ),
                demotions,
            },
            StuckCause::Leased { replicas } => DrainStuck::Leased { replicas },
            StuckCause::Held {
                leases,
                reservations,
            } => DrainStuck::Held {
                leases,
                reservations,
            },
            StuckCause::Unmoved { replicas } => DrainStuck::Unmoved { replicas },
        }
    }

    /// The nodes whose drain is under way (at most `nodes_max`).
    pub fn active_drains(&self) -> Vec<NodeId> {
        self.drains
            .iter()
            .filter(|(_, record)| record.state.is_active())
            .map(|(node, _)| *node)
            .collect()
    }

    /// Whether node `node`'s drain has nothing left in this shard: no replica in its host
    /// pools, no demotion out of them, no lease, no reservation. A sharded directory ends
    /// the drain ([`Directory::end_drain`]) once every shard says so, so that the node's
    /// session ends in all of them alike.
    pub fn drain_may_end(&self, node: NodeId) -> bool {
        let Some(record) = self
            .drains
            .get(&node)
            .filter(|record| record.state.is_active())
        else {
            return false;
        };
        let open = self
            .sessions
            .get(&record.session)
            .filter(|session| session.is_open());
        open.is_some_and(|session| {
            session.leases == 0
                && session.reservations.is_empty()
                && self.host_replicas_left(&self.host_pools_of(record.session)) == (0, 0)
        })
    }

    /// Ends node `node`'s drain: its session ends `Drained`. The sharded directory's last
    /// step of a drain every shard may end.
    pub fn end_drain(&mut self, now: Timestamp, node: NodeId) {
        if let Some(record) = self.drains.get(&node).copied() {
            self.end_session(now, record.session, SessionState::Drained);
            if let Some(drain) = self.drains.get_mut(&node) {
                drain.state = DrainState::Drained;
                drain.stall.stuck = None;
            }
        }
    }

    /// Whether `session` is being drained: the directory places nothing new for it.
    pub(super) fn is_draining(&self, session: SessionId) -> bool {
        self.sessions
            .get(&session)
            .and_then(|record| self.drains.get(&record.node))
            .is_some_and(|drain| drain.session == session && drain.state.is_active())
    }

    /// Advances every active drain by one step (see the module documentation). Returns
    /// the drains whose state or stuck reason changed, with their progress.
    pub(super) fn advance_drains(&mut self, now: Timestamp) -> Vec<(NodeId, DrainProgress)> {
        let active: Vec<(NodeId, DrainRecord)> = self
            .drains
            .iter()
            .filter(|(_, record)| record.state.is_active())
            .map(|(node, record)| (*node, *record))
            .collect();
        let mut budget = self.config.evictions_per_tick_max;
        let mut changed = Vec::new();
        for (node, mut record) in active {
            let before = (record.state, record.stall.stuck);
            self.drain_step(now, node, &mut record, &mut budget);
            if let Some(drain) = self.drains.get_mut(&node) {
                *drain = record;
            }
            if (record.state, record.stall.stuck) != before {
                changed.extend(self.drain_progress(node).map(|progress| (node, progress)));
            }
        }
        changed
    }

    /// The name of node `node`, as its certificate and the configuration say.
    pub fn node_name(&self, node: NodeId) -> Option<&str> {
        self.node_ids
            .iter()
            .find(|(_, id)| **id == node)
            .map(|(name, _)| name.as_str())
    }

    /// One step of one drain: moves what may leave, then updates `record`'s state and
    /// whether it progresses.
    fn drain_step(
        &mut self,
        now: Timestamp,
        node: NodeId,
        record: &mut DrainRecord,
        budget: &mut u32,
    ) {
        let current = self.nodes[node.0 as usize].session == Some(record.session);
        let Some(session) = self
            .sessions
            .get(&record.session)
            .filter(|session| current && session.is_open())
        else {
            record.state = DrainState::Interrupted;
            return;
        };
        let (leases, reservations) = (session.leases, session.reservations.len() as u32);
        let pools = self.host_pools_of(record.session);
        let (mut left, mut demotions_started, mut demotion_pool) = ((0, 0), 0, None);
        if record.state == DrainState::Relocating {
            for victim in self.relocatable(&pools, *budget) {
                *budget -= 1;
                if let Departure::Demoted { to, .. } = self.demote_or_retire(now, victim, true) {
                    demotions_started += 1;
                    demotion_pool = Some(to);
                }
            }
            left = self.host_replicas_left(&pools);
        }
        let next = if left != (0, 0) {
            DrainState::Relocating
        } else if leases > 0 || reservations > 0 || self.shard.count > 1 {
            // A shard of several waits here for the others: [`Directory::end_drain`].
            DrainState::AwaitingLeases
        } else {
            self.end_session(now, record.session, SessionState::Drained);
            DrainState::Drained
        };
        let progressed = next != record.state || left.0 < record.stall.replicas_left_min;
        record.state = next;
        let since = match record.stall.since {
            Some(since) if !progressed => since,
            _ => {
                record.stall = Stall {
                    since: Some(now),
                    replicas_left_min: left.0,
                    ..Stall::default()
                };
                now
            }
        };
        record.stall.demotions_started += demotions_started;
        record.stall.demotion_pool = demotion_pool.or(record.stall.demotion_pool);
        if next.is_active() && now.saturating_since(since) >= self.config.drain_stall {
            record.stall.stuck = Some(self.stuck_cause(record, &pools, leases, reservations));
        }
    }

    /// Why a drain in `record`'s state, over its node's host `pools`, does not progress.
    fn stuck_cause(
        &self,
        record: &DrainRecord,
        pools: &[PoolId],
        leases: u32,
        reservations: u32,
    ) -> StuckCause {
        if record.state == DrainState::AwaitingLeases {
            return StuckCause::Held {
                leases,
                reservations,
            };
        }
        let remaining: Vec<&super::replicas::Replica> = pools
            .iter()
            .flat_map(|pool| {
                (0..FREQUENCY_CLASSES).flat_map(|class| self.replicas.coldest(*pool, class))
            })
            .map(|(_, replica)| replica)
            .collect();
        let leased = remaining
            .iter()
            .filter(|replica| replica.lease_count > 0)
            .count() as u64;
        if record.stall.demotions_started > 0 {
            StuckCause::DemotionsFail {
                pool: record.stall.demotion_pool,
                demotions: record.stall.demotions_started,
            }
        } else if leased > 0 {
            StuckCause::Leased { replicas: leased }
        } else {
            StuckCause::Unmoved {
                replicas: remaining.len() as u64,
            }
        }
    }

    /// Up to `max` READY replicas of `pools` that may leave now: unleased and not being
    /// demoted already.
    fn relocatable(&self, pools: &[PoolId], max: u32) -> Vec<ReplicaId> {
        pools
            .iter()
            .flat_map(|pool| {
                (0..FREQUENCY_CLASSES).flat_map(|class| self.replicas.coldest(*pool, class))
            })
            .filter(|(id, replica)| replica.lease_count == 0 && !self.demoting.contains(id))
            .map(|(id, _)| id)
            .take(max as usize)
            .collect()
    }

    /// READY replicas in `pools`, and those of them being demoted.
    fn host_replicas_left(&self, pools: &[PoolId]) -> (u64, u64) {
        let mut left = (0, 0);
        for pool in pools {
            for class in 0..FREQUENCY_CLASSES {
                for (id, replica) in self.replicas.coldest(*pool, class) {
                    debug_assert_eq!(replica.state, ReplicaState::Ready);
                    left.0 += 1;
                    left.1 += u64::from(self.demoting.contains(&id));
                }
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{commit_demotions, Fixture, MIB};
    use super::*;
    use crate::directory::{DirectoryConfig, TaskKind};
    use crate::model::{DomainId, Medium};
    use std::time::Duration;

    const STALL: Duration = Duration::from_secs(5);

    #[test]
    fn a_drain_whose_demotions_never_complete_is_stuck_with_the_reason_then_resumes() {
        let mut fixture = Fixture::with_config(DirectoryConfig {
            drain_stall: STALL,
            ..DirectoryConfig::default()
        });
        let cxl = fixture.cxl(8 * MIB);
        let a = fixture.node_with("a", 4 * MIB, vec![Medium::Cpu], vec![DomainId(0)]);
        let object = fixture.object(1);
        fixture.store(&a, object, MIB);
        fixture.directory.drain("a").unwrap();
        // The node cannot write into the CXL pool: it gives every demotion back.
        let mut given_back = 0;
        let until = fixture.now + STALL;
        while fixture.now < until {
            fixture.directory.tick(fixture.now);
            let progress = fixture.directory.drain_progress(a.node).unwrap();
            assert_eq!(progress.state, DrainState::Relocating, "{progress:?}");
            for task in fixture.poll(&a, 16) {
                if let TaskKind::Demote { target, .. } = task.kind {
                    fixture.directory.abort(a.session, target).unwrap();
                    given_back += 1;
                }
            }
            fixture.now = fixture.now + Duration::from_millis(500);
        }
        assert_eq!(given_back, 10, "one demotion tried per step");
        fixture.directory.tick(fixture.now);
        fixture.directory.check_invariants();
        let progress = fixture.directory.drain_progress(a.node).unwrap();
        assert_eq!(progress.state, DrainState::Stuck);
        assert_eq!(progress.replicas_left, 1);
        let reason = progress.stuck.unwrap();
        assert_eq!(
            reason,
            DrainStuck::DemotionsFail {
                pool: "cxl0".into(),
                demotions: 11
            }
        );
        assert_eq!(
            reason.to_string(),
            "11 demotions into pool `cxl0` did not complete (is it full?)"
        );
        assert!(
            fixture.directory.is_draining(a.session),
            "a stuck drain still places nothing new"
        );
        // Room again: the demotion completes and the drain ends.
        assert_eq!(commit_demotions(&mut fixture, &a, cxl), 1);
        fixture.directory.tick(fixture.now);
        let progress = fixture.directory.drain_progress(a.node).unwrap();
        assert_eq!(
            (progress.state, progress.stuck),
            (DrainState::Drained, None)
        );
    }

    #[test]
    fn a_drain_whose_node_keeps_its_leases_is_stuck_saying_so() {
        let mut fixture = Fixture::with_config(DirectoryConfig {
            drain_stall: STALL,
            lease_duration: STALL * 4,
            ..DirectoryConfig::default()
        });
        fixture.cxl(8 * MIB);
        let a = fixture.node_with("a", MIB, vec![Medium::Cxl], vec![DomainId(0)]);
        let object = fixture.object(1);
        fixture.store(&a, object, MIB);
        let _lease = fixture.acquire_one(&a, object);
        fixture.directory.drain("a").unwrap();
        fixture.directory.tick(fixture.now);
        fixture.now = fixture.now + STALL - Duration::from_millis(1);
        fixture.directory.tick(fixture.now);
        let progress = fixture.directory.drain_progress(a.node).unwrap();
        assert_eq!(progress.state, DrainState::AwaitingLeases, "not yet");
        fixture.now = fixture.now + Duration::from_millis(1);
        fixture.directory.tick(fixture.now);
        let progress = fixture.directory.drain_progress(a.node).unwrap();
        assert_eq!(progress.state, DrainState::Stuck);
        assert_eq!(
            progress.stuck,
            Some(DrainStuck::Held {
                leases: 1,
                reservations: 0
            })
        );
    }
}
