//! A pool's watch driven by hand, event by event, against a real control
//! task (no API server: `handle` is what the watcher's events reach).

use super::*;
use crate::allowlist::Allowlist;
use crate::config::HealthConfig;
use crate::control;
use radixgate_routing::{PolicyConfig, Registry, WorkerRole};
use serde_json::{Value, json};

/// A watch of `app=sglang` whose control task takes workers in
/// 10.0.0.0/8 only.
fn watch(stop: &CancellationToken) -> PoolWatch {
    let metrics = Metrics::new();
    let (control, _task) = control::spawn(
        Registry::new(PolicyConfig::default().build().unwrap()),
        crate::upstream::client().unwrap(),
        control::Settings {
            health: HealthConfig::default(),
            allowlist: Allowlist::parse(&["10.0.0.0/8".into()]).unwrap(),
            drain_timeout: Duration::from_secs(1),
        },
        &metrics,
        stop.clone(),
    );
    // Never asked: events are handed to the watch directly.
    let kube =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    PoolWatch {
        api: Api::namespaced(kube, "llm"),
        answered: Arc::default(),
        pool: Pool {
            selector: "app=sglang".into(),
            name: "app=sglang".into(),
            namespace: Some("llm".into()),
            port: 8000,
            port_annotation: None,
            model_id_from: None,
            models: Vec::new(),
            role: WorkerRole::Regular,
            bootstrap_port: None,
            bootstrap_port_annotation: None,
        },
        watch_timeout_secs: 290,
        freed: control.freed(),
        control,
        metrics: Arc::new(DiscoveryMetrics {
            connected: metrics.gauges(&CONNECTED),
            events: metrics.labelled_counters(&EVENTS, "event"),
        }),
        pods: BTreeMap::new(),
        listing: None,
        complained: BTreeMap::new(),
        refused: BTreeMap::new(),
    }
}

fn pod(name: &str, version: u64, patch: impl FnOnce(&mut Value)) -> RawPod {
    let mut body = json!({
        "metadata": {"name": name, "namespace": "llm", "resourceVersion": version.to_string(),
                     "labels": {"app": "sglang"}},
        "status": {"phase": "Running", "podIP": "10.0.0.5",
                   "conditions": [{"type": "Ready", "status": "True"}]}
    });
    patch(&mut body);
    serde_json::from_value(body).unwrap()
}

/// Outside the allowlist: refused by the control task.
fn outside(body: &mut Value) {
    body["status"]["podIP"] = json!("192.168.0.5");
}

/// A pod IP that is no IP: malformed.
fn malformed(body: &mut Value) {
    body["status"]["podIP"] = json!("not-an-ip");
}

#[tokio::test]
async fn pods_that_never_became_workers_are_forgotten_when_they_go() {
    let stop = CancellationToken::new();
    let mut watch = watch(&stop);
    watch.handle(Event::Apply(pod("refused", 1, outside))).await;
    watch.handle(Event::Apply(pod("bad", 2, malformed))).await;
    assert!(watch.refused.contains_key("llm/refused"));
    assert!(watch.complained.contains_key("llm/bad"));

    // Deleted while watched.
    watch
        .handle(Event::Delete(pod("refused", 3, outside)))
        .await;
    watch.handle(Event::Delete(pod("bad", 4, malformed))).await;
    assert!(watch.refused.is_empty(), "{:?}", watch.refused.keys());
    assert!(watch.complained.is_empty(), "{:?}", watch.complained);

    // Deleted while the watch was down: not in the next list.
    watch.handle(Event::Apply(pod("refused", 5, outside))).await;
    watch.handle(Event::Apply(pod("bad", 6, malformed))).await;
    watch.handle(Event::Init).await;
    watch.handle(Event::InitDone).await;
    assert!(watch.refused.is_empty(), "{:?}", watch.refused.keys());
    assert!(watch.complained.is_empty(), "{:?}", watch.complained);
    stop.cancel();
}

#[tokio::test]
async fn a_pod_refused_for_another_pods_address_gets_it_when_that_one_moves() {
    let stop = CancellationToken::new();
    let mut watch = watch(&stop);
    let at = |ip: &'static str| move |body: &mut Value| body["status"]["podIP"] = json!(ip);
    watch
        .handle(Event::Apply(pod("a", 1, at("10.0.0.5"))))
        .await;
    watch
        .handle(Event::Apply(pod("b", 2, at("10.0.0.5"))))
        .await;
    assert!(watch.refused.contains_key("llm/b"), "a duplicate URL");

    watch
        .handle(Event::Apply(pod("a", 3, at("10.0.0.6"))))
        .await;
    let urls: Vec<(&str, &str)> = watch
        .pods
        .iter()
        .map(|(key, tracked)| (key.as_str(), tracked.url.as_str()))
        .collect();
    assert_eq!(
        urls,
        [
            ("llm/a", "http://10.0.0.6:8000"),
            ("llm/b", "http://10.0.0.5:8000")
        ]
    );
    assert!(watch.refused.is_empty());
    stop.cancel();
}

#[test]
fn an_excerpt_keeps_short_text_and_cuts_long_text_at_a_character() {
    assert_eq!(excerpt("short"), "short");
    let long = "é".repeat(LOGGED_TEXT);
    let cut = excerpt(&long);
    assert!(cut.starts_with(&"é".repeat(LOGGED_TEXT / 2)), "{cut}");
    assert!(
        cut.ends_with(&format!("... ({} bytes)", 2 * LOGGED_TEXT)),
        "{cut}"
    );
    assert!(cut.len() < LOGGED_TEXT + 32);
}

#[tokio::test]
async fn a_pod_on_port_80_refused_for_a_static_workers_url_gets_it_when_that_one_goes() {
    // Port 80, the default: the control task spells the URL without it.
    let stop = CancellationToken::new();
    let mut watch = watch(&stop);
    watch.pool.port = 80;
    let control = watch.control.clone();
    control
        .add_configured(WorkerSpec::new("http://10.0.0.5"))
        .await
        .unwrap();
    watch.handle(Event::Apply(pod("a", 1, |_| {}))).await;
    assert!(watch.refused.contains_key("llm/a"), "a duplicate URL");

    control.remove("http://10.0.0.5".into()).await.unwrap();
    let freed = watch.freed.recv().await;
    watch.let_go(freed).await;
    assert!(watch.refused.is_empty(), "{:?}", watch.refused.keys());
    let urls: Vec<&str> = watch.pods.values().map(|t| t.url.as_str()).collect();
    assert_eq!(urls, ["http://10.0.0.5"]);
    let listed: Vec<String> = control
        .list()
        .await
        .into_iter()
        .map(|w| w.url.to_string())
        .collect();
    assert_eq!(listed, ["http://10.0.0.5"]);
    stop.cancel();
}
