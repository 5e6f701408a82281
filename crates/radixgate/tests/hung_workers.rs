//! Issue 11, items 3, 8 and 9: hung and slow workers, rejected requests,
//! and the response path. Real gateways and workers on loopback; timeouts
//! are configured short so the tests finish, and no assertion is a
//! wall-clock bound.

mod common;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use common::*;
use futures::StreamExt as _;
use parking_lot::Mutex;
use radixgate::config::Config;
use radixgate_routing::{CacheAwareConfig, PolicyConfig};
use radixgate_sim::server::FaultConfig;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A small worker whose answer to every inference route is `answer`; it
/// records the headers it received.
struct TestWorker {
    url: String,
    headers: Arc<Mutex<Vec<HeaderMap>>>,
}

async fn test_worker<F>(answer: F) -> TestWorker
where
    F: Fn() -> axum::response::Response + Clone + Send + Sync + 'static,
{
    let headers = Arc::new(Mutex::new(Vec::new()));
    let seen = headers.clone();
    let handler = move |h: HeaderMap| {
        let answer = answer.clone();
        let seen = seen.clone();
        async move {
            seen.lock().push(h);
            answer()
        }
    };
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "scripted"}]})) }),
        )
        .route("/v1/chat/completions", post(handler.clone()))
        .route("/generate", post(handler));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    TestWorker { url, headers }
}

fn json_response(status: u16, body: Value) -> axum::response::Response {
    axum::response::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn ok_json() -> axum::response::Response {
    json_response(200, json!({"choices": [{"message": {"content": "hi"}}]}))
}

/// A chat request for the scripted and test workers' model.
fn scripted_chat(text: &str, stream: bool) -> Value {
    let mut body = chat(text, stream);
    body["model"] = json!("scripted");
    body
}

async fn metric(gw: &str, name: &str, worker: &str) -> Option<f64> {
    let text = metrics_text(gw).await;
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(&format!("worker=\"{worker}\"")))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A worker that answers and one that hangs every request (its `/health`
/// fine), and a config for the two that sends every other request (or
/// first attempt) to the hung one and opens a breaker, for good, after 2
/// failures.
async fn good_and_hung() -> (SimWorker, SimWorker, Config) {
    let good = sim_worker(fast_worker()).await;
    let hung = sim_worker(fast_worker()).await;
    hung.set_faults(FaultConfig {
        hang: true,
        ..FaultConfig::default()
    });
    let mut c = config(&[&good.url, &hung.url]);
    c.routing = PolicyConfig::RoundRobin(Default::default());
    c.circuit_breaker.failure_threshold = 2;
    c.circuit_breaker.timeout_duration_secs = 3600;
    (good, hung, c)
}

/// Item 3: a hung worker (accepts, never answers) no longer swallows
/// requests: each attempt at it times out before its first byte, is
/// retried on the other worker, and counts as the hung worker's failure,
/// so its breaker opens although its `/health` still answers.
#[tokio::test]
async fn hung_worker_requests_are_retried_elsewhere_and_its_breaker_opens() {
    let (good, hung, mut c) = good_and_hung().await;
    c.retry.first_byte_timeout_secs = 1;
    c.retry.non_stream_timeout_secs = 1;
    // Without a first-byte timeout this is all that ends a hung attempt.
    c.server.request_timeout_secs = 60;
    let gw = gateway_ready(c, 2).await;
    for i in 0..8 {
        let r = post_chat(&gw.url, &chat(&format!("hung test {i}"), i % 2 == 0)).await;
        assert_eq!(r.status(), 200, "request {i}");
        assert_eq!(r.headers()["x-radixgate-worker"], good.url.as_str());
        r.bytes().await.unwrap();
    }
    wait_until("the hung worker's breaker is open", || async {
        metric(&gw.url, "radixgate_circuit_breaker_state", &hung.url).await == Some(1.0)
    })
    .await;
    let text = metrics_text(&gw.url).await;
    assert!(
        text.contains("radixgate_retries_total{reason=\"timeout\"}"),
        "{text}"
    );
    gw.shutdown().await;
}

/// A whole answer waits on a hung worker while two streams follow it
/// (round robin: the first and third requests go to the hung worker, the
/// third times out after its 1 s first-byte timeout). Without a way to give
/// up on the waiting attempt, the request timeout (30 s) would end it with
/// a 504; its own first-byte timeout is an hour. `edit` sets the breaker.
async fn whole_answer_waiting_on_a_hung_worker(edit: impl FnOnce(&mut Config), pause: Duration) {
    let good = sim_worker(fast_worker()).await;
    let hung = sim_worker(fast_worker()).await;
    hung.set_faults(FaultConfig {
        hang: true,
        ..FaultConfig::default()
    });
    let mut c = config(&[&hung.url, &good.url]);
    c.routing = PolicyConfig::RoundRobin(Default::default());
    c.retry.first_byte_timeout_secs = 1;
    c.retry.non_stream_timeout_secs = 3600;
    c.server.request_timeout_secs = 30;
    edit(&mut c);
    let gw = gateway_ready(c, 2).await;
    let waiting = tokio::spawn({
        let url = gw.url.clone();
        async move { post_chat(&url, &chat("a whole answer", false)).await }
    });
    // The whole answer must be routed first, to the hung worker.
    wait_until("the whole answer in flight", || async {
        total_load(&gw.url).await == 1
    })
    .await;
    tokio::time::sleep(pause).await;
    for i in 0..2 {
        let r = post_chat(&gw.url, &chat(&format!("stream {i}"), true)).await;
        assert_eq!(r.status(), 200, "stream {i}");
        r.bytes().await.unwrap();
    }
    let r = waiting.await.unwrap();
    assert_eq!(r.status(), 200, "the waiting request was answered");
    assert_eq!(r.headers()["x-radixgate-worker"], good.url.as_str());
    let text = metrics_text(&gw.url).await;
    assert!(
        text.contains("radixgate_retries_total{reason=\"worker_lost\"}"),
        "{text}"
    );
    gw.shutdown().await;
}

/// Item 3 (found by the soak): requests already waiting on a worker that
/// hangs are not each held to their own first-byte timeout. A whole
/// (non-streamed) answer may legitimately take minutes, so its timeout is
/// long; when a stream's short timeout opens the hung worker's breaker
/// meanwhile, the waiting request is given up on and retried on the other
/// worker, well inside its own timeout.
#[tokio::test]
async fn requests_waiting_on_a_worker_whose_breaker_opens_move_on() {
    let open_at_once = |c: &mut Config| {
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.timeout_duration_secs = 3600;
    };
    whole_answer_waiting_on_a_hung_worker(open_at_once, Duration::ZERO).await;
}

/// Item 3 (found by the second soak): a worker may hang some requests
/// forever while it answers others, so its breaker never opens. A request
/// that has waited on it as long as the streams' first-byte timeout, once
/// another request there has timed out, is given up on and retried.
#[tokio::test]
async fn requests_waiting_on_a_worker_that_hangs_others_move_on() {
    let never_open = |c: &mut Config| {
        c.circuit_breaker.failure_threshold = 100;
        c.outlier_detection.enabled = false;
    };
    // The whole answer waits past the streams' timeout (1 s) first.
    whole_answer_waiting_on_a_hung_worker(never_open, Duration::from_millis(1200)).await;
}

/// A request timeout no longer than the streams' first-byte timeout (here
/// 1 s against 60 s; or one the queue's wait used up) ends every attempt
/// at a hung worker before that timeout can. Each was a 504 counted on
/// nothing (no breaker failure, no outlier sample, no upstream error), so
/// a worker that answers `/health` but hangs every request stayed in
/// rotation for good, and every request routed to it timed out. A stream
/// the request timeout ends before its first token, at a worker that gave
/// no other attempt a first byte meanwhile, is now that worker's timeout,
/// as its first-byte timeout would have been: its breaker opens, and the
/// requests go to the worker that answers.
#[tokio::test]
async fn a_hung_worker_only_the_request_timeout_meets_is_taken_out_of_rotation() {
    let (good, hung, mut c) = good_and_hung().await;
    c.retry.first_byte_timeout_secs = 60;
    c.server.request_timeout_secs = 1;
    let gw = gateway_ready(c, 2).await;
    let mut timed_out = 0;
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat(&format!("request timeout {i}"), true)).await;
        let status = r.status();
        let body = r.text().await.unwrap();
        assert!(
            status == 200 || status == 504,
            "request {i}: {status} {body}"
        );
        timed_out += usize::from(status == 504);
    }
    assert_eq!(timed_out, 2);
    wait_until("the hung worker's breaker is open", || async {
        metric(&gw.url, "radixgate_circuit_breaker_state", &hung.url).await == Some(1.0)
    })
    .await;
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat(&format!("after {i}"), true)).await;
        assert_eq!(r.status(), 200, "request {i} after");
        assert_eq!(r.headers()["x-radixgate-worker"], good.url.as_str());
        r.bytes().await.unwrap();
    }
    let text = metrics_text(&gw.url).await;
    let series = format!(
        "radixgate_upstream_errors_total{{worker=\"{}\",kind=\"timeout\"}} 2",
        hung.url
    );
    assert!(text.lines().any(|l| l == series), "{series}\n{text}");
    gw.shutdown().await;
}

/// Item 3: an event stream's head alone is not a first byte. A worker that
/// sends the head and then nothing is hung all the same, and the request
/// goes to another worker before anything reached the client.
#[tokio::test]
async fn head_without_a_first_chunk_is_retried_elsewhere() {
    let silent = stalling_worker(vec![]).await;
    let good = scripted_worker(vec!["data: {\"n\":1}\n\n", "data: [DONE]\n\n"]).await;
    let mut c = config(&[&silent.url, &good.url]);
    c.routing = PolicyConfig::RoundRobin(Default::default());
    c.retry.first_byte_timeout_secs = 1;
    let gw = gateway_ready(c, 2).await;
    for i in 0..4 {
        let r = post_chat(&gw.url, &scripted_chat(&format!("silent {i}"), true)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-radixgate-worker"], good.url.as_str());
        assert!(r.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    }
    gw.shutdown().await;
}

/// A Responses stream's preamble (`response.created`, sent before the
/// prompt is prefilled) is not a first byte either, nor is a comment: a
/// worker that sends one and then hangs (its engine stuck behind a live
/// API server) is hung, and the request goes to another worker before
/// anything reached the client. Before, the preamble went out at once and
/// the client waited the stall timeout for an error event.
#[tokio::test]
async fn a_preamble_without_a_first_token_is_retried_elsewhere() {
    const PREAMBLE: &str = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"response\":{\"output\":[]}}\n\n",
        "event: response.in_progress\n",
        "data: {\"type\":\"response.in_progress\",\"response\":{}}\n\n",
    );
    const TOKEN: &str = concat!(
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n",
    );
    let hung = stalling_worker(vec![PREAMBLE]).await;
    let behind_comment = stalling_worker(vec![": keep-alive\n\n"]).await;
    let good = scripted_worker(vec![PREAMBLE, TOKEN]).await;
    let mut c = config(&[&hung.url, &behind_comment.url, &good.url]);
    c.routing = PolicyConfig::RoundRobin(Default::default());
    c.retry.first_byte_timeout_secs = 1;
    c.retry.stall_timeout_secs = 3;
    let gw = gateway_ready(c, 3).await;
    for i in 0..3 {
        let body = json!({"model": "scripted", "input": format!("hung {i}"), "stream": true});
        let r = client()
            .post(format!("{}/v1/responses", gw.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let worker = r.headers()["x-radixgate-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        let text = r.text().await.unwrap();
        assert_eq!(worker, good.url, "{i}: {text}");
        assert_eq!(text, format!("{PREAMBLE}{TOKEN}"), "{i}");
    }
    gw.shutdown().await;
}

/// Item 3: a stream that goes silent past the stall timeout ends with an
/// explicit SSE error event, and counts as the worker's failure.
#[tokio::test]
async fn stalled_stream_ends_with_an_error_event() {
    let w = stalling_worker(vec!["data: {\"n\":1}\n\n"]).await;
    let mut c = config(&[&w.url]);
    c.retry.stall_timeout_secs = 1;
    let gw = gateway_ready(c, 1).await;
    let r = post_chat(&gw.url, &scripted_chat("stall", true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("data: {\"n\":1}\n\n"), "{text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let event: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(event["error"]["code"], "stream_stalled", "{text}");
    assert_eq!(event["error"]["type"], "upstream_error");
    assert!(!text.contains("[DONE]"));
    wait_until("the stall counted as the worker's failure", || async {
        metrics_text(&gw.url).await.contains(&format!(
            "radixgate_upstream_errors_total{{worker=\"{}\",kind=\"stream_broken\"}} 1",
            w.url
        ))
    })
    .await;
    gw.shutdown().await;
}

/// Round robin over `workers`, with outlier detection that judges after
/// three samples, each second, at twice the median and 200 ms above it,
/// ejecting for `ejection_secs`.
fn eager_outliers(workers: &[&str], ejection_secs: u64) -> Config {
    let mut c = config(workers);
    c.routing = PolicyConfig::RoundRobin(Default::default());
    let o = &mut c.outlier_detection;
    o.interval_secs = 1;
    o.min_samples = 3;
    o.min_gap_ms = 200;
    o.latency_factor = 2.0;
    o.base_ejection_secs = ejection_secs;
    o.max_ejection_percent = 50;
    c
}

/// A fast and a slow worker (400 ms more to each first byte) behind a
/// gateway with eager outlier detection (`ejection_secs` a time), once the
/// slow one is ejected.
async fn slow_one_ejected(ejection_secs: u64) -> (SimWorker, SimWorker, Gateway) {
    slow_one_ejected_in(ejection_secs, |_| {}).await
}

/// [`slow_one_ejected`], with `tweak` applied to the gateway's config.
async fn slow_one_ejected_in(
    ejection_secs: u64,
    tweak: impl FnOnce(&mut Config),
) -> (SimWorker, SimWorker, Gateway) {
    let fast = sim_worker(fast_worker()).await;
    let slow = sim_worker(fast_worker()).await;
    slow.set_faults(FaultConfig {
        latency_ms: 400,
        ..FaultConfig::default()
    });
    let mut c = eager_outliers(&[&fast.url, &slow.url], ejection_secs);
    tweak(&mut c);
    let gw = gateway_ready(c, 2).await;
    for i in 0..8 {
        // Streamed: the first token's wait is what outlier detection
        // samples of a generating API.
        let r = post_chat(&gw.url, &chat(&format!("outlier {i}"), true)).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    wait_until("the slow worker is ejected", || async {
        metric(&gw.url, "radixgate_outlier_ejected", &slow.url).await == Some(1.0)
    })
    .await;
    (fast, slow, gw)
}

/// A Responses API stream opens with `response.created` at once, before
/// the prompt is prefilled: its first byte says nothing of how quick its
/// worker is. A worker whose prefill is far slower than its peer's (its
/// preamble as quick) is sampled at its first token, and ejected, as it
/// would be serving chat streams. Sampled at the preamble, every worker
/// read as equally instant: a slow one serving these APIs was never
/// ejected, and one serving chat beside peers serving them was judged
/// against their instant preambles.
#[tokio::test]
async fn a_worker_slow_behind_its_preamble_is_ejected() {
    let fast = sim_worker(fast_worker()).await;
    let mut slow_prefill = fast_worker();
    // 10 ms a prompt token (the ceiling): about half a second to prefill
    // each prompt below, its preamble sent at once.
    slow_prefill.engine.timing.token_us = 10_000.0;
    let slow = sim_worker(slow_prefill).await;
    let gw = gateway_ready(eager_outliers(&[&fast.url, &slow.url], 300), 2).await;
    for i in 0..8 {
        let body = json!({"model": radixgate_sim::server::DEFAULT_MODEL,
            "input": format!("outlier behind a preamble {i}: {}", "padding ".repeat(40)),
            "max_output_tokens": 2, "stream": true});
        let r = client()
            .post(format!("{}/v1/responses", gw.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let events = r.text().await.unwrap();
        assert!(events.starts_with("event: response.created"), "{events}");
    }
    wait_until("the slow worker is ejected", || async {
        metric(&gw.url, "radixgate_outlier_ejected", &slow.url).await == Some(1.0)
    })
    .await;
    assert_eq!(
        metric(&gw.url, "radixgate_outlier_ejected", &fast.url).await,
        Some(0.0)
    );
    gw.shutdown().await;
}

/// Item 3: a worker far slower than its peers (its `/health` fine) is
/// ejected by outlier detection, and returns when its ejection is over.
#[tokio::test]
async fn slow_worker_is_ejected_and_returns() {
    let (fast, slow, gw) = slow_one_ejected(2).await;
    assert_eq!(
        metric(&gw.url, "radixgate_outlier_ejections_total", &slow.url).await,
        Some(1.0)
    );
    // Ejected: everything goes to the fast worker.
    assert_all_served_by(&gw.url, &fast.url, 4, "while ejected").await;
    wait_until("the slow worker returns", || async {
        metric(&gw.url, "radixgate_outlier_ejected", &slow.url).await == Some(0.0)
    })
    .await;
    assert_eq!(
        metric(&gw.url, "radixgate_outlier_ejected", &fast.url).await,
        Some(0.0)
    );
    gw.shutdown().await;
}

/// An ejected worker is slow, not broken: when its peers go (here the
/// only one fails its health checks), it returns at the next evaluation
/// rather than at the end of its ejection, so the pool is never left
/// empty while a worker that answers is out. Before, the model's requests
/// were answered 503 for the rest of the ejection (here five minutes).
#[tokio::test]
async fn an_ejected_worker_returns_when_its_peers_are_gone() {
    let (fast, slow, gw) = slow_one_ejected(300).await;
    // `/workers` says which is ejected (it read healthy and nothing more).
    let listed = workers(&gw.url).await;
    let ejected = |url: &str| listed.iter().find(|w| w["url"] == url).unwrap()["ejected"].clone();
    assert_eq!(ejected(&slow.url), true, "{listed:?}");
    assert_eq!(ejected(&fast.url), false, "{listed:?}");
    fast.set_faults(FaultConfig {
        unhealthy: true,
        ..FaultConfig::default()
    });
    wait_until("the slow worker serves again", || async {
        let r = post_chat(&gw.url, &chat("only the slow one is left", true)).await;
        r.status() == 200 && r.headers()["x-radixgate-worker"] == slow.url.as_str()
    })
    .await;
    wait_until("the slow worker reads returned", || async {
        metric(&gw.url, "radixgate_outlier_ejected", &slow.url).await == Some(0.0)
    })
    .await;
    gw.shutdown().await;
}

/// An ejected worker is also the fallback of a request that finds no
/// other worker: here the only other one refuses the connection and its
/// breaker (threshold one) opens on that attempt. The retry goes to the
/// ejected worker at once, as do the requests after it, rather than
/// waiting for outlier detection's next evaluation. Before, that request
/// and every one until the evaluation (a second here, ten by default)
/// were answered 503.
#[tokio::test]
async fn a_request_left_with_only_an_ejected_worker_is_served_by_it() {
    let (fast, slow, gw) = slow_one_ejected_in(300, |c| {
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.timeout_duration_secs = 3600;
        // Retried at once: nothing waits for the next evaluation.
        c.retry.initial_backoff_ms = 0;
        c.retry.max_backoff_ms = 0;
    })
    .await;
    fast.set_faults(FaultConfig {
        refuse: true,
        ..FaultConfig::default()
    });
    for i in 0..3 {
        let r = post_chat(&gw.url, &chat(&format!("the fast one refuses {i}"), true)).await;
        let status = r.status();
        let worker = r.headers().get("x-radixgate-worker").cloned();
        let body = r.text().await.unwrap();
        assert_eq!(status, 200, "request {i}: {body}");
        assert_eq!(worker.unwrap(), slow.url.as_str(), "request {i}");
        if i == 0 {
            // Returned now, and the gauge says so (not at the evaluation).
            assert_eq!(
                metric(&gw.url, "radixgate_outlier_ejected", &slow.url).await,
                Some(0.0)
            );
        }
    }
    gw.shutdown().await;
}

/// A worker that sheds every request at once (429: a TGI past its
/// `max_concurrent_requests`, a proxy's rate limit) answers nothing, so
/// its quick refusals say nothing of how fast it serves. Taken as samples,
/// they made it the quickest worker of the pool and its one working peer,
/// serving everything at its normal pace, an outlier: ejected, which left
/// every request to the worker that refuses them (429 to the clients).
#[tokio::test]
async fn a_worker_that_sheds_at_once_gets_no_working_peer_ejected() {
    let working = sim_worker(fast_worker()).await;
    working.set_faults(FaultConfig {
        latency_ms: 400,
        ..FaultConfig::default()
    });
    let model = get_json(&working.url, "/v1/models").await["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(move || {
                let model = model.clone();
                async move { axum::Json(json!({"data": [{"id": model}]})) }
            }),
        )
        .route(
            "/v1/chat/completions",
            post(|| async {
                json_response(429, json!({"error": {"message": "too many requests"}}))
            }),
        );
    let (shedding, _stop) = serve_app(app).await;
    let c = eager_outliers(&[&shedding, &working.url], 300);
    let gw = gateway_ready(c, 2).await;
    // Round robin: half go to the shedding worker first, and are retried
    // on the working one.
    for i in 0..8 {
        let r = post_chat(&gw.url, &chat(&format!("shed {i}"), true)).await;
        assert_eq!(r.status(), 200, "request {i}");
        r.bytes().await.unwrap();
    }
    // Past two evaluations (one a second).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        metric(&gw.url, "radixgate_outlier_ejected", &working.url).await,
        Some(0.0)
    );
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat(&format!("after {i}"), true)).await;
        assert_eq!(r.status(), 200, "request {i} after the evaluations");
        r.bytes().await.unwrap();
    }
    gw.shutdown().await;
}

/// The requests waiting on a worker when it is ejected as an outlier move
/// to a quicker worker, but the slow worker failed none of them: its
/// breaker counts none. Counted as its failures (with a threshold of
/// one), they opened the breaker of a worker that never failed a
/// request, which then went on reading open on the dashboard and in
/// alerts and, after the ejection, came back only through probes.
///
/// The slow worker is judged only once a request waits on it: a long
/// whole answer (no first byte until its last token, about 40 s there)
/// is sent before the stream that brings its samples to `min_samples`,
/// so the evaluation that ejects it always finds that request to move.
/// (Before, it could be ejected before anything waited on it, and the
/// test passed without moving a request.)
#[tokio::test]
async fn requests_moved_off_an_ejected_worker_open_no_breaker() {
    let fast = sim_worker(fast_worker()).await;
    let mut slow_engine = fast_worker();
    slow_engine.engine.timing.step_base_us = 20_000.0;
    let slow = sim_worker(slow_engine).await;
    slow.set_faults(FaultConfig {
        latency_ms: 400,
        ..FaultConfig::default()
    });
    let mut c = eager_outliers(&[&fast.url, &slow.url], 300);
    c.outlier_detection.min_samples = 4;
    c.circuit_breaker.failure_threshold = 1;
    c.circuit_breaker.timeout_duration_secs = 3600;
    let gw = gateway_ready(c, 2).await;
    // Round robin: each pair of requests sent at once puts one on each
    // worker.
    let send = |body: serde_json::Value| {
        let url = gw.url.clone();
        tokio::spawn(async move {
            let r = post_chat(&url, &body).await;
            let status = r.status();
            r.bytes().await.unwrap();
            status
        })
    };
    let pair = |tag: &str, body: &dyn Fn(&str) -> serde_json::Value| {
        [
            send(body(&format!("{tag} a"))),
            send(body(&format!("{tag} b"))),
        ]
    };
    let sample = |text: &str| chat(text, true);
    let long_whole = |text: &str| {
        let mut body = chat(text, false);
        body["max_tokens"] = json!(2_000);
        body
    };
    let decided =
        || async { series_sum(&gw.url, "radixgate_routing_decisions_total").await as usize };
    // Three samples of the slow worker, one short of being judged.
    for i in 0..3 {
        for r in pair(&format!("sample {i}"), &sample) {
            assert_eq!(r.await.unwrap(), 200);
        }
    }
    // A request that waits on the slow worker...
    let waiting = pair("waiting", &long_whole);
    wait_until("the waiting pair routed", || async { decided().await == 8 }).await;
    // ... while its fourth sample makes it judged, and ejected.
    for r in pair("fourth sample", &sample) {
        assert_eq!(r.await.unwrap(), 200);
    }
    for r in waiting {
        assert_eq!(r.await.unwrap(), 200, "the waiting request was moved");
    }
    assert_eq!(
        metric(&gw.url, "radixgate_outlier_ejected", &slow.url).await,
        Some(1.0)
    );
    assert_eq!(
        series_value(&gw.url, "radixgate_retries_total{reason=\"moved\"}").await,
        1.0
    );
    // Past an upkeep tick, which publishes the breaker metrics.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        metric(&gw.url, "radixgate_circuit_breaker_state", &slow.url).await,
        Some(0.0)
    );
    assert_eq!(
        metric(
            &gw.url,
            "radixgate_circuit_breaker_transitions_total",
            &slow.url
        )
        .await,
        Some(0.0)
    );
    gw.shutdown().await;
}

/// A worker given long whole (non-streamed) generations is not slow: its
/// first byte waits for the whole decode, which the requests' lengths
/// decide. Cache-aware routing keeps a client's long generations on one
/// worker; outlier detection must not eject it for that, while the other
/// worker answers short streams at once.
#[tokio::test]
async fn long_whole_generations_do_not_make_their_worker_an_outlier() {
    let mut paced = fast_worker();
    paced.engine.timing.step_base_us = 2_000.0;
    let a = sim_worker(paced.clone()).await;
    let b = sim_worker(paced).await;
    let c = eager_outliers(&[&a.url, &b.url], 30);
    let gw = gateway_ready(c, 2).await;
    // Round robin alternates: one worker gets every long whole answer
    // (300 tokens, about 0.6 s), the other every short stream.
    let mut long_on = None;
    for i in 0..8 {
        let body = if i % 2 == 0 {
            let mut long = chat(&format!("a long report {i}"), false);
            long["max_tokens"] = serde_json::json!(300);
            long
        } else {
            chat(&format!("a quick stream {i}"), true)
        };
        let r = post_chat(&gw.url, &body).await;
        assert_eq!(r.status(), 200);
        let worker = r.headers()["x-radixgate-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        if i % 2 == 0 {
            assert!(long_on.get_or_insert(worker.clone()) == &worker);
        }
        r.bytes().await.unwrap();
    }
    // Three evaluations after the samples.
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await;
    for worker in [&a.url, &b.url] {
        assert_eq!(
            metric(&gw.url, "radixgate_outlier_ejections_total", worker)
                .await
                .unwrap_or(0.0),
            0.0,
            "{worker} (long answers on {long_on:?}) was ejected"
        );
    }
    gw.shutdown().await;
}

/// Item 8: a request the worker rejects (413 here) leaves the tree as it
/// was: the same prompt again finds no match.
#[tokio::test]
async fn rejected_requests_leave_the_tree_as_it_was() {
    let w = test_worker(|| json_response(413, json!({"error": {"message": "prompt is too long"}})))
        .await;
    let c = config(&[&w.url]);
    let gw = gateway_ready(c, 1).await;
    let prompt = "a long document that this worker will refuse ".repeat(50);
    for round in 0..2 {
        let r = post_chat(&gw.url, &scripted_chat(&prompt, false)).await;
        assert_eq!(r.status(), 413);
        let decision = r.headers()["x-radixgate-decision"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            decision.contains("match=0.000"),
            "round {round}: {decision}"
        );
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["message"], "prompt is too long");
    }
    gw.shutdown().await;
}

/// Item 8: the text routed per request is capped: a huge prompt puts at
/// most `max_routing_text_chars` characters into the tree.
#[tokio::test]
async fn huge_prompts_are_capped_before_the_tree() {
    let w = test_worker(ok_json).await;
    let mut c = config(&[&w.url]);
    c.routing = PolicyConfig::CacheAware(CacheAwareConfig {
        max_routing_text_chars: 1000,
        ..CacheAwareConfig::default()
    });
    let gw = gateway_ready(c, 1).await;
    let r = post_chat(&gw.url, &scripted_chat(&"x".repeat(200_000), false)).await;
    assert_eq!(r.status(), 200);
    wait_until("the tree gauge shows the insert", || async {
        metric(&gw.url, "radixgate_tree_characters", &w.url)
            .await
            .is_some_and(|n| n > 0.0)
    })
    .await;
    assert_eq!(
        metric(&gw.url, "radixgate_tree_characters", &w.url).await,
        Some(1000.0)
    );
    gw.shutdown().await;
}

/// Item 9: headers the client's `Connection` header names do not reach the
/// worker (nor the worker's to the client), and `X-Forwarded-For` and
/// `Forwarded` get the client's address appended.
#[tokio::test]
async fn connection_headers_are_stripped_and_forwarding_headers_appended() {
    let w = test_worker(|| {
        let mut r = ok_json();
        r.headers_mut()
            .insert("connection", "x-worker-private".parse().unwrap());
        r.headers_mut()
            .insert("x-worker-private", "1".parse().unwrap());
        r
    })
    .await;
    let c = config(&[&w.url]);
    let gw = gateway_ready(c, 1).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("connection", "keep-alive, X-Hop-Secret")
        .header("x-hop-secret", "do not forward")
        .header("x-forwarded-for", "203.0.113.7")
        .header("forwarded", "for=203.0.113.7")
        .header("x-kept", "yes")
        .json(&scripted_chat("headers", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-worker-private").is_none());
    r.bytes().await.unwrap();
    let seen = w.headers.lock().pop().unwrap();
    assert!(seen.get("x-hop-secret").is_none(), "{seen:?}");
    assert_eq!(seen["x-kept"], "yes");
    assert_eq!(seen["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(seen["forwarded"], "for=203.0.113.7, for=127.0.0.1");
    gw.shutdown().await;
}

/// Item 9: when the shutdown grace period runs out mid-stream, the stream
/// ends with an SSE error event saying so instead of being cut silently.
#[tokio::test]
async fn grace_expiry_mid_stream_ends_with_an_error_event() {
    let w = stalling_worker(vec!["data: {\"n\":1}\n\n"]).await;
    let mut c = config(&[&w.url]);
    c.server.shutdown_grace_period_secs = 1;
    c.retry.stall_timeout_secs = 0;
    let gw = gateway_ready(c, 1).await;
    let r = post_chat(&gw.url, &scripted_chat("grace", true)).await;
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(first, Bytes::from_static(b"data: {\"n\":1}\n\n"));
    gw.stop.cancel();
    let mut rest = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        rest.extend_from_slice(&chunk);
    }
    let rest = String::from_utf8(rest).unwrap();
    assert!(rest.starts_with("data: {\"error\""), "{rest:?}");
    assert!(rest.contains("\"code\":\"shutting_down\""), "{rest}");
    gw.task.await.unwrap().unwrap();
}

/// Item 9: a worker that answers a `stream: true` request with JSON and
/// breaks off gets no SSE text appended to its JSON: the body is cut.
#[tokio::test]
async fn broken_json_answer_to_a_stream_request_gets_no_sse_text() {
    let w = test_worker(|| {
        let pieces = futures::stream::iter([
            Ok(Bytes::from_static(b"{\"error\": {\"message\": \"par")),
            Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "died")),
        ])
        .then(|item| async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            item
        });
        axum::response::Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from_stream(pieces))
            .unwrap()
    })
    .await;
    let c = config(&[&w.url]);
    let gw = gateway_ready(c, 1).await;
    let r = post_chat(&gw.url, &scripted_chat("json on a stream", true)).await;
    assert_eq!(r.status(), 200);
    let mut got = Vec::new();
    let mut body = r.bytes_stream();
    let mut broke = false;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(c) => got.extend_from_slice(&c),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    let got = String::from_utf8_lossy(&got);
    assert!(!got.contains("data:"), "SSE text appended to JSON: {got}");
    assert!(broke, "the client must see the body break off: {got}");
    gw.shutdown().await;
}

/// A worker that compresses its event stream anyway (the router asks for
/// no encoding) and breaks off: the error event, plain text, is not
/// appended to the compressed bytes, where the client's decoder would
/// choke on it; the body is cut, as a JSON one is.
#[tokio::test]
async fn a_broken_compressed_stream_gets_no_plain_text_appended() {
    // A gzip header and one stored (uncompressed) deflate block, not the
    // last: a valid start of a gzip body.
    const EVENT: &[u8] = b"data: {\"n\":1}\n\n";
    let mut start = vec![0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 0xff, 0x00];
    let len = EVENT.len() as u16;
    start.extend_from_slice(&len.to_le_bytes());
    start.extend_from_slice(&(!len).to_le_bytes());
    start.extend_from_slice(EVENT);
    let sent = Bytes::from(start);
    let w = test_worker(move || {
        let pieces = futures::stream::iter([
            Ok(sent.clone()),
            Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "died")),
        ])
        .then(|item| async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            item
        });
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .header("content-encoding", "gzip")
            .body(Body::from_stream(pieces))
            .unwrap()
    })
    .await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let r = post_chat(&gw.url, &scripted_chat("gzip", true)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-encoding"], "gzip");
    let mut got = Vec::new();
    let mut body = r.bytes_stream();
    let mut broke = false;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(c) => got.extend_from_slice(&c),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    assert!(
        got.len() == 11 + 4 + EVENT.len() && got.ends_with(EVENT),
        "bytes after the worker's: {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(broke, "the client must see the body break off");
    wait_until("the break counted as the worker's failure", || async {
        metrics_text(&gw.url).await.contains(&format!(
            "radixgate_upstream_errors_total{{worker=\"{}\",kind=\"stream_broken\"}} 1",
            w.url
        ))
    })
    .await;
    gw.shutdown().await;
}

/// A worker's 200 with an empty body (`content-length: 0`) is a complete
/// answer: hyper drops such a body unpolled once its head is written, and
/// that is its end, not a client gone.
#[tokio::test]
async fn an_empty_answer_ends_complete() {
    let w = test_worker(|| {
        axum::response::Response::builder()
            .header("content-type", "application/json")
            .body(Body::empty())
            .unwrap()
    })
    .await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let data = || async {
        let data: Value = client()
            .get(format!("{}/dashboard/data", gw.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        data
    };
    // The status page lists answers while someone watches it.
    data().await;
    let r = post_chat(&gw.url, &scripted_chat("empty", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 0);
    let ends = Arc::new(Mutex::new(Vec::new()));
    wait_until("the answer is listed", || async {
        let recent = data().await["recent"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut ends = ends.lock();
        ends.extend(recent.iter().map(|a| a["end"].clone()));
        !ends.is_empty()
    })
    .await;
    assert_eq!(*ends.lock(), [json!("complete")]);
    gw.shutdown().await;
}

/// Item 9: when every worker answers 5xx, the client's error names the
/// worker's own reason, not only its status.
#[tokio::test]
async fn the_workers_5xx_message_reaches_the_client() {
    let answer = || json_response(500, json!({"error": {"message": "CUDA out of memory"}}));
    let a = test_worker(answer).await;
    let b = test_worker(answer).await;
    let mut c = config(&[&a.url, &b.url]);
    c.circuit_breaker.enabled = false;
    let gw = gateway_ready(c, 2).await;
    let r = post_chat(&gw.url, &scripted_chat("oom", false)).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR.as_u16());
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("CUDA out of memory"), "{body}");
    assert_eq!(body["error"]["type"], "upstream_error");
    gw.shutdown().await;
}

/// An ejected worker that is removed reads not ejected: an alert on
/// ejected workers does not go on firing for one that is gone.
#[tokio::test]
async fn a_removed_outliers_ejected_gauge_does_not_stay_up() {
    let fast = sim_worker(fast_worker()).await;
    let slow = sim_worker(fast_worker()).await;
    slow.set_faults(FaultConfig {
        latency_ms: 400,
        ..FaultConfig::default()
    });
    let c = eager_outliers(&[&fast.url, &slow.url], 300);
    let gw = gateway_ready(c, 2).await;
    for i in 0..8 {
        let r = post_chat(&gw.url, &chat(&format!("outlier {i}"), true)).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    wait_until("the slow worker is ejected", || async {
        metric(&gw.url, "radixgate_outlier_ejected", &slow.url).await == Some(1.0)
    })
    .await;
    let r = client()
        .delete(format!("{}/workers?url={}", gw.url, slow.url))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    wait_until("the removed worker's ejected gauge at 0", || async {
        metric(&gw.url, "radixgate_outlier_ejected", &slow.url).await == Some(0.0)
    })
    .await;
    gw.shutdown().await;
}
