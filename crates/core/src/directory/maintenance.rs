//! Time and pressure: `tick` (expiry of leases, reservations and silent sessions), eviction
//! under pressure, the access history the policies learn from, and the reports for metrics.

use super::pools::PoolRecord;
use super::quotas::QUOTA_SCAN_FACTOR;
use super::{Directory, DirectoryCounts, PoolReport, ReplicaState, SessionState, TickReport};
use crate::model::{Medium, ObjectId, PoolId, ReplicaId, SaltGroup, Scope, Timestamp};
use crate::policy::eviction::{KvtierConfig, VictimCandidate};
use crate::policy::history::{frequency_class, FREQUENCY_CLASSES};
use std::time::Duration;

impl Directory {
    /// Advances time: expires leases and reservations whose deadline passed, marks silent
    /// sessions suspect (hiding their host replicas) and fences those silent past
    /// `fence_after`. Returns what changed.
    pub fn tick(&mut self, now: Timestamp) -> TickReport {
        self.latest_tick = self.latest_tick.max(now);
        self.refill_adopt_budget();
        self.requeue_overdue_tasks(now);
        let evicted = self.evict(now) + std::mem::take(&mut self.evictions_unreported);
        let expired = self.expire(
            now,
            self.config.evictions_per_tick_max.saturating_sub(evicted),
        );
        let expired_leases = self.expire_leases(now);
        let expired_reservations = self.expire_reservations(now);
        let transitions = self.advance_silent_sessions(now);
        let drains = self.advance_drains(now);
        self.plan_waiting_replications(now);
        TickReport {
            expired_leases,
            expired_reservations,
            evicted,
            expired,
            transitions,
            drains,
        }
    }

    /// Retires (or demotes) READY replicas of every pool above its high watermark until it
    /// is at or below its low watermark, at most `evictions_per_tick_max` per call. kvtier's
    /// eviction order ([`kvtier::choose`]) picks each victim among the least recently used
    /// replicas of each frequency class (the first `eviction_window` of each); leased and
    /// young replicas are never chosen. Placement decides whether it is demoted.
    pub(super) fn evict(&mut self, now: Timestamp) -> u32 {
        let high = u64::from(self.config.high_watermark_percent);
        let low = u64::from(self.config.low_watermark_percent);
        let mut evicted = 0;
        for index in 0..self.pools.len() {
            let pool = PoolId(index as u32);
            if !self.used_above(pool, 0, high) {
                continue;
            }
            // Bytes on their way out to a colder tier (demotions in flight) count as gone.
            let mut leaving = self.demoting_bytes_of(pool, None);
            if !self.used_above(pool, leaving, high) {
                continue;
            }
            let victim_config = KvtierConfig::for_capacity(self.pools[index].object_capacity());
            while evicted < self.config.evictions_per_tick_max
                && self.used_above(pool, leaving, low)
            {
                let window = self.victim_window(now, pool, None);
                let Some(departed) = self.evict_one(now, pool, &window, &victim_config) else {
                    break;
                };
                leaving += departed;
                evicted += 1;
            }
        }
        let budget = self.config.evictions_per_tick_max.saturating_sub(evicted);
        evicted + self.evict_over_quota(now, budget)
    }

    /// Counts an eviction from `pool` under its medium.
    pub(super) fn count_eviction(&mut self, pool: PoolId) {
        let medium = self.pools[pool.0 as usize].spec.medium;
        if let Some(position) = Medium::ALL.iter().position(|each| *each == medium) {
            self.evictions_by_medium[position] += 1;
        }
    }

    /// Replicas evicted under pressure so far (retired or demoted), by the medium of the
    /// pool they left: every medium, in the order of [`Medium::ALL`].
    pub fn evictions_by_medium(&self) -> [(Medium, u64); Medium::ALL.len()] {
        std::array::from_fn(|position| (Medium::ALL[position], self.evictions_by_medium[position]))
    }

    /// Whether `pool`'s reserved and READY bytes, less the `leaving_bytes` on their way out,
    /// are above `percent` of its capacity.
    fn used_above(&self, pool: PoolId, leaving_bytes: u64, percent: u64) -> bool {
        let record = &self.pools[pool.0 as usize];
        // In u128: capacities and byte counts times 100 cannot overflow.
        let used = u128::from(record.reserved_bytes) + u128::from(record.ready_bytes);
        used.saturating_sub(u128::from(leaving_bytes)) * 100
            > u128::from(percent) * u128::from(record.budget_bytes)
    }

    /// Bytes of `pool`'s replicas (of `group`'s objects, when given) being demoted.
    pub(super) fn demoting_bytes_of(&self, pool: PoolId, group: Option<SaltGroup>) -> u64 {
        self.demoting
            .iter()
            .filter_map(|source| self.replicas.get(*source))
            .filter(|replica| replica.pool == pool)
            .filter(|replica| {
                group.is_none_or(|group| self.group_of_object(&replica.object) == group)
            })
            .map(|replica| replica.allocated_bytes)
            .sum()
    }

    /// What kvtier's eviction order chooses from in `pool`: the first `eviction_window`
    /// least recently used READY replicas of each frequency class (of `group`'s objects,
    /// when given, among the first [`QUOTA_SCAN_FACTOR`] times as many), least recent
    /// first, priced by their class's reuse probability, idle time and age.
    pub(super) fn victim_window(
        &self,
        now: Timestamp,
        pool: PoolId,
        group: Option<SaltGroup>,
    ) -> Vec<(ReplicaId, VictimCandidate)> {
        let window = self.config.eviction_window as usize;
        let scanned = match group {
            None => window,
            Some(_) => window.saturating_mul(QUOTA_SCAN_FACTOR),
        };
        (0..FREQUENCY_CLASSES)
            .flat_map(|class| {
                let reuse_probability = self.history.reuse_probability(class as u32 + 1);
                self.replicas
                    .coldest(pool, class)
                    .take(scanned)
                    .filter(move |(_, replica)| {
                        group.is_none_or(|group| self.group_of_object(&replica.object) == group)
                    })
                    .take(window)
                    .map(move |(id, replica)| (id, replica, reuse_probability))
            })
            .map(|(id, replica, reuse_probability)| {
                let age = now.saturating_since(replica.last_access);
                let idle_ms = self
                    .policy_ms(now)
                    .saturating_sub(self.policy_ms(replica.last_access));
                let candidate = VictimCandidate {
                    bytes: replica.allocated_bytes,
                    reuse_probability,
                    idle: Duration::from_millis(idle_ms),
                    age,
                    // A replica being demoted is spoken for, and one an engine reads is not
                    // freed soon; one only delegations hold is freed once their recall
                    // is answered, so it is chosen by the order like any other.
                    leased: replica.lease_count > self.delegations_on(id)
                        || self.demoting.contains(&id),
                };
                (id, candidate)
            })
            .collect()
    }

    /// Records an access to `object` in the history; returns its frequency class.
    pub(super) fn record_access(&mut self, now: Timestamp, object: &ObjectId) -> usize {
        let key = self.replicas.key_of(object);
        let stats = self.history.record(key, self.policy_ms(now));
        frequency_class(stats.count)
    }

    /// The frequency class of `object` from its recorded accesses.
    pub(super) fn access_class(&self, object: &ObjectId) -> usize {
        frequency_class(self.access_count(object))
    }

    /// Recorded accesses of `object` (reads and stores); 0 when none is remembered.
    pub(super) fn access_count(&self, object: &ObjectId) -> u32 {
        let key = self.replicas.key_of(object);
        self.history.stats(key).map_or(0, |stats| stats.count)
    }

    /// `now` on the policy's clock, in milliseconds: the directory's clock times
    /// `policy_time_scale` (1 except when a trace is replayed faster than it was recorded).
    pub(super) fn policy_ms(&self, now: Timestamp) -> u64 {
        (now.0 as f64 / 1e6 * self.config.policy_time_scale) as u64
    }

    /// Usage of every registered pool.
    pub fn usage(&self) -> Vec<PoolReport> {
        self.pools
            .iter()
            .enumerate()
            .map(|(index, record)| PoolReport {
                pool: PoolId(index as u32),
                spec: record.spec.clone(),
                usage: record.usage(self.owner_reachable(record)),
                profile: record.profile.clone(),
            })
            .collect()
    }

    fn owner_reachable(&self, record: &PoolRecord) -> bool {
        match record.spec.scope {
            Scope::Domain(_) => true,
            Scope::Host(_) => record
                .owner_session
                .and_then(|session| self.sessions.get(&session))
                .is_some_and(|session| session.state == SessionState::Live),
        }
    }

    /// Object, replica, lease and session counts.
    pub fn counts(&self) -> DirectoryCounts {
        let mut counts = DirectoryCounts {
            objects: self.replicas.object_count() as u64,
            replicas: u64::from(self.replicas.len()),
            leases: u64::from(self.leases.len()),
            ..DirectoryCounts::default()
        };
        for session in self.sessions.values() {
            match session.state {
                SessionState::Live => counts.sessions_live += 1,
                SessionState::Suspect => counts.sessions_suspect += 1,
                SessionState::Fenced => counts.sessions_fenced += 1,
                SessionState::Closed | SessionState::Drained => {}
            }
        }
        counts
    }

    /// A replica's state, if it is live.
    pub fn replica_state(&self, replica: ReplicaId) -> Option<ReplicaState> {
        self.replicas.get(replica).map(|record| record.state)
    }

    /// Where `object`'s READY replicas lie (the simulation checks that a rejoin re-adopted
    /// what the node held).
    pub fn ready_locations(&self, object: &ObjectId) -> Vec<crate::model::Location> {
        self.replicas
            .of_object(object)
            .filter(|(_, replica)| replica.state == ReplicaState::Ready)
            .map(|(_, replica)| replica.location())
            .collect()
    }

    /// Bytes held by the replica table's arrays.
    pub fn replica_memory_bytes(&self) -> usize {
        self.replicas.memory_bytes()
    }
}
