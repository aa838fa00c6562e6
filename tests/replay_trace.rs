//! Replays the bundled conversation trace at 1k, 3k, 10k and 30k blocks and checks the
//! replayer's LRU and Belady hit tokens against straightforward implementations written
//! here, independently of `src/`, and the kvtier targets against the baselines — both the
//! replayed policy and the directory core that runs it in the cluster. Then drives a live
//! cluster with the trace and checks it agrees with the directory core's replay.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kvtier_core::directory::DirectoryConfig;
use kvtier_core::policy::cost::CostModel;
use kvtier_core::policy::placement::PlacementConfig;
use kvtier_core::policy::profiles::{TierKind, TierProfile};
use kvtier_tools::replay::cluster::{self, ClusterSimConfig, Pricing};
use kvtier_tools::replay::live;
use kvtier_tools::replay::tiers::{self, PolicyKind, SimConfig, TierSpec};
use kvtier_tools::workload::trace;
use std::time::Duration;

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/traces/conversation_trace.jsonl"
);
const CAPACITIES: [usize; 4] = [1_000, 3_000, 10_000, 30_000];
/// The tests of this file take turns: the live one measures a cluster's timing, which two
/// replays of the whole trace on the same two cores would distort.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Row {
    input: u64,
    blocks: Vec<u64>,
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(TRACE).expect("bundled trace");
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("json line");
            Row {
                input: value["input_length"].as_u64().expect("input_length"),
                blocks: value["hash_ids"]
                    .as_array()
                    .expect("hash_ids")
                    .iter()
                    .map(|id| id.as_u64().expect("id"))
                    .collect(),
            }
        })
        .collect()
}

fn hit(row: &Row, resident: impl Fn(u64) -> bool) -> u64 {
    let blocks = row
        .blocks
        .iter()
        .take_while(|block| resident(**block))
        .count() as u64;
    (blocks * 512).min(row.input)
}

fn lru(rows: &[Row], capacity: usize) -> u64 {
    let mut clock = 0u64;
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut by_age: BTreeMap<u64, u64> = BTreeMap::new();
    let mut saved = 0;
    for row in rows {
        saved += hit(row, |block| last.contains_key(&block));
        for block in &row.blocks {
            clock += 1;
            if let Some(old) = last.insert(*block, clock) {
                by_age.remove(&old);
            } else if last.len() > capacity {
                let (_, oldest) = by_age.pop_first().expect("non-empty");
                last.remove(&oldest);
            }
            by_age.insert(clock, *block);
        }
    }
    saved
}

fn belady(rows: &[Row], capacity: usize) -> u64 {
    let mut uses: HashMap<u64, Vec<u64>> = HashMap::new();
    for (index, row) in rows.iter().enumerate() {
        for block in &row.blocks {
            uses.entry(*block).or_default().push(index as u64);
        }
    }
    let next_after = |block: u64, index: u64| {
        let list = &uses[&block];
        list.get(list.partition_point(|used| *used <= index))
            .copied()
    };
    let mut next: HashMap<u64, u64> = HashMap::new();
    let mut order: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut saved = 0;
    for (index, row) in rows.iter().enumerate() {
        saved += hit(row, |block| next.contains_key(&block));
        for block in &row.blocks {
            if let Some(old) = next.remove(block) {
                order.remove(&(old, *block));
            }
            let Some(upcoming) = next_after(*block, index as u64) else {
                continue;
            };
            if next.len() >= capacity {
                let farthest = *order.last().expect("full");
                if (upcoming, *block) > farthest {
                    continue;
                }
                order.remove(&farthest);
                next.remove(&farthest.1);
            }
            next.insert(*block, upcoming);
            order.insert((upcoming, *block));
        }
    }
    saved
}

fn config(blocks: usize) -> SimConfig {
    SimConfig {
        tiers: vec![TierSpec {
            profile: TierProfile::representative(TierKind::Dram),
            blocks,
        }],
        bytes_per_token: 131_072,
        cost: CostModel {
            prefill_us_per_token: 100.0,
        },
        placement: PlacementConfig {
            wear_admit_frequency_min: 1,
        },
    }
}

#[test]
fn bundled_trace_matches_independent_baselines_and_kvtier_beats_lru() {
    let _turn = one_at_a_time();
    let requests = trace::read_file(std::path::Path::new(TRACE)).expect("bundled trace parses");
    let rows = rows();
    assert_eq!(requests.len(), rows.len());
    let next_uses = tiers::next_uses(&requests);
    for capacity in CAPACITIES {
        let run = |policy| {
            tiers::simulate(
                &requests,
                &next_uses,
                policy,
                &config(capacity),
                &mut |_, _| {},
            )
            .expect("replay")
        };
        let (replay_lru, replay_belady) = (run(PolicyKind::Lru), run(PolicyKind::Belady));
        assert_eq!(
            replay_lru.hit_tokens,
            lru(&rows, capacity),
            "lru at {capacity}"
        );
        assert_eq!(
            replay_belady.hit_tokens,
            belady(&rows, capacity),
            "belady at {capacity}"
        );
        let (s3fifo, kvtier) = (run(PolicyKind::S3fifo), run(PolicyKind::Kvtier));
        assert!(
            kvtier.hit_tokens >= replay_lru.hit_tokens,
            "kvtier < lru at {capacity}"
        );
        assert!(
            kvtier.hit_tokens >= s3fifo.hit_tokens,
            "kvtier < s3fifo at {capacity}"
        );
        assert!(
            replay_belady.hit_tokens >= kvtier.hit_tokens,
            "kvtier beat the optimum at {capacity}"
        );
        // The same policy as the directory runs it, watermarks and reclaim lag included.
        let directory = cluster::simulate(
            &requests,
            &directory_replay(capacity, 0, 1.0),
            &mut |_, _| {},
        )
        .expect("directory replay");
        assert!(
            directory.hit_tokens >= replay_lru.hit_tokens,
            "the directory's policy < lru at {capacity}"
        );
        assert!(
            directory.hit_tokens >= s3fifo.hit_tokens,
            "the directory's policy < s3fifo at {capacity}"
        );
    }
}

/// One node's CPU pool of `blocks` 64 KiB chunks and a CXL pool of `cxl_blocks`, the
/// directory's defaults, the trace `speedup` times faster than recorded.
fn directory_replay(blocks: usize, cxl_blocks: u64, speedup: f64) -> ClusterSimConfig {
    ClusterSimConfig {
        engines: 1,
        blocks: blocks as u64,
        cxl_blocks,
        ssd_blocks: 0,
        ssd_admit_after_accesses: 2,
        chunk_bytes: 64 << 10,
        directory: DirectoryConfig {
            policy_time_scale: speedup,
            ..DirectoryConfig::default()
        },
        speedup,
        period: Duration::from_millis(50),
        pricing: Pricing {
            cost: CostModel {
                prefill_us_per_token: 100.0,
            },
            cpu: TierProfile::representative(TierKind::Dram),
            cxl: TierProfile::representative(TierKind::Cxl),
            ssd: TierProfile::representative(TierKind::Ssd),
            block_bytes: 64 << 20,
        },
    }
}

#[test]
fn a_live_cluster_agrees_with_its_directory_replayed_in_process() {
    let _turn = one_at_a_time();
    let requests = trace::read_file(std::path::Path::new(TRACE)).expect("bundled trace parses");
    // The first 3,000 requests at 60×: about 20 s per run, pools of a thousand chunks
    // under constant pressure, where kvtier and LRU are far apart. One CPU pool, then a CPU pool whose
    // victims are demoted into a CXL pool. One after the other, so neither slows the other.
    let requests = &requests[..3_000];
    for (blocks, cxl_blocks) in [(1_000, 0), (500, 1_000)] {
        let replayed = directory_replay(blocks, cxl_blocks, 60.0);
        let outcome = live::run(
            std::path::Path::new(env!("CARGO_BIN_EXE_kvtier")),
            requests,
            &replayed,
            true,
        )
        .expect("live replay");
        assert!(outcome.verified_chunks > 500, "{outcome:?}");
        assert!(
            outcome.live.skipped > 0 && outcome.simulated.skipped > 0,
            "the pools were never full: {outcome:?}"
        );
        for demoted in [outcome.simulated.demoted, outcome.live.demoted] {
            assert_eq!(
                demoted > 0,
                cxl_blocks > 0,
                "demotions only with a CXL pool: {outcome:?}"
            );
        }
        let (live, simulated) = (&outcome.live, &outcome.simulated);
        assert!(
            outcome.agrees(),
            "dram={blocks} cxl={cxl_blocks}: live {:.4} vs simulated {:.4} (stored {}/{}, skipped {}/{}, demoted {}/{}, lag {:?})",
            live.token_hit_ratio(),
            simulated.token_hit_ratio(),
            live.stored,
            simulated.stored,
            live.skipped,
            simulated.skipped,
            live.demoted,
            simulated.demoted,
            outcome.lag_max
        );
        // The check must tell kvtier from plain LRU at the same total capacity: LRU's ratio
        // falls outside the tolerance around the simulated one.
        let next_uses = tiers::next_uses(requests);
        let lru = tiers::simulate(
            requests,
            &next_uses,
            PolicyKind::Lru,
            &config(blocks + cxl_blocks as usize),
            &mut |_, _| {},
        )
        .expect("replay");
        let lru_ratio = lru.hit_tokens as f64 / lru.input_tokens as f64;
        assert!(
            !live::within_tolerance(lru_ratio, outcome.simulated.token_hit_ratio()),
            "dram={blocks} cxl={cxl_blocks}: LRU {lru_ratio:.4} agrees with the simulation {:.4} too: the check cannot tell them apart",
            outcome.simulated.token_hit_ratio()
        );
        eprintln!(
            "dram={blocks} cxl={cxl_blocks}: live {:.4}, simulated {:.4}, LRU {lru_ratio:.4}",
            outcome.live.token_hit_ratio(),
            outcome.simulated.token_hit_ratio()
        );
    }
}

/// The first `requests` requests of the bundled trace at 60×, live against a cluster whose
/// node has a CPU pool of `dram` chunks spilling into an SSD store of `ssd` (chunks admitted
/// on their second access), and through its directory core in process: both spill and
/// restore, and their token hit ratios agree within 0.01.
fn ssd_replay_agrees(requests: usize, dram: usize, ssd: u64) -> live::LiveOutcome {
    let trace = trace::read_file(std::path::Path::new(TRACE)).expect("bundled trace parses");
    let replayed = ClusterSimConfig {
        ssd_blocks: ssd,
        ..directory_replay(dram, 0, 60.0)
    };
    let outcome = live::run(
        std::path::Path::new(env!("CARGO_BIN_EXE_kvtier")),
        &trace[..requests],
        &replayed,
        true,
    )
    .expect("live replay");
    let (live, simulated) = (&outcome.live, &outcome.simulated);
    eprintln!(
        "dram={dram} ssd={ssd}: live {:.4}, simulated {:.4}; spilled {}/{}, restored {}/{}, regions reclaimed {}/{}",
        live.token_hit_ratio(),
        simulated.token_hit_ratio(),
        live.spilled,
        simulated.spilled,
        live.restored,
        simulated.restored,
        live.regions_reclaimed,
        simulated.regions_reclaimed
    );
    for tally in [live, simulated] {
        assert!(
            tally.spilled > 0 && tally.restored > 0,
            "no spill or no restore: {outcome:?}"
        );
    }
    assert!(
        outcome.difference() <= 0.01,
        "live {:.4} vs simulated {:.4}",
        live.token_hit_ratio(),
        simulated.token_hit_ratio()
    );
    outcome
}

#[test]
fn a_live_cluster_with_ssd_stores_agrees_with_its_directory_replayed_in_process() {
    let _turn = one_at_a_time();
    // 1,000 requests, a CPU pool of 500 chunks and an SSD store of 3,000: a few seconds,
    // with spills and with loads that restore chunks only the SSD holds.
    ssd_replay_agrees(1_000, 500, 3_000);
}

#[test]
fn a_live_cluster_whose_ssd_stores_reclaim_regions_agrees_with_its_directory_replayed_in_process() {
    let _turn = one_at_a_time();
    // An SSD store of 300 chunks (five 4 MiB regions of 60): spills fill it, and each store
    // reclaims whole regions, oldest first, retiring what they held.
    let outcome = ssd_replay_agrees(1_000, 500, 300);
    for (side, tally) in [("live", &outcome.live), ("simulated", &outcome.simulated)] {
        assert!(
            tally.regions_reclaimed >= 1,
            "{side}: no SSD region reclaimed: {outcome:?}"
        );
    }
}

/// DRAM 1k + CXL 3k + SSD 30k blocks, representative profiles, 64 MiB blocks.
fn tiered() -> SimConfig {
    let tiers: Vec<TierSpec> = [
        (TierKind::Dram, 1_000),
        (TierKind::Cxl, 3_000),
        (TierKind::Ssd, 30_000),
    ]
    .into_iter()
    .map(|(kind, blocks)| TierSpec {
        profile: TierProfile::representative(kind),
        blocks,
    })
    .collect();
    SimConfig {
        tiers,
        ..config(1_000)
    }
}

#[test]
fn kvtier_over_tiers_saves_more_than_lru_over_the_same_tiers_and_dram_alone() {
    let _turn = one_at_a_time();
    let requests = trace::read_file(std::path::Path::new(TRACE)).expect("bundled trace parses");
    let next_uses = tiers::next_uses(&requests);
    let run = |policy, config: &SimConfig| {
        tiers::simulate(&requests, &next_uses, policy, config, &mut |_, _| {})
            .expect("replay")
            .hit_tokens
    };
    let tiered = tiered();
    let kvtier = run(PolicyKind::Kvtier, &tiered);
    let lru = run(PolicyKind::Lru, &tiered);
    let lru_dram = run(PolicyKind::Lru, &config(1_000));
    let s3fifo = run(PolicyKind::S3fifo, &tiered);
    assert!(kvtier > lru, "kvtier {kvtier} <= lru over the tiers {lru}");
    assert!(
        kvtier > s3fifo,
        "kvtier {kvtier} <= s3-fifo over the tiers {s3fifo}"
    );
    assert!(
        kvtier > lru_dram,
        "kvtier {kvtier} <= lru on dram {lru_dram}"
    );
}

/// Two engines in turn, each on a node of its own with a private CPU pool (no shared
/// tier): a chunk one engine stored is a miss for the other until the directory copies it
/// over the network. With replication on, copies are made and the second engine stores
/// less of what the first already holds; with it off, none.
#[test]
fn two_engines_replicate_what_one_missed_only_when_replication_is_on() {
    let requests = trace::read_file(std::path::Path::new(TRACE)).expect("bundled trace parses");
    let requests = &requests[..3_000];
    let run = |after_misses: u32| {
        let mut config = directory_replay(1_000, 0, 1.0);
        config.engines = 2;
        config.directory.replicate_after_misses = after_misses;
        cluster::simulate(requests, &config, &mut |_, _| {}).expect("the replay runs")
    };
    let (on, off) = (run(1), run(0));
    assert_eq!(off.replicated, 0, "replication off, yet chunks were copied");
    assert!(on.replicated > 0, "two engines, yet nothing was replicated");
    assert!(
        on.stored < off.stored,
        "replicated chunks did not replace stores: {} stored against {}",
        on.stored,
        off.stored
    );
    assert!(
        on.token_hit_ratio() >= off.token_hit_ratio() - 0.01,
        "replication lost hits: {:.4} against {:.4}",
        on.token_hit_ratio(),
        off.token_hit_ratio()
    );
}
