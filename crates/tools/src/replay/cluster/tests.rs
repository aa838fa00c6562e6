//! The simulated cluster with an SSD tier whose regions are reclaimed and reused.

use super::*;
use crate::replay::{directory_replay, sim_config, ReplayArgs};

/// A cluster of one node: a CPU pool of 20 chunks and an SSD store of two regions (60
/// chunks of 64 KiB each), so spills soon reclaim a region and refill its offsets.
fn small_ssd_cluster() -> ClusterSimConfig {
    let args = ReplayArgs {
        capacity: 20,
        tiers: Some("dram=20,ssd=120".into()),
        speedup: 1.0,
        ..crate::replay::tests::sample_args()
    };
    let config = sim_config(&args).unwrap();
    directory_replay(&args, &config, 1.0).unwrap().unwrap()
}

/// Prompts of four blocks of their own, each sent twice in a row (the second access
/// admits its chunks to the SSD), 100 ms apart.
fn prompts_seen_twice(prompts: u64) -> Vec<Request> {
    (0..prompts * 2)
        .map(|index| Request {
            timestamp_ms: index * 100,
            input_tokens: 4 * 512,
            output_tokens: 1,
            hash_ids: (0..4).map(|block| (index / 2) * 4 + block).collect(),
        })
        .collect()
}

/// The objects the node's holdings record in its SSD pool, and those its store holds,
/// each sorted by location.
fn held_and_stored(cluster: &SimulatedCluster) -> (Vec<Holding>, Vec<Holding>) {
    let ssd = cluster.nodes[0].ssd.as_ref().unwrap();
    let by_location =
        |holding: &Holding| (holding.location.offset_bytes, holding.location.generation);
    let mut held: Vec<Holding> = cluster
        .held
        .replicas()
        .into_iter()
        .filter(|holding| holding.location.pool == ssd.pool)
        .collect();
    held.sort_by_key(by_location);
    let mut stored = ssd.holdings();
    stored.sort_by_key(by_location);
    (held, stored)
}

#[test]
fn a_reclaim_queued_for_a_reused_ssd_offset_keeps_the_object_written_there_since() {
    let config = small_ssd_cluster();
    let mut cluster = SimulatedCluster::start(&config).unwrap();
    let mut tally = ClusterTally::default();
    for (index, request) in prompts_seen_twice(300).iter().enumerate() {
        let now = Timestamp::ZERO + cluster_time(request, config.speedup);
        cluster.advance(now).unwrap();
        let objects = chain(cluster.namespace, &request.hash_ids);
        let loaded = cluster.load_prefix(0, now, &objects).unwrap();
        tally.count_request(request, &loaded, &config.pricing);
        cluster
            .store(0, now, &objects[loaded.len()..], &mut tally)
            .unwrap();
        let (held, stored) = held_and_stored(&cluster);
        assert_eq!(
            held, stored,
            "request {index}: the holdings and the store disagree on what the SSD holds"
        );
    }
    assert!(cluster.spilled > 200, "{} spills", cluster.spilled);
    assert!(
        cluster.regions_reclaimed() >= 3,
        "{} regions reclaimed",
        cluster.regions_reclaimed()
    );
}
