//! `kvtier bench directory`: batched probes over QUIC with mutual TLS against a directory
//! process on loopback, as a node would send them. The floor is measured in the same run:
//! a round trip that the directory's session actor answers alone, interleaved with the probes.

use crate::launch::{ClusterSpec, LocalCluster, BENCH_PEER};
use crate::workload::histogram::Histogram;
use crate::workload::prefix::seeded_ids;
use anyhow::{bail, Context};
use futures_util::stream::{self, StreamExt};
use kvtier_core::actors::node::link::{DirectoryAddress, DirectoryLink};
use kvtier_core::directory::{CommitOutcome, ReserveItem, ReserveOutcome};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{AllocationId, Generation, Location, Medium, PoolSpec, Scope};
use kvtier_core::protocol::messages::{DirectoryReply, DirectoryRequest, Hello};
use kvtier_core::rng::SplitMix64;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

/// Bytes each stored benchmark object claims (metadata only; nothing is written).
const OBJECT_BYTES: u64 = 256 << 10;

/// Options of the run over QUIC (part of `kvtier bench directory`'s).
#[derive(Clone, Debug, clap::Args)]
pub struct QuicBenchArgs {
    /// Batch sizes of the probes over QUIC.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    pub batches: Vec<usize>,
    /// Objects stored before probing over QUIC.
    #[arg(long, default_value_t = 20_000)]
    pub stored_objects: u64,
    /// Sequential round trips per batch size (latency).
    #[arg(long, default_value_t = 3000)]
    pub round_trips: u32,
    /// Requests in flight at once in the throughput phase.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Keys probed per batch size in the throughput phase.
    #[arg(long, default_value_t = 400_000)]
    pub throughput_keys: u64,
}

/// Figures for one batch size, each beside its floor measured in the same phase.
#[derive(Clone, Debug, Serialize)]
pub struct BatchReport {
    pub batch: usize,
    /// Keys probed per second with `concurrency` requests in flight.
    pub keys_per_s: f64,
    /// Probe requests per second in that phase.
    pub requests_per_s: f64,
    /// Floor round trips per second with as many in flight, measured just before.
    pub floor_requests_per_s: f64,
    /// Sequential round-trip latency of one probe request.
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// p50 of the floor round trips interleaved one for one with the probes above.
    pub floor_p50_us: f64,
}

/// Chunks in the prefix `Locate` is timed on: a 64-chunk prompt prefix, as a router asks.
pub const LOCATE_KEYS: usize = 64;

/// `Locate` of a [`LOCATE_KEYS`]-chunk prefix the peer holds whole (the longest walk),
/// interleaved one for one with single-key probes.
#[derive(Clone, Debug, Serialize)]
pub struct LocateReport {
    pub keys: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    /// p50 of the single-key probes interleaved with the locates.
    pub probe_p50_us: f64,
    /// `p50_us` over `probe_p50_us` (target: at most 2).
    pub p50_over_probe: f64,
}

/// The benchmark's output.
#[derive(Clone, Debug, Serialize)]
pub struct QuicReport {
    /// p50 of all floor round trips (transport + framing, answered by the session actor).
    pub floor_p50_us: f64,
    pub batches: Vec<BatchReport>,
    pub locate: LocateReport,
    /// Probes and acquires the node answers under its delegations.
    pub local_hits: super::local_hits::LocalHitReport,
}

/// Starts a local cluster, connects as the benchmark peer and measures; `seed` draws the
/// object ids and the probe order.
pub fn run(exe: &std::path::Path, args: &QuicBenchArgs, seed: u64) -> anyhow::Result<QuicReport> {
    let cluster = LocalCluster::start(
        exe,
        &ClusterSpec {
            nodes: 1,
            metrics: false,
            ..ClusterSpec::default()
        },
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(measure(&cluster, args, seed))
}

async fn measure(
    cluster: &LocalCluster,
    args: &QuicBenchArgs,
    seed: u64,
) -> anyhow::Result<QuicReport> {
    let target = DirectoryAddress {
        addresses: vec![cluster.config.directory.listen],
        server_name: cluster.config.directory.name.clone(),
        certs: cluster.config.directory.certs.clone(),
        node_name: BENCH_PEER.into(),
        bind: "127.0.0.1:0".parse()?,
        // The directory's own round trip is measured: the bench's link sleeps as it waits.
        busy_poll_tail: std::time::Duration::ZERO,
    };
    let link = Arc::new(
        DirectoryLink::open(
            target,
            vec![Medium::Cpu],
            vec![Medium::Cpu],
            Default::default(),
        )
        .await?,
    );
    // Heartbeat as a node does, so a long phase never gets the session fenced.
    let heartbeats = AbortOnDrop(tokio::spawn(keep_alive(link.clone())));
    let pool_spec = PoolSpec {
        name: "bench-cpu".into(),
        medium: Medium::Cpu,
        scope: Scope::Host(link.binding().node),
        // Twice what is stored: under any high watermark, so nothing stored is evicted and
        // every probe of a stored object is a hit.
        capacity_bytes: 2 * (args.stored_objects + 1) * OBJECT_BYTES,
        page_bytes: 4096,
        extent_bytes: None,
        tenancy: kvtier_core::model::PoolTenancy::Shared,
    };
    let DirectoryReply::Pool(pool) = link.call(DirectoryRequest::RegisterPool(pool_spec)).await?
    else {
        bail!("pool registration failed");
    };
    let DirectoryReply::Namespace(_) = link
        .call(DirectoryRequest::RegisterNamespace(demo_namespace()))
        .await?
    else {
        bail!("namespace registration failed");
    };
    let ids = seeded_ids(&demo_namespace(), args.stored_objects, seed)?;
    store_objects(&link, pool, &ids, args.concurrency).await?;
    let mut rng = SplitMix64::new(seed ^ 0xbeef);
    let mut floor = Histogram::default();
    let mut batches = Vec::new();
    for &batch in &args.batches {
        let report = measure_batch(&link, args, &ids, batch.max(1), &mut rng, &mut floor).await?;
        batches.push(report);
    }
    let locate = measure_locate(&link, args, &ids, &mut rng).await?;
    drop(heartbeats);
    let local_hits =
        super::local_hits::measure(cluster, args.round_trips, args.concurrency, seed).await?;
    Ok(QuicReport {
        local_hits,
        floor_p50_us: floor.quantile(0.5).as_secs_f64() * 1e6,
        batches,
        locate,
    })
}

/// Sequential `Locate`s of the first [`LOCATE_KEYS`] stored objects (every one a hit in
/// the peer's pool, so the directory walks the whole prefix), each after a single-key probe.
async fn measure_locate(
    link: &DirectoryLink,
    args: &QuicBenchArgs,
    ids: &[kvtier_core::model::ObjectId],
    rng: &mut SplitMix64,
) -> anyhow::Result<LocateReport> {
    let prefix: Vec<kvtier_core::model::ObjectId> = ids.iter().take(LOCATE_KEYS).copied().collect();
    let (mut located, mut probed) = (Histogram::default(), Histogram::default());
    for _ in 0..args.round_trips {
        let one = vec![ids[rng.below(ids.len() as u64) as usize]];
        let started = Instant::now();
        link.call(DirectoryRequest::Probe { objects: one }).await?;
        probed.record(started.elapsed());
        let started = Instant::now();
        let reply = link
            .call(DirectoryRequest::Locate {
                objects: prefix.clone(),
            })
            .await?;
        located.record(started.elapsed());
        match reply {
            DirectoryReply::Located(runs)
                if runs.first().map(|run| run.chunks as usize) == Some(prefix.len()) => {}
            other => bail!("locate answered {other:?}"),
        }
    }
    let p50_us = located.quantile(0.5).as_secs_f64() * 1e6;
    let probe_p50_us = probed.quantile(0.5).as_secs_f64() * 1e6;
    Ok(LocateReport {
        keys: prefix.len(),
        p50_us,
        p99_us: located.quantile(0.99).as_secs_f64() * 1e6,
        probe_p50_us,
        p50_over_probe: p50_us / probe_p50_us.max(1e-9),
    })
}

/// Reserves and commits every object through the link, `concurrency` at a time, then
/// acknowledges them all.
async fn store_objects(
    link: &Arc<DirectoryLink>,
    pool: kvtier_core::model::PoolId,
    ids: &[kvtier_core::model::ObjectId],
    concurrency: usize,
) -> anyhow::Result<()> {
    let stores = stream::iter(ids.iter().enumerate()).map(|(index, object)| {
        let link = link.clone();
        async move {
            let (session, reserved) = link
                .reserve(ReserveItem {
                    object: *object,
                    length_bytes: OBJECT_BYTES,
                })
                .await;
            let ReserveOutcome::Granted { replica, .. } = reserved? else {
                bail!("reserve not granted");
            };
            let location = Location {
                pool,
                allocation: AllocationId(index as u64),
                generation: Generation(1),
                offset_bytes: index as u64 * OBJECT_BYTES,
                length_bytes: OBJECT_BYTES,
            };
            match link.commit(session, replica, location).await? {
                Some(CommitOutcome::Committed) => Ok(()),
                other => bail!("commit answered {other:?}"),
            }
        }
    });
    let results: Vec<anyhow::Result<()>> = stores.buffer_unordered(concurrency).collect().await;
    results
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()
        .context("storing the benchmark objects")?;
    let _ = link
        .call(DirectoryRequest::Heartbeat {
            acknowledged_through: link.acknowledged_through(),
        })
        .await;

    Ok(())
}

/// Aborts a background task when the measurement ends, however it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends a heartbeat (with the acknowledgement window) at the period the directory asked for.
async fn keep_alive(link: Arc<DirectoryLink>) {
    let mut period = tokio::time::interval(link.binding().heartbeat_interval);
    loop {
        period.tick().await;
        if let Err(error) = link
            .heartbeat(
                link.acknowledged_through(),
                link.binding().heartbeat_interval,
            )
            .await
        {
            tracing::warn!(%error, "benchmark heartbeat failed");
        }
    }
}

/// A round trip the directory's session actor answers alone (a repeated hello, refused
/// without reaching the directory actor): the least the stack can do.
async fn floor_round_trip(link: &DirectoryLink) {
    let _ = link.call(DirectoryRequest::Hello(Hello::ours())).await;
}

/// One batch size: sequential probes interleaved one for one with floor round trips, then
/// the floor's throughput and the probes' throughput with `concurrency` in flight.
async fn measure_batch(
    link: &Arc<DirectoryLink>,
    args: &QuicBenchArgs,
    ids: &[kvtier_core::model::ObjectId],
    batch: usize,
    rng: &mut SplitMix64,
    all_floor: &mut Histogram,
) -> anyhow::Result<BatchReport> {
    let draw = |rng: &mut SplitMix64| -> Vec<kvtier_core::model::ObjectId> {
        (0..batch)
            .map(|_| ids[rng.below(ids.len() as u64) as usize])
            .collect()
    };
    let (mut latency, mut floor) = (Histogram::default(), Histogram::default());
    for _ in 0..args.round_trips {
        let started = Instant::now();
        floor_round_trip(link).await;
        floor.record(started.elapsed());
        all_floor.record(started.elapsed());
        let objects = draw(rng);
        let started = Instant::now();
        link.call(DirectoryRequest::Probe { objects }).await?;
        latency.record(started.elapsed());
    }
    let requests = (args.throughput_keys / batch as u64).max(1);
    let started = Instant::now();
    stream::iter(0..requests)
        .for_each_concurrent(args.concurrency, |_| floor_round_trip(link))
        .await;
    let floor_requests_per_s = requests as f64 / started.elapsed().as_secs_f64();
    let probes: Vec<Vec<kvtier_core::model::ObjectId>> = (0..requests).map(|_| draw(rng)).collect();
    let started = Instant::now();
    let replies: Vec<anyhow::Result<()>> = stream::iter(probes)
        .map(|objects| {
            let link = link.clone();
            async move {
                match link.call(DirectoryRequest::Probe { objects }).await? {
                    DirectoryReply::Probed(_) => Ok(()),
                    other => bail!("probe answered {other:?}"),
                }
            }
        })
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    replies.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let requests_per_s = requests as f64 / started.elapsed().as_secs_f64();
    Ok(BatchReport {
        batch,
        keys_per_s: requests_per_s * batch as f64,
        requests_per_s,
        floor_requests_per_s,
        p50_us: latency.quantile(0.5).as_secs_f64() * 1e6,
        p99_us: latency.quantile(0.99).as_secs_f64() * 1e6,
        max_us: latency.max().as_secs_f64() * 1e6,
        floor_p50_us: floor.quantile(0.5).as_secs_f64() * 1e6,
    })
}

/// Prints the report as a table.
pub fn print(report: &QuicReport) {
    println!(
        "{:>6} {:>12} {:>10} {:>10} {:>10} {:>12} {:>12} {:>14}",
        "batch", "keys/s", "p50 us", "p99 us", "floor p50", "p50/floor", "req/s", "req/s / floor"
    );
    for batch in &report.batches {
        println!(
            "{:>6} {:>12.0} {:>10.1} {:>10.1} {:>10.1} {:>12.2} {:>12.0} {:>14.2}",
            batch.batch,
            batch.keys_per_s,
            batch.p50_us,
            batch.p99_us,
            batch.floor_p50_us,
            batch.p50_us / batch.floor_p50_us.max(1e-9),
            batch.requests_per_s,
            batch.requests_per_s / batch.floor_requests_per_s.max(1e-9)
        );
    }
    let locate = &report.locate;
    println!(
        "locate of a {}-chunk prefix: p50 {:.1} us (p99 {:.1}), {:.2} x a single-key probe's \
         p50 {:.1} us interleaved with it",
        locate.keys, locate.p50_us, locate.p99_us, locate.p50_over_probe, locate.probe_p50_us
    );
    let local = &report.local_hits;
    println!(
        "local hits (node's delegated index, over its socket): probe+acquire p50 {:.1} us \
         (p99 {:.1}; {:.2} x the QUIC floor p50 {:.1} us); from an engine's own thread \
         (kvtier::block_on) p50 {:.1} us (p99 {:.1}; {:.2} x the floor); acquire alone p50 \
         {:.1} us, {:.0}% local; batch-64 probes {:.0} keys/s over the socket, {:.0} keys/s in the index \
         ({:.0} keys/s for the same batches in a DashMap of the same keys)",
        local.probe_acquire_p50_us,
        local.probe_acquire_p99_us,
        local.probe_acquire_p50_us / report.floor_p50_us.max(1e-9),
        report.floor_p50_us,
        local.probe_acquire_blocking_p50_us,
        local.probe_acquire_blocking_p99_us,
        local.probe_acquire_blocking_p50_us / report.floor_p50_us.max(1e-9),
        local.acquire_p50_us,
        local.local_fraction * 100.0,
        local.socket_batch64_keys_per_s,
        local.index_batch64_keys_per_s,
        local.dashmap_batch64_keys_per_s,
    );
    println!(
        "floor: a round trip the session actor answers alone (a repeated hello), interleaved \
         one for one with the probes; throughput floor: as many of them in flight (same run)"
    );
}
