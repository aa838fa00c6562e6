//! The SSD store's metrics on a node: bytes by state, spills and restores (count, bytes,
//! latency), checksum failures, skipped spills by reason, regions reclaimed. Labels are the
//! fixed state and reason sets, never object ids.

use super::Metrics;
use crate::backends::ssd::{SkipReason, SsdCounters, SsdUsage};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Bounds of the spill and restore latency histograms, in seconds: 50 µs to 1 s.
const SSD_DURATION_BUCKETS_SECONDS: [f64; 12] = [
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 250e-3, 1.0,
];

/// The SSD families, registered in a node's [`Metrics`].
#[derive(Debug)]
pub struct SsdMetrics {
    bytes: IntGaugeVec,
    spills_total: IntCounter,
    spill_bytes_total: IntCounter,
    restores_total: IntCounter,
    restore_bytes_total: IntCounter,
    checksum_failures_total: IntCounter,
    regions_reclaimed_total: IntCounter,
    retirements_dropped_total: IntCounter,
    retirements_pending: prometheus::IntGauge,
    skipped_spills_total: IntCounterVec,
    spill_duration_seconds: Histogram,
    restore_duration_seconds: Histogram,
}

fn counter(name: &str, help: &str) -> Result<IntCounter, prometheus::Error> {
    IntCounter::new(name, help)
}

fn duration(name: &str, help: &str) -> Result<Histogram, prometheus::Error> {
    Histogram::with_opts(
        HistogramOpts::new(name, help).buckets(SSD_DURATION_BUCKETS_SECONDS.to_vec()),
    )
}

/// Raises `counter` to `value` (the store's counters only grow).
fn catch_up(counter: &IntCounter, value: u64) {
    counter.inc_by(value.saturating_sub(counter.get()));
}

impl SsdMetrics {
    /// Registers the families in `metrics` with every state and reason at zero. Errors only
    /// on a malformed or repeated family (a bug).
    pub fn register(metrics: &Metrics) -> Result<SsdMetrics, prometheus::Error> {
        let ssd = SsdMetrics::define()?;
        ssd.declare_at_zero();
        ssd.register_in(metrics)?;
        Ok(ssd)
    }

    /// Defines the families, unregistered; errors only on a malformed family (a bug).
    fn define() -> Result<SsdMetrics, prometheus::Error> {
        Ok(SsdMetrics {
            bytes: IntGaugeVec::new(
                Opts::new(
                    "kvtier_ssd_bytes",
                    "Bytes of the node's SSD store by state.",
                ),
                &["state"],
            )?,
            spills_total: counter(
                "kvtier_ssd_spills_total",
                "Objects spilled to the SSD store.",
            )?,
            spill_bytes_total: counter(
                "kvtier_ssd_spill_bytes_total",
                "Bytes spilled to the SSD store.",
            )?,
            restores_total: counter(
                "kvtier_ssd_restores_total",
                "Objects restored from the SSD store.",
            )?,
            restore_bytes_total: counter(
                "kvtier_ssd_restore_bytes_total",
                "Bytes restored from the SSD store.",
            )?,
            checksum_failures_total: counter(
                "kvtier_ssd_checksum_failures_total",
                "SSD reads whose bytes failed their checksum (a miss; the space is reclaimed).",
            )?,
            regions_reclaimed_total: counter(
                "kvtier_ssd_regions_reclaimed_total",
                "SSD regions reclaimed whole to make room.",
            )?,
            retirements_dropped_total: counter(
                "kvtier_ssd_retirements_dropped_total",
                "Replicas of dropped SSD objects given up before the directory retired them.",
            )?,
            retirements_pending: prometheus::IntGauge::new(
                "kvtier_ssd_retirements_pending",
                "Replicas of dropped SSD objects still to retire at the directory.",
            )?,
            skipped_spills_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_ssd_skipped_spills_total",
                    "Spills skipped, by reason.",
                ),
                &["reason"],
            )?,
            spill_duration_seconds: duration(
                "kvtier_ssd_spill_duration_seconds",
                "Time to write one spilled object.",
            )?,
            restore_duration_seconds: duration(
                "kvtier_ssd_restore_duration_seconds",
                "Time to read and verify one restored object.",
            )?,
        })
    }

    /// Declares every state of `kvtier_ssd_bytes` and every reason of
    /// `kvtier_ssd_skipped_spills_total` at zero, so their series exist from the start.
    fn declare_at_zero(&self) {
        for state in ["capacity", "live", "writing", "reclaimable", "free"] {
            self.bytes.with_label_values(&[state]).set(0);
        }
        for reason in SkipReason::ALL {
            self.skipped_spills_total
                .with_label_values(&[reason.label()]);
        }
    }

    /// Registers every family in `metrics`; errors on a repeated family (a bug).
    fn register_in(&self, metrics: &Metrics) -> Result<(), prometheus::Error> {
        metrics.register(Box::new(self.bytes.clone()))?;
        for family in [
            &self.spills_total,
            &self.spill_bytes_total,
            &self.restores_total,
            &self.restore_bytes_total,
            &self.checksum_failures_total,
            &self.regions_reclaimed_total,
            &self.retirements_dropped_total,
        ] {
            metrics.register(Box::new(family.clone()))?;
        }
        metrics.register(Box::new(self.retirements_pending.clone()))?;
        metrics.register(Box::new(self.skipped_spills_total.clone()))?;
        metrics.register(Box::new(self.spill_duration_seconds.clone()))?;
        metrics.register(Box::new(self.restore_duration_seconds.clone()))
    }

    /// Counts one skipped spill that never reached the store (it could not be opened).
    pub fn skip(&self, reason: SkipReason) {
        self.skipped_spills_total
            .with_label_values(&[reason.label()])
            .inc();
    }

    /// Records one spill's write time.
    pub fn observe_spill(&self, latency: Duration) {
        self.spill_duration_seconds.observe(latency.as_secs_f64());
    }

    /// Records one restore's read time.
    pub fn observe_restore(&self, latency: Duration) {
        self.restore_duration_seconds.observe(latency.as_secs_f64());
    }

    /// Exports the retirements still to send and those given up so far.
    pub fn retirements(&self, pending: usize, dropped: u64) {
        self.retirements_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        catch_up(&self.retirements_dropped_total, dropped);
    }

    /// Exports the store's usage and counters.
    pub fn publish(&self, usage: &SsdUsage, counters: &SsdCounters) {
        let gauge = |state: &str, bytes: u64| {
            self.bytes
                .with_label_values(&[state])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        };
        gauge("capacity", usage.capacity_bytes);
        gauge("live", usage.live_bytes);
        gauge("writing", usage.writing_bytes);
        gauge("reclaimable", usage.reclaimable_bytes);
        gauge("free", usage.free_bytes);
        let load = |value: &std::sync::atomic::AtomicU64| value.load(Ordering::Relaxed);
        catch_up(&self.spills_total, load(&counters.spills));
        catch_up(&self.spill_bytes_total, load(&counters.spill_bytes));
        catch_up(&self.restores_total, load(&counters.restores));
        catch_up(&self.restore_bytes_total, load(&counters.restore_bytes));
        catch_up(
            &self.checksum_failures_total,
            load(&counters.checksum_failures),
        );
        catch_up(
            &self.regions_reclaimed_total,
            load(&counters.regions_reclaimed),
        );
        for reason in SkipReason::ALL {
            let skipped = self
                .skipped_spills_total
                .with_label_values(&[reason.label()]);
            let stored = load(&counters.skipped[reason.index()]);
            skipped.inc_by(stored.saturating_sub(skipped.get()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_counters_reach_the_text_format() {
        let metrics = Metrics::new().unwrap();
        let ssd = SsdMetrics::register(&metrics).unwrap();
        let counters = SsdCounters::default();
        counters.spills.store(3, Ordering::Relaxed);
        counters.skipped[SkipReason::NoSpace.index()].store(2, Ordering::Relaxed);
        let usage = SsdUsage {
            capacity_bytes: 1 << 20,
            ..SsdUsage::default()
        };
        ssd.publish(&usage, &counters);
        ssd.publish(&usage, &counters);
        ssd.retirements(4, 2);
        ssd.retirements(1, 3);
        let text = metrics.render();
        assert!(text.contains("kvtier_ssd_retirements_pending 1"), "{text}");
        assert!(
            text.contains("kvtier_ssd_retirements_dropped_total 3"),
            "{text}"
        );
        assert!(text.contains("kvtier_ssd_spills_total 3"), "{text}");
        assert!(text.contains("kvtier_ssd_skipped_spills_total{reason=\"no_space\"} 2"));
        assert!(text.contains("kvtier_ssd_bytes{state=\"capacity\"} 1048576"));
        assert!(text.contains("kvtier_ssd_skipped_spills_total{reason=\"full\"} 0"));
    }
}
