//! The SSD store: a node's private L2 tier. Objects live in fixed-size region files under
//! one directory on a local file system, written and read with direct I/O through io_uring,
//! each behind a checksummed header; space comes back a whole region at a time.
//!
//! * `layout`: the on-disk format (documented there), its encoding and decoding.
//! * `region`: the sans-I/O core: placement into regions, whole-region reclaim, the index.
//! * `disk`: what region files live on: the OS's files, or a model disk that loses unsynced
//!   writes, tears and rots blocks (tests and simulations).
//! * `io`: the bounded I/O queue (io_uring, pread/pwrite fallback) and aligned buffers.
//! * `recovery`: the scan that rebuilds the index at a restart.
//! * `source`: where a write's bytes come from (slices, or a filler of the staging slot).
//! * `store`: `SsdStore`, which ties them together.
//! * `error`: `SsdError` and the counted reasons a spill is skipped.

pub mod disk;
pub mod error;
pub mod io;
pub mod layout;
pub mod recovery;
pub mod region;
pub mod source;
pub mod store;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_crash;

pub use error::{SkipReason, SsdError};
pub use region::SsdUsage;
pub use store::{
    OpenReport, PinnedObject, ReadOutcome, SsdConfig, SsdCounters, SsdStore, StoredPlace,
    WriteBatch,
};
