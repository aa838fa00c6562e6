//! The `NodeActor`: keeps the node's session with the directory alive (heartbeats that
//! also acknowledge finished operations), reconnects after a connection loss, and carries
//! out the directory's tasks (reclaim: free the pages, then acknowledge). A node whose
//! session was fenced stops: its pool's state is void, and a restart opens a new epoch.

use super::link::{DirectoryLink, LinkError};
use super::pool::{Free, PoolActor};
use crate::directory::{DirectoryError, TaskKind};
use crate::model::PoolId;
use crate::wire::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Tasks fetched per heartbeat.
pub const TASKS_PER_POLL: u32 = 256;

/// Why the node stopped on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeExit {
    /// The directory fenced this node's session (it was silent too long, or another
    /// process opened the same node name).
    Fenced,
}

/// The node's liveness and task loop. See the module documentation.
pub struct NodeActor {
    link: Arc<DirectoryLink>,
    pools: HashMap<PoolId, Addr<PoolActor>>,
    heartbeat_interval: Duration,
    exit: tokio::sync::mpsc::Sender<NodeExit>,
    busy: bool,
}

impl NodeActor {
    /// An actor that heartbeats every `heartbeat_interval` and reports a fatal exit on `exit`.
    pub fn new(
        link: Arc<DirectoryLink>,
        pools: HashMap<PoolId, Addr<PoolActor>>,
        heartbeat_interval: Duration,
        exit: tokio::sync::mpsc::Sender<NodeExit>,
    ) -> NodeActor {
        NodeActor {
            link,
            pools,
            heartbeat_interval,
            exit,
            busy: false,
        }
    }
}

impl Actor for NodeActor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        context.run_interval(self.heartbeat_interval, |actor, context| {
            if actor.busy {
                return;
            }
            actor.busy = true;
            let (link, pools, exit) = (actor.link.clone(), actor.pools.clone(), actor.exit.clone());
            async move { beat(&link, &pools, &exit).await }
                .into_actor(actor)
                .map(|(), actor, _| actor.busy = false)
                .spawn(context);
        });
    }
}

/// One heartbeat round: heartbeat, reconnect if the connection was lost, run tasks.
async fn beat(
    link: &DirectoryLink,
    pools: &HashMap<PoolId, Addr<PoolActor>>,
    exit: &tokio::sync::mpsc::Sender<NodeExit>,
) {
    let heartbeat = DirectoryRequest::Heartbeat {
        acknowledged_through: link.acknowledged_through(),
    };
    match link.call(heartbeat).await {
        Ok(_) => {}
        Err(LinkError::Refused(ProtocolError::Directory(
            DirectoryError::Fenced { .. } | DirectoryError::UnknownSession,
        ))) => {
            let _ = exit.try_send(NodeExit::Fenced);
            return;
        }
        Err(error) => {
            tracing::warn!(%error, "directory heartbeat failed; reconnecting");
            if let Err(error) = link.reconnect().await {
                tracing::warn!(%error, "reconnect failed");
                if matches!(error, LinkError::Refused(_)) {
                    let _ = exit.try_send(NodeExit::Fenced);
                }
            }
            return;
        }
    }
    let tasks = match link
        .call(DirectoryRequest::PollTasks {
            max: TASKS_PER_POLL,
        })
        .await
    {
        Ok(DirectoryReply::Tasks(tasks)) => tasks,
        _ => return,
    };
    for task in tasks {
        let TaskKind::Reclaim { replica, location } = task.kind;
        let Some(pool) = pools.get(&location.pool) else {
            tracing::error!(?location, "reclaim task for a pool this node does not own");
            continue;
        };
        match pool
            .send(Free {
                allocation: location.allocation,
                generation: location.generation,
            })
            .await
        {
            Ok(Ok(_)) => {
                if let Err(error) = link.call(DirectoryRequest::ReclaimAck { replica }).await {
                    tracing::warn!(%error, ?replica, "reclaim acknowledgement failed");
                }
            }
            other => tracing::error!(?other, ?location, "reclaim could not free the allocation"),
        }
    }
}
