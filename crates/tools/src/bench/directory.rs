//! `kvtier bench directory --in-process`: the directory core's throughput at 100k and 10M
//! objects on one core (probe, acquire+release, reserve+commit) and its memory per object,
//! against the limit of a bare hash index over the same keys measured in the same run.

use super::directory_quic::{self, QuicBenchArgs};
use super::resident_bytes;
use crate::workload::prefix::seeded_ids;
use anyhow::bail;
use kvtier_core::directory::{
    AcquireMode, AcquireOutcome, CommitOutcome, Directory, DirectoryConfig, NamespaceAccess,
    OpenRequest, ReserveItem, ReserveOutcome,
};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{
    AllocationId, Generation, Location, Medium, NodeId, ObjectId, OperationId, PoolId, PoolSpec,
    Scope, SessionId, Timestamp,
};
use kvtier_core::progress::{Progress, Unit};
use kvtier_core::rng::SplitMix64;
use serde::Serialize;
use std::hint::black_box;
use std::time::Instant;

/// Objects per batched probe or acquire in the in-process run.
pub const IN_PROCESS_BATCH: usize = 64;
/// Operations between ledger acknowledgements, as a node's heartbeat would send them.
const ACKNOWLEDGE_EVERY: u64 = 4096;
/// Length of each benchmark object: a 256 KiB KV chunk.
const OBJECT_BYTES: u64 = 256 << 10;

/// The figures at one directory size.
#[derive(Clone, Debug, Serialize)]
pub struct SizeReport {
    pub objects: u64,
    pub reserve_commit_per_s: f64,
    pub probe_keys_per_s: f64,
    pub acquire_release_per_s: f64,
    /// Lookups per second of a bare `hashbrown` map from object id to a u32 over the same keys.
    pub bare_index_lookups_per_s: f64,
    /// `probe_keys_per_s / bare_index_lookups_per_s`.
    pub probe_ratio_to_bare_index: f64,
    /// Resident-memory growth while filling, per object.
    pub bytes_per_object: f64,
    /// Bytes the replica table's arrays hold, per object (the structural part of the above).
    pub table_bytes_per_object: f64,
}

/// The benchmark's output; the top-level figures are those of the largest size.
#[derive(Clone, Debug, Serialize)]
pub struct InProcessReport {
    pub probe_keys_per_s: f64,
    pub acquire_release_per_s: f64,
    pub reserve_commit_per_s: f64,
    pub bytes_per_object: f64,
    pub sizes: Vec<SizeReport>,
}

fn per_second(count: u64, started: Instant) -> f64 {
    count as f64 / started.elapsed().as_secs_f64().max(1e-9)
}

/// Runs the in-process benchmark at each size in `sizes`.
pub fn run_in_process(sizes: &[u64], seed: u64, progress: bool) -> anyhow::Result<InProcessReport> {
    let mut reports = Vec::new();
    let bar = Progress::bar("directory", sizes.len() as u64, Unit::Items, !progress);
    for (done, &objects) in sizes.iter().enumerate() {
        bar.set(done as u64);
        bar.message(format!("{objects} objects"));
        reports.push(run_size(objects, seed)?);
    }
    bar.finish();
    let Some(largest) = reports.iter().max_by_key(|report| report.objects).cloned() else {
        bail!("no sizes given");
    };
    Ok(InProcessReport {
        probe_keys_per_s: largest.probe_keys_per_s,
        acquire_release_per_s: largest.acquire_release_per_s,
        reserve_commit_per_s: largest.reserve_commit_per_s,
        bytes_per_object: largest.bytes_per_object,
        sizes: reports,
    })
}

fn run_size(objects: u64, seed: u64) -> anyhow::Result<SizeReport> {
    let descriptor = demo_namespace();
    let ids = seeded_ids(&descriptor, objects, seed)?;
    let lookups: Vec<u32> = {
        let mut rng = SplitMix64::new(seed ^ 0x5eed);
        (0..objects.min(2_000_000))
            .map(|_| rng.below(objects) as u32)
            .collect()
    };
    let resident_before = resident_bytes();
    let (mut directory, session, pool) = bench_directory(objects)?;
    directory.register_namespace(session, descriptor)?;
    let started = Instant::now();
    let operation = store_all(&mut directory, session, pool, &ids)?;
    let reserve_commit_per_s = per_second(objects, started);
    directory.heartbeat(Timestamp::ZERO, session, Some(OperationId(operation)))?;
    let resident_after = resident_bytes();
    let bytes_per_object = resident_after.saturating_sub(resident_before) as f64 / objects as f64;
    let table_bytes_per_object = directory.replica_memory_bytes() as f64 / objects as f64;

    let probe_keys_per_s = measure_probe(&directory, session, &ids, &lookups)?;
    let acquire_release_per_s = measure_acquire_release(&mut directory, session, &ids, &lookups)?;
    drop(directory);
    let bare_index_lookups_per_s = measure_bare_index(&ids, &lookups);
    Ok(SizeReport {
        objects,
        reserve_commit_per_s,
        probe_keys_per_s,
        acquire_release_per_s,
        bare_index_lookups_per_s,
        probe_ratio_to_bare_index: probe_keys_per_s / bare_index_lookups_per_s,
        bytes_per_object,
        table_bytes_per_object,
    })
}

/// A directory with one session and a CPU pool large enough for `objects`.
fn bench_directory(objects: u64) -> anyhow::Result<(Directory, SessionId, PoolId)> {
    let config = DirectoryConfig {
        replicas_max: u32::try_from(objects + 1024).unwrap_or(u32::MAX),
        ..DirectoryConfig::default()
    };
    let mut directory = Directory::new(config);
    let open = directory.open(
        Timestamp::ZERO,
        OpenRequest {
            node_name: "bench".into(),
            write_order: vec![Medium::Cpu],
            read_order: vec![Medium::Cpu],
            domains: vec![],
            namespaces: NamespaceAccess::Any,
        },
    )?;
    let pool = directory.register_pool(
        Some(open.session),
        PoolSpec {
            name: "bench-cpu".into(),
            medium: Medium::Cpu,
            scope: Scope::Host(NodeId(open.node.0)),
            capacity_bytes: objects.saturating_add(1024) * OBJECT_BYTES,
            page_bytes: 4096,
            extent_bytes: None,
            tenancy: kvtier_core::model::PoolTenancy::Shared,
        },
    )?;
    Ok((directory, open.session, pool))
}

/// Reserves and commits every object, acknowledging as a node would; returns the last
/// operation id used.
fn store_all(
    directory: &mut Directory,
    session: SessionId,
    pool: PoolId,
    ids: &[ObjectId],
) -> anyhow::Result<u64> {
    let now = Timestamp::ZERO;
    let mut operation = 0u64;
    for (index, object) in ids.iter().enumerate() {
        operation += 1;
        let grant = directory.reserve(
            now,
            session,
            OperationId(operation),
            ReserveItem {
                object: *object,
                length_bytes: OBJECT_BYTES,
            },
        )?;
        let ReserveOutcome::Granted { replica, .. } = grant else {
            bail!("reserve of object {index} was not granted: {grant:?}");
        };
        operation += 1;
        let location = Location {
            pool,
            allocation: AllocationId(index as u64),
            generation: Generation(1),
            offset_bytes: index as u64 * OBJECT_BYTES,
            length_bytes: OBJECT_BYTES,
        };
        if directory.commit(now, session, OperationId(operation), replica, location)?
            != CommitOutcome::Committed
        {
            bail!("commit of object {index} did not publish");
        }
        if operation % ACKNOWLEDGE_EVERY == 0 {
            directory.heartbeat(now, session, Some(OperationId(operation)))?;
        }
    }
    Ok(operation)
}

fn measure_probe(
    directory: &Directory,
    session: SessionId,
    ids: &[ObjectId],
    lookups: &[u32],
) -> anyhow::Result<f64> {
    let mut batch = Vec::with_capacity(IN_PROCESS_BATCH);
    let started = Instant::now();
    for chunk in lookups.chunks(IN_PROCESS_BATCH) {
        batch.clear();
        batch.extend(chunk.iter().map(|&index| ids[index as usize]));
        black_box(directory.probe(session, &batch)?);
    }
    Ok(per_second(lookups.len() as u64, started))
}

fn measure_acquire_release(
    directory: &mut Directory,
    session: SessionId,
    ids: &[ObjectId],
    lookups: &[u32],
) -> anyhow::Result<f64> {
    let mut batch = Vec::with_capacity(IN_PROCESS_BATCH);
    let mut leases = Vec::with_capacity(IN_PROCESS_BATCH);
    let count = lookups.len().min(1_000_000);
    let started = Instant::now();
    for chunk in lookups[..count].chunks(IN_PROCESS_BATCH) {
        batch.clear();
        batch.extend(chunk.iter().map(|&index| ids[index as usize]));
        leases.clear();
        for outcome in directory.acquire(Timestamp::ZERO, session, &batch, AcquireMode::Each)? {
            match outcome {
                AcquireOutcome::Leased(lease) => leases.push(lease.lease),
                other => bail!("a stored object was not leased: {other:?}"),
            }
        }
        black_box(directory.release(session, &leases)?);
    }
    Ok(per_second(count as u64, started))
}

fn measure_bare_index(ids: &[ObjectId], lookups: &[u32]) -> f64 {
    let mut index: hashbrown::HashMap<ObjectId, u32, foldhash::fast::FixedState> =
        hashbrown::HashMap::with_capacity_and_hasher(
            ids.len(),
            foldhash::fast::FixedState::with_seed(1),
        );
    for (position, id) in ids.iter().enumerate() {
        index.insert(*id, position as u32);
    }
    let started = Instant::now();
    let mut found = 0u64;
    for &lookup in lookups {
        found += u64::from(index.get(&ids[lookup as usize]).is_some());
    }
    black_box(found);
    per_second(lookups.len() as u64, started)
}

/// Options of `kvtier bench directory`.
#[derive(Clone, Debug, clap::Args)]
pub struct DirectoryBenchArgs {
    /// Measure the directory core in this process (no network).
    #[arg(long)]
    pub in_process: bool,
    /// In-process directory sizes, in objects.
    #[arg(long, value_delimiter = ',', default_value = "100000,10000000")]
    pub objects: Vec<u64>,
    /// The options of the run over QUIC.
    #[command(flatten)]
    pub quic: QuicBenchArgs,
    /// Seed of the object ids and lookup order.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the benchmark the options select and prints its report.
pub fn run(exe: &std::path::Path, args: &DirectoryBenchArgs) -> anyhow::Result<()> {
    if args.in_process {
        let report = run_in_process(&args.objects, args.seed, !args.json)?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print_in_process(&report);
        }
        return Ok(());
    }
    let report = directory_quic::run(exe, &args.quic, args.seed)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        directory_quic::print(&report);
    }
    Ok(())
}

fn print_in_process(report: &InProcessReport) {
    println!(
        "{:>10} {:>16} {:>16} {:>18} {:>16} {:>8} {:>10} {:>12}",
        "objects",
        "reserve+commit/s",
        "probe keys/s",
        "acquire+release/s",
        "bare index/s",
        "ratio",
        "B/object",
        "table B/obj"
    );
    for size in &report.sizes {
        println!(
            "{:>10} {:>16.0} {:>16.0} {:>18.0} {:>16.0} {:>8.2} {:>10.1} {:>12.1}",
            size.objects,
            size.reserve_commit_per_s,
            size.probe_keys_per_s,
            size.acquire_release_per_s,
            size.bare_index_lookups_per_s,
            size.probe_ratio_to_bare_index,
            size.bytes_per_object,
            size.table_bytes_per_object
        );
    }
    println!("ratio = probe keys/s over a bare hash index's lookups/s on the same keys, same run");
}
