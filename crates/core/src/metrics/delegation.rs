//! Delegations' metrics. On a node: hits it answered itself, lookups it asked the directory,
//! the directory requests per hit, recalls and how long they took, delegations held. On the
//! directory: recalls by reason and delegations in force. Labels are the fixed reason set.

use super::Metrics;
use crate::directory::RecallReason;
use crate::node::delegations::DelegationCounts;
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts};
use std::time::Duration;

/// Bounds of the recall histogram, in seconds: a recall of an idle delegation is released
/// within a task poll (milliseconds); one with readers waits for them, up to a lease (30 s).
const RECALL_BUCKETS_SECONDS: [f64; 11] = [
    1e-3, 5e-3, 25e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Raises `counter` to `value` (the cores' counters only grow).
fn catch_up(counter: &IntCounter, value: u64) {
    counter.inc_by(value.saturating_sub(counter.get()));
}

/// A node's delegation families, registered in its [`Metrics`].
#[derive(Debug)]
pub struct NodeDelegationMetrics {
    local_hits_total: IntCounter,
    directory_lookups_total: IntCounter,
    directory_hit_lookups_total: IntCounter,
    directory_requests_per_hit: Gauge,
    recalls_total: IntCounter,
    recall_seconds: Histogram,
    delegations: IntGauge,
    reclaims_deferred_total: IntCounter,
}

impl NodeDelegationMetrics {
    /// Registers the families in `metrics`. Errors only on a malformed or repeated family.
    pub fn register(metrics: &Metrics) -> Result<NodeDelegationMetrics, prometheus::Error> {
        let families = NodeDelegationMetrics {
            local_hits_total: IntCounter::new(
                "kvtier_local_hits_total",
                "Objects this node's clients acquired under the node's delegations, with no request to the directory.",
            )?,
            directory_lookups_total: IntCounter::new(
                "kvtier_directory_lookups_total",
                "Probes and acquires this node asked the directory for its clients.",
            )?,
            directory_hit_lookups_total: IntCounter::new(
                "kvtier_directory_hit_lookups_total",
                "Of the directory lookups, those the directory answered with a hit (objects this node held no delegation on).",
            )?,
            directory_requests_per_hit: Gauge::new(
                "kvtier_directory_requests_per_hit",
                "Directory probes and acquires that found a hit, per hit (local and directory hits), since the node started: what the hits cost the directory (a miss's lookup is not a hit's).",
            )?,
            recalls_total: IntCounter::new(
                "kvtier_recalls_total",
                "Delegations the directory recalled from this node.",
            )?,
            recall_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "kvtier_recall_seconds",
                    "Time from a recall's arrival to the release of its delegation (its local leases ended).",
                )
                .buckets(RECALL_BUCKETS_SECONDS.to_vec()),
            )?,
            delegations: IntGauge::new(
                "kvtier_delegations",
                "Replicas this node answers hits on itself: under its delegations, and those it stored in its own CPU pools.",
            )?,
            reclaims_deferred_total: IntCounter::new(
                "kvtier_reclaims_deferred_total",
                "Reclaims of replicas in this node's CPU pools put off while a local lease read them (done once the last one ended).",
            )?,
        };
        metrics.register(Box::new(families.local_hits_total.clone()))?;
        metrics.register(Box::new(families.directory_lookups_total.clone()))?;
        metrics.register(Box::new(families.directory_hit_lookups_total.clone()))?;
        metrics.register(Box::new(families.directory_requests_per_hit.clone()))?;
        metrics.register(Box::new(families.recalls_total.clone()))?;
        metrics.register(Box::new(families.recall_seconds.clone()))?;
        metrics.register(Box::new(families.delegations.clone()))?;
        metrics.register(Box::new(families.reclaims_deferred_total.clone()))?;
        Ok(families)
    }

    /// Exports the node core's counts, `held` delegations, `hits` (every hit the node's
    /// clients had, local or not) and the recall latencies since the last call.
    pub fn publish(
        &self,
        counts: &DelegationCounts,
        held: usize,
        hits: u64,
        latencies: &[Duration],
    ) {
        catch_up(&self.local_hits_total, counts.local_hits);
        catch_up(&self.directory_lookups_total, counts.directory_lookups);
        catch_up(
            &self.directory_hit_lookups_total,
            counts.directory_hit_lookups,
        );
        catch_up(&self.recalls_total, counts.recalls);
        catch_up(&self.reclaims_deferred_total, counts.reclaims_deferred);
        if hits > 0 {
            self.directory_requests_per_hit
                .set(counts.directory_hit_lookups as f64 / hits as f64);
        }
        self.delegations
            .set(i64::try_from(held).unwrap_or(i64::MAX));
        for latency in latencies {
            self.recall_seconds.observe(latency.as_secs_f64());
        }
    }
}

/// The directory's delegation families, registered in its [`Metrics`].
#[derive(Debug)]
pub struct DirectoryRecallMetrics {
    recalls_total: IntCounterVec,
    delegations: IntGauge,
    offered_total: IntCounter,
}

impl DirectoryRecallMetrics {
    /// Registers the families in `metrics` with every reason at zero. Errors only on a
    /// malformed or repeated family.
    pub fn register(metrics: &Metrics) -> Result<DirectoryRecallMetrics, prometheus::Error> {
        let families = DirectoryRecallMetrics {
            recalls_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_directory_recalls_total",
                    "Delegations the directory recalled, by reason (retire, evict, drain).",
                ),
                &["reason"],
            )?,
            delegations: IntGauge::new(
                "kvtier_directory_delegations",
                "Delegations in force over all nodes.",
            )?,
            offered_total: IntCounter::new(
                "kvtier_directory_delegations_offered_total",
                "Delegations granted on offer: on replicas new in shared memory, to the nodes about to read them.",
            )?,
        };
        for reason in RecallReason::ALL {
            families.recalls_total.with_label_values(&[reason.label()]);
        }
        metrics.register(Box::new(families.recalls_total.clone()))?;
        metrics.register(Box::new(families.delegations.clone()))?;
        metrics.register(Box::new(families.offered_total.clone()))?;
        Ok(families)
    }

    /// Exports the directory's recall counts, delegations in force and delegations granted
    /// on offer.
    pub fn publish(&self, recalls: &[(RecallReason, u64)], live: u64, offered: u64) {
        catch_up(&self.offered_total, offered);
        for (reason, count) in recalls {
            catch_up(
                &self.recalls_total.with_label_values(&[reason.label()]),
                *count,
            );
        }
        self.delegations
            .set(i64::try_from(live).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counts_reach_the_text_format() {
        let metrics = Metrics::new().unwrap();
        let node = NodeDelegationMetrics::register(&metrics).unwrap();
        let directory = DirectoryRecallMetrics::register(&metrics).unwrap();
        let counts = DelegationCounts {
            local_hits: 7,
            recalls: 2,
            directory_lookups: 3,
            directory_hit_lookups: 1,
            reclaims_deferred: 5,
        };
        node.publish(&counts, 3, 8, &[Duration::from_millis(2)]);
        directory.publish(&[(RecallReason::Retire, 1), (RecallReason::Evict, 4)], 3, 6);
        let text = metrics.render();
        for line in [
            "kvtier_local_hits_total 7",
            "kvtier_directory_lookups_total 3",
            "kvtier_directory_hit_lookups_total 1",
            "kvtier_directory_requests_per_hit 0.125",
            "kvtier_recall_seconds_count 1",
            "kvtier_delegations 3",
            "kvtier_reclaims_deferred_total 5",
            "kvtier_directory_recalls_total{reason=\"evict\"} 4",
            "kvtier_directory_delegations 3",
            "kvtier_directory_delegations_offered_total 6",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
