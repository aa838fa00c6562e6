//! How a node's CPU memory is split between its tenants: one partition per salt group
//! ([`SaltGroup`]), each its own sealed memory file and its own pool at the directory, handed
//! only to the connections of that group's tenants. Tenants of one salt share objects, so
//! they share a partition; tenants of different salts never map each other's bytes.
//!
//! A partition's size is the sum of the `cpu_bytes` its tenants' rules state; the groups
//! whose rules state none share what the others leave of `[nodes.cpu_pool] capacity_bytes`
//! equally. Sizes are rounded down to the pool's pages. A group all of whose tenants the
//! node refuses (a CXL pool of the node does not list them) gets no partition there. With
//! no tenant rule, the node's owner (unsalted) has the whole pool.
//!
//! In shared pools a salt group's bound is its quota instead: the sum of its rules'
//! `cxl_bytes` in each CXL pool and `ssd_bytes` in each SSD store, which the directory
//! enforces ([`crate::directory::TierQuota`]).

use super::{ClusterConfig, NodeSection};
use crate::model::{Medium, NodeId, PoolSpec, PoolTenancy, SaltGroup, Scope};
use anyhow::bail;
use std::collections::BTreeMap;

/// Partitions of one node's CPU memory: each is a pool at the directory and a file every
/// client of its tenants maps.
pub const CPU_PARTITIONS_MAX: usize = 32;

/// One partition of a node's CPU memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuPartition {
    /// Its pool's name: `<node>-cpu` when the node has one partition, else
    /// `<node>-cpu-<its first tenant>` (a metric label; never the salt).
    pub name: String,
    /// The salt group whose objects it holds.
    pub group: SaltGroup,
    /// Bytes of its data area, a whole number of pages.
    pub capacity_bytes: u64,
    /// The names of the tenant rules that map it, in file order (none for the owner).
    pub tenants: Vec<String>,
}

impl CpuPartition {
    /// The partition as a pool of `node`.
    pub fn spec(&self, node: NodeId, page_bytes: u64) -> PoolSpec {
        PoolSpec {
            name: self.name.clone(),
            medium: Medium::Cpu,
            scope: Scope::Host(node),
            capacity_bytes: self.capacity_bytes,
            page_bytes,
            extent_bytes: None,
            tenancy: PoolTenancy::Partition(self.group),
        }
    }
}

/// One salt group of the rules, as it is gathered.
struct Group<'a> {
    group: SaltGroup,
    tenants: Vec<&'a str>,
    stated_bytes: Option<u64>,
}

impl ClusterConfig {
    /// The CPU partitions of `node`, in a fixed order (the directory declares them in it at
    /// every start, so their pool ids survive its restarts), or why the rules and the
    /// node's pool cannot be split (sizes beyond the pool, a partition under one page, more
    /// than [`CPU_PARTITIONS_MAX`] salt groups, a node no tenant may use).
    pub fn cpu_partitions(&self, node: &NodeSection) -> anyhow::Result<Vec<CpuPartition>> {
        let (total, page) = (node.cpu_pool.capacity_bytes, node.cpu_pool.page_bytes);
        if self.tenants.is_empty() {
            return Ok(vec![CpuPartition {
                name: format!("{}-cpu", node.name),
                group: SaltGroup::of(None),
                capacity_bytes: total - total % page,
                tenants: Vec::new(),
            }]);
        }
        let groups = self.salt_groups(node)?;
        let stated: u64 = groups
            .iter()
            .filter_map(|group| group.stated_bytes)
            .fold(0, u64::saturating_add);
        if stated > total {
            bail!(
                "node `{}`: the tenants' cpu_bytes sum to {stated} bytes, more than its CPU pool's {total}",
                node.name
            );
        }
        let unstated = groups
            .iter()
            .filter(|group| group.stated_bytes.is_none())
            .count() as u64;
        let share = (total - stated).checked_div(unstated).unwrap_or(0);
        let single = groups.len() == 1;
        groups
            .into_iter()
            .map(|group| {
                let bytes = group.stated_bytes.unwrap_or(share);
                partition_of(node, group, bytes - bytes % page, single)
            })
            .collect()
    }

    /// The salt groups of the tenants `node` serves (those its CXL pools do not refuse),
    /// in rule order, each with its tenants and the CPU bytes they state; at least one, at
    /// most [`CPU_PARTITIONS_MAX`].
    fn salt_groups(&self, node: &NodeSection) -> anyhow::Result<Vec<Group<'_>>> {
        let refused = self.refused_tenants(node);
        let mut groups: Vec<Group<'_>> = Vec::new();
        for rule in self
            .tenants
            .iter()
            .filter(|rule| !refused.contains(rule.name.as_str()))
        {
            let group = SaltGroup::of(rule.salt.as_deref());
            let index = match groups.iter().position(|known| known.group == group) {
                Some(index) => index,
                None => {
                    groups.push(Group {
                        group,
                        tenants: Vec::new(),
                        stated_bytes: None,
                    });
                    groups.len() - 1
                }
            };
            let gathered = &mut groups[index];
            gathered.tenants.push(&rule.name);
            if let Some(bytes) = rule.cpu_bytes {
                gathered.stated_bytes =
                    Some(gathered.stated_bytes.unwrap_or(0).saturating_add(bytes));
            }
        }
        if groups.is_empty() {
            bail!(
                "node `{}`: its CXL pools refuse every tenant, so no engine may use it",
                node.name
            );
        }
        if groups.len() > CPU_PARTITIONS_MAX {
            bail!(
                "node `{}`: {} salt groups of tenants, more than the {CPU_PARTITIONS_MAX} CPU partitions a node has",
                node.name,
                groups.len()
            );
        }
        Ok(groups)
    }

    /// The host pools of `node` as the directory declares them at start, in a fixed order
    /// (so a restarted directory gives them the same ids): its CPU partitions, then its SSD
    /// store.
    pub fn host_pool_specs(&self, node: &NodeSection, id: NodeId) -> anyhow::Result<Vec<PoolSpec>> {
        let mut specs: Vec<PoolSpec> = self
            .cpu_partitions(node)?
            .iter()
            .map(|partition| partition.spec(id, node.cpu_pool.page_bytes))
            .collect();
        specs.extend(node.ssd_pool_spec(id));
        Ok(specs)
    }

    /// Each salt group's quotas by medium: the sums of its rules' `cxl_bytes` and
    /// `ssd_bytes` (a group none of whose rules states one has none there).
    pub(super) fn group_quotas(
        &self,
    ) -> BTreeMap<crate::model::SaltGroup, crate::directory::TierQuota> {
        let mut quotas: BTreeMap<_, crate::directory::TierQuota> = BTreeMap::new();
        let add = |total: &mut Option<u64>, bytes: Option<u64>| {
            if let Some(bytes) = bytes {
                *total = Some(total.unwrap_or(0).saturating_add(bytes));
            }
        };
        for rule in &self.tenants {
            if rule.cxl_bytes.is_none() && rule.ssd_bytes.is_none() {
                continue;
            }
            let quota = quotas
                .entry(crate::model::SaltGroup::of(rule.salt.as_deref()))
                .or_default();
            add(&mut quota.cxl_bytes, rule.cxl_bytes);
            add(&mut quota.ssd_bytes, rule.ssd_bytes);
        }
        quotas
    }

    /// The tenants `node` refuses: those a CXL pool it maps leaves out of its list.
    pub(crate) fn refused_tenants(&self, node: &NodeSection) -> std::collections::HashSet<&str> {
        let mut refused = std::collections::HashSet::new();
        for (pool, _) in self.cxl_pools_of(node) {
            let Some(listed) = &pool.tenants else {
                continue;
            };
            for rule in &self.tenants {
                if !listed.contains(&rule.name) {
                    refused.insert(rule.name.as_str());
                }
            }
        }
        refused
    }
}

/// The CPU partition of `group` on `node`, of `capacity_bytes` (whole pages): named after
/// the node alone when it is the node's only one, else after its first tenant.
fn partition_of(
    node: &NodeSection,
    group: Group<'_>,
    capacity_bytes: u64,
    single: bool,
) -> anyhow::Result<CpuPartition> {
    let first = group.tenants[0];
    if capacity_bytes == 0 {
        bail!(
            "node `{}`: the CPU partition of tenant `{first}` would be under one page ({} bytes)",
            node.name,
            node.cpu_pool.page_bytes
        );
    }
    let name = if single {
        format!("{}-cpu", node.name)
    } else {
        format!("{}-cpu-{first}", node.name)
    };
    if name.len() > crate::directory::NAME_BYTES_MAX {
        bail!(
            "node `{}`: the pool name `{name}` is longer than {} bytes",
            node.name,
            crate::directory::NAME_BYTES_MAX
        );
    }
    Ok(CpuPartition {
        name,
        group: group.group,
        capacity_bytes,
        tenants: group.tenants.into_iter().map(str::to_string).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const NODE: &str = "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\n[nodes.cpu_pool]\ncapacity_bytes = 1048576\npage_bytes = 65536\n";

    fn rule(name: &str, uid: u32, salt: Option<&str>, cpu_bytes: Option<u64>) -> String {
        let salt = salt
            .map(|salt| format!("salt = \"{salt}\"\n"))
            .unwrap_or_default();
        let bytes = cpu_bytes
            .map(|bytes| format!("cpu_bytes = {bytes}\n"))
            .unwrap_or_default();
        format!(
            "[[tenants]]\nname = \"{name}\"\nuids = [{uid}]\nnamespaces = [\"*\"]\n{salt}{bytes}"
        )
    }

    fn partitions(rules: &str) -> anyhow::Result<Vec<CpuPartition>> {
        let config = ClusterConfig::parse(&format!("{NODE}{rules}"), Path::new("/"))?;
        config.cpu_partitions(&config.nodes[0])
    }

    #[test]
    fn without_rules_the_owner_has_the_whole_pool() {
        let whole = partitions("").unwrap();
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].name, "a-cpu");
        assert_eq!(whole[0].capacity_bytes, 1 << 20);
        assert_eq!(whole[0].group, SaltGroup::of(None));
    }

    #[test]
    fn each_salt_group_gets_its_own_partition_and_shared_salts_share_one() {
        let rules = [
            rule("chat", 1, Some("s1"), Some(256 << 10)),
            rule("batch", 2, Some("s2"), None),
            rule("chat-too", 3, Some("s1"), Some(128 << 10)),
            rule("plain", 4, None, None),
        ]
        .concat();
        let split = partitions(&rules).unwrap();
        let summary: Vec<(&str, u64, usize)> = split
            .iter()
            .map(|partition| {
                (
                    partition.name.as_str(),
                    partition.capacity_bytes,
                    partition.tenants.len(),
                )
            })
            .collect();
        // chat: 256 + 128 KiB; the other two share the 640 KiB left, rounded to pages.
        assert_eq!(
            summary,
            vec![
                ("a-cpu-chat", 384 << 10, 2),
                ("a-cpu-batch", 320 << 10, 1),
                ("a-cpu-plain", 320 << 10, 1)
            ]
        );
        assert_eq!(split[0].group, SaltGroup::of(Some("s1")));
        assert_eq!(split[2].group, SaltGroup::of(None));
        assert_ne!(SaltGroup::of(Some("")), SaltGroup::of(None));
    }

    #[test]
    fn sizes_the_pool_cannot_hold_are_refused_when_the_file_loads() {
        let over = [
            rule("x", 1, Some("s1"), Some(1 << 20)),
            rule("y", 2, Some("s2"), Some(1)),
        ]
        .concat();
        let error = partitions(&over).unwrap_err();
        assert!(
            format!("{error:#}").contains("more than its CPU pool"),
            "{error:#}"
        );
        let starved = [
            rule("x", 1, Some("s1"), Some(1 << 20)),
            rule("y", 2, Some("s2"), None),
        ]
        .concat();
        let error = partitions(&starved).unwrap_err();
        assert!(format!("{error:#}").contains("under one page"), "{error:#}");
        let many: String = (0..=CPU_PARTITIONS_MAX as u32)
            .map(|uid| rule(&format!("t{uid}"), uid, Some(&format!("s{uid}")), None))
            .collect();
        let error = partitions(&many).unwrap_err();
        assert!(format!("{error:#}").contains("salt groups"), "{error:#}");
    }

    #[test]
    fn quotas_in_shared_pools_add_up_over_the_rules_of_a_salt() {
        let rules = [
            rule("chat", 1, Some("s1"), None),
            "cxl_bytes = 1000\nssd_bytes = 5\n".into(),
            rule("chat-too", 2, Some("s1"), None),
            "cxl_bytes = 24\n".into(),
            rule("batch", 3, Some("s2"), None),
        ]
        .concat();
        let config = ClusterConfig::parse(&format!("{NODE}{rules}"), Path::new("/")).unwrap();
        let quotas = &config.directory.limits.group_quotas;
        assert_eq!(quotas.len(), 1, "s2 states no quota");
        let s1 = quotas[&SaltGroup::of(Some("s1"))];
        assert_eq!(
            (s1.of(Medium::Cxl), s1.of(Medium::Ssd), s1.of(Medium::Cpu)),
            (Some(1024), Some(5), None)
        );
    }

    #[test]
    fn a_group_the_node_refuses_gets_no_memory_there() {
        let text = format!(
            "[directory]\nlisten = \"127.0.0.1:1\"\ncerts = \"c\"\n[[cxl_pools]]\nname = \"cxl0\"\ndomain = 0\npath = \"/dev/shm/x\"\ncapacity_bytes = 67108864\nuuid = \"000000000000000000000000000000aa\"\ntenants = [\"in\"]\n[[nodes]]\nname = \"a\"\nsocket = \"s\"\ndomains = [0]\n[nodes.cpu_pool]\ncapacity_bytes = 1048576\n{}{}",
            rule("in", 1, Some("s1"), None),
            rule("out", 2, Some("s2"), None)
        );
        let config = ClusterConfig::parse(&text, Path::new("/")).unwrap();
        let split = config.cpu_partitions(&config.nodes[0]).unwrap();
        assert_eq!(split.len(), 1);
        assert_eq!(split[0].name, "a-cpu");
        assert_eq!(split[0].capacity_bytes, 1 << 20);
    }
}
