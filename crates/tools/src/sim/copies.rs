//! Copies on a simulated node take simulated time, as the node's copy engine and its SSD
//! reads do: a demotion or replication into a memory pool allocates its target when its
//! task arrives, reads the source when the copy ends (1 to [`COPY_MS_MAX`] ms later), then
//! checks the source is still live at its generation in the node's real allocator (as
//! `actors::node::actor::copy_pages` does) before it writes and commits; a restore reads
//! the SSD when its read ends, so a region reclaimed meanwhile turns it into a miss. A
//! copy whose process died meanwhile dies with it (its pages with the process, its target's
//! reservation expiring at the directory).

use super::node::Purpose;
use super::world::{Space, World};
use kvtier_core::model::{Location, ObjectId, ReplicaId, Timestamp};
use kvtier_core::protocol::messages::DirectoryRequest;
use std::time::Duration;

/// The longest a copy takes.
pub const COPY_MS_MAX: u64 = 30;
/// Copies under way in the whole cluster at most (the node's copy queue is bounded too): a
/// task that finds it full aborts its target.
const COPIES_IN_FLIGHT_MAX: usize = 256;

/// A copy under way on node `node`'s process `incarnation`, ending at `due`.
#[derive(Clone, Debug)]
pub struct LocalCopy {
    node: usize,
    incarnation: u64,
    due: Timestamp,
    kind: CopyKind,
}

/// What a copy writes.
#[derive(Clone, Debug)]
enum CopyKind {
    /// A demotion or replication: the replica at `source` into `location` (the target's
    /// pages), for the reserved `target`.
    Pool {
        source: Location,
        target: ReplicaId,
        location: Location,
        space: Space,
    },
    /// A restore: `object` read from the node's SSD into `location`, for `replica`.
    Restore {
        object: ObjectId,
        replica: ReplicaId,
        location: Location,
        space: Space,
    },
}

impl World {
    fn schedule(&mut self, node: usize, kind: CopyKind) -> bool {
        if self.copies.len() >= COPIES_IN_FLIGHT_MAX {
            return false;
        }
        let took = Duration::from_millis(1 + self.rng.below(COPY_MS_MAX));
        self.copies.push(LocalCopy {
            node,
            incarnation: self.nodes[node].incarnation,
            due: self.now + took,
            kind,
        });
        true
    }

    /// A demotion or replication into a memory pool starts: its target is allocated now.
    pub(super) fn start_pool_copy(
        &mut self,
        node: usize,
        source: Location,
        target: ReplicaId,
        target_pool: kvtier_core::model::PoolId,
    ) {
        let abort = DirectoryRequest::Abort { replica: target };
        let Some((location, space)) = self.allocate(node, target_pool) else {
            return self.send(node, abort, Purpose::Plain);
        };
        let copy = CopyKind::Pool {
            source,
            target,
            location,
            space,
        };
        if !self.schedule(node, copy) {
            self.free(node, location).ok();
            self.send(node, abort, Purpose::Plain);
        }
    }

    /// A restore's read starts into its reserved pages.
    pub(super) fn start_restore_read(
        &mut self,
        node: usize,
        object: ObjectId,
        replica: ReplicaId,
        location: Location,
        space: Space,
    ) {
        let copy = CopyKind::Restore {
            object,
            replica,
            location,
            space,
        };
        if !self.schedule(node, copy) {
            self.free(node, location).ok();
            self.send(node, DirectoryRequest::Abort { replica }, Purpose::Plain);
        }
    }

    /// Ends the copies due now, in the order they end.
    pub(super) fn run_copies(&mut self) {
        let now = self.now;
        let (mut due, later): (Vec<LocalCopy>, Vec<LocalCopy>) = std::mem::take(&mut self.copies)
            .into_iter()
            .partition(|copy| copy.due <= now);
        self.copies = later;
        due.sort_by_key(|copy| copy.due);
        for copy in due {
            if self.nodes[copy.node].incarnation != copy.incarnation {
                continue;
            }
            self.stats.covered.timed_copies += 1;
            match copy.kind {
                CopyKind::Pool {
                    source,
                    target,
                    location,
                    space,
                } => self.end_pool_copy(copy.node, source, target, location, space),
                CopyKind::Restore {
                    object,
                    replica,
                    location,
                    space,
                } => self.end_restore_read(copy.node, object, replica, location, space),
            }
        }
    }

    /// The copy read the source's pages; it is written and committed when the source is
    /// still live at its generation (no byte came from pages reused meanwhile).
    fn end_pool_copy(
        &mut self,
        node: usize,
        source: Location,
        target: ReplicaId,
        location: Location,
        space: Space,
    ) {
        let read = self
            .spaces
            .get(&source.pool)
            .and_then(|space| self.memory.get(&(*space, source.offset_bytes)))
            .copied();
        let Some(object) = read.filter(|_| self.source_live(node, &source)) else {
            self.stats.covered.copies_of_reused_sources += u64::from(read.is_some());
            self.free(node, location).ok();
            return self.send(
                node,
                DirectoryRequest::Abort { replica: target },
                Purpose::Plain,
            );
        };
        self.write(space, location.offset_bytes, object);
        self.commit_copy(node, object, target, location);
    }

    /// Commits a written copy of `object` at `location` for `target`.
    pub(super) fn commit_copy(
        &mut self,
        node: usize,
        object: ObjectId,
        target: ReplicaId,
        location: Location,
    ) {
        let Some(operation) = self.operation(node) else {
            self.free(node, location).ok();
            return self.send(
                node,
                DirectoryRequest::Abort { replica: target },
                Purpose::Plain,
            );
        };
        self.send_commit(node, operation, object, target, location, None);
    }

    /// Sends the commit of `replica`, written at `location` with `object`'s bytes, under
    /// `operation`; its answer is handled as any commit's (`World::committed`).
    pub(super) fn send_commit(
        &mut self,
        node: usize,
        operation: kvtier_core::model::OperationId,
        object: ObjectId,
        replica: ReplicaId,
        location: Location,
        owned_mark: Option<u64>,
    ) {
        let request = DirectoryRequest::Commit {
            operation,
            replica,
            location,
        };
        let purpose = Purpose::Commit {
            object,
            replica,
            location,
            owned_mark,
        };
        self.send(node, request, purpose);
    }

    /// Whether `source` is a live allocation of node `node` at its generation, by the
    /// node's own allocator (the pool's `Check`).
    fn source_live(&mut self, node: usize, source: &Location) -> bool {
        let state = &mut self.nodes[node];
        let (id, generation) = (source.allocation, source.generation);
        let (offset, length) = (source.offset_bytes, source.length_bytes);
        match self.spaces.get(&source.pool) {
            Some(Space::Cpu { partition, .. }) => {
                state.cpu.get(*partition).is_some_and(|(pool, pages)| {
                    *pool == source.pool && pages.check(id, generation, offset, length).is_ok()
                })
            }
            Some(Space::Cxl(domain)) => state
                .cxl
                .get_mut(domain)
                .is_some_and(|extents| extents.check(id, generation, offset, length).is_ok()),
            Some(Space::Ssd { .. }) | None => false,
        }
    }
}
