//! Node-to-node transfers: the QUIC endpoint a node copies replicas over, tuned for bulk
//! bytes, and the stream format.
//!
//! A transfer is one bidirectional stream on a mutually authenticated connection (the
//! cluster CA of [`super::tls`]; each side's identity is its certificate's name). The
//! sender writes a [`TransferHeader`] and waits for one [`Verdict`] byte: [`Verdict::Accepted`]
//! or a refusal, sent before any object byte moves. Accepted, it writes exactly
//! `length_bytes` and finishes the stream; the receiver answers one last verdict,
//! [`Verdict::Committed`] or [`Verdict::Failed`]. A sender that finds its source changed
//! resets the stream instead of finishing it, so the receiver never commits it.
//!
//! The receiving node's table of expected transfers (`crate::node::transfers`) decides what
//! is accepted; this module knows only bytes and sockets.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::error::WireError;

/// First bytes of every transfer header: "KVTP" (kvtier peer).
pub const TRANSFER_MAGIC: [u8; 4] = *b"KVTP";
/// The stream format's version. A receiver refuses any other with
/// [`Verdict::BadHeader`]; a new format gets a new number.
pub const TRANSFER_VERSION: u16 = 2;
/// Encoded header size: magic (4), version (2), reserved (2, zero), task id (8), target
/// replica id (8), token (8), length (8); big endian.
pub const HEADER_BYTES: usize = 40;
/// Largest object a transfer carries: 1 GiB. KV objects are chunks of a prefix (MiBs); a
/// larger claim is a malformed or hostile header, refused before anything is allocated.
pub const TRANSFER_BYTES_MAX: u64 = 1 << 30;

/// A datagram that fits any path with a 1500-byte MTU (IPv6 40 + UDP 8 bytes of headers).
pub const DATAGRAM_BYTES_SAFE: u16 = 1452;
/// The largest UDP payload IPv4 can carry.
pub const DATAGRAM_BYTES_MAX: u16 = 65_527;
/// Above this datagram size, segmentation offload is turned off: the kernel then sends so
/// few datagrams per GSO batch that the batching costs more than it saves (measured on
/// loopback: 6.5 KB datagrams gain nothing from GSO, larger ones lose).
pub const GSO_DATAGRAM_BYTES_MAX: u16 = 6_500;
/// Largest datagram a connection starts with: QUIC's long-header packets (the handshake)
/// encode their length in 14 bits, so larger datagrams are reached by MTU discovery.
pub const HANDSHAKE_DATAGRAM_BYTES_MAX: u16 = 16_000;
/// Bytes the receiver lets one stream's sender have in flight: 8 MiB, two 4 MiB objects,
/// so one object never waits for a window update on a path of a few milliseconds.
pub const STREAM_RECEIVE_WINDOW_BYTES: u32 = 8 << 20;
/// Bytes the receiver lets one connection have in flight over all its streams: 32 MiB, four
/// streams at full window. It bounds what one peer can make the receiver buffer.
pub const CONNECTION_RECEIVE_WINDOW_BYTES: u32 = 32 << 20;
/// Bytes the sender keeps unacknowledged per connection: 32 MiB, matching the receiver.
pub const SEND_WINDOW_BYTES: u64 = 32 << 20;
/// Transfer streams one peer may have open on a connection at once: 16. The receiver's
/// own bound on concurrent transfers is lower; this bounds per-peer stream state.
pub const TRANSFER_STREAMS_MAX: u32 = 16;
/// UDP socket send and receive buffers, in bytes: 8 MiB each, so a burst of large
/// datagrams is not dropped by the kernel while the endpoint task is busy.
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// Datagrams in the congestion controller's initial window: 10, as RFC 9002 recommends,
/// counted in datagrams of the configured size (Cubic's default counts 1200-byte ones,
/// which is less than one datagram above ~14.7 KB).
pub const INITIAL_WINDOW_DATAGRAMS: u64 = 10;

const _: () = assert!(STREAM_RECEIVE_WINDOW_BYTES as u64 >= 2 * (4 << 20));
const _: () = assert!(CONNECTION_RECEIVE_WINDOW_BYTES >= STREAM_RECEIVE_WINDOW_BYTES);
const _: () = assert!(DATAGRAM_BYTES_SAFE >= 1200 && GSO_DATAGRAM_BYTES_MAX > DATAGRAM_BYTES_SAFE);

/// The header a sender writes first on a transfer stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferHeader {
    /// The sender's task id (its `Push`), for the receiver's logs: the receiver's own
    /// task is another one and matches by target.
    pub task: u64,
    /// The replica the directory reserved on the receiver for this copy.
    pub target_replica: u64,
    /// The copy's token, which the directory gave the sender and the receiver only.
    pub token: u64,
    /// The object's length: exactly this many bytes follow.
    pub length_bytes: u64,
}

/// Why a transfer header was refused. The receiver answers [`Verdict::BadHeader`] and
/// closes the stream; nothing was allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than [`HEADER_BYTES`] bytes arrived before the stream ended.
    #[error("transfer header truncated at {bytes} bytes")]
    Truncated {
        /// Bytes that arrived.
        bytes: usize,
    },
    /// The stream does not start with [`TRANSFER_MAGIC`]: not a kvtier transfer.
    #[error("bad transfer magic {magic:02x?}")]
    BadMagic {
        /// The four bytes found.
        magic: [u8; 4],
    },
    /// A format version this build does not speak.
    #[error("unsupported transfer version {version}")]
    UnsupportedVersion {
        /// The version found.
        version: u16,
    },
    /// The reserved field is not zero (a later format's flags this build cannot honour).
    #[error("reserved header bits set: {reserved:#06x}")]
    ReservedBits {
        /// The field found.
        reserved: u16,
    },
    /// A zero length or one above [`TRANSFER_BYTES_MAX`].
    #[error("transfer length {length_bytes} outside 1..={TRANSFER_BYTES_MAX}")]
    BadLength {
        /// The length claimed.
        length_bytes: u64,
    },
}

impl TransferHeader {
    /// The header's bytes. Decoding them with [`TransferHeader::decode`] gives `self` back
    /// whenever `length_bytes` is in range.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut bytes = [0; HEADER_BYTES];
        bytes[0..4].copy_from_slice(&TRANSFER_MAGIC);
        bytes[4..6].copy_from_slice(&TRANSFER_VERSION.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.task.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.target_replica.to_be_bytes());
        bytes[24..32].copy_from_slice(&self.token.to_be_bytes());
        bytes[32..40].copy_from_slice(&self.length_bytes.to_be_bytes());
        bytes
    }

    /// Parses a header from the first [`HEADER_BYTES`] of `bytes` (any more are ignored).
    /// Any input gives a header or a typed error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<TransferHeader, HeaderError> {
        let Some(bytes) = bytes.get(..HEADER_BYTES) else {
            return Err(HeaderError::Truncated { bytes: bytes.len() });
        };
        let field = |at: usize| {
            let mut word = [0; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_be_bytes(word)
        };
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if magic != TRANSFER_MAGIC {
            return Err(HeaderError::BadMagic { magic });
        }
        let version = u16::from_be_bytes([bytes[4], bytes[5]]);
        if version != TRANSFER_VERSION {
            return Err(HeaderError::UnsupportedVersion { version });
        }
        let reserved = u16::from_be_bytes([bytes[6], bytes[7]]);
        if reserved != 0 {
            return Err(HeaderError::ReservedBits { reserved });
        }
        let header = TransferHeader {
            task: field(8),
            target_replica: field(16),
            token: field(24),
            length_bytes: field(32),
        };
        if header.length_bytes == 0 || header.length_bytes > TRANSFER_BYTES_MAX {
            return Err(HeaderError::BadLength {
                length_bytes: header.length_bytes,
            });
        }
        Ok(header)
    }
}

/// The receiver's one-byte answers on a transfer stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The transfer was expected and its target allocated: send the bytes.
    Accepted,
    /// Every byte arrived and the target replica is READY.
    Committed,
    /// The bytes arrived but the copy could not be committed (or arrived short): the
    /// target was aborted and freed. The directory's task decides whether to retry.
    Failed,
    /// No expected transfer matches (sender, target): not (yet) named by the directory.
    /// The sender may retry shortly when its task is new (the receiver may not have
    /// fetched its half yet); the bytes never touch the receiver's pool.
    NotExpected,
    /// The receiver runs as many transfers as it allows; retry later.
    Busy,
    /// The receiver's pool has no room for the object: the copy is skipped.
    Full,
    /// The header was malformed ([`HeaderError`]).
    BadHeader,
    /// The transfer was named for another sender, differs from the named one, or lapsed:
    /// asking again cannot succeed, so the sender gives up at once.
    Refused,
}

impl Verdict {
    /// The byte on the wire.
    pub fn to_byte(self) -> u8 {
        match self {
            Verdict::Accepted => 1,
            Verdict::Committed => 2,
            Verdict::Failed => 3,
            Verdict::NotExpected => 16,
            Verdict::Busy => 17,
            Verdict::Full => 18,
            Verdict::BadHeader => 19,
            Verdict::Refused => 20,
        }
    }

    /// The verdict a byte names; `None` for an unknown byte (a peer of another version),
    /// which the sender treats as a failure.
    pub fn from_byte(byte: u8) -> Option<Verdict> {
        Some(match byte {
            1 => Verdict::Accepted,
            2 => Verdict::Committed,
            3 => Verdict::Failed,
            16 => Verdict::NotExpected,
            17 => Verdict::Busy,
            18 => Verdict::Full,
            19 => Verdict::BadHeader,
            20 => Verdict::Refused,
            _ => return None,
        })
    }
}

/// The transport settings of a peer connection, both sides, for a path that carries
/// `datagram_bytes` UDP payloads (at least 1200): the windows above, at most
/// [`TRANSFER_STREAMS_MAX`] streams per peer, the keep-alive and idle timeout of
/// [`super::quic::transport_config`]. With [`DATAGRAM_BYTES_SAFE`] datagrams, MTU discovery
/// stays on (capped there) with segmentation offload; larger datagrams are used from the
/// first packet (the operator vouches for the path) up to [`HANDSHAKE_DATAGRAM_BYTES_MAX`],
/// then MTU discovery climbs to `datagram_bytes`; above [`GSO_DATAGRAM_BYTES_MAX`] without
/// segmentation offload.
pub fn transport_config(datagram_bytes: u16) -> quinn::TransportConfig {
    let datagram_bytes = datagram_bytes.max(1200);
    let mut transport = super::quic::transport_config();
    transport.max_concurrent_bidi_streams(quinn::VarInt::from_u32(TRANSFER_STREAMS_MAX));
    transport.stream_receive_window(quinn::VarInt::from_u32(STREAM_RECEIVE_WINDOW_BYTES));
    transport.receive_window(quinn::VarInt::from_u32(CONNECTION_RECEIVE_WINDOW_BYTES));
    transport.send_window(SEND_WINDOW_BYTES);
    if datagram_bytes <= DATAGRAM_BYTES_SAFE {
        let mut discovery = quinn::MtuDiscoveryConfig::default();
        discovery.upper_bound(datagram_bytes);
        transport.mtu_discovery_config(Some(discovery));
        transport.enable_segmentation_offload(true);
    } else {
        // Handshake packets carry a 14-bit length: they cannot start above 16 KB.
        let first = datagram_bytes.min(HANDSHAKE_DATAGRAM_BYTES_MAX);
        transport.initial_mtu(first);
        transport.min_mtu(first);
        let mut discovery = quinn::MtuDiscoveryConfig::default();
        discovery.upper_bound(datagram_bytes);
        transport.mtu_discovery_config(Some(discovery));
        transport.enable_segmentation_offload(datagram_bytes <= GSO_DATAGRAM_BYTES_MAX);
    }
    let mut cubic = quinn::congestion::CubicConfig::default();
    cubic.initial_window(INITIAL_WINDOW_DATAGRAMS * u64::from(datagram_bytes));
    transport.congestion_controller_factory(Arc::new(cubic));
    transport
}

/// Binds a peer endpoint on `bind`: it serves transfers with `server` (when given) and
/// opens them as a client, with [`SOCKET_BUFFER_BYTES`] socket buffers and datagrams up to
/// `datagram_bytes`. Errors: [`WireError::Io`] when the address cannot be bound.
pub fn endpoint(
    bind: SocketAddr,
    server: Option<quinn::ServerConfig>,
    datagram_bytes: u16,
) -> Result<quinn::Endpoint, WireError> {
    let socket = std::net::UdpSocket::bind(bind)?;
    set_socket_buffers(&socket);
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(datagram_bytes.clamp(1200, DATAGRAM_BYTES_MAX))
        .map_err(|_| WireError::InvalidConfig {
            reason: "peer datagram size outside 1200..=65527 bytes",
        })?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| std::io::Error::other("a peer endpoint needs a tokio runtime"))?;
    Ok(quinn::Endpoint::new(config, server, socket, runtime)?)
}

/// Raises the socket's buffers to [`SOCKET_BUFFER_BYTES`]: forced past the system maximum
/// when the process may (root), else as far as the maximum allows. Best effort: the
/// endpoint works with the default buffers, only slower under bursts.
fn set_socket_buffers(socket: &std::net::UdpSocket) {
    use std::os::fd::AsRawFd;
    let bytes = libc::c_int::try_from(SOCKET_BUFFER_BYTES).unwrap_or(libc::c_int::MAX);
    for (forced, plain) in [
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
    ] {
        for option in [forced, plain] {
            // SAFETY: the descriptor is open for the socket's lifetime and the value is a
            // c_int of the size passed.
            let set = unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    option,
                    std::ptr::from_ref(&bytes).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if set == 0 {
                break;
            }
        }
    }
}

/// The QUIC server configuration of node `name`'s peer endpoint: the cluster credentials
/// in `certs` (mutual TLS, as [`super::tls::server_config`]) with [`transport_config`].
pub fn server_config(
    certs: &std::path::Path,
    name: &str,
    datagram_bytes: u16,
) -> Result<quinn::ServerConfig, super::tls::TlsError> {
    let mut config = super::tls::server_config(certs, name)?;
    config.transport_config(Arc::new(transport_config(datagram_bytes)));
    Ok(config)
}

/// The QUIC client configuration node `name` opens transfers with: its credentials in
/// `certs` (as [`super::tls::client_config`]) with [`transport_config`].
pub fn client_config(
    certs: &std::path::Path,
    name: &str,
    datagram_bytes: u16,
) -> Result<quinn::ClientConfig, super::tls::TlsError> {
    let mut config = super::tls::client_config(certs, name)?;
    config.transport_config(Arc::new(transport_config(datagram_bytes)));
    Ok(config)
}

/// How long a transfer may wait for one verdict byte: 10 s, the idle timeout. A receiver
/// answers the header at once and the final verdict after one commit round trip.
pub const VERDICT_TIMEOUT: Duration = Duration::from_millis(super::quic::IDLE_TIMEOUT_MS as u64);

/// Reads one verdict byte. Errors: [`WireError::Truncated`] when the stream ends first or
/// the byte is unknown, [`WireError::Timeout`] past [`VERDICT_TIMEOUT`], a stream error
/// otherwise.
pub async fn read_verdict(receive: &mut quinn::RecvStream) -> Result<Verdict, WireError> {
    let mut byte = [0; 1];
    match tokio::time::timeout(VERDICT_TIMEOUT, receive.read_exact(&mut byte)).await {
        Err(_) => Err(WireError::Timeout {
            timeout: VERDICT_TIMEOUT,
        }),
        Ok(Err(quinn::ReadExactError::FinishedEarly(_))) => Err(WireError::Truncated),
        Ok(Err(quinn::ReadExactError::ReadError(error))) => Err(std::io::Error::from(error).into()),
        Ok(Ok(())) => Verdict::from_byte(byte[0]).ok_or(WireError::Truncated),
    }
}

/// Writes one verdict byte.
pub async fn write_verdict(
    send: &mut quinn::SendStream,
    verdict: Verdict,
) -> Result<(), WireError> {
    send.write_all(&[verdict.to_byte()])
        .await
        .map_err(std::io::Error::from)?;
    Ok(())
}

#[cfg(test)]
mod tests;
