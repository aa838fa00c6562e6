//! Replication's metrics on the directory: replications by result and skips by reason,
//! bytes replicated, replications in flight, and the time from an object's first remote
//! miss to its copy's READY. Labels are the fixed result and reason sets, never object ids.

use super::Metrics;
use crate::directory::{ReplicationCounts, SkipReason};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts};
use std::time::Duration;

/// Bounds of the miss-to-READY histogram, in seconds: 1 ms (a copy planned and made within
/// a tick) to 30 s (a reservation's lifetime).
const MISS_TO_READY_BUCKETS_SECONDS: [f64; 12] = [
    1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 5.0, 30.0,
];

/// The results of `kvtier_replications_total`.
const RESULTS: [&str; 3] = ["planned", "completed", "cancelled"];

/// The replication families, registered in the directory's [`Metrics`].
#[derive(Debug)]
pub struct ReplicationMetrics {
    replications_total: IntCounterVec,
    skipped_total: IntCounterVec,
    bytes_total: IntCounter,
    in_flight: IntGauge,
    miss_to_ready_seconds: Histogram,
}

/// Raises `counter` to `value` (the directory's counters only grow).
fn catch_up(counter: &IntCounter, value: u64) {
    counter.inc_by(value.saturating_sub(counter.get()));
}

impl ReplicationMetrics {
    /// Registers the families in `metrics` with every result and reason at zero. Errors
    /// only on a malformed or repeated family (a bug).
    pub fn register(metrics: &Metrics) -> Result<ReplicationMetrics, prometheus::Error> {
        let replication = ReplicationMetrics {
            replications_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_replications_total",
                    "Replications on remote demand, by result (planned, completed, cancelled).",
                ),
                &["result"],
            )?,
            skipped_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_replications_skipped_total",
                    "Remote demands that reached the threshold but were not replicated, by reason.",
                ),
                &["reason"],
            )?,
            bytes_total: IntCounter::new(
                "kvtier_replication_bytes_total",
                "Bytes of the replicas replication made READY.",
            )?,
            in_flight: IntGauge::new(
                "kvtier_replications_in_flight",
                "Replications planned and not yet completed or cancelled.",
            )?,
            miss_to_ready_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "kvtier_replication_miss_to_ready_seconds",
                    "Time from an object's first remote miss to its copy's READY.",
                )
                .buckets(MISS_TO_READY_BUCKETS_SECONDS.to_vec()),
            )?,
        };
        for result in RESULTS {
            replication.replications_total.with_label_values(&[result]);
        }
        for reason in SkipReason::ALL {
            replication
                .skipped_total
                .with_label_values(&[reason.name()]);
        }
        metrics.register(Box::new(replication.replications_total.clone()))?;
        metrics.register(Box::new(replication.skipped_total.clone()))?;
        metrics.register(Box::new(replication.bytes_total.clone()))?;
        metrics.register(Box::new(replication.in_flight.clone()))?;
        metrics.register(Box::new(replication.miss_to_ready_seconds.clone()))?;
        Ok(replication)
    }

    /// Exports the directory's counters and the latencies of the replications completed
    /// since the last call.
    pub fn publish(&self, counts: &ReplicationCounts, latencies: &[Duration]) {
        let results = [counts.planned, counts.completed, counts.cancelled];
        for (result, value) in RESULTS.iter().zip(results) {
            catch_up(&self.replications_total.with_label_values(&[result]), value);
        }
        for (reason, value) in SkipReason::ALL.iter().zip(counts.skipped) {
            catch_up(
                &self.skipped_total.with_label_values(&[reason.name()]),
                value,
            );
        }
        catch_up(&self.bytes_total, counts.completed_bytes);
        self.in_flight
            .set(i64::try_from(counts.in_flight).unwrap_or(i64::MAX));
        for latency in latencies {
            self.miss_to_ready_seconds.observe(latency.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_counters_reach_the_text_format() {
        let metrics = Metrics::new().unwrap();
        let replication = ReplicationMetrics::register(&metrics).unwrap();
        let counts = ReplicationCounts {
            planned: 3,
            completed: 2,
            skipped: [1, 2, 4, 8],
            completed_bytes: 1 << 20,
            in_flight: 1,
            ..ReplicationCounts::default()
        };
        replication.publish(&counts, &[Duration::from_millis(3)]);
        replication.publish(&counts, &[]);
        let text = metrics.render();
        assert!(
            text.contains("kvtier_replications_total{result=\"planned\"} 3"),
            "{text}"
        );
        assert!(text.contains("kvtier_replications_total{result=\"cancelled\"} 0"));
        // Each reason counts apart.
        for (reason, count) in [
            ("no_room", 1),
            ("not_worth", 2),
            ("no_path", 4),
            ("busy", 8),
        ] {
            let line = format!("kvtier_replications_skipped_total{{reason=\"{reason}\"}} {count}");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(text.contains("kvtier_replication_bytes_total 1048576"));
        assert!(text.contains("kvtier_replications_in_flight 1"));
        assert!(text.contains("kvtier_replication_miss_to_ready_seconds_count 1"));
    }
}
