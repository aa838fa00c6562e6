//! A pool's `MAP_SHARED` mapping: the CPU pool (an anonymous memory file, sealed against
//! resizing, that the node hands to the engines it admits over its socket) and the CXL
//! pools (a DAX device or a shared file). It owns the
//! on-media header, the mapping's lifetime and bounds-checked access to the data area; it
//! knows nothing of allocations (see `allocator`).
//!
//! Layout: one pool page of header at offset 0, then `data_bytes` of data. The header
//! (little-endian) is
//!
//! | offset | field |
//! | --- | --- |
//! | 0 | magic `KVTIERPL` |
//! | 8 | layout version (u32), then 4 zero bytes |
//! | 16 | pool UUID (u128) |
//! | 32 | data offset in bytes (u64, equal to the page size) |
//! | 40 | data size in bytes (u64) |
//! | 48 | page size in bytes (u64) |
//! | 56 | CRC-32C of bytes 8..56 (u32) |
//! | 64 | extent owner words of a shared pool, one u64 per extent to the page's end |
//!
//! The owner words (`model::extent_owner`) are outside the checksum: nodes change them
//! after the pool is made, each with one atomic compare-and-swap, never plain stores.
//!
//! The creator writes the magic last, so a reader of a half-written header sees
//! `WrongMagic` or `CorruptHeader`, never a plausible pool.
//!
//! Access contract (the aliasing rule): bytes are copied with `ptr::copy_nonoverlapping`
//! through raw pointers, so this module never forms a `&mut [u8]` over shared memory. The
//! page allocator hands each writer a range no other allocation overlaps, a writer writes
//! only while its replica is RESERVED/WRITING, and readers read only READY replicas, whose
//! content is immutable (invariants 1, 2 and 4 of docs/design.md). Other processes
//! follow the same protocol. Breaking it yields torn bytes, never an invalid Rust value
//! (`u8` has none).

use super::checksum;
use super::copy::{routines, CopyRoutine};
use super::error::PoolError;
use crate::model::{OwnerTable, OwnerWord};
use memmap2::{MmapOptions, MmapRaw};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};

/// Permissions of a pool file this process creates: the owner and its group (the engines
/// allowed to map the pool), nobody else.
pub const POOL_FILE_MODE: u32 = 0o660;

/// First bytes of every kvtier pool.
pub const POOL_MAGIC: [u8; 8] = *b"KVTIERPL";

/// The header layout this build writes and reads. Bump on any change of the table above.
pub const POOL_LAYOUT_VERSION: u32 = 1;

/// The smallest pool page: the x86-64 and aarch64 base page, so the data area starts on an
/// OS page boundary (a requirement of `O_DIRECT` and DMA registration).
pub const POOL_PAGE_BYTES_MIN: u64 = 4096;

/// Bytes of the header that carry fields; the rest of the header page is zero.
const HEADER_ENCODED_BYTES: usize = 60;
const MAGIC_RANGE: std::ops::Range<usize> = 0..8;
const CHECKSUMMED_RANGE: std::ops::Range<usize> = 8..56;

/// Where the extent owner words start in the header page.
const OWNER_WORDS_AT: u64 = 64;

const _: () = assert!(HEADER_ENCODED_BYTES as u64 <= OWNER_WORDS_AT);
const _: () = assert!(OWNER_WORDS_AT < POOL_PAGE_BYTES_MIN);
const _: () = assert!(POOL_PAGE_BYTES_MIN.is_power_of_two());

/// The fields of a pool header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    pool_uuid: u128,
    data_bytes: u64,
    page_bytes: u64,
}

impl Header {
    /// The header page doubles as the data offset, so data stays page-aligned.
    fn data_offset_bytes(&self) -> u64 {
        self.page_bytes
    }

    fn encode(&self) -> [u8; HEADER_ENCODED_BYTES] {
        let mut bytes = [0u8; HEADER_ENCODED_BYTES];
        bytes[MAGIC_RANGE].copy_from_slice(&POOL_MAGIC);
        bytes[8..12].copy_from_slice(&POOL_LAYOUT_VERSION.to_le_bytes());
        bytes[16..32].copy_from_slice(&self.pool_uuid.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.data_offset_bytes().to_le_bytes());
        bytes[40..48].copy_from_slice(&self.data_bytes.to_le_bytes());
        bytes[48..56].copy_from_slice(&self.page_bytes.to_le_bytes());
        let checksum = checksum::crc32c(&bytes[CHECKSUMMED_RANGE]);
        bytes[56..60].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Decodes and validates a header read from `path`, in the order that gives the most
    /// precise error: magic, version, checksum, then field consistency.
    fn decode(bytes: &[u8; HEADER_ENCODED_BYTES], path: &Path) -> Result<Self, PoolError> {
        let u64_at = |at: usize| u64::from_le_bytes(field(bytes, at));
        if bytes[MAGIC_RANGE] != POOL_MAGIC {
            return Err(PoolError::WrongMagic {
                path: path.to_owned(),
            });
        }
        let version = u32::from_le_bytes(field(bytes, 8));
        if version != POOL_LAYOUT_VERSION {
            return Err(PoolError::IncompatibleLayout {
                path: path.to_owned(),
                found: version,
                expected: POOL_LAYOUT_VERSION,
            });
        }
        let corrupt = |reason| PoolError::CorruptHeader {
            path: path.to_owned(),
            reason,
        };
        let checksum = u32::from_le_bytes(field(bytes, 56));
        if checksum != checksum::crc32c(&bytes[CHECKSUMMED_RANGE]) {
            return Err(corrupt("checksum mismatch"));
        }
        let header = Header {
            pool_uuid: u128::from_le_bytes(field(bytes, 16)),
            data_bytes: u64_at(40),
            page_bytes: u64_at(48),
        };
        if validate_geometry(header.data_bytes, header.page_bytes).is_err() {
            return Err(corrupt("page or data size out of range"));
        }
        if u64_at(32) != header.data_offset_bytes() {
            return Err(corrupt("data offset differs from the page size"));
        }
        Ok(header)
    }
}

/// The `N` header bytes at `at` (a constant offset inside the encoded header).
fn field<const N: usize>(bytes: &[u8; HEADER_ENCODED_BYTES], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

/// Checks a pool's geometry and returns its mapped size (header page plus data).
fn validate_geometry(data_bytes: u64, page_bytes: u64) -> Result<u64, PoolError> {
    if !page_bytes.is_power_of_two() || page_bytes < POOL_PAGE_BYTES_MIN {
        return Err(PoolError::InvalidConfig {
            reason: "page size must be a power of two of at least 4096 bytes",
        });
    }
    if data_bytes == 0 || data_bytes % page_bytes != 0 {
        return Err(PoolError::InvalidConfig {
            reason: "data size must be a positive multiple of the page size",
        });
    }
    let total_bytes = data_bytes
        .checked_add(page_bytes)
        .filter(|total| usize::try_from(*total).is_ok());
    total_bytes.ok_or(PoolError::InvalidConfig {
        reason: "pool does not fit in the address space",
    })
}

/// A mapped pool: header verified, data area pre-faulted and shared with every process
/// that maps the same path. Offsets in every method are relative to the data area.
///
/// Thread safety: `SharedMemory` is `Send + Sync` through `memmap2::MmapRaw` (which is both)
/// and adds no interior state; that is sound because it hands out no `&mut` into the
/// mapping and every mutation is a raw copy under the access contract of the module doc.
#[derive(Debug)]
pub struct SharedMemory {
    path: PathBuf,
    header: Header,
    map: MmapRaw,
    /// The sealed memory file of a pool [`SharedMemory::create_sealed`] made, to hand to
    /// the processes that may map it; `None` for a pool mapped from a path.
    handle: Option<File>,
    /// Whether the mapping may be written ([`Access::ReadOnly`] maps it read-only).
    writable: bool,
}

/// How a process maps a pool handed to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read and write: a pool the process stores into.
    ReadWrite,
    /// Read only, through a read-only descriptor: every write is refused (`ReadOnly`), and
    /// the kernel would fault one through a stray pointer.
    ReadOnly,
}

/// The seals every pool handed over a socket carries: nobody, its creator included, can
/// shrink or grow it, so no holder can pull pages from under another's mapping.
const RESIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SharedMemory>();
};

impl SharedMemory {
    /// Creates the regular file at `path` (exclusively: a path that exists is refused), sizes it to one page of header
    /// plus `data_bytes`, allocates its storage (so a full `/dev/shm` fails here with `Io`
    /// instead of a SIGBUS on a later write), maps it `MAP_SHARED`, pre-faults every page
    /// and writes the header. The data area reads as zero. `page_bytes` must be a power of
    /// two of at least [`POOL_PAGE_BYTES_MIN`] and divide `data_bytes` (`InvalidConfig`).
    /// Destroys any previous content at `path`: only the pool's owner calls it, once.
    pub fn create(
        path: &Path,
        data_bytes: u64,
        pool_uuid: u128,
        page_bytes: u64,
    ) -> Result<Self, PoolError> {
        Self::create_reporting(path, data_bytes, pool_uuid, page_bytes, &mut |_| {})
    }

    /// [`SharedMemory::create`], calling `progress` with the bytes pre-faulted so far after
    /// each step of [`PREFAULT_STEP_BYTES`] (a large pool takes about a second per GiB).
    pub fn create_reporting(
        path: &Path,
        data_bytes: u64,
        pool_uuid: u128,
        page_bytes: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self, PoolError> {
        validate_geometry(data_bytes, page_bytes)?;
        let file = open_pool_file(path, true)?;
        // The umask narrowed the creation mode (0640 under the usual 022): the group of
        // engines allowed to map the pool needs write access too.
        file.set_permissions(std::fs::Permissions::from_mode(POOL_FILE_MODE))
            .map_err(|source| PoolError::Io {
                path: path.to_owned(),
                source,
            })?;
        Self::initialize(path, &file, data_bytes, pool_uuid, page_bytes, progress)
    }

    /// Formats a device or file that exists but holds no kvtier pool (a fresh DAX device,
    /// typically): sizes a regular file that is too short, maps it, pre-faults it and writes
    /// the header. Refuses a path that is a link, and one whose first bytes already carry
    /// the pool magic (`InvalidConfig`: another pool's data is never formatted away). A
    /// file that is too short is extended, a device (`fallocate` gives `ENODEV`) is used as it
    /// is. A regular file another user owns or every user may write is refused (`NotOurs`).
    /// The caller decides that the path may be formatted; nothing here can tell a blank device
    /// from one holding someone else's data.
    pub fn format_existing(
        path: &Path,
        data_bytes: u64,
        pool_uuid: u128,
        page_bytes: u64,
    ) -> Result<Self, PoolError> {
        validate_geometry(data_bytes, page_bytes)?;
        let io = |source| PoolError::Io {
            path: path.to_owned(),
            source,
        };
        let file = open_pool_file(path, false)?;
        check_adoptable(path, &file.metadata().map_err(io)?)?;
        let mut magic = [0u8; MAGIC_RANGE.end];
        match file.read_exact_at(&mut magic, 0) {
            Ok(()) if magic == POOL_MAGIC => {
                return Err(PoolError::InvalidConfig {
                    reason: "the path already holds a kvtier pool",
                })
            }
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {}
            Err(error) => return Err(io(error)),
        }
        Self::initialize(path, &file, data_bytes, pool_uuid, page_bytes, &mut |_| {})
    }

    /// Maps `file` (at least one header page plus `data_bytes` long, or a device), pre-faults
    /// it and writes the header, magic last. Sizes a regular file (see [`allocate_storage`]).
    fn initialize(
        path: &Path,
        file: &File,
        data_bytes: u64,
        pool_uuid: u128,
        page_bytes: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self, PoolError> {
        let total_bytes = validate_geometry(data_bytes, page_bytes)?;
        let io = |source| PoolError::Io {
            path: path.to_owned(),
            source,
        };
        allocate_storage(file, total_bytes).map_err(io)?;
        let map = map_populated(file, total_bytes, progress).map_err(io)?;
        let header = Header {
            pool_uuid,
            data_bytes,
            page_bytes,
        };
        let encoded = header.encode();
        // SAFETY: the mapping is at least one page (>= HEADER_ENCODED_BYTES) long and lives
        // in `map`; only the pool's owner creates it, so no one else writes the header. Fields
        // first, then the magic; the fence only keeps the compiler and CPU from reordering
        // the two copies; a reader relies on the checksum, not on this order.
        unsafe {
            let base = map.as_mut_ptr();
            let fields = &encoded[MAGIC_RANGE.end..];
            std::ptr::copy_nonoverlapping(fields.as_ptr(), base.add(MAGIC_RANGE.end), fields.len());
            fence(Ordering::Release);
            std::ptr::copy_nonoverlapping(encoded.as_ptr(), base, MAGIC_RANGE.end);
        }
        Ok(Self {
            path: path.to_owned(),
            header,
            map,
            handle: None,
            writable: true,
        })
    }

    /// Creates a pool in an anonymous memory file (`memfd_create`, named `name` in
    /// `/proc/PID/maps`), as [`SharedMemory::create`] does in a file, then seals it against
    /// shrinking, growing and further sealing. No path reaches it: the creator hands
    /// [`SharedMemory::handle`] to whom it chooses (over a Unix socket), and it ends with
    /// the last process holding it. `Io` when the kernel refuses the file or its memory.
    pub fn create_sealed(
        name: &str,
        data_bytes: u64,
        pool_uuid: u128,
        page_bytes: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self, PoolError> {
        use std::os::fd::FromRawFd;
        let label = PathBuf::from(format!("memfd:{name}"));
        let io = |source| PoolError::Io {
            path: label.clone(),
            source,
        };
        let c_name = std::ffi::CString::new(name).map_err(|_| PoolError::InvalidConfig {
            reason: "a pool's name holds a NUL byte",
        })?;
        // SAFETY: `c_name` is a NUL-terminated string that outlives the call.
        let fd = unsafe {
            libc::memfd_create(c_name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        // A memory file is made with mode 0777: anyone holding a descriptor could open it
        // again read-write through /proc. Only its owner may (the node reopens it read-only
        // for clients that never write it).
        // SAFETY: a plain fchmod on a descriptor we own; no memory is passed.
        if unsafe { libc::fchmod(file.as_raw_fd(), 0o600) } != 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        let mut pool =
            Self::initialize(&label, &file, data_bytes, pool_uuid, page_bytes, progress)?;
        let seals = RESIZE_SEALS | libc::F_SEAL_SEAL;
        // SAFETY: a plain fcntl on a descriptor we own; no memory is passed.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io(std::io::Error::last_os_error()));
        }
        pool.handle = Some(file);
        Ok(pool)
    }

    /// Maps a pool handed over a socket (a node's CPU partition from
    /// [`SharedMemory::create_sealed`], or a CXL pool it adopted), verifying its header as
    /// [`SharedMemory::open`] does. With `sealed`, the file must carry the resize seals
    /// (`Unsealed` otherwise): a CPU pool always does; a CXL pool is a device or a shared
    /// file that cannot carry them. With [`Access::ReadOnly`] the mapping is read-only (the
    /// descriptor may be open read-only); otherwise `Io` when the descriptor is. Never
    /// writes.
    pub fn from_handle(
        handle: std::os::fd::OwnedFd,
        expected_uuid: Option<u128>,
        sealed: bool,
        access: Access,
    ) -> Result<Self, PoolError> {
        let file = File::from(handle);
        let label = PathBuf::from(format!("fd:{}", file.as_raw_fd()));
        if sealed {
            // SAFETY: a plain fcntl on a descriptor we own; no memory is passed.
            let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
            if seals < 0 || seals & RESIZE_SEALS != RESIZE_SEALS {
                return Err(PoolError::Unsealed { seals });
            }
        }
        Self::verify_and_map(&label, &file, expected_uuid, access)
    }

    /// The file a process may be handed to map this pool: for a pool made by
    /// [`SharedMemory::create_sealed`] or adopted ([`SharedMemory::adopt`]), not for one
    /// only opened by path.
    pub fn handle(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.handle.as_ref().map(|file| file.as_fd())
    }

    /// Maps an existing pool at `path` (a file or a DAX device) after verifying its header:
    /// `WrongMagic` (not a pool), `IncompatibleLayout` (other version), `CorruptHeader`,
    /// `WrongPool` (UUID differs from `expected_uuid`, when given), `Truncated` (file shorter
    /// than the header says). Pre-faults the mapping; never writes. Safe to repeat, from any
    /// number of processes. Never through a symbolic link.
    pub fn open(path: &Path, expected_uuid: Option<u128>) -> Result<Self, PoolError> {
        Self::open_file(path, expected_uuid, false)
    }

    /// As [`SharedMemory::open`], for a pool this process adopts as its own (the directory
    /// serving a CXL pool, a node mapping one): the path must be a device, or a regular file
    /// owned by this process's user or root that no other user may write; otherwise
    /// `NotOurs`, before anything is read or mapped (a file planted at a pool's path by
    /// someone else is never adopted).
    pub fn adopt(path: &Path, expected_uuid: Option<u128>) -> Result<Self, PoolError> {
        Self::open_file(path, expected_uuid, true)
    }

    fn open_file(
        path: &Path,
        expected_uuid: Option<u128>,
        adopting: bool,
    ) -> Result<Self, PoolError> {
        let io = |source| PoolError::Io {
            path: path.to_owned(),
            source,
        };
        let file = open_pool_file(path, false)?;
        if !adopting {
            return Self::verify_and_map(path, &file, expected_uuid, Access::ReadWrite);
        }
        check_adoptable(path, &file.metadata().map_err(io)?)?;
        let mut pool = Self::verify_and_map(path, &file, expected_uuid, Access::ReadWrite)?;
        pool.handle = Some(file);
        Ok(pool)
    }

    /// Reads and verifies the header of `file` (named `path` in errors), checks its length,
    /// and maps it pre-faulted, with `access`.
    fn verify_and_map(
        path: &Path,
        file: &File,
        expected_uuid: Option<u128>,
        access: Access,
    ) -> Result<Self, PoolError> {
        let io = |source| PoolError::Io {
            path: path.to_owned(),
            source,
        };
        let mut bytes = [0u8; HEADER_ENCODED_BYTES];
        match file.read_exact_at(&mut bytes, 0) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(PoolError::WrongMagic {
                    path: path.to_owned(),
                })
            }
            Err(error) => return Err(io(error)),
        }
        let header = Header::decode(&bytes, path)?;
        if let Some(expected) = expected_uuid.filter(|uuid| *uuid != header.pool_uuid) {
            return Err(PoolError::WrongPool {
                path: path.to_owned(),
                found: header.pool_uuid,
                expected,
            });
        }
        // `decode` validated the geometry, so this cannot fail.
        let total_bytes = validate_geometry(header.data_bytes, header.page_bytes)?;
        let metadata = file.metadata().map_err(io)?;
        // A DAX device reports no length; only a regular file can be checked here.
        if !metadata.file_type().is_char_device() && metadata.len() < total_bytes {
            return Err(PoolError::Truncated {
                path: path.to_owned(),
                file_bytes: metadata.len(),
                expected_bytes: total_bytes,
            });
        }
        let map = match access {
            Access::ReadWrite => map_populated(file, total_bytes, &mut |_| {}),
            Access::ReadOnly => map_read_only(file, total_bytes),
        }
        .map_err(io)?;
        Ok(Self {
            path: path.to_owned(),
            header,
            map,
            handle: None,
            writable: access == Access::ReadWrite,
        })
    }

    /// The file or device this pool is mapped from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pool UUID from the header.
    pub fn pool_uuid(&self) -> u128 {
        self.header.pool_uuid
    }

    /// Size of the data area (excluding the header page).
    pub fn data_bytes(&self) -> u64 {
        self.header.data_bytes
    }

    /// The pool page size from the header.
    pub fn page_bytes(&self) -> u64 {
        self.header.page_bytes
    }

    /// Copies `data` to `offset..offset + data.len()` of the data area; `OutOfBounds` (and
    /// nothing written) if the range leaves it. The caller must own the range under the
    /// module's access contract: an allocation it is writing, that no reader reads yet.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        let start = self.writable_pointer(offset, data.len() as u64)?;
        // SAFETY: `data_pointer` checked the range lies inside the mapping, which lives as
        // long as `self`; `data` is process-private memory, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), start, data.len()) };
        Ok(())
    }

    /// [`SharedMemory::write_at`] for a bulk copy (an object's bytes), with the store routine
    /// this machine runs fastest ([`copy`](super::copy)): every byte is visible to other
    /// processes and hosts when it returns.
    pub fn store_at(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        self.copy_at(routines().store, offset, data)
    }

    /// [`SharedMemory::write_at`] with the given copy routine (a benchmark's limits).
    pub fn copy_at(&self, routine: CopyRoutine, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        let start = self.writable_pointer(offset, data.len() as u64)?;
        // SAFETY: as in `write_at`: the range lies inside the mapping and cannot overlap
        // `data`, which lies in another mapping or in process-private memory.
        unsafe { routine.copy(data.as_ptr(), start, data.len()) };
        Ok(())
    }

    /// Copies `offset..offset + buffer.len()` of the data area into `buffer`; `OutOfBounds`
    /// (and `buffer` untouched) if the range leaves it. The range should be READY content
    /// (immutable); otherwise the copy may be torn.
    pub fn read_at(&self, offset: u64, buffer: &mut [u8]) -> Result<(), PoolError> {
        let start = self.data_pointer(offset, buffer.len() as u64)?;
        // SAFETY: as in `write_at`, with source and destination swapped.
        unsafe { std::ptr::copy_nonoverlapping(start, buffer.as_mut_ptr(), buffer.len()) };
        Ok(())
    }

    /// A zero-copy view of `offset..offset + length_bytes` of the data area; `OutOfBounds`
    /// if the range leaves it. The caller must keep the range immutable while the view
    /// lives: READY content under a lease, released only after the view is dropped.
    pub fn slice(&self, offset: u64, length_bytes: u64) -> Result<&[u8], PoolError> {
        let start = self.data_pointer(offset, length_bytes)?;
        // SAFETY: the range lies inside the mapping, which outlives the borrow of `self`;
        // `u8` has no invalid values; immutability for the view's lifetime is the caller's
        // contract above. `data_pointer` proved `length_bytes` fits in the mapping's usize.
        Ok(unsafe { std::slice::from_raw_parts(start, length_bytes as usize) })
    }

    /// Whether this mapping may be written (not mapped with [`Access::ReadOnly`]).
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// [`SharedMemory::data_pointer`] for a write: `ReadOnly` on a read-only mapping.
    fn writable_pointer(&self, offset: u64, length_bytes: u64) -> Result<*mut u8, PoolError> {
        if !self.writable {
            return Err(PoolError::ReadOnly);
        }
        self.data_pointer(offset, length_bytes)
    }

    /// The address of data-area `offset`, after checking `offset..offset + length_bytes`
    /// lies within the data area.
    fn data_pointer(&self, offset: u64, length_bytes: u64) -> Result<*mut u8, PoolError> {
        let limit_bytes = self.header.data_bytes;
        let within = offset
            .checked_add(length_bytes)
            .is_some_and(|end| end <= limit_bytes);
        if !within {
            return Err(PoolError::OutOfBounds {
                offset,
                length_bytes,
                limit_bytes,
            });
        }
        // The whole mapping fits in usize (checked when mapped), so these casts are exact.
        let at = (self.header.data_offset_bytes() + offset) as usize;
        // SAFETY: `at + length_bytes <= mapping length`, so the pointer stays in bounds.
        Ok(unsafe { self.map.as_mut_ptr().add(at) })
    }
}

impl SharedMemory {
    /// How many extent owner words the header page holds.
    pub fn owner_words(&self) -> u64 {
        (self.header.data_offset_bytes() - OWNER_WORDS_AT) / 8
    }

    /// The owner word of extent `index`, in place; `None` past the header page.
    fn owner_word_cell(&self, index: u64) -> Option<&AtomicU64> {
        if index >= self.owner_words() {
            return None;
        }
        let at = (OWNER_WORDS_AT + index * 8) as usize;
        // SAFETY: `at + 8` lies within the header page, which is mapped for the mapping's
        // lifetime (tied to `&self`) and 8-byte aligned (the mapping is page-aligned and
        // `at` a multiple of 8). Every process accesses owner words only atomically
        // (module documentation), so no non-atomic access races with this one.
        Some(unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(at).cast()) })
    }
}

impl OwnerTable for SharedMemory {
    fn owner_word(&self, index: u64) -> Option<OwnerWord> {
        self.owner_word_cell(index)
            .map(|cell| OwnerWord(cell.load(Ordering::Acquire)))
    }

    fn replace_owner_word(
        &self,
        index: u64,
        expected: OwnerWord,
        new: OwnerWord,
    ) -> Result<(), Option<OwnerWord>> {
        if !self.writable {
            return Err(None);
        }
        let cell = self.owner_word_cell(index).ok_or(None)?;
        cell.compare_exchange(expected.0, new.0, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
            .map_err(|found| Some(OwnerWord(found)))
    }
}

/// Refuses to adopt a file another user could have planted or can still rewrite: a regular
/// file must be owned by this process's effective user or root and not writable by others.
/// A device node is the administrator's (only root creates one).
fn check_adoptable(path: &Path, metadata: &std::fs::Metadata) -> Result<(), PoolError> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |reason| PoolError::NotOurs {
        path: path.to_owned(),
        owner: metadata.uid(),
        mode: metadata.mode() & 0o7777,
        reason,
    };
    let file_type = metadata.file_type();
    if file_type.is_char_device() || file_type.is_block_device() {
        return Ok(());
    }
    if !file_type.is_file() {
        return Err(refuse("neither a regular file nor a device"));
    }
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    if metadata.uid() != own && metadata.uid() != 0 {
        return Err(refuse("owned by another user"));
    }
    if metadata.mode() & 0o002 != 0 {
        return Err(refuse("writable by every user"));
    }
    Ok(())
}

/// Opens `path` read-write, never through a link; with `create`, creates it exclusively
/// (never a file someone put there first) with [`POOL_FILE_MODE`]: readable only by its
/// owner and group, the node and the engines allowed to map it.
fn open_pool_file(path: &Path, create: bool) -> Result<File, PoolError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .mode(POOL_FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|source| PoolError::Io {
            path: path.to_owned(),
            source,
        })
}

/// Gives the file `total_bytes` of allocated storage. `fallocate` reserves the pages now;
/// a file system without it gets a sparse `set_len` (its pages come at first touch); a
/// device without it (a DAX device answers `ENODEV`) is used as it is.
fn allocate_storage(file: &File, total_bytes: u64) -> std::io::Result<()> {
    let length = libc::off_t::try_from(total_bytes)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a plain system call on a descriptor we own; no memory is passed.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, length) };
    if result == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        // A device (DAX gives ENODEV) has its storage already; `set_len` would fail on it.
        Some(libc::ENODEV) if !file.metadata()?.is_file() => Ok(()),
        Some(libc::EOPNOTSUPP | libc::ENODEV) => file.set_len(total_bytes),
        _ => Err(error),
    }
}

/// Bytes pre-faulted per step: small enough that progress moves several times a second,
/// large enough that the steps' system calls cost nothing next to the faults.
pub const PREFAULT_STEP_BYTES: usize = 64 << 20;

/// Maps `total_bytes` of `file` read-write `MAP_SHARED` and pre-faults every page writable,
/// so every page is resident and mapped before the first access (a first touch costs
/// 2–16 µs a page), in steps of [`PREFAULT_STEP_BYTES`] with `MADV_POPULATE_WRITE` (which
/// writes nothing), calling `progress` with the bytes done after each. A kernel without it
/// (before 5.14) gets one `MAP_POPULATE` mapping instead, without progress.
///
/// Before populating it asks for transparent huge pages (`MADV_HUGEPAGE`): where the kernel
/// backs the file with them on request, copies into and out of the pool miss the TLB far
/// less. For the CPU pool, a memory file of the kernel's internal mount, that is
/// `/sys/kernel/mm/transparent_hugepage/shmem_enabled` (`advise`, `within_size` or
/// `always`); for a file on a tmpfs mount such as `/dev/shm` (an emulated CXL pool) it is
/// the mount's `huge=` option (the default is `never`). Elsewhere (`never`, a kernel
/// without them, a device) the advice is refused or ignored and the pool keeps base pages,
/// which only costs copy speed.
fn map_populated(
    file: &File,
    total_bytes: u64,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<MmapRaw> {
    let length = usize::try_from(total_bytes)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let map = MmapOptions::new().len(length).map_raw(file)?;
    advise_huge_pages(&map, length);
    let mut done = 0;
    while done < length {
        let step = (length - done).min(PREFAULT_STEP_BYTES);
        // SAFETY: `[done, done + step)` lies inside the mapping `map` owns; populating
        // neither reads nor writes its bytes.
        let result = unsafe {
            libc::madvise(
                map.as_mut_ptr().add(done).cast(),
                step,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if result != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EINVAL) {
                drop(map);
                let map = MmapOptions::new().len(length).populate().map_raw(file)?;
                advise_huge_pages(&map, length);
                return Ok(map);
            }
            return Err(error);
        }
        done += step;
        progress(done as u64);
    }
    Ok(map)
}

/// Maps `total_bytes` of `file` read-only `MAP_SHARED` and pre-faults it for reading
/// (`MADV_POPULATE_READ`; a kernel without it, before 5.14, gets `MAP_POPULATE`), with the
/// huge-page advice of [`map_populated`].
fn map_read_only(file: &File, total_bytes: u64) -> std::io::Result<MmapRaw> {
    let length = usize::try_from(total_bytes)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let map = MmapOptions::new().len(length).map_raw_read_only(file)?;
    advise_huge_pages(&map, length);
    // SAFETY: the range is exactly the mapping `map` owns; populating reads nothing.
    let result =
        unsafe { libc::madvise(map.as_mut_ptr().cast(), length, libc::MADV_POPULATE_READ) };
    if result != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        drop(map);
        let map = MmapOptions::new()
            .len(length)
            .populate()
            .map_raw_read_only(file)?;
        advise_huge_pages(&map, length);
        return Ok(map);
    }
    Ok(map)
}

/// Asks for transparent huge pages on the `length` bytes of `map` (see [`map_populated`]);
/// a refusal only leaves base pages, and is logged at debug.
fn advise_huge_pages(map: &MmapRaw, length: usize) {
    // SAFETY: the range is exactly the mapping `map` owns; the advice changes no content.
    let result = unsafe { libc::madvise(map.as_mut_ptr().cast(), length, libc::MADV_HUGEPAGE) };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        tracing::debug!(%error, "MADV_HUGEPAGE refused; the pool keeps base pages");
    }
}

#[cfg(test)]
pub(crate) mod tests;
