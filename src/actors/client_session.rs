//! The `ClientSessionActor`: one per local engine connection on the node's Unix socket.
//! It turns the engine's store and load requests into directory operations and pool
//! allocations, and remembers the grants and leases it handed out so that a client that
//! disconnects gives them back.

use super::directory::error_label;
use super::frames::{frame_stream, spawn_writer};
use super::link::{DirectoryLink, LinkError};
use super::pool::{Allocate, Free, PoolActor};
use crate::directory::{AcquireOutcome, CommitOutcome, ReserveItem, ReserveOutcome};
use crate::metrics::{Metrics, Operation};
use crate::model::{LeaseId, Location, PoolId, ReplicaId};
use crate::wire::messages::{
    ClientReply, ClientRequest, DirectoryReply, DirectoryRequest, Hello, NodeDescription,
    PoolMapping, ProtocolError, StoreGrant, SUPPORTED_VERSIONS,
};
use crate::wire::{codec, RawFrame, WireError};
use actix::prelude::*;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::mpsc;

/// Stores one client may have granted and not yet committed.
pub const TICKETS_MAX: usize = 1024;
/// Leases one client may hold through this node.
pub const CLIENT_LEASES_MAX: usize = 65536;

/// What the node shares with every client session.
#[derive(Clone)]
pub struct NodeServices {
    pub link: Arc<DirectoryLink>,
    pub pools: HashMap<PoolId, Addr<PoolActor>>,
    pub mappings: Vec<PoolMapping>,
    pub metrics: Arc<Metrics>,
}

/// A granted, unwritten store.
#[derive(Clone, Copy, Debug)]
struct Ticket {
    replica: ReplicaId,
    location: Location,
}

/// How a finished request changes the session's books.
enum Change {
    None,
    Ticket(u64, Ticket),
    Leases(Vec<LeaseId>),
    Released(Vec<LeaseId>),
}

/// One engine connection. See the module documentation.
pub struct ClientSessionActor {
    services: NodeServices,
    replies: mpsc::Sender<(u64, ClientReply)>,
    reader: Option<OwnedReadHalf>,
    greeted: bool,
    tickets: HashMap<u64, Ticket>,
    next_ticket: u64,
    leases: HashSet<LeaseId>,
}

impl ClientSessionActor {
    /// A session over an accepted Unix socket connection.
    pub fn new(services: NodeServices, stream: tokio::net::UnixStream) -> ClientSessionActor {
        let (reader, writer) = stream.into_split();
        ClientSessionActor {
            services,
            replies: spawn_writer(writer),
            reader: Some(reader),
            greeted: false,
            tickets: HashMap::new(),
            next_ticket: 1,
            leases: HashSet::new(),
        }
    }

    fn reply(&self, request_id: u64, reply: ClientReply, context: &mut Context<Self>) {
        if self.replies.try_send((request_id, reply)).is_err() {
            context.stop();
        }
    }

    fn dispatch(&mut self, request_id: u64, request: ClientRequest, context: &mut Context<Self>) {
        let services = self.services.clone();
        let operation = operation_label(&request);
        let started = Instant::now();
        let work: std::pin::Pin<Box<dyn std::future::Future<Output = (ClientReply, Change)>>> =
            match request {
                ClientRequest::Hello(_) => {
                    let error = ProtocolError::Sequence("hello sent twice".into());
                    return self.reply(request_id, ClientReply::Error(error), context);
                }
                ClientRequest::Describe => {
                    let description = NodeDescription {
                        node: services.link.node,
                        epoch: services.link.epoch,
                        pools: services.mappings.clone(),
                    };
                    return self.reply(request_id, ClientReply::Described(description), context);
                }
                ClientRequest::RegisterNamespace(descriptor) => Box::pin(async move {
                    let reply = match services
                        .link
                        .call(DirectoryRequest::RegisterNamespace(descriptor))
                        .await
                    {
                        Ok(DirectoryReply::Namespace(id)) => ClientReply::Namespace(id),
                        other => ClientReply::Error(refusal(other)),
                    };
                    (reply, Change::None)
                }),
                ClientRequest::BeginStore {
                    object,
                    length_bytes,
                } => {
                    if self.tickets.len() >= TICKETS_MAX {
                        return self.reply(
                            request_id,
                            ClientReply::Error(ProtocolError::Busy),
                            context,
                        );
                    }
                    let ticket = self.next_ticket;
                    self.next_ticket += 1;
                    Box::pin(begin_store(
                        services,
                        ticket,
                        ReserveItem {
                            object,
                            length_bytes,
                        },
                    ))
                }
                ClientRequest::CommitStore { ticket } => match self.tickets.remove(&ticket) {
                    None => {
                        return self.reply(
                            request_id,
                            ClientReply::Error(unknown_ticket()),
                            context,
                        )
                    }
                    Some(granted) => Box::pin(commit_store(services, granted)),
                },
                ClientRequest::AbortStore { ticket } => match self.tickets.remove(&ticket) {
                    None => {
                        return self.reply(
                            request_id,
                            ClientReply::Error(unknown_ticket()),
                            context,
                        )
                    }
                    Some(granted) => Box::pin(async move {
                        free(&services, granted.location).await;
                        (ClientReply::Aborted, Change::None)
                    }),
                },
                ClientRequest::Probe { objects } => Box::pin(async move {
                    let reply = match services
                        .link
                        .call(DirectoryRequest::Probe { objects })
                        .await
                    {
                        Ok(DirectoryReply::Probed(outcomes)) => ClientReply::Probed(outcomes),
                        other => ClientReply::Error(refusal(other)),
                    };
                    (reply, Change::None)
                }),
                ClientRequest::Acquire { objects, mode } => {
                    if self.leases.len() + objects.len() > CLIENT_LEASES_MAX {
                        return self.reply(
                            request_id,
                            ClientReply::Error(ProtocolError::Busy),
                            context,
                        );
                    }
                    Box::pin(async move {
                        match services
                            .link
                            .call(DirectoryRequest::Acquire { objects, mode })
                            .await
                        {
                            Ok(DirectoryReply::Acquired(outcomes)) => {
                                let leases = outcomes
                                    .iter()
                                    .filter_map(|outcome| match outcome {
                                        AcquireOutcome::Leased(lease) => Some(lease.lease),
                                        _ => None,
                                    })
                                    .collect();
                                (ClientReply::Acquired(outcomes), Change::Leases(leases))
                            }
                            other => (ClientReply::Error(refusal(other)), Change::None),
                        }
                    })
                }
                ClientRequest::Release { leases } => Box::pin(async move {
                    match services
                        .link
                        .call(DirectoryRequest::Release {
                            leases: leases.clone(),
                        })
                        .await
                    {
                        Ok(DirectoryReply::Released(outcomes)) => {
                            (ClientReply::Released(outcomes), Change::Released(leases))
                        }
                        other => (ClientReply::Error(refusal(other)), Change::None),
                    }
                }),
            };
        work.into_actor(self)
            .map(move |(reply, change), actor, context| {
                let error = match &reply {
                    ClientReply::Error(error) => Some(error_label(error)),
                    _ => None,
                };
                if let Some(operation) = operation {
                    actor
                        .services
                        .metrics
                        .observe_request(operation, started.elapsed(), error);
                }
                match change {
                    Change::None => {}
                    Change::Ticket(ticket, granted) => {
                        actor.tickets.insert(ticket, granted);
                    }
                    Change::Leases(leases) => actor.leases.extend(leases),
                    Change::Released(leases) => {
                        for lease in leases {
                            actor.leases.remove(&lease);
                        }
                    }
                }
                actor.reply(request_id, reply, context);
            })
            .spawn(context);
    }
}

/// The metrics label of a client request (none for what the node answers itself).
fn operation_label(request: &ClientRequest) -> Option<Operation> {
    Some(match request {
        ClientRequest::Hello(_) | ClientRequest::Describe => return None,
        ClientRequest::RegisterNamespace(_) => Operation::Open,
        ClientRequest::BeginStore { .. } => Operation::Reserve,
        ClientRequest::CommitStore { .. } | ClientRequest::AbortStore { .. } => Operation::Commit,
        ClientRequest::Probe { .. } => Operation::Probe,
        ClientRequest::Acquire { .. } => Operation::Acquire,
        ClientRequest::Release { .. } => Operation::Release,
    })
}

fn unknown_ticket() -> ProtocolError {
    ProtocolError::Sequence("unknown store ticket".into())
}

/// The protocol error a failed directory call becomes for the client.
fn refusal(result: Result<DirectoryReply, LinkError>) -> ProtocolError {
    match result {
        Err(LinkError::Refused(error)) => error,
        Err(error) => ProtocolError::Node(error.to_string()),
        Ok(reply) => ProtocolError::Node(format!("unexpected directory reply {reply:?}")),
    }
}

async fn free(services: &NodeServices, location: Location) {
    if let Some(pool) = services.pools.get(&location.pool) {
        let freed = pool
            .send(Free {
                allocation: location.allocation,
                generation: location.generation,
            })
            .await;
        if !matches!(freed, Ok(Ok(_))) {
            tracing::error!(?location, "could not free an allocation");
        }
    }
}

async fn begin_store(
    services: NodeServices,
    ticket: u64,
    item: ReserveItem,
) -> (ClientReply, Change) {
    let grant = match services.link.reserve(item).await {
        Ok(grant) => grant,
        Err(error) => return (ClientReply::Error(refusal(Err(error))), Change::None),
    };
    let (replica, pool) = match grant {
        ReserveOutcome::Granted { replica, pool, .. } => (replica, pool),
        ReserveOutcome::AlreadyPresent => {
            return (ClientReply::Grant(StoreGrant::AlreadyPresent), Change::None)
        }
        ReserveOutcome::Pending => return (ClientReply::Grant(StoreGrant::Pending), Change::None),
        ReserveOutcome::Skip => return (ClientReply::Grant(StoreGrant::Skip), Change::None),
    };
    let Some(actor) = services.pools.get(&pool) else {
        return (
            ClientReply::Error(ProtocolError::Node(format!(
                "pool {pool} is not mapped by this node"
            ))),
            Change::None,
        );
    };
    match actor
        .send(Allocate {
            length_bytes: item.length_bytes,
        })
        .await
    {
        Ok(Ok(allocation)) => {
            let location = Location {
                pool,
                allocation: allocation.id,
                generation: allocation.generation,
                offset_bytes: allocation.offset,
                length_bytes: item.length_bytes,
            };
            (
                ClientReply::Grant(StoreGrant::Write { ticket, location }),
                Change::Ticket(ticket, Ticket { replica, location }),
            )
        }
        // The pool's hard limit holds even when the directory's budget lags: skip the store
        // and let the reservation expire.
        Ok(Err(error)) => {
            tracing::debug!(%error, "local pool refused an allocation the directory granted");
            (ClientReply::Grant(StoreGrant::Skip), Change::None)
        }
        Err(_) => (ClientReply::Error(ProtocolError::Busy), Change::None),
    }
}

async fn commit_store(services: NodeServices, granted: Ticket) -> (ClientReply, Change) {
    match services
        .link
        .commit(granted.replica, granted.location)
        .await
    {
        Ok(Some(CommitOutcome::Committed)) => {
            (ClientReply::Stored(CommitOutcome::Committed), Change::None)
        }
        Ok(Some(CommitOutcome::AlreadyPresent)) => {
            free(&services, granted.location).await;
            (
                ClientReply::Stored(CommitOutcome::AlreadyPresent),
                Change::None,
            )
        }
        Ok(None) => {
            free(&services, granted.location).await;
            (
                ClientReply::Error(ProtocolError::Node("the commit was not applied".into())),
                Change::None,
            )
        }
        Err(LinkError::Refused(error)) => {
            free(&services, granted.location).await;
            (ClientReply::Error(error), Change::None)
        }
        // Unknown outcome: the pages stay allocated, never reused on a guess.
        Err(error) => (
            ClientReply::Error(ProtocolError::Node(error.to_string())),
            Change::None,
        ),
    }
}

impl Actor for ClientSessionActor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        if let Some(reader) = self.reader.take() {
            context.add_stream(frame_stream(reader));
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let services = self.services.clone();
        let tickets: Vec<Ticket> = self.tickets.drain().map(|(_, ticket)| ticket).collect();
        let leases: Vec<LeaseId> = self.leases.drain().collect();
        actix_rt::spawn(async move {
            for ticket in tickets {
                free(&services, ticket.location).await;
            }
            for chunk in leases.chunks(1024) {
                let _ = services
                    .link
                    .call(DirectoryRequest::Release {
                        leases: chunk.to_vec(),
                    })
                    .await;
            }
        });
    }
}

impl StreamHandler<Result<RawFrame, WireError>> for ClientSessionActor {
    fn handle(&mut self, frame: Result<RawFrame, WireError>, context: &mut Context<Self>) {
        let frame = match frame {
            Ok(frame) => frame,
            Err(WireError::UnknownVersion { request_id, .. }) => {
                let error = ProtocolError::UnsupportedVersion {
                    supported: SUPPORTED_VERSIONS.to_vec(),
                };
                return self.reply(request_id, ClientReply::Error(error), context);
            }
            Err(error) => {
                tracing::warn!(%error, "closing a client connection that broke the framing");
                return context.stop();
            }
        };
        let request_id = frame.header.request_id;
        let request: ClientRequest = match codec::decode(&frame.payload) {
            Ok(request) => request,
            Err(error) => {
                return self.reply(
                    request_id,
                    ClientReply::Error(ProtocolError::Malformed(error.to_string())),
                    context,
                )
            }
        };
        match (self.greeted, request) {
            (false, ClientRequest::Hello(hello)) => match Hello::ours().negotiate(&hello) {
                Some(agreed) => {
                    self.greeted = true;
                    self.reply(request_id, ClientReply::Hello(agreed), context);
                }
                None => {
                    let error = ProtocolError::UnsupportedVersion {
                        supported: SUPPORTED_VERSIONS.to_vec(),
                    };
                    self.reply(request_id, ClientReply::Error(error), context);
                    context.stop();
                }
            },
            (false, _) => {
                let error = ProtocolError::Sequence("the first frame must be hello".into());
                self.reply(request_id, ClientReply::Error(error), context);
            }
            (true, request) => self.dispatch(request_id, request, context),
        }
    }

    fn finished(&mut self, context: &mut Context<Self>) {
        context.stop();
    }
}
