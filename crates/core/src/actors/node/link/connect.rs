//! Connecting a node's link to the directory: every configured directory address at once,
//! the leader's connection kept (standbys refuse before any handshake and are asked again
//! while the node waits), the protocol negotiated with `Hello`.

use super::{DirectoryAddress, LinkError, Rpc, DIRECTORY_INFLIGHT_MAX, DIRECTORY_REQUEST_TIMEOUT};
use crate::protocol::messages::{DirectoryReply, DirectoryRequest, Hello};
use crate::wire::{quic, tls, RpcClient, RpcConfig, WireError};
use std::net::SocketAddr;
use std::time::Duration;

/// How long connecting to the directory may take when standbys are configured: 500 ms, a
/// QUIC handshake being a few round trips on the cluster's network. A dead directory
/// process never answers, and the node tries the addresses again soon after
/// (`OUT_OF_REACH_HEARTBEAT`), so a new leader is found within a fraction of a second.
pub const STANDBY_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How soon a directory process that refused a connection (a standby) is asked again
/// while the node looks for the leader; a refusal costs the standby one packet.
const REFUSED_RETRY_AFTER: Duration = Duration::from_millis(20);

/// A connected, negotiated RPC channel to the directory over `endpoint`, within
/// [`DIRECTORY_REQUEST_TIMEOUT`] ([`STANDBY_CONNECT_TIMEOUT`] with standbys): a directory
/// that is down never answers the handshake.
pub(super) async fn connect(
    endpoint: &quinn::Endpoint,
    target: &DirectoryAddress,
) -> Result<Rpc, LinkError> {
    let timeout = if target.addresses.len() > 1 {
        STANDBY_CONNECT_TIMEOUT
    } else {
        DIRECTORY_REQUEST_TIMEOUT
    };
    tokio::time::timeout(timeout, connect_unbounded(endpoint, target))
        .await
        .unwrap_or(Err(LinkError::Wire(WireError::Timeout { timeout })))
}

/// Connects to every address of `target` at once and keeps the first that completes the
/// handshake: the leader (standbys refuse at once; a dead process never answers). With one
/// address, that one.
async fn connect_unbounded(
    endpoint: &quinn::Endpoint,
    target: &DirectoryAddress,
) -> Result<Rpc, LinkError> {
    let config = tls::client_config(&target.certs, &target.node_name)
        .map_err(|error| LinkError::Unexpected(format!("TLS configuration: {error}")))?;
    if target.addresses.len() <= 1 {
        let address =
            target.addresses.first().copied().ok_or_else(|| {
                LinkError::Unexpected("no directory address configured".to_string())
            })?;
        return connect_to(endpoint, address, target, config).await;
    }
    let attempts = target.addresses.iter().map(|address| {
        Box::pin(connect_until_accepted(
            endpoint,
            *address,
            target,
            config.clone(),
        ))
    });
    futures_util::future::select_ok(attempts)
        .await
        .map(|(rpc, _others)| rpc)
}

/// Connects to the directory process at `address`, asking again every
/// [`REFUSED_RETRY_AFTER`] while it refuses (a standby): one elected while the caller
/// waits on a dead leader's address is found at once, not on the next attempt.
async fn connect_until_accepted(
    endpoint: &quinn::Endpoint,
    address: SocketAddr,
    target: &DirectoryAddress,
    config: quinn::ClientConfig,
) -> Result<Rpc, LinkError> {
    loop {
        match connect_to(endpoint, address, target, config.clone()).await {
            Err(LinkError::Wire(error)) if quic::is_refused(&error) => {
                tokio::time::sleep(REFUSED_RETRY_AFTER).await;
            }
            outcome => return outcome,
        }
    }
}

/// A connected, negotiated RPC channel to the directory process at `address`.
async fn connect_to(
    endpoint: &quinn::Endpoint,
    address: SocketAddr,
    target: &DirectoryAddress,
    config: quinn::ClientConfig,
) -> Result<Rpc, LinkError> {
    let connection = quic::connect(endpoint, address, &target.server_name, config).await?;
    let (sender, receiver) = quic::open_session(&connection).await?;
    let rpc = RpcClient::spawn(
        receiver,
        sender,
        RpcConfig {
            inflight_requests_max: DIRECTORY_INFLIGHT_MAX,
            request_timeout: DIRECTORY_REQUEST_TIMEOUT,
        },
    )?;
    let hello = rpc.call(DirectoryRequest::Hello(Hello::ours())).await;
    // A directory that refuses the peer (a retired certificate, too many connections) closes
    // the connection with its reason: report that rather than a bare lost connection.
    let hello = hello.map_err(|error| match quic::peer_close_reason(&connection) {
        Some(reason) => WireError::ConnectionLost {
            reason: format!("closed by the directory: {reason}"),
        },
        None => error,
    });
    match hello? {
        DirectoryReply::Hello(_) => Ok(rpc),
        DirectoryReply::Error(error) => Err(LinkError::Refused(error)),
        other => Err(LinkError::Unexpected(format!("{other:?}"))),
    }
}
