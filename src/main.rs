//! The `kvtier` binary: the command line of [`kvtier::cli`].

fn main() -> anyhow::Result<()> {
    kvtier::cli::run(std::env::args_os())
}
