//! Workload helpers shared by the tools.

pub mod rng;
