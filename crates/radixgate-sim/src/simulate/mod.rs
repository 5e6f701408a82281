//! `radixgate simulate`: the offline cluster simulator.
//!
//! Replays a workload (the same generators and trace replay as `radixgate
//! load`) through the real `radixgate-routing` policies in-process, against
//! N instances of the worker model `radixgate worker` runs ([`Engine`]), in
//! simulated time: a discrete-event loop ([`cluster`]) over arrivals, engine
//! steps, first tokens and completions. Nothing reads a wall clock, so a run
//! is a pure function of its config and seed, and runs far faster than real
//! time.
//!
//! Besides the policies, three references: `round_robin` (the floor), the
//! [`oracle`], which sees every engine's true cache and queue and picks the
//! worker with the least predicted time to first token, and
//! [`oracle_ttft`], which also weighs the delay its choice adds to the
//! requests already queued there (by a step-by-step [`forecast`]). Neither
//! oracle is a proven bound; the report relates every row's TTFT to the
//! better of them in the run.
//!
//! The pool may be heterogeneous: [`speeds`] gives each worker a speed at
//! the start and changes it at set simulated times.
//!
//! The policies may run as several router replicas ([`replicas`]), each
//! with its own state, sharing what they learn after a sync delay (or
//! never); the oracles always route as one all-knowing router.
//!
//! With `--pd P:D` it runs prefill/decode disaggregation instead ([`pd`]):
//! P prefill and D decode workers ([`pd_cluster`]) against P+D co-located
//! ones, reported by [`pd_report`].
//!
//! Layout: [`args`] (flags), [`sweep`] (policy parameter and replica
//! grids), [`events`] (the ordered event queue), `issuing` (the clients,
//! shared by both kinds of run), [`cluster`] (one run), [`replicas`],
//! [`speeds`], [`oracle`], [`oracle_ttft`] and its [`forecast`], [`text`]
//! (routing text vs worker text), [`report`] (statistics, table, JSON),
//! [`timeline`] (per-worker traffic and TTFT over simulated time); for
//! `--pd`, [`pd`], [`pd_cluster`] and [`pd_report`].
//!
//! [`Engine`]: crate::engine::Engine

pub mod args;
pub mod cluster;
pub mod events;
pub mod forecast;
mod issuing;
pub mod oracle;
pub mod oracle_ttft;
pub mod pd;
pub mod pd_cluster;
pub mod pd_report;
pub mod replicas;
pub mod report;
pub mod speeds;
pub mod sweep;
pub mod text;
pub mod timeline;

use std::time::Duration;

use radixgate_routing::PolicyConfig;

pub use args::SimulateArgs;
pub use cluster::{RunStats, Served, run};
pub use replicas::ReplicaConfig;
pub use report::{PolicyReport, SimReport};
pub use speeds::{PoolSpeeds, SpeedChange};

use crate::SimError;
use crate::load::{Api, Arrivals};
use crate::server::WorkerConfig;
use crate::workload::{TextShape, WorkloadConfig};

/// Everything a run depends on, apart from the contender.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Workers in the pool.
    pub workers: usize,
    /// Each worker's model (engine, tokenizer, model id), as `radixgate
    /// worker` takes it.
    pub worker: WorkerConfig,
    /// The workload.
    pub workload: WorkloadConfig,
    /// Characters per token when the workload renders lengths to text.
    pub shape: TextShape,
    /// Seed of the workload and the arrival process.
    pub seed: u64,
    /// The API requests are sent through (decides the routing text).
    pub api: Api,
    /// How requests arrive.
    pub arrivals: Arrivals,
    /// Stop issuing after this many requests.
    pub max_requests: Option<u64>,
    /// Stop issuing after this much simulated time.
    pub duration: Option<Duration>,
    /// How often workers' reported load is refreshed; `None`: never.
    pub load_poll: Option<Duration>,
    /// Each worker's speed at the start and its changes during the run
    /// (default: every worker at the worker config's speed throughout).
    pub speeds: PoolSpeeds,
    /// The router replicas the policies run as (default: one router).
    pub replicas: ReplicaConfig,
    /// Policies see exact matches from the engines' KV caches, as a gateway
    /// whose workers all publish KV events would (with no event lag).
    pub exact_events: bool,
}

impl SimConfig {
    /// Checks the parts a run cannot start without.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.workers == 0 {
            return Err(SimError::Config("--workers must be at least 1".into()));
        }
        if self.workers > 4096 {
            return Err(SimError::Config(format!(
                "--workers must be at most 4096, got {}",
                self.workers
            )));
        }
        self.worker.validate()?;
        self.workload.validate()?;
        if let Arrivals::Closed { concurrency } = self.arrivals
            && !(1..=crate::load::builder::MAX_CONCURRENCY).contains(&concurrency)
        {
            return Err(SimError::Config(format!(
                "--concurrency must be in 1..={}, got {concurrency}",
                crate::load::builder::MAX_CONCURRENCY
            )));
        }
        if self.load_poll == Some(Duration::ZERO) {
            return Err(SimError::Config("--load-poll-ms must be > 0".into()));
        }
        self.replicas.validate()?;
        self.speeds.validate(self.workers)
    }
}

/// Who routes a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Contender {
    /// A `radixgate-routing` policy with these settings.
    Policy(PolicyConfig),
    /// The simulator's greedy all-knowing reference ([`oracle`]).
    Oracle,
    /// The reference that also weighs the delay it adds to queued requests
    /// ([`oracle_ttft`]).
    OracleTtft,
    /// Each request goes to the worker given by its place in the workload
    /// (`pins[seq]`): a recording replayed as it was routed, to check the
    /// worker model against what the real workers reported.
    Pinned(std::sync::Arc<[usize]>),
}

/// Which of the simulator's references a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OracleKind {
    /// [`Contender::Oracle`].
    Greedy,
    /// [`Contender::OracleTtft`].
    Ttft,
}

impl Contender {
    /// The name in reports (and in `--policies`).
    pub fn name(&self) -> &'static str {
        match self {
            Contender::Policy(p) => p.name(),
            Contender::Oracle => "oracle",
            Contender::OracleTtft => "oracle_ttft",
            Contender::Pinned(_) => "recorded",
        }
    }

    /// Which oracle it is, if it is one.
    pub fn oracle_kind(&self) -> Option<OracleKind> {
        match self {
            Contender::Policy(_) | Contender::Pinned(_) => None,
            Contender::Oracle => Some(OracleKind::Greedy),
            Contender::OracleTtft => Some(OracleKind::Ttft),
        }
    }
}

/// The command: runs every contender and prints the report (a table, or
/// JSON with `--json`) on stdout.
pub fn main(args: SimulateArgs) -> Result<(), SimError> {
    if let Some(plan) = args.pd_plan()? {
        let report = plan.execute(&args.sim_config()?)?;
        if args.json {
            println!("{}", pretty(&report)?);
        } else {
            print!("{}", report.table());
        }
        return Ok(());
    }
    let report = args.execute()?;
    if args.json {
        println!("{}", pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

fn pretty<T: serde::Serialize>(v: &T) -> Result<String, SimError> {
    serde_json::to_string_pretty(v).map_err(|e| SimError::Io(std::io::Error::other(e)))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod replica_tests;

#[cfg(test)]
mod pd_tests;
