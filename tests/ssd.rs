//! The SSD tier with real processes: a node whose CPU pool holds four chunks stores more,
//! the directory evicts the oldest and the node spills them to its SSD store on reclaim;
//! loads of spilled objects restore them into the CPU pool and read them byte for byte.
//! After the node is killed (SIGKILL) and started again, it adopts its SSD contents and
//! loads find them again. Waits on conditions; deadlines are hang guards only.

use kvtier::client::{Client, StoreOutcome};
use kvtier::directory::AcquireMode;
use kvtier::launch::{node_name, ClusterSpec, LocalCluster};
use kvtier::metrics::scrape::{metric_value, scrape_metrics, wait_for_metrics};
use kvtier::model::{Medium, NamespaceId, ObjectId, PrefixDigest};
use kvtier::workload::chunk;
use kvtier::workload::namespace::demo_namespace;
use std::path::Path;
use std::time::{Duration, Instant};

const CHUNK: usize = 256 << 10;
const OBJECTS: u32 = 12;
/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn object(namespace: NamespaceId, index: u32) -> (ObjectId, Vec<u8>) {
    let id = ObjectId {
        namespace,
        prefix: PrefixDigest::ROOT.chain(&[index, 42]),
        shard: 0,
        part: 0,
    };
    let mut bytes = vec![0u8; CHUNK];
    chunk::fill(&id, &mut bytes);
    (id, bytes)
}

/// Loads each object alone and compares it with its content; the number of hits.
async fn verified_hits(client: &Client, objects: &[(ObjectId, Vec<u8>)]) -> usize {
    let mut hits = 0;
    for (id, bytes) in objects {
        let views = client
            .load(std::slice::from_ref(id), AcquireMode::Each)
            .await
            .expect("a load never fails with an error");
        if let Some(Some(view)) = views.first() {
            assert_eq!(view.bytes().unwrap(), &bytes[..], "wrong bytes for {id:?}");
            hits += 1;
        }
    }
    hits
}

#[test]
fn evicted_chunks_spill_to_ssd_and_restore_byte_exact_across_a_node_kill() {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 1 << 20,
        write_order: vec![Medium::Cpu],
        high_watermark_percent: 90,
        low_watermark_percent: 70,
        ssd_bytes: 32 << 20,
        ..ClusterSpec::default()
    };
    let mut cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let metrics = cluster
        .metrics_addresses()
        .into_iter()
        .find(|(name, _)| *name == node_name(0))
        .expect("the node serves metrics")
        .1;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stored = runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let namespace = client.register_namespace(demo_namespace()).await.unwrap();
        let mut stored = Vec::new();
        for index in 0..OBJECTS {
            let (id, bytes) = object(namespace, index);
            // A full pool skips the store until the directory's next eviction round.
            let deadline = Instant::now() + HANG_GUARD;
            while client.store(id, &bytes).await.unwrap() != StoreOutcome::Stored {
                assert!(Instant::now() < deadline, "object {index} was never stored");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stored.push((id, bytes));
        }
        stored
    });
    assert!(
        stored.len() > 4,
        "the directory evicts to make room: {} stored",
        stored.len()
    );
    let spilled = |body: &str| metric_value(body, "kvtier_ssd_spills_total").unwrap_or(0.0) >= 2.0;
    assert!(
        wait_for_metrics(metrics, HANG_GUARD, spilled),
        "evicted chunks were spilled: {}",
        scrape_metrics(metrics).unwrap_or_default()
    );
    let hits = runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        client.register_namespace(demo_namespace()).await.unwrap();
        verified_hits(&client, &stored).await
    });
    assert_eq!(
        hits,
        stored.len(),
        "every stored chunk is a hit from memory or restored from SSD: {}",
        scrape_metrics(metrics).unwrap_or_default()
    );
    let body = scrape_metrics(metrics).unwrap();
    assert!(
        metric_value(&body, "kvtier_ssd_restores_total").unwrap_or(0.0) >= 1.0,
        "{body}"
    );
    assert_eq!(
        metric_value(&body, "kvtier_ssd_checksum_failures_total"),
        Some(0.0)
    );

    // SIGKILL: the CPU pool goes with the node; what was spilled stays on its SSD.
    cluster.kill_node(0).unwrap();
    cluster.restart_node(0).unwrap();
    let hits = runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        client.register_namespace(demo_namespace()).await.unwrap();
        verified_hits(&client, &stored).await
    });
    let spilled = metric_value(&body, "kvtier_ssd_spills_total").unwrap_or(0.0) as usize;
    assert!(
        hits >= spilled.min(stored.len()),
        "after the kill the node adopts its SSD and every spilled chunk is a hit: {hits} hits, {spilled} spilled"
    );
    cluster.shutdown();
}
