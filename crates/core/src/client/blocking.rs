//! `store_many` and `load_into` for a caller on its own thread (the Python binding): the
//! copies run on the calling thread while tasks on the runtime drive the round trips. The
//! copying thread sends no request while other batches are in flight (so a node woken by
//! it does not land on the core that copies), and a reply that lands during a copy is
//! acted on at once by the runtime; a load of one batch sends its own acquire.
//!
//! A store reserves a whole group of items in one round trip (up to
//! [`STORE_RESERVE_BYTES_MAX`] and the protocol's
//! [`STORE_BATCH_ITEMS_MAX`]: a whole call, for calls that size), so no copy waits for a
//! grant after the group's first; it commits the group in parts of at most
//! [`STORE_BATCH_BYTES_MAX`], each sent as soon as its copies are done, so the commit of one
//! part overlaps the copy of the next. The next group's reserve overlaps this group's copy.
//! A call of one group (the common case: an engine's prefix) sends its reserve and its last
//! commit from the calling thread, which reads their replies itself while it spins
//! ([`spin::block_on`]): no runtime thread is woken on their way.

use super::batches::batch_lengths;
use super::load::LOAD_BATCHES_IN_FLIGHT;
use super::spin;
use super::store::{every_item, AbortOnDrop, BatchGrants, CopiedBatch, STORE_BATCH_BYTES_MAX};
use super::{Client, ClientError, LoadedView, StoreOutcome};
use crate::directory::ReserveItem;
use crate::model::{LeaseId, ObjectId};
use crate::protocol::messages::STORE_BATCH_ITEMS_MAX;
use std::collections::VecDeque;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Bytes one reserve of [`Client::store_many_blocking`] covers at most (one larger object
/// goes alone): a 32 MiB call is reserved in one round trip.
pub const STORE_RESERVE_BYTES_MAX: u64 = 32 << 20;
/// Reserved groups of one blocking `store_many` not yet fully committed, at most 2 of them
/// reserved ahead of the copy: one call holds at most 3 × [`STORE_BATCH_ITEMS_MAX`] = 192
/// tickets (under a node's 1024 per client) and 3 × [`STORE_RESERVE_BYTES_MAX`] = 96 MiB of
/// granted pages (or 3 objects, where they are larger).
pub const STORE_RESERVES_HELD_MAX: usize = 3;
/// Groups reserved ahead of the copy (within [`STORE_RESERVES_HELD_MAX`]): the next
/// group's grants arrive while this one is copied.
const STORE_RESERVES_AHEAD: usize = 2;
const _: () = assert!(STORE_RESERVES_AHEAD < STORE_RESERVES_HELD_MAX);
const _: () = assert!(STORE_BATCH_BYTES_MAX <= STORE_RESERVE_BYTES_MAX);
const _: () = assert!(
    STORE_RESERVES_HELD_MAX * STORE_BATCH_ITEMS_MAX <= crate::node::CLIENT_LIMITS.tickets_max
);

type Outcomes = Vec<Result<StoreOutcome, ClientError>>;
type Views = Result<Vec<Option<LoadedView>>, ClientError>;

/// A group of stores whose reserve is under way on the runtime.
struct Reserving {
    start: usize,
    items: usize,
    /// The grants, cut into the group's commit parts, once the reserve is answered
    /// (dropped unsent when it failed).
    grants: oneshot::Receiver<Vec<BatchGrants>>,
    /// One per commit part: its copied batch, for the task to commit (dropped unsent: the
    /// task aborts that part's grants).
    copied: Vec<oneshot::Sender<CopiedBatch>>,
    done: oneshot::Receiver<Outcomes>,
}

/// A copied group whose commits are under way on the runtime.
struct Committing {
    items: usize,
    done: oneshot::Receiver<Outcomes>,
}

impl Client {
    /// [`Client::store_many`] for a caller outside the runtime: it blocks the calling
    /// thread, which makes the copies, while tasks on `runtime` reserve and commit: one
    /// reserve round trip per group of at most [`STORE_BATCH_ITEMS_MAX`] items and
    /// [`STORE_RESERVE_BYTES_MAX`] bytes (at most [`STORE_RESERVES_HELD_MAX`] groups held),
    /// one commit per [`STORE_BATCH_BYTES_MAX`] of it, sent as its copies finish (a call of
    /// one group: see [`Client::store_group_here`]). Must not
    /// be called from a task of a runtime. Grants that are never copied (the caller
    /// unwound) are aborted at once.
    pub fn store_many_blocking(&self, runtime: &Handle, items: &[(ObjectId, &[u8])]) -> Outcomes {
        if items.is_empty() {
            return Vec::new();
        }
        let bytes: u64 = items.iter().map(|(_, bytes)| bytes.len() as u64).sum();
        if items.len() <= STORE_BATCH_ITEMS_MAX && bytes <= STORE_RESERVE_BYTES_MAX {
            return self.store_group_here(runtime, items);
        }
        let sizes = items.iter().map(|(_, bytes)| bytes.len() as u64);
        let mut groups =
            batch_lengths(sizes, STORE_BATCH_ITEMS_MAX, STORE_RESERVE_BYTES_MAX).into_iter();
        let mut start = 0;
        let mut reserving: VecDeque<Reserving> = VecDeque::new();
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
            while reserving.len() < STORE_RESERVES_AHEAD
                && reserving.len() + committing.len() < STORE_RESERVES_HELD_MAX
            {
                let Some(length) = groups.next() else {
                    break;
                };
                reserving.push_back(self.spawn_reserve(runtime, items, start, length));
                start += length;
            }
            if let Some(group) = reserving.pop_front() {
                // A reserve that failed sends no grants: its task reports the error.
                if let Some(parts) = spin::recv(group.grants) {
                    let mut at = group.start;
                    for (grants, copied) in parts.into_iter().zip(group.copied) {
                        let part = &items[at..at + grants.len()];
                        at += part.len();
                        let copy = self.copy_batch(grants, part.iter().map(|(_, b)| *b));
                        // The task has gone only with the runtime: the grants expire.
                        let _ = copied.send(copy);
                    }
                }
                committing.push_back(Committing {
                    items: group.items,
                    done: group.done,
                });
                continue;
            }
            let Some(front) = committing.pop_front() else {
                return outcomes;
            };
            let done = spin::recv(front.done);
            outcomes.extend(done.unwrap_or_else(|| every_item(front.items, &stopped())));
        }
    }

    /// A call that is one reserve group, on the calling thread: it sends the reserve and
    /// waits for it (spinning, reading the reply itself), copies the parts, hands each
    /// part but the last to a task to commit while it copies the next, and commits the
    /// last itself. No hand-off to a runtime thread and back on the way of the reserve or
    /// of the last commit. Grants not handed to a commit when the thread unwinds are
    /// aborted.
    fn store_group_here(&self, runtime: &Handle, items: &[(ObjectId, &[u8])]) -> Outcomes {
        let reserve = items
            .iter()
            .map(|(object, bytes)| ReserveItem {
                object: *object,
                length_bytes: bytes.len() as u64,
            })
            .collect();
        let grants = match spin::block_on(runtime, self.begin_batch(reserve)) {
            Ok(grants) => grants,
            Err(error) => return every_item(items.len(), &error),
        };
        let sizes = items.iter().map(|(_, bytes)| bytes.len() as u64);
        let parts = grants.split(&batch_lengths(sizes, usize::MAX, STORE_BATCH_BYTES_MAX));
        let tickets = parts.iter().flat_map(BatchGrants::tickets).collect();
        let mut unsettled = AbortOnDrop::new(self, tickets);
        let mut committing = Vec::new();
        let mut outcomes = Vec::with_capacity(items.len());
        let mut at = 0;
        let last = parts.len().saturating_sub(1);
        for (index, grants) in parts.into_iter().enumerate() {
            let part = &items[at..at + grants.len()];
            at += part.len();
            let handed = grants.tickets().len();
            let copied = self.copy_batch(grants, part.iter().map(|(_, bytes)| *bytes));
            // This part's grants are the commit's now (committed or aborted there).
            unsettled.tickets.drain(..handed);
            if index < last {
                let (done, receiver) = oneshot::channel();
                let client = self.clone();
                runtime.spawn(async move {
                    let _ = done.send(client.finish_batch(copied).await);
                });
                committing.push((part.len(), receiver));
                continue;
            }
            let done = spin::block_on(runtime, self.finish_batch(copied));
            for (items, receiver) in committing.drain(..) {
                let committed = spin::recv(receiver);
                outcomes.extend(committed.unwrap_or_else(|| every_item(items, &stopped())));
            }
            outcomes.extend(done);
        }
        outcomes
    }

    /// Starts the task of one group of stores: one reserve, the grants handed to the caller
    /// in commit parts of at most [`STORE_BATCH_BYTES_MAX`], each part committed as soon as
    /// the caller copied it (or its grants aborted, when the caller dropped it).
    fn spawn_reserve(
        &self,
        runtime: &Handle,
        items: &[(ObjectId, &[u8])],
        start: usize,
        length: usize,
    ) -> Reserving {
        let group = &items[start..start + length];
        let reserve: Vec<ReserveItem> = group
            .iter()
            .map(|(object, bytes)| ReserveItem {
                object: *object,
                length_bytes: bytes.len() as u64,
            })
            .collect();
        let sizes = group.iter().map(|(_, bytes)| bytes.len() as u64);
        let parts = batch_lengths(sizes, usize::MAX, STORE_BATCH_BYTES_MAX);
        let (copied, copied_receivers): (Vec<_>, Vec<_>) =
            parts.iter().map(|_| oneshot::channel()).unzip();
        let (grants_sender, grants) = oneshot::channel();
        let (done_sender, done) = oneshot::channel();
        let client = self.clone();
        runtime.spawn(async move {
            let outcomes = match client.begin_batch(reserve).await {
                Err(error) => every_item(length, &error),
                Ok(grants) => {
                    let parts = grants.split(&parts);
                    let tickets: Vec<Vec<u64>> = parts.iter().map(BatchGrants::tickets).collect();
                    if grants_sender.send(parts).is_err() {
                        // The caller unwound: nobody copies, nobody waits for outcomes.
                        client.abort_tickets(tickets.concat()).await;
                        return;
                    }
                    let client = &client;
                    let commits = copied_receivers.into_iter().zip(tickets).map(
                        |(copied, tickets)| async move {
                            match copied.await {
                                Ok(copied) => Some(client.finish_batch(copied).await),
                                Err(_) => {
                                    client.abort_tickets(tickets).await;
                                    None
                                }
                            }
                        },
                    );
                    // Every part's commit starts as soon as its copy arrives.
                    let committed = futures_util::future::join_all(commits).await;
                    match committed.into_iter().collect::<Option<Vec<_>>>() {
                        Some(parts) => parts.into_iter().flatten().collect(),
                        // A part never copied: the caller unwound, nobody waits.
                        None => return,
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
    /// (at most [`LOAD_BATCHES_IN_FLIGHT`] ahead: a call of up to
    /// [`LOAD_BATCH_BYTES_MAX`](super::LOAD_BATCH_BYTES_MAX) is one acquire round trip) and
    /// release the leases (handed to the background releaser after each batch's copies).
    /// Must not be called from a task of a runtime. Errors with the first batch's error; the batches
    /// already acquired then are released without a copy.
    pub fn load_into_blocking(
        &self,
        runtime: &Handle,
        objects: &[ObjectId],
        buffers: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, ClientError> {
        let (count, mut lengths) = self.load_batches(objects, buffers);
        if lengths.len() == 1 {
            // One batch: nothing to overlap its copy with, so the calling thread sends the
            // acquire itself and waits for it (no hand-off to a runtime thread and back).
            let views = spin::block_on(runtime, self.load_each(&objects[..count]))?;
            let (hits, leases) = self.copy_views(views, &mut buffers[..count]);
            self.release_soon(runtime, leases);
            return Ok(hits);
        }
        let (mut objects, mut buffers) = (&objects[..count], &mut buffers[..count]);
        let mut acquiring: VecDeque<(usize, oneshot::Receiver<Views>)> = VecDeque::new();
        let mut hits = Vec::with_capacity(count);
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
                    let _ = views.send(client.load_each(&batch).await);
                });
                acquiring.push_back((length, receiver));
            }
            let Some((length, views)) = acquiring.pop_front() else {
                break;
            };
            let (targets, others) = std::mem::take(&mut buffers).split_at_mut(length);
            buffers = others;
            match spin::recv(views) {
                Some(Ok(views)) if failed.is_none() => {
                    let (batch, leases) = self.copy_views(views, targets);
                    hits.extend(batch);
                    self.release_soon(runtime, leases);
                }
                // After a failure the views are dropped uncopied: their leases go back.
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    failed.get_or_insert(error);
                }
                None => {
                    failed.get_or_insert(stopped());
                }
            }
        }
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
