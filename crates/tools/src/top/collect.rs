//! Where `kvtier top`'s snapshots come from: the cluster status a node serves on its socket
//! (forwarded from the directory) and each process's `/metrics`, at the addresses
//! `cluster.toml` gives. Nothing else: no second source of truth.

use super::model::{ProcessMetrics, Snapshot};
use crate::ctl::cluster::Control;
use anyhow::bail;
use kvtier_core::config::ClusterConfig;
use kvtier_core::metrics::scrape::scrape_metrics;
use kvtier_core::protocol::messages::ClusterStatus;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a status request may take: a refresh every second must not stall for long on a
/// node whose directory is out of reach.
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// The cluster as `cluster.toml` describes it, and a connection to one node for the status.
pub struct Source {
    config_path: PathBuf,
    config: ClusterConfig,
    /// The node to ask; `None`: the first node of the configuration that answers.
    node: Option<String>,
    control: Option<Control>,
    origin: Instant,
}

impl Source {
    /// Reads `config_path`; `node` names the node whose socket to use (else any).
    pub fn open(config_path: PathBuf, node: Option<String>) -> anyhow::Result<Source> {
        let config = ClusterConfig::load(&config_path)?;
        if let Some(name) = &node {
            config.node(name)?;
        }
        Ok(Source {
            config_path,
            config,
            node,
            control: None,
            origin: Instant::now(),
        })
    }

    /// One snapshot: the status (an error when no node answers: the cluster cannot be
    /// reached), then every exporter's metrics (an unreadable one is recorded, not fatal).
    /// The configuration is read again first, so nodes added by a reload are seen; a file
    /// that no longer parses leaves the previous one in force.
    pub fn snapshot(&mut self) -> anyhow::Result<Snapshot> {
        if let Ok(config) = ClusterConfig::load(&self.config_path) {
            self.config = config;
        }
        let status = self.status()?;
        let mut metrics = BTreeMap::new();
        if let Some(address) = self.config.directory.metrics {
            metrics.insert("directory".to_owned(), read(address));
        }
        for node in &self.config.nodes {
            if let Some(address) = node.metrics {
                metrics.insert(node.name.clone(), read(address));
            }
        }
        Ok(Snapshot {
            taken: self.origin.elapsed(),
            status,
            metrics,
        })
    }

    fn status(&mut self) -> anyhow::Result<ClusterStatus> {
        if let Some(control) = &self.control {
            match control.status() {
                Ok(status) => return Ok(status),
                Err(_) => self.control = None,
            }
        }
        let mut failures = Vec::new();
        let candidates = self
            .config
            .nodes
            .iter()
            .filter(|node| self.node.as_ref().is_none_or(|name| *name == node.name));
        for node in candidates {
            let asked = Control::connect_socket(&node.socket, STATUS_TIMEOUT)
                .and_then(|control| Ok((control.status()?, control)));
            match asked {
                Ok((status, control)) => {
                    self.control = Some(control);
                    return Ok(status);
                }
                Err(error) => failures.push(format!("{}: {error:#}", node.name)),
            }
        }
        if failures.is_empty() {
            bail!("{} names no node", self.config_path.display());
        }
        bail!("no node answered ({})", failures.join("; "))
    }
}

fn read(address: std::net::SocketAddr) -> Result<ProcessMetrics, String> {
    scrape_metrics(address)
        .map(|body| ProcessMetrics::from_text(&body))
        .map_err(|error| format!("{address}: {error}"))
}
