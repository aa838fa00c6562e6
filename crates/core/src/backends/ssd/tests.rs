//! Tests of the SSD store with real files in a temporary directory.

use super::layout::{region_file_name, BLOCK_BYTES};
use super::*;
use crate::model::{NamespaceId, ObjectId, PrefixDigest};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

fn object(index: u32) -> ObjectId {
    let mut prefix = [0u8; 16];
    prefix[..4].copy_from_slice(&index.to_le_bytes());
    ObjectId {
        namespace: NamespaceId([5; 16]),
        prefix: PrefixDigest(prefix),
        shard: 0,
        part: 0,
    }
}

fn bytes(index: u32, length: usize) -> Vec<u8> {
    (0..length)
        .map(|at| (at as u32).wrapping_mul(31).wrapping_add(index * 7) as u8)
        .collect()
}

fn config(directory: &Path, io_uring: bool) -> SsdConfig {
    SsdConfig {
        region_bytes: 1 << 20,
        object_bytes_max: 256 << 10,
        queue_depth: 8,
        io_uring,
        ..SsdConfig::new(directory.to_path_buf(), 4 << 20)
    }
}

fn read_one(store: &SsdStore, id: ObjectId) -> (Option<Vec<u8>>, ReadOutcome) {
    let mut found: Option<Vec<u8>> = None;
    let mut outcomes = store.read_batch(&[id], |_, offset, chunk| {
        let bytes = found.get_or_insert_with(Vec::new);
        assert_eq!(bytes.len(), offset, "chunks in order");
        bytes.extend_from_slice(chunk);
    });
    (found, outcomes.remove(0))
}

fn write_all(store: &SsdStore, objects: &[(ObjectId, Vec<u8>)]) -> WriteBatch {
    let batch: Vec<(ObjectId, &[u8])> = objects
        .iter()
        .map(|(id, data)| (*id, data.as_slice()))
        .collect();
    let written = store.write_batch(&batch);
    for result in &written.results {
        assert!(result.is_ok(), "{result:?}");
    }
    written
}

#[test]
fn writes_read_back_byte_exact_through_both_io_paths() {
    for io_uring in [true, false] {
        let directory = tempfile::tempdir().unwrap();
        let (store, report) = SsdStore::open(config(directory.path(), io_uring)).unwrap();
        assert_eq!(report.objects_adopted, 0);
        let sizes = [1usize, 4095, 4096, 4097, 100_000, 256 << 10];
        let objects: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(index, size)| (object(index as u32), bytes(index as u32, *size)))
            .collect();
        write_all(&store, &objects);
        let ids: Vec<_> = objects.iter().map(|(id, _)| *id).collect();
        let mut found = vec![Vec::new(); ids.len()];
        let outcomes = store.read_batch(&ids, |index, offset, chunk| {
            assert_eq!(found[index].len(), offset, "chunks in order");
            found[index].extend_from_slice(chunk);
        });
        for (index, outcome) in outcomes.iter().enumerate() {
            assert!(
                matches!(outcome, ReadOutcome::Hit { .. }),
                "{index}: {outcome:?}"
            );
            assert_eq!(
                found[index], objects[index].1,
                "object {index} (io_uring {io_uring})"
            );
        }
        assert!(matches!(read_one(&store, object(99)).1, ReadOutcome::Miss));
        let usage = store.usage();
        assert_eq!(usage.objects, sizes.len() as u64);
        assert_eq!(
            usage.capacity_bytes,
            usage.live_bytes + usage.writing_bytes + usage.reclaimable_bytes + usage.free_bytes
        );
        let pinned = store.pin(&object(4)).unwrap();
        assert_eq!(pinned.offset % BLOCK_BYTES, 0);
        assert_eq!(Some(pinned.place()), store.place_of(&object(4)));
        let mut direct = vec![0u8; 100_000];
        std::fs::File::open(&pinned.path)
            .unwrap()
            .read_exact_at(&mut direct, pinned.offset)
            .unwrap();
        assert_eq!(
            direct, objects[4].1,
            "the pinned extent is the object's bytes in place"
        );
        store.unpin(pinned);
    }
}

#[test]
fn a_flipped_byte_is_a_counted_miss_and_its_space_reclaimable() {
    let directory = tempfile::tempdir().unwrap();
    let (store, _) = SsdStore::open(config(directory.path(), true)).unwrap();
    write_all(
        &store,
        &[(object(1), bytes(1, 50_000)), (object(2), bytes(2, 50_000))],
    );
    let pinned = store.pin(&object(1)).unwrap();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pinned.path)
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, pinned.offset + 777).unwrap();
    byte[0] ^= 0x04;
    file.write_all_at(&byte, pinned.offset + 777).unwrap();
    file.sync_all().unwrap();
    store.unpin(pinned);
    let reclaimable_before = store.usage().reclaimable_bytes;
    // The bytes reach the sink before the verdict; the verdict says not to keep them.
    let (_, outcome) = read_one(&store, object(1));
    assert!(matches!(outcome, ReadOutcome::Corrupt), "{outcome:?}");
    assert_eq!(
        store
            .counters()
            .checksum_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert!(matches!(read_one(&store, object(1)).1, ReadOutcome::Miss));
    assert!(store.usage().reclaimable_bytes > reclaimable_before);
    assert_eq!(read_one(&store, object(2)).0, Some(bytes(2, 50_000)));
}

#[test]
fn a_restart_adopts_complete_objects_and_drops_torn_ones() {
    let directory = tempfile::tempdir().unwrap();
    let objects: Vec<_> = (0..6)
        .map(|index| (object(index), bytes(index, 60_000)))
        .collect();
    let torn_offset;
    {
        let (store, _) = SsdStore::open(config(directory.path(), true)).unwrap();
        write_all(&store, &objects);
        let pinned = store.pin(&object(3)).unwrap();
        torn_offset = (pinned.path.clone(), pinned.offset);
        store.unpin(pinned);
    }
    // A write cut short: the object's last blocks never reached the disk.
    let file = OpenOptions::new().write(true).open(&torn_offset.0).unwrap();
    file.write_all_at(&vec![0u8; 8192], torn_offset.1 + 49_152)
        .unwrap();
    let (store, report) = SsdStore::open(config(directory.path(), false)).unwrap();
    assert_eq!(report.objects_adopted, 5);
    assert_eq!(report.torn_objects, 1);
    for (id, data) in &objects {
        let (found, _) = read_one(&store, *id);
        if *id == object(3) {
            assert_eq!(found, None, "the torn object is absent");
        } else {
            assert_eq!(found.as_ref(), Some(data));
        }
    }
    // Writes after the restart open a new fill; both survive a second restart.
    write_all(&store, &[(object(10), bytes(10, 9000))]);
    drop(store);
    let (store, report) = SsdStore::open(config(directory.path(), true)).unwrap();
    assert_eq!(report.objects_adopted, 6);
    assert_eq!(read_one(&store, object(10)).0, Some(bytes(10, 9000)));
}

#[test]
fn keep_on_restart_false_wipes_the_store() {
    let directory = tempfile::tempdir().unwrap();
    {
        let (store, _) = SsdStore::open(config(directory.path(), true)).unwrap();
        write_all(&store, &[(object(1), bytes(1, 10_000))]);
    }
    let wiping = SsdConfig {
        keep_on_restart: false,
        ..config(directory.path(), true)
    };
    let (store, report) = SsdStore::open(wiping).unwrap();
    assert_eq!(report.objects_adopted, 0);
    assert!(matches!(read_one(&store, object(1)).1, ReadOutcome::Miss));
    drop(store);
    let (_, report) = SsdStore::open(config(directory.path(), true)).unwrap();
    assert_eq!(
        report.objects_adopted, 0,
        "the wiped object does not come back"
    );
}

#[test]
fn a_full_store_reclaims_its_oldest_region_whole_never_a_pinned_one_and_pins_leave_one() {
    let directory = tempfile::tempdir().unwrap();
    let (store, _) = SsdStore::open(config(directory.path(), true)).unwrap();
    // 252 KiB objects: three per 1 MiB region, four regions.
    let size = 252 << 10;
    let first: Vec<_> = (0..12)
        .map(|index| (object(index), bytes(index, size)))
        .collect();
    let written = write_all(&store, &first);
    assert!(written.evicted.is_empty());
    let written = write_all(&store, &[(object(100), bytes(100, size))]);
    let mut evicted: Vec<ObjectId> = written.evicted.iter().map(|(id, _)| *id).collect();
    evicted.sort_by_key(|id| id.prefix.0);
    assert_eq!(
        evicted,
        vec![object(0), object(1), object(2)],
        "the oldest region goes whole"
    );
    assert!(matches!(read_one(&store, object(0)).1, ReadOutcome::Miss));
    assert_eq!(read_one(&store, object(100)).0, Some(bytes(100, size)));
    assert_eq!(
        store
            .counters()
            .regions_reclaimed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // Readers may pin all regions but two: the third sealed region is not pinned, so one
    // region always stays reclaimable, whoever pins.
    let pins: Vec<_> = [3, 6, 4]
        .iter()
        .map(|index| store.pin_for_reader(&object(*index)).unwrap())
        .collect();
    assert!(
        store.pin_for_reader(&object(9)).is_none(),
        "a third region pinned"
    );
    // The node's own short pins (a restore's read) are not bounded by it.
    let own = store.pin(&object(9)).unwrap();
    store.unpin(own);
    let batch: Vec<(ObjectId, Vec<u8>)> = (200..203)
        .map(|index| (object(index), bytes(index, size)))
        .collect();
    let refs: Vec<(ObjectId, &[u8])> = batch
        .iter()
        .map(|(id, data)| (*id, data.as_slice()))
        .collect();
    // The next region switch reclaims the unpinned one, never a pinned one.
    let written = store.write_batch(&refs);
    assert!(
        written.results.iter().all(Result::is_ok),
        "{:?}",
        written.results
    );
    let evicted: Vec<ObjectId> = written.evicted.iter().map(|(id, _)| *id).collect();
    assert!(evicted.contains(&object(9)), "{evicted:?}");
    assert!(!evicted.contains(&object(3)) && !evicted.contains(&object(6)));
    assert_eq!(read_one(&store, object(3)).0, Some(bytes(3, size)));
    // However much is written, the two unpinned regions take turns and the pinned ones
    // stay whole until unpinned.
    for chunk in (400..406).collect::<Vec<u32>>().chunks(2) {
        let more: Vec<(ObjectId, Vec<u8>)> = chunk
            .iter()
            .map(|index| (object(*index), bytes(*index, size)))
            .collect();
        let results = write_all(&store, &more).results;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
    for index in [3, 4, 6] {
        assert_eq!(read_one(&store, object(index)).0, Some(bytes(index, size)));
    }
    for pinned in pins {
        store.unpin(pinned);
    }
    // Unpinned, the oldest region goes at the next switch.
    let last: Vec<(ObjectId, Vec<u8>)> = (300..303)
        .map(|index| (object(index), bytes(index, size)))
        .collect();
    assert!(write_all(&store, &last)
        .evicted
        .iter()
        .any(|(id, _)| *id == object(3)));
}

#[test]
fn bad_input_is_refused_with_a_typed_error() {
    let directory = tempfile::tempdir().unwrap();
    let (store, _) = SsdStore::open(config(directory.path(), true)).unwrap();
    let big = vec![0u8; (256 << 10) + 1];
    let results = store.write_batch(&[(object(1), big.as_slice())]).results;
    assert!(matches!(results[0], Err(SsdError::TooLarge { .. })));
    assert_eq!(
        store.counters().skipped[SkipReason::TooLarge.index()]
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let file = directory.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let error = SsdStore::open(config(&file.join("store"), true))
        .err()
        .unwrap();
    assert_eq!(error.skip_reason(), SkipReason::MissingDirectory, "{error}");
    let odd_region = SsdConfig {
        region_bytes: 5000,
        ..config(directory.path(), true)
    };
    let nothing_in_flight = SsdConfig {
        in_flight_bytes_max: 0,
        ..config(directory.path(), true)
    };
    for invalid in [odd_region, nothing_in_flight] {
        assert!(matches!(
            SsdStore::open(invalid),
            Err(SsdError::InvalidConfig { .. })
        ));
    }
    assert!(directory.path().join(region_file_name(0)).exists());
}

/// A 2 MiB tmpfs mounted on a fresh directory for one test, unmounted when dropped.
struct SmallFileSystem {
    directory: tempfile::TempDir,
}

impl SmallFileSystem {
    /// `None` where this process may not mount (not root, or in a sandbox).
    fn mount() -> Option<SmallFileSystem> {
        let directory = tempfile::tempdir().ok()?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
            .arg(directory.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        mounted.then_some(SmallFileSystem { directory })
    }
}

impl Drop for SmallFileSystem {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.directory.path())
            .status();
    }
}

#[test]
fn a_full_file_system_skips_spills_with_a_counted_reason_and_keeps_what_it_holds() {
    let Some(small) = SmallFileSystem::mount() else {
        eprintln!(
            "cannot mount a small tmpfs here: the ENOSPC case is covered where tests run as root"
        );
        return;
    };
    // 8 MiB of regions on a 2 MiB file system: the region files are sparse until written.
    let config = SsdConfig {
        capacity_bytes: 8 << 20,
        ..config(&small.directory.path().join("store"), true)
    };
    let (store, _) = SsdStore::open(config).unwrap();
    let objects: Vec<_> = (0..24)
        .map(|index| (object(index), bytes(index, 100_000)))
        .collect();
    let refs: Vec<(ObjectId, &[u8])> = objects
        .iter()
        .map(|(id, data)| (*id, data.as_slice()))
        .collect();
    let results = store.write_batch(&refs).results;
    let written = results.iter().take_while(|result| result.is_ok()).count();
    assert!(
        written > 0 && written < objects.len(),
        "{written} of {} written",
        objects.len()
    );
    assert!(
        results[written..]
            .iter()
            .all(|result| matches!(result, Err(SsdError::NoSpace { .. }))),
        "{:?}",
        &results[written..]
    );
    let skipped = store.counters().skipped[SkipReason::NoSpace.index()]
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(skipped as usize, objects.len() - written);
    for (id, data) in &objects[..written] {
        assert_eq!(
            read_one(&store, *id).0.as_ref(),
            Some(data),
            "what was written stays readable"
        );
    }
    assert!(matches!(
        read_one(&store, objects[written].0).1,
        ReadOutcome::Miss
    ));
}

/// Keeps the CPU busy for `duration` (a completion's checksum and copy, slowed down).
fn busy_for(duration: std::time::Duration) {
    let started = std::time::Instant::now();
    while started.elapsed() < duration {
        std::hint::spin_loop();
    }
}

#[test]
fn slow_completions_submit_early_and_every_read_still_lands_in_its_own_slot() {
    let directory = tempfile::tempdir().unwrap();
    let (store, _) = SsdStore::open(config(directory.path(), true)).unwrap();
    let objects: Vec<_> = (0..40)
        .map(|index| (object(index), bytes(index, 20_000 + index as usize * 512)))
        .collect();
    write_all(&store, &objects);
    let ids: Vec<_> = objects.iter().map(|(id, _)| *id).collect();
    let mut found = vec![Vec::new(); ids.len()];
    let outcomes = store.read_batch(&ids, |index, _, chunk| {
        busy_for(std::time::Duration::from_micros(50));
        found[index].extend_from_slice(chunk);
    });
    for (index, outcome) in outcomes.iter().enumerate() {
        assert!(
            matches!(outcome, ReadOutcome::Hit { .. }),
            "{index}: {outcome:?}"
        );
        assert_eq!(found[index], objects[index].1, "object {index}");
    }
}

#[test]
fn staging_buffers_from_a_huge_page_up_are_aligned_to_it_and_zeroed() {
    use super::io::{AlignedBuffer, HUGE_PAGE_BYTES};
    for round in 0..3 {
        let mut large = AlignedBuffer::new(2 * HUGE_PAGE_BYTES + 1);
        assert_eq!(large.len(), 2 * HUGE_PAGE_BYTES + BLOCK_BYTES as usize);
        assert_eq!(large.as_slice().as_ptr() as usize % HUGE_PAGE_BYTES, 0);
        assert!(
            large.as_slice().iter().all(|byte| *byte == 0),
            "round {round}"
        );
        large.as_mut_slice().fill(0xa5);
        assert!(large.as_slice().iter().all(|byte| *byte == 0xa5));
        let small = AlignedBuffer::new(5000);
        assert_eq!(small.len(), 2 * BLOCK_BYTES as usize);
        assert_eq!(small.as_slice().as_ptr() as usize % BLOCK_BYTES as usize, 0);
        assert!(small.as_slice().iter().all(|byte| *byte == 0));
    }
}

/// Reads of `length`-byte blocks that note the bytes in flight when each starts.
struct CountedReads {
    file: std::fs::File,
    length: usize,
    in_flight: usize,
    peak: usize,
    done: usize,
}

impl super::io::IoRequests for CountedReads {
    fn prepare(&mut self, request: usize, _slot: super::io::Slot<'_>) -> Option<super::io::IoOp> {
        use std::os::fd::AsRawFd;
        self.in_flight += self.length;
        self.peak = self.peak.max(self.in_flight);
        Some(super::io::IoOp {
            kind: super::io::IoKind::Read,
            file: super::disk::IoFile::Fd(self.file.as_raw_fd()),
            offset: (request * self.length) as u64,
            length: self.length,
        })
    }

    fn complete(
        &mut self,
        _request: usize,
        _bytes: &[u8],
        result: std::io::Result<usize>,
        _latency: std::time::Duration,
    ) {
        assert_eq!(result.unwrap(), self.length);
        self.in_flight -= self.length;
        self.done += 1;
    }
}

#[test]
fn the_queue_starts_no_request_past_its_in_flight_byte_bound_and_always_one() {
    use super::io::IoQueue;
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("blocks");
    let length = 64 << 10;
    std::fs::write(&path, vec![7u8; 40 * length]).unwrap();
    // Bound, and the most bytes in flight it allows: while under the bound one more starts.
    for (bound, most) in [
        (200 << 10, 256 << 10),
        (1, length),
        (usize::MAX, 16 * length),
    ] {
        let (mut queue, fallback) = IoQueue::new(16, length, bound, true);
        let mut reads = CountedReads {
            file: std::fs::File::open(&path).unwrap(),
            length,
            in_flight: 0,
            peak: 0,
            done: 0,
        };
        queue.run(40, &mut reads);
        assert_eq!(reads.done, 40, "bound {bound}");
        assert!(
            reads.peak <= most,
            "bound {bound}: {} in flight",
            reads.peak
        );
        if fallback.is_none() {
            // io_uring reaps only once the refill stops: the bound is what stopped it.
            assert_eq!(reads.peak, most, "bound {bound}");
        }
    }
}
