//! The request path of the inference APIs: read, route, forward, retry,
//! stream back.
//!
//! The body is read once, up to the configured limit, and kept as `Bytes`:
//! routing reads a few fields of it ([`inspect`]) and every attempt sends the
//! same bytes, so the worker sees exactly what the client sent. A failed
//! attempt (connection refused, or a 5xx/429 status before any byte was
//! returned) is retried on a different worker after a jittered exponential
//! back-off; once a response is handed to the client it is never retried.
//!
//! The chosen worker's load guard travels inside the response body
//! ([`WatchedBody`]) and is released when the stream ends in any way.

use crate::error::GatewayError;
use crate::inspect::{Api, inspect};
use crate::state::AppState;
use crate::stream::{StreamEnd, StreamWatch, WatchedBody};
use crate::upstream;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use radixgate_routing::{Decision, LoadGuard, RequestView, WorkerId};
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;

/// Header naming the worker a request went to.
pub const WORKER_HEADER: &str = "x-radixgate-worker";
/// Header explaining the routing decision.
pub const DECISION_HEADER: &str = "x-radixgate-decision";
/// Headers that carry a sticky-session key, in order of preference (the
/// body's `user` field is the fallback).
const ROUTING_KEY_HEADERS: [&str; 2] = ["x-session-id", "x-radixgate-routing-key"];

/// Serves one inference request.
pub(crate) async fn serve(
    state: Arc<AppState>,
    api: Api,
    path: &'static str,
    req: Request,
) -> Response {
    let timeout = state.config.request_timeout();
    let work = forward(state, api, path, req);
    let result = match timeout {
        Some(after) => tokio::time::timeout(after, work)
            .await
            .unwrap_or(Err(GatewayError::RequestTimeout { after })),
        None => work.await,
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn forward(
    state: Arc<AppState>,
    api: Api,
    path: &'static str,
    req: Request,
) -> Result<Response, GatewayError> {
    let (parts, body) = req.into_parts();
    let bytes = read_body(body, state.config.server.max_payload_size).await?;
    let request = inspect(api, &bytes)?;
    let routing_key = ROUTING_KEY_HEADERS
        .iter()
        .find_map(|h| parts.headers.get(*h).and_then(|v| v.to_str().ok()))
        .or(request.user.as_deref());
    let headers =
        upstream::request_headers(&parts.headers, None, state.config.server.api_key.is_some());

    let retry = &state.config.retry;
    let mut tried: Vec<WorkerId> = Vec::new();
    let mut last_failure: Option<GatewayError> = None;
    let mut backoff = Duration::from_millis(retry.initial_backoff_ms);
    loop {
        let decision = match route(
            &state,
            request.model.as_deref(),
            &request.routing_text,
            routing_key,
            &tried,
        ) {
            Ok(decision) => decision,
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
        let attempt = send(&state, &decision, path, &headers, bytes.clone()).await;
        let last_attempt = tried.len() as u32 >= retry.max_retries;
        let failure = match attempt {
            Ok(response) => {
                let status = response.status();
                let retryable = status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS;
                if !retryable || last_attempt {
                    return Ok(respond(response, decision, request.stream));
                }
                GatewayError::UpstreamStatus {
                    worker: decision.worker().url().to_owned(),
                    status,
                }
            }
            Err(err) if last_attempt => {
                let attempts = tried.len() as u32 + 1;
                return Err(if attempts > 1 {
                    GatewayError::RetriesExhausted {
                        attempts,
                        last: Box::new(err),
                    }
                } else {
                    err
                });
            }
            Err(err) => err,
        };
        tracing::debug!(worker = decision.worker().url(), error = %failure, "attempt failed; retrying");
        tried.push(decision.worker().id());
        last_failure = Some(failure);
        drop(decision);
        tokio::time::sleep(jitter(backoff, retry.jitter_factor)).await;
        backoff = backoff
            .mul_f64(retry.backoff_multiplier)
            .min(Duration::from_millis(retry.max_backoff_ms));
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
fn route(
    state: &AppState,
    model: Option<&str>,
    text: &str,
    routing_key: Option<&str>,
    tried: &[WorkerId],
) -> Result<Decision, GatewayError> {
    if tried.is_empty() {
        return Ok(state.router.route(model, text, routing_key)?);
    }
    let snapshot = state.router.snapshot();
    let pool = snapshot.resolve(model)?;
    let rest: Vec<_> = pool
        .workers
        .iter()
        .filter(|w| !tried.contains(&w.id()))
        .cloned()
        .collect();
    let view = RequestView::new(pool.model, text).with_routing_key(routing_key);
    Ok(state.router.policy().select(&view, &rest)?)
}

/// One attempt: the client's bytes to the chosen worker.
async fn send(
    state: &AppState,
    decision: &Decision,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<reqwest::Response, GatewayError> {
    let worker = decision.worker();
    let mut headers = headers.clone();
    if let Some(key) = worker.api_key()
        && let Ok(value) = HeaderValue::try_from(format!("Bearer {key}"))
    {
        headers.insert(header::AUTHORIZATION, value);
    }
    state
        .client
        .post(format!("{}{path}", worker.url()))
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(|err| GatewayError::Connect {
            worker: worker.url().to_owned(),
            source: Box::new(err),
        })
}

/// Hands a worker's response to the client, its body carrying the load guard.
fn respond(response: reqwest::Response, decision: Decision, asked_stream: bool) -> Response {
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
    if let Ok(value) = HeaderValue::from_str(&decision.explanation().to_string()) {
        headers.insert(DECISION_HEADER, value);
    }
    let watch = RequestWatch {
        _guard: decision.into_guard(),
    };
    let upstream: axum::http::Response<reqwest::Body> = response.into();
    let body = WatchedBody::new(upstream.into_body(), watch, sse);
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// What a response body carries until it ends.
struct RequestWatch {
    _guard: LoadGuard,
}

impl StreamWatch for RequestWatch {
    fn finish(self, end: StreamEnd) {
        if end == StreamEnd::UpstreamError {
            tracing::warn!(
                worker = self._guard.worker().url(),
                "worker stream broke off"
            );
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
