//! The `NodeActor`: keeps the node's session with the directory alive and carries out the
//! directory's tasks. Heartbeats (which also acknowledge finished operations) run on their
//! own timer so that slow task work never delays them; reclaim tasks free the pages, then
//! acknowledge. A node whose session was fenced stops: its pool's state is void, and a
//! restart opens a new epoch.

use super::link::{DirectoryLink, LinkError};
use super::pool::{AddExtent, Free, PoolActor, TakeEmptyExtent};
use crate::backends::PoolError;
use crate::directory::{DirectoryError, TaskKind};
use crate::model::PoolId;
use crate::wire::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Tasks fetched per round.
pub const TASKS_PER_POLL: u32 = 256;

/// Why the node stopped on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeExit {
    /// The directory fenced this node's session (it was silent too long, or another
    /// process opened the same node name).
    Fenced,
}

/// The node's liveness and task loops. See the module documentation.
pub struct NodeActor {
    link: Arc<DirectoryLink>,
    pools: HashMap<PoolId, Addr<PoolActor>>,
    task_interval: Duration,
    exit: tokio::sync::mpsc::Sender<NodeExit>,
    heartbeat_running: bool,
    tasks_running: bool,
}

impl NodeActor {
    /// An actor that heartbeats at the directory's requested interval, polls tasks every
    /// `task_interval`, and reports a fatal exit on `exit`.
    pub fn new(
        link: Arc<DirectoryLink>,
        pools: HashMap<PoolId, Addr<PoolActor>>,
        task_interval: Duration,
        exit: tokio::sync::mpsc::Sender<NodeExit>,
    ) -> NodeActor {
        NodeActor {
            link,
            pools,
            task_interval,
            exit,
            heartbeat_running: false,
            tasks_running: false,
        }
    }
}

impl Actor for NodeActor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        context.run_interval(self.link.heartbeat_interval, |actor, context| {
            if std::mem::replace(&mut actor.heartbeat_running, true) {
                return;
            }
            let (link, exit) = (actor.link.clone(), actor.exit.clone());
            async move { heartbeat(&link, &exit).await }
                .into_actor(actor)
                .map(|(), actor, _| actor.heartbeat_running = false)
                .spawn(context);
        });
        context.run_interval(self.task_interval, |actor, context| {
            if std::mem::replace(&mut actor.tasks_running, true) {
                return;
            }
            let (link, pools) = (actor.link.clone(), actor.pools.clone());
            async move { run_tasks(&link, &pools).await }
                .into_actor(actor)
                .map(|(), actor, _| actor.tasks_running = false)
                .spawn(context);
        });
    }
}

/// One heartbeat; a fenced session ends the node.
async fn heartbeat(link: &DirectoryLink, exit: &tokio::sync::mpsc::Sender<NodeExit>) {
    let request = DirectoryRequest::Heartbeat {
        acknowledged_through: link.acknowledged_through(),
    };
    match link.call(request).await {
        Ok(_) => {}
        Err(LinkError::Refused(ProtocolError::Directory(
            DirectoryError::Fenced { .. } | DirectoryError::UnknownSession,
        ))) => {
            let _ = exit.try_send(NodeExit::Fenced);
        }
        Err(error) => tracing::warn!(%error, "directory heartbeat failed"),
    }
}

/// Fetches and runs reclaim tasks. Freeing is idempotent: an allocation already freed (a
/// task handed out again after a lost acknowledgement) is acknowledged too.
async fn run_tasks(link: &DirectoryLink, pools: &HashMap<PoolId, Addr<PoolActor>>) {
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
        let freed = pool
            .send(Free {
                allocation: location.allocation,
                generation: location.generation,
            })
            .await;
        match freed {
            Ok(
                Ok(_)
                | Err(PoolError::StaleGeneration { .. } | PoolError::UnknownAllocation { .. }),
            ) => {
                if let Err(error) = link.call(DirectoryRequest::ReclaimAck { replica }).await {
                    tracing::warn!(%error, ?replica, "reclaim acknowledgement failed; the task comes back");
                }
            }
            other => tracing::error!(?other, ?location, "reclaim could not free the allocation"),
        }
    }
    give_back_empty_extents(link, pools).await;
}

/// Returns every extent of a shared pool that holds no allocation any more, so other nodes
/// can write there; an extent the directory refuses stays in use here.
async fn give_back_empty_extents(link: &DirectoryLink, pools: &HashMap<PoolId, Addr<PoolActor>>) {
    for (pool, actor) in pools {
        while let Ok(Some((offset_bytes, length_bytes))) = actor.send(TakeEmptyExtent).await {
            let returned = link
                .call(DirectoryRequest::ReturnExtent {
                    pool: *pool,
                    offset_bytes,
                })
                .await;
            if !matches!(returned, Ok(DirectoryReply::ExtentReturned(true))) {
                let _ = actor
                    .send(AddExtent {
                        offset_bytes,
                        length_bytes,
                    })
                    .await;
                break;
            }
        }
    }
}
