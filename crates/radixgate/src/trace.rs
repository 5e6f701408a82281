//! Request ids, and the router's own spans for OpenTelemetry.
//!
//! A request's id goes into every log line about it, and its spans to
//! OpenTelemetry:
//!
//! - **The request's log scope** ([`request_log::RequestLog`]) carries
//!   `request_id` into every log line about a request, at any level (a
//!   `WARN` line about a request names the request): the request-id
//!   middleware ([`request_id`]) makes it current around the whole
//!   handler, and the response body's watch again at the stream's end. It
//!   is not a `tracing` span (it was): a span cost every request about
//!   6,000 instructions for lines that are rarely written.
//! - **`receive`, `decision`, `attempt`, `first_byte`, `stream`**
//!   ([`OTEL_TARGET`]): the spans exported over OTLP (see `docs/tracing.md`
//!   for their attributes). Only the OpenTelemetry layer sees them, and it
//!   is installed only with `--otlp-endpoint` ([`export`]); without it no
//!   layer enables their target, so each `span!` costs one cached-interest
//!   check and yields a disabled span, and every attribute call on it
//!   returns at once. Their attributes are set with
//!   `OpenTelemetrySpanExt::set_attribute`, never as `tracing` fields, so
//!   none of this is formatted unless it is exported.
//!
//! `receive` is entered with the log scope (so the OpenTelemetry context of the
//! request is current, and `decision` and `attempt` nest under it);
//! `first_byte` and `stream` name their `attempt` as explicit parent and
//! are never entered: each ends when it is dropped. The answering
//! attempt's spans travel in the response body ([`RequestTrace`]) and end
//! with the stream, where `receive` is entered one last time so that its
//! end is the stream's end.
//!
//! Concurrency: spans are handles into the subscriber's registry; nothing
//! here holds a lock. [`exporting`] is set once, at start-up.

pub mod capped;
pub mod export;
pub mod request_id;
pub mod request_log;

use crate::stream::StreamEnd;
use crate::usage::{CachedReport, UsageTail};
use axum::http::{HeaderMap, HeaderValue};
use opentelemetry::trace::{Status, TraceContextExt};
use radixgate_routing::{Decision, WorkerRole};
use std::sync::atomic::{AtomicBool, Ordering};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub(crate) use export::SpanMetrics;
pub use export::{Logs, Telemetry, TraceError, init};
pub use request_id::{MAX_REQUEST_ID_LEN, REQUEST_ID_HEADER};

/// Target of the exported spans.
pub const OTEL_TARGET: &str = "radixgate::otel";

/// Whether the OpenTelemetry layer is installed (set once by [`init`]).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported: only then are the client's `traceparent`
/// and `tracestate` read, and replaced on the way to the worker.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The two scopes of one request, made by the request-id middleware and
/// handed to the response body through the request's extensions.
#[derive(Clone, Debug)]
pub struct RequestSpans {
    /// The log scope (`request_id`).
    pub request: request_log::RequestLog,
    /// The exported server span (disabled without export).
    pub receive: Span,
}

impl RequestSpans {
    /// The scopes the middleware left in `extensions`; the current log
    /// scope (and no exported span) where there are none.
    pub fn take(extensions: &mut axum::http::Extensions) -> Self {
        extensions.remove::<Self>().unwrap_or_else(|| Self {
            request: request_log::RequestLog::current(),
            receive: Span::none(),
        })
    }
}

/// The `decision` span, from before the choice to its explanation.
pub(crate) struct Deciding(Span);

impl Deciding {
    /// Opens it (under the current `receive`).
    pub(crate) fn start() -> Self {
        Self(tracing::info_span!(target: OTEL_TARGET, "decision"))
    }

    /// Opens it for one side of a disaggregated pair: `radixgate.role`
    /// (`prefill`, `decode`) says which.
    pub(crate) fn start_for(role: WorkerRole) -> Self {
        let deciding = Self::start();
        if !deciding.0.is_disabled() {
            deciding.0.set_attribute("radixgate.role", role.as_str());
        }
        deciding
    }

    /// Ends it with the decision's explanation as attributes; `attempt` is
    /// the number of attempts before this one.
    pub(crate) fn decided(self, decision: &Decision, attempt: usize) {
        let span = &self.0;
        if span.is_disabled() {
            return;
        }
        let e = decision.explanation();
        let worker = decision.worker();
        span.set_attribute("radixgate.decision", decision.rendered().to_string());
        span.set_attribute("radixgate.policy", e.policy);
        span.set_attribute("radixgate.branch", e.branch.as_str());
        span.set_attribute("radixgate.worker", worker.url().to_owned());
        span.set_attribute("radixgate.retry", attempt as i64);
        if let Some(matched) = e.matched_chars {
            let rate = match e.input_chars {
                0 => 0.0,
                total => matched.min(total) as f64 / total as f64,
            };
            span.set_attribute("radixgate.match", rate);
            span.set_attribute("radixgate.matched_chars", matched as i64);
            span.set_attribute("radixgate.exact", e.exact);
        }
        span.set_attribute("radixgate.input_chars", e.input_chars as i64);
        span.set_attribute("radixgate.load", e.load as i64);
        span.set_attribute("radixgate.min_load", e.min_load as i64);
        span.set_attribute("radixgate.max_load", e.max_load as i64);
        span.set_attribute("radixgate.available", e.available as i64);
        if let Some(ms) = e.ttft_ms {
            span.set_attribute("radixgate.predicted_ttft_ms", f64::from(ms));
        }
        if let Some(ms) = e.alt_ttft_ms {
            span.set_attribute("radixgate.alt_predicted_ttft_ms", f64::from(ms));
        }
    }

    /// Ends it without a worker (none could be chosen).
    pub(crate) fn failed(self, why: &dyn std::fmt::Display) {
        fail(&self.0, why);
    }
}

/// Marks `span` failed with `why`.
fn fail(span: &Span, why: &dyn std::fmt::Display) {
    if !span.is_disabled() {
        span.set_status(Status::error(why.to_string()));
    }
}

/// One attempt at a worker: its `attempt` span and, until the first byte
/// arrives, its `first_byte` span.
pub(crate) struct Attempt {
    span: Span,
    first_byte: Option<Span>,
}

impl Attempt {
    /// Opens both (under the current `receive`); `retry` is the number of
    /// attempts before this one.
    pub(crate) fn start(worker: &str, path: &str, retry: usize) -> Self {
        Self::start_in(WorkerRole::Regular, worker, path, retry)
    }

    /// [`Self::start`] for a worker in `role`: a prefill or decode
    /// worker's attempt says which in `radixgate.role`.
    pub(crate) fn start_in(role: WorkerRole, worker: &str, path: &str, retry: usize) -> Self {
        let span = tracing::info_span!(target: OTEL_TARGET, "attempt", otel.kind = "client");
        if span.is_disabled() {
            return Self {
                span,
                first_byte: None,
            };
        }
        if !role.is_regular() {
            span.set_attribute("radixgate.role", role.as_str());
        }
        span.set_attribute("radixgate.worker", worker.to_owned());
        span.set_attribute("url.full", format!("{worker}{path}"));
        span.set_attribute("http.request.method", "POST");
        span.set_attribute("radixgate.retry", retry as i64);
        let first_byte = tracing::info_span!(target: OTEL_TARGET, parent: &span, "first_byte");
        Self {
            span,
            first_byte: Some(first_byte),
        }
    }

    /// With export on, replaces the `traceparent` (and `tracestate`) the
    /// worker gets with this attempt's, so the worker's spans nest under
    /// it; otherwise leaves the client's as they are.
    pub(crate) fn inject(&self, headers: &mut HeaderMap) {
        if self.span.is_disabled() {
            return;
        }
        let cx = self.span.context();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return;
        }
        let parent = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8() & 1
        );
        if let Ok(value) = HeaderValue::from_str(&parent) {
            headers.insert("traceparent", value);
        }
        let state = sc.trace_state().header();
        match HeaderValue::from_str(&state) {
            Ok(value) if !state.is_empty() => {
                headers.insert("tracestate", value);
            }
            _ => {
                headers.remove("tracestate");
            }
        }
    }

    /// The worker's response head (and for a 2xx its first frame) came:
    /// `first_byte` ends with its status.
    pub(crate) fn answered(&mut self, status: u16) {
        if let Some(span) = self.first_byte.take() {
            span.set_attribute("http.response.status_code", i64::from(status));
        }
        if !self.span.is_disabled() {
            self.span
                .set_attribute("http.response.status_code", i64::from(status));
            if status >= 500 || status == 429 {
                self.span.set_status(Status::error(status.to_string()));
            }
        }
    }

    /// The attempt failed (`kind`: timeout, connect, status, ...): both
    /// spans end with the error.
    pub(crate) fn failed(mut self, kind: &str, why: &dyn std::fmt::Display) {
        if let Some(span) = self.first_byte.take() {
            fail(&span, why);
        }
        if !self.span.is_disabled() {
            self.span.set_attribute("error.type", kind.to_owned());
            fail(&self.span, why);
        }
    }
}

/// The request's scopes, entered; leaves the log scope, then `receive`,
/// when dropped (fields drop in order).
pub(crate) struct Entered<'a> {
    _request: request_log::Entered,
    _receive: tracing::span::Entered<'a>,
}

/// What a response body carries for tracing: the request's spans and the
/// answering attempt's, and the `stream` span from the first byte to the
/// end.
pub(crate) struct RequestTrace {
    spans: RequestSpans,
    attempt: Span,
    stream: Span,
    /// The body's tail, for its token counts (export only).
    usage: Option<UsageTail>,
}

impl RequestTrace {
    /// Starts the `stream` span of the answering `attempt`.
    pub(crate) fn new(spans: RequestSpans, attempt: Attempt) -> Self {
        let stream = tracing::info_span!(target: OTEL_TARGET, parent: &attempt.span, "stream");
        let usage = (!stream.is_disabled()).then(UsageTail::new);
        Self {
            spans,
            attempt: attempt.span,
            stream,
            usage,
        }
    }

    /// A frame went to the client.
    pub(crate) fn data(&mut self, bytes: &[u8]) {
        if let Some(tail) = self.usage.as_mut() {
            tail.push(bytes);
        }
    }

    /// Enters the request's spans (for the log lines at the stream's end,
    /// and so that `receive` ends there).
    pub(crate) fn enter(&self) -> Entered<'_> {
        let receive = self.spans.receive.enter();
        Entered {
            _request: self.spans.request.enter(),
            _receive: receive,
        }
    }

    /// The stream ended: its outcome and token counts go on `stream` and
    /// `attempt`, which end here, before `receive` (which ends when the
    /// request's spans are last exited).
    pub(crate) fn end(&mut self, end: StreamEnd) {
        if self.stream.is_disabled() {
            return;
        }
        self.record(end);
        self.stream = Span::none();
        self.attempt = Span::none();
    }

    fn record(&mut self, end: StreamEnd) {
        let outcome = match end {
            StreamEnd::Complete => "complete",
            StreamEnd::UpstreamError => "upstream_error",
            StreamEnd::ClientGone => "client_gone",
            StreamEnd::Shutdown => "shutdown",
            StreamEnd::TimedOut => "timed_out",
        };
        for span in [&self.stream, &self.attempt] {
            span.set_attribute("radixgate.outcome", outcome);
        }
        if end == StreamEnd::UpstreamError {
            fail(&self.stream, &"the worker's stream broke off or stalled");
        }
        if let Some(mut tail) = self.usage.take() {
            if let Some(total) = tail.tokens() {
                self.stream
                    .set_attribute("radixgate.total_tokens", total as i64);
            }
            if let CachedReport::Report {
                prompt_tokens,
                cached_tokens,
            } = tail.cached()
            {
                self.stream
                    .set_attribute("gen_ai.usage.input_tokens", prompt_tokens as i64);
                self.stream
                    .set_attribute("radixgate.cached_tokens", cached_tokens as i64);
            }
        }
    }
}
