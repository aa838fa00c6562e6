//! A CXL pool as one node sees it: the shared mapping of the whole device (a DAX device
//! or, emulated, a file every node of the domain maps `MAP_SHARED`), in which this node may
//! allocate only inside the extents the directory granted it. Each extent has its own
//! page allocator, so two nodes never hand out the same page and no page allocation needs
//! the directory. Readers of other nodes read any committed range through their own
//! mapping of the same device.

use super::allocator::{Allocation, AllocatorUsage, PageAllocator};
use super::error::PoolError;
use super::shared_memory::SharedMemory;
use super::PoolBackend;
use crate::model::{AllocationId, Generation, Medium};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// Extents one node may hold in one pool (the directory bounds it per session too).
pub const EXTENTS_PER_NODE_MAX: usize = 4096;
/// Allocation ids are `[extent slot: 16 bits][slot reuse count: 16 bits][id inside: 32 bits]`,
/// so an id from an extent given back never names an allocation of the slot's next extent.
const INNER_BITS: u32 = 32;
const REUSE_BITS: u32 = 16;
const _: () = assert!(
    EXTENTS_PER_NODE_MAX <= 1 << 16,
    "extent slots must fit in 16 bits"
);

/// One granted extent and the allocator of its pages.
#[derive(Debug)]
struct ExtentAllocator {
    offset_bytes: u64,
    pages: PageAllocator,
}

/// A slot of the extent table: the extent it holds now, and how often it was reused.
#[derive(Debug, Default)]
struct ExtentSlot {
    extent: Option<ExtentAllocator>,
    reuse: u16,
}

/// A node's view of a shared CXL pool. See the module documentation.
#[derive(Debug)]
pub struct CxlPool {
    memory: SharedMemory,
    extents: Mutex<Vec<ExtentSlot>>,
    allocations_per_extent_max: u32,
}

impl CxlPool {
    /// Maps the pool at `path`, verifying its header names `pool_uuid`: a node that mapped
    /// the wrong device or an incompatible layout gets the typed error and must not start.
    pub fn open(
        path: &Path,
        pool_uuid: u128,
        allocations_per_extent_max: u32,
    ) -> Result<CxlPool, PoolError> {
        let memory = SharedMemory::open(path, Some(pool_uuid))?;
        Ok(CxlPool {
            memory,
            extents: Mutex::new(Vec::new()),
            allocations_per_extent_max,
        })
    }

    /// The mapping (path, UUID) clients map too.
    pub fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    fn extents(&self) -> MutexGuard<'_, Vec<ExtentSlot>> {
        // Poisoned only if an allocator invariant assertion fired: a bug, which propagates.
        self.extents
            .lock()
            .expect("CXL extent allocators poisoned by a failed invariant")
    }

    fn route(id: AllocationId) -> (usize, u16, AllocationId) {
        let slot = (id.0 >> (INNER_BITS + REUSE_BITS)) as usize;
        let reuse = ((id.0 >> INNER_BITS) & ((1 << REUSE_BITS) - 1)) as u16;
        (slot, reuse, AllocationId(id.0 & ((1 << INNER_BITS) - 1)))
    }

    fn extent_of(
        extents: &mut [ExtentSlot],
        id: AllocationId,
        generation: Generation,
    ) -> Result<(&mut ExtentAllocator, AllocationId), PoolError> {
        let (slot, reuse, inner) = CxlPool::route(id);
        match extents.get_mut(slot) {
            Some(ExtentSlot {
                extent: Some(extent),
                reuse: current,
            }) if *current == reuse => Ok((extent, inner)),
            _ => Err(PoolError::UnknownAllocation { id, generation }),
        }
    }

    /// Takes an extent with no live allocation out of this node's table and returns its
    /// offset and length, for giving it back to the directory; `None` if every extent is in
    /// use. Its slot's ids go stale.
    fn take_empty(&self) -> Option<(u64, u64)> {
        let mut extents = self.extents();
        let slot = extents.iter_mut().find(|slot| {
            slot.extent
                .as_ref()
                .is_some_and(|extent| extent.pages.usage().allocation_count == 0)
        })?;
        let extent = slot.extent.take()?;
        slot.reuse = slot.reuse.wrapping_add(1);
        Some((extent.offset_bytes, extent.pages.capacity_bytes()))
    }
}

impl PoolBackend for CxlPool {
    fn medium(&self) -> Medium {
        Medium::Cxl
    }

    fn capacity_bytes(&self) -> u64 {
        self.memory.data_bytes()
    }

    fn usage(&self) -> AllocatorUsage {
        let extents = self.extents();
        let mut usage = AllocatorUsage {
            capacity_bytes: 0,
            allocated_bytes: 0,
            free_bytes: 0,
            largest_free_run_bytes: 0,
            allocation_count: 0,
        };
        for extent in extents.iter().filter_map(|slot| slot.extent.as_ref()) {
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

    fn allocate(&self, length_bytes: u64) -> Result<Allocation, PoolError> {
        let mut extents = self.extents();
        let mut last_error = PoolError::Full {
            requested_bytes: length_bytes,
            free_bytes: 0,
            largest_free_run_bytes: 0,
        };
        for (index, slot) in extents.iter_mut().enumerate() {
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

    fn free(&self, id: AllocationId, generation: Generation) -> Result<u64, PoolError> {
        let mut extents = self.extents();
        let (extent, inner) = CxlPool::extent_of(&mut extents, id, generation)?;
        extent.pages.free(inner, generation)
    }

    fn check(
        &self,
        id: AllocationId,
        generation: Generation,
        offset: u64,
        length_bytes: u64,
    ) -> Result<(), PoolError> {
        let mut extents = self.extents();
        let (extent, inner) = CxlPool::extent_of(&mut extents, id, generation)?;
        let inner_offset =
            offset
                .checked_sub(extent.offset_bytes)
                .ok_or(PoolError::OutOfBounds {
                    offset,
                    length_bytes,
                    limit_bytes: self.memory.data_bytes(),
                })?;
        extent
            .pages
            .check(inner, generation, inner_offset, length_bytes)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        self.memory.write_at(offset, data)
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<(), PoolError> {
        self.memory.read_at(offset, buffer)
    }

    fn slice(&self, offset: u64, length_bytes: u64) -> Result<&[u8], PoolError> {
        self.memory.slice(offset, length_bytes)
    }

    fn take_empty_extent(&self) -> Option<(u64, u64)> {
        self.take_empty()
    }

    fn add_extent(&self, offset_bytes: u64, length_bytes: u64) -> Result<(), PoolError> {
        let end = offset_bytes.checked_add(length_bytes);
        if end.is_none_or(|end| end > self.memory.data_bytes()) {
            return Err(PoolError::OutOfBounds {
                offset: offset_bytes,
                length_bytes,
                limit_bytes: self.memory.data_bytes(),
            });
        }
        let pages = PageAllocator::new(
            length_bytes,
            self.memory.page_bytes(),
            self.allocations_per_extent_max,
        )?;
        let extent = Some(ExtentAllocator {
            offset_bytes,
            pages,
        });
        let mut extents = self.extents();
        if let Some(slot) = extents.iter_mut().find(|slot| slot.extent.is_none()) {
            slot.extent = extent;
            return Ok(());
        }
        if extents.len() >= EXTENTS_PER_NODE_MAX {
            return Err(PoolError::TooManyAllocations {
                allocations_max: EXTENTS_PER_NODE_MAX as u32,
            });
        }
        extents.push(ExtentSlot { extent, reuse: 0 });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::shared_memory::tests::ShmPath;

    #[test]
    fn allocations_stay_inside_granted_extents_and_route_back() {
        let path = ShmPath::new("cxl-extents");
        let path_ref: &Path = &path.0;
        let page = 4096;
        SharedMemory::create(path_ref, 16 * page, 7, page).unwrap();
        let pool = CxlPool::open(path_ref, 7, 64).unwrap();
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
            CxlPool::open(path_ref, 8, 64).is_err(),
            "wrong pool UUID refused"
        );
    }
}
