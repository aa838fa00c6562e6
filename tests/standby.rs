//! Standby directories elected through a real etcd server on loopback: a directory and a
//! standby over one etcd, a node and an engine. The leader is killed with SIGKILL: the
//! standby takes over, the node rejoins it and every object stored before is a hit again,
//! byte for byte, from the same engine connection. Then the new leader is stopped (SIGSTOP,
//! cut off as if partitioned) while the first directory, restarted, stands by: it takes
//! over when the stopped one's lease expires, and the stopped one, resumed, exits without
//! answering another request (exit status 75), never leading again under its term.
//! Waits on conditions; deadlines are hang guards only.

mod common;

use common::{connect, object, runtime, signal, store_all, verified_hits};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::model::{ObjectId, PrefixDigest};
use kvtier_tools::launch::etcd::EtcdServer;
use kvtier_tools::launch::{scrape_metrics, ClusterSpec, LocalCluster};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

const CHUNK: usize = 256 << 10;
/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn wait_for_leader(cluster: &LocalCluster, other_than: Option<usize>) -> usize {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        if let Some(index) = cluster.directory_leader(other_than) {
            return index;
        }
        assert!(Instant::now() < deadline, "no directory took the lead");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// READY bytes over every pool, as directory process `index` exports them.
fn ready_bytes(cluster: &LocalCluster, index: usize) -> f64 {
    let Some(body) = cluster
        .directory_process_metrics(index)
        .and_then(|address| scrape_metrics(address).ok())
    else {
        return 0.0;
    };
    body.lines()
        .filter(|line| line.starts_with("kvtier_pool_bytes{") && line.contains("state=\"ready\""))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// After a leader change: waits until the leader `index` holds every object again (the
/// node rejoined it and reported them) and a new store reaches it; returns how long.
async fn rejoined(
    cluster: &LocalCluster,
    index: usize,
    client: &Client,
    objects: &[(ObjectId, Vec<u8>)],
    probe: ObjectId,
) -> Duration {
    let started = Instant::now();
    let bytes = vec![7u8; CHUNK];
    while ready_bytes(cluster, index) < (objects.len() * CHUNK) as f64
        || client.store(probe, &bytes).await.unwrap() != StoreOutcome::Stored
    {
        assert!(
            started.elapsed() < HANG_GUARD,
            "the node never rejoined the new leader"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    until_all_hit(client, objects).await;
    started.elapsed()
}

/// Waits until every object is a verified hit; returns how long that took.
async fn until_all_hit(client: &Client, objects: &[(ObjectId, Vec<u8>)]) -> Duration {
    let started = Instant::now();
    while verified_hits(client, objects).await < objects.len() {
        assert!(started.elapsed() < HANG_GUARD, "the cache never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

#[test]
fn a_standby_takes_over_and_a_deposed_leader_never_serves_again() {
    let folder = tempfile::tempdir().unwrap();
    let etcd = EtcdServer::start(&folder.path().join("etcd")).unwrap();
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        metrics: true,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        etcd: vec![etcd.client_address()],
        standby_directories: 1,
        lease_ttl_s: 2,
        ..ClusterSpec::default()
    };
    let mut cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let first = wait_for_leader(&cluster, None);
    let runtime = runtime();
    let (client, objects) = runtime.block_on(async {
        let (client, namespace) = connect(&cluster, 0).await;
        let objects: Vec<(ObjectId, Vec<u8>)> = (0..8u32)
            .map(|index| object(namespace, index, 5, CHUNK))
            .collect();
        store_all(&client, &objects).await;
        (client, objects)
    });

    // The leader dies: the standby leads once its lease expires, and the node's cache is
    // back under it.
    let killed = Instant::now();
    cluster.kill_directory_process(first).unwrap();
    let second = wait_for_leader(&cluster, Some(first));
    let elected = killed.elapsed();
    let probe = |index: u32| ObjectId {
        namespace: objects[0].0.namespace,
        prefix: PrefixDigest::ROOT.chain(&[index, 6]),
        shard: 0,
        part: 0,
    };
    runtime.block_on(rejoined(&cluster, second, &client, &objects, probe(1)));
    eprintln!(
        "SIGKILL of the leader: standby elected after {elected:?}, the node's cache and stores under it after {:?}",
        killed.elapsed()
    );

    // The killed one comes back as a standby; the leader is cut off (stopped): the standby
    // takes over when the stopped leader's lease expires, and the node follows.
    cluster.start_directory_process(first).unwrap();
    let stopped = cluster.directory_process_pid(second).unwrap();
    signal(&stopped.to_string(), "-STOP");
    let third = wait_for_leader(&cluster, Some(second));
    assert_eq!(third, first);
    runtime.block_on(rejoined(&cluster, third, &client, &objects, probe(2)));
    // Resumed, the deposed leader exits before answering anything.
    signal(&stopped.to_string(), "-CONT");
    let deadline = Instant::now() + HANG_GUARD;
    let status = loop {
        if let Some(status) = cluster.directory_process_exit(second) {
            break status;
        }
        assert!(Instant::now() < deadline, "the deposed leader kept running");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        status.code(),
        Some(75),
        "{status:?} (signal {:?})",
        status.signal()
    );
    // The node stays with the leader and serves.
    runtime.block_on(async {
        assert_eq!(verified_hits(&client, &objects).await, objects.len());
    });
    assert_eq!(cluster.directory_leader(None), Some(first));
}
