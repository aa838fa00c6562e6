//! The SSD tier with real processes. A node whose CPU pool holds four chunks stores more;
//! the directory evicts the oldest and, as they were accessed often enough, demotes them to
//! the node's SSD pool (the node spills their bytes, then commits): `probe` says they are on
//! SSD, a pin gives where their bytes are in the store's files (read there byte-exact), a
//! prefetch restores them and a load reads them byte for byte. After the node is
//! killed (SIGKILL) and started again, it reports its SSD contents to the directory, which
//! probes them on SSD before any load. Objects accessed only once are never spilled (the
//! default admission). When the store later reclaims the region of objects it adopted, the
//! directory stops reporting them on SSD. Waits on conditions; deadlines are hang guards
//! only.

use kvtier_core::backends::checksum;
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::{AcquireMode, ProbeOutcome};
use kvtier_core::metrics::scrape::{metric_value, scrape_metrics};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, NamespaceId, ObjectId, PrefixDigest};
use kvtier_tools::launch::{node_name, ClusterSpec, LocalCluster};
use kvtier_tools::workload::chunk;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const CHUNK: usize = 256 << 10;
const OBJECTS: u32 = 12;
/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(60);
/// Pause between polls of a condition.
const POLL: Duration = Duration::from_millis(20);

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

/// A one-node cluster with a 1 MiB CPU pool (four chunks) and a 32 MiB SSD store.
fn start(admit_after_accesses: u32) -> (LocalCluster, SocketAddr) {
    start_with_ssd(admit_after_accesses, 32 << 20)
}

/// A one-node cluster with a 1 MiB CPU pool (four chunks) and an SSD store of `ssd_bytes`
/// (4 MiB regions of fifteen chunks each).
fn start_with_ssd(admit_after_accesses: u32, ssd_bytes: u64) -> (LocalCluster, SocketAddr) {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 1 << 20,
        write_order: vec![Medium::Cpu],
        high_watermark_percent: 90,
        low_watermark_percent: 70,
        ssd_bytes,
        ssd_admit_after_accesses: admit_after_accesses,
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let metrics = cluster
        .metrics_addresses()
        .into_iter()
        .find(|(name, _)| *name == node_name(0))
        .expect("the node serves metrics")
        .1;
    (cluster, metrics)
}

/// Stores every object (a full pool skips a store until the next eviction round); returns
/// them with the attempts each took: each attempt is an access.
async fn store_all(client: &Client, namespace: NamespaceId) -> Vec<(ObjectId, Vec<u8>, u32)> {
    store_range(client, namespace, 0..OBJECTS).await
}

/// [`store_all`] of the objects of `indices`.
async fn store_range(
    client: &Client,
    namespace: NamespaceId,
    indices: std::ops::Range<u32>,
) -> Vec<(ObjectId, Vec<u8>, u32)> {
    let mut stored = Vec::new();
    for index in indices {
        let (id, bytes) = object(namespace, index);
        let deadline = Instant::now() + HANG_GUARD;
        let mut attempts = 1;
        while client.store(id, &bytes).await.unwrap() != StoreOutcome::Stored {
            assert!(Instant::now() < deadline, "object {index} was never stored");
            attempts += 1;
            tokio::time::sleep(POLL).await;
        }
        stored.push((id, bytes, attempts));
    }
    stored
}

fn contents(stored: Vec<(ObjectId, Vec<u8>, u32)>) -> Vec<(ObjectId, Vec<u8>)> {
    stored
        .into_iter()
        .map(|(id, bytes, _)| (id, bytes))
        .collect()
}

/// Probes `objects` until `done` holds of the outcomes; returns them.
async fn probe_until(
    client: &Client,
    objects: &[(ObjectId, Vec<u8>)],
    what: &str,
    done: impl Fn(&[ProbeOutcome]) -> bool,
) -> Vec<ProbeOutcome> {
    let ids: Vec<ObjectId> = objects.iter().map(|(id, _)| *id).collect();
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let probed = client.probe(&ids).await.unwrap();
        if done(&probed) {
            return probed;
        }
        assert!(Instant::now() < deadline, "{what}: {probed:?}");
        tokio::time::sleep(POLL).await;
    }
}

fn on_ssd(outcomes: &[ProbeOutcome]) -> Vec<usize> {
    (0..outcomes.len())
        .filter(|index| matches!(outcomes[*index], ProbeOutcome::OnSsd { .. }))
        .collect()
}

/// Pins `wanted` (all on SSD) and one object never stored, and reads each pinned object
/// from the store's file itself, as a GPUDirect Storage reader would: byte-exact, its
/// checksum as the extent says; the unstored one gets no extent; the pins end once.
async fn read_pinned_in_place(
    client: &Client,
    wanted: &[(ObjectId, Vec<u8>)],
    namespace: NamespaceId,
) {
    use std::os::unix::fs::FileExt;
    let mut ids: Vec<ObjectId> = wanted.iter().map(|(id, _)| *id).collect();
    ids.push(object(namespace, OBJECTS + 1).0);
    let extents = client.pin_on_ssd(&ids).await.unwrap();
    assert!(
        extents[wanted.len()].is_none(),
        "an object never stored has no extent"
    );
    let mut pins = Vec::new();
    for ((id, bytes), extent) in wanted.iter().zip(&extents) {
        let extent = extent.as_ref().expect("an object on SSD has an extent");
        assert_eq!(extent.offset % 4096, 0, "the bytes start block-aligned");
        let file = std::fs::File::open(&extent.path).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(&file.metadata().unwrap().permissions());
        assert_eq!(
            mode & 0o007,
            0,
            "a region file is private to the node's user and group"
        );
        let mut read = vec![0u8; extent.length_bytes as usize];
        file.read_exact_at(&mut read, extent.offset).unwrap();
        assert_eq!(read, *bytes, "wrong bytes in place for {id:?}");
        assert_eq!(checksum::crc32c(&read), extent.data_crc);
        pins.push(extent.pin);
    }
    assert_eq!(client.unpin_on_ssd(&pins).await.unwrap(), pins.len() as u32);
    assert_eq!(
        client.unpin_on_ssd(&pins).await.unwrap(),
        0,
        "a pin ends once"
    );
}

#[test]
fn spilled_chunks_probe_on_ssd_prefetch_and_load_byte_exact_across_a_node_kill() {
    let (mut cluster, metrics) = start(1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stored = runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let namespace = client.register_namespace(demo_namespace()).await.unwrap();
        let stored = contents(store_all(&client, namespace).await);
        // Evicted chunks are demoted to the SSD pool: READY there once their write is done.
        let probed = probe_until(&client, &stored, "chunks are on SSD", |probed| {
            on_ssd(probed).len() >= 2
        })
        .await;
        // A prefetch starts their restores and returns; a load joins them and hits.
        let wanted: Vec<(ObjectId, Vec<u8>)> = on_ssd(&probed)
            .into_iter()
            .take(2)
            .map(|index| stored[index].clone())
            .collect();
        let ids: Vec<ObjectId> = wanted.iter().map(|(id, _)| *id).collect();
        read_pinned_in_place(&client, &wanted, namespace).await;
        assert_eq!(
            client.prefetch(&ids).await.unwrap(),
            2,
            "two restores start"
        );
        assert_eq!(
            verified_hits(&client, &wanted).await,
            2,
            "prefetched chunks load from memory"
        );
        stored
    });
    let body = scrape_metrics(metrics).unwrap();
    assert!(
        metric_value(&body, "kvtier_ssd_restores_total").unwrap_or(0.0) >= 2.0,
        "{body}"
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
    assert_eq!(
        metric_value(&body, "kvtier_ssd_checksum_failures_total"),
        Some(0.0)
    );

    // SIGKILL: the CPU pool goes with the node; what was spilled stays on its SSD, and the
    // restarted node reports it: the directory knows it is on SSD before any load.
    let spilled = metric_value(&body, "kvtier_ssd_spills_total").unwrap_or(0.0) as usize;
    cluster.kill_node(0).unwrap();
    cluster.restart_node(0).unwrap();
    let hits = runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        client.register_namespace(demo_namespace()).await.unwrap();
        let ids: Vec<ObjectId> = stored.iter().map(|(id, _)| *id).collect();
        let probed = client.probe(&ids).await.unwrap();
        assert!(
            on_ssd(&probed).len() >= spilled.min(stored.len()),
            "the restarted node's SSD objects are on SSD at the directory: {probed:?}, {spilled} spilled"
        );
        verified_hits(&client, &stored).await
    });
    assert!(
        hits >= spilled.min(stored.len()),
        "after the kill every spilled chunk is a hit: {hits} hits, {spilled} spilled"
    );
    cluster.shutdown();
}

#[test]
fn chunks_accessed_once_are_not_spilled() {
    let (cluster, _) = start(2);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let namespace = client.register_namespace(demo_namespace()).await.unwrap();
        let stored = store_all(&client, namespace).await;
        // A store the full pool skipped was tried again: a second access. The first chunks
        // went into an empty pool at the first try: accessed once.
        let once: Vec<(ObjectId, Vec<u8>)> = stored
            .iter()
            .filter(|(_, _, attempts)| *attempts == 1)
            .map(|(id, bytes, _)| (*id, bytes.clone()))
            .collect();
        assert!(once.len() >= 4, "the first four fit at once");
        // Four chunks fit: at least eight were evicted, the oldest (accessed once) first. A
        // demoted one stays a hit until its copy commits, then is on SSD; one accessed once
        // is never admitted there, so it becomes a miss.
        let evicted = OBJECTS as usize - 4;
        let all = contents(stored);
        probe_until(&client, &all, "chunks were evicted", |probed| {
            probed
                .iter()
                .filter(|outcome| !matches!(outcome, ProbeOutcome::Hit { .. }))
                .count()
                >= evicted
        })
        .await;
        let probed = probe_until(&client, &once, "a chunk accessed once left", |probed| {
            probed
                .iter()
                .any(|outcome| !matches!(outcome, ProbeOutcome::Hit { .. }))
        })
        .await;
        assert!(on_ssd(&probed).is_empty(), "{probed:?}");
    });
    cluster.shutdown();
}

#[test]
fn adopted_chunks_dropped_with_their_region_are_no_longer_on_ssd() {
    // Three regions of fifteen chunks. Before the kill, twenty of twenty-four chunks spill:
    // they fill region 0 and part of region 1. After the restart the store writes into
    // region 2; twenty-four spills (twenty-eight once loads push the last four out of CPU)
    // need it to reclaim its oldest region (adopted chunks only) but never region 1, so
    // some adopted chunks survive. The pool (48 chunks, evicted from 90 %) never holds more
    // than about 33 live chunks, so only the store's reclaim can take adopted chunks off
    // the SSD.
    let (mut cluster, metrics) = start_with_ssd(1, 12 << 20);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stored = runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let namespace = client.register_namespace(demo_namespace()).await.unwrap();
        let stored = contents(store_range(&client, namespace, 0..24).await);
        probe_until(
            &client,
            &stored,
            "every chunk not held in CPU is on SSD",
            |probed| {
                probed
                    .iter()
                    .all(|outcome| !matches!(outcome, ProbeOutcome::Miss))
            },
        )
        .await;
        stored
    });
    cluster.kill_node(0).unwrap();
    cluster.restart_node(0).unwrap();
    runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let namespace = client.register_namespace(demo_namespace()).await.unwrap();
        let adopted =
            on_ssd(&probe_until(&client, &stored, "adopted", |p| on_ssd(p).len() >= 16).await);
        let fresh = contents(store_range(&client, namespace, 100..128).await);
        probe_until(
            &client,
            &fresh,
            "every new chunk not held in CPU is on SSD",
            |probed| {
                probed
                    .iter()
                    .all(|outcome| !matches!(outcome, ProbeOutcome::Miss))
            },
        )
        .await;
        let probed = probe_until(
            &client,
            &stored,
            "adopted chunks whose region was reclaimed leave the SSD",
            |probed| on_ssd(probed).len() < adopted.len(),
        )
        .await;
        let body = scrape_metrics(metrics).expect("the node serves metrics");
        let reclaimed = metric_value(&body, "kvtier_ssd_regions_reclaimed_total").unwrap_or(0.0);
        assert!(
            reclaimed >= 1.0,
            "the store reclaimed a region: {reclaimed}"
        );
        // What is still said to be on SSD is there: each loads, byte for byte.
        let still: Vec<(ObjectId, Vec<u8>)> = on_ssd(&probed)
            .into_iter()
            .map(|index| stored[index].clone())
            .collect();
        assert!(!still.is_empty(), "adopted chunks of region 1 survive");
        assert_eq!(
            verified_hits(&client, &still).await,
            still.len(),
            "{}",
            scrape_metrics(metrics).unwrap_or_default()
        );
    });
    cluster.shutdown();
}
