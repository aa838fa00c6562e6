//! The dispatch of one node request into the directory core: authentication by the peer's
//! certificate name, the session handshake (`Open`, `Resume`), then one core call per
//! operation. Pure: the caller supplies `now` and owns the core.

use super::messages::{
    ClusterStatus, DirectoryReply, DirectoryRequest, PoolUsageReport, ProtocolError,
};
use crate::directory::{Directory, DirectoryError, NamespaceAccess, OpenRequest};
use crate::model::{DomainId, SessionId, Timestamp};
use crate::policy::profiles::Measurement;

/// What the operator's configuration grants a node: its domains and namespaces.
#[derive(Clone, Debug)]
pub struct NodeGrant {
    pub domains: Vec<DomainId>,
    pub namespaces: NamespaceAccess,
}

/// Answers one request of peer `peer` (its certificate name; `grant` is `None` for a peer
/// the configuration does not name), on a connection bound to `session` (`None` until its
/// `Open` or `Resume`). Every refusal is a typed [`ProtocolError`].
pub fn handle(
    core: &mut Directory,
    now: Timestamp,
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
    match (request, session) {
        (Request::Open { .. }, Some(_)) => Reply::Error(ProtocolError::Sequence(
            "open sent twice on one connection".into(),
        )),
        (
            Request::Open {
                write_order,
                read_order,
            },
            None,
        ) => {
            let open = OpenRequest {
                node_name: peer.into(),
                write_order,
                read_order,
                domains: grant.domains,
                namespaces: grant.namespaces,
            };
            core.open(now, open).map_or_else(refused, Reply::Opened)
        }
        (Request::Resume { .. }, Some(_)) => Reply::Error(ProtocolError::Sequence(
            "resume on a bound connection".into(),
        )),
        (Request::Resume { session: resumed }, None) => {
            if core.session_node_name(resumed) != Some(peer) {
                return refused(DirectoryError::UnknownSession);
            }
            core.heartbeat(now, resumed, None)
                .map_or_else(refused, |_| Reply::Resumed(resumed))
        }
        (Request::Hello(_), _) => Reply::Error(ProtocolError::Sequence("hello sent twice".into())),
        (_, None) => Reply::Error(ProtocolError::Sequence("operation before open".into())),
        (request, Some(session)) => bound(core, now, session, request).unwrap_or_else(refused),
    }
}

fn refused(error: DirectoryError) -> DirectoryReply {
    DirectoryReply::Error(ProtocolError::Directory(error))
}

/// One operation of a bound session.
fn bound(
    core: &mut Directory,
    now: Timestamp,
    session: SessionId,
    request: DirectoryRequest,
) -> Result<DirectoryReply, DirectoryError> {
    use DirectoryReply as Reply;
    use DirectoryRequest as Request;
    Ok(match request {
        Request::Hello(_) | Request::Open { .. } | Request::Resume { .. } => {
            unreachable!("handshake requests are answered by `handle`")
        }
        Request::Heartbeat {
            acknowledged_through,
        } => Reply::Alive(core.heartbeat(now, session, acknowledged_through)?),
        Request::Close => {
            core.close(now, session)?;
            Reply::Closed
        }
        Request::RegisterPool(spec) => Reply::Pool(core.register_pool(Some(session), spec)?),
        Request::RegisterNamespace(descriptor) => {
            Reply::Namespace(core.register_namespace(session, descriptor)?)
        }
        Request::ReportProfile { pool, measured } => {
            let profile = core.report_profile(session, pool, measured)?;
            Reply::Profile(Measurement::of(&profile))
        }
        Request::Usage => Reply::Usage(usage(core)),
        // The wait of `AwaitTasks` is the session actor's: the core answers it as a poll.
        Request::PollTasks { max } | Request::AwaitTasks { max, .. } => {
            Reply::Tasks(core.poll_tasks(now, session, max)?)
        }
        Request::ReclaimAck { replica } => Reply::Reclaimed(core.reclaim_ack(session, replica)?),
        Request::ClaimExtents { pool, offsets } => {
            Reply::Claimed(core.claim_extents(session, pool, &offsets)?)
        }
        Request::Adopt { holdings } => Reply::Adopted(core.adopt(now, session, &holdings)?),
        Request::AdmitAfter { pool, accesses } => {
            core.admit_after(session, pool, accesses)?;
            Reply::Pool(pool)
        }
        Request::ClusterStatus => Reply::ClusterStatus(cluster_status(core)),
        Request::Drain { node } => Reply::Draining(core.drain(&node)?),
        // Reading the file is the directory process's: its actor answers before `handle`.
        Request::Reload => Reply::Error(ProtocolError::Reload(
            crate::reload::ReloadRefusal::Invalid("this directory has no file to reload".into()),
        )),
        request => return data(core, now, session, request),
    })
}

/// The store, load and extent operations of a bound session.
fn data(
    core: &mut Directory,
    now: Timestamp,
    session: SessionId,
    request: DirectoryRequest,
) -> Result<DirectoryReply, DirectoryError> {
    use DirectoryReply as Reply;
    use DirectoryRequest as Request;
    Ok(match request {
        Request::Reserve { operation, item } => {
            Reply::Reserved(core.reserve(now, session, operation, item)?)
        }
        Request::Commit {
            operation,
            replica,
            location,
        } => Reply::Committed(core.commit(now, session, operation, replica, location)?),
        Request::Resolve { target, operation } => {
            Reply::Resolved(core.resolve(session, target, operation)?)
        }
        Request::Abort { replica } => Reply::Aborted(core.abort(session, replica)?),
        Request::Probe { objects } => {
            Reply::Probed(core.probe_noting_demand(now, session, &objects)?)
        }
        Request::Acquire { objects, mode } => {
            Reply::Acquired(core.acquire(now, session, &objects, mode)?)
        }
        Request::Release { leases } => Reply::Released(core.release(session, &leases)?),
        Request::Retire { object, replica } => {
            Reply::Retired(core.retire_object(session, &object, replica)?)
        }
        Request::RetireHeld { holdings } => {
            Reply::RetiredHeld(core.retire_held(session, &holdings)?)
        }
        Request::GrantExtent { operation, pool } => {
            Reply::Extent(core.grant_extent(now, session, operation, pool)?)
        }
        Request::ReturnExtent {
            operation,
            pool,
            offset_bytes,
        } => Reply::ExtentReturned(core.return_extent(
            now,
            session,
            operation,
            pool,
            offset_bytes,
        )?),
        Request::ReserveMany { items } => {
            Reply::ReservedMany(core.reserve_many(now, session, &items)?)
        }
        Request::CommitMany { items } => {
            Reply::CommittedMany(core.commit_many(now, session, &items)?)
        }
        request => unreachable!("`bound` answers {request:?}"),
    })
}

/// Every node and pool, as `kvtier ctl status` shows them.
pub fn cluster_status(core: &Directory) -> ClusterStatus {
    ClusterStatus {
        nodes: core.node_statuses(),
        pools: usage(core),
    }
}

fn usage(core: &Directory) -> Vec<PoolUsageReport> {
    core.usage()
        .into_iter()
        .map(|report| PoolUsageReport {
            pool: report.pool,
            spec: report.spec,
            usage: report.usage,
            profile: Measurement::of(&report.profile),
        })
        .collect()
}
