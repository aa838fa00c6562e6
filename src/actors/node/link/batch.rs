//! Batched reserves and commits through the link: one `ReserveMany` or `CommitMany` round
//! trip for many stores. Every item has its own operation id, so a lost reply is resolved
//! item by item exactly as a single reserve's or commit's would be, and each item ends as
//! the single call would have ended.

use super::{DirectoryLink, LinkError, Outstanding};
use crate::directory::{
    CommitBatchItem, CommitOutcome, ReserveBatchItem, ReserveItem, ReserveOutcome, ResolveOutcome,
};
use crate::model::{Location, ReplicaId, SessionId};
use crate::protocol::messages::{DirectoryReply, DirectoryRequest, ProtocolError};

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
            LinkError::Wire(error) => LinkError::Unexpected(error.to_string()),
        }
    }
}

impl DirectoryLink {
    /// [`DirectoryLink::reserve`] for many items in one round trip (at most the session's
    /// `batch_items_max`: the directory refuses more whole). One outcome per item, in order.
    pub async fn reserve_many(
        &self,
        items: &[ReserveItem],
    ) -> Vec<Result<ReserveOutcome, LinkError>> {
        let guards = match items
            .iter()
            .map(|_| self.begin())
            .collect::<Result<Vec<Outstanding<'_>>, LinkError>>()
        {
            Ok(guards) => guards,
            Err(error) => return items.iter().map(|_| Err(error.for_item())).collect(),
        };
        let Some(session) = guards.first().map(|guard| guard.session) else {
            return Vec::new();
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
        let mut outcomes = Vec::with_capacity(guards.len());
        for guard in &guards {
            outcomes.push(match self.resolve(session, guard.operation).await {
                Ok(ResolveOutcome::Reserved(outcome)) => Ok(outcome),
                Ok(ResolveOutcome::NotApplied) => Ok(ReserveOutcome::Skip),
                Ok(_) | Err(_) => Err(LinkError::Unresolved(guard.operation)),
            });
        }
        outcomes
    }

    /// [`DirectoryLink::commit`] for many written replicas in one round trip (at most the
    /// session's `batch_items_max`). One outcome per item, in order, read as `commit`'s:
    /// `Ok(None)` for a commit that was not (and never will be) applied.
    pub async fn commit_many(
        &self,
        items: &[CommitRequest],
    ) -> Vec<Result<Option<CommitOutcome>, LinkError>> {
        let session = self.session();
        let mut outcomes: Vec<Option<Result<Option<CommitOutcome>, LinkError>>> = items
            .iter()
            .map(|item| (item.session != session).then_some(Ok(None)))
            .collect();
        let current: Vec<(usize, &CommitRequest)> = items
            .iter()
            .enumerate()
            .filter(|(index, _)| outcomes[*index].is_none())
            .collect();
        let guards = match current
            .iter()
            .map(|_| self.begin())
            .collect::<Result<Vec<Outstanding<'_>>, LinkError>>()
        {
            Ok(guards) => guards,
            Err(error) => {
                for (index, _) in &current {
                    outcomes[*index] = Some(Err(error.for_item()));
                }
                return finish(outcomes);
            }
        };
        if guards.is_empty() {
            return finish(outcomes);
        }
        let batch = guards
            .iter()
            .zip(&current)
            .map(|(guard, (_, item))| CommitBatchItem {
                operation: guard.operation,
                replica: item.replica,
                location: item.location,
            })
            .collect();
        let request = DirectoryRequest::CommitMany { items: batch };
        let error = match self.call_in(session, request).await {
            Ok(DirectoryReply::CommittedMany(committed)) if committed.len() == current.len() => {
                for ((index, _), outcome) in current.iter().zip(committed) {
                    outcomes[*index] = Some(
                        outcome
                            .map(Some)
                            .map_err(|error| LinkError::Refused(ProtocolError::Directory(error))),
                    );
                }
                return finish(outcomes);
            }
            Ok(other) => LinkError::Unexpected(format!("{other:?}")),
            Err(error) => error,
        };
        for ((index, _), guard) in current.iter().zip(&guards) {
            outcomes[*index] = Some(match &error {
                LinkError::SessionEnded => Ok(None),
                LinkError::Wire(_) => match self.resolve(session, guard.operation).await {
                    Ok(ResolveOutcome::Committed(outcome)) => Ok(Some(outcome)),
                    Ok(ResolveOutcome::NotApplied) => Ok(None),
                    Ok(_) | Err(_) => Err(LinkError::Unresolved(guard.operation)),
                },
                other => Err(other.for_item()),
            });
        }
        finish(outcomes)
    }
}

/// Every item's outcome, each of which was set.
fn finish(
    outcomes: Vec<Option<Result<Option<CommitOutcome>, LinkError>>>,
) -> Vec<Result<Option<CommitOutcome>, LinkError>> {
    outcomes
        .into_iter()
        .map(|outcome| outcome.unwrap_or(Ok(None)))
        .collect()
}
