//! The `kvtier` command: directory, node, demo, up, bench, replay and certs.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use kvtier::bench;

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
    /// Run benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Directory throughput: in-process core, or over QUIC against a cluster.
    Directory(DirectoryBenchArgs),
}

#[derive(Args)]
struct DirectoryBenchArgs {
    /// Measure the directory core in this process (no network).
    #[arg(long)]
    in_process: bool,
    /// Directory sizes, in objects.
    #[arg(long, value_delimiter = ',', default_value = "100000,10000000")]
    objects: Vec<u64>,
    /// Seed of the object ids and lookup order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench {
            which: BenchCommand::Directory(args),
        } => bench_directory(&args),
    }
}

fn bench_directory(args: &DirectoryBenchArgs) -> anyhow::Result<()> {
    let report = bench::directory::run_in_process(&args.objects, args.seed, !args.json)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).context("encoding the report")?
        );
        return Ok(());
    }
    println!(
        "{:>10} {:>16} {:>16} {:>18} {:>16} {:>8} {:>10} {:>10}",
        "objects",
        "reserve+commit/s",
        "probe keys/s",
        "acquire+release/s",
        "bare index/s",
        "ratio",
        "B/object",
        "table B/obj"
    );
    for size in &report.sizes {
        println!(
            "{:>10} {:>16.0} {:>16.0} {:>18.0} {:>16.0} {:>8.2} {:>10.1} {:>10.1}",
            size.objects,
            size.reserve_commit_per_s,
            size.probe_keys_per_s,
            size.acquire_release_per_s,
            size.bare_index_lookups_per_s,
            size.probe_ratio_to_bare_index,
            size.bytes_per_object,
            size.table_bytes_per_object
        );
    }
    Ok(())
}
