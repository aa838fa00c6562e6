//! One local client's books on its node: the stores it was granted and has not committed
//! (tickets), the leases it holds, and what it has asked for and not yet got. Every entry
//! has a bound checked at admission, so one client cannot exhaust the node; when the client
//! leaves, [`ClientBooks::close`] says what to give back.

use crate::model::{LeaseId, Location, ObjectId, ReplicaId, SessionId, Timestamp};
use std::collections::HashMap;
use std::time::Duration;

/// Per-client bounds, checked at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// Stores granted and not committed, being granted, or expired with their pages held.
    pub tickets_max: usize,
    /// Leases held or being acquired.
    pub leases_max: usize,
    /// How long a grant may stay uncommitted before it is taken back.
    pub ticket_duration: Duration,
}

/// The node's default client bounds.
pub const CLIENT_LIMITS: ClientLimits = ClientLimits {
    tickets_max: 1024,
    leases_max: 65536,
    ticket_duration: Duration::from_secs(30),
};

/// A granted, unwritten store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The session that reserved it: its commit or abort goes there only.
    pub session: SessionId,
    pub replica: ReplicaId,
    pub object: ObjectId,
    pub location: Location,
}

/// A client's request the books refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRefusal {
    /// The client holds [`ClientLimits::tickets_max`] tickets.
    TooManyTickets,
    /// The request would take the client past [`ClientLimits::leases_max`] leases.
    TooManyLeases,
    /// A batch larger than the directory accepts.
    BatchTooLarge { items: usize, max: usize },
}

/// What to give back for a client that left.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ClientCleanup {
    /// Unwritten grants: free the pages and abort the reservation.
    pub tickets: Vec<Ticket>,
    /// Pages of grants that expired uncommitted (their reservations were aborted then).
    pub expired_pages: Vec<Location>,
    /// Leases to release.
    pub leases: Vec<LeaseId>,
}

/// One client's books. See the module documentation.
#[derive(Debug)]
pub struct ClientBooks {
    limits: ClientLimits,
    tickets: HashMap<u64, (Ticket, Timestamp)>,
    tickets_pending: usize,
    next_ticket: u64,
    leases: HashMap<LeaseId, Timestamp>,
    leases_pending: usize,
    /// Pages of grants that expired uncommitted, freed when the client leaves: a stalled
    /// client might still be writing into them.
    expired_pages: Vec<Location>,
    /// Reservations of expired grants to abort at the directory (drained by the shell).
    aborts: Vec<(SessionId, ReplicaId)>,
}

impl ClientBooks {
    /// Empty books under `limits`.
    pub fn new(limits: ClientLimits) -> ClientBooks {
        ClientBooks {
            limits,
            tickets: HashMap::new(),
            tickets_pending: 0,
            next_ticket: 1,
            leases: HashMap::new(),
            leases_pending: 0,
            expired_pages: Vec::new(),
            aborts: Vec::new(),
        }
    }

    fn tickets_held(&self) -> usize {
        self.tickets.len() + self.tickets_pending + self.expired_pages.len()
    }

    /// Drops expired leases and takes back expired grants: their reservations go to
    /// [`ClientBooks::take_aborts`], their pages stay held until the client leaves.
    pub fn prune(&mut self, now: Timestamp) {
        self.leases.retain(|_, valid_until| *valid_until > now);
        let expired: Vec<u64> = self
            .tickets
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(ticket, _)| *ticket)
            .collect();
        for ticket in expired {
            if let Some((granted, _)) = self.tickets.remove(&ticket) {
                self.expired_pages.push(granted.location);
                self.aborts.push((granted.session, granted.replica));
            }
        }
    }

    /// Reservations to abort at the directory, taken once.
    pub fn take_aborts(&mut self) -> Vec<(SessionId, ReplicaId)> {
        std::mem::take(&mut self.aborts)
    }

    /// Forgets every lease (the session that granted them is gone).
    pub fn forget_leases(&mut self) {
        self.leases.clear();
    }

    /// Admits a store: a ticket number, pending until [`ClientBooks::store_granted`] or
    /// [`ClientBooks::store_ended`].
    pub fn admit_store(&mut self, now: Timestamp) -> Result<u64, ClientRefusal> {
        if self.tickets_held() >= self.limits.tickets_max {
            self.prune(now);
            if self.tickets_held() >= self.limits.tickets_max {
                return Err(ClientRefusal::TooManyTickets);
            }
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets_pending += 1;
        Ok(ticket)
    }

    /// How long a grant stays valid uncommitted.
    pub fn ticket_duration(&self) -> Duration {
        self.limits.ticket_duration
    }

    /// An admitted store was granted pages at `now`: the client may commit or abort it
    /// within [`ClientBooks::ticket_duration`].
    pub fn store_granted(&mut self, ticket: u64, granted: Ticket, now: Timestamp) {
        self.store_ended();
        let deadline = now + self.limits.ticket_duration;
        self.tickets.insert(ticket, (granted, deadline));
    }

    /// An admitted store ended without a grant (skipped, present, refused).
    pub fn store_ended(&mut self) {
        self.tickets_pending = self.tickets_pending.saturating_sub(1);
    }

    /// The grant of `ticket`, taken out of the books for its commit or abort; `None` for a
    /// ticket this client does not hold (never granted, finished, or expired).
    pub fn take_ticket(&mut self, ticket: u64) -> Option<Ticket> {
        self.tickets.remove(&ticket).map(|(granted, _)| granted)
    }

    /// Admits an acquire of `count` objects, pending until [`ClientBooks::leases_granted`].
    pub fn admit_acquire(&mut self, count: usize, now: Timestamp) -> Result<(), ClientRefusal> {
        let fits = |books: &ClientBooks| {
            books.leases.len() + books.leases_pending + count <= books.limits.leases_max
        };
        if !fits(self) {
            self.prune(now);
            if !fits(self) {
                return Err(ClientRefusal::TooManyLeases);
            }
        }
        self.leases_pending += count;
        Ok(())
    }

    /// An admitted acquire of `count` ended with `leases`, each valid until its instant.
    pub fn leases_granted(&mut self, count: usize, leases: Vec<(LeaseId, Timestamp)>) {
        self.leases_pending = self.leases_pending.saturating_sub(count);
        self.leases.extend(leases);
    }

    /// Takes the client's own leases among `leases` out of the books: `true` where the
    /// lease was this client's (only those may be released on its behalf). A batch over
    /// `batch_items_max` is refused whole, the books untouched: the directory would refuse
    /// it, and leases dropped here would then never be released there.
    pub fn release(
        &mut self,
        leases: &[LeaseId],
        batch_items_max: usize,
    ) -> Result<Vec<bool>, ClientRefusal> {
        if leases.len() > batch_items_max {
            return Err(ClientRefusal::BatchTooLarge {
                items: leases.len(),
                max: batch_items_max,
            });
        }
        Ok(leases
            .iter()
            .map(|lease| self.leases.remove(lease).is_some())
            .collect())
    }

    /// Leases held now.
    pub fn leases_held(&self) -> usize {
        self.leases.len()
    }

    /// The client left: everything to give back, and the books emptied.
    pub fn close(&mut self) -> ClientCleanup {
        ClientCleanup {
            tickets: self
                .tickets
                .drain()
                .map(|(_, (ticket, _))| ticket)
                .collect(),
            expired_pages: std::mem::take(&mut self.expired_pages),
            leases: self.leases.drain().map(|(lease, _)| lease).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AllocationId, Generation, PoolId};

    fn at(ms: u64) -> Timestamp {
        Timestamp::ZERO + Duration::from_millis(ms)
    }

    fn limits() -> ClientLimits {
        ClientLimits {
            tickets_max: 2,
            leases_max: 3,
            ticket_duration: Duration::from_millis(100),
        }
    }

    fn ticket(replica: u64) -> Ticket {
        Ticket {
            session: SessionId(1),
            replica: ReplicaId(replica),
            object: ObjectId {
                namespace: crate::model::NamespaceId([1; 16]),
                prefix: crate::model::PrefixDigest::ROOT,
                shard: 0,
                part: 0,
            },
            location: Location {
                pool: PoolId(1),
                allocation: AllocationId(replica),
                generation: Generation(1),
                offset_bytes: 0,
                length_bytes: 8,
            },
        }
    }

    #[test]
    fn tickets_are_bounded_and_expired_ones_hold_their_pages_until_close() {
        let mut books = ClientBooks::new(limits());
        let first = books.admit_store(at(0)).unwrap();
        let second = books.admit_store(at(0)).unwrap();
        assert_eq!(books.admit_store(at(0)), Err(ClientRefusal::TooManyTickets));
        books.store_granted(first, ticket(1), at(0));
        books.store_ended();
        let third = books.admit_store(at(0)).unwrap();
        assert_ne!(second, third);
        // The first grant expires: its reservation is aborted, its pages still count.
        assert_eq!(
            books.admit_store(at(200)),
            Err(ClientRefusal::TooManyTickets)
        );
        assert_eq!(books.take_aborts(), vec![(SessionId(1), ReplicaId(1))]);
        assert_eq!(
            books.take_ticket(first),
            None,
            "an expired ticket cannot commit"
        );
        let cleanup = books.close();
        assert_eq!(cleanup.expired_pages, vec![ticket(1).location]);
        assert!(cleanup.tickets.is_empty());
    }

    #[test]
    fn leases_are_bounded_and_only_own_leases_are_released() {
        let mut books = ClientBooks::new(limits());
        books.admit_acquire(2, at(0)).unwrap();
        assert_eq!(
            books.admit_acquire(2, at(0)),
            Err(ClientRefusal::TooManyLeases)
        );
        books.leases_granted(2, vec![(LeaseId(1), at(50)), (LeaseId(2), at(500))]);
        assert_eq!(
            books.release(&[LeaseId(1), LeaseId(9), LeaseId(2)], 2),
            Err(ClientRefusal::BatchTooLarge { items: 3, max: 2 }),
            "refused whole"
        );
        assert_eq!(
            books.release(&[LeaseId(1), LeaseId(9)], 2),
            Ok(vec![true, false])
        );
        // The expired lease is pruned to make room.
        books.admit_acquire(3, at(600)).unwrap();
        assert_eq!(books.leases_held(), 0);
        books.leases_granted(3, vec![(LeaseId(3), at(900))]);
        assert_eq!(books.close().leases, vec![LeaseId(3)]);
    }

    #[test]
    fn a_committed_ticket_leaves_the_books() {
        let mut books = ClientBooks::new(limits());
        let number = books.admit_store(at(0)).unwrap();
        books.store_granted(number, ticket(4), at(0));
        assert_eq!(books.take_ticket(number), Some(ticket(4)));
        assert_eq!(books.take_ticket(number), None, "taken once");
        assert_eq!(books.close(), ClientCleanup::default());
    }
}
