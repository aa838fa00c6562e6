//! Locality for routers on a real cluster: `kvtier ctl locate` and `Client::locate` through a
//! node's socket, the node forwarding to the directory over QUIC, the directory answering
//! from its index which node can load how much of a prefix without a transfer.

mod common;

use common::{connect, ctl, runtime, store_all};
use kvtier_core::directory::NodeRun;
use kvtier_core::model::{ObjectId, PrefixDigest};
use kvtier_tools::launch::{ClusterSpec, LocalCluster};
use std::path::Path;

fn two_nodes() -> LocalCluster {
    let spec = ClusterSpec {
        nodes: 2,
        cpu_pool_bytes: 16 << 20,
        suspect_after_ms: 3_000,
        fence_after_ms: 600_000,
        ..ClusterSpec::default()
    };
    LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap()
}

fn put(cluster: &LocalCluster, node: usize, key: &str) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), key.repeat(1000)).unwrap();
    let socket = cluster.socket(node).unwrap();
    let out = ctl(
        &socket,
        &["put", file.path().to_str().unwrap(), "--key", key],
    );
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn ctl_locate_says_which_node_can_load_how_much_of_a_prefix() {
    let cluster = two_nodes();
    // node-a holds the whole prefix a, b, c; node-b only its first key.
    for key in ["a", "b", "c"] {
        put(&cluster, 0, key);
    }
    put(&cluster, 1, "a");
    let socket = cluster.socket(1).unwrap();
    let out = ctl(
        &socket,
        &[
            "locate", "--key", "a", "--key", "b", "--key", "c", "--key", "d", "--json",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs: Vec<NodeRun> = serde_json::from_value(report["runs"].clone()).unwrap();
    let run = |node: &str, chunks: u32| NodeRun {
        node: node.into(),
        chunks,
        cpu: chunks,
        cxl: 0,
        ssd: 0,
    };
    assert_eq!(runs, vec![run("node-a", 3), run("node-b", 1)], "{report}");
    // A prefix nobody holds the start of: no run, and not a failure.
    let out = ctl(&socket, &["locate", "--key", "d", "--key", "a"]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("no node holds"));
}

#[test]
fn a_client_locates_its_own_namespaces_only_and_within_the_batch_bound() {
    let cluster = two_nodes();
    let runtime = runtime();
    runtime.block_on(async {
        let (client, namespace) = connect(&cluster, 0).await;
        let objects: Vec<(ObjectId, Vec<u8>)> = (0..4u32)
            .map(|index| common::object(namespace, index, 9, 64 << 10))
            .collect();
        store_all(&client, &objects).await;
        let ids: Vec<ObjectId> = objects.iter().map(|(object, _)| *object).collect();
        let runs = client.locate(&ids).await.unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0].node.as_str(), runs[0].chunks), ("node-a", 4));
        // A namespace this client never registered is refused, not answered.
        let foreign = ObjectId {
            namespace: kvtier_core::model::NamespaceId([3; 16]),
            prefix: PrefixDigest::ROOT,
            shard: 0,
            part: 0,
        };
        assert!(client.locate(&[foreign]).await.is_err());
        // More keys than one request may carry is refused whole.
        let too_many = vec![ids[0]; 100_000];
        assert!(client.locate(&too_many).await.is_err());
    });
}
