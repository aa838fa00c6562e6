//! The directory's limits and timings. Every table of the directory has a bound here;
//! when a bound is reached the operation that would grow the table gets a typed `Full`
//! error, and nothing already admitted is dropped.

use crate::model::Medium;
use crate::policy::cost::CostModel;
use crate::policy::lifecycle::LifecyclePolicy;
use crate::policy::placement::PlacementConfig;
use crate::policy::profiles::{ProfileFigures, TierKind, TierProfile};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// The model name of the namespace of objects stored by `kvtier ctl put`
/// (`kvtier_tools::ctl::objects::ctl_namespace`).
pub const CTL_MODEL: &str = "kvtier-ctl";

/// What recomputing (fetching again) 1 MiB of a `kvtier ctl` object costs, in
/// microseconds, when the operator set no cost for [`CTL_MODEL`]: as much as 1 MiB of KV
/// of a representative model (8 tokens of a Llama-3.1-8B in 16-bit, 128 KiB each) at the
/// default `prefill_us_per_token` (100 µs), so a `ctl` object takes the tier path an
/// engine's chunk of its size would.
pub const CTL_RECOMPUTE_US_PER_MIB: f64 = 800.0;

/// What recomputing one object of a namespace costs, set by the operator per model name
/// (`[namespaces."<model>"]` of `cluster.toml`; a reload applies it). Demotion, SSD spills
/// and replication keep a copy only where keeping it costs less.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum RecomputeCost {
    /// Prefill time of one token of the namespace, in microseconds, times the tokens of
    /// its chunk (`prefill_us_per_token`).
    PerToken(f64),
    /// Microseconds per MiB of the object, whatever its tokens (`recompute_us_per_mib`):
    /// for objects whose tokens say nothing of their worth, such as `kvtier ctl`'s.
    PerMib(f64),
}

impl RecomputeCost {
    /// Checks that the cost is a positive, finite number.
    pub fn validate(&self) -> Result<(), String> {
        let (name, value) = match self {
            RecomputeCost::PerToken(value) => ("prefill_us_per_token", *value),
            RecomputeCost::PerMib(value) => ("recompute_us_per_mib", *value),
        };
        if value.is_finite() && value > 0.0 {
            Ok(())
        } else {
            Err(format!("{name} must be a positive number"))
        }
    }
}

/// A salt group's quota in each pool of a medium (`None`: no bound but the pool's). A CPU
/// partition is its group's quota on its node already, so CPU pools take none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierQuota {
    pub cxl_bytes: Option<u64>,
    pub ssd_bytes: Option<u64>,
}

impl TierQuota {
    /// The quota in a pool of `medium`.
    pub fn of(&self, medium: crate::model::Medium) -> Option<u64> {
        match medium {
            crate::model::Medium::Cpu => None,
            crate::model::Medium::Cxl => self.cxl_bytes,
            crate::model::Medium::Ssd => self.ssd_bytes,
        }
    }
}

/// Limits and timings of one directory. The defaults size a directory for a few hundred
/// nodes and tens of millions of cached chunks on one host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DirectoryConfig {
    /// Replica records (one per cached copy, any state). At ~120 bytes of directory memory
    /// each, the default is about 8 GiB of metadata: far above what the pools of a
    /// directory's nodes hold at 256 KiB chunks.
    pub replicas_max: u32,
    /// Live leases over all sessions: readers in flight at once.
    pub leases_max: u32,
    /// Live leases of one session: keeps one runaway engine from taking every lease.
    pub leases_per_session_max: u32,
    /// Delegations one node session holds at once (each also a lease of the session): the
    /// replicas it answers hits on without asking ([`super::delegations`]). 0 turns
    /// delegation off: every hit then asks the directory.
    pub delegations_per_session_max: u32,
    /// Node names ever seen; node ids are never reused while the directory runs.
    pub nodes_max: u32,
    /// Live and suspect sessions (about one per node).
    pub sessions_max: u32,
    /// Fenced or closed sessions kept so `resolve` can answer for their operations.
    pub retired_sessions_max: u32,
    /// Registered pools over all nodes and domains.
    pub pools_max: u32,
    /// Registered namespaces (model revisions × layouts in service).
    pub namespaces_max: u32,
    /// Registered namespaces of one salt (one tenant, or the tenants that share its salt;
    /// unsalted namespaces count as one salt): a tenant varying its descriptors (revision,
    /// layers) cannot take the whole namespace table from the others. (`namespaces_max`
    /// binds first where it is the smaller.)
    pub namespaces_per_salt_max: u32,
    /// Unacknowledged operation outcomes kept per session: the node's window of
    /// operations in flight. Full means the node must acknowledge before sending more.
    pub ledger_entries_per_session_max: u32,
    /// Items in one batched request (probe, acquire, release, holdings, `ReserveMany`,
    /// `CommitMany`). Nodes split larger work, a client's store batch included, into
    /// chunks of this many, so any value of at least 1 works.
    pub batch_items_max: u32,
    /// Tasks handed out by one `poll_tasks`.
    pub tasks_per_poll_max: u32,
    /// Extents of shared pools one session holds at once.
    pub extents_per_session_max: u32,
    /// A pool above this percentage of its capacity (reserved + ready) evicts ...
    pub high_watermark_percent: u8,
    /// ... until it is at or below this percentage.
    pub low_watermark_percent: u8,
    /// Least recently used READY replicas considered per eviction (the victim policy picks
    /// the least valuable among them).
    pub eviction_window: u32,
    /// Evictions started by one `tick`, so one tick stays short.
    pub evictions_per_tick_max: u32,
    /// Least accesses, the current one included, before a wear-limited pool (SSD) admits
    /// an object, written or demoted ([`PlacementConfig::wear_admit_frequency_min`]).
    pub wear_admit_frequency_min: u32,
    /// Reservations one session holds at once (stores in flight).
    pub reservations_per_session_max: u32,
    /// How long a lease protects a replica without being released.
    #[serde(
        rename = "lease_duration_ms",
        with = "crate::model::time::milliseconds"
    )]
    pub lease_duration: Duration,
    /// How long a reservation waits for its commit before its bytes are returned.
    #[serde(
        rename = "reservation_duration_ms",
        with = "crate::model::time::milliseconds"
    )]
    pub reservation_duration: Duration,
    /// Silence after which a session is suspect: its host replicas are hidden.
    #[serde(rename = "suspect_after_ms", with = "crate::model::time::milliseconds")]
    pub suspect_after: Duration,
    /// Silence after which a suspect session is fenced: its epoch ends and its host
    /// pools are dropped.
    #[serde(rename = "fence_after_ms", with = "crate::model::time::milliseconds")]
    pub fence_after: Duration,
    /// How long a node has to acknowledge a task before it is handed out again.
    #[serde(
        rename = "task_ack_timeout_ms",
        with = "crate::model::time::milliseconds"
    )]
    pub task_ack_timeout: Duration,
    /// How long a drain may go without progress (a replica relocated, or its node's leases
    /// and reservations ended) before it is reported stuck, with the reason, in `kvtier ctl
    /// status`, the log and `kvtier_drains{state="stuck"}`; `ctl drain --wait` then fails
    /// with it. A stuck drain keeps trying. Twice the default lease, so readers that come
    /// and go never make a drain stuck.
    #[serde(rename = "drain_stall_ms", with = "crate::model::time::milliseconds")]
    pub drain_stall: Duration,
    /// This directory's incarnation, carried in every session id it opens: a process
    /// sets a fresh one at each start (a simulation derives it from its seed), so a node
    /// presenting a session of an earlier incarnation is told `UnknownSession` and rejoins.
    #[serde(skip, default = "default_incarnation")]
    pub incarnation: u16,
    /// Items of rejoin reports (extent claims and adopted replicas) the directory takes
    /// per tick, over all nodes: a rack of nodes rejoining at once is paced (each is told
    /// when to come back) so that serving the others stays within its latency budget.
    pub adopt_items_per_tick: u32,
    /// Seed of the object index's hash function and of the transfer tokens' key. Absent
    /// (in service), each directory draws random ones, so clients cannot choose object ids
    /// that collide in the index nor guess a transfer's token; a simulation or a property
    /// test sets it so that runs replay.
    pub hash_seed: Option<u64>,
    /// Host pools one node may register (its CPU partitions, at most
    /// [`crate::config::CPU_PARTITIONS_MAX`], and an SSD pool): bounds what one node
    /// certificate can add to the pool table.
    pub pools_per_node_max: u32,
    /// Prefill time of one token, in microseconds, for a model not named in
    /// `prefill_us_per_token_by_model`: what recomputing an evicted chunk costs. A
    /// representative mid-size model on one GPU.
    pub prefill_us_per_token: f64,
    /// Prefill time per token by model name (the namespace's `model`), measured by the
    /// operator on the serving hardware. Bounded by the configuration file.
    pub prefill_us_per_token_by_model: BTreeMap<String, f64>,
    /// What recomputing an object of a namespace costs, by model name (`[namespaces."<model>"]`
    /// of `cluster.toml`): wins over `prefill_us_per_token_by_model`, and a reload applies it
    /// ([`RecomputeCost`]).
    #[serde(skip)]
    pub namespace_costs: BTreeMap<String, RecomputeCost>,
    /// The most bytes each salt group's live objects may take in one pool, by medium (the
    /// `cxl_bytes` and `ssd_bytes` of its `[[tenants]]` rules; a reload applies them): a
    /// group at its quota in a pool gets no more room there, and eviction takes its own
    /// coldest replicas there ([`TierQuota`]).
    #[serde(skip)]
    pub group_quotas: BTreeMap<crate::model::SaltGroup, TierQuota>,
    /// How many seconds of policy time one second of the directory's clock is: 1 in
    /// service. A trace replayed N times faster than recorded (`kvtier replay --live`)
    /// sets N, so idle times weigh in eviction as they did in the trace.
    pub policy_time_scale: f64,
    /// Time to live of READY replicas by medium (`[directory.limits.ttl.cpu]`): idle past
    /// `resident_ttl_ms` + `expiring_grace_ms`, a replica leaves its pool — demoted one tier
    /// colder with `spill_on_expiry`, else freed. A medium without one keeps replicas until
    /// pressure evicts them.
    pub ttl: BTreeMap<Medium, LifecyclePolicy>,
    /// Operator overrides of tier profiles by medium (`[profiles.<medium>]` of
    /// `cluster.toml`): they win over what nodes measure.
    #[serde(skip)]
    pub profiles: BTreeMap<Medium, ProfileFigures>,
    /// Acquire misses of one node for an object held only where that node cannot map it,
    /// after which the directory replicates the object towards the node
    /// ([`crate::directory::replication`]). 0 turns replication off.
    pub replicate_after_misses: u32,
    /// Whether a node that shares no domain pool with the source gets its copy over the
    /// network, into its own CPU pool.
    pub replicate_over_network: bool,
}

impl DirectoryConfig {
    /// Checks what the types cannot: non-zero bounds, ordered timings and watermarks.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(name) = self.zero_bound() {
            return Err(format!("{name} must be positive"));
        }
        if self.suspect_after.is_zero() || self.fence_after <= self.suspect_after {
            return Err("timings must satisfy 0 < suspect_after_ms < fence_after_ms".into());
        }
        if self.lease_duration.is_zero()
            || self.reservation_duration.is_zero()
            || self.task_ack_timeout.is_zero()
            || self.drain_stall.is_zero()
        {
            return Err(
                "lease, reservation, task-acknowledgement and drain-stall durations must be positive"
                    .into(),
            );
        }
        let costs = std::iter::once(("default", self.prefill_us_per_token)).chain(
            self.prefill_us_per_token_by_model
                .iter()
                .map(|(model, cost)| (model.as_str(), *cost)),
        );
        for (model, cost) in costs {
            if !(cost.is_finite() && cost > 0.0) {
                return Err(format!(
                    "prefill_us_per_token of {model} must be a positive number"
                ));
            }
        }
        for (model, cost) in &self.namespace_costs {
            cost.validate()
                .map_err(|reason| format!("namespaces.\"{model}\": {reason}"))?;
        }
        if !(self.policy_time_scale.is_finite() && self.policy_time_scale > 0.0) {
            return Err("policy_time_scale must be a positive number".into());
        }
        if let Some((medium, _)) = self
            .ttl
            .iter()
            .find(|(_, policy)| policy.resident_ttl_ms == 0)
        {
            return Err(format!(
                "ttl.{}: resident_ttl_ms must be positive",
                medium.name()
            ));
        }
        for (medium, figures) in &self.profiles {
            figures
                .apply(&TierProfile::representative(TierKind::of_medium(*medium)))
                .map_err(|error| format!("profiles.{}: {error}", medium.name()))?;
        }
        if self.low_watermark_percent > self.high_watermark_percent
            || self.high_watermark_percent > 100
        {
            return Err("watermarks must satisfy low <= high <= 100".into());
        }
        Ok(())
    }

    /// The name of the first bound that is zero, if any.
    fn zero_bound(&self) -> Option<&'static str> {
        [
            ("replicas_max", self.replicas_max),
            ("leases_max", self.leases_max),
            ("leases_per_session_max", self.leases_per_session_max),
            ("sessions_max", self.sessions_max),
            ("pools_per_node_max", self.pools_per_node_max),
            ("namespaces_per_salt_max", self.namespaces_per_salt_max),
            ("batch_items_max", self.batch_items_max),
            (
                "ledger_entries_per_session_max",
                self.ledger_entries_per_session_max,
            ),
            (
                "reservations_per_session_max",
                self.reservations_per_session_max,
            ),
            ("tasks_per_poll_max", self.tasks_per_poll_max),
            ("extents_per_session_max", self.extents_per_session_max),
            ("eviction_window", self.eviction_window),
            ("evictions_per_tick_max", self.evictions_per_tick_max),
        ]
        .into_iter()
        .find(|(_, value)| *value == 0)
        .map(|(name, _)| name)
    }
}

impl DirectoryConfig {
    /// The seed of the object index: the configured one, else a random one drawn now.
    pub fn hash_seed_or_random(&self) -> u64 {
        use std::hash::BuildHasher;
        // std's RandomState is keyed from the operating system's randomness per process.
        self.hash_seed
            .unwrap_or_else(|| std::collections::hash_map::RandomState::new().hash_one(0x6b76_u16))
    }

    /// A 32-byte secret for `purpose`: random (from the OS) in service; derived from
    /// `hash_seed` and the incarnation where a simulation or a test sets the seed, so that
    /// runs replay and a restarted directory still draws a new secret, as in service.
    pub fn secret_key(&self, purpose: &str) -> [u8; 32] {
        match self.hash_seed {
            Some(seed) => {
                let mut material = [0; 10];
                material[..8].copy_from_slice(&seed.to_le_bytes());
                material[8..].copy_from_slice(&self.incarnation.to_le_bytes());
                blake3::derive_key(purpose, &material)
            }
            None => {
                let mut key = [0; 32];
                crate::model::random::fill(&mut key);
                key
            }
        }
    }

    /// The settings of kvtier's placement ([`crate::policy::placement`]) in force.
    pub fn placement(&self) -> PlacementConfig {
        PlacementConfig {
            wear_admit_frequency_min: self.wear_admit_frequency_min,
        }
    }

    /// The prefill time per token of `model`, in microseconds, from the directory's limits
    /// (`prefill_us_per_token_by_model`, else `prefill_us_per_token`).
    pub fn prefill_us_per_token_of(&self, model: &str) -> f64 {
        self.prefill_us_per_token_by_model
            .get(model)
            .copied()
            .unwrap_or(self.prefill_us_per_token)
    }

    /// What recomputing an object of `model` costs: the namespace's cost
    /// (`[namespaces."<model>"]`), else the prefill time of the limits; the objects of
    /// `kvtier ctl` ([`CTL_MODEL`]) are priced by their bytes
    /// ([`CTL_RECOMPUTE_US_PER_MIB`]) unless the operator says otherwise.
    pub fn recompute_cost_of(&self, model: &str) -> RecomputeCost {
        if let Some(cost) = self.namespace_costs.get(model) {
            return *cost;
        }
        if model == CTL_MODEL && !self.prefill_us_per_token_by_model.contains_key(model) {
            return RecomputeCost::PerMib(CTL_RECOMPUTE_US_PER_MIB);
        }
        RecomputeCost::PerToken(self.prefill_us_per_token_of(model))
    }

    /// The cost model and token count that price recomputing one object of `model`, of
    /// `chunk_tokens` tokens and `bytes` bytes ([`Directory`](super::Directory)'s demotion
    /// and replication decisions): a cost by bytes is spread over the object's tokens (at
    /// least one).
    pub fn recompute_model(&self, model: &str, chunk_tokens: u32, bytes: u64) -> (CostModel, u32) {
        match self.recompute_cost_of(model) {
            RecomputeCost::PerToken(prefill_us_per_token) => (
                CostModel {
                    prefill_us_per_token,
                },
                chunk_tokens,
            ),
            RecomputeCost::PerMib(us_per_mib) => {
                let tokens = chunk_tokens.max(1);
                let object_us = us_per_mib * bytes as f64 / (1u64 << 20) as f64;
                (
                    CostModel {
                        prefill_us_per_token: object_us / f64::from(tokens),
                    },
                    tokens,
                )
            }
        }
    }

    /// The profile a pool of `medium` has before any node measured it: the representative
    /// one with the operator's overrides.
    pub fn baseline_profile(&self, medium: Medium) -> TierProfile {
        let representative = TierProfile::representative(TierKind::of_medium(medium));
        self.profiles
            .get(&medium)
            .and_then(|figures| figures.apply(&representative).ok())
            .unwrap_or(representative)
    }
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            replicas_max: 64 << 20,
            leases_max: 1 << 20,
            leases_per_session_max: 1 << 18,
            delegations_per_session_max: 1 << 16,
            nodes_max: 4096,
            sessions_max: 4096,
            retired_sessions_max: 4096,
            pools_max: 16384,
            namespaces_max: 1024,
            namespaces_per_salt_max: 256,
            ledger_entries_per_session_max: 1 << 16,
            batch_items_max: 4096,
            tasks_per_poll_max: 1024,
            reservations_per_session_max: 1 << 16,
            extents_per_session_max: 4096,
            high_watermark_percent: 98,
            low_watermark_percent: 95,
            eviction_window: crate::policy::eviction::EVICTION_WINDOW as u32,
            evictions_per_tick_max: 4096,
            wear_admit_frequency_min: PlacementConfig::default().wear_admit_frequency_min,
            lease_duration: Duration::from_secs(30),
            reservation_duration: Duration::from_secs(30),
            suspect_after: Duration::from_secs(3),
            fence_after: Duration::from_secs(15),
            task_ack_timeout: Duration::from_secs(10),
            drain_stall: Duration::from_secs(60),
            incarnation: default_incarnation(),
            adopt_items_per_tick: 16_384,
            hash_seed: None,
            pools_per_node_max: 40,
            prefill_us_per_token: 100.0,
            prefill_us_per_token_by_model: BTreeMap::new(),
            namespace_costs: BTreeMap::new(),
            group_quotas: BTreeMap::new(),
            profiles: BTreeMap::new(),
            ttl: BTreeMap::new(),
            policy_time_scale: 1.0,
            replicate_after_misses: 1,
            replicate_over_network: true,
        }
    }
}

/// The incarnation of a directory nobody gave one: the first.
fn default_incarnation() -> u16 {
    1
}
