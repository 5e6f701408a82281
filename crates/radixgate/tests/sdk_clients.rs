//! What the OpenAI and Anthropic SDKs, and the tools built on them, send
//! to an engine, sent to the gateway instead: each must work through the
//! gateway as it does against the engine it fronts.

mod common;

use common::*;
use serde_json::{Value, json};

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
