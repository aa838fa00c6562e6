//! `kvtier replay` until the CLI hooks it: `cargo run --release --example replay -- --capacity 1000`.

use clap::Parser;

/// Replays a Mooncake-format trace under kvtier's policy and the baselines.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: kvtier::replay::ReplayArgs,
}

fn main() -> anyhow::Result<()> {
    kvtier::replay::run(&Cli::parse().args)
}
