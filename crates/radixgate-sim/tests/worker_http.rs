//! Integration tests of `radixgate worker` over loopback with a real HTTP
//! client: every endpoint, streaming and not, prefix hits as a client sees
//! them, and each fault knob as a client observes it.
//!
//! No test asserts an upper bound on time. Waits for asynchronous effects
//! (a listener reopening, a cancelled request leaving the batch) poll with
//! a generous deadline that only turns a hang into a failure.

use std::time::{Duration, Instant};

use radixgate_sim::engine::EngineConfig;
use radixgate_sim::server::{
    FaultConfig, WORKER_HEADER, WorkerConfig, WorkerHandle, start, start_group,
};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

struct Worker {
    handle: WorkerHandle,
    base: String,
    _stop: tokio_util::sync::DropGuard,
}

fn fast_config() -> WorkerConfig {
    // Small, fast steps so tests run quickly; the logic is the same.
    let mut c = WorkerConfig {
        engine: EngineConfig {
            kv_capacity_tokens: 100_000,
            ..EngineConfig::default()
        },
        ..WorkerConfig::default()
    };
    c.engine.timing.step_base_us = 200.0;
    c.engine.timing.token_us = 1.0;
    c
}

async fn spawn(config: WorkerConfig) -> Worker {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let handle = start(listener, config, stop.clone()).await.unwrap();
    let base = format!("http://{}", handle.addr());
    Worker {
        handle,
        base,
        _stop: stop.drop_guard(),
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().build().unwrap()
}

async fn post(base: &str, path: &str, body: Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let v = r.json().await.unwrap_or(Value::Null);
    (status, headers, v)
}

async fn get_json(base: &str, path: &str) -> Value {
    client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Reads an SSE body: the JSON events and whether it ended with `[DONE]`.
async fn sse(
    base: &str,
    path: &str,
    body: Value,
) -> Result<(Vec<Value>, bool), (Vec<Value>, String)> {
    let mut r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut buf = String::new();
    let mut events = Vec::new();
    let mut done = false;
    loop {
        match r.chunk().await {
            Ok(Some(c)) => buf.push_str(std::str::from_utf8(&c).unwrap()),
            Ok(None) => break,
            Err(e) => {
                parse_events(&mut buf, &mut events, &mut done);
                return Err((events, e.to_string()));
            }
        }
        parse_events(&mut buf, &mut events, &mut done);
    }
    Ok((events, done))
}

fn parse_events(buf: &mut String, events: &mut Vec<Value>, done: &mut bool) {
    while let Some(end) = buf.find("\n\n") {
        let ev: String = buf.drain(..end + 2).collect();
        let data = ev.trim().strip_prefix("data: ").expect("data: event");
        if data == "[DONE]" {
            *done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap());
        }
    }
}

fn long_text(seed: u32) -> String {
    (0..60)
        .map(|i| format!("sentence {seed} number {i}. "))
        .collect()
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"model": "whatever", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}], "max_tokens": max_tokens})
}

#[tokio::test]
async fn info_endpoints_answer_like_a_server() {
    let w = spawn(fast_config()).await;
    let c = client();
    for path in ["/health", "/health_generate"] {
        let r = c.get(format!("{}{path}", w.base)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()[WORKER_HEADER], w.handle.name());
    }
    assert!(w.handle.name().starts_with("worker-"));
    let info = get_json(&w.base, "/get_server_info").await;
    assert_eq!(info["model_path"], "sim-llama-8b");
    assert_eq!(info["page_size"], 16);
    let mi = get_json(&w.base, "/get_model_info").await;
    assert_eq!(mi["is_generation"], true);
    assert_eq!(mi["model_path"], "sim-llama-8b");
    let models = get_json(&w.base, "/v1/models").await;
    assert_eq!(models["data"][0]["id"], "sim-llama-8b");
    let load = get_json(&w.base, "/get_load").await;
    assert_eq!(load["running"], 0);
    assert_eq!(load["kv_capacity_tokens"], 100_000);
    let metrics = c
        .get(format!("{}/metrics", w.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "radixgate_sim_running_requests",
        "radixgate_sim_kv_usage_ratio",
        "radixgate_sim_cached_tokens_total",
        "sglang:num_queue_reqs",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics");
    }
    let r = c.get(format!("{}/nope", w.base)).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string());
}

#[tokio::test]
async fn repeated_prompt_raises_cached_tokens_and_flush_clears_them() {
    let w = spawn(fast_config()).await;
    let body = chat(&long_text(1), 8);
    let (s1, h1, v1) = post(&w.base, "/v1/chat/completions", body.clone()).await;
    assert_eq!(s1, 200);
    assert_eq!(h1[WORKER_HEADER], w.handle.name());
    assert_eq!(v1["system_fingerprint"], w.handle.name());
    assert_eq!(v1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(v1["usage"]["completion_tokens"], 8);
    assert_eq!(
        v1["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .chars()
            .count(),
        32
    );
    let prompt_tokens = v1["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, _, v2) = post(&w.base, "/v1/chat/completions", body.clone()).await;
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > 0 && cached < prompt_tokens,
        "cached {cached} of {prompt_tokens}"
    );
    assert_eq!(cached % 16, 0);
    assert_eq!(
        v1["choices"][0]["message"]["content"], v2["choices"][0]["message"]["content"],
        "deterministic reply"
    );
    let metrics = client()
        .get(format!("{}/metrics", w.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains(&format!(
        "radixgate_sim_cached_tokens_total{{worker=\"{}\",model_name=\"sim-llama-8b\"}} {cached}",
        w.handle.name()
    )));
    let r = client()
        .post(format!("{}/flush_cache", w.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, _, v3) = post(&w.base, "/v1/chat/completions", body).await;
    assert_eq!(v3["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn next_chat_turn_hits_previous_prompt_and_reply() {
    let w = spawn(fast_config()).await;
    let first = long_text(2);
    let (_, _, v1) = post(&w.base, "/v1/chat/completions", chat(&first, 20)).await;
    let reply = v1["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let p1 = v1["usage"]["prompt_tokens"].as_u64().unwrap();
    let turn2 = json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": first},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "and then?"}], "max_tokens": 4});
    let (_, _, v2) = post(&w.base, "/v1/chat/completions", turn2).await;
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // Prompt and reply together were cached in whole blocks.
    assert!(
        cached + 16 > p1 + 20,
        "turn 2 cached {cached}, turn 1 was {p1} + 20 tokens"
    );
}

#[tokio::test]
async fn chat_stream_with_usage_matches_the_whole_response() {
    let w = spawn(fast_config()).await;
    let mut body = chat(&long_text(3), 6);
    let (_, _, whole) = post(&w.base, "/v1/chat/completions", body.clone()).await;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (events, done) = sse(&w.base, "/v1/chat/completions", body).await.unwrap();
    assert!(done, "ends with [DONE]");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );
    let last = events.last().unwrap();
    assert_eq!(last["choices"].as_array().unwrap().len(), 0);
    assert!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(
        events
            .iter()
            .all(|e| e["system_fingerprint"] == w.handle.name())
    );
    let finishes: Vec<&Value> = events
        .iter()
        .filter(|e| e["choices"][0]["finish_reason"] == "length")
        .collect();
    assert_eq!(finishes.len(), 1);
}

#[tokio::test]
async fn completions_and_generate_stream_and_not() {
    let w = spawn(fast_config()).await;
    let prompt = long_text(4);
    let (s, _, v) = post(
        &w.base,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 5}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let (events, done) = sse(
        &w.base,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 5, "stream": true}),
    )
    .await
    .unwrap();
    assert!(done);
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, v["choices"][0]["text"].as_str().unwrap());
    assert!(
        events.iter().all(|e| e.get("usage").is_none()),
        "no usage without include_usage"
    );

    let g = json!({"text": prompt, "sampling_params": {"max_new_tokens": 7}});
    let (s, _, v) = post(&w.base, "/generate", g.clone()).await;
    assert_eq!(s, 200);
    assert_eq!(v["meta_info"]["completion_tokens"], 7);
    assert_eq!(v["meta_info"]["worker"], w.handle.name());
    assert!(
        v["meta_info"]["cached_tokens"].as_u64().unwrap() > 0,
        "same text as the completion above"
    );
    assert_eq!(
        v["meta_info"]["prompt_tokens"],
        prompt.chars().count().div_ceil(4)
    );
    let mut gs = g;
    gs["stream"] = json!(true);
    let (events, done) = sse(&w.base, "/generate", gs).await.unwrap();
    assert!(done);
    assert_eq!(events.len(), 7);
    assert_eq!(events.last().unwrap()["text"], v["text"]);
    assert_eq!(
        events.last().unwrap()["meta_info"]["finish_reason"]["type"],
        "length"
    );
    assert!(
        events
            .iter()
            .all(|e| e["meta_info"]["cached_tokens"].as_u64().unwrap() > 0),
        "every streamed /generate event carries the prefix hit"
    );
    let (s, _, v) = post(
        &w.base,
        "/generate",
        json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["meta_info"]["prompt_tokens"], 3);
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let mut cfg = fast_config();
    cfg.max_body_bytes = 1000;
    let w = spawn(cfg).await;
    let c = client();
    let r = c
        .post(format!("{}/v1/chat/completions", w.base))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    for k in ["message", "type", "param", "code"] {
        assert!(v["error"].get(k).is_some(), "error.{k}");
    }
    let (s, _, v) = post(&w.base, "/v1/completions", json!({"prompt": 3})).await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["param"], "prompt");
    let big = "x".repeat(5000);
    let (s, _, v) = post(&w.base, "/v1/completions", json!({"prompt": big})).await;
    assert_eq!(s, 413);
    assert_eq!(v["error"]["code"], "payload_too_large");
    // Larger than the whole KV cache: a clear 400, not a queue stuck forever.
    let (s, _, v) = post(
        &w.base,
        "/generate",
        json!({"text": "a", "sampling_params": {"max_new_tokens": 200000}}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
}

#[tokio::test]
async fn h2c_prior_knowledge_works() {
    let w = spawn(fast_config()).await;
    let c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = c
        .post(format!("{}/v1/chat/completions", w.base))
        .json(&chat("hi", 3))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[WORKER_HEADER], w.handle.name());
}

#[tokio::test]
async fn instant_mode_answers_well_formed() {
    let mut cfg = fast_config();
    cfg.instant = true;
    cfg.name = "fast".into();
    let w = spawn(cfg).await;
    let (s, h, v) = post(&w.base, "/v1/chat/completions", chat("hello", 4)).await;
    assert_eq!(s, 200);
    assert_eq!(h[WORKER_HEADER], "fast");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    let mut b = chat("hello", 4);
    b["stream"] = json!(true);
    b["stream_options"] = json!({"include_usage": true});
    let (events, done) = sse(&w.base, "/v1/chat/completions", b).await.unwrap();
    assert!(done);
    assert_eq!(events.len(), 6, "role + 4 tokens + usage");
}

#[tokio::test]
async fn fault_error_rate_and_admin_endpoint() {
    let w = spawn(fast_config()).await;
    let c = client();
    let r = c
        .post(format!("{}/admin/faults", w.base))
        .json(&json!({"error_rate": 1.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (s, _, v) = post(&w.base, "/v1/chat/completions", chat("x", 2)).await;
    assert_eq!(s, 500);
    assert_eq!(v["error"]["code"], "injected_fault");
    let shown = get_json(&w.base, "/admin/faults").await;
    assert_eq!(shown["error_rate"], 1.0);
    let r = c
        .post(format!("{}/admin/faults", w.base))
        .json(&json!({"error_rate": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "out-of-range knob");
    let r = c
        .post(format!("{}/admin/faults", w.base))
        .json(&json!({"bogus": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "unknown knob");
    // A seeded 50% rate fails some and passes some, the same way each run.
    w.handle
        .set_faults(FaultConfig {
            error_rate: 0.5,
            seed: 3,
            ..FaultConfig::default()
        })
        .unwrap();
    let mut outcomes = Vec::new();
    for _ in 0..40 {
        outcomes.push(post(&w.base, "/v1/chat/completions", chat("x", 1)).await.0);
    }
    w.handle
        .set_faults(FaultConfig {
            error_rate: 0.5,
            seed: 3,
            ..FaultConfig::default()
        })
        .unwrap();
    let mut again = Vec::new();
    for _ in 0..40 {
        again.push(post(&w.base, "/v1/chat/completions", chat("x", 1)).await.0);
    }
    assert_eq!(outcomes, again);
    assert!(outcomes.contains(&500) && outcomes.contains(&200));
}

#[tokio::test]
async fn fault_added_latency_delays_answers() {
    let mut cfg = fast_config();
    cfg.faults.latency_ms = 300;
    let w = spawn(cfg).await;
    let t = Instant::now();
    let (s, _, _) = post(&w.base, "/v1/chat/completions", chat("x", 1)).await;
    assert_eq!(s, 200);
    // A lower bound only: the answer cannot come before the added latency.
    assert!(t.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn fault_hang_never_answers_but_health_does() {
    let mut cfg = fast_config();
    cfg.faults.hang = true;
    let w = spawn(cfg).await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let err = c
        .post(format!("{}/v1/chat/completions", w.base))
        .json(&chat("x", 1))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(
        c.get(format!("{}/health", w.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn fault_die_mid_stream_cuts_without_done() {
    let mut cfg = fast_config();
    cfg.faults.die_after_chunks = Some(3);
    let w = spawn(cfg).await;
    let mut b = chat(&long_text(5), 10);
    b["stream"] = json!(true);
    let (events, err) = sse(&w.base, "/v1/chat/completions", b)
        .await
        .expect_err("the stream is cut");
    assert_eq!(events.len(), 3, "{err}");
    // Non-streamed requests are unaffected.
    assert_eq!(
        post(&w.base, "/v1/chat/completions", chat("x", 2)).await.0,
        200
    );
}

#[tokio::test]
async fn fault_unhealthy_health_endpoints() {
    let mut cfg = fast_config();
    cfg.faults.unhealthy = true;
    let w = spawn(cfg).await;
    let r = client()
        .get(format!("{}/health", w.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    w.handle.set_faults(FaultConfig::default()).unwrap();
    let r = client()
        .get(format!("{}/health", w.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

async fn wait_until_serving(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client().get(format!("{base}/health")).send().await
            && r.status() == 200
        {
            return;
        }
        assert!(Instant::now() < deadline, "worker never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn fault_refuse_closes_the_port_until_cleared_by_a_sibling() {
    let stop = CancellationToken::new();
    let l0 = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let l1 = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ws = start_group(vec![(l0, fast_config()), (l1, fast_config())], stop.clone())
        .await
        .unwrap();
    let _guard = stop.drop_guard();
    let b0 = format!("http://{}", ws[0].addr());
    let b1 = format!("http://{}", ws[1].addr());
    let c = client();
    let r = c
        .post(format!("{b0}/admin/workers/1/faults"))
        .json(&json!({"refuse": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The listener closes asynchronously; wait for a refused connection.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fresh = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        match fresh.get(format!("{b1}/health")).send().await {
            Err(e) if e.is_connect() => break,
            _ => assert!(Instant::now() < deadline, "port never closed"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        get_json(&b0, "/admin/workers/1/faults").await["refuse"],
        true
    );
    let r = c
        .post(format!("{b0}/admin/workers/1/faults"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_until_serving(&b1).await;
    assert_eq!(post(&b1, "/v1/chat/completions", chat("x", 1)).await.0, 200);
    let r = c
        .get(format!("{b0}/admin/workers/9/faults"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn fault_slow_start_refuses_then_serves() {
    let mut cfg = fast_config();
    cfg.faults.slow_start_secs = 0.5;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let h = start(listener, cfg, stop).await.unwrap();
    let base = format!("http://{}", h.addr());
    // Right after start the port is closed (we are well inside 0.5 s unless
    // the machine stalled; then we at least see it come up below).
    let t = Instant::now();
    let early = client().get(format!("{base}/health")).send().await;
    if t.elapsed() < Duration::from_millis(300) {
        assert!(early.unwrap_err().is_connect());
    }
    wait_until_serving(&base).await;
}

#[tokio::test]
async fn cancelled_stream_leaves_the_batch() {
    let mut cfg = fast_config();
    // Slow decode so the request is still running when the client leaves.
    cfg.engine.timing.step_base_us = 20_000.0;
    let w = spawn(cfg).await;
    let mut b = chat("cancel me", 1000);
    b["stream"] = json!(true);
    let mut r = client()
        .post(format!("{}/v1/chat/completions", w.base))
        .json(&b)
        .send()
        .await
        .unwrap();
    let _ = r.chunk().await.unwrap();
    assert_eq!(get_json(&w.base, "/get_load").await["running"], 1);
    drop(r);
    let deadline = Instant::now() + Duration::from_secs(30);
    while get_json(&w.base, "/get_load").await["running"] != 0 {
        assert!(Instant::now() < deadline, "cancelled request still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
