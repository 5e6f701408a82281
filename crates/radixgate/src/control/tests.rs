//! The control task against workers on loopback: what it makes of its
//! health checkers' reports while the worker set changes.

use super::*;
use crate::allowlist::Allowlist;
use crate::metrics::Metrics;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use radixgate_routing::PolicyConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

fn control(stop: &CancellationToken) -> Control {
    let health = HealthConfig {
        interval_secs: 1,
        success_threshold: 1,
        unhealthy_backoff_initial_ms: 20,
        unhealthy_backoff_max_ms: 50,
        ..HealthConfig::default()
    };
    let (control, _task) = spawn(
        Registry::new(PolicyConfig::default().build().unwrap()),
        crate::upstream::client().unwrap(),
        Settings {
            health,
            allowlist: Allowlist::default(),
            drain_timeout: Duration::from_secs(1),
        },
        &Metrics::new(),
        stop.clone(),
    );
    control
}

/// A worker whose `/health` answers 200 while `up`, and whose first
/// `/v1/models` answer (`old`) waits for `release`, telling `asked`.
struct Scripted {
    up: AtomicBool,
    asked: Notify,
    release: Notify,
}

async fn serve(script: Arc<Scripted>) -> String {
    let health = {
        let script = script.clone();
        move || async move {
            if script.up.load(Ordering::SeqCst) {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    };
    let models = move || async move {
        script.asked.notify_one();
        script.release.notified().await;
        axum::Json(serde_json::json!({"data": [{"id": "old"}]}))
    };
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

fn one<'a>(list: &'a [WorkerStatus], url: &str) -> &'a WorkerStatus {
    list.iter().find(|w| w.url == url).expect("listed")
}

#[tokio::test]
async fn a_removed_workers_late_admission_does_not_admit_its_successor() {
    let stop = CancellationToken::new();
    let control = control(&stop);
    let script = Arc::new(Scripted {
        up: AtomicBool::new(true),
        asked: Notify::new(),
        release: Notify::new(),
    });
    let url = serve(script.clone()).await;
    control.add_configured(WorkerSpec::new(&url)).await.unwrap();
    // Its first probe passed; its checker asks which models it serves.
    script.asked.notified().await;

    // Meanwhile the worker goes down and is replaced at its URL (a
    // reload that changed its models, a pod that changed its label).
    script.up.store(false, Ordering::SeqCst);
    control.remove(url.clone()).await.unwrap();
    control
        .add_configured(WorkerSpec::new(&url).with_models(["new"]))
        .await
        .unwrap();
    // The removed worker's checker gets its answer and asks to admit.
    script.release.notify_one();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let list = control.list().await;
    assert_eq!(
        one(&list, &url).state,
        "pending",
        "the new worker's probes fail: {list:?}"
    );

    script.up.store(true, Ordering::SeqCst);
    loop {
        let list = control.list().await;
        let w = one(&list, &url);
        if w.state == "healthy" {
            assert_eq!(w.models, ["new"], "{list:?}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
}

/// Which changes of a worker's model list are adapters loaded or
/// unloaded (the worker relisted in place), and which a restart.
#[test]
fn only_adapters_coming_and_going_keep_the_worker() {
    use radixgate_routing::ModelOrigin;
    let origin = |parent: Option<&str>, root: &str| ModelOrigin {
        parent: parent.map(str::to_owned),
        root: Some(root.to_owned()),
    };
    let served = |entries: &[(&str, Option<&str>, &str)], max_model_len| Served {
        models: entries.iter().map(|e| e.0.to_owned()).collect(),
        origins: entries
            .iter()
            .map(|&(id, parent, root)| (id.to_owned(), origin(parent, root)))
            .collect(),
        max_model_len,
    };
    let base = ("base", None, "/m/base");
    let sql = ("sql", Some("base"), "/a/sql");
    let chat = ("chat", Some("base"), "/a/chat");
    let was = served(&[base, sql], Some(4096));
    assert!(adapters_only(&was, &served(&[base, sql, chat], Some(4096))));
    assert!(adapters_only(&was, &served(&[base], Some(4096))));
    assert!(adapters_only(&was, &served(&[chat, base], Some(4096))));
    // Another base model, or the same name from elsewhere: a restart.
    assert!(!adapters_only(
        &was,
        &served(&[("other", None, "/m/o"), sql], Some(4096))
    ));
    assert!(!adapters_only(
        &was,
        &served(&[("base", None, "/m/v2"), sql], Some(4096))
    ));
    assert!(!adapters_only(
        &was,
        &served(&[base, ("more", None, "/m/more"), sql], Some(4096))
    ));
    assert!(!adapters_only(&was, &served(&[base, sql], Some(8192))));
    // Entries that name no parent: any change is a restart.
    let plain = |ids: &[&str]| Served {
        models: ids.iter().map(|&m| m.to_owned()).collect(),
        ..Served::default()
    };
    assert!(!adapters_only(&plain(&["a"]), &plain(&["a", "b"])));
    // A worker that named no model served any.
    assert!(!adapters_only(&plain(&[]), &served(&[base], None)));
}
