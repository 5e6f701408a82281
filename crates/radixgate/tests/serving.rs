//! The serving surface of `radixgate serve`, end to end on loopback: every
//! endpoint, byte-exact passthrough both ways, errors as OpenAI JSON, auth,
//! and load released after every way a request can end.

mod common;

use common::*;
use futures::StreamExt;
use radixgate::proxy::{DECISION_HEADER, WORKER_HEADER};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers() {
    let w = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let gw = gateway_ready(config(&[&w[0].url, &w[1].url]), 2).await;
    let c = client();
    let model = radixgate_sim::server::DEFAULT_MODEL;

    for (path, body) in [
        ("/v1/chat/completions", chat("hello", false)),
        (
            "/v1/completions",
            json!({"model": model, "prompt": "hello", "max_tokens": 3}),
        ),
        (
            "/generate",
            json!({"text": "hello", "sampling_params": {"max_new_tokens": 3}}),
        ),
    ] {
        let r = c
            .post(format!("{}{path}", gw.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert!(r.headers().contains_key(WORKER_HEADER), "{path}");
        let decision = r.headers()[DECISION_HEADER].to_str().unwrap().to_owned();
        assert!(decision.starts_with("cache_aware branch="), "{decision}");
        let body: Value = r.json().await.unwrap();
        assert!(body.get("error").is_none(), "{path}: {body}");
    }
    let r = c
        .post(format!("{}/v1/embeddings", gw.url))
        .json(&json!({"model": model, "input": ["first text", "second text"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key(WORKER_HEADER));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["data"].as_array().unwrap().len(), 2, "{body}");
    assert_eq!(body["data"][1]["index"], 1, "{body}");
    assert!(
        body["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{body}"
    );

    let models: Value = c
        .get(format!("{}/v1/models", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], model);
    for path in [
        "/health",
        "/liveness",
        "/readiness",
        "/get_server_info",
        "/get_model_info",
        "/get_loads",
    ] {
        let r = c.get(format!("{}{path}", gw.url)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let _: Value = r.json().await.unwrap();
    }
    let info: Value = c
        .get(format!("{}/get_server_info", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["workers"].as_array().unwrap().len(), 2);
    let flush = c
        .post(format!("{}/flush_cache", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(flush.status(), 200);
    let flush: Value = flush.json().await.unwrap();
    assert_eq!(flush["results"].as_array().unwrap().len(), 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_pass_through_unchanged_both_ways() {
    let pieces = vec![
        "data: {\"a\":",
        "1}\n\n",
        "data: {\"b\":\"é\"}\n",
        "\n",
        "data: [DONE]\n\n",
    ];
    let w = scripted_worker(pieces.clone()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    // Odd spacing, field order and fields the router does not know.
    let sent = "{ \"stream\" : true, \"zz_unknown\": {\"keep\": [1, 2.50, null]},\n \"messages\": [{\"role\":\"user\",\"content\":\"x\"}], \"model\":\"scripted\" }";
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("content-type", "application/json")
        .body(sent)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = r.bytes().await.unwrap();
    assert_eq!(got, pieces.concat().as_bytes());
    assert_eq!(w.received.lock().as_slice(), [sent.as_bytes()]);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_openai_json() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.max_payload_size = 1024;
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    let post = |body: String| {
        c.post(format!("{}/v1/chat/completions", gw.url))
            .body(body)
            .send()
    };

    let cases = [
        ("{not json".to_owned(), 400, "invalid_json"),
        (
            json!({"model": "nope", "messages": []}).to_string(),
            404,
            "model_not_found",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]}).to_string(),
            413,
            "payload_too_large",
        ),
    ];
    for (body, status, code) in cases {
        let r = post(body).await.unwrap();
        assert_eq!(r.status(), status);
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], code, "{e}");
        assert!(e["error"]["message"].as_str().unwrap().len() > 5);
    }
    // No model with one model served: that one.
    let r =
        post(json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).to_string())
            .await
            .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .get(format!("{}/no/such/route", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "not_found"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_guards_inference_and_admin() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.api_key = Some("sk-test".into());
    cfg.server.admin_api_key = Some("admin".into());
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", gw.url);

    let r = c.post(&url).json(&chat("hi", false)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "authentication_error"
    );
    let r = c
        .post(&url)
        .bearer_auth("sk-wrong")
        .json(&chat("hi", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .post(&url)
        .bearer_auth("sk-test")
        .json(&chat("hi", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Admin needs the admin key, not the client key.
    let workers = format!("{}/workers", gw.url);
    assert_eq!(
        c.get(&workers)
            .bearer_auth("sk-test")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        c.get(&workers)
            .bearer_auth("admin")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Probes stay open for orchestrators.
    assert_eq!(
        c.get(format!("{}/liveness", gw.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_returns_to_zero_after_every_ending() {
    let w = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let gw = gateway_ready(config(&[&w[0].url, &w[1].url]), 2).await;
    let c = client();
    let url = format!("{}/v1/chat/completions", gw.url);

    // Normal, streamed and not.
    for stream in [false, true] {
        let r = c
            .post(&url)
            .json(&chat("normal ending", stream))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    wait_for_zero_load(&gw.url).await;

    // Errored: the worker answers 500 (retried elsewhere or passed through).
    w[0].set_faults(radixgate_sim::server::FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    for _ in 0..4 {
        c.post(&url)
            .json(&chat("errored", false))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
    }
    w[0].set_faults(Default::default());
    wait_for_zero_load(&gw.url).await;

    // Client-cancelled: read one chunk of a long stream, then hang up.
    let mut long = chat("cancelled by the client", true);
    long["max_tokens"] = json!(50_000);
    let r = c.post(&url).json(&long).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    body.next().await.unwrap().unwrap();
    assert!(
        total_load(&gw.url).await >= 1,
        "the stream holds load while open"
    );
    drop(body);
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_prefix_goes_to_the_same_worker_and_hits() {
    let w = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let gw = gateway_ready(config(&[&w[0].url, &w[1].url, &w[2].url]), 3).await;
    let c = client();
    let system = "You are a careful assistant. ".repeat(40);
    let mut chosen = Vec::new();
    let mut cached = Vec::new();
    for i in 0..5 {
        let body = json!({
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("question {i}")}],
            "max_tokens": 2,
        });
        let r = c
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        chosen.push(r.headers()[WORKER_HEADER].to_str().unwrap().to_owned());
        let v: Value = r.json().await.unwrap();
        cached.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert!(chosen.iter().all(|w| *w == chosen[0]), "{chosen:?}");
    assert_eq!(cached[0], 0);
    assert!(cached[1..].iter().all(|&c| c > 200), "{cached:?}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_prefill_is_released_at_the_first_token() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.routing = serde_norway::from_str("policy: prefill_aware").unwrap();
    let gw = gateway_ready(cfg, 1).await;
    let mut long = chat(&"a long prompt to prefill ".repeat(40), true);
    long["max_tokens"] = json!(20_000);
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&long)
        .send()
        .await
        .unwrap();
    let mut body = r.bytes_stream();
    body.next().await.unwrap().unwrap();
    let loads = get_loads(&gw.url).await;
    let worker = &loads["workers"][0];
    assert_eq!(worker["load"], 1, "still in flight");
    assert_eq!(
        worker["pending_prefill_chars"], 0,
        "but no longer queued prefill"
    );
    drop(body);
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

/// A worker that speaks like vLLM about its cache: no `/get_server_info`,
/// a `/metrics` page with `vllm:cache_config_info` (`blocks` of 16 tokens),
/// or none at all when `blocks` is `None`.
async fn vllm_like(blocks: Option<u64>) -> (String, tokio_util::sync::CancellationToken) {
    use axum::routing::get;
    let metrics = match blocks {
        Some(n) => format!(
            "# TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"16\",cache_dtype=\"auto\",num_gpu_blocks=\"{n}\"}} 1.0\n\
             vllm:num_requests_running{{model_name=\"m\"}} 0.0\n"
        ),
        None => "vllm:num_requests_running{model_name=\"m\"} 0.0\n".to_owned(),
    };
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "m"}]})) }),
        )
        .route("/metrics", get(move || async move { metrics }));
    serve_app(app).await
}

/// A vLLM-like worker whose health and KV cache size (in 16-token blocks)
/// can change; with `blocks` `None` it never answers `/get_server_info` or
/// `/metrics` at all, as a wedged worker or proxy would.
async fn changing_worker(
    blocks: Option<Arc<AtomicU64>>,
    healthy: Arc<AtomicBool>,
) -> (String, tokio_util::sync::CancellationToken) {
    use axum::http::StatusCode;
    use axum::routing::get;
    let hangs = blocks.is_none();
    let metrics = move || {
        let blocks = blocks.clone();
        async move {
            let Some(blocks) = blocks else {
                return std::future::pending::<String>().await;
            };
            format!(
                "vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"{}\"}} 1.0\n",
                blocks.load(Ordering::Relaxed)
            )
        }
    };
    let health = move || {
        let healthy = healthy.clone();
        async move {
            if healthy.load(Ordering::Relaxed) {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    };
    let mut app = axum::Router::new()
        .route("/health", get(health))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "m"}]})) }),
        )
        .route("/metrics", get(metrics));
    if hangs {
        app = app.route("/get_server_info", get(std::future::pending::<String>));
    }
    serve_app(app).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_hangs_when_asked_its_cache_size_is_admitted_all_the_same() {
    let healthy = Arc::new(AtomicBool::new(true));
    let (url, stop) = changing_worker(None, healthy.clone()).await;
    let mut cfg = config(&[&url]);
    // Longer than the wait below: a gateway that waited for the answers
    // before admitting the worker would not admit it in time.
    cfg.health.timeout_secs = 120;
    let gw = gateway_ready(cfg, 1).await;
    assert_eq!(listed_capacity(&gw.url, &url).await, None);
    // Its probes go on meanwhile: a failure still takes it out.
    healthy.store(false, Ordering::Relaxed);
    wait_for_healthy(&gw.url, 0).await;
    gw.shutdown().await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_back_from_a_failure_is_asked_its_cache_size_again() {
    let blocks = Arc::new(AtomicU64::new(512));
    let healthy = Arc::new(AtomicBool::new(true));
    let (url, stop) = changing_worker(Some(blocks.clone()), healthy.clone()).await;
    let gw = gateway_ready(config(&[&url]), 1).await;
    wait_until("the first cache size", || async {
        listed_capacity(&gw.url, &url).await == Some(512 * 16)
    })
    .await;
    // It fails, and comes back restarted with a larger cache.
    healthy.store(false, Ordering::Relaxed);
    wait_for_healthy(&gw.url, 0).await;
    blocks.store(2_048, Ordering::Relaxed);
    healthy.store(true, Ordering::Relaxed);
    wait_for_healthy(&gw.url, 1).await;
    wait_until("the new cache size", || async {
        listed_capacity(&gw.url, &url).await == Some(2_048 * 16)
    })
    .await;
    gw.shutdown().await;
    stop.cancel();
}

/// A worker's KV cache size on `/workers`, once listed.
async fn listed_capacity(gateway: &str, url: &str) -> Option<u64> {
    let listed = workers(gateway).await;
    let w = listed
        .iter()
        .find(|w| w["url"] == url)
        .unwrap_or_else(|| panic!("{url} in {listed:?}"));
    w.get("kv_capacity_tokens").and_then(Value::as_u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_workers_kv_cache_size_is_read_once_admitted_unless_configured() {
    let mut small = fast_worker();
    small.engine.kv_capacity_tokens = 4_096;
    let sglang_like = sim_worker(small).await;
    let configured = sim_worker(fast_worker()).await;
    let (vllm, stop_vllm) = vllm_like(Some(512)).await;
    let (silent, stop_silent) = vllm_like(None).await;
    let mut cfg = config(&[&sglang_like.url, &vllm, &silent]);
    cfg.workers.push(
        radixgate::config::WorkerSpec::new(&configured.url).with_kv_capacity_tokens(Some(1_234)),
    );
    let gw = gateway_ready(cfg, 4).await;
    // The sizes are asked once each worker is admitted, beside the probes.
    // SGLang's max_total_num_tokens, as the simulated worker reports it.
    wait_until("the simulated worker's cache size", || async {
        listed_capacity(&gw.url, &sglang_like.url).await == Some(4_096)
    })
    .await;
    // vLLM's blocks times their size.
    wait_until("the vLLM-like worker's cache size", || async {
        listed_capacity(&gw.url, &vllm).await == Some(512 * 16)
    })
    .await;
    // The operator's figure, not the worker's 100,000.
    assert_eq!(listed_capacity(&gw.url, &configured.url).await, Some(1_234));
    // Neither: unknown, and the worker is admitted all the same.
    assert_eq!(listed_capacity(&gw.url, &silent).await, None);
    gw.shutdown().await;
    stop_vllm.cancel();
    stop_silent.cancel();
}

/// What a flooding endpoint sent, and whether its answer was let go.
#[derive(Default)]
struct Flood {
    sent: AtomicU64,
    dropped: AtomicBool,
}

/// An answer that never ends: a JSON list opening, then 1 MiB of entries
/// every 10 ms, counted in `flood`, which also learns when the gateway
/// lets the answer go.
fn flood_body(flood: Arc<Flood>) -> axum::body::Body {
    struct LetGo(Arc<Flood>);
    impl Drop for LetGo {
        fn drop(&mut self) {
            self.0.dropped.store(true, Ordering::SeqCst);
        }
    }
    let entries = bytes::Bytes::from(r#"{"id":"flood"},"#.repeat((1 << 20) / 15));
    let head = bytes::Bytes::from_static(br#"{"data":["#);
    let chunks = futures::stream::unfold((LetGo(flood), true), move |(held, first)| {
        let entries = entries.clone();
        let head = head.clone();
        async move {
            let chunk = if first {
                head
            } else {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                entries
            };
            held.0.sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            Some((Ok::<_, std::io::Error>(chunk), (held, false)))
        }
    });
    axum::body::Body::from_stream(chunks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_floods_its_discovery_answers_is_read_only_so_far() {
    use axum::routing::get;
    let models = Arc::new(Flood::default());
    let server_info = Arc::new(Flood::default());
    let (m, s) = (models.clone(), server_info.clone());
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(move || async move { flood_body(m) }))
        .route(
            "/get_model_info",
            get(|| async { axum::Json(json!({"model_path": "m-real"})) }),
        )
        .route(
            "/get_server_info",
            get(move || async move { flood_body(s) }),
        )
        .route(
            "/metrics",
            get(|| async {
                "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1.0\n"
            }),
        );
    let (url, stop) = serve_app(app).await;
    let mut cfg = config(&[&url]);
    // Long enough that a gateway reading until the timeout would take in
    // hundreds of MiB first (1 MiB every 10 ms).
    cfg.health.timeout_secs = 5;
    let gw = gateway_ready(cfg, 1).await;
    // The flooded questions count as unanswered: the models come from
    // SGLang's /get_model_info, the cache size from vLLM's /metrics.
    let listed = workers(&gw.url).await;
    assert_eq!(listed[0]["models"], json!(["m-real"]), "{listed:?}");
    wait_until("the cache size from /metrics", || async {
        listed_capacity(&gw.url, &url).await == Some(1_600)
    })
    .await;
    // Each flood was let go after the gateway's 8 MiB, give or take what
    // loopback's socket buffers hold, not after the probe's timeout.
    for (path, flood) in [("/v1/models", &models), ("/get_server_info", &server_info)] {
        wait_until(path, || async { flood.dropped.load(Ordering::SeqCst) }).await;
        let sent = flood.sent.load(Ordering::SeqCst);
        assert!(
            sent < 24 << 20,
            "{path}: {sent} bytes sent before it was let go"
        );
    }
    gw.shutdown().await;
    stop.cancel();
}

/// A worker's model list with one entry the router cannot read (an id
/// that is no string, no id at all) still names the worker's other
/// models. Refused whole, it made the worker one that serves any model:
/// in a pool of several models it was sent requests for models it does
/// not have, and its own were not listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unreadable_model_entry_does_not_make_a_worker_serve_any_model() {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async {
                axum::Json(json!({"data": [
                    {"id": "m-listed", "object": "model"},
                    {"id": 7, "object": "model"},
                    {"object": "model"},
                    "m-plain",
                ]}))
            }),
        );
    let (liar, stop) = serve_app(app).await;
    let other = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&liar, &other.url]), 2).await;
    let listed = workers(&gw.url).await;
    let entry = listed
        .iter()
        .find(|w| w["url"] == liar.as_str())
        .expect("the worker is listed");
    assert_eq!(entry["models"], json!(["m-listed"]), "{listed:?}");
    let models = model_ids(&gw.url).await;
    assert!(models.contains(&"m-listed".to_owned()), "{models:?}");
    // The other worker's model goes to the other worker only.
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat(&format!("not the liar's {i}"), false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[WORKER_HEADER], other.url.as_str(), "{i}");
    }
    gw.shutdown().await;
    stop.cancel();
}

/// A server that is no SGLang and lists no models (`/v1/models` a 404)
/// may answer SGLang's `/get_model_info`, asked next, with a 500 for any
/// path it does not have. Since bb31a32 that held it pending for good, as
/// if its list had failed; as the fallback's answer, it is no list: the
/// worker is admitted to serve any model, as one with no such page is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_model_page_that_fails_is_no_list() {
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::http::StatusCode::NOT_FOUND.into_response() }),
        )
        .route(
            "/get_model_info",
            get(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response() }),
        )
        .route(
            "/v1/chat/completions",
            post(|| async {
                axum::Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}))
            }),
        );
    let (plain, stop) = serve_app(app).await;
    let gw = gateway_ready(config(&[&plain]), 1).await;
    let listed = workers(&gw.url).await;
    assert_eq!(listed[0]["models"], json!([]), "{listed:?}");
    let r = post_chat(&gw.url, &chat("any model", false)).await;
    assert_eq!(r.status(), 200);
    gw.shutdown().await;
    stop.cancel();
}

/// A worker whose model list fails to answer as it is admitted (a 503, a
/// moment after its `/health` said ready) is not admitted until it says
/// which models it serves. Taken as listing none, it served any model
/// until its next read, 30 s later: in a pool of several models it was
/// sent requests for models it does not have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_model_list_fails_at_admission_is_admitted_once_it_answers() {
    use axum::response::IntoResponse;
    use axum::routing::get;
    use std::sync::atomic::AtomicUsize;
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = asked.clone();
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 | 1 => axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response(),
                        _ => axum::Json(json!({"data": [{"id": "m-own", "object": "model"}]}))
                            .into_response(),
                    }
                }
            }),
        );
    let (late, stop) = serve_app(app).await;
    let other = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&late, &other.url]), 2).await;
    let listed = workers(&gw.url).await;
    let entry = listed
        .iter()
        .find(|w| w["url"] == late.as_str())
        .expect("the worker is listed");
    assert_eq!(entry["models"], json!(["m-own"]), "{listed:?}");
    assert!(asked.load(Ordering::SeqCst) >= 3);
    // The other worker's model goes to the other worker only.
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat(&format!("not the late one's {i}"), false)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[WORKER_HEADER], other.url.as_str(), "{i}");
    }
    gw.shutdown().await;
    stop.cancel();
}
