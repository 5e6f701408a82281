//! The request path of the inference APIs, in the order a request meets it:
//! read → inspect → admit → attempts → respond.
//!
//! - **read**: the body once, within its size limit, its time limit and the
//!   gateway's budget of buffered body bytes ([`crate::body`]), kept as
//!   `Bytes` that carry their budget reservation;
//! - **inspect**: read the few fields routing needs (what the route's
//!   [`Endpoint`] reads: the routing text of an inference API, only the
//!   model of one routed by load); every attempt then sends the same
//!   bytes, so the worker sees exactly what the client sent. A malformed
//!   request is refused here, without waiting;
//! - **admit**: wait for an admission slot ([`crate::admission`]). Only
//!   after the body has arrived: a slow upload holds budget bytes, which
//!   are bounded, never one of the few concurrency slots;
//! - **attempts**: choose a worker ([`Router::select`], or the least
//!   loaded for an endpoint routed by load, leaving out those already
//!   tried), pass its breaker, send; a failed attempt that
//!   [`crate::retry`] calls retryable (connection refused, or a 5xx/429
//!   status before any byte was returned) is retried on a different worker
//!   after a jittered exponential back-off. Once a response is handed to the
//!   client it is never retried;
//! - **respond**: the worker's response goes back with the decision's
//!   headers, its body wrapped in a [`WatchedBody`]. A stream's first token
//!   is its first event, except behind a Responses or Messages preamble
//!   ([`Preamble`]), where the watch finds it.
//!
//! Everything a request holds — the worker's load guard, the admission
//! permit, the breaker permit — travels inside the response body (one
//! `RequestWatch`, built whole in `respond`) and is released when the
//! stream ends in any way, at which point the request is counted in the
//! metrics. The body's bytes (and so their budget) are released when the
//! attempts are over. The request path owns its metric families
//! ([`RequestMetrics`], in `proxy/metrics.rs`); admission counts its own
//! refusals. While a trace recording runs, the end of the stream also
//! hands the request to it ([`crate::record`], one call that never waits).
//! The request's spans (`crate::trace`: the decision, each attempt, its
//! first byte, the stream) are one call at each step; without trace export
//! they are disabled and cost a check each.
//!
//! [`Router::select`]: radixgate_routing::Router::select

use crate::admission::AdmissionPermit;
use crate::body;
use crate::breaker::publish_breaker;
use crate::breaker::{Outcome, Permit};
use crate::error::GatewayError;
use crate::inspect::Inspected;
use crate::preamble::Preamble;
use crate::retry::{self, Backoff};
use crate::state::{AppState, Shared};
use crate::stream::{Primed, StreamEnd, StreamWatch, WatchedBody};
use crate::upstream;
use crate::usage::{CachedReport, UsageTail};
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use radixgate_routing::{
    CacheFeedback, CacheReport, Corrected, Decision, LoadGuard, Routed, RoutingError, WorkerId,
};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

/// Header naming the worker a request went to.
pub const WORKER_HEADER: &str = "x-radixgate-worker";
/// Header explaining the routing decision.
pub const DECISION_HEADER: &str = "x-radixgate-decision";
/// The two as header names: a `&str` key is parsed and checked again at
/// every insert (callgrind: 464 instructions a request fewer this way).
const WORKER_NAME: HeaderName = HeaderName::from_static(WORKER_HEADER);
const DECISION_NAME: HeaderName = HeaderName::from_static(DECISION_HEADER);
/// Headers that carry a sticky-session key, in order of preference (the
/// body's `user` field is the fallback).
/// Names, not strings: a lookup by string parses and checks the name first.
const ROUTING_KEY_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static("x-session-id"),
    HeaderName::from_static("x-radixgate-routing-key"),
];

mod endpoint;
pub(crate) mod metrics;
mod pd;
pub(crate) use endpoint::Endpoint;
pub use metrics::{LATENCY_BUCKETS, RequestMetrics, TTFT_BUCKETS, UNKNOWN_MODEL};

/// Serves one request to `endpoint`.
pub(crate) async fn serve(state: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    let started = Instant::now();
    let shared = &state.shared;
    let route = endpoint.label();
    // Boxed, like the attempt loops below: a future is moved whole each
    // time it is wrapped (the handler's, axum's and the timeout's), and
    // unboxed this one was 18 KiB, copied several times per request; the
    // copying was a fifth of the gateway's instructions (bench/instr_cost.py).
    let work = Box::pin(forward(&state, endpoint, req, started));
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

/// read → inspect → admit → attempts → respond.
async fn forward(
    state: &AppState,
    endpoint: Endpoint,
    req: Request,
    started: Instant,
) -> Result<Response, GatewayError> {
    let shared = &state.shared;
    // The worker path: the route's own, or an unrouted request's as it
    // came (and the API family it is counted under).
    let (path, unrouted) = match endpoint {
        Endpoint::Unrouted => {
            let (target, family) = endpoint::unrouted_target(req.method().as_str(), req.uri())?;
            (Cow::Owned(target), Some(family))
        }
        Endpoint::Routed(_) | Endpoint::ByLoad(_) => (Cow::Borrowed(endpoint.label()), None),
    };
    // Over a tenant's limit: refused before its body is read.
    let priority = crate::tenants::admit(&req, &shared.tenant_metrics)?;
    let (mut parts, body) = req.into_parts();
    let spans = crate::trace::RequestSpans::take(&mut parts.extensions);
    let bytes = body::read(&parts.headers, body, &shared.bodies).await?;
    let request = endpoint.inspect(&bytes)?;
    let admitted = shared.admission.acquire(priority).await?;
    if let Some(family) = unrouted {
        shared.request_metrics.unrouted(family);
    }
    // The client's address as this gateway saw it, for `X-Forwarded-For`.
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip());
    let target = Target {
        endpoint,
        path: &path,
    };
    // What the workers' KV events say they hold (`events.rs`), once for
    // every attempt. Tokenizing a long prompt takes milliseconds of CPU,
    // so it runs on the blocking pool, not on a serving thread.
    let exact = match (&shared.kv_events, endpoint) {
        (Some(events), Endpoint::Routed(_)) if events.any_live() => {
            let (events, body, path) = (events.clone(), bytes.clone(), endpoint.label());
            tokio::task::spawn_blocking(move || events.matched(path, &body))
                .await
                .ok()
                .flatten()
        }
        _ => None,
    };
    let (answer, pd) = if shared.config.pd.enabled {
        // A disaggregated pool: a prefill and a decode worker (`pd.rs`).
        let Endpoint::Routed(api) = endpoint else {
            return Err(GatewayError::NotDisaggregated {
                route: endpoint.label(),
            });
        };
        let (answer, held) = Box::pin(pd::attempts(
            state,
            api,
            target,
            &request,
            exact.as_ref(),
            &parts.headers,
            peer,
            bytes,
        ))
        .await?;
        (answer, Some(held))
    } else {
        let answer = Box::pin(attempts(
            state,
            target,
            &request,
            exact.as_ref(),
            &parts.headers,
            peer,
            bytes,
        ))
        .await?;
        (answer, None)
    };
    Ok(respond(
        shared,
        answer,
        admitted,
        Responding {
            endpoint,
            started,
            routing_text: request.routing_text,
            spans,
            pd,
        },
    ))
}

/// Where a request goes: its endpoint and the worker path.
#[derive(Clone, Copy)]
struct Target<'a> {
    endpoint: Endpoint,
    path: &'a str,
}

/// The sticky-session key: the first routing-key header present, else the
/// body's `user` field.
fn routing_key<'a>(headers: &'a HeaderMap, user: Option<&'a str>) -> Option<&'a str> {
    ROUTING_KEY_HEADERS
        .iter()
        .find_map(|h| headers.get(h).and_then(|v| v.to_str().ok()))
        .or(user)
}

/// What the attempt loop hands to [`respond`]: the worker's response head,
/// its body with the first frame already read, and everything the request
/// keeps until its body ends.
struct Answer {
    response: axum::http::Response<Primed<Incoming>>,
    /// The decision that chose the worker; its guard holds the load.
    decision: Decision,
    /// The pool's model (the metrics label).
    model: Option<String>,
    /// The breaker permit of a successful attempt, settled at the end of
    /// the stream; `None` for a failed status passed through on the last
    /// attempt, whose failure is already recorded.
    probe: Option<Permit>,
    /// When the answering attempt was sent (the first token's wait is
    /// counted from it).
    sent: tokio::time::Instant,
    /// The answering attempt's spans.
    trace: crate::trace::Attempt,
}

/// Most bytes of a worker's error body read for its message.
const ERROR_BODY_LIMIT: usize = 4096;

/// The error for a request no worker could take: for an empty or unhealthy
/// pool, says which workers are pending or unhealthy and why, for the model
/// the client named (never the wildcard pool's `*`).
fn unavailable(shared: &Shared, err: RoutingError, model: Option<&str>) -> GatewayError {
    match err {
        RoutingError::NoHealthyWorker { .. } | RoutingError::NoWorkers => {
            GatewayError::NoHealthyWorker {
                model: model.map(str::to_owned),
                why: shared
                    .control
                    .why_unavailable(&shared.router.snapshot(), model),
            }
        }
        other => other.into(),
    }
}

/// Tries workers until one answers in a way [`retry`] does not retry, or
/// the retries or the untried workers run out.
///
/// Each attempt has a first-byte deadline ([`Config::first_byte_timeout`]):
/// the response head, and for a 2xx answer its first body frame, must
/// arrive before it. The frame is read here, before anything goes to the
/// client, because an LLM server sends an event stream's head at once and
/// only then prefills: a hung worker sends the head and nothing else. A
/// missed deadline is the worker's failure (breaker, outlier detection)
/// and is retried like a refused connection.
///
/// A final 4xx other than 429 means the worker rejected the request, so
/// its prompt never reached that worker's cache: the decision's tree insert
/// is taken back.
///
/// [`Config::first_byte_timeout`]: crate::config::Config::first_byte_timeout
async fn attempts(
    state: &AppState,
    target: Target<'_>,
    request: &Inspected,
    exact: Option<&crate::events::Matched>,
    client_headers: &HeaderMap,
    peer: Option<IpAddr>,
    bytes: Bytes,
) -> Result<Answer, GatewayError> {
    let shared = &state.shared;
    let routing_key = routing_key(client_headers, request.user.as_deref());
    let max_retries = shared.config.retry.max_retries;
    let first_byte_timeout = shared.config.first_byte_timeout(request.stream);
    let stream_first_byte_timeout = shared.config.first_byte_timeout(true);
    let mut backoff = Backoff::new(&shared.config.retry);
    let mut tried: Vec<WorkerId> = Vec::new();
    let mut last_failure: Option<GatewayError> = None;
    let route = target.endpoint.label();
    // Behind a preamble, the watch finds the first token (see `respond`).
    let first_event_is_token = target.endpoint.preamble().is_none();
    loop {
        let deciding = crate::trace::Deciding::start();
        let routed = if target.endpoint.by_load() {
            shared
                .router
                .select_least_loaded(request.model.as_deref(), &tried)
        } else {
            shared.router.select_exact(
                request.model.as_deref(),
                &request.routing_text,
                routing_key,
                &tried,
                exact.map(crate::events::Matched::view),
            )
        };
        let Routed {
            mut decision,
            model,
        } = match routed {
            Ok(routed) => routed,
            Err(err) => {
                deciding.failed(&err);
                return Err(match last_failure {
                    // No untried worker is left: report what the last
                    // attempt saw, not the empty pool.
                    Some(last) => GatewayError::RetriesExhausted {
                        attempts: tried.len() as u32,
                        last: Box::new(last),
                    },
                    None => unavailable(shared, err, request.model.as_deref()),
                });
            }
        };
        deciding.decided(&decision, tried.len());
        let worker = decision.worker().clone();
        let breaker = shared.breakers.get(worker.id());
        let Some(probe) = breaker.try_acquire(tokio::time::Instant::now()) else {
            // Half-open with its probe already out: this worker sits out.
            tried.push(worker.id());
            continue;
        };
        shared
            .request_metrics
            .decision(decision.explanation().branch.as_str());
        tracing::debug!(route, worker = worker.url(), decision = %decision.rendered(), "routed");
        let pool = model
            .as_deref()
            .unwrap_or(radixgate_routing::WILDCARD_MODEL);
        if let Some(sync) = &shared.sync
            && let Some(text) = decision.inserted_text(&request.routing_text)
        {
            // Other replicas learn the decision as it goes out, as this
            // one's tree did: a whole answer's first byte comes after its
            // decode, and a stream's after a prefill that can take seconds
            // while the pool is busy; until then they would route the same
            // prefix blind (docs/sync.md). Queued, never waited for.
            sync.routed(pool, worker.url(), text);
        }
        let last_attempt = tried.len() as u32 >= max_retries;
        let sent = tokio::time::Instant::now();
        let deadline = first_byte_timeout.map(|t| sent + t);
        let mut traced = crate::trace::Attempt::start(worker.url(), target.path, tried.len());
        let attempted = send_primed(
            state,
            &decision,
            Outgoing {
                path: target.path,
                client_headers,
                peer,
            },
            bytes.clone(),
            &traced,
            Waiting {
                worker: &worker,
                breaker: &breaker,
                sent,
                timeout: first_byte_timeout,
                hang: stream_first_byte_timeout,
            },
        )
        .await;
        let failure = match attempted {
            Ok(response) => {
                let status = response.status();
                let mut observed = None;
                traced.answered(status.as_u16());
                shared.outliers.sample(worker.id(), sent.elapsed());
                if status.is_success()
                    && is_event_stream(response.headers())
                    && first_event_is_token
                {
                    // A stream's first event is its first token: the cost
                    // model learns this worker's wait from it. (A whole
                    // answer's first byte comes after its decode too, so
                    // it only releases the predicted prefill, later.)
                    observed = decision.first_token(sent.elapsed());
                }
                if !retry::retryable_status(status) {
                    if status.is_client_error() {
                        // Rejected (400, 404, 413, 422, …): the prompt never
                        // reached this worker's cache. (The other replicas
                        // keep what they were sent; their trees correct
                        // or evict it like any stale guess.)
                        let undone = decision.undo_insert(&request.routing_text);
                        tracing::debug!(worker = worker.url(), %status, undone, "worker rejected the request");
                    } else if let Some(sync) = &shared.sync
                        && let Some(seen) = observed
                    {
                        // The others' cost models learn the first token too.
                        sync.first_token(pool, worker.url(), seen);
                    }
                    return Ok(Answer {
                        response,
                        decision,
                        model,
                        probe: Some(probe),
                        sent,
                        trace: traced,
                    });
                }
                shared
                    .request_metrics
                    .upstream_error(worker.url(), "status");
                if last_attempt {
                    // Nobody is left to ask: the client gets the worker's
                    // own error answer, counted as the worker's failure.
                    record(&worker, probe, Outcome::Failure);
                    return Ok(Answer {
                        response,
                        decision,
                        model,
                        probe: None,
                        sent,
                        trace: traced,
                    });
                }
                let (message, _) = error_message(response, deadline).await;
                GatewayError::UpstreamStatus {
                    worker: worker.url().to_owned(),
                    status,
                    message,
                }
            }
            Err(err) => {
                no_first_byte(shared, &worker, &breaker, &err);
                err
            }
        };
        record(&worker, probe, Outcome::Failure);
        traced.failed(retry::reason(&failure), &failure);
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

/// An attempt that got no first byte (refused, hung, or its worker lost
/// meanwhile): counted by kind; a hang also teaches outlier detection and
/// the breaker.
fn no_first_byte(
    shared: &Shared,
    worker: &radixgate_routing::Worker,
    breaker: &crate::breaker::Breaker,
    err: &GatewayError,
) {
    let kind = match err {
        GatewayError::FirstByteTimeout { after, .. } => {
            // A hung worker's latency is at least the timeout.
            shared.outliers.sample(worker.id(), *after);
            breaker.note_hang(tokio::time::Instant::now());
            "timeout"
        }
        GatewayError::WorkerLost { .. } => "worker_lost",
        _ => "connect",
    };
    shared.request_metrics.upstream_error(worker.url(), kind);
}

/// Whether a response is an event stream (by the worker's content type).
fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// How often an attempt still waiting for its first byte looks whether its
/// worker has been marked unavailable meanwhile.
const WORKER_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// An attempt waiting for its first byte, and what it waits on.
struct Waiting<'a> {
    worker: &'a radixgate_routing::Worker,
    breaker: &'a crate::breaker::Breaker,
    sent: tokio::time::Instant,
    /// This attempt's first-byte timeout.
    timeout: Option<std::time::Duration>,
    /// The streams' first-byte timeout: waited that long on a worker that
    /// has meanwhile let another attempt pass it, this one is hung too.
    hang: Option<std::time::Duration>,
}

/// Waits for `attempt` (the response head and its first frame) until
/// `sent + timeout`. Every [`WORKER_CHECK`] it also looks at the worker,
/// and gives up at once (to be retried elsewhere) when
/// - the worker has been marked unavailable meanwhile (its breaker opened
///   on other requests' timeouts, it was ejected, or it fails health
///   checks), or
/// - another attempt at it has timed out waiting for its first byte since
///   this one was sent, and this one has waited at least the streams'
///   first-byte timeout: the worker hangs requests, even if it answers
///   others (so its breaker may stay closed).
///
/// So requests already waiting on a hung worker move on when the first of
/// them times out, not each after its own timeout (300 s for a whole
/// answer by default). An attempt that gets its first byte within a second
/// costs one timer, as a plain timeout would.
async fn first_byte<T>(
    attempt: impl std::future::Future<Output = Result<T, GatewayError>>,
    waiting: Waiting<'_>,
) -> Result<T, GatewayError> {
    let Waiting {
        worker,
        breaker,
        sent,
        timeout,
        hang,
    } = waiting;
    let deadline = timeout.map(|t| sent + t);
    tokio::pin!(attempt);
    loop {
        let check = tokio::time::Instant::now() + WORKER_CHECK;
        let wake = deadline.map_or(check, |d| d.min(check));
        if let Ok(done) = tokio::time::timeout_at(wake, &mut attempt).await {
            return done;
        }
        if deadline.is_some_and(|d| d <= tokio::time::Instant::now()) {
            return Err(GatewayError::FirstByteTimeout {
                worker: worker.url().to_owned(),
                after: timeout.unwrap_or_default(),
            });
        }
        let hung = hang.is_some_and(|h| sent.elapsed() >= h) && breaker.hung_since(sent);
        if hung || !worker.is_available() {
            return Err(GatewayError::WorkerLost {
                worker: worker.url().to_owned(),
                after: sent.elapsed(),
            });
        }
    }
}

/// Reads a 2xx response's first body frame (the first token of a stream),
/// so that a worker that sends its head and then hangs is caught before
/// anything reaches the client. Other statuses are returned as they are.
/// A body that breaks before its first frame is a failed attempt.
async fn prime(
    response: axum::http::Response<Incoming>,
    worker: &str,
) -> Result<axum::http::Response<Primed<Incoming>>, GatewayError> {
    let (parts, mut body) = response.into_parts();
    let first = if parts.status.is_success() {
        match body.frame().await {
            Some(Ok(frame)) => Some(frame),
            Some(Err(err)) => {
                return Err(GatewayError::Connect {
                    worker: worker.to_owned(),
                    source: Box::new(err),
                });
            }
            None => None,
        }
    } else {
        None
    };
    Ok(axum::http::Response::from_parts(
        parts,
        Primed::new(first, body),
    ))
}

/// The worker's own reason for an error answer: `error.message`,
/// `message` or `detail` of a JSON body, else its text, from at most
/// [`ERROR_BODY_LIMIT`] bytes read before `deadline`. Also returns the
/// bytes read.
async fn error_message(
    response: axum::http::Response<Primed<Incoming>>,
    deadline: Option<tokio::time::Instant>,
) -> (Option<String>, Bytes) {
    let body = http_body_util::Limited::new(response.into_body(), ERROR_BODY_LIMIT);
    let read = async {
        let mut body = std::pin::pin!(body);
        let mut buf = bytes::BytesMut::new();
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                buf.extend_from_slice(data);
            }
        }
        buf.freeze()
    };
    let bytes = match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, read)
            .await
            .unwrap_or_default(),
        None => tokio::time::timeout(std::time::Duration::from_secs(5), read)
            .await
            .unwrap_or_default(),
    };
    (worker_message(&bytes), bytes)
}

/// The message of a worker's error body (see [`error_message`]), trimmed
/// to one line of at most 512 characters.
fn worker_message(body: &[u8]) -> Option<String> {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let from_json = json.as_ref().and_then(|v| {
        [
            v.pointer("/error/message"),
            v.get("message"),
            v.get("detail"),
            v.get("error"),
        ]
        .into_iter()
        .flatten()
        .find_map(|m| m.as_str().map(str::to_owned))
    });
    let text = from_json.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let line: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(512)
        .collect();
    (!line.is_empty()).then_some(line)
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

/// Where an attempt's request goes and what it carries of the client's.
#[derive(Clone, Copy)]
struct Outgoing<'a> {
    /// The worker path.
    path: &'a str,
    client_headers: &'a HeaderMap,
    peer: Option<IpAddr>,
}

/// One attempt up to its first byte: `body` to the decision's worker, then
/// its head and first frame ([`prime`]), waited for as [`first_byte`] says.
async fn send_primed(
    state: &AppState,
    decision: &Decision,
    out: Outgoing<'_>,
    body: Bytes,
    traced: &crate::trace::Attempt,
    waiting: Waiting<'_>,
) -> Result<axum::http::Response<Primed<Incoming>>, GatewayError> {
    let attempt = async {
        let response = send(
            state,
            decision,
            out.path,
            out.client_headers,
            out.peer,
            body,
            traced,
        )
        .await?;
        prime(response, decision.worker().url()).await
    };
    first_byte(attempt, waiting).await
}

/// One attempt: the client's bytes to the chosen worker.
async fn send(
    state: &AppState,
    decision: &Decision,
    path: &str,
    client_headers: &HeaderMap,
    peer: Option<IpAddr>,
    body: Bytes,
    traced: &crate::trace::Attempt,
) -> Result<axum::http::Response<Incoming>, GatewayError> {
    let worker = decision.worker();
    let gateway_has_key = !state.shared.tenants.load().is_open();
    let mut headers =
        upstream::request_headers(client_headers, worker.api_key(), gateway_has_key, peer);
    traced.inject(&mut headers);
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
    responding: Responding,
) -> Response {
    let Responding {
        endpoint,
        started,
        routing_text,
        spans,
        pd,
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
    let correction = status
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
        Endpoint::ByLoad(_) | Endpoint::Unrouted => None,
    };
    let read_usage = correction.is_some() || record.is_some();
    let watch = RequestWatch {
        seen,
        shared: shared.clone(),
        correction,
        record,
        tail: read_usage.then(UsageTail::new),
        text: if read_usage {
            routing_text
        } else {
            String::new()
        },
        guard: decision.into_guard(),
        sse,
        preamble: if sse { endpoint.preamble() } else { None },
        sent,
        probe,
        _admitted: admitted,
        route: endpoint.label(),
        model,
        status: status.as_u16(),
        started,
        trace: crate::trace::RequestTrace::new(spans, trace),
        pd,
    };
    // Checked: a timeout too far away for the clock is no deadline at all
    // (validation keeps it within a day; this is the second line).
    let deadline = shared
        .config
        .request_timeout()
        .and_then(|t| started.checked_add(t))
        .map(tokio::time::Instant::from_std);
    let mut body = WatchedBody::new(response.into_body(), watch, sse);
    // Only an event stream can tell its client why it ends at the grace
    // period's expiry; any other body is cut with its connection anyway,
    // so it does not register with the shared token (a lock per response).
    if sse {
        body = body.with_abort(shared.streams_abort.clone());
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
struct Responding {
    endpoint: Endpoint,
    started: Instant,
    routing_text: String,
    spans: crate::trace::RequestSpans,
    /// A disaggregated request's other side and explanation.
    pd: Option<pd::Held>,
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
    /// The routing text, kept only for the correction and the recording.
    text: String,
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
}

/// What a response needs for the routing correction.
struct Correction {
    feedback: CacheFeedback,
}

impl Correction {
    /// The body ended: hands its cached-token report (`cached`, read from
    /// its tail) for the routing text `text` to the correction. A body
    /// without one changes nothing; an impossible one is counted on the
    /// worker (exported by the upkeep tick) and otherwise ignored.
    fn finish(self, text: &str, cached: CachedReport) {
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
    /// so the cost model learns the worker's wait here (`learn`).
    fn first_token(&mut self, learn: bool) {
        if learn {
            self.guard.first_token(self.sent.elapsed());
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
        if let Some(record) = self.record.as_mut() {
            record.data(bytes);
        }
        if let Some(scan) = self.preamble.as_mut()
            && scan.feed(bytes)
        {
            self.preamble = None;
            self.first_token(true);
        }
    }

    fn finish(mut self, end: StreamEnd) {
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
                StreamEnd::Shutdown => drop(probe),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routing_key_is_the_first_header_that_has_one_else_the_user() {
        let headers = |pairs: &[(&'static str, &[u8])]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, HeaderValue::from_bytes(value).unwrap());
            }
            map
        };
        let both = headers(&[("x-radixgate-routing-key", b"k"), ("X-Session-Id", b"s")]);
        assert_eq!(routing_key(&both, Some("u")), Some("s"));
        let key = headers(&[("x-radixgate-routing-key", b"k")]);
        assert_eq!(routing_key(&key, Some("u")), Some("k"));
        assert_eq!(routing_key(&HeaderMap::new(), Some("u")), Some("u"));
        assert_eq!(routing_key(&HeaderMap::new(), None), None);
        // A value that is not text is no key.
        let opaque = headers(&[("x-session-id", b"\xff"), ("x-radixgate-routing-key", b"k")]);
        assert_eq!(routing_key(&opaque, None), Some("k"));
    }
}
