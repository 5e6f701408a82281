//! What the OpenAI and Anthropic SDKs, and the tools built on them, send
//! to an engine, sent to the gateway instead: each must work through the
//! gateway as it does against the engine it fronts.

mod common;

use axum::Router;
use axum::routing::{get, post};
use common::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// `GET /v1/models/{id}` (the SDKs' `models.retrieve`, which SGLang
/// serves) answers the model's entry as `/v1/models` lists it, for ids
/// with a `/` too (Hugging Face names), and an unknown id is a 404
/// `model_not_found`, not a 405 for the method. A `POST` under
/// `/v1/models/` is still passed on to a worker as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_is_retrieved_by_its_id() {
    let named = "meta-llama/Llama-3.1-8B-Instruct";
    let w = sim_worker(radixgate_sim::server::WorkerConfig {
        model: named.to_owned(),
        ..fast_worker()
    })
    .await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let c = client();

    let r = c
        .get(format!("{}/v1/models/{named}", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let entry: Value = r.json().await.unwrap();
    let list = get_json(&gw.url, "/v1/models").await;
    assert_eq!(entry, list["data"][0], "{list}");
    assert_eq!(entry["id"], named);
    assert_eq!(entry["object"], "model");

    let r = c
        .get(format!("{}/v1/models/no-such-model", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
    assert_eq!(body["error"]["param"], "model", "{body}");

    // Not a route of the gateway's own: passed on, and the worker says 404.
    let r = c
        .post(format!("{}/v1/models/{named}", gw.url))
        .json(&json!({"model": named}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers().contains_key(radixgate::proxy::WORKER_HEADER));
    gw.shutdown().await;
}

/// A model's entry says the longest context its workers take, as vLLM and
/// SGLang say theirs (`max_model_len`), for clients that size prompts by
/// it: the least of what its workers said. A worker whose models the
/// operator listed was not asked, and one that spells the length otherwise
/// still has its models read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_entry_says_the_longest_context_every_worker_takes() {
    let sized = |tokens: usize| {
        let mut c = fast_worker();
        c.engine.kv_capacity_tokens = tokens;
        c
    };
    // The simulated worker says its KV capacity as its max_model_len.
    let (small, large) = (
        sim_worker(sized(32_768)).await,
        sim_worker(sized(131_072)).await,
    );
    let listed = sim_worker(sized(16_384)).await;
    let odd = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async {
                axum::Json(json!({"data": [{"id": "other-model", "max_model_len": "4096"}]}))
            }),
        );
    let (odd, _stop) = serve_app(odd).await;
    let mut cfg = config(&[&small.url, &large.url, &listed.url, &odd]);
    cfg.workers[2].models = vec![radixgate_sim::server::DEFAULT_MODEL.to_owned()];
    let gw = gateway_ready(cfg, 4).await;
    let list = get_json(&gw.url, "/v1/models").await;
    let data = list["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{list}");
    let entry = |id: &str| data.iter().find(|m| m["id"] == id).cloned().unwrap();
    let sim = entry(radixgate_sim::server::DEFAULT_MODEL);
    assert_eq!(sim["max_model_len"], 32_768, "{list}");
    assert!(
        entry("other-model").get("max_model_len").is_none(),
        "{list}"
    );
    let one = get_json(
        &gw.url,
        &format!("/v1/models/{}", radixgate_sim::server::DEFAULT_MODEL),
    )
    .await;
    assert_eq!(one, sim);
    gw.shutdown().await;
}

/// A worker whose model list holds an id no request can name (empty, or
/// the wildcard pool's `*`) is admitted for the models it names well, the
/// others left out. The whole worker was refused, once, with an ERROR,
/// and its health checker, taking it as admitted, never asked again: it
/// stayed out of rotation while its probes passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_listing_an_unnameable_model_is_admitted_for_the_others() {
    let model = radixgate_sim::server::DEFAULT_MODEL;
    let lists = [
        json!({"data": [{"id": model}, {"id": ""}]}),
        json!({"data": [{"id": "*"}, {"id": model}, {"id": model}]}),
    ];
    for list in lists {
        let answer = json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        });
        let shown = list.to_string();
        let app = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/v1/models", get(move || async move { axum::Json(list) }))
            .route(
                "/v1/chat/completions",
                post(move || async move { axum::Json(answer) }),
            );
        let (worker, stop) = serve_app(app).await;
        let gw = gateway(config(&[&worker])).await;
        wait_until(&format!("the worker listing {shown} is admitted"), || {
            let url = gw.url.clone();
            async move {
                let list = get_json(&url, "/readiness").await;
                list["healthy_workers"] == 1
            }
        })
        .await;
        assert_eq!(model_ids(&gw.url).await, vec![model.to_owned()], "{shown}");
        let r = post_chat(&gw.url, &chat("hi", false)).await;
        assert_eq!(r.status(), 200, "{shown}");
        gw.shutdown().await;
        stop.cancel();
    }
}

/// A worker for whole (non-streamed) answers of set lengths: a request
/// whose text holds `long` is never answered; any other is answered
/// `answer_after` after the long one arrived. Returns its URL and when the
/// long request arrived.
async fn paced_worker(
    answer_after: Duration,
) -> (
    String,
    Arc<parking_lot::Mutex<Option<tokio::time::Instant>>>,
) {
    let long_arrived = Arc::new(parking_lot::Mutex::new(None));
    let arrived = long_arrived.clone();
    let chat = move |body: String| {
        let arrived = arrived.clone();
        async move {
            if body.contains("long") {
                *arrived.lock() = Some(tokio::time::Instant::now());
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            let since = arrived.lock().unwrap_or_else(tokio::time::Instant::now);
            tokio::time::sleep_until(since + answer_after).await;
            axum::Json(json!({
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}}],
            }))
        }
    };
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "paced"}]})) }),
        )
        .route("/v1/chat/completions", post(chat));
    let (url, _stop) = serve_app(app).await;
    (url, long_arrived)
}

/// A whole (non-streamed) answer may take minutes to generate, and its
/// first byte comes only when it is done: one that runs past
/// `non_stream_timeout_secs` (300 s by default, under the SDKs' 600 s)
/// says the request is long, not that its worker hangs. So it must not end
/// the other whole answers the worker is generating meanwhile: here one
/// that arrived later and answers well inside its own timeout (a
/// reasoning model's long answer next to a longer one), which went to the
/// engine directly is answered, was given up on as "marked unavailable"
/// (504) once the longer one timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_whole_answer_timing_out_does_not_end_the_others() {
    // The second request is sent 4 s after the long one and answered 10 s
    // after it: 6 s of its own 8 s timeout, and 2 s after the long one's.
    let (url, long_arrived) = paced_worker(Duration::from_secs(10)).await;
    let mut c = config(&[&url]);
    c.retry.first_byte_timeout_secs = 1;
    c.retry.non_stream_timeout_secs = 8;
    c.server.request_timeout_secs = 60;
    let gw = gateway_ready(c, 1).await;
    let ask = |text: &'static str| {
        let url = gw.url.clone();
        async move {
            let body = json!({"model": "paced", "messages": [{"role": "user", "content": text}]});
            post_chat(&url, &body).await
        }
    };
    let long = tokio::spawn(ask("a long report"));
    wait_until("the long request reached the worker", || async {
        long_arrived.lock().is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let r = ask("a shorter answer").await;
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(long.await.unwrap().status(), 504);
    gw.shutdown().await;
}
