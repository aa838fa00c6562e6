//! Replication over the network, the node's side: the two halves of a copy the directory
//! planned from a node's private CPU pool into another node's CPU pool
//! (`TaskKind::Push` on the source's owner, `TaskKind::Receive` on the requester).
//! This build has no node-to-node transport: a push is dropped and a receive aborts its
//! target, so the directory frees the reservation at once and counts the replication as
//! cancelled.

use super::services::NodeServices;
use crate::model::{Location, NodeId, PoolId, ReplicaId, SessionId};

/// The source's half: streams the replica at `source` to node `to` for `target`. Without a
/// peer transport it only logs; the requester's receive aborts the target.
pub async fn push(
    _services: &NodeServices,
    _session: SessionId,
    source: Location,
    target: ReplicaId,
    length_bytes: u64,
    to: NodeId,
) {
    tracing::info!(
        ?source,
        ?target,
        length_bytes,
        ?to,
        "no peer transport: replication push dropped"
    );
}

/// The requester's half: receives `target` from node `from` into `target_pool`. Without
/// a peer transport it aborts the target, so its reservation is freed at once.
pub async fn receive(
    services: &NodeServices,
    session: SessionId,
    target: ReplicaId,
    target_pool: PoolId,
    length_bytes: u64,
    from: NodeId,
) {
    tracing::info!(
        ?target,
        ?target_pool,
        length_bytes,
        ?from,
        "no peer transport: replication receive aborted"
    );
    services.link.abort(session, target).await;
}
