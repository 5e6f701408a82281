//! The request path of the inference APIs, in the order a request meets it:
//! read → inspect → admit → attempts → respond.
//!
//! - **read**: the body once, within its size limit, its time limit and the
//!   gateway's budget of buffered body bytes ([`crate::body`]), kept as
//!   `Bytes` that carry their budget reservation;
//! - **inspect**: read the few fields routing needs (what the route's
//!   [`Endpoint`] reads: the routing text of an inference API, only the
//!   model of one routed by load); every attempt then sends the same
//!   bytes, so the worker sees exactly what the client sent (but for one
//!   field: a stream of a tenant whose tokens are metered asks for its
//!   usage, `crate::tenants`). A malformed request is refused here,
//!   without waiting;
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
//! Files: this one reads, inspects, admits and runs the attempt loop;
//! `proxy/attempt.rs` is one attempt up to its first byte,
//! `proxy/respond.rs` the answer on its way to the client and what it
//! holds until it ends, `proxy/pd.rs` the attempt loop of a disaggregated
//! request.
//!
//! Everything a request holds — the worker's load guard, the admission
//! permit, the breaker permit — travels inside the response body (one
//! `RequestWatch`, built whole in `respond()`) and is released when the
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
//! [`WatchedBody`]: crate::stream::WatchedBody
//! [`Preamble`]: crate::preamble::Preamble

use crate::body;
use crate::breaker::{Outcome, Permit};
use crate::error::{CLIENT_CLOSED_REQUEST, GatewayError};
use crate::inspect::Inspected;
use crate::responses::Affinity;
use crate::responses::charged::StoredAnswer;
use crate::retry::{self, Backoff};
use crate::state::{AppState, Shared};
use crate::stream::Primed;
use axum::extract::ConnectInfo;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper::body::Incoming;
use radixgate_routing::{Decision, Routed, RoutingError, WorkerId};
use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

mod attempt;
mod endpoint;
pub(crate) mod metrics;
mod pd;
mod respond;
#[cfg(test)]
pub(crate) use attempt::no_first_byte_kind;
use attempt::{
    Outgoing, Waiting, asked_for_pause, busy, choose, does_not_serve, error_message,
    failed_before_first_byte, moved_off, no_first_byte, record, request_timed_out, send_primed,
};
pub(crate) use attempt::{is_encoded, is_event_stream};
pub(crate) use endpoint::Endpoint;
pub use metrics::{LATENCY_BUCKETS, RequestMetrics, TTFT_BUCKETS, UNKNOWN_MODEL};
use respond::{Correction, Responding, respond};

/// Serves one request to `endpoint`.
pub(crate) async fn serve(state: Arc<AppState>, endpoint: Endpoint, req: Request) -> Response {
    let started = Instant::now();
    let shared = &state.shared;
    let route = endpoint.label();
    // Boxed, like the attempt loops below: a future is moved whole each
    // time it is wrapped (the handler's, axum's and the timeout's), and
    // unboxed this one was 18 KiB, copied several times per request; the
    // copying was a fifth of the gateway's instructions (bench/instr_cost.py).
    let progress = Progress::default();
    // Whether a refusal given before the body is read (a tenant over its
    // request limit, a `/v1` path not passed on) leaves some of it unread.
    let has_body = !http_body::Body::is_end_stream(req.body());
    let forwarded = Box::pin(forward(&state, endpoint, req, started, &progress));
    // A request with no answer's head when the shutdown grace period ends
    // (a non-streamed answer still being generated, a stream before its
    // first token) is told so, 503 with `Retry-After`, before its
    // connection is dropped: dropped unanswered, its client could not tell
    // it from a crash. Waited on only once the request is pending, so one
    // answered at once registers nothing.
    let work = async {
        tokio::select! {
            biased;
            result = forwarded => result,
            () = state.cut_off.cancelled() => Err(GatewayError::ShuttingDown),
        }
    };
    let served = |model: &str| shared.router.snapshot().models().any(|m| m == model);
    let unanswered = Unanswered {
        metrics: &shared.request_metrics,
        tenant_metrics: &shared.tenant_metrics,
        route,
        started,
        progress: &progress,
        served: &served,
    };
    let result = match shared.config.request_timeout() {
        Some(after) => tokio::time::timeout(after, work)
            .await
            .unwrap_or_else(|_| Err(progress.timed_out(after, started, &shared.admission))),
        None => work.await,
    };
    std::mem::forget(unanswered);
    result.unwrap_or_else(|err| {
        let model = progress.model(&served);
        let status = err.status();
        // A 504 is the router giving up on a worker that had the request
        // (its first byte or the request timeout): the worker read the
        // prompt, as when a client leaves then, and its tenant owes it.
        // So does a request cut off by the shutdown once a worker had it.
        if (status == StatusCode::GATEWAY_TIMEOUT || matches!(err, GatewayError::ShuttingDown))
            && let Some(owed) = progress.owed.get()
        {
            owed.charge(&shared.tenant_metrics);
        }
        shared
            .request_metrics
            .request_done(route, status.as_u16(), model, started.elapsed());
        let mut response = err.into_response();
        // The rest of the body is not read, so the connection cannot carry
        // another request: the answer says so, or a client that sends its
        // next request on it loses it when the server closes it.
        if has_body && progress.read_us.load(Ordering::Relaxed) == 0 {
            crate::error::says_close(&mut response);
        }
        response
    })
}

/// A request whose client left before its answer's head (the connection
/// closed while its body was read, it was queued or a worker had not yet
/// answered): dropped with the request's future, it counts the request as
/// 499, nginx's "client closed request", which would otherwise be in no
/// count. Forgotten once the request has an answer. Dropped as a panic
/// unwinds the request's future, it counts what the client is answered
/// (`trace::request_id`): 500, a bug, not a client that left.
struct Unanswered<'a> {
    metrics: &'a RequestMetrics,
    /// Where a metered tenant's prompt, owed once the request was sent to
    /// a worker ([`Progress::owed`]), is counted.
    tenant_metrics: &'a crate::tenants::TenantMetrics,
    route: &'static str,
    started: Instant,
    /// The model the request named, once its body was read.
    progress: &'a Progress,
    /// Whether a worker serves a model (the label is `unknown` otherwise).
    served: &'a (dyn Fn(&str) -> bool + Sync),
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let status = unanswered_status();
        let model = self.progress.model(self.served);
        self.metrics
            .request_done(self.route, status, model, self.started.elapsed());
        if status == CLIENT_CLOSED_REQUEST
            && let Some(owed) = self.progress.owed.get()
        {
            owed.charge(self.tenant_metrics);
        }
    }
}

/// The status a request dropped before its answer's head is counted with:
/// 499, its client gone, or 500 while a panic unwinds it (the client is
/// answered 500, `trace::request_id`).
pub(crate) fn unanswered_status() -> u16 {
    match std::thread::panicking() {
        true => GatewayError::Internal.status().as_u16(),
        false => CLIENT_CLOSED_REQUEST,
    }
}

/// How far a request got before its answer's head, for what the request
/// timeout answers when it runs out first (a timeout set below the body's
/// or the queue's): a client still sending its body is told so (408), a
/// request still queued how long it waited (503), and only one sent to a
/// worker is a 504.
#[derive(Default)]
struct Progress {
    /// Microseconds from the request's start to its body's end, plus one;
    /// 0 while the body is read.
    read_us: AtomicU64,
    /// Whether the request left the admission queue.
    admitted: AtomicBool,
    /// The model the request's body named: the metrics label of a request
    /// refused or left unanswered, where a worker serves it.
    model: std::sync::OnceLock<String>,
    /// Set when the request is sent to a worker: what its metered tenant
    /// owes if its client leaves, or the router gives up waiting (504),
    /// before the answer's head.
    owed: std::sync::OnceLock<crate::tenants::PromptOwed>,
}

impl Progress {
    /// The request's body was read, `started` being the request's start.
    fn read(&self, started: Instant) {
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
        self.read_us.store(us + 1, Ordering::Relaxed);
    }

    /// The model the request named, if `served` says a worker serves it.
    fn model(&self, served: &(dyn Fn(&str) -> bool + Sync)) -> Option<&str> {
        self.model.get().map(String::as_str).filter(|m| served(m))
    }

    /// The request was admitted.
    fn admitted(&self) {
        self.admitted.store(true, Ordering::Relaxed);
    }

    /// The error for a request whose timeout, `after`, ran out; a wait in
    /// `admission`'s queue it ended is counted there as the queue's own
    /// timeout would be (and given back to its tenant by [`Queued`]).
    fn timed_out(
        &self,
        after: Duration,
        started: Instant,
        admission: &crate::admission::Admission,
    ) -> GatewayError {
        match self.read_us.load(Ordering::Relaxed) {
            0 => GatewayError::BodyTimeout { after },
            read if !self.admitted.load(Ordering::Relaxed) => {
                let queued = GatewayError::QueueTimeout {
                    waited: started
                        .elapsed()
                        .saturating_sub(Duration::from_micros(read - 1)),
                };
                admission.queue_timed_out();
                queued
            }
            _ => GatewayError::RequestTimeout { after },
        }
    }
}

/// A tenant's request waiting for admission. Dropped before the queue
/// answers it, its wait cut short by its client leaving, the request
/// timeout or the end of the shutdown grace period, it gives the request
/// back to its tenant's request limit, as a request the queue refuses is:
/// it was never served because the router was busy. Without it, clients
/// whose own timeout is shorter than the queue's spent their tenant's
/// limit on requests never served, and were then refused for it once the
/// router had room.
struct Queued<'a>(Option<&'a crate::tenants::TenantRef>);

impl Queued<'_> {
    /// The queue answered: a slot or a refusal, which `refund` judges.
    fn answered(mut self) {
        self.0 = None;
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if let Some(tenant) = self.0 {
            crate::tenants::give_back(tenant);
        }
    }
}

/// read → inspect → admit → attempts → respond.
async fn forward(
    state: &AppState,
    endpoint: Endpoint,
    req: Request,
    started: Instant,
    progress: &Progress,
) -> Result<Response, GatewayError> {
    let shared = &state.shared;
    // The worker path: the route's own, or an unrouted request's as it
    // came (and the API family it is counted under); with the client's
    // query either way (`/v1/messages?beta=true`, `?api-version=`).
    let (path, unrouted) = match endpoint {
        Endpoint::Unrouted => {
            let (target, family) = endpoint::unrouted_target(req.method().as_str(), req.uri())?;
            (Cow::Owned(target), Some(family))
        }
        // Its path as it came, as plain as an unrouted one's must be.
        Endpoint::StoredResponse => {
            let (target, _) = endpoint::unrouted_target(req.method().as_str(), req.uri())?;
            (Cow::Owned(target), None)
        }
        Endpoint::Routed(_) | Endpoint::ByLoad(_) => match req.uri().query() {
            Some(query) => (Cow::Owned(format!("{}?{query}", endpoint.label())), None),
            None => (Cow::Borrowed(endpoint.label()), None),
        },
    };
    if shared.config.pd.enabled
        && let Some(refused) = pd::not_served(endpoint, shared.config.pd.protocol)
    {
        return Err(refused);
    }
    // Over a tenant's limit: refused before its body is read.
    let priority = crate::tenants::admit(&req, &shared.tenant_metrics)?;
    let (mut parts, body) = req.into_parts();
    let spans = crate::trace::RequestSpans::take(&mut parts.extensions);
    let bytes = body::read(&parts.headers, body, &shared.bodies)
        .await
        .inspect_err(|err| crate::tenants::refund(&parts.extensions, err))?;
    progress.read(started);
    let content_type = parts.headers.get(axum::http::header::CONTENT_TYPE);
    let request = endpoint.inspect(content_type.map(|v| v.as_bytes()), &bytes)?;
    if let Some(model) = &request.model {
        let _ = progress.model.set(model.clone());
    }
    // A stored response is named: its maker, if known (`crate::responses`).
    let affinity = shared
        .responses
        .affinity(endpoint, &request, parts.uri.path());
    // A tenant whose tokens are metered: its stream asks for usage, and
    // what it is charged without any is estimated (`tenants/usage_event.rs`)
    // where its answer may hold generated tokens.
    let estimate = endpoint.estimate(&path, &bytes);
    let (bytes, metering) =
        crate::tenants::meter(shared, &parts.extensions, estimate, &request, bytes)
            .inspect_err(|err| crate::tenants::refund(&parts.extensions, err))?;
    // A tenant's answer about a stored response: its tokens are charged
    // once (`crate::responses::charged`).
    let stored = parts
        .extensions
        .get::<crate::tenants::TenantRef>()
        .and_then(|_| StoredAnswer::of(endpoint, &affinity, request.unstored));
    let queued = Queued(parts.extensions.get());
    // A request still queued when the shutdown grace period ends is told
    // so (503 with `Retry-After`) before its connection is dropped, rather
    // than left not knowing whether it ran. That includes one handed a
    // slot after that moment (a stream cut then gave it back): it would
    // only reach a worker with its connection about to go. Checked for a
    // request that waited only, so one admitted at once takes no lock.
    let admitted = tokio::select! {
        biased;
        admitted = shared.admission.acquire(priority) => match admitted {
            Ok(permit) if permit.waited() && shared.streams_abort.is_cancelled() => {
                Err(GatewayError::ShuttingDown)
            }
            admitted => {
                queued.answered();
                admitted
            }
        },
        () = shared.streams_abort.cancelled() => Err(GatewayError::ShuttingDown),
    };
    let admitted = admitted.inspect_err(|err| crate::tenants::refund(&parts.extensions, err))?;
    progress.admitted();
    // The client's address as this gateway saw it, for `X-Forwarded-For`.
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip());
    let target = Target {
        endpoint,
        path: &path,
        method: &parts.method,
        affinity: &affinity,
        unrouted,
        until: shared.config.request_timeout().and_then(|after| {
            let at = started.checked_add(after)?;
            Some((tokio::time::Instant::from_std(at), after))
        }),
    };
    // What the workers' KV events say they hold (`events.rs`), once for
    // every attempt. Tokenizing a long prompt takes milliseconds of CPU,
    // so it runs on the blocking pool, not on a serving thread.
    let exact = match (&shared.kv_events, endpoint) {
        (Some(events), Endpoint::Routed(_))
            if events.any_live()
                && events.shares_blocks(
                    request.namespaced || is_adapter(shared, request.model.as_deref()),
                ) =>
        {
            match events.turn().await {
                Some(turn) => {
                    let (events, body, path) = (events.clone(), bytes.clone(), endpoint.label());
                    let model = request.model.clone();
                    tokio::task::spawn_blocking(move || {
                        let _turn = turn;
                        events.matched(path, &body, model.as_deref())
                    })
                    .await
                    .ok()
                    .flatten()
                }
                // The tokenizer is behind: the tree decides alone.
                None => None,
            }
        }
        _ => None,
    };
    // Sent to a worker from here: a metered tenant whose client leaves
    // before the answer's head owes its prompt (`Unanswered`).
    if let Some(owed) = metering
        .as_ref()
        .and_then(|m| m.prompt_owed(&parts.extensions))
    {
        let _ = progress.owed.set(owed);
    }
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
    let mut response = respond(
        shared,
        answer,
        admitted,
        Responding {
            endpoint,
            started,
            routing_text: request.routing_text,
            spans,
            pd,
            cut: metering.as_ref().map(crate::tenants::Metering::cut_flag),
            unstored: request.unstored,
            made: stored.as_ref().and_then(StoredAnswer::made),
        },
    );
    if let Some(metering) = metering {
        response.extensions_mut().insert(metering);
    }
    if let Some(stored) = stored {
        response.extensions_mut().insert(stored);
    }
    // A tenant's `/generate` answer: its charge reads each batch item's
    // report (no other answer is scanned for them).
    if matches!(endpoint, Endpoint::Routed(radixgate_routing::Api::Generate))
        && parts
            .extensions
            .get::<crate::tenants::TenantRef>()
            .is_some()
    {
        response
            .extensions_mut()
            .insert(crate::usage::GenerateAnswer);
    }
    Ok(response)
}

/// Whether `model` is a LoRA adapter by a worker's word (its `/v1/models`
/// entry names a parent): vLLM keys an adapter's cache blocks apart from
/// its base model's, so its requests are not matched on the shared blocks
/// of the KV-event index (`events.rs`).
fn is_adapter(shared: &Shared, model: Option<&str>) -> bool {
    let Some(model) = model else {
        return false;
    };
    let set = shared.router.snapshot();
    set.workers().iter().any(|w| w.lists_as_adapter(model))
}

/// Why a request found no worker when the only ones left were half-open.
const PROBING: &str = "every worker that could take it is half-open after failures, \
its one probe request still out (circuit breaker); retry shortly";

/// Where a request goes: its endpoint and the worker path.
#[derive(Clone, Copy)]
struct Target<'a> {
    endpoint: Endpoint,
    path: &'a str,
    /// The client's method (`POST` but for a stored response's).
    method: &'a axum::http::Method,
    /// The stored response the request names, if any.
    affinity: &'a Affinity,
    /// An unrouted request's API family: counted once its first attempt
    /// is sent, not for one no worker takes.
    unrouted: Option<&'static str>,
    /// The request's deadline and timeout, if it has one
    /// ([`Waiting::until`](attempt::Waiting)).
    until: Option<(tokio::time::Instant, Duration)>,
}

/// The sticky-session key: the first routing-key header present, else the
/// body's `user` field. One that is empty or blank is none: as a key, every
/// such request would hash to one worker.
fn routing_key<'a>(headers: &'a HeaderMap, user: Option<&'a str>) -> Option<&'a str> {
    let named = |key: &&str| !key.trim().is_empty();
    ROUTING_KEY_HEADERS
        .iter()
        .find_map(|h| headers.get(h).and_then(|v| v.to_str().ok()).filter(named))
        .or(user.filter(named))
}

/// What the attempt loop hands to [`respond()`]: the worker's response head,
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

/// Whether a request that found no worker (`err`) may try again: outlier
/// detection had ejected workers that are now the only ones left for
/// their models, and they return to the pool at once
/// ([`Outliers::rescue`](crate::outlier::Outliers::rescue)) rather than at
/// its next evaluation.
fn rescued(shared: &Shared, err: &RoutingError) -> bool {
    if !matches!(err, RoutingError::NoHealthyWorker { .. }) {
        return false;
    }
    let returned = shared.outliers.rescue(shared.router.snapshot().workers());
    if returned.is_empty() {
        return false;
    }
    // The gauge says so now, not at the next evaluation (ten seconds by
    // default), while the worker already serves.
    let metrics = crate::outlier::OutlierMetrics::new(&shared.metrics);
    for worker in &returned {
        tracing::info!(
            worker = worker.url(),
            "outlier returned to the pool: no other worker is left for its models"
        );
        metrics.ejected(worker.url(), false);
    }
    true
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
/// is taken back, as it is when no connection to the worker could be made
/// or the worker shed the request (429, 503).
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
    shared.retry_budget.request();
    let mut tried: Vec<WorkerId> = Vec::new();
    // Of those, the workers left out because their half-open breaker's one
    // probe request was out: no attempt, so no retry spent.
    let mut sat_out = 0usize;
    // The workers that answered this request 500, with their breakers'
    // permits: counted as their failures only once another worker answers
    // it (see `Answered500`).
    let mut answered_500 = Answered500::default();
    // The workers that broke the connection on it: two, and it is not
    // sent to a third (`retry::MAX_BROKEN_CONNECTIONS`).
    let mut broken = retry::Broken::new(
        &shared.suspects,
        request.model.as_deref(),
        &request.routing_text,
        &bytes,
    );
    let mut last_failure: Option<GatewayError> = None;
    // Why the last attempt failed, counted as a retry once another attempt
    // is sent (not when none is left to send it to).
    let mut retrying: Option<&'static str> = None;
    // The retry budget's share spent on it (`retry::Verdict`), given back
    // if no other attempt is sent.
    let mut pending: Option<retry::Spent<'_>> = None;
    // An unrouted request is counted with its first attempt sent.
    let mut unrouted = target.unrouted;
    let route = target.endpoint.label();
    // A request naming a stored response: its affinity is counted once;
    // the workers asked for one whose maker is unknown that answered 404.
    let mut affinity_counted = false;
    let mut looked_up = 0usize;
    // The workers that answered they do not serve the request's model
    // (see `does_not_serve`): they spend no retry either.
    let mut not_serving = 0usize;
    loop {
        let deciding = crate::trace::Deciding::start();
        let pinned = match target.affinity {
            Affinity::None => None,
            affinity => match shared.responses.pin(
                &shared.router,
                affinity,
                request.model.as_deref(),
                &tried,
                &mut affinity_counted,
            ) {
                Ok(pinned) => pinned,
                Err(crate::responses::Unpinned::NotFound(id)) => {
                    let attempts = tried.len() - sat_out;
                    return Err(crate::responses::not_found(
                        shared,
                        id,
                        looked_up,
                        last_failure,
                        attempts,
                    ));
                }
                Err(crate::responses::Unpinned::MakerUnavailable { url }) => {
                    return Err(crate::responses::maker_unavailable(&url));
                }
            },
        };
        // A stored response's maker is chosen whether or not it pauses
        // (see `choose`): no other worker holds the response.
        let routed = if let Some((decision, model)) = pinned {
            Ok(Routed { decision, model })
        } else {
            choose(shared, &tried, |avoid| {
                if target.endpoint.by_load() {
                    shared
                        .router
                        .select_least_loaded(request.model.as_deref(), avoid)
                } else {
                    shared.router.select_exact(
                        request.model.as_deref(),
                        &request.routing_text,
                        routing_key,
                        avoid,
                        exact.map(crate::events::Matched::view),
                    )
                }
            })
        };
        let Routed {
            mut decision,
            model,
        } = match routed {
            Ok(routed) => routed,
            Err(err) if rescued(shared, &err) => {
                deciding.failed(&err);
                continue;
            }
            Err(err) => {
                deciding.failed(&err);
                return Err(match last_failure {
                    // No untried worker is left: report what the last
                    // attempt saw, not the empty pool.
                    Some(last) => GatewayError::RetriesExhausted {
                        attempts: (tried.len() - sat_out) as u32,
                        last: Box::new(last),
                    },
                    None if sat_out > 0 => GatewayError::NoHealthyWorker {
                        model: request.model.clone(),
                        why: PROBING.to_owned(),
                    },
                    None => unavailable(shared, err, request.model.as_deref()),
                });
            }
        };
        // Attempts sent before this one: a worker that sat out was sent
        // nothing.
        let sent_before = tried.len() - sat_out;
        deciding.decided(&decision, sent_before);
        let worker = decision.worker().clone();
        let breaker = shared.breakers.get(worker.id());
        let Some(probe) = breaker.try_acquire(tokio::time::Instant::now()) else {
            // Half-open with its probe already out: this worker sits out,
            // and its tree does not keep a prompt it was never sent.
            decision.undo_insert(&request.routing_text);
            tried.push(worker.id());
            sat_out += 1;
            continue;
        };
        shared
            .request_metrics
            .decision(decision.explanation().branch.as_str());
        if let Some(reason) = retrying.take() {
            shared.request_metrics.retry(reason);
            match pending.take() {
                Some(spent) => spent.sent(),
                // One outside `retry.max_retries` (`model_not_served`):
                // not weighed, but it spends all the same.
                None => shared.retry_budget.retry(),
            }
        }
        if let Some(family) = unrouted.take() {
            shared.request_metrics.unrouted(family);
        }
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
        // A stored response's maker is the one worker that holds it: its
        // failure (a 429 or 503 with its `Retry-After`, a 5xx, no answer)
        // is the request's answer, not retried where it can only be
        // refused as unknown (`crate::responses::only_holder`).
        // Workers asked for a stored response that answered they do not
        // hold it (`looked_up`) failed nothing: they spend no retry.
        let retries_spent = (sent_before - looked_up - not_serving) as u32 >= max_retries
            || crate::responses::only_holder(&decision);
        // And the gateway's retries in all (`retry::RetryBudget`), weighed
        // once this attempt has failed: over it, the failure is the answer,
        // as with none left.
        let mut verdict = retry::Verdict::new(&shared.retry_budget, retries_spent);
        let sent = tokio::time::Instant::now();
        let deadline = first_byte_timeout.map(|t| sent + t);
        let mut traced = crate::trace::Attempt::start(worker.url(), target.path, sent_before);
        let attempted = send_primed(
            state,
            &decision,
            Outgoing {
                endpoint: target.endpoint,
                path: target.path,
                method: target.method,
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
                until: target.until,
            },
        )
        .await;
        // Whether a failed attempt is its worker's (see `request_timed_out`).
        let mut blamed = true;
        let failure = match attempted {
            Ok(mut response) => {
                let status = response.status();
                let mut observed = None;
                traced.answered(status.as_u16());
                if status == StatusCode::NOT_FOUND
                    && decision.explanation().branch == radixgate_routing::Branch::ResponseLookup
                    && crate::responses::asks_on(
                        &shared.router,
                        target.affinity,
                        request.model.as_deref(),
                        &tried,
                        worker.id(),
                    )
                {
                    // Not held there: the next worker is asked (its body
                    // read, so that its connection is kept).
                    let _ = error_message(response, deadline).await;
                    record(&worker, probe, Outcome::Success);
                    tried.push(worker.id());
                    looked_up += 1;
                    continue;
                }
                if status == StatusCode::NOT_FOUND
                    && let Affinity::None = target.affinity
                    && let Some(model) = request.model.as_deref()
                    && lists(&worker, model)
                    && does_not_serve(&mut response, model, deadline).await
                {
                    // Listed with the model, the worker no longer serves
                    // it (an adapter unloaded, another model started
                    // there): its models are read again (its checker logs
                    // it), and another worker listed with it, if any,
                    // takes the request, at once and for no retry. Its
                    // failure is no one's.
                    shared.control.reread_models(worker.url());
                    shared
                        .request_metrics
                        .upstream_error(worker.url(), "model_not_served");
                    decision.undo_insert(&request.routing_text);
                    if served_elsewhere(shared, &worker, model, &tried) {
                        tracing::debug!(
                            worker = worker.url(),
                            model,
                            "worker answered 404: it does not serve the model it is listed with; retried on another"
                        );
                        drop(probe);
                        // Its body was read for its message already: the
                        // rest is not waited for long.
                        let soon = tokio::time::Instant::now() + attempt::ERROR_BODY_WAIT;
                        let (message, _) = error_message(response, Some(soon)).await;
                        let failure = GatewayError::UpstreamStatus {
                            worker: worker.url().to_owned(),
                            status,
                            message,
                            retry_after: None,
                        };
                        traced.failed("model_not_served", &failure);
                        retrying = Some("model_not_served");
                        tried.push(worker.id());
                        not_serving += 1;
                        last_failure = Some(failure);
                        continue;
                    }
                }
                let sse = is_event_stream(response.headers());
                // Behind a preamble or an opening comment, the watch finds
                // the first token (see `respond`), and samples the worker's
                // speed there: the first byte came before the prefill. An
                // error event first is no token: it came before any
                // prefill, and teaches nothing of the worker's speed.
                let first = response.body().first_data();
                let first_event_is_token = sse
                    && target.endpoint.preamble(first).is_none()
                    && !first.is_some_and(crate::preamble::opens_with_error);
                if target
                    .endpoint
                    .times_its_worker(status, sse, first_event_is_token)
                {
                    shared.outliers.sample(worker.id(), sent.elapsed());
                }
                if status.is_success() && first_event_is_token {
                    // A stream's first event is its first token: the cost
                    // model learns this worker's wait from it. (A whole
                    // answer's first byte comes after its decode too, so
                    // it only releases the predicted prefill, later.)
                    observed = decision.first_token(sent.elapsed());
                }
                let opening = crate::preamble::stream_opening_error(sse, status, first);
                if opening.is_some() {
                    // An error event in the first token's place: the
                    // prompt was not prefilled there.
                    decision.undo_insert(&request.routing_text);
                }
                // A 200 whose stream opens with a server error (an engine
                // that failed, under a server that still answers) is the
                // worker's failure, as its 500 would be, and tried on
                // another worker: the client has been sent nothing yet.
                let stream_error = opening.filter(|e| retry::retryable_status(e.status()));
                if stream_error.is_none() && !retry::retryable_status(status) {
                    if status.is_success() {
                        answered_500.blame();
                        shared.responses.answered(
                            target.affinity,
                            target.method,
                            worker.url(),
                            model.as_deref(),
                        );
                    }
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
                // A failed answer: its status, or the one its stream's
                // opening error stands for.
                let (status, kind, retry_after) = match &stream_error {
                    Some(opened) => (opened.status(), "stream_error", None),
                    None => {
                        let after = response.headers().get(header::RETRY_AFTER).cloned();
                        (status, "status", after)
                    }
                };
                shared.request_metrics.upstream_error(worker.url(), kind);
                asked_for_pause(shared, &worker, status, retry_after.as_ref());
                if attempt::shed(status) {
                    // The prompt never reached this worker's cache. (The
                    // other replicas keep what they were sent, as for a
                    // rejected request.)
                    decision.undo_insert(&request.routing_text);
                }
                if verdict.last() {
                    shared.request_metrics.retry_denied(verdict.over_budget());
                    // Nobody is left to ask: the client gets the worker's
                    // own error answer (a stream as it is), counted as the
                    // worker's failure unless it is another 500 for a
                    // request others answered 500 too, or a 429 (`busy`).
                    let others_500 =
                        status == StatusCode::INTERNAL_SERVER_ERROR && answered_500.any();
                    if !others_500 && !busy(status) {
                        record(&worker, probe, Outcome::Failure);
                    }
                    return Ok(Answer {
                        response,
                        decision,
                        model,
                        probe: None,
                        sent,
                        trace: traced,
                    });
                }
                let message = match stream_error {
                    Some(opened) => opened.message,
                    None => error_message(response, deadline).await.0,
                };
                GatewayError::UpstreamStatus {
                    worker: worker.url().to_owned(),
                    status,
                    message,
                    retry_after,
                }
            }
            Err(err) => {
                if matches!(err, GatewayError::Connect { .. }) {
                    // No connection was made: the worker was sent nothing,
                    // and its tree does not keep the prompt.
                    decision.undo_insert(&request.routing_text);
                }
                let prompt = target.endpoint.first_byte_is_prompt(request.stream);
                blamed = failed_before_first_byte(shared, &worker, &breaker, &err, sent, prompt);
                err
            }
        };
        if worker_answered_500(&failure) && !verdict.last() {
            answered_500.hold(worker.clone(), probe);
        } else if !blamed || worker_was_busy(&failure) || moved_off(&failure) {
            // Neither a success nor a failure (see `busy`, `moved_off`,
            // `request_timed_out`).
            drop(probe);
        } else {
            record(&worker, probe, Outcome::Failure);
        }
        traced.failed(retry::reason(&failure), &failure);
        let failure = broken.count(failure)?;
        if !failure.retryable() || verdict.last() {
            shared
                .request_metrics
                .retry_denied(verdict.over_budget() && failure.retryable());
            let attempts = (tried.len() - sat_out) as u32 + 1;
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
        retrying = Some(retry::reason(&failure));
        pending = verdict.retry();
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

/// Whether a worker other than `worker`, and not among `tried`, is listed
/// with `model` by name and available: a 404 of `worker`'s saying it does
/// not serve the model is then worth a try there (see `does_not_serve`);
/// else that 404 is the request's answer.
fn served_elsewhere(
    shared: &Shared,
    worker: &radixgate_routing::Worker,
    model: &str,
    tried: &[WorkerId],
) -> bool {
    let set = shared.router.snapshot();
    set.workers().iter().any(|w| {
        w.id() != worker.id() && !tried.contains(&w.id()) && w.is_available() && lists(w, model)
    })
}

/// Whether `worker` lists `model` by name (a worker that lists none serves
/// any model, and says nothing of whether it is listed wrongly).
fn lists(worker: &radixgate_routing::Worker, model: &str) -> bool {
    worker.models().iter().any(|m| m == model)
}

/// The workers that answered one request 500 so far, each with its
/// breaker's permit. A 500 may be the worker's fault (a broken engine
/// answers every request so) or the request's (a prompt that trips an
/// engine's bug fails on every worker): counted on the breakers at once,
/// a client repeating such a request opened every worker's breaker in a
/// few tries and took the pool out (five requests, three workers). So a
/// 500 counts as a worker's failure once another worker answers the
/// request (`blame`); a request that every worker it tried answered 500
/// counts on none (the permits are let go, neither outcome). A 429 counts
/// on none either (`busy`). Any other failure counts at once, as before:
/// refused connections, timeouts, and 503, with which an engine that is
/// full or going away turns requests down.
#[derive(Default)]
struct Answered500(Vec<(Arc<radixgate_routing::Worker>, crate::breaker::Permit)>);

/// Whether `error` is a worker's 500 answer (see [`Answered500`]).
fn worker_answered_500(error: &GatewayError) -> bool {
    matches!(error, GatewayError::UpstreamStatus { status, .. } if *status == StatusCode::INTERNAL_SERVER_ERROR)
}

/// Whether `error` is a worker's answer that it is busy (see [`busy`]).
fn worker_was_busy(error: &GatewayError) -> bool {
    matches!(error, GatewayError::UpstreamStatus { status, .. } if busy(*status))
}

impl Answered500 {
    fn hold(&mut self, worker: Arc<radixgate_routing::Worker>, probe: crate::breaker::Permit) {
        self.0.push((worker, probe));
    }

    fn any(&self) -> bool {
        !self.0.is_empty()
    }

    /// Another worker answered: each 500 was its worker's failure.
    fn blame(&mut self) {
        for (worker, probe) in self.0.drain(..) {
            record(&worker, probe, Outcome::Failure);
        }
    }
}

#[cfg(test)]
mod tests;
