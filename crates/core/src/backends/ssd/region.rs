//! The region table and object index: the sans-I/O core of the SSD store. It decides where
//! each object goes (append into the one active region), which region is reclaimed when
//! none is free (the oldest fill that no write or reader holds: whole regions, never
//! compaction), and which objects are live. It never touches a file; the store performs
//! the I/O it plans and reports back.
//!
//! Bounds: `region_count` regions, each holding at most `region_bytes / 8 KiB` objects
//! (an object takes at least a header block and a data block), so the index holds at most
//! `capacity_bytes / 8 KiB` entries.

use super::layout::{object_footprint_bytes, StoredPlace, BLOCK_BYTES};
use crate::model::ObjectId;
use std::collections::HashMap;

/// Where a live object's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The region file.
    pub region: u32,
    /// Offset of the object's header block in the region file; the data starts one block
    /// later.
    pub header_offset: u64,
    /// Length of the data in bytes.
    pub length_bytes: u64,
    /// The region fill that wrote it.
    pub generation: u64,
    /// crc32c of the data bytes.
    pub data_crc: u32,
}

impl Entry {
    /// Offset of the object's data in its region file (block-aligned).
    pub fn data_offset(&self) -> u64 {
        self.header_offset + BLOCK_BYTES
    }

    /// Bytes the object occupies in its region.
    pub fn footprint_bytes(&self) -> u64 {
        object_footprint_bytes(self.length_bytes)
    }

    /// Where the data is in the address space of a store of regions of `region_bytes`.
    pub fn place(&self, region_bytes: u64) -> StoredPlace {
        StoredPlace::new(
            region_bytes,
            self.region,
            self.data_offset(),
            self.length_bytes,
            self.generation,
        )
    }
}

/// Space set aside for one object write; hand it back through
/// [`RegionTable::commit`] or [`RegionTable::abort`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The region file.
    pub region: u32,
    /// Where the header block goes.
    pub header_offset: u64,
    /// The generation to write in the header.
    pub generation: u64,
    /// The fill's nonce, written in the region's and the object's headers.
    pub nonce: u64,
    /// Bytes set aside (header plus padded data).
    pub footprint_bytes: u64,
}

impl Reservation {
    /// Whether this is the first object of its region's fill (its header right after the
    /// region header): [`RegionTable::reserve`] opened the region for it.
    pub fn starts_fill(&self) -> bool {
        self.header_offset == BLOCK_BYTES
    }
}

/// What [`RegionTable::reserve`] decided besides the reservation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReserveEffects {
    /// Objects dropped from the index because their region was reclaimed, with the entry
    /// each had (its owner retires the copy recorded there).
    pub evicted: Vec<(ObjectId, Entry)>,
    /// Whether a region was reclaimed.
    pub reclaimed_region: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RegionState {
    Free,
    Active,
    Sealed,
}

#[derive(Clone, Debug)]
struct Region {
    state: RegionState,
    sequence: u64,
    /// The nonce of the fill (see [`super::layout::RegionHeader::nonce`]); 0 for a region
    /// not filled since the store opened.
    nonce: u64,
    cursor: u64,
    live_bytes: u64,
    writing_bytes: u64,
    writes: u32,
    pins: u32,
    objects: Vec<ObjectId>,
}

impl Region {
    fn empty() -> Region {
        Region {
            state: RegionState::Free,
            sequence: 0,
            nonce: 0,
            cursor: BLOCK_BYTES,
            live_bytes: 0,
            writing_bytes: 0,
            writes: 0,
            pins: 0,
            objects: Vec::new(),
        }
    }
}

/// Bytes of the store by state, consistent at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SsdUsage {
    /// All region bytes.
    pub capacity_bytes: u64,
    /// Bytes of live objects (headers and padding included).
    pub live_bytes: u64,
    /// Bytes being written.
    pub writing_bytes: u64,
    /// Bytes in filled regions that hold no live object (removed, failed checksum,
    /// superseded): reclaimed with their region.
    pub reclaimable_bytes: u64,
    /// Bytes not yet written in the active region and in free regions.
    pub free_bytes: u64,
    /// Live objects.
    pub objects: u64,
}

/// The regions and the object index.
#[derive(Debug)]
pub struct RegionTable {
    region_bytes: u64,
    regions: Vec<Region>,
    active: Option<u32>,
    next_sequence: u64,
    index: HashMap<ObjectId, Entry>,
    /// Regions holding at least one pin: at most [`RegionTable::pinned_regions_max`].
    pinned_regions: u32,
    /// Draws each fill's nonce: the OS's randomness ([`crate::model::random::u64`]); a test
    /// may fix it.
    nonces: fn() -> u64,
}

impl RegionTable {
    /// An empty table of `region_count` free regions of `region_bytes` each. The caller
    /// guarantees `region_bytes` is a multiple of [`BLOCK_BYTES`] of at least three blocks.
    pub fn new(region_count: u32, region_bytes: u64) -> RegionTable {
        assert!(region_bytes % BLOCK_BYTES == 0 && region_bytes >= 3 * BLOCK_BYTES);
        RegionTable {
            region_bytes,
            regions: vec![Region::empty(); region_count as usize],
            active: None,
            next_sequence: 1,
            index: HashMap::new(),
            pinned_regions: 0,
            nonces: crate::model::random::u64,
        }
    }

    /// The largest object a region can hold.
    pub fn object_bytes_limit(&self) -> u64 {
        self.region_bytes - 2 * BLOCK_BYTES
    }

    /// Adopts a region found by the recovery scan: sealed, with its objects live. Of two
    /// copies of one object the newer generation stays. The caller adopts each region once,
    /// before any write.
    pub fn adopt(
        &mut self,
        region: u32,
        sequence: u64,
        cursor: u64,
        objects: Vec<(ObjectId, Entry)>,
    ) {
        let slot = &mut self.regions[region as usize];
        slot.state = RegionState::Sealed;
        slot.sequence = sequence;
        slot.cursor = cursor;
        self.next_sequence = self.next_sequence.max(sequence + 1);
        for (object, entry) in objects {
            let newer = self
                .index
                .get(&object)
                .is_some_and(|current| current.generation > entry.generation);
            if !newer {
                self.insert(object, entry);
            }
        }
    }

    /// Sets aside space for an object of `length_bytes` in the active region, opening (and
    /// if needed reclaiming) a region when it does not fit. `None` when no region is
    /// free and every filled one has a write or a reader: the caller skips the spill.
    pub fn reserve(&mut self, length_bytes: u64) -> Option<(Reservation, ReserveEffects)> {
        let footprint = object_footprint_bytes(length_bytes);
        assert!(footprint <= self.region_bytes - BLOCK_BYTES);
        let mut effects = ReserveEffects::default();
        let fits = self.active.is_some_and(|index| {
            self.regions[index as usize].cursor + footprint <= self.region_bytes
        });
        if !fits {
            // The fill's first reservation says so itself (`Reservation::starts_fill`), and its
            // generation is the sequence the region's header gets.
            self.open_region(&mut effects)?;
        }
        let index = self.active?;
        let region = &mut self.regions[index as usize];
        let reservation = Reservation {
            region: index,
            header_offset: region.cursor,
            generation: region.sequence,
            nonce: region.nonce,
            footprint_bytes: footprint,
        };
        region.cursor += footprint;
        region.writes += 1;
        region.writing_bytes += footprint;
        Some((reservation, effects))
    }

    fn open_region(&mut self, effects: &mut ReserveEffects) -> Option<u32> {
        let free = self
            .regions
            .iter()
            .position(|region| region.state == RegionState::Free);
        let chosen = match free {
            Some(index) => index,
            None => {
                let oldest = self
                    .regions
                    .iter()
                    .enumerate()
                    .filter(|(_, region)| {
                        region.state == RegionState::Sealed
                            && region.writes == 0
                            && region.pins == 0
                    })
                    .min_by_key(|(_, region)| region.sequence)
                    .map(|(index, _)| index)?;
                self.reclaim(oldest, effects);
                oldest
            }
        };
        if let Some(previous) = self.active {
            self.regions[previous as usize].state = RegionState::Sealed;
        }
        let region = &mut self.regions[chosen];
        region.state = RegionState::Active;
        region.sequence = self.next_sequence;
        region.nonce = (self.nonces)();
        region.cursor = BLOCK_BYTES;
        self.next_sequence += 1;
        let chosen = u32::try_from(chosen).ok()?;
        self.active = Some(chosen);
        Some(chosen)
    }

    fn reclaim(&mut self, index: usize, effects: &mut ReserveEffects) {
        let objects = std::mem::take(&mut self.regions[index].objects);
        for object in objects {
            let entry = self.index.get(&object).copied();
            if let Some(entry) = entry.filter(|entry| entry.region as usize == index) {
                self.index.remove(&object);
                effects.evicted.push((object, entry));
            }
        }
        let region = &mut self.regions[index];
        region.live_bytes = 0;
        region.state = RegionState::Free;
        effects.reclaimed_region = true;
    }

    /// Records a completed write: the object is live (replacing an older copy, whose space
    /// becomes reclaimable). The caller passes the reservation it wrote.
    pub fn commit(
        &mut self,
        reservation: Reservation,
        object: ObjectId,
        length_bytes: u64,
        data_crc: u32,
    ) {
        self.finish_write(reservation);
        let entry = Entry {
            region: reservation.region,
            header_offset: reservation.header_offset,
            length_bytes,
            generation: reservation.generation,
            data_crc,
        };
        self.insert(object, entry);
    }

    /// Records a failed write: its space stays unused until the region is reclaimed.
    pub fn abort(&mut self, reservation: Reservation) {
        self.finish_write(reservation);
    }

    /// Stops filling `region` if it is the one being filled (a failed write left a hole in
    /// it): the next reservation opens another region. Its objects stay readable.
    pub fn seal(&mut self, region: u32) {
        if self.active == Some(region) {
            self.regions[region as usize].state = RegionState::Sealed;
            self.active = None;
        }
    }

    fn finish_write(&mut self, reservation: Reservation) {
        let region = &mut self.regions[reservation.region as usize];
        assert!(region.writes > 0 && region.sequence == reservation.generation);
        region.writes -= 1;
        region.writing_bytes -= reservation.footprint_bytes;
    }

    fn insert(&mut self, object: ObjectId, entry: Entry) {
        if let Some(old) = self.index.insert(object, entry) {
            self.regions[old.region as usize].live_bytes -= old.footprint_bytes();
        }
        let region = &mut self.regions[entry.region as usize];
        region.live_bytes += entry.footprint_bytes();
        region.objects.push(object);
    }

    /// Regions readers' pins may hold at once, over every reader: all but two, so that
    /// besides the region being filled one sealed region is always reclaimable, whoever pins
    /// (at least one). The node's own pins are short and not bounded by it.
    pub fn pinned_regions_max(&self) -> u32 {
        (self.regions.len() as u32).saturating_sub(2).max(1)
    }

    /// The object's entry, pinning its region against reclaim until [`RegionTable::unpin`]
    /// (the node's own short pins: a spill's publication, a restore's read); `None` for an
    /// object not held.
    pub fn pin(&mut self, object: &ObjectId) -> Option<Entry> {
        self.pin_within(object, u32::MAX)
    }

    /// [`RegionTable::pin`] for a reader outside the node (an engine's `PinOnSsd`): also
    /// `None` for an object in an unpinned region when [`RegionTable::pinned_regions_max`]
    /// regions are pinned already (the reader then loads it through memory).
    pub fn pin_for_reader(&mut self, object: &ObjectId) -> Option<Entry> {
        self.pin_within(object, self.pinned_regions_max())
    }

    fn pin_within(&mut self, object: &ObjectId, pinned_regions_max: u32) -> Option<Entry> {
        let entry = *self.index.get(object)?;
        let region = &mut self.regions[entry.region as usize];
        if region.pins == 0 {
            if self.pinned_regions >= pinned_regions_max {
                return None;
            }
            self.pinned_regions += 1;
        }
        region.pins += 1;
        Some(entry)
    }

    /// Releases one pin taken by [`RegionTable::pin`].
    pub fn unpin(&mut self, region: u32) {
        let region = &mut self.regions[region as usize];
        assert!(region.pins > 0, "unpin without a pin");
        region.pins -= 1;
        if region.pins == 0 {
            self.pinned_regions -= 1;
        }
    }

    /// Every indexed object and its entry.
    pub fn entries(&self) -> impl Iterator<Item = (ObjectId, Entry)> + '_ {
        self.index.iter().map(|(object, entry)| (*object, *entry))
    }

    /// The object's entry, without pinning.
    pub fn get(&self, object: &ObjectId) -> Option<Entry> {
        self.index.get(object).copied()
    }

    /// Drops the object from the index if `entry` is still its entry (a failed checksum, a
    /// retired replica); its space becomes reclaimable. True when it was dropped.
    pub fn remove(&mut self, object: &ObjectId, entry: Option<Entry>) -> bool {
        let Some(current) = self.index.get(object).copied() else {
            return false;
        };
        if entry.is_some_and(|expected| expected != current) {
            return false;
        }
        self.index.remove(object);
        self.regions[current.region as usize].live_bytes -= current.footprint_bytes();
        true
    }

    /// Usage by state.
    pub fn usage(&self) -> SsdUsage {
        let mut usage = SsdUsage {
            capacity_bytes: self.region_bytes * self.regions.len() as u64,
            objects: self.index.len() as u64,
            ..SsdUsage::default()
        };
        for region in &self.regions {
            usage.live_bytes += region.live_bytes;
            usage.writing_bytes += region.writing_bytes;
            match region.state {
                RegionState::Free => usage.free_bytes += self.region_bytes,
                RegionState::Active | RegionState::Sealed => {
                    let tail = self.region_bytes - region.cursor;
                    let used = region.cursor - BLOCK_BYTES;
                    if region.state == RegionState::Active {
                        usage.free_bytes += tail;
                    } else {
                        usage.reclaimable_bytes += tail;
                    }
                    usage.reclaimable_bytes +=
                        BLOCK_BYTES + used - region.live_bytes - region.writing_bytes;
                }
            }
        }
        usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NamespaceId, PrefixDigest};

    fn object(index: u8) -> ObjectId {
        ObjectId {
            namespace: NamespaceId([1; 16]),
            prefix: PrefixDigest([index; 16]),
            shard: 0,
            part: 0,
        }
    }

    /// Reserves and commits `length` bytes as `object`; the reservation and its effects.
    fn put(table: &mut RegionTable, index: u8, length: u64) -> (Reservation, ReserveEffects) {
        let (reservation, effects) = table.reserve(length).unwrap();
        table.commit(reservation, object(index), length, 7);
        (reservation, effects)
    }

    #[test]
    fn placement_by_table() {
        let region = 16 * BLOCK_BYTES;
        let limit = region - 2 * BLOCK_BYTES;
        // (objects' lengths, region of the last, whether the last opened a region)
        let cases: [(&[u64], u32, bool); 5] = [
            (&[1], 0, true),
            (&[limit], 0, true),
            (&[limit, 1], 1, true),
            (&[limit - BLOCK_BYTES, 1], 1, true),
            (&[6 * BLOCK_BYTES, 6 * BLOCK_BYTES, 1], 1, true),
        ];
        for (row, (lengths, region_of_last, opened)) in cases.iter().enumerate() {
            let mut table = RegionTable::new(2, region);
            let mut last = None;
            for (index, length) in lengths.iter().enumerate() {
                last = Some(put(&mut table, index as u8, *length));
            }
            let (reservation, _) = last.unwrap();
            assert_eq!(reservation.region, *region_of_last, "row {row}");
            assert_eq!(reservation.starts_fill(), *opened, "row {row}");
            assert_eq!(reservation.header_offset % BLOCK_BYTES, 0, "row {row}");
            let usage = table.usage();
            assert_eq!(
                usage.capacity_bytes,
                usage.live_bytes + usage.writing_bytes + usage.reclaimable_bytes + usage.free_bytes,
                "row {row}"
            );
        }
        assert_eq!(RegionTable::new(1, region).object_bytes_limit(), limit);
    }

    #[test]
    fn reclaim_takes_the_oldest_idle_region_and_a_write_in_flight_blocks_it() {
        let region = 4 * BLOCK_BYTES;
        let mut table = RegionTable::new(2, region);
        put(&mut table, 1, 2 * BLOCK_BYTES);
        let (in_flight, _) = table.reserve(2 * BLOCK_BYTES).unwrap();
        assert_eq!(in_flight.region, 1);
        let (reservation, effects) = table.reserve(2 * BLOCK_BYTES).unwrap();
        assert_eq!(reservation.region, 0);
        assert_eq!(evicted_objects(&effects), vec![object(1)]);
        table.commit(reservation, object(5), 2 * BLOCK_BYTES, 7);
        assert!(
            table.reserve(2 * BLOCK_BYTES).is_none(),
            "a region with a write in flight is never reclaimed"
        );
        table.abort(in_flight);
        assert_eq!(table.reserve(2 * BLOCK_BYTES).unwrap().0.region, 1);
        let mut table = RegionTable::new(2, region);
        put(&mut table, 1, 2 * BLOCK_BYTES);
        put(&mut table, 2, 2 * BLOCK_BYTES);
        let (_, effects) = put(&mut table, 3, 2 * BLOCK_BYTES);
        assert_eq!(evicted_objects(&effects), vec![object(1)]);
        assert!(effects.reclaimed_region);
        assert_eq!(table.get(&object(1)), None);
        let pinned = table.pin(&object(2)).unwrap();
        assert!(
            table.reserve(2 * BLOCK_BYTES).is_none(),
            "the only idle region is pinned"
        );
        table.unpin(pinned.region);
        let (_, effects) = put(&mut table, 4, 2 * BLOCK_BYTES);
        assert_eq!(evicted_objects(&effects), vec![object(2)]);
    }

    fn evicted_objects(effects: &ReserveEffects) -> Vec<ObjectId> {
        effects.evicted.iter().map(|(object, _)| *object).collect()
    }
}
