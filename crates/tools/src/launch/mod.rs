//! A cluster on loopback made of real processes: a directory and N nodes of this very
//! binary, with a fresh cluster CA, a generated `cluster.toml` and pool files under
//! `/dev/shm`. Used by `kvtier demo`, `kvtier up`, the benchmarks and the integration
//! tests. Dropping it (or [`LocalCluster::shutdown`], which also says what could not be
//! removed) stops every process and removes every file, folder and network namespace it
//! created; a start that fails or is cancelled removes them before it returns.

mod directories;
pub mod etcd;
mod host;
mod ports;

use anyhow::{bail, Context};
use kvtier_core::client::Client;
use kvtier_core::config::ClusterConfig;
pub use kvtier_core::metrics::scrape::{metric_value, scrape_metrics, wait_for_metrics};
use kvtier_core::model::Medium;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use host::network_namespaces_unavailable;
use host::{create_network, Created, Network};
use ports::{free_tcp_port, free_udp_port};

/// How long a started process has to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a stopping process has after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Name of the extra certificate that benchmarks use to speak to the directory as a node.
pub const BENCH_PEER: &str = "bench";
/// Names a start tries for its folder before giving up: folders left by crashed earlier
/// processes with this one's id are skipped, and there are never many.
const ROOT_NAME_TRIES: u32 = 64;
/// How much of a process's log a start-up error quotes.
const LOG_TAIL_BYTES: usize = 4096;
/// Region size of every SSD store a local cluster gives its nodes: small, so a test's
/// store of a few megabytes has several regions to reclaim.
pub const SSD_REGION_BYTES: u64 = 4 << 20;
/// Largest object those stores take.
pub const SSD_OBJECT_BYTES_MAX: u64 = 1 << 20;

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub nodes: usize,
    pub cpu_pool_bytes: u64,
    pub page_bytes: u64,
    /// Written into the directory's limits.
    pub suspect_after_ms: u64,
    pub fence_after_ms: u64,
    /// Serve `/metrics` on loopback ports.
    pub metrics: bool,
    /// Size of one emulated CXL pool (a file under `/dev/shm`) that every node maps in
    /// domain 0; zero for none.
    pub cxl_pool_bytes: u64,
    pub cxl_extent_bytes: u64,
    /// Every node's store placement order.
    pub write_order: Vec<Medium>,
    /// Run each node in its own network namespace (a separate host as far as the network
    /// goes: a veth pair into a bridge in the root namespace joins it to the directory and
    /// to the other nodes), when this process may create them (root); otherwise every
    /// process shares loopback. At most 61 nodes.
    pub netns: bool,
    /// The directory's eviction watermarks, in percent of a pool's capacity.
    pub high_watermark_percent: u8,
    pub low_watermark_percent: u8,
    /// The directory's `policy_time_scale`: how much faster than recorded a trace runs.
    pub policy_time_scale: f64,
    /// The directory's `reservation_duration_ms`: how long a reservation waits for its
    /// commit, and how long an extent given back cools before it is granted again.
    pub reservation_duration_ms: u64,
    /// Every node's `socket_group` (the group given its socket and CPU pool file).
    pub socket_group: Option<String>,
    /// The directory's `batch_items_max` (its default when `None`).
    pub batch_items_max: Option<u32>,
    /// The directory's `namespaces_max` (its default when `None`).
    pub namespaces_max: Option<u32>,
    /// Text appended to `cluster.toml`: top-level tables such as `[[tenants]]` rules.
    pub extra_toml: String,
    /// Nodes with a certificate but no section yet: [`LocalCluster::add_node`] adds them
    /// to `cluster.toml` later, as an operator scaling out does.
    pub spare_nodes: usize,
    /// The directory's `replicate_after_misses`: remote misses before a chunk is
    /// replicated towards the node that missed it; 0 turns replication off.
    pub replicate_after_misses: u32,
    /// Capacity of every node's SSD store (a `ssd-<node>` folder beside `cluster.toml`, in
    /// 4 MiB regions); zero for none.
    pub ssd_bytes: u64,
    /// Give every node a peer endpoint (copies between nodes over QUIC) on a free UDP port,
    /// of loopback or of its namespace's address, with datagrams of this many bytes; zero
    /// for none.
    pub peer_datagram_bytes: u16,
    /// Every SSD store's `admit_after_accesses` (2 by default, 1 admits every object).
    pub ssd_admit_after_accesses: u32,
    /// The directory's `drain_stall_ms`: how long a drain may go without progress before
    /// it is reported stuck.
    pub drain_stall_ms: u64,
    /// Declare the benchmarks' extra peer ([`BENCH_PEER`]): a node section and certificate
    /// that only `kvtier bench` and tests use. `kvtier up` leaves it out, so its cluster
    /// shows only what runs.
    pub bench_peer: bool,
    /// etcd's client addresses: set, the directories are elected there (`[directory]
    /// etcd`, leases of `lease_ttl_s`) and `standby_directories` standbys start beside the
    /// first directory, each on a free loopback port. Loopback clusters only.
    pub etcd: Vec<SocketAddr>,
    /// Standby directories to start (with `etcd`).
    pub standby_directories: usize,
    /// The leader lease, in seconds (with `etcd`).
    pub lease_ttl_s: u64,
    /// The directory's shards (`[directory] shards`).
    pub directory_shards: u16,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            nodes: 2,
            cpu_pool_bytes: 256 << 20,
            page_bytes: 64 << 10,
            suspect_after_ms: 1500,
            fence_after_ms: 6000,
            metrics: true,
            cxl_pool_bytes: 0,
            cxl_extent_bytes: 16 << 20,
            netns: false,
            write_order: vec![Medium::Cpu, Medium::Cxl],
            high_watermark_percent: 98,
            low_watermark_percent: 95,
            policy_time_scale: 1.0,
            reservation_duration_ms: 30_000,
            socket_group: None,
            batch_items_max: None,
            namespaces_max: None,
            extra_toml: String::new(),
            spare_nodes: 0,
            ssd_bytes: 0,
            peer_datagram_bytes: 0,
            replicate_after_misses: kvtier_core::directory::DirectoryConfig::default()
                .replicate_after_misses,
            ssd_admit_after_accesses: 2,
            drain_stall_ms: kvtier_core::directory::DirectoryConfig::default()
                .drain_stall
                .as_millis() as u64,
            bench_peer: true,
            etcd: Vec::new(),
            standby_directories: 0,
            lease_ttl_s: 2,
            directory_shards: 1,
        }
    }
}

/// A running local cluster. See the module documentation.
pub struct LocalCluster {
    pub root: PathBuf,
    pub config_path: PathBuf,
    pub config: ClusterConfig,
    exe: PathBuf,
    /// What the cluster was made from.
    spec: ClusterSpec,
    directory: Option<Child>,
    /// The standby directories, when the cluster has an election.
    standbys: Vec<directories::StandbyDirectory>,
    nodes: Vec<(String, Option<Child>)>,
    /// The network namespace of each node, when they have one.
    namespaces: Vec<String>,
    /// What to remove when the cluster goes.
    created: Created,
}

/// Why a local cluster did not start. What it had created is removed before this is
/// returned; `not_removed` lists what could not be.
#[derive(Debug)]
pub struct StartError {
    pub cause: anyhow::Error,
    /// The start was cancelled (its `cancel` flag was set).
    pub cancelled: bool,
    /// The cluster's folder (gone unless listed in `not_removed`).
    pub root: PathBuf,
    /// Each path or network namespace still there, with why.
    pub not_removed: Vec<String>,
}

impl std::fmt::Display for StartError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{:#}", self.cause)?;
        if !self.not_removed.is_empty() {
            write!(
                formatter,
                "; could not remove: {}",
                self.not_removed.join("; ")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for StartError {}

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// The name of node `index`.
pub fn node_name(index: usize) -> String {
    format!("node-{}", (b'a' + (index % 26) as u8) as char)
}

/// The `cluster.toml` of a local cluster: the directory, the CXL pool if any, the nodes
/// `names` (each in its namespace of `network` when there is one) and the benchmarks'
/// extra peer.
fn cluster_toml(
    spec: &ClusterSpec,
    tag: &str,
    names: &[String],
    network: Option<&Network>,
) -> anyhow::Result<String> {
    let directory_address = free_udp_port()?;
    let mut toml = directory_toml(spec, directory_address, network.is_some())?;
    if spec.cxl_pool_bytes > 0 {
        toml.push_str(&format!(
            "\n[[cxl_pools]]\nname = \"cxl0\"\ndomain = 0\npath = \"/dev/shm/kvtier-{tag}-cxl0\"\ncapacity_bytes = {}\npage_bytes = {}\nextent_bytes = {}\nuuid = \"{:032x}\"\n",
            spec.cxl_pool_bytes,
            spec.page_bytes,
            spec.cxl_extent_bytes,
            kvtier_core::actors::node::process::fresh_uuid(),
        ));
    }
    for (index, name) in names.iter().enumerate() {
        // A node in a namespace listens (peer endpoint, metrics) on its own address, which
        // the root namespace and the other nodes reach through the bridge.
        let (host, reach) = match network {
            Some(network) => {
                let namespace = &network.namespaces[index];
                let directory =
                    SocketAddr::from((network.bridge_address, directory_address.port()));
                (
                    IpAddr::V4(namespace.address),
                    format!("directory_address = \"{directory}\"\n"),
                )
            }
            None => (IpAddr::from([127, 0, 0, 1]), String::new()),
        };
        let reach = reach + &peer_endpoint_toml(spec, host)?;
        let metrics = spec.metrics.then_some(host);
        toml.push_str(&node_toml(spec, name, &reach, metrics)?);
    }
    let bench_reach = match network {
        Some(_) => format!(
            "directory_address = \"127.0.0.1:{}\"\n",
            directory_address.port()
        ),
        None => String::new(),
    };
    if spec.bench_peer {
        toml.push_str(&node_toml(spec, BENCH_PEER, &bench_reach, None)?);
    }
    toml.push_str(&spec.extra_toml);
    Ok(toml)
}

/// The `[directory]` section of a local cluster whose directory is reached at
/// `directory_address` (listening on every address when the nodes are in network
/// namespaces), with its limits from `spec`.
fn directory_toml(
    spec: &ClusterSpec,
    directory_address: SocketAddr,
    namespaced: bool,
) -> anyhow::Result<String> {
    let listen = if namespaced {
        SocketAddr::from(([0, 0, 0, 0], directory_address.port()))
    } else {
        directory_address
    };
    let mut metrics = if spec.metrics {
        format!("metrics = \"{}\"\n", free_tcp_port()?)
    } else {
        String::new()
    };
    if !spec.etcd.is_empty() {
        let quoted = |address: SocketAddr| format!("\"{address}\"");
        let etcd: Vec<String> = spec.etcd.iter().copied().map(quoted).collect();
        let standbys = (0..spec.standby_directories)
            .map(|_| free_udp_port().map(quoted))
            .collect::<anyhow::Result<Vec<String>>>()?;
        metrics.push_str(&format!(
            "etcd = [{}]\nstandbys = [{}]\nlease_ttl_s = {}\nelection = \"kvtier/{}\"\n",
            etcd.join(", "),
            standbys.join(", "),
            spec.lease_ttl_s,
            directory_address.port(),
        ));
    }
    if spec.directory_shards != 1 {
        metrics.push_str(&format!("shards = {}\n", spec.directory_shards));
    }
    let mut toml = format!(
        "[directory]\nlisten = \"{}\"\ncerts = \"certs\"\n{}\n[directory.limits]\nsuspect_after_ms = {}\nfence_after_ms = {}\nhigh_watermark_percent = {}\nlow_watermark_percent = {}\npolicy_time_scale = {:?}\nreservation_duration_ms = {}\nreplicate_after_misses = {}\ndrain_stall_ms = {}\n",
        listen,
        metrics,
        spec.suspect_after_ms,
        spec.fence_after_ms,
        spec.high_watermark_percent,
        spec.low_watermark_percent,
        spec.policy_time_scale,
        spec.reservation_duration_ms,
        spec.replicate_after_misses,
        spec.drain_stall_ms,
    );
    if let Some(max) = spec.batch_items_max {
        toml.push_str(&format!("batch_items_max = {max}\n"));
    }
    if let Some(max) = spec.namespaces_max {
        toml.push_str(&format!("namespaces_max = {max}\n"));
    }
    Ok(toml)
}

/// The lines giving a node a peer endpoint on a free UDP port of `host`, when `spec` asks
/// for peer endpoints (none otherwise).
fn peer_endpoint_toml(spec: &ClusterSpec, host: IpAddr) -> anyhow::Result<String> {
    if spec.peer_datagram_bytes == 0 {
        return Ok(String::new());
    }
    let listen = SocketAddr::new(host, free_udp_port()?.port());
    Ok(format!(
        "peer_listen = \"{listen}\"\npeer_datagram_bytes = {}\n",
        spec.peer_datagram_bytes
    ))
}

/// The `[[nodes]]` section of node `name`, reaching the directory as `reach` says and
/// serving metrics on a free port of `metrics` when given.
fn node_toml(
    spec: &ClusterSpec,
    name: &str,
    reach: &str,
    metrics: Option<IpAddr>,
) -> anyhow::Result<String> {
    let domains = if spec.cxl_pool_bytes > 0 { "[0]" } else { "[]" };
    let write_order: Vec<String> = spec
        .write_order
        .iter()
        .map(|medium| format!("\"{}\"", medium.name()))
        .collect();
    let metrics = match metrics {
        Some(host) => format!(
            "metrics = \"{}\"\n",
            SocketAddr::new(host, free_tcp_port()?.port())
        ),
        None => String::new(),
    };
    let group = match &spec.socket_group {
        Some(group) => format!("socket_group = \"{group}\"\n"),
        None => String::new(),
    };
    let ssd = if spec.ssd_bytes > 0 {
        format!(
            "\n[nodes.ssd]\ndirectory = \"ssd-{name}\"\ncapacity_bytes = {}\nregion_bytes = {}\nobject_bytes_max = {}\nadmit_after_accesses = {}\n",
            spec.ssd_bytes,
            SSD_REGION_BYTES,
            SSD_OBJECT_BYTES_MAX,
            spec.ssd_admit_after_accesses
        )
    } else {
        String::new()
    };
    let section = format!(
        "\n[[nodes]]\nname = \"{name}\"\nsocket = \"{name}.sock\"\n{metrics}{group}{reach}domains = {domains}\nwrite_order = [{}]\n\n[nodes.cpu_pool]\ncapacity_bytes = {}\npage_bytes = {}\n",
        write_order.join(", "),
        spec.cpu_pool_bytes,
        spec.page_bytes,
    );
    Ok(section + &ssd)
}

/// The last [`LOG_TAIL_BYTES`] of the log at `path`, or why it could not be read.
fn log_tail(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let start = bytes.len().saturating_sub(LOG_TAIL_BYTES);
            String::from_utf8_lossy(&bytes[start..]).into_owned()
        }
        Err(error) => format!("({} unreadable: {error})", path.display()),
    }
}

impl LocalCluster {
    /// Writes certificates and `cluster.toml` into a fresh temporary folder, then starts
    /// the directory and every node from `exe` and waits until each node serves clients.
    pub fn start(exe: &Path, spec: &ClusterSpec) -> Result<LocalCluster, StartError> {
        LocalCluster::start_cancellable(exe, spec, &AtomicBool::new(false))
    }

    /// [`LocalCluster::start`], giving up as soon as `cancel` is set, e.g. by a signal
    /// during a long pool pre-fault. Whatever the way out, a start that does not succeed
    /// stops what it started and removes what it created (folder, pool files, network
    /// namespaces) before it returns, and says what it could not remove.
    pub fn start_cancellable(
        exe: &Path,
        spec: &ClusterSpec,
        cancel: &AtomicBool,
    ) -> Result<LocalCluster, StartError> {
        // A folder left by an earlier process with the same id is not this cluster's: it
        // takes the next free name and leaves that one alone.
        let (tag, root) = (0..ROOT_NAME_TRIES)
            .map(|_| {
                let tag = format!(
                    "{}-{}",
                    std::process::id(),
                    CLUSTERS.fetch_add(1, Ordering::Relaxed)
                );
                let root = std::env::temp_dir().join(format!("kvtier-{tag}"));
                (tag, root)
            })
            .find(|(_, root)| !root.exists())
            .unwrap_or_else(|| {
                let tag = format!("{}-{}", std::process::id(), u32::MAX);
                let root = std::env::temp_dir().join(format!("kvtier-{tag}"));
                (tag, root)
            });
        let mut created = Created::default();
        match LocalCluster::launch(exe, spec, cancel, &tag, &root, &mut created) {
            Ok(mut cluster) => {
                cluster.created = created;
                Ok(cluster)
            }
            // `launch` dropped the half-started cluster: its processes are stopped.
            Err(cause) => Err(StartError {
                cause,
                cancelled: cancel.load(Ordering::Relaxed),
                not_removed: created.remove(),
                root,
            }),
        }
    }

    /// The body of [`LocalCluster::start_cancellable`]: records in `created` everything it
    /// makes as soon as it exists; the caller removes it on failure.
    fn launch(
        exe: &Path,
        spec: &ClusterSpec,
        cancel: &AtomicBool,
        tag: &str,
        root: &Path,
        created: &mut Created,
    ) -> anyhow::Result<LocalCluster> {
        // `create_dir` fails on a folder that exists: nothing not made here is removed.
        std::fs::create_dir(root).with_context(|| format!("creating {}", root.display()))?;
        created.root = Some(root.to_path_buf());
        let names: Vec<String> = (0..spec.nodes).map(node_name).collect();
        issue_certificates(spec, root, &names)?;
        // With namespaces, every node's veth pair is a port of one bridge; the directory
        // listens on all addresses and each node reaches it at the bridge's.
        let network = if spec.netns {
            let network = create_network(tag, spec.nodes, created).map_err(|reason| {
                anyhow::anyhow!("creating a network namespace per node: {reason}")
            })?;
            Some(network)
        } else {
            None
        };
        let config_path = root.join("cluster.toml");
        let toml = cluster_toml(spec, tag, &names, network.as_ref())?;
        std::fs::write(&config_path, toml)?;
        let config = ClusterConfig::load(&config_path)?;
        created
            .files
            .extend(config.cxl_pools.iter().map(|pool| pool.path.clone()));
        let mut cluster = LocalCluster {
            root: root.to_path_buf(),
            config_path,
            config,
            exe: exe.to_path_buf(),
            spec: spec.clone(),
            directory: None,
            standbys: Vec::new(),
            nodes: Vec::new(),
            namespaces: network
                .iter()
                .flat_map(|network| &network.namespaces)
                .map(|namespace| namespace.name.clone())
                .collect(),
            created: Created::default(),
        };
        cluster.directory = Some(cluster.spawn(None, &["directory"])?);
        cluster.start_standbys()?;
        for (index, name) in names.iter().enumerate() {
            let namespace = cluster.namespaces.get(index).cloned();
            let child = cluster.spawn(namespace.as_deref(), &["node", "--name", name])?;
            cluster.nodes.push((name.clone(), Some(child)));
        }
        for index in 0..cluster.nodes.len() {
            cluster.wait_ready_or_cancel(index, cancel)?;
        }
        Ok(cluster)
    }

    /// Starts the standby directories the configuration names, each with a metrics port
    /// when the cluster serves metrics.
    fn start_standbys(&mut self) -> anyhow::Result<()> {
        for listen in self.config.directory.standbys.clone() {
            let metrics = if self.spec.metrics {
                Some(free_tcp_port()?)
            } else {
                None
            };
            self.standbys.push(directories::StandbyDirectory {
                listen,
                metrics,
                child: None,
            });
            let index = self.standbys.len();
            self.start_directory_process(index)?;
        }
        Ok(())
    }

    /// Stops every process and removes everything the cluster created; returns what is
    /// still there afterwards, each with why (empty: everything is gone).
    pub fn shutdown(mut self) -> Vec<String> {
        self.stop();
        self.created.remove()
    }

    fn spawn(&self, namespace: Option<&str>, arguments: &[&str]) -> anyhow::Result<Child> {
        let log = arguments.last().copied().unwrap_or("process");
        self.spawn_logged(namespace, arguments, log)
    }

    /// Starts `kvtier <arguments> --config <cluster.toml>`, its output appended to
    /// `<log>.log` (a restarted process keeps its predecessor's log).
    fn spawn_logged(
        &self,
        namespace: Option<&str>,
        arguments: &[&str],
        log: &str,
    ) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(format!("{log}.log")))?;
        let mut command = match namespace {
            // `ip netns exec` replaces itself with the command: the child is the node.
            Some(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", namespace]).arg(&self.exe);
                command
            }
            None => Command::new(&self.exe),
        };
        command
            .args(arguments)
            .arg("--config")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} {}", self.exe.display(), arguments.join(" ")))
    }

    /// Waits until node `index` accepts a client (a real connection, hello and pool map).
    pub fn wait_ready(&mut self, index: usize) -> anyhow::Result<()> {
        self.wait_ready_or_cancel(index, &AtomicBool::new(false))
    }

    fn wait_ready_or_cancel(&mut self, index: usize, cancel: &AtomicBool) -> anyhow::Result<()> {
        let socket = self.socket(index)?;
        let deadline = Instant::now() + READY_TIMEOUT;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        loop {
            if let Some((name, Some(child))) = self.nodes.get_mut(index) {
                if let Some(status) = child.try_wait()? {
                    // The folder goes with a failed start: the log's end goes in the error.
                    let log = log_tail(&self.root.join(format!("{name}.log")));
                    bail!("node {name} exited during start-up ({status}); its log ends:\n{log}");
                }
            }
            if socket.exists() && runtime.block_on(Client::connect(&socket)).is_ok() {
                return Ok(());
            }
            if cancel.load(Ordering::Relaxed) {
                bail!("start-up cancelled");
            }
            if Instant::now() > deadline {
                bail!(
                    "node {index} not ready after {READY_TIMEOUT:?}; logs in {}",
                    self.root.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The Unix socket of node `index`.
    pub fn socket(&self, index: usize) -> anyhow::Result<PathBuf> {
        let name = &self.nodes.get(index).context("no such node")?.0;
        Ok(self.config.node(name)?.socket.clone())
    }

    /// The metrics address of the directory and of each node.
    pub fn metrics_addresses(&self) -> Vec<(String, SocketAddr)> {
        let mut addresses: Vec<(String, SocketAddr)> = self
            .config
            .directory
            .metrics
            .map(|address| ("directory".to_string(), address))
            .into_iter()
            .collect();
        for (name, _) in &self.nodes {
            if let Ok(Some(address)) = self.config.node(name).map(|node| node.metrics) {
                addresses.push((name.clone(), address));
            }
        }
        addresses
    }

    /// Kills node `index` with SIGKILL (no clean close) and waits for it to die.
    pub fn kill_node(&mut self, index: usize) -> anyhow::Result<()> {
        if let Some((_, Some(mut child))) = self
            .nodes
            .get_mut(index)
            .map(|(name, child)| (name.clone(), child.take()))
        {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Kills the directory with SIGKILL (no clean shutdown) and waits for it to die.
    pub fn kill_directory(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.directory.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts the directory again: a new incarnation over the same configuration, which the
    /// running nodes rejoin with what they hold.
    pub fn restart_directory(&mut self) -> anyhow::Result<()> {
        self.kill_directory()?;
        self.directory = Some(self.spawn(None, &["directory"])?);
        Ok(())
    }

    /// Starts node `index` again (a new epoch) and waits until it serves clients.
    pub fn restart_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.kill_node(index)?;
        let name = self.nodes.get(index).context("no such node")?.0.clone();
        let _ = std::fs::remove_file(self.socket(index)?);
        let namespace = self.namespaces.get(index).cloned();
        let child = self.spawn(namespace.as_deref(), &["node", "--name", &name])?;
        self.nodes[index].1 = Some(child);
        self.wait_ready(index)
    }

    /// Stops every process (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(&mut self) {
        let mut children: Vec<Child> = self
            .nodes
            .iter_mut()
            .filter_map(|(_, child)| child.take())
            .collect();
        children.extend(self.directory.take());
        children.extend(
            self.standbys
                .iter_mut()
                .filter_map(|standby| standby.child.take()),
        );
        for child in &children {
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for mut child in children {
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalCluster {
    /// Stops the processes and removes what the cluster created, printing what could not
    /// be removed ([`LocalCluster::shutdown`] returns it instead).
    fn drop(&mut self) {
        self.stop();
        for left in self.created.remove() {
            eprintln!("kvtier: could not remove {left}");
        }
    }
}

impl LocalCluster {
    /// Adds the next node (a spare one: it has a certificate) to `cluster.toml`, as an
    /// operator scaling out does, without telling the directory (reload it) or starting the
    /// node ([`LocalCluster::start_node`]). Returns its index. Loopback clusters only.
    pub fn add_node(&mut self) -> anyhow::Result<usize> {
        if self.uses_namespaces() {
            bail!("adding a node to a cluster of network namespaces is not supported");
        }
        let index = self.nodes.len();
        let name = node_name(index);
        let loopback = IpAddr::from([127, 0, 0, 1]);
        let reach = peer_endpoint_toml(&self.spec, loopback)?;
        let metrics = self.spec.metrics.then_some(loopback);
        let section = node_toml(&self.spec, &name, &reach, metrics)?;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.config_path)?;
        std::io::Write::write_all(&mut file, section.as_bytes())?;
        self.config = ClusterConfig::load(&self.config_path)?;
        self.nodes.push((name, None));
        Ok(index)
    }

    /// Starts node `index` (one that is not running) and waits until it serves clients.
    pub fn start_node(&mut self, index: usize) -> anyhow::Result<()> {
        let name = self.nodes.get(index).context("no such node")?.0.clone();
        let namespace = self.namespaces.get(index).cloned();
        let child = self.spawn(namespace.as_deref(), &["node", "--name", &name])?;
        self.nodes[index].1 = Some(child);
        self.wait_ready(index)
    }

    /// Stops node `index` with SIGTERM, as a service manager does, and waits for it.
    pub fn stop_node(&mut self, index: usize) -> anyhow::Result<std::process::ExitStatus> {
        let Some((_, Some(mut child))) = self
            .nodes
            .get_mut(index)
            .map(|(name, child)| (name.clone(), child.take()))
        else {
            bail!("node {index} is not running here");
        };
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        Ok(child.wait()?)
    }

    /// The process id of node `index`, while it runs under this cluster.
    pub fn node_pid(&self, index: usize) -> Option<u32> {
        self.nodes.get(index)?.1.as_ref().map(Child::id)
    }

    /// The process id of the directory.
    pub fn directory_pid(&self) -> Option<u32> {
        self.directory.as_ref().map(Child::id)
    }

    /// Whether node `index` still runs (`None`), or how it exited.
    pub fn node_exit(&mut self, index: usize) -> anyhow::Result<Option<std::process::ExitStatus>> {
        match self.nodes.get_mut(index) {
            Some((_, Some(child))) => Ok(child.try_wait()?),
            _ => bail!("node {index} was not started here"),
        }
    }

    /// Whether the directory still runs.
    pub fn directory_runs(&mut self) -> bool {
        self.directory
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Whether the nodes run in network namespaces of their own.
    pub fn uses_namespaces(&self) -> bool {
        !self.namespaces.is_empty()
    }
}

/// The cluster's certificates under `root`: one per node (spares included), the
/// directory, the benchmarks' peer and the default operator.
fn issue_certificates(spec: &ClusterSpec, root: &Path, names: &[String]) -> anyhow::Result<()> {
    let mut certificate_names = names.to_vec();
    certificate_names.extend((spec.nodes..spec.nodes + spec.spare_nodes).map(node_name));
    certificate_names.extend([
        "directory".to_string(),
        BENCH_PEER.to_string(),
        kvtier_core::config::DEFAULT_OPERATOR.to_string(),
    ]);
    kvtier_core::wire::certs::init_cluster_certs(&root.join("certs"), &certificate_names, false)?;
    Ok(())
}
