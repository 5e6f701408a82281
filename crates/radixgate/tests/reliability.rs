//! Failure handling of `radixgate serve` on loopback: retries, streams
//! that break off, workers that are down, come back, join and leave, and
//! graceful shutdown.

mod common;

use common::*;
use futures::StreamExt;
use radixgate::proxy::WORKER_HEADER;
use radixgate_routing::{PolicyConfig, RoundRobinConfig};
use radixgate_sim::server::FaultConfig;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn round_robin(mut c: radixgate::config::Config) -> radixgate::config::Config {
    c.routing = PolicyConfig::RoundRobin(RoundRobinConfig::default());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_move_to_another_worker() {
    let bad = sim_worker(fast_worker()).await;
    let good = sim_worker(fast_worker()).await;
    bad.set_faults(FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    let gw = gateway_ready(round_robin(config(&[&bad.url, &good.url])), 2).await;
    assert_all_served_by(&gw.url, &good.url, 6, "q").await;
    let c = client();
    // With retries off, the worker's own error reaches the client.
    let mut cfg = round_robin(config(&[&bad.url]));
    cfg.retry.max_retries = 0;
    let single = gateway_ready(cfg, 1).await;
    let r = c
        .post(format!("{}/v1/chat/completions", single.url))
        .json(&chat("x", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    // Retries that run out report the last failure.
    let mut cfg = config(&[&bad.url]);
    cfg.retry.max_retries = 2;
    let exhausted = gateway_ready(cfg, 1).await;
    let r = c
        .post(format!("{}/v1/chat/completions", exhausted.url))
        .json(&chat("x", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    // A retry counts once it is sent: the pair's requests that met the
    // failing worker first were, the lone worker's had nowhere to go.
    let retries = "radixgate_retries_total";
    assert!(series_sum(&gw.url, retries).await >= 1.0);
    assert_eq!(series_sum(&exhausted.url, retries).await, 0.0);
    for g in [gw, single, exhausted] {
        g.shutdown().await;
    }
}

/// Has `worker` refuse connections, and waits until its port is closed.
async fn refuse_connections(worker: &SimWorker) {
    worker.set_faults(FaultConfig {
        refuse: true,
        ..Default::default()
    });
    let addr = worker.url.trim_start_matches("http://").to_owned();
    wait_until("the refusing worker's port to close", || {
        let addr = addr.clone();
        async move { tokio::net::TcpStream::connect(addr).await.is_err() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_move_to_another_worker() {
    let bad = sim_worker(fast_worker()).await;
    let good = sim_worker(fast_worker()).await;
    let mut cfg = round_robin(config(&[&bad.url, &good.url]));
    // Health probing must not notice the refusal first: this test is about
    // the request path's own retry on a connect error.
    cfg.health.failure_threshold = 1000;
    let gw = gateway_ready(cfg, 2).await;
    refuse_connections(&bad).await;
    assert_all_served_by(&gw.url, &good.url, 4, "refused").await;
    let metrics = metrics_text(&gw.url).await;
    let retried = metrics.lines().any(|l| {
        l.starts_with("radixgate_retries_total{reason=\"connect\"}") && !l.ends_with(" 0")
    });
    assert!(retried, "connect retries counted:\n{metrics}");
    gw.shutdown().await;
}

/// A pool of `bad` and `good` where every new prompt is tried on `bad`
/// first while its record stays empty. Neither health probing nor the
/// breaker takes `bad` out. Low matches go to the smallest tree by the
/// rule of before the cost model (which would otherwise keep them on the
/// worker it saw answer quickly): once the first request reaches `good`,
/// every later one is tried on `bad` first, whose tree stays empty only
/// if its inserts are taken back.
fn bad_worker_first(bad: &str, good: &str) -> radixgate::config::Config {
    let mut cfg = config(&[bad, good]);
    cfg.health.failure_threshold = 1000;
    cfg.circuit_breaker.failure_threshold = 1000;
    cfg.routing = serde_json::from_value(json!({"policy": "cache_aware",
        "hot_spot": {"rule": "relative_cap"}}))
    .unwrap();
    cfg
}

/// A worker that refuses the connection was sent nothing: the prompt is
/// not in its cache, so its prefix record does not keep it. Before, every
/// prompt tried there stayed on its record, and once it took connections
/// again the same prefixes were sent back to it as if it held them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_leaves_no_prompt_on_the_workers_record() {
    let bad = sim_worker(fast_worker()).await;
    let good = sim_worker(fast_worker()).await;
    let gw = gateway_ready(bad_worker_first(&bad.url, &good.url), 2).await;
    refuse_connections(&bad).await;
    for i in 0..6u8 {
        // Long and unlike the others from its first letter: below the
        // cache threshold on any worker holding the others.
        let text = char::from(b'a' + i).to_string().repeat(300);
        let r = post_chat(&gw.url, &chat(&text, false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[WORKER_HEADER], good.url.as_str());
        r.bytes().await.unwrap();
    }
    let retried = series_value(&gw.url, "radixgate_retries_total{reason=\"connect\"}").await;
    assert!(
        retried >= 5.0,
        "{retried} requests tried on the refusing worker"
    );
    let held = worker_loads(&gw.url, &bad.url).await["cached_chars"].clone();
    assert_eq!(held, json!(0), "the refusing worker's prefix record");
    assert!(worker_loads(&gw.url, &good.url).await["cached_chars"].as_u64() > Some(0));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_dying_mid_stream_is_an_explicit_error_and_not_retried() {
    // It dies in the middle of its third event: the client gets none of
    // that event, whose half its SSE parser would fail on.
    let w = dying_worker(vec![
        "data: {\"n\":1}\n\n",
        "data: {\"n\":2}\n\n",
        "data: {\"n\":3,\"choi",
    ])
    .await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&json!({"model": "scripted", "stream": true, "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = String::from_utf8(r.bytes().await.unwrap().to_vec()).unwrap();
    assert!(
        text.starts_with("data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: {\"error\""),
        "{text}"
    );
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let event: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(event["error"]["code"], "stream_interrupted");
    assert!(!text.contains("[DONE]"));
    assert_eq!(
        w.received.lock().len(),
        1,
        "bytes reached the client: no retry"
    );
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_worker_dying_mid_stream_reaches_the_client_as_an_error() {
    let w = sim_worker(fast_worker()).await;
    w.set_faults(FaultConfig {
        die_after_chunks: Some(2),
        ..Default::default()
    });
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let mut body = chat("die", true);
    body["max_tokens"] = json!(50);
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let text = String::from_utf8(r.bytes().await.unwrap().to_vec()).unwrap();
    assert!(text.contains("stream_interrupted"), "{text}");
    assert!(!text.contains("[DONE]"));
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_down_at_start_is_admitted_when_it_comes_up() {
    let up = sim_worker(fast_worker()).await;
    let parked = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = parked.local_addr().unwrap();
    drop(parked);
    let late_url = format!("http://{addr}");
    let gw = gateway_ready(config(&[&up.url, &late_url]), 1).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("served meanwhile", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let started = Instant::now();
    let _late = sim_worker_on(listener, fast_worker()).await;
    wait_for_healthy(&gw.url, 2).await;
    eprintln!(
        "late worker admitted {:?} after it came up",
        started.elapsed()
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_worker_leaves_and_returns_with_its_tree() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url, &b.url]), 2).await;
    let c = client();
    for i in 0..4 {
        c.post(format!("{}/v1/chat/completions", gw.url))
            .json(&chat(&format!("prefix {i}"), false))
            .send()
            .await
            .unwrap();
    }
    let before = cached_chars(&gw.url).await;
    a.set_faults(FaultConfig {
        unhealthy: true,
        ..Default::default()
    });
    wait_for_healthy(&gw.url, 1).await;
    for i in 0..4 {
        let r = c
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&chat(&format!("other {i}"), false))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers()[WORKER_HEADER],
            b.url.as_str(),
            "an unhealthy worker is never chosen"
        );
    }
    a.set_faults(FaultConfig::default());
    wait_for_healthy(&gw.url, 2).await;
    let after = cached_chars(&gw.url).await;
    assert!(
        after[0] >= before[0] && before[0] > 0,
        "tree kept: {before:?} -> {after:?}"
    );
    gw.shutdown().await;
}

async fn cached_chars(gateway: &str) -> Vec<u64> {
    get_loads(gateway).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["cached_chars"].as_u64().unwrap_or(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_join_and_leave_under_traffic() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url]), 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut traffic = Vec::new();
    for t in 0..4 {
        let (url, stop, ok, failed) = (gw.url.clone(), stop.clone(), ok.clone(), failed.clone());
        traffic.push(tokio::spawn(async move {
            let c = client();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let r = c
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&chat(&format!("t{t} r{i}"), i % 2 == 0))
                    .send()
                    .await;
                let served = match r {
                    Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if served {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let c = client();
    let r = c
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": b.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    wait_for_healthy(&gw.url, 2).await;
    let dup = c
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": b.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(dup.status(), 409);
    let r = c
        .delete(format!("{}/workers?url={}", gw.url, a.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_for_healthy(&gw.url, 1).await;
    let served_before = ok.load(Ordering::Relaxed);
    wait_until("traffic after the removal", || async {
        ok.load(Ordering::Relaxed) > served_before + 10
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for t in traffic {
        t.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "no request lost while workers changed"
    );
    let list: Value = c
        .get(format!("{}/workers", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let urls: Vec<&str> = list["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap())
        .collect();
    assert_eq!(urls, [b.url.as_str()]);
    let missing = c
        .delete(format!("{}/workers?url=http://127.0.0.1:1", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let bad = c
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": "nonsense"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_streams_in_flight() {
    let mut slow = fast_worker();
    slow.engine.timing.step_base_us = 5_000.0;
    let w = sim_worker(slow).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let mut body = chat("drain me", true);
    body["max_tokens"] = json!(200);
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = r.bytes_stream();
    let mut text = String::from_utf8(stream.next().await.unwrap().unwrap().to_vec()).unwrap();
    let url = gw.url.clone();
    gw.stop.cancel();
    // New connections are refused while the stream drains.
    wait_until("the listener to close", || async {
        client()
            .get(format!("{url}/liveness"))
            .send()
            .await
            .is_err()
    })
    .await;
    while let Some(chunk) = stream.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream finished: {}",
        &text[text.len().saturating_sub(80)..]
    );
    gw.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_worker_hits_the_request_timeout() {
    let w = sim_worker(fast_worker()).await;
    w.set_faults(FaultConfig {
        hang: true,
        ..Default::default()
    });
    let mut cfg = config(&[&w.url]);
    cfg.server.request_timeout_secs = 1;
    let gw = gateway_ready(cfg, 1).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("hang", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "request_timeout"
    );
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stalling_mid_stream_meets_the_request_timeout() {
    let w = stalling_worker(vec!["data: {\"n\":1}\n\n"]).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.request_timeout_secs = 1;
    let gw = gateway_ready(cfg, 1).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&json!({"model": "scripted", "stream": true, "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    let text = String::from_utf8(r.bytes().await.unwrap().to_vec()).unwrap();
    assert!(text.starts_with("data: {\"n\":1}\n\n"), "{text}");
    assert!(text.contains("\"code\":\"request_timeout\""), "{text}");
    assert!(!text.contains("[DONE]"));
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cuts_what_outlives_the_grace_period_on_every_thread() {
    let w = stalling_worker(vec!["data: {\"n\":1}\n\n"]).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.threads = 3;
    cfg.server.shutdown_grace_period_secs = 1;
    let gw = gateway_ready(cfg, 1).await;
    // Separate connections, which the serving threads accept between them.
    let mut streams = Vec::new();
    for _ in 0..6 {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&json!({"model": "scripted", "stream": true, "messages": [{"role": "user", "content": "x"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let mut stream = r.bytes_stream();
        let first = stream.next().await.unwrap().unwrap();
        assert!(first.starts_with(b"data: {\"n\":1}"));
        streams.push(stream);
    }
    gw.stop.cancel();
    // The gateway returns once the grace period is over, and every stalled
    // stream is cut rather than left hanging. (The timeout only turns a
    // hang into a failure.)
    tokio::time::timeout(Duration::from_secs(60), gw.task)
        .await
        .expect("the gateway stopped after its grace period")
        .unwrap()
        .unwrap();
    for mut stream in streams {
        let mut rest = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(bytes) => rest.extend_from_slice(&bytes),
                Err(_) => break,
            }
        }
        assert!(!String::from_utf8_lossy(&rest).contains("[DONE]"));
    }
}

/// A fake worker that never passes its health check and keeps the `Via`
/// header of the last probe it got.
async fn via_recorder() -> (
    String,
    Arc<std::sync::Mutex<Option<String>>>,
    tokio_util::sync::CancellationToken,
) {
    use axum::http::{HeaderMap, StatusCode};
    let seen = Arc::new(std::sync::Mutex::new(None));
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/health",
        axum::routing::get(move |headers: HeaderMap| {
            let s = s.clone();
            async move {
                let via = headers.get("via").and_then(|v| v.to_str().ok());
                *s.lock().unwrap() = via.map(str::to_owned);
                StatusCode::SERVICE_UNAVAILABLE
            }
        }),
    );
    let (url, stop) = serve_app(app).await;
    (url, seen, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_url_that_is_the_router_itself_is_never_admitted() {
    let w = sim_worker(fast_worker()).await;
    let (recorder, seen, stop) = via_recorder().await;
    let gw = gateway_ready(config(&[&w.url, &recorder]), 1).await;
    // What the router says of itself to every worker it calls.
    wait_until("a probe's Via", || async { seen.lock().unwrap().is_some() }).await;
    let via = seen.lock().unwrap().clone().unwrap();
    assert!(via.starts_with("1.1 radixgate-"), "{via}");
    // Its own URL added as a worker: the probe comes back to it, is refused
    // with 508, and the "worker" stays out, saying why.
    let c = client();
    let r = c
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": gw.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    wait_until("the router's own URL refused", || async {
        workers(&gw.url).await.iter().any(|w| {
            w["url"] == gw.url.as_str()
                && w["problem"]
                    .as_str()
                    .is_some_and(|p| p.contains("508") && p.contains("router itself"))
        })
    })
    .await;
    let me = workers(&gw.url).await;
    let me = me.iter().find(|x| x["url"] == gw.url.as_str()).unwrap();
    assert_eq!(me["state"], "pending", "{me}");
    assert_all_served_by(&gw.url, &w.url, 10, "question").await;
    // A request that carries the router's own entry is refused at once;
    // another router's entry before it in the chain is not.
    let looped = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("via", format!("1.1 edge-proxy, {via}"))
        .json(&chat("again", false))
        .send()
        .await
        .unwrap();
    assert_eq!(looped.status(), 508);
    let body: Value = looped.json().await.unwrap();
    assert_eq!(body["error"]["code"], "loop_detected", "{body}");
    // Counted under its route, as other refusals are.
    let refused = "radixgate_requests_total{route=\"/v1/chat/completions\",\
                   status=\"508\",model=\"unknown\"}";
    assert_eq!(
        series_value(&gw.url, refused).await,
        1.0,
        "{}",
        metrics_text(&gw.url).await
    );
    let chained = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("via", "1.1 radixgate-0123456789abcdef")
        .json(&chat("from another router", false))
        .send()
        .await
        .unwrap();
    assert_eq!(chained.status(), 200);
    gw.shutdown().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routers_that_forward_to_each_other_send_the_request_round_once_at_most() {
    let w = sim_worker(fast_worker()).await;
    // A in front of the worker; B in front of A; then B added to A's pool.
    let a = gateway_ready(round_robin(config(&[&w.url])), 1).await;
    let b = gateway_ready(config(&[&a.url]), 1).await;
    let c = client();
    let r = c
        .post(format!("{}/workers", a.url))
        .json(&json!({"url": b.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    wait_for_healthy(&a.url, 2).await;
    // Round-robin sends every other request to B, which sends it back to
    // A: A refuses it (508), B passes that on, and A retries the worker.
    // Without the refusal A would route it again, and its answer would
    // have come through B.
    assert_all_served_by(&a.url, &w.url, 10, "question").await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A worker whose breaker is half-open takes one probe request; a request
/// that finds it busy and no other worker is told so (a 503 naming the
/// breaker), not that no worker serves its model, and spends no retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_finds_the_only_worker_probing_is_told_so() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.retry.max_retries = 0;
    cfg.circuit_breaker.failure_threshold = 1;
    cfg.circuit_breaker.timeout_duration_secs = 1;
    let gw = gateway_ready(cfg, 1).await;
    w.set_faults(FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    let c = client();
    let r = post_chat(&gw.url, &chat("opens the breaker", false)).await;
    assert_eq!(r.status(), 500);
    // Half-open after a second; the probe then takes three.
    w.set_faults(FaultConfig {
        latency_ms: 3_000,
        ..Default::default()
    });
    tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
    let url = gw.url.clone();
    let probe =
        tokio::spawn(async move { post_chat(&url, &chat("the probe", false)).await.status() });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let cached = || async { get_loads(&gw.url).await["workers"][0]["cached_chars"].clone() };
    let before = cached().await;
    let r = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("while the probe is out", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("half-open"), "{message}");
    // Never sent there: the worker's tree did not take its prompt.
    assert_eq!(cached().await, before);
    assert_eq!(probe.await.unwrap(), 200);
    gw.shutdown().await;
}

/// A client that leaves before its answer's head (here, while a slow
/// worker has not answered) is counted 499 in radixgate_requests_total,
/// once; an answered request is not. It and a request the gateway refuses
/// are counted under the model they named, as answered ones are, since a
/// worker serves it; a model no worker serves is `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_its_answer_is_counted_499() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let r = post_chat(&gw.url, &chat("answered", false)).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    w.set_faults(FaultConfig {
        latency_ms: 3_000,
        ..Default::default()
    });
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let left = impatient
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("left before the answer", false))
        .send()
        .await;
    assert!(left.is_err(), "the client gave up");
    let count = |text: &str, status: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("radixgate_requests_total{")
                    && l.contains(&format!("status=\"{status}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    wait_until("the request counted 499", || async {
        count(&metrics_text(&gw.url).await, "499") == 1.0
    })
    .await;
    let text = metrics_text(&gw.url).await;
    assert_eq!(count(&text, "200"), 1.0, "{text}");
    let model = radixgate_sim::server::DEFAULT_MODEL;
    let labelled = |text: &str, status: &str, model: &str| {
        text.lines().any(|l| {
            l.starts_with("radixgate_requests_total{")
                && l.contains(&format!("status=\"{status}\",model=\"{model}\""))
        })
    };
    assert!(labelled(&text, "499", model), "{text}");
    // Refused by the gateway: the worker's port is closed.
    refuse_connections(&w).await;
    let refused = post_chat(&gw.url, &chat("refused", false)).await;
    let status = refused.status().as_u16().to_string();
    assert!(refused.status().is_server_error(), "{status}");
    let mut unknown = chat("no such model", false);
    unknown["model"] = json!("no-such-model");
    let unserved = post_chat(&gw.url, &unknown).await;
    let unserved = unserved.status().as_u16().to_string();
    let text = metrics_text(&gw.url).await;
    assert!(labelled(&text, &status, model), "{status}: {text}");
    assert!(labelled(&text, &unserved, "unknown"), "{unserved}: {text}");
    assert!(!text.contains("no-such-model"), "{text}");
    gw.shutdown().await;
}

/// A worker that takes the request and closes the connection without
/// answering is told apart from one that cannot be reached: 502
/// `worker_closed`, "broke the connection before answering", and the
/// upstream error counted as `closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_closes_without_answering_is_not_called_unreachable() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let Ok(n) = socket.read(&mut head).await else {
                    return;
                };
                let body = match &head[..n] {
                    h if h.starts_with(b"GET /health") => "ok".to_owned(),
                    h if h.starts_with(b"GET /v1/models") => {
                        json!({"data": [{"id": "sim-llama-8b"}]}).to_string()
                    }
                    // A request: read, then the connection is dropped.
                    _ => return,
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    let mut cfg = config(&[&url]);
    cfg.retry.max_retries = 0;
    let gw = gateway_ready(cfg, 1).await;
    let r = post_chat(&gw.url, &chat("taken, then dropped", false)).await;
    assert_eq!(r.status(), 502);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "worker_closed", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("broke the connection"), "{message}");
    let text = metrics_text(&gw.url).await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("radixgate_upstream_errors_total{")
                && l.contains("kind=\"closed\"")),
        "{text}"
    );
    gw.shutdown().await;
    served.abort();
}

/// Workers of which the first `fragile` die on a prompt with "crash" in
/// it: each takes the request and drops the connection unanswered, as a
/// process that crashed would; 200 to anything else. Counts the crashes.
async fn crashable_workers(n: usize, fragile: usize) -> (Vec<String>, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let crashes = Arc::new(AtomicUsize::new(0));
    let mut urls = Vec::new();
    for i in 0..n {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        urls.push(format!("http://{}", listener.local_addr().unwrap()));
        let crashes = crashes.clone();
        let fragile = i < fragile;
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let crashes = crashes.clone();
                tokio::spawn(async move {
                    // The head, then as much body as it announces.
                    let mut got = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let Ok(n @ 1..) = socket.read(&mut buf).await else {
                            return;
                        };
                        got.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
                        let Some(end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if got.len() >= end + 4 + length {
                            break;
                        }
                    }
                    let request = String::from_utf8_lossy(&got);
                    let body = if request.starts_with("GET /health") {
                        "ok".to_owned()
                    } else if request.starts_with("GET /v1/models") {
                        json!({"data": [{"id": "sim-llama-8b"}]}).to_string()
                    } else if fragile && request.contains("crash") {
                        crashes.fetch_add(1, Ordering::SeqCst);
                        return;
                    } else {
                        json!({
                            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                        })
                        .to_string()
                    };
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
    }
    (urls, crashes)
}

/// A gateway in front of five workers that all die on "crash", with retries
/// enough to reach every one; and the count of crashes.
async fn crash_pool() -> (Gateway, Arc<AtomicUsize>) {
    let (urls, crashes) = crashable_workers(5, 5).await;
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut cfg = config(&refs);
    cfg.retry.max_retries = 4;
    cfg.retry.initial_backoff_ms = 1;
    (gateway_ready(cfg, 5).await, crashes)
}

/// A request that kills the engine it reaches (a prompt that trips a
/// crash) is not sent on to kill more: once two workers have broken the
/// connection on it, it is not retried (502 `worker_closed`, saying why),
/// whatever retries are left, and the same request again goes to one
/// worker only. A request that broke one worker's connection is still
/// retried, and answered by the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_breaks_two_workers_is_not_sent_to_a_third() {
    let (gw, crashes) = crash_pool().await;
    let r = post_chat(&gw.url, &chat("please crash", false)).await;
    assert_eq!(r.status(), 502);
    // Client libraries that honour it do not send it again on their own.
    assert_eq!(r.headers()["x-should-retry"], "false");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "worker_closed", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("2 workers broke the connection"),
        "{message}"
    );
    assert_eq!(crashes.load(Ordering::SeqCst), 2, "workers crashed");
    // The client's retry of it reaches one worker, not two.
    let r = post_chat(&gw.url, &chat("please crash", false)).await;
    assert_eq!(r.status(), 502);
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(
            "1 worker broke the connection on this request before answering, as others did"
        ),
        "{message}"
    );
    assert_eq!(crashes.load(Ordering::SeqCst), 3, "workers crashed");
    // Another request is not a suspect.
    let r = post_chat(&gw.url, &chat("crash again", false)).await;
    assert_eq!(r.status(), 502);
    assert_eq!(crashes.load(Ordering::SeqCst), 5, "workers crashed");
    for i in 0..5 {
        let r = post_chat(&gw.url, &chat(&format!("normal {i}"), false)).await;
        assert_eq!(r.status(), 200, "normal {i}");
    }
    gw.shutdown().await;

    // One worker of three dies on it: the others answer.
    let (urls, crashes) = crashable_workers(3, 1).await;
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut cfg = config(&refs);
    cfg.routing = PolicyConfig::RoundRobin(RoundRobinConfig::default());
    cfg.retry.initial_backoff_ms = 1;
    let gw = gateway_ready(cfg, 3).await;
    for i in 0..3 {
        let r = post_chat(&gw.url, &chat(&format!("crash {i}"), false)).await;
        assert_eq!(r.status(), 200, "crash {i}");
    }
    assert!(crashes.load(Ordering::SeqCst) >= 1);
    gw.shutdown().await;
}

/// A page of an allowed origin (`cors_allowed_origins`) calling through
/// OpenAI's or Anthropic's browser SDK reads `x-should-retry: false` on a
/// request that broke two workers, as any other client does: a browser
/// hands a page only the headers the answer exposes, and the SDK, finding
/// none, retried the 502 on its own, sending the prompt to more workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_is_told_not_to_retry_a_request_that_broke_workers() {
    let (urls, _crashes) = crashable_workers(3, 3).await;
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut cfg = config(&refs);
    cfg.retry.max_retries = 2;
    cfg.retry.initial_backoff_ms = 1;
    cfg.server.cors_allowed_origins = vec!["https://chat.example".into()];
    let gw = gateway_ready(cfg, 3).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("origin", "https://chat.example")
        .json(&chat("please crash", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let h = r.headers();
    assert_eq!(h["x-should-retry"], "false");
    assert_eq!(h["access-control-allow-origin"], "https://chat.example");
    let exposed = h["access-control-expose-headers"].to_str().unwrap();
    assert!(
        exposed
            .split(',')
            .any(|name| name.trim() == "x-should-retry"),
        "a page reads only {exposed}"
    );
    gw.shutdown().await;
}

/// A request with no routing text (reranking, scoring, an upload to an
/// unrouted path) is told from another by its body: one that broke two
/// workers makes only itself a suspect, not every other such request for
/// its model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspect_without_routing_text_is_told_by_its_body() {
    let (gw, crashes) = crash_pool().await;
    let rerank = |query: &str| {
        client()
            .post(format!("{}/v1/rerank", gw.url))
            .json(&json!({
                "model": radixgate_sim::server::DEFAULT_MODEL,
                "query": query,
                "documents": ["a", "b"],
            }))
            .send()
    };
    for (query, crashed) in [("crash one", 2), ("crash two", 4)] {
        let r = rerank(query).await.unwrap();
        assert_eq!(r.status(), 502, "{query}");
        let body: Value = r.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("2 workers broke the connection"),
            "{query}: {message}"
        );
        assert_eq!(crashes.load(Ordering::SeqCst), crashed, "{query}");
    }
    // The same request again is a suspect.
    let r = rerank("crash one").await.unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(crashes.load(Ordering::SeqCst), 5);
    gw.shutdown().await;
}

/// A worker of `sim-llama-8b` whose chat completions `chat` answers; its
/// URL.
async fn worker_answering(chat: axum::routing::MethodRouter) -> String {
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/models",
            axum::routing::get(|| async { axum::Json(json!({"data": [{"id": "sim-llama-8b"}]})) }),
        )
        .route("/v1/chat/completions", chat);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// A whole chat answer, "ok", with its usage.
fn ok_answer() -> Value {
    json!({
        "choices": [{"message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })
}

/// Workers that answer 500 to a prompt with "poison" in it, or to every
/// prompt when `broken`; 200 otherwise.
async fn poisonable_workers(n: usize, broken: usize) -> Vec<String> {
    let mut urls = Vec::new();
    for i in 0..n {
        let is_broken = i < broken;
        let answer = move |axum::Json(body): axum::Json<Value>| async move {
            use axum::response::IntoResponse;
            if is_broken || body.to_string().contains("poison") {
                let error = json!({"error": {"message": "engine error", "type": "server_error"}});
                return (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(error),
                )
                    .into_response();
            }
            axum::Json(ok_answer()).into_response()
        };
        urls.push(worker_answering(axum::routing::post(answer)).await);
    }
    urls
}

/// A request that every worker answers 500 (a prompt that trips an
/// engine's bug) does not open the workers' breakers: a client repeating
/// it does not take the pool out. A worker that answers 500 to everything
/// still has its breaker opened, since other workers answer its requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_every_worker_answers_500_opens_no_breaker_but_a_broken_worker_is_left_out() {
    let urls = poisonable_workers(3, 0).await;
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let gw = gateway_ready(config(&refs), 3).await;
    for i in 0..8 {
        let r = post_chat(&gw.url, &chat(&format!("poison {i}"), false)).await;
        assert_eq!(r.status(), 500, "poison {i}");
    }
    for i in 0..3 {
        let r = post_chat(&gw.url, &chat(&format!("normal {i}"), false)).await;
        assert_eq!(r.status(), 200, "normal {i}: {}", r.text().await.unwrap());
    }
    gw.shutdown().await;

    let urls = poisonable_workers(3, 1).await;
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut cfg = config(&refs);
    cfg.routing = PolicyConfig::RoundRobin(RoundRobinConfig::default());
    let gw = gateway_ready(cfg, 3).await;
    for i in 0..20 {
        let r = post_chat(&gw.url, &chat(&format!("normal {i}"), false)).await;
        assert_eq!(r.status(), 200, "normal {i}");
    }
    let broken = format!("worker=\"{}\"", urls[0]);
    wait_until("the broken worker's breaker open", || async {
        metrics_text(&gw.url).await.lines().any(|l| {
            l.starts_with("radixgate_circuit_breaker_state{")
                && l.contains(&broken)
                && l.ends_with(" 1")
        })
    })
    .await;
    // `/workers` says so too, and why it gets no requests while healthy.
    let listed = workers(&gw.url).await;
    let row = |url: &str| listed.iter().find(|w| w["url"] == url).unwrap().clone();
    assert_eq!(row(&urls[0])["breaker"], "open", "{listed:?}");
    assert_eq!(row(&urls[0])["state"], "healthy", "{listed:?}");
    assert_eq!(row(&urls[1])["breaker"], "closed", "{listed:?}");
    assert_eq!(row(&urls[1])["ejected"], false, "{listed:?}");
    gw.shutdown().await;
}

/// Workers that take `capacity` requests at a time, each answered after
/// `pause`, and answer 429 to any more (an engine's or a proxy's limit on
/// concurrent requests: busy, not broken).
async fn busy_workers(n: usize, capacity: usize, pause: Duration) -> Vec<String> {
    let mut urls = Vec::new();
    for _ in 0..n {
        let slots = Arc::new(tokio::sync::Semaphore::new(capacity));
        let answer = move || {
            let slots = slots.clone();
            async move {
                use axum::response::IntoResponse;
                let Ok(_slot) = slots.try_acquire() else {
                    let error =
                        json!({"error": {"message": "too many requests", "type": "rate_limit"}});
                    return (axum::http::StatusCode::TOO_MANY_REQUESTS, axum::Json(error))
                        .into_response();
                };
                tokio::time::sleep(pause).await;
                axum::Json(ok_answer()).into_response()
            }
        };
        urls.push(worker_answering(axum::routing::post(answer)).await);
    }
    urls
}

/// A burst beyond the pool's capacity, which the workers shed with 429,
/// opens no breaker: a 429 says the worker is busy, not that it fails.
/// Counted as failures, five quick 429s opened each worker's breaker in
/// the burst's first moment, and the idle pool then answered every
/// request 503 until the breakers' timeout and two probes each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_the_workers_shed_with_429_opens_no_breaker() {
    let urls = busy_workers(2, 2, Duration::from_millis(300)).await;
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut c = config(&refs);
    c.circuit_breaker.timeout_duration_secs = 3600;
    let gw = gateway_ready(c, 2).await;
    let burst = (0..24).map(|i| {
        let url = gw.url.clone();
        async move {
            let r = post_chat(&url, &chat(&format!("burst {i}"), false)).await;
            r.status()
        }
    });
    let statuses = futures::future::join_all(burst).await;
    // The pool is overloaded: some are shed (the worker's 429 reaches the
    // client once every attempt met one), the rest served.
    assert!(statuses.iter().any(|s| *s == 200), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    // The burst is over and the workers are idle: they take requests.
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat(&format!("after the burst {i}"), false)).await;
        assert_eq!(
            r.status(),
            200,
            "after the burst {i}: {}",
            r.text().await.unwrap()
        );
    }
    let text = metrics_text(&gw.url).await;
    for url in &urls {
        let open = text.lines().any(|l| {
            l.starts_with("radixgate_circuit_breaker_state{")
                && l.contains(&format!("worker=\"{url}\""))
                && !l.ends_with(" 0")
        });
        assert!(!open, "{url}'s breaker is not closed:\n{text}");
    }
    gw.shutdown().await;
}

/// Workers that shed every request with `status`, saying when to come
/// back: `Retry-After` as `retry_after` says, one worker a value.
async fn shedding_workers(status: u16, retry_after: &[&'static str]) -> Vec<String> {
    let mut urls = Vec::new();
    for &after in retry_after {
        let answer = move || async move {
            use axum::response::IntoResponse;
            let status = axum::http::StatusCode::from_u16(status).unwrap();
            let error = json!({"error": {"message": "over capacity", "type": "overloaded"}});
            (status, [("retry-after", after)], axum::Json(error)).into_response()
        };
        urls.push(worker_answering(axum::routing::post(answer)).await);
    }
    urls
}

/// A worker that sheds a request with 429 or 503 says when to come back
/// (`Retry-After`). When every worker the request could go to shed it
/// before its retries ran out (one or two workers, three retries), the
/// client got the router's error without the header, and came back at
/// once (an OpenAI SDK waits half a second without one). It now gets the
/// last worker's `Retry-After`, as it does when the last retry passes the
/// worker's own answer on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_retry_after_reaches_the_client_when_every_worker_shed_the_request() {
    for (status, after) in [(429, &["7"][..]), (503, &["30", "30"]), (429, &["5", "5"])] {
        let urls = shedding_workers(status, after).await;
        let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
        let gw = gateway_ready(config(&refs), refs.len()).await;
        let r = post_chat(&gw.url, &chat("shed", false)).await;
        assert_eq!(r.status(), status);
        let header = r.headers().get("retry-after").cloned();
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            header.as_ref().and_then(|v| v.to_str().ok()),
            Some(after[0]),
            "{status} from {} workers: {body}",
            urls.len()
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("over capacity"), "{body}");
        gw.shutdown().await;
    }
}

/// A worker that counts the requests it is sent, and answers the first
/// `shed` of them `status` with `Retry-After: 30`, any later one 200.
async fn counting_shedder(status: u16, shed: usize) -> (String, Arc<AtomicUsize>) {
    let sent = Arc::new(AtomicUsize::new(0));
    let count = sent.clone();
    let answer = move || {
        let count = count.clone();
        async move {
            use axum::response::IntoResponse;
            if count.fetch_add(1, Ordering::SeqCst) >= shed {
                return axum::Json(ok_answer()).into_response();
            }
            let status = axum::http::StatusCode::from_u16(status).unwrap();
            let error = json!({"error": {"message": "over quota", "type": "rate_limit"}});
            (status, [("retry-after", "30")], axum::Json(error)).into_response()
        }
    };
    (worker_answering(axum::routing::post(answer)).await, sent)
}

/// A worker that answered 429 or 503 with `Retry-After` is passed over
/// until then while another worker can take the request. It counted on
/// no breaker (a 429) or not yet on an open one (a 503), so it was
/// chosen again by the next request, which paid a refused attempt and a
/// back-off before its retry: in the test, about one request in two went
/// there first (with `retry.max_retry_after_secs: 0`, as before, it is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_says_retry_after_is_passed_over_until_then() {
    for status in [429, 503] {
        for max_retry_after_secs in [60, 0] {
            let (shedder, shed) = counting_shedder(status, usize::MAX).await;
            let (good, served) = counting_shedder(status, 0).await;
            let mut c = config(&[&shedder, &good]);
            c.retry.max_retry_after_secs = max_retry_after_secs;
            c.circuit_breaker.failure_threshold = 100;
            let gw = gateway_ready(c, 2).await;
            for i in 0..16 {
                let prompt = format!("{i} {}", "distinct question ".repeat(i + 1));
                let r = post_chat(&gw.url, &chat(&prompt, false)).await;
                assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            }
            let (shed, served) = (shed.load(Ordering::SeqCst), served.load(Ordering::SeqCst));
            assert_eq!(served, 16);
            if max_retry_after_secs > 0 {
                assert_eq!(shed, 1, "{status}: tried again within its pause");
            } else {
                assert!(shed > 1, "{status}: Retry-After is not to be honoured");
            }
            gw.shutdown().await;
        }
    }
}

/// A worker that sheds a request with 429 or 503 never read its prompt:
/// the router's record of its cache does not keep it. Before, it did, and
/// the same prompt came back to that worker as a cache hit that was not
/// there (on every replica that learned of it too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_a_worker_shed_is_not_taken_for_cached_there() {
    for status in [429, 503] {
        let (only, _) = counting_shedder(status, 1).await;
        let mut c = config(&[&only]);
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 100;
        let gw = gateway_ready(c, 1).await;
        let body = chat(&"A long shared preamble. ".repeat(40), false);
        assert_eq!(post_chat(&gw.url, &body).await.status(), status);
        let (_, decision) = served_by(post_chat(&gw.url, &body).await).await;
        assert!(
            !decision.contains("branch=cache_hit"),
            "{status}: {decision}"
        );
        // Served, it is.
        let (_, decision) = served_by(post_chat(&gw.url, &body).await).await;
        assert!(
            decision.contains("branch=cache_hit"),
            "{status}: {decision}"
        );
        gw.shutdown().await;
    }
}

/// A pause never makes a model unavailable: a worker pausing is still
/// chosen when no other can take the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_worker_is_chosen_in_its_pause() {
    let (only, sent) = counting_shedder(429, 1).await;
    let mut c = config(&[&only]);
    c.retry.max_retries = 0;
    let gw = gateway_ready(c, 1).await;
    let r = post_chat(&gw.url, &chat("first", false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "30");
    let r = post_chat(&gw.url, &chat("second", false)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    gw.shutdown().await;
}

/// A worker restarted with another model at its URL (down for its
/// restart, then healthy again) is asked for its models again when it comes
/// back: the router serves the new model and no longer the old one. It
/// kept the models read on admission, so the new one was a 404
/// `model_not_found` at the router and the old one went to a worker that
/// no longer served it, until the worker was removed and added again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_with_another_model_serves_it() {
    use axum::extract::State;
    use parking_lot::Mutex;
    /// The model served; `None` while restarting (its `/health` is 503).
    type Serving = Arc<Mutex<Option<&'static str>>>;
    let serving: Serving = Arc::new(Mutex::new(Some("model-a")));
    let app = axum::Router::new()
        .route(
            "/health",
            axum::routing::get(|State(s): State<Serving>| async move {
                match *s.lock() {
                    Some(_) => axum::http::StatusCode::OK,
                    None => axum::http::StatusCode::SERVICE_UNAVAILABLE,
                }
            }),
        )
        .route(
            "/v1/models",
            axum::routing::get(|State(s): State<Serving>| async move {
                let data: Vec<Value> = s.lock().iter().map(|m| json!({"id": m})).collect();
                axum::Json(json!({"data": data}))
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(
                |State(s): State<Serving>, axum::Json(body): axum::Json<Value>| async move {
                    let asked = body["model"].as_str().unwrap_or_default().to_owned();
                    if *s.lock() == Some(asked.as_str()) {
                        (axum::http::StatusCode::OK, axum::Json(ok_answer()))
                    } else {
                        let error = json!({"error": {"message": format!("no model {asked}")}});
                        (axum::http::StatusCode::NOT_FOUND, axum::Json(error))
                    }
                },
            ),
        )
        .with_state(serving.clone());
    let (url, stop) = serve_app(app).await;
    let gw = gateway_ready(config(&[&url]), 1).await;
    assert_eq!(model_ids(&gw.url).await, ["model-a"]);

    *serving.lock() = None;
    wait_for_healthy(&gw.url, 0).await;
    *serving.lock() = Some("model-b");
    wait_for_healthy(&gw.url, 1).await;

    assert_eq!(model_ids(&gw.url).await, ["model-b"]);
    let mut body = chat("after the restart", false);
    body["model"] = json!("model-b");
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[WORKER_HEADER], url.as_str());
    body["model"] = json!("model-a");
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 404);
    let listed = workers(&gw.url).await;
    assert_eq!(listed[0]["models"], json!(["model-b"]), "{listed:?}");
    assert_eq!(listed[0]["state"], "healthy", "{listed:?}");
    gw.shutdown().await;
    stop.cancel();
}

/// A URL whose server changes model without failing a probe (a Service
/// whose pods a rolling update replaced with another model's) is routed
/// for the new model once its models are read again, every
/// `models_refresh_secs`. They were read only on admission and on a
/// return from failure: the new model was a 404 at the router, and the
/// old one went to a server that no longer had it, until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_changes_model_while_healthy_is_routed_for_the_new_one() {
    use axum::extract::State;
    use parking_lot::Mutex;
    type Serving = Arc<Mutex<&'static str>>;
    let serving: Serving = Arc::new(Mutex::new("model-a"));
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/models",
            axum::routing::get(|State(s): State<Serving>| async move {
                axum::Json(json!({"data": [{"id": *s.lock()}]}))
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(|| async { axum::Json(ok_answer()) }),
        )
        .with_state(serving.clone());
    let (url, stop) = serve_app(app).await;
    let mut c = config(&[&url]);
    c.health.interval_secs = 1;
    c.health.models_refresh_secs = 1;
    let gw = gateway_ready(c, 1).await;
    assert_eq!(model_ids(&gw.url).await, ["model-a"]);
    *serving.lock() = "model-b";
    wait_until("the new model listed", || async {
        model_ids(&gw.url).await == ["model-b"]
    })
    .await;
    let mut body = chat("after the rollout", false);
    body["model"] = json!("model-b");
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[WORKER_HEADER], url.as_str());
    gw.shutdown().await;
    stop.cancel();
}

/// A fake vLLM started with `--enable-lora`: its `/v1/models` lists the
/// entries in its list, which the test changes as
/// `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` would.
async fn lora_worker() -> (
    String,
    Arc<parking_lot::Mutex<Vec<Value>>>,
    CancellationToken,
) {
    let (url, listed, _, stop) = lora_worker_that_can_fail().await;
    (url, listed, stop)
}

/// [`lora_worker`], whose `/health` answers 503 while the flag it gives
/// is set (an engine restarting).
async fn lora_worker_that_can_fail() -> (
    String,
    Arc<parking_lot::Mutex<Vec<Value>>>,
    Arc<AtomicBool>,
    CancellationToken,
) {
    use axum::extract::State;
    type Listed = Arc<parking_lot::Mutex<Vec<Value>>>;
    let listed: Listed = Arc::new(parking_lot::Mutex::new(vec![json!({
        "id": "base-model", "object": "model", "root": "/models/base",
        "parent": null, "max_model_len": 4096,
    })]));
    let down = Arc::new(AtomicBool::new(false));
    let health = {
        let down = down.clone();
        move || async move {
            match down.load(Ordering::SeqCst) {
                true => axum::http::StatusCode::SERVICE_UNAVAILABLE,
                false => axum::http::StatusCode::OK,
            }
        }
    };
    let app = axum::Router::new()
        .route("/health", axum::routing::get(health))
        .route(
            "/v1/models",
            axum::routing::get(|State(l): State<Listed>| async move {
                axum::Json(json!({"object": "list", "data": *l.lock()}))
            }),
        )
        .route("/v1/chat/completions", axum::routing::post(lora_chat))
        .with_state(listed.clone());
    let (url, stop) = serve_app(app).await;
    (url, listed, down, stop)
}

/// A chat request to a fake vLLM started with `--enable-lora`, as vLLM
/// answers it: a model it does not list (an adapter it never loaded or
/// unloaded) is its 404.
async fn lora_chat(
    axum::extract::State(listed): axum::extract::State<Arc<parking_lot::Mutex<Vec<Value>>>>,
    axum::Json(body): axum::Json<Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let model = body["model"].as_str().unwrap_or_default();
    if listed.lock().iter().any(|m| m["id"] == model) {
        return axum::Json(ok_answer()).into_response();
    }
    let message = format!("The model `{model}` does not exist.");
    let error = json!({"error": {"message": message, "type": "NotFoundError",
        "param": "model", "code": 404}});
    (axum::http::StatusCode::NOT_FOUND, axum::Json(error)).into_response()
}

/// vLLM's entry for a LoRA adapter of `base-model` loaded from `root`.
fn adapter(id: &str, root: &str) -> Value {
    json!({"id": id, "object": "model", "root": root, "parent": "base-model"})
}

/// The id `/workers` gives the worker at `url`.
async fn worker_id(gateway: &str, url: &str) -> Value {
    let listed = workers(gateway).await;
    let found = listed.iter().find(|w| w["url"] == url);
    found.map(|w| w["id"].clone()).unwrap_or_default()
}

/// A LoRA adapter loaded into (or unloaded from) a vLLM worker at
/// runtime changes its model list, which the router reads again every
/// `models_refresh_secs`: the worker keeps its id and its cache record
/// for the base model, so a prompt it served before is still a cache hit
/// there. Before, every such change replaced the worker under a new id
/// and forgot all it had cached, for every model. A restart with another
/// base model still starts afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lora_adapter_loaded_at_runtime_keeps_the_workers_cache_record() {
    let (a, a_listed, stop_a) = lora_worker().await;
    let (b, b_listed, stop_b) = lora_worker().await;
    let mut c = config(&[&a, &b]);
    c.health.interval_secs = 1;
    c.health.models_refresh_secs = 1;
    let gw = gateway_ready(c, 2).await;
    let mut body = chat(&"Answer in SQL only. ".repeat(30), false);
    body["model"] = json!("base-model");
    let (holder, decision) = served_by(post_chat(&gw.url, &body).await).await;
    let listed = if holder == a { &a_listed } else { &b_listed };
    let id = worker_id(&gw.url, &holder).await;
    assert!(id.is_string(), "{decision}");

    listed.lock().push(adapter("sql-lora", "/adapters/sql"));
    wait_until("the adapter listed", || async {
        model_ids(&gw.url).await == ["base-model", "sql-lora"]
    })
    .await;
    let (again, decision) = served_by(post_chat(&gw.url, &body).await).await;
    assert_eq!(again, holder, "{decision}");
    assert!(decision.contains("branch=cache_hit"), "{decision}");
    assert_eq!(worker_id(&gw.url, &holder).await, id);
    let mut lora = body.clone();
    lora["model"] = json!("sql-lora");
    let (by, decision) = served_by(post_chat(&gw.url, &lora).await).await;
    assert_eq!(by, holder, "only it has the adapter: {decision}");

    listed.lock().pop();
    wait_until("the adapter gone", || async {
        model_ids(&gw.url).await == ["base-model"]
    })
    .await;
    let (again, decision) = served_by(post_chat(&gw.url, &body).await).await;
    assert_eq!(again, holder, "{decision}");
    assert!(decision.contains("branch=cache_hit"), "{decision}");
    assert_eq!(worker_id(&gw.url, &holder).await, id);
    let r = post_chat(&gw.url, &lora).await;
    assert_eq!(r.status(), 404, "the adapter unloaded is no model");

    // A restart with another base model: another worker, afresh.
    *listed.lock() = vec![json!({"id": "other-base", "root": "/models/other"})];
    wait_until("the other base model listed", || async {
        model_ids(&gw.url).await.contains(&"other-base".to_owned())
    })
    .await;
    assert_ne!(worker_id(&gw.url, &holder).await, id);
    gw.shutdown().await;
    stop_a.cancel();
    stop_b.cancel();
}

/// A LoRA adapter unloaded from a worker between two reads of its models
/// (or another model started at its URL): the router still lists it there,
/// and the worker answers 404 for it ("The model `m` does not exist.").
/// The request is tried on another worker listed with the model, and the
/// worker's models are read again at once, not at the next
/// `models_refresh_secs`. Before, the client got the 404 while another
/// worker served the adapter, until that next read (30 s by default).
/// Where no other worker is listed with it, the worker's 404 is the
/// answer, as before, and its models are read again all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_unloaded_an_adapter_passes_its_requests_on() {
    let (a, a_listed, stop_a) = lora_worker().await;
    let (b, b_listed, stop_b) = lora_worker().await;
    for listed in [&a_listed, &b_listed] {
        listed.lock().push(adapter("sql-lora", "/adapters/sql"));
    }
    let mut c = config(&[&a, &b]);
    // Read again only when asked, within the test's time.
    c.health.models_refresh_secs = 3600;
    let gw = gateway_ready(c, 2).await;
    let mut body = chat(&"Answer in SQL only. ".repeat(30), false);
    body["model"] = json!("sql-lora");
    let (holder, decision) = served_by(post_chat(&gw.url, &body).await).await;
    let (other, listed, other_listed) = match holder == a {
        true => (&b, &a_listed, &b_listed),
        false => (&a, &b_listed, &a_listed),
    };
    listed.lock().pop();

    // Its cache hit takes the prompt to the holder first, which turns it
    // away; the other serves it.
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 200, "{decision}");
    let (by, decision) = served_by(r).await;
    assert_eq!(&by, other, "{decision}");
    let metrics = metrics_text(&gw.url).await;
    let counted = format!(
        "radixgate_upstream_errors_total{{worker=\"{holder}\",kind=\"model_not_served\"}} 1"
    );
    assert!(metrics.contains(&counted), "{metrics}");
    wait_until("the holder listed without the adapter", || async {
        let listed = workers(&gw.url).await;
        let found = listed.iter().find(|w| w["url"] == holder.as_str());
        found.is_some_and(|w| w["models"] == json!(["base-model"]))
    })
    .await;

    // Unloaded everywhere: the last worker's own 404 is the answer.
    other_listed.lock().pop();
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 404);
    let answer: Value = r.json().await.unwrap();
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(message, "The model `sql-lora` does not exist.", "{answer}");
    // Its models are read again too.
    wait_until("the adapter listed nowhere", || async {
        model_ids(&gw.url).await == ["base-model"]
    })
    .await;
    gw.shutdown().await;
    stop_a.cancel();
    stop_b.cancel();
}

/// An engine restarted loses the LoRA adapters loaded into it at runtime:
/// back from its outage, a vLLM worker lists its base model alone. The
/// router takes any change of a worker's list after an outage for a
/// restart: the worker gets a new id and its cache record starts afresh,
/// so a prompt it served before is no longer a cache hit there. Before,
/// the change was taken for an adapter unloaded, and the record of a
/// cache the restart had emptied kept drawing that prompt to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_back_from_an_outage_without_its_adapters_starts_afresh() {
    let (a, a_listed, a_down, stop_a) = lora_worker_that_can_fail().await;
    let (b, b_listed, b_down, stop_b) = lora_worker_that_can_fail().await;
    for listed in [&a_listed, &b_listed] {
        listed.lock().push(adapter("sql-lora", "/adapters/sql"));
    }
    let gw = gateway_ready(config(&[&a, &b]), 2).await;
    let mut body = chat(&"Answer in SQL only. ".repeat(30), false);
    body["model"] = json!("base-model");
    let (holder, decision) = served_by(post_chat(&gw.url, &body).await).await;
    let id = worker_id(&gw.url, &holder).await;
    assert!(id.is_string(), "{decision}");
    let (listed, down) = match holder == a {
        true => (&a_listed, &a_down),
        false => (&b_listed, &b_down),
    };

    down.store(true, Ordering::SeqCst);
    let state = |gateway: String, url: String| async move {
        let listed = workers(&gateway).await;
        let found = listed.iter().find(|w| w["url"] == url.as_str()).cloned();
        found.unwrap_or_default()
    };
    wait_until("the holder unhealthy", || async {
        state(gw.url.clone(), holder.clone()).await["state"] == "unhealthy"
    })
    .await;
    listed.lock().pop();
    down.store(false, Ordering::SeqCst);
    wait_until("the holder back with its base model alone", || async {
        let w = state(gw.url.clone(), holder.clone()).await;
        w["state"] == "healthy" && w["models"] == json!(["base-model"])
    })
    .await;
    assert_ne!(worker_id(&gw.url, &holder).await, id, "a restart");
    let (_, decision) = served_by(post_chat(&gw.url, &body).await).await;
    assert!(!decision.contains("branch=cache_hit"), "{decision}");
    gw.shutdown().await;
    stop_a.cancel();
    stop_b.cancel();
}

/// The router's `/v1/models` keeps what vLLM says of a LoRA adapter: its
/// `parent` (the base model's id) and its `root` where the workers agree
/// on it, so a client can tell an adapter from a base model and find its
/// base. Before, each entry was rebuilt from the id alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_list_keeps_an_adapters_parent_and_root() {
    let (a, a_listed, stop_a) = lora_worker().await;
    let (b, b_listed, stop_b) = lora_worker().await;
    a_listed.lock().push(adapter("sql-lora", "/adapters/sql"));
    b_listed.lock().push(adapter("sql-lora", "/elsewhere/sql"));
    b_listed.lock().push(adapter("chat-lora", "/adapters/chat"));
    let gw = gateway_ready(config(&[&a, &b]), 2).await;
    let list = get_json(&gw.url, "/v1/models").await;
    let entry = |id: &str| {
        let data = list["data"].as_array().unwrap();
        data.iter().find(|m| m["id"] == id).cloned().unwrap()
    };
    let base = entry("base-model");
    assert_eq!(base["parent"], Value::Null, "{base}");
    assert_eq!(base["root"], "/models/base", "{base}");
    let chat = entry("chat-lora");
    assert_eq!(chat["parent"], "base-model", "{chat}");
    assert_eq!(chat["root"], "/adapters/chat", "{chat}");
    let sql = entry("sql-lora");
    assert_eq!(sql["parent"], "base-model", "{sql}");
    assert!(sql.get("root").is_none(), "the workers disagree: {sql}");
    assert_eq!(get_json(&gw.url, "/v1/models/sql-lora").await, sql);
    gw.shutdown().await;
    stop_a.cancel();
    stop_b.cancel();
}

/// A worker that wants an API key (vLLM's `--api-key`, which leaves
/// `/health` open) added without one is held out of rotation, its
/// problem naming the setting, and clients get the router's 503, not
/// the worker's 401 (which tells them their own key is wrong). Before,
/// its passing probes admitted it as serving any model, and every
/// request went to it. With its key it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_wants_a_key_the_router_does_not_send_is_held_out() {
    const KEY: &str = "worker-key";
    let keyed = |headers: &axum::http::HeaderMap| {
        headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {KEY}"))
    };
    let refused = || {
        let error = json!({"error": {"message": "invalid api key"}});
        (axum::http::StatusCode::UNAUTHORIZED, axum::Json(error))
    };
    let app = axum::Router::new()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .route(
            "/v1/models",
            axum::routing::get(move |headers: axum::http::HeaderMap| async move {
                match keyed(&headers) {
                    true => (
                        axum::http::StatusCode::OK,
                        axum::Json(json!({"data": [{"id": "keyed-model"}]})),
                    ),
                    false => refused(),
                }
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(move |headers: axum::http::HeaderMap| async move {
                match keyed(&headers) {
                    true => (axum::http::StatusCode::OK, axum::Json(ok_answer())),
                    false => refused(),
                }
            }),
        );
    let (url, stop) = serve_app(app).await;
    let gw = gateway(config(&[&url])).await;
    wait_until("the worker's problem to name its key", || async {
        workers(&gw.url).await.iter().any(|w| {
            w["state"] == "pending"
                && w["problem"]
                    .as_str()
                    .is_some_and(|p| p.contains("/v1/models with 401") && p.contains("`api_key`"))
        })
    })
    .await;
    let mut body = chat("who answers?", false);
    body["model"] = json!("keyed-model");
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 503, "{}", r.text().await.unwrap());
    gw.shutdown().await;

    let mut c = config(&[]);
    c.workers = vec![radixgate::config::WorkerSpec::new(url.clone()).with_api_key(KEY)];
    let gw = gateway_ready(c, 1).await;
    let r = post_chat(&gw.url, &body).await;
    assert_eq!(r.status(), 200);
    gw.shutdown().await;
    stop.cancel();
}

/// A 404 from a worker listed with the request's model has its body read
/// ahead to see whether it names the model; a body that stalls is not
/// waited for past a moment: the client gets the worker's answer, as it
/// would from any other 404, or, where the body named the model and
/// another worker is listed with it, that worker's. Before, each waited
/// for the attempt's first-byte deadline (a whole answer's: 300 s by
/// default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_whose_body_stalls_is_passed_on_at_once() {
    for opening in [
        &b"{\"error\": "[..],
        b"{\"message\": \"The model `base-model` does",
    ] {
        let stalled = move || async move {
            let body = futures::stream::once(async move {
                Ok::<_, std::io::Error>(bytes::Bytes::from_static(opening))
            })
            .chain(futures::stream::pending());
            (
                axum::http::StatusCode::NOT_FOUND,
                axum::body::Body::from_stream(body),
            )
        };
        let listed = || async { axum::Json(json!({"data": [{"id": "base-model"}]})) };
        let app = axum::Router::new()
            .route("/health", axum::routing::get(|| async { "ok" }))
            .route("/v1/models", axum::routing::get(listed))
            .route("/v1/chat/completions", axum::routing::post(stalled));
        let (url, stop) = serve_app(app).await;
        // A worker that serves the model, where the body names it.
        let names = opening.len() > 20;
        let good = axum::Router::new()
            .route("/health", axum::routing::get(|| async { "ok" }))
            .route("/v1/models", axum::routing::get(listed))
            .route(
                "/v1/chat/completions",
                axum::routing::post(|| async { axum::Json(ok_answer()) }),
            );
        let (good, stop_good) = serve_app(good).await;
        let workers = if names {
            vec![&*url, &*good]
        } else {
            vec![&*url]
        };
        let gw = gateway_ready(round_robin(config(&workers)), workers.len()).await;
        // Round robin: one of the two requests goes to the stalled worker.
        for i in 0..workers.len() {
            let mut body = chat(&format!("a question {i}"), false);
            body["model"] = json!("base-model");
            let answered =
                tokio::time::timeout(Duration::from_secs(60), post_chat(&gw.url, &body)).await;
            let r = answered.expect("held back behind a stalled body");
            assert_eq!(r.status(), if names { 200 } else { 404 });
            drop(r);
        }
        gw.shutdown().await;
        stop.cancel();
        stop_good.cancel();
    }
}

/// vLLM and SGLang stream a generation the engine failed as an error event
/// under a 200 (`{"error": {..., "code": 500}}`): a worker whose engine
/// broke while its server still answers sends that at once to every
/// request. The client got that error where another worker could serve
/// it, the breaker counted the worker a success, and the router's record
/// kept each prompt, drawing it back there. Such a stream is now the
/// worker's failure, tried on another worker (nothing was sent to the
/// client yet); a refusal (code 400) is still the client's answer, not
/// retried and no failure, and neither leaves the prompt on the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_opens_with_a_server_error_is_tried_on_another_worker() {
    const FAILED: &str = "data: {\"error\":{\"object\":\"error\",\"message\":\"engine failed\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n";
    const REFUSED: &str = "data: {\"error\":{\"message\":\"too long\",\"type\":\"BadRequestError\",\"code\":400}}\n\n";
    const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    const DONE: &str = "data: [DONE]\n\n";
    let send = |gw: String, i: u8| async move {
        // Long and unlike the others from its first letter (see
        // `a_refused_connection_leaves_no_prompt_on_the_workers_record`).
        let text = char::from(b'a' + i).to_string().repeat(300);
        let mut body = chat(&text, true);
        body["model"] = "scripted".into();
        let r = post_chat(&gw, &body).await;
        (r.status(), r.text().await.unwrap())
    };
    let stream_errors = |text: &str, url: &str| {
        text.lines()
            .filter(|l| l.contains("kind=\"stream_error\"") && l.contains(url))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };

    let good = scripted_worker(vec![TOKEN, DONE]).await;
    let failing = scripted_worker(vec![FAILED, DONE]).await;
    let gw = gateway_ready(bad_worker_first(&failing.url, &good.url), 2).await;
    for i in 0..6 {
        let (status, text) = send(gw.url.clone(), i).await;
        assert_eq!(
            (status.as_u16(), text.as_str()),
            (200, [TOKEN, DONE].concat().as_str())
        );
    }
    let tried = failing.received.lock().len();
    assert!(tried >= 5, "{tried} requests tried on the failing worker");
    let metrics = metrics_text(&gw.url).await;
    assert_eq!(
        stream_errors(&metrics, &failing.url),
        tried as f64,
        "{metrics}"
    );
    assert_eq!(
        worker_loads(&gw.url, &failing.url).await["cached_chars"],
        json!(0)
    );
    gw.shutdown().await;

    // Counted on its breaker: three failures open it, and it is sent no
    // more.
    let mut cfg = config(&[&failing.url, &good.url]);
    cfg.health.failure_threshold = 1000;
    cfg.circuit_breaker.failure_threshold = 3;
    cfg.routing = PolicyConfig::RoundRobin(RoundRobinConfig::default());
    let gw = gateway_ready(cfg, 2).await;
    let before = failing.received.lock().len();
    for i in 0..8 {
        let (status, _) = send(gw.url.clone(), i).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        failing.received.lock().len() - before,
        3,
        "its breaker opened"
    );
    gw.shutdown().await;

    // A refusal: the client's answer, as the worker sent it, on the first
    // try; no failure (a breaker opening at one would shut the worker out).
    let refusing = scripted_worker(vec![REFUSED, DONE]).await;
    let mut cfg = config(&[&refusing.url]);
    cfg.circuit_breaker.failure_threshold = 1;
    let gw = gateway_ready(cfg, 1).await;
    for i in 0..3 {
        let (status, text) = send(gw.url.clone(), i).await;
        assert_eq!(
            (status.as_u16(), text.as_str()),
            (200, [REFUSED, DONE].concat().as_str())
        );
    }
    assert_eq!(refusing.received.lock().len(), 3, "not retried");
    let metrics = metrics_text(&gw.url).await;
    assert_eq!(stream_errors(&metrics, &refusing.url), 0.0, "{metrics}");
    assert_eq!(
        worker_loads(&gw.url, &refusing.url).await["cached_chars"],
        json!(0)
    );
    gw.shutdown().await;
}

/// A pool that fails as a whole (every worker answers 500) was sent each
/// request `max_retries + 1` times: four times the load, on workers that
/// were failing already. The retry budget holds the retries of all
/// requests to `retry.budget_percent` of them (here 50, with no floor):
/// each request still gets its answer, the worker's 500, and the ones
/// over the budget are counted. With no budget (0), the old count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_budget_holds_retries_to_a_share_of_requests() {
    async fn failing() -> (String, Arc<AtomicUsize>) {
        let sent = Arc::new(AtomicUsize::new(0));
        let count = sent.clone();
        let answer = move || {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                let error =
                    json!({"error": {"message": "engine failed", "type": "InternalServerError"}});
                (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(error),
                )
            }
        };
        (worker_answering(axum::routing::post(answer)).await, sent)
    }
    const REQUESTS: usize = 20;
    for (percent, most, least) in [
        (50, REQUESTS * 3 / 2 + 1, REQUESTS),
        (0, 4 * REQUESTS, 4 * REQUESTS),
    ] {
        let mut urls = Vec::new();
        let mut counts = Vec::new();
        for _ in 0..4 {
            let (url, sent) = failing().await;
            urls.push(url);
            counts.push(sent);
        }
        let mut c = config(&urls.iter().map(String::as_str).collect::<Vec<_>>());
        c.retry.max_retries = 3;
        c.retry.initial_backoff_ms = 1;
        c.retry.max_backoff_ms = 1;
        c.retry.budget_percent = percent;
        c.retry.budget_min_per_sec = 0;
        let gw = gateway_ready(c, 4).await;
        for i in 0..REQUESTS {
            let r = post_chat(&gw.url, &chat(&format!("question {i}"), false)).await;
            assert_eq!(r.status(), 500, "{}", r.text().await.unwrap());
        }
        let sent: usize = counts.iter().map(|c| c.load(Ordering::SeqCst)).sum();
        assert!(
            (least..=most).contains(&sent),
            "budget {percent}%: {sent} attempts for {REQUESTS} requests"
        );
        let denied = series_value(&gw.url, "radixgate_retry_budget_exhausted_total").await;
        if percent > 0 {
            assert!(denied >= (REQUESTS / 2) as f64, "{denied} denied");
        } else {
            assert_eq!(denied, 0.0);
        }
        gw.shutdown().await;
    }
}

/// The retry budget weighed each retry when the attempt before it was
/// sent, and spent it only as the retry went out, after its back-off. A
/// pool that fails as a whole fails the requests it holds together, at
/// one instant: each had found room when it was sent, so each was retried,
/// and the retries that went out first found room for a third attempt, a
/// burst of retries well past the budget, made by exactly the failure it
/// is for. A retry is now weighed and spent when its attempt has failed:
/// 20 requests failing together get about 10 retries (50%, no floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_failing_together_get_the_budgets_retries_not_each_one() {
    const REQUESTS: usize = 20;
    let sent = Arc::new(AtomicUsize::new(0));
    let mut urls = Vec::new();
    for _ in 0..4 {
        let count = sent.clone();
        let answer = move || {
            let count = count.clone();
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                // Long enough for every request to be in flight before
                // the first fails: a pool failing under load.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let error =
                    json!({"error": {"message": "engine failed", "type": "InternalServerError"}});
                (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(error),
                )
            }
        };
        urls.push(worker_answering(axum::routing::post(answer)).await);
    }
    let mut c = config(&urls.iter().map(String::as_str).collect::<Vec<_>>());
    c.retry.max_retries = 3;
    c.retry.initial_backoff_ms = 1;
    c.retry.max_backoff_ms = 1;
    c.retry.budget_percent = 50;
    c.retry.budget_min_per_sec = 0;
    c.circuit_breaker.enabled = false;
    let gw = gateway_ready(c, 4).await;
    let all = (0..REQUESTS).map(|i| {
        let gw = gw.url.clone();
        async move {
            let r = post_chat(&gw, &chat(&format!("question {i}"), false)).await;
            r.status()
        }
    });
    for status in futures::future::join_all(all).await {
        assert_eq!(status, 500);
    }
    let sent = sent.load(Ordering::SeqCst);
    assert!(
        (REQUESTS..=REQUESTS * 3 / 2 + 1).contains(&sent),
        "{sent} attempts for {REQUESTS} requests failing together"
    );
    let denied = series_value(&gw.url, "radixgate_retry_budget_exhausted_total").await;
    assert!(denied >= (REQUESTS / 2 - 1) as f64, "{denied} denied");
    gw.shutdown().await;
}
