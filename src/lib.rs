//! kvtier: a distributed KV-cache tier for LLM inference — the API an engine links.
//!
//! An engine connects a [`Client`] to the kvtier node on its host (a Unix socket), registers
//! a [`NamespaceDescriptor`] for its model, and names each chunk of a prompt's KV state by an
//! [`ObjectId`] in that namespace (its [`PrefixDigest`], chained over the prompt's tokens
//! chunk by chunk: equal prefixes give equal digests on every host). Then:
//!
//! * [`Client::store_many`] copies chunks into the node's pools; a full cluster answers
//!   [`StoreOutcome::Skipped`], never an error;
//! * [`Client::probe`] says which chunks are cached where this host can read them, and
//!   [`Client::locate`] which node could load the longest leading run of them (for routers);
//! * [`Client::load_into`] copies hits into the engine's buffers; [`Client::load`] hands
//!   zero-copy [`LoadedView`]s, each holding its lease until dropped;
//! * [`Client::prefetch`] restores chunks only the node's SSD holds, and
//!   [`Client::pin_on_ssd`] hands where they lie for a reader of its own (GPUDirect Storage).
//!
//! The blocking forms ([`Client::store_many_blocking`], [`Client::load_into_blocking`]) are
//! for callers outside a tokio runtime: the calling thread copies while the runtime's
//! threads make the round trips. Every call is bounded (see [`limits`]); every failure is a
//! [`ClientError`].
//!
//! ```no_run
//! use kvtier::{Client, KvDtype, NamespaceDescriptor, ObjectId, PrefixDigest, StoreOutcome};
//!
//! # async fn run() -> Result<(), kvtier::ClientError> {
//! let client = Client::connect("/run/kvtier/node.sock".as_ref()).await?;
//! let namespace = client.register_namespace(NamespaceDescriptor {
//!     model: "my-model".into(),
//!     revision: "1".into(),
//!     adapter: None,
//!     kv_dtype: KvDtype::BFloat16,
//!     quantization: None,
//!     layers: 32,
//!     kv_heads: 8,
//!     head_dim: 128,
//!     block_tokens: 16,
//!     format_version: 1,
//!     chunk_tokens: 256,
//!     tensor_parallel: 1,
//!     pipeline_parallel: 1,
//!     salt: None,
//! }).await?;
//! let tokens: Vec<u32> = (0..256).collect();
//! let prefix = PrefixDigest::ROOT.chain(&tokens);
//! let chunk = ObjectId { namespace, prefix, shard: 0, part: 0 };
//! let bytes = vec![7u8; 64 << 10];
//! let stored = client.store_many(&[(chunk, &bytes[..])]).await;
//! assert!(matches!(stored[0], Ok(StoreOutcome::Stored | StoreOutcome::AlreadyPresent)));
//! let mut buffer = vec![0u8; bytes.len()];
//! let hits = client.load_into(&[chunk], &mut [&mut buffer[..]]).await?;
//! assert!(!hits[0] || buffer == bytes);
//! # Ok(())
//! # }
//! ```
//!
//! The cluster itself (the directory and node processes, their cores and protocol) lives in
//! the workspace's internal crates; nothing of it is part of this API beyond the types
//! re-exported here. [`tools`] holds what the Python package needs besides the client: a
//! local cluster launcher and the command line, public on purpose.

pub use kvtier_core::client::spin::block_on;
pub use kvtier_core::client::{Client, ClientError, LoadedView, StoreOutcome, StoreSkip};
pub use kvtier_core::directory::{AcquireMode, Lease, NodeRun, ProbeOutcome, RetireOutcome};
pub use kvtier_core::model::{
    Epoch, KvDtype, LeaseId, Medium, NamespaceDescriptor, NamespaceError, NamespaceId, NodeId,
    ObjectId, PrefixDigest,
};
pub use kvtier_core::protocol::messages::SsdExtent;

/// Why the node or the directory refused a request ([`ClientError::Refused`]), and why a
/// connection or a pool failed.
pub mod errors {
    pub use kvtier_core::backends::PoolError;
    pub use kvtier_core::directory::reload::ReloadRefusal;
    pub use kvtier_core::directory::DirectoryError;
    pub use kvtier_core::node::{ClientRefusal, TenantRefusal};
    pub use kvtier_core::protocol::messages::ProtocolError;
    pub use kvtier_core::wire::WireError;
}

/// The bounds one client keeps: requests in flight, batch sizes, background queues.
pub mod limits {
    pub use kvtier_core::client::spin::REPLY_SPIN;
    pub use kvtier_core::client::{
        CLIENT_INFLIGHT_MAX, CLIENT_REQUEST_TIMEOUT, DROPPED_LEASES_QUEUED_MAX,
        DROPPED_TICKETS_QUEUED_MAX, LOAD_BATCHES_IN_FLIGHT, LOAD_BATCH_BYTES_MAX,
        LOAD_BATCH_ITEMS_MAX, STORE_BATCHES_IN_FLIGHT, STORE_BATCH_BYTES_MAX,
        STORE_RESERVES_HELD_MAX, STORE_RESERVE_BYTES_MAX,
    };
    pub use kvtier_core::protocol::messages::STORE_BATCH_ITEMS_MAX;
}

/// Besides the client, public on purpose for the Python package and for tests: a local
/// cluster (a directory and nodes as child processes of one binary), the `kvtier` command
/// line, and the copy routines the client chose on this machine.
pub mod tools {
    pub use kvtier_core::backends::copy::{copy_streaming, routines, CopyRoutine, Routines};
    pub use kvtier_tools::cli::run as run_command_line;
    pub use kvtier_tools::launch::{ClusterSpec, LocalCluster};
}
