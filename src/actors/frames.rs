//! The glue between a byte stream and a session actor: a stream of raw frames for the
//! actor's `StreamHandler`, and a writer task fed by a bounded channel.

use crate::wire::{read_raw_frame, write_frame, RawFrame, WireError};
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Replies queued for one connection's writer: as many as requests it may have in flight.
pub const REPLIES_QUEUED_MAX: usize = 256;

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
