//! How a simulated node acts on the directory's replies: it writes granted stores into its
//! allocators and commits them, keeps or frees pages by the node core's rule, checks and
//! keeps its leases, runs reclaim and demotion tasks, and takes or gives back extents.

use super::node::{HeldLease, Purpose};
use super::world::{Space, World, BATCH_ITEMS_MAX, OBJECT_BYTES};
use kvtier_core::backends::PoolError;
use kvtier_core::directory::{
    AcquireOutcome, ExtentGrant, ExtentReturn, Holding, Lease, ReserveOutcome, Task, TaskKind,
};
use kvtier_core::model::extent_owner::{take_extent, Ownership, TakeFrom};
use kvtier_core::model::{
    LeaseId, Location, Medium, ObjectId, OperationId, PoolId, ReplicaId, SessionId, Timestamp,
};
use kvtier_core::node::{
    after_commit, reclaim_done, CommitResult, ExtentAction, PagesAfterCommit, Reservation, Ticket,
};
use kvtier_core::protocol::messages::{DirectoryReply, DirectoryRequest};
use std::time::Duration;

impl World {
    /// A reserve was answered: a grant is written and committed at once; anything else
    /// ends the store.
    pub(super) fn reserved(&mut self, node: usize, reply: DirectoryReply, purpose: Purpose) {
        if let Purpose::Restore { object } = purpose {
            return self.restore_reserved(node, reply, object);
        }
        let Purpose::Store {
            ticket,
            object,
            tenant,
            early,
        } = purpose
        else {
            return;
        };
        let DirectoryReply::Reserved(ReserveOutcome::Granted { replica, pool, .. }) = reply else {
            self.nodes[node].placed[tenant] = None;
            self.end_early_store(node, tenant, ticket, early);
            return;
        };
        let location = match early {
            // Written already, in the pool the directory chose.
            Some(location) if location.pool == pool => location,
            // Placed elsewhere: the early pages go, the reservation is given back, and the
            // next store asks first.
            Some(_) => {
                self.nodes[node].placed[tenant] = None;
                self.stats.covered.early_grants_elsewhere += 1;
                self.end_early_store(node, tenant, ticket, early);
                self.send(node, DirectoryRequest::Abort { replica }, Purpose::Plain);
                return;
            }
            None => {
                let Some((location, space)) = self.allocate(node, pool) else {
                    self.end_store(node, tenant, ticket);
                    self.send(node, DirectoryRequest::Abort { replica }, Purpose::Plain);
                    return;
                };
                self.write(space, location.offset_bytes, object);
                self.nodes[node].placed[tenant] = Some(pool);
                location
            }
        };
        let now = self.now;
        let state = &mut self.nodes[node];
        if let Some(books) = state.clients[tenant].and_then(|client| state.core.client(client)) {
            let granted = Ticket {
                reservation: Reservation::Made {
                    session: state.session.unwrap_or(SessionId(0)),
                    replica,
                },
                object,
                location,
            };
            books.store_granted(ticket, granted, now);
            books.take_ticket(ticket);
        }
        let Some(operation) = self.operation(node) else {
            self.free(node, location).ok();
            self.send(node, DirectoryRequest::Abort { replica }, Purpose::Plain);
            return;
        };
        let state = &self.nodes[node];
        let owned_mark = (state.session.is_some() && state.rejoin.is_none())
            .then(|| state.core.delegations.session_mark());
        self.send_commit(node, operation, object, replica, location, owned_mark);
    }

    /// Allocates an object in `pool`: the node's CPU pool, or a shared pool inside an
    /// extent it holds (asking for one when they are full, and giving up this time).
    pub(super) fn allocate(&mut self, node: usize, pool: PoolId) -> Option<(Location, Space)> {
        let space = *self.spaces.get(&pool)?;
        let allocated = match space {
            Space::Cpu { partition, .. } => {
                let (own, pages) = self.nodes[node].cpu.get_mut(partition)?;
                if *own != pool {
                    return None;
                }
                pages.allocate(OBJECT_BYTES)
            }
            Space::Cxl(domain) => {
                let allocator = self.nodes[node].cxl.get_mut(&domain)?;
                allocator.allocate(OBJECT_BYTES)
            }
            // Written by spills only, never granted to a store.
            Space::Ssd { .. } => return None,
        };
        let allocation = match allocated {
            Ok(allocation) => allocation,
            Err(PoolError::Full { .. }) if matches!(space, Space::Cxl(_)) => {
                if let Some(operation) = self.operation(node) {
                    let request = DirectoryRequest::GrantExtent { operation, pool };
                    self.send(node, request, Purpose::Plain);
                }
                return None;
            }
            Err(_) => return None,
        };
        let location = Location {
            pool,
            allocation: allocation.id,
            generation: allocation.generation,
            offset_bytes: allocation.offset,
            length_bytes: OBJECT_BYTES,
        };
        Some((location, space))
    }

    /// Frees an allocation of node `node`; its bytes are gone.
    pub(super) fn free(&mut self, node: usize, location: Location) -> Result<u64, PoolError> {
        let Some(space) = self.spaces.get(&location.pool).copied() else {
            return Err(PoolError::UnknownAllocation {
                id: location.allocation,
                generation: location.generation,
            });
        };
        if let Space::Ssd { .. } = space {
            return Ok(self.drop_stored(node, location));
        }
        let state = &mut self.nodes[node];
        let freed = match space {
            Space::Cpu { partition, .. } => match state.cpu.get_mut(partition) {
                Some((pool, pages)) if *pool == location.pool => {
                    pages.free(location.allocation, location.generation)
                }
                _ => Err(PoolError::UnknownAllocation {
                    id: location.allocation,
                    generation: location.generation,
                }),
            },
            Space::Cxl(domain) => match state.cxl.get_mut(&domain) {
                Some(allocator) => allocator.free(location.allocation, location.generation),
                None => Err(PoolError::UnknownAllocation {
                    id: location.allocation,
                    generation: location.generation,
                }),
            },
            Space::Ssd { .. } => Ok(location.length_bytes),
        };
        if freed.is_ok() {
            self.check_unread(space, location.offset_bytes, "freed");
            self.memory.remove(&(space, location.offset_bytes));
            self.nodes[node].core.holdings.freed(&location);
        }
        freed
    }

    /// A commit ended with `result`: the pages follow the node core's rule.
    pub(super) fn committed(&mut self, node: usize, result: CommitResult, purpose: Purpose) {
        let Purpose::Commit {
            object,
            replica,
            location,
            owned_mark,
        } = purpose
        else {
            return;
        };
        match after_commit(result) {
            PagesAfterCommit::Published => {
                self.stats.covered.stores_committed += 1;
                self.nodes[node].committed.push((object, replica));
                let holding = Holding { object, location };
                // A reclaim that overtook this answer freed the pages already.
                let held = self.nodes[node].core.holdings.published(holding);
                let in_cpu = matches!(self.spaces.get(&location.pool), Some(Space::Cpu { .. }));
                if let (Some(mark), true, true) = (owned_mark, in_cpu, held) {
                    let template = Lease {
                        lease: LeaseId(0),
                        duration_ms: self.config.lease_duration.as_millis() as u64,
                        replica,
                        medium: Medium::Cpu,
                        location,
                        deadline: Timestamp::ZERO,
                    };
                    self.nodes[node]
                        .core
                        .delegations
                        .owned(mark, object, template);
                    self.stats.covered.owned_replicas += 1;
                }
            }
            PagesAfterCommit::Keep => {}
            PagesAfterCommit::Free => {
                self.free(node, location).ok();
            }
            PagesAfterCommit::FreeAndAbort => {
                self.free(node, location).ok();
                self.send(node, DirectoryRequest::Abort { replica }, Purpose::Plain);
            }
        }
        self.spill_answered(node, replica);
        self.nodes[node].transfers.finished(replica);
    }

    /// An acquire was answered: every lease is checked (mappable, right bytes) and kept.
    pub(super) fn acquired(
        &mut self,
        node: usize,
        objects: &[ObjectId],
        reply: DirectoryReply,
        purpose: Purpose,
        sent_at: kvtier_core::model::Timestamp,
    ) {
        let Purpose::Acquire { count, tenant } = purpose else {
            return;
        };
        let outcomes = match reply {
            DirectoryReply::Acquired(outcomes) => outcomes,
            _ => Vec::new(),
        };
        assert!(
            outcomes.is_empty() || outcomes.len() == objects.len(),
            "seed={}: one result per item, in order",
            self.stats.seed
        );
        let mut granted = Vec::new();
        let mut missed = Vec::new();
        for (object, outcome) in objects.iter().zip(outcomes) {
            let lease = match outcome {
                AcquireOutcome::Leased(lease) => lease,
                AcquireOutcome::Miss => {
                    missed.push(*object);
                    continue;
                }
                AcquireOutcome::Withheld => continue,
            };
            let held = self.held_lease(node, tenant, lease, *object, sent_at);
            granted.push((held.lease.lease, held.trusted_until));
            if held.trusted_until > self.now {
                self.verify(&held);
            }
            self.nodes[node].leases.push(held);
        }
        let state = &mut self.nodes[node];
        if let Some(books) = state.clients[tenant].and_then(|client| state.core.client(client)) {
            books.leases_granted(count, granted);
        }
        // What the node's SSD holds of the misses is restored, as a load's misses are.
        self.restore(node, &missed);
    }

    /// An `AcquireDelegating`'s answer: its delegations join the node's (asked for at
    /// `asked`), and its outcomes are answered as an acquire's.
    pub(super) fn take_delegations(
        &mut self,
        node: usize,
        objects: &[ObjectId],
        reply: DirectoryReply,
        asked: kvtier_core::model::Timestamp,
    ) -> DirectoryReply {
        let DirectoryReply::AcquiredDelegating {
            outcomes,
            delegations,
        } = reply
        else {
            return reply;
        };
        let core = &mut self.nodes[node].core;
        for ((object, outcome), delegation) in objects.iter().zip(&outcomes).zip(&delegations) {
            if let (AcquireOutcome::Leased(lease), Some(delegation)) = (outcome, delegation) {
                core.delegations.granted(asked, *object, lease, *delegation);
                self.stats.covered.delegations += 1;
            }
        }
        self.send_delegation_releases(node);
        DirectoryReply::Acquired(outcomes)
    }

    /// The directory recalls one of node `node`'s delegations.
    fn recall(&mut self, node: usize, delegation: kvtier_core::model::LeaseId) {
        self.stats.covered.recalls += 1;
        let now = self.now;
        self.nodes[node].core.delegations.recall(now, delegation);
        self.send_delegation_releases(node);
    }

    /// A lease as the engine of `tenant` holds it; a replica it cannot map (another
    /// tenant's partition, another node's memory, a domain it does not map) is a violation.
    pub(super) fn held_lease(
        &self,
        node: usize,
        tenant: usize,
        lease: kvtier_core::directory::Lease,
        object: ObjectId,
        sent_at: kvtier_core::model::Timestamp,
    ) -> HeldLease {
        let seed = self.stats.seed;
        let space = self.spaces.get(&lease.location.pool).copied();
        if let Some(Space::Cpu { partition, .. }) = space {
            assert_eq!(
                partition,
                tenant,
                "seed={seed}: an engine of tenant {} got a lease on {:?} in tenant {}'s partition",
                super::tenants::TENANTS[tenant].0,
                lease.replica,
                super::tenants::TENANTS[partition].0
            );
        }
        let mappable = match space {
            Some(Space::Cpu { node: owner, .. }) => owner == node,
            Some(Space::Cxl(domain)) => self.nodes[node]
                .domains
                .iter()
                .any(|mapped| mapped.0 == domain),
            Some(Space::Ssd { .. }) | None => false,
        };
        assert!(
            mappable,
            "seed={seed}: node {node} got a lease on {:?} in a pool it cannot map",
            lease.replica
        );
        let trusted_until = sent_at + Duration::from_millis(lease.duration_ms);
        HeldLease {
            lease,
            object,
            space: space.unwrap_or(Space::Cxl(u32::MAX)),
            tenant,
            trusted_until,
        }
    }

    /// Runs the tasks the directory handed node `node` (asked for at `asked`); their
    /// delegations are taken first, and their reclaims are acknowledged together after the
    /// batch, as the node does: one `ReclaimAck`, or one `ReclaimAckMany` for several.
    pub(super) fn run_tasks(
        &mut self,
        node: usize,
        tasks: Vec<Task>,
        asked: kvtier_core::model::Timestamp,
    ) {
        let (offered, tasks): (Vec<Task>, Vec<Task>) = tasks
            .into_iter()
            .partition(|task| matches!(task.kind, TaskKind::Delegate { .. }));
        for task in &offered {
            if let TaskKind::Delegate {
                object,
                lease,
                delegation,
            } = task.kind
            {
                let core = &mut self.nodes[node].core;
                core.delegations.granted(asked, object, &lease, delegation);
                self.stats.covered.delegations += 1;
                self.stats.covered.delegations_offered += 1;
            }
        }
        if !offered.is_empty() {
            self.send_delegation_releases(node);
        }
        let mut reclaimed = Vec::new();
        for task in tasks {
            match task.kind {
                TaskKind::Delegate { .. } => {}
                TaskKind::Reclaim { replica, location } => {
                    if self.reclaim(node, replica, location) {
                        reclaimed.push(replica);
                    }
                }
                TaskKind::Demote {
                    source,
                    target,
                    target_pool,
                } => {
                    self.stats.covered.demotions += 1;
                    self.demote(node, source, target, target_pool)
                }
                TaskKind::Replicate {
                    source,
                    target,
                    target_pool,
                } => {
                    self.stats.covered.replications += 1;
                    self.demote(node, source, target, target_pool)
                }
                TaskKind::Push { .. } => self.push(node, task.kind),
                TaskKind::Receive { .. } => self.expect_transfer(node, task.id, task.kind),
                TaskKind::Recall { delegation, .. } => self.recall(node, delegation),
            }
        }
        self.send_reclaim_acks(node, &reclaimed);
    }

    /// Acknowledges the reclaims of `replicas`, as the node does: one `ReclaimAck`, or one
    /// `ReclaimAckMany` per batch.
    pub(super) fn send_reclaim_acks(&mut self, node: usize, replicas: &[ReplicaId]) {
        for batch in replicas.chunks(BATCH_ITEMS_MAX as usize) {
            let request = match batch {
                [replica] => DirectoryRequest::ReclaimAck { replica: *replica },
                _ => DirectoryRequest::ReclaimAckMany {
                    replicas: batch.to_vec(),
                },
            };
            self.send(node, request, Purpose::Plain);
        }
    }

    /// Frees the replica's storage; whether the reclaim is done (to be acknowledged).
    pub(super) fn reclaim(&mut self, node: usize, replica: ReplicaId, location: Location) -> bool {
        let now = self.now;
        // A replica the node answers hits on itself goes once no local lease on it is
        // live; until then the reclaim is not acknowledged and comes back.
        if !self.nodes[node].core.delegations.may_reclaim(now, replica) {
            self.stats.covered.reclaims_deferred += 1;
            return false;
        }
        let readers = self
            .nodes
            .iter()
            .flat_map(|node| node.leases.iter())
            .chain(self.orphan_leases.iter())
            // By replica and location: ids of another directory incarnation repeat.
            .filter(|held| {
                held.lease.replica == replica
                    && held.lease.location == location
                    && held.trusted_until > now
            })
            .count();
        assert_eq!(
            readers, 0,
            "seed={}: reclaim of {replica:?} while a reader trusts a lease on it",
            self.stats.seed
        );
        let freed = self.free(node, location);
        self.nodes[node]
            .committed
            .retain(|(_, kept)| *kept != replica);
        self.nodes[node].reclaimed(location);
        reclaim_done(&freed)
    }

    /// Copies the object at `source` into `target_pool` and commits `target` (a demotion
    /// or a replication into shared memory: the directory tells them apart).
    fn demote(&mut self, node: usize, source: Location, target: ReplicaId, target_pool: PoolId) {
        if let Some(Space::Ssd { .. }) = self.spaces.get(&target_pool) {
            return self.spill(node, source, target, target_pool);
        }
        self.start_pool_copy(node, source, target, target_pool);
    }

    /// An extent was granted: the node allocates in it from now on.
    pub(super) fn extent_granted(&mut self, node: usize, grant: ExtentGrant) {
        let ExtentGrant::Granted(extent) = grant else {
            return;
        };
        let Some(domain) = self.cxl_pools.get(&extent.pool).copied() else {
            return;
        };
        let (Some(words), Some(node_id)) =
            (self.owner_words.get(&domain), self.nodes[node].node_id)
        else {
            return;
        };
        let index = extent.offset_bytes / extent.length_bytes.max(1);
        let from = extent.owner_word.map_or(TakeFrom::Unknown, TakeFrom::Known);
        if let Ownership::Refused(found) = take_extent(words, index, node_id, from) {
            // Another node's in shared memory: never written, given back.
            self.stats.covered.extent_grants_refused += 1;
            let state = &mut self.nodes[node];
            let Some(operation) =
                state
                    .core
                    .begin_return(extent.pool, extent.offset_bytes, extent.length_bytes)
            else {
                return;
            };
            let request = DirectoryRequest::ReturnExtent {
                operation,
                pool: extent.pool,
                offset_bytes: extent.offset_bytes,
                owner_word: Some(found),
            };
            let purpose = Purpose::Return {
                pool: extent.pool,
                offset_bytes: extent.offset_bytes,
            };
            self.send(node, request, purpose);
            return;
        }
        if let Some(allocator) = self.nodes[node].cxl.get_mut(&domain) {
            allocator
                .add_extent(extent.offset_bytes, extent.length_bytes)
                .ok();
        }
    }

    /// A return was answered (`None`: its reply is lost).
    pub(super) fn extent_returned(
        &mut self,
        node: usize,
        operation: OperationId,
        answer: Option<ExtentReturn>,
        purpose: Purpose,
    ) {
        let Purpose::Return { pool, offset_bytes } = purpose else {
            return;
        };
        if answer == Some(ExtentReturn::Returned) {
            self.stats.covered.extents_returned += 1;
        }
        let action = self.nodes[node]
            .core
            .return_answered(pool, offset_bytes, operation, answer);
        self.apply_extent_action(node, action);
    }

    /// Puts an extent back into the node's allocator when the action says it is still its.
    pub(super) fn apply_extent_action(&mut self, node: usize, action: ExtentAction) {
        let ExtentAction::AddBack {
            pool,
            offset_bytes,
            length_bytes,
        } = action
        else {
            return;
        };
        let Some(domain) = self.cxl_pools.get(&pool).copied() else {
            return;
        };
        if let Some(allocator) = self.nodes[node].cxl.get_mut(&domain) {
            allocator.add_extent(offset_bytes, length_bytes).ok();
        }
    }
}
