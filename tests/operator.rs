//! An operator's day, over real processes, real signals and real files: a misspelled key
//! refused at start and on reload, naming its line and the nearest known key; SIGHUP
//! reloading a node; no stop signal leaving a node's socket, lock or pool file behind; and a
//! drain that cannot progress ending `ctl drain --wait` with the reason; `ctl put` objects
//! moving down the tiers at their namespace's cost, and a skipped put failing with its reason;
//! a full CXL pool at a node's start logged as the normal case it is; a drained node started
//! again rejoining.
//! Waits are on conditions; a deadline is a hang guard only ([`HANG_GUARD`]).

mod common;

use common::{ctl, operator};
use kvtier_core::client::StoreOutcome;
use kvtier_core::directory::AcquireMode;
use kvtier_core::model::Medium;
use kvtier_tools::launch::{ClusterSpec, LocalCluster};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Longest any wait may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_kvtier"))
}

fn small_cluster() -> LocalCluster {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        metrics: false,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    LocalCluster::start(exe(), &spec).unwrap()
}

/// Waits until `condition` holds; panics past [`HANG_GUARD`].
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + HANG_GUARD;
    while !condition() {
        assert!(Instant::now() < until, "hung waiting for: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `kvtier ARGS --config CONFIG`, which must exit (within [`HANG_GUARD`]).
fn run_to_exit(args: &[&str], config: &Path) -> Output {
    let mut child = Command::new(exe())
        .args(args)
        .arg("--config")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut exited = false;
    let until = Instant::now() + HANG_GUARD;
    while !exited && Instant::now() < until {
        exited = child.try_wait().unwrap().is_some();
        if !exited {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if !exited {
        let _ = child.kill();
    }
    let output = child.wait_with_output().unwrap();
    assert!(exited, "kvtier {args:?} did not exit: {output:?}");
    output
}

/// The 1-based line of the first line of `text` that starts with `prefix`.
fn line_starting(text: &str, prefix: &str) -> usize {
    text.lines()
        .position(|line| line.starts_with(prefix))
        .unwrap()
        + 1
}

#[test]
fn a_misspelled_key_is_refused_at_start_and_on_reload() {
    let cluster = small_cluster();
    let good = std::fs::read_to_string(&cluster.config_path).unwrap();
    let typo = good.replacen("domains = ", "domain = ", 1);
    let line = line_starting(&typo, "domain = ");
    let expected =
        format!("line {line}: unknown key `domain` in [nodes]; the nearest known key is `domains`");

    // The operator's copy stays good, so the refusal is the directory's own.
    let operator_copy = cluster.root.join("operator.toml");
    std::fs::write(&operator_copy, &good).unwrap();
    std::fs::write(&cluster.config_path, &typo).unwrap();
    let refused = operator(&operator_copy, &["reload"]);
    assert!(!refused.status.success(), "{refused:?}");
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(reason.contains(&expected), "{reason}");

    // Neither process starts from it (a file of its own beside the cluster's).
    let broken = cluster.root.join("typo.toml");
    std::fs::write(&broken, &typo).unwrap();
    for args in [&["directory"][..], &["node", "--name", "node-a"]] {
        let output = run_to_exit(args, &broken);
        assert!(!output.status.success(), "{args:?} started");
        let reason = String::from_utf8_lossy(&output.stderr);
        assert!(reason.contains(&expected), "{args:?}: {reason}");
    }

    // A missing field names its line too.
    let missing = good.replacen("socket = ", "# socket = ", 1);
    std::fs::write(&broken, &missing).unwrap();
    let output = run_to_exit(&["node", "--name", "node-a"], &broken);
    let reason = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && reason.contains("missing field `socket`"),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("line {}", line_starting(&missing, "[[nodes]]"))),
        "{reason}"
    );

    // The right file reloads.
    std::fs::write(&cluster.config_path, &good).unwrap();
    let reloaded = operator(&cluster.config_path, &["reload"]);
    assert!(reloaded.status.success(), "{reloaded:?}");
    // `ctl status` with the file alone asks the first node that answers.
    let status = Command::new(exe())
        .args(["ctl", "status", "--config"])
        .arg(&cluster.config_path)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success() && shown.contains("node-a"),
        "{status:?}"
    );
}

/// The files node `index` of `cluster` creates: socket, instance lock. (Its CPU pool is a
/// memory file without a path.)
fn node_files(cluster: &LocalCluster, index: usize) -> [PathBuf; 2] {
    let socket = cluster.socket(index).unwrap();
    let mut lock = socket.clone().into_os_string();
    lock.push(".lock");
    [socket, PathBuf::from(lock)]
}

/// Sends `signal` to `pid`.
fn send(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a child process this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn sighup_reloads_a_node_and_no_signal_leaves_its_files() {
    let mut cluster = small_cluster();
    let socket = cluster.socket(0).unwrap();
    let log = cluster.root.join("node-a.log");
    let pid = cluster.node_pid(0).unwrap();
    let good = std::fs::read_to_string(&cluster.config_path).unwrap();
    let reloads = |log: &Path| log_of(log).matches("SIGHUP: reload").count();

    // Nothing changed: said so, and the node serves on.
    send(pid, libc::SIGHUP);
    eventually("the node logs its reload", || reloads(&log) == 1);
    assert!(log_of(&log).contains("nothing changed"), "{}", log_of(&log));
    assert!(
        cluster.node_exit(0).unwrap().is_none(),
        "SIGHUP ended the node"
    );
    assert!(ctl(&socket, &["probe", "--key", "k"]).status.success());

    // New tenant rules that leave this (root) user out apply to the next connection.
    let rules = "\n[[tenants]]\nname = \"others\"\nuids = [4242]\nnamespaces = [\"*\"]\n";
    std::fs::write(&cluster.config_path, good.clone() + rules).unwrap();
    send(pid, libc::SIGHUP);
    eventually("the node logs its second reload", || reloads(&log) == 2);
    assert!(
        log_of(&log).contains("new tenant rules"),
        "{}",
        log_of(&log)
    );
    let refused = ctl(&socket, &["probe", "--key", "k"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("uid 0"),
        "{refused:?}"
    );

    // A misspelled file is refused by name; the rules in force stay.
    std::fs::write(
        &cluster.config_path,
        good.replacen("domains = ", "domain = ", 1) + rules,
    )
    .unwrap();
    send(pid, libc::SIGHUP);
    eventually("the node logs its third reload", || reloads(&log) == 3);
    assert!(
        log_of(&log).contains("unknown key `domain`"),
        "{}",
        log_of(&log)
    );
    assert!(!ctl(&socket, &["probe", "--key", "k"]).status.success());
    std::fs::write(&cluster.config_path, &good).unwrap();
    send(pid, libc::SIGHUP);
    eventually("the node logs its fourth reload", || reloads(&log) == 4);
    assert!(ctl(&socket, &["probe", "--key", "k"]).status.success());

    // SIGTERM and SIGINT end it, removing its files; so does each after a SIGHUP.
    for (signals, what) in [
        (&[libc::SIGTERM][..], "SIGTERM"),
        (&[libc::SIGINT][..], "SIGINT"),
        (&[libc::SIGHUP, libc::SIGTERM][..], "SIGHUP then SIGTERM"),
    ] {
        let files = node_files(&cluster, 0);
        assert!(files.iter().all(|file| file.exists()), "{files:?}");
        let pid = cluster.node_pid(0).unwrap();
        for signal in signals {
            send(pid, *signal);
        }
        let mut status = None;
        eventually("the node exits", || {
            status = cluster.node_exit(0).unwrap();
            status.is_some()
        });
        assert!(status.unwrap().success(), "{what}: {status:?}");
        for file in &files {
            assert!(!file.exists(), "{what} left {}", file.display());
        }
        cluster.start_node(0).unwrap();
    }
}

#[test]
fn sighup_while_a_node_starts_neither_kills_it_nor_leaves_its_files() {
    let mut cluster = small_cluster();
    cluster.stop_node(0).unwrap();
    let files = node_files(&cluster, 0);
    let log = cluster.root.join("node-a-again.log");
    let mut node = Command::new(exe())
        .args(["node", "--name", "node-a", "--config"])
        .arg(&cluster.config_path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // The lock exists once the signals are listened to: from then on SIGHUP waits.
    eventually("the instance lock exists", || files[1].exists());
    send(node.id(), libc::SIGHUP);
    eventually("the node serves and answers the SIGHUP", || {
        log_of(&log).contains("SIGHUP: reloaded")
    });
    assert!(node.try_wait().unwrap().is_none(), "{}", log_of(&log));
    assert!(files.iter().all(|file| file.exists()), "{files:?}");
    send(node.id(), libc::SIGINT);
    let mut status = None;
    eventually("the node exits", || {
        status = node.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success(), "{}", log_of(&log));
    for file in &files {
        assert!(!file.exists(), "left {}", file.display());
    }
}

#[test]
fn a_drain_that_cannot_progress_says_why_and_ends_the_wait() {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        drain_stall_ms: 1_000,
        ..ClusterSpec::default()
    };
    let mut cluster = LocalCluster::start(exe(), &spec).unwrap();
    let socket = cluster.socket(0).unwrap();
    let runtime = common::runtime();
    // An engine of the node holds a lease at the directory (30 s by default) on what it
    // stored: that replica cannot leave. (A read the node answers itself, as it does what
    // its clients stored, does not hold a drain: the pages stay until that read ends. A
    // directory restart ends the node's own entries, so the engine's next load after it
    // is the directory's.)
    let (client, object) = runtime.block_on(async {
        let (client, namespace) = common::connect(&cluster, 0).await;
        let (object, bytes) = common::object(namespace, 1, 36, 64 << 10);
        assert_eq!(
            client.store(object, &bytes).await.unwrap(),
            StoreOutcome::Stored
        );
        (client, object)
    });
    cluster.kill_directory().unwrap();
    cluster.restart_directory().unwrap();
    let views = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        // Until the node notices the restart it answers the load itself.
        loop {
            let views = client.load(&[object], AcquireMode::Each).await.unwrap();
            let answered_here = views[0]
                .as_ref()
                .map(|view| kvtier_core::node::delegations::is_local(view.lease().lease));
            if answered_here == Some(false) {
                break views;
            }
            drop(views);
            assert!(Instant::now() < deadline, "the node never rejoined");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });

    let started = Instant::now();
    let waited = operator(
        &cluster.config_path,
        &["drain", "node-a", "--wait", "--timeout-s", "100"],
    );
    let reason = String::from_utf8_lossy(&waited.stderr);
    assert!(!waited.status.success(), "{waited:?}");
    assert!(
        reason.contains("the drain of node-a is stuck: 1 replicas stay leased by readers"),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(100),
        "it waited out its timeout"
    );
    let status = ctl(&socket, &["status"]);
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(
        shown.contains("stuck: 1 replicas stay leased by readers"),
        "{shown}"
    );
    let directory = common::metrics_of(&cluster, "directory");
    assert_eq!(
        common::scraped(directory, "kvtier_drains{state=\"stuck\"}"),
        1.0
    );
    let log = log_of(&cluster.root.join("directory.log"));
    assert!(
        log.contains("drain stuck: 1 replicas stay leased by readers"),
        "{log}"
    );

    // The lease ends: the drain goes on and the node exits, drained.
    runtime.block_on(async {
        let leases: Vec<_> = views
            .into_iter()
            .flatten()
            .map(|view| view.into_lease())
            .collect();
        client.release(&leases).await.unwrap();
    });
    let mut exit = None;
    eventually("the drained node exits", || {
        exit = cluster.node_exit(0).unwrap();
        exit.is_some()
    });
    assert!(exit.unwrap().success(), "{exit:?}");
    assert_eq!(
        common::scraped(directory, "kvtier_drains{state=\"stuck\"}"),
        0.0
    );
}

#[test]
fn a_metrics_port_in_use_a_file_too_large_and_private_files_are_handled_up_front() {
    use std::os::unix::fs::PermissionsExt;
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        ssd_bytes: 16 << 20,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    let mut cluster = LocalCluster::start(exe(), &spec).unwrap();
    let socket = cluster.socket(0).unwrap();
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let ssd = cluster.config.nodes[0]
        .ssd
        .as_ref()
        .unwrap()
        .directory
        .clone();
    assert_eq!(mode(&ssd), 0o700, "{}", ssd.display());
    assert_eq!(
        mode(&node_files(&cluster, 0)[1]),
        0o600,
        "the instance lock"
    );

    // A file over the bound is refused by its size, before it is read.
    let large = cluster.root.join("large");
    std::fs::File::create(&large)
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let put = ctl(&socket, &["put", large.to_str().unwrap(), "--key", "k"]);
    let reason = String::from_utf8_lossy(&put.stderr);
    assert!(!put.status.success(), "{put:?}");
    assert!(reason.contains("is 2147483648 bytes"), "{reason}");
    std::fs::remove_file(&large).unwrap();

    // A metrics address in use fails the start at once, naming it: the node creates no
    // pool, the directory formats nothing.
    let directory_metrics = common::metrics_of(&cluster, "directory");
    let node_metrics = common::metrics_of(&cluster, "node-a");
    cluster.stop_node(0).unwrap();
    let _taken = std::net::TcpListener::bind(node_metrics).unwrap();
    let output = run_to_exit(&["node", "--name", "node-a"], &cluster.config_path);
    let reason = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{reason}");
    assert!(
        reason.contains(&format!("binding the metrics address {node_metrics}")),
        "{reason}"
    );
    assert!(!reason.contains("pre-fault"), "{reason}");
    let output = run_to_exit(&["directory"], &cluster.config_path);
    let reason = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success()
            && reason.contains(&format!("binding the metrics address {directory_metrics}")),
        "{reason}"
    );
}

/// Sends SIGTERM to `cluster`'s directory and waits for it to exit.
fn terminate_directory(cluster: &mut LocalCluster) {
    send(cluster.directory_pid().unwrap(), libc::SIGTERM);
    eventually("the directory exits", || !cluster.directory_runs());
}

#[test]
fn the_directory_takes_a_node_stop_calmly_and_removes_its_cxl_pool_when_no_node_maps_it() {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        cxl_pool_bytes: 16 << 20,
        cxl_extent_bytes: 4 << 20,
        metrics: false,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    // A node still maps the pool: the directory keeps it (a restarted one finds it).
    let mut cluster = LocalCluster::start(exe(), &spec).unwrap();
    let cxl = cluster.config.cxl_pools[0].path.clone();
    terminate_directory(&mut cluster);
    let log = log_of(&cluster.root.join("directory.log"));
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(cxl.exists(), "{log}");
    drop(cluster);

    // The node stops first: no warning, and the pool it created goes with the directory.
    let mut cluster = LocalCluster::start(exe(), &spec).unwrap();
    let cxl = cluster.config.cxl_pools[0].path.clone();
    let log = cluster.root.join("directory.log");
    assert!(cluster.stop_node(0).unwrap().success());
    eventually("the directory sees the node go", || {
        log_of(&log).contains("node connection closed")
    });
    terminate_directory(&mut cluster);
    let log = log_of(&log);
    assert!(!log.contains("WARN"), "{log}");
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(!cxl.exists(), "{log}");
}

#[test]
fn a_node_refuses_a_tenant_its_cxl_pool_does_not_list() {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        cxl_pool_bytes: 32 << 20,
        cxl_extent_bytes: 4 << 20,
        metrics: false,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(exe(), &spec).unwrap();
    let socket = cluster.socket(0).unwrap();
    let log = cluster.root.join("node-a.log");
    let pid = cluster.node_pid(0).unwrap();
    let good = std::fs::read_to_string(&cluster.config_path).unwrap();
    let reloads = |log: &Path| log_of(log).matches("SIGHUP: reload").count();
    let rules = "\n[[tenants]]\nname = \"root\"\nuids = [0]\nnamespaces = [\"*\"]\n\n[[tenants]]\nname = \"other\"\nuids = [4242]\nnamespaces = [\"*\"]\n";

    // Both tenants may use the pool: root is served, and handed the CPU pool and the CXL
    // pool's file (no path to open).
    std::fs::write(&cluster.config_path, good.clone() + rules).unwrap();
    send(pid, libc::SIGHUP);
    eventually("the node logs its reload", || reloads(&log) == 1);
    assert!(ctl(&socket, &["probe", "--key", "k"]).status.success());
    let handed = common::runtime().block_on(async {
        let raw = tokio::net::UnixStream::connect(&socket).await.unwrap();
        kvtier_core::wire::handoff::receive(&raw, HANG_GUARD)
            .await
            .unwrap()
    });
    assert_eq!(handed.len(), 2, "{handed:?}");

    // The pool lists only the other tenant: root is refused by this node, saying why.
    let listed = good.replacen(
        "[[cxl_pools]]\n",
        "[[cxl_pools]]\ntenants = [\"other\"]\n",
        1,
    );
    assert_ne!(listed, good, "the cluster has a CXL pool section");
    std::fs::write(&cluster.config_path, listed + rules).unwrap();
    send(pid, libc::SIGHUP);
    eventually("the node logs its second reload", || reloads(&log) == 2);
    let refused = ctl(&socket, &["probe", "--key", "k"]);
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        reason.contains("tenant `root` may not use CXL pool `cxl0`"),
        "{reason}"
    );
    // It was handed no pool: neither the CPU pool nor the CXL pool's file.
    let handed = common::runtime().block_on(async {
        let raw = tokio::net::UnixStream::connect(&socket).await.unwrap();
        kvtier_core::wire::handoff::receive(&raw, HANG_GUARD)
            .await
            .unwrap()
    });
    assert!(handed.is_empty(), "{handed:?}");
}

/// `kvtier ctl put FILE --key KEY` of `bytes` bytes through node `socket`.
fn put_bytes(root: &Path, socket: &Path, key: &str, bytes: usize) -> Output {
    let file = root.join(format!("put-{key}"));
    let fill = key.bytes().fold(0u8, |sum, byte| sum.wrapping_add(byte));
    std::fs::write(&file, vec![fill; bytes]).unwrap();
    let put = ctl(socket, &["put", file.to_str().unwrap(), "--key", key]);
    std::fs::remove_file(&file).unwrap();
    put
}

#[test]
fn ctl_objects_take_the_tier_path_their_namespace_cost_sets_and_a_skip_says_why() {
    // Whole CXL extents of whole objects: the node's extents hold what the directory counts.
    const OBJECT_BYTES: usize = 1 << 20;
    let cheap = "\n[namespaces.\"kvtier-ctl\"]\nrecompute_us_per_mib = 0.001\n";
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 8 << 20,
        cxl_pool_bytes: 16 << 20,
        cxl_extent_bytes: 4 << 20,
        ssd_bytes: 32 << 20,
        ssd_admit_after_accesses: 1,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        // The extent the node's start-up probe gives back cools this long before it is
        // granted again.
        reservation_duration_ms: 2_000,
        extra_toml: cheap.into(),
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(exe(), &spec).unwrap();
    let socket = cluster.socket(0).unwrap();
    let node = common::metrics_of(&cluster, "node-a");
    let demoted = || common::scraped(node, "kvtier_bytes_moved_total{direction=\"demote\"}");
    let spilled = || common::scraped(node, "kvtier_ssd_spills_total");

    // Priced as nearly free to recompute, what the full CPU pool evicts is freed.
    for index in 0..16 {
        let put = put_bytes(
            &cluster.root,
            &socket,
            &format!("cheap-{index}"),
            OBJECT_BYTES,
        );
        assert!(put.status.success(), "{put:?}");
    }
    assert_eq!((demoted(), spilled()), (0.0, 0.0));

    // The operator raises the namespace's cost; a reload applies it at once.
    let text = std::fs::read_to_string(&cluster.config_path).unwrap();
    std::fs::write(
        &cluster.config_path,
        text.replace(
            "recompute_us_per_mib = 0.001",
            "recompute_us_per_mib = 100000.0",
        ),
    )
    .unwrap();
    let reload = operator(&cluster.config_path, &["reload"]);
    let said = String::from_utf8_lossy(&reload.stdout);
    assert!(reload.status.success(), "{reload:?}");
    assert!(
        said.contains("namespaces repriced [\"kvtier-ctl\"]"),
        "{said}"
    );

    // Now worth keeping: evicted from the CPU pool they move to CXL, and from there to SSD.
    for index in 0..48 {
        let put = put_bytes(
            &cluster.root,
            &socket,
            &format!("dear-{index}"),
            OBJECT_BYTES,
        );
        assert!(put.status.success(), "{put:?}");
    }
    eventually("ctl objects demoted into CXL and spilled to SSD", || {
        demoted() > 0.0 && spilled() > 0.0
    });

    // A store the node skips fails the command, saying why.
    let put = put_bytes(&cluster.root, &socket, "too-large", 40 << 20);
    let reason = String::from_utf8_lossy(&put.stderr);
    assert!(!put.status.success(), "{put:?}");
    assert!(
        reason.contains("skipped: it is larger than every pool the node may write"),
        "{reason}"
    );
    let shown = String::from_utf8_lossy(&put.stdout);
    assert!(shown.contains("skipped (too_large)"), "{shown}");
}

#[test]
fn a_full_cxl_pool_is_not_a_probe_failure() {
    // One extent, which the node's object holds: killed and started again, the node finds
    // none free (its earlier session keeps it until it is fenced).
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        cxl_pool_bytes: 4 << 20,
        cxl_extent_bytes: 4 << 20,
        write_order: vec![Medium::Cxl],
        metrics: false,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    let mut cluster = LocalCluster::start(exe(), &spec).unwrap();
    let socket = cluster.socket(0).unwrap();
    let put = put_bytes(&cluster.root, &socket, "in-cxl", 2 << 20);
    assert!(put.status.success(), "{put:?}");
    let probe = ctl(&socket, &["probe", "--key", "in-cxl"]);
    let shown = String::from_utf8_lossy(&probe.stdout);
    assert!(shown.contains("hit in cxl"), "{shown}");
    cluster.restart_node(0).unwrap();
    let log = log_of(&cluster.root.join("node-a.log"));
    assert!(!log.contains("probing the pool failed"), "{log}");
    assert!(!log.contains("WARN"), "{log}");
}

#[test]
fn a_drained_node_started_again_rejoins_under_a_new_epoch() {
    let mut cluster = small_cluster();
    let socket = cluster.socket(0).unwrap();
    let drained = operator(&cluster.config_path, &["drain", "node-a", "--wait"]);
    assert!(drained.status.success(), "{drained:?}");
    let mut exit = None;
    eventually("the drained node exits", || {
        exit = cluster.node_exit(0).unwrap();
        exit.is_some()
    });
    assert!(exit.unwrap().success(), "{exit:?}");

    // Started again, it opens a new session (epoch 2) and serves: a drain is a way out
    // for maintenance; removing the node's section is what keeps it out.
    cluster.start_node(0).unwrap();
    let status = ctl(&socket, &["status", "--json"]);
    let shown = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    let status: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let node = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["name"] == "node-a")
        .unwrap();
    assert_eq!(
        (node["state"].as_str(), node["epoch"].as_u64()),
        (Some("live"), Some(2)),
        "{shown}"
    );
    let put = put_bytes(&cluster.root, &socket, "after-drain", 64 << 10);
    assert!(put.status.success(), "{put:?}");

    // Its section removed and the file reloaded, it is drained again and then refused, even
    // started from a copy of the file that still names it (a host's stale copy).
    let text = std::fs::read_to_string(&cluster.config_path).unwrap();
    let stale = cluster.root.join("stale.toml");
    std::fs::write(&stale, &text).unwrap();
    let start = text.find("\n[[nodes]]\nname = \"node-a\"").unwrap();
    let end = text[start + 1..]
        .find("\n[[")
        .map_or(text.len(), |offset| start + 1 + offset);
    std::fs::write(
        &cluster.config_path,
        format!("{}{}", &text[..start], &text[end..]),
    )
    .unwrap();
    let reload = operator(&cluster.config_path, &["reload"]);
    let said = String::from_utf8_lossy(&reload.stdout);
    assert!(
        said.contains("removed (draining) [\"node-a\"]"),
        "{reload:?}"
    );
    eventually("the removed node exits, drained", || {
        exit = cluster.node_exit(0).unwrap();
        exit.is_some()
    });
    assert!(exit.unwrap().success(), "{exit:?}");
    let refused = run_to_exit(&["node", "--name", "node-a"], &stale);
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{reason}");
    assert!(
        reason.contains("peer `node-a` is not a node of this cluster"),
        "{reason}"
    );
}
