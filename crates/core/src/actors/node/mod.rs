//! The node's shells: they receive, call the node core (`crate::node`), and send.
//!
//! * `process`: `kvtier node` — creates the pools, opens the session, serves clients.
//! * `actor`: the `NodeActor` (heartbeats, the directory's tasks, extents given back).
//! * `services`: what every node actor shares (link, pools, core, metrics) and the pool
//!   allocation path that asks the directory for shared-pool extents.
//! * `client_session`: a `ClientSessionActor` per local engine connection (Unix socket).
//! * `copy_engine`: the worker threads that copy between pools from a bounded queue.
//! * `pool`: a `PoolActor` per pool (allocation and reclaim of pages).
//! * `link`: the node's connection to the directory (operation ids, resolve, reconnect).
//! * `rejoin`: a new session after the old one was lost, keeping the cache.
//! * `host_files`: the instance lock, the files removed by identity, the stop signals.
//! * `reload`: SIGHUP: what a re-read `cluster.toml` changes for a running node.
//! * `peer`: the peer endpoint (QUIC, mutual TLS) and the receiving side of copies.
//! * `replication`: the push and receive tasks of copies between nodes.
//! * `ssd`: the SSD pool: open and register the store, spill on the directory's demotion,
//!   drop on reclaim, report a kept store's objects.
//! * `ssd_restore`: restores from the SSD on a load's miss and on a prefetch.

pub mod actor;
pub mod client_session;
pub mod copy_engine;
pub mod host_files;
pub mod link;
pub mod partitions;
pub mod peer;
pub mod pool;
pub mod process;
pub mod rejoin;
pub mod reload;
pub mod replication;
pub mod services;
pub mod ssd;
pub mod ssd_pins;
pub mod ssd_restore;
pub mod store;
