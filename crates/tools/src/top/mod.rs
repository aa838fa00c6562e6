//! `kvtier top`: a live terminal view of the whole cluster, refreshed every second, from
//! what the cluster already exports. `model` computes (pure), `view` holds the page and
//! sort the keys choose, `render` draws, `terminal` owns the terminal, `collect` reads the
//! cluster. `--once` prints one report (`--json` as one JSON object) for scripts.

pub mod collect;
pub mod model;
pub mod render;
pub mod terminal;
pub mod view;

use anyhow::Context;
use clap::Args;
use collect::Source;
use model::{Report, Snapshot};
use render::Screen;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use terminal::{Input, TerminalGuard};
use view::{Action, ViewState};

/// Longest wait between looks at the stop flag (signals), so a SIGTERM ends the view at once
/// whatever the refresh interval.
const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// Shortest refresh interval accepted: each refresh asks the directory and every exporter.
const INTERVAL_MS_MIN: u64 = 100;

/// `kvtier top`.
#[derive(Args, Clone, Debug)]
pub struct TopArgs {
    /// The cluster's configuration: node sockets (for the status) and metrics addresses.
    /// Default: `./cluster.toml`, or else that of a running `kvtier up` of this user.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The node whose socket to ask for the cluster status; default: the first that answers.
    #[arg(long)]
    pub node: Option<String>,
    /// Refresh interval, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Print one report (rates over one interval) and exit.
    #[arg(long)]
    pub once: bool,
    /// With `--once`: print the report as one JSON object.
    #[arg(long, requires = "once")]
    pub json: bool,
}

/// Runs `kvtier top`.
pub fn run(args: &TopArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.interval_ms >= INTERVAL_MS_MIN,
        "--interval-ms must be at least {INTERVAL_MS_MIN}"
    );
    let interval = Duration::from_millis(args.interval_ms);
    let config = match &args.config {
        Some(config) => config.clone(),
        None => default_config()?,
    };
    let mut source = Source::open(config, args.node.clone())?;
    let first = source
        .snapshot()
        .context("cannot reach the cluster (is it running, and is this its configuration?)")?;
    if args.once {
        return once(&mut source, first, interval, args.json);
    }
    anyhow::ensure!(
        std::io::stdout().is_terminal(),
        "kvtier top draws on a terminal; use --once (or --once --json) otherwise"
    );
    live(&mut source, first, interval)
}

/// Two snapshots an interval apart, printed as one report.
fn once(
    source: &mut Source,
    first: Snapshot,
    interval: Duration,
    json: bool,
) -> anyhow::Result<()> {
    // The interval is what the rates are measured over, not a wait for a condition.
    std::thread::sleep(interval);
    let second = source.snapshot().context("the cluster went out of reach")?;
    let report = Report::compute(Some(&first), &second);
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_text(&report);
    }
    Ok(())
}

/// The live view until a key or signal ends it; the terminal is restored however it ends.
fn live(source: &mut Source, first: Snapshot, interval: Duration) -> anyhow::Result<()> {
    let stop = terminal::stop_signal()?;
    let mut guard = TerminalGuard::enter()?;
    let mut state = ViewState::default();
    let mut report = Report::compute(None, &first);
    let mut last = first;
    let mut error: Option<String> = None;
    let mut next_refresh = Instant::now() + interval;
    loop {
        let screen = Screen {
            report: Some(&report),
            error: error.as_deref(),
            state: &state,
            refresh_seconds: interval.as_secs_f64(),
        };
        guard.terminal.draw(|frame| render::draw(frame, &screen))?;
        // Wait for the refresh, a key that changes the view, or a stop.
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= next_refresh {
                break;
            }
            match terminal::next_input((next_refresh - now).min(SIGNAL_CHECK_INTERVAL))? {
                Input::Key(key) => match state.handle(key) {
                    Action::Quit => return Ok(()),
                    Action::Redraw => break,
                    Action::Nothing => {}
                },
                Input::Resized => break,
                Input::Nothing => {}
            }
        }
        if Instant::now() < next_refresh {
            continue;
        }
        next_refresh = Instant::now() + interval;
        match source.snapshot() {
            Ok(snapshot) => {
                report = Report::compute(Some(&last), &snapshot);
                last = snapshot;
                error = None;
            }
            Err(failure) => error = Some(format!("{failure:#}")),
        }
    }
}

/// Entries of the temporary folder looked at for a running `kvtier up`, at most.
const UP_SCAN_ENTRIES_MAX: usize = 4096;

/// `./cluster.toml` when there is one, else the configuration of the most recent running
/// `kvtier up` of this user (its folder under the temporary folder holds an `up` file with
/// its PID, see [`UP_MARKER`]).
fn default_config() -> anyhow::Result<PathBuf> {
    let local = PathBuf::from("cluster.toml");
    if local.exists() {
        return Ok(local);
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let temporary = std::env::temp_dir();
    let found = std::fs::read_dir(&temporary)
        .with_context(|| format!("reading {}", temporary.display()))?
        .take(UP_SCAN_ENTRIES_MAX)
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("kvtier-"))
        .filter_map(|entry| {
            use std::os::unix::fs::MetadataExt;
            let marker = entry.path().join(UP_MARKER);
            let metadata = std::fs::metadata(&marker).ok()?;
            let pid: i32 = std::fs::read_to_string(&marker).ok()?.trim().parse().ok()?;
            // SAFETY: kill(2) with signal 0 only checks that the process exists.
            let alive = unsafe { libc::kill(pid, 0) } == 0;
            (metadata.uid() == uid && alive).then(|| (metadata.modified().ok(), entry.path()))
        })
        .max();
    match found {
        Some((_, root)) => Ok(root.join("cluster.toml")),
        None => anyhow::bail!(
            "no ./cluster.toml and no running `kvtier up` of this user; say --config FILE"
        ),
    }
}

/// The file a running `kvtier up` keeps in its folder, holding its PID, so that `kvtier top`
/// finds it.
pub const UP_MARKER: &str = "up";

/// The report as plain text (`--once` without `--json`), sizes in binary units.
fn print_text(report: &Report) {
    let bytes = |count: u64| render::bytes(count as f64);
    let cluster = &report.cluster;
    let rates = &cluster.rates;
    let percent = |ratio: Option<f64>| ratio.map_or("-".into(), |r| format!("{:.1}%", r * 100.0));
    println!(
        "cluster: {}/{} nodes live, {} pools, {} of {} allocated; hit {} (all {}), {:.1} loads/s, {:.1} stores/s over {:.1} s",
        cluster.nodes_live,
        cluster.nodes,
        cluster.pools,
        bytes(cluster.usage.allocated_bytes),
        bytes(cluster.usage.capacity_bytes),
        percent(rates.hit_ratio),
        percent(rates.hit_ratio_total),
        rates.loads_per_second,
        rates.stores_per_second,
        report.interval_seconds
    );
    for node in &report.nodes {
        println!(
            "node {:<16} epoch {:>4} {:<9} hit {:>6} (all {:>6}) {:>9.1} loads/s {:>9.1} stores/s",
            node.name,
            node.epoch,
            node.state,
            percent(node.rates.hit_ratio),
            percent(node.rates.hit_ratio_total),
            node.rates.loads_per_second,
            node.rates.stores_per_second
        );
    }
    for pool in &report.pools {
        println!(
            "pool {:<20} {:<4} {:<12} capacity {:>14} allocated {:>14} ready {:>14} reserved {:>12}",
            pool.name,
            pool.medium,
            pool.scope,
            bytes(pool.usage.capacity_bytes),
            bytes(pool.usage.allocated_bytes),
            bytes(pool.usage.ready_bytes),
            bytes(pool.usage.reserved_bytes)
        );
    }
    for unreachable in &report.unreachable {
        println!("metrics not read: {unreachable}");
    }
}
