//! Discovery beside a configuration reload: the file's static workers and
//! the discovered pods at the same addresses.

use super::*;
use radixgate::reload::{self, Reload};
use tokio_util::sync::CancellationToken;

/// A gateway whose reloads switch to what `next` holds then.
async fn reloadable(config: Config) -> (Gateway, Reload, Arc<Mutex<Config>>) {
    let next = Arc::new(Mutex::new(config.clone()));
    let loader = next.clone();
    let (reload, reloads) = reload::channel(Box::new(move || Ok(loader.lock().unwrap().clone())));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let task = tokio::spawn(radixgate::server::run_reloadable(
        listener,
        config,
        reloads,
        stop.clone(),
        CancellationToken::new(),
    ));
    (Gateway { url, stop, task }, reload, next)
}

/// The operator lists a discovered pod's URL among the file's workers
/// (on the way from discovery to a static list, say), then takes it out
/// again. The pod's worker held that URL all along: the reload that drops
/// the entry must leave it, or the pod, ready and unchanged, is out of
/// the pool for good (discovery offers a pod again only when it changes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_lists_then_drops_a_pods_url_leaves_the_pods_worker() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "sglang"}), addr));
    let (gw, reload, next) = reloadable(discovering(&api)).await;
    wait_for_healthy(&gw.url, 1).await;
    wait_for_watch(&api, 1).await;

    next.lock().unwrap().workers = config(&[&w.url]).workers;
    let changes = reload.reload().await.unwrap();
    assert!(
        changes.workers_added.is_empty(),
        "the pod holds its URL: {changes:?}"
    );
    assert_eq!(workers(&gw.url).await.len(), 1);

    next.lock().unwrap().workers = Vec::new();
    reload.reload().await.unwrap();
    let entry = worker_named(&gw.url, "w-0").await;
    assert!(
        entry.as_ref().is_some_and(|e| e["state"] == "healthy"),
        "{entry:?}"
    );
    assert_all_served_by(&gw.url, &w.url, 4, "after the reloads").await;
    gw.shutdown().await;
}

/// A static worker removed through the admin API, its address then taken
/// by the pod refused for it: a reload that drops the static entry
/// leaves the pod's worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_drops_a_static_entry_a_pod_took_over_leaves_the_pods_worker() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "sglang"}), addr));
    let mut cfg = discovering(&api);
    cfg.workers = config(&[&w.url]).workers;
    let (gw, reload, next) = reloadable(cfg).await;
    wait_for_watch(&api, 1).await;
    wait_for_healthy(&gw.url, 1).await;
    remove_worker(&gw.url, &w.url).await;
    wait_for_state(&gw.url, "w-0", "healthy").await;

    next.lock().unwrap().workers = Vec::new();
    reload.reload().await.unwrap();
    let entry = worker_named(&gw.url, "w-0").await;
    assert!(
        entry.as_ref().is_some_and(|e| e["state"] == "healthy"),
        "{entry:?}"
    );
    gw.shutdown().await;
}
