//! The `radixgate` command: parses the command line and runs a subcommand.

use clap::{Parser, Subcommand};

/// radixgate: a cache-aware router for pools of LLM inference servers.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the build's version and exit.
    Version,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => println!("radixgate {}", env!("CARGO_PKG_VERSION")),
    }
    Ok(())
}
