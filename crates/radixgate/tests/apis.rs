//! The APIs beyond chat and completions, end to end on loopback in front of
//! simulated workers: the Responses and Anthropic Messages APIs routed by
//! prefix (streamed and not, their preambles, their usage), the endpoints
//! routed by load (rerank, score, tokenize, detokenize), other `/v1` POSTs
//! forwarded and counted as unrouted, cache namespaces (salt, adapter,
//! extra key), and malformed bodies of each. No test asserts how fast
//! anything is.

mod common;

use common::tap::tap;
use common::*;
use radixgate::config::Config;
use radixgate::proxy::{DECISION_HEADER, WORKER_HEADER};
use radixgate_sim::server::{DEFAULT_MODEL, FaultConfig, WorkerConfig};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use std::time::Duration;

/// POSTs `body` to `path`; the status, headers and JSON body (`null` if
/// the body is not JSON).
async fn post(gateway: &str, path: &str, body: &Value) -> (u16, HeaderMap, Value) {
    let r = client()
        .post(format!("{gateway}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.json().await.unwrap_or(Value::Null))
}

/// POSTs a streamed request; the headers and the data of every event.
async fn stream(gateway: &str, path: &str, body: &Value) -> (HeaderMap, Vec<Value>) {
    let r = client()
        .post(format!("{gateway}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    let events = text
        .split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    (headers, events)
}

fn decision(headers: &HeaderMap) -> String {
    headers[DECISION_HEADER].to_str().unwrap().to_owned()
}

fn worker(headers: &HeaderMap) -> String {
    headers[WORKER_HEADER].to_str().unwrap().to_owned()
}

/// The value of the first series of `name` whose labels include all of
/// `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        labels
            .iter()
            .all(|l| set.split(',').any(|s| s == *l))
            .then(|| value.trim().parse().ok())?
    })
}

/// First tokens the cost model has seen, over all workers (`/get_loads`
/// with the client key `key`).
async fn first_tokens_seen(gateway: &str, key: Option<&str>) -> u64 {
    let mut request = client().get(format!("{gateway}/get_loads"));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let loads: Value = request.send().await.unwrap().json().await.unwrap();
    loads["workers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["ttft_model"].as_array().unwrap().clone())
        .map(|m| m["observations"].as_u64().unwrap_or(0))
        .sum()
}

/// A long user turn, so a next turn's match rate is well over the cache
/// threshold.
fn question(tag: &str) -> String {
    format!("{tag}: {}", "tell me about prefix caches. ".repeat(12))
}

async fn two_workers() -> ([SimWorker; 2], Gateway) {
    let w = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let gw = gateway_ready(config(&[&w[0].url, &w[1].url]), 2).await;
    (w, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_conversations_follow_their_prefix() {
    let (_w, gw) = two_workers().await;
    let turn1 = json!({"model": DEFAULT_MODEL, "instructions": "be brief",
        "input": [{"role": "user", "content": question("responses")}], "max_output_tokens": 8});
    let (status, h1, v1) = post(&gw.url, "/v1/responses", &turn1).await;
    assert_eq!(status, 200, "{v1}");
    assert!(decision(&h1).starts_with("cache_aware branch="));
    assert_eq!(v1["object"], "response");
    // Turn 2 resends turn 1's input and its output items, then asks more.
    let mut input = turn1["input"].as_array().unwrap().clone();
    input.extend(v1["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"role": "user", "content": [{"type": "input_text", "text": "and then?"}]}));
    let turn2 = json!({"model": DEFAULT_MODEL, "instructions": "be brief", "input": input,
        "max_output_tokens": 4, "stream": true});
    let (h2, events) = stream(&gw.url, "/v1/responses", &turn2).await;
    assert!(
        decision(&h2).contains("branch=cache_hit"),
        "{}",
        decision(&h2)
    );
    assert_eq!(worker(&h2), worker(&h1), "the turn before holds the prefix");
    assert_eq!(events[0]["type"], "response.created");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete");
    // The worker's cache agrees: the prompt and reply of turn 1 were hit.
    assert!(
        last["response"]["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > v1["usage"]["input_tokens"].as_u64().unwrap() / 2,
        "{last}"
    );
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_conversations_follow_their_prefix() {
    let (_w, gw) = two_workers().await;
    let first = question("messages");
    let turn1 = json!({"model": DEFAULT_MODEL, "max_tokens": 8, "stream": true,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [{"role": "user", "content": first}]});
    let (h1, events) = stream(&gw.url, "/v1/messages", &turn1).await;
    assert_eq!(events[0]["type"], "message_start");
    assert_eq!(events.last().unwrap()["type"], "message_stop");
    let reply: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    // Turn 2: the reply with a tool call, its result, a new question.
    let turn2 = json!({"model": DEFAULT_MODEL, "max_tokens": 4, "system": "be brief",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": first}]},
            {"role": "assistant", "content": [{"type": "text", "text": reply},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "kv"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]});
    let (status, h2, v2) = post(&gw.url, "/v1/messages", &turn2).await;
    assert_eq!(status, 200, "{v2}");
    assert_eq!(v2["type"], "message");
    assert!(
        decision(&h2).contains("branch=cache_hit"),
        "{}",
        decision(&h2)
    );
    assert_eq!(worker(&h2), worker(&h1));
    assert!(
        v2["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "{v2}"
    );
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

/// Streams `body` to `route` through a gateway in front of a worker that
/// sends `opening` and then stalls, and checks that the opening was not
/// taken for the first token: no TTFT is recorded, the cost model learns
/// nothing, and the request's predicted prefill still counts as queued on
/// its worker. Nor for the worker's first byte: nothing reaches the client
/// until the first token, and a worker that sends none within the
/// first-byte timeout has hung (here the only one: a 504).
async fn opening_is_not_the_first_token(route: &str, body: Value, opening: &'static str) {
    let w = stalling_worker(vec![opening]).await;
    let mut c = config(&[&w.url]);
    c.retry.first_byte_timeout_secs = 2;
    c.retry.max_retries = 0;
    let gw = gateway_ready(c, 1).await;
    let request = client().post(format!("{}{route}", gw.url)).json(&body);
    let answer = tokio::spawn(async move {
        let r = request.send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    });
    wait_until("the worker has the request", || async {
        !w.received.lock().is_empty()
    })
    .await;
    // The opening's pieces go out 2 ms apart: read by the gateway well
    // before this look.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !answer.is_finished(),
        "{opening:?}: answered before a token"
    );
    let loads = get_loads(&gw.url).await;
    assert_eq!(loads["workers"][0]["load"], 1);
    assert!(
        loads["workers"][0]["pending_prefill_chars"]
            .as_u64()
            .unwrap()
            > 0,
        "{opening:?}: {loads}"
    );
    assert_eq!(first_tokens_seen(&gw.url, None).await, 0, "{opening:?}");
    let text = metrics_text(&gw.url).await;
    let ttft = format!("radixgate_time_to_first_token_seconds_count{{route=\"{route}\"");
    assert!(!text.contains(&ttft), "{opening:?}: {text}");
    let (status, text) = answer.await.unwrap();
    assert_eq!(status, 504, "{opening:?}: {text}");
    assert!(!text.contains(opening.trim()), "{opening:?}: {text}");
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

/// A stream that has sent only its preamble has not sent its first token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preamble_is_not_the_first_token() {
    let preamble = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"output\":[]}}\n\n",
        "event: response.in_progress\n",
        "data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{}}\n\n",
    );
    let body = json!({"model": "scripted", "input": question("stall"), "stream": true});
    opening_is_not_the_first_token("/v1/responses", body, preamble).await;
}

/// A chat stream that opens with a keep-alive comment (SSE's `: ...`, which
/// some servers send while a prompt waits) has not sent its first token
/// either; nor has one that sent only comments and blank lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_comment_is_not_the_first_token() {
    for opening in [": keep-alive\n\n", ":\r\n\r\n: queued\n\n"] {
        let body = json!({"model": "scripted", "stream": true,
            "messages": [{"role": "user", "content": question("wait")}]});
        opening_is_not_the_first_token("/v1/chat/completions", body, opening).await;
    }
}

/// Behind a keep-alive comment, the first token is the first event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_token_after_a_keep_alive_comment_is_timed() {
    let w = stalling_worker(vec![
        ": keep-alive\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
    ])
    .await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let body = json!({"model": "scripted", "stream": true,
        "messages": [{"role": "user", "content": question("answer")}]});
    let mut r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).contains("hi") {
        got.extend_from_slice(&r.chunk().await.unwrap().expect("the token"));
    }
    wait_until("the first token learned", || async {
        first_tokens_seen(&gw.url, None).await == 1
    })
    .await;
    let loads = get_loads(&gw.url).await;
    assert_eq!(loads["workers"][0]["pending_prefill_chars"], 0, "{loads}");
    drop(r);
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_record_first_tokens_and_charge_usage() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.tenants.keys =
        vec![serde_json::from_value(json!({"name": "team", "key": "sk-team"})).unwrap()];
    let gw = gateway_ready(cfg, 1).await;
    let send = |path: &'static str, body: Value| {
        let url = format!("{}{path}", gw.url);
        async move {
            let r = client()
                .post(url)
                .bearer_auth("sk-team")
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{path}");
            r.text().await.unwrap()
        }
    };
    let events = |text: &str| -> Vec<Value> {
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    };
    let responses = events(
        &send(
            "/v1/responses",
            json!({"input": "count me", "max_output_tokens": 3, "stream": true}),
        )
        .await,
    );
    let usage = &responses.last().unwrap()["response"]["usage"];
    let responses_tokens = usage["total_tokens"].as_u64().unwrap();
    let messages = events(
        &send(
            "/v1/messages",
            json!({"messages": [{"role": "user", "content": "count me too"}],
                   "max_tokens": 4, "stream": true}),
        )
        .await,
    );
    // Anthropic's split: the prompt at the start, the output at the end.
    let start = &messages[0]["message"]["usage"];
    let prompt = start["input_tokens"].as_u64().unwrap()
        + start["cache_read_input_tokens"].as_u64().unwrap();
    let output = messages
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap()["usage"]["output_tokens"]
        .as_u64()
        .unwrap();
    // Both are charged and counted when their bodies end.
    wait_until("both requests counted", || async {
        let text = metrics_text(&gw.url).await;
        sample(
            &text,
            "radixgate_tenant_requests_total",
            &["tenant=\"team\""],
        )
        .is_some()
            && text
                .lines()
                .filter(|l| l.starts_with("radixgate_requests_total{"))
                .count()
                == 2
    })
    .await;
    let text = metrics_text(&gw.url).await;
    assert_eq!(
        sample(&text, "radixgate_tenant_tokens_total", &["tenant=\"team\""]),
        Some((responses_tokens + prompt + output) as f64),
        "{text}"
    );
    for route in ["/v1/responses", "/v1/messages"] {
        let label = format!("route=\"{route}\"");
        assert_eq!(
            sample(
                &text,
                "radixgate_time_to_first_token_seconds_count",
                &[&label]
            ),
            Some(1.0),
            "{route}: {text}"
        );
    }
    assert_eq!(first_tokens_seen(&gw.url, Some("sk-team")).await, 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_score_and_tokenizing_go_to_the_least_loaded_worker() {
    let (w, gw) = two_workers().await;
    let rerank = json!({"model": DEFAULT_MODEL, "query": "red fox",
        "documents": ["blue sky", "a red fox"]});
    // Hold one request on worker 0: it hangs; ties rotate, so at most two
    // tries land one there.
    w[0].set_faults(FaultConfig {
        hang: true,
        ..FaultConfig::default()
    });
    let mut held = None;
    for _ in 0..2 {
        let url = format!("{}/v1/rerank", gw.url);
        let body = rerank.clone();
        let task = tokio::spawn(async move { client().post(url).json(&body).send().await });
        // Held means in flight on worker 0: a rerank on its way to the
        // idle worker is in flight for a moment too, and taking it for the
        // held one would send a later request to the hung worker.
        wait_until("the rerank answered or held", || async {
            task.is_finished() || worker_loads(&gw.url, &w[0].url).await["load"] == 1
        })
        .await;
        if !task.is_finished() {
            held = Some(task);
            break;
        }
    }
    let held = held.expect("a rerank held on worker 0");
    for (path, body) in [
        ("/v1/rerank", rerank.clone()),
        ("/rerank", rerank.clone()),
        (
            "/v1/score",
            json!({"model": DEFAULT_MODEL, "text_1": "red fox", "text_2": ["red", "fox"]}),
        ),
        (
            "/tokenize",
            json!({"model": DEFAULT_MODEL, "prompt": "abcdefgh"}),
        ),
        (
            "/detokenize",
            json!({"model": DEFAULT_MODEL, "tokens": [1, 2, 3]}),
        ),
    ] {
        let (status, headers, v) = post(&gw.url, path, &body).await;
        assert_eq!(status, 200, "{path}: {v}");
        assert_eq!(worker(&headers), w[1].url, "{path}: the idle worker");
        assert!(
            decision(&headers).contains("branch=least_load"),
            "{path}: {}",
            decision(&headers)
        );
        match path {
            "/v1/rerank" | "/rerank" => assert_eq!(v["results"][0]["index"], 1, "{v}"),
            "/v1/score" => assert_eq!(v["data"].as_array().unwrap().len(), 2, "{v}"),
            "/tokenize" => assert_eq!(v["count"], 2, "{v}"),
            _ => assert_eq!(v["prompt"], "<|1|><|2|><|3|>", "{v}"),
        }
    }
    held.abort();
    w[0].set_faults(FaultConfig::default());
    wait_for_zero_load(&gw.url).await;
    // Nothing routed by load reached the prefix trees.
    let loads = get_loads(&gw.url).await;
    for worker in loads["workers"].as_array().unwrap() {
        assert_eq!(worker["cached_chars"], 0, "{loads}");
    }
    gw.shutdown().await;
}

/// A client's query string reaches the worker on every kind of route:
/// Anthropic's SDK sends `/v1/messages?beta=true`, Azure-style clients
/// `?api-version=`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_query_string_is_passed_on_to_the_worker() {
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let gw = gateway_ready(config(&[&t.url]), 1).await;
    let messages = json!({"model": DEFAULT_MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there"}]});
    let chat = json!({"model": DEFAULT_MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello there"}]});
    let rerank = json!({"model": DEFAULT_MODEL, "query": "red fox",
        "documents": ["red", "fox"]});
    let sent = [
        ("/v1/messages?beta=true", &messages),
        ("/v1/chat/completions?api-version=2024-10-21&x=%20y", &chat),
        ("/v1/chat/completions", &chat),
        ("/v1/rerank?top=1", &rerank),
        ("/v1/messages/count_tokens?beta=true", &messages),
    ];
    for (path, body) in sent {
        let (status, _, v) = post(&gw.url, path, body).await;
        assert_eq!(status, 200, "{path}: {v}");
    }
    let paths: Vec<&str> = sent.iter().map(|(path, _)| *path).collect();
    assert_eq!(t.targets(), paths);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_v1_posts_are_forwarded_and_counted_as_unrouted() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let c = client();
    // A real endpoint the gateway has no route for.
    let count = json!({"model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "hello there"}]});
    let (status, headers, v) = post(&gw.url, "/v1/messages/count_tokens", &count).await;
    assert_eq!(status, 200, "{v}");
    assert!(v["input_tokens"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(worker(&headers), w.url);
    assert!(decision(&headers).contains("branch=least_load"));
    // One the worker does not know either: its own 404 comes back.
    let (status, headers, v) = post(&gw.url, "/v1/audio/speech?x=1", &json!({"input": "hi"})).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(worker(&headers), w.url, "answered by the worker");
    // A body that is not JSON names no model; with one model served, that
    // one serves it.
    let r = c
        .post(format!("{}/v1/files", gw.url))
        .header("content-type", "multipart/form-data; boundary=x")
        .body("--x\r\n\r\ndata\r\n--x--\r\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()[WORKER_HEADER], w.url.as_str());
    // A body that opens as JSON must be JSON.
    let r = c
        .post(format!("{}/v1/images/generations", gw.url))
        .body("{\"model\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_json"
    );
    // Paths that could name something else, and engine administration,
    // are not passed on; nor are other methods.
    for path in [
        "/v1/../admin/faults",
        "/v1/x//y",
        "/v1/%2e%2e/admin/faults",
        "/v1/load_lora_adapter",
    ] {
        let r = c
            .post(format!("{}{path}", gw.url))
            .json(&json!({"lora_name": "x", "lora_path": "/tmp/x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        assert!(r.headers().get(WORKER_HEADER).is_none(), "{path}");
        assert_eq!(
            r.json::<Value>().await.unwrap()["error"]["code"],
            "not_found"
        );
    }
    let r = c
        .get(format!("{}/v1/whatever", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    wait_for_zero_load(&gw.url).await;
    let text = metrics_text(&gw.url).await;
    let unrouted = "radixgate_unrouted_requests_total";
    // Counted once sent to a worker: the malformed images request was not.
    for (api, n) in [
        ("messages", Some(1.0)),
        ("audio", Some(1.0)),
        ("files", Some(1.0)),
        ("images", None),
    ] {
        let label = format!("api=\"{api}\"");
        assert_eq!(sample(&text, unrouted, &[&label]), n, "{api}: {text}");
    }
    assert_eq!(
        sample(
            &text,
            "radixgate_requests_total",
            &["route=\"/v1/*\"", "status=\"200\""]
        ),
        Some(1.0),
        "{text}"
    );
    gw.shutdown().await;
}

/// An unrouted request that reaches no worker (a model nobody serves, or
/// every worker of its model down) is answered, but not counted as one
/// passed to a worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrouted_request_no_worker_takes_is_not_counted_as_passed_on() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let c = client();
    let speech = |model: &str| {
        c.post(format!("{}/v1/audio/speech", gw.url))
            .json(&json!({"model": model, "input": "hello"}))
            .send()
    };
    let r = speech("nobody-serves-this").await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers().get(WORKER_HEADER).is_none());
    w.set_faults(radixgate_sim::server::FaultConfig {
        refuse: true,
        ..Default::default()
    });
    let r = speech(radixgate_sim::server::DEFAULT_MODEL).await.unwrap();
    assert_eq!(r.status(), 502, "{}", r.text().await.unwrap());
    w.set_faults(radixgate_sim::server::FaultConfig::default());
    let r = speech(radixgate_sim::server::DEFAULT_MODEL).await.unwrap();
    assert_eq!(r.headers()[WORKER_HEADER], w.url.as_str());
    wait_for_zero_load(&gw.url).await;
    let text = metrics_text(&gw.url).await;
    // Two reached the worker (one refused at connect, one answered).
    assert_eq!(
        sample(
            &text,
            "radixgate_unrouted_requests_total",
            &["api=\"audio\""]
        ),
        Some(2.0),
        "{text}"
    );
    gw.shutdown().await;
}

/// Engines keep requests with different salts, adapters or extra keys
/// apart in their caches; routing does too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_namespaces_split_prefixes() {
    let (_w, gw) = two_workers().await;
    let prompt = question("namespaced");
    let chat_in = |salt: Option<&str>| {
        let mut body = chat(&prompt, false);
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        body
    };
    let path = "/v1/chat/completions";
    let (_, first, _) = post(&gw.url, path, &chat_in(Some("tenant-a"))).await;
    let (_, same, _) = post(&gw.url, path, &chat_in(Some("tenant-a"))).await;
    assert!(
        decision(&same).contains("branch=cache_hit"),
        "{}",
        decision(&same)
    );
    assert_eq!(worker(&same), worker(&first));
    for other in [Some("tenant-b"), None] {
        let (status, h, _) = post(&gw.url, path, &chat_in(other)).await;
        assert_eq!(status, 200);
        assert!(
            !decision(&h).contains("branch=cache_hit"),
            "{other:?}: {}",
            decision(&h)
        );
    }
    // SGLang's adapter and extra key, on its native API.
    let generate = |extra: Value| {
        let mut body = json!({"text": prompt, "sampling_params": {"max_new_tokens": 2}});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let (_, _, _) = post(&gw.url, "/generate", &generate(json!({"lora_path": "sql"}))).await;
    for (extra, hit) in [
        (json!({"lora_path": ["sql"]}), true),
        (json!({"lora_path": "chat"}), false),
        (json!({"lora_path": "sql", "extra_key": "k"}), false),
    ] {
        let (status, h, _) = post(&gw.url, "/generate", &generate(extra.clone())).await;
        assert_eq!(status, 200);
        assert_eq!(
            decision(&h).contains("branch=cache_hit"),
            hit,
            "{extra}: {}",
            decision(&h)
        );
    }
    gw.shutdown().await;
}

/// The engines' own shapes of the inference bodies are theirs to answer:
/// vLLM's chat embeddings (`messages` in place of `input`), SGLang's
/// multimodal embedding inputs (`input: [{"text": ...}, {"image": ...}]`)
/// and vLLM's prompt embeddings (`prompt_embeds` in place of `prompt`).
/// The router refused them 400 `invalid_json` (a missing field, a map
/// where it read a prompt), so a pool of such engines could not be served
/// through it. A body with neither field is still refused here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_shapes_of_prompts_reach_the_worker() {
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let gw = gateway_ready(config(&[&t.url]), 1).await;
    let sent = [
        (
            "/v1/embeddings",
            json!({"model": DEFAULT_MODEL,
                   "messages": [{"role": "user", "content": "a red fox"}]}),
        ),
        (
            "/v1/embeddings",
            json!({"model": DEFAULT_MODEL,
                   "input": [{"text": "a red fox"}, {"image": "data:image/png;base64,AAAA"}]}),
        ),
        (
            "/v1/completions",
            json!({"model": DEFAULT_MODEL, "prompt_embeds": "AAAA", "max_tokens": 4}),
        ),
    ];
    for (path, body) in &sent {
        // The simulated worker takes none of these shapes: its own answer
        // comes back, naming it.
        let (status, headers, v) = post(&gw.url, path, body).await;
        assert!(
            headers.contains_key(WORKER_HEADER),
            "{path} {body}: {status} {v}"
        );
    }
    let paths: Vec<&str> = sent.iter().map(|(path, _)| *path).collect();
    assert_eq!(t.targets(), paths);
    for (path, body, missing) in [
        ("/v1/embeddings", json!({"model": DEFAULT_MODEL}), "input"),
        (
            "/v1/completions",
            json!({"model": DEFAULT_MODEL, "max_tokens": 4}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": DEFAULT_MODEL, "prompt": {"text": "x"}}),
            "map",
        ),
    ] {
        let (status, headers, e) = post(&gw.url, path, &body).await;
        assert_eq!(status, 400, "{path} {body}: {e}");
        assert!(!headers.contains_key(WORKER_HEADER), "{path} {body}");
        assert_eq!(e["error"]["code"], "invalid_json", "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(missing), "{message}");
    }
    assert_eq!(t.targets().len(), sent.len());
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_openai_errors() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg: Config = config(&[&w.url]);
    cfg.server.max_payload_size = 4096;
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    for (path, body, status, code) in [
        ("/v1/responses", "{\"input\": 5}", 400, "invalid_json"),
        ("/v1/responses", "[]", 400, "invalid_json"),
        ("/v1/responses", "{\"input\": [\"x\"]}", 400, "invalid_json"),
        (
            "/v1/messages",
            "{\"messages\": \"hi\"}",
            400,
            "invalid_json",
        ),
        ("/v1/messages", "{\"system\": \"s\"}", 400, "invalid_json"),
        (
            "/v1/messages",
            "{\"messages\": [], \"cache_salt\": 7}",
            400,
            "invalid_json",
        ),
        ("/v1/rerank", "not json", 400, "invalid_json"),
        ("/tokenize", "{\"model\": 5}", 400, "invalid_json"),
        ("/v1/score", "{\"model\": \"nope\"}", 404, "model_not_found"),
        (
            "/v1/chat/completions",
            "{\"messages\": [], \"lora_path\": {}}",
            400,
            "invalid_json",
        ),
    ] {
        let r = c
            .post(format!("{}{path}", gw.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{path} {body}");
        assert!(r.headers().get(WORKER_HEADER).is_none(), "{path} {body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["code"], code, "{path} {body}: {e}");
        assert!(e["error"]["message"].as_str().unwrap().len() > 10, "{e}");
    }
    // Well-formed for routing, wrong for the worker: its own 400 and
    // message come back.
    let (status, headers, e) = post(
        &gw.url,
        "/v1/messages",
        &json!({"messages": [{"role": "user", "content": "no max_tokens"}]}),
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(worker(&headers), w.url);
    assert_eq!(e["error"]["param"], "max_tokens", "{e}");
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

/// A speech model beside a chat model, each on its own worker: an audio
/// upload (`multipart/form-data`, as OpenAI's SDK and vLLM's clients send
/// `/v1/audio/transcriptions`) goes to the worker of the model its form
/// names, wherever the field is in the form; a model no worker serves is
/// a 404 that names it, as for JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_goes_to_the_model_its_form_names() {
    let speech = sim_worker(WorkerConfig {
        model: "whisper-large-v3".into(),
        ..fast_worker()
    })
    .await;
    let chat = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&speech.url, &chat.url]), 2).await;
    let upload = |boundary: &str, content_type: &str, fields: &[(&str, &str)]| {
        let mut body = Vec::new();
        for (name, value) in fields {
            let disposition = match *name {
                "file" => "form-data; name=\"file\"; filename=\"a.wav\"\r\n\
                           Content-Type: audio/wav"
                    .to_owned(),
                _ => format!("form-data; name=\"{name}\""),
            };
            body.extend_from_slice(
                format!("--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n{value}\r\n")
                    .as_bytes(),
            );
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        client()
            .post(format!("{}/v1/audio/transcriptions", gw.url))
            .header("content-type", content_type)
            .body(body)
    };
    let audio = "RIFF\r\n--not-the-boundary\r\n\u{7f}data";
    for (boundary, content_type, fields) in [
        (
            "b1",
            "multipart/form-data; boundary=b1",
            vec![("model", "whisper-large-v3"), ("file", audio)],
        ),
        // The SDKs put the file first; a quoted boundary; a stream.
        (
            "----x y",
            "Multipart/Form-Data; charset=utf-8; boundary=\"----x y\"",
            vec![
                ("file", audio),
                ("stream", "true"),
                ("model", "whisper-large-v3"),
            ],
        ),
    ] {
        let r = upload(boundary, content_type, &fields)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let served = r.headers().get(WORKER_HEADER).cloned();
        let body = r.text().await.unwrap();
        assert_eq!(
            served.as_ref().and_then(|v| v.to_str().ok()),
            Some(speech.url.as_str()),
            "{content_type}: {status} {body}"
        );
    }
    let r = upload(
        "b",
        "multipart/form-data; boundary=b",
        &[("model", "whisper-tiny"), ("file", audio)],
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers().get(WORKER_HEADER).is_none());
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "model_not_found", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("whisper-tiny"),
        "{e}"
    );
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}

/// vLLM serves its classification and pooling APIs at `/classify` and
/// `/pooling` (no `/v1`): they are passed, path and query unchanged, to
/// the least-loaded worker of the body's model, like reranking, never
/// answered 404 by the router itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllms_classify_and_pooling_reach_the_models_workers() {
    let w = sim_worker(fast_worker()).await;
    let t = tap(&w.url).await;
    let other = sim_worker(WorkerConfig {
        model: "another-model".into(),
        ..fast_worker()
    })
    .await;
    let gw = gateway_ready(config(&[&t.url, &other.url]), 2).await;
    let sent = ["/classify", "/pooling?x=1"];
    for path in sent {
        let body = json!({"model": DEFAULT_MODEL, "input": ["red fox"]});
        let (status, headers, v) = post(&gw.url, path, &body).await;
        assert_eq!(
            headers.get(WORKER_HEADER).and_then(|v| v.to_str().ok()),
            Some(t.url.as_str()),
            "{path}: {status} {v}"
        );
        assert!(decision(&headers).contains("branch=least_load"), "{path}");
    }
    assert_eq!(t.targets(), sent);
    let (status, _, e) = post(
        &gw.url,
        "/classify",
        &json!({"model": "nope", "input": "x"}),
    )
    .await;
    assert_eq!(status, 404, "{e}");
    assert_eq!(e["error"]["code"], "model_not_found", "{e}");
    wait_for_zero_load(&gw.url).await;
    gw.shutdown().await;
}
