//! The `kvtier` binary: the command line of `kvtier_tools::cli`.

fn main() -> anyhow::Result<()> {
    kvtier_tools::cli::run(std::env::args_os())
}
