//! Registration: pools (host pools from their node, shared pools from the directory), which
//! objects each may hold, and the tier profiles nodes measure. Namespaces are in
//! [`super::namespaces`].

use super::pools::PoolRecord;
use super::{
    Directory, DirectoryError, Table, EXTENTS_PER_POOL_MAX, NAME_BYTES_MAX, POOL_CAPACITY_BYTES_MAX,
};
use crate::model::{NodeId, PoolId, PoolSpec, PoolTenancy, Scope, SessionId};
use crate::policy::profiles::{Measurement, TierKind, TierProfile};
use std::net::SocketAddr;

impl Directory {
    /// Whether `object` may be placed in `pool`: a shared pool takes any namespace's, a
    /// CPU partition only its salt group's.
    pub(super) fn pool_admits(&self, pool: PoolId, object: &crate::model::ObjectId) -> bool {
        match self
            .pools
            .get(pool.0 as usize)
            .map(|record| record.spec.tenancy)
        {
            Some(PoolTenancy::Shared) => true,
            Some(PoolTenancy::Partition(group)) => self.group_of(&object.namespace) == Some(group),
            None => false,
        }
    }

    /// Pool `pool`'s description.
    pub fn pool_spec(&self, pool: PoolId) -> Option<&PoolSpec> {
        self.pools.get(pool.0 as usize).map(|record| &record.spec)
    }

    /// Pools registered or declared (their ids are `0..` this).
    pub fn pool_count(&self) -> usize {
        self.pools.len()
    }

    /// Pool `pool`'s budget in this shard and the bytes booked against it (reserved, READY
    /// and retiring).
    pub fn pool_budget(&self, pool: PoolId) -> Option<(u64, u64)> {
        self.pools.get(pool.0 as usize).map(|record| {
            let used = record.reserved_bytes + record.ready_bytes + record.retiring_bytes;
            (record.budget_bytes, used)
        })
    }

    /// Moves `bytes` of pool `pool`'s budget to this shard (`added`) or away from it: a
    /// sharded directory lends room to the shard a rejoining node's replicas belong to, and
    /// evens the shares out again. Never below what the shard has booked: `false` then.
    pub fn move_pool_budget(&mut self, pool: PoolId, bytes: u64, added: bool) -> bool {
        let Some(record) = self.pools.get_mut(pool.0 as usize) else {
            return false;
        };
        if added {
            record.budget_bytes += bytes;
            return true;
        }
        if record.free_bytes() < bytes {
            return false;
        }
        record.budget_bytes -= bytes;
        true
    }

    /// Registers a pool. A host pool must belong to the session's node; a node
    /// re-registering the same pool name after a restart gets the same pool id back.
    /// A shared (domain) pool is registered by the directory itself with `session = None`.
    pub fn register_pool(
        &mut self,
        session: Option<SessionId>,
        spec: PoolSpec,
    ) -> Result<PoolId, DirectoryError> {
        let in_use = self.pool_holds_bytes(&spec);
        self.register_pool_held(session, spec, in_use)
    }

    /// Whether this core counts bytes in the pool `spec` names (reserved, READY or
    /// retiring). A sharded directory asks every shard before a registration
    /// ([`Directory::register_pool_held`]), so that all of them answer it alike.
    pub fn pool_holds_bytes(&self, spec: &PoolSpec) -> bool {
        self.pool_ids
            .get(&(spec.scope, spec.name.clone()))
            .map(|pool| &self.pools[pool.0 as usize])
            .is_some_and(|record| {
                record.reserved_bytes + record.ready_bytes + record.retiring_bytes > 0
            })
    }

    /// [`Directory::register_pool`], where `held` says whether any shard holds bytes in
    /// the pool: a pool in use keeps its record.
    pub fn register_pool_held(
        &mut self,
        session: Option<SessionId>,
        spec: PoolSpec,
        held: bool,
    ) -> Result<PoolId, DirectoryError> {
        check_pool_spec(&spec)?;

        match (session, spec.scope) {
            (Some(session), Scope::Host(node)) => {
                if self.open_session(session)?.node != node {
                    return Err(DirectoryError::InvalidPool(
                        "host pool of another node".into(),
                    ));
                }
            }
            (None, Scope::Domain(_)) => {}
            _ => {
                return Err(DirectoryError::InvalidPool(
                    "host pools come from their node, shared pools from the directory".into(),
                ))
            }
        }
        // A shared pool holds whole extents only: a tail no extent covers is not capacity.
        let mut spec = spec;
        if let Some(extent_bytes) = spec.extent_bytes {
            spec.capacity_bytes -= spec.capacity_bytes % extent_bytes;
        }
        let key = (spec.scope, spec.name.clone());
        if let Some(&pool) = self.pool_ids.get(&key) {
            let record = &mut self.pools[pool.0 as usize];
            if record.owner_session.is_some() || held {
                if record.spec == spec && record.owner_session == session {
                    return Ok(pool);
                }
                return Err(DirectoryError::InvalidPool(
                    "pool already registered and in use".into(),
                ));
            }
            let profile = self.config.baseline_profile(spec.medium);
            let budget = self.shard.share(spec.capacity_bytes);
            *record = PoolRecord::new(spec, session, profile, budget);
            return Ok(pool);
        }
        if self.pools.len() >= self.config.pools_max as usize {
            return Err(DirectoryError::Full(Table::Pools));
        }
        if let Scope::Host(node) = spec.scope {
            // Rare (a node's start-up), and bounded by `pools_max`.
            let registered = self
                .pool_ids
                .keys()
                .filter(|(scope, _)| *scope == Scope::Host(node))
                .count();
            if registered >= self.config.pools_per_node_max as usize {
                return Err(DirectoryError::Full(Table::PoolsOfNode));
            }
        }
        let pool = PoolId(self.pools.len() as u32);
        let profile = self.config.baseline_profile(spec.medium);
        let budget = self.shard.share(spec.capacity_bytes);
        self.pools
            .push(PoolRecord::new(spec, session, profile, budget));
        self.pool_ids.insert(key, pool);
        Ok(pool)
    }

    /// Declares a node of the operator's configuration and its host pools before any
    /// session. A directory declares its nodes in configuration order at every start, so a
    /// restarted directory gives each node and pool the ids the previous incarnation gave
    /// them: a rejoining node keeps its pools' ids, and every location its engines hold
    /// stays true. The pools accept nothing until the node registers them.
    pub fn declare_node(
        &mut self,
        name: &str,
        host_pools: Vec<PoolSpec>,
    ) -> Result<NodeId, DirectoryError> {
        if name.is_empty() || name.len() > NAME_BYTES_MAX {
            return Err(DirectoryError::InvalidPool(
                "node name empty or too long".into(),
            ));
        }
        let node = self.node_named(name)?;
        for spec in host_pools {
            let spec = PoolSpec {
                scope: Scope::Host(node),
                ..spec
            };
            check_pool_spec(&spec)?;
            let key = (spec.scope, spec.name.clone());
            if self.pool_ids.contains_key(&key) {
                continue;
            }
            if self.pools.len() >= self.config.pools_max as usize {
                return Err(DirectoryError::Full(Table::Pools));
            }
            let pool = PoolId(self.pools.len() as u32);
            let profile = self.config.baseline_profile(spec.medium);
            let budget = self.shard.share(spec.capacity_bytes);
            self.pools
                .push(PoolRecord::new(spec, None, profile, budget));
            self.pool_ids.insert(key, pool);
        }
        Ok(node)
    }

    /// Records where node `name` serves its peer endpoint (its `peer_listen`, reached at
    /// its `peer_address`, in `cluster.toml`), or that it serves none (`None`): without
    /// one on either end, no copy over the network is planned (skipped as `no_path`). The
    /// address goes out in [`NodeStatus`](super::NodeStatus), so nodes reach one a reload
    /// added. Unknown names are ignored.
    pub fn set_peer_endpoint(&mut self, name: &str, reachable_at: Option<SocketAddr>) {
        if let Some(node) = self.node_ids.get(name) {
            let record = &mut self.nodes[node.0 as usize];
            record.peer_endpoint = reachable_at.is_some();
            record.peer_address = reachable_at;
        }
    }

    /// Records what `session`'s node measured of `pool`, a pool it maps, and returns the
    /// profile in force. A pool is priced by the most conservative report of the nodes that
    /// map it (the highest latency, the lowest bandwidths; each node's latest report counts
    /// once), then the operator's overrides: one node cannot make a shared pool look faster
    /// than another measured it, only slower, which costs placement, never correctness.
    pub fn report_profile(
        &mut self,
        session: SessionId,
        pool: PoolId,
        measured: Measurement,
    ) -> Result<TierProfile, DirectoryError> {
        let record = self.open_session(session)?;
        let target = self
            .pools
            .get(pool.0 as usize)
            .ok_or(DirectoryError::UnknownPool)?;
        let maps = match target.spec.scope {
            Scope::Host(node) => node == record.node && target.owner_session == Some(session),
            Scope::Domain(domain) => record.domains.contains(&domain),
        };
        if !maps {
            return Err(DirectoryError::InvalidPool(
                "a profile of a pool this node does not map".into(),
            ));
        }
        let node = record.node;
        let medium = target.spec.medium;
        let representative = TierProfile::representative(TierKind::of_medium(medium));
        let reported = measured
            .figures()
            .apply(&representative)
            .map_err(|error| DirectoryError::InvalidProfile(error.to_string()))?;
        let mut profile = target
            .reports
            .iter()
            .filter(|(reporter, _)| **reporter != node)
            .fold(reported.clone(), |slowest, (_, other)| {
                slowest.most_conservative(other)
            });
        if let Some(overrides) = self.config.profiles.get(&medium) {
            profile = overrides
                .apply(&profile)
                .map_err(|error| DirectoryError::InvalidProfile(error.to_string()))?;
        }
        let target = &mut self.pools[pool.0 as usize];
        target.reports.insert(node, reported);
        target.profile = profile.clone();
        Ok(profile)
    }
}

/// Checks what a pool's description must satisfy on its own: capacity, extents (a shared
/// pool has them, a host pool has none), page size and name.
fn check_pool_spec(spec: &PoolSpec) -> Result<(), DirectoryError> {
    if spec.capacity_bytes == 0 || spec.capacity_bytes > POOL_CAPACITY_BYTES_MAX {
        return Err(DirectoryError::InvalidPool(format!(
            "capacity must be 1 to {POOL_CAPACITY_BYTES_MAX} bytes"
        )));
    }
    if matches!(spec.tenancy, PoolTenancy::Partition(_)) && !matches!(spec.scope, Scope::Host(_)) {
        return Err(DirectoryError::InvalidPool(
            "only a node's own pool is a tenant's partition".into(),
        ));
    }
    match (spec.scope, spec.extent_bytes) {
        (Scope::Host(_), None) => {}
        (Scope::Domain(_), Some(extent_bytes))
            if extent_bytes > 0
                && extent_bytes % spec.page_bytes.max(1) == 0
                && spec.capacity_bytes / extent_bytes >= 1
                && spec.capacity_bytes / extent_bytes <= EXTENTS_PER_POOL_MAX => {}
        _ => {
            return Err(DirectoryError::InvalidPool(format!(
                "a shared pool needs extents (a multiple of the page size, at most {EXTENTS_PER_POOL_MAX} per pool); a host pool has none"
            )))
        }
    }
    if !spec.page_bytes.is_power_of_two() || spec.page_bytes > spec.capacity_bytes {
        return Err(DirectoryError::InvalidPool(
            "page size must be a power of two within capacity".into(),
        ));
    }
    if spec.name.is_empty() || spec.name.len() > NAME_BYTES_MAX {
        return Err(DirectoryError::InvalidPool(
            "pool name empty or too long".into(),
        ));
    }
    Ok(())
}
