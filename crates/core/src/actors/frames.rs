//! The glue between a byte stream and a session actor: a stream of raw frames for the
//! actor's `StreamHandler`, and a writer task fed by a bounded channel.

use crate::protocol::messages::{ProtocolError, SUPPORTED_VERSIONS};
use crate::wire::frame::encode_frame;
use crate::wire::{codec, read_raw_frame, RawFrame, WireError};
use futures_util::stream::{self, Stream};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Replies queued for one connection's writer: as many as requests it may have in flight.
pub const REPLIES_QUEUED_MAX: usize = 256;
/// Requests of one connection being processed at once; more get `Busy`. Every one may
/// finish at once, so the writer queues as many replies.
pub const INFLIGHT_REQUESTS_MAX: usize = REPLIES_QUEUED_MAX;

/// What a session does with one item of its frame stream.
pub enum Incoming<T> {
    /// A decoded request.
    Request(u64, T),
    /// A frame that stays in sync but cannot be served: answer with this typed error.
    Refuse(u64, ProtocolError),
    /// The stream broke (truncated, oversized, not a frame): close the connection.
    Close(WireError),
}

/// Decodes one item of a frame stream into a request, a typed refusal, or a reason to close.
pub fn incoming<T: DeserializeOwned>(frame: Result<RawFrame, WireError>) -> Incoming<T> {
    match frame {
        Ok(frame) => match codec::decode(&frame.payload) {
            Ok(request) => Incoming::Request(frame.header.request_id, request),
            Err(error) => Incoming::Refuse(
                frame.header.request_id,
                ProtocolError::Malformed(error.to_string()),
            ),
        },
        Err(WireError::UnknownVersion { request_id, .. }) => Incoming::Refuse(
            request_id,
            ProtocolError::UnsupportedVersion {
                supported: SUPPORTED_VERSIONS.to_vec(),
            },
        ),
        Err(error) => Incoming::Close(error),
    }
}

/// Bytes a session's reader takes from its stream at once: the frames a pipelining
/// client sent together come in one read, not three reads each (a frame's first byte, the
/// rest of its header, its payload).
pub const READ_BUFFER_BYTES: usize = 64 << 10;

/// Frames read from `reader` until a clean end or an error that desynchronizes the stream
/// (after a recoverable error — unknown version, malformed payload — reading goes on).
/// Reads through a buffer of [`READ_BUFFER_BYTES`].
pub fn frame_stream<R>(reader: R) -> impl Stream<Item = Result<RawFrame, WireError>>
where
    R: AsyncRead + Unpin + 'static,
{
    let reader = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, reader);
    stream::unfold(Some(reader), |state| async move {
        let mut reader = state?;
        match read_raw_frame(&mut reader).await {
            Ok(Some(frame)) => Some((Ok(frame), Some(reader))),
            Ok(None) => None,
            Err(error) => {
                let recoverable = matches!(
                    error,
                    WireError::UnknownVersion { .. } | WireError::Malformed { .. }
                );
                Some((Err(error), recoverable.then_some(reader)))
            }
        }
    })
}

/// Spawns the task that writes `(request id, reply)` pairs to `writer` in queue order, and
/// returns its queue. A reply that cannot be encoded (too large) is replaced by the reply
/// `unencodable` makes from the reason, so the request still gets its answer. The task
/// ends when every sender is dropped or the stream fails.
pub fn spawn_writer<W, T>(mut writer: W, unencodable: fn(String) -> T) -> mpsc::Sender<(u64, T)>
where
    W: AsyncWrite + Unpin + 'static,
    T: Serialize + 'static,
{
    let (sender, mut queue) = mpsc::channel::<(u64, T)>(REPLIES_QUEUED_MAX);
    actix_rt::spawn(async move {
        let mut frames = Vec::new();
        while let Some((request_id, reply)) = queue.recv().await {
            // The replies queued behind this one go out in the same write, up to a bound.
            encode_reply(&mut frames, request_id, &reply, unencodable);
            while frames.len() < WRITE_BATCH_BYTES {
                let Ok((request_id, reply)) = queue.try_recv() else {
                    break;
                };
                encode_reply(&mut frames, request_id, &reply, unencodable);
            }
            let written = async {
                writer.write_all(&frames).await?;
                writer.flush().await
            };
            if let Err(error) = written.await {
                tracing::debug!(%error, "session writer stopped");
                return;
            }
            frames.clear();
            frames.shrink_to(WRITE_BATCH_BYTES);
        }
        let _ = writer.shutdown().await;
    });
    sender
}

/// Bytes of queued replies one write gathers before it goes out (a larger reply goes
/// whole, alone past this).
pub const WRITE_BATCH_BYTES: usize = 256 << 10;

/// Appends the frame of `reply` to `frames`; a reply that cannot be encoded (too large)
/// becomes the reply `unencodable` makes from the reason, so the request still gets its
/// answer; one that cannot be encoded either is dropped (logged) and the request times out.
fn encode_reply<T: Serialize>(
    frames: &mut Vec<u8>,
    request_id: u64,
    reply: &T,
    unencodable: fn(String) -> T,
) {
    let frame = encode_frame(request_id, reply)
        .or_else(|error| encode_frame(request_id, &unencodable(error.to_string())));
    match frame {
        Ok(frame) if frames.is_empty() => *frames = frame,
        Ok(frame) => frames.extend_from_slice(&frame),
        Err(error) => tracing::warn!(%error, request_id, "a reply could not be encoded"),
    }
}
