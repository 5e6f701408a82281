//! Helpers shared by the worker integration tests: spawn a worker on
//! port 0, send JSON, read SSE.
#![allow(dead_code)]

use radixgate_sim::engine::EngineConfig;
use radixgate_sim::server::{WorkerConfig, WorkerHandle, start};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) struct Worker {
    pub(crate) handle: WorkerHandle,
    pub(crate) base: String,
    _stop: tokio_util::sync::DropGuard,
}

pub(crate) fn fast_config() -> WorkerConfig {
    // Small, fast steps so tests run quickly; the logic is the same.
    let mut c = WorkerConfig {
        engine: EngineConfig {
            kv_capacity_tokens: 100_000,
            ..EngineConfig::default()
        },
        ..WorkerConfig::default()
    };
    c.engine.timing.step_base_us = 200.0;
    c.engine.timing.token_us = 1.0;
    c
}

pub(crate) async fn spawn(config: WorkerConfig) -> Worker {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let handle = start(listener, config, stop.clone()).await.unwrap();
    let base = format!("http://{}", handle.addr());
    Worker {
        handle,
        base,
        _stop: stop.drop_guard(),
    }
}

pub(crate) fn client() -> reqwest::Client {
    client_builder().build().unwrap()
}

pub(crate) async fn post(
    base: &str,
    path: &str,
    body: Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let v = r.json().await.unwrap_or(Value::Null);
    (status, headers, v)
}

/// A worker's `/metrics` page.
pub(crate) async fn metrics_text(base: &str) -> String {
    client()
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub(crate) async fn get_json(base: &str, path: &str) -> Value {
    client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Reads an SSE body: the JSON events and whether it ended with `[DONE]`.
pub(crate) async fn sse(
    base: &str,
    path: &str,
    body: Value,
) -> Result<(Vec<Value>, bool), (Vec<Value>, String)> {
    let mut r = client()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut buf = String::new();
    let mut events = Vec::new();
    let mut done = false;
    loop {
        match r.chunk().await {
            Ok(Some(c)) => buf.push_str(std::str::from_utf8(&c).unwrap()),
            Ok(None) => break,
            Err(e) => {
                parse_events(&mut buf, &mut events, &mut done);
                return Err((events, e.to_string()));
            }
        }
        parse_events(&mut buf, &mut events, &mut done);
    }
    Ok((events, done))
}

pub(crate) fn parse_events(buf: &mut String, events: &mut Vec<Value>, done: &mut bool) {
    while let Some(end) = buf.find("\n\n") {
        let ev: String = buf.drain(..end + 2).collect();
        // Named events (Responses, Messages) have an `event:` line first;
        // their data says the type too.
        let data = ev
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .expect("data: event");
        if data == "[DONE]" {
            *done = true;
        } else {
            events.push(serde_json::from_str(data).unwrap());
        }
    }
}

pub(crate) fn long_text(seed: u32) -> String {
    (0..60)
        .map(|i| format!("sentence {seed} number {i}. "))
        .collect()
}

pub(crate) fn chat(content: &str, max_tokens: u32) -> Value {
    json!({"model": "whatever", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}], "max_tokens": max_tokens})
}

/// A client builder. reqwest is built with rustls but no bundled crypto
/// provider (the workspace uses ring), so install it first (idempotent).
pub(crate) fn client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}
