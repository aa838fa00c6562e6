//! The workload the tools share (`kvtier demo`, `kvtier replay`, `kvtier bench`): what
//! they replay and how they check it. It sits below the tools and above the client, and
//! imports none of the tools.
//!
//! * [`trace`]: reading Mooncake-format request traces (bundled, embedded sample or a file);
//! * [`prefix`]: the object ids a workload names: prompt prefix chains and seeded ids;
//! * [`chunk`]: each chunk's content, derived from its object id, with poisoning and
//!   verification of load destinations;
//! * [`transfer`]: verified loads and stores of a prompt's chunks through a client;
//! * [`histogram`]: constant-memory latency distributions.
//!
//! The synthetic model's namespace ([`kvtier_core::model::demo_namespace`]) and the seeded
//! generator ([`kvtier_core::rng`]) are the core's: its tests use them too.

pub mod chunk;
pub mod histogram;
pub mod prefix;
pub mod trace;
pub mod transfer;
