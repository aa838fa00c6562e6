//! The `PoolActor`: one per pool. It owns the pool backend and is the only place pages are
//! allocated and freed; engines copy bytes through their own mappings.

use crate::backends::{Allocation, PoolBackend, PoolError};
use crate::model::extent_owner::{take_extent, Ownership, TakeFrom};
use crate::model::{AllocationId, Generation, NodeId, OwnerWord};
use actix::prelude::*;
use std::sync::Arc;

/// Allocation requests queued for one pool.
pub const MAILBOX_CAPACITY: usize = 4096;

/// Allocates `length_bytes` of contiguous pages.
pub struct Allocate {
    pub length_bytes: u64,
}

impl Message for Allocate {
    type Result = Result<Allocation, PoolError>;
}

/// Frees an allocation; its generation moves on, so old locations are refused.
pub struct Free {
    pub allocation: AllocationId,
    pub generation: Generation,
}

impl Message for Free {
    type Result = Result<u64, PoolError>;
}

/// Lets this node allocate inside a granted extent of a shared pool.
pub struct AddExtent {
    pub offset_bytes: u64,
    pub length_bytes: u64,
}

impl Message for AddExtent {
    type Result = Result<(), PoolError>;
}

impl Handler<AddExtent> for PoolActor {
    type Result = Result<(), PoolError>;

    fn handle(&mut self, message: AddExtent, _: &mut Context<Self>) -> Self::Result {
        self.backend
            .add_extent(message.offset_bytes, message.length_bytes)
    }
}

/// Lets this node allocate inside a newly granted extent and allocates `allocation_bytes`
/// there in the same turn, so the node's round of giving back empty extents can never
/// take the new extent between the two (a store waiting for a grant gets it).
pub struct AllocateInNewExtent {
    pub offset_bytes: u64,
    pub length_bytes: u64,
    pub allocation_bytes: u64,
}

impl Message for AllocateInNewExtent {
    /// `Err` from adding the extent (it is not in use) or from allocating in it (it is).
    type Result = Result<Allocation, (PoolError, bool)>;
}

impl Handler<AllocateInNewExtent> for PoolActor {
    type Result = Result<Allocation, (PoolError, bool)>;

    fn handle(&mut self, message: AllocateInNewExtent, _: &mut Context<Self>) -> Self::Result {
        self.backend
            .add_extent(message.offset_bytes, message.length_bytes)
            .map_err(|error| (error, false))?;
        self.backend
            .allocate(message.allocation_bytes)
            .map_err(|error| (error, true))
    }
}

/// Takes an empty extent out of use (to give it back to the directory): its offset,
/// length and owner word (`None` past the pool's owner table).
pub struct TakeEmptyExtent;

impl Message for TakeEmptyExtent {
    type Result = Option<(u64, u64, Option<OwnerWord>)>;
}

impl Handler<TakeEmptyExtent> for PoolActor {
    type Result = Option<(u64, u64, Option<OwnerWord>)>;

    fn handle(&mut self, _: TakeEmptyExtent, _: &mut Context<Self>) -> Self::Result {
        let (offset_bytes, length_bytes) = self.backend.take_empty_extent()?;
        let word = self
            .backend
            .owner_table()
            .and_then(|table| table.owner_word(offset_bytes / length_bytes.max(1)));
        Some((offset_bytes, length_bytes, word))
    }
}

/// The extents this node holds in the pool (none in a host pool).
pub struct HeldExtents;

impl Message for HeldExtents {
    type Result = Vec<(u64, u64)>;
}

impl Handler<HeldExtents> for PoolActor {
    type Result = Vec<(u64, u64)>;

    fn handle(&mut self, _: HeldExtents, _: &mut Context<Self>) -> Self::Result {
        self.backend.held_extents()
    }
}

/// Takes an extent out of use with everything allocated in it (lost in a rejoin).
pub struct DropExtent {
    pub offset_bytes: u64,
}

impl Message for DropExtent {
    type Result = bool;
}

impl Handler<DropExtent> for PoolActor {
    type Result = bool;

    fn handle(&mut self, message: DropExtent, _: &mut Context<Self>) -> Self::Result {
        self.backend.drop_extent(message.offset_bytes)
    }
}

/// Takes an extent of a shared pool for this node in the pool's owner words
/// (`model::extent_owner`): after a grant, or when claiming it back in a rejoin.
pub struct TakeExtent {
    pub offset_bytes: u64,
    pub length_bytes: u64,
    pub node: NodeId,
    pub from: TakeFrom,
}

impl Message for TakeExtent {
    type Result = Ownership;
}

impl Handler<TakeExtent> for PoolActor {
    type Result = MessageResult<TakeExtent>;

    fn handle(&mut self, message: TakeExtent, _: &mut Context<Self>) -> Self::Result {
        let Some(table) = self.backend.owner_table() else {
            return MessageResult(Ownership::Untracked);
        };
        let index = message.offset_bytes / message.length_bytes.max(1);
        MessageResult(take_extent(table, index, message.node, message.from))
    }
}

/// Copies `buffer.len()` bytes out of the pool into `buffer` and hands it back (the node's
/// own transfers, e.g. a demotion, one bounded chunk per message so no copy holds the
/// actor long).
pub struct ReadAt {
    pub offset_bytes: u64,
    pub buffer: Vec<u8>,
}

impl Message for ReadAt {
    type Result = Result<Vec<u8>, PoolError>;
}

impl Handler<ReadAt> for PoolActor {
    type Result = Result<Vec<u8>, PoolError>;

    fn handle(&mut self, mut message: ReadAt, _: &mut Context<Self>) -> Self::Result {
        self.backend
            .read_at(message.offset_bytes, &mut message.buffer)?;
        Ok(message.buffer)
    }
}

/// Copies `bytes` into an allocation this node holds and no reader sees yet, and hands the
/// buffer back for the next chunk.
pub struct WriteAt {
    pub offset_bytes: u64,
    pub bytes: Vec<u8>,
}

impl Message for WriteAt {
    type Result = Result<Vec<u8>, PoolError>;
}

impl Handler<WriteAt> for PoolActor {
    type Result = Result<Vec<u8>, PoolError>;

    fn handle(&mut self, message: WriteAt, _: &mut Context<Self>) -> Self::Result {
        self.backend
            .write_at(message.offset_bytes, &message.bytes)?;
        Ok(message.bytes)
    }
}

/// Whether a location still names a live allocation of its generation.
pub struct Check {
    pub location: crate::model::Location,
}

impl Message for Check {
    type Result = Result<(), PoolError>;
}

impl Handler<Check> for PoolActor {
    type Result = Result<(), PoolError>;

    fn handle(&mut self, message: Check, _: &mut Context<Self>) -> Self::Result {
        let location = message.location;
        self.backend.check(
            location.allocation,
            location.generation,
            location.offset_bytes,
            location.length_bytes,
        )
    }
}

/// The pool's allocator usage.
pub struct Usage;

impl Message for Usage {
    type Result = crate::backends::AllocatorUsage;
}

impl Handler<Usage> for PoolActor {
    type Result = MessageResult<Usage>;

    fn handle(&mut self, _: Usage, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.backend.usage())
    }
}

/// The pool's bytes, for the node's own copies between two pools it maps (a demotion or
/// a replication) and between a pool and its SSD store (a spill or a restore): one copy
/// from one side into the other, with no buffer between.
/// The backend's byte methods are safe from any thread; allocation stays with the actor.
pub struct Bytes;

impl Message for Bytes {
    type Result = Arc<dyn PoolBackend>;
}

impl Handler<Bytes> for PoolActor {
    type Result = MessageResult<Bytes>;

    fn handle(&mut self, _: Bytes, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.backend.clone())
    }
}

/// One pool. See the module documentation.
pub struct PoolActor {
    backend: Arc<dyn PoolBackend>,
}

impl PoolActor {
    /// An actor owning `backend`.
    pub fn new(backend: Box<dyn PoolBackend>) -> PoolActor {
        PoolActor {
            backend: Arc::from(backend),
        }
    }
}

impl Actor for PoolActor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        context.set_mailbox_capacity(MAILBOX_CAPACITY);
    }
}

impl Handler<Allocate> for PoolActor {
    type Result = Result<Allocation, PoolError>;

    fn handle(&mut self, message: Allocate, _: &mut Context<Self>) -> Self::Result {
        self.backend.allocate(message.length_bytes)
    }
}

impl Handler<Free> for PoolActor {
    type Result = Result<u64, PoolError>;

    fn handle(&mut self, message: Free, _: &mut Context<Self>) -> Self::Result {
        self.backend.free(message.allocation, message.generation)
    }
}
