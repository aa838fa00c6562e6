//! A seeded simulation of the whole cluster (TigerBeetle's VOPR is the model): the
//! directory core and several node cores with their clients, over a network that drops,
//! duplicates, delays and reorders, with crashes and restarts of nodes and of the
//! directory, shared CXL pools in two domains, extents granted and given back, eviction,
//! demotion and time to live, and each node's SSD tier. Virtual time jumps; one `u64` seed
//! drives everything, so a failing seed replays exactly.
//!
//! After every step it checks the invariants of docs/design.md (the directory's own
//! checks) and the cluster's: no client reads bytes other than the ones committed for its
//! object; no page is handed to two live writers (no two running nodes hold one extent);
//! no lease outlives the bytes it protects (nothing is freed or overwritten under a lease a
//! reader trusts); a replica in a pool the reader cannot map is never a hit; and the SSD
//! tier's (`ssd`): a restore publishes only its object's bytes, no region is reused under
//! a pin, a recovery scan adopts only its regions' current fills, and what the store
//! reported written survives a crash.
//!
//! * `copies`: copies and SSD reads that take simulated time.
//! * `election`: etcd's leader lease and the leaders' cores: a leader cut off from etcd,
//!   a standby elected as a new incarnation.
//! * `network`: the faulty network.
//! * `node`: a simulated node process: the real node core and the real allocators; what
//!   it sends, and its retries, resolutions and restarts.
//! * `peer`: network replication between nodes, through the node core's push and
//!   expected-transfer books.
//! * `replies`: what a node does with the directory's replies.
//! * `ssd`: each node's SSD store on a model disk that outlives its processes (torn and
//!   lost unsynced blocks at crashes, rotted bits, failed writes and syncs): spills,
//!   restores, the engine's pinned reads, recovery scans.
//! * `world`: the directory, the nodes, the simulated bytes, and the checks.

pub mod copies;
pub mod election;
pub mod network;
pub mod node;
pub mod peer;
pub mod rejoin;
pub mod replies;
pub mod ssd;
pub mod storm;
pub mod world;

use kvtier_core::progress::{Progress, Unit};
use serde::Serialize;
use std::time::Instant;

/// `kvtier sim`: which seeds, how long, and how to print.
#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 24)]
    pub seeds: u64,
    /// The first seed; seeds `first..first + seeds` run (one seed replays one run exactly).
    #[arg(long, default_value_t = 1)]
    pub first_seed: u64,
    /// Steps per seed.
    #[arg(long, default_value_t = 2_500)]
    pub steps: u32,
    /// Print one JSON object (`seeds`, `steps`, `violations`, `first_failing_seed`, ...).
    #[arg(long)]
    pub json: bool,
}

/// Runs `kvtier sim`; fails (after printing the summary) when any seed broke an invariant.
pub fn run(args: &SimArgs) -> anyhow::Result<()> {
    let bar = Progress::bar("sim: seeds", args.seeds, Unit::Items, args.json);
    let mut done = 0;
    let mut violations = 0;
    let summary = run_seeds(args.first_seed, args.seeds, args.steps, |report| {
        done += 1;
        violations += u64::from(report.violation.is_some());
        bar.set(done);
        bar.message(format!("{violations} violations"));
        if let Some(violation) = &report.violation {
            eprintln!(
                "seed={} failed (replay: kvtier sim --first-seed {} --seeds 1 --steps {}): {violation}",
                report.seed, report.seed, report.steps
            );
        }
    });
    bar.finish();
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{} seeds x {} steps in {:.1} s: {} violations; {} stores committed, {} reads verified, \
             {} extents returned ({} returns quarantined), {} node restarts, {} nodes cut off, {} directory restarts, {} leaders cut off from etcd, {} failovers, \
             {} expirations, {} evictions, {} demotions, {} replications ({} over the network), {} timed copies ({} of reused sources); {} rejoins, {} holdings adopted ({} refused), \
             {} reports paced, {} replicas kept across directory restarts ({} superseded, {} refused for reservations), {} lost with {} extents ({} kept after a silence, {} found taken by another node, {} grants refused by owner words), \
             {} replies while another node rejoined; {} storms ({} items), nearest its bound: {:?}; \
             {} delegations, {} local hits, {} recalls; SSD: {} opened ({} objects recovered, {} torn), {} adopted, \
             {} spills ({} skipped), {} evictions, {} restores ({} refused, {} corrupt reads caught), {} pinned reads; \
             disks: {} blocks torn, {} lost, {} bits rotted",
            summary.seeds,
            summary.steps,
            summary.elapsed_ms as f64 / 1e3,
            summary.violations,
            summary.covered.stores_committed,
            summary.covered.reads_verified,
            summary.covered.extents_returned,
            summary.covered.extent_returns_quarantined,
            summary.covered.node_restarts,
            summary.covered.node_cut_offs,
            summary.covered.directory_restarts,
            summary.covered.leader_cut_offs,
            summary.covered.failovers,
            summary.covered.expired,
            summary.covered.evicted,
            summary.covered.demotions,
            summary.covered.replications,
            summary.covered.transfers_received,
            summary.covered.timed_copies,
            summary.covered.copies_of_reused_sources,
            summary.covered.rejoins,
            summary.covered.adopted,
            summary.covered.adoptions_refused,
            summary.covered.paced,
            summary.covered.replicas_kept_across_restarts,
            summary.covered.replicas_superseded,
            summary.covered.replicas_refused_for_reservations,
            summary.covered.replicas_lost_with_extents,
            summary.covered.extents_lost,
            summary.covered.extents_kept_after_silence,
            summary.covered.extents_found_taken,
            summary.covered.extent_grants_refused,
            summary.covered.answered_beside_rejoins,
            summary.covered.storms,
            summary.covered.storm_items,
            summary.storm_nearest_bound,
            summary.covered.delegations,
            summary.covered.local_hits,
            summary.covered.recalls,
            summary.covered.ssd_opened,
            summary.covered.ssd_objects_recovered,
            summary.covered.ssd_torn_objects,
            summary.covered.ssd_objects_adopted,
            summary.covered.ssd_spills,
            summary.covered.ssd_spills_skipped,
            summary.covered.ssd_evictions,
            summary.covered.ssd_restores,
            summary.covered.ssd_restores_refused,
            summary.covered.ssd_corrupt_reads,
            summary.covered.ssd_pins_read,
            summary.covered.disk_blocks_torn,
            summary.covered.disk_blocks_lost,
            summary.covered.disk_bits_rotted,
        );
    }
    match summary.first_failing_seed {
        Some(seed) => {
            anyhow::bail!("the simulation broke an invariant (first failing seed {seed})")
        }
        None => Ok(()),
    }
}

/// What a run exercised, summed over its steps (and over seeds in a summary).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Coverage {
    /// Stores whose commit was applied.
    pub stores_committed: u64,
    /// Reads whose bytes were checked against the object they claim.
    pub reads_verified: u64,
    /// Delegations granted to nodes, hits they answered under them, and recalls they got.
    pub delegations: u64,
    pub local_hits: u64,
    pub recalls: u64,
    /// Extents given back and taken by the directory.
    pub extents_returned: u64,
    /// Extent returns whose reply was lost, held out of the allocator until resolved.
    pub extent_returns_quarantined: u64,
    pub node_restarts: u64,
    pub directory_restarts: u64,
    /// Nodes cut off from the directory for a while.
    pub node_cut_offs: u64,
    /// Leaders cut off from etcd (still reaching the nodes), and standbys elected.
    pub leader_cut_offs: u64,
    pub failovers: u64,
    /// Sessions lost and rejoined (after a directory restart, or a fence).
    pub rejoins: u64,
    /// Holdings a rejoining node reported that the directory adopted (or already knew).
    pub adopted: u64,
    /// Holdings the directory refused to adopt (the node freed them).
    pub adoptions_refused: u64,
    /// Rejoin reports the directory paced (sent again next tick).
    pub paced: u64,
    /// Replicas a node held when the directory was killed, READY again after its rejoin.
    pub replicas_kept_across_restarts: u64,
    /// Replicas a node held when the directory was killed, refused on rejoining because a
    /// newer copy was READY in the same pool.
    pub replicas_superseded: u64,
    /// Replicas a node held when the directory was killed, refused on rejoining because
    /// the pool's books were full of reservations (the node's extent still held them).
    pub replicas_refused_for_reservations: u64,
    /// Replicas a node held when the directory was killed, lost with their extent.
    pub replicas_lost_with_extents: u64,
    /// Shared extents nodes gave up or were refused on rejoining.
    pub extents_lost: u64,
    /// Extents a node claimed back from a new directory incarnation after a silence past
    /// its fence window, their owner words still naming it.
    pub extents_kept_after_silence: u64,
    /// Grants whose extent's owner word had moved on (taken by another node): never used.
    pub extent_grants_refused: u64,
    /// Extents a rejoining node gave up because their owner words named another node.
    pub extents_found_taken: u64,
    /// Replies to a node while another node was rejoining.
    pub answered_beside_rejoins: u64,
    /// Rejoin storms run, and the extents and replicas their nodes reported.
    pub storms: u64,
    pub storm_items: u64,
    /// Replicas that left by their tier's time to live.
    pub expired: u64,
    /// Replicas evicted under pressure.
    pub evicted: u64,
    /// Demotion tasks a node ran (a copy one tier colder).
    pub demotions: u64,
    /// Replication copies a node wrote (into shared memory, or received over the network).
    pub replications: u64,
    /// Network copies a receiver claimed, wrote and committed.
    pub transfers_received: u64,
    /// Copies and SSD reads that ended after taking simulated time, and copies that found
    /// their source reused meanwhile (not committed).
    pub timed_copies: u64,
    pub copies_of_reused_sources: u64,
    /// SSD stores opened on a node's disk (a start after a crash scans what the last process left).
    pub ssd_opened: u64,
    /// Objects the recovery scans adopted, and objects they found torn (dropped).
    pub ssd_objects_recovered: u64,
    pub ssd_torn_objects: u64,
    /// Stored objects the directory adopted when their node started.
    pub ssd_objects_adopted: u64,
    /// Unsynced blocks torn and lost at power cuts, and bits rot flipped.
    pub disk_blocks_torn: u64,
    pub disk_blocks_lost: u64,
    pub disk_bits_rotted: u64,
    /// Spills into a node's SSD committed (sent), and skipped (a failed write, no source).
    pub ssd_spills: u64,
    pub ssd_spills_skipped: u64,
    /// Stored objects a region reclaim dropped (retired at the directory).
    pub ssd_evictions: u64,
    /// Restores published, refused by the node core's verdict, and reads a checksum caught.
    pub ssd_restores: u64,
    pub ssd_restores_refused: u64,
    pub ssd_corrupt_reads: u64,
    /// Objects the engine read from the disk under its pins.
    pub ssd_pins_read: u64,
}

impl Coverage {
    fn add(&mut self, other: &Coverage) {
        self.stores_committed += other.stores_committed;
        self.reads_verified += other.reads_verified;
        self.delegations += other.delegations;
        self.local_hits += other.local_hits;
        self.recalls += other.recalls;
        self.extents_returned += other.extents_returned;
        self.extent_returns_quarantined += other.extent_returns_quarantined;
        self.node_restarts += other.node_restarts;
        self.directory_restarts += other.directory_restarts;
        self.node_cut_offs += other.node_cut_offs;
        self.leader_cut_offs += other.leader_cut_offs;
        self.failovers += other.failovers;
        self.rejoins += other.rejoins;
        self.adopted += other.adopted;
        self.adoptions_refused += other.adoptions_refused;
        self.paced += other.paced;
        self.replicas_kept_across_restarts += other.replicas_kept_across_restarts;
        self.replicas_lost_with_extents += other.replicas_lost_with_extents;
        self.replicas_superseded += other.replicas_superseded;
        self.replicas_refused_for_reservations += other.replicas_refused_for_reservations;
        self.extents_lost += other.extents_lost;
        self.extents_kept_after_silence += other.extents_kept_after_silence;
        self.extent_grants_refused += other.extent_grants_refused;
        self.extents_found_taken += other.extents_found_taken;
        self.answered_beside_rejoins += other.answered_beside_rejoins;
        self.storms += other.storms;
        self.storm_items += other.storm_items;
        self.expired += other.expired;
        self.evicted += other.evicted;
        self.demotions += other.demotions;
        self.replications += other.replications;
        self.transfers_received += other.transfers_received;
        self.timed_copies += other.timed_copies;
        self.copies_of_reused_sources += other.copies_of_reused_sources;
        self.ssd_opened += other.ssd_opened;
        self.ssd_objects_recovered += other.ssd_objects_recovered;
        self.ssd_torn_objects += other.ssd_torn_objects;
        self.ssd_objects_adopted += other.ssd_objects_adopted;
        self.disk_blocks_torn += other.disk_blocks_torn;
        self.disk_blocks_lost += other.disk_blocks_lost;
        self.disk_bits_rotted += other.disk_bits_rotted;
        self.ssd_spills += other.ssd_spills;
        self.ssd_spills_skipped += other.ssd_spills_skipped;
        self.ssd_evictions += other.ssd_evictions;
        self.ssd_restores += other.ssd_restores;
        self.ssd_restores_refused += other.ssd_restores_refused;
        self.ssd_corrupt_reads += other.ssd_corrupt_reads;
        self.ssd_pins_read += other.ssd_pins_read;
    }
}

/// The outcome of one seed.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SeedReport {
    pub seed: u64,
    pub steps: u32,
    #[serde(flatten)]
    pub covered: Coverage,
    /// The seed's rejoin storm.
    pub storm: storm::StormReport,
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
    #[serde(flatten)]
    pub covered: Coverage,
    /// The storm that came nearest its bound (the largest share of it used).
    pub storm_nearest_bound: Option<storm::StormReport>,
    pub elapsed_ms: u64,
}

/// Runs one seed for `steps` steps, then a rejoin storm on a cluster of its own. A broken
/// invariant ends the run and is reported, never propagated as a panic.
pub fn run_seed(seed: u64, steps: u32) -> SeedReport {
    let outcome = std::panic::catch_unwind(|| {
        let mut world = world::World::new(seed);
        for _ in 0..steps {
            world.step();
        }
        let mut storm = world::World::new(seed);
        let stormed = storm.storm();
        world.stats.covered.add(&storm.stats.covered);
        SeedReport {
            storm: stormed,
            ..world.report(steps)
        }
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
    // A broken invariant is reported per seed, not printed by the panic hook.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut summary = SimSummary {
        seeds,
        steps,
        violations: 0,
        first_failing_seed: None,
        first_violation: None,
        covered: Coverage::default(),
        storm_nearest_bound: None,
        elapsed_ms: 0,
    };
    for seed in first..first.saturating_add(seeds) {
        let report = run_seed(seed, steps);
        progress(&report);
        summary.covered.add(&report.covered);
        let share = |storm: &storm::StormReport| storm.took_ms * 1000 / storm.bound_ms.max(1);
        if summary
            .storm_nearest_bound
            .as_ref()
            .is_none_or(|nearest| share(&report.storm) > share(nearest))
        {
            summary.storm_nearest_bound = Some(report.storm.clone());
        }
        if let Some(violation) = report.violation {
            summary.violations += 1;
            if summary.first_failing_seed.is_none() {
                summary.first_failing_seed = Some(seed);
                summary.first_violation = Some(violation);
            }
        }
    }
    std::panic::set_hook(hook);
    summary.elapsed_ms = started.elapsed().as_millis() as u64;
    summary
}
