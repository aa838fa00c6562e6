//! The rejoin storm (issue 16): the cluster serves for a while without faults, the
//! directory is killed, and every node hears it at once and rejoins with all it holds.
//!
//! Checked: the directory takes at most `adopt_items_per_tick` report items in a tick (the
//! rejoin's own check); nothing but a rejoin report is ever paced (the nodes' check); and
//! every node serves again within the bound [`StormReport::bound_ms`], computed before
//! the storm from what the nodes hold. The bound: a node needs one step to open and
//! register, and one step per batch of at most `batch_items_max` (B) items; every node
//! rejoining sends one batch per step, right after the tick that refills the budget
//! (A = `adopt_items_per_tick` >= B). In a step where some batch is paced, the batches
//! taken hold more than A - B items; in a step where none is, every rejoining node moves
//! on. So every node serves again within max over nodes of (1 + its batches) + floor(items
//! / (A - B + 1)) steps, each at most `STEP_MS_MAX` of virtual time.

use super::world::{World, ADOPT_ITEMS_PER_TICK, BATCH_ITEMS_MAX, STEP_MS_MAX};
use serde::Serialize;

/// Steps the cluster serves before the directory is killed.
const WARM_STEPS: u32 = 300;

/// What one storm did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StormReport {
    /// Nodes that rejoined together.
    pub nodes: u64,
    /// Extents and replicas they reported.
    pub items: u64,
    /// Virtual time until every node served again, and the bound it must keep.
    pub took_ms: u64,
    pub bound_ms: u64,
    /// The most report items the directory took in one tick.
    pub tick_items_max: u32,
}

impl World {
    /// Runs a storm (see the module documentation) on this cluster; a broken check panics.
    pub fn storm(&mut self) -> StormReport {
        self.faults = false;
        for _ in 0..WARM_STEPS {
            self.step();
        }
        self.restart_directory();
        let batch = BATCH_ITEMS_MAX as u64;
        let mut report = StormReport::default();
        let mut batches_max = 0;
        for node in 0..self.nodes.len() {
            if self.nodes[node].session.is_none() && self.nodes[node].rejoin.is_none() {
                continue;
            }
            self.session_lost(node);
            report.nodes += 1;
            let state = &self.nodes[node];
            let mut batches = 1 + (state.core.holdings.replica_count() as u64).div_ceil(batch);
            report.items += state.core.holdings.replica_count() as u64;
            for allocator in state.cxl.values() {
                let extents = allocator.extents().count() as u64;
                report.items += extents;
                batches += extents.div_ceil(batch);
            }
            batches_max = batches_max.max(batches);
        }
        let room = u64::from(ADOPT_ITEMS_PER_TICK - BATCH_ITEMS_MAX + 1);
        let steps = batches_max + report.items / room;
        report.bound_ms = steps * STEP_MS_MAX;
        let started = self.now;
        while self.rejoining() {
            self.step();
            report.tick_items_max = report.tick_items_max.max(self.tick_items);
            report.took_ms = self.now.saturating_since(started).as_millis() as u64;
            assert!(
                report.took_ms <= report.bound_ms,
                "seed={}: a node was still rejoining {} ms after the storm began (bound {} ms, \
                 {} items)",
                self.stats.seed,
                report.took_ms,
                report.bound_ms,
                report.items
            );
        }
        self.stats.covered.storms += 1;
        self.stats.covered.storm_items += report.items;
        report
    }
}
