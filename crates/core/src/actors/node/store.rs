//! The store path of a client session: a reserve at the directory becomes pages in a local
//! pool and a grant for the client; a written grant's commit publishes it, and its pages
//! follow the node core's rule for how the commit ended. Single stores (`BeginStore`,
//! `CommitStore`) and batches of up to [`STORE_BATCH_ITEMS_MAX`] (`BeginStoreMany`,
//! `CommitStoreMany`) take the same steps per item; a batch makes one directory round trip.
//! A client session whose batches land whole in one pool gets its next batch's pages there
//! at once, the batch's reserve answered while it copies; its commit takes the answer
//! ([`crate::node::awaited`]).
//!
//! [`STORE_BATCH_ITEMS_MAX`]: crate::protocol::messages::STORE_BATCH_ITEMS_MAX

use super::actor::commit_result;
use super::client_session::{give_back, refusal};
use super::link::{unwatched, CommitRequest, LinkError};
use super::services::{AllocationRefused, NodeServices};
use crate::directory::{CommitOutcome, ReserveItem, ReserveOutcome, StoreSkip};
use crate::metrics::Direction;
use crate::model::{Location, PoolId, SessionId};
use crate::node::{
    after_commit, AwaitedEnd, ClientId, ClientRefusal, PagesAfterCommit, Reservation, Resolution,
    Ticket,
};
use crate::protocol::messages::{ClientReply, ProtocolError, StoreCommitted, StoreGrant};
use crate::protocol::node::{unknown_ticket, AdmittedStore, Change};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `BeginStore`: reserves, allocates and answers with the grant.
pub async fn begin_store(
    services: NodeServices,
    client: ClientId,
    admitted: AdmittedStore,
    valid: Duration,
) -> (ClientReply, Change) {
    let (session, reserved) = services.link.reserve(admitted.item).await;
    let ticket = admitted.ticket;
    match grant(&services, client, &admitted, valid, session, reserved).await {
        (Ok(grant), Some(granted)) => (ClientReply::Grant(grant), Change::Ticket(ticket, granted)),
        (Ok(grant), None) => (ClientReply::Grant(grant), Change::None),
        (Err(error), _) => (ClientReply::Error(error), Change::None),
    }
}

/// `BeginStoreMany`: one reserve round trip for every admitted item, then each item as
/// `BeginStore` would answer it; an item the books refused keeps its refusal. When the
/// client's last batch was placed whole in one pool and this one carries at least
/// [`EARLY_GRANT_BYTES_MIN`], its pages are granted there at once and its reserve answered
/// while the client copies ([`grant_before_reserve`]).
pub async fn begin_store_many(
    services: NodeServices,
    client: ClientId,
    admitted: Vec<Result<AdmittedStore, ClientRefusal>>,
    valid: Duration,
    placement: Arc<StorePlacement>,
) -> (ClientReply, Change) {
    let items: Vec<ReserveItem> = admitted
        .iter()
        .filter_map(|entry| entry.as_ref().ok().map(|store| store.item))
        .collect();
    let bytes: u64 = items.iter().map(|item| item.length_bytes).sum();
    let early_pool = placement.pool().filter(|_| bytes >= EARLY_GRANT_BYTES_MIN);
    let Some(pool) = early_pool else {
        let (session, reserved) = services.link.reserve_many(&items).await;
        return grant_after_reserve(
            &services, client, admitted, valid, &placement, session, reserved,
        )
        .await;
    };
    // The reserve goes first, on a task of its own: the directory works on it while this
    // node allocates the pages.
    let reserve = {
        let (services, items) = (services.clone(), items.clone());
        actix_rt::spawn(unwatched(async move {
            services.link.reserve_many(&items).await
        }))
    };
    match allocate_all(&services, client, &admitted, pool).await {
        Some(locations) => {
            let early = EarlyBatch {
                pool,
                items,
                reserve,
            };
            grant_before_reserve(&services, &admitted, valid, &placement, early, locations)
        }
        None => {
            let (session, reserved) = reserve_answer(&services, items.len(), reserve).await;
            grant_after_reserve(
                &services, client, admitted, valid, &placement, session, reserved,
            )
            .await
        }
    }
}

/// The reserve task's answer; every item failed when the task ended without one (the
/// runtime stopping).
async fn reserve_answer(
    services: &NodeServices,
    items: usize,
    reserve: actix_rt::task::JoinHandle<Reserved>,
) -> Reserved {
    reserve.await.unwrap_or_else(|_| {
        let failed = || Err(LinkError::Unexpected("the reserve task ended".into()));
        (
            services.link.session(),
            (0..items).map(|_| failed()).collect(),
        )
    })
}

/// Bytes a batch must carry for its pages to be granted before its reserve is answered:
/// what saves is the part of the reserve's round trip the client's copy hides, at most the
/// copy's length, and a copy of 1 MiB takes about one round trip (100 µs at 10 GB/s). A
/// smaller batch would save a few microseconds for the early path's work (an extra task,
/// the answer handed through the node core), measured to cost 4 KiB stores at four
/// batches in flight a tenth of their rate.
pub const EARLY_GRANT_BYTES_MIN: u64 = 1 << 20;

/// A reserve's session and its outcome per item.
type Reserved = (SessionId, Vec<Result<ReserveOutcome, LinkError>>);

/// Each admitted item as `BeginStore` would answer it, once the batch's reserve answered
/// (`reserved`, one outcome per admitted item); an item the books refused keeps its
/// refusal. The answer places (or unplaces) the session.
async fn grant_after_reserve(
    services: &NodeServices,
    client: ClientId,
    admitted: Vec<Result<AdmittedStore, ClientRefusal>>,
    valid: Duration,
    placement: &StorePlacement,
    session: SessionId,
    reserved: Vec<Result<ReserveOutcome, LinkError>>,
) -> (ClientReply, Change) {
    placement.learn(&reserved);
    let mut reserved = reserved.into_iter();
    let mut grants = Vec::with_capacity(admitted.len());
    let mut granted = Vec::new();
    for entry in admitted {
        let store = match entry {
            Ok(store) => store,
            Err(refused) => {
                grants.push(Err(ProtocolError::Client(refused)));
                continue;
            }
        };
        let outcome = reserved
            .next()
            .unwrap_or_else(|| Err(LinkError::Unexpected("a reserve outcome is missing".into())));
        let (grant, booked) = grant(services, client, &store, valid, session, outcome).await;
        if let Some(booked) = booked {
            granted.push((store.ticket, booked));
        }
        grants.push(grant);
    }
    (ClientReply::Grants(grants), Change::Tickets(granted))
}

/// The pool a client session's store batches were last placed in, whole: where its next
/// batch's pages are granted before the directory answers. Unset at first, and again when
/// the directory places an item elsewhere or finds no room, so a session whose pool fills
/// goes back to asking first (and learns the next pool from that answer).
#[derive(Debug)]
pub struct StorePlacement(AtomicU64);

impl Default for StorePlacement {
    fn default() -> Self {
        StorePlacement(AtomicU64::new(UNPLACED))
    }
}

/// [`StorePlacement`]'s value when no pool is learned (pool ids are 32 bits).
const UNPLACED: u64 = u64::MAX;

impl StorePlacement {
    /// The pool learned, if any.
    pub fn pool(&self) -> Option<PoolId> {
        let pool = self.0.load(Ordering::Relaxed);
        u32::try_from(pool).ok().map(PoolId)
    }

    /// Learns from a batch's reserve outcomes: the pool when every item was granted, all
    /// in that one pool; unset when any was not (placed apart, skipped, failed, or already
    /// stored by someone: a copy made before the answer would be wasted on it). A batch with
    /// no outcome changes nothing.
    pub fn learn(&self, reserved: &[Result<ReserveOutcome, LinkError>]) {
        let mut learned = None;
        for outcome in reserved {
            match outcome {
                Ok(ReserveOutcome::Granted { pool, .. })
                    if learned.is_none_or(|learned| learned == *pool) =>
                {
                    learned = Some(*pool);
                }
                _ => return self.set(None),
            }
        }
        if learned.is_some() {
            self.set(learned);
        }
    }

    fn set(&self, pool: Option<PoolId>) {
        let value = pool.map_or(UNPLACED, |pool| u64::from(pool.0));
        self.0.store(value, Ordering::Relaxed);
    }
}

/// Pages in `pool` for every admitted item, in order; `None` (any taken given back) when
/// the pool cannot give them all now.
async fn allocate_all(
    services: &NodeServices,
    client: ClientId,
    admitted: &[Result<AdmittedStore, ClientRefusal>],
    pool: PoolId,
) -> Option<Vec<Location>> {
    let actor = services.pools.get(&pool)?;
    let mut locations = Vec::with_capacity(admitted.len());
    for store in admitted.iter().flatten() {
        let length_bytes = store.item.length_bytes;
        match services
            .allocate_for(actor, pool, length_bytes, Some(client))
            .await
        {
            Ok(Ok(allocation)) => locations.push(Location {
                pool,
                allocation: allocation.id,
                generation: allocation.generation,
                offset_bytes: allocation.offset,
                length_bytes,
            }),
            _ => {
                for location in locations {
                    services.free(location).await;
                }
                return None;
            }
        }
    }
    Some(locations)
}

/// A batch whose pages are allocated before its reserve was answered.
struct EarlyBatch {
    /// Where its pages are.
    pool: PoolId,
    /// The admitted items, in order.
    items: Vec<ReserveItem>,
    /// The reserve under way.
    reserve: actix_rt::task::JoinHandle<Reserved>,
}

/// Grants every admitted item its pages (`locations`, in order) at once, ticketed with the
/// awaited reserve ([`crate::node::awaited`]): the reserve's round trip overlaps the
/// client's copy, and the commit (or abort) takes its answer. An item the directory does
/// not reserve in that pool ends at its commit with the directory's outcome (pages freed,
/// any reservation elsewhere given back) and unsets `placement`.
fn grant_before_reserve(
    services: &NodeServices,
    admitted: &[Result<AdmittedStore, ClientRefusal>],
    valid: Duration,
    placement: &Arc<StorePlacement>,
    early: EarlyBatch,
    locations: Vec<Location>,
) -> (ClientReply, Change) {
    let batch = services.core().awaited.begin(early.items.len());
    let mut locations = locations.into_iter();
    actix_rt::spawn(unwatched(answer_awaited(
        services.clone(),
        batch,
        early,
        placement.clone(),
    )));
    let mut grants = Vec::with_capacity(admitted.len());
    let mut granted = Vec::with_capacity(locations.len());
    for entry in admitted {
        let store = match entry {
            Ok(store) => store,
            Err(refused) => {
                grants.push(Err(ProtocolError::Client(*refused)));
                continue;
            }
        };
        let Some(location) = locations.next() else {
            break;
        };
        grants.push(Ok(StoreGrant::Write {
            ticket: store.ticket,
            location,
            valid_ms: valid.as_millis() as u64,
        }));
        let index = granted.len() as u32;
        let booked = Ticket {
            reservation: Reservation::Awaited { batch, index },
            object: store.item.object,
            location,
        };
        granted.push((store.ticket, booked));
    }
    (ClientReply::Grants(grants), Change::Tickets(granted))
}

/// The reserve of awaited `batch`: its answer, one resolution per item, goes to the node
/// core and wakes whoever waits for it; a reservation the directory made in another pool
/// than the batch's pages is given back. A task dropped before the answer (the runtime
/// stopping) answers every item as failed.
async fn answer_awaited(
    services: NodeServices,
    batch: u64,
    early: EarlyBatch,
    placement: Arc<StorePlacement>,
) {
    let answer = AwaitedAnswer {
        services: services.clone(),
        batch,
        answered: false,
    };
    let EarlyBatch {
        pool,
        items,
        reserve,
    } = early;
    let (session, reserved) = reserve_answer(&services, items.len(), reserve).await;
    let mut elsewhere = Vec::new();
    let mut resolutions = Vec::with_capacity(items.len());
    for (item, outcome) in items.iter().zip(reserved) {
        resolutions.push(match outcome {
            Ok(ReserveOutcome::Granted {
                replica,
                pool: granted,
                ..
            }) => {
                if granted == pool {
                    Resolution::Made { session, replica }
                } else {
                    elsewhere.push(replica);
                    Resolution::Ended(AwaitedEnd::Skipped(StoreSkip::NoRoom))
                }
            }
            Ok(ReserveOutcome::AlreadyPresent) => Resolution::Ended(AwaitedEnd::AlreadyPresent),
            Ok(ReserveOutcome::Pending) => Resolution::Ended(AwaitedEnd::Pending),
            Ok(ReserveOutcome::Skip(skip)) => Resolution::Ended(AwaitedEnd::Skipped(skip)),
            Err(error) if error.is_unavailable() => {
                services.reregister_if_unknown(&error, [item.object.namespace]);
                Resolution::Ended(AwaitedEnd::Skipped(StoreSkip::DirectoryUnavailable))
            }
            Err(error) => Resolution::Ended(AwaitedEnd::Failed(refusal(Err(error)).to_string())),
        });
    }
    // An item not reserved where its pages are (placed elsewhere, skipped, already
    // stored): the next batch asks first, and learns again from that answer.
    if resolutions
        .iter()
        .any(|resolution| !matches!(resolution, Resolution::Made { .. }))
    {
        placement.set(None);
    }
    let count = |matching: fn(&Resolution) -> bool| {
        resolutions
            .iter()
            .filter(|resolution| matching(resolution))
            .count()
    };
    let reserved = count(|resolution| matches!(resolution, Resolution::Made { .. }));
    let no_room = count(|resolution| {
        matches!(
            resolution,
            Resolution::Ended(AwaitedEnd::Skipped(StoreSkip::NoRoom))
        )
    });
    let ended = resolutions.len() - reserved - no_room;
    services
        .link_metrics
        .early_grants_answered(reserved, no_room, ended);
    answer.answer(resolutions);
    for replica in elsewhere {
        services.link.abort(session, replica).await;
    }
}

/// Hands an awaited batch's answer to the node core once, and wakes its waiters; dropped
/// unanswered, it answers every item as failed.
struct AwaitedAnswer {
    services: NodeServices,
    batch: u64,
    answered: bool,
}

impl AwaitedAnswer {
    fn answer(mut self, resolutions: Vec<Resolution>) {
        self.deliver(resolutions);
    }

    fn deliver(&mut self, resolutions: Vec<Resolution>) {
        self.answered = true;
        self.services.core().awaited.answer(self.batch, resolutions);
        self.services.reserves_answered.notify_waiters();
    }
}

impl Drop for AwaitedAnswer {
    fn drop(&mut self) {
        if !self.answered {
            // An empty answer fails every item.
            self.deliver(Vec::new());
        }
    }
}

/// What a reserve's outcome becomes for the client: a grant (with the ticket to book when
/// pages were allocated) or a refusal. Pages the client cannot get give the reservation
/// back.
async fn grant(
    services: &NodeServices,
    client: ClientId,
    store: &AdmittedStore,
    valid: Duration,
    session: SessionId,
    reserved: Result<ReserveOutcome, LinkError>,
) -> (Result<StoreGrant, ProtocolError>, Option<Ticket>) {
    let item = store.item;
    let (replica, pool) = match reserved {
        Ok(ReserveOutcome::Granted { replica, pool, .. }) => (replica, pool),
        Ok(ReserveOutcome::AlreadyPresent) => return (Ok(StoreGrant::AlreadyPresent), None),
        Ok(ReserveOutcome::Pending) => return (Ok(StoreGrant::Pending), None),
        Ok(ReserveOutcome::Skip(skip)) => return (Ok(StoreGrant::Skip(skip)), None),
        // Out of reach or rejoining: the store is skipped, as when the cluster is full.
        Err(error) if error.is_unavailable() => {
            services.reregister_if_unknown(&error, [item.object.namespace]);
            return (Ok(StoreGrant::Skip(StoreSkip::DirectoryUnavailable)), None);
        }
        Err(error) => return (Err(refusal(Err(error))), None),
    };
    let Some(actor) = services.pools.get(&pool) else {
        services.link.abort(session, replica).await;
        let error = ProtocolError::Node(format!("pool {pool} is not mapped by this node"));
        return (Err(error), None);
    };
    let allocated = services
        .allocate_for(actor, pool, item.length_bytes, Some(client))
        .await;
    match allocated {
        Ok(Ok(allocation)) => {
            let location = Location {
                pool,
                allocation: allocation.id,
                generation: allocation.generation,
                offset_bytes: allocation.offset,
                length_bytes: item.length_bytes,
            };
            let grant = StoreGrant::Write {
                ticket: store.ticket,
                location,
                valid_ms: valid.as_millis() as u64,
            };
            let booked = Ticket {
                reservation: Reservation::Made { session, replica },
                object: item.object,
                location,
            };
            (Ok(grant), Some(booked))
        }
        Ok(Err(AllocationRefused::Client(refused))) => {
            services.link.abort(session, replica).await;
            (Err(ProtocolError::Client(refused)), None)
        }
        // The pool's hard limit holds even when the directory's budget lags: skip the store
        // and give the reservation back.
        other => {
            tracing::debug!(
                ?other,
                "local pool refused an allocation the directory granted"
            );
            services.link.abort(session, replica).await;
            (Ok(StoreGrant::Skip(StoreSkip::PoolRefused)), None)
        }
    }
}

/// `CommitStore`: publishes a written grant (once its awaited reserve answered, if it
/// has one).
pub async fn commit_store(services: NodeServices, granted: Ticket) -> (ClientReply, Change) {
    let reply = match resolved(&services, granted).await {
        Ok((granted, request)) => {
            let mark = services.owned_mark();
            let committed = services
                .link
                .commit(request.session, request.replica, request.location)
                .await;
            settle(&services, granted, committed, mark).await
        }
        Err(ended) => ended,
    };
    let reply = match reply {
        StoreCommitted::Stored(outcome) => ClientReply::Stored(outcome),
        StoreCommitted::Refused(error) => ClientReply::Error(error),
        // One commit's reply has no room for why: not published, pages freed.
        StoreCommitted::NotStored | StoreCommitted::Pending | StoreCommitted::Skipped(_) => {
            ClientReply::NotStored
        }
    };
    (reply, Change::None)
}

/// `CommitStoreMany`: one commit round trip for every ticket the client holds (`None`: a
/// ticket it does not hold, refused) whose reservation was made, then each as
/// `CommitStore` would end it.
pub async fn commit_store_many(
    services: NodeServices,
    granted: Vec<Option<Ticket>>,
) -> (ClientReply, Change) {
    let mut tickets = Vec::with_capacity(granted.len());
    for ticket in granted {
        tickets.push(match ticket {
            Some(ticket) => Some(resolved(&services, ticket).await),
            None => None,
        });
    }
    let requests: Vec<CommitRequest> = tickets
        .iter()
        .flatten()
        .filter_map(|ticket| ticket.as_ref().ok().map(|(_, request)| *request))
        .collect();
    let mark = services.owned_mark();
    let mut committed = services.link.commit_many(&requests).await.into_iter();
    let mut replies = Vec::with_capacity(tickets.len());
    for ticket in tickets {
        replies.push(match ticket {
            None => StoreCommitted::Refused(unknown_ticket()),
            Some(Err(ended)) => ended,
            Some(Ok((ticket, _))) => {
                let outcome = committed.next().unwrap_or_else(|| {
                    Err(LinkError::Unexpected("a commit outcome is missing".into()))
                });
                settle(&services, ticket, outcome, mark).await
            }
        });
    }
    (ClientReply::StoredMany(replies), Change::None)
}

/// A ticket with its reservation made, and its commit request; or, for a ticket whose
/// awaited reserve was not made where its pages are, the store's end (its pages freed).
async fn resolved(
    services: &NodeServices,
    granted: Ticket,
) -> Result<(Ticket, CommitRequest), StoreCommitted> {
    match services.resolve(granted.reservation).await {
        Resolution::Made { session, replica } => {
            let ticket = Ticket {
                reservation: Reservation::Made { session, replica },
                ..granted
            };
            let request = CommitRequest {
                session,
                replica,
                location: granted.location,
            };
            Ok((ticket, request))
        }
        Resolution::Ended(end) => {
            services.free(granted.location).await;
            Err(match end {
                AwaitedEnd::AlreadyPresent => StoreCommitted::Stored(CommitOutcome::AlreadyPresent),
                AwaitedEnd::Pending => StoreCommitted::Pending,
                AwaitedEnd::Skipped(skip) => StoreCommitted::Skipped(skip),
                AwaitedEnd::Failed(error) => StoreCommitted::Refused(ProtocolError::Node(error)),
            })
        }
    }
}

/// The client's answer for a commit that ended with `committed`, after its pages followed
/// the node core's rule for that ending; a published replica in a CPU pool is answered
/// here from now on ([`NodeServices::own`], the commit sent under `mark`).
async fn settle(
    services: &NodeServices,
    granted: Ticket,
    committed: Result<Option<CommitOutcome>, LinkError>,
    mark: Option<u64>,
) -> StoreCommitted {
    let reply = match &committed {
        Ok(Some(outcome)) => StoreCommitted::Stored(*outcome),
        Ok(None) => StoreCommitted::NotStored,
        Err(unavailable) if unavailable.is_unavailable() => StoreCommitted::NotStored,
        Err(LinkError::Refused(refused)) => StoreCommitted::Refused(refused.clone()),
        Err(other) => StoreCommitted::Refused(ProtocolError::Node(other.to_string())),
    };
    let published = matches!(committed, Ok(Some(CommitOutcome::Committed)));
    match after_commit(commit_result(committed)) {
        PagesAfterCommit::Published => {
            if published {
                let held = services.published(granted.object, granted.location);
                if let (true, Reservation::Made { replica, .. }) = (held, granted.reservation) {
                    services.own(mark, granted.object, replica, granted.location);
                }
                services
                    .metrics
                    .add_bytes_moved(Direction::Store, granted.location.length_bytes);
            }
        }
        PagesAfterCommit::Keep => {}
        PagesAfterCommit::Free => services.free(granted.location).await,
        PagesAfterCommit::FreeAndAbort => give_back(services, granted).await,
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Medium, ReplicaId};

    fn granted(pool: u32) -> Result<ReserveOutcome, LinkError> {
        Ok(ReserveOutcome::Granted {
            replica: ReplicaId(1),
            pool: PoolId(pool),
            medium: Medium::Cpu,
            allocated_bytes: 4096,
        })
    }

    #[test]
    fn a_placement_is_learned_from_a_batch_granted_whole_in_one_pool_and_lost_otherwise() {
        let placement = StorePlacement::default();
        assert_eq!(placement.pool(), None);
        placement.learn(&[granted(3), granted(3)]);
        assert_eq!(placement.pool(), Some(PoolId(3)));
        // Nothing answered: nothing learned or forgotten.
        placement.learn(&[]);
        assert_eq!(placement.pool(), Some(PoolId(3)));
        let unlearned: [Vec<Result<ReserveOutcome, LinkError>>; 5] = [
            vec![granted(3), granted(4)],
            vec![granted(3), Ok(ReserveOutcome::Skip(StoreSkip::NoRoom))],
            vec![Ok(ReserveOutcome::AlreadyPresent), granted(3)],
            vec![Ok(ReserveOutcome::Pending)],
            vec![granted(3), Err(LinkError::Unreachable)],
        ];
        for outcomes in unlearned {
            placement.learn(&[granted(3)]);
            placement.learn(&outcomes);
            assert_eq!(placement.pool(), None, "{outcomes:?}");
        }
        placement.learn(&[granted(u32::MAX)]);
        assert_eq!(placement.pool(), Some(PoolId(u32::MAX)));
    }
}
