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
use super::messages::{
    ClusterStatus, DirectoryReply, DirectoryRequest, PoolUsageReport, ProtocolError,
};
use crate::directory::{
    AcquireMode, AcquireOutcome, Directory, DirectoryConfig, DirectoryCounts, DirectoryError,
    DrainProgress, DrainState, NodeRun, ResolveOutcome, ShardPlace, TickReport,
};
use crate::model::{LeaseId, NodeId, ObjectId, ReplicaId, SessionId, Timestamp, SHARDS_MAX};
use crate::policy::profiles::Measurement;
use std::hash::BuildHasher;

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

    /// Evictions under pressure so far, by medium, over every shard.
    pub fn evictions_by_medium(
        &self,
    ) -> [(crate::model::Medium, u64); crate::model::Medium::ALL.len()] {
        let mut totals = self.cores[0].evictions_by_medium();
        for core in &self.cores[1..] {
            for (total, (_, more)) in totals.iter_mut().zip(core.evictions_by_medium()) {
                total.1 += more;
            }
        }
        totals
    }

    /// The latencies of the replications that ended since the last call, in every shard.
    pub fn take_replication_latencies(&mut self) -> Vec<std::time::Duration> {
        self.cores
            .iter_mut()
            .flat_map(Directory::take_replication_latencies)
            .collect()
    }

    /// Replication counts summed over the shards.
    pub fn replication_counts(&self) -> crate::directory::ReplicationCounts {
        let mut counts = self.cores[0].replication_counts();
        for core in &self.cores[1..] {
            let more = core.replication_counts();
            counts.planned += more.planned;
            counts.completed += more.completed;
            counts.cancelled += more.cancelled;
            for (skipped, more) in counts.skipped.iter_mut().zip(more.skipped) {
                *skipped += more;
            }
            counts.completed_bytes += more.completed_bytes;
            counts.in_flight += more.in_flight;
        }
        counts
    }

    /// Delegation recalls by reason, summed over the shards.
    pub fn recalls_by_reason(
        &self,
    ) -> [(crate::directory::RecallReason, u64); crate::directory::RecallReason::ALL.len()] {
        let mut totals = self.cores[0].recalls_by_reason();
        for core in &self.cores[1..] {
            for (total, (_, more)) in totals.iter_mut().zip(core.recalls_by_reason()) {
                total.1 += more;
            }
        }
        totals
    }

    /// Delegations in force, over every shard.
    pub fn delegations_live(&self) -> u64 {
        self.cores.iter().map(Directory::delegations_live).sum()
    }

    /// Delegations offered so far, over every shard.
    pub fn delegations_offered(&self) -> u64 {
        self.cores.iter().map(Directory::delegations_offered).sum()
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
        let mut reports = Vec::with_capacity(self.cores.len());
        for shard in 0..self.cores.len() {
            reports.push(self.cores[shard].tick(now));
            self.propagate(shard);
        }
        if self.cores.len() > 1 {
            self.even_budgets();
        }
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
        let draining: Vec<NodeId> = self.cores[0]
            .node_statuses()
            .into_iter()
            .filter(|status| {
                status
                    .drain
                    .as_ref()
                    .is_some_and(|drain| drain.state.is_active())
            })
            .map(|status| status.node)
            .collect();
        for node in draining {
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

    /// Node `node`'s drain over all shards: the least advanced shard's state, the counts
    /// summed.
    pub fn drain_progress(&self, node: NodeId) -> Option<DrainProgress> {
        let mut shards = self.cores.iter().map(|core| core.drain_progress(node));
        let mut merged = shards.next()??;
        for progress in shards.flatten() {
            merged = merge_drains(merged, progress);
        }
        Some(merged)
    }

    /// Counts summed over the shards; sessions as every shard has them.
    pub fn counts(&self) -> DirectoryCounts {
        let mut counts = self.cores[0].counts();
        for core in &self.cores[1..] {
            let more = core.counts();
            counts.objects += more.objects;
            counts.replicas += more.replicas;
            counts.leases += more.leases;
        }
        counts
    }

    /// Every pool with its usage summed over the shards (each holds its share).
    pub fn usage(&self) -> Vec<PoolUsageReport> {
        let mut reports: Vec<PoolUsageReport> = self.cores[0]
            .usage()
            .into_iter()
            .map(|report| PoolUsageReport {
                pool: report.pool,
                spec: report.spec,
                usage: report.usage,
                profile: Measurement::of(&report.profile),
            })
            .collect();
        for core in &self.cores[1..] {
            for report in core.usage() {
                if let Some(merged) = reports.iter_mut().find(|merged| merged.pool == report.pool) {
                    merged.usage.add(&report.usage);
                }
            }
        }
        reports
    }

    /// Every node and pool, as `kvtier ctl status` shows them.
    pub fn cluster_status(&self) -> ClusterStatus {
        let mut nodes = self.cores[0].node_statuses();
        for status in &mut nodes {
            status.drain = self.drain_progress(status.node);
        }
        ClusterStatus {
            nodes,
            pools: self.usage(),
        }
    }

    /// Tasks queued so far in all shards: a change means some node may have one to fetch.
    pub fn tasks_queued(&self) -> u64 {
        self.cores
            .iter()
            .map(Directory::tasks_queued)
            .fold(0, u64::wrapping_add)
    }

    /// Whether any shard has a task for `session`.
    pub fn has_tasks(&self, now: Timestamp, session: SessionId) -> bool {
        self.cores.iter().any(|core| core.has_tasks(now, session))
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

    /// Adopts a rejoining node's holdings one by one in order, each in its object's shard,
    /// as one core would: paced as a whole when a shard has no budget left for its part,
    /// and each holding given the room its pool has over all shards (a shard lends its
    /// free budget: the bytes exist, and the pool may have room though one share has not).
    fn adopt(
        &mut self,
        now: Timestamp,
        session: SessionId,
        holdings: &[crate::directory::Holding],
    ) -> Result<Vec<crate::directory::AdoptOutcome>, DirectoryError> {
        let mut items = vec![0u32; self.cores.len()];
        for holding in holdings {
            items[self.shard_of(&holding.object)] += 1;
        }
        if self
            .cores
            .iter()
            .zip(&items)
            .any(|(core, items)| core.adopt_budget() < *items)
        {
            return Err(DirectoryError::Paced);
        }
        let mut outcomes = Vec::with_capacity(holdings.len());
        for holding in holdings {
            let shard = self.shard_of(&holding.object);
            self.lend_budget(shard, holding);
            let adopted = self.cores[shard].adopt(now, session, std::slice::from_ref(holding));
            self.propagate(shard);
            outcomes.extend(adopted?);
        }
        Ok(outcomes)
    }

    /// Moves free budget of `holding`'s pool from the other shards to `shard` until the
    /// holding fits there, as far as they have any.
    fn lend_budget(&mut self, shard: usize, holding: &crate::directory::Holding) {
        let pool = holding.location.pool;
        let Some(bytes) = self.cores[shard]
            .pool_spec(pool)
            .map(|spec| spec.rounded_bytes(holding.location.length_bytes))
        else {
            return;
        };
        let Some((budget, used)) = self.cores[shard].pool_budget(pool) else {
            return;
        };
        let mut missing = bytes.saturating_sub(budget.saturating_sub(used));
        for lender in (0..self.cores.len()).filter(|lender| *lender != shard) {
            if missing == 0 {
                break;
            }
            let free = self.cores[lender]
                .pool_budget(pool)
                .map_or(0, |(budget, used)| budget.saturating_sub(used));
            let lent = free.min(missing);
            if lent > 0 && self.cores[lender].move_pool_budget(pool, lent, false) {
                self.cores[shard].move_pool_budget(pool, lent, true);
                missing -= lent;
            }
        }
    }

    /// Moves free budget back toward equal shares, pool by pool: from each shard above its
    /// share (as far as its free budget allows) to the shards below theirs. Runs each tick.
    fn even_budgets(&mut self) {
        let count = self.cores.len();
        let pools = self.cores[0].pool_count();
        for pool in (0..pools).map(|index| crate::model::PoolId(index as u32)) {
            let Some(capacity) = self.cores[0]
                .pool_spec(pool)
                .map(|spec| spec.capacity_bytes)
            else {
                continue;
            };
            let share = |index: usize| ShardPlace { index, count }.share(capacity);
            for taker in 0..count {
                let Some((budget, _)) = self.cores[taker].pool_budget(pool) else {
                    continue;
                };
                let mut short = share(taker).saturating_sub(budget);
                for giver in 0..count {
                    if short == 0 {
                        break;
                    }
                    let Some((budget, used)) = self.cores[giver].pool_budget(pool) else {
                        continue;
                    };
                    let surplus = budget
                        .saturating_sub(share(giver))
                        .min(budget.saturating_sub(used));
                    let moved = surplus.min(short);
                    if moved > 0 && self.cores[giver].move_pool_budget(pool, moved, false) {
                        self.cores[taker].move_pool_budget(pool, moved, true);
                        short -= moved;
                    }
                }
            }
        }
    }

    /// The core of the shard that issued `replica`; an id naming no shard of this
    /// directory is unknown.
    fn core_of(&mut self, replica: ReplicaId) -> Result<&mut Directory, DirectoryError> {
        self.cores
            .get_mut(replica.shard())
            .ok_or(DirectoryError::UnknownReplica(replica))
    }

    /// Splits `items` by shard (`shard_of` each), answers each shard's part with `answer`,
    /// and puts the answers back in the items' order. A shard's refusal of its whole part
    /// refuses the request.
    fn split<T: Clone, R>(
        &mut self,
        items: &[T],
        shard_of: impl Fn(&T) -> usize,
        mut answer: impl FnMut(&mut Directory, &[T]) -> Result<Vec<R>, DirectoryError>,
    ) -> Result<Vec<R>, DirectoryError> {
        let count = self.cores.len();
        let mut parts: Vec<Vec<T>> = vec![Vec::new(); count];
        let mut positions: Vec<Vec<usize>> = vec![Vec::new(); count];
        for (position, item) in items.iter().enumerate() {
            let shard = shard_of(item);
            let shard = if shard < count {
                shard
            } else {
                // An id no shard issued: shard 0 answers it as unknown.
                0
            };
            parts[shard].push(item.clone());
            positions[shard].push(position);
        }
        let mut answers: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
        for (shard, part) in parts.iter().enumerate() {
            if part.is_empty() {
                continue;
            }
            let answered = answer(&mut self.cores[shard], part);
            self.propagate(shard);
            let answered = answered?;
            if answered.len() != part.len() {
                return Err(DirectoryError::ShardAnswer {
                    shard,
                    answered: answered.len(),
                    asked: part.len(),
                });
            }
            for (position, answer) in positions[shard].iter().zip(answered) {
                answers[*position] = Some(answer);
            }
        }
        // Every position is in exactly one part, and every part was answered in full.
        Ok(answers.into_iter().flatten().collect())
    }

    /// [`Shards::split`] by the shard of each item's object.
    fn split_by_object<T: Clone, R>(
        &mut self,
        items: &[T],
        object_of: impl Fn(&T) -> &ObjectId,
        answer: impl FnMut(&mut Directory, &[T]) -> Result<Vec<R>, DirectoryError>,
    ) -> Result<Vec<R>, DirectoryError> {
        let shards: Vec<usize> = items
            .iter()
            .map(|item| self.shard_of(object_of(item)))
            .collect();
        let indexed: Vec<(usize, T)> = items.iter().cloned().enumerate().collect();
        let mut answer = answer;
        self.split(
            &indexed,
            |(position, _)| shards[*position],
            |core, part| {
                let part: Vec<T> = part.iter().map(|(_, item)| item.clone()).collect();
                answer(core, &part)
            },
        )
    }

    /// Leases `objects` from their shards. In `Manifest` mode all or none: when a shard
    /// could not lease all of its part, the leases the others took are released and
    /// reported `Withheld`. Delegations (`delegating`) are asked once the leases stand.
    fn acquire(
        &mut self,
        now: Timestamp,
        session: SessionId,
        objects: &[ObjectId],
        mode: AcquireMode,
        delegating: bool,
    ) -> Result<AcquireAnswer, DirectoryError> {
        // A shard that refuses its part refuses the request: the leases the others took
        // are released first, so that none is left that the node does not know of.
        let mut refusal = None;
        let mut outcomes = self.split_by_object(
            objects,
            |object| object,
            |core, part| {
                Ok(core
                    .acquire(now, session, part, mode)
                    .unwrap_or_else(|error| {
                        refusal.get_or_insert(error);
                        vec![AcquireOutcome::Miss; part.len()]
                    }))
            },
        )?;
        let leased = |outcome: &AcquireOutcome| matches!(outcome, AcquireOutcome::Leased(_));
        if refusal.is_some() || (mode == AcquireMode::Manifest && !outcomes.iter().all(leased)) {
            let leases: Vec<LeaseId> = outcomes
                .iter()
                .filter_map(|outcome| match outcome {
                    AcquireOutcome::Leased(lease) => Some(lease.lease),
                    _ => None,
                })
                .collect();
            self.release(session, &leases)?;
            if let Some(refusal) = refusal {
                return Err(refusal);
            }
            for outcome in &mut outcomes {
                if leased(outcome) {
                    *outcome = AcquireOutcome::Withheld;
                }
            }
        }
        let delegations = if delegating {
            let replicas: Vec<(usize, Option<ReplicaId>)> = outcomes
                .iter()
                .map(|outcome| match outcome {
                    AcquireOutcome::Leased(lease) => (lease.replica.shard(), Some(lease.replica)),
                    _ => (0, None),
                })
                .collect();
            self.split(
                &replicas,
                |(shard, _)| *shard,
                |core, part| {
                    let leased: Vec<_> = part.iter().map(|(_, replica)| *replica).collect();
                    Ok(core.delegate(now, session, &leased))
                },
            )?
        } else {
            Vec::new()
        };
        Ok((outcomes, delegations))
    }

    /// Releases `leases` in the shards that granted them, answers in order.
    fn release(
        &mut self,
        session: SessionId,
        leases: &[LeaseId],
    ) -> Result<Vec<crate::directory::ReleaseOutcome>, DirectoryError> {
        self.split(
            leases,
            |lease| lease.shard(),
            |core, part| core.release(session, part),
        )
    }

    /// Releases `released` where each was granted, then retires `replica` in its shard.
    fn retire(
        &mut self,
        session: SessionId,
        object: ObjectId,
        replica: ReplicaId,
        released: &[LeaseId],
    ) -> Result<crate::directory::RetireOutcome, DirectoryError> {
        self.release(session, released)?;
        let shard = self.shard_of(&object);
        if replica.shard() != shard {
            return Err(DirectoryError::UnknownReplica(replica));
        }
        self.cores[shard].retire_object(session, &object, replica)
    }

    /// Each node's run over `objects`, each chunk probed in its own shard.
    fn locate(
        &self,
        session: SessionId,
        objects: &[ObjectId],
    ) -> Result<Vec<NodeRun>, DirectoryError> {
        self.cores[0].locate_in(session, objects, |object| {
            &self.cores[self.shard_of(object)]
        })
    }

    /// What became of an operation whose reply the node lost: the shard that applied it
    /// says; every other burns the id, so a late arrival is refused there too.
    fn resolve(
        &mut self,
        session: SessionId,
        target: SessionId,
        operation: crate::model::OperationId,
    ) -> Result<ResolveOutcome, DirectoryError> {
        let mut answer = ResolveOutcome::Unknown;
        for core in &mut self.cores {
            match core.resolve(session, target, operation)? {
                ResolveOutcome::Unknown => {}
                ResolveOutcome::NotApplied => {
                    if answer == ResolveOutcome::Unknown {
                        answer = ResolveOutcome::NotApplied;
                    }
                }
                applied => answer = applied,
            }
        }
        Ok(answer)
    }

    /// Up to `max` tasks for `session`, from every shard in turn (a different one first
    /// each time).
    fn poll_tasks(
        &mut self,
        now: Timestamp,
        session: SessionId,
        max: u32,
    ) -> Result<Vec<crate::directory::Task>, DirectoryError> {
        let count = self.cores.len();
        let first = self.next_poll % count;
        self.next_poll = (first + 1) % count;
        let mut tasks = Vec::new();
        for offset in 0..count {
            let room = max.saturating_sub(tasks.len() as u32);
            let core = &mut self.cores[(first + offset) % count];
            if room == 0 {
                // Still asked, with no room: the session's state is checked in each.
                core.poll_tasks(now, session, 0)?;
                continue;
            }
            tasks.extend(core.poll_tasks(now, session, room)?);
        }
        Ok(tasks)
    }
}

/// An acquire's outcomes, and its delegations when it asked for them.
type AcquireAnswer = (
    Vec<AcquireOutcome>,
    Vec<Option<crate::directory::Delegation>>,
);

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
mod tests {
    use super::*;
    use crate::directory::{CommitOutcome, NamespaceAccess, ReserveItem, ReserveOutcome};
    use crate::model::{
        AllocationId, DomainId, Generation, KvDtype, Location, Medium, NamespaceDescriptor,
        OperationId, PoolId, PoolSpec, PoolTenancy, PrefixDigest, Scope,
    };
    const MIB: u64 = 1 << 20;

    /// Two nodes (`a`, `b`) on `count` shards, each with a CPU pool of `cpu_bytes`, both
    /// mapping one shared pool of `cxl_bytes` in extents of 1 MiB.
    struct Cluster {
        shards: Shards,
        now: Timestamp,
        sessions: Vec<SessionId>,
        cpu: Vec<PoolId>,
        cxl: PoolId,
        namespace: crate::model::NamespaceId,
        operation: u64,
    }

    fn descriptor() -> NamespaceDescriptor {
        NamespaceDescriptor {
            model: "llama".into(),
            revision: "r1".into(),
            adapter: None,
            kv_dtype: KvDtype::BFloat16,
            quantization: None,
            layers: 2,
            kv_heads: 2,
            head_dim: 64,
            block_tokens: 16,
            format_version: 1,
            chunk_tokens: 256,
            tensor_parallel: 1,
            pipeline_parallel: 1,
            salt: None,
        }
    }

    fn grant() -> PeerRole {
        PeerRole::Node(NodeGrant {
            domains: vec![DomainId(0)],
            namespaces: NamespaceAccess::Any,
        })
    }

    impl Cluster {
        fn new(count: usize, cpu_bytes: u64, cxl_bytes: u64) -> Cluster {
            let config = DirectoryConfig {
                hash_seed: Some(7),
                ..DirectoryConfig::default()
            };
            let mut shards = Shards::new(config, count);
            let cxl = shards
                .register_shared_pool(PoolSpec {
                    name: "cxl0".into(),
                    medium: Medium::Cxl,
                    scope: Scope::Domain(DomainId(0)),
                    capacity_bytes: cxl_bytes,
                    page_bytes: 4096,
                    extent_bytes: Some(MIB),
                    tenancy: PoolTenancy::Shared,
                })
                .unwrap();
            let mut cluster = Cluster {
                shards,
                now: Timestamp::ZERO,
                sessions: Vec::new(),
                cpu: Vec::new(),
                cxl,
                namespace: descriptor().id().unwrap(),
                operation: 1,
            };
            for name in ["a", "b"] {
                let reply = cluster.shards.handle(
                    cluster.now,
                    name,
                    grant(),
                    None,
                    DirectoryRequest::Open {
                        write_order: vec![Medium::Cpu, Medium::Cxl],
                        read_order: vec![Medium::Cpu, Medium::Cxl],
                    },
                );
                let DirectoryReply::Opened(opened) = reply else {
                    panic!("open refused: {reply:?}");
                };
                cluster.sessions.push(opened.session);
                let node = cluster.sessions.len() - 1;
                let spec = PoolSpec {
                    name: "cpu".into(),
                    medium: Medium::Cpu,
                    scope: Scope::Host(opened.node),
                    capacity_bytes: cpu_bytes,
                    page_bytes: 4096,
                    extent_bytes: None,
                    tenancy: PoolTenancy::Shared,
                };
                match cluster.call(node, DirectoryRequest::RegisterPool(spec)) {
                    DirectoryReply::Pool(pool) => cluster.cpu.push(pool),
                    other => panic!("pool refused: {other:?}"),
                }
                let registered =
                    cluster.call(node, DirectoryRequest::RegisterNamespace(descriptor()));
                assert!(
                    matches!(registered, DirectoryReply::Namespace(_)),
                    "{registered:?}"
                );
            }
            cluster.shards.check_invariants();
            cluster
        }

        fn call(&mut self, node: usize, request: DirectoryRequest) -> DirectoryReply {
            let name = ["a", "b"][node];
            let reply =
                self.shards
                    .handle(self.now, name, grant(), Some(self.sessions[node]), request);
            self.shards.check_invariants();
            reply
        }

        fn object(&self, index: u32) -> ObjectId {
            ObjectId {
                namespace: self.namespace,
                prefix: PrefixDigest::ROOT.chain(&[index]),
                shard: 0,
                part: 0,
            }
        }

        /// Objects `0..` until each shard owns at least `per_shard` of them.
        fn objects_on_every_shard(&self, per_shard: usize) -> Vec<ObjectId> {
            let mut counts = vec![0; self.shards.count()];
            let mut objects = Vec::new();
            for index in 0.. {
                if counts.iter().all(|count| *count >= per_shard) {
                    break;
                }
                let object = self.object(index);
                let shard = self.shards.shard_of(&object);
                if counts[shard] < per_shard {
                    counts[shard] += 1;
                    objects.push(object);
                }
            }
            objects
        }

        /// Reserves and commits `objects` from `node` as one batch each, at consecutive
        /// offsets of the granted pools (a shared pool's in an extent granted first).
        fn store(&mut self, node: usize, objects: &[ObjectId]) -> Vec<ReplicaId> {
            let items = objects
                .iter()
                .map(|object| crate::directory::ReserveBatchItem {
                    operation: self.next_operation(),
                    item: ReserveItem {
                        object: *object,
                        length_bytes: 64 << 10,
                    },
                })
                .collect();
            let DirectoryReply::ReservedMany(reserved) =
                self.call(node, DirectoryRequest::ReserveMany { items })
            else {
                panic!("reserve refused");
            };
            let mut extent = None;
            let mut commits = Vec::new();
            for (index, outcome) in reserved.into_iter().enumerate() {
                let Ok(ReserveOutcome::Granted { replica, pool, .. }) = outcome else {
                    panic!("not granted: {outcome:?}");
                };
                let base = if pool == self.cxl {
                    *extent.get_or_insert_with(|| self.grant_extent(node))
                } else {
                    0
                };
                commits.push(crate::directory::CommitBatchItem {
                    operation: self.next_operation(),
                    replica,
                    location: Location {
                        pool,
                        allocation: AllocationId(index as u64),
                        generation: Generation(1),
                        offset_bytes: base + index as u64 * (64 << 10),
                        length_bytes: 64 << 10,
                    },
                });
            }
            let replicas = commits.iter().map(|item| item.replica).collect();
            let DirectoryReply::CommittedMany(committed) =
                self.call(node, DirectoryRequest::CommitMany { items: commits })
            else {
                panic!("commit refused");
            };
            assert!(committed
                .iter()
                .all(|outcome| *outcome == Ok(CommitOutcome::Committed)));
            replicas
        }

        fn grant_extent(&mut self, node: usize) -> u64 {
            let operation = self.next_operation();
            let pool = self.cxl;
            match self.call(node, DirectoryRequest::GrantExtent { operation, pool }) {
                DirectoryReply::Extent(crate::directory::ExtentGrant::Granted(extent)) => {
                    extent.offset_bytes
                }
                other => panic!("no extent: {other:?}"),
            }
        }

        fn next_operation(&mut self) -> OperationId {
            self.operation += 1;
            OperationId(self.operation)
        }
    }

    #[test]
    fn each_object_lives_in_its_shard_and_batches_answer_in_order() {
        let mut cluster = Cluster::new(3, 64 * MIB, 8 * MIB);
        let objects = cluster.objects_on_every_shard(4);
        let replicas = cluster.store(0, &objects);
        for (object, replica) in objects.iter().zip(&replicas) {
            let shard = cluster.shards.shard_of(object);
            assert_eq!(replica.shard(), shard, "a replica id names its shard");
            for (index, core) in cluster.shards.cores().iter().enumerate() {
                assert_eq!(
                    !core.ready_locations(object).is_empty(),
                    index == shard,
                    "{object:?} is READY in its shard only"
                );
            }
        }
        let probed = cluster.call(
            1,
            DirectoryRequest::Probe {
                objects: objects.clone(),
            },
        );
        let DirectoryReply::Probed(outcomes) = probed else {
            panic!("{probed:?}");
        };
        assert_eq!(outcomes.len(), objects.len());
        // The writer reads them: its own CPU pool, which the other node cannot map.
        let acquired = cluster.call(
            0,
            DirectoryRequest::Acquire {
                objects: objects.clone(),
                mode: AcquireMode::Each,
            },
        );
        let DirectoryReply::Acquired(outcomes) = acquired else {
            panic!("{acquired:?}");
        };
        let leases: Vec<LeaseId> = outcomes
            .iter()
            .zip(&replicas)
            .map(|(outcome, replica)| match outcome {
                AcquireOutcome::Leased(lease) => {
                    assert_eq!(lease.replica, *replica, "answers in the request's order");
                    assert_eq!(lease.lease.shard(), replica.shard());
                    lease.lease
                }
                other => panic!("a miss: {other:?}"),
            })
            .collect();
        assert_eq!(cluster.shards.counts().leases, leases.len() as u64);
        let released = cluster.call(0, DirectoryRequest::Release { leases });
        assert!(
            matches!(released, DirectoryReply::Released(_)),
            "{released:?}"
        );
        assert_eq!(cluster.shards.counts().leases, 0);
    }

    #[test]
    fn each_shard_reserves_against_its_share_and_usage_adds_up() {
        let mut cluster = Cluster::new(2, 10 * MIB + 1, 8 * MIB);
        let usage = cluster.shards.usage();
        let cpu = usage
            .iter()
            .find(|report| report.pool == cluster.cpu[0])
            .unwrap();
        assert_eq!(cpu.usage.capacity_bytes, 10 * MIB + 1);
        let budgets: Vec<u64> = cluster
            .shards
            .cores()
            .iter()
            .map(|core| {
                core.usage()
                    .into_iter()
                    .find(|report| report.pool == cluster.cpu[0])
                    .unwrap()
                    .usage
                    .capacity_bytes
            })
            .collect();
        assert_eq!(budgets, vec![5 * MIB + 1, 5 * MIB]);
        let objects = cluster.objects_on_every_shard(2);
        cluster.store(0, &objects);
        let usage = cluster.shards.usage();
        let cpu = usage
            .iter()
            .find(|report| report.pool == cluster.cpu[0])
            .unwrap();
        assert_eq!(cpu.usage.allocated_bytes, objects.len() as u64 * (64 << 10));
    }

    #[test]
    fn a_manifest_one_shard_cannot_lease_whole_leaves_no_lease_anywhere() {
        let mut cluster = Cluster::new(2, 64 * MIB, 8 * MIB);
        let objects = cluster.objects_on_every_shard(2);
        cluster.store(0, &objects[..objects.len() - 1]);
        let acquired = cluster.call(
            0,
            DirectoryRequest::Acquire {
                objects: objects.clone(),
                mode: AcquireMode::Manifest,
            },
        );
        let DirectoryReply::Acquired(outcomes) = acquired else {
            panic!("{acquired:?}");
        };
        assert!(outcomes
            .iter()
            .all(|outcome| !matches!(outcome, AcquireOutcome::Leased(_))));
        assert_eq!(cluster.shards.counts().leases, 0, "no lease is left behind");
    }

    /// A node's extent holds replicas of objects of both shards: every shard refuses its
    /// return while any of them, in either shard, is left, and all take it back after the
    /// last reclaim (`check_invariants` compares the shards' extents after every call).
    #[test]
    fn an_extent_returns_only_once_its_last_replica_of_any_shard_is_reclaimed() {
        // CPU pools hold one object each: the rest goes to the shared pool.
        let mut cluster = Cluster::new(2, 0x10000, 4 * MIB);
        let objects = cluster.objects_on_every_shard(3);
        let replicas = cluster.store(0, &objects);
        let mut in_cxl: Vec<(ObjectId, ReplicaId, Location)> = Vec::new();
        for (object, replica) in objects.iter().zip(replicas) {
            let shard = cluster.shards.shard_of(object);
            if let Some(location) = cluster.shards.cores()[shard]
                .ready_locations(object)
                .into_iter()
                .find(|location| location.pool == cluster.cxl)
            {
                in_cxl.push((*object, replica, location));
            }
        }
        let shards: std::collections::BTreeSet<usize> = in_cxl
            .iter()
            .map(|(_, replica, _)| replica.shard())
            .collect();
        assert_eq!(shards.len(), 2, "both shards hold replicas in the extent");
        let extent = in_cxl[0].2.offset_bytes / MIB * MIB;
        // The last to go is of the other shard than the first ones.
        let first_shard = in_cxl[0].1.shard();
        in_cxl.sort_by_key(|(_, replica, _)| replica.shard() != first_shard);
        let give_back = |cluster: &mut Cluster| {
            let operation = cluster.next_operation();
            let request = DirectoryRequest::ReturnExtent {
                operation,
                pool: cluster.cxl,
                offset_bytes: extent,
                owner_word: None,
            };
            match cluster.call(0, request) {
                DirectoryReply::ExtentReturned(answer) => answer,
                other => panic!("{other:?}"),
            }
        };
        for (object, replica, _) in &in_cxl {
            let retired = cluster.call(
                0,
                DirectoryRequest::Retire {
                    object: *object,
                    replica: *replica,
                    released: Vec::new(),
                },
            );
            assert!(matches!(retired, DirectoryReply::Retired(_)), "{retired:?}");
        }
        let DirectoryReply::Tasks(tasks) = cluster.call(0, DirectoryRequest::PollTasks { max: 64 })
        else {
            panic!("no tasks");
        };
        let reclaims: Vec<ReplicaId> = in_cxl
            .iter()
            .map(|(_, replica, _)| {
                assert!(tasks.iter().any(|task| matches!(
                    task.kind,
                    crate::directory::TaskKind::Reclaim { replica: reclaimed, .. }
                        if reclaimed == *replica
                )));
                *replica
            })
            .collect();
        for (acked, replica) in reclaims.iter().enumerate() {
            assert_eq!(
                give_back(&mut cluster),
                crate::directory::ExtentReturn::InUse,
                "returned with {} replicas left",
                reclaims.len() - acked
            );
            let acknowledged = cluster.call(0, DirectoryRequest::ReclaimAck { replica: *replica });
            assert!(
                matches!(acknowledged, DirectoryReply::Reclaimed(_)),
                "{acknowledged:?}"
            );
        }
        assert_eq!(
            give_back(&mut cluster),
            crate::directory::ExtentReturn::Returned
        );
    }
}
