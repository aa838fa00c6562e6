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

use super::{Directory, DirectoryError, ReplicaState, SessionState};
use crate::model::{NodeId, PoolId, ReplicaId, SessionId, Timestamp};
use crate::policy::history::FREQUENCY_CLASSES;
use serde::{Deserialize, Serialize};

/// Where a node's drain is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainState {
    /// Moving or retiring the replicas of its host pools.
    Relocating,
    /// Everything relocated; waiting for its leases and reservations to end.
    AwaitingLeases,
    /// Its session ended as drained.
    Drained,
    /// Its session was fenced or replaced before the drain finished.
    Interrupted,
}

impl DrainState {
    /// Every state, for metrics.
    pub const ALL: [DrainState; 4] = [
        DrainState::Relocating,
        DrainState::AwaitingLeases,
        DrainState::Drained,
        DrainState::Interrupted,
    ];

    /// The state's name in metrics, status and logs.
    pub fn name(self) -> &'static str {
        match self {
            DrainState::Relocating => "relocating",
            DrainState::AwaitingLeases => "awaiting_leases",
            DrainState::Drained => "drained",
            DrainState::Interrupted => "interrupted",
        }
    }

    /// Whether the drain is still under way.
    pub fn is_active(self) -> bool {
        matches!(self, DrainState::Relocating | DrainState::AwaitingLeases)
    }
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
}

/// One node's drain: the session it drains and where it is. At most one per node, so the
/// table is bounded by `nodes_max`.
#[derive(Clone, Copy, Debug)]
pub(super) struct DrainRecord {
    pub session: SessionId,
    pub state: DrainState,
}

impl Directory {
    /// Starts draining the node called `name` (idempotent: a drain under way is reported
    /// as it is). Refused with `UnknownNode` when the node has no open session.
    pub fn drain(&mut self, name: &str) -> Result<DrainProgress, DirectoryError> {
        let unknown = || DirectoryError::UnknownNode(name.to_owned());
        let node = *self.node_ids.get(name).ok_or_else(unknown)?;
        let session = self.nodes[node.0 as usize].session.ok_or_else(unknown)?;
        self.open_session(session).map_err(|_| unknown())?;
        let record = self.drains.entry(node).or_insert(DrainRecord {
            session,
            state: DrainState::Relocating,
        });
        if record.session != session || !record.state.is_active() {
            *record = DrainRecord {
                session,
                state: DrainState::Relocating,
            };
        }
        Ok(self.drain_progress(node).unwrap_or_else(|| unreachable!()))
    }

    /// The drain of node `node`, if one was started.
    pub fn drain_progress(&self, node: NodeId) -> Option<DrainProgress> {
        let record = self.drains.get(&node)?;
        let pools = self.host_pools_of(record.session);
        let (replicas_left, demotions_in_flight) = self.host_replicas_left(&pools);
        let session = self.sessions.get(&record.session);
        Some(DrainProgress {
            state: record.state,
            replicas_left,
            demotions_in_flight,
            leases_outstanding: session.map_or(0, |session| session.leases),
            reservations_outstanding: session
                .map_or(0, |session| session.reservations.len() as u32),
        })
    }

    /// Whether `session` is being drained: the directory places nothing new for it.
    pub(super) fn is_draining(&self, session: SessionId) -> bool {
        self.sessions
            .get(&session)
            .and_then(|record| self.drains.get(&record.node))
            .is_some_and(|drain| drain.session == session && drain.state.is_active())
    }

    /// Advances every active drain by one step (see the module documentation).
    pub(super) fn advance_drains(&mut self, now: Timestamp) {
        let active: Vec<(NodeId, DrainRecord)> = self
            .drains
            .iter()
            .filter(|(_, record)| record.state.is_active())
            .map(|(node, record)| (*node, *record))
            .collect();
        let mut budget = self.config.evictions_per_tick_max;
        for (node, record) in active {
            let state = self.drain_step(now, node, record, &mut budget);
            if let Some(drain) = self.drains.get_mut(&node) {
                drain.state = state;
            }
        }
    }

    /// One step of one drain; returns its next state.
    fn drain_step(
        &mut self,
        now: Timestamp,
        node: NodeId,
        record: DrainRecord,
        budget: &mut u32,
    ) -> DrainState {
        let current = self.nodes[node.0 as usize].session == Some(record.session);
        let Some(session) = self.sessions.get(&record.session).filter(|_| current) else {
            return DrainState::Interrupted;
        };
        if !session.is_open() {
            return DrainState::Interrupted;
        }
        let (leases, reservations) = (session.leases, session.reservations.len());
        let pools = self.host_pools_of(record.session);
        if record.state == DrainState::Relocating {
            for victim in self.relocatable(&pools, *budget) {
                *budget -= 1;
                self.demote_or_retire(now, victim, true);
            }
            if self.host_replicas_left(&pools) != (0, 0) {
                return DrainState::Relocating;
            }
        }
        if leases > 0 || reservations > 0 {
            return DrainState::AwaitingLeases;
        }
        self.end_session(now, record.session, SessionState::Drained);
        DrainState::Drained
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
