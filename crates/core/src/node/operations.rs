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

/// The window of one session's operation ids. Ids start at 1 and grow; ids end in any
/// order. See the module documentation.
#[derive(Debug)]
pub struct OperationWindow {
    next: u64,
    outstanding: BTreeSet<u64>,
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
