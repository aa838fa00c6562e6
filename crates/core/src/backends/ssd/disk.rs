//! What the SSD store's region files live on: the operating system's files, or, in tests and
//! simulations, a model disk that loses what was not synced.
//!
//! A real disk cannot be made to lose its unsynced writes on demand here (that takes a
//! device-mapper target and a power cut), so the claim "READY means durable" is proven on
//! [`ModelDisk`], behind the same seam the store's real files use ([`RegionFile`]): every
//! read, write and `fdatasync` of the store goes through it. The model keeps, per region,
//! what the device holds durably and what a reader sees (the page cache: durable bytes plus
//! writes not yet synced). A [`ModelDisk::crash`] keeps each unsynced block whole, loses it,
//! or tears it (its first 512-byte sectors reach the device, the rest do not), as a power
//! cut does; [`ModelDisk::corrupt`] flips a bit the device holds; writes and syncs fail
//! with `EIO` at the rates [`DiskFaults`] sets. Everything is drawn from one random source
//! the caller gives (a seeded generator: runs replay).

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

/// The unit a model disk tracks and tears: 4 KiB, the store's block.
const MODEL_BLOCK_BYTES: usize = super::layout::BLOCK_BYTES as usize;
/// The unit that reaches the device whole even in a torn block: one 512-byte sector.
const SECTOR_BYTES: usize = 512;

/// One region file of the store.
#[derive(Debug)]
pub enum RegionFile {
    /// A file of the operating system, opened by the store.
    Os(File),
    /// Region `region` of a model disk.
    Model {
        /// The disk.
        disk: Arc<ModelDisk>,
        /// The region's index on it.
        region: u32,
    },
}

/// Where an I/O request goes: a descriptor, or a model disk's region (whose queue runs it
/// on the model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoFile {
    /// An open descriptor.
    Fd(RawFd),
    /// A model disk's region.
    Model(u32),
}

impl RegionFile {
    /// Where this file's I/O requests go.
    pub fn io_file(&self) -> IoFile {
        match self {
            RegionFile::Os(file) => IoFile::Fd(file.as_raw_fd()),
            RegionFile::Model { region, .. } => IoFile::Model(*region),
        }
    }

    /// Reads exactly `buffer.len()` bytes at `offset`.
    pub fn read_exact_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        match self {
            RegionFile::Os(file) => file.read_exact_at(buffer, offset),
            RegionFile::Model { disk, region } => {
                let read = disk.read_at(*region, buffer, offset)?;
                if read < buffer.len() {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                Ok(())
            }
        }
    }

    /// Makes every write completed so far durable (`fdatasync`).
    pub fn sync_data(&self) -> io::Result<()> {
        match self {
            RegionFile::Os(file) => file.sync_data(),
            RegionFile::Model { disk, region } => disk.sync(*region),
        }
    }
}

/// How often a model disk fails, in percent of calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskFaults {
    /// Writes that fail with `EIO` (nothing of them is written).
    pub write_error_percent: u64,
    /// `fdatasync` calls that fail with `EIO`: the region's unsynced writes stay unsynced
    /// (they may be lost at the next crash).
    pub sync_error_percent: u64,
}

/// What one [`ModelDisk::crash`] did to the unsynced blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Unsynced blocks that reached the device whole.
    pub kept: u64,
    /// Unsynced blocks of which nothing reached the device.
    pub lost: u64,
    /// Unsynced blocks of which only the first sectors reached the device.
    pub torn: u64,
}

/// A disk of `regions` equal regions that loses unsynced writes at a crash. See the module
/// documentation.
#[derive(Debug)]
pub struct ModelDisk {
    state: Mutex<DiskState>,
}

#[derive(Debug)]
struct DiskState {
    region_bytes: usize,
    regions: Vec<ModelRegion>,
    faults: DiskFaults,
    rng: Draws,
}

/// The caller's random source: uniform 64-bit values.
pub type RandomSource = Box<dyn FnMut() -> u64 + Send>;

/// Draws from a [`RandomSource`].
struct Draws(RandomSource);

impl std::fmt::Debug for Draws {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Draws(..)")
    }
}

impl Draws {
    /// A value in `0..bound` (0 when `bound` is 0).
    fn below(&mut self, bound: u64) -> u64 {
        (self.0)().checked_rem(bound).unwrap_or(0)
    }

    /// True `percent` times in a hundred.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug)]
struct ModelRegion {
    /// What the device holds.
    durable: Vec<u8>,
    /// What a reader sees: `durable` with the unsynced writes applied.
    cached: Vec<u8>,
    /// Blocks written since their last sync.
    dirty: BTreeSet<usize>,
}

impl ModelDisk {
    /// A zeroed disk of `regions` regions of `region_bytes` each (a multiple of 4 KiB), its
    /// faults and crashes drawn from `random`.
    pub fn new(
        regions: u32,
        region_bytes: u64,
        faults: DiskFaults,
        random: RandomSource,
    ) -> Arc<ModelDisk> {
        let region_bytes = usize::try_from(region_bytes).unwrap_or(usize::MAX);
        assert!(region_bytes % MODEL_BLOCK_BYTES == 0, "whole blocks");
        let regions = (0..regions)
            .map(|_| ModelRegion {
                durable: vec![0; region_bytes],
                cached: vec![0; region_bytes],
                dirty: BTreeSet::new(),
            })
            .collect();
        Arc::new(ModelDisk {
            state: Mutex::new(DiskState {
                region_bytes,
                regions,
                faults,
                rng: Draws(random),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, DiskState> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Regions on the disk.
    pub fn regions(&self) -> u32 {
        self.state().regions.len() as u32
    }

    /// Changes the fault rates from the next call.
    pub fn set_faults(&self, faults: DiskFaults) {
        self.state().faults = faults;
    }

    /// Reads what a reader sees at `offset` of `region`: bytes past the region's end are
    /// not read (a short count).
    pub fn read_at(&self, region: u32, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        let state = self.state();
        let cached = &state.region(region)?.cached;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(cached.len());
        let length = buffer.len().min(cached.len() - start);
        buffer[..length].copy_from_slice(&cached[start..start + length]);
        Ok(length)
    }

    /// Writes `bytes` at `offset` of `region` into the cache (unsynced), or fails whole
    /// with `EIO` at the configured rate; bytes past the region's end are not written.
    pub fn write_at(&self, region: u32, bytes: &[u8], offset: u64) -> io::Result<usize> {
        let mut state = self.state();
        let percent = state.faults.write_error_percent;
        if state.rng.chance(percent) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let target = state.region_mut(region)?;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(target.cached.len());
        let length = bytes.len().min(target.cached.len() - start);
        target.cached[start..start + length].copy_from_slice(&bytes[..length]);
        if length > 0 {
            let blocks = start / MODEL_BLOCK_BYTES..=(start + length - 1) / MODEL_BLOCK_BYTES;
            target.dirty.extend(blocks);
        }
        Ok(length)
    }

    /// Makes `region`'s unsynced writes durable, or fails with `EIO` at the configured rate
    /// and leaves them unsynced.
    pub fn sync(&self, region: u32) -> io::Result<()> {
        let mut state = self.state();
        let percent = state.faults.sync_error_percent;
        if state.rng.chance(percent) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let target = state.region_mut(region)?;
        for block in std::mem::take(&mut target.dirty) {
            let range = block * MODEL_BLOCK_BYTES..(block + 1) * MODEL_BLOCK_BYTES;
            target.durable[range.clone()].copy_from_slice(&target.cached[range]);
        }
        Ok(())
    }

    /// A power cut: each unsynced block reaches the device whole, not at all, or torn (its
    /// first 1 to 7 sectors), one third each; then readers see only what the device holds.
    pub fn crash(&self) -> CrashReport {
        let mut state = self.state();
        let DiskState { regions, rng, .. } = &mut *state;
        let mut report = CrashReport::default();
        for region in regions.iter_mut() {
            for block in std::mem::take(&mut region.dirty) {
                let start = block * MODEL_BLOCK_BYTES;
                let reached = match rng.below(3) {
                    0 => {
                        report.kept += 1;
                        MODEL_BLOCK_BYTES
                    }
                    1 => {
                        report.lost += 1;
                        0
                    }
                    _ => {
                        report.torn += 1;
                        SECTOR_BYTES * (1 + rng.below(7) as usize)
                    }
                };
                let range = start..start + reached;
                region.durable[range.clone()].copy_from_slice(&region.cached[range]);
            }
            region.cached.copy_from_slice(&region.durable);
        }
        report
    }

    /// Flips one bit of a block the device holds in `region` (bit rot): a block chosen
    /// among those not all zero, when the region has one. Returns the byte offset flipped.
    pub fn corrupt(&self, region: u32) -> Option<u64> {
        let mut state = self.state();
        let region_bytes = state.region_bytes;
        let DiskState { regions, rng, .. } = &mut *state;
        let target = regions.get_mut(region as usize)?;
        let written: Vec<usize> = (0..region_bytes / MODEL_BLOCK_BYTES)
            .filter(|block| {
                let range = block * MODEL_BLOCK_BYTES..(block + 1) * MODEL_BLOCK_BYTES;
                target.durable[range].iter().any(|byte| *byte != 0)
            })
            .collect();
        if written.is_empty() {
            return None;
        }
        let block = written[rng.below(written.len() as u64) as usize];
        let offset = block * MODEL_BLOCK_BYTES + rng.below(MODEL_BLOCK_BYTES as u64) as usize;
        let bit = 1u8 << rng.below(8);
        target.durable[offset] ^= bit;
        target.cached[offset] ^= bit;
        Some(offset as u64)
    }
}

impl DiskState {
    fn region(&self, region: u32) -> io::Result<&ModelRegion> {
        self.regions
            .get(region as usize)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    fn region_mut(&mut self, region: u32) -> io::Result<&mut ModelRegion> {
        self.regions
            .get_mut(region as usize)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeded(seed: u64) -> RandomSource {
        let mut rng = crate::rng::SplitMix64::new(seed);
        Box::new(move || rng.next_u64())
    }

    const REGION: u64 = 4 * MODEL_BLOCK_BYTES as u64;

    #[test]
    fn a_synced_write_survives_every_crash_and_an_unsynced_one_may_not() {
        let disk = ModelDisk::new(2, REGION, DiskFaults::default(), seeded(7));
        let mut outcomes = CrashReport::default();
        for round in 0..64u8 {
            disk.write_at(0, &[round + 1; 100], 10).unwrap();
            disk.sync(0).unwrap();
            disk.write_at(1, &[round + 1; MODEL_BLOCK_BYTES], 0)
                .unwrap();
            let report = disk.crash();
            outcomes.kept += report.kept;
            outcomes.lost += report.lost;
            outcomes.torn += report.torn;
            let mut synced = [0; 100];
            disk.read_at(0, &mut synced, 10).unwrap();
            assert_eq!(synced, [round + 1; 100]);
            let mut unsynced = vec![0; MODEL_BLOCK_BYTES];
            disk.read_at(1, &mut unsynced, 0).unwrap();
            let reached = unsynced
                .iter()
                .take_while(|byte| **byte == round + 1)
                .count();
            assert!(
                reached % SECTOR_BYTES == 0,
                "whole sectors reach the device"
            );
        }
        // All three fates happen over 64 crashes.
        assert!(
            outcomes.kept > 0 && outcomes.lost > 0 && outcomes.torn > 0,
            "{outcomes:?}"
        );
    }

    #[test]
    fn faults_fail_whole_calls_and_a_failed_sync_keeps_writes_unsynced() {
        let disk = ModelDisk::new(
            1,
            REGION,
            DiskFaults {
                write_error_percent: 100,
                sync_error_percent: 0,
            },
            seeded(1),
        );
        assert_eq!(
            disk.write_at(0, &[1; 10], 0).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        disk.set_faults(DiskFaults {
            write_error_percent: 0,
            sync_error_percent: 100,
        });
        disk.write_at(0, &[1; 10], 0).unwrap();
        assert!(disk.sync(0).is_err());
        // Only a crash that lost or tore the block would undo it: with the block dirty,
        // a crash draws its fate; the durable image never had it.
        assert_eq!(disk.state().regions[0].durable[0], 0);
        assert_eq!(disk.state().regions[0].dirty.len(), 1);
        assert!(disk.read_at(3, &mut [0; 1], 0).is_err(), "no such region");
    }

    #[test]
    fn corruption_flips_one_bit_of_a_written_block() {
        let disk = ModelDisk::new(1, REGION, DiskFaults::default(), seeded(3));
        assert_eq!(disk.corrupt(0), None, "nothing written");
        disk.write_at(0, &[0xff; 8], 2 * MODEL_BLOCK_BYTES as u64)
            .unwrap();
        disk.sync(0).unwrap();
        let offset = disk.corrupt(0).unwrap();
        assert_eq!(offset / MODEL_BLOCK_BYTES as u64, 2);
        let mut all = vec![0; REGION as usize];
        disk.read_at(0, &mut all, 0).unwrap();
        let flipped: u32 = all
            .iter()
            .enumerate()
            .map(|(at, byte)| {
                let expected = if (2 * MODEL_BLOCK_BYTES..2 * MODEL_BLOCK_BYTES + 8).contains(&at) {
                    0xff
                } else {
                    0
                };
                (byte ^ expected).count_ones()
            })
            .sum();
        assert_eq!(flipped, 1);
    }
}
