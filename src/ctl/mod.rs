//! `kvtier ctl`: operator commands against a running cluster, for debugging a host and for
//! tests. `objects` stores, loads and probes objects by key through a node's socket, as an
//! engine would.

pub mod objects;

use clap::Subcommand;

/// The `kvtier ctl` subcommands.
#[derive(Subcommand)]
pub enum CtlCommand {
    /// Store a file's bytes under a key through a node's socket.
    Put(objects::PutArgs),
    /// Load the object of a key through a node's socket into a file.
    Get(objects::GetArgs),
    /// Say whether the object of a key is cached where the node can read it.
    Probe(objects::ProbeArgs),
}

/// Runs one `kvtier ctl` command.
pub fn run(command: &CtlCommand) -> anyhow::Result<()> {
    match command {
        CtlCommand::Put(args) => objects::put(args),
        CtlCommand::Get(args) => objects::get(args),
        CtlCommand::Probe(args) => objects::probe(args),
    }
}
