//! A simulated node process: the real node core (operation window, extent returns, client
//! books, store rules) and the real allocators (a page allocator for its CPU pool, an
//! extent allocator per shared pool), with one engine client. Requests go through the
//! faulty network; a request whose reply does not come is retried with the same operation
//! id, then resolved. A node that hears its session is gone, or whose heartbeats went
//! unanswered for the fence window, rejoins (`rejoin`); a crashed node restarts as a new
//! process and a new epoch.

use super::network::Payload;
use super::tenants::{cpu_pool_spec, descriptor_of, TENANTS};
use super::world::{Space, World, BATCH_ITEMS_MAX, CPU_POOL_OBJECTS, OBJECT_BYTES};
use kvtier_core::backends::extent_allocator::ExtentAllocator;
use kvtier_core::backends::PageAllocator;
use kvtier_core::directory::{
    AcquireMode, DirectoryError, ExtentReturn, Lease, ReserveItem, ResolveOutcome,
};
use kvtier_core::model::{
    DomainId, Location, Medium, NodeId, ObjectId, OperationId, OwnerTable, PoolId, ReplicaId,
    SessionId, Timestamp,
};
use kvtier_core::node::delegations::is_local;
use kvtier_core::node::pushes::PushSet;
use kvtier_core::node::transfers::{ExpectedTransfers, EXPECTED_TRANSFERS_MAX};
use kvtier_core::node::{ClientId, CommitResult, Liveness, NodeCore, Reservation};
use kvtier_core::protocol::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A request not answered within this long is sent again (same operation id).
const RETRY_AFTER: Duration = Duration::from_millis(150);
/// Sends of a request without an operation id (or of a resolve) before it is given up.
const ATTEMPTS_MAX: u32 = 3;
/// Allocations per pool or extent.
const ALLOCATIONS_MAX: u32 = 64;

/// A lease an engine reads under, with what it must read.
#[derive(Clone, Debug)]
pub struct HeldLease {
    pub lease: Lease,
    pub object: ObjectId,
    pub space: Space,
    /// The tenant of the engine that holds it.
    pub tenant: usize,
    /// Until when the engine reads under it: its deadline on the engine's clock.
    pub trusted_until: Timestamp,
}

/// Why a request was sent, beyond what the request says.
#[derive(Clone, Debug)]
pub(super) enum Purpose {
    Plain,
    Store {
        ticket: u64,
        object: ObjectId,
        tenant: usize,
        /// Pages granted and written before the reserve was sent (the node's grants before
        /// the reserve): committed if the directory reserves in their pool, else freed.
        early: Option<Location>,
    },
    Commit {
        object: ObjectId,
        replica: ReplicaId,
        location: Location,
        /// A client's store, sent while the node served: the node core's session mark
        /// then (`Delegations::session_mark`); `None` for copies.
        owned_mark: Option<u64>,
    },
    Acquire {
        count: usize,
        tenant: usize,
    },
    /// A restore from the node's SSD, reserving room in memory.
    Restore {
        object: ObjectId,
    },
    Return {
        pool: PoolId,
        offset_bytes: u64,
    },
    Heartbeat,
}

#[derive(Clone, Debug)]
pub(super) struct Pending {
    pub(super) request: DirectoryRequest,
    pub(super) purpose: Purpose,
    sent_at: Timestamp,
    attempts: u32,
}

/// One simulated node process. See the module documentation.
pub struct SimNode {
    pub name: String,
    pub domains: Vec<DomainId>,
    /// Bumps at every process start.
    pub incarnation: u64,
    /// Bumps at every process start and session loss: replies meant for an earlier
    /// process or session are never delivered.
    pub connection: u64,
    pub session: Option<SessionId>,
    /// The id the directory gave this node.
    pub(super) node_id: Option<NodeId>,
    /// The rejoin under way, if the node lost its session.
    pub(super) rejoin: Option<super::rejoin::Rejoin>,
    /// What the node held when the directory was last killed, and the extents it lost
    /// since: checked when its rejoin ends.
    pub(super) held_at_kill: Option<super::rejoin::HeldAtKill>,
    pub(super) core: NodeCore,
    /// Each tenant's engine's connection (by tenant).
    pub(super) clients: [Option<ClientId>; TENANTS.len()],
    /// Each tenant's CPU partition and its allocator (by tenant; empty until started).
    pub(super) cpu: Vec<(PoolId, PageAllocator)>,
    /// The extent allocator of each shared pool, by domain.
    pub cxl: HashMap<u32, ExtentAllocator>,
    pub(super) pending: BTreeMap<u64, Pending>,
    next_request: u64,
    /// The engine's leases.
    pub leases: Vec<HeldLease>,
    pub(super) committed: Vec<(ObjectId, ReplicaId)>,
    /// The process's SSD store, once open.
    pub(super) ssd: Option<super::ssd::SimSsd>,
    /// Network copies: the streams this node expects, and its pushes under way.
    pub(super) transfers: ExpectedTransfers,
    pub(super) pushes: PushSet,
    pub(super) push_streams: HashMap<ReplicaId, super::peer::PushStream>,
    /// The pool each tenant's engine's last store was granted in (by tenant): its next
    /// store's pages are granted and written there before the reserve is answered.
    pub(super) placed: [Option<PoolId>; TENANTS.len()],
}

impl SimNode {
    /// A node that has not started yet.
    pub fn new(index: usize, domains: &[u32]) -> SimNode {
        SimNode {
            name: format!("node{index}"),
            domains: domains.iter().map(|domain| DomainId(*domain)).collect(),
            incarnation: 0,
            connection: 0,
            session: None,
            node_id: None,
            rejoin: None,
            held_at_kill: None,
            core: NodeCore::default(),
            clients: [None; TENANTS.len()],
            cpu: Vec::new(),
            cxl: HashMap::new(),
            pending: BTreeMap::new(),
            next_request: 1,
            leases: Vec::new(),
            committed: Vec::new(),
            ssd: None,
            transfers: ExpectedTransfers::with_capacity(EXPECTED_TRANSFERS_MAX),
            pushes: PushSet::default(),
            push_streams: HashMap::new(),
            placed: [None; TENANTS.len()],
        }
    }

    fn space_of_cpu(&self, index: usize, partition: usize) -> Space {
        Space::Cpu {
            node: index,
            incarnation: self.incarnation,
            partition,
        }
    }
}

/// The tier orders node `node` opens its sessions with: even nodes write CPU first.
pub(super) fn media_orders(node: usize) -> (Vec<Medium>, Vec<Medium>) {
    if node % 2 == 0 {
        (
            vec![Medium::Cpu, Medium::Cxl],
            vec![Medium::Cpu, Medium::Cxl],
        )
    } else {
        (
            vec![Medium::Cxl, Medium::Cpu],
            vec![Medium::Cpu, Medium::Cxl],
        )
    }
}

impl World {
    /// The process of node `node` dies: its session, books, allocators and in-flight work
    /// are gone; its engine's leases live on as orphans until their deadlines (the engine
    /// keeps its mappings), and its CPU pool's bytes stay readable under them.
    pub fn crash(&mut self, node: usize) {
        let state = &mut self.nodes[node];
        self.orphan_leases.append(&mut state.leases);
        state.session = None;
        state.rejoin = None;
        state.held_at_kill = None;
        state.core = NodeCore::default();
        state.clients = [None; TENANTS.len()];
        state.cpu.clear();
        state.cxl.clear();
        state.pending.clear();
        state.committed.clear();
        state.transfers = ExpectedTransfers::with_capacity(EXPECTED_TRANSFERS_MAX);
        state.pushes = PushSet::default();
        state.push_streams.clear();
        state.placed = [None; TENANTS.len()];
        self.crash_disk(node);
        self.stats.covered.node_restarts += 1;
    }

    /// Starts node `node` as a new process: opens a session (a new epoch), registers a
    /// fresh CPU partition and the namespace of each tenant, connects the tenants' engines
    /// and opens its SSD store. Start-up talks to the directory directly.
    fn start(&mut self, node: usize) {
        let (write_order, read_order) = media_orders(node);
        self.nodes[node].incarnation += 1;
        self.nodes[node].connection += 1;
        self.nodes[node].session = None;
        let opened_at = self.now;
        let DirectoryReply::Opened(opened) = self.call(
            node,
            DirectoryRequest::Open {
                write_order,
                read_order,
            },
        ) else {
            return;
        };
        self.nodes[node].session = Some(opened.session);
        self.nodes[node].node_id = Some(opened.node);
        let mut partitions = Vec::new();
        for tenant in 0..TENANTS.len() {
            let spec = cpu_pool_spec(node, opened.node, tenant);
            let DirectoryReply::Pool(pool) = self.call(node, DirectoryRequest::RegisterPool(spec))
            else {
                self.nodes[node].session = None;
                return;
            };
            let space = self.nodes[node].space_of_cpu(node, tenant);
            self.spaces.insert(pool, space);
            let pages = PageAllocator::new(CPU_POOL_OBJECTS * OBJECT_BYTES, 4096, ALLOCATIONS_MAX)
                .expect("the simulated CPU pool's geometry is valid");
            partitions.push((pool, pages));
            let descriptor = descriptor_of(tenant);
            if let DirectoryReply::Namespace(id) = self.call(
                node,
                DirectoryRequest::RegisterNamespace(descriptor.clone()),
            ) {
                self.nodes[node]
                    .core
                    .holdings
                    .namespace_registered(id, descriptor);
            }
        }
        let cxl = self.shared_allocators(node);
        let state = &mut self.nodes[node];
        state.cpu = partitions;
        state.cxl = cxl;
        self.connect_engines(node);
        let state = &mut self.nodes[node];
        let fence_after = Duration::from_millis(opened.fence_after_ms);
        state.core.liveness = Liveness::new(opened_at, fence_after);
        self.start_ssd(node, opened.node);
    }

    fn shared_allocators(&self, node: usize) -> HashMap<u32, ExtentAllocator> {
        self.nodes[node]
            .domains
            .iter()
            .map(|domain| {
                let capacity = super::world::CXL_POOL_OBJECTS * OBJECT_BYTES;
                (
                    domain.0,
                    ExtentAllocator::new(capacity, 4096, ALLOCATIONS_MAX),
                )
            })
            .collect()
    }

    /// Sends `request` for `purpose` and remembers it until its reply.
    pub(super) fn send(&mut self, node: usize, request: DirectoryRequest, purpose: Purpose) {
        self.send_attempt(node, request, purpose, 1);
    }

    fn send_attempt(
        &mut self,
        node: usize,
        request: DirectoryRequest,
        purpose: Purpose,
        attempts: u32,
    ) {
        let state = &mut self.nodes[node];
        let request_id = state.next_request;
        state.next_request += 1;
        let pending = Pending {
            request: request.clone(),
            purpose,
            sent_at: self.now,
            attempts,
        };
        state.pending.insert(request_id, pending);
        let connection = state.connection;
        self.network.send(
            &mut self.rng,
            self.now,
            node,
            connection,
            request_id,
            Payload::Request(request),
        );
    }

    /// A fresh operation id, or `None` when the window is full.
    pub(super) fn operation(&mut self, node: usize) -> Option<OperationId> {
        self.nodes[node].core.operations.begin()
    }

    /// One thing node `node` does: start, or one engine or node action.
    pub fn node_step(&mut self, node: usize) {
        if self.nodes[node].rejoin.is_some() {
            // Not serving until the rejoin ends; a crash may still come.
            if self.faults && self.rng.chance(1) {
                self.crash(node);
            }
            return;
        }
        if self.nodes[node].session.is_none() {
            if self.rng.chance(30) {
                self.start(node);
            }
            return;
        }
        if self.nodes[node].core.liveness.may_be_fenced(self.now) {
            // Silent for the fence window: the directory may have fenced this session and
            // handed its extents on. Stop writing and rejoin (`extents_to_claim` decides
            // which extents stay).
            self.session_lost(node);
            return;
        }
        match self.rng.below(100) {
            0..=27 => self.begin_store(node),
            28..=49 => self.begin_acquire(node),
            50..=58 => self.release_one(node),
            59..=62 => self.engine_ssd_step(node),
            63..=68 => self.retire_one(node),
            69..=80 => {
                self.tidy_delegations(node);
                self.send(
                    node,
                    DirectoryRequest::PollTasks { max: 16 },
                    Purpose::Plain,
                )
            }
            81..=92 => self.heartbeat(node),
            93..=97 => self.return_empty_extents(node),
            _ => {
                if self.faults && self.rng.chance(15) {
                    self.crash(node);
                }
            }
        }
    }

    fn heartbeat(&mut self, node: usize) {
        let acknowledged_through = self.nodes[node].core.operations.acknowledged_through();
        let request = DirectoryRequest::Heartbeat {
            acknowledged_through,
        };
        self.send(node, request, Purpose::Heartbeat);
        let now = self.now;
        for client in self.nodes[node].clients.into_iter().flatten() {
            let state = &mut self.nodes[node];
            if let Some(books) = state.core.client(client) {
                books.prune(now);
                let aborts = books.take_aborts();
                let due = books.take_due_pages();
                for reservation in aborts {
                    // The simulation's grants follow their reserve's answer: always made.
                    if let Reservation::Made { replica, .. } = reservation {
                        self.send(node, DirectoryRequest::Abort { replica }, Purpose::Plain);
                    }
                }
                for location in due {
                    self.free(node, location).ok();
                }
            }
        }
        let now = self.now;
        for location in self.nodes[node].core.holdings.due_frees(now) {
            self.free(node, location).ok();
        }
        self.nodes[node]
            .leases
            .retain(|held| held.trusted_until > now);
        self.end_lapsed_pins(node, now);
        self.expire_transfers(node);
    }

    fn begin_store(&mut self, node: usize) {
        let (tenant, named) = self.pick_tenants();
        let object = self.random_object(named);
        let now = self.now;
        let state = &mut self.nodes[node];
        let Some(books) = state.clients[tenant].and_then(|client| state.core.client(client)) else {
            return;
        };
        let Ok(ticket) = books.admit_store(&object, OBJECT_BYTES, now) else {
            return self.trespass_refused(tenant, &[object]);
        };
        self.check_admitted(tenant, &[object]);
        let Some(operation) = self.operation(node) else {
            self.end_store(node, tenant, ticket);
            return;
        };
        let item = ReserveItem {
            object,
            length_bytes: OBJECT_BYTES,
        };
        // Placed before: the pages are granted and written now, while the reserve travels.
        let early = self.nodes[node].placed[tenant]
            .and_then(|pool| self.allocate(node, pool))
            .map(|(location, space)| {
                self.write(space, location.offset_bytes, object);
                self.stats.covered.early_grants += 1;
                location
            });
        let request = DirectoryRequest::Reserve { operation, item };
        let purpose = Purpose::Store {
            ticket,
            object,
            tenant,
            early,
        };
        self.send(node, request, purpose);
    }

    /// A store ended before its commit: its early pages, if any, are freed and the books'
    /// slot given back.
    pub(super) fn end_early_store(
        &mut self,
        node: usize,
        tenant: usize,
        ticket: u64,
        early: Option<Location>,
    ) {
        if let Some(location) = early {
            self.free(node, location).ok();
        }
        self.end_store(node, tenant, ticket);
    }

    pub(super) fn end_store(&mut self, node: usize, tenant: usize, ticket: u64) {
        let state = &mut self.nodes[node];
        if let Some(books) = state.clients[tenant].and_then(|client| state.core.client(client)) {
            books.store_ended(ticket);
        }
    }

    fn begin_acquire(&mut self, node: usize) {
        let (tenant, named) = self.pick_tenants();
        let count = 1 + self.rng.below(3) as usize;
        let objects: Vec<ObjectId> = (0..count).map(|_| self.random_object(named)).collect();
        let mode = if self.rng.chance(50) {
            AcquireMode::Each
        } else {
            AcquireMode::Manifest
        };
        let now = self.now;
        let state = &mut self.nodes[node];
        let Some(books) = state.clients[tenant].and_then(|client| state.core.client(client)) else {
            return;
        };
        if books.admit_acquire(&objects, now).is_err() {
            return self.trespass_refused(tenant, &objects);
        }
        let state = &mut self.nodes[node];
        let Some((books, delegations)) =
            state.clients[tenant].and_then(|client| state.core.client_with_delegations(client))
        else {
            return;
        };
        // As the node core decides (`protocol::node`): every object a hit under the
        // node's delegations is leased here, with no message, when all are or when items
        // are leased one by one; the rest go to the directory.
        let answered = if delegations.covers(now, &objects)
            || (mode == AcquireMode::Each && delegations.covers_any(now, &objects))
        {
            delegations.acquire_each(now, &objects)
        } else {
            vec![None; objects.len()]
        };
        let granted = answered
            .iter()
            .flatten()
            .map(|lease| (lease.lease, lease.deadline));
        let local = answered.iter().flatten().count();
        books.leases_granted(local, granted.collect());
        self.check_admitted(tenant, &objects);
        let mut rest = Vec::new();
        for (object, lease) in objects.iter().zip(answered) {
            let Some(lease) = lease else {
                rest.push(*object);
                continue;
            };
            let held = self.held_lease(node, tenant, lease, *object, now);
            self.verify(&held);
            self.nodes[node].leases.push(held);
            self.stats.covered.local_hits += 1;
        }
        if rest.is_empty() {
            return;
        }
        let count = rest.len();
        let request = DirectoryRequest::AcquireDelegating {
            objects: rest,
            mode,
        };
        self.send(node, request, Purpose::Acquire { count, tenant });
    }

    /// Releases at the directory what the node's delegations no longer need, and frees
    /// (and acknowledges) the owned replicas whose reclaim waited for their last reader.
    pub(super) fn send_delegation_releases(&mut self, node: usize) {
        let leases = self.nodes[node].core.delegations.take_releases();
        if !leases.is_empty() {
            self.send(node, DirectoryRequest::Release { leases }, Purpose::Plain);
        }
        let ready = self.nodes[node].core.delegations.take_reclaims_ready();
        let reclaimed: Vec<_> = ready
            .into_iter()
            .filter(|(replica, location)| self.reclaim(node, *replica, *location))
            .map(|(replica, _)| replica)
            .collect();
        self.send_reclaim_acks(node, &reclaimed);
    }

    /// The node's periodic delegation work: expiry, and the hits it answered reported.
    fn tidy_delegations(&mut self, node: usize) {
        let now = self.now;
        let delegations = &mut self.nodes[node].core.delegations;
        delegations.expire(now);
        let hits = delegations.take_hit_reports(BATCH_ITEMS_MAX as usize);
        self.send_delegation_releases(node);
        if !hits.is_empty() {
            self.send(node, DirectoryRequest::ReportHits { hits }, Purpose::Plain);
        }
    }

    fn release_one(&mut self, node: usize) {
        if self.nodes[node].leases.is_empty() {
            return;
        }
        let index = self.rng.below(self.nodes[node].leases.len() as u64) as usize;
        let held = self.nodes[node].leases.swap_remove(index);
        if held.trusted_until > self.now {
            self.verify(&held);
        }
        let now = self.now;
        let state = &mut self.nodes[node];
        let client = state.clients[held.tenant];
        if let Some(books) = client.and_then(|client| state.core.client(client)) {
            books.release(&[held.lease.lease], usize::MAX).ok();
        }
        if is_local(held.lease.lease) {
            state.core.delegations.release_local(now, held.lease.lease);
            return self.send_delegation_releases(node);
        }
        let request = DirectoryRequest::Release {
            leases: vec![held.lease.lease],
        };
        self.send(node, request, Purpose::Plain);
    }

    fn retire_one(&mut self, node: usize) {
        if self.nodes[node].committed.is_empty() {
            return;
        }
        let index = self.rng.below(self.nodes[node].committed.len() as u64) as usize;
        let (object, replica) = self.nodes[node].committed[index];
        let request = DirectoryRequest::Retire {
            object,
            replica,
            released: Vec::new(),
        };
        self.send(node, request, Purpose::Plain);
    }

    /// Offers every empty extent back to the directory, through the node core.
    fn return_empty_extents(&mut self, node: usize) {
        self.resolve_lost_returns(node);
        let domains: Vec<u32> = self.nodes[node].cxl.keys().copied().collect();
        for domain in domains {
            let Some(pool) = self.pool_of_domain(domain) else {
                continue;
            };
            let state = &mut self.nodes[node];
            let Some(allocator) = state.cxl.get_mut(&domain) else {
                continue;
            };
            let Some((offset_bytes, length_bytes)) = allocator.take_empty() else {
                continue;
            };
            let Some(operation) = state.core.begin_return(pool, offset_bytes, length_bytes) else {
                allocator.add_extent(offset_bytes, length_bytes).ok();
                continue;
            };
            let owner_word = self
                .owner_words
                .get(&domain)
                .and_then(|words| words.owner_word(offset_bytes / length_bytes.max(1)));
            let request = DirectoryRequest::ReturnExtent {
                operation,
                pool,
                offset_bytes,
                owner_word,
            };
            self.send(node, request, Purpose::Return { pool, offset_bytes });
        }
    }

    fn resolve_lost_returns(&mut self, node: usize) {
        let Some(session) = self.nodes[node].session else {
            return;
        };
        for (pool, offset_bytes, operation) in self.nodes[node].core.returns.unresolved() {
            let already = self.nodes[node].pending.values().any(|pending| {
                matches!(pending.request, DirectoryRequest::Resolve { operation: sent, .. } if sent == operation)
            });
            if !already {
                let request = DirectoryRequest::Resolve {
                    target: session,
                    operation,
                };
                self.send(node, request, Purpose::Return { pool, offset_bytes });
            }
        }
    }

    /// The directory's current id of the shared pool of `domain`.
    pub(super) fn pool_of_domain(&self, domain: u32) -> Option<PoolId> {
        self.cxl_pools
            .iter()
            .find(|(_, pool_domain)| **pool_domain == domain)
            .map(|(pool, _)| *pool)
    }

    /// Requests of node `node` whose replies are overdue: sent again, resolved, or given up.
    pub fn node_timeouts(&mut self, node: usize) {
        let Some(session) = self.nodes[node].session else {
            return;
        };
        if self.nodes[node].rejoin.is_some() {
            return;
        }
        let now = self.now;
        let due: Vec<u64> = self.nodes[node]
            .pending
            .iter()
            .filter(|(_, pending)| now.saturating_since(pending.sent_at) >= RETRY_AFTER)
            .map(|(request_id, _)| *request_id)
            .collect();
        for request_id in due {
            let Some(pending) = self.nodes[node].pending.remove(&request_id) else {
                continue;
            };
            let resolving = matches!(pending.request, DirectoryRequest::Resolve { .. });
            match operation_of(&pending.request) {
                // Like the node's link: a lost reply of an operation with an id is resolved,
                // never guessed.
                Some(operation) if !resolving => {
                    if let Purpose::Return { pool, offset_bytes } = pending.purpose {
                        // The extent stays out of the allocator until the return is resolved.
                        self.nodes[node]
                            .core
                            .returns
                            .answered(pool, offset_bytes, None);
                        self.stats.covered.extent_returns_quarantined += 1;
                    }
                    let request = DirectoryRequest::Resolve {
                        target: session,
                        operation,
                    };
                    self.send_attempt(node, request, pending.purpose, 1);
                }
                _ if pending.attempts < ATTEMPTS_MAX => {
                    self.send_attempt(node, pending.request, pending.purpose, pending.attempts + 1);
                }
                _ => self.gave_up(node, pending),
            }
        }
    }

    /// A request without an operation id went unanswered: its slots are given back.
    fn gave_up(&mut self, node: usize, pending: Pending) {
        match (pending.request, pending.purpose) {
            (
                DirectoryRequest::Acquire { .. } | DirectoryRequest::AcquireDelegating { .. },
                Purpose::Acquire { count, tenant },
            ) => {
                let state = &mut self.nodes[node];
                let client = state.clients[tenant];
                if let Some(books) = client.and_then(|client| state.core.client(client)) {
                    books.leases_granted(count, Vec::new());
                }
            }
            // A return still unknown stays quarantined and is resolved again later.
            (DirectoryRequest::Resolve { .. }, Purpose::Return { .. }) => {}
            (DirectoryRequest::Resolve { operation, .. }, purpose) => {
                self.resolved(node, operation, ResolveOutcome::Unknown, purpose);
            }
            _ => {}
        }
    }

    /// A reply for node `node` arrived.
    pub fn on_reply(&mut self, node: usize, request_id: u64, reply: DirectoryReply) {
        let Some(pending) = self.nodes[node].pending.remove(&request_id) else {
            return;
        };
        if let DirectoryReply::Error(ProtocolError::Directory(
            DirectoryError::Fenced { .. } | DirectoryError::UnknownSession,
        )) = reply
        {
            self.session_lost(node);
            return;
        }
        if let DirectoryReply::Error(ProtocolError::Directory(DirectoryError::Paced)) = reply {
            panic!(
                "seed={}: node {node}'s {:?} was paced: only rejoin reports are",
                self.stats.seed, pending.request
            );
        }
        if (0..self.nodes.len()).any(|other| other != node && self.nodes[other].rejoin.is_some()) {
            self.stats.covered.answered_beside_rejoins += 1;
        }
        match (pending.request, reply) {
            (DirectoryRequest::Resolve { operation, .. }, DirectoryReply::Resolved(outcome)) => {
                self.resolved(node, operation, outcome, pending.purpose)
            }
            (DirectoryRequest::Reserve { operation, .. }, reply) => {
                self.nodes[node].core.operations.end(operation);
                self.reserved(node, reply, pending.purpose)
            }
            (DirectoryRequest::Commit { operation, .. }, reply) => {
                self.nodes[node].core.operations.end(operation);
                let result = match reply {
                    DirectoryReply::Committed(outcome) => CommitResult::Applied(outcome),
                    _ => CommitResult::Refused,
                };
                self.committed(node, result, pending.purpose);
            }
            (DirectoryRequest::GrantExtent { operation, .. }, reply) => {
                self.nodes[node].core.operations.end(operation);
                if let DirectoryReply::Extent(grant) = reply {
                    self.extent_granted(node, grant);
                }
            }
            (DirectoryRequest::ReturnExtent { operation, .. }, reply) => {
                let answer = match reply {
                    DirectoryReply::ExtentReturned(answer) => answer,
                    _ => ExtentReturn::NotOwner,
                };
                self.extent_returned(node, operation, Some(answer), pending.purpose);
            }
            (DirectoryRequest::Acquire { objects, .. }, reply) => {
                self.acquired(node, &objects, reply, pending.purpose, pending.sent_at)
            }
            (DirectoryRequest::AcquireDelegating { objects, .. }, reply) => {
                let reply = self.take_delegations(node, &objects, reply, pending.sent_at);
                self.acquired(node, &objects, reply, pending.purpose, pending.sent_at)
            }
            (DirectoryRequest::PollTasks { .. }, DirectoryReply::Tasks(tasks)) => {
                self.run_tasks(node, tasks, pending.sent_at)
            }
            (DirectoryRequest::Heartbeat { .. }, DirectoryReply::Alive(_)) => {
                self.nodes[node].core.liveness.answered(pending.sent_at);
            }
            _ => {}
        }
    }

    fn resolved(
        &mut self,
        node: usize,
        operation: OperationId,
        outcome: ResolveOutcome,
        purpose: Purpose,
    ) {
        match (outcome, purpose) {
            (outcome, Purpose::Return { pool, offset_bytes }) => {
                let action =
                    self.nodes[node]
                        .core
                        .return_resolved(pool, offset_bytes, operation, outcome);
                self.apply_extent_action(node, action);
            }
            (ResolveOutcome::Reserved(reserved), purpose) => {
                self.nodes[node].core.operations.end(operation);
                self.reserved(node, DirectoryReply::Reserved(reserved), purpose);
            }
            (outcome, purpose @ Purpose::Commit { .. }) => {
                self.nodes[node].core.operations.end(operation);
                let result = match outcome {
                    ResolveOutcome::Committed(outcome) => CommitResult::Applied(outcome),
                    ResolveOutcome::NotApplied => CommitResult::NotApplied,
                    _ => CommitResult::Unknown,
                };
                self.committed(node, result, purpose);
            }
            (ResolveOutcome::ExtentGranted(grant), _) => {
                self.nodes[node].core.operations.end(operation);
                self.extent_granted(node, grant);
            }
            (
                _,
                Purpose::Store {
                    ticket,
                    tenant,
                    early,
                    ..
                },
            ) => {
                self.nodes[node].core.operations.end(operation);
                self.end_early_store(node, tenant, ticket, early);
            }
            (_, Purpose::Restore { object }) => {
                self.nodes[node].core.operations.end(operation);
                self.restore_ended(node, &object);
            }
            _ => self.nodes[node].core.operations.end(operation),
        }
    }
}

/// The operation id a request carries, if any.
pub(super) fn operation_of(request: &DirectoryRequest) -> Option<OperationId> {
    match request {
        DirectoryRequest::Reserve { operation, .. }
        | DirectoryRequest::Commit { operation, .. }
        | DirectoryRequest::GrantExtent { operation, .. }
        | DirectoryRequest::ReturnExtent { operation, .. }
        | DirectoryRequest::Resolve { operation, .. } => Some(*operation),
        _ => None,
    }
}
