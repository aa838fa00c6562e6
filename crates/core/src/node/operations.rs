//! The operation ids of a node's session: each reserve, commit and extent operation gets
//! a fresh id, the directory records its outcome under it, and the node acknowledges (with
//! each heartbeat) every id below the oldest one still waiting for its reply, so the
//! directory's ledger stays small and a lost reply can always be resolved.

use crate::model::OperationId;
use std::collections::BTreeSet;

/// Operations a node may have outstanding (sent, or being resolved) at once: the
/// directory's default ledger bound per session, so a node never makes the directory
/// refuse with a full ledger before it refuses itself.
pub const OPERATIONS_OUTSTANDING_MAX: usize = 1 << 16;

/// Operation ids issued since the last acknowledgement the directory answered after which
/// the node acknowledges at once rather than at its next heartbeat: a quarter of the
/// directory's default ledger. The node checks every task interval (50 ms), so the ledger
/// holds at most this plus what the node issues in one interval and one round trip; a
/// heartbeat period (1 s by default) of small stores could otherwise fill it.
pub const ACKNOWLEDGE_AFTER_OPERATIONS: u64 = (OPERATIONS_OUTSTANDING_MAX / 4) as u64;

/// The window of one session's operation ids. Ids start at 1 and grow; ids end in any
/// order. See the module documentation.
#[derive(Debug)]
pub struct OperationWindow {
    next: u64,
    outstanding: BTreeSet<u64>,
    /// The last acknowledgement the directory answered (0: none).
    acknowledged: u64,
}

impl Default for OperationWindow {
    fn default() -> Self {
        OperationWindow::new()
    }
}

impl OperationWindow {
    /// A window for a new session: nothing sent yet.
    pub fn new() -> OperationWindow {
        OperationWindow {
            next: 1,
            outstanding: BTreeSet::new(),
            acknowledged: 0,
        }
    }

    /// A fresh id, outstanding until [`OperationWindow::end`]; `None` when
    /// [`OPERATIONS_OUTSTANDING_MAX`] are outstanding (the caller refuses `Busy`).
    pub fn begin(&mut self) -> Option<OperationId> {
        if self.outstanding.len() >= OPERATIONS_OUTSTANDING_MAX {
            return None;
        }
        let operation = self.next;
        self.next += 1;
        self.outstanding.insert(operation);
        Some(OperationId(operation))
    }

    /// The operation's outcome is known (or will never be asked for again). Repeating it is
    /// harmless.
    pub fn end(&mut self, operation: OperationId) {
        self.outstanding.remove(&operation.0);
    }

    /// The highest id below every outstanding one: the directory may forget every outcome
    /// up to it. `None` before the first id ended.
    pub fn acknowledged_through(&self) -> Option<OperationId> {
        let oldest = self.outstanding.first().copied().unwrap_or(self.next);
        let through = oldest.checked_sub(1)?;
        (through > 0).then_some(OperationId(through))
    }

    /// Ids sent or being resolved.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// The directory answered a heartbeat that acknowledged `through`.
    pub fn acknowledged(&mut self, through: Option<OperationId>) {
        if let Some(through) = through {
            self.acknowledged = self.acknowledged.max(through.0);
        }
    }

    /// Whether so many ids were issued since the last answered acknowledgement
    /// ([`ACKNOWLEDGE_AFTER_OPERATIONS`]) that the node should acknowledge now. An upper
    /// bound of what the directory's ledger holds for the node.
    pub fn acknowledgement_due(&self) -> bool {
        (self.next - 1).saturating_sub(self.acknowledged) >= ACKNOWLEDGE_AFTER_OPERATIONS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledges_below_the_oldest_outstanding_id() {
        let mut window = OperationWindow::new();
        assert_eq!(window.acknowledged_through(), None);
        let first = window.begin().unwrap();
        let second = window.begin().unwrap();
        let third = window.begin().unwrap();
        assert_eq!((first.0, second.0, third.0), (1, 2, 3));
        window.end(second);
        assert_eq!(window.acknowledged_through(), None, "1 still outstanding");
        window.end(first);
        assert_eq!(window.acknowledged_through(), Some(OperationId(2)));
        window.end(third);
        window.end(third);
        assert_eq!(window.acknowledged_through(), Some(OperationId(3)));
        assert_eq!(window.outstanding(), 0);
    }

    #[test]
    fn an_acknowledgement_is_due_after_a_quarter_of_the_ledger() {
        let mut window = OperationWindow::new();
        for _ in 0..ACKNOWLEDGE_AFTER_OPERATIONS - 1 {
            let operation = window.begin().unwrap();
            window.end(operation);
        }
        assert!(!window.acknowledgement_due());
        let last = window.begin().unwrap();
        window.end(last);
        assert!(window.acknowledgement_due());
        window.acknowledged(window.acknowledged_through());
        assert!(!window.acknowledgement_due(), "answered through {last:?}");
        window.acknowledged(Some(OperationId(1)));
        assert!(
            !window.acknowledgement_due(),
            "an older answer moves nothing back"
        );
    }

    #[test]
    fn refuses_past_its_bound() {
        let mut window = OperationWindow::new();
        for _ in 0..OPERATIONS_OUTSTANDING_MAX {
            assert!(window.begin().is_some());
        }
        assert_eq!(window.begin(), None);
        window.end(OperationId(1));
        assert!(window.begin().is_some(), "room again after an end");
    }
}
