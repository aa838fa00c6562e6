//! `WireError`: the one error type of the wire boundary (codec, frames, QUIC, UDS, RPC).
//!
//! Certificate and TLS configuration failures have their own enum, [`super::tls::TlsError`],
//! because they happen while reading files at start-up, not while talking to a peer.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while encoding, framing, sending or receiving a message.
///
/// Variants split in two groups. *Per-frame* errors ([`WireError::UnknownVersion`],
/// [`WireError::Malformed`]) leave the stream in sync: the caller may reply to that request id
/// with a typed error and keep reading. *Per-connection* errors (every other variant met while
/// reading or writing) mean the stream can no longer be trusted: the caller closes it.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A value could not be serialized (a serde error from the message type itself). This is a
    /// bug in the message definition; the caller reports it and does not retry the same value.
    #[error("encoding failed: {reason}")]
    Encode {
        /// The codec's explanation.
        reason: String,
    },
    /// Bytes did not decode as the expected type: invalid encoding, a claim past the byte
    /// limit, or trailing bytes after the value. Returned by [`super::codec::decode`]; frame
    /// readers turn it into [`WireError::Malformed`] with the request id.
    #[error("decoding failed: {reason}")]
    Decode {
        /// The codec's explanation.
        reason: String,
    },
    /// The stream ended in the middle of a frame (header or payload). The peer crashed or cut
    /// the connection; the caller closes the stream and fails what was pending on it.
    #[error("stream ended in the middle of a frame")]
    Truncated,
    /// A frame header did not start with [`super::frame::FRAME_MAGIC`]: the peer is not a
    /// kvtier endpoint or the stream lost sync. The caller closes the stream.
    #[error("bad frame magic {magic:#06x}")]
    BadMagic {
        /// The two bytes found where the magic belongs, little endian.
        magic: u16,
    },
    /// A payload is larger than [`super::codec::FRAME_PAYLOAD_BYTES_MAX`]. On read, the claimed
    /// length was neither allocated nor consumed, so the stream is out of sync and the caller
    /// closes it. On write, nothing was sent: the caller splits the message or reports a bug.
    #[error("frame payload of {length} bytes exceeds the maximum of {max} bytes")]
    Oversized {
        /// The claimed (read) or attempted (write; a lower bound) payload length in bytes.
        length: usize,
        /// The maximum payload length in bytes.
        max: usize,
    },
    /// A frame carried a protocol version this build does not speak. Its payload was consumed,
    /// so the stream is still in sync: the caller replies to `request_id` with a typed error
    /// and may keep reading.
    #[error("unknown protocol version {version} in request {request_id}")]
    UnknownVersion {
        /// The version found in the header.
        version: u16,
        /// The request id found in the header.
        request_id: u64,
    },
    /// A well-framed payload did not decode as the expected message. The stream is still in
    /// sync: the caller replies to `request_id` with a typed error and may keep reading.
    #[error("malformed payload in request {request_id}: {reason}")]
    Malformed {
        /// The request id found in the header.
        request_id: u64,
        /// The codec's explanation.
        reason: String,
    },
    /// A frame began but did not arrive whole within the completion timeout
    /// ([`super::frame::FRAME_COMPLETION_TIMEOUT`]): the peer stalled mid-frame. The stream is
    /// out of sync; the caller closes it.
    #[error("frame incomplete {timeout:?} after its first byte")]
    FrameTimeout {
        /// The completion timeout that expired.
        timeout: Duration,
    },
    /// The operating system or the QUIC stream reported an I/O error. The caller closes the
    /// stream (a QUIC connection loss also surfaces here, through the stream).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A QUIC connection could not be started (bad server name, endpoint stopping, invalid
    /// configuration). Nothing was sent; the caller fixes the configuration or retries later.
    #[error("cannot start a QUIC connection: {0}")]
    Connect(#[from] quinn::ConnectError),
    /// A QUIC connection failed or closed: handshake refused (certificate, ALPN), timed out, or
    /// closed by either side. The caller reconnects, with backoff, if it still needs the peer.
    #[error("QUIC connection failed: {0}")]
    Connection(#[from] quinn::ConnectionError),
    /// A configuration value is out of its documented range. The caller fixes its config.
    #[error("invalid wire configuration: {reason}")]
    InvalidConfig {
        /// Which value and which range.
        reason: &'static str,
    },
    /// An RPC got no reply within its timeout. The request may or may not have been applied
    /// by the peer: the caller resolves the outcome (e.g. by operation id) before retrying.
    #[error("no reply within {timeout:?}")]
    Timeout {
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The RPC connection ended (EOF, I/O error, bad frame from the peer) before the reply
    /// arrived; every pending and later call on that client fails with this. Requests already
    /// sent may or may not have been applied: the caller reconnects and resolves them.
    #[error("connection lost: {reason}")]
    ConnectionLost {
        /// Why the connection ended, for logs.
        reason: String,
    },
    /// A Unix socket path is already served by a live listener (another process answered).
    /// The caller refuses to start rather than steal the socket.
    #[error("socket {path} is in use by a live listener")]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// A Unix socket path exists but is not a socket; it is left untouched. The caller picks
    /// another path or removes the file by hand.
    #[error("{path} exists and is not a socket")]
    NotASocket {
        /// The offending path.
        path: PathBuf,
    },
    /// The node's first message on a local connection, the handoff of the memory files its
    /// client may map ([`super::handoff`]), was missing, malformed or cut short: an older
    /// node, or something else listening at the socket. The connection is unusable.
    #[error("the node's handoff of its pools' memory files failed: {reason}")]
    Handoff {
        /// What was wrong.
        reason: &'static str,
    },
}
