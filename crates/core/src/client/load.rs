//! Loads: leases with zero-copy views over the mapped pools (`load`), or copies into the
//! caller's buffers in pipelined batches (`load_into`).

use super::batches::batch_lengths;
use super::{unexpected, Client, ClientError, LoadedView, LEASE_MARGIN_DIVISOR};
use crate::backends::copy::copy_out_of_pool;
use crate::directory::{AcquireMode, AcquireOutcome, Lease};
use crate::model::{LeaseId, ObjectId};
use crate::protocol::messages::{ClientReply, ClientRequest};
use std::time::{Duration, Instant};

/// Objects one acquire of `load_into` asks for at most (and so leases one release gives
/// back), or the directory's `batch_items_max` where a refusal named a smaller one (it is
/// 4096 by default).
pub const LOAD_BATCH_ITEMS_MAX: usize = 64;
/// Buffer bytes one `load_into` batch covers at most (one larger buffer goes alone): a
/// 32 MiB call is acquired in one round trip, so no copy waits for a lease after the first.
pub const LOAD_BATCH_BYTES_MAX: u64 = 32 << 20;
/// `load_into` batches in flight at once (the next one's acquire overlaps this one's copy):
/// one call holds at most 2 × 64 leases and 2 × [`LOAD_BATCH_BYTES_MAX`] of objects (or 2
/// objects, where they are larger) at a time.
pub const LOAD_BATCHES_IN_FLIGHT: usize = 2;

impl Client {
    /// How many objects a `load_into` of `objects` into `buffers` loads (one per buffer, the
    /// shorter list decides) and the lengths of its batches, in order.
    pub(super) fn load_batches(
        &self,
        objects: &[ObjectId],
        buffers: &[&mut [u8]],
    ) -> (usize, std::vec::IntoIter<usize>) {
        let count = objects.len().min(buffers.len());
        let sizes = buffers[..count].iter().map(|buffer| buffer.len() as u64);
        let items_max = LOAD_BATCH_ITEMS_MAX.min(self.batch_items_max());
        let lengths = batch_lengths(sizes, items_max, LOAD_BATCH_BYTES_MAX);
        (count, lengths.into_iter())
    }

    /// [`Client::load`] of `objects` with [`AcquireMode::Each`], within the directory's
    /// batch bound: a refusal that names the bound (`BatchTooLarge`) is remembered (later
    /// calls split up front) and the objects are acquired again in parts of that size.
    pub(super) async fn load_each(
        &self,
        objects: &[ObjectId],
    ) -> Result<Vec<Option<LoadedView>>, ClientError> {
        let error = match self.load(objects, AcquireMode::Each).await {
            Err(error) => error,
            loaded => return loaded,
        };
        match self.learn_batch_items_max(&error) {
            Some(max) if max < objects.len() => {
                let mut views = Vec::with_capacity(objects.len());
                for part in objects.chunks(max) {
                    views.extend(self.load(part, AcquireMode::Each).await?);
                }
                Ok(views)
            }
            _ => Err(error),
        }
    }

    /// Leases the objects and returns zero-copy views into the mapped pools, one per item
    /// (`None` for a miss). Each view holds its lease until [`LoadedView::release`] or drop.
    pub async fn load(
        &self,
        objects: &[ObjectId],
        mode: AcquireMode,
    ) -> Result<Vec<Option<LoadedView>>, ClientError> {
        let sent = Instant::now();
        let outcomes = match self
            .call(ClientRequest::Acquire {
                objects: objects.to_vec(),
                mode,
            })
            .await?
        {
            ClientReply::Acquired(outcomes) if outcomes.len() == objects.len() => outcomes,
            ClientReply::Acquired(outcomes) => {
                // One outcome per object or none: a reply of another length would pair hits
                // with the wrong objects. Its leases go back.
                let leases: Vec<LeaseId> = outcomes
                    .iter()
                    .filter_map(|outcome| match outcome {
                        AcquireOutcome::Leased(lease) => Some(lease.lease),
                        AcquireOutcome::Miss | AcquireOutcome::Withheld => None,
                    })
                    .collect();
                let _ = self.release(&leases).await;
                return Err(ClientError::Unexpected(format!(
                    "the node answered {} outcomes for {} objects",
                    outcomes.len(),
                    objects.len()
                )));
            }
            other => return Err(unexpected(other)),
        };
        let mut views = Vec::with_capacity(outcomes.len());
        for outcome in outcomes {
            views.push(match outcome {
                AcquireOutcome::Leased(lease) => Some(self.view(lease, sent)?),
                AcquireOutcome::Miss | AcquireOutcome::Withheld => None,
            });
        }
        Ok(views)
    }

    /// Loads the objects into `buffers` (one per object, each at least the object's length)
    /// and gives the leases back; returns which were hits (a copy that outlived its lease
    /// is a miss). The objects go in batches of at most [`LOAD_BATCH_ITEMS_MAX`] objects and
    /// [`LOAD_BATCH_BYTES_MAX`] bytes of buffers (one larger buffer goes alone), at most
    /// [`LOAD_BATCHES_IN_FLIGHT`] at once: the copy of one batch (on the thread polling this
    /// future) overlaps the acquires of the next ones, and a call of any length stays
    /// within the directory's batch bound. The leases are released in the background in
    /// batches (inline when that queue is full): the copies are done, so nothing waits on
    /// the release. Errors with the first batch's error, after the batches in flight ended.
    pub async fn load_into(
        &self,
        objects: &[ObjectId],
        buffers: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, ClientError> {
        use futures_util::StreamExt;
        let (count, mut lengths) = self.load_batches(objects, buffers);
        let (mut objects, mut buffers) = (&objects[..count], &mut buffers[..count]);
        let mut in_flight = futures_util::stream::FuturesOrdered::new();
        let mut hits = Vec::with_capacity(count);
        let mut failed = None;
        loop {
            while failed.is_none() && in_flight.len() < LOAD_BATCHES_IN_FLIGHT {
                let Some(length) = lengths.next() else {
                    break;
                };
                let (batch, rest) = objects.split_at(length);
                let (targets, others) = std::mem::take(&mut buffers).split_at_mut(length);
                (objects, buffers) = (rest, others);
                in_flight.push_back(self.load_batch(batch, targets));
            }
            match in_flight.next().await {
                Some(Ok(batch)) => hits.extend(batch),
                Some(Err(error)) => {
                    failed.get_or_insert(error);
                }
                None => break,
            }
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(hits),
        }
    }

    /// One acquire of `objects`, the copies into `buffers`, the leases handed back.
    async fn load_batch(
        &self,
        objects: &[ObjectId],
        buffers: &mut [&mut [u8]],
    ) -> Result<Vec<bool>, ClientError> {
        let views = self.load_each(objects).await?;
        let (hits, leases) = self.copy_views(views, buffers);
        // After every copy of the batch, so the releaser wakes once for them all. Best
        // effort, as every release: the copies are done, and a lease not released expires.
        let overflow = self.queue_releases(leases);
        let _ = self.release(&overflow).await;
        Ok(hits)
    }

    /// Queues `leases` for the background releaser; returns those its full queue
    /// ([`DROPPED_LEASES_QUEUED_MAX`](super::DROPPED_LEASES_QUEUED_MAX)) did not take, for
    /// the caller to release itself.
    pub(super) fn queue_releases(&self, leases: Vec<LeaseId>) -> Vec<LeaseId> {
        leases
            .into_iter()
            .filter(|lease| !self.dropped_leases.push(*lease))
            .collect()
    }

    /// Copies each view into its buffer (in order) and ends the views: whether each was a
    /// hit, and the leases to release (every view's, hit or not). The copies use the load
    /// routine this machine runs fastest ([`copy_out_of_pool`]).
    pub(super) fn copy_views(
        &self,
        views: Vec<Option<LoadedView>>,
        buffers: &mut [&mut [u8]],
    ) -> (Vec<bool>, Vec<LeaseId>) {
        let mut hits = Vec::with_capacity(views.len());
        let mut leases = Vec::with_capacity(views.len());
        for (view, buffer) in views.into_iter().zip(buffers.iter_mut()) {
            let Some(view) = view else {
                hits.push(false);
                continue;
            };
            // A copy that finished after the lease's deadline may have read reused pages:
            // it counts as a miss.
            let copied = match view.bytes() {
                Ok(bytes) if buffer.len() >= bytes.len() => {
                    copy_out_of_pool(bytes, buffer);
                    view.is_valid()
                }
                _ => false,
            };
            hits.push(copied);
            leases.push(view.into_lease());
        }
        (hits, leases)
    }

    fn view(&self, lease: Lease, sent: Instant) -> Result<LoadedView, ClientError> {
        let memory = self.memory(lease.location.pool)?;
        // Validate the range now; the view re-borrows it from the shared pool map.
        memory
            .slice(lease.location.offset_bytes, lease.location.length_bytes)
            .map_err(|source| ClientError::Pool {
                pool: lease.location.pool,
                source,
            })?;
        // The directory started the lease after this client sent the acquire, so this local
        // deadline is never later than the directory's; the margin covers clock-rate drift.
        let duration = Duration::from_millis(lease.duration_ms);
        let valid_until = sent + duration.saturating_sub(duration / LEASE_MARGIN_DIVISOR);
        Ok(LoadedView {
            pools: self.pools.clone(),
            valid_until,
            lease,
            dropped_leases: Some(self.dropped_leases.clone()),
        })
    }
}
