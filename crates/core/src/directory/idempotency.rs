//! Idempotency by operation id, shared by `reserve`, `commit`, `grant_extent` and
//! `return_extent`: the ledger
//! check every one of them starts with (proceed, answer a retry with the first outcome, or
//! refuse) and the record of a new operation's outcome it ends with.

use super::ledger::{LedgerCheck, LedgerEntry};
use super::sessions::Session;
use super::{
    CommitOutcome, Directory, DirectoryError, ExtentGrant, ExtentReturn, ReserveOutcome, Table,
};
use crate::model::{OperationId, SessionId};

/// The outcome of one kind of idempotent operation, as the ledger records it.
pub(super) trait Recorded: Copy {
    /// The ledger entry recording `self`.
    fn entry(self) -> LedgerEntry;
    /// The outcome `entry` records, if it records an operation of this kind.
    fn recorded(entry: LedgerEntry) -> Option<Self>;
}

/// Implements [`Recorded`] for an outcome type recorded as `LedgerEntry::$variant`.
macro_rules! recorded {
    ($outcome:ty, $variant:ident) => {
        impl Recorded for $outcome {
            fn entry(self) -> LedgerEntry {
                LedgerEntry::$variant(self)
            }
            fn recorded(entry: LedgerEntry) -> Option<Self> {
                match entry {
                    LedgerEntry::$variant(outcome) => Some(outcome),
                    _ => None,
                }
            }
        }
    };
}

recorded!(ReserveOutcome, Reserve);
recorded!(CommitOutcome, Commit);
recorded!(ExtentGrant, Extent);
recorded!(ExtentReturn, ExtentReturn);

/// What an idempotent operation does after its ledger check.
pub(super) enum LedgerStep<'a, T> {
    /// A new operation: apply it in this open session, then [`Directory::record_outcome`].
    Proceed(&'a Session),
    /// A retry: answer with the outcome recorded the first time, changing nothing.
    Replay(T),
}

impl Directory {
    /// The prologue of an idempotent operation: the session must be open, and its ledger
    /// says whether `operation` is new (`Proceed`), a retry (`Replay` of the first
    /// outcome), or refused: acknowledged, burnt by `resolve`, recorded for an operation of
    /// another kind (`OperationAcknowledged`), or over the ledger's bound (`Full`).
    pub(super) fn check_ledger<T: Recorded>(
        &self,
        session_id: SessionId,
        operation: OperationId,
    ) -> Result<LedgerStep<'_, T>, DirectoryError> {
        let session = self.open_session(session_id)?;
        match session.ledger.check(operation) {
            LedgerCheck::Recorded(entry) => T::recorded(entry)
                .map(LedgerStep::Replay)
                .ok_or(DirectoryError::OperationAcknowledged(operation)),
            LedgerCheck::Acknowledged => Err(DirectoryError::OperationAcknowledged(operation)),
            LedgerCheck::Full => Err(DirectoryError::Full(Table::Ledger)),
            LedgerCheck::New => Ok(LedgerStep::Proceed(session)),
        }
    }

    /// Whether `session_id`'s ledger has room for `operation`'s outcome, or holds it
    /// already: a sharded directory applies an operation every shard records (an extent's
    /// grant or return) only when no shard's ledger would refuse it as full.
    pub fn ledger_has_room(&self, session_id: SessionId, operation: OperationId) -> bool {
        self.sessions
            .get(&session_id)
            .is_none_or(|session| session.ledger.check(operation) != LedgerCheck::Full)
    }

    /// The epilogue of an idempotent operation that proceeded: records its outcome, so a
    /// retry is answered with it and `resolve` can report it.
    pub(super) fn record_outcome<T: Recorded>(
        &mut self,
        session_id: SessionId,
        operation: OperationId,
        outcome: T,
    ) {
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.ledger.record(operation, outcome.entry());
        }
    }
}
