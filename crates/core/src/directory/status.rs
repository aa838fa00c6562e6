//! The cluster as the directory sees it, for `kvtier ctl status`: each node's epoch, its
//! session's state and its drain. Pools are reported by `usage`.

use super::drain::DrainProgress;
use super::Directory;
use crate::model::{Epoch, NodeId, SessionId};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// One node, as the directory sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub name: String,
    pub node: NodeId,
    /// Its latest epoch (0 before its first session).
    pub epoch: Epoch,
    /// Its latest session, while the directory remembers it.
    pub session: Option<SessionId>,
    /// `live`, `suspect`, `draining`, `fenced`, `closed`, `drained`, or `none` when the
    /// directory no longer remembers a session.
    pub state: String,
    /// Its drain, once one was started.
    pub drain: Option<DrainProgress>,
    /// Where the other nodes reach its peer endpoint (`None`: it serves none, or no
    /// configuration declared it).
    pub peer_address: Option<SocketAddr>,
}

impl Directory {
    /// Every node the directory has seen, by id (bounded by `nodes_max`).
    pub fn node_statuses(&self) -> Vec<NodeStatus> {
        let mut statuses: Vec<NodeStatus> = self
            .node_ids
            .iter()
            .map(|(name, &node)| {
                let record = &self.nodes[node.0 as usize];
                let drain = self.drain_progress(node);
                let session = record
                    .session
                    .or_else(|| self.drains.get(&node).map(|drain| drain.session));
                let state = match session.and_then(|session| self.session_state(session)) {
                    None => "none",
                    Some(_) if session.is_some_and(|session| self.is_draining(session)) => {
                        "draining"
                    }
                    Some(state) => state.name(),
                };
                NodeStatus {
                    name: name.clone(),
                    node,
                    epoch: record.epoch,
                    session,
                    state: state.to_owned(),
                    drain,
                    peer_address: record.peer_address,
                }
            })
            .collect();
        statuses.sort_by_key(|status| status.node);
        statuses
    }
}
