//! Frames: the length-prefixed, versioned envelope around every message, and async helpers to
//! read and write them on any tokio byte stream (a QUIC stream, a Unix socket).
//!
//! Layout, all integers little endian:
//!
//! ```text
//! offset 0   magic          u16  FRAME_MAGIC
//! offset 2   version        u16  PROTOCOL_VERSION of the sender
//! offset 4   request id     u64  chosen by the requester, echoed by the reply
//! offset 12  payload bytes  u32  at most FRAME_PAYLOAD_BYTES_MAX
//! offset 16  payload        codec-encoded message
//! ```
//!
//! [`FrameHeader`] is the sans-I/O part (bytes in, header or typed error out); the async
//! functions only move bytes. A reader never allocates a payload from the header's claim: it
//! grows its buffer as bytes arrive (at most [`FRAME_PAYLOAD_BYTES_MAX`]), and once a frame's
//! first byte arrived the whole frame must arrive within [`FRAME_COMPLETION_TIMEOUT`], so a
//! peer cannot pin a buffer by stalling mid-frame. The readers are not cancel-safe: a read dropped mid-frame loses
//! sync, so run each reader in its own loop or task rather than racing it in `select!`.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::codec::{self, FRAME_PAYLOAD_BYTES_MAX};
use super::error::WireError;

/// First two bytes of every frame ("KV" read as little-endian ASCII): catches peers that are
/// not kvtier and streams that lost sync.
pub const FRAME_MAGIC: u16 = u16::from_le_bytes(*b"KV");

/// The protocol version this build writes and the only one it reads. Bump it whenever the
/// codec configuration, the frame layout or any message changes incompatibly.
pub const PROTOCOL_VERSION: u16 = 1;

/// How long a frame may take from its first byte to its last: 10 s. A healthy peer writes a
/// frame (at most 4 MiB) in milliseconds; one that stalls mid-frame holds the reader's buffer
/// and the stream's sync, so the reader gives up ([`WireError::FrameTimeout`]) and the caller
/// drops the connection. Waiting for a frame's first byte has no limit here: an idle session
/// is healthy (the transport's idle timeout bounds it).
pub const FRAME_COMPLETION_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes a payload buffer starts with before it grows with what arrives: small, so a header
/// that claims 4 MiB and sends nothing costs this much, not 4 MiB.
const PAYLOAD_INITIAL_BYTES: usize = 4096;

/// Size of the fixed frame header in bytes.
pub const FRAME_HEADER_BYTES: usize = 16;

const _: () = assert!(FRAME_PAYLOAD_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(FRAME_HEADER_BYTES == 2 + 2 + 8 + 4);

/// A decoded frame header. Constructing one by hand does not validate it; [`FrameHeader::decode`]
/// does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The sender's protocol version.
    pub version: u16,
    /// The request id: chosen by the requester, echoed unchanged by the reply.
    pub request_id: u64,
    /// Length of the payload that follows the header, in bytes.
    pub payload_bytes: u32,
}

impl FrameHeader {
    /// Encodes the header (magic included) into its 16 wire bytes. Pure; safe to repeat.
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut bytes = [0u8; FRAME_HEADER_BYTES];
        bytes[0..2].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        bytes[2..4].copy_from_slice(&self.version.to_le_bytes());
        bytes[4..12].copy_from_slice(&self.request_id.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.payload_bytes.to_le_bytes());
        bytes
    }

    /// Decodes and checks 16 header bytes.
    ///
    /// Checks the magic ([`WireError::BadMagic`]) and the payload length
    /// ([`WireError::Oversized`]) but not the version: the caller must consume the payload
    /// first to stay in sync, then refuse the version with the request id in hand.
    pub fn decode(bytes: &[u8; FRAME_HEADER_BYTES]) -> Result<Self, WireError> {
        let [m0, m1, v0, v1, r0, r1, r2, r3, r4, r5, r6, r7, p0, p1, p2, p3] = *bytes;
        let magic = u16::from_le_bytes([m0, m1]);
        if magic != FRAME_MAGIC {
            return Err(WireError::BadMagic { magic });
        }
        let header = FrameHeader {
            version: u16::from_le_bytes([v0, v1]),
            request_id: u64::from_le_bytes([r0, r1, r2, r3, r4, r5, r6, r7]),
            payload_bytes: u32::from_le_bytes([p0, p1, p2, p3]),
        };
        let length = header.payload_length();
        if length > FRAME_PAYLOAD_BYTES_MAX {
            return Err(WireError::Oversized {
                length,
                max: FRAME_PAYLOAD_BYTES_MAX,
            });
        }
        Ok(header)
    }

    /// The payload length as a `usize`, saturating on targets where `u32` does not fit.
    fn payload_length(&self) -> usize {
        usize::try_from(self.payload_bytes).unwrap_or(usize::MAX)
    }
}

/// A frame whose header was checked (magic, length, version) but whose payload is not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// The checked header; `header.version == PROTOCOL_VERSION`.
    pub header: FrameHeader,
    /// Exactly `header.payload_bytes` bytes.
    pub payload: Vec<u8>,
}

/// Encodes `message` into one complete frame (header and payload) in a single buffer.
///
/// Errors: [`WireError::Oversized`] past [`FRAME_PAYLOAD_BYTES_MAX`], [`WireError::Encode`].
pub fn encode_frame<T: Serialize>(request_id: u64, message: &T) -> Result<Vec<u8>, WireError> {
    let mut buffer = Vec::with_capacity(FRAME_HEADER_BYTES + 64);
    buffer.resize(FRAME_HEADER_BYTES, 0);
    let payload_length = codec::encode_append(message, &mut buffer)?;
    let payload_bytes = u32::try_from(payload_length).map_err(|_| WireError::Oversized {
        length: payload_length,
        max: FRAME_PAYLOAD_BYTES_MAX,
    })?;
    let header = FrameHeader {
        version: PROTOCOL_VERSION,
        request_id,
        payload_bytes,
    };
    buffer[..FRAME_HEADER_BYTES].copy_from_slice(&header.encode());
    Ok(buffer)
}

/// Writes `message` as one frame tagged `request_id`, then flushes.
///
/// Nothing is written when encoding fails ([`WireError::Oversized`], [`WireError::Encode`]), so
/// the stream stays usable. A [`WireError::Io`] may leave a partial frame behind: the caller
/// closes the stream. Not cancel-safe for the same reason.
pub async fn write_frame<W, T>(
    writer: &mut W,
    request_id: u64,
    message: &T,
) -> Result<(), WireError>
where
    W: AsyncWrite + Unpin + ?Sized,
    T: Serialize,
{
    let frame = encode_frame(request_id, message)?;
    writer.write_all(&frame).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads one frame without decoding its payload.
///
/// Returns `Ok(None)` on a clean end of stream before the first header byte. Errors:
/// [`WireError::Truncated`] (EOF inside a frame), [`WireError::BadMagic`] and
/// [`WireError::Oversized`] (nothing of the payload read or allocated; stream out of sync),
/// [`WireError::UnknownVersion`] (payload consumed without buffering it; stream in sync),
/// [`WireError::FrameTimeout`] (the frame did not complete within
/// [`FRAME_COMPLETION_TIMEOUT`] of its first byte; stream out of sync), [`WireError::Io`].
/// The payload buffer grows with the bytes that arrived, never past
/// [`FRAME_PAYLOAD_BYTES_MAX`].
pub async fn read_raw_frame<R>(reader: &mut R) -> Result<Option<RawFrame>, WireError>
where
    R: AsyncRead + Unpin + ?Sized,
{
    read_raw_frame_within(reader, FRAME_COMPLETION_TIMEOUT).await
}

/// [`read_raw_frame`] with the completion timeout given: the frame must arrive whole within
/// `timeout` of its first byte.
pub(crate) async fn read_raw_frame_within<R>(
    reader: &mut R,
    timeout: Duration,
) -> Result<Option<RawFrame>, WireError>
where
    R: AsyncRead + Unpin + ?Sized,
{
    let mut first = [0u8; 1];
    // Waiting for a frame to begin is unbounded (an idle stream); EOF here is clean.
    if reader.read(&mut first).await? == 0 {
        return Ok(None);
    }
    match tokio::time::timeout(timeout, read_rest_of_frame(reader, first[0])).await {
        Ok(result) => result.map(Some),
        Err(_elapsed) => Err(WireError::FrameTimeout { timeout }),
    }
}

/// Reads the rest of a frame whose first byte was `first`.
async fn read_rest_of_frame<R>(reader: &mut R, first: u8) -> Result<RawFrame, WireError>
where
    R: AsyncRead + Unpin + ?Sized,
{
    let mut header_bytes = [0u8; FRAME_HEADER_BYTES];
    header_bytes[0] = first;
    reader
        .read_exact(&mut header_bytes[1..])
        .await
        .map_err(truncated_on_eof)?;
    let header = FrameHeader::decode(&header_bytes)?;
    if header.version != PROTOCOL_VERSION {
        skip_payload(reader, header.payload_bytes).await?;
        return Err(WireError::UnknownVersion {
            version: header.version,
            request_id: header.request_id,
        });
    }
    let length = header.payload_length();
    let mut payload = Vec::with_capacity(length.min(PAYLOAD_INITIAL_BYTES));
    // `take` stops at the declared length; the buffer only grows with bytes that arrived,
    // and the length is at most FRAME_PAYLOAD_BYTES_MAX (checked by `decode`).
    let read_bytes = reader
        .take(u64::from(header.payload_bytes))
        .read_to_end(&mut payload)
        .await?;
    if read_bytes != length {
        return Err(WireError::Truncated);
    }
    Ok(RawFrame { header, payload })
}

/// Reads one frame and decodes its payload as `T`; returns the request id and the message.
///
/// Same contract as [`read_raw_frame`], plus [`WireError::Malformed`] (with the request id,
/// stream in sync) when the payload does not decode as `T`.
pub async fn read_frame<R, T>(reader: &mut R) -> Result<Option<(u64, T)>, WireError>
where
    R: AsyncRead + Unpin + ?Sized,
    T: DeserializeOwned,
{
    let Some(frame) = read_raw_frame(reader).await? else {
        return Ok(None);
    };
    let request_id = frame.header.request_id;
    match codec::decode(&frame.payload) {
        Ok(message) => Ok(Some((request_id, message))),
        Err(error) => Err(WireError::Malformed {
            request_id,
            reason: error.to_string(),
        }),
    }
}

/// Reads and discards `payload_bytes` bytes through a small fixed buffer.
async fn skip_payload<R>(reader: &mut R, payload_bytes: u32) -> Result<(), WireError>
where
    R: AsyncRead + Unpin + ?Sized,
{
    let mut limited = reader.take(u64::from(payload_bytes));
    let skipped_bytes = tokio::io::copy(&mut limited, &mut tokio::io::sink()).await?;
    if skipped_bytes != u64::from(payload_bytes) {
        return Err(WireError::Truncated);
    }
    Ok(())
}

fn truncated_on_eof(error: std::io::Error) -> WireError {
    if error.kind() == std::io::ErrorKind::UnexpectedEof {
        WireError::Truncated
    } else {
        WireError::Io(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::codec::tests::{sample_strategy, Sample};
    use proptest::prelude::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    fn header_bytes(version: u16, request_id: u64, payload_bytes: u32) -> Vec<u8> {
        FrameHeader {
            version,
            request_id,
            payload_bytes,
        }
        .encode()
        .to_vec()
    }

    #[test]
    fn frame_write_then_read_gives_the_same_message() {
        let runtime = runtime();
        proptest!(|(messages in proptest::collection::vec((any::<u64>(), sample_strategy()), 1..8))| {
            let (read, expected) = runtime.block_on(async {
                let mut stream = Vec::new();
                for (request_id, message) in &messages {
                    write_frame(&mut stream, *request_id, message).await.unwrap();
                }
                let mut reader = stream.as_slice();
                let mut read = Vec::new();
                while let Some(frame) = read_frame::<_, Sample>(&mut reader).await.unwrap() {
                    read.push(frame);
                }
                (read, messages.clone())
            });
            prop_assert_eq!(read, expected);
        });
    }

    #[test]
    fn header_decode_never_panics() {
        proptest!(|(bytes in any::<[u8; FRAME_HEADER_BYTES]>())| {
            if let Ok(header) = FrameHeader::decode(&bytes) {
                prop_assert_eq!(header.encode(), bytes);
            }
        });
    }

    #[tokio::test]
    async fn clean_eof_is_none() {
        let mut reader: &[u8] = &[];
        assert!(read_frame::<_, Sample>(&mut reader)
            .await
            .unwrap()
            .is_none());
    }

    #[tokio::test]
    async fn eof_inside_header_or_payload_is_truncated() {
        let frame = encode_frame(9, &Sample::Number(1234567)).unwrap();
        for cut in [
            1,
            FRAME_HEADER_BYTES - 1,
            FRAME_HEADER_BYTES,
            frame.len() - 1,
        ] {
            let mut reader = &frame[..cut];
            let result = read_frame::<_, Sample>(&mut reader).await;
            assert!(
                matches!(result, Err(WireError::Truncated)),
                "cut at {cut}: {result:?}"
            );
        }
    }

    #[tokio::test]
    async fn bad_magic_is_refused() {
        let mut frame = encode_frame(1, &Sample::Empty).unwrap();
        frame[0] ^= 0xff;
        let mut reader = frame.as_slice();
        let result = read_frame::<_, Sample>(&mut reader).await;
        assert!(
            matches!(result, Err(WireError::BadMagic { .. })),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn oversized_length_is_refused_before_reading_the_payload() {
        // The header claims 4 GiB; no payload follows. Reaching for the payload would report
        // Truncated, and allocating it would take 4 GiB: Oversized proves neither happened.
        let bytes = header_bytes(PROTOCOL_VERSION, 3, u32::MAX);
        let mut reader = bytes.as_slice();
        match read_raw_frame(&mut reader).await {
            Err(WireError::Oversized { length, max }) => {
                assert_eq!(length, u32::MAX as usize);
                assert_eq!(max, FRAME_PAYLOAD_BYTES_MAX);
            }
            other => panic!("expected Oversized, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn unknown_version_is_skipped_and_the_next_frame_is_read() {
        let mut stream = header_bytes(PROTOCOL_VERSION + 1, 41, 5);
        stream.extend_from_slice(b"hello");
        stream.extend(encode_frame(42, &Sample::Number(5)).unwrap());
        let mut reader = stream.as_slice();
        let result = read_frame::<_, Sample>(&mut reader).await;
        assert!(
            matches!(
                result,
                Err(WireError::UnknownVersion { version, request_id: 41 }) if version == PROTOCOL_VERSION + 1
            ),
            "{result:?}"
        );
        let next = read_frame::<_, Sample>(&mut reader).await.unwrap();
        assert_eq!(next, Some((42, Sample::Number(5))));
    }

    #[tokio::test]
    async fn malformed_payload_keeps_the_request_id_and_the_stream() {
        let mut stream = header_bytes(PROTOCOL_VERSION, 77, 3);
        stream.extend_from_slice(&[200, 201, 202]);
        stream.extend(encode_frame(78, &Sample::Empty).unwrap());
        let mut reader = stream.as_slice();
        let result = read_frame::<_, Sample>(&mut reader).await;
        assert!(
            matches!(result, Err(WireError::Malformed { request_id: 77, .. })),
            "{result:?}"
        );
        let next = read_frame::<_, Sample>(&mut reader).await.unwrap();
        assert_eq!(next, Some((78, Sample::Empty)));
    }

    #[tokio::test]
    async fn a_frame_stalled_after_its_header_times_out() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        // A header claiming 100 bytes, then 10 of them, then silence with the stream open.
        let mut bytes = header_bytes(PROTOCOL_VERSION, 5, 100);
        bytes.extend_from_slice(&[0u8; 10]);
        client.write_all(&bytes).await.unwrap();
        let timeout = Duration::from_millis(50);
        let result = read_raw_frame_within(&mut server, timeout).await;
        assert!(
            matches!(result, Err(WireError::FrameTimeout { timeout: t }) if t == timeout),
            "{result:?}"
        );
        drop(client);
    }

    #[tokio::test]
    async fn a_stalled_header_times_out_too() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(&FRAME_MAGIC.to_le_bytes()).await.unwrap();
        let result = read_raw_frame_within(&mut server, Duration::from_millis(50)).await;
        assert!(
            matches!(result, Err(WireError::FrameTimeout { .. })),
            "{result:?}"
        );
        drop(client);
    }

    #[tokio::test]
    async fn an_idle_stream_does_not_time_out() {
        let (client, mut server) = tokio::io::duplex(1024);
        // Nothing written: the reader waits past the completion timeout, then reads a frame.
        let reading = tokio::spawn(async move {
            read_raw_frame_within(&mut server, Duration::from_millis(20)).await
        });
        tokio::time::sleep(Duration::from_millis(60)).await;
        let mut client = client;
        client
            .write_all(&encode_frame(3, &Sample::Empty).unwrap())
            .await
            .unwrap();
        let frame = reading.await.unwrap().unwrap().unwrap();
        assert_eq!(frame.header.request_id, 3);
    }

    #[tokio::test]
    async fn oversized_message_writes_nothing() {
        let mut stream = Vec::new();
        let huge = vec![1u8; FRAME_PAYLOAD_BYTES_MAX];
        let result = write_frame(&mut stream, 1, &huge).await;
        assert!(
            matches!(result, Err(WireError::Oversized { .. })),
            "{result:?}"
        );
        assert!(stream.is_empty());
    }
}
