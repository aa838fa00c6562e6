//! The directory: the metadata authority of a kvtier cluster, as a sans-I/O state machine.
//!
//! It owns objects and their replicas, pools and their budgets, nodes, sessions and epochs,
//! read leases, the publication state machine and the reclaim task queues. It never
//! touches KV bytes, never reads a clock (every method that depends on time takes `now`),
//! never sleeps and never spawns: the directory actor calls it and sends what it returns.
//!
//! The invariants it keeps (DESIGN.md section 4) are checked by [`Directory::check_invariants`]
//! after every step of the property and simulation tests:
//! READY means committed; content is immutable; acquire atomically checks READY and
//! accessibility and takes a lease; retiring blocks acquires and storage is freed only
//! after the last release and the owner's reclaim acknowledgement; stale ids are refused;
//! a replica in a pool the requester cannot map is never a hit; epochs and operation ids
//! fence retries; a silent node's replicas are hidden but freed only once it is fenced.

pub mod config;
mod demotion;
pub mod error;
mod expiry;
mod invariants;
mod leases;
pub mod ledger;
pub mod ops;
mod pools;
mod replicas;
mod sessions;

pub use config::DirectoryConfig;
pub use error::{DirectoryError, Table};
pub use ops::*;
pub use replicas::ReplicaState;
pub use sessions::SessionState;

use crate::model::{
    Epoch, LeaseId, Location, Medium, NamespaceDescriptor, NamespaceId, NodeId, ObjectId,
    OperationId, PoolId, PoolSpec, PoolUsage, ReplicaId, Scope, SessionId, TaskId, Timestamp,
};
use crate::policy::history::{frequency_class, History, FREQUENCY_CLASSES};
use crate::policy::profiles::{Measurement, TierKind, TierProfile};
use crate::policy::victims::{self, VictimCandidate, VictimConfig};
use leases::{LeaseRecord, LeaseTable};
use ledger::{Ledger, LedgerCheck, LedgerEntry};
use pools::PoolRecord;
use replicas::{NewReplica, ReplicaTable};
use sessions::{NodeRecord, Session};
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

/// Largest accepted object, in bytes: a chunk of KV state is megabytes, never terabytes.
pub const OBJECT_BYTES_MAX: u64 = 1 << 32;
/// Extents of one shared pool: 65536 extents of 64 MiB cover 4 TiB of CXL memory.
pub const EXTENTS_PER_POOL_MAX: u64 = 1 << 16;
/// Longest accepted node or pool name, in bytes (it becomes a metrics label).
pub const NAME_BYTES_MAX: usize = 128;

/// A change of a session's state made by [`Directory::tick`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionTransition {
    pub session: SessionId,
    pub node: NodeId,
    pub state: SessionState,
}

/// What one [`Directory::tick`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    pub expired_leases: u32,
    pub expired_reservations: u32,
    /// READY replicas the eviction policy chose under pressure (retired, or demoted one
    /// tier colder).
    pub evicted: u32,
    /// READY replicas that outlived their tier's time to live (retired or demoted).
    pub expired: u32,
    pub transitions: Vec<SessionTransition>,
}

/// Counts for metrics, cheap to compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectoryCounts {
    pub objects: u64,
    pub replicas: u64,
    pub leases: u64,
    pub sessions_live: u64,
    pub sessions_suspect: u64,
    pub sessions_fenced: u64,
}

/// One registered pool's description and usage.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolReport {
    pub pool: PoolId,
    pub spec: PoolSpec,
    pub usage: PoolUsage,
    /// The profile the policy prices the pool by.
    pub profile: TierProfile,
}

/// The directory state machine. See the module documentation for its contract.
pub struct Directory {
    config: DirectoryConfig,
    replicas: ReplicaTable,
    leases: LeaseTable,
    pools: Vec<PoolRecord>,
    pool_ids: HashMap<(Scope, String), PoolId>,
    nodes: Vec<NodeRecord>,
    node_ids: HashMap<String, NodeId>,
    sessions: HashMap<SessionId, Session, foldhash::fast::RandomState>,
    /// Fenced or closed sessions kept for `resolve`, oldest first.
    retired_sessions: VecDeque<SessionId>,
    next_session: u64,
    next_task: u64,
    namespaces: HashMap<NamespaceId, NamespaceDescriptor>,
    /// Reservation deadlines in grant order (all reservations have the same duration).
    /// Entries of committed or aborted reservations are skipped; the queue holds at most
    /// one entry per reservation granted within `reservation_duration`.
    reservation_deadlines: VecDeque<(Timestamp, ReplicaId)>,
    /// Evictions started outside `tick` (by a reserve that found no room), reported by the
    /// next `tick`.
    evictions_unreported: u32,
    /// The `now` of the latest `tick`: the time of operations that take none.
    latest_tick: Timestamp,
    /// Demotions in flight: target reservation → source replica (bounded by the owners'
    /// reservations), and the sources, which eviction does not choose again.
    demotions: HashMap<ReplicaId, ReplicaId>,
    demoting: HashSet<ReplicaId>,
    /// Accesses per object (reads and stores), kept past eviction, and the reuse
    /// probability per frequency class learned from them. Bounded by
    /// [`crate::policy::history::HISTORY_ENTRIES_MAX`].
    history: History,
}

impl Directory {
    /// An empty directory.
    pub fn new(config: DirectoryConfig) -> Directory {
        Directory {
            replicas: ReplicaTable::new(config.replicas_max, config.hash_seed),
            leases: LeaseTable::new(config.leases_max),
            pools: Vec::new(),
            pool_ids: HashMap::new(),
            nodes: Vec::new(),
            node_ids: HashMap::new(),
            sessions: HashMap::default(),
            retired_sessions: VecDeque::new(),
            next_session: 1,
            next_task: 1,
            namespaces: HashMap::new(),
            reservation_deadlines: VecDeque::new(),
            evictions_unreported: 0,
            latest_tick: Timestamp::ZERO,
            demotions: HashMap::new(),
            demoting: HashSet::new(),
            history: History::new(),
            config,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &DirectoryConfig {
        &self.config
    }

    // ----- sessions -------------------------------------------------------------------

    /// Opens a session for a node. A node opening again gets a larger epoch and its
    /// previous session is fenced (its host pools dropped, its leases and reservations
    /// void), so nothing the old incarnation sends can change state any more.
    pub fn open(
        &mut self,
        now: Timestamp,
        request: OpenRequest,
    ) -> Result<OpenReply, DirectoryError> {
        if request.node_name.is_empty() || request.node_name.len() > NAME_BYTES_MAX {
            return Err(DirectoryError::InvalidPool(
                "node name empty or too long".into(),
            ));
        }
        let open_sessions = self
            .sessions
            .values()
            .filter(|session| session.is_open())
            .count();
        let node = match self.node_ids.get(&request.node_name) {
            Some(node) => *node,
            None => {
                if self.nodes.len() >= self.config.nodes_max as usize {
                    return Err(DirectoryError::Full(Table::Nodes));
                }
                let node = NodeId(self.nodes.len() as u32);
                self.nodes.push(NodeRecord {
                    epoch: Epoch(0),
                    session: None,
                    tasks: VecDeque::new(),
                    handed_out: VecDeque::new(),
                });
                self.node_ids.insert(request.node_name.clone(), node);
                node
            }
        };
        let previous = self.nodes[node.0 as usize].session;
        let replaces_open =
            previous.is_some_and(|id| self.sessions.get(&id).is_some_and(Session::is_open));
        if !replaces_open && open_sessions >= self.config.sessions_max as usize {
            return Err(DirectoryError::Full(Table::Sessions));
        }
        if let Some(previous) = previous {
            self.end_session(now, previous, SessionState::Fenced);
        }
        let session = SessionId(self.next_session);
        self.next_session += 1;
        let record = &mut self.nodes[node.0 as usize];
        record.epoch = Epoch(record.epoch.0 + 1);
        record.session = Some(session);
        let epoch = record.epoch;
        self.sessions.insert(
            session,
            Session {
                node,
                epoch,
                state: SessionState::Live,
                last_heartbeat: now,
                write_order: distinct_media(&request.write_order),
                read_order: distinct_media(&request.read_order),
                domains: request.domains,
                namespaces: request.namespaces,
                ledger: Ledger::new(self.config.ledger_entries_per_session_max as usize),
                leases: 0,
                reservations: HashSet::new(),
            },
        );
        Ok(OpenReply {
            session,
            node,
            epoch,
            fenced_session: previous,
            lease_duration_ms: self.config.lease_duration.as_millis() as u64,
            heartbeat_interval_ms: (self.config.suspect_after.as_millis() / 3) as u64,
        })
    }

    /// Records a heartbeat: a suspect session becomes live again (its replicas reappear).
    /// `acknowledged_through`, when given, drops ledger entries the node no longer needs.
    pub fn heartbeat(
        &mut self,
        now: Timestamp,
        session: SessionId,
        acknowledged_through: Option<OperationId>,
    ) -> Result<Epoch, DirectoryError> {
        let record = self.open_session_mut(session)?;
        record.last_heartbeat = now;
        record.state = SessionState::Live;
        if let Some(through) = acknowledged_through {
            record.ledger.acknowledge(through);
        }
        Ok(record.epoch)
    }

    /// Closes a drained session (no leases, no reservations). Its host pools and their
    /// replicas are dropped: the node is leaving.
    pub fn close(&mut self, now: Timestamp, session: SessionId) -> Result<(), DirectoryError> {
        let record = self.open_session(session)?;
        if record.leases > 0 || !record.reservations.is_empty() {
            return Err(DirectoryError::NotDrained {
                leases: record.leases,
                reservations: record.reservations.len() as u32,
            });
        }
        self.end_session(now, session, SessionState::Closed);
        Ok(())
    }

    fn open_session(&self, session: SessionId) -> Result<&Session, DirectoryError> {
        match self.sessions.get(&session) {
            None => Err(DirectoryError::UnknownSession),
            Some(record) if !record.is_open() => Err(DirectoryError::Fenced {
                epoch: record.epoch,
            }),
            Some(record) => Ok(record),
        }
    }

    fn open_session_mut(&mut self, session: SessionId) -> Result<&mut Session, DirectoryError> {
        match self.sessions.get_mut(&session) {
            None => Err(DirectoryError::UnknownSession),
            Some(record) if !record.is_open() => Err(DirectoryError::Fenced {
                epoch: record.epoch,
            }),
            Some(record) => Ok(record),
        }
    }

    /// Ends a session: voids its leases, aborts its reservations, drops its host pools
    /// with their replicas, and keeps the record (with its ledger) for `resolve`.
    fn end_session(&mut self, now: Timestamp, session: SessionId, state: SessionState) {
        let Some(record) = self.sessions.get_mut(&session) else {
            return;
        };
        if !record.is_open() {
            return;
        }
        record.state = state;
        let node = record.node;
        let reservations: Vec<ReplicaId> = record.reservations.drain().collect();
        // Leases on shared-pool replicas stay until their deadline: the node's engines map
        // that memory themselves and may still read under them. Leases on this node's own
        // pools go with the pools.
        let pools = &self.pools;
        let replicas = &self.replicas;
        let leases: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.session == session)
            .filter(|(_, lease)| {
                replicas
                    .get(lease.replica)
                    .is_none_or(|replica| pools[replica.pool.0 as usize].extents.is_none())
            })
            .map(|(id, _)| id)
            .collect();
        for lease in &leases {
            self.drop_lease(*lease);
        }
        if let Some(record) = self.sessions.get_mut(&session) {
            record.leases -= leases.len() as u32;
        }
        let cool_until = now + self.config.reservation_duration;
        for replica in reservations {
            self.abort_reservation(replica);
        }
        for record in &mut self.pools {
            if let Some(extents) = &mut record.extents {
                extents.release_empty(session, cool_until);
            }
        }
        let dropped: Vec<PoolId> = (0..self.pools.len())
            .filter(|&index| self.pools[index].owner_session == Some(session))
            .map(|index| PoolId(index as u32))
            .collect();
        for pool in &dropped {
            self.pools[pool.0 as usize].owner_session = None;
        }
        if !dropped.is_empty() {
            let doomed: Vec<ReplicaId> = self
                .replicas
                .iter()
                .filter(|(_, replica)| dropped.contains(&replica.pool))
                .map(|(id, _)| id)
                .collect();
            for replica in doomed {
                self.free_replica(replica);
            }
        }
        let node_record = &mut self.nodes[node.0 as usize];
        if node_record.session == Some(session) {
            node_record.session = None;
            let pending: Vec<Task> = node_record
                .tasks
                .drain(..)
                .chain(node_record.handed_out.drain(..).map(|(_, task)| task))
                .collect();
            for task in pending {
                // A demotion's target was one of the session's reservations: aborted above.
                let TaskKind::Reclaim { replica, location } = task.kind else {
                    continue;
                };
                let waiting = self.replicas.get(replica).is_some_and(|record| {
                    record.state == ReplicaState::Retiring && record.lease_count == 0
                });
                if dropped.contains(&location.pool) || !waiting {
                    continue;
                }
                // The session that owned the extent is gone: nobody else will free it.
                if self
                    .replicas
                    .get(replica)
                    .is_some_and(|record| self.reclaimed_by_directory(record))
                {
                    self.free_replica(replica);
                } else {
                    self.nodes[node.0 as usize].tasks.push_back(task);
                }
            }
        }
        self.retired_sessions.push_back(session);
        // Forget the oldest ended sessions, except one still holding (shared-pool) leases:
        // those expire within `lease_duration`, so the excess is bounded by that window.
        let mut kept = VecDeque::new();
        while self.retired_sessions.len() + kept.len() > self.config.retired_sessions_max as usize {
            let Some(oldest) = self.retired_sessions.pop_front() else {
                break;
            };
            if self
                .sessions
                .get(&oldest)
                .is_some_and(|record| record.leases > 0)
            {
                kept.push_back(oldest);
            } else {
                self.sessions.remove(&oldest);
            }
        }
        while let Some(session) = kept.pop_back() {
            self.retired_sessions.push_front(session);
        }
    }

    // ----- pools and namespaces --------------------------------------------------------

    /// Registers a pool. A host pool must belong to the session's node; a node
    /// re-registering the same pool name after a restart gets the same pool id back.
    /// A shared (domain) pool is registered by the directory itself with `session = None`.
    pub fn register_pool(
        &mut self,
        session: Option<SessionId>,
        spec: PoolSpec,
    ) -> Result<PoolId, DirectoryError> {
        if spec.capacity_bytes == 0 {
            return Err(DirectoryError::InvalidPool("zero capacity".into()));
        }
        match (spec.scope, spec.extent_bytes) {
            (Scope::Host(_), None) => {}
            (Scope::Domain(_), Some(extent_bytes))
                if extent_bytes > 0
                    && extent_bytes % spec.page_bytes.max(1) == 0
                    && spec.capacity_bytes / extent_bytes >= 1
                    && spec.capacity_bytes / extent_bytes <= EXTENTS_PER_POOL_MAX => {}
            _ => {
                return Err(DirectoryError::InvalidPool(format!(
                    "a shared pool needs extents (a multiple of the page size, at most {EXTENTS_PER_POOL_MAX} per pool); a host pool has none"
                )))
            }
        }
        if !spec.page_bytes.is_power_of_two() || spec.page_bytes > spec.capacity_bytes {
            return Err(DirectoryError::InvalidPool(
                "page size must be a power of two within capacity".into(),
            ));
        }
        if spec.name.is_empty() || spec.name.len() > NAME_BYTES_MAX {
            return Err(DirectoryError::InvalidPool(
                "pool name empty or too long".into(),
            ));
        }
        match (session, spec.scope) {
            (Some(session), Scope::Host(node)) => {
                if self.open_session(session)?.node != node {
                    return Err(DirectoryError::InvalidPool(
                        "host pool of another node".into(),
                    ));
                }
            }
            (None, Scope::Domain(_)) => {}
            _ => {
                return Err(DirectoryError::InvalidPool(
                    "host pools come from their node, shared pools from the directory".into(),
                ))
            }
        }
        // A shared pool holds whole extents only: a tail no extent covers is not capacity.
        let mut spec = spec;
        if let Some(extent_bytes) = spec.extent_bytes {
            spec.capacity_bytes -= spec.capacity_bytes % extent_bytes;
        }
        let key = (spec.scope, spec.name.clone());
        if let Some(&pool) = self.pool_ids.get(&key) {
            let record = &mut self.pools[pool.0 as usize];
            if record.owner_session.is_some()
                || record.reserved_bytes + record.ready_bytes + record.retiring_bytes > 0
            {
                if record.spec == spec && record.owner_session == session {
                    return Ok(pool);
                }
                return Err(DirectoryError::InvalidPool(
                    "pool already registered and in use".into(),
                ));
            }
            let profile = self.config.baseline_profile(spec.medium);
            *record = PoolRecord::new(spec, session, profile);
            return Ok(pool);
        }
        if self.pools.len() >= self.config.pools_max as usize {
            return Err(DirectoryError::Full(Table::Pools));
        }
        let pool = PoolId(self.pools.len() as u32);
        let profile = self.config.baseline_profile(spec.medium);
        self.pools.push(PoolRecord::new(spec, session, profile));
        self.pool_ids.insert(key, pool);
        Ok(pool)
    }

    /// Records what `session`'s node measured of `pool`, a pool it maps: the policy prices
    /// the pool by it from now on, except for figures the operator overrides. Returns the
    /// profile in force.
    pub fn report_profile(
        &mut self,
        session: SessionId,
        pool: PoolId,
        measured: Measurement,
    ) -> Result<TierProfile, DirectoryError> {
        let record = self.open_session(session)?;
        let target = self
            .pools
            .get(pool.0 as usize)
            .ok_or(DirectoryError::UnknownPool)?;
        let maps = match target.spec.scope {
            Scope::Host(node) => node == record.node && target.owner_session == Some(session),
            Scope::Domain(domain) => record.domains.contains(&domain),
        };
        if !maps {
            return Err(DirectoryError::InvalidPool(
                "a profile of a pool this node does not map".into(),
            ));
        }
        let medium = target.spec.medium;
        let representative = TierProfile::representative(TierKind::of_medium(medium));
        let mut profile = measured
            .figures()
            .apply(&representative)
            .map_err(|error| DirectoryError::InvalidProfile(error.to_string()))?;
        if let Some(overrides) = self.config.profiles.get(&medium) {
            profile = overrides
                .apply(&profile)
                .map_err(|error| DirectoryError::InvalidProfile(error.to_string()))?;
        }
        self.pools[pool.0 as usize].profile = profile.clone();
        Ok(profile)
    }

    /// Registers a namespace (idempotent) after validating its descriptor.
    pub fn register_namespace(
        &mut self,
        session: SessionId,
        descriptor: NamespaceDescriptor,
    ) -> Result<NamespaceId, DirectoryError> {
        let record = self.open_session(session)?;
        let id = descriptor.id().map_err(DirectoryError::InvalidNamespace)?;
        if !permits(&record.namespaces, &descriptor) {
            return Err(DirectoryError::NamespaceDenied);
        }
        if !self.namespaces.contains_key(&id) {
            if self.namespaces.len() >= self.config.namespaces_max as usize {
                return Err(DirectoryError::Full(Table::Namespaces));
            }
            self.namespaces.insert(id, descriptor);
        }
        Ok(id)
    }

    fn check_namespace(
        &self,
        session: &Session,
        namespace: NamespaceId,
    ) -> Result<(), DirectoryError> {
        match self.namespaces.get(&namespace) {
            None => Err(DirectoryError::UnknownNamespace),
            Some(descriptor) if !permits(&session.namespaces, descriptor) => {
                Err(DirectoryError::NamespaceDenied)
            }
            Some(_) => Ok(()),
        }
    }

    /// Checks every item's namespace, looking up each distinct namespace once in a run.
    fn check_namespaces(
        &self,
        session: &Session,
        objects: impl Iterator<Item = NamespaceId>,
    ) -> Result<(), DirectoryError> {
        let mut last_checked = None;
        for namespace in objects {
            if last_checked != Some(namespace) {
                self.check_namespace(session, namespace)?;
                last_checked = Some(namespace);
            }
        }
        Ok(())
    }

    fn check_batch(&self, items: usize) -> Result<(), DirectoryError> {
        let max = self.config.batch_items_max as usize;
        if items > max {
            return Err(DirectoryError::BatchTooLarge { items, max });
        }
        Ok(())
    }

    /// What `session` can read, pool by pool: a host pool only by its own node while the
    /// owner session is live; a domain pool by every node of the domain. Computed once per
    /// request, so per-object checks are an array index.
    fn read_view(&self, session: &Session) -> ReadView {
        ReadView {
            ranks: self
                .pools
                .iter()
                .map(|record| {
                    let readable = match record.spec.scope {
                        Scope::Host(owner) => {
                            owner == session.node
                                && record
                                    .owner_session
                                    .and_then(|owner_session| self.sessions.get(&owner_session))
                                    .is_some_and(|owner_session| {
                                        owner_session.state == SessionState::Live
                                    })
                        }
                        Scope::Domain(domain) => session.domains.contains(&domain),
                    };
                    readable.then(|| session.read_rank(record.spec.medium))
                })
                .collect(),
        }
    }

    fn can_write(&self, session_id: SessionId, session: &Session, pool: PoolId) -> bool {
        let record = &self.pools[pool.0 as usize];
        match record.spec.scope {
            Scope::Host(owner) => owner == session.node && record.owner_session == Some(session_id),
            Scope::Domain(domain) => session.domains.contains(&domain),
        }
    }

    // ----- store: reserve, commit, resolve ---------------------------------------------

    /// Grants capacity for one object in the first pool of the node's write order that
    /// has room. Idempotent by operation id. A replica the node can already read makes
    /// the store unnecessary (`AlreadyPresent` or `Pending`); no room anywhere is `Skip`.
    pub fn reserve(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        operation: OperationId,
        item: ReserveItem,
    ) -> Result<ReserveOutcome, DirectoryError> {
        let session = self.open_session(session_id)?;
        let recorded = replayed(session, operation, |entry| match entry {
            LedgerEntry::Reserve(outcome) => Some(outcome),
            _ => None,
        })?;
        if let Some(outcome) = recorded {
            return Ok(outcome);
        }
        if item.length_bytes == 0 || item.length_bytes > OBJECT_BYTES_MAX {
            return Err(DirectoryError::InvalidLength {
                length_bytes: item.length_bytes,
            });
        }
        self.check_namespace(session, item.object.namespace)?;
        let mut present = None;
        let outcome = match self.existing_for(session, &item.object) {
            Some((outcome, ready)) => {
                present = ready;
                outcome
            }
            None => match self.place(session_id, session, item.length_bytes) {
                None => ReserveOutcome::Skip,
                Some((pool, allocated_bytes)) => {
                    if !self.replicas.has_room() {
                        return Err(DirectoryError::Full(Table::Replicas));
                    }
                    if session.reservations.len()
                        >= self.config.reservations_per_session_max as usize
                    {
                        return Err(DirectoryError::Full(Table::Reservations));
                    }
                    let deadline = now + self.config.reservation_duration;
                    let replica = self.replicas.insert(NewReplica {
                        object: item.object,
                        pool,
                        owner: session.node,
                        length_bytes: item.length_bytes,
                        allocated_bytes,
                        deadline,
                    });
                    let record = &mut self.pools[pool.0 as usize];
                    record.reserve(allocated_bytes);
                    let medium = record.spec.medium;
                    self.reservation_deadlines.push_back((deadline, replica));
                    self.compact_reservation_deadlines();
                    if let Some(session) = self.sessions.get_mut(&session_id) {
                        session.reservations.insert(replica);
                    }
                    ReserveOutcome::Granted {
                        replica,
                        pool,
                        medium,
                        allocated_bytes,
                    }
                }
            },
        };
        // A store is an access: the engine needed the chunk (and a READY copy it did not
        // look for is as good as read).
        let class = self.record_access(now, &item.object);
        if let Some(ready) = present {
            if let Some(replica) = self.replicas.get_mut(ready) {
                replica.last_access = now;
            }
            self.replicas.touch(ready, class);
        }
        if outcome == ReserveOutcome::Skip {
            // Make room now rather than at the next tick: this store is skipped, the next
            // ones find the space once the owners reclaim.
            self.evictions_unreported += self.evict(now);
        }
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session
                .ledger
                .record(operation, LedgerEntry::Reserve(outcome));
        }
        Ok(outcome)
    }

    /// `AlreadyPresent` (with the READY replica) or `Pending` when the session can already
    /// read the object.
    fn existing_for(
        &self,
        session: &Session,
        object: &ObjectId,
    ) -> Option<(ReserveOutcome, Option<ReplicaId>)> {
        let view = self.read_view(session);
        let mut pending = false;
        for (id, replica) in self.replicas.of_object(object) {
            if view.rank(replica.pool).is_none() {
                continue;
            }
            match replica.state {
                ReplicaState::Ready => return Some((ReserveOutcome::AlreadyPresent, Some(id))),
                ReplicaState::Reserved => pending = true,
                ReplicaState::Retiring | ReplicaState::Free => {}
            }
        }
        pending.then_some((ReserveOutcome::Pending, None))
    }

    /// The first writable pool in the node's write order with room for `length_bytes`.
    fn place(
        &self,
        session_id: SessionId,
        session: &Session,
        length_bytes: u64,
    ) -> Option<(PoolId, u64)> {
        session.write_order.iter().find_map(|medium| {
            self.pools.iter().enumerate().find_map(|(index, record)| {
                let pool = PoolId(index as u32);
                let bytes = record.spec.rounded_bytes(length_bytes);
                (record.spec.medium == *medium
                    && self.can_write(session_id, session, pool)
                    && record.free_bytes() >= bytes)
                    .then_some((pool, bytes))
            })
        })
    }

    /// Publishes a written replica: READY, visible to every reader its pool admits.
    /// Idempotent by operation id. If a READY replica of the object already exists in the
    /// same placement scope, this one is aborted and `AlreadyPresent` returned.
    pub fn commit(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        operation: OperationId,
        replica_id: ReplicaId,
        location: Location,
    ) -> Result<CommitOutcome, DirectoryError> {
        let session = self.open_session(session_id)?;
        let recorded = replayed(session, operation, |entry| match entry {
            LedgerEntry::Commit(outcome) => Some(outcome),
            _ => None,
        })?;
        if let Some(outcome) = recorded {
            return Ok(outcome);
        }
        let replica = self
            .replicas
            .get(replica_id)
            .ok_or(DirectoryError::UnknownReplica(replica_id))?;
        if replica.owner != session.node || !session.reservations.contains(&replica_id) {
            return Err(DirectoryError::NotOwner(replica_id));
        }
        if replica.state != ReplicaState::Reserved {
            return Err(DirectoryError::InvalidState {
                replica: replica_id,
                state: replica.state.name().into(),
                needed: "reserved".into(),
            });
        }
        let pool = &self.pools[replica.pool.0 as usize];
        if location.pool != replica.pool
            || location.length_bytes != replica.length_bytes
            || location
                .offset_bytes
                .checked_add(replica.allocated_bytes)
                .is_none_or(|end| end > pool.spec.capacity_bytes)
        {
            return Err(DirectoryError::LocationMismatch(replica_id));
        }
        if let Some(extents) = &pool.extents {
            if extents
                .owned_extent(location.offset_bytes, replica.allocated_bytes, session_id)
                .is_none()
            {
                return Err(DirectoryError::LocationMismatch(replica_id));
            }
        }
        let scope = pool.spec.scope;
        let object = replica.object;
        let duplicate = self.replicas.of_object(&object).any(|(other, candidate)| {
            other != replica_id
                && candidate.state == ReplicaState::Ready
                && self.pools[candidate.pool.0 as usize].spec.scope == scope
        });
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.reservations.remove(&replica_id);
        }
        let outcome = if duplicate {
            self.abort_reservation(replica_id);
            CommitOutcome::AlreadyPresent
        } else {
            if let Some(replica) = self.replicas.get_mut(replica_id) {
                replica.state = ReplicaState::Ready;
                replica.allocation = location.allocation;
                replica.generation = location.generation;
                replica.offset_bytes = location.offset_bytes;
                replica.last_access = now;
                let bytes = replica.allocated_bytes;
                let record = &mut self.pools[location.pool.0 as usize];
                record.commit(bytes);
                if let Some(extents) = &mut record.extents {
                    extents.add_replica(location.offset_bytes);
                }
            }
            let class = self.access_class(&object);
            self.replicas.touch(replica_id, class);
            self.finish_demotion(replica_id);
            CommitOutcome::Committed
        };
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session
                .ledger
                .record(operation, LedgerEntry::Commit(outcome));
        }
        Ok(outcome)
    }

    /// Tells a node what became of an operation whose reply it lost, in `target` (its
    /// current session or one it had before). An operation not yet seen in an open session
    /// is burnt, so its late arrival is refused and the answer `NotApplied` stays true.
    pub fn resolve(
        &mut self,
        session_id: SessionId,
        target: SessionId,
        operation: OperationId,
    ) -> Result<ResolveOutcome, DirectoryError> {
        let node = self.open_session(session_id)?.node;
        let Some(record) = self.sessions.get_mut(&target) else {
            return Ok(ResolveOutcome::Unknown);
        };
        if record.node != node {
            return Err(DirectoryError::ForeignSession);
        }
        if record.ledger.is_acknowledged(operation) {
            return Ok(ResolveOutcome::Unknown);
        }
        Ok(match record.ledger.get(operation) {
            Some(LedgerEntry::Reserve(outcome)) => ResolveOutcome::Reserved(outcome),
            Some(LedgerEntry::Commit(outcome)) => ResolveOutcome::Committed(outcome),
            Some(LedgerEntry::Extent(grant)) => ResolveOutcome::ExtentGranted(grant),
            Some(LedgerEntry::ExtentReturn(answer)) => ResolveOutcome::ExtentReturned(answer),
            Some(LedgerEntry::Burnt) => ResolveOutcome::NotApplied,
            None if !record.is_open() => ResolveOutcome::NotApplied,
            None => match record.ledger.check(operation) {
                LedgerCheck::New => {
                    record.ledger.record(operation, LedgerEntry::Burnt);
                    ResolveOutcome::NotApplied
                }
                LedgerCheck::Full => return Err(DirectoryError::Full(Table::Ledger)),
                LedgerCheck::Recorded(_) | LedgerCheck::Acknowledged => ResolveOutcome::Unknown,
            },
        })
    }

    /// Drops the deadline entries of reservations that were committed or aborted once they
    /// outnumber the live ones, which bounds the queue at twice the live reservations
    /// (each bounded per session) plus a constant.
    fn compact_reservation_deadlines(&mut self) {
        let live: usize = self
            .sessions
            .values()
            .map(|session| session.reservations.len())
            .sum();
        if self.reservation_deadlines.len() > 2 * live + 1024 {
            let replicas = &self.replicas;
            self.reservation_deadlines.retain(|(_, replica)| {
                replicas
                    .get(*replica)
                    .is_some_and(|record| record.state == ReplicaState::Reserved)
            });
        }
    }

    /// Gives a reservation back unwritten (the node could not allocate, or the engine
    /// abandoned the store). Idempotent: an unknown or already resolved reservation is
    /// `Unknown`.
    pub fn abort(
        &mut self,
        session_id: SessionId,
        replica: ReplicaId,
    ) -> Result<AbortOutcome, DirectoryError> {
        let session = self.open_session_mut(session_id)?;
        if !session.reservations.remove(&replica) {
            return Ok(AbortOutcome::Unknown);
        }
        self.abort_reservation(replica);
        Ok(AbortOutcome::Aborted)
    }

    /// Returns a reservation's bytes and removes it. Safe because no reader saw it.
    fn abort_reservation(&mut self, replica_id: ReplicaId) {
        let Some(replica) = self.replicas.get(replica_id) else {
            return;
        };
        if replica.state != ReplicaState::Reserved {
            return;
        }
        let (pool, bytes) = (replica.pool, replica.allocated_bytes);
        self.pools[pool.0 as usize].abort(bytes);
        self.replicas.remove(replica_id);
        self.cancel_demotion(replica_id);
    }

    // ----- load: probe, acquire, release -----------------------------------------------

    /// For each object, in order: a hit when a READY replica the requester can map exists,
    /// pending when one is being written, else a miss. Reserves and leases nothing.
    pub fn probe(
        &self,
        session_id: SessionId,
        objects: &[ObjectId],
    ) -> Result<Vec<ProbeOutcome>, DirectoryError> {
        self.check_batch(objects.len())?;
        let session = self.open_session(session_id)?;
        self.check_namespaces(session, objects.iter().map(|object| object.namespace))?;
        let view = self.read_view(session);
        Ok(objects
            .iter()
            .map(|object| {
                let mut pending = false;
                let mut best: Option<(usize, Medium, u64)> = None;
                for (_, replica) in self.replicas.of_object(object) {
                    let Some(rank) = view.rank(replica.pool) else {
                        continue;
                    };
                    match replica.state {
                        ReplicaState::Ready => {
                            if best.is_none_or(|(best_rank, ..)| rank < best_rank) {
                                let medium = self.pools[replica.pool.0 as usize].spec.medium;
                                best = Some((rank, medium, replica.length_bytes));
                            }
                        }
                        ReplicaState::Reserved => pending = true,
                        ReplicaState::Retiring | ReplicaState::Free => {}
                    }
                }
                match best {
                    Some((_, medium, length_bytes)) => ProbeOutcome::Hit {
                        medium,
                        length_bytes,
                    },
                    None if pending => ProbeOutcome::Pending,
                    None => ProbeOutcome::Miss,
                }
            })
            .collect())
    }

    /// The cheapest READY replica of `object` the session can map.
    fn select_replica(&self, view: &ReadView, object: &ObjectId) -> Option<ReplicaId> {
        self.replicas
            .of_object(object)
            .filter(|(_, replica)| replica.state == ReplicaState::Ready)
            .filter_map(|(id, replica)| view.rank(replica.pool).map(|rank| (rank, id)))
            .min_by_key(|(rank, _)| *rank)
            .map(|(_, id)| id)
    }

    /// Leases, for each object in order, the cheapest READY replica the requester can map.
    /// The check and the lease are one step: no retire can come between them. In
    /// `Manifest` mode, one miss means no item is leased (`Withheld`).
    pub fn acquire(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        objects: &[ObjectId],
        mode: AcquireMode,
    ) -> Result<Vec<AcquireOutcome>, DirectoryError> {
        self.check_batch(objects.len())?;
        let session = self.open_session(session_id)?;
        self.check_namespaces(session, objects.iter().map(|object| object.namespace))?;
        let view = self.read_view(session);
        let selected: Vec<Option<ReplicaId>> = objects
            .iter()
            .map(|object| self.select_replica(&view, object))
            .collect();
        let found = selected.iter().flatten().count() as u32;
        if mode == AcquireMode::Manifest && (found as usize) < objects.len() {
            return Ok(selected
                .iter()
                .map(|choice| {
                    if choice.is_some() {
                        AcquireOutcome::Withheld
                    } else {
                        AcquireOutcome::Miss
                    }
                })
                .collect());
        }
        if !self.leases.has_room(found) {
            return Err(DirectoryError::Full(Table::Leases));
        }
        if session.leases.saturating_add(found) > self.config.leases_per_session_max {
            return Err(DirectoryError::Full(Table::SessionLeases));
        }
        let deadline = now + self.config.lease_duration;
        let outcomes = selected
            .iter()
            .map(|choice| match choice {
                None => AcquireOutcome::Miss,
                Some(replica_id) => {
                    AcquireOutcome::Leased(self.grant_lease(now, session_id, *replica_id, deadline))
                }
            })
            .collect();
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.leases += found;
        }
        // Every read is an access. The batch is a prompt's chunks in order, so they are
        // touched last chunk first: the head of a prefix ends most recent, and a prefix
        // loses its tail before its head (a tail is worthless without its head).
        for (object, replica_id) in objects.iter().zip(&selected).rev() {
            if let Some(replica_id) = replica_id {
                let class = self.record_access(now, object);
                self.replicas.touch(*replica_id, class);
            }
        }
        Ok(outcomes)
    }

    fn grant_lease(
        &mut self,
        now: Timestamp,
        session: SessionId,
        replica_id: ReplicaId,
        deadline: Timestamp,
    ) -> Lease {
        let lease = self.leases.insert(LeaseRecord {
            replica: replica_id,
            session,
            deadline,
        });
        let replica = self
            .replicas
            .get_mut(replica_id)
            .expect("selected replica is live");
        replica.lease_count += 1;
        replica.last_access = now;
        let (location, first) = (replica.location(), replica.lease_count == 1);
        let bytes = replica.allocated_bytes;
        let record = &mut self.pools[location.pool.0 as usize];
        if first {
            record.pin(bytes, true);
        }
        Lease {
            lease,
            duration_ms: u64::try_from(self.config.lease_duration.as_millis()).unwrap_or(u64::MAX),
            replica: replica_id,
            medium: record.spec.medium,
            location,
            deadline,
        }
    }

    /// Releases leases held by this session. The last release of a retiring replica
    /// queues its reclaim. Releasing an unknown or expired lease is harmless.
    pub fn release(
        &mut self,
        session_id: SessionId,
        leases: &[LeaseId],
    ) -> Result<Vec<ReleaseOutcome>, DirectoryError> {
        self.check_batch(leases.len())?;
        self.open_session(session_id)?;
        Ok(leases
            .iter()
            .map(|&lease| match self.leases.get(lease) {
                Some(record) if record.session == session_id => {
                    self.drop_lease(lease);
                    if let Some(session) = self.sessions.get_mut(&session_id) {
                        session.leases -= 1;
                    }
                    ReleaseOutcome::Released
                }
                _ => ReleaseOutcome::Unknown,
            })
            .collect())
    }

    /// Removes a lease and updates its replica; does not touch the session's count.
    fn drop_lease(&mut self, lease: LeaseId) {
        let Some(record) = self.leases.remove(lease) else {
            return;
        };
        let Some(replica) = self.replicas.get_mut(record.replica) else {
            return;
        };
        replica.lease_count -= 1;
        if replica.lease_count == 0 {
            let (pool, bytes, state) = (replica.pool, replica.allocated_bytes, replica.state);
            self.pools[pool.0 as usize].pin(bytes, false);
            if state == ReplicaState::Retiring {
                self.queue_reclaim(record.replica);
            }
        }
    }

    // ----- retirement ------------------------------------------------------------------

    /// Starts retiring a READY replica: new acquires no longer see it. Once no lease
    /// remains, its owner gets a reclaim task. The owner node, or the directory's own
    /// policy (with `session = None`), may retire.
    pub fn retire(
        &mut self,
        session_id: Option<SessionId>,
        replica_id: ReplicaId,
    ) -> Result<RetireOutcome, DirectoryError> {
        let replica = self
            .replicas
            .get(replica_id)
            .ok_or(DirectoryError::UnknownReplica(replica_id))?;
        if let Some(session_id) = session_id {
            if self.open_session(session_id)?.node != replica.owner {
                return Err(DirectoryError::NotOwner(replica_id));
            }
        }
        if replica.state != ReplicaState::Ready {
            return Err(DirectoryError::InvalidState {
                replica: replica_id,
                state: replica.state.name().into(),
                needed: "ready".into(),
            });
        }
        let (pool, bytes, leases) = (replica.pool, replica.allocated_bytes, replica.lease_count);
        self.replicas.unlink_recency(replica_id);
        if let Some(replica) = self.replicas.get_mut(replica_id) {
            replica.state = ReplicaState::Retiring;
        }
        self.pools[pool.0 as usize].retire(bytes);
        if leases == 0 {
            self.queue_reclaim(replica_id);
            Ok(RetireOutcome::Reclaimable)
        } else {
            Ok(RetireOutcome::AwaitingReaders { leases })
        }
    }

    fn queue_reclaim(&mut self, replica_id: ReplicaId) {
        let Some(replica) = self.replicas.get(replica_id) else {
            return;
        };
        if self.reclaimed_by_directory(replica) {
            self.free_replica(replica_id);
            return;
        }
        let task = Task {
            id: TaskId(self.next_task),
            kind: TaskKind::Reclaim {
                replica: replica_id,
                location: replica.location(),
            },
        };
        self.next_task += 1;
        self.nodes[replica.owner.0 as usize].tasks.push_back(task);
    }

    /// Whether the directory itself may free `replica`: its bytes are in an extent whose
    /// owning session has ended, so no node sub-allocates there any more and nothing but
    /// the directory's books needs to change.
    fn reclaimed_by_directory(&self, replica: &replicas::Replica) -> bool {
        let Some(extents) = &self.pools[replica.pool.0 as usize].extents else {
            return false;
        };
        extents
            .owner_of(replica.offset_bytes)
            .is_none_or(|session| !self.sessions.get(&session).is_some_and(Session::is_open))
    }

    /// Grants the session an extent of a shared pool it maps: a range no other node may
    /// allocate in until the extent is returned. The node sub-allocates pages inside it
    /// without asking again. `Full` when no extent is free. Idempotent by operation id, so
    /// a grant whose reply was lost is resolved, not leaked.
    pub fn grant_extent(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        operation: OperationId,
        pool: PoolId,
    ) -> Result<ExtentGrant, DirectoryError> {
        let session = self.open_session(session_id)?;
        let recorded = replayed(session, operation, |entry| match entry {
            LedgerEntry::Extent(grant) => Some(grant),
            _ => None,
        })?;
        if let Some(grant) = recorded {
            return Ok(grant);
        }
        let record = self
            .pools
            .get(pool.0 as usize)
            .ok_or(DirectoryError::UnknownPool)?;
        let Scope::Domain(domain) = record.spec.scope else {
            return Err(DirectoryError::InvalidPool(
                "extents exist only in shared pools".into(),
            ));
        };
        if !session.domains.contains(&domain) {
            return Err(DirectoryError::InvalidPool(
                "the node does not map this pool's domain".into(),
            ));
        }
        let held = self
            .pools
            .iter()
            .filter_map(|record| record.extents.as_ref())
            .map(|extents| extents.held_by(session_id))
            .sum::<u32>();
        if held >= self.config.extents_per_session_max {
            return Err(DirectoryError::Full(Table::Extents));
        }
        let Some(extents) = self.pools[pool.0 as usize].extents.as_mut() else {
            return Err(DirectoryError::InvalidPool(
                "shared pool without extents".into(),
            ));
        };
        let grant = match extents.grant(session_id, now) {
            Some((offset_bytes, length_bytes)) => ExtentGrant::Granted(Extent {
                pool,
                offset_bytes,
                length_bytes,
            }),
            None => ExtentGrant::Full,
        };
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.ledger.record(operation, LedgerEntry::Extent(grant));
        }
        Ok(grant)
    }

    /// The owner gives back an extent it no longer allocates in (the node's allocator holds
    /// nothing there). `Returned`: the extent cools down for a reservation's duration
    /// (a stalled engine may still write into a grant it held) and may then go to any
    /// node. Idempotent by operation id, so a return whose reply was lost is resolved,
    /// never guessed.
    pub fn return_extent(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        operation: OperationId,
        pool: PoolId,
        offset_bytes: u64,
    ) -> Result<ExtentReturn, DirectoryError> {
        let session = self.open_session(session_id)?;
        let recorded = replayed(session, operation, |entry| match entry {
            LedgerEntry::ExtentReturn(answer) => Some(answer),
            _ => None,
        })?;
        if let Some(answer) = recorded {
            return Ok(answer);
        }
        let cool_until = now + self.config.reservation_duration;
        let extents = self
            .pools
            .get_mut(pool.0 as usize)
            .and_then(|record| record.extents.as_mut())
            .ok_or(DirectoryError::UnknownPool)?;
        let answer = extents.give_back(session_id, offset_bytes, cool_until);
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session
                .ledger
                .record(operation, LedgerEntry::ExtentReturn(answer));
        }
        Ok(answer)
    }

    /// Hands the node up to `tasks_per_poll_max` of its pending tasks (at most `max`). A
    /// task not acknowledged within `task_ack_timeout` is handed out again, so acting on a
    /// task must be idempotent (freeing an already freed allocation is acknowledged).
    pub fn poll_tasks(
        &mut self,
        now: Timestamp,
        session_id: SessionId,
        max: u32,
    ) -> Result<Vec<Task>, DirectoryError> {
        let node = self.open_session(session_id)?.node;
        let count = max.min(self.config.tasks_per_poll_max) as usize;
        let record = &mut self.nodes[node.0 as usize];
        let count = count.min(record.tasks.len());
        let tasks: Vec<Task> = record.tasks.drain(..count).collect();
        let retry_at = now + self.config.task_ack_timeout;
        record
            .handed_out
            .extend(tasks.iter().map(|task| (retry_at, *task)));
        Ok(tasks)
    }

    /// Hands out again the tasks whose acknowledgement is overdue and whose replica still
    /// waits for its reclaim.
    fn requeue_overdue_tasks(&mut self, now: Timestamp) {
        for index in 0..self.nodes.len() {
            while let Some(&(retry_at, task)) = self.nodes[index].handed_out.front() {
                if retry_at > now {
                    break;
                }
                self.nodes[index].handed_out.pop_front();
                let waiting = match task.kind {
                    TaskKind::Reclaim { replica, .. } => {
                        self.replicas.get(replica).is_some_and(|record| {
                            record.state == ReplicaState::Retiring && record.lease_count == 0
                        })
                    }
                    TaskKind::Demote { target, .. } => self.demotions.contains_key(&target),
                };
                if waiting {
                    self.nodes[index].tasks.push_back(task);
                }
            }
        }
    }

    /// The owner freed the replica's storage (its allocation generation moved on): the
    /// bytes count as free and the replica is gone. Only a retiring replica with no lease
    /// is reclaimed; repeating the ack is harmless.
    pub fn reclaim_ack(
        &mut self,
        session_id: SessionId,
        replica_id: ReplicaId,
    ) -> Result<ReclaimOutcome, DirectoryError> {
        let node = self.open_session(session_id)?.node;
        let Some(replica) = self.replicas.get(replica_id) else {
            return Ok(ReclaimOutcome::Unknown);
        };
        if replica.owner != node {
            return Err(DirectoryError::NotOwner(replica_id));
        }
        if replica.state != ReplicaState::Retiring || replica.lease_count > 0 {
            return Err(DirectoryError::InvalidState {
                replica: replica_id,
                state: replica.state.name().into(),
                needed: "retiring without leases".into(),
            });
        }
        self.nodes[node.0 as usize]
            .handed_out
            .retain(|(_, task)| !matches!(task.kind, TaskKind::Reclaim { replica, .. } if replica == replica_id));
        self.free_replica(replica_id);
        Ok(ReclaimOutcome::Freed)
    }

    /// Removes a committed replica and returns its bytes; its leases must be gone.
    fn free_replica(&mut self, replica_id: ReplicaId) {
        let Some(replica) = self.replicas.remove(replica_id) else {
            return;
        };
        let record = &mut self.pools[replica.pool.0 as usize];
        match replica.state {
            ReplicaState::Reserved => record.abort(replica.allocated_bytes),
            ReplicaState::Ready | ReplicaState::Retiring => record.free(
                replica.allocated_bytes,
                replica.state == ReplicaState::Retiring,
            ),
            ReplicaState::Free => {}
        }
        if replica.lease_count > 0 {
            record.pin(replica.allocated_bytes, false);
        }
        if let (Some(extents), ReplicaState::Ready | ReplicaState::Retiring) =
            (&mut record.extents, replica.state)
        {
            let sessions = &self.sessions;
            let cool_until = self.latest_tick + self.config.reservation_duration;
            extents.remove_replica(
                replica.offset_bytes,
                |session| sessions.get(&session).is_some_and(Session::is_open),
                cool_until,
            );
        }
    }

    // ----- time ------------------------------------------------------------------------

    /// Advances time: expires leases and reservations whose deadline passed, marks silent
    /// sessions suspect (hiding their host replicas) and fences those silent past
    /// `fence_after`. Returns what changed.
    pub fn tick(&mut self, now: Timestamp) -> TickReport {
        self.latest_tick = self.latest_tick.max(now);
        self.requeue_overdue_tasks(now);
        let evicted = self.evict(now) + std::mem::take(&mut self.evictions_unreported);
        let expired = self.expire(
            now,
            self.config.evictions_per_tick_max.saturating_sub(evicted),
        );
        let mut report = TickReport {
            evicted,
            expired,
            ..TickReport::default()
        };
        while let Some((_, lease)) = self.leases.pop_expired(now) {
            report.expired_leases += 1;
            if let Some(session) = self.sessions.get_mut(&lease.session) {
                session.leases = session.leases.saturating_sub(1);
            }
            self.after_lease_removed(lease.replica);
        }
        while let Some(&(deadline, replica)) = self.reservation_deadlines.front() {
            if deadline > now {
                break;
            }
            self.reservation_deadlines.pop_front();
            let Some(record) = self.replicas.get(replica) else {
                continue;
            };
            if record.state != ReplicaState::Reserved {
                continue;
            }
            let owner_session = self.nodes[record.owner.0 as usize].session;
            if let Some(session) = owner_session.and_then(|id| self.sessions.get_mut(&id)) {
                session.reservations.remove(&replica);
            }
            self.abort_reservation(replica);
            report.expired_reservations += 1;
        }
        let mut changes: Vec<(SessionId, NodeId, SessionState)> = self
            .sessions
            .iter()
            .filter(|(_, session)| session.is_open())
            .filter_map(|(&id, session)| {
                let silence = now.saturating_since(session.last_heartbeat);
                if silence >= self.config.fence_after {
                    Some((id, session.node, SessionState::Fenced))
                } else if silence >= self.config.suspect_after
                    && session.state == SessionState::Live
                {
                    Some((id, session.node, SessionState::Suspect))
                } else {
                    None
                }
            })
            .collect();
        changes.sort_by_key(|(id, ..)| *id);
        for (session, node, state) in changes {
            match state {
                SessionState::Fenced => self.end_session(now, session, SessionState::Fenced),
                _ => {
                    if let Some(record) = self.sessions.get_mut(&session) {
                        record.state = state;
                    }
                }
            }
            report.transitions.push(SessionTransition {
                session,
                node,
                state,
            });
        }
        report
    }

    /// Retires (or demotes) READY replicas of every pool above its high watermark until it
    /// is at or below its low watermark, at most `evictions_per_tick_max` per call. The
    /// victim policy chooses among the least recently used replicas of each frequency class
    /// (the first `eviction_window` of each); leased and young replicas are never chosen.
    fn evict(&mut self, now: Timestamp) -> u32 {
        let high = u64::from(self.config.high_watermark_percent);
        let low = u64::from(self.config.low_watermark_percent);
        let mut evicted = 0;
        for index in 0..self.pools.len() {
            let pool = PoolId(index as u32);
            let used = |record: &PoolRecord| {
                (record.reserved_bytes + record.ready_bytes).saturating_mul(100)
            };
            let record = &self.pools[index];
            if used(record) <= high * record.spec.capacity_bytes {
                continue;
            }
            // Bytes on their way out to a colder tier (demotions in flight) count as gone.
            let mut leaving: u64 = self
                .demoting
                .iter()
                .filter_map(|source| self.replicas.get(*source))
                .filter(|replica| replica.pool == pool)
                .map(|replica| replica.allocated_bytes)
                .sum();
            if used(record).saturating_sub(leaving * 100) <= high * record.spec.capacity_bytes {
                continue;
            }
            let victim_config = VictimConfig::for_capacity(self.pools[index].object_capacity());
            while evicted < self.config.evictions_per_tick_max
                && used(&self.pools[index]).saturating_sub(leaving * 100)
                    > low * self.pools[index].spec.capacity_bytes
            {
                let window: Vec<(ReplicaId, VictimCandidate)> = (0..FREQUENCY_CLASSES)
                    .flat_map(|class| {
                        let reuse_probability = self.history.reuse_probability(class as u32 + 1);
                        self.replicas
                            .coldest(pool, class)
                            .take(self.config.eviction_window as usize)
                            .map(move |(id, replica)| (id, replica, reuse_probability))
                    })
                    .map(|(id, replica, reuse_probability)| {
                        let age = now.saturating_since(replica.last_access);
                        let idle_ms = self
                            .policy_ms(now)
                            .saturating_sub(self.policy_ms(replica.last_access));
                        let candidate = VictimCandidate {
                            bytes: replica.allocated_bytes,
                            reuse_probability,
                            idle: Duration::from_millis(idle_ms),
                            age,
                            // A replica being demoted is spoken for.
                            leased: replica.lease_count > 0 || self.demoting.contains(&id),
                        };
                        (id, candidate)
                    })
                    .collect();
                let candidates: Vec<VictimCandidate> =
                    window.iter().map(|(_, candidate)| *candidate).collect();
                let (Some(chosen), _) = victims::choose(&candidates, &victim_config) else {
                    break;
                };
                let victim = window[chosen].0;
                let target = self
                    .replicas
                    .get(victim)
                    .and_then(|replica| self.demotion_target(replica));
                if let Some((target_pool, bytes)) = target {
                    if self.start_demotion(now, victim, target_pool, bytes) {
                        leaving += self
                            .replicas
                            .get(victim)
                            .map_or(0, |replica| replica.allocated_bytes);
                        evicted += 1;
                        continue;
                    }
                }
                if self.retire(None, victim).is_err() {
                    break;
                }
                evicted += 1;
            }
        }
        evicted
    }

    /// Records an access to `object` in the history; returns its frequency class.
    fn record_access(&mut self, now: Timestamp, object: &ObjectId) -> usize {
        let key = self.replicas.key_of(object);
        let stats = self.history.record(key, self.policy_ms(now));
        frequency_class(stats.count)
    }

    /// The frequency class of `object` from its recorded accesses.
    fn access_class(&self, object: &ObjectId) -> usize {
        let key = self.replicas.key_of(object);
        frequency_class(self.history.stats(key).map_or(1, |stats| stats.count))
    }

    /// `now` on the policy's clock, in milliseconds: the directory's clock times
    /// `policy_time_scale` (1 except when a trace is replayed faster than it was recorded).
    fn policy_ms(&self, now: Timestamp) -> u64 {
        (now.0 as f64 / 1e6 * self.config.policy_time_scale) as u64
    }

    /// A lease was removed by expiry: update its replica.
    fn after_lease_removed(&mut self, replica_id: ReplicaId) {
        let Some(replica) = self.replicas.get_mut(replica_id) else {
            return;
        };
        replica.lease_count -= 1;
        if replica.lease_count == 0 {
            let (pool, bytes, state) = (replica.pool, replica.allocated_bytes, replica.state);
            self.pools[pool.0 as usize].pin(bytes, false);
            if state == ReplicaState::Retiring {
                self.queue_reclaim(replica_id);
            }
        }
    }

    // ----- reports ---------------------------------------------------------------------

    /// Usage of every registered pool.
    pub fn usage(&self) -> Vec<PoolReport> {
        self.pools
            .iter()
            .enumerate()
            .map(|(index, record)| PoolReport {
                pool: PoolId(index as u32),
                spec: record.spec.clone(),
                usage: record.usage(self.owner_reachable(record)),
                profile: record.profile.clone(),
            })
            .collect()
    }

    fn owner_reachable(&self, record: &PoolRecord) -> bool {
        match record.spec.scope {
            Scope::Domain(_) => true,
            Scope::Host(_) => record
                .owner_session
                .and_then(|session| self.sessions.get(&session))
                .is_some_and(|session| session.state == SessionState::Live),
        }
    }

    /// Object, replica, lease and session counts.
    pub fn counts(&self) -> DirectoryCounts {
        let mut counts = DirectoryCounts {
            objects: self.replicas.object_count() as u64,
            replicas: u64::from(self.replicas.len()),
            leases: u64::from(self.leases.len()),
            ..DirectoryCounts::default()
        };
        for session in self.sessions.values() {
            match session.state {
                SessionState::Live => counts.sessions_live += 1,
                SessionState::Suspect => counts.sessions_suspect += 1,
                SessionState::Fenced => counts.sessions_fenced += 1,
                SessionState::Closed => {}
            }
        }
        counts
    }

    /// A session's state, if the directory still remembers it.
    pub fn session_state(&self, session: SessionId) -> Option<SessionState> {
        self.sessions.get(&session).map(|record| record.state)
    }

    /// The node name of a session, if the directory still remembers the session.
    pub fn session_node_name(&self, session: SessionId) -> Option<&str> {
        let node = self.sessions.get(&session)?.node;
        self.node_ids
            .iter()
            .find(|(_, id)| **id == node)
            .map(|(name, _)| name.as_str())
    }

    /// A replica's state, if it is live.
    pub fn replica_state(&self, replica: ReplicaId) -> Option<ReplicaState> {
        self.replicas.get(replica).map(|record| record.state)
    }

    /// Bytes held by the replica table's arrays.
    pub fn replica_memory_bytes(&self) -> usize {
        self.replicas.memory_bytes()
    }
}

/// What the ledger says of `operation` for an operation of one kind (`pick` recognizes its
/// recorded outcome): the first outcome again for a retry, `None` for a new operation, or
/// the refusal of an acknowledged, burnt or over-the-bound one.
fn replayed<T>(
    session: &Session,
    operation: OperationId,
    pick: impl Fn(LedgerEntry) -> Option<T>,
) -> Result<Option<T>, DirectoryError> {
    match session.ledger.check(operation) {
        LedgerCheck::Recorded(entry) => pick(entry)
            .map(Some)
            .ok_or(DirectoryError::OperationAcknowledged(operation)),
        LedgerCheck::Acknowledged => Err(DirectoryError::OperationAcknowledged(operation)),
        LedgerCheck::Full => Err(DirectoryError::Full(Table::Ledger)),
        LedgerCheck::New => Ok(None),
    }
}

/// A requester's read rank per pool (`None`: it cannot map the pool or the pool's
/// replicas are hidden).
struct ReadView {
    ranks: Vec<Option<usize>>,
}

impl ReadView {
    fn rank(&self, pool: PoolId) -> Option<usize> {
        self.ranks.get(pool.0 as usize).copied().flatten()
    }
}

/// `order` without repeats, at most one entry per medium: what a node sends is bounded
/// before the directory iterates it on every request.
fn distinct_media(order: &[Medium]) -> Vec<Medium> {
    let mut distinct = Vec::with_capacity(Medium::ALL.len());
    for medium in order {
        if !distinct.contains(medium) {
            distinct.push(*medium);
        }
        if distinct.len() == Medium::ALL.len() {
            break;
        }
    }
    distinct
}

/// Whether `access` lets a node use `descriptor`'s namespace.
fn permits(access: &NamespaceAccess, descriptor: &NamespaceDescriptor) -> bool {
    match access {
        NamespaceAccess::Any => true,
        NamespaceAccess::Models(models) => models.contains(&descriptor.model),
    }
}

#[cfg(test)]
mod tests;
