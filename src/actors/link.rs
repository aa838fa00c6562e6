//! A node's link to the directory: the QUIC connection, the session it is bound to, and
//! the operation ids of its stores. Reserve and commit carry an operation id; when a reply
//! is lost (timeout, connection loss) the link asks the directory to `resolve` it instead
//! of assuming either outcome. The link acknowledges, with each heartbeat, every operation
//! id below the oldest one still waiting for a reply, so the directory's ledger stays small.

use crate::directory::{CommitOutcome, ReserveItem, ReserveOutcome, ResolveOutcome};
use crate::model::{Epoch, Location, Medium, NodeId, OperationId, ReplicaId, SessionId};
use crate::wire::messages::{DirectoryReply, DirectoryRequest, Hello, ProtocolError};
use crate::wire::{quic, tls, RpcClient, RpcConfig, WireError};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;
use thiserror::Error;

/// How long one request to the directory may take before the link resolves or retries it.
pub const DIRECTORY_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Requests a node keeps in flight to the directory.
pub const DIRECTORY_INFLIGHT_MAX: usize = 1024;
/// Attempts to resolve an operation whose reply was lost before giving up with `Unknown`.
const RESOLVE_ATTEMPTS_MAX: u32 = 3;

/// Why a request through the link failed.
#[derive(Debug, Error)]
pub enum LinkError {
    /// The directory refused it (typed; nothing changed).
    #[error("{0}")]
    Refused(ProtocolError),
    /// The directory could not be reached; the outcome of a non-idempotent request was
    /// resolved before this error is returned.
    #[error("directory unreachable: {0}")]
    Wire(#[from] WireError),
    /// The directory answered with a reply of the wrong kind (a bug on one side).
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    /// The outcome of a store could not be resolved; its storage must not be reused.
    #[error("outcome of operation {0:?} is unknown")]
    Unresolved(OperationId),
}

/// How to reach the directory.
#[derive(Clone, Debug)]
pub struct DirectoryAddress {
    pub address: SocketAddr,
    pub server_name: String,
    pub certs: PathBuf,
    pub node_name: String,
    pub bind: SocketAddr,
}

/// A connected, negotiated RPC channel to the directory.
pub async fn connect(
    target: &DirectoryAddress,
) -> Result<RpcClient<DirectoryRequest, DirectoryReply>, LinkError> {
    let config = tls::client_config(&target.certs, &target.node_name)
        .map_err(|error| LinkError::Unexpected(format!("TLS configuration: {error}")))?;
    let endpoint = quic::client_endpoint(target.bind)?;
    let connection = quic::connect(&endpoint, target.address, &target.server_name, config).await?;
    let (sender, receiver) = quic::open_session(&connection).await?;
    let rpc = RpcClient::spawn(
        receiver,
        sender,
        RpcConfig {
            inflight_requests_max: DIRECTORY_INFLIGHT_MAX,
            request_timeout: DIRECTORY_REQUEST_TIMEOUT,
        },
    )?;
    match rpc.call(DirectoryRequest::Hello(Hello::ours())).await? {
        DirectoryReply::Hello(_) => Ok(rpc),
        DirectoryReply::Error(error) => Err(LinkError::Refused(error)),
        other => Err(LinkError::Unexpected(format!("{other:?}"))),
    }
}

/// A node's bound session with the directory. Shared by the node's actors.
pub struct DirectoryLink {
    rpc: RwLock<RpcClient<DirectoryRequest, DirectoryReply>>,
    target: DirectoryAddress,
    pub session: SessionId,
    pub epoch: Epoch,
    pub node: NodeId,
    next_operation: AtomicU64,
    /// Operation ids sent and not yet answered (bounded by `DIRECTORY_INFLIGHT_MAX`).
    outstanding: Mutex<BTreeSet<u64>>,
}

impl DirectoryLink {
    /// Connects and opens a new session (a new epoch: any earlier session of this node is
    /// fenced).
    pub async fn open(
        target: DirectoryAddress,
        write_order: Vec<Medium>,
        read_order: Vec<Medium>,
    ) -> Result<DirectoryLink, LinkError> {
        let rpc = connect(&target).await?;
        let opened = match rpc
            .call(DirectoryRequest::Open {
                write_order,
                read_order,
            })
            .await?
        {
            DirectoryReply::Opened(opened) => opened,
            DirectoryReply::Error(error) => return Err(LinkError::Refused(error)),
            other => return Err(LinkError::Unexpected(format!("{other:?}"))),
        };
        Ok(DirectoryLink {
            rpc: RwLock::new(rpc),
            target,
            session: opened.session,
            epoch: opened.epoch,
            node: opened.node,
            next_operation: AtomicU64::new(1),
            outstanding: Mutex::new(BTreeSet::new()),
        })
    }

    /// Replaces a lost connection and binds it to the same session. Fails with
    /// `Refused(Directory(Fenced))` when the session ended meanwhile.
    pub async fn reconnect(&self) -> Result<(), LinkError> {
        let rpc = connect(&self.target).await?;
        match rpc
            .call(DirectoryRequest::Resume {
                session: self.session,
            })
            .await?
        {
            DirectoryReply::Resumed(_) => {}
            DirectoryReply::Error(error) => return Err(LinkError::Refused(error)),
            other => return Err(LinkError::Unexpected(format!("{other:?}"))),
        }
        if let Ok(mut current) = self.rpc.write() {
            *current = rpc;
        }
        Ok(())
    }

    /// Sends one request; a refusal becomes `LinkError::Refused`.
    pub async fn call(&self, request: DirectoryRequest) -> Result<DirectoryReply, LinkError> {
        let rpc = self
            .rpc
            .read()
            .map_err(|_| LinkError::Unexpected("poisoned link".into()))?
            .clone();
        match rpc.call(request).await? {
            DirectoryReply::Error(error) => Err(LinkError::Refused(error)),
            reply => Ok(reply),
        }
    }

    /// The highest operation id below every one still waiting for its reply.
    pub fn acknowledged_through(&self) -> Option<OperationId> {
        let oldest = self.outstanding.lock().ok()?.first().copied();
        let through = oldest
            .unwrap_or_else(|| self.next_operation.load(Ordering::Relaxed))
            .checked_sub(1)?;
        (through > 0).then_some(OperationId(through))
    }

    fn begin(&self) -> OperationId {
        let operation = self.next_operation.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut outstanding) = self.outstanding.lock() {
            outstanding.insert(operation);
        }
        OperationId(operation)
    }

    fn end(&self, operation: OperationId) {
        if let Ok(mut outstanding) = self.outstanding.lock() {
            outstanding.remove(&operation.0);
        }
    }

    /// Reserves room for a store. A lost reply is resolved: a reservation that was not
    /// applied reads as `Skip`.
    pub async fn reserve(&self, item: ReserveItem) -> Result<ReserveOutcome, LinkError> {
        let operation = self.begin();
        let result = match self
            .call(DirectoryRequest::Reserve { operation, item })
            .await
        {
            Ok(DirectoryReply::Reserved(outcome)) => Ok(outcome),
            Ok(other) => Err(LinkError::Unexpected(format!("{other:?}"))),
            Err(LinkError::Wire(_)) => match self.resolve(operation).await {
                Ok(ResolveOutcome::Reserved(outcome)) => Ok(outcome),
                Ok(ResolveOutcome::NotApplied) => Ok(ReserveOutcome::Skip),
                Ok(_) | Err(_) => Err(LinkError::Unresolved(operation)),
            },
            Err(error) => Err(error),
        };
        self.end(operation);
        result
    }

    /// Publishes a written replica. A lost reply is resolved; `Err(Unresolved)` means the
    /// storage must stay allocated, `Ok(None)` that the commit was not applied.
    pub async fn commit(
        &self,
        replica: ReplicaId,
        location: Location,
    ) -> Result<Option<CommitOutcome>, LinkError> {
        let operation = self.begin();
        let result = match self
            .call(DirectoryRequest::Commit {
                operation,
                replica,
                location,
            })
            .await
        {
            Ok(DirectoryReply::Committed(outcome)) => Ok(Some(outcome)),
            Ok(other) => Err(LinkError::Unexpected(format!("{other:?}"))),
            Err(LinkError::Wire(_)) => match self.resolve(operation).await {
                Ok(ResolveOutcome::Committed(outcome)) => Ok(Some(outcome)),
                Ok(ResolveOutcome::NotApplied) => Ok(None),
                Ok(_) | Err(_) => Err(LinkError::Unresolved(operation)),
            },
            Err(error) => Err(error),
        };
        self.end(operation);
        result
    }

    async fn resolve(&self, operation: OperationId) -> Result<ResolveOutcome, LinkError> {
        let mut last_error = None;
        for _ in 0..RESOLVE_ATTEMPTS_MAX {
            match self
                .call(DirectoryRequest::Resolve {
                    target: self.session,
                    operation,
                })
                .await
            {
                Ok(DirectoryReply::Resolved(outcome)) => return Ok(outcome),
                Ok(other) => return Err(LinkError::Unexpected(format!("{other:?}"))),
                Err(LinkError::Wire(error)) => {
                    last_error = Some(error);
                    if self.reconnect().await.is_err() {
                        tokio::time::sleep(DIRECTORY_REQUEST_TIMEOUT / 4).await;
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Err(last_error.map_or(LinkError::Unresolved(operation), LinkError::Wire))
    }
}
