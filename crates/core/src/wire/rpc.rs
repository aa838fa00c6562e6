//! `RpcClient`: pipelined request/reply calls over one byte stream.
//!
//! A call writes its own frame when the stream takes it at once ([`outgoing`]); one driver
//! task writes whatever was queued behind, and decodes replies and hands each to the call
//! waiting on its request id.
//! Calls are bounded by a semaphore (`inflight_requests_max`), each has a timeout, and when
//! the stream ends every pending call fails with [`WireError::ConnectionLost`].

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::error::WireError;
use super::frame::{encode_frame, read_frame};
use inbox::{Inbox, ReadNow};
use outgoing::Outgoing;

mod inbox;
mod outgoing;

pub(crate) use inbox::{read_now, spinning};

/// Upper bound on [`RpcConfig::inflight_requests_max`]: each in-flight call holds a map entry
/// and a queued frame of up to 4 MiB, so more than this per connection would let one client
/// pin gigabytes; real sessions need tens.
pub const RPC_INFLIGHT_REQUESTS_LIMIT: usize = 4096;

/// Reason reported when the stream closed without a more specific cause.
const CLOSED_REASON: &str = "connection closed";

/// Limits of one [`RpcClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcConfig {
    /// Calls that may wait for a reply at once, 1 to [`RPC_INFLIGHT_REQUESTS_LIMIT`]. Further
    /// calls wait for a slot, and that wait counts against their timeout.
    pub inflight_requests_max: usize,
    /// How long one call may take from its start (slot wait included) to its reply; must be
    /// non-zero.
    pub request_timeout: Duration,
}

impl Default for RpcConfig {
    /// 64 in-flight calls (enough to pipeline a batch per engine worker of a host) and a 5 s
    /// timeout (metadata calls take well under a millisecond; 5 s means the peer is stuck).
    fn default() -> Self {
        RpcConfig {
            inflight_requests_max: 64,
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl RpcConfig {
    fn validate(&self) -> Result<(), WireError> {
        if !(1..=RPC_INFLIGHT_REQUESTS_LIMIT).contains(&self.inflight_requests_max) {
            return Err(WireError::InvalidConfig {
                reason: "inflight_requests_max must be 1 to RPC_INFLIGHT_REQUESTS_LIMIT",
            });
        }
        if self.request_timeout.is_zero() {
            return Err(WireError::InvalidConfig {
                reason: "request_timeout must be non-zero",
            });
        }
        Ok(())
    }
}

/// The requesting side of a session: sends `Req` frames and matches `Rep` frames to them by
/// request id. Cloning is cheap and every clone shares the same stream and limits.
///
/// The stream is finished (writer shut down) when the last clone is dropped. The peer must
/// answer each request frame with exactly one reply frame carrying the same request id, in
/// any order; a reply for an unknown id (e.g. after a timeout) is dropped and logged.
pub struct RpcClient<Req, Rep> {
    outgoing: Arc<Outgoing>,
    /// Held by every clone: the driver shuts the stream down when the last one is dropped.
    _alive: mpsc::Sender<()>,
    shared: Arc<Shared<Rep>>,
    /// The replies' inbox, where a spinning caller can read them itself (a Unix socket).
    inbox: Option<Arc<dyn ReadNow>>,
    request_timeout: Duration,
    _request: PhantomData<fn(Req)>,
}

impl<Req, Rep> Clone for RpcClient<Req, Rep> {
    fn clone(&self) -> Self {
        RpcClient {
            outgoing: Arc::clone(&self.outgoing),
            _alive: self._alive.clone(),
            shared: Arc::clone(&self.shared),
            inbox: self.inbox.clone(),
            request_timeout: self.request_timeout,
            _request: PhantomData,
        }
    }
}

type ReplySender<Rep> = oneshot::Sender<Result<Rep, WireError>>;

/// State shared by the callers and the driver task.
struct Shared<Rep> {
    calls: Mutex<Calls<Rep>>,
    /// One permit per call slot; closed when the connection is lost.
    slots: Semaphore,
    next_request_id: AtomicU64,
    inflight_requests_max: usize,
}

struct Calls<Rep> {
    /// Waiting calls by request id; never more than `inflight_requests_max` entries, since an
    /// entry is only inserted while its call holds a slot.
    waiting: HashMap<u64, ReplySender<Rep>>,
    /// Set once, when the connection ends; no call is registered afterwards.
    lost_reason: Option<String>,
}

impl<Req, Rep> RpcClient<Req, Rep>
where
    Req: Serialize,
    Rep: DeserializeOwned + Send + 'static,
{
    /// Takes ownership of a stream's halves and spawns the task that drives them.
    ///
    /// Must be called inside a tokio runtime. Errors: [`WireError::InvalidConfig`]. The task
    /// ends when the stream ends or the last clone is dropped.
    pub fn spawn<R, W>(reader: R, writer: W, config: RpcConfig) -> Result<Self, WireError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Self::start(writer, config, |shared| {
            let replies = async move {
                let mut reader = reader;
                read_replies(&mut reader, &shared).await
            };
            (replies, None)
        })
    }

    /// [`RpcClient::spawn`] over a Unix socket, whose replies a thread spinning for its
    /// reply may read itself ([`spinning`]).
    pub fn spawn_unix(
        stream: tokio::net::UnixStream,
        config: RpcConfig,
    ) -> Result<Self, WireError> {
        let (reader, writer) = stream.into_split();
        Self::start(writer, config, |shared| {
            let inbox = Arc::new(Inbox::new(reader, shared));
            let reading = Arc::clone(&inbox);
            let inbox: Arc<dyn ReadNow> = inbox;
            (async move { reading.drive().await }, Some(inbox))
        })
    }

    /// The client over `writer`, its driver task spawned: the writing half, and the
    /// replies `reading` makes (a future that reads them until the stream ends, and the
    /// inbox a spinning thread may read, if any) from the calls' shared state.
    fn start<W, F>(
        writer: W,
        config: RpcConfig,
        reading: impl FnOnce(Arc<Shared<Rep>>) -> (F, Option<Arc<dyn ReadNow>>),
    ) -> Result<Self, WireError>
    where
        W: AsyncWrite + Unpin + Send + 'static,
        F: std::future::Future<Output = String> + Send + 'static,
    {
        config.validate()?;
        let outgoing = Arc::new(Outgoing::new(writer, config.inflight_requests_max));
        let (alive, closing) = mpsc::channel(1);
        let shared = Arc::new(Shared {
            calls: Mutex::new(Calls {
                waiting: HashMap::with_capacity(config.inflight_requests_max),
                lost_reason: None,
            }),
            slots: Semaphore::new(config.inflight_requests_max),
            next_request_id: AtomicU64::new(1),
            inflight_requests_max: config.inflight_requests_max,
        });
        let (replies, inbox) = reading(Arc::clone(&shared));
        tokio::spawn(drive(
            replies,
            Arc::clone(&outgoing),
            closing,
            Arc::clone(&shared),
        ));
        Ok(RpcClient {
            outgoing,
            _alive: alive,
            shared,
            inbox,
            request_timeout: config.request_timeout,
            _request: PhantomData,
        })
    }

    /// Sends `request` and waits for its reply.
    ///
    /// Errors: [`WireError::Timeout`] when no reply came within the configured timeout (the
    /// request may have been applied), [`WireError::ConnectionLost`], [`WireError::Oversized`]
    /// or [`WireError::Encode`] (nothing sent), and [`WireError::Malformed`] or
    /// [`WireError::UnknownVersion`] when the reply to this request could not be decoded.
    /// Cancel-safe: dropping the future frees its slot; a late reply is discarded.
    pub async fn call(&self, request: Req) -> Result<Rep, WireError> {
        let timeout = self.request_timeout;
        match tokio::time::timeout(timeout, self.call_without_timeout(request)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(WireError::Timeout { timeout }),
        }
    }

    /// Gives the connection up: every waiting call, and every later one, fails at once
    /// with [`WireError::ConnectionLost`] and `reason` (the peer stopped answering; a reply
    /// that still comes is discarded). Calls that fail this way may have been applied.
    pub fn abandon(&self, reason: &str) {
        self.shared.fail_all(reason.to_string());
    }

    async fn call_without_timeout(&self, request: Req) -> Result<Rep, WireError> {
        let _slot = self
            .shared
            .slots
            .acquire()
            .await
            .map_err(|_closed| self.shared.lost_error())?;
        let request_id = self.shared.next_request_id.fetch_add(1, Ordering::Relaxed);
        let frame = encode_frame(request_id, &request)?;
        let (reply_sender, reply) = oneshot::channel();
        let _registration = self.shared.register(request_id, reply_sender)?;
        self.outgoing.send(frame).await?;
        if let Some(inbox) = &self.inbox {
            inbox::sent_from_here(inbox);
        }
        reply.await.map_err(|_closed| self.shared.lost_error())?
    }
}

impl<Rep> Shared<Rep> {
    fn lock(&self) -> MutexGuard<'_, Calls<Rep>> {
        // The lock is never held across a panic-prone call; recover the data regardless.
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lost_error(&self) -> WireError {
        let reason = self.lock().lost_reason.clone();
        WireError::ConnectionLost {
            reason: reason.unwrap_or_else(|| CLOSED_REASON.to_string()),
        }
    }

    /// Records a waiting call; the returned guard forgets it when the call ends in any way.
    fn register(
        &self,
        request_id: u64,
        reply_sender: ReplySender<Rep>,
    ) -> Result<Registration<'_, Rep>, WireError> {
        let mut calls = self.lock();
        if let Some(reason) = &calls.lost_reason {
            return Err(WireError::ConnectionLost {
                reason: reason.clone(),
            });
        }
        assert!(
            calls.waiting.len() < self.inflight_requests_max,
            "a call registered without a free slot"
        );
        let previous = calls.waiting.insert(request_id, reply_sender);
        assert!(previous.is_none(), "request id {request_id} reused");
        Ok(Registration {
            shared: self,
            request_id,
        })
    }

    /// Hands `result` to the call waiting on `request_id`, if it still waits.
    fn complete(&self, request_id: u64, result: Result<Rep, WireError>) {
        let waiting = self.lock().waiting.remove(&request_id);
        match waiting {
            // The caller may have given up between the lookup and the send; nothing to do.
            Some(reply_sender) => drop(reply_sender.send(result)),
            None => tracing::debug!(request_id, "reply for no waiting call dropped"),
        }
    }

    /// Fails every waiting call and every later one with `reason`.
    fn fail_all(&self, reason: String) {
        let waiting: Vec<ReplySender<Rep>> = {
            let mut calls = self.lock();
            calls.lost_reason = Some(reason.clone());
            calls.waiting.drain().map(|(_, sender)| sender).collect()
        };
        self.slots.close();
        for reply_sender in waiting {
            drop(reply_sender.send(Err(WireError::ConnectionLost {
                reason: reason.clone(),
            })));
        }
    }
}

/// Removes its call from the waiting map when dropped (reply, timeout, cancel or error).
struct Registration<'a, Rep> {
    shared: &'a Shared<Rep>,
    request_id: u64,
}

impl<Rep> Drop for Registration<'_, Rep> {
    fn drop(&mut self) {
        self.shared.lock().waiting.remove(&self.request_id);
    }
}

/// Runs both halves (`replies` reads them) until either ends, then fails whatever is
/// still waiting.
async fn drive<Rep>(
    replies: impl std::future::Future<Output = String>,
    outgoing: Arc<Outgoing>,
    mut closing: mpsc::Receiver<()>,
    shared: Arc<Shared<Rep>>,
) {
    // `recv` ends only when every client was dropped: nothing is ever sent on it.
    let every_client_dropped = async move { while closing.recv().await.is_some() {} };
    let reason = tokio::select! {
        reason = replies => reason,
        reason = outgoing.drive(every_client_dropped) => reason,
    };
    tracing::debug!(%reason, "rpc connection ended");
    outgoing.fail(&reason);
    shared.fail_all(reason);
}

/// Routes replies until the stream ends; returns why it ended.
async fn read_replies<R, Rep>(reader: &mut R, shared: &Shared<Rep>) -> String
where
    R: AsyncRead + Unpin,
    Rep: DeserializeOwned,
{
    loop {
        match read_frame::<_, Rep>(reader).await {
            Ok(Some((request_id, reply))) => shared.complete(request_id, Ok(reply)),
            Ok(None) => return CLOSED_REASON.to_string(),
            Err(error @ WireError::Malformed { request_id, .. })
            | Err(error @ WireError::UnknownVersion { request_id, .. }) => {
                shared.complete(request_id, Err(error));
            }
            Err(error) => return error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::write_frame;
    use tokio::net::UnixStream;

    /// A request asking the test server to reply with `value` after `after` later requests
    /// have been answered (so replies come back out of order).
    #[derive(Debug, Clone, Serialize, serde::Deserialize)]
    struct Delayed {
        value: u64,
    }

    /// How a test's client reads its replies.
    #[derive(Debug, Clone, Copy)]
    enum Via {
        /// [`RpcClient::spawn`] over the stream's halves (as a QUIC stream is driven).
        Halves,
        /// [`RpcClient::spawn_unix`]: its inbox, which spinning threads may read too.
        Unix,
    }

    fn client(
        via: Via,
        stream: UnixStream,
        inflight_requests_max: usize,
        request_timeout: Duration,
    ) -> RpcClient<Delayed, u64> {
        let config = RpcConfig {
            inflight_requests_max,
            request_timeout,
        };
        match via {
            Via::Halves => {
                let (reader, writer) = stream.into_split();
                RpcClient::spawn(reader, writer, config).unwrap()
            }
            Via::Unix => RpcClient::spawn_unix(stream, config).unwrap(),
        }
    }

    /// Runs `case` over both ways of reading replies.
    macro_rules! over_both {
        ($test:ident, $case:ident) => {
            #[tokio::test]
            async fn $test() {
                for via in [Via::Halves, Via::Unix] {
                    $case(via).await;
                }
            }
        };
    }

    over_both!(
        concurrent_calls_get_their_own_replies_out_of_order,
        concurrent_calls_get_their_own_replies_out_of_order_via
    );

    async fn concurrent_calls_get_their_own_replies_out_of_order_via(via: Via) {
        const CALLS: u64 = 200;
        const BATCH: usize = 50;
        let (client_stream, server_stream) = UnixStream::pair().unwrap();
        let rpc = client(via, client_stream, BATCH, Duration::from_secs(5));
        // The server collects a full batch, then answers it in reverse order.
        let server = tokio::spawn(async move {
            let (mut reader, mut writer) = server_stream.into_split();
            let mut batch = Vec::new();
            while let Some((request_id, request)) =
                read_frame::<_, Delayed>(&mut reader).await.unwrap()
            {
                batch.push((request_id, request.value * 10));
                if batch.len() == BATCH {
                    for (request_id, reply) in batch.drain(..).rev() {
                        write_frame(&mut writer, request_id, &reply).await.unwrap();
                    }
                }
            }
        });
        let calls: Vec<_> = (0..CALLS)
            .map(|value| {
                let rpc = rpc.clone();
                tokio::spawn(async move { (value, rpc.call(Delayed { value }).await) })
            })
            .collect();
        for call in calls {
            let (value, reply) = call.await.unwrap();
            assert_eq!(reply.unwrap(), value * 10);
        }
        drop(rpc);
        server.await.unwrap();
    }

    over_both!(
        a_call_without_reply_times_out_and_frees_its_slot,
        a_call_without_reply_times_out_and_frees_its_slot_via
    );

    async fn a_call_without_reply_times_out_and_frees_its_slot_via(via: Via) {
        let (client_stream, server_stream) = UnixStream::pair().unwrap();
        let rpc = client(via, client_stream, 1, Duration::from_millis(50));
        let (mut server_reader, mut server_writer) = server_stream.into_split();
        let first = rpc.call(Delayed { value: 1 }).await;
        assert!(matches!(first, Err(WireError::Timeout { .. })), "{first:?}");
        // The one slot is free again: a second call goes out and its reply is matched, while
        // the late reply to the first is discarded.
        let second = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call(Delayed { value: 2 }).await }
        });
        let (first_id, _) = read_frame::<_, Delayed>(&mut server_reader)
            .await
            .unwrap()
            .unwrap();
        let (second_id, _) = read_frame::<_, Delayed>(&mut server_reader)
            .await
            .unwrap()
            .unwrap();
        write_frame(&mut server_writer, first_id, &111u64)
            .await
            .unwrap();
        write_frame(&mut server_writer, second_id, &222u64)
            .await
            .unwrap();
        assert_eq!(second.await.unwrap().unwrap(), 222);
    }

    over_both!(
        peer_drop_fails_every_pending_call,
        peer_drop_fails_every_pending_call_via
    );

    async fn peer_drop_fails_every_pending_call_via(via: Via) {
        let (client_stream, server_stream) = UnixStream::pair().unwrap();
        let rpc = client(via, client_stream, 8, Duration::from_secs(5));
        let calls: Vec<_> = (0..8)
            .map(|value| {
                let rpc = rpc.clone();
                tokio::spawn(async move { rpc.call(Delayed { value }).await })
            })
            .collect();
        let (mut server_reader, server_writer) = server_stream.into_split();
        for _ in 0..8 {
            read_frame::<_, Delayed>(&mut server_reader)
                .await
                .unwrap()
                .unwrap();
        }
        drop(server_reader);
        drop(server_writer);
        for call in calls {
            let result = call.await.unwrap();
            assert!(
                matches!(result, Err(WireError::ConnectionLost { .. })),
                "{result:?}"
            );
        }
        let after = rpc.call(Delayed { value: 9 }).await;
        assert!(
            matches!(after, Err(WireError::ConnectionLost { .. })),
            "{after:?}"
        );
    }

    over_both!(
        an_abandoned_connection_fails_its_waiting_calls_at_once_and_every_later_one,
        an_abandoned_connection_fails_its_waiting_calls_at_once_and_every_later_one_via
    );

    async fn an_abandoned_connection_fails_its_waiting_calls_at_once_and_every_later_one_via(
        via: Via,
    ) {
        let (client_stream, server_stream) = UnixStream::pair().unwrap();
        // Timeouts far longer than the test: only the abandon can end these calls.
        let rpc = client(via, client_stream, 8, Duration::from_secs(3600));
        let calls: Vec<_> = (0..4)
            .map(|value| {
                let rpc = rpc.clone();
                tokio::spawn(async move { rpc.call(Delayed { value }).await })
            })
            .collect();
        let (mut server_reader, mut server_writer) = server_stream.into_split();
        let mut sent = Vec::new();
        for _ in 0..4 {
            let (request_id, _) = read_frame::<_, Delayed>(&mut server_reader)
                .await
                .unwrap()
                .unwrap();
            sent.push(request_id);
        }
        rpc.abandon("the peer stopped answering");
        for call in calls {
            let result = call.await.unwrap();
            assert!(
                matches!(&result, Err(WireError::ConnectionLost { reason }) if reason.contains("stopped answering")),
                "{result:?}"
            );
        }
        // A reply that still comes is discarded, and nothing more is sent.
        write_frame(&mut server_writer, sent[0], &7u64)
            .await
            .unwrap();
        let after = rpc.call(Delayed { value: 9 }).await;
        assert!(
            matches!(after, Err(WireError::ConnectionLost { .. })),
            "{after:?}"
        );
    }

    over_both!(
        an_undecodable_reply_fails_only_its_call,
        an_undecodable_reply_fails_only_its_call_via
    );

    async fn an_undecodable_reply_fails_only_its_call_via(via: Via) {
        let (client_stream, server_stream) = UnixStream::pair().unwrap();
        let rpc = client(via, client_stream, 4, Duration::from_secs(5));
        let (mut server_reader, mut server_writer) = server_stream.into_split();
        let first = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call(Delayed { value: 1 }).await }
        });
        let (first_id, _) = read_frame::<_, Delayed>(&mut server_reader)
            .await
            .unwrap()
            .unwrap();
        // A string where a u64 is expected: its length decodes as a u64, the rest trails.
        write_frame(&mut server_writer, first_id, &"not a number")
            .await
            .unwrap();
        let result = first.await.unwrap();
        assert!(
            matches!(result, Err(WireError::Malformed { .. })),
            "{result:?}"
        );
        let second = tokio::spawn({
            let rpc = rpc.clone();
            async move { rpc.call(Delayed { value: 2 }).await }
        });
        let (second_id, _) = read_frame::<_, Delayed>(&mut server_reader)
            .await
            .unwrap()
            .unwrap();
        write_frame(&mut server_writer, second_id, &5u64)
            .await
            .unwrap();
        assert_eq!(second.await.unwrap().unwrap(), 5);
    }

    /// A request too large for the stream's buffer, so callers leave most of it queued.
    #[derive(Debug, Clone, Serialize, serde::Deserialize)]
    struct Padded {
        value: u64,
        padding: Vec<u8>,
    }

    #[tokio::test]
    async fn frames_the_stream_cannot_take_at_once_go_out_whole_and_in_order() {
        const CALLS: u64 = 64;
        // A 512-byte pipe: every 4 KiB frame is written in pieces, by the caller and then
        // by the driver, while other calls queue behind it and some are dropped.
        let (client_stream, server_stream) = tokio::io::duplex(512);
        let (reader, writer) = tokio::io::split(client_stream);
        let config = RpcConfig {
            inflight_requests_max: 8,
            request_timeout: Duration::from_secs(5),
        };
        let rpc = RpcClient::<Padded, u64>::spawn(reader, writer, config).unwrap();
        let server = tokio::spawn(async move {
            let (mut reader, mut writer) = tokio::io::split(server_stream);
            let mut served = 0u64;
            while let Some((request_id, request)) =
                read_frame::<_, Padded>(&mut reader).await.unwrap()
            {
                assert!(request
                    .padding
                    .iter()
                    .all(|byte| *byte == request.value as u8));
                write_frame(&mut writer, request_id, &(request.value * 10))
                    .await
                    .unwrap();
                served += 1;
            }
            served
        });
        let calls: Vec<_> = (0..CALLS)
            .map(|value| {
                let rpc = rpc.clone();
                tokio::spawn(async move {
                    let request = Padded {
                        value,
                        padding: vec![value as u8; 4096],
                    };
                    (value, rpc.call(request).await)
                })
            })
            .collect();
        // Dropping calls at any point must never leave half a frame on the stream.
        for call in calls.iter().skip(1).step_by(3) {
            call.abort();
        }
        let mut answered = 0;
        for call in calls {
            if let Ok((value, reply)) = call.await {
                assert_eq!(reply.unwrap(), value * 10);
                answered += 1;
            }
        }
        assert!(answered >= CALLS as usize * 2 / 3, "{answered} answered");
        drop(rpc);
        let served = server.await.unwrap();
        assert!(
            served >= answered as u64,
            "{served} served, {answered} answered"
        );
    }

    #[tokio::test]
    async fn invalid_configurations_are_refused() {
        for config in [
            RpcConfig {
                inflight_requests_max: 0,
                ..RpcConfig::default()
            },
            RpcConfig {
                inflight_requests_max: RPC_INFLIGHT_REQUESTS_LIMIT + 1,
                ..RpcConfig::default()
            },
            RpcConfig {
                request_timeout: Duration::ZERO,
                ..RpcConfig::default()
            },
        ] {
            let (stream, _peer) = UnixStream::pair().unwrap();
            let (reader, writer) = stream.into_split();
            let result = RpcClient::<Delayed, u64>::spawn(reader, writer, config);
            assert!(matches!(result, Err(WireError::InvalidConfig { .. })));
        }
    }
}
