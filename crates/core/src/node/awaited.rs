//! Reserves still under way at the directory for grants the node already handed out.
//!
//! A node whose client session has seen its stores placed in one pool grants the next
//! batch's pages (a batch of 1 MiB or more) in that pool at once and sends the batch's reserve to the directory at the
//! same time: the client copies while the reserve travels, and the reserve's round trip
//! leaves the store's path. Each such grant's ticket names its batch and its index in it
//! ([`Reservation::Awaited`]); whoever ends the ticket (its commit, its abort, its expiry,
//! the client's disconnection) takes the item's [`Resolution`] from here once the directory
//! answered: the reservation to commit or abort, or the store's end when the directory did
//! not reserve it where the pages are.
//!
//! Bounds: one batch per `BeginStoreMany` with grants awaited, each removed when its last
//! item was taken; items are at most [`STORE_BATCH_ITEMS_MAX`] per batch and a batch lives
//! only while a ticket names it, so the batches are at most the tickets the node's clients
//! hold ([`ClientLimits::tickets_max`](super::ClientLimits) each).
//!
//! [`STORE_BATCH_ITEMS_MAX`]: crate::protocol::messages::STORE_BATCH_ITEMS_MAX

use crate::directory::StoreSkip;
use crate::model::{ReplicaId, SessionId};
use std::collections::HashMap;

/// Where a granted store's reservation at the directory stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// Made: commit or abort this replica with this session.
    Made {
        session: SessionId,
        replica: ReplicaId,
    },
    /// Sent with item `index` of awaited batch `batch`, not necessarily answered yet.
    Awaited { batch: u64, index: u32 },
}

/// How the directory answered one awaited item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Reserved in the pool the pages are in.
    Made {
        session: SessionId,
        replica: ReplicaId,
    },
    /// Not reserved where the pages are (and any reservation elsewhere given back): the
    /// store ends with this outcome and its pages are freed.
    Ended(AwaitedEnd),
}

/// Why an awaited store ends without a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AwaitedEnd {
    /// Another replica is READY where this node reads it.
    AlreadyPresent,
    /// Another writer is storing it.
    Pending,
    /// Skipped, for this reason (`NoRoom` also when the directory placed it in another
    /// pool than the one the pages were granted in).
    Skipped(StoreSkip),
    /// The reserve failed: this error, as the node tells the client.
    Failed(String),
}

/// What [`AwaitedReserves::take`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// The item's resolution, taken (once).
    Resolved(Resolution),
    /// The directory has not answered yet: wait for [`AwaitedReserves::answer`].
    Waiting,
    /// No such batch or item, or the item was taken already.
    Unknown,
}

#[derive(Debug)]
struct Batch {
    /// Set once, by [`AwaitedReserves::answer`].
    answer: Option<Vec<Option<Resolution>>>,
    /// Items in the batch.
    items: usize,
    /// Items not taken yet; the batch goes when none is left.
    untaken: usize,
}

/// The awaited batches of one node (see the module documentation).
#[derive(Debug, Default)]
pub struct AwaitedReserves {
    batches: HashMap<u64, Batch>,
    next: u64,
}

impl AwaitedReserves {
    /// A new batch of `items` awaited items; its number.
    pub fn begin(&mut self, items: usize) -> u64 {
        let batch = self.next;
        self.next += 1;
        if items > 0 {
            self.batches.insert(
                batch,
                Batch {
                    answer: None,
                    items,
                    untaken: items,
                },
            );
        }
        batch
    }

    /// The directory's answer for `batch`, one resolution per item in order (missing items
    /// end as failed). Answers after the first, and for unknown batches, are ignored.
    pub fn answer(&mut self, batch: u64, resolutions: Vec<Resolution>) {
        let Some(entry) = self.batches.get_mut(&batch) else {
            return;
        };
        if entry.answer.is_some() {
            return;
        }
        let mut resolutions = resolutions.into_iter();
        let answer = (0..entry.items)
            .map(|_| {
                Some(resolutions.next().unwrap_or_else(|| {
                    Resolution::Ended(AwaitedEnd::Failed("a reserve outcome is missing".into()))
                }))
            })
            .collect();
        entry.answer = Some(answer);
    }

    /// Takes item `index` of `batch` (see [`Taken`]).
    pub fn take(&mut self, batch: u64, index: u32) -> Taken {
        let Some(entry) = self.batches.get_mut(&batch) else {
            return Taken::Unknown;
        };
        let index = index as usize;
        let Some(answer) = entry.answer.as_mut() else {
            return if index < entry.items {
                Taken::Waiting
            } else {
                Taken::Unknown
            };
        };
        let Some(resolution) = answer.get_mut(index).and_then(Option::take) else {
            return Taken::Unknown;
        };
        entry.untaken -= 1;
        if entry.untaken == 0 {
            self.batches.remove(&batch);
        }
        Taken::Resolved(resolution)
    }

    /// Batches not yet answered or with items not yet taken.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether no batch is awaited.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(replica: u64) -> Resolution {
        Resolution::Made {
            session: SessionId(1),
            replica: ReplicaId(replica),
        }
    }

    #[test]
    fn each_item_is_taken_once_after_the_answer_and_the_batch_goes_with_its_last() {
        let mut awaited = AwaitedReserves::default();
        let batch = awaited.begin(2);
        assert_eq!(awaited.take(batch, 0), Taken::Waiting);
        assert_eq!(awaited.take(batch, 2), Taken::Unknown);
        let present = Resolution::Ended(AwaitedEnd::AlreadyPresent);
        awaited.answer(batch, vec![made(7), present.clone()]);
        // A second answer changes nothing.
        awaited.answer(batch, vec![made(8), made(9)]);
        assert_eq!(awaited.take(batch, 1), Taken::Resolved(present));
        assert_eq!(awaited.take(batch, 1), Taken::Unknown);
        assert_eq!(awaited.len(), 1);
        assert_eq!(awaited.take(batch, 0), Taken::Resolved(made(7)));
        assert!(awaited.is_empty());
        assert_eq!(awaited.take(batch, 0), Taken::Unknown);
    }

    #[test]
    fn a_short_answer_fails_the_missing_items_and_batches_are_numbered_apart() {
        let mut awaited = AwaitedReserves::default();
        let first = awaited.begin(2);
        let second = awaited.begin(1);
        assert_ne!(first, second);
        awaited.answer(first, vec![made(1)]);
        assert!(matches!(
            awaited.take(first, 1),
            Taken::Resolved(Resolution::Ended(AwaitedEnd::Failed(_)))
        ));
        assert_eq!(awaited.take(second, 0), Taken::Waiting);
        // An answer for a batch nobody awaits is ignored.
        awaited.answer(99, vec![made(3)]);
        assert_eq!(awaited.len(), 2);
    }
}
