//! Rendering, through the families the components own: every metric of the
//! gateway with its values, help text and type; independence of gateways;
//! histogram upkeep. (The machinery imports no component; its tests use
//! them to render what a gateway exports.)

use super::*;
use crate::admission::{self, Admission};
use crate::breaker::set::BreakerMetrics;
use crate::breaker::{self, Breaker, Outcome};
use crate::config::{AdmissionConfig, BreakerConfig};
use crate::error::GatewayError;
use crate::outlier::{self, OutlierMetrics};
use crate::proxy::metrics as request;
use crate::proxy::{LATENCY_BUCKETS, RequestMetrics, TTFT_BUCKETS, UNKNOWN_MODEL};
use crate::tenants::{self, TenantMetrics};
use crate::upkeep::{self, WorkerGauges};
use prometheus_parse::{LineInfo, Sample, Scrape, Value};
use std::collections::HashSet;
use std::time::Duration;
use tokio::time::Instant;

const REQUESTS: &str = request::REQUESTS.name;
const LATENCY: &str = request::LATENCY.describe.name;
const TTFT: &str = request::TTFT.describe.name;
const DECISIONS: &str = request::DECISIONS.name;
const RETRIES: &str = request::RETRIES.name;
const UPSTREAM_ERRORS: &str = request::UPSTREAM_ERRORS.name;
const WORKER_IN_FLIGHT: &str = upkeep::WORKER_IN_FLIGHT.name;
const WORKER_HEALTHY: &str = upkeep::WORKER_HEALTHY.name;
const TREE_CHARS: &str = upkeep::TREE_CHARS.name;
const BREAKER_STATE: &str = breaker::set::STATE.name;
const BREAKER_TRANSITIONS: &str = breaker::set::TRANSITIONS.name;
const ADMISSION_IN_FLIGHT: &str = admission::IN_FLIGHT.name;
const ADMISSION_QUEUED: &str = admission::QUEUED.name;
const ADMISSION_REJECTED: &str = admission::REJECTED.name;
const TENANT_REQUESTS: &str = tenants::metrics::REQUESTS.name;
const TENANT_TOKENS: &str = tenants::metrics::TOKENS.name;
const TENANT_RATE_LIMITED: &str = tenants::metrics::RATE_LIMITED.name;
const OUTLIER_EJECTIONS: &str = outlier::EJECTIONS.name;
const OUTLIER_EJECTED: &str = outlier::EJECTED.name;

/// A gateway's recorder with its histograms declared.
fn gateway_metrics() -> Metrics {
    Metrics::with_histograms(RequestMetrics::HISTOGRAMS)
}

/// Every metric a gateway exports, with its type.
fn catalog() -> [(&'static Describe, &'static str); 19] {
    [
        (&request::REQUESTS, "counter"),
        (&request::LATENCY.describe, "histogram"),
        (&request::TTFT.describe, "histogram"),
        (&upkeep::WORKER_IN_FLIGHT, "gauge"),
        (&request::DECISIONS, "counter"),
        (&upkeep::TREE_CHARS, "gauge"),
        (&request::RETRIES, "counter"),
        (&breaker::set::STATE, "gauge"),
        (&breaker::set::TRANSITIONS, "counter"),
        (&upkeep::WORKER_HEALTHY, "gauge"),
        (&admission::IN_FLIGHT, "gauge"),
        (&admission::QUEUED, "gauge"),
        (&admission::REJECTED, "counter"),
        (&request::UPSTREAM_ERRORS, "counter"),
        (&tenants::metrics::REQUESTS, "counter"),
        (&tenants::metrics::TOKENS, "counter"),
        (&tenants::metrics::RATE_LIMITED, "counter"),
        (&outlier::EJECTIONS, "counter"),
        (&outlier::EJECTED, "gauge"),
    ]
}

const CHAT: &str = "/v1/chat/completions";
const W1: &str = "http://127.0.0.1:30001";
const W2: &str = "http://127.0.0.1:30002";

/// Parses strictly: every line must be a HELP, TYPE, sample or empty line,
/// every sample's family must have both a HELP and a TYPE line, and the
/// whole text must parse as a scrape.
fn parse(text: &str) -> Scrape {
    let mut helped = HashSet::new();
    let mut typed = HashSet::new();
    for line in text.lines() {
        match LineInfo::parse(line) {
            LineInfo::Doc { metric_name, .. } => {
                helped.insert(metric_name.to_owned());
            }
            LineInfo::Type {
                metric_name,
                metric_alias,
                ..
            } => {
                typed.insert(metric_alias.unwrap_or(metric_name));
            }
            LineInfo::Sample { metric_name, .. } => {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| {
                        metric_name
                            .strip_suffix(suffix)
                            .filter(|base| typed.contains(*base))
                    })
                    .unwrap_or(metric_name);
                assert!(typed.contains(family), "no # TYPE before: {line}");
                assert!(helped.contains(family), "no # HELP before: {line}");
            }
            LineInfo::Empty => {}
            LineInfo::Ignored => panic!("not Prometheus text: {line:?}"),
        }
    }
    Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("parses")
}

fn find<'a>(scrape: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> &'a Sample {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no sample {metric} {labels:?}"))
}

fn scalar(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    match find(scrape, metric, labels).value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
        ref other => panic!("{metric} is not a scalar: {other:?}"),
    }
}

/// The cumulative count of a histogram's bucket with upper bound `le`.
fn bucket(scrape: &Scrape, metric: &str, labels: &[(&str, &str)], le: f64) -> f64 {
    match &find(scrape, metric, labels).value {
        Value::Histogram(buckets) => {
            buckets
                .iter()
                .find(|b| b.less_than == le)
                .unwrap_or_else(|| panic!("no bucket le={le}"))
                .count
        }
        other => panic!("{metric} is not a histogram: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn every_metric_renders_as_valid_text_with_its_values() {
    let metrics = gateway_metrics();
    let m = RequestMetrics::new(&metrics);
    let w = WorkerGauges::new(&metrics);
    let admission = Admission::new(
        &AdmissionConfig {
            max_concurrent_requests: Some(1),
            queue_size: 0,
            ..AdmissionConfig::default()
        },
        &metrics,
    );
    m.request_done(CHAT, 200, Some("llama"), Duration::from_millis(300));
    m.request_done(CHAT, 200, Some("llama"), Duration::from_millis(40));
    m.request_done(CHAT, 404, None, Duration::from_millis(1));
    m.request_done("/generate", 599, Some("llama"), Duration::from_secs(200));
    m.ttft(CHAT, Some("llama"), Duration::from_millis(3));
    m.decision("cache_hit");
    m.decision("cache_hit");
    m.decision("imbalanced");
    m.retry("connect");
    m.upstream_error(W1, "connect");
    let _held = admission
        .acquire(Default::default())
        .await
        .expect("admitted");
    let refused = admission.acquire(Default::default()).await;
    assert!(matches!(refused, Err(GatewayError::QueueFull { .. })));
    w.in_flight(W1, 7);
    w.in_flight(W2, 0);
    w.tree_chars(W1, 123_456);
    w.healthy(W1, true);
    w.healthy(W2, false);
    let tenants = TenantMetrics::new(&metrics);
    tenants.request("team-a", 429);
    tenants.tokens("team-a", 40);
    tenants.tokens("team-a", 2);
    tenants.rate_limited("team-a", "tokens");

    let cfg = BreakerConfig {
        failure_threshold: 1,
        ..BreakerConfig::default()
    };
    let breaker = Arc::new(Breaker::new(&cfg));
    let now = Instant::now();
    let permit = breaker.try_acquire(now).expect("closed");
    let _ = permit.record(Outcome::Failure, now);
    let b = BreakerMetrics::new(&metrics);
    b.record(W1, WorkerId(1), &breaker, now);
    b.record(W1, WorkerId(1), &breaker, now); // idempotent: the count comes from the breaker

    admission.publish_metrics();
    let outliers = OutlierMetrics::new(&metrics);
    outliers.ejection(W1);
    outliers.ejected(W1, true);

    let text = metrics.render();
    let s = parse(&text);
    let llama_ok = [("route", CHAT), ("status", "200"), ("model", "llama")];
    assert_eq!(scalar(&s, REQUESTS, &llama_ok), 2.0);
    let unknown = [("route", CHAT), ("status", "404"), ("model", UNKNOWN_MODEL)];
    assert_eq!(scalar(&s, REQUESTS, &unknown), 1.0);
    let odd = [("route", "/generate"), ("status", "599")];
    assert_eq!(scalar(&s, REQUESTS, &odd), 1.0);

    let chat = [("route", CHAT)];
    assert_eq!(bucket(&s, LATENCY, &chat, 0.025), 1.0, "1 ms");
    assert_eq!(bucket(&s, LATENCY, &chat, 0.25), 2.0, "+40 ms");
    assert_eq!(bucket(&s, LATENCY, &chat, 0.5), 3.0, "+300 ms");
    assert_eq!(bucket(&s, LATENCY, &chat, f64::INFINITY), 3.0);
    assert_eq!(scalar(&s, &format!("{LATENCY}_count"), &chat), 3.0);
    let long = [("route", "/generate")];
    assert_eq!(bucket(&s, LATENCY, &long, 120.0), 0.0);
    assert_eq!(
        bucket(&s, LATENCY, &long, 300.0),
        1.0,
        "minutes are bucketed"
    );
    let ttft = [("route", CHAT), ("model", "llama")];
    assert_eq!(bucket(&s, TTFT, &ttft, 0.0025), 0.0);
    assert_eq!(bucket(&s, TTFT, &ttft, 0.005), 1.0);

    assert_eq!(scalar(&s, DECISIONS, &[("branch", "cache_hit")]), 2.0);
    assert_eq!(scalar(&s, DECISIONS, &[("branch", "imbalanced")]), 1.0);
    assert_eq!(scalar(&s, RETRIES, &[("reason", "connect")]), 1.0);
    let err = [("worker", W1), ("kind", "connect")];
    assert_eq!(scalar(&s, UPSTREAM_ERRORS, &err), 1.0);
    assert_eq!(scalar(&s, OUTLIER_EJECTIONS, &[("worker", W1)]), 1.0);
    assert_eq!(scalar(&s, OUTLIER_EJECTED, &[("worker", W1)]), 1.0);
    assert_eq!(
        scalar(&s, ADMISSION_REJECTED, &[("reason", "queue_full")]),
        1.0
    );
    assert_eq!(scalar(&s, WORKER_IN_FLIGHT, &[("worker", W1)]), 7.0);
    assert_eq!(scalar(&s, WORKER_IN_FLIGHT, &[("worker", W2)]), 0.0);
    assert_eq!(scalar(&s, TREE_CHARS, &[("worker", W1)]), 123_456.0);
    assert_eq!(scalar(&s, WORKER_HEALTHY, &[("worker", W1)]), 1.0);
    assert_eq!(scalar(&s, WORKER_HEALTHY, &[("worker", W2)]), 0.0);
    assert_eq!(scalar(&s, BREAKER_STATE, &[("worker", W1)]), 1.0, "open");
    assert_eq!(scalar(&s, BREAKER_TRANSITIONS, &[("worker", W1)]), 1.0);
    assert_eq!(scalar(&s, ADMISSION_IN_FLIGHT, &[]), 1.0);
    assert_eq!(scalar(&s, ADMISSION_QUEUED, &[]), 0.0);
    let tenant = ("tenant", "team-a");
    assert_eq!(
        scalar(&s, TENANT_REQUESTS, &[tenant, ("status", "429")]),
        1.0
    );
    assert_eq!(scalar(&s, TENANT_TOKENS, &[tenant]), 42.0);
    assert_eq!(
        scalar(&s, TENANT_RATE_LIMITED, &[tenant, ("limit", "tokens")]),
        1.0
    );

    // Every family in the catalog showed up, with its help text and type.
    for (describe, kind) in catalog() {
        let (name, help) = (describe.name, describe.help);
        assert_eq!(s.docs.get(name).map(String::as_str), Some(help), "{name}");
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
    }
}

#[test]
fn instances_are_independent() {
    let (ma, mb) = (gateway_metrics(), gateway_metrics());
    let (a, b) = (RequestMetrics::new(&ma), RequestMetrics::new(&mb));
    a.decision("cache_miss");
    a.decision("cache_miss");
    b.decision("cache_miss");
    let (sa, sb) = (parse(&ma.render()), parse(&mb.render()));
    assert_eq!(scalar(&sa, DECISIONS, &[("branch", "cache_miss")]), 2.0);
    assert_eq!(scalar(&sb, DECISIONS, &[("branch", "cache_miss")]), 1.0);
    let fresh = gateway_metrics();
    let _families = RequestMetrics::new(&fresh);
    assert!(!fresh.render().contains(DECISIONS));
}

#[test]
fn gauges_follow_the_latest_value_and_breaker_transitions_accumulate() {
    let metrics = Metrics::new();
    let w = WorkerGauges::new(&metrics);
    let m = BreakerMetrics::new(&metrics);
    w.in_flight(W1, 5);
    w.in_flight(W1, 2);
    let s = parse(&metrics.render());
    assert_eq!(scalar(&s, WORKER_IN_FLIGHT, &[("worker", W1)]), 2.0);

    let cfg = BreakerConfig {
        failure_threshold: 1,
        success_threshold: 1,
        timeout_duration_secs: 1,
        ..BreakerConfig::default()
    };
    let breaker = Arc::new(Breaker::new(&cfg));
    let t0 = Instant::now();
    let _ = breaker
        .try_acquire(t0)
        .expect("closed")
        .record(Outcome::Failure, t0);
    m.record(W1, WorkerId(1), &breaker, t0);
    let t1 = t0 + Duration::from_secs(1);
    m.record(W1, WorkerId(1), &breaker, t1);
    let s = parse(&metrics.render());
    assert_eq!(
        scalar(&s, BREAKER_STATE, &[("worker", W1)]),
        2.0,
        "half-open"
    );
    let _ = breaker
        .try_acquire(t1)
        .expect("probe")
        .record(Outcome::Success, t1);
    m.record(W1, WorkerId(1), &breaker, t1);
    let s = parse(&metrics.render());
    assert_eq!(scalar(&s, BREAKER_STATE, &[("worker", W1)]), 0.0, "closed");
    assert_eq!(scalar(&s, BREAKER_TRANSITIONS, &[("worker", W1)]), 3.0);
}

/// A worker removed and added back at its URL is a new worker with a new
/// breaker, whose transitions count on in the URL's series.
#[test]
fn a_new_worker_at_a_url_counts_on_from_its_series() {
    let metrics = Metrics::new();
    let m = BreakerMetrics::new(&metrics);
    let cfg = BreakerConfig {
        failure_threshold: 1,
        ..BreakerConfig::default()
    };
    let fail = |breaker: &Arc<Breaker>, at: Instant| {
        let _ = breaker
            .try_acquire(at)
            .expect("closed")
            .record(Outcome::Failure, at);
    };
    let t0 = Instant::now();
    let old = Arc::new(Breaker::new(&cfg));
    fail(&old, t0);
    m.record(W1, WorkerId(1), &old, t0);
    m.record(W1, WorkerId(1), &old, t0);
    let s = parse(&metrics.render());
    assert_eq!(scalar(&s, BREAKER_TRANSITIONS, &[("worker", W1)]), 1.0);

    let new = Arc::new(Breaker::new(&cfg));
    m.record(W1, WorkerId(2), &new, t0);
    fail(&new, t0);
    m.record(W1, WorkerId(2), &new, t0);
    let s = parse(&metrics.render());
    assert_eq!(
        scalar(&s, BREAKER_TRANSITIONS, &[("worker", W1)]),
        2.0,
        "the new worker's breaker opened once more"
    );
}

#[test]
fn upkeep_folds_samples_into_buckets() {
    let metrics = gateway_metrics();
    let m = RequestMetrics::new(&metrics);
    for i in 0..10_000u64 {
        m.ttft(CHAT, Some("llama"), Duration::from_micros(i * 10));
        if i % 1000 == 0 {
            metrics.run_upkeep();
        }
    }
    let s = parse(&metrics.render());
    let ttft = [("route", CHAT), ("model", "llama")];
    assert_eq!(bucket(&s, TTFT, &ttft, f64::INFINITY), 10_000.0);
    // 0..=99.99 ms in 10 µs steps: 0..=10 ms holds 1001 samples.
    assert_eq!(bucket(&s, TTFT, &ttft, 0.01), 1001.0);
}

#[test]
fn buckets_span_milliseconds_to_minutes() {
    for buckets in [LATENCY_BUCKETS, TTFT_BUCKETS] {
        assert!(buckets.windows(2).all(|w| w[0] < w[1]), "increasing");
        assert!(buckets[0] <= 0.005);
        assert!(*buckets.last().expect("non-empty") >= 120.0);
    }
}

/// Whether any sample of the scrape is labelled `worker` = `url`.
fn mentions(scrape: &Scrape, url: &str) -> bool {
    scrape
        .samples
        .iter()
        .any(|s| s.labels.get("worker") == Some(url))
}

/// Runs the gateway's upkeep and a scrape every sixteenth of the idle
/// time, for `how_long`.
fn run_for(metrics: &Metrics, how_long: Duration) {
    let started = std::time::Instant::now();
    while started.elapsed() < how_long {
        metrics.run_upkeep();
        let _ = metrics.render();
        std::thread::sleep(metrics.idle / 16);
    }
}

/// Under pod churn a removed worker's series must not stay forever: once
/// forgotten they go after the idle time, while live series nobody updated
/// meanwhile stay (their cached handles are touched), with their values.
#[test]
fn a_removed_workers_series_go_after_the_idle_time_and_quiet_live_ones_stay() {
    // Far above a test thread's pauses on a busy machine: a live series is
    // lost only if no touch comes for this long.
    let idle = Duration::from_millis(1_500);
    let metrics = Metrics::with_idle(RequestMetrics::HISTOGRAMS, idle);
    let m = RequestMetrics::new(&metrics);
    let w = WorkerGauges::new(&metrics);
    for worker in [W1, W2] {
        w.in_flight(worker, 3);
        w.healthy(worker, true);
        m.upstream_error(worker, "connect");
    }
    m.request_done(CHAT, 200, Some("llama"), Duration::from_millis(30));
    let s = parse(&metrics.render());
    assert!(mentions(&s, W1) && mentions(&s, W2));

    // W1 is removed: its owner zeroes its gauges and forgets its handles.
    w.in_flight(W1, 0);
    w.healthy(W1, false);
    assert_eq!(metrics.forget_worker(W1), 3);
    // A request that was still running on it ends after that.
    m.upstream_error(W1, "stream_broken");
    run_for(&metrics, idle * 3);
    let s = parse(&metrics.render());
    assert!(!mentions(&s, W1), "the removed worker's series stayed");
    // However late: a stream cut at its timeout, long after the removal.
    m.upstream_error(W1, "timeout");
    run_for(&metrics, idle * 3);
    let s = parse(&metrics.render());
    assert!(
        !mentions(&s, W1),
        "a late series of the removed worker stayed"
    );
    assert_eq!(scalar(&s, UPSTREAM_ERRORS, &[("worker", W2)]), 1.0);
    assert_eq!(scalar(&s, WORKER_HEALTHY, &[("worker", W2)]), 1.0);
    assert_eq!(scalar(&s, WORKER_IN_FLIGHT, &[("worker", W2)]), 3.0);
    assert_eq!(
        scalar(&s, REQUESTS, &[("route", CHAT), ("status", "200")]),
        1.0
    );

    // Back at the same address: new series, counted from the start, and
    // kept.
    metrics.revive_worker(W1);
    m.upstream_error(W1, "connect");
    m.upstream_error(W2, "connect");
    run_for(&metrics, idle * 2);
    let s = parse(&metrics.render());
    assert_eq!(scalar(&s, UPSTREAM_ERRORS, &[("worker", W1)]), 1.0);
    assert_eq!(scalar(&s, UPSTREAM_ERRORS, &[("worker", W2)]), 2.0);
}

/// A worker that reports more tokens than a `u64` holds over two answers
/// (a lie, or a broken worker) leaves the tenant's counter at its largest
/// value: it never wraps round to a small one, which Prometheus would read
/// as a reset.
#[test]
fn a_tenants_token_counter_saturates() {
    let metrics = gateway_metrics();
    let tenants = TenantMetrics::new(&metrics);
    tenants.tokens("team-a", u64::MAX - 1);
    tenants.tokens("team-a", 5);
    let text = metrics.render();
    let line = format!("{TENANT_TOKENS}{{tenant=\"team-a\"}} {}", u64::MAX);
    assert!(text.lines().any(|l| l == line), "{text}");
}
