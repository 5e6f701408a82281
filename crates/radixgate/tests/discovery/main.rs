//! Kubernetes pod discovery end to end: the real `kube` client in a real
//! gateway, against the fake API server of `k8s/mod.rs` on loopback, with
//! the pods' IPs pointing at real simulated workers on `127.0.0.x`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../k8s/mod.rs"]
mod k8s;

mod api_server;
mod disaggregated;
mod reload;

use common::*;
use k8s::{FakeApi, Lists, PORT_ANNOTATION, evicted, moved, pod, set_ready, terminating};
use radixgate::config::{Config, ModelIdFrom, PoolConfig};
use radixgate_routing::WorkerRole;
use radixgate_sim::server::WorkerConfig;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// A simulated worker on its own loopback address, `127.0.0.<host>`.
async fn worker_at(host: u8, config: WorkerConfig) -> (SimWorker, SocketAddr) {
    let listener = TcpListener::bind(("127.0.0.".to_owned() + &host.to_string(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    (sim_worker_on(listener, config).await, addr)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A gateway config that discovers pods labelled `app=sglang` in `llm`
/// through `api`, their ports in [`PORT_ANNOTATION`].
fn discovering(api: &FakeApi) -> Config {
    let mut c = config(&[]);
    c.discovery.enabled = true;
    c.discovery.kubeconfig = Some(api.kubeconfig.clone());
    c.discovery.namespace = Some("llm".into());
    c.discovery.selector = labels(&[("app", "sglang")]);
    c.discovery.port_annotation = Some(PORT_ANNOTATION.into());
    c
}

/// The `/workers` entry named `name`, if listed.
async fn worker_named(gateway: &str, name: &str) -> Option<Value> {
    workers(gateway)
        .await
        .into_iter()
        .find(|w| w["name"] == name)
}

async fn wait_for_state(gateway: &str, name: &str, state: &str) {
    wait_until(&format!("{name} {state}"), || async {
        worker_named(gateway, name)
            .await
            .is_some_and(|w| w["state"] == state)
    })
    .await;
}

async fn wait_for_gone(gateway: &str, name: &str) {
    wait_until(&format!("{name} removed"), || async {
        worker_named(gateway, name).await.is_none()
    })
    .await;
}

/// Waits until the fake server has served a watch (discovery is live).
async fn wait_for_watch(api: &FakeApi, count: usize) {
    wait_until(&format!("{count} watches"), || async {
        api.requests()
            .iter()
            .filter(|r| r.starts_with("watch"))
            .count()
            >= count
    })
    .await;
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `radixgate_discovery_connected` for `selector`.
async fn connected(gateway: &str, selector: &str) -> f64 {
    let series = format!("radixgate_discovery_connected{{selector=\"{selector}\"}}");
    metric(&metrics_text(gateway).await, &series)
}

fn lists(api: &FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.starts_with("list"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_added_then_turned_ready_gets_traffic() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    let starting = set_ready(pod("w-0", json!({"app": "sglang"}), addr), false);
    api.put(starting.clone());
    // Another app's pod is never asked for: the selector is the server's.
    let (_other, other_addr) = worker_at(3, fast_worker()).await;
    api.put(pod("db-0", json!({"app": "postgres"}), other_addr));
    let gw = gateway(discovering(&api)).await;
    wait_for_watch(&api, 1).await;
    assert!(
        api.requests()
            .iter()
            .all(|r| r.ends_with("selector=app=sglang")),
        "{:?}",
        api.requests()
    );
    assert!(
        workers(&gw.url).await.is_empty(),
        "an unready pod is no worker"
    );

    api.put(set_ready(starting, true));
    wait_for_healthy(&gw.url, 1).await;
    let entry = worker_named(&gw.url, "w-0").await.unwrap();
    assert_eq!(entry["url"], w.url);
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("hello", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-radixgate-worker"], w.url.as_str());
    let decision = r.headers()["x-radixgate-decision"].to_str().unwrap();
    assert!(
        decision.contains("w-0"),
        "decisions name the pod: {decision}"
    );
    let metrics = metrics_text(&gw.url).await;
    assert_eq!(
        metric(
            &metrics,
            "radixgate_discovery_connected{selector=\"app=sglang\"}"
        ),
        1.0
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_turned_unready_stops_getting_traffic_and_comes_back() {
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let (b, b_addr) = worker_at(3, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-a", json!({"app": "sglang"}), a_addr));
    let b_pod = pod("w-b", json!({"app": "sglang"}), b_addr);
    api.put(b_pod.clone());
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 2).await;
    let id = worker_named(&gw.url, "w-b").await.unwrap()["id"].clone();

    api.put(set_ready(b_pod.clone(), false));
    wait_for_state(&gw.url, "w-b", "unready").await;
    wait_for_healthy(&gw.url, 1).await;
    assert_all_served_by(&gw.url, &a.url, 10, "while w-b is unready").await;

    api.put(b_pod);
    wait_for_healthy(&gw.url, 2).await;
    wait_for_state(&gw.url, "w-b", "healthy").await;
    let back = worker_named(&gw.url, "w-b").await.unwrap();
    assert_eq!(back["url"], b.url);
    // The same registry entry throughout, so its tree record was kept.
    assert_eq!(back["id"], id, "{back}");
    gw.shutdown().await;
}

/// An operator takes a pod out of rotation by removing the label the
/// selector reads (`kubectl label pod w-b app-`), and puts it back by
/// setting it again. The API server tells the router's watch so as a
/// `DELETED` and an `ADDED` (the fake one does too), and the worker goes
/// and comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_relabelled_out_of_the_selector_leaves_and_comes_back() {
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let (b, b_addr) = worker_at(3, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-a", json!({"app": "sglang"}), a_addr));
    let b_pod = pod("w-b", json!({"app": "sglang"}), b_addr);
    api.put(b_pod.clone());
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 2).await;

    api.put(pod("w-b", json!({"app": "sglang-canary"}), b_addr));
    wait_for_gone(&gw.url, "w-b").await;
    assert_all_served_by(&gw.url, &a.url, 6, "while w-b is relabelled").await;

    api.put(b_pod);
    wait_for_healthy(&gw.url, 2).await;
    assert_eq!(worker_named(&gw.url, "w-b").await.unwrap()["url"], b.url);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_during_a_long_stream_drains_then_goes() {
    let mut slow = fast_worker();
    slow.engine.timing.step_base_us = 3000.0;
    let (a, a_addr) = worker_at(2, slow).await;
    let (b, b_addr) = worker_at(3, fast_worker()).await;
    let api = FakeApi::start_new().await;
    let a_pod = pod("w-a", json!({"app": "sglang"}), a_addr);
    api.put(a_pod.clone());
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 1).await;

    let mut long = chat("a long answer", true);
    long["max_tokens"] = json!(600);
    let mut stream = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&long)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["x-radixgate-worker"], a.url.as_str());
    let mut body = String::new();
    let first = stream.chunk().await.unwrap().unwrap();
    body.push_str(&String::from_utf8_lossy(&first));

    // A second pod arrives, then the first starts terminating.
    api.put(pod("w-b", json!({"app": "sglang"}), b_addr));
    wait_for_healthy(&gw.url, 2).await;
    api.put(terminating(a_pod));
    wait_for_state(&gw.url, "w-a", "draining").await;
    let entry = worker_named(&gw.url, "w-a").await.unwrap();
    assert_eq!(entry["load"], 1, "{entry}");
    // New requests go elsewhere at once.
    assert_all_served_by(&gw.url, &b.url, 6, "while w-a drains").await;

    while let Some(chunk) = stream.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(!body.contains("error"), "{body}");
    wait_for_gone(&gw.url, "w-a").await;
    api.delete("w-a");
    let metrics = metrics_text(&gw.url).await;
    assert_eq!(
        metric(&metrics, "radixgate_worker_drains_total{end=\"finished\"}"),
        1.0,
        "{metrics}"
    );
    gw.shutdown().await;
}

/// An evicted pod (phase `Failed`) never serves again, yet its object
/// stays, not ready, until someone deletes it (or the cluster's garbage
/// collector, past thousands of such pods): its worker goes, and its
/// address is free for the next pod given it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_leaves_and_its_address_goes_to_the_next_pod() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("old-0", json!({"app": "sglang"}), addr));
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 1).await;

    api.put(evicted(api.get("old-0")));
    wait_for_gone(&gw.url, "old-0").await;
    api.put(pod("new-0", json!({"app": "sglang"}), addr));
    wait_for_state(&gw.url, "new-0", "healthy").await;
    assert_eq!(worker_named(&gw.url, "new-0").await.unwrap()["url"], w.url);
    assert_eq!(workers(&gw.url).await.len(), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_change_moves_the_worker() {
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let (b, b_addr) = worker_at(3, fast_worker()).await;
    let api = FakeApi::start_new().await;
    let p = pod("w-0", json!({"app": "sglang"}), a_addr);
    api.put(p.clone());
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 1).await;
    assert_all_served_by(&gw.url, &a.url, 4, "before the move").await;

    api.put(moved(p, b_addr));
    wait_until("w-0 at its new address", || async {
        let list = workers(&gw.url).await;
        list.len() == 1 && list[0]["url"] == b.url && list[0]["state"] == "healthy"
    })
    .await;
    assert_all_served_by(&gw.url, &b.url, 4, "after the move").await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_selectors_give_two_models() {
    let model = |name: &str| WorkerConfig {
        model: name.to_owned(),
        ..fast_worker()
    };
    let (a, a_addr) = worker_at(2, model("model-a")).await;
    let (b, b_addr) = worker_at(3, model("model-b")).await;
    let api = FakeApi::start_new().await;
    api.put(pod("a-0", json!({"app": "a", "model": "model-a"}), a_addr));
    api.put(pod("b-0", json!({"app": "b"}), b_addr));
    let mut cfg = discovering(&api);
    cfg.discovery.selector = labels(&[("app", "a")]);
    cfg.discovery.model_id_from = Some(ModelIdFrom::Label("model".into()));
    cfg.discovery.pools = vec![PoolConfig {
        selector: labels(&[("app", "b")]),
        models: vec!["model-b".into()],
        ..PoolConfig::default()
    }];
    let gw = gateway(cfg).await;
    wait_for_healthy(&gw.url, 2).await;
    wait_for_watch(&api, 2).await;
    for (name, worker) in [("model-a", &a), ("model-b", &b)] {
        for i in 0..4 {
            let mut body = chat(&format!("{name} {i}"), false);
            body["model"] = json!(name);
            let r = client()
                .post(format!("{}/v1/chat/completions", gw.url))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()["x-radixgate-worker"], worker.url.as_str());
        }
    }
    let ids = model_ids(&gw.url).await;
    assert!(
        ids.iter().any(|m| m == "model-a") && ids.iter().any(|m| m == "model-b"),
        "{ids:?}"
    );
    gw.shutdown().await;
}

/// Everything logged by this test binary, for the test that reads logs.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || Sink(sink.clone()))
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        logs
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_objects_are_logged_and_the_rest_keeps_working() {
    let logs = captured_logs();
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let (b, b_addr) = worker_at(3, fast_worker()).await;
    let api = FakeApi::start_new().await;
    // In the first list: a pod whose status is a string, and one whose
    // port annotation is no port.
    api.put_raw(
        "ADDED",
        json!({"metadata": {"name": "bad-status", "namespace": "llm",
                            "labels": {"app": "sglang"}}, "status": "Running"}),
    );
    let mut bad_port = pod("bad-port", json!({"app": "sglang"}), a_addr);
    bad_port["metadata"]["annotations"][PORT_ANNOTATION] = json!("http");
    api.put(bad_port);
    api.put(pod("good-a", json!({"app": "sglang"}), a_addr));
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 1).await;
    // In the watch: one without a name, one whose labels are a list.
    api.put_raw(
        "ADDED",
        json!({"metadata": {"namespace": "llm", "labels": {"app": "sglang"}}}),
    );
    api.put_raw(
        "MODIFIED",
        json!({"metadata": {"name": "good-a", "namespace": "llm", "labels": {"app": "sglang"}},
               "spec": {"containers": 7}}),
    );
    api.put(pod("good-b", json!({"app": "sglang"}), b_addr));
    wait_for_healthy(&gw.url, 2).await;
    assert_eq!(worker_named(&gw.url, "good-a").await.unwrap()["url"], a.url);
    assert_eq!(worker_named(&gw.url, "good-b").await.unwrap()["url"], b.url);
    assert_eq!(workers(&gw.url).await.len(), 2);
    let metrics = metrics_text(&gw.url).await;
    assert!(
        metric(
            &metrics,
            "radixgate_discovery_events_total{event=\"malformed\"}"
        ) >= 4.0,
        "{metrics}"
    );
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    for needle in [
        "pod=llm/bad-status",
        "pod=llm/bad-port",
        "annotation radixgate.test/port=`http` is not a port",
        "pod=(unnamed)",
        "pod=llm/good-a",
    ] {
        assert!(
            text.lines()
                .any(|l| l.contains("skipping a malformed pod object") && l.contains(needle)),
            "no malformed-object line with `{needle}` in:\n{text}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_values_in_a_malformed_object_or_a_watch_error_are_not_logged_whole() {
    let logs = captured_logs();
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-a", json!({"app": "loud"}), a_addr));
    let mut cfg = discovering(&api);
    // Its own selector, to tell its log lines from other tests'.
    cfg.discovery.selector = labels(&[("app", "loud")]);
    let gw = gateway(cfg).await;
    wait_for_healthy(&gw.url, 1).await;
    wait_for_watch(&api, 1).await;

    // serde quotes a wrong value whole, and the API server's messages are
    // its own: 1 MiB each.
    let filler = "x".repeat(1 << 20);
    api.put_raw(
        "ADDED",
        json!({"metadata": {"name": "big", "namespace": "llm", "labels": {"app": "loud"}},
               "status": filler}),
    );
    api.send_event(json!({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": filler, "reason": "InternalError", "code": 500}}));
    let lines = || {
        let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
        text.lines()
            .filter(|l| l.contains("pod=llm/big") || l.contains("selector=app=loud"))
            .map(str::len)
            .collect::<Vec<usize>>()
    };
    wait_until("both logged", || async {
        let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
        text.contains("pod=llm/big") && text.contains("error returned by apiserver")
    })
    .await;
    assert!(lines().iter().all(|len| *len < 4096), "{:?}", lines());
    assert_all_served_by(&gw.url, &a.url, 2, "after both").await;
    gw.shutdown().await;
}

/// Sends streamed requests one after another until `stop`; counts what
/// was sent, what was answered whole (200 and a stream ending in
/// `[DONE]`) and what failed (anything else), printing the first failures.
async fn stream_steadily(
    gateway: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
    progress: Arc<std::sync::atomic::AtomicU64>,
    client_id: usize,
) -> (u64, u64, u64) {
    use std::sync::atomic::Ordering;
    let (mut sent, mut answered, mut failed) = (0u64, 0u64, 0u64);
    let c = client();
    while !stop.load(Ordering::Relaxed) {
        let mut body = chat(&format!("client {client_id} request {sent}"), true);
        body["max_tokens"] = json!(48);
        sent += 1;
        let outcome = match c
            .post(format!("{gateway}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
        {
            Ok(r) if r.status() == 200 => match r.text().await {
                Ok(text)
                    if text.trim_end().ends_with("data: [DONE]") && !text.contains("\"error\"") =>
                {
                    Ok(())
                }
                Ok(text) => Err(format!("stream ended badly: {text}")),
                Err(err) => Err(format!("stream cut: {err}")),
            },
            Ok(r) => Err(format!(
                "status {}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            )),
            Err(err) => Err(format!("no answer: {err}")),
        };
        match outcome {
            Ok(()) => {
                answered += 1;
                progress.fetch_add(1, Ordering::Relaxed);
            }
            Err(why) => {
                failed += 1;
                if failed <= 3 {
                    eprintln!("client {client_id}: {why}");
                }
            }
        }
    }
    (sent, answered, failed)
}

/// A rolling update of the workers under steady streaming load: 8 pods,
/// each replaced in turn as a Deployment does it (the new pod starts,
/// turns ready, then the old one terminates, drains and is deleted, and
/// only then its process stops). Every request sent is answered whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_of_8_workers_under_streaming_load_loses_no_request() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let mut worker = fast_worker();
    worker.engine.timing.step_base_us = 1000.0;
    let api = FakeApi::start_new().await;
    let mut old = Vec::new();
    for i in 0..8u8 {
        let (w, addr) = worker_at(10 + i, worker.clone()).await;
        api.put(pod(&format!("old-{i}"), json!({"app": "sglang"}), addr));
        old.push(w);
    }
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 8).await;

    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..4)
        .map(|id| {
            let run = stream_steadily(gw.url.clone(), stop.clone(), progress.clone(), id);
            tokio::spawn(run)
        })
        .collect();
    // Some traffic between steps, so that each old pod leaves with
    // streams in flight.
    let traffic = || async {
        let before = progress.load(Ordering::Relaxed);
        wait_until("traffic", || async {
            progress.load(Ordering::Relaxed) >= before + 12
        })
        .await;
    };
    let mut new = Vec::new();
    for (i, old_worker) in old.into_iter().enumerate() {
        let (w, addr) = worker_at(30 + i as u8, worker.clone()).await;
        let name = format!("new-{i}");
        let fresh = pod(&name, json!({"app": "sglang"}), addr);
        api.put(set_ready(fresh.clone(), false));
        api.put(fresh);
        wait_for_state(&gw.url, &name, "healthy").await;
        traffic().await;
        let leaving = format!("old-{i}");
        api.put(terminating(api.get(&leaving)));
        wait_for_gone(&gw.url, &leaving).await;
        api.delete(&leaving);
        old_worker.stop.cancel();
        new.push(w);
    }
    wait_for_healthy(&gw.url, 8).await;
    traffic().await;
    stop.store(true, Ordering::Relaxed);
    let (mut sent, mut answered, mut failed) = (0, 0, 0);
    for client in clients {
        let (s, a, f) = client.await.unwrap();
        sent += s;
        answered += a;
        failed += f;
    }
    eprintln!("rollout of 8 workers: sent {sent}, answered {answered}, failed {failed}");
    assert!(sent > 0);
    assert_eq!(failed, 0);
    assert_eq!(sent, answered);
    let names: Vec<String> = workers(&gw.url)
        .await
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 8, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("new-")), "{names:?}");
    let metrics = metrics_text(&gw.url).await;
    let drains = metric(&metrics, "radixgate_worker_drains_total{end=\"finished\"}");
    assert_eq!(drains, 8.0, "{metrics}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_pods_are_held_to_the_worker_allowlist() {
    let logs = captured_logs();
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let (_b, b_addr) = worker_at(3, fast_worker()).await;
    let api = FakeApi::start_new().await;
    let a_pod = pod("w-a", json!({"app": "sglang"}), a_addr);
    api.put(a_pod.clone());
    let b_pod = pod("w-outside", json!({"app": "sglang"}), b_addr);
    api.put(b_pod.clone());
    let mut cfg = discovering(&api);
    cfg.server.worker_allowlist = vec!["127.0.0.2/32".into()];
    let gw = gateway(cfg).await;
    wait_for_healthy(&gw.url, 1).await;
    // Another change to the refused pod, then one that is seen: the
    // refused pod was not offered (nor logged) again.
    let mut touched = b_pod;
    touched["metadata"]["labels"]["touched"] = json!("yes");
    api.put(touched);
    api.put(set_ready(a_pod, false));
    wait_for_state(&gw.url, "w-a", "unready").await;
    let list = workers(&gw.url).await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["url"], a.url);
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let refusals = text
        .lines()
        .filter(|l| l.contains("pod not added") && l.contains("llm/w-outside"))
        .count();
    assert_eq!(refusals, 1, "{text}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_kubeconfig_is_a_start_up_error_that_names_it() {
    let mut c = config(&[]);
    c.discovery.enabled = true;
    c.discovery.selector = labels(&[("app", "sglang")]);
    c.discovery.kubeconfig = Some("/nonexistent/kubeconfig.yaml".into());
    let gw = gateway(c).await;
    let err = gw.task.await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains("discovery") && err.contains("/nonexistent/kubeconfig.yaml"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_workers_and_discovered_ones_serve_together() {
    let fixed = sim_worker(fast_worker()).await;
    let (pod_worker, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "sglang"}), addr));
    let mut cfg = discovering(&api);
    cfg.workers = config(&[&fixed.url]).workers;
    let gw = gateway(cfg).await;
    wait_for_healthy(&gw.url, 2).await;
    let urls: Vec<Value> = workers(&gw.url)
        .await
        .iter()
        .map(|w| w["url"].clone())
        .collect();
    assert!(
        urls.contains(&json!(fixed.url)) && urls.contains(&json!(pod_worker.url)),
        "{urls:?}"
    );
    // The pod leaving leaves the static worker alone.
    api.delete("w-0");
    wait_for_gone(&gw.url, "w-0").await;
    assert_all_served_by(&gw.url, &fixed.url, 4, "after the pod left").await;
    gw.shutdown().await;
}

/// A pod at a static worker's URL is refused while that worker is there;
/// once the static worker is removed (DELETE /workers, or a reload that
/// drops it, as when moving a pool from a static list to discovery) the
/// pod, still serving, becomes the worker at that URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_refused_for_a_static_workers_url_gets_it_when_that_one_goes() {
    let (pod_worker, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "sglang"}), addr));
    let mut cfg = discovering(&api);
    cfg.workers = config(&[&pod_worker.url]).workers;
    let gw = gateway(cfg).await;
    wait_for_watch(&api, 1).await;
    wait_for_healthy(&gw.url, 1).await;
    assert!(worker_named(&gw.url, "w-0").await.is_none(), "a duplicate");

    let r = client()
        .delete(format!("{}/workers?url={}", gw.url, pod_worker.url))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    wait_for_state(&gw.url, "w-0", "healthy").await;
    gw.shutdown().await;
}
