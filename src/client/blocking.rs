//! `store_many` and `load_into` for a caller on its own thread (the Python binding): the
//! copies run on the calling thread while tasks on the runtime drive the round trips. The
//! copying thread never sends a request (so a node woken by it does not land on the core
//! that copies), and a reply that lands during a copy is acted on at once by the runtime:
//! the reserves and acquires of the next batches and the commits of the previous ones all
//! overlap the copy of the current batch.

use super::batches::batch_lengths;
use super::load::{load_batches, LOAD_BATCHES_IN_FLIGHT, LOAD_BATCH_ITEMS_MAX};
use super::store::{
    every_item, BatchGrants, CopiedBatch, STORE_BATCHES_IN_FLIGHT, STORE_BATCH_BYTES_MAX,
};
use super::{Client, ClientError, LoadedView, StoreOutcome};
use crate::directory::{AcquireMode, ReserveItem};
use crate::model::{LeaseId, ObjectId};
use crate::protocol::messages::STORE_BATCH_ITEMS_MAX;
use std::collections::VecDeque;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Store batches copied and waiting for their commit, beyond the
/// [`STORE_BATCHES_IN_FLIGHT`] reserved and not yet copied: one call holds at most
/// (4 + 4) × 64 = 512 tickets (under a node's 1024 per client) and 8 ×
/// [`STORE_BATCH_BYTES_MAX`] of granted pages.
pub const STORE_BATCHES_COMMITTING_MAX: usize = 4;

type Outcomes = Vec<Result<StoreOutcome, ClientError>>;
type Views = Result<Vec<Option<LoadedView>>, ClientError>;

/// A store batch whose reserve is under way on the runtime.
struct Reserving {
    start: usize,
    items: usize,
    /// The grants, once the reserve is answered (dropped unsent when it failed).
    grants: oneshot::Receiver<BatchGrants>,
    /// The copied batch, for the task to commit (dropped unsent: abort every grant).
    copied: oneshot::Sender<CopiedBatch>,
    done: oneshot::Receiver<Outcomes>,
}

/// A copied store batch whose commit is under way on the runtime.
struct Committing {
    items: usize,
    done: oneshot::Receiver<Outcomes>,
}

impl Client {
    /// [`Client::store_many`] for a caller outside the runtime: it blocks the calling
    /// thread, which makes the copies, while tasks on `runtime` reserve and commit (the
    /// same batches, at most [`STORE_BATCHES_IN_FLIGHT`] reserved ahead of the copy and
    /// [`STORE_BATCHES_COMMITTING_MAX`] committing behind it). Must not be called from a
    /// task of a runtime. Grants of a batch that is never copied (the caller unwound) are
    /// aborted at once.
    pub fn store_many_blocking(&self, runtime: &Handle, items: &[(ObjectId, &[u8])]) -> Outcomes {
        let sizes = items.iter().map(|(_, bytes)| bytes.len() as u64);
        let mut lengths =
            batch_lengths(sizes, STORE_BATCH_ITEMS_MAX, STORE_BATCH_BYTES_MAX).into_iter();
        let mut start = 0;
        let mut reserving = VecDeque::new();
        let mut committing: VecDeque<Committing> = VecDeque::new();
        let mut outcomes = Vec::with_capacity(items.len());
        loop {
            while let Some(front) = committing.front_mut() {
                match front.done.try_recv() {
                    Ok(done) => outcomes.extend(done),
                    Err(oneshot::error::TryRecvError::Empty) => break,
                    Err(oneshot::error::TryRecvError::Closed) => {
                        outcomes.extend(every_item(front.items, &stopped()));
                    }
                }
                committing.pop_front();
            }
            while reserving.len() < STORE_BATCHES_IN_FLIGHT
                && reserving.len() + committing.len()
                    < STORE_BATCHES_IN_FLIGHT + STORE_BATCHES_COMMITTING_MAX
            {
                let Some(length) = lengths.next() else {
                    break;
                };
                reserving.push_back(self.spawn_reserve(runtime, items, start, length));
                start += length;
            }
            if let Some(batch) = reserving.pop_front() {
                // A reserve that failed sends no grants: its task reports the error.
                if let Ok(grants) = batch.grants.blocking_recv() {
                    let batch_items = &items[batch.start..batch.start + batch.items];
                    let copied = self.copy_batch(grants, batch_items.iter().map(|(_, b)| *b));
                    // The task has gone only with the runtime: the grants expire.
                    let _ = batch.copied.send(copied);
                }
                committing.push_back(Committing {
                    items: batch.items,
                    done: batch.done,
                });
                continue;
            }
            let Some(front) = committing.pop_front() else {
                return outcomes;
            };
            let done = front.done.blocking_recv();
            outcomes.extend(done.unwrap_or_else(|_| every_item(front.items, &stopped())));
        }
    }

    /// Starts the task of the store batch `items[start..start + length]`: reserve, hand the
    /// grants to the caller, commit what it copied (or abort every grant).
    fn spawn_reserve(
        &self,
        runtime: &Handle,
        items: &[(ObjectId, &[u8])],
        start: usize,
        length: usize,
    ) -> Reserving {
        let reserve: Vec<ReserveItem> = items[start..start + length]
            .iter()
            .map(|(object, bytes)| ReserveItem {
                object: *object,
                length_bytes: bytes.len() as u64,
            })
            .collect();
        let (grants_sender, grants) = oneshot::channel();
        let (copied, copied_receiver) = oneshot::channel();
        let (done_sender, done) = oneshot::channel();
        let client = self.clone();
        runtime.spawn(async move {
            let outcomes = match client.begin_batch(reserve).await {
                Err(error) => every_item(length, &error),
                Ok(grants) => {
                    let tickets = grants.tickets();
                    let copied = match grants_sender.send(grants) {
                        Ok(()) => copied_receiver.await.ok(),
                        Err(_) => None,
                    };
                    match copied {
                        Some(copied) => client.finish_batch(copied).await,
                        // The caller unwound: nobody waits for outcomes.
                        None => {
                            client.abort_tickets(tickets).await;
                            return;
                        }
                    }
                }
            };
            // The caller may have gone (unwound): nothing waits for the outcomes then.
            let _ = done_sender.send(outcomes);
        });
        Reserving {
            start,
            items: length,
            grants,
            copied,
            done,
        }
    }

    /// [`Client::load_into`] for a caller outside the runtime: it blocks the calling
    /// thread, which makes the copies, while tasks on `runtime` acquire the next batches
    /// (at most [`LOAD_BATCHES_IN_FLIGHT`] ahead) and release the leases (handed to the
    /// background releaser every [`LOAD_BATCH_ITEMS_MAX`] leases and after the last copy). Must not be
    /// called from a task of a runtime. Errors with the first batch's error; the batches
    /// already acquired then are released without a copy.
    pub fn load_into_blocking(
        &self,
        runtime: &Handle,
        objects: &[ObjectId],
        buffers: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, ClientError> {
        let (count, mut lengths) = load_batches(objects, buffers);
        let (mut objects, mut buffers) = (&objects[..count], &mut buffers[..count]);
        let mut acquiring: VecDeque<(usize, oneshot::Receiver<Views>)> = VecDeque::new();
        let mut hits = Vec::with_capacity(count);
        // Leases copied from and not yet released: one release for up to a batch's worth, so
        // the node and the directory are not woken per batch while this thread copies.
        let mut copied: Vec<LeaseId> = Vec::new();
        let mut failed = None;
        loop {
            while failed.is_none() && acquiring.len() < LOAD_BATCHES_IN_FLIGHT {
                let Some(length) = lengths.next() else {
                    break;
                };
                let (batch, rest) = objects.split_at(length);
                objects = rest;
                let (views, receiver) = oneshot::channel();
                let (client, batch) = (self.clone(), batch.to_vec());
                runtime.spawn(async move {
                    // Views nobody takes (the caller unwound) release their leases on drop.
                    let _ = views.send(client.load(&batch, AcquireMode::Each).await);
                });
                acquiring.push_back((length, receiver));
            }
            let Some((length, views)) = acquiring.pop_front() else {
                break;
            };
            let (targets, others) = std::mem::take(&mut buffers).split_at_mut(length);
            buffers = others;
            match views.blocking_recv() {
                Ok(Ok(views)) if failed.is_none() => {
                    let (batch, leases) = self.copy_views(views, targets);
                    hits.extend(batch);
                    copied.extend(leases);
                    if copied.len() >= LOAD_BATCH_ITEMS_MAX {
                        self.release_soon(runtime, std::mem::take(&mut copied));
                    }
                }
                // After a failure the views are dropped uncopied: their leases go back.
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    failed.get_or_insert(error);
                }
                Err(_) => {
                    failed.get_or_insert(stopped());
                }
            }
        }
        self.release_soon(runtime, copied);
        failed.map_or(Ok(hits), Err)
    }

    /// Hands `leases` to the background releaser (bounded: its queue holds
    /// [`DROPPED_LEASES_QUEUED_MAX`](super::DROPPED_LEASES_QUEUED_MAX)); what its full queue
    /// does not take is released here, waiting for the reply. Best effort: a lease not
    /// released expires.
    fn release_soon(&self, runtime: &Handle, leases: Vec<LeaseId>) {
        let overflow = self.queue_releases(leases);
        if !overflow.is_empty() {
            let _ = runtime.block_on(self.release(&overflow));
        }
    }
}

/// The error of a batch whose task ended without an answer: the runtime stopped.
fn stopped() -> ClientError {
    ClientError::Unexpected("the runtime stopped before the batch ended".into())
}
