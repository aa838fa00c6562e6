//! The `DirectoryActor`: owns the directory core and serializes every change of lease and
//! publication state. Session actors send it [`Call`]s; a timer advances the core's time.

use crate::directory::NamespaceAccess;
use crate::directory::{Directory, DirectoryCounts, DirectoryError, OpenRequest, PoolReport};
use crate::metrics::{Metrics, Operation, PoolByteState, SessionState as SessionLabel};
use crate::model::{Clock, DomainId, Medium, PoolUsage, SessionId};
use crate::policy::profiles::Measurement;
use crate::wire::messages::{DirectoryReply, DirectoryRequest, PoolUsageReport, ProtocolError};
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls queued for the directory actor; a full mailbox makes session actors wait, which
/// stops them reading frames, which pushes back on the nodes.
pub const MAILBOX_CAPACITY: usize = 4096;

/// What the operator's configuration grants a node: its domains and namespaces.
#[derive(Clone, Debug)]
pub struct NodeGrant {
    pub domains: Vec<DomainId>,
    pub namespaces: NamespaceAccess,
}

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
        let reply = apply(
            &mut self.core,
            self.clock.now(),
            &call.peer,
            grant,
            call.session,
            call.request,
        );
        let error = match &reply {
            DirectoryReply::Error(error) => Some(error_label(error)),
            _ => None,
        };
        if let Some(operation) = operation {
            self.metrics
                .observe_request(operation, started.elapsed(), error);
        }
        MessageResult(reply)
    }
}

/// Maps one request onto the core. `session` is `None` until the connection's `Open`.
fn apply(
    core: &mut Directory,
    now: crate::model::Timestamp,
    peer: &str,
    grant: Option<NodeGrant>,
    session: Option<SessionId>,
    request: DirectoryRequest,
) -> DirectoryReply {
    use DirectoryReply as Reply;
    use DirectoryRequest as Request;
    let Some(grant) = grant else {
        return Reply::Error(ProtocolError::UnknownPeer(peer.into()));
    };
    if let Request::Open {
        write_order,
        read_order,
    } = request
    {
        if session.is_some() {
            return Reply::Error(ProtocolError::Sequence(
                "open sent twice on one connection".into(),
            ));
        }
        let open = OpenRequest {
            node_name: peer.into(),
            write_order,
            read_order,
            domains: grant.domains,
            namespaces: grant.namespaces,
        };
        return core.open(now, open).map_or_else(
            |error| Reply::Error(ProtocolError::Directory(error)),
            Reply::Opened,
        );
    }
    if let Request::Resume { session: resumed } = request {
        if session.is_some() {
            return Reply::Error(ProtocolError::Sequence(
                "resume on a bound connection".into(),
            ));
        }
        if core.session_node_name(resumed) != Some(peer) {
            return Reply::Error(ProtocolError::Directory(DirectoryError::UnknownSession));
        }
        return core.heartbeat(now, resumed, None).map_or_else(
            |error| Reply::Error(ProtocolError::Directory(error)),
            |_| Reply::Resumed(resumed),
        );
    }
    let Some(session) = session else {
        return Reply::Error(ProtocolError::Sequence("operation before open".into()));
    };
    let result = match request {
        Request::Hello(_) => {
            return Reply::Error(ProtocolError::Sequence("hello sent twice".into()))
        }
        Request::Open { .. } | Request::Resume { .. } => unreachable!("handled above"),
        Request::Heartbeat {
            acknowledged_through,
        } => core
            .heartbeat(now, session, acknowledged_through)
            .map(Reply::Alive),
        Request::Close => core.close(now, session).map(|()| Reply::Closed),
        Request::RegisterPool(spec) => core.register_pool(Some(session), spec).map(Reply::Pool),
        Request::RegisterNamespace(descriptor) => core
            .register_namespace(session, descriptor)
            .map(Reply::Namespace),
        Request::Reserve { operation, item } => core
            .reserve(now, session, operation, item)
            .map(Reply::Reserved),
        Request::Commit {
            operation,
            replica,
            location,
        } => core
            .commit(now, session, operation, replica, location)
            .map(Reply::Committed),
        Request::Resolve { target, operation } => core
            .resolve(session, target, operation)
            .map(Reply::Resolved),
        Request::Probe { objects } => core.probe(session, &objects).map(Reply::Probed),
        Request::Acquire { objects, mode } => core
            .acquire(now, session, &objects, mode)
            .map(Reply::Acquired),
        Request::Release { leases } => core.release(session, &leases).map(Reply::Released),
        Request::Retire { replica } => core.retire(Some(session), replica).map(Reply::Retired),
        Request::ReclaimAck { replica } => core.reclaim_ack(session, replica).map(Reply::Reclaimed),
        Request::Abort { replica } => core.abort(session, replica).map(Reply::Aborted),
        Request::GrantExtent { operation, pool } => core
            .grant_extent(now, session, operation, pool)
            .map(Reply::Extent),
        Request::ReturnExtent { pool, offset_bytes } => core
            .return_extent(session, pool, offset_bytes)
            .map(Reply::ExtentReturned),
        Request::PollTasks { max } => core.poll_tasks(now, session, max).map(Reply::Tasks),
        Request::ReportProfile { pool, measured } => core
            .report_profile(session, pool, measured)
            .map(|profile| Reply::Profile(Measurement::of(&profile))),
        Request::Usage => Ok(Reply::Usage(
            core.usage()
                .into_iter()
                .map(|report| PoolUsageReport {
                    pool: report.pool,
                    spec: report.spec,
                    usage: report.usage,
                    profile: Measurement::of(&report.profile),
                })
                .collect(),
        )),
    };
    result.unwrap_or_else(|error| Reply::Error(ProtocolError::Directory(error)))
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
    })
}

/// A bounded label for an error (the variant, never its payload).
pub fn error_label(error: &ProtocolError) -> &'static str {
    use DirectoryError as Error;
    match error {
        ProtocolError::Directory(error) => match error {
            Error::UnknownSession => "unknown_session",
            Error::Fenced { .. } => "fenced",
            Error::Full(_) => "full",
            Error::BatchTooLarge { .. } => "batch_too_large",
            Error::InvalidNamespace(_) => "invalid_namespace",
            Error::UnknownNamespace => "unknown_namespace",
            Error::NamespaceDenied => "namespace_denied",
            Error::UnknownPool => "unknown_pool",
            Error::InvalidPool(_) => "invalid_pool",
            Error::InvalidProfile(_) => "invalid_profile",
            Error::UnknownReplica(_) => "unknown_replica",
            Error::NotOwner(_) => "not_owner",
            Error::InvalidState { .. } => "invalid_state",
            Error::LocationMismatch(_) => "location_mismatch",
            Error::InvalidLength { .. } => "invalid_length",
            Error::OperationAcknowledged(_) => "operation_acknowledged",
            Error::ForeignSession => "foreign_session",
            Error::NotDrained { .. } => "not_drained",
        },
        ProtocolError::UnsupportedVersion { .. } => "unsupported_version",
        ProtocolError::Sequence(_) => "sequence",
        ProtocolError::Malformed(_) => "malformed",
        ProtocolError::UnknownPeer(_) => "unknown_peer",
        ProtocolError::Busy => "busy",
        ProtocolError::Node(_) => "node",
    }
}
