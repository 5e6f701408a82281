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
//! Concurrency: each family's handles are cached per label combination
//! (`metrics/series.rs`), so recording an existing series takes one read lock (a
//! `parking_lot::RwLock`, short, never across `.await`) and an atomic
//! update; only the first use of a combination registers it with the
//! recorder. Rendering takes the recorder's internal locks briefly.

use crate::admission::Admission;
use crate::breaker::Breaker;
use ::metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use series::{LabelKey, LabelRef, Series};
use std::time::Duration;
use tokio::time::Instant;

mod series;

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
const TENANT_REQUESTS: &str = "radixgate_tenant_requests_total";
const TENANT_TOKENS: &str = "radixgate_tenant_tokens_total";
const TENANT_RATE_LIMITED: &str = "radixgate_tenant_rate_limited_total";
const OUTLIER_EJECTIONS: &str = "radixgate_outlier_ejections_total";
const OUTLIER_EJECTED: &str = "radixgate_outlier_ejected";

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
    (
        TENANT_REQUESTS,
        Kind::Counter,
        None,
        "Client requests, by tenant and HTTP status.",
    ),
    (
        TENANT_TOKENS,
        Kind::Counter,
        None,
        "Tokens workers reported using, by tenant.",
    ),
    (
        TENANT_RATE_LIMITED,
        Kind::Counter,
        None,
        "Requests refused by a tenant's limit, by tenant and limit (requests, tokens).",
    ),
    (
        OUTLIER_EJECTIONS,
        Kind::Counter,
        None,
        "Times outlier detection ejected each worker (far slower than its peers).",
    ),
    (
        OUTLIER_EJECTED,
        Kind::Gauge,
        None,
        "Whether each worker is ejected by outlier detection now (1) or not (0).",
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
    /// (route, status, model)
    requests: Series<LabelKey, Counter>,
    /// by route
    latency: Series<&'static str, Histogram>,
    /// (route, 0, model)
    ttft: Series<LabelKey, Histogram>,
    /// (kind, 0, worker)
    upstream_errors: Series<LabelKey, Counter>,
    decisions: Series<&'static str, Counter>,
    retries: Series<&'static str, Counter>,
    rejections: Series<&'static str, Counter>,
    worker_in_flight: Series<Box<str>, Gauge>,
    tree_chars: Series<Box<str>, Gauge>,
    worker_healthy: Series<Box<str>, Gauge>,
    breaker_state: Series<Box<str>, Gauge>,
    breaker_transitions: Series<Box<str>, Counter>,
    /// ("", status, tenant); tenant names come from the config, never a client.
    tenant_requests: Series<LabelKey, Counter>,
    tenant_tokens: Series<Box<str>, Counter>,
    /// (limit, 0, tenant)
    tenant_limited: Series<LabelKey, Counter>,
    outlier_ejections: Series<Box<str>, Counter>,
    outlier_ejected: Series<Box<str>, Gauge>,
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
        Ok(Self {
            recorder,
            handle,
            requests: Series::new(),
            latency: Series::new(),
            ttft: Series::new(),
            upstream_errors: Series::new(),
            decisions: Series::new(),
            retries: Series::new(),
            rejections: Series::new(),
            worker_in_flight: Series::new(),
            tree_chars: Series::new(),
            worker_healthy: Series::new(),
            breaker_state: Series::new(),
            breaker_transitions: Series::new(),
            tenant_requests: Series::new(),
            tenant_tokens: Series::new(),
            tenant_limited: Series::new(),
            outlier_ejections: Series::new(),
            outlier_ejected: Series::new(),
        })
    }

    fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        self.recorder
            .register_counter(&Key::from_parts(name, labels), &METADATA)
    }

    fn gauge(&self, name: &'static str, labels: Vec<Label>) -> Gauge {
        self.recorder
            .register_gauge(&Key::from_parts(name, labels), &METADATA)
    }

    fn histogram(&self, name: &'static str, labels: Vec<Label>) -> Histogram {
        self.recorder
            .register_histogram(&Key::from_parts(name, labels), &METADATA)
    }

    /// A counter labelled by one static value.
    fn static_counter(
        &self,
        series: &Series<&'static str, Counter>,
        name: &'static str,
        label: &'static str,
        value: &'static str,
    ) {
        series.with(
            &value,
            || value,
            || self.counter(name, vec![Label::from_static_parts(label, value)]),
            |c| c.increment(1),
        );
    }

    /// The gauge of one worker in `series`.
    fn worker_gauge(
        &self,
        series: &Series<Box<str>, Gauge>,
        name: &'static str,
        worker: &str,
        value: f64,
    ) {
        series.with(
            worker,
            || worker.into(),
            || self.gauge(name, vec![worker_label(worker)]),
            |g| g.set(value),
        );
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
        let model = model.unwrap_or(UNKNOWN_MODEL);
        let key = LabelRef {
            fixed: route,
            code: status,
            text: model,
        };
        self.requests.with(
            &key,
            || key.to_owned_key(),
            || {
                self.counter(
                    REQUESTS,
                    vec![
                        Label::from_static_parts("route", route),
                        Label::new("status", status_label(status)),
                        Label::new("model", model.to_owned()),
                    ],
                )
            },
            |c| c.increment(1),
        );
        self.latency.with(
            &route,
            || route,
            || self.histogram(LATENCY, vec![Label::from_static_parts("route", route)]),
            |h| h.record(elapsed.as_secs_f64()),
        );
    }

    /// Time to the first byte of a streamed response.
    pub fn ttft(&self, route: &'static str, model: Option<&str>, elapsed: Duration) {
        let model = model.unwrap_or(UNKNOWN_MODEL);
        let key = LabelRef {
            fixed: route,
            code: 0,
            text: model,
        };
        self.ttft.with(
            &key,
            || key.to_owned_key(),
            || {
                self.histogram(
                    TTFT,
                    vec![
                        Label::from_static_parts("route", route),
                        Label::new("model", model.to_owned()),
                    ],
                )
            },
            |h| h.record(elapsed.as_secs_f64()),
        );
    }

    /// A routing decision; `branch` is e.g. `cache_hit`, `cache_miss`,
    /// `imbalanced` or `other`.
    pub fn decision(&self, branch: &'static str) {
        self.static_counter(&self.decisions, DECISIONS, "branch", branch);
    }

    /// A retry on another worker; `reason` is e.g. `connect`, `status_5xx`, `status_429`.
    pub fn retry(&self, reason: &'static str) {
        self.static_counter(&self.retries, RETRIES, "reason", reason);
    }

    /// A request refused by admission; `reason` is `queue_full` or `queue_timeout`.
    pub fn admission_rejected(&self, reason: &'static str) {
        self.static_counter(&self.rejections, ADMISSION_REJECTED, "reason", reason);
    }

    /// A failed attempt at a worker; `kind` is e.g. `connect`, `timeout`,
    /// `status`, `stream_broken`.
    pub fn upstream_error(&self, worker: &str, kind: &'static str) {
        let key = LabelRef {
            fixed: kind,
            code: 0,
            text: worker,
        };
        self.upstream_errors.with(
            &key,
            || key.to_owned_key(),
            || {
                self.counter(
                    UPSTREAM_ERRORS,
                    vec![worker_label(worker), Label::from_static_parts("kind", kind)],
                )
            },
            |c| c.increment(1),
        );
    }

    /// Requests in flight to a worker now.
    pub fn worker_in_flight(&self, worker: &str, in_flight: usize) {
        self.worker_gauge(
            &self.worker_in_flight,
            WORKER_IN_FLIGHT,
            worker,
            in_flight as f64,
        );
    }

    /// Characters the prefix tree holds for a worker now.
    pub fn tree_chars(&self, worker: &str, chars: usize) {
        self.worker_gauge(&self.tree_chars, TREE_CHARS, worker, chars as f64);
    }

    /// Whether a worker is healthy now.
    pub fn worker_healthy(&self, worker: &str, healthy: bool) {
        let value = if healthy { 1.0 } else { 0.0 };
        self.worker_gauge(&self.worker_healthy, WORKER_HEALTHY, worker, value);
    }

    /// A worker's breaker as it stands at `now`: its state gauge and its
    /// transition count (taken from the breaker, so no change is missed or
    /// counted twice whoever calls this and however often).
    pub fn breaker(&self, worker: &str, breaker: &Breaker, now: Instant) {
        let state = f64::from(breaker.state(now).as_gauge());
        self.worker_gauge(&self.breaker_state, BREAKER_STATE, worker, state);
        self.breaker_transitions.with(
            worker,
            || worker.into(),
            || self.counter(BREAKER_TRANSITIONS, vec![worker_label(worker)]),
            |c| c.absolute(breaker.transitions()),
        );
    }

    /// Outlier detection ejected a worker.
    pub fn outlier_ejection(&self, worker: &str) {
        self.outlier_ejections.with(
            worker,
            || worker.into(),
            || self.counter(OUTLIER_EJECTIONS, vec![worker_label(worker)]),
            |c| c.increment(1),
        );
    }

    /// Whether a worker is ejected by outlier detection now.
    pub fn outlier_ejected(&self, worker: &str, ejected: bool) {
        let value = if ejected { 1.0 } else { 0.0 };
        self.worker_gauge(&self.outlier_ejected, OUTLIER_EJECTED, worker, value);
    }

    /// The admission gate's in-flight and queued counts now.
    pub fn admission(&self, admission: &Admission) {
        let key = Key::from_static_name(ADMISSION_IN_FLIGHT);
        self.recorder
            .register_gauge(&key, &METADATA)
            .set(admission.in_flight() as f64);
        let key = Key::from_static_name(ADMISSION_QUEUED);
        self.recorder
            .register_gauge(&key, &METADATA)
            .set(admission.queued() as f64);
    }

    /// A tenant's request answered with `status`.
    pub fn tenant_request(&self, tenant: &str, status: u16) {
        let key = LabelRef {
            fixed: "",
            code: status,
            text: tenant,
        };
        let labels = || {
            vec![
                tenant_label(tenant),
                Label::new("status", status_label(status)),
            ]
        };
        self.tenant_requests.with(
            &key,
            || key.to_owned_key(),
            || self.counter(TENANT_REQUESTS, labels()),
            |c| c.increment(1),
        );
    }

    /// Tokens a worker reported using for a tenant's request.
    pub fn tenant_tokens(&self, tenant: &str, tokens: u64) {
        let make = || self.counter(TENANT_TOKENS, vec![tenant_label(tenant)]);
        self.tenant_tokens
            .with(tenant, || tenant.into(), make, |c| c.increment(tokens));
    }

    /// A tenant's request refused by its `limit` (`requests` or `tokens`).
    pub fn tenant_rate_limited(&self, tenant: &str, limit: &'static str) {
        let key = LabelRef {
            fixed: limit,
            code: 0,
            text: tenant,
        };
        let labels = || {
            vec![
                tenant_label(tenant),
                Label::from_static_parts("limit", limit),
            ]
        };
        self.tenant_limited.with(
            &key,
            || key.to_owned_key(),
            || self.counter(TENANT_RATE_LIMITED, labels()),
            |c| c.increment(1),
        );
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

fn tenant_label(tenant: &str) -> Label {
    Label::new("tenant", tenant.to_owned())
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
