//! What a replay through the cluster counts (hits, stores, moves, each request's estimated
//! time to first token) and the cost model that prices a request's hits.

use crate::replay::tiers::Outcome;
use crate::workload::trace::Request;
use kvtier_core::model::Medium;
use kvtier_core::policy::cost::CostModel;
use kvtier_core::policy::profiles::TierProfile;

/// The cost model that turns hits into an estimated time to first token: the model's
/// prefill cost, and the profile and block size the cached blocks are read at.
#[derive(Clone, Debug, PartialEq)]
pub struct Pricing {
    pub cost: CostModel,
    /// The profile a CPU pool's hits are read at (DRAM).
    pub cpu: TierProfile,
    /// The profile a CXL pool's hits are read at.
    pub cxl: TierProfile,
    /// The profile a chunk restored from SSD is read at.
    pub ssd: TierProfile,
    /// Bytes of a 512-token block of the modelled model (not the replayed chunk's size).
    pub block_bytes: u64,
}

impl Pricing {
    /// Estimated time to first token of `request` when its first blocks were read from
    /// the cache, from the media in `loaded`, and the rest is prefilled, in microseconds.
    pub fn ttft_us(&self, request: &Request, loaded: &[Medium]) -> f64 {
        let served: f64 = loaded
            .iter()
            .enumerate()
            .map(|(position, medium)| {
                let profile = match medium {
                    Medium::Cxl => &self.cxl,
                    Medium::Ssd => &self.ssd,
                    Medium::Cpu => &self.cpu,
                };
                self.cost
                    .serve_us(profile, self.block_bytes, request.block_tokens(position))
            })
            .sum();
        let hit: u64 = (0..loaded.len())
            .map(|position| u64::from(request.block_tokens(position)))
            .sum();
        let missed = u64::from(request.input_tokens).saturating_sub(hit);
        served + missed as f64 * self.cost.prefill_us_per_token
    }
}

/// The hit accounting of one replay through a cluster (simulated or live).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterTally {
    /// Prompt tokens of all requests.
    pub input_tokens: u64,
    /// Prompt tokens served from the cache: the leading blocks found and read.
    pub hit_tokens: u64,
    /// Chunks written.
    pub stored: u64,
    /// Stores refused for want of room.
    pub skipped: u64,
    /// Chunks copied one tier colder by demotion.
    pub demoted: u64,
    /// Chunks copied towards an engine that missed them where it could not map them.
    pub replicated: u64,
    /// Chunks spilled to an SSD store.
    pub spilled: u64,
    /// Chunks restored from an SSD store by a load.
    pub restored: u64,
    /// SSD regions the stores reclaimed whole to make room.
    pub regions_reclaimed: u64,
    /// Estimated time to first token of each request, in microseconds, in trace order.
    pub ttft_us: Vec<f64>,
}

impl ClusterTally {
    /// Hit tokens over input tokens.
    pub fn token_hit_ratio(&self) -> f64 {
        self.hit_tokens as f64 / self.input_tokens.max(1) as f64
    }

    /// Counts one request whose first blocks came from the cache, from the media in
    /// `loaded`.
    pub fn count_request(&mut self, request: &Request, loaded: &[Medium], pricing: &Pricing) {
        self.input_tokens += u64::from(request.input_tokens);
        self.hit_tokens += (0..loaded.len())
            .map(|position| u64::from(request.block_tokens(position)))
            .sum::<u64>();
        self.ttft_us.push(pricing.ttft_us(request, loaded));
    }

    /// The replay outcome these counts make; the bytes moved between tiers are the
    /// demoted chunks at `block_bytes` each.
    pub fn outcome(&self, block_bytes: u64) -> Outcome {
        Outcome {
            input_tokens: self.input_tokens,
            hit_tokens: self.hit_tokens,
            bytes_moved: self.demoted.saturating_mul(block_bytes),
            ttft_us: self.ttft_us.clone(),
        }
    }
}
