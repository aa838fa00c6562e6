//! Restores from the node's SSD under way, as books: each object is restored once at a
//! time, a load or prefetch of an object already being restored joins that restore, and at
//! most [`RESTORES_IN_FLIGHT_MAX`] restores are under way, at most
//! [`RESTORES_PER_LOAD_MAX`] claimed by one call. Sans-I/O: `W` is how a joiner waits for
//! the restore's end (a channel's receiving half in the node; a plain value in the tests).

use crate::backends::ssd::ReadOutcome;
use crate::model::ObjectId;
use std::collections::HashMap;

/// Objects restored by one load or prefetch at most: one prefix's chunks, issued together.
pub const RESTORES_PER_LOAD_MAX: usize = 64;
/// Restores in flight on a node at most (loads' and prefetches' together); past it a
/// prefetch starts nothing more and a load restores nothing more until some finish.
pub const RESTORES_IN_FLIGHT_MAX: usize = 1024;

/// What one call's claim found: the objects it restores itself, and the waiters of the
/// restores under way it joins.
#[derive(Debug)]
pub struct Claimed<W> {
    /// Claimed by this call: it restores them, then calls [`RestoreClaims::finish`].
    pub claimed: Vec<ObjectId>,
    /// Restores another call started, to wait for.
    pub joined: Vec<W>,
}

/// The restores under way, each with how a joiner waits for it.
#[derive(Debug)]
pub struct RestoreClaims<W> {
    restoring: HashMap<ObjectId, W>,
}

impl<W> Default for RestoreClaims<W> {
    fn default() -> Self {
        RestoreClaims {
            restoring: HashMap::new(),
        }
    }
}

impl<W: Clone> RestoreClaims<W> {
    /// Claims the first [`RESTORES_PER_LOAD_MAX`] of `objects` that the store `holds` and no
    /// restore is under way for, within [`RESTORES_IN_FLIGHT_MAX`], each with the waiter
    /// `waiter` makes for it; joins those under way. Objects past the bounds, or not held,
    /// are neither claimed nor joined.
    pub fn claim(
        &mut self,
        objects: &[ObjectId],
        holds: impl Fn(&ObjectId) -> bool,
        mut waiter: impl FnMut(ObjectId) -> W,
    ) -> Claimed<W> {
        let mut claimed = Vec::new();
        let mut joined = Vec::new();
        for object in objects.iter().take(RESTORES_PER_LOAD_MAX) {
            if let Some(under_way) = self.restoring.get(object) {
                joined.push(under_way.clone());
            } else if self.restoring.len() < RESTORES_IN_FLIGHT_MAX && holds(object) {
                self.restoring.insert(*object, waiter(*object));
                claimed.push(*object);
            }
        }
        Claimed { claimed, joined }
    }

    /// The restore of `object` ended (published or not): a later call may restore it again.
    pub fn finish(&mut self, object: &ObjectId) {
        self.restoring.remove(object);
    }

    /// Restores under way.
    pub fn len(&self) -> usize {
        self.restoring.len()
    }

    /// Whether no restore is under way.
    pub fn is_empty(&self) -> bool {
        self.restoring.is_empty()
    }
}

/// Whether a restore's read may be published: the store verified the object's checksum
/// (`outcome` is a [`ReadOutcome::Hit`]) and its target got every byte the directory
/// reserved (`whole`). A read's bytes reach the target before the checksum's verdict, so a
/// corrupt, failed or missing read is never published, whatever it wrote.
pub fn restore_verified(outcome: Option<&ReadOutcome>, whole: bool) -> bool {
    matches!(outcome, Some(ReadOutcome::Hit { .. })) && whole
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{NamespaceId, PrefixDigest};

    fn object(index: u32) -> ObjectId {
        ObjectId {
            namespace: NamespaceId([1; 16]),
            prefix: PrefixDigest::ROOT.chain(&[index]),
            shard: 0,
            part: 0,
        }
    }

    #[test]
    fn an_object_is_restored_once_and_later_calls_join_it() {
        let mut claims = RestoreClaims::default();
        let objects: Vec<ObjectId> = (0..3).map(object).collect();
        // The store holds the first two only.
        let holds = |candidate: &ObjectId| *candidate != object(2);
        let first = claims.claim(&objects, holds, |claimed| claimed);
        assert_eq!(first.claimed, objects[..2]);
        assert!(first.joined.is_empty());
        let second = claims.claim(&objects, holds, |claimed| claimed);
        assert!(second.claimed.is_empty());
        assert_eq!(second.joined, objects[..2]);
        claims.finish(&objects[0]);
        let third = claims.claim(&objects[..1], holds, |claimed| claimed);
        assert_eq!(third.claimed, objects[..1]);
        assert_eq!(claims.len(), 2);
    }

    #[test]
    fn claims_are_bounded_per_call_and_per_node() {
        let mut claims = RestoreClaims::default();
        let objects: Vec<ObjectId> = (0..RESTORES_IN_FLIGHT_MAX as u32 + 100)
            .map(object)
            .collect();
        let mut claimed = 0;
        for call in objects.chunks(RESTORES_PER_LOAD_MAX * 2) {
            let result = claims.claim(call, |_| true, |_| ());
            assert!(result.claimed.len() <= RESTORES_PER_LOAD_MAX);
            claimed += result.claimed.len();
        }
        assert_eq!(claims.len(), claimed);
        assert!(claims.len() <= RESTORES_IN_FLIGHT_MAX);
        // At the node's bound a new object is not claimed; one under way is still joined.
        while claims.len() < RESTORES_IN_FLIGHT_MAX {
            let fresh = object(1_000_000 + claims.len() as u32);
            claims.claim(&[fresh], |_| true, |_| ());
        }
        let over = claims.claim(&[object(2_000_000), objects[0]], |_| true, |_| ());
        assert!(over.claimed.is_empty());
        assert_eq!(over.joined.len(), 1);
    }
}
