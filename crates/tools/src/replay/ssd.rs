//! A node's SSD store as the cluster replay models it: the store's own sans-I/O core
//! ([`RegionTable`]) places each spilled chunk in a region of the same geometry the live
//! node's store has ([`crate::launch::SSD_REGION_BYTES`], a header block per object), and
//! reclaims whole regions, oldest fill first, when it needs room; the objects a reclaimed
//! region held are retired at the directory by their locations, as the node does.

use crate::launch::SSD_REGION_BYTES;
use kvtier_core::backends::ssd::layout::objects_per_region;
use kvtier_core::backends::ssd::region::{Entry, RegionTable};
use kvtier_core::backends::ssd::store::REGION_COUNT_MAX;
use kvtier_core::directory::Holding;
use kvtier_core::model::{Location, ObjectId, PoolId};

/// Bytes of an SSD store that holds `blocks` chunks of `chunk_bytes` (each behind its
/// header block, none crossing a region): whole regions of [`SSD_REGION_BYTES`], enough
/// for `blocks` chunks. The live replay gives its nodes stores of this size. Refuses more
/// regions than a store opens ([`REGION_COUNT_MAX`]).
pub fn store_bytes(blocks: u64, chunk_bytes: u64) -> anyhow::Result<u64> {
    let per_region = objects_per_region(SSD_REGION_BYTES, chunk_bytes);
    let regions = blocks.div_ceil(per_region.max(1));
    anyhow::ensure!(
        regions <= REGION_COUNT_MAX,
        "{blocks} SSD blocks of {chunk_bytes} bytes need {regions} regions (at most {REGION_COUNT_MAX})"
    );
    regions
        .checked_mul(SSD_REGION_BYTES)
        .ok_or_else(|| anyhow::anyhow!("{blocks} SSD blocks overflow the store's size"))
}

/// One node's SSD store in the replay.
pub struct SimulatedSsd {
    /// The store's pool at the directory.
    pub pool: PoolId,
    table: RegionTable,
    /// Regions reclaimed whole to make room (the store's
    /// `kvtier_ssd_regions_reclaimed_total`).
    pub regions_reclaimed: u64,
}

impl SimulatedSsd {
    /// An empty store of `store_bytes` (whole regions), registered as `pool`.
    pub fn new(pool: PoolId, store_bytes: u64) -> anyhow::Result<Self> {
        let regions = u32::try_from(store_bytes / SSD_REGION_BYTES)?;
        anyhow::ensure!(regions > 0, "an SSD store of no region");
        Ok(Self {
            pool,
            table: RegionTable::new(regions, SSD_REGION_BYTES),
            regions_reclaimed: 0,
        })
    }

    fn location_of(&self, entry: &Entry) -> Location {
        entry.place(SSD_REGION_BYTES).location(self.pool)
    }

    /// Whether the store holds `object` (a load that misses restores it).
    pub fn holds(&self, object: &ObjectId) -> bool {
        self.table.get(object).is_some()
    }

    /// Writes `object` of `length_bytes` as a spill does (nothing when the store holds it
    /// at that length already: content is immutable); returns its location, and where the
    /// objects whose region was reclaimed to make room were, which the caller retires.
    /// `None` when no region can be reclaimed (the spill is skipped).
    pub fn write(
        &mut self,
        object: ObjectId,
        length_bytes: u64,
    ) -> (Option<Location>, Vec<Holding>) {
        if let Some(entry) = self.table.get(&object) {
            if entry.length_bytes == length_bytes {
                return (Some(self.location_of(&entry)), Vec::new());
            }
        }
        let Some((reservation, effects)) = self.table.reserve(length_bytes) else {
            return (None, Vec::new());
        };
        self.regions_reclaimed += u64::from(effects.reclaimed_region);
        let evicted = effects
            .evicted
            .iter()
            .map(|(evicted, entry)| Holding {
                object: *evicted,
                location: self.location_of(entry),
            })
            .collect();
        self.table.commit(reservation, object, length_bytes, 0);
        let location = self
            .table
            .get(&object)
            .map(|entry| self.location_of(&entry));
        (location, evicted)
    }

    /// Every object the store holds, at its location.
    #[cfg(test)]
    pub fn holdings(&self) -> Vec<Holding> {
        self.table
            .entries()
            .map(|(object, entry)| Holding {
                object,
                location: self.location_of(&entry),
            })
            .collect()
    }

    /// Drops `object` if the store still holds it at `location` (its replica was reclaimed,
    /// or its spill's commit refused): its space comes back with its region.
    pub fn drop_object(&mut self, object: &ObjectId, location: &Location) {
        if let Some(entry) = self.table.get(object) {
            if self.location_of(&entry) == *location {
                self.table.remove(object, Some(entry));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::model::NamespaceId;

    fn object(index: u64) -> ObjectId {
        crate::workload::prefix::chain(NamespaceId([7; 16]), &[index])[0]
    }

    #[test]
    fn a_store_sized_for_its_blocks_holds_them_and_reclaims_the_oldest_region_after() {
        let chunk = 64 << 10;
        let bytes = store_bytes(120, chunk).unwrap();
        assert_eq!(
            bytes,
            2 * SSD_REGION_BYTES,
            "60 chunks of 64 KiB per region"
        );
        let mut ssd = SimulatedSsd::new(PoolId(3), bytes).unwrap();
        let mut written = Vec::new();
        for index in 0..120 {
            let (location, evicted) = ssd.write(object(index), chunk);
            assert!(evicted.is_empty());
            written.push(Holding {
                object: object(index),
                location: location.unwrap(),
            });
        }
        assert!((0..120).all(|index| ssd.holds(&object(index))));
        let (_, evicted) = ssd.write(object(120), chunk);
        assert_eq!(evicted, written[..60], "the first region goes, whole");
        assert!(!ssd.holds(&object(0)) && ssd.holds(&object(60)));
    }
}
