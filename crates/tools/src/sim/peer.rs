//! Network replication between simulated nodes, with the node core's books on both ends:
//! the sender's `node::pushes::PushSet` (one push per target, bounded) and the receiver's
//! `node::transfers::ExpectedTransfers` (a stream is written only when the directory named
//! its sender, its token and its length, once). A stream crosses the faulty network as one
//! message (it may be lost, copied or delayed; a copy arriving twice finds its entry
//! consumed); the receiver answers a verdict, and a sender told the transfer is not expected
//! yet asks again every 20 ms until its 5 s are up, as `actors::node::replication` does. A
//! stream or verdict that is lost is asked again after [`VERDICT_WAIT`].

use super::network::Payload;
use super::node::Purpose;
use super::world::World;
use kvtier_core::directory::TaskKind;
use kvtier_core::model::{Location, ObjectId, ReplicaId, TaskId, Timestamp, TransferToken};
use kvtier_core::node::pushes::PushStart;
use kvtier_core::node::transfers::{
    ExpectedTransfer, RefusalKind, TransferClaim, EXPECTED_TRANSFER_TIMEOUT,
};
use kvtier_core::protocol::messages::DirectoryRequest;
use std::time::Duration;

/// How long a sender keeps asking a receiver that does not expect the transfer yet, and
/// the pause between two asks (`actors::node::replication`'s `RECEIVER_WAIT` and
/// `RECEIVER_RETRY_INTERVAL`).
const RECEIVER_WAIT: Duration = Duration::from_secs(5);
const RECEIVER_RETRY: Duration = Duration::from_millis(20);
/// How long a sender waits for a verdict before it sends the stream again (a lost stream
/// or verdict: QUIC would retransmit).
const VERDICT_WAIT: Duration = Duration::from_millis(200);

/// What travels between two nodes' peer endpoints.
#[derive(Clone, Debug)]
pub enum PeerMessage {
    /// A push's stream: its header, from node `from`, and the bytes of the object the
    /// source held when they were read.
    Stream {
        from: usize,
        target: ReplicaId,
        token: TransferToken,
        length_bytes: u64,
        bytes_of: ObjectId,
    },
    /// The receiver's answer to the stream for `target`.
    Verdict {
        target: ReplicaId,
        verdict: PeerVerdict,
    },
}

/// A receiver's answer to a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerVerdict {
    /// Written, and its commit sent.
    Committed,
    /// Not expected (yet), or the receiver is full: ask again.
    Retry,
    /// Refused for good.
    Refused,
}

/// A push under way on the sender.
#[derive(Clone, Debug)]
pub struct PushStream {
    source: Location,
    token: TransferToken,
    length_bytes: u64,
    to: usize,
    give_up_at: Timestamp,
    /// When the stream is sent (again).
    send_at: Timestamp,
}

impl World {
    /// The node whose directory id is `id`, by index.
    fn node_of(&self, id: kvtier_core::model::NodeId) -> Option<usize> {
        self.nodes.iter().position(|node| node.node_id == Some(id))
    }

    /// The source's half of a network replication: a push starts (unless one runs for
    /// the target, or the node's pushes are full).
    pub(super) fn push(&mut self, node: usize, kind: TaskKind) {
        let TaskKind::Push {
            source,
            target,
            token,
            length_bytes,
            to,
        } = kind
        else {
            return;
        };
        let Some(to) = self.node_of(to) else {
            return;
        };
        if length_bytes != source.length_bytes {
            return;
        }
        if self.nodes[node].pushes.start(target) != PushStart::Started {
            return;
        }
        let stream = PushStream {
            source,
            token,
            length_bytes,
            to,
            give_up_at: self.now + RECEIVER_WAIT,
            send_at: self.now,
        };
        self.nodes[node].push_streams.insert(target, stream);
        self.send_stream(node, target);
    }

    /// Sends the stream of the push for `target`: the source's bytes as they are now,
    /// when the node still holds the source (else the push ends).
    fn send_stream(&mut self, node: usize, target: ReplicaId) {
        let Some(stream) = self.nodes[node].push_streams.get(&target).cloned() else {
            return;
        };
        let held = self.nodes[node].core.holdings.object_at(&stream.source);
        let bytes_of = self
            .spaces
            .get(&stream.source.pool)
            .and_then(|space| self.memory.get(&(*space, stream.source.offset_bytes)))
            .copied();
        let (Some(_), Some(bytes_of)) = (held, bytes_of) else {
            return self.push_ended(node, target);
        };
        if let Some(pushing) = self.nodes[node].push_streams.get_mut(&target) {
            pushing.send_at = self.now + VERDICT_WAIT;
        }
        let message = PeerMessage::Stream {
            from: node,
            target,
            token: stream.token,
            length_bytes: stream.length_bytes,
            bytes_of,
        };
        let connection = self.nodes[stream.to].connection;
        let payload = Payload::Peer(message);
        self.network
            .send(&mut self.rng, self.now, stream.to, connection, 0, payload);
    }

    fn push_ended(&mut self, node: usize, target: ReplicaId) {
        self.nodes[node].push_streams.remove(&target);
        self.nodes[node].pushes.done(target);
    }

    /// Pushes of node `node` due to be sent again, or past their time.
    pub(super) fn push_timeouts(&mut self, node: usize) {
        let now = self.now;
        let due: Vec<(ReplicaId, bool)> = self.nodes[node]
            .push_streams
            .iter()
            .filter(|(_, stream)| stream.send_at <= now || stream.give_up_at <= now)
            .map(|(target, stream)| (*target, stream.give_up_at <= now))
            .collect();
        for (target, gave_up) in due {
            if gave_up {
                self.push_ended(node, target);
            } else {
                self.send_stream(node, target);
            }
        }
    }

    /// The requester's half: node `node` expects the stream for the task's target from
    /// the node the directory named, or aborts the target.
    pub(super) fn expect_transfer(&mut self, node: usize, task: TaskId, kind: TaskKind) {
        let TaskKind::Receive {
            object,
            target,
            token,
            target_pool,
            length_bytes,
            from,
        } = kind
        else {
            return;
        };
        let (Some(from), Some(session)) = (self.node_of(from), self.nodes[node].session) else {
            return self.send(
                node,
                DirectoryRequest::Abort { replica: target },
                Purpose::Plain,
            );
        };
        let expected = ExpectedTransfer {
            task,
            object,
            session,
            target,
            token,
            target_pool,
            from: self.nodes[from].name.clone(),
            length_bytes,
            deadline: self.now + EXPECTED_TRANSFER_TIMEOUT,
        };
        if self.nodes[node].transfers.expect(expected).is_err() {
            self.send(
                node,
                DirectoryRequest::Abort { replica: target },
                Purpose::Plain,
            );
        }
    }

    /// Expected transfers of node `node` past their deadline: their targets are aborted.
    pub(super) fn expire_transfers(&mut self, node: usize) {
        let now = self.now;
        for lapsed in self.nodes[node].transfers.expire(now) {
            let request = DirectoryRequest::Abort {
                replica: lapsed.target,
            };
            self.send(node, request, Purpose::Plain);
        }
    }

    /// A message between peer endpoints reached node `node`.
    pub(super) fn on_peer(&mut self, node: usize, message: PeerMessage) {
        match message {
            PeerMessage::Stream {
                from,
                target,
                token,
                length_bytes,
                bytes_of,
            } => {
                let verdict =
                    self.receive_stream(node, from, target, token, length_bytes, bytes_of);
                let connection = self.nodes[from].connection;
                let payload = Payload::Peer(PeerMessage::Verdict { target, verdict });
                self.network
                    .send(&mut self.rng, self.now, from, connection, 0, payload);
            }
            PeerMessage::Verdict { target, verdict } => {
                let now = self.now;
                let Some(stream) = self.nodes[node].push_streams.get_mut(&target) else {
                    return;
                };
                if verdict == PeerVerdict::Retry && now < stream.give_up_at {
                    stream.send_at = now + RECEIVER_RETRY;
                } else {
                    self.push_ended(node, target);
                }
            }
        }
    }

    /// Node `node` receives a stream from node `from`: written and committed when it
    /// claims an expected transfer exactly, refused otherwise.
    fn receive_stream(
        &mut self,
        node: usize,
        from: usize,
        target: ReplicaId,
        token: TransferToken,
        length_bytes: u64,
        bytes_of: ObjectId,
    ) -> PeerVerdict {
        let sender = self.nodes[from].name.clone();
        let claim = TransferClaim {
            sender: &sender,
            target,
            token,
            length_bytes,
        };
        let now = self.now;
        let expected = match self.nodes[node].transfers.claim(claim, now) {
            Ok(expected) => expected,
            Err(refusal) => {
                return match refusal.verdict_kind() {
                    RefusalKind::NotExpected | RefusalKind::Busy => PeerVerdict::Retry,
                    RefusalKind::Refused => PeerVerdict::Refused,
                }
            }
        };
        let abort = DirectoryRequest::Abort { replica: target };
        let Some((location, space)) = self.allocate(node, expected.target_pool) else {
            self.nodes[node].transfers.finished(target);
            self.send(node, abort, Purpose::Plain);
            return PeerVerdict::Refused;
        };
        self.write(space, location.offset_bytes, bytes_of);
        let Some(operation) = self.operation(node) else {
            self.nodes[node].transfers.finished(target);
            self.free(node, location).ok();
            self.send(node, abort, Purpose::Plain);
            return PeerVerdict::Refused;
        };
        self.stats.covered.replications += 1;
        self.stats.covered.transfers_received += 1;
        self.send_commit(node, operation, expected.object, target, location, None);
        PeerVerdict::Committed
    }
}
