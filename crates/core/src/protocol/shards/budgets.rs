//! Rejoin reports adopted across shards, and the pools' budgets lent between shards and
//! evened out again.

use super::Shards;
use crate::directory::{DirectoryError, ShardPlace};
use crate::model::{SessionId, Timestamp};

impl Shards {
    /// Adopts a rejoining node's holdings one by one in order, each in its object's shard,
    /// as one core would: paced as a whole when a shard has no budget left for its part,
    /// and each holding given the room its pool has over all shards (a shard lends its
    /// free budget: the bytes exist, and the pool may have room though one share has not).
    pub(super) fn adopt(
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
    pub(super) fn even_budgets(&mut self) {
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
}
