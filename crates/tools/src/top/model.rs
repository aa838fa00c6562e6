//! What `kvtier top` shows, computed from what the cluster exports: the directory's cluster
//! status (nodes, pools and their usage) and each process's `/metrics` text. Pure: a
//! [`Snapshot`] is built by the caller, and [`Report::compute`] turns two snapshots taken an
//! interval apart into rates, ratios and latency quantiles. Tested without a terminal or a
//! cluster.

use kvtier_core::metrics::scrape::{parse_samples, Sample};
use kvtier_core::model::{PoolUsage, Scope};
use kvtier_core::protocol::messages::ClusterStatus;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Distinct values kept per label of a process's families (operations, directions,
/// histogram bounds): kvtier exports at most 17 of any; a text with more is cut here.
const LABEL_VALUES_MAX: usize = 64;
/// The reasons bytes move, as the `direction` label names them, in display order.
pub const DIRECTIONS: [&str; 6] = ["load", "store", "demote", "spill", "replicate", "restore"];
/// Operations left out of request latency: `admin` is `kvtier top`'s own status request,
/// `heartbeat` and `poll_tasks` are timers rather than work.
const LATENCY_EXCLUDED_OPS: [&str; 3] = ["admin", "heartbeat", "poll_tasks"];

/// The counters `kvtier top` reads from one process's `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessMetrics {
    /// `kvtier_requests_total` by `op`.
    pub requests: BTreeMap<String, f64>,
    /// `kvtier_lookups_total{result="hit"}` and `{result="miss"}`.
    pub hits: f64,
    pub misses: f64,
    /// `kvtier_bytes_moved_total` by `direction`.
    pub bytes_moved: BTreeMap<String, f64>,
    pub evictions: f64,
    pub expirations: f64,
    /// `kvtier_request_duration_seconds_bucket` summed over the operations that are work,
    /// by upper bound (`+Inf` last), cumulative as exported.
    pub duration_buckets: Vec<(f64, f64)>,
}

impl ProcessMetrics {
    /// Reads the families `kvtier top` uses from a `/metrics` body.
    pub fn from_text(body: &str) -> ProcessMetrics {
        let mut metrics = ProcessMetrics::default();
        let mut buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for sample in parse_samples(body) {
            metrics.add(&sample, &mut buckets);
        }
        metrics.duration_buckets = buckets.into_values().collect();
        metrics
    }

    fn add(&mut self, sample: &Sample, buckets: &mut BTreeMap<u64, (f64, f64)>) {
        match sample.name.as_str() {
            "kvtier_requests_total" => {
                if let Some(op) = sample.label("op") {
                    add_bounded(&mut self.requests, op, sample.value);
                }
            }
            "kvtier_lookups_total" => match sample.label("result") {
                Some("hit") => self.hits += sample.value,
                Some("miss") => self.misses += sample.value,
                _ => {}
            },
            "kvtier_bytes_moved_total" => {
                if let Some(direction) = sample.label("direction") {
                    add_bounded(&mut self.bytes_moved, direction, sample.value);
                }
            }
            "kvtier_evictions_total" => self.evictions += sample.value,
            "kvtier_expirations_total" => self.expirations += sample.value,
            "kvtier_request_duration_seconds_bucket" => {
                let work = sample
                    .label("op")
                    .is_some_and(|op| !LATENCY_EXCLUDED_OPS.contains(&op));
                let bound = sample.label("le").and_then(|le| match le {
                    "+Inf" => Some(f64::INFINITY),
                    other => other.parse::<f64>().ok(),
                });
                if let (true, Some(bound)) = (work, bound) {
                    // Keyed by the bound's bits: positive floats order as their bits do.
                    let key = bound.to_bits();
                    if buckets.contains_key(&key) || buckets.len() < LABEL_VALUES_MAX {
                        buckets.entry(key).or_insert((bound, 0.0)).1 += sample.value;
                    }
                }
            }
            _ => {}
        }
    }
}

fn add_bounded(map: &mut BTreeMap<String, f64>, key: &str, value: f64) {
    if let Some(total) = map.get_mut(key) {
        *total += value;
    } else if map.len() < LABEL_VALUES_MAX {
        map.insert(key.to_owned(), value);
    }
}

/// What one refresh saw.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// When it was taken, on the reader's monotonic clock, since any fixed origin.
    pub taken: Duration,
    pub status: ClusterStatus,
    /// Each process's metrics by name (`directory`, then node names), or why they could not
    /// be read. Processes that export no metrics are absent.
    pub metrics: BTreeMap<String, Result<ProcessMetrics, String>>,
}

/// Rates and ratios over the interval between two snapshots (since the processes started,
/// for the first one).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Rates {
    /// Hits over hits and misses in the interval; `None` without lookups.
    pub hit_ratio: Option<f64>,
    /// The same since the processes started.
    pub hit_ratio_total: Option<f64>,
    /// Objects looked up (hits and misses) per second.
    pub loads_per_second: f64,
    /// Objects committed per second.
    pub stores_per_second: f64,
    /// Bytes moved per second by reason ([`DIRECTIONS`]).
    pub bytes_per_second: BTreeMap<String, f64>,
    pub evictions_per_second: f64,
    pub expirations_per_second: f64,
    /// Request latency quantiles in seconds from the histogram's buckets; `None` without
    /// requests.
    pub latency_p50_seconds: Option<f64>,
    pub latency_p99_seconds: Option<f64>,
}

/// One node's row.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeRow {
    pub name: String,
    pub node: u32,
    pub epoch: u64,
    /// `live`, `suspect`, `fenced`, `draining`, ... as the directory says.
    pub state: String,
    pub rates: Rates,
    /// Why the node's metrics could not be read (its rates are then zero).
    pub metrics_error: Option<String>,
}

/// One pool's row: its usage by state, as the directory accounts it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolRow {
    pub name: String,
    pub pool: u32,
    pub medium: String,
    /// The owning node's name, or `domain N` for a shared pool.
    pub scope: String,
    /// Its bytes by state, as the directory accounts them (flattened in the JSON).
    #[serde(flatten)]
    pub usage: PoolUsage,
    pub free_bytes: u64,
}

/// The cluster's totals: the sums of the pool rows, and the rates of every node together
/// with the directory's evictions and expirations.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    pub nodes: usize,
    pub nodes_live: usize,
    pub pools: usize,
    /// The pools' bytes by state together (flattened in the JSON).
    #[serde(flatten)]
    pub usage: PoolUsage,
    pub rates: Rates,
    /// The directory's own request latency (QUIC requests from the nodes).
    pub directory_latency_p50_seconds: Option<f64>,
    pub directory_latency_p99_seconds: Option<f64>,
}

/// Everything one refresh shows; `kvtier top --once --json` prints it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Seconds the rates are measured over; zero for a first snapshot (then rates are zero
    /// and ratios are since the processes started).
    pub interval_seconds: f64,
    pub cluster: Totals,
    pub nodes: Vec<NodeRow>,
    pub pools: Vec<PoolRow>,
    /// Processes whose metrics could not be read, with the reason.
    pub unreachable: Vec<String>,
}

impl Report {
    /// The report of `current`, with rates over the interval since `previous`.
    pub fn compute(previous: Option<&Snapshot>, current: &Snapshot) -> Report {
        let interval = previous
            .map(|previous| current.taken.saturating_sub(previous.taken))
            .filter(|interval| !interval.is_zero());
        let before = |name: &str| {
            interval
                .and(previous)
                .and_then(|previous| previous.metrics.get(name))
                .and_then(|metrics| metrics.as_ref().ok())
        };
        let mut unreachable = Vec::new();
        let mut all_nodes = ProcessMetrics::default();
        let mut all_nodes_before = ProcessMetrics::default();
        let nodes = current
            .status
            .nodes
            .iter()
            .map(|node| {
                let (rates, metrics_error) = match current.metrics.get(&node.name) {
                    Some(Ok(now)) => {
                        // A node first seen in this interval joins the sums next time, so
                        // its counts since start do not show as one interval's rate.
                        match (interval, before(&node.name)) {
                            (None, _) => merge(&mut all_nodes, now),
                            (Some(_), Some(before)) => {
                                merge(&mut all_nodes, now);
                                merge(&mut all_nodes_before, before);
                            }
                            (Some(_), None) => {}
                        }
                        (rates(before(&node.name), now, interval), None)
                    }
                    Some(Err(error)) => {
                        unreachable.push(format!("{}: {error}", node.name));
                        (Rates::default(), Some(error.clone()))
                    }
                    None => (Rates::default(), None),
                };
                NodeRow {
                    name: node.name.clone(),
                    node: node.node.0,
                    epoch: node.epoch.0,
                    state: node.state.clone(),
                    rates,
                    metrics_error,
                }
            })
            .collect();
        let pools = pool_rows(&current.status);
        let mut cluster = totals(&current.status, &pools);
        let all_before = interval.map(|_| &all_nodes_before);
        cluster.rates = rates(all_before, &all_nodes, interval);
        match current.metrics.get("directory") {
            Some(Ok(directory)) => set_directory_rates(
                &mut cluster,
                rates(before("directory"), directory, interval),
            ),
            Some(Err(error)) => unreachable.insert(0, format!("directory: {error}")),
            None => {}
        }
        Report {
            interval_seconds: interval.map_or(0.0, |interval| interval.as_secs_f64()),
            cluster,
            nodes,
            pools,
            unreachable,
        }
    }
}

/// Sets the directory's own figures in `cluster` from its rates (`directory`): the
/// evictions and expirations, which only the directory counts, and its request latency.
fn set_directory_rates(cluster: &mut Totals, directory: Rates) {
    cluster.rates.evictions_per_second = directory.evictions_per_second;
    cluster.rates.expirations_per_second = directory.expirations_per_second;
    cluster.directory_latency_p50_seconds = directory.latency_p50_seconds;
    cluster.directory_latency_p99_seconds = directory.latency_p99_seconds;
}

/// Adds `from`'s counters into `into` (cluster-wide sums of the nodes).
fn merge(into: &mut ProcessMetrics, from: &ProcessMetrics) {
    for (op, value) in &from.requests {
        add_bounded(&mut into.requests, op, *value);
    }
    into.hits += from.hits;
    into.misses += from.misses;
    for (direction, value) in &from.bytes_moved {
        add_bounded(&mut into.bytes_moved, direction, *value);
    }
    into.evictions += from.evictions;
    into.expirations += from.expirations;
    for &(bound, count) in &from.duration_buckets {
        let buckets = &mut into.duration_buckets;
        match buckets.iter().position(|(existing, _)| *existing == bound) {
            Some(index) => buckets[index].1 += count,
            None if buckets.len() < LABEL_VALUES_MAX => buckets.push((bound, count)),
            None => {}
        }
    }
    into.duration_buckets
        .sort_by(|left, right| left.0.total_cmp(&right.0));
}

/// Rates of `now` over `interval` since `before`; with no `before` (or no interval) counts
/// since start: zero rates, ratios and quantiles over everything so far.
fn rates(
    before: Option<&ProcessMetrics>,
    now: &ProcessMetrics,
    interval: Option<Duration>,
) -> Rates {
    let empty = ProcessMetrics::default();
    let (before, seconds) = match (before, interval) {
        (Some(before), Some(interval)) => (before, interval.as_secs_f64()),
        _ => (&empty, 0.0),
    };
    let per_second = |delta: f64| {
        if seconds > 0.0 {
            delta.max(0.0) / seconds
        } else {
            0.0
        }
    };
    let hits = (now.hits - before.hits).max(0.0);
    let misses = (now.misses - before.misses).max(0.0);
    let bytes_per_second = DIRECTIONS
        .iter()
        .map(|direction| {
            let delta = now.bytes_moved.get(*direction).copied().unwrap_or(0.0)
                - before.bytes_moved.get(*direction).copied().unwrap_or(0.0);
            (direction.to_string(), per_second(delta))
        })
        .collect();
    let commits = |metrics: &ProcessMetrics| metrics.requests.get("commit").copied().unwrap_or(0.0);
    let buckets = bucket_deltas(&before.duration_buckets, &now.duration_buckets);
    Rates {
        hit_ratio: ratio(hits, misses),
        hit_ratio_total: ratio(now.hits, now.misses),
        loads_per_second: per_second(hits + misses),
        stores_per_second: per_second(commits(now) - commits(before)),
        bytes_per_second,
        evictions_per_second: per_second(now.evictions - before.evictions),
        expirations_per_second: per_second(now.expirations - before.expirations),
        latency_p50_seconds: quantile(&buckets, 0.5),
        latency_p99_seconds: quantile(&buckets, 0.99),
    }
}

fn ratio(hits: f64, misses: f64) -> Option<f64> {
    (hits + misses > 0.0).then(|| hits / (hits + misses))
}

/// `now`'s cumulative buckets less `before`'s (a restarted process counts from zero again:
/// its buckets are then taken whole).
fn bucket_deltas(before: &[(f64, f64)], now: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let restarted = now.iter().any(|&(bound, count)| {
        before
            .iter()
            .any(|&(previous_bound, previous)| previous_bound == bound && previous > count)
    });
    now.iter()
        .map(|&(bound, count)| {
            let previous = before
                .iter()
                .find(|(previous_bound, _)| *previous_bound == bound)
                .map_or(0.0, |(_, previous)| *previous);
            (bound, if restarted { count } else { count - previous })
        })
        .collect()
}

/// The `q` quantile of cumulative histogram buckets (sorted by bound, `+Inf` last), as
/// Prometheus's `histogram_quantile` estimates it: linear within the bucket that holds it;
/// the highest finite bound when it falls in `+Inf`. `None` when the buckets are empty.
pub fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower_bound = 0.0;
    let mut lower_count = 0.0;
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower_bound);
            }
            let inside = count - lower_count;
            let fraction = if inside > 0.0 {
                (rank - lower_count) / inside
            } else {
                1.0
            };
            return Some(lower_bound + (bound - lower_bound) * fraction);
        }
        lower_bound = bound;
        lower_count = count;
    }
    Some(lower_bound)
}

fn pool_rows(status: &ClusterStatus) -> Vec<PoolRow> {
    status
        .pools
        .iter()
        .map(|report| {
            let usage = &report.usage;
            let scope = match report.spec.scope {
                Scope::Host(node) => status
                    .nodes
                    .iter()
                    .find(|status| status.node == node)
                    .map_or_else(|| format!("node {node}"), |status| status.name.clone()),
                Scope::Domain(domain) => format!("domain {domain}"),
            };
            PoolRow {
                name: report.spec.name.clone(),
                pool: report.pool.0,
                medium: report.spec.medium.name().to_owned(),
                scope,
                usage: *usage,
                free_bytes: usage.free_bytes(),
            }
        })
        .collect()
}

fn totals(status: &ClusterStatus, pools: &[PoolRow]) -> Totals {
    let mut usage = PoolUsage::default();
    for pool in pools {
        usage.add(&pool.usage);
    }
    Totals {
        nodes: status.nodes.len(),
        nodes_live: status
            .nodes
            .iter()
            .filter(|node| node.state == "live")
            .count(),
        pools: pools.len(),
        usage,
        ..Totals::default()
    }
}

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
