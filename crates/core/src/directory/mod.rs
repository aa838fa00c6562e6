//! The directory: the metadata authority of a kvtier cluster, as a sans-I/O state machine.
//!
//! It owns objects and their replicas, pools and their budgets, nodes, sessions and epochs,
//! read leases, the publication state machine and the reclaim task queues. It never
//! touches KV bytes, never reads a clock (every method that depends on time takes `now`),
//! never sleeps and never spawns: the directory actor calls it and sends what it returns.
//!
//! The invariants it keeps (docs/design.md, Invariants) are checked by
//! [`Directory::check_invariants`]
//! after every step of the property and simulation tests:
//! READY means committed; content is immutable; acquire atomically checks READY and
//! accessibility and takes a lease; retiring blocks acquires and storage is freed only
//! after the last release and the owner's reclaim acknowledgement; stale ids are refused;
//! a replica in a pool the requester cannot map is never a hit; epochs and operation ids
//! fence retries; a silent node's replicas are hidden but freed only once it is fenced.
//!
//! Layout, one operation family per module, each an `impl Directory` block: `session_ops`
//! (open, heartbeat, close, fencing), `registry` (pools, profiles, namespaces), `store`
//! (reserve, commit, abort, resolve, reservation deadlines), `load` (probe, acquire,
//! release, leases), `delegations` (hits a node answers itself, and their recall), `reclaim` (retire, reclaim tasks, freeing), `extents` (shared-pool
//! extents), `maintenance` (tick, eviction, access history, reports), `drain` (a node's graceful way out), `status` (nodes as `ctl status` shows them), `demotion`, `replication` (copies on remote demand) and
//! `expiry` (leaving a tier), `idempotency` (the ledger check of reserve, commit and
//! grant_extent) and `invariants`. The records they work on are in `sessions`, `pools`,
//! `replicas`, `leases` and `ledger`; the messages in `ops`.

mod adoption;
pub mod config;
mod delegations;
mod demotion;
pub mod drain;
pub mod error;
mod expiry;
mod extents;
mod idempotency;
mod invariants;
pub mod leadership;
mod leases;
pub mod ledger;
mod load;
mod locate;
mod maintenance;
mod namespaces;
pub mod ops;
mod pools;
mod quotas;
mod reclaim;
mod registry;
pub mod reload;
mod replicas;
pub mod replication;
mod session_ops;
mod sessions;
mod staged;
pub mod status;
mod store;
mod store_batch;
mod transfer_tokens;

pub use adoption::{AdoptOutcome, Holding};
pub use config::{DirectoryConfig, RecomputeCost, TierQuota, CTL_MODEL, CTL_RECOMPUTE_US_PER_MIB};
pub use delegations::{LocalHits, RecallReason, OFFERS_QUEUED_MAX};
pub use drain::{DrainProgress, DrainState, DrainStuck};
pub use error::{DirectoryError, Table};
pub use invariants::ReplicatedState;
pub use locate::NodeRun;
pub use ops::*;
pub use replicas::ReplicaState;
pub use replication::{ReplicationCounts, SkipReason};
pub use sessions::SessionState;
pub use status::NodeStatus;
pub use store_batch::{CommitBatchItem, ReserveBatchItem};

use crate::model::{
    NamespaceId, NodeId, PoolId, PoolSpec, PoolUsage, ReplicaId, Scope, SessionId, Timestamp,
};
use crate::policy::history::History;
use crate::policy::profiles::TierProfile;
use leases::LeaseTable;
use pools::PoolRecord;
use replicas::ReplicaTable;
use sessions::{NodeRecord, Session};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// Largest accepted object, in bytes: a chunk of KV state is megabytes, never terabytes.
pub const OBJECT_BYTES_MAX: u64 = 1 << 32;
/// Extents of one shared pool: 65536 extents of 64 MiB cover 4 TiB of CXL memory.
pub const EXTENTS_PER_POOL_MAX: u64 = 1 << 16;
/// Largest accepted pool capacity, in bytes: 256 TiB, above any host's memory or CXL
/// device. Watermark arithmetic multiplies a capacity by 100, and usage sums add up to
/// `pools_max` capacities: under this bound neither overflows a `u64`.
pub const POOL_CAPACITY_BYTES_MAX: u64 = 1 << 48;
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
    /// Drains whose state (or stuck reason) this tick changed, with their progress now.
    pub drains: Vec<(NodeId, DrainProgress)>,
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

/// Which shard of a sharded directory a core is ([`crate::protocol::shards`]): each shard
/// owns the objects a keyed hash gives it, issues ids that name it
/// ([`crate::model::shard_stamp`]), and reserves against its share of every pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardPlace {
    /// This shard, below `count`.
    pub index: usize,
    /// Shards of the directory, 1 to [`crate::model::SHARDS_MAX`].
    pub count: usize,
}

impl ShardPlace {
    /// The only shard of an unsharded directory.
    pub const ALONE: ShardPlace = ShardPlace { index: 0, count: 1 };

    /// This shard's part of `total` bytes: an equal share, the first shards taking one byte
    /// more each until the shares add up to `total`.
    pub fn share(self, total: u64) -> u64 {
        let count = self.count.max(1) as u64;
        total / count + u64::from((self.index as u64) < total % count)
    }
}

/// The directory state machine. See the module documentation for its contract.
pub struct Directory {
    config: DirectoryConfig,
    /// Which shard this core is.
    shard: ShardPlace,
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
    /// Tasks queued for nodes so far (hand-outs again included): a change tells the
    /// caller that some node may have tasks to fetch ([`Directory::tasks_queued`]).
    tasks_queued: u64,
    namespaces: HashMap<NamespaceId, namespaces::RegisteredNamespace, foldhash::fast::RandomState>,
    /// Counts registrations, to forget the least recently registered namespace first.
    namespace_clock: u64,
    /// Reservation deadlines in grant order (all reservations have the same duration).
    /// Entries of committed or aborted reservations are skipped; the queue holds at most
    /// one entry per reservation granted within `reservation_duration`.
    reservation_deadlines: VecDeque<(Timestamp, ReplicaId)>,
    /// Evictions started outside `tick` (by a reserve that found no room), reported by the
    /// next `tick`.
    evictions_unreported: u32,
    /// Evictions under pressure so far, by the medium of the victim's pool (in the order of
    /// [`crate::model::Medium::ALL`]).
    evictions_by_medium: [u64; crate::model::Medium::ALL.len()],
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
    /// This incarnation's recovery window and rejoin budget ([`adoption`]).
    recovery: adoption::Recovery,
    /// Drains started, one per node at most (bounded by `nodes_max`).
    drains: HashMap<NodeId, drain::DrainRecord>,
    /// Remote demands and replications in flight ([`replication`]), each bounded there.
    replication: replication::Replications,
    /// Delegations in force and recalled ([`delegations`]): each a live lease.
    delegations: delegations::Delegations,
    /// In a shard of several: the replicas this shard committed into or freed from shared
    /// pools' extents since the router last took them ([`Directory::take_extent_deltas`]).
    /// Bounded by what one call does; empty in a directory of one shard.
    extent_deltas: Vec<ExtentDelta>,
}

/// A change of an extent's committed replicas in one shard, which every other shard of a
/// sharded directory applies ([`Directory::apply_extent_deltas`]) so that all of them
/// release an extent at the same moment: when its last replica, of any shard, goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentDelta {
    pub pool: PoolId,
    pub offset_bytes: u64,
    /// A replica committed (`true`) or freed.
    pub added: bool,
    /// Until when the extent cools if this frees it.
    pub cool_until: Timestamp,
}

impl Directory {
    /// An empty directory of one shard.
    pub fn new(config: DirectoryConfig) -> Directory {
        Directory::new_shard(config, ShardPlace::ALONE)
    }

    /// An empty shard `shard` of a sharded directory: the ids it issues name it, and it
    /// reserves against its share of each pool and of each salt group's quotas.
    pub fn new_shard(config: DirectoryConfig, shard: ShardPlace) -> Directory {
        let mut config = config;
        config.group_quotas = shard_quotas(shard, &config.group_quotas);
        Directory {
            shard,
            replicas: ReplicaTable::new(
                config.replicas_max,
                config.hash_seed_or_random(),
                shard.index,
            ),
            leases: LeaseTable::new(config.leases_max, shard.index),
            pools: Vec::new(),
            pool_ids: HashMap::new(),
            nodes: Vec::new(),
            node_ids: HashMap::new(),
            sessions: HashMap::default(),
            retired_sessions: VecDeque::new(),
            next_session: 1,
            next_task: crate::model::shard_stamp(shard.index) | 1,
            tasks_queued: 0,
            namespaces: HashMap::default(),
            namespace_clock: 0,
            reservation_deadlines: VecDeque::new(),
            evictions_unreported: 0,
            evictions_by_medium: [0; crate::model::Medium::ALL.len()],
            latest_tick: Timestamp::ZERO,
            demotions: HashMap::new(),
            demoting: HashSet::new(),
            history: History::new(),
            recovery: adoption::Recovery {
                until: Timestamp::ZERO,
                adopted: false,
                budget: config.adopt_items_per_tick,
            },
            drains: HashMap::new(),
            replication: replication::Replications::new(transfer_tokens::TransferTokens::of(
                &config,
            )),
            delegations: delegations::Delegations::default(),
            extent_deltas: Vec::new(),
            config,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &DirectoryConfig {
        &self.config
    }

    /// Replaces the namespaces' recompute costs (a reload of `[namespaces]`): later
    /// demotion, spill and replication decisions use them.
    pub fn set_namespace_costs(&mut self, costs: BTreeMap<String, RecomputeCost>) {
        self.config.namespace_costs = costs;
    }

    /// Replaces the salt groups' quotas (a reload of the tenant rules' `cxl_bytes` and
    /// `ssd_bytes`): placement and eviction follow the new ones from the next call.
    /// A sharded directory's shard keeps its share of each quota.
    pub fn set_group_quotas(&mut self, quotas: BTreeMap<crate::model::SaltGroup, TierQuota>) {
        self.config.group_quotas = shard_quotas(self.shard, &quotas);
    }

    /// Which shard this core is.
    pub fn shard(&self) -> ShardPlace {
        self.shard
    }

    /// The extent changes of this shard since the last call, for the other shards.
    pub fn take_extent_deltas(&mut self) -> Vec<ExtentDelta> {
        std::mem::take(&mut self.extent_deltas)
    }

    /// Applies another shard's extent changes: the replica counts of the other shards,
    /// and the extents their last replica's free released.
    pub fn apply_extent_deltas(&mut self, deltas: &[ExtentDelta]) {
        for delta in deltas {
            let Some(extents) = self
                .pools
                .get_mut(delta.pool.0 as usize)
                .and_then(|record| record.extents.as_mut())
            else {
                continue;
            };
            if delta.added {
                extents.add_elsewhere(delta.offset_bytes);
            } else {
                let sessions = &self.sessions;
                extents.remove_replica(
                    delta.offset_bytes,
                    true,
                    |session| {
                        sessions
                            .get(&session)
                            .is_some_and(sessions::Session::is_open)
                    },
                    delta.cool_until,
                );
            }
        }
    }

    /// Notes an extent change for the other shards (none in a directory of one shard).
    fn note_extent_delta(&mut self, delta: ExtentDelta) {
        if self.shard.count > 1 {
            self.extent_deltas.push(delta);
        }
    }

    /// The `now` of the latest `tick` (zero before the first): a time no later than now.
    pub fn latest_time(&self) -> Timestamp {
        self.latest_tick
    }
}

/// Shard `shard`'s part of each salt group's quotas.
fn shard_quotas(
    shard: ShardPlace,
    quotas: &BTreeMap<crate::model::SaltGroup, TierQuota>,
) -> BTreeMap<crate::model::SaltGroup, TierQuota> {
    quotas
        .iter()
        .map(|(group, quota)| {
            let share = |bytes: Option<u64>| bytes.map(|bytes| shard.share(bytes));
            (
                *group,
                TierQuota {
                    cxl_bytes: share(quota.cxl_bytes),
                    ssd_bytes: share(quota.ssd_bytes),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_delegations;
#[cfg(test)]
mod tests_evictions;
#[cfg(test)]
mod tests_fenced_reclaims;
#[cfg(test)]
mod tests_partitions;
#[cfg(test)]
mod tests_peer_path;
#[cfg(test)]
mod tests_replication;
#[cfg(test)]
mod tests_replication_bounds;
#[cfg(test)]
mod tests_replication_skips;
#[cfg(test)]
mod tests_retire_held;
#[cfg(test)]
mod tests_staged;
#[cfg(test)]
mod tests_store_batch;
