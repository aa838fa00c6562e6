//! `kvtier demo`: an embedded cluster (a directory and two nodes as processes on loopback,
//! real QUIC with mutual TLS, real shared-memory pools) replaying a conversation trace as
//! stores and loads of synthetic KV chunks whose bytes are verified on every load.
//!
//! Each request goes to one of the two nodes (as two engine instances would); its prompt's
//! 512-token blocks are chained into prefix digests; the longest cached run of blocks is
//! loaded into buffers poisoned first and checked byte for byte against each object's
//! content ([`crate::workload::chunk`]), and the rest is stored.

use crate::launch::{ClusterSpec, LocalCluster};
use crate::workload::histogram::Histogram;
use crate::workload::prefix::chain;
use crate::workload::trace::{self, Request};
use crate::workload::transfer::{load_cached_prefix, store_chunks, PrefixBuffers};
use anyhow::{bail, Context};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::metrics::scrape::{metric_value, scrape_metrics, wait_for_metrics};
use kvtier_core::model::demo_namespace;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Options of `kvtier demo`.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Mooncake-format trace; default: the bundled trace, else the embedded sample.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Requests to replay from the start of the trace.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Bytes of each block's synthetic KV chunk.
    #[arg(long, default_value_t = 64 << 10)]
    pub chunk_bytes: usize,
    /// Capacity of each node's CPU pool in bytes.
    #[arg(long, default_value_t = 256 << 20)]
    pub pool_bytes: u64,
    /// Capacity of the CXL pool both nodes share (an emulated device: a file under
    /// `/dev/shm` both node processes map), in bytes; 0 for none.
    #[arg(long, default_value_t = 512 << 20)]
    pub cxl_bytes: u64,
}

/// What the replay counted.
#[derive(Default)]
struct Tally {
    input_tokens: u64,
    hit_tokens: u64,
    chunks_stored: u64,
    chunks_loaded: u64,
    chunks_skipped: u64,
    bytes_moved: u64,
    transfer_time: Duration,
    load_latency: Histogram,
}

/// Runs the demo from this binary (`exe`).
pub fn run(exe: &Path, args: &DemoArgs) -> anyhow::Result<()> {
    let (source, requests) = trace::load(args.trace.as_deref())?;
    let requests = &requests[..args.requests.min(requests.len())];
    if requests.is_empty() {
        bail!("the trace has no requests");
    }
    println!(
        "kvtier demo: a directory and two nodes on loopback (QUIC + mutual TLS), {} MiB CPU pool per node, {} MiB CXL pool shared by both",
        args.pool_bytes >> 20,
        args.cxl_bytes >> 20
    );
    let spec = ClusterSpec {
        nodes: 2,
        cpu_pool_bytes: args.pool_bytes,
        cxl_pool_bytes: args.cxl_bytes,
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(exe, &spec)?;
    for (name, address) in cluster.metrics_addresses() {
        println!("  {name:<10} metrics at http://{address}/metrics");
    }
    println!(
        "replaying {} requests from {source} ({} KiB per 512-token block)",
        requests.len(),
        args.chunk_bytes >> 10
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let tally = runtime.block_on(replay(&cluster, requests, args.chunk_bytes))?;
    let elapsed = started.elapsed();
    print_summary(&tally, elapsed);
    print_local_hits(&cluster);
    drop(cluster);
    println!("cluster stopped; its files are removed");
    Ok(())
}

async fn replay(
    cluster: &LocalCluster,
    requests: &[Request],
    chunk_bytes: usize,
) -> anyhow::Result<Tally> {
    let clients = [
        Client::connect(&cluster.socket(0)?).await?,
        Client::connect(&cluster.socket(1)?).await?,
    ];
    let namespace = clients[0].register_namespace(demo_namespace()).await?;
    clients[1].register_namespace(demo_namespace()).await?;
    let mut tally = Tally::default();
    let mut buffers = PrefixBuffers::new(chunk_bytes);
    let progress = std::io::stderr().is_terminal();
    for (index, request) in requests.iter().enumerate() {
        let client = &clients[index % 2];
        let objects = chain(namespace, &request.hash_ids);
        let load_started = Instant::now();
        let (_, loaded) = load_cached_prefix(client, &objects, &mut buffers)
            .await
            .with_context(|| format!("request {index}"))?;
        if loaded > 0 {
            tally.load_latency.record(load_started.elapsed());
        }
        tally.transfer_time += load_started.elapsed();
        tally.input_tokens += u64::from(request.input_tokens);
        tally.hit_tokens += (loaded as u64 * 512).min(u64::from(request.input_tokens));
        tally.chunks_loaded += loaded as u64;
        tally.bytes_moved += (loaded * chunk_bytes) as u64;
        let store_started = Instant::now();
        let stored = store_chunks(client, &objects[loaded..], chunk_bytes);
        for outcome in stored.await? {
            match outcome {
                StoreOutcome::Stored => {
                    tally.chunks_stored += 1;
                    tally.bytes_moved += chunk_bytes as u64;
                }
                StoreOutcome::Skipped(_) => tally.chunks_skipped += 1,
                StoreOutcome::AlreadyPresent | StoreOutcome::Pending => {}
            }
        }
        tally.transfer_time += store_started.elapsed();
        if progress && index % 50 == 0 {
            eprint!(
                "\r  {index}/{} requests, token hit ratio {:.3}",
                requests.len(),
                tally.hit_tokens as f64 / tally.input_tokens.max(1) as f64
            );
            let _ = std::io::stderr().flush();
        }
    }
    if progress {
        eprintln!();
    }
    Ok(tally)
}

/// Each node's hits answered under its delegations, and its directory requests per hit,
/// from its metrics (waited for: a node publishes them every task interval).
fn print_local_hits(cluster: &LocalCluster) {
    const HIT: &str = "kvtier_lookups_total{result=\"hit\"}";
    for (name, address) in cluster.metrics_addresses() {
        if name == "directory" {
            continue;
        }
        // Published after the last hit: the gauge agrees with the counters.
        let settled = |body: &str| {
            let value = |name| metric_value(body, name).unwrap_or(0.0);
            let (hits, asked) = (value(HIT), value("kvtier_directory_hit_lookups_total"));
            let per_hit = value("kvtier_directory_requests_per_hit");
            hits == 0.0 || (per_hit * hits - asked).abs() < 0.5
        };
        let Some(body) = wait_for_metrics(address, Duration::from_secs(2), settled)
            .then(|| scrape_metrics(address).ok())
            .flatten()
        else {
            continue;
        };
        let value = |name| metric_value(&body, name).unwrap_or(0.0);
        println!(
            "  {name:<10} {:.0} of {:.0} hits answered by the node itself; {:.3} directory requests per hit ({:.0} lookups, {:.0} of them found a hit)",
            value("kvtier_local_hits_total"),
            value(HIT),
            value("kvtier_directory_requests_per_hit"),
            value("kvtier_directory_lookups_total"),
            value("kvtier_directory_hit_lookups_total"),
        );
    }
}

fn print_summary(tally: &Tally, elapsed: Duration) {
    let seconds = tally.transfer_time.as_secs_f64().max(1e-9);
    println!("summary");
    println!(
        "  token hit ratio        {:.3} ({} of {} prompt tokens from cache)",
        tally.hit_tokens as f64 / tally.input_tokens.max(1) as f64,
        tally.hit_tokens,
        tally.input_tokens
    );
    println!(
        "  chunks stored / loaded {} / {} ({} skipped: pools full)",
        tally.chunks_stored, tally.chunks_loaded, tally.chunks_skipped
    );
    println!(
        "  bytes moved            {:.2} GiB at {:.2} GB/s during transfers",
        tally.bytes_moved as f64 / f64::from(1 << 30),
        tally.bytes_moved as f64 / seconds / 1e9
    );
    println!(
        "  prefix probe+load      p50 {:.0} us, p99 {:.0} us, max {:.0} us over {} loads",
        tally.load_latency.quantile(0.5).as_secs_f64() * 1e6,
        tally.load_latency.quantile(0.99).as_secs_f64() * 1e6,
        tally.load_latency.max().as_secs_f64() * 1e6,
        tally.load_latency.count()
    );
    println!(
        "  every loaded byte verified; wall time {:.1} s",
        elapsed.as_secs_f64()
    );
}
