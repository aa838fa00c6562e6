//! The start-up probe: a node measures the tiers it maps instead of trusting representative
//! figures. Memory pools (CPU, CXL) are measured by copying through their mapping; an SSD
//! path by direct I/O on a scratch file. The result is a [`Measurement`] the node reports
//! to the directory, whose policy prices each pool by it.
//!
//! The probe is short (tens of milliseconds per pool) and bounded: it touches at most
//! [`MEMORY_PROBE_BYTES`] of a mapping and writes at most the bytes asked of a disk.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{PoolError, SharedMemory};
use crate::policy::profiles::Measurement;

/// Most bytes of a mapping one probe copies through: twice the 32 MiB last-level cache of
/// the development machine, so the read pass (which starts where the write pass started)
/// reaches memory, and under 10 ms per pass at 10 GB/s. A larger cache makes the figures
/// optimistic; a pool smaller than this is probed whole.
pub const MEMORY_PROBE_BYTES: u64 = 64 << 20;
/// Size of one copy of the bandwidth passes: a typical KV chunk.
const COPY_BYTES: usize = 1 << 20;
/// Passes over the region; the fastest counts (the others absorb a noisy neighbour).
const PASSES: usize = 3;
/// Dependent small reads timed for the latency figure.
const LATENCY_READS: u32 = 4096;
/// Bytes of one latency read: one cache line.
const LINE_BYTES: usize = 64;
/// Alignment and unit of direct I/O.
const DIRECT_IO_ALIGN: usize = 4096;
/// Size of one SSD bandwidth read: a KV chunk as the SSD tier will store it.
const SSD_READ_BYTES: usize = 256 << 10;

/// Where a memory probe copies: `offset..offset + length` of the data area is this node's
/// and unused (a fresh CPU pool, a CXL extent just granted and not yet allocated in), so
/// the probe may overwrite it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeRegion {
    pub offset: u64,
    pub length: u64,
}

/// Why a probe could not measure.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The region is empty or leaves the mapping.
    #[error("probe region: {0}")]
    Region(#[from] PoolError),
    /// A shared pool had no free extent to probe in: it keeps the directory's figures.
    /// Normal when the pool is full, or after a restart while the node's extents are held.
    #[error("no free extent to probe in")]
    NoRoom,
    /// The directory did not answer the request for an extent to probe in.
    #[error("asking the directory for an extent to probe in: {0}")]
    Directory(String),
    /// The SSD scratch file could not be written or read (no space, no direct I/O on this
    /// file system, no permission).
    #[error("SSD probe at {path}: {source}")]
    Disk {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Measures `memory` through `region` (clamped to [`MEMORY_PROBE_BYTES`]): the best copy
/// bandwidth into it and out of it, and the latency of a dependent chain of one-line
/// reads. The region holds probe bytes afterwards.
pub fn probe_memory(memory: &SharedMemory, region: ProbeRegion) -> Result<Measurement, ProbeError> {
    let ProbeRegion { offset, length } = region;
    let length = length.min(MEMORY_PROBE_BYTES);
    let copies = (length / COPY_BYTES as u64).max(1);
    let copy_bytes = usize::try_from(length / copies).unwrap_or(COPY_BYTES);
    if copy_bytes == 0 {
        return Err(PoolError::OutOfBounds {
            offset,
            length_bytes: length,
            limit_bytes: memory.data_bytes(),
        }
        .into());
    }
    // Bounds checked once for the whole region; each copy below stays inside it.
    memory.slice(offset, copies * copy_bytes as u64)?;
    let mut private = vec![0x5au8; copy_bytes];
    let mut write_best = Duration::MAX;
    for _ in 0..PASSES {
        let started = Instant::now();
        for copy in 0..copies {
            memory.write_at(offset + copy * copy_bytes as u64, &private)?;
        }
        write_best = write_best.min(started.elapsed());
    }
    let mut read_best = Duration::MAX;
    for _ in 0..PASSES {
        let started = Instant::now();
        for copy in 0..copies {
            memory.read_at(offset + copy * copy_bytes as u64, &mut private)?;
        }
        read_best = read_best.min(started.elapsed());
        std::hint::black_box(&private);
    }
    let bytes = copies * copy_bytes as u64;
    let latency = chase(memory, offset, bytes)?;
    Ok(Measurement {
        read_latency_ns: latency.as_nanos().max(1) as u64,
        read_bandwidth_bytes_per_s: per_second(bytes, read_best),
        write_bandwidth_bytes_per_s: Some(per_second(bytes, write_best)),
    })
}

/// Mean time of one read in a chain whose next address depends on the bytes just read, so
/// the reads cannot overlap: the latency of a line not in cache.
fn chase(memory: &SharedMemory, offset: u64, bytes: u64) -> Result<Duration, PoolError> {
    let lines = (bytes / LINE_BYTES as u64).max(1);
    let mut line = [0u8; LINE_BYTES];
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let started = Instant::now();
    for _ in 0..LATENCY_READS {
        let index = state % lines;
        memory.read_at(offset + index * LINE_BYTES as u64, &mut line)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(&line[..8]);
        // xorshift over the state and the bytes read: the next address needs this read.
        state ^= u64::from_le_bytes(word) ^ (state << 13);
        state ^= state >> 7;
        state ^= state << 17;
    }
    Ok(started.elapsed() / LATENCY_READS)
}

/// Measures direct I/O under `directory`: writes a scratch file of `bytes` (rounded to
/// whole mebibytes, at least one), reads it back in random 256 KiB direct reads for the
/// bandwidth and 4 KiB ones for the latency, and removes it. One outstanding request at a
/// time, so the bandwidth is a floor of what a deeper queue gets.
pub fn probe_disk(directory: &Path, bytes: u64) -> Result<Measurement, ProbeError> {
    let path = directory.join(format!(".kvtier-probe-{}", std::process::id()));
    let disk = |source| ProbeError::Disk {
        path: path.clone(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .map_err(disk)?;
    let scratch = ScratchFile(path.clone());
    let chunks = (bytes / COPY_BYTES as u64).max(1);
    let mut buffer = AlignedBuffer::new(COPY_BYTES);
    buffer.as_mut().fill(0xa5);
    let started = Instant::now();
    for chunk in 0..chunks {
        file.write_all_at(buffer.as_mut(), chunk * COPY_BYTES as u64)
            .map_err(disk)?;
    }
    file.sync_all().map_err(disk)?;
    let write_time = started.elapsed();
    let total = chunks * COPY_BYTES as u64;
    let reads = total / SSD_READ_BYTES as u64;
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let started = Instant::now();
    for _ in 0..reads {
        state = next_random(state);
        let offset = (state % reads) * SSD_READ_BYTES as u64;
        read_direct(&file, &mut buffer.as_mut()[..SSD_READ_BYTES], offset).map_err(disk)?;
    }
    let read_time = started.elapsed();
    let small_reads = (total / DIRECT_IO_ALIGN as u64).min(u64::from(LATENCY_READS) / 4);
    let started = Instant::now();
    for _ in 0..small_reads {
        state = next_random(state);
        let offset = (state % (total / DIRECT_IO_ALIGN as u64)) * DIRECT_IO_ALIGN as u64;
        read_direct(&file, &mut buffer.as_mut()[..DIRECT_IO_ALIGN], offset).map_err(disk)?;
    }
    let latency = started.elapsed() / u32::try_from(small_reads.max(1)).unwrap_or(u32::MAX);
    drop(scratch);
    Ok(Measurement {
        read_latency_ns: latency.as_nanos().max(1) as u64,
        read_bandwidth_bytes_per_s: per_second(reads * SSD_READ_BYTES as u64, read_time),
        write_bandwidth_bytes_per_s: Some(per_second(total, write_time)),
    })
}

fn read_direct(file: &File, buffer: &mut [u8], offset: u64) -> std::io::Result<()> {
    file.read_exact_at(buffer, offset)
}

fn next_random(state: u64) -> u64 {
    let mut state = state;
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    state
}

fn per_second(bytes: u64, elapsed: Duration) -> u64 {
    (bytes as f64 / elapsed.as_secs_f64().max(1e-9)) as u64
}

/// Removes the scratch file on every path out of [`probe_disk`].
struct ScratchFile(PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A heap buffer aligned for direct I/O.
struct AlignedBuffer {
    bytes: Vec<u8>,
    start: usize,
    length: usize,
}

impl AlignedBuffer {
    fn new(length: usize) -> Self {
        let bytes = vec![0u8; length + DIRECT_IO_ALIGN];
        let start = bytes.as_ptr().align_offset(DIRECT_IO_ALIGN);
        Self {
            bytes,
            start,
            length,
        }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.length]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_memory(name: &str, bytes: u64) -> (SharedMemory, PathBuf) {
        let path = std::env::temp_dir().join(format!("kvtier-probe-{name}-{}", std::process::id()));
        let _ = fs::remove_file(&path);
        let memory = SharedMemory::create(&path, bytes, 7, 4096).unwrap();
        (memory, path)
    }

    #[test]
    fn a_region_is_measured_in_both_directions_and_nothing_outside_it_is_touched() {
        let (memory, path) = scratch_memory("memory", 4 << 20);
        let untouched = memory.slice(2 << 20, 4096).unwrap().to_vec();
        let measured = probe_memory(
            &memory,
            ProbeRegion {
                offset: 0,
                length: 2 << 20,
            },
        )
        .unwrap();
        assert!(measured.read_bandwidth_bytes_per_s > 0);
        assert!(measured
            .write_bandwidth_bytes_per_s
            .is_some_and(|value| value > 0));
        assert!(measured.read_latency_ns > 0);
        assert_ne!(
            memory.slice(0, 4096).unwrap(),
            &untouched[..],
            "probe bytes written"
        );
        assert_eq!(memory.slice(2 << 20, 4096).unwrap(), &untouched[..]);
        for outside in [
            ProbeRegion {
                offset: 4 << 20,
                length: 1 << 20,
            },
            ProbeRegion {
                offset: 0,
                length: 0,
            },
        ] {
            assert!(probe_memory(&memory, outside).is_err(), "{outside:?}");
        }
        fs::remove_file(path).unwrap();
    }

    /// Whether `directory` takes direct I/O, found out without the probe: the `errno` of
    /// creating a file there with `O_DIRECT` and writing one aligned block, or `None`.
    fn direct_io_refusal(directory: &Path) -> Option<i32> {
        let path = directory.join(format!(".kvtier-direct-{}", std::process::id()));
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path);
        let written = opened.and_then(|file| {
            let mut block = AlignedBuffer::new(DIRECT_IO_ALIGN);
            file.write_all_at(block.as_mut(), 0)
        });
        let _ = fs::remove_file(&path);
        written
            .err()
            .map(|error| error.raw_os_error().unwrap_or(-1))
    }

    #[test]
    fn the_disk_probe_measures_where_direct_io_works_and_names_the_error_where_not() {
        let directory = std::env::temp_dir();
        let expected_path = directory.join(format!(".kvtier-probe-{}", std::process::id()));
        match (
            direct_io_refusal(&directory),
            probe_disk(&directory, 2 << 20),
        ) {
            (None, Ok(measured)) => {
                assert!(measured.read_bandwidth_bytes_per_s > 0);
                assert!(measured.read_latency_ns > 0);
                assert!(measured
                    .write_bandwidth_bytes_per_s
                    .is_some_and(|value| value > 0));
            }
            // No direct I/O here (tmpfs before Linux 6.6): the same error, typed, with the
            // scratch file's path.
            (Some(errno), Err(ProbeError::Disk { path, source })) => {
                assert_eq!(source.raw_os_error(), Some(errno), "{source}");
                assert_eq!(path, expected_path);
            }
            (refusal, outcome) => panic!(
                "{} takes direct I/O: {refusal:?} (errno), but the probe gave {outcome:?}",
                directory.display()
            ),
        }
        assert!(!expected_path.exists(), "the scratch file was left behind");
        // A folder that does not exist, and a path through a file: each error as it is.
        let missing = probe_disk(Path::new("/nonexistent/kvtier"), 1 << 20);
        assert!(
            matches!(&missing, Err(ProbeError::Disk { source, .. }) if source.kind() == std::io::ErrorKind::NotFound),
            "{missing:?}"
        );
        let file = std::env::temp_dir().join(format!("kvtier-probe-file-{}", std::process::id()));
        fs::write(&file, b"not a folder").unwrap();
        let through_file = probe_disk(&file, 1 << 20);
        fs::remove_file(&file).unwrap();
        assert!(
            matches!(&through_file, Err(ProbeError::Disk { source, .. }) if source.raw_os_error() == Some(libc::ENOTDIR)),
            "{through_file:?}"
        );
    }
}
