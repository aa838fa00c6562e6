//! Per-tier time to live: a READY replica idle in its pool past the lifecycle policy of the
//! pool's medium leaves without waiting for pressure — one tier colder when the policy
//! spills and a colder pool takes it (the same demotion as under pressure), freed otherwise.
//! The lifecycle ([`Life::advance`]) decides, on the policy clock; an access revives an
//! expiring replica because it restarts the replica's clock. Each tick looks at no more
//! than `eviction_window` replicas per frequency class and pool.

use super::demotion::Departure;
use super::{Directory, ReplicaId};
use crate::model::{PoolId, Timestamp};
use crate::policy::history::FREQUENCY_CLASSES;
use crate::policy::lifecycle::{Life, LifeState};

impl Directory {
    /// Retires or demotes up to `budget` replicas past their tier's time to live; returns
    /// how many left.
    pub(super) fn expire(&mut self, now: Timestamp, budget: u32) -> u32 {
        let now_ms = self.policy_ms(now);
        let mut expired = 0;
        for index in 0..self.pools.len() {
            let medium = self.pools[index].spec.medium;
            let Some(policy) = self.config.ttl.get(&medium).copied() else {
                continue;
            };
            let pool = PoolId(index as u32);
            let mut leaving: Vec<(ReplicaId, LifeState)> = Vec::new();
            for class in 0..FREQUENCY_CLASSES {
                for (id, replica) in self
                    .replicas
                    .coldest(pool, class)
                    .take(self.config.eviction_window as usize)
                {
                    let clock_ms = self.policy_ms(replica.last_access);
                    let life = Life {
                        state: LifeState::Resident,
                        entered_ms: clock_ms,
                        clock_ms,
                    }
                    .advance(&policy, now_ms);
                    match life.state {
                        LifeState::Spilled | LifeState::Expired => {
                            if replica.lease_count == 0 && !self.demoting.contains(&id) {
                                leaving.push((id, life.state));
                            }
                        }
                        // The rest of the class was used more recently.
                        _ => break,
                    }
                }
            }
            for (id, state) in leaving {
                if expired >= budget {
                    return expired;
                }
                let demote = state == LifeState::Spilled;
                match self.demote_or_retire(now, id, demote) {
                    Departure::Demoted { .. } | Departure::Retired => expired += 1,
                    Departure::Refused => {}
                }
            }
        }
        expired
    }
}
