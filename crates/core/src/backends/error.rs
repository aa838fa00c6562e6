//! `PoolError`: the one error type of the pool boundary. Every backend (CPU mapping, CXL
//! mapping, SSD store) and the page allocator report through it, so a caller handles a full
//! pool or a stale location the same way whatever the medium.

use crate::model::{AllocationId, Generation};
use std::path::PathBuf;

/// Why a pool operation did not happen. Expected operating conditions (`Full`,
/// `StaleGeneration`, `TooManyAllocations`) are ordinary values to branch on; the mapping
/// errors (`WrongMagic`, `IncompatibleLayout`, `WrongPool`, ...) mean this node must not use
/// the pool at that path.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No contiguous run of free pages is long enough for the request, though the allocation
    /// table has room. `free_bytes` may exceed the request when free space is fragmented;
    /// `largest_free_run_bytes` is the longest request that would succeed now. The caller
    /// tries the next pool of its write order, evicts or demotes, or reports `Skip`.
    #[error("pool full: {requested_bytes} bytes requested, {free_bytes} free, largest free run {largest_free_run_bytes}")]
    Full {
        /// The page-rounded size that was asked for.
        requested_bytes: u64,
        /// All free bytes of the pool, contiguous or not.
        free_bytes: u64,
        /// The longest contiguous free run.
        largest_free_run_bytes: u64,
    },

    /// Every slot of the allocation table holds a live allocation (`allocations_max` of
    /// them). The caller treats it like `Full`: free something first.
    #[error("allocation table full: {allocations_max} live allocations")]
    TooManyAllocations {
        /// The table's bound, from the pool's configuration.
        allocations_max: u32,
    },

    /// The request's length is zero. It is a caller bug or a corrupt request; the caller
    /// rejects the request that carried it. (A length larger than the pool is `Full`.)
    #[error("invalid allocation length: {length_bytes} bytes")]
    InvalidLength {
        /// The length that was asked for.
        length_bytes: u64,
    },

    /// The location names an allocation slot that was reused since: its generation is older
    /// than the slot's current one. The bytes there belong to another object now; the caller
    /// reports a miss (a load) or treats the free as already done (a reclaim).
    #[error("stale generation for allocation {id}: location has {found}, slot is at {current}")]
    StaleGeneration {
        /// The allocation slot named by the location.
        id: AllocationId,
        /// The generation the location carries.
        found: Generation,
        /// The slot's current generation.
        current: Generation,
    },

    /// No live allocation has this id and generation: the id was never handed out, the
    /// generation was never issued, or the allocation was already freed (so a repeated free
    /// lands here). A repeated free is done; any other case is a caller bug or a location
    /// from another pool, and the caller reports a miss.
    #[error("unknown allocation {id} generation {generation}")]
    UnknownAllocation {
        /// The allocation id that was named.
        id: AllocationId,
        /// The generation that was named.
        generation: Generation,
    },

    /// A byte range falls outside the pool's data area, or outside the allocation it was
    /// checked against. Nothing was read or written; the caller has a corrupt location and
    /// reports a miss (a load) or fails the operation.
    #[error("range {offset}+{length_bytes} out of bounds (limit {limit_bytes})")]
    OutOfBounds {
        /// Start of the range, relative to the pool's data area.
        offset: u64,
        /// Length of the range.
        length_bytes: u64,
        /// The end the range had to stay within.
        limit_bytes: u64,
    },

    /// A pool parameter is unusable (page size not a power of two at least the OS page,
    /// capacity not a positive multiple of the page size, empty allocation table). The
    /// configuration is wrong; the node refuses to start this pool.
    #[error("invalid pool configuration: {reason}")]
    InvalidConfig {
        /// Which parameter and why.
        reason: &'static str,
    },

    /// A system call on the pool's file or device failed (open, truncate, allocate, map,
    /// read of the header). The pool is unusable; the caller reports it and does not retry
    /// in a loop.
    #[error("I/O error on pool {path}: {source}")]
    Io {
        /// The pool's file or device.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },

    /// The header at offset 0 does not start with the kvtier magic: the path is not a kvtier
    /// pool (or it was never initialised). The node must not map it as one.
    #[error("{path} does not hold a kvtier pool header")]
    WrongMagic {
        /// The pool's file or device.
        path: PathBuf,
    },

    /// The header carries a layout version this build cannot read. The node must be upgraded
    /// (or the pool recreated) before it uses this pool.
    #[error("{path} has pool layout version {found}, this build reads {expected}")]
    IncompatibleLayout {
        /// The pool's file or device.
        path: PathBuf,
        /// The version in the header.
        found: u32,
        /// The version this build writes and reads.
        expected: u32,
    },

    /// The header's checksum does not match its fields, or its sizes are inconsistent: the
    /// header is torn (a creator crashed mid-write) or corrupt. The pool is unusable until
    /// recreated.
    #[error("{path} has a corrupt pool header: {reason}")]
    CorruptHeader {
        /// The pool's file or device.
        path: PathBuf,
        /// Which check failed.
        reason: &'static str,
    },

    /// The header is valid but names another pool than the one the directory registered at
    /// this path: the node mapped the wrong device. It must not use it.
    #[error("{path} holds pool {found:032x}, expected {expected:032x}")]
    WrongPool {
        /// The pool's file or device.
        path: PathBuf,
        /// The pool UUID in the header.
        found: u128,
        /// The pool UUID the caller expected.
        expected: u128,
    },

    /// The file is shorter than its header says (it was truncated after creation). Mapping it
    /// would fault on access; the pool is unusable until recreated.
    #[error("{path} is {file_bytes} bytes, its header needs {expected_bytes}")]
    Truncated {
        /// The pool's file.
        path: PathBuf,
        /// The file's current length.
        file_bytes: u64,
        /// Header plus data area, from the header.
        expected_bytes: u64,
    },

    /// A pool this process would adopt (format, serve or map as a CXL pool) is neither a
    /// device nor a regular file of this process's user or root kept from other users'
    /// writes: someone else may have planted it. Nothing was mapped.
    #[error(
        "{path} is not this user's to adopt as a pool (owner uid {owner}, mode {mode:o}): {reason}"
    )]
    NotOurs {
        /// The pool's file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Its permission bits.
        mode: u32,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A write into a pool this process mapped read-only (one it only reads from).
    #[error("the pool is mapped read-only here")]
    ReadOnly,
    /// A pool handed over a socket is not sealed against shrinking and growing: whoever else
    /// holds it could truncate it under this process's mapping (a `SIGBUS` on the next
    /// access). Nothing was mapped.
    #[error("the pool handed over the socket is not sealed against resizing (seals {seals:#x})")]
    Unsealed {
        /// The seals it carries.
        seals: i32,
    },
}
