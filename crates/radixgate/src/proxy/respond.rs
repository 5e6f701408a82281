//! The worker's answer on its way to the client: [`respond`] sets the
//! decision's headers and wraps the body in a [`WatchedBody`] whose
//! [`RequestWatch`] holds everything the request keeps until its body
//! ends (the load guard, the admission and breaker permits, the spans),
//! and at that end settles it: the first token's time, the routing
//! correction from the worker's cached-token report, the trace recording,
//! the breaker's record and the request's metrics. One watch per request,
//! built whole here; nothing is released by hand elsewhere.

use super::attempt::{is_encoded, is_event_stream, record};
use super::{Answer, DECISION_NAME, Endpoint, WORKER_NAME, pd};
use crate::admission::AdmissionPermit;
use crate::breaker::{Outcome, Permit};
use crate::preamble::Preamble;
use crate::state::Shared;
use crate::stream::{StreamEnd, StreamWatch, WatchedBody};
use crate::upstream;
use crate::usage::{CachedReport, UsageTail};
use axum::body::Body;
use axum::http::HeaderValue;
use axum::response::Response;
use radixgate_routing::{CacheFeedback, CacheReport, Corrected, LoadGuard};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Hands a worker's response to the client, its body carrying the
/// request's [`RequestWatch`].
pub(super) fn respond(
    shared: &Arc<Shared>,
    answer: Answer,
    admitted: AdmissionPermit,
    responding: Responding,
) -> Response {
    let Responding {
        endpoint,
        started,
        mut routing_text,
        spans,
        pd,
        cut,
        unstored,
        made,
    } = responding;
    let Answer {
        response,
        mut decision,
        model,
        probe,
        sent,
        trace,
    } = answer;
    let status = response.status();
    // The worker's content type decides, not the client's `stream` flag: a
    // worker may answer a streamed request with a JSON error, and an SSE
    // error event must never be appended to JSON.
    let sse = is_event_stream(response.headers());
    let preamble = sse
        .then(|| endpoint.preamble(response.body().first_data()))
        .flatten();
    let mut headers = upstream::response_headers(response.headers(), sse);
    if let Ok(value) = HeaderValue::from_str(decision.worker().url()) {
        headers.insert(WORKER_NAME, value);
    }
    let mut explained = String::with_capacity(128);
    if let Some(pd) = &pd {
        explained.push_str(&pd.explained);
        if let Some(prefill) = &pd.prefill_worker
            && let Ok(value) = HeaderValue::from_str(prefill)
        {
            headers.insert(pd::PREFILL_WORKER_NAME, value);
        }
    } else {
        let _ = write!(explained, "{}", decision.rendered());
    }
    if let Ok(value) = HeaderValue::from_str(&explained) {
        headers.insert(DECISION_NAME, value);
    }
    // A successful answer's usage is checked against what the tree
    // predicted (`radixgate_routing::correction`).
    let branch = decision.explanation().branch.as_str();
    let mut correction = status
        .is_success()
        .then(|| decision.take_cache_feedback())
        .flatten()
        .map(|feedback| Correction { feedback });
    let seen = shared.dashboard.seen(
        &decision,
        &explained,
        endpoint.label(),
        model.as_deref(),
        status.as_u16(),
    );
    // While a trace recording runs, each routed request is recorded at its
    // end (`crate::record`).
    let record = match endpoint {
        Endpoint::Routed(_) => shared.recorder.pending(branch, sse),
        Endpoint::ByLoad(_) | Endpoint::Unrouted | Endpoint::StoredResponse => None,
    };
    let promised = {
        let e = decision.explanation();
        (e.exact && status.is_success() && shared.kv_events.is_some())
            .then(|| e.matched_chars.map(|m| (decision.worker().id(), m)))
            .flatten()
    };
    let read_usage = correction.is_some() || record.is_some();
    // A Responses answer's id is learned with its maker (`crate::responses`).
    let id_scan = (endpoint == Endpoint::Routed(radixgate_routing::Api::Responses)
        && !unstored
        && status.is_success()
        && !is_encoded(response.headers()))
    .then(|| Box::new(crate::responses::scan::IdScan::new(sse)));
    // The correction reads only the inserted (capped) part of the text: a
    // huge prompt is not held whole while its answer streams (a recording
    // hashes the whole text, so then it is).
    if let (Some(correction), None) = (correction.as_mut(), &record) {
        correction.feedback.keep_inserted(&mut routing_text);
    }
    let watch = RequestWatch {
        seen,
        shared: shared.clone(),
        correction,
        record,
        tail: read_usage.then(UsageTail::new),
        id_scan,
        made,
        text: if read_usage {
            routing_text
        } else {
            String::new()
        },
        promised,
        guard: decision.into_guard(),
        sse,
        preamble,
        sent,
        probe,
        _admitted: admitted,
        route: endpoint.label(),
        model,
        status: status.as_u16(),
        started,
        trace: crate::trace::RequestTrace::new(spans, trace),
        pd,
        cut,
    };
    // Checked: a timeout too far away for the clock is no deadline at all
    // (validation keeps it within a day; this is the second line).
    let deadline = shared
        .config
        .request_timeout()
        .and_then(|t| started.checked_add(t))
        .map(tokio::time::Instant::from_std);
    // An encoded stream's bytes are not its events: one that breaks off is
    // cut, as a JSON body is, for plain text after them would corrupt it.
    let plain_sse = sse && !is_encoded(response.headers());
    let mut body = WatchedBody::new(response.into_body(), watch, plain_sse);
    // Only a plain event stream can tell its client why it ends at the
    // grace period's expiry; any other body is cut with its connection
    // anyway, so it does not register with the shared token (a lock per
    // response).
    if plain_sse {
        body = body
            .with_abort(shared.streams_abort.clone())
            .with_error_events(endpoint.error_events());
    }
    if let Some(deadline) = deadline {
        body = body.with_deadline(deadline);
    }
    if let Some(stall) = shared.config.stall_timeout() {
        body = body.with_stall_timeout(stall);
    }
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// What [`respond`] needs besides the answer.
pub(super) struct Responding {
    pub(super) endpoint: Endpoint,
    pub(super) started: Instant,
    pub(super) routing_text: String,
    pub(super) spans: crate::trace::RequestSpans,
    /// A disaggregated request's other side and explanation.
    pub(super) pd: Option<pd::Held>,
    /// A metered tenant's flag: set when the body ends early
    /// ([`crate::tenants::Metering::cut_flag`]).
    pub(super) cut: Option<Arc<AtomicBool>>,
    /// A Responses API request whose response is not stored
    /// ([`crate::inspect::Inspected::unstored`]): its id is not learned.
    pub(super) unstored: bool,
    /// A tenant's create of a stored response: where its id goes when it
    /// is learned, for its charge ([`crate::responses::charged`]).
    pub(super) made: Option<Arc<OnceLock<Box<str>>>>,
}

/// What a response body carries until it ends. Field order is drop order:
/// the load guard goes before the admission permit, so a request admitted
/// by this one's end never sees this one's load still counted.
struct RequestWatch {
    /// What the status page lists, while someone watches it.
    seen: Option<crate::dashboard::Seen>,
    shared: Arc<Shared>,
    /// The routing correction's share: the decision's tree feedback.
    correction: Option<Correction>,
    /// The trace recording's share, while one runs.
    record: Option<crate::record::Pending>,
    /// The body's tail, scanned once at its end, when the correction or
    /// the recording reads its usage.
    tail: Option<UsageTail>,
    /// The scan for a Responses answer's id, until it ends (boxed: every
    /// other answer's watch stays as small as it was).
    id_scan: Option<Box<crate::responses::scan::IdScan>>,
    /// Where a tenant's create puts the id learned, for its charge.
    made: Option<Arc<OnceLock<Box<str>>>>,
    /// The routing text, kept only for the correction and the recording.
    text: String,
    /// The chosen worker and the characters its KV events said it held,
    /// when the decision rested on them: its answer's cached-token report
    /// is held to that (`KvEvents::answered`).
    promised: Option<(radixgate_routing::WorkerId, usize)>,
    /// The worker's load; released when this watch is dropped.
    guard: LoadGuard,
    /// Whether the response is an event stream (TTFT is recorded for those).
    sse: bool,
    /// The scan for the first token behind a stream's preamble, until it is
    /// found; `None` where the first data is the first token.
    preamble: Option<Preamble>,
    /// When the answering attempt was sent.
    sent: tokio::time::Instant,
    /// The breaker permit of a successful attempt, settled at the end.
    probe: Option<Permit>,
    _admitted: AdmissionPermit,
    route: &'static str,
    model: Option<String>,
    status: u16,
    started: Instant,
    /// The request's and the answering attempt's spans, to its end.
    trace: crate::trace::RequestTrace,
    /// A disaggregated request's prefill side, cancelled with the stream
    /// unless it completes.
    pd: Option<pd::Held>,
    /// Set if the body ends early, for a metered tenant's charge.
    cut: Option<Arc<AtomicBool>>,
}

/// What a response needs for the routing correction.
pub(super) struct Correction {
    pub(super) feedback: CacheFeedback,
}

impl Correction {
    /// The body ended: hands its cached-token report (`cached`, read from
    /// its tail) for the routing text `text` to the correction. A body
    /// without one changes nothing; an impossible one is counted on the
    /// worker (exported by the upkeep tick) and otherwise ignored.
    pub(super) fn finish(self, text: &str, cached: CachedReport) {
        let report = match cached {
            CachedReport::Absent => return,
            CachedReport::Invalid => {
                let worker = self.feedback.worker();
                worker.cache_truth().invalid();
                tracing::debug!(
                    worker = worker.url(),
                    "unreadable cached-token report ignored"
                );
                return;
            }
            CachedReport::Report {
                prompt_tokens,
                cached_tokens,
            } => CacheReport {
                prompt_tokens,
                cached_tokens,
            },
        };
        let worker = self.feedback.worker().clone();
        match self.feedback.apply(text, report) {
            Corrected::Invalid => {
                tracing::debug!(
                    worker = worker.url(),
                    ?report,
                    "impossible cached-token report ignored"
                );
            }
            Corrected::Trimmed { chars, .. } => {
                tracing::debug!(
                    worker = worker.url(),
                    chars,
                    "worker held less than predicted; tree trimmed"
                );
            }
            Corrected::Counted { .. } => {}
        }
    }
}

impl RequestWatch {
    /// The worker finished this prompt's prefill: prefill-aware routing
    /// stops counting it as queued work, and a stream's TTFT is recorded.
    /// Behind a preamble the attempt loop could not tell the first token,
    /// so the cost model learns the worker's wait here (`learn`), and
    /// outlier detection samples it (a successful stream's, as the attempt
    /// loop samples any other's first byte).
    fn first_token(&mut self, learn: bool) {
        if learn {
            let waited = self.sent.elapsed();
            self.guard.first_token(waited);
            if (200..300).contains(&self.status) {
                let worker = self.guard.worker().id();
                self.shared.outliers.sample(worker, waited);
            }
        } else {
            self.guard.prefill_done();
        }
        if !self.sse {
            return;
        }
        let elapsed = self.started.elapsed();
        self.shared
            .request_metrics
            .ttft(self.route, self.model.as_deref(), elapsed);
        if let Some(seen) = &mut self.seen {
            seen.first_token(elapsed);
        }
    }
}

impl StreamWatch for RequestWatch {
    fn first_byte(&mut self) {
        if self.preamble.is_none() {
            self.first_token(false);
        }
    }

    fn data(&mut self, bytes: &[u8]) {
        self.trace.data(bytes);
        if let Some(tail) = self.tail.as_mut() {
            tail.push(bytes);
        }
        if let Some(scan) = self.id_scan.as_mut()
            && scan.feed(bytes)
        {
            if let Some(id) = scan.take() {
                let maker = self.guard.worker().url();
                self.shared
                    .responses
                    .learn(&id, maker, self.model.as_deref());
                if let Some(made) = &self.made {
                    let _ = made.set(id.into_boxed_str());
                }
            }
            self.id_scan = None;
        }
        if let Some(record) = self.record.as_mut() {
            record.data(bytes);
        }
        if let Some(scan) = self.preamble.as_mut()
            && scan.feed(bytes)
        {
            // An error event in the first token's place teaches nothing.
            let learn = !scan.found_error();
            self.preamble = None;
            self.first_token(learn);
        }
    }

    fn finish(mut self, end: StreamEnd) {
        if let Some(cut) = &self.cut
            && matches!(
                end,
                StreamEnd::UpstreamError | StreamEnd::Shutdown | StreamEnd::TimedOut
            )
        {
            cut.store(true, Ordering::Relaxed);
        }
        if let Some(pd) = self.pd.take() {
            pd.finish(end == StreamEnd::Complete);
        }
        self.trace.end(end);
        let _in_request = self.trace.enter();
        let metrics = &self.shared.request_metrics;
        // Whatever the end: a body of known length is dropped once its last
        // byte passed (never read to its end), and a complete usage object
        // in the tail is the worker's word on this prompt either way.
        // The prompt and completion counts are read only for a recording.
        let (cached, usage) = match self.tail.as_mut() {
            Some(tail) if self.record.is_some() => {
                let usage = tail.usage();
                (Some(usage.cached), Some(usage))
            }
            Some(tail) => (Some(tail.cached()), None),
            None => (None, None),
        };
        if let (Some((worker, matched)), Some(CachedReport::Report { cached_tokens, .. })) =
            (self.promised, &cached)
            && let Some(events) = &self.shared.kv_events
        {
            events.answered(worker, matched, *cached_tokens);
        }
        if let (Some(c), Some(cached)) = (self.correction.take(), cached) {
            c.finish(&self.text, cached);
        }
        if let Some(pending) = self.record.take() {
            self.shared.recorder.record(
                pending,
                crate::record::Ended {
                    text: std::mem::take(&mut self.text),
                    model: self.model.as_deref(),
                    worker: self.guard.worker().url(),
                    status: self.status,
                    started: self.started,
                    usage,
                },
            );
        }
        metrics.request_done(
            self.route,
            self.status,
            self.model.as_deref(),
            self.started.elapsed(),
        );
        if let Some(seen) = self.seen.take() {
            self.shared
                .dashboard
                .answered(seen, end, self.started.elapsed());
        }
        let worker = self.guard.worker();
        if end == StreamEnd::UpstreamError {
            tracing::warn!(worker = worker.url(), "worker stream broke off or stalled");
            metrics.upstream_error(worker.url(), "stream_broken");
        }
        if let Some(probe) = self.probe {
            match end {
                StreamEnd::UpstreamError => {
                    record(worker, probe, Outcome::Failure);
                }
                StreamEnd::Complete | StreamEnd::ClientGone => {
                    record(worker, probe, Outcome::Success);
                }
                // The gateway cut it: says nothing about the worker.
                StreamEnd::Shutdown | StreamEnd::TimedOut => drop(probe),
            }
        }
    }
}
