//! Benchmarks run by `kvtier bench ...`. Each measures a physical or structural limit in
//! the same run (memcpy, a bare hash index, loopback transport) and reports the ratio,
//! with fixed seeds and distributions from histograms.

pub mod chaos;
pub mod chaos_client;
mod chaos_ha;
pub mod cxl;
pub mod data;
pub mod directory;
pub mod directory_quic;
mod full_cache;
pub mod local_hits;
pub mod peer;
pub mod replicate;
pub mod ssd;

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
