//! `SsdStore`: a node's SSD store, objects in fixed-size region files under one directory
//! (format in `layout`), placed and reclaimed by the `region` core, written and read through
//! the bounded `io` queue. Batches are serialized on the queue (one batch's requests run
//! `queue_depth` at a time); index changes take a short lock, so a reader never waits on
//! another batch's disk I/O to learn an object is absent.

use super::disk::{ModelDisk, RegionFile};
use super::error::{SkipReason, SsdError};
use super::io::{AlignedBuffer, IoKind, IoOp, IoQueue, IoRequests, Slot};
pub use super::layout::StoredPlace;
use super::layout::{region_file_name, BLOCK_BYTES};
use super::recovery::scan_region;
use super::region::{Entry, RegionTable, Reservation, SsdUsage};
use super::source::{Slices, WriteSource};
use crate::backends::checksum;
use crate::model::ObjectId;
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use write::WriteRequests;

mod write;

/// Bytes a restore hands to its sink, or a spill of bytes in memory copies into its slot, and
/// checksums at a time: the copy reads them from memory, the checksum right after from the
/// cache (well under a core's L2).
pub const VERIFY_CHUNK_BYTES: usize = 64 << 10;

/// Region files at most: the five digits of their names.
pub const REGION_COUNT_MAX: u64 = 99_999;

/// Configuration of one SSD store (`[nodes.ssd]`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SsdConfig {
    /// The directory holding the region files, on a local file system.
    pub directory: PathBuf,
    /// Bytes of all regions together; rounded down to whole regions.
    pub capacity_bytes: u64,
    /// Bytes of one region file: the unit of reclaim. A multiple of 4 KiB.
    #[serde(default = "default_region_bytes")]
    pub region_bytes: u64,
    /// Adopt the objects found at start (true) or wipe the store (false).
    #[serde(default = "default_true")]
    pub keep_on_restart: bool,
    /// Requests in flight at most; with `object_bytes_max` it bounds staging memory and
    /// in-flight bytes to `queue_depth × (object_bytes_max + 8 KiB)` (an object's header
    /// block, and a region's header block with the first object of each region fill).
    #[serde(default = "default_queue_depth")]
    pub queue_depth: usize,
    /// No request starts while this many bytes or more are in flight (one always may when
    /// none is): in-flight bytes stay under `in_flight_bytes_max + object_bytes_max + 8 KiB`
    /// whatever the queue depth.
    #[serde(default = "default_in_flight_bytes_max")]
    pub in_flight_bytes_max: u64,
    /// The largest object the store takes.
    #[serde(default = "default_object_bytes_max")]
    pub object_bytes_max: u64,
    /// Use io_uring (true) or pread/pwrite (false); io_uring falls back by itself when it
    /// cannot be set up.
    #[serde(default = "default_true")]
    pub io_uring: bool,
    /// Accesses an object needs before the directory spills it here (a second access by
    /// default, as KVBM does, to spare the disk's endurance; 1 admits every object).
    #[serde(default = "default_admit_after_accesses")]
    pub admit_after_accesses: u32,
}

fn default_admit_after_accesses() -> u32 {
    2
}

fn default_region_bytes() -> u64 {
    64 << 20
}

fn default_true() -> bool {
    true
}

/// Deep enough to keep an NVMe device busy; 32 × 4 MiB of staging at most.
fn default_queue_depth() -> usize {
    32
}

/// Past bandwidth × latency, bytes in flight only wait in a queue: 16 MiB is 2.3 ms of a
/// 7 GB/s NVMe device's work, and this project's virtual disk, while it was fast, read
/// slower past it (raw 4 MiB reads at queue depth 32, 128 MiB in flight, at 0.66–0.70 of
/// the speed of 256 KiB reads at depth 32, 8 MiB in flight; at 0.8–1.2 once it was slow).
fn default_in_flight_bytes_max() -> u64 {
    16 << 20
}

fn default_object_bytes_max() -> u64 {
    4 << 20
}

impl SsdConfig {
    /// A configuration with the defaults for everything but where and how large.
    pub fn new(directory: PathBuf, capacity_bytes: u64) -> SsdConfig {
        SsdConfig {
            directory,
            capacity_bytes,
            region_bytes: default_region_bytes(),
            keep_on_restart: true,
            queue_depth: default_queue_depth(),
            in_flight_bytes_max: default_in_flight_bytes_max(),
            object_bytes_max: default_object_bytes_max(),
            io_uring: true,
            admit_after_accesses: default_admit_after_accesses(),
        }
    }

    /// The capacity the store really has: whole regions.
    pub fn usable_bytes(&self) -> Result<u64, SsdError> {
        Ok(u64::from(self.region_count()?) * self.region_bytes)
    }

    fn region_count(&self) -> Result<u32, SsdError> {
        let invalid = |reason: String| Err(SsdError::InvalidConfig { reason });
        if self.region_bytes % BLOCK_BYTES != 0 || self.region_bytes < 4 * BLOCK_BYTES {
            return invalid(format!(
                "region_bytes {} is not a multiple of 4 KiB of at least 16 KiB",
                self.region_bytes
            ));
        }
        if self.object_bytes_max == 0 || self.object_bytes_max > self.region_bytes - 2 * BLOCK_BYTES
        {
            return invalid(format!(
                "object_bytes_max {} does not fit a region of {} bytes",
                self.object_bytes_max, self.region_bytes
            ));
        }
        if self.queue_depth == 0 || self.queue_depth > 1024 {
            return invalid(format!(
                "queue_depth {} is not in 1..=1024",
                self.queue_depth
            ));
        }
        if self.in_flight_bytes_max == 0 {
            return invalid("in_flight_bytes_max is 0".to_string());
        }
        let count = self.capacity_bytes / self.region_bytes;
        if count == 0 || count > REGION_COUNT_MAX {
            return invalid(format!(
                "capacity_bytes {} makes {count} regions of {} bytes (1..={REGION_COUNT_MAX})",
                self.capacity_bytes, self.region_bytes
            ));
        }
        Ok(count as u32)
    }
}

/// What opening the store found and decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Regions adopted with at least a sound header.
    pub regions_adopted: u64,
    /// Objects adopted.
    pub objects_adopted: u64,
    /// Objects dropped because their write had not completed.
    pub torn_objects: u64,
    /// Whether files are opened with `O_DIRECT` (false: buffered, each batch synced).
    pub direct_io: bool,
    /// Why io_uring is not used, when it is not.
    pub io_uring_fallback: Option<String>,
}

/// Monotonic counters of the store, read by the node's metrics.
#[derive(Debug, Default)]
pub struct SsdCounters {
    /// Objects written.
    pub spills: AtomicU64,
    /// Data bytes written.
    pub spill_bytes: AtomicU64,
    /// Objects read back whole and verified.
    pub restores: AtomicU64,
    /// Data bytes read back.
    pub restore_bytes: AtomicU64,
    /// Reads whose data failed its checksum.
    pub checksum_failures: AtomicU64,
    /// Regions reclaimed whole to make room.
    pub regions_reclaimed: AtomicU64,
    /// Spills skipped, by [`SkipReason::index`].
    pub skipped: [AtomicU64; SkipReason::ALL.len()],
}

/// The outcome of one object of a read batch.
#[derive(Debug)]
pub enum ReadOutcome {
    /// The bytes were read, verified and handed to the sink.
    Hit {
        /// Time from submission to completion.
        latency: Duration,
    },
    /// The store does not hold the object.
    Miss,
    /// The bytes failed their checksum: the object is dropped (a miss), its space reclaimable.
    Corrupt,
    /// The read failed; the object stays indexed.
    Failed(SsdError),
}

/// The outcome of a write batch.
#[derive(Debug)]
pub struct WriteBatch {
    /// One result per object, in request order: the write's latency, or why it was skipped.
    pub results: Vec<Result<Duration, SsdError>>,
    /// Objects dropped because their region was reclaimed to make room, each with the
    /// place it had.
    pub evicted: Vec<(ObjectId, StoredPlace)>,
}

/// An object's bytes in place, for a reader that reads the file itself (GPUDirect
/// Storage). The region stays protected from reuse until [`SsdStore::unpin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedObject {
    /// The region file.
    pub path: PathBuf,
    /// Offset of the data in the file (4 KiB-aligned).
    pub offset: u64,
    /// Length of the data.
    pub length_bytes: u64,
    /// crc32c of the data.
    pub data_crc: u32,
    region: u32,
    place: StoredPlace,
}

impl PinnedObject {
    /// Where the pinned object is in the store's address space (as
    /// [`SsdStore::place_of`] says), valid while the pin is held.
    pub fn place(&self) -> StoredPlace {
        self.place
    }
}

/// A node's SSD store.
pub struct SsdStore {
    config: SsdConfig,
    paths: Vec<PathBuf>,
    files: Vec<RegionFile>,
    direct_io: bool,
    table: Mutex<RegionTable>,
    queue: Mutex<IoQueue>,
    /// Held by a write batch from its first reservation to its last commit: a batch that
    /// leaves a hole in its region (a failed write or sync) seals the region before any
    /// other batch reserves behind the hole ([`SsdStore::finish_writes`]).
    writing: Mutex<()>,
    counters: SsdCounters,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A region file's mode when created: the node's user writes, its group (the engines that
/// read pinned objects in place) reads, nobody else (the umask may narrow it further).
const REGION_FILE_MODE: u32 = 0o640;

fn open_region_file(path: &Path, region_bytes: u64, direct: bool) -> Result<File, SsdError> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .write(true)
        .create(true)
        .mode(REGION_FILE_MODE);
    let direct = if direct { libc::O_DIRECT } else { 0 };
    // Never through a link someone put at a region's name.
    options.custom_flags(libc::O_NOFOLLOW | direct);
    let file = options
        .open(path)
        .map_err(|error| SsdError::from_io(path.to_path_buf(), error))?;
    let length = file
        .metadata()
        .map_err(|error| SsdError::from_io(path.to_path_buf(), error))?
        .len();
    if length != region_bytes {
        file.set_len(region_bytes)
            .map_err(|error| SsdError::from_io(path.to_path_buf(), error))?;
    }
    preallocate(&file, region_bytes)
        .map_err(|error| SsdError::from_io(path.to_path_buf(), error))?;
    Ok(file)
}

/// Gives a region file its blocks now (`fallocate`), so a write never waits on, or fails
/// for, block allocation. A file system without `fallocate` keeps the sparse file; one with
/// less room than the store's capacity keeps what it could give, warns, and the store skips
/// spills (counted, `no_space`) when it fills.
fn preallocate(file: &File, region_bytes: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let Ok(length) = libc::off_t::try_from(region_bytes) else {
        return Err(std::io::Error::other("region larger than off_t"));
    };
    // SAFETY: the descriptor is open for writing for the call's duration; mode 0 only
    // allocates blocks inside [0, length) and never changes bytes already written.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, length) };
    if result == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::EOPNOTSUPP) => Ok(()),
        Some(libc::ENOSPC) => {
            tracing::warn!(region_bytes, "the file system has less room than the SSD store's capacity: a region stays partly sparse, and spills are skipped once it is full");
            Ok(())
        }
        _ => Err(error),
    }
}

/// Whether the file system takes `O_DIRECT` for a 4 KiB-aligned read.
fn direct_io_works(path: &Path, region_bytes: u64) -> bool {
    let Ok(file) = open_region_file(path, region_bytes, true) else {
        return false;
    };
    let mut block = AlignedBuffer::new(BLOCK_BYTES as usize);
    file.read_exact_at(block.as_mut_slice(), 0).is_ok()
}

impl SsdStore {
    /// Opens (creating when absent) the store in `config.directory`: with
    /// `keep_on_restart` it adopts every sound object found, else it wipes the region files.
    /// Falls back to buffered I/O where `O_DIRECT` is refused (tmpfs) and to pread/pwrite
    /// where io_uring cannot be set up, and says so in the report.
    pub fn open(config: SsdConfig) -> Result<(SsdStore, OpenReport), SsdError> {
        let region_count = config.region_count()?;
        // Private (0700) where this creates it: the objects are tenants' data.
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(&config.directory)
            .map_err(|error| SsdError::from_io(config.directory.clone(), error))?;
        let paths: Vec<PathBuf> = (0..region_count)
            .map(|index| config.directory.join(region_file_name(index)))
            .collect();
        if !config.keep_on_restart {
            wipe(&config.directory)?;
        }
        let direct_io = direct_io_works(&paths[0], config.region_bytes);
        let files = paths
            .iter()
            .map(|path| open_region_file(path, config.region_bytes, direct_io).map(RegionFile::Os))
            .collect::<Result<Vec<RegionFile>, SsdError>>()?;
        let slot_bytes = (config.object_bytes_max + 2 * BLOCK_BYTES) as usize;
        let in_flight_bytes_max = usize::try_from(config.in_flight_bytes_max).unwrap_or(usize::MAX);
        let (queue, fallback) = IoQueue::new(
            config.queue_depth,
            slot_bytes,
            in_flight_bytes_max,
            config.io_uring,
        );
        let report = OpenReport {
            direct_io,
            io_uring_fallback: fallback,
            ..OpenReport::default()
        };
        SsdStore::assemble(config, paths, files, queue, report)
    }

    /// Opens the store on a model disk (`crate::backends::ssd::disk`), one region of the
    /// disk per region of `config` (the disk has at least as many, of `region_bytes` each):
    /// as [`SsdStore::open`] does on files, recovery scan included, minus the files
    /// themselves (nothing under `config.directory` is touched; nothing is wiped).
    pub fn open_on_model(
        config: SsdConfig,
        disk: std::sync::Arc<ModelDisk>,
    ) -> Result<(SsdStore, OpenReport), SsdError> {
        let region_count = config.region_count()?.min(disk.regions());
        let paths: Vec<PathBuf> = (0..region_count)
            .map(|index| config.directory.join(region_file_name(index)))
            .collect();
        let files = (0..region_count)
            .map(|region| RegionFile::Model {
                disk: disk.clone(),
                region,
            })
            .collect();
        let slot_bytes = (config.object_bytes_max + 2 * BLOCK_BYTES) as usize;
        let queue = IoQueue::on_model(disk, slot_bytes);
        SsdStore::assemble(config, paths, files, queue, OpenReport::default())
    }

    /// The store over opened region files: scans them when `keep_on_restart` says so.
    fn assemble(
        config: SsdConfig,
        paths: Vec<PathBuf>,
        files: Vec<RegionFile>,
        queue: IoQueue,
        mut report: OpenReport,
    ) -> Result<(SsdStore, OpenReport), SsdError> {
        let direct_io = report.direct_io;
        let mut table = RegionTable::new(files.len() as u32, config.region_bytes);
        if config.keep_on_restart {
            for (index, (file, path)) in files.iter().zip(&paths).enumerate() {
                let index = index as u32;
                let scan = scan_region(file, index, config.region_bytes, config.object_bytes_max)
                    .map_err(|error| SsdError::from_io(path.clone(), error))?;
                let Some(sequence) = scan.sequence else {
                    continue;
                };
                report.regions_adopted += 1;
                report.objects_adopted += scan.objects.len() as u64;
                report.torn_objects += scan.torn_objects;
                table.adopt(index, sequence, scan.cursor, scan.objects);
            }
        }
        let store = SsdStore {
            config,
            paths,
            files,
            direct_io,
            table: Mutex::new(table),
            queue: Mutex::new(queue),
            writing: Mutex::new(()),
            counters: SsdCounters::default(),
        };
        Ok((store, report))
    }

    /// Whether files use `O_DIRECT`.
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// Limits the requests a batch keeps in flight to `depth` (clamped to
    /// `1..=queue_depth`), e.g. to measure latency at queue depth 1.
    pub fn set_queue_depth(&self, depth: usize) {
        lock(&self.queue).set_depth_limit(depth);
    }

    /// Allocates every staging slot at its full size now (`queue_depth × (object_bytes_max +
    /// 8 KiB)`), so that no later spill or restore pays for fresh pages.
    pub fn grow_staging(&self) {
        lock(&self.queue).grow_slots();
    }

    /// The store's counters.
    pub fn counters(&self) -> &SsdCounters {
        &self.counters
    }

    /// Bytes by state.
    pub fn usage(&self) -> SsdUsage {
        lock(&self.table).usage()
    }

    /// The length of `object` when the store holds it.
    pub fn length_of(&self, object: &ObjectId) -> Option<u64> {
        lock(&self.table)
            .get(object)
            .map(|entry| entry.length_bytes)
    }

    /// Where `object`'s data is, when the store holds it: its offset in the store's address
    /// space (region index × region size + offset in the region file), which names one
    /// place in `0..capacity`, and the generation of the region fill that wrote it.
    pub fn place_of(&self, object: &ObjectId) -> Option<StoredPlace> {
        lock(&self.table)
            .get(object)
            .map(|entry| self.place(&entry))
    }

    fn place(&self, entry: &Entry) -> StoredPlace {
        entry.place(self.config.region_bytes)
    }

    /// Every object the store holds, with its place (at most the store's index: one entry
    /// per object, bounded by its capacity).
    pub fn objects(&self) -> Vec<(ObjectId, StoredPlace)> {
        lock(&self.table)
            .entries()
            .map(|(object, entry)| (object, self.place(&entry)))
            .collect()
    }

    /// Drops `object` if it is still at `place` (a retired replica): its space becomes
    /// reclaimable with its region. True when it was dropped.
    pub fn remove(&self, object: &ObjectId, place: &StoredPlace) -> bool {
        let mut table = lock(&self.table);
        let current = table.get(object);
        match current {
            Some(entry) if self.place(&entry) == *place => table.remove(object, Some(entry)),
            _ => false,
        }
    }

    /// Where `object`'s bytes are, its region protected from reuse until
    /// [`SsdStore::unpin`]; `None` when the store does not hold it.
    pub fn pin(&self, object: &ObjectId) -> Option<PinnedObject> {
        let entry = lock(&self.table).pin(object)?;
        Some(self.pinned(entry))
    }

    /// [`SsdStore::pin`] for a reader outside the node (an engine's `PinOnSsd`), within the
    /// store's bound on regions readers pin ([`RegionTable::pinned_regions_max`]): `None`
    /// also past it.
    pub fn pin_for_reader(&self, object: &ObjectId) -> Option<PinnedObject> {
        let entry = lock(&self.table).pin_for_reader(object)?;
        Some(self.pinned(entry))
    }

    fn pinned(&self, entry: Entry) -> PinnedObject {
        PinnedObject {
            path: self.paths[entry.region as usize].clone(),
            offset: entry.data_offset(),
            length_bytes: entry.length_bytes,
            data_crc: entry.data_crc,
            region: entry.region,
            place: self.place(&entry),
        }
    }

    /// Releases a pin taken by [`SsdStore::pin`].
    pub fn unpin(&self, pinned: PinnedObject) {
        lock(&self.table).unpin(pinned.region);
    }

    /// Writes `objects`, each `(id, bytes)`, at most `queue_depth` at a time. An object
    /// stored again replaces its older copy. Failed writes are skipped and counted by
    /// reason; objects whose region was reclaimed to make room are listed in the result.
    pub fn write_batch(&self, objects: &[(ObjectId, &[u8])]) -> WriteBatch {
        self.write_from(&mut Slices(objects))
    }

    /// Writes the objects of `source`, each filled straight into its staging slot, as
    /// [`SsdStore::write_batch`] does.
    pub fn write_from(&self, source: &mut dyn WriteSource) -> WriteBatch {
        let _writing = lock(&self.writing);
        let count = source.count();
        let mut requests = WriteRequests {
            store: self,
            source,
            reservations: vec![None; count],
            results: (0..count).map(|_| Err(SsdError::Full)).collect(),
            evicted: Vec::new(),
        };
        lock(&self.queue).run(count, &mut requests);
        let WriteRequests {
            source,
            reservations,
            mut results,
            evicted,
            ..
        } = requests;
        self.finish_writes(&*source, reservations, &mut results);
        for result in &results {
            if let Err(error) = result {
                self.counters.skipped[error.skip_reason().index()].fetch_add(1, Ordering::Relaxed);
            }
        }
        WriteBatch { results, evicted }
    }

    /// Commits the writes that completed, after one `fdatasync` per region written (with
    /// direct I/O too: `O_DIRECT` bypasses the page cache, not the device's write cache,
    /// and a write into a region's unwritten extent changes metadata), and aborts the rest.
    /// READY means durable.
    ///
    /// The recovery scan walks a fill from header to header and stops at the first block
    /// that holds none of this fill (it never searches past one: object data could hold a
    /// crafted header). So a failed write, whose header may never reach the device, leaves a
    /// hole nothing behind may depend on: the writes of this batch placed after the first
    /// failure in its region are aborted too (skipped as I/O, their bytes unreachable), and
    /// the region is sealed, so no later batch fills behind it.
    fn finish_writes(
        &self,
        source: &dyn WriteSource,
        reservations: Vec<Option<(Reservation, u32)>>,
        results: &mut [Result<Duration, SsdError>],
    ) {
        let mut synced: Vec<Option<bool>> = vec![None; self.files.len()];
        for (reservation, result) in reservations.iter().zip(results.iter_mut()) {
            let Some((reservation, _)) = reservation else {
                continue;
            };
            let region = reservation.region as usize;
            if result.is_err() {
                continue;
            }
            let durable = *synced[region].get_or_insert_with(|| {
                self.files[region]
                    .sync_data()
                    .map_err(|error| {
                        tracing::warn!(path = %self.paths[region].display(), %error, "fdatasync of an SSD region failed: its writes are aborted");
                    })
                    .is_ok()
            });
            if !durable {
                *result = Err(SsdError::from_io(
                    self.paths[region].clone(),
                    std::io::Error::other("fdatasync failed"),
                ));
            }
        }
        let holes = first_failure_by_region(&reservations, results);
        for (reservation, result) in reservations.iter().zip(results.iter_mut()) {
            let Some((reservation, _)) = reservation else {
                continue;
            };
            let behind_a_hole = holes.iter().any(|(region, offset)| {
                *region == reservation.region && *offset < reservation.header_offset
            });
            if result.is_ok() && behind_a_hole {
                *result = Err(SsdError::from_io(
                    self.paths[reservation.region as usize].clone(),
                    std::io::Error::other(
                        "an earlier write of its region failed: unreachable at a restart",
                    ),
                ));
            }
        }
        let mut table = lock(&self.table);
        for (region, _) in &holes {
            table.seal(*region);
        }
        for (index, reservation) in reservations.into_iter().enumerate() {
            let Some((reservation, crc)) = reservation else {
                continue;
            };
            let (object, length_bytes) = source.object(index);
            if results[index].is_ok() {
                table.commit(reservation, object, length_bytes, crc);
                self.counters.spills.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .spill_bytes
                    .fetch_add(length_bytes, Ordering::Relaxed);
            } else {
                table.abort(reservation);
            }
        }
    }

    /// Reads `objects`, at most `queue_depth` at a time, and hands each object's bytes to
    /// `sink(index, offset, chunk)` as its read completes, in order, [`VERIFY_CHUNK_BYTES`]
    /// at a time, checksumming each chunk right after the sink took it: the bytes come from
    /// memory once, and the checksum reads them from the cache. The bytes are the object's
    /// only when its outcome is [`ReadOutcome::Hit`]: a caller drops what it got for any
    /// other outcome (a corrupt object's bytes reach the sink before the checksum fails).
    /// One outcome per object, in request order.
    pub fn read_batch(
        &self,
        objects: &[ObjectId],
        sink: impl FnMut(usize, usize, &[u8]),
    ) -> Vec<ReadOutcome> {
        let mut requests = ReadRequests {
            store: self,
            objects,
            entries: vec![None; objects.len()],
            outcomes: (0..objects.len()).map(|_| ReadOutcome::Miss).collect(),
            sink,
        };
        lock(&self.queue).run(objects.len(), &mut requests);
        let mut table = lock(&self.table);
        for (index, entry) in requests.entries.iter().enumerate() {
            if let Some(entry) = entry {
                table.unpin(entry.region);
                requests.outcomes[index] = ReadOutcome::Failed(SsdError::Io {
                    path: self.paths[entry.region as usize].clone(),
                    source: io::Error::other("the I/O queue failed before this read ran"),
                });
            }
        }
        requests.outcomes
    }
}

/// Removes every region file in `directory` (and nothing else).
/// The lowest header offset of a failed write per region, over a batch's reservations
/// (a batch writes into one fill per region: a region is reclaimed only when none of its
/// writes is in flight).
fn first_failure_by_region(
    reservations: &[Option<(Reservation, u32)>],
    results: &[Result<Duration, SsdError>],
) -> Vec<(u32, u64)> {
    let mut holes: Vec<(u32, u64)> = Vec::new();
    for (reservation, result) in reservations.iter().zip(results) {
        let (Some((reservation, _)), Err(_)) = (reservation, result) else {
            continue;
        };
        match holes
            .iter_mut()
            .find(|(region, _)| *region == reservation.region)
        {
            Some((_, offset)) => *offset = (*offset).min(reservation.header_offset),
            None => holes.push((reservation.region, reservation.header_offset)),
        }
    }
    holes
}

fn wipe(directory: &Path) -> Result<(), SsdError> {
    let entries = fs::read_dir(directory)
        .map_err(|error| SsdError::from_io(directory.to_path_buf(), error))?;
    for entry in entries {
        let entry = entry.map_err(|error| SsdError::from_io(directory.to_path_buf(), error))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("region-") && name.ends_with(".kvtier-ssd") {
            fs::remove_file(entry.path())
                .map_err(|error| SsdError::from_io(entry.path(), error))?;
        }
    }
    Ok(())
}

struct ReadRequests<'a, S> {
    store: &'a SsdStore,
    objects: &'a [ObjectId],
    entries: Vec<Option<Entry>>,
    outcomes: Vec<ReadOutcome>,
    sink: S,
}

impl<S: FnMut(usize, usize, &[u8])> IoRequests for ReadRequests<'_, S> {
    fn prepare(&mut self, request: usize, _slot: Slot<'_>) -> Option<IoOp> {
        let entry = lock(&self.store.table).pin(&self.objects[request])?;
        self.entries[request] = Some(entry);
        Some(IoOp {
            kind: IoKind::Read,
            file: self.store.files[entry.region as usize].io_file(),
            offset: entry.data_offset(),
            length: entry.length_bytes.max(1).next_multiple_of(BLOCK_BYTES) as usize,
        })
    }

    fn complete(
        &mut self,
        request: usize,
        bytes: &[u8],
        result: io::Result<usize>,
        latency: Duration,
    ) {
        let Some(entry) = self.entries[request].take() else {
            return;
        };
        let length = entry.length_bytes as usize;
        let sound = matches!(result, Ok(read) if read >= length) && {
            let mut crc = 0;
            for (index, chunk) in bytes[..length].chunks(VERIFY_CHUNK_BYTES).enumerate() {
                (self.sink)(request, index * VERIFY_CHUNK_BYTES, chunk);
                crc = checksum::crc32c_append(crc, chunk);
            }
            crc == entry.data_crc
        };
        let counters = &self.store.counters;
        self.outcomes[request] = if sound {
            counters.restores.fetch_add(1, Ordering::Relaxed);
            counters
                .restore_bytes
                .fetch_add(length as u64, Ordering::Relaxed);
            ReadOutcome::Hit { latency }
        } else if let Err(error) = result {
            ReadOutcome::Failed(SsdError::from_io(
                self.store.paths[entry.region as usize].clone(),
                error,
            ))
        } else {
            counters.checksum_failures.fetch_add(1, Ordering::Relaxed);
            lock(&self.store.table).remove(&self.objects[request], Some(entry));
            ReadOutcome::Corrupt
        };
        lock(&self.store.table).unpin(entry.region);
    }
}
