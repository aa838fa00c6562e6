//! Replication on demand end to end: two node processes map one shared file (an emulated
//! CXL device); node A stores into its private CPU pool, node B's load misses, and the
//! directory has A copy the object into the shared pool, where B then reads it. A retire
//! of the source or the death of A while the copy is under way leaves no READY partial
//! replica and frees the reservation. Each test runs twice: with both nodes on loopback, and
//! with each node in a network namespace of its own (separate hosts mapping one device;
//! skipped, saying why, where this process cannot make namespaces). Every wait is on a
//! condition; a deadline is a hang guard only ([`HANG_GUARD`]).

#[macro_use]
mod common;

use common::{connect, object, runtime, signal};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::{AcquireMode, RetireOutcome};
use kvtier_core::model::{Medium, ObjectId};
use kvtier_tools::launch::{
    metric_value, scrape_metrics, wait_for_metrics, ClusterSpec, LocalCluster,
};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(120);

on_loopback_and_between_hosts!(
    a_remote_miss_replicates_into_shared_memory_and_the_source_stays,
    retiring_the_source_while_it_is_copied_cancels_the_copy,
    killing_the_source_mid_copy_cancels_it_and_frees_the_reservation
);

/// Two nodes that store into their CPU pools first and both map one CXL pool, in network
/// namespaces of their own when `netns`.
fn cluster(netns: bool, pool_bytes: u64, extent_bytes: u64) -> LocalCluster {
    let spec = ClusterSpec {
        netns,
        nodes: 2,
        cpu_pool_bytes: pool_bytes,
        cxl_pool_bytes: pool_bytes,
        cxl_extent_bytes: extent_bytes,
        write_order: vec![Medium::Cpu],
        suspect_after_ms: 1_500,
        fence_after_ms: 3_000,
        // Eviction off: nothing but replication moves bytes here.
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        // Recomputing is priced high, so every copy pays whatever the start-up probe of a
        // loaded machine measured of the pools.
        extra_toml:
            "\n[directory.limits.prefill_us_per_token_by_model]\n\"kvtier-demo\" = 1000000.0\n"
                .into(),
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    assert_eq!(cluster.uses_namespaces(), netns);
    cluster
}

/// The medium `client` loads `object` from and its bytes, or `None` on a miss.
async fn load(client: &Client, object: ObjectId) -> Option<(Medium, Vec<u8>)> {
    let views = client.load(&[object], AcquireMode::Each).await.unwrap();
    let view = views[0].as_ref()?;
    Some((view.lease().medium, view.bytes().unwrap().to_vec()))
}

fn directory_metrics(cluster: &LocalCluster) -> SocketAddr {
    cluster
        .config
        .directory
        .metrics
        .expect("the test cluster serves metrics")
}

/// A counter of the directory's metrics (0 when absent).
fn counter(address: SocketAddr, name: &str) -> f64 {
    let body = scrape_metrics(address).expect("the directory serves metrics");
    metric_value(&body, name).unwrap_or(0.0)
}

/// Waits until the directory has planned `planned` replications, each completed or
/// cancelled, with none in flight and no CXL bytes reserved.
fn wait_settled(address: SocketAddr, planned: f64) {
    let value = |body: &str, result: &str| {
        metric_value(
            body,
            &format!("kvtier_replications_total{{result=\"{result}\"}}"),
        )
    };
    assert!(
        wait_for_metrics(address, HANG_GUARD, |body| {
            value(body, "planned") == Some(planned)
                && value(body, "completed")
                    .zip(value(body, "cancelled"))
                    .is_some_and(|(completed, cancelled)| completed + cancelled == planned)
                && metric_value(body, "kvtier_replications_in_flight") == Some(0.0)
                && metric_value(
                    body,
                    "kvtier_medium_bytes{medium=\"cxl\",state=\"reserved\"}",
                ) == Some(0.0)
        }),
        "replication {planned} never settled or its reservation was never freed"
    );
}

fn a_remote_miss_replicates_into_shared_memory_and_the_source_stays(netns: bool) {
    let cluster = cluster(netns, 64 << 20, 16 << 20);
    runtime().block_on(async {
        let (a, namespace) = connect(&cluster, 0).await;
        let (b, _) = connect(&cluster, 1).await;
        let (id, bytes) = object(namespace, 1, 12, MIB);
        assert_eq!(a.store(id, &bytes).await.unwrap(), StoreOutcome::Stored);
        // The forward path never waits: B misses at once.
        assert!(load(&b, id).await.is_none(), "B read A's private CPU pool");
        let deadline = Instant::now() + HANG_GUARD;
        let (medium, copy) = loop {
            if let Some(found) = load(&b, id).await {
                break found;
            }
            assert!(Instant::now() < deadline, "the object was never replicated");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(medium, Medium::Cxl);
        assert_eq!(copy, bytes, "the replica differs from what A stored");
        // A copy, not a move: A still reads its own CPU replica.
        assert_eq!(load(&a, id).await, Some((Medium::Cpu, bytes)));
    });
    let metrics = directory_metrics(&cluster);
    assert!(
        wait_for_metrics(metrics, HANG_GUARD, |body| {
            metric_value(body, "kvtier_replications_total{result=\"completed\"}") == Some(1.0)
                && metric_value(body, "kvtier_replication_miss_to_ready_seconds_count") == Some(1.0)
                && metric_value(body, "kvtier_replication_bytes_total") == Some(MIB as f64)
        }),
        "the completed replication is not in the directory's metrics"
    );
}

fn retiring_the_source_while_it_is_copied_cancels_the_copy(netns: bool) {
    /// Objects tried: the retire must reach the directory before A, woken by the task the
    /// moment it is planned, commits its copy, at least once. It follows B's miss at once,
    /// but a 1 MiB copy takes about a millisecond: six runs here won at attempts 0 to 17
    /// (between hosts), and a run beside other tests on two cores once lost 20.
    const ATTEMPTS: u32 = 60;
    let cluster = cluster(netns, 64 << 20, 16 << 20);
    let metrics = directory_metrics(&cluster);
    runtime().block_on(async {
        let (a, namespace) = connect(&cluster, 0).await;
        let (b, _) = connect(&cluster, 1).await;
        for index in 0..ATTEMPTS {
            let (id, bytes) = object(namespace, 100 + index, 12, MIB);
            assert_eq!(a.store(id, &bytes).await.unwrap(), StoreOutcome::Stored);
            let replica = {
                let views = a.load(&[id], AcquireMode::Each).await.unwrap();
                views[0].as_ref().unwrap().lease().replica
            };
            let cancelled = counter(metrics, "kvtier_replications_total{result=\"cancelled\"}");
            assert!(load(&b, id).await.is_none());
            assert_eq!(
                a.retire(id, replica).await.unwrap(),
                RetireOutcome::Reclaimable
            );
            wait_settled(metrics, f64::from(index + 1));
            let now_cancelled = counter(metrics, "kvtier_replications_total{result=\"cancelled\"}");
            match load(&b, id).await {
                // The copy was committed before the retire: it is whole.
                Some((medium, copy)) => {
                    assert_eq!(medium, Medium::Cxl);
                    assert_eq!(copy, bytes, "a replica READY with other bytes");
                    assert_eq!(now_cancelled, cancelled);
                }
                None => {
                    assert_eq!(
                        now_cancelled,
                        cancelled + 1.0,
                        "a miss, but nothing cancelled"
                    );
                    println!("attempt {index}: the retire cancelled the copy");
                    return;
                }
            }
        }
        panic!("no retire ever reached a copy in flight in {ATTEMPTS} attempts");
    });
}

fn killing_the_source_mid_copy_cancels_it_and_frees_the_reservation(netns: bool) {
    /// Large enough that the chunked copy takes tens of milliseconds.
    const OBJECT_BYTES: usize = 64 * MIB;
    let mut cluster = cluster(netns, 128 << 20, 64 << 20);
    let metrics = directory_metrics(&cluster);
    let a_pid = cluster.node_pid(0).unwrap().to_string();
    let runtime = runtime();
    let id = runtime.block_on(async {
        let (a, namespace) = connect(&cluster, 0).await;
        let (b, _) = connect(&cluster, 1).await;
        let (id, bytes) = object(namespace, 7, 12, OBJECT_BYTES);
        assert_eq!(a.store(id, &bytes).await.unwrap(), StoreOutcome::Stored);
        // Freeze A first (it stays live to the directory for `suspect_after_ms`): B's miss
        // plans the copy (its target reserved), which A, woken at once otherwise and done
        // in milliseconds, cannot run or commit.
        signal(&a_pid, "-STOP");
        assert!(load(&b, id).await.is_none());
        id
    });
    assert!(
        wait_for_metrics(metrics, HANG_GUARD, |body| {
            metric_value(body, "kvtier_replications_in_flight") == Some(1.0)
        }),
        "the copy was never under way"
    );
    assert_eq!(
        counter(metrics, "kvtier_replications_total{result=\"completed\"}"),
        0.0,
        "the copy ended before A was stopped"
    );
    cluster.kill_node(0).unwrap();
    assert!(
        wait_for_metrics(metrics, HANG_GUARD, |body| {
            body.contains("kvtier_sessions{state=\"fenced\"} 1")
        }),
        "the killed source was never fenced"
    );
    // Settled: nothing in flight and no CXL bytes reserved.
    wait_settled(metrics, 1.0);
    assert_eq!(
        counter(metrics, "kvtier_replications_total{result=\"cancelled\"}"),
        1.0
    );
    assert_eq!(
        counter(metrics, "kvtier_replications_total{result=\"completed\"}"),
        0.0
    );
    runtime.block_on(async {
        let (b, _) = connect(&cluster, 1).await;
        assert!(load(&b, id).await.is_none(), "a READY partial replica");
    });
}
