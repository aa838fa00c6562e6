//! Whether a replication pays, and which waiting demands go first: the policy the
//! directory applies when a node keeps missing an object that only another node's pools
//! hold (`crate::directory` plans and books the copies; nothing here does).

use super::cost::CostModel;
use super::profiles::{TierKind, TierProfile};

/// How a copy would reach the node that missed the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Into a shared pool both nodes map: a copy between two mappings of the source's
    /// owner, with no transfer to price.
    Shared,
    /// Over the network into the requester's own pool: the transfer is priced by the
    /// `remote` tier profile.
    Network,
}

/// The cost model of one replication: keeping the copy against recomputing the object.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplicationCost {
    /// The namespace's prefill cost.
    pub cost: CostModel,
    /// Tokens the object holds (what a miss recomputes).
    pub tokens: u32,
}

impl ReplicationCost {
    /// Whether copying `bytes` into a pool of profile `target` by `route` pays.
    ///
    /// Guarantees: true iff keeping the copy (staging it into `target` and reading it back
    /// once, [`CostModel::keep_in`]) plus, on the [`Route::Network`], the transfer of
    /// `bytes` at the representative `remote` profile costs strictly less than recomputing
    /// `tokens`. Pure: the same inputs always give the same answer. A network copy never
    /// pays where the same copy into a shared pool of the same profile does not, and a
    /// slower prefill never turns a paying copy into one that does not.
    pub fn pays(&self, target: &TierProfile, bytes: u64, route: Route) -> bool {
        let keep = self.cost.keep_in(target, bytes, self.tokens);
        let transfer_us = match route {
            Route::Shared => 0.0,
            Route::Network => TierProfile::representative(TierKind::Remote).read_time_us(bytes),
        };
        keep.keep_cost_us + transfer_us < keep.recompute_cost_us
    }
}

/// Orders demands waiting for a copy, hot objects with repeated remote demand first: by
/// `misses` (each `(misses, key)`), most first, then by `key`, greatest first, so the order
/// is total and the same for the same demands whatever order they come in.
pub fn most_demanded_first<K: Ord>(waiting: &mut [(u32, K)]) {
    waiting.sort_unstable_by(|left, right| right.cmp(left));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn replication(prefill_us_per_token: f64, tokens: u32) -> ReplicationCost {
        ReplicationCost {
            cost: CostModel {
                prefill_us_per_token,
            },
            tokens,
        }
    }

    /// Costs worked out by hand from the representative figures (CXL 0.4 µs and 5 GB/s
    /// both ways, DRAM 0.1 µs and 11 GB/s, remote 70 µs and 2 GB/s): a 1 MiB keep costs
    /// 420.2 µs in CXL and 190.9 µs in DRAM; its transfer 594.3 µs, so 785.1 µs over the
    /// network. 256 tokens at 2 µs (512 µs), 3 µs (768 µs) and 4 µs (1024 µs).
    #[test]
    fn a_copy_pays_when_keep_and_transfer_cost_less_than_recomputing() {
        let cxl = TierProfile::representative(TierKind::Cxl);
        let dram = TierProfile::representative(TierKind::Dram);
        // (target, route, prefill µs/token, pays)
        let rows = [
            (&cxl, Route::Shared, 2.0, true),
            (&cxl, Route::Shared, 1.5, false),
            (&dram, Route::Network, 2.0, false),
            (&dram, Route::Network, 3.0, false),
            (&dram, Route::Network, 4.0, true),
            (&dram, Route::Shared, 1.0, true),
        ];
        for (target, route, prefill, pays) in rows {
            assert_eq!(
                replication(prefill, 256).pays(target, MIB, route),
                pays,
                "{:?} {route:?} {prefill}",
                target.kind
            );
        }
    }

    #[test]
    fn nothing_to_recompute_never_pays() {
        let dram = TierProfile::representative(TierKind::Dram);
        for route in [Route::Shared, Route::Network] {
            assert!(!replication(100.0, 0).pays(&dram, 0, route));
        }
    }

    #[test]
    fn the_most_missed_go_first_and_the_order_is_total() {
        let mut waiting = vec![(1, 'a'), (3, 'b'), (2, 'c'), (3, 'a'), (1, 'z')];
        most_demanded_first(&mut waiting);
        assert_eq!(waiting, [(3, 'b'), (3, 'a'), (2, 'c'), (1, 'z'), (1, 'a')]);
    }

    proptest! {
        #[test]
        fn the_network_never_pays_where_the_shared_pool_does_not(bytes in 0u64..1 << 32, tokens in 0u32..1 << 16, prefill in 0.001f64..1000.0) {
            let cxl = TierProfile::representative(TierKind::Cxl);
            let cost = replication(prefill, tokens);
            prop_assert!(!cost.pays(&cxl, bytes, Route::Network) || cost.pays(&cxl, bytes, Route::Shared));
        }

        #[test]
        fn a_slower_prefill_never_stops_a_copy_from_paying(bytes in 0u64..1 << 32, tokens in 0u32..1 << 16, prefill in 0.001f64..1000.0) {
            let dram = TierProfile::representative(TierKind::Dram);
            for route in [Route::Shared, Route::Network] {
                let fast = replication(prefill, tokens).pays(&dram, bytes, route);
                let slow = replication(prefill * 2.0, tokens).pays(&dram, bytes, route);
                prop_assert!(!fast || slow);
            }
        }
    }
}
