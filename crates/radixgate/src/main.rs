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
    /// Serve simulated LLM workers (KV-cache and batching model) for tests
    /// and benchmarks.
    Worker(Box<radixgate_sim::server::WorkerArgs>),
    /// Drive a workload at servers or routers and report hit rate, latency,
    /// errors and spread.
    Load(Box<radixgate_sim::load::LoadArgs>),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => println!("radixgate {}", env!("CARGO_PKG_VERSION")),
        Command::Worker(args) => {
            init_logs();
            tokio::runtime::Runtime::new()?.block_on(radixgate_sim::server::run(*args))?;
        }
        Command::Load(args) => radixgate_sim::load::main(*args)?,
    }
    Ok(())
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
