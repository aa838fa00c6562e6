//! The engine's API alone: this file names nothing but `kvtier::` (the crate engines link),
//! so it stops compiling when something an engine needs is no longer public, and runs the
//! whole store, probe, locate and load cycle through it against a real one-node cluster.

use kvtier::errors::{ProtocolError, WireError};
use kvtier::tools::{ClusterSpec, LocalCluster};
use kvtier::{
    AcquireMode, Client, ClientError, KvDtype, NamespaceDescriptor, ObjectId, PrefixDigest,
    ProbeOutcome, StoreOutcome,
};
use std::path::Path;

fn descriptor() -> NamespaceDescriptor {
    NamespaceDescriptor {
        model: "public-api".into(),
        revision: "1".into(),
        adapter: None,
        kv_dtype: KvDtype::BFloat16,
        quantization: None,
        layers: 2,
        kv_heads: 2,
        head_dim: 64,
        block_tokens: 16,
        format_version: 1,
        chunk_tokens: 64,
        tensor_parallel: 1,
        pipeline_parallel: 1,
        salt: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn an_engine_stores_probes_locates_and_loads_through_the_public_api() {
    let spec = ClusterSpec {
        nodes: 1,
        cpu_pool_bytes: 16 << 20,
        ..ClusterSpec::default()
    };
    let cluster = LocalCluster::start(Path::new(env!("CARGO_BIN_EXE_kvtier")), &spec).unwrap();
    let socket = cluster.socket(0).unwrap();
    let runtime = runtime();
    runtime.block_on(async {
        let client = Client::connect(&socket).await.unwrap();
        let namespace = client.register_namespace(descriptor()).await.unwrap();
        // A prompt of three chunks; the third is never stored.
        let mut prefix = PrefixDigest::ROOT;
        let chunks: Vec<ObjectId> = (0..3u32)
            .map(|chunk| {
                let tokens: Vec<u32> = (chunk * 64..(chunk + 1) * 64).collect();
                prefix = prefix.chain(&tokens);
                ObjectId {
                    namespace,
                    prefix,
                    shard: 0,
                    part: 0,
                }
            })
            .collect();
        let bytes: Vec<Vec<u8>> = (0..2u8).map(|seed| vec![seed + 1; 64 << 10]).collect();
        let items: Vec<(ObjectId, &[u8])> = chunks
            .iter()
            .zip(&bytes)
            .map(|(chunk, bytes)| (*chunk, &bytes[..]))
            .collect();
        let stored = client.store_many(&items).await;
        assert!(
            stored
                .iter()
                .all(|outcome| matches!(outcome, Ok(StoreOutcome::Stored))),
            "{stored:?}"
        );

        let probed = client.probe(&chunks).await.unwrap();
        assert!(matches!(probed[0], ProbeOutcome::Hit { .. }), "{probed:?}");
        assert!(matches!(probed[2], ProbeOutcome::Miss), "{probed:?}");

        let runs = client.locate(&chunks).await.unwrap();
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!((runs[0].chunks, runs[0].cpu), (2, 2), "{runs:?}");

        let mut buffers = vec![vec![0u8; 64 << 10]; 3];
        let mut targets: Vec<&mut [u8]> = buffers.iter_mut().map(|b| &mut b[..]).collect();
        let hits = client.load_into(&chunks, &mut targets).await.unwrap();
        assert_eq!(hits, vec![true, true, false]);
        assert_eq!(&buffers[..2], &bytes[..]);

        let views = client.load(&chunks[..1], AcquireMode::Each).await.unwrap();
        let view = views[0].as_ref().expect("a hit");
        assert_eq!(view.bytes().unwrap(), &bytes[0][..]);
    });
}

#[test]
fn a_missing_node_is_a_typed_error() {
    let folder = tempfile::tempdir().unwrap();
    let missing = folder.path().join("no-node.sock");
    let connected = runtime().block_on(Client::connect(&missing));
    assert!(
        matches!(connected, Err(ClientError::Wire(WireError::Io(_)))),
        "{:?}",
        connected.err()
    );
    // Refusals carry the node's or the directory's reason, printable as they are.
    let refused = ClientError::Refused(ProtocolError::Busy);
    assert!(refused.to_string().contains("refused"), "{refused}");
}
