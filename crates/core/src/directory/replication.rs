//! Replication on demand, the directory's side: when a node's lookup or acquire misses an
//! object whose READY replicas all sit where that node cannot map them, the answer stays
//! MISS at once (the forward path never waits) and the miss is recorded as a remote demand
//! (a repeated lookup adds none: polling never inflates it). Past
//! `replicate_after_misses` misses the directory plans one copy of the object towards the
//! node, when keeping the copy costs less than recomputing it:
//!
//! * into a shared (domain) pool that the source's owner and the requesting node both map:
//!   the owner copies (`TaskKind::Replicate`) and commits, like a demotion that keeps its
//!   source;
//! * otherwise, with `replicate_over_network`, into the requesting node's CPU pool: the
//!   source's owner streams the bytes (`TaskKind::Push`) and the requester receives,
//!   writes and commits them (`TaskKind::Receive`).
//!
//! The target is an ordinary reservation: READY only through the normal commit (idempotent
//! by operation id), aborted (never READY partial) when the source is retired, either node
//! ends, or the reservation expires. This module owns the demand table, the replications
//! in flight and their counters; all of them are bounded.

use super::replicas::{NewReplica, Replica};
use super::transfer_tokens::TransferTokens;
use super::{Directory, ReplicaState, SessionState, Task, TaskKind};
use crate::model::{
    Location, Medium, NodeId, ObjectId, PoolId, ReplicaId, Scope, SessionId, TaskId, Tier,
    Timestamp,
};
use crate::policy::replication::{most_demanded_first, ReplicationCost, Route};
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

/// Remote demands remembered at once, one per (object, requesting node): a few thousand
/// hot prefixes are what replication can serve within a demand window; a miss past the
/// bound is counted as skipped (`busy`), never stored.
pub const DEMANDS_MAX: usize = 4096;
/// Replications in flight at once in the whole cluster: each holds a target reservation
/// and a node task, and the copies share the nodes' transfer bandwidth, so more would only
/// queue. A demand past the bound waits in the demand table for a later tick.
pub const REPLICATIONS_IN_FLIGHT_MAX: usize = 256;
/// Miss-to-READY latencies kept until the directory actor takes them (at every tick);
/// older ones are dropped first when it falls behind.
pub const LATENCIES_MAX: usize = 4096;
/// A demand with no new miss for this long is forgotten: demand is counted in a window.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(60);

/// Why a demand that reached the threshold was not replicated: a fixed label set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Every pool the copy could go to is at its high watermark.
    NoRoom = 0,
    /// Keeping the copy costs more than recomputing the object.
    NotWorth,
    /// No pool the copy could go to: no shared domain, and no network copy (turned off,
    /// or the requester has no CPU pool).
    NoPath,
    /// A bound is reached (replications in flight, demands, reservations, replicas).
    Busy,
}

const _: () = assert!(SkipReason::Busy as usize == SkipReason::ALL.len() - 1);

impl SkipReason {
    /// Every reason, in label order.
    pub const ALL: [SkipReason; 4] = [
        SkipReason::NoRoom,
        SkipReason::NotWorth,
        SkipReason::NoPath,
        SkipReason::Busy,
    ];

    /// Its place in [`SkipReason::ALL`] and [`ReplicationCounts::skipped`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The metrics label.
    pub fn name(self) -> &'static str {
        match self {
            SkipReason::NoRoom => "no_room",
            SkipReason::NotWorth => "not_worth",
            SkipReason::NoPath => "no_path",
            SkipReason::Busy => "busy",
        }
    }
}

/// Replications since the directory started, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicationCounts {
    pub planned: u64,
    pub completed: u64,
    pub cancelled: u64,
    /// By [`SkipReason::index`].
    pub skipped: [u64; SkipReason::ALL.len()],
    /// Bytes of the replicas that became READY.
    pub completed_bytes: u64,
    /// Replications in flight now.
    pub in_flight: u64,
}

/// Which way a replication copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// Into a shared pool both nodes map, copied by the source's owner.
    Shared,
    /// Into the requester's CPU pool, over the network.
    Network,
}

/// Misses of one node for one object.
#[derive(Clone, Copy, Debug)]
struct Demand {
    misses: u32,
    first_miss: Timestamp,
    last_miss: Timestamp,
}

/// How a node asked for an object it could not map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Asked {
    /// A probe (an engine's lookup, which it may repeat while it waits): it records the
    /// node's demand once, and a repeat adds nothing.
    Lookup,
    /// An acquire: every miss counts towards `replicate_after_misses`.
    Load,
}

/// One replication in flight, by its target reservation.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    object: ObjectId,
    source: ReplicaId,
    source_owner: NodeId,
    requester: NodeId,
    first_miss: Timestamp,
    length_bytes: u64,
}

/// The demand table, the replications in flight and their counters.
pub(super) struct Replications {
    /// Bounded by [`DEMANDS_MAX`].
    demands: HashMap<(ObjectId, NodeId), Demand>,
    /// Bounded by [`REPLICATIONS_IN_FLIGHT_MAX`].
    in_flight: HashMap<ReplicaId, InFlight>,
    /// The objects of `in_flight`: one replication per object at a time.
    objects: HashSet<ObjectId>,
    counts: ReplicationCounts,
    /// Bounded by [`LATENCIES_MAX`].
    latencies: VecDeque<Duration>,
    /// The network copies' tokens.
    tokens: TransferTokens,
}

impl Replications {
    /// No demand and no replication yet; tokens from `tokens`.
    pub(super) fn new(tokens: TransferTokens) -> Replications {
        Replications {
            demands: HashMap::new(),
            in_flight: HashMap::new(),
            objects: HashSet::new(),
            counts: ReplicationCounts::default(),
            latencies: VecDeque::new(),
            tokens,
        }
    }
}

/// A replication the policy chose.
struct Plan {
    source: ReplicaId,
    target_pool: PoolId,
    allocated_bytes: u64,
    path: Path,
}

/// What planning decided for one demand.
enum Decision {
    Start(Plan),
    Skip(SkipReason),
    /// Nothing to replicate any more (the requester can read or is writing it, no READY
    /// source is left, or the requester is gone): the demand is dropped uncounted.
    Drop,
}

/// A copy the directory considers: `object` towards `node` from the READY replica
/// `source_id`, and what the copy saves there.
struct WantedCopy<'a> {
    object: &'a ObjectId,
    node: NodeId,
    source_id: ReplicaId,
    source: &'a Replica,
    cost: ReplicationCost,
}

impl Directory {
    /// Records the misses of `session` (`missed`, `asked` by a lookup or a load) whose
    /// object has a READY replica elsewhere, and plans the replications whose demand reached the threshold. Never
    /// fails: a bound reached is a counted skip.
    pub(super) fn record_remote_misses(
        &mut self,
        now: Timestamp,
        session: SessionId,
        missed: &[ObjectId],
        asked: Asked,
    ) {
        let threshold = self.config.replicate_after_misses;
        if threshold == 0 || missed.is_empty() {
            return;
        }
        let Some(node) = self.sessions.get(&session).map(|record| record.node) else {
            return;
        };
        for object in missed {
            let held_elsewhere = self
                .replicas
                .of_object(object)
                .any(|(_, replica)| replica.state == ReplicaState::Ready);
            if !held_elsewhere {
                continue;
            }
            let key = (*object, node);
            let demands = &mut self.replication.demands;
            if !demands.contains_key(&key) && demands.len() >= DEMANDS_MAX {
                self.count_skip(SkipReason::Busy);
                continue;
            }
            let misses = match demands.get_mut(&key) {
                // A lookup names a consumer once; polling it again never adds demand.
                Some(demand) if asked == Asked::Lookup => demand.misses,
                Some(demand) => {
                    demand.misses = demand.misses.saturating_add(1);
                    demand.last_miss = now;
                    demand.misses
                }
                None => {
                    let demand = Demand {
                        misses: 1,
                        first_miss: now,
                        last_miss: now,
                    };
                    self.replication.demands.insert(key, demand);
                    1
                }
            };
            if misses >= threshold && !self.replication.objects.contains(object) {
                self.try_replicate(now, *object, node, true);
            }
        }
    }

    /// Forgets demands idle past [`DEMAND_WINDOW`], then plans the waiting ones (their
    /// object's replication was busy or the bound was reached), most missed first.
    pub(super) fn plan_waiting_replications(&mut self, now: Timestamp) {
        let threshold = self.config.replicate_after_misses;
        self.replication
            .demands
            .retain(|_, demand| now.saturating_since(demand.last_miss) < DEMAND_WINDOW);
        if threshold == 0 {
            self.replication.demands.clear();
            return;
        }
        let mut waiting: Vec<(u32, (ObjectId, NodeId))> = self
            .replication
            .demands
            .iter()
            .filter(|((object, _), demand)| {
                demand.misses >= threshold && !self.replication.objects.contains(object)
            })
            .map(|(&key, demand)| (demand.misses, key))
            .collect();
        most_demanded_first(&mut waiting);
        for (_, (object, node)) in waiting {
            if self.replication.in_flight.len() >= REPLICATIONS_IN_FLIGHT_MAX {
                break;
            }
            if !self.replication.objects.contains(&object) {
                self.try_replicate(now, object, node, false);
            }
        }
    }

    /// Plans and starts a replication of `object` towards `node`. A skip is counted when
    /// `count_busy` or the reason is not `Busy` (a waiting demand is not counted again).
    fn try_replicate(&mut self, now: Timestamp, object: ObjectId, node: NodeId, count_busy: bool) {
        let key = (object, node);
        let decision = if self.replication.in_flight.len() >= REPLICATIONS_IN_FLIGHT_MAX {
            Decision::Skip(SkipReason::Busy)
        } else {
            self.replication_decision(&object, node)
        };
        let decision = match decision {
            Decision::Start(plan) => match self.start_replication(now, object, node, plan) {
                true => return,
                false => Decision::Skip(SkipReason::Busy),
            },
            other => other,
        };
        match decision {
            Decision::Skip(SkipReason::Busy) => {
                if count_busy {
                    self.count_skip(SkipReason::Busy);
                }
            }
            Decision::Skip(reason) => {
                self.count_skip(reason);
                self.replication.demands.remove(&key);
            }
            Decision::Start(_) | Decision::Drop => {
                self.replication.demands.remove(&key);
            }
        }
    }

    fn count_skip(&mut self, reason: SkipReason) {
        self.replication.counts.skipped[reason.index()] += 1;
    }

    /// The replication decision for `object` towards `node`: a READY source whose owner is
    /// live and maps it; a shared pool both map with room below its high watermark when
    /// the copy pays there ([`ReplicationCost::pays`]), else (with `replicate_over_network`
    /// and a peer endpoint on both nodes) the requester's CPU pool when the copy over the
    /// network pays. A skip names the reason of the candidate nearest to a copy
    /// ([`nearest`]).
    fn replication_decision(&self, object: &ObjectId, node: NodeId) -> Decision {
        let Some(requester) = self.live_session_of(node) else {
            return Decision::Drop;
        };
        let view = self.read_view(requester);
        if self.select_replica(&view, object).is_some() || self.pending_for(&view, object) {
            return Decision::Drop;
        }
        let Some((source_id, source)) = self.replication_source(object, node) else {
            return Decision::Drop;
        };
        let Some(owner) = self.live_session_of(source.owner) else {
            return Decision::Drop;
        };
        let Some(descriptor) = self
            .namespaces
            .get(&object.namespace)
            .map(|known| &known.descriptor)
        else {
            return Decision::Drop;
        };
        let (cost, tokens) = self.config.recompute_model(
            &descriptor.model,
            descriptor.chunk_tokens,
            source.length_bytes,
        );
        let wanted = WantedCopy {
            object,
            node,
            source_id,
            source,
            cost: ReplicationCost { cost, tokens },
        };
        match self.shared_plan(&wanted, owner, requester) {
            Ok(plan) => Decision::Start(plan),
            Err(refusal) => self.network_decision(&wanted, refusal),
        }
    }

    /// The first pool of a domain both `owner` and `requester` map, not holding the object
    /// yet, where the copy pays and fits below the high watermark; else the reason of the
    /// candidate that came closest to being chosen ([`SkipReason::NoPath`] for none).
    fn shared_plan(
        &self,
        wanted: &WantedCopy<'_>,
        owner: &super::sessions::Session,
        requester: &super::sessions::Session,
    ) -> Result<Plan, SkipReason> {
        // The reason of the candidate that came closest to being chosen.
        let mut refusal = SkipReason::NoPath;
        let shared = self.pools.iter().enumerate().filter(|(_, record)| {
            matches!(record.spec.scope, Scope::Domain(domain)
                if owner.domains.contains(&domain) && requester.domains.contains(&domain))
        });
        for (index, record) in shared {
            let pool = PoolId(index as u32);
            let holds_object = self.replicas.of_object(wanted.object).any(|(_, replica)| {
                replica.pool == pool && replica.state != ReplicaState::Retiring
            });
            if holds_object {
                continue;
            }
            let bytes = record.spec.rounded_bytes(wanted.source.length_bytes);
            let pays = wanted.cost.pays(&record.profile, bytes, Route::Shared);
            let room = self.room_below_high_watermark(record, bytes)
                && self.within_quota(pool, wanted.object, bytes);
            match candidate_refusal(pays, room) {
                None => {
                    return Ok(Plan {
                        source: wanted.source_id,
                        target_pool: pool,
                        allocated_bytes: bytes,
                        path: Path::Shared,
                    })
                }
                Some(reason) => refusal = nearest(refusal, reason),
            }
        }
        Err(refusal)
    }

    /// The decision once no shared pool took the copy (`refusal` the nearest shared
    /// candidate's reason): with `replicate_over_network` and a peer endpoint on both
    /// nodes, a copy over the network into the requester's own CPU pool (the partition of
    /// the object's salt group) when it pays and
    /// fits; else a skip for the nearest reason.
    fn network_decision(&self, wanted: &WantedCopy<'_>, refusal: SkipReason) -> Decision {
        let node = wanted.node;
        let network = self.config.replicate_over_network
            && self.nodes[node.0 as usize].peer_endpoint
            && self.nodes[wanted.source.owner.0 as usize].peer_endpoint;
        if !network {
            return Decision::Skip(refusal);
        }
        let own_cpu = self.pools.iter().enumerate().find(|(index, record)| {
            record.spec.scope == Scope::Host(node)
                && record.spec.medium == Medium::Cpu
                && record.owner_session == self.nodes[node.0 as usize].session
                && self.pool_admits(PoolId(*index as u32), wanted.object)
        });
        let Some((index, record)) = own_cpu else {
            return Decision::Skip(refusal);
        };
        let bytes = record.spec.rounded_bytes(wanted.source.length_bytes);
        let pays = wanted.cost.pays(&record.profile, bytes, Route::Network);
        match candidate_refusal(pays, self.room_below_high_watermark(record, bytes)) {
            None => Decision::Start(Plan {
                source: wanted.source_id,
                target_pool: PoolId(index as u32),
                allocated_bytes: bytes,
                path: Path::Network,
            }),
            Some(reason) => Decision::Skip(nearest(refusal, reason)),
        }
    }

    /// The open, live session of `node`.
    fn live_session_of(&self, node: NodeId) -> Option<&super::sessions::Session> {
        let session = self.nodes.get(node.0 as usize)?.session?;
        self.sessions
            .get(&session)
            .filter(|record| record.state == SessionState::Live)
    }

    /// A READY replica of `object` outside `node` whose owner maps its pool: its own host
    /// pool, or a domain pool of the owner's domains.
    fn replication_source(&self, object: &ObjectId, node: NodeId) -> Option<(ReplicaId, &Replica)> {
        self.replicas.of_object(object).find(|(_, replica)| {
            replica.state == ReplicaState::Ready
                && replica.owner != node
                // A staged (L2) replica is restored by its own node, never copied from.
                && self.pools[replica.pool.0 as usize].spec.medium.tier() == Tier::L1
                && match self.pools[replica.pool.0 as usize].spec.scope {
                    Scope::Host(owner) => owner == replica.owner,
                    Scope::Domain(domain) => self
                        .live_session_of(replica.owner)
                        .is_some_and(|owner| owner.domains.contains(&domain)),
                }
        })
    }

    /// Reserves the target and queues the tasks. `false` when a bound refuses.
    fn start_replication(
        &mut self,
        now: Timestamp,
        object: ObjectId,
        requester: NodeId,
        plan: Plan,
    ) -> bool {
        let Some(source) = self.replicas.get(plan.source) else {
            return false;
        };
        let (source_owner, source_location, length_bytes) =
            (source.owner, source.location(), source.length_bytes);
        let target_owner = match plan.path {
            Path::Shared => source_owner,
            Path::Network => requester,
        };
        let Some(session_id) = self.nodes[target_owner.0 as usize].session else {
            return false;
        };
        let full = self.sessions.get(&session_id).is_none_or(|session| {
            session.reservations.len() >= self.config.reservations_per_session_max as usize
        });
        if full || !self.replicas.has_room() {
            return false;
        }
        let first_miss = self
            .replication
            .demands
            .remove(&(object, requester))
            .map_or(now, |demand| demand.first_miss);
        let target = self.insert_reservation(NewReplica {
            object,
            pool: plan.target_pool,
            owner: target_owner,
            length_bytes,
            allocated_bytes: plan.allocated_bytes,
            deadline: now + self.config.reservation_duration,
        });
        if let Some(session) = self.sessions.get_mut(&session_id) {
            session.reservations.insert(target);
        }
        self.replication.in_flight.insert(
            target,
            InFlight {
                object,
                source: plan.source,
                source_owner,
                requester,
                first_miss,
                length_bytes,
            },
        );
        self.replication.objects.insert(object);
        self.replication.counts.planned += 1;
        self.queue_replication_tasks(&plan, source_location, target, requester);
        true
    }

    fn queue_replication_tasks(
        &mut self,
        plan: &Plan,
        source: Location,
        target: ReplicaId,
        requester: NodeId,
    ) {
        let InFlight {
            source_owner,
            object,
            ..
        } = self.replication.in_flight[&target];
        let kinds = match plan.path {
            Path::Shared => vec![(
                source_owner,
                TaskKind::Replicate {
                    source,
                    target,
                    target_pool: plan.target_pool,
                },
            )],
            Path::Network => {
                let token = self.replication.tokens.token(target);
                vec![
                    (
                        source_owner,
                        TaskKind::Push {
                            source,
                            target,
                            token,
                            length_bytes: source.length_bytes,
                            to: requester,
                        },
                    ),
                    (
                        requester,
                        TaskKind::Receive {
                            object,
                            target,
                            token,
                            target_pool: plan.target_pool,
                            length_bytes: source.length_bytes,
                            from: source_owner,
                        },
                    ),
                ]
            }
        };
        for (node, kind) in kinds {
            let task = Task {
                id: TaskId(self.next_task),
                kind,
            };
            self.next_task += 1;
            self.queue_task(node, task);
        }
    }

    /// The target of a replication was committed: it is done, and its tasks not yet
    /// handed out are dropped (a receiver may commit before its sender polled its push).
    pub(super) fn finish_replication(&mut self, now: Timestamp, target: ReplicaId) {
        let Some(done) = self.replication.in_flight.remove(&target) else {
            return;
        };
        self.drop_queued_tasks(&done, target);
        self.replication.objects.remove(&done.object);
        let counts = &mut self.replication.counts;
        counts.completed += 1;
        counts.completed_bytes += done.length_bytes;
        if self.replication.latencies.len() >= LATENCIES_MAX {
            self.replication.latencies.pop_front();
        }
        self.replication
            .latencies
            .push_back(now.saturating_since(done.first_miss));
    }

    /// The target of a replication is gone uncommitted: the replication is cancelled and
    /// its tasks not yet handed out are dropped.
    pub(super) fn cancel_replication(&mut self, target: ReplicaId) {
        let Some(cancelled) = self.replication.in_flight.remove(&target) else {
            return;
        };
        self.replication.objects.remove(&cancelled.object);
        self.replication.counts.cancelled += 1;
        self.drop_queued_tasks(&cancelled, target);
    }

    /// Drops the tasks of the replication into `target` that its nodes have not polled.
    fn drop_queued_tasks(&mut self, copy: &InFlight, target: ReplicaId) {
        for node in [copy.source_owner, copy.requester] {
            self.nodes[node.0 as usize]
                .tasks
                .retain(|task| replication_target(&task.kind) != Some(target));
        }
    }

    /// Aborts the targets of the replications `matching` selects: their source retired,
    /// or one of their nodes ended.
    fn abort_replications(&mut self, matching: impl Fn(&InFlight) -> bool) {
        let targets: Vec<ReplicaId> = self
            .replication
            .in_flight
            .iter()
            .filter(|(_, in_flight)| matching(in_flight))
            .map(|(target, _)| *target)
            .collect();
        for target in targets {
            let owner = self.replicas.get(target).map(|replica| replica.owner);
            let session = owner.and_then(|owner| self.nodes[owner.0 as usize].session);
            if let Some(session) = session.and_then(|id| self.sessions.get_mut(&id)) {
                session.reservations.remove(&target);
            }
            self.abort_reservation(target);
            // A target already gone (committed or aborted) left the books then.
            self.cancel_replication(target);
        }
    }

    /// `source` is retiring: the copies being made of it are cancelled.
    pub(super) fn cancel_replications_from(&mut self, source: ReplicaId) {
        if self.replication.in_flight.is_empty() {
            return;
        }
        self.abort_replications(|in_flight| in_flight.source == source);
    }

    /// `node`'s session ended: the copies it sends or receives are cancelled.
    pub(super) fn cancel_replications_of(&mut self, node: NodeId) {
        if self.replication.in_flight.is_empty() {
            return;
        }
        self.abort_replications(|in_flight| {
            in_flight.source_owner == node || in_flight.requester == node
        });
    }

    /// Whether `target` is the target of a replication in flight (its task is still due).
    pub(super) fn replicating_into(&self, target: ReplicaId) -> bool {
        self.replication.in_flight.contains_key(&target)
    }

    /// The replication counters.
    pub fn replication_counts(&self) -> ReplicationCounts {
        ReplicationCounts {
            in_flight: self.replication.in_flight.len() as u64,
            ..self.replication.counts
        }
    }

    /// Takes the miss-to-READY latencies of the replications completed since the last
    /// call (at most [`LATENCIES_MAX`], the latest).
    pub fn take_replication_latencies(&mut self) -> Vec<Duration> {
        self.replication.latencies.drain(..).collect()
    }

    /// The replication books agree and stay bounded: every target in flight is a
    /// reservation of its object, no two targets share an object, every source is READY
    /// (a retired source cancels its copies); and, paired, every replication in flight has
    /// its source's task (queued or handed out) and every queued replication task is for
    /// a replication in flight, on one of its two nodes (an ended copy drops its queued
    /// tasks).
    pub(super) fn check_replications(&self) {
        self.check_replication_bounds();
        let replication = &self.replication;
        let mut sources_tasked = HashSet::new();
        for (index, record) in self.nodes.iter().enumerate() {
            let node = NodeId(index as u32);
            let handed = record.handed_out.iter().map(|(_, task)| task);
            for task in record.tasks.iter().chain(handed) {
                let Some(target) = replication_target(&task.kind) else {
                    continue;
                };
                let sends = !matches!(task.kind, TaskKind::Receive { .. });
                let in_flight = replication.in_flight.get(&target);
                if sends && in_flight.is_some_and(|copy| copy.source_owner == node) {
                    sources_tasked.insert(target);
                }
            }
            for task in &record.tasks {
                let Some(target) = replication_target(&task.kind) else {
                    continue;
                };
                let in_flight = replication.in_flight.get(&target);
                assert!(
                    in_flight
                        .is_some_and(|copy| copy.source_owner == node || copy.requester == node),
                    "queued replication task {task:?} of node {index} for no copy of its in flight"
                );
            }
        }
        for target in replication.in_flight.keys() {
            assert!(
                sources_tasked.contains(target),
                "replication into {target:?} in flight with no task at its source"
            );
        }
    }

    /// The bounds and per-target checks of [`Directory::check_replications`].
    fn check_replication_bounds(&self) {
        let replication = &self.replication;
        assert!(
            replication.demands.len() <= DEMANDS_MAX,
            "demand table over its bound"
        );
        assert!(
            replication.in_flight.len() <= REPLICATIONS_IN_FLIGHT_MAX,
            "replications over their bound"
        );
        assert!(replication.latencies.len() <= LATENCIES_MAX);
        assert_eq!(
            replication.objects.len(),
            replication.in_flight.len(),
            "one replication per object"
        );
        for (target, in_flight) in &replication.in_flight {
            let replica = self.replicas.get(*target);
            assert!(
                replica.is_some_and(|replica| replica.state == ReplicaState::Reserved
                    && replica.object == in_flight.object),
                "replication target {target:?} not a reservation of its object"
            );
            assert!(replication.objects.contains(&in_flight.object));
            assert_eq!(
                self.replicas
                    .get(in_flight.source)
                    .map(|source| source.state),
                Some(ReplicaState::Ready),
                "replication of {:?} from a source not READY",
                in_flight.object
            );
        }
    }
}

/// Why one candidate target pool does not take a copy (`None`: it does): a copy that does
/// not pay is `NotWorth` whatever the room, one that pays but does not fit is `NoRoom`.
fn candidate_refusal(pays: bool, room: bool) -> Option<SkipReason> {
    match (pays, room) {
        (false, _) => Some(SkipReason::NotWorth),
        (true, false) => Some(SkipReason::NoRoom),
        (true, true) => None,
    }
}

/// Of two candidates' refusals, the one nearer to a copy: `NoRoom` (it would pay, but
/// does not fit) before `NotWorth` (a candidate exists, but the copy does not pay) before
/// `NoPath` (no candidate at all).
fn nearest(left: SkipReason, right: SkipReason) -> SkipReason {
    let rank = |reason: SkipReason| match reason {
        SkipReason::NoPath => 0,
        SkipReason::NotWorth => 1,
        SkipReason::NoRoom => 2,
        SkipReason::Busy => 3,
    };
    if rank(right) > rank(left) {
        right
    } else {
        left
    }
}

/// The replication target a task works on, if it is a replication task.
fn replication_target(kind: &TaskKind) -> Option<ReplicaId> {
    match *kind {
        TaskKind::Replicate { target, .. }
        | TaskKind::Push { target, .. }
        | TaskKind::Receive { target, .. } => Some(target),
        TaskKind::Reclaim { .. }
        | TaskKind::Demote { .. }
        | TaskKind::Recall { .. }
        | TaskKind::Delegate { .. } => None,
    }
}
