//! A node's link to the directory, as an operator watches an outage: whether the node's
//! lookups reach the directory now, and how many times they stopped reaching it.

use super::Metrics;
use prometheus::{IntCounter, IntGauge};

/// A node's link families, registered in its [`Metrics`].
#[derive(Debug)]
pub struct NodeLinkMetrics {
    directory_reachable: IntGauge,
    directory_outages_total: IntCounter,
}

impl NodeLinkMetrics {
    /// Registers the families in `metrics`. Errors only on a malformed or repeated family.
    pub fn register(metrics: &Metrics) -> Result<NodeLinkMetrics, prometheus::Error> {
        let families = NodeLinkMetrics {
            directory_reachable: IntGauge::new(
                "kvtier_directory_reachable",
                "1 while this node's lookups and stores reach the directory; 0 while it answers them with misses and skips at once (the directory out of reach, or being rejoined).",
            )?,
            directory_outages_total: IntCounter::new(
                "kvtier_directory_outages_total",
                "Times the directory stopped answering this node.",
            )?,
        };
        metrics.register(Box::new(families.directory_reachable.clone()))?;
        metrics.register(Box::new(families.directory_outages_total.clone()))?;
        Ok(families)
    }

    /// Exports whether lookups reach the directory (`reaching`) and the outages so far.
    pub fn publish(&self, reaching: bool, outages: u64) {
        self.directory_reachable.set(i64::from(reaching));
        self.directory_outages_total
            .inc_by(outages.saturating_sub(self.directory_outages_total.get()));
    }
}
