//! Block I/O for the SSD store: a bounded queue of reads and writes through io_uring, with
//! a pread/pwrite fallback where io_uring cannot be set up (seccomp, old kernels, some
//! containers). Each in-flight request owns one of `depth` staging buffers, aligned to
//! 4 KiB as direct I/O requires and kept for the queue's lifetime; the bytes in flight
//! have a bound of their own (`in_flight_bytes_max`), whatever the depth. A slot grows to the
//! largest request it served, so staging memory follows the objects actually moved and is
//! bounded by `depth × slot_bytes`; once grown, no request touches fresh pages.

use super::disk::{IoFile, ModelDisk};
use super::layout::BLOCK_BYTES;
use std::alloc::{self, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Buffers of at least this many bytes are mapped on their own, aligned to it, and advised
/// as transparent huge pages. A direct transfer gives the device one segment per run of
/// physically adjacent pages, and a device takes a bounded number of segments in one
/// request (a virtio disk 254: `max_segments` in sysfs): a 4 MiB read into scattered
/// 4 KiB pages goes out as five to eight requests (6.3 on average measured for the store's
/// slots), into two huge pages as one. Where huge pages are not to be had the kernel backs
/// the mapping with small ones and nothing else changes.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;
const _: () = assert!(HUGE_PAGE_BYTES % BLOCK_BYTES as usize == 0);

/// A zeroed buffer aligned to [`BLOCK_BYTES`], from the heap; from [`HUGE_PAGE_BYTES`] on a
/// mapping of its own aligned to that size; its pages touched when it is made.
pub struct AlignedBuffer {
    pointer: NonNull<u8>,
    length: usize,
    /// Mapped by [`map_huge`], unmapped on drop; else from the global allocator.
    mapped: bool,
}

// SAFETY: the buffer is plain owned memory with no thread affinity.
unsafe impl Send for AlignedBuffer {}

impl AlignedBuffer {
    /// A buffer of `length` bytes (rounded up to a whole block, at least one).
    pub fn new(length: usize) -> AlignedBuffer {
        let length = length.max(1).next_multiple_of(BLOCK_BYTES as usize);
        if length >= HUGE_PAGE_BYTES {
            if let Some(pointer) = map_huge(length) {
                return AlignedBuffer {
                    pointer,
                    length,
                    mapped: true,
                };
            }
        }
        let layout = Self::layout(length);
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(pointer) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuffer {
            pointer,
            length,
            mapped: false,
        }
    }

    fn layout(length: usize) -> Layout {
        match Layout::from_size_align(length, BLOCK_BYTES as usize) {
            Ok(layout) => layout,
            Err(error) => panic!("aligned buffer of {length} bytes: {error}"),
        }
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the pointer owns `length` initialized (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.pointer.as_ptr(), self.length) }
    }

    /// The buffer's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.pointer.as_ptr(), self.length) }
    }

    /// Length in bytes (a multiple of [`BLOCK_BYTES`]).
    pub fn len(&self) -> usize {
        self.length
    }

    /// Always false: a buffer holds at least one block.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: mapped by `map_huge` with this address and length, and no longer used.
            unsafe { libc::munmap(self.pointer.as_ptr().cast(), self.length) };
        } else {
            // SAFETY: allocated in `new` with this layout.
            unsafe { alloc::dealloc(self.pointer.as_ptr(), Self::layout(self.length)) }
        }
    }
}

/// Maps `length` bytes at an address aligned to [`HUGE_PAGE_BYTES`], advises huge pages and
/// touches every page (zeroing them); `None` when the mapping fails or `length` is not a
/// multiple of the system's page size (a 16 or 64 KiB page kernel), so that only whole pages
/// are ever unmapped.
fn map_huge(length: usize) -> Option<NonNull<u8>> {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if page <= 0 || length % page as usize != 0 {
        return None;
    }
    let span = length.checked_add(HUGE_PAGE_BYTES)?;
    // SAFETY: a new private anonymous mapping at an address the kernel picks.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return None;
    }
    let head = (raw as usize).next_multiple_of(HUGE_PAGE_BYTES) - raw as usize;
    let tail = span - head - length;
    // SAFETY: the head and the tail are page-aligned parts of the mapping just made, outside
    // the aligned `length` bytes kept; the kept part is advised, then written whole.
    unsafe {
        let aligned = raw.cast::<u8>().add(head);
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap(aligned.add(length).cast(), tail);
        }
        libc::madvise(aligned.cast(), length, libc::MADV_HUGEPAGE);
        std::ptr::write_bytes(aligned, 0, length);
        NonNull::new(aligned)
    }
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// Read `length` bytes at `offset` into the slot's buffer.
    Read,
    /// Write the first `length` bytes of the slot's buffer at `offset`.
    Write,
}

/// One request, its bytes in the slot buffer it was prepared in.
#[derive(Clone, Copy, Debug)]
pub struct IoOp {
    /// Read or write.
    pub kind: IoKind,
    /// The file: a descriptor, or a model disk's region.
    pub file: IoFile,
    /// Offset in the file (block-aligned for direct I/O).
    pub offset: u64,
    /// Bytes to transfer, at most the slot's size (block-aligned for direct I/O).
    pub length: usize,
}

/// A staging slot lent to [`IoRequests::prepare`].
pub struct Slot<'a> {
    buffer: &'a mut Option<AlignedBuffer>,
    limit: usize,
}

impl Slot<'_> {
    /// The slot's first `length` bytes rounded up to a block, growing the slot when it is
    /// smaller (its old content is lost then). Panics past the queue's `slot_bytes` (a
    /// caller bug).
    pub fn bytes(&mut self, length: usize) -> &mut [u8] {
        let length = length.max(1).next_multiple_of(BLOCK_BYTES as usize);
        assert!(length <= self.limit, "request longer than a slot");
        if self
            .buffer
            .as_ref()
            .is_none_or(|buffer| buffer.len() < length)
        {
            *self.buffer = Some(AlignedBuffer::new(length));
        }
        match self.buffer.as_mut() {
            Some(buffer) => &mut buffer.as_mut_slice()[..length],
            None => unreachable!("the slot was just filled"),
        }
    }
}

/// The requests of one [`IoQueue::run`]: the queue asks for each request as a slot frees
/// and reports each completion.
pub trait IoRequests {
    /// Fills `slot` (for a write, through [`Slot::bytes`]) and returns request `request`, or
    /// `None` to skip it.
    fn prepare(&mut self, request: usize, slot: Slot<'_>) -> Option<IoOp>;

    /// Request `request` ended: `bytes` is its slot's first `length` bytes, `result` the
    /// bytes transferred (a short count is the caller's to judge), `latency` the time since
    /// submission. Called in completion order.
    fn complete(
        &mut self,
        request: usize,
        bytes: &[u8],
        result: io::Result<usize>,
        latency: Duration,
    );
}

enum Backend {
    Uring(Box<io_uring::IoUring>),
    Blocking,
    /// One request at a time on a model disk, as `Blocking` does on descriptors.
    Model(Arc<ModelDisk>),
}

/// A bounded queue of block I/O: at most `depth` requests in flight, and no request started
/// while `in_flight_bytes_max` bytes or more are (one always may start when none is).
pub struct IoQueue {
    backend: Backend,
    depth: usize,
    depth_limit: usize,
    in_flight_bytes_max: usize,
    slot_bytes: usize,
    slots: Vec<Option<AlignedBuffer>>,
}

impl IoQueue {
    /// A queue of at most `depth` requests in flight, each of at most `slot_bytes` bytes,
    /// starting none while `in_flight_bytes_max` bytes or more are in flight: in-flight bytes
    /// stay under `in_flight_bytes_max + slot_bytes`. With `prefer_uring` it sets up io_uring
    /// and falls back to pread/pwrite (returning why) when that fails; without, it uses
    /// pread/pwrite.
    pub fn new(
        depth: usize,
        slot_bytes: usize,
        in_flight_bytes_max: usize,
        prefer_uring: bool,
    ) -> (IoQueue, Option<String>) {
        let depth = depth.max(1);
        let (backend, fallback) = if prefer_uring {
            match io_uring::IoUring::new(depth.next_power_of_two() as u32) {
                Ok(ring) => (Backend::Uring(Box::new(ring)), None),
                Err(error) => (
                    Backend::Blocking,
                    Some(format!("io_uring setup failed: {error}")),
                ),
            }
        } else {
            (
                Backend::Blocking,
                Some("io_uring disabled by configuration".to_string()),
            )
        };
        (
            IoQueue::with_backend(backend, depth, slot_bytes, in_flight_bytes_max),
            fallback,
        )
    }

    /// A queue that runs its requests on `disk`, one at a time (their `file` is the disk's
    /// region), its slots as [`IoQueue::new`] makes them.
    pub fn on_model(disk: Arc<ModelDisk>, slot_bytes: usize) -> IoQueue {
        IoQueue::with_backend(Backend::Model(disk), 1, slot_bytes, usize::MAX)
    }

    fn with_backend(
        backend: Backend,
        depth: usize,
        slot_bytes: usize,
        in_flight_bytes_max: usize,
    ) -> IoQueue {
        IoQueue {
            backend,
            depth,
            depth_limit: depth,
            in_flight_bytes_max,
            slot_bytes: slot_bytes.next_multiple_of(BLOCK_BYTES as usize),
            slots: (0..depth).map(|_| None).collect(),
        }
    }

    /// Grows every slot to the queue's `slot_bytes` now, staging memory at its bound, so
    /// that no later request pays for fresh pages (a huge page's first touch can cost the
    /// kernel a compaction). The blocking fallback uses one slot; it grows only that one.
    pub fn grow_slots(&mut self) {
        let limit = self.slot_bytes;
        let used = match self.backend {
            Backend::Blocking | Backend::Model(_) => 1,
            Backend::Uring(_) => self.slots.len(),
        };
        for buffer in self.slots.iter_mut().take(used) {
            Slot { buffer, limit }.bytes(limit);
        }
    }

    /// Runs at most `depth` requests at once from now on (at least one, at most the depth
    /// the queue was made with).
    pub fn set_depth_limit(&mut self, depth: usize) {
        self.depth_limit = depth.clamp(1, self.depth);
    }

    /// Runs requests `0..count` with at most `depth` in flight. If the ring itself fails,
    /// the requests in flight complete with its error and `run` returns early: requests
    /// never prepared are never completed, and the caller treats them as not done; the queue
    /// uses pread/pwrite from then on. A request
    /// longer than `slot_bytes`, or a write longer than what it staged, panics (a caller bug).
    pub fn run(&mut self, count: usize, requests: &mut impl IoRequests) {
        let limit = self.slot_bytes;
        match &mut self.backend {
            Backend::Uring(ring) => {
                let ran = run_uring(
                    ring,
                    &mut self.slots[..self.depth_limit],
                    limit,
                    self.in_flight_bytes_max,
                    count,
                    requests,
                );
                if let Err(stranded) = ran {
                    // The kernel may still own the ring and the buffers of the requests
                    // that were in flight: both are leaked, never reused or freed (at most
                    // `depth` buffers, once per queue), and the queue goes on with
                    // pread/pwrite.
                    for slot in stranded {
                        std::mem::forget(self.slots[slot].take());
                    }
                    std::mem::forget(std::mem::replace(&mut self.backend, Backend::Blocking));
                }
            }
            Backend::Blocking | Backend::Model(_) => {
                let disk = match &self.backend {
                    Backend::Model(disk) => Some(disk.as_ref()),
                    _ => None,
                };
                for request in 0..count {
                    let Some((op, buffer)) = stage(requests, request, &mut self.slots[0], limit)
                    else {
                        continue;
                    };
                    let started = Instant::now();
                    let result = blocking_transfer(disk, op, buffer.as_mut_slice());
                    requests.complete(
                        request,
                        &buffer.as_slice()[..op.length],
                        result,
                        started.elapsed(),
                    );
                }
            }
        }
    }
}

/// Runs `op` now: with pread/pwrite on its descriptor, or on `disk` for a model region.
fn blocking_transfer(disk: Option<&ModelDisk>, op: IoOp, buffer: &mut [u8]) -> io::Result<usize> {
    let fd = match (op.file, disk) {
        (IoFile::Fd(fd), None) => fd,
        (IoFile::Model(region), Some(disk)) => {
            return match op.kind {
                IoKind::Read => disk.read_at(region, &mut buffer[..op.length], op.offset),
                IoKind::Write => disk.write_at(region, &buffer[..op.length], op.offset),
            };
        }
        _ => return Err(io::Error::from_raw_os_error(libc::EBADF)),
    };
    let offset = libc::off_t::try_from(op.offset)
        .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
    loop {
        // SAFETY: the buffer holds at least `op.length` bytes and outlives the call.
        let transferred = unsafe {
            match op.kind {
                IoKind::Read => libc::pread(fd, buffer.as_mut_ptr().cast(), op.length, offset),
                IoKind::Write => libc::pwrite(fd, buffer.as_ptr().cast(), op.length, offset),
            }
        };
        if transferred >= 0 {
            return Ok(transferred as usize);
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

struct InFlight {
    request: usize,
    length: usize,
    started: Instant,
}

/// Prepares `request` in `slot` and returns it with its buffer, grown for a read that
/// needs more than the slot holds.
fn stage<'a>(
    requests: &mut impl IoRequests,
    request: usize,
    slot: &'a mut Option<AlignedBuffer>,
    limit: usize,
) -> Option<(IoOp, &'a mut AlignedBuffer)> {
    let op = requests.prepare(
        request,
        Slot {
            buffer: &mut *slot,
            limit,
        },
    )?;
    let held = slot.as_ref().map_or(0, AlignedBuffer::len);
    if held < op.length {
        assert!(
            op.kind == IoKind::Read,
            "a write longer than what it staged"
        );
        Slot {
            buffer: &mut *slot,
            limit,
        }
        .bytes(op.length);
    }
    let buffer = slot.as_mut()?;
    Some((op, buffer))
}

/// CPU work between submissions longer than this (preparing writes: a copy in and a
/// checksum; handling reads: a checksum and a copy out) submits what it queued so far at
/// once, instead of after every free slot is prepared or every reaped completion handled:
/// the device gets each request while the CPU works on the next. Raw transfers, which do
/// no such work, never reach it and pay no extra system call.
const EARLY_SUBMIT_AFTER: Duration = Duration::from_micros(20);

/// One [`IoQueue::run`] through io_uring: which slots are free, which hold a request in
/// flight, and the next request to prepare.
struct UringRun<'a> {
    ring: &'a mut io_uring::IoUring,
    slots: &'a mut [Option<AlignedBuffer>],
    limit: usize,
    free: Vec<usize>,
    in_flight: Vec<Option<InFlight>>,
    outstanding: usize,
    /// Bytes of the requests in flight, and the bound past which none is started.
    bytes_in_flight: usize,
    in_flight_bytes_max: usize,
    next: usize,
    count: usize,
    /// Entries queued on the ring and not yet submitted.
    unsubmitted: usize,
    /// When the ring was last submitted to.
    submitted_at: Instant,
}

impl UringRun<'_> {
    /// Submits the entries queued when the CPU has worked for [`EARLY_SUBMIT_AFTER`] since
    /// the last submission. A failed submit leaves them queued for the next
    /// `submit_and_wait`, which reports the error.
    fn submit_if_late(&mut self) {
        if self.unsubmitted > 0 && self.submitted_at.elapsed() >= EARLY_SUBMIT_AFTER {
            if self.ring.submit().is_ok() {
                self.unsubmitted = 0;
            }
            self.submitted_at = Instant::now();
        }
    }

    /// Prepares requests into the free slots while the bytes in flight are under their
    /// bound, and queues them on the ring, submitting early when preparing them is slow
    /// ([`UringRun::submit_if_late`]).
    fn queue(&mut self, requests: &mut impl IoRequests) {
        while self.next < self.count
            && (self.outstanding == 0 || self.bytes_in_flight < self.in_flight_bytes_max)
        {
            let Some(&slot) = self.free.last() else { break };
            let request = self.next;
            self.next += 1;
            let Some((op, buffer)) = stage(requests, request, &mut self.slots[slot], self.limit)
            else {
                continue;
            };
            let length = u32::try_from(op.length).unwrap_or(u32::MAX);
            let IoFile::Fd(fd) = op.file else {
                // A model region never reaches a ring: the model's queue runs it.
                requests.complete(
                    request,
                    &[],
                    Err(io::Error::from_raw_os_error(libc::EBADF)),
                    Duration::ZERO,
                );
                continue;
            };
            let entry = match op.kind {
                IoKind::Read => io_uring::opcode::Read::new(
                    io_uring::types::Fd(fd),
                    buffer.as_mut_slice().as_mut_ptr(),
                    length,
                )
                .offset(op.offset)
                .build(),
                IoKind::Write => io_uring::opcode::Write::new(
                    io_uring::types::Fd(fd),
                    buffer.as_slice().as_ptr(),
                    length,
                )
                .offset(op.offset)
                .build(),
            }
            .user_data(slot as u64);
            // SAFETY: the slot's buffer lives in the queue for its whole lifetime and is
            // not reused before this entry's completion is reaped.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                requests.complete(
                    request,
                    &[],
                    Err(io::Error::from_raw_os_error(libc::EBUSY)),
                    Duration::ZERO,
                );
                continue;
            }
            self.free.pop();
            self.in_flight[slot] = Some(InFlight {
                request,
                length: op.length,
                started: Instant::now(),
            });
            self.outstanding += 1;
            self.bytes_in_flight += op.length;
            self.unsubmitted += 1;
            self.submit_if_late();
        }
    }

    /// The ring is unusable (`error`): fails every request still in flight with it, and
    /// returns their slots as stranded (the kernel may still write their buffers).
    fn strand_in_flight(
        &mut self,
        error: &io::Error,
        requests: &mut impl IoRequests,
    ) -> Vec<usize> {
        let mut stranded = Vec::new();
        for (slot, state) in self.in_flight.iter_mut().enumerate() {
            if let Some(state) = state.take() {
                let message = io::Error::new(error.kind(), error.to_string());
                requests.complete(state.request, &[], Err(message), Duration::ZERO);
                stranded.push(slot);
            }
        }
        stranded
    }

    /// Reaps the ring's completions into `completions` (reused between calls) and hands
    /// each to `requests`, freeing its slot; queues the next requests early when handling
    /// the completions is slow.
    fn reap(&mut self, completions: &mut Vec<(usize, i32)>, requests: &mut impl IoRequests) {
        completions.clear();
        completions.extend(
            self.ring
                .completion()
                .map(|entry| (entry.user_data() as usize, entry.result())),
        );
        for &(slot, result) in completions.iter() {
            let Some(state) = self.in_flight.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            self.outstanding -= 1;
            self.bytes_in_flight -= state.length;
            let result = if result < 0 {
                Err(io::Error::from_raw_os_error(-result))
            } else {
                Ok(result as usize)
            };
            let bytes = self.slots[slot]
                .as_ref()
                .map_or(&[][..], |buffer| &buffer.as_slice()[..state.length]);
            requests.complete(state.request, bytes, result, state.started.elapsed());
            self.free.push(slot);
            // Slow completions (a checksum and a copy): the slots they freed get their next
            // requests now, so the device works while the CPU handles the rest of the reap.
            if self.submitted_at.elapsed() >= EARLY_SUBMIT_AFTER {
                self.queue(requests);
            }
        }
    }
}

fn run_uring(
    ring: &mut io_uring::IoUring,
    slots: &mut [Option<AlignedBuffer>],
    limit: usize,
    in_flight_bytes_max: usize,
    count: usize,
    requests: &mut impl IoRequests,
) -> Result<(), Vec<usize>> {
    let depth = slots.len();
    let mut run = UringRun {
        ring,
        slots,
        limit,
        free: (0..depth).rev().collect(),
        in_flight: (0..depth).map(|_| None).collect(),
        outstanding: 0,
        bytes_in_flight: 0,
        in_flight_bytes_max,
        next: 0,
        count,
        unsubmitted: 0,
        submitted_at: Instant::now(),
    };
    let mut completions = Vec::with_capacity(depth);
    loop {
        run.queue(requests);
        if run.outstanding == 0 {
            return Ok(());
        }
        let waited = run.ring.submit_and_wait(1);
        run.submitted_at = Instant::now();
        if let Err(error) = waited {
            if matches!(
                error.raw_os_error(),
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
            ) {
                continue;
            }
            return Err(run.strand_in_flight(&error, requests));
        }
        run.unsubmitted = 0;
        run.reap(&mut completions, requests);
    }
}
