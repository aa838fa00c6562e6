//! The page allocator of a node inside a shared pool: a sans-I/O core (no mapping, no lock)
//! holding the extents the directory granted this node, each with its own
//! [`PageAllocator`]. A node allocates only inside its extents, so two nodes never hand out
//! the same page and no page allocation needs the directory.
//!
//! Identity: an `AllocationId` is `[extent slot: 16 bits][slot reuse count: 16 bits][id
//! inside the extent: 32 bits]`, so an id from an extent given back never names an
//! allocation of the slot's next extent.

use super::allocator::{Allocation, AllocatorUsage, PageAllocator};
use super::error::PoolError;
use crate::model::{AllocationId, Generation};

/// Extents one node may hold in one pool (the directory bounds it per session too).
pub const EXTENTS_PER_NODE_MAX: usize = 4096;
const INNER_BITS: u32 = 32;
const REUSE_BITS: u32 = 16;
const _: () = assert!(
    EXTENTS_PER_NODE_MAX <= 1 << 16,
    "extent slots must fit in 16 bits"
);

/// One granted extent and the allocator of its pages.
#[derive(Debug)]
struct Extent {
    offset_bytes: u64,
    pages: PageAllocator,
}

/// A slot of the extent table: the extent it holds now, and how often it was reused.
#[derive(Debug, Default)]
struct ExtentSlot {
    extent: Option<Extent>,
    reuse: u16,
}

/// The extents one node holds in one shared pool of `capacity_bytes` with `page_bytes`
/// pages. Offsets are relative to the pool's data area. See the module documentation.
#[derive(Debug)]
pub struct ExtentAllocator {
    slots: Vec<ExtentSlot>,
    capacity_bytes: u64,
    page_bytes: u64,
    allocations_per_extent_max: u32,
}

impl ExtentAllocator {
    /// No extent yet: every allocation is refused `Full` until [`ExtentAllocator::add_extent`].
    pub fn new(
        capacity_bytes: u64,
        page_bytes: u64,
        allocations_per_extent_max: u32,
    ) -> ExtentAllocator {
        ExtentAllocator {
            slots: Vec::new(),
            capacity_bytes,
            page_bytes,
            allocations_per_extent_max,
        }
    }

    fn route(id: AllocationId) -> (usize, u16, AllocationId) {
        let slot = (id.0 >> (INNER_BITS + REUSE_BITS)) as usize;
        let reuse = ((id.0 >> INNER_BITS) & ((1 << REUSE_BITS) - 1)) as u16;
        (slot, reuse, AllocationId(id.0 & ((1 << INNER_BITS) - 1)))
    }

    fn extent_of(
        &mut self,
        id: AllocationId,
        generation: Generation,
    ) -> Result<(&mut Extent, AllocationId), PoolError> {
        let (slot, reuse, inner) = ExtentAllocator::route(id);
        match self.slots.get_mut(slot) {
            Some(ExtentSlot {
                extent: Some(extent),
                reuse: current,
            }) if *current == reuse => Ok((extent, inner)),
            _ => Err(PoolError::UnknownAllocation { id, generation }),
        }
    }

    /// Lets this node allocate in `[offset, offset + length)`. The caller guarantees the
    /// directory granted that extent to this node and no other holds it. An extent past the
    /// pool's end, or overlapping one held already (a grant applied twice), is refused.
    pub fn add_extent(&mut self, offset_bytes: u64, length_bytes: u64) -> Result<(), PoolError> {
        let end = offset_bytes.checked_add(length_bytes);
        let overlaps = |end: u64| {
            self.extents()
                .any(|(held, length)| offset_bytes < held + length && held < end)
        };
        if end.is_none_or(|end| end > self.capacity_bytes || overlaps(end)) {
            return Err(PoolError::OutOfBounds {
                offset: offset_bytes,
                length_bytes,
                limit_bytes: self.capacity_bytes,
            });
        }
        let pages = PageAllocator::new(
            length_bytes,
            self.page_bytes,
            self.allocations_per_extent_max,
        )?;
        let extent = Some(Extent {
            offset_bytes,
            pages,
        });
        if let Some(slot) = self.slots.iter_mut().find(|slot| slot.extent.is_none()) {
            slot.extent = extent;
            return Ok(());
        }
        if self.slots.len() >= EXTENTS_PER_NODE_MAX {
            return Err(PoolError::TooManyAllocations {
                allocations_max: EXTENTS_PER_NODE_MAX as u32,
            });
        }
        self.slots.push(ExtentSlot { extent, reuse: 0 });
        Ok(())
    }

    /// Takes an extent with no live allocation out of use and returns its offset and
    /// length, for giving it back to the directory; `None` if every extent is in use. Its
    /// slot's ids go stale.
    pub fn take_empty(&mut self) -> Option<(u64, u64)> {
        let slot = self.slots.iter_mut().find(|slot| {
            slot.extent
                .as_ref()
                .is_some_and(|extent| extent.pages.usage().allocation_count == 0)
        })?;
        let extent = slot.extent.take()?;
        slot.reuse = slot.reuse.wrapping_add(1);
        Some((extent.offset_bytes, extent.pages.capacity_bytes()))
    }

    /// Takes the extent starting at `offset_bytes` out of use with every allocation in it
    /// (the directory did not give it back to this node after a rejoin): its slot's ids go
    /// stale, so a late free of one of them is refused. False when no such extent is held.
    pub fn drop_extent(&mut self, offset_bytes: u64) -> bool {
        let Some(slot) = self.slots.iter_mut().find(|slot| {
            slot.extent
                .as_ref()
                .is_some_and(|extent| extent.offset_bytes == offset_bytes)
        }) else {
            return false;
        };
        slot.extent = None;
        slot.reuse = slot.reuse.wrapping_add(1);
        true
    }

    /// The extents held now, as `(offset, length)`.
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slots
            .iter()
            .filter_map(|slot| slot.extent.as_ref())
            .map(|extent| (extent.offset_bytes, extent.pages.capacity_bytes()))
    }

    /// Usage summed over the extents held.
    pub fn usage(&self) -> AllocatorUsage {
        let mut usage = AllocatorUsage {
            capacity_bytes: 0,
            allocated_bytes: 0,
            free_bytes: 0,
            largest_free_run_bytes: 0,
            allocation_count: 0,
        };
        for extent in self.slots.iter().filter_map(|slot| slot.extent.as_ref()) {
            let part = extent.pages.usage();
            usage.capacity_bytes += part.capacity_bytes;
            usage.allocated_bytes += part.allocated_bytes;
            usage.free_bytes += part.free_bytes;
            usage.largest_free_run_bytes = usage
                .largest_free_run_bytes
                .max(part.largest_free_run_bytes);
            usage.allocation_count += part.allocation_count;
        }
        usage
    }

    /// Allocates inside the first extent with room; `Full` when none has.
    pub fn allocate(&mut self, length_bytes: u64) -> Result<Allocation, PoolError> {
        let mut last_error = PoolError::Full {
            requested_bytes: length_bytes,
            free_bytes: 0,
            largest_free_run_bytes: 0,
        };
        for (index, slot) in self.slots.iter_mut().enumerate() {
            let reuse = u64::from(slot.reuse);
            let Some(extent) = slot.extent.as_mut() else {
                continue;
            };
            match extent.pages.allocate(length_bytes) {
                Ok(inner) => {
                    return Ok(Allocation {
                        id: AllocationId(
                            ((index as u64) << (INNER_BITS + REUSE_BITS))
                                | (reuse << INNER_BITS)
                                | inner.id.0,
                        ),
                        offset: extent.offset_bytes + inner.offset,
                        ..inner
                    })
                }
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    /// Frees an allocation; see [`PageAllocator::free`].
    pub fn free(&mut self, id: AllocationId, generation: Generation) -> Result<u64, PoolError> {
        let (extent, inner) = self.extent_of(id, generation)?;
        extent.pages.free(inner, generation)
    }

    /// Validates a location; see [`PageAllocator::check`].
    pub fn check(
        &mut self,
        id: AllocationId,
        generation: Generation,
        offset: u64,
        length_bytes: u64,
    ) -> Result<(), PoolError> {
        let limit_bytes = self.capacity_bytes;
        let (extent, inner) = self.extent_of(id, generation)?;
        let inner_offset =
            offset
                .checked_sub(extent.offset_bytes)
                .ok_or(PoolError::OutOfBounds {
                    offset,
                    length_bytes,
                    limit_bytes,
                })?;
        extent
            .pages
            .check(inner, generation, inner_offset, length_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_stay_inside_granted_extents_and_route_back() {
        let page = 4096;
        let mut pool = ExtentAllocator::new(16 * page, page, 64);
        assert!(
            matches!(pool.allocate(page), Err(PoolError::Full { .. })),
            "no extent, no allocation"
        );
        pool.add_extent(8 * page, 4 * page).unwrap();
        let first = pool.allocate(3 * page).unwrap();
        assert_eq!(first.offset, 8 * page);
        assert!(
            matches!(pool.allocate(2 * page), Err(PoolError::Full { .. })),
            "only one page left in the extent"
        );
        pool.add_extent(0, 4 * page).unwrap();
        let second = pool.allocate(2 * page).unwrap();
        assert!(second.offset < 4 * page, "second extent used");
        pool.check(second.id, second.generation, second.offset, 2 * page)
            .unwrap();
        assert_eq!(pool.free(first.id, first.generation).unwrap(), 3 * page);
        assert!(matches!(
            pool.free(first.id, first.generation),
            Err(PoolError::UnknownAllocation { .. } | PoolError::StaleGeneration { .. })
        ));
        assert!(
            pool.add_extent(15 * page, 4 * page).is_err(),
            "extent past the end refused"
        );
        assert!(
            pool.add_extent(10 * page, 4 * page).is_err(),
            "extent overlapping a held one refused"
        );
    }

    #[test]
    fn a_dropped_extent_takes_its_allocations_with_it() {
        let page = 4096;
        let mut pool = ExtentAllocator::new(16 * page, page, 64);
        pool.add_extent(0, 4 * page).unwrap();
        pool.add_extent(8 * page, 4 * page).unwrap();
        let lost = pool.allocate(4 * page).unwrap();
        assert!(pool.drop_extent(lost.offset));
        assert!(!pool.drop_extent(lost.offset), "dropped once");
        assert!(
            pool.free(lost.id, lost.generation).is_err(),
            "an allocation of a dropped extent is stale"
        );
        assert_eq!(pool.extents().count(), 1);
        let kept = pool.allocate(page).unwrap();
        assert_ne!(
            kept.offset / (8 * page),
            lost.offset / (8 * page),
            "never in the lost extent"
        );
    }

    #[test]
    fn an_extent_given_back_makes_its_ids_stale() {
        let page = 4096;
        let mut pool = ExtentAllocator::new(16 * page, page, 64);
        pool.add_extent(0, 4 * page).unwrap();
        let old = pool.allocate(page).unwrap();
        assert_eq!(
            pool.take_empty(),
            None,
            "an extent in use is not given back"
        );
        pool.free(old.id, old.generation).unwrap();
        assert_eq!(pool.take_empty(), Some((0, 4 * page)));
        assert_eq!(pool.extents().count(), 0);
        pool.add_extent(4 * page, 4 * page).unwrap();
        let new = pool.allocate(page).unwrap();
        assert_ne!(new.id, old.id, "the slot's reuse count moved on");
        assert!(pool
            .check(old.id, old.generation, old.offset, page)
            .is_err());
    }
}
