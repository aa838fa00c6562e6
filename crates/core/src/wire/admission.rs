//! Admission of peer connections by certificate name: how many one peer and all peers may
//! hold at once. A node needs two (requests and heartbeats), a few more while it replaces
//! a lost one; a stolen or buggy certificate cannot open thousands.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Connections one peer certificate may hold at once.
pub const CONNECTIONS_PER_PEER_MAX: usize = 8;
/// Connections all peers may hold at once.
pub const CONNECTIONS_MAX: usize = 4096;

/// Live connections per peer name, shared by the accept loop and the connections' owners.
#[derive(Clone, Debug, Default)]
pub struct ConnectionCounts {
    counts: Arc<Mutex<HashMap<String, usize>>>,
}

/// One admitted connection; dropping it gives its place back.
#[derive(Debug)]
pub struct ConnectionSlot {
    counts: ConnectionCounts,
    peer: String,
}

impl ConnectionCounts {
    /// Admits a connection of `peer`, or `None` when the peer or everyone is at the bound.
    pub fn admit(&self, peer: &str) -> Option<ConnectionSlot> {
        let mut counts = self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let total: usize = counts.values().sum();
        let held = counts.get(peer).copied().unwrap_or(0);
        if total >= CONNECTIONS_MAX || held >= CONNECTIONS_PER_PEER_MAX {
            return None;
        }
        counts.insert(peer.to_owned(), held + 1);
        Some(ConnectionSlot {
            counts: self.clone(),
            peer: peer.to_owned(),
        })
    }

    /// Connections `peer` holds now.
    pub fn held_by(&self, peer: &str) -> usize {
        let counts = self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        counts.get(peer).copied().unwrap_or(0)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self
            .counts
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(held) = counts.get_mut(&self.peer) {
            *held -= 1;
            if *held == 0 {
                counts.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_bounded_and_a_closed_connection_gives_its_place_back() {
        let counts = ConnectionCounts::default();
        let slots: Vec<ConnectionSlot> = (0..CONNECTIONS_PER_PEER_MAX)
            .map(|_| counts.admit("node-a").unwrap())
            .collect();
        assert!(counts.admit("node-a").is_none(), "one more is refused");
        assert!(counts.admit("node-b").is_some(), "another peer is not");
        drop(slots);
        assert_eq!(counts.held_by("node-a"), 0);
        assert!(counts.admit("node-a").is_some());
    }
}
