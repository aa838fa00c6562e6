//! `kvtier ctl`: operator commands, spoken to a node's Unix socket as an engine would.
//! `cluster` holds the cluster commands (status, reload, drain).

pub mod cluster;

use clap::Subcommand;

/// A `kvtier ctl` command.
#[derive(Subcommand)]
pub enum CtlCommand {
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
        CtlCommand::Status(args) => cluster::status(&args),
        CtlCommand::Reload(args) => cluster::reload(&args),
        CtlCommand::Drain(args) => cluster::drain(&args),
    }
}
