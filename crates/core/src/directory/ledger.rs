//! The per-session operation ledger: the outcome of every reserve and commit the node has
//! not yet acknowledged. It makes those operations idempotent (a retry gets the first
//! outcome) and lets `resolve` answer for a lost reply. The node acknowledges a prefix of
//! its operation ids; entries at or below that point are dropped. The ledger never drops
//! an unacknowledged entry: when full it refuses new operations.

use super::ops::{CommitOutcome, ExtentGrant, ExtentReturn, ReserveOutcome};
use crate::model::OperationId;
use std::collections::BTreeMap;

/// What the ledger remembers about one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerEntry {
    Reserve(ReserveOutcome),
    Commit(CommitOutcome),
    Extent(ExtentGrant),
    ExtentReturn(ExtentReturn),
    /// `resolve` declared it not applied; a late arrival is refused.
    Burnt,
}

/// Whether an operation may proceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LedgerCheck {
    /// Never seen: apply it, then record it.
    New,
    /// Seen: answer with this.
    Recorded(LedgerEntry),
    /// At or below the acknowledged point: refuse.
    Acknowledged,
    /// Never seen, but the ledger is full: refuse until the node acknowledges.
    Full,
}

/// One session's ledger, bounded by `entries_max`.
#[derive(Debug)]
pub struct Ledger {
    entries: BTreeMap<u64, LedgerEntry>,
    acknowledged_through: Option<u64>,
    entries_max: usize,
}

impl Ledger {
    /// An empty ledger holding at most `entries_max` unacknowledged outcomes.
    pub fn new(entries_max: usize) -> Ledger {
        Ledger {
            entries: BTreeMap::new(),
            acknowledged_through: None,
            entries_max,
        }
    }

    /// What to do with `operation`.
    pub fn check(&self, operation: OperationId) -> LedgerCheck {
        if self
            .acknowledged_through
            .is_some_and(|through| operation.0 <= through)
        {
            return LedgerCheck::Acknowledged;
        }
        match self.entries.get(&operation.0) {
            Some(entry) => LedgerCheck::Recorded(*entry),
            None if self.entries.len() >= self.entries_max => LedgerCheck::Full,
            None => LedgerCheck::New,
        }
    }

    /// Records the outcome of a `New` operation.
    pub fn record(&mut self, operation: OperationId, entry: LedgerEntry) {
        assert!(
            self.entries.len() < self.entries_max,
            "ledger over its bound"
        );
        self.entries.insert(operation.0, entry);
    }

    /// The recorded outcome, if any.
    pub fn get(&self, operation: OperationId) -> Option<LedgerEntry> {
        self.entries.get(&operation.0).copied()
    }

    /// Whether `operation` is at or below the acknowledged point.
    pub fn is_acknowledged(&self, operation: OperationId) -> bool {
        self.acknowledged_through
            .is_some_and(|through| operation.0 <= through)
    }

    /// The node received every reply up to and including `through`: forget those entries.
    /// Acknowledgements never move backwards.
    pub fn acknowledge(&mut self, through: OperationId) {
        if self
            .acknowledged_through
            .is_some_and(|current| through.0 <= current)
        {
            return;
        }
        self.acknowledged_through = Some(through.0);
        self.entries = self.entries.split_off(&(through.0.saturating_add(1)));
        if through.0 == u64::MAX {
            self.entries.clear();
        }
    }

    /// Unacknowledged entries held.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_answers_acknowledges_and_bounds() {
        let mut ledger = Ledger::new(2);
        let first = OperationId(1);
        assert_eq!(ledger.check(first), LedgerCheck::New);
        ledger.record(first, LedgerEntry::Commit(CommitOutcome::Committed));
        assert_eq!(
            ledger.check(first),
            LedgerCheck::Recorded(LedgerEntry::Commit(CommitOutcome::Committed))
        );
        ledger.record(OperationId(2), LedgerEntry::Burnt);
        assert_eq!(ledger.check(OperationId(3)), LedgerCheck::Full);
        ledger.acknowledge(OperationId(1));
        assert_eq!(ledger.check(first), LedgerCheck::Acknowledged);
        assert_eq!(ledger.entry_count(), 1);
        assert_eq!(ledger.check(OperationId(3)), LedgerCheck::New);
        ledger.acknowledge(OperationId(0));
        assert!(
            ledger.is_acknowledged(first),
            "acknowledgement never moves back"
        );
    }
}
