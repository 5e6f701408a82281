//! Tenants end to end on loopback: named API keys with request and token
//! limits and a priority, in front of simulated workers that report `usage`.
//!
//! Configs are written as YAML, the way an operator writes them. No test
//! asserts how fast anything is: limits are checked by status, header and
//! body; priority by the order in which requests were served.

mod common;

use common::*;
use radixgate::config::Config;
use serde_json::{Value, json};
use std::sync::Arc;

/// A config with `tenants_yaml` (the body of a `tenants:` section) in front
/// of `worker`. Merged as YAML, the way an operator's file would carry it.
fn tenant_config(worker: &str, tenants_yaml: &str) -> Config {
    with_tenants(config(&[worker]), tenants_yaml)
}

fn with_tenants(base: Config, tenants_yaml: &str) -> Config {
    let mut document = serde_norway::to_value(&base).expect("config as YAML");
    let tenants: serde_norway::Value = serde_norway::from_str(tenants_yaml).expect("tenants YAML");
    document
        .as_mapping_mut()
        .expect("a mapping")
        .insert("tenants".into(), tenants);
    let text = serde_norway::to_string(&document).expect("YAML text");
    Config::from_yaml(&text).expect("a config with tenants")
}

async fn post_as(gateway: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = client()
        .post(format!("{gateway}/v1/chat/completions"))
        .json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("request sent")
}

/// Sends one chat request and reads its whole body.
async fn chat_as(gateway: &str, key: &str, stream: bool) -> (u16, Option<String>, String) {
    let r = post_as(gateway, Some(key), &chat("tenant request", stream)).await;
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, r.text().await.expect("body"))
}

/// Checks an OpenAI-style rate-limit answer and returns its Retry-After.
fn assert_rate_limited(answer: &(u16, Option<String>, String), kind: &str) -> u64 {
    let (status, retry_after, body) = answer;
    assert_eq!(*status, 429, "{body}");
    let body: Value = serde_json::from_str(body).expect("JSON error body");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("team-"));
    let secs: u64 = retry_after
        .as_deref()
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(secs >= 1, "Retry-After {secs}");
    secs
}

const TWO_TEAMS: &str = "keys:
    - {name: team-a, key: sk-a, requests_per_minute: 2}
    - {name: team-b, key: sk-b}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limit_gives_429_with_retry_after_to_one_tenant_only() {
    let worker = sim_worker(fast_worker()).await;
    let gw = gateway_ready(tenant_config(&worker.url, TWO_TEAMS), 1).await;
    for _ in 0..2 {
        assert_eq!(chat_as(&gw.url, "sk-a", false).await.0, 200);
    }
    let limited = chat_as(&gw.url, "sk-a", false).await;
    let secs = assert_rate_limited(&limited, "requests");
    // Two a minute: the next slot frees within half a minute.
    assert!(secs <= 30, "Retry-After {secs}");
    for _ in 0..5 {
        assert_eq!(chat_as(&gw.url, "sk-b", true).await.0, 200);
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_missing_keys_get_401() {
    let worker = sim_worker(fast_worker()).await;
    let gw = gateway_ready(tenant_config(&worker.url, TWO_TEAMS), 1).await;
    for key in [Some("sk-c"), Some("sk-"), Some(""), None] {
        let r = post_as(&gw.url, key, &chat("who", false)).await;
        assert_eq!(r.status(), 401, "{key:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["type"], "authentication_error", "{key:?}");
    }
    let r = client()
        .get(format!("{}/v1/models", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "every client route needs a key");
    assert_eq!(chat_as(&gw.url, "sk-b", false).await.0, 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_api_key_is_one_more_tenant_without_limits() {
    let worker = sim_worker(fast_worker()).await;
    let mut cfg = tenant_config(&worker.url, TWO_TEAMS);
    cfg.server.api_key = Some("sk-legacy".into());
    let gw = gateway_ready(cfg, 1).await;
    for _ in 0..4 {
        assert_eq!(chat_as(&gw.url, "sk-legacy", false).await.0, 200);
    }
    assert_eq!(chat_as(&gw.url, "sk-a", false).await.0, 200);
    assert_eq!(chat_as(&gw.url, "sk-x", false).await.0, 401);
    gw.shutdown().await;
}

/// A tenant with a budget smaller than one answer's usage: the first request
/// passes (its tokens are only known at its end), the next waits for the
/// bucket to pay the overdraft back.
async fn token_limit_trips_after_usage(stream: bool) {
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 5}
    - {name: team-b, key: sk-b, tokens_per_minute: 100000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let (status, _, body) = chat_as(&gw.url, "sk-a", stream).await;
    assert_eq!(status, 200, "{body}");
    let limited = chat_as(&gw.url, "sk-a", stream).await;
    assert_rate_limited(&limited, "tokens");
    for _ in 0..3 {
        assert_eq!(chat_as(&gw.url, "sk-b", stream).await.0, 200);
    }
    let text = metrics_text(&gw.url).await;
    let tokens = sample(
        &text,
        "radixgate_tenant_tokens_total",
        &["tenant=\"team-b\""],
    );
    assert!(tokens.is_some_and(|t| t >= 3.0), "{text}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_limit_trips_after_a_whole_body_reports_usage() {
    token_limit_trips_after_usage(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_limit_trips_after_a_stream_reports_usage() {
    token_limit_trips_after_usage(true).await;
}

/// The value of the first sample of `name` whose labels include all `labels`.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_tenant_metrics_are_exported() {
    let worker = sim_worker(fast_worker()).await;
    let gw = gateway_ready(tenant_config(&worker.url, TWO_TEAMS), 1).await;
    for _ in 0..3 {
        chat_as(&gw.url, "sk-a", true).await;
    }
    chat_as(&gw.url, "sk-b", false).await;
    let text = metrics_text(&gw.url).await;
    let requests = "radixgate_tenant_requests_total";
    let a_ok = sample(&text, requests, &["tenant=\"team-a\"", "status=\"200\""]);
    let a_limited = sample(&text, requests, &["tenant=\"team-a\"", "status=\"429\""]);
    let b_ok = sample(&text, requests, &["tenant=\"team-b\"", "status=\"200\""]);
    assert_eq!(
        (a_ok, a_limited, b_ok),
        (Some(2.0), Some(1.0), Some(1.0)),
        "{text}"
    );
    let limited = sample(
        &text,
        "radixgate_tenant_rate_limited_total",
        &["tenant=\"team-a\"", "limit=\"requests\""],
    );
    assert_eq!(limited, Some(1.0), "{text}");
    for tenant in ["team-a", "team-b"] {
        let label = format!("tenant=\"{tenant}\"");
        let tokens = sample(&text, "radixgate_tenant_tokens_total", &[&label]);
        assert!(tokens.is_some_and(|t| t > 0.0), "{tenant}: {text}");
    }
    assert!(
        !text.contains("sk-a") && !text.contains("sk-b"),
        "no key in metrics"
    );
    gw.shutdown().await;
}

/// A client API request refused for its key (none, or one no tenant
/// has: a client left with a rotated-out key) is counted in
/// `radixgate_requests_total` as 401 under its route, as the router's
/// other refusals are (413, 429). It was in no metric nor log line: the
/// router looked idle while every request of such a client failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_for_their_key_are_counted() {
    let worker = sim_worker(fast_worker()).await;
    let gw = gateway_ready(tenant_config(&worker.url, TWO_TEAMS), 1).await;
    let body = chat("no key", false);
    assert_eq!(post_as(&gw.url, None, &body).await.status(), 401);
    assert_eq!(post_as(&gw.url, Some("sk-old"), &body).await.status(), 401);
    let refused = client()
        .post(format!("{}/v1/audio/transcriptions", gw.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    // Routes the request path does not count when it answers them are not
    // counted when refused either.
    let models = client()
        .get(format!("{}/v1/models", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 401);
    assert_eq!(chat_as(&gw.url, "sk-b", false).await.0, 200);
    let text = metrics_text(&gw.url).await;
    let requests = "radixgate_requests_total";
    let chat_route = "route=\"/v1/chat/completions\"";
    let refused = sample(&text, requests, &[chat_route, "status=\"401\""]);
    let unrouted = sample(&text, requests, &["route=\"/v1/*\"", "status=\"401\""]);
    let served = sample(&text, requests, &[chat_route, "status=\"200\""]);
    assert_eq!(
        (refused, unrouted, served),
        (Some(2.0), Some(1.0), Some(1.0)),
        "{text}"
    );
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with(requests) && l.contains("status=\"401\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, 3.0, "only the forwarded routes' refusals: {text}");
    assert!(!text.contains("sk-old"), "no key in metrics");
    gw.shutdown().await;
}

/// A stream's data events, `[DONE]` left out, as JSON.
fn stream_events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("a JSON event"))
        .collect()
}

/// `radixgate_tenant_tokens_total` of `tenant`, 0 before any.
async fn tenant_tokens(gateway: &str, tenant: &str) -> f64 {
    let text = metrics_text(gateway).await;
    sample(
        &text,
        "radixgate_tenant_tokens_total",
        &[&format!("tenant=\"{tenant}\"")],
    )
    .unwrap_or(0.0)
}

/// A tenant with a token limit that streams without asking for usage is
/// charged all the same: the gateway asks the worker for it, charges what
/// it reports, and the client's stream has no usage event it did not ask
/// for. A client that asked gets its usage event as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_include_usage_is_charged_and_its_client_sees_no_usage_event() {
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let asked = chat("metered stream", true);
    let r = post_as(&gw.url, Some("sk-a"), &asked).await;
    assert_eq!(r.status(), 200);
    let body = r.text().await.unwrap();
    let events = stream_events(&body);
    let usage = events.last().expect("events")["usage"]["total_tokens"]
        .as_f64()
        .expect("the usage event the client asked for");
    assert!(usage > 0.0, "{body}");
    assert_eq!(tenant_tokens(&gw.url, "team-a").await, usage);

    for options in [
        None,
        Some(json!(null)),
        Some(json!({"include_usage": false})),
        Some(json!({"include_usage": 0})),
    ] {
        let mut unasked = asked.clone();
        match options.clone() {
            None => unasked.as_object_mut().unwrap().remove("stream_options"),
            Some(value) => unasked
                .as_object_mut()
                .unwrap()
                .insert("stream_options".into(), value),
        };
        let before = tenant_tokens(&gw.url, "team-a").await;
        let r = post_as(&gw.url, Some("sk-a"), &unasked).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("content-length").is_none());
        let body = r.text().await.unwrap();
        let events = stream_events(&body);
        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
        assert!(events.len() >= 2, "{body}");
        for event in &events {
            assert_ne!(event["choices"], json!([]), "a usage event: {body}");
            assert!(event["usage"].is_null(), "{body}");
        }
        assert_eq!(
            tenant_tokens(&gw.url, "team-a").await - before,
            usage,
            "charged what the worker reported: {options:?}"
        );
    }
    gw.shutdown().await;
}

/// A metered tenant's stream whose body is over half the body budget (the
/// budget as small as the size limit, which the config allows): the body
/// edited to ask for usage replaces the client's in the budget rather than
/// needing room beside it, so the request is served, not answered 503
/// "retry shortly" however idle the router is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_stream_over_half_the_body_budget_is_served() {
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 100000000}
";
    let mut cfg = tenant_config(&worker.url, tenants);
    cfg.server.max_payload_size = 100_000;
    cfg.server.max_buffered_body_bytes = 100_000;
    let gw = gateway_ready(cfg, 1).await;
    let mut body = chat(&"long prompt ".repeat(5_000), true);
    body.as_object_mut().unwrap().remove("stream_options");
    let r = post_as(&gw.url, Some("sk-a"), &body).await;
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(tenant_tokens(&gw.url, "team-a").await > 0.0);
    gw.shutdown().await;
}

/// Streams `body` as team-a (key `sk-a`), leaves after 4 events, and
/// returns what the tenant was charged for it: its tokens past `before`,
/// once they move (within 10 s).
async fn charged_for_leaving_early(gateway: &str, body: &Value, before: f64) -> f64 {
    let mut r = post_as(gateway, Some("sk-a"), body).await;
    assert_eq!(r.status(), 200);
    let mut read = String::new();
    while read.matches("data: ").count() < 4 {
        let chunk = r.chunk().await.unwrap().expect("the stream goes on");
        read.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    drop(r);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let charged = tenant_tokens(gateway, "team-a").await - before;
        if charged > 0.0 || std::time::Instant::now() > deadline {
            return charged;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A client that leaves a stream before its usage event is charged an
/// estimate (the request body's bytes and the events it was sent), not
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_left_before_its_usage_event_is_charged_an_estimate() {
    let mut slow = fast_worker();
    slow.engine.timing.step_base_us = 20_000.0;
    let worker = sim_worker(slow).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let mut body = chat(&"a long question ".repeat(100), true);
    body["max_tokens"] = json!(1000);
    let charged = charged_for_leaving_early(&gw.url, &body, 0.0).await;
    // A body of about 1,700 bytes at 4 a token (none learned yet), and at
    // least the three events with text the client read.
    assert!(charged >= 403.0, "charged {charged}");
    assert!(
        charged < 1000.0,
        "charged {charged}: the prompt and what was sent"
    );

    // An inline image counts as one part, not as its bytes (600,000 bytes
    // of base64 would be 150,000 tokens).
    let mut with_image = body.clone();
    with_image["messages"][0]["content"] = json!([
        {"type": "image_url", "image_url": {
            "url": format!("data:image/png;base64,{}", "iVBORw0KGgo".repeat(54_546))}},
        {"type": "text", "text": "a long question ".repeat(100)},
    ]);
    let with_image_charged = charged_for_leaving_early(&gw.url, &with_image, charged).await;
    // The text as above, and 1,024 tokens for the image.
    assert!(
        (1_400.0..3_000.0).contains(&with_image_charged),
        "charged {with_image_charged}"
    );
    gw.shutdown().await;
}

/// A client that leaves an Anthropic Messages stream before its
/// `message_delta` (the only event with the output's count) is charged the
/// prompt `message_start` reported and an estimate of the output it was
/// sent, as a client that leaves an OpenAI stream is: not the prompt alone,
/// which let a tenant read its whole answer, leave before the last events
/// and be charged for none of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_stream_left_before_its_output_count_is_charged_for_its_output() {
    let mut slow = fast_worker();
    slow.engine.timing.step_base_us = 20_000.0;
    let worker = sim_worker(slow).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let body = json!({"model": radixgate_sim::server::DEFAULT_MODEL, "max_tokens": 1000,
        "stream": true,
        "messages": [{"role": "user", "content": "a long question ".repeat(100)}]});
    let mut r = client()
        .post(format!("{}/v1/messages", gw.url))
        .bearer_auth("sk-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut read = String::new();
    while read.matches("event: content_block_delta").count() < 20 {
        let chunk = r.chunk().await.unwrap().expect("the stream goes on");
        read.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    drop(r);
    assert!(!read.contains("message_delta"), "{read}");
    let start = &stream_events(&read)[0]["message"]["usage"];
    let prompt = start["input_tokens"].as_f64().unwrap()
        + start["cache_read_input_tokens"].as_f64().unwrap_or(0.0);
    let charged = charged_once(&gw.url, "the stream left early is charged").await;
    // The prompt as reported, and at least the 20 deltas the client read.
    assert!(
        charged >= prompt + 20.0,
        "charged {charged}, prompt {prompt}"
    );
    assert!(
        charged < prompt + 1000.0,
        "charged {charged}, prompt {prompt}"
    );
    gw.shutdown().await;
}

/// A Messages stream its worker breaks off before `message_delta` (the
/// gateway ends it with an error event) is cut short as surely as one its
/// client leaves: charged the prompt `message_start` reported and the
/// output it was sent, not the prompt alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_stream_its_worker_breaks_off_is_charged_for_its_output() {
    let worker = sim_worker(fast_worker()).await;
    worker.set_faults(radixgate_sim::server::FaultConfig {
        die_after_chunks: Some(40),
        ..Default::default()
    });
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let body = json!({"model": radixgate_sim::server::DEFAULT_MODEL, "max_tokens": 1000,
        "stream": true,
        "messages": [{"role": "user", "content": "a long question ".repeat(100)}]});
    let r = client()
        .post(format!("{}/v1/messages", gw.url))
        .bearer_auth("sk-a")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let read = r.text().await.unwrap();
    assert!(read.contains("event: error"), "{read}");
    assert!(!read.contains("message_delta"), "{read}");
    let deltas = read.matches("event: content_block_delta").count() as f64;
    assert!(deltas >= 20.0, "{read}");
    let start = &stream_events(&read)[0]["message"]["usage"];
    let prompt = start["input_tokens"].as_f64().unwrap()
        + start["cache_read_input_tokens"].as_f64().unwrap_or(0.0);
    let charged = charged_once(&gw.url, "the broken stream is charged").await;
    assert!(
        charged >= prompt + deltas,
        "charged {charged}, prompt {prompt}, {deltas} deltas"
    );
    gw.shutdown().await;
}

/// An SGLang `/generate` batch (a list of prompts) is charged every item's
/// tokens, not the last item's alone: its answer is a list with a
/// `meta_info` per item, or, streamed, their events interleaved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generate_batch_is_charged_for_every_item() {
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 100000000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    // More items than the answer's tail holds the reports of.
    let prompts: Vec<String> = (0..64)
        .map(|i| format!("batch item {i}: {}", "some words ".repeat(5)))
        .collect();
    let mut before = 0.0;
    for stream in [false, true] {
        let body = json!({"text": prompts, "stream": stream,
            "sampling_params": {"max_new_tokens": 4}});
        let r = client()
            .post(format!("{}/generate", gw.url))
            .bearer_auth("sk-a")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        // Each item's last report (a stream's counts grow as it goes).
        let items: Vec<Value> = if stream {
            stream_events(&text)
        } else {
            serde_json::from_str(&text).unwrap()
        };
        let mut last = std::collections::BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let index = item["index"].as_u64().unwrap_or(i as u64);
            last.insert(index, item["meta_info"].clone());
        }
        assert_eq!(last.len(), prompts.len(), "{text}");
        let reported: f64 = last
            .values()
            .map(|m| {
                m["prompt_tokens"].as_f64().unwrap() + m["completion_tokens"].as_f64().unwrap()
            })
            .sum();
        let charged = tenant_tokens(&gw.url, "team-a").await - before;
        assert_eq!(charged, reported, "stream {stream}: {text}");
        before += charged;
    }
    gw.shutdown().await;
}

/// A worker of the default model whose chat completions are answered by
/// `chat`; its URL and its task (abort it at the end).
async fn worker_answering(
    chat: axum::routing::MethodRouter,
) -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    use axum::routing::get;
    let models = json!({"data": [{"id": radixgate_sim::server::DEFAULT_MODEL}]});
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(move || async move { axum::Json(models) }))
        .route("/v1/chat/completions", chat);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    (
        url,
        tokio::spawn(async move { axum::serve(listener, app).await }),
    )
}

/// What team-a was charged, once it was charged anything (`what` names the
/// wait).
async fn charged_once(gateway: &str, what: &str) -> f64 {
    wait_until(what, || async {
        tenant_tokens(gateway, "team-a").await > 0.0
    })
    .await;
    tenant_tokens(gateway, "team-a").await
}

/// A metered stream a worker sends with a `Content-Length` (the whole
/// stream at once) is charged what it reports, as a chunked one is: the
/// gateway ends it when its last byte passes, which is its end, not a
/// client that left early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_known_length_is_charged_what_it_reports() {
    let stream = concat!(
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":2,\"total_tokens\":52}}\n\n",
        "data: [DONE]\n\n",
    );
    let (worker, served) = worker_answering(axum::routing::post(move || async move {
        ([("content-type", "text/event-stream")], stream)
    }))
    .await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker, tenants), 1).await;
    let mut body = chat("a question", true);
    body.as_object_mut().unwrap().remove("stream_options");
    let r = post_as(&gw.url, Some("sk-a"), &body).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains("usage"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(charged_once(&gw.url, "the stream is charged").await, 52.0);
    gw.shutdown().await;
    served.abort();
}

/// A stream its worker refuses under a 200 (SGLang streams a prompt too
/// long for the model as an error event and `[DONE]`) is charged what it
/// reports, nothing, as the same refusal answered whole (a 400) is: not
/// the estimate of a prompt no worker read, which locked a tenant out for
/// minutes after one over-long request. A stream whose error comes after
/// its first token is still charged its estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_its_worker_refuses_is_charged_nothing() {
    const REFUSED: &str = concat!(
        "data: {\"error\":{\"object\":\"error\",\"message\":\"The input (9000 tokens) ",
        "is longer than the model's context length (8192 tokens).\",",
        "\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}\n\n",
        "data: [DONE]\n\n",
    );
    const BROKE: &str = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        "data: {\"error\":{\"message\":\"aborted\",\"type\":\"InternalServerError\",",
        "\"code\":500}}\n\n",
        "data: [DONE]\n\n",
    );
    let (worker, served) =
        worker_answering(axum::routing::post(|body: axum::body::Bytes| async move {
            let refused = body.windows(7).any(|w| w == b"refused");
            let stream = if refused { REFUSED } else { BROKE };
            ([("content-type", "text/event-stream")], stream)
        }))
        .await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker, tenants), 1).await;
    let mut body = chat(&"a long question refused ".repeat(1000), true);
    body.as_object_mut().unwrap().remove("stream_options");
    let r = post_as(&gw.url, Some("sk-a"), &body).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert_eq!(text, REFUSED);
    assert_eq!(tenant_tokens(&gw.url, "team-a").await, 0.0);

    // The same prompt, answered a token before the error: estimated.
    let mut body = chat(&"a long question answered ".repeat(1000), true);
    body.as_object_mut().unwrap().remove("stream_options");
    let r = post_as(&gw.url, Some("sk-a"), &body).await;
    assert_eq!(r.text().await.unwrap(), BROKE);
    let charged = charged_once(&gw.url, "the broken stream is charged").await;
    // About 25,000 bytes at 4 a token.
    assert!(charged > 6000.0, "charged {charged}");
    gw.shutdown().await;
    served.abort();
}

/// The scan for an SGLang `/generate` batch's item reports reads
/// `/generate` answers only: another API's answer is charged the usage it
/// reports, whatever `meta_info` objects it carries (and its bytes are not
/// scanned twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_generate_answer_is_read_for_item_reports() {
    let meta = json!({"finish_reason": {"type": "stop"}, "prompt_tokens": 10,
        "completion_tokens": 1});
    let answer = json!({
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "a"}, "meta_info": meta},
            {"index": 1, "message": {"role": "assistant", "content": "b"}, "meta_info": meta},
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 2, "total_tokens": 52},
    });
    let (worker, served) =
        worker_answering(axum::routing::post(
            move || async move { axum::Json(answer) },
        ))
        .await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker, tenants), 1).await;
    let r = post_as(&gw.url, Some("sk-a"), &chat("a question", false)).await;
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await.unwrap();
    assert_eq!(charged_once(&gw.url, "the answer is charged").await, 52.0);
    gw.shutdown().await;
    served.abort();
}

/// Counting a prompt's tokens (`/v1/messages/count_tokens`, which the
/// Anthropic SDK and the tools built on it call before sending) generates
/// none and uses no budget: a tenant with a token limit is not charged the
/// prompt's estimate for it, as it was for an unknown API's answer that
/// reports no usage, once for each count and again for the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_a_prompts_tokens_is_not_charged() {
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let body = json!({"model": radixgate_sim::server::DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "a long question ".repeat(100)}]});
    for path in [
        "/v1/messages/count_tokens",
        "/v1/messages/count_tokens?beta=true",
    ] {
        let r = client()
            .post(format!("{}{path}", gw.url))
            .bearer_auth("sk-a")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let answer: Value = r.json().await.unwrap();
        assert!(answer["input_tokens"].as_u64().unwrap() > 0, "{answer}");
    }
    wait_until("both counts answered", || {
        let url = gw.url.clone();
        async move {
            let text = metrics_text(&url).await;
            sample(
                &text,
                "radixgate_tenant_requests_total",
                &["tenant=\"team-a\""],
            ) == Some(2.0)
        }
    })
    .await;
    assert_eq!(tenant_tokens(&gw.url, "team-a").await, 0.0);
    gw.shutdown().await;
}

/// A worker that reports more tokens than any answer has does not lock its
/// tenant out: the answer is charged as one that reports none (an
/// estimate), and the tenant's next request is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_reports_absurd_usage_does_not_lock_its_tenant_out() {
    let (worker, served) = worker_answering(axum::routing::post(|| async {
        axum::Json(json!({
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1_000_000_000_000_000_000_u64,
                      "completion_tokens": 1,
                      "total_tokens": 1_000_000_000_000_000_001_u64},
        }))
    }))
    .await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000}
";
    let gw = gateway_ready(tenant_config(&worker, tenants), 1).await;
    for _ in 0..2 {
        let r = post_as(&gw.url, Some("sk-a"), &chat("a short question", false)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let _ = r.bytes().await;
    }
    let charged = tenant_tokens(&gw.url, "team-a").await;
    assert!((1.0..200.0).contains(&charged), "charged {charged}");
    gw.shutdown().await;
    served.abort();
}

/// A worker whose `total_tokens` is less than the prompt and completion
/// it reports beside it (0, say) is not believed in the tenant's favour:
/// the answer is charged the larger sum, and the tenant's token limit
/// holds. It was charged the total alone, nothing for a total of 0, and
/// the limit never tripped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_total_below_its_own_parts_is_not_what_is_charged() {
    let (worker, served) = worker_answering(axum::routing::post(|| async {
        axum::Json(json!({
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 600, "completion_tokens": 400, "total_tokens": 0},
        }))
    }))
    .await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 500}
";
    let gw = gateway_ready(tenant_config(&worker, tenants), 1).await;
    let r = post_as(&gw.url, Some("sk-a"), &chat("a short question", false)).await;
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    assert_eq!(charged_once(&gw.url, "the answer is charged").await, 1000.0);
    let limited = chat_as(&gw.url, "sk-a", false).await;
    assert_rate_limited(&limited, "tokens");
    gw.shutdown().await;
    served.abort();
}

/// A worker that records the order requests reach it and holds each one
/// until the test releases it: with one admission slot, the order it sees
/// is the order the gateway admitted them in.
struct GatedWorker {
    url: String,
    seen: Arc<parking_lot::Mutex<Vec<String>>>,
    release: Arc<tokio::sync::Semaphore>,
}

async fn gated_worker() -> GatedWorker {
    use axum::routing::{get, post};
    #[derive(Clone)]
    struct Gate {
        seen: Arc<parking_lot::Mutex<Vec<String>>>,
        release: Arc<tokio::sync::Semaphore>,
    }
    async fn answer(
        axum::extract::State(gate): axum::extract::State<Gate>,
        axum::Json(body): axum::Json<Value>,
    ) -> axum::Json<Value> {
        let text = body["messages"][0]["content"].as_str().unwrap_or_default();
        gate.seen.lock().push(text.to_owned());
        gate.release.acquire().await.expect("open").forget();
        axum::Json(serde_json::json!({
            "choices": [{"message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }))
    }
    let gate = Gate {
        seen: Arc::default(),
        release: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let models = serde_json::json!({"data": [{"id": radixgate_sim::server::DEFAULT_MODEL}]});
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(move || async move { axum::Json(models) }))
        .route("/v1/chat/completions", post(answer))
        .with_state(gate.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    GatedWorker {
        url,
        seen: gate.seen,
        release: gate.release,
    }
}

/// One slot, held: a high-priority request that arrives after two
/// low-priority ones are queued is admitted before them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_high_priority_request_jumps_the_admission_queue() {
    let worker = gated_worker().await;
    let tenants = "keys:
    - {name: team-low, key: sk-low, priority: low}
    - {name: team-high, key: sk-high, priority: high}
";
    let mut cfg = tenant_config(&worker.url, tenants);
    cfg.admission.max_concurrent_requests = Some(1);
    cfg.admission.queue_size = 10;
    let gw = gateway_ready(cfg, 1).await;
    let send = |who: &'static str, key: &'static str| {
        let url = gw.url.clone();
        tokio::spawn(async move {
            let r = post_as(&url, Some(key), &chat(who, false)).await;
            assert_eq!(r.status(), 200, "{who}");
        })
    };
    // The first holds the only slot at the worker; then two low-priority
    // requests queue, then a high-priority one.
    let mut tasks = vec![send("holder", "sk-low")];
    wait_until("the holder at the worker", || async {
        worker.seen.lock().len() == 1
    })
    .await;
    for (i, (who, key)) in [
        ("low-1", "sk-low"),
        ("low-2", "sk-low"),
        ("high", "sk-high"),
    ]
    .into_iter()
    .enumerate()
    {
        tasks.push(send(who, key));
        wait_for_queued(&gw.url, i + 1, 1).await;
    }
    worker.release.add_permits(4);
    for task in tasks {
        task.await.expect("request task");
    }
    assert_eq!(*worker.seen.lock(), ["holder", "high", "low-1", "low-2"]);
    gw.shutdown().await;
}

/// A request timeout set below the body's and the queue's says what ran
/// out: a client still sending its body gets 408, a request still queued
/// (passed over by a higher priority) 503 `queue_timeout`, given back to
/// its tenant's request limit, and only one a worker holds a 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_request_timeout_answers_for_the_phase_it_ran_out_in() {
    use futures::StreamExt;
    let worker = gated_worker().await;
    let tenants = "keys:
    - {name: team-low, key: sk-low, priority: low, requests_per_minute: 3}
    - {name: team-high, key: sk-high, priority: high}
";
    let mut cfg = tenant_config(&worker.url, tenants);
    cfg.server.request_timeout_secs = 2;
    cfg.server.body_read_timeout_secs = 60;
    cfg.admission.max_concurrent_requests = Some(1);
    cfg.admission.queue_size = 10;
    cfg.admission.queue_timeout_secs = 60;
    let gw = gateway_ready(cfg, 1).await;

    // A body that never ends.
    let opening = futures::stream::iter([Ok::<_, std::io::Error>(b"{\"model\": ".to_vec())]);
    let body = reqwest::Body::wrap_stream(opening.chain(futures::stream::pending()));
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth("sk-low")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 408);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "body_read_timeout", "{v}");

    // The holder is at the worker; a low-priority request queues, then a
    // high-priority one. The holder's timeout frees the slot for the
    // high-priority one, which holds it past the low one's timeout.
    let send = |who: &'static str, key: &'static str| {
        let url = gw.url.clone();
        tokio::spawn(async move {
            let r = post_as(&url, Some(key), &chat(who, false)).await;
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap();
            (
                status,
                v["error"]["code"].as_str().unwrap_or_default().to_owned(),
            )
        })
    };
    let holder = send("holder", "sk-low");
    wait_until("the holder at the worker", || async {
        worker.seen.lock().len() == 1
    })
    .await;
    let low = send("low", "sk-low");
    wait_for_queued(&gw.url, 1, 1).await;
    let high = send("high", "sk-high");
    wait_for_queued(&gw.url, 2, 1).await;
    assert_eq!(holder.await.unwrap(), (504, "request_timeout".to_owned()));
    assert_eq!(low.await.unwrap(), (503, "queue_timeout".to_owned()));
    assert_eq!(high.await.unwrap(), (504, "request_timeout".to_owned()));
    let metrics = metrics_text(&gw.url).await;
    assert!(
        metrics
            .lines()
            .any(|l| l == "radixgate_admission_rejected_total{reason=\"queue_timeout\"} 1"),
        "{metrics}"
    );
    assert_eq!(*worker.seen.lock(), ["holder", "high"]);
    // team-low was charged for its body and its holder, not for the
    // request the queue held: it has one left this minute.
    worker.release.add_permits(3);
    let r = post_as(&gw.url, Some("sk-low"), &chat("third", false)).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = post_as(&gw.url, Some("sk-low"), &chat("fourth", false)).await;
    assert_eq!(r.status(), 429);
    gw.shutdown().await;
}

/// One slot, held, and a queue of two filled by a low-priority tenant: a
/// high-priority request still gets a place (the newest low-priority
/// waiter's, which is refused as if the queue had been full) and is
/// served next, rather than being refused for a queue of batch work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_full_of_low_priority_requests_still_takes_a_high_priority_one() {
    let worker = gated_worker().await;
    let tenants = "keys:
    - {name: team-low, key: sk-low, priority: low}
    - {name: team-high, key: sk-high, priority: high}
";
    let mut cfg = tenant_config(&worker.url, tenants);
    cfg.admission.max_concurrent_requests = Some(1);
    cfg.admission.queue_size = 2;
    let gw = gateway_ready(cfg, 1).await;
    let send = |who: &'static str, key: &'static str| {
        let url = gw.url.clone();
        tokio::spawn(async move {
            let r = post_as(&url, Some(key), &chat(who, false)).await;
            let status = r.status().as_u16();
            let retry_after = r.headers().get("retry-after").cloned();
            let body: Value = r.json().await.expect("JSON body");
            (status, retry_after, body)
        })
    };
    let holder = send("holder", "sk-low");
    wait_until("the holder at the worker", || async {
        worker.seen.lock().len() == 1
    })
    .await;
    let low_1 = send("low-1", "sk-low");
    wait_for_queued(&gw.url, 1, 1).await;
    let low_2 = send("low-2", "sk-low");
    wait_for_queued(&gw.url, 2, 1).await;
    let high = send("high", "sk-high");
    // The newest low-priority waiter gives its place up, with the answer a
    // full queue gets.
    let (status, retry_after, body) = low_2.await.expect("request task");
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full", "{body}");
    assert!(retry_after.is_some(), "Retry-After");
    wait_for_queued(&gw.url, 2, 1).await;
    worker.release.add_permits(3);
    for task in [holder, high, low_1] {
        let (status, _, body) = task.await.expect("request task");
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(*worker.seen.lock(), ["holder", "high", "low-1"]);
    wait_for_queued(&gw.url, 0, 0).await;
    gw.shutdown().await;
}

/// A gated worker behind a gateway with one admission slot and
/// `queue_size` places in its queue, for two tenants: `busy` (no limit),
/// whose request (`holder`) holds the slot at the worker, and `team-a`
/// (`sk-a`, two requests a minute). Returns the holder's status to come.
async fn team_a_behind_a_holder(
    queue_size: usize,
) -> (
    GatedWorker,
    Gateway,
    tokio::task::JoinHandle<reqwest::StatusCode>,
) {
    let worker = gated_worker().await;
    let tenants = "keys:
    - {name: busy, key: sk-busy}
    - {name: team-a, key: sk-a, requests_per_minute: 2}
";
    let mut cfg = tenant_config(&worker.url, tenants);
    cfg.admission.max_concurrent_requests = Some(1);
    cfg.admission.queue_size = queue_size;
    let gw = gateway_ready(cfg, 1).await;
    let url = gw.url.clone();
    let holder = tokio::spawn(async move {
        post_as(&url, Some("sk-busy"), &chat("holder", false))
            .await
            .status()
    });
    wait_until("the holder at the worker", || async {
        worker.seen.lock().len() == 1
    })
    .await;
    (worker, gw, holder)
}

/// A tenant's requests the router refuses for its own overload (a full
/// admission queue) do not spend its request limit: once the router has
/// room, the tenant is served, not told to wait out the minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_refused_for_the_routers_overload_do_not_spend_the_tenants_limit() {
    let (worker, gw, holder) = team_a_behind_a_holder(0).await;
    for i in 0..4 {
        let r = post_as(&gw.url, Some("sk-a"), &chat(&format!("refused {i}"), false)).await;
        assert_eq!(r.status(), 429, "{i}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "queue_full", "{i}: {body}");
    }
    worker.release.add_permits(3);
    assert_eq!(holder.await.unwrap(), 200);
    for i in 0..2 {
        let r = post_as(&gw.url, Some("sk-a"), &chat(&format!("served {i}"), false)).await;
        assert_eq!(r.status(), 200, "{i}: {}", r.text().await.unwrap());
    }
    // Its two a minute are spent now.
    let r = post_as(&gw.url, Some("sk-a"), &chat("over", false)).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    gw.shutdown().await;
}

/// A tenant whose clients give up while the router queues them (a client
/// timeout shorter than the queue's) is not charged for those requests:
/// they were never served, as those the queue itself refuses are not. Its
/// request limit is whole once the router has room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_clients_leave_the_queue_do_not_spend_the_tenants_limit() {
    let (worker, gw, holder) = team_a_behind_a_holder(10).await;
    // Two requests of team-a queue; their clients give up and leave.
    for i in 0..2 {
        let url = gw.url.clone();
        let waiting = tokio::spawn(async move {
            post_as(&url, Some("sk-a"), &chat(&format!("left {i}"), false)).await
        });
        wait_for_queued(&gw.url, 1, 1).await;
        waiting.abort();
        let _ = waiting.await;
        wait_for_queued(&gw.url, 0, 1).await;
    }
    worker.release.add_permits(3);
    assert_eq!(holder.await.unwrap(), 200);
    for i in 0..2 {
        let r = post_as(&gw.url, Some("sk-a"), &chat(&format!("served {i}"), false)).await;
        assert_eq!(r.status(), 200, "{i}: {}", r.text().await.unwrap());
    }
    assert_eq!(*worker.seen.lock(), ["holder", "served 0", "served 1"]);
    gw.shutdown().await;
}

/// Waits until the admission gauges show `queued` waiting and `in_flight`
/// admitted.
async fn wait_for_queued(gateway: &str, queued: usize, in_flight: usize) {
    wait_until(
        &format!("{queued} queued, {in_flight} in flight"),
        || async {
            let text = metrics_text(gateway).await;
            let value = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
            };
            value("radixgate_admission_queued_requests") == Some(queued as f64)
                && value("radixgate_admission_in_flight_requests") == Some(in_flight as f64)
        },
    )
    .await;
}

/// A keys file in the temp directory, removed when dropped.
struct KeysFile(std::path::PathBuf);

impl KeysFile {
    fn new(tag: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "radixgate-tenants-{}-{tag}.yaml",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }
}

impl Drop for KeysFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The start-up error of a gateway with this keys file.
async fn start_error(tag: &str, keys: &str) -> String {
    let file = KeysFile::new(tag, keys);
    let cfg = with_tenants(config(&[]), &format!("api_key_file: {:?}", file.0));
    let gw = gateway(cfg).await;
    let err = gw.task.await.unwrap().expect_err("start-up refused");
    err.to_string()
}

#[tokio::test]
async fn a_bad_keys_file_stops_start_up_naming_the_entry() {
    let cases = [
        (
            "dup-name",
            "- {name: a, key: k1}\n- {name: a, key: k2}\n",
            &["entry 1", "`a`", "name"][..],
        ),
        (
            "dup-key",
            "- {name: a, key: k1}\n- {name: b, key: k1}\n",
            &["entry 1", "`b`", "same key as `a`"][..],
        ),
        (
            "empty-key",
            "- {name: a, key: ''}\n",
            &["entry 0", "`a`", "empty"][..],
        ),
        (
            "no-key",
            "- {name: a}\n",
            &["entry 0", "`a`", "key", "key_env"][..],
        ),
        (
            "zero-rpm",
            "- {name: a, key: k, requests_per_minute: 0}\n",
            &["entry 0", "requests_per_minute"][..],
        ),
        (
            "bad-priority",
            "- {name: a, key: k, priority: urgent}\n",
            &["urgent", "high"][..],
        ),
        (
            "missing-env",
            "- {name: a, key_env: RADIXGATE_TEST_UNSET_TENANT_KEY}\n",
            &["entry 0", "RADIXGATE_TEST_UNSET_TENANT_KEY"][..],
        ),
    ];
    for (tag, keys, needles) in cases {
        let err = start_error(tag, keys).await;
        assert!(
            err.contains("radixgate-tenants-"),
            "{tag}: names the file: {err}"
        );
        for needle in needles {
            assert!(err.contains(needle), "{tag}: `{needle}` not in: {err}");
        }
        assert!(
            !err.contains("k1") || tag != "dup-key",
            "{tag}: no key in: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_come_from_a_file_and_the_environment() {
    // Setting a variable is unsafe in a threaded test; cargo sets this one
    // for every test it runs.
    let worker = sim_worker(fast_worker()).await;
    let file = KeysFile::new(
        "ok",
        r#"[{"name": "team-json", "key": "sk-json", "priority": "high"},
            {"name": "team-env", "key_env": "CARGO_MANIFEST_DIR"}]"#,
    );
    let cfg = with_tenants(
        config(&[&worker.url]),
        &format!("api_key_file: {:?}", file.0),
    );
    let gw = gateway_ready(cfg, 1).await;
    assert_eq!(chat_as(&gw.url, "sk-json", false).await.0, 200);
    // Cargo sets CARGO_MANIFEST_DIR for the test binary: its value is the key.
    let key = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    assert_eq!(chat_as(&gw.url, &key, false).await.0, 200);
    assert_eq!(chat_as(&gw.url, "sk-nope", false).await.0, 401);
    gw.shutdown().await;
}

/// A metered tenant whose client leaves after its request reached a worker
/// but before the answer's head (a whole answer, which comes only when it
/// is done) is charged its prompt's estimate, as a stream left early is:
/// the worker read the prompt. It was charged nothing, so a tenant with a
/// token limit could have long prompts read without end by leaving each
/// request before its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_left_before_its_answer_is_charged_its_prompt() {
    let worker = gated_worker().await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let url = gw.url.clone();
    let left = tokio::spawn(async move {
        post_as(
            &url,
            Some("sk-a"),
            &chat(&"a long question ".repeat(100), false),
        )
        .await
    });
    wait_until("the request at the worker", || async {
        worker.seen.lock().len() == 1
    })
    .await;
    left.abort();
    let _ = left.await;
    wait_until("the request counted as left (499)", || async {
        let text = metrics_text(&gw.url).await;
        sample(&text, "radixgate_requests_total", &["status=\"499\""]) == Some(1.0)
    })
    .await;
    let charged = tenant_tokens(&gw.url, "team-a").await;
    // About 1,700 bytes of body at 4 characters a token.
    assert!((300.0..1000.0).contains(&charged), "charged {charged}");
    worker.release.add_permits(1);
    gw.shutdown().await;
}

/// A metered tenant's request that the router gives up on while a worker
/// works on it (its whole answer not ready by the first-byte timeout, or
/// the request timeout run out) is answered 504 and charged its prompt's
/// estimate, as one whose client leaves then is: the worker read the
/// prompt, and generated for as long as it was let. It was charged
/// nothing, so a tenant with a token limit could have long prompts read,
/// and answers generated up to each timeout, without end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_router_gives_up_on_is_charged_its_prompt() {
    let worker = gated_worker().await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let mut first_byte = config(&[&worker.url]);
    first_byte.retry.max_retries = 0;
    first_byte.retry.non_stream_timeout_secs = 1;
    let mut whole = config(&[&worker.url]);
    whole.server.request_timeout_secs = 1;
    for (timeout, base) in [("first byte", first_byte), ("request", whole)] {
        let gw = gateway_ready(with_tenants(base, tenants), 1).await;
        let answer = post_as(
            &gw.url,
            Some("sk-a"),
            &chat(&"a long question ".repeat(100), false),
        )
        .await;
        assert_eq!(answer.status().as_u16(), 504, "{timeout} timeout");
        let charged = tenant_tokens(&gw.url, "team-a").await;
        // About 1,700 bytes of body at 4 characters a token.
        assert!(
            (300.0..1000.0).contains(&charged),
            "{timeout} timeout: charged {charged}"
        );
        gw.shutdown().await;
    }
    worker.release.add_permits(2);
}

/// An embeddings answer holds vectors, not generated text: one that
/// reports no usage is charged its prompt's estimate, not its vectors'
/// bytes as output tokens. A short input whose 4,096 numbers came back
/// was charged thousands of tokens, so a metered tenant was locked out
/// after a few embeddings from a worker that does not report usage (or
/// whose client left while the vectors were sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_is_not_charged_its_vectors_as_output() {
    use axum::routing::get;
    let vector = json!({
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": vec![0.012_345_678_f64; 4096]}],
    });
    let models = json!({"data": [{"id": radixgate_sim::server::DEFAULT_MODEL}]});
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(move || async move { axum::Json(models) }))
        .route(
            "/v1/embeddings",
            axum::routing::post(move || async move { axum::Json(vector) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let worker = tokio::spawn(async move { axum::serve(listener, app).await });
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&url, tenants), 1).await;
    let answer = client()
        .post(format!("{}/v1/embeddings", gw.url))
        .bearer_auth("sk-a")
        .json(&json!({"model": radixgate_sim::server::DEFAULT_MODEL, "input": "a short text"}))
        .send()
        .await
        .expect("request sent");
    assert_eq!(answer.status().as_u16(), 200);
    let body = answer.bytes().await.expect("body");
    assert!(body.len() > 40_000, "{} bytes of vector", body.len());
    let charged = charged_once(&gw.url, "the embedding charged").await;
    // A body of about 70 bytes at 4 characters a token.
    assert!((1.0..100.0).contains(&charged), "charged {charged}");
    gw.shutdown().await;
    worker.abort();
}

/// A key with a character past ASCII (`é`) can never be presented: the
/// gateway reads a header as text only when it is visible ASCII, so every
/// request carrying it was answered 401, while the router started as if
/// the key were good. Such a key now stops start-up, naming its entry and
/// not the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_past_ascii_stops_start_up_naming_the_entry() {
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-clé}
";
    let mut gw = gateway(tenant_config(&worker.url, tenants)).await;
    let url = gw.url.clone();
    let err = tokio::select! {
        ended = &mut gw.task => ended.unwrap().expect_err("start-up refused").to_string(),
        () = wait_for_healthy(&url, 1) => {
            let key = reqwest::header::HeaderValue::from_bytes("Bearer sk-clé".as_bytes());
            let r = client()
                .post(format!("{url}/v1/chat/completions"))
                .header("authorization", key.unwrap())
                .json(&chat("hello", false))
                .send()
                .await
                .unwrap();
            panic!("started, and a request with the key was answered {}", r.status());
        }
    };
    for needle in ["entry 0", "`team-a`", "ASCII"] {
        assert!(err.contains(needle), "`{needle}` not in: {err}");
    }
    assert!(!err.contains("clé"), "no key in: {err}");
}

/// A tenant's request whose client leaves before its answer's head is in
/// the tenant's counts as 499, as it is in `radixgate_requests_total`: a
/// tenant's clients timing out on a hung pool show in its own series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_request_whose_client_left_is_counted_as_499() {
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    worker.set_faults(radixgate_sim::server::FaultConfig {
        hang: true,
        ..Default::default()
    });
    let impatient = reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_millis(300))
        .build()
        .unwrap();
    let left = impatient
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth("sk-a")
        .json(&chat("never answered", false))
        .send()
        .await;
    assert!(left.is_err_and(|e| e.is_timeout()));
    let all = "radixgate_requests_total{route=\"/v1/chat/completions\",status=\"499\",\
               model=\"sim-llama-8b\"}";
    wait_until("the request counted as 499", || async {
        series_value(&gw.url, all).await == 1.0
    })
    .await;
    let text = metrics_text(&gw.url).await;
    assert_eq!(
        sample(
            &text,
            "radixgate_tenant_requests_total",
            &["tenant=\"team-a\"", "status=\"499\""]
        ),
        Some(1.0),
        "{text}"
    );
    gw.shutdown().await;
}

/// vLLM puts `prompt_logprobs` (and, asked for them, the prompt's token
/// ids) after `usage` in a whole answer: a long prompt's are tens of KiB
/// past it. The answer is charged what its usage reports, not its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_with_a_long_field_after_its_usage_is_charged_its_usage() {
    let (worker, served) = worker_answering(axum::routing::post(|| async {
        let logprobs: Vec<Value> = (0..2000)
            .map(|i| json!({(i + 10).to_string(): {"logprob": -1.25, "rank": 1, "decoded_token": "word"}}))
            .collect();
        axum::Json(json!({
            "choices": [{"message": {"role": "assistant", "content": "a long answer ".repeat(300)}}],
            "usage": {"prompt_tokens": 2000, "completion_tokens": 1, "total_tokens": 2001},
            "prompt_logprobs": logprobs,
            "prompt_token_ids": (0..2000).collect::<Vec<u32>>(),
        }))
    }))
    .await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 100000}
";
    let gw = gateway_ready(tenant_config(&worker, tenants), 1).await;
    let r = post_as(&gw.url, Some("sk-a"), &chat("a short question", false)).await;
    assert_eq!(r.status(), 200);
    let body = r.bytes().await.unwrap();
    // Far past what the router keeps of an answer's end (8 KiB).
    assert!(body.len() > 32 * 1024, "{} bytes", body.len());
    assert_eq!(charged_once(&gw.url, "the answer is charged").await, 2001.0);
    gw.shutdown().await;
    served.abort();
}

/// A request of the Responses API as the tenant `key`: `path` under the
/// gateway, sent with `body` (a POST) or none (`method` as given); its
/// status and JSON body.
async fn responses_as(
    gateway: &str,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut request = client()
        .request(method, format!("{gateway}{path}"))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(body);
    }
    let r = request.send().await.expect("request sent");
    let status = r.status().as_u16();
    (status, r.json().await.expect("a JSON body"))
}

/// The tokens a Responses answer reports.
fn response_tokens(response: &Value) -> f64 {
    response["usage"]["total_tokens"]
        .as_f64()
        .unwrap_or_else(|| panic!("usage reported: {response}"))
}

/// A stored response's tokens are charged once, however often the
/// response is read: its retrievals and its cancel answer carry its
/// usage, which was charged when it was made. A tenant with a token limit
/// and one without are both counted once. Another replica, which did not
/// see it made, charges a read of it in full once, then nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_is_charged_once_however_often_it_is_read() {
    use reqwest::Method;
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
    - {name: team-b, key: sk-b}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let other = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let asked = json!({"model": radixgate_sim::server::DEFAULT_MODEL,
        "input": "a stored question", "max_output_tokens": 30});
    for (key, tenant) in [("sk-a", "team-a"), ("sk-b", "team-b")] {
        let (status, made) =
            responses_as(&gw.url, key, Method::POST, "/v1/responses", Some(&asked)).await;
        assert_eq!(status, 200, "{made}");
        let tokens = response_tokens(&made);
        assert_eq!(tenant_tokens(&gw.url, tenant).await, tokens, "{tenant}");
        let by_id = format!("/v1/responses/{}", made["id"].as_str().unwrap());
        let cancel = format!("{by_id}/cancel");
        let items = format!("{by_id}/input_items");
        for (method, path) in [
            (Method::GET, &by_id),
            (Method::GET, &by_id),
            (Method::POST, &cancel),
            (Method::GET, &items),
            (Method::GET, &by_id),
        ] {
            let body = (method == Method::POST).then(|| json!({}));
            let (status, read) = responses_as(&gw.url, key, method, path, body.as_ref()).await;
            assert_eq!(status, 200, "{path}: {read}");
            if path != &items {
                assert_eq!(response_tokens(&read), tokens, "{read}");
            }
            assert_eq!(
                tenant_tokens(&gw.url, tenant).await,
                tokens,
                "{tenant}: {path} charged nothing more"
            );
        }
        for read in 1..=3 {
            let (status, body) = responses_as(&other.url, key, Method::GET, &by_id, None).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(
                tenant_tokens(&other.url, tenant).await,
                tokens,
                "{tenant}: read {read} through the other replica"
            );
        }
        let (status, body) = responses_as(&gw.url, key, Method::DELETE, &by_id, None).await;
        assert_eq!((status, &body["deleted"]), (200, &json!(true)), "{body}");
        assert_eq!(tenant_tokens(&gw.url, tenant).await, tokens, "{tenant}");
    }
    other.shutdown().await;
    gw.shutdown().await;
}

/// A background response is answered before its work is done, without
/// usage: its create is charged the gateway's estimate, and the first read
/// that reports its usage is charged what that usage is past the estimate,
/// once; the reads after it charge nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_is_charged_its_usage_past_the_estimate_once() {
    use reqwest::Method;
    let worker = sim_worker(fast_worker()).await;
    let tenants = "keys:
    - {name: team-a, key: sk-a, tokens_per_minute: 1000000}
";
    let gw = gateway_ready(tenant_config(&worker.url, tenants), 1).await;
    let asked = json!({"model": radixgate_sim::server::DEFAULT_MODEL,
        "input": "a long job", "max_output_tokens": 200, "background": true});
    let (status, queued) =
        responses_as(&gw.url, "sk-a", Method::POST, "/v1/responses", Some(&asked)).await;
    assert_eq!(
        (status, &queued["status"]),
        (200, &json!("queued")),
        "{queued}"
    );
    assert!(queued["usage"].is_null(), "{queued}");
    let estimate = tenant_tokens(&gw.url, "team-a").await;
    assert!(estimate > 0.0, "the create is charged its estimate");
    let by_id = format!("/v1/responses/{}", queued["id"].as_str().unwrap());
    for read in 1..=3 {
        let (status, done) = responses_as(&gw.url, "sk-a", Method::GET, &by_id, None).await;
        assert_eq!(status, 200, "{done}");
        let tokens = response_tokens(&done);
        assert!(tokens > estimate, "the usage is past the estimate: {done}");
        assert_eq!(
            tenant_tokens(&gw.url, "team-a").await,
            tokens,
            "read {read}: the estimate and the rest of the usage, once"
        );
    }
    gw.shutdown().await;
}
