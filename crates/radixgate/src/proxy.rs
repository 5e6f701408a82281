//! The request path of the inference APIs: admit, read, route, forward,
//! retry, stream back.
//!
//! The body is read once, up to the configured limit, and kept as `Bytes`:
//! routing reads a few fields of it ([`inspect`]) and every attempt sends the
//! same bytes, so the worker sees exactly what the client sent. A failed
//! attempt (connection refused, or a 5xx/429 status before any byte was
//! returned) is retried on a different worker after a jittered exponential
//! back-off; once a response is handed to the client it is never retried.
//!
//! Everything a request holds — the worker's load guard, the admission
//! permit, the breaker permit — travels inside the response body
//! ([`WatchedBody`]) and is released when the stream ends in any way, at
//! which point the request is counted in the metrics.

use crate::breaker::{Outcome, Permit};
use crate::error::GatewayError;
use crate::inspect::{Api, inspect};
use crate::state::{AppState, publish_breaker};
use crate::stream::{StreamEnd, StreamWatch, WatchedBody};
use crate::upstream;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use radixgate_routing::{Decision, LoadGuard, RequestView, WorkerId};
use rand::Rng;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Header naming the worker a request went to.
pub const WORKER_HEADER: &str = "x-radixgate-worker";
/// Header explaining the routing decision.
pub const DECISION_HEADER: &str = "x-radixgate-decision";
/// Headers that carry a sticky-session key, in order of preference (the
/// body's `user` field is the fallback).
const ROUTING_KEY_HEADERS: [&str; 2] = ["x-session-id", "x-radixgate-routing-key"];

/// Serves one inference request on `route` (also the worker path).
pub(crate) async fn serve(
    state: Arc<AppState>,
    api: Api,
    route: &'static str,
    req: Request,
) -> Response {
    let started = Instant::now();
    let work = forward(&state, api, route, req, started);
    let result = match state.config.request_timeout() {
        Some(after) => tokio::time::timeout(after, work)
            .await
            .unwrap_or(Err(GatewayError::RequestTimeout { after })),
        None => work.await,
    };
    result.unwrap_or_else(|err| {
        match &err {
            GatewayError::QueueFull { .. } => state.metrics.admission_rejected("queue_full"),
            GatewayError::QueueTimeout { .. } => state.metrics.admission_rejected("queue_timeout"),
            _ => {}
        }
        state
            .metrics
            .request_done(route, err.status().as_u16(), None, started.elapsed());
        err.into_response()
    })
}

async fn forward(
    state: &Arc<AppState>,
    api: Api,
    route: &'static str,
    req: Request,
    started: Instant,
) -> Result<Response, GatewayError> {
    let admitted = state.admission.acquire().await?;
    let (parts, body) = req.into_parts();
    let bytes = read_body(body, state.config.server.max_payload_size).await?;
    let request = inspect(api, &bytes)?;
    let routing_key = ROUTING_KEY_HEADERS
        .iter()
        .find_map(|h| parts.headers.get(*h).and_then(|v| v.to_str().ok()))
        .or(request.user.as_deref());

    let retry = &state.config.retry;
    let mut tried: Vec<WorkerId> = Vec::new();
    let mut last_failure: Option<GatewayError> = None;
    let mut backoff = Duration::from_millis(retry.initial_backoff_ms);
    loop {
        let routed = route_once(
            state,
            request.model.as_deref(),
            &request.routing_text,
            routing_key,
            &tried,
        );
        let (decision, model) = match routed {
            Ok(routed) => routed,
            Err(err) => {
                return Err(match last_failure {
                    // No untried worker is left: report what the last
                    // attempt saw, not the empty pool.
                    Some(last) => GatewayError::RetriesExhausted {
                        attempts: tried.len() as u32,
                        last: Box::new(last),
                    },
                    None => err,
                });
            }
        };
        let worker = decision.worker().clone();
        let Some(probe) = state
            .breakers
            .get(worker.id())
            .try_acquire(tokio::time::Instant::now())
        else {
            // Half-open with its probe already out: this worker sits out.
            tried.push(worker.id());
            continue;
        };
        state
            .metrics
            .decision(decision.explanation().branch.as_str());
        tracing::debug!(route, worker = worker.url(), decision = %decision.explanation(), "routed");
        let last_attempt = tried.len() as u32 >= retry.max_retries;
        let failure = match send(state, &decision, route, &parts.headers, bytes.clone()).await {
            Ok(response) => {
                let status = response.status();
                let failed = status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS;
                if !failed || last_attempt {
                    let probe = if failed {
                        record(&worker, probe, Outcome::Failure);
                        state.metrics.upstream_error(worker.url(), "status");
                        None
                    } else {
                        Some(probe)
                    };
                    let watch = RequestWatch {
                        state: state.clone(),
                        guard: None,
                        sse: false,
                        probe,
                        _admitted: admitted,
                        route,
                        model,
                        status: status.as_u16(),
                        started,
                    };
                    return Ok(respond(
                        response,
                        decision,
                        watch,
                        request.stream,
                        state.config.request_timeout(),
                    ));
                }
                state.metrics.upstream_error(worker.url(), "status");
                GatewayError::UpstreamStatus {
                    worker: worker.url().to_owned(),
                    status,
                }
            }
            Err(err) => {
                state.metrics.upstream_error(worker.url(), "connect");
                err
            }
        };
        record(&worker, probe, Outcome::Failure);
        if last_attempt {
            let attempts = tried.len() as u32 + 1;
            return Err(if attempts > 1 {
                GatewayError::RetriesExhausted {
                    attempts,
                    last: Box::new(failure),
                }
            } else {
                failure
            });
        }
        tracing::debug!(worker = worker.url(), error = %failure, "attempt failed; retrying");
        state
            .metrics
            .retry(if matches!(failure, GatewayError::Connect { .. }) {
                "connect"
            } else {
                "status"
            });
        tried.push(worker.id());
        last_failure = Some(failure);
        drop(decision);
        tokio::time::sleep(jitter(backoff, retry.jitter_factor)).await;
        backoff = backoff
            .mul_f64(retry.backoff_multiplier)
            .min(Duration::from_millis(retry.max_backoff_ms));
    }
}

/// Records an attempt's outcome and publishes any breaker change at once,
/// so policies stop (or resume) choosing the worker without waiting for
/// the upkeep tick.
fn record(worker: &radixgate_routing::Worker, probe: Permit, outcome: Outcome) {
    if let Some(state) = probe.record(outcome, tokio::time::Instant::now()) {
        tracing::info!(
            worker = worker.url(),
            state = state.as_str(),
            "circuit breaker changed"
        );
        publish_breaker(worker, state);
    }
}

/// Reads the whole body, refusing more than `limit` bytes.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, GatewayError> {
    http_body_util::Limited::new(body, limit)
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|err| {
            if err.is::<http_body_util::LengthLimitError>() {
                GatewayError::PayloadTooLarge { limit }
            } else {
                GatewayError::BadBody(err.to_string())
            }
        })
}

/// Chooses a worker, leaving out those already tried for this request.
/// Also returns the pool's model name: a served model, safe as a metrics
/// label (a client's made-up name never is).
fn route_once(
    state: &AppState,
    model: Option<&str>,
    text: &str,
    routing_key: Option<&str>,
    tried: &[WorkerId],
) -> Result<(Decision, Option<String>), GatewayError> {
    let snapshot = state.router.snapshot();
    let pool = snapshot.resolve(model)?;
    let view = RequestView::new(pool.model, text).with_routing_key(routing_key);
    let decision = if tried.is_empty() {
        state.router.policy().select(&view, pool.workers)?
    } else {
        let rest: Vec<_> = pool
            .workers
            .iter()
            .filter(|w| !tried.contains(&w.id()))
            .cloned()
            .collect();
        state.router.policy().select(&view, &rest)?
    };
    let label = (pool.model != radixgate_routing::WILDCARD_MODEL).then(|| pool.model.to_owned());
    Ok((decision, label))
}

/// One attempt: the client's bytes to the chosen worker.
async fn send(
    state: &AppState,
    decision: &Decision,
    path: &str,
    client_headers: &HeaderMap,
    body: Bytes,
) -> Result<axum::http::Response<Incoming>, GatewayError> {
    let worker = decision.worker();
    let gateway_has_key = state.config.server.api_key.is_some();
    let headers = upstream::request_headers(client_headers, worker.api_key(), gateway_has_key);
    state
        .forwarder
        .post(worker.url(), path, headers, body)
        .await
        .map_err(|err| GatewayError::Connect {
            worker: worker.url().to_owned(),
            source: Box::new(err),
        })
}

/// Hands a worker's response to the client; its body carries the watch.
fn respond(
    response: axum::http::Response<Incoming>,
    decision: Decision,
    mut watch: RequestWatch,
    asked_stream: bool,
    timeout: Option<Duration>,
) -> Response {
    let status = response.status();
    let sse = asked_stream
        || response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut headers = upstream::response_headers(response.headers(), sse);
    if let Ok(value) = HeaderValue::from_str(decision.worker().url()) {
        headers.insert(WORKER_HEADER, value);
    }
    let mut explained = String::with_capacity(128);
    if write!(explained, "{}", decision.explanation()).is_ok()
        && let Ok(value) = HeaderValue::from_str(&explained)
    {
        headers.insert(DECISION_HEADER, value);
    }
    watch.guard = Some(decision.into_guard());
    watch.sse = sse;
    let deadline = timeout.map(|t| tokio::time::Instant::from_std(watch.started + t));
    let mut body = WatchedBody::new(response.into_body(), watch, sse);
    if let Some(deadline) = deadline {
        body = body.with_deadline(deadline);
    }
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// What a response body carries until it ends.
struct RequestWatch {
    state: Arc<AppState>,
    /// The worker's load (the decision's own guard, moved in by
    /// [`respond`]); released when this watch is dropped.
    guard: Option<LoadGuard>,
    /// Whether the response is an event stream (TTFT is recorded for those).
    sse: bool,
    /// The breaker permit of a successful attempt, settled at the end.
    probe: Option<Permit>,
    _admitted: crate::admission::AdmissionPermit,
    route: &'static str,
    model: Option<String>,
    status: u16,
    started: Instant,
}

impl StreamWatch for RequestWatch {
    fn first_byte(&mut self) {
        // The first byte means the worker finished this prompt's prefill:
        // prefill-aware routing stops counting it as queued work.
        if let Some(guard) = self.guard.as_mut() {
            guard.prefill_done();
        }
        if !self.sse {
            return;
        }
        self.state
            .metrics
            .ttft(self.route, self.model.as_deref(), self.started.elapsed());
    }

    fn finish(self, end: StreamEnd) {
        let metrics = &self.state.metrics;
        metrics.request_done(
            self.route,
            self.status,
            self.model.as_deref(),
            self.started.elapsed(),
        );
        if let Some(guard) = &self.guard {
            let worker = guard.worker();
            if end == StreamEnd::UpstreamError {
                tracing::warn!(worker = worker.url(), "worker stream broke off");
                metrics.upstream_error(worker.url(), "stream_broken");
            }
            if let Some(probe) = self.probe {
                let outcome = if end == StreamEnd::UpstreamError {
                    Outcome::Failure
                } else {
                    Outcome::Success
                };
                record(worker, probe, outcome);
            }
        }
    }
}

/// `base` spread uniformly by ±`factor`.
fn jitter(base: Duration, factor: f64) -> Duration {
    if factor <= 0.0 {
        return base;
    }
    let spread = rand::rng().random_range(-factor..=factor);
    base.mul_f64((1.0 + spread).max(0.0))
}
