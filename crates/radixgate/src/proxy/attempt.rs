//! One attempt at a worker, up to its first byte: the client's bytes
//! sent ([`send`]), the response head and first body frame waited for
//! ([`first_byte`], [`prime`]) while the worker is watched for being lost
//! or hung, and what an attempt that failed leaves behind (its count, the
//! breaker's record, the worker's own error message). Shared by the
//! co-located attempt loop (`proxy.rs`) and the disaggregated one
//! (`proxy/pd.rs`); nothing here retries.

use super::Endpoint;
use crate::breaker::publish_breaker;
use crate::breaker::{Outcome, Permit};
use crate::error::GatewayError;
use crate::state::{AppState, Shared};
use crate::stream::Primed;
use crate::upstream;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use radixgate_routing::{Decision, RoutingError, WorkerId};
use std::net::IpAddr;

/// Most bytes of a worker's error body read for its message.
const ERROR_BODY_LIMIT: usize = 4096;

/// The longest a 404's body is waited for before it is passed on as it
/// is, or let go of for a retry ([`does_not_serve`]).
pub(super) const ERROR_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// An attempt that got no first byte (refused, hung, or its worker lost
/// meanwhile): counted by kind. A timeout whose first byte was `prompt`
/// (due soon after the prefill: a stream's first event, or an answer that
/// generates nothing; `Endpoint::first_byte_is_prompt`) says the worker
/// hangs, and also teaches outlier detection and the breaker's hang record
/// ([`first_byte`] gives up on the attempts waiting there). A whole
/// generated answer's first byte waits for its whole decode, which the
/// request's length decides: its timeout says the request is long, and
/// the other whole answers the worker is generating meanwhile, as long
/// as theirs, are not hung for it.
pub(super) fn no_first_byte(
    shared: &Shared,
    worker: &radixgate_routing::Worker,
    breaker: &crate::breaker::Breaker,
    err: &GatewayError,
    prompt: bool,
) {
    if let GatewayError::FirstByteTimeout { after, .. } = err
        && prompt
    {
        // A hung worker's latency is at least the timeout.
        shared.outliers.sample(worker.id(), *after);
        breaker.note_hang(tokio::time::Instant::now());
    }
    shared
        .request_metrics
        .upstream_error(worker.url(), no_first_byte_kind(err));
}

/// An attempt the request timeout ended before its first byte, `sent` at
/// `worker`: the worker's timeout, counted and taught as [`no_first_byte`]
/// teaches a first-byte timeout, when that first byte was `prompt` and the
/// worker gave no other attempt a first byte since this one was sent. A
/// request timeout no longer than the streams' first-byte timeout (or one
/// that the queue's wait used up) ends every attempt at a hung worker
/// before its own timeout can: without this, such a worker, its `/health`
/// fine, was never counted and stayed in rotation for good. A worker that
/// answered others meanwhile is busy, not hung, and a whole generated
/// answer's request is long: the request's time ran out, nobody's
/// failure. Says whether it was the worker's.
pub(super) fn request_timed_out(
    shared: &Shared,
    worker: &radixgate_routing::Worker,
    breaker: &crate::breaker::Breaker,
    sent: tokio::time::Instant,
    prompt: bool,
) -> bool {
    let hung = prompt && !breaker.answered_since(sent);
    if hung {
        let timeout = GatewayError::FirstByteTimeout {
            worker: worker.url().to_owned(),
            after: sent.elapsed(),
        };
        no_first_byte(shared, worker, breaker, &timeout, prompt);
    }
    hung
}

/// A failed attempt at `worker`, `sent` then, before its first byte:
/// counted as [`no_first_byte`] counts it, or, when the request timeout
/// ended it, only if the worker hangs ([`request_timed_out`]). Says
/// whether the failure is the worker's.
pub(super) fn failed_before_first_byte(
    shared: &Shared,
    worker: &radixgate_routing::Worker,
    breaker: &crate::breaker::Breaker,
    err: &GatewayError,
    sent: tokio::time::Instant,
    prompt: bool,
) -> bool {
    match err {
        GatewayError::RequestTimeout { .. } => {
            request_timed_out(shared, worker, breaker, sent, prompt)
        }
        _ => {
            no_first_byte(shared, worker, breaker, err, prompt);
            true
        }
    }
}

/// The `kind` an attempt with no first byte is counted under in
/// `radixgate_upstream_errors_total`.
pub(crate) fn no_first_byte_kind(err: &GatewayError) -> &'static str {
    match err {
        GatewayError::FirstByteTimeout { .. } => "timeout",
        // Moved off a worker ejected as an outlier: not its failure (it
        // was counted `worker_lost`, as if the worker had gone).
        GatewayError::WorkerLost { moved: true, .. } => "moved",
        GatewayError::WorkerLost { .. } => "worker_lost",
        GatewayError::UpstreamClosed { .. } => "closed",
        GatewayError::UpstreamInvalid { .. } => "invalid",
        _ => "connect",
    }
}

/// Whether a response is an event stream (by the worker's content type;
/// media types are matched in any case, RFC 9110 8.3.1).
pub(crate) fn is_event_stream(headers: &HeaderMap) -> bool {
    const SSE: &[u8] = b"text/event-stream";
    headers.get(header::CONTENT_TYPE).is_some_and(|v| {
        v.as_bytes()
            .get(..SSE.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(SSE))
    })
}

/// Whether a response's body is encoded (`content-encoding` other than
/// `identity`): its bytes are not the text they carry, so nothing may be
/// appended to them or taken out of them. The router asks for no encoding;
/// a worker or a proxy in front of it may send one anyway.
pub(crate) fn is_encoded(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .any(|coding| {
            let coding = coding.trim_ascii();
            !coding.is_empty() && !coding.eq_ignore_ascii_case(b"identity")
        })
}

/// How often an attempt still waiting for its first byte looks whether its
/// worker has been marked unavailable meanwhile.
const WORKER_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// An attempt waiting for its first byte, and what it waits on.
pub(super) struct Waiting<'a> {
    pub(super) worker: &'a radixgate_routing::Worker,
    pub(super) breaker: &'a crate::breaker::Breaker,
    pub(super) sent: tokio::time::Instant,
    /// This attempt's first-byte timeout.
    pub(super) timeout: Option<std::time::Duration>,
    /// The streams' first-byte timeout: waited that long on a worker that
    /// has meanwhile let another attempt pass it, this one is hung too.
    pub(super) hang: Option<std::time::Duration>,
    /// The request's own deadline and its timeout, if it has one: the
    /// attempt ends there with [`GatewayError::RequestTimeout`], for its
    /// loop to judge ([`request_timed_out`]) before the request ends.
    pub(super) until: Option<(tokio::time::Instant, std::time::Duration)>,
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
/// answer by default). An attempt moved off a worker that is only ejected
/// (slow) is marked so ([`moved_off`]): not that worker's failure. An
/// attempt that gets its first byte within a second costs one timer, as a
/// plain timeout would. A first byte is noted on the worker's breaker
/// ([`Breaker::note_answer`](crate::breaker::Breaker::note_answer)).
pub(super) async fn first_byte<T>(
    attempt: impl std::future::Future<Output = Result<T, GatewayError>>,
    waiting: Waiting<'_>,
) -> Result<T, GatewayError> {
    let Waiting {
        worker,
        breaker,
        sent,
        timeout,
        hang,
        until,
    } = waiting;
    let deadline = timeout.map(|t| sent + t);
    tokio::pin!(attempt);
    loop {
        let check = tokio::time::Instant::now() + WORKER_CHECK;
        let wake = [deadline, until.map(|(at, _)| at)]
            .into_iter()
            .flatten()
            .fold(check, tokio::time::Instant::min);
        if let Ok(done) = tokio::time::timeout_at(wake, &mut attempt).await {
            if done.is_ok() {
                breaker.note_answer(tokio::time::Instant::now());
            }
            return done;
        }
        let now = tokio::time::Instant::now();
        if deadline.is_some_and(|d| d <= now) {
            return Err(GatewayError::FirstByteTimeout {
                worker: worker.url().to_owned(),
                after: timeout.unwrap_or_default(),
            });
        }
        // The request's timeout ends the request no earlier (its timer
        // was set after the request's start): the attempt ends first, so
        // that its loop sees whom it waited on.
        if let Some((at, after)) = until
            && at <= now
        {
            return Err(GatewayError::RequestTimeout { after });
        }
        let hung = hang.is_some_and(|h| sent.elapsed() >= h) && breaker.hung_since(sent);
        if hung || !worker.is_available() {
            // Only ejected (slow, not failing): the attempt moves to a
            // quicker worker, but this one failed nothing. Counted as its
            // failures, the attempts an ejection moved opened its breaker.
            let moved = !hung
                && worker.is_ejected()
                && worker.is_healthy()
                && worker.breaker() != radixgate_routing::BreakerState::Open;
            return Err(GatewayError::WorkerLost {
                worker: worker.url().to_owned(),
                after: sent.elapsed(),
                moved,
            });
        }
    }
}

/// Reads a 2xx response's first body frame (the first token of a stream),
/// so that a worker that sends its head and then hangs is caught before
/// anything reaches the client. A stream that opens before its first
/// token (a Responses or Messages preamble, SSE comments: `endpoint`'s
/// [`Preamble`](crate::preamble::Preamble)) is read on to the frame in
/// which its first token begins, up to [`OPENING_LIMIT`] bytes: a worker
/// that sends its preamble and then hangs (an engine stuck behind a live
/// API server) is hung all the same. Other statuses are returned as they
/// are. A body that breaks before then is a failed attempt.
pub(super) async fn prime(
    response: axum::http::Response<Incoming>,
    worker: &str,
    endpoint: Endpoint,
) -> Result<axum::http::Response<Primed<Incoming>>, GatewayError> {
    let (parts, mut body) = response.into_parts();
    let mut read = Vec::new();
    if parts.status.is_success() {
        read.extend(next_frame(&mut body, worker).await?);
        // An encoded stream's bytes are not its events: not read on.
        let plain_sse = is_event_stream(&parts.headers) && !is_encoded(&parts.headers);
        let first = read.first().and_then(|f| f.data_ref()).map(|d| &d[..]);
        if let Some(scan) = plain_sse.then(|| endpoint.preamble(first)).flatten() {
            read_opening(&mut body, &mut read, scan, worker).await?;
        }
    }
    Ok(axum::http::Response::from_parts(
        parts,
        Primed::new(read, body),
    ))
}

/// The most bytes of a stream's opening read ahead for its first token:
/// far above a preamble (a few hundred bytes). A longer opening is handed
/// on as it is, and the response body's watch finds the first token.
const OPENING_LIMIT: usize = 64 * 1024;

/// Reads `body` on, after the frames in `read`, until `scan` finds the
/// first token, the body ends or sends other than data, or
/// [`OPENING_LIMIT`] bytes are read.
async fn read_opening(
    body: &mut Incoming,
    read: &mut Vec<http_body::Frame<Bytes>>,
    mut scan: crate::preamble::Preamble,
    worker: &str,
) -> Result<(), GatewayError> {
    let mut held = 0;
    for data in read.iter().filter_map(|f| f.data_ref()) {
        held += data.len();
        if scan.feed(data) {
            return Ok(());
        }
    }
    while held < OPENING_LIMIT {
        let Some(frame) = next_frame(body, worker).await? else {
            return Ok(());
        };
        let found = frame.data_ref().map(|data| {
            held += data.len();
            scan.feed(data)
        });
        read.push(frame);
        if found != Some(false) {
            return Ok(());
        }
    }
    Ok(())
}

/// The body's next frame; a body that breaks is the worker's connection
/// closed.
async fn next_frame(
    body: &mut Incoming,
    worker: &str,
) -> Result<Option<http_body::Frame<Bytes>>, GatewayError> {
    body.frame()
        .await
        .transpose()
        .map_err(|err| GatewayError::UpstreamClosed {
            worker: worker.to_owned(),
            source: Box::new(err),
        })
}

/// The worker's own reason for an error answer: `error.message`,
/// `message` or `detail` of a JSON body, else its text, from at most
/// [`ERROR_BODY_LIMIT`] bytes read before `deadline`. Also returns the
/// bytes read.
pub(super) async fn error_message(
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

/// Whether a worker's 404 `response` for a request naming `model` says
/// that the worker does not serve that model (vLLM's "The model `m` does
/// not exist."): a LoRA adapter unloaded, or another model started at the
/// URL, since its models were last read. Its body's first
/// [`ERROR_BODY_LIMIT`] bytes are read ahead (before `deadline`, and
/// within [`ERROR_BODY_WAIT`]) and kept in front, so that a 404 about
/// something else goes on as it came.
pub(super) async fn does_not_serve(
    response: &mut axum::http::Response<Primed<Incoming>>,
    model: &str,
    deadline: Option<tokio::time::Instant>,
) -> bool {
    if is_encoded(response.headers()) {
        return false;
    }
    let read = response.body_mut().read_ahead(ERROR_BODY_LIMIT);
    // An error body comes with its head: a stalled one is not waited for
    // long (the attempt's own deadline can be minutes).
    let soon = tokio::time::Instant::now() + ERROR_BODY_WAIT;
    let deadline = deadline.map_or(soon, |d| d.min(soon));
    let _ = tokio::time::timeout_at(deadline, read).await;
    worker_message(&response.body().held()).is_some_and(|m| names(&m, model))
}

/// Whether `message` names `model` as a word of its own: not inside a
/// longer name (`m` is not named by "Not Found", nor `llama` by
/// "llama-2").
fn names(message: &str, model: &str) -> bool {
    let in_name = |c: char| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':');
    !model.is_empty()
        && message.match_indices(model).any(|(at, _)| {
            let before = message[..at].chars().next_back();
            let mut after = message[at + model.len()..].chars();
            // A full stop or a colon ends the sentence, not the name.
            let continues = match after.next() {
                Some('.' | ':') => after.next().is_some_and(in_name),
                Some(c) => in_name(c),
                None => false,
            };
            !before.is_some_and(in_name) && !continues
        })
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

/// Whether a worker's answer `status` says it is busy rather than failing:
/// 429, with which an engine (or a proxy or router in front of it) sheds
/// requests beyond its limit. The attempt is retried elsewhere, but its
/// breaker permit is let go, counting neither way: counted as failures,
/// the 429s of a burst beyond the pool's capacity opened every worker's
/// breaker within moments, and the pool, idle again, answered 503 until
/// the breakers' timeout and their probes.
pub(super) fn busy(status: axum::http::StatusCode) -> bool {
    status == axum::http::StatusCode::TOO_MANY_REQUESTS
}

/// Whether a worker's answer `status` sheds the request (429: busy; 503:
/// full or going away): the worker never read the prompt, so the router's
/// record of its cache does not keep it (a worker that shed a prompt was
/// sent its next request as a cache hit that was not there). Co-located
/// workers and either side of a prefill/decode pair alike.
pub(super) fn shed(status: axum::http::StatusCode) -> bool {
    busy(status) || status == axum::http::StatusCode::SERVICE_UNAVAILABLE
}

/// Takes a worker's error answer `status` with its `Retry-After`: a 429
/// or 503 naming a wait pauses the worker ([`crate::retry::Paused`]), and
/// the pause's start is logged.
pub(super) fn asked_for_pause(
    shared: &Shared,
    worker: &radixgate_routing::Worker,
    status: axum::http::StatusCode,
    retry_after: Option<&axum::http::HeaderValue>,
) {
    let max = std::time::Duration::from_secs(shared.config.retry.max_retry_after_secs);
    let now = tokio::time::Instant::now();
    if let Some(pause) = shared
        .paused
        .answered(worker.id(), status, retry_after, max, now)
    {
        tracing::info!(
            worker = worker.url(),
            %status,
            secs = pause.as_secs_f64(),
            "worker asked for a pause (Retry-After): passed over meanwhile while others can take its requests"
        );
    }
}

/// Chooses a worker with `select`, which leaves out the workers it is
/// given: `tried`, and while another worker can take the request, the
/// workers pausing ([`crate::retry::Paused`]).
pub(super) fn choose<T>(
    shared: &Shared,
    tried: &[WorkerId],
    select: impl Fn(&[WorkerId]) -> Result<T, RoutingError>,
) -> Result<T, RoutingError> {
    if let Some(avoid) = shared.paused.avoid(tried, tokio::time::Instant::now()) {
        match select(&avoid) {
            Err(RoutingError::NoHealthyWorker { .. }) => {}
            chosen => return chosen,
        }
    }
    select(tried)
}

/// Whether `error` is an attempt the router moved off a worker that failed
/// nothing (ejected as an outlier while the attempt waited): its breaker
/// permit is let go, counting neither way.
pub(super) fn moved_off(error: &GatewayError) -> bool {
    matches!(error, GatewayError::WorkerLost { moved: true, .. })
}

/// Records an attempt's outcome and publishes any breaker change at once,
/// so policies stop (or resume) choosing the worker without waiting for
/// the upkeep tick.
pub(super) fn record(worker: &radixgate_routing::Worker, probe: Permit, outcome: Outcome) {
    if let Some(state) = probe.record(outcome, tokio::time::Instant::now()) {
        tracing::info!(
            worker = worker.url(),
            state = state.as_str(),
            "circuit breaker changed"
        );
        publish_breaker(worker, state);
    }
}

/// `POST`, the method of every request but a stored response's.
pub(super) static POST: axum::http::Method = axum::http::Method::POST;

/// Where an attempt's request goes and what it carries of the client's.
#[derive(Clone, Copy)]
pub(super) struct Outgoing<'a> {
    /// The endpoint: whether a stream opens before its first token.
    pub(super) endpoint: Endpoint,
    /// The worker path.
    pub(super) path: &'a str,
    /// The method: the client's (`POST` but for a stored response's).
    pub(super) method: &'a axum::http::Method,
    pub(super) client_headers: &'a HeaderMap,
    pub(super) peer: Option<IpAddr>,
}

/// One attempt up to its first byte: `body` to the decision's worker, then
/// its head and first frames ([`prime`]), waited for as [`first_byte`] says.
pub(super) async fn send_primed(
    state: &AppState,
    decision: &Decision,
    out: Outgoing<'_>,
    body: Bytes,
    traced: &crate::trace::Attempt,
    waiting: Waiting<'_>,
) -> Result<axum::http::Response<Primed<Incoming>>, GatewayError> {
    let attempt = async {
        let response = send(state, decision, out, body, traced).await?;
        prime(response, decision.worker().url(), out.endpoint).await
    };
    first_byte(attempt, waiting).await
}

/// One attempt: the client's bytes to the chosen worker.
async fn send(
    state: &AppState,
    decision: &Decision,
    out: Outgoing<'_>,
    body: Bytes,
    traced: &crate::trace::Attempt,
) -> Result<axum::http::Response<Incoming>, GatewayError> {
    let Outgoing {
        method,
        path,
        client_headers,
        peer,
        ..
    } = out;
    let worker = decision.worker();
    let headers = || {
        let gateway_has_key = !state.shared.tenants.load().is_open();
        let mut headers = upstream::request_headers(
            client_headers,
            worker.api_key().as_deref(),
            gateway_has_key,
            peer,
        );
        // After any the client sent: a request that comes back is refused
        // (`crate::via`).
        headers.append(header::VIA, state.shared.via.value().clone());
        traced.inject(&mut headers);
        headers
    };
    let forwarder = &state.forwarder;
    let sent = forwarder
        .send_with(method.clone(), worker.url(), path, headers(), body.clone())
        .await;
    // The worker closed a pooled connection as the request went out on
    // it (its idle timeout): sent again on a new one, the worker's first
    // sight of it. Only if that one is refused too is the first break the
    // answer: the worker went away with the request (and a request that
    // breaks workers is not to be sent to another one as if merely
    // refused).
    let sent = match sent {
        Err(upstream::ForwardError::Stale(stale)) => {
            tracing::debug!(
                worker = worker.url(),
                error = stale,
                "pooled connection closed under the request; sent again on a new one"
            );
            // Boxed: a rare path, whose future would otherwise enlarge
            // (and be copied with) every attempt's.
            let again = forwarder.send_with_on_new_connection(
                method.clone(),
                worker.url(),
                path,
                headers(),
                body,
            );
            match Box::pin(again).await {
                Err(upstream::ForwardError::Transport(_)) => {
                    Err(upstream::ForwardError::Closed(stale))
                }
                other => other,
            }
        }
        other => other,
    };
    let response = sent.map_err(|err| match err {
        upstream::ForwardError::Invalid(why) => GatewayError::UpstreamInvalid {
            worker: worker.url().to_owned(),
            why,
        },
        upstream::ForwardError::Closed(_) | upstream::ForwardError::Stale(_) => {
            GatewayError::UpstreamClosed {
                worker: worker.url().to_owned(),
                source: Box::new(err),
            }
        }
        _ => GatewayError::Connect {
            worker: worker.url().to_owned(),
            source: Box::new(err),
        },
    })?;
    // The one informational status hyper hands back (it skips the others
    // before the final answer): a switch to another protocol, which no
    // request here asks for. Passed on, the client got a 101 with no body
    // for its POST, and the breaker counted it a success.
    if response.status().is_informational() {
        return Err(GatewayError::UpstreamInvalid {
            worker: worker.url().to_owned(),
            why: format!(
                "{} to a request that asked for no protocol switch",
                response.status()
            ),
        });
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn a_message_names_a_model_as_a_word_of_its_own() {
        assert!(names("The model `sql-lora` does not exist.", "sql-lora"));
        assert!(names("model sql-lora does not exist", "sql-lora"));
        assert!(names("unknown model: org/llama-3.1", "org/llama-3.1"));
        assert!(names("no such model org/llama-3.1.", "org/llama-3.1"));
        assert!(names("'m' not found", "m"));
        // Inside longer names, or none at all.
        assert!(!names("Not Found", "N"));
        assert!(!names("The model `llama-2` does not exist.", "llama"));
        assert!(!names("The model `my-llama` does not exist.", "llama"));
        assert!(!names("The model `llama.3` does not exist.", "llama"));
        assert!(!names("Response with id 'resp_1' not found.", "sql-lora"));
        assert!(!names("anything", ""));
    }
}
