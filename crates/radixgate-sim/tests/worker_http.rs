//! Integration tests of `radixgate worker` over loopback with a real HTTP
//! client: every endpoint, streaming and not, and prefix hits as a client
//! sees them. No test asserts an upper bound on time.

mod common;

use common::*;
use radixgate_sim::server::WORKER_HEADER;
use serde_json::{Value, json};

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
    let metrics = metrics_text(&w.base).await;
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
    let metrics = metrics_text(&w.base).await;
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
    let c = client_builder().http2_prior_knowledge().build().unwrap();
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
async fn responses_and_messages_whole_and_streamed() {
    let w = spawn(fast_config()).await;
    let text = long_text(5);
    let responses = json!({"model": "m", "instructions": "be brief",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}],
        "max_output_tokens": 5});
    let (s, _, whole) = post(&w.base, "/v1/responses", responses.clone()).await;
    assert_eq!(s, 200, "{whole}");
    assert_eq!(whole["object"], "response");
    assert_eq!(whole["status"], "incomplete");
    let reply = whole["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(whole["usage"]["output_tokens"], 5);
    // The same conversation through chat is the same prompt.
    let (_, _, chat_whole) = post(&w.base, "/v1/chat/completions", chat(&text, 5)).await;
    assert_eq!(
        whole["usage"]["input_tokens"],
        chat_whole["usage"]["prompt_tokens"]
    );
    let mut streamed = responses;
    streamed["stream"] = json!(true);
    let (events, done) = sse(&w.base, "/v1/responses", streamed).await.unwrap();
    assert!(!done, "the Responses API sends no [DONE]");
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(kinds.last(), Some(&"response.incomplete"));
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, reply);
    let usage = &events.last().unwrap()["response"]["usage"];
    assert!(
        usage["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let messages = json!({"model": "m", "system": "be brief", "max_tokens": 5,
        "messages": [{"role": "user", "content": text}]});
    let (s, _, whole) = post(&w.base, "/v1/messages", messages.clone()).await;
    assert_eq!(s, 200, "{whole}");
    assert_eq!(
        (&whole["type"], &whole["stop_reason"]),
        (&json!("message"), &json!("max_tokens"))
    );
    let usage = &whole["usage"];
    assert_eq!(
        usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap(),
        chat_whole["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    let reply = whole["content"][0]["text"].as_str().unwrap().to_owned();
    let mut streamed = messages;
    streamed["stream"] = json!(true);
    let (events, done) = sse(&w.base, "/v1/messages", streamed).await.unwrap();
    assert!(!done);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["message_start", "content_block_start"]);
    assert_eq!(
        kinds[kinds.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let deltas: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(deltas, reply);
    assert_eq!(events[0]["message"]["system_fingerprint"], w.handle.name());
    assert_eq!(events[kinds.len() - 2]["usage"]["output_tokens"], 5);
}

#[tokio::test]
async fn messages_next_turn_hits_previous_prompt_and_reply() {
    let w = spawn(fast_config()).await;
    let first = long_text(6);
    let turn1 = json!({"max_tokens": 20, "messages": [{"role": "user", "content": first}]});
    let (_, _, v1) = post(&w.base, "/v1/messages", turn1).await;
    let reply = v1["content"][0]["text"].as_str().unwrap().to_owned();
    let p1 = v1["usage"]["input_tokens"].as_u64().unwrap();
    let turn2 = json!({"max_tokens": 4, "messages": [
        {"role": "user", "content": first},
        {"role": "assistant", "content": [{"type": "text", "text": reply}]},
        {"role": "user", "content": "and then?"}]});
    let (_, _, v2) = post(&w.base, "/v1/messages", turn2).await;
    let cached = v2["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(
        cached + 16 > p1 + 20,
        "turn 2 cached {cached}, turn 1 was {p1} + 20"
    );
}

#[tokio::test]
async fn tokenize_detokenize_rerank_and_score() {
    let w = spawn(fast_config()).await;
    let (s, _, whole) = post(&w.base, "/v1/chat/completions", chat("hello there", 1)).await;
    assert_eq!(s, 200);
    let mut body = chat("hello there", 1);
    body.as_object_mut().unwrap().remove("max_tokens");
    let (s, _, t) = post(&w.base, "/tokenize", body).await;
    assert_eq!(s, 200, "{t}");
    assert_eq!(
        t["count"], whole["usage"]["prompt_tokens"],
        "the ids a chat is cached under"
    );
    let (_, _, p) = post(&w.base, "/tokenize", json!({"prompt": "abcdefgh"})).await;
    assert_eq!(p["count"], 2);
    let ids = p["tokens"].clone();
    let (s, _, d) = post(&w.base, "/detokenize", json!({"tokens": ids})).await;
    assert_eq!(s, 200);
    assert_eq!(d["prompt"].as_str().unwrap().matches("<|").count(), 2);

    let (s, _, r) = post(
        &w.base,
        "/v1/rerank",
        json!({"model": "m", "query": "red fox",
        "documents": ["blue sky", {"text": "a red fox"}, "red wine"], "top_n": 2}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let order: Vec<u64> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["index"].as_u64().unwrap())
        .collect();
    assert_eq!(order, [1, 2]);
    assert_eq!(r["results"][0]["document"]["text"], "a red fox");
    assert!(r["usage"]["total_tokens"].as_u64().unwrap() > 0);
    let (s, _, sc) = post(
        &w.base,
        "/v1/score",
        json!({"text_1": "red fox",
        "text_2": ["red fox", "green"]}),
    )
    .await;
    assert_eq!(s, 200, "{sc}");
    assert_eq!(
        (&sc["data"][0]["score"], &sc["data"][1]["score"]),
        (&json!(1.0), &json!(0.0))
    );

    let (s, _, n) = post(
        &w.base,
        "/v1/messages/count_tokens",
        json!({"model": "m",
        "messages": [{"role": "user", "content": "hello there"}], "system": "be brief"}),
    )
    .await;
    assert_eq!(s, 200, "{n}");
    assert_eq!(n["input_tokens"], whole["usage"]["prompt_tokens"]);

    for (path, body, param) in [
        ("/tokenize", json!({"tokens": [1]}), "prompt"),
        ("/detokenize", json!({"tokens": "x"}), ""),
        ("/v1/rerank", json!({"query": "q"}), ""),
        (
            "/v1/score",
            json!({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
            "text_1",
        ),
        (
            "/v1/messages",
            json!({"messages": [{"role": "user", "content": "x"}]}),
            "max_tokens",
        ),
        ("/v1/responses", json!({"input": 7}), "input"),
    ] {
        let (s, _, e) = post(&w.base, path, body).await;
        assert_eq!(s, 400, "{path}: {e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{path}");
        if !param.is_empty() {
            assert_eq!(e["error"]["param"], param, "{path}");
        }
    }
}

/// The Responses API's stored responses live on the worker that made them:
/// fetched, listed, cancelled and deleted by id there, and named as
/// `previous_response_id`; an id it does not hold is an OpenAI-style 404.
#[tokio::test]
async fn stored_responses_are_kept_by_the_worker_that_made_them() {
    let w = spawn(fast_config()).await;
    let c = client();
    let first = json!({"model": "sim-llama-8b", "input": "hello", "max_output_tokens": 4});
    let (status, _, made) = post(&w.base, "/v1/responses", first).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().unwrap().to_owned();
    let fetched = get_json(&w.base, &format!("/v1/responses/{id}")).await;
    assert_eq!(fetched["id"], id.as_str());
    let items = get_json(&w.base, &format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(items["object"], "list");
    let (status, _, cancelled) =
        post(&w.base, &format!("/v1/responses/{id}/cancel"), json!({})).await;
    assert_eq!((status, cancelled["id"].as_str()), (200, Some(id.as_str())));
    let next = json!({"model": "sim-llama-8b", "input": "more", "previous_response_id": id});
    let (status, _, v) = post(&w.base, "/v1/responses", next).await;
    assert_eq!(status, 200, "{v}");
    // Not stored: not found after.
    let unstored = json!({"model": "sim-llama-8b", "input": "x", "store": false});
    let (_, _, v) = post(&w.base, "/v1/responses", unstored).await;
    let r = c
        .get(format!(
            "{}/v1/responses/{}",
            w.base,
            v["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = c
        .delete(format!("{}/v1/responses/{id}", w.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deleted: Value = r.json().await.unwrap();
    assert_eq!(deleted["deleted"], true);
    let r = c
        .get(format!("{}/v1/responses/{id}", w.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "not_found", "{v}");
    let stale = json!({"model": "sim-llama-8b", "input": "more", "previous_response_id": id});
    let (status, _, v) = post(&w.base, "/v1/responses", stale).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["param"], "previous_response_id", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains(&id), "{v}");
}

/// A `background` response is answered at once, `queued` and without
/// usage, as the engines answer one; read by its id it has finished, with
/// its output and usage. Background needs `store`, and is not streamed.
#[tokio::test]
async fn a_background_response_is_queued_then_read_finished() {
    let w = spawn(fast_config()).await;
    let asked = json!({"model": "sim-llama-8b", "input": "hello",
        "max_output_tokens": 4, "background": true});
    let (status, _, queued) = post(&w.base, "/v1/responses", asked.clone()).await;
    assert_eq!(status, 200, "{queued}");
    assert_eq!(queued["status"], "queued", "{queued}");
    assert_eq!(queued["background"], true, "{queued}");
    assert!(queued["usage"].is_null(), "{queued}");
    let id = queued["id"].as_str().unwrap();
    let read = get_json(&w.base, &format!("/v1/responses/{id}")).await;
    assert_eq!(read["id"], id, "{read}");
    assert_ne!(read["status"], "queued", "{read}");
    assert_eq!(read["usage"]["output_tokens"], 4, "{read}");
    for (field, value) in [("store", json!(false)), ("stream", json!(true))] {
        let mut refused = asked.clone();
        refused[field] = value;
        let (status, _, v) = post(&w.base, "/v1/responses", refused).await;
        assert_eq!(status, 400, "{field}: {v}");
        assert!(v["error"]["message"].is_string(), "{v}");
    }
}
