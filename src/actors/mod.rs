//! The actors: thin shells that receive messages, call a sans-I/O core, and send what the
//! core returned. Every decision lives in `directory`, `backends` or `policy`; a handler
//! here reads the clock, calls, replies and re-arms a timer.
//!
//! * `directory`: the `DirectoryActor`, the one serializer of lease and publication state.
//! * `session`: a `SessionActor` per node connection to the directory (QUIC).
//! * `link`: a node's connection to the directory (operation ids, acknowledgements, resolve).
//! * `node`: the `NodeActor` (heartbeats, reclaim tasks) and the node process's start-up.
//! * `pool`: a `PoolActor` per pool (allocation and reclaim of pages).
//! * `client_session`: a `ClientSessionActor` per local engine connection (Unix socket).
//! * `frames`: the frame stream and writer task shared by both kinds of session.

pub mod client_session;
pub mod directory;
pub mod frames;
pub mod link;
pub mod node;
pub mod pool;
pub mod session;
