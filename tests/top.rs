//! `kvtier top` against a real local cluster under load: `--once --json` against the
//! directory's own usage, the live view in a real terminal (tmux: keys, screens, the
//! terminal given back), and the Grafana dashboard's queries against what the processes
//! export. Every wait polls a condition; a deadline is a hang guard only.

use kvtier_core::client::Client;
use kvtier_core::metrics::scrape::parse_samples;
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{ObjectId, PrefixDigest};
use kvtier_tools::launch::{scrape_metrics, wait_for_metrics, ClusterSpec, LocalCluster};
use kvtier_tools::workload::chunk;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CHUNK: usize = 64 << 10;
/// A node's CPU pool: 1024 chunks, about five seconds of the load before stores are
/// skipped (then loads of new objects miss, and the totals still hold).
const POOL_BYTES: u64 = 64 << 20;
/// Loops of the load at most, whatever happens to the test.
const LOAD_ROUNDS_MAX: u32 = 20_000;
/// Longest any wait may take before the test calls it hung.
const HANG_GUARD: Duration = Duration::from_secs(120);

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_kvtier"))
}

fn cluster() -> LocalCluster {
    let spec = ClusterSpec {
        nodes: 2,
        cpu_pool_bytes: POOL_BYTES,
        high_watermark_percent: 100,
        low_watermark_percent: 100,
        ..ClusterSpec::default()
    };
    LocalCluster::start(exe(), &spec).unwrap()
}

/// Stores and loads through node-a's socket until stopped: every round stores a new object
/// and loads it (a hit) and an absent one (a miss), so the hit ratio is one half while the
/// pool has room.
struct Load {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u32>>,
}

impl Load {
    fn start(socket: PathBuf) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let client = Client::connect(&socket).await.unwrap();
                let namespace = client.register_namespace(demo_namespace()).await.unwrap();
                let id = |index: u32| ObjectId {
                    namespace,
                    prefix: PrefixDigest::ROOT.chain(&[index]),
                    shard: 0,
                    part: 0,
                };
                let mut bytes = vec![0u8; CHUNK];
                let mut first = vec![0u8; CHUNK];
                let mut second = vec![0u8; CHUNK];
                let mut rounds = 0;
                while !flag.load(Ordering::Relaxed) && rounds < LOAD_ROUNDS_MAX {
                    let stored = id(rounds);
                    chunk::fill(&stored, &mut bytes);
                    client.store(stored, &bytes).await.unwrap();
                    let absent = id(1_000_000 + rounds);
                    client
                        .load_into(&[stored, absent], &mut [&mut first[..], &mut second[..]])
                        .await
                        .unwrap();
                    rounds += 1;
                    // Pacing, so the machine's two cores also run the view under test.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                rounds
            })
        });
        Load {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the load; returns its rounds.
    fn finish(mut self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Load {
    /// Stops the load and waits for it, before the cluster it uses goes away.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn top_json(cluster: &LocalCluster) -> serde_json::Value {
    let output = Command::new(exe())
        .args([
            "top",
            "--once",
            "--json",
            "--interval-ms",
            "1000",
            "--config",
        ])
        .arg(&cluster.config_path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

fn ctl_status(cluster: &LocalCluster) -> serde_json::Value {
    let output = Command::new(exe())
        .args(["ctl", "status", "--json", "--node", "node-a", "--config"])
        .arg(&cluster.config_path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn once_json_reports_nodes_pools_and_rates_with_the_directorys_totals() {
    let cluster = cluster();
    let load = Load::start(cluster.socket(0).unwrap());
    let report = top_json(&cluster);
    let nodes = report["nodes"].as_array().unwrap();
    let names: Vec<&str> = nodes
        .iter()
        .map(|node| node["name"].as_str().unwrap())
        .collect();
    // The benchmarks' peer has a certificate and a name here, never a session.
    assert_eq!(names, ["node-a", "node-b", "bench"]);
    assert!(nodes[..2]
        .iter()
        .all(|node| node["state"] == "live" && node["epoch"].as_u64() >= Some(1)));
    let a = &nodes[0]["rates"];
    assert!(a["loads_per_second"].as_f64().unwrap() > 0.0, "{report}");
    assert!(a["stores_per_second"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        a["bytes_per_second"]["load"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    let hit_ratio = a["hit_ratio"].as_f64().unwrap();
    assert!(hit_ratio > 0.2 && hit_ratio < 0.8, "{report}");
    assert!(a["latency_p99_seconds"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        report["cluster"]["rates"]["loads_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        report["unreachable"].as_array().unwrap().is_empty(),
        "{report}"
    );
    assert!(load.finish() > 0);

    // Quiet now: the totals are the sums of the directory's usage, pool by pool.
    let report = top_json(&cluster);
    let status = ctl_status(&cluster);
    let pools = status["pools"].as_array().unwrap();
    assert_eq!(report["pools"].as_array().unwrap().len(), pools.len());
    for (total, field) in [
        ("capacity_bytes", "capacity_bytes"),
        ("allocated_bytes", "allocated_bytes"),
        ("ready_bytes", "ready_bytes"),
        ("reserved_bytes", "reserved_bytes"),
        ("retiring_bytes", "retiring_bytes"),
    ] {
        let sum: u64 = pools
            .iter()
            .map(|pool| pool["usage"][field].as_u64().unwrap())
            .sum();
        assert_eq!(report["cluster"][total].as_u64(), Some(sum), "{total}");
    }
    assert!(report["cluster"]["allocated_bytes"].as_u64().unwrap() >= CHUNK as u64);
    assert_eq!(report["cluster"]["nodes_live"], 2);
}

#[test]
fn once_says_clearly_when_the_cluster_cannot_be_reached() {
    let mut cluster = cluster();
    cluster.stop();
    let output = Command::new(exe())
        .args(["top", "--once", "--config"])
        .arg(&cluster.config_path)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot reach the cluster"), "{stderr}");
    assert!(stderr.contains("node-a"), "{stderr}");
}

/// A tmux session running one command, killed when dropped.
struct Tmux {
    session: String,
}

impl Tmux {
    fn start(command: &str) -> Tmux {
        let session = format!("kvtier-top-{}", std::process::id());
        let status = Command::new("tmux")
            .args([
                "new-session",
                "-d",
                "-x",
                "200",
                "-y",
                "50",
                "-s",
                &session,
                command,
            ])
            .status()
            .expect("tmux is required (.ci/run installs it)");
        assert!(status.success());
        Tmux { session }
    }

    fn tmux(&self, args: &[&str]) -> String {
        let output = Command::new("tmux").args(args).output().unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", &self.session])
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", "-t", &self.session, keys]);
    }

    /// Polls the screen until `holds`; panics with the screen past [`HANG_GUARD`].
    fn wait_for(&self, what: &str, holds: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + HANG_GUARD;
        loop {
            let screen = self.screen();
            if holds(&screen) {
                return screen;
            }
            assert!(Instant::now() < until, "hung waiting for {what}:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.session])
            .status();
    }
}

/// The percentages on node-a's line of the nodes page, if it is on screen.
fn node_a_percentages(screen: &str) -> Vec<f64> {
    screen
        .lines()
        .find(|line| line.contains("node-a") && line.contains("live"))
        .map(|line| {
            line.split_whitespace()
                .filter_map(|word| word.strip_suffix('%'))
                .filter_map(|number| number.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_live_view_shows_the_cluster_switches_pages_and_gives_the_terminal_back() {
    let mut cluster = cluster();
    let load = Load::start(cluster.socket(0).unwrap());
    let command = format!(
        "{} top --config {}; echo \"top exited $?\"; stty -a; exec cat",
        exe().display(),
        cluster.config_path.display()
    );
    let tmux = Tmux::start(&command);
    let screen = tmux.wait_for("nodes with a hit ratio", |screen| {
        screen.contains("kvtier top")
            && screen.contains("node-b")
            && node_a_percentages(screen).iter().any(|ratio| *ratio > 0.0)
    });
    assert!(screen.contains("Nodes"), "{screen}");
    assert!(screen.contains("hit"), "{screen}");
    assert_eq!(
        tmux.tmux(&["display", "-p", "-t", &tmux.session, "#{alternate_on}"])
            .trim(),
        "1"
    );

    tmux.keys("Tab");
    let screen = tmux.wait_for("the pools page", |screen| {
        screen.contains("Pools") && screen.contains("node-a-cpu") && screen.contains("node-b-cpu")
    });
    assert!(screen.contains("page: pools"), "{screen}");
    tmux.keys("s");
    tmux.wait_for("pools sorted by use", |screen| {
        screen.contains("sort: used")
    });
    tmux.keys("n");
    tmux.wait_for("the nodes page again", |screen| {
        screen.contains("page: nodes")
    });

    // The directory goes away: the view says so, and keeps its keys.
    assert!(load.finish() > 0);
    cluster.kill_directory().unwrap();
    tmux.wait_for("the unreachable cluster's banner", |screen| {
        screen.contains("cannot reach the cluster")
    });

    tmux.keys("q");
    let screen = tmux.wait_for("top to exit and stty to print", |screen| {
        screen.contains("top exited") && screen.contains("icanon")
    });
    assert!(screen.contains("top exited 0"), "{screen}");
    // Canonical mode and echo are back, and the alternate screen is left.
    assert!(
        screen.contains(" icanon") && !screen.contains("-icanon"),
        "{screen}"
    );
    assert!(
        screen.contains(" echo ") && !screen.contains(" -echo "),
        "{screen}"
    );
    assert!(!screen.contains("page: nodes"), "{screen}");
    assert_eq!(
        tmux.tmux(&["display", "-p", "-t", &tmux.session, "#{alternate_on}"])
            .trim(),
        "0"
    );
}

/// Every `kvtier_*` family, each label name and each label's values, as exported.
type Exported = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn exported(cluster: &LocalCluster) -> Exported {
    let mut families = Exported::new();
    for (_, address) in cluster.metrics_addresses() {
        for sample in parse_samples(&scrape_metrics(address).unwrap()) {
            let labels = families.entry(sample.name).or_default();
            for (label, value) in sample.labels {
                labels.entry(label).or_default().insert(value);
            }
        }
    }
    families
}

/// A label matcher: label, operator (`=`, `!=`, `=~`, `!~`), value.
type Matcher = (String, String, String);

/// What a query uses: families with their matchers `(label, operator, value)`, and the
/// labels it groups or matches by.
#[derive(Debug, Default)]
struct Query {
    families: Vec<(String, Vec<Matcher>)>,
    grouping: Vec<String>,
}

fn identifier_end(text: &str) -> usize {
    text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len())
}

fn parse_query(expr: &str) -> Query {
    let mut query = Query::default();
    let mut rest = expr;
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        rest = &rest[start..];
        let end = identifier_end(rest);
        let word = &rest[..end];
        rest = &rest[end..];
        if ["by", "on", "without", "ignoring"].contains(&word) {
            let inside = rest.trim_start().strip_prefix('(').unwrap();
            let (labels, after) = inside.split_once(')').unwrap();
            query
                .grouping
                .extend(labels.split(',').map(|label| label.trim().to_owned()));
            rest = after;
        } else if word.starts_with("kvtier_") {
            let mut matchers = Vec::new();
            if let Some(inside) = rest.strip_prefix('{') {
                let (body, after) = inside.split_once('}').unwrap();
                for matcher in body.split(',') {
                    let end = identifier_end(matcher.trim());
                    let (label, condition) = matcher.trim().split_at(end);
                    let operator_end = condition.find('"').unwrap();
                    let value = condition[operator_end..].trim_matches('"');
                    matchers.push((
                        label.to_owned(),
                        condition[..operator_end].trim().to_owned(),
                        value.to_owned(),
                    ));
                }
                rest = after;
            }
            query.families.push((word.to_owned(), matchers));
        } else if let Some(after) = rest.strip_prefix('[') {
            // A range such as `[$__rate_interval]`.
            rest = after.split_once(']').unwrap().1;
        }
    }
    query
}

fn expressions(value: &serde_json::Value, found: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", serde_json::Value::String(expr)) => found.push(expr.clone()),
                    _ => expressions(value, found),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| expressions(item, found)),
        _ => {}
    }
}

#[test]
fn every_dashboard_query_uses_exported_families_and_labels() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("grafana/kvtier.json")).unwrap())
            .unwrap();
    assert_eq!(dashboard["title"], "kvtier");
    let mut queries = Vec::new();
    expressions(&dashboard["panels"], &mut queries);
    assert!(queries.len() >= 15, "{queries:?}");
    // The jobs Prometheus adds as `job`, as deploy/prometheus.yml names them.
    let jobs: BTreeSet<String> = std::fs::read_to_string(root.join("prometheus.yml"))
        .unwrap()
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- job_name:"))
        .map(|job| job.trim().to_owned())
        .collect();
    assert_eq!(jobs.len(), 2, "{jobs:?}");

    let cluster = cluster();
    let load = Load::start(cluster.socket(0).unwrap());
    let node_a = cluster.config.node("node-a").unwrap().metrics.unwrap();
    assert!(wait_for_metrics(node_a, HANG_GUARD, |body| {
        parse_samples(body)
            .iter()
            .any(|sample| sample.name == "kvtier_lookups_total" && sample.value > 0.0)
    }));
    assert!(load.finish() > 0);
    let families = exported(&cluster);
    let mut families_used = BTreeSet::new();
    for expr in &queries {
        let query = parse_query(expr);
        assert!(!query.families.is_empty(), "no family in {expr}");
        let mut labels_here: BTreeSet<&str> = ["job", "instance"].into();
        for (family, matchers) in &query.families {
            families_used.insert(family.clone());
            let labels = families
                .get(family)
                .unwrap_or_else(|| panic!("{family} is not exported (in {expr})"));
            labels_here.extend(labels.keys().map(String::as_str));
            for (label, operator, value) in matchers {
                let values: BTreeSet<String> = match label.as_str() {
                    "job" => jobs.clone(),
                    _ => labels
                        .get(label)
                        .unwrap_or_else(|| panic!("{family} has no label {label} (in {expr})"))
                        .clone(),
                };
                if operator == "=" || operator == "=~" {
                    for alternative in value.split('|') {
                        assert!(
                            values.contains(alternative),
                            "{family}{{{label}}} never is {alternative:?} (in {expr}); it is {values:?}"
                        );
                    }
                }
            }
        }
        for label in &query.grouping {
            assert!(
                labels_here.contains(label.as_str()),
                "no family of {expr} has {label}"
            );
        }
    }
    // The views of `kvtier top` are all there.
    for family in [
        "kvtier_lookups_total",
        "kvtier_bytes_moved_total",
        "kvtier_request_duration_seconds_bucket",
        "kvtier_pool_bytes",
        "kvtier_pool_capacity_bytes",
        "kvtier_evictions_total",
        "kvtier_expirations_total",
        "kvtier_sessions",
    ] {
        assert!(
            families_used.contains(family),
            "the dashboard does not show {family}"
        );
    }
}
