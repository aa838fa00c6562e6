//! The cluster's policy, replayed in process: the trace drives the directory core (the
//! state machine the directory process runs, with its watermarks, victim choice,
//! demotions and reclaim tasks) through an injected clock, metadata only. It steps the way
//! the running cluster does: the directory ticks every [`ClusterSimConfig::period`], the
//! nodes fetch their tasks as soon as they are queued (they wait for them at the
//! directory) and poll as often as the directory ticks, half a period later; a load is probe, acquire, release; a
//! store is reserve then commit (in CXL, inside an extent the directory granted). With a
//! CXL pool the nodes store in the order `[cpu, cxl]` and pressure on a CPU pool demotes
//! into CXL. With an SSD tier each node has an SSD pool modelled by its store's own core
//! ([`super::ssd`]): pressure spills chunks there as the directory decides, and a load of a
//! chunk only the SSD holds restores it first, as the node does for a load that misses.
//! With several engines (one node each, requests in turn) a miss of a chunk
//! another node holds privately is replicated towards the engine that missed it.
//! `kvtier replay --live` runs the same requests against real processes, and the two hit
//! ratios must agree.

use std::time::Duration;

use anyhow::Context;

use super::ssd::{self, SimulatedSsd};
use crate::workload::prefix::chain;
use crate::workload::trace::Request;
use kvtier_core::actors::node::ssd_restore::RESTORE_WAIT;
use kvtier_core::client::{batch_lengths, LOAD_BATCH_BYTES_MAX, LOAD_BATCH_ITEMS_MAX};
use kvtier_core::directory::{
    AcquireMode, AcquireOutcome, CommitOutcome, Directory, DirectoryConfig, DirectoryError,
    ExtentGrant, Holding, OpenReply, OpenRequest, ProbeOutcome, ReserveItem, ReserveOutcome,
    TaskKind,
};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{
    AllocationId, DomainId, Generation, Location, Medium, NamespaceId, ObjectId, OperationId,
    PoolId, PoolSpec, ReplicaId, Scope, SessionId, Timestamp,
};
use kvtier_core::node::holdings::Holdings;
use kvtier_core::node::restores::RESTORES_PER_LOAD_MAX;
pub use tally::{ClusterTally, Pricing};

/// How the replayed cluster is built and clocked.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSimConfig {
    /// Engines, each on a node of its own; the trace's requests go to them in turn.
    pub engines: usize,
    /// Blocks each node's CPU pool holds.
    pub blocks: u64,
    /// Blocks of the CXL pool every node maps; 0 for none.
    pub cxl_blocks: u64,
    /// Blocks each node's SSD store holds ([`ssd::store_bytes`]); 0 for none.
    pub ssd_blocks: u64,
    /// Accesses a chunk needs before it is spilled to an SSD store (the stores'
    /// `[nodes.ssd] admit_after_accesses`).
    pub ssd_admit_after_accesses: u32,
    /// Bytes of one block's chunk (the pool's page size: a power of two).
    pub chunk_bytes: u64,
    /// The directory's limits (watermarks, leases, victim window).
    pub directory: DirectoryConfig,
    /// Trace time runs this many times faster than the cluster's clock sees it: the live
    /// run replays an hour-long trace in a minute, and the simulation clocks the directory
    /// the same way so its time-dependent choices match.
    pub speedup: f64,
    /// How often the directory ticks and the node polls its tasks, on the cluster's clock.
    pub period: Duration,
    /// How the time to first token is estimated.
    pub pricing: Pricing,
}

/// Most chunks in one CXL extent; fewer when needed for the pool to hold whole extents.
pub const EXTENT_CHUNKS_MAX: u64 = 256;

/// Chunks per extent of a CXL pool of `blocks` chunks: the largest divisor of `blocks` up
/// to [`EXTENT_CHUNKS_MAX`], so the pool is exactly `blocks` chunks of whole extents.
pub fn extent_chunks(blocks: u64) -> u64 {
    (1..=EXTENT_CHUNKS_MAX.min(blocks.max(1)))
        .rev()
        .find(|chunks| blocks % chunks == 0)
        .unwrap_or(1)
}

/// One engine's node as the replay models it: its session and what its allocator holds.
struct SimulatedNode {
    session: SessionId,
    /// Free chunk offsets inside the CXL extents granted to this node.
    cxl_free: Vec<u64>,
    /// The node's SSD store, when it has one.
    ssd: Option<SimulatedSsd>,
}

/// The engines' nodes and their directory, stepped by the trace.
struct SimulatedCluster {
    directory: Directory,
    nodes: Vec<SimulatedNode>,
    namespace: NamespaceId,
    chunk_bytes: u64,
    /// The CXL pool and its extent size, when there is one.
    cxl: Option<(PoolId, u64)>,
    next_operation: u64,
    next_allocation: u64,
    next_period: Timestamp,
    next_poll: Timestamp,
    /// The directory's count of queued tasks when the waiting nodes last fetched theirs.
    tasks_seen: u64,
    period: Duration,
    demoted: u64,
    replicated: u64,
    spilled: u64,
    restored: u64,
    /// The object at each location written and not yet reclaimed, as the nodes' holdings
    /// know it (a spill reads its source's object from them), at its generation: an SSD
    /// offset is reused by a later fill of its region, and a reclaim queued for the old
    /// object must not forget the new one. Bounded by the replicas the pools hold.
    held: Holdings,
}

/// Registers the domain's CXL pool of `config.cxl_blocks` chunks, in whole extents
/// ([`extent_chunks`]): the pool and its extent size, or `None` for no CXL blocks.
fn register_cxl_pool(
    directory: &mut Directory,
    config: &ClusterSimConfig,
) -> anyhow::Result<Option<(PoolId, u64)>> {
    if config.cxl_blocks == 0 {
        return Ok(None);
    }
    let extent_bytes = extent_chunks(config.cxl_blocks) * config.chunk_bytes;
    let pool = directory.register_pool(
        None,
        PoolSpec {
            name: "cxl0".into(),
            medium: Medium::Cxl,
            scope: Scope::Domain(DomainId(0)),
            capacity_bytes: config.cxl_blocks.saturating_mul(config.chunk_bytes),
            page_bytes: config.chunk_bytes,
            extent_bytes: Some(extent_bytes),
            tenancy: kvtier_core::model::PoolTenancy::Shared,
        },
    )?;
    Ok(Some((pool, extent_bytes)))
}

/// Opens engine `engine`'s node at the directory with its CPU pool, and its SSD store when
/// `config` gives one, and registers the demo namespace: the node and the namespace.
fn open_engine(
    directory: &mut Directory,
    config: &ClusterSimConfig,
    engine: usize,
) -> anyhow::Result<(SimulatedNode, NamespaceId)> {
    let opened = directory.open(
        Timestamp::ZERO,
        OpenRequest {
            node_name: format!("node-{engine}"),
            write_order: vec![Medium::Cpu, Medium::Cxl],
            read_order: vec![Medium::Cpu, Medium::Cxl],
            domains: vec![DomainId(0)],
            namespaces: kvtier_core::directory::NamespaceAccess::Any,
        },
    )?;
    directory.register_pool(
        Some(opened.session),
        PoolSpec {
            name: format!("node-{engine}-cpu"),
            medium: Medium::Cpu,
            scope: Scope::Host(opened.node),
            capacity_bytes: config.blocks.saturating_mul(config.chunk_bytes),
            page_bytes: config.chunk_bytes,
            extent_bytes: None,
            tenancy: kvtier_core::model::PoolTenancy::Shared,
        },
    )?;
    let ssd = if config.ssd_blocks > 0 {
        Some(register_node_ssd(directory, config, engine, &opened)?)
    } else {
        None
    };
    let namespace = directory.register_namespace(opened.session, demo_namespace())?;
    let node = SimulatedNode {
        session: opened.session,
        cxl_free: Vec::new(),
        ssd,
    };
    Ok((node, namespace))
}

/// Registers the SSD pool of `config.ssd_blocks` chunks of the node `opened` opened, with
/// its admission threshold, and models its store.
fn register_node_ssd(
    directory: &mut Directory,
    config: &ClusterSimConfig,
    engine: usize,
    opened: &OpenReply,
) -> anyhow::Result<SimulatedSsd> {
    let store_bytes = ssd::store_bytes(config.ssd_blocks, config.chunk_bytes)?;
    let pool = directory.register_pool(
        Some(opened.session),
        PoolSpec {
            name: format!("node-{engine}-ssd"),
            medium: Medium::Ssd,
            scope: Scope::Host(opened.node),
            capacity_bytes: store_bytes,
            page_bytes: kvtier_core::backends::ssd::layout::BLOCK_BYTES,
            extent_bytes: None,
            tenancy: kvtier_core::model::PoolTenancy::Shared,
        },
    )?;
    directory.admit_after(opened.session, pool, config.ssd_admit_after_accesses)?;
    SimulatedSsd::new(pool, store_bytes)
}

impl SimulatedCluster {
    fn start(config: &ClusterSimConfig) -> anyhow::Result<Self> {
        let mut directory = Directory::new(config.directory.clone());
        let cxl = register_cxl_pool(&mut directory, config)?;
        let mut nodes = Vec::with_capacity(config.engines);
        let mut namespace = None;
        for engine in 0..config.engines.max(1) {
            let (node, engine_namespace) = open_engine(&mut directory, config, engine)?;
            namespace = Some(engine_namespace);
            nodes.push(node);
        }
        Ok(Self {
            directory,
            nodes,
            namespace: namespace.context("a cluster of no engine")?,
            chunk_bytes: config.chunk_bytes,
            cxl,
            next_operation: 1,
            next_allocation: 1,
            next_period: Timestamp::ZERO,
            next_poll: Timestamp::ZERO + config.period / 2,
            tasks_seen: 0,
            period: config.period,
            demoted: 0,
            replicated: 0,
            spilled: 0,
            restored: 0,
            held: Holdings::default(),
        })
    }

    fn operation(&mut self) -> OperationId {
        self.next_operation += 1;
        OperationId(self.next_operation)
    }

    /// Runs every timer due by `now`, in time order: the directory's tick (with every
    /// node's heartbeat, acknowledging every operation) on period boundaries, and the nodes'
    /// task polls, which free what eviction retired and copy what it demotes or
    /// replicates. A live node waits at the directory for its tasks (`AwaitTasks`), so it
    /// fetches them as soon as a call or a tick queued them: here, after each tick and
    /// before the next request; the periodic poll, half a period after the tick, is the
    /// live node's fallback.
    fn advance(&mut self, now: Timestamp) -> anyhow::Result<()> {
        loop {
            let at = self.next_period.min(self.next_poll);
            if at > now {
                return self.wake_waiting(now, false);
            }
            if self.next_period <= self.next_poll {
                let acknowledged = OperationId(self.next_operation);
                for node in &self.nodes {
                    self.directory
                        .heartbeat(at, node.session, Some(acknowledged))?;
                }
                self.directory.tick(at);
                self.next_period = at + self.period;
                // A tick may queue tasks or end a recovery's hold on reclaims.
                self.wake_waiting(at, true)?;
            } else {
                for node in 0..self.nodes.len() {
                    self.poll(node, at)?;
                }
                self.next_poll = at + self.period;
            }
        }
    }

    /// The nodes' waits at the directory: each node with tasks to fetch at `at` polls,
    /// when tasks were queued since the last wake (or always, after a tick).
    fn wake_waiting(&mut self, at: Timestamp, after_tick: bool) -> anyhow::Result<()> {
        let queued = self.directory.tasks_queued();
        if !after_tick && queued == self.tasks_seen {
            return Ok(());
        }
        self.tasks_seen = queued;
        for node in 0..self.nodes.len() {
            if self.directory.has_tasks(at, self.nodes[node].session) {
                self.poll(node, at)?;
            }
        }
        Ok(())
    }

    /// Node `node`'s task poll at `at`: reclaims acknowledged; demotions, replications and
    /// received copies written (instantly here; the live nodes copy first) and committed;
    /// demotions into the node's SSD pool spilled into its store.
    fn poll(&mut self, node: usize, at: Timestamp) -> anyhow::Result<()> {
        let session = self.nodes[node].session;
        for task in self.directory.poll_tasks(at, session, u32::MAX)? {
            let (object, target, target_pool, replication) = match task.kind {
                TaskKind::Reclaim { replica, location } => {
                    self.reclaim(node, &location);
                    self.directory.reclaim_ack(session, replica)?;
                    continue;
                }
                // The replay's nodes ask for no delegation, and give an offered one back at
                // once: none is held, so none is recalled.
                TaskKind::Delegate { delegation, .. } => {
                    self.directory.release(session, &[delegation.lease])?;
                    continue;
                }
                TaskKind::Recall { .. } => continue,
                TaskKind::Demote {
                    source,
                    target,
                    target_pool,
                } => {
                    let object = self.held.object_at(&source);
                    if self.ssd_pool(node) == Some(target_pool) {
                        self.spill(node, at, object, source.length_bytes, target)?;
                        continue;
                    }
                    (object, target, target_pool, false)
                }
                TaskKind::Replicate {
                    source,
                    target,
                    target_pool,
                } => (self.held.object_at(&source), target, target_pool, true),
                TaskKind::Receive {
                    object,
                    target,
                    target_pool,
                    ..
                } => (Some(object), target, target_pool, true),
                // The receiver writes and commits; the sender only streams.
                TaskKind::Push { .. } => continue,
            };
            let Some(location) = self.location(node, at, target_pool)? else {
                self.directory.abort(session, target)?;
                continue;
            };
            let operation = self.operation();
            let committed = self
                .directory
                .commit(at, session, operation, target, location)?;
            if committed == CommitOutcome::Committed {
                if let Some(object) = object {
                    self.held.published(Holding { object, location });
                }
                let copies = if replication {
                    &mut self.replicated
                } else {
                    &mut self.demoted
                };
                *copies += 1;
            }
        }
        Ok(())
    }

    /// SSD regions the nodes' stores reclaimed so far.
    fn regions_reclaimed(&self) -> u64 {
        self.nodes
            .iter()
            .filter_map(|node| node.ssd.as_ref())
            .map(|ssd| ssd.regions_reclaimed)
            .sum()
    }

    /// The SSD pool of node `node`, when it has one.
    fn ssd_pool(&self, node: usize) -> Option<PoolId> {
        self.nodes[node].ssd.as_ref().map(|ssd| ssd.pool)
    }

    /// Frees what a reclaim task names: a CXL chunk goes back to the extent's holder (the
    /// node reclaiming it), an SSD object leaves the node's store.
    fn reclaim(&mut self, node: usize, location: &Location) {
        if self.cxl.is_some_and(|(pool, _)| pool == location.pool) {
            self.nodes[node].cxl_free.push(location.offset_bytes);
        }
        let object = self.held.object_at(location);
        self.held.freed(location);
        if let (Some(ssd), Some(object)) = (self.nodes[node].ssd.as_mut(), object) {
            if ssd.pool == location.pool {
                ssd.drop_object(&object, location);
            }
        }
    }

    /// A demotion into node `node`'s SSD pool, as the node spills: the source's object
    /// written to the store (the objects of a region reclaimed for room retired first),
    /// then the target committed at its place there; aborted when the source's object is
    /// unknown or the store has no room, dropped from the store when the commit is not
    /// applied.
    fn spill(
        &mut self,
        node: usize,
        at: Timestamp,
        object: Option<ObjectId>,
        length_bytes: u64,
        target: ReplicaId,
    ) -> anyhow::Result<()> {
        let session = self.nodes[node].session;
        let (Some(object), Some(ssd)) = (object, self.nodes[node].ssd.as_mut()) else {
            self.directory.abort(session, target)?;
            return Ok(());
        };
        let (location, evicted) = ssd.write(object, length_bytes);
        for holding in &evicted {
            self.held.freed(&holding.location);
        }
        for batch in evicted.chunks(self.directory.config().batch_items_max.max(1) as usize) {
            self.directory.retire_held(session, batch)?;
        }
        let Some(location) = location else {
            self.directory.abort(session, target)?;
            return Ok(());
        };
        let operation = self.operation();
        let committed = self
            .directory
            .commit(at, session, operation, target, location);
        let ssd = self.nodes[node].ssd.as_mut().context("the SSD went away")?;
        match committed {
            Ok(CommitOutcome::Committed) => {
                self.held.published(Holding { object, location });
                self.spilled += 1;
            }
            Ok(CommitOutcome::AlreadyPresent) => ssd.drop_object(&object, &location),
            Err(_) => {
                ssd.drop_object(&object, &location);
                let _ = self.directory.abort(session, target);
            }
        }
        Ok(())
    }

    /// Where a chunk granted in `pool` is written: anywhere in the CPU pool (the node's
    /// allocator is not modelled), inside an extent of node `node`'s in CXL (asking for
    /// another extent when those are full; `None` when the pool has none left).
    fn location(
        &mut self,
        node: usize,
        now: Timestamp,
        pool: PoolId,
    ) -> anyhow::Result<Option<Location>> {
        let session = self.nodes[node].session;
        let offset_bytes = match self.cxl {
            Some((cxl, extent_bytes)) if cxl == pool => {
                if self.nodes[node].cxl_free.is_empty() {
                    let operation = self.operation();
                    match self.directory.grant_extent(now, session, operation, pool) {
                        Ok(ExtentGrant::Granted(extent)) => {
                            let chunks = extent_bytes / self.chunk_bytes;
                            self.nodes[node].cxl_free.extend(
                                (0..chunks)
                                    .rev()
                                    .map(|chunk| extent.offset_bytes + chunk * self.chunk_bytes),
                            );
                        }
                        // Every extent held, or this session's bound on extents reached: the
                        // live node cannot allocate either.
                        Ok(ExtentGrant::Full) | Err(DirectoryError::Full(_)) => return Ok(None),
                        Err(error) => return Err(error.into()),
                    }
                }
                match self.nodes[node].cxl_free.pop() {
                    Some(offset) => offset,
                    None => return Ok(None),
                }
            }
            _ => 0,
        };
        self.next_allocation += 1;
        Ok(Some(Location {
            pool,
            allocation: AllocationId(self.next_allocation),
            generation: Generation(0),
            offset_bytes,
            length_bytes: self.chunk_bytes,
        }))
    }

    /// The leading blocks cached (in memory, or on the node's SSD), leased and released as
    /// a load does, restoring those only the SSD holds first; returns the media they were
    /// read from (`Ssd` for a restored one).
    fn load_prefix(
        &mut self,
        node: usize,
        now: Timestamp,
        objects: &[ObjectId],
    ) -> anyhow::Result<Vec<Medium>> {
        let session = self.nodes[node].session;
        let probed = self.directory.probe_noting_demand(now, session, objects)?;
        let run = probed
            .iter()
            .take_while(|outcome| {
                matches!(
                    outcome,
                    ProbeOutcome::Hit { .. } | ProbeOutcome::OnSsd { .. }
                )
            })
            .count();
        // As the client's `load_into` does: one acquire per batch, each restoring its own
        // misses the SSD holds.
        let sizes = std::iter::repeat_n(self.chunk_bytes, run);
        let mut acquired = Vec::with_capacity(run);
        let mut start = 0;
        for length in batch_lengths(sizes, LOAD_BATCH_ITEMS_MAX, LOAD_BATCH_BYTES_MAX) {
            let batch = &objects[start..start + length];
            let mut outcomes = self
                .directory
                .acquire(now, session, batch, AcquireMode::Each)?;
            self.restore_misses(node, now, batch, &mut outcomes)?;
            acquired.extend(outcomes);
            start += length;
        }
        let leases: Vec<_> = acquired
            .iter()
            .filter_map(|outcome| match outcome {
                AcquireOutcome::Leased(lease) => Some(lease.lease),
                AcquireOutcome::Miss | AcquireOutcome::Withheld => None,
            })
            .collect();
        let loaded = acquired
            .iter()
            .take_while(|outcome| matches!(outcome, AcquireOutcome::Leased(_)))
            .count();
        self.directory.release(session, &leases)?;
        Ok(probed[..loaded]
            .iter()
            .map(|outcome| match outcome {
                ProbeOutcome::Hit { medium, .. } => *medium,
                ProbeOutcome::OnSsd { .. } | ProbeOutcome::Pending | ProbeOutcome::Miss => {
                    Medium::Ssd
                }
            })
            .collect())
    }

    /// What the node does for an acquire's misses its SSD holds: restores them (the first
    /// [`RESTORES_PER_LOAD_MAX`]: reserve each, then write and commit each) and acquires
    /// the missed objects again, in place of their misses.
    fn restore_misses(
        &mut self,
        node: usize,
        now: Timestamp,
        objects: &[ObjectId],
        outcomes: &mut [AcquireOutcome],
    ) -> anyhow::Result<()> {
        let Some(ssd) = &self.nodes[node].ssd else {
            return Ok(());
        };
        let missed: Vec<usize> = (0..objects.len())
            .filter(|index| matches!(outcomes[*index], AcquireOutcome::Miss))
            .filter(|index| ssd.holds(&objects[*index]))
            .collect();
        if missed.is_empty() {
            return Ok(());
        }
        let wanted: Vec<ObjectId> = missed.iter().map(|index| objects[*index]).collect();
        let session = self.nodes[node].session;
        let granted = self.reserve_restores(node, now, &wanted)?;
        let published = self.commit_restores(now, session, granted)?;
        self.restored += published;
        if published == 0 {
            return Ok(());
        }
        let again = self
            .directory
            .acquire(now, session, &wanted, AcquireMode::Each)?;
        for (position, outcome) in missed.into_iter().zip(again) {
            outcomes[position] = outcome;
        }
        Ok(())
    }

    /// Reserves room for each of the first [`RESTORES_PER_LOAD_MAX`] of `wanted` as the
    /// node does for a restore, a reservation a full pool skips asked again (after a task
    /// poll) until the call's deadline ([`RESTORE_WAIT`]); the grants with their locations
    /// (a grant the node cannot allocate is aborted).
    fn reserve_restores(
        &mut self,
        node: usize,
        now: Timestamp,
        wanted: &[ObjectId],
    ) -> anyhow::Result<Vec<(ObjectId, ReplicaId, Location)>> {
        let session = self.nodes[node].session;
        // A reservation a full pool skips is asked again until the call's deadline; the
        // room comes from the reclaims of the node's next task polls, run here at once.
        let mut polls_left = RESTORE_WAIT.as_micros() / self.period.as_micros().max(1);
        let mut granted = Vec::new();
        for object in wanted.iter().take(RESTORES_PER_LOAD_MAX) {
            let item = ReserveItem {
                object: *object,
                length_bytes: self.chunk_bytes,
            };
            let reserved = loop {
                let operation = self.operation();
                match self.directory.reserve(now, session, operation, item)? {
                    ReserveOutcome::Skip(_) if polls_left > 0 => {
                        polls_left -= 1;
                        self.poll(node, now)?;
                    }
                    outcome => break outcome,
                }
            };
            if let ReserveOutcome::Granted { replica, pool, .. } = reserved {
                match self.location(node, now, pool)? {
                    Some(location) => granted.push((*object, replica, location)),
                    None => {
                        self.directory.abort(session, replica)?;
                    }
                }
            }
        }
        Ok(granted)
    }

    /// Commits each restored object at its granted location and notes it held: how many
    /// were published.
    fn commit_restores(
        &mut self,
        now: Timestamp,
        session: SessionId,
        granted: Vec<(ObjectId, ReplicaId, Location)>,
    ) -> anyhow::Result<u64> {
        let mut published = 0;
        for (object, replica, location) in granted {
            let operation = self.operation();
            if self
                .directory
                .commit(now, session, operation, replica, location)?
                == CommitOutcome::Committed
            {
                self.held.published(Holding { object, location });
                published += 1;
            }
        }
        Ok(published)
    }

    /// Stores each object in prompt order (as the live driver does: when the pool fills
    /// mid-prompt, the head is kept and the tail skipped, and a tail is worthless without
    /// its head): reserve, then commit at a fresh allocation.
    fn store(
        &mut self,
        node: usize,
        now: Timestamp,
        objects: &[ObjectId],
        tally: &mut ClusterTally,
    ) -> anyhow::Result<()> {
        let session = self.nodes[node].session;
        for object in objects {
            let operation = self.operation();
            let item = ReserveItem {
                object: *object,
                length_bytes: self.chunk_bytes,
            };
            match self.directory.reserve(now, session, operation, item)? {
                ReserveOutcome::Granted { replica, pool, .. } => {
                    let Some(location) = self.location(node, now, pool)? else {
                        // The live node cannot allocate either: it gives the grant back.
                        self.directory.abort(session, replica)?;
                        tally.skipped += 1;
                        continue;
                    };
                    let operation = self.operation();
                    match self
                        .directory
                        .commit(now, session, operation, replica, location)?
                    {
                        CommitOutcome::Committed => {
                            self.held.published(Holding {
                                object: *object,
                                location,
                            });
                            tally.stored += 1;
                        }
                        CommitOutcome::AlreadyPresent => {}
                    }
                }
                ReserveOutcome::Skip(_) => tally.skipped += 1,
                ReserveOutcome::AlreadyPresent | ReserveOutcome::Pending => {}
            }
        }
        Ok(())
    }
}

/// The cluster's clock at a request of the trace.
pub fn cluster_time(request: &Request, speedup: f64) -> Duration {
    Duration::from_secs_f64(request.timestamp_ms as f64 / 1e3 / speedup.max(1e-9))
}

/// Replays `requests` through the directory core, request `i` on engine `i % engines`,
/// each storing every block it misses and loading the cached prefix. Deterministic.
/// `progress` gets the count done and the token hit ratio so far.
pub fn simulate(
    requests: &[Request],
    config: &ClusterSimConfig,
    progress: &mut dyn FnMut(usize, f64),
) -> anyhow::Result<ClusterTally> {
    let mut cluster = SimulatedCluster::start(config).context("starting the simulated cluster")?;
    let mut tally = ClusterTally::default();
    for (index, request) in requests.iter().enumerate() {
        let now = Timestamp::ZERO + cluster_time(request, config.speedup);
        cluster.advance(now)?;
        let node = index % cluster.nodes.len();
        let objects = chain(cluster.namespace, &request.hash_ids);
        let loaded = cluster.load_prefix(node, now, &objects)?;
        tally.count_request(request, &loaded, &config.pricing);
        cluster.store(node, now, &objects[loaded.len()..], &mut tally)?;
        progress(index + 1, tally.token_hit_ratio());
    }
    tally.demoted = cluster.demoted;
    tally.replicated = cluster.replicated;
    tally.spilled = cluster.spilled;
    tally.restored = cluster.restored;
    tally.regions_reclaimed = cluster.regions_reclaimed();
    Ok(tally)
}

mod tally;
#[cfg(test)]
mod tests;
