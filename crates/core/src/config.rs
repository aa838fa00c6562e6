//! `cluster.toml`: one file describes the whole cluster (the directory, every node, the
//! sharing domains), so every process of a deployment reads the same file. Any value can be
//! overridden by an environment variable `KVTIER_<SECTION>__<KEY>`, e.g.
//! `KVTIER_DIRECTORY__LISTEN=0.0.0.0:7400`. Relative paths are relative to the file.

use crate::directory::{DirectoryConfig, NamespaceAccess, RecomputeCost};
use crate::model::{DomainId, Medium, NodeId, PoolSpec, Scope};
use crate::policy::profiles::ProfileFigures;
use anyhow::{bail, Context};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod keys;
mod partitions;
pub use keys::{check_keys, KeysError, UnknownKey};
pub use partitions::{CpuPartition, CPU_PARTITIONS_MAX};

/// The whole cluster's configuration.
#[derive(Clone, Debug, Deserialize)]
pub struct ClusterConfig {
    pub directory: DirectorySection,
    #[serde(default)]
    pub nodes: Vec<NodeSection>,
    /// Shared CXL pools, each mapped by every node of its sharing domain.
    #[serde(default)]
    pub cxl_pools: Vec<CxlPoolSection>,
    /// Overrides of tier profiles by medium (`[profiles.cxl]`): what the operator knows
    /// better than the nodes' start-up probe. A figure given here wins over the measured one.
    #[serde(default)]
    pub profiles: BTreeMap<Medium, ProfileFigures>,
    /// Who may use a node's socket, and with which namespaces and salt (`[[tenants]]`).
    /// None: only the uid the node runs as.
    #[serde(default)]
    pub tenants: Vec<TenantSection>,
    /// What recomputing an object costs, by the model name of its namespace
    /// (`[namespaces."kvtier-ctl"]`): what decides whether a copy is kept in a colder tier.
    /// A reload applies a change.
    #[serde(default)]
    pub namespaces: BTreeMap<String, NamespaceSection>,
}

/// The recompute cost of one namespace's objects, by model name: exactly one of the two.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct NamespaceSection {
    /// Prefill time of one token, in microseconds (times the tokens of the namespace's
    /// chunk): for a model's KV.
    pub prefill_us_per_token: Option<f64>,
    /// Microseconds to recompute (or fetch again) 1 MiB of an object: for opaque objects,
    /// such as those of `kvtier ctl put` (model `kvtier-ctl`), whose tokens say nothing.
    pub recompute_us_per_mib: Option<f64>,
}

impl NamespaceSection {
    /// The cost this section sets, or why it sets none or two.
    pub fn cost(&self) -> Result<RecomputeCost, String> {
        let cost = match (self.prefill_us_per_token, self.recompute_us_per_mib) {
            (Some(us), None) => RecomputeCost::PerToken(us),
            (None, Some(us)) => RecomputeCost::PerMib(us),
            _ => {
                return Err(
                    "set exactly one of prefill_us_per_token and recompute_us_per_mib".into(),
                )
            }
        };
        cost.validate()?;
        Ok(cost)
    }
}

/// One tenant rule: the local users or groups whose engines are this tenant, the models
/// (namespaces) they may use, and the salt mixed into their namespaces. A peer is matched
/// by the uid and effective gid of its socket's credentials; the first matching rule wins.
#[derive(Clone, Debug, Deserialize)]
pub struct TenantSection {
    pub name: String,
    /// User names, resolved through `/etc/passwd` when the node starts.
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Group names, resolved through `/etc/group` when the node starts.
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub gids: Vec<u32>,
    /// Model names of the namespaces the tenant may register; `"*"` for any.
    pub namespaces: Vec<String>,
    /// Mixed by the node into every namespace the tenant registers (as vLLM's
    /// `cache_salt`): tenants with different salts never share objects or probe answers,
    /// nor memory: each salt group has its own partition of every node's CPU pool.
    pub salt: Option<String>,
    /// Bytes of each node's CPU pool for this tenant's partition (added to those of the
    /// other rules of its salt). Absent: the salt groups that state none share equally what
    /// the others leave.
    pub cpu_bytes: Option<u64>,
    /// The most bytes of this tenant's salt group (added to those of the other rules of
    /// its salt) in each CXL pool; absent: no bound but the pool's. A reload applies it.
    pub cxl_bytes: Option<u64>,
    /// The same in each node's SSD store.
    pub ssd_bytes: Option<u64>,
}

/// One shared CXL pool.
#[derive(Clone, Debug, Deserialize)]
pub struct CxlPoolSection {
    /// Unique name; nodes refer to it in `cxl_paths`, metrics label it by pool id.
    pub name: String,
    /// The sharing domain: nodes listing it in `domains` map this pool.
    pub domain: u32,
    /// The device or file, as most nodes see it (a node may override it in `cxl_paths`):
    /// `/dev/daxX.Y` on hardware, a file under `/dev/shm` when emulated.
    pub path: PathBuf,
    pub capacity_bytes: u64,
    #[serde(default = "default_page_bytes")]
    pub page_bytes: u64,
    /// Size of the extents the directory grants to nodes.
    #[serde(default = "default_extent_bytes")]
    pub extent_bytes: u64,
    /// The pool's UUID (32 hex digits), written in its header and checked by every node.
    pub uuid: String,
    /// Format the path when it exists but holds no kvtier pool header (a fresh DAX device).
    /// Off by default: the directory then refuses such a path, which may hold other data.
    /// A path that does not exist is always created; a pool is never formatted away.
    #[serde(default)]
    pub format: bool,
    /// The tenants (names of `[[tenants]]`) whose engines may use this pool. Absent, every
    /// tenant of the nodes that map it: the pool's domain is then one trust domain. A node
    /// that maps the pool refuses every tenant the list leaves out.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
}

impl CxlPoolSection {
    /// The UUID as a number.
    pub fn uuid(&self) -> anyhow::Result<u128> {
        u128::from_str_radix(&self.uuid, 16)
            .with_context(|| format!("CXL pool `{}`: uuid must be 32 hex digits", self.name))
    }
}

/// The directory process.
#[derive(Clone, Debug, Deserialize)]
pub struct DirectorySection {
    /// Certificate name of the directory (its cert is `<certs>/<name>.pem`).
    #[serde(default = "default_directory_name")]
    pub name: String,
    /// Certificate names of operators: only a connection presenting one of these may
    /// drain a node or reload the configuration (`kvtier ctl drain|reload`); an operator
    /// makes no other request. Never a node's or the directory's name.
    #[serde(default = "default_operators")]
    pub operators: Vec<String>,
    /// QUIC address nodes connect to.
    pub listen: SocketAddr,
    /// Prometheus exporter address; none to disable.
    pub metrics: Option<SocketAddr>,
    /// Folder of the cluster CA and certificates (`kvtier certs init`).
    pub certs: PathBuf,
    /// How often the directory advances time (lease expiry, heartbeat suspicion).
    #[serde(default = "default_tick_interval_ms")]
    pub tick_interval_ms: u64,
    /// Limits and timings of the directory core.
    #[serde(default)]
    pub limits: DirectoryConfig,
    /// etcd's client addresses (its JSON gateway, plain HTTP on the cluster's network):
    /// set, every `kvtier directory` process campaigns for leadership there and only the
    /// leader serves; empty, one directory serves alone.
    #[serde(default)]
    pub etcd: Vec<SocketAddr>,
    /// The election's key prefix in etcd: the leader holds `<election>/leader`, its value
    /// the leader's address. One prefix per cluster sharing an etcd.
    #[serde(default = "default_election")]
    pub election: String,
    /// The leader's etcd lease, in whole seconds (1 to 60): a killed leader is replaced
    /// within about this long plus half a second (etcd's expiry check), and a leader that
    /// cannot renew it for this long stops. etcd raises a lease under its minimum (1.5 ×
    /// its election timeout, rounded up: 2 s at etcd's default 1 s timeout).
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// The QUIC addresses of the standby directories (each runs `kvtier directory
    /// --listen <address>`). Nodes try `listen` and every standby at once and follow the
    /// one that leads; standbys refuse connections.
    #[serde(default)]
    pub standbys: Vec<SocketAddr>,
    /// Shards of the directory's state, 1 to 256 ([`crate::protocol::shards`]): each object
    /// belongs to one by a keyed hash, and each reserves against its share of every pool.
    /// In one process, on the directory actor's thread.
    #[serde(default = "default_shards")]
    pub shards: u16,
}

fn default_shards() -> u16 {
    1
}

fn default_election() -> String {
    "kvtier/directory".to_string()
}

fn default_lease_ttl_s() -> u64 {
    2
}

/// One node (one per host).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct NodeSection {
    pub name: String,
    /// Unix socket local engines connect to.
    pub socket: PathBuf,
    /// Prometheus exporter address; none to disable.
    pub metrics: Option<SocketAddr>,
    /// Local UDP address for the QUIC connection to the directory.
    #[serde(default = "default_bind")]
    pub bind: SocketAddr,
    /// The directory's address as this node reaches it, when it differs from
    /// `directory.listen` (the directory listens on a wildcard, or behind a NAT).
    pub directory_address: Option<SocketAddr>,
    pub cpu_pool: CpuPoolSection,
    /// Store placement order over media.
    #[serde(default = "default_order")]
    pub write_order: Vec<Medium>,
    /// Read preference over media, cheapest first.
    #[serde(default = "default_order")]
    pub read_order: Vec<Medium>,
    /// Sharing domains (CXL) this node maps.
    #[serde(default)]
    pub domains: Vec<u32>,
    /// Models this node may cache; absent means every model.
    pub models: Option<Vec<String>>,
    /// Where this node sees a CXL pool when its path differs from the pool's `path`.
    #[serde(default)]
    pub cxl_paths: std::collections::HashMap<String, PathBuf>,
    /// A group (name or number) given the node's socket and CPU pool file, both mode 0660,
    /// so engines of other uids in that group can connect and map; absent, only the node's
    /// uid (and root) can.
    pub socket_group: Option<String>,
    /// The node's SSD store (L2), when it has one.
    pub ssd: Option<crate::backends::ssd::SsdConfig>,
    /// UDP address of the node's peer endpoint (replica copies between hosts over QUIC with
    /// mutual TLS). Absent: the node neither serves nor pushes copies over the network.
    pub peer_listen: Option<SocketAddr>,
    /// The address other nodes reach `peer_listen` at, when it differs (a wildcard listen,
    /// a NAT).
    pub peer_address: Option<SocketAddr>,
    /// Largest UDP payload of the peer endpoint, in bytes: 1452 fits any 1500-byte MTU
    /// path; loopback and jumbo-frame networks may raise it (up to 65527) for bulk speed.
    #[serde(default = "default_peer_datagram_bytes")]
    pub peer_datagram_bytes: u16,
    /// Threads that copy between the node's pools (demotions, and replications into a
    /// shared pool), 1 to 16: the CPU a burst of copies may take from the host's other
    /// work, engines included. Default 2.
    #[serde(default = "default_copy_threads")]
    pub copy_threads: usize,
    /// How long the node keeps polling its sockets, rather than sleeping, after each request
    /// it sends the directory and each reply, in microseconds, at most 10,000; 0 never
    /// polls. A wake-up from sleep costs tens of microseconds on a virtual machine whose
    /// idle CPUs halt, several times per request; polling costs CPU only while requests
    /// come at least this often. Default 200.
    #[serde(default = "default_busy_poll_us")]
    pub busy_poll_us: u64,
}

/// The node's CPU DRAM pool.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct CpuPoolSection {
    /// Bytes of the pool: a sealed memory file without a path, pre-faulted at start, that
    /// the node hands to each engine it admits over its socket.
    pub capacity_bytes: u64,
    #[serde(default = "default_page_bytes")]
    pub page_bytes: u64,
}

fn default_operators() -> Vec<String> {
    vec![DEFAULT_OPERATOR.to_owned()]
}

/// The operator's certificate name unless `[directory] operators` says otherwise.
pub const DEFAULT_OPERATOR: &str = "operator";

fn default_directory_name() -> String {
    "directory".into()
}
fn default_tick_interval_ms() -> u64 {
    50
}
fn default_bind() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 0))
}
fn default_order() -> Vec<Medium> {
    vec![Medium::Cpu, Medium::Cxl]
}
fn default_copy_threads() -> usize {
    2
}
fn default_busy_poll_us() -> u64 {
    200
}
fn default_peer_datagram_bytes() -> u16 {
    crate::wire::peer::DATAGRAM_BYTES_SAFE
}
fn default_page_bytes() -> u64 {
    64 << 10
}
/// The extent a node asks a shared pool for when its configuration names none.
pub fn default_extent_bytes() -> u64 {
    64 << 20
}

impl ClusterConfig {
    /// Reads `path` with `KVTIER_` environment overrides and resolves relative paths. A key
    /// the file's section does not have is refused ([`check_keys`]), and an error of the
    /// file names its line.
    pub fn load(path: &Path) -> anyhow::Result<ClusterConfig> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let loaded = ClusterConfig::deserialize_checked(&text, true)
            .with_context(|| format!("parsing {}", path.display()))?;
        loaded.resolved(path.parent().unwrap_or(Path::new(".")))
    }

    /// Parses the text of a `cluster.toml` (no environment overrides), resolving relative
    /// paths against `base`, and validates it. Any text gives a configuration or an error,
    /// never a panic (fuzzed: `fuzz/fuzz_targets/config.rs`).
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<ClusterConfig> {
        let parsed =
            ClusterConfig::deserialize_checked(text, false).context("parsing the configuration")?;
        parsed.resolved(base)
    }

    /// Checks the keys of `text`, then deserializes it, with the `KVTIER_` environment
    /// overrides when `environment` is set. A deserialization error the file alone also
    /// gives (a missing field, a value of the wrong type) names its line.
    fn deserialize_checked(text: &str, environment: bool) -> anyhow::Result<ClusterConfig> {
        check_keys(text)?;
        let mut builder = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml));
        if environment {
            builder = builder.add_source(
                config::Environment::with_prefix("KVTIER")
                    .separator("__")
                    .try_parsing(true),
            );
        }
        let merged = builder.build().context("reading the configuration")?;
        merged.try_deserialize().map_err(|error| {
            match toml::from_str::<ClusterConfig>(text) {
                Err(in_file) => match in_file.span() {
                    Some(span) => anyhow::anyhow!(
                        "line {}: {}",
                        keys::line_of(text, span),
                        in_file.message().trim_end()
                    ),
                    None => anyhow::anyhow!("{}", in_file.message().trim_end()),
                },
                // Only an environment override makes it fail.
                Ok(_) => anyhow::Error::from(error),
            }
        })
    }

    /// Resolves relative paths against `base`, hands the profiles to the directory's
    /// limits, and validates.
    fn resolved(mut self, base: &Path) -> anyhow::Result<ClusterConfig> {
        self.directory.certs = base.join(&self.directory.certs);
        for node in &mut self.nodes {
            node.socket = base.join(&node.socket);
            if let Some(ssd) = &mut node.ssd {
                ssd.directory = base.join(&ssd.directory);
            }
            for path in node.cxl_paths.values_mut() {
                *path = base.join(&*path);
            }
        }
        for pool in &mut self.cxl_pools {
            pool.path = base.join(&pool.path);
        }
        self.directory.limits.profiles = self.profiles.clone();
        self.directory.limits.namespace_costs = self
            .namespaces
            .iter()
            .map(|(model, section)| {
                let cost = section
                    .cost()
                    .map_err(|reason| anyhow::anyhow!("namespaces.\"{model}\": {reason}"))?;
                Ok((model.clone(), cost))
            })
            .collect::<anyhow::Result<_>>()?;
        self.directory.limits.group_quotas = self.group_quotas();
        self.validate()?;
        Ok(self)
    }

    /// Checks what serde cannot: unique names, non-empty pools, a sane tick.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(1..=60).contains(&self.directory.lease_ttl_s) {
            bail!("directory.lease_ttl_s must be 1 to 60");
        }
        if !(1..=crate::model::SHARDS_MAX as u16).contains(&self.directory.shards) {
            bail!(
                "directory.shards must be 1 to {}, not {}",
                crate::model::SHARDS_MAX,
                self.directory.shards
            );
        }
        if !self.directory.standbys.is_empty() && self.directory.etcd.is_empty() {
            bail!("directory.standbys needs directory.etcd: standbys are elected there");
        }
        let mut names = std::collections::HashSet::new();
        for operator in &self.directory.operators {
            if !names.insert(operator.as_str()) || *operator == self.directory.name {
                bail!("operator name `{operator}` is used twice");
            }
        }
        for node in &self.nodes {
            if !names.insert(node.name.as_str()) || node.name == self.directory.name {
                bail!(
                    "node name `{}` is used twice, or also names an operator",
                    node.name
                );
            }
            node.validate()?;
        }
        let tenants: std::collections::HashSet<&str> = self
            .tenants
            .iter()
            .map(|tenant| tenant.name.as_str())
            .collect();
        for pool in &self.cxl_pools {
            let unknown = pool
                .tenants
                .iter()
                .flatten()
                .find(|name| !tenants.contains(name.as_str()));
            if let Some(name) = unknown {
                bail!(
                    "cxl_pools.{}: tenant `{name}` is not a [[tenants]] name",
                    pool.name
                );
            }
        }
        for node in &self.nodes {
            let host_pools = self.cpu_partitions(node)?.len() + usize::from(node.ssd.is_some());
            if host_pools > self.directory.limits.pools_per_node_max as usize {
                bail!(
                    "node `{}` has {host_pools} pools (a CPU partition per salt group, and its SSD), more than directory.limits.pools_per_node_max",
                    node.name
                );
            }
        }
        self.directory
            .limits
            .validate()
            .map_err(|reason| anyhow::anyhow!("directory.limits: {reason}"))?;
        if self.directory.tick_interval_ms == 0 {
            bail!("directory.tick_interval_ms must be positive");
        }
        Ok(())
    }

    /// The CXL pools a node maps, each with the path this node sees it at.
    pub fn cxl_pools_of(&self, node: &NodeSection) -> Vec<(CxlPoolSection, PathBuf)> {
        self.cxl_pools
            .iter()
            .filter(|pool| node.domains.contains(&pool.domain))
            .map(|pool| {
                (
                    pool.clone(),
                    node.cxl_paths
                        .get(&pool.name)
                        .cloned()
                        .unwrap_or_else(|| pool.path.clone()),
                )
            })
            .collect()
    }

    /// The node section named `name`.
    pub fn node(&self, name: &str) -> anyhow::Result<&NodeSection> {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .with_context(|| format!("no node named `{name}` in the configuration"))
    }
}

impl ClusterConfig {
    /// The tenant rules of `node` with user and group names resolved through `passwd` and
    /// `group` (the texts of `/etc/passwd` and `/etc/group`); `owner_uid` is the node's own
    /// uid. A tenant a CXL pool of the node leaves out of its `tenants` is refused there.
    pub fn tenants(
        &self,
        node: &NodeSection,
        owner_uid: u32,
        passwd: &str,
        group: &str,
    ) -> anyhow::Result<crate::node::Tenants> {
        use crate::node::tenants::{gid_of, uid_of, ModelAccess, Tenant};
        let rules = self
            .tenants
            .iter()
            .map(|rule| {
                let mut uids = rule.uids.clone();
                for user in &rule.users {
                    uids.push(uid_of(passwd, user).with_context(|| {
                        format!("tenant `{}`: no user `{user}` on this host", rule.name)
                    })?);
                }
                let mut gids = rule.gids.clone();
                for name in &rule.groups {
                    gids.push(gid_of(group, name).with_context(|| {
                        format!("tenant `{}`: no group `{name}` on this host", rule.name)
                    })?);
                }
                let models = if rule.namespaces.iter().any(|model| model == "*") {
                    ModelAccess::Any
                } else {
                    ModelAccess::Models(rule.namespaces.clone())
                };
                Ok(Tenant {
                    name: rule.name.clone(),
                    uids,
                    gids,
                    models,
                    salt: rule.salt.clone(),
                })
            })
            .collect::<anyhow::Result<Vec<Tenant>>>()?;
        let mut tenants = crate::node::Tenants::new(owner_uid, rules)?;
        let names: Vec<String> = tenants.names().map(str::to_string).collect();
        for (pool, _) in self.cxl_pools_of(node) {
            let Some(listed) = &pool.tenants else {
                continue;
            };
            for name in names.iter().filter(|name| !listed.contains(name)) {
                tenants.shut_out(name, &pool.name);
            }
        }
        Ok(tenants)
    }
}

impl DirectorySection {
    /// The tick interval as a duration.
    pub fn tick_interval(&self) -> Duration {
        Duration::from_millis(self.tick_interval_ms)
    }

    /// The election key in etcd.
    pub fn election_key(&self) -> String {
        format!("{}/leader", self.election.trim_end_matches('/'))
    }

    /// The leader's lease as a duration.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_s)
    }
}

impl NodeSection {
    /// The checks of one node's section serde cannot make: its CPU pool, peer datagrams,
    /// busy polling and copy threads within their bounds.
    fn validate(&self) -> anyhow::Result<()> {
        let node = self;
        if node.cpu_pool.capacity_bytes == 0 || !node.cpu_pool.page_bytes.is_power_of_two() {
            bail!(
                "node `{}`: the CPU pool needs a capacity and a power-of-two page size",
                node.name
            );
        }
        if !(1200..=crate::wire::peer::DATAGRAM_BYTES_MAX).contains(&node.peer_datagram_bytes) {
            bail!(
                "node `{}`: peer_datagram_bytes must be 1200 to 65527",
                node.name
            );
        }
        let busy_poll_us_max = crate::limits::BUSY_POLL_TAIL_MAX.as_micros();
        if u128::from(node.busy_poll_us) > busy_poll_us_max {
            bail!(
                "node `{}`: busy_poll_us must be 0 to {busy_poll_us_max}",
                node.name
            );
        }
        let copy_threads_max = crate::limits::COPY_THREADS_MAX;
        if !(1..=copy_threads_max).contains(&node.copy_threads) {
            bail!(
                "node `{}`: copy_threads must be 1 to {copy_threads_max}",
                node.name
            );
        }
        Ok(())
    }

    /// The node's SSD store as a pool (`None` without `[nodes.ssd]` or with a store whose
    /// configuration is invalid): medium `ssd`, private to the node, its capacity the
    /// store's whole regions, 4 KiB pages.
    pub fn ssd_pool_spec(&self, node: NodeId) -> Option<PoolSpec> {
        let ssd = self.ssd.as_ref()?;
        Some(PoolSpec {
            name: format!("{}-ssd", self.name),
            medium: Medium::Ssd,
            scope: Scope::Host(node),
            capacity_bytes: ssd.usable_bytes().ok()?,
            page_bytes: crate::backends::ssd::layout::BLOCK_BYTES,
            extent_bytes: None,
            tenancy: crate::model::PoolTenancy::Shared,
        })
    }

    /// The gid of [`NodeSection::socket_group`] (a number, or a name in `group`, the text
    /// of `/etc/group`).
    pub fn socket_gid(&self, group: &str) -> anyhow::Result<Option<u32>> {
        let Some(name) = &self.socket_group else {
            return Ok(None);
        };
        let gid = name
            .parse()
            .ok()
            .or_else(|| crate::node::tenants::gid_of(group, name));
        gid.map(Some).with_context(|| {
            format!(
                "node `{}`: no group `{name}` for the socket on this host",
                self.name
            )
        })
    }

    /// Where other nodes reach this node's peer endpoint (`None`: it serves none).
    pub fn peer_reachable_at(&self) -> Option<SocketAddr> {
        self.peer_address.or(self.peer_listen)
    }

    /// What the directory grants this node, from the operator's configuration.
    pub fn access(&self) -> (Vec<DomainId>, NamespaceAccess) {
        let domains = self
            .domains
            .iter()
            .map(|domain| DomainId(*domain))
            .collect();
        let namespaces = match &self.models {
            None => NamespaceAccess::Any,
            Some(models) => NamespaceAccess::Models(models.clone()),
        };
        (domains, namespaces)
    }
}

#[cfg(test)]
mod tests;
