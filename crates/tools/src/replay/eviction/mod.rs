//! The replay's eviction orders for one tier behind one trait, compared on a trace:
//! kvtier's own order ([`Kvtier`], choosing with the directory's
//! [`kvtier_core::policy::eviction::choose`]), and LRU, S3-FIFO and Belady's offline optimum as
//! references. Each policy owns only its ordering metadata; residency and the movement of
//! bytes belong to the caller. The directory does not use this trait: it keeps its own
//! per-pool recency lists and calls `choose` directly.

mod belady;
mod kvtier;
mod lru;
mod s3fifo;

pub use belady::Belady;
pub use kvtier::Kvtier;
pub use lru::Lru;
pub use s3fifo::S3Fifo;

use kvtier_core::policy::history::History;
use kvtier_core::policy::BlockId;

/// One access to a block as an eviction policy sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Access {
    /// The block.
    pub block: BlockId,
    /// Tokens it holds (the last block of a prompt may be partial).
    pub tokens: u32,
    /// Accesses so far, this one included (from [`History::record`]).
    pub frequency: u32,
    /// Time of the access, in milliseconds.
    pub now_ms: u64,
    /// Oracle: index of the next request that uses the block, `None` if none does.
    /// Only an offline policy (Belady) may read it.
    pub next_use: Option<u64>,
}

/// An eviction order over the blocks of one tier.
///
/// Contract between the caller and a policy of capacity `capacity()` blocks:
/// * the caller calls `touch` only for blocks the policy holds, `insert` only for blocks it
///   does not hold, only after `admit` returned true for that access, and only while
///   `len() < capacity()`; it calls `evict` first to make room;
/// * `evict` removes and returns one held block, `None` when it holds none or (kvtier) none
///   may go yet: every held block is younger than its minimum residency;
/// * `remove` forgets a held block (the caller moved it elsewhere) and returns whether it
///   was held; removing an unknown block is a no-op, safe to repeat;
/// * `admit` does not change the policy; refusing means "not worth a slot here";
/// * every method is deterministic in its arguments and the policy's past calls.
pub trait Eviction {
    /// Short name used in reports and JSON keys.
    fn name(&self) -> &'static str;
    /// Blocks held.
    fn len(&self) -> usize;
    /// True when no block is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Most blocks held at once.
    fn capacity(&self) -> usize;
    /// Whether the block of `access` (its latest access) deserves a slot at `now_ms`,
    /// evicting if the tier is full.
    fn admit(&self, access: &Access, now_ms: u64, history: &History) -> bool;
    /// Starts holding a block.
    fn insert(&mut self, access: &Access);
    /// Records an access to a held block.
    fn touch(&mut self, access: &Access);
    /// Removes and returns the block to evict at `now_ms`.
    fn evict(&mut self, now_ms: u64, history: &History) -> Option<BlockId>;
    /// Forgets a held block; returns whether it was held.
    fn remove(&mut self, block: BlockId) -> bool;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An access to a full block seen once, at `now_ms`.
    pub(crate) fn access(block: BlockId, now_ms: u64) -> Access {
        Access {
            block,
            tokens: 512,
            frequency: 1,
            now_ms,
            next_use: Some(u64::MAX - 1),
        }
    }

    /// Runs the trait contract on an empty policy of capacity 2: empty eviction, exactly
    /// full, one over, remove twice.
    pub(crate) fn contract(mut policy: Box<dyn Eviction>) {
        let history = History::new();
        assert_eq!(policy.capacity(), 2);
        assert!(policy.is_empty());
        assert_eq!(policy.evict(0, &history), None);
        for block in [1, 2] {
            let access = access(block, block);
            assert!(
                policy.admit(&access, access.now_ms, &history),
                "{}",
                policy.name()
            );
            policy.insert(&access);
        }
        assert_eq!(policy.len(), 2);
        let victim = policy.evict(3, &history);
        assert!(matches!(victim, Some(1 | 2)), "{}", policy.name());
        assert_eq!(policy.len(), 1);
        let kept = if victim == Some(1) { 2 } else { 1 };
        assert!(policy.remove(kept));
        assert!(!policy.remove(kept));
        assert!(policy.is_empty());
    }
}
