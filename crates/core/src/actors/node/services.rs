//! What every actor of a node shares: the link to the directory, the pool actors, the node
//! core, the clock and the metrics; and the pool allocation path, which in a shared pool
//! asks the directory for another extent when the granted ones are full (for a client's
//! store, within that client's extent quota).

use super::link::DirectoryLink;
use super::pool::{AddExtent, Allocate, AllocateInNewExtent, Free, PoolActor, TakeExtent};
use crate::backends::{Allocation, PoolError};
use crate::directory::ExtentGrant;
use crate::metrics::Metrics;
use crate::model::extent_owner::{Ownership, TakeFrom};
use crate::model::{Clock, Location, ObjectId, PoolId, ReplicaId};
use crate::node::{
    AwaitedEnd, ClientId, ClientRefusal, ExtentAction, NodeCore, Reservation, Resolution, Taken,
};
use actix::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Why an allocation failed.
#[derive(Debug, thiserror::Error)]
pub enum AllocationRefused {
    /// The pool refused (full, or a bad length).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The pool is full and the client may not make the node ask for another extent now.
    #[error(transparent)]
    Client(ClientRefusal),
}

/// What the node shares with every client session and its node actor.
#[derive(Clone)]
pub struct NodeServices {
    pub link: Arc<DirectoryLink>,
    pub pools: HashMap<PoolId, Addr<PoolActor>>,
    /// What each admitted client is handed, by its tenant's salt group: that group's CPU
    /// partition and the CXL pools, never another tenant's partition.
    pub handoffs: Arc<super::partitions::Handoffs>,
    pub metrics: Arc<Metrics>,
    /// The delegation families of `metrics`.
    pub delegation_metrics: Arc<crate::metrics::delegation::NodeDelegationMetrics>,
    /// Whether the node's lookups reach the directory, and its outages.
    pub link_metrics: Arc<crate::metrics::link::NodeLinkMetrics>,
    /// The node's books; held only for the length of one core call.
    pub core: Arc<Mutex<NodeCore>>,
    /// The clock every core call is given.
    pub clock: Clock,
    /// The shared (CXL) pools among `pools`, whose pages come in extents, each with the
    /// lock that serializes this node's extent requests for it.
    pub shared_pools: HashMap<PoolId, Arc<tokio::sync::Mutex<()>>>,
    /// The node's SSD store (L2), when configured and usable.
    pub ssd: Option<Arc<super::ssd::NodeSsd>>,
    /// The node's peer endpoint (copies between nodes), when configured.
    pub peer: Option<Arc<super::peer::PeerTransport>>,
    /// The worker threads that copy between pools (demotions, replications into shared
    /// pools).
    pub copier: super::copy_engine::CopyEngine,
    /// Woken whenever an awaited reserve is answered ([`NodeCore::awaited`]).
    pub reserves_answered: Arc<tokio::sync::Notify>,
}

impl NodeServices {
    /// The reservation behind a ticket: made, or what its awaited reserve's answer says
    /// (waited for; taken once, so each ticket resolves its reservation exactly once).
    pub async fn resolve(&self, reservation: Reservation) -> Resolution {
        let (batch, index) = match reservation {
            Reservation::Made { session, replica } => return Resolution::Made { session, replica },
            Reservation::Awaited { batch, index } => (batch, index),
        };
        loop {
            let answered = self.reserves_answered.notified();
            tokio::pin!(answered);
            // Registered before the look, so an answer between the two is not missed.
            answered.as_mut().enable();
            // Taken before the match: the core's lock is not held across the wait.
            let taken = self.core().awaited.take(batch, index);
            match taken {
                Taken::Resolved(resolution) => return resolution,
                Taken::Unknown => {
                    let unknown = "the reserve of this grant is unknown to the node".to_string();
                    return Resolution::Ended(AwaitedEnd::Failed(unknown));
                }
                Taken::Waiting => answered.await,
            }
        }
    }

    /// Whether `pool` is this node's SSD pool.
    pub fn is_ssd_pool(&self, pool: PoolId) -> bool {
        self.ssd.as_ref().is_some_and(|ssd| ssd.pool() == pool)
    }

    /// When the directory answered `error` with `UnknownNamespace` (it forgot a namespace
    /// no replica named, or restarted), queues the node's `namespaces` to be registered
    /// again; the request itself was a miss or a skip (see [`LinkError::is_unavailable`]).
    pub fn reregister_if_unknown(
        &self,
        error: &super::link::LinkError,
        namespaces: impl IntoIterator<Item = crate::model::NamespaceId>,
    ) {
        use crate::directory::DirectoryError;
        use crate::protocol::messages::ProtocolError;
        if matches!(
            error,
            super::link::LinkError::Refused(ProtocolError::Directory(
                DirectoryError::UnknownNamespace
            ))
        ) {
            self.core().holdings.reregister(namespaces);
        }
    }

    /// The node core, for one call.
    pub fn core(&self) -> MutexGuard<'_, NodeCore> {
        lock_core(&self.core)
    }

    /// Releases at the directory the delegations the core no longer needs (recalled or
    /// superseded, with no local lease under them), and frees the owned replicas whose
    /// reclaim waited for their last local lease, off the caller's path.
    pub fn send_delegation_releases(&self) {
        let (releases, reclaims_ready, mark) = {
            let mut core = self.core();
            (
                core.delegations.take_releases(),
                core.delegations.take_reclaims_ready(),
                core.delegations.session_mark(),
            )
        };
        if releases.is_empty() && reclaims_ready.is_empty() {
            return;
        }
        let services = self.clone();
        actix_rt::spawn(async move {
            super::actor::reclaim_ready(&services, mark, reclaims_ready).await;
            for chunk in releases.chunks(services.link.batch_items_max().max(1)) {
                let leases = chunk.to_vec();
                // A delegation not released (the directory out of reach) ends at its deadline.
                let _ = services
                    .link
                    .call(crate::protocol::messages::DirectoryRequest::Release { leases })
                    .await;
            }
        });
    }

    /// A replica this node wrote was published at `location`: the node holds it, and
    /// reports it when it rejoins; `false` when its pages were freed already (a reclaim
    /// overtook the commit's answer: [`crate::node::Holdings::published`]).
    pub fn published(&self, object: ObjectId, location: Location) -> bool {
        self.core()
            .holdings
            .published(crate::directory::Holding { object, location })
    }

    /// What [`NodeServices::own`] is given for a commit, read before the commit is sent:
    /// the node core's session mark, or `None` while the node does not serve (its session
    /// is ending: a rejoin).
    pub fn owned_mark(&self) -> Option<u64> {
        let mark = self.core().delegations.session_mark();
        self.link.is_serving().then_some(mark)
    }

    /// A replica this node stored was published at `location`, its commit sent under
    /// `mark` ([`NodeServices::owned_mark`]): when it is in one of the node's CPU pools,
    /// its hits are answered here from now on ([`crate::node::Delegations::owned`]).
    pub fn own(&self, mark: Option<u64>, object: ObjectId, replica: ReplicaId, location: Location) {
        let Some(mark) = mark else {
            return;
        };
        if !self.pools.contains_key(&location.pool)
            || self.shared_pools.contains_key(&location.pool)
        {
            return;
        }
        let template = crate::directory::Lease {
            // A local lease gets an id of its own; the template's is never read.
            lease: crate::model::LeaseId(0),
            duration_ms: u64::try_from(self.link.binding().lease_duration.as_millis())
                .unwrap_or(u64::MAX),
            replica,
            medium: crate::model::Medium::Cpu,
            location,
            deadline: crate::model::Timestamp::ZERO,
        };
        self.core().delegations.owned(mark, object, template);
    }

    /// Frees an allocation this node holds; logs when the pool refuses.
    pub async fn free(&self, location: Location) {
        let object = {
            let mut core = self.core();
            let object = core.holdings.object_at(&location);
            core.holdings.freed(&location);
            object
        };
        if let (Some(ssd), Some(object)) = (&self.ssd, object) {
            if ssd.pool() == location.pool {
                ssd.drop_object(&object, &location);
                return;
            }
        }
        if let Some(pool) = self.pools.get(&location.pool) {
            let freed = pool
                .send(Free {
                    allocation: location.allocation,
                    generation: location.generation,
                })
                .await;
            if !matches!(freed, Ok(Ok(_))) {
                tracing::error!(?location, ?freed, "could not free an allocation");
            }
        }
    }

    /// Allocates in a pool; in a shared pool whose granted extents are full, asks the
    /// directory for another extent and retries. Extent requests of one pool are
    /// serialized, so a burst of stores that finds the extents full asks for one extent,
    /// not one each.
    pub async fn allocate(
        &self,
        actor: &Addr<PoolActor>,
        pool: PoolId,
        length_bytes: u64,
    ) -> Result<Result<Allocation, AllocationRefused>, MailboxError> {
        self.allocate_for(actor, pool, length_bytes, None).await
    }

    /// [`NodeServices::allocate`] for a store of `client`, whose extent quota an extent
    /// request must fit (`None`: the node's own copy, unbounded by any client).
    pub async fn allocate_for(
        &self,
        actor: &Addr<PoolActor>,
        pool: PoolId,
        length_bytes: u64,
        client: Option<ClientId>,
    ) -> Result<Result<Allocation, AllocationRefused>, MailboxError> {
        let first = actor.send(Allocate { length_bytes }).await?;
        let Some(extent_lock) = self.shared_pools.get(&pool) else {
            return Ok(first.map_err(AllocationRefused::Pool));
        };
        if !matches!(first, Err(PoolError::Full { .. })) {
            return Ok(first.map_err(AllocationRefused::Pool));
        }
        let _serialized = extent_lock.lock().await;
        let again = actor.send(Allocate { length_bytes }).await?;
        if !matches!(again, Err(PoolError::Full { .. })) {
            return Ok(again.map_err(AllocationRefused::Pool));
        }
        if let Some(client) = client {
            let now = self.clock.now();
            let admitted = self
                .core()
                .client(client)
                .map(|books| books.admit_extent(now));
            if let Some(Err(refusal)) = admitted {
                return Ok(Err(AllocationRefused::Client(refusal)));
            }
        }
        self.allocate_in_granted_extent(actor, pool, length_bytes, client, again)
            .await
    }

    /// The rest of [`NodeServices::allocate_for`] once the pool is full (`full`, its
    /// answer): asks the directory for an extent, takes it in shared memory (giving back
    /// one another node holds) and allocates in it; an extent this node cannot use goes
    /// back at once.
    async fn allocate_in_granted_extent(
        &self,
        actor: &Addr<PoolActor>,
        pool: PoolId,
        length_bytes: u64,
        client: Option<ClientId>,
        full: Result<Allocation, PoolError>,
    ) -> Result<Result<Allocation, AllocationRefused>, MailboxError> {
        let Ok(ExtentGrant::Granted(extent)) = self.link.grant_extent(pool).await else {
            // Only extents obtained count against the client's quota.
            if let Some(client) = client {
                if let Some(books) = self.core().client(client) {
                    books.extent_not_granted();
                }
            }
            return Ok(full.map_err(AllocationRefused::Pool));
        };
        let from = extent.owner_word.map_or(TakeFrom::Unknown, TakeFrom::Known);
        let taken = actor
            .send(TakeExtent {
                offset_bytes: extent.offset_bytes,
                length_bytes: extent.length_bytes,
                node: self.link.binding().node,
                from,
            })
            .await?;
        if let Ownership::Refused(found) = taken {
            // Another node's in shared memory: the directory never learnt its word (its
            // first grant of the extent since it started), or a node claimed it from
            // another incarnation since. Never written; given back with the word found.
            tracing::debug!(
                ?pool,
                offset_bytes = extent.offset_bytes,
                ?found,
                "a granted extent is another node's in shared memory; giving it back"
            );
            // Whatever the answer, it never enters the allocator.
            let _ = self
                .link
                .give_back_extent(pool, extent.offset_bytes, extent.length_bytes, Some(found))
                .await;
            return Ok(full.map_err(AllocationRefused::Pool));
        }
        let allocated = actor
            .send(AllocateInNewExtent {
                offset_bytes: extent.offset_bytes,
                length_bytes: extent.length_bytes,
                allocation_bytes: length_bytes,
            })
            .await?;
        match allocated {
            Ok(allocation) => Ok(Ok(allocation)),
            // In use now: an empty extent goes back on the node's next round.
            Err((error, true)) => Ok(Err(error.into())),
            Err((error, false)) => {
                // Never keep an extent this node cannot use: give it back.
                let word = match taken {
                    Ownership::Taken(word) => Some(word),
                    _ => None,
                };
                let action = self
                    .link
                    .give_back_extent(pool, extent.offset_bytes, extent.length_bytes, word)
                    .await;
                self.apply_extent_action(action).await;
                Ok(Err(error.into()))
            }
        }
    }
}

impl NodeServices {
    /// Puts an extent back into its pool's allocator when `action` says it is still ours.
    pub async fn apply_extent_action(&self, action: ExtentAction) {
        let ExtentAction::AddBack {
            pool,
            offset_bytes,
            length_bytes,
        } = action
        else {
            return;
        };
        let Some(actor) = self.pools.get(&pool) else {
            return;
        };
        let added = actor
            .send(AddExtent {
                offset_bytes,
                length_bytes,
            })
            .await;
        if !matches!(added, Ok(Ok(()))) {
            tracing::warn!(
                ?added,
                offset_bytes,
                "an extent could not go back into its allocator"
            );
        }
    }
}

/// Locks the node core. Poisoned only if a core assertion fired: a bug, which propagates.
pub fn lock_core(core: &Mutex<NodeCore>) -> MutexGuard<'_, NodeCore> {
    core.lock()
        .expect("node core poisoned by a failed invariant")
}
