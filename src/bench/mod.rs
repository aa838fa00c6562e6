//! Benchmarks run by `kvtier bench ...`. Each measures a physical or structural limit in
//! the same run (memcpy, a bare hash index, loopback transport) and reports the ratio,
//! with fixed seeds and distributions from histograms.

pub mod cxl;
pub mod data;
pub mod directory;
pub mod directory_quic;
pub mod histogram;

/// Resident memory of this process in bytes, from `/proc/self/statm` (0 where unavailable).
pub fn resident_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let resident_pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    resident_pages * u64::try_from(page_bytes).unwrap_or(4096)
}

/// SplitMix64, the benchmarks' seeded generator.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut mixed = self.0;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        mixed ^ (mixed >> 31)
    }

    /// A value in `0..bound` (`bound > 0`).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }
}
