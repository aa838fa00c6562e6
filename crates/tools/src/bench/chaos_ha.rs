//! `kvtier bench chaos --ha`: a real etcd, three directories (a leader and two standbys)
//! and three nodes sharing a CXL pool, under the chaos clients' verified load loop, while the
//! leading directory is killed with SIGKILL every few seconds, and once stopped with
//! SIGSTOP (cut off from etcd while it still runs) and resumed after its successor leads.
//! It reports what failover promises: how long until every node stores through the new
//! leader with its canaries found again, that nothing a live node held is lost, no load
//! returns a wrong byte, no engine request fails with an error, and that no deposed leader
//! answers again (a resumed one must exit with status 75 before answering).

use super::chaos::{
    chaos_spec, finish_client, hits, spawn_client, Canaries, ChaosBenchArgs, CANARIES_PER_NODE,
    NODES,
};
use crate::launch::etcd::EtcdServer;
use crate::launch::{ClusterSpec, LocalCluster};
use crate::workload::histogram::Histogram;
use anyhow::{bail, Context as _};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::StoreSkip;
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{ObjectId, PrefixDigest};
use kvtier_core::progress::{Progress, Unit};
use serde::Serialize;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// Standby directories beside the leader.
const STANDBYS: usize = 2;
/// Longest a failover may take before the run calls it failed.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(60);
/// How often the orchestrator looks while a failover goes on.
const POLL: Duration = Duration::from_millis(10);
/// The fault (counted from 1) that stops the leader instead of killing it.
const PARTITIONED_FAULT: u64 = 3;
/// The exit status of a leader that lost its lease (`actors::directory::election`).
const EXIT_DEPOSED: i32 = 75;

/// The benchmark's output.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HaChaosReport {
    pub seconds: u64,
    /// The leader lease: a killed leader is replaced within about this long plus etcd's
    /// expiry sweep (every 500 ms).
    pub lease_ttl_s: u64,
    /// Leaders killed with SIGKILL.
    pub leader_kills: u64,
    /// Leaders stopped with SIGSTOP (cut off while running), resumed once replaced.
    pub leader_partitions: u64,
    /// Fault to every node answered by the new leader (a store stored, or skipped for room)
    /// with its canaries found.
    pub failover_ms_p50: f64,
    pub failover_ms_max: f64,
    /// Fault to a standby leading (the election alone).
    pub elected_ms_max: f64,
    /// Canaries that were hits just before each fault, summed over faults.
    pub ready_before_kill: u64,
    /// Of those, the hits again after the failover.
    pub found_after_failover: u64,
    pub loads_verified: u64,
    pub corrupt_loads: u64,
    pub stores: u64,
    pub skipped_stores: u64,
    /// Loads or stores answered with an error rather than a miss or a skip.
    pub client_errors: u64,
    /// Resumed deposed leaders that did not exit with status 75 (the status of the check
    /// made before answering anything) within the deadline.
    pub served_by_deposed_leader: u64,
}

/// Runs the benchmark and prints its report.
pub fn run(exe: &Path, args: &ChaosBenchArgs) -> anyhow::Result<()> {
    let folder = std::env::temp_dir().join(format!("kvtier-chaos-etcd-{}", std::process::id()));
    let outcome = run_with_etcd(exe, args, &folder);
    let _ = std::fs::remove_dir_all(&folder);
    let report = outcome?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "chaos --ha {} s, {} s lease: {} leader kills, {} partitions; failover p50 {:.0} ms, max {:.0} ms; kept {}/{} canaries; {} loads verified, {} corrupt; {} stores ({} skipped); {} client errors; {} served by a deposed leader",
            report.seconds,
            report.lease_ttl_s,
            report.leader_kills,
            report.leader_partitions,
            report.failover_ms_p50,
            report.failover_ms_max,
            report.found_after_failover,
            report.ready_before_kill,
            report.loads_verified,
            report.corrupt_loads,
            report.stores,
            report.skipped_stores,
            report.client_errors,
            report.served_by_deposed_leader
        );
    }
    Ok(())
}

fn run_with_etcd(
    exe: &Path,
    args: &ChaosBenchArgs,
    folder: &Path,
) -> anyhow::Result<HaChaosReport> {
    let etcd = EtcdServer::start(folder)?;
    let spec = ClusterSpec {
        metrics: true,
        etcd: vec![etcd.client_address()],
        standby_directories: STANDBYS,
        lease_ttl_s: args.lease_ttl_s,
        ..chaos_spec(args)
    };
    let mut cluster = LocalCluster::start(exe, &spec)?;
    let mut clients = (0..args.clients)
        .map(|index| spawn_client(exe, &cluster, args, index))
        .collect::<anyhow::Result<Vec<Child>>>()?;
    let outcome = fail_over(&mut cluster, args);
    if let Some(keep) = std::env::var_os("KVTIER_CHAOS_LOGS") {
        keep_logs(&cluster, Path::new(&keep));
    }
    let mut report = outcome.unwrap_or_else(|error| {
        tracing::error!(%error, "the fault schedule stopped early");
        HaChaosReport::default()
    });
    for child in &mut clients {
        let counts = finish_client(child)?;
        report.loads_verified += counts.loads_verified;
        report.corrupt_loads += counts.corrupt_loads;
        report.stores += counts.stores;
        report.skipped_stores += counts.skipped_stores;
        report.client_errors += counts.failed_stores + counts.failed_loads;
    }
    report.seconds = args.seconds;
    report.lease_ttl_s = args.lease_ttl_s;
    drop(etcd);
    Ok(report)
}

/// Copies the cluster's process logs into `folder` (`KVTIER_CHAOS_LOGS`), to read a slow
/// failover after the cluster is gone.
fn keep_logs(cluster: &LocalCluster, folder: &Path) {
    let _ = std::fs::create_dir_all(folder);
    let Ok(entries) = std::fs::read_dir(&cluster.root) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|extension| extension == "log") {
            if let Some(name) = path.file_name() {
                let _ = std::fs::copy(&path, folder.join(name));
            }
        }
    }
}

/// Kills (once stops) the leader at random intervals until the run ends, measuring each
/// failover.
fn fail_over(cluster: &mut LocalCluster, args: &ChaosBenchArgs) -> anyhow::Result<HaChaosReport> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut report = HaChaosReport::default();
    let mut random = kvtier_core::rng::SplitMix64::new(args.seed);
    let mut failovers = Histogram::default();
    let mut elected = Duration::ZERO;
    let mut canaries = Canaries::new(CANARIES_PER_NODE);
    for node in 0..NODES {
        runtime.block_on(canaries.store(cluster, node, args.chunk_bytes))?;
    }
    let started = Instant::now();
    let end = started + Duration::from_secs(args.seconds);
    let bar = Progress::bar("chaos --ha: seconds", args.seconds, Unit::Items, args.json);
    let mut faults = 0;
    while Instant::now() < end {
        bar.set(started.elapsed().as_secs());
        let wait = args.fault_interval_ms / 2 + random.below(args.fault_interval_ms.max(1));
        std::thread::sleep(Duration::from_millis(wait));
        faults += 1;
        let partition = faults == PARTITIONED_FAULT;
        let outcome =
            runtime.block_on(one_failover(cluster, &canaries, faults as u32, partition))?;
        report.ready_before_kill += outcome.before;
        report.found_after_failover += outcome.found;
        report.served_by_deposed_leader += u64::from(outcome.deposed_answered);
        failovers.record(outcome.took);
        elected = elected.max(outcome.elected);
        if partition {
            report.leader_partitions += 1;
        } else {
            report.leader_kills += 1;
        }
        bar.message(format!(
            "{} kills, {} partitions, last failover {:.0} ms",
            report.leader_kills,
            report.leader_partitions,
            outcome.took.as_secs_f64() * 1e3
        ));
    }
    bar.finish();
    report.failover_ms_p50 = failovers.quantile(0.5).as_secs_f64() * 1e3;
    report.failover_ms_max = failovers.max().as_secs_f64() * 1e3;
    report.elected_ms_max = elected.as_secs_f64() * 1e3;
    Ok(report)
}

/// What one failover did.
struct Failover {
    before: u64,
    found: u64,
    took: Duration,
    elected: Duration,
    deposed_answered: bool,
}

/// Kills (or stops) the leader, waits until every node stores through its successor and
/// has its canaries back, then brings the old leader back as a standby (a stopped one is
/// resumed first, and must exit with [`EXIT_DEPOSED`]).
async fn one_failover(
    cluster: &mut LocalCluster,
    canaries: &Canaries,
    fault: u32,
    partition: bool,
) -> anyhow::Result<Failover> {
    let old = wait_for_leader(cluster, None).await?;
    let mut probes = Vec::new();
    for node in 0..NODES {
        let client = Client::connect(&cluster.socket(node)?).await?;
        let namespace = client.register_namespace(demo_namespace()).await?;
        let before = hits(&client, &canaries.stored[node]).await?;
        probes.push((client, namespace, before));
    }
    let faulted = Instant::now();
    let stopped = if partition {
        let pid = cluster
            .directory_process_pid(old)
            .context("the leader has no process")?;
        signal(pid, libc::SIGSTOP)?;
        Some(pid)
    } else {
        cluster.kill_directory_process(old)?;
        None
    };
    let new = wait_for_leader(cluster, Some(old)).await?;
    let elected = faulted.elapsed();
    tracing::info!(old, new, ?elected, partition, "a standby leads");
    let mut found = 0;
    for (node, (client, namespace, before)) in probes.iter().enumerate() {
        found += served_again(
            client,
            *namespace,
            before,
            &canaries.stored[node],
            node,
            fault,
            faulted,
        )
        .await;
    }
    let took = faulted.elapsed();
    let deposed_answered = match stopped {
        Some(pid) => resumed_answers(cluster, old, pid).await?,
        None => false,
    };
    cluster.start_directory_process(old)?;
    let before = probes
        .iter()
        .map(|(_, _, before)| before.len() as u64)
        .sum();
    tracing::info!(
        ?took,
        "every node stores through the new leader with its canaries"
    );
    Ok(Failover {
        before,
        found,
        took,
        elected,
        deposed_answered,
    })
}

/// Waits until node `node`'s client has its canaries `before` back and stores through a
/// directory that answers (or [`FAILOVER_DEADLINE`] passed since `faulted`); the canaries
/// found.
async fn served_again(
    client: &Client,
    namespace: kvtier_core::model::NamespaceId,
    before: &std::collections::HashSet<usize>,
    stored: &[ObjectId],
    node: usize,
    fault: u32,
    faulted: Instant,
) -> u64 {
    let probe = ObjectId {
        namespace,
        prefix: PrefixDigest::ROOT.chain(&[0xFA11_0BE5, node as u32, fault]),
        shard: 0,
        part: 0,
    };
    let bytes = vec![node as u8; 4096];
    loop {
        let now_hits = hits(client, stored).await.unwrap_or_default();
        let complete = before.is_subset(&now_hits);
        // Stored, or skipped for a reason only a directory that answered gives (a new
        // leader grants no extent of a shared pool during its recovery window, so a full
        // node's stores are skipped for room meanwhile).
        let outcome = client.store(probe, &bytes).await;
        let answered = matches!(
            outcome,
            Ok(StoreOutcome::Stored | StoreOutcome::AlreadyPresent)
                | Ok(StoreOutcome::Skipped(
                    StoreSkip::NoRoom | StoreSkip::NoPool | StoreSkip::PoolRefused
                ))
        );
        if complete && answered {
            return before.len() as u64;
        }
        if faulted.elapsed() > FAILOVER_DEADLINE {
            return before.intersection(&now_hits).count() as u64;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Resumes the stopped leader `old` (process `pid`): whether it failed to exit with
/// [`EXIT_DEPOSED`] within [`FAILOVER_DEADLINE`] (a deposed leader that kept serving).
async fn resumed_answers(cluster: &mut LocalCluster, old: usize, pid: u32) -> anyhow::Result<bool> {
    signal(pid, libc::SIGCONT)?;
    let deadline = Instant::now() + FAILOVER_DEADLINE;
    let status = loop {
        if let Some(status) = cluster.directory_process_exit(old) {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(POLL).await;
    };
    Ok(status.and_then(|status| status.code()) != Some(EXIT_DEPOSED))
}

/// The directory process that leads, once exactly one does (other than `other_than`).
async fn wait_for_leader(
    cluster: &LocalCluster,
    other_than: Option<usize>,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + FAILOVER_DEADLINE;
    loop {
        if let Some(index) = cluster.directory_leader(other_than) {
            return Ok(index);
        }
        if Instant::now() > deadline {
            bail!("no directory took the lead within {FAILOVER_DEADLINE:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

fn signal(pid: u32, signal: i32) -> anyhow::Result<()> {
    let pid = i32::try_from(pid)?;
    // SAFETY: kill(2) on a child process this cluster started.
    if unsafe { libc::kill(pid, signal) } != 0 {
        bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}
