//! The store path of a client session: a reserve at the directory becomes pages in a local
//! pool and a grant for the client; a written grant's commit publishes it, and its pages
//! follow the node core's rule for how the commit ended. Single stores (`BeginStore`,
//! `CommitStore`) and batches of up to [`STORE_BATCH_ITEMS_MAX`] (`BeginStoreMany`,
//! `CommitStoreMany`) take the same steps per item; a batch makes one directory round trip.
//!
//! [`STORE_BATCH_ITEMS_MAX`]: crate::protocol::messages::STORE_BATCH_ITEMS_MAX

use super::actor::commit_result;
use super::client_session::{give_back, refusal};
use super::link::{CommitRequest, LinkError};
use super::services::{AllocationRefused, NodeServices};
use crate::directory::{CommitOutcome, ReserveItem, ReserveOutcome, StoreSkip};
use crate::metrics::Direction;
use crate::model::{Location, SessionId};
use crate::node::{after_commit, ClientId, ClientRefusal, PagesAfterCommit, Ticket};
use crate::protocol::messages::{ClientReply, ProtocolError, StoreCommitted, StoreGrant};
use crate::protocol::node::{unknown_ticket, AdmittedStore, Change};
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
/// `BeginStore` would answer it; an item the books refused keeps its refusal.
pub async fn begin_store_many(
    services: NodeServices,
    client: ClientId,
    admitted: Vec<Result<AdmittedStore, ClientRefusal>>,
    valid: Duration,
) -> (ClientReply, Change) {
    let items: Vec<ReserveItem> = admitted
        .iter()
        .filter_map(|entry| entry.as_ref().ok().map(|store| store.item))
        .collect();
    let (session, reserved) = services.link.reserve_many(&items).await;
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
        let (grant, booked) = grant(&services, client, &store, valid, session, outcome).await;
        if let Some(booked) = booked {
            granted.push((store.ticket, booked));
        }
        grants.push(grant);
    }
    (ClientReply::Grants(grants), Change::Tickets(granted))
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
                session,
                replica,
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

/// `CommitStore`: publishes a written grant.
pub async fn commit_store(services: NodeServices, granted: Ticket) -> (ClientReply, Change) {
    let request = commit_request(&granted);
    let committed = services
        .link
        .commit(request.session, request.replica, request.location)
        .await;
    let reply = match settle(&services, granted, committed).await {
        StoreCommitted::Stored(outcome) => ClientReply::Stored(outcome),
        StoreCommitted::NotStored => ClientReply::NotStored,
        StoreCommitted::Refused(error) => ClientReply::Error(error),
    };
    (reply, Change::None)
}

/// `CommitStoreMany`: one commit round trip for every ticket the client holds (`None`: a
/// ticket it does not hold, refused), then each as `CommitStore` would end it.
pub async fn commit_store_many(
    services: NodeServices,
    granted: Vec<Option<Ticket>>,
) -> (ClientReply, Change) {
    let requests: Vec<CommitRequest> = granted.iter().flatten().map(commit_request).collect();
    let mut committed = services.link.commit_many(&requests).await.into_iter();
    let mut replies = Vec::with_capacity(granted.len());
    for ticket in granted {
        replies.push(match ticket {
            None => StoreCommitted::Refused(unknown_ticket()),
            Some(ticket) => {
                let outcome = committed.next().unwrap_or_else(|| {
                    Err(LinkError::Unexpected("a commit outcome is missing".into()))
                });
                settle(&services, ticket, outcome).await
            }
        });
    }
    (ClientReply::StoredMany(replies), Change::None)
}

fn commit_request(granted: &Ticket) -> CommitRequest {
    CommitRequest {
        session: granted.session,
        replica: granted.replica,
        location: granted.location,
    }
}

/// The client's answer for a commit that ended with `committed`, after its pages followed
/// the node core's rule for that ending.
async fn settle(
    services: &NodeServices,
    granted: Ticket,
    committed: Result<Option<CommitOutcome>, LinkError>,
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
                services.published(granted.object, granted.location);
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
