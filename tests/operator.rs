//! An operator's day, over real processes, real signals and real files: a misspelled key
//! refused at start and on reload, naming its line and the nearest known key.
//! Waits are on conditions; a deadline is a hang guard only ([`HANG_GUARD`]).

use kvtier::launch::{ClusterSpec, LocalCluster};
use std::path::Path;
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

/// Runs `kvtier ctl ARGS --socket SOCKET`.
fn ctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(exe())
        .arg("ctl")
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap()
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
    let socket = cluster.socket(0).unwrap();
    let good = std::fs::read_to_string(&cluster.config_path).unwrap();
    let typo = good.replacen("domains = ", "domain = ", 1);
    let line = line_starting(&typo, "domain = ");
    let expected =
        format!("line {line}: unknown key `domain` in [nodes]; the nearest known key is `domains`");

    std::fs::write(&cluster.config_path, &typo).unwrap();
    let refused = ctl(&socket, &["reload"]);
    assert!(!refused.status.success(), "{refused:?}");
    let reason = String::from_utf8_lossy(&refused.stderr);
    assert!(reason.contains(&expected), "{reason}");

    // Neither process starts from it (a file of its own beside the cluster's).
    let broken = cluster.root.join("typo.toml");
    std::fs::write(&broken, &typo).unwrap();
    for args in [&["directory"][..], &["node", "--name", "node-0"]] {
        let output = run_to_exit(args, &broken);
        assert!(!output.status.success(), "{args:?} started");
        let reason = String::from_utf8_lossy(&output.stderr);
        assert!(reason.contains(&expected), "{args:?}: {reason}");
    }

    // A missing field names its line too.
    let missing = good.replacen("socket = ", "# socket = ", 1);
    std::fs::write(&broken, &missing).unwrap();
    let output = run_to_exit(&["node", "--name", "node-0"], &broken);
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
    let reloaded = ctl(&socket, &["reload"]);
    assert!(reloaded.status.success(), "{reloaded:?}");
}
