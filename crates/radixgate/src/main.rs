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
    /// Drive a workload at servers or routers and report hit rate, latency,
    /// errors and spread.
    Load(Box<radixgate_sim::load::LoadArgs>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => println!("radixgate {}", env!("CARGO_PKG_VERSION")),
        Command::Load(args) => radixgate_sim::load::main(*args)?,
    }
    Ok(())
}
