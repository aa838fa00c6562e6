//! The `SessionActor`: one per node connection to the directory. It decodes frames,
//! negotiates the protocol, binds the connection to a session at `Open` (or `Resume`),
//! forwards requests to the directory actor and writes the replies (an `AwaitTasks` after
//! the directory says the session has a task, or after its wait). A frame it cannot
//! decode gets a typed error reply; a frame that breaks the stream closes the connection
//! with a reason, and every other connection keeps being served.

use super::actor::{Call, DirectoryActor, WatchTasks};
use crate::actors::frames::{
    frame_stream, incoming, spawn_writer, Incoming, INFLIGHT_REQUESTS_MAX,
};
use crate::model::SessionId;
use crate::protocol::messages::{
    DirectoryReply, DirectoryRequest, Hello, ProtocolError, AWAIT_TASKS_WAIT_MS_MAX,
    SUPPORTED_VERSIONS,
};
use crate::wire::admission::ConnectionSlot;
use crate::wire::{RawFrame, WireError};
use actix::prelude::*;
use std::time::Duration;
use tokio::sync::mpsc;

/// Close code sent when the peer broke the framing.
const CLOSE_PROTOCOL_ERROR: u32 = 1;

/// Where a connection is in its handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    AwaitingHello,
    Ready,
}

/// One node connection. See the module documentation.
pub struct SessionActor {
    directory: Addr<DirectoryActor>,
    connection: quinn::Connection,
    /// The connection's place among its peer's: given back when the actor stops.
    _slot: ConnectionSlot,
    peer: String,
    replies: mpsc::Sender<(u64, DirectoryReply)>,
    receiver: Option<quinn::RecvStream>,
    phase: Phase,
    session: Option<SessionId>,
    /// An `Open` or `Resume` is in flight: a second one is refused until it is answered.
    binding: bool,
    inflight: usize,
}

impl SessionActor {
    /// A session actor for an accepted connection whose certificate names `peer`.
    pub fn new(
        directory: Addr<DirectoryActor>,
        connection: quinn::Connection,
        slot: ConnectionSlot,
        peer: String,
        streams: (quinn::SendStream, quinn::RecvStream),
    ) -> SessionActor {
        let (sender, receiver) = streams;
        SessionActor {
            directory,
            connection,
            _slot: slot,
            peer,
            replies: spawn_writer(sender, |error| {
                DirectoryReply::Error(ProtocolError::Malformed(error))
            }),
            receiver: Some(receiver),
            phase: Phase::AwaitingHello,
            session: None,
            binding: false,
            inflight: 0,
        }
    }

    fn reply(&mut self, request_id: u64, reply: DirectoryReply, context: &mut Context<Self>) {
        if self.replies.try_send((request_id, reply)).is_err() {
            tracing::warn!(peer = %self.peer, "reply queue full or closed; closing the connection");
            context.stop();
        }
    }

    fn hello(&mut self, request_id: u64, peer_hello: &Hello, context: &mut Context<Self>) {
        match Hello::ours().negotiate(peer_hello) {
            Some(agreed) => {
                self.phase = Phase::Ready;
                self.reply(request_id, DirectoryReply::Hello(agreed), context);
            }
            None => {
                let error = ProtocolError::UnsupportedVersion {
                    supported: SUPPORTED_VERSIONS.to_vec(),
                };
                self.reply(request_id, DirectoryReply::Error(error), context);
                context.stop();
            }
        }
    }

    fn forward(&mut self, request_id: u64, request: DirectoryRequest, context: &mut Context<Self>) {
        if self.inflight >= INFLIGHT_REQUESTS_MAX {
            self.reply(
                request_id,
                DirectoryReply::Error(ProtocolError::Busy),
                context,
            );
            return;
        }
        let binds = matches!(
            request,
            DirectoryRequest::Open { .. } | DirectoryRequest::Resume { .. }
        );
        if binds {
            if self.binding || self.session.is_some() {
                let error =
                    ProtocolError::Sequence("the connection is already bound to a session".into());
                return self.reply(request_id, DirectoryReply::Error(error), context);
            }
            self.binding = true;
        }
        self.inflight += 1;
        let call = Call {
            peer: self.peer.clone(),
            session: self.session,
            request,
        };
        self.directory
            .send(call)
            .into_actor(self)
            .map(move |result, actor, context| {
                actor.inflight -= 1;
                if binds {
                    actor.binding = false;
                }
                let reply = result.unwrap_or(DirectoryReply::Error(ProtocolError::Busy));
                match &reply {
                    DirectoryReply::Opened(opened) => actor.session = Some(opened.session),
                    DirectoryReply::Resumed(session) => actor.session = Some(*session),
                    _ => {}
                }
                actor.reply(request_id, reply, context);
            })
            .spawn(context);
    }
}

impl SessionActor {
    /// Answers an `AwaitTasks` as a poll once the directory says the session has a task
    /// ([`WatchTasks`]) or after `wait_ms` (capped), holding one in-flight slot meanwhile.
    fn await_tasks(
        &mut self,
        request_id: u64,
        max: u32,
        wait_ms: u32,
        context: &mut Context<Self>,
    ) {
        let poll = DirectoryRequest::PollTasks { max };
        let Some(session) = self
            .session
            .filter(|_| self.inflight < INFLIGHT_REQUESTS_MAX)
        else {
            // Unbound (refused as a poll is) or busy: answered at once.
            return self.forward(request_id, poll, context);
        };
        self.inflight += 1;
        let wait = Duration::from_millis(u64::from(wait_ms.min(AWAIT_TASKS_WAIT_MS_MAX)));
        let watch = self.directory.send(WatchTasks { session });
        async move {
            if let Ok(woken) = watch.await {
                let _ = tokio::time::timeout(wait, woken).await;
            }
        }
        .into_actor(self)
        .map(move |(), actor, context| {
            actor.inflight -= 1;
            actor.forward(request_id, poll, context);
        })
        .spawn(context);
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        if let Some(receiver) = self.receiver.take() {
            context.add_stream(frame_stream(receiver));
        }
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        tracing::debug!(peer = %self.peer, session = ?self.session, "node connection ended");
    }
}

impl StreamHandler<Result<RawFrame, WireError>> for SessionActor {
    fn handle(&mut self, frame: Result<RawFrame, WireError>, context: &mut Context<Self>) {
        let (request_id, request) = match incoming::<DirectoryRequest>(frame) {
            Incoming::Request(request_id, request) => (request_id, request),
            Incoming::Refuse(request_id, error) => {
                return self.reply(request_id, DirectoryReply::Error(error), context)
            }
            // A connection the node closed (a normal stop) ends its stream too: only a
            // stream broken on a connection still up broke the framing.
            Incoming::Close(error) => {
                match self.connection.close_reason() {
                    Some(reason) => {
                        tracing::info!(peer = %self.peer, %reason, "node connection closed")
                    }
                    None => {
                        tracing::warn!(peer = %self.peer, %error, "closing a connection that broke the framing");
                        self.connection.close(
                            quinn::VarInt::from_u32(CLOSE_PROTOCOL_ERROR),
                            error.to_string().as_bytes(),
                        );
                    }
                }
                return context.stop();
            }
        };
        match (self.phase, request) {
            (Phase::AwaitingHello, DirectoryRequest::Hello(hello)) => {
                self.hello(request_id, &hello, context)
            }
            (Phase::AwaitingHello, _) => {
                let error = ProtocolError::Sequence("the first frame must be hello".into());
                self.reply(request_id, DirectoryReply::Error(error), context);
            }
            // Answered here, never by the directory actor: the cheapest round trip the
            // stack can make, which `bench directory` measures as its floor.
            (Phase::Ready, DirectoryRequest::Hello(_)) => {
                let error = ProtocolError::Sequence("hello sent twice".into());
                self.reply(request_id, DirectoryReply::Error(error), context);
            }
            (Phase::Ready, DirectoryRequest::AwaitTasks { max, wait_ms }) => {
                self.await_tasks(request_id, max, wait_ms, context)
            }
            (Phase::Ready, request) => self.forward(request_id, request, context),
        }
    }

    fn finished(&mut self, context: &mut Context<Self>) {
        context.stop();
    }
}
