//! Every numeric setting either fails start-up with a message naming its
//! key, or serves requests without panicking (issue 11, item 6).
//!
//! The two settings the issue found (`--request-timeout-secs u64::MAX`,
//! `--retry-backoff-multiplier 1e300`) are tested directly; then a property
//! test draws random values for every numeric key, through the YAML file
//! and through the flags, and runs each accepted configuration: a real
//! gateway on loopback in front of a simulated worker, a worker answering
//! 500 (so retries and their back-off run), a stalling worker (so timeouts
//! run) and a dead one, one request through each route. A panic anywhere in
//! the process (serving threads, background tasks) fails the case: a panic
//! hook counts them.
//!
//! Outcomes only, no clocks: a request must end in an HTTP answer, or in
//! the client giving up waiting (a legitimately long back-off or timeout);
//! a connection cut by a panicking handler fails.

mod common;

use clap::Parser;
use common::{chat, client, fast_worker, sim_worker, stalling_worker};
use proptest::prelude::*;
use radixgate::config::{Config, ConfigError, ServeArgs, WorkerSpec};
use serde_json::{Value, json};
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// Loads a config as `radixgate serve ARGS` would (no environment).
fn load(args: &[&str]) -> Result<Config, ConfigError> {
    let cli = Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
        .expect("flags parse");
    cli.serve.load()
}

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts every panic in the process from now on (still printing it).
fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

#[test]
fn a_request_timeout_of_u64_max_is_a_start_up_error_naming_the_key() {
    let err = load(&["--request-timeout-secs", "18446744073709551615"]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("server.request_timeout_secs"), "{msg}");
    assert!(msg.contains("86400"), "the message states the range: {msg}");
}

#[test]
fn a_back_off_multiplier_of_1e300_is_a_start_up_error_naming_the_key() {
    let err = load(&["--retry-backoff-multiplier", "1e300"]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("retry.backoff_multiplier"), "{msg}");
    assert!(msg.contains("10"), "the message states the range: {msg}");
}

/// The issue's two settings, put straight into a `Config` (as a library
/// user would): the gateway refuses them at start, or — were validation
/// ever loosened — serves without panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issues_two_settings_never_panic_a_request() {
    count_panics();
    let pool = Pool::start().await;
    for tweak in [
        (|c: &mut Config| c.server.request_timeout_secs = u64::MAX) as fn(&mut Config),
        |c: &mut Config| {
            c.retry.backoff_multiplier = 1e300;
            c.retry.max_backoff_ms = u64::MAX;
        },
    ] {
        let mut config = pool.config();
        tweak(&mut config);
        let before = PANICS.load(Ordering::SeqCst);
        match exercise(config).await {
            Ok(()) => {}
            Err(err) => assert!(
                matches!(err, radixgate::server::StartError::Config(_)),
                "{err}"
            ),
        }
        assert_eq!(PANICS.load(Ordering::SeqCst), before, "a request panicked");
    }
}

/// The workers every accepted configuration is run against.
struct Pool {
    urls: Vec<String>,
    _stop: Vec<CancellationToken>,
}

impl Pool {
    async fn start() -> Self {
        let good = sim_worker(fast_worker()).await;
        let failing = failing_worker().await;
        let stalling = stalling_worker(vec!["data: {\"choices\":[]}\n\n"]).await;
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        Self {
            urls: vec![
                good.url.clone(),
                failing.0.clone(),
                stalling.url.clone(),
                dead,
            ],
            _stop: vec![good.stop, failing.1, stalling.stop],
        }
    }

    /// A config of these workers with quick probes; everything else default.
    fn config(&self) -> Config {
        let mut c = common::config(&self.urls.iter().map(String::as_str).collect::<Vec<_>>());
        c.retry.max_retries = 3;
        c
    }

    /// `config` with this pool's workers and no extra listener.
    fn adopt(&self, mut config: Config) -> Config {
        config.workers = self.urls.iter().cloned().map(WorkerSpec::new).collect();
        config.metrics.prometheus_port = None;
        config
    }
}

/// A worker that passes its probes and answers every request with 500.
async fn failing_worker() -> (String, CancellationToken) {
    use axum::routing::{get, post};
    let fail = || async {
        (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": {"message": "boom"}})),
        )
    };
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async {
                axum::Json(json!({"data": [{"id": radixgate_sim::server::DEFAULT_MODEL}]}))
            }),
        )
        .route("/v1/chat/completions", post(fail))
        .route("/v1/completions", post(fail))
        .route("/generate", post(fail))
        .route("/v1/embeddings", post(fail));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { s.cancelled().await })
            .await;
    });
    (url, stop)
}

/// Runs `config` on a loopback gateway and sends one request through each
/// route (several texts on the inference routes, so the failing and the
/// stalling worker get some). Every request must end in an HTTP answer with
/// a body, or in the client's own timeout; the gateway is then dropped.
async fn exercise(config: Config) -> Result<(), radixgate::server::StartError> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let mut task = tokio::spawn(radixgate::server::run(listener, config, stop.clone()));
    // Up to a second for the workers to be admitted (longer probe settings
    // leave them pending; the requests then get a clean 503).
    for _ in 0..50 {
        if task.is_finished() {
            break;
        }
        let ready = client()
            .get(format!("{url}/readiness"))
            .timeout(Duration::from_secs(1))
            .send()
            .await;
        if let Ok(r) = ready {
            let body: Value = r.json().await.unwrap_or_default();
            if body["healthy_workers"].as_u64() >= Some(3) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if task.is_finished() {
        return (&mut task).await.expect("run does not panic");
    }
    let model = radixgate_sim::server::DEFAULT_MODEL;
    let mut calls = Vec::new();
    for i in 0..4 {
        let text = format!("property case text {i} with a few words");
        calls.push(("/v1/chat/completions", chat(&text, i % 2 == 1)));
        calls.push((
            "/v1/completions",
            json!({"model": model, "prompt": text, "max_tokens": 2}),
        ));
        calls.push((
            "/generate",
            json!({"text": text, "sampling_params": {"max_new_tokens": 2}}),
        ));
        calls.push(("/v1/embeddings", json!({"model": model, "input": text})));
    }
    let posts = calls.into_iter().map(|(path, body)| {
        let request = client()
            .post(format!("{url}{path}"))
            .timeout(Duration::from_secs(2))
            .json(&body);
        async move { (path, answered(request).await) }
    });
    let gets = [
        "/v1/models",
        "/get_loads",
        "/get_server_info",
        "/workers",
        "/metrics",
        "/health",
    ]
    .map(|path| {
        let request = client()
            .get(format!("{url}{path}"))
            .timeout(Duration::from_secs(2));
        async move { (path, answered(request).await) }
    });
    let (posts, gets) = tokio::join!(
        futures::future::join_all(posts),
        futures::future::join_all(gets)
    );
    for (path, outcome) in posts.into_iter().chain(gets) {
        if let Err(err) = outcome {
            panic!("{path}: the connection ended without an answer: {err}");
        }
    }
    // Dropping the run future stops the serving threads at once (no grace).
    stop.cancel();
    task.abort();
    Ok(())
}

/// An HTTP answer with its whole body, or the client's timeout (Ok); any
/// other end — a connection closed by a panicking handler — is an error.
async fn answered(request: reqwest::RequestBuilder) -> Result<(), reqwest::Error> {
    match request.send().await {
        Ok(response) => match response.bytes().await {
            Ok(_) => Ok(()),
            Err(err) if err.is_timeout() => Ok(()),
            Err(err) => Err(err),
        },
        Err(err) if err.is_timeout() => Ok(()),
        Err(err) => Err(err),
    }
}

/// A value for a numeric key: mostly small and plausible, sometimes at or
/// past a bound, sometimes absurd.
#[derive(Clone, Debug)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn yaml(&self) -> String {
        match self {
            Self::Int(n) => n.to_string(),
            Self::Float(f) if f.is_nan() => ".nan".into(),
            Self::Float(f) if f.is_infinite() => if *f > 0.0 { ".inf" } else { "-.inf" }.into(),
            Self::Float(f) => format!("{f:?}"),
        }
    }

    fn flag(&self) -> String {
        match self {
            Self::Int(n) => n.to_string(),
            Self::Float(f) => f.to_string(),
        }
    }
}

fn num() -> impl Strategy<Value = Num> {
    prop_oneof![
        6 => (0i128..6).prop_map(Num::Int),
        3 => (0i128..200).prop_map(Num::Int),
        1 => prop::sample::select(vec![
            -1i128,
            64,
            86_400,
            86_401,
            3_600_000,
            3_600_001,
            u32::MAX as i128,
            u64::MAX as i128,
            u64::MAX as i128 + 1,
            i64::MIN as i128,
        ])
        .prop_map(Num::Int),
        2 => (0.0f64..3.0).prop_map(Num::Float),
        1 => prop::sample::select(vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.5,
            1e300,
            10.0,
            10.5,
            f64::MIN_POSITIVE,
        ])
        .prop_map(Num::Float),
    ]
}

/// Every numeric key: its place in the YAML file, its flag (if any).
const KEYS: &[(&str, &str, Option<&str>)] = &[
    ("server", "port", Some("--port")),
    ("server", "max_payload_size", Some("--max-payload-size")),
    (
        "server",
        "request_timeout_secs",
        Some("--request-timeout-secs"),
    ),
    (
        "server",
        "shutdown_grace_period_secs",
        Some("--shutdown-grace-period-secs"),
    ),
    ("server", "threads", Some("--threads")),
    (
        "health",
        "interval_secs",
        Some("--health-check-interval-secs"),
    ),
    (
        "health",
        "timeout_secs",
        Some("--health-check-timeout-secs"),
    ),
    (
        "health",
        "failure_threshold",
        Some("--health-failure-threshold"),
    ),
    (
        "health",
        "success_threshold",
        Some("--health-success-threshold"),
    ),
    ("health", "unhealthy_backoff_initial_ms", None),
    ("health", "unhealthy_backoff_max_ms", None),
    ("health", "models_refresh_secs", None),
    ("retry", "max_retries", Some("--retry-max-retries")),
    (
        "retry",
        "initial_backoff_ms",
        Some("--retry-initial-backoff-ms"),
    ),
    ("retry", "max_backoff_ms", Some("--retry-max-backoff-ms")),
    (
        "retry",
        "backoff_multiplier",
        Some("--retry-backoff-multiplier"),
    ),
    ("retry", "jitter_factor", Some("--retry-jitter-factor")),
    (
        "retry",
        "max_retry_after_secs",
        Some("--retry-max-retry-after-secs"),
    ),
    ("retry", "budget_percent", Some("--retry-budget-percent")),
    (
        "retry",
        "budget_min_per_sec",
        Some("--retry-budget-min-per-sec"),
    ),
    (
        "circuit_breaker",
        "failure_threshold",
        Some("--cb-failure-threshold"),
    ),
    (
        "circuit_breaker",
        "success_threshold",
        Some("--cb-success-threshold"),
    ),
    (
        "circuit_breaker",
        "timeout_duration_secs",
        Some("--cb-timeout-duration-secs"),
    ),
    (
        "admission",
        "max_concurrent_requests",
        Some("--max-concurrent-requests"),
    ),
    ("admission", "queue_size", Some("--queue-size")),
    (
        "admission",
        "queue_timeout_secs",
        Some("--queue-timeout-secs"),
    ),
    ("metrics", "prometheus_port", Some("--prometheus-port")),
    ("routing", "cache_threshold", Some("--cache-threshold")),
    (
        "routing",
        "balance_abs_threshold",
        Some("--balance-abs-threshold"),
    ),
    (
        "routing",
        "balance_rel_threshold",
        Some("--balance-rel-threshold"),
    ),
    (
        "routing",
        "eviction_interval_secs",
        Some("--eviction-interval-secs"),
    ),
    ("routing", "max_tree_size", Some("--max-tree-size")),
    ("routing", "max_total_chars", None),
    ("routing", "match_granularity_chars", None),
];

/// Settings drawn for a case: (key index, value), at most one per key.
fn settings() -> impl Strategy<Value = Vec<(usize, Num)>> {
    prop::collection::btree_map(0..KEYS.len(), num(), 0..6).prop_map(|m| m.into_iter().collect())
}

/// The settings as a YAML document.
fn yaml(settings: &[(usize, Num)]) -> String {
    let mut sections: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (k, v) in settings {
        let (section, key, _) = KEYS[*k];
        sections
            .entry(section)
            .or_default()
            .push(format!("  {key}: {}", v.yaml()));
    }
    sections
        .into_iter()
        .map(|(section, lines)| format!("{section}:\n{}\n", lines.join("\n")))
        .collect()
}

/// The settings as flags (those that have one).
fn flags(settings: &[(usize, Num)]) -> Vec<String> {
    settings
        .iter()
        .filter_map(|(k, v)| KEYS[*k].2.map(|flag| format!("{flag}={}", v.flag())))
        .collect()
}

/// An accepted config has every value within the documented ranges (the
/// ones the issue's panics came from, at least).
fn assert_in_range(c: &Config) {
    assert!(c.server.request_timeout_secs <= 86_400);
    assert!((1.0..=10.0).contains(&c.retry.backoff_multiplier));
    assert!(c.retry.max_backoff_ms <= 3_600_000);
    assert!((0.0..=1.0).contains(&c.retry.jitter_factor));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    // Loading alone is cheap: many cases. Honours PROPTEST_CASES.
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2000)
    ))]

    /// Through the file and through the flags, a value is either refused
    /// with a message naming a key, or accepted within its range.
    #[test]
    fn any_numeric_setting_is_refused_by_key_or_accepted_in_range(s in settings()) {
        let dir = std::env::temp_dir().join(format!("radixgate-props-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{:?}.yaml", std::thread::current().id()));
        std::fs::write(&path, yaml(&s)).unwrap();
        let by_file = load(&["--config", path.to_str().unwrap()]);
        let flags = flags(&s);
        let by_flags = Cli::try_parse_from(std::iter::once("serve".to_owned()).chain(flags))
            .map(|cli| cli.serve.load());
        for outcome in [Some(by_file), by_flags.ok()].into_iter().flatten() {
            match outcome {
                Ok(config) => assert_in_range(&config),
                Err(err) => {
                    let msg = err.to_string();
                    prop_assert!(msg.contains('`') || msg.contains("invalid config file"), "{msg}");
                }
            }
        }
    }
}

proptest! {
    // Each case runs a gateway: a few cases by default (PROPTEST_CASES
    // scales both properties of this file).
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse::<u32>().ok()).map_or(12, |n| (n / 100).max(1))
    ))]

    /// Any accepted configuration serves every route without a panic.
    #[test]
    fn any_accepted_configuration_serves_without_panicking(s in settings()) {
        count_panics();
        let dir = std::env::temp_dir().join(format!("radixgate-props-run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("case.yaml");
        std::fs::write(&path, yaml(&s)).unwrap();
        let Ok(config) = load(&["--config", path.to_str().unwrap()]) else {
            return Ok(());
        };
        let rt = runtime();
        let before = PANICS.load(Ordering::SeqCst);
        rt.block_on(async {
            let workers = Pool::start().await;
            let config = workers.adopt(config);
            exercise(config).await.expect("an accepted config starts");
        });
        rt.shutdown_background();
        prop_assert_eq!(PANICS.load(Ordering::SeqCst), before, "a panic in {}", yaml(&s));
    }
}
