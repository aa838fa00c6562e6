//! The dispatch of one request into the directory core: authentication by the peer's
//! certificate name (a node, or an operator), the session handshake (`Open`, `Resume`),
//! then one core call per operation. Pure: the caller supplies `now` and owns the core.

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

/// What the configuration makes a peer's certificate name.
#[derive(Clone, Debug)]
pub enum PeerRole {
    /// A node, with what it is granted.
    Node(NodeGrant),
    /// An operator (`[directory] operators`): the cluster's status, reload and drain, and
    /// nothing else. Only an operator may drain or reload: a node (and so any engine behind
    /// it) never can.
    Operator,
    /// A name the configuration does not know.
    Unknown,
}

/// Answers one request of peer `peer` (its certificate name, which the configuration makes
/// `role`), on a connection bound to `session` (`None` until its `Open` or `Resume`; an
/// operator never opens one). Every refusal is a typed [`ProtocolError`].
pub fn handle(
    core: &mut Directory,
    now: Timestamp,
    peer: &str,
    role: PeerRole,
    session: Option<SessionId>,
    request: DirectoryRequest,
) -> DirectoryReply {
    use DirectoryReply as Reply;
    use DirectoryRequest as Request;
    let grant = match role {
        PeerRole::Node(grant) => grant,
        PeerRole::Operator => return operator(core, request),
        PeerRole::Unknown => return Reply::Error(ProtocolError::UnknownPeer(peer.into())),
    };
    match (request, session) {
        (Request::Drain { .. } | Request::Reload, _) => Reply::Error(ProtocolError::NotPermitted(
            format!("`{peer}` is a node: drain and reload need an operator certificate"),
        )),
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

/// The requests of an operator's connection.
fn operator(core: &mut Directory, request: DirectoryRequest) -> DirectoryReply {
    use DirectoryReply as Reply;
    use DirectoryRequest as Request;
    match request {
        Request::ClusterStatus => Reply::ClusterStatus(cluster_status(core)),
        Request::Drain { node } => core.drain(&node).map_or_else(refused, Reply::Draining),
        // Reading the file is the directory process's: its actor answers before `handle`.
        Request::Reload => Reply::Error(ProtocolError::Reload(
            crate::directory::reload::ReloadRefusal::Invalid(
                "this directory has no file to reload".into(),
            ),
        )),
        Request::Hello(_) => Reply::Error(ProtocolError::Sequence("hello sent twice".into())),
        _ => Reply::Error(ProtocolError::NotPermitted(
            "an operator certificate makes operator requests only (status, reload, drain)".into(),
        )),
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
        Request::ReclaimAckMany { replicas } => {
            Reply::ReclaimedMany(core.reclaim_ack_many(session, &replicas)?)
        }
        Request::ClaimExtents { pool, claims } => {
            Reply::Claimed(core.claim_extents(session, pool, &claims)?)
        }
        Request::Adopt { holdings } => Reply::Adopted(core.adopt(now, session, &holdings)?),
        Request::AdmitAfter { pool, accesses } => {
            core.admit_after(session, pool, accesses)?;
            Reply::Pool(pool)
        }
        Request::ClusterStatus => Reply::ClusterStatus(cluster_status(core)),
        Request::Drain { .. } | Request::Reload => {
            unreachable!("operator requests are answered by `handle`")
        }
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
    use DirectoryRequest as Request;
    match request {
        Request::Probe { .. }
        | Request::Locate { .. }
        | Request::Acquire { .. }
        | Request::Release { .. }
        | Request::AcquireDelegating { .. }
        | Request::ReportHits { .. }
        | Request::Retire { .. }
        | Request::RetireHeld { .. } => reads(core, now, session, request),
        request => writes(core, now, session, request),
    }
}

/// The lookups, leases and retirements of a bound session.
fn reads(
    core: &mut Directory,
    now: Timestamp,
    session: SessionId,
    request: DirectoryRequest,
) -> Result<DirectoryReply, DirectoryError> {
    use DirectoryReply as Reply;
    use DirectoryRequest as Request;
    Ok(match request {
        Request::Probe { objects } => {
            Reply::Probed(core.probe_noting_demand(now, session, &objects)?)
        }
        Request::Locate { objects } => Reply::Located(core.locate(session, &objects)?),
        Request::Acquire { objects, mode } => {
            Reply::Acquired(core.acquire(now, session, &objects, mode)?)
        }
        Request::Release { leases } => Reply::Released(core.release(session, &leases)?),
        Request::AcquireDelegating { objects, mode } => {
            let (outcomes, delegations) = core.acquire_delegating(now, session, &objects, mode)?;
            Reply::AcquiredDelegating {
                outcomes,
                delegations,
            }
        }
        Request::ReportHits { hits } => {
            core.report_local_hits(now, session, &hits)?;
            Reply::HitsReported
        }
        Request::Retire {
            object,
            replica,
            released,
        } => {
            core.release(session, &released)?;
            Reply::Retired(core.retire_object(session, &object, replica)?)
        }
        Request::RetireHeld { holdings } => {
            Reply::RetiredHeld(core.retire_held(session, &holdings)?)
        }
        request => unreachable!("`data` sends {request:?} to `writes`"),
    })
}

/// The stores and extents of a bound session.
fn writes(
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
        Request::GrantExtent { operation, pool } => {
            Reply::Extent(core.grant_extent(now, session, operation, pool)?)
        }
        Request::ReturnExtent {
            operation,
            pool,
            offset_bytes,
            owner_word,
        } => {
            if let Some(word) = owner_word {
                core.learn_owner_word(session, pool, offset_bytes, word);
            }
            Reply::ExtentReturned(core.return_extent(
                now,
                session,
                operation,
                pool,
                offset_bytes,
            )?)
        }
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

/// Every pool of `core` and its usage, as `usage` reports it.
pub(crate) fn usage(core: &Directory) -> Vec<PoolUsageReport> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::DirectoryConfig;
    use crate::model::Medium;

    fn node() -> PeerRole {
        PeerRole::Node(NodeGrant {
            domains: Vec::new(),
            namespaces: NamespaceAccess::Any,
        })
    }

    fn refusal(reply: &DirectoryReply) -> Option<&ProtocolError> {
        match reply {
            DirectoryReply::Error(error) => Some(error),
            _ => None,
        }
    }

    /// The roles of the threat model: a node (and any engine behind it) never drains or
    /// reloads; an operator does nothing else; a stranger nothing at all.
    #[test]
    fn only_an_operator_drains_or_reloads_and_an_operator_does_nothing_else() {
        let mut core = Directory::new(DirectoryConfig::default());
        let now = Timestamp::ZERO;
        let open = DirectoryRequest::Open {
            write_order: vec![Medium::Cpu],
            read_order: vec![Medium::Cpu],
        };
        let session = match handle(&mut core, now, "node-a", node(), None, open.clone()) {
            DirectoryReply::Opened(opened) => opened.session,
            other => panic!("{other:?}"),
        };
        let drain = DirectoryRequest::Drain {
            node: "node-a".into(),
        };
        for request in [drain.clone(), DirectoryRequest::Reload] {
            for bound in [None, Some(session)] {
                let reply = handle(&mut core, now, "node-a", node(), bound, request.clone());
                assert!(
                    matches!(refusal(&reply), Some(ProtocolError::NotPermitted(_))),
                    "a node's {request:?}: {reply:?}"
                );
            }
        }
        let probe = DirectoryRequest::Probe {
            objects: Vec::new(),
        };
        for request in [open, probe] {
            let reply = handle(&mut core, now, "ops", PeerRole::Operator, None, request);
            assert!(
                matches!(refusal(&reply), Some(ProtocolError::NotPermitted(_))),
                "an operator's data request: {reply:?}"
            );
        }
        let status = DirectoryRequest::ClusterStatus;
        let reply = handle(&mut core, now, "ops", PeerRole::Operator, None, status);
        assert!(
            matches!(reply, DirectoryReply::ClusterStatus(_)),
            "{reply:?}"
        );
        let reply = handle(
            &mut core,
            now,
            "ops",
            PeerRole::Operator,
            None,
            drain.clone(),
        );
        assert!(matches!(reply, DirectoryReply::Draining(_)), "{reply:?}");
        let reply = handle(&mut core, now, "who", PeerRole::Unknown, None, drain);
        assert!(
            matches!(refusal(&reply), Some(ProtocolError::UnknownPeer(_))),
            "{reply:?}"
        );
    }
}
