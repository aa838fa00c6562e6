//! A prefix-locality router on kvtier's `locate`: each request of the bundled production
//! trace goes to the node that can load the longest run of its prompt's chunks without a
//! transfer (nodes tied for it, and cold prompts, in turn), against plain round robin, on a local
//! cluster of four nodes with DRAM pools only (no shared CXL pool: a chunk one node cached
//! is a miss on the others). Each node "serves" its requests as an engine would: it loads
//! the leading run of chunks kvtier has for it and stores the rest. Prints the token hit
//! ratio of both policies, the loaded bytes checked.
//!
//!     cargo build --release && cargo run --release --example locality_router -- \
//!         [--requests N] [--chunk-bytes B] [--pool-mib M]

use anyhow::{bail, Context};
use kvtier_core::client::{Client, StoreOutcome};
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{Medium, NamespaceId, ObjectId};
use kvtier_tools::launch::{ClusterSpec, LocalCluster};
use kvtier_tools::workload::prefix::chain;
use kvtier_tools::workload::trace::{self, Request};
use std::path::PathBuf;

const NODES: usize = 4;

/// How requests are sent to nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    RoundRobin,
    Locality,
}

struct Options {
    requests: usize,
    chunk_bytes: usize,
    pool_bytes: u64,
}

fn main() -> anyhow::Result<()> {
    let options = options()?;
    let exe = kvtier_exe()?;
    let (name, mut requests) = trace::load(None)?;
    requests.truncate(options.requests);
    let tokens: u64 = requests.iter().map(|r| u64::from(r.input_tokens)).sum();
    println!(
        "{} requests of {name} ({tokens} prompt tokens), {NODES} nodes of {} MiB DRAM each, \
         {} KiB a chunk",
        requests.len(),
        options.pool_bytes >> 20,
        options.chunk_bytes >> 10
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut ratios = Vec::new();
    for policy in [Policy::RoundRobin, Policy::Locality] {
        let spec = ClusterSpec {
            nodes: NODES,
            cpu_pool_bytes: options.pool_bytes,
            // Pages of 4 KiB: a chunk takes what it needs, not a 64 KiB page.
            page_bytes: 4 << 10,
            write_order: vec![Medium::Cpu],
            ..ClusterSpec::default()
        };
        let cluster = LocalCluster::start(&exe, &spec)?;
        let (hit, total) = runtime.block_on(replay(&cluster, &requests, policy, &options))?;
        let ratio = hit as f64 / total.max(1) as f64;
        println!("{policy:?}: token hit ratio {ratio:.3} ({hit} of {total} prompt tokens)");
        ratios.push(ratio);
    }
    println!(
        "{{\"requests\": {}, \"nodes\": {NODES}, \"round_robin_hit_ratio\": {:.4}, \
         \"locality_hit_ratio\": {:.4}}}",
        requests.len(),
        ratios[0],
        ratios[1]
    );
    Ok(())
}

/// Replays `requests` under `policy`: the tokens of leading chunks loaded, and all tokens.
async fn replay(
    cluster: &LocalCluster,
    requests: &[Request],
    policy: Policy,
    options: &Options,
) -> anyhow::Result<(u64, u64)> {
    let mut clients: Vec<(Client, NamespaceId)> = Vec::new();
    for node in 0..NODES {
        let client = Client::connect(&cluster.socket(node)?).await?;
        let namespace = client.register_namespace(demo_namespace()).await?;
        clients.push((client, namespace));
    }
    let names: Vec<String> = (0..NODES).map(kvtier_tools::launch::node_name).collect();
    let (mut hit, mut total) = (0u64, 0u64);
    for (index, request) in requests.iter().enumerate() {
        let objects = chain(clients[0].1, &request.hash_ids);
        let node = match policy {
            Policy::RoundRobin => index % NODES,
            Policy::Locality => {
                // The router asks any node; the directory answers for all of them.
                let runs = clients[index % NODES].0.locate(&objects).await?;
                // The longest run wins; nodes tied with it take turns (a prefix every node
                // holds, such as a shared system prompt, must not pin all traffic to one).
                let longest = runs.first().map_or(0, |best| best.chunks);
                let tied: Vec<usize> = runs
                    .iter()
                    .filter(|run| run.chunks == longest)
                    .filter_map(|run| names.iter().position(|name| *name == run.node))
                    .collect();
                if tied.is_empty() {
                    index % NODES
                } else {
                    tied[index % tied.len()]
                }
            }
        };
        let loaded = serve(&clients[node].0, &objects, options.chunk_bytes).await?;
        hit += (0..loaded)
            .map(|position| u64::from(request.block_tokens(position)))
            .sum::<u64>();
        total += u64::from(request.input_tokens);
    }
    Ok((hit, total))
}

/// What a node does with a request: loads the leading run kvtier holds (checking every
/// byte), stores the chunks after it. Returns the chunks loaded.
async fn serve(client: &Client, objects: &[ObjectId], chunk_bytes: usize) -> anyhow::Result<usize> {
    let mut buffers = vec![vec![0u8; chunk_bytes]; objects.len()];
    let mut targets: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    let found = client.load_into(objects, &mut targets).await?;
    let run = found.iter().take_while(|hit| **hit).count();
    for (object, buffer) in objects.iter().zip(&buffers).take(run) {
        if *buffer != content(object, chunk_bytes) {
            bail!("loaded bytes of {object:?} differ from the stored ones");
        }
    }
    let rest: Vec<(ObjectId, Vec<u8>)> = objects[run..]
        .iter()
        .map(|object| (*object, content(object, chunk_bytes)))
        .collect();
    let items: Vec<(ObjectId, &[u8])> = rest
        .iter()
        .map(|(object, bytes)| (*object, bytes.as_slice()))
        .collect();
    for outcome in client.store_many(&items).await {
        match outcome {
            Ok(
                StoreOutcome::Stored
                | StoreOutcome::AlreadyPresent
                | StoreOutcome::Pending
                | StoreOutcome::Skipped(_),
            ) => {}
            Err(error) => bail!("a store failed: {error}"),
        }
    }
    Ok(run)
}

/// A chunk's bytes, derived from its id: any node can check what it loads.
fn content(object: &ObjectId, chunk_bytes: usize) -> Vec<u8> {
    object
        .prefix
        .0
        .iter()
        .copied()
        .cycle()
        .take(chunk_bytes)
        .collect()
}

fn options() -> anyhow::Result<Options> {
    let mut options = Options {
        requests: 2000,
        chunk_bytes: 16 << 10,
        pool_bytes: 256 << 20,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value: u64 = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?
            .parse()
            .with_context(|| format!("{flag} takes a number"))?;
        match flag.as_str() {
            "--requests" => options.requests = value as usize,
            "--chunk-bytes" => options.chunk_bytes = value.max(1) as usize,
            "--pool-mib" => options.pool_bytes = value.max(1) << 20,
            other => bail!("unknown option {other} (--requests, --chunk-bytes, --pool-mib)"),
        }
    }
    Ok(options)
}

/// `$KVTIER_BIN`, else the release (then debug) build of this repository.
fn kvtier_exe() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("KVTIER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    ["release", "debug"]
        .iter()
        .map(|profile| root.join("target").join(profile).join("kvtier"))
        .find(|path| path.is_file())
        .context("no kvtier binary: run cargo build --release first, or set KVTIER_BIN")
}
