//! A simulated node's SSD tier: the real `SsdStore` on a `ModelDisk` that outlives the
//! node's processes. A crash is a power cut (each unsynced block kept, lost or torn), bits
//! rot now and then, and writes and syncs fail now and then. The directory's demotion tasks
//! spill into it, as `actors::node::ssd::spill` does; a load that misses restores what the
//! store holds into memory and publishes it, with the node core's restore books and its
//! verdict on the read; the engine pins objects to read the disk itself (the node core's
//! pin books) and reads them later; a restarted node scans the disk and reports what the
//! scan kept.
//!
//! What it checks beyond the cluster's rules:
//! * a restore publishes only the object's own bytes (a corrupt read is never served);
//! * a pinned object's bytes stay on the disk until its pin ends (no region is reused
//!   under a pin), checked after every write;
//! * a recovery scan adopts only objects of their region's current fill, the one the
//!   region's durable header names (never a stale header of an earlier fill);
//! * every object the store reported written (READY: synced) and still holds survives a
//!   crash, unless a bit of its region rotted.

use super::node::Purpose;
use super::world::{Space, World, BATCH_ITEMS_MAX, OBJECT_BYTES};
use kvtier_core::backends::ssd::disk::{DiskFaults, ModelDisk};
use kvtier_core::backends::ssd::layout::{object_footprint_bytes, RegionHeader, BLOCK_BYTES};
use kvtier_core::backends::ssd::{
    PinnedObject, ReadOutcome, SsdConfig, SsdStore, StoredPlace, WriteBatch,
};
use kvtier_core::directory::{AdoptOutcome, Holding, ReserveItem, ReserveOutcome};
use kvtier_core::model::{
    Location, Medium, NodeId, ObjectId, PoolId, PoolSpec, ReplicaId, Scope, Timestamp,
};
use kvtier_core::node::restores::{restore_verified, RestoreClaims};
use kvtier_core::node::ssd_pins::SsdPinBooks;
use kvtier_core::protocol::messages::{DirectoryReply, DirectoryRequest};
use kvtier_core::rng::SplitMix64;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Objects one region holds, and regions per disk: few, so that regions fill, are
/// reclaimed and are reused often.
const OBJECTS_PER_REGION: u64 = 3;
const REGIONS: u32 = 4;
/// Accesses before the directory spills an object into a node's SSD: every object.
const ADMIT_AFTER_ACCESSES: u32 = 1;
/// How often the disk fails a write or a sync, in percent.
const FAULTS: DiskFaults = DiskFaults {
    write_error_percent: 2,
    sync_error_percent: 2,
};
/// Pins the engine holds at once at most (the node's bound is far higher; few keep the
/// checks cheap and leave regions to reclaim).
const ENGINE_PINS_MAX: usize = 3;
/// Bit flips remembered per disk: rot older than this many flips is forgotten.
const FLIPS_MAX: usize = 64;

/// One region's bytes: its header block and [`OBJECTS_PER_REGION`] objects.
pub fn region_bytes() -> u64 {
    BLOCK_BYTES + OBJECTS_PER_REGION * object_footprint_bytes(OBJECT_BYTES)
}

/// The store every simulated node opens on its disk.
pub fn ssd_config() -> SsdConfig {
    SsdConfig {
        region_bytes: region_bytes(),
        object_bytes_max: OBJECT_BYTES,
        queue_depth: 2,
        keep_on_restart: true,
        admit_after_accesses: ADMIT_AFTER_ACCESSES,
        ..SsdConfig::new(
            PathBuf::from("/nonexistent/kvtier-sim-ssd"),
            u64::from(REGIONS) * region_bytes(),
        )
    }
}

/// The SSD pool node `node` registers (and the directory declares under any node id).
pub fn ssd_pool_spec(node: usize, host: NodeId) -> PoolSpec {
    PoolSpec {
        name: format!("ssd{node}"),
        medium: Medium::Ssd,
        scope: Scope::Host(host),
        capacity_bytes: u64::from(REGIONS) * region_bytes(),
        page_bytes: BLOCK_BYTES,
        extent_bytes: None,
        tenancy: kvtier_core::model::PoolTenancy::Shared,
    }
}

/// The bytes of `object`: distinct for every object at every offset, so a stale, misplaced
/// or corrupt read cannot pass for them.
pub fn content(object: &ObjectId) -> Vec<u8> {
    let mut seed = 0u64;
    for byte in object.prefix.0.iter().chain(&object.namespace.0) {
        seed = (seed ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3);
    }
    let mut word = seed;
    let mut bytes = Vec::with_capacity(OBJECT_BYTES as usize);
    while bytes.len() < OBJECT_BYTES as usize {
        word = word.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mixed = (word ^ (word >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        bytes.extend_from_slice(&mixed.to_le_bytes());
    }
    bytes
}

/// A node's disk and what the simulation knows of it; they outlive the node's processes.
pub struct SimDisk {
    pub disk: Arc<ModelDisk>,
    /// Bytes rot flipped, by region and offset in the region (the latest [`FLIPS_MAX`]).
    flips: Vec<(u32, u64)>,
    /// Objects the store reported written and still holds, where it wrote them.
    durable: HashMap<ObjectId, StoredPlace>,
}

impl SimDisk {
    /// A zeroed disk whose faults are drawn from `seed`.
    pub fn new(seed: u64) -> SimDisk {
        let mut draws = SplitMix64::new(seed);
        let disk = ModelDisk::new(
            REGIONS,
            region_bytes(),
            FAULTS,
            Box::new(move || draws.next_u64()),
        );
        SimDisk {
            disk,
            flips: Vec::new(),
            durable: HashMap::new(),
        }
    }

    fn rotted(&self, region: u32) -> bool {
        self.flips.iter().any(|(flipped, _)| *flipped == region)
    }

    /// Whether `object`'s bytes at `place` are on the disk, as a reader of the file sees
    /// them, apart from bytes rot flipped.
    fn holds_intact(&self, object: &ObjectId, place: &StoredPlace) -> bool {
        let region = (place.offset_bytes / region_bytes()) as u32;
        let start = place.offset_bytes % region_bytes();
        let mut found = vec![0u8; place.length_bytes as usize];
        if self.disk.read_at(region, &mut found, start).ok() != Some(found.len()) {
            return false;
        }
        let expected = content(object);
        found
            .iter()
            .zip(&expected)
            .enumerate()
            .filter(|(_, (found, expected))| found != expected)
            .all(|(at, _)| self.flips.contains(&(region, start + at as u64)))
    }
}

/// A node process's SSD store and its books.
pub struct SimSsd {
    pub store: SsdStore,
    pub pool: PoolId,
    restores: RestoreClaims<()>,
    /// Spills whose commit is under way, each pinning its object: target → (object, pin).
    spill_pins: HashMap<ReplicaId, (ObjectId, PinnedObject)>,
    /// The engine's pins, for reading the disk itself, and their numbers.
    engine_pins: SsdPinBooks<(ObjectId, PinnedObject)>,
    engine_pin_numbers: Vec<u64>,
}

impl World {
    /// Opens node `node`'s store on its disk (scanning what a previous process left),
    /// checks what the scan adopted, registers the SSD pool and reports the store's objects.
    pub(super) fn start_ssd(&mut self, node: usize, host: NodeId) {
        let disk = self.disks[node].disk.clone();
        let Ok((store, report)) = SsdStore::open_on_model(ssd_config(), disk) else {
            return;
        };
        self.stats.covered.ssd_opened += 1;
        self.stats.covered.ssd_objects_recovered += report.objects_adopted;
        self.stats.covered.ssd_torn_objects += report.torn_objects;
        self.check_recovered(node, &store);
        let Some(pool) = self.register_ssd(node, host) else {
            return;
        };
        self.spaces.insert(pool, Space::Ssd { node });
        self.nodes[node].ssd = Some(SimSsd {
            store,
            pool,
            restores: RestoreClaims::default(),
            spill_pins: HashMap::new(),
            engine_pins: SsdPinBooks::default(),
            engine_pin_numbers: Vec::new(),
        });
        self.report_stored(node);
    }

    /// Registers node `node`'s SSD pool and its admission; its id.
    pub(super) fn register_ssd(&mut self, node: usize, host: NodeId) -> Option<PoolId> {
        let DirectoryReply::Pool(pool) = self.call(
            node,
            DirectoryRequest::RegisterPool(ssd_pool_spec(node, host)),
        ) else {
            return None;
        };
        let admission = DirectoryRequest::AdmitAfter {
            pool,
            accesses: ADMIT_AFTER_ACCESSES,
        };
        match self.call(node, admission) {
            DirectoryReply::Error(_) => None,
            _ => Some(pool),
        }
    }

    /// The checks of a store opened on a disk a crashed process left: every object adopted
    /// is of its region's current fill, and every object written durably is still there.
    fn check_recovered(&mut self, node: usize, store: &SsdStore) {
        let seed = self.stats.seed;
        let sim_disk = &mut self.disks[node];
        let mut header = vec![0u8; BLOCK_BYTES as usize];
        for (object, place) in store.objects() {
            let region = (place.offset_bytes / region_bytes()) as u32;
            let read = sim_disk.disk.read_at(region, &mut header, 0).ok();
            let sequence = (read == Some(header.len()))
                .then(|| RegionHeader::decode(&header))
                .flatten()
                .map(|header| header.sequence);
            assert_eq!(
                sequence,
                Some(place.generation),
                "seed={seed}: node {node}'s recovery adopted {object:?} of fill {} in region \
                 {region}, whose header names fill {sequence:?}",
                place.generation
            );
        }
        for (object, place) in &sim_disk.durable {
            let region = (place.offset_bytes / region_bytes()) as u32;
            assert!(
                store.length_of(object).is_some() || sim_disk.rotted(region),
                "seed={seed}: node {node}'s store reported {object:?} written at {place:?} \
                 and lost it at a crash"
            );
        }
        sim_disk.durable = store.objects().into_iter().collect();
    }

    /// Reports what the store holds for the directory to adopt, as a starting node does;
    /// what it adopts (or knew) is the node's. Stops at the first refusal or pacing: the
    /// rest stays in the store, unpublished, until a restart reports it again.
    fn report_stored(&mut self, node: usize) {
        let Some(ssd) = &self.nodes[node].ssd else {
            return;
        };
        let pool = ssd.pool;
        let holdings: Vec<Holding> = ssd
            .store
            .objects()
            .into_iter()
            .map(|(object, place)| Holding {
                object,
                location: place.location(pool),
            })
            .collect();
        for batch in holdings.chunks(BATCH_ITEMS_MAX as usize) {
            let request = DirectoryRequest::Adopt {
                holdings: batch.to_vec(),
            };
            let DirectoryReply::Adopted(outcomes) = self.call(node, request) else {
                return;
            };
            self.tick_items += batch.len() as u32;
            for (holding, outcome) in batch.iter().zip(outcomes) {
                if matches!(outcome, AdoptOutcome::Adopted | AdoptOutcome::Known) {
                    self.nodes[node].core.holdings.published(*holding);
                    self.stats.covered.ssd_objects_adopted += 1;
                }
            }
        }
    }

    /// A power cut under node `node`'s process: the disk keeps, loses or tears each
    /// unsynced block.
    pub(super) fn crash_disk(&mut self, node: usize) {
        // What must survive: what the store reported written and holds at the cut (it
        // dropped what a read found corrupt, what it replaced and what it was told to).
        if let Some(ssd) = self.nodes[node].ssd.take() {
            let held: HashMap<ObjectId, StoredPlace> = ssd.store.objects().into_iter().collect();
            self.disks[node]
                .durable
                .retain(|object, place| held.get(object) == Some(place));
        }
        let report = self.disks[node].disk.crash();
        self.stats.covered.disk_blocks_torn += report.torn;
        self.stats.covered.disk_blocks_lost += report.lost;
    }

    /// A bit of a written block of a random disk and region rots.
    pub(super) fn rot(&mut self) {
        let node = self.rng.below(self.disks.len() as u64) as usize;
        let region = self.rng.below(u64::from(REGIONS)) as u32;
        let sim_disk = &mut self.disks[node];
        if let Some(offset) = sim_disk.disk.corrupt(region) {
            if sim_disk.flips.len() >= FLIPS_MAX {
                sim_disk.flips.remove(0);
            }
            sim_disk.flips.push((region, offset));
            self.stats.covered.disk_bits_rotted += 1;
        }
    }

    /// A demotion task into node `node`'s SSD pool: the source's bytes are written to the
    /// store (or found there), pinned until the commit's answer, and the target committed.
    pub(super) fn spill(
        &mut self,
        node: usize,
        source: Location,
        target: ReplicaId,
        target_pool: PoolId,
    ) {
        let ours = self.nodes[node]
            .ssd
            .as_ref()
            .is_some_and(|ssd| ssd.pool == target_pool);
        let label = self.nodes[node].core.holdings.object_at(&source);
        let bytes_of = self
            .spaces
            .get(&source.pool)
            .and_then(|space| self.memory.get(&(*space, source.offset_bytes)))
            .copied();
        let staged = match (label, bytes_of) {
            (Some(label), Some(bytes_of)) if ours => self.stage(node, label, bytes_of, source),
            _ => None,
        };
        let Some((pool, label, pinned)) = staged else {
            self.stats.covered.ssd_spills_skipped += 1;
            return self.send(
                node,
                DirectoryRequest::Abort { replica: target },
                Purpose::Plain,
            );
        };
        let location = pinned.place().location(pool);
        let Some(operation) = self.operation(node) else {
            if let Some(ssd) = self.nodes[node].ssd.as_mut() {
                ssd.store.unpin(pinned);
            }
            return self.send(
                node,
                DirectoryRequest::Abort { replica: target },
                Purpose::Plain,
            );
        };
        if let Some(ssd) = self.nodes[node].ssd.as_mut() {
            if let Some((_, earlier)) = ssd.spill_pins.insert(target, (label, pinned)) {
                ssd.store.unpin(earlier);
            }
        }
        self.stats.covered.ssd_spills += 1;
        self.send_commit(node, operation, label, target, location, None);
    }

    /// Writes `bytes_of`'s bytes as `label` into node `node`'s store (a copy already there
    /// is used as it is) and pins it, as `actors::node::ssd::stage` does.
    fn stage(
        &mut self,
        node: usize,
        label: ObjectId,
        bytes_of: ObjectId,
        source: Location,
    ) -> Option<(PoolId, ObjectId, PinnedObject)> {
        let ssd = self.nodes[node].ssd.as_ref()?;
        if let Some(pinned) = ssd.store.pin(&label) {
            if pinned.length_bytes == source.length_bytes {
                return Some((ssd.pool, label, pinned));
            }
            ssd.store.unpin(pinned);
        }
        let bytes = content(&bytes_of);
        let mut written = ssd.store.write_batch(&[(label, &bytes)]);
        let pool = ssd.pool;
        let result = written.results.pop();
        self.retire_evicted(node, pool, &mut written);
        let ssd = self.nodes[node].ssd.as_ref()?;
        if !matches!(result, Some(Ok(_))) {
            return None;
        }
        let pinned = ssd.store.pin(&label)?;
        self.disks[node].durable.insert(label, pinned.place());
        self.check_pins(node);
        Some((pool, label, pinned))
    }

    /// Objects a write's region reclaim dropped: no longer the node's, retired at the
    /// directory.
    fn retire_evicted(&mut self, node: usize, pool: PoolId, written: &mut WriteBatch) {
        let mut holdings = Vec::new();
        for (object, place) in written.evicted.drain(..) {
            let sim_disk = &mut self.disks[node];
            if sim_disk.durable.get(&object) == Some(&place) {
                sim_disk.durable.remove(&object);
            }
            let region = (place.offset_bytes / region_bytes()) as u32;
            sim_disk.flips.retain(|(flipped, _)| *flipped != region);
            let location = place.location(pool);
            self.nodes[node].core.holdings.freed(&location);
            holdings.push(Holding { object, location });
            self.stats.covered.ssd_evictions += 1;
        }
        for batch in holdings.chunks(BATCH_ITEMS_MAX as usize) {
            let request = DirectoryRequest::RetireHeld {
                holdings: batch.to_vec(),
            };
            self.send(node, request, Purpose::Plain);
        }
    }

    /// The store drops `location`'s object (a retired replica, or a refused commit).
    pub(super) fn drop_stored(&mut self, node: usize, location: Location) -> u64 {
        let object = self.nodes[node].core.holdings.object_at(&location);
        self.nodes[node].core.holdings.freed(&location);
        let place = StoredPlace::of_location(&location);
        if let (Some(object), Some(ssd)) = (object, self.nodes[node].ssd.as_ref()) {
            if ssd.store.remove(&object, &place) {
                self.disks[node].durable.remove(&object);
            }
        }
        location.length_bytes
    }

    /// The commit of a spill into `replica` was answered: its pin ends.
    pub(super) fn spill_answered(&mut self, node: usize, replica: ReplicaId) {
        if let Some(ssd) = self.nodes[node].ssd.as_mut() {
            if let Some((_, pinned)) = ssd.spill_pins.remove(&replica) {
                ssd.store.unpin(pinned);
            }
        }
    }

    /// Restores the missed `objects` node `node`'s store holds: each claimed in the node
    /// core's restore books and reserved in memory; read when the reservation is granted.
    pub(super) fn restore(&mut self, node: usize, objects: &[ObjectId]) {
        let Some(ssd) = self.nodes[node].ssd.as_mut() else {
            return;
        };
        let SimSsd {
            store, restores, ..
        } = ssd;
        let claimed = restores.claim(objects, |object| store.length_of(object).is_some(), |_| ());
        let wanted: Vec<(ObjectId, u64)> = claimed
            .claimed
            .into_iter()
            .filter_map(|object| Some((object, store.length_of(&object)?)))
            .collect();
        for (object, length_bytes) in wanted {
            let Some(operation) = self.operation(node) else {
                self.restore_ended(node, &object);
                continue;
            };
            let item = ReserveItem {
                object,
                length_bytes,
            };
            let request = DirectoryRequest::Reserve { operation, item };
            self.send(node, request, Purpose::Restore { object });
        }
    }

    /// The restore of `object` ended, published or not.
    pub(super) fn restore_ended(&mut self, node: usize, object: &ObjectId) {
        if let Some(ssd) = self.nodes[node].ssd.as_mut() {
            ssd.restores.finish(object);
        }
    }

    /// A restore's reservation was answered: its pages are allocated and the read starts
    /// (`super::copies`).
    pub(super) fn restore_reserved(
        &mut self,
        node: usize,
        reply: DirectoryReply,
        object: ObjectId,
    ) {
        self.restore_ended(node, &object);
        let DirectoryReply::Reserved(ReserveOutcome::Granted { replica, pool, .. }) = reply else {
            return;
        };
        let Some((location, space)) = self.allocate(node, pool) else {
            return self.send(node, DirectoryRequest::Abort { replica }, Purpose::Plain);
        };
        self.start_restore_read(node, object, replica, location, space);
    }

    /// A restore's read ended: the object read from the store is published when the node
    /// core's verdict allows (its checksum held and every byte arrived).
    pub(super) fn end_restore_read(
        &mut self,
        node: usize,
        object: ObjectId,
        replica: ReplicaId,
        location: Location,
        space: Space,
    ) {
        let (outcome, bytes) = match self.nodes[node].ssd.as_ref() {
            Some(ssd) => read_one(&ssd.store, object),
            None => (None, Vec::new()),
        };
        if matches!(outcome, Some(ReadOutcome::Corrupt)) {
            self.stats.covered.ssd_corrupt_reads += 1;
        }
        let whole = bytes.len() as u64 == location.length_bytes;
        if !restore_verified(outcome.as_ref(), whole) {
            self.stats.covered.ssd_restores_refused += 1;
            self.free(node, location).ok();
            return self.send(node, DirectoryRequest::Abort { replica }, Purpose::Plain);
        }
        assert!(
            bytes == content(&object),
            "seed={}: node {node} restored bytes that are not {object:?}'s and published them",
            self.stats.seed
        );
        self.write(space, location.offset_bytes, object);
        self.stats.covered.ssd_restores += 1;
        self.commit_copy(node, object, replica, location);
    }

    /// The engine of node `node` pins an object its store holds, to read the disk itself,
    /// or reads and unpins one it pinned.
    pub(super) fn engine_ssd_step(&mut self, node: usize) {
        let now = self.now;
        let read_one_pin = self.rng.chance(50);
        let pick = self.rng.next_u64();
        let Some(ssd) = self.nodes[node].ssd.as_mut() else {
            return;
        };
        if read_one_pin && !ssd.engine_pin_numbers.is_empty() {
            let at = (pick % ssd.engine_pin_numbers.len() as u64) as usize;
            let number = ssd.engine_pin_numbers.swap_remove(at);
            let ended = ssd.engine_pins.end(&[number]);
            for (object, pinned) in ended {
                let intact = self.disks[node].holds_intact(&object, &pinned.place());
                assert!(
                    intact,
                    "seed={}: node {node}'s engine read {object:?} under its SSD pin and \
                     found other bytes",
                    self.stats.seed
                );
                self.stats.covered.ssd_pins_read += 1;
                if let Some(ssd) = self.nodes[node].ssd.as_mut() {
                    ssd.store.unpin(pinned);
                }
            }
            return;
        }
        let objects = ssd.store.objects();
        if objects.is_empty()
            || ssd.engine_pin_numbers.len() >= ENGINE_PINS_MAX
            || ssd.engine_pins.admit(1).is_err()
        {
            return;
        }
        let (object, _) = objects[(pick % objects.len() as u64) as usize];
        if let Some(pinned) = ssd.store.pin_for_reader(&object) {
            let number = ssd.engine_pins.book((object, pinned), now);
            ssd.engine_pin_numbers.push(number);
        }
    }

    /// Ends the engine's pins that lapsed at `now` (it stopped reading under them).
    pub(super) fn end_lapsed_pins(&mut self, node: usize, now: Timestamp) {
        if let Some(ssd) = self.nodes[node].ssd.as_mut() {
            for (_, pinned) in ssd.engine_pins.end_lapsed(now) {
                ssd.store.unpin(pinned);
            }
        }
    }

    /// Every pinned object of node `node` (its spills' and its engine's) is still on the
    /// disk, byte for byte: no write reused a pinned region.
    fn check_pins(&self, node: usize) {
        let Some(ssd) = self.nodes[node].ssd.as_ref() else {
            return;
        };
        let pinned = ssd.spill_pins.values().chain(ssd.engine_pins.held());
        for (object, pin) in pinned {
            assert!(
                self.disks[node].holds_intact(object, &pin.place()),
                "seed={}: node {node}'s store wrote over {object:?} while it was pinned",
                self.stats.seed
            );
        }
    }
}

/// Reads `object` from `store`: the read's outcome and the bytes the sink got.
fn read_one(store: &SsdStore, object: ObjectId) -> (Option<ReadOutcome>, Vec<u8>) {
    let mut bytes = Vec::new();
    let mut outcomes = store.read_batch(&[object], |_, offset, chunk| {
        if offset == bytes.len() {
            bytes.extend_from_slice(chunk);
        }
    });
    (outcomes.pop(), bytes)
}
