//! Correction from `cached_tokens`, end to end through `serve`: the router
//! reads what each answer reports of its cached prompt tokens and trims its
//! tree where a worker had evicted what the tree still remembered.
//!
//! Real simulated workers with a small KV cache (so they evict) and
//! scripted workers (so an answer's usage is exactly what the test says)
//! on loopback.

mod common;

use common::*;
use radixgate_sim::engine::EngineConfig;
use radixgate_sim::server::WorkerConfig;
use serde_json::{Value, json};

/// A worker whose KV cache holds 512 tokens (32 pages of 16).
fn small_cache_worker() -> WorkerConfig {
    let mut c = fast_worker();
    c.engine = EngineConfig {
        kv_capacity_tokens: 512,
        ..c.engine
    };
    c
}

/// `n` characters of text seeded by `seed` (words, so it reads like a
/// prompt; distinct seeds share no prefix).
fn text(seed: &str, n: usize) -> String {
    let mut s = String::with_capacity(n + 16);
    let mut i = 0u64;
    while s.len() < n {
        s.push_str(seed);
        s.push_str(&format!("{} ", i * 7919 % 1000));
        i += 1;
    }
    s.truncate(n);
    s
}

/// Sends a chat request; returns the decision header's `match=` and the body.
async fn ask(gateway: &str, content: &str, stream: bool) -> (f64, String) {
    ask_model(
        gateway,
        content,
        stream,
        radixgate_sim::server::DEFAULT_MODEL,
    )
    .await
}

async fn ask_model(gateway: &str, content: &str, stream: bool, model: &str) -> (f64, String) {
    let mut body = chat(content, stream);
    body["model"] = json!(model);
    let r = client()
        .post(format!("{gateway}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let decision = r.headers()["x-radixgate-decision"]
        .to_str()
        .unwrap()
        .to_owned();
    let matched = decision
        .split(' ')
        .find_map(|kv| kv.strip_prefix("match="))
        .map_or(0.0, |m| m.parse().unwrap());
    (matched, r.text().await.unwrap())
}

/// The one worker's entry in `/workers`.
async fn worker_entry(gateway: &str) -> Value {
    workers(gateway).await[0].clone()
}

/// The tree's characters for the one worker (`/get_loads`).
async fn tree_chars(gateway: &str) -> u64 {
    get_loads(gateway).await["workers"][0]["cached_chars"]
        .as_u64()
        .unwrap()
}

/// A config for the one worker at `url` with `correction` as the
/// routing's correction settings.
fn with_correction(url: &str, correction: Value) -> radixgate::config::Config {
    let mut c = config(&[url]);
    c.routing =
        serde_json::from_value(json!({"policy": "cache_aware", "correction": correction})).unwrap();
    c
}

/// A document, then a long unrelated prompt that makes the worker evict
/// it, then a prompt sharing the document's first half: the worker reports
/// (almost) nothing cached where the tree predicted the half. Returns the
/// gateway and the document. The tree is not bounded by the worker's cache
/// size here (it would forget the document as the worker does, and there
/// would be nothing to trim: `the_tree_forgets_what_the_workers_cache_cannot_hold`).
async fn evict_then_share(stream: bool) -> (Gateway, SimWorker, String) {
    let worker = sim_worker(small_cache_worker()).await;
    let c = with_correction(&worker.url, json!({"capacity_bound": false}));
    let gw = gateway_ready(c, 1).await;
    let doc = text("alpha ", 1200); // ~300 tokens
    ask(&gw.url, &doc, stream).await;
    let (again, _) = ask(&gw.url, &doc, stream).await;
    assert!(again > 0.99, "the tree predicts the document: {again}");
    // ~480 tokens: the worker's 32 pages cannot keep the document too.
    ask(&gw.url, &text("bravo ", 1900), stream).await;
    let half: String = doc.chars().take(600).collect();
    let (predicted, _) = ask(&gw.url, &format!("{half} and now something else"), stream).await;
    assert!(
        predicted > 0.9,
        "the tree still predicted the half: {predicted}"
    );
    (gw, worker, doc)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_follows_real_evictions() {
    let (gw, worker, doc) = evict_then_share(false).await;
    wait_until("the correction's trim", || async {
        worker_entry(&gw.url).await["cache"]["trims"].as_u64() == Some(1)
    })
    .await;
    // The document's tail was evicted on the worker and is gone from the
    // tree too; what the last request just computed (the shared half) stays.
    let (matched, _) = ask(&gw.url, &doc, false).await;
    assert!(
        (0.4..0.6).contains(&matched),
        "after the trim the tree predicts only the half the worker recomputed: {matched}"
    );
    let cache = worker_entry(&gw.url).await["cache"].clone();
    assert!(cache["reports"].as_u64().unwrap() >= 4, "{cache}");
    assert!(cache["prediction_error"].as_f64().unwrap() > 0.0, "{cache}");
    let rate = cache["reported_hit_rate"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&rate), "{cache}");
    // The upkeep tick exports the worker's figures (every 250 ms).
    wait_until("the correction's series", || async {
        metrics_text(&gw.url)
            .await
            .contains("radixgate_cache_trims_total{")
    })
    .await;
    let metrics = metrics_text(&gw.url).await;
    for series in [
        "radixgate_cache_trims_total{",
        "radixgate_cache_predicted_tokens_total{",
        "radixgate_cache_reported_tokens_total{",
        "radixgate_cache_prompt_tokens_total{",
        "radixgate_cache_prediction_error{",
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
    gw.shutdown().await;
    worker.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_with_include_usage_feed_the_correction() {
    let (gw, worker, doc) = evict_then_share(true).await;
    wait_until("the correction's trim", || async {
        worker_entry(&gw.url).await["cache"]["trims"].as_u64() == Some(1)
    })
    .await;
    let (matched, _) = ask(&gw.url, &doc, true).await;
    assert!((0.4..0.6).contains(&matched), "{matched}");
    gw.shutdown().await;
    worker.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_correction_off_the_tree_keeps_its_guess() {
    let worker = sim_worker(small_cache_worker()).await;
    let c = with_correction(
        &worker.url,
        json!({"enabled": false, "capacity_bound": false}),
    );
    let gw = gateway_ready(c, 1).await;
    let doc = text("alpha ", 1200);
    ask(&gw.url, &doc, false).await;
    ask(&gw.url, &text("bravo ", 1900), false).await;
    let half: String = doc.chars().take(600).collect();
    ask(&gw.url, &format!("{half} and now something else"), false).await;
    wait_until("three reports", || async {
        worker_entry(&gw.url).await["cache"]["reports"].as_u64() == Some(3)
    })
    .await;
    let (matched, _) = ask(&gw.url, &doc, false).await;
    assert!(matched > 0.99, "{matched}");
    assert_eq!(worker_entry(&gw.url).await["cache"]["trims"], 0);
    gw.shutdown().await;
    worker.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tree_forgets_what_the_workers_cache_cannot_hold() {
    // The default: the gateway reads the worker's 512 tokens once it is
    // admitted and keeps the worker's share of the tree within them.
    let worker = sim_worker(small_cache_worker()).await;
    let gw = gateway_ready(config(&[&worker.url]), 1).await;
    wait_until("the worker's cache size", || async {
        worker_entry(&gw.url).await["kv_capacity_tokens"] == 512
    })
    .await;
    let doc = text("alpha ", 1200);
    ask(&gw.url, &doc, false).await;
    // The first answer teaches the characters per token; from then on the
    // bound holds.
    wait_until("the first report", || async {
        worker_entry(&gw.url).await["cache"]["reports"].as_u64() == Some(1)
    })
    .await;
    let (again, _) = ask(&gw.url, &doc, false).await;
    assert!(again > 0.99, "the tree predicts the document: {again}");
    ask(&gw.url, &text("bravo ", 1900), false).await;
    // The worker evicted the document to compute the second prompt, and
    // the tree, kept within the worker's cache, forgot it too: no hit is
    // predicted, so there is nothing for the correction to trim.
    let half: String = doc.chars().take(600).collect();
    let (predicted, _) = ask(&gw.url, &format!("{half} and now something else"), false).await;
    assert!(predicted < 0.1, "the tree forgot the document: {predicted}");
    assert!(
        tree_chars(&gw.url).await <= 512 * 4 + 64,
        "within the cache at the simulated worker's 4 characters a token"
    );
    wait_until("four reports", || async {
        worker_entry(&gw.url).await["cache"]["reports"].as_u64() == Some(4)
    })
    .await;
    assert_eq!(worker_entry(&gw.url).await["cache"]["trims"], 0);
    gw.shutdown().await;
    worker.stop.cancel();
}

/// What a scripted worker answers: the pieces of one SSE stream.
fn usage_stream(usage: &'static str) -> Vec<&'static str> {
    vec![
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
        usage,
        "data: [DONE]\n\n",
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_without_usage_changes_nothing() {
    let worker = scripted_worker(usage_stream("")).await;
    let gw = gateway_ready(config(&[&worker.url]), 1).await;
    let prompt = text("charlie ", 800);
    ask_model(&gw.url, &prompt, true, "scripted").await;
    let before = tree_chars(&gw.url).await;
    let (matched, body) = ask_model(&gw.url, &prompt, true, "scripted").await;
    assert!(matched > 0.99);
    assert_eq!(body, usage_stream("").concat());
    assert_eq!(tree_chars(&gw.url).await, before);
    let entry = worker_entry(&gw.url).await;
    assert!(entry.get("cache").is_none(), "{entry}");
    gw.shutdown().await;
    worker.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_worker_is_ignored_and_counted() {
    for lie in [
        // More cached than the whole prompt (the tree predicted nothing
        // like it either way).
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":99}}}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":-5}}}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":\"lots\"}}}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":0,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
    ] {
        let pieces = usage_stream(lie);
        let worker = scripted_worker(pieces.clone()).await;
        let gw = gateway_ready(config(&[&worker.url]), 1).await;
        let prompt = text("delta ", 1200);
        ask_model(&gw.url, &prompt, true, "scripted").await;
        let before = tree_chars(&gw.url).await;
        let (matched, body) = ask_model(&gw.url, &prompt, true, "scripted").await;
        assert!(matched > 0.99, "{lie}: {matched}");
        assert_eq!(body, pieces.concat(), "the client gets the worker's bytes");
        wait_until("two invalid reports", || async {
            worker_entry(&gw.url).await["cache"]["invalid_reports"].as_u64() == Some(2)
        })
        .await;
        let cache = worker_entry(&gw.url).await["cache"].clone();
        assert_eq!(cache["trims"], 0, "{lie}: {cache}");
        assert_eq!(cache["reports"], 0, "{lie}: {cache}");
        assert_eq!(tree_chars(&gw.url).await, before, "{lie}");
        let (matched, _) = ask_model(&gw.url, &prompt, true, "scripted").await;
        assert!(matched > 0.99, "{lie}: {matched}");
        // The upkeep tick exports the worker's figures (every 250 ms).
        wait_until("the invalid-report counter", || async {
            metrics_text(&gw.url)
                .await
                .contains("radixgate_cache_invalid_reports_total{")
        })
        .await;
        gw.shutdown().await;
        worker.stop.cancel();
    }
}
