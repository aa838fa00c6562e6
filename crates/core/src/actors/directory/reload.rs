//! What a re-read `cluster.toml` changes for a running directory (SIGHUP, `kvtier ctl
//! reload`): a plain function of the configuration in force and the new one, applied by the
//! directory actor only when the whole file is acceptable. New nodes, domains and CXL pools
//! are applied live; a removed node is drained; a change that cannot be applied live (the
//! directory's own section, a CXL pool's geometry, identity or removal) refuses the whole
//! reload, by name.

use crate::config::{ClusterConfig, CxlPoolSection, NodeSection};
use crate::directory::reload::{ConfigChange, ReloadRefusal};

/// The changes from `current` to `new`, or why `new` cannot be applied live.
pub fn diff(current: &ClusterConfig, new: &ClusterConfig) -> Result<ConfigChange, ReloadRefusal> {
    check_directory_section(current, new)?;
    let mut change = ConfigChange::default();
    for pool in &current.cxl_pools {
        match new
            .cxl_pools
            .iter()
            .find(|candidate| candidate.name == pool.name)
        {
            None => return Err(not_live(format!("cxl_pools.{}", pool.name))),
            Some(candidate) => check_pool_unchanged(pool, candidate)?,
        }
    }
    change.added_cxl_pools = new
        .cxl_pools
        .iter()
        .filter(|pool| !current.cxl_pools.iter().any(|old| old.name == pool.name))
        .map(|pool| pool.name.clone())
        .collect();
    for node in &new.nodes {
        match current.nodes.iter().find(|old| old.name == node.name) {
            None => change.added_nodes.push(node.name.clone()),
            Some(old) if grant_changed(old, node) => change.regranted_nodes.push(node.name.clone()),
            Some(_) => {}
        }
    }
    change.removed_nodes = current
        .nodes
        .iter()
        .filter(|old| !new.nodes.iter().any(|node| node.name == old.name))
        .map(|old| old.name.clone())
        .collect();
    let (old_costs, new_costs) = (
        &current.directory.limits.namespace_costs,
        &new.directory.limits.namespace_costs,
    );
    let mut models: Vec<&String> = old_costs.keys().chain(new_costs.keys()).collect();
    models.sort();
    models.dedup();
    change.repriced_namespaces = models
        .into_iter()
        .filter(|model| old_costs.get(*model) != new_costs.get(*model))
        .cloned()
        .collect();
    Ok(change)
}

fn not_live(name: String) -> ReloadRefusal {
    ReloadRefusal::NotLive(name)
}

/// The directory's own section (its identity, addresses, limits and profiles) is read once;
/// the namespaces' costs and the tenants' quotas, kept with the limits, change live.
fn check_directory_section(
    current: &ClusterConfig,
    new: &ClusterConfig,
) -> Result<(), ReloadRefusal> {
    let (old, new) = (&current.directory, &new.directory);
    let fields = [
        ("directory.name", old.name == new.name),
        ("directory.listen", old.listen == new.listen),
        ("directory.metrics", old.metrics == new.metrics),
        ("directory.etcd", old.etcd == new.etcd),
        ("directory.election", old.election == new.election),
        ("directory.lease_ttl_s", old.lease_ttl_s == new.lease_ttl_s),
        ("directory.standbys", old.standbys == new.standbys),
        ("directory.shards", old.shards == new.shards),
        ("directory.certs", old.certs == new.certs),
        (
            "directory.tick_interval_ms",
            old.tick_interval_ms == new.tick_interval_ms,
        ),
        (
            "directory.limits",
            without_costs(&old.limits) == without_costs(&new.limits),
        ),
    ];
    match fields.into_iter().find(|(_, same)| !same) {
        Some((name, _)) => Err(not_live(name.into())),
        None => Ok(()),
    }
}

/// The limits less what a reload applies (the namespaces' costs, the tenants' quotas).
fn without_costs(limits: &crate::directory::DirectoryConfig) -> crate::directory::DirectoryConfig {
    let mut limits = limits.clone();
    limits.namespace_costs.clear();
    limits.group_quotas.clear();
    limits
}

/// A registered CXL pool keeps its geometry and identity: nodes have mapped it and the
/// directory has granted extents of it.
fn check_pool_unchanged(old: &CxlPoolSection, new: &CxlPoolSection) -> Result<(), ReloadRefusal> {
    let fields = [
        ("capacity_bytes", old.capacity_bytes == new.capacity_bytes),
        ("extent_bytes", old.extent_bytes == new.extent_bytes),
        ("page_bytes", old.page_bytes == new.page_bytes),
        ("uuid", old.uuid == new.uuid),
        ("domain", old.domain == new.domain),
        ("path", old.path == new.path),
    ];
    match fields.into_iter().find(|(_, same)| !same) {
        Some((field, _)) => Err(not_live(format!("cxl_pools.{}.{field}", old.name))),
        None => Ok(()),
    }
}

/// Whether what the directory grants the node (domains, models) changed.
fn grant_changed(old: &NodeSection, new: &NodeSection) -> bool {
    old.access() != new.access()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const BASE: &str = r#"
[directory]
listen = "127.0.0.1:7400"
certs = "/etc/kvtier-reload-test/certs"

[[cxl_pools]]
name = "cxl0"
domain = 0
path = "/dev/shm/kvtier-reload-test-cxl0"
capacity_bytes = 67108864
uuid = "000000000000000000000000000000aa"

[[nodes]]
name = "node-a"
socket = "/run/kvtier-reload-test/a.sock"
domains = [0]
[nodes.cpu_pool]
capacity_bytes = 65536

[[nodes]]
name = "node-b"
socket = "/run/kvtier-reload-test/b.sock"
[nodes.cpu_pool]
capacity_bytes = 65536
"#;

    const NODE_C: &str = r#"
[[nodes]]
name = "node-c"
socket = "/run/kvtier-reload-test/c.sock"
domains = [0]
[nodes.cpu_pool]
capacity_bytes = 65536
"#;

    fn load(text: &str) -> Result<ClusterConfig, String> {
        static FILES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let file = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let directory =
            std::env::temp_dir().join(format!("kvtier-reload-{}-{file}", std::process::id(),));
        std::fs::create_dir_all(&directory).map_err(|error| error.to_string())?;
        let path = directory.join("cluster.toml");
        std::fs::write(&path, text).map_err(|error| error.to_string())?;
        let loaded = ClusterConfig::load(Path::new(&path)).map_err(|error| format!("{error:#}"));
        let _ = std::fs::remove_dir_all(&directory);
        loaded
    }

    #[test]
    fn the_same_file_changes_nothing() {
        let config = load(BASE).unwrap();
        assert!(diff(&config, &config).unwrap().is_empty());
    }

    #[test]
    fn added_removed_and_regranted_nodes_and_pools_are_listed() {
        let current = load(BASE).unwrap();
        let text = format!(
            "{}{NODE_C}\n[[cxl_pools]]\nname = \"cxl1\"\ndomain = 1\npath = \"/dev/shm/x\"\ncapacity_bytes = 67108864\nuuid = \"000000000000000000000000000000bb\"\n",
            BASE.replace("name = \"node-b\"", "name = \"node-d\"")
                .replacen("domains = [0]\n", "domains = [0, 1]\n", 1)
        );
        let change = diff(&current, &load(&text).unwrap()).unwrap();
        assert_eq!(change.added_nodes, ["node-d", "node-c"]);
        assert_eq!(change.removed_nodes, ["node-b"]);
        assert_eq!(change.regranted_nodes, ["node-a"]);
        assert_eq!(change.added_cxl_pools, ["cxl1"]);
    }

    #[test]
    fn a_pool_geometry_change_is_refused_by_name() {
        let current = load(BASE).unwrap();
        for (field, from, to) in [
            (
                "capacity_bytes",
                "capacity_bytes = 67108864",
                "capacity_bytes = 134217728",
            ),
            ("uuid", "0000aa\"", "0000ab\""),
        ] {
            let new = load(&BASE.replacen(from, to, 1)).unwrap();
            assert_eq!(
                diff(&current, &new),
                Err(ReloadRefusal::NotLive(format!("cxl_pools.cxl0.{field}")))
            );
        }
        let extent = BASE.replace(
            "capacity_bytes = 67108864\n",
            "capacity_bytes = 67108864\nextent_bytes = 1048576\n",
        );
        assert_eq!(
            diff(&current, &load(&extent).unwrap()),
            Err(ReloadRefusal::NotLive("cxl_pools.cxl0.extent_bytes".into()))
        );
    }

    #[test]
    fn a_namespace_cost_changes_live_and_an_invalid_one_is_refused() {
        let current = load(BASE).unwrap();
        let ctl = "\n[namespaces.\"kvtier-ctl\"]\nrecompute_us_per_mib = 5000.0\n";
        let priced = load(&format!("{BASE}{ctl}")).unwrap();
        let change = diff(&current, &priced).unwrap();
        assert_eq!(change.repriced_namespaces, ["kvtier-ctl"]);
        assert_eq!(
            change,
            ConfigChange {
                repriced_namespaces: vec!["kvtier-ctl".into()],
                ..ConfigChange::default()
            }
        );
        let cheaper = load(&format!("{BASE}{}", ctl.replace("5000.0", "2.5"))).unwrap();
        assert_eq!(
            diff(&priced, &cheaper).unwrap().repriced_namespaces,
            ["kvtier-ctl"]
        );
        assert!(diff(&priced, &priced).unwrap().is_empty());
        assert_eq!(
            diff(&priced, &current).unwrap().repriced_namespaces,
            ["kvtier-ctl"]
        );
        for invalid in [
            ctl.replace("5000.0", "0.0"),
            ctl.replace("recompute_us_per_mib = 5000.0", ""),
            format!("{ctl}prefill_us_per_token = 1.0\n"),
        ] {
            let error = load(&format!("{BASE}{invalid}")).unwrap_err();
            assert!(error.contains("namespaces.\"kvtier-ctl\""), "{error}");
        }
    }

    #[test]
    fn removing_a_pool_or_changing_the_directory_is_refused() {
        let current = load(BASE).unwrap();
        let moved = load(&BASE.replace("7400", "7401")).unwrap();
        assert_eq!(
            diff(&current, &moved),
            Err(ReloadRefusal::NotLive("directory.listen".into()))
        );
        let start = BASE.find("[[cxl_pools]]").unwrap();
        let end = BASE.find("[[nodes]]").unwrap();
        let without = format!("{}{}", &BASE[..start], &BASE[end..]);
        let without = load(&without.replace("domains = [0]\n", "")).unwrap();
        assert_eq!(
            diff(&current, &without),
            Err(ReloadRefusal::NotLive("cxl_pools.cxl0".into()))
        );
    }

    #[test]
    fn a_parse_error_names_its_line() {
        let broken = BASE.replace("b.sock\"", "b.sock");
        let error = load(&broken).unwrap_err();
        assert!(error.contains("line 22"), "{error}");
    }
}
