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

    /// Costs worked out by hand from the representative figures (CXL 0.4 µs and 5 GB/s
    /// both ways; SSD 80 µs, 6 GB/s reads, 3 GB/s writes; DRAM 0.1 µs and 11 GB/s), not
    /// from the functions under test: a read or write costs latency + bytes / bandwidth, a
    /// keep costs one write and one read, serving costs the cheaper of a read and a prefill.
    #[test]
    fn costs_match_hand_computed_values() {
        let cxl = TierProfile::representative(TierKind::Cxl);
        let ssd = TierProfile::representative(TierKind::Ssd);
        let dram = TierProfile::representative(TierKind::Dram);
        // (tier, bytes, tokens, prefill µs/token, keep µs, recompute µs, serve µs)
        let rows = [
            // 64 MiB from CXL: 0.4 + 13 421.7728 µs each way.
            (
                &cxl,
                BLOCK_BYTES,
                512,
                100.0,
                26_844.345_6,
                51_200.0,
                13_422.172_8,
            ),
            // From SSD: a read of 80 + 11 184.81067 µs, a write of 80 + 22 369.62133 µs.
            (
                &ssd,
                BLOCK_BYTES,
                512,
                100.0,
                33_714.432,
                51_200.0,
                11_264.810_666_666_7,
            ),
            // A fast prefill (1 µs/token) beats reading 64 MiB back from SSD.
            (&ssd, BLOCK_BYTES, 512, 1.0, 33_714.432, 512.0, 512.0),
            // 1 MiB of DRAM: 0.1 + 95.32509 µs each way, against 16 tokens at 10 µs.
            (
                &dram,
                1 << 20,
                16,
                10.0,
                190.850_181_818_181_8,
                160.0,
                95.425_090_909_090_9,
            ),
            // Nothing to read still costs the latency; no tokens cost nothing to recompute.
            (&cxl, 0, 0, 100.0, 0.8, 0.0, 0.0),
        ];
        let close =
            |actual: f64, expected: f64| (actual - expected).abs() <= 1e-9 * expected.max(1.0);
        for (tier, bytes, tokens, prefill, keep_us, recompute_us, serve_us) in rows {
            let cost = model(prefill);
            let verdict = cost.keep_in(tier, bytes, tokens);
            let row = format!(
                "{:?} {bytes} B {tokens} tokens {prefill} µs/token",
                tier.kind
            );
            assert!(
                close(verdict.keep_cost_us, keep_us),
                "{row}: keep {verdict:?}"
            );
            assert!(
                close(verdict.recompute_cost_us, recompute_us),
                "{row}: recompute {verdict:?}"
            );
            assert!(
                close(cost.recompute_us(tokens), recompute_us),
                "{row}: recompute"
            );
            let served = cost.serve_us(tier, bytes, tokens);
            assert!(close(served, serve_us), "{row}: serve {served}");
        }
    }

    proptest! {
        #[test]
        fn a_slower_prefill_never_makes_keeping_worse(bytes in 0u64..1 << 32, tokens in 0u32..1 << 16, prefill in 0.001f64..1000.0) {
            let ssd = TierProfile::representative(TierKind::Ssd);
            let slow = model(prefill * 2.0).keep_in(&ssd, bytes, tokens);
            let fast = model(prefill).keep_in(&ssd, bytes, tokens);
            prop_assert!(!fast.keep_pays() || slow.keep_pays());
        }
    }
}
