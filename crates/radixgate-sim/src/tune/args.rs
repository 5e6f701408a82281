//! The `radixgate tune` command line (the simulator's part; the binary adds
//! `--config`, the gateway config file the current settings come from).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::SimError;
use crate::load::args::api_parser;
use crate::load::{Api, Arrivals};
use crate::server::EngineFlags;
use crate::simulate::args::worker_config;
use crate::simulate::sweep::Axis;
use crate::simulate::{PoolSpeeds, ReplicaConfig, SimConfig};
use crate::workload::{TextShape, TraceConfig, WorkloadConfig};

/// Flags of `radixgate tune`.
#[derive(Debug, Clone, Args)]
pub struct TuneArgs {
    /// The recording to tune on (`radixgate serve --record-trace FILE`), or
    /// any Mooncake-format trace (without a prediction check).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// The model whose lines to tune on, for a recording of a router that
    /// serves several (each model is its own pool) [default: the one model
    /// the recording names].
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Workers in the simulated pool [default: the recording's worker count].
    #[arg(long)]
    pub workers: Option<usize>,
    /// cache_threshold values to try.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.3,0.5,0.7")]
    pub cache_threshold: Vec<f64>,
    /// balance_abs_threshold values to try.
    #[arg(long, value_delimiter = ',', default_value = "4,16,64,256")]
    pub balance_abs_threshold: Vec<usize>,
    /// balance_rel_threshold values to try.
    #[arg(long, value_delimiter = ',', default_value = "1.2,1.5,2,4")]
    pub balance_rel_threshold: Vec<f64>,
    /// Another setting of the policy and its values, as `simulate --sweep`
    /// takes it (e.g. `hot_spot.margin=0.25,0.5,1`); repeat for more.
    #[arg(long, value_name = "KEY=V1,V2")]
    pub sweep: Vec<String>,
    /// Percentage points of hit rate a setting may lose against the
    /// current settings and still count as "at equal hit rate".
    #[arg(long, default_value_t = 1.0)]
    pub hit_tolerance: f64,
    /// Time compression of the replay, 2 = twice as fast.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Replay only the first N requests, by time [default: all].
    #[arg(long, value_name = "N")]
    pub requests: Option<u64>,
    /// Tokens per hash block of the recording.
    #[arg(long, default_value_t = 512)]
    pub block_tokens: u64,
    /// Characters per token when the replay renders lengths to text.
    #[arg(long, default_value_t = 4)]
    pub chars_per_token: u32,
    /// API the replayed requests are sent through (sets the routing text).
    #[arg(long, value_parser = api_parser(), default_value = "chat")]
    pub api: Api,
    /// Seed of the rendered text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Simulated milliseconds between refreshes of each worker's reported
    /// load.
    #[arg(long, default_value_t = 100)]
    pub load_poll_ms: u64,
    /// A JSON file holding the workers' model, as `radixgate worker
    /// --config` takes it; the engine flags below override it. Describe
    /// the real workers: their KV capacity and speed decide the figures.
    #[arg(long, value_name = "FILE")]
    pub worker_config: Option<PathBuf>,
    /// The engine's size and timing.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// Threads running simulations side by side [default: the CPUs].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

impl TuneArgs {
    /// The axes to sweep: the three thresholds, then `--sweep`'s.
    pub fn axes(&self) -> Result<Vec<Axis>, SimError> {
        for (flag, values) in [
            ("--cache-threshold", &self.cache_threshold),
            ("--balance-rel-threshold", &self.balance_rel_threshold),
        ] {
            if let Some(v) = values.iter().find(|v| !v.is_finite()) {
                return Err(SimError::Config(format!(
                    "{flag}: {v} is not a finite number"
                )));
            }
        }
        let list = |key: &str, values: Vec<String>| -> Result<Axis, SimError> {
            if values.is_empty() {
                return Err(SimError::Config(format!("--{key} names no value")));
            }
            Axis::parse(&format!("{key}={}", values.join(",")))
        };
        let mut axes = vec![
            list(
                "cache_threshold",
                self.cache_threshold.iter().map(f64::to_string).collect(),
            )?,
            list(
                "balance_abs_threshold",
                self.balance_abs_threshold
                    .iter()
                    .map(usize::to_string)
                    .collect(),
            )?,
            list(
                "balance_rel_threshold",
                self.balance_rel_threshold
                    .iter()
                    .map(f64::to_string)
                    .collect(),
            )?,
        ];
        for s in &self.sweep {
            let axis = Axis::parse(s)?;
            if axes.iter().any(|a| a.key == axis.key) {
                return Err(SimError::Config(format!(
                    "--sweep {}: already swept",
                    axis.key
                )));
            }
            axes.push(axis);
        }
        Ok(axes)
    }

    /// The tolerance as a fraction of hit rate.
    pub fn tolerance(&self) -> Result<f64, SimError> {
        if self.hit_tolerance.is_finite() && (0.0..=100.0).contains(&self.hit_tolerance) {
            Ok(self.hit_tolerance / 100.0)
        } else {
            Err(SimError::Config(format!(
                "--hit-tolerance must be 0..=100 percentage points, got {}",
                self.hit_tolerance
            )))
        }
    }

    /// How the recording is replayed (not validated: see
    /// [`TraceConfig::validate`]).
    pub fn trace_config(&self) -> TraceConfig {
        TraceConfig {
            speedup: self.speedup,
            limit: self.requests.unwrap_or(0),
            block_tokens: self.block_tokens,
            model: self.model.clone(),
            ..TraceConfig::new(&self.trace)
        }
    }

    /// The simulation of the recording on `workers` workers (validated).
    pub fn sim_config(&self, workers: usize) -> Result<SimConfig, SimError> {
        if self.chars_per_token == 0 {
            return Err(SimError::Config("--chars-per-token must be > 0".into()));
        }
        if self.requests == Some(0) {
            return Err(SimError::Config("--requests must be > 0".into()));
        }
        let cfg = SimConfig {
            workers,
            worker: worker_config(self.worker_config.as_deref(), &self.engine)?,
            workload: WorkloadConfig::Trace(self.trace_config()),
            shape: TextShape {
                chars_per_token: self.chars_per_token,
            },
            seed: self.seed,
            api: self.api,
            arrivals: Arrivals::Timestamps,
            max_requests: None,
            duration: None,
            load_poll: (self.load_poll_ms > 0).then(|| Duration::from_millis(self.load_poll_ms)),
            speeds: PoolSpeeds::default(),
            replicas: ReplicaConfig::default(),
            exact_events: false,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Simulation threads.
    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
            .max(1)
    }
}
