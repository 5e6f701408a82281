//! The TTFT cost model through the gateway: real simulated workers, a
//! real gateway with the default policy, and a worker that turns slow at
//! run time (the simulated worker's `slowdown` fault knob). The router has
//! no setting for the workers' speed; it learns each from the first tokens
//! of its streams, and the slow worker stops getting new prompts.

mod common;

use common::*;
use radixgate::proxy::WORKER_HEADER;
use radixgate_sim::server::{FaultConfig, WorkerConfig};

/// Sends one streamed chat request and reads it to the end; returns the
/// worker that served it and the decision header.
async fn streamed(gateway: &str, text: &str) -> (String, String) {
    let resp = client()
        .post(format!("{gateway}/v1/chat/completions"))
        .json(&chat(text, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let worker = resp.headers()[WORKER_HEADER].to_str().unwrap().to_owned();
    let decision = resp.headers()["x-radixgate-decision"]
        .to_str()
        .unwrap()
        .to_owned();
    let body = resp.text().await.unwrap();
    assert!(body.contains("[DONE]"), "{body}");
    (worker, decision)
}

/// A prompt no other request shares: about 2,000 tokens, so its prefill
/// (about 55 ms at the default timing) dominates its first token.
fn fresh_prompt(i: usize) -> String {
    format!("{i} ") + &format!("distinct words for prompt {i} ").repeat(300)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_that_turns_slow_stops_getting_new_prompts() {
    let fast = sim_worker(WorkerConfig::default()).await;
    let slowing = sim_worker(WorkerConfig::default()).await;
    let gw = gateway_ready(config(&[&fast.url, &slowing.url]), 2).await;

    // Both healthy and equal: new prompts spread over both.
    let mut before = 0;
    for i in 0..12 {
        let (worker, decision) = streamed(&gw.url, &fresh_prompt(i)).await;
        assert!(
            decision.contains(" ttft=") && decision.contains(" alt="),
            "{decision}"
        );
        before += usize::from(worker == slowing.url);
    }
    assert!(
        (3..=9).contains(&before),
        "{before} of 12 before the slowdown"
    );

    // Eight times slower from now on.
    slowing.set_faults(FaultConfig {
        slowdown: 8.0,
        ..FaultConfig::default()
    });
    let mut after = Vec::new();
    for i in 100..140 {
        let (worker, _) = streamed(&gw.url, &fresh_prompt(i)).await;
        after.push(worker == slowing.url);
    }
    // It takes the slow worker a few first tokens to show; after that it
    // is predicted far slower than the fast one and gets (almost) nothing.
    let late = after[20..].iter().filter(|&&s| s).count();
    assert!(
        late <= 2,
        "the slow worker still got {late} of the last 20: {after:?}"
    );

    // What the router learned is on /get_loads: the slow worker's prefill
    // speed is well below the fast one's.
    let loads = get_loads(&gw.url).await;
    let speed = |url: &str| {
        let w = loads["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["url"] == url)
            .unwrap();
        let fit = &w["ttft_model"][0];
        assert!(fit["observations"].as_u64().unwrap() > 0, "{w}");
        fit["prefill_chars_per_sec"].as_f64().unwrap()
    };
    // Eight times slower in truth; the learned speeds are wall-clock
    // fits, which a loaded machine squeezes together (1.84x seen on a
    // shared 2-core machine), so the bound only asks for clearly slower.
    let (f, s) = (speed(&fast.url), speed(&slowing.url));
    assert!(
        s * 1.5 < f,
        "learned speeds: fast {f:.0} chars/s, slow {s:.0} chars/s"
    );

    gw.shutdown().await;
    fast.stop.cancel();
    slowing.stop.cancel();
}

/// A worker that opens every stream with an error event under a 200 (as
/// SGLang streams a request it refuses: `data: {"error": ...}`; the
/// Messages API's `event: error`) answers within a millisecond or two.
/// That is no first token: the cost model must not learn the worker's
/// speed from it (it would take the broken worker for the quickest in
/// the pool and send it every new prompt). A stream that opens with a
/// token teaches it, the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_opens_with_an_error_teaches_the_cost_model_nothing() {
    const CHAT_ERROR: &str = "data: {\"error\":{\"message\":\"The input is longer than the model's context length\",\"type\":\"BadRequestError\",\"code\":400}}\n\n";
    const CHAT_TOKEN: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n";
    const MESSAGE_START: &str =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[]}}\n\n";
    const MESSAGE_ERROR: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    const MESSAGE_TOKEN: &str =
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0}\n\n";
    let chat_body = |i: usize| {
        let mut body = chat(&fresh_prompt(i), true);
        body["model"] = "scripted".into();
        ("/v1/chat/completions", body)
    };
    let messages_body = |i: usize| {
        let body = serde_json::json!({
            "model": "scripted",
            "max_tokens": 4,
            "stream": true,
            "messages": [{"role": "user", "content": fresh_prompt(i)}],
        });
        ("/v1/messages", body)
    };
    type Body = fn(usize) -> (&'static str, serde_json::Value);
    let cases: [(Vec<&'static str>, Body, bool); 4] = [
        (vec![CHAT_ERROR, "data: [DONE]\n\n"], chat_body, false),
        (vec![MESSAGE_START, MESSAGE_ERROR], messages_body, false),
        (vec![CHAT_TOKEN, "data: [DONE]\n\n"], chat_body, true),
        (vec![MESSAGE_START, MESSAGE_TOKEN], messages_body, true),
    ];
    for (pieces, body, learns) in cases {
        let what = pieces.concat();
        let worker = scripted_worker(pieces).await;
        let gw = gateway_ready(config(&[&worker.url]), 1).await;
        for i in 0..4 {
            let (path, body) = body(i);
            let resp = client()
                .post(format!("{}{path}", gw.url))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{what}");
            assert_eq!(resp.text().await.unwrap(), what, "the client gets it all");
        }
        wait_for_zero_load(&gw.url).await;
        let entry = worker_loads(&gw.url, &worker.url).await;
        let observations = entry["ttft_model"][0]["observations"].as_u64().unwrap();
        assert_eq!(observations > 0, learns, "{what}: {entry}");
        assert_eq!(entry["pending_prefill_chars"], 0, "{what}: {entry}");
        gw.shutdown().await;
        worker.stop.cancel();
    }
}
