//! Test harness: real simulated workers and real gateways on loopback
//! sockets, in-process, plus a scripted worker whose every byte is known.
//!
//! Waits poll a condition with a generous deadline: the deadline only turns
//! a hang into a failure; no test asserts how fast anything is.

#![allow(dead_code, unreachable_pub)]

pub mod process;
pub mod tap;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{get, post};
use parking_lot::Mutex;
use radixgate::config::{Config, WorkerSpec};
use radixgate_sim::engine::EngineConfig;
use radixgate_sim::server::{FaultConfig, WorkerConfig, WorkerHandle, start};
use serde_json::{Value, json};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A simulated worker on a loopback port.
pub struct SimWorker {
    pub handle: WorkerHandle,
    pub url: String,
    pub stop: CancellationToken,
}

impl SimWorker {
    pub fn set_faults(&self, faults: FaultConfig) {
        self.handle.set_faults(faults).unwrap();
    }
}

/// Small, fast steps: the same logic, shorter waits.
pub fn fast_worker() -> WorkerConfig {
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

/// A quick simulated worker in a prefill/decode `role`; a prefill worker
/// serves its KV pulls on a bootstrap port of its own.
pub async fn pd_sim_worker(role: radixgate_sim::server::Role) -> SimWorker {
    let mut c = fast_worker();
    c.pd = radixgate_sim::server::PdConfig {
        role,
        bootstrap_port: (role == radixgate_sim::server::Role::Prefill).then_some(0),
        ..radixgate_sim::server::PdConfig::default()
    };
    sim_worker(c).await
}

pub async fn sim_worker(config: WorkerConfig) -> SimWorker {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    sim_worker_on(listener, config).await
}

pub async fn sim_worker_on(listener: TcpListener, config: WorkerConfig) -> SimWorker {
    let stop = CancellationToken::new();
    let handle = start(listener, config, stop.clone()).await.unwrap();
    let url = format!("http://{}", handle.addr());
    SimWorker { handle, url, stop }
}

/// Serves `app` on a free loopback port until the returned token is
/// cancelled; returns its URL and that token.
pub async fn serve_app(app: Router) -> (String, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { s.cancelled().await })
            .await
            .unwrap();
    });
    (url, stop)
}

/// A running gateway.
pub struct Gateway {
    pub url: String,
    pub stop: CancellationToken,
    pub task: JoinHandle<Result<(), radixgate::server::StartError>>,
}

impl Gateway {
    /// Stops the gateway and waits for it to finish draining.
    pub async fn shutdown(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// A config for tests: quick health probing, the given workers.
pub fn config(workers: &[&str]) -> Config {
    let mut c = Config {
        workers: workers.iter().map(|u| WorkerSpec::new(*u)).collect(),
        ..Config::default()
    };
    c.health.interval_secs = 1;
    c.health.unhealthy_backoff_initial_ms = 50;
    c.health.unhealthy_backoff_max_ms = 200;
    c.health.failure_threshold = 2;
    c.health.success_threshold = 1;
    c.retry.initial_backoff_ms = 5;
    c.retry.max_backoff_ms = 20;
    c.server.shutdown_grace_period_secs = 10;
    c
}

pub async fn gateway(config: Config) -> Gateway {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let task = tokio::spawn(radixgate::server::run(listener, config, stop.clone()));
    Gateway { url, stop, task }
}

/// A gateway in front of `workers`, once `healthy` of them are admitted;
/// one that stops first (a config it refuses) fails the test with its
/// error, not with a wait that runs out.
pub async fn gateway_ready(config: Config, healthy: usize) -> Gateway {
    let mut gw = gateway(config).await;
    let url = gw.url.clone();
    tokio::select! {
        () = wait_for_healthy(&url, healthy) => gw,
        ended = &mut gw.task => panic!("the gateway stopped before it was ready: {ended:?}"),
    }
}

pub async fn wait_for_healthy(gateway: &str, n: usize) {
    let url = format!("{gateway}/readiness");
    wait_until(&format!("{n} healthy workers"), || {
        let url = url.clone();
        async move {
            let Ok(r) = client().get(&url).send().await else {
                return false;
            };
            let body: Value = r.json().await.unwrap_or_default();
            body["healthy_workers"].as_u64() == Some(n as u64)
        }
    })
    .await;
}

/// Polls `cond` until true; panics after a generous deadline (a hang guard,
/// not a speed assertion).
pub async fn wait_until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub fn chat(text: &str, stream: bool) -> Value {
    json!({
        "model": radixgate_sim::server::DEFAULT_MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// Sends `body` to the gateway's `/v1/chat/completions`.
pub async fn post_chat(gw: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{gw}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The JSON a GET of `path` answers.
pub async fn get_json(gateway: &str, path: &str) -> Value {
    client()
        .get(format!("{gateway}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The entries `/workers` lists.
pub async fn workers(gateway: &str) -> Vec<Value> {
    let list = get_json(gateway, "/workers").await;
    list["workers"].as_array().unwrap().clone()
}

/// `DELETE /workers?url=URL` on the gateway's admin API: its JSON answer.
pub async fn remove_worker(gateway: &str, url: &str) -> Value {
    client()
        .delete(format!("{gateway}/workers?url={url}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The model ids `/v1/models` lists.
pub async fn model_ids(gateway: &str) -> Vec<String> {
    let list = get_json(gateway, "/v1/models").await;
    list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| Some(m["id"].as_str()?.to_owned()))
        .collect()
}

/// The characters the router records `worker` holding (`/get_loads`).
pub async fn recorded_chars(gateway: &str, worker: &str) -> u64 {
    let loads = get_loads(gateway).await;
    let found = loads["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == worker)
        .cloned();
    found
        .and_then(|w| w["cached_chars"].as_u64())
        .unwrap_or_else(|| panic!("{worker} not in {loads}"))
}

/// The gateway's `/get_loads` answer.
pub async fn get_loads(gateway: &str) -> Value {
    client()
        .get(format!("{gateway}/get_loads"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The value of one exported series, named with its labels as rendered
/// (`name{label="v"}`); 0 when absent.
pub async fn series_value(gateway: &str, series: &str) -> f64 {
    metrics_text(gateway)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// The sum of a series over all its label sets at `url`'s `/metrics` (a
/// gateway's, or a simulated worker's, whose series carry its name); 0
/// when absent.
pub async fn series_sum(url: &str, name: &str) -> f64 {
    metrics_text(url)
        .await
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The worker that served an answer and the gateway's decision header
/// (each empty when absent, as on a worker's own answer); reads the body
/// to its end.
pub async fn served_by(r: reqwest::Response) -> (String, String) {
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let out = (header("x-radixgate-worker"), header("x-radixgate-decision"));
    r.bytes().await.unwrap();
    out
}

/// Sum of in-flight load over the gateway's workers.
pub async fn total_load(gateway: &str) -> u64 {
    get_loads(gateway).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["load"].as_u64().unwrap())
        .sum()
}

/// `/get_loads`'s entry for one worker.
pub async fn worker_loads(gateway: &str, worker: &str) -> Value {
    let loads = get_loads(gateway).await;
    loads["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == worker)
        .unwrap_or_else(|| panic!("{worker} in {loads}"))
        .clone()
}

pub async fn wait_for_zero_load(gateway: &str) {
    wait_until("all loads back to zero", || async {
        total_load(gateway).await == 0
    })
    .await;
}

/// A worker that records every request body it receives and answers with
/// fixed bytes, streamed in the given pieces, so byte-exact passthrough
/// can be checked.
pub struct ScriptedWorker {
    pub url: String,
    pub received: Arc<Mutex<Vec<Bytes>>>,
    pub stop: CancellationToken,
}

#[derive(Clone)]
struct Script {
    pieces: Arc<Vec<&'static str>>,
    received: Arc<Mutex<Vec<Bytes>>>,
    ending: Ending,
}

pub async fn scripted_worker(pieces: Vec<&'static str>) -> ScriptedWorker {
    scripted(pieces, Ending::Finish).await
}

/// A scripted worker that sends its pieces, then goes silent with the
/// connection open.
pub async fn stalling_worker(pieces: Vec<&'static str>) -> ScriptedWorker {
    scripted(pieces, Ending::Stall).await
}

/// How a scripted worker's response ends after its pieces.
#[derive(Clone, Copy, PartialEq)]
enum Ending {
    Finish,
    Die,
    Stall,
}

async fn scripted(pieces: Vec<&'static str>, ending: Ending) -> ScriptedWorker {
    let received = Arc::new(Mutex::new(Vec::new()));
    let script = Script {
        pieces: Arc::new(pieces),
        received: received.clone(),
        ending,
    };
    async fn answer(State(s): State<Script>, body: Bytes) -> axum::response::Response {
        s.received.lock().push(body);
        let pieces = s.pieces.clone();
        let n = pieces.len();
        let ending = s.ending;
        let extra = usize::from(ending != Ending::Finish);
        let items = (0..n + extra).map(move |i| {
            if i < n {
                Ok(Bytes::from_static(pieces[i].as_bytes()))
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "worker died",
                ))
            }
        });
        let stream = futures::stream::iter(items).then(move |item| async move {
            // Separate writes, so the pieces arrive as separate chunks.
            tokio::time::sleep(Duration::from_millis(2)).await;
            if item.is_err() && ending == Ending::Stall {
                std::future::pending::<()>().await;
            }
            item
        });
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(stream))
            .unwrap()
    }
    let app = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "scripted"}]})) }),
        )
        .route("/v1/chat/completions", post(answer))
        .route("/v1/completions", post(answer))
        .route("/generate", post(answer))
        .route("/v1/embeddings", post(answer))
        .route("/v1/responses", post(answer))
        .route("/v1/messages", post(answer))
        .with_state(script);
    let (url, stop) = serve_app(app).await;
    ScriptedWorker {
        url,
        received,
        stop,
    }
}

use futures::StreamExt as _;

/// A scripted worker whose stream breaks off (the connection is cut) after
/// the given pieces, without finishing the response.
pub async fn dying_worker(pieces: Vec<&'static str>) -> ScriptedWorker {
    scripted(pieces, Ending::Die).await
}

/// The gateway's `/metrics` text.
pub async fn metrics_text(gateway: &str) -> String {
    client()
        .get(format!("{gateway}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Sends `n` chat requests (alternately whole and streamed) and checks that
/// each one succeeds on `worker`.
pub async fn assert_all_served_by(gateway: &str, worker: &str, n: usize, tag: &str) {
    let c = client();
    for i in 0..n {
        let r = c
            .post(format!("{gateway}/v1/chat/completions"))
            .json(&chat(&format!("{tag} {i}"), i % 2 == 1))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{tag} {i}");
        assert_eq!(r.headers()["x-radixgate-worker"], worker, "{tag} {i}");
        r.bytes().await.unwrap();
    }
}

/// Reads one HTTP/1.1 message (a request or a response) off a raw
/// connection: its head up to the blank line, and a body of the head's
/// `Content-Length` (none without one). `buf` carries bytes read past the
/// message to the next call. `None` when the connection ends first.
pub async fn read_http_message(
    stream: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt as _;
    let mut more = async |buf: &mut Vec<u8>| {
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    };
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if !more(buf).await {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        if !more(buf).await {
            return None;
        }
    }
    let body = buf[head_end..head_end + length].to_vec();
    buf.drain(..head_end + length);
    Some((head, body))
}
