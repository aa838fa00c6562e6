//! One local client's books on its node: the stores it was granted and has not committed
//! (tickets) and the bytes they reserve, the leases it holds, the namespaces it registered
//! on its connection, the shared-pool extents its stores made the node ask for, and what it
//! has asked for and not yet got. Every entry has a bound checked at admission, so one
//! client cannot exhaust the node or its sharing domain; a client may only touch objects of
//! namespaces it registered. When the client leaves, [`ClientBooks::close`] says what to
//! give back.

use super::awaited::Reservation;
use crate::model::{LeaseId, Location, NamespaceId, ObjectId, Timestamp};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
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
    /// Bytes of stores granted or being granted and not committed (held expired ones too).
    pub reserved_bytes_max: u64,
    /// Namespaces registered (or being registered) on one connection.
    pub namespaces_max: usize,
    /// Shared-pool extents this client's stores may make the node ask the directory for
    /// within any [`ClientLimits::extent_window`].
    pub extents_max: usize,
    /// The window [`ClientLimits::extents_max`] counts over.
    pub extent_window: Duration,
}

/// The node's default client bounds: 1,024 tickets and 16 GiB reserved; 65,536 leases
/// (a quarter of the node's lease window, so four busy clients cannot starve a fifth of
/// every lease); 64 namespaces; 256 extent requests a minute (16 GiB a minute of new
/// shared-pool room at 64 MiB extents: a client filling its extents at a benchmark's pace
/// keeps going, a client trying to take a domain's pool in a burst does not).
pub const CLIENT_LIMITS: ClientLimits = ClientLimits {
    tickets_max: 1024,
    leases_max: 65536,
    ticket_duration: Duration::from_secs(30),
    reserved_bytes_max: 16 << 30,
    namespaces_max: 64,
    extents_max: 256,
    extent_window: Duration::from_secs(60),
};

/// A granted, unwritten store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Its reservation at the directory: the session that made it (its commit or abort
    /// goes there only) and the replica, or the awaited reserve that will say.
    pub reservation: Reservation,
    pub object: ObjectId,
    pub location: Location,
}

/// A client's request the books refused: a quota, or an object outside the client's
/// namespaces. Sent to the client as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ClientRefusal {
    /// The client holds [`ClientLimits::tickets_max`] tickets.
    #[error("this client holds its {max} store tickets")]
    TooManyTickets { max: usize },
    /// The request would take the client past [`ClientLimits::leases_max`] leases.
    #[error("this client would hold more than {max} leases")]
    TooManyLeases { max: usize },
    /// The request would take the clients of this connection's user past
    /// [`super::LEASES_PER_USER_MAX`] leases, all their connections together.
    #[error("this client's user would hold more than {max} leases")]
    TooManyLeasesOfUser { max: usize },
    /// A batch larger than the directory accepts.
    #[error("a batch of {items} items is over the bound of {max}")]
    BatchTooLarge { items: usize, max: usize },
    /// The store would take the client past [`ClientLimits::reserved_bytes_max`].
    #[error("this client would reserve more than {max} bytes")]
    ReservedBytes { max: u64 },
    /// The client registered [`ClientLimits::namespaces_max`] namespaces.
    #[error("this client registered its {max} namespaces")]
    TooManyNamespaces { max: usize },
    /// An object of a namespace this connection did not register.
    #[error("namespace {0:?} was not registered on this connection")]
    NamespaceNotRegistered(NamespaceId),
    /// The client's stores made the node ask for [`ClientLimits::extents_max`] extents
    /// within [`ClientLimits::extent_window`].
    #[error("this client's stores asked for {max} shared-pool extents within {window_ms} ms")]
    TooManyExtents { max: usize, window_ms: u64 },
    /// The request would take the connection past its bound of SSD pins.
    #[error("this client would hold more than {max} SSD pins")]
    TooManySsdPins { max: usize },
    /// The node has no SSD store.
    #[error("this node has no SSD store")]
    NoSsd,
}

impl ClientRefusal {
    /// A bounded label (the variant), for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ClientRefusal::TooManyTickets { .. } => "too_many_tickets",
            ClientRefusal::TooManyLeases { .. } => "too_many_leases",
            ClientRefusal::TooManyLeasesOfUser { .. } => "too_many_leases_of_user",
            ClientRefusal::BatchTooLarge { .. } => "batch_too_large",
            ClientRefusal::ReservedBytes { .. } => "reserved_bytes",
            ClientRefusal::TooManyNamespaces { .. } => "too_many_namespaces",
            ClientRefusal::NamespaceNotRegistered(_) => "namespace_not_registered",
            ClientRefusal::TooManyExtents { .. } => "too_many_extents",
            ClientRefusal::TooManySsdPins { .. } => "too_many_ssd_pins",
            ClientRefusal::NoSsd => "no_ssd",
        }
    }
}

/// What to give back for a client that left.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ClientCleanup {
    /// Unwritten grants: free the pages and abort the reservation.
    pub tickets: Vec<Ticket>,
    /// Pages of grants that expired uncommitted and are not freed yet (their reservations
    /// were aborted at the expiry).
    pub expired_pages: Vec<Location>,
    /// Leases to release.
    pub leases: Vec<LeaseId>,
}

/// One client's books. See the module documentation.
#[derive(Debug)]
pub struct ClientBooks {
    limits: ClientLimits,
    /// The client's hello was answered: its other requests may be served.
    greeted: bool,
    tickets: HashMap<u64, (Ticket, Timestamp)>,
    /// Bytes of each store admitted and not yet granted, by ticket number.
    tickets_pending: HashMap<u64, u64>,
    next_ticket: u64,
    /// Bytes of the tickets held (granted, pending, expired with pages held).
    reserved_bytes: u64,
    /// Namespaces registered on this connection.
    namespaces: HashSet<NamespaceId>,
    namespaces_pending: usize,
    /// When this client's recent extent requests were made (at most `extents_max`).
    extent_requests: VecDeque<Timestamp>,
    leases: HashMap<LeaseId, Timestamp>,
    leases_pending: usize,
    /// Pages of grants that expired uncommitted, each with when it is freed: one more
    /// ticket duration after the expiry (the client stops writing at its own deadline,
    /// earlier than the node's, so a copy it began then has had a whole duration more to
    /// end), or when the client leaves, whichever comes first.
    expired_pages: Vec<(Location, Timestamp)>,
    /// Expired pages whose time came, to free (drained by the shell).
    pages_due: Vec<Location>,
    /// Reservations of expired grants to abort at the directory (drained by the shell).
    aborts: Vec<Reservation>,
}

impl ClientBooks {
    /// Empty books under `limits`.
    pub fn new(limits: ClientLimits) -> ClientBooks {
        ClientBooks {
            limits,
            greeted: false,
            tickets: HashMap::new(),
            tickets_pending: HashMap::new(),
            next_ticket: 1,
            reserved_bytes: 0,
            namespaces: HashSet::new(),
            namespaces_pending: 0,
            extent_requests: VecDeque::new(),
            leases: HashMap::new(),
            leases_pending: 0,
            expired_pages: Vec::new(),
            pages_due: Vec::new(),
            aborts: Vec::new(),
        }
    }

    /// Whether the client's hello was answered.
    pub fn greeted(&self) -> bool {
        self.greeted
    }

    /// The client's hello was answered.
    pub fn set_greeted(&mut self) {
        self.greeted = true;
    }

    fn tickets_held(&self) -> usize {
        self.tickets.len() + self.tickets_pending.len() + self.expired_pages.len()
    }

    /// Drops expired leases and takes back expired grants: their reservations go to
    /// [`ClientBooks::take_aborts`] at once, their pages to [`ClientBooks::take_due_pages`]
    /// one ticket duration later (counted in the client's tickets and bytes until then).
    pub fn prune(&mut self, now: Timestamp) {
        self.leases.retain(|_, valid_until| *valid_until > now);
        let (due, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.expired_pages)
            .into_iter()
            .partition(|(_, free_at)| *free_at <= now);
        self.expired_pages = held;
        for (location, _) in due {
            self.reserved_bytes = self.reserved_bytes.saturating_sub(location.length_bytes);
            self.pages_due.push(location);
        }
        let expired: Vec<u64> = self
            .tickets
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(ticket, _)| *ticket)
            .collect();
        for ticket in expired {
            if let Some((granted, _)) = self.tickets.remove(&ticket) {
                let free_at = now + self.limits.ticket_duration;
                self.expired_pages.push((granted.location, free_at));
                self.aborts.push(granted.reservation);
            }
        }
    }

    /// Pages of expired grants whose time came, taken once: the shell frees them.
    pub fn take_due_pages(&mut self) -> Vec<Location> {
        std::mem::take(&mut self.pages_due)
    }

    /// Reservations to abort at the directory, taken once.
    pub fn take_aborts(&mut self) -> Vec<Reservation> {
        std::mem::take(&mut self.aborts)
    }

    /// Forgets every lease (the session that granted them is gone).
    pub fn forget_leases(&mut self) {
        self.leases.clear();
    }

    /// Admits a store of `object` (`length_bytes` long): a ticket number, pending until
    /// [`ClientBooks::store_granted`] or [`ClientBooks::store_ended`].
    pub fn admit_store(
        &mut self,
        object: &ObjectId,
        length_bytes: u64,
        now: Timestamp,
    ) -> Result<u64, ClientRefusal> {
        self.check_objects(std::slice::from_ref(object))?;
        let fits = |books: &ClientBooks| {
            books.tickets_held() < books.limits.tickets_max
                && books.reserved_bytes.saturating_add(length_bytes)
                    <= books.limits.reserved_bytes_max
        };
        if !fits(self) {
            self.prune(now);
            if self.tickets_held() >= self.limits.tickets_max {
                return Err(ClientRefusal::TooManyTickets {
                    max: self.limits.tickets_max,
                });
            }
            if !fits(self) {
                return Err(ClientRefusal::ReservedBytes {
                    max: self.limits.reserved_bytes_max,
                });
            }
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets_pending.insert(ticket, length_bytes);
        self.reserved_bytes += length_bytes;
        Ok(ticket)
    }

    /// Refuses objects of namespaces this connection did not register.
    pub fn check_objects(&self, objects: &[ObjectId]) -> Result<(), ClientRefusal> {
        match objects
            .iter()
            .find(|object| !self.namespaces.contains(&object.namespace))
        {
            Some(object) => Err(ClientRefusal::NamespaceNotRegistered(object.namespace)),
            None => Ok(()),
        }
    }

    /// Admits a namespace registration, pending until [`ClientBooks::namespace_registered`].
    pub fn admit_namespace(&mut self) -> Result<(), ClientRefusal> {
        if self.namespaces.len() + self.namespaces_pending >= self.limits.namespaces_max {
            return Err(ClientRefusal::TooManyNamespaces {
                max: self.limits.namespaces_max,
            });
        }
        self.namespaces_pending += 1;
        Ok(())
    }

    /// An admitted registration ended: with the namespace's id when it was registered.
    pub fn namespace_registered(&mut self, namespace: Option<NamespaceId>) {
        self.namespaces_pending = self.namespaces_pending.saturating_sub(1);
        self.namespaces.extend(namespace);
    }

    /// Admits one extent request on this client's behalf at `now`.
    pub fn admit_extent(&mut self, now: Timestamp) -> Result<(), ClientRefusal> {
        let window = self.limits.extent_window;
        while self
            .extent_requests
            .front()
            .is_some_and(|asked| *asked + window <= now)
        {
            self.extent_requests.pop_front();
        }
        if self.extent_requests.len() >= self.limits.extents_max {
            return Err(ClientRefusal::TooManyExtents {
                max: self.limits.extents_max,
                window_ms: window.as_millis() as u64,
            });
        }
        self.extent_requests.push_back(now);
        Ok(())
    }

    /// The extent request admitted last got no extent (the pool is full): it does not count.
    pub fn extent_not_granted(&mut self) {
        self.extent_requests.pop_back();
    }

    /// How long a grant stays valid uncommitted.
    pub fn ticket_duration(&self) -> Duration {
        self.limits.ticket_duration
    }

    /// An admitted store was granted pages at `now`: the client may commit or abort it
    /// within [`ClientBooks::ticket_duration`].
    pub fn store_granted(&mut self, ticket: u64, granted: Ticket, now: Timestamp) {
        self.tickets_pending.remove(&ticket);
        let deadline = now + self.limits.ticket_duration;
        self.tickets.insert(ticket, (granted, deadline));
    }

    /// An admitted store ended without a grant (skipped, present, refused).
    pub fn store_ended(&mut self, ticket: u64) {
        if let Some(bytes) = self.tickets_pending.remove(&ticket) {
            self.reserved_bytes = self.reserved_bytes.saturating_sub(bytes);
        }
    }

    /// The grant of `ticket`, taken out of the books for its commit or abort; `None` for a
    /// ticket this client does not hold (never granted, finished, or expired).
    pub fn take_ticket(&mut self, ticket: u64) -> Option<Ticket> {
        let (granted, _) = self.tickets.remove(&ticket)?;
        self.reserved_bytes = self
            .reserved_bytes
            .saturating_sub(granted.location.length_bytes);
        Some(granted)
    }

    /// Admits an acquire of `objects`, pending until [`ClientBooks::leases_granted`].
    /// Objects outside this connection's namespaces are refused.
    pub fn admit_acquire(
        &mut self,
        objects: &[ObjectId],
        now: Timestamp,
    ) -> Result<(), ClientRefusal> {
        self.check_objects(objects)?;
        let count = objects.len();
        let fits = |books: &ClientBooks| {
            books.leases.len() + books.leases_pending + count <= books.limits.leases_max
        };
        if !fits(self) {
            self.prune(now);
            if !fits(self) {
                return Err(ClientRefusal::TooManyLeases {
                    max: self.limits.leases_max,
                });
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

    /// Leases held or being acquired.
    pub fn leases_outstanding(&self) -> usize {
        self.leases.len() + self.leases_pending
    }

    /// The client left: everything to give back, and the books emptied.
    pub fn close(&mut self) -> ClientCleanup {
        self.reserved_bytes = 0;
        self.namespaces.clear();
        ClientCleanup {
            tickets: self
                .tickets
                .drain()
                .map(|(_, (ticket, _))| ticket)
                .collect(),
            expired_pages: std::mem::take(&mut self.expired_pages)
                .into_iter()
                .map(|(location, _)| location)
                .chain(std::mem::take(&mut self.pages_due))
                .collect(),
            leases: self.leases.drain().map(|(lease, _)| lease).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AllocationId, Generation, PoolId, PrefixDigest, ReplicaId, SessionId};

    fn at(ms: u64) -> Timestamp {
        Timestamp::ZERO + Duration::from_millis(ms)
    }

    fn limits() -> ClientLimits {
        ClientLimits {
            tickets_max: 2,
            leases_max: 3,
            ticket_duration: Duration::from_millis(100),
            reserved_bytes_max: 100,
            namespaces_max: 2,
            extents_max: 2,
            extent_window: Duration::from_millis(1000),
        }
    }

    const MINE: NamespaceId = NamespaceId([1; 16]);
    const THEIRS: NamespaceId = NamespaceId([2; 16]);

    fn object(namespace: NamespaceId) -> ObjectId {
        ObjectId {
            namespace,
            prefix: PrefixDigest::ROOT,
            shard: 0,
            part: 0,
        }
    }

    /// Books with `MINE` registered.
    fn books() -> ClientBooks {
        let mut books = ClientBooks::new(limits());
        books.admit_namespace().unwrap();
        books.namespace_registered(Some(MINE));
        books
    }

    fn ticket(replica: u64) -> Ticket {
        Ticket {
            reservation: Reservation::Made {
                session: SessionId(1),
                replica: ReplicaId(replica),
            },
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

    fn store(books: &mut ClientBooks, bytes: u64, now: u64) -> Result<u64, ClientRefusal> {
        books.admit_store(&object(MINE), bytes, at(now))
    }

    #[test]
    fn tickets_are_bounded_and_expired_ones_hold_their_pages_one_duration_more() {
        let mut books = books();
        let first = store(&mut books, 8, 0).unwrap();
        let second = store(&mut books, 8, 0).unwrap();
        assert_eq!(
            store(&mut books, 8, 0),
            Err(ClientRefusal::TooManyTickets { max: 2 })
        );
        books.store_granted(first, ticket(1), at(0));
        books.store_ended(second);
        let third = store(&mut books, 8, 0).unwrap();
        assert_ne!(second, third);
        // The first grant expires: its reservation is aborted, its pages still count.
        assert_eq!(
            store(&mut books, 8, 200),
            Err(ClientRefusal::TooManyTickets { max: 2 })
        );
        assert_eq!(books.take_aborts(), vec![ticket(1).reservation]);
        assert_eq!(
            books.take_ticket(first),
            None,
            "an expired ticket cannot commit"
        );
        // One ticket duration after the expiry (seen at 200) its pages are due, and its
        // slot comes back; not before.
        assert_eq!(
            store(&mut books, 8, 299),
            Err(ClientRefusal::TooManyTickets { max: 2 })
        );
        assert!(books.take_due_pages().is_empty());
        assert!(store(&mut books, 8, 300).is_ok());
        assert_eq!(books.take_due_pages(), vec![ticket(1).location]);
        let cleanup = books.close();
        assert!(cleanup.expired_pages.is_empty());
        assert!(cleanup.tickets.is_empty());
    }

    #[test]
    fn reserved_bytes_are_bounded_and_come_back_on_commit_or_end() {
        let mut books = books();
        let first = store(&mut books, 60, 0).unwrap();
        assert_eq!(
            store(&mut books, 41, 0),
            Err(ClientRefusal::ReservedBytes { max: 100 })
        );
        let granted = Ticket {
            location: Location {
                length_bytes: 60,
                ..ticket(1).location
            },
            ..ticket(1)
        };
        books.store_granted(first, granted, at(0));
        assert_eq!(
            store(&mut books, 41, 0),
            Err(ClientRefusal::ReservedBytes { max: 100 }),
            "a granted ticket still reserves its bytes"
        );
        assert_eq!(books.take_ticket(first), Some(granted));
        let second = store(&mut books, 100, 0).unwrap();
        books.store_ended(second);
        assert!(store(&mut books, 100, 0).is_ok());
    }

    #[test]
    fn only_registered_namespaces_are_usable_and_registrations_are_bounded() {
        let mut books = books();
        let theirs = object(THEIRS);
        assert_eq!(
            books.admit_store(&theirs, 8, at(0)),
            Err(ClientRefusal::NamespaceNotRegistered(THEIRS))
        );
        assert_eq!(
            books.admit_acquire(&[object(MINE), theirs], at(0)),
            Err(ClientRefusal::NamespaceNotRegistered(THEIRS))
        );
        assert_eq!(books.check_objects(&[object(MINE)]), Ok(()));
        books.admit_namespace().unwrap();
        assert_eq!(
            books.admit_namespace(),
            Err(ClientRefusal::TooManyNamespaces { max: 2 }),
            "a pending registration counts"
        );
        // A refused registration gives its slot back.
        books.namespace_registered(None);
        books.admit_namespace().unwrap();
        books.namespace_registered(Some(THEIRS));
        assert!(books.admit_store(&theirs, 8, at(0)).is_ok());
    }

    #[test]
    fn extent_requests_are_bounded_per_window() {
        let mut books = books();
        books.admit_extent(at(0)).unwrap();
        books.admit_extent(at(500)).unwrap();
        assert_eq!(
            books.admit_extent(at(999)),
            Err(ClientRefusal::TooManyExtents {
                max: 2,
                window_ms: 1000
            })
        );
        // The first request left the window.
        books.admit_extent(at(1000)).unwrap();
        assert!(books.admit_extent(at(1400)).is_err());
        // A request that got no extent is not counted.
        books.admit_extent(at(1500)).unwrap();
        books.extent_not_granted();
        books.admit_extent(at(1501)).unwrap();
    }

    #[test]
    fn leases_are_bounded_and_only_own_leases_are_released() {
        let mut books = books();
        let two = [object(MINE), object(MINE)];
        books.admit_acquire(&two, at(0)).unwrap();
        assert_eq!(
            books.admit_acquire(&two, at(0)),
            Err(ClientRefusal::TooManyLeases { max: 3 })
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
        books
            .admit_acquire(&[object(MINE), object(MINE), object(MINE)], at(600))
            .unwrap();
        assert_eq!(books.leases_held(), 0);
        books.leases_granted(3, vec![(LeaseId(3), at(900))]);
        assert_eq!(books.close().leases, vec![LeaseId(3)]);
    }

    #[test]
    fn a_committed_ticket_leaves_the_books() {
        let mut books = books();
        let number = store(&mut books, 8, 0).unwrap();
        books.store_granted(number, ticket(4), at(0));
        assert_eq!(books.take_ticket(number), Some(ticket(4)));
        assert_eq!(books.take_ticket(number), None, "taken once");
        assert_eq!(books.close(), ClientCleanup::default());
    }
}
