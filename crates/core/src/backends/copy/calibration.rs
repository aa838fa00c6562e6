//! The start-up measurement that picks each direction's copy routine: both routines copy
//! the same bytes between a shared mapping (as a pool is mapped) and process-private memory
//! (as an engine's buffer is), in turns, at three places of the private side within its
//! pages (page-aligned as pinned buffers are, 16 bytes in as the C library's large blocks
//! are, and half a page further), each round the other routine first. The choice goes by
//! the median over rounds of each round's ratio between the two, whose copies ran back to
//! back: another process's burst of memory traffic slows both copies of a round alike.

use super::CopyRoutine;
use std::time::Instant;

/// Bytes each round copies: past this machine's last-level cache with both sides together
/// (32 MiB on the EPYC host), as a pool's bytes are, and short enough that the whole
/// measurement takes about a tenth of a second.
const CALIBRATION_BYTES: usize = 32 << 20;
/// Bytes each call of a routine copies: between the 256 KiB and 4 MiB objects engines move.
const PIECE_BYTES: usize = 512 << 10;
/// Where the private side starts within a page, in turn.
const PRIVATE_PAGE_OFFSETS: [usize; 3] = [0, 16, 2064];
/// Rounds per direction: each place twice.
const ROUNDS: usize = 2 * PRIVATE_PAGE_OFFSETS.len();
const PAGE_BYTES: usize = 4096;

/// Both routines' rates in one direction.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Rates {
    /// All rounds' bytes over all rounds' time.
    pub memcpy_gbps: f64,
    pub streaming_gbps: f64,
    /// The median over rounds of the streaming copy's GB/s over memcpy's in the same round.
    pub streaming_over_memcpy: f64,
}

impl Rates {
    /// The faster routine by the median ratio; `memcpy` on a tie (or where nothing was
    /// measured).
    pub fn faster(&self) -> CopyRoutine {
        if self.streaming_over_memcpy > 1.0 {
            CopyRoutine::Streaming
        } else {
            CopyRoutine::Memcpy
        }
    }
}

impl Rates {
    /// The rates of rounds that each copied `bytes` with both routines: `[memcpy seconds,
    /// streaming seconds]` per round.
    fn of(rounds: &[[f64; 2]], bytes: usize) -> Rates {
        let total = |which: usize| rounds.iter().map(|round| round[which]).sum::<f64>();
        let all_bytes = (bytes * rounds.len()) as f64;
        let mut ratios: Vec<f64> = rounds.iter().map(|round| round[0] / round[1]).collect();
        ratios.sort_by(f64::total_cmp);
        Rates {
            memcpy_gbps: all_bytes / total(0) / 1e9,
            streaming_gbps: all_bytes / total(1) / 1e9,
            streaming_over_memcpy: ratios.get(ratios.len() / 2).copied().unwrap_or(0.0),
        }
    }
}

/// What the start-up measurement found.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Calibration {
    /// Private memory into a shared mapping.
    pub store: Rates,
    /// A shared mapping into private memory.
    pub load: Rates,
    /// Why nothing was measured (both rates 0, so `memcpy` runs), if so.
    pub failed: Option<String>,
}

impl Calibration {
    /// Measures both routines in both directions on this machine; where the memory for it
    /// cannot be had, says so and measures nothing.
    pub fn measure() -> Calibration {
        match Buffers::new() {
            Ok(mut buffers) => Calibration {
                store: buffers.rates(Direction::Store),
                load: buffers.rates(Direction::Load),
                failed: None,
            },
            Err(error) => {
                tracing::warn!(%error, "copy routines not measured: memcpy in both directions");
                let none = Rates {
                    memcpy_gbps: 0.0,
                    streaming_gbps: 0.0,
                    streaming_over_memcpy: 0.0,
                };
                Calibration {
                    store: none,
                    load: none,
                    failed: Some(error.to_string()),
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Store,
    Load,
}

/// The two sides of the measurement: a shared mapping of a memory file (a pool) and
/// private memory with room to start anywhere within a page.
struct Buffers {
    shared: memmap2::MmapRaw,
    private: Vec<u8>,
}

impl Buffers {
    fn new() -> std::io::Result<Buffers> {
        // SAFETY: memfd_create(2) takes a NUL-terminated name and flags; it returns a new
        // descriptor this function owns, or -1.
        let descriptor = unsafe { libc::memfd_create(c"kvtier-copy-calibration".as_ptr(), 0) };
        if descriptor < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(descriptor) };
        file.set_len(CALIBRATION_BYTES as u64)?;
        let shared = memmap2::MmapOptions::new()
            .len(CALIBRATION_BYTES)
            .populate()
            .map_raw(&file)?;
        // SAFETY: the mapping is ours alone and `CALIBRATION_BYTES` long; writing every
        // byte faults every page in (a populated shared mapping may still be read-only
        // mapped until written).
        unsafe { std::ptr::write_bytes(shared.as_mut_ptr(), 0x5a, CALIBRATION_BYTES) };
        let private = vec![0xa5u8; CALIBRATION_BYTES + 2 * PAGE_BYTES];
        Ok(Buffers { shared, private })
    }

    /// Both routines' rates in `direction` over [`ROUNDS`] rounds.
    fn rates(&mut self, direction: Direction) -> Rates {
        let routines = [CopyRoutine::Memcpy, CopyRoutine::Streaming];
        let mut rounds = Vec::with_capacity(ROUNDS);
        for round in 0..ROUNDS {
            let offset = PRIVATE_PAGE_OFFSETS[round % PRIVATE_PAGE_OFFSETS.len()];
            let mut seconds = [0.0f64; 2];
            for turn in 0..2 {
                let which = (round + turn) % 2;
                seconds[which] = self.round(routines[which], direction, offset);
            }
            rounds.push(seconds);
        }
        Rates::of(&rounds, CALIBRATION_BYTES)
    }

    /// Seconds `routine` takes to copy the calibration bytes in `direction`, in pieces, the
    /// private side starting `page_offset` bytes into a page.
    fn round(&mut self, routine: CopyRoutine, direction: Direction, page_offset: usize) -> f64 {
        let start = self.private.as_ptr().align_offset(PAGE_BYTES) + page_offset;
        let private = self.private[start..start + CALIBRATION_BYTES].as_mut_ptr();
        let shared = self.shared.as_mut_ptr();
        let started = Instant::now();
        for at in (0..CALIBRATION_BYTES).step_by(PIECE_BYTES) {
            let (source, destination) = match direction {
                Direction::Store => (private.cast_const(), shared),
                Direction::Load => (shared.cast_const(), private),
            };
            // SAFETY: both ranges lie inside their buffers (the private range was sliced
            // above, the shared mapping is `CALIBRATION_BYTES` long) and are separate
            // allocations, so they do not overlap.
            unsafe { routine.copy(source.add(at), destination.add(at), PIECE_BYTES) };
        }
        std::hint::black_box(&self.private);
        started.elapsed().as_secs_f64().max(1e-9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds as `[memcpy seconds, streaming seconds]`: the median round's ratio decides,
    /// so one round that another process disturbed does not, and a tie is memcpy's.
    #[test]
    fn the_median_round_decides_and_memcpy_wins_a_tie() {
        let cases: [(&[[f64; 2]], CopyRoutine); 5] = [
            (
                &[[2.0, 1.0], [2.0, 1.0], [2.0, 1.0]],
                CopyRoutine::Streaming,
            ),
            (&[[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]], CopyRoutine::Memcpy),
            // One disturbed round with a huge memcpy time does not choose streaming.
            (&[[1.0, 1.1], [50.0, 1.1], [1.0, 1.1]], CopyRoutine::Memcpy),
            (&[[1.0, 1.0], [1.0, 1.0]], CopyRoutine::Memcpy),
            (&[], CopyRoutine::Memcpy),
        ];
        for (rounds, chosen) in cases {
            let rates = Rates::of(rounds, 1 << 20);
            assert_eq!(rates.faster(), chosen, "{rounds:?}: {rates:?}");
        }
        let rates = Rates::of(&[[0.5, 0.25], [0.5, 0.25]], 1 << 30);
        assert!((rates.memcpy_gbps - 2.147).abs() < 0.01, "{rates:?}");
        assert!(
            (rates.streaming_over_memcpy - 2.0).abs() < 1e-9,
            "{rates:?}"
        );
    }

    /// On this machine, whatever it is: the measurement runs, both routines copy at a
    /// positive rate in both directions, and the routines this process runs are the faster
    /// of each direction as measured (or those the environment variable named).
    #[test]
    fn the_routines_in_use_are_the_faster_measured_here() {
        let calibration = Calibration::measure();
        assert_eq!(calibration.failed, None);
        for rates in [calibration.store, calibration.load] {
            assert!(
                rates.memcpy_gbps > 0.0 && rates.streaming_gbps > 0.0,
                "{rates:?}"
            );
        }
        let routines = super::super::routines();
        if let Some(measured) = &routines.calibration {
            assert_eq!(routines.store, measured.store.faster());
            assert_eq!(routines.load, measured.load.faster());
        }
    }
}
