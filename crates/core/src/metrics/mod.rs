//! Prometheus metrics: the process's registry, the `kvtier_*` families and their label
//! vocabularies (this module), and the minimal HTTP exporter that serves them at
//! `GET /metrics` (`exporter`).
//!
//! Labels are bounded by construction: operations, states, media and directions are enums;
//! pools are few and capped by [`POOL_LABELS_MAX`]; error labels are `&'static str` kinds
//! from the error enums. No object, replica, lease or session id is ever a label.
//!
//! Values are pushed by the roles that own them (a pool actor sets its usage, a session
//! observes each request); nothing here reads a clock: durations arrive measured.

pub mod delegation;
pub mod election;
pub mod exporter;
pub mod link;
pub mod peer;
pub mod replication;
pub mod scrape;
pub mod ssd;

pub use exporter::serve;

use crate::model::Medium;
use crate::model::PoolId;
use crate::policy::profiles::Measurement;
use prometheus::{
    GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Distinct pools labelled at once. A cluster has a few pools per node; 1024 covers hundreds
/// of nodes while bounding the series count if pool ids churn. Pools beyond it are not
/// exported and counted in `kvtier_metrics_label_drops_total`.
pub const POOL_LABELS_MAX: usize = 1024;

/// The values of the `figure` label of `kvtier_pool_profile`.
const PROFILE_FIGURES: [&str; 3] = [
    "read_latency_seconds",
    "read_bytes_per_second",
    "write_bytes_per_second",
];

/// Upper bounds of the request-duration buckets, in seconds: 10 µs (a local probe) to 1 s
/// (a stalled round trip), 1-2.5-5 steps.
pub const REQUEST_DURATION_BUCKETS_SECONDS: [f64; 16] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0,
];

macro_rules! label_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$variant_doc:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$variant_doc])* $variant,)+
        }

        impl $name {
            /// Every value, to pre-declare the label so its series exist from the start.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }
    };
}

label_enum!(
    /// A protocol operation (docs/design.md, Protocol), the `op` label.
    Operation {
        /// Session open and version negotiation.
        Open => "open",
        /// Session liveness.
        Heartbeat => "heartbeat",
        /// Drained session close.
        Close => "close",
        /// Space reservation for a store.
        Reserve => "reserve",
        /// Publication of written bytes (READY).
        Commit => "commit",
        /// Resolution of a commit whose result was unknown.
        Resolve => "resolve",
        /// Batch lookup without leases.
        Probe => "probe",
        /// Where a prefix is cached, node by node (for routers).
        Locate => "locate",
        /// Batch lookup with leases.
        Acquire => "acquire",
        /// Lease release.
        Release => "release",
        /// Start of a replica's retirement.
        Retire => "retire",
        /// Owner's acknowledgement that storage was reclaimed.
        ReclaimAck => "reclaim_ack",
        /// Usage report.
        Usage => "usage",
        /// A node's report of the hits it answered under its delegations.
        ReportHits => "report_hits",
        /// Task fetch by a node.
        PollTasks => "poll_tasks",
        /// Task completion by a node.
        CompleteTask => "complete_task",
        /// A rejoining node's extent claims and adopted replicas.
        Rejoin => "rejoin",
        /// Cluster status, reload and drain (`kvtier ctl`).
        Admin => "admin",
    }
);

label_enum!(
    /// A slice of a pool's usage (docs/design.md, Records and states), the `state` label of
    /// `kvtier_pool_bytes`.
    /// READY and RETIRING are parts of ALLOCATED, never added to it.
    PoolByteState {
        /// Reserved for a store, not yet written.
        Reserved => "reserved",
        /// Held by allocations, whatever their replica state.
        Allocated => "allocated",
        /// Held by READY replicas.
        Ready => "ready",
        /// Held by RETIRING replicas awaiting reclaim.
        Retiring => "retiring",
        /// Held by replicas of fenced or suspect sessions, not yet reclaimable.
        Quarantined => "quarantined",
        /// Held by leased replicas.
        Pinned => "pinned",
    }
);

label_enum!(
    /// A session's liveness (docs/design.md, Records and states), the `state` label of
    /// `kvtier_sessions`.
    SessionState {
        /// Heartbeats arrive.
        Live => "live",
        /// Heartbeats are late; its replicas are hidden.
        Suspect => "suspect",
        /// Superseded by a newer epoch.
        Fenced => "fenced",
    }
);

label_enum!(
    /// Why bytes moved, the `direction` label of `kvtier_bytes_moved_total`.
    Direction {
        /// Engine to pool (a store).
        Store => "store",
        /// Pool to engine (a load).
        Load => "load",
        /// Pool to a pool of another domain (replication).
        Replicate => "replicate",
        /// One tier colder (eviction by demotion).
        Demote => "demote",
        /// From SSD back to an L1 pool.
        Restore => "restore",
        /// From an L1 pool to the node's SSD (a reclaimed replica kept one tier colder).
        Spill => "spill",
    }
);

label_enum!(
    /// What a node's client found when it asked for an object, the `result` label of
    /// `kvtier_lookups_total`.
    LookupResult {
        /// A READY replica the client can map was leased.
        Hit => "hit",
        /// Nothing to lease (absent, unreachable, or withheld by a manifest's miss).
        Miss => "miss",
    }
);

/// The process's metrics. Every method takes `&self` and is safe from many threads; share
/// it as `Arc<Metrics>`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pool_capacity_bytes: IntGaugeVec,
    pool_bytes: IntGaugeVec,
    pool_profile: GaugeVec,
    requests_total: IntCounterVec,
    request_errors_total: IntCounterVec,
    request_duration_seconds: HistogramVec,
    leases: IntGauge,
    sessions: IntGaugeVec,
    /// The latest epoch of each node the directory has seen: one series per node name,
    /// bounded by the directory's `nodes_max`.
    node_epochs: IntGaugeVec,
    bytes_moved_total: IntCounterVec,
    lookups_total: IntCounterVec,
    evictions_total: IntCounter,
    directory_evictions_total: IntCounterVec,
    expirations_total: IntCounter,
    medium_bytes: IntGaugeVec,
    drains: IntGaugeVec,
    drain_pending: IntGaugeVec,
    reloads_total: IntCounterVec,
    label_drops_total: IntCounter,
    accept_backoffs_total: IntCounter,
    client_refusals_total: IntCounterVec,
    /// The pools currently labelled, with their medium; at most [`POOL_LABELS_MAX`].
    pools: Mutex<BTreeMap<PoolId, Medium>>,
}

/// The pool families: each pool's capacity, usage by state and tier profile, and the usage
/// per medium.
struct PoolFamilies {
    capacity_bytes: IntGaugeVec,
    bytes: IntGaugeVec,
    profile: GaugeVec,
    medium_bytes: IntGaugeVec,
}

impl PoolFamilies {
    /// Defines the families, unregistered; errors only if a definition is invalid.
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            capacity_bytes: IntGaugeVec::new(
                Opts::new("kvtier_pool_capacity_bytes", "Size of a pool's data area."),
                &["pool", "medium"],
            )?,
            bytes: IntGaugeVec::new(
                Opts::new(
                    "kvtier_pool_bytes",
                    "Bytes of a pool by usage state; ready and retiring are parts of allocated.",
                ),
                &["pool", "state"],
            )?,
            profile: GaugeVec::new(
                Opts::new(
                    "kvtier_pool_profile",
                    "A pool's tier profile: on a node what its start-up probe measured, on the directory what the policy prices the pool by.",
                ),
                &["pool", "figure"],
            )?,
            medium_bytes: IntGaugeVec::new(
                Opts::new(
                    "kvtier_medium_bytes",
                    "Bytes of every pool of a medium by usage state (capacity included).",
                ),
                &["medium", "state"],
            )?,
        })
    }
}

/// The request families: count, failures and duration, by operation.
struct RequestFamilies {
    total: IntCounterVec,
    errors_total: IntCounterVec,
    duration_seconds: HistogramVec,
}

impl RequestFamilies {
    /// Defines the families, unregistered; errors only if a definition is invalid.
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            total: IntCounterVec::new(
                Opts::new("kvtier_requests_total", "Requests handled, by operation."),
                &["op"],
            )?,
            errors_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_request_errors_total",
                    "Requests that failed, by operation and error kind.",
                ),
                &["op", "error"],
            )?,
            duration_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "kvtier_request_duration_seconds",
                    "Request handling time, by operation.",
                )
                .buckets(REQUEST_DURATION_BUCKETS_SECONDS.to_vec()),
                &["op"],
            )?,
        })
    }
}

/// The cluster-state families: leases, sessions, node epochs, drains and reloads.
struct ClusterFamilies {
    leases: IntGauge,
    sessions: IntGaugeVec,
    node_epochs: IntGaugeVec,
    drains: IntGaugeVec,
    drain_pending: IntGaugeVec,
    reloads_total: IntCounterVec,
}

impl ClusterFamilies {
    /// Defines the families, unregistered; errors only if a definition is invalid.
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            leases: IntGauge::new("kvtier_leases", "Read leases currently held.")?,
            sessions: IntGaugeVec::new(
                Opts::new("kvtier_sessions", "Sessions, by liveness state."),
                &["state"],
            )?,
            node_epochs: IntGaugeVec::new(
                Opts::new(
                    "kvtier_node_epoch",
                    "The latest epoch of each node (directory): it rises at every new session.",
                ),
                &["node"],
            )?,
            drains: IntGaugeVec::new(
                Opts::new("kvtier_drains", "Node drains, by state."),
                &["state"],
            )?,
            drain_pending: IntGaugeVec::new(
                Opts::new(
                    "kvtier_drain_pending",
                    "What active drains still wait for: replicas to relocate, leases and reservations to end.",
                ),
                &["what"],
            )?,
            reloads_total: IntCounterVec::new(
                Opts::new("kvtier_reloads_total", "Configuration reloads, by outcome."),
                &["outcome"],
            )?,
        })
    }
}

/// The data families: bytes moved, lookups, evictions and expirations.
struct DataFamilies {
    bytes_moved_total: IntCounterVec,
    lookups_total: IntCounterVec,
    evictions_total: IntCounter,
    directory_evictions_total: IntCounterVec,
    expirations_total: IntCounter,
}

impl DataFamilies {
    /// Defines the families, unregistered; errors only if a definition is invalid.
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            bytes_moved_total: IntCounterVec::new(
                Opts::new("kvtier_bytes_moved_total", "Bytes copied, by reason."),
                &["direction"],
            )?,
            lookups_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_lookups_total",
                    "Objects a node's clients asked to load, by result (hit or miss).",
                ),
                &["result"],
            )?,
            evictions_total: IntCounter::new(
                "kvtier_evictions_total",
                "READY replicas retired by the eviction policy under pool pressure.",
            )?,
            directory_evictions_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_directory_evictions_total",
                    "READY replicas the directory evicted under pool pressure (retired or demoted), by the medium of their pool.",
                ),
                &["medium"],
            )?,
            expirations_total: IntCounter::new(
                "kvtier_expirations_total",
                "READY replicas that outlived their tier's time to live, retired or demoted.",
            )?,
        })
    }
}

/// The process families: dropped label updates, accept back-offs and client refusals.
struct ProcessFamilies {
    label_drops_total: IntCounter,
    accept_backoffs_total: IntCounter,
    client_refusals_total: IntCounterVec,
}

impl ProcessFamilies {
    /// Defines the families, unregistered; errors only if a definition is invalid.
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Self {
            label_drops_total: IntCounter::new(
                "kvtier_metrics_label_drops_total",
                "Updates not exported because a label bound was reached.",
            )?,
            accept_backoffs_total: IntCounter::new(
                "kvtier_accept_backoffs_total",
                "Times accepting a connection paused because the process or system ran out of file descriptors or memory.",
            )?,
            client_refusals_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_client_refusals_total",
                    "Local client connections a node refused, by reason.",
                ),
                &["reason"],
            )?,
        })
    }
}

impl Metrics {
    /// Registers every family in a fresh registry and pre-declares the enum-labelled series
    /// at zero, so rates exist from the first scrape. Errors only if a family definition is
    /// invalid (a bug caught by the tests).
    pub fn new() -> Result<Self, prometheus::Error> {
        let pool = PoolFamilies::new()?;
        let requests = RequestFamilies::new()?;
        let cluster = ClusterFamilies::new()?;
        let data = DataFamilies::new()?;
        let process = ProcessFamilies::new()?;
        let metrics = Self {
            registry: Registry::new(),
            pool_capacity_bytes: pool.capacity_bytes,
            pool_bytes: pool.bytes,
            pool_profile: pool.profile,
            requests_total: requests.total,
            request_errors_total: requests.errors_total,
            request_duration_seconds: requests.duration_seconds,
            leases: cluster.leases,
            sessions: cluster.sessions,
            node_epochs: cluster.node_epochs,
            bytes_moved_total: data.bytes_moved_total,
            lookups_total: data.lookups_total,
            evictions_total: data.evictions_total,
            directory_evictions_total: data.directory_evictions_total,
            expirations_total: data.expirations_total,
            medium_bytes: pool.medium_bytes,
            drains: cluster.drains,
            drain_pending: cluster.drain_pending,
            reloads_total: cluster.reloads_total,
            label_drops_total: process.label_drops_total,
            accept_backoffs_total: process.accept_backoffs_total,
            client_refusals_total: process.client_refusals_total,
            pools: Mutex::new(BTreeMap::new()),
        };
        metrics.register_all()?;
        metrics.declare_enum_series();
        Ok(metrics)
    }

    /// Declares every enum-labelled series at zero, so rates exist from the first scrape.
    fn declare_enum_series(&self) {
        for op in Operation::ALL {
            self.requests_total.with_label_values(&[op.as_str()]);
            self.request_duration_seconds
                .with_label_values(&[op.as_str()]);
        }
        for state in SessionState::ALL {
            self.sessions.with_label_values(&[state.as_str()]);
        }
        for direction in Direction::ALL {
            self.bytes_moved_total
                .with_label_values(&[direction.as_str()]);
        }
        for result in LookupResult::ALL {
            self.lookups_total.with_label_values(&[result.as_str()]);
        }
    }

    fn register_all(&self) -> Result<(), prometheus::Error> {
        self.registry
            .register(Box::new(self.pool_capacity_bytes.clone()))?;
        self.registry.register(Box::new(self.pool_bytes.clone()))?;
        self.registry
            .register(Box::new(self.pool_profile.clone()))?;
        self.registry
            .register(Box::new(self.requests_total.clone()))?;
        self.registry
            .register(Box::new(self.request_errors_total.clone()))?;
        self.registry
            .register(Box::new(self.request_duration_seconds.clone()))?;
        self.registry.register(Box::new(self.leases.clone()))?;
        self.registry.register(Box::new(self.sessions.clone()))?;
        self.registry.register(Box::new(self.node_epochs.clone()))?;
        self.registry
            .register(Box::new(self.bytes_moved_total.clone()))?;
        self.registry
            .register(Box::new(self.lookups_total.clone()))?;
        self.registry
            .register(Box::new(self.evictions_total.clone()))?;
        self.registry
            .register(Box::new(self.directory_evictions_total.clone()))?;
        self.registry
            .register(Box::new(self.expirations_total.clone()))?;
        self.registry
            .register(Box::new(self.medium_bytes.clone()))?;
        self.registry.register(Box::new(self.drains.clone()))?;
        self.registry
            .register(Box::new(self.drain_pending.clone()))?;
        self.registry
            .register(Box::new(self.reloads_total.clone()))?;
        self.registry
            .register(Box::new(self.label_drops_total.clone()))?;
        self.registry
            .register(Box::new(self.accept_backoffs_total.clone()))?;
        self.registry
            .register(Box::new(self.client_refusals_total.clone()))
    }

    /// Declares (or updates) a pool and its capacity, and its usage states at zero. Past
    /// [`POOL_LABELS_MAX`] pools the update is dropped and counted. Safe to repeat.
    pub fn set_pool_capacity(&self, pool: PoolId, medium: Medium, capacity_bytes: u64) {
        // Held across the series updates so a concurrent `remove_pool` cannot interleave.
        let mut pools = self.pools();
        if !pools.contains_key(&pool) && pools.len() >= POOL_LABELS_MAX {
            self.label_drops_total.inc();
            return;
        }
        let pool_label = pool.to_string();
        if let Some(previous) = pools.insert(pool, medium).filter(|m| *m != medium) {
            let _ = self
                .pool_capacity_bytes
                .remove_label_values(&[pool_label.as_str(), previous.name()]);
        }
        self.pool_capacity_bytes
            .with_label_values(&[pool_label.as_str(), medium.name()])
            .set(saturating_i64(capacity_bytes));
        for state in PoolByteState::ALL {
            self.pool_bytes
                .with_label_values(&[pool_label.as_str(), state.as_str()]);
        }
    }

    /// Sets one usage state of a pool declared by [`Metrics::set_pool_capacity`]; an
    /// undeclared pool's update is dropped and counted (so the pool bound holds).
    pub fn set_pool_bytes(&self, pool: PoolId, state: PoolByteState, bytes: u64) {
        let pools = self.pools();
        if !pools.contains_key(&pool) {
            self.label_drops_total.inc();
            return;
        }
        self.pool_bytes
            .with_label_values(&[pool.to_string().as_str(), state.as_str()])
            .set(saturating_i64(bytes));
    }

    /// Sets the profile of a pool declared by [`Metrics::set_pool_capacity`]: three series,
    /// `read_latency_seconds`, `read_bytes_per_second`, `write_bytes_per_second` (absent
    /// when not measured). An undeclared pool's update is dropped and counted.
    pub fn set_pool_profile(&self, pool: PoolId, profile: &Measurement) {
        let pools = self.pools();
        if !pools.contains_key(&pool) {
            self.label_drops_total.inc();
            return;
        }
        let pool_label = pool.to_string();
        let figures = [
            (
                PROFILE_FIGURES[0],
                Some(profile.read_latency_ns as f64 / 1e9),
            ),
            (
                PROFILE_FIGURES[1],
                Some(profile.read_bandwidth_bytes_per_s as f64),
            ),
            (
                PROFILE_FIGURES[2],
                profile
                    .write_bandwidth_bytes_per_s
                    .map(|value| value as f64),
            ),
        ];
        for (figure, value) in figures {
            if let Some(value) = value {
                self.pool_profile
                    .with_label_values(&[pool_label.as_str(), figure])
                    .set(value);
            }
        }
    }

    /// Removes every series of a pool (it was unregistered), freeing its label slot.
    /// Removing an unknown pool does nothing.
    pub fn remove_pool(&self, pool: PoolId) {
        let mut pools = self.pools();
        let Some(medium) = pools.remove(&pool) else {
            return;
        };
        let pool_label = pool.to_string();
        let _ = self
            .pool_capacity_bytes
            .remove_label_values(&[pool_label.as_str(), medium.name()]);
        for state in PoolByteState::ALL {
            let _ = self
                .pool_bytes
                .remove_label_values(&[pool_label.as_str(), state.as_str()]);
        }
        for figure in PROFILE_FIGURES {
            let _ = self
                .pool_profile
                .remove_label_values(&[pool_label.as_str(), figure]);
        }
    }

    /// Records one handled request: counts it, observes its duration, and counts its error
    /// kind when it failed. `error` must be a fixed kind name (an error enum's variant,
    /// `snake_case`), never text built from data.
    pub fn observe_request(&self, op: Operation, duration: Duration, error: Option<&'static str>) {
        self.requests_total.with_label_values(&[op.as_str()]).inc();
        self.request_duration_seconds
            .with_label_values(&[op.as_str()])
            .observe(duration.as_secs_f64());
        if let Some(error) = error {
            self.request_errors_total
                .with_label_values(&[op.as_str(), error])
                .inc();
        }
    }

    /// Counts a refused local client connection. `reason` must be a fixed kind name
    /// (`unknown_peer`, `tenant_not_in_cxl_pool`, `tenant_without_partition`,
    /// `too_many_clients`, `no_credentials`),
    /// never text built from data.
    pub fn refuse_client(&self, reason: &'static str) {
        self.client_refusals_total
            .with_label_values(&[reason])
            .inc();
    }

    /// Sets the number of node drains in `state` (a [`crate::directory::DrainState`] name).
    pub fn set_drains(&self, state: &'static str, drain_count: u64) {
        self.drains
            .with_label_values(&[state])
            .set(saturating_i64(drain_count));
    }

    /// Sets what active drains still wait for: `replicas`, `leases` or `reservations`.
    pub fn set_drain_pending(&self, what: &'static str, count: u64) {
        self.drain_pending
            .with_label_values(&[what])
            .set(saturating_i64(count));
    }

    /// Counts one configuration reload, `applied` or `refused`.
    pub fn add_reload(&self, outcome: &'static str) {
        self.reloads_total.with_label_values(&[outcome]).inc();
    }

    /// Sets the number of read leases held now.
    pub fn set_leases(&self, lease_count: u64) {
        self.leases.set(saturating_i64(lease_count));
    }

    /// Sets the number of sessions in one liveness state.
    pub fn set_sessions(&self, state: SessionState, session_count: u64) {
        self.sessions
            .with_label_values(&[state.as_str()])
            .set(saturating_i64(session_count));
    }

    /// Sets a node's latest epoch (`node` is a configured node name, never client input).
    pub fn set_node_epoch(&self, node: &str, epoch: u64) {
        self.node_epochs
            .with_label_values(&[node])
            .set(saturating_i64(epoch));
    }

    /// Adds bytes copied for one reason.
    pub fn add_bytes_moved(&self, direction: Direction, bytes: u64) {
        self.bytes_moved_total
            .with_label_values(&[direction.as_str()])
            .inc_by(bytes);
    }

    /// Objects the node's clients found so far (`kvtier_lookups_total{result="hit"}`).
    pub fn lookup_hits(&self) -> u64 {
        self.lookups_total
            .with_label_values(&[LookupResult::Hit.as_str()])
            .get()
    }

    /// Counts the objects of one client load by what it found.
    pub fn add_lookups(&self, hits: u64, misses: u64) {
        self.lookups_total
            .with_label_values(&[LookupResult::Hit.as_str()])
            .inc_by(hits);
        self.lookups_total
            .with_label_values(&[LookupResult::Miss.as_str()])
            .inc_by(misses);
    }

    /// Sets the bytes of all pools of `medium` in `state` (`"capacity"` or a pool state).
    pub fn set_medium_bytes(&self, medium: Medium, state: &'static str, bytes: u64) {
        self.medium_bytes
            .with_label_values(&[medium.name(), state])
            .set(saturating_i64(bytes));
    }

    /// Counts replicas the eviction policy started retiring.
    pub fn add_evictions(&self, evictions: u64) {
        self.evictions_total.inc_by(evictions);
    }

    /// Raises the directory's evictions from pools of `medium` to `total` (the directory
    /// core's count, which only grows).
    pub fn set_directory_evictions(&self, medium: Medium, total: u64) {
        let counter = self
            .directory_evictions_total
            .with_label_values(&[medium.name()]);
        counter.inc_by(total.saturating_sub(counter.get()));
    }

    /// Counts a pause of an accept loop out of descriptors or memory.
    pub fn add_accept_backoff(&self) {
        self.accept_backoffs_total.inc();
    }

    /// Counts replicas that left their pool at the end of their time to live.
    pub fn add_expirations(&self, expirations: u64) {
        self.expirations_total.inc_by(expirations);
    }

    /// Registers another family in this process's registry (a subsystem's own metrics,
    /// such as [`ssd::SsdMetrics`]). Errors on a repeated or malformed family (a bug).
    pub fn register(
        &self,
        collector: Box<dyn prometheus::core::Collector>,
    ) -> Result<(), prometheus::Error> {
        self.registry.register(collector)
    }

    /// Every family in the Prometheus text format (version 0.0.4). Encoding fails only on
    /// a malformed family (a bug); then the error is logged and the text so far returned,
    /// so a scrape still sees the rest.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(error) = TextEncoder::new().encode_utf8(&self.registry.gather(), &mut text) {
            tracing::error!(%error, "metrics encoding failed");
        }
        text
    }

    /// The labelled pools. A poisoned lock still holds a consistent map (every update
    /// of it is one `insert` or `remove`), so it is used as is.
    fn pools(&self) -> MutexGuard<'_, BTreeMap<PoolId, Medium>> {
        self.pools.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
pub(crate) mod tests;
