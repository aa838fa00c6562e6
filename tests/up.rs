//! `kvtier up` end to end, and the removal promises of a local cluster: on Ctrl-C (SIGINT)
//! `up` stops and removes its folder and pool files, and a start that fails early leaves
//! neither its folder nor its network namespaces behind. Every wait is on a condition; the
//! deadlines are hang guards only.

use kvtier_core::client::Client;
use kvtier_tools::launch::{network_namespaces_unavailable, ClusterSpec, LocalCluster};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// Longest any step may take before the test calls it hung. Nothing waits for it to pass.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_kvtier"))
}

/// An empty folder of this test alone, used as the `TMPDIR` of a `kvtier up`.
fn scratch(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("kvtier-up-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    path
}

fn entries(folder: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(folder)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect()
}

/// The lines a child prints on stdout, as they come.
fn lines_of(child: &mut Child) -> Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// Waits for the child to exit; panics (after killing it) past the hang guard.
fn wait_for_exit(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kvtier up did not exit within {HANG_GUARD:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ctrl_c_stops_up_and_removes_its_folder_and_pool_files() {
    let tmp = scratch("ctrl-c");
    let mut up = Command::new(exe())
        .args(["up", "--pool-bytes", &(16u64 << 20).to_string()])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(&mut up);
    // `up` prints its socket, its metrics, then its folder: wait for all of it.
    let deadline = Instant::now() + HANG_GUARD;
    let (mut socket, mut root, mut top) = (None, None, None);
    let mut printed = Vec::new();
    while root.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = lines.recv_timeout(left) else {
            let _ = up.kill();
            panic!("kvtier up never printed its folder; it printed {printed:#?}");
        };
        if let Some(path) = line.strip_prefix("  local clients connect to ") {
            socket = Some(PathBuf::from(path));
        }
        if let Some(command) = line.strip_prefix("  watch it with: kvtier ") {
            top = command.split(" (").next().map(str::to_string);
        }
        if let Some(rest) = line.strip_prefix("  configuration and logs in ") {
            root = rest.split("; ").next().map(PathBuf::from);
        }
        printed.push(line);
    }
    let (socket, root) = (socket.expect("no socket printed"), root.unwrap());
    assert!(
        root.starts_with(&tmp),
        "{} is not under TMPDIR",
        root.display()
    );
    // It serves: a client says hello on the printed socket and maps the node's pool.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        Client::connect(&socket).await.unwrap();
    });
    // The `top` command it printed watches this cluster.
    let top = top.expect("no top command printed");
    let watched = Command::new(exe())
        .args(top.split(' '))
        .args(["--once", "--json"])
        .output()
        .unwrap();
    assert!(watched.status.success(), "{top}: {watched:?}");
    let report: serde_json::Value = serde_json::from_slice(&watched.stdout).unwrap();
    // `kvtier top` alone, where there is no ./cluster.toml, finds this `up`.
    let alone = Command::new(exe())
        .args(["top", "--once", "--json"])
        .env("TMPDIR", &tmp)
        .current_dir(&tmp)
        .output()
        .unwrap();
    assert!(alone.status.success(), "{alone:?}");
    let found: serde_json::Value = serde_json::from_slice(&alone.stdout).unwrap();
    assert_eq!(
        found["nodes"][0]["name"], report["nodes"][0]["name"],
        "{found}"
    );
    // Only what runs: one node and its pool, no benchmark peer.
    assert_eq!(
        report["nodes"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    assert_eq!(
        report["pools"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    let text = Command::new(exe())
        .args(top.split(' '))
        .arg("--once")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("16.0 MiB") && !text.contains("16777216"),
        "sizes in binary units: {text}"
    );

    // SAFETY: kill(2) on a child we spawned and have not reaped.
    assert_eq!(unsafe { libc::kill(up.id() as i32, libc::SIGINT) }, 0);
    let status = wait_for_exit(&mut up);
    let rest: Vec<String> = lines.iter().collect();
    assert!(
        status.success(),
        "kvtier up exited with {status}: {rest:#?}"
    );
    assert!(
        rest.iter()
            .any(|line| line == "stopped; removed what was created"),
        "{rest:#?}"
    );
    assert!(!root.exists(), "{} is left", root.display());
    assert!(!socket.exists(), "{} is left", socket.display());
    assert_eq!(entries(&tmp), Vec::<PathBuf>::new(), "left in TMPDIR");
    std::fs::remove_dir(&tmp).unwrap();
}

#[test]
fn a_start_that_fails_early_removes_its_folder() {
    let tmp = scratch("early");
    // A pool smaller than a page is refused when the configuration is read, after the
    // folder and the certificates were written.
    let output = Command::new(exe())
        .args(["up", "--pool-bytes", "4096"])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a zero-byte pool started");
    assert!(stderr.contains("capacity"), "{stderr}");
    assert!(!stderr.contains("could not remove"), "{stderr}");
    assert_eq!(entries(&tmp), Vec::<PathBuf>::new(), "left in TMPDIR");
    std::fs::remove_dir(&tmp).unwrap();
}

#[test]
fn a_start_that_fails_early_removes_its_network_namespaces() {
    const NAME: &str = "a_start_that_fails_early_removes_its_network_namespaces";
    if let Some(reason) = network_namespaces_unavailable() {
        println!("SKIPPED: {NAME}: no network namespaces here: {reason}");
        return;
    }
    let spec = ClusterSpec {
        netns: true,
        nodes: 2,
        // Refused when the configuration is read, after the namespaces were created.
        cpu_pool_bytes: 0,
        ..ClusterSpec::default()
    };
    let Err(error) = LocalCluster::start(exe(), &spec) else {
        panic!("a zero-byte pool started");
    };
    assert!(format!("{error}").contains("capacity"), "{error}");
    assert_eq!(error.not_removed, Vec::<String>::new());
    assert!(!error.root.exists(), "{} is left", error.root.display());
    // The namespaces are named after the cluster's folder: kvtier-<tag>-<node>.
    let prefix = format!("{}-", error.root.file_name().unwrap().to_str().unwrap());
    let left: Vec<PathBuf> = std::fs::read_dir("/run/netns")
        .map(|listing| {
            listing
                .map(|entry| entry.unwrap().path())
                .filter(|path| {
                    path.file_name()
                        .and_then(|name| name.to_str())
                        .is_some_and(|name| name.starts_with(&prefix))
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(left, Vec::<PathBuf>::new(), "network namespaces left");
}
