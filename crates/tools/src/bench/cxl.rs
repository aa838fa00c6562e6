//! `kvtier bench cxl`: node B loading 4 MiB objects that node A stored in a shared CXL pool
//! (an emulated device: one file both node processes map), against a memcpy out of the same
//! mapping measured in the same run; then a capacity-pressure run that keeps storing past
//! the pool's capacity with eviction on, and reports that no store failed.

use crate::launch::{metric_value, scrape_metrics, ClusterSpec, LocalCluster};
use crate::workload::chunk;
use crate::workload::prefix::seeded_ids;
use anyhow::{bail, Context};
use futures_util::stream::{self, StreamExt};
use kvtier_core::backends::SharedMemory;
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::ProbeOutcome;
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, ObjectId};
use kvtier_core::progress::Progress;
use serde::Serialize;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

/// Options of `kvtier bench cxl`.
#[derive(Clone, Debug, clap::Args)]
pub struct CxlBenchArgs {
    /// Object size of the load phase, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub object_bytes: usize,
    /// Bytes A stores and B loads in the load phase.
    #[arg(long, default_value_t = 512 << 20)]
    pub load_bytes: usize,
    /// CXL pool size of the pressure phase, in bytes.
    #[arg(long, default_value_t = 256 << 20)]
    pub pressure_pool_bytes: u64,
    /// Object size of the pressure phase, in bytes.
    #[arg(long, default_value_t = 256 << 10)]
    pub pressure_object_bytes: usize,
    /// How many times the pool's capacity the pressure phase stores.
    #[arg(long, default_value_t = 4)]
    pub pressure_factor: u64,
    /// Loads or stores in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 11)]
    pub seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The pressure phase's counts.
#[derive(Clone, Debug, Serialize)]
pub struct PressureReport {
    pub stores: u64,
    pub failed_stores: u64,
    pub skipped_stores: u64,
    pub evictions: u64,
    /// Fraction of the stored objects still hits for the other node at the end.
    pub hit_ratio: f64,
}

/// The benchmark's output.
#[derive(Clone, Debug, Serialize)]
pub struct CxlReport {
    pub load_gbps: f64,
    pub memcpy_gbps: f64,
    pub ratio: f64,
    pub pressure: PressureReport,
}

/// Runs both phases and prints the report.
pub fn run(exe: &Path, args: &CxlBenchArgs) -> anyhow::Result<()> {
    let phase = Progress::phase("cxl: load phase", args.json);
    let (load_gbps, memcpy_gbps) = load_phase(exe, args)?;
    drop(phase);
    let phase = Progress::phase("cxl: pressure phase", args.json);
    let pressure = pressure_phase(exe, args)?;
    drop(phase);
    let report = CxlReport {
        load_gbps,
        memcpy_gbps,
        ratio: load_gbps / memcpy_gbps,
        pressure,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!("load from CXL on node B: {:.2} GB/s, memcpy out of the same mapping {:.2} GB/s, ratio {:.2}", report.load_gbps, report.memcpy_gbps, report.ratio);
        let pressure = &report.pressure;
        println!(
            "pressure: {} stores ({} failed, {} skipped), {} evictions, hit ratio {:.3} at the end",
            pressure.stores,
            pressure.failed_stores,
            pressure.skipped_stores,
            pressure.evictions,
            pressure.hit_ratio
        );
    }
    Ok(())
}

fn two_nodes(exe: &Path, cxl_pool_bytes: u64, eviction: bool) -> anyhow::Result<LocalCluster> {
    let (high, low) = if eviction { (90, 70) } else { (100, 100) };
    let spec = ClusterSpec {
        nodes: 2,
        cpu_pool_bytes: 64 << 20,
        cxl_pool_bytes,
        cxl_extent_bytes: 16 << 20,
        write_order: vec![Medium::Cxl],
        high_watermark_percent: high,
        low_watermark_percent: low,
        ..ClusterSpec::default()
    };
    Ok(LocalCluster::start(exe, &spec)?)
}

fn namespaced(ids: Vec<ObjectId>, namespace: kvtier_core::model::NamespaceId) -> Vec<ObjectId> {
    ids.into_iter()
        .map(|id| ObjectId { namespace, ..id })
        .collect()
}

fn load_phase(exe: &Path, args: &CxlBenchArgs) -> anyhow::Result<(f64, f64)> {
    let size = args.object_bytes.max(4096);
    let count = (args.load_bytes / size).max(1);
    let pool_bytes = ((size * count) as u64 * 5 / 4).next_multiple_of(16 << 20);
    let cluster = two_nodes(exe, pool_bytes, false)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (load_gbps, _) = runtime.block_on(async {
        let writer = Client::connect(&cluster.socket(0)?).await?;
        let reader = Client::connect(&cluster.socket(1)?).await?;
        let namespace = writer.register_namespace(demo_namespace()).await?;
        // Every connection registers the namespaces it uses (its tenant's salt applies).
        reader.register_namespace(demo_namespace()).await?;
        let ids = namespaced(
            seeded_ids(&demo_namespace(), count as u64, args.seed)?,
            namespace,
        );
        let source = chunk::filled(&ids, size);
        let stored: Vec<_> = stream::iter(ids.iter().zip(source.chunks(size)))
            .map(|(id, chunk)| writer.store(*id, chunk))
            .buffer_unordered(args.concurrency)
            .collect()
            .await;
        for outcome in stored {
            let outcome = outcome?;
            if outcome != StoreOutcome::Stored {
                bail!("node A could not store a benchmark object in CXL: the store answered {outcome:?}");
            }
        }
        let mut destination = chunk::poisoned(&ids, size);
        let started = Instant::now();
        let loads: Vec<_> = stream::iter(ids.iter().zip(destination.chunks_mut(size)))
            .map(|(id, buffer)| {
                let reader = &reader;
                async move {
                    reader
                        .load_into(std::slice::from_ref(id), &mut [buffer])
                        .await
                }
            })
            .buffer_unordered(args.concurrency)
            .collect()
            .await;
        let seconds = started.elapsed().as_secs_f64();
        for hits in loads {
            if hits? != [true] {
                bail!("node B missed an object node A stored in CXL");
            }
        }
        if destination != source {
            bail!("node B loaded bytes that differ from what node A stored");
        }
        Ok(((size * count) as f64 / seconds / 1e9, ()))
    })?;
    let pool = cluster
        .config
        .cxl_pools
        .first()
        .context("the cluster has no CXL pool")?;
    let mapping = SharedMemory::open(&pool.path, Some(pool.uuid()?))?;
    let mut destination = vec![1u8; size * count];
    let started = Instant::now();
    for (index, target) in destination.chunks_mut(size).enumerate() {
        target.copy_from_slice(mapping.slice((index * size) as u64, size as u64)?);
    }
    black_box(&destination);
    let memcpy_gbps = (size * count) as f64 / started.elapsed().as_secs_f64() / 1e9;
    Ok((load_gbps, memcpy_gbps))
}

fn pressure_phase(exe: &Path, args: &CxlBenchArgs) -> anyhow::Result<PressureReport> {
    let size = args.pressure_object_bytes.max(4096);
    let cluster = two_nodes(exe, args.pressure_pool_bytes, true)?;
    let count = (args.pressure_pool_bytes * args.pressure_factor) / size as u64;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut report, ids) = runtime.block_on(async {
        let writer = Client::connect(&cluster.socket(0)?).await?;
        let namespace = writer.register_namespace(demo_namespace()).await?;
        let ids = namespaced(
            seeded_ids(&demo_namespace(), count, args.seed ^ 0x9e55)?,
            namespace,
        );
        let chunk = vec![0x3cu8; size];
        let mut report = PressureReport {
            stores: 0,
            failed_stores: 0,
            skipped_stores: 0,
            evictions: 0,
            hit_ratio: 0.0,
        };
        let outcomes: Vec<_> = stream::iter(&ids)
            .map(|id| writer.store(*id, &chunk))
            .buffered(args.concurrency)
            .collect()
            .await;
        for outcome in outcomes {
            report.stores += 1;
            match outcome {
                Ok(StoreOutcome::Stored | StoreOutcome::AlreadyPresent | StoreOutcome::Pending) => {
                }
                Ok(StoreOutcome::Skipped(_)) => report.skipped_stores += 1,
                Err(_) => report.failed_stores += 1,
            }
        }
        anyhow::Ok((report, ids))
    })?;
    // What the other node still finds right after the last store.
    report.hit_ratio = runtime.block_on(async {
        let reader = Client::connect(&cluster.socket(1)?).await?;
        reader.register_namespace(demo_namespace()).await?;
        let mut hits = 0usize;
        for batch in ids.chunks(1024) {
            hits += reader
                .probe(batch)
                .await?
                .iter()
                .filter(|outcome| matches!(outcome, ProbeOutcome::Hit { .. }))
                .count();
        }
        anyhow::Ok(hits as f64 / ids.len().max(1) as f64)
    })?;
    let address = cluster
        .config
        .directory
        .metrics
        .context("the cluster serves no metrics")?;
    report.evictions =
        metric_value(&scrape_metrics(address)?, "kvtier_evictions_total").unwrap_or(0.0) as u64;
    Ok(report)
}
