//! The host's CPU DRAM pool: a [`SharedMemory`] file under `/dev/shm` (which the host's
//! engine processes map read-write to copy bytes themselves) plus the [`PageAllocator`]
//! that decides which pages hold what. Only the node allocates; clients receive locations.

use super::allocator::{Allocation, AllocatorUsage, PageAllocator};
use super::error::PoolError;
use super::shared_memory::SharedMemory;
use super::PoolBackend;
use crate::model::Medium;
use crate::model::{AllocationId, Generation};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// What a node needs to create its CPU pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuPoolConfig {
    /// The shared file, normally under `/dev/shm`. Created or truncated.
    pub path: PathBuf,
    /// Size of the data area; a positive multiple of `page_bytes`.
    pub capacity_bytes: u64,
    /// Allocation granule; a power of two of at least 4096.
    pub page_bytes: u64,
    /// Bound on live allocations: the allocation table never grows past it.
    pub allocations_max: u32,
    /// The pool's UUID, written in the header so clients can verify what they mapped.
    pub pool_uuid: u128,
}

/// The CPU pool. The mapping is shared without a lock (writers own disjoint ranges, see
/// `shared_memory`); only the allocator sits behind a `Mutex`, held for `O(log n)` work.
#[derive(Debug)]
pub struct CpuPool {
    memory: SharedMemory,
    allocator: Mutex<PageAllocator>,
}

impl CpuPool {
    /// Creates the shared file (destroying previous content), pre-faults it and starts with
    /// every page free. Errors: `InvalidConfig` for a bad geometry, `Io` when the file
    /// cannot be created, sized or mapped (for instance `/dev/shm` too small).
    pub fn create(config: &CpuPoolConfig) -> Result<Self, PoolError> {
        Self::create_reporting(config, &mut |_| {})
    }

    /// [`CpuPool::create`], calling `progress` with the bytes pre-faulted so far.
    pub fn create_reporting(
        config: &CpuPoolConfig,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self, PoolError> {
        let allocator = PageAllocator::new(
            config.capacity_bytes,
            config.page_bytes,
            config.allocations_max,
        )?;
        let memory = SharedMemory::create_reporting(
            &config.path,
            config.capacity_bytes,
            config.pool_uuid,
            config.page_bytes,
            progress,
        )?;
        Ok(Self {
            memory,
            allocator: Mutex::new(allocator),
        })
    }

    /// The mapping, for what clients need to map it too (path, UUID).
    pub fn memory(&self) -> &SharedMemory {
        &self.memory
    }

    /// Panics if the allocator's invariants do not hold; see
    /// [`PageAllocator::check_invariants`].
    pub fn check_invariants(&self) {
        let allocator = self.allocator();
        allocator.check_invariants();
        assert_eq!(allocator.capacity_bytes(), self.memory.data_bytes());
    }

    fn allocator(&self) -> MutexGuard<'_, PageAllocator> {
        // Poisoned only if an allocator invariant assertion fired while the lock was held:
        // the allocation state can no longer be trusted, so the bug propagates.
        self.allocator
            .lock()
            .expect("CPU pool allocator poisoned by a failed invariant")
    }
}

impl PoolBackend for CpuPool {
    fn medium(&self) -> Medium {
        Medium::Cpu
    }

    fn capacity_bytes(&self) -> u64 {
        self.memory.data_bytes()
    }

    fn usage(&self) -> AllocatorUsage {
        self.allocator().usage()
    }

    fn allocate(&self, length_bytes: u64) -> Result<Allocation, PoolError> {
        self.allocator().allocate(length_bytes)
    }

    fn free(&self, id: AllocationId, generation: Generation) -> Result<u64, PoolError> {
        self.allocator().free(id, generation)
    }

    fn check(
        &self,
        id: AllocationId,
        generation: Generation,
        offset: u64,
        length_bytes: u64,
    ) -> Result<(), PoolError> {
        self.allocator().check(id, generation, offset, length_bytes)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::shared_memory::tests::ShmPath;
    use std::sync::Arc;

    const PAGE: u64 = 4096;

    fn config(path: &ShmPath, pages: u64, allocations_max: u32) -> CpuPoolConfig {
        CpuPoolConfig {
            path: path.0.clone(),
            capacity_bytes: pages * PAGE,
            page_bytes: PAGE,
            allocations_max,
            pool_uuid: 42,
        }
    }

    #[test]
    fn store_and_load_through_the_trait() {
        let path = ShmPath::new("cpu");
        let pool: Box<dyn PoolBackend> = Box::new(CpuPool::create(&config(&path, 8, 8)).unwrap());
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

        // A local engine maps the same file and sees the bytes.
        let client = SharedMemory::open(&path.0, Some(42)).unwrap();
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
    fn bad_geometry_creates_no_file() {
        let path = ShmPath::new("cpu-bad");
        let mut bad = config(&path, 8, 8);
        bad.capacity_bytes += 1;
        assert!(matches!(
            CpuPool::create(&bad),
            Err(PoolError::InvalidConfig { .. })
        ));
        assert!(!path.0.exists());
    }

    #[test]
    fn concurrent_writers_own_disjoint_ranges() {
        const THREADS: u8 = 4;
        const ROUNDS: usize = 200;
        let path = ShmPath::new("cpu-threads");
        let pool = Arc::new(CpuPool::create(&config(&path, 64, 64)).unwrap());
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
}
