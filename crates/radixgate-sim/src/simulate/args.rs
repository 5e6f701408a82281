//! The `radixgate simulate` command line.
//!
//! Workload and arrival flags are `radixgate load`'s own ([`WorkloadFlags`],
//! [`ArrivalFlags`] and the same translation), so one workload description
//! drives both tools. The worker model takes `radixgate worker`'s
//! `--config` file (as `--worker-config`) and its engine flags.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use radixgate_routing::{PolicyConfig, PowerOfTwoConfig, RandomConfig};

use super::pd::{self, PdPlan, PdShape, Transfer};
use super::replicas::{DEFAULT_SYNC_DELAY_MS, ReplicaConfig};
use super::report::{PolicyReport, SimReport};
use super::speeds::{PoolSpeeds, SpeedChange};
use super::sweep::{self, Axis};
use super::timeline::Timeline;
use super::{Contender, SimConfig, cluster};
use crate::SimError;
use crate::load::args::api_parser;
use crate::load::builder::workload_config;
use crate::load::{Api, ArrivalFlags, ArrivalPlan, Assign, WorkloadFlags, WorkloadKind};
use crate::server::{EngineFlags, WorkerConfig};
use crate::workload::TextShape;

/// Requests simulated when neither `--requests` nor `--duration` is given
/// (except for trace replay, which then plays the whole trace).
pub const DEFAULT_REQUESTS: u64 = 2000;

/// The contenders run when `--policies` is not given.
pub const DEFAULT_POLICIES: &str = "cache_aware,prefill_aware,least_load,round_robin,oracle";

/// Flags of `radixgate simulate`.
#[derive(Debug, Clone, Args)]
// The shared arrival flags' help speaks of `load`; here time is simulated
// and the default request count is this tool's.
#[command(
    mut_arg("duration", |a| a.help("Stop issuing after this many simulated seconds")),
    mut_arg("requests", |a| a.help(
        "Stop issuing after this many requests [default: 2000, or the whole trace]"
    )),
)]
pub struct SimulateArgs {
    /// Workers in the simulated pool.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Contenders, comma-separated: any `radixgate serve --policy` name
    /// (cache_aware, prefill_aware, round_robin, random, power_of_two,
    /// least_load, consistent_hash), `oracle` and `oracle_ttft`.
    #[arg(long, default_value = DEFAULT_POLICIES, value_delimiter = ',')]
    pub policies: Vec<String>,
    /// A policy setting and the values to try, e.g.
    /// `cache_threshold=0.1,0.3,0.5` or `hot_spot.slack=1,2,4` (repeat for
    /// a grid; each policy is swept over the settings it has); also
    /// `replicas=1,2,4` and `sync_delay_ms=1,10,off`, swept for every
    /// policy.
    #[arg(long, value_name = "KEY=V1,V2")]
    pub sweep: Vec<String>,
    /// Router replicas the requests are spread over, each with its own
    /// policy state (trees, in-flight counts); the oracles always route as
    /// one router.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub replicas: usize,
    /// Simulated milliseconds after which each replica applies the other
    /// replicas' routing decisions and load changes [default: 1].
    #[arg(long, value_name = "MS")]
    pub sync_delay_ms: Option<f64>,
    /// The replicas never share what they learn.
    #[arg(long, conflicts_with = "sync_delay_ms")]
    pub no_sync: bool,
    /// How requests are spread over the replicas (the values of `radixgate
    /// load --assign`) [default: round-robin].
    #[arg(long, value_enum)]
    pub replica_spread: Option<Assign>,
    /// Policies route on exact matches from the engines' KV caches, as a
    /// gateway whose workers all publish KV events would, with no event
    /// lag (the tree stands in for nothing); the oracles are unaffected.
    #[arg(long)]
    pub exact_events: bool,
    /// API the requests are sent through (sets the routing text).
    #[arg(long, value_parser = api_parser(), default_value = "chat")]
    pub api: Api,
    /// How requests arrive and when issuing stops (in simulated time).
    #[command(flatten)]
    pub arrival: ArrivalFlags,
    /// Seed of the workload and the arrival process.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Simulated milliseconds between refreshes of each worker's reported
    /// load (what a gateway would see polling each simulated worker's
    /// `/get_load` endpoint).
    #[arg(long, default_value_t = 100)]
    pub load_poll_ms: u64,
    /// Workload to generate (`trace` when `--trace` is given).
    #[arg(
        long,
        value_enum,
        default_value_t = WorkloadKind::SharedPrefix,
        default_value_if("trace", clap::builder::ArgPredicate::IsPresent, "trace")
    )]
    pub workload: WorkloadKind,
    /// Read the workload from a JSON file (the `WorkloadConfig` schema)
    /// instead of --workload and its flags.
    #[arg(long, value_name = "FILE", conflicts_with = "workload")]
    pub workload_file: Option<PathBuf>,
    /// Characters per token when rendering workload lengths to text.
    #[arg(long, default_value_t = 4)]
    pub chars_per_token: u32,
    /// Workload settings (each applies to the workloads named in its help).
    #[command(flatten)]
    pub knobs: WorkloadFlags,
    /// A JSON file holding a worker config, as `radixgate worker --config`
    /// takes it; the engine flags below override it.
    #[arg(long, value_name = "FILE")]
    pub worker_config: Option<PathBuf>,
    /// The engine's size and timing.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// Speed of each worker at the start, comma-separated, e.g. `0.5,1,1,1`
    /// (worker 0 at half speed); workers not listed run at `--speed`.
    #[arg(long, value_name = "F1,F2,..", value_delimiter = ',')]
    pub worker_speeds: Vec<f64>,
    /// At simulated second T, worker W's speed becomes F, e.g. `0@10=0.5`
    /// (repeat for more changes).
    #[arg(long, value_name = "W@T=F")]
    pub speed_change: Vec<String>,
    /// Add to each row a per-worker timeline: per window of this many
    /// simulated seconds, requests dispatched and their mean TTFT (0: off).
    #[arg(long, value_name = "S")]
    pub timeline_secs: Option<f64>,
    /// Prefill/decode disaggregation: P prefill and D decode workers, run
    /// against P+D co-located workers (routed by --prefill-policy) on the
    /// same workload and seed, e.g. `2:2`.
    #[arg(
        long,
        value_name = "P:D",
        conflicts_with_all = [
            "workers", "policies", "sweep", "replicas", "sync_delay_ms", "no_sync",
            "exact_events", "worker_speeds", "speed_change", "timeline_secs",
        ]
    )]
    pub pd: Option<String>,
    /// With --pd: the prefill pool's policy (and the co-located pool's);
    /// any `radixgate serve --policy` name.
    #[arg(long, value_name = "NAME", requires = "pd", default_value = pd::DEFAULT_PREFILL_POLICY)]
    pub prefill_policy: String,
    /// With --pd: the decode pool's policy, as the router's --decode-policy.
    #[arg(long, value_name = "NAME", requires = "pd", default_value = pd::DEFAULT_DECODE_POLICY)]
    pub decode_policy: String,
    /// With --pd: bandwidth of each prefill worker's link to the decode
    /// workers, bytes per second, as `radixgate worker --transfer-bandwidth`
    /// (50000000000 is one 400 Gb/s NIC).
    #[arg(long, value_name = "BYTES/S", requires = "pd", default_value_t = pd::DEFAULT_TRANSFER_BANDWIDTH)]
    pub pd_transfer_bandwidth: f64,
    /// With --pd: bytes of KV per prompt token (Llama-3-8B's is 131072).
    #[arg(long, value_name = "BYTES", requires = "pd", default_value_t = pd::DEFAULT_KV_BYTES_PER_TOKEN)]
    pub pd_kv_bytes_per_token: u64,
    /// With --pd: also run an arm, pd+skip, that sends a request to decode
    /// alone when its decode worker holds all but at most this many of its
    /// prompt tokens, as the router's --pd-skip-prefill-tokens (0: never,
    /// so no such arm). The simulator reads the decode worker's true cache
    /// where the router predicts it.
    #[arg(long, value_name = "TOKENS", requires = "pd")]
    pub pd_skip_prefill_tokens: Option<usize>,
}

impl SimulateArgs {
    /// The worker model: `--worker-config` (or defaults), then flags.
    pub fn worker(&self) -> Result<WorkerConfig, SimError> {
        worker_config(self.worker_config.as_deref(), &self.engine)
    }

    /// The simulation these flags describe (validated).
    pub fn sim_config(&self) -> Result<SimConfig, SimError> {
        let workload = workload_config(self.workload, self.workload_file.as_deref(), &self.knobs)?;
        if self.chars_per_token == 0 {
            return Err(SimError::Config("--chars-per-token must be > 0".into()));
        }
        let timestamped = matches!(workload, crate::workload::WorkloadConfig::Trace(_));
        let ArrivalPlan {
            arrivals,
            max_requests,
            duration,
        } = self.arrival.plan(timestamped, DEFAULT_REQUESTS)?;
        let cfg = SimConfig {
            workers: self.workers,
            worker: self.worker()?,
            workload,
            shape: TextShape {
                chars_per_token: self.chars_per_token,
            },
            seed: self.seed,
            api: self.api,
            arrivals,
            max_requests,
            duration,
            load_poll: (self.load_poll_ms > 0).then(|| Duration::from_millis(self.load_poll_ms)),
            speeds: PoolSpeeds {
                initial: self.worker_speeds.clone(),
                changes: self
                    .speed_change
                    .iter()
                    .map(|c| SpeedChange::parse(c))
                    .collect::<Result<_, _>>()?,
            },
            replicas: ReplicaConfig {
                count: self.replicas,
                sync_delay: if self.no_sync {
                    None
                } else {
                    let ms = self.sync_delay_ms.unwrap_or(DEFAULT_SYNC_DELAY_MS as f64);
                    Some(sync_delay(ms, "--sync-delay-ms")?)
                },
                spread: self.replica_spread.unwrap_or(Assign::RoundRobin),
            },
            exact_events: self.exact_events,
        };
        self.replica_flags_have_replicas()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// A replica flag with one router and no `replicas` sweep would be
    /// ignored: refused, naming what it needs.
    fn replica_flags_have_replicas(&self) -> Result<(), SimError> {
        let swept = self
            .sweep
            .iter()
            .any(|s| s.split('=').next().map(str::trim) == Some("replicas"));
        if self.replicas > 1 || swept {
            return Ok(());
        }
        let given = [
            (self.no_sync, "--no-sync"),
            (self.sync_delay_ms.is_some(), "--sync-delay-ms"),
            (self.replica_spread.is_some(), "--replica-spread"),
        ];
        match given.into_iter().find(|(set, _)| *set) {
            Some((_, flag)) => Err(SimError::Config(format!(
                "{flag} applies to several router replicas, and there is one: \
                 add --replicas N (N > 1) or --sweep replicas=..."
            ))),
            None => Ok(()),
        }
    }

    /// The contenders, each with its sweep point label.
    pub fn contenders(&self) -> Result<Vec<(Contender, String)>, SimError> {
        let axes = self
            .sweep
            .iter()
            .map(|s| Axis::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        let mut bases = Vec::new();
        for name in self
            .policies
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
        {
            bases.push(contender(name, self.seed)?);
        }
        if bases.is_empty() {
            return Err(SimError::Config("--policies names no policy".into()));
        }
        for axis in axes.iter().filter(|a| !sweep::is_run_key(&a.key)) {
            let used = bases.iter().any(|b| match b {
                Contender::Policy(p) => sweep::has_key(p, &axis.key),
                Contender::Oracle | Contender::OracleTtft | Contender::Pinned(_) => false,
            });
            if !used {
                return Err(SimError::Config(format!(
                    "--sweep {}: none of the chosen policies has this setting",
                    axis.key
                )));
            }
        }
        let mut out = Vec::new();
        for base in bases {
            match &base {
                Contender::Oracle | Contender::OracleTtft | Contender::Pinned(_) => {
                    out.push((base, String::new()));
                }
                Contender::Policy(p) => {
                    for point in sweep::grid_for(p, &axes) {
                        let cfg = sweep::apply(p, &point)?;
                        out.push((Contender::Policy(cfg), sweep::describe(&point)));
                    }
                }
            }
        }
        Ok(out)
    }

    /// What `--pd` asks for (`None` without it), checked.
    pub fn pd_plan(&self) -> Result<Option<PdPlan>, SimError> {
        let Some(shape) = &self.pd else {
            return Ok(None);
        };
        Ok(Some(PdPlan {
            shape: PdShape::parse(shape)?,
            prefill_policy: pd::router_policy("--prefill-policy", &self.prefill_policy, self.seed)?,
            decode_policy: pd::router_policy("--decode-policy", &self.decode_policy, self.seed)?,
            transfer: Transfer::new(self.pd_transfer_bandwidth, self.pd_kv_bytes_per_token)?,
            skip_prefill_tokens: pd::skip_prefill_tokens(self.pd_skip_prefill_tokens)?,
        }))
    }

    /// The timeline's window, if one was asked for.
    pub fn timeline_window(&self) -> Result<Option<Duration>, SimError> {
        match self.timeline_secs {
            None => Ok(None),
            Some(0.0) => Ok(None),
            Some(s) if s.is_finite() && (0.001..=86_400.0).contains(&s) => {
                Ok(Some(Duration::from_secs_f64(s)))
            }
            Some(s) => Err(SimError::Config(format!(
                "--timeline-secs must be 0 (off) or in 0.001..=86400 simulated seconds, got {s}"
            ))),
        }
    }

    /// The replica settings to run: the flags' alone, or the grid of the
    /// `replicas` and `sync_delay_ms` sweep axes, each with its label.
    pub fn replica_points(
        &self,
        base: &ReplicaConfig,
    ) -> Result<Vec<(ReplicaConfig, String)>, SimError> {
        let axes = self
            .sweep
            .iter()
            .map(|s| Axis::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        sweep::run_grid(base, &axes)
    }

    /// Runs every contender on the same config (at every replica setting
    /// swept; the oracles once, since they route as one router) and
    /// reports.
    pub fn execute(&self) -> Result<SimReport, SimError> {
        let cfg = self.sim_config()?;
        let window = self.timeline_window()?;
        let contenders = self.contenders()?;
        let points = self.replica_points(&cfg.replicas)?;
        let mut report = SimReport {
            workload: cfg.workload.name().into(),
            workers: cfg.workers,
            arrivals: cfg.arrivals.describe(),
            seed: cfg.seed,
            api: cfg.api.path().into(),
            replicas: match points.as_slice() {
                [(only, _)] => only.describe(),
                _ => None,
            },
            ttft_reference: None,
            rows: Vec::new(),
        };
        for (k, (replicas, label)) in points.iter().enumerate() {
            let cfg = SimConfig {
                replicas: *replicas,
                ..cfg.clone()
            };
            for (who, params) in &contenders {
                let params = match who {
                    Contender::Oracle | Contender::OracleTtft | Contender::Pinned(_) if k > 0 => {
                        continue;
                    }
                    Contender::Oracle | Contender::OracleTtft | Contender::Pinned(_) => {
                        params.clone()
                    }
                    Contender::Policy(_) => [params.as_str(), label.as_str()]
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect::<Vec<_>>()
                        .join(" "),
                };
                let started = Instant::now();
                let stats = cluster::run(&cfg, who)?;
                let wall = started.elapsed().as_secs_f64();
                let mut row = PolicyReport::new(who, params, &stats, wall);
                if let Some(w) = window {
                    row.timeline = Some(Timeline::of(&stats.dispatches, cfg.workers, w)?);
                }
                report.rows.push(row);
            }
        }
        report.relate_to_oracles();
        Ok(report)
    }
}

/// The worker model: `file` (a `radixgate worker --config` JSON file, or
/// the defaults), then the engine flags given; validated.
pub fn worker_config(
    file: Option<&std::path::Path>,
    engine: &EngineFlags,
) -> Result<WorkerConfig, SimError> {
    let mut c = match file {
        None => WorkerConfig::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                SimError::Config(format!(
                    "cannot read --worker-config {}: {e}",
                    path.display()
                ))
            })?;
            serde_json::from_str(&text)
                .map_err(|e| SimError::Config(format!("--worker-config {}: {e}", path.display())))?
        }
    };
    engine.apply(&mut c.engine);
    c.validate()?;
    Ok(c)
}

/// A sync delay given in milliseconds, checked.
pub(super) fn sync_delay(ms: f64, what: &str) -> Result<Duration, SimError> {
    let max = super::replicas::MAX_SYNC_DELAY.as_secs_f64() * 1000.0;
    if ms.is_finite() && (0.0..=max).contains(&ms) {
        Ok(Duration::from_secs_f64(ms / 1000.0))
    } else {
        Err(SimError::Config(format!(
            "{what} must be in 0..={max} milliseconds, got {ms}"
        )))
    }
}

/// The contender called `name`, with its default settings (seeded where it
/// draws random numbers, so runs repeat).
pub fn contender(name: &str, seed: u64) -> Result<Contender, SimError> {
    for reference in [Contender::Oracle, Contender::OracleTtft] {
        if name == reference.name() {
            return Ok(reference);
        }
    }
    let cfg = PolicyConfig::named(name).ok_or_else(|| {
        SimError::Config(format!(
            "--policies: unknown policy {name:?} (use {}, oracle or oracle_ttft)",
            PolicyConfig::NAMES.join(", ")
        ))
    })?;
    let cfg = match cfg {
        PolicyConfig::Random(_) => PolicyConfig::Random(RandomConfig { seed: Some(seed) }),
        PolicyConfig::PowerOfTwo(_) => {
            PolicyConfig::PowerOfTwo(PowerOfTwoConfig { seed: Some(seed) })
        }
        other => other,
    };
    Ok(Contender::Policy(cfg))
}
