//! The directory's shells: they receive, call the directory core (`crate::directory`)
//! through the protocol's one dispatch, and send.
//!
//! * `process`: `kvtier directory` — formats CXL pools, listens for nodes over QUIC.
//! * `actor`: the `DirectoryActor`, the one serializer of lease and publication state.
//! * `election`: standing by and leading through etcd, and the serving gate.
//! * `session`: a `SessionActor` per node connection.

pub mod actor;
pub mod election;
pub mod process;
pub mod reload;
pub mod session;
