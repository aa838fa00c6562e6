//! The extents of shared pools that this node is giving back. An empty extent leaves the
//! node's allocator before it is offered to the directory, and comes back into it only
//! when the directory answered that the extent is still this node's. A return whose reply
//! was lost is neither: the directory may already have freed the extent and granted it to
//! another node, so it stays out of the allocator (quarantined) until its operation is
//! resolved. This is what keeps a page from ever having two writers.

use crate::directory::{ExtentReturn, ResolveOutcome};
use crate::model::{OperationId, PoolId};
use std::collections::BTreeMap;

/// Returns one node may have unanswered or unresolved at once: one per extent it can hold.
pub const RETURNS_PENDING_MAX: usize = crate::backends::extent_allocator::EXTENTS_PER_NODE_MAX;

/// What the node does with an extent once its return has an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentAction {
    /// The extent is gone from this node: never allocate in it again.
    Forget,
    /// The extent is still this node's: put it back into the pool's allocator.
    AddBack {
        pool: PoolId,
        offset_bytes: u64,
        length_bytes: u64,
    },
    /// The answer is unknown: keep the extent out of the allocator and resolve the
    /// operation (see [`ExtentReturns::unresolved`]).
    Resolve,
}

/// One return in flight.
#[derive(Clone, Copy, Debug)]
struct Return {
    length_bytes: u64,
    operation: OperationId,
    /// Whether its reply was lost and the operation must be resolved.
    lost: bool,
}

/// Why a return could not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReturnRefused {
    /// [`RETURNS_PENDING_MAX`] returns are pending: keep the extent for now.
    TooManyPending,
    /// This extent's return is already pending.
    AlreadyPending,
}

/// The pending returns of one node session. See the module documentation.
#[derive(Debug, Default)]
pub struct ExtentReturns {
    pending: BTreeMap<(PoolId, u64), Return>,
}

impl ExtentReturns {
    /// No return pending.
    pub fn new() -> ExtentReturns {
        ExtentReturns::default()
    }

    /// The operations of every pending return.
    pub fn operations(&self) -> Vec<OperationId> {
        self.pending
            .values()
            .map(|pending| pending.operation)
            .collect()
    }

    /// The extent at `offset_bytes` of `pool` left the allocator and is offered back under
    /// `operation`. On a refusal the caller puts it back into the allocator.
    pub fn begin(
        &mut self,
        pool: PoolId,
        offset_bytes: u64,
        length_bytes: u64,
        operation: OperationId,
    ) -> Result<(), ReturnRefused> {
        if self.pending.contains_key(&(pool, offset_bytes)) {
            return Err(ReturnRefused::AlreadyPending);
        }
        if self.pending.len() >= RETURNS_PENDING_MAX {
            return Err(ReturnRefused::TooManyPending);
        }
        let record = Return {
            length_bytes,
            operation,
            lost: false,
        };
        self.pending.insert((pool, offset_bytes), record);
        Ok(())
    }

    /// The directory answered the return (or its resolution). `None` means the reply was
    /// lost: the extent stays quarantined until resolved. An unknown extent is forgotten.
    pub fn answered(
        &mut self,
        pool: PoolId,
        offset_bytes: u64,
        answer: Option<ExtentReturn>,
    ) -> ExtentAction {
        let key = (pool, offset_bytes);
        let Some(record) = self.pending.get_mut(&key) else {
            return ExtentAction::Forget;
        };
        match answer {
            None => {
                record.lost = true;
                ExtentAction::Resolve
            }
            Some(ExtentReturn::InUse) => {
                let length_bytes = record.length_bytes;
                self.pending.remove(&key);
                ExtentAction::AddBack {
                    pool,
                    offset_bytes,
                    length_bytes,
                }
            }
            Some(ExtentReturn::Returned | ExtentReturn::NotOwner) => {
                self.pending.remove(&key);
                ExtentAction::Forget
            }
        }
    }

    /// What resolving a lost return told. A return that was never applied is still this
    /// node's; one the directory no longer knows is forgotten (quarantined for good: never
    /// reused on a guess).
    pub fn resolved(
        &mut self,
        pool: PoolId,
        offset_bytes: u64,
        outcome: ResolveOutcome,
    ) -> ExtentAction {
        let answer = match outcome {
            ResolveOutcome::ExtentReturned(answer) => answer,
            ResolveOutcome::NotApplied => ExtentReturn::InUse,
            _ => ExtentReturn::NotOwner,
        };
        self.answered(pool, offset_bytes, Some(answer))
    }

    /// Lost returns to resolve: `(pool, offset, operation)`.
    pub fn unresolved(&self) -> Vec<(PoolId, u64, OperationId)> {
        self.pending
            .iter()
            .filter(|(_, record)| record.lost)
            .map(|((pool, offset), record)| (*pool, *offset, record.operation))
            .collect()
    }

    /// Returns pending (answered or not).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: PoolId = PoolId(3);

    #[test]
    fn a_returned_or_foreign_extent_is_never_added_back() {
        let mut returns = ExtentReturns::new();
        returns.begin(POOL, 0, 64, OperationId(1)).unwrap();
        returns.begin(POOL, 64, 64, OperationId(2)).unwrap();
        assert_eq!(
            returns.answered(POOL, 0, Some(ExtentReturn::Returned)),
            ExtentAction::Forget
        );
        assert_eq!(
            returns.answered(POOL, 64, Some(ExtentReturn::NotOwner)),
            ExtentAction::Forget
        );
        assert_eq!(returns.pending(), 0);
    }

    #[test]
    fn an_extent_in_use_goes_back_into_the_allocator() {
        let mut returns = ExtentReturns::new();
        returns.begin(POOL, 128, 64, OperationId(1)).unwrap();
        assert_eq!(
            returns.answered(POOL, 128, Some(ExtentReturn::InUse)),
            ExtentAction::AddBack {
                pool: POOL,
                offset_bytes: 128,
                length_bytes: 64
            }
        );
    }

    #[test]
    fn a_lost_reply_quarantines_until_resolved() {
        let mut returns = ExtentReturns::new();
        returns.begin(POOL, 0, 64, OperationId(7)).unwrap();
        assert_eq!(returns.answered(POOL, 0, None), ExtentAction::Resolve);
        assert_eq!(returns.unresolved(), vec![(POOL, 0, OperationId(7))]);
        assert_eq!(
            returns.begin(POOL, 0, 64, OperationId(8)),
            Err(ReturnRefused::AlreadyPending)
        );
        // Resolution: the directory applied it, so the extent is gone.
        let applied = ResolveOutcome::ExtentReturned(ExtentReturn::Returned);
        assert_eq!(returns.resolved(POOL, 0, applied), ExtentAction::Forget);
        // Another lost return that the directory never applied is still ours.
        returns.begin(POOL, 0, 64, OperationId(9)).unwrap();
        returns.answered(POOL, 0, None);
        assert!(matches!(
            returns.resolved(POOL, 0, ResolveOutcome::NotApplied),
            ExtentAction::AddBack { .. }
        ));
        // One the directory forgot stays out for good.
        returns.begin(POOL, 0, 64, OperationId(10)).unwrap();
        returns.answered(POOL, 0, None);
        assert_eq!(
            returns.resolved(POOL, 0, ResolveOutcome::Unknown),
            ExtentAction::Forget
        );
    }
}
