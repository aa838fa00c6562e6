//! Demote, don't evict: under pressure a READY replica in a host CPU pool moves one tier
//! colder, into a shared pool its owner maps, and a replica in any memory pool spills into
//! its owner's SSD pool, when kvtier's placement
//! ([`crate::policy::placement::on_pressure`]) says keeping it there pays and the target
//! admits it (an SSD pool admits an object after `admit_after_accesses` accesses).
//! The directory reserves the target and asks the owner to copy; the source stays READY
//! (readable) until the target commits, then retires. A failed or expired copy cancels the
//! demotion and the source is evicted later instead. The pairs in flight are bounded by the
//! owner's reservations.

use super::pools::PoolRecord;
use super::replicas::{NewReplica, Replica};
use super::{Directory, ReplicaState, Task, TaskKind};
use crate::model::{DomainId, Medium, PoolId, ReplicaId, Scope, TaskId, Tier, Timestamp};
use crate::policy::placement::{self, Action, ColderTier, PlacementConfig, Victim};

/// How a replica chosen to leave its pool (by eviction or by its time to live) left.
pub(super) enum Departure {
    /// A copy one tier colder, into pool `to`, is under way; the replica's
    /// `allocated_bytes` are leaving.
    Demoted { allocated_bytes: u64, to: PoolId },
    /// Retired where it is.
    Retired,
    /// Neither: it cannot retire.
    Refused,
}

impl Directory {
    /// Moves `victim` one tier colder when `demote` and a colder pool takes it, else
    /// retires it.
    pub(super) fn demote_or_retire(
        &mut self,
        now: Timestamp,
        victim: ReplicaId,
        demote: bool,
    ) -> Departure {
        let target = if demote {
            self.replicas
                .get(victim)
                .and_then(|replica| self.demotion_target(replica))
        } else {
            None
        };
        if let Some((target_pool, bytes)) = target {
            if self.start_demotion(now, victim, target_pool, bytes) {
                let allocated_bytes = self
                    .replicas
                    .get(victim)
                    .map_or(0, |replica| replica.allocated_bytes);
                return Departure::Demoted {
                    allocated_bytes,
                    to: target_pool,
                };
            }
        }
        match self.retire(None, victim) {
            Ok(_) => Departure::Retired,
            Err(_) => Departure::Refused,
        }
    }

    /// Where `victim` would go one tier colder, by kvtier's placement
    /// ([`placement::on_pressure`]): from a host CPU pool, into a shared pool its owner's
    /// session can write; from any memory pool, into its owner's SSD pool; with room below
    /// its high watermark, holding no replica of the object yet, that admits it (enough
    /// accesses), when keeping the bytes there (priced by that pool's profile) costs less
    /// than recomputing them (priced by the namespace's model).
    fn demotion_target(&self, victim: &Replica) -> Option<(PoolId, u64)> {
        let source = self.pools[victim.pool.0 as usize].spec.medium;
        if source.tier() != Tier::L1 {
            return None;
        }
        let session_id = self.nodes[victim.owner.0 as usize].session?;
        let session = self
            .sessions
            .get(&session_id)
            .filter(|session| session.is_open())?;
        let descriptor = &self.namespaces.get(&victim.object.namespace)?.descriptor;
        let (cost, tokens) = self.config.recompute_model(
            &descriptor.model,
            descriptor.chunk_tokens,
            victim.length_bytes,
        );
        let frequency = self.access_count(&victim.object);
        let domains: &[DomainId] = if source == Medium::Cpu {
            &session.domains
        } else {
            &[]
        };
        let colder = self.colder_pools(victim, domains, frequency);
        let placed = Victim {
            bytes: victim.allocated_bytes,
            tokens,
            frequency,
        };
        // Admission is each pool's (`has_room` below): placement admits every candidate.
        let config = PlacementConfig {
            wear_admit_frequency_min: 0,
        };
        match placement::on_pressure(&placed, &colder, &config, &cost).action {
            Action::Demote { to } | Action::Spill { to } => Some(to),
            Action::Evict => None,
        }
    }

    /// The shared pools of `domains` and the owner's staged (SSD) pools as placement sees
    /// them for `victim` (accessed `frequency` times), each named by the pool and the bytes
    /// the victim takes there. A pool whose admission the victim does not meet has no room.
    fn colder_pools(
        &self,
        victim: &Replica,
        domains: &[DomainId],
        frequency: u32,
    ) -> Vec<((PoolId, u64), ColderTier<'_>)> {
        let writable = |record: &PoolRecord| match record.spec.scope {
            Scope::Domain(domain) => domains.contains(&domain),
            Scope::Host(node) => {
                node == victim.owner
                    && record.spec.medium.tier() == Tier::L2
                    && record.owner_session.is_some()
            }
        };
        let mut colder = Vec::new();
        for (index, record) in self.pools.iter().enumerate() {
            let pool = PoolId(index as u32);
            if !writable(record) || !self.pool_admits(pool, &victim.object) {
                continue;
            }
            let bytes = record.spec.rounded_bytes(victim.length_bytes);
            let holds_object = self.replicas.of_object(&victim.object).any(|(_, replica)| {
                replica.pool == pool && replica.state != ReplicaState::Retiring
            });
            let tier = ColderTier {
                profile: &record.profile,
                has_room: self.room_below_high_watermark(record, bytes)
                    && self.within_quota(pool, &victim.object, bytes)
                    && frequency >= self.admission_of(pool),
                holds_object,
            };
            colder.push(((pool, bytes), tier));
        }
        colder
    }

    /// Whether `bytes` more fit in the pool of `record` and leave it at or below its high
    /// watermark.
    pub(super) fn room_below_high_watermark(&self, record: &PoolRecord, bytes: u64) -> bool {
        let high = u128::from(self.config.high_watermark_percent);
        let after = (u128::from(record.reserved_bytes)
            + u128::from(record.ready_bytes)
            + u128::from(bytes))
            * 100;
        record.free_bytes() >= bytes && after <= high * u128::from(record.budget_bytes)
    }

    /// Reserves the target and queues the copy for the owner. `false` when a bound refuses.
    fn start_demotion(
        &mut self,
        now: Timestamp,
        victim_id: ReplicaId,
        target_pool: PoolId,
        bytes: u64,
    ) -> bool {
        let Some(victim) = self.replicas.get(victim_id) else {
            return false;
        };
        let (object, owner, length_bytes, source) = (
            victim.object,
            victim.owner,
            victim.length_bytes,
            victim.location(),
        );
        let Some(session_id) = self.nodes[owner.0 as usize].session else {
            return false;
        };
        let full = self.sessions.get(&session_id).is_none_or(|session| {
            session.reservations.len() >= self.config.reservations_per_session_max as usize
        });
        if full || !self.replicas.has_room() {
            return false;
        }
        let target = self.insert_reservation(NewReplica {
            object,
            pool: target_pool,
            owner,
            length_bytes,
            allocated_bytes: bytes,
            deadline: now + self.config.reservation_duration,
        });
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.reservations.insert(target);
        }
        self.demotions.insert(target, victim_id);
        self.demoting.insert(victim_id);
        let task = Task {
            id: TaskId(self.next_task),
            kind: TaskKind::Demote {
                source,
                target,
                target_pool,
            },
        };
        self.next_task += 1;
        self.queue_task(owner, task);
        true
    }

    /// The target of a demotion was committed: the source retires.
    pub(super) fn finish_demotion(&mut self, target: ReplicaId) {
        if let Some(source) = self.demotions.remove(&target) {
            self.demoting.remove(&source);
            if self
                .replicas
                .get(source)
                .is_some_and(|replica| replica.state == ReplicaState::Ready)
            {
                let _ = self.retire(None, source);
            }
        }
    }

    /// The target of a demotion is gone uncommitted: the source may be chosen again.
    pub(super) fn cancel_demotion(&mut self, target: ReplicaId) {
        if let Some(source) = self.demotions.remove(&target) {
            self.demoting.remove(&source);
        }
    }
}
