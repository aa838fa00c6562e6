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
//! * `tenants`: two tenants, each with an engine on every node and a CPU partition of its
//!   own, admitted and salted by the node core's tenant rules.
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
pub mod tenants;
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
    /// Shards of the directory ([`kvtier_core::protocol::shards`]), 1 to 256.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub shards: u16,
    /// Print one JSON object (`seeds`, `steps`, `violations`, `first_failing_seed`, ...).
    #[arg(long)]
    pub json: bool,
}

/// Runs `kvtier sim`; fails (after printing the summary) when any seed broke an invariant.
pub fn run(args: &SimArgs) -> anyhow::Result<()> {
    let bar = Progress::bar("sim: seeds", args.seeds, Unit::Items, args.json);
    let mut done = 0;
    let mut violations = 0;
    let shards = usize::from(args.shards);
    let summary = run_seeds(args.first_seed, args.seeds, args.steps, shards, |report| {
        done += 1;
        violations += u64::from(report.violation.is_some());
        bar.set(done);
        bar.message(format!("{violations} violations"));
        if let Some(violation) = &report.violation {
            eprintln!(
                "seed={} failed (replay: kvtier sim --first-seed {} --seeds 1 --steps {} --shards {}): {violation}",
                report.seed, report.seed, report.steps, shards
            );
        }
    });
    bar.finish();
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!("{}", summary_text(&summary)?);
    }
    match summary.first_failing_seed {
        Some(seed) => {
            anyhow::bail!("the simulation broke an invariant (first failing seed {seed})")
        }
        None => Ok(()),
    }
}

/// The summary as `kvtier sim` prints it without `--json`: the run, then every coverage
/// counter by name.
fn summary_text(summary: &SimSummary) -> anyhow::Result<String> {
    let covered = serde_json::to_value(&summary.covered)?;
    let counters: Vec<String> = covered
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, count)| format!("{} {count}", name.replace('_', " ")))
        .collect();
    Ok(format!(
        "{} seeds x {} steps, {} shard(s), in {:.1} s: {} violations; {}; nearest storm to its bound: {:?}",
        summary.seeds,
        summary.steps,
        summary.shards,
        summary.elapsed_ms as f64 / 1e3,
        summary.violations,
        counters.join(", "),
        summary.storm_nearest_bound,
    ))
}

/// Defines [`Coverage`], every counter a `u64`, and its sum.
macro_rules! coverage {
    ($($(#[$doc:meta])* $field:ident,)*) => {
        /// What a run exercised, summed over its steps (and over seeds in a summary).
        #[derive(Clone, Debug, Default, Serialize)]
        pub struct Coverage {
            $($(#[$doc])* pub $field: u64,)*
        }

        impl Coverage {
            fn add(&mut self, other: &Coverage) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

coverage! {
    /// Stores whose commit was applied.
    stores_committed,
    /// Stores whose pages were granted and written before their reserve was answered, and
    /// those of them the directory placed in another pool (pages freed, store skipped).
    early_grants,
    early_grants_elsewhere,
    /// Reads whose bytes were checked against the object they claim.
    reads_verified,
    /// Delegations granted to nodes (those of them on offer, with a batch of tasks), hits
    /// they answered under them, and recalls they got.
    delegations,
    delegations_offered,
    local_hits,
    recalls,
    /// Replicas a node published in its CPU pool and answered hits on with no delegation,
    /// and reclaims of them it put off while a local lease on them was live.
    owned_replicas,
    reclaims_deferred,
    /// Extents given back and taken by the directory.
    extents_returned,
    /// Extent returns whose reply was lost, held out of the allocator until resolved.
    extent_returns_quarantined,
    node_restarts,
    directory_restarts,
    /// Nodes cut off from the directory for a while.
    node_cut_offs,
    /// Leaders cut off from etcd (still reaching the nodes), and standbys elected.
    leader_cut_offs,
    failovers,
    /// Sessions lost and rejoined (after a directory restart, or a fence).
    rejoins,
    /// Holdings a rejoining node reported that the directory adopted (or already knew).
    adopted,
    /// Holdings the directory refused to adopt (the node freed them).
    adoptions_refused,
    /// Rejoin reports the directory paced (sent again next tick).
    paced,
    /// Replicas a node held when the directory was killed, READY again after its rejoin.
    replicas_kept_across_restarts,
    /// Replicas a node held when the directory was killed, refused on rejoining because a
    /// newer copy was READY in the same pool.
    replicas_superseded,
    /// Replicas a node held when the directory was killed, refused on rejoining because
    /// the pool's books were full of reservations (the node's extent still held them).
    replicas_refused_for_reservations,
    /// Replicas a node held when the directory was killed, lost with their extent.
    replicas_lost_with_extents,
    /// Replicas a node held when the directory was killed, freed before its rejoin on a
    /// reclaim the killed incarnation asked for.
    replicas_reclaimed_since_the_kill,
    /// Shared extents nodes gave up or were refused on rejoining.
    extents_lost,
    /// Extents a node claimed back from a new directory incarnation after a silence past
    /// its fence window, their owner words still naming it.
    extents_kept_after_silence,
    /// Grants whose extent's owner word had moved on (taken by another node): never used.
    extent_grants_refused,
    /// Extents a rejoining node gave up because their owner words named another node.
    extents_found_taken,
    /// Replies to a node while another node was rejoining.
    answered_beside_rejoins,
    /// Rejoin storms run, and the extents and replicas their nodes reported.
    storms,
    storm_items,
    /// Replicas that left by their tier's time to live.
    expired,
    /// Replicas evicted under pressure.
    evicted,
    /// Demotion tasks a node ran (a copy one tier colder).
    demotions,
    /// Replication copies a node wrote (into shared memory, or received over the network).
    replications,
    /// Network copies a receiver claimed, wrote and committed.
    transfers_received,
    /// Requests an engine made for another tenant's objects, refused by its books.
    trespasses_refused,
    /// Copies and SSD reads that ended after taking simulated time, and copies that found
    /// their source reused meanwhile (not committed).
    timed_copies,
    copies_of_reused_sources,
    /// SSD stores opened on a node's disk (a start after a crash scans what the last process left).
    ssd_opened,
    /// Objects the recovery scans adopted, and objects they found torn (dropped).
    ssd_objects_recovered,
    ssd_torn_objects,
    /// Stored objects the directory adopted when their node started.
    ssd_objects_adopted,
    /// Unsynced blocks torn and lost at power cuts, and bits rot flipped.
    disk_blocks_torn,
    disk_blocks_lost,
    disk_bits_rotted,
    /// Spills into a node's SSD committed (sent), and skipped (a failed write, no source).
    ssd_spills,
    ssd_spills_skipped,
    /// Stored objects a region reclaim dropped (retired at the directory).
    ssd_evictions,
    /// Restores published, refused by the node core's verdict, and reads a checksum caught.
    ssd_restores,
    ssd_restores_refused,
    ssd_corrupt_reads,
    /// Objects the engine read from the disk under its pins.
    ssd_pins_read,
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
    /// Shards of the directory.
    pub shards: usize,
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

/// Runs one seed for `steps` steps against a directory of `shards` shards, then a rejoin
/// storm on a cluster of its own. A broken invariant ends the run and is reported, never
/// propagated as a panic.
pub fn run_seed(seed: u64, steps: u32, shards: usize) -> SeedReport {
    let outcome = std::panic::catch_unwind(|| {
        let mut world = world::World::new(seed, shards);
        for _ in 0..steps {
            world.step();
        }
        let mut storm = world::World::new(seed, shards);
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

/// Runs seeds `first..first + seeds`, each for `steps` steps against `shards` shards,
/// calling `progress` after each.
pub fn run_seeds(
    first: u64,
    seeds: u64,
    steps: u32,
    shards: usize,
    mut progress: impl FnMut(&SeedReport),
) -> SimSummary {
    let started = Instant::now();
    // A broken invariant is reported per seed, not printed by the panic hook.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut summary = SimSummary {
        seeds,
        steps,
        shards,
        violations: 0,
        first_failing_seed: None,
        first_violation: None,
        covered: Coverage::default(),
        storm_nearest_bound: None,
        elapsed_ms: 0,
    };
    for seed in first..first.saturating_add(seeds) {
        let report = run_seed(seed, steps, shards);
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
