//! `radixgate tune`: the simulator's tuning (`radixgate_sim::tune`) with the
//! current settings read from the gateway's own config file.

use std::path::PathBuf;

use anyhow::Context;
use radixgate_routing::PolicyConfig;

/// Flags of `radixgate tune`.
#[derive(Debug, clap::Args)]
pub(crate) struct TuneCommand {
    /// The router's config file (`radixgate serve --config`): its
    /// `routing:` settings are the current ones, which the others are
    /// measured against and keep their other keys of (without it, the
    /// built-in settings).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    args: radixgate_sim::tune::TuneArgs,
}

/// Reads the current settings and runs the tuning.
pub(crate) fn run(cmd: TuneCommand) -> anyhow::Result<()> {
    let current = match &cmd.config {
        None => PolicyConfig::default(),
        Some(path) => {
            let config = radixgate::config::Config::from_yaml_file(path)?;
            config
                .routing
                .validate()
                .with_context(|| format!("the routing settings of {}", path.display()))?;
            config.routing
        }
    };
    radixgate_sim::tune::main(&cmd.args, &current)?;
    Ok(())
}
