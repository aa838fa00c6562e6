//! Identities, locations and records shared by every role.

pub mod demo;
mod digest_bytes;
pub mod extent_owner;
pub mod ids;
pub mod namespace;
pub mod object;
pub mod pool;
pub mod random;
pub mod time;

pub use demo::demo_namespace;
pub use extent_owner::{OwnerTable, OwnerWord};
pub use ids::{
    shard_stamp, AllocationId, DomainId, Epoch, Generation, LeaseId, NodeId, OperationId, PoolId,
    ReplicaId, SessionId, TaskId, TransferToken, ID_GENERATION_BITS, SHARDS_MAX, SHARD_SHIFT,
};
pub use namespace::{
    KvDtype, NamespaceDescriptor, NamespaceError, NamespaceId, NAMESPACE_TEXT_BYTES_MAX,
};
pub use object::{Location, ObjectId, PrefixDigest};
pub use pool::{Medium, PoolSpec, PoolTenancy, PoolUsage, SaltGroup, Scope, Tier};
pub use time::{Clock, Timestamp};
