//! Replication between hosts over QUIC, end to end with real processes: two nodes that
//! share no CXL domain, each with a peer endpoint. Each test runs twice: with both nodes on
//! loopback, and with each node in a network namespace of its own (separate hosts joined by
//! a bridge; skipped, saying why, where this process cannot make namespaces). Every wait is
//! on a condition; a deadline is a hang guard only ([`HANG_GUARD`]).

#[macro_use]
mod common;

use common::{connect, metrics_of, object, runtime, scraped, signal};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::{AcquireMode, RetireOutcome};
use kvtier_core::model::{Medium, ObjectId};
use kvtier_core::node::transfers::PEER_REFUSALS_BURST;
use kvtier_core::wire::peer::{self, TransferHeader, Verdict};
use kvtier_tools::launch::{metric_value, scrape_metrics, ClusterSpec, LocalCluster, BENCH_PEER};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(120);

on_loopback_and_between_hosts!(
    a_miss_is_copied_over_quic_and_strangers_cannot_push,
    a_node_not_named_for_a_pending_transfer_cannot_push_it,
    killing_the_sender_mid_copy_leaves_no_ready_replica_and_frees_the_target,
    killing_the_receiver_mid_copy_cancels_it_and_frees_the_reservation,
    retiring_the_source_mid_copy_cancels_it_and_commits_nothing
);

/// Two nodes with no shared domain and a peer endpoint each, in network namespaces of
/// their own when `netns`.
fn spec(netns: bool, cpu_pool_bytes: u64) -> ClusterSpec {
    ClusterSpec {
        netns,
        nodes: 2,
        cpu_pool_bytes,
        cxl_pool_bytes: 0,
        peer_datagram_bytes: 16_000,
        // Eviction off: the objects must stay where they are stored.
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        suspect_after_ms: 3_000,
        fence_after_ms: 6_000,
        // Recomputing is priced high, so even the large object's copy pays.
        extra_toml:
            "\n[directory.limits.prefill_us_per_token_by_model]\n\"kvtier-demo\" = 1000000.0\n"
                .into(),
        ..ClusterSpec::default()
    }
}

/// A running [`spec`].
fn cluster(netns: bool, cpu_pool_bytes: u64) -> LocalCluster {
    let spec = spec(netns, cpu_pool_bytes);
    let cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    assert_eq!(cluster.uses_namespaces(), netns);
    cluster
}

/// Bytes allocated in every pool of a node, as its last task round published them.
fn allocated_bytes(address: SocketAddr) -> f64 {
    let body = scrape_metrics(address).unwrap();
    body.lines()
        .filter(|line| line.starts_with("kvtier_pool_bytes{") && line.contains("allocated"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Loads `id` on `client` until it hits (polling, hang guard), and returns its medium and
/// Clients of node A and node B, and object `index` of `bytes` bytes, stored by A (into its
/// CPU pool) and returned with its content.
async fn stored_on_a(
    cluster: &LocalCluster,
    index: u32,
    bytes: usize,
) -> (Client, Client, ObjectId, Vec<u8>) {
    let (a, namespace) = connect(cluster, 0).await;
    let (b, _) = connect(cluster, 1).await;
    let (id, content) = object(namespace, index, 11, bytes);
    assert_eq!(a.store(id, &content).await.unwrap(), StoreOutcome::Stored);
    (a, b, id, content)
}

/// The directory's counter of replications that ended as `result`.
fn result(result: &str) -> String {
    format!("kvtier_replications_total{{result=\"{result}\"}}")
}

/// whether its bytes are `expected`.
async fn load_until_hit(client: &Client, id: ObjectId, expected: &[u8]) -> (Medium, bool) {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let views = client.load(&[id], AcquireMode::Each).await.unwrap();
        if let Some(view) = &views[0] {
            return (view.lease().medium, view.bytes().unwrap() == expected);
        }
        assert!(Instant::now() < deadline, "the copy never became READY");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn a_miss_is_copied_over_quic_and_strangers_cannot_push(netns: bool) {
    let cluster = cluster(netns, 64 << 20);
    let node_b = metrics_of(&cluster, "node-b");
    runtime().block_on(async {
        let (_a, b, id, bytes) = stored_on_a(&cluster, 1, 4 << 20).await;
        let first = b.load(&[id], AcquireMode::Each).await.unwrap();
        assert!(first[0].is_none(), "B cannot map A's CPU pool: a miss");
        drop(first);
        let (medium, exact) = load_until_hit(&b, id, &bytes).await;
        assert_eq!(medium, Medium::Cpu, "the copy is in B's own CPU pool");
        assert!(exact, "the copy is byte-exact");
        assert!(
            scraped(
                node_b,
                "kvtier_peer_transfers_total{result=\"committed\",side=\"received\"}"
            ) >= 1.0
        );

        // The copy's pages show in B's metrics once its next task round publishes them.
        let deadline = Instant::now() + HANG_GUARD;
        while allocated_bytes(node_b) < bytes.len() as f64 {
            assert!(Instant::now() < deadline, "the copy's pages never showed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A process with a cluster certificate that no task names pushes into B.
        let allocated_before = allocated_bytes(node_b);
        let refused_before = scraped(
            node_b,
            "kvtier_peer_refusals_total{reason=\"not_expected\"}",
        );
        let verdict = stranger_push(&cluster, "node-b").await;
        assert_eq!(verdict, Verdict::NotExpected);
        let refused = scraped(
            node_b,
            "kvtier_peer_refusals_total{reason=\"not_expected\"}",
        );
        assert_eq!(refused, refused_before + 1.0, "the refusal is counted");
        // One connection that keeps guessing is cut off within its refusal budget.
        let answered = pushes_until_closed(&cluster, "node-b", 4 * PEER_REFUSALS_BURST).await;
        assert!(
            answered <= PEER_REFUSALS_BURST as usize + 64,
            "{answered} refusals answered on one connection"
        );
        // A retired certificate is refused by the peer endpoint as by the directory.
        let certs = &cluster.config.directory.certs;
        assert!(kvtier_core::wire::certs::retire_certificate(certs, BENCH_PEER).unwrap());
        assert_eq!(
            pushes_until_closed(&cluster, "node-b", 1).await,
            0,
            "a retired certificate was answered"
        );
        assert_eq!(
            allocated_bytes(node_b),
            allocated_before,
            "B's pool is unchanged"
        );
    });
}

fn a_node_not_named_for_a_pending_transfer_cannot_push_it(netns: bool) {
    let cluster = cluster(netns, 64 << 20);
    let node_b = metrics_of(&cluster, "node-b");
    let a_pid = cluster.node_pid(0).unwrap().to_string();
    let wrong_sender = "kvtier_peer_refusals_total{reason=\"wrong_sender\"}";
    let wrong_token = "kvtier_peer_refusals_total{reason=\"wrong_token\"}";
    runtime().block_on(async {
        let (_a, b, id, bytes) = stored_on_a(&cluster, 3, 1 << 20).await;
        // A stays live to the directory (well within `suspect_after_ms`) but never pushes:
        // B expects the transfer from A for as long as the test needs.
        signal(&a_pid, "-STOP");
        let allocated_before = allocated_bytes(node_b);
        assert!(b.load(&[id], AcquireMode::Each).await.unwrap()[0].is_none());
        // The target's replica id is the directory's: one of the first few slots. Push to
        // each until B, once it recorded its half, counts one as not named for us.
        let deadline = Instant::now() + HANG_GUARD;
        let verdicts = loop {
            let verdicts = stranger_pushes(&cluster, "node-b", 0..16).await;
            if scraped(node_b, wrong_sender) >= 1.0 {
                break verdicts;
            }
            assert!(Instant::now() < deadline, "B never expected the transfer");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // With the named sender's own certificate (a stolen key, or a stale process of
        // A's), the stream still lacks the token the directory gave A: refused alike.
        let as_a = pushes_as(&cluster, "node-a", "node-b", 0..16).await;
        assert!(
            as_a.iter().all(|verdict| *verdict == Verdict::NotExpected),
            "the named sender's certificate without the token claimed a transfer: {as_a:?}"
        );
        assert_eq!(scraped(node_b, wrong_token), 1.0, "the refusal is counted");
        // The pending target is answered as every other: a wrong sender cannot tell which
        // replica ids are expected.
        assert!(
            verdicts
                .iter()
                .all(|verdict| *verdict == Verdict::NotExpected),
            "the answers single out the pending target: {verdicts:?}"
        );
        assert_eq!(scraped(node_b, wrong_sender), 1.0, "the refusal is counted");
        assert_eq!(
            allocated_bytes(node_b),
            allocated_before,
            "B's pool is unchanged"
        );
        // Only now may A run again: its push would fill B's target.
        signal(&a_pid, "-CONT");
        // The named sender still delivers it.
        let (medium, exact) = load_until_hit(&b, id, &bytes).await;
        assert_eq!((medium, exact), (Medium::Cpu, true));
    });
}

/// Pushes 64 KiB for a target nobody expects into node `to`, as the benchmarks' peer
/// certificate (a cluster member no task names); returns the receiver's verdict.
async fn stranger_push(cluster: &LocalCluster, to: &str) -> Verdict {
    stranger_pushes(cluster, to, 1..2).await[0]
}

/// Pushes 64 KiB for each target of `targets` into node `to` as [`stranger_push`] does;
/// returns the receiver's verdicts in order.
async fn stranger_pushes(
    cluster: &LocalCluster,
    to: &str,
    targets: std::ops::Range<u64>,
) -> Vec<Verdict> {
    pushes_as(cluster, BENCH_PEER, to, targets).await
}

/// Pushes 64 KiB for each target of `targets` into node `to` with the certificate of `name`
/// and a token of zero; returns the receiver's verdicts in order.
async fn pushes_as(
    cluster: &LocalCluster,
    name: &str,
    to: &str,
    targets: std::ops::Range<u64>,
) -> Vec<Verdict> {
    let certs = &cluster.config.directory.certs;
    let address = cluster.config.node(to).unwrap().peer_listen.unwrap();
    let bind = SocketAddr::from(([0, 0, 0, 0], 0));
    let endpoint = peer::endpoint(bind, None, peer::DATAGRAM_BYTES_SAFE).unwrap();
    let config = peer::client_config(certs, name, peer::DATAGRAM_BYTES_SAFE).unwrap();
    let connection = kvtier_core::wire::quic::connect(&endpoint, address, to, config)
        .await
        .unwrap();
    let mut verdicts = Vec::new();
    for target in targets {
        let (mut send, mut receive) = connection.open_bi().await.unwrap();
        let header = TransferHeader {
            task: 1,
            target_replica: target,
            token: 0,
            length_bytes: 64 << 10,
        };
        send.write_all(&header.encode()).await.unwrap();
        verdicts.push(peer::read_verdict(&mut receive).await.unwrap());
    }
    connection.close(0u32.into(), b"done");
    verdicts
}

/// Pushes for targets nobody expects into node `to` on one connection, up to `attempts`,
/// until the receiver closes it; returns how many verdicts it answered.
async fn pushes_until_closed(cluster: &LocalCluster, to: &str, attempts: u32) -> usize {
    let certs = &cluster.config.directory.certs;
    let address = cluster.config.node(to).unwrap().peer_listen.unwrap();
    let bind = SocketAddr::from(([0, 0, 0, 0], 0));
    let endpoint = peer::endpoint(bind, None, peer::DATAGRAM_BYTES_SAFE).unwrap();
    let config = peer::client_config(certs, BENCH_PEER, peer::DATAGRAM_BYTES_SAFE).unwrap();
    let Ok(connection) = kvtier_core::wire::quic::connect(&endpoint, address, to, config).await
    else {
        return 0;
    };
    let mut answered = 0;
    for target in 0..u64::from(attempts) {
        let Ok((mut send, mut receive)) = connection.open_bi().await else {
            break;
        };
        let header = TransferHeader {
            task: 1,
            target_replica: 1_000_000 + target,
            token: 0,
            length_bytes: 64 << 10,
        };
        if send.write_all(&header.encode()).await.is_err() {
            break;
        }
        match peer::read_verdict(&mut receive).await {
            Ok(_) => answered += 1,
            Err(_) => break,
        }
    }
    answered
}

fn killing_the_sender_mid_copy_leaves_no_ready_replica_and_frees_the_target(netns: bool) {
    const OBJECT_BYTES: usize = 192 << 20;
    let mut cluster = cluster(netns, 256 << 20);
    let (node_b, directory) = (
        metrics_of(&cluster, "node-b"),
        metrics_of(&cluster, "directory"),
    );
    let completed = "kvtier_replications_total{result=\"completed\"}";
    runtime().block_on(async {
        let (_a, b, id, bytes) = stored_on_a(&cluster, 2, OBJECT_BYTES).await;
        drop(bytes);
        assert!(b.load(&[id], AcquireMode::Each).await.unwrap()[0].is_none());
        // B allocates the target when A's stream arrives: kill A while it streams.
        let deadline = Instant::now() + HANG_GUARD;
        while allocated_bytes(node_b) < OBJECT_BYTES as f64 {
            assert!(Instant::now() < deadline, "the copy never started");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        cluster.kill_node(0).unwrap();
        assert_eq!(
            scraped(directory, completed),
            0.0,
            "killed before the copy finished"
        );
        // B's stream fails (idle timeout), it frees the target and aborts it.
        let deadline = Instant::now() + HANG_GUARD;
        while allocated_bytes(node_b) > 0.0 {
            assert!(Instant::now() < deadline, "the target was never freed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(b.load(&[id], AcquireMode::Each).await.unwrap()[0].is_none());
        assert_eq!(
            scraped(directory, completed),
            0.0,
            "no partial copy became READY"
        );
        assert!(
            scraped(
                node_b,
                "kvtier_peer_transfers_total{result=\"failed\",side=\"received\"}"
            ) >= 1.0
        );
    });
}

fn killing_the_receiver_mid_copy_cancels_it_and_frees_the_reservation(netns: bool) {
    const OBJECT_BYTES: usize = 192 << 20;
    let mut cluster = cluster(netns, 256 << 20);
    let (node_b, directory) = (
        metrics_of(&cluster, "node-b"),
        metrics_of(&cluster, "directory"),
    );
    runtime().block_on(async {
        let (a, b, id, bytes) = stored_on_a(&cluster, 4, OBJECT_BYTES).await;
        assert!(b.load(&[id], AcquireMode::Each).await.unwrap()[0].is_none());
        // B allocates the target when A's stream arrives: kill B while it receives.
        let deadline = Instant::now() + HANG_GUARD;
        while allocated_bytes(node_b) < OBJECT_BYTES as f64 {
            assert!(Instant::now() < deadline, "the copy never started");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        cluster.kill_node(1).unwrap();
        assert_eq!(
            scraped(directory, &result("completed")),
            0.0,
            "killed before the copy finished"
        );
        // The directory fences B, cancels the copy and frees its reservation.
        let deadline = Instant::now() + HANG_GUARD;
        while scraped(directory, &result("cancelled")) < 1.0
            || scraped(directory, "kvtier_replications_in_flight") > 0.0
            || metric_value(
                &scrape_metrics(directory).unwrap(),
                "kvtier_medium_bytes{medium=\"cpu\",state=\"reserved\"}",
            ) != Some(0.0)
        {
            assert!(Instant::now() < deadline, "the copy was never cancelled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(scraped(directory, &result("cancelled")), 1.0);
        assert_eq!(
            scraped(directory, &result("completed")),
            0.0,
            "no partial copy became READY"
        );
        // The source stays.
        let views = a.load(&[id], AcquireMode::Each).await.unwrap();
        let view = views[0].as_ref().expect("A's replica is gone");
        assert_eq!(view.lease().medium, Medium::Cpu);
        assert!(view.bytes().unwrap() == bytes.as_slice());
    });
}

fn retiring_the_source_mid_copy_cancels_it_and_commits_nothing(netns: bool) {
    const OBJECT_BYTES: usize = 192 << 20;
    let cluster = cluster(netns, 256 << 20);
    let (node_b, directory) = (
        metrics_of(&cluster, "node-b"),
        metrics_of(&cluster, "directory"),
    );
    runtime().block_on(async {
        let (a, b, id, bytes) = stored_on_a(&cluster, 5, OBJECT_BYTES).await;
        drop(bytes);
        let replica = {
            let views = a.load(&[id], AcquireMode::Each).await.unwrap();
            views[0].as_ref().unwrap().lease().replica
        };
        assert!(b.load(&[id], AcquireMode::Each).await.unwrap()[0].is_none());
        // B allocates the target when A's stream arrives: retire the source while it streams.
        let deadline = Instant::now() + HANG_GUARD;
        while allocated_bytes(node_b) < OBJECT_BYTES as f64 {
            assert!(Instant::now() < deadline, "the copy never started");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(
            a.retire(id, replica).await.unwrap(),
            RetireOutcome::Reclaimable
        );
        let deadline = Instant::now() + HANG_GUARD;
        while scraped(directory, &result("cancelled")) < 1.0
            || scraped(directory, "kvtier_replications_in_flight") > 0.0
            || allocated_bytes(node_b) > 0.0
        {
            assert!(Instant::now() < deadline, "the copy was never cancelled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(scraped(directory, &result("completed")), 0.0);
        assert!(b.load(&[id], AcquireMode::Each).await.unwrap()[0].is_none());
    });
}

/// A node that a reload added after the running nodes read `cluster.toml` gets copies from
/// them: the sender finds its peer address in the directory's node list. Loopback only
/// (a cluster of namespaces adds no nodes).
#[test]
fn a_node_added_by_a_reload_receives_copies_from_the_running_nodes() {
    let exe = Path::new(env!("CARGO_BIN_EXE_kvtier"));
    let spec = ClusterSpec {
        spare_nodes: 1,
        ..spec(false, 64 << 20)
    };
    let mut cluster = LocalCluster::start(exe, &spec).unwrap();
    let added = cluster.add_node().unwrap();
    let reload = std::process::Command::new(exe)
        .args(["ctl", "reload", "--config"])
        .arg(&cluster.config_path)
        .output()
        .unwrap();
    assert!(reload.status.success(), "{reload:?}");
    cluster.start_node(added).unwrap();
    runtime().block_on(async {
        let (a, namespace) = connect(&cluster, 0).await;
        let (c, _) = connect(&cluster, added).await;
        let (id, bytes) = object(namespace, 6, 11, 1 << 20);
        assert_eq!(a.store(id, &bytes).await.unwrap(), StoreOutcome::Stored);
        assert!(c.load(&[id], AcquireMode::Each).await.unwrap()[0].is_none());
        let (medium, exact) = load_until_hit(&c, id, &bytes).await;
        assert_eq!(
            (medium, exact),
            (Medium::Cpu, true),
            "copied from A into C's pool"
        );
    });
}
