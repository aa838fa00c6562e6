//! `kvtier bench data`: store and load of KV chunks through the client into a node's CPU
//! pool (a real node process, real Unix socket, real directory over QUIC), against a memcpy
//! of the same sizes into pre-faulted memory measured in the same run.

use crate::client::{Client, StoreOutcome};
use crate::launch::{ClusterSpec, LocalCluster};
use crate::model::ObjectId;
use crate::progress::{Progress, Unit};
use crate::workload::chunk;
use crate::workload::namespace::demo_namespace;
use crate::workload::prefix::seeded_ids;
use anyhow::bail;
use futures_util::stream::{self, StreamExt};
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// Options of `kvtier bench data`.
#[derive(Clone, Debug, clap::Args)]
pub struct DataBenchArgs {
    /// Chunk sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "262144,4194304")]
    pub sizes: Vec<usize>,
    /// Bytes stored (then loaded) per chunk size.
    #[arg(long, default_value_t = 512 << 20)]
    pub bytes_per_size: usize,
    /// Stores or loads in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Seed of the object ids.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Figures for one chunk size.
#[derive(Clone, Debug, Serialize)]
pub struct ChunkReport {
    pub size: usize,
    pub store_gbps: f64,
    pub load_gbps: f64,
    pub memcpy_gbps: f64,
    pub store_ratio: f64,
    pub load_ratio: f64,
}

/// The benchmark's output.
#[derive(Clone, Debug, Serialize)]
pub struct DataReport {
    pub chunks: Vec<ChunkReport>,
}

/// Starts a one-node cluster with a pool large enough for every size's bytes and measures.
pub fn run(exe: &std::path::Path, args: &DataBenchArgs) -> anyhow::Result<()> {
    let pool_bytes =
        (args.bytes_per_size as u64 * args.sizes.len() as u64 * 5 / 4).next_multiple_of(64 << 10);
    let cluster = LocalCluster::start(
        exe,
        &ClusterSpec {
            nodes: 1,
            cpu_pool_bytes: pool_bytes,
            metrics: false,
            ..ClusterSpec::default()
        },
    )?;
    // The client on two threads, as an engine's connector runs it: replies are handled
    // while another chunk is copied.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let client = runtime.block_on(Client::connect(&cluster.socket(0)?))?;
    let namespace = runtime.block_on(client.register_namespace(demo_namespace()))?;
    let mut chunks = Vec::new();
    let bar = Progress::bar(
        "data: sizes",
        args.sizes.len() as u64,
        Unit::Items,
        args.json,
    );
    for (round, &size) in args.sizes.iter().enumerate() {
        bar.set(round as u64);
        bar.message(format!("{size}-byte chunks"));
        let count = (args.bytes_per_size / size.max(1)).max(1);
        let mut ids = seeded_ids(&demo_namespace(), count as u64, args.seed + round as u64)?;
        for id in &mut ids {
            id.namespace = namespace;
        }
        let source = chunk::filled(&ids, size);
        let memcpy_gbps = measure_memcpy(&source, size);
        let (store_gbps, load_gbps) = runtime.block_on(measure_client(
            &client,
            &ids,
            &source,
            size,
            args.concurrency,
        ))?;
        chunks.push(ChunkReport {
            size,
            store_gbps,
            load_gbps,
            memcpy_gbps,
            store_ratio: store_gbps / memcpy_gbps,
            load_ratio: load_gbps / memcpy_gbps,
        });
    }
    bar.finish();
    drop(client);
    drop(cluster);
    let report = DataReport { chunks };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{:>10} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "chunk", "store GB/s", "load GB/s", "memcpy GB/s", "store/memcpy", "load/memcpy"
        );
        for chunk in &report.chunks {
            println!(
                "{:>10} {:>12.2} {:>12.2} {:>12.2} {:>12.2} {:>12.2}",
                chunk.size,
                chunk.store_gbps,
                chunk.load_gbps,
                chunk.memcpy_gbps,
                chunk.store_ratio,
                chunk.load_ratio
            );
        }
        println!(
            "memcpy: the same number of distinct chunks between pre-faulted areas larger than the caches, same run; every loaded byte compared"
        );
    }
    Ok(())
}

/// Copies `count` distinct chunks of `size` bytes between two pre-faulted areas larger
/// than the caches: what moving that many chunks costs at best on this machine.
fn measure_memcpy(source: &[u8], size: usize) -> f64 {
    let mut destination = vec![1u8; source.len()];
    let started = Instant::now();
    for (target, chunk) in destination.chunks_mut(size).zip(source.chunks(size)) {
        target.copy_from_slice(chunk);
    }
    black_box(&destination);
    source.len() as f64 / started.elapsed().as_secs_f64() / 1e9
}

async fn measure_client(
    client: &Client,
    ids: &[ObjectId],
    source: &[u8],
    size: usize,
    concurrency: usize,
) -> anyhow::Result<(f64, f64)> {
    let started = Instant::now();
    let stored: Vec<_> = stream::iter(ids.iter().zip(source.chunks(size)))
        .map(|(id, chunk)| client.store(*id, chunk))
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let store_seconds = started.elapsed().as_secs_f64();
    for outcome in stored {
        if outcome? != StoreOutcome::Stored {
            bail!("a benchmark chunk was not stored (pool too small?)");
        }
    }
    let mut destination = chunk::poisoned(ids, size);
    let started = Instant::now();
    let loads: Vec<_> = stream::iter(ids.iter().zip(destination.chunks_mut(size)))
        .map(|(id, buffer)| async move {
            let mut targets = [buffer];
            client
                .load_into(std::slice::from_ref(id), &mut targets)
                .await
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let load_seconds = started.elapsed().as_secs_f64();
    for hits in loads {
        if hits? != [true] {
            bail!("a stored benchmark chunk missed on load");
        }
    }
    if destination != source {
        bail!("loaded bytes differ from the stored ones");
    }
    let bytes = (size * ids.len()) as f64;
    Ok((bytes / store_seconds / 1e9, bytes / load_seconds / 1e9))
}
