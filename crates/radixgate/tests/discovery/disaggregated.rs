//! A disaggregated pool discovered by role, with bootstrap ports.

use super::*;

/// An engine on `127.0.0.<host>` that answers chat completions as
/// `from-<name>` and keeps every body it was sent.
async fn recording_engine(host: u8, name: &'static str) -> (SocketAddr, Arc<Mutex<Vec<Value>>>) {
    use axum::routing::{get, post};
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = bodies.clone();
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(|| async { axum::Json(json!({"data": [{"id": "pd-model"}]})) }),
        )
        .route(
            "/v1/chat/completions",
            post(move |axum::Json(body): axum::Json<Value>| {
                let kept = kept.clone();
                async move {
                    kept.lock().unwrap().push(body);
                    axum::Json(json!({
                        "id": "cmpl-1",
                        "object": "chat.completion",
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": format!("from-{name}")}}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                    }))
                }
            }),
        );
    let listener = TcpListener::bind(("127.0.0.".to_owned() + &host.to_string(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, bodies)
}

/// smg's annotation for a prefill pod's bootstrap port, radixgate's default.
const BOOTSTRAP: &str = "sglang.ai/bootstrap-port";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_pool_is_discovered_by_role_with_bootstrap_ports() {
    let logs = captured_logs();
    let (p0, _) = recording_engine(2, "p0").await;
    let (p1, _) = recording_engine(3, "p1").await;
    let (d0, decoded) = recording_engine(4, "d0").await;
    let (bad, _) = recording_engine(5, "bad").await;
    let api = FakeApi::start_new().await;
    let prefill = json!({"app": "sglang", "component": "prefill"});
    let mut p0_pod = pod("p-0", prefill.clone(), p0);
    p0_pod["metadata"]["annotations"][BOOTSTRAP] = json!("9100");
    api.put(p0_pod.clone());
    // No annotation: the pool's fixed bootstrap port.
    api.put(pod("p-1", prefill.clone(), p1));
    // An annotation that is no port: skipped, never guessed around.
    let mut bad_pod = pod("p-bad", prefill.clone(), bad);
    bad_pod["metadata"]["annotations"][BOOTSTRAP] = json!("eighty");
    api.put(bad_pod);
    // A decode pod's bootstrap annotation is not read.
    let mut d0_pod = pod("d-0", json!({"app": "sglang", "component": "decode"}), d0);
    d0_pod["metadata"]["annotations"][BOOTSTRAP] = json!("9300");
    api.put(d0_pod);
    // A regular pod of the same app is in neither pool.
    let (_other, other_addr) = worker_at(6, fast_worker()).await;
    api.put(pod("w-0", json!({"app": "sglang"}), other_addr));

    let mut cfg = discovering(&api);
    cfg.pd.enabled = true;
    // Every request through both pools (short prompts would skip prefill).
    cfg.pd.skip_prefill_max_uncached_tokens = 0;
    cfg.discovery.selector = BTreeMap::new();
    cfg.discovery.pools = vec![
        PoolConfig {
            selector: labels(&[("app", "sglang"), ("component", "prefill")]),
            role: WorkerRole::Prefill,
            bootstrap_port: Some(8998),
            ..PoolConfig::default()
        },
        PoolConfig {
            selector: labels(&[("app", "sglang"), ("component", "decode")]),
            role: WorkerRole::Decode,
            ..PoolConfig::default()
        },
    ];
    cfg.validate().unwrap();
    let gw = gateway(cfg).await;
    wait_for_healthy(&gw.url, 3).await;
    wait_for_watch(&api, 2).await;
    let listed = |w: &Value| {
        (
            w["name"].as_str().unwrap().to_owned(),
            w["role"].as_str().unwrap_or("regular").to_owned(),
            w["bootstrap_port"].as_u64(),
        )
    };
    let mut seen: Vec<_> = workers(&gw.url).await.iter().map(listed).collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("d-0".to_owned(), "decode".to_owned(), None),
            ("p-0".to_owned(), "prefill".to_owned(), Some(9100)),
            ("p-1".to_owned(), "prefill".to_owned(), Some(8998)),
        ]
    );
    let metrics = metrics_text(&gw.url).await;
    assert!(
        metric(
            &metrics,
            "radixgate_discovery_events_total{event=\"malformed\"}"
        ) >= 1.0,
        "{metrics}"
    );
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        text.lines()
            .any(|l| l.contains("skipping a malformed pod object")
                && l.contains("pod=llm/p-bad")
                && l.contains("annotation sglang.ai/bootstrap-port=`eighty` is not a port")),
        "no malformed-object line for p-bad in:\n{text}"
    );

    // Requests reach decode with their prefill pod's address and port.
    for i in 0..6 {
        let r = client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&json!({"model": "pd-model", "messages": [{"role": "user", "content": format!("question {i}")}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["choices"][0]["message"]["content"], "from-d0");
    }
    let pairs: Vec<(String, u64)> = decoded
        .lock()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["bootstrap_host"].as_str().unwrap().to_owned(),
                b["bootstrap_port"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(pairs.len(), 6);
    for pair in &pairs {
        assert!(
            [
                ("127.0.0.2".to_owned(), 9100),
                ("127.0.0.3".to_owned(), 8998)
            ]
            .contains(pair),
            "{pairs:?}"
        );
    }

    // A new bootstrap port on the same address replaces the worker.
    p0_pod["metadata"]["annotations"][BOOTSTRAP] = json!("9200");
    api.put(p0_pod);
    wait_until("p-0 with its new bootstrap port", || async {
        worker_named(&gw.url, "p-0")
            .await
            .is_some_and(|w| w["bootstrap_port"] == 9200 && w["state"] == "healthy")
    })
    .await;
    gw.shutdown().await;
}
