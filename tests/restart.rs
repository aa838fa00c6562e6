//! A directory restart keeps the cache: the directory is killed with SIGKILL and started
//! again while two nodes serve engines; the nodes stay up, rejoin the new incarnation and
//! report what they hold, and every object stored before the kill is a hit again, byte
//! for byte, from the same engine connections. While the nodes rejoin, engines get misses
//! and skipped stores, never errors, and while the directory is down they get them at once.
//! Waits on conditions; deadlines are hang guards only.

mod common;

use common::{store_all, verified_hits};
use kvtier_core::client::{Client, StoreOutcome, StoreSkip};
use kvtier_core::directory::ProbeOutcome;
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, NamespaceDescriptor, NamespaceId, ObjectId, PrefixDigest};
use kvtier_tools::launch::{metric_value, wait_for_metrics, ClusterSpec, LocalCluster};
use kvtier_tools::workload::chunk;
use std::path::Path;
use std::time::{Duration, Instant};

const CHUNK: usize = 256 << 10;
/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn object(namespace: NamespaceId, node: u32, index: u32) -> (ObjectId, Vec<u8>) {
    let id = ObjectId {
        namespace,
        prefix: PrefixDigest::ROOT.chain(&[node, index, 11]),
        shard: 0,
        part: 0,
    };
    let mut bytes = vec![0u8; CHUNK];
    chunk::fill(&id, &mut bytes);
    (id, bytes)
}

/// Two nodes whose CPU pools hold four chunks each, the rest of their stores going to one
/// shared pool (nothing evicted), with the given heartbeat timings.
fn two_nodes_sharing_cxl(suspect_after_ms: u64, fence_after_ms: u64) -> ClusterSpec {
    ClusterSpec {
        nodes: 2,
        cpu_pool_bytes: 1 << 20,
        cxl_pool_bytes: 16 << 20,
        cxl_extent_bytes: 2 << 20,
        write_order: vec![Medium::Cpu, Medium::Cxl],
        suspect_after_ms,
        fence_after_ms,
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        ..ClusterSpec::default()
    }
}

/// A client per node, each having stored eight chunks of its own (what each stored).
async fn store_on_each_node(
    cluster: &LocalCluster,
) -> (Vec<Client>, Vec<Vec<(ObjectId, Vec<u8>)>>) {
    let mut clients = Vec::new();
    let mut stored = Vec::new();
    for node in 0..2 {
        let client = Client::connect(&cluster.socket(node).unwrap())
            .await
            .unwrap();
        let namespace = client.register_namespace(demo_namespace()).await.unwrap();
        let objects: Vec<_> = (0..8)
            .map(|index| object(namespace, node as u32, index))
            .collect();
        store_all(&client, &objects).await;
        clients.push(client);
        stored.push(objects);
    }
    (clients, stored)
}

#[test]
fn a_directory_restart_keeps_the_cache_and_the_nodes() {
    a_restart_keeps_the_cache(1);
}

/// The same over a directory of three shards: each shard adopts the replicas of its own
/// objects, lending the others' free budget where its share of a pool is full, and the
/// shared pool's extents are claimed in all of them alike.
#[test]
fn a_directory_of_three_shards_restarted_keeps_the_cache() {
    a_restart_keeps_the_cache(3);
}

fn a_restart_keeps_the_cache(shards: u16) {
    let spec = ClusterSpec {
        directory_shards: shards,
        ..two_nodes_sharing_cxl(3_000, 600_000)
    };
    let mut cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let pids = [cluster.node_pid(0), cluster.node_pid(1)];
    assert!(pids.iter().all(Option::is_some));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (clients, stored) = runtime.block_on(store_on_each_node(&cluster));
    let in_cxl = runtime.block_on(async {
        let ids: Vec<ObjectId> = stored[0].iter().map(|(id, _)| *id).collect();
        let probed = clients[0].probe(&ids).await.unwrap();
        probed
            .iter()
            .filter(|outcome| {
                matches!(
                    outcome,
                    ProbeOutcome::Hit {
                        medium: Medium::Cxl,
                        ..
                    }
                )
            })
            .count()
    });
    assert!(
        in_cxl > 0,
        "some of node-a's objects are in the shared pool"
    );

    cluster.kill_directory().unwrap();
    // While the directory is down the nodes answer misses and skips, never errors.
    runtime.block_on(async {
        let (id, bytes) = object(stored[0][0].0.namespace, 9, 0);
        let outcome = clients[0].store(id, &bytes).await.unwrap();
        assert!(matches!(
            outcome,
            StoreOutcome::Skipped(_) | StoreOutcome::Stored
        ));
    });
    cluster.restart_directory().unwrap();

    runtime.block_on(async {
        let deadline = Instant::now() + HANG_GUARD;
        for (node, client) in clients.iter().enumerate() {
            loop {
                if verified_hits(client, &stored[node]).await == stored[node].len() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {node} did not get its cache back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // The shared pool's replicas are the other node's hits too, as before the restart.
        let shared: Vec<_> = stored[0]
            .iter()
            .filter(|(id, _)| !stored[1].iter().any(|(other, _)| other == id))
            .cloned()
            .collect();
        // (A node answers hits on its delegations across the restart, so its own hits
        // came back before node-a's replicas were adopted again.)
        loop {
            if verified_hits(&clients[1], &shared).await == in_cxl {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node-b never read node-a's shared replicas again"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // New stores work in the new incarnation.
        let (id, bytes) = object(stored[1][0].0.namespace, 7, 1);
        let outcome = clients[1].store(id, &bytes).await.unwrap();
        assert!(matches!(
            outcome,
            StoreOutcome::Stored | StoreOutcome::Skipped(_)
        ));
    });
    assert_eq!(
        [cluster.node_pid(0), cluster.node_pid(1)],
        pids,
        "no node restarted"
    );
}

/// While the directory is down, a node answers at once once it has noticed: a probe is a
/// miss, a store is skipped, a new namespace is registered (under the descriptor's own id),
/// never an error nor a wait for the directory's two-second timeout per call. When the
/// directory is back, the namespace registered meanwhile stores and hits.
#[test]
fn while_the_directory_is_down_engines_get_misses_and_skips_at_once() {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 8 << 20,
        metrics: true,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    let mut cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let metrics = cluster
        .metrics_addresses()
        .into_iter()
        .find(|(name, _)| name != "directory")
        .map(|(_, address)| address)
        .unwrap();
    let reachable = |expected: f64| {
        move |body: &str| metric_value(body, "kvtier_directory_reachable") == Some(expected)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client =
        runtime.block_on(async { Client::connect(&cluster.socket(0).unwrap()).await.unwrap() });
    assert!(wait_for_metrics(metrics, HANG_GUARD, reachable(1.0)));

    cluster.kill_directory().unwrap();
    // The node notices within a heartbeat period and a request's timeout.
    assert!(wait_for_metrics(metrics, HANG_GUARD, reachable(0.0)));
    let fresh = runtime.block_on(async {
        let started = Instant::now();
        let outage = NamespaceDescriptor {
            revision: "registered-in-an-outage".into(),
            ..demo_namespace()
        };
        let fresh = client.register_namespace(outage.clone()).await.unwrap();
        assert_eq!(fresh, outage.id().unwrap(), "the descriptor's own id");
        for index in 0..50 {
            let (id, bytes) = object(fresh, 0, index);
            assert_eq!(client.probe(&[id]).await.unwrap(), vec![ProbeOutcome::Miss]);
            assert_eq!(
                client.store(id, &bytes).await.unwrap(),
                StoreOutcome::Skipped(StoreSkip::DirectoryUnavailable)
            );
        }
        // A hundred calls, each of which waited out the directory's timeout (2 s) before.
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(20),
            "{elapsed:?} for 101 calls"
        );
        fresh
    });

    cluster.restart_directory().unwrap();
    assert!(wait_for_metrics(metrics, HANG_GUARD, reachable(1.0)));
    runtime.block_on(async {
        let stored = object(fresh, 0, 99);
        let deadline = Instant::now() + HANG_GUARD;
        while client.store(stored.0, &stored.1).await.unwrap() != StoreOutcome::Stored {
            assert!(
                Instant::now() < deadline,
                "the outage's namespace never stored"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(verified_hits(&client, &[stored]).await, 1);
    });
}

/// The directory forgets a namespace no replica names when its table is full; a node whose
/// engine still uses it hears `UnknownNamespace`, answers a skipped store, and registers it
/// again, so the engine's next store is stored.
#[test]
fn a_namespace_the_directory_forgot_is_registered_again_by_the_node() {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 8 << 20,
        namespaces_max: Some(2),
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let revision = |revision: &str| NamespaceDescriptor {
            revision: revision.into(),
            ..demo_namespace()
        };
        let first = client.register_namespace(revision("first")).await.unwrap();
        // Two more, none holding anything: the first is forgotten to make room.
        for other in ["second", "third"] {
            client.register_namespace(revision(other)).await.unwrap();
        }
        let stored = object(first, 0, 0);
        let deadline = Instant::now() + HANG_GUARD;
        let mut skipped = 0;
        loop {
            match client.store(stored.0, &stored.1).await.unwrap() {
                StoreOutcome::Stored => break,
                StoreOutcome::Skipped(StoreSkip::DirectoryUnavailable) => skipped += 1,
                other => panic!("stored as {other:?}"),
            }
            assert!(
                Instant::now() < deadline,
                "the forgotten namespace never stored"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(skipped >= 1, "the directory did not forget the namespace");
        assert_eq!(verified_hits(&client, &[stored]).await, 1);
    });
}

/// A directory outage far past the nodes' fence window, with no standby: each node gives
/// up its session at its fence window and waits; when the directory is back (a new
/// incarnation, which cannot have granted their extents on) each keeps every shared extent
/// whose owner word still names it, so every replica in the shared pool is found again,
/// by both nodes. `KVTIER_TEST_OUTAGE_S` lengthens the outage past the fence window (the
/// issue's figure is 60 s); by default the directory returns as soon as both nodes gave up.
#[test]
fn an_outage_past_the_fence_window_keeps_every_cxl_replica() {
    let spec = ClusterSpec {
        metrics: true,
        ..two_nodes_sharing_cxl(300, 1_000)
    };
    let mut cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let nodes: Vec<_> = cluster
        .metrics_addresses()
        .into_iter()
        .filter(|(name, _)| name != "directory")
        .map(|(_, address)| address)
        .collect();
    assert_eq!(nodes.len(), 2);
    let runtime = common::runtime();
    let (clients, stored) = runtime.block_on(store_on_each_node(&cluster));
    let in_cxl = |client: &Client, objects: &[(ObjectId, Vec<u8>)]| {
        let ids: Vec<ObjectId> = objects.iter().map(|(id, _)| *id).collect();
        let probed = runtime.block_on(client.probe(&ids)).unwrap();
        objects
            .iter()
            .zip(probed)
            .filter(|(_, outcome)| {
                matches!(
                    outcome,
                    ProbeOutcome::Hit {
                        medium: Medium::Cxl,
                        ..
                    }
                )
            })
            .map(|(object, _)| object.clone())
            .collect::<Vec<_>>()
    };
    let shared: Vec<_> = [
        in_cxl(&clients[0], &stored[0]),
        in_cxl(&clients[1], &stored[1]),
    ]
    .concat();
    assert!(shared.len() >= 4, "both nodes wrote into the shared pool");

    cluster.kill_directory().unwrap();
    let gave_up = |body: &str| {
        metric_value(body, "kvtier_node_rejoins_total{cause=\"silence\"}").is_some_and(|n| n >= 1.0)
    };
    for address in &nodes {
        assert!(
            wait_for_metrics(*address, HANG_GUARD, gave_up),
            "a node never noticed its fence window pass"
        );
    }
    let outage = std::env::var("KVTIER_TEST_OUTAGE_S")
        .ok()
        .and_then(|seconds| seconds.parse().ok())
        .map_or(Duration::ZERO, Duration::from_secs);
    // The scenario's length, not a wait for a condition.
    std::thread::sleep(outage);
    cluster.restart_directory().unwrap();

    let rejoined = |body: &str| {
        metric_value(body, "kvtier_directory_reachable") == Some(1.0)
            && metric_value(body, "kvtier_node_rejoin_extents_total{outcome=\"kept\"}")
                .is_some_and(|kept| kept >= 1.0)
    };
    for address in &nodes {
        assert!(
            wait_for_metrics(*address, HANG_GUARD, rejoined),
            "a node did not rejoin with its extents"
        );
        let body = kvtier_tools::launch::scrape_metrics(*address).unwrap();
        assert_eq!(
            metric_value(&body, "kvtier_node_rejoin_extents_total{outcome=\"lost\"}"),
            Some(0.0),
            "no extent lost"
        );
    }
    runtime.block_on(async {
        let deadline = Instant::now() + HANG_GUARD;
        for (node, client) in clients.iter().enumerate() {
            // Every replica, the shared ones of both nodes too, byte for byte, from the
            // engine connections opened before the outage.
            let mut wanted = stored[node].clone();
            let others: Vec<_> = shared
                .iter()
                .filter(|object| !stored[node].contains(object))
                .cloned()
                .collect();
            wanted.extend(others);
            while verified_hits(client, &wanted).await < wanted.len() {
                assert!(
                    Instant::now() < deadline,
                    "node {node} did not find every replica again"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
}
