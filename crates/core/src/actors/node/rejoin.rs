//! Rejoin: when its session is lost — the directory restarted, or fenced it — a node does
//! not exit and drop its cache. It stops serving (clients get misses and skipped stores),
//! opens a new session, registers its pools again under the same ids, claims the extents of
//! shared pools it still allocates in, and reports what it holds in bounded batches, paced
//! by the directory. Then it serves again. The rule that keeps this safe is in
//! `directory::adoption`. A node that was silent for its fence window gives up its shared
//! extents when the directory it was silent to answers again (it may have granted them to
//! another node meanwhile); a new incarnation cannot have, but one before it may have: the
//! node keeps the extents whose owner words in shared memory still name it
//! (`model::extent_owner`), however long the outage.

use super::link::{Binding, LinkError};
use super::pool::{DropExtent, HeldExtents, TakeExtent};
use super::services::NodeServices;
use crate::directory::{AdoptOutcome, DirectoryError, ExtentClaim};
use crate::metrics::link::RejoinCause;
use crate::model::extent_owner::{Ownership, TakeFrom};
use crate::model::{NodeId, PoolId, PoolSpec};
use crate::node::Liveness;
use crate::policy::profiles::Measurement;
use crate::protocol::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use std::time::Duration;
use thiserror::Error;

/// The first wait before opening a session again after a failure; doubled up to
/// [`REOPEN_BACKOFF_MAX`].
const REOPEN_BACKOFF_MIN: Duration = Duration::from_millis(100);
const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long one attempt to open a session may take (a directory that is down does not
/// answer the QUIC handshake at all).
const REOPEN_ATTEMPT_MAX: Duration = Duration::from_secs(5);
/// The first wait before sending a paced report again; doubled up to [`PACED_BACKOFF_MAX`].
const PACED_BACKOFF_MIN: Duration = Duration::from_millis(50);
const PACED_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// What a node registers again in each new session.
#[derive(Clone, Debug)]
pub struct Registration {
    /// The node's id, which a new session must give it again.
    pub node: NodeId,
    /// The CPU partitions as registered, each with the id its clients know it by.
    pub cpu_pools: Vec<(PoolSpec, PoolId)>,
    /// The shared pools the node maps, by name, with the ids its clients know them by.
    pub shared_pools: Vec<(String, PoolId)>,
    /// What the node measured of its pools.
    pub profiles: Vec<(PoolId, Measurement)>,
    /// The node's SSD pool, when it has one.
    pub ssd: Option<super::ssd::SsdRegistration>,
}

/// Why a rejoin could not keep the node's cache: the node stops.
#[derive(Debug, Error)]
pub enum RejoinError {
    /// The new directory gives this node or one of its pools another id (its configuration
    /// changed order): locations the engines hold would name other memory.
    #[error("the directory changed the id of {0}; restart the node to start afresh")]
    IdentityChanged(String),
    /// The directory refused a step of the rejoin.
    #[error("rejoin refused: {0}")]
    Refused(#[from] LinkError),
}

/// How a rejoin ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rejoined {
    pub adopted: usize,
    pub refused: usize,
    pub extents_kept: usize,
    pub extents_lost: usize,
}

/// Rejoins the directory (see the module documentation). Retries opening a session until
/// the directory answers, and starts over when the directory changes again during the
/// rejoin (a failover or a restart in the middle of it); returns once the node serves
/// again, or why it must stop.
pub async fn rejoin(
    services: &NodeServices,
    registration: &Registration,
) -> Result<Rejoined, RejoinError> {
    let link = &services.link;
    link.stop_serving();
    let mut lost = lose_session(services);
    services.link_metrics.rejoin_began(if lost.silent_too_long {
        RejoinCause::Silence
    } else {
        RejoinCause::Unknown
    });
    let mut rejoined = Rejoined::default();
    loop {
        let binding = reopen(services).await;
        tracing::info!(session = %binding.session, epoch = %binding.epoch, "rejoining the directory");
        // What this attempt keeps is counted afresh; losses add up.
        rejoined.adopted = 0;
        rejoined.extents_kept = 0;
        match rejoin_session(services, registration, &binding, &lost, &mut rejoined).await {
            Ok(()) => break,
            Err(error) if directory_changed(&error) => {
                tracing::warn!(%error, "the directory changed during the rejoin; rejoining again");
                lost = lose_session(services);
            }
            Err(error) => return Err(error),
        }
    }
    link.resume_serving();
    services
        .link_metrics
        .rejoin_ended(rejoined.extents_kept, rejoined.extents_lost);
    tracing::info!(
        adopted = rejoined.adopted,
        refused = rejoined.refused,
        extents_kept = rejoined.extents_kept,
        extents_lost = rejoined.extents_lost,
        "rejoined the directory: serving again"
    );
    Ok(rejoined)
}

/// The session a rejoin replaces: which, when it was lost, and whether the node had been
/// silent to it for its fence window.
struct LostSession {
    session: crate::model::SessionId,
    at: crate::model::Timestamp,
    silent_too_long: bool,
}

/// Forgets what only the current session could answer and says what was lost.
fn lose_session(services: &NodeServices) -> LostSession {
    let now = services.clock.now();
    let session = services.link.session();
    let mut core = services.core();
    let silent_too_long = core.liveness.may_be_fenced(now);
    core.session_lost();
    LostSession {
        session,
        at: now,
        silent_too_long,
    }
}

/// Whether a rejoin step failed because the directory went away or no longer knows the
/// new session (another failover or restart): the rejoin starts over, the node does not stop.
fn directory_changed(error: &RejoinError) -> bool {
    matches!(
        error,
        RejoinError::Refused(
            LinkError::Wire(_)
                | LinkError::Unreachable
                | LinkError::Refused(ProtocolError::Directory(
                    DirectoryError::UnknownSession | DirectoryError::Fenced { .. }
                ))
        )
    )
}

/// One attempt at rejoining in the session `binding` opened.
async fn rejoin_session(
    services: &NodeServices,
    registration: &Registration,
    binding: &Binding,
    lost: &LostSession,
    rejoined: &mut Rejoined,
) -> Result<(), RejoinError> {
    // The directory that may have fenced this node and granted its extents on is the one
    // it was silent to. A new incarnation (a restart, a standby elected) knows nothing of
    // that: the owner words in shared memory say which extents are still this node's.
    let fenced_here = binding.session.incarnation() == lost.session.incarnation();
    if lost.silent_too_long && fenced_here {
        rejoined.extents_lost += drop_shared_extents(services, registration).await;
    }
    register_again(services, registration, binding).await?;
    claim_extents(services, registration, lost.silent_too_long, rejoined).await?;
    // A replica the directory does not adopt may still be read under a lease of the lost
    // session's incarnation: its pages are freed once that lease must have ended.
    let free_refused_at = lost.at + binding.recovery_window;
    adopt(services, binding, free_refused_at, rejoined).await
}

/// Opens a new session, retrying with backoff while the directory is out of reach.
async fn reopen(services: &NodeServices) -> Binding {
    let mut backoff = REOPEN_BACKOFF_MIN;
    loop {
        let attempt = tokio::time::timeout(REOPEN_ATTEMPT_MAX, services.link.reopen()).await;
        match attempt.unwrap_or(Err(LinkError::Unexpected("opening timed out".into()))) {
            Ok(binding) => {
                let opened_at = services.clock.now() - binding.opened.elapsed();
                services.core().liveness = Liveness::new(opened_at, binding.fence_after);
                return binding;
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?backoff, "the directory is not reachable yet");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(REOPEN_BACKOFF_MAX);
            }
        }
    }
}

/// Registers the node's pools and namespaces again and checks every id is unchanged.
async fn register_again(
    services: &NodeServices,
    registration: &Registration,
    binding: &Binding,
) -> Result<(), RejoinError> {
    let link = &services.link;
    if binding.node != registration.node {
        return Err(RejoinError::IdentityChanged("this node".into()));
    }
    for (spec, id) in &registration.cpu_pools {
        match link
            .send(DirectoryRequest::RegisterPool(spec.clone()))
            .await?
        {
            DirectoryReply::Pool(pool) if pool == *id => {}
            _ => {
                return Err(RejoinError::IdentityChanged(format!(
                    "CPU partition `{}`",
                    spec.name
                )))
            }
        }
    }
    if let Some(ssd) = &registration.ssd {
        match super::ssd::register(link, &ssd.spec, ssd.admit_after_accesses).await {
            Ok(pool) if pool == ssd.pool => {}
            _ => return Err(RejoinError::IdentityChanged("the SSD pool".into())),
        }
    }
    if !registration.shared_pools.is_empty() {
        let DirectoryReply::Usage(listed) = link.send(DirectoryRequest::Usage).await? else {
            return Err(RejoinError::IdentityChanged("the shared pools".into()));
        };
        for (name, pool) in &registration.shared_pools {
            if !listed
                .iter()
                .any(|report| report.pool == *pool && report.spec.name == *name)
            {
                return Err(RejoinError::IdentityChanged(format!(
                    "shared pool `{name}`"
                )));
            }
        }
    }
    let namespaces = services.core().holdings.namespaces();
    for (id, descriptor) in namespaces {
        match link
            .send(DirectoryRequest::RegisterNamespace(descriptor.clone()))
            .await
        {
            Ok(DirectoryReply::Namespace(registered)) if registered == id => services
                .core()
                .holdings
                .namespace_registered(id, descriptor),
            other => tracing::warn!(?other, "a namespace could not be registered again"),
        }
    }
    for (pool, measured) in &registration.profiles {
        let request = DirectoryRequest::ReportProfile {
            pool: *pool,
            measured: *measured,
        };
        if let Err(error) = link.send(request).await {
            tracing::warn!(%error, ?pool, "a pool's profile could not be reported again");
        }
    }
    Ok(())
}

/// Claims the extents of every shared pool whose owner word still names this node (and,
/// after a silence past the fence window, only those the owner words track); the others,
/// and those the directory refuses, leave the allocator with their replicas.
async fn claim_extents(
    services: &NodeServices,
    registration: &Registration,
    silent_too_long: bool,
    rejoined: &mut Rejoined,
) -> Result<(), RejoinError> {
    let batch = services.link.batch_items_max().max(1);
    let node = registration.node;
    for (_, pool) in &registration.shared_pools {
        let Some(actor) = services.pools.get(pool) else {
            continue;
        };
        let mut held = Vec::new();
        for (offset_bytes, length_bytes) in actor.send(HeldExtents).await.unwrap_or_default() {
            let taken = actor
                .send(TakeExtent {
                    offset_bytes,
                    length_bytes,
                    node,
                    from: TakeFrom::Held,
                })
                .await
                .unwrap_or(Ownership::Untracked);
            let owner_word = match taken {
                Ownership::Taken(word) => Some(word),
                Ownership::Untracked if !silent_too_long => None,
                Ownership::Untracked | Ownership::Refused(_) => {
                    lose_extent(services, *pool, offset_bytes, length_bytes).await;
                    rejoined.extents_lost += 1;
                    continue;
                }
            };
            held.push(((offset_bytes, length_bytes), owner_word));
        }
        for chunk in held.chunks(batch) {
            let claims = chunk
                .iter()
                .map(|&((offset_bytes, _), owner_word)| ExtentClaim {
                    offset_bytes,
                    owner_word,
                })
                .collect();
            let request = DirectoryRequest::ClaimExtents {
                pool: *pool,
                claims,
            };
            let DirectoryReply::Claimed(answers) = paced(services, request).await? else {
                return Err(RejoinError::Refused(LinkError::Unexpected(
                    "claim answered with another reply".into(),
                )));
            };
            for (&((offset, length), _), claimed) in chunk.iter().zip(answers) {
                if claimed {
                    rejoined.extents_kept += 1;
                } else {
                    lose_extent(services, *pool, offset, length).await;
                    rejoined.extents_lost += 1;
                }
            }
        }
    }
    Ok(())
}

/// Gives up every extent of the shared pools: the node was silent long enough that the
/// directory may have granted them to others.
async fn drop_shared_extents(services: &NodeServices, registration: &Registration) -> usize {
    let mut lost = 0;
    for (_, pool) in &registration.shared_pools {
        let Some(actor) = services.pools.get(pool) else {
            continue;
        };
        for (offset, length) in actor.send(HeldExtents).await.unwrap_or_default() {
            lose_extent(services, *pool, offset, length).await;
            lost += 1;
        }
    }
    lost
}

/// Takes an extent the node may no longer write out of its allocator and its holdings.
async fn lose_extent(services: &NodeServices, pool: PoolId, offset_bytes: u64, length: u64) {
    if let Some(actor) = services.pools.get(&pool) {
        let _ = actor.send(DropExtent { offset_bytes }).await;
    }
    let forgotten = services
        .core()
        .holdings
        .extent_lost(pool, offset_bytes, length);
    tracing::warn!(
        ?pool,
        offset_bytes,
        forgotten,
        "an extent was not this node's any more"
    );
}

/// Reports the node's READY replicas in batches; those refused are forgotten, their pages
/// freed at `free_refused_at`.
async fn adopt(
    services: &NodeServices,
    binding: &Binding,
    free_refused_at: crate::model::Timestamp,
    rejoined: &mut Rejoined,
) -> Result<(), RejoinError> {
    let holdings = services.core().holdings.replicas();
    for chunk in holdings.chunks(binding.batch_items_max.max(1)) {
        let request = DirectoryRequest::Adopt {
            holdings: chunk.to_vec(),
        };
        let DirectoryReply::Adopted(outcomes) = paced(services, request).await? else {
            return Err(RejoinError::Refused(LinkError::Unexpected(
                "adopt answered with another reply".into(),
            )));
        };
        for (holding, outcome) in chunk.iter().zip(outcomes) {
            match outcome {
                AdoptOutcome::Adopted | AdoptOutcome::Known => rejoined.adopted += 1,
                AdoptOutcome::Refused => {
                    services
                        .core()
                        .holdings
                        .refused(holding.location, free_refused_at);
                    rejoined.refused += 1;
                }
            }
        }
    }
    Ok(())
}

/// Sends a rejoin report, waiting and sending it again while the directory paces.
pub(super) async fn paced(
    services: &NodeServices,
    request: DirectoryRequest,
) -> Result<DirectoryReply, LinkError> {
    let mut backoff = PACED_BACKOFF_MIN;
    loop {
        match services.link.send(request.clone()).await {
            Err(LinkError::Refused(ProtocolError::Directory(DirectoryError::Paced))) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(PACED_BACKOFF_MAX);
            }
            other => return other,
        }
    }
}
