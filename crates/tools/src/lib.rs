//! kvtier-tools: what the `kvtier` binary does besides running a directory or a node — the
//! command line, a local cluster launcher, the demo, the benchmarks, the whole-cluster
//! simulation, the trace replay, `kvtier top` and `kvtier ctl` — over the cores of
//! `kvtier-core`. `workload` holds what the tools share: traces, chunk content, prefix
//! chains, histograms.
//!
//! Internal to the workspace, like `kvtier-core`; the launcher and the command line are
//! also reached through the `kvtier` crate's `tools` module, public on purpose.

pub mod bench;
pub mod cli;
pub mod ctl;
pub mod demo;
pub mod launch;
pub mod replay;
pub mod sim;
pub mod top;
pub mod workload;
