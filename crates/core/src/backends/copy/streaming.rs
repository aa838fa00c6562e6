//! The streaming routine: copies with non-temporal stores, which write around the caches (a
//! plain copy first reads each destination line into the cache, a third stream of memory
//! traffic). The body moves eight destination pages side by side, each lane a whole page,
//! so the hardware prefetcher follows one stream per page. Every copy ends with a store
//! fence, so its bytes are visible to other threads and processes (a commit sent after it)
//! before it returns.

/// Copies `length` bytes from `source` to `destination` with non-temporal stores, 32 bytes
/// wide where the CPU has AVX2, else 16 bytes wide; a store fence orders them before any
/// later store.
///
/// # Safety
/// Both ranges are valid for `length` bytes and do not overlap.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn stream_copy(source: *const u8, destination: *mut u8, length: usize) {
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the caller's contract; the CPU has AVX2.
        unsafe { stream_copy_avx2(source, destination, length) }
    } else {
        // SAFETY: the caller's contract; SSE2 is part of x86-64.
        unsafe { stream_copy_sse2(source, destination, length) }
    }
}

/// Pages a step of the body reads from at once ([`stream_lanes`]): 8 (32 KiB).
///
/// The loop waits on memory, not on its instructions, and a CPU's hardware prefetcher
/// follows each 4 KiB page on its own: reading one page from start to end keeps one stream
/// of loads in flight, reading eight pages side by side keeps eight (glibc's large memcpy
/// interleaves four). On the Xeon host, 256 KiB copies between pre-faulted shared mappings
/// ran at 6.1 GB/s a page at a time, 7.7 four pages at a time, 8.0 eight and 8.2 sixteen
/// (glibc's memcpy of a whole GiB: 8.0). On the EPYC host, eight lanes, aligned or
/// non-temporal loads and the same loop in C cost the same CPU per byte within noise, and a
/// software prefetch 4-16 KiB ahead up to 10 % more. Each lane is one whole destination
/// page ([`stream_lanes`] starts its body at a page boundary): lanes that each straddle two
/// pages ran at less than half the speed on the EPYC host (a destination 2 KiB into a page:
/// 3.1-3.6 GB/s against 9.8-11.0 with whole-page lanes, 256 KiB and 4 MiB loads).
#[cfg(target_arch = "x86_64")]
const INTERLEAVED_PAGES: usize = 8;

/// Bytes of each interleaved page ([`INTERLEAVED_PAGES`]).
#[cfg(target_arch = "x86_64")]
const PAGE_BYTES: usize = 4096;

/// The body both widths share: the head up to the destination's next page boundary and the
/// tail with a plain copy; the page-aligned body in blocks of [`INTERLEAVED_PAGES`] pages, each step four lanes (four
/// loads, then four non-temporal stores) from every page of the block in turn, then what is
/// left under a block four lanes at a time; then `sfence`. Expands inside an `unsafe fn`
/// whose caller guarantees both ranges valid for `$length` bytes and not overlapping.
#[cfg(target_arch = "x86_64")]
macro_rules! stream_lanes {
    ($source:expr, $destination:expr, $length:expr, $lane_bytes:expr, $zero:ident, $load:ident, $store:ident) => {{
        const LANES: usize = 4;
        let (source, destination, length): (*const u8, *mut u8, usize) =
            ($source, $destination, $length);
        let head = destination.align_offset(PAGE_BYTES).min(length);
        // SAFETY: the caller's contract covers every access below: each stays within
        // `0..length` of both ranges, and the body's destinations are page-aligned (so
        // lane-aligned).
        unsafe {
            std::ptr::copy_nonoverlapping(source, destination, head);
            const STEP_BYTES: usize = LANES * $lane_bytes;
            const PAGE_STEPS: usize = PAGE_BYTES / STEP_BYTES;
            const BLOCK_STEPS: usize = PAGE_STEPS * INTERLEAVED_PAGES;
            let steps = (length - head) / STEP_BYTES;
            let interleaved = steps / BLOCK_STEPS * BLOCK_STEPS;
            for index in 0..steps {
                // Which step of the body comes `index`-th: within a whole block, the next
                // page's at the same offset; past the last whole block, the next one.
                let step = if index < interleaved {
                    let (block, within) = (index / BLOCK_STEPS, index % BLOCK_STEPS);
                    block * BLOCK_STEPS
                        + (within % INTERLEAVED_PAGES) * PAGE_STEPS
                        + within / INTERLEAVED_PAGES
                } else {
                    index
                };
                let at = head + step * STEP_BYTES;
                let mut values = [$zero(); LANES];
                for (lane, value) in values.iter_mut().enumerate() {
                    *value = $load(source.add(at + lane * $lane_bytes).cast());
                }
                for (lane, value) in values.into_iter().enumerate() {
                    $store(destination.add(at + lane * $lane_bytes).cast(), value);
                }
            }
            let done = head + steps * STEP_BYTES;
            std::ptr::copy_nonoverlapping(source.add(done), destination.add(done), length - done);
            std::arch::x86_64::_mm_sfence();
        }
    }};
}

/// [`stream_copy`] with 32-byte stores ([`stream_lanes`]: 128 bytes a step).
///
/// # Safety
/// Both ranges are valid for `length` bytes and do not overlap; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_copy_avx2(source: *const u8, destination: *mut u8, length: usize) {
    use std::arch::x86_64::{_mm256_loadu_si256, _mm256_setzero_si256, _mm256_stream_si256};
    stream_lanes!(
        source,
        destination,
        length,
        32,
        _mm256_setzero_si256,
        _mm256_loadu_si256,
        _mm256_stream_si256
    );
}

/// [`stream_copy`] with 16-byte stores ([`stream_lanes`]: 64 bytes a step).
///
/// # Safety
/// Both ranges are valid for `length` bytes and do not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy_sse2(source: *const u8, destination: *mut u8, length: usize) {
    use std::arch::x86_64::{_mm_loadu_si128, _mm_setzero_si128, _mm_stream_si128};
    stream_lanes!(
        source,
        destination,
        length,
        16,
        _mm_setzero_si128,
        _mm_loadu_si128,
        _mm_stream_si128
    );
}

/// Copies `source` into the start of `destination` (as many bytes as the shorter holds) with
/// the streaming routine: non-temporal stores where the CPU has them, then a store fence,
/// so every byte is visible to other threads and processes before this returns.
pub fn copy_streaming(source: &[u8], destination: &mut [u8]) {
    let length = source.len().min(destination.len());
    // SAFETY: both ranges are valid for `length` bytes, and a shared and a mutable borrow
    // never overlap.
    unsafe { stream_copy(source.as_ptr(), destination.as_mut_ptr(), length) };
}

/// A plain copy where the CPU has no non-temporal stores this code uses.
///
/// # Safety
/// Both ranges are valid for `length` bytes and do not overlap.
#[cfg(not(target_arch = "x86_64"))]
pub(super) unsafe fn stream_copy(source: *const u8, destination: *mut u8, length: usize) {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(source, destination, length) };
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_streaming_copy_between_slices_copies_what_the_shorter_holds() {
        let source: Vec<u8> = (0..300u32).map(|index| (index * 7 + 3) as u8).collect();
        for (from, length, room) in [(0, 0, 8), (1, 63, 63), (3, 200, 250), (5, 290, 100)] {
            let mut destination = vec![0xee; room + 1];
            let data = &source[from..from + length];
            // Start one byte in, so the destination's body is unaligned.
            super::copy_streaming(data, &mut destination[1..]);
            let copied = length.min(room);
            assert_eq!(destination[0], 0xee);
            assert_eq!(
                &destination[1..=copied],
                &data[..copied],
                "{length} into {room}"
            );
            assert!(destination[copied + 1..].iter().all(|byte| *byte == 0xee));
        }
    }

    /// Each x86-64 path on its own, for every destination alignment of a 32-byte lane, a
    /// destination just before, at and past a page boundary, and lengths around its steps
    /// and its interleaved blocks: every byte copied where it
    /// belongs (the source repeats no 4 KiB page, so a step taken from the wrong page shows),
    /// none written past the range.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn both_widths_copy_every_byte_at_every_alignment() {
        const BLOCK: usize = super::INTERLEAVED_PAGES * super::PAGE_BYTES;
        let lengths = [
            0,
            1,
            31,
            63,
            64,
            127,
            128,
            129,
            255,
            256,
            1000,
            1100,
            BLOCK - 1,
            BLOCK,
            BLOCK + 129,
            2 * BLOCK + super::PAGE_BYTES + 5,
        ];
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let source: Vec<u8> = (0..longest as u32)
            .map(|index| (index.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        type Copy = unsafe fn(*const u8, *mut u8, usize);
        let mut paths: Vec<(&str, Copy)> = vec![("sse2", super::stream_copy_sse2)];
        if std::is_x86_feature_detected!("avx2") {
            paths.push(("avx2", super::stream_copy_avx2));
        }
        for (name, copy) in paths {
            let page = super::PAGE_BYTES;
            let offsets = (0..33).chain([page - 1, page, page + 1, page + page / 2]);
            for offset in offsets {
                for length in lengths {
                    // A page-aligned buffer, so `offset` is the destination's place in a page.
                    let mut backing = vec![0xee; longest + 3 * page];
                    let aligned = backing.as_ptr().align_offset(page);
                    let destination = &mut backing[aligned..];
                    let data = &source[..length];
                    // SAFETY: `offset + length` stays inside `destination`, a separate buffer.
                    unsafe { copy(data.as_ptr(), destination.as_mut_ptr().add(offset), length) };
                    let (before, rest) = destination.split_at(offset);
                    let (copied, after) = rest.split_at(length);
                    assert!(before.iter().all(|byte| *byte == 0xee), "{name} {offset}");
                    assert!(copied == data, "{name}: {length} bytes at offset {offset}");
                    assert!(after.iter().all(|byte| *byte == 0xee), "{name} {offset}");
                }
            }
        }
    }
}
