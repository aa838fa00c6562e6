//! Typed identifiers. Each is a plain integer newtype so that a pool id can never be
//! passed where a replica id is expected; none of them carries meaning beyond identity.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(formatter, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A node (one per host), assigned by the directory on the node's first `open` and
    /// stable for its name for the directory's lifetime.
    NodeId(u32)
);
id_type!(
    /// A pool (CPU DRAM of one node, a shared CXL pool, an SSD store), assigned at registration.
    PoolId(u32)
);
id_type!(
    /// A sharing domain: the set of nodes that map the same CXL memory.
    DomainId(u32)
);
id_type!(
    /// A replica record in the directory. Encodes a slot and the slot's reuse count, so an
    /// id kept after its replica was freed never names the slot's next occupant.
    ReplicaId(u64)
);
id_type!(
    /// A session: one node's connection to the directory under one epoch. The top 16
    /// bits are the incarnation of the directory that opened it, so a session id kept
    /// across a directory restart never names a session of the new incarnation.
    SessionId(u64)
);

/// Bits of a [`SessionId`] below its directory incarnation.
const SESSION_COUNTER_BITS: u32 = 48;

impl SessionId {
    /// The `counter`-th session opened by directory incarnation `incarnation`.
    pub fn new(incarnation: u16, counter: u64) -> SessionId {
        SessionId(
            u64::from(incarnation) << SESSION_COUNTER_BITS
                | counter & ((1 << SESSION_COUNTER_BITS) - 1),
        )
    }

    /// The incarnation of the directory that opened this session.
    pub fn incarnation(self) -> u16 {
        (self.0 >> SESSION_COUNTER_BITS) as u16
    }
}
id_type!(
    /// A read lease on one replica, held by one session until released or expired.
    LeaseId(u64)
);
id_type!(
    /// A task (reclaim, replicate, demote) queued by the directory for a node.
    TaskId(u64)
);
/// The secret a network copy's stream presents, beside its target replica: the directory
/// derives it from a key of its own incarnation (random in service) and hands it only to
/// the copy's two nodes, so no other certificate holder can claim a transfer by guessing
/// replica ids. Its `Debug` form does not print it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TransferToken(pub u64);

impl fmt::Debug for TransferToken {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("TransferToken(..)")
    }
}

id_type!(
    /// A node's incarnation counter. A new `open` by the same node gets a larger epoch,
    /// which fences every request of the previous one.
    Epoch(u64)
);
id_type!(
    /// An allocation inside a pool, assigned by the pool's allocator.
    AllocationId(u64)
);
id_type!(
    /// How many times an allocation slot was handed out. A location that carries an
    /// older generation than the allocator's current one names storage that was reused.
    Generation(u64)
);
id_type!(
    /// A session-scoped operation sequence number, chosen by the node. The directory
    /// answers a repeated operation id with the first outcome, so retries are idempotent.
    OperationId(u64)
);

/// Directory shards at most: a shard's index fits the 8 bits of the ids it issues.
pub const SHARDS_MAX: usize = 256;
/// Where a replica, lease or task id names the directory shard that issued it: bits 55–62
/// (bit 63 of a lease id marks a node's own local lease, [`crate::node::delegations`]).
pub const SHARD_SHIFT: u32 = 55;
/// Bits of a replica's or lease's slot generation (bits 32–54 of its id).
pub const ID_GENERATION_BITS: u32 = SHARD_SHIFT - 32;
/// The bits of an id that name its shard.
pub const SHARD_MASK: u64 = 0xff << SHARD_SHIFT;

/// The bits shard `shard` sets in every id it issues (0 for the first shard, so a
/// directory of one shard issues the ids it always did).
pub fn shard_stamp(shard: usize) -> u64 {
    debug_assert!(shard < SHARDS_MAX);
    ((shard as u64) & 0xff) << SHARD_SHIFT
}

macro_rules! sharded_id {
    ($($name:ident),*) => {$(
        impl $name {
            /// The index of the directory shard that issued this id.
            pub fn shard(self) -> usize {
                ((self.0 & SHARD_MASK) >> SHARD_SHIFT) as usize
            }
        }
    )*};
}

sharded_id!(ReplicaId, LeaseId, TaskId);
