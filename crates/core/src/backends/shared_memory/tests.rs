//! The shared mapping's tests, and the `/dev/shm` paths other modules' tests use.

use super::*;
use std::os::fd::FromRawFd;
use std::sync::atomic::AtomicU64;

/// A unique `/dev/shm` path, removed when dropped (also when a test fails).
pub(crate) struct ShmPath(pub(crate) PathBuf);

impl ShmPath {
    pub(crate) fn new(tag: &str) -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let sequence = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("kvtier-test-{tag}-{}-{sequence}", std::process::id());
        Self(Path::new("/dev/shm").join(name))
    }
}

impl Drop for ShmPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const PAGE: u64 = 4096;
const UUID: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;

#[test]
fn a_pool_file_is_mode_0660_whatever_the_umask() {
    let path = std::env::temp_dir().join(format!("kvtier-mode-{}", std::process::id()));
    let memory = SharedMemory::create(&path, 1 << 20, 7, 4096).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, POOL_FILE_MODE);
    drop(memory);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_pre_fault_reports_each_step_up_to_the_whole_mapping() {
    let path = ShmPath::new("prefault");
    let step = PREFAULT_STEP_BYTES as u64;
    let mut reported = Vec::new();
    let memory = SharedMemory::create_reporting(&path.0, 2 * step, UUID, PAGE, &mut |done| {
        reported.push(done)
    })
    .unwrap();
    // The header page, then the data area.
    assert_eq!(reported, [step, 2 * step, 2 * step + PAGE]);
    assert!(memory.slice(0, PAGE).unwrap().iter().all(|byte| *byte == 0));
}

#[test]
fn a_streamed_copy_lands_whole_at_any_alignment_and_length() {
    let path = ShmPath::new("stream");
    let memory = SharedMemory::create(&path.0, 16 * PAGE, UUID, PAGE).unwrap();
    let source: Vec<u8> = (0..3 * PAGE as usize)
        .map(|index| (index * 7 + 3) as u8)
        .collect();
    for (offset, length) in [(0, 0), (0, 1), (1, 63), (5, 64), (16, 200), (7, 3 * PAGE)] {
        memory.write_at(0, &vec![0xee; 4 * PAGE as usize]).unwrap();
        let data = &source[..length as usize];
        memory.store_at(offset, data).unwrap();
        assert_eq!(
            memory.slice(offset, length).unwrap(),
            data,
            "at {offset} for {length}"
        );
        let around = memory.slice(0, 4 * PAGE).unwrap();
        assert!(around[..offset as usize].iter().all(|byte| *byte == 0xee));
        assert!(around[(offset + length) as usize..]
            .iter()
            .all(|byte| *byte == 0xee));
    }
    assert!(matches!(
        memory.store_at(16 * PAGE - 1, &[1, 2]),
        Err(PoolError::OutOfBounds { .. })
    ));
}

#[test]
fn create_then_open_shares_bytes() {
    let path = ShmPath::new("share");
    let creator = SharedMemory::create(&path.0, 16 * PAGE, UUID, PAGE).unwrap();
    assert_eq!(std::fs::metadata(&path.0).unwrap().len(), 17 * PAGE);
    creator.write_at(3 * PAGE + 5, b"prefix kv").unwrap();

    let other = SharedMemory::open(&path.0, Some(UUID)).unwrap();
    assert_eq!(
        (other.data_bytes(), other.page_bytes(), other.pool_uuid()),
        (16 * PAGE, PAGE, UUID)
    );
    assert_eq!(other.slice(3 * PAGE + 5, 9).unwrap(), b"prefix kv");
    other.write_at(16 * PAGE - 2, b"ok").unwrap();
    let mut buffer = [0u8; 2];
    creator.read_at(16 * PAGE - 2, &mut buffer).unwrap();
    assert_eq!(&buffer, b"ok");
    assert!(creator
        .slice(0, PAGE)
        .unwrap()
        .iter()
        .all(|byte| *byte == 0));
    SharedMemory::open(&path.0, None).unwrap();
}

/// A pool file someone else planted, or can still rewrite, is never adopted; no pool is
/// opened through a link.
#[test]
fn a_sealed_pool_is_shared_through_its_handle_and_cannot_be_resized() {
    let pool = SharedMemory::create_sealed("kvtier-test-sealed", 4 * PAGE, UUID, PAGE, &mut |_| {})
        .unwrap();
    pool.write_at(PAGE, b"handed").unwrap();
    let handle = pool.handle().unwrap().try_clone_to_owned().unwrap();
    let file = File::from(handle.try_clone().unwrap());
    for target in [0, PAGE, 10 * PAGE] {
        let error = file.set_len(target).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EPERM), "set_len({target})");
    }
    let mapped = SharedMemory::from_handle(handle, Some(UUID), true, Access::ReadWrite).unwrap();
    let mut read = [0u8; 6];
    mapped.read_at(PAGE, &mut read).unwrap();
    assert_eq!(&read, b"handed");
    assert!(matches!(
        SharedMemory::from_handle(file.into(), Some(UUID ^ 1), true, Access::ReadWrite),
        Err(PoolError::WrongPool { .. })
    ));
    // A memory file without the seals is refused before it is mapped.
    // SAFETY: a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"kvtier-test-unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: just created, owned by nothing else.
    let unsealed = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    assert!(matches!(
        SharedMemory::from_handle(unsealed, None, true, Access::ReadWrite),
        Err(PoolError::Unsealed { .. })
    ));
    // A pool only opened by path has no handle to give; an adopted one has.
    let path = ShmPath::new("no-handle");
    SharedMemory::create(&path.0, PAGE, UUID, PAGE).unwrap();
    assert!(SharedMemory::open(&path.0, Some(UUID))
        .unwrap()
        .handle()
        .is_none());
    let adopted = SharedMemory::adopt(&path.0, Some(UUID)).unwrap();
    let handle = adopted.handle().unwrap().try_clone_to_owned().unwrap();
    assert!(matches!(
        SharedMemory::from_handle(
            handle.try_clone().unwrap(),
            Some(UUID),
            true,
            Access::ReadWrite
        ),
        Err(PoolError::Unsealed { .. })
    ));
    assert_eq!(
        SharedMemory::from_handle(handle, Some(UUID), false, Access::ReadWrite)
            .unwrap()
            .data_bytes(),
        PAGE
    );
}

/// A pool handed through a read-only descriptor is mapped read-only: it reads what the
/// writer writes, refuses every write with a typed error, and its descriptor can neither
/// write nor truncate the file; a read-write mapping through it is refused by the kernel.
#[test]
fn a_pool_handed_read_only_reads_and_refuses_writes() {
    use std::os::unix::fs::FileExt;
    let pool =
        SharedMemory::create_sealed("kvtier-test-read-only", 4 * PAGE, UUID, PAGE, &mut |_| {})
            .unwrap();
    pool.write_at(PAGE, b"shared").unwrap();
    let reopen = || {
        File::open(format!(
            "/proc/self/fd/{}",
            pool.handle().unwrap().as_raw_fd()
        ))
    };
    let read_only = reopen().unwrap();
    // Only the owner may open the file again (read-write, through /proc): mode 0600.
    let mode = read_only.metadata().unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    assert!(
        read_only.set_len(0).is_err(),
        "truncated through a read-only descriptor"
    );
    assert!(read_only.write_at(b"x", PAGE).is_err());
    let mapped =
        SharedMemory::from_handle(read_only.into(), Some(UUID), true, Access::ReadOnly).unwrap();
    assert!(!mapped.is_writable() && pool.is_writable());
    let mut read = [0u8; 6];
    mapped.read_at(PAGE, &mut read).unwrap();
    assert_eq!(&read, b"shared");
    assert!(matches!(
        mapped.write_at(PAGE, b"x"),
        Err(PoolError::ReadOnly)
    ));
    assert!(matches!(
        mapped.store_at(PAGE, b"x"),
        Err(PoolError::ReadOnly)
    ));
    pool.write_at(PAGE, b"SHARED").unwrap();
    assert_eq!(mapped.slice(PAGE, 6).unwrap(), b"SHARED");
    assert!(matches!(
        SharedMemory::from_handle(
            reopen().unwrap().into(),
            Some(UUID),
            true,
            Access::ReadWrite
        ),
        Err(PoolError::Io { .. })
    ));
}

#[test]
fn a_planted_or_linked_pool_file_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let path = ShmPath::new("planted");
    let pool = SharedMemory::create(&path.0, 4 * PAGE, UUID, PAGE).unwrap();
    drop(pool);
    assert!(SharedMemory::adopt(&path.0, Some(UUID)).is_ok());
    let link = ShmPath::new("planted-link");
    std::os::unix::fs::symlink(&path.0, &link.0).unwrap();
    assert!(matches!(
        SharedMemory::open(&link.0, Some(UUID)),
        Err(PoolError::Io { .. })
    ));
    std::fs::set_permissions(&path.0, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(matches!(
        SharedMemory::adopt(&path.0, Some(UUID)),
        Err(PoolError::NotOurs { .. })
    ));
    assert!(matches!(
        SharedMemory::format_existing(&path.0, 4 * PAGE, UUID, PAGE),
        Err(PoolError::NotOurs { .. })
    ));
    std::fs::set_permissions(&path.0, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Another owner: only root can give a file away, and only to test this.
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&path.0, Some(65534), None).unwrap();
        assert!(matches!(
            SharedMemory::adopt(&path.0, Some(UUID)),
            Err(PoolError::NotOurs { .. })
        ));
    } else {
        println!("not root: a file of another owner cannot be made here; that case is untried");
    }
    // A client maps the node's pool by the path the node names: no ownership rule.
    assert!(SharedMemory::open(&path.0, Some(UUID)).is_ok());
}

#[test]
fn format_existing_takes_a_blank_path_and_never_a_pool() {
    let path = ShmPath::new("format");
    std::fs::write(&path.0, vec![0xa5u8; 100]).unwrap();
    assert!(matches!(
        SharedMemory::open(&path.0, Some(UUID)),
        Err(PoolError::WrongMagic { .. })
    ));
    let formatted = SharedMemory::format_existing(&path.0, 4 * PAGE, UUID, PAGE).unwrap();
    formatted.write_at(0, b"kv").unwrap();
    assert_eq!(std::fs::metadata(&path.0).unwrap().len(), 5 * PAGE);
    let opened = SharedMemory::open(&path.0, Some(UUID)).unwrap();
    assert_eq!(opened.slice(0, 2).unwrap(), b"kv");
    let again = SharedMemory::format_existing(&path.0, 4 * PAGE, UUID + 1, PAGE);
    assert!(
        matches!(again, Err(PoolError::InvalidConfig { .. })),
        "a pool was formatted away: {again:?}"
    );
    assert_eq!(
        SharedMemory::open(&path.0, Some(UUID))
            .unwrap()
            .slice(0, 2)
            .unwrap(),
        b"kv"
    );
    let link = ShmPath::new("format-link");
    std::os::unix::fs::symlink(&path.0, &link.0).unwrap();
    assert!(matches!(
        SharedMemory::format_existing(&link.0, 4 * PAGE, UUID, PAGE),
        Err(PoolError::Io { .. })
    ));
}

#[test]
fn access_outside_the_data_area_is_refused() {
    let path = ShmPath::new("bounds");
    let pool = SharedMemory::create(&path.0, 2 * PAGE, UUID, PAGE).unwrap();
    let mut buffer = [7u8; 4];
    let rows = [(2 * PAGE - 3, 4u64), (2 * PAGE, 1), (u64::MAX, 4)];
    for (offset, length) in rows {
        assert!(matches!(
            pool.write_at(offset, &buffer),
            Err(PoolError::OutOfBounds { .. })
        ));
        assert!(matches!(
            pool.read_at(offset, &mut buffer),
            Err(PoolError::OutOfBounds { .. })
        ));
        assert!(matches!(
            pool.slice(offset, length),
            Err(PoolError::OutOfBounds { .. })
        ));
    }
    assert_eq!(buffer, [7u8; 4]);
    assert_eq!(pool.slice(2 * PAGE, 0).unwrap(), b"");
}

#[test]
fn invalid_geometry_is_refused() {
    let path = ShmPath::new("geometry");
    let rows = [
        (4 * PAGE, 2048u64),
        (4 * PAGE, 3 * PAGE),
        (0, PAGE),
        (PAGE + 1, PAGE),
    ];
    for (data_bytes, page_bytes) in rows {
        let result = SharedMemory::create(&path.0, data_bytes, UUID, page_bytes);
        assert!(
            matches!(result, Err(PoolError::InvalidConfig { .. })),
            "{result:?}"
        );
    }
}

#[test]
fn open_refuses_what_is_not_this_pool() {
    let path = ShmPath::new("verify");
    drop(SharedMemory::create(&path.0, 4 * PAGE, UUID, PAGE).unwrap());
    assert!(matches!(
        SharedMemory::open(&path.0, Some(UUID + 1)),
        Err(PoolError::WrongPool { found: UUID, .. })
    ));

    let file = OpenOptions::new().write(true).open(&path.0).unwrap();
    let patch = |offset: u64, bytes: &[u8]| file.write_all_at(bytes, offset).unwrap();

    patch(20, &[0xff]);
    assert!(matches!(
        SharedMemory::open(&path.0, None),
        Err(PoolError::CorruptHeader { .. })
    ));
    patch(8, &2u32.to_le_bytes());
    assert!(matches!(
        SharedMemory::open(&path.0, None),
        Err(PoolError::IncompatibleLayout { found: 2, .. })
    ));
    patch(0, b"NOTAPOOL");
    assert!(matches!(
        SharedMemory::open(&path.0, None),
        Err(PoolError::WrongMagic { .. })
    ));

    std::fs::remove_file(&path.0).unwrap();
    drop(SharedMemory::create(&path.0, 4 * PAGE, UUID, PAGE).unwrap());
    let file = OpenOptions::new().write(true).open(&path.0).unwrap();
    file.set_len(3 * PAGE).unwrap();
    assert!(matches!(
        SharedMemory::open(&path.0, None),
        Err(PoolError::Truncated { file_bytes, expected_bytes, .. })
            if file_bytes == 3 * PAGE && expected_bytes == 5 * PAGE
    ));
    file.set_len(10).unwrap();
    assert!(matches!(
        SharedMemory::open(&path.0, None),
        Err(PoolError::WrongMagic { .. })
    ));
    let missing = ShmPath::new("missing");
    assert!(matches!(
        SharedMemory::open(&missing.0, None),
        Err(PoolError::Io { .. })
    ));
}

#[test]
fn owner_words_are_shared_between_mappings_and_leave_the_header_valid() {
    use crate::model::extent_owner::{take_extent, Ownership, TakeFrom};
    use crate::model::NodeId;
    let path = ShmPath::new("owners");
    let first = SharedMemory::create(&path.0, 16 * PAGE, UUID, PAGE).unwrap();
    let second = SharedMemory::open(&path.0, Some(UUID)).unwrap();
    assert_eq!(first.owner_words(), (PAGE - 64) / 8);
    assert_eq!(second.owner_word(3), Some(OwnerWord::NOBODY));
    let Ownership::Taken(word) = take_extent(&first, 3, NodeId(1), TakeFrom::Unknown) else {
        panic!("a fresh extent is taken");
    };
    assert_eq!(second.owner_word(3), Some(word));
    assert_eq!(
        take_extent(&second, 3, NodeId(2), TakeFrom::Held),
        Ownership::Refused(word),
        "another node's word is never claimed"
    );
    assert_eq!(
        take_extent(&second, first.owner_words(), NodeId(2), TakeFrom::Unknown),
        Ownership::Untracked
    );
    drop((first, second));
    // The header's checksum does not cover the words: the pool still opens.
    SharedMemory::open(&path.0, Some(UUID)).unwrap();
}
