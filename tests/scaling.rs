//! Scaling a serving cluster as an operator does, over real processes: a node added through
//! `cluster.toml` and `kvtier ctl reload`, a node drained with `kvtier ctl drain`, a broken
//! file refused; and a node stopped at each point of its life removes what it created.
//! Waits are on conditions; a deadline is a hang guard only ([`HANG_GUARD`]).

mod common;

use common::{ctl, operator};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::directory::{AcquireMode, DrainProgress, DrainState, ProbeOutcome};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, NamespaceId, ObjectId, PrefixDigest};
use kvtier_core::protocol::messages::ClusterStatus;
use kvtier_tools::launch::{wait_for_metrics, ClusterSpec, LocalCluster};
use kvtier_tools::workload::chunk;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHUNK: usize = 256 << 10;
/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(120);
/// Objects the load on node-a cycles through: 8 MiB, well inside its 32 MiB pool.
const LOAD_OBJECTS: u32 = 32;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_kvtier"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn object(namespace: NamespaceId, index: u32) -> (ObjectId, Vec<u8>) {
    let id = ObjectId {
        namespace,
        prefix: PrefixDigest::ROOT.chain(&[index]),
        shard: 0,
        part: 0,
    };
    let mut bytes = vec![0u8; CHUNK];
    chunk::fill(&id, &mut bytes);
    (id, bytes)
}

fn status(socket: &Path) -> ClusterStatus {
    let output = ctl(socket, &["status", "--json"]);
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Loads `object` through `client` and checks every byte; `false` on a miss.
async fn load_verified(client: &Client, object: ObjectId, bytes: &[u8]) -> bool {
    let views = client.load(&[object], AcquireMode::Each).await.unwrap();
    match &views[0] {
        Some(view) => {
            assert!(
                view.bytes().expect("the view is valid") == bytes,
                "loaded bytes differ from stored ones"
            );
            true
        }
        None => false,
    }
}

/// Stores and loads on node-a until `stop`, verifying every byte; counts the rounds and
/// panics (failing the test at `join`) on any error or lost object.
async fn load_until(
    client: Client,
    namespace: NamespaceId,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
) {
    let objects: Vec<(ObjectId, Vec<u8>)> = (0..LOAD_OBJECTS)
        .map(|index| object(namespace, 1_000_000 + index))
        .collect();
    let mut index = 0;
    while !stop.load(Ordering::Relaxed) {
        let (id, bytes) = &objects[index % objects.len()];
        let stored = client.store(*id, bytes).await.expect("a store failed");
        assert!(
            matches!(stored, StoreOutcome::Stored | StoreOutcome::AlreadyPresent),
            "{stored:?}"
        );
        assert!(
            load_verified(&client, *id, bytes).await,
            "node-a lost object {index}"
        );
        index += 1;
        rounds.fetch_add(1, Ordering::Relaxed);
    }
}

/// Waits until `condition` holds; panics past [`HANG_GUARD`].
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + HANG_GUARD;
    while !condition() {
        assert!(Instant::now() < until, "hung waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_node_is_added_by_reload_and_another_drained_while_the_cluster_serves() {
    let spec = ClusterSpec {
        nodes: 2,
        spare_nodes: 1,
        cpu_pool_bytes: 32 << 20,
        cxl_pool_bytes: 64 << 20,
        cxl_extent_bytes: 4 << 20,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    let mut cluster = LocalCluster::start(exe(), &spec).unwrap();
    let (socket_a, socket_b) = (cluster.socket(0).unwrap(), cluster.socket(1).unwrap());
    // The operator's own copy of the configuration (where the directory is, the certificate
    // folder), beside the directory's, which the test breaks and extends.
    let operator_config = cluster.config_path.with_file_name("operator.toml");
    std::fs::copy(&cluster.config_path, &operator_config).unwrap();
    let (pid_a, pid_directory) = (cluster.node_pid(0), cluster.directory_pid());
    let runtime = runtime();
    let (a, b, namespace) = runtime.block_on(async {
        let a = Client::connect(&socket_a).await.unwrap();
        let b = Client::connect(&socket_b).await.unwrap();
        let namespace = a.register_namespace(demo_namespace()).await.unwrap();
        b.register_namespace(demo_namespace()).await.unwrap();
        (a, b, namespace)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let load = runtime.spawn(load_until(
        a.clone(),
        namespace,
        stop.clone(),
        rounds.clone(),
    ));
    // Node-b's cache: CPU replicas only node-b can read.
    let on_b: Vec<(ObjectId, Vec<u8>)> = (0..8).map(|index| object(namespace, index)).collect();
    runtime.block_on(async {
        for (id, bytes) in &on_b {
            assert_eq!(b.store(*id, bytes).await.unwrap(), StoreOutcome::Stored);
        }
        let ids: Vec<ObjectId> = on_b.iter().map(|(id, _)| *id).collect();
        assert!(a
            .probe(&ids)
            .await
            .unwrap()
            .iter()
            .all(|outcome| *outcome == ProbeOutcome::Miss));
    });

    // A broken file is refused whole, naming its line; the cluster keeps serving.
    let good = std::fs::read_to_string(&cluster.config_path).unwrap();
    let broken_line = good
        .lines()
        .position(|line| line.starts_with("listen"))
        .unwrap()
        + 1;
    let broken = good.replacen("listen = \"", "listen = ", 1);
    std::fs::write(&cluster.config_path, broken).unwrap();
    let refused = operator(&operator_config, &["reload"]);
    assert!(!refused.status.success(), "{refused:?}");
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(reason.contains(&format!("line {broken_line}")), "{reason}");
    std::fs::write(&cluster.config_path, &good).unwrap();
    let seen = rounds.load(Ordering::Relaxed);
    eventually("the load goes on after a refused reload", || {
        rounds.load(Ordering::Relaxed) > seen + 4
    });

    // Node-c: added to the file, reloaded, started; it stores into its own pool at once.
    let c_index = cluster.add_node().unwrap();
    let reloaded = operator(&operator_config, &["reload", "--json"]);
    assert!(reloaded.status.success(), "{reloaded:?}");
    assert!(String::from_utf8_lossy(&reloaded.stdout).contains("node-c"));
    cluster.start_node(c_index).unwrap();
    let socket_c = cluster.socket(c_index).unwrap();
    runtime.block_on(async {
        let c = Client::connect(&socket_c).await.unwrap();
        c.register_namespace(demo_namespace()).await.unwrap();
        let (id, bytes) = object(namespace, 2_000_000);
        assert_eq!(c.store(id, &bytes).await.unwrap(), StoreOutcome::Stored);
        assert_eq!(
            c.probe(&[id]).await.unwrap(),
            vec![ProbeOutcome::Hit {
                medium: Medium::Cpu,
                length_bytes: CHUNK as u64
            }]
        );
        assert!(load_verified(&c, id, &bytes).await);
    });
    let before_drain = status(&socket_a);
    let c_status = before_drain
        .nodes
        .iter()
        .find(|node| node.name == "node-c")
        .unwrap();
    assert_eq!(c_status.state, "live");
    assert!(before_drain
        .pools
        .iter()
        .any(|pool| pool.spec.name == "node-c-cpu"));

    // A node's certificate (all an engine on that host could reach) never drains a node.
    let refused = operator(&operator_config, &["drain", "node-b", "--as", "node-a"]);
    assert!(!refused.status.success(), "{refused:?}");
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(reason.contains("need an operator certificate"), "{reason}");
    assert_eq!(
        status(&socket_a)
            .nodes
            .iter()
            .filter(|node| node.drain.is_some())
            .count(),
        0
    );

    // Node-b drained: relocated into CXL, its session ended, it exits 0 with its files.
    let drained = operator(&operator_config, &["drain", "node-b", "--wait", "--json"]);
    assert!(drained.status.success(), "{drained:?}");
    let last_line = String::from_utf8_lossy(&drained.stdout)
        .lines()
        .last()
        .unwrap()
        .to_owned();
    let progress: DrainProgress = serde_json::from_str(&last_line).unwrap();
    assert_eq!(progress.state, DrainState::Drained);
    eventually("node-b exits", || cluster.node_exit(1).unwrap().is_some());
    assert!(cluster.node_exit(1).unwrap().unwrap().success());
    assert!(!socket_b.exists(), "node-b removed its socket");
    runtime.block_on(async {
        for (id, bytes) in &on_b {
            assert!(
                load_verified(&a, *id, bytes).await,
                "node-b's object is a hit from node-a after the drain"
            );
        }
    });
    let after = status(&socket_a);
    let b_status = after
        .nodes
        .iter()
        .find(|node| node.name == "node-b")
        .unwrap();
    assert_eq!(b_status.state, "drained");
    let metrics = cluster.config.directory.metrics.unwrap();
    assert!(wait_for_metrics(metrics, HANG_GUARD, |body| body
        .contains("kvtier_drains{state=\"drained\"} 1")));

    // Nothing else restarted or lost its cache, and no load failed.
    let seen = rounds.load(Ordering::Relaxed);
    eventually("the load goes on after the drain", || {
        rounds.load(Ordering::Relaxed) > seen + 4
    });
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(load).unwrap();
    assert_eq!(cluster.node_pid(0), pid_a);
    assert_eq!(cluster.directory_pid(), pid_directory);
    assert!(cluster.node_exit(0).unwrap().is_none() && cluster.directory_runs());
    let a_status = after
        .nodes
        .iter()
        .find(|node| node.name == "node-a")
        .unwrap();
    assert_eq!((a_status.state.as_str(), a_status.epoch.0), ("live", 1));

    // A node stopped while serving removes its files itself.
    assert!(socket_c.exists());
    assert!(cluster.stop_node(c_index).unwrap().success());
    assert!(!socket_c.exists(), "node-c removed its socket");
    let not_removed = cluster.shutdown();
    assert!(not_removed.is_empty(), "{not_removed:?}");
}

/// A node process of its own (no `LocalCluster`): `cluster.toml` naming a directory that
/// may not run, one node, its files under a fresh folder.
struct LoneNode {
    root: PathBuf,
    socket: PathBuf,
}

impl LoneNode {
    fn new(tag: &str, pool_bytes: u64) -> LoneNode {
        let root = std::env::temp_dir().join(format!("kvtier-lone-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        kvtier_core::wire::certs::init_cluster_certs(
            &root.join("certs"),
            &["directory".into(), "node-a".into()],
            false,
        )
        .unwrap();
        let toml = format!(
            "[directory]\nlisten = \"{port}\"\ncerts = \"certs\"\n\n[[nodes]]\nname = \"node-a\"\nsocket = \"node-a.sock\"\n\n[nodes.cpu_pool]\ncapacity_bytes = {pool_bytes}\n"
        );
        std::fs::write(root.join("cluster.toml"), toml).unwrap();
        let socket = root.join("node-a.sock");
        LoneNode { root, socket }
    }

    fn spawn(&self, arguments: &[&str]) -> std::process::Child {
        Command::new(exe())
            .args(arguments)
            .arg("--config")
            .arg(self.root.join("cluster.toml"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn lock(&self) -> PathBuf {
        self.root.join("node-a.sock.lock")
    }
}

impl Drop for LoneNode {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Whether process `pid` maps a CPU pool (its sealed memory file, which has no path).
fn maps_a_cpu_pool(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|maps| maps.contains("/memfd:kvtier-cpu-"))
}

fn terminate(child: &std::process::Child) {
    // SAFETY: kill(2) on a child this test spawned and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

/// Waits for `child` to exit; panics past [`HANG_GUARD`].
fn exit_of(child: &mut std::process::Child) -> std::process::ExitStatus {
    let mut status = None;
    eventually("the node exits", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status.unwrap()
}

#[test]
fn a_node_stopped_before_it_reached_the_directory_removes_its_files() {
    let node = LoneNode::new("unreached", 16 << 20);
    let mut child = node.spawn(&["node", "--name", "node-a"]);
    // The pool is pre-faulted before the directory is tried; the lock is taken first.
    let pid = child.id();
    eventually("the node maps its pool", || maps_a_cpu_pool(pid));
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let log = Arc::new(std::sync::Mutex::new(String::new()));
    let written = log.clone();
    let reader = std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::BufRead::read_line(&mut stderr, &mut line).is_ok_and(|read| read > 0) {
            written.lock().unwrap().push_str(&std::mem::take(&mut line));
        }
    });
    eventually("the node retries the directory", || {
        log.lock().unwrap().contains("retrying")
    });
    terminate(&child);
    let status = exit_of(&mut child);
    reader.join().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(status.success(), "{status:?}: {log}");
    assert!(
        log.contains("stopped before reaching the directory"),
        "{log}"
    );
    assert!(!node.socket.exists() && !node.lock().exists());
}

#[test]
fn a_node_stopped_during_its_pre_fault_removes_its_files() {
    // Large enough that the pre-fault takes a while after the pool is mapped.
    let node = LoneNode::new("prefault", 1 << 30);
    let mut child = node.spawn(&["node", "--name", "node-a"]);
    let pid = child.id();
    eventually("the node maps its pool", || maps_a_cpu_pool(pid));
    terminate(&child);
    let status = exit_of(&mut child);
    assert!(status.success(), "{status:?}");
    assert!(!node.lock().exists());
}

#[test]
fn a_second_instance_of_a_node_is_refused_and_leaves_the_first_ones_files() {
    let node = LoneNode::new("twice", 16 << 20);
    let mut first = node.spawn(&["node", "--name", "node-a"]);
    let pid = first.id();
    eventually("the first instance maps its pool", || maps_a_cpu_pool(pid));
    let second = node
        .spawn(&["node", "--name", "node-a"])
        .wait_with_output()
        .unwrap();
    assert!(!second.status.success());
    let reason = String::from_utf8_lossy(&second.stderr);
    assert!(reason.contains("another instance of this node"), "{reason}");
    assert!(maps_a_cpu_pool(pid), "the first one's pool is untouched");
    assert!(node.lock().exists());
    terminate(&first);
    assert!(exit_of(&mut first).success());
    assert!(!node.lock().exists());
}
