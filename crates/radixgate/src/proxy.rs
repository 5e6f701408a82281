//! The request path of the inference APIs, in the order a request meets it:
//! admit → read → inspect → attempts → respond.
//!
//! - **admit**: wait for an admission slot ([`crate::admission`]);
//! - **read**: the body once, up to the configured limit, kept as `Bytes`;
//! - **inspect**: read the few fields routing needs ([`inspect`]); every
//!   attempt then sends the same bytes, so the worker sees exactly what the
//!   client sent;
//! - **attempts**: choose a worker ([`Router::select`], leaving out those
//!   already tried), pass its breaker, send; a failed attempt that
//!   [`crate::retry`] calls retryable (connection refused, or a 5xx/429
//!   status before any byte was returned) is retried on a different worker
//!   after a jittered exponential back-off. Once a response is handed to the
//!   client it is never retried;
//! - **respond**: the worker's response goes back with the decision's
//!   headers, its body wrapped in a [`WatchedBody`].
//!
//! Everything a request holds — the worker's load guard, the admission
//! permit, the breaker permit — travels inside the response body (one
//! `RequestWatch`, built whole in `respond`) and is released when the
//! stream ends in any way, at which point the request is counted in the
//! metrics. The request path owns its metric families ([`RequestMetrics`],
//! in `proxy/metrics.rs`); admission counts its own refusals.
//!
//! [`Router::select`]: radixgate_routing::Router::select

use crate::admission::AdmissionPermit;
use crate::breaker::publish_breaker;
use crate::breaker::{Outcome, Permit};
use crate::error::GatewayError;
use crate::inspect::{Api, Inspected, inspect};
use crate::retry::{self, Backoff};
use crate::state::{AppState, Shared};
use crate::stream::{StreamEnd, StreamWatch, WatchedBody};
use crate::upstream;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use radixgate_routing::{Decision, LoadGuard, Routed, WorkerId};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

/// Header naming the worker a request went to.
pub const WORKER_HEADER: &str = "x-radixgate-worker";
/// Header explaining the routing decision.
pub const DECISION_HEADER: &str = "x-radixgate-decision";
/// Headers that carry a sticky-session key, in order of preference (the
/// body's `user` field is the fallback).
const ROUTING_KEY_HEADERS: [&str; 2] = ["x-session-id", "x-radixgate-routing-key"];

pub(crate) mod metrics;
pub use metrics::{LATENCY_BUCKETS, RequestMetrics, TTFT_BUCKETS, UNKNOWN_MODEL};

/// Serves one inference request on `route` (also the worker path).
pub(crate) async fn serve(
    state: Arc<AppState>,
    api: Api,
    route: &'static str,
    req: Request,
) -> Response {
    let started = Instant::now();
    let shared = &state.shared;
    let work = forward(&state, api, route, req, started);
    let result = match shared.config.request_timeout() {
        Some(after) => tokio::time::timeout(after, work)
            .await
            .unwrap_or(Err(GatewayError::RequestTimeout { after })),
        None => work.await,
    };
    result.unwrap_or_else(|err| {
        shared
            .request_metrics
            .request_done(route, err.status().as_u16(), None, started.elapsed());
        err.into_response()
    })
}

/// admit → read → inspect → attempts → respond.
async fn forward(
    state: &AppState,
    api: Api,
    route: &'static str,
    req: Request,
    started: Instant,
) -> Result<Response, GatewayError> {
    let shared = &state.shared;
    let admitted = shared.admission.acquire().await?;
    let (parts, body) = req.into_parts();
    let bytes = read_body(body, shared.config.server.max_payload_size).await?;
    let request = inspect(api, &bytes)?;
    let answer = attempts(state, route, &request, &parts.headers, bytes).await?;
    Ok(respond(
        shared,
        answer,
        admitted,
        route,
        request.stream,
        started,
    ))
}

/// The sticky-session key: the first routing-key header present, else the
/// body's `user` field.
fn routing_key<'a>(headers: &'a HeaderMap, user: Option<&'a str>) -> Option<&'a str> {
    ROUTING_KEY_HEADERS
        .iter()
        .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
        .or(user)
}

/// What the attempt loop hands to [`respond`]: the worker's response head
/// and everything the request keeps until its body ends.
struct Answer {
    response: axum::http::Response<Incoming>,
    /// The decision that chose the worker; its guard holds the load.
    decision: Decision,
    /// The pool's model (the metrics label).
    model: Option<String>,
    /// The breaker permit of a successful attempt, settled at the end of
    /// the stream; `None` for a failed status passed through on the last
    /// attempt, whose failure is already recorded.
    probe: Option<Permit>,
}

/// Tries workers until one answers in a way [`retry`] does not retry, or
/// the retries or the untried workers run out.
async fn attempts(
    state: &AppState,
    route: &'static str,
    request: &Inspected,
    client_headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Answer, GatewayError> {
    let shared = &state.shared;
    let routing_key = routing_key(client_headers, request.user.as_deref());
    let max_retries = shared.config.retry.max_retries;
    let mut backoff = Backoff::new(&shared.config.retry);
    let mut tried: Vec<WorkerId> = Vec::new();
    let mut last_failure: Option<GatewayError> = None;
    loop {
        let routed = shared.router.select(
            request.model.as_deref(),
            &request.routing_text,
            routing_key,
            &tried,
        );
        let Routed { decision, model } = match routed {
            Ok(routed) => routed,
            Err(err) => {
                return Err(match last_failure {
                    // No untried worker is left: report what the last
                    // attempt saw, not the empty pool.
                    Some(last) => GatewayError::RetriesExhausted {
                        attempts: tried.len() as u32,
                        last: Box::new(last),
                    },
                    None => err.into(),
                });
            }
        };
        let worker = decision.worker().clone();
        let Some(probe) = shared
            .breakers
            .get(worker.id())
            .try_acquire(tokio::time::Instant::now())
        else {
            // Half-open with its probe already out: this worker sits out.
            tried.push(worker.id());
            continue;
        };
        shared
            .request_metrics
            .decision(decision.explanation().branch.as_str());
        tracing::debug!(route, worker = worker.url(), decision = %decision.explanation(), "routed");
        let last_attempt = tried.len() as u32 >= max_retries;
        let failure = match send(state, &decision, route, client_headers, bytes.clone()).await {
            Ok(response) => {
                let status = response.status();
                if !retry::retryable_status(status) {
                    return Ok(Answer {
                        response,
                        decision,
                        model,
                        probe: Some(probe),
                    });
                }
                if last_attempt {
                    // Nobody is left to ask: the client gets the worker's
                    // own error answer, counted as the worker's failure.
                    record(&worker, probe, Outcome::Failure);
                    shared
                        .request_metrics
                        .upstream_error(worker.url(), "status");
                    return Ok(Answer {
                        response,
                        decision,
                        model,
                        probe: None,
                    });
                }
                shared
                    .request_metrics
                    .upstream_error(worker.url(), "status");
                GatewayError::UpstreamStatus {
                    worker: worker.url().to_owned(),
                    status,
                }
            }
            Err(err) => {
                shared
                    .request_metrics
                    .upstream_error(worker.url(), "connect");
                err
            }
        };
        record(&worker, probe, Outcome::Failure);
        if last_attempt || !failure.retryable() {
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
        shared.request_metrics.retry(retry::reason(&failure));
        tried.push(worker.id());
        last_failure = Some(failure);
        // The failed worker's load is released before the pause, not after.
        drop(decision);
        // Drawn in its own statement: the thread's RNG must not live across
        // the `.await` (it is not `Send`).
        let pause = backoff.pause(&mut rand::rng());
        tokio::time::sleep(pause).await;
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

/// One attempt: the client's bytes to the chosen worker.
async fn send(
    state: &AppState,
    decision: &Decision,
    path: &str,
    client_headers: &HeaderMap,
    body: Bytes,
) -> Result<axum::http::Response<Incoming>, GatewayError> {
    let worker = decision.worker();
    let gateway_has_key = state.shared.config.server.api_key.is_some();
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

/// Hands a worker's response to the client, its body carrying the
/// request's [`RequestWatch`].
fn respond(
    shared: &Arc<Shared>,
    answer: Answer,
    admitted: AdmissionPermit,
    route: &'static str,
    asked_stream: bool,
    started: Instant,
) -> Response {
    let Answer {
        response,
        decision,
        model,
        probe,
    } = answer;
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
    let watch = RequestWatch {
        shared: shared.clone(),
        guard: decision.into_guard(),
        sse,
        probe,
        _admitted: admitted,
        route,
        model,
        status: status.as_u16(),
        started,
    };
    let deadline = shared
        .config
        .request_timeout()
        .map(|t| tokio::time::Instant::from_std(started + t));
    let mut body = WatchedBody::new(response.into_body(), watch, sse);
    if let Some(deadline) = deadline {
        body = body.with_deadline(deadline);
    }
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// What a response body carries until it ends. Field order is drop order:
/// the load guard goes before the admission permit, so a request admitted
/// by this one's end never sees this one's load still counted.
struct RequestWatch {
    shared: Arc<Shared>,
    /// The worker's load; released when this watch is dropped.
    guard: LoadGuard,
    /// Whether the response is an event stream (TTFT is recorded for those).
    sse: bool,
    /// The breaker permit of a successful attempt, settled at the end.
    probe: Option<Permit>,
    _admitted: AdmissionPermit,
    route: &'static str,
    model: Option<String>,
    status: u16,
    started: Instant,
}

impl StreamWatch for RequestWatch {
    fn first_byte(&mut self) {
        // The first byte means the worker finished this prompt's prefill:
        // prefill-aware routing stops counting it as queued work.
        self.guard.prefill_done();
        if !self.sse {
            return;
        }
        self.shared
            .request_metrics
            .ttft(self.route, self.model.as_deref(), self.started.elapsed());
    }

    fn finish(self, end: StreamEnd) {
        let metrics = &self.shared.request_metrics;
        metrics.request_done(
            self.route,
            self.status,
            self.model.as_deref(),
            self.started.elapsed(),
        );
        let worker = self.guard.worker();
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
