//! `kvtier ctl`: operator commands. `objects` stores, loads, probes and locates objects by key through
//! a node's Unix socket, as an engine would, for debugging a host and for tests; `cluster`
//! holds the cluster commands (status through a node; reload and drain at the directory,
//! under an operator certificate: `operator`).

pub mod cluster;
pub mod objects;
mod operator;

use clap::Subcommand;

/// A `kvtier ctl` command.
#[derive(Subcommand)]
pub enum CtlCommand {
    /// Store a file's bytes under a key through a node's socket.
    Put(objects::PutArgs),
    /// Load the object of a key through a node's socket into a file.
    Get(objects::GetArgs),
    /// Say whether the object of a key is cached where the node can read it.
    Probe(objects::ProbeArgs),
    /// Say, for each node, how many of the keys (in order) it can load without a network
    /// transfer: what a router asks.
    Locate(objects::LocateArgs),
    /// Show the cluster as the directory sees it: nodes, epochs, sessions, drains, pools.
    Status(cluster::StatusArgs),
    /// Make the directory re-read cluster.toml (as SIGHUP does); a refusal names the reason.
    Reload(cluster::ReloadArgs),
    /// Drain a node: nothing new is placed there, what is worth keeping is relocated, its
    /// leases end, then its session ends and it exits.
    Drain(cluster::DrainArgs),
}

/// Runs one `kvtier ctl` command.
pub fn run(command: CtlCommand) -> anyhow::Result<()> {
    match command {
        CtlCommand::Put(args) => objects::put(&args),
        CtlCommand::Get(args) => objects::get(&args),
        CtlCommand::Probe(args) => objects::probe(&args),
        CtlCommand::Locate(args) => objects::locate(&args),
        CtlCommand::Status(args) => cluster::status(&args),
        CtlCommand::Reload(args) => cluster::reload(&args),
        CtlCommand::Drain(args) => cluster::drain(&args),
    }
}
