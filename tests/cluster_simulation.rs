//! The seeded whole-cluster simulation (`kvtier sim`) at a size that fits CI: every seed
//! must keep every invariant, and the run must have exercised what it claims to cover:
//! directory restarts and leader failovers with rejoins, adoptions and paced reports, nodes
//! cut off past their fence window that keep their extents, and a rejoin storm per seed
//! (every node serving again within its computed bound); and each node's SSD store on a disk
//! that tears and loses unsynced blocks at crashes and rots bits: spills, evictions,
//! restores, reads under pins and recovery scans; network copies through the nodes' push and
//! expected-transfer books, and copies that take simulated time; two tenants with a CPU
//! partition each, whose engines now and then name the other's objects.
//! `KVTIER_SIM_SEED=N cargo test --test cluster_simulation` replays one seed.

use kvtier_tools::sim::{run_seed, run_seeds, SimSummary};

/// Runs seeds `first..first + seeds` of 2,500 steps against `shards` shards (or the one
/// seed `KVTIER_SIM_SEED` names: then `None`) and checks that none broke an invariant.
fn run_checked(first: u64, seeds: u64, shards: usize) -> Option<SimSummary> {
    if let Ok(seed) = std::env::var("KVTIER_SIM_SEED") {
        let seed: u64 = seed.parse().expect("KVTIER_SIM_SEED must be a u64");
        let report = run_seed(seed, 2_500, shards);
        assert_eq!(report.violation, None, "seed={seed}");
        return None;
    }
    let summary = run_seeds(first, seeds, 2_500, shards, |report| {
        if let Some(violation) = &report.violation {
            eprintln!("seed={} failed: {violation}", report.seed);
        }
    });
    assert_eq!(
        summary.violations, 0,
        "first failing seed {:?}: {:?} (replay with KVTIER_SIM_SEED)",
        summary.first_failing_seed, summary.first_violation
    );
    Some(summary)
}

#[test]
fn the_simulated_cluster_keeps_every_invariant() {
    let Some(summary) = run_checked(1, 24, 1) else {
        return;
    };
    let covered = [
        ("stores committed", summary.covered.stores_committed, 1_000),
        ("reads verified", summary.covered.reads_verified, 10_000),
        ("extents returned", summary.covered.extents_returned, 50),
        (
            "extent returns quarantined",
            summary.covered.extent_returns_quarantined,
            5,
        ),
        ("node restarts", summary.covered.node_restarts, 50),
        ("directory restarts", summary.covered.directory_restarts, 10),
        ("nodes cut off", summary.covered.node_cut_offs, 20),
        (
            "leaders cut off from etcd",
            summary.covered.leader_cut_offs,
            20,
        ),
        ("failovers", summary.covered.failovers, 20),
        (
            "extents kept after a silence",
            summary.covered.extents_kept_after_silence,
            20,
        ),
        ("expirations", summary.covered.expired, 100),
        ("evictions", summary.covered.evicted, 100),
        ("demotions", summary.covered.demotions, 50),
        ("replications", summary.covered.replications, 300),
        ("rejoins", summary.covered.rejoins, 100),
        ("holdings adopted", summary.covered.adopted, 500),
        (
            "replicas kept across directory restarts",
            summary.covered.replicas_kept_across_restarts,
            300,
        ),
        ("rejoin reports paced", summary.covered.paced, 50),
        ("rejoin storms", summary.covered.storms, 24),
        ("storm items", summary.covered.storm_items, 500),
        (
            "replies while another node rejoined",
            summary.covered.answered_beside_rejoins,
            20,
        ),
        ("SSD stores opened", summary.covered.ssd_opened, 50),
        (
            "objects a recovery scan adopted",
            summary.covered.ssd_objects_recovered,
            50,
        ),
        ("unsynced blocks torn", summary.covered.disk_blocks_torn, 3),
        ("bits rotted", summary.covered.disk_bits_rotted, 3),
        ("spills", summary.covered.ssd_spills, 100),
        ("stored objects evicted", summary.covered.ssd_evictions, 5),
        ("restores published", summary.covered.ssd_restores, 30),
        ("reads under SSD pins", summary.covered.ssd_pins_read, 100),
        (
            "network copies received",
            summary.covered.transfers_received,
            50,
        ),
        ("copies that took time", summary.covered.timed_copies, 300),
        (
            "requests for another tenant's objects refused",
            summary.covered.trespasses_refused,
            50,
        ),
    ];
    for (what, count, least) in covered {
        assert!(
            count >= least,
            "the simulation did too little: {what} {count} < {least}"
        );
    }
}

/// The same cluster against a directory of three shards (objects split by a keyed hash,
/// the rest alike in every shard, checked after every step): every invariant holds, the
/// shards never drift apart, and the run covers what splits the state (stores, rejoins
/// and their adoptions, extents given back, delegations). `KVTIER_SIM_SEED=N` replays one.
#[test]
fn the_simulated_cluster_keeps_every_invariant_over_three_shards() {
    let Some(summary) = run_checked(101, 12, 3) else {
        return;
    };
    let covered = [
        ("stores committed", summary.covered.stores_committed, 500),
        ("holdings adopted", summary.covered.adopted, 200),
        ("extents returned", summary.covered.extents_returned, 20),
        ("delegations", summary.covered.delegations, 500),
        ("directory restarts", summary.covered.directory_restarts, 5),
    ];
    for (what, count, least) in covered {
        assert!(
            count >= least,
            "the simulation did too little: {what} {count} < {least}"
        );
    }
}
