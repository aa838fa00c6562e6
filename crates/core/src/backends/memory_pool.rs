//! The memory pools of a node, CPU DRAM and CXL alike: a [`SharedMemory`] mapping (a sealed
//! anonymous memory file, or a CXL pool's DAX device or file) plus the allocator that decides which pages hold what.
//! Only the node allocates; clients receive locations and copy through their own mappings.
//! The medium is data: a CPU pool is owned whole by its node (one [`PageAllocator`] over
//! every page), a CXL pool is shared by the nodes of its domain and a node allocates only
//! inside the extents the directory granted it (an [`ExtentAllocator`]: one page allocator
//! per extent, so two nodes never hand out the same page and no allocation needs the
//! directory). Readers of other nodes read any committed range through their own mapping.

use super::allocator::{Allocation, AllocatorUsage, PageAllocator};
use super::error::PoolError;
use super::extent_allocator::ExtentAllocator;
use super::shared_memory::SharedMemory;
use super::PoolBackend;
use crate::model::{AllocationId, Generation, Medium, OwnerTable};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// What a node needs to create its CPU pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuPoolConfig {
    /// The memory file's name, as `/proc/PID/maps` shows it (the file has no path).
    pub name: String,
    /// Size of the data area; a positive multiple of `page_bytes`.
    pub capacity_bytes: u64,
    /// Allocation granule; a power of two of at least 4096.
    pub page_bytes: u64,
    /// Bound on live allocations: the allocation table never grows past it.
    pub allocations_max: u32,
    /// The pool's UUID, written in the header so clients can verify what they mapped.
    pub pool_uuid: u128,
}

/// Which pages of the mapping this node may allocate.
#[derive(Debug)]
enum Pages {
    /// Every page: the node owns the pool (CPU DRAM).
    Whole(PageAllocator),
    /// The extents the directory granted this node (a shared CXL pool).
    Extents(ExtentAllocator),
}

/// A memory pool (see the module documentation). The mapping is shared without a lock
/// (writers own disjoint ranges, see `shared_memory`); only the allocator sits behind a
/// `Mutex`, held for `O(log n)` work.
#[derive(Debug)]
pub struct MemoryPool {
    medium: Medium,
    memory: SharedMemory,
    pages: Mutex<Pages>,
}

impl MemoryPool {
    /// Creates a node's CPU pool: a sealed anonymous memory file
    /// ([`SharedMemory::create_sealed`]), pre-faulted, every page free. Errors:
    /// `InvalidConfig` for a bad geometry, `Io` when the file cannot be created, sized or
    /// mapped (for instance too little memory).
    pub fn create_cpu(config: &CpuPoolConfig) -> Result<Self, PoolError> {
        Self::create_cpu_reporting(config, &mut |_| {})
    }

    /// [`MemoryPool::create_cpu`], calling `progress` with the bytes pre-faulted so far.
    pub fn create_cpu_reporting(
        config: &CpuPoolConfig,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self, PoolError> {
        let allocator = PageAllocator::new(
            config.capacity_bytes,
            config.page_bytes,
            config.allocations_max,
        )?;
        let memory = SharedMemory::create_sealed(
            &config.name,
            config.capacity_bytes,
            config.pool_uuid,
            config.page_bytes,
            progress,
        )?;
        Ok(MemoryPool {
            medium: Medium::Cpu,
            memory,
            pages: Mutex::new(Pages::Whole(allocator)),
        })
    }

    /// Maps a shared CXL pool at `path`, verifying its header names `pool_uuid` (a node
    /// that mapped the wrong device or an incompatible layout gets the typed error and must
    /// not start), with no extent yet.
    pub fn open_cxl(
        path: &Path,
        pool_uuid: u128,
        allocations_per_extent_max: u32,
    ) -> Result<Self, PoolError> {
        let memory = SharedMemory::adopt(path, Some(pool_uuid))?;
        let extents = ExtentAllocator::new(
            memory.data_bytes(),
            memory.page_bytes(),
            allocations_per_extent_max,
        );
        Ok(MemoryPool {
            medium: Medium::Cxl,
            memory,
            pages: Mutex::new(Pages::Extents(extents)),
        })
    }

    /// The mapping, for what clients need to map it too (path, UUID).
    pub fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    /// Panics if the allocator's invariants do not hold; see
    /// [`PageAllocator::check_invariants`].
    pub fn check_invariants(&self) {
        if let Pages::Whole(allocator) = &*self.pages() {
            allocator.check_invariants();
            assert_eq!(allocator.capacity_bytes(), self.memory.data_bytes());
        }
    }

    fn pages(&self) -> MutexGuard<'_, Pages> {
        // Poisoned only if an allocator invariant assertion fired while the lock was held:
        // the allocation state can no longer be trusted, so the bug propagates.
        self.pages
            .lock()
            .expect("pool allocator poisoned by a failed invariant")
    }
}

impl PoolBackend for MemoryPool {
    fn medium(&self) -> Medium {
        self.medium
    }

    fn capacity_bytes(&self) -> u64 {
        self.memory.data_bytes()
    }

    fn usage(&self) -> AllocatorUsage {
        match &*self.pages() {
            Pages::Whole(allocator) => allocator.usage(),
            Pages::Extents(extents) => extents.usage(),
        }
    }

    fn allocate(&self, length_bytes: u64) -> Result<Allocation, PoolError> {
        match &mut *self.pages() {
            Pages::Whole(allocator) => allocator.allocate(length_bytes),
            Pages::Extents(extents) => extents.allocate(length_bytes),
        }
    }

    fn free(&self, id: AllocationId, generation: Generation) -> Result<u64, PoolError> {
        match &mut *self.pages() {
            Pages::Whole(allocator) => allocator.free(id, generation),
            Pages::Extents(extents) => extents.free(id, generation),
        }
    }

    fn check(
        &self,
        id: AllocationId,
        generation: Generation,
        offset: u64,
        length_bytes: u64,
    ) -> Result<(), PoolError> {
        match &mut *self.pages() {
            Pages::Whole(allocator) => allocator.check(id, generation, offset, length_bytes),
            Pages::Extents(extents) => extents.check(id, generation, offset, length_bytes),
        }
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

    fn add_extent(&self, offset_bytes: u64, length_bytes: u64) -> Result<(), PoolError> {
        match &mut *self.pages() {
            Pages::Whole(_) => Err(PoolError::InvalidConfig {
                reason: "this pool is owned whole by its node and has no extents",
            }),
            Pages::Extents(extents) => extents.add_extent(offset_bytes, length_bytes),
        }
    }

    fn take_empty_extent(&self) -> Option<(u64, u64)> {
        match &mut *self.pages() {
            Pages::Whole(_) => None,
            Pages::Extents(extents) => extents.take_empty(),
        }
    }

    fn held_extents(&self) -> Vec<(u64, u64)> {
        match &*self.pages() {
            Pages::Whole(_) => Vec::new(),
            Pages::Extents(extents) => extents.extents().collect(),
        }
    }

    fn drop_extent(&self, offset_bytes: u64) -> bool {
        match &mut *self.pages() {
            Pages::Whole(_) => false,
            Pages::Extents(extents) => extents.drop_extent(offset_bytes),
        }
    }

    fn owner_table(&self) -> Option<&dyn OwnerTable> {
        match &*self.pages() {
            Pages::Whole(_) => None,
            Pages::Extents(_) => Some(&self.memory),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::shared_memory::tests::ShmPath;
    use std::sync::Arc;

    const PAGE: u64 = 4096;

    fn config(pages: u64, allocations_max: u32) -> CpuPoolConfig {
        CpuPoolConfig {
            name: "kvtier-test-cpu".to_string(),
            capacity_bytes: pages * PAGE,
            page_bytes: PAGE,
            allocations_max,
            pool_uuid: 42,
        }
    }

    #[test]
    fn store_and_load_through_the_trait() {
        let pool = MemoryPool::create_cpu(&config(8, 8)).unwrap();
        // A local engine maps the memory file it is handed and sees the bytes.
        let handle = pool
            .memory()
            .handle()
            .unwrap()
            .try_clone_to_owned()
            .unwrap();
        let pool: Box<dyn PoolBackend> = Box::new(pool);
        assert_eq!(
            (pool.medium(), pool.capacity_bytes()),
            (Medium::Cpu, 8 * PAGE)
        );
        let allocation = pool.allocate(5000).unwrap();
        let payload: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        pool.write_at(allocation.offset, &payload).unwrap();
        let (id, generation) = (allocation.id, allocation.generation);
        pool.check(id, generation, allocation.offset, 5000).unwrap();
        assert_eq!(pool.slice(allocation.offset, 5000).unwrap(), &payload[..]);

        let client =
            SharedMemory::from_handle(handle, Some(42), true, crate::backends::Access::ReadWrite)
                .unwrap();
        let mut buffer = vec![0u8; 5000];
        client.read_at(allocation.offset, &mut buffer).unwrap();
        assert_eq!(buffer, payload);

        assert_eq!(pool.usage().allocated_bytes, 2 * PAGE);
        assert_eq!(pool.free(id, generation).unwrap(), 2 * PAGE);
        assert!(matches!(
            pool.check(id, generation, allocation.offset, 1),
            Err(PoolError::UnknownAllocation { .. })
        ));
        let reused = pool.allocate(PAGE).unwrap();
        assert!(matches!(
            pool.check(id, generation, allocation.offset, 1),
            Err(PoolError::StaleGeneration { .. })
        ));
        assert_eq!(reused.id, id);
    }

    #[test]
    fn bad_geometry_is_refused() {
        let mut bad = config(8, 8);
        bad.capacity_bytes += 1;
        assert!(matches!(
            MemoryPool::create_cpu(&bad),
            Err(PoolError::InvalidConfig { .. })
        ));
    }

    #[test]
    fn concurrent_writers_own_disjoint_ranges() {
        const THREADS: u8 = 4;
        const ROUNDS: usize = 200;
        let pool = Arc::new(MemoryPool::create_cpu(&config(64, 64)).unwrap());
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let pool = Arc::clone(&pool);
                std::thread::spawn(move || {
                    for round in 0..ROUNDS {
                        let length_bytes = PAGE * (1 + (round as u64 % 3));
                        let allocation = match pool.allocate(length_bytes) {
                            Ok(allocation) => allocation,
                            Err(PoolError::Full { .. }) => continue,
                            Err(other) => panic!("{other:?}"),
                        };
                        let pattern = vec![thread; length_bytes as usize];
                        pool.write_at(allocation.offset, &pattern).unwrap();
                        let view = pool.slice(allocation.offset, length_bytes).unwrap();
                        assert!(view.iter().all(|byte| *byte == thread), "range shared");
                        pool.free(allocation.id, allocation.generation).unwrap();
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        pool.check_invariants();
        assert_eq!(pool.usage().allocation_count, 0);
    }

    #[test]
    fn a_mapped_pool_allocates_in_its_extents_and_checks_its_uuid() {
        let path = ShmPath::new("cxl-extents");
        let path_ref: &Path = &path.0;
        let page = 4096;
        SharedMemory::create(path_ref, 16 * page, 7, page).unwrap();
        let pool = MemoryPool::open_cxl(path_ref, 7, 64).unwrap();
        assert_eq!(pool.medium(), Medium::Cxl);
        assert!(matches!(pool.allocate(page), Err(PoolError::Full { .. })));
        assert!(pool.held_extents().is_empty());
        pool.add_extent(8 * page, 4 * page).unwrap();
        let first = pool.allocate(page).unwrap();
        assert_eq!(first.offset, 8 * page);
        pool.write_at(first.offset, b"kv").unwrap();
        assert_eq!(pool.slice(first.offset, 2).unwrap(), b"kv");
        assert!(
            MemoryPool::open_cxl(path_ref, 8, 64).is_err(),
            "wrong pool UUID refused"
        );
    }
}
