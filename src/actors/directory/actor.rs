//! The `DirectoryActor`: owns the directory core and serializes every change of lease and
//! publication state. Session actors send it [`Call`]s; a timer advances the core's time.

use crate::directory::{Directory, DirectoryCounts, PoolReport};
use crate::metrics::{Metrics, Operation, PoolByteState, SessionState as SessionLabel};
use crate::model::{Clock, Medium, PoolUsage, SessionId};
use crate::policy::profiles::Measurement;
use crate::protocol::directory::NodeGrant;
use crate::protocol::messages::{DirectoryReply, DirectoryRequest};
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The directory actor. See the module documentation.
pub struct DirectoryActor {
    core: Directory,
    clock: Clock,
    grants: HashMap<String, NodeGrant>,
    metrics: Arc<Metrics>,
    tick_interval: Duration,
}

impl DirectoryActor {
    /// An actor owning `core`; `grants` is keyed by node (certificate) name.
    pub fn new(
        core: Directory,
        grants: HashMap<String, NodeGrant>,
        metrics: Arc<Metrics>,
        tick_interval: Duration,
    ) -> Self {
        DirectoryActor {
            core,
            clock: Clock::start(),
            grants,
            metrics,
            tick_interval,
        }
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
        let mut per_medium: HashMap<Medium, PoolUsage> = HashMap::new();
        for PoolReport {
            pool,
            spec,
            usage,
            profile,
        } in self.core.usage()
        {
            let total = per_medium.entry(spec.medium).or_default();
            total.capacity_bytes += usage.capacity_bytes;
            total.reserved_bytes += usage.reserved_bytes;
            total.allocated_bytes += usage.allocated_bytes;
            total.ready_bytes += usage.ready_bytes;
            total.retiring_bytes += usage.retiring_bytes;
            total.quarantined_bytes += usage.quarantined_bytes;
            total.pinned_bytes += usage.pinned_bytes;
            self.metrics
                .set_pool_capacity(pool, spec.medium, usage.capacity_bytes);
            self.metrics
                .set_pool_profile(pool, &Measurement::of(&profile));
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
            let report = actor.core.tick(actor.clock.now());
            actor.metrics.add_evictions(u64::from(report.evicted));
            actor.metrics.add_expirations(u64::from(report.expired));
            for transition in &report.transitions {
                tracing::info!(session = %transition.session, node = %transition.node, state = transition.state.name(), "session state changed");
            }
            actor.publish_metrics();
        });
    }
}

impl Handler<Call> for DirectoryActor {
    type Result = MessageResult<Call>;

    fn handle(&mut self, call: Call, _: &mut Context<Self>) -> Self::Result {
        let started = Instant::now();
        let operation = operation_label(&call.request);
        let grant = self.grants.get(&call.peer).cloned();
        let reply = crate::protocol::directory::handle(
            &mut self.core,
            self.clock.now(),
            &call.peer,
            grant,
            call.session,
            call.request,
        );
        let error = match &reply {
            DirectoryReply::Error(error) => Some(error.label()),
            _ => None,
        };
        if let Some(operation) = operation {
            self.metrics
                .observe_request(operation, started.elapsed(), error);
        }
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
        | Request::ReportProfile { .. } => Operation::Open,
        Request::Heartbeat { .. } => Operation::Heartbeat,
        Request::Close => Operation::Close,
        Request::Reserve { .. } | Request::GrantExtent { .. } | Request::ReturnExtent { .. } => {
            Operation::Reserve
        }
        Request::Commit { .. } | Request::Abort { .. } => Operation::Commit,
        Request::Resolve { .. } => Operation::Resolve,
        Request::Probe { .. } => Operation::Probe,
        Request::Acquire { .. } => Operation::Acquire,
        Request::Release { .. } => Operation::Release,
        Request::Retire { .. } => Operation::Retire,
        Request::ReclaimAck { .. } => Operation::ReclaimAck,
        Request::Usage => Operation::Usage,
        Request::PollTasks { .. } => Operation::PollTasks,
        Request::ClaimExtents { .. } | Request::Adopt { .. } => Operation::Rejoin,
    })
}
