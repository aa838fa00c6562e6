//! The deterministic, metadata-only replay of a trace through a stack of tiers under one
//! eviction policy: prefix hits, prefill tokens saved, bytes moved between tiers and the
//! estimated time to first token of every request.
//!
//! The `kvtier` policy runs kvtier's policy as the directory core does — the same code:
//! eviction by [`kvtier::choose`] over per-class recency lists, a request's cached prefix
//! touched in [`kvtier::touch_order`], writes by [`placement::write_target`] and victims
//! demoted, spilled or dropped by [`placement::on_pressure`]; a hit is read where it lies.
//! It differs from the directory only by what the cluster does around the policy — here a
//! full tier makes room at once, where the directory evicts between watermarks on its
//! ticks, frees bytes once the owner reclaims them and skips stores while a pool is full —
//! and by what each knows: a replayed block says how many tokens it holds, so placement's
//! rule against partial one-timers acts here, while a store to the directory carries only
//! its length. The references (LRU, S3-FIFO,
//! Belady) write to the hottest tier that admits a block, send victims one tier colder
//! and promote hits to the hottest tier.

use std::collections::HashMap;

use crate::replay::eviction::{Access, Belady, Eviction, Kvtier, Lru, S3Fifo};
use kvtier_core::policy::cost::CostModel;
use kvtier_core::policy::eviction::{self as kvtier, KvtierConfig};
use kvtier_core::policy::history::History;
use kvtier_core::policy::placement::{
    self, Action, ColderTier, Incoming, PlacementConfig, Victim, WriteCandidate,
};
use kvtier_core::policy::profiles::TierProfile;
use kvtier_core::policy::BlockId;

use crate::workload::trace::{Request, BLOCK_TOKENS};

/// Most tiers in one replay: one per tier kind.
pub const TIERS_MAX: usize = 6;

/// The eviction policies a replay can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyKind {
    /// Least recently used in every tier; victims fall one tier colder; hits promote.
    Lru,
    /// S3-FIFO in every tier, moving like LRU.
    S3fifo,
    /// Belady's offline optimum in every tier (reads the future), moving like LRU.
    Belady,
    /// kvtier's eviction order and placement, the code the directory core runs.
    Kvtier,
}

/// One tier of a replay.
#[derive(Clone, Debug, PartialEq)]
pub struct TierSpec {
    /// Its profile (latency and bandwidth price the reads).
    pub profile: TierProfile,
    /// Its capacity, in blocks.
    pub blocks: usize,
}

/// Everything a replay needs besides the trace and the policy.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Tiers, hottest first; 1 to [`TIERS_MAX`].
    pub tiers: Vec<TierSpec>,
    /// KV bytes per token (a block takes `512 * bytes_per_token`).
    pub bytes_per_token: u64,
    /// The model's prefill cost.
    pub cost: CostModel,
    /// kvtier's placement settings. Its eviction settings follow each tier's capacity
    /// ([`KvtierConfig::for_capacity`]), as the directory's follow each pool's.
    pub placement: PlacementConfig,
}

/// Why a replay could not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The configuration has no tier, or more than [`TIERS_MAX`].
    #[error("a replay needs 1 to {TIERS_MAX} tiers, not {tiers}")]
    Tiers {
        /// Tiers configured.
        tiers: usize,
    },
}

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Prompt tokens of all requests.
    pub input_tokens: u64,
    /// Prompt tokens served from the cache.
    pub hit_tokens: u64,
    /// Bytes moved between tiers (demotions, spills, promotions).
    pub bytes_moved: u64,
    /// Estimated time to first token of each request, in microseconds, in trace order.
    pub ttft_us: Vec<f64>,
}

/// The next request index using each access of the trace, flattened in trace order
/// (`None`: never used again). Belady's oracle.
pub fn next_uses(requests: &[Request]) -> Vec<Option<u64>> {
    let total: usize = requests.iter().map(|request| request.hash_ids.len()).sum();
    let mut out = vec![None; total];
    let mut seen: HashMap<BlockId, u64> = HashMap::new();
    let mut end = total;
    for (index, request) in requests.iter().enumerate().rev() {
        end -= request.hash_ids.len();
        for (slot, block) in request.hash_ids.iter().enumerate() {
            out[end + slot] = seen.get(block).copied();
        }
        for block in &request.hash_ids {
            seen.insert(*block, index as u64);
        }
    }
    out
}

/// What the replay remembers of a resident block.
#[derive(Clone, Copy, Debug)]
struct Resident {
    tier: usize,
    /// Its latest access.
    access: Access,
}

struct Tier {
    spec: TierSpec,
    order: Box<dyn Eviction>,
}

/// A stack of tiers under one policy.
struct Stack<'a> {
    policy: PolicyKind,
    config: &'a SimConfig,
    tiers: Vec<Tier>,
    resident: HashMap<BlockId, Resident>,
    history: History,
    block_bytes: u64,
    bytes_moved: u64,
}

fn order(policy: PolicyKind, blocks: usize, block_bytes: u64) -> Box<dyn Eviction> {
    match policy {
        PolicyKind::Lru => Box::new(Lru::new(blocks)),
        PolicyKind::S3fifo => Box::new(S3Fifo::new(blocks)),
        PolicyKind::Belady => Box::new(Belady::new(blocks)),
        PolicyKind::Kvtier => {
            let config = KvtierConfig::for_capacity(u64::try_from(blocks).unwrap_or(u64::MAX));
            Box::new(Kvtier::new(blocks, block_bytes, config))
        }
    }
}

impl<'a> Stack<'a> {
    fn new(policy: PolicyKind, config: &'a SimConfig) -> Self {
        let block_bytes = u64::from(BLOCK_TOKENS).saturating_mul(config.bytes_per_token);
        let tiers = config
            .tiers
            .iter()
            .map(|spec| Tier {
                spec: spec.clone(),
                order: order(policy, spec.blocks, block_bytes),
            })
            .collect();
        Self {
            policy,
            config,
            tiers,
            resident: HashMap::new(),
            history: History::new(),
            block_bytes,
            bytes_moved: 0,
        }
    }

    /// Makes room in `tier` and inserts the block there; false when no room could be made
    /// (kvtier keeps blocks younger than its minimum residency).
    fn place(&mut self, tier: usize, access: Access, now_ms: u64) -> bool {
        while self.tiers[tier].order.len() >= self.tiers[tier].order.capacity() {
            let Some(victim) = self.tiers[tier].order.evict(now_ms, &self.history) else {
                return false;
            };
            self.displace(tier, victim, now_ms);
        }
        self.tiers[tier].order.insert(&access);
        self.resident
            .insert(access.block, Resident { tier, access });
        true
    }

    /// Where a block evicted from `tier` goes: kvtier's placement decides, the
    /// references send it one tier colder when that tier admits it.
    fn colder_target(&self, tier: usize, access: &Access, now_ms: u64) -> Option<usize> {
        if self.policy != PolicyKind::Kvtier {
            return Some(tier + 1).filter(|next| {
                self.tiers
                    .get(*next)
                    .is_some_and(|colder| colder.order.admit(access, now_ms, &self.history))
            });
        }
        let colder: Vec<(usize, ColderTier<'_>)> = self
            .tiers
            .iter()
            .enumerate()
            .skip(tier + 1)
            .map(|(index, colder)| {
                let target = ColderTier {
                    profile: &colder.spec.profile,
                    has_room: colder.spec.blocks > 0,
                    holds_object: false,
                };
                (index, target)
            })
            .collect();
        let victim = Victim {
            bytes: self.block_bytes,
            tokens: access.tokens,
            frequency: access.frequency,
        };
        let decision =
            placement::on_pressure(&victim, &colder, &self.config.placement, &self.config.cost);
        match decision.action {
            Action::Demote { to } | Action::Spill { to } => Some(to),
            Action::Evict => None,
        }
    }

    /// Sends a victim evicted from `tier` colder, or drops it.
    fn displace(&mut self, tier: usize, victim: BlockId, now_ms: u64) {
        let Some(resident) = self.resident.remove(&victim) else {
            return;
        };
        let Some(target) = self.colder_target(tier, &resident.access, now_ms) else {
            return;
        };
        if self.place(target, resident.access, now_ms) {
            self.bytes_moved += self.block_bytes;
        }
    }

    /// Writes a block that is nowhere: kvtier's placement picks the first tier of the
    /// write order (hottest first) that admits it; the references the hottest tier
    /// whose order admits it.
    fn write(&mut self, access: Access, now_ms: u64) {
        let target = if self.policy == PolicyKind::Kvtier {
            let candidates = self.tiers.iter().enumerate().map(|(index, tier)| {
                let candidate = WriteCandidate {
                    wear_limited: tier.spec.profile.wear_limited,
                    has_room: tier.spec.blocks > 0,
                };
                (index, candidate)
            });
            let incoming = Incoming {
                frequency: access.frequency,
                partial: access.tokens < BLOCK_TOKENS,
            };
            placement::write_target(candidates, &incoming, &self.config.placement).0
        } else {
            (0..self.tiers.len()).find(|tier| {
                self.tiers[*tier]
                    .order
                    .admit(&access, now_ms, &self.history)
            })
        };
        if let Some(tier) = target {
            self.place(tier, access, now_ms);
        }
    }

    /// Handles an access to a resident block: touch it where it is; the references then
    /// promote it to the hottest tier.
    fn hit(&mut self, resident: Resident, access: Access, now_ms: u64) {
        let tier = resident.tier;
        self.tiers[tier].order.touch(&access);
        self.resident
            .insert(access.block, Resident { tier, access });
        let promote = self.policy != PolicyKind::Kvtier
            && tier > 0
            && self.tiers[0].order.admit(&access, now_ms, &self.history);
        if promote {
            self.tiers[tier].order.remove(access.block);
            self.resident.remove(&access.block);
            if self.place(0, access, now_ms) {
                self.bytes_moved += self.block_bytes;
            }
        }
    }

    /// The leading blocks of `request` that are resident, and its estimated time to first
    /// token, in microseconds, with them read and the rest prefilled.
    fn lookup(&self, request: &Request) -> (usize, u64, f64) {
        let mut hit_tokens = 0u64;
        let mut ttft_us = 0.0;
        let mut hits = 0;
        for (position, block) in request.hash_ids.iter().enumerate() {
            let Some(resident) = self.resident.get(block) else {
                break;
            };
            let tokens = request.block_tokens(position);
            hits += 1;
            hit_tokens += u64::from(tokens);
            ttft_us += self.config.cost.serve_us(
                &self.tiers[resident.tier].spec.profile,
                self.block_bytes,
                tokens,
            );
        }
        let missed = u64::from(request.input_tokens).saturating_sub(hit_tokens);
        let ttft_us = ttft_us + missed as f64 * self.config.cost.prefill_us_per_token;
        (hits, hit_tokens, ttft_us)
    }

    /// Serves one request: measures its hit and TTFT, then records its blocks — kvtier as
    /// the directory sees a request (the cached prefix read in `touch_order`, then the
    /// rest stored in prompt order), the references in prompt order.
    fn request(
        &mut self,
        request: &Request,
        next_uses: &[Option<u64>],
        ttft: &mut Vec<f64>,
    ) -> u64 {
        let now_ms = request.timestamp_ms;
        let (hits, hit_tokens, ttft_us) = self.lookup(request);
        ttft.push(ttft_us);
        let blocks = request.hash_ids.len();
        let positions: Vec<usize> = if self.policy == PolicyKind::Kvtier {
            kvtier::touch_order(hits).chain(hits..blocks).collect()
        } else {
            (0..blocks).collect()
        };
        for position in positions {
            let block = request.hash_ids[position];
            let stats = self.history.record(block, now_ms);
            let access = Access {
                block,
                tokens: request.block_tokens(position),
                frequency: stats.count,
                now_ms,
                next_use: next_uses.get(position).copied().flatten(),
            };
            match self.resident.get(&block).copied() {
                Some(resident) => self.hit(resident, access, now_ms),
                None => self.write(access, now_ms),
            }
        }
        hit_tokens
    }
}

/// Replays `requests` under `policy`. `next_uses` comes from [`next_uses`] on the same
/// requests. `progress` is called after each request with the count done. Deterministic:
/// the same inputs give the same outcome. Fails only on a configuration of no tier or
/// more than [`TIERS_MAX`].
pub fn simulate(
    requests: &[Request],
    next_uses: &[Option<u64>],
    policy: PolicyKind,
    config: &SimConfig,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<Outcome, SimError> {
    if !(1..=TIERS_MAX).contains(&config.tiers.len()) {
        return Err(SimError::Tiers {
            tiers: config.tiers.len(),
        });
    }
    let mut stack = Stack::new(policy, config);
    let mut outcome = Outcome {
        ttft_us: Vec::with_capacity(requests.len()),
        ..Outcome::default()
    };
    let mut offset = 0;
    for (index, request) in requests.iter().enumerate() {
        let end = (offset + request.hash_ids.len()).min(next_uses.len());
        let uses = next_uses.get(offset..end).unwrap_or(&[]);
        outcome.hit_tokens += stack.request(request, uses, &mut outcome.ttft_us);
        outcome.input_tokens += u64::from(request.input_tokens);
        offset = end;
        progress(
            index + 1,
            outcome.hit_tokens as f64 / outcome.input_tokens.max(1) as f64,
        );
    }
    outcome.bytes_moved = stack.bytes_moved;
    let held: usize = stack.tiers.iter().map(|tier| tier.order.len()).sum();
    assert_eq!(
        held,
        stack.resident.len(),
        "every resident block is held by exactly one tier"
    );
    Ok(outcome)
}
