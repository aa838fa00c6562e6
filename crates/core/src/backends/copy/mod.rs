//! Bulk copies into and out of pools, each direction by the routine this machine runs
//! fastest: the C library's `memcpy` or the streaming routine ([`streaming`], non-temporal
//! stores). Which wins depends on the CPU, the kernel's page handling and the buffers'
//! places within their pages, so neither is assumed: the first copy of a process (or
//! [`routines`], which a client and a node call at start-up) measures both in each direction
//! ([`calibration`]) and keeps the faster for the process's life. `KVTIER_COPY_ROUTINE`
//! (`memcpy` or `streaming`) sets both directions instead, for A/B runs.
//!
//! Every copy is complete and visible to other threads and processes when it returns (the
//! streaming routine ends with a store fence; `memcpy`'s stores are ordinary ones, ordered
//! before the release of whatever message announces them).

mod calibration;
mod streaming;

pub use calibration::Calibration;
pub use streaming::copy_streaming;

use std::sync::OnceLock;

/// The environment variable that sets the routine of both directions (`memcpy` or
/// `streaming`); unset, or `auto`, measures.
pub const COPY_ROUTINE_VARIABLE: &str = "KVTIER_COPY_ROUTINE";

/// A way to copy bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyRoutine {
    /// The C library's `memcpy` (which picks its own instructions by size and CPU).
    Memcpy,
    /// [`copy_streaming`]: non-temporal stores, eight destination pages side by side.
    Streaming,
}

impl CopyRoutine {
    /// The routine's name, as `KVTIER_COPY_ROUTINE` and the benchmarks spell it.
    pub fn name(self) -> &'static str {
        match self {
            CopyRoutine::Memcpy => "memcpy",
            CopyRoutine::Streaming => "streaming",
        }
    }

    /// Copies `length` bytes from `source` to `destination`.
    ///
    /// # Safety
    /// Both ranges are valid for `length` bytes and do not overlap.
    pub(crate) unsafe fn copy(self, source: *const u8, destination: *mut u8, length: usize) {
        match self {
            // SAFETY: the caller's contract.
            CopyRoutine::Memcpy => unsafe {
                std::ptr::copy_nonoverlapping(source, destination, length)
            },
            // SAFETY: the caller's contract.
            CopyRoutine::Streaming => unsafe {
                streaming::stream_copy(source, destination, length)
            },
        }
    }
}

/// The routines this process copies with, and how they were chosen.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Routines {
    /// Into a pool (stores, restores, replication and demotion copies).
    pub store: CopyRoutine,
    /// Out of a pool into an engine's buffer (`load_into`).
    pub load: CopyRoutine,
    /// The measurement that chose them; `None` where `KVTIER_COPY_ROUTINE` set them.
    pub calibration: Option<Calibration>,
}

/// The routines of this process: chosen on the first call (measured, about 0.1 s, or taken
/// from `KVTIER_COPY_ROUTINE`), the same on every later one.
pub fn routines() -> &'static Routines {
    static ROUTINES: OnceLock<Routines> = OnceLock::new();
    ROUTINES.get_or_init(|| {
        let set = std::env::var(COPY_ROUTINE_VARIABLE).ok();
        match set.as_deref().map(str::trim) {
            Some("memcpy") => fixed(CopyRoutine::Memcpy),
            Some("streaming") => fixed(CopyRoutine::Streaming),
            Some("auto") | Some("") | None => measured(),
            Some(other) => {
                tracing::warn!(
                    value = other,
                    "{COPY_ROUTINE_VARIABLE} is neither memcpy, streaming nor auto: measuring"
                );
                measured()
            }
        }
    })
}

fn fixed(routine: CopyRoutine) -> Routines {
    Routines {
        store: routine,
        load: routine,
        calibration: None,
    }
}

fn measured() -> Routines {
    let calibration = Calibration::measure();
    Routines {
        store: calibration.store.faster(),
        load: calibration.load.faster(),
        calibration: Some(calibration),
    }
}

/// Copies `length` bytes from `source` into a pool at `destination` with the store routine.
///
/// # Safety
/// Both ranges are valid for `length` bytes and do not overlap.
pub(crate) unsafe fn copy_into_pool_raw(source: *const u8, destination: *mut u8, length: usize) {
    // SAFETY: the caller's contract.
    unsafe { routines().store.copy(source, destination, length) }
}

/// Copies `source` into the start of `destination` (as many bytes as the shorter holds) with
/// the store routine: for memory that stands for a pool (a benchmark's sink).
pub fn copy_into_pool(source: &[u8], destination: &mut [u8]) {
    let length = source.len().min(destination.len());
    // SAFETY: both ranges are valid for `length` bytes, and a shared and a mutable borrow
    // never overlap.
    unsafe { copy_into_pool_raw(source.as_ptr(), destination.as_mut_ptr(), length) }
}

/// Copies `source` (bytes in a pool) into the start of `destination` (as many bytes as the
/// shorter holds) with the load routine.
pub fn copy_out_of_pool(source: &[u8], destination: &mut [u8]) {
    let length = source.len().min(destination.len());
    // SAFETY: both ranges are valid for `length` bytes, and a shared and a mutable borrow
    // never overlap.
    unsafe {
        routines()
            .load
            .copy(source.as_ptr(), destination.as_mut_ptr(), length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_routines_copy_exactly_the_range() {
        let source: Vec<u8> = (0..70_000u32).map(|index| (index * 31 + 7) as u8).collect();
        for routine in [CopyRoutine::Memcpy, CopyRoutine::Streaming] {
            for (from, length) in [(0, 0), (1, 4095), (3, 65_536), (100, 69_000)] {
                let mut destination = vec![0xee; length + 2];
                let data = &source[from..from + length];
                // SAFETY: `length` bytes from the second byte stay inside `destination`.
                unsafe { routine.copy(data.as_ptr(), destination.as_mut_ptr().add(1), length) };
                assert_eq!(&destination[1..=length], data, "{routine:?} {length}");
                assert_eq!((destination[0], destination[length + 1]), (0xee, 0xee));
            }
        }
    }

    #[test]
    fn a_copy_out_of_a_pool_copies_what_the_shorter_holds() {
        let source = [5u8; 300];
        let mut destination = [0u8; 200];
        copy_out_of_pool(&source, &mut destination);
        assert_eq!(destination, [5u8; 200]);
        let mut longer = [0u8; 400];
        copy_out_of_pool(&source, &mut longer);
        assert_eq!(
            (&longer[..300], &longer[300..]),
            (&[5u8; 300][..], &[0u8; 100][..])
        );
    }

    #[test]
    fn routine_names_are_what_the_variable_takes() {
        assert_eq!(CopyRoutine::Memcpy.name(), "memcpy");
        assert_eq!(CopyRoutine::Streaming.name(), "streaming");
    }
}
