//! Copies between two pools this node maps, which the directory asked for (demotions and
//! replications into a shared pool), run as a pipeline over one batch of tasks:
//!
//! 1. **allocate**: each copy's target pages are allocated ahead of the copier, in task
//!    order. In a shared pool a new extent is a directory round trip every few objects;
//!    it runs while earlier copies stream, so it never stalls one.
//! 2. **copy**: one copy at a time, straight from mapping to mapping in steps of
//!    [`DEMOTION_CHUNK_BYTES`], yielding between steps. The node's thread makes one copy
//!    at full speed; several at once would only interleave on it and each would end later.
//! 3. **commit**: what was copied is committed in batches (`CommitMany`, every item with
//!    its own operation id) while the next copies stream: a copy never waits for its
//!    commit's round trip, and a burst costs one round trip per batch, not per copy.
//!
//! The three stages run in one task and hand work on through bounded queues:
//! [`TARGETS_AHEAD`] targets allocated and not yet written, [`COMMITS_QUEUED_MAX`] copies
//! written and not yet committed. A copy whose source was freed meanwhile (its generation
//! changed) is never committed; every failure frees the target's pages and aborts its
//! reservation, so nothing partial becomes READY.

use super::actor::{commit_result, DEMOTION_CHUNK_BYTES};
use super::link::{CommitRequest, LinkError};
use super::pool::{Bytes, Check, PoolActor};
use super::services::NodeServices;
use crate::directory::CommitOutcome;
use crate::metrics::Direction;
use crate::model::{Location, ObjectId, PoolId, ReplicaId, SessionId};
use crate::node::{after_commit, PagesAfterCommit};
use actix::Addr;
use tokio::sync::mpsc;

/// Targets allocated ahead of the copier, at most: enough that the next copy's pages are
/// there when the current one ends, although a shared pool's extent costs a directory
/// round trip every few objects; few enough that the pages held unwritten stay small (at
/// 4 MiB objects, 32 MiB).
pub const TARGETS_AHEAD: usize = 8;
/// Copies written and waiting for their commit, at most; the committer takes all of them
/// in one `CommitMany` (split by the link at the directory's `batch_items_max`). A full
/// queue holds the copier until a commit round trip ends.
pub const COMMITS_QUEUED_MAX: usize = 64;

/// A copy between two pools this node maps: a demotion (the directory retires the source
/// once the copy commits) or a replication (the source stays). The node does the same for
/// both; only the bytes-moved label differs.
#[derive(Clone, Copy, Debug)]
pub struct PoolCopy {
    pub source: Location,
    pub target: ReplicaId,
    pub target_pool: PoolId,
    pub direction: Direction,
}

/// A copy whose target pages are allocated.
struct Allocated {
    copy: PoolCopy,
    from: Addr<PoolActor>,
    to: Addr<PoolActor>,
    location: Location,
}

/// A copy written in full, waiting for its commit.
struct Written {
    copy: PoolCopy,
    location: Location,
    /// The object the source held when the copy started, to record once published.
    object: Option<ObjectId>,
}

/// Runs `copies` of `session` through the pipeline (see the module documentation) and
/// returns when every one is committed or abandoned.
pub async fn run(services: &NodeServices, session: SessionId, copies: Vec<PoolCopy>) {
    if copies.is_empty() {
        return;
    }
    let (allocated_tx, allocated_rx) = mpsc::channel(TARGETS_AHEAD);
    let (written_tx, written_rx) = mpsc::channel(COMMITS_QUEUED_MAX);
    futures_util::future::join3(
        allocate_stage(services, session, copies, allocated_tx),
        copy_stage(services, session, allocated_rx, written_tx),
        commit_stage(services, session, written_rx),
    )
    .await;
}

/// Allocates each copy's target in order and hands it to the copier; a copy whose target
/// cannot be allocated is aborted.
async fn allocate_stage(
    services: &NodeServices,
    session: SessionId,
    copies: Vec<PoolCopy>,
    allocated: mpsc::Sender<Allocated>,
) {
    for copy in copies {
        match allocate(services, copy).await {
            Ok(target) => {
                if let Err(mpsc::error::SendError(target)) = allocated.send(target).await {
                    abandon(services, session, &target.copy, Some(target.location)).await;
                }
            }
            Err(reason) => {
                tracing::debug!(%reason, source = ?copy.source, direction = ?copy.direction, "copy abandoned");
                abandon(services, session, &copy, None).await;
            }
        }
    }
}

/// Copies each allocated target in turn and hands it to the committer; a copy that fails
/// (its source freed meanwhile, a pool unreachable) is abandoned.
async fn copy_stage(
    services: &NodeServices,
    session: SessionId,
    mut allocated: mpsc::Receiver<Allocated>,
    written: mpsc::Sender<Written>,
) {
    while let Some(target) = allocated.recv().await {
        let Allocated {
            copy,
            from,
            to,
            location,
        } = target;
        let object = services.core().holdings.object_at(&copy.source);
        if let Err(reason) = copy_chunks(&from, &to, copy.source, location).await {
            tracing::debug!(%reason, source = ?copy.source, direction = ?copy.direction, "copy abandoned");
            abandon(services, session, &copy, Some(location)).await;
            continue;
        }
        let done = Written {
            copy,
            location,
            object,
        };
        if let Err(mpsc::error::SendError(done)) = written.send(done).await {
            abandon(services, session, &done.copy, Some(done.location)).await;
        }
    }
}

/// Commits what the copier wrote: everything queued when a round trip can start goes in
/// one batch.
async fn commit_stage(
    services: &NodeServices,
    session: SessionId,
    mut written: mpsc::Receiver<Written>,
) {
    let mut batch = Vec::with_capacity(COMMITS_QUEUED_MAX);
    while written.recv_many(&mut batch, COMMITS_QUEUED_MAX).await > 0 {
        let requests: Vec<CommitRequest> = batch
            .iter()
            .map(|done| CommitRequest {
                session,
                replica: done.copy.target,
                location: done.location,
            })
            .collect();
        let outcomes = services.link.commit_many(&requests).await;
        for (done, committed) in batch.drain(..).zip(outcomes) {
            settle(services, session, done, committed).await;
        }
    }
}

/// Applies the node core's rule on a committed copy's pages.
async fn settle(
    services: &NodeServices,
    session: SessionId,
    done: Written,
    committed: Result<Option<CommitOutcome>, LinkError>,
) {
    let published = matches!(committed, Ok(Some(CommitOutcome::Committed)));
    let location = done.location;
    match after_commit(commit_result(committed)) {
        PagesAfterCommit::Published => {
            if let (true, Some(object)) = (published, done.object) {
                services.published(object, location);
            }
            services
                .metrics
                .add_bytes_moved(done.copy.direction, location.length_bytes)
        }
        PagesAfterCommit::Keep => {}
        PagesAfterCommit::Free => services.free(location).await,
        PagesAfterCommit::FreeAndAbort => {
            services.free(location).await;
            services.link.abort(session, done.copy.target).await;
        }
    }
}

/// Frees a copy's target pages (when allocated) and aborts its reservation.
async fn abandon(
    services: &NodeServices,
    session: SessionId,
    copy: &PoolCopy,
    location: Option<Location>,
) {
    if let Some(location) = location {
        services.free(location).await;
    }
    services.link.abort(session, copy.target).await;
}

/// Allocates the target of `copy` in its pool (a shared pool may ask the directory for
/// an extent).
async fn allocate(services: &NodeServices, copy: PoolCopy) -> Result<Allocated, String> {
    let (Some(from), Some(to)) = (
        services.pools.get(&copy.source.pool),
        services.pools.get(&copy.target_pool),
    ) else {
        return Err("a pool of the copy is not mapped here".into());
    };
    let allocation = services
        .allocate(to, copy.target_pool, copy.source.length_bytes)
        .await
        .map_err(|error| error.to_string())?
        .map_err(|error| error.to_string())?;
    let location = Location {
        pool: copy.target_pool,
        allocation: allocation.id,
        generation: allocation.generation,
        offset_bytes: allocation.offset,
        length_bytes: copy.source.length_bytes,
    };
    Ok(Allocated {
        copy,
        from: from.clone(),
        to: to.clone(),
        location,
    })
}

/// Copies `source` to `target` (same length) chunk by chunk, yielding between chunks, then
/// checks the source: a source freed and reused meanwhile (a concurrent reclaim) fails the
/// check, and the caller frees the copy instead of committing it.
async fn copy_chunks(
    from: &Addr<PoolActor>,
    to: &Addr<PoolActor>,
    source: Location,
    target: Location,
) -> Result<(), String> {
    let failed = |what: &str, error: &dyn std::fmt::Display| format!("{what} failed: {error}");
    let reader = from
        .send(Bytes)
        .await
        .map_err(|error| failed("reaching the source pool", &error))?;
    let writer = to
        .send(Bytes)
        .await
        .map_err(|error| failed("reaching the target pool", &error))?;
    let mut done = 0;
    while done < source.length_bytes {
        let chunk = (source.length_bytes - done).min(DEMOTION_CHUNK_BYTES);
        let bytes = reader
            .slice(source.offset_bytes + done, chunk)
            .map_err(|error| failed("reading the source", &error))?;
        writer
            .stream_at(target.offset_bytes + done, bytes)
            .map_err(|error| failed("writing the copy", &error))?;
        done += chunk;
        tokio::task::yield_now().await;
    }
    from.send(Check { location: source })
        .await
        .map_err(|error| failed("checking the source", &error))?
        .map_err(|error| failed("checking the source", &error))
}
