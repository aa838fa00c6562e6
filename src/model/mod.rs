//! Identities, locations and records shared by every role.

pub mod ids;

pub use ids::{
    AllocationId, DomainId, Epoch, Generation, LeaseId, NodeId, OperationId, PoolId, ReplicaId,
    SessionId, TaskId,
};
