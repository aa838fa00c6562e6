//! The simulated network between the nodes and the directory, and between the nodes'
//! peer endpoints: every message may be
//! dropped, duplicated, delayed and so reordered, as the seed decides, and a node may be
//! cut off from the directory for a while (every message between it and the directory
//! lost). Bounded: a
//! message sent while [`IN_FLIGHT_MAX`] are in flight is dropped, as a full socket buffer
//! would.

use kvtier_core::model::Timestamp;
use kvtier_core::protocol::messages::{DirectoryReply, DirectoryRequest};
use kvtier_core::rng::SplitMix64;
use std::time::Duration;

/// Messages in flight at once.
pub const IN_FLIGHT_MAX: usize = 4096;

/// How the network misbehaves, in percent of messages and milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    pub drop_percent: u64,
    pub duplicate_percent: u64,
    pub delay_ms_max: u64,
}

/// What travels: a node's request to the directory, the directory's reply, or a message
/// between two nodes' peer endpoints (to node `node`).
#[derive(Clone, Debug)]
pub enum Payload {
    Request(DirectoryRequest),
    Reply(DirectoryReply),
    Peer(super::peer::PeerMessage),
}

impl Payload {
    /// Whether it travels between nodes (a node cut off from the directory still reaches
    /// its peers, and a directory's death breaks none of their connections).
    fn between_nodes(&self) -> bool {
        matches!(self, Payload::Peer(_))
    }
}

/// One message of node `node`'s connection number `connection` (a restarted or rejoined
/// node never receives what was meant for its previous process or session).
#[derive(Clone, Debug)]
pub struct Message {
    pub node: usize,
    pub connection: u64,
    pub request_id: u64,
    pub payload: Payload,
    deliver_at: Timestamp,
    order: u64,
}

/// The messages in flight. See the module documentation.
#[derive(Debug)]
pub struct Network {
    faults: Faults,
    in_flight: Vec<Message>,
    order: u64,
    /// Until when each node is cut off (by node index; empty: none ever was).
    cut_off_until: Vec<Timestamp>,
}

impl Network {
    /// An empty network with `faults`.
    pub fn new(faults: Faults) -> Network {
        Network {
            faults,
            in_flight: Vec::new(),
            order: 0,
            cut_off_until: Vec::new(),
        }
    }

    /// Cuts node `node` off from the directory until `until`.
    pub fn cut_off(&mut self, node: usize, until: Timestamp) {
        if self.cut_off_until.len() <= node {
            self.cut_off_until.resize(node + 1, Timestamp::ZERO);
        }
        self.cut_off_until[node] = until;
    }

    fn is_cut_off(&self, node: usize, now: Timestamp) -> bool {
        self.cut_off_until
            .get(node)
            .is_some_and(|until| now < *until)
    }

    /// Sends a message at `now`; the network may lose, copy or delay it.
    pub fn send(
        &mut self,
        rng: &mut SplitMix64,
        now: Timestamp,
        node: usize,
        connection: u64,
        request_id: u64,
        payload: Payload,
    ) {
        let cut_off = !payload.between_nodes() && self.is_cut_off(node, now);
        if rng.chance(self.faults.drop_percent) || cut_off {
            return;
        }
        let copies = if rng.chance(self.faults.duplicate_percent) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.in_flight.len() >= IN_FLIGHT_MAX {
                return;
            }
            let delay = Duration::from_millis(rng.below(self.faults.delay_ms_max + 1));
            self.order += 1;
            self.in_flight.push(Message {
                node,
                connection,
                request_id,
                payload: payload.clone(),
                deliver_at: now + delay,
                order: self.order,
            });
        }
    }

    /// Takes every message due at `now`, in delivery order.
    pub fn due(&mut self, now: Timestamp) -> Vec<Message> {
        let (mut due, later): (Vec<Message>, Vec<Message>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|message| message.deliver_at <= now);
        self.in_flight = later;
        due.retain(|message| {
            message.payload.between_nodes() || !self.is_cut_off(message.node, now)
        });
        due.sort_by_key(|message| (message.deliver_at, message.order));
        due
    }

    /// Every connection to the directory breaks (its process died): what was in flight on
    /// them is lost.
    pub fn break_connections(&mut self) {
        self.in_flight
            .retain(|message| message.payload.between_nodes());
    }

    /// Messages in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}
