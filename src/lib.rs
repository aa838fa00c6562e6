//! kvtier: a distributed, hardware-aware KV-cache tier for LLM inference.
//!
//! The crate is laid out by role (see `docs/design.md` in the repository):
//! `model` holds identities and records, `directory` the metadata authority as a
//! sans-I/O state machine, `policy` the pure placement decisions, `backends` the
//! memory and storage pools, `wire` the protocol, `actors` the thin runtime shells,
//! `client` the engine-side API, and `workload` what the tools (`demo`, `replay`, `bench`)
//! share: traces, chunk content, prefix chains, histograms.

pub mod actors;
pub mod backends;
pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod ctl;
pub mod demo;
pub mod directory;
pub mod launch;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod node;
pub mod policy;
pub mod progress;
pub mod protocol;
pub mod replay;
pub mod sim;
pub mod top;
pub mod wire;
pub mod workload;
