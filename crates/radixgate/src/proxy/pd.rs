//! Prefill/decode disaggregation: one request, two workers.
//!
//! Each request gets a prefill worker, chosen in the prefill pool by the
//! main policy (cache awareness pays there: prefill reuse sets TTFT), and a
//! decode worker, chosen in the decode pool by the decode policy. How the
//! KV cache then moves is the engines' protocol (`pd.protocol`):
//!
//! - **SGLang**: the client's body plus `bootstrap_host`, `bootstrap_port`
//!   (the prefill worker's) and a fresh random `bootstrap_room` (arrays of
//!   the batch's length for a batch) goes to both workers at once. Decode
//!   pulls the KV from prefill's bootstrap server and answers the client.
//!   Prefill's own answer is read to its end in a task of its own (its
//!   load guard, breaker permit and cached-token report with it) and
//!   dropped; the client's response body holds that task, so a client that
//!   goes away before prefill has answered cancels it too. Decode's
//!   first-byte timeout runs from prefill's answer: until then, decode
//!   (waiting for the KV) is silent for prefill.
//! - **vLLM** (NIXL-style connectors): first the prefill worker gets the
//!   body with `stream: false`, `max_tokens: 1` and
//!   `kv_transfer_params.do_remote_decode`; its answer's
//!   `kv_transfer_params` then go, in the client's own body, to the decode
//!   worker, which answers the client. A `/v1/completions` batch is
//!   refused (`body::check_batch`): its step one answers one prompt's
//!   parameters, which decode would read for every prompt.
//!
//! Either side failing before decode's first byte fails the attempt: the
//! other side is cancelled (its connection dropped), both load guards are
//! released, and a retryable failure is retried on a new pair, as a
//! co-located request is retried on a new worker. A side's refusal (a
//! final 4xx) is the request's fault, as a co-located worker's is: the
//! client gets it, and no breaker counts it. But a side listed with the
//! request's model that answers 404 that it does not serve it is passed
//! over for another worker of that side, as in the co-located loop
//! (`pd/served.rs`).
//!
//! **Prefill skip** (vLLM only): when the chosen decode worker is predicted
//! to hold all but `pd.skip_prefill_max_uncached_tokens` of the prompt (the
//! decode pool's prefix record, `radixgate_routing::policy::Holding`), the
//! client's bytes go to decode alone, as to a co-located worker (less any
//! `kv_transfer_params` of the client's own); vLLM's
//! decode instance prefills what a request without `kv_transfer_params`
//! needs itself. SGLang's decode server takes no request without its
//! prefill's bootstrap room (it waits for a handshake with a prefill
//! server that is never named, then aborts it), so under SGLang every
//! request goes to a pair.
//!
//! Bodies are edited by key, not re-serialised through types (`pd/body.rs`):
//! every value the client sent is passed on byte for byte; only the
//! object's key order and the white space between keys may change.

mod body;
mod served;

use body::{
    check_batch, prefill_body, transfer_params, with_bootstrap, with_transfer_params,
    without_transfer_params,
};

use super::{
    Answer, Outgoing, PROBING, Target, Waiting, asked_for_pause, choose, error_message,
    failed_before_first_byte, no_first_byte, record, request_timed_out, rescued, routing_key,
    send_primed, unavailable, worker_answered_500,
};
use crate::breaker::{Outcome, Permit};
use crate::config::PdProtocol;
use crate::error::GatewayError;
use crate::inspect::{Api, Inspected};
use crate::retry::{self, Backoff};
use crate::state::{AppState, Shared};
use crate::usage::{CachedReport, UsageTail};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderName, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use radixgate_routing::{Decision, Routed, WorkerId, WorkerRole, WorkerUrl};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Header naming the prefill worker of a disaggregated request.
pub(super) const PREFILL_WORKER_NAME: HeaderName =
    HeaderName::from_static("x-radixgate-prefill-worker");

/// Most bytes of a vLLM prefill answer read for its `kv_transfer_params`.
const PREFILL_ANSWER_LIMIT: usize = 1 << 20;

/// Longest a finished request's prefill answer is still read for (its
/// cached-token report and breaker outcome) after decode has answered.
const PREFILL_TAIL: Duration = Duration::from_secs(60);

/// What a disaggregated request keeps until its response body ends.
pub(crate) struct Held {
    /// The SGLang prefill side, still reading prefill's answer.
    prefill: Option<tokio::task::JoinHandle<()>>,
    /// The `x-radixgate-decision` line naming both choices.
    pub(crate) explained: String,
    /// The prefill worker's URL (`None`: prefill skipped).
    pub(crate) prefill_worker: Option<String>,
}

impl Held {
    /// The response ended: a complete one leaves prefill's answer to be
    /// read to its end; any other end cancels it.
    pub(crate) fn finish(mut self, complete: bool) {
        if let Some(task) = self.prefill.take()
            && !complete
        {
            task.abort();
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(task) = self.prefill.take() {
            task.abort();
        }
    }
}

/// Whether `api` is served by a disaggregated pool speaking `protocol`
/// (the others answer 501).
fn served(api: Api, protocol: PdProtocol) -> bool {
    match protocol {
        PdProtocol::Sglang => {
            matches!(api, Api::Generate | Api::Completions | Api::ChatCompletions)
        }
        PdProtocol::Vllm => matches!(api, Api::Completions | Api::ChatCompletions),
    }
}

/// Under `pd:`, the refusal of a request to `endpoint` that no pair serves
/// (`served`): given before anything is spent on it (its body read, a
/// tenant's request slot, a place in the admission queue, its tokens).
pub(super) fn not_served(endpoint: super::Endpoint, protocol: PdProtocol) -> Option<GatewayError> {
    match endpoint {
        super::Endpoint::Routed(api) if served(api, protocol) => None,
        super::Endpoint::Routed(api) => Some(GatewayError::NotDisaggregated { route: api.path() }),
        other => Some(GatewayError::NotDisaggregated {
            route: other.label(),
        }),
    }
}

/// The pair's attempt loop (see the module doc); returns decode's answer
/// and what the response body must keep.
#[allow(clippy::too_many_arguments)]
pub(super) async fn attempts(
    state: &AppState,
    api: Api,
    target: Target<'_>,
    request: &Inspected,
    exact: Option<&crate::events::Matched>,
    client_headers: &HeaderMap,
    peer: Option<IpAddr>,
    bytes: Bytes,
) -> Result<(Answer, Held), GatewayError> {
    let shared = &state.shared;
    let pd = &shared.config.pd;
    if !served(api, pd.protocol) {
        return Err(GatewayError::NotDisaggregated { route: api.path() });
    }
    check_batch(api, pd.protocol, &bytes)?;
    let routing_key = routing_key(client_headers, request.user.as_deref());
    let max_retries = shared.config.retry.max_retries;
    let first_byte_timeout = shared.config.first_byte_timeout(request.stream);
    let stream_first_byte_timeout = shared.config.first_byte_timeout(true);
    let mut backoff = Backoff::new(&shared.config.retry);
    shared.retry_budget.request();
    let mut tried_prefill: Vec<WorkerId> = Vec::new();
    let mut tried_decode: Vec<WorkerId> = Vec::new();
    // Of `tried_prefill`, the prefill workers left out because their
    // pair's decode failed after taking the request: a retry tries another
    // prefill worker too, but falls back to these when no other is left.
    let mut suspects: Vec<WorkerId> = Vec::new();
    // The workers whose 500 for this request is not counted yet: blamed
    // once another pair answers it, never if none does.
    let mut answered_500: Vec<Arc<radixgate_routing::Worker>> = Vec::new();
    let mut last_failure: Option<GatewayError> = None;
    // Why the last pair failed, counted as a retry once another pair is
    // sent (not when none is left to send it to).
    let mut retrying: Option<&'static str> = None;
    // The retry budget's share spent on it, as in the co-located loop.
    let mut pending: Option<retry::Spent<'_>> = None;
    let mut attempt = 0u32;
    // Of `attempt`, those that went to a side not serving the model it is
    // listed with (`served`): they spend no retry.
    let mut not_serving = 0u32;
    // Whether a side was left out because its half-open breaker's one
    // probe request was out: no attempt, so no retry spent.
    let mut sat_out = false;
    let model = request.model.as_deref();
    let text = &request.routing_text;
    // The workers that broke the connection on it (`retry::Broken`).
    let mut broken = retry::Broken::new(&shared.suspects, model, text, &bytes);
    loop {
        // `side`: the pool that had no worker to take it, named, since
        // the other may be well (and `/readiness` names it too).
        let give_up = |err, last: Option<GatewayError>, side: &str| match last {
            Some(last) => GatewayError::RetriesExhausted {
                attempts: attempt,
                last: Box::new(last),
            },
            None if sat_out => GatewayError::NoHealthyWorker {
                model: request.model.clone(),
                why: PROBING.to_owned(),
            },
            None => match unavailable(shared, err, model) {
                GatewayError::NoHealthyWorker { model, why } => GatewayError::NoHealthyWorker {
                    model,
                    why: format!("no {side} worker can take it; {why}"),
                },
                other => other,
            },
        };
        let deciding = crate::trace::Deciding::start_for(WorkerRole::Decode);
        let mut decode = match choose(shared, &tried_decode, |avoid| {
            shared
                .router
                .select_in(WorkerRole::Decode, model, text, routing_key, avoid, None)
        }) {
            Ok(routed) => {
                deciding.decided(&routed.decision, attempt as usize);
                routed
            }
            Err(err) => {
                deciding.failed(&err);
                match rescued(shared, &err) {
                    true => continue,
                    false => return Err(give_up(err, last_failure, "decode")),
                }
            }
        };
        let skip = match pd.protocol {
            PdProtocol::Vllm => {
                skips_prefill(shared, &decode, text, pd.skip_prefill_max_uncached_tokens)
            }
            PdProtocol::Sglang => None,
        };
        // A side chosen but not sent: its tree does not keep the prompt.
        let unsent = |side: &mut Routed| {
            side.decision.undo_insert(text);
        };
        // Decode alone gets the client's body less any transfer
        // parameters of the client's own: they would have it pull the KV
        // the client names (another request's blocks, any host).
        let alone = match skip {
            Some(_) => match without_transfer_params(&bytes) {
                Ok(body) => Some(body),
                Err(err) => {
                    unsent(&mut decode);
                    return Err(err);
                }
            },
            None => None,
        };
        let select_prefill = |tried: &[WorkerId]| {
            let deciding = crate::trace::Deciding::start_for(WorkerRole::Prefill);
            let routed = choose(shared, tried, |avoid| {
                shared.router.select_in(
                    WorkerRole::Prefill,
                    model,
                    text,
                    routing_key,
                    avoid,
                    exact.map(crate::events::Matched::view),
                )
            });
            match &routed {
                Ok(routed) => deciding.decided(&routed.decision, attempt as usize),
                Err(err) => deciding.failed(err),
            }
            routed
        };
        let mut prefill = match skip {
            Some(_) => None,
            None => match select_prefill(&tried_prefill) {
                Ok(routed) => Some(routed),
                Err(_) if !suspects.is_empty() => {
                    tried_prefill.retain(|id| !suspects.contains(id));
                    suspects.clear();
                    match select_prefill(&tried_prefill) {
                        Ok(routed) => Some(routed),
                        Err(err) if rescued(shared, &err) => {
                            unsent(&mut decode);
                            continue;
                        }
                        Err(err) => {
                            unsent(&mut decode);
                            return Err(give_up(err, last_failure, "prefill"));
                        }
                    }
                }
                Err(err) if rescued(shared, &err) => {
                    unsent(&mut decode);
                    continue;
                }
                Err(err) => {
                    unsent(&mut decode);
                    return Err(give_up(err, last_failure, "prefill"));
                }
            },
        };
        // Each side's breaker admits it before either is sent, so that a
        // half-open side with its probe out costs the pair nothing (vLLM's
        // prefill would otherwise run for a decode that cannot take it).
        let now = tokio::time::Instant::now();
        let Some(decode_probe) = probe(shared, &decode, now) else {
            unsent(&mut decode);
            if let Some(prefill) = &mut prefill {
                unsent(prefill);
            }
            tried_decode.push(decode.decision.worker().id());
            sat_out = true;
            continue;
        };
        let prefill = match prefill {
            None => None,
            Some(mut prefill) => match probe(shared, &prefill, now) {
                Some(permit) => Some((prefill, permit)),
                None => {
                    unsent(&mut prefill);
                    unsent(&mut decode);
                    tried_prefill.push(prefill.decision.worker().id());
                    sat_out = true;
                    continue;
                }
            },
        };
        let explained = explain(pd.protocol, prefill.as_ref().map(|(p, _)| p), &decode, skip);
        shared.request_metrics.pd_request(if skip.is_some() {
            "skipped_prefill"
        } else {
            "paired"
        });
        // Counted once per attempt, by the decision that set its prompt's
        // cost: prefill's, or decode's when it prefills alone.
        let deciding = prefill.as_ref().map_or(&decode, |(p, _)| p);
        shared
            .request_metrics
            .decision(deciding.decision.explanation().branch.as_str());
        // What other router replicas learn once the pair has answered
        // (nothing to keep without sync).
        let learned = [prefill.as_ref().map(|(p, _)| p), Some(&decode)].map(|side| {
            shared.sync.as_ref()?;
            let side = side?;
            let inserted = side.decision.inserted_text(text)?;
            Some(Learned {
                model: side.model.clone(),
                url: side.decision.worker().url().to_owned(),
                len: inserted.len(),
            })
        });
        if let Some(reason) = retrying.take() {
            shared.request_metrics.retry(reason);
            match pending.take() {
                Some(spent) => spent.sent(),
                // `model_not_served`: not weighed, but spent.
                None => shared.retry_budget.retry(),
            }
        }
        let retries_spent = attempt - not_serving >= max_retries;
        // The gateway's retries in all, weighed once the pair has failed,
        // as in the co-located loop.
        let mut verdict = retry::Verdict::new(&shared.retry_budget, retries_spent);
        attempt += 1;
        let pair = Pair {
            state,
            api,
            path: target.path,
            client_headers,
            peer,
            first_byte_timeout,
            hang: stream_first_byte_timeout,
            until: target.until,
            prompt: super::Endpoint::Routed(api).first_byte_is_prompt(request.stream),
            text,
            model,
            retry: attempt as usize - 1,
        };
        let paired_decode = decode.decision.worker().clone();
        let decode = (decode, decode_probe);
        let paired_prefill = prefill.as_ref().map(|(p, _)| p.decision.worker().clone());
        let outcome = match prefill {
            None => {
                let body = alone.unwrap_or_else(|| bytes.clone());
                pair.decode_alone(decode, body).await
            }
            Some(prefill) => match pd.protocol {
                PdProtocol::Sglang => pair.sglang(api, prefill, decode, &bytes).await,
                PdProtocol::Vllm => pair.vllm(prefill, decode, &bytes).await,
            },
        };
        let failure = match outcome {
            Ok(Done {
                answer,
                prefill_task,
                prefill_worker,
            }) => {
                if answer.response.status().is_success() {
                    for worker in answered_500.drain(..) {
                        blame(shared, &worker);
                    }
                }
                if let Some(sync) = &shared.sync
                    && answer.response.status().is_success()
                {
                    for learned in learned.into_iter().flatten() {
                        sync.routed(
                            learned
                                .model
                                .as_deref()
                                .unwrap_or(radixgate_routing::WILDCARD_MODEL),
                            &learned.url,
                            &text[..learned.len],
                        );
                    }
                }
                return Ok((
                    answer,
                    Held {
                        prefill: prefill_task,
                        explained,
                        prefill_worker,
                    },
                ));
            }
            Err(Failed {
                side,
                worker,
                error,
                answer: _,
            }) if matches!(error, GatewayError::ModelNotServed { .. }) => {
                // The side does not serve the model it is listed with: a
                // pair with another worker of that side listed with it
                // takes the request at once; with none, the client is
                // told (see `served`).
                let tried = match side {
                    WorkerRole::Decode => &mut tried_decode,
                    _ => &mut tried_prefill,
                };
                tried.push(worker);
                if !model.is_some_and(|m| served::elsewhere(shared, side, m, tried)) {
                    return Err(error);
                }
                tracing::debug!(%error, "retried on a pair with another {} worker", side.as_str());
                not_serving += 1;
                retrying = Some("model_not_served");
                last_failure = Some(error);
                continue;
            }
            Err(Failed {
                side,
                worker,
                error,
                answer,
            }) => {
                if !refused(&error) {
                    shared.request_metrics.pd_failure(side.as_str());
                }
                if let GatewayError::UpstreamStatus {
                    status,
                    retry_after,
                    ..
                } = &error
                {
                    let failed = match side {
                        WorkerRole::Decode => Some(&paired_decode),
                        _ => paired_prefill.as_ref(),
                    };
                    if let Some(failed) = failed {
                        asked_for_pause(shared, failed, *status, retry_after.as_ref());
                    }
                }
                // A 500 waits to be counted (see `answered_500`); on the last
                // attempt it counts now if it is the first (no other pair to
                // tell by), and never if earlier pairs answered 500 too (the
                // request's own fault).
                let how = match worker_answered_500(&error) {
                    false => Count::Now,
                    true => match (verdict.last(), answered_500.is_empty()) {
                        (true, true) => Count::Now,
                        (false, _) => Count::Later,
                        (true, false) => Count::Never,
                    },
                };
                let failed = match side {
                    WorkerRole::Decode => &paired_decode,
                    _ => paired_prefill.as_ref().unwrap_or(&paired_decode),
                };
                if worker_answered_500(&error) {
                    how.apply(shared, failed, &mut answered_500);
                }
                if let (WorkerRole::Decode, Some(prefill)) = (side, &paired_prefill)
                    && transfer_may_have_failed(&error)
                {
                    // Decode took the request and failed it: the KV it
                    // pulls from prefill may never have come. Both sides
                    // are blamed, so that a prefill worker whose transfers
                    // fail opens its breaker (its decodes, paired with
                    // other prefills too, keep theirs closed); for a 500,
                    // as decode is, once another pair answers.
                    how.apply(shared, prefill, &mut answered_500);
                    if !tried_prefill.contains(&prefill.id()) {
                        tried_prefill.push(prefill.id());
                        suspects.push(prefill.id());
                    }
                }
                // Kept only for a failure worth retrying (decode's 5xx or
                // 429 answer): weighed here.
                if let Some(answer) = answer.filter(|_| verdict.last()) {
                    shared
                        .request_metrics
                        .retry_denied(verdict.over_budget() && error.retryable());
                    // Nobody is left to ask: decode's own error answer
                    // goes to the client, as a co-located one would, with
                    // the pair named as on any answer.
                    return Ok((
                        *answer,
                        Held {
                            prefill: None,
                            explained,
                            prefill_worker: paired_prefill.as_ref().map(|p| p.url().to_owned()),
                        },
                    ));
                }
                match side {
                    WorkerRole::Decode => tried_decode.push(worker),
                    _ => tried_prefill.push(worker),
                }
                GatewayError::Disaggregated {
                    side: side.as_str(),
                    source: Box::new(error),
                }
            }
        };
        let failure = broken.count(failure)?;
        if !failure.retryable() || verdict.last() {
            shared
                .request_metrics
                .retry_denied(verdict.over_budget() && failure.retryable());
            return Err(if attempt > 1 {
                GatewayError::RetriesExhausted {
                    attempts: attempt,
                    last: Box::new(failure),
                }
            } else {
                failure
            });
        }
        tracing::debug!(error = %failure, "disaggregated attempt failed; retrying on a new pair");
        retrying = Some(retry::reason(&failure));
        pending = verdict.retry();
        last_failure = Some(failure);
        let pause = backoff.pause(&mut rand::rng());
        tokio::time::sleep(pause).await;
    }
}

/// Whether decode's failure may be its transfer from prefill: decode
/// answered an error (other than 503, an engine that is full or going)
/// or no first byte in time, after taking the request. Not reaching
/// decode at all is decode's own.
fn transfer_may_have_failed(error: &GatewayError) -> bool {
    match error {
        GatewayError::UpstreamStatus { status, .. } => {
            status.is_server_error() && *status != axum::http::StatusCode::SERVICE_UNAVAILABLE
        }
        GatewayError::FirstByteTimeout { .. } => true,
        _ => false,
    }
}

/// A side's failed answer on its breaker: at once, but for a 500, which
/// the pair's loop counts only once another pair answers the request
/// (`super::Answered500`: a prompt that trips an engine bug fails on every
/// worker, and must not open every breaker), and for a 429, which counts
/// neither way (a busy worker, `super::attempt::busy`).
fn record_unless_500(worker: &radixgate_routing::Worker, probe: Permit, status: StatusCode) {
    if status != StatusCode::INTERNAL_SERVER_ERROR && !super::attempt::busy(status) {
        record(worker, probe, Outcome::Failure);
    }
}

/// Whether `status`, a side's answer, refuses the request: a final 4xx
/// (a prompt over the model's context, a parameter the engine rejects),
/// the request's own fault, as a co-located worker's is.
fn refusal(status: StatusCode) -> bool {
    !status.is_success() && !retry::retryable_status(status)
}

/// Whether a side's failure is its refusal of the request (see
/// [`refusal`]): the client's answer, not the side's failure.
fn refused(error: &GatewayError) -> bool {
    matches!(error, GatewayError::UpstreamStatus { status, .. } if refusal(*status))
}

/// Settles prefill's answer `status` that is not a success. A refusal is
/// the worker answering (its breaker counts a success, as for a
/// co-located worker's refusal) and the prompt never cached there (its
/// tree insert is taken back); counted as a failure, a client's few
/// over-long prompts opened every prefill worker's breaker. Anything else
/// is the worker's failure ([`record_unless_500`]), and one that
/// [`shed`](super::attempt::shed) the request takes its tree insert back
/// too.
fn prefill_unanswered(
    shared: &Shared,
    decision: &mut Decision,
    text: &str,
    probe: Permit,
    status: StatusCode,
) {
    let worker = decision.worker().clone();
    if refusal(status) {
        decision.undo_insert(text);
        record(&worker, probe, Outcome::Success);
        return;
    }
    shared
        .request_metrics
        .upstream_error(worker.url(), "status");
    if super::attempt::shed(status) {
        decision.undo_insert(text);
    }
    record_unless_500(&worker, probe, status);
}

/// When a failure the pair's loop blames is counted on the breaker.
#[derive(Clone, Copy)]
enum Count {
    /// At once.
    Now,
    /// Once another pair answers the request.
    Later,
    /// Not at all: every pair answered the request 500.
    Never,
}

impl Count {
    fn apply(
        self,
        shared: &Shared,
        worker: &Arc<radixgate_routing::Worker>,
        later: &mut Vec<Arc<radixgate_routing::Worker>>,
    ) {
        match self {
            Self::Now => blame(shared, worker),
            Self::Later => later.push(worker.clone()),
            Self::Never => {}
        }
    }
}

/// Counts a failure on `worker`'s breaker outside any attempt of its own
/// (nothing, while it is half-open with its probes out).
fn blame(shared: &Shared, worker: &radixgate_routing::Worker) {
    if let Some(permit) = shared
        .breakers
        .get(worker.id())
        .try_acquire(tokio::time::Instant::now())
    {
        record(worker, permit, Outcome::Failure);
    }
}

/// The breaker's admission for a side's worker; `None` while it is
/// half-open with its probe out.
fn probe(shared: &Shared, side: &Routed, now: tokio::time::Instant) -> Option<Permit> {
    shared
        .breakers
        .get(side.decision.worker().id())
        .try_acquire(now)
}

/// A side's decision with its breaker's admission.
type Admitted = (Routed, Permit);

/// A decision's tree insert, for the other router replicas.
struct Learned {
    model: Option<String>,
    url: String,
    /// Bytes of the routing text inserted.
    len: usize,
}

/// The prompt tokens decode would have to compute itself, when that is at
/// most `threshold` (and the threshold is on): decode's predicted holding,
/// in the model's learned characters per token (4 until learned). A prompt
/// that short in all goes to decode alone too: moving its KV would cost
/// more than computing it.
fn skips_prefill(shared: &Shared, decode: &Routed, text: &str, threshold: usize) -> Option<usize> {
    if threshold == 0 {
        return None;
    }
    let held = decode.decision.held_chars()?;
    let chars = text.chars().count();
    let uncached = chars.saturating_sub(held);
    let per_token = decode
        .model
        .as_deref()
        .and_then(|m| {
            shared
                .router
                .decode_policy()
                .trees()
                .and_then(|t| t.chars_per_token_of(m))
        })
        .unwrap_or(4.0)
        .max(0.5);
    let tokens = (uncached as f64 / per_token).ceil() as usize;
    (tokens <= threshold).then_some(tokens)
}

/// `pd=sglang prefill=[…] decode=[…]`, or with `prefill=skipped` and the
/// tokens decode computes itself; each bracket is that side's decision
/// line.
fn explain(
    protocol: PdProtocol,
    prefill: Option<&Routed>,
    decode: &Routed,
    skip: Option<usize>,
) -> String {
    let mut line = String::with_capacity(256);
    let _ = write!(line, "pd={} ", protocol.as_str());
    match (prefill, skip) {
        (Some(p), _) => {
            let _ = write!(line, "prefill=[{}] ", p.decision.rendered());
        }
        (None, Some(tokens)) => {
            let _ = write!(line, "prefill=skipped uncached_tokens={tokens} ");
        }
        (None, None) => {}
    }
    let _ = write!(line, "decode=[{}]", decode.decision.rendered());
    if let Some(held) = decode.decision.held_chars() {
        let _ = write!(line, " decode_held_chars={held}");
    }
    line
}

/// One pair's attempt: what it shares with every step.
#[derive(Clone, Copy)]
struct Pair<'a> {
    state: &'a AppState,
    /// The API asked (outlier detection judges its answers by it).
    api: Api,
    path: &'a str,
    client_headers: &'a HeaderMap,
    peer: Option<IpAddr>,
    first_byte_timeout: Option<Duration>,
    hang: Option<Duration>,
    /// The request's deadline and timeout, if it has one: an attempt the
    /// request timeout ends before its first byte is judged as the
    /// co-located one is (`attempt::request_timed_out`).
    until: Option<(tokio::time::Instant, Duration)>,
    /// Whether the client's request's first byte is due soon after its
    /// prefill, so that its timeout says the worker hangs
    /// (`Endpoint::first_byte_is_prompt`).
    prompt: bool,
    text: &'a str,
    /// The model the request names, if any.
    model: Option<&'a str>,
    retry: usize,
}

/// A pair's attempt that answered.
struct Done {
    answer: Answer,
    prefill_task: Option<tokio::task::JoinHandle<()>>,
    prefill_worker: Option<String>,
}

/// A pair's attempt that failed: on which side, and decode's own error
/// answer when it gave one (passed through on the last attempt).
struct Failed {
    side: WorkerRole,
    worker: WorkerId,
    error: GatewayError,
    answer: Option<Box<Answer>>,
}

impl Failed {
    fn prefill(worker: WorkerId, error: GatewayError) -> Self {
        Self {
            side: WorkerRole::Prefill,
            worker,
            error,
            answer: None,
        }
    }
}

impl Pair<'_> {
    /// Sends `body` to the decision's worker, which its breaker admitted
    /// with `probe`, and waits for its head and first frame; a failure is
    /// recorded on the worker. `prompt`: whether that first byte is due
    /// soon after the prefill (`attempt::no_first_byte`).
    async fn attempt(
        &self,
        decision: &mut Decision,
        probe: Permit,
        body: Bytes,
        prompt: bool,
    ) -> Result<(Answer2, Permit), GatewayError> {
        let shared = &self.state.shared;
        let worker = decision.worker().clone();
        let breaker = shared.breakers.get(worker.id());
        let sent = tokio::time::Instant::now();
        let traced =
            crate::trace::Attempt::start_in(worker.role(), worker.url(), self.path, self.retry);
        let waited = send_primed(
            self.state,
            decision,
            Outgoing {
                endpoint: super::Endpoint::Routed(self.api),
                path: self.path,
                method: &super::attempt::POST,
                client_headers: self.client_headers,
                peer: self.peer,
            },
            body,
            &traced,
            Waiting {
                worker: &worker,
                breaker: &breaker,
                sent,
                timeout: self.first_byte_timeout,
                hang: self.hang,
                until: self.until,
            },
        )
        .await;
        match waited {
            Ok(response) => Ok((
                Answer2 {
                    response,
                    sent,
                    trace: traced,
                },
                probe,
            )),
            Err(err) => {
                if matches!(err, GatewayError::Connect { .. }) {
                    // No connection was made: the worker was sent nothing,
                    // and its record does not keep the prompt.
                    decision.undo_insert(self.text);
                }
                let blamed =
                    failed_before_first_byte(shared, &worker, &breaker, &err, sent, prompt);
                traced.failed(retry::reason(&err), &err);
                if blamed && !super::attempt::moved_off(&err) {
                    record(&worker, probe, Outcome::Failure);
                }
                Err(err)
            }
        }
    }

    /// Decode's response: the client's answer if it succeeded; otherwise
    /// the failure, with the answer kept for the last attempt.
    async fn decode_answer(&self, routed: Admitted, body: Bytes) -> Result<Answer, Failed> {
        let (
            Routed {
                mut decision,
                model,
            },
            probe,
        ) = routed;
        let reply = self.decode_reply(&mut decision, probe, body).await;
        reply.settle(decision, model)
    }

    /// [`Pair::decode_answer`], with the decision lent: SGLang's pair
    /// ([`Pair::sglang`]) keeps it, to take decode's insert back when
    /// prefill fails while decode waits.
    async fn decode_reply(
        &self,
        decision: &mut Decision,
        probe: Permit,
        body: Bytes,
    ) -> DecodeReply {
        let shared = &self.state.shared;
        let worker = decision.worker().clone();
        let (mut answer, probe) = match self.attempt(decision, probe, body, self.prompt).await {
            Ok(ok) => ok,
            Err(error) => {
                return DecodeReply::Failed {
                    worker: worker.id(),
                    error,
                    kept: None,
                };
            }
        };
        let status = answer.response.status();
        answer.trace.answered(status.as_u16());
        let sse = super::is_event_stream(answer.response.headers());
        // Behind a preamble or an opening comment, the watch finds the
        // first token (see `respond`) and samples the worker's speed there.
        let endpoint = super::Endpoint::Routed(self.api);
        let first = answer.response.body().first_data();
        // An error event first is no token (see the co-located path).
        let first_event_is_token = sse
            && endpoint.preamble(first).is_none()
            && !first.is_some_and(crate::preamble::opens_with_error);
        if endpoint.times_its_worker(status, sse, first_event_is_token) {
            shared.outliers.sample(worker.id(), answer.sent.elapsed());
        }
        if status.is_success() && first_event_is_token {
            decision.first_token(answer.sent.elapsed());
        }
        // A 200 whose stream opens with an error event, as in the
        // co-located loop: no prompt was prefilled there, and one of a
        // server error (an engine that failed under a server that still
        // answers) is decode's failure, as its 500 would be, and tried on
        // another pair, since the client has been sent nothing yet.
        let opening = crate::preamble::stream_opening_error(sse, status, first);
        if opening.is_some() {
            decision.undo_insert(self.text);
        }
        if let Some(opened) = opening.filter(|e| retry::retryable_status(e.status())) {
            let status = opened.status();
            shared
                .request_metrics
                .upstream_error(worker.url(), "stream_error");
            record_unless_500(&worker, probe, status);
            let error = GatewayError::UpstreamStatus {
                worker: worker.url().to_owned(),
                status,
                message: opened.message,
                retry_after: None,
            };
            return DecodeReply::Failed {
                worker: worker.id(),
                error,
                kept: Some(answer),
            };
        }
        if !retry::retryable_status(status) {
            let deadline = self.first_byte_timeout.map(|t| answer.sent + t);
            if served::refuses_model(decision, self.model, &mut answer, deadline).await {
                let model = self.model.unwrap_or_default();
                let error = served::settle(shared, decision, self.text, probe, model, answer).await;
                return DecodeReply::Failed {
                    worker: worker.id(),
                    error,
                    kept: None,
                };
            }
            if status.is_client_error() {
                decision.undo_insert(self.text);
            }
            return DecodeReply::Answered(answer, probe);
        }
        shared
            .request_metrics
            .upstream_error(worker.url(), "status");
        if super::attempt::shed(status) {
            decision.undo_insert(self.text);
        }
        record_unless_500(&worker, probe, status);
        // The last attempt passes the answer itself on; a retry names the
        // status.
        let error = GatewayError::UpstreamStatus {
            worker: worker.url().to_owned(),
            status,
            message: None,
            retry_after: answer.response.headers().get(RETRY_AFTER).cloned(),
        };
        DecodeReply::Failed {
            worker: worker.id(),
            error,
            kept: Some(answer),
        }
    }

    /// The prefill skip: the client's bytes to decode alone.
    async fn decode_alone(&self, decode: Admitted, bytes: Bytes) -> Result<Done, Failed> {
        let answer = self.decode_answer(decode, bytes).await?;
        Ok(Done {
            answer,
            prefill_task: None,
            prefill_worker: None,
        })
    }

    /// SGLang: both at once, with the bootstrap fields.
    async fn sglang(
        &self,
        api: Api,
        (prefill, prefill_probe): Admitted,
        decode: Admitted,
        bytes: &Bytes,
    ) -> Result<Done, Failed> {
        let shared = &self.state.shared;
        let prefill_worker = prefill.decision.worker().clone();
        let host = bootstrap_host(prefill_worker.url());
        let body = match with_bootstrap(api, bytes, &host, prefill_worker.bootstrap_port()) {
            Ok(body) => body,
            Err(err) => return Err(Failed::prefill(prefill_worker.id(), err)),
        };
        let (head_tx, head_rx) = tokio::sync::oneshot::channel();
        // Prefill's success is the pair's: told once decode has answered.
        let (decoded_tx, decoded_rx) = tokio::sync::oneshot::channel();
        // In the request's scopes: its log lines carry the request id, and
        // its attempt span nests under the request's trace.
        let log = crate::trace::request_log::RequestLog::current();
        let task = tokio::spawn(log.scope(tracing::Instrument::in_current_span(prefill_side(
            PrefillSide {
                shared: shared.clone(),
                forwarder: self.state.forwarder.clone(),
                cut_off: self.state.cut_off.clone(),
                api: self.api,
                path: self.path.to_owned(),
                headers: self.client_headers.clone(),
                peer: self.peer,
                timeout: self.first_byte_timeout,
                hang: self.hang,
                text: self.text.to_owned(),
                model: self.model.map(str::to_owned),
                retry: self.retry,
            },
            prefill.decision,
            prefill_probe,
            body.clone(),
            head_tx,
            decoded_rx,
        ))));
        let mut task = AbortOnDrop(Some(task));
        // Decode sends its first byte only once prefill's KV has come:
        // until prefill has answered, decode's silence is prefill's. So
        // decode's first-byte timer runs from prefill's answer, here, not
        // from its own send (a moment before prefill's: decode timed out
        // first and was blamed, breaker and hang, for a hung prefill).
        // So is the request timeout's end: this loop judges whose silence
        // it ended, not decode's own attempt.
        let (
            Routed {
                decision: mut decode_decision,
                model: decode_model,
            },
            decode_probe,
        ) = decode;
        let decode_worker = decode_decision.worker().clone();
        let waiting = Pair {
            first_byte_timeout: None,
            until: None,
            ..*self
        };
        let mut decoding = Box::pin(waiting.decode_reply(&mut decode_decision, decode_probe, body));
        tokio::pin!(head_rx);
        let mut prefill_ok = false;
        let mut decode_deadline = None;
        // When prefill was sent, and then when it answered: since then, a
        // silence is decode's.
        let mut waited_since = tokio::time::Instant::now();
        let until = self.until.map(|(at, _)| at);
        let failed = |error| Failed::prefill(prefill_worker.id(), error);
        let lost = || {
            // The task ended without a word: it panicked or was cut.
            GatewayError::WorkerLost {
                worker: prefill_worker.url().to_owned(),
                after: Duration::ZERO,
                moved: false,
            }
        };
        let waited = loop {
            let due = decode_deadline.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                head = &mut head_rx, if !prefill_ok => match head {
                    Ok(Ok(())) => {
                        prefill_ok = true;
                        waited_since = tokio::time::Instant::now();
                        decode_deadline = self
                            .first_byte_timeout
                            .map(|t| tokio::time::Instant::now() + t);
                    }
                    Ok(Err(error)) => break Waited::PrefillFailed(error),
                    Err(_) => break Waited::PrefillFailed(lost()),
                },
                () = tokio::time::sleep_until(due), if decode_deadline.is_some() => {
                    break Waited::DecodeSilent;
                }
                () = tokio::time::sleep_until(until.unwrap_or(due)), if until.is_some() => {
                    break Waited::RequestEnded;
                }
                reply = &mut decoding => break Waited::Decoded(Box::new(reply)),
            }
        };
        // Decode's request and its permit (a half-open breaker's one
        // probe) go first, uncounted: each blame below then counts. Its
        // decision is back.
        drop(decoding);
        let reply = match waited {
            Waited::Decoded(reply) => *reply,
            Waited::PrefillFailed(error) => {
                // Decode was sent the request beside prefill; without
                // prefill's KV it holds nothing of the prompt, and its
                // record does not keep it.
                decode_decision.undo_insert(self.text);
                return Err(failed(error));
            }
            Waited::RequestEnded => {
                let silent = if prefill_ok {
                    &decode_worker
                } else {
                    // As above: decode got no KV.
                    decode_decision.undo_insert(self.text);
                    &prefill_worker
                };
                return Err(self.sglang_timed_out(silent, waited_since));
            }
            Waited::DecodeSilent => {
                // Prefill answered and decode sent nothing in time:
                // decode's failure, as its own attempt would have counted
                // it. Prefill's permit goes first too (see below).
                task.cancel().await;
                let error = GatewayError::FirstByteTimeout {
                    worker: decode_worker.url().to_owned(),
                    after: self.first_byte_timeout.unwrap_or_default(),
                };
                let breaker = shared.breakers.get(decode_worker.id());
                no_first_byte(shared, &decode_worker, &breaker, &error, self.prompt);
                blame(shared, &decode_worker);
                return Err(Failed {
                    side: WorkerRole::Decode,
                    worker: decode_worker.id(),
                    error,
                    answer: None,
                });
            }
        };
        let mut answer = match reply.settle(decode_decision, decode_model) {
            Ok(answer) => answer,
            Err(failed) => {
                // The pair's loop may blame prefill for the transfer: its
                // permit (a half-open breaker's one probe) must be given
                // back first, or the blame finds the probe out and counts
                // nothing.
                task.cancel().await;
                return Err(failed);
            }
        };
        // The pair's answer is decode's; prefill's transfer is not what
        // decode's cached-token report measures. (Taken once decode has
        // answered: until then, a decode that sheds the request takes its
        // record's insert back.)
        drop(answer.decision.take_cache_feedback());
        // Decode answered; the client gets it once prefill has answered
        // too (in practice it already has: decode's first token needs
        // prefill's KV), so a prefill failure is reported as one. Not when
        // decode refused the request (a final 4xx): prefill would wait for
        // a decode that never joins the bootstrap room, until a timeout
        // that would then be reported as prefill's; it is cancelled as the
        // task is dropped.
        if !answer.response.status().is_success() {
            return Ok(Done {
                answer,
                prefill_task: None,
                prefill_worker: Some(prefill_worker.url().to_owned()),
            });
        }
        if !prefill_ok {
            match head_rx.await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(failed(error)),
                Err(_) => return Err(failed(lost())),
            }
        }
        let _ = decoded_tx.send(());
        Ok(Done {
            answer,
            prefill_task: task.0.take(),
            prefill_worker: Some(prefill_worker.url().to_owned()),
        })
    }

    /// SGLang's pair that the request timeout ended before decode's first
    /// byte, judged on `silent`, the side it waited on since `since`:
    /// prefill until it answered, decode after (see `sglang`). The other
    /// side is not counted. Counted at once, without waiting for prefill's
    /// task to end: the request ends now, and a wait would be cut short.
    /// So a breaker is counted on a permit of its own ([`blame`]); a
    /// half-open one with its probe out counts nothing.
    fn sglang_timed_out(
        &self,
        silent: &Arc<radixgate_routing::Worker>,
        since: tokio::time::Instant,
    ) -> Failed {
        let shared = &self.state.shared;
        let prefill = silent.role() == WorkerRole::Prefill;
        // SGLang's prefill answers at its prefill's end (`prefill_side`).
        let prompt = prefill || self.prompt;
        let breaker = shared.breakers.get(silent.id());
        if request_timed_out(shared, silent, &breaker, since, prompt) {
            blame(shared, silent);
        }
        Failed {
            side: if prefill {
                WorkerRole::Prefill
            } else {
                WorkerRole::Decode
            },
            worker: silent.id(),
            error: GatewayError::RequestTimeout {
                after: self.until.map(|(_, after)| after).unwrap_or_default(),
            },
            answer: None,
        }
    }

    /// vLLM: prefill first, then decode with prefill's transfer parameters.
    async fn vllm(
        &self,
        prefill: Admitted,
        mut decode: Admitted,
        bytes: &Bytes,
    ) -> Result<Done, Failed> {
        let (step_two, prefill_worker, probe) = match self.vllm_prefill(prefill, bytes).await {
            Ok(prefilled) => prefilled,
            Err(failed) => {
                // Decode was sent nothing: its record does not keep the
                // prompt (it did, and the next request for it, or this
                // one's retry, went to decode alone, predicted held).
                decode.0.decision.undo_insert(self.text);
                return Err(failed);
            }
        };
        // Prefill's success is the pair's (see `prefill_side`): a failed
        // decode leaves the verdict to the pair's loop.
        let mut answer = self.decode_answer(decode, step_two).await?;
        // As under SGLang (see `sglang`).
        drop(answer.decision.take_cache_feedback());
        record(&prefill_worker, probe, Outcome::Success);
        Ok(Done {
            answer,
            prefill_task: None,
            prefill_worker: Some(prefill_worker.url().to_owned()),
        })
    }

    /// vLLM's step one: prefill's answer read for its transfer
    /// parameters; returns decode's body, and the prefill worker with its
    /// breaker's permit (settled once decode has answered).
    async fn vllm_prefill(
        &self,
        prefill: Admitted,
        bytes: &Bytes,
    ) -> Result<(Bytes, Arc<radixgate_routing::Worker>, Permit), Failed> {
        let (
            Routed {
                decision: mut prefill_decision,
                ..
            },
            prefill_probe,
        ) = prefill;
        let prefill_worker = prefill_decision.worker().clone();
        let step_one = match prefill_body(bytes) {
            Ok(body) => body,
            Err(err) => return Err(Failed::prefill(prefill_worker.id(), err)),
        };
        let (mut answer, probe) = match self
            // One token: its answer comes at the prefill's end.
            .attempt(&mut prefill_decision, prefill_probe, step_one, true)
            .await
        {
            Ok(ok) => ok,
            Err(error) => return Err(Failed::prefill(prefill_worker.id(), error)),
        };
        let status = answer.response.status();
        answer.trace.answered(status.as_u16());
        let deadline = self.first_byte_timeout.map(|t| answer.sent + t);
        if served::refuses_model(&prefill_decision, self.model, &mut answer, deadline).await {
            let shared = &self.state.shared;
            let model = self.model.unwrap_or_default();
            let error = served::settle(
                shared,
                &mut prefill_decision,
                self.text,
                probe,
                model,
                answer,
            )
            .await;
            return Err(Failed::prefill(prefill_worker.id(), error));
        }
        if !status.is_success() {
            let retry_after = answer.response.headers().get(RETRY_AFTER).cloned();
            let (message, _) = error_message(answer.response, deadline).await;
            prefill_unanswered(
                &self.state.shared,
                &mut prefill_decision,
                self.text,
                probe,
                status,
            );
            return Err(Failed::prefill(
                prefill_worker.id(),
                GatewayError::UpstreamStatus {
                    worker: prefill_worker.url().to_owned(),
                    status,
                    message,
                    retry_after,
                },
            ));
        }
        prefill_decision.first_token(answer.sent.elapsed());
        let worker = || prefill_worker.url().to_owned();
        // An answer that did not come whole is told as what it was, not as
        // an engine without a KV connector (which it was told as before).
        let whole = match read_whole(answer.response, deadline).await {
            Ok(whole) => Ok(whole),
            Err(Unread::Broken(source)) => {
                let metrics = &self.state.shared.request_metrics;
                metrics.upstream_error(prefill_worker.url(), "stream_broken");
                Err(GatewayError::UpstreamClosed {
                    worker: worker(),
                    source,
                })
            }
            Err(Unread::Late) => Err(GatewayError::FirstByteTimeout {
                worker: worker(),
                after: self.first_byte_timeout.unwrap_or_default(),
            }),
            // Too long to hold parameters where they are looked for.
            Err(Unread::TooLong) => Err(GatewayError::NoTransferParams { worker: worker() }),
        };
        let params = whole.and_then(|whole| {
            let params = transfer_params(&whole)
                .ok_or_else(|| GatewayError::NoTransferParams { worker: worker() })?;
            Ok((whole, params))
        });
        let (whole, params) = match params {
            Ok(read) => read,
            Err(error) => {
                let shared = &self.state.shared;
                match error {
                    // Counted on the worker, as its other failures are: the
                    // pod that lost its KV connector is found by its URL.
                    GatewayError::NoTransferParams { .. } => shared
                        .request_metrics
                        .upstream_error(prefill_worker.url(), "no_transfer_params"),
                    // Its one-token answer stalled past the first-byte
                    // timeout: a hung prefill, as one that sent no head.
                    GatewayError::FirstByteTimeout { .. } => {
                        let breaker = shared.breakers.get(prefill_worker.id());
                        no_first_byte(shared, &prefill_worker, &breaker, &error, true);
                    }
                    _ => {}
                }
                record(&prefill_worker, probe, Outcome::Failure);
                return Err(Failed::prefill(prefill_worker.id(), error));
            }
        };
        apply_cached_report(&mut prefill_decision, self.text, &whole);
        // Prefill's work is done: its load goes now, not with the stream.
        drop(prefill_decision);
        match with_transfer_params(bytes, &params) {
            Ok(body) => Ok((body, prefill_worker, probe)),
            Err(err) => Err(Failed::prefill(prefill_worker.id(), err)),
        }
    }
}

/// A primed response and when it was sent.
struct Answer2 {
    response: axum::http::Response<crate::stream::Primed<hyper::body::Incoming>>,
    sent: tokio::time::Instant,
    trace: crate::trace::Attempt,
}

/// How SGLang's pair's wait for decode ended ([`Pair::sglang`]).
enum Waited {
    /// Decode replied.
    Decoded(Box<DecodeReply>),
    /// Prefill failed, or its task ended without a word, first.
    PrefillFailed(GatewayError),
    /// Prefill answered, and decode's first byte did not come in time.
    DecodeSilent,
    /// The request timeout ended it.
    RequestEnded,
}

/// Decode's reply, before its decision is given back to it
/// ([`Pair::decode_reply`]).
enum DecodeReply {
    /// The client's answer: a success, or a final status passed on.
    Answered(Answer2, Permit),
    /// A failure, with the worker's answer kept for the last attempt.
    Failed {
        worker: WorkerId,
        error: GatewayError,
        kept: Option<Answer2>,
    },
}

impl DecodeReply {
    /// The reply with its decision and model: the client's answer, or the
    /// pair's failure on decode's side.
    fn settle(self, decision: Decision, model: Option<String>) -> Result<Answer, Failed> {
        match self {
            Self::Answered(answer, probe) => Ok(Answer {
                response: answer.response,
                decision,
                model,
                probe: Some(probe),
                sent: answer.sent,
                trace: answer.trace,
            }),
            Self::Failed {
                worker,
                error,
                kept,
            } => Err(Failed {
                side: WorkerRole::Decode,
                worker,
                error,
                answer: kept.map(|answer| {
                    Box::new(Answer {
                        response: answer.response,
                        decision,
                        model,
                        probe: None,
                        sent: answer.sent,
                        trace: answer.trace,
                    })
                }),
            }),
        }
    }
}

/// Aborts the task it holds when dropped.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    /// Aborts the task and waits for it to end, so that what it held (its
    /// load guard, its breaker permit) has been dropped on return.
    async fn cancel(&mut self) {
        if let Some(task) = self.0.as_mut() {
            task.abort();
            let _ = task.await;
        }
        self.0 = None;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// What the SGLang prefill task needs, owned.
struct PrefillSide {
    shared: Arc<Shared>,
    forwarder: crate::upstream::Forwarder,
    cut_off: tokio_util::sync::CancellationToken,
    api: Api,
    path: String,
    headers: HeaderMap,
    peer: Option<IpAddr>,
    timeout: Option<Duration>,
    hang: Option<Duration>,
    text: String,
    model: Option<String>,
    retry: usize,
}

/// The SGLang prefill side: sends, reports its head (or failure) on `head`,
/// then reads prefill's answer to its end, its load and breaker permit
/// held until then, and corrects the prefill pool's record from its
/// cached-token report. Its breaker counts a success only once `decoded`
/// says decode answered too: a prefill worker whose transfers never reach
/// decode answers its own part well (the pair's loop blames it).
async fn prefill_side(
    side: PrefillSide,
    mut decision: Decision,
    probe: Permit,
    body: Bytes,
    head: tokio::sync::oneshot::Sender<Result<(), GatewayError>>,
    decoded: tokio::sync::oneshot::Receiver<()>,
) {
    let state = AppState {
        shared: side.shared.clone(),
        forwarder: side.forwarder,
        cut_off: side.cut_off,
    };
    let pair = Pair {
        state: &state,
        api: side.api,
        path: &side.path,
        client_headers: &side.headers,
        peer: side.peer,
        first_byte_timeout: side.timeout,
        hang: side.hang,
        // The request timeout's end is judged by the pair (`sglang`).
        until: None,
        // SGLang's prefill worker answers at its prefill's end, whether or
        // not the client streams: its first byte is due soon after it.
        prompt: true,
        text: &side.text,
        model: side.model.as_deref(),
        retry: side.retry,
    };
    let worker = decision.worker().clone();
    let (mut answer, probe) = match pair.attempt(&mut decision, probe, body, pair.prompt).await {
        Ok(ok) => ok,
        Err(error) => {
            let _ = head.send(Err(error));
            return;
        }
    };
    let status = answer.response.status();
    answer.trace.answered(status.as_u16());
    if !status.is_success() {
        let deadline = side.timeout.map(|t| answer.sent + t);
        if served::refuses_model(&decision, pair.model, &mut answer, deadline).await {
            let model = pair.model.unwrap_or_default();
            let error = served::settle(
                &side.shared,
                &mut decision,
                &side.text,
                probe,
                model,
                answer,
            )
            .await;
            let _ = head.send(Err(error));
            return;
        }
        let retry_after = answer.response.headers().get(RETRY_AFTER).cloned();
        let (message, _) = error_message(answer.response, deadline).await;
        prefill_unanswered(&side.shared, &mut decision, &side.text, probe, status);
        let _ = head.send(Err(GatewayError::UpstreamStatus {
            worker: worker.url().to_owned(),
            status,
            message,
            retry_after,
        }));
        return;
    }
    decision.first_token(answer.sent.elapsed());
    let _ = head.send(Ok(()));
    let read = async {
        let mut tail = UsageTail::new();
        let mut body = std::pin::pin!(answer.response.into_body());
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        tail.push(data);
                    }
                }
                Err(_) => return None,
            }
        }
        Some(tail)
    };
    match tokio::time::timeout(PREFILL_TAIL, read).await {
        Ok(Some(mut tail)) => {
            match decoded.await {
                Ok(()) => record(&worker, probe, Outcome::Success),
                Err(_) => drop(probe),
            }
            if let Some(feedback) = decision.take_cache_feedback() {
                super::Correction { feedback }.finish(&side.text, tail.cached());
            }
        }
        Ok(None) => {
            side.shared
                .request_metrics
                .upstream_error(worker.url(), "stream_broken");
            record(&worker, probe, Outcome::Failure);
        }
        Err(_) => drop(probe),
    }
}

/// Why a whole answer was not read.
enum Unread {
    /// The connection broke, or the body's framing did, part-way.
    Broken(Box<dyn std::error::Error + Send + Sync>),
    /// Over [`PREFILL_ANSWER_LIMIT`] bytes.
    TooLong,
    /// Not all of it by the deadline.
    Late,
}

/// Reads a whole answer (at most [`PREFILL_ANSWER_LIMIT`] bytes) before
/// `deadline`.
async fn read_whole(
    response: axum::http::Response<crate::stream::Primed<hyper::body::Incoming>>,
    deadline: Option<tokio::time::Instant>,
) -> Result<Bytes, Unread> {
    let body = http_body_util::Limited::new(response.into_body(), PREFILL_ANSWER_LIMIT);
    let read = async {
        match body.collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(err) if err.is::<http_body_util::LengthLimitError>() => Err(Unread::TooLong),
            Err(err) => Err(Unread::Broken(err)),
        }
    };
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, read)
            .await
            .unwrap_or(Err(Unread::Late)),
        None => read.await,
    }
}

/// Hands a vLLM prefill answer's cached-token report to the prefill
/// pool's correction.
fn apply_cached_report(decision: &mut Decision, text: &str, body: &[u8]) {
    let mut tail = UsageTail::new();
    tail.push(body);
    let cached = tail.cached();
    if matches!(cached, CachedReport::Absent) {
        return;
    }
    if let Some(feedback) = decision.take_cache_feedback() {
        super::Correction { feedback }.finish(text, cached);
    }
}

/// The prefill worker's host as `bootstrap_host`: the host of its URL, an
/// IPv6 address in brackets (`[fd00::5]`). The decode engine joins it to
/// the port as `host:port` for its bootstrap connection, which needs them;
/// SGLang's own load balancer sends them so, and SGLang adds them only
/// where they are missing. Sent bare until 2026-12-06.
fn bootstrap_host(prefill_url: &str) -> String {
    WorkerUrl::parse(prefill_url)
        .map(|url| crate::config::bracketed(url.host()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::bootstrap_host;

    #[test]
    fn an_ipv6_prefill_host_is_sent_in_brackets() {
        assert_eq!(bootstrap_host("http://[fd00::5]:30000"), "[fd00::5]");
        assert_eq!(bootstrap_host("http://10.0.0.5:30000"), "10.0.0.5");
        assert_eq!(
            bootstrap_host("http://prefill-0.ns.svc:30000/"),
            "prefill-0.ns.svc"
        );
    }
}
