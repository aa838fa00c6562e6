//! A directory process's place in the election, as an operator watches a failover: whether
//! it leads or stands by, its term, and how many times it won.

use super::Metrics;
use prometheus::{IntCounter, IntGauge, IntGaugeVec, Opts};

/// The roles a directory process has, in `kvtier_directory_role{role}`.
pub const ROLES: [&str; 2] = ["leader", "standby"];

/// A directory's election families, registered in its [`Metrics`].
#[derive(Debug)]
pub struct ElectionMetrics {
    role: IntGaugeVec,
    term: IntGauge,
    elected_total: IntCounter,
}

impl ElectionMetrics {
    /// Registers the families in `metrics`. Errors only on a malformed or repeated family.
    pub fn register(metrics: &Metrics) -> Result<ElectionMetrics, prometheus::Error> {
        let families = ElectionMetrics {
            role: IntGaugeVec::new(
                Opts::new(
                    "kvtier_directory_role",
                    "1 for this directory process's role: leader (serves) or standby (waits on the election in etcd; a single directory without etcd is a leader).",
                ),
                &["role"],
            )?,
            term: IntGauge::new(
                "kvtier_directory_term",
                "The term this process leads in (the election key's etcd revision); 0 while it stands by or without etcd.",
            )?,
            elected_total: IntCounter::new(
                "kvtier_directory_elected_total",
                "Times this process won the election (at most once: a deposed leader exits).",
            )?,
        };
        metrics.register(Box::new(families.role.clone()))?;
        metrics.register(Box::new(families.term.clone()))?;
        metrics.register(Box::new(families.elected_total.clone()))?;
        Ok(families)
    }

    /// Exports that the process stands by.
    pub fn standing_by(&self) {
        self.set_role("standby");
        self.term.set(0);
    }

    /// Exports that the process leads in `term` (0 without an election).
    pub fn leading(&self, term: u64, elected: bool) {
        self.set_role("leader");
        self.term.set(i64::try_from(term).unwrap_or(i64::MAX));
        if elected {
            self.elected_total.inc();
        }
    }

    fn set_role(&self, role: &str) {
        for each in ROLES {
            self.role
                .with_label_values(&[each])
                .set(i64::from(each == role));
        }
    }
}
