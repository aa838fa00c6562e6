//! Staged (L2) pools: a node's SSD store, registered as a host pool of medium `ssd`. Its
//! replicas are written only by demotion ("spill", chosen by
//! [`crate::policy::placement::on_pressure`]), never by a client's store; they are never a
//! hit (nothing maps them), but `probe` reports them as on SSD for the node's own clients,
//! whose loads and prefetches restore them into memory. Watermarks, eviction and reclaim
//! are those of every pool.

use super::{Directory, DirectoryError, ReplicaState};
use crate::model::{Medium, ObjectId, PoolId, Scope, SessionId, Tier};

impl Directory {
    /// Sets the accesses an object needs before it is spilled into `pool`, which must be
    /// an SSD pool of `session_id`'s node (its `[nodes.ssd] admit_after_accesses`).
    pub fn admit_after(
        &mut self,
        session_id: SessionId,
        pool: PoolId,
        accesses: u32,
    ) -> Result<(), DirectoryError> {
        let node = self.open_session(session_id)?.node;
        let record = self
            .pools
            .get_mut(pool.0 as usize)
            .ok_or(DirectoryError::UnknownPool)?;
        if record.spec.medium != Medium::Ssd || record.spec.scope != Scope::Host(node) {
            return Err(DirectoryError::InvalidPool(
                "admission is set on the node's own SSD pool".into(),
            ));
        }
        record.admit_after_accesses = Some(accesses);
        Ok(())
    }

    /// The accesses an object needs before it may be kept in the pool of `record`'s kind:
    /// the pool's own admission, else the directory's for wear-limited tiers, else none.
    pub(super) fn admission_of(&self, pool: PoolId) -> u32 {
        let record = &self.pools[pool.0 as usize];
        match record.admit_after_accesses {
            Some(accesses) => accesses,
            None if record.profile.wear_limited => self.config.wear_admit_frequency_min,
            None => 0,
        }
    }

    /// Whether a READY replica of `object` is in a staged pool of `node` (its SSD).
    pub(super) fn on_staged_pool(
        &self,
        node: crate::model::NodeId,
        object: &ObjectId,
    ) -> Option<u64> {
        self.replicas
            .of_object(object)
            .find(|(_, replica)| {
                replica.state == ReplicaState::Ready
                    && replica.owner == node
                    && self.pools[replica.pool.0 as usize].spec.medium.tier() == Tier::L2
            })
            .map(|(_, replica)| replica.length_bytes)
    }
}
