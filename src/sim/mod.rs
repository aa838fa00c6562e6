//! A seeded simulation of the whole cluster (TigerBeetle's VOPR is the model): the
//! directory core and several node cores with their clients, over a network that drops,
//! duplicates, delays and reorders, with crashes and restarts of nodes and of the
//! directory, shared CXL pools in two domains, extents granted and given back, eviction,
//! demotion and time to live. Virtual time jumps; one `u64` seed drives everything, so a
//! failing seed replays exactly.
//!
//! After every step it checks DESIGN.md's invariants (the directory's own checks) and the
//! cluster's: no client reads bytes other than the ones committed for its object; no page
//! is handed to two live writers (no two running nodes hold one extent); no lease outlives
//! the bytes it protects (nothing is freed or overwritten under a lease a reader trusts);
//! a replica in a pool the reader cannot map is never a hit.
//!
//! * `network`: the faulty network.
//! * `node`: a simulated node process: the real node core, the real allocators, and the
//!   node's reactions to the directory's replies.
//! * `world`: the directory, the nodes, the simulated bytes, and the checks.

pub mod network;
pub mod node;
pub mod world;

use serde::Serialize;
use std::time::Instant;

/// The outcome of one seed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SeedReport {
    pub seed: u64,
    pub steps: u32,
    /// Stores whose commit was applied.
    pub stores_committed: u64,
    /// Reads whose bytes were checked against the object they claim.
    pub reads_verified: u64,
    /// Extents given back and taken by the directory.
    pub extents_returned: u64,
    /// Extent returns whose reply was lost, held out of the allocator until resolved.
    pub extent_returns_quarantined: u64,
    pub node_restarts: u64,
    pub directory_restarts: u64,
    /// Replicas that left by their tier's time to live.
    pub expired: u64,
    /// The first invariant that failed, if any.
    pub violation: Option<String>,
}

/// The outcome of a batch of seeds, as `kvtier sim --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct SimSummary {
    pub seeds: u64,
    pub steps: u32,
    /// Seeds that broke an invariant (0 when all hold).
    pub violations: u64,
    pub first_failing_seed: Option<u64>,
    pub first_violation: Option<String>,
    pub stores_committed: u64,
    pub reads_verified: u64,
    pub extents_returned: u64,
    pub extent_returns_quarantined: u64,
    pub node_restarts: u64,
    pub directory_restarts: u64,
    pub expired: u64,
    pub elapsed_ms: u64,
}

/// Runs one seed for `steps` steps. A broken invariant ends the run and is reported, never
/// propagated as a panic.
pub fn run_seed(seed: u64, steps: u32) -> SeedReport {
    let outcome = std::panic::catch_unwind(|| {
        let mut world = world::World::new(seed);
        for _ in 0..steps {
            world.step();
        }
        world.report(steps)
    });
    outcome.unwrap_or_else(|panic| {
        let reason = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|text| text.to_string()))
            .unwrap_or_else(|| "a check failed".into());
        SeedReport {
            seed,
            steps,
            violation: Some(reason),
            ..SeedReport::default()
        }
    })
}

/// Runs seeds `first..first + seeds`, each for `steps` steps, calling `progress` after each.
pub fn run_seeds(
    first: u64,
    seeds: u64,
    steps: u32,
    mut progress: impl FnMut(&SeedReport),
) -> SimSummary {
    let started = Instant::now();
    let mut summary = SimSummary {
        seeds,
        steps,
        violations: 0,
        first_failing_seed: None,
        first_violation: None,
        stores_committed: 0,
        reads_verified: 0,
        extents_returned: 0,
        extent_returns_quarantined: 0,
        node_restarts: 0,
        directory_restarts: 0,
        expired: 0,
        elapsed_ms: 0,
    };
    for seed in first..first.saturating_add(seeds) {
        let report = run_seed(seed, steps);
        progress(&report);
        summary.stores_committed += report.stores_committed;
        summary.reads_verified += report.reads_verified;
        summary.extents_returned += report.extents_returned;
        summary.extent_returns_quarantined += report.extent_returns_quarantined;
        summary.node_restarts += report.node_restarts;
        summary.directory_restarts += report.directory_restarts;
        summary.expired += report.expired;
        if let Some(violation) = report.violation {
            summary.violations += 1;
            if summary.first_failing_seed.is_none() {
                summary.first_failing_seed = Some(seed);
                summary.first_violation = Some(violation);
            }
        }
    }
    summary.elapsed_ms = started.elapsed().as_millis() as u64;
    summary
}
