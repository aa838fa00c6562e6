//! The SSD store on a model disk that loses unsynced writes, tears blocks at a power cut,
//! rots bits and fails writes and syncs (`super::disk`): over seeded runs of writes, reads,
//! removals, corruptions and crashes, a write the store reported done (READY) survives every
//! crash byte-exact, and no read or recovery ever serves a wrong byte.

use super::disk::{DiskFaults, ModelDisk};
use super::*;
use crate::model::{NamespaceId, ObjectId, PrefixDigest};
use crate::rng::SplitMix64;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

const REGION_BYTES: u64 = 64 << 10;
const REGIONS: u32 = 6;
const OBJECT_BYTES_MAX: u64 = 12 << 10;

fn config() -> SsdConfig {
    SsdConfig {
        region_bytes: REGION_BYTES,
        object_bytes_max: OBJECT_BYTES_MAX,
        queue_depth: 4,
        keep_on_restart: true,
        ..SsdConfig::new(
            std::path::PathBuf::from("/nonexistent/model"),
            u64::from(REGIONS) * REGION_BYTES,
        )
    }
}

fn object(index: u64) -> ObjectId {
    let mut prefix = [0u8; 16];
    prefix[..8].copy_from_slice(&index.to_le_bytes());
    ObjectId {
        namespace: NamespaceId([9; 16]),
        prefix: PrefixDigest(prefix),
        shard: 0,
        part: 0,
    }
}

/// Bytes no other object has at any offset: a misplaced or stale read cannot pass for them.
fn content(index: u64, length: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(index.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ length as u64);
    (0..length).map(|_| rng.next_u64() as u8).collect()
}

/// What a run knows of the store's objects.
#[derive(Default)]
struct Expected {
    /// Reported written (READY): they must survive every crash, unless their region rotted.
    durable: HashMap<ObjectId, Vec<u8>>,
    /// The region of each durable object.
    regions: HashMap<ObjectId, u32>,
    /// Written and failed, removed, or evicted: absent after a crash, or exact.
    maybe: HashMap<ObjectId, Vec<u8>>,
    /// Regions a bit was flipped in: a checksum failure there is the disk's, not the store's.
    rotten: HashSet<u32>,
    next: u64,
}

#[derive(Debug, Default)]
struct RunCounts {
    writes: u64,
    failed_writes: u64,
    crashes: u64,
    lost_blocks: u64,
    torn_blocks: u64,
    verified_after_crash: u64,
}

fn read(store: &SsdStore, id: ObjectId) -> (Option<Vec<u8>>, ReadOutcome) {
    let mut found: Option<Vec<u8>> = None;
    let mut outcomes = store.read_batch(&[id], |_, offset, chunk| {
        let bytes = found.get_or_insert_with(Vec::new);
        assert_eq!(bytes.len(), offset, "chunks in order");
        bytes.extend_from_slice(chunk);
    });
    (found, outcomes.remove(0))
}

impl Expected {
    fn write(&mut self, store: &SsdStore, rng: &mut SplitMix64, counts: &mut RunCounts) {
        let objects: Vec<(ObjectId, Vec<u8>)> = (0..1 + rng.below(4))
            .map(|_| {
                self.next += 1;
                let length = 1 + rng.below(OBJECT_BYTES_MAX) as usize;
                (object(self.next), content(self.next, length))
            })
            .collect();
        let batch: Vec<(ObjectId, &[u8])> = objects
            .iter()
            .map(|(id, bytes)| (*id, bytes.as_slice()))
            .collect();
        let written = store.write_batch(&batch);
        for (id, _) in &written.evicted {
            if let Some(bytes) = self.durable.remove(id) {
                self.maybe.insert(*id, bytes);
            }
        }
        for ((id, bytes), result) in objects.into_iter().zip(written.results) {
            counts.writes += 1;
            if result.is_ok() {
                self.make_durable(store, id, bytes);
            } else {
                counts.failed_writes += 1;
                self.maybe.insert(id, bytes);
            }
        }
    }

    fn make_durable(&mut self, store: &SsdStore, id: ObjectId, bytes: Vec<u8>) {
        let place = store.place_of(&id).expect("a READY object has a place");
        self.regions
            .insert(id, (place.offset_bytes / REGION_BYTES) as u32);
        self.durable.insert(id, bytes);
    }

    fn any_durable(&self, rng: &mut SplitMix64) -> Option<ObjectId> {
        let mut ids: Vec<&ObjectId> = self.durable.keys().collect();
        ids.sort();
        ids.get(rng.below(ids.len().max(1) as u64) as usize)
            .map(|id| **id)
    }

    /// Reads `id`, which the store must hold: exact bytes; in a region the disk rotted, a
    /// checksum failure or, after a crash, a miss (a rotted header ends the recovery scan).
    fn check_durable(&mut self, store: &SsdStore, id: ObjectId, context: &str) {
        let rotten = self
            .regions
            .get(&id)
            .is_some_and(|region| self.rotten.contains(region));
        let (found, outcome) = read(store, id);
        match outcome {
            ReadOutcome::Hit { .. } => assert!(
                found.as_deref() == self.durable.get(&id).map(Vec::as_slice),
                "{context}: wrong bytes served for {id:?}"
            ),
            ReadOutcome::Corrupt | ReadOutcome::Miss if rotten => {
                self.durable.remove(&id);
            }
            other => panic!("{context}: a READY object read {other:?}"),
        }
    }

    fn remove(&mut self, store: &SsdStore, id: ObjectId) {
        if let Some(place) = store.place_of(&id) {
            assert!(store.remove(&id, &place));
        }
        if let Some(bytes) = self.durable.remove(&id) {
            self.maybe.insert(id, bytes);
        }
    }

    /// After a crash and a reopen: every READY object is back and exact (or rotted), every
    /// other object the store adopted was written once and is exact.
    fn check_recovered(&mut self, store: &SsdStore, counts: &mut RunCounts) {
        let mut durable: Vec<ObjectId> = self.durable.keys().copied().collect();
        durable.sort();
        for id in durable {
            self.check_durable(store, id, "after a crash");
            counts.verified_after_crash += 1;
        }
        for (id, _) in store.objects() {
            if self.durable.contains_key(&id) {
                continue;
            }
            let Some(bytes) = self.maybe.remove(&id) else {
                panic!("recovery adopted {id:?}, which was never written");
            };
            let (found, outcome) = read(store, id);
            match outcome {
                // Adopted from what the device holds: durable from now on.
                ReadOutcome::Hit { .. } => {
                    assert!(
                        found == Some(bytes.clone()),
                        "recovery adopted wrong bytes for {id:?}"
                    );
                    self.make_durable(store, id, bytes);
                }
                ReadOutcome::Corrupt => {}
                other => panic!("an adopted object read {other:?}"),
            }
        }
    }
}

fn run(seed: u64, steps: u32, faults: DiskFaults) -> RunCounts {
    let mut disk_rng = SplitMix64::new(seed);
    let random = Box::new(move || disk_rng.next_u64());
    let disk: Arc<ModelDisk> = ModelDisk::new(REGIONS, REGION_BYTES, faults, random);
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let mut store = SsdStore::open_on_model(config(), disk.clone()).unwrap().0;
    let mut expected = Expected::default();
    let mut counts = RunCounts::default();
    for _ in 0..steps {
        match rng.below(100) {
            0..=49 => expected.write(&store, &mut rng, &mut counts),
            50..=74 => {
                if let Some(id) = expected.any_durable(&mut rng) {
                    expected.check_durable(&store, id, "while running");
                }
            }
            75..=84 => {
                if let Some(id) = expected.any_durable(&mut rng) {
                    expected.remove(&store, id);
                }
            }
            85..=89 => {
                let region = rng.below(u64::from(REGIONS)) as u32;
                if disk.corrupt(region).is_some() {
                    expected.rotten.insert(region);
                }
            }
            _ => {
                let crash = disk.crash();
                counts.crashes += 1;
                counts.lost_blocks += crash.lost;
                counts.torn_blocks += crash.torn;
                drop(store);
                store = SsdStore::open_on_model(config(), disk.clone()).unwrap().0;
                expected.check_recovered(&store, &mut counts);
            }
        }
    }
    counts
}

#[test]
fn ready_objects_survive_every_crash_and_no_wrong_byte_is_ever_served() {
    let mut total = RunCounts::default();
    for seed in 0..48 {
        let faults = if seed % 2 == 0 {
            DiskFaults::default()
        } else {
            DiskFaults {
                write_error_percent: 5,
                sync_error_percent: 5,
            }
        };
        let counts = run(seed, 400, faults);
        total.writes += counts.writes;
        total.failed_writes += counts.failed_writes;
        total.crashes += counts.crashes;
        total.lost_blocks += counts.lost_blocks;
        total.torn_blocks += counts.torn_blocks;
        total.verified_after_crash += counts.verified_after_crash;
    }
    // The runs reached what they are about: crashes that lost and tore unsynced blocks,
    // failed writes and syncs, and READY objects checked after crashes.
    assert!(total.crashes > 100, "{total:?}");
    assert!(total.lost_blocks > 0 && total.torn_blocks > 0, "{total:?}");
    assert!(total.failed_writes > 0, "{total:?}");
    assert!(total.verified_after_crash > 1000, "{total:?}");
}
