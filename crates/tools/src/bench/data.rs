//! `kvtier bench data`: store and load of KV chunks through the client into a node's CPU
//! pool (a real node process, real Unix socket, real directory over QUIC), against a memcpy
//! of the same chunks between the same buffers measured in the same run. Each call stores or
//! loads a batch of chunks, as an engine stores or loads a prefix; each round pairs a memcpy
//! pass with a client pass back to back (which goes first alternates), and the ratios are
//! the median over rounds of each round's client pass over its memcpy pass.

use super::full_cache::FullCacheReport;
use crate::launch::{ClusterSpec, LocalCluster};
use crate::workload::chunk;
use crate::workload::prefix::seeded_ids;
use anyhow::bail;
use futures_util::stream::{self, StreamExt};
use kvtier_core::backends::copy::{routines, Routines};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::ObjectId;
use kvtier_core::progress::{Progress, Unit};
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// Options of `kvtier bench data`.
#[derive(Clone, Debug, clap::Args)]
pub struct DataBenchArgs {
    /// Chunk sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "262144,4194304")]
    pub sizes: Vec<usize>,
    /// Bytes stored (then loaded) per chunk size and round.
    #[arg(long, default_value_t = 256 << 20)]
    pub bytes_per_round: usize,
    /// Rounds per chunk size (each stores its own chunks).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Chunks per `store_many` and `load_into` call.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
    /// Seed of the object ids.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Objects of 4 KiB the full-cache row stores while every store evicts (0: no row).
    #[arg(long, default_value_t = 100_000)]
    pub full_cache_objects: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Figures for one chunk size: GB/s are medians over rounds, ratios the median over rounds
/// of each round's client pass over its memcpy pass.
#[derive(Clone, Debug, Serialize)]
pub struct ChunkReport {
    pub size: usize,
    pub batch: usize,
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
    /// Stores into a full cache against the same into an empty one (see
    /// [`super::full_cache`]); `None` with `--full-cache-objects 0`.
    pub full_cache: Option<FullCacheReport>,
    /// The copy routines the client ran (see `kvtier_core::backends::copy`).
    pub copy_routines: Routines,
}

/// Starts a one-node cluster with a pool large enough for every round's chunks and measures.
pub fn run(exe: &std::path::Path, args: &DataBenchArgs) -> anyhow::Result<()> {
    let rounds = args.rounds.max(1);
    let pool_bytes = (args.bytes_per_round as u64 * (rounds * args.sizes.len()) as u64 * 5 / 4)
        .next_multiple_of(64 << 10);
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
    let bar = Progress::bar(
        "data: rounds",
        (args.sizes.len() * rounds) as u64,
        Unit::Items,
        args.json,
    );
    let mut chunks = Vec::new();
    for (index, &size) in args.sizes.iter().enumerate() {
        let mut passes = Vec::with_capacity(rounds);
        for round in 0..rounds {
            bar.set((index * rounds + round) as u64);
            bar.message(format!("{size}-byte chunks, round {}", round + 1));
            let seed = args.seed + (index * rounds + round) as u64;
            let count = (args.bytes_per_round / size.max(1)).max(1);
            let mut ids = seeded_ids(&demo_namespace(), count as u64, seed)?;
            for id in &mut ids {
                id.namespace = namespace;
            }
            let calls = Calls {
                client: &client,
                batch: args.batch.max(1),
                concurrency: args.concurrency.max(1),
            };
            passes.push(runtime.block_on(calls.round(&ids, size, round % 2 == 0))?);
        }
        chunks.push(ChunkReport::of(size, args.batch.max(1), &passes));
    }
    bar.finish();
    drop(client);
    drop(cluster);
    let full_cache = match args.full_cache_objects {
        0 => None,
        objects => Some(super::full_cache::measure(exe, objects)?),
    };
    let report = DataReport {
        chunks,
        full_cache,
        copy_routines: routines().clone(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(report: &DataReport) {
    println!(
        "{:>10} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "chunk", "batch", "store GB/s", "load GB/s", "memcpy GB/s", "store/memcpy", "load/memcpy"
    );
    for chunk in &report.chunks {
        println!(
            "{:>10} {:>6} {:>12.2} {:>12.2} {:>12.2} {:>12.2} {:>12.2}",
            chunk.size,
            chunk.batch,
            chunk.store_gbps,
            chunk.load_gbps,
            chunk.memcpy_gbps,
            chunk.store_ratio,
            chunk.load_ratio
        );
    }
    if let Some(full) = &report.full_cache {
        println!(
            "full cache: {}-byte objects into a {} MiB pool, 32 a call: {:.0} stored/s while every store evicts, {:.0} while empty ({:.2} of it; {:.1} % skipped); directory CPU {:.2} us per stored object ({:.2} while empty)",
            full.object_bytes,
            full.pool_bytes >> 20,
            full.full_stored_per_s,
            full.empty_stored_per_s,
            full.ratio,
            full.full_skipped_share * 100.0,
            full.full_directory_cpu_us_per_object,
            full.empty_directory_cpu_us_per_object,
        );
    }
    let routines = &report.copy_routines;
    println!(
        "copy routines: store {}, load {}; memcpy: the same chunks between the same pre-faulted buffers, larger than the caches, each round beside its client pass; every loaded byte compared",
        routines.store.name(),
        routines.load.name()
    );
}

/// One round's GB/s: the store and load passes, each with the memcpy pass run beside it.
struct RoundPasses {
    store_gbps: f64,
    store_memcpy_gbps: f64,
    load_gbps: f64,
    load_memcpy_gbps: f64,
}

impl ChunkReport {
    fn of(size: usize, batch: usize, passes: &[RoundPasses]) -> ChunkReport {
        let median_of = |value: fn(&RoundPasses) -> f64| median(passes.iter().map(value).collect());
        let memcpy = median(
            passes
                .iter()
                .flat_map(|pass| [pass.store_memcpy_gbps, pass.load_memcpy_gbps])
                .collect(),
        );
        ChunkReport {
            size,
            batch,
            store_gbps: median_of(|pass| pass.store_gbps),
            load_gbps: median_of(|pass| pass.load_gbps),
            memcpy_gbps: memcpy,
            store_ratio: median_of(|pass| pass.store_gbps / pass.store_memcpy_gbps),
            load_ratio: median_of(|pass| pass.load_gbps / pass.load_memcpy_gbps),
        }
    }
}

/// The median (the upper middle one of an even count); 0 for none.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// How the client is called: `batch` chunks a call, `concurrency` calls in flight.
struct Calls<'a> {
    client: &'a Client,
    batch: usize,
    concurrency: usize,
}

impl Calls<'_> {
    /// Stores `ids` (fresh chunks of `size` bytes), then loads them into a poisoned buffer
    /// and compares every byte; a memcpy pass of the same chunks between the same buffers
    /// goes right before each client pass (`memcpy_first`) or right after.
    async fn round(
        &self,
        ids: &[ObjectId],
        size: usize,
        memcpy_first: bool,
    ) -> anyhow::Result<RoundPasses> {
        let source = chunk::filled(ids, size);
        // The memcpy passes' destination, written (so faulted in) before any pass.
        let mut destination = chunk::poisoned(ids, size);
        let (store_gbps, store_memcpy_gbps) = paired(
            memcpy_first,
            || memcpy_pass(&source, &mut destination, size),
            || self.store_pass(ids, &source, size),
        )
        .await?;
        let mut loaded = chunk::poisoned(ids, size);
        let (load_gbps, load_memcpy_gbps) = paired(
            !memcpy_first,
            || memcpy_pass(&source, &mut destination, size),
            || self.load_pass(ids, &mut loaded, size),
        )
        .await?;
        if loaded != source {
            bail!("loaded bytes differ from the stored ones");
        }
        Ok(RoundPasses {
            store_gbps,
            store_memcpy_gbps,
            load_gbps,
            load_memcpy_gbps,
        })
    }

    async fn store_pass(
        &self,
        ids: &[ObjectId],
        source: &[u8],
        size: usize,
    ) -> anyhow::Result<f64> {
        let items: Vec<(ObjectId, &[u8])> = ids.iter().copied().zip(source.chunks(size)).collect();
        let started = Instant::now();
        let stored: Vec<_> = stream::iter(items.chunks(self.batch))
            .map(|batch| self.client.store_many(batch))
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        let seconds = started.elapsed().as_secs_f64();
        for outcome in stored.into_iter().flatten() {
            if outcome? != StoreOutcome::Stored {
                bail!("a benchmark chunk was not stored (pool too small?)");
            }
        }
        Ok(source.len() as f64 / seconds / 1e9)
    }

    async fn load_pass(
        &self,
        ids: &[ObjectId],
        destination: &mut [u8],
        size: usize,
    ) -> anyhow::Result<f64> {
        let bytes = destination.len();
        let mut targets: Vec<&mut [u8]> = destination.chunks_mut(size).collect();
        let started = Instant::now();
        let loads: Vec<_> =
            stream::iter(ids.chunks(self.batch).zip(targets.chunks_mut(self.batch)))
                .map(|(batch, buffers)| self.client.load_into(batch, buffers))
                .buffer_unordered(self.concurrency)
                .collect()
                .await;
        let seconds = started.elapsed().as_secs_f64();
        for hits in loads {
            if hits?.iter().any(|hit| !hit) {
                bail!("a stored benchmark chunk missed on load");
            }
        }
        Ok(bytes as f64 / seconds / 1e9)
    }
}

/// Runs a memcpy pass and a client pass back to back, the memcpy first if `memcpy_first`:
/// (client GB/s, memcpy GB/s).
async fn paired<F: std::future::Future<Output = anyhow::Result<f64>>>(
    memcpy_first: bool,
    mut memcpy: impl FnMut() -> f64,
    client: impl FnOnce() -> F,
) -> anyhow::Result<(f64, f64)> {
    if memcpy_first {
        let memcpy_gbps = memcpy();
        Ok((client().await?, memcpy_gbps))
    } else {
        let client_gbps = client().await?;
        Ok((client_gbps, memcpy()))
    }
}

/// Copies the chunks of `source` into `destination`, chunk by chunk, with the C library's
/// `memcpy`: what moving those chunks costs at best on this machine.
fn memcpy_pass(source: &[u8], destination: &mut [u8], size: usize) -> f64 {
    let started = Instant::now();
    for (target, chunk) in destination.chunks_mut(size).zip(source.chunks(size)) {
        target.copy_from_slice(chunk);
    }
    black_box(&destination);
    source.len() as f64 / started.elapsed().as_secs_f64() / 1e9
}
