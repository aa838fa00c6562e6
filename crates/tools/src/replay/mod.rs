//! `kvtier replay`: replays a Mooncake-format trace through the tiers, in process and
//! metadata only, under kvtier's policy and the LRU, S3-FIFO and Belady baselines at the
//! same capacity, and reports hit ratio, prefill saved, bytes moved and estimated TTFT.
//! On tiers a cluster holds (DRAM, then optionally CXL, then optionally SSD) it also replays the trace through the
//! directory core itself (`kvtier_directory`: the policy as the cluster runs it,
//! watermarks, demotions and reclaim lag included), and `--live` drives a running cluster
//! with it ([`live`]).

pub mod cluster;
pub mod eviction;
pub mod live;
pub mod report;
pub mod ssd;
pub mod tiers;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

use kvtier_core::progress::{Progress, Unit};

use crate::workload::trace::{self, Request, BLOCK_TOKENS};
use kvtier_core::policy::cost::CostModel;
use kvtier_core::policy::placement::PlacementConfig;
use kvtier_core::policy::profiles::{TierKind, TierProfile};
use report::{PolicyReport, Report};
use tiers::{PolicyKind, SimConfig, TierSpec, TIERS_MAX};

/// Options of `kvtier replay`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplayArgs {
    /// Mooncake-format trace (JSON lines). Default: the bundled trace if found, else the
    /// embedded 500-request sample.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Capacity of a single DRAM tier, in 512-token blocks.
    #[arg(long, value_name = "BLOCKS", default_value_t = 10_000)]
    pub capacity: usize,
    /// Tiers hottest first, replacing --capacity: `dram=1000,cxl=3000,ssd=30000`; a
    /// capacity is in blocks, or in bytes with a suffix B, KiB, MiB, GiB or TiB.
    #[arg(long, value_name = "KIND=CAPACITY,...")]
    pub tiers: Option<String>,
    /// KV bytes per token of the model (131072: a 512-token block is 64 MiB).
    #[arg(long, value_name = "BYTES", default_value_t = 131_072)]
    pub bytes_per_token: u64,
    /// Prefill time per token of the model, in microseconds.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 100.0)]
    pub prefill_us_per_token: f64,
    /// Least accesses, the current one included, before kvtier writes or demotes a block
    /// to a wear-limited tier (SSD). 1 admits every block; 2 admits only reused blocks.
    #[arg(long, value_name = "ACCESSES", default_value_t = 1)]
    pub wear_admit_frequency_min: u32,
    /// Policies to run (comma-separated); default all four.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub policy: Vec<PolicyKind>,
    /// A cluster.toml whose `[profiles.<medium>]` replace the representative figures of
    /// the tiers they describe (cpu: dram, cxl, ssd); `kvtier probe` measures this host's.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also drive a running cluster (a directory and a node per engine started on loopback,
    /// with a CXL pool they all map for a cxl tier) with the trace, storing and loading real chunks, and
    /// compare its hit ratio with the directory core's replay. Tiers: dram, then
    /// optionally cxl, then optionally ssd (each node's SSD store, under the run's folder).
    #[arg(long)]
    pub live: bool,
    /// Replay only the first REQUESTS requests of the trace.
    #[arg(long, value_name = "REQUESTS")]
    pub requests: Option<usize>,
    /// With --live: how many times faster than recorded the trace runs.
    #[arg(long, value_name = "FACTOR", default_value_t = 60.0)]
    pub speedup: f64,
    /// With --live: bytes of the chunk stored per block (a power of two; the node's pool
    /// holds capacity × this).
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 10)]
    pub chunk_bytes: u64,
    /// Engines of the cluster replay (`kvtier_directory` and `--live`), each on a node of
    /// its own with a CPU pool of the DRAM tier's capacity; requests go to them in turn,
    /// as the demo's do.
    #[arg(long, value_name = "ENGINES", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=ENGINES_MAX as i64))]
    pub engines: u16,
    /// Misses of an engine for a chunk another node holds where it cannot map it, before
    /// the directory replicates the chunk towards it (the directory's
    /// `replicate_after_misses`); 0 turns replication off.
    #[arg(long, value_name = "MISSES")]
    pub replicate_after_misses: Option<u32>,
}

/// Accesses a chunk needs before a cluster replay's SSD stores take it: the stores'
/// default `[nodes.ssd] admit_after_accesses` (a second access, to spare the disk).
pub const SSD_ADMIT_AFTER_ACCESSES: u32 = 2;

/// Most engines a cluster replay runs: each live one is a node process with its pools.
pub const ENGINES_MAX: u16 = 8;

/// Runs the replay described by `args` and prints its report on stdout (a progress bar
/// goes to stderr when it is a terminal); `exe` is this binary, started as the cluster's
/// processes by `--live`. Fails on an unreadable or malformed trace or invalid options.
pub fn run(exe: &Path, args: &ReplayArgs) -> anyhow::Result<()> {
    let (source, mut requests) = trace::load(args.trace.as_deref())?;
    if let Some(limit) = args.requests {
        requests.truncate(limit);
    }
    let config = sim_config(args)?;
    let mut report = replay(
        &requests,
        &config,
        &policies(&args.policy),
        &source,
        args.json,
    )?;
    let block_bytes = u64::from(BLOCK_TOKENS).saturating_mul(config.bytes_per_token);
    if let Some(simulation) = directory_replay(args, &config, 1.0)? {
        let bar = Progress::bar(
            report::KVTIER_DIRECTORY,
            requests.len() as u64,
            Unit::Items,
            args.json,
        );
        let tally = cluster::simulate(&requests, &simulation, &mut |done, hit_ratio| {
            show(&bar, done, hit_ratio)
        })?;
        bar.finish();
        report.results.push(report::PolicyReport::new(
            report::KVTIER_DIRECTORY.to_string(),
            &tally.outcome(block_bytes),
        ));
    }
    if args.live {
        anyhow::ensure!(
            args.speedup.is_finite() && args.speedup >= 1.0,
            "--speedup must be at least 1"
        );
        let Some(simulation) = directory_replay(args, &config, args.speedup)? else {
            anyhow::bail!(
                "--live drives nodes with a CPU pool each, optionally a CXL pool and optionally an SSD store each: give --capacity, or --tiers dram=N[,cxl=M][,ssd=K]"
            );
        };
        report.live = Some(live::run(exe, &requests, &simulation, args.json)?);
    }
    let mut stdout = std::io::stdout().lock();
    if args.json {
        writeln!(stdout, "{}", report.to_json())?;
    } else {
        write!(stdout, "{}", report.to_table())?;
    }
    if let Some(live) = report.live.as_ref().filter(|live| !live.agrees()) {
        anyhow::bail!(
            "the live cluster disagrees with its directory core replayed in process: {:.4} against {:.4}",
            live.live.token_hit_ratio(),
            live.simulated.token_hit_ratio()
        );
    }
    Ok(())
}

/// The cluster that holds the tiers of `config` — one node's CPU pool for a DRAM tier, a
/// CXL pool it maps for a CXL tier and its SSD store for an SSD tier (admitting chunks
/// after [`SSD_ADMIT_AFTER_ACCESSES`]) — replayed through the directory core at `speedup`;
/// `None` for tiers a cluster has no pool for (GPU, remote) or in another order.
fn directory_replay(
    args: &ReplayArgs,
    config: &SimConfig,
    speedup: f64,
) -> anyhow::Result<Option<cluster::ClusterSimConfig>> {
    anyhow::ensure!(
        args.chunk_bytes.is_power_of_two(),
        "--chunk-bytes must be a power of two"
    );
    let kinds: Vec<TierKind> = config.tiers.iter().map(|tier| tier.profile.kind).collect();
    let (cxl, ssd) = match kinds.as_slice() {
        [TierKind::Dram] => (None, None),
        [TierKind::Dram, TierKind::Cxl] => (config.tiers.get(1), None),
        [TierKind::Dram, TierKind::Ssd] => (None, config.tiers.get(1)),
        [TierKind::Dram, TierKind::Cxl, TierKind::Ssd] => {
            (config.tiers.get(1), config.tiers.get(2))
        }
        _ => return Ok(None),
    };
    let blocks_of = |tier: Option<&TierSpec>| u64::try_from(tier.map_or(0, |tier| tier.blocks));
    let profile_of = |tier: Option<&TierSpec>, kind| {
        tier.map_or_else(
            || TierProfile::representative(kind),
            |tier| tier.profile.clone(),
        )
    };
    anyhow::ensure!(
        ssd.is_none() || args.chunk_bytes <= crate::launch::SSD_OBJECT_BYTES_MAX,
        "--chunk-bytes must be at most {} with an SSD tier",
        crate::launch::SSD_OBJECT_BYTES_MAX
    );
    if let Some(tier) = ssd {
        ssd::store_bytes(u64::try_from(tier.blocks)?, args.chunk_bytes)?;
    }
    let defaults = kvtier_core::directory::DirectoryConfig::default();
    Ok(Some(cluster::ClusterSimConfig {
        engines: usize::from(args.engines),
        blocks: u64::try_from(config.tiers[0].blocks)?,
        cxl_blocks: blocks_of(cxl)?,
        ssd_blocks: blocks_of(ssd)?,
        ssd_admit_after_accesses: SSD_ADMIT_AFTER_ACCESSES,
        chunk_bytes: args.chunk_bytes,
        directory: kvtier_core::directory::DirectoryConfig {
            policy_time_scale: speedup,
            replicate_after_misses: args
                .replicate_after_misses
                .unwrap_or(defaults.replicate_after_misses),
            ..defaults
        },
        speedup,
        period: kvtier_core::actors::node::process::TASK_INTERVAL,
        pricing: cluster::Pricing {
            cost: config.cost,
            cpu: config.tiers[0].profile.clone(),
            cxl: profile_of(cxl, TierKind::Cxl),
            ssd: profile_of(ssd, TierKind::Ssd),
            block_bytes: u64::from(BLOCK_TOKENS).saturating_mul(config.bytes_per_token),
        },
    }))
}

fn policies(chosen: &[PolicyKind]) -> Vec<PolicyKind> {
    if chosen.is_empty() {
        vec![
            PolicyKind::Lru,
            PolicyKind::S3fifo,
            PolicyKind::Belady,
            PolicyKind::Kvtier,
        ]
    } else {
        chosen.to_vec()
    }
}

/// Builds the replay configuration from the options: `--tiers` or a single DRAM tier of
/// `--capacity` blocks, representative profiles (or those of `--config`), placement with
/// `--wear-admit-frequency-min`.
pub fn sim_config(args: &ReplayArgs) -> anyhow::Result<SimConfig> {
    anyhow::ensure!(
        args.prefill_us_per_token.is_finite() && args.prefill_us_per_token > 0.0,
        "--prefill-us-per-token must be positive"
    );
    anyhow::ensure!(
        args.bytes_per_token > 0,
        "--bytes-per-token must be positive"
    );
    let block_bytes = u64::from(BLOCK_TOKENS).saturating_mul(args.bytes_per_token);
    let tiers = match &args.tiers {
        Some(spec) => parse_tiers(spec, block_bytes)?,
        None => vec![TierSpec {
            profile: TierProfile::representative(TierKind::Dram),
            blocks: args.capacity,
        }],
    };
    let mut tiers = tiers;
    if let Some(path) = &args.config {
        let cluster = kvtier_core::config::ClusterConfig::load(path)?;
        for (medium, figures) in &cluster.profiles {
            for tier in tiers
                .iter_mut()
                .filter(|tier| tier.profile.kind == TierKind::of_medium(*medium))
            {
                tier.profile = figures
                    .apply(&tier.profile)
                    .with_context(|| format!("{}: profiles.{}", path.display(), medium.name()))?;
            }
        }
    }
    Ok(SimConfig {
        tiers,
        bytes_per_token: args.bytes_per_token,
        cost: CostModel {
            prefill_us_per_token: args.prefill_us_per_token,
        },
        placement: PlacementConfig {
            wear_admit_frequency_min: args.wear_admit_frequency_min,
        },
    })
}

/// Parses `kind=capacity,...` (see [`ReplayArgs::tiers`]).
pub fn parse_tiers(spec: &str, block_bytes: u64) -> anyhow::Result<Vec<TierSpec>> {
    let mut tiers = Vec::new();
    for item in spec.split(',').filter(|item| !item.trim().is_empty()) {
        let (kind, capacity) = item
            .split_once('=')
            .with_context(|| format!("tier {item:?} is not kind=capacity"))?;
        let kind: TierKind = kind.parse()?;
        let blocks = parse_capacity(capacity.trim(), block_bytes)
            .with_context(|| format!("tier {item:?}"))?;
        tiers.push(TierSpec {
            profile: TierProfile::representative(kind),
            blocks,
        });
    }
    anyhow::ensure!(
        (1..=TIERS_MAX).contains(&tiers.len()),
        "--tiers needs 1 to {TIERS_MAX} tiers"
    );
    Ok(tiers)
}

fn parse_capacity(text: &str, block_bytes: u64) -> anyhow::Result<usize> {
    const UNITS: [(&str, u64); 5] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ];
    for (suffix, unit) in UNITS {
        if let Some(number) = text.strip_suffix(suffix) {
            let bytes = number.trim().parse::<u64>()?.saturating_mul(unit);
            return Ok(usize::try_from(bytes / block_bytes.max(1))?);
        }
    }
    Ok(text.parse::<usize>()?)
}

/// Replays `requests` under each policy (and, with several tiers, LRU on the hottest tier
/// alone) and gathers the report; a bar per run shows progress unless `json`.
pub fn replay(
    requests: &[Request],
    config: &SimConfig,
    policies: &[PolicyKind],
    source: &str,
    json: bool,
) -> anyhow::Result<Report> {
    let next_uses = tiers::next_uses(requests);
    let mut runs: Vec<(String, &SimConfig, PolicyKind)> = policies
        .iter()
        .map(|policy| (report::policy_name(*policy).to_string(), config, *policy))
        .collect();
    let top_only = SimConfig {
        tiers: config.tiers[..1].to_vec(),
        ..config.clone()
    };
    if config.tiers.len() > 1 {
        runs.push((
            report::LRU_TOP_TIER_ONLY.to_string(),
            &top_only,
            PolicyKind::Lru,
        ));
    }
    let mut results = Vec::new();
    for (name, run_config, policy) in runs {
        let bar = Progress::bar(&name, requests.len() as u64, Unit::Items, json);
        let outcome = tiers::simulate(
            requests,
            &next_uses,
            policy,
            run_config,
            &mut |done, hit_ratio| show(&bar, done, hit_ratio),
        )?;
        bar.finish();
        results.push(PolicyReport::new(name, &outcome));
    }
    Ok(Report {
        source: source.to_string(),
        requests: requests.len(),
        tiers: config.tiers.clone(),
        results,
        live: None,
    })
}

/// Shows a replay's progress: requests done and the token hit ratio so far.
fn show(bar: &Progress, done: usize, hit_ratio: f64) {
    bar.set(done as u64);
    bar.message(format!("token hit ratio {hit_ratio:.3}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_parse_in_blocks_and_bytes() {
        let tiers = parse_tiers("dram=1000, cxl=192GiB ,ssd=30000", 64 << 20).unwrap();
        let blocks: Vec<usize> = tiers.iter().map(|tier| tier.blocks).collect();
        assert_eq!(blocks, [1000, 3072, 30000]);
        assert_eq!(tiers[1].profile.kind, TierKind::Cxl);
        for bad in [
            "",
            "dram",
            "tape=5",
            "dram=-1",
            "dram=1,cxl=1,ssd=1,gpu=1,numa=1,remote=1,dram=1",
        ] {
            assert!(parse_tiers(bad, 64 << 20).is_err(), "{bad}");
        }
    }

    #[test]
    fn profiles_of_a_cluster_configuration_replace_representative_figures() {
        let args = ReplayArgs {
            tiers: Some("dram=10,cxl=10".into()),
            config: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../cluster.toml")),
            ..sample_args()
        };
        let config = sim_config(&args).unwrap();
        assert_eq!(config.tiers[1].profile.read_latency_us, 0.6);
        assert_eq!(
            config.tiers[0].profile,
            TierProfile::representative(TierKind::Dram)
        );
        let missing = ReplayArgs {
            config: Some("/nonexistent/cluster.toml".into()),
            ..sample_args()
        };
        assert!(sim_config(&missing).is_err());
    }

    /// Arguments of a small in-process replay (no trace file, JSON), for tests to vary.
    pub(crate) fn sample_args() -> ReplayArgs {
        ReplayArgs {
            trace: None,
            capacity: 1_000,
            tiers: None,
            bytes_per_token: 131_072,
            prefill_us_per_token: 100.0,
            wear_admit_frequency_min: 1,
            policy: Vec::new(),
            json: true,
            config: None,
            live: false,
            requests: None,
            speedup: 60.0,
            chunk_bytes: 64 << 10,
            engines: 1,
            replicate_after_misses: None,
        }
    }

    /// The prompt tokens a cache with room for every block serves, worked out from the
    /// trace alone: a request hits the longest prefix of its blocks that earlier requests
    /// stored. A plain cache stores every block; a `selective` one (kvtier's admission)
    /// stores a block holding fewer than 512 tokens only from its second access on, and no
    /// block whose parent is not stored. Also the input tokens and the distinct blocks.
    fn reuse_of(requests: &[Request], selective: bool) -> (u64, u64, usize) {
        let mut stored = std::collections::HashSet::new();
        let mut accesses = std::collections::HashMap::new();
        let (mut hit_tokens, mut input_tokens) = (0u64, 0u64);
        for request in requests {
            input_tokens += u64::from(request.input_tokens);
            hit_tokens += request
                .hash_ids
                .iter()
                .enumerate()
                .take_while(|(_, block)| stored.contains(*block))
                .map(|(position, _)| u64::from(request.block_tokens(position)))
                .sum::<u64>();
            for (position, block) in request.hash_ids.iter().enumerate() {
                let count = accesses.entry(*block).or_insert(0u32);
                *count += 1;
                let parent_stored =
                    position == 0 || stored.contains(&request.hash_ids[position - 1]);
                let partial_once = request.block_tokens(position) < BLOCK_TOKENS && *count == 1;
                if !selective || (parent_stored && !partial_once) {
                    stored.insert(*block);
                }
            }
        }
        (hit_tokens, input_tokens, accesses.len())
    }

    #[test]
    fn embedded_sample_replays_to_the_reuse_it_holds() {
        let requests = trace::parse_str(trace::SAMPLE_TRACE).unwrap();
        assert_eq!(requests.len(), 500);
        let (hit_tokens, input_tokens, distinct_blocks) = reuse_of(&requests, false);
        let (selective_hit_tokens, ..) = reuse_of(&requests, true);
        assert!(
            0 < selective_hit_tokens
                && selective_hit_tokens < hit_tokens
                && hit_tokens < input_tokens,
            "the sample has reuse, and partial blocks seen once are some of it"
        );
        let run = |capacity: usize| {
            let args = ReplayArgs {
                capacity,
                ..sample_args()
            };
            let report = replay(
                &requests,
                &sim_config(&args).unwrap(),
                &policies(&[]),
                "sample",
                true,
            )
            .unwrap();
            let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
            assert_eq!(json["capacity_blocks"], capacity);
            assert_eq!(json["requests"], 500);
            json
        };
        // Room for every block: nothing is evicted, so each policy serves exactly the reuse
        // its admission keeps, and moves nothing between tiers.
        let roomy = run(2 * distinct_blocks);
        for (name, expected) in [
            ("lru", hit_tokens),
            ("s3fifo", hit_tokens),
            ("belady", hit_tokens),
            ("kvtier", selective_hit_tokens),
        ] {
            let policy = &roomy["policies"][name];
            assert_eq!(policy["prefill_tokens_saved"], expected, "{name}");
            assert_eq!(
                policy["token_hit_ratio"].as_f64(),
                Some(expected as f64 / input_tokens as f64),
                "{name}"
            );
            assert_eq!(policy["bytes_moved"], 0, "{name}");
        }
        // 1000 blocks hold a fraction of the trace: every policy loses some of the reuse,
        // and none beats Belady's oracle.
        assert!(
            distinct_blocks > 2 * 1_000,
            "{distinct_blocks} distinct blocks"
        );
        let tight = run(1_000);
        let saved = |name: &str| {
            tight["policies"][name]["prefill_tokens_saved"]
                .as_u64()
                .unwrap()
        };
        for name in ["lru", "s3fifo", "belady", "kvtier"] {
            assert!(
                saved(name) > 0 && saved(name) < hit_tokens,
                "{name}: {} of {hit_tokens}",
                saved(name)
            );
            assert!(saved(name) <= saved("belady"), "{name} beat Belady");
        }
    }
}
