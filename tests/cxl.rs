//! CXL pools end to end: two node processes map one shared file (an emulated multi-headed
//! CXL device) and share a KV cache through it without copying bytes over the network.
//! Every wait is on a condition; a deadline is a hang guard only ([`HANG_GUARD`]).

use kvtier_core::client::{Client, StoreOutcome, StoreSkip};
use kvtier_core::directory::{AcquireMode, ProbeOutcome, RetireOutcome};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, NamespaceId, ObjectId, PrefixDigest};
use kvtier_tools::launch::{
    metric_value, network_namespaces_unavailable, wait_for_metrics, ClusterSpec, LocalCluster,
};
use kvtier_tools::workload::chunk;
use std::path::Path;
use std::time::{Duration, Instant};

const CHUNK: usize = 1 << 20;
/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Two nodes mapping one 8 MiB CXL pool. With `netns`, each node is a separate host on the
/// network (a namespace of its own, which must be available) that maps the same CXL file;
/// otherwise all share loopback.
fn cluster(
    netns: bool,
    write_order: Vec<Medium>,
    cpu_pool_bytes: u64,
    cxl_pool_bytes: u64,
) -> LocalCluster {
    let spec = ClusterSpec {
        netns,
        nodes: 2,
        cpu_pool_bytes,
        cxl_pool_bytes,
        cxl_extent_bytes: 4 << 20,
        write_order,
        // A stalled live node (a loaded machine) is not taken for a dead one: suspect
        // after 3 s of silence, fenced after 6 s.
        suspect_after_ms: 3_000,
        fence_after_ms: 6_000,
        // Eviction off: these tests fill pools on purpose.
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        ..ClusterSpec::default()
    };
    LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap()
}

fn object(namespace: NamespaceId, index: u32) -> (ObjectId, Vec<u8>) {
    let prefix = PrefixDigest::ROOT.chain(&[index, 7]);
    let id = ObjectId {
        namespace,
        prefix,
        shard: 0,
        part: 0,
    };
    let mut bytes = vec![0u8; CHUNK];
    chunk::fill(&id, &mut bytes);
    (id, bytes)
}

async fn connect(cluster: &LocalCluster, index: usize) -> (Client, NamespaceId) {
    let client = Client::connect(&cluster.socket(index).unwrap())
        .await
        .unwrap();
    let namespace = client.register_namespace(demo_namespace()).await.unwrap();
    (client, namespace)
}

async fn medium_of(client: &Client, object: ObjectId) -> Option<Medium> {
    let views = client.load(&[object], AcquireMode::Each).await.unwrap();
    views[0].as_ref().map(|view| view.lease().medium)
}

#[test]
fn nodes_share_cxl_fill_cpu_first_and_skip_when_full() {
    let cluster = cluster(false, vec![Medium::Cpu, Medium::Cxl], 2 << 20, 8 << 20);
    share_cxl(&cluster);
}

/// The same as separate hosts: each node in a network namespace of its own.
#[test]
fn nodes_in_separate_network_namespaces_share_cxl() {
    const NAME: &str = "nodes_in_separate_network_namespaces_share_cxl";
    if let Some(reason) = network_namespaces_unavailable() {
        println!("SKIPPED: {NAME}: no network namespaces here: {reason}");
        return;
    }
    let cluster = cluster(true, vec![Medium::Cpu, Medium::Cxl], 2 << 20, 8 << 20);
    assert!(cluster.uses_namespaces());
    share_cxl(&cluster);
}

/// [cpu, cxl] on node A fills its CPU pool first, then CXL, then skips; node B reads A's
/// CXL replicas (never its CPU ones) byte-exact from its own mapping.
fn share_cxl(cluster: &LocalCluster) {
    runtime().block_on(async {
        let (a, namespace) = connect(cluster, 0).await;
        let (b, _) = connect(cluster, 1).await;
        // [cpu, cxl]: two chunks fill A's CPU pool, the next ones go to CXL.
        let mut stored = Vec::new();
        for index in 0..12 {
            let (id, bytes) = object(namespace, index);
            let outcome = a.store(id, &bytes).await.unwrap();
            if matches!(outcome, StoreOutcome::Skipped(_)) {
                break;
            }
            assert_eq!(outcome, StoreOutcome::Stored);
            stored.push((id, bytes));
        }
        assert_eq!(
            stored.len(),
            2 + 8,
            "2 MiB of CPU then 8 MiB of CXL, then skip"
        );
        let media: Vec<Option<Medium>> =
            futures_util::future::join_all(stored.iter().map(|(id, _)| medium_of(&a, *id))).await;
        assert_eq!(
            &media[..3],
            &[Some(Medium::Cpu), Some(Medium::Cpu), Some(Medium::Cxl)]
        );
        // Both full: skipped, and existing hits stay.
        let (extra, bytes) = object(namespace, 99);
        assert_eq!(
            a.store(extra, &bytes).await.unwrap(),
            StoreOutcome::Skipped(StoreSkip::NoRoom)
        );
        // A's CPU replicas are misses for B; its CXL replicas are byte-exact hits, read
        // zero-copy from B's own mapping.
        assert_eq!(
            b.probe(&[stored[0].0]).await.unwrap(),
            vec![ProbeOutcome::Miss]
        );
        for (id, bytes) in &stored[2..] {
            let views = b.load(&[*id], AcquireMode::Each).await.unwrap();
            let view = views[0].as_ref().expect("B reads A's CXL replica");
            assert_eq!(view.lease().medium, Medium::Cxl);
            assert_eq!(view.bytes().unwrap(), &bytes[..]);
        }
    });
    // Usage per medium is exported: eight chunks are READY in CXL.
    let metrics = cluster.config.directory.metrics.unwrap();
    let expected = format!(
        "kvtier_medium_bytes{{medium=\"cxl\",state=\"ready\"}} {}",
        8 * CHUNK
    );
    assert!(
        wait_for_metrics(metrics, HANG_GUARD, |body| body.contains(&expected)),
        "no per-medium usage in the metrics"
    );
}

/// A view dropped just before its own client retires the replica is released first: the
/// background releaser lingers before it sends, and the retire flushes it.
/// Where the node's write order leaves CXL out, its engines never write there: the node
/// hands the CXL pool through a read-only descriptor (which cannot write, map writable or
/// truncate the file), the CPU partition read-write, and stores and loads still work.
#[test]
fn a_pool_engines_never_write_is_handed_read_only() {
    use std::os::fd::AsRawFd;
    let cluster = cluster(false, vec![Medium::Cpu], 8 << 20, 8 << 20);
    runtime().block_on(async {
        let socket = cluster.socket(0).unwrap();
        let stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let files = kvtier_core::wire::handoff::receive(&stream, HANG_GUARD)
            .await
            .unwrap();
        // SAFETY: F_GETFL on descriptors this test owns.
        let modes: Vec<i32> = files
            .iter()
            .map(|file| unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) } & libc::O_ACCMODE)
            .collect();
        assert_eq!(
            modes,
            vec![libc::O_RDWR, libc::O_RDONLY],
            "CPU partition, CXL pool"
        );
        let cxl = std::fs::File::from(files.into_iter().nth(1).unwrap());
        let length = cxl.metadata().unwrap().len();
        assert!(
            cxl.set_len(0).is_err(),
            "truncated the CXL pool through a handed file"
        );
        assert_eq!(cxl.metadata().unwrap().len(), length);
        drop(stream);

        let (client, namespace) = connect(&cluster, 0).await;
        let (id, bytes) = object(namespace, 1);
        assert_eq!(
            client.store(id, &bytes).await.unwrap(),
            StoreOutcome::Stored
        );
        let views = client.load(&[id], AcquireMode::Each).await.unwrap();
        let view = views[0].as_ref().expect("a hit");
        assert_eq!(view.lease().medium, Medium::Cpu);
        assert_eq!(view.bytes().unwrap(), &bytes[..]);
    });
}

#[test]
fn a_dropped_view_does_not_hold_up_its_own_clients_retire() {
    let cluster = cluster(false, vec![Medium::Cxl], 2 << 20, 8 << 20);
    runtime().block_on(async {
        let (a, namespace) = connect(&cluster, 0).await;
        let (id, bytes) = object(namespace, 1);
        assert_eq!(a.store(id, &bytes).await.unwrap(), StoreOutcome::Stored);
        let views = a.load(&[id], AcquireMode::Each).await.unwrap();
        let replica = views[0].as_ref().unwrap().lease().replica;
        drop(views);
        // No engine reads it any more: at most an idle delegation the other node was
        // offered on the new shared replica holds it, for the round trip of its recall.
        let retired = a.retire(id, replica).await.unwrap();
        assert!(
            matches!(
                retired,
                RetireOutcome::Reclaimable | RetireOutcome::AwaitingReaders { leases: 0 }
            ),
            "{retired:?}"
        );
    });
}

#[test]
fn cxl_replicas_outlive_their_writer_and_retirement_waits_for_readers() {
    let mut cluster = cluster(false, vec![Medium::Cxl], 2 << 20, 8 << 20);
    let runtime = runtime();
    let (survivor, survivor_bytes) = runtime.block_on(async {
        let (a, namespace) = connect(&cluster, 0).await;
        let (b, _) = connect(&cluster, 1).await;
        let (victim, victim_bytes) = object(namespace, 1);
        assert_eq!(
            a.store(victim, &victim_bytes).await.unwrap(),
            StoreOutcome::Stored
        );
        // B holds a zero-copy view while A retires the replica. B read it under the
        // directory's lease, or under the delegation it was offered on the new shared
        // replica (then the directory counts no lease of an engine: the recall waits for
        // B's own); either way the retire waits for the reader.
        let views = b.load(&[victim], AcquireMode::Each).await.unwrap();
        let view = views[0].as_ref().unwrap();
        let replica = view.lease().replica;
        let retired = a.retire(victim, replica).await.unwrap();
        assert!(
            matches!(retired, RetireOutcome::AwaitingReaders { leases: 0 | 1 }),
            "{retired:?}"
        );
        assert!(
            a.load(&[victim], AcquireMode::Each).await.unwrap()[0].is_none(),
            "retiring blocks new loads"
        );
        // A fills every free page it can: the retired pages must not be among them.
        let mut index = 100;
        loop {
            let (id, bytes) = object(namespace, index);
            index += 1;
            if a.store(id, &bytes).await.unwrap() != StoreOutcome::Stored {
                break;
            }
        }
        assert_eq!(
            view.bytes().unwrap(),
            &victim_bytes[..],
            "a retired replica's pages were reused under a reader"
        );
        drop(views);
        // After the release, the owner reclaims and the pages take new objects again.
        let deadline = Instant::now() + HANG_GUARD;
        let (fresh, fresh_bytes) = object(namespace, 1000);
        while a.store(fresh, &fresh_bytes).await.unwrap() != StoreOutcome::Stored {
            assert!(
                Instant::now() < deadline,
                "the retired replica's pages never came back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (fresh, fresh_bytes)
    });
    // The writer dies; once the directory has fenced it, its CXL replicas are still
    // readable by B (their bytes live in the shared memory, not in the writer).
    cluster.kill_node(0).unwrap();
    let metrics = cluster
        .config
        .directory
        .metrics
        .expect("the test cluster serves metrics");
    assert!(
        wait_for_metrics(metrics, HANG_GUARD, |body| {
            body.contains("kvtier_sessions{state=\"fenced\"} 1")
        }),
        "the killed writer was never fenced"
    );
    runtime.block_on(async {
        let (b, _) = connect(&cluster, 1).await;
        let mut buffer = vec![0u8; CHUNK];
        assert_eq!(
            b.load_into(&[survivor], &mut [&mut buffer[..]])
                .await
                .unwrap(),
            vec![true],
            "a CXL replica vanished with its writer"
        );
        assert_eq!(buffer, survivor_bytes);
    });
}

#[test]
fn a_node_that_maps_another_pool_refuses_to_start() {
    let cluster = cluster(false, vec![Medium::Cxl], 2 << 20, 8 << 20);
    let pool = &cluster.config.cxl_pools[0];
    let text = std::fs::read_to_string(&cluster.config_path).unwrap();
    let wrong = text.replace(&pool.uuid, &format!("{:032x}", pool.uuid().unwrap() ^ 1));
    let config = cluster.root.join("wrong-uuid.toml");
    std::fs::write(&config, wrong).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args([
            "node",
            "--name",
            kvtier_tools::launch::BENCH_PEER,
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        !output.status.success(),
        "a node with the wrong pool UUID started"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("refusing to start"), "{stderr}");
}

#[test]
fn pressure_evicts_instead_of_failing() {
    /// Chunks the CXL pool holds.
    const POOL_CHUNKS: usize = 8;
    let spec = ClusterSpec {
        nodes: 2,
        cpu_pool_bytes: 2 << 20,
        cxl_pool_bytes: (POOL_CHUNKS * CHUNK) as u64,
        cxl_extent_bytes: 4 << 20,
        write_order: vec![Medium::Cxl],
        high_watermark_percent: 90,
        low_watermark_percent: 50,
        // Extents emptied by eviction are given back and cool for a reservation's
        // duration before they are granted again: 5 s rather than 30 s keeps the waves of
        // this test short, and is still ample for a 1 MiB write and its commit.
        reservation_duration_ms: 5_000,
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let stored = runtime().block_on(async {
        let (a, namespace) = connect(&cluster, 0).await;
        // Keep storing new chunks: a full pool skips (never errors) while eviction and
        // reclaim make room, then stores land again, until twice the pool has landed.
        let mut stored = Vec::new();
        let mut index = 0;
        let deadline = Instant::now() + HANG_GUARD;
        let last = loop {
            let (id, bytes) = object(namespace, index);
            index += 1;
            if a.store(id, &bytes).await.unwrap() == StoreOutcome::Stored {
                stored.push(id);
                if stored.len() > 2 * POOL_CHUNKS {
                    break (id, bytes);
                }
            } else {
                assert!(
                    Instant::now() < deadline,
                    "hung: eviction never made room ({} stored)",
                    stored.len()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        // What landed is real: the latest chunk reads back byte-exact from CXL, and no
        // more of them are hits than the pool holds.
        let mut buffer = vec![0u8; CHUNK];
        assert_eq!(
            a.load_into(&[last.0], &mut [&mut buffer[..]])
                .await
                .unwrap(),
            vec![true]
        );
        assert_eq!(
            buffer, last.1,
            "the latest chunk stored is not what was written"
        );
        let hits = a
            .probe(&stored)
            .await
            .unwrap()
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
            .count();
        assert!(
            (1..=POOL_CHUNKS).contains(&hits),
            "{hits} of {} stored chunks are hits in an {POOL_CHUNKS}-chunk pool",
            stored.len()
        );
        stored.len()
    });
    // Of the chunks that landed, all but a poolful had to leave the pool, each an eviction
    // the directory counts (and exports on its next tick).
    let left_at_least = (stored - POOL_CHUNKS) as f64;
    let metrics = cluster.config.directory.metrics.unwrap();
    assert!(
        wait_for_metrics(metrics, HANG_GUARD, |body| {
            metric_value(body, "kvtier_evictions_total")
                .is_some_and(|evictions| evictions >= left_at_least)
        }),
        "{stored} chunks landed in an {POOL_CHUNKS}-chunk pool, but fewer than {left_at_least} evictions were counted"
    );
}

#[test]
fn pressure_on_a_cpu_pool_demotes_into_cxl_where_other_nodes_read_it() {
    let spec = ClusterSpec {
        nodes: 2,
        cpu_pool_bytes: 4 << 20,
        cxl_pool_bytes: 16 << 20,
        cxl_extent_bytes: 4 << 20,
        write_order: vec![Medium::Cpu],
        high_watermark_percent: 90,
        low_watermark_percent: 50,
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    runtime().block_on(async {
        let (a, namespace) = connect(&cluster, 0).await;
        let (b, _) = connect(&cluster, 1).await;
        let stored: Vec<(ObjectId, Vec<u8>)> =
            (0..4).map(|index| object(namespace, index)).collect();
        for (id, bytes) in &stored {
            assert_eq!(a.store(*id, bytes).await.unwrap(), StoreOutcome::Stored);
        }
        // A's CPU pool is full: the coldest chunks move to CXL instead of being dropped, and
        // B, which could never read A's CPU pool, now loads them byte-exact.
        let deadline = Instant::now() + HANG_GUARD;
        let demoted = loop {
            let ids: Vec<ObjectId> = stored.iter().map(|(id, _)| *id).collect();
            let hits: Vec<usize> = b
                .probe(&ids)
                .await
                .unwrap()
                .iter()
                .enumerate()
                .filter(|(_, outcome)| {
                    matches!(
                        outcome,
                        ProbeOutcome::Hit {
                            medium: Medium::Cxl,
                            ..
                        }
                    )
                })
                .map(|(index, _)| index)
                .collect();
            if !hits.is_empty() {
                break hits;
            }
            assert!(Instant::now() < deadline, "nothing was demoted into CXL");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for index in demoted {
            let (id, bytes) = &stored[index];
            let mut buffer = vec![0u8; CHUNK];
            assert_eq!(
                b.load_into(&[*id], &mut [&mut buffer[..]]).await.unwrap(),
                vec![true]
            );
            assert_eq!(
                &buffer, bytes,
                "the demoted copy differs from what A stored"
            );
        }
    });
}
