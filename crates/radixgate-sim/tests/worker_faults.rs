//! Integration tests of the worker's fault knobs, each observed by a real
//! HTTP client over loopback. No test asserts an upper bound on time: waits
//! for asynchronous effects (a listener reopening, a cancelled request
//! leaving the batch) poll with a generous deadline that only turns a hang
//! into a failure.

mod common;

use std::time::{Duration, Instant};

use common::*;
use radixgate_sim::server::{FaultConfig, start, start_group};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    let c = client_builder()
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

/// A stream shorter than `die_after_chunks` events is not cut: it ends
/// with `[DONE]` and a clean end of body, in instant mode as in the timed
/// one. Instant mode used to drop the connection after the whole stream
/// whatever its length, so a router in front saw a failed stream for an
/// answer that was complete.
#[tokio::test]
async fn fault_die_mid_stream_spares_a_shorter_stream() {
    for instant in [false, true] {
        let mut cfg = fast_config();
        cfg.instant = instant;
        cfg.faults.die_after_chunks = Some(100);
        let w = spawn(cfg).await;
        let mut b = chat("hello", 4);
        b["stream"] = json!(true);
        let (events, done) = sse(&w.base, "/v1/chat/completions", b)
            .await
            .unwrap_or_else(|(events, err)| {
                panic!(
                    "instant {instant}: cut after {} events: {err}",
                    events.len()
                )
            });
        assert!(done, "instant {instant}");
        assert_eq!(events.len(), 5, "instant {instant}: role + 4 tokens");
    }
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
    wait_until_refused(&b1).await;
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

/// Polls until a fresh connection to `base` is refused.
async fn wait_until_refused(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let fresh = client_builder().pool_max_idle_per_host(0).build().unwrap();
        match fresh.get(format!("{base}/health")).send().await {
            Err(e) if e.is_connect() => return,
            _ => assert!(Instant::now() < deadline, "port never closed"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn fault_slow_start_refuses_then_serves() {
    // A slow start far longer than any test run: the port must be seen
    // closed however slow the machine is (the listener closes as soon as the
    // accept loop first runs, which a connection may just beat).
    let mut cfg = fast_config();
    cfg.faults.slow_start_secs = 3600.0;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let h = start(listener, cfg, stop).await.unwrap();
    let base = format!("http://{}", h.addr());
    wait_until_refused(&base).await;
    // Setting the knob at run time restarts the clock; a short one must
    // then run out by itself and the worker serve again.
    h.set_faults(FaultConfig {
        slow_start_secs: 0.2,
        ..FaultConfig::default()
    })
    .unwrap();
    wait_until_serving(&base).await;
    assert_eq!(
        post(&base, "/v1/chat/completions", chat("x", 1)).await.0,
        200
    );
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
    let deadline = Instant::now() + Duration::from_secs(30);
    while get_json(&w.base, "/get_load").await["running"] != 1 {
        assert!(Instant::now() < deadline, "request never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(r);
    while get_json(&w.base, "/get_load").await["running"] != 0 {
        assert!(Instant::now() < deadline, "cancelled request still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The worker's simulated busy time so far (`/metrics`), seconds.
async fn busy_seconds(base: &str) -> f64 {
    let text = metrics_text(base).await;
    let line = text
        .lines()
        .find(|l| l.starts_with("radixgate_sim_busy_seconds_total"))
        .expect("busy time in /metrics");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Streams a chat request and returns the wall time to its first content
/// token, and the worker's simulated busy time the request added (it runs
/// alone, so that is the time of its steps).
async fn first_token(base: &str, content: &str) -> (Duration, f64) {
    let busy = busy_seconds(base).await;
    let mut b = chat(content, 3);
    b["stream"] = json!(true);
    // Built before the clock starts: building a client takes milliseconds.
    let c = client();
    let t = Instant::now();
    let mut r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut buf = String::new();
    let mut events = Vec::new();
    let mut done = false;
    let mut ttft = None;
    while let Some(c) = r.chunk().await.unwrap() {
        buf.push_str(std::str::from_utf8(&c).unwrap());
        parse_events(&mut buf, &mut events, &mut done);
        let content = events.iter().any(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        });
        if content && ttft.is_none() {
            ttft = Some(t.elapsed());
        }
    }
    assert!(done, "the stream ends with [DONE]");
    // The metrics snapshot is published before the last step's events.
    (
        ttft.expect("a content token"),
        busy_seconds(base).await - busy,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_slowdown_set_at_run_time_stretches_time_to_first_token() {
    let mut cfg = fast_config();
    // Steps long enough that timer resolution does not matter: a cold
    // prompt of ~40 tokens takes ~30 ms to first token, 3 steps in all.
    cfg.engine.timing.step_base_us = 30_000.0;
    cfg.engine.timing.token_us = 20.0;
    let w = spawn(cfg).await;
    let (ttft_1, busy_1) = first_token(&w.base, "first prompt, cold").await;
    let r = client()
        .post(format!("{}/admin/faults", w.base))
        .json(&json!({"slowdown": 4.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(get_json(&w.base, "/admin/faults").await["slowdown"], 4.0);
    // Same length, also cold: the same steps, each four times longer.
    let (ttft_4, busy_4) = first_token(&w.base, "other prompt, cold").await;
    let ratio = busy_4 / busy_1;
    assert!(
        (ratio - 4.0).abs() < 0.01,
        "simulated step time x{ratio:.3} ({busy_1} s -> {busy_4} s)"
    );
    // Wall time: lower bounds only (the machine may add delay, never
    // remove it). The first token comes after the prefill step, a third of
    // the request's steps here and a little more than a third of its time.
    assert!(
        ttft_1.as_secs_f64() >= busy_1 / 3.0,
        "{ttft_1:?} vs {busy_1}"
    );
    assert!(
        ttft_4.as_secs_f64() >= 4.0 * busy_1 / 3.0,
        "{ttft_4:?} vs 4 x {busy_1} / 3"
    );
    eprintln!(
        "time to first token {ttft_1:?} -> {ttft_4:?} (x{:.2}) with slowdown 4",
        ttft_4.as_secs_f64() / ttft_1.as_secs_f64()
    );
    // Cleared: back to full speed for steps started afterwards.
    let r = client()
        .post(format!("{}/admin/faults", w.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, busy_back) = first_token(&w.base, "third prompt, cold!").await;
    assert!(
        (busy_back / busy_1 - 1.0).abs() < 0.01,
        "{busy_back} vs {busy_1}"
    );
    // Out of range at run time: a 400, and the knob stays as it was.
    for bad in [json!({"slowdown": 0.5}), json!({"slowdown": 5000})] {
        let r = client()
            .post(format!("{}/admin/faults", w.base))
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    assert_eq!(get_json(&w.base, "/admin/faults").await["slowdown"], 1.0);
}

/// `strict_models`: a request naming a model the worker does not serve is
/// vLLM's 404, on the admin endpoint's word and back off again; an
/// adapter loaded at run time is served, and unloaded is not.
#[tokio::test]
async fn strict_models_answers_an_unserved_model_404_as_vllm_does() {
    let w = spawn(fast_config()).await;
    let c = client();
    let (s, _, _) = post(&w.base, "/v1/chat/completions", chat("x", 2)).await;
    assert_eq!(s, 200, "off by default: any model is served");
    let r = c
        .post(format!("{}/admin/faults", w.base))
        .json(&json!({"strict_models": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (s, _, v) = post(&w.base, "/v1/chat/completions", chat("x", 2)).await;
    assert_eq!(s, 404, "{v}");
    let expected = json!({"error": {"message": "The model `whatever` does not exist.",
        "type": "NotFoundError", "param": "model", "code": 404}});
    assert_eq!(v, expected);
    let mut served = chat("x", 2);
    served["model"] = json!(radixgate_sim::server::DEFAULT_MODEL);
    let (s, _, v) = post(&w.base, "/v1/chat/completions", served).await;
    assert_eq!(s, 200, "its own model: {v}");
    let lora = || json!({"lora_name": "whatever", "lora_path": "/adapters/w"});
    let (s, _, _) = post(&w.base, "/v1/load_lora_adapter", lora()).await;
    assert_eq!(s, 200);
    let (s, _, v) = post(
        &w.base,
        "/v1/completions",
        json!({"model": "whatever",
        "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 200, "a loaded adapter: {v}");
    let (s, _, _) = post(&w.base, "/v1/unload_lora_adapter", lora()).await;
    assert_eq!(s, 200);
    let (s, _, v) = post(
        &w.base,
        "/v1/completions",
        json!({"model": "whatever",
        "prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!((s, &v), (404, &expected), "unloaded");
    w.handle.set_faults(FaultConfig::default()).unwrap();
    let (s, _, _) = post(&w.base, "/v1/chat/completions", chat("x", 2)).await;
    assert_eq!(s, 200, "cleared");
}
