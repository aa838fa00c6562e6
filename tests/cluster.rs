//! End-to-end tests over real processes: a directory and nodes of the built binary on
//! loopback, QUIC with mutual TLS, shared-memory pools under /dev/shm and engine clients on
//! Unix sockets. Each waits on conditions, never on fixed sleeps; a deadline is a hang
//! guard only ([`HANG_GUARD`]), never a bound a slow machine could miss.

use kvtier_core::actors::node::link::{DirectoryAddress, DirectoryLink, LinkError};
use kvtier_core::client::{Client, ClientError, StoreOutcome};
use kvtier_core::directory::{AcquireMode, ProbeOutcome};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, ObjectId, PrefixDigest};
use kvtier_core::policy::profiles::{Measurement, TierKind, TierProfile};
use kvtier_core::protocol::messages::{
    ClientReply, ClientRequest, DirectoryReply, DirectoryRequest, Hello, ProtocolError,
};
use kvtier_core::wire::{codec, read_frame, FrameHeader};
use kvtier_tools::launch::{wait_for_metrics, ClusterSpec, LocalCluster, BENCH_PEER};
use kvtier_tools::workload::chunk;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const CHUNK: usize = 256 << 10;
/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_kvtier"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn small_cluster(nodes: usize) -> LocalCluster {
    let spec = ClusterSpec {
        nodes,
        cpu_pool_bytes: 16 << 20,
        // A live node that stalls (a loaded machine) must not be taken for a silent one,
        // and a silent one stays suspect, never fenced, until the test acts: a node is
        // suspect after 3 s of silence and fenced only after ten minutes, longer than any
        // test runs. A restart fences the old epoch at once.
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        // Eviction off: these tests fill the pool on purpose and keep reading what they stored.
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        ..ClusterSpec::default()
    };
    LocalCluster::start(exe(), &spec).unwrap()
}

fn object(namespace: kvtier_core::model::NamespaceId, index: u32) -> (ObjectId, Vec<u8>) {
    let prefix = PrefixDigest::ROOT.chain(&[index]);
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

/// The directory's `(allocated, quarantined)` bytes of node-a's CPU pool.
async fn cpu_usage(link: &DirectoryLink) -> (u64, u64) {
    let Ok(DirectoryReply::Usage(pools)) = link.call(DirectoryRequest::Usage).await else {
        panic!("usage refused")
    };
    let pool = pools
        .into_iter()
        .find(|pool| pool.spec.name == "node-a-cpu")
        .expect("node-a's pool is registered");
    (pool.usage.allocated_bytes, pool.usage.quarantined_bytes)
}

/// Polls `condition` until it holds; panics past [`HANG_GUARD`].
async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = Instant::now() + HANG_GUARD;
    while !condition().await {
        assert!(Instant::now() < until, "hung waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn bench_link_target(cluster: &LocalCluster) -> DirectoryAddress {
    DirectoryAddress {
        addresses: vec![cluster.config.directory.listen],
        server_name: cluster.config.directory.name.clone(),
        certs: cluster.config.directory.certs.clone(),
        node_name: BENCH_PEER.into(),
        bind: "127.0.0.1:0".parse().unwrap(),
        busy_poll_tail: Duration::ZERO,
    }
}

#[test]
fn store_load_isolation_bad_peers_and_metrics() {
    let cluster = small_cluster(2);
    let runtime = runtime();
    runtime.block_on(async {
        let a = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let b = Client::connect(&cluster.socket(1).unwrap()).await.unwrap();
        let namespace = a.register_namespace(demo_namespace()).await.unwrap();
        b.register_namespace(demo_namespace()).await.unwrap();

        // A store on node A's client and a load on the same node round-trip exactly.
        let (first, bytes) = object(namespace, 1);
        assert_eq!(a.store(first, &bytes).await.unwrap(), StoreOutcome::Stored);
        assert_eq!(
            a.store(first, &bytes).await.unwrap(),
            StoreOutcome::AlreadyPresent
        );
        let views = a.load(&[first], AcquireMode::Each).await.unwrap();
        let view = views[0].as_ref().expect("hit on the writer's node");
        assert_eq!(view.bytes().unwrap(), &bytes[..]);
        assert_eq!(view.lease().medium, Medium::Cpu);
        let mut buffer = vec![0u8; CHUNK];
        assert_eq!(
            a.load_into(&[first], &mut [&mut buffer[..]]).await.unwrap(),
            vec![true]
        );
        assert_eq!(buffer, bytes);
        drop(views);

        // Node B cannot acquire node A's private CPU replica.
        assert_eq!(b.probe(&[first]).await.unwrap(), vec![ProbeOutcome::Miss]);
        assert!(b.load(&[first], AcquireMode::Each).await.unwrap()[0].is_none());

        // A full cluster gives SKIP, never an error, and existing hits stay.
        let mut skipped = false;
        for index in 2..200 {
            let (id, bytes) = object(namespace, index);
            if matches!(a.store(id, &bytes).await.unwrap(), StoreOutcome::Skipped(_)) {
                skipped = true;
                break;
            }
        }
        assert!(skipped, "a 16 MiB pool must fill with 256 KiB chunks");
        assert!(matches!(
            a.probe(&[first]).await.unwrap()[0],
            ProbeOutcome::Hit { .. }
        ));

        // Malformed frames on the node's socket: typed errors, then a broken frame closes
        // only that connection.
        let mut raw = tokio::net::UnixStream::connect(cluster.socket(0).unwrap())
            .await
            .unwrap();
        // The node's handoff of its memory files comes first.
        kvtier_core::wire::handoff::receive(&raw, HANG_GUARD)
            .await
            .unwrap();
        let header = FrameHeader {
            version: 1,
            request_id: 7,
            payload_bytes: 3,
        };
        raw.write_all(&header.encode()).await.unwrap();
        raw.write_all(&[0xff, 0xff, 0xff]).await.unwrap();
        let (request_id, reply): (u64, ClientReply) = read_frame(&mut raw).await.unwrap().unwrap();
        assert_eq!(request_id, 7);
        assert!(
            matches!(reply, ClientReply::Error(ProtocolError::Malformed(_))),
            "{reply:?}"
        );
        let unknown_version = FrameHeader {
            version: 99,
            request_id: 8,
            payload_bytes: 0,
        };
        raw.write_all(&unknown_version.encode()).await.unwrap();
        let (_, reply): (u64, ClientReply) = read_frame(&mut raw).await.unwrap().unwrap();
        assert!(
            matches!(
                reply,
                ClientReply::Error(ProtocolError::UnsupportedVersion { .. })
            ),
            "{reply:?}"
        );
        raw.write_all(b"garbage that is not a frame header")
            .await
            .unwrap();
        let closed: Option<(u64, ClientReply)> = read_frame(&mut raw).await.unwrap_or(None);
        assert!(closed.is_none(), "a broken stream is closed");
        assert!(
            matches!(
                a.probe(&[first]).await.unwrap()[0],
                ProbeOutcome::Hit { .. }
            ),
            "others keep working"
        );

        // A peer with a certificate from another CA is refused by the directory.
        let foreign = cluster.root.join("foreign-certs");
        kvtier_core::wire::certs::init_cluster_certs(&foreign, &["node-a".to_string()], false)
            .unwrap();
        let mut target = bench_link_target(&cluster);
        target.certs = foreign;
        target.node_name = "node-a".into();
        let refused = DirectoryLink::open(
            target,
            vec![Medium::Cpu],
            vec![Medium::Cpu],
            Default::default(),
        )
        .await;
        assert!(
            matches!(refused, Err(LinkError::Wire(_))),
            "wrong-CA peer was not refused"
        );
        // A known peer with a malformed request gets a typed error and keeps its session.
        let link = DirectoryLink::open(
            bench_link_target(&cluster),
            vec![Medium::Cpu],
            vec![Medium::Cpu],
            Default::default(),
        )
        .await
        .unwrap();
        let reply = link.call(DirectoryRequest::Hello(Hello::ours())).await;
        assert!(matches!(
            reply,
            Err(LinkError::Refused(ProtocolError::Sequence(_)))
        ));
        let Ok(DirectoryReply::Usage(pools)) = link.call(DirectoryRequest::Usage).await else {
            panic!("usage refused")
        };
        // Every node probed its CPU pool at start: the directory prices it by the
        // measurement, not by the representative DRAM figures (the nodes' own metrics,
        // checked below, carry the write figure they measured).
        let representative = Measurement::of(&TierProfile::representative(TierKind::Dram));
        // The benchmark peer's pool is declared (every node of the configuration is) but
        // never registered: nothing runs there to probe it.
        let bench_pool = format!("{BENCH_PEER}-cpu");
        for pool in pools.iter().filter(|pool| pool.spec.name != bench_pool) {
            assert_ne!(
                pool.profile, representative,
                "{:?} was not probed",
                pool.spec.name
            );
        }
        assert!(
            matches!(
                a.probe(&[first]).await.unwrap()[0],
                ProbeOutcome::Hit { .. }
            ),
            "others keep working"
        );
        let bad_namespace = ObjectId {
            namespace: kvtier_core::model::NamespaceId([3; 16]),
            ..first
        };
        assert!(matches!(
            a.probe(&[bad_namespace]).await,
            Err(ClientError::Refused(_))
        ));

        // A retired certificate is refused from its next connection on, with the reason;
        // a renewal issued by the same CA is accepted.
        drop(link);
        let certs = &cluster.config.directory.certs;
        assert!(kvtier_core::wire::certs::retire_certificate(certs, BENCH_PEER).unwrap());
        let open = || {
            DirectoryLink::open(
                bench_link_target(&cluster),
                vec![Medium::Cpu],
                vec![Medium::Cpu],
                Default::default(),
            )
        };
        let refused = open()
            .await
            .err()
            .expect("a retired certificate was accepted");
        assert!(
            refused.to_string().contains("certificate_retired"),
            "{refused}"
        );
        kvtier_core::wire::certs::issue_certificates(certs, &[BENCH_PEER.to_string()], 1).unwrap();
        eventually("the renewed certificate connects", || async {
            open().await.is_ok()
        })
        .await;
    });

    // The metrics endpoints serve the named families.
    for (name, address) in cluster.metrics_addresses() {
        let body = kvtier_tools::launch::scrape_metrics(address).unwrap();
        for family in [
            "kvtier_requests_total",
            "kvtier_request_duration_seconds",
            "kvtier_pool_capacity_bytes",
            "kvtier_leases",
            "kvtier_sessions",
            "kvtier_pool_profile{figure=\"read_bytes_per_second\"",
            "kvtier_pool_profile{figure=\"write_bytes_per_second\"",
        ] {
            assert!(body.contains(family), "{name} does not serve {family}");
        }
        if name == "directory" {
            assert!(
                body.contains("kvtier_pool_bytes{pool=\"0\",state=\"ready\"}"),
                "{body}"
            );
            assert!(body.contains("op=\"probe\""));
        }
        if name == "node-a" {
            // The node exports its allocator's bytes on its task timer: wait for them.
            let allocated = |body: &str| -> f64 {
                body.lines()
                    .filter(|line| {
                        line.starts_with("kvtier_pool_bytes{")
                            && line.contains("state=\"allocated\"")
                    })
                    .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            };
            assert!(
                wait_for_metrics(address, HANG_GUARD, |body| allocated(body) > 0.0),
                "node-a exports no allocated bytes"
            );
        }
    }
}

#[test]
fn killed_node_is_hidden_then_restarts_with_a_new_epoch() {
    let mut cluster = small_cluster(1);
    let runtime = runtime();
    let (namespace, first_epoch, stored) = runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let namespace = client.register_namespace(demo_namespace()).await.unwrap();
        let (id, bytes) = object(namespace, 1);
        assert_eq!(
            client.store(id, &bytes).await.unwrap(),
            StoreOutcome::Stored
        );
        assert!(matches!(
            client.probe(&[id]).await.unwrap()[0],
            ProbeOutcome::Hit { .. }
        ));
        // While its owner is live, the chunk is allocated and nothing is hidden.
        let link = DirectoryLink::open(
            bench_link_target(&cluster),
            vec![Medium::Cpu],
            vec![Medium::Cpu],
            Default::default(),
        )
        .await
        .unwrap();
        assert_eq!(cpu_usage(&link).await, (CHUNK as u64, 0));
        (namespace, client.node().1, id)
    });
    cluster.kill_node(0).unwrap();
    runtime.block_on(async {
        let link = DirectoryLink::open(
            bench_link_target(&cluster),
            vec![Medium::Cpu],
            vec![Medium::Cpu],
            Default::default(),
        )
        .await
        .unwrap();
        // Silence makes the session suspect: its replicas are hidden, the whole chunk
        // (256 KiB: four 64 KiB pages) counts as quarantined, and nothing is freed. The
        // state lasts: fencing is ten minutes away.
        eventually("the killed node's replicas are hidden", || async {
            cpu_usage(&link).await.1 > 0
        })
        .await;
        assert_eq!(cpu_usage(&link).await, (CHUNK as u64, CHUNK as u64));
    });
    // ... and a restarted node opens a new epoch; the old epoch's replicas are gone.
    cluster.restart_node(0).unwrap();
    runtime.block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        assert!(
            client.node().1 > first_epoch,
            "restart must open a new epoch"
        );
        client.register_namespace(demo_namespace()).await.unwrap();
        assert_eq!(
            client.probe(&[stored]).await.unwrap(),
            vec![ProbeOutcome::Miss]
        );
        let (id, bytes) = object(namespace, 2);
        assert_eq!(
            client.store(id, &bytes).await.unwrap(),
            StoreOutcome::Stored
        );
        let mut buffer = vec![0u8; CHUNK];
        assert_eq!(
            client
                .load_into(&[id], &mut [&mut buffer[..]])
                .await
                .unwrap(),
            vec![true]
        );
        assert_eq!(buffer, bytes);
    });
}

#[test]
fn client_requests_before_hello_are_refused() {
    let cluster = small_cluster(1);
    runtime().block_on(async {
        let mut raw = tokio::net::UnixStream::connect(cluster.socket(0).unwrap())
            .await
            .unwrap();
        // The node's handoff of its memory files comes first.
        kvtier_core::wire::handoff::receive(&raw, HANG_GUARD)
            .await
            .unwrap();
        let payload = codec::encode(&ClientRequest::Describe).unwrap();
        let header = FrameHeader {
            version: 1,
            request_id: 1,
            payload_bytes: payload.len() as u32,
        };
        raw.write_all(&header.encode()).await.unwrap();
        raw.write_all(&payload).await.unwrap();
        let (_, reply): (u64, ClientReply) = read_frame(&mut raw).await.unwrap().unwrap();
        assert!(
            matches!(reply, ClientReply::Error(ProtocolError::Sequence(_))),
            "{reply:?}"
        );
    });
}

/// A connection that never says hello is closed, and its slot given back.
#[test]
fn a_client_that_never_says_hello_is_closed() {
    use tokio::io::AsyncReadExt;
    let cluster = small_cluster(1);
    runtime().block_on(async {
        // Before the connection: the node's timer starts after it, so the wait measured
        // from here is never shorter than the node's, however late this thread runs.
        let started = Instant::now();
        let mut silent = tokio::net::UnixStream::connect(cluster.socket(0).unwrap())
            .await
            .unwrap();
        // The node's handoff of its memory files comes first.
        kvtier_core::wire::handoff::receive(&silent, HANG_GUARD)
            .await
            .unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(HANG_GUARD, silent.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "the silent client was not closed: {read:?}"
        );
        let waited = started.elapsed();
        assert!(
            waited >= kvtier_core::actors::node::client_session::HELLO_TIMEOUT,
            "closed after {waited:?}, before its time to say hello"
        );
        // A client that greets is served as ever.
        assert!(Client::connect(&cluster.socket(0).unwrap()).await.is_ok());
    });
}

/// The CPU pool has no path: the node hands each client it admits a memory file, first
/// thing on the connection, sealed so that no holder can shrink or grow it under the
/// node's and the other engines' mappings (a `SIGBUS` in each before the seals).
#[test]
fn the_cpu_pool_is_handed_over_the_socket_sealed_against_resizing() {
    let cluster = small_cluster(1);
    let node_pid = cluster.node_pid(0).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{node_pid}/maps")).unwrap();
    assert!(maps.contains("/memfd:kvtier-cpu-node-a"), "{maps}");
    assert!(
        !maps.contains("/dev/shm/kvtier"),
        "a pool file under /dev/shm: {maps}"
    );
    runtime().block_on(async {
        let client = Client::connect(&cluster.socket(0).unwrap()).await.unwrap();
        let namespace = client.register_namespace(demo_namespace()).await.unwrap();
        let (id, bytes) = object(namespace, 1);
        assert_eq!(
            client.store(id, &bytes).await.unwrap(),
            StoreOutcome::Stored
        );

        // A connection of its own, as an engine that misbehaves: it holds the pool's file.
        let raw = tokio::net::UnixStream::connect(cluster.socket(0).unwrap())
            .await
            .unwrap();
        let handed = kvtier_core::wire::handoff::receive(&raw, HANG_GUARD)
            .await
            .unwrap();
        assert_eq!(handed.len(), 1);
        let file = std::fs::File::from(handed.into_iter().next().unwrap());
        let length = file.metadata().unwrap().len();
        assert!(length > 16 << 20, "{length}");
        for target in [0, length / 2, length * 2] {
            let error = file.set_len(target).unwrap_err();
            assert_eq!(error.raw_os_error(), Some(libc::EPERM), "set_len({target})");
        }
        assert_eq!(file.metadata().unwrap().len(), length);
        use std::os::fd::AsRawFd;
        // SAFETY: a plain fcntl on a descriptor this test owns.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        let wanted = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        assert_eq!(seals & wanted, wanted, "seals {seals:#x}");

        // The node and its clients read on, unharmed.
        let mut buffer = vec![0u8; CHUNK];
        assert_eq!(
            client
                .load_into(&[id], &mut [&mut buffer[..]])
                .await
                .unwrap(),
            vec![true]
        );
        assert_eq!(buffer, bytes);
    });
}
