//! The node's copy engine: worker threads that copy between pool mappings (demotions, and
//! replications into a shared pool) from a bounded queue, as a DMA engine would, so no copy
//! runs on the node's actor thread.
//!
//! The node's actors run on one thread. A copy done there in steps interleaves with the
//! node's other work (directory round trips, commits, clients) and pays for both one after
//! the other, on one core. On the engine, copies are cut into pieces of [`PIECE_BYTES`]
//! that every worker takes in queue order (the node core's [`PieceQueue`]): one long copy
//! uses every worker, and a run of copies ends about in the order they were asked for. The
//! engine's CPU is its workers' (`copy_threads` in the node's section), whatever the number
//! of copies asked for.

use crate::backends::PoolBackend;
use crate::limits::COPY_THREADS_MAX;
use crate::node::copy_queue::{CopyProgress, PieceQueue, Taken};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// Copies queued or under way at most (a caller waits for room beyond): the node's tasks
/// in flight ([`super::actor::TASKS_IN_FLIGHT_MAX`]), so a task never waits on another's.
pub const COPY_QUEUE_MAX: usize = super::actor::TASKS_IN_FLIGHT_MAX;
/// Bytes a worker copies at once: 1 MiB (about 0.1 ms at memory speed), so a 4 MiB object
/// is shared between up to four workers and a worker is never held by one copy for longer.
pub const PIECE_BYTES: u64 = 1 << 20;

/// `length_bytes` at `source_offset` of `from` to `target_offset` of `to`.
pub struct CopyRequest {
    /// The source pool's bytes.
    pub from: Arc<dyn PoolBackend>,
    /// The target pool's bytes.
    pub to: Arc<dyn PoolBackend>,
    /// Offset of the source in `from`'s data area.
    pub source_offset: u64,
    /// Offset of the target in `to`'s data area.
    pub target_offset: u64,
    /// Bytes to copy.
    pub length_bytes: u64,
}

/// One queued copy and what its pieces report.
struct Job {
    request: CopyRequest,
    /// Its pieces still to end and its first failure (the node core's books).
    progress: Mutex<CopyProgress>,
    /// Where the outcome goes, and the copy's place among [`COPY_QUEUE_MAX`]: both taken
    /// when its last piece ends, the place given back before the caller hears.
    done: Mutex<Option<(Outcome, OwnedSemaphorePermit)>>,
}

/// Where a copy's outcome goes.
type Outcome = oneshot::Sender<Result<(), String>>;

/// What the workers and the handles share.
#[derive(Default)]
struct Shared {
    queue: Mutex<PieceQueue<Arc<Job>>>,
    work: Condvar,
}

/// Closes the queue when the last handle goes: the workers finish what is queued and end.
struct Owner {
    shared: Arc<Shared>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        lock(&self.shared.queue).close();
        self.shared.work.notify_all();
    }
}

/// A handle on the engine; cloning it shares the same workers.
#[derive(Clone)]
pub struct CopyEngine {
    owner: Arc<Owner>,
    room: Arc<Semaphore>,
    threads: usize,
}

impl CopyEngine {
    /// Starts `threads` workers (1 to [`COPY_THREADS_MAX`]; the configuration checks it,
    /// and a number outside is brought inside).
    pub fn start(threads: usize) -> std::io::Result<CopyEngine> {
        let shared = Arc::new(Shared::default());
        let threads = threads.clamp(1, COPY_THREADS_MAX);
        for index in 0..threads {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("kvtier-copy-{index}"))
                .spawn(move || work(&shared))?;
        }
        Ok(CopyEngine {
            owner: Arc::new(Owner { shared }),
            room: Arc::new(Semaphore::new(COPY_QUEUE_MAX)),
            threads,
        })
    }

    /// Copies on the workers and returns when every byte is written (the source is read as
    /// it is: the caller checks afterwards that it was not reused meanwhile). The target is
    /// written with non-temporal stores and a store fence on each worker, so every byte is
    /// visible to other processes before this returns. Waits for room while
    /// [`COPY_QUEUE_MAX`] copies are queued; a copy whose caller stops waiting still runs.
    pub async fn copy(&self, request: CopyRequest) -> Result<(), String> {
        let pieces = request.length_bytes.div_ceil(PIECE_BYTES);
        if pieces == 0 {
            return Ok(());
        }
        let room = self
            .room
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| "the copy engine has stopped".to_string())?;
        let (done, finished) = oneshot::channel();
        let job = Arc::new(Job {
            request,
            progress: Mutex::new(CopyProgress::new(pieces)),
            done: Mutex::new(Some((done, room))),
        });
        let shared = &self.owner.shared;
        lock(&shared.queue).push(job, pieces);
        // One worker per piece at most: a one-piece copy wakes one thread, not all.
        for _ in 0..pieces.min(self.threads as u64) {
            shared.work.notify_one();
        }
        finished
            .await
            .map_err(|_| "the copy engine dropped the copy".to_string())?
    }
}

/// A worker: takes the next piece in queue order, copies it (unless an earlier piece of
/// its copy failed), and answers for the copy when it was the last; ends once the queue is
/// closed and empty.
fn work(shared: &Shared) {
    while let Some((job, piece)) = next_piece(shared) {
        let ended = if lock(&job.progress).skips() {
            Ok(())
        } else {
            copy_piece(&job.request, piece)
        };
        let outcome = lock(&job.progress).piece_ended(ended);
        if let Some(outcome) = outcome {
            if let Some((done, room)) = lock(&job.done).take() {
                drop(room);
                // The caller may have stopped waiting: the outcome is then dropped.
                let _ = done.send(outcome);
            }
        }
    }
}

/// The queue's next piece, waiting for one; `None` once the queue is closed and empty.
fn next_piece(shared: &Shared) -> Option<(Arc<Job>, u64)> {
    let mut queue = lock(&shared.queue);
    loop {
        match queue.take() {
            Taken::Piece(job, piece) => return Some((job, piece)),
            Taken::Closed => return None,
            Taken::Idle => {
                queue = shared
                    .work
                    .wait(queue)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
    }
}

fn copy_piece(request: &CopyRequest, piece: u64) -> Result<(), String> {
    let at = piece * PIECE_BYTES;
    let length = (request.length_bytes - at).min(PIECE_BYTES);
    let bytes = request
        .from
        .slice(request.source_offset + at, length)
        .map_err(|error| format!("reading the source failed: {error}"))?;
    request
        .to
        .store_at(request.target_offset + at, bytes)
        .map_err(|error| format!("writing the copy failed: {error}"))
}

/// Locks `mutex`; a worker that panicked while holding it left whole values behind (each
/// lock guards one push, pop, flag or take), so the lock is taken anyway.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::{CpuPoolConfig, MemoryPool};

    fn pool(uuid: u128) -> Arc<dyn PoolBackend> {
        Arc::new(
            MemoryPool::create_cpu(&CpuPoolConfig {
                name: format!("kvtier-test-copy-{uuid}"),
                capacity_bytes: 8 << 20,
                page_bytes: 4096,
                allocations_max: 16,
                pool_uuid: uuid,
            })
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn copies_land_byte_exact_and_bad_ranges_are_errors() {
        let (from, to) = (pool(1), pool(2));
        let length = 3 * PIECE_BYTES as usize + 4099;
        let bytes: Vec<u8> = (0..length as u32)
            .map(|at| (at.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        from.write_at(4096, &bytes).unwrap();
        let engine = CopyEngine::start(3).unwrap();
        let request = |source_offset, target_offset, length_bytes| CopyRequest {
            from: from.clone(),
            to: to.clone(),
            source_offset,
            target_offset,
            length_bytes,
        };
        // More copies than the queue holds, all at once: each waits for room, none is lost.
        // Every one writes the same bytes where it writes, from offsets of both parities,
        // each in pieces that several workers copy.
        let copies = (0..COPY_QUEUE_MAX as u64 + 8).map(|index| {
            let odd = index % 2;
            engine.copy(request(4096 + odd, odd, length as u64 - odd))
        });
        for (index, copied) in futures_util::future::join_all(copies)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(copied, Ok(()), "copy {index}");
        }
        assert!(to.slice(1, length as u64 - 1).unwrap() == &bytes[1..]);
        assert_eq!(engine.copy(request(0, 0, 0)).await, Ok(()));
        // A source past the pool's end fails in its last piece only: the copy fails.
        let beyond = engine.copy(request(6 << 20, 0, 3 << 20)).await;
        assert!(beyond.unwrap_err().contains("reading the source"));
        let past_the_end = engine.copy(request(0, (8 << 20) - 100, 4096)).await;
        assert!(past_the_end.unwrap_err().contains("writing the copy"));
        // The queue's room all came back.
        assert_eq!(engine.room.available_permits(), COPY_QUEUE_MAX);
    }

    #[tokio::test]
    async fn the_workers_end_with_the_last_handle() {
        let engine = CopyEngine::start(2).unwrap();
        let shared = Arc::downgrade(&engine.owner.shared);
        let other = engine.clone();
        drop(engine);
        assert!(!lock(&other.owner.shared.queue).is_closed());
        drop(other);
        // Each worker holds the shared state until it has seen the queue closed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while shared.strong_count() > 0 {
            assert!(std::time::Instant::now() < deadline, "a worker never ended");
            std::thread::yield_now();
        }
    }
}
