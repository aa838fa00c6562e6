//! The sender's side of replication between nodes, as books: which targets this node is
//! pushing to a peer. A task the directory hands out again while its push runs (its ack
//! was late) starts no second push, and at most [`PUSHES_QUEUED_MAX`] pushes are under way
//! at once (streaming or waiting for a stream slot). Sans-I/O: the shell streams.

use crate::model::ReplicaId;
use std::collections::HashSet;

/// Pushes started and not yet done (streaming or waiting for a slot): 64. Past it a push
/// is dropped and counted; the directory hands the task out again after its ack timeout.
pub const PUSHES_QUEUED_MAX: usize = 64;

/// What [`PushSet::start`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushStart {
    /// The push is marked: run it, then call [`PushSet::done`].
    Started,
    /// The same target is being pushed (its task was handed out again): nothing to do.
    Running,
    /// [`PUSHES_QUEUED_MAX`] pushes are marked: this one is dropped.
    Full,
}

/// The targets being pushed; at most [`PUSHES_QUEUED_MAX`].
#[derive(Debug, Default)]
pub struct PushSet {
    running: HashSet<ReplicaId>,
}

impl PushSet {
    /// Marks `target` as pushed, unless it already is or [`PUSHES_QUEUED_MAX`] are.
    pub fn start(&mut self, target: ReplicaId) -> PushStart {
        if self.running.contains(&target) {
            PushStart::Running
        } else if self.running.len() >= PUSHES_QUEUED_MAX {
            PushStart::Full
        } else {
            self.running.insert(target);
            PushStart::Started
        }
    }

    /// The push of `target` ended (sent, failed or given up): a later task may push it again.
    pub fn done(&mut self, target: ReplicaId) {
        self.running.remove(&target);
    }

    /// Pushes under way.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    /// Whether no push is under way.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_pushes_once_at_a_time_and_the_set_is_bounded() {
        let mut pushes = PushSet::default();
        assert_eq!(pushes.start(ReplicaId(1)), PushStart::Started);
        assert_eq!(pushes.start(ReplicaId(1)), PushStart::Running);
        pushes.done(ReplicaId(1));
        assert_eq!(pushes.start(ReplicaId(1)), PushStart::Started);
        for target in 2..=PUSHES_QUEUED_MAX as u64 {
            assert_eq!(pushes.start(ReplicaId(target)), PushStart::Started);
        }
        assert_eq!(pushes.len(), PUSHES_QUEUED_MAX);
        assert_eq!(pushes.start(ReplicaId(0)), PushStart::Full);
        // A running target is still told apart from a full set.
        assert_eq!(pushes.start(ReplicaId(1)), PushStart::Running);
        pushes.done(ReplicaId(2));
        assert_eq!(pushes.start(ReplicaId(0)), PushStart::Started);
        // Ending a push that is not under way changes nothing.
        pushes.done(ReplicaId(999));
        assert_eq!(pushes.len(), PUSHES_QUEUED_MAX);
    }
}
