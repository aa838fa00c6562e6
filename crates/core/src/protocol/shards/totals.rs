//! What the shards report together: counts, usage and drains summed or merged over them.

use super::{merge_drains, Shards};
use crate::directory::{Directory, DirectoryCounts, DrainProgress};
use crate::model::{NodeId, SessionId, Timestamp};
use crate::protocol::messages::{ClusterStatus, PoolUsageReport};

impl Shards {
    /// Evictions under pressure so far, by medium, over every shard.
    pub fn evictions_by_medium(
        &self,
    ) -> [(crate::model::Medium, u64); crate::model::Medium::ALL.len()] {
        let mut totals = self.cores[0].evictions_by_medium();
        for core in &self.cores[1..] {
            for (total, (_, more)) in totals.iter_mut().zip(core.evictions_by_medium()) {
                total.1 += more;
            }
        }
        totals
    }

    /// The latencies of the replications that ended since the last call, in every shard.
    pub fn take_replication_latencies(&mut self) -> Vec<std::time::Duration> {
        self.cores
            .iter_mut()
            .flat_map(Directory::take_replication_latencies)
            .collect()
    }

    /// Replication counts summed over the shards.
    pub fn replication_counts(&self) -> crate::directory::ReplicationCounts {
        let mut counts = self.cores[0].replication_counts();
        for core in &self.cores[1..] {
            let more = core.replication_counts();
            counts.planned += more.planned;
            counts.completed += more.completed;
            counts.cancelled += more.cancelled;
            for (skipped, more) in counts.skipped.iter_mut().zip(more.skipped) {
                *skipped += more;
            }
            counts.completed_bytes += more.completed_bytes;
            counts.in_flight += more.in_flight;
        }
        counts
    }

    /// Delegation recalls by reason, summed over the shards.
    pub fn recalls_by_reason(
        &self,
    ) -> [(crate::directory::RecallReason, u64); crate::directory::RecallReason::ALL.len()] {
        let mut totals = self.cores[0].recalls_by_reason();
        for core in &self.cores[1..] {
            for (total, (_, more)) in totals.iter_mut().zip(core.recalls_by_reason()) {
                total.1 += more;
            }
        }
        totals
    }

    /// Delegations in force, over every shard.
    pub fn delegations_live(&self) -> u64 {
        self.cores.iter().map(Directory::delegations_live).sum()
    }

    /// Delegations offered so far, over every shard.
    pub fn delegations_offered(&self) -> u64 {
        self.cores.iter().map(Directory::delegations_offered).sum()
    }

    /// Node `node`'s drain over all shards: the least advanced shard's state, the counts
    /// summed.
    pub fn drain_progress(&self, node: NodeId) -> Option<DrainProgress> {
        let mut shards = self.cores.iter().map(|core| core.drain_progress(node));
        let mut merged = shards.next()??;
        for progress in shards.flatten() {
            merged = merge_drains(merged, progress);
        }
        Some(merged)
    }

    /// Counts summed over the shards; sessions as every shard has them.
    pub fn counts(&self) -> DirectoryCounts {
        let mut counts = self.cores[0].counts();
        for core in &self.cores[1..] {
            let more = core.counts();
            counts.objects += more.objects;
            counts.replicas += more.replicas;
            counts.leases += more.leases;
        }
        counts
    }

    /// Every pool with its usage summed over the shards (each holds its share).
    pub fn usage(&self) -> Vec<PoolUsageReport> {
        let mut reports = crate::protocol::directory::usage(&self.cores[0]);
        for core in &self.cores[1..] {
            for report in core.usage() {
                if let Some(merged) = reports.iter_mut().find(|merged| merged.pool == report.pool) {
                    merged.usage.add(&report.usage);
                }
            }
        }
        reports
    }

    /// Every node the directory has seen, its drain over every shard.
    pub fn node_statuses(&self) -> Vec<crate::directory::NodeStatus> {
        let mut nodes = self.cores[0].node_statuses();
        if self.cores.len() > 1 {
            for status in &mut nodes {
                status.drain = self.drain_progress(status.node);
            }
        }
        nodes
    }

    /// Every node and pool, as `kvtier ctl status` shows them.
    pub fn cluster_status(&self) -> ClusterStatus {
        ClusterStatus {
            nodes: self.node_statuses(),
            pools: self.usage(),
        }
    }

    /// Tasks queued so far in all shards: a change means some node may have one to fetch.
    pub fn tasks_queued(&self) -> u64 {
        self.cores
            .iter()
            .map(Directory::tasks_queued)
            .fold(0, u64::wrapping_add)
    }

    /// Whether any shard has a task for `session`.
    pub fn has_tasks(&self, now: Timestamp, session: SessionId) -> bool {
        self.cores.iter().any(|core| core.has_tasks(now, session))
    }
}
