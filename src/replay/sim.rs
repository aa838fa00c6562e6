//! The deterministic, metadata-only replay of a trace through a stack of tiers under one
//! eviction policy: prefix hits, prefill tokens saved, bytes moved between tiers and the
//! estimated time to first token of every request.

use std::collections::HashMap;

use crate::policy::cost::CostModel;
use crate::policy::eviction::{Access, Belady, Eviction, Kvtier, KvtierConfig, Lru, S3Fifo};
use crate::policy::history::History;
use crate::policy::placement::{
    self, Action, Candidate, PlacementConfig, PlacementError, TierState,
};
use crate::policy::profiles::TierProfile;
use crate::policy::BlockId;

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
    /// kvtier's order, admission and placement decisions.
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
    /// kvtier's placement settings.
    pub placement: PlacementConfig,
    /// kvtier's eviction settings.
    pub kvtier: KvtierConfig,
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
    access: Access,
    parent: Option<BlockId>,
    entered_ms: u64,
    moved_ms: Option<u64>,
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

fn order(policy: PolicyKind, blocks: usize, config: &KvtierConfig) -> Box<dyn Eviction> {
    match policy {
        PolicyKind::Lru => Box::new(Lru::new(blocks)),
        PolicyKind::S3fifo => Box::new(S3Fifo::new(blocks)),
        PolicyKind::Belady => Box::new(Belady::new(blocks)),
        PolicyKind::Kvtier => Box::new(Kvtier::new(blocks, *config)),
    }
}

impl<'a> Stack<'a> {
    fn new(policy: PolicyKind, config: &'a SimConfig) -> Self {
        let tiers = config
            .tiers
            .iter()
            .take(TIERS_MAX)
            .map(|spec| Tier {
                spec: spec.clone(),
                order: order(policy, spec.blocks, &config.kvtier),
            })
            .collect();
        Self {
            policy,
            config,
            tiers,
            resident: HashMap::new(),
            history: History::new(),
            block_bytes: u64::from(BLOCK_TOKENS).saturating_mul(config.bytes_per_token),
            bytes_moved: 0,
        }
    }

    fn states(&self, pressed: usize) -> Vec<TierState> {
        self.tiers
            .iter()
            .enumerate()
            .map(|(index, tier)| TierState {
                profile: tier.spec.profile.clone(),
                capacity_bytes: tier.spec.blocks as u64 * self.block_bytes,
                used_bytes: tier.order.len() as u64 * self.block_bytes,
                pending_bytes: if index == pressed {
                    self.block_bytes
                } else {
                    0
                },
            })
            .collect()
    }

    fn candidate(&self, resident: &Resident) -> Candidate {
        Candidate {
            bytes: self.block_bytes,
            tokens: resident.access.tokens,
            frequency: resident.access.frequency,
            tier: resident.tier,
            entered_tier_ms: resident.entered_ms,
            moved_ms: resident.moved_ms,
            leased: false,
            filling: false,
        }
    }

    /// Makes room in `tier` and inserts the block there.
    fn place(
        &mut self,
        tier: usize,
        mut resident: Resident,
        now_ms: u64,
    ) -> Result<(), PlacementError> {
        while self.tiers[tier].order.len() >= self.tiers[tier].order.capacity() {
            let Some(victim) = self.tiers[tier].order.evict(now_ms, &self.history) else {
                return Ok(());
            };
            self.displace(tier, victim, now_ms)?;
        }
        resident.tier = tier;
        resident.entered_ms = now_ms;
        self.tiers[tier].order.insert(&resident.access);
        self.resident.insert(resident.access.block, resident);
        Ok(())
    }

    /// Sends a victim evicted from `tier` colder, or drops it.
    fn displace(
        &mut self,
        tier: usize,
        victim: BlockId,
        now_ms: u64,
    ) -> Result<(), PlacementError> {
        let Some(mut resident) = self.resident.remove(&victim) else {
            return Ok(());
        };
        let target = match self.policy {
            PolicyKind::Kvtier => {
                let decision = placement::on_pressure(
                    &self.candidate(&resident),
                    &self.states(tier),
                    &self.config.placement,
                    &self.config.cost,
                    now_ms,
                )?;
                match decision.action {
                    Action::Demote { to } | Action::Spill { to } => Some(to),
                    Action::Evict => None,
                    Action::Keep | Action::Promote { .. } => {
                        unreachable!("replay has no leases, no minimum residency and a full tier: {decision:?}")
                    }
                }
            }
            _ => Some(tier + 1).filter(|next| *next < self.tiers.len()),
        };
        let Some(target) = target else { return Ok(()) };
        resident.access.parent_resident = resident
            .parent
            .is_none_or(|parent| self.resident.contains_key(&parent));
        if self.tiers[target]
            .order
            .admit(&resident.access, now_ms, &self.history)
        {
            resident.moved_ms = Some(now_ms);
            self.bytes_moved += self.block_bytes;
            self.place(target, resident, now_ms)?;
        }
        Ok(())
    }

    /// Handles an access to a resident block: touch, then maybe promote.
    fn hit(
        &mut self,
        mut resident: Resident,
        access: Access,
        now_ms: u64,
    ) -> Result<(), PlacementError> {
        let tier = resident.tier;
        resident.access = access;
        self.tiers[tier].order.touch(&access);
        self.resident.insert(access.block, resident);
        let promote = match self.policy {
            PolicyKind::Kvtier => {
                let decision = placement::on_access(
                    &self.candidate(&resident),
                    &self.states(0),
                    &self.config.placement,
                    now_ms,
                )?;
                matches!(decision.action, Action::Promote { .. })
            }
            _ => tier > 0,
        };
        if promote && self.tiers[0].order.admit(&access, now_ms, &self.history) {
            self.tiers[tier].order.remove(access.block);
            self.resident.remove(&access.block);
            resident.moved_ms = Some(now_ms);
            self.bytes_moved += self.block_bytes;
            self.place(0, resident, now_ms)?;
        }
        Ok(())
    }

    /// Serves one request: measures its hit and TTFT, then records its blocks.
    fn request(
        &mut self,
        request: &Request,
        next_uses: &[Option<u64>],
        ttft: &mut Vec<f64>,
    ) -> Result<u64, PlacementError> {
        let now_ms = request.timestamp_ms;
        let mut hit_tokens = 0u64;
        let mut ttft_us = 0.0;
        for (position, block) in request.hash_ids.iter().enumerate() {
            let Some(resident) = self.resident.get(block) else {
                break;
            };
            let tokens = request.block_tokens(position);
            hit_tokens += u64::from(tokens);
            ttft_us += self.config.cost.serve_us(
                &self.tiers[resident.tier].spec.profile,
                self.block_bytes,
                tokens,
            );
        }
        let missed = u64::from(request.input_tokens) - hit_tokens;
        ttft.push(ttft_us + missed as f64 * self.config.cost.prefill_us_per_token);
        let mut parent = None;
        for (position, block) in request.hash_ids.iter().enumerate() {
            let stats = self.history.record(*block, now_ms);
            let access = Access {
                block: *block,
                depth: position as u32,
                tokens: request.block_tokens(position),
                parent_resident: parent.is_none_or(|parent| self.resident.contains_key(&parent)),
                frequency: stats.count,
                now_ms,
                next_use: next_uses.get(position).copied().flatten(),
            };
            match self.resident.get(block).copied() {
                Some(resident) => self.hit(resident, access, now_ms)?,
                None => {
                    // Written to the hottest tier that admits it (the node's write order).
                    let admitting = (0..self.tiers.len()).find(|tier| {
                        self.tiers[*tier]
                            .order
                            .admit(&access, now_ms, &self.history)
                    });
                    if let Some(tier) = admitting {
                        let resident = Resident {
                            tier,
                            access,
                            parent,
                            entered_ms: now_ms,
                            moved_ms: None,
                        };
                        self.place(tier, resident, now_ms)?;
                    }
                }
            }
            parent = Some(*block);
        }
        Ok(hit_tokens)
    }
}

/// Replays `requests` under `policy`. `next_uses` comes from [`next_uses`] on the same
/// requests. `progress` is called after each request with the count done. Deterministic:
/// the same inputs give the same outcome. Fails only on an invalid placement snapshot
/// (no tier, inverted watermarks).
pub fn simulate(
    requests: &[Request],
    next_uses: &[Option<u64>],
    policy: PolicyKind,
    config: &SimConfig,
    progress: &mut dyn FnMut(usize),
) -> Result<Outcome, PlacementError> {
    if config.tiers.is_empty() {
        return Err(PlacementError::UnknownTier { tier: 0, tiers: 0 });
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
        outcome.hit_tokens += stack.request(request, uses, &mut outcome.ttft_us)?;
        outcome.input_tokens += u64::from(request.input_tokens);
        offset = end;
        progress(index + 1);
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
