//! How a simulated node rejoins a directory that lost its session (it restarted, or fenced
//! the node), as `actors::node::rejoin` does, with the same node core: it stops serving,
//! forgets what only the lost session could answer (`NodeCore::session_lost`), opens a
//! new session, gives up its shared extents when it was silent for its fence window to
//! the same directory incarnation, registers its CPU pool and namespaces again (their ids
//! must not change), claims the extents whose owner words still name it (taking them again
//! in the words), and reports its `Holdings` in batches of at most `batch_items_max`, each sent
//! again at the next tick while the directory paces it. Rejoin calls go straight to the
//! directory, like start-up.
//!
//! Checked: every replica a node held when the directory was killed is READY again when
//! its rejoin ends, unless its extent was lost or a newer copy of its object is READY in
//! the same pool (written in the new incarnation before the node reported its own) or the
//! pool's books were full of the new incarnation's reservations (counted apart); the directory takes at most
//! `adopt_items_per_tick` report items per tick; a node's ids never change; nothing but a
//! rejoin report is ever paced.

use super::node::{media_orders, operation_of, Pending, Purpose, SimNode};
use super::tenants::{cpu_pool_spec, descriptor_of, TENANTS};
use super::world::{World, ADOPT_ITEMS_PER_TICK};
use kvtier_core::directory::{AdoptOutcome, DirectoryError, ExtentClaim, Holding};
use kvtier_core::model::extent_owner::{take_extent, Ownership, TakeFrom};
use kvtier_core::model::{Location, NodeId, OwnerWord, PoolId};
use kvtier_core::node::Liveness;
use kvtier_core::protocol::messages::{DirectoryReply, DirectoryRequest, ProtocolError};
use std::collections::VecDeque;
use std::time::Duration;

/// Where a rejoin stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Open,
    Claim,
    Adopt,
}

/// A rejoin under way. See the module documentation.
#[derive(Debug)]
pub struct Rejoin {
    phase: Phase,
    batch_items_max: usize,
    /// Whether the node was silent for its fence window when it lost its session.
    silent: bool,
    /// The directory incarnation of the lost session.
    lost_incarnation: u16,
    /// Extents to claim, in batches, by pool, with the owner word the node wrote.
    claims: VecDeque<(PoolId, Vec<ExtentToClaim>)>,
    /// Holdings to report, in batches.
    reports: VecDeque<Vec<Holding>>,
}

/// An extent a rejoining node claims: its offset, length and the owner word it wrote.
type ExtentToClaim = (u64, u64, Option<OwnerWord>);

impl Rejoin {
    /// Whether the node is still opening its new session (it has claimed nothing yet).
    pub(super) fn is_opening(&self) -> bool {
        self.phase == Phase::Open
    }
}

/// What a node held when the directory was killed, and what became of it since.
#[derive(Debug, Default)]
pub struct HeldAtKill {
    replicas: Vec<Holding>,
    lost_extents: Vec<(PoolId, u64, u64)>,
    adopted: Vec<Location>,
    superseded: Vec<Location>,
    crowded: Vec<Location>,
    /// Freed since by a reclaim the killed incarnation had asked for (one that waited for
    /// the node's own readers to go).
    reclaimed: Vec<Location>,
}

impl SimNode {
    /// The node freed `location` on a reclaim: a replica it held when the directory was
    /// killed is then not reported on rejoining.
    pub(super) fn reclaimed(&mut self, location: Location) {
        if let Some(held) = self.held_at_kill.as_mut() {
            held.reclaimed.push(location);
        }
    }

    /// The directory was killed: a node that is up remembers what it holds, to check its
    /// rejoin against.
    pub(super) fn directory_killed(&mut self) {
        if self.session.is_some() || self.rejoin.is_some() {
            self.held_at_kill = Some(HeldAtKill {
                replicas: self.core.holdings.replicas(),
                ..HeldAtKill::default()
            });
        }
    }
}

impl World {
    /// Node `node` lost its session: it stops serving and starts to rejoin.
    pub(super) fn session_lost(&mut self, node: usize) {
        let silent = self.nodes[node].core.liveness.may_be_fenced(self.now);
        let lost_incarnation = self.nodes[node]
            .session
            .map_or(0, |session| session.incarnation());
        self.nodes[node].core.session_lost();
        // What was in flight in the lost session is never answered.
        let pending = std::mem::take(&mut self.nodes[node].pending);
        for pending in pending.into_values() {
            self.abandon(node, pending);
        }
        let state = &mut self.nodes[node];
        // The engine keeps reading under its leases to their deadlines; the node forgot them.
        self.orphan_leases.append(&mut state.leases);
        state.committed.clear();
        state.session = None;
        state.connection += 1;
        state.rejoin = Some(Rejoin {
            phase: Phase::Open,
            batch_items_max: 1,
            silent,
            lost_incarnation,
            claims: VecDeque::new(),
            reports: VecDeque::new(),
        });
        self.stats.covered.rejoins += 1;
    }

    /// A request of a lost session: its operation and the client's slots are given back.
    fn abandon(&mut self, node: usize, pending: Pending) {
        if let Some(operation) = operation_of(&pending.request) {
            self.nodes[node].core.operations.end(operation);
        }
        match pending.purpose {
            Purpose::Store {
                ticket,
                tenant,
                early,
                ..
            } => self.end_early_store(node, tenant, ticket, early),
            Purpose::Restore { object } => self.restore_ended(node, &object),
            Purpose::Commit { replica, .. } => {
                self.spill_answered(node, replica);
                self.nodes[node].transfers.finished(replica);
            }
            Purpose::Acquire { count, tenant } => {
                let state = &mut self.nodes[node];
                let client = state.clients[tenant];
                if let Some(books) = client.and_then(|client| state.core.client(client)) {
                    books.leases_granted(count, Vec::new());
                }
            }
            _ => {}
        }
    }

    /// An extent the node may no longer write leaves its allocator and its holdings.
    fn lose_extent(&mut self, node: usize, domain: u32, offset: u64, length: u64) {
        let Some(pool) = self.pool_of_domain(domain) else {
            return;
        };
        let state = &mut self.nodes[node];
        if let Some(allocator) = state.cxl.get_mut(&domain) {
            allocator.drop_extent(offset);
        }
        state.core.holdings.extent_lost(pool, offset, length);
        if let Some(held) = state.held_at_kill.as_mut() {
            held.lost_extents.push((pool, offset, length));
        }
        self.stats.covered.extents_lost += 1;
    }

    /// One step of node `node`'s rejoin.
    pub(super) fn rejoin_step(&mut self, node: usize) {
        let Some(phase) = self.nodes[node].rejoin.as_ref().map(|rejoin| rejoin.phase) else {
            return;
        };
        match phase {
            Phase::Open => self.rejoin_open(node),
            Phase::Claim => self.rejoin_claim(node),
            Phase::Adopt => self.rejoin_adopt(node),
        }
    }

    fn rejoin_open(&mut self, node: usize) {
        let seed = self.stats.seed;
        let (write_order, read_order) = media_orders(node);
        let opened_at = self.now;
        let request = DirectoryRequest::Open {
            write_order,
            read_order,
        };
        let DirectoryReply::Opened(opened) = self.call(node, request) else {
            return;
        };
        let state = &mut self.nodes[node];
        assert_eq!(
            Some(opened.node),
            state.node_id,
            "seed={seed}: node {node} rejoined under another node id"
        );
        state.session = Some(opened.session);
        let fence_after = Duration::from_millis(opened.fence_after_ms);
        state.core.liveness = Liveness::new(opened_at, fence_after);
        let owned: Vec<PoolId> = state.cpu.iter().map(|(pool, _)| *pool).collect();
        for (tenant, own) in owned.into_iter().enumerate() {
            let spec = cpu_pool_spec(node, opened.node, tenant);
            let reply = self.call(node, DirectoryRequest::RegisterPool(spec));
            assert!(
                matches!(reply, DirectoryReply::Pool(pool) if pool == own),
                "seed={seed}: node {node}'s CPU partition {own:?} came back as {reply:?}"
            );
        }
        if let Some(own) = self.nodes[node].ssd.as_ref().map(|ssd| ssd.pool) {
            let again = self.register_ssd(node, opened.node);
            assert_eq!(
                again,
                Some(own),
                "seed={seed}: node {node}'s SSD pool {own:?} came back as {again:?}"
            );
        }
        for (id, registered) in self.nodes[node].core.holdings.namespaces() {
            let reply = self.call(node, DirectoryRequest::RegisterNamespace(registered));
            assert!(
                matches!(reply, DirectoryReply::Namespace(again) if again == id),
                "seed={seed}: node {node}'s namespace came back as {reply:?}"
            );
        }
        if self.nodes[node].core.holdings.namespaces().is_empty() {
            for tenant in 0..TENANTS.len() {
                self.call(
                    node,
                    DirectoryRequest::RegisterNamespace(descriptor_of(tenant)),
                );
            }
        }
        let batch = (opened.batch_items_max as usize).max(1);
        let claims = self.extents_to_claim(node, opened.session.incarnation(), opened.node, batch);
        if let Some(rejoin) = self.nodes[node].rejoin.as_mut() {
            rejoin.batch_items_max = batch;
            rejoin.claims = claims;
            rejoin.phase = Phase::Claim;
        }
        self.rejoin_next(node);
    }

    /// The extents node `node` claims in its new session (of directory incarnation
    /// `incarnation`), in batches: after a silence past its fence window, none when the
    /// directory it was silent to answers again, and otherwise those whose owner words
    /// still name it, taken again in the words (as `actors::node::rejoin` does).
    fn extents_to_claim(
        &mut self,
        node: usize,
        incarnation: u16,
        node_id: NodeId,
        batch: usize,
    ) -> VecDeque<(PoolId, Vec<ExtentToClaim>)> {
        let (silent, lost_incarnation) = self.nodes[node]
            .rejoin
            .as_ref()
            .map_or((false, 0), |rejoin| {
                (rejoin.silent, rejoin.lost_incarnation)
            });
        let fenced_here = incarnation == lost_incarnation;
        let mut domains: Vec<u32> = self.nodes[node].cxl.keys().copied().collect();
        domains.sort_unstable();
        let mut claims = VecDeque::new();
        for domain in domains {
            let extents: Vec<(u64, u64)> = self.nodes[node].cxl[&domain].extents().collect();
            let mut kept = Vec::new();
            for (offset, length) in extents {
                let taken = match self.owner_words.get(&domain) {
                    Some(words) if !(silent && fenced_here) => {
                        take_extent(words, offset / length, node_id, TakeFrom::Held)
                    }
                    _ => Ownership::Refused(OwnerWord::NOBODY),
                };
                match taken {
                    Ownership::Taken(word) => kept.push((offset, length, Some(word))),
                    Ownership::Untracked if !silent => kept.push((offset, length, None)),
                    Ownership::Refused(found)
                        if found.owner().is_some_and(|owner| owner != node_id) =>
                    {
                        self.stats.covered.extents_found_taken += 1;
                        self.lose_extent(node, domain, offset, length)
                    }
                    Ownership::Untracked | Ownership::Refused(_) => {
                        self.lose_extent(node, domain, offset, length)
                    }
                }
            }
            if silent && !fenced_here {
                self.stats.covered.extents_kept_after_silence += kept.len() as u64;
            }
            let Some(pool) = self.pool_of_domain(domain) else {
                continue;
            };
            for chunk in kept.chunks(batch) {
                claims.push_back((pool, chunk.to_vec()));
            }
        }
        claims
    }

    /// Moves on when the current phase has nothing left to send.
    fn rejoin_next(&mut self, node: usize) {
        let Some(rejoin) = self.nodes[node].rejoin.as_mut() else {
            return;
        };
        if rejoin.phase == Phase::Claim && rejoin.claims.is_empty() {
            let mut holdings = self.nodes[node].core.holdings.replicas();
            holdings.sort_by_key(|held| (held.location.pool, held.location.allocation));
            let Some(rejoin) = self.nodes[node].rejoin.as_mut() else {
                return;
            };
            rejoin.reports = holdings
                .chunks(rejoin.batch_items_max)
                .map(<[Holding]>::to_vec)
                .collect();
            rejoin.phase = Phase::Adopt;
        }
        let done = self.nodes[node]
            .rejoin
            .as_ref()
            .is_some_and(|rejoin| rejoin.phase == Phase::Adopt && rejoin.reports.is_empty());
        if done {
            self.rejoined(node);
        }
    }

    fn rejoin_claim(&mut self, node: usize) {
        let Some((pool, chunk)) = self.nodes[node]
            .rejoin
            .as_ref()
            .and_then(|rejoin| rejoin.claims.front().cloned())
        else {
            return self.rejoin_next(node);
        };
        let claims = chunk
            .iter()
            .map(|&(offset_bytes, _, owner_word)| ExtentClaim {
                offset_bytes,
                owner_word,
            })
            .collect();
        let request = DirectoryRequest::ClaimExtents { pool, claims };
        let Some(reply) = self.send_report(node, request, chunk.len()) else {
            return;
        };
        let DirectoryReply::Claimed(answers) = reply else {
            panic!("seed={}: a claim was answered {reply:?}", self.stats.seed);
        };
        if let Some(rejoin) = self.nodes[node].rejoin.as_mut() {
            rejoin.claims.pop_front();
        }
        let domain = self.cxl_pools.get(&pool).copied().unwrap_or(u32::MAX);
        for (&(offset, length, _), claimed) in chunk.iter().zip(answers) {
            if !claimed {
                self.lose_extent(node, domain, offset, length);
            }
        }
        self.rejoin_next(node);
    }

    fn rejoin_adopt(&mut self, node: usize) {
        let Some(batch) = self.nodes[node]
            .rejoin
            .as_ref()
            .and_then(|rejoin| rejoin.reports.front().cloned())
        else {
            return self.rejoin_next(node);
        };
        let request = DirectoryRequest::Adopt {
            holdings: batch.clone(),
        };
        let Some(reply) = self.send_report(node, request, batch.len()) else {
            return;
        };
        let DirectoryReply::Adopted(outcomes) = reply else {
            panic!("seed={}: a report was answered {reply:?}", self.stats.seed);
        };
        if let Some(rejoin) = self.nodes[node].rejoin.as_mut() {
            rejoin.reports.pop_front();
        }
        for (holding, outcome) in batch.iter().zip(outcomes) {
            match outcome {
                AdoptOutcome::Adopted | AdoptOutcome::Known => self.adopted(node, holding),
                AdoptOutcome::Refused => self.adoption_refused(node, holding),
            }
        }
        self.rejoin_next(node);
    }

    /// Checks that `holding`, adopted (or already known), is READY where the node holds it,
    /// and notes it adopted.
    fn adopted(&mut self, node: usize, holding: &Holding) {
        assert!(
            self.directory
                .ready_locations(&holding.object)
                .contains(&holding.location),
            "seed={}: node {node}'s {:?} was adopted but is not READY",
            self.stats.seed,
            holding.object
        );
        self.stats.covered.adopted += 1;
        if let Some(held) = self.nodes[node].held_at_kill.as_mut() {
            held.adopted.push(holding.location);
        }
    }

    /// Notes why the adoption of `holding` was refused (superseded by a copy of the new
    /// incarnation in the same pool, or a pool crowded by its reservations), and frees its
    /// pages once a lease of the lost incarnation must have ended.
    fn adoption_refused(&mut self, node: usize, holding: &Holding) {
        self.stats.covered.adoptions_refused += 1;
        // Refused as a duplicate: the object is READY in the same pool, written
        // there in the new incarnation before this node reported its copy.
        let superseded = self
            .directory
            .ready_locations(&holding.object)
            .iter()
            .any(|ready| ready.pool == holding.location.pool);
        // Refused for room: the pool's books are full of reservations of the new
        // incarnation, though the node's extent holds the replica (a known gap:
        // adoption counts reservations that will be aborted).
        // Over all shards: a shard lends another its free budget for a rejoin.
        let crowded = self.directory.usage().iter().any(|report| {
            report.pool == holding.location.pool
                && report.usage.reserved_bytes > 0
                && report.usage.capacity_bytes
                    < report.usage.reserved_bytes
                        + report.usage.allocated_bytes
                        + holding.location.length_bytes
        });
        if let Some(held) = self.nodes[node].held_at_kill.as_mut() {
            if superseded {
                held.superseded.push(holding.location);
            } else if crowded {
                held.crowded.push(holding.location);
            }
        }
        // Pages an engine may still read under a lease of the lost session's
        // incarnation: freed once that lease must have ended.
        let free_at = self.now + self.directory.recovery_window();
        self.nodes[node]
            .core
            .holdings
            .refused(holding.location, free_at);
    }

    /// Sends a rejoin report of `items` items: its reply, or `None` when it was paced (sent
    /// again next tick) or the session is gone again (the rejoin starts over).
    fn send_report(
        &mut self,
        node: usize,
        request: DirectoryRequest,
        items: usize,
    ) -> Option<DirectoryReply> {
        match self.call(node, request) {
            DirectoryReply::Error(ProtocolError::Directory(DirectoryError::Paced)) => {
                self.stats.covered.paced += 1;
                None
            }
            // The directory changed again (or none serves): the rejoin starts over, as
            // `actors::node::rejoin` does.
            DirectoryReply::Error(
                ProtocolError::Directory(
                    DirectoryError::UnknownSession | DirectoryError::Fenced { .. },
                )
                | ProtocolError::Node(_),
            ) => {
                self.session_lost(node);
                None
            }
            DirectoryReply::Error(refused) => {
                panic!(
                    "seed={}: node {node}'s rejoin was refused: {refused:?}",
                    self.stats.seed
                )
            }
            reply => {
                self.tick_items += items as u32;
                // Each shard paces the items of its own objects.
                assert!(
                    self.tick_items <= ADOPT_ITEMS_PER_TICK * self.shards as u32,
                    "seed={}: the directory took {} rejoin items in one tick",
                    self.stats.seed,
                    self.tick_items
                );
                Some(reply)
            }
        }
    }

    /// The rejoin ended: the node serves again, holding what it held when the directory
    /// was killed, less what was in extents it lost.
    fn rejoined(&mut self, node: usize) {
        let seed = self.stats.seed;
        self.nodes[node].rejoin = None;
        self.connect_engines(node);
        let state = &mut self.nodes[node];
        let Some(held) = state.held_at_kill.take() else {
            return;
        };
        for holding in held.replicas {
            let location = holding.location;
            if held.adopted.contains(&location) {
                self.stats.covered.replicas_kept_across_restarts += 1;
            } else if held.superseded.contains(&location) {
                self.stats.covered.replicas_superseded += 1;
            } else if held.crowded.contains(&location) {
                self.stats.covered.replicas_refused_for_reservations += 1;
            } else if held.reclaimed.contains(&location) {
                self.stats.covered.replicas_reclaimed_since_the_kill += 1;
            } else if held.lost_extents.iter().any(|(pool, offset, length)| {
                location.pool == *pool
                    && location.offset_bytes >= *offset
                    && location.offset_bytes < offset + length
            }) {
                self.stats.covered.replicas_lost_with_extents += 1;
            } else {
                panic!(
                    "seed={seed}: node {node} held {:?} at {location:?} when the directory \
                     was killed, and it is not READY after its rejoin",
                    holding.object
                );
            }
        }
    }

    /// Whether any node is rejoining.
    pub fn rejoining(&self) -> bool {
        self.nodes.iter().any(|node| node.rejoin.is_some())
    }
}
