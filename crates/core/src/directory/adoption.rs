//! Rejoin: a node that lost its session — the directory restarted, or fenced it — opens a
//! new one and reports what it still holds, so the cache survives. It first claims the
//! extents of shared pools it still allocates in, then reports its READY replicas in
//! bounded batches; the directory adopts each one it can prove is the node's.
//!
//! The recovery rule: for `recovery_window` after the directory started (the longest
//! lease, grant or fence window the previous incarnation could have left open), a
//! directory that adopted anything hands out no reclaim task, so no page an engine may
//! still read under a lease of the previous incarnation is freed and reused; and it grants
//! no extent of a shared pool that held data, so only the nodes that held those extents
//! can claim them. Rejoin reports are paced by `adopt_items_per_tick` over all nodes.

use super::replicas::NewReplica;
use super::sessions::Session;
use super::{Directory, DirectoryError, ExtentClaim, ReplicaState, Table};
use crate::model::{Location, NodeId, ObjectId, PoolId, Scope, SessionId, Timestamp};
use serde::{Deserialize, Serialize};

/// A READY replica a rejoining node still holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holding {
    pub object: ObjectId,
    pub location: Location,
}

/// What became of one reported holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdoptOutcome {
    /// READY again, readable as before.
    Adopted,
    /// The directory already has this replica (a fence without a restart).
    Known,
    /// Not the node's to report (a pool or extent it does not hold, a location outside its
    /// pool, an object of the same scope already READY elsewhere): the node frees it.
    Refused,
}

impl Directory {
    /// Sets the end of this incarnation's recovery window (see the module documentation);
    /// called once at start with the start time plus [`Directory::recovery_window`].
    pub fn recover_until(&mut self, until: Timestamp) {
        self.recovery.until = until;
    }

    /// Whether reclaim tasks are held back now: something was adopted and the recovery
    /// window is still open.
    pub(super) fn holding_reclaims(&self, now: Timestamp) -> bool {
        self.recovery.adopted && now < self.recovery.until
    }

    /// Whether reclaim tasks of `node` are held back now: the recovery holds them all, and
    /// a node that adopted memory replicas again after a session of it was fenced holds its
    /// own until that session's leases ended (`NodeRecord::reclaims_held_until`).
    pub(super) fn holding_reclaims_of(&self, now: Timestamp, node: NodeId) -> bool {
        self.holding_reclaims(now)
            || self
                .nodes
                .get(node.0 as usize)
                .is_some_and(|record| now < record.reclaims_held_until)
    }

    /// Takes `items` from this tick's rejoin budget, or refuses with `Paced`.
    fn take_adopt_budget(&mut self, items: usize) -> Result<(), DirectoryError> {
        self.check_batch(items)?;
        let items = items as u32;
        if items > self.recovery.budget {
            return Err(DirectoryError::Paced);
        }
        self.recovery.budget -= items;
        Ok(())
    }

    /// Rejoin items this core takes before the next tick. A sharded directory claims
    /// extents (every shard's state) only when every shard has room for the claim.
    pub fn adopt_budget(&self) -> u32 {
        self.recovery.budget
    }

    /// Refills the rejoin budget (each tick).
    pub(super) fn refill_adopt_budget(&mut self) {
        self.recovery.budget = self.config.adopt_items_per_tick;
    }

    /// Claims extents of shared pool `pool` the session's node still allocates in: each
    /// answer says whether it is the session's now. An extent is claimable when it was
    /// held for recovery and nobody claimed it yet, or when an ended session of the same
    /// node holds it; never when another node's session holds it or it was given back.
    pub fn claim_extents(
        &mut self,
        session_id: SessionId,
        pool: PoolId,
        claims: &[ExtentClaim],
    ) -> Result<Vec<bool>, DirectoryError> {
        self.take_adopt_budget(claims.len())?;
        let session = self.open_session(session_id)?;
        let node = session.node;
        let record = self
            .pools
            .get(pool.0 as usize)
            .ok_or(DirectoryError::UnknownPool)?;
        match record.spec.scope {
            Scope::Domain(domain) if session.domains.contains(&domain) => {}
            _ => {
                return Err(DirectoryError::InvalidPool(
                    "extents of a shared pool this node does not map".into(),
                ))
            }
        }
        let held = self.extents_held(session_id);
        let room = self.config.extents_per_session_max.saturating_sub(held) as usize;
        if claims.len() > room {
            return Err(DirectoryError::Full(Table::Extents));
        }
        let sessions = &self.sessions;
        let same_node_ended = |owner: SessionId| {
            sessions
                .get(&owner)
                .is_some_and(|record| record.node == node && !record.is_open())
        };
        let Some(extents) = self.pools[pool.0 as usize].extents.as_mut() else {
            return Err(DirectoryError::InvalidPool(
                "shared pool without extents".into(),
            ));
        };
        Ok(claims
            .iter()
            .map(|claim| extents.claim(session_id, claim, same_node_ended))
            .collect())
    }

    /// Extents of every shared pool held by `session`.
    pub(super) fn extents_held(&self, session: SessionId) -> u32 {
        self.pools
            .iter()
            .filter_map(|record| record.extents.as_ref())
            .map(|extents| extents.held_by(session))
            .sum()
    }

    /// Adopts READY replicas a rejoining node reports (after claiming their extents): each
    /// becomes READY again where the node's pool or extent holds it, as if just committed.
    pub fn adopt(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        holdings: &[Holding],
    ) -> Result<Vec<AdoptOutcome>, DirectoryError> {
        self.take_adopt_budget(holdings.len())?;
        let node = self.open_session(session_id)?.node;
        let mut outcomes = Vec::with_capacity(holdings.len());
        for holding in holdings {
            let outcome = self.adopt_one(now, session_id, holding)?;
            // A staged (SSD) replica is never leased, so no engine reads it under a lease of
            // an earlier incarnation: adopting it holds no reclaim back.
            let leasable = self
                .pools
                .get(holding.location.pool.0 as usize)
                .is_some_and(|record| record.spec.medium.tier() == crate::model::Tier::L1);
            if outcome == AdoptOutcome::Adopted && leasable {
                self.recovery.adopted = true;
                // Pages this node adopts again may still be read under its fenced
                // session's leases.
                let record = &mut self.nodes[node.0 as usize];
                record.reclaims_held_until =
                    record.reclaims_held_until.max(record.fenced_leases_end);
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    fn adopt_one(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        holding: &Holding,
    ) -> Result<AdoptOutcome, DirectoryError> {
        let session = self.open_session(session_id)?;
        let location = holding.location;
        if !self.namespaces.contains_key(&holding.object.namespace)
            || !self.holds_location(session_id, session, holding)
            || !self.pool_admits(location.pool, &holding.object)
        {
            return Ok(AdoptOutcome::Refused);
        }
        let spec = &self.pools[location.pool.0 as usize].spec;
        let (scope, tier) = (spec.scope, spec.medium.tier());
        let mut known = false;
        let mut duplicate = false;
        for (_, replica) in self.replicas.of_object(&holding.object) {
            let other = &self.pools[replica.pool.0 as usize].spec;
            if replica.state != ReplicaState::Ready
                || other.scope != scope
                || other.medium.tier() != tier
            {
                continue;
            }
            if replica.location() == location && replica.owner == session.node {
                known = true;
            } else {
                duplicate = true;
            }
        }
        if known {
            return Ok(AdoptOutcome::Known);
        }
        if duplicate {
            return Ok(AdoptOutcome::Refused);
        }
        if !self.replicas.has_room() {
            return Err(DirectoryError::Full(Table::Replicas));
        }
        let allocated_bytes = self.pools[location.pool.0 as usize]
            .spec
            .rounded_bytes(location.length_bytes);
        let replica = NewReplica {
            object: holding.object,
            pool: location.pool,
            owner: session.node,
            length_bytes: location.length_bytes,
            allocated_bytes,
            deadline: now,
        };
        let id = self.replicas.insert(replica);
        self.pools[location.pool.0 as usize].reserve(allocated_bytes);
        // Adopted over its group's quota, if need be: the bytes exist, and eviction trims.
        self.replica_added(location.pool, &holding.object, allocated_bytes);
        self.publish(now, id, &holding.object, &location);
        Ok(AdoptOutcome::Adopted)
    }

    /// Whether `holding` lies in storage the session's node holds now: its own registered
    /// host pool, or an extent of a shared pool it claimed or was granted, with room for
    /// the replica's bytes.
    fn holds_location(&self, session_id: SessionId, session: &Session, holding: &Holding) -> bool {
        let location = holding.location;
        let Some(record) = self.pools.get(location.pool.0 as usize) else {
            return false;
        };
        let rounded = record.spec.rounded_bytes(location.length_bytes);
        if location.length_bytes == 0
            || location.length_bytes > super::OBJECT_BYTES_MAX
            || rounded > record.free_bytes()
            || location
                .offset_bytes
                .checked_add(rounded)
                .is_none_or(|end| end > record.spec.capacity_bytes)
        {
            return false;
        }
        match (record.spec.scope, &record.extents) {
            (Scope::Host(node), None) => {
                node == session.node && record.owner_session == Some(session_id)
            }
            (Scope::Domain(_), Some(extents)) => extents
                .owned_extent(location.offset_bytes, rounded, session_id)
                .is_some(),
            _ => false,
        }
    }
}

/// The recovery state of one directory incarnation.
#[derive(Debug, Default)]
pub(super) struct Recovery {
    /// The end of the recovery window.
    pub until: Timestamp,
    /// Whether any replica was adopted in this incarnation.
    pub adopted: bool,
    /// Rejoin report items the directory still takes this tick.
    pub budget: u32,
}
