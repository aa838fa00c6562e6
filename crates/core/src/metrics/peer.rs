//! Node-to-node transfers' metrics on a node: transfers by side and result, refused
//! streams by reason, object bytes by side. Labels are fixed sets, never ids or names.

use super::Metrics;
use prometheus::{IntCounterVec, Opts};

/// The sides of a transfer.
const SIDES: [&str; 2] = ["sent", "received"];
/// The results of a transfer: `dropped` is a push its sender did not start (its length
/// differs from its source's, or its queue of pushes was full).
const RESULTS: [&str; 4] = ["committed", "failed", "refused", "dropped"];
/// Why a receiver refused a stream (`crate::node::transfers::TransferRefusal::reason`,
/// plus the receiver's own bounds and the header check).
pub const REFUSAL_REASONS: [&str; 9] = [
    "not_expected",
    "wrong_sender",
    "wrong_token",
    "mismatch",
    "expired",
    "full",
    "busy",
    "bad_header",
    "no_room",
];

/// The peer-transfer families, registered in a node's [`Metrics`].
#[derive(Debug)]
pub struct PeerMetrics {
    transfers_total: IntCounterVec,
    refusals_total: IntCounterVec,
    bytes_total: IntCounterVec,
}

impl PeerMetrics {
    /// Registers the families in `metrics` with every label at zero. Errors only on a
    /// malformed or repeated family (a bug).
    pub fn register(metrics: &Metrics) -> Result<PeerMetrics, prometheus::Error> {
        let peer = PeerMetrics {
            transfers_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_peer_transfers_total",
                    "Replica copies between nodes over QUIC, by side and result.",
                ),
                &["side", "result"],
            )?,
            refusals_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_peer_refusals_total",
                    "Transfer streams this node refused before any byte reached its pool, by reason.",
                ),
                &["reason"],
            )?,
            bytes_total: IntCounterVec::new(
                Opts::new(
                    "kvtier_peer_bytes_total",
                    "Object bytes of committed copies between nodes, by side.",
                ),
                &["side"],
            )?,
        };
        for side in SIDES {
            peer.bytes_total.with_label_values(&[side]);
            for result in RESULTS {
                peer.transfers_total.with_label_values(&[side, result]);
            }
        }
        for reason in REFUSAL_REASONS {
            peer.refusals_total.with_label_values(&[reason]);
        }
        metrics.register(Box::new(peer.transfers_total.clone()))?;
        metrics.register(Box::new(peer.refusals_total.clone()))?;
        metrics.register(Box::new(peer.bytes_total.clone()))?;
        Ok(peer)
    }

    /// Counts a transfer this node sent (`sent`) or received (`received`) that ended with
    /// `result` (`committed`, `failed`, `refused`, `dropped`); a committed one adds its bytes.
    pub fn transfer(&self, side: &'static str, result: &'static str, bytes: u64) {
        self.transfers_total
            .with_label_values(&[side, result])
            .inc();
        if result == "committed" {
            self.bytes_total.with_label_values(&[side]).inc_by(bytes);
        }
    }

    /// Counts a refused stream; `reason` is one of [`REFUSAL_REASONS`].
    pub fn refuse(&self, reason: &'static str) {
        self.refusals_total.with_label_values(&[reason]).inc();
    }
}
