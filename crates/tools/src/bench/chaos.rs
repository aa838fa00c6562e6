//! `kvtier bench chaos`: a local cluster (a directory, three nodes, a shared CXL pool) under
//! several client processes (`chaos_client`) that load and store verified chunks, while the
//! directory and the nodes are killed with SIGKILL and started again at random. It reports
//! what the cache promises under faults: no load ever returns a wrong byte, no store fails
//! with anything but a skip, a directory restart loses nothing a surviving node held, how
//! long the nodes take to rejoin, and whether the long-lived processes' memory grows.

use super::chaos_client::ClientCounts;
use crate::launch::{ClusterSpec, LocalCluster};
use crate::workload::chunk;
use crate::workload::histogram::Histogram;
use anyhow::Context;
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::ProbeOutcome;
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, ObjectId, PrefixDigest};
use kvtier_core::progress::{Progress, Unit};
use kvtier_core::rng::SplitMix64;
use serde::Serialize;
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(super) const NODES: usize = 3;
/// How long the nodes may take to report everything again after a directory restart
/// before what they did not report counts as lost.
const RECOVERY_DEADLINE: Duration = Duration::from_secs(60);
/// How often the orchestrator looks at the nodes while they rejoin.
const RECOVERY_POLL: Duration = Duration::from_millis(20);
/// Canaries each node process stores (see [`Canaries`]).
pub(super) const CANARIES_PER_NODE: u32 = 64;
/// The first word of a canary's prefix: no client key starts with it.
const CANARY_TAG: u32 = 0xCA4A_2127;
/// Load before the first fault and before memory is first measured.
const WARM_UP: Duration = Duration::from_secs(3);

/// Options of `kvtier bench chaos`.
#[derive(Clone, Debug, clap::Args)]
pub struct ChaosBenchArgs {
    /// How long the faults go on.
    #[arg(long, default_value_t = 120)]
    pub seconds: u64,
    /// Client processes (spread over the nodes).
    #[arg(long, default_value_t = 6)]
    pub clients: usize,
    /// Keys of the shared key space (all fit in the pools: nothing is evicted).
    #[arg(long, default_value_t = 1024)]
    pub keys: u32,
    #[arg(long, default_value_t = 64 << 10)]
    pub chunk_bytes: usize,
    /// Mean time between two faults.
    #[arg(long, default_value_t = 4000)]
    pub fault_interval_ms: u64,
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Standby directories elected through a real etcd instead: the leader is killed (once
    /// stopped) at every fault ([`super::chaos_ha`]); needs the `etcd` program.
    #[arg(long)]
    pub ha: bool,
    /// With `--ha`: the leader's etcd lease in whole seconds (the bench's etcd runs loopback
    /// Raft timing, under which it grants 1 s).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub lease_ttl_s: u64,
}

/// The benchmark's output.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChaosReport {
    pub seconds: u64,
    pub loads_verified: u64,
    pub corrupt_loads: u64,
    pub expired_views: u64,
    pub stores: u64,
    pub skipped_stores: u64,
    pub failed_stores: u64,
    pub failed_loads: u64,
    pub reconnects: u64,
    pub directory_restarts: u64,
    pub node_restarts: u64,
    /// Canaries (objects the benchmark stored through each live node process, which no
    /// client touches) that were hits just before the directory was killed, summed over
    /// kills.
    pub ready_before_directory_kill: u64,
    /// Of those, the hits again once the nodes rejoined.
    pub found_after_recovery: u64,
    pub recovery_ms_p50: f64,
    pub recovery_ms_max: f64,
    /// Growth of anonymous resident memory of the nodes never restarted, first
    /// measurement to last (the largest over those nodes).
    pub rss_growth_percent: f64,
}

/// Runs the benchmark and prints its report.
pub fn run(exe: &Path, args: &ChaosBenchArgs) -> anyhow::Result<()> {
    if args.ha {
        return super::chaos_ha::run(exe, args);
    }
    let mut cluster = LocalCluster::start(exe, &chaos_spec(args))?;
    let mut clients = (0..args.clients)
        .map(|index| spawn_client(exe, &cluster, args, index))
        .collect::<anyhow::Result<Vec<Child>>>()?;
    let outcome = inject_faults(&mut cluster, args);
    let mut report = outcome.unwrap_or_else(|error| {
        tracing::error!(%error, "the fault schedule stopped early");
        ChaosReport::default()
    });
    for child in &mut clients {
        report.add(&finish_client(child)?);
    }
    report.seconds = args.seconds;
    print(&report, args.json)
}

/// The cluster both chaos runs start: three nodes, a CPU pool of a quarter of the working
/// set and a shared pool of twice it (nothing is evicted), no watermark.
pub(super) fn chaos_spec(args: &ChaosBenchArgs) -> ClusterSpec {
    let working_set = u64::from(args.keys) * args.chunk_bytes as u64;
    ClusterSpec {
        nodes: NODES,
        cpu_pool_bytes: (working_set / 4).next_multiple_of(1 << 20),
        cxl_pool_bytes: (working_set * 2).next_multiple_of(16 << 20),
        cxl_extent_bytes: 4 << 20,
        write_order: vec![Medium::Cpu, Medium::Cxl],
        suspect_after_ms: 3_000,
        fence_after_ms: 15_000,
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        ..ClusterSpec::default()
    }
}

impl ChaosReport {
    fn add(&mut self, counts: &ClientCounts) {
        self.loads_verified += counts.loads_verified;
        self.corrupt_loads += counts.corrupt_loads;
        self.expired_views += counts.expired_views;
        self.stores += counts.stores;
        self.skipped_stores += counts.skipped_stores;
        self.failed_stores += counts.failed_stores;
        self.failed_loads += counts.failed_loads;
        self.reconnects += counts.reconnects;
    }
}

pub(super) fn spawn_client(
    exe: &Path,
    cluster: &LocalCluster,
    args: &ChaosBenchArgs,
    index: usize,
) -> anyhow::Result<Child> {
    Command::new(exe)
        .args(["bench", "chaos-client", "--socket"])
        .arg(cluster.socket(index % NODES)?)
        .args(["--keys", &args.keys.to_string()])
        .args(["--chunk-bytes", &args.chunk_bytes.to_string()])
        .args(["--seed", &(args.seed + index as u64).to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting a chaos client")
}

/// Closes the client's standard input (it stops) and reads its counts.
pub(super) fn finish_client(child: &mut Child) -> anyhow::Result<ClientCounts> {
    drop(child.stdin.take());
    let stdout = child.stdout.take().context("client without output")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    child.wait()?;
    serde_json::from_str(&line).with_context(|| format!("client counts `{line}`"))
}

/// Kills and restarts the directory or a node at random times until the run ends.
fn inject_faults(cluster: &mut LocalCluster, args: &ChaosBenchArgs) -> anyhow::Result<ChaosReport> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut report = ChaosReport::default();
    let mut random = SplitMix64::new(args.seed);
    let mut recoveries = Histogram::default();
    let mut restarted_nodes = HashSet::new();
    let mut canaries = Canaries::new(CANARIES_PER_NODE);
    for node in 0..NODES {
        runtime.block_on(canaries.store(cluster, node, args.chunk_bytes))?;
    }
    std::thread::sleep(WARM_UP);
    let first_rss: Vec<u64> = (0..NODES)
        .map(|node| anonymous_rss(cluster, node))
        .collect();
    let started = Instant::now();
    let end = started + Duration::from_secs(args.seconds);
    let bar = Progress::bar("chaos: seconds", args.seconds, Unit::Items, args.json);
    while Instant::now() < end {
        bar.set(started.elapsed().as_secs());
        bar.message(format!(
            "{} node restarts, {} directory restarts",
            report.node_restarts, report.directory_restarts
        ));
        let wait = args.fault_interval_ms / 2 + random.below(args.fault_interval_ms.max(1));
        std::thread::sleep(Duration::from_millis(wait));
        if random.chance(34) {
            let (before, found, took) = runtime.block_on(restart_directory(cluster, &canaries))?;
            report.directory_restarts += 1;
            report.ready_before_directory_kill += before;
            report.found_after_recovery += found;
            recoveries.record(took);
        } else {
            let node = random.below(NODES as u64) as usize;
            cluster.restart_node(node)?;
            runtime.block_on(canaries.store(cluster, node, args.chunk_bytes))?;
            restarted_nodes.insert(node);
            report.node_restarts += 1;
        }
    }
    bar.finish();
    report.recovery_ms_p50 = recoveries.quantile(0.5).as_secs_f64() * 1e3;
    report.recovery_ms_max = recoveries.max().as_secs_f64() * 1e3;
    report.rss_growth_percent = (0..NODES)
        .filter(|node| !restarted_nodes.contains(node))
        .map(|node| {
            let (first, last) = (first_rss[node], anonymous_rss(cluster, node));
            (last as f64 - first as f64) * 100.0 / first.max(1) as f64
        })
        .fold(0.0, f64::max);
    Ok(report)
}

/// Objects the orchestrator stored through each node and no client touches: what a
/// directory restart must keep. Each node process gets fresh ones (its generation), so
/// every canary counted was written by a process that is still alive.
pub(super) struct Canaries {
    /// Per node: the canaries its current process stored.
    pub(super) stored: Vec<Vec<ObjectId>>,
    generations: Vec<u32>,
    per_node: u32,
}

impl Canaries {
    pub(super) fn new(per_node: u32) -> Canaries {
        Canaries {
            stored: vec![Vec::new(); NODES],
            generations: vec![0; NODES],
            per_node,
        }
    }

    /// Stores a new generation of canaries through node `node`; keeps those stored.
    pub(super) async fn store(
        &mut self,
        cluster: &LocalCluster,
        node: usize,
        chunk_bytes: usize,
    ) -> anyhow::Result<()> {
        self.generations[node] += 1;
        let client = Client::connect(&cluster.socket(node)?).await?;
        let namespace = client.register_namespace(demo_namespace()).await?;
        let mut bytes = vec![0u8; chunk_bytes];
        let mut stored = Vec::new();
        for index in 0..self.per_node {
            let id = ObjectId {
                namespace,
                prefix: PrefixDigest::ROOT.chain(&[
                    CANARY_TAG,
                    node as u32,
                    self.generations[node],
                    index,
                ]),
                shard: 0,
                part: 0,
            };
            chunk::fill(&id, &mut bytes);
            if client.store(id, &bytes).await? == StoreOutcome::Stored {
                stored.push(id);
            }
        }
        self.stored[node] = stored;
        Ok(())
    }
}

/// Kills the directory, starts it again, and waits until every node has its canaries back
/// as hits (or [`RECOVERY_DEADLINE`]). Returns the canaries that were hits before, those
/// found again, and how long the restart took to be whole.
async fn restart_directory(
    cluster: &mut LocalCluster,
    canaries: &Canaries,
) -> anyhow::Result<(u64, u64, Duration)> {
    let mut probes = Vec::new();
    for node in 0..NODES {
        let client = Client::connect(&cluster.socket(node)?).await?;
        client.register_namespace(demo_namespace()).await?;
        let before = hits(&client, &canaries.stored[node]).await?;
        probes.push((client, before));
    }
    cluster.kill_directory()?;
    let killed = Instant::now();
    cluster.restart_directory()?;
    let deadline = killed + RECOVERY_DEADLINE;
    let mut found = [0u64; NODES];
    let mut whole = [false; NODES];
    while whole.iter().any(|done| !done) && Instant::now() < deadline {
        for (node, (client, before)) in probes.iter().enumerate() {
            if whole[node] {
                continue;
            }
            let now_hits = hits(client, &canaries.stored[node])
                .await
                .unwrap_or_default();
            found[node] = before.intersection(&now_hits).count() as u64;
            whole[node] = found[node] == before.len() as u64;
        }
        tokio::time::sleep(RECOVERY_POLL).await;
    }
    let before: u64 = probes.iter().map(|(_, before)| before.len() as u64).sum();
    Ok((before, found.iter().sum(), killed.elapsed()))
}

/// The keys `client`'s node has as hits now (in batches the directory accepts).
pub(super) async fn hits(client: &Client, keys: &[ObjectId]) -> anyhow::Result<HashSet<usize>> {
    let mut hit = HashSet::new();
    for (batch, chunk) in keys.chunks(1024).enumerate() {
        let outcomes = client.probe(chunk).await?;
        for (index, outcome) in outcomes.iter().enumerate() {
            if matches!(outcome, ProbeOutcome::Hit { .. }) {
                hit.insert(batch * 1024 + index);
            }
        }
    }
    Ok(hit)
}

/// Anonymous resident memory of node `node` (its pools, mapped shared, do not count).
fn anonymous_rss(cluster: &mut LocalCluster, node: usize) -> u64 {
    let Some(pid) = cluster.node_pid(node) else {
        return 0;
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib << 10)
}

fn print(report: &ChaosReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    let kept =
        report.found_after_recovery as f64 / report.ready_before_directory_kill.max(1) as f64;
    println!(
        "chaos {} s: {} directory and {} node restarts; {} loads verified, {} corrupt; {} stores ({} skipped, {} failed), {} failed loads",
        report.seconds,
        report.directory_restarts,
        report.node_restarts,
        report.loads_verified,
        report.corrupt_loads,
        report.stores,
        report.skipped_stores,
        report.failed_stores,
        report.failed_loads
    );
    println!(
        "directory restarts kept {}/{} hits ({:.4}); recovery p50 {:.0} ms, max {:.0} ms; node memory growth {:.1} %",
        report.found_after_recovery,
        report.ready_before_directory_kill,
        kept,
        report.recovery_ms_p50,
        report.recovery_ms_max,
        report.rss_growth_percent
    );
    Ok(())
}
