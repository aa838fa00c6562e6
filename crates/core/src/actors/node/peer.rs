//! The node's peer endpoint: QUIC with mutual TLS on the cluster CA, over which nodes copy
//! replicas to each other ([`crate::wire::peer`] has the stream format). This module owns
//! the endpoint, one cached connection per peer, and the receiving side: a stream is
//! served only when the node's table of expected transfers ([`crate::node::transfers`])
//! names its sender (by certificate) and target; then the bytes go chunk by chunk into a
//! fresh allocation of the node's CPU pool, and the target is committed like a store. On
//! a short, reset or failed stream the pages are freed and the target aborted: never a
//! READY partial replica. The sending side is [`super::replication`].

use super::actor::commit_result;
use super::pool::WriteAt;
use super::services::NodeServices;
use crate::config::{ClusterConfig, NodeSection};
use crate::directory::CommitOutcome;
use crate::metrics::peer::PeerMetrics;
use crate::metrics::Direction;
use crate::model::{Location, NodeId, ReplicaId, TransferToken};
use crate::node::transfers::{
    ExpectedTransfer, ExpectedTransfers, RefusalBudget, RefusalKind, TransferClaim, TransferRefusal,
};
use crate::node::{after_commit, PagesAfterCommit};
use crate::protocol::messages::{DirectoryReply, DirectoryRequest};
use crate::wire::certs::{RetiredCertificates, CERTIFICATE_RETIRED};
use crate::wire::peer::{self as wire, TransferHeader, Verdict, HEADER_BYTES};
use crate::wire::{quic, tls};
use anyhow::Context as _;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Transfers this node receives at once: 8. Each holds one chunk buffer
/// ([`TRANSFER_CHUNK_BYTES`]) and an allocation being written; more would only share the
/// same two cores and link. A stream past the bound is answered [`Verdict::Busy`].
pub const RECEIVES_MAX: usize = 8;
/// Bytes copied into the pool per pool message: 256 KiB, as a demotion's chunk, so the
/// pool actor is never held long and a receive holds at most this much in its buffer.
pub const TRANSFER_CHUNK_BYTES: usize = 256 << 10;
/// Peer connections this node serves at once: 64, one per sending node of a large
/// cluster; more are refused at the handshake.
pub const PEER_CONNECTIONS_MAX: usize = 64;
/// How long a sender has to deliver the header once its stream is open.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Node names this node remembers by id: 4096, the directory's default `nodes_max`. A
/// larger cluster's surplus is looked up again on use.
pub const NODE_NAMES_MAX: usize = 4096;

const _: () = assert!(RECEIVES_MAX <= wire::TRANSFER_STREAMS_MAX as usize);

/// Another node as this node reaches it: its certificate name and peer address.
#[derive(Clone, Debug)]
pub struct Peer {
    pub name: String,
    /// `None`: that node has no peer endpoint.
    pub address: Option<SocketAddr>,
}

/// The node's peer endpoint and books. Shared by the node's actors (`NodeServices::peer`).
pub struct PeerTransport {
    endpoint: quinn::Endpoint,
    client_config: quinn::ClientConfig,
    /// The cluster's certificate folder: its `retired` list is read per connection.
    certs: std::path::PathBuf,
    /// Each node of `cluster.toml` by its name (the name its certificate carries): where
    /// its peer endpoint is reached, `None` when it has none. Never by position: a live
    /// reload may remove a node from the middle of the file while ids stay.
    addresses: HashMap<String, Option<SocketAddr>>,
    /// Node names by [`NodeId`] as the directory reported them (its ids are its own, kept
    /// per name), with where the directory says each serves its peer endpoint (for a node
    /// a reload added after this one read its configuration); refreshed from
    /// `ClusterStatus` on an unknown id. At most [`NODE_NAMES_MAX`].
    names: Mutex<HashMap<NodeId, Peer>>,
    expected: Mutex<ExpectedTransfers>,
    /// One connection per peer node, opened on first use; bounded by `addresses`. Each
    /// entry has its own lock, so a peer slow to answer its handshake holds up only the
    /// pushes to that peer.
    connections: Mutex<HashMap<NodeId, Arc<tokio::sync::Mutex<Option<quinn::Connection>>>>>,
    receives: Arc<tokio::sync::Semaphore>,
    pub(super) pushes: super::replication::Pushes,
    pub metrics: PeerMetrics,
}

impl PeerTransport {
    /// Binds `section`'s peer endpoint (`None` when it has no `peer_listen`) with the
    /// cluster credentials. Must run inside a tokio runtime.
    pub fn bind(
        config: &ClusterConfig,
        section: &NodeSection,
        metrics: &crate::metrics::Metrics,
    ) -> anyhow::Result<Option<Arc<PeerTransport>>> {
        let Some(listen) = section.peer_listen else {
            return Ok(None);
        };
        let certs = &config.directory.certs;
        let datagram_bytes = section.peer_datagram_bytes;
        let server = wire::server_config(certs, &section.name, datagram_bytes)?;
        let endpoint = wire::endpoint(listen, Some(server), datagram_bytes)
            .with_context(|| format!("binding the peer endpoint on {listen}"))?;
        let addresses = config
            .nodes
            .iter()
            .map(|node| (node.name.clone(), node.peer_reachable_at()))
            .collect();
        tracing::info!(%listen, datagram_bytes, "serving peer transfers");
        Ok(Some(Arc::new(PeerTransport {
            client_config: wire::client_config(certs, &section.name, datagram_bytes)?,
            certs: certs.clone(),
            endpoint,
            addresses,
            names: Mutex::default(),
            expected: Mutex::default(),
            connections: Mutex::default(),
            receives: Arc::new(tokio::sync::Semaphore::new(RECEIVES_MAX)),
            pushes: super::replication::Pushes::default(),
            metrics: PeerMetrics::register(metrics)?,
        })))
    }

    /// The node `node` is: its name as the directory knows it (asked again when this node
    /// has not seen that id), and its peer address from this node's configuration by that
    /// name, or, for a node the configuration read at start did not have (a reload added
    /// it), from the directory's.
    pub async fn peer(&self, services: &NodeServices, node: NodeId) -> Result<Peer, String> {
        let known = lock(&self.names).get(&node).cloned();
        let reported = match known {
            Some(peer) => peer,
            None => {
                self.refresh_names(services).await?;
                lock(&self.names)
                    .get(&node)
                    .cloned()
                    .ok_or("the directory does not know that node")?
            }
        };
        let address = match self.addresses.get(&reported.name) {
            Some(address) => *address,
            None => reported.address,
        };
        Ok(Peer {
            name: reported.name,
            address,
        })
    }

    /// Replaces the names by id with the directory's current list.
    async fn refresh_names(&self, services: &NodeServices) -> Result<(), String> {
        let reply = services
            .link
            .call(DirectoryRequest::ClusterStatus)
            .await
            .map_err(|error| format!("asking the directory for its nodes: {error}"))?;
        let DirectoryReply::ClusterStatus(status) = reply else {
            return Err(format!("the directory answered {reply:?}"));
        };
        let mut names = lock(&self.names);
        names.clear();
        names.extend(status.nodes.into_iter().take(NODE_NAMES_MAX).map(|node| {
            let peer = Peer {
                name: node.name,
                address: node.peer_address,
            };
            (node.node, peer)
        }));
        Ok(())
    }

    /// The table of expected transfers, for one call.
    pub fn expected(&self) -> MutexGuard<'_, ExpectedTransfers> {
        lock(&self.expected)
    }

    /// The connection to `node`, opened (and cached) when there is none or it closed.
    /// Only pushes to `node` wait on its handshake.
    pub async fn connection(
        &self,
        services: &NodeServices,
        node: NodeId,
    ) -> anyhow::Result<quinn::Connection> {
        let peer = self
            .peer(services, node)
            .await
            .map_err(anyhow::Error::msg)?;
        let address = peer.address.context("that node has no peer endpoint")?;
        let slot = lock(&self.connections).entry(node).or_default().clone();
        let mut slot = slot.lock().await;
        if let Some(connection) = slot.as_ref() {
            if connection.close_reason().is_none() {
                return Ok(connection.clone());
            }
        }
        let connection = quic::connect(
            &self.endpoint,
            address,
            &peer.name,
            self.client_config.clone(),
        )
        .await?;
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// Serves peer connections until the endpoint closes, each in its own task.
    pub fn serve(self: &Arc<Self>, services: NodeServices) {
        let transport = self.clone();
        actix_rt::spawn(async move {
            while let Some(incoming) = transport.endpoint.accept().await {
                if transport.endpoint.open_connections() > PEER_CONNECTIONS_MAX {
                    incoming.refuse();
                    continue;
                }
                let (transport, services) = (transport.clone(), services.clone());
                actix_rt::spawn(async move {
                    match incoming.await {
                        Ok(connection) => transport.serve_connection(&services, connection).await,
                        Err(error) => tracing::debug!(%error, "a peer handshake failed"),
                    }
                });
            }
        });
    }

    /// Serves the transfer streams of one authenticated peer connection.
    async fn serve_connection(
        self: Arc<Self>,
        services: &NodeServices,
        connection: quinn::Connection,
    ) {
        let Some(sender) = tls::peer_name(&connection) else {
            connection.close(1u32.into(), b"no peer name");
            return;
        };
        // As the directory does: the `retired` list is read per connection, so a retired
        // certificate is refused here too without a restart.
        match RetiredCertificates::load(&self.certs) {
            Ok(retired) if !retired.refuses(&connection) => {}
            Ok(_) => {
                tracing::warn!(sender, "a peer presented a retired certificate");
                connection.close(3u32.into(), CERTIFICATE_RETIRED.as_bytes());
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the retired certificates; refusing a peer");
                connection.close(3u32.into(), b"retired list unreadable");
                return;
            }
        }
        let budget = Arc::new(Mutex::new(RefusalBudget::new(services.clock.now())));
        while let Ok((send, receive)) = connection.accept_bi().await {
            let (transport, services, sender) = (self.clone(), services.clone(), sender.clone());
            let (budget, connection) = (budget.clone(), connection.clone());
            actix_rt::spawn(async move {
                let refused = transport.receive(&services, &sender, send, receive).await;
                let within = !refused || lock(&budget).spend(services.clock.now());
                if !within {
                    tracing::warn!(
                        sender,
                        "a peer drew too many refusals; closing its connection"
                    );
                    transport.metrics.refuse("too_many_refusals");
                    connection.close(4u32.into(), b"too many refusals");
                }
            });
        }
    }

    /// Serves one transfer stream from `sender` (see the module documentation); true when
    /// it was refused other than for being busy (counted against the connection's budget).
    async fn receive(
        &self,
        services: &NodeServices,
        sender: &str,
        mut send: quinn::SendStream,
        mut receive: quinn::RecvStream,
    ) -> bool {
        let admitted = match self.admit(services, sender, &mut receive).await {
            Ok(admitted) => admitted,
            Err(verdict) => {
                let _ = wire::write_verdict(&mut send, verdict).await;
                let _ = send.finish();
                self.metrics.transfer("received", "refused", 0);
                return verdict != Verdict::Busy;
            }
        };
        let Admitted {
            expected,
            location,
            permit,
        } = admitted;
        let outcome = match wire::write_verdict(&mut send, Verdict::Accepted).await {
            Ok(()) => write_and_commit(services, &expected, location, &mut receive).await,
            Err(_) => Err(abandon(services, &expected, location, "the sender went away").await),
        };
        drop(permit);
        self.expected().finished(expected.target);
        let verdict = match outcome {
            Ok(()) => {
                self.metrics
                    .transfer("received", "committed", location.length_bytes);
                services
                    .metrics
                    .add_bytes_moved(Direction::Replicate, location.length_bytes);
                Verdict::Committed
            }
            Err(reason) => {
                tracing::info!(%reason, target = ?expected.target, sender, "peer transfer failed");
                self.metrics.transfer("received", "failed", 0);
                Verdict::Failed
            }
        };
        let _ = wire::write_verdict(&mut send, verdict).await;
        let _ = send.finish();
        false
    }

    /// Reads the header and decides: a refusal's verdict (counted; nothing allocated), or
    /// the claimed transfer with its target's fresh allocation.
    async fn admit(
        &self,
        services: &NodeServices,
        sender: &str,
        receive: &mut quinn::RecvStream,
    ) -> Result<Admitted, Verdict> {
        let mut bytes = [0; HEADER_BYTES];
        let read = tokio::time::timeout(HEADER_TIMEOUT, receive.read_exact(&mut bytes)).await;
        let Ok(Ok(Ok(header))) = read.map(|read| read.map(|()| TransferHeader::decode(&bytes)))
        else {
            self.metrics.refuse("bad_header");
            return Err(Verdict::BadHeader);
        };
        let Ok(permit) = self.receives.clone().try_acquire_owned() else {
            self.metrics.refuse("busy");
            return Err(Verdict::Busy);
        };
        let target = ReplicaId(header.target_replica);
        let claim = TransferClaim {
            sender,
            target,
            token: TransferToken(header.token),
            length_bytes: header.length_bytes,
        };
        let claimed = self.expected().claim(claim, services.clock.now());
        self.abort_lapsed(services).await;
        let expected = match claimed {
            Ok(expected) => expected,
            Err(refusal) => {
                // A lapsed entry was aborted, in its own session, and counted by
                // `abort_lapsed` above.
                if refusal != TransferRefusal::Expired {
                    self.metrics.refuse(refusal.reason());
                }
                tracing::info!(%refusal, sender, ?target, "peer transfer refused");
                return Err(match refusal.verdict_kind() {
                    RefusalKind::NotExpected => Verdict::NotExpected,
                    RefusalKind::Busy => Verdict::Busy,
                    RefusalKind::Refused => Verdict::Refused,
                });
            }
        };
        match allocate(services, &expected).await {
            Ok(location) => Ok(Admitted {
                expected,
                location,
                permit,
            }),
            Err(reason) => {
                tracing::info!(%reason, ?target, "no room for a peer transfer");
                self.metrics.refuse("no_room");
                self.expected().finished(target);
                services.link.abort(expected.session, target).await;
                Err(Verdict::Full)
            }
        }
    }

    /// Aborts the targets whose expected transfers lapsed without a stream.
    pub async fn abort_lapsed(&self, services: &NodeServices) {
        let lapsed = self.expected().expire(services.clock.now());
        for entry in lapsed {
            self.metrics.refuse("expired");
            services.link.abort(entry.session, entry.target).await;
        }
    }
}

/// Locks `mutex`, also when a panic poisoned it (its data stays consistent: every
/// critical section here is one map operation).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A stream admitted: its expected transfer, the target's allocation, and its slot among
/// [`RECEIVES_MAX`].
struct Admitted {
    expected: ExpectedTransfer,
    location: Location,
    permit: tokio::sync::OwnedSemaphorePermit,
}

/// Allocates the target's pages in its pool (this node's CPU pool).
async fn allocate(
    services: &NodeServices,
    expected: &ExpectedTransfer,
) -> Result<Location, String> {
    let pool = services
        .pools
        .get(&expected.target_pool)
        .ok_or("the target pool is not this node's")?;
    let allocation = services
        .allocate(pool, expected.target_pool, expected.length_bytes)
        .await
        .map_err(|error| error.to_string())?
        .map_err(|error| error.to_string())?;
    Ok(Location {
        pool: expected.target_pool,
        allocation: allocation.id,
        generation: allocation.generation,
        offset_bytes: allocation.offset,
        length_bytes: expected.length_bytes,
    })
}

/// Frees the target's pages and aborts it; returns `reason` for the caller's log.
async fn abandon(
    services: &NodeServices,
    expected: &ExpectedTransfer,
    location: Location,
    reason: &str,
) -> String {
    services.free(location).await;
    services.link.abort(expected.session, expected.target).await;
    reason.to_string()
}

/// Writes the stream's bytes into `location` chunk by chunk, checks the sender finished
/// the stream exactly at the object's end, and commits the target. On any failure the
/// pages are freed and the target aborted (an unknown commit outcome keeps the pages).
async fn write_and_commit(
    services: &NodeServices,
    expected: &ExpectedTransfer,
    location: Location,
    receive: &mut quinn::RecvStream,
) -> Result<(), String> {
    if let Err(reason) = write_stream(services, location, receive).await {
        return Err(abandon(services, expected, location, &reason).await);
    }
    let committed = services
        .link
        .commit(expected.session, expected.target, location)
        .await;
    let published = matches!(committed, Ok(Some(CommitOutcome::Committed)));
    match after_commit(commit_result(committed)) {
        PagesAfterCommit::Published => {
            if published {
                services.published(expected.object, location);
            }
            Ok(())
        }
        PagesAfterCommit::Keep => Err("the commit's outcome is unknown".into()),
        PagesAfterCommit::Free => {
            services.free(location).await;
            Err("the commit was not applied".into())
        }
        PagesAfterCommit::FreeAndAbort => {
            Err(abandon(services, expected, location, "the commit was refused").await)
        }
    }
}

/// Copies exactly `location.length_bytes` from the stream into the pool, one
/// [`TRANSFER_CHUNK_BYTES`] buffer at a time, then requires the stream's end.
async fn write_stream(
    services: &NodeServices,
    location: Location,
    receive: &mut quinn::RecvStream,
) -> Result<(), String> {
    let pool = services
        .pools
        .get(&location.pool)
        .ok_or("the target pool is not this node's")?;
    let read_failed = |error: &dyn std::fmt::Display| format!("reading the stream: {error}");
    let mut buffer: Vec<u8> = Vec::with_capacity(TRANSFER_CHUNK_BYTES);
    let mut written = 0u64;
    while written < location.length_bytes {
        let wanted = (location.length_bytes - written).min(TRANSFER_CHUNK_BYTES as u64) as usize;
        buffer.clear();
        while buffer.len() < wanted {
            let next = tokio::time::timeout(
                wire::VERDICT_TIMEOUT,
                receive.read_chunk(wanted - buffer.len(), true),
            )
            .await
            .map_err(|error| read_failed(&error))?
            .map_err(|error| read_failed(&error))?;
            let Some(chunk) = next else {
                return Err(format!(
                    "the stream ended at {} of {} bytes",
                    written + buffer.len() as u64,
                    location.length_bytes
                ));
            };
            buffer.extend_from_slice(&chunk.bytes);
        }
        buffer = pool
            .send(WriteAt {
                offset_bytes: location.offset_bytes + written,
                bytes: buffer,
            })
            .await
            .map_err(|error| format!("writing the copy: {error}"))?
            .map_err(|error| format!("writing the copy: {error}"))?;
        written += wanted as u64;
    }
    // The sender finishes the stream only once its source proved unchanged.
    match tokio::time::timeout(wire::VERDICT_TIMEOUT, receive.read_chunk(1, true)).await {
        Ok(Ok(None)) => Ok(()),
        Ok(Ok(Some(_))) => Err("the stream carried more than the object".into()),
        Ok(Err(error)) => Err(read_failed(&error)),
        Err(error) => Err(read_failed(&error)),
    }
}
