//! The generation handlers: `/generate`, `/v1/completions`,
//! `/v1/chat/completions`, `/v1/responses`, `/v1/messages`.
//!
//! Flow: read the body (bounded), parse, apply the fault knobs (hang,
//! latency, error draw), tokenize, build the deterministic reply, then
//! either answer at once (`--instant`) or submit to the engine task and
//! answer when it says so — whole, or as SSE events as tokens appear.
//!
//! A client that goes away cancels its request in the engine: non-streamed
//! requests hold a guard that sends `Cancel` on drop; streamed ones run in a
//! small task that cancels when the response body is dropped.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::driver::{Cmd, Event};
use super::faults::FaultConfig;
use super::pd::{self, Part};
use super::request::{Api, GenRequest, Prompt, parse};
use super::response::{DONE_EVENT, Reply};
use super::stored::Storing;
use super::{WorkerState, error_response, read_body};
use crate::engine::{EngineRequest, ReqId};
use crate::error::SimError;
use crate::tokens::{reply_text, text_hash};

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    handle(s, Api::Chat, body).await
}

/// `POST /v1/completions`.
pub(crate) async fn completions(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    handle(s, Api::Completions, body).await
}

/// `POST /generate`.
pub(crate) async fn generate(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    handle(s, Api::Generate, body).await
}

/// `POST /v1/responses`.
pub(crate) async fn responses(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    handle(s, Api::Responses, body).await
}

/// `POST /v1/messages`.
pub(crate) async fn messages(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    handle(s, Api::Messages, body).await
}

async fn handle(s: Arc<WorkerState>, api: Api, body: Body) -> Response {
    s.metrics.requests.fetch_add(1, Ordering::Relaxed);
    match serve(&s, api, body).await {
        Ok(r) => r,
        Err(e) => {
            s.metrics.count_error(&e);
            error_response(&e)
        }
    }
}

async fn serve(s: &Arc<WorkerState>, api: Api, body: Body) -> Result<Response, SimError> {
    let bytes = read_body(body, s.config.max_body_bytes).await?;
    let parsed = parse(api, &bytes, s.config.default_max_tokens)?;
    s.check_model(&bytes)?;
    // The Responses API: a `previous_response_id` must be one this worker
    // stored; the answer is stored unless `store: false`, and a
    // `background` one is answered at once.
    let storing = match api {
        Api::Responses => s.stored.check(&bytes)?,
        _ => Storing::default(),
    };
    let parts = pd::plan(&s.config.pd, api, &bytes, parsed.items.len())?;
    let faults = s.request_faults().await?;
    let items = parsed.items.into_iter().zip(parts);
    if !parsed.batch {
        let mut items = items;
        let Some((req, part)) = items.next() else {
            return Err(SimError::bad_request("no prompt", None));
        };
        return Ok(
            match serve_one(s, api, req, part, &faults, None, storing).await? {
                Answer::Whole(v) => json_response(&v),
                Answer::Stream(b) => sse_response(b),
            },
        );
    }
    // A /generate batch: the items run side by side; the answer is their
    // list, or their events interleaved (each with its `index`) and one
    // `[DONE]`.
    let answers = futures::future::join_all(items.enumerate().map(|(i, (req, part))| {
        serve_one(s, api, req, part, &faults, Some(i), Storing::default())
    }))
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    let mut whole = Vec::new();
    let mut streams = Vec::new();
    for a in answers {
        match a {
            Answer::Whole(v) => whole.push(v),
            Answer::Stream(b) => streams.push(b.into_data_stream()),
        }
    }
    if streams.is_empty() {
        return Ok(json_response(&serde_json::Value::Array(whole)));
    }
    use futures::StreamExt;
    let merged = futures::stream::select_all(streams)
        .map(|c| c.map_err(std::io::Error::other))
        .chain(futures::stream::once(async {
            Ok(Bytes::from_static(DONE_EVENT))
        }));
    Ok(sse_response(Body::from_stream(merged)))
}

/// One request's answer, before it becomes a response (a batch combines
/// several).
enum Answer {
    /// A whole JSON body.
    Whole(serde_json::Value),
    /// An SSE body.
    Stream(Body),
}

/// Serves one request (or one item of a `/generate` batch, `index`), in
/// the part `part` its PD fields give it; a Responses answer is stored
/// when `storing` says (as it will end: the reply is known in advance),
/// and a background one is answered at once, `queued`.
async fn serve_one(
    s: &Arc<WorkerState>,
    api: Api,
    req: GenRequest,
    part: Part,
    faults: &FaultConfig,
    index: Option<usize>,
    storing: Storing,
) -> Result<Answer, SimError> {
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    // `--instant` only counts tokens (no hashing): minimal work per request.
    let (prompt_text, prompt_tokens, prompt_len) = match (&req.prompt, s.config.instant) {
        (Prompt::Text(t), true) => (t.as_str(), Vec::new(), s.tokens.count(t)),
        (Prompt::Ids(ids), true) => ("", Vec::new(), ids.len()),
        (Prompt::Text(t), false) => {
            let tokens = s.tokens.tokenize(t);
            let n = tokens.len();
            (t.as_str(), tokens, n)
        }
        (Prompt::Ids(ids), false) => ("", s.tokens.prompt_ids(ids), ids.len()),
    };
    let seed = match &req.prompt {
        Prompt::Text(t) => text_hash(t),
        Prompt::Ids(ids) => ids.iter().fold(0x51_7cc1_b727_220a, |h, &x| {
            (h ^ x).wrapping_mul(0x100_0000_01b3)
        }),
    };
    // A prefill worker generates at most one token (the router drops it).
    let max_tokens = match part {
        Part::PrefillRoom(_) | Part::PrefillVllm => req.max_tokens.min(1),
        Part::Regular | Part::Decode(_) => req.max_tokens,
    };
    let text = reply_text(seed, max_tokens, &s.tokenizer);
    let mut reply = Reply {
        api,
        id: request_id(api, &s.name, id),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: s.model.clone(),
        worker: s.name.clone(),
        chars_per_token: s.tokenizer.chars_per_token(),
        prompt_tokens: prompt_len,
        cached_tokens: 0,
        completion_tokens: max_tokens,
        text,
        index: index.unwrap_or(0),
        done_event: index.is_none(),
        kv_transfer_params: None,
    };
    if storing.store {
        s.stored.keep(reply.response_object(true));
    }
    if storing.background {
        let mut queued = reply.response_object(false);
        queued["status"] = "queued".into();
        queued["background"] = true.into();
        return Ok(Answer::Whole(queued));
    }
    let (room, source) = match part {
        Part::Regular => (None, None),
        Part::PrefillRoom(key) => (Some(pd::Rooms::begin(s, key)?), None),
        Part::PrefillVllm => {
            let room = pd::Rooms::begin(s, reply.id.clone())?;
            reply.kv_transfer_params = Some(vllm_params(s, room.key(), prompt_len));
            (Some(room), None)
        }
        Part::Decode(src) => (None, Some(src)),
    };
    if s.config.instant {
        if let Some(src) = &source {
            pd::transfer(s, src).await?;
            reply.cached_tokens = prompt_len;
        }
        if let Some(room) = room {
            room.ready(prompt_len);
        }
        s.metrics.record_instant(&reply);
        return Ok(if req.stream {
            let mut events: Vec<Bytes> = reply.preamble().into_iter().collect();
            events.extend(reply.opening(req.include_usage));
            events.extend(token_events(
                &reply,
                0,
                reply.completion_tokens,
                req.include_usage,
            ));
            events.extend(reply.closing(req.include_usage));
            Answer::Stream(stream_of(events, faults.die_after_chunks))
        } else {
            Answer::Whole(reply.full())
        });
    }
    let final_tokens = match &req.prompt {
        Prompt::Text(_) => s.tokens.tokenize(&format!("{prompt_text}{}", reply.text)),
        Prompt::Ids(_) => {
            let mut t = prompt_tokens.clone();
            t.extend(s.tokens.tokenize(&reply.text));
            t
        }
    };
    let engine_req = EngineRequest {
        id,
        prompt: prompt_tokens,
        final_tokens,
        max_new_tokens: max_tokens,
    };
    if req.stream {
        let start = match source {
            // The stream starts at once (as the engines' do); the transfer
            // runs inside it, and a failed one is an SSE error event.
            Some(src) => Start::Transfer(src, engine_req),
            None => Start::Submitted(submit(s, engine_req, true, false)?),
        };
        return Ok(Answer::Stream(stream_reply(
            s.clone(),
            id,
            reply,
            req,
            start,
            room,
            faults.die_after_chunks,
        )));
    }
    let transferred = source.is_some();
    if let Some(src) = &source {
        pd::transfer(s, src).await?;
    }
    let mut rx = submit(s, engine_req, false, transferred)?;
    let mut guard = CancelOnDrop {
        s: s.clone(),
        id,
        armed: true,
    };
    loop {
        match rx.recv().await {
            Some(Event::Done(f)) => {
                guard.armed = false;
                reply.cached_tokens = f.cached_tokens;
                reply.completion_tokens = f.completion_tokens;
                if let Some(room) = room {
                    room.ready(f.prompt_tokens);
                }
                s.metrics.record_done(&reply);
                return Ok(Answer::Whole(reply.full()));
            }
            Some(Event::Tokens(_) | Event::Admitted(_)) => {}
            Some(Event::Rejected(e)) => {
                guard.armed = false;
                if let Some(room) = room {
                    room.fail(&e.to_string());
                }
                return Err(e);
            }
            None => return Err(SimError::EngineGone),
        }
    }
}

/// Queues a request in the engine; its events come on the receiver.
fn submit(
    s: &WorkerState,
    req: EngineRequest,
    stream: bool,
    transferred: bool,
) -> Result<mpsc::UnboundedReceiver<Event>, SimError> {
    let (tx, rx) = mpsc::unbounded_channel();
    s.engine.send(Cmd::Submit {
        req,
        stream,
        transferred,
        events: tx,
    })?;
    Ok(rx)
}

/// The `kv_transfer_params` a vLLM prefill answers: where decode pulls the
/// KV held under `key`.
fn vllm_params(s: &WorkerState, key: &str, prompt_len: usize) -> serde_json::Value {
    let blocks = prompt_len.div_ceil(s.config.engine.block_size);
    serde_json::json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": &*s.name,
        "remote_block_ids": (0..blocks).collect::<Vec<_>>(),
        "remote_host": s.pull_addr.ip().to_string(),
        "remote_port": s.pull_addr.port(),
        "remote_request_id": key,
        "tp_size": 1,
    })
}

fn request_id(api: Api, worker: &str, id: ReqId) -> String {
    let prefix = match api {
        Api::Chat => "chatcmpl",
        Api::Completions => "cmpl",
        Api::Generate => "gen",
        Api::Responses => "resp",
        Api::Messages => "msg",
    };
    format!("{prefix}-{worker}-{id}")
}

/// Sends `Cancel` for a request whose handler is dropped before it ends.
struct CancelOnDrop {
    s: Arc<WorkerState>,
    id: ReqId,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.s.engine.send(Cmd::Cancel(self.id));
        }
    }
}

fn json_response(v: &serde_json::Value) -> Response {
    let body = serde_json::to_vec(v).expect("a JSON value serialises");
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

fn token_events(reply: &Reply, from: usize, to: usize, include_usage: bool) -> Vec<Bytes> {
    if reply.completion_tokens == 0 {
        return reply.empty_finish(include_usage).into_iter().collect();
    }
    (from..to)
        .map(|i| reply.tokens(i, i + 1, i + 1 == reply.completion_tokens, include_usage))
        .collect()
}

type Chunk = Result<Bytes, std::io::Error>;

fn cut() -> std::io::Error {
    std::io::Error::other("die_after_chunks: connection dropped mid-stream")
}

/// A body from a fixed list of events, cut after `die_after` events when
/// it has more (a shorter one ends normally, as a timed stream does).
fn stream_of(events: Vec<Bytes>, die_after: Option<u32>) -> Body {
    let mut items: Vec<Chunk> = events.into_iter().map(Ok).collect();
    if let Some(k) = die_after.map(|k| k as usize)
        && items.len() > k
    {
        items.truncate(k);
        items.push(Err(cut()));
    }
    Body::from_stream(flush_before_error(futures::stream::iter(items)))
}

/// Passes items through, but pauses briefly before an error so that the
/// server flushes the chunks already written before it drops the
/// connection (otherwise a client may see fewer than K events).
fn flush_before_error(
    inner: impl futures::Stream<Item = Chunk> + Send + Unpin + 'static,
) -> impl futures::Stream<Item = Chunk> + Send + 'static {
    use futures::StreamExt;
    futures::stream::unfold(inner, |mut inner| async move {
        let item = inner.next().await?;
        if item.is_err() {
            tokio::time::sleep(std::time::Duration::from_millis(FLUSH_PAUSE_MS)).await;
        }
        Some((item, inner))
    })
}

/// How long a stream pauses before it is cut (see `flush_before_error`).
const FLUSH_PAUSE_MS: u64 = 1;

fn sse_response(body: Body) -> Response {
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// How a stream begins: already in the engine, or after its KV transfer.
enum Start {
    /// Submitted; its events come on the receiver.
    Submitted(mpsc::UnboundedReceiver<Event>),
    /// Pull this KV first, then submit the request as transferred.
    Transfer(pd::Source, EngineRequest),
}

/// Streams a request's events as they come from the engine; a prefill
/// request settles its `room` when it finishes.
fn stream_reply(
    s: Arc<WorkerState>,
    id: ReqId,
    mut reply: Reply,
    req: GenRequest,
    start: Start,
    mut room: Option<pd::RoomGuard>,
    die_after: Option<u32>,
) -> Body {
    let (tx, body_rx) = mpsc::channel::<Chunk>(16);
    tokio::spawn(async move {
        let mut rx = match start {
            Start::Submitted(rx) => rx,
            Start::Transfer(src, engine_req) => {
                let pulled = tokio::select! {
                    r = pd::transfer(&s, &src) => r,
                    // The client left: dropping the pull counts the cancel.
                    () = tx.closed() => return,
                };
                let submitted = pulled.and_then(|()| submit(&s, engine_req, true, true));
                match submitted {
                    Ok(rx) => rx,
                    Err(e) => {
                        s.metrics.count_error(&e);
                        let _ = tx
                            .send(Ok(super::response::sse(&super::error_json(&e))))
                            .await;
                        return;
                    }
                }
            }
        };
        let mut guard = CancelOnDrop {
            s: s.clone(),
            id,
            armed: true,
        };
        let mut sent = 0u32;
        let mut emit = async |b: Bytes| -> bool {
            if die_after.is_some_and(|k| sent >= k) {
                let _ = tx.send(Err(cut())).await;
                return false;
            }
            sent += 1;
            tx.send(Ok(b)).await.is_ok()
        };
        // The preamble (Responses: the response created) goes out at once;
        // the opening event (chat: the assistant role) with the first
        // token, as vLLM and SGLang send it: a router that times the first
        // token of a stream times the prefill, and must not take the
        // preamble for it.
        if let Some(preamble) = reply.preamble()
            && !emit(preamble).await
        {
            return;
        }
        let mut opened = false;
        let mut done_tokens = 0;
        while let Some(ev) = rx.recv().await {
            // Built when sent, so the Messages API's `message_start` knows
            // the cached tokens its admission found.
            if !matches!(ev, Event::Admitted(_)) && !opened {
                opened = true;
                if let Some(open) = reply.opening(req.include_usage)
                    && !emit(open).await
                {
                    return;
                }
            }
            match ev {
                Event::Admitted(cached) => reply.cached_tokens = cached,
                Event::Tokens(n) => {
                    for b in token_events(&reply, done_tokens, n, req.include_usage) {
                        if !emit(b).await {
                            return;
                        }
                    }
                    done_tokens = n;
                }
                Event::Done(f) => {
                    guard.armed = false;
                    if let Some(room) = room.take() {
                        room.ready(f.prompt_tokens);
                    }
                    reply.cached_tokens = f.cached_tokens;
                    reply.completion_tokens = f.completion_tokens;
                    s.metrics.record_done(&reply);
                    let mut tail = Vec::new();
                    if f.completion_tokens == 0 || done_tokens < f.completion_tokens {
                        tail = token_events(
                            &reply,
                            done_tokens,
                            f.completion_tokens,
                            req.include_usage,
                        );
                    }
                    tail.extend(reply.closing(req.include_usage));
                    for b in tail {
                        if !emit(b).await {
                            return;
                        }
                    }
                    return;
                }
                Event::Rejected(e) => {
                    guard.armed = false;
                    if let Some(room) = room.take() {
                        room.fail(&e.to_string());
                    }
                    s.metrics.count_error(&e);
                    let _ = emit(super::response::sse(&super::error_json(&e))).await;
                    return;
                }
            }
        }
    });
    let stream =
        futures::stream::unfold(
            body_rx,
            |mut rx| async move { rx.recv().await.map(|c| (c, rx)) },
        );
    Body::from_stream(flush_before_error(Box::pin(stream)))
}
