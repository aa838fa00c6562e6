//! Replication over the network, the node's side: the two halves of a copy the directory
//! planned from a node's private CPU pool into another node's CPU pool
//! (`TaskKind::Push` on the source's owner, `TaskKind::Receive` on the requester), over
//! the peer endpoint ([`super::peer`]).
//!
//! The receive task only records the expected transfer (the stream does the work, see
//! [`super::peer`]). The push task starts a bounded sender: at most [`PUSHES_MAX`] streams
//! at once and [`PUSHES_QUEUED_MAX`] waiting, each reading its source from the pool one
//! [`super::peer::TRANSFER_CHUNK_BYTES`] chunk at a time (so at most
//! `PUSHES_MAX x 256 KiB` of read buffers plus the connection's send window in flight),
//! then checking the source's generation before finishing the stream, as a demotion does:
//! a source reclaimed mid-copy resets the stream and the receiver commits nothing. A node
//! without a peer endpoint neither pushes nor receives: its receive aborts the target at
//! once, so the directory frees the reservation.

use super::pool::{Check, ReadAt};
use super::services::NodeServices;
use crate::model::{
    Location, NodeId, ObjectId, PoolId, ReplicaId, SessionId, TaskId, TransferToken,
};
use crate::node::pushes::{PushSet, PushStart, PUSHES_QUEUED_MAX};
use crate::node::transfers::{ExpectedTransfer, EXPECTED_TRANSFER_TIMEOUT};
use crate::wire::peer::{self as wire, TransferHeader, Verdict};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pushes streaming at once: 4, enough to keep a connection's window full with 4 MiB
/// objects (the transfer benchmark's concurrency) without starving the node's other work.
pub const PUSHES_MAX: usize = 4;
/// How long a sender keeps asking a receiver that does not expect the transfer yet (it
/// fetches its half of the task on its own timer, every 50 ms): 5 s.
pub const RECEIVER_WAIT: Duration = Duration::from_secs(5);
/// The pause between two such asks.
pub const RECEIVER_RETRY_INTERVAL: Duration = Duration::from_millis(20);

const _: () = assert!(PUSHES_MAX <= PUSHES_QUEUED_MAX);

/// The sender's books ([`PushSet`]: the targets being pushed) and the streaming slots.
pub struct Pushes {
    running: Mutex<PushSet>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl Default for Pushes {
    fn default() -> Self {
        Pushes {
            running: Mutex::default(),
            slots: Arc::new(tokio::sync::Semaphore::new(PUSHES_MAX)),
        }
    }
}

impl Pushes {
    fn set(&self) -> std::sync::MutexGuard<'_, PushSet> {
        match self.running.lock() {
            Ok(running) => running,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    fn start(&self, target: ReplicaId) -> PushStart {
        self.set().start(target)
    }

    fn done(&self, target: ReplicaId) {
        self.set().done(target);
    }
}

/// What one push sends.
#[derive(Clone, Copy, Debug)]
pub struct PushTask {
    pub task: TaskId,
    pub source: Location,
    pub target: ReplicaId,
    pub token: TransferToken,
    pub length_bytes: u64,
    pub to: NodeId,
}

/// The source's half: starts streaming the replica at `source` to node `to` for `target`
/// in the background and returns at once, so the node's task loop never waits on a copy.
pub fn push(services: &NodeServices, push: PushTask) {
    let Some(transport) = services.peer.clone() else {
        tracing::warn!(?push, "no peer endpoint on this node: push dropped");
        return;
    };
    if push.length_bytes != push.source.length_bytes {
        tracing::warn!(
            ?push,
            "the push's length differs from its source's: dropped"
        );
        transport.metrics.transfer("sent", "dropped", 0);
        return;
    }
    match transport.pushes.start(push.target) {
        PushStart::Started => {}
        PushStart::Running => return,
        PushStart::Full => {
            transport.metrics.transfer("sent", "dropped", 0);
            return;
        }
    }
    let services = services.clone();
    actix_rt::spawn(async move {
        let slot = transport.pushes.slots.clone().acquire_owned().await;
        let outcome = match slot {
            Ok(_slot) => send(&services, &transport, push).await,
            Err(_) => Err("the push slots closed".to_string()),
        };
        transport.pushes.done(push.target);
        match outcome {
            Ok(()) => transport
                .metrics
                .transfer("sent", "committed", push.length_bytes),
            Err(reason) => {
                tracing::info!(%reason, ?push, "peer push failed");
                transport.metrics.transfer("sent", "failed", 0);
            }
        }
    });
}

/// Sends one push: asks the receiver until it expects the transfer (within
/// [`RECEIVER_WAIT`]), streams the source, and returns the receiver's final verdict.
async fn send(
    services: &NodeServices,
    transport: &super::peer::PeerTransport,
    push: PushTask,
) -> Result<(), String> {
    let header = TransferHeader {
        task: push.task.0,
        target_replica: push.target.0,
        token: push.token.0,
        length_bytes: push.length_bytes,
    };
    let deadline = Instant::now() + RECEIVER_WAIT;
    let (mut send, mut receive) = loop {
        let connection = transport
            .connection(services, push.to)
            .await
            .map_err(|error| format!("connecting: {error:#}"))?;
        let (mut send, mut receive) = connection
            .open_bi()
            .await
            .map_err(|error| format!("opening a stream: {error}"))?;
        send.write_all(&header.encode())
            .await
            .map_err(|error| format!("writing the header: {error}"))?;
        let verdict = wire::read_verdict(&mut receive)
            .await
            .map_err(|error| format!("reading the verdict: {error}"))?;
        match verdict {
            Verdict::Accepted => break (send, receive),
            Verdict::NotExpected | Verdict::Busy if Instant::now() < deadline => {
                tokio::time::sleep(RECEIVER_RETRY_INTERVAL).await;
            }
            refused => return Err(format!("the receiver answered {refused:?}")),
        }
    };
    if let Err(reason) = stream_source(services, push.source, &mut send).await {
        let _ = send.reset(1u32.into());
        return Err(reason);
    }
    send.finish()
        .map_err(|error| format!("finishing: {error}"))?;
    match wire::read_verdict(&mut receive).await {
        Ok(Verdict::Committed) => Ok(()),
        Ok(verdict) => Err(format!("the receiver answered {verdict:?}")),
        Err(error) => Err(format!("reading the final verdict: {error}")),
    }
}

/// Writes the source's bytes to `send`, chunk by chunk, then checks the source is still
/// live at its generation (no chunk came from reused pages).
async fn stream_source(
    services: &NodeServices,
    source: Location,
    send: &mut quinn::SendStream,
) -> Result<(), String> {
    let pool = services
        .pools
        .get(&source.pool)
        .ok_or("the source pool is not this node's")?;
    let failed = |what: &str, error: &dyn std::fmt::Display| format!("{what} failed: {error}");
    let mut buffer = Vec::new();
    let mut done = 0;
    while done < source.length_bytes {
        let chunk = (source.length_bytes - done).min(super::peer::TRANSFER_CHUNK_BYTES as u64);
        buffer.resize(chunk as usize, 0);
        buffer = pool
            .send(ReadAt {
                offset_bytes: source.offset_bytes + done,
                buffer,
            })
            .await
            .map_err(|error| failed("reading the source", &error))?
            .map_err(|error| failed("reading the source", &error))?;
        send.write_all(&buffer)
            .await
            .map_err(|error| failed("sending", &error))?;
        done += chunk;
    }
    pool.send(Check { location: source })
        .await
        .map_err(|error| failed("checking the source", &error))?
        .map_err(|error| failed("checking the source", &error))
}

/// What one receive expects.
#[derive(Clone, Copy, Debug)]
pub struct ReceiveTask {
    pub task: TaskId,
    pub object: ObjectId,
    pub target: ReplicaId,
    pub token: TransferToken,
    pub target_pool: PoolId,
    pub length_bytes: u64,
    pub from: NodeId,
}

/// The requester's half: records that node `from` may send `target` (the stream is served
/// by [`super::peer`]). Without a peer endpoint here or there, or with the table full, it
/// aborts the target at once, so the directory frees the reservation.
pub async fn receive(services: &NodeServices, session: SessionId, receive: ReceiveTask) {
    let transport = services.peer.clone();
    let sender = match &transport {
        Some(transport) => match transport.peer(services, receive.from).await {
            Ok(peer) if peer.address.is_some() => Ok(peer.name),
            Ok(_) => Err("the sender has no peer endpoint".to_string()),
            Err(reason) => Err(reason),
        },
        None => Err("this node has no peer endpoint".to_string()),
    };
    let (Some(transport), Ok(from)) = (transport, sender.as_ref()) else {
        tracing::warn!(
            ?receive,
            ?sender,
            "no peer path for a replication: aborting its target"
        );
        services.link.abort(session, receive.target).await;
        return;
    };
    transport.abort_lapsed(services).await;
    let expected = ExpectedTransfer {
        task: receive.task,
        object: receive.object,
        session,
        target: receive.target,
        token: receive.token,
        target_pool: receive.target_pool,
        from: from.clone(),
        length_bytes: receive.length_bytes,
        deadline: services.clock.now() + EXPECTED_TRANSFER_TIMEOUT,
    };
    let recorded = transport.expected().expect(expected);
    if let Err(refusal) = recorded {
        transport.metrics.refuse(refusal.reason());
        services.link.abort(session, receive.target).await;
    }
}
