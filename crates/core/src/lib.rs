//! kvtier-core: the cluster behind kvtier's client API — the directory and node cores,
//! their actors, the protocol, the tiers and the client itself.
//!
//! Laid out by role (see `docs/design.md` in the repository): `model` holds identities and
//! records, `directory` the metadata authority as a sans-I/O state machine, `node` the
//! node's sans-I/O books, `policy` the pure placement decisions, `backends` the memory and
//! storage pools, `protocol` and `wire` the messages and their transport, `actors` the thin
//! runtime shells, `client` the engine-side API.
//!
//! Internal to the workspace: its items are public so that the tools (`kvtier-tools`) and
//! the tests can drive the cores, not as a promise to engines. Engines use the `kvtier`
//! crate, whose small API is documented and kept.

pub mod actors;
pub mod backends;
pub mod client;
pub mod config;
pub mod directory;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod node;
pub mod policy;
pub mod progress;
pub mod protocol;
pub mod rng;
pub mod wire;
