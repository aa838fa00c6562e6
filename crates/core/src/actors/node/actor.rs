//! The `NodeActor`: keeps the node's session with the directory alive and carries out the
//! directory's tasks, which it waits for at the directory (`AwaitTasks`, answered as soon
//! as there is one; a wait that ends empty is armed again at the next task interval).
//! Heartbeats (which also acknowledge finished operations) run on their own timer so that
//! slow task work never delays them. Reclaim tasks free the pages, then acknowledge;
//! demote tasks copy a replica one tier colder (or spill it to the node's SSD,
//! [`super::ssd`]) and commit the copy. A node whose session is lost (a directory restart,
//! a fence, the fence window without an answer) rejoins with its cache
//! ([`super::rejoin`]); it stops only when that fails.

use super::copy_engine::CopyRequest;
use super::link::{LinkError, DIRECTORY_REQUEST_TIMEOUT};
use super::pool::{Bytes, Check, Free, PoolActor, TakeEmptyExtent, Usage};
use super::rejoin::{rejoin, Registration};
use super::replication;
use super::services::NodeServices;
use crate::directory::{CommitOutcome, DirectoryError, Task, TaskKind};
use crate::metrics::{Direction, PoolByteState};
use crate::model::{Location, PoolId, ReplicaId, SessionId};
use crate::node::{after_commit, reclaim_done, CommitResult, ExtentAction, PagesAfterCommit};
use crate::protocol::messages::{
    DirectoryReply, DirectoryRequest, ProtocolError, AWAIT_TASKS_WAIT_MS_MAX,
};
use actix::prelude::*;
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// Tasks fetched per `AwaitTasks`: after a full batch the node asks again at once, so it
/// keeps up with a burst (eviction under a burst of stores) batch after batch.
pub const TASKS_PER_POLL: u32 = 256;
/// How long one `AwaitTasks` waits at the directory: as long as the directory allows,
/// which is below the link's request timeout (a wait is never taken for a lost reply).
const TASK_WAIT_MS: u32 = AWAIT_TASKS_WAIT_MS_MAX;
const _: () = assert!((TASK_WAIT_MS as u128) < DIRECTORY_REQUEST_TIMEOUT.as_millis());
/// Tasks of one batch run at once: each waits on a round trip to the directory (an
/// acknowledgement, a commit), so running them one after another would make reclaim lag
/// behind eviction under load. Within the link's bound of requests in flight.
pub const TASKS_IN_FLIGHT_MAX: usize = 32;

/// Why the node stopped on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeExit {
    /// The node could not rejoin with its cache (see [`RejoinError`]).
    RejoinFailed(String),
    /// The directory drained this node and ended its session: exit cleanly, do not rejoin.
    Drained,
}

/// The node's liveness and task loops. See the module documentation.
pub struct NodeActor {
    services: NodeServices,
    registration: Arc<Registration>,
    task_interval: Duration,
    exit: tokio::sync::mpsc::Sender<NodeExit>,
    heartbeat_running: bool,
    /// The periodic clean-up ([`tidy`]) is under way.
    tidying: bool,
    /// A rejoin is under way: heartbeats that fail meanwhile start no other.
    rejoining: bool,
    /// An `AwaitTasks` is at the directory (or its tasks are running): one at a time.
    awaiting_tasks: bool,
}

impl NodeActor {
    /// An actor that heartbeats at the directory's requested interval, waits for tasks at
    /// the directory (armed again every `task_interval` when no wait is there), cleans up
    /// every `task_interval`, rejoins with `registration` when the session is lost, and reports
    /// a fatal exit on `exit`.
    pub fn new(
        services: NodeServices,
        registration: Registration,
        task_interval: Duration,
        exit: tokio::sync::mpsc::Sender<NodeExit>,
    ) -> NodeActor {
        NodeActor {
            services,
            registration: Arc::new(registration),
            task_interval,
            exit,
            heartbeat_running: false,
            tidying: false,
            rejoining: false,
            awaiting_tasks: false,
        }
    }

    /// Waits at the directory for tasks (`AwaitTasks`: answered the moment the directory
    /// plans work for this node, or at once when some are pending) and runs what it hands
    /// out, then waits again at once. A wait that ends empty or fails is armed again at the
    /// next task interval, which is the fallback poll; so every immediate re-arm follows
    /// work done, and none spins. The only way tasks are fetched: a second fetcher beside
    /// it would take the tasks it was woken for and leave it empty-handed until the next
    /// interval.
    fn await_tasks(&mut self, context: &mut Context<Self>) {
        if !self.services.link.is_serving() || std::mem::replace(&mut self.awaiting_tasks, true) {
            return;
        }
        let services = self.services.clone();
        async move {
            let session = services.link.session();
            let asked = TasksAsked {
                at: services.clock.now(),
                mark: services.core().delegations.session_mark(),
            };
            let wait = DirectoryRequest::AwaitTasks {
                max: TASKS_PER_POLL,
                wait_ms: TASK_WAIT_MS,
            };
            match services.link.call_in(session, wait).await {
                Ok(DirectoryReply::Tasks(tasks)) if !tasks.is_empty() => {
                    run_batch(&services, session, asked, tasks).await;
                    true
                }
                _ => false,
            }
        }
        .into_actor(self)
        .map(|worked, actor, context| {
            actor.awaiting_tasks = false;
            if worked {
                actor.await_tasks(context);
            }
        })
        .spawn(context);
    }

    /// Starts a rejoin unless one is under way; a failed one ends the node.
    fn start_rejoin(&mut self, context: &mut Context<Self>) {
        if std::mem::replace(&mut self.rejoining, true) {
            return;
        }
        let (services, registration) = (self.services.clone(), self.registration.clone());
        let exit = self.exit.clone();
        async move {
            if let Err(error) = rejoin(&services, &registration).await {
                tracing::error!(%error, "rejoining the directory failed; stopping");
                let _ = exit.try_send(NodeExit::RejoinFailed(error.to_string()));
            }
        }
        .into_actor(self)
        .map(|(), actor, _| actor.rejoining = false)
        .spawn(context);
    }
}

impl Actor for NodeActor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        let interval = self.services.link.binding().heartbeat_interval;
        context.run_interval(interval, |actor, context| actor.beat(context));
        // Out of reach, the node asks sooner: a restarted or newly elected directory is
        // found within this, not a whole heartbeat period later.
        context.run_interval(OUT_OF_REACH_HEARTBEAT.min(interval), |actor, context| {
            if !actor.services.link.is_reachable() {
                actor.beat(context);
            }
        });
        context.run_interval(self.task_interval, |actor, context| {
            let link = &actor.services.link;
            actor
                .services
                .link_metrics
                .publish(link.is_reachable() && link.is_serving(), link.outages());
            actor.await_tasks(context);
            // Many small stores since the last acknowledgement: acknowledge now, before the
            // directory's ledger of this session fills.
            if actor.services.core().operations.acknowledgement_due() {
                actor.beat(context);
            }
            if !actor.services.link.is_serving() || std::mem::replace(&mut actor.tidying, true) {
                return;
            }
            let services = actor.services.clone();
            async move { tidy(&services).await }
                .into_actor(actor)
                .map(|(), actor, _| actor.tidying = false)
                .spawn(context);
        });
    }
}

/// How often a node whose directory is out of reach sends a heartbeat (each bounded by the
/// connection timeout): 100 ms. Failures meanwhile are logged once per outage.
const OUT_OF_REACH_HEARTBEAT: Duration = Duration::from_millis(100);

impl NodeActor {
    /// Sends one heartbeat unless one is in flight or the node rejoins, and acts on what it
    /// learnt.
    fn beat(&mut self, context: &mut Context<Self>) {
        if self.rejoining || std::mem::replace(&mut self.heartbeat_running, true) {
            return;
        }
        let services = self.services.clone();
        async move { heartbeat(&services).await }
            .into_actor(self)
            .map(|beat, actor, context| {
                actor.heartbeat_running = false;
                match beat {
                    Beat::Alive => {}
                    Beat::Lost if !actor.rejoining => actor.start_rejoin(context),
                    Beat::Lost => {}
                    Beat::Drained => {
                        let _ = actor.exit.try_send(NodeExit::Drained);
                    }
                }
            })
            .spawn(context);
    }
}

/// What a heartbeat learnt of the session.
enum Beat {
    /// Answered, or not yet silent for long: the session goes on.
    Alive,
    /// The directory no longer knows it (a restart), fenced it, or stayed silent for the
    /// fence window: the node rejoins.
    Lost,
    /// The directory drained the node: it exits.
    Drained,
}

/// One heartbeat, on the link's heartbeat connection.
async fn heartbeat(services: &NodeServices) -> Beat {
    let link = &services.link;
    let sent_at = services.clock.now();
    let wait = services
        .core()
        .heartbeat_timer
        .timeout(link.binding().heartbeat_interval);
    let acknowledged_through = link.acknowledged_through();
    let answered = link.heartbeat(acknowledged_through, wait).await;
    let may_be_fenced = {
        let mut core = services.core();
        if answered.is_ok() {
            core.operations.acknowledged(acknowledged_through);
            core.liveness.answered(sent_at);
            // Only a heartbeat answered on its first try is a round trip (Karn's rule).
            let round_trip = services.clock.now().saturating_since(sent_at);
            if round_trip < wait {
                core.heartbeat_timer.answered(round_trip);
            }
        }
        core.liveness.may_be_fenced(services.clock.now())
    };
    if may_be_fenced {
        tracing::error!("no heartbeat answered for the fence window; rejoining");
        return Beat::Lost;
    }
    match answered {
        Ok(_) => Beat::Alive,
        Err(LinkError::Refused(ProtocolError::Directory(DirectoryError::Drained))) => Beat::Drained,
        Err(LinkError::Refused(ProtocolError::Directory(
            DirectoryError::Fenced { .. } | DirectoryError::UnknownSession,
        ))) => {
            tracing::warn!("the directory no longer knows this session; rejoining");
            Beat::Lost
        }
        Err(error) => {
            // The link logs each outage once (`mark_unreachable`).
            tracing::debug!(%error, "directory heartbeat failed");
            Beat::Alive
        }
    }
}

/// The periodic clean-up, every task interval: frees the pages whose release is due,
/// sends again the SSD's retirements that failed, gives back extents that emptied, and
/// publishes the pools' usage.
async fn tidy(services: &NodeServices) {
    register_pending_namespaces(services).await;
    tidy_delegations(services).await;
    let due = services.core().holdings.due_frees(services.clock.now());
    for location in due {
        services.free(location).await;
    }
    if let Some(ssd) = &services.ssd {
        super::ssd::retire_pending(services, ssd).await;
    }
    give_back_empty_extents(services).await;
    publish_usage(services).await;
}

/// Registers with the directory the namespaces the node answered while it was out of
/// reach (a refusal is logged; the engines' lookups in it are then refused too).
async fn register_pending_namespaces(services: &NodeServices) {
    if !services.link.is_reachable() {
        return;
    }
    let pending = services.core().holdings.pending_namespaces();
    for (id, descriptor) in pending {
        let request = DirectoryRequest::RegisterNamespace(descriptor.clone());
        match services.link.call(request).await {
            Ok(DirectoryReply::Namespace(registered)) if registered == id => services
                .core()
                .holdings
                .namespace_registered(id, descriptor),
            Err(unavailable) if unavailable.is_unavailable() => return,
            other => {
                tracing::warn!(?other, namespace = ?id, "a namespace registered while the directory was out of reach was refused");
                services
                    .core()
                    .holdings
                    .namespace_registered(id, descriptor);
            }
        }
    }
}

/// Ends the local leases and delegations whose time is up, releases what is owed, reports
/// the hits answered locally (in batches the directory accepts; the rest wait for the next
/// tidy), and publishes the delegation metrics.
async fn tidy_delegations(services: &NodeServices) {
    let now = services.clock.now();
    let batch = services.link.batch_items_max().max(1);
    let (reports, counts, held, latencies) = {
        let mut core = services.core();
        core.delegations.expire(now);
        let reports = core.delegations.take_hit_reports(batch);
        let latencies = core.delegations.take_recall_latencies();
        (
            reports,
            core.delegations.counts(),
            core.delegations.len(),
            latencies,
        )
    };
    services.send_delegation_releases();
    services
        .delegation_metrics
        .publish(&counts, held, services.metrics.lookup_hits(), &latencies);
    if !reports.is_empty() {
        // Lost reports only make the eviction order a little less informed.
        let _ = services
            .link
            .call(DirectoryRequest::ReportHits { hits: reports })
            .await;
    }
}

/// When the node asked for a batch of tasks: on its clock, and in which of its sessions
/// ([`crate::node::delegations::Delegations::session_mark`]).
#[derive(Clone, Copy)]
struct TasksAsked {
    at: crate::model::Timestamp,
    mark: u64,
}

/// Runs one batch of handed-out tasks, [`TASKS_IN_FLIGHT_MAX`] at once. Its delegations
/// are taken first ([`take_offered`]). Its reclaims are acknowledged together once freed
/// ([`reclaim_all`]): one request for the batch, not one per evicted replica.
async fn run_batch(
    services: &NodeServices,
    session: SessionId,
    asked: TasksAsked,
    tasks: Vec<Task>,
) {
    let (offered, tasks): (Vec<Task>, Vec<Task>) = tasks
        .into_iter()
        .partition(|task| matches!(task.kind, TaskKind::Delegate { .. }));
    take_offered(services, asked, &offered);
    let (reclaims, others): (Vec<Task>, Vec<Task>) = tasks
        .into_iter()
        .partition(|task| matches!(task.kind, TaskKind::Reclaim { .. }));
    let others = futures_util::stream::iter(others)
        .for_each_concurrent(TASKS_IN_FLIGHT_MAX, |task| {
            run_task(services, session, task)
        });
    futures_util::join!(reclaim_all(services, session, reclaims), others);
}

/// The delegations the directory granted on offer with a batch of tasks: each answers its
/// object's hits from now on, measured from when the batch was asked for, unless the
/// session they were granted in has ended since (they ended with it).
fn take_offered(services: &NodeServices, asked: TasksAsked, offered: &[Task]) {
    if offered.is_empty() {
        return;
    }
    {
        let mut core = services.core();
        if core.delegations.session_mark() != asked.mark {
            return;
        }
        for task in offered {
            if let TaskKind::Delegate {
                object,
                lease,
                delegation,
            } = task.kind
            {
                core.delegations
                    .granted(asked.at, object, &lease, delegation);
            }
        }
    }
    services.send_delegation_releases();
}

/// Carries out one task of `session` (a reclaim is [`reclaim_all`]'s, a delegation
/// [`take_offered`]'s).
async fn run_task(services: &NodeServices, session: SessionId, task: Task) {
    match task.kind {
        TaskKind::Reclaim { .. } => reclaim_all(services, session, vec![task]).await,
        TaskKind::Delegate { .. } => {}
        TaskKind::Recall { delegation, .. } => {
            let now = services.clock.now();
            services.core().delegations.recall(now, delegation);
            services.send_delegation_releases();
        }
        TaskKind::Demote {
            source,
            target,
            target_pool,
        } => match &services.ssd {
            Some(ssd) if ssd.pool() == target_pool => {
                super::ssd::spill(services, ssd, session, source, target).await
            }
            _ => {
                let copy = PoolCopy::demotion(source, target, target_pool);
                copy_and_commit(services, session, copy).await
            }
        },
        TaskKind::Replicate {
            source,
            target,
            target_pool,
        } => {
            let copy = PoolCopy::replication(source, target, target_pool);
            copy_and_commit(services, session, copy).await
        }
        TaskKind::Push {
            source,
            target,
            token,
            length_bytes,
            to,
        } => replication::push(
            services,
            replication::PushTask {
                task: task.id,
                source,
                target,
                token,
                length_bytes,
                to,
            },
        ),
        TaskKind::Receive {
            object,
            target,
            token,
            target_pool,
            length_bytes,
            from,
        } => {
            let receive = replication::ReceiveTask {
                task: task.id,
                object,
                target,
                token,
                target_pool,
                length_bytes,
                from,
            };
            replication::receive(services, session, receive).await
        }
    }
}

/// Exports what this node's allocators hold (the directory exports the replica states).
async fn publish_usage(services: &NodeServices) {
    for (pool, actor) in &services.pools {
        if let Ok(usage) = actor.send(Usage).await {
            services
                .metrics
                .set_pool_bytes(*pool, PoolByteState::Allocated, usage.allocated_bytes);
        }
    }
}

/// Frees the retired replicas of `reclaims` (reclaim tasks) one after another (a message
/// to the pool's actor each, no round trip to the directory), then acknowledges those
/// freed in requests of at most the session's batch size: `ReclaimAck` for one,
/// `ReclaimAckMany` for more. A replica not acknowledged (a lost reply, a refusal) comes
/// back as a task.
async fn reclaim_all(services: &NodeServices, session: SessionId, reclaims: Vec<Task>) {
    let now = services.clock.now();
    let due: Vec<(ReplicaId, Location)> = reclaims
        .into_iter()
        .filter_map(|task| match task.kind {
            TaskKind::Reclaim { replica, location } => Some((replica, location)),
            _ => None,
        })
        // A replica whose hits this node answers itself goes once no local lease on it is
        // live: then [`reclaim_ready`] frees it (and the task, handed out again, finds it done).
        .filter(|(replica, _)| services.core().delegations.may_reclaim(now, *replica))
        .collect();
    free_and_acknowledge(services, session, due, None).await;
}

/// Frees the owned replicas whose reclaim waited for their last local lease, taken in
/// the session `mark` names ([`crate::node::Delegations::take_reclaims_ready`]), and
/// acknowledges their reclaims; none once that session has ended (its rejoin reports what
/// the node holds, and the directory hands out what it still wants reclaimed).
pub(super) async fn reclaim_ready(
    services: &NodeServices,
    mark: u64,
    ready: Vec<(ReplicaId, Location)>,
) {
    if !ready.is_empty() {
        free_and_acknowledge(services, services.link.session(), ready, Some(mark)).await;
    }
}

/// Frees each replica's pages (while the session `mark` names lasts, when given), then
/// acknowledges the freed ones' reclaims in `session`, in batches the directory accepts.
async fn free_and_acknowledge(
    services: &NodeServices,
    session: SessionId,
    reclaims: Vec<(ReplicaId, Location)>,
    mark: Option<u64>,
) {
    let freed: Vec<ReplicaId> = futures_util::stream::iter(reclaims)
        .filter_map(|(replica, location)| async move {
            free_retired(services, location, mark)
                .await
                .then_some(replica)
        })
        .collect()
        .await;
    for batch in freed.chunks(services.link.batch_items_max().max(1)) {
        let request = match batch {
            [replica] => DirectoryRequest::ReclaimAck { replica: *replica },
            _ => DirectoryRequest::ReclaimAckMany {
                replicas: batch.to_vec(),
            },
        };
        match services.link.call_in(session, request).await {
            Ok(DirectoryReply::ReclaimedMany(outcomes)) => {
                for (replica, outcome) in batch.iter().zip(outcomes) {
                    if let Err(error) = outcome {
                        tracing::warn!(%error, ?replica, "reclaim acknowledgement refused; the task comes back");
                    }
                }
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, replicas = batch.len(), "reclaim acknowledgement failed; the tasks come back")
            }
        }
    }
}

/// Frees a retired replica's pages; whether it is done (to be acknowledged). Idempotent:
/// an allocation already freed (a task handed out again after a lost acknowledgement)
/// counts as done too.
async fn free_retired(services: &NodeServices, location: Location, mark: Option<u64>) -> bool {
    let freed = match services.pools.get(&location.pool) {
        Some(pool) => {
            {
                let mut core = services.core();
                // Checked with the holdings' change: a rejoin reports holdings only after
                // the session ended, so what it reports is never freed here after.
                if mark.is_some_and(|mark| mark != core.delegations.session_mark()) {
                    return false;
                }
                core.holdings.freed(&location);
            }
            pool.send(Free {
                allocation: location.allocation,
                generation: location.generation,
            })
            .await
        }
        // The SSD pool: the object leaves the store (its space comes back with its region).
        None if services.is_ssd_pool(location.pool) => {
            services.free(location).await;
            Ok(Ok(location.length_bytes))
        }
        None => {
            tracing::error!(?location, "reclaim task for a pool this node does not own");
            return false;
        }
    };
    match freed {
        Ok(freed) if reclaim_done(&freed) => true,
        other => {
            tracing::error!(?other, ?location, "reclaim could not free the allocation");
            false
        }
    }
}

/// A copy between two pools this node maps, which the directory asked for: a demotion
/// (the directory retires the source once the copy commits) or a replication (the source
/// stays). The node does the same for both; only the bytes-moved label differs.
#[derive(Clone, Copy, Debug)]
struct PoolCopy {
    source: Location,
    target: ReplicaId,
    target_pool: PoolId,
    direction: Direction,
}

impl PoolCopy {
    fn demotion(source: Location, target: ReplicaId, target_pool: PoolId) -> PoolCopy {
        let direction = Direction::Demote;
        PoolCopy {
            source,
            target,
            target_pool,
            direction,
        }
    }

    fn replication(source: Location, target: ReplicaId, target_pool: PoolId) -> PoolCopy {
        let direction = Direction::Replicate;
        PoolCopy {
            source,
            target,
            target_pool,
            direction,
        }
    }
}

/// Copies a replica into another pool and commits the copy. The source is read, then
/// checked still live at its generation, so a copy of pages reused meanwhile is never
/// committed. On any failure the target is aborted.
async fn copy_and_commit(services: &NodeServices, session: SessionId, copy_task: PoolCopy) {
    let PoolCopy {
        source,
        target,
        target_pool,
        direction,
    } = copy_task;
    let object = services.core().holdings.object_at(&source);
    let copied = copy(services, source, target_pool).await;
    let location = match copied {
        Ok(location) => location,
        Err(reason) => {
            tracing::debug!(%reason, ?source, ?direction, "copy abandoned");
            services.link.abort(session, target).await;
            return;
        }
    };
    let committed = services.link.commit(session, target, location).await;
    let published = matches!(committed, Ok(Some(CommitOutcome::Committed)));
    match after_commit(commit_result(committed)) {
        PagesAfterCommit::Published => {
            if let (true, Some(object)) = (published, object) {
                services.published(object, location);
            }
            services
                .metrics
                .add_bytes_moved(direction, location.length_bytes)
        }
        PagesAfterCommit::Keep => {}
        PagesAfterCommit::Free => services.free(location).await,
        PagesAfterCommit::FreeAndAbort => {
            services.free(location).await;
            services.link.abort(session, target).await;
        }
    }
}

/// How a commit through the link ended, for the node core's rule on its pages.
pub fn commit_result(
    committed: Result<Option<crate::directory::CommitOutcome>, LinkError>,
) -> CommitResult {
    match committed {
        Ok(Some(outcome)) => CommitResult::Applied(outcome),
        Ok(None) => CommitResult::NotApplied,
        Err(LinkError::Refused(_) | LinkError::Busy) => CommitResult::Refused,
        // Never sent: nothing was applied.
        Err(LinkError::Unreachable) => CommitResult::NotApplied,
        Err(_) => CommitResult::Unknown,
    }
}

/// The copy step of a demotion or a replication: allocate the target, copy the source
/// straight from one mapping into the other on the node's copy engine
/// ([`super::copy_engine`]), then check the source was not reclaimed meanwhile (its
/// generation is unchanged, so no byte came from reused pages). Returns the target's
/// location; on failure the target's pages are freed.
async fn copy(
    services: &NodeServices,
    source: Location,
    target_pool: PoolId,
) -> Result<Location, String> {
    let (Some(from), Some(to)) = (
        services.pools.get(&source.pool),
        services.pools.get(&target_pool),
    ) else {
        return Err("a pool of the copy is not mapped here".into());
    };
    let allocation = services
        .allocate(to, target_pool, source.length_bytes)
        .await
        .map_err(|error| error.to_string())?
        .map_err(|error| error.to_string())?;
    let location = Location {
        pool: target_pool,
        allocation: allocation.id,
        generation: allocation.generation,
        offset_bytes: allocation.offset,
        length_bytes: source.length_bytes,
    };
    if let Err(reason) = copy_pages(services, from, to, source, location).await {
        services.free(location).await;
        return Err(reason);
    }
    Ok(location)
}

/// Copies `source` to `target` (same length) on the copy engine, then checks the source: a
/// source freed and reused meanwhile (a concurrent reclaim) fails the check, and the caller
/// frees the copy instead of committing it.
async fn copy_pages(
    services: &NodeServices,
    from: &Addr<PoolActor>,
    to: &Addr<PoolActor>,
    source: Location,
    target: Location,
) -> Result<(), String> {
    let failed = |what: &str, error: &dyn std::fmt::Display| format!("{what} failed: {error}");
    let reader = from
        .send(Bytes)
        .await
        .map_err(|error| failed("reaching the source pool", &error))?;
    let writer = to
        .send(Bytes)
        .await
        .map_err(|error| failed("reaching the target pool", &error))?;
    services
        .copier
        .copy(CopyRequest {
            from: reader,
            to: writer,
            source_offset: source.offset_bytes,
            target_offset: target.offset_bytes,
            length_bytes: source.length_bytes,
        })
        .await?;
    from.send(Check { location: source })
        .await
        .map_err(|error| failed("checking the source", &error))?
        .map_err(|error| failed("checking the source", &error))
}

/// Resolves earlier returns whose replies were lost, then gives back every extent of a
/// shared pool that holds no allocation any more, so other nodes can write there. Stops at
/// a pool's first extent that does not leave (still in use there, or unknown).
async fn give_back_empty_extents(services: &NodeServices) {
    for action in services.link.resolve_returns().await {
        services.apply_extent_action(action).await;
    }
    for (pool, actor) in &services.pools {
        while let Ok(Some((offset_bytes, length_bytes, word))) = actor.send(TakeEmptyExtent).await {
            let action = services
                .link
                .give_back_extent(*pool, offset_bytes, length_bytes, word)
                .await;
            services.apply_extent_action(action).await;
            if action != ExtentAction::Forget {
                break;
            }
        }
    }
}
