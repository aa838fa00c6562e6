//! The node's SSD I/O: opens the store at start, spills a replica's bytes to it when the
//! directory has the replica reclaimed (outside any engine's store path), and restores
//! objects found only on the SSD into the node's CPU pool when a load misses, publishing
//! them through the directory like any store so the load then reads a hit. Disk I/O runs
//! on blocking threads; the store bounds what is in flight.

use super::actor::commit_result;
use super::pool::{ReadAt, WriteAt};
use super::services::NodeServices;
use crate::backends::ssd::{ReadOutcome, SsdConfig, SsdStore};
use crate::directory::{CommitOutcome, ReserveItem, ReserveOutcome};
use crate::metrics::ssd::SsdMetrics;
use crate::metrics::{Direction, Metrics};
use crate::model::{Location, ObjectId, ReplicaId, SessionId};
use crate::node::{after_commit, PagesAfterCommit};
use std::sync::Arc;

/// Objects restored by one load at most: one prefix's chunks, issued together.
pub const RESTORES_PER_LOAD_MAX: usize = 64;
/// How long a load waits for room in a pool to restore into: a few directory ticks, far
/// below the cost of recomputing a prefix.
const RESTORE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);
/// Pause between reservations a full pool skipped: one directory tick.
const RESTORE_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// A node's SSD store and its metrics.
pub struct NodeSsd {
    /// The store.
    pub store: SsdStore,
    /// Its metrics.
    pub metrics: SsdMetrics,
}

impl NodeSsd {
    /// Exports the store's usage and counters.
    pub fn publish(&self) {
        self.metrics
            .publish(&self.store.usage(), self.store.counters());
    }
}

/// Opens the store of `config`, adopting or wiping what it holds. A store that cannot be
/// opened (missing or read-only directory, full disk, bad configuration) is logged and
/// counted as a skipped spill; the node serves its memory tiers without it.
pub async fn open(
    config: Option<&SsdConfig>,
    metrics: &Metrics,
) -> anyhow::Result<Option<Arc<NodeSsd>>> {
    let Some(config) = config.cloned() else {
        return Ok(None);
    };
    let ssd_metrics = SsdMetrics::register(metrics)?;
    let opened = tokio::task::spawn_blocking(move || SsdStore::open(config)).await?;
    match opened {
        Ok((store, report)) => {
            tracing::info!(
                adopted = report.objects_adopted,
                torn = report.torn_objects,
                direct_io = report.direct_io,
                io_uring_fallback = ?report.io_uring_fallback,
                "SSD store open"
            );
            let ssd = NodeSsd {
                store,
                metrics: ssd_metrics,
            };
            ssd.publish();
            Ok(Some(Arc::new(ssd)))
        }
        Err(error) => {
            tracing::warn!(%error, "the SSD store could not be opened; serving memory tiers only");
            ssd_metrics.skip(error.skip_reason());
            Ok(None)
        }
    }
}

/// Spills the bytes of `object` at `location` (a replica about to be freed) to the SSD.
/// A spill that fails is skipped with its reason counted.
pub async fn spill(
    services: &NodeServices,
    ssd: &Arc<NodeSsd>,
    object: ObjectId,
    location: Location,
) {
    let Some(pool) = services.pools.get(&location.pool) else {
        return;
    };
    if ssd.store.length_of(&object) == Some(location.length_bytes) {
        // Already on the SSD (restored from it earlier): content is immutable.
        return;
    }
    let Ok(length) = usize::try_from(location.length_bytes) else {
        return;
    };
    let read = pool
        .send(ReadAt {
            offset_bytes: location.offset_bytes,
            buffer: vec![0; length],
        })
        .await;
    let Ok(Ok(bytes)) = read else {
        tracing::debug!(?location, "spill skipped: the pool could not be read");
        return;
    };
    let writer = ssd.clone();
    let written = tokio::task::spawn_blocking(move || {
        let mut batch = writer.store.write_batch(&[(object, bytes.as_slice())]);
        batch.results.pop()
    })
    .await;
    match written {
        Ok(Some(Ok(latency))) => {
            ssd.metrics.observe_spill(latency);
            services
                .metrics
                .add_bytes_moved(Direction::Spill, location.length_bytes);
        }
        Ok(Some(Err(error))) => tracing::debug!(%error, "spill skipped"),
        _ => tracing::warn!("the spill's I/O thread failed"),
    }
    ssd.publish();
}

/// A restore in progress: the reservation and the pages it fills.
struct Restoring {
    object: ObjectId,
    replica: ReplicaId,
    location: Location,
}

/// Restores the objects of `objects` the SSD holds into a pool the directory grants on
/// this node (at most [`RESTORES_PER_LOAD_MAX`], read together), and publishes each.
/// Returns how many were published; the caller acquires them again.
pub async fn restore(services: &NodeServices, ssd: &Arc<NodeSsd>, objects: &[ObjectId]) -> usize {
    let session = services.link.session();
    // One deadline for the whole load: its restores wait for room together.
    let deadline = tokio::time::Instant::now() + RESTORE_WAIT;
    let mut restoring = Vec::new();
    for object in objects.iter().take(RESTORES_PER_LOAD_MAX) {
        let Some(length_bytes) = ssd.store.length_of(object) else {
            continue;
        };
        if let Some(granted) = reserve(services, *object, length_bytes, deadline).await {
            restoring.push(granted);
        }
    }
    if restoring.is_empty() {
        return 0;
    }
    let reader = ssd.clone();
    let ids: Vec<ObjectId> = restoring.iter().map(|item| item.object).collect();
    let read = tokio::task::spawn_blocking(move || {
        let mut found: Vec<Option<Vec<u8>>> = vec![None; ids.len()];
        let outcomes = reader
            .store
            .read_batch(&ids, |index, bytes| found[index] = Some(bytes.to_vec()));
        (outcomes, found)
    })
    .await;
    let (outcomes, found) = match read {
        Ok(read) => read,
        Err(_) => (Vec::new(), vec![None; restoring.len()]),
    };
    let mut published = 0;
    for (index, (item, bytes)) in restoring.into_iter().zip(found).enumerate() {
        if let Some(ReadOutcome::Hit { latency }) = outcomes.get(index) {
            ssd.metrics.observe_restore(*latency);
        }
        let written = match (bytes, services.pools.get(&item.location.pool)) {
            (Some(bytes), Some(pool)) => matches!(
                pool.send(WriteAt {
                    offset_bytes: item.location.offset_bytes,
                    bytes,
                })
                .await,
                Ok(Ok(_))
            ),
            _ => false,
        };
        if !written {
            services.free(item.location).await;
            services.link.abort(session, item.replica).await;
        } else if publish(services, session, &item).await {
            published += 1;
            services
                .metrics
                .add_bytes_moved(Direction::Restore, item.location.length_bytes);
        }
    }
    ssd.publish();
    published
}

/// Reserves a replica of `object` and allocates its pages in the granted pool, asking
/// again while a full pool skips the reservation, until `deadline`.
async fn reserve(
    services: &NodeServices,
    object: ObjectId,
    length_bytes: u64,
    deadline: tokio::time::Instant,
) -> Option<Restoring> {
    let session = services.link.session();
    let item = ReserveItem {
        object,
        length_bytes,
    };
    // A full pool skips the reservation and makes room (its owner reclaims): ask again.
    let (replica, pool) = loop {
        match services.link.reserve(item).await {
            Ok(ReserveOutcome::Granted { replica, pool, .. }) => break (replica, pool),
            Ok(ReserveOutcome::Skip) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(RESTORE_RETRY).await;
            }
            _ => return None,
        }
    };
    let allocated = match services.pools.get(&pool) {
        Some(actor) => services.allocate_for(actor, pool, length_bytes, None).await,
        None => {
            services.link.abort(session, replica).await;
            return None;
        }
    };
    let Ok(Ok(allocation)) = allocated else {
        services.link.abort(session, replica).await;
        return None;
    };
    Some(Restoring {
        object,
        replica,
        location: Location {
            pool,
            allocation: allocation.id,
            generation: allocation.generation,
            offset_bytes: allocation.offset,
            length_bytes,
        },
    })
}

/// Commits a written restore; its pages follow the node core's rule for the outcome. True
/// when it is published.
async fn publish(services: &NodeServices, session: SessionId, item: &Restoring) -> bool {
    let committed = services
        .link
        .commit(session, item.replica, item.location)
        .await;
    let published = matches!(committed, Ok(Some(CommitOutcome::Committed)));
    match after_commit(commit_result(committed)) {
        PagesAfterCommit::Published => {
            if published {
                services.published(item.object, item.location);
            }
        }
        PagesAfterCommit::Keep => {}
        PagesAfterCommit::Free => services.free(item.location).await,
        PagesAfterCommit::FreeAndAbort => {
            services.free(item.location).await;
            services.link.abort(session, item.replica).await;
        }
    }
    published
}
