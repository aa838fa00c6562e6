//! What a node does with the pages of a store (a client's, or a demotion's copy) once its
//! commit has an outcome. The rule that matters: pages whose commit outcome is unknown are
//! never reused on a guess (invariant 7 of docs/design.md) — they stay allocated.

use crate::backends::PoolError;
use crate::directory::CommitOutcome;

/// How a commit ended, as the node's link saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitResult {
    /// Applied: the replica is READY.
    Applied(CommitOutcome),
    /// Resolved as never applied (and never to be): the reservation is void.
    NotApplied,
    /// Refused by the directory with a typed error: nothing changed there.
    Refused,
    /// Neither the reply nor a resolution arrived.
    Unknown,
}

/// What to do with the store's pages (and its reservation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PagesAfterCommit {
    /// The pages hold a READY replica: keep them until a reclaim task frees them.
    Published,
    /// Free the pages; the reservation is already settled.
    Free,
    /// Free the pages and abort the reservation.
    FreeAndAbort,
    /// Keep the pages allocated for good: their state is unknown.
    Keep,
}

/// The fate of a store's pages after its commit ended with `result`.
pub fn after_commit(result: CommitResult) -> PagesAfterCommit {
    match result {
        CommitResult::Applied(CommitOutcome::Committed) => PagesAfterCommit::Published,
        CommitResult::Applied(CommitOutcome::AlreadyPresent) | CommitResult::NotApplied => {
            PagesAfterCommit::Free
        }
        CommitResult::Refused => PagesAfterCommit::FreeAndAbort,
        CommitResult::Unknown => PagesAfterCommit::Keep,
    }
}

/// Whether a reclaim task may be acknowledged after freeing its allocation gave `freed`:
/// yes when freed now or already gone (a task handed out again after a lost
/// acknowledgement); no when the pool refused for another reason (the task comes back).
pub fn reclaim_done(freed: &Result<u64, PoolError>) -> bool {
    matches!(
        freed,
        Ok(_) | Err(PoolError::StaleGeneration { .. } | PoolError::UnknownAllocation { .. })
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AllocationId, Generation};

    #[test]
    fn unknown_outcomes_keep_their_pages() {
        let cases = [
            (
                CommitResult::Applied(CommitOutcome::Committed),
                PagesAfterCommit::Published,
            ),
            (
                CommitResult::Applied(CommitOutcome::AlreadyPresent),
                PagesAfterCommit::Free,
            ),
            (CommitResult::NotApplied, PagesAfterCommit::Free),
            (CommitResult::Refused, PagesAfterCommit::FreeAndAbort),
            (CommitResult::Unknown, PagesAfterCommit::Keep),
        ];
        for (result, expected) in cases {
            assert_eq!(after_commit(result), expected, "{result:?}");
        }
    }

    #[test]
    fn reclaim_acknowledges_only_what_is_gone() {
        let id = AllocationId(1);
        let generation = Generation(2);
        assert!(reclaim_done(&Ok(4096)));
        assert!(reclaim_done(&Err(PoolError::UnknownAllocation {
            id,
            generation
        })));
        assert!(!reclaim_done(&Err(PoolError::InvalidConfig {
            reason: "x"
        })));
    }
}
