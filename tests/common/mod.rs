//! Helpers shared by the integration tests that drive a local cluster of real processes.
//! Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use kvtier_core::client::Client;
use kvtier_core::directory::AcquireMode;
use kvtier_core::model::demo_namespace;
use kvtier_core::model::{NamespaceId, ObjectId, PrefixDigest};
use kvtier_tools::launch::{metric_value, scrape_metrics, LocalCluster};
use kvtier_tools::workload::chunk;
use std::net::SocketAddr;

/// A single-threaded runtime for a test's client calls.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Object `index` of a test (`tag` keeps tests' objects apart) and its `bytes` of content,
/// derived from its id so a load can be checked byte for byte.
pub fn object(namespace: NamespaceId, index: u32, tag: u32, bytes: usize) -> (ObjectId, Vec<u8>) {
    let id = ObjectId {
        namespace,
        prefix: PrefixDigest::ROOT.chain(&[index, tag]),
        shard: 0,
        part: 0,
    };
    let mut content = vec![0u8; bytes];
    chunk::fill(&id, &mut content);
    (id, content)
}

/// Loads every object through `client` in one call and compares it with its content; the
/// number of hits. A load never fails with an error (a missing directory is a miss).
pub async fn verified_hits(client: &Client, objects: &[(ObjectId, Vec<u8>)]) -> usize {
    let ids: Vec<ObjectId> = objects.iter().map(|(id, _)| *id).collect();
    let views = client
        .load(&ids, AcquireMode::Each)
        .await
        .expect("a load never fails with an error");
    let mut hits = 0;
    for (view, (id, bytes)) in views.iter().zip(objects) {
        if let Some(view) = view {
            assert_eq!(view.bytes().unwrap(), &bytes[..], "wrong bytes for {id:?}");
            hits += 1;
        }
    }
    hits
}

/// Stores every object through `client`, each `Stored`, and checks all are hits.
pub async fn store_all(client: &Client, objects: &[(ObjectId, Vec<u8>)]) {
    for (id, bytes) in objects {
        assert_eq!(
            client.store(*id, bytes).await.unwrap(),
            kvtier_core::client::StoreOutcome::Stored
        );
    }
    assert_eq!(verified_hits(client, objects).await, objects.len());
}

/// A client of node `index` with the demo namespace registered.
pub async fn connect(cluster: &LocalCluster, index: usize) -> (Client, NamespaceId) {
    let client = Client::connect(&cluster.socket(index).unwrap())
        .await
        .unwrap();
    let namespace = client.register_namespace(demo_namespace()).await.unwrap();
    (client, namespace)
}

/// The metrics address of process `name` (`directory` or a node's name).
pub fn metrics_of(cluster: &LocalCluster, name: &str) -> SocketAddr {
    cluster
        .metrics_addresses()
        .into_iter()
        .find(|(process, _)| process == name)
        .map(|(_, address)| address)
        .unwrap()
}

/// The value of `metric` at `address` (0 when the series is absent).
pub fn scraped(address: SocketAddr, metric: &str) -> f64 {
    let body = scrape_metrics(address).unwrap();
    metric_value(&body, metric).unwrap_or(0.0)
}

/// Sends `signal` (`-STOP`, `-CONT`, `-KILL`) to process `pid`.
pub fn signal(pid: &str, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Makes each test body `fn name(netns: bool)` named here into a module `name` of two
/// tests: `on_loopback` (every process shares loopback) and `between_hosts` (each node in a
/// network namespace of its own; skipped, saying why, where this process cannot make them).
#[macro_export]
macro_rules! on_loopback_and_between_hosts {
    ($($body:ident),+ $(,)?) => {$(
        mod $body {
            #[test]
            fn on_loopback() {
                super::$body(false);
            }

            #[test]
            fn between_hosts() {
                if let Some(reason) = kvtier_tools::launch::network_namespaces_unavailable() {
                    println!(
                        "SKIPPED: {}: no network namespaces here: {reason}",
                        stringify!($body)
                    );
                    return;
                }
                super::$body(true);
            }
        }
    )+};
}

/// Runs `kvtier ctl ARGS --socket SOCKET`: an engine's or the node owner's request.
pub fn ctl(socket: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("ctl")
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap()
}

/// Runs `kvtier ctl ARGS --config CONFIG`: an operator's request, under the cluster's
/// operator certificate.
pub fn operator(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("ctl")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap()
}
