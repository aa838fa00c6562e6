//! Tenant quotas in shared pools: the bytes each salt group's live objects (reserved and
//! READY) take in each pool, and the most it may take there by medium
//! ([`super::config::TierQuota`], from the `cxl_bytes` and `ssd_bytes` of its tenant rules).
//! A group at its quota in a pool gets no more room there (placement goes one tier on, or
//! skips), and eviction takes that group's own coldest replicas there, above
//! `high_watermark_percent` of its quota down to `low_watermark_percent`, however empty the
//! pool is. A CPU partition is its group's quota on a node already.

use super::Directory;
use crate::model::{ObjectId, PoolId, ReplicaId, SaltGroup, Timestamp};
use crate::policy::eviction::{self as kvtier, KvtierConfig, VictimCandidate};

/// How many of a pool's coldest replicas of each frequency class a quota's eviction reads
/// to find its group's, per replica of the eviction window: the group's replicas further
/// down wait for a later tick.
pub(super) const QUOTA_SCAN_FACTOR: usize = 16;

impl Directory {
    /// The salt group of `object` (every replica's namespace is registered; unsalted for
    /// one that is not).
    pub(super) fn group_of_object(&self, object: &ObjectId) -> SaltGroup {
        self.group_of(&object.namespace)
            .unwrap_or_else(|| SaltGroup::of(None))
    }

    /// A READY replica of `object` of `bytes` in `pool` started retiring: its bytes no
    /// longer count against its group's quota there.
    pub(super) fn replica_retiring(&mut self, pool: PoolId, object: &ObjectId, bytes: u64) {
        let group = self.group_of_object(object);
        if let Some(record) = self.pools.get_mut(pool.0 as usize) {
            record.refund(group, bytes);
        }
    }

    /// `group`'s quota in `pool`, by the pool's medium; `None`: no bound but the pool's.
    fn quota_in(&self, pool: PoolId, group: SaltGroup) -> Option<u64> {
        let medium = self.pools.get(pool.0 as usize)?.spec.medium;
        self.config.group_quotas.get(&group)?.of(medium)
    }

    /// Whether `bytes` more of `object`'s group fit within its quota in `pool`.
    pub(super) fn within_quota(&self, pool: PoolId, object: &ObjectId, bytes: u64) -> bool {
        self.config.group_quotas.is_empty()
            || self.within_quota_of(pool, self.group_of_object(object), bytes)
    }

    /// Whether `bytes` more of `group` fit within its quota in `pool`.
    pub(super) fn within_quota_of(&self, pool: PoolId, group: SaltGroup, bytes: u64) -> bool {
        match self.quota_in(pool, group) {
            None => true,
            Some(quota) => {
                let held = self.pools[pool.0 as usize].group_bytes(group);
                held.saturating_add(bytes) <= quota
            }
        }
    }

    /// Retires (or demotes) the coldest replicas of every group above the high watermark
    /// of its quota in a pool, until it is at or below the low watermark, at most `budget`
    /// of them. Returns how many.
    pub(super) fn evict_over_quota(&mut self, now: Timestamp, budget: u32) -> u32 {
        if self.config.group_quotas.is_empty() {
            return 0;
        }
        let (high, low) = (
            u128::from(self.config.high_watermark_percent),
            u128::from(self.config.low_watermark_percent),
        );
        let mut evicted = 0;
        for index in 0..self.pools.len() {
            let pool = PoolId(index as u32);
            let over: Vec<(SaltGroup, u64)> = self.pools[index]
                .groups()
                .filter_map(|(group, bytes)| {
                    let quota = self.quota_in(pool, group)?;
                    (u128::from(bytes) * 100 > high * u128::from(quota)).then_some((group, quota))
                })
                .collect();
            for (group, quota) in over {
                let victim_config = KvtierConfig::for_capacity(self.pools[index].object_capacity());
                let mut leaving = self.demoting_bytes_of(pool, Some(group));
                while evicted < budget {
                    let held = self.pools[index].group_bytes(group).saturating_sub(leaving);
                    if u128::from(held) * 100 <= low * u128::from(quota) {
                        break;
                    }
                    let window = self.victim_window(now, pool, Some(group));
                    let Some(departed) = self.evict_one(now, pool, &window, &victim_config) else {
                        break;
                    };
                    leaving += departed;
                    evicted += 1;
                }
            }
        }
        evicted
    }

    /// Chooses one victim from `window` by kvtier's eviction order and demotes or retires
    /// it: the bytes now on their way to a colder tier (0 when retired), or `None` when
    /// none could be chosen.
    pub(super) fn evict_one(
        &mut self,
        now: Timestamp,
        pool: PoolId,
        window: &[(ReplicaId, VictimCandidate)],
        victim_config: &KvtierConfig,
    ) -> Option<u64> {
        let candidates: Vec<VictimCandidate> =
            window.iter().map(|(_, candidate)| *candidate).collect();
        let (Some(chosen), _) = kvtier::choose(&candidates, victim_config) else {
            return None;
        };
        let leaving = match self.demote_or_retire(now, window[chosen].0, true) {
            super::demotion::Departure::Demoted {
                allocated_bytes, ..
            } => allocated_bytes,
            super::demotion::Departure::Retired => 0,
            super::demotion::Departure::Refused => return None,
        };
        self.count_eviction(pool);
        Some(leaving)
    }
}
