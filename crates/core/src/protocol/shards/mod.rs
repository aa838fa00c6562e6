//! A directory of several shards in one process: the router in front of the shards' cores.
//!
//! Each shard is a whole [`Directory`] core. Object state (replicas, leases, publications,
//! delegations, demotions, copies, the access history) lives in the shard a keyed hash of
//! the object's id names ([`Shards::shard_of`]); every replica, lease and task id names the
//! shard that issued it ([`crate::model::shard_stamp`]), so a request that carries one goes
//! back to it. The rest — nodes, sessions and epochs, pools, namespaces, profiles, drains —
//! is the same in every shard: the router applies each such request to every shard in the
//! same order, and ticks them all at the same instant, so their copies never drift (the
//! simulation checks it after every step: [`Shards::check_invariants`]). Two decisions read
//! object state and so are taken over all shards at once: whether a pool being registered
//! again still holds bytes, and when a drain may end; and each shard counts the replicas of
//! every shard in the extents of shared pools ([`crate::directory::ExtentDelta`], passed on
//! after each call), so that all of them release an extent when its last replica goes. A node sees one directory: one
//! session, batches answered in their order, pools reported whole (each shard reserves
//! against its share of every pool, [`crate::directory::ShardPlace::share`]).
//!
//! Pure and synchronous like [`super::directory::handle`]: the caller supplies `now`.

use super::directory::{handle, NodeGrant, PeerRole};
use super::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use crate::directory::{
    Directory, DirectoryConfig, DirectoryError, DrainProgress, DrainState, ShardPlace, TickReport,
};
use crate::model::{NodeId, ObjectId, SessionId, Timestamp, SHARDS_MAX};
use std::hash::BuildHasher;

mod budgets;
mod split;
mod totals;

/// The shards of one directory and the map from objects to them.
pub struct Shards {
    cores: Vec<Directory>,
    /// Keyed by the configuration's hash seed (random per incarnation in service), so no
    /// engine can choose prompts that all land in one shard.
    hasher: foldhash::fast::FixedState,
    /// Where the next `PollTasks` starts asking, so that no shard's tasks wait behind
    /// another's.
    next_poll: usize,
}

impl Shards {
    /// `count` empty shards (1 to [`SHARDS_MAX`]) of a directory configured by `config`.
    pub fn new(config: DirectoryConfig, count: usize) -> Shards {
        let count = count.clamp(1, SHARDS_MAX);
        let seed = config.hash_seed_or_random();
        let cores = (0..count)
            .map(|index| {
                let place = ShardPlace { index, count };
                let mut shard_config = config.clone();
                if count > 1 {
                    // Each shard's index is keyed apart from the router's map.
                    shard_config.hash_seed = Some(seed ^ (index as u64 + 1).wrapping_mul(PHI));
                }
                Directory::new_shard(shard_config, place)
            })
            .collect();
        Shards {
            cores,
            hasher: foldhash::fast::FixedState::with_seed(seed),
            next_poll: 0,
        }
    }

    /// How many shards.
    pub fn count(&self) -> usize {
        self.cores.len()
    }

    /// The shards' cores, by index.
    pub fn cores(&self) -> &[Directory] {
        &self.cores
    }

    /// The shards' cores, for the state every shard keeps alike (declared nodes, shared
    /// pools, peer endpoints, recovery windows): apply the same change to each.
    pub fn cores_mut(&mut self) -> &mut [Directory] {
        &mut self.cores
    }

    /// Declares a configured node and its host pools in every shard (a directory's start,
    /// [`Directory::declare_node`]).
    pub fn declare_node(
        &mut self,
        name: &str,
        host_pools: Vec<crate::model::PoolSpec>,
    ) -> Result<NodeId, DirectoryError> {
        let mut declared = Vec::with_capacity(self.cores.len());
        for core in &mut self.cores {
            declared.push(core.declare_node(name, host_pools.clone())?);
        }
        Ok(declared[0])
    }

    /// Registers a shared pool in every shard ([`Directory::register_pool`] without a
    /// session).
    pub fn register_shared_pool(
        &mut self,
        spec: crate::model::PoolSpec,
    ) -> Result<crate::model::PoolId, DirectoryError> {
        let held = self.cores.iter().any(|core| core.pool_holds_bytes(&spec));
        let mut registered = Vec::with_capacity(self.cores.len());
        for core in &mut self.cores {
            registered.push(core.register_pool_held(None, spec.clone(), held)?);
        }
        Ok(registered[0])
    }

    /// Holds shared pool `pool`'s extents until `until` in every shard
    /// ([`Directory::hold_extents_until`]).
    pub fn hold_extents_until(
        &mut self,
        pool: crate::model::PoolId,
        until: Timestamp,
    ) -> Result<(), DirectoryError> {
        self.cores
            .iter_mut()
            .try_for_each(|core| core.hold_extents_until(pool, until))
    }

    /// Opens every shard's recovery window until `until` ([`Directory::recover_until`]).
    pub fn recover_until(&mut self, until: Timestamp) {
        for core in &mut self.cores {
            core.recover_until(until);
        }
    }

    /// The recovery window of this configuration (alike in every shard).
    pub fn recovery_window(&self) -> std::time::Duration {
        self.cores[0].recovery_window()
    }

    /// The name of the node of `session` (alike in every shard).
    pub fn session_node_name(&self, session: SessionId) -> Option<&str> {
        self.cores[0].session_node_name(session)
    }

    /// Where `object` is READY, from its shard.
    pub fn ready_locations(&self, object: &ObjectId) -> Vec<crate::model::Location> {
        self.cores[self.shard_of(object)].ready_locations(object)
    }

    /// The name of node `node` (alike in every shard).
    pub fn node_name(&self, node: NodeId) -> Option<&str> {
        self.cores[0].node_name(node)
    }

    /// Sets a node's peer endpoint in every shard ([`Directory::set_peer_endpoint`]).
    pub fn set_peer_endpoint(&mut self, name: &str, reachable_at: Option<std::net::SocketAddr>) {
        for core in &mut self.cores {
            core.set_peer_endpoint(name, reachable_at);
        }
    }

    /// Replaces the namespaces' recompute costs in every shard.
    pub fn set_namespace_costs(
        &mut self,
        costs: std::collections::BTreeMap<String, crate::directory::RecomputeCost>,
    ) {
        for core in &mut self.cores {
            core.set_namespace_costs(costs.clone());
        }
    }

    /// Replaces the salt groups' quotas; each shard keeps its share.
    pub fn set_group_quotas(
        &mut self,
        quotas: std::collections::BTreeMap<crate::model::SaltGroup, crate::directory::TierQuota>,
    ) {
        for core in &mut self.cores {
            core.set_group_quotas(quotas.clone());
        }
    }

    /// Starts draining node `name` in every shard ([`Directory::drain`]): its progress
    /// over all of them.
    pub fn drain(&mut self, name: &str) -> Result<DrainProgress, DirectoryError> {
        let mut started = Vec::with_capacity(self.cores.len());
        for core in &mut self.cores {
            started.push(core.drain(name)?);
        }
        let mut started = started.into_iter();
        let first = started.next();
        Ok(started.fold(first.unwrap_or_else(|| unreachable!()), merge_drains))
    }

    /// The shard that owns `object`.
    pub fn shard_of(&self, object: &ObjectId) -> usize {
        match self.cores.len() {
            1 => 0,
            count => (self.hasher.hash_one(object) % count as u64) as usize,
        }
    }

    /// Answers one request as [`handle`] does for one core (same arguments, same replies).
    pub fn handle(
        &mut self,
        now: Timestamp,
        peer: &str,
        role: PeerRole,
        session: Option<SessionId>,
        request: DirectoryRequest,
    ) -> DirectoryReply {
        if self.cores.len() == 1 {
            return handle(&mut self.cores[0], now, peer, role, session, request);
        }
        let reply = match (role, session) {
            (PeerRole::Operator, _) => self.operator(now, peer, request),
            (PeerRole::Node(grant), Some(session)) => {
                self.bound(now, peer, grant, session, request)
            }
            (role, session) => self.everywhere(now, peer, role, session, request),
        };
        self.propagate_all();
        reply
    }

    /// Tells every other shard what shard `from` changed in shared pools' extents, so that
    /// all of them count every committed replica of every extent.
    fn propagate(&mut self, from: usize) {
        let deltas = self.cores[from].take_extent_deltas();
        if deltas.is_empty() {
            return;
        }
        for (index, core) in self.cores.iter_mut().enumerate() {
            if index != from {
                core.apply_extent_deltas(&deltas);
            }
        }
    }

    fn propagate_all(&mut self) {
        for shard in 0..self.cores.len() {
            self.propagate(shard);
        }
    }

    /// Advances every shard to `now`: one report, with the session transitions (alike in
    /// every shard), the counts summed and the drains as the least advanced shard has them.
    /// A drain ends here once every shard may end it.
    pub fn tick(&mut self, now: Timestamp) -> TickReport {
        if self.cores.len() == 1 {
            return self.cores[0].tick(now);
        }
        let mut reports = Vec::with_capacity(self.cores.len());
        for shard in 0..self.cores.len() {
            reports.push(self.cores[shard].tick(now));
            self.propagate(shard);
        }
        self.even_budgets();
        let mut reports = reports.into_iter();
        let mut merged = reports.next().unwrap_or_default();
        let mut changed: Vec<NodeId> = merged.drains.iter().map(|(node, _)| *node).collect();
        for report in reports {
            merged.expired_leases += report.expired_leases;
            merged.expired_reservations += report.expired_reservations;
            merged.evicted += report.evicted;
            merged.expired += report.expired;
            changed.extend(report.drains.iter().map(|(node, _)| *node));
        }
        for node in self.cores[0].active_drains() {
            if self.cores.iter().all(|core| core.drain_may_end(node)) {
                for shard in 0..self.cores.len() {
                    self.cores[shard].end_drain(now, node);
                    self.propagate(shard);
                }
                changed.push(node);
            }
        }
        changed.sort_unstable();
        changed.dedup();
        merged.drains = changed
            .into_iter()
            .filter_map(|node| Some((node, self.drain_progress(node)?)))
            .collect();
        merged
    }

    /// Checks every shard's invariants, and that the state every shard keeps is the same
    /// in all of them (nodes, sessions and their states, epochs, pools): a node fenced by
    /// one shard is fenced by all. Panics on a violation (tests and the simulation).
    pub fn check_invariants(&self) {
        for report in self.usage() {
            assert_eq!(
                report.usage.capacity_bytes, report.spec.capacity_bytes,
                "pool {:?}: the shards' budgets add up to its capacity",
                report.pool
            );
        }
        let first = self.cores[0].replicated_state();
        for (index, core) in self.cores.iter().enumerate() {
            core.check_invariants();
            if index > 0 {
                let state = core.replicated_state();
                assert!(
                    state == first,
                    "shard {index} drifted from shard 0:\n{state:?}\nagainst\n{first:?}"
                );
            }
        }
    }

    /// An operator's request: the cluster's status and drains over every shard.
    fn operator(
        &mut self,
        now: Timestamp,
        peer: &str,
        request: DirectoryRequest,
    ) -> DirectoryReply {
        match request {
            DirectoryRequest::ClusterStatus => DirectoryReply::ClusterStatus(self.cluster_status()),
            DirectoryRequest::Drain { node } => {
                let request = || DirectoryRequest::Drain { node: node.clone() };
                let replies = self.apply_all(now, peer, &PeerRole::Operator, None, request);
                match first_refusal(replies) {
                    Err(refusal) => refusal,
                    Ok(_) => {
                        let id = self.cores[0]
                            .node_statuses()
                            .into_iter()
                            .find(|status| status.name == node)
                            .map(|status| status.node);
                        match id.and_then(|id| self.drain_progress(id)) {
                            Some(progress) => DirectoryReply::Draining(progress),
                            None => refused(DirectoryError::UnknownNode(node)),
                        }
                    }
                }
            }
            request => handle(
                &mut self.cores[0],
                now,
                peer,
                PeerRole::Operator,
                None,
                request,
            ),
        }
    }

    /// A request every shard answers alike (the handshake, a stranger's, one before open):
    /// shard 0's reply, unless another shard refused.
    fn everywhere(
        &mut self,
        now: Timestamp,
        peer: &str,
        role: PeerRole,
        session: Option<SessionId>,
        request: DirectoryRequest,
    ) -> DirectoryReply {
        let replies = self.apply_all(now, peer, &role, session, || request.clone());
        first_refusal(replies).unwrap_or_else(|refusal| refusal)
    }

    /// Applies the request `request` makes to every shard in order.
    fn apply_all(
        &mut self,
        now: Timestamp,
        peer: &str,
        role: &PeerRole,
        session: Option<SessionId>,
        request: impl Fn() -> DirectoryRequest,
    ) -> Vec<DirectoryReply> {
        let mut replies = Vec::with_capacity(self.cores.len());
        for shard in 0..self.cores.len() {
            let core = &mut self.cores[shard];
            replies.push(handle(core, now, peer, role.clone(), session, request()));
            self.propagate(shard);
        }
        replies
    }

    /// One request of a node's bound session.
    fn bound(
        &mut self,
        now: Timestamp,
        peer: &str,
        grant: NodeGrant,
        session: SessionId,
        request: DirectoryRequest,
    ) -> DirectoryReply {
        use DirectoryReply as Reply;
        use DirectoryRequest as Request;
        let routed = match request {
            Request::Reserve { operation, item } => {
                let shard = self.shard_of(&item.object);
                self.cores[shard]
                    .reserve(now, session, operation, item)
                    .map(Reply::Reserved)
            }
            Request::Commit {
                operation,
                replica,
                location,
            } => self
                .core_of(replica)
                .and_then(|core| core.commit(now, session, operation, replica, location))
                .map(Reply::Committed),
            Request::Abort { replica } => self
                .core_of(replica)
                .and_then(|core| core.abort(session, replica))
                .map(Reply::Aborted),
            Request::ReclaimAck { replica } => self
                .core_of(replica)
                .and_then(|core| core.reclaim_ack(session, replica))
                .map(Reply::Reclaimed),
            Request::ReclaimAckMany { replicas } => self
                .split(
                    &replicas,
                    |replica| replica.shard(),
                    |core, part| core.reclaim_ack_many(session, part),
                )
                .map(Reply::ReclaimedMany),
            Request::ReserveMany { items } => self
                .split_by_object(
                    &items,
                    |item| &item.item.object,
                    |core, part| core.reserve_many(now, session, part),
                )
                .map(Reply::ReservedMany),
            Request::CommitMany { items } => self
                .split(
                    &items,
                    |item| item.replica.shard(),
                    |core, part| core.commit_many(now, session, part),
                )
                .map(Reply::CommittedMany),

            Request::Probe { objects } => self
                .split_by_object(
                    &objects,
                    |object| object,
                    |core, part| core.probe_noting_demand(now, session, part),
                )
                .map(Reply::Probed),
            Request::Acquire { objects, mode } => self
                .acquire(now, session, &objects, mode, false)
                .map(|(outcomes, _)| Reply::Acquired(outcomes)),
            Request::AcquireDelegating { objects, mode } => self
                .acquire(now, session, &objects, mode, true)
                .map(|(outcomes, delegations)| Reply::AcquiredDelegating {
                    outcomes,
                    delegations,
                }),
            Request::Release { leases } => self.release(session, &leases).map(Reply::Released),
            Request::ReportHits { hits } => self
                .split(
                    &hits,
                    |hit| hit.delegation.shard(),
                    |core, part| {
                        core.report_local_hits(now, session, part)
                            .map(|()| vec![(); part.len()])
                    },
                )
                .map(|_| Reply::HitsReported),
            Request::Retire {
                object,
                replica,
                released,
            } => self
                .retire(session, object, replica, &released)
                .map(Reply::Retired),
            Request::RetireHeld { holdings } => self
                .split_by_object(
                    &holdings,
                    |holding| &holding.object,
                    |core, part| {
                        core.retire_held(session, part).map(|retired| {
                            let mut counts = vec![0; part.len()];
                            if let Some(first) = counts.first_mut() {
                                *first = retired;
                            }
                            counts
                        })
                    },
                )
                .map(|counts| Reply::RetiredHeld(counts.into_iter().sum())),
            Request::Adopt { holdings } => self.adopt(now, session, &holdings).map(Reply::Adopted),
            Request::Locate { objects } => self.locate(session, &objects).map(Reply::Located),
            Request::Resolve { target, operation } => self
                .resolve(session, target, operation)
                .map(Reply::Resolved),
            Request::RegisterPool(spec) => {
                let held = self.cores.iter().any(|core| core.pool_holds_bytes(&spec));
                let replies: Vec<DirectoryReply> = self
                    .cores
                    .iter_mut()
                    .map(|core| {
                        core.register_pool_held(Some(session), spec.clone(), held)
                            .map_or_else(refused, Reply::Pool)
                    })
                    .collect();
                return first_refusal(replies).unwrap_or_else(|refusal| refusal);
            }
            Request::GrantExtent { operation, .. } | Request::ReturnExtent { operation, .. }
                if !self
                    .cores
                    .iter()
                    .all(|core| core.ledger_has_room(session, operation)) =>
            {
                Err(DirectoryError::Full(crate::directory::Table::Ledger))
            }
            Request::Close if self.holds_anything(session) => {
                let (leases, reservations) = self
                    .cores
                    .iter()
                    .filter_map(|core| core.session_holds(session))
                    .fold((0, 0), |(leases, reservations), (more, also)| {
                        (leases + more, reservations + also)
                    });
                Err(DirectoryError::NotDrained {
                    leases,
                    reservations,
                })
            }
            Request::ClaimExtents { ref claims, .. }
                if self
                    .cores
                    .iter()
                    .any(|core| (core.adopt_budget() as usize) < claims.len()) =>
            {
                // Every shard paces rejoin items of its own objects: a claim, which every
                // shard records, waits until all of them have room.
                Err(DirectoryError::Paced)
            }
            Request::PollTasks { max } | Request::AwaitTasks { max, .. } => {
                self.poll_tasks(now, session, max).map(Reply::Tasks)
            }
            Request::Usage => Ok(Reply::Usage(self.usage())),
            Request::ClusterStatus => Ok(Reply::ClusterStatus(self.cluster_status())),
            request => {
                let role = PeerRole::Node(grant);
                return self.everywhere(now, peer, role, Some(session), request);
            }
        };
        routed.unwrap_or_else(refused)
    }

    /// Whether `session` holds a lease or a reservation in any shard (a close waits).
    fn holds_anything(&self, session: SessionId) -> bool {
        self.cores.iter().any(|core| {
            core.session_holds(session)
                .is_some_and(|(leases, reservations)| leases > 0 || reservations > 0)
        })
    }
}

/// A multiplier that spreads shard indices over the seed's bits (the golden ratio in 64 bits).
const PHI: u64 = 0x9e37_79b9_7f4a_7c15;

fn refused(error: DirectoryError) -> DirectoryReply {
    DirectoryReply::Error(ProtocolError::Directory(error))
}

/// Shard 0's reply of replies from every shard, or the first refusal among them.
fn first_refusal(replies: Vec<DirectoryReply>) -> Result<DirectoryReply, DirectoryReply> {
    let mut replies = replies.into_iter();
    let first = replies
        .next()
        .unwrap_or(DirectoryReply::Error(ProtocolError::Node(
            "a directory of no shard".into(),
        )));
    if matches!(first, DirectoryReply::Error(_)) {
        return Err(first);
    }
    match replies.find(|reply| matches!(reply, DirectoryReply::Error(_))) {
        Some(refusal) => Err(refusal),
        None => Ok(first),
    }
}

/// Two shards' views of one drain: the least advanced state, the counts summed.
fn merge_drains(a: DrainProgress, b: DrainProgress) -> DrainProgress {
    let rank = |state: DrainState| match state {
        DrainState::Interrupted => 0,
        DrainState::Stuck => 1,
        DrainState::Relocating => 2,
        DrainState::AwaitingLeases => 3,
        DrainState::Drained => 4,
    };
    let (state, stuck) = if rank(a.state) <= rank(b.state) {
        (a.state, a.stuck.clone())
    } else {
        (b.state, b.stuck.clone())
    };
    DrainProgress {
        state,
        replicas_left: a.replicas_left + b.replicas_left,
        demotions_in_flight: a.demotions_in_flight + b.demotions_in_flight,
        leases_outstanding: a.leases_outstanding + b.leases_outstanding,
        reservations_outstanding: a.reservations_outstanding + b.reservations_outstanding,
        stuck,
    }
}

#[cfg(test)]
mod tests;
