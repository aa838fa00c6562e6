//! Pool backends: the storage of each tier behind one trait. A backend owns its medium's
//! bytes and the allocation of its pages; it knows nothing of objects, replicas or leases
//! (the directory owns those) and enforces only what a location alone can prove: bounds and
//! generations.
//!
//! * `allocator`: the sans-I/O page allocator shared by byte-addressable pools.
//! * `checksum`: CRC-32C, for every header and every SSD object.
//! * `shared_memory`: the `MAP_SHARED` mapping and on-media header (CPU and CXL pools).
//! * `memory_pool`: a CPU DRAM or CXL pool: a shared mapping plus the allocator of the pages
//!   (or extents) the node may hand out.
//! * `error`: `PoolError`, the one error type of this boundary.
//! * `probe`: the start-up measurement of a node's tiers.
//! * `ssd`: the node's SSD store (L2): region files, direct I/O, checksummed headers.
//! * `copy`: bulk copies into and out of pools, by the routine this machine runs fastest.

pub mod allocator;
pub mod checksum;
pub mod copy;
pub mod error;
pub mod extent_allocator;
pub mod memory_pool;
pub mod probe;
pub mod shared_memory;
pub mod ssd;

pub use allocator::{Allocation, AllocatorUsage, PageAllocator};
pub use error::PoolError;
pub use memory_pool::{CpuPoolConfig, MemoryPool};
pub use shared_memory::{Access, SharedMemory};

use crate::model::{AllocationId, Generation, Medium, OwnerTable};

/// One pool of one tier. Every method takes `&self` and is safe to call from many threads;
/// offsets are relative to the pool's data area. The allocation methods keep the
/// allocator's promises (contiguous, never overlapping, never past capacity, stale
/// generations refused); the byte methods check bounds only, so a caller first validates
/// its location with [`PoolBackend::check`] and relies on the directory's lease protocol to
/// keep the range from being freed while it reads.
pub trait PoolBackend: Send + Sync {
    /// The medium this pool stores bytes on.
    fn medium(&self) -> Medium;

    /// Size of the data area in bytes; constant for the pool's lifetime.
    fn capacity_bytes(&self) -> u64;

    /// Current usage, consistent at one instant.
    fn usage(&self) -> AllocatorUsage;

    /// Reserves a contiguous page-rounded range of at least `length_bytes`; see
    /// [`PageAllocator::allocate`] for the errors. The new range's content is unspecified
    /// (zero in a fresh pool, old bytes after reuse): the caller writes all of it it reads.
    fn allocate(&self, length_bytes: u64) -> Result<Allocation, PoolError>;

    /// Releases an allocation and returns the bytes freed. The caller guarantees no reader
    /// still uses the range (the directory's reclaim acknowledgement). A repeated free is
    /// refused with `UnknownAllocation`, a stale one with `StaleGeneration`.
    fn free(&self, id: AllocationId, generation: Generation) -> Result<u64, PoolError>;

    /// Validates a location (live allocation, current generation, range within its
    /// requested length) without touching bytes.
    fn check(
        &self,
        id: AllocationId,
        generation: Generation,
        offset: u64,
        length_bytes: u64,
    ) -> Result<(), PoolError>;

    /// Copies `data` into the pool at `offset`. The caller owns the range: an allocation
    /// it holds and that no reader reads yet.
    fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), PoolError>;

    /// [`PoolBackend::write_at`] for a bulk copy (an object's bytes: a store, a restore, a
    /// demotion's or a replication's target), with the store routine this machine runs
    /// fastest ([`copy`]); every byte is visible to other processes when it returns.
    fn store_at(&self, offset: u64, data: &[u8]) -> Result<(), PoolError>;

    /// Copies `buffer.len()` bytes at `offset` out of the pool.
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<(), PoolError>;

    /// A zero-copy view of `length_bytes` at `offset`. The caller keeps the range immutable
    /// (READY and leased) while the view lives, or, for a copy that holds no lease (the
    /// node's demotion and replication copies of its own READY replicas), checks after the
    /// copy that the allocation's generation did not change and discards the copy if it did.
    fn slice(&self, offset: u64, length_bytes: u64) -> Result<&[u8], PoolError>;

    /// Lets this node allocate in `[offset, offset + length)`: an extent of a shared pool
    /// the directory granted it. Pools owned whole by their node have no extents.
    fn add_extent(&self, offset_bytes: u64, length_bytes: u64) -> Result<(), PoolError> {
        let _ = (offset_bytes, length_bytes);
        Err(PoolError::InvalidConfig {
            reason: "this pool is owned whole by its node and has no extents",
        })
    }

    /// Takes an extent with no live allocation out of use and returns its offset and
    /// length, so the node can give it back; `None` when there is none (or no extents).
    fn take_empty_extent(&self) -> Option<(u64, u64)> {
        None
    }

    /// The extents this node holds in a shared pool, as `(offset, length)`; none in a
    /// pool without extents.
    fn held_extents(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }

    /// Takes the extent at `offset_bytes` out of use with every allocation inside it (the
    /// node lost it while its session was replaced); its allocation ids go stale. False
    /// when no such extent is held.
    fn drop_extent(&self, _offset_bytes: u64) -> bool {
        false
    }

    /// The owner words of a shared pool's extents (`model::extent_owner`); `None` for a
    /// pool owned whole by its node.
    fn owner_table(&self) -> Option<&dyn OwnerTable> {
        None
    }
}
