//! Reloading the configuration while serving (issue 11, item 7): through
//! the library's `Reload` handle, and through a real `SIGHUP` to the
//! binary. A reload reconciles the worker list, swaps keys, rebuilds the
//! policy only when the routing section changed, never cuts a stream in
//! flight, and leaves everything as it was when the new file is bad.

mod common;

use axum::body::{Body, Bytes};
use common::{client, fast_worker, sim_worker, wait_until};
use radixgate::config::ServeArgs;
use radixgate::reload::{self, Reload};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A config file: quick probes, these workers, this client key and
/// cache threshold.
fn yaml(workers: &[&str], api_key: &str, cache_threshold: f64) -> String {
    let workers: String = workers.iter().map(|w| format!("  - {w}\n")).collect();
    format!(
        "server:\n  api_key: {api_key}\n  shutdown_grace_period_secs: 10\n\
         health:\n  interval_secs: 1\n  failure_threshold: 2\n  success_threshold: 1\n  \
         unhealthy_backoff_initial_ms: 50\n  unhealthy_backoff_max_ms: 200\n\
         routing:\n  cache_threshold: {cache_threshold}\n\
         workers:\n{workers}"
    )
}

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("radixgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A worker whose streamed answer sends one event, then waits for `gate`
/// before finishing: a stream that is reliably in flight.
async fn gated_worker(gate: Arc<Notify>) -> (String, CancellationToken) {
    use axum::routing::{get, post};
    let answer = move || {
        let gate = gate.clone();
        async move {
            let first = futures::stream::once(async {
                Ok::<_, std::io::Error>(Bytes::from_static(
                    b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
                ))
            });
            let rest = futures::stream::once(async move {
                gate.notified().await;
                Ok(Bytes::from_static(b"data: [DONE]\n\n"))
            });
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(futures::StreamExt::chain(first, rest)))
                .unwrap()
        }
    };
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "gated"}]})) }),
        )
        .route("/v1/chat/completions", post(answer));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { s.cancelled().await })
            .await;
    });
    (url, stop)
}

/// `GET path` with a bearer key; (status, JSON body).
async fn get(gateway: &str, path: &str, key: &str) -> (u16, Value) {
    let r = client()
        .get(format!("{gateway}{path}"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or_default())
}

/// The URLs `/workers` lists.
async fn worker_urls(gateway: &str, key: &str) -> Vec<String> {
    let (status, body) = get(gateway, "/workers", key).await;
    assert_eq!(status, 200, "{body}");
    let mut urls: Vec<String> = body["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["url"].as_str().unwrap().to_owned())
        .collect();
    urls.sort();
    urls
}

/// Characters the policy's trees attribute to the worker at `url`.
async fn cached_chars(gateway: &str, key: &str, url: &str) -> u64 {
    let (_, loads) = get(gateway, "/get_loads", key).await;
    loads["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == url)
        .and_then(|w| w["cached_chars"].as_u64())
        .unwrap_or(0)
}

async fn healthy(gateway: &str, url: &str, key: &str) {
    wait_until(&format!("{url} healthy"), || async {
        let (_, body) = get(gateway, "/workers", key).await;
        body["workers"].as_array().is_some_and(|ws| {
            ws.iter()
                .any(|w| w["url"] == url && w["state"] == "healthy")
        })
    })
    .await;
}

async fn chat_status(gateway: &str, key: &str, text: &str) -> u16 {
    client()
        .post(format!("{gateway}/v1/chat/completions"))
        .bearer_auth(key)
        .json(&common::chat(text, false))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// A gateway serving the config file at `path`, and its reload handle.
async fn reloadable_gateway(path: &Path) -> (String, Reload, CancellationToken) {
    let args = ServeArgs {
        config: Some(path.to_owned()),
        ..ServeArgs::default()
    };
    let config = args.load().unwrap();
    let (reload, reloads) = reload::channel(Box::new(move || args.load()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(radixgate::server::run_reloadable(
        listener,
        config,
        reloads,
        stop.clone(),
        CancellationToken::new(),
    ));
    (url, reload, stop)
}

/// Reloads applied and refused, and whether the last one was applied, from
/// the gateway's `/metrics`.
async fn reload_metrics(gateway: &str) -> (f64, f64, f64) {
    let text = common::metrics_text(gateway).await;
    let value = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (
        value("radixgate_config_reloads_total{result=\"applied\"}"),
        value("radixgate_config_reloads_total{result=\"refused\"}"),
        value("radixgate_config_last_reload_successful "),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reconciles_workers_swaps_keys_and_keeps_trees_unless_routing_changed() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let path = temp_file("in-process.yaml");
    std::fs::write(&path, yaml(&[&a.url], "k1", 0.3)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &a.url, "k1").await;
    assert_eq!(
        chat_status(&gw, "k1", "remember this prefix please").await,
        200
    );
    assert!(cached_chars(&gw, "k1", &a.url).await > 0);

    // New key, one more worker, routing unchanged: the trees stay.
    std::fs::write(&path, yaml(&[&a.url, &b.url], "k2", 0.3)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.workers_added, std::slice::from_ref(&b.url));
    assert!(changes.workers_removed.is_empty());
    assert!(!changes.routing);
    assert_eq!(changes.keys, ["server.api_key"]);
    assert!(changes.needs_restart.is_empty(), "{changes:?}");
    assert_eq!(chat_status(&gw, "k1", "old key").await, 401);
    let mut both = vec![a.url.clone(), b.url.clone()];
    both.sort();
    assert_eq!(worker_urls(&gw, "k2").await, both);
    assert!(cached_chars(&gw, "k2", &a.url).await > 0, "trees kept");
    assert_eq!(reload_metrics(&gw).await, (1.0, 0.0, 1.0));

    // A bad file changes nothing.
    std::fs::write(&path, yaml(&[&b.url], "k3", 1.5)).unwrap();
    let err = reload.reload().await.unwrap_err().to_string();
    assert!(err.contains("cache_threshold"), "{err}");
    assert_eq!(worker_urls(&gw, "k2").await, both);
    assert_eq!(chat_status(&gw, "k3", "not yet").await, 401);
    std::fs::write(&path, "server:\n  prot: 1\n").unwrap();
    let err = reload.reload().await.unwrap_err().to_string();
    assert!(err.contains("prot"), "{err}");
    assert_eq!(worker_urls(&gw, "k2").await, both);
    assert_eq!(reload_metrics(&gw).await, (1.0, 2.0, 0.0));

    // A routing change rebuilds the policy; a removed worker goes.
    std::fs::write(&path, yaml(&[&b.url], "k2", 0.5)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert!(changes.routing);
    assert_eq!(changes.workers_removed, std::slice::from_ref(&a.url));
    assert!(changes.keys.is_empty());
    assert_eq!(worker_urls(&gw, "k2").await, std::slice::from_ref(&b.url));
    healthy(&gw, &b.url, "k2").await;
    assert_eq!(
        chat_status(&gw, "k2", "served by the new policy").await,
        200
    );
    assert!(cached_chars(&gw, "k2", &b.url).await > 0);
    assert_eq!(reload_metrics(&gw).await, (2.0, 2.0, 1.0));

    // A setting that needs a restart is reported, not applied.
    let mut text = yaml(&[&b.url], "k2", 0.5);
    text = text.replace(
        "shutdown_grace_period_secs: 10",
        "shutdown_grace_period_secs: 11",
    );
    std::fs::write(&path, text).unwrap();
    let restart_needed = || async {
        common::metrics_text(&gw)
            .await
            .lines()
            .find_map(|l| l.strip_prefix("radixgate_config_restart_needed "))
            .map(str::to_owned)
    };
    assert_eq!(restart_needed().await.as_deref(), Some("0"));
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.needs_restart, ["server.shutdown_grace_period_secs"]);
    assert_eq!(restart_needed().await.as_deref(), Some("1"));
    // Back as it runs: nothing is pending any more.
    std::fs::write(&path, yaml(&[&b.url], "k2", 0.5)).unwrap();
    assert!(reload.reload().await.unwrap().needs_restart.is_empty());
    assert_eq!(restart_needed().await.as_deref(), Some("0"));
    stop.cancel();
}

/// A worker that takes only `Bearer <key>`, `key` being switchable, on
/// every route, health included; it records the keys its chats came with.
async fn keyed_worker(
    key: Arc<parking_lot::Mutex<String>>,
) -> (String, Arc<parking_lot::Mutex<Vec<String>>>) {
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let allowed = {
        let key = key.clone();
        move |headers: &HeaderMap| {
            let sent = headers.get("authorization").and_then(|v| v.to_str().ok());
            sent == Some(format!("Bearer {}", key.lock()).as_str())
        }
    };
    let health = {
        let allowed = allowed.clone();
        move |headers: HeaderMap| async move {
            if allowed(&headers) {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        }
    };
    let models = {
        let allowed = allowed.clone();
        move |headers: HeaderMap| async move {
            if !allowed(&headers) {
                return StatusCode::UNAUTHORIZED.into_response();
            }
            axum::Json(json!({"data": [{"id": radixgate_sim::server::DEFAULT_MODEL}]}))
                .into_response()
        }
    };
    let chat = {
        let seen = seen.clone();
        move |headers: HeaderMap| async move {
            let sent = headers.get("authorization").and_then(|v| v.to_str().ok());
            seen.lock().push(sent.unwrap_or_default().to_owned());
            if !allowed(&headers) {
                return StatusCode::UNAUTHORIZED.into_response();
            }
            axum::Json(json!({
                "choices": [{"message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }))
            .into_response()
        }
    };
    let app = axum::Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

/// A reload that rotates the key of every worker (one key, shared) keeps
/// each worker, in rotation with its tree and its id: the next request
/// goes out with the new key at once. It used to remove and re-add every
/// worker, which emptied the pool until their probes passed again and
/// forgot their trees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_rotates_the_workers_key_keeps_them_in_rotation() {
    let key = Arc::new(parking_lot::Mutex::new("w1".to_owned()));
    let (a, seen) = keyed_worker(key.clone()).await;
    let entry = |k: &str| format!("{{url: \"{a}\", api_key: {k}}}");
    let path = temp_file("rekey.yaml");
    std::fs::write(&path, yaml(&[&entry("w1")], "k1", 0.3)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &a, "k1").await;
    assert_eq!(
        chat_status(&gw, "k1", "remember this prefix please").await,
        200
    );
    let cached = cached_chars(&gw, "k1", &a).await;
    assert!(cached > 0);
    let id = |body: Value| body["workers"][0]["id"].clone();
    let before = id(get(&gw, "/workers", "k1").await.1);

    *key.lock() = "w2".to_owned();
    std::fs::write(&path, yaml(&[&entry("w2")], "k1", 0.3)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.workers_rekeyed, std::slice::from_ref(&a));
    assert!(changes.workers_added.is_empty(), "{changes:?}");
    assert!(changes.workers_removed.is_empty(), "{changes:?}");
    assert_eq!(
        chat_status(&gw, "k1", "remember this prefix please").await,
        200
    );
    assert_eq!(seen.lock().last().unwrap(), "Bearer w2");
    let (_, workers) = get(&gw, "/workers", "k1").await;
    assert_eq!(workers["workers"][0]["state"], "healthy", "{workers}");
    assert_eq!(id(workers), before);
    assert!(cached_chars(&gw, "k1", &a).await >= cached, "tree kept");
    // The health checker sends the new key too: the worker stays healthy
    // over several probes.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    healthy(&gw, &a, "k1").await;
    stop.cancel();
}

/// A tenants' key file that vanished is named as what it is, and the
/// running tenants stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_key_file_vanished_names_it_and_keeps_the_tenants() {
    let a = sim_worker(fast_worker()).await;
    let (path, keys) = (temp_file("with-keys.yaml"), temp_file("keys.yaml"));
    std::fs::write(&keys, "- {name: team-a, key: sk-a}\n").unwrap();
    let text = yaml(&[&a.url], "k", 0.3);
    let text = format!("{text}tenants:\n  api_key_file: {}\n", keys.display());
    std::fs::write(&path, text).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &a.url, "k").await;
    std::fs::remove_file(&keys).unwrap();
    let err = reload.reload().await.unwrap_err().to_string();
    assert!(
        err.contains("API key file") && err.contains("keys.yaml"),
        "{err}"
    );
    assert!(!err.contains("config file"), "{err}");
    assert_eq!(chat_status(&gw, "sk-a", "still a tenant").await, 200);
    stop.cancel();
}

/// A file read while it is being rewritten in place (truncated, then
/// written) may be empty, or hold only its opening comment so far: that is
/// not the default config, which would drop every worker and open the
/// client API to anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_of_a_file_truncated_to_nothing_changes_nothing() {
    let a = sim_worker(fast_worker()).await;
    let path = temp_file("truncated.yaml");
    std::fs::write(&path, yaml(&[&a.url], "k", 0.3)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &a.url, "k").await;
    for empty in ["", "\n  \n", "# radixgate config\n", "---\n"] {
        std::fs::write(&path, empty).unwrap();
        let err = reload.reload().await.unwrap_err().to_string();
        assert!(
            err.contains("empty") && err.contains("truncated.yaml"),
            "{err}"
        );
        assert_eq!(worker_urls(&gw, "k").await, std::slice::from_ref(&a.url));
        assert_eq!(chat_status(&gw, "", "no key").await, 401);
        assert_eq!(chat_status(&gw, "k", "the key").await, 200);
    }
    // The defaults, asked for: they would open the client API, refused
    // so; with its key kept, applied.
    std::fs::write(&path, "{}\n").unwrap();
    let err = reload.reload().await.unwrap_err().to_string();
    assert!(err.contains("open the client API"), "{err}");
    std::fs::write(&path, "server:\n  api_key: k\n").unwrap();
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.workers_removed, std::slice::from_ref(&a.url));
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_removes_a_streaming_worker_does_not_cut_its_stream() {
    let gate = Arc::new(Notify::new());
    let (gated, _stop_gated) = gated_worker(gate.clone()).await;
    let other = sim_worker(fast_worker()).await;
    let path = temp_file("stream.yaml");
    std::fs::write(&path, yaml(&[&gated], "k", 0.3)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &gated, "k").await;
    let mut stream = gated_stream(&gw).await;

    std::fs::write(&path, yaml(&[&other.url], "k", 0.9)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.workers_removed, std::slice::from_ref(&gated));
    assert!(changes.routing);
    gate.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = stream.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"data: [DONE]\n\n");
    stop.cancel();
}

/// Opens the gate of `stream` (the gated worker's, draining): the stream
/// ends whole, and then `gateway` lists only `other`.
async fn ends_uncut_and_is_forgotten(
    gate: &Notify,
    mut stream: reqwest::Response,
    gateway: &str,
    other: &str,
) {
    gate.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = stream.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    assert_eq!(rest, b"data: [DONE]\n\n", "the stream was not cut");
    wait_until("the drained worker gone", || async {
        worker_urls(gateway, "k").await == [other.to_owned()]
    })
    .await;
}

/// A stream of the gated worker's model through `gateway` (key `k`), once
/// its first chunk came: it runs until the gate opens.
async fn gated_stream(gateway: &str) -> reqwest::Response {
    let mut stream = client()
        .post(format!("{gateway}/v1/chat/completions"))
        .bearer_auth("k")
        .json(&json!({"model": "gated", "messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "), "{first:?}");
    stream
}

/// A worker that a reload takes out while a stream runs on it drains, as
/// `DELETE /workers` does: `/workers` lists it as `draining` with that
/// stream's load, and its in-flight gauge counts it, until the stream ends;
/// then it is gone and the drain counted `finished`. It used to vanish from
/// both at once, the stream still running, so an operator could not tell
/// when the worker was free to stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_drains_a_removed_worker_until_its_stream_ends() {
    let gate = Arc::new(Notify::new());
    let (gated, _stop_gated) = gated_worker(gate.clone()).await;
    let other = sim_worker(fast_worker()).await;
    let path = temp_file("drain.yaml");
    std::fs::write(&path, yaml(&[&gated, &other.url], "k", 0.3)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &gated, "k").await;
    let stream = gated_stream(&gw).await;

    std::fs::write(&path, yaml(&[&other.url], "k", 0.3)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.workers_removed, std::slice::from_ref(&gated));
    let (_, listed) = get(&gw, "/workers", "k").await;
    let entry = listed["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == gated.as_str())
        .cloned();
    let entry =
        entry.unwrap_or_else(|| panic!("{gated} is not listed while its stream runs: {listed}"));
    assert_eq!(entry["state"], "draining", "{entry}");
    assert_eq!(entry["load"], 1, "{entry}");
    let gauge = format!("radixgate_worker_in_flight_requests{{worker=\"{gated}\"}} 1");
    wait_until(
        "the removed worker's stream in its in-flight gauge",
        || async { common::metrics_text(&gw).await.lines().any(|l| l == gauge) },
    )
    .await;

    ends_uncut_and_is_forgotten(&gate, stream, &gw, &other.url).await;
    assert!(
        common::metrics_text(&gw)
            .await
            .contains("radixgate_worker_drains_total{end=\"finished\"} 1")
    );
    stop.cancel();
}

/// `line` without terminal colour codes.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The binary, serving a config file; its stderr lines arrive on a channel.
struct Served {
    child: Child,
    url: String,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    fn start(config: &Path) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_radixgate"));
        for (key, _) in std::env::vars() {
            if key.starts_with("RADIXGATE_") {
                command.env_remove(key);
            }
        }
        let mut child = command
            .args(["serve", "--port", "0", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let line = strip_ansi(&line);
                eprintln!("[radixgate] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut served = Self {
            child,
            url: String::new(),
            lines,
        };
        let line = served.wait_for_line("radixgate listening");
        let addr = line
            .split("addr=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .expect("the listening line names the address");
        served.url = format!("http://{addr}");
        served
    }

    /// The next stderr line containing `needle` (a hang guard of a minute,
    /// not a speed assertion).
    fn wait_for_line(&self, needle: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no `{needle}` line from radixgate"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_file_keeps_streams_and_survives_a_bad_file() {
    let gate = Arc::new(Notify::new());
    let (gated, _stop_gated) = gated_worker(gate.clone()).await;
    let other = sim_worker(fast_worker()).await;
    let path = temp_file("sighup.yaml");
    std::fs::write(&path, yaml(&[&gated], "k", 0.3)).unwrap();
    let mut served = Served::start(&path);
    let gw = served.url.clone();
    healthy(&gw, &gated, "k").await;

    let stream = gated_stream(&gw).await;

    std::fs::write(&path, yaml(&[&other.url], "k", 0.3)).unwrap();
    served.hangup();
    // The old worker drains while its stream runs.
    wait_until("the new worker list", || async {
        let (_, body) = get(&gw, "/workers", "k").await;
        let state = |url: &str| {
            body["workers"].as_array().and_then(|ws| {
                ws.iter()
                    .find(|w| w["url"] == url)
                    .map(|w| w["state"].clone())
            })
        };
        state(&other.url).is_some() && state(&gated) == Some(json!("draining"))
    })
    .await;
    served.wait_for_line("configuration reloaded");
    assert!(served.alive());
    ends_uncut_and_is_forgotten(&gate, stream, &gw, &other.url).await;

    // A bad file: logged at ERROR with the key; the old config stays.
    std::fs::write(
        &path,
        yaml(&[&gated], "k2", 0.3).replace("interval_secs: 1", "interval_secs: 0"),
    )
    .unwrap();
    served.hangup();
    let line = served.wait_for_line("configuration reload failed");
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("health.interval_secs"), "{line}");
    assert!(served.alive());
    assert_eq!(
        worker_urls(&gw, "k").await,
        std::slice::from_ref(&other.url)
    );
}

/// A tenants' key file read while it is being rewritten in place may be
/// empty: that is not "no tenants", which, without `server.api_key`, would
/// open the client API to anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_of_a_key_file_truncated_to_nothing_keeps_the_tenants() {
    let a = sim_worker(fast_worker()).await;
    let (path, keys) = (temp_file("keys-only.yaml"), temp_file("keys-emptied.yaml"));
    std::fs::write(&keys, "- {name: team-a, key: sk-a}\n").unwrap();
    let text = format!(
        "health:\n  interval_secs: 1\n  success_threshold: 1\n\
         workers:\n  - {}\ntenants:\n  api_key_file: {}\n",
        a.url,
        keys.display()
    );
    std::fs::write(&path, text).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &a.url, "sk-a").await;
    assert_eq!(chat_status(&gw, "", "no key").await, 401);
    for empty in ["", "\n  \n", "# being written\n"] {
        std::fs::write(&keys, empty).unwrap();
        let outcome = reload.reload().await;
        let err = outcome.expect_err("an empty key file is refused");
        let err = err.to_string();
        assert!(
            err.contains("empty") && err.contains("keys-emptied.yaml"),
            "{err}"
        );
        assert_eq!(chat_status(&gw, "", "no key").await, 401, "{empty:?}");
        assert_eq!(chat_status(&gw, "sk-a", "the key").await, 200);
    }
    // No tenants, written so (the last entry deleted): the reload would
    // open the client API to anyone, and is refused, the key kept. (It
    // was applied, silently: any request was served.)
    std::fs::write(&keys, "[]\n").unwrap();
    let err = reload
        .reload()
        .await
        .expect_err("opening the API is refused");
    assert!(err.to_string().contains("open the client API"), "{err}");
    assert_eq!(chat_status(&gw, "", "no key").await, 401);
    assert_eq!(chat_status(&gw, "sk-a", "the key").await, 200);
    // Another tenant instead: the reload says the tenants changed, though
    // the config file did not.
    std::fs::write(&keys, "- {name: team-b, key: sk-b}\n").unwrap();
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.keys, ["tenants"]);
    assert_eq!(chat_status(&gw, "sk-b", "the new key").await, 200);
    assert_eq!(chat_status(&gw, "sk-a", "the old key").await, 401);
    // The same file again: nothing changed.
    let changes = reload.reload().await.unwrap();
    assert!(changes.keys.is_empty(), "{:?}", changes.keys);
    stop.cancel();
}

/// A worker's `kv_capacity_tokens` changed alone (given before and after)
/// is applied in place, as a key is: before, the worker was replaced, its
/// prefix tree forgotten and, for a moment, its load counted on a new
/// entry while its requests ran on the old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_cache_size_changed_alone_keeps_the_worker_and_its_tree() {
    let a = sim_worker(fast_worker()).await;
    let path = temp_file("capacity.yaml");
    let with_capacity = |tokens: u64| {
        yaml(&[], "k", 0.3) + &format!("  - {{url: \"{}\", kv_capacity_tokens: {tokens}}}\n", a.url)
    };
    std::fs::write(&path, with_capacity(400_000)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &a.url, "k").await;
    assert_eq!(
        chat_status(&gw, "k", "remember this prefix please").await,
        200
    );
    let before = cached_chars(&gw, "k", &a.url).await;
    assert!(before > 0);

    std::fs::write(&path, with_capacity(300_000)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.workers_rekeyed, std::slice::from_ref(&a.url));
    assert!(changes.workers_removed.is_empty(), "{changes:?}");
    assert!(changes.workers_added.is_empty(), "{changes:?}");
    assert_eq!(cached_chars(&gw, "k", &a.url).await, before, "tree kept");
    let (_, listed) = get(&gw, "/workers", "k").await;
    let entry = &listed["workers"][0];
    assert_eq!(entry["state"], "healthy", "{listed}");
    assert_eq!(entry["kv_capacity_tokens"], 300_000, "{listed}");
    stop.cancel();
}

/// A reload to a policy without trees leaves no tree gauge at its last
/// value: the workers' tree sizes and the models' eviction rates read 0,
/// as a removed worker's gauges do (they kept their last values, and an
/// alert on evictions went on for a tree that was gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_a_policy_without_trees_zeroes_the_tree_gauges() {
    let w = sim_worker(fast_worker()).await;
    let path = temp_file("treeless.yaml");
    let file = |policy: &str| {
        let text = yaml(&[], "k", 0.5)
            .replace("  cache_threshold: 0.5\n", &format!("  policy: {policy}\n"))
            .replace(
                "workers:\n",
                &format!(
                    "workers:\n  - {{url: '{}', kv_capacity_tokens: 16}}\n",
                    w.url
                ),
            );
        std::fs::write(&path, text).unwrap();
    };
    file("cache_aware");
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &w.url, "k").await;
    // Prompts far over the 16 tokens the worker holds: each insert evicts,
    // and the rate is published from a window of 256 inserts.
    for i in 0..260 {
        let text = format!("{i} {}", "a different prompt every time ".repeat(8));
        assert_eq!(chat_status(&gw, "k", &text).await, 200);
    }
    let model = radixgate_sim::server::DEFAULT_MODEL;
    let tree = format!("radixgate_tree_characters{{worker=\"{}\"}}", w.url);
    let evictions = format!("radixgate_cache_bound_eviction_rate{{model=\"{model}\"}}");
    common::wait_until("the tree gauges to be published", || async {
        common::series_value(&gw, &tree).await > 0.0
            && common::series_value(&gw, &evictions).await > 0.0
    })
    .await;
    file("round_robin");
    assert!(reload.reload().await.unwrap().routing);
    common::wait_until("the tree gauges to read 0", || async {
        common::series_value(&gw, &tree).await == 0.0
            && common::series_value(&gw, &evictions).await == 0.0
    })
    .await;
    stop.cancel();
}

/// `/get_server_info` shows the routing settings requests are routed by:
/// after a reload that changed them, the new ones. It used to show those
/// of start-up for good, so an operator checking that a reload took read
/// that it had not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_info_shows_the_routing_a_reload_applied() {
    let a = sim_worker(fast_worker()).await;
    let path = temp_file("server-info.yaml");
    std::fs::write(&path, yaml(&[&a.url], "k", 0.3)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    let routing = || async { get(&gw, "/get_server_info", "k").await.1["routing"].clone() };
    assert_eq!(routing().await["cache_threshold"], 0.3);
    std::fs::write(&path, yaml(&[&a.url], "k", 0.5)).unwrap();
    assert!(reload.reload().await.unwrap().routing);
    assert_eq!(routing().await["cache_threshold"], 0.5);
    // A refused reload leaves what runs.
    std::fs::write(&path, yaml(&[&a.url], "k", 1.5)).unwrap();
    reload.reload().await.unwrap_err();
    assert_eq!(routing().await["cache_threshold"], 0.5);
    stop.cancel();
}

/// An entry whose URL is only spelled another way (a trailing `/`, the
/// scheme's default port, the host's case) names the same worker: a
/// reload keeps it, in rotation with its tree and id, as it keeps any
/// unchanged entry. It used to remove it and add it again, out of rotation
/// until probed and its tree forgotten; a file so reformatted emptied the
/// pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_url_spelled_another_way_keeps_its_worker() {
    let a = sim_worker(fast_worker()).await;
    let path = temp_file("respelled.yaml");
    let respelled = format!("{}/", a.url.replace("http://", "HTTP://"));
    std::fs::write(&path, yaml(&[&respelled], "k", 0.3)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &a.url, "k").await;
    assert_eq!(
        chat_status(&gw, "k", "remember this prefix please").await,
        200
    );
    let cached = cached_chars(&gw, "k", &a.url).await;
    assert!(cached > 0);
    let id = |body: Value| body["workers"][0]["id"].clone();
    let before = id(get(&gw, "/workers", "k").await.1);

    std::fs::write(&path, yaml(&[&a.url], "k", 0.3)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert!(changes.workers_removed.is_empty(), "{changes:?}");
    assert!(changes.workers_added.is_empty(), "{changes:?}");
    let (_, workers) = get(&gw, "/workers", "k").await;
    assert_eq!(workers["workers"][0]["state"], "healthy", "{workers}");
    assert_eq!(id(workers), before);
    assert!(cached_chars(&gw, "k", &a.url).await >= cached, "tree kept");
    // Spelled as at first, with a key: the key alone changed, in place.
    let keyed = format!("{{url: \"{respelled}\", api_key: w1}}");
    std::fs::write(&path, yaml(&[&keyed], "k", 0.3)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert_eq!(changes.workers_rekeyed, std::slice::from_ref(&a.url));
    assert!(changes.workers_removed.is_empty(), "{changes:?}");
    assert_eq!(id(get(&gw, "/workers", "k").await.1), before);
    stop.cancel();
}

/// A reload whose file hangs when read (a FIFO nobody writes yet, a
/// network mount that stopped answering) stalls nothing else: the admin
/// API, which asks the control task, still answers, and the reload
/// completes once the file can be read. Before, the file was read on the
/// runtime that also runs the control task and the probes, and they hung
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_file_hangs_stalls_nothing_else() {
    let worker = sim_worker(fast_worker()).await;
    let path = temp_file("hanging.yaml");
    std::fs::write(&path, yaml(&[&worker.url], "k", 0.3)).unwrap();
    let served = Served::start(&path);
    let gw = served.url.clone();
    healthy(&gw, &worker.url, "k").await;
    std::fs::remove_file(&path).unwrap();
    let made = Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(made.success());
    served.hangup();
    // The reload opens the FIFO and waits there for a writer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answered = tokio::time::timeout(Duration::from_secs(20), get(&gw, "/workers", "k")).await;
    let (status, _) = answered.expect("the admin API hung behind the reload");
    assert_eq!(status, 200);
    let text = yaml(&[&worker.url], "k", 0.3);
    let writer = std::thread::spawn(move || std::fs::write(&path, text));
    served.wait_for_line("configuration reloaded");
    writer.join().unwrap().unwrap();
}

/// A file entry whose URL a worker added through `POST /workers` holds is
/// not added: the admin API's worker keeps it. Nor is it the file's from
/// then on: a file that drops it again reports nothing removed, and once
/// the admin API's worker is gone, a reload of the file that lists it adds
/// it. Before, the refused entry counted as the running file's: dropped,
/// it was reported removed (the admin API's worker left in place), and
/// listed again, no reload added it until the entry itself changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_entry_refused_for_an_admin_worker_is_added_once_its_url_is_free() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let path = temp_file("refused-entry.yaml");
    std::fs::write(&path, yaml(&[&a.url], "k", 0.3)).unwrap();
    let (gw, reload, stop) = reloadable_gateway(&path).await;
    healthy(&gw, &a.url, "k").await;
    let posted = client()
        .post(format!("{gw}/workers"))
        .bearer_auth("k")
        .json(&json!({"url": b.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 202);
    healthy(&gw, &b.url, "k").await;
    let mut both = vec![a.url.clone(), b.url.clone()];
    both.sort();

    std::fs::write(&path, yaml(&[&a.url, &b.url], "k", 0.3)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert!(changes.workers_added.is_empty(), "{changes:?}");
    std::fs::write(&path, yaml(&[&a.url], "k", 0.3)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert!(
        changes.workers_removed.is_empty(),
        "the admin API's worker is not the file's to remove: {changes:?}"
    );
    assert_eq!(worker_urls(&gw, "k").await, both);

    std::fs::write(&path, yaml(&[&a.url, &b.url], "k", 0.3)).unwrap();
    let changes = reload.reload().await.unwrap();
    assert!(changes.workers_added.is_empty(), "{changes:?}");
    let removed: Value = client()
        .delete(format!("{gw}/workers?url={}", b.url))
        .bearer_auth("k")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(removed["state"], "removed", "{removed}");
    assert_eq!(worker_urls(&gw, "k").await, vec![a.url.clone()]);
    let changes = reload.reload().await.unwrap();
    assert_eq!(
        changes.workers_added,
        std::slice::from_ref(&b.url),
        "the file lists it, and no one holds its URL now: {changes:?}"
    );
    healthy(&gw, &b.url, "k").await;
    stop.cancel();
}
