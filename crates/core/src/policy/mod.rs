//! Pure placement policy (docs/design.md, Tiers and policy): tier profiles, the cost
//! model, the per-tier lifecycle, access history, eviction orders, placement decisions and
//! whether a replication pays. Nothing here does I/O or reads a clock; time arrives as
//! arguments.
//!
//! kvtier's own policy is written once: its eviction order in [`eviction`] and its
//! placement (write order with admission, read selection, demote or evict) in
//! [`placement`]. The directory core and the replay's `kvtier` row both call them, each
//! with a snapshot of its own state.

pub mod cost;
pub mod eviction;
pub mod history;
pub mod lifecycle;
pub mod placement;
pub mod profiles;
pub mod replication;

/// The identity of a cached block as policies see it (a trace's hash id, or a digest of an
/// object id). Policies only compare and hash it.
pub type BlockId = u64;
