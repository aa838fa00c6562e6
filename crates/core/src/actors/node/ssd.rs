//! The node's SSD pool: opens the store at start and registers it with the directory as a
//! pool private to the node (medium `ssd`), reports what a kept store still holds, and
//! carries out the directory's decisions on it: a demotion into the SSD pool spills the
//! replica's bytes (reserve → write → commit, so the replica is READY only once its write is
//! durable), a reclaim drops the object from the store, and every object the store itself
//! dropped to free a region (spilled by this process or adopted at a restart) is retired at
//! the directory, by its location. Disk I/O runs on blocking
//! threads; the store bounds what is in flight. Restores are in [`super::ssd_restore`].

use super::actor::commit_result;
use super::link::DirectoryLink;
use super::pool::{Bytes, Check};
use super::rejoin::paced;
use super::services::NodeServices;
use crate::backends::ssd::{PinnedObject, SsdConfig, SsdStore, StoredPlace};
use crate::directory::{AdoptOutcome, CommitOutcome, Holding};
use crate::metrics::ssd::SsdMetrics;
use crate::metrics::{Direction, Metrics};
use crate::model::{Location, ObjectId, PoolId, PoolSpec};
use crate::model::{ReplicaId, SessionId};
use crate::node::restores::RestoreClaims;
use crate::node::retirements::Retirements;
use crate::node::{after_commit, PagesAfterCommit};
use crate::protocol::messages::{DirectoryReply, DirectoryRequest};
use std::sync::{Arc, Mutex, MutexGuard};

/// A node's SSD store, its pool at the directory and its metrics.
pub struct NodeSsd {
    /// The store.
    pub store: SsdStore,
    /// Its metrics.
    pub metrics: SsdMetrics,
    /// The store's pool at the directory, as registered.
    pub registration: SsdRegistration,
    /// Restores in flight, joined by later loads and prefetches of the same object (the
    /// node core's books, bounded by [`crate::node::restores::RESTORES_IN_FLIGHT_MAX`]).
    pub(super) restoring: Mutex<RestoreClaims<tokio::sync::watch::Receiver<Option<bool>>>>,
    /// Replicas of objects the store dropped, still to retire at the directory (bounded by
    /// [`crate::node::retirements::RETIREMENTS_PENDING_MAX`]).
    retirements: Mutex<Retirements>,
}

/// What a node registers again for its SSD pool in each new session.
#[derive(Clone, Debug)]
pub struct SsdRegistration {
    /// The pool as registered, and its id.
    pub spec: PoolSpec,
    pub pool: PoolId,
    /// `[nodes.ssd] admit_after_accesses`.
    pub admit_after_accesses: u32,
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl NodeSsd {
    /// Exports the store's usage and counters.
    pub fn publish(&self) {
        self.metrics
            .publish(&self.store.usage(), self.store.counters());
    }

    /// The pool the store is registered as.
    pub fn pool(&self) -> PoolId {
        self.registration.pool
    }

    /// The location of an object stored at `place`, as the directory records it
    /// ([`StoredPlace::location`] in the store's pool).
    pub fn location_of(&self, place: StoredPlace) -> Location {
        place.location(self.pool())
    }

    /// Drops `object`, held at `location`, from the store (its replica was reclaimed or
    /// refused): its space comes back with its region.
    pub fn drop_object(&self, object: &ObjectId, location: &Location) {
        self.store
            .remove(object, &StoredPlace::of_location(location));
        self.publish();
    }
}

/// Opens the store of `config`, adopting or wiping what it holds, and registers it as the
/// pool `spec`. A store that cannot be opened (missing or read-only directory, full disk,
/// bad configuration) is logged and counted as a skipped spill; the node serves its memory
/// tiers without it.
pub async fn open(
    config: Option<&SsdConfig>,
    spec: Option<PoolSpec>,
    link: &DirectoryLink,
    metrics: &Metrics,
) -> anyhow::Result<Option<Arc<NodeSsd>>> {
    let (Some(config), Some(spec)) = (config.cloned(), spec) else {
        return Ok(None);
    };
    let ssd_metrics = SsdMetrics::register(metrics)?;
    let admit_after_accesses = config.admit_after_accesses;
    let opened = tokio::task::spawn_blocking(move || SsdStore::open(config)).await?;
    let (store, report) = match opened {
        Ok(opened) => opened,
        Err(error) => {
            tracing::warn!(%error, "the SSD store could not be opened; serving memory tiers only");
            ssd_metrics.skip(error.skip_reason());
            return Ok(None);
        }
    };
    tracing::info!(
        adopted = report.objects_adopted,
        torn = report.torn_objects,
        direct_io = report.direct_io,
        io_uring_fallback = ?report.io_uring_fallback,
        "SSD store open"
    );
    let pool = register(link, &spec, admit_after_accesses).await?;
    metrics.set_pool_capacity(pool, spec.medium, spec.capacity_bytes);
    let ssd = NodeSsd {
        store,
        metrics: ssd_metrics,
        registration: SsdRegistration {
            spec,
            pool,
            admit_after_accesses,
        },
        restoring: Mutex::default(),
        retirements: Mutex::default(),
    };
    ssd.publish();
    Ok(Some(Arc::new(ssd)))
}

/// Registers the SSD pool `spec` and its admission; returns its id.
pub async fn register(
    link: &DirectoryLink,
    spec: &PoolSpec,
    admit_after_accesses: u32,
) -> anyhow::Result<PoolId> {
    let DirectoryReply::Pool(pool) = link
        .send(DirectoryRequest::RegisterPool(spec.clone()))
        .await?
    else {
        anyhow::bail!("the SSD pool's registration got another reply");
    };
    let admission = DirectoryRequest::AdmitAfter {
        pool,
        accesses: admit_after_accesses,
    };
    link.send(admission).await?;
    Ok(pool)
}

/// Reports what a kept store holds to the directory, in bounded batches paced by it, as a
/// rejoin reports its pools: each object adopted becomes READY in the SSD pool (a probe
/// says it is on SSD). Objects refused (a namespace the directory does not know, a copy
/// already there) stay in the store unreported until its regions are reused. Returns how
/// many were adopted.
pub async fn report_stored(services: &NodeServices, ssd: &NodeSsd) -> usize {
    let holdings: Vec<Holding> = ssd
        .store
        .objects()
        .into_iter()
        .map(|(object, place)| Holding {
            object,
            location: ssd.location_of(place),
        })
        .collect();
    let batch = services.link.binding().batch_items_max.max(1);
    let mut adopted = 0;
    for chunk in holdings.chunks(batch) {
        let request = DirectoryRequest::Adopt {
            holdings: chunk.to_vec(),
        };
        let outcomes = match paced(services, request).await {
            Ok(DirectoryReply::Adopted(outcomes)) => outcomes,
            other => {
                tracing::warn!(?other, "the SSD store's objects could not be reported");
                break;
            }
        };
        for (holding, outcome) in chunk.iter().zip(outcomes) {
            if matches!(outcome, AdoptOutcome::Adopted | AdoptOutcome::Known) {
                services.published(holding.object, holding.location);
                adopted += 1;
            }
        }
    }
    tracing::info!(adopted, reported = holdings.len(), "SSD store reported");
    adopted
}

/// Carries out a demotion into the SSD pool: writes the source replica to the store (copied
/// straight from the pool's mapping, see [`stage`]) and commits the target at the object's
/// place there. On any failure the target is aborted and the spill counted as skipped.
pub async fn spill(
    services: &NodeServices,
    ssd: &Arc<NodeSsd>,
    session: SessionId,
    source: Location,
    target: ReplicaId,
) {
    let object = services.core().holdings.object_at(&source);
    let staged = match object {
        Some(object) => stage(services, ssd, object, source)
            .await
            .map(|pinned| (object, pinned)),
        None => Err("the source is not held here".into()),
    };
    let (object, pinned) = match staged {
        Ok(staged) => staged,
        Err(reason) => {
            tracing::debug!(%reason, ?source, "spill abandoned");
            services.link.abort(session, target).await;
            return;
        }
    };
    let location = ssd.location_of(pinned.place());
    let committed = services.link.commit(session, target, location).await;
    let published = matches!(committed, Ok(Some(CommitOutcome::Committed)));
    match after_commit(commit_result(committed)) {
        PagesAfterCommit::Published => {
            if published {
                services.published(object, location);
                services
                    .metrics
                    .add_bytes_moved(Direction::Spill, location.length_bytes);
            }
        }
        PagesAfterCommit::Keep => {}
        PagesAfterCommit::Free => ssd.drop_object(&object, &location),
        PagesAfterCommit::FreeAndAbort => {
            ssd.drop_object(&object, &location);
            services.link.abort(session, target).await;
        }
    }
    ssd.store.unpin(pinned);
    ssd.publish();
}

/// Writes the bytes at `source` to the store (unless it holds them already: content is
/// immutable) and returns where they are. The store copies the source straight from the
/// pool's mapping into its staging slot (one copy, checksummed as it goes), then the source
/// is checked still live at its generation (no byte came from reused pages). Retires what
/// the store dropped to make room. The object's region comes back pinned, so no other spill
/// reclaims it before the commit is handled: the caller unpins it on every path.
async fn stage(
    services: &NodeServices,
    ssd: &Arc<NodeSsd>,
    object: ObjectId,
    source: Location,
) -> Result<PinnedObject, String> {
    if let Some(pinned) = ssd.store.pin(&object) {
        if pinned.length_bytes == source.length_bytes {
            return Ok(pinned);
        }
        ssd.store.unpin(pinned);
    }
    let Some(pool) = services.pools.get(&source.pool).cloned() else {
        return Err("the source's pool is not mapped here".into());
    };
    let bytes = pool
        .send(Bytes)
        .await
        .map_err(|error| format!("reaching the source's pool failed: {error}"))?;
    let writer = ssd.clone();
    let written = tokio::task::spawn_blocking(move || {
        let data = bytes
            .slice(source.offset_bytes, source.length_bytes)
            .map_err(|error| format!("reading the source failed: {error}"))?;
        let mut batch = writer.store.write_batch(&[(object, data)]);
        Ok::<_, String>((batch.results.pop(), batch.evicted))
    })
    .await
    .map_err(|error| format!("the spill's I/O thread failed: {error}"))??;
    let (result, evicted) = written;
    retire_evicted(services, ssd, evicted).await;
    match result {
        Some(Ok(latency)) => ssd.metrics.observe_spill(latency),
        Some(Err(error)) => return Err(format!("spill skipped: {error}")),
        None => return Err("the store answered no result".into()),
    }
    let pinned = ssd
        .store
        .pin(&object)
        .ok_or("the store dropped the object at once")?;
    let checked = pool.send(Check { location: source }).await;
    if !matches!(checked, Ok(Ok(()))) {
        ssd.store.remove(&object, &pinned.place());
        ssd.store.unpin(pinned);
        return Err(format!(
            "the source was reused while it was read: {checked:?}"
        ));
    }
    Ok(pinned)
}

/// Retires at the directory the replicas of the objects the store dropped to free a
/// region (their bytes are gone), whether this process spilled them or adopted them at a
/// restart: each is named by its location and sent at once in batches of the link's bound,
/// so a probe stops reporting them as on SSD. Only these are sent here (a spill waits on
/// this call); a batch that fails is queued and sent again from the node's task loop
/// ([`retire_pending`]).
async fn retire_evicted(
    services: &NodeServices,
    ssd: &NodeSsd,
    evicted: Vec<(ObjectId, StoredPlace)>,
) {
    let holdings: Vec<Holding> = evicted
        .into_iter()
        .map(|(object, place)| Holding {
            object,
            location: ssd.location_of(place),
        })
        .collect();
    for holding in &holdings {
        services.core().holdings.freed(&holding.location);
    }
    let items = services.link.binding().batch_items_max.max(1);
    for batch in holdings.chunks(items) {
        if let Err(failure) = send_retirements(services, batch.to_vec()).await {
            let dropped = lock(&ssd.retirements).push(batch.to_vec());
            tracing::warn!(
                %failure,
                dropped,
                "retiring replicas the SSD dropped failed; sent again at the next task interval"
            );
        }
    }
    report_retirements(ssd);
}

/// Sends the retirements waiting, in batches of the link's bound, until one fails: what
/// failed waits for the next call (the node's task loop calls this every task interval),
/// each holding up to [`crate::node::retirements::RETIRE_ATTEMPTS_MAX`] sends.
pub async fn retire_pending(services: &NodeServices, ssd: &NodeSsd) {
    let items = services.link.binding().batch_items_max.max(1);
    loop {
        let Some(batch) = lock(&ssd.retirements).take(items) else {
            break;
        };
        let Err(failure) = send_retirements(services, batch.holdings.clone()).await else {
            continue;
        };
        let dropped = lock(&ssd.retirements).failed(batch);
        tracing::warn!(
            %failure,
            dropped,
            "retiring replicas the SSD dropped failed; sent again at the next task interval"
        );
        break;
    }
    report_retirements(ssd);
}

/// One `RetireHeld` for `holdings`: why it failed, when the directory refused it or the
/// link failed.
async fn send_retirements(services: &NodeServices, holdings: Vec<Holding>) -> Result<(), String> {
    match services
        .link
        .call(DirectoryRequest::RetireHeld { holdings })
        .await
    {
        Ok(DirectoryReply::Error(error)) => Err(format!("refused: {error:?}")),
        Ok(_) => Ok(()),
        Err(error) => Err(error.to_string()),
    }
}

/// Publishes the retirement queue's length and the holdings it gave up.
fn report_retirements(ssd: &NodeSsd) {
    let retirements = lock(&ssd.retirements);
    ssd.metrics
        .retirements(retirements.len(), retirements.dropped());
}
