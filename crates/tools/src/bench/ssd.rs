//! `kvtier bench ssd`: the SSD store on this machine's disk — spill throughput and random
//! restores of each object size at queue depth 1 and 32 (GB/s, p50/p99) — each beside its
//! limit measured in the same run: raw direct-I/O reads and writes of the same sizes at the
//! same depth, through the same io_uring queue, on the same file system. A restore reads,
//! verifies the checksum and copies the object as the node does into a pool: into a place
//! of its own in a destination area of 4 KiB pages written before timing, with non-temporal
//! stores. Restores and raw reads run in [`RESTORE_ROUNDS`] rounds, spills and raw writes in
//! [`SPILL_ROUNDS`], the two passes of a round back to back in alternating order; each ratio
//! is the median over the rounds of each round's pass over its raw pass ([`paired_median`]).
//!
//! Both sides write where data was written before, as a store does once it is in service
//! (its regions are reused after reclaim): the raw file is written whole and the store
//! filled once ([`warm_up`]) before anything is measured. A first write into a file's
//! never-written blocks costs the file system an allocation each (on ext4 about twice the
//! time of an overwrite), and a store's regions or a raw file in that state against the
//! other in the other state would measure the file system, not the store. Likewise both
//! sides' staging slots are allocated whole before anything is timed (the raw passes share
//! one queue, as the store keeps one), so no timed pass pays for fresh pages.

use crate::workload::histogram::Histogram;
use anyhow::{bail, Context};
use kvtier_core::backends::copy::copy_into_pool;
use kvtier_core::backends::ssd::io::{IoKind, IoOp, IoQueue, IoRequests, Slot};
use kvtier_core::backends::ssd::layout::{objects_per_region, BLOCK_BYTES};
use kvtier_core::backends::ssd::{ReadOutcome, SsdConfig, SsdStore};
use kvtier_core::model::{NamespaceId, ObjectId, PrefixDigest};
use kvtier_core::rng::SplitMix64;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The store's block: the smallest object, and the stride of the source pattern.
const BLOCK: usize = BLOCK_BYTES as usize;
/// Rounds of raw reads and restores per size and depth, the two passes of a round back to
/// back in alternating order. Odd, so that the median is one round's.
const RESTORE_ROUNDS: usize = 7;
/// Rounds of raw writes and spills per size, as [`RESTORE_ROUNDS`] (fewer: a spill pass
/// writes 8 × `--restore-bytes` by default). Odd, so that the median is one round's.
const SPILL_ROUNDS: usize = 3;

/// Options of `kvtier bench ssd`.
#[derive(Clone, Debug, clap::Args)]
pub struct SsdBenchArgs {
    /// Directory on the file system to measure (created, and emptied of the benchmark's
    /// files at the end); default: a fresh directory under the system's temporary directory.
    #[arg(long)]
    pub directory: Option<PathBuf>,
    /// Object sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "262144,4194304")]
    pub sizes: Vec<usize>,
    /// Bytes spilled per object size (and the size of each raw file).
    #[arg(long, default_value_t = 512 << 20)]
    pub spill_bytes: u64,
    /// Bytes restored per object size and queue depth.
    #[arg(long, default_value_t = 256 << 20)]
    pub restore_bytes: u64,
    /// Queue depths of the restore phase.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub queue_depths: Vec<usize>,
    /// Queue depth of the spill phase.
    #[arg(long, default_value_t = 32)]
    pub spill_queue_depth: usize,
    /// Region size of the store in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub region_bytes: u64,
    /// Seed of the random restore order.
    #[arg(long, default_value_t = 5)]
    pub seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Spill of one object size against raw writes.
#[derive(Clone, Debug, Serialize)]
pub struct SpillReport {
    pub object_bytes: usize,
    pub spill_gbps: f64,
    pub raw_write_gbps: f64,
    /// The median over the rounds of spill over raw write of the round's two passes.
    pub ratio: f64,
    /// Each round's spill over raw write, in order.
    pub round_ratios: Vec<f64>,
}

/// Restores of one object size at one queue depth against raw reads.
#[derive(Clone, Debug, Serialize)]
pub struct RestoreReport {
    pub object_bytes: usize,
    pub queue_depth: usize,
    pub restore_gbps: f64,
    pub restore_p50_us: f64,
    pub restore_p99_us: f64,
    pub raw_read_gbps: f64,
    pub raw_read_p50_us: f64,
    pub raw_read_p99_us: f64,
    /// The median over the rounds of restore over raw read of the round's two passes.
    pub ratio: f64,
    /// Each round's restore over raw read, in order.
    pub round_ratios: Vec<f64>,
}

/// The benchmark's output.
#[derive(Clone, Debug, Serialize)]
pub struct SsdReport {
    /// Restore over raw read at the deepest queue depth (each size's median over rounds of
    /// adjacent passes), the lowest over object sizes.
    pub restore_ratio: f64,
    /// Spill over raw write, the lowest over object sizes.
    pub spill_ratio: f64,
    /// p99 restore latency at queue depth 1 of the smallest object size.
    pub restore_p99_us_qd1: f64,
    pub direct_io: bool,
    pub io_uring: bool,
    pub spills: Vec<SpillReport>,
    pub restores: Vec<RestoreReport>,
}

/// One timed pass: bytes moved, wall time, per-request latencies.
struct Pass {
    bytes: u64,
    elapsed: Duration,
    latencies: Histogram,
}

impl Pass {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

/// The median of `values` (the upper one of an even count); 0 for none.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// The pass of median speed (the upper one of an even count).
fn median_pass(mut passes: Vec<Pass>) -> Option<Pass> {
    passes.sort_by(|a, b| a.gbps().total_cmp(&b.gbps()));
    let middle = passes.len() / 2;
    passes.into_iter().nth(middle)
}

/// `rounds` rounds of a raw pass and a measured pass run back to back, which goes first
/// alternating from round to round: the raw passes and the measured ones, in round order.
fn paired_rounds(
    rounds: usize,
    mut raw: impl FnMut() -> anyhow::Result<Pass>,
    mut measured: impl FnMut() -> anyhow::Result<Pass>,
) -> anyhow::Result<(Vec<Pass>, Vec<Pass>)> {
    let (mut raws, mut passes) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for round in 0..rounds {
        if round % 2 == 0 {
            raws.push(raw()?);
            passes.push(measured()?);
        } else {
            passes.push(measured()?);
            raws.push(raw()?);
        }
    }
    Ok((raws, passes))
}

/// The median over rounds of `passes[i] / raws[i]` (restores over raw reads, spills over
/// raw writes), each round's passes run back to back: a disk whose speed drifts during the
/// run (a cloud volume's burst budget, another process's I/O) moves both passes of a round
/// alike, and the median drops a round one side's outlier pass decided, whichever side it
/// fell on. (Each side's best pass, the method before, took the luckier side's luck: the
/// raw reads swing more than restores.)
fn paired_median(passes: &[Pass], raws: &[Pass]) -> (f64, Vec<f64>) {
    let ratios: Vec<f64> = passes
        .iter()
        .zip(raws)
        .map(|(pass, raw)| pass.gbps() / raw.gbps())
        .collect();
    (median(&ratios), ratios)
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn bench_object(size_index: usize, index: u64) -> ObjectId {
    let mut prefix = [0u8; 16];
    prefix[..8].copy_from_slice(&index.to_le_bytes());
    prefix[8] = size_index as u8;
    ObjectId {
        namespace: NamespaceId([0xbe; 16]),
        prefix: PrefixDigest(prefix),
        shard: 0,
        part: 0,
    }
}

/// A source buffer whose slice at `(index % 16) × 4 KiB` is object `index`'s bytes.
fn pattern(size: usize, seed: u64) -> Vec<u8> {
    let mut random = SplitMix64::new(seed);
    let mut bytes = vec![0u8; size + 16 * BLOCK];
    for word in bytes.chunks_mut(8) {
        let value = random.next_u64().to_le_bytes();
        word.copy_from_slice(&value[..word.len()]);
    }
    bytes
}

fn object_bytes(pattern: &[u8], size: usize, index: u64) -> &[u8] {
    let start = (index % 16) as usize * BLOCK;
    &pattern[start..start + size]
}

/// Runs the benchmark and prints the report.
pub fn run(args: &SsdBenchArgs) -> anyhow::Result<()> {
    let directory = args.directory.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("kvtier-bench-ssd-{}", std::process::id()))
    });
    std::fs::create_dir_all(&directory)
        .with_context(|| format!("creating {}", directory.display()))?;
    let result = measure(args, &directory);
    let _ = std::fs::remove_dir_all(directory.join("store"));
    let _ = std::fs::remove_file(directory.join("raw.kvtier-bench"));
    if args.directory.is_none() {
        let _ = std::fs::remove_dir(&directory);
    }
    let report = result?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "SSD store in {} (direct I/O {}, io_uring {})",
        directory.display(),
        report.direct_io,
        report.io_uring
    );
    for spill in &report.spills {
        println!(
            "spill {:>8} B objects: {:.2} GB/s, raw direct write {:.2} GB/s, ratio {:.2}",
            spill.object_bytes, spill.spill_gbps, spill.raw_write_gbps, spill.ratio
        );
    }
    for restore in &report.restores {
        println!(
            "restore {:>8} B objects QD{:<2}: {:.2} GB/s p50 {:.0} us p99 {:.0} us; raw direct read {:.2} GB/s p50 {:.0} us p99 {:.0} us; ratio {:.2}",
            restore.object_bytes, restore.queue_depth, restore.restore_gbps, restore.restore_p50_us,
            restore.restore_p99_us, restore.raw_read_gbps, restore.raw_read_p50_us,
            restore.raw_read_p99_us, restore.ratio
        );
    }
    println!(
        "GB/s and latencies: each side's median pass; ratio: the median over {SPILL_ROUNDS} \
         (spills) or {RESTORE_ROUNDS} (restores) rounds of the pass over the raw one run back \
         to back with it"
    );
    println!(
        "restore_ratio {:.2} spill_ratio {:.2} restore_p99_us_qd1 {:.0}",
        report.restore_ratio, report.spill_ratio, report.restore_p99_us_qd1
    );
    Ok(())
}

fn measure(args: &SsdBenchArgs, directory: &Path) -> anyhow::Result<SsdReport> {
    if args.sizes.is_empty() || args.queue_depths.is_empty() {
        bail!("give at least one object size and one queue depth");
    }
    let (mut bench, io_uring) = Bench::open(args, directory)?;
    let mut report = SsdReport {
        restore_ratio: f64::INFINITY,
        spill_ratio: f64::INFINITY,
        restore_p99_us_qd1: 0.0,
        direct_io: bench.store.direct_io(),
        io_uring,
        spills: Vec::new(),
        restores: Vec::new(),
    };
    for (size_index, &size) in args.sizes.iter().enumerate() {
        let size = size.max(BLOCK);
        let objects = SizeObjects {
            size_index,
            size,
            count: (args.spill_bytes / size as u64).max(1),
            source: pattern(size, args.seed ^ size as u64),
        };
        report.spills.push(bench.spill_rounds(&objects)?);
        let reads = (args.restore_bytes / size as u64).max(1);
        // The restores' destination, as a pool is to the node: every object of a pass in
        // a place of its own, on pages written before anything is timed.
        let mut destination = vec![1u8; size * reads as usize];
        for &depth in &args.queue_depths {
            let restore = bench.restore_rounds(&objects, depth, reads, &mut destination)?;
            report.restores.push(restore);
        }
    }
    summarize(&mut report, args);
    Ok(report)
}

/// The objects of one measured size: `count` objects of `size` bytes, object `i` being
/// `object_bytes(source, size, i)`.
struct SizeObjects {
    /// The size's index in `--sizes`, part of every object's id.
    size_index: usize,
    size: usize,
    count: u64,
    source: Vec<u8>,
}

/// The store and the raw file under test, both warmed up ([`warm_up`]) with their staging
/// slots allocated, so that no timed pass pays for a first write or fresh pages.
struct Bench<'a> {
    args: &'a SsdBenchArgs,
    /// One queue for every raw pass, as the store keeps one.
    raw_queue: IoQueue,
    raw: File,
    store: SsdStore,
}

impl<'a> Bench<'a> {
    /// Opens the store and the raw file in `directory`, sized for `args`, and warms both
    /// up; also whether the store runs on io_uring.
    fn open(args: &'a SsdBenchArgs, directory: &Path) -> anyhow::Result<(Self, bool)> {
        let size_max = args.sizes.iter().copied().max().unwrap_or(BLOCK);
        let depth_max = args
            .queue_depths
            .iter()
            .copied()
            .max()
            .unwrap_or(1)
            .max(args.spill_queue_depth);
        // Room for two sizes' objects, or for one size's twice: a spill round commits its
        // objects when it ends, so it must not reclaim the regions of the round before.
        let capacity = (args.spill_bytes * args.sizes.len().max(2) as u64 * 5 / 4)
            .next_multiple_of(args.region_bytes)
            + 2 * args.region_bytes;
        let config = SsdConfig {
            region_bytes: args.region_bytes,
            keep_on_restart: false,
            queue_depth: depth_max,
            object_bytes_max: size_max as u64,
            ..SsdConfig::new(directory.join("store"), capacity)
        };
        let (store, opened) = SsdStore::open(config)?;
        let raw_path = directory.join("raw.kvtier-bench");
        let raw = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(if store.direct_io() { libc::O_DIRECT } else { 0 })
            .open(&raw_path)
            .with_context(|| format!("opening {}", raw_path.display()))?;
        raw.set_len(args.spill_bytes)?;
        // One queue for every raw pass, as the store keeps one: its slots are allocated
        // before anything is timed, on both sides.
        // The limit: the device at the asked depth, with no bound on the bytes in flight.
        let (mut raw_queue, _) = IoQueue::new(depth_max, size_max, usize::MAX, true);
        raw_queue.grow_slots();
        warm_up(&store, &raw, &mut raw_queue, args, size_max, capacity)?;
        store.grow_staging();
        let bench = Self {
            args,
            raw_queue,
            raw,
            store,
        };
        Ok((bench, opened.io_uring_fallback.is_none()))
    }

    /// Spills `objects` against raw writes of the same sizes in [`SPILL_ROUNDS`] rounds.
    ///
    /// Spills and raw writes alternate in rounds too, compared round by round
    /// (`paired_median`): a virtual disk absorbs writes in the host's cache and flushes
    /// them afterwards, so the side that writes second can pay for the first's flush.
    /// Every spill round rewrites the same objects (the store replaces the older copies),
    /// so the last round's objects are what the restore passes read.
    fn spill_rounds(&mut self, objects: &SizeObjects) -> anyhow::Result<SpillReport> {
        let Self {
            args,
            raw_queue,
            raw,
            store,
        } = self;
        let (size, count, depth) = (objects.size, objects.count, args.spill_queue_depth);
        let (raw_writes, spills) = paired_rounds(
            SPILL_ROUNDS,
            || raw_pass(raw_queue, raw, IoKind::Write, size, count, depth, None),
            || {
                let source = &objects.source;
                spill_pass(store, source, objects.size_index, size, count, depth)
            },
        )?;
        let (ratio, round_ratios) = paired_median(&spills, &raw_writes);
        let (Some(raw_write), Some(spill)) = (median_pass(raw_writes), median_pass(spills)) else {
            bail!("no spill round ran");
        };
        Ok(SpillReport {
            object_bytes: size,
            spill_gbps: spill.gbps(),
            raw_write_gbps: raw_write.gbps(),
            ratio,
            round_ratios,
        })
    }

    /// Restores `reads` random picks of `objects` at queue depth `depth` into
    /// `destination` against raw reads of the same blocks, in [`RESTORE_ROUNDS`] rounds of
    /// two back-to-back passes in alternating order, compared round by round
    /// (`paired_median`).
    fn restore_rounds(
        &mut self,
        objects: &SizeObjects,
        depth: usize,
        reads: u64,
        destination: &mut [u8],
    ) -> anyhow::Result<RestoreReport> {
        let Self {
            args,
            raw_queue,
            raw,
            store,
        } = self;
        let (size, count) = (objects.size, objects.count);
        let mut order = SplitMix64::new(args.seed ^ (depth as u64) << 32 ^ size as u64);
        let picks: Vec<u64> = (0..reads).map(|_| order.below(count)).collect();
        let raw_picks = Some(picks.as_slice());
        let (raw_reads, restores) = paired_rounds(
            RESTORE_ROUNDS,
            || raw_pass(raw_queue, raw, IoKind::Read, size, count, depth, raw_picks),
            || {
                let (source, size_index) = (&objects.source, objects.size_index);
                restore_pass(store, source, destination, size_index, size, depth, &picks)
            },
        )?;
        let (ratio, round_ratios) = paired_median(&restores, &raw_reads);
        let (Some(raw_read), Some(restore)) = (median_pass(raw_reads), median_pass(restores))
        else {
            bail!("no restore round ran");
        };
        Ok(RestoreReport {
            object_bytes: size,
            queue_depth: depth,
            restore_gbps: restore.gbps(),
            restore_p50_us: micros(restore.latencies.quantile(0.5)),
            restore_p99_us: micros(restore.latencies.quantile(0.99)),
            raw_read_gbps: raw_read.gbps(),
            raw_read_p50_us: micros(raw_read.latencies.quantile(0.5)),
            raw_read_p99_us: micros(raw_read.latencies.quantile(0.99)),
            ratio,
            round_ratios,
        })
    }
}

fn summarize(report: &mut SsdReport, args: &SsdBenchArgs) {
    let deepest = args.queue_depths.iter().copied().max().unwrap_or(1);
    let shallowest = args.queue_depths.iter().copied().min().unwrap_or(1);
    let smallest = report
        .restores
        .iter()
        .map(|restore| restore.object_bytes)
        .min()
        .unwrap_or(0);
    for restore in &report.restores {
        if restore.queue_depth == deepest {
            report.restore_ratio = report.restore_ratio.min(restore.ratio);
        }
        if restore.queue_depth == shallowest && restore.object_bytes == smallest {
            report.restore_p99_us_qd1 = restore.restore_p99_us;
        }
    }
    for spill in &report.spills {
        report.spill_ratio = report.spill_ratio.min(spill.ratio);
    }
}

/// Size index of the objects [`warm_up`] fills the store with (the measured ones use
/// their size's index in `--sizes`).
const WARM_UP_INDEX: usize = u8::MAX as usize;

/// Writes the raw file whole once, and fills every region of the store (`capacity` bytes)
/// once with objects of the smallest size, as many as fit without a reclaim (a write batch
/// cannot reclaim a region its own writes fill), so that every measured write, raw or
/// spilled, lands where data was written before. The store reclaims the warm-up regions,
/// oldest first, as the measured spills need room.
fn warm_up(
    store: &SsdStore,
    raw: &File,
    raw_queue: &mut IoQueue,
    args: &SsdBenchArgs,
    size_max: usize,
    capacity: u64,
) -> anyhow::Result<()> {
    if args.sizes.len() >= WARM_UP_INDEX {
        bail!("at most {} object sizes", WARM_UP_INDEX - 1);
    }
    let size_max = size_max.max(BLOCK);
    let blocks = args.spill_bytes.div_ceil(size_max as u64);
    raw_pass(
        raw_queue,
        raw,
        IoKind::Write,
        size_max,
        blocks,
        args.spill_queue_depth,
        None,
    )?;
    let size = args.sizes.iter().copied().min().unwrap_or(BLOCK).max(BLOCK);
    let source = pattern(size, args.seed);
    let count = capacity / args.region_bytes * objects_per_region(args.region_bytes, size as u64);
    let objects: Vec<(ObjectId, &[u8])> = (0..count)
        .map(|index| {
            (
                bench_object(WARM_UP_INDEX, index),
                object_bytes(&source, size, index),
            )
        })
        .collect();
    for result in store.write_batch(&objects).results {
        if let Err(error) = result {
            bail!("a warm-up spill of the benchmark failed: {error}");
        }
    }
    Ok(())
}

fn spill_pass(
    store: &SsdStore,
    source: &[u8],
    size_index: usize,
    size: usize,
    count: u64,
    queue_depth: usize,
) -> anyhow::Result<Pass> {
    store.set_queue_depth(queue_depth);
    let objects: Vec<(ObjectId, &[u8])> = (0..count)
        .map(|index| {
            (
                bench_object(size_index, index),
                object_bytes(source, size, index),
            )
        })
        .collect();
    let started = Instant::now();
    let written = store.write_batch(&objects);
    let elapsed = started.elapsed();
    let mut latencies = Histogram::default();
    for result in written.results {
        match result {
            Ok(latency) => latencies.record(latency),
            Err(error) => bail!("a spill of the benchmark failed: {error}"),
        }
    }
    // Objects of other sizes, measured already, may go; this size's are read back later.
    let measured = written
        .evicted
        .iter()
        .filter(|(object, _)| object.prefix.0[8] == size_index as u8)
        .count();
    if measured > 0 {
        bail!("the benchmark's store evicted {measured} objects it reads back: it is too small");
    }
    Ok(Pass {
        bytes: size as u64 * count,
        elapsed,
        latencies,
    })
}

/// Restores the objects `picks` names into `destination` (object `i` of the pass at
/// `i × size`), copying as the node copies into a pool: with non-temporal stores, as no
/// reader of this process reads the bytes back.
fn restore_pass(
    store: &SsdStore,
    source: &[u8],
    destination: &mut [u8],
    size_index: usize,
    size: usize,
    depth: usize,
    picks: &[u64],
) -> anyhow::Result<Pass> {
    let ids: Vec<ObjectId> = picks
        .iter()
        .map(|index| bench_object(size_index, *index))
        .collect();
    let mut wrong = 0u64;
    let mut latencies = Histogram::default();
    store.set_queue_depth(depth);
    // Queue depth 1 is timed end to end per object (read, checksum, copy); deeper queues
    // run as one batch, each object timed from submission to completion.
    let batches: Vec<&[ObjectId]> = if depth == 1 {
        ids.chunks(1).collect()
    } else {
        vec![&ids]
    };
    let started = Instant::now();
    let mut first = 0;
    for batch in batches {
        let batch_started = Instant::now();
        let outcomes = store.read_batch(batch, |index, offset, chunk| {
            let place = (first + index) * size;
            let object = &mut destination[place..place + size];
            let end = offset + chunk.len();
            copy_into_pool(chunk, &mut object[offset..end]);
            if end == size {
                let expected = object_bytes(source, size, picks[first + index]);
                if object[..64] != expected[..64] || object[size - 64..] != expected[size - 64..] {
                    wrong += 1;
                }
            }
        });
        for outcome in outcomes {
            match outcome {
                ReadOutcome::Hit { .. } if depth == 1 => latencies.record(batch_started.elapsed()),
                ReadOutcome::Hit { latency } => latencies.record(latency),
                other => bail!("restore of a spilled benchmark object gave {other:?}"),
            }
        }
        first += batch.len();
    }
    let elapsed = started.elapsed();
    if wrong > 0 {
        bail!("{wrong} restored objects differ from what was spilled");
    }
    Ok(Pass {
        bytes: size as u64 * picks.len() as u64,
        elapsed,
        latencies,
    })
}

struct RawRequests<'a> {
    file: &'a File,
    kind: IoKind,
    size: usize,
    picks: Option<&'a [u64]>,
    latencies: Histogram,
    failure: Option<io::Error>,
}

impl IoRequests for RawRequests<'_> {
    fn prepare(&mut self, request: usize, mut slot: Slot<'_>) -> Option<IoOp> {
        let index = self.picks.map_or(request as u64, |picks| picks[request]);
        if self.kind == IoKind::Write {
            slot.bytes(self.size)[..8].copy_from_slice(&index.to_le_bytes());
        }
        Some(IoOp {
            kind: self.kind,
            file: kvtier_core::backends::ssd::disk::IoFile::Fd(self.file.as_raw_fd()),
            offset: index * self.size as u64,
            length: self.size,
        })
    }

    fn complete(
        &mut self,
        _request: usize,
        _bytes: &[u8],
        result: io::Result<usize>,
        latency: Duration,
    ) {
        match result {
            Ok(moved) if moved == self.size => self.latencies.record(latency),
            Ok(moved) => {
                self.failure = Some(io::Error::other(format!("short transfer of {moved} bytes")))
            }
            Err(error) => self.failure = Some(error),
        }
    }
}

/// Raw I/O of `size`-byte blocks on `file` at `depth` through `queue`: writes of `count`
/// blocks in order, or reads of the blocks `picks` names.
fn raw_pass(
    queue: &mut IoQueue,
    file: &File,
    kind: IoKind,
    size: usize,
    count: u64,
    depth: usize,
    picks: Option<&[u64]>,
) -> anyhow::Result<Pass> {
    queue.set_depth_limit(depth);
    let mut requests = RawRequests {
        file,
        kind,
        size,
        picks,
        latencies: Histogram::default(),
        failure: None,
    };
    let total = picks.map_or(count, |picks| picks.len() as u64);
    let started = Instant::now();
    queue.run(total as usize, &mut requests);
    let elapsed = started.elapsed();
    if let Some(error) = requests.failure {
        bail!("raw {kind:?} of {size} bytes failed: {error}");
    }
    Ok(Pass {
        bytes: size as u64 * total,
        elapsed,
        latencies: requests.latencies,
    })
}
