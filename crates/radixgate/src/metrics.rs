//! Prometheus metrics: one typed facade, so no metric name or label key is
//! spelled at a call site, and one text rendering for `/metrics`.
//!
//! Every [`Metrics`] owns its own recorder (from `metrics-exporter-prometheus`)
//! and records through it directly; the process-global recorder is never
//! installed, so several gateways in one process (as in tests) keep separate
//! numbers.
//!
//! Label cardinality is bounded by construction: routes, decision branches,
//! retry reasons, error kinds and rejection reasons are `&'static str` chosen
//! by the code; statuses are HTTP codes; models and workers are passed by the
//! caller, who must pass only models it serves (`None` is exported as
//! `unknown`, so a client cannot create series by inventing model names) and
//! the URLs of configured workers. Series of a removed worker keep their last
//! value: set its gauges to 0 when it is removed.
//!
//! Histograms: the recorder keeps raw samples until they are folded into the
//! buckets, which [`Metrics::render`] and [`Metrics::run_upkeep`] do. Call
//! `run_upkeep` every few seconds (the gateway's housekeeping tick) so memory
//! stays bounded when nobody scrapes.
//!
//! Concurrency: recording is lock-free for existing series apart from the
//! registry's sharded read lock taken to look a series up; rendering takes
//! the recorder's internal locks briefly. No lock is held across `.await`.

use crate::admission::Admission;
use crate::breaker::Breaker;
use ::metrics::{Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use std::time::Duration;
use tokio::time::Instant;

/// Buckets (seconds) for whole-request latency: a cached health answer in a
/// few milliseconds up to a long generation of ten minutes.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
];

/// Buckets (seconds) for time to first token: a prefix-cache hit in a
/// millisecond up to a queued long prefill of two minutes.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The exported model label for a request whose model is not served.
pub const UNKNOWN_MODEL: &str = "unknown";

const REQUESTS: &str = "radixgate_requests_total";
const LATENCY: &str = "radixgate_request_duration_seconds";
const TTFT: &str = "radixgate_time_to_first_token_seconds";
const WORKER_IN_FLIGHT: &str = "radixgate_worker_in_flight_requests";
const DECISIONS: &str = "radixgate_routing_decisions_total";
const TREE_CHARS: &str = "radixgate_tree_characters";
const RETRIES: &str = "radixgate_retries_total";
const BREAKER_STATE: &str = "radixgate_circuit_breaker_state";
const BREAKER_TRANSITIONS: &str = "radixgate_circuit_breaker_transitions_total";
const WORKER_HEALTHY: &str = "radixgate_worker_healthy";
const ADMISSION_IN_FLIGHT: &str = "radixgate_admission_in_flight_requests";
const ADMISSION_QUEUED: &str = "radixgate_admission_queued_requests";
const ADMISSION_REJECTED: &str = "radixgate_admission_rejected_total";
const UPSTREAM_ERRORS: &str = "radixgate_upstream_errors_total";

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric: name, kind, unit, help text.
const CATALOG: &[(&str, Kind, Option<Unit>, &str)] = &[
    (
        REQUESTS,
        Kind::Counter,
        None,
        "Requests answered, by route, HTTP status and model.",
    ),
    (
        LATENCY,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Time from request arrival to the end of the response body, by route.",
    ),
    (
        TTFT,
        Kind::Histogram,
        Some(Unit::Seconds),
        "Time from request arrival to the first body byte of a streamed response, by route and model.",
    ),
    (
        WORKER_IN_FLIGHT,
        Kind::Gauge,
        None,
        "Requests in flight to each worker.",
    ),
    (
        DECISIONS,
        Kind::Counter,
        None,
        "Routing decisions, by the branch of the policy that made them.",
    ),
    (
        TREE_CHARS,
        Kind::Gauge,
        None,
        "Characters of routed text the prefix tree holds for each worker.",
    ),
    (
        RETRIES,
        Kind::Counter,
        None,
        "Requests retried on another worker, by reason.",
    ),
    (
        BREAKER_STATE,
        Kind::Gauge,
        None,
        "Circuit breaker state of each worker: 0 closed, 1 open, 2 half-open.",
    ),
    (
        BREAKER_TRANSITIONS,
        Kind::Counter,
        None,
        "Circuit breaker state changes of each worker.",
    ),
    (
        WORKER_HEALTHY,
        Kind::Gauge,
        None,
        "Whether each worker passes health checks (1) or not (0).",
    ),
    (
        ADMISSION_IN_FLIGHT,
        Kind::Gauge,
        None,
        "Requests holding an admission slot.",
    ),
    (
        ADMISSION_QUEUED,
        Kind::Gauge,
        None,
        "Requests waiting for an admission slot.",
    ),
    (
        ADMISSION_REJECTED,
        Kind::Counter,
        None,
        "Requests refused by admission control, by reason (queue_full, queue_timeout).",
    ),
    (
        UPSTREAM_ERRORS,
        Kind::Counter,
        None,
        "Failed attempts at a worker, by worker and kind of error.",
    ),
];

/// Where recorded series come from; the exporter ignores it, but the
/// `Recorder` API asks for one.
static METADATA: Metadata<'static> = Metadata::new("radixgate", Level::INFO, Some(module_path!()));

/// The gateway's metrics: record with the typed methods, serve [`render`](Self::render).
#[derive(Debug)]
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl Metrics {
    /// A fresh, independent set of metrics.
    pub fn new() -> Self {
        Self::try_new().expect("the bucket lists are non-empty constants")
    }

    fn try_new() -> Result<Self, BuildError> {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(LATENCY.into()), LATENCY_BUCKETS)?
            .set_buckets_for_metric(Matcher::Full(TTFT.into()), TTFT_BUCKETS)?
            .build_recorder();
        for &(name, kind, unit, help) in CATALOG {
            let name = KeyName::from_const_str(name);
            let help = SharedString::const_str(help);
            match kind {
                Kind::Counter => recorder.describe_counter(name, unit, help),
                Kind::Gauge => recorder.describe_gauge(name, unit, help),
                Kind::Histogram => recorder.describe_histogram(name, unit, help),
            }
        }
        let handle = recorder.handle();
        // Publishes the descriptions above to the renderer.
        handle.run_upkeep();
        Ok(Self { recorder, handle })
    }

    fn counter(&self, key: &Key) -> ::metrics::Counter {
        self.recorder.register_counter(key, &METADATA)
    }

    fn gauge(&self, key: &Key) -> ::metrics::Gauge {
        self.recorder.register_gauge(key, &METADATA)
    }

    fn histogram(&self, key: &Key) -> ::metrics::Histogram {
        self.recorder.register_histogram(key, &METADATA)
    }

    /// One request answered: counts it and records its latency (arrival to
    /// the end of the body). `model` is `None` unless it is a served model.
    pub fn request_done(
        &self,
        route: &'static str,
        status: u16,
        model: Option<&str>,
        elapsed: Duration,
    ) {
        let labels = vec![
            Label::from_static_parts("route", route),
            Label::new("status", status_label(status)),
            Label::new("model", model_label(model)),
        ];
        self.counter(&Key::from_parts(REQUESTS, labels))
            .increment(1);
        let labels = vec![Label::from_static_parts("route", route)];
        self.histogram(&Key::from_parts(LATENCY, labels))
            .record(elapsed.as_secs_f64());
    }

    /// Time to the first byte of a streamed response.
    pub fn ttft(&self, route: &'static str, model: Option<&str>, elapsed: Duration) {
        let labels = vec![
            Label::from_static_parts("route", route),
            Label::new("model", model_label(model)),
        ];
        self.histogram(&Key::from_parts(TTFT, labels))
            .record(elapsed.as_secs_f64());
    }

    /// A routing decision; `branch` is e.g. `cache_hit`, `cache_miss`,
    /// `imbalanced` or `other`.
    pub fn decision(&self, branch: &'static str) {
        self.counter(&Key::from_parts(
            DECISIONS,
            vec![Label::from_static_parts("branch", branch)],
        ))
        .increment(1);
    }

    /// A retry on another worker; `reason` is e.g. `connect`, `status_5xx`, `status_429`.
    pub fn retry(&self, reason: &'static str) {
        self.counter(&Key::from_parts(
            RETRIES,
            vec![Label::from_static_parts("reason", reason)],
        ))
        .increment(1);
    }

    /// A failed attempt at a worker; `kind` is e.g. `connect`, `timeout`,
    /// `status`, `stream_broken`.
    pub fn upstream_error(&self, worker: &str, kind: &'static str) {
        self.counter(&Key::from_parts(
            UPSTREAM_ERRORS,
            vec![worker_label(worker), Label::from_static_parts("kind", kind)],
        ))
        .increment(1);
    }

    /// A request refused by admission; `reason` is `queue_full` or `queue_timeout`.
    pub fn admission_rejected(&self, reason: &'static str) {
        self.counter(&Key::from_parts(
            ADMISSION_REJECTED,
            vec![Label::from_static_parts("reason", reason)],
        ))
        .increment(1);
    }

    /// Requests in flight to a worker now.
    pub fn worker_in_flight(&self, worker: &str, in_flight: usize) {
        self.gauge(&Key::from_parts(
            WORKER_IN_FLIGHT,
            vec![worker_label(worker)],
        ))
        .set(in_flight as f64);
    }

    /// Characters the prefix tree holds for a worker now.
    pub fn tree_chars(&self, worker: &str, chars: usize) {
        self.gauge(&Key::from_parts(TREE_CHARS, vec![worker_label(worker)]))
            .set(chars as f64);
    }

    /// Whether a worker is healthy now.
    pub fn worker_healthy(&self, worker: &str, healthy: bool) {
        self.gauge(&Key::from_parts(WORKER_HEALTHY, vec![worker_label(worker)]))
            .set(if healthy { 1.0 } else { 0.0 });
    }

    /// A worker's breaker as it stands at `now`: its state gauge and its
    /// transition count (taken from the breaker, so no change is missed or
    /// counted twice whoever calls this and however often).
    pub fn breaker(&self, worker: &str, breaker: &Breaker, now: Instant) {
        self.gauge(&Key::from_parts(BREAKER_STATE, vec![worker_label(worker)]))
            .set(f64::from(breaker.state(now).as_gauge()));
        self.counter(&Key::from_parts(
            BREAKER_TRANSITIONS,
            vec![worker_label(worker)],
        ))
        .absolute(breaker.transitions());
    }

    /// The admission gate's in-flight and queued counts now.
    pub fn admission(&self, admission: &Admission) {
        self.gauge(&Key::from_static_name(ADMISSION_IN_FLIGHT))
            .set(admission.in_flight() as f64);
        self.gauge(&Key::from_static_name(ADMISSION_QUEUED))
            .set(admission.queued() as f64);
    }

    /// Folds recorded histogram samples into their buckets; call it every
    /// few seconds so memory stays bounded between scrapes.
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Everything, in the Prometheus text exposition format (with `# HELP`
    /// and `# TYPE` lines), for `GET /metrics`.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn model_label(model: Option<&str>) -> SharedString {
    match model {
        Some(m) => SharedString::from(m.to_owned()),
        None => SharedString::const_str(UNKNOWN_MODEL),
    }
}

fn worker_label(worker: &str) -> Label {
    Label::new("worker", worker.to_owned())
}

/// The status as a label, without allocating for the common codes.
fn status_label(status: u16) -> SharedString {
    let common = match status {
        200 => "200",
        204 => "204",
        400 => "400",
        401 => "401",
        404 => "404",
        408 => "408",
        413 => "413",
        429 => "429",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        other => return SharedString::from(other.to_string()),
    };
    SharedString::const_str(common)
}

#[cfg(test)]
mod tests;
