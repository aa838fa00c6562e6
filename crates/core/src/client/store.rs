//! Stores: one object (`BeginStore`, the copy, `CommitStore`) or many, in pipelined
//! batches (`BeginStoreMany`, the copies, `CommitStoreMany`).

use super::batches::batch_lengths;
use super::{call, unexpected, Client, ClientError, StoreOutcome, StoreSkip, LEASE_MARGIN_DIVISOR};
use crate::directory::{CommitOutcome, ReserveItem};
use crate::model::{Location, ObjectId};
use crate::protocol::messages::{
    ClientReply, ClientRequest, ProtocolError, StoreCommitted, StoreGrant, STORE_BATCH_ITEMS_MAX,
};
use crate::wire::RpcClient;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Store batches one `store_many` keeps in flight: at most 4 × 64 = 256 tickets, well under
/// what a node admits per client (`tickets_max`, 1024), and 4 × [`STORE_BATCH_BYTES_MAX`]
/// granted and not yet committed (or 4 objects, where they are larger).
pub const STORE_BATCHES_IN_FLIGHT: usize = 4;
/// Bytes one store batch carries at most (one larger object goes alone): a batch's copy
/// (about 0.8 ms at 10 GB/s) outlasts a round trip, so the copies of the batches in flight
/// cover the reserves and commits of the others. Smaller batches (4 MiB) measured worse on
/// a busy two-core host: each batch costs the node and the directory a round trip of CPU.
pub const STORE_BATCH_BYTES_MAX: u64 = 8 << 20;

impl Client {
    /// Stores one object's bytes.
    pub async fn store(&self, object: ObjectId, bytes: &[u8]) -> Result<StoreOutcome, ClientError> {
        let sent = Instant::now();
        let grant = self
            .call(ClientRequest::BeginStore {
                object,
                length_bytes: bytes.len() as u64,
            })
            .await?;
        let (ticket, location, valid_until) = match grant {
            ClientReply::Grant(grant) => match granted(sent, Ok(grant)) {
                Granted::Write {
                    ticket,
                    location,
                    valid_until,
                } => (ticket, location, valid_until),
                Granted::Done(outcome) => return outcome,
            },
            other => return Err(unexpected(other)),
        };
        match self.write_granted(location, bytes, valid_until) {
            Ok(true) => {}
            written => {
                let _ = self.call(ClientRequest::AbortStore { ticket }).await;
                return written.map(|_| StoreOutcome::Skipped(StoreSkip::GrantExpired));
            }
        }
        match self.call(ClientRequest::CommitStore { ticket }).await? {
            ClientReply::Stored(committed) => outcome(StoreCommitted::Stored(committed)),
            ClientReply::NotStored => outcome(StoreCommitted::NotStored),
            other => Err(unexpected(other)),
        }
    }

    /// Stores several objects; one outcome per item, in order. The items go in batches of
    /// at most [`STORE_BATCH_ITEMS_MAX`] items and [`STORE_BATCH_BYTES_MAX`] bytes (an
    /// object larger than that goes alone); each takes one round trip to reserve (the node
    /// then one to the directory) and one to commit. At most [`STORE_BATCHES_IN_FLIGHT`]
    /// batches are in flight at once: the node's ticket bound is never reached by one call,
    /// and the copy of one batch (on the thread polling this future) overlaps the reserve
    /// of the next ones and the commit of the previous one.
    pub async fn store_many(
        &self,
        items: &[(ObjectId, &[u8])],
    ) -> Vec<Result<StoreOutcome, ClientError>> {
        use futures_util::StreamExt;
        let sizes = items.iter().map(|(_, bytes)| bytes.len() as u64);
        let mut lengths =
            batch_lengths(sizes, STORE_BATCH_ITEMS_MAX, STORE_BATCH_BYTES_MAX).into_iter();
        // A window of batches kept by hand rather than a stream combinator with a closure:
        // the future stays `Send` for any lifetime of `items`, so it can be spawned.
        let mut in_flight = futures_util::stream::FuturesOrdered::new();
        let mut outcomes = Vec::with_capacity(items.len());
        let mut start = 0;
        loop {
            while in_flight.len() < STORE_BATCHES_IN_FLIGHT {
                let Some(length) = lengths.next() else {
                    break;
                };
                in_flight.push_back(self.store_batch(&items[start..start + length]));
                start += length;
            }
            match in_flight.next().await {
                Some(done) => outcomes.extend(done),
                None => return outcomes,
            }
        }
    }

    /// One `BeginStoreMany`, the copies of the granted items, one `CommitStoreMany`. A
    /// batch dropped half way (its `store_many` future dropped) aborts its grants at once:
    /// the reserve runs on its own task, which aborts the grants nobody took, and the
    /// grants taken go to the background aborter unless their commit was answered.
    async fn store_batch(
        &self,
        items: &[(ObjectId, &[u8])],
    ) -> Vec<Result<StoreOutcome, ClientError>> {
        let reserve = items.iter().map(|(object, bytes)| ReserveItem {
            object: *object,
            length_bytes: bytes.len() as u64,
        });
        match self.begin_batch_detached(reserve.collect()).await {
            Ok((mut unsettled, grants)) => {
                let bytes = items.iter().map(|(_, bytes)| *bytes);
                let copied = self.copy_batch(grants, bytes);
                let outcomes = self.finish_batch(copied).await;
                unsettled.tickets.clear();
                outcomes
            }
            Err(error) => every_item(items.len(), &error),
        }
    }

    /// [`Client::begin_batch`] on a task of its own. The grants travel with their
    /// [`AbortOnDrop`] guard, made before they are sent: grants nobody takes (the caller
    /// stopped waiting, or was dropped after the send but before it read them) are aborted.
    async fn begin_batch_detached(
        &self,
        items: Vec<ReserveItem>,
    ) -> Result<(AbortOnDrop, BatchGrants), ClientError> {
        let (sender, receiver) = oneshot::channel();
        let client = self.clone();
        tokio::spawn(async move {
            let reserved = client.begin_batch(items).await.map(|grants| {
                let guard = AbortOnDrop::new(&client, grants.tickets());
                (guard, grants)
            });
            // A send refused (or a value never read) drops the guard, which queues the aborts.
            let _ = sender.send(reserved);
        });
        receiver.await.unwrap_or_else(|_| {
            Err(ClientError::Unexpected(
                "the runtime stopped before the reserve ended".into(),
            ))
        })
    }

    /// The `BeginStoreMany` of a batch: one grant (or refusal) per item, in order.
    pub(super) async fn begin_batch(
        &self,
        items: Vec<ReserveItem>,
    ) -> Result<BatchGrants, ClientError> {
        let sent = Instant::now();
        let count = items.len();
        match self.call(ClientRequest::BeginStoreMany { items }).await? {
            ClientReply::Grants(grants) if grants.len() == count => {
                Ok(BatchGrants { sent, grants })
            }
            other => Err(unexpected(other)),
        }
    }

    /// Copies each granted item's bytes (one slice per grant, in order) into its pages.
    pub(super) fn copy_batch<'a>(
        &self,
        grants: BatchGrants,
        bytes: impl IntoIterator<Item = &'a [u8]>,
    ) -> CopiedBatch {
        let mut copied = CopiedBatch {
            outcomes: Vec::with_capacity(grants.grants.len()),
            commits: Vec::new(),
            aborts: Vec::new(),
        };
        for (index, (grant, bytes)) in grants.grants.into_iter().zip(bytes).enumerate() {
            copied.outcomes.push(match granted(grants.sent, grant) {
                Granted::Done(outcome) => outcome,
                Granted::Write {
                    ticket,
                    location,
                    valid_until,
                } => match self.write_granted(location, bytes, valid_until) {
                    Ok(true) => {
                        copied.commits.push((index, ticket));
                        Ok(StoreOutcome::Stored)
                    }
                    written => {
                        copied.aborts.push(ticket);
                        written.map(|_| StoreOutcome::Skipped(StoreSkip::GrantExpired))
                    }
                },
            });
        }
        copied
    }

    /// The `CommitStoreMany` of a copied batch (and the aborts of the copies that failed):
    /// the batch's outcomes, one per item in order.
    pub(super) async fn finish_batch(
        &self,
        copied: CopiedBatch,
    ) -> Vec<Result<StoreOutcome, ClientError>> {
        let CopiedBatch {
            mut outcomes,
            commits,
            aborts,
        } = copied;
        let aborted = self.abort_tickets(aborts);
        let commit = async {
            if commits.is_empty() {
                return Ok(ClientReply::StoredMany(Vec::new()));
            }
            let tickets = commits.iter().map(|(_, ticket)| *ticket).collect();
            self.call(ClientRequest::CommitStoreMany { tickets }).await
        };
        let (committed, ()) = futures_util::join!(commit, aborted);
        match committed {
            Ok(ClientReply::StoredMany(committed)) if committed.len() == commits.len() => {
                for ((index, _), committed) in commits.iter().zip(committed) {
                    outcomes[*index] = outcome(committed);
                }
            }
            other => {
                let error = match other {
                    Ok(reply) => unexpected(reply),
                    Err(error) => error,
                };
                for (index, _) in &commits {
                    outcomes[*index] = Err(error.for_item());
                }
            }
        }
        outcomes
    }

    /// Gives granted tickets back at once (their pages free, their reservations aborted)
    /// rather than leaving them to expire. Best effort: a ticket not aborted expires.
    pub(super) async fn abort_tickets(&self, tickets: Vec<u64>) {
        let aborted = tickets
            .into_iter()
            .map(|ticket| self.call(ClientRequest::AbortStore { ticket }));
        futures_util::future::join_all(aborted).await;
    }

    /// Copies `bytes` into a granted `location` with the store routine
    /// ([`SharedMemory::store_at`](crate::backends::shared_memory::SharedMemory::store_at)),
    /// so the bytes are visible before the commit is sent; `Ok(false)` when the grant ran out before or while writing (the pages may be
    /// another store's by then: abort, do not commit).
    fn write_granted(
        &self,
        location: Location,
        bytes: &[u8],
        valid_until: Instant,
    ) -> Result<bool, ClientError> {
        if Instant::now() >= valid_until {
            return Ok(false);
        }
        self.memory(location.pool).and_then(|memory| {
            memory
                .store_at(location.offset_bytes, bytes)
                .map_err(|source| ClientError::Pool {
                    pool: location.pool,
                    source,
                })
        })?;
        Ok(Instant::now() < valid_until)
    }
}

/// A batch's grants, one per item, and when their request was sent.
pub(super) struct BatchGrants {
    sent: Instant,
    grants: Vec<Result<StoreGrant, ProtocolError>>,
}

impl BatchGrants {
    /// How many grants (or refusals): one per item of the batch.
    pub(super) fn len(&self) -> usize {
        self.grants.len()
    }

    /// The grants cut into consecutive parts of `lengths` items (past the grants, empty
    /// parts), each with when the request was sent.
    pub(super) fn split(self, lengths: &[usize]) -> Vec<BatchGrants> {
        let mut grants = self.grants.into_iter();
        lengths
            .iter()
            .map(|length| BatchGrants {
                sent: self.sent,
                grants: grants.by_ref().take(*length).collect(),
            })
            .collect()
    }

    /// The tickets of the grants that let the client write (to abort when it will not).
    pub(super) fn tickets(&self) -> Vec<u64> {
        self.grants
            .iter()
            .filter_map(|grant| match grant {
                Ok(StoreGrant::Write { ticket, .. }) => Some(*ticket),
                _ => None,
            })
            .collect()
    }
}

/// Store tickets granted to a future that may be dropped before their commit is answered:
/// on drop, those left go to the client's background aborter (bounded: past
/// [`DROPPED_TICKETS_QUEUED_MAX`](super::DROPPED_TICKETS_QUEUED_MAX) they expire). An abort
/// of a ticket whose commit the node did take is refused, harmlessly.
pub(super) struct AbortOnDrop {
    pub(super) tickets: Vec<u64>,
    queue: mpsc::Sender<u64>,
}

impl AbortOnDrop {
    /// Aborts `tickets` when dropped, unless taken out of it first.
    pub(super) fn new(client: &Client, tickets: Vec<u64>) -> AbortOnDrop {
        AbortOnDrop {
            tickets,
            queue: client.dropped_tickets.clone(),
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for ticket in self.tickets.drain(..) {
            let _ = self.queue.try_send(ticket);
        }
    }
}

/// Aborts the tickets of dropped store futures, up to 64 at once.
pub(super) async fn abort_dropped(
    rpc: RpcClient<ClientRequest, ClientReply>,
    mut queue: mpsc::Receiver<u64>,
) {
    let mut tickets = Vec::new();
    while queue.recv_many(&mut tickets, STORE_BATCH_ITEMS_MAX).await > 0 {
        let aborts = tickets
            .drain(..)
            .map(|ticket| call(&rpc, ClientRequest::AbortStore { ticket }));
        // Best effort: a ticket not aborted expires.
        futures_util::future::join_all(aborts).await;
    }
}

/// A batch after its copies: the outcomes known so far, the tickets to commit (with their
/// items' indexes) and those to abort.
pub(super) struct CopiedBatch {
    outcomes: Vec<Result<StoreOutcome, ClientError>>,
    commits: Vec<(usize, u64)>,
    aborts: Vec<u64>,
}

/// What a store's grant asks of the client: a copy to make, or nothing more (the store's
/// outcome is known).
enum Granted {
    Write {
        ticket: u64,
        location: Location,
        valid_until: Instant,
    },
    Done(Result<StoreOutcome, ClientError>),
}

/// Reads a grant (or its refusal) the node sent in answer to a request sent at `sent`.
fn granted(sent: Instant, grant: Result<StoreGrant, ProtocolError>) -> Granted {
    match grant {
        Ok(StoreGrant::Write {
            ticket,
            location,
            valid_ms,
        }) => Granted::Write {
            ticket,
            location,
            valid_until: grant_deadline(sent, valid_ms),
        },
        Ok(StoreGrant::AlreadyPresent) => Granted::Done(Ok(StoreOutcome::AlreadyPresent)),
        Ok(StoreGrant::Pending) => Granted::Done(Ok(StoreOutcome::Pending)),
        Ok(StoreGrant::Skip(skip)) => Granted::Done(Ok(StoreOutcome::Skipped(skip))),
        Err(refused) => Granted::Done(Err(ClientError::Refused(refused))),
    }
}

/// The store's outcome for how its commit ended.
fn outcome(committed: StoreCommitted) -> Result<StoreOutcome, ClientError> {
    match committed {
        StoreCommitted::Stored(CommitOutcome::Committed) => Ok(StoreOutcome::Stored),
        StoreCommitted::Stored(CommitOutcome::AlreadyPresent) => Ok(StoreOutcome::AlreadyPresent),
        StoreCommitted::NotStored => Ok(StoreOutcome::Skipped(StoreSkip::NotPublished)),
        StoreCommitted::Pending => Ok(StoreOutcome::Pending),
        StoreCommitted::Skipped(skip) => Ok(StoreOutcome::Skipped(skip)),
        StoreCommitted::Refused(refused) => Err(ClientError::Refused(refused)),
    }
}

/// The local deadline of a grant valid for `valid_ms` from the request sent at `sent`:
/// measured from before the request, so never later than the node's deadline.
fn grant_deadline(sent: Instant, valid_ms: u64) -> Instant {
    let valid = Duration::from_millis(valid_ms);
    sent + valid.saturating_sub(valid / LEASE_MARGIN_DIVISOR)
}

/// `error` as the outcome of each of `items` items of a batch that failed whole.
pub(super) fn every_item(
    items: usize,
    error: &ClientError,
) -> Vec<Result<StoreOutcome, ClientError>> {
    (0..items).map(|_| Err(error.for_item())).collect()
}
