//! Copies with non-temporal stores, for bulk copies into and out of pools whose destination
//! is not read back at once: a plain copy first reads each destination line into the cache,
//! a streaming one writes around it. Every copy ends with a store fence, so its bytes are
//! visible to other threads and processes (a commit sent after it) before it returns.

/// Copies `length` bytes from `source` to `destination` with non-temporal stores: the
/// unaligned head and the tail (under 64 bytes) with a plain copy, the 16-byte-aligned body
/// four stores at a time, then `sfence` orders them before any later store.
///
/// # Safety
/// Both ranges are valid for `length` bytes and do not overlap.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn stream_copy(source: *const u8, destination: *mut u8, length: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LANE_BYTES: usize = 16;
    const STEP_BYTES: usize = 4 * LANE_BYTES;
    let head = destination.align_offset(LANE_BYTES).min(length);
    // SAFETY: the caller's contract covers every access below: each stays within
    // `0..length` of both ranges, and the body's destinations are 16-byte aligned.
    unsafe {
        std::ptr::copy_nonoverlapping(source, destination, head);
        let mut done = head;
        while length - done >= STEP_BYTES {
            for lane in 0..STEP_BYTES / LANE_BYTES {
                let at = done + lane * LANE_BYTES;
                let value = _mm_loadu_si128(source.add(at).cast::<__m128i>());
                _mm_stream_si128(destination.add(at).cast::<__m128i>(), value);
            }
            done += STEP_BYTES;
        }
        std::ptr::copy_nonoverlapping(source.add(done), destination.add(done), length - done);
        _mm_sfence();
    }
}

/// Copies `source` into the start of `destination` (as many bytes as the shorter holds) with
/// the stores of [`SharedMemory::stream_at`](super::SharedMemory::stream_at): non-temporal
/// where the CPU has them, then a store fence, so every byte is visible to other threads and
/// processes before this returns. For bulk copies out of a pool whose destination is not
/// read back at once.
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
pub(crate) unsafe fn stream_copy(source: *const u8, destination: *mut u8, length: usize) {
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
}
