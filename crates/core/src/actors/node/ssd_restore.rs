//! Restores from the node's SSD: objects found only there are read back into a pool the
//! directory grants on this node and published like any store, so a load then reads a hit.
//! A load that misses restores what it missed and waits, up to a deadline; a prefetch
//! starts restores and returns at once. Each object is restored once at a time: a load or
//! prefetch of an object already being restored joins that restore. The objects of one
//! call (one prefix's chunks) are read together. Restores run on their own tasks and the
//! store's blocking threads, so they never block other clients' loads.

use super::actor::commit_result;
use super::pool::Bytes;
use super::services::NodeServices;
use super::ssd::NodeSsd;
use crate::backends::ssd::ReadOutcome;
use crate::backends::PoolBackend;
use crate::directory::{AcquireMode, AcquireOutcome, CommitOutcome, ProbeOutcome};
use crate::directory::{ReserveItem, ReserveOutcome};
use crate::metrics::Direction;
use crate::model::{Location, ObjectId, PoolId, ReplicaId, SessionId};
use crate::node::restores::restore_verified;
use crate::node::{after_commit, PagesAfterCommit};
use crate::protocol::messages::{DirectoryReply, DirectoryRequest};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long a load waits for room in a pool to restore into: a few directory ticks, far
/// below the cost of recomputing a prefix.
pub const RESTORE_WAIT: Duration = Duration::from_millis(500);
/// How long a load waits for a restore another load or a prefetch started.
const JOIN_WAIT: Duration = Duration::from_secs(2);
/// Pause between reservations a full pool skipped: one directory tick.
const RESTORE_RETRY: Duration = Duration::from_millis(20);

/// A restore this call started: when it ends, whether it was published goes to those that
/// joined it.
struct Claim {
    object: ObjectId,
    done: watch::Sender<Option<bool>>,
}

/// Claims what the node's restore books ([`crate::node::restores::RestoreClaims`]) give
/// this call of `objects` (those the store holds and no restore is under way for, within
/// the bounds); returns the claims and the restores under way this call joins.
fn claim(ssd: &NodeSsd, objects: &[ObjectId]) -> (Vec<Claim>, Vec<watch::Receiver<Option<bool>>>) {
    let mut senders = HashMap::new();
    let claimed = super::ssd::lock(&ssd.restoring).claim(
        objects,
        |object| ssd.store.length_of(object).is_some(),
        |object| {
            let (done, receiver) = watch::channel(None);
            senders.insert(object, done);
            receiver
        },
    );
    let claims = claimed
        .claimed
        .into_iter()
        .filter_map(|object| {
            let done = senders.remove(&object)?;
            Some(Claim { object, done })
        })
        .collect();
    (claims, claimed.joined)
}

/// Restores `claims` and tells those who joined; returns how many were published.
async fn run_claims(services: &NodeServices, ssd: &Arc<NodeSsd>, claims: Vec<Claim>) -> usize {
    let objects: Vec<ObjectId> = claims.iter().map(|claim| claim.object).collect();
    let published = restore_claimed(services, ssd, &objects).await;
    let mut restoring = super::ssd::lock(&ssd.restoring);
    let mut count = 0;
    for claim in claims {
        restoring.finish(&claim.object);
        let done = published.contains(&claim.object);
        count += usize::from(done);
        claim.done.send_replace(Some(done));
    }
    count
}

/// Restores what the SSD holds of `objects`, joining restores under way, and waits for
/// them. Returns how many were published (by this call or one it joined).
pub async fn restore(services: &NodeServices, ssd: &Arc<NodeSsd>, objects: &[ObjectId]) -> usize {
    let (claims, joined) = claim(ssd, objects);
    let mut published = run_claims(services, ssd, claims).await;
    let deadline = tokio::time::Instant::now() + JOIN_WAIT;
    for mut receiver in joined {
        let waited = tokio::time::timeout_at(deadline, receiver.wait_for(Option::is_some)).await;
        if matches!(waited, Ok(Ok(done)) if *done == Some(true)) {
            published += 1;
        }
    }
    published
}

/// Starts restoring the objects of `objects` that only the node's SSD holds (the directory
/// probes them on SSD) and returns how many restores it started, without waiting for them.
pub async fn prefetch(services: &NodeServices, objects: &[ObjectId]) -> u32 {
    let Some(ssd) = services.ssd.clone() else {
        return 0;
    };
    let request = DirectoryRequest::Probe {
        objects: objects.to_vec(),
    };
    let Ok(DirectoryReply::Probed(outcomes)) = services.link.call(request).await else {
        return 0;
    };
    let on_ssd: Vec<ObjectId> = objects
        .iter()
        .zip(outcomes)
        .filter(|(_, outcome)| matches!(outcome, ProbeOutcome::OnSsd { .. }))
        .map(|(object, _)| *object)
        .collect();
    let (claims, _) = claim(&ssd, &on_ssd);
    let started = claims.len() as u32;
    if started > 0 {
        let services = services.clone();
        tokio::spawn(async move { run_claims(&services, &ssd, claims).await });
    }
    started
}

/// Restores the missed objects the node's SSD holds into a pool and acquires them again:
/// the missed items (each mode), or the whole manifest (a manifest leases all or none).
pub async fn restore_misses(
    services: &NodeServices,
    objects: &[ObjectId],
    mode: AcquireMode,
    mut outcomes: Vec<AcquireOutcome>,
) -> Vec<AcquireOutcome> {
    let Some(ssd) = &services.ssd else {
        return outcomes;
    };
    let missed: Vec<usize> = (0..objects.len())
        .filter(|index| matches!(outcomes.get(*index), Some(AcquireOutcome::Miss)))
        .filter(|index| ssd.store.length_of(&objects[*index]).is_some())
        .collect();
    if missed.is_empty() {
        return outcomes;
    }
    let wanted: Vec<_> = missed.iter().map(|index| objects[*index]).collect();
    if restore(services, ssd, &wanted).await == 0 {
        return outcomes;
    }
    let (again, positions) = match mode {
        AcquireMode::Manifest => (objects.to_vec(), (0..objects.len()).collect()),
        AcquireMode::Each => (wanted, missed),
    };
    let request = DirectoryRequest::Acquire {
        objects: again,
        mode,
    };
    if let Ok(DirectoryReply::Acquired(second)) = services.link.call(request).await {
        for (position, outcome) in positions.into_iter().zip(second) {
            if let Some(slot) = outcomes.get_mut(position) {
                *slot = outcome;
            }
        }
    }
    outcomes
}

/// A restore in progress: the reservation and the pages it fills.
struct Restoring {
    object: ObjectId,
    replica: ReplicaId,
    location: Location,
}

/// Restores `objects` (claimed by this call) into a pool the directory grants on this node,
/// read together, and publishes each. Returns the objects published.
async fn restore_claimed(
    services: &NodeServices,
    ssd: &Arc<NodeSsd>,
    objects: &[ObjectId],
) -> Vec<ObjectId> {
    let session = services.link.session();
    let restoring = reserve_claimed(services, ssd, objects).await;
    if restoring.is_empty() {
        return Vec::new();
    }
    let targets = restore_targets(services, &restoring).await;
    let (outcomes, written) = read_into_targets(ssd, &restoring, targets).await;
    let mut published = Vec::new();
    for (index, (item, whole)) in restoring.into_iter().zip(written).enumerate() {
        // The sink wrote the bytes before the checksum's verdict: only a verified object
        // written whole at the length the directory reserved is published.
        let outcome = outcomes.get(index);
        if let Some(ReadOutcome::Hit { latency }) = outcome {
            ssd.metrics.observe_restore(*latency);
        }
        if !restore_verified(outcome, whole) {
            services.free(item.location).await;
            services.link.abort(session, item.replica).await;
        } else if publish(services, session, &item).await {
            published.push(item.object);
            services
                .metrics
                .add_bytes_moved(Direction::Restore, item.location.length_bytes);
        }
    }
    ssd.publish();
    published
}

/// Reserves room in a pool on this node for each of `objects` the store still holds, all
/// waiting for room until one deadline ([`RESTORE_WAIT`]); the reservations granted, in
/// the order of `objects`.
async fn reserve_claimed(
    services: &NodeServices,
    ssd: &NodeSsd,
    objects: &[ObjectId],
) -> Vec<Restoring> {
    // One deadline for the whole call: its restores wait for room together.
    let deadline = tokio::time::Instant::now() + RESTORE_WAIT;
    let mut restoring = Vec::new();
    for object in objects {
        let Some(length_bytes) = ssd.store.length_of(object) else {
            continue;
        };
        if let Some(granted) = reserve(services, *object, length_bytes, deadline).await {
            restoring.push(granted);
        }
    }
    restoring
}

/// Where each of `restoring` is written: its reserved, unpublished allocation in its pool's
/// mapping, or `None` where its pool is not mapped here. One message per pool the batch
/// writes into, not per object.
async fn restore_targets(services: &NodeServices, restoring: &[Restoring]) -> Vec<Option<Target>> {
    let mut mappings: HashMap<PoolId, Option<Arc<dyn PoolBackend>>> = HashMap::new();
    let mut targets = Vec::with_capacity(restoring.len());
    for item in restoring {
        let pool = item.location.pool;
        let mapping = match mappings.get(&pool) {
            Some(mapping) => mapping.clone(),
            None => {
                let mapping = match services.pools.get(&pool) {
                    Some(actor) => actor.send(Bytes).await.ok(),
                    None => None,
                };
                mappings.insert(pool, mapping.clone());
                mapping
            }
        };
        targets.push(mapping.map(|bytes| Target {
            bytes,
            location: item.location,
            written_bytes: Some(0),
        }));
    }
    targets
}

/// Reads `restoring` from the store in one batch on a blocking thread, each object's bytes
/// going straight from the store's staging slot into its target: the read outcomes, and
/// for each object whether its target was written whole (none, if the read task failed).
async fn read_into_targets(
    ssd: &Arc<NodeSsd>,
    restoring: &[Restoring],
    mut targets: Vec<Option<Target>>,
) -> (Vec<ReadOutcome>, Vec<bool>) {
    let reader = ssd.clone();
    let ids: Vec<ObjectId> = restoring.iter().map(|item| item.object).collect();
    let read = tokio::task::spawn_blocking(move || {
        let outcomes = reader.store.read_batch(&ids, |index, offset, chunk| {
            if let Some(Some(target)) = targets.get_mut(index) {
                target.write(offset, chunk);
            }
        });
        let written: Vec<bool> = targets
            .iter()
            .map(|target| target.as_ref().is_some_and(Target::whole))
            .collect();
        (outcomes, written)
    })
    .await;
    match read {
        Ok(read) => read,
        Err(_) => (Vec::new(), vec![false; restoring.len()]),
    }
}

/// Where a restore writes one object: its reserved allocation in a pool's mapping.
struct Target {
    bytes: Arc<dyn PoolBackend>,
    location: Location,
    /// Bytes written in order so far; `None` once a chunk came out of order, past the
    /// allocation's length or was refused by the pool.
    written_bytes: Option<u64>,
}

impl Target {
    /// Writes the chunk at `offset` of the object, when it follows what was written and
    /// fits the allocation, with the store routine ([`PoolBackend::store_at`]).
    fn write(&mut self, offset: usize, chunk: &[u8]) {
        let Some(done) = self.written_bytes else {
            return;
        };
        let end = done + chunk.len() as u64;
        let fits = offset as u64 == done && end <= self.location.length_bytes;
        let at = self.location.offset_bytes + done;
        self.written_bytes = (fits && self.bytes.store_at(at, chunk).is_ok()).then_some(end);
    }

    /// Whether the whole allocation was written.
    fn whole(&self) -> bool {
        self.written_bytes == Some(self.location.length_bytes)
    }
}

/// Reserves a replica of `object` and allocates its pages in the granted pool, asking
/// again while a full pool skips the reservation, until `deadline`.
async fn reserve(
    services: &NodeServices,
    object: ObjectId,
    length_bytes: u64,
    deadline: tokio::time::Instant,
) -> Option<Restoring> {
    let item = ReserveItem {
        object,
        length_bytes,
    };
    // A full pool skips the reservation and makes room (its owner reclaims): ask again.
    let (session, replica, pool) = loop {
        match services.link.reserve(item).await {
            (session, Ok(ReserveOutcome::Granted { replica, pool, .. })) => {
                break (session, replica, pool)
            }
            (_, Ok(ReserveOutcome::Skip(_))) if tokio::time::Instant::now() < deadline => {
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
