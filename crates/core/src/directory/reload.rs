//! What a reload of `cluster.toml` changed, or why it was refused: the directory's answer to
//! SIGHUP and `kvtier ctl reload`. The comparison of the two files is the directory
//! process's (`actors::directory::reload`).

use serde::{Deserialize, Serialize};
use thiserror::Error;
/// The changes a reload applies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigChange {
    /// Nodes the new file adds: their certificates are accepted from now on.
    pub added_nodes: Vec<String>,
    /// Nodes the new file no longer names: each is drained, then refused.
    pub removed_nodes: Vec<String>,
    /// Nodes whose domains or models changed: the new grant applies from their next session.
    pub regranted_nodes: Vec<String>,
    /// CXL pools the new file adds: formatted and registered now.
    pub added_cxl_pools: Vec<String>,
    /// Namespaces (by model name) whose recompute cost (`[namespaces."<model>"]`) the new
    /// file sets, changes or removes: the directory's next demotion and replication
    /// decisions price them so.
    pub repriced_namespaces: Vec<String>,
}

impl ConfigChange {
    /// Whether the reload changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == ConfigChange::default()
    }
}

/// Why a reload was refused as a whole; the configuration in force stays.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum ReloadRefusal {
    /// The file could not be read, parsed or validated (the reason names the line of a
    /// parse error).
    #[error("{0}")]
    Invalid(String),
    /// A change that only a restart of the directory applies.
    #[error("`{0}` cannot change while the directory runs; restart the directory to apply it")]
    NotLive(String),
}
