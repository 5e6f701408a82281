//! `radixgate load`: drives a workload at one or more servers or routers
//! over HTTP and reports what a router is judged by — token hit rate, TTFT
//! and end-to-end latency percentiles, throughput, errors by kind, and how
//! requests spread over the workers.
//!
//! Layout: [`args`] (the flags), [`builder`] (flags → workload config and
//! run plan), [`target`]
//! (URLs), [`body`] (request bodies, response fields), [`sse`] (stream
//! parsing), [`client`] (one request, failures classified into
//! [`ErrorKind`]), [`assign`] (client-side assignment), [`driver`] (arrival
//! processes), [`report`] (statistics and output), [`progress`].

pub mod args;
pub mod assign;
pub mod body;
pub mod builder;
pub mod client;
pub mod driver;
pub mod outcome;
pub mod progress;
pub mod report;
pub mod sse;
pub mod target;

pub use args::{ArrivalFlags, LoadArgs, WorkloadFlags, WorkloadKind};
pub use assign::Assign;
pub use body::{Api, BodyOptions, Usage};
pub use builder::ArrivalPlan;
pub use client::{Client, WORKER_HEADER};
pub use driver::{Arrivals, RunPlan, drive};
pub use outcome::{ErrorKind, Outcome};
pub use report::{LoadReport, ReportHeader, Stats, Summary, percentile};
pub use target::Target;

use crate::SimError;

/// Checks the flags, builds the workload and runs it (inside a runtime).
pub async fn run(args: &LoadArgs) -> Result<LoadReport, SimError> {
    let targets = args
        .urls
        .iter()
        .map(|u| Target::parse(u))
        .collect::<Result<Vec<_>, _>>()?;
    let cfg = args.workload_config()?;
    let shape = args.text_shape()?;
    let timeout = args.request_timeout()?;
    let authorization = args.authorization()?;
    args.max_error_rate()?;
    let workload = cfg.build(args.seed, shape)?;
    let plan = args.plan(workload.timestamped())?;
    let opts = BodyOptions {
        api: args.api,
        model: (!args.no_model).then(|| args.model.clone()),
        stream: !args.no_stream,
    };
    let header = ReportHeader {
        workload: cfg.name().into(),
        api: args.api.path().into(),
        stream: opts.stream,
        arrivals: plan.arrivals.describe(),
        assign: args.assign.name().into(),
        urls: targets.iter().map(|t| t.base().to_owned()).collect(),
        seed: args.seed,
        pool_size: args.pool_size.and_then(|n| usize::try_from(n).ok()),
    };
    let client = Client::new(opts, timeout, authorization);
    Ok(drive(workload, client, targets, plan, header).await)
}

/// The command: runs on a fresh multi-threaded runtime and prints the
/// report (a table, or JSON with `--json`) on stdout; then fails if more
/// requests failed than `--max-error-rate` allows, so a script or CI job
/// sees a run against a dead or broken target as a failure.
pub fn main(args: LoadArgs) -> Result<(), SimError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(run(&args))?;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| SimError::Io(std::io::Error::other(e)))?;
        println!("{text}");
    } else {
        print!("{}", report.table());
    }
    report.check_failures(args.max_error_rate()?)
}
