//! The request path's metrics: requests answered and their latency, time to
//! first token, routing decisions, retries and failed attempts. Their names
//! and help texts live here, next to the code that records them
//! (`proxy.rs` and the files below it); the machinery is [`crate::metrics`].
//!
//! Labels: routes, decision branches, retry reasons and error kinds are
//! `&'static str` chosen by the code; statuses are HTTP codes; models are
//! passed only when served (`None` is exported as [`UNKNOWN_MODEL`], so a
//! client cannot create series by inventing model names); workers are the
//! URLs of configured workers.

use crate::metrics::{
    Describe, Family, HistogramSpec, LabelKey, LabelRef, LabelledCounters, Metrics, OneCounter,
    status_label, worker_label,
};
use ::metrics::{Counter, Histogram, Label};
use std::time::Duration;

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

pub(crate) const REQUESTS: Describe = Describe::new(
    "radixgate_requests_total",
    "Requests answered, by route, HTTP status and model.",
);
pub(crate) const LATENCY: HistogramSpec = HistogramSpec {
    describe: Describe::seconds(
        "radixgate_request_duration_seconds",
        "Time from request arrival to the end of the response body, by route.",
    ),
    buckets: LATENCY_BUCKETS,
};
pub(crate) const TTFT: HistogramSpec = HistogramSpec {
    describe: Describe::seconds(
        "radixgate_time_to_first_token_seconds",
        "Time from request arrival to the first body byte of a streamed response, by route and model.",
    ),
    buckets: TTFT_BUCKETS,
};
pub(crate) const DECISIONS: Describe = Describe::new(
    "radixgate_routing_decisions_total",
    "Routing decisions, one per attempt sent, by the branch of the policy that made them.",
);
pub(crate) const RETRIES: Describe = Describe::new(
    "radixgate_retries_total",
    "Retries on another worker, by the failure that caused them (a request retried twice counts 2).",
);
pub(crate) const RETRY_BUDGET_EXHAUSTED: Describe = Describe::new(
    "radixgate_retry_budget_exhausted_total",
    "Requests whose failure would have been retried but was their answer, the retry budget (retry.budget_percent of the requests of the last 10 s, plus retry.budget_min_per_sec) being spent.",
);
pub(crate) const UNROUTED: Describe = Describe::new(
    "radixgate_unrouted_requests_total",
    "Requests to /v1 paths the gateway has no route for, admitted and passed to the least-loaded worker of their model, by API family (the first path segment after /v1, from a fixed list; other for the rest).",
);
pub(crate) const PD_REQUESTS: Describe = Describe::new(
    "radixgate_pd_requests_total",
    "Disaggregated attempts, by path: paired (a prefill and a decode worker) or skipped_prefill (decode alone, predicted to hold the prompt).",
);
pub(crate) const PD_FAILURES: Describe = Describe::new(
    "radixgate_pd_failures_total",
    "Disaggregated attempts that failed, by the side that failed (prefill or decode); the other side was cancelled.",
);
pub(crate) const UPSTREAM_ERRORS: Describe = Describe::new(
    "radixgate_upstream_errors_total",
    "Failed attempts at a worker, by worker and kind of error.",
);

/// The request path's metric families, built once per gateway.
#[derive(Debug)]
pub struct RequestMetrics {
    /// (route, status, model)
    requests: Family<LabelKey, Counter>,
    /// by route
    latency: Family<&'static str, Histogram>,
    /// (route, 0, model)
    ttft: Family<LabelKey, Histogram>,
    /// (kind, 0, worker)
    upstream_errors: Family<LabelKey, Counter>,
    decisions: LabelledCounters,
    retries: LabelledCounters,
    retry_budget_exhausted: OneCounter,
    unrouted: LabelledCounters,
    pd_requests: LabelledCounters,
    pd_failures: LabelledCounters,
}

impl RequestMetrics {
    /// The histograms to declare to [`Metrics::with_histograms`].
    pub const HISTOGRAMS: &'static [&'static HistogramSpec] = &[&LATENCY, &TTFT];

    /// The families, in `metrics` (which must declare [`Self::HISTOGRAMS`]).
    pub fn new(metrics: &Metrics) -> Self {
        Self {
            requests: metrics.counters(&REQUESTS),
            latency: metrics.histograms(&LATENCY),
            ttft: metrics.histograms(&TTFT),
            upstream_errors: metrics.counters(&UPSTREAM_ERRORS),
            decisions: metrics.labelled_counters(&DECISIONS, "branch"),
            retries: metrics.labelled_counters(&RETRIES, "reason"),
            retry_budget_exhausted: metrics.counter(&RETRY_BUDGET_EXHAUSTED),
            unrouted: metrics.labelled_counters(&UNROUTED, "api"),
            pd_requests: metrics.labelled_counters(&PD_REQUESTS, "path"),
            pd_failures: metrics.labelled_counters(&PD_FAILURES, "side"),
        }
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
                vec![
                    Label::from_static_parts("route", route),
                    Label::new("status", status_label(status)),
                    Label::new("model", model.to_owned()),
                ]
            },
            |c| c.increment(1),
        );
        self.latency.with(
            &route,
            || route,
            || vec![Label::from_static_parts("route", route)],
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
                vec![
                    Label::from_static_parts("route", route),
                    Label::new("model", model.to_owned()),
                ]
            },
            |h| h.record(elapsed.as_secs_f64()),
        );
    }

    /// A routing decision; `branch` is e.g. `cache_hit`, `cache_miss`,
    /// `imbalanced` or `other`.
    pub fn decision(&self, branch: &'static str) {
        self.decisions.increment(branch);
    }

    /// A request to a `/v1` path the gateway has no route for, forwarded
    /// by load; `api` is its family (e.g. `audio`, `other`).
    pub fn unrouted(&self, api: &'static str) {
        self.unrouted.increment(api);
    }

    /// A disaggregated attempt, `paired` or `skipped_prefill`.
    pub fn pd_request(&self, path: &'static str) {
        self.pd_requests.increment(path);
    }

    /// A disaggregated attempt that failed on `side` (`prefill`, `decode`).
    pub fn pd_failure(&self, side: &'static str) {
        self.pd_failures.increment(side);
    }

    /// A retry on another worker; `reason` is e.g. `connect`, `status_5xx`, `status_429`.
    pub fn retry(&self, reason: &'static str) {
        self.retries.increment(reason);
    }

    /// A failed attempt that ended its request where a retry was due,
    /// when `denied` by the retry budget.
    pub fn retry_denied(&self, denied: bool) {
        if denied {
            self.retry_budget_exhausted.add(1);
        }
    }

    /// A failed attempt at a worker; `kind` is e.g. `connect`, `timeout`,
    /// `status`, `stream_broken`, `no_transfer_params`, `model_not_served`.
    pub fn upstream_error(&self, worker: &str, kind: &'static str) {
        let key = LabelRef {
            fixed: kind,
            code: 0,
            text: worker,
        };
        self.upstream_errors.with(
            &key,
            || key.to_owned_key(),
            || vec![worker_label(worker), Label::from_static_parts("kind", kind)],
            |c| c.increment(1),
        );
    }
}
