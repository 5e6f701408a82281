//! Prefill/decode disaggregation through `serve`, on loopback: what each
//! engine is sent (SGLang's bootstrap fields, vLLM's two steps), what the
//! client gets back, whole and streamed, and what happens when either
//! side fails, when the client goes away, and when decode alone will do.
//!
//! The workers here are recording engines: each role of each protocol
//! answers as the engine does and keeps every body it was sent, so a test
//! can check them field by field. (`tests/pd_sim.rs` runs the simulated
//! workers, whose decode really pulls the KV from prefill.)

mod common;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{get, post};
use common::{client, config, gateway, post_chat, series_value, wait_for_healthy, wait_until};
use parking_lot::Mutex;
use radixgate::config::{Config, PdProtocol, WorkerSpec};
use radixgate_routing::{PolicyConfig, WorkerRole};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How a recording engine behaves.
#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// Answer every request with this status.
    fail: Option<u16>,
    /// With `fail`, say when to come back (`Retry-After`).
    retry_after: Option<&'static str>,
    /// Wait this long before answering (a long prefill, a slow transfer).
    delay_ms: u64,
    /// Streams: wait this long between events.
    event_gap_ms: u64,
    /// Answer only once a prefill engine has answered the request's
    /// bootstrap room (at most a minute), as SGLang's decode waits for the
    /// KV.
    waits_for_kv: bool,
    /// vLLM's step one: answer without `kv_transfer_params`, as a worker
    /// started without a KV connector does.
    no_transfer_params: bool,
    /// Whole answers: send the head and the body's first bytes, then break
    /// the connection (an engine that died part-way).
    breaks_mid_body: bool,
    /// Whole answers: send the head and the body's first bytes, then the
    /// rest this many ms later (an engine stalled part-way).
    stalls_mid_body_ms: u64,
    /// Streams: a 200 whose first event is an error of this code, then
    /// `[DONE]` (vLLM and SGLang stream a failed generation so).
    stream_error: Option<u16>,
}

/// The bootstrap rooms prefill engines have answered (their KV is ready).
static ROOMS_READY: std::sync::LazyLock<Mutex<std::collections::HashSet<u64>>> =
    std::sync::LazyLock::new(Mutex::default);

/// A recording engine in one role.
#[derive(Clone)]
struct Engine {
    name: &'static str,
    role: WorkerRole,
    bodies: Arc<Mutex<Vec<Value>>>,
    cancelled: Arc<AtomicUsize>,
    behaviour: Arc<Mutex<Behaviour>>,
    url: Arc<Mutex<String>>,
}

impl Engine {
    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().clone()
    }

    fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        self.url.lock().clone()
    }

    fn set(&self, behaviour: Behaviour) {
        *self.behaviour.lock() = behaviour;
    }
}

/// Counts a handler (or its stream) dropped before it finished.
struct Unfinished {
    count: Arc<AtomicUsize>,
    done: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.done {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn engine(name: &'static str, role: WorkerRole) -> Engine {
    let e = Engine {
        name,
        role,
        bodies: Arc::default(),
        cancelled: Arc::default(),
        behaviour: Arc::default(),
        url: Arc::default(),
    };
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { Json(json!({"data": [{"id": "pd-model"}]})) }),
        )
        .route("/generate", post(answer))
        .route("/v1/completions", post(answer))
        .route("/v1/chat/completions", post(answer))
        .with_state(e.clone());
    let (url, _stop) = common::serve_app(app).await;
    *e.url.lock() = url;
    e
}

use axum::Json;

async fn answer(State(e): State<Engine>, body: Bytes) -> axum::response::Response {
    let mut guard = Unfinished {
        count: e.cancelled.clone(),
        done: false,
    };
    let body: Value = serde_json::from_slice(&body).unwrap();
    e.bodies.lock().push(body.clone());
    let b = *e.behaviour.lock();
    // vLLM's sampling parameters refuse more minimum tokens than maximum.
    if let (Some(least), Some(most)) = (body["min_tokens"].as_u64(), body["max_tokens"].as_u64())
        && least > most
    {
        guard.done = true;
        return axum::response::Response::builder()
            .status(400)
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"error": {"message": format!(
                    "min_tokens must be less than or equal to max_tokens={most}, got {least}."
                )}})
                .to_string(),
            ))
            .unwrap();
    }
    let room = body["bootstrap_room"].as_u64();
    if let (true, Some(room)) = (b.waits_for_kv, room) {
        for _ in 0..6000 {
            if ROOMS_READY.lock().contains(&room) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(b.delay_ms)).await;
    if let (WorkerRole::Prefill, None, Some(room)) = (e.role, b.fail, room) {
        ROOMS_READY.lock().insert(room);
    }
    if let Some(status) = b.fail {
        guard.done = true;
        let mut answer = axum::response::Response::builder();
        if let Some(wait) = b.retry_after {
            answer = answer.header("retry-after", wait);
        }
        return answer
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"error": {"message": format!("{} failed on purpose", e.name)}}).to_string(),
            ))
            .unwrap();
    }
    let vllm_prefill = body["kv_transfer_params"]["do_remote_decode"] == true;
    let mut whole = json!({
        "id": "cmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("from-{}", e.name)}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    });
    if vllm_prefill && !b.no_transfer_params {
        whole["kv_transfer_params"] = json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_engine_id": format!("engine-{}", e.name),
            "remote_block_ids": [7, 8, 9],
            "remote_host": "127.0.0.1",
            "remote_port": 5601,
            "tp_size": 1,
        });
    }
    if body["stream"] != true && b.stalls_mid_body_ms > 0 {
        guard.done = true;
        let text = whole.to_string();
        let (head, rest) = text.split_at(text.len() / 2);
        let (head, rest) = (Bytes::from(head.to_owned()), Bytes::from(rest.to_owned()));
        let stall = Duration::from_millis(b.stalls_mid_body_ms);
        let parts =
            futures::stream::iter([head, rest])
                .enumerate()
                .then(move |(i, part)| async move {
                    if i > 0 {
                        tokio::time::sleep(stall).await;
                    }
                    Ok::<_, std::io::Error>(part)
                });
        return axum::response::Response::builder()
            .header("content-type", "application/json")
            .header("content-length", text.len())
            .body(Body::from_stream(parts))
            .unwrap();
    }
    if body["stream"] != true && b.breaks_mid_body {
        guard.done = true;
        let text = whole.to_string();
        let head = Bytes::from(text[..text.len() / 2].to_owned());
        // The head and first bytes go out; a moment later, the break.
        let parts = futures::stream::iter([Ok(head), Err(std::io::Error::other("engine died"))])
            .then(|part| async move {
                if part.is_err() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                part
            });
        return axum::response::Response::builder()
            .header("content-type", "application/json")
            .header("content-length", text.len())
            .body(Body::from_stream(parts))
            .unwrap();
    }
    if body["stream"] != true {
        guard.done = true;
        return Json(whole).into_response();
    }
    let name = e.name;
    let gap = Duration::from_millis(b.event_gap_ms.max(1));
    let events: Vec<String> = match b.stream_error {
        Some(code) => vec![
            format!(
                "data: {}\n\n",
                json!({"error": {"object": "error", "message": format!("{name} failed on purpose"), "code": code}})
            ),
            "data: [DONE]\n\n".to_owned(),
        ],
        None => (0..3)
            .map(|i| {
                if i < 2 {
                    format!(
                        "data: {}\n\n",
                        json!({"choices": [{"index": 0, "delta": {"content": format!("from-{name}-{i}")}}]})
                    )
                } else {
                    "data: [DONE]\n\n".to_owned()
                }
            })
            .collect(),
    };
    let stream =
        futures::stream::iter(events.into_iter().enumerate()).then(move |(i, event)| async move {
            if i > 0 {
                tokio::time::sleep(gap).await;
            }
            Ok::<_, std::io::Error>(Bytes::from(event))
        });
    // The guard rides with the stream: dropping it unfinished is a cancel.
    let stream = GuardedStream {
        inner: Box::pin(stream),
        guard,
    };
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

use axum::response::IntoResponse;
use futures::StreamExt as _;

struct GuardedStream<S> {
    inner: std::pin::Pin<Box<S>>,
    guard: Unfinished,
}

impl<S: futures::Stream> futures::Stream for GuardedStream<S> {
    type Item = S::Item;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let next = self.inner.as_mut().poll_next(cx);
        if let std::task::Poll::Ready(None) = next {
            self.guard.done = true;
        }
        next
    }
}

/// A disaggregated pool of the given engines.
fn pd_config(
    protocol: PdProtocol,
    prefill: &[(&Engine, Option<u16>)],
    decode: &[&Engine],
) -> Config {
    let mut c = config(&[]);
    c.pd.enabled = true;
    c.pd.protocol = protocol;
    // Every request to both workers, unless a test turns the skip on.
    c.pd.skip_prefill_max_uncached_tokens = 0;
    for (e, port) in prefill {
        c.workers.push(
            WorkerSpec::new(e.url())
                .with_role(WorkerRole::Prefill)
                .with_bootstrap_port(*port),
        );
    }
    for e in decode {
        c.workers
            .push(WorkerSpec::new(e.url()).with_role(WorkerRole::Decode));
    }
    c.retry.max_retries = 2;
    c
}

async fn started(c: Config) -> common::Gateway {
    let n = c.workers.len();
    let gw = gateway(c).await;
    wait_for_healthy(&gw.url, n).await;
    gw
}

/// A prompt of about 300 tokens: longer than the prefill skip's threshold
/// of 32, so it goes to both workers until decode holds it.
fn long_prompt(topic: &str) -> String {
    format!(
        "{topic}: {}",
        "why prefill and decode run on separate pools; ".repeat(25)
    )
}

/// One prefill and one decode engine (no bootstrap port) behind a gateway.
async fn pair(protocol: PdProtocol) -> (Engine, Engine, common::Gateway) {
    let prefill = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    let gw = started(pd_config(protocol, &[(&prefill, None)], &[&decode])).await;
    (prefill, decode, gw)
}

fn chat_body(stream: bool) -> Value {
    json!({
        "model": "pd-model",
        "messages": [{"role": "user", "content": long_prompt("tell me about disaggregation")}],
        "stream": stream,
        "max_tokens": 32,
        "client_extension": {"keep": [1, 2.50]},
    })
}

/// A streamed request whose client gives up after half a second, before
/// any answer.
async fn leave_before_any_answer(gw: &str) {
    let gone = client()
        .post(format!("{gw}/v1/chat/completions"))
        .json(&chat_body(true))
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(gone.is_err());
}

/// A streamed request whose client goes away after decode's first event.
async fn leave_after_the_first_event(gw: &str) {
    let mut r = post_chat(gw, &chat_body(true)).await;
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("from-decode-0"));
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_sends_the_bootstrap_fields_to_both_and_answers_from_decode() {
    let prefill = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    let gw = started(pd_config(
        PdProtocol::Sglang,
        &[(&prefill, Some(8998))],
        &[&decode],
    ))
    .await;
    for stream in [false, true] {
        let r = post_chat(&gw.url, &chat_body(stream)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-radixgate-worker"), decode.url());
        assert_eq!(header(&r, "x-radixgate-prefill-worker"), prefill.url());
        let decision = header(&r, "x-radixgate-decision");
        assert!(
            decision.starts_with("pd=sglang prefill=[cache_aware ")
                && decision.contains("decode=[power_of_two "),
            "{decision}"
        );
        let text = r.text().await.unwrap();
        assert!(text.contains("from-decode"), "{text}");
        assert!(!text.contains("from-prefill"), "{text}");
        let (p, d) = (prefill.bodies(), decode.bodies());
        let (p, d) = (p.last().unwrap(), d.last().unwrap());
        assert_eq!(p, d, "both get the same body");
        assert_eq!(p["bootstrap_host"], "127.0.0.1");
        assert_eq!(p["bootstrap_port"], 8998);
        assert!(p["bootstrap_room"].as_u64().unwrap() < 1 << 63);
        assert_eq!(p["stream"], stream);
        assert_eq!(p["client_extension"], json!({"keep": [1, 2.50]}));
        assert_eq!(p["max_tokens"], 32);
    }
    let rooms: Vec<u64> = decode
        .bodies()
        .iter()
        .map(|b| b["bootstrap_room"].as_u64().unwrap())
        .collect();
    assert_ne!(rooms[0], rooms[1], "a fresh room per request");
    assert_eq!(
        series_value(&gw.url, "radixgate_pd_requests_total{path=\"paired\"}").await,
        2.0
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_generate_batch_gets_arrays_and_no_port_is_null() {
    let (prefill, decode, gw) = pair(PdProtocol::Sglang).await;
    let r = client()
        .post(format!("{}/generate", gw.url))
        .json(&json!({"text": ["first prompt", "second prompt"], "sampling_params": {"max_new_tokens": 4}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sent = &decode.bodies()[0];
    assert_eq!(sent["bootstrap_host"], json!(["127.0.0.1", "127.0.0.1"]));
    assert_eq!(sent["bootstrap_port"], json!([null, null]));
    assert_eq!(sent["bootstrap_room"].as_array().unwrap().len(), 2);
    assert_eq!(&prefill.bodies()[0], sent);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_runs_prefill_then_decode_with_its_transfer_params() {
    let (prefill, decode, gw) = pair(PdProtocol::Vllm).await;
    for stream in [false, true] {
        let mut body = chat_body(stream);
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        let r = post_chat(&gw.url, &body).await;
        assert_eq!(r.status(), 200);
        assert!(header(&r, "x-radixgate-decision").starts_with("pd=vllm prefill=["));
        let text = r.text().await.unwrap();
        assert!(text.contains("from-decode"), "{text}");
        let one = prefill.bodies().last().unwrap().clone();
        assert_eq!(one["stream"], false);
        assert_eq!(one["max_tokens"], 1);
        assert!(one.get("stream_options").is_none());
        assert_eq!(
            one["kv_transfer_params"],
            json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                   "remote_block_ids": null, "remote_host": null, "remote_port": null})
        );
        assert_eq!(one["client_extension"], json!({"keep": [1, 2.50]}));
        let two = decode.bodies().last().unwrap().clone();
        assert_eq!(
            two["kv_transfer_params"]["remote_engine_id"],
            "engine-prefill"
        );
        assert_eq!(
            two["kv_transfer_params"]["remote_block_ids"],
            json!([7, 8, 9])
        );
        assert_eq!(two["kv_transfer_params"]["do_remote_prefill"], true);
        assert_eq!(two["stream"], stream, "decode gets the client's own flags");
        assert_eq!(two["max_tokens"], 32);
        assert_eq!(two["client_extension"], json!({"keep": [1, 2.50]}));
        if stream {
            assert_eq!(two["stream_options"], json!({"include_usage": true}));
        }
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_side_fails_the_request_cancels_the_other_and_frees_both() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let prefill = engine("prefill", WorkerRole::Prefill).await;
        let decode = engine("decode", WorkerRole::Decode).await;
        let mut c = pd_config(protocol, &[(&prefill, None)], &[&decode]);
        c.retry.max_retries = 0;
        c.circuit_breaker.enabled = false;
        let gw = started(c).await;
        // Prefill fails while decode is still waiting for the KV.
        prefill.set(Behaviour {
            fail: Some(500),
            delay_ms: 50,
            ..Behaviour::default()
        });
        decode.set(Behaviour {
            delay_ms: 60_000,
            ..Behaviour::default()
        });
        let r = post_chat(&gw.url, &chat_body(false)).await;
        assert_eq!(r.status(), 500, "{protocol:?}");
        let err: Value = r.json().await.unwrap();
        let message = err["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("prefill worker failed")
                && message.contains("prefill failed on purpose"),
            "{message}"
        );
        if protocol == PdProtocol::Sglang {
            wait_until("decode's request cancelled", || async {
                decode.cancelled() == 1
            })
            .await;
        } else {
            assert!(
                decode.bodies().is_empty(),
                "vLLM's decode step never started"
            );
        }
        // Decode fails while prefill is still computing (a moment after
        // both got the request: a failure before prefill's handler has its
        // body would leave nothing there to cancel).
        prefill.set(Behaviour {
            delay_ms: 60_000,
            ..Behaviour::default()
        });
        decode.set(Behaviour {
            delay_ms: 300,
            fail: Some(503),
            ..Behaviour::default()
        });
        if protocol == PdProtocol::Sglang {
            let r = post_chat(&gw.url, &chat_body(true)).await;
            assert_eq!(r.status(), 503);
            wait_until("prefill's request cancelled", || async {
                prefill.cancelled() == 1
            })
            .await;
        } else {
            prefill.set(Behaviour::default());
            let r = post_chat(&gw.url, &chat_body(true)).await;
            assert_eq!(r.status(), 503);
            // Decode's own answer, passed through: the pair is named.
            assert_eq!(header(&r, "x-radixgate-prefill-worker"), prefill.url());
            let err: Value = r.json().await.unwrap();
            assert!(
                err["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("decode failed on purpose")
            );
        }
        common::wait_for_zero_load(&gw.url).await;
        assert_eq!(
            series_value(&gw.url, "radixgate_pd_failures_total{side=\"prefill\"}").await,
            1.0
        );
        gw.shutdown().await;
    }
}

/// Decode refusing the request (a 4xx, final) is the answer: prefill, which
/// would wait for a decode that never joins its bootstrap room, is not
/// waited for but cancelled, and nobody's breaker counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_decodes_refusal_is_answered_at_once_and_cancels_prefill() {
    let (prefill, decode, gw) = pair(PdProtocol::Sglang).await;
    prefill.set(Behaviour {
        delay_ms: 60_000,
        ..Behaviour::default()
    });
    decode.set(Behaviour {
        delay_ms: 300,
        fail: Some(422),
        ..Behaviour::default()
    });
    for stream in [true, false] {
        // A hang guard, well under the first-byte timeouts (60 s, 300 s)
        // that waiting for prefill would take.
        let r = tokio::time::timeout(
            Duration::from_secs(20),
            post_chat(&gw.url, &chat_body(stream)),
        )
        .await
        .expect("decode's refusal answered without waiting for prefill");
        assert_eq!(r.status(), 422, "stream {stream}");
        assert_eq!(header(&r, "x-radixgate-prefill-worker"), prefill.url());
        let err: Value = r.json().await.unwrap();
        assert!(
            err["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("decode failed on purpose")),
            "{err}"
        );
    }
    wait_until("prefill's requests cancelled", || async {
        prefill.cancelled() == 2
    })
    .await;
    common::wait_for_zero_load(&gw.url).await;
    assert_eq!(
        series_value(&gw.url, "radixgate_pd_failures_total{side=\"prefill\"}").await,
        0.0
    );
    gw.shutdown().await;
}

/// Prefill refusing the request (a final 4xx: a prompt over the model's
/// context, a parameter the engine rejects) is the request's fault, as a
/// co-located worker's refusal is: the client gets it, and it counts as no
/// failure of the prefill worker, on its breaker or in the metrics. (It
/// did count on the breaker: a client's few over-long prompts opened every
/// prefill worker's breaker, and the pool answered nobody 503.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_workers_refusal_is_answered_and_opens_no_breaker() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let prefill = engine("prefill", WorkerRole::Prefill).await;
        let decode = engine("decode", WorkerRole::Decode).await;
        let mut c = pd_config(protocol, &[(&prefill, None)], &[&decode]);
        c.circuit_breaker.failure_threshold = 2;
        c.circuit_breaker.timeout_duration_secs = 600;
        let gw = started(c).await;
        prefill.set(Behaviour {
            fail: Some(400),
            ..Behaviour::default()
        });
        // SGLang's decode waits for a KV transfer that never comes.
        decode.set(Behaviour {
            delay_ms: 60_000,
            ..Behaviour::default()
        });
        for i in 0..3 {
            let r = post_chat(&gw.url, &chat_body(i % 2 == 0)).await;
            assert_eq!(r.status(), 400, "{protocol:?} {i}");
            let err: Value = r.json().await.unwrap();
            assert!(
                err["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("prefill failed on purpose")),
                "{err}"
            );
        }
        assert_eq!(prefill.bodies().len(), 3, "a refusal is not retried");
        prefill.set(Behaviour::default());
        decode.set(Behaviour::default());
        let r = post_chat(&gw.url, &chat_body(false)).await;
        assert_eq!(r.status(), 200, "{protocol:?}: {}", r.text().await.unwrap());
        common::wait_for_zero_load(&gw.url).await;
        assert_eq!(
            series_value(&gw.url, "radixgate_pd_failures_total{side=\"prefill\"}").await,
            0.0,
            "{protocol:?}"
        );
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_is_retried_on_a_new_pair() {
    let bad = engine("bad-prefill", WorkerRole::Prefill).await;
    let good = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    bad.set(Behaviour {
        fail: Some(502),
        ..Behaviour::default()
    });
    let mut c = pd_config(
        PdProtocol::Sglang,
        &[(&bad, None), (&good, None)],
        &[&decode],
    );
    c.routing = PolicyConfig::named("round_robin").unwrap();
    c.circuit_breaker.enabled = false;
    let gw = started(c).await;
    for _ in 0..4 {
        let r = post_chat(&gw.url, &chat_body(false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-radixgate-prefill-worker"), good.url());
    }
    assert!(!bad.bodies().is_empty(), "the bad prefill worker was tried");
    gw.shutdown().await;
}

/// A side that answers 429 with `Retry-After` is passed over until then,
/// as a co-located worker is, while another worker of its role can take
/// the request: round robin sent every other pair to it, each paying a
/// refused attempt and a back-off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_that_says_retry_after_is_passed_over_until_then() {
    let busy = engine("busy-prefill", WorkerRole::Prefill).await;
    let good = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    busy.set(Behaviour {
        fail: Some(429),
        retry_after: Some("30"),
        ..Behaviour::default()
    });
    let mut c = pd_config(
        PdProtocol::Vllm,
        &[(&busy, None), (&good, None)],
        &[&decode],
    );
    c.routing = PolicyConfig::named("round_robin").unwrap();
    let gw = started(c).await;
    for _ in 0..6 {
        let r = post_chat(&gw.url, &chat_body(false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-radixgate-prefill-worker"), good.url());
    }
    assert_eq!(busy.bodies().len(), 1, "tried again within its pause");
    gw.shutdown().await;
}

/// A vLLM prefill answer that stalls part-way past the first-byte timeout
/// is that worker's timeout, counted as every other one is: on its
/// worker's `timeout` errors, which it was not (only its breaker and the
/// pair's failure counted it), so the stalled pod could not be found from
/// the metrics. The request is served by another prefill worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_prefill_answer_stalled_past_the_timeout_is_counted_on_its_worker() {
    let stalled = engine("stalled-prefill", WorkerRole::Prefill).await;
    let good = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    stalled.set(Behaviour {
        stalls_mid_body_ms: 3000,
        ..Behaviour::default()
    });
    let mut c = pd_config(
        PdProtocol::Vllm,
        &[(&stalled, None), (&good, None)],
        &[&decode],
    );
    c.routing = PolicyConfig::named("round_robin").unwrap();
    c.retry.first_byte_timeout_secs = 1;
    let gw = started(c).await;
    for _ in 0..2 {
        let r = post_chat(&gw.url, &chat_body(true)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "x-radixgate-prefill-worker"), good.url());
    }
    let stalls = stalled.bodies().len();
    assert!(stalls > 0, "the stalled prefill worker was tried");
    let timeouts = format!(
        "radixgate_upstream_errors_total{{worker=\"{}\",kind=\"timeout\"}}",
        stalled.url()
    );
    assert_eq!(
        series_value(&gw.url, &timeouts).await,
        stalls as f64,
        "{}",
        common::metrics_text(&gw.url).await
    );
    gw.shutdown().await;
}

/// A vLLM prefill worker that answers without `kv_transfer_params` (one
/// started without a KV connector: the one pod of a rolling update whose
/// flags lost it) fails its pair, as any prefill failure does, and the
/// request is retried on another prefill worker. (It was not retried: each
/// request it took failed with 502 though another worker would have
/// served it.) Each of its failures is counted on it in
/// `radixgate_upstream_errors_total` (kind `no_transfer_params`): it was
/// counted nowhere by worker, so the failing pod could not be found from
/// the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_prefill_without_transfer_params_is_retried_on_another() {
    let bad = engine("bad-prefill", WorkerRole::Prefill).await;
    let good = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    bad.set(Behaviour {
        no_transfer_params: true,
        ..Behaviour::default()
    });
    let mut c = pd_config(PdProtocol::Vllm, &[(&bad, None), (&good, None)], &[&decode]);
    c.routing = PolicyConfig::named("round_robin").unwrap();
    c.circuit_breaker.enabled = false;
    let gw = started(c).await;
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat_body(i % 2 == 0)).await;
        assert_eq!(r.status(), 200, "{i}: {}", r.text().await.unwrap());
        assert_eq!(header(&r, "x-radixgate-prefill-worker"), good.url());
        assert!(r.text().await.unwrap().contains("from-decode"));
    }
    assert!(!bad.bodies().is_empty(), "the bad prefill worker was tried");
    assert_eq!(decode.bodies().len(), 4, "decode got the good pairs only");
    assert_eq!(
        series_value(&gw.url, "radixgate_pd_failures_total{side=\"prefill\"}").await,
        bad.bodies().len() as f64
    );
    let failed = format!(
        "radixgate_upstream_errors_total{{worker=\"{}\",kind=\"no_transfer_params\"}}",
        bad.url()
    );
    assert_eq!(
        series_value(&gw.url, &failed).await,
        bad.bodies().len() as f64,
        "{}",
        common::metrics_text(&gw.url).await
    );
    let good_failed = format!("radixgate_upstream_errors_total{{worker=\"{}\"", good.url());
    assert!(
        !common::metrics_text(&gw.url).await.contains(&good_failed),
        "nothing counted on the good prefill worker"
    );
    // Each failed pair was retried, and counted so.
    let retries = "radixgate_retries_total";
    let retried = common::series_sum(&gw.url, retries).await;
    assert_eq!(retried, bad.bodies().len() as f64);
    common::wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
    // With no other prefill worker, a failed pair is not retried, and no
    // retry is counted (one was, for each request).
    let c = pd_config(PdProtocol::Vllm, &[(&bad, None)], &[&decode]);
    let gw = started(c).await;
    let r = post_chat(&gw.url, &chat_body(false)).await;
    assert_eq!(r.status(), 502, "{}", r.text().await.unwrap());
    assert_eq!(common::series_sum(&gw.url, retries).await, 0.0);
    gw.shutdown().await;
}

/// A vLLM prefill worker whose answer breaks off part-way (the engine
/// died, the connection dropped) failed the request as an engine started
/// without a KV connector ("answered without kv_transfer_params"), with no
/// broken answer counted: an operator was sent to check its flags. It is
/// told as the broken connection it is, and counted so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_prefill_answer_broken_off_is_told_as_such() {
    let prefill = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    prefill.set(Behaviour {
        breaks_mid_body: true,
        ..Behaviour::default()
    });
    let c = pd_config(PdProtocol::Vllm, &[(&prefill, None)], &[&decode]);
    let gw = started(c).await;
    let r = post_chat(&gw.url, &chat_body(false)).await;
    assert_eq!(r.status(), 502);
    let error: Value = r.json().await.unwrap();
    assert_eq!(error["error"]["code"], "worker_closed", "{error}");
    let broken = format!(
        "radixgate_upstream_errors_total{{worker=\"{}\",kind=\"stream_broken\"}}",
        prefill.url()
    );
    let text = common::metrics_text(&gw.url).await;
    assert!(text.contains(&format!("{broken} 1")), "{text}");
    assert!(decode.bodies().is_empty(), "decode was sent nothing");
    gw.shutdown().await;
}

/// SGLang's prefill worker answers at its prefill's end, whether or not
/// the client streams: one that sends nothing by a whole answer's
/// first-byte timeout hangs, and the other requests that have waited on it
/// longer than the streams' timeout give up then (504
/// `worker_unavailable`), not each at its own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sglang_prefill_is_a_hang_for_whole_answers_too() {
    let prefill = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    let mut c = pd_config(PdProtocol::Sglang, &[(&prefill, None)], &[&decode]);
    c.retry.max_retries = 0;
    c.retry.first_byte_timeout_secs = 1;
    c.retry.non_stream_timeout_secs = 3;
    c.circuit_breaker.enabled = false;
    let gw = started(c).await;
    prefill.set(Behaviour {
        delay_ms: 30_000,
        ..Behaviour::default()
    });
    let url = gw.url.clone();
    let first = tokio::spawn(async move { post_chat(&url, &chat_body(false)).await.status() });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // This one's checks fall 1 and 2 s after it is sent, its own timeout
    // at 3 s; the first request times out 1.5 s after it is sent.
    let sent = std::time::Instant::now();
    let r = post_chat(&gw.url, &chat_body(false)).await;
    let waited = sent.elapsed();
    assert_eq!(first.await.unwrap(), 504);
    assert_eq!(r.status(), 504);
    let body = r.text().await.unwrap();
    assert!(body.contains("worker_unavailable"), "{body}");
    assert!(waited < Duration::from_millis(2800), "{waited:?}");
    gw.shutdown().await;
}

/// SGLang's decode sends its first byte only once prefill's KV has come:
/// while prefill has not answered, decode's silence is prefill's. So a
/// hung prefill worker is the one that times out and is blamed, and the
/// request is retried on another prefill worker with the same decode.
/// (Decode's first-byte timer ran from its own send, a moment before
/// prefill's: decode timed out first, every time, and was blamed, its
/// breaker counting each of the hung prefill's requests, so that one hung
/// prefill worker opened the only decode worker's breaker and took the
/// pool out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sglang_prefill_is_blamed_not_the_decode_waiting_for_its_kv() {
    let hung = engine("hung-prefill", WorkerRole::Prefill).await;
    let good = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    let mut c = pd_config(
        PdProtocol::Sglang,
        &[(&hung, None), (&good, None)],
        &[&decode],
    );
    c.routing = PolicyConfig::named("round_robin").unwrap();
    c.retry.first_byte_timeout_secs = 1;
    c.retry.non_stream_timeout_secs = 2;
    c.circuit_breaker.failure_threshold = 2;
    c.circuit_breaker.timeout_duration_secs = 600;
    let gw = started(c).await;
    // Decode's first byte waits for the KV, which the hung prefill never
    // sends; the good prefill's comes at once.
    hung.set(Behaviour {
        delay_ms: 60_000,
        ..Behaviour::default()
    });
    decode.set(Behaviour {
        waits_for_kv: true,
        ..Behaviour::default()
    });
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat_body(i % 2 == 0)).await;
        assert_eq!(r.status(), 200, "{i}: {}", r.text().await.unwrap());
        assert_eq!(header(&r, "x-radixgate-prefill-worker"), good.url());
        assert!(r.text().await.unwrap().contains("from-decode"));
    }
    assert!(
        !hung.bodies().is_empty(),
        "the hung prefill worker was tried"
    );
    assert_eq!(
        series_value(&gw.url, "radixgate_pd_failures_total{side=\"decode\"}").await,
        0.0
    );
    let breaker_moved = |url: String| {
        let gw = gw.url.clone();
        async move {
            common::metrics_text(&gw)
                .await
                .lines()
                .filter(|l| l.starts_with("radixgate_circuit_breaker_transitions_total{"))
                .any(|l| l.contains(&format!("worker=\"{url}\"")) && !l.ends_with(" 0"))
        }
    };
    assert!(!breaker_moved(decode.url()).await, "decode's breaker moved");
    common::wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

/// A request timeout no longer than the streams' first-byte timeout (here
/// 1 s against 60 s) ends every pair's attempt at a hung worker before
/// that timeout can. Each was a 504 counted on nothing, so a prefill or
/// decode worker that answers `/health` but hangs every request stayed in
/// rotation for good, and every request paired with it timed out. Now it
/// counts as that side's timeout, on the side whose silence it was:
/// SGLang's decode waits for prefill's KV, so before prefill answers it
/// is prefill's; vLLM's decode is sent once prefill has answered, so its
/// silence is its own. The hung worker's breaker opens, the other side's
/// does not move, and the requests go to the workers that answer.
async fn a_hung_side_only_the_request_timeout_meets_leaves_rotation(
    protocol: PdProtocol,
    hung_role: WorkerRole,
) {
    let hung = engine("hung", hung_role).await;
    let good = engine("good", hung_role).await;
    let other_role = match hung_role {
        WorkerRole::Decode => WorkerRole::Prefill,
        _ => WorkerRole::Decode,
    };
    let other = engine("other", other_role).await;
    let mut c = match hung_role {
        WorkerRole::Decode => pd_config(protocol, &[(&other, None)], &[&hung, &good]),
        _ => pd_config(protocol, &[(&hung, None), (&good, None)], &[&other]),
    };
    // Every other request to the hung worker.
    c.routing = PolicyConfig::named("round_robin").unwrap();
    c.pd.decode_policy = PolicyConfig::named("round_robin").unwrap();
    c.retry.first_byte_timeout_secs = 60;
    c.retry.non_stream_timeout_secs = 60;
    c.server.request_timeout_secs = 1;
    c.circuit_breaker.failure_threshold = 2;
    c.circuit_breaker.timeout_duration_secs = 3600;
    let gw = started(c).await;
    hung.set(Behaviour {
        delay_ms: 60_000,
        ..Behaviour::default()
    });
    if protocol == PdProtocol::Sglang && hung_role == WorkerRole::Prefill {
        other.set(Behaviour {
            waits_for_kv: true,
            ..Behaviour::default()
        });
    }
    let mut timed_out = 0;
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat_body(true)).await;
        let status = r.status();
        let body = r.text().await.unwrap();
        assert!(status == 200 || status == 504, "{i}: {status} {body}");
        if status == 504 {
            assert!(body.contains("request_timeout"), "{i}: {body}");
            timed_out += 1;
        }
    }
    assert_eq!(timed_out, 2);
    let breaker = |url: String| {
        let gw = gw.url.clone();
        async move {
            let series = format!("radixgate_circuit_breaker_state{{worker=\"{url}\"}}");
            series_value(&gw, &series).await
        }
    };
    wait_until("the hung worker's breaker is open", || async {
        breaker(hung.url()).await == 1.0
    })
    .await;
    assert_eq!(breaker(other.url()).await, 0.0, "the other side was blamed");
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat_body(true)).await;
        assert_eq!(r.status(), 200, "{i} after");
        let served = match hung_role {
            WorkerRole::Decode => header(&r, "x-radixgate-worker"),
            _ => header(&r, "x-radixgate-prefill-worker"),
        };
        assert_eq!(served, good.url(), "{i} after");
        r.bytes().await.unwrap();
    }
    let series = format!(
        "radixgate_upstream_errors_total{{worker=\"{}\",kind=\"timeout\"}}",
        hung.url()
    );
    assert_eq!(series_value(&gw.url, &series).await, 2.0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_sglang_prefill_only_the_request_timeout_meets_leaves_rotation() {
    a_hung_side_only_the_request_timeout_meets_leaves_rotation(
        PdProtocol::Sglang,
        WorkerRole::Prefill,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_vllm_decode_only_the_request_timeout_meets_leaves_rotation() {
    a_hung_side_only_the_request_timeout_meets_leaves_rotation(
        PdProtocol::Vllm,
        WorkerRole::Decode,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_both_sides() {
    let (prefill, decode, gw) = pair(PdProtocol::Sglang).await;
    // Before any answer: both are still working.
    prefill.set(Behaviour {
        delay_ms: 60_000,
        ..Behaviour::default()
    });
    decode.set(Behaviour {
        delay_ms: 60_000,
        ..Behaviour::default()
    });
    leave_before_any_answer(&gw.url).await;
    wait_until("both sides cancelled", || async {
        prefill.cancelled() == 1 && decode.cancelled() == 1
    })
    .await;
    // Mid-stream: decode is streaming, prefill's own answer is not over.
    prefill.set(Behaviour {
        event_gap_ms: 60_000,
        ..Behaviour::default()
    });
    decode.set(Behaviour {
        event_gap_ms: 60_000,
        ..Behaviour::default()
    });
    leave_after_the_first_event(&gw.url).await;
    wait_until("both sides cancelled mid-stream", || async {
        prefill.cancelled() == 2 && decode.cancelled() == 2
    })
    .await;
    common::wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

/// vLLM: a prompt its decode worker already holds goes to decode alone
/// (vLLM's decode instance prefills itself what a request without
/// `kv_transfer_params` lacks). SGLang: never, as its decode server takes
/// no request without its prefill's bootstrap room; every request is
/// paired whatever the threshold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_alone_serves_a_prompt_it_already_holds_under_vllm_only() {
    for protocol in [PdProtocol::Vllm, PdProtocol::Sglang] {
        let prefill = engine("prefill", WorkerRole::Prefill).await;
        let decode = engine("decode", WorkerRole::Decode).await;
        let mut c = pd_config(protocol, &[(&prefill, None)], &[&decode]);
        c.pd.decode_policy = PolicyConfig::named("cache_aware").unwrap();
        c.pd.skip_prefill_max_uncached_tokens = 32;
        let gw = started(c).await;
        let body = chat_body(false);
        let first = post_chat(&gw.url, &body).await;
        assert!(header(&first, "x-radixgate-decision").contains("prefill=[cache_aware"));
        // The same prompt again: decode holds all of it.
        let again = post_chat(&gw.url, &body).await;
        assert_eq!(again.status(), 200);
        let decision = header(&again, "x-radixgate-decision");
        let skipped = series_value(
            &gw.url,
            "radixgate_pd_requests_total{path=\"skipped_prefill\"}",
        );
        if protocol == PdProtocol::Sglang {
            assert!(decision.contains("prefill=[cache_aware"), "{decision}");
            assert!(again.text().await.unwrap().contains("from-decode"));
            assert_eq!(prefill.bodies().len(), 2, "SGLang pairs every request");
            assert!(decode.bodies()[1].get("bootstrap_room").is_some());
            assert_eq!(skipped.await, 0.0);
            gw.shutdown().await;
            continue;
        }
        assert!(
            decision.starts_with("pd=vllm prefill=skipped uncached_tokens=0 decode=["),
            "{decision}"
        );
        assert_eq!(header(&again, "x-radixgate-prefill-worker"), "");
        assert!(again.text().await.unwrap().contains("from-decode"));
        assert_eq!(prefill.bodies().len(), 1, "prefill was skipped");
        let alone = &decode.bodies()[1];
        assert!(
            alone.get("kv_transfer_params").is_none(),
            "decode alone gets the client's body"
        );
        assert_eq!(alone, &body);
        assert_eq!(skipped.await, 1.0);
        // A different prompt goes to both again.
        let other = post_chat(
            &gw.url,
            &json!({"model": "pd-model", "messages": [{"role": "user", "content": long_prompt("another question")}]}),
        )
        .await;
        assert!(header(&other, "x-radixgate-decision").contains("prefill=[cache_aware"));
        gw.shutdown().await;
    }
}

/// A request to an API no pair serves is refused (501) before anything is
/// spent on it: a tenant's request slot, a place in the admission queue,
/// its body read and tokenized. Before, each took its tenant's slot first,
/// so two such requests of a tenant allowed one a minute left its next
/// chat a 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_no_pair_serves_spends_no_tenant_slot() {
    let prefill = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    let base = pd_config(PdProtocol::Vllm, &[(&prefill, None)], &[&decode]);
    let mut document = serde_norway::to_value(&base).unwrap();
    let tenants = "keys: [{name: team-a, key: sk-a, requests_per_minute: 1}]";
    (document.as_mapping_mut().unwrap())
        .insert("tenants".into(), serde_norway::from_str(tenants).unwrap());
    let c = Config::from_yaml(&serde_norway::to_string(&document).unwrap()).unwrap();
    let gw = started(c).await;
    let post = |path: &'static str, body: Value| {
        let url = format!("{}{path}", gw.url);
        async move {
            let r = client().post(url).bearer_auth("sk-a").json(&body).send();
            r.await.unwrap().status().as_u16()
        }
    };
    for _ in 0..2 {
        let embed = json!({"model": "pd-model", "input": "x"});
        assert_eq!(post("/v1/embeddings", embed).await, 501);
    }
    assert_eq!(post("/v1/chat/completions", chat_body(false)).await, 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_without_a_disaggregated_meaning_are_refused_and_roles_are_checked() {
    let (_prefill, _decode, gw) = pair(PdProtocol::Vllm).await;
    let r = client()
        .post(format!("{}/v1/embeddings", gw.url))
        .json(&json!({"model": "pd-model", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 501);
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "not_disaggregated");
    // vLLM's protocol has no /generate.
    let r = client()
        .post(format!("{}/generate", gw.url))
        .json(&json!({"text": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 501);
    // The admin API takes a role, and only one that fits the pool.
    let r = client()
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": "http://127.0.0.1:9"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let err: Value = r.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("role: prefill"),
        "{err}"
    );
    let extra = engine("decode-2", WorkerRole::Decode).await;
    let r = client()
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": extra.url(), "role": "decode"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    wait_for_healthy(&gw.url, 3).await;
    let listed = common::workers(&gw.url).await;
    let roles: Vec<&str> = listed.iter().map(|w| w["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles.iter().filter(|r| **r == "decode").count(),
        2,
        "{listed:?}"
    );
    assert_eq!(roles.iter().filter(|r| **r == "prefill").count(), 1);
    gw.shutdown().await;
    assert!(extra.role == WorkerRole::Decode);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_client_that_goes_away_cancels_the_step_under_way() {
    let (prefill, decode, gw) = pair(PdProtocol::Vllm).await;
    // Gone during step one: prefill's request is cancelled, decode never
    // hears of it.
    prefill.set(Behaviour {
        delay_ms: 60_000,
        ..Behaviour::default()
    });
    leave_before_any_answer(&gw.url).await;
    wait_until("prefill cancelled", || async { prefill.cancelled() == 1 }).await;
    assert!(decode.bodies().is_empty());
    // Gone during step two's stream: decode's request is cancelled.
    prefill.set(Behaviour::default());
    decode.set(Behaviour {
        event_gap_ms: 60_000,
        ..Behaviour::default()
    });
    leave_after_the_first_event(&gw.url).await;
    wait_until("decode cancelled", || async { decode.cancelled() == 1 }).await;
    common::wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

/// A disaggregated pool left with one role only serves nothing: the
/// gateway is not ready then, so that a load balancer sends elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_decode_workers_is_not_ready() {
    let (_prefill, decode, gw) = pair(PdProtocol::Vllm).await;
    let ready = || async {
        client()
            .get(format!("{}/readiness", gw.url))
            .send()
            .await
            .unwrap()
    };
    assert_eq!(ready().await.status(), 200);
    let r = client()
        .delete(format!("{}/workers?url={}", gw.url, decode.url()))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503, "no decode worker to answer");
    // The answer names the pool that has none, as `/readiness` does.
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no decode worker"), "{message}");
    let r = ready().await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "no_healthy_decode_workers", "{body}");
    gw.shutdown().await;
    // And so without a prefill worker.
    let (prefill, _decode, gw) = pair(PdProtocol::Vllm).await;
    let r = client()
        .delete(format!("{}/workers?url={}", gw.url, prefill.url()))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let r = post_chat(&gw.url, &chat_body(false)).await;
    assert_eq!(r.status(), 503, "no prefill worker to answer");
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no prefill worker"), "{message}");
    gw.shutdown().await;
}

/// vLLM: decode is sent nothing until prefill has answered, so a prefill
/// that fails leaves decode's prefix record as it was. (It kept the
/// prompt: the next request for it, or the failed one's retry, was
/// predicted held by decode and sent to decode alone, which computed the
/// whole prompt itself.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_vllm_prefill_leaves_no_prompt_on_decodes_record() {
    let prefill = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    let mut c = pd_config(PdProtocol::Vllm, &[(&prefill, None)], &[&decode]);
    c.pd.skip_prefill_max_uncached_tokens = 32;
    c.retry.max_retries = 0;
    c.circuit_breaker.enabled = false;
    let gw = started(c).await;
    // A failure (retried elsewhere when another pair is left), then a
    // refusal (the request's own fault).
    for (i, status) in [502, 400].into_iter().enumerate() {
        prefill.set(Behaviour {
            fail: Some(status),
            ..Behaviour::default()
        });
        let mut body = chat_body(false);
        body["messages"][0]["content"] = json!(long_prompt(&format!("topic {i}")));
        let r = post_chat(&gw.url, &body).await;
        assert_eq!(r.status(), status);
        assert_eq!(decode.bodies().len(), i, "decode was sent nothing");
        prefill.set(Behaviour::default());
        let r = post_chat(&gw.url, &body).await;
        assert_eq!(r.status(), 200);
        let decision = header(&r, "x-radixgate-decision");
        assert!(
            decision.starts_with("pd=vllm prefill=[cache_aware "),
            "after a {status}: {decision}"
        );
        let sent = decode.bodies();
        assert_eq!(
            sent.last().unwrap()["kv_transfer_params"]["remote_engine_id"],
            "engine-prefill"
        );
    }
    gw.shutdown().await;
}

/// A request for which no prefill worker can be chosen (its only one's
/// breaker open) is answered 503 without being sent to either side, and
/// leaves no prompt on decode's record. It left it there: the next request
/// for the prompt was predicted held by decode and sent to decode alone,
/// which computed the whole prompt itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_no_prefill_worker_to_choose_leaves_no_prompt_on_decodes_record() {
    let prefill = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    let mut c = pd_config(PdProtocol::Vllm, &[(&prefill, None)], &[&decode]);
    c.pd.skip_prefill_max_uncached_tokens = 32;
    c.retry.max_retries = 0;
    c.circuit_breaker.failure_threshold = 1;
    c.circuit_breaker.timeout_duration_secs = 2;
    let gw = started(c).await;
    prefill.set(Behaviour {
        fail: Some(502),
        ..Behaviour::default()
    });
    let mut body = chat_body(false);
    body["messages"][0]["content"] = json!(long_prompt("opens the breaker"));
    assert_eq!(post_chat(&gw.url, &body).await.status(), 502);
    prefill.set(Behaviour::default());
    let open = format!(
        "radixgate_circuit_breaker_state{{worker=\"{}\"}}",
        prefill.url()
    );
    wait_until("the prefill worker's breaker open", || async {
        series_value(&gw.url, &open).await == 1.0
    })
    .await;
    body["messages"][0]["content"] = json!(long_prompt("no prefill to choose"));
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 503, "{}", r.text().await.unwrap());
    assert!(decode.bodies().is_empty(), "decode was sent nothing");
    wait_until("the breaker half-open", || async {
        series_value(&gw.url, &open).await == 2.0
    })
    .await;
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 200);
    let decision = header(&r, "x-radixgate-decision");
    assert!(
        decision.starts_with("pd=vllm prefill=[cache_aware "),
        "sent to both: {decision}"
    );
    gw.shutdown().await;
}

/// vLLM's step one asks for one token; a client's `min_tokens` above it
/// is left out of step one (vLLM refuses `min_tokens` over `max_tokens`:
/// every request that set it was answered 400) and reaches decode as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_clients_min_tokens_does_not_fail_its_one_token_prefill() {
    let (prefill, decode, gw) = pair(PdProtocol::Vllm).await;
    for stream in [false, true] {
        let mut body = chat_body(stream);
        body["min_tokens"] = json!(8);
        let r = post_chat(&gw.url, &body).await;
        let status = r.status();
        assert_eq!(status, 200, "{}", r.text().await.unwrap());
        assert!(r.text().await.unwrap().contains("from-decode"));
        let one = prefill.bodies().last().unwrap().clone();
        assert_eq!(one["max_tokens"], 1);
        assert!(one.get("min_tokens").is_none(), "{one}");
        assert_eq!(decode.bodies().last().unwrap()["min_tokens"], 8);
    }
    gw.shutdown().await;
}

/// The router owns the engines' transfer protocol: `kv_transfer_params`
/// in a client's body (naming another request's KV blocks, or a host to
/// pull from) never reaches decode. It did on the prefill skip, where the
/// client's bytes went to decode as sent, and decode pulled what the
/// client named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_own_transfer_params_never_reach_decode() {
    let prefill = engine("prefill", WorkerRole::Prefill).await;
    let decode = engine("decode", WorkerRole::Decode).await;
    let mut c = pd_config(PdProtocol::Vllm, &[(&prefill, None)], &[&decode]);
    c.pd.skip_prefill_max_uncached_tokens = 32;
    let gw = started(c).await;
    let forged = json!({"do_remote_prefill": true, "do_remote_decode": false,
        "remote_engine_id": "someone-elses", "remote_block_ids": [1, 2, 3],
        "remote_host": "192.0.2.1", "remote_port": 5600});
    // Short: decode alone. Long: a pair.
    for (i, content) in ["hi", &long_prompt("forged")].into_iter().enumerate() {
        let body = json!({"model": "pd-model", "messages": [{"role": "user", "content": content}],
            "kv_transfer_params": forged, "client_extension": {"keep": [1, 2.50]}});
        let r = post_chat(&gw.url, &body).await;
        assert_eq!(r.status(), 200);
        let decision = header(&r, "x-radixgate-decision");
        assert_eq!(decision.contains("prefill=skipped"), i == 0, "{decision}");
        let sent = decode.bodies().last().unwrap().clone();
        assert_eq!(sent["client_extension"], json!({"keep": [1, 2.50]}));
        if i == 0 {
            assert!(sent.get("kv_transfer_params").is_none(), "{sent}");
        } else {
            assert_eq!(
                sent["kv_transfer_params"]["remote_engine_id"],
                "engine-prefill"
            );
        }
    }
    gw.shutdown().await;
}

/// vLLM answers a `/v1/completions` batch's prefill step with one
/// `kv_transfer_params`, its first prompt's, and applies the
/// `kv_transfer_params` it is sent to every prompt of the batch: paired,
/// decode would read the first prompt's KV for every prompt and answer
/// the others from the wrong context. Such a batch is refused with a 400
/// that says why, before any worker is sent it; a list of one prompt is
/// one prompt. (Both workers were sent the batch, and the client got
/// decode's answer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vllm_completions_batch_is_refused_before_either_side_is_sent_it() {
    let (prefill, decode, gw) = pair(PdProtocol::Vllm).await;
    let completion = |prompt: Value| {
        let body = json!({"model": "pd-model", "prompt": prompt, "max_tokens": 8});
        let url = format!("{}/v1/completions", gw.url);
        async move { client().post(url).json(&body).send().await.unwrap() }
    };
    for batch in [
        json!([long_prompt("one"), long_prompt("two")]),
        json!([[1, 2, 3], [4, 5, 6]]),
    ] {
        let r = completion(batch).await;
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("2 prompts") && message.contains("one prompt per request"),
            "{message}"
        );
        assert!(prefill.bodies().is_empty() && decode.bodies().is_empty());
    }
    assert_eq!(
        series_value(&gw.url, "radixgate_pd_failures_total{side=\"prefill\"}").await,
        0.0
    );
    for one in [json!([long_prompt("one")]), json!([1, 2, 3])] {
        let r = completion(one).await;
        assert_eq!(r.status(), 200);
    }
    assert_eq!((prefill.bodies().len(), decode.bodies().len()), (2, 2));
    gw.shutdown().await;
}

/// An SGLang batch over the most prompts the gateway pairs is the
/// client's error: a 400 of its own, counted on no side. It was refused
/// while the first pair was being sent, as that pair's prefill failure:
/// counted in `radixgate_pd_failures_total{side="prefill"}` (an alert on
/// failing prefill workers fired on a client's batch) and told to the
/// client as "prefill worker failed: …".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_batch_over_the_limit_is_the_clients_error_not_prefills() {
    let (prefill, decode, gw) = pair(PdProtocol::Sglang).await;
    let texts = vec![""; 65_537];
    let r = client()
        .post(format!("{}/generate", gw.url))
        .json(&json!({"text": texts, "sampling_params": {"max_new_tokens": 4}}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("a batch of 65537 prompts") && !message.contains("worker failed"),
        "{message}"
    );
    assert!(prefill.bodies().is_empty() && decode.bodies().is_empty());
    for series in [
        "radixgate_pd_failures_total{side=\"prefill\"}",
        "radixgate_pd_requests_total{path=\"paired\"}",
    ] {
        assert_eq!(series_value(&gw.url, series).await, 0.0, "{series}");
    }
    gw.shutdown().await;
}

/// A side that sheds the request (429: busy; 503: full or going away)
/// never read its prompt, so the router's record of its cache does not
/// keep it, as a co-located worker's does not. It kept it: the prefill
/// tree sent the prompt's next request back to the worker that shed it
/// as a cache hit that was not there, and decode's record had it predicted
/// held (under vLLM, sent to decode alone, which computed all of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_that_sheds_the_request_keeps_no_prompt_on_its_record() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        for shedding in [WorkerRole::Prefill, WorkerRole::Decode] {
            for status in [429, 503] {
                let case = format!("{protocol:?} {shedding:?} {status}");
                let (prefill, decode, gw) = {
                    let prefill = engine("prefill", WorkerRole::Prefill).await;
                    let decode = engine("decode", WorkerRole::Decode).await;
                    let mut c = pd_config(protocol, &[(&prefill, None)], &[&decode]);
                    c.retry.max_retries = 0;
                    c.circuit_breaker.enabled = false;
                    (prefill.clone(), decode.clone(), started(c).await)
                };
                let shedder = match shedding {
                    WorkerRole::Decode => &decode,
                    _ => &prefill,
                };
                shedder.set(Behaviour {
                    fail: Some(status),
                    ..Behaviour::default()
                });
                let mut body = chat_body(false);
                body["messages"][0]["content"] = json!(long_prompt(&case));
                let r = post_chat(&gw.url, &body).await;
                assert_eq!(r.status(), status, "{case}");
                assert!(!shedder.bodies().is_empty(), "{case}: it was sent");
                common::wait_for_zero_load(&gw.url).await;
                assert_eq!(
                    common::recorded_chars(&gw.url, &shedder.url()).await,
                    0,
                    "{case}: the shedding side's record keeps the prompt"
                );
                // Served, it does.
                shedder.set(Behaviour::default());
                assert_eq!(post_chat(&gw.url, &body).await.status(), 200, "{case}");
                common::wait_for_zero_load(&gw.url).await;
                assert!(
                    common::recorded_chars(&gw.url, &shedder.url()).await > 0,
                    "{case}: served, the prompt is recorded"
                );
                gw.shutdown().await;
            }
        }
    }
}

/// The retry budget holds a disaggregated pool's retries too: every
/// prefill worker failing (vLLM, whose prefill goes first) sent each
/// request to every prefill worker, up to `max_retries + 1` times (here
/// both); with `retry.budget_percent` 50 and no floor, the retries of 20
/// requests are about 10, each request still answered with the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_budget_holds_a_disaggregated_pools_retries() {
    const REQUESTS: usize = 20;
    for (percent, least, most) in [
        (50, REQUESTS, REQUESTS * 3 / 2 + 1),
        (0, 2 * REQUESTS, 2 * REQUESTS),
    ] {
        let a = engine("prefill-a", WorkerRole::Prefill).await;
        let b = engine("prefill-b", WorkerRole::Prefill).await;
        let decode = engine("decode", WorkerRole::Decode).await;
        for e in [&a, &b] {
            e.set(Behaviour {
                fail: Some(500),
                ..Behaviour::default()
            });
        }
        let mut c = pd_config(PdProtocol::Vllm, &[(&a, None), (&b, None)], &[&decode]);
        c.retry.max_retries = 3;
        c.retry.initial_backoff_ms = 1;
        c.retry.max_backoff_ms = 1;
        c.retry.budget_percent = percent;
        c.retry.budget_min_per_sec = 0;
        c.circuit_breaker.enabled = false;
        let gw = started(c).await;
        for _ in 0..REQUESTS {
            let r = post_chat(&gw.url, &chat_body(false)).await;
            assert_eq!(r.status(), 500, "budget {percent}%");
        }
        let sent = a.bodies().len() + b.bodies().len();
        assert!(
            (least..=most).contains(&sent),
            "budget {percent}%: {sent} prefill attempts for {REQUESTS} requests"
        );
        let denied = series_value(&gw.url, "radixgate_retry_budget_exhausted_total").await;
        assert_eq!(denied > 0.0, percent > 0, "{denied}");
        gw.shutdown().await;
    }
}

/// A decode worker whose engine failed while its server still answers
/// streams every request a 200 that opens with an error event (vLLM and
/// SGLang: `data: {"error": {..., "code": 500}}`). The co-located loop
/// retries such a stream on another worker and counts it on the breaker
/// (`kind="stream_error"`); the pair's loop passed it to the client as
/// decode's answer, where another decode worker could serve, and counted
/// a success, so the broken decode worker stayed in rotation for good. A
/// refusal (code 400) is still the client's answer, tried once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_stream_that_opens_with_a_server_error_is_tried_on_another_pair() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let prefill = engine("prefill", WorkerRole::Prefill).await;
        let failing = engine("failing-decode", WorkerRole::Decode).await;
        let good = engine("decode", WorkerRole::Decode).await;
        failing.set(Behaviour {
            stream_error: Some(500),
            ..Behaviour::default()
        });
        let mut c = pd_config(protocol, &[(&prefill, None)], &[&failing, &good]);
        c.pd.decode_policy = PolicyConfig::named("round_robin").unwrap();
        c.circuit_breaker.failure_threshold = 1000;
        c.health.failure_threshold = 1000;
        let gw = started(c).await;
        for _ in 0..4 {
            let r = post_chat(&gw.url, &chat_body(true)).await;
            assert_eq!(r.status(), 200, "{protocol:?}");
            assert_eq!(header(&r, "x-radixgate-worker"), good.url(), "{protocol:?}");
            let text = r.text().await.unwrap();
            assert!(text.contains("from-decode-0"), "{protocol:?}: {text}");
        }
        assert!(!failing.bodies().is_empty(), "the failing decode was tried");
        let errors = common::metrics_text(&gw.url)
            .await
            .lines()
            .filter(|l| l.contains("kind=\"stream_error\"") && l.contains(&failing.url()))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        assert_eq!(errors, failing.bodies().len() as f64, "{protocol:?}");
        gw.shutdown().await;

        // A refusal under a 200: the client's answer, sent once.
        failing.set(Behaviour {
            stream_error: Some(400),
            ..Behaviour::default()
        });
        let mut c = pd_config(protocol, &[(&prefill, None)], &[&failing]);
        c.circuit_breaker.failure_threshold = 1;
        let gw = started(c).await;
        let before = failing.bodies().len();
        for _ in 0..2 {
            let r = post_chat(&gw.url, &chat_body(true)).await;
            assert_eq!(r.status(), 200, "{protocol:?}");
            let text = r.text().await.unwrap();
            assert!(text.contains("\"code\":400"), "{protocol:?}: {text}");
        }
        assert_eq!(
            failing.bodies().len() - before,
            2,
            "{protocol:?}: not retried"
        );
        gw.shutdown().await;
    }
}
