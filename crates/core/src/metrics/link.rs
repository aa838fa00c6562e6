//! A node's link to the directory, as an operator watches an outage: whether the node's
//! lookups reach the directory now, how many times they stopped reaching it, and what its
//! rejoins kept of its shared extents.

use super::Metrics;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};

/// A node's link families, registered in its [`Metrics`].
#[derive(Debug)]
pub struct NodeLinkMetrics {
    directory_reachable: IntGauge,
    directory_outages_total: IntCounter,
    rejoins_total: IntCounterVec,
    rejoin_extents_total: IntCounterVec,
    early_grants_total: IntCounterVec,
}

/// Why a node rejoined: the label of `kvtier_node_rejoins_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejoinCause {
    /// No heartbeat answered for the fence window.
    Silence,
    /// The directory no longer knew the session (a restart, a new leader, a fence).
    Unknown,
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
            rejoins_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_node_rejoins_total",
                    "Sessions this node lost and rejoined, by cause: silence (no heartbeat answered for the fence window) or unknown_session (the directory restarted, failed over or fenced it).",
                ),
                &["cause"],
            )?,
            rejoin_extents_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_node_rejoin_extents_total",
                    "Shared-pool extents this node's rejoins kept (claimed back) or lost (granted on, or refused), with the replicas inside.",
                ),
                &["outcome"],
            )?,
            early_grants_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_node_early_grants_total",
                    "Store grants this node handed out before the directory answered their reserve, by what it answered: reserved (in the granted pool), no_room (placed in another pool or nowhere for room: the store skipped) or ended (already stored, being stored, skipped for another reason, or failed).",
                ),
                &["outcome"],
            )?,
        };
        metrics.register(Box::new(families.directory_reachable.clone()))?;
        metrics.register(Box::new(families.directory_outages_total.clone()))?;
        metrics.register(Box::new(families.rejoins_total.clone()))?;
        metrics.register(Box::new(families.rejoin_extents_total.clone()))?;
        metrics.register(Box::new(families.early_grants_total.clone()))?;
        Ok(families)
    }

    /// A rejoin began, for `cause`.
    pub fn rejoin_began(&self, cause: RejoinCause) {
        let label = match cause {
            RejoinCause::Silence => "silence",
            RejoinCause::Unknown => "unknown_session",
        };
        self.rejoins_total.with_label_values(&[label]).inc();
    }

    /// A rejoin ended, with the shared extents it kept and lost.
    pub fn rejoin_ended(&self, extents_kept: usize, extents_lost: usize) {
        self.rejoin_extents_total
            .with_label_values(&["kept"])
            .inc_by(extents_kept as u64);
        self.rejoin_extents_total
            .with_label_values(&["lost"])
            .inc_by(extents_lost as u64);
    }

    /// A batch of grants handed out before their reserve was answered: `reserved` reserved
    /// where their pages are, `no_room` placed elsewhere or nowhere for room, `ended` ended
    /// otherwise.
    pub fn early_grants_answered(&self, reserved: usize, no_room: usize, ended: usize) {
        for (label, count) in [
            ("reserved", reserved),
            ("no_room", no_room),
            ("ended", ended),
        ] {
            self.early_grants_total
                .with_label_values(&[label])
                .inc_by(count as u64);
        }
    }

    /// Exports whether lookups reach the directory (`reaching`) and the outages so far.
    pub fn publish(&self, reaching: bool, outages: u64) {
        self.directory_reachable.set(i64::from(reaching));
        self.directory_outages_total
            .inc_by(outages.saturating_sub(self.directory_outages_total.get()));
    }
}
