//! The engine side of `kvtier bench chaos`: one client process that loads a random key of a
//! shared key space through its node, verifies every byte of a hit, and stores the key
//! where it missed, until its standard input closes; then it prints its counts as one JSON
//! line. A node killed under it is a lost connection: the client reconnects (counted), it
//! is not a failure. Any other error of a store or a load is.

use crate::workload::chunk;
use kvtier_core::client::{Client, ClientError, StoreOutcome};
use kvtier_core::directory::AcquireMode;
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{NamespaceId, ObjectId, PrefixDigest};
use kvtier_core::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a client waits before connecting again to a node that went away.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(50);

/// Options of the client process (`kvtier bench chaos-client`, started by `bench chaos`).
#[derive(Clone, Debug, clap::Args)]
pub struct ChaosClientArgs {
    /// The node's Unix socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// Keys of the shared key space.
    #[arg(long, default_value_t = 1024)]
    pub keys: u32,
    #[arg(long, default_value_t = 64 << 10)]
    pub chunk_bytes: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// What one client did.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClientCounts {
    pub loads_verified: u64,
    pub corrupt_loads: u64,
    /// Views whose lease ran out before the bytes were compared (not checked).
    pub expired_views: u64,
    pub misses: u64,
    pub stores: u64,
    pub skipped_stores: u64,
    /// Errors of a store other than a skip or a lost connection.
    pub failed_stores: u64,
    /// Errors of a load other than a lost connection.
    pub failed_loads: u64,
    pub reconnects: u64,
}

/// The object of `key` in the benchmark's key space.
pub fn key_object(namespace: NamespaceId, key: u32) -> ObjectId {
    ObjectId {
        namespace,
        prefix: PrefixDigest::ROOT.chain(&[key, 0x6368_616f]),
        shard: 0,
        part: 0,
    }
}

/// Runs the client until standard input closes, then prints its counts.
pub fn run(args: &ChaosClientArgs) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let watched = stop.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        watched.store(true, Ordering::Relaxed);
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let counts = runtime.block_on(drive(args, &stop));
    println!("{}", serde_json::to_string(&counts)?);
    Ok(())
}

async fn drive(args: &ChaosClientArgs, stop: &AtomicBool) -> ClientCounts {
    let mut counts = ClientCounts::default();
    let mut random = SplitMix64::new(args.seed);
    let mut buffer = vec![0u8; args.chunk_bytes];
    while !stop.load(Ordering::Relaxed) {
        let Some((client, namespace)) = connect(&args.socket, stop).await else {
            break;
        };
        while !stop.load(Ordering::Relaxed) {
            let object = key_object(namespace, random.below(u64::from(args.keys)) as u32);
            if !step(&client, object, &mut buffer, &mut counts).await {
                counts.reconnects += 1;
                break;
            }
        }
    }
    counts
}

/// Connects (again) until the node answers or the run stops.
async fn connect(socket: &Path, stop: &AtomicBool) -> Option<(Client, NamespaceId)> {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(client) = Client::connect(socket).await {
            if let Ok(namespace) = client.register_namespace(demo_namespace()).await {
                return Some((client, namespace));
            }
        }
        tokio::time::sleep(RECONNECT_BACKOFF).await;
    }
    None
}

/// One load, and a store where it missed. False when the connection was lost.
async fn step(
    client: &Client,
    object: ObjectId,
    buffer: &mut [u8],
    counts: &mut ClientCounts,
) -> bool {
    match client.load(&[object], AcquireMode::Each).await {
        Ok(views) => match views.first().and_then(Option::as_ref) {
            Some(view) => {
                match view.bytes() {
                    Ok(bytes) if chunk::verify(&object, bytes).is_ok() => {
                        counts.loads_verified += 1
                    }
                    // Compared after the lease ended: the pages may be reused, not checked.
                    _ if !view.is_valid() => counts.expired_views += 1,
                    _ => counts.corrupt_loads += 1,
                }
                return true;
            }
            None => counts.misses += 1,
        },
        Err(error) if lost(&error) => return false,
        Err(error) => {
            tracing::warn!(%error, "chaos load failed");
            counts.failed_loads += 1;
            return true;
        }
    }
    chunk::fill(&object, buffer);
    counts.stores += 1;
    match client.store(object, buffer).await {
        Ok(StoreOutcome::Skipped(_)) => counts.skipped_stores += 1,
        Ok(_) => {}
        Err(error) if lost(&error) => return false,
        Err(error) => {
            tracing::warn!(%error, "chaos store failed");
            counts.failed_stores += 1;
        }
    }
    true
}

/// Whether `error` means the node went away (killed): the client reconnects.
fn lost(error: &ClientError) -> bool {
    matches!(error, ClientError::Wire(_))
}
