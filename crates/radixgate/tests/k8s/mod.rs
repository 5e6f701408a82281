//! A fake Kubernetes API server on loopback, for the real `kube` client.
//!
//! It serves what pod discovery asks for, over real HTTP:
//! `GET /api/v1/pods` and `GET /api/v1/namespaces/{ns}/pods`, with
//! `labelSelector` (equality terms, `a=b,c=d`); a list answers a `PodList`
//! at the current resource version; `watch=true` answers a chunked stream
//! of watch events, one JSON object per line, from the given
//! `resourceVersion` on: the events since then from its history, then live
//! ones. Every change bumps the resource version, as etcd's revision does.
//!
//! Tests drive it: add, change and delete pods ([`FakeApi::put`],
//! [`FakeApi::delete`]), send raw objects ([`FakeApi::put_raw`]), send a
//! `BOOKMARK` ([`FakeApi::bookmark`]) or any event
//! ([`FakeApi::send_event`]), cut every open watch mid-stream
//! ([`FakeApi::drop_watches`]), forget history so that resuming fails with
//! `410 Gone` as an `ERROR` event ([`FakeApi::compact`]), and stop and
//! restart the server on the same port ([`FakeApi::stop`],
//! [`FakeApi::start`]), and answer lists with an error status, not at
//! all, padded past any bound or trickled forever
//! ([`FakeApi::answer_lists`]), and answer stale watches with the HTTP
//! status `410 Gone` ([`FakeApi::refuse_stale_watches`]). A watch ends
//! after its `timeoutSeconds`, as the API server's does. It records every request
//! ([`FakeApi::requests`]).
//!
//! [`pod`] builds pod objects whose IP and port annotation point at real
//! simulated workers on `127.0.0.x`.

#![allow(dead_code, unreachable_pub)]

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// The annotation test pods carry their worker's port in.
pub const PORT_ANNOTATION: &str = "radixgate.test/port";

/// One recorded event: its resource version, type and object.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    kind: &'static str,
    object: Value,
    /// The object as it was before this change, if it existed.
    before: Option<Value>,
}

/// Everything the fake server knows.
#[derive(Default)]
struct Store {
    rv: u64,
    /// Current pods by `namespace/name`.
    pods: BTreeMap<String, Value>,
    /// Every change since `compacted`.
    history: Vec<Change>,
    /// Watches from a version below this get 410 Gone.
    compacted: u64,
    /// `list ns=.. selector=..` / `watch rv=..` per request, in order.
    requests: Vec<String>,
    /// How lists are answered.
    lists: Lists,
    /// Watches from a version below `compacted` are answered `410 Gone`
    /// as the HTTP status, not as an `ERROR` event in the stream.
    gone_as_status: bool,
}

/// How the fake server answers a list.
#[derive(Clone, Copy, Debug, Default)]
pub enum Lists {
    /// With the pods.
    #[default]
    Pods,
    /// With this error status (403: no RBAC to list pods).
    Status(u16),
    /// Never: the request is read and nothing is sent back (a host that
    /// died with the connection open).
    Silence,
    /// With the pods, then this many bytes of whitespace: valid JSON,
    /// larger than any list should be.
    Padded(usize),
    /// With the list's first bytes, then a space every 100 ms, never
    /// ending (an API server that hangs mid-body, yet is not silent).
    Trickle,
}

/// What live watches are sent.
#[derive(Clone, Debug)]
enum Live {
    Change(Change),
    Bookmark(u64),
    Event(Value),
}

#[derive(Clone)]
struct Shared {
    store: Arc<Mutex<Store>>,
    live: broadcast::Sender<Live>,
    /// Cancelled to cut every open watch (replaced each time).
    cut: Arc<Mutex<CancellationToken>>,
    /// The current run's stop: ends every watch, even one that started
    /// while the server was stopping (else graceful shutdown would wait
    /// for it, up to the client's watch timeout).
    stopping: Arc<Mutex<CancellationToken>>,
}

/// The fake API server (see the module doc).
pub struct FakeApi {
    pub addr: SocketAddr,
    shared: Shared,
    /// Stops the current run of the server.
    running: Option<(CancellationToken, tokio::task::JoinHandle<()>)>,
    /// A kubeconfig file pointing at it.
    pub kubeconfig: PathBuf,
}

impl FakeApi {
    /// Starts one on a free loopback port.
    pub async fn start_new() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let kubeconfig = std::env::temp_dir().join(format!(
            "radixgate-fake-api-{}-{}.yaml",
            std::process::id(),
            addr.port()
        ));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
                 clusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
                 contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: llm\n\
                 users:\n- name: fake\n  user: {{}}\n"
            ),
        )
        .unwrap();
        let (live, _) = broadcast::channel(1024);
        let mut api = Self {
            addr,
            shared: Shared {
                store: Arc::default(),
                live,
                cut: Arc::default(),
                stopping: Arc::default(),
            },
            running: None,
            kubeconfig,
        };
        api.serve(listener);
        api
    }

    fn serve(&mut self, listener: TcpListener) {
        let stop = CancellationToken::new();
        *self.shared.stopping.lock() = stop.clone();
        let app = Router::new()
            .fallback(handle)
            .with_state(self.shared.clone());
        let until = stop.clone();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { until.cancelled().await })
                .await;
        });
        self.running = Some((stop, task));
    }

    /// Stops serving: open watches are cut, new connections refused. The
    /// store is kept.
    pub async fn stop(&mut self) {
        if let Some((stop, task)) = self.running.take() {
            stop.cancel();
            let _ = task.await;
        }
    }

    /// Serves again on the same port.
    pub async fn start(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    fn record(&self, kind: &'static str, mut object: Value) -> u64 {
        let mut store = self.shared.store.lock();
        store.rv += 1;
        let rv = store.rv;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
        }
        let key = key_of(&object);
        let before = match kind {
            "DELETED" => store.pods.remove(&key),
            _ => store.pods.insert(key, object.clone()),
        };
        let change = Change {
            rv,
            kind,
            object,
            before,
        };
        store.history.push(change.clone());
        drop(store);
        let _ = self.shared.live.send(Live::Change(change));
        rv
    }

    /// Adds or replaces a pod (`ADDED` if new, else `MODIFIED`); returns
    /// the new resource version.
    pub fn put(&self, pod: Value) -> u64 {
        let exists = self.shared.store.lock().pods.contains_key(&key_of(&pod));
        self.record(if exists { "MODIFIED" } else { "ADDED" }, pod)
    }

    /// Sends any object as a pod, however wrong.
    pub fn put_raw(&self, kind: &'static str, object: Value) -> u64 {
        self.record(kind, object)
    }

    /// Deletes a pod by name (namespace `llm`).
    pub fn delete(&self, name: &str) -> u64 {
        let object = self
            .shared
            .store
            .lock()
            .pods
            .get(&format!("llm/{name}"))
            .cloned()
            .unwrap_or_else(|| panic!("no pod {name}"));
        self.record("DELETED", object)
    }

    /// The current pod object by name.
    pub fn get(&self, name: &str) -> Value {
        self.shared.store.lock().pods[&format!("llm/{name}")].clone()
    }

    /// Sends every live watch a `BOOKMARK` at a new resource version.
    pub fn bookmark(&self) -> u64 {
        let rv = {
            let mut store = self.shared.store.lock();
            store.rv += 1;
            store.rv
        };
        let _ = self.shared.live.send(Live::Bookmark(rv));
        rv
    }

    /// Sends every live watch `event` as it is (an `ERROR` event, say),
    /// recording nothing.
    pub fn send_event(&self, event: Value) {
        let _ = self.shared.live.send(Live::Event(event));
    }

    /// Cuts every open watch mid-stream (the connection ends).
    pub fn drop_watches(&self) {
        let mut cut = self.shared.cut.lock();
        cut.cancel();
        *cut = CancellationToken::new();
    }

    /// Forgets all history: a watch resuming from before the current
    /// version gets 410 (from the current one there is nothing to miss).
    pub fn compact(&self) {
        let mut store = self.shared.store.lock();
        store.compacted = store.rv;
        store.history.clear();
    }

    /// Answers watches from a compacted version with the HTTP status
    /// `410 Gone` (as an API server may), not with an `ERROR` event.
    pub fn refuse_stale_watches(&self) {
        self.shared.store.lock().gone_as_status = true;
    }

    /// Answers every later list as `lists` says.
    pub fn answer_lists(&self, lists: Lists) {
        self.shared.store.lock().lists = lists;
    }

    /// The requests served so far.
    pub fn requests(&self) -> Vec<String> {
        self.shared.store.lock().requests.clone()
    }

    /// The current resource version.
    pub fn version(&self) -> u64 {
        self.shared.store.lock().rv
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
        if let Some((stop, _)) = self.running.take() {
            stop.cancel();
        }
        self.drop_watches();
    }
}

fn key_of(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "{}/{}",
        meta["namespace"].as_str().unwrap_or(""),
        meta["name"].as_str().unwrap_or("")
    )
}

/// Equality terms of a label selector against an object's labels.
fn matches(selector: &str, object: &Value) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (key, value) = term.split_once('=').unwrap_or((term, ""));
        object["metadata"]["labels"][key].as_str() == Some(value)
    })
}

fn in_namespace(namespace: Option<&str>, object: &Value) -> bool {
    namespace.is_none_or(|ns| object["metadata"]["namespace"].as_str() == Some(ns))
}

async fn handle(State(shared): State<Shared>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| {
            url_pairs(q)
                .into_iter()
                .collect::<HashMap<String, String>>()
        })
        .unwrap_or_default();
    let namespace = match path.as_str() {
        "/api/v1/pods" => None,
        p => match p
            .strip_prefix("/api/v1/namespaces/")
            .and_then(|r| r.strip_suffix("/pods"))
        {
            Some(ns) => Some(ns.to_owned()),
            None => return (StatusCode::NOT_FOUND, "not found").into_response(),
        },
    };
    let selector = query.get("labelSelector").cloned().unwrap_or_default();
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    if !watch {
        let lists = {
            let mut store = shared.store.lock();
            store.requests.push(format!(
                "list ns={} selector={selector}",
                namespace.as_deref().unwrap_or("*")
            ));
            store.lists
        };
        match lists {
            Lists::Pods | Lists::Padded(_) => {}
            Lists::Status(code) => {
                let status = json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "pods is forbidden", "reason": "Forbidden", "code": code,
                });
                let code = StatusCode::from_u16(code).unwrap();
                return (code, axum::Json(status)).into_response();
            }
            Lists::Silence => {
                let stopping = shared.stopping.lock().clone();
                stopping.cancelled().await;
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            }
            Lists::Trickle => {
                let stopping = shared.stopping.lock().clone();
                let start = Bytes::from_static(b"{\"apiVersion\": \"v1\", \"kind\": \"PodList\", ");
                let spaces = futures::stream::unfold(stopping, |stopping| async move {
                    tokio::select! {
                        () = stopping.cancelled() => None,
                        () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {
                            Some((Bytes::from_static(b" "), stopping))
                        }
                    }
                });
                let body = futures::stream::once(async { start })
                    .chain(spaces)
                    .map(Ok::<_, std::convert::Infallible>);
                return Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from_stream(body))
                    .unwrap();
            }
        }
        let store = shared.store.lock();
        let items: Vec<Value> = store
            .pods
            .values()
            .filter(|p| in_namespace(namespace.as_deref(), p) && matches(&selector, p))
            .cloned()
            .collect();
        let body = json!({
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": store.rv.to_string()},
            "items": items,
        });
        let Lists::Padded(padding) = lists else {
            return axum::Json(body).into_response();
        };
        let chunk = Bytes::from(vec![b' '; 1 << 20]);
        let mut chunks = vec![Bytes::from(body.to_string())];
        chunks.extend((0..padding.div_ceil(chunk.len())).map(|_| chunk.clone()));
        let body = futures::stream::iter(chunks).map(Ok::<_, std::convert::Infallible>);
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from_stream(body))
            .unwrap();
    }

    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(std::time::Duration::MAX, std::time::Duration::from_secs);
    let ends = tokio::time::Instant::now()
        .checked_add(timeout)
        .unwrap_or_else(|| tokio::time::Instant::now() + std::time::Duration::from_secs(86_400));
    let mut live = shared.live.subscribe();
    let cut = shared.cut.lock().clone();
    let stopping = shared.stopping.lock().clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let (backlog, gone) = {
        let mut store = shared.store.lock();
        store
            .requests
            .push(format!("watch rv={from} selector={selector}"));
        if from < store.compacted && store.gone_as_status {
            let status = json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("too old resource version: {from}"),
                "reason": "Expired", "code": 410,
            });
            return (StatusCode::GONE, axum::Json(status)).into_response();
        }
        if from < store.compacted {
            (Vec::new(), true)
        } else {
            let backlog: Vec<Change> = store
                .history
                .iter()
                .filter(|c| c.rv > from)
                .cloned()
                .collect();
            (backlog, false)
        }
    };
    let line = |v: Value| {
        let mut text = v.to_string();
        text.push('\n');
        Bytes::from(text)
    };
    // As a real API server filters a watch: a change that moves an
    // object into its selector is `ADDED` to it, one that moves the
    // object out is `DELETED` from it (with the object as it is now), and
    // one that neither matched nor matches is not sent.
    let wanted = move |c: &Change| -> Option<&'static str> {
        let selected = |o: &Value| in_namespace(namespace.as_deref(), o) && matches(&selector, o);
        let was = c.before.as_ref().is_some_and(selected);
        match c.kind {
            "ADDED" | "MODIFIED" if c.before.is_some() => match (was, selected(&c.object)) {
                (true, true) => Some(c.kind),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            },
            "DELETED" if c.before.is_some() => was.then_some("DELETED"),
            // A new object, or whatever `put_raw` sent: as it is.
            kind => selected(&c.object).then_some(kind),
        }
    };
    tokio::spawn(async move {
        if gone {
            let status = json!({
                "type": "ERROR",
                "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "message": format!("too old resource version: {from}"),
                           "reason": "Expired", "code": 410}
            });
            let _ = tx.send(line(status)).await;
            return;
        }
        let mut sent = from;
        for change in backlog {
            sent = change.rv;
            if let Some(kind) = wanted(&change) {
                let event = json!({"type": kind, "object": change.object});
                if tx.send(line(event)).await.is_err() {
                    return;
                }
            }
        }
        loop {
            let next = tokio::select! {
                () = cut.cancelled() => return,
                () = stopping.cancelled() => return,
                () = tokio::time::sleep_until(ends) => return,
                next = live.recv() => next,
            };
            let event = match next {
                Ok(Live::Change(change)) if change.rv > sent => {
                    sent = change.rv;
                    let Some(kind) = wanted(&change) else {
                        continue;
                    };
                    json!({"type": kind, "object": change.object})
                }
                Ok(Live::Change(_)) => continue,
                Ok(Live::Bookmark(rv)) => json!({
                    "type": "BOOKMARK",
                    "object": {"kind": "Pod", "apiVersion": "v1",
                               "metadata": {"resourceVersion": rv.to_string()}}
                }),
                Ok(Live::Event(event)) => event,
                Err(_) => return,
            };
            if tx.send(line(event)).await.is_err() {
                return;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// `a=b&c=d`, percent-decoded.
fn url_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

fn decode(text: &str) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// A pod in namespace `llm` named `name`, labelled `labels`, Running and
/// Ready at `addr` (its IP, and its port in [`PORT_ANNOTATION`]).
pub fn pod(name: &str, labels: Value, addr: SocketAddr) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "uid": format!("uid-{name}"),
            "labels": labels,
            "annotations": {PORT_ANNOTATION: addr.port().to_string()},
        },
        "spec": {"containers": [{"name": "worker", "image": "sglang"}]},
        "status": {
            "phase": "Running",
            "podIP": addr.ip().to_string(),
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    })
}

/// `pod` with its `Ready` condition set to `ready`.
pub fn set_ready(mut pod: Value, ready: bool) -> Value {
    pod["status"]["conditions"] =
        json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
    pod
}

/// `pod` terminating (a `deletionTimestamp`, as on `kubectl delete`).
pub fn terminating(mut pod: Value) -> Value {
    pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    pod
}

/// `pod` evicted, as the kubelet leaves it: phase `Failed`, not ready, its
/// IP still in its status, the object kept until someone deletes it.
pub fn evicted(mut pod: Value) -> Value {
    pod = set_ready(pod, false);
    pod["status"]["phase"] = json!("Failed");
    pod["status"]["reason"] = json!("Evicted");
    pod["status"]["message"] = json!("The node was low on resource: memory.");
    pod
}

/// `pod` moved to `addr`.
pub fn moved(mut pod: Value, addr: SocketAddr) -> Value {
    pod["status"]["podIP"] = json!(addr.ip().to_string());
    pod["metadata"]["annotations"][PORT_ANNOTATION] = json!(addr.port().to_string());
    pod
}
