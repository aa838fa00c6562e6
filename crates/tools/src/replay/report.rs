//! The figures of a replay per policy, the LRU→Belady gap kvtier closes, and their table
//! and JSON renderings.

use std::fmt::Write;

use serde_json::{json, Value};

use super::cluster::ClusterTally;
use super::live::{LiveOutcome, AGREEMENT_TOLERANCE};
use super::tiers::{Outcome, PolicyKind, TierSpec};

/// Report key of LRU restricted to the hottest tier (printed with several tiers).
pub const LRU_TOP_TIER_ONLY: &str = "lru_top_tier_only";
/// Report key of the replay through the directory core: kvtier's policy as the cluster
/// runs it (DRAM, or DRAM and CXL).
pub const KVTIER_DIRECTORY: &str = "kvtier_directory";

/// The report key of `policy`.
pub fn policy_name(policy: PolicyKind) -> &'static str {
    match policy {
        PolicyKind::Lru => "lru",
        PolicyKind::S3fifo => "s3fifo",
        PolicyKind::Belady => "belady",
        PolicyKind::Kvtier => "kvtier",
    }
}

/// One policy's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyReport {
    /// Report key.
    pub name: String,
    /// Hit tokens over input tokens.
    pub token_hit_ratio: f64,
    /// Prompt tokens served from the cache instead of prefilled.
    pub prefill_tokens_saved: u64,
    /// Bytes moved between tiers.
    pub bytes_moved: u64,
    /// Median estimated time to first token, in milliseconds.
    pub ttft_p50_ms: f64,
    /// 95th percentile estimated time to first token, in milliseconds.
    pub ttft_p95_ms: f64,
}

/// Nearest-rank percentile of `sorted` (ascending); 0 when empty.
pub fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (fraction * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The `fraction` percentile of a cluster replay's estimated times to first token, in
/// milliseconds.
fn ttft_ms(tally: &ClusterTally, fraction: f64) -> f64 {
    let mut sorted = tally.ttft_us.clone();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, fraction) / 1e3
}

impl PolicyReport {
    /// Summarizes one replay's outcome.
    pub fn new(name: String, outcome: &Outcome) -> Self {
        let mut ttft = outcome.ttft_us.clone();
        ttft.sort_by(f64::total_cmp);
        Self {
            name,
            token_hit_ratio: outcome.hit_tokens as f64 / outcome.input_tokens.max(1) as f64,
            prefill_tokens_saved: outcome.hit_tokens,
            bytes_moved: outcome.bytes_moved,
            ttft_p50_ms: percentile(&ttft, 0.50) / 1e3,
            ttft_p95_ms: percentile(&ttft, 0.95) / 1e3,
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "token_hit_ratio": self.token_hit_ratio,
            "prefill_tokens_saved": self.prefill_tokens_saved,
            "bytes_moved": self.bytes_moved,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p95_ms": self.ttft_p95_ms,
        })
    }
}

/// A whole replay's report.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Where the trace came from.
    pub source: String,
    /// Requests replayed.
    pub requests: usize,
    /// The tiers, hottest first.
    pub tiers: Vec<TierSpec>,
    /// One entry per run, in run order.
    pub results: Vec<PolicyReport>,
    /// The live run against a cluster and its simulation, with `--live`.
    pub live: Option<LiveOutcome>,
}

impl Report {
    fn get(&self, name: &str) -> Option<&PolicyReport> {
        self.results.iter().find(|result| result.name == name)
    }

    /// Total capacity over every tier, in blocks.
    pub fn capacity_blocks(&self) -> usize {
        self.tiers.iter().map(|tier| tier.blocks).sum()
    }

    /// The fraction of the LRU→Belady hit-ratio gap kvtier closes, when all three ran on a
    /// single tier and the gap is not zero. 1 means as good as Belady; negative means worse
    /// than LRU. Over several tiers Belady per tier is no longer an optimum, so none.
    pub fn belady_gap_closed(&self) -> Option<f64> {
        self.gap_closed_by("kvtier")
    }

    /// The fraction of the LRU→Belady gap the run `name` closes (see
    /// [`Report::belady_gap_closed`]).
    pub fn gap_closed_by(&self, name: &str) -> Option<f64> {
        if self.tiers.len() != 1 {
            return None;
        }
        let (lru, belady, policy) = (self.get("lru")?, self.get("belady")?, self.get(name)?);
        let gap = belady.token_hit_ratio - lru.token_hit_ratio;
        (gap.abs() > f64::EPSILON).then(|| (policy.token_hit_ratio - lru.token_hit_ratio) / gap)
    }

    /// One JSON object: `capacity_blocks`, `tiers`, `requests`, `trace`, `policies` keyed
    /// by policy (each with `token_hit_ratio`, `prefill_tokens_saved`, `bytes_moved`,
    /// `ttft_p50_ms`, `ttft_p95_ms`), `lru_top_tier_only` with several tiers, and
    /// `belady_gap_closed` when defined.
    pub fn to_json(&self) -> String {
        let mut policies = serde_json::Map::new();
        for result in self
            .results
            .iter()
            .filter(|result| result.name != LRU_TOP_TIER_ONLY)
        {
            policies.insert(result.name.clone(), result.to_json());
        }
        let tiers: Vec<Value> = self
            .tiers
            .iter()
            .map(|tier| json!({"kind": tier.profile.kind.to_string(), "blocks": tier.blocks}))
            .collect();
        let mut object = json!({
            "capacity_blocks": self.capacity_blocks(),
            "tiers": tiers,
            "requests": self.requests,
            "trace": self.source,
            "policies": policies,
        });
        if let Some(top) = self.get(LRU_TOP_TIER_ONLY) {
            object[LRU_TOP_TIER_ONLY] = top.to_json();
        }
        if let Some(closed) = self.belady_gap_closed() {
            object["belady_gap_closed"] = json!(closed);
        }
        if let Some(live) = &self.live {
            object["live"] = json!({
                "token_hit_ratio": live.live.token_hit_ratio(),
                "simulated_token_hit_ratio": live.simulated.token_hit_ratio(),
                "difference": live.difference(),
                "relative_tolerance": AGREEMENT_TOLERANCE,
                "agrees": live.agrees(),
                "chunks_stored": live.live.stored,
                "chunks_skipped": live.live.skipped,
                "simulated_chunks_stored": live.simulated.stored,
                "simulated_chunks_skipped": live.simulated.skipped,
                "chunks_demoted": live.live.demoted,
                "simulated_chunks_demoted": live.simulated.demoted,
                "engines": live.engines,
                "chunks_replicated": live.live.replicated,
                "simulated_chunks_replicated": live.simulated.replicated,
                "chunks_verified": live.verified_chunks,
                "schedule_lag_max_ms": live.lag_max.as_secs_f64() * 1e3,
                "elapsed_s": live.elapsed.as_secs_f64(),
                "chunks_spilled": live.live.spilled,
                "simulated_chunks_spilled": live.simulated.spilled,
                "chunks_restored": live.live.restored,
                "simulated_chunks_restored": live.simulated.restored,
                "ssd_regions_reclaimed": live.live.regions_reclaimed,
                "simulated_ssd_regions_reclaimed": live.simulated.regions_reclaimed,
                "ttft_p50_ms": ttft_ms(&live.live, 0.5),
                "ttft_p95_ms": ttft_ms(&live.live, 0.95),
                "simulated_ttft_p50_ms": ttft_ms(&live.simulated, 0.5),
                "simulated_ttft_p95_ms": ttft_ms(&live.simulated, 0.95),
            });
        }
        object.to_string()
    }

    /// A human-readable table, one row per run.
    pub fn to_table(&self) -> String {
        let tiers: Vec<String> = self
            .tiers
            .iter()
            .map(|tier| format!("{}={}", tier.profile.kind, tier.blocks))
            .collect();
        let mut out = format!(
            "trace {} ({} requests), tiers {} blocks\n",
            self.source,
            self.requests,
            tiers.join(",")
        );
        let _ = writeln!(
            out,
            "{:<18} {:>9} {:>14} {:>12} {:>11} {:>11}",
            "policy", "hit ratio", "tokens saved", "moved GiB", "TTFT p50 ms", "TTFT p95 ms"
        );
        for result in &self.results {
            let _ = writeln!(
                out,
                "{:<18} {:>9.4} {:>14} {:>12.1} {:>11.1} {:>11.1}",
                result.name,
                result.token_hit_ratio,
                result.prefill_tokens_saved,
                result.bytes_moved as f64 / (1u64 << 30) as f64,
                result.ttft_p50_ms,
                result.ttft_p95_ms
            );
        }
        for name in ["kvtier", KVTIER_DIRECTORY] {
            if let Some(closed) = self.gap_closed_by(name) {
                let _ = writeln!(
                    out,
                    "{name} closes {:.1}% of the LRU→Belady gap",
                    closed * 100.0
                );
            }
        }
        if let Some(live) = &self.live {
            write_live_rows(&mut out, live);
        }
        out
    }
}

/// Appends the table's rows for the live cluster's run: its token hit ratio against the
/// replay of its directory core, and each side's counts and TTFT.
fn write_live_rows(out: &mut String, live: &LiveOutcome) {
    let _ = writeln!(
            out,
            "live cluster: token hit ratio {:.4} against {:.4} for its directory core replayed in process: {} (|difference| {:.4}, tolerance {:.0} % of the simulated ratio)",
            live.live.token_hit_ratio(),
            live.simulated.token_hit_ratio(),
            if live.agrees() { "they agree" } else { "they DISAGREE" },
            live.difference(),
            AGREEMENT_TOLERANCE * 100.0
        );
    let _ = writeln!(
            out,
            "  {} engine(s): chunks stored {} / skipped {} / demoted {} / replicated {} (simulated {} / {} / {} / {}), {} loaded chunks verified byte for byte, schedule lag at most {:.0} ms, {:.1} s",
            live.engines,
            live.live.stored,
            live.live.skipped,
            live.live.demoted,
            live.live.replicated,
            live.simulated.stored,
            live.simulated.skipped,
            live.simulated.demoted,
            live.simulated.replicated,
            live.verified_chunks,
            live.lag_max.as_secs_f64() * 1e3,
            live.elapsed.as_secs_f64()
        );
    let _ = writeln!(
            out,
            "  TTFT p50 {:.1} ms / p95 {:.1} ms (simulated {:.1} / {:.1}); chunks spilled to SSD {} / restored {}, regions reclaimed {} (simulated {} / {}, {})",
            ttft_ms(&live.live, 0.5),
            ttft_ms(&live.live, 0.95),
            ttft_ms(&live.simulated, 0.5),
            ttft_ms(&live.simulated, 0.95),
            live.live.spilled,
            live.live.restored,
            live.live.regions_reclaimed,
            live.simulated.spilled,
            live.simulated.restored,
            live.simulated.regions_reclaimed
        );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 0.5), 50.0);
        assert_eq!(percentile(&sorted, 0.95), 95.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile(&[3.0], 0.0), 3.0);
    }
}
