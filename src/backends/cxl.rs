//! A CXL pool as one node sees it: the shared mapping of the whole device (a DAX device
//! or, emulated, a file every node of the domain maps `MAP_SHARED`), in which this node may
//! allocate only inside the extents the directory granted it. Each extent has its own
//! page allocator, so two nodes never hand out the same page and no page allocation needs
//! the directory. Readers of other nodes read any committed range through their own
//! mapping of the same device.

use super::allocator::{Allocation, AllocatorUsage};
use super::error::PoolError;
use super::extent_allocator::ExtentAllocator;
use super::shared_memory::SharedMemory;
use super::PoolBackend;
use crate::model::{AllocationId, Generation, Medium};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// A node's view of a shared CXL pool. See the module documentation.
#[derive(Debug)]
pub struct CxlPool {
    memory: SharedMemory,
    extents: Mutex<ExtentAllocator>,
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
        let extents = ExtentAllocator::new(
            memory.data_bytes(),
            memory.page_bytes(),
            allocations_per_extent_max,
        );
        Ok(CxlPool {
            memory,
            extents: Mutex::new(extents),
        })
    }

    /// The mapping (path, UUID) clients map too.
    pub fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    fn extents(&self) -> MutexGuard<'_, ExtentAllocator> {
        // Poisoned only if an allocator invariant assertion fired: a bug, which propagates.
        self.extents
            .lock()
            .expect("CXL extent allocators poisoned by a failed invariant")
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
        self.extents().usage()
    }

    fn allocate(&self, length_bytes: u64) -> Result<Allocation, PoolError> {
        self.extents().allocate(length_bytes)
    }

    fn free(&self, id: AllocationId, generation: Generation) -> Result<u64, PoolError> {
        self.extents().free(id, generation)
    }

    fn check(
        &self,
        id: AllocationId,
        generation: Generation,
        offset: u64,
        length_bytes: u64,
    ) -> Result<(), PoolError> {
        self.extents().check(id, generation, offset, length_bytes)
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        self.memory.write_at(offset, data)
    }

    fn store_at(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        self.memory.store_at(offset, data)
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<(), PoolError> {
        self.memory.read_at(offset, buffer)
    }

    fn slice(&self, offset: u64, length_bytes: u64) -> Result<&[u8], PoolError> {
        self.memory.slice(offset, length_bytes)
    }

    fn take_empty_extent(&self) -> Option<(u64, u64)> {
        self.extents().take_empty()
    }

    fn add_extent(&self, offset_bytes: u64, length_bytes: u64) -> Result<(), PoolError> {
        self.extents().add_extent(offset_bytes, length_bytes)
    }

    fn held_extents(&self) -> Vec<(u64, u64)> {
        self.extents().extents().collect()
    }

    fn drop_extent(&self, offset_bytes: u64) -> bool {
        self.extents().drop_extent(offset_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::shared_memory::tests::ShmPath;

    #[test]
    fn a_mapped_pool_allocates_in_its_extents_and_checks_its_uuid() {
        let path = ShmPath::new("cxl-extents");
        let path_ref: &Path = &path.0;
        let page = 4096;
        SharedMemory::create(path_ref, 16 * page, 7, page).unwrap();
        let pool = CxlPool::open(path_ref, 7, 64).unwrap();
        assert!(matches!(pool.allocate(page), Err(PoolError::Full { .. })));
        pool.add_extent(8 * page, 4 * page).unwrap();
        let first = pool.allocate(page).unwrap();
        assert_eq!(first.offset, 8 * page);
        pool.write_at(first.offset, b"kv").unwrap();
        assert_eq!(pool.slice(first.offset, 2).unwrap(), b"kv");
        assert!(
            CxlPool::open(path_ref, 8, 64).is_err(),
            "wrong pool UUID refused"
        );
    }
}
