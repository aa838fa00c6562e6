//! Batched stores: many reserves, or many commits, in one request. Each item carries its
//! own operation id and is applied exactly as the single-item operation would be (the
//! ledger replays a retried item), so a batch is only a way to save round trips; its
//! outcomes are per item, in order. A batch over `batch_items_max` is refused whole.

use super::{CommitOutcome, Directory, DirectoryError, ReserveItem, ReserveOutcome};
use crate::model::{Location, OperationId, ReplicaId, SessionId, Timestamp};
use serde::{Deserialize, Serialize};

/// One reserve of a batch: the single reserve's operation id and item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveBatchItem {
    pub operation: OperationId,
    pub item: ReserveItem,
}

/// One commit of a batch: the single commit's operation id, replica and location.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitBatchItem {
    pub operation: OperationId,
    pub replica: ReplicaId,
    pub location: Location,
}

impl Directory {
    /// [`Directory::reserve`] for each item, in order; one outcome (or refusal) per item.
    /// `BatchTooLarge` (nothing applied) past `batch_items_max` items.
    pub fn reserve_many(
        &mut self,
        now: Timestamp,
        session: SessionId,
        items: &[ReserveBatchItem],
    ) -> Result<Vec<Result<ReserveOutcome, DirectoryError>>, DirectoryError> {
        self.check_batch(items.len())?;
        Ok(items
            .iter()
            .map(|item| self.reserve(now, session, item.operation, item.item))
            .collect())
    }

    /// [`Directory::commit`] for each item, in order; one outcome (or refusal) per item.
    /// `BatchTooLarge` (nothing applied) past `batch_items_max` items.
    pub fn commit_many(
        &mut self,
        now: Timestamp,
        session: SessionId,
        items: &[CommitBatchItem],
    ) -> Result<Vec<Result<CommitOutcome, DirectoryError>>, DirectoryError> {
        self.check_batch(items.len())?;
        Ok(items
            .iter()
            .map(|item| self.commit(now, session, item.operation, item.replica, item.location))
            .collect())
    }
}
