//! `kvtier ctl put|get|probe|locate`: objects by key, through a node's Unix socket with
//! [`kvtier_core::client::Client`], exactly as an engine stores and loads.
//!
//! A key names one object: in the ctl namespace ([`ctl_namespace`], model `kvtier-ctl`,
//! salted by the node with the caller's tenant salt like any namespace), with the prefix
//! digest of the key's bytes (`PrefixDigest::ROOT.chain`, one token per byte), shard 0,
//! part 0. The same key from two tenants with different salts is two objects.
//!
//! Its objects are priced by their bytes, not their one token
//! ([`kvtier_core::directory::CTL_RECOMPUTE_US_PER_MIB`], or `[namespaces."kvtier-ctl"]` of
//! `cluster.toml`), so they move down the tiers as an engine's chunks of their size would.

use anyhow::{bail, Context};
use clap::Args;
use kvtier_core::client::{Client, ClientError, StoreOutcome};
use kvtier_core::config::ClusterConfig;
use kvtier_core::directory::{AcquireMode, ProbeOutcome, OBJECT_BYTES_MAX};
use kvtier_core::model::{KvDtype, NamespaceDescriptor, ObjectId, PrefixDigest};
use serde_json::json;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest key, in bytes.
pub const KEY_BYTES_MAX: usize = 4096;
/// The largest object `ctl put` stores (one read into memory): 1 GiB, under the
/// directory's [`OBJECT_BYTES_MAX`].
pub const CTL_OBJECT_BYTES_MAX: u64 = 1 << 30;
const _: () = assert!(CTL_OBJECT_BYTES_MAX <= OBJECT_BYTES_MAX);

/// How long `ctl put` asks again while its store is skipped for a passing reason
/// ([`kvtier_core::client::StoreSkip::is_transient`]: room being made, the directory out of reach).
pub const PUT_RETRY_WAIT: Duration = Duration::from_secs(5);
/// The pause between two asks of `ctl put`.
const PUT_ROOM_RETRY: Duration = Duration::from_millis(50);

/// Which node to talk to, and how to print.
#[derive(Args, Clone, Debug)]
pub struct Target {
    /// The node's Unix socket.
    #[arg(long, conflicts_with_all = ["config", "node"])]
    socket: Option<PathBuf>,
    /// The cluster's configuration, to find the socket of `--node`.
    #[arg(long, requires = "node")]
    config: Option<PathBuf>,
    /// The node's name in `--config`.
    #[arg(long, requires = "config")]
    node: Option<String>,
    /// Print one JSON object (also for a refusal, with its kind) instead of text.
    #[arg(long)]
    json: bool,
}

/// `kvtier ctl put FILE --key K`.
#[derive(Args, Clone, Debug)]
pub struct PutArgs {
    /// The file whose bytes are stored.
    file: PathBuf,
    #[arg(long)]
    key: String,
    #[command(flatten)]
    target: Target,
}

/// `kvtier ctl get --key K --out FILE`.
#[derive(Args, Clone, Debug)]
pub struct GetArgs {
    #[arg(long)]
    key: String,
    /// Where the object's bytes are written.
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    target: Target,
}

/// `kvtier ctl probe --key K`.
#[derive(Args, Clone, Debug)]
pub struct ProbeArgs {
    #[arg(long)]
    key: String,
    #[command(flatten)]
    target: Target,
}

/// `kvtier ctl locate --key K1 --key K2 ...`.
#[derive(Args, Clone, Debug)]
pub struct LocateArgs {
    /// The keys, in prefix order (repeat `--key`).
    #[arg(long = "key", required = true)]
    keys: Vec<String>,
    #[command(flatten)]
    target: Target,
}

/// Keys one `ctl locate` asks about at most (the directory's default batch bound).
pub const LOCATE_KEYS_MAX: usize = 4096;

/// The namespace of objects stored by `kvtier ctl`: opaque bytes (one `int8` "element"
/// per byte), in a geometry no model has.
pub fn ctl_namespace() -> NamespaceDescriptor {
    NamespaceDescriptor {
        model: kvtier_core::directory::CTL_MODEL.into(),
        revision: "1".into(),
        adapter: None,
        kv_dtype: KvDtype::Int8,
        quantization: None,
        layers: 1,
        kv_heads: 1,
        head_dim: 1,
        block_tokens: 1,
        format_version: 1,
        chunk_tokens: 1,
        tensor_parallel: 1,
        pipeline_parallel: 1,
        salt: None,
    }
}

/// The prefix digest of a key: its bytes chained from the root, one token per byte.
pub fn key_digest(key: &str) -> PrefixDigest {
    let tokens: Vec<u32> = key.bytes().map(u32::from).collect();
    PrefixDigest::ROOT.chain(&tokens)
}

/// Stores the file under the key. A store the node skips fails the command with the
/// reason; one skipped for a passing reason is asked again for up to [`PUT_RETRY_WAIT`].
pub fn put(args: &PutArgs) -> anyhow::Result<()> {
    let file = std::fs::File::open(&args.file)
        .with_context(|| format!("opening {}", args.file.display()))?;
    // Refused by its size before a byte is read; the bounded read below covers what has
    // no size (a pipe) or grows meanwhile.
    let size = file
        .metadata()
        .with_context(|| format!("reading the size of {}", args.file.display()))?;
    if size.is_file() && !(1..=CTL_OBJECT_BYTES_MAX).contains(&size.len()) {
        bail!(
            "{} is {} bytes; an object is 1 byte to {CTL_OBJECT_BYTES_MAX} bytes",
            args.file.display(),
            size.len()
        );
    }
    let mut bytes = Vec::new();
    file.take(CTL_OBJECT_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", args.file.display()))?;
    if bytes.is_empty() || bytes.len() as u64 > CTL_OBJECT_BYTES_MAX {
        bail!("an object is 1 byte to {CTL_OBJECT_BYTES_MAX} bytes");
    }
    with_object(
        &args.key,
        &args.target,
        false,
        |client, object| async move {
            // A full pool is making room (its evictions and demotions started with the
            // skip): ask again, for a bounded time, as an engine's next store would.
            let deadline = tokio::time::Instant::now() + PUT_RETRY_WAIT;
            let outcome = loop {
                match client.store(object, &bytes).await? {
                    StoreOutcome::Skipped(skip)
                        if skip.is_transient() && tokio::time::Instant::now() < deadline =>
                    {
                        tokio::time::sleep(PUT_ROOM_RETRY).await;
                    }
                    outcome => break outcome,
                }
            };
            let outcome = match outcome {
                StoreOutcome::Stored => "stored",
                StoreOutcome::AlreadyPresent => "already_present",
                StoreOutcome::Pending => "pending",
                StoreOutcome::Skipped(skip) => {
                    return Ok(json!({
                        "outcome": "skipped",
                        "reason": skip.label(),
                        "message": format!("skipped: {skip}"),
                        "bytes": bytes.len(),
                    }))
                }
            };
            Ok(json!({ "outcome": outcome, "bytes": bytes.len() }))
        },
    )
}

/// Loads the key's object into the output file; a miss is an error.
pub fn get(args: &GetArgs) -> anyhow::Result<()> {
    let out = args.out.clone();
    with_object(&args.key, &args.target, true, |client, object| async move {
        let views = client.load(&[object], AcquireMode::Each).await?;
        let Some(Some(view)) = views.into_iter().next() else {
            return Ok(json!({ "outcome": "miss" }));
        };
        let bytes = view.bytes()?.to_vec();
        if !view.is_valid() {
            return Ok(json!({ "outcome": "miss" }));
        }
        client.release(&[view.into_lease()]).await?;
        std::fs::write(&out, &bytes)
            .map_err(|error| ClientError::Unexpected(format!("{}: {error}", out.display())))?;
        Ok(json!({ "outcome": "hit", "bytes": bytes.len() }))
    })
}

/// Says whether the key's object is cached where the node can read it.
pub fn probe(args: &ProbeArgs) -> anyhow::Result<()> {
    with_object(
        &args.key,
        &args.target,
        false,
        |client, object| async move {
            let outcome = client.probe(&[object]).await?.into_iter().next();
            Ok(match outcome {
                Some(ProbeOutcome::Hit {
                    medium,
                    length_bytes,
                }) => json!({ "outcome": "hit", "medium": medium.name(), "bytes": length_bytes }),
                Some(ProbeOutcome::Pending) => json!({ "outcome": "pending" }),
                Some(ProbeOutcome::OnSsd { length_bytes }) => {
                    json!({ "outcome": "on_ssd", "bytes": length_bytes })
                }
                _ => json!({ "outcome": "miss" }),
            })
        },
    )
}

/// Says, for each node, how many of the keys' objects (in order, from the first) it can
/// load without a network transfer.
pub fn locate(args: &LocateArgs) -> anyhow::Result<()> {
    if args.keys.len() > LOCATE_KEYS_MAX {
        bail!("at most {LOCATE_KEYS_MAX} keys");
    }
    with_objects(
        &args.keys,
        &args.target,
        false,
        |client, objects| async move {
            let runs = client.locate(&objects).await?;
            Ok(json!({ "outcome": "located", "runs": runs }))
        },
    )
}

/// Connects, registers the ctl namespace, and runs `act` on the key's object; prints the
/// result (with the key and object) and fails on a refusal, or on a miss when
/// `miss_fails` (a get's miss is a failure, a probe's an answer).
fn with_object<F, Fut>(key: &str, target: &Target, miss_fails: bool, act: F) -> anyhow::Result<()>
where
    F: FnOnce(Client, ObjectId) -> Fut,
    Fut: std::future::Future<Output = Result<serde_json::Value, ClientError>>,
{
    with_objects(
        std::slice::from_ref(&key.to_string()),
        target,
        miss_fails,
        |client, objects| async move {
            let object = objects[0];
            let mut report = act(client, object).await?;
            report["object"] = json!(format!("{object:?}"));
            Ok(report)
        },
    )
}

/// [`with_object`] for several keys (at least one), `act` getting their objects in order.
fn with_objects<F, Fut>(
    keys: &[String],
    target: &Target,
    miss_fails: bool,
    act: F,
) -> anyhow::Result<()>
where
    F: FnOnce(Client, Vec<ObjectId>) -> Fut,
    Fut: std::future::Future<Output = Result<serde_json::Value, ClientError>>,
{
    if keys.is_empty() {
        bail!("no key given");
    }
    if keys
        .iter()
        .any(|key| key.is_empty() || key.len() > KEY_BYTES_MAX)
    {
        bail!("a key is 1 to {KEY_BYTES_MAX} bytes");
    }
    let socket = target.socket()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let client = Client::connect(&socket).await?;
        let namespace = client.register_namespace(ctl_namespace()).await?;
        let objects = keys
            .iter()
            .map(|key| ObjectId {
                namespace,
                prefix: key_digest(key),
                shard: 0,
                part: 0,
            })
            .collect();
        act(client, objects).await
    });
    let key = keys.join(",");
    let key = key.as_str();
    let mut report = match result {
        Ok(report) => report,
        Err(error) => {
            let kind = match &error {
                ClientError::Refused(refusal) => refusal.label(),
                ClientError::Wire(_) => "unreachable",
                ClientError::Pool { .. } => "pool",
                ClientError::Unexpected(_) => "unexpected",
                ClientError::LeaseExpired => "lease_expired",
            };
            json!({ "error": kind, "message": error.to_string() })
        }
    };
    report["key"] = json!(key);
    let failed = report.get("error").is_some()
        || report["outcome"] == "skipped"
        || miss_fails && report["outcome"] == "miss";
    if target.json {
        println!("{report}");
    } else {
        print_text(&report);
    }
    if failed {
        bail!("{}", report["message"].as_str().unwrap_or("not cached"));
    }
    Ok(())
}

fn print_text(report: &serde_json::Value) {
    let field = |name: &str| report[name].as_str().map(str::to_string);
    match (field("error"), field("outcome")) {
        (Some(kind), _) => println!(
            "{}: refused ({kind}): {}",
            report["key"],
            field("message").unwrap_or_default()
        ),
        (None, Some(outcome)) if outcome == "located" => {
            let runs = report["runs"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            if runs.is_empty() {
                println!("{}: no node holds the first key", report["key"]);
            }
            for run in runs {
                println!(
                    "{}: {} of the keys (cpu {}, cxl {}, ssd {})",
                    run["node"].as_str().unwrap_or_default(),
                    run["chunks"],
                    run["cpu"],
                    run["cxl"],
                    run["ssd"]
                );
            }
        }
        (None, Some(outcome)) => {
            let mut line = format!("{}: {outcome}", report["key"]);
            if let Some(medium) = field("medium") {
                line.push_str(&format!(" in {medium}"));
            }
            if let Some(reason) = field("reason") {
                line.push_str(&format!(" ({reason})"));
            }
            if let Some(bytes) = report["bytes"].as_u64() {
                line.push_str(&format!(", {bytes} bytes"));
            }
            if let Some(object) = field("object") {
                line.push_str(&format!(" ({object})"));
            }
            println!("{line}");
        }
        (None, None) => println!("{report}"),
    }
}

impl Target {
    /// The socket named, or the one of `--node` in `--config`.
    fn socket(&self) -> anyhow::Result<PathBuf> {
        match (&self.socket, &self.config, &self.node) {
            (Some(socket), _, _) => Ok(socket.clone()),
            (None, Some(config), Some(node)) => {
                let config = ClusterConfig::load(Path::new(config))?;
                Ok(config.node(node)?.socket.clone())
            }
            _ => bail!("name the node: --socket PATH, or --config FILE --node NAME"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_distinct_stable_objects_in_a_valid_namespace() {
        assert!(ctl_namespace().id().is_ok());
        assert_eq!(key_digest("a"), key_digest("a"));
        assert_ne!(key_digest("a"), key_digest("b"));
        assert_ne!(key_digest("ab"), key_digest("a"));
    }
}
