//! SIGHUP on a node: re-reads `cluster.toml` (checked whole, as at start) and applies what
//! a running node can change: its tenant rules, for the connections it accepts from then
//! on (users and groups resolved again). Everything else of the node's section (pools,
//! orders, socket, peer endpoint, SSD) applies at its next start; a change there is named in
//! the log. A file that does not load is refused and the configuration in force stays.

use crate::config::{ClusterConfig, NodeSection};
use crate::node::Tenants;
use std::path::Path;

/// What a reload applies to a running node.
#[derive(Debug, PartialEq, Eq)]
pub struct NodeReload {
    /// New tenant rules, when they differ from those in force.
    pub tenants: Option<Tenants>,
    /// Whether the node's own section changed: that takes a restart.
    pub section_changed: bool,
}

/// Compares the configuration in force (`section`, `tenants`) with a new one.
pub fn plan(
    section: &NodeSection,
    tenants: &Tenants,
    new_section: &NodeSection,
    new_tenants: Tenants,
) -> NodeReload {
    NodeReload {
        tenants: (new_tenants != *tenants).then_some(new_tenants),
        section_changed: new_section != section,
    }
}

/// Reads `path` again for node `section` (running as `owner_uid`), with the user and group
/// databases' texts `passwd` and `group`.
pub fn read(
    path: &Path,
    section: &NodeSection,
    tenants: &Tenants,
    owner_uid: u32,
    (passwd, group): (&str, &str),
) -> anyhow::Result<NodeReload> {
    let config = ClusterConfig::load(path)?;
    let new_section = config.node(&section.name)?;
    let new_tenants = config.tenants(new_section, owner_uid, passwd, group)?;
    Ok(plan(section, tenants, new_section, new_tenants))
}

/// Logs what a reload did, or why it was refused.
pub fn log(path: &Path, outcome: &anyhow::Result<NodeReload>) {
    let path = path.display();
    match outcome {
        Err(error) => tracing::warn!(
            "SIGHUP: reloading {path} refused, the configuration in force stays: {error:#}"
        ),
        Ok(reload) => {
            if reload.tenants.is_some() {
                tracing::info!(
                    "SIGHUP: reloaded {path}: new tenant rules apply to new connections"
                );
            }
            if reload.section_changed {
                tracing::warn!("SIGHUP: reloaded {path}: this node's section changed; restart the node to apply it");
            }
            if reload.tenants.is_none() && !reload.section_changed {
                tracing::info!("SIGHUP: reloaded {path}: nothing changed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\n[nodes.cpu_pool]\ncapacity_bytes = 65536\n";
    const RULE: &str = "[[tenants]]\nname = \"t\"\nuids = [7]\nnamespaces = [\"*\"]\n";

    fn loaded(text: &str) -> (NodeSection, Tenants) {
        let config = ClusterConfig::parse(text, Path::new("/")).unwrap();
        let tenants = config.tenants(&config.nodes[0], 0, "", "").unwrap();
        (config.nodes[0].clone(), tenants)
    }

    #[test]
    fn tenant_rules_apply_and_a_changed_section_is_named() {
        let (section, tenants) = loaded(NODE);
        let unchanged = loaded(NODE);
        assert_eq!(
            plan(&section, &tenants, &unchanged.0, unchanged.1),
            NodeReload {
                tenants: None,
                section_changed: false
            }
        );
        let ruled = loaded(&format!("{NODE}{RULE}"));
        let reload = plan(&section, &tenants, &ruled.0, ruled.1.clone());
        assert_eq!(reload.tenants, Some(ruled.1));
        assert!(!reload.section_changed);
        let bigger = loaded(&NODE.replace("65536", "131072"));
        let reload = plan(&section, &tenants, &bigger.0, bigger.1);
        assert_eq!(reload.tenants, None);
        assert!(reload.section_changed);
    }
}
