//! QUIC endpoints and sessions.
//!
//! A session is one long-lived bidirectional stream on a mutually authenticated connection
//! (see [`super::tls`]). It carries pipelined frames: the requester tags each request with a
//! request id and the responder echoes it, so replies may come back in any order
//! ([`super::rpc::RpcClient`] on the requesting side, [`super::frame`] helpers on the other).
//! Every function here needs a tokio runtime.

use std::net::SocketAddr;
use std::time::Duration;

use super::error::WireError;

/// How often an idle connection sends a keep-alive: 1 s, a tenth of the idle timeout, so ten
/// consecutive losses are needed before a healthy but quiet peer is declared gone.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(1);

/// How long a connection may hear nothing before it is closed, in milliseconds: 10 s. Long
/// enough to ride out a short network hiccup or a stalled peer thread; short enough that a
/// dead node's connection is noticed well within the directory's heartbeat suspicion window.
pub const IDLE_TIMEOUT_MS: u32 = 10_000;

/// Bidirectional streams a peer may open at once on one connection: one session stream is
/// the norm; a few more let a reconnecting session overlap its predecessor. Bounds per-peer
/// stream state.
pub const BIDI_STREAMS_MAX: u32 = 8;

const _: () = assert!(KEEP_ALIVE_INTERVAL.as_millis() * 2 <= IDLE_TIMEOUT_MS as u128);

/// The transport settings of every kvtier connection, both sides: keep-alive every
/// [`KEEP_ALIVE_INTERVAL`], idle timeout [`IDLE_TIMEOUT_MS`], at most [`BIDI_STREAMS_MAX`]
/// bidirectional streams opened by the peer, no unidirectional streams (sessions do not use
/// them), quinn's defaults otherwise.
pub fn transport_config() -> quinn::TransportConfig {
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(Some(KEEP_ALIVE_INTERVAL));
    transport.max_idle_timeout(Some(quinn::IdleTimeout::from(quinn::VarInt::from_u32(
        IDLE_TIMEOUT_MS,
    ))));
    transport.max_concurrent_bidi_streams(quinn::VarInt::from_u32(BIDI_STREAMS_MAX));
    transport.max_concurrent_uni_streams(quinn::VarInt::from_u32(0));
    transport
}

/// Binds a server endpoint on `bind` that accepts connections with `config` (see
/// [`super::tls::server_config`]).
///
/// The caller accepts with `endpoint.accept()` and should await each `Incoming` in its own
/// task, so that one slow handshake does not delay the others. Errors: [`WireError::Io`] when
/// the address cannot be bound.
pub fn server_endpoint(
    bind: SocketAddr,
    config: quinn::ServerConfig,
) -> Result<quinn::Endpoint, WireError> {
    Ok(quinn::Endpoint::server(config, bind)?)
}

/// Binds a client-only endpoint on `bind` (use port 0 for an ephemeral port). One endpoint
/// can carry connections to many servers; keep it alive as long as they are used.
pub fn client_endpoint(bind: SocketAddr) -> Result<quinn::Endpoint, WireError> {
    Ok(quinn::Endpoint::client(bind)?)
}

/// Connects `endpoint` to `remote`, verifying that the server's certificate is valid for
/// `server_name` under `config`'s CA (see [`super::tls::client_config`]).
///
/// Errors: [`WireError::Connect`] for an invalid name or a stopping endpoint,
/// [`WireError::Connection`] when the handshake fails or times out. With mutual TLS 1.3 the
/// server judges the client's certificate after the client considers the handshake done, so
/// a refused client may see success here and [`WireError::Connection`] or
/// [`WireError::ConnectionLost`] on its first exchange.
pub async fn connect(
    endpoint: &quinn::Endpoint,
    remote: SocketAddr,
    server_name: &str,
    config: quinn::ClientConfig,
) -> Result<quinn::Connection, WireError> {
    Ok(endpoint.connect_with(config, remote, server_name)?.await?)
}

/// Opens the session stream of `connection` (client side). The peer learns of the stream
/// only when the first frame is written on it.
pub async fn open_session(
    connection: &quinn::Connection,
) -> Result<(quinn::SendStream, quinn::RecvStream), WireError> {
    Ok(connection.open_bi().await?)
}

/// Accepts the next session stream the peer opened on `connection` (server side); resolves
/// once the peer has written on it. Errors with [`WireError::Connection`] when the connection
/// ends first.
pub async fn accept_session(
    connection: &quinn::Connection,
) -> Result<(quinn::SendStream, quinn::RecvStream), WireError> {
    Ok(connection.accept_bi().await?)
}

/// Whether `error` is a server refusing the connection before its handshake (a standby
/// directory does so while another leads).
pub fn is_refused(error: &WireError) -> bool {
    matches!(
        error,
        WireError::Connection(quinn::ConnectionError::ConnectionClosed(close))
            if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED
    )
}

/// The reason the peer gave when it closed `connection` (`None` while it is open or when it
/// ended otherwise): a server refusing a client after the handshake says why this way.
pub fn peer_close_reason(connection: &quinn::Connection) -> Option<String> {
    match connection.close_reason()? {
        quinn::ConnectionError::ApplicationClosed(close) => {
            Some(String::from_utf8_lossy(&close.reason).into_owned())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::certs::init_cluster_certs;
    use crate::wire::codec::tests::Sample;
    use crate::wire::frame::{read_frame, write_frame};
    use crate::wire::rpc::{RpcClient, RpcConfig};
    use crate::wire::tls;
    use crate::wire::tls::tests::temp_directory;
    use std::net::Ipv4Addr;
    use std::path::Path;

    const LOOPBACK: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

    /// Serves one connection: echoes every request frame on its session stream until the
    /// client finishes it, then returns the client's certificate name.
    async fn echo_one_connection(endpoint: quinn::Endpoint) -> Result<Option<String>, WireError> {
        let incoming = endpoint.accept().await.unwrap();
        let connection = incoming.await?;
        let (mut send, mut receive) = accept_session(&connection).await?;
        while let Some((request_id, message)) = read_frame::<_, Sample>(&mut receive).await? {
            write_frame(&mut send, request_id, &message).await?;
        }
        Ok(tls::peer_name(&connection))
    }

    fn cluster(test: &str) -> std::path::PathBuf {
        let directory = temp_directory(test);
        init_cluster_certs(&directory, &["directory".into(), "node-a".into()], false).unwrap();
        directory
    }

    /// Runs one RPC against a fresh echo server whose credentials come from `server_dir`;
    /// returns the server's outcome and the reply.
    async fn exchange(
        server_dir: &Path,
        client: quinn::ClientConfig,
    ) -> (Result<Option<String>, WireError>, Result<Sample, WireError>) {
        let server = server_endpoint(
            LOOPBACK,
            tls::server_config(server_dir, "directory").unwrap(),
        )
        .unwrap();
        let address = server.local_addr().unwrap();
        let server_task = tokio::spawn(echo_one_connection(server));
        let endpoint = client_endpoint(LOOPBACK).unwrap();
        let client_side = async {
            let connection = connect(&endpoint, address, "directory", client).await?;
            let (send, receive) = open_session(&connection).await?;
            let config = RpcConfig {
                inflight_requests_max: 4,
                request_timeout: Duration::from_secs(5),
            };
            let rpc = RpcClient::<Sample, Sample>::spawn(receive, send, config)?;
            let reply = rpc.call(Sample::Number(99)).await?;
            // Dropping the last client finishes the stream, which ends the echo loop.
            Ok::<_, WireError>((connection, reply))
        };
        let reply = match client_side.await {
            Ok((connection, reply)) => {
                // Only reached with a server from the cluster CA, which presents "directory".
                assert_eq!(tls::peer_name(&connection).as_deref(), Some("directory"));
                let server = server_task.await.unwrap();
                connection.close(0u32.into(), b"done");
                return (server, Ok(reply));
            }
            Err(error) => Err(error),
        };
        (server_task.await.unwrap(), reply)
    }

    /// Whether the server's handshake failed with a TLS alert (QUIC CRYPTO_ERROR codes are
    /// 0x100 plus the alert number).
    fn refused_by_tls(server: &Result<Option<String>, WireError>) -> bool {
        match server {
            Err(WireError::Connection(quinn::ConnectionError::TransportError(error))) => {
                (0x100..0x200).contains(&u64::from(error.code))
            }
            _ => false,
        }
    }

    #[tokio::test]
    async fn cluster_client_completes_an_rpc_and_is_named() {
        let directory = cluster("quic-ok");
        let client = tls::client_config(&directory, "node-a").unwrap();
        let (server, reply) = exchange(&directory, client).await;
        assert_eq!(reply.unwrap(), Sample::Number(99));
        assert_eq!(server.unwrap().as_deref(), Some("node-a"));
        std::fs::remove_dir_all(&directory).unwrap();
    }

    #[tokio::test]
    async fn client_with_a_certificate_from_another_ca_is_refused() {
        let directory = cluster("quic-other-ca");
        let other = cluster("quic-other-ca-rogue");
        // Trusts the real CA (so the server passes) but presents a rogue-CA certificate.
        let tls_config = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(tls::load_roots(&directory.join("ca.pem")).unwrap())
            .with_client_auth_cert(
                tls::load_certificates(&other.join("node-a.pem")).unwrap(),
                tls::load_private_key(&other.join("node-a.key")).unwrap(),
            )
            .unwrap();
        let client = tls::quic_client_config(tls_config).unwrap();
        let (server, reply) = exchange(&directory, client).await;
        assert!(refused_by_tls(&server), "{server:?}");
        assert!(reply.is_err(), "{reply:?}");
        std::fs::remove_dir_all(&directory).unwrap();
        std::fs::remove_dir_all(&other).unwrap();
    }

    #[tokio::test]
    async fn client_without_a_certificate_is_refused() {
        let directory = cluster("quic-no-cert");
        let tls_config = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(tls::load_roots(&directory.join("ca.pem")).unwrap())
            .with_no_client_auth();
        let client = tls::quic_client_config(tls_config).unwrap();
        let (server, reply) = exchange(&directory, client).await;
        assert!(refused_by_tls(&server), "{server:?}");
        assert!(reply.is_err(), "{reply:?}");
        std::fs::remove_dir_all(&directory).unwrap();
    }

    #[tokio::test]
    async fn server_with_a_certificate_from_another_ca_is_refused_by_the_client() {
        let directory = cluster("quic-rogue-server");
        let other = cluster("quic-rogue-server-client");
        let client = tls::client_config(&other, "node-a").unwrap();
        let (server, reply) = exchange(&directory, client).await;
        assert!(matches!(reply, Err(WireError::Connection(_))), "{reply:?}");
        assert!(server.is_err(), "{server:?}");
        std::fs::remove_dir_all(&directory).unwrap();
        std::fs::remove_dir_all(&other).unwrap();
    }
}
