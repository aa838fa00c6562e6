//! The cost model: whether keeping a copy of an object in a colder tier costs less than
//! recomputing its tokens, and what serving a request costs in time.

use super::profiles::TierProfile;

/// The model-dependent cost of recomputing KV: a parameter of the namespace (model,
/// hardware, parallel layout), not of the tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Prefill time of one token, in microseconds. Must be positive and finite.
    pub prefill_us_per_token: f64,
}

/// The verdict on keeping one object in one tier, with both sides of the comparison so a
/// caller can report why.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeepVerdict {
    /// Staging the bytes into the tier plus reading them back once, in microseconds.
    pub keep_cost_us: f64,
    /// Recomputing the object's tokens, in microseconds.
    pub recompute_cost_us: f64,
}

impl KeepVerdict {
    /// True iff keeping costs strictly less than recomputing.
    pub fn keep_pays(&self) -> bool {
        self.keep_cost_us < self.recompute_cost_us
    }
}

impl CostModel {
    /// Time to recompute `tokens` tokens by prefill, in microseconds.
    pub fn recompute_us(&self, tokens: u32) -> f64 {
        f64::from(tokens) * self.prefill_us_per_token
    }

    /// Compares staging `bytes` into `target` and reading them back once against
    /// recomputing `tokens`. Pure; the same inputs always give the same verdict.
    pub fn keep_in(&self, target: &TierProfile, bytes: u64, tokens: u32) -> KeepVerdict {
        KeepVerdict {
            keep_cost_us: target.write_time_us(bytes) + target.read_time_us(bytes),
            recompute_cost_us: self.recompute_us(tokens),
        }
    }

    /// Time to serve `tokens` of an object from `tier` instead of recomputing them: the
    /// cheaper of reading its `bytes` and recomputing, since an engine may always recompute.
    pub fn serve_us(&self, tier: &TierProfile, bytes: u64, tokens: u32) -> f64 {
        tier.read_time_us(bytes).min(self.recompute_us(tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::profiles::{TierKind, TierProfile};
    use proptest::prelude::*;

    const BLOCK_BYTES: u64 = 64 << 20;

    fn model(prefill_us_per_token: f64) -> CostModel {
        CostModel {
            prefill_us_per_token,
        }
    }

    #[test]
    fn keep_table() {
        let cxl = TierProfile::representative(TierKind::Cxl);
        let ssd = TierProfile::representative(TierKind::Ssd);
        // (tier, bytes, tokens, prefill µs/token, keep pays)
        let rows = [
            (&cxl, BLOCK_BYTES, 512, 100.0, true),
            (&ssd, BLOCK_BYTES, 512, 100.0, true),
            (&ssd, BLOCK_BYTES, 512, 1.0, false),
            (&ssd, BLOCK_BYTES, 0, 100.0, false),
            (&cxl, 0, 512, 100.0, true),
        ];
        for (tier, bytes, tokens, prefill, pays) in rows {
            let verdict = model(prefill).keep_in(tier, bytes, tokens);
            assert_eq!(
                verdict.keep_pays(),
                pays,
                "{:?} {bytes} {tokens} {prefill}",
                tier.kind
            );
        }
    }

    #[test]
    fn keep_exactly_equal_costs_does_not_pay() {
        let verdict = KeepVerdict {
            keep_cost_us: 5.0,
            recompute_cost_us: 5.0,
        };
        assert!(!verdict.keep_pays());
    }

    proptest! {
        #[test]
        fn serving_never_costs_more_than_recomputing(bytes in 0u64..1 << 32, tokens in 0u32..1 << 16, prefill in 0.001f64..1000.0) {
            let cost = model(prefill);
            for kind in [TierKind::Dram, TierKind::Cxl, TierKind::Ssd, TierKind::Remote] {
                let tier = TierProfile::representative(kind);
                prop_assert!(cost.serve_us(&tier, bytes, tokens) <= cost.recompute_us(tokens));
            }
        }

        #[test]
        fn a_slower_prefill_never_makes_keeping_worse(bytes in 0u64..1 << 32, tokens in 0u32..1 << 16, prefill in 0.001f64..1000.0) {
            let ssd = TierProfile::representative(TierKind::Ssd);
            let slow = model(prefill * 2.0).keep_in(&ssd, bytes, tokens);
            let fast = model(prefill).keep_in(&ssd, bytes, tokens);
            prop_assert!(!fast.keep_pays() || slow.keep_pays());
        }
    }
}
