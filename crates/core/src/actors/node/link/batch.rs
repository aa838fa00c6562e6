//! Batched reserves and commits through the link: one `ReserveMany` or `CommitMany` round
//! trip per chunk of at most the session's `batch_items_max` items. Every item has its own
//! operation id, so a lost reply is resolved item by item as a single reserve's or commit's
//! would be, but under one deadline for the whole chunk: once an item cannot be resolved
//! (or the deadline passes) the rest are `Unresolved` without asking.

use super::{DirectoryLink, LinkError, Outstanding, DIRECTORY_REQUEST_TIMEOUT};
use crate::directory::{
    CommitBatchItem, CommitOutcome, ReserveBatchItem, ReserveItem, ReserveOutcome,
};
use crate::model::{Location, OperationId, ReplicaId, SessionId};
use crate::protocol::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use std::future::Future;
use std::time::Duration;

/// How long resolving every item of a chunk whose reply was lost may take in all. With the
/// request's own [`DIRECTORY_REQUEST_TIMEOUT`] it stays well inside the client's request
/// timeout (`CLIENT_REQUEST_TIMEOUT`, 10 s).
const BATCH_RESOLVE_DEADLINE: Duration = DIRECTORY_REQUEST_TIMEOUT.saturating_mul(2);

/// One commit of [`DirectoryLink::commit_many`]: the session the replica was reserved in,
/// the replica, and where it was written.
#[derive(Clone, Copy, Debug)]
pub struct CommitRequest {
    pub session: SessionId,
    pub replica: ReplicaId,
    pub location: Location,
}

impl LinkError {
    /// The same failure for another item of a batch that failed whole. A lost reply is
    /// never copied: the caller resolves each item's operation instead.
    fn for_item(&self) -> LinkError {
        match self {
            LinkError::Refused(error) => LinkError::Refused(error.clone()),
            LinkError::Unexpected(reply) => LinkError::Unexpected(reply.clone()),
            LinkError::Unresolved(operation) => LinkError::Unresolved(*operation),
            LinkError::Busy => LinkError::Busy,
            LinkError::Rejoining => LinkError::Rejoining,
            LinkError::SessionEnded => LinkError::SessionEnded,
            LinkError::Unreachable => LinkError::Unreachable,
            LinkError::Wire(error) => LinkError::Unexpected(error.to_string()),
        }
    }
}

impl DirectoryLink {
    /// [`DirectoryLink::reserve`] for many items, in the session bound now (returned with
    /// the outcomes: every reservation belongs to it), one round trip per chunk of the
    /// session's `batch_items_max`. One outcome per item, in order.
    pub async fn reserve_many(
        &self,
        items: &[ReserveItem],
    ) -> (SessionId, Vec<Result<ReserveOutcome, LinkError>>) {
        let session = self.session();
        let mut outcomes = Vec::with_capacity(items.len());
        for chunk in items.chunks(self.batch_items_max().max(1)) {
            outcomes.extend(self.reserve_chunk(session, chunk).await);
        }
        (session, outcomes)
    }

    async fn reserve_chunk(
        &self,
        session: SessionId,
        items: &[ReserveItem],
    ) -> Vec<Result<ReserveOutcome, LinkError>> {
        let guards = match self.begin_many(items.len()) {
            Ok(guards) => guards,
            Err(error) => return items.iter().map(|_| Err(error.for_item())).collect(),
        };
        let batch = guards
            .iter()
            .zip(items)
            .map(|(guard, item)| ReserveBatchItem {
                operation: guard.operation,
                item: *item,
            })
            .collect();
        let request = DirectoryRequest::ReserveMany { items: batch };
        let error = match self.call_in(session, request).await {
            Ok(DirectoryReply::ReservedMany(outcomes)) if outcomes.len() == items.len() => {
                return outcomes
                    .into_iter()
                    .map(|outcome| {
                        outcome.map_err(|error| LinkError::Refused(ProtocolError::Directory(error)))
                    })
                    .collect()
            }
            Ok(other) => LinkError::Unexpected(format!("{other:?}")),
            Err(error) => error,
        };
        if !matches!(error, LinkError::Wire(_)) {
            return items.iter().map(|_| Err(error.for_item())).collect();
        }
        resolve_each(&guards, |operation| {
            self.resolve_reserve(session, operation)
        })
        .await
    }

    /// [`DirectoryLink::commit`] for many written replicas, one round trip per chunk of the
    /// session's `batch_items_max`. One outcome per item, in order, read as `commit`'s:
    /// `Ok(None)` for a commit that was not (and never will be) applied.
    pub async fn commit_many(
        &self,
        items: &[CommitRequest],
    ) -> Vec<Result<Option<CommitOutcome>, LinkError>> {
        let session = self.session();
        let current: Vec<&CommitRequest> = items
            .iter()
            .filter(|item| item.session == session)
            .collect();
        let mut committed = Vec::with_capacity(current.len());
        for chunk in current.chunks(self.batch_items_max().max(1)) {
            committed.extend(self.commit_chunk(session, chunk).await);
        }
        let mut committed = committed.into_iter();
        items
            .iter()
            .map(|item| {
                if item.session == session {
                    committed.next().unwrap_or(Ok(None))
                } else {
                    // Reserved in an ended session: never applied, and never will be.
                    Ok(None)
                }
            })
            .collect()
    }

    async fn commit_chunk(
        &self,
        session: SessionId,
        items: &[&CommitRequest],
    ) -> Vec<Result<Option<CommitOutcome>, LinkError>> {
        let guards = match self.begin_many(items.len()) {
            Ok(guards) => guards,
            Err(error) => return items.iter().map(|_| Err(error.for_item())).collect(),
        };
        let batch = guards
            .iter()
            .zip(items)
            .map(|(guard, item)| CommitBatchItem {
                operation: guard.operation,
                replica: item.replica,
                location: item.location,
            })
            .collect();
        let request = DirectoryRequest::CommitMany { items: batch };
        let error = match self.call_in(session, request).await {
            Ok(DirectoryReply::CommittedMany(committed)) if committed.len() == items.len() => {
                return committed
                    .into_iter()
                    .map(|outcome| {
                        outcome
                            .map(Some)
                            .map_err(|error| LinkError::Refused(ProtocolError::Directory(error)))
                    })
                    .collect()
            }
            Ok(other) => LinkError::Unexpected(format!("{other:?}")),
            Err(error) => error,
        };
        match error {
            LinkError::SessionEnded => items.iter().map(|_| Ok(None)).collect(),
            LinkError::Wire(_) => {
                resolve_each(&guards, |operation| self.resolve_commit(session, operation)).await
            }
            other => items.iter().map(|_| Err(other.for_item())).collect(),
        }
    }

    /// One operation id per item, or the reason none could be had.
    fn begin_many(&self, items: usize) -> Result<Vec<Outstanding<'_>>, LinkError> {
        (0..items).map(|_| self.begin()).collect()
    }
}

/// Resolves each operation of a chunk whose reply was lost, in order, under one
/// [`BATCH_RESOLVE_DEADLINE`]: once one cannot be resolved, the rest are `Unresolved`
/// without asking (the directory is not answering).
async fn resolve_each<T, F, R>(
    guards: &[Outstanding<'_>],
    mut resolve: F,
) -> Vec<Result<T, LinkError>>
where
    F: FnMut(OperationId) -> R,
    R: Future<Output = Result<T, LinkError>>,
{
    let deadline = tokio::time::Instant::now() + BATCH_RESOLVE_DEADLINE;
    let mut answering = true;
    let mut outcomes = Vec::with_capacity(guards.len());
    for guard in guards {
        let operation = guard.operation;
        let outcome = if answering {
            tokio::time::timeout_at(deadline, resolve(operation))
                .await
                .unwrap_or(Err(LinkError::Unresolved(operation)))
        } else {
            Err(LinkError::Unresolved(operation))
        };
        answering = !matches!(outcome, Err(LinkError::Unresolved(_)));
        outcomes.push(outcome);
    }
    outcomes
}
