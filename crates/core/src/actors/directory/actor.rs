//! The `DirectoryActor`: owns the directory core and serializes every change of lease and
//! publication state. Session actors send it [`Call`]s; a timer advances the core's time.
//! It also owns the configuration in force: a [`Reload`] (SIGHUP, or `kvtier ctl reload`
//! through a node) re-reads the file, and applies what [`super::reload::diff`] says when the
//! whole file is acceptable: new nodes' grants, new CXL pools, drains of removed nodes.

use super::election::ServingGate;
use super::process::add_cxl_pool;
use super::reload;
use crate::config::ClusterConfig;
use crate::directory::reload::{ConfigChange, ReloadRefusal};
use crate::directory::{DirectoryCounts, DrainState};
use crate::metrics::delegation::DirectoryRecallMetrics;
use crate::metrics::replication::ReplicationMetrics;
use crate::metrics::{Metrics, Operation, PoolByteState, SessionState as SessionLabel};
use crate::model::{Clock, Medium, PoolUsage, SessionId};
use crate::protocol::directory::{NodeGrant, PeerRole};
use crate::protocol::messages::PoolUsageReport;
use crate::protocol::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use crate::protocol::shards::Shards;
use actix::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Calls queued for the directory actor; a full mailbox makes session actors wait, which
/// stops them reading frames, which pushes back on the nodes.
pub const MAILBOX_CAPACITY: usize = 4096;

/// A request from one authenticated peer, with the session its connection is bound to.
pub struct Call {
    pub peer: String,
    pub session: Option<SessionId>,
    pub request: DirectoryRequest,
}

impl Message for Call {
    type Result = DirectoryReply;
}

/// Asks to be told when `session` has a task to hand out (an `AwaitTasks` of its node):
/// the receiver fires at once when it has one now, else after the first call or tick that
/// gives it one. A later watch of the same session replaces this one, whose receiver then
/// fails; so does a session that ends.
pub struct WatchTasks {
    pub session: SessionId,
}

impl Message for WatchTasks {
    type Result = oneshot::Receiver<()>;
}

/// How many node sessions are open (live or suspect), asked at exit.
pub struct OpenSessions;

impl Message for OpenSessions {
    type Result = u64;
}

impl Handler<OpenSessions> for DirectoryActor {
    type Result = u64;

    fn handle(&mut self, _: OpenSessions, _: &mut Context<Self>) -> u64 {
        let counts = self.core.counts();
        counts.sessions_live + counts.sessions_suspect
    }
}

/// Re-read the configuration file and apply it, or refuse it as a whole.
pub struct Reload;

impl Message for Reload {
    type Result = Result<ConfigChange, ReloadRefusal>;
}

/// The directory actor. See the module documentation.
pub struct DirectoryActor {
    /// The directory's shards (one unless `[directory] shards` says more), on this actor's
    /// thread.
    core: Shards,
    clock: Clock,
    /// The configuration in force and the file it came from.
    config: ClusterConfig,
    config_path: PathBuf,
    /// What the configuration grants each node, by node (certificate) name.
    grants: HashMap<String, NodeGrant>,
    /// Nodes a reload removed: their open session keeps being answered (so it learns it
    /// was drained), but they cannot open a new one. Bounded by the nodes ever configured.
    removed: HashMap<String, NodeGrant>,
    metrics: Arc<Metrics>,
    replication_metrics: ReplicationMetrics,
    recall_metrics: DirectoryRecallMetrics,
    tick_interval: Duration,
    /// Sessions waiting for a task ([`WatchTasks`]): at most one watch per session, and a
    /// watch whose waiter gave up is dropped at the next wake, so this holds at most the
    /// open sessions (one per configured node).
    task_watches: HashMap<SessionId, oneshot::Sender<()>>,
    /// The core's [`Directory::tasks_queued`] when the watches were last checked.
    tasks_queued_seen: u64,
    /// Whether this process may answer now (its leader lease): checked before every call
    /// and tick; a closed gate exits the process.
    gate: Arc<ServingGate>,
}

/// What `config` grants each of its nodes.
fn grants_of(config: &ClusterConfig) -> HashMap<String, NodeGrant> {
    config
        .nodes
        .iter()
        .map(|node| {
            let (domains, namespaces) = node.access();
            let grant = NodeGrant {
                domains,
                namespaces,
            };
            (node.name.clone(), grant)
        })
        .collect()
}

impl DirectoryActor {
    /// An actor owning `core`, serving `config` (loaded from `config_path`).
    pub fn new(
        core: Shards,
        config: ClusterConfig,
        config_path: PathBuf,
        metrics: Arc<Metrics>,
        (replication_metrics, recall_metrics): (ReplicationMetrics, DirectoryRecallMetrics),
        tick_interval: Duration,
        gate: Arc<ServingGate>,
    ) -> Self {
        DirectoryActor {
            core,
            clock: Clock::start(),
            grants: grants_of(&config),
            removed: HashMap::new(),
            config,
            config_path,
            metrics,
            replication_metrics,
            recall_metrics,
            tick_interval,
            task_watches: HashMap::new(),
            tasks_queued_seen: 0,
            gate,
        }
    }

    /// Fires the watch of every session that now has a task to hand out, and drops the
    /// watches nobody waits on any more. After a call, only when the core queued a task
    /// since the last check (`always` after a tick, which may release held tasks).
    fn wake_task_watches(&mut self, always: bool) {
        let queued = self.core.tasks_queued();
        if self.task_watches.is_empty() || (!always && queued == self.tasks_queued_seen) {
            self.tasks_queued_seen = queued;
            return;
        }
        self.tasks_queued_seen = queued;
        let now = self.clock.now();
        let core = &self.core;
        let ready: Vec<SessionId> = self
            .task_watches
            .iter()
            .filter(|(session, watch)| watch.is_closed() || core.has_tasks(now, **session))
            .map(|(session, _)| *session)
            .collect();
        for session in ready {
            if let Some(watch) = self.task_watches.remove(&session) {
                let _ = watch.send(());
            }
        }
    }

    /// Re-reads the file; applies it when it is valid and every change can be applied
    /// live, else refuses it whole and keeps the configuration in force.
    fn reload(&mut self) -> Result<ConfigChange, ReloadRefusal> {
        let new = ClusterConfig::load(&self.config_path)
            .map_err(|error| ReloadRefusal::Invalid(format!("{error:#}")))?;
        let change = reload::diff(&self.config, &new)?;
        for name in &change.added_cxl_pools {
            if let Some(pool) = new.cxl_pools.iter().find(|pool| &pool.name == name) {
                add_cxl_pool(&mut self.core, pool)
                    .map_err(|error| ReloadRefusal::Invalid(format!("{error:#}")))?;
            }
        }
        // New nodes are declared as at start, after every pool there is: a directory
        // started later over this file declares them in file order, after the CXL pools
        // and the nodes above them, so their ids agree when the file only grew at its end.
        for name in &change.added_nodes {
            if let Ok(section) = new.node(name) {
                let specs = new
                    .host_pool_specs(section, crate::model::NodeId(0))
                    .map_err(|error| ReloadRefusal::Invalid(format!("{error:#}")))?;
                if let Err(error) = self.core.declare_node(name, specs) {
                    return Err(ReloadRefusal::Invalid(format!(
                        "declaring node `{name}`: {error}"
                    )));
                }
            }
        }
        for node in &new.nodes {
            self.core
                .set_peer_endpoint(&node.name, node.peer_listen.and(node.peer_reachable_at()));
        }
        self.grants = grants_of(&new);
        self.core
            .set_namespace_costs(new.directory.limits.namespace_costs.clone());
        self.core
            .set_group_quotas(new.directory.limits.group_quotas.clone());
        for name in &change.removed_nodes {
            let Some(grant) = grants_of(&self.config).remove(name) else {
                continue;
            };
            match self.core.drain(name) {
                Ok(_) => tracing::info!(node = %name, "removed from the configuration: draining"),
                Err(error) => {
                    tracing::info!(node = %name, %error, "removed from the configuration")
                }
            }
            self.removed.insert(name.clone(), grant);
        }
        self.removed
            .retain(|name, _| !self.grants.contains_key(name));
        self.config = new;
        Ok(change)
    }

    /// What a request of `peer` is served as: an operator when the configuration names it
    /// one; a node under its configured grant; a removed node under its old grant except to
    /// open a session.
    fn role_of(&self, peer: &str, request: &DirectoryRequest) -> PeerRole {
        if self
            .config
            .directory
            .operators
            .iter()
            .any(|name| name == peer)
        {
            return PeerRole::Operator;
        }
        let opens = matches!(request, DirectoryRequest::Open { .. });
        self.grants
            .get(peer)
            .or_else(|| self.removed.get(peer).filter(|_| !opens))
            .cloned()
            .map_or(PeerRole::Unknown, PeerRole::Node)
    }

    /// Exports how many drains are in each state and what the active ones wait for.
    fn publish_drains(&self) {
        let statuses = self.core.node_statuses();
        let drains = statuses.iter().filter_map(|status| status.drain.as_ref());
        let (mut replicas, mut leases, mut reservations) = (0, 0, 0);
        let mut per_state = [0u64; DrainState::ALL.len()];
        for drain in drains {
            if let Some(index) = DrainState::ALL
                .iter()
                .position(|state| *state == drain.state)
            {
                per_state[index] += 1;
            }
            if drain.state.is_active() {
                replicas += drain.replicas_left;
                leases += u64::from(drain.leases_outstanding);
                reservations += u64::from(drain.reservations_outstanding);
            }
        }
        for (state, count) in DrainState::ALL.iter().zip(per_state) {
            self.metrics.set_drains(state.name(), count);
        }
        self.metrics.set_drain_pending("replicas", replicas);
        self.metrics.set_drain_pending("leases", leases);
        self.metrics.set_drain_pending("reservations", reservations);
    }

    fn publish_metrics(&self) {
        let DirectoryCounts {
            leases,
            sessions_live,
            sessions_suspect,
            sessions_fenced,
            ..
        } = self.core.counts();
        self.metrics.set_leases(leases);
        self.metrics.set_sessions(SessionLabel::Live, sessions_live);
        self.metrics
            .set_sessions(SessionLabel::Suspect, sessions_suspect);
        self.metrics
            .set_sessions(SessionLabel::Fenced, sessions_fenced);
        for node in self.core.node_statuses() {
            self.metrics.set_node_epoch(&node.name, node.epoch.0);
        }
        let mut per_medium: HashMap<Medium, PoolUsage> = HashMap::new();
        for PoolUsageReport {
            pool,
            spec,
            usage,
            profile,
        } in self.core.usage()
        {
            per_medium.entry(spec.medium).or_default().add(&usage);
            self.metrics
                .set_pool_capacity(pool, spec.medium, usage.capacity_bytes);
            self.metrics.set_pool_profile(pool, &profile);
            for (state, bytes) in [
                (PoolByteState::Reserved, usage.reserved_bytes),
                (PoolByteState::Allocated, usage.allocated_bytes),
                (PoolByteState::Ready, usage.ready_bytes),
                (PoolByteState::Retiring, usage.retiring_bytes),
                (PoolByteState::Quarantined, usage.quarantined_bytes),
                (PoolByteState::Pinned, usage.pinned_bytes),
            ] {
                self.metrics.set_pool_bytes(pool, state, bytes);
            }
        }
        for (medium, usage) in per_medium {
            for (state, bytes) in [
                ("capacity", usage.capacity_bytes),
                (PoolByteState::Reserved.as_str(), usage.reserved_bytes),
                (PoolByteState::Allocated.as_str(), usage.allocated_bytes),
                (PoolByteState::Ready.as_str(), usage.ready_bytes),
                (PoolByteState::Retiring.as_str(), usage.retiring_bytes),
                (PoolByteState::Quarantined.as_str(), usage.quarantined_bytes),
                (PoolByteState::Pinned.as_str(), usage.pinned_bytes),
            ] {
                self.metrics.set_medium_bytes(medium, state, bytes);
            }
        }
    }
}

impl Actor for DirectoryActor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        context.set_mailbox_capacity(MAILBOX_CAPACITY);
        context.run_interval(self.tick_interval, |actor, _| {
            actor.gate.exit_unless_serving();
            let report = actor.core.tick(actor.clock.now());
            actor.metrics.add_evictions(u64::from(report.evicted));
            for (medium, total) in actor.core.evictions_by_medium() {
                actor.metrics.set_directory_evictions(medium, total);
            }
            actor.metrics.add_expirations(u64::from(report.expired));
            for transition in &report.transitions {
                tracing::info!(session = %transition.session, node = %transition.node, state = transition.state.name(), "session state changed");
            }
            for (node, progress) in &report.drains {
                let name = actor.core.node_name(*node).unwrap_or("unknown");
                match &progress.stuck {
                    Some(reason) => tracing::warn!(node = name, "drain stuck: {reason}; still trying"),
                    None => tracing::info!(node = name, state = progress.state.name(), "drain state changed"),
                }
            }
            actor.wake_task_watches(true);
            actor.publish_metrics();
            actor.publish_drains();
            let latencies = actor.core.take_replication_latencies();
            actor
                .replication_metrics
                .publish(&actor.core.replication_counts(), &latencies);
            actor.recall_metrics.publish(
                &actor.core.recalls_by_reason(),
                actor.core.delegations_live(),
                actor.core.delegations_offered(),
            );
        });
    }
}

impl Handler<WatchTasks> for DirectoryActor {
    type Result = MessageResult<WatchTasks>;

    fn handle(&mut self, watch: WatchTasks, _: &mut Context<Self>) -> Self::Result {
        let (sender, receiver) = oneshot::channel();
        if self.core.has_tasks(self.clock.now(), watch.session) {
            let _ = sender.send(());
        } else {
            self.task_watches.insert(watch.session, sender);
        }
        MessageResult(receiver)
    }
}

impl Handler<Reload> for DirectoryActor {
    type Result = MessageResult<Reload>;

    fn handle(&mut self, _: Reload, _: &mut Context<Self>) -> Self::Result {
        let outcome = self.reload();
        match &outcome {
            Ok(change) => {
                self.metrics.add_reload("applied");
                tracing::info!(?change, path = %self.config_path.display(), "configuration reloaded");
            }
            Err(refusal) => {
                self.metrics.add_reload("refused");
                tracing::warn!(%refusal, path = %self.config_path.display(), "configuration reload refused; the configuration in force stays");
            }
        }
        MessageResult(outcome)
    }
}

impl Handler<Call> for DirectoryActor {
    type Result = MessageResult<Call>;

    fn handle(&mut self, call: Call, context: &mut Context<Self>) -> Self::Result {
        self.gate.exit_unless_serving();
        let started = Instant::now();
        let operation = operation_label(&call.request);
        let role = self.role_of(&call.peer, &call.request);
        let reply =
            if call.request == DirectoryRequest::Reload && matches!(role, PeerRole::Operator) {
                match Handler::<Reload>::handle(self, Reload, context).0 {
                    Ok(change) => DirectoryReply::Reloaded(change),
                    Err(refusal) => DirectoryReply::Error(ProtocolError::Reload(refusal)),
                }
            } else {
                self.core.handle(
                    self.clock.now(),
                    &call.peer,
                    role,
                    call.session,
                    call.request,
                )
            };
        let error = match &reply {
            DirectoryReply::Error(error) => Some(error.label()),
            _ => None,
        };
        if let Some(operation) = operation {
            self.metrics
                .observe_request(operation, started.elapsed(), error);
        }
        self.wake_task_watches(false);
        MessageResult(reply)
    }
}

/// The metrics label of a request (none for the handshake).
fn operation_label(request: &DirectoryRequest) -> Option<Operation> {
    use DirectoryRequest as Request;
    Some(match request {
        Request::Hello(_) => return None,
        Request::Open { .. }
        | Request::Resume { .. }
        | Request::RegisterPool(_)
        | Request::RegisterNamespace(_)
        | Request::ReportProfile { .. }
        | Request::AdmitAfter { .. } => Operation::Open,
        Request::Heartbeat { .. } => Operation::Heartbeat,
        Request::Close => Operation::Close,
        Request::Reserve { .. }
        | Request::ReserveMany { .. }
        | Request::GrantExtent { .. }
        | Request::ReturnExtent { .. } => Operation::Reserve,
        Request::Commit { .. } | Request::CommitMany { .. } | Request::Abort { .. } => {
            Operation::Commit
        }
        Request::Resolve { .. } => Operation::Resolve,
        Request::Probe { .. } => Operation::Probe,
        Request::Locate { .. } => Operation::Locate,
        Request::Acquire { .. } | Request::AcquireDelegating { .. } => Operation::Acquire,
        Request::ReportHits { .. } => Operation::ReportHits,
        Request::Release { .. } => Operation::Release,
        Request::Retire { .. } | Request::RetireHeld { .. } => Operation::Retire,
        Request::ReclaimAck { .. } | Request::ReclaimAckMany { .. } => Operation::ReclaimAck,
        Request::Usage => Operation::Usage,
        Request::PollTasks { .. } | Request::AwaitTasks { .. } => Operation::PollTasks,
        Request::ClaimExtents { .. } | Request::Adopt { .. } => Operation::Rejoin,
        Request::ClusterStatus | Request::Reload | Request::Drain { .. } => Operation::Admin,
    })
}
