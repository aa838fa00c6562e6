//! `kvtier bench replicate`: replication on demand from node A's private CPU pool into the
//! shared CXL pool both nodes map (an emulated device: one file), against the faster of a
//! memcpy and a streaming copy between the same two mappings measured in the same run, and
//! against the faster of them on as many threads as node A copies with; and the time from
//! node B's first miss of an object to the moment B finds it READY.
//!
//! Throughput phase: A stores the objects, B misses them all in one load, and the run ends
//! when B finds every one READY in CXL (B then reads them all back byte-exact). Latency
//! phase: one object at a time, B misses it and probes until it is READY.

use crate::launch::{node_name, ClusterSpec, LocalCluster};
use crate::workload::chunk;
use crate::workload::histogram::Histogram;
use crate::workload::prefix::seeded_ids;
use anyhow::{bail, Context};
use futures_util::stream::{self, StreamExt};
use kvtier_core::backends::copy::CopyRoutine;
use kvtier_core::backends::{shared_memory, SharedMemory};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::{AcquireMode, ProbeOutcome};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, NamespaceId, ObjectId};
use kvtier_core::progress::Progress;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

/// The shortest pause between B's probes for the copies of the throughput phase (a hang
/// guard ends a run that never completes): the runtime's timer resolution, so the end of a
/// run is seen within about two milliseconds (5 ms made the end of a 1 GiB run, ~150 ms,
/// uncertain by 3%). Longer pauses come from the copies' progress ([`wait_ready`]).
const PROBE_INTERVAL: Duration = Duration::from_millis(1);
/// How often B probes for the one copy of the latency phase: 200 us. The runtime's timer
/// rounds a sleep up to its next millisecond tick (a 1 ms sleep lasted about 2 ms), which
/// made a copy READY 0.8 ms after the miss read 2.8 ms whenever the first probe came just
/// before it; a pause this short sleeps a blocking thread instead, at a probe of one object
/// per 200 us plus its round trip.
const LATENCY_PROBE_INTERVAL: Duration = Duration::from_micros(200);
/// Pauses shorter than this sleep a blocking thread rather than wait for the runtime's timer.
const TIMER_RESOLUTION: Duration = Duration::from_millis(1);
/// Longest a phase may wait for its copies before the run fails.
const HANG_GUARD: Duration = Duration::from_secs(120);
/// Timed passes of each copy the limit is measured with; the median is reported.
const COPY_PASSES: usize = 3;
/// Stores in flight at once while A fills its pool.
const STORE_CONCURRENCY: usize = 16;

/// Options of `kvtier bench replicate`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplicateBenchArgs {
    /// Object size, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub object_bytes: usize,
    /// Bytes B misses at once in the throughput phase.
    #[arg(long, default_value_t = 1 << 30)]
    pub replicate_bytes: usize,
    /// Objects replicated one at a time in the latency phase.
    #[arg(long, default_value_t = 50)]
    pub latency_objects: usize,
    #[arg(long, default_value_t = 12)]
    pub seed: u64,
    /// Objects of `object_bytes` sent node to node per transport and round in the
    /// network phase (QUIC against TLS over TCP, [`super::peer`]).
    #[arg(long, default_value_t = 128)]
    pub network_objects: usize,
    /// UDP payload size of the network phase's tuned QUIC run, in bytes.
    #[arg(long, default_value_t = 32_768)]
    pub network_datagram_bytes: u16,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The benchmark's output. Each transfer path adds its own fields.
#[derive(Clone, Debug, Serialize)]
pub struct ReplicateReport {
    pub object_bytes: usize,
    /// Bytes replicated CPU → CXL in the throughput phase.
    pub cxl_bytes: u64,
    /// Those bytes over the time from B's miss to every copy READY.
    pub cxl_gbps: f64,
    /// A memcpy from A's CPU pool into the CXL pool, the same bytes between the same
    /// mappings, in this run (the median of three passes).
    pub memcpy_gbps: f64,
    /// A copy of the same bytes between the same mappings with the streaming routine
    /// (non-temporal stores on x86-64), in this run (the median of three passes).
    pub streaming_copy_gbps: f64,
    /// `cxl_gbps` over the faster of `memcpy_gbps` and `streaming_copy_gbps` (target
    /// ≥ 0.8): the node's copy is held to the best copy one thread makes.
    pub cxl_ratio: f64,
    /// The faster of the two copies, which `parallel_copy_gbps` uses (node A chose its own
    /// routine by the same kind of measurement at its start: `kvtier_core::backends::copy`).
    pub faster_routine: &'static str,
    /// Node A's copy threads (`copy_threads` of its section).
    pub copy_threads: usize,
    /// The faster of the two copies of the same bytes between the same mappings, cut in as many
    /// contiguous shares as node A has copy threads, one thread each, in this run (the
    /// median of three passes).
    pub parallel_copy_gbps: f64,
    /// `cxl_gbps` over `parallel_copy_gbps`: the node's copy held to the same number of
    /// threads copying without a cluster around them.
    pub cxl_parallel_ratio: f64,
    /// From B's first miss of an object to B finding its copy READY, one object at a time.
    pub miss_to_ready_p50_us: u64,
    pub miss_to_ready_p99_us: u64,
    pub miss_to_ready_max_us: u64,
    /// Node-to-node transfer over the peer QUIC endpoint, GB/s ([`super::peer`]).
    pub quic_gbps: f64,
    /// The datagram size the QUIC connection reached, in bytes.
    pub quic_datagram_bytes_reached: u16,
    /// The same with 1452-byte datagrams (a 1500-byte MTU path).
    pub quic_1500_mtu_gbps: f64,
    /// TLS 1.3 over TCP, same certificates, sizes and concurrency, in this run.
    pub tls_tcp_gbps: f64,
    /// `quic_gbps / tls_tcp_gbps` (target ≥ 0.5).
    pub quic_ratio: f64,
    /// `quic_1500_mtu_gbps / tls_tcp_gbps`.
    pub quic_1500_mtu_ratio: f64,
}

/// Runs both phases and prints the report.
pub fn run(exe: &Path, args: &ReplicateBenchArgs) -> anyhow::Result<()> {
    let report = measure(exe, args)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

/// The two-node cluster the replication phases run on, with room for `count` objects of
/// `size` bytes and the latency phase's, and eviction off so that only replication moves
/// bytes.
fn cluster_spec(args: &ReplicateBenchArgs, size: usize, count: usize) -> ClusterSpec {
    let total = (count + args.latency_objects) * size;
    // Extents as a node asks for them by default (one directory round trip each).
    let extent_bytes = (size as u64).next_multiple_of(kvtier_core::config::default_extent_bytes());
    let pool_bytes = (total as u64 * 5 / 4).next_multiple_of(extent_bytes);
    ClusterSpec {
        nodes: 2,
        cpu_pool_bytes: pool_bytes,
        cxl_pool_bytes: pool_bytes,
        cxl_extent_bytes: extent_bytes,
        write_order: vec![Medium::Cpu],
        // Eviction off: only replication moves bytes.
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        ..ClusterSpec::default()
    }
}

/// Runs the replication phases on a local cluster, the copy limits beside them, and the
/// network phase: the report, not printed.
fn measure(exe: &Path, args: &ReplicateBenchArgs) -> anyhow::Result<ReplicateReport> {
    let size = args.object_bytes.max(4096);
    let count = (args.replicate_bytes / size).max(1);
    let cluster = LocalCluster::start(exe, &cluster_spec(args, size, count))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let phase = Progress::phase("replicate: cpu -> cxl", args.json);
    let (cxl_gbps, latencies) = runtime.block_on(replicate(&cluster, args, size, count))?;
    drop(phase);
    let copy_threads = cluster.config.node(&node_name(0))?.copy_threads;
    let limits = copy_limits(&cluster, size * count, copy_threads)?;
    drop(cluster);
    let phase = Progress::phase("replicate: node to node, QUIC and TLS over TCP", args.json);
    let network = super::peer::measure(&super::peer::PeerBenchArgs {
        object_bytes: size,
        objects: args.network_objects,
        concurrency: 4,
        datagram_bytes: args.network_datagram_bytes,
        rounds: 3,
        json: args.json,
    })?;
    drop(phase);
    let micros = |quantile: f64| latencies.quantile(quantile).as_micros() as u64;
    Ok(ReplicateReport {
        object_bytes: size,
        cxl_bytes: (size * count) as u64,
        cxl_gbps,
        memcpy_gbps: limits.memcpy_gbps,
        streaming_copy_gbps: limits.streaming_gbps,
        cxl_ratio: cxl_gbps / limits.memcpy_gbps.max(limits.streaming_gbps),
        faster_routine: limits.faster.name(),
        copy_threads,
        parallel_copy_gbps: limits.parallel_gbps,
        cxl_parallel_ratio: cxl_gbps / limits.parallel_gbps,
        miss_to_ready_p50_us: micros(0.5),
        miss_to_ready_p99_us: micros(0.99),
        miss_to_ready_max_us: latencies.max().as_micros() as u64,
        quic_gbps: network.quic_gbps,
        quic_datagram_bytes_reached: network.quic_datagram_bytes_reached,
        quic_1500_mtu_gbps: network.quic_1500_mtu_gbps,
        tls_tcp_gbps: network.tls_tcp_gbps,
        quic_ratio: network.quic_ratio,
        quic_1500_mtu_ratio: network.quic_1500_mtu_ratio,
    })
}

/// Prints `report` as text, one line per phase.
fn print_report(report: &ReplicateReport) {
    let size = report.object_bytes;
    println!(
        "replication CPU -> CXL: {} MiB in {} KiB objects at {:.2} GB/s, memcpy between the same mappings {:.2} GB/s, streaming copy {:.2} GB/s, ratio to the faster {:.2}",
        report.cxl_bytes >> 20,
        size >> 10,
        report.cxl_gbps,
        report.memcpy_gbps,
        report.streaming_copy_gbps,
        report.cxl_ratio
    );
    println!(
        "the faster copy ({}) on node A's {} copy threads {:.2} GB/s, replication's ratio to it {:.2}",
        report.faster_routine,
        report.copy_threads, report.parallel_copy_gbps, report.cxl_parallel_ratio
    );
    println!(
        "first remote miss -> READY, one object at a time: p50 {} us, p99 {} us, max {} us",
        report.miss_to_ready_p50_us, report.miss_to_ready_p99_us, report.miss_to_ready_max_us
    );
    println!(
        "node to node, {} KiB objects: QUIC {:.2} GB/s ({} B datagrams), TLS over TCP {:.2} GB/s, ratio {:.2}; QUIC at 1452 B datagrams {:.2} GB/s, ratio {:.2}",
        size >> 10,
        report.quic_gbps,
        report.quic_datagram_bytes_reached,
        report.tls_tcp_gbps,
        report.quic_ratio,
        report.quic_1500_mtu_gbps,
        report.quic_1500_mtu_ratio
    );
}

/// Both phases against a running cluster: the throughput in GB/s and the latencies.
async fn replicate(
    cluster: &LocalCluster,
    args: &ReplicateBenchArgs,
    size: usize,
    count: usize,
) -> anyhow::Result<(f64, Histogram)> {
    let a = Client::connect(&cluster.socket(0)?).await?;
    let b = Client::connect(&cluster.socket(1)?).await?;
    let namespace = a.register_namespace(demo_namespace()).await?;
    b.register_namespace(demo_namespace()).await?;
    let ids = namespaced(
        seeded_ids(
            &demo_namespace(),
            (count + args.latency_objects) as u64,
            args.seed,
        )?,
        namespace,
    );
    let source = chunk::filled(&ids, size);
    store_all(&a, &ids, &source, size).await?;
    let (bulk, single) = ids.split_at(count);
    let started = Instant::now();
    miss_all(&b, bulk).await?;
    wait_ready(&b, bulk, PROBE_INTERVAL, Pauses::BackOff).await?;
    let seconds = started.elapsed().as_secs_f64();
    let mut destination = chunk::poisoned(bulk, size);
    for (id, buffer) in bulk.iter().zip(destination.chunks_mut(size)) {
        if b.load_into(std::slice::from_ref(id), &mut [buffer]).await? != [true] {
            bail!("node B missed a replicated object");
        }
    }
    if destination[..] != source[..size * count] {
        bail!("node B read replicas that differ from what node A stored");
    }
    let mut latencies = Histogram::default();
    for id in single {
        let started = Instant::now();
        miss_all(&b, std::slice::from_ref(id)).await?;
        let one = std::slice::from_ref(id);
        wait_ready(&b, one, LATENCY_PROBE_INTERVAL, Pauses::Fixed).await?;
        latencies.record(started.elapsed());
    }
    Ok(((size * count) as f64 / seconds / 1e9, latencies))
}

fn namespaced(ids: Vec<ObjectId>, namespace: NamespaceId) -> Vec<ObjectId> {
    ids.into_iter()
        .map(|id| ObjectId { namespace, ..id })
        .collect()
}

/// A stores every object into its CPU pool.
async fn store_all(a: &Client, ids: &[ObjectId], source: &[u8], size: usize) -> anyhow::Result<()> {
    let stored: Vec<_> = stream::iter(ids.iter().zip(source.chunks(size)))
        .map(|(id, bytes)| a.store(*id, bytes))
        .buffer_unordered(STORE_CONCURRENCY)
        .collect()
        .await;
    for outcome in stored {
        let outcome = outcome?;
        if outcome != StoreOutcome::Stored {
            bail!("node A could not store a benchmark object: the store answered {outcome:?}");
        }
    }
    Ok(())
}

/// B loads `ids` once: every one must miss (A holds them where B cannot map them).
async fn miss_all(b: &Client, ids: &[ObjectId]) -> anyhow::Result<()> {
    let views = b.load(ids, AcquireMode::Each).await?;
    if views.iter().any(Option::is_some) {
        bail!("node B hit an object before it was replicated");
    }
    Ok(())
}

/// How [`wait_ready`] paces its probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pauses {
    /// Every `interval` (the latency phase: one copy of about a millisecond).
    Fixed,
    /// Half the shorter of the time waited so far and the time the rest still needs
    /// ([`remaining`]), never less than `interval` (the throughput phase).
    BackOff,
}

/// Probes until every object of `ids` is a hit in CXL for B. Each probe asks only for the
/// first object still waiting (the copies end about in the order they were asked for),
/// and for all of them once it is READY. With [`Pauses::BackOff`] it pauses half the
/// shorter of the time waited so far and the time the rest still needs between probes,
/// never less than `interval`: B's probing runs on the CPUs the copies need. Each probe
/// wakes the bench, node B and the directory, and on a busy machine the kernel shares the
/// CPU between sessions (autogroups), so the CPU those three spend comes out of node A's
/// copies: probing every `interval` through a 1 GiB run cost them 30-50 ms of CPU, a
/// fifth to a quarter of what the whole cluster got (13-16 ms backing off). The pauses
/// shrink to `interval` again as the predicted end nears, so the end is seen about as
/// soon as before; the time waited bounds a pause while the prediction is poor (the
/// first sighting may see one copy of the first few dozen that end together).
async fn wait_ready(
    b: &Client,
    ids: &[ObjectId],
    interval: Duration,
    pauses: Pauses,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let deadline = started + HANG_GUARD;
    let mut waiting: Vec<ObjectId> = ids.to_vec();
    let (mut previous, mut last) = (None, None);
    while let Some(first) = waiting.first() {
        if ready_in_cxl(b.probe(std::slice::from_ref(first)).await?[0])? {
            let probed = b.probe(&waiting).await?;
            let mut still = Vec::with_capacity(waiting.len());
            for (id, outcome) in waiting.iter().zip(probed) {
                if !ready_in_cxl(outcome)? {
                    still.push(*id);
                }
            }
            waiting = still;
            previous = last;
            last = Some(Seen {
                at: started.elapsed(),
                ready: ids.len() - waiting.len(),
            });
            continue;
        }
        let now = Instant::now();
        if now > deadline {
            bail!("{} objects were never replicated", waiting.len());
        }
        let wait = match pauses {
            Pauses::Fixed => interval,
            Pauses::BackOff => {
                let waited = now - started;
                let left = remaining(ids.len(), waited, previous, last).unwrap_or(waited);
                (waited.min(left) / 2).max(interval)
            }
        };
        pause(wait.min(deadline - now)).await;
    }
    Ok(())
}

/// The copies' progress as a probe of every waiting object saw it: when (since the wait
/// began) and how many were READY.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Seen {
    at: Duration,
    ready: usize,
}

/// The time the copies still need, `now` into a wait for `total` of them, at the fastest
/// rate seen (since the wait began, or between the `previous` and the `last` sighting);
/// `None` until a copy was seen READY (or past any time a `Duration` holds), zero past
/// the predicted end. The caller pauses half
/// of it: the copies may speed up to twice that rate and still not end before its probe.
fn remaining(
    total: usize,
    now: Duration,
    previous: Option<Seen>,
    last: Option<Seen>,
) -> Option<Duration> {
    let last = last.filter(|seen| seen.ready > 0 && !seen.at.is_zero())?;
    let since_start = last.ready as f64 / last.at.as_secs_f64();
    let recent = previous
        .and_then(|previous| {
            let seconds = last.at.checked_sub(previous.at)?.as_secs_f64();
            let ready = last.ready.saturating_sub(previous.ready) as f64;
            (seconds > 0.0).then_some(ready / seconds)
        })
        .unwrap_or(0.0);
    let rate = since_start.max(recent);
    let end = last.at.as_secs_f64() + total.saturating_sub(last.ready) as f64 / rate;
    let remaining = end - now.as_secs_f64();
    Duration::try_from_secs_f64(remaining.max(0.0)).ok()
}

/// Waits `interval`: on the runtime's timer, or for a pause below its resolution
/// ([`TIMER_RESOLUTION`]) by sleeping a blocking thread (the runtime's own thread keeps
/// serving the clients' connections meanwhile).
async fn pause(interval: Duration) {
    if interval < TIMER_RESOLUTION {
        // A sleep that cannot fail; a join error would only mean the runtime is stopping.
        let _ = tokio::task::spawn_blocking(move || std::thread::sleep(interval)).await;
    } else {
        tokio::time::sleep(interval).await;
    }
}

/// Whether a probe found the copy READY in the shared pool (`Err`: found elsewhere).
fn ready_in_cxl(outcome: ProbeOutcome) -> anyhow::Result<bool> {
    match outcome {
        ProbeOutcome::Hit {
            medium: Medium::Cxl,
            ..
        } => Ok(true),
        ProbeOutcome::Hit { medium, .. } => {
            bail!("node B found a replica in {medium:?}, not in the shared pool")
        }
        ProbeOutcome::Pending | ProbeOutcome::Miss | ProbeOutcome::OnSsd { .. } => Ok(false),
    }
}

/// What a copy between the two mappings reaches without a cluster around it, GB/s.
struct CopyLimits {
    memcpy_gbps: f64,
    streaming_gbps: f64,
    /// The faster of the two, which the parallel copy uses.
    faster: CopyRoutine,
    parallel_gbps: f64,
}

/// A memcpy, a streaming copy, and the faster of the two cut in `threads` contiguous shares
/// copied at once, one thread each, of `bytes` from
/// the start of a CPU pool made here as node A makes its own (a sealed memory file,
/// pre-faulted) into the start of the CXL pool, mapped here as the nodes map it: the median
/// GB/s of each. Runs after the replicas were verified (it overwrites them).
fn copy_limits(cluster: &LocalCluster, bytes: usize, threads: usize) -> anyhow::Result<CopyLimits> {
    let page_bytes = shared_memory::POOL_PAGE_BYTES_MIN;
    let cpu_bytes = (bytes as u64).next_multiple_of(page_bytes);
    let cpu =
        SharedMemory::create_sealed("kvtier-bench-cpu", cpu_bytes, 1, page_bytes, &mut |_| {})?;
    let pattern: Vec<u8> = (0..cpu_bytes).map(|at| (at % 251) as u8).collect();
    cpu.write_at(0, &pattern)?;
    let pool = cluster
        .config
        .cxl_pools
        .first()
        .context("the cluster has no CXL pool")?;
    let cxl = SharedMemory::open(&pool.path, Some(pool.uuid()?))?;
    let source = cpu.slice(0, bytes as u64)?;
    // A first pass faults both mappings in, as the nodes' mappings are; the median of
    // the next passes is the limit (a loaded machine varies from pass to pass).
    cxl.write_at(0, source)?;
    let median = |copy: &dyn Fn() -> anyhow::Result<()>| -> anyhow::Result<f64> {
        let mut rates = Vec::with_capacity(COPY_PASSES);
        for _ in 0..COPY_PASSES {
            let started = Instant::now();
            copy()?;
            rates.push(bytes as f64 / started.elapsed().as_secs_f64() / 1e9);
        }
        rates.sort_by(f64::total_cmp);
        Ok(rates[COPY_PASSES / 2])
    };
    let memcpy_gbps = median(&|| Ok(cxl.copy_at(CopyRoutine::Memcpy, 0, source)?))?;
    let streaming_gbps = median(&|| Ok(cxl.copy_at(CopyRoutine::Streaming, 0, source)?))?;
    let faster = if streaming_gbps > memcpy_gbps {
        CopyRoutine::Streaming
    } else {
        CopyRoutine::Memcpy
    };
    let share = bytes.div_ceil(threads.max(1));
    let parallel = || -> anyhow::Result<()> {
        std::thread::scope(|scope| {
            let copies: Vec<_> = source
                .chunks(share)
                .enumerate()
                .map(|(index, part)| {
                    let cxl = &cxl;
                    scope.spawn(move || cxl.copy_at(faster, (index * share) as u64, part))
                })
                .collect();
            for copy in copies {
                copy.join()
                    .map_err(|_| anyhow::anyhow!("a copy thread panicked"))??;
            }
            Ok(())
        })
    };
    Ok(CopyLimits {
        memcpy_gbps,
        streaming_gbps,
        faster,
        parallel_gbps: median(&parallel)?,
    })
}

#[cfg(test)]
mod tests {
    use super::{remaining, Seen};
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    /// `pause` is `micros` to the microsecond (the rates are floating point).
    fn about(pause: Option<Duration>, micros: u128) -> bool {
        pause.is_some_and(|pause| pause.as_micros().abs_diff(micros) <= 1)
    }

    #[test]
    fn no_prediction_until_a_copy_is_ready() {
        assert_eq!(remaining(256, 50 * MS, None, None), None);
        let none_ready = Seen {
            at: 40 * MS,
            ready: 0,
        };
        assert_eq!(remaining(256, 50 * MS, None, Some(none_ready)), None);
    }

    #[test]
    fn the_time_the_rest_needs() {
        // 64 of 256 in 40 ms: the rest needs 120 ms more, 110 ms from now.
        let seen = Seen {
            at: 40 * MS,
            ready: 64,
        };
        assert!(about(remaining(256, 50 * MS, None, Some(seen)), 110_000));
    }

    #[test]
    fn takes_the_faster_recent_rate() {
        // 32 in the first 40 ms, then 96 more in 40 ms: 2.4 per ms, 128 left, 53.3 ms.
        let previous = Seen {
            at: 40 * MS,
            ready: 32,
        };
        let last = Seen {
            at: 80 * MS,
            ready: 128,
        };
        let left = remaining(256, 80 * MS, Some(previous), Some(last));
        assert!(about(left, 53_333));
    }

    #[test]
    fn zero_past_the_predicted_end() {
        let seen = Seen {
            at: 100 * MS,
            ready: 128,
        };
        assert_eq!(
            remaining(256, 500 * MS, None, Some(seen)),
            Some(Duration::ZERO)
        );
    }
}
