//! The `kvtier` command: directory, node, demo, up, bench, replay, ctl, top and certs. The
//! binary's `main` and the Python package's `kvtier` script both call [`run`].

use crate::launch::{ClusterSpec, LocalCluster};
use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kvtier_core::config::ClusterConfig;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "kvtier",
    version,
    about = "A distributed, hardware-aware KV-cache tier for LLM inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the directory (metadata authority) of a cluster.
    Directory {
        #[arg(long, default_value = "cluster.toml")]
        config: PathBuf,
        /// Listen here instead of `[directory] listen`: a standby's address (one of
        /// `[directory] standbys`).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Serve metrics here instead of `[directory] metrics`.
        #[arg(long)]
        metrics: Option<std::net::SocketAddr>,
    },
    /// Run a node (one per host): its CPU pool, its session, its local clients.
    Node {
        #[arg(long, default_value = "cluster.toml")]
        config: PathBuf,
        /// This node's name in the configuration (and its certificate's).
        #[arg(long)]
        name: String,
    },
    /// Start a directory and two nodes on loopback and replay a conversation trace.
    Demo(crate::demo::DemoArgs),
    /// Start a directory and one node with built-in defaults until Ctrl-C.
    Up(UpArgs),
    /// Replay a Mooncake-format trace through kvtier's policy and baselines (metadata only).
    Replay(crate::replay::ReplayArgs),
    /// Run the seeded simulation of the whole cluster (directory, nodes, clients, a faulty
    /// network, crashes and restarts) and check every invariant after every step.
    Sim(crate::sim::SimArgs),
    /// Measure this host's tiers as a node's start-up probe does and print them as
    /// `[profiles.*]` sections for cluster.toml.
    Probe(ProbeArgs),
    /// Run benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
    /// Operate a running cluster through a node's socket: objects by key, status, reload
    /// and drain.
    Ctl {
        #[command(subcommand)]
        which: crate::ctl::CtlCommand,
    },
    /// A live terminal view of the whole cluster (nodes, pools, hit ratio, traffic,
    /// latency), refreshed every second; `--once --json` prints one report for scripts.
    Top(crate::top::TopArgs),
    /// Manage the cluster's certificates.
    Certs {
        #[command(subcommand)]
        which: CertsCommand,
    },
}

#[derive(Args)]
struct UpArgs {
    /// CPU pool capacity in bytes; default: a quarter of available memory, at most 4 GiB.
    #[arg(long)]
    pool_bytes: Option<u64>,
}

#[derive(Args)]
struct ProbeArgs {
    /// Folder of a memory file system to map a scratch CPU pool in.
    #[arg(long, default_value = "/dev/shm")]
    memory_dir: PathBuf,
    /// Folder on the SSD to probe with direct I/O (a scratch file, removed after).
    #[arg(long)]
    ssd: Option<PathBuf>,
    /// Bytes of the SSD scratch file.
    #[arg(long, default_value_t = 256 << 20)]
    ssd_bytes: u64,
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Create a cluster CA and a certificate for each name.
    Init {
        /// Folder to write into.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// The directory's and every node's name.
        #[arg(long, value_delimiter = ',', required = true)]
        names: Vec<String>,
        /// Replace an existing CA (every certificate must then be redistributed).
        #[arg(long)]
        force: bool,
        /// Days the certificates are valid.
        #[arg(long, default_value_t = kvtier_core::wire::certs::LEAF_VALIDITY_DAYS_DEFAULT)]
        days: u32,
    },
    /// Issue (or renew) certificates signed by the existing cluster CA.
    Issue {
        /// Folder of the cluster CA (`ca.pem`, `ca/ca.key`).
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// Names to issue certificates for.
        #[arg(long, value_delimiter = ',', required = true)]
        names: Vec<String>,
        /// Days the certificates are valid.
        #[arg(long, default_value_t = kvtier_core::wire::certs::LEAF_VALIDITY_DAYS_DEFAULT)]
        days: u32,
    },
    /// Retire a certificate: the directory refuses it from its next connection on.
    Retire {
        /// Folder the directory reads its certificates from.
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// Name whose current certificate (`NAME.pem`) is retired.
        #[arg(long)]
        name: String,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Directory throughput: the in-process core, or over QUIC against a local cluster.
    Directory(crate::bench::directory::DirectoryBenchArgs),
    /// Store and load through the client into a node's CPU pool, against memcpy.
    Data(crate::bench::data::DataBenchArgs),
    /// Cross-node loads from a shared CXL pool against memcpy, and a pressure run.
    Cxl(crate::bench::cxl::CxlBenchArgs),
    /// Replication on demand from a node's CPU pool into shared CXL, against memcpy.
    Replicate(crate::bench::replicate::ReplicateBenchArgs),
    /// The SSD store's spill and restore against raw direct I/O on the same disk.
    Ssd(crate::bench::ssd::SsdBenchArgs),
    /// A local cluster under verified load while the directory and nodes are killed.
    Chaos(crate::bench::chaos::ChaosBenchArgs),
    /// Node-to-node transfer over the peer QUIC endpoint against TLS over TCP.
    Peer(crate::bench::peer::PeerBenchArgs),
    /// One client process of `bench chaos` (started by it).
    #[command(hide = true)]
    ChaosClient(crate::bench::chaos_client::ChaosClientArgs),
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVTIER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// The environment variable naming the command that runs kvtier again, for the processes
/// `up`, `demo` and the benchmarks start (the Python package's script sets it; absent, this
/// executable).
pub const SELF_ENV: &str = "KVTIER_EXE";

/// Runs the command line `args` (the program's name first) as the `kvtier` binary does.
/// `--help`, `--version` and a malformed line print and end the process, as clap does.
pub fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> anyhow::Result<()> {
    let cli = Cli::parse_from(args);
    let exe = match std::env::var_os(SELF_ENV) {
        Some(named) => PathBuf::from(named),
        None => std::env::current_exe().context("locating this binary")?,
    };
    match cli.command {
        Command::Directory {
            config: path,
            listen,
            metrics,
        } => {
            init_tracing();
            let config = ClusterConfig::load(&path)?;
            let addresses =
                kvtier_core::actors::directory::process::Addresses::of(&config, listen, metrics);
            actix_rt::System::new().block_on(kvtier_core::actors::directory::process::run(
                config, &path, addresses,
            ))
        }
        Command::Node { config: path, name } => {
            init_tracing();
            let config = ClusterConfig::load(&path)?;
            actix_rt::System::new().block_on(kvtier_core::actors::node::process::run(
                config, &path, &name,
            ))
        }
        Command::Demo(args) => crate::demo::run(&exe, &args),
        Command::Up(args) => up(&exe, &args),
        Command::Replay(args) => crate::replay::run(&exe, &args),
        Command::Sim(args) => crate::sim::run(&args),
        Command::Probe(args) => probe(&args),
        Command::Bench {
            which: BenchCommand::Directory(args),
        } => crate::bench::directory::run(&exe, &args),
        Command::Bench {
            which: BenchCommand::Data(args),
        } => crate::bench::data::run(&exe, &args),
        Command::Bench {
            which: BenchCommand::Cxl(args),
        } => crate::bench::cxl::run(&exe, &args),
        Command::Bench {
            which: BenchCommand::Ssd(args),
        } => crate::bench::ssd::run(&args),
        Command::Bench {
            which: BenchCommand::Replicate(args),
        } => crate::bench::replicate::run(&exe, &args),
        Command::Bench {
            which: BenchCommand::Chaos(args),
        } => crate::bench::chaos::run(&exe, &args),
        Command::Bench {
            which: BenchCommand::Peer(args),
        } => crate::bench::peer::run(&args),
        Command::Bench {
            which: BenchCommand::ChaosClient(args),
        } => crate::bench::chaos_client::run(&args),
        Command::Ctl { which } => crate::ctl::run(which),
        Command::Top(args) => crate::top::run(&args),
        Command::Certs { which } => certs(which),
    }
}

fn certs(command: CertsCommand) -> anyhow::Result<()> {
    use kvtier_core::wire::certs;
    match command {
        CertsCommand::Init {
            dir,
            names,
            force,
            days,
        } => {
            certs::create_ca(&dir, force)?;
            certs::issue_certificates(&dir, &names, days)?;
            println!(
                "wrote the cluster CA and {} certificates (valid {days} days) to {}; the CA key is in {} — keep it off the hosts",
                names.len(),
                dir.display(),
                certs::ca_key_directory(&dir).display()
            );
        }
        CertsCommand::Issue { dir, names, days } => {
            certs::issue_certificates(&dir, &names, days)?;
            println!(
                "issued {} certificates (valid {days} days) in {}",
                names.len(),
                dir.display()
            );
        }
        CertsCommand::Retire { dir, name } => {
            if certs::retire_certificate(&dir, &name)? {
                println!("retired the certificate of `{name}`: the directory refuses it from its next connection");
            } else {
                println!("the certificate of `{name}` was already retired");
            }
        }
    }
    Ok(())
}

fn probe(args: &ProbeArgs) -> anyhow::Result<()> {
    use kvtier_core::backends::probe::{probe_disk, probe_memory, ProbeRegion, MEMORY_PROBE_BYTES};
    let path = args
        .memory_dir
        .join(format!("kvtier-probe-{}", std::process::id()));
    let memory =
        kvtier_core::backends::SharedMemory::create(&path, MEMORY_PROBE_BYTES, 0, 64 << 10)
            .with_context(|| format!("mapping a scratch pool at {}", path.display()));
    let _ = std::fs::remove_file(&path);
    let region = ProbeRegion {
        offset: 0,
        length: MEMORY_PROBE_BYTES,
    };
    print_profile("cpu", &probe_memory(&memory?, region)?);
    if let Some(directory) = &args.ssd {
        print_profile("ssd", &probe_disk(directory, args.ssd_bytes)?);
    }
    Ok(())
}

fn print_profile(medium: &str, measured: &kvtier_core::policy::profiles::Measurement) {
    println!("[profiles.{medium}]");
    println!(
        "read_latency_us = {:.3}",
        measured.read_latency_ns as f64 / 1e3
    );
    println!(
        "read_bandwidth_bytes_per_s = {:.3e}",
        measured.read_bandwidth_bytes_per_s as f64
    );
    if let Some(write) = measured.write_bandwidth_bytes_per_s {
        println!("write_bandwidth_bytes_per_s = {:.3e}", write as f64);
    }
}

/// Cap of the default pool size of `kvtier up`: pre-faulting takes about a second per GiB
/// here, and a connector developer needs a working cache, not the whole machine.
const UP_POOL_BYTES_MAX: u64 = 1 << 30;

fn up(exe: &std::path::Path, args: &UpArgs) -> anyhow::Result<()> {
    let pool_bytes = args
        .pool_bytes
        .unwrap_or_else(|| (available_memory_bytes() / 4).clamp(64 << 20, UP_POOL_BYTES_MAX));
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: pool_bytes & !((64 << 10) - 1),
        bench_peer: false,
        ..ClusterSpec::default()
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (stopped_sender, stopped) = std::sync::mpsc::channel();
    let signal_flag = stop.clone();
    std::thread::spawn(move || {
        let waited = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|runtime| runtime.block_on(kvtier_core::actors::process::shutdown_signal()));
        if let Ok(Err(error)) | Err(error) = waited.map_err(anyhow::Error::from) {
            eprintln!("cannot wait for signals: {error}");
        }
        signal_flag.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = stopped_sender.send(());
    });
    println!(
        "kvtier up: starting a directory and one node ({} MiB CPU pool, pre-faulting)",
        spec.cpu_pool_bytes >> 20
    );
    let cluster = match LocalCluster::start_cancellable(exe, &spec, &stop) {
        Ok(cluster) => cluster,
        Err(error) if error.cancelled && error.not_removed.is_empty() => {
            println!("stopped during start-up; removed what was created");
            return Ok(());
        }
        // The error names what could not be removed, if anything.
        Err(error) => return Err(error.into()),
    };
    println!(
        "  local clients connect to {}",
        cluster.socket(0)?.display()
    );
    for (name, address) in cluster.metrics_addresses() {
        println!("  {name:<10} metrics at http://{address}/metrics");
    }
    // Removed with the folder when `up` stops.
    std::fs::write(
        cluster.root.join(crate::top::UP_MARKER),
        format!("{}\n", std::process::id()),
    )?;
    println!(
        "  watch it with: kvtier top --config {} (or `kvtier top` alone)",
        cluster.config_path.display()
    );
    println!(
        "  configuration and logs in {}; press Ctrl-C to stop and remove them",
        cluster.root.display()
    );
    let _ = stopped.recv();
    let not_removed = cluster.shutdown();
    anyhow::ensure!(
        not_removed.is_empty(),
        "stopped, but could not remove: {}",
        not_removed.join("; ")
    );
    println!("stopped; removed what was created");
    Ok(())
}

/// `MemAvailable` from `/proc/meminfo`, or 1 GiB where unknown.
fn available_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("MemAvailable:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kibibytes| kibibytes.parse::<u64>().ok())
        })
        .map_or(1 << 30, |kibibytes| kibibytes << 10)
}
