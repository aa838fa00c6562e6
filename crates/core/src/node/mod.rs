//! The node core: the books of a node's session with the directory and of its local
//! clients, as plain structs with an injected clock (no runtime, socket or file). The
//! actors in `actors::node` receive, call this core, and send what it answers; the
//! whole-cluster simulation (`sim`) drives the same core.
//!
//! * `operations`: the session's operation ids and acknowledgement window.
//! * `extents`: extents being given back, quarantined until the directory's answer is known.
//! * `accept`: how an accept loop backs off when descriptors run out.
//! * `clients`: one local client's tickets, leases and bounds.
//! * `awaited`: reserves still under way for grants already handed out.
//! * `copy_queue`: the copy engine's pieces in queue order, and each copy's progress.
//! * `delegations`: the replicas this node answers hits on itself, and their local leases.
//! * `holdings`: the READY replicas and namespaces a node reports again when it rejoins.
//! * `tenants`: who a local client is (its peer credentials) and what its tenant may use.
//! * `liveness`: when a node whose heartbeats go unanswered must stop on its own.
//! * `reply_timer`: how long a heartbeat may go unanswered before the node looks for the
//!   leader again.
//! * `stores`: what happens to a store's pages once its commit has an outcome, and when a
//!   reclaim may be acknowledged.
//! * `transfers`: the copies a node expects from its peers, and who may send each.
//! * `pushes`: the copies this node is sending to its peers, each target once at a time.
//! * `restores`: restores from the SSD under way, each object once at a time.
//! * `retirements`: replicas the SSD store dropped, still to retire at the directory.
//! * `ssd_pins`: a client's pins on the SSD store's regions, and when each lapses.

pub mod accept;
pub mod awaited;
pub mod clients;
pub mod copy_queue;
pub mod delegations;
pub mod extents;
pub mod holdings;
pub mod liveness;
pub mod operations;
pub mod pushes;
pub mod reply_timer;
pub mod restores;
pub mod retirements;
pub mod ssd_pins;
pub mod stores;
pub mod tenants;
pub mod transfers;

pub use awaited::{AwaitedEnd, AwaitedReserves, Reservation, Resolution, Taken};
pub use clients::{ClientBooks, ClientCleanup, ClientLimits, ClientRefusal, Ticket, CLIENT_LIMITS};
pub use delegations::Delegations;
pub use extents::{ExtentAction, ExtentReturns, ReturnRefused};
pub use holdings::Holdings;
pub use liveness::Liveness;
pub use operations::OperationWindow;
pub use reply_timer::ReplyTimer;
pub use stores::{after_commit, reclaim_done, CommitResult, PagesAfterCommit};
pub use tenants::{PeerIdentity, Tenant, TenantRefusal, Tenants};

use crate::directory::{ExtentReturn, ResolveOutcome};
use crate::model::{OperationId, PoolId, Timestamp};
use std::collections::HashMap;

/// Local clients one node serves at once: each holds a socket, a session actor and books.
pub const CLIENTS_MAX: usize = 1024;
/// Local clients one user (by the socket's peer uid) holds at once: no user, however many
/// connections it opens and leaves idle, takes every slot from the others.
pub const CLIENTS_PER_USER_MAX: usize = CLIENTS_MAX / 4;

/// Leases the clients of one user hold or are acquiring, all its connections together:
/// 131,072, half the node's lease window, so no user, however many connections it opens,
/// takes every lease from the others. (One connection holds at most
/// [`ClientLimits::leases_max`].)
pub const LEASES_PER_USER_MAX: usize = 1 << 17;

/// A local client connection, numbered by the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

/// Why the node refused a new client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRefusal {
    /// [`CLIENTS_MAX`] clients are connected.
    TooManyClients,
    /// [`CLIENTS_PER_USER_MAX`] clients of this user are connected.
    TooManyClientsOfUser,
}

/// The books of one node session. See the module documentation.
#[derive(Debug)]
pub struct NodeCore {
    /// The session's operation ids.
    pub operations: OperationWindow,
    /// Extents being given back.
    pub returns: ExtentReturns,
    /// Whether the session may still be acted on (set when it opens).
    pub liveness: Liveness,
    /// The session's heartbeat round trips, and so how long one may go unanswered.
    pub heartbeat_timer: ReplyTimer,
    /// What the node reports when it rejoins.
    pub holdings: Holdings,
    clients: HashMap<ClientId, ClientBooks>,
    /// The replicas this node answers hits on itself, and the local leases under them.
    pub delegations: Delegations,
    /// Reserves under way at the directory for grants already handed out.
    pub awaited: AwaitedReserves,
    /// The namespaces each tenant registered (bounded per tenant).
    pub tenant_namespaces: tenants::TenantNamespaces,
    /// Each connected client's user, and the clients each user holds (entries of users
    /// with none are removed): at most [`CLIENTS_PER_USER_MAX`] of each.
    client_users: HashMap<ClientId, u32>,
    clients_of_user: HashMap<u32, Vec<ClientId>>,
    next_client: u64,
    limits: ClientLimits,
}

impl Default for NodeCore {
    /// The books of a new session under the default client bounds ([`CLIENT_LIMITS`]).
    fn default() -> Self {
        NodeCore::new(CLIENT_LIMITS)
    }
}

impl NodeCore {
    /// The books of a new session, whose clients get `limits`.
    pub fn new(limits: ClientLimits) -> NodeCore {
        NodeCore {
            operations: OperationWindow::new(),
            returns: ExtentReturns::new(),
            liveness: Liveness::new(crate::model::Timestamp::ZERO, std::time::Duration::MAX),
            heartbeat_timer: ReplyTimer::default(),
            holdings: Holdings::default(),
            clients: HashMap::new(),
            delegations: Delegations::default(),
            awaited: AwaitedReserves::default(),
            tenant_namespaces: tenants::TenantNamespaces::default(),
            client_users: HashMap::new(),
            clients_of_user: HashMap::new(),
            next_client: 1,
            limits,
        }
    }

    /// Admits a client connection of user `uid`, with empty books.
    pub fn connect_client(&mut self, uid: u32) -> Result<ClientId, NodeRefusal> {
        if self.clients.len() >= CLIENTS_MAX {
            return Err(NodeRefusal::TooManyClients);
        }
        let of_user = self.clients_of_user.entry(uid).or_default();
        if of_user.len() >= CLIENTS_PER_USER_MAX {
            return Err(NodeRefusal::TooManyClientsOfUser);
        }
        let id = ClientId(self.next_client);
        of_user.push(id);
        self.next_client += 1;
        self.clients.insert(id, ClientBooks::new(self.limits));
        self.client_users.insert(id, uid);
        Ok(id)
    }

    /// Whether the user of `client` may acquire `count` more leases: its clients together
    /// hold or are acquiring at most [`LEASES_PER_USER_MAX`]. (A sum over the user's
    /// connections, at most [`CLIENTS_PER_USER_MAX`], one or a few for an engine.)
    pub fn admit_user_leases(&self, client: ClientId, count: usize) -> Result<(), ClientRefusal> {
        let Some(uid) = self.client_users.get(&client) else {
            return Ok(());
        };
        let held: usize = self.clients_of_user.get(uid).map_or(0, |clients| {
            clients
                .iter()
                .filter_map(|id| self.clients.get(id))
                .map(ClientBooks::leases_outstanding)
                .sum()
        });
        if held + count > LEASES_PER_USER_MAX {
            return Err(ClientRefusal::TooManyLeasesOfUser {
                max: LEASES_PER_USER_MAX,
            });
        }
        Ok(())
    }

    /// A connected client's books.
    pub fn client(&mut self, id: ClientId) -> Option<&mut ClientBooks> {
        self.clients.get_mut(&id)
    }

    /// A connected client's books, with the node's delegations (a local hit changes both).
    pub fn client_with_delegations(
        &mut self,
        id: ClientId,
    ) -> Option<(&mut ClientBooks, &mut Delegations)> {
        Some((self.clients.get_mut(&id)?, &mut self.delegations))
    }

    /// The client left: what to give back (nothing for an unknown client).
    pub fn disconnect_client(&mut self, id: ClientId, now: Timestamp) -> ClientCleanup {
        if let Some(uid) = self.client_users.remove(&id) {
            if let Some(held) = self.clients_of_user.get_mut(&uid) {
                held.retain(|client| *client != id);
                if held.is_empty() {
                    self.clients_of_user.remove(&uid);
                }
            }
        }
        let mut cleanup = self
            .clients
            .remove(&id)
            .map(|mut books| books.close())
            .unwrap_or_default();
        // Local leases end here; only the directory's go to the directory.
        cleanup.leases.retain(|lease| {
            let local = delegations::is_local(*lease);
            if local {
                self.delegations.release_local(now, *lease);
            }
            !local
        });
        cleanup
    }

    /// The node lost its session: what only that session could answer is forgotten. Extent
    /// returns awaiting an answer are dropped (empty extents: the new session claims only
    /// what holds replicas), and clients' leases leave the books (their views stay valid
    /// to their deadlines, which the directory's recovery window covers; a release of one
    /// is answered here).
    /// Their operations end: left outstanding, they would pin the acknowledgement window
    /// of every later session, whose ledger then fills and refuses new operations.
    pub fn session_lost(&mut self) {
        for operation in std::mem::take(&mut self.returns).operations() {
            self.operations.end(operation);
        }
        for books in self.clients.values_mut() {
            books.forget_leases();
        }
        self.delegations.clear();
    }

    /// Clients connected.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Starts giving back an extent that left its allocator empty: the operation id to
    /// send it under, or `None` when it cannot start now (the caller puts the extent back).
    pub fn begin_return(
        &mut self,
        pool: PoolId,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> Option<OperationId> {
        let operation = self.operations.begin()?;
        let begun = self
            .returns
            .begin(pool, offset_bytes, length_bytes, operation);
        if begun.is_err() {
            self.operations.end(operation);
            return None;
        }
        Some(operation)
    }

    /// A return sent under `operation` was answered (`None`: its reply is lost). A lost
    /// return keeps its operation outstanding, so the directory keeps its outcome until it
    /// is resolved.
    pub fn return_answered(
        &mut self,
        pool: PoolId,
        offset_bytes: u64,
        operation: OperationId,
        answer: Option<ExtentReturn>,
    ) -> ExtentAction {
        let action = self.returns.answered(pool, offset_bytes, answer);
        if action != ExtentAction::Resolve {
            self.operations.end(operation);
        }
        action
    }

    /// A lost return sent under `operation` was resolved.
    pub fn return_resolved(
        &mut self,
        pool: PoolId,
        offset_bytes: u64,
        operation: OperationId,
        outcome: ResolveOutcome,
    ) -> ExtentAction {
        self.operations.end(operation);
        self.returns.resolved(pool, offset_bytes, outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_bounded_per_user_and_in_all_and_leave_their_books_behind() {
        let mut core = NodeCore::new(CLIENT_LIMITS);
        let users = (CLIENTS_MAX / CLIENTS_PER_USER_MAX) as u32;
        let ids: Vec<ClientId> = (0..CLIENTS_MAX)
            .map(|index| core.connect_client(index as u32 % users).unwrap())
            .collect();
        assert_eq!(core.connect_client(users), Err(NodeRefusal::TooManyClients));
        let first = ids[0];
        core.client(first).unwrap().admit_namespace().unwrap();
        core.disconnect_client(first, Timestamp::ZERO);
        assert!(core.client(first).is_none());
        assert_eq!(core.clients(), CLIENTS_MAX - 1);
        // The slot freed is user 0's; user 1 is at its own bound.
        assert_eq!(
            core.connect_client(1),
            Err(NodeRefusal::TooManyClientsOfUser)
        );
        assert!(core.connect_client(0).is_ok());
    }

    #[test]
    fn a_lost_session_forgets_its_leases_and_quarantined_returns_but_not_its_holdings() {
        use crate::model::{LeaseId, Timestamp};
        let mut core = NodeCore::new(CLIENT_LIMITS);
        let client = core.connect_client(0).unwrap();
        let now = Timestamp::ZERO;
        let books = core.client(client).unwrap();
        books.admit_acquire(&[], now).unwrap();
        books.leases_granted(
            0,
            vec![(LeaseId(9), now + std::time::Duration::from_secs(30))],
        );
        let operation = core.begin_return(PoolId(1), 0, 4096).unwrap();
        core.return_answered(PoolId(1), 0, operation, None);
        assert_eq!(core.returns.pending(), 1);
        core.holdings.namespace_registered(
            crate::model::NamespaceId([1; 16]),
            crate::model::demo_namespace(),
        );
        core.session_lost();
        assert_eq!(
            core.returns.pending(),
            0,
            "the new session claims what it holds"
        );
        let released = core.client(client).unwrap().release(&[LeaseId(9)], 16);
        assert_eq!(released, Ok(vec![false]), "the lease went with its session");
        assert_eq!(
            core.holdings.namespaces().len(),
            1,
            "holdings are what a rejoin reports"
        );
    }

    #[test]
    fn a_lost_session_ends_the_operations_of_its_returns() {
        let mut core = NodeCore::new(CLIENT_LIMITS);
        let lost = core.begin_return(PoolId(1), 0, 4096).unwrap();
        core.return_answered(PoolId(1), 0, lost, None);
        core.begin_return(PoolId(1), 4096, 4096).unwrap();
        core.session_lost();
        assert_eq!(core.operations.outstanding(), 0);
        let next = core.operations.begin().unwrap();
        core.operations.end(next);
        assert_eq!(
            core.operations.acknowledged_through(),
            Some(next),
            "the new session's window is not pinned by the old session's returns"
        );
    }
}
