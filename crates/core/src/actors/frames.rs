//! The glue between a byte stream and a session actor: a stream of raw frames for the
//! actor's `StreamHandler`, and a writer task fed by a bounded channel.

use crate::protocol::messages::{ProtocolError, SUPPORTED_VERSIONS};
use crate::wire::{codec, read_raw_frame, write_frame, RawFrame, WireError};
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

/// Frames read from `reader` until a clean end or an error that desynchronizes the stream
/// (after a recoverable error — unknown version, malformed payload — reading goes on).
pub fn frame_stream<R>(reader: R) -> impl Stream<Item = Result<RawFrame, WireError>>
where
    R: AsyncRead + Unpin + 'static,
{
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
        while let Some((request_id, reply)) = queue.recv().await {
            let written = match write_frame(&mut writer, request_id, &reply).await {
                Err(error @ (WireError::Oversized { .. } | WireError::Encode { .. })) => {
                    write_frame(&mut writer, request_id, &unencodable(error.to_string())).await
                }
                other => other,
            };
            if let Err(error) = written {
                tracing::debug!(%error, "session writer stopped");
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    sender
}
