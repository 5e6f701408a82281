//! Prefill/decode pairs of simulated workers over real loopback HTTP, in
//! both engines' protocols (SGLang's bootstrap rooms, vLLM's two steps):
//! the decode worker pulls the prompt's KV from the prefill worker and
//! reports the whole prompt cached; transfers that never arrive, prefill
//! workers that die, and clients that leave. No test asserts a bound on
//! time; ordering only.

mod common;

use std::time::Duration;

use common::*;
use radixgate_sim::server::{FaultConfig, Role, WorkerConfig};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

fn role_config(role: Role) -> WorkerConfig {
    let mut c = fast_config();
    c.pd.role = role;
    if role == Role::Prefill {
        c.pd.bootstrap_port = Some(0);
    }
    c
}

/// A prefill and a decode worker; the bootstrap port of the prefill.
async fn pair(prefill: WorkerConfig, decode: WorkerConfig) -> (Worker, Worker, u16) {
    let p = spawn(prefill).await;
    let d = spawn(decode).await;
    let port = p
        .handle
        .bootstrap_addr()
        .expect("a bootstrap listener")
        .port();
    assert_ne!(port, p.handle.addr().port(), "a listener of its own");
    (p, d, port)
}

/// A counter of `/metrics` (summed over label sets).
async fn metric(base: &str, name: &str) -> f64 {
    let text = metrics_text(base).await;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// `body` with SGLang's bootstrap fields for `room` on the prefill's port.
fn with_room(mut body: Value, port: u16, room: u64) -> Value {
    body["bootstrap_host"] = json!("127.0.0.1");
    body["bootstrap_port"] = json!(port);
    body["bootstrap_room"] = json!(room);
    body
}

/// (prompt, cached, completion) tokens of a whole answer of any route.
fn usage(v: &Value) -> (u64, u64, u64) {
    if let Some(m) = v.get("meta_info") {
        return (
            m["prompt_tokens"].as_u64().unwrap(),
            m["cached_tokens"].as_u64().unwrap(),
            m["completion_tokens"].as_u64().unwrap(),
        );
    }
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    )
}

/// The usage a stream reports: its usage chunk (OpenAI), or the last
/// event's `meta_info` (SGLang).
fn stream_usage(events: &[Value]) -> (u64, u64, u64) {
    let last = events
        .iter()
        .rev()
        .find(|e| e.get("meta_info").is_some() || e["usage"].is_object())
        .expect("usage in the stream");
    usage(last)
}

/// A request per route, each with its own prompt (its route first, so that
/// no two share a prefix).
fn bodies(max_tokens: u64, seed: u32) -> Vec<(&'static str, Value)> {
    let text = |route: &str| format!("{route} {}", long_text(seed));
    vec![
        (
            "/generate",
            json!({"text": text("generate"), "sampling_params": {"max_new_tokens": max_tokens}}),
        ),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": text("completions"), "max_tokens": max_tokens}),
        ),
        (
            "/v1/chat/completions",
            chat(&text("chat"), max_tokens as u32),
        ),
    ]
}

fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    if body.get("messages").is_some() || body.get("prompt").is_some() {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

#[tokio::test]
async fn sglang_pair_decodes_with_the_prompt_cached_whole_and_streamed() {
    let (p, d, port) = pair(role_config(Role::Prefill), role_config(Role::Decode)).await;
    let mut room = 1_000;
    for stream in [false, true] {
        for (path, body) in bodies(6, room as u32) {
            room += 1;
            let body = with_room(body, port, room);
            let body = if stream { streamed(body) } else { body };
            // Sent to both at once, as the router does.
            let (prefilled, decoded) = if stream {
                let (a, b) =
                    tokio::join!(sse(&p.base, path, body.clone()), sse(&d.base, path, body));
                let (pe, pdone) = a.unwrap();
                let (de, ddone) = b.unwrap();
                assert!(pdone && ddone, "{path}: both streams end with [DONE]");
                (stream_usage(&pe), stream_usage(&de))
            } else {
                let (a, b) =
                    tokio::join!(post(&p.base, path, body.clone()), post(&d.base, path, body));
                assert_eq!((a.0, b.0), (200, 200), "{path}: {} {}", a.2, b.2);
                (usage(&a.2), usage(&b.2))
            };
            assert!(
                prefilled.2 <= 1,
                "{path}: prefill generates at most one token"
            );
            assert!(
                prefilled.1 < prefilled.0 / 2,
                "{path}: the prefill computed the prompt: {prefilled:?}"
            );
            let (prompt, cached, completion) = decoded;
            assert!(prompt > 300, "{path}: {prompt}");
            assert_eq!(
                cached, prompt,
                "{path} (stream {stream}): the whole prompt arrived"
            );
            assert_eq!(completion, 6, "{path}");
        }
    }
    assert_eq!(
        metric(&d.base, "radixgate_sim_kv_transfers_total").await,
        6.0
    );
    assert_eq!(
        metric(&p.base, "radixgate_sim_kv_pulls_served_total").await,
        6.0
    );
    // The decode worker now holds the prompts' pages: the same prompt sent
    // to it alone (the prefill-skip path) hits them.
    let (path, body) = bodies(2, 1_000).remove(0);
    let (_, _, v) = post(&d.base, path, body).await;
    let (prompt, cached, _) = usage(&v);
    assert!(cached > prompt - 16, "{cached} of {prompt}");
}

#[tokio::test]
async fn vllm_two_steps_decode_with_the_prompt_cached_whole_and_streamed() {
    let (p, d, _) = pair(role_config(Role::Prefill), role_config(Role::Decode)).await;
    for stream in [false, true] {
        for (path, client_body) in bodies(5, 40 + u32::from(stream)).into_iter().skip(1) {
            // Step one: the router's prefill request.
            let mut step1 = client_body.clone();
            step1["stream"] = json!(false);
            step1["max_tokens"] = json!(1);
            step1["kv_transfer_params"] = json!({"do_remote_decode": true, "do_remote_prefill": false,
                "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null});
            let (status, _, v) = post(&p.base, path, step1).await;
            assert_eq!(status, 200, "{v}");
            let params = v["kv_transfer_params"].clone();
            assert_eq!(params["do_remote_prefill"], true, "{v}");
            assert_eq!(params["do_remote_decode"], false);
            assert_eq!(params["remote_host"], "127.0.0.1");
            assert_eq!(
                params["remote_port"],
                p.handle.bootstrap_addr().unwrap().port()
            );
            assert_eq!(params["remote_engine_id"], p.handle.name());
            assert_eq!(params["tp_size"], 1);
            assert!(params["remote_request_id"].is_string());
            assert!(!params["remote_block_ids"].as_array().unwrap().is_empty());
            // Step two: the client's body with prefill's params.
            let mut step2 = client_body.clone();
            step2["kv_transfer_params"] = params;
            let (prompt, cached, completion) = if stream {
                let (events, done) = sse(&d.base, path, streamed(step2)).await.unwrap();
                assert!(done);
                stream_usage(&events)
            } else {
                let (status, _, v) = post(&d.base, path, step2).await;
                assert_eq!(status, 200, "{v}");
                assert!(v.get("kv_transfer_params").is_none());
                usage(&v)
            };
            assert!(prompt > 300);
            assert_eq!(cached, prompt, "{path} (stream {stream})");
            assert_eq!(completion, 5);
        }
    }
    assert_eq!(
        metric(&d.base, "radixgate_sim_kv_transfers_total").await,
        4.0
    );
}

/// Runs both vLLM steps for `text`; returns the decode step's wall time.
async fn vllm_round(p: &Worker, d: &Worker, text: &str) -> Duration {
    let body = json!({"model": "m", "prompt": text, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": true}});
    let (status, _, v) = post(&p.base, "/v1/completions", body).await;
    assert_eq!(status, 200, "{v}");
    let step2 = json!({"model": "m", "prompt": text, "max_tokens": 2,
        "kv_transfer_params": v["kv_transfer_params"]});
    let c = client();
    let t = Instant::now();
    let r = c
        .post(format!("{}/v1/completions", d.base))
        .json(&step2)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await.unwrap();
    t.elapsed()
}

#[tokio::test]
async fn transfer_time_grows_with_the_tokens_moved() {
    let mut dc = role_config(Role::Decode);
    // One millisecond per token, so the transfer dominates the decode.
    dc.pd.transfer_bandwidth = dc.pd.kv_bytes_per_token as f64 * 1000.0;
    let (p, d, _) = pair(role_config(Role::Prefill), dc).await;
    let seconds = "radixgate_sim_kv_transfer_seconds_total";
    let tokens = "radixgate_sim_kv_transfer_tokens_total";
    let short = vllm_round(&p, &d, "a short prompt of some twenty tokens, or so it is").await;
    let (s_secs, s_tokens) = (
        metric(&d.base, seconds).await,
        metric(&d.base, tokens).await,
    );
    let long = vllm_round(&p, &d, &long_text(7)).await;
    let l_secs = metric(&d.base, seconds).await - s_secs;
    let l_tokens = metric(&d.base, tokens).await - s_tokens;
    assert!(l_tokens > 10.0 * s_tokens, "{s_tokens} then {l_tokens}");
    assert!(
        l_secs > 10.0 * s_secs,
        "transfer {s_secs} s then {l_secs} s"
    );
    assert!(long > short, "decode took {short:?} then {long:?}");
}

#[tokio::test]
async fn a_transfer_that_never_arrives_fails_decode_naming_the_room() {
    let mut pc = role_config(Role::Prefill);
    pc.faults = FaultConfig {
        drop_transfers: 1.0,
        ..FaultConfig::default()
    };
    let mut dc = role_config(Role::Decode);
    dc.pd.transfer_timeout_ms = 300;
    let (p, d, port) = pair(pc, dc).await;
    let body = with_room(
        json!({"model": "m", "prompt": long_text(3), "max_tokens": 4}),
        port,
        77,
    );
    let (a, b) = tokio::join!(
        post(&p.base, "/v1/completions", body.clone()),
        post(&d.base, "/v1/completions", body)
    );
    assert_eq!(a.0, 200, "the prefill itself answers");
    assert_eq!(b.0, 504, "{}", b.2);
    let e = &b.2["error"];
    assert_eq!(e["code"], "kv_transfer_timeout");
    assert_eq!(e["type"], "server_error");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("room 77") && msg.contains("300 ms"), "{msg}");
    // Streamed: the stream has started, so the error is an event in it.
    let body = streamed(with_room(
        json!({"model": "m", "prompt": long_text(4), "max_tokens": 4}),
        port,
        78,
    ));
    let (a, b) = tokio::join!(
        sse(&p.base, "/v1/completions", body.clone()),
        sse(&d.base, "/v1/completions", body)
    );
    assert!(a.unwrap().1);
    let (events, done) = b.unwrap();
    assert!(!done, "no [DONE] after an error");
    let msg = events[0]["error"]["message"].as_str().unwrap();
    assert!(msg.contains("room 78"), "{msg}");
    assert_eq!(events[0]["error"]["code"], "kv_transfer_timeout");
    assert_eq!(
        metric(&p.base, "radixgate_sim_kv_transfers_dropped_total").await,
        2.0
    );
    assert_eq!(
        metric(&d.base, "radixgate_sim_kv_transfer_errors_total").await,
        2.0
    );
}

#[tokio::test]
async fn a_prefill_that_dies_fails_the_pull() {
    let p = spawn(role_config(Role::Prefill)).await;
    let d = spawn(role_config(Role::Decode)).await;
    let port = p.handle.bootstrap_addr().unwrap().port();
    // The decode waits on a room the prefill never got; then the prefill
    // worker stops (its listeners and connections close).
    let body = with_room(json!({"text": long_text(5)}), port, 91);
    let decode = tokio::spawn({
        let base = d.base.clone();
        async move { post(&base, "/generate", body).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(p);
    let (status, _, v) = decode.await.unwrap();
    assert_eq!(status, 502, "{v}");
    assert_eq!(v["error"]["code"], "kv_transfer_failed");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("room 91"), "{msg}");
    // Nothing listens there any more: refused at once, same error.
    let body = with_room(json!({"text": "again"}), port, 92);
    let (status, _, v) = post(&d.base, "/generate", body).await;
    assert_eq!(status, 502, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("room 92"));
}

/// Polls a `/metrics` series until it reaches `want` (the worker notices a
/// client leave asynchronously).
async fn wait_for(base: &str, name: &str, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = metric(base, name).await;
        if v == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name} stayed {v}, want {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `body` to `path` on a connection of its own, returned so that the
/// test can close it: a client that leaves (a pooled client keeps an idle
/// connection open after dropping a response that sent no bytes yet).
async fn raw_post(w: &Worker, path: &str, body: &Value) -> TcpStream {
    let addr = w.handle.addr();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let b = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        b.len()
    );
    c.write_all(head.as_bytes()).await.unwrap();
    c.write_all(b.as_bytes()).await.unwrap();
    c
}

#[tokio::test]
async fn clients_that_leave_are_counted_as_cancelled_on_both_sides() {
    let mut pc = role_config(Role::Prefill);
    // A slow prefill in chunks (so its load shows it running between
    // steps): still computing when its client leaves.
    pc.engine.timing.token_us = 2_000.0;
    pc.engine.max_batch_tokens = 256;
    let (p, d, port) = pair(pc, role_config(Role::Decode)).await;
    let cancelled = "radixgate_sim_cancelled_total";
    let waiting = "radixgate_sim_kv_transfers_waiting";
    // Decode requests waiting on a pull (rooms the prefill never gets),
    // streamed and whole: their clients leave.
    for (i, stream) in [false, true].into_iter().enumerate() {
        let mut body = with_room(json!({"text": long_text(8)}), port, 501 + i as u64);
        body["stream"] = json!(stream);
        let c = raw_post(&d, "/generate", &body).await;
        wait_for(&d.base, waiting, 1.0).await;
        drop(c);
        wait_for(&d.base, cancelled, i as f64 + 1.0).await;
        wait_for(&d.base, waiting, 0.0).await;
    }
    assert_eq!(
        metric(&d.base, "radixgate_sim_kv_transfer_errors_total").await,
        0.0
    );
    // A prefill computing for a room: its client leaves; the room fails,
    // and a pull of it says so.
    let text = format!("{}{}", long_text(10), long_text(11));
    let body = with_room(json!({"text": text}), port, 503);
    let c = raw_post(&p, "/generate", &body).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while get_json(&p.base, "/get_load").await["running"] != 1 {
        assert!(Instant::now() < deadline, "the prefill never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(c);
    wait_for(&p.base, cancelled, 1.0).await;
    let (status, _, v) = post(&d.base, "/generate", body).await;
    assert_eq!(status, 502, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("room 503") && msg.contains("cancelled"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_generate_batch_moves_one_room_per_prompt() {
    let (p, d, port) = pair(role_config(Role::Prefill), role_config(Role::Decode)).await;
    for (stream, rooms) in [(false, [11, 12]), (true, [13, 14])] {
        let texts = [long_text(20 + rooms[0]), format!("{} other", long_text(30))];
        let mut body = json!({"text": texts, "sampling_params": {"max_new_tokens": 3},
            "bootstrap_host": ["127.0.0.1", "127.0.0.1"], "bootstrap_port": [port, port],
            "bootstrap_room": rooms});
        body["stream"] = json!(stream);
        if stream {
            let (a, b) = tokio::join!(
                sse(&p.base, "/generate", body.clone()),
                sse(&d.base, "/generate", body)
            );
            assert!(a.unwrap().1);
            let (events, done) = b.unwrap();
            assert!(done, "one [DONE] after every item");
            for i in 0..2 {
                let last = events
                    .iter()
                    .rfind(|e| e["index"] == i)
                    .unwrap_or_else(|| panic!("item {i} in {events:?}"));
                let m = &last["meta_info"];
                assert_eq!(m["cached_tokens"], m["prompt_tokens"], "item {i}");
                assert_eq!(m["completion_tokens"], 3);
            }
        } else {
            let (a, b) = tokio::join!(
                post(&p.base, "/generate", body.clone()),
                post(&d.base, "/generate", body)
            );
            assert_eq!(a.0, 200, "{}", a.2);
            assert_eq!(b.0, 200, "{}", b.2);
            let items = b.2.as_array().expect("a batch answers a list");
            assert_eq!(items.len(), 2);
            assert_eq!(a.2.as_array().unwrap().len(), 2);
            for it in items {
                let (prompt, cached, completion) = usage(it);
                assert_eq!((cached, completion), (prompt, 3));
            }
            assert_ne!(
                items[0]["meta_info"]["prompt_tokens"],
                items[1]["meta_info"]["prompt_tokens"]
            );
        }
    }
    assert_eq!(
        metric(&d.base, "radixgate_sim_kv_transfers_total").await,
        4.0
    );
}

#[tokio::test]
async fn decode_without_bootstrap_fields_is_a_regular_worker() {
    let d = spawn(role_config(Role::Decode)).await;
    let body = json!({"model": "m", "prompt": long_text(60), "max_tokens": 3});
    let (status, _, v) = post(&d.base, "/v1/completions", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    let (prompt, cached, completion) = usage(&v);
    assert_eq!((cached, completion), (0, 3), "computed locally: {prompt}");
    let (_, _, v) = post(&d.base, "/v1/completions", body).await;
    let (prompt, cached, _) = usage(&v);
    assert!(
        cached > 0 && cached < prompt,
        "its own prefix cache: {cached}"
    );
    assert_eq!(
        metric(&d.base, "radixgate_sim_kv_transfers_total").await,
        0.0
    );
    // A null bootstrap port without a default is the client's error.
    let body = json!({"text": "x", "bootstrap_host": "127.0.0.1", "bootstrap_port": null,
        "bootstrap_room": 5});
    let (status, _, v) = post(&d.base, "/generate", body).await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "bootstrap_port");
}
