//! `radixgate demo`: the whole system in one command, nothing installed.
//!
//! It starts simulated LLM workers in-process (the KV-cache and batching
//! model of `radixgate-sim`), puts a gateway in front, and drives the same
//! seeded shared-prefix workload through it twice — routed by `cache_aware`,
//! then by `round_robin` — each time on fresh workers with cold caches. It
//! prints both runs side by side (hit rate, TTFT, spread), then keeps a
//! `cache_aware` gateway serving on `--host:--port` for the user to `curl`,
//! until Ctrl-C.
//!
//! Everything is real: workers and gateway listen on loopback sockets and
//! the workload is sent over HTTP by the same code as `radixgate load`,
//! whose progress line (requests done, hit rate so far) shows each run on
//! a terminal.
//!
//! It lives in the binary, not the gateway library, because it is the one
//! place that puts simulated workers behind a gateway: the library stays
//! free of `radixgate-sim`. `tests/demo.rs` compiles this file as its own
//! module to run the comparison without the command line.

use anyhow::Context;
use clap::{Args, Parser};
use radixgate::config::{Config, WorkerSpec};
use radixgate_routing::{PolicyConfig, RoundRobinConfig};
use radixgate_sim::load::LoadReport;
use radixgate_sim::server::{WorkerConfig, WorkerHandle, start};
use std::fmt::Write as _;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Flags of `radixgate demo`.
#[derive(Debug, Clone, Args)]
pub(crate) struct DemoArgs {
    /// Simulated workers behind the router (1 to 64: each is a server of
    /// its own in this process, and thousands ran out of file descriptors).
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub(crate) workers: usize,
    /// Requests per run.
    #[arg(long, default_value_t = 240)]
    pub(crate) requests: u64,
    /// Poisson arrival rate, requests per second.
    #[arg(long, default_value_t = 24.0)]
    pub(crate) rate: f64,
    /// Prefix groups (distinct system prompts) in the workload.
    #[arg(long, default_value_t = 16)]
    pub(crate) groups: u64,
    /// Tokens of each group's system prompt.
    #[arg(long, default_value_t = 1024)]
    pub(crate) system_tokens: u64,
    /// KV-cache capacity of each simulated worker, in tokens. Small enough
    /// that one worker cannot hold every prefix, as in a busy cluster.
    #[arg(long, default_value_t = 12_000)]
    pub(crate) kv_capacity_tokens: usize,
    /// Workload seed.
    #[arg(long, default_value_t = 7)]
    pub(crate) seed: u64,
    /// Address the gateway serves on after the comparison.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// Port the gateway serves on after the comparison.
    #[arg(long, default_value_t = 30000)]
    pub(crate) port: u16,
    /// Exit after printing the comparison instead of serving.
    #[arg(long)]
    pub(crate) no_serve: bool,
}

/// One policy's run.
#[derive(Debug)]
pub(crate) struct DemoRun {
    /// Policy name.
    pub(crate) policy: &'static str,
    /// What the load tool measured.
    pub(crate) report: LoadReport,
}

/// Simulated workers and a gateway in front of them.
struct Cluster {
    gateway: String,
    stop: CancellationToken,
    gateway_task: tokio::task::JoinHandle<Result<(), radixgate::server::StartError>>,
    _workers: Vec<WorkerHandle>,
}

impl Cluster {
    async fn start(
        args: &DemoArgs,
        routing: PolicyConfig,
        listener: TcpListener,
    ) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let mut workers = Vec::new();
        for _ in 0..args.workers {
            let mut config = WorkerConfig::default();
            config.engine.kv_capacity_tokens = args.kv_capacity_tokens;
            let socket = TcpListener::bind("127.0.0.1:0").await?;
            workers.push(
                start(socket, config, stop.clone())
                    .await
                    .context("starting a simulated worker")?,
            );
        }
        let mut config = Config {
            routing,
            ..Config::default()
        };
        config.workers = workers
            .iter()
            .map(|w| WorkerSpec::new(format!("http://{}", w.addr())))
            .collect();
        config.log.level = "warn".into();
        let gateway = format!("http://{}", listener.local_addr()?);
        let gateway_task = tokio::spawn(radixgate::server::run(listener, config, stop.clone()));
        let cluster = Self {
            gateway,
            stop,
            gateway_task,
            _workers: workers,
        };
        cluster.wait_ready(args.workers).await?;
        Ok(cluster)
    }

    /// Waits until every worker is admitted (the health checker's first
    /// probes), failing after 30 s instead of hanging.
    async fn wait_ready(&self, workers: usize) -> anyhow::Result<()> {
        let client = radixgate::upstream::client()?;
        let url = format!("{}/readiness", self.gateway);
        for _ in 0..600 {
            if let Ok(r) = client.get(&url).send().await
                && let Ok(v) = r.json::<serde_json::Value>().await
                && v["healthy_workers"].as_u64() == Some(workers as u64)
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("the simulated workers did not become healthy within 30 s")
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.gateway_task.await??;
        Ok(())
    }
}

/// The `radixgate load` flags of one run against `gateway`. Load's
/// progress line stays on: it shows requests done and the hit rate so far
/// while each run takes its seconds, and only on a terminal.
pub(crate) fn load_args(
    args: &DemoArgs,
    gateway: &str,
) -> anyhow::Result<radixgate_sim::load::LoadArgs> {
    #[derive(Parser)]
    struct Load {
        #[command(flatten)]
        args: radixgate_sim::load::LoadArgs,
    }
    let argv = [
        "load".to_owned(),
        format!("--url={gateway}"),
        "--workload=shared-prefix".into(),
        format!("--groups={}", args.groups),
        format!("--system-tokens={}", args.system_tokens),
        format!("--rate={}", args.rate),
        format!("--requests={}", args.requests),
        format!("--seed={}", args.seed),
    ];
    Ok(Load::try_parse_from(argv)
        .context("building the demo workload")?
        .args)
}

/// Runs the workload through `cache_aware` and then `round_robin`, each on
/// fresh workers.
pub(crate) async fn compare(args: &DemoArgs) -> anyhow::Result<Vec<DemoRun>> {
    let policies = [
        ("cache_aware", PolicyConfig::default()),
        (
            "round_robin",
            PolicyConfig::RoundRobin(RoundRobinConfig::default()),
        ),
    ];
    let mut runs = Vec::new();
    for (policy, routing) in policies {
        eprintln!(
            "radixgate demo: {policy}: {} requests at {} req/s ...",
            args.requests, args.rate
        );
        let cluster =
            Cluster::start(args, routing, TcpListener::bind("127.0.0.1:0").await?).await?;
        let report = radixgate_sim::load::run(&load_args(args, &cluster.gateway)?).await?;
        cluster.stop().await?;
        runs.push(DemoRun { policy, report });
    }
    Ok(runs)
}

/// The comparison as a table.
pub(crate) fn table(args: &DemoArgs, runs: &[DemoRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n{} simulated workers ({} KV tokens each); shared-prefix workload: {} groups x {}-token \
         system prompts, {} requests at {} req/s, seed {}\n",
        args.workers,
        args.kv_capacity_tokens,
        args.groups,
        args.system_tokens,
        args.requests,
        args.rate,
        args.seed
    );
    let _ = writeln!(
        s,
        "{:<12} {:>9} {:>11} {:>11} {:>11} {:>8} {:>7} {:>7}",
        "policy", "hit rate", "TTFT mean", "TTFT p99", "E2E mean", "req/s", "spread", "errors"
    );
    for run in runs {
        let r = &run.report;
        let ms = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1} ms"));
        let _ = writeln!(
            s,
            "{:<12} {:>9} {:>11} {:>11} {:>11} {:>8.1} {:>7} {:>7}",
            run.policy,
            r.hit_rate
                .map_or_else(|| "-".into(), |h| format!("{:.1}%", h * 100.0)),
            ms(r.ttft_ms.as_ref().map(|t| t.mean)),
            ms(r.ttft_ms.as_ref().map(|t| t.p99)),
            ms(r.e2e_ms.as_ref().map(|t| t.mean)),
            r.requests_per_s,
            r.spread.map_or_else(|| "-".into(), |x| format!("{x:.2}")),
            r.failed,
        );
    }
    let _ = writeln!(
        s,
        "\nhit rate: prompt tokens served from a worker's KV cache; spread: busiest worker's share \
         of requests over the mean share (1.00 = even)."
    );
    s
}

/// The command: compare, print, then serve until Ctrl-C (or `--no-serve`).
pub(crate) async fn run(args: DemoArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.rate > 0.0 && args.rate.is_finite(),
        "--rate must be a positive number"
    );
    let listener = if args.no_serve {
        None
    } else {
        // Bind first: a busy port is reported before a minute of work.
        let addr = (args.host.as_str(), args.port);
        Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {}:{}", addr.0, addr.1))?,
        )
    };
    let runs = compare(&args).await?;
    print!("{}", table(&args, &runs));
    let Some(listener) = listener else {
        return Ok(());
    };

    let cluster = Cluster::start(&args, PolicyConfig::default(), listener).await?;
    let url = &cluster.gateway;
    println!(
        "\nradixgate (cache_aware) is serving on {url} in front of {} simulated workers. Try:\n\n  \
         curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n    \
         -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],\"max_tokens\":16}}'\n  \
         curl -s {url}/get_loads\n  curl -s {url}/metrics | grep radixgate_routing\n\n\
         Responses carry x-radixgate-worker and x-radixgate-decision headers. Ctrl-C stops.",
        args.workers
    );
    shutdown.cancelled().await;
    cluster.stop().await
}
