//! When the Kubernetes API server breaks: watches dropped and resumed, a
//! `410 Gone` and its relist, lists refused or never answered.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_watch_resumes_from_its_version_and_a_bookmark_moves_it() {
    let (_a, a_addr) = worker_at(2, fast_worker()).await;
    let (b, b_addr) = worker_at(3, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-a", json!({"app": "sglang"}), a_addr));
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 1).await;
    wait_for_watch(&api, 1).await;

    // A change the watcher is seen to apply, then the watch is cut: it
    // resumes from that change's version, without listing again.
    let seen = api.put(pod("w-b", json!({"app": "sglang"}), b_addr));
    wait_for_healthy(&gw.url, 2).await;
    assert_eq!(worker_named(&gw.url, "w-b").await.unwrap()["url"], b.url);
    api.drop_watches();
    wait_for_watch(&api, 2).await;
    let last_watch = || {
        api.requests()
            .into_iter()
            .rfind(|r| r.starts_with("watch"))
            .unwrap()
    };
    assert!(
        last_watch().starts_with(&format!("watch rv={seen} ")),
        "resumed from {seen}: {:?}",
        api.requests()
    );

    // A bookmark moves the version to resume from, with no pod changed.
    // Whether the watcher read it before the cut is up to the scheduler,
    // so cut again (waiting a little longer each time) until it had.
    let mut resumed_from_bookmark = false;
    for attempt in 1..=50u64 {
        let watches = api
            .requests()
            .iter()
            .filter(|r| r.starts_with("watch"))
            .count();
        let mark = api.bookmark();
        tokio::time::sleep(std::time::Duration::from_millis(20 * attempt)).await;
        api.drop_watches();
        wait_for_watch(&api, watches + 1).await;
        if last_watch().starts_with(&format!("watch rv={mark} ")) {
            resumed_from_bookmark = true;
            break;
        }
    }
    assert!(resumed_from_bookmark, "{:?}", api.requests());
    let requests = api.requests();
    assert_eq!(
        requests.iter().filter(|r| r.starts_with("list")).count(),
        1,
        "cut watches are resumed, not relisted: {requests:?}"
    );
    // The resumed watch carries on.
    api.put(set_ready(api.get("w-b"), false));
    wait_for_state(&gw.url, "w-b", "unready").await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_restarting_keeps_routing_and_a_410_relists() {
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let (_b, b_addr) = worker_at(3, fast_worker()).await;
    let (c, c_addr) = worker_at(4, fast_worker()).await;
    let mut api = FakeApi::start_new().await;
    api.put(pod("w-a", json!({"app": "sglang"}), a_addr));
    api.put(pod("w-b", json!({"app": "sglang"}), b_addr));
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 2).await;

    api.stop().await;
    wait_until("discovery disconnected", || async {
        metric(
            &metrics_text(&gw.url).await,
            "radixgate_discovery_connected{selector=\"app=sglang\"}",
        ) == 0.0
    })
    .await;
    // Routing goes on with what is known.
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("while the API server is away", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // While it is away, w-b goes and w-c comes, and history is compacted:
    // the watch cannot resume (410 Gone) and must list again.
    api.delete("w-b");
    api.put(pod("w-c", json!({"app": "sglang"}), c_addr));
    api.compact();
    api.start().await;
    wait_until("w-b gone and w-c added after the relist", || async {
        let list = workers(&gw.url).await;
        let urls: Vec<&str> = list.iter().filter_map(|w| w["url"].as_str()).collect();
        urls.len() == 2 && urls.contains(&a.url.as_str()) && urls.contains(&c.url.as_str())
    })
    .await;
    let requests = api.requests();
    assert_eq!(
        requests.iter().filter(|r| r.starts_with("list")).count(),
        2,
        "410 Gone relists: {requests:?}"
    );
    wait_until("discovery connected", || async {
        metric(
            &metrics_text(&gw.url).await,
            "radixgate_discovery_connected{selector=\"app=sglang\"}",
        ) == 1.0
    })
    .await;
    let metrics = metrics_text(&gw.url).await;
    assert!(
        metric(
            &metrics,
            "radixgate_discovery_events_total{event=\"error\"}"
        ) >= 1.0
    );
    assert_eq!(
        metric(
            &metrics,
            "radixgate_discovery_events_total{event=\"relisted\"}"
        ),
        2.0
    );
    gw.shutdown().await;
}

/// The API server restarts (a control-plane upgrade) and nothing changed
/// meanwhile: the watch resumes, no list and no event follow, and
/// `radixgate_discovery_connected` reads 1 again all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_after_an_outage_reads_connected_with_no_pod_changed() {
    let (_w, addr) = worker_at(2, fast_worker()).await;
    let mut api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "sglang"}), addr));
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 1).await;
    wait_for_watch(&api, 1).await;

    api.stop().await;
    wait_until("discovery disconnected", || async {
        connected(&gw.url, "app=sglang").await == 0.0
    })
    .await;
    let watches = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("watch"))
        .count();
    api.start().await;
    wait_for_watch(&api, watches + 1).await;
    wait_until("discovery connected again", || async {
        connected(&gw.url, "app=sglang").await == 1.0
    })
    .await;
    assert_eq!(
        lists(&api),
        1,
        "resumed, not relisted: {:?}",
        api.requests()
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_refused_for_want_of_rbac_is_retried_with_growing_back_off() {
    let logs = captured_logs();
    let (_w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "forbidden"}), addr));
    api.answer_lists(Lists::Status(403));
    let mut cfg = discovering(&api);
    // Its own selector, to tell its log lines from other tests'.
    cfg.discovery.selector = labels(&[("app", "forbidden")]);
    let gw = gateway(cfg).await;
    wait_until("a first list", || async { lists(&api) >= 1 }).await;
    // Back-off from 0.8 s, doubling (plus up to as much again of jitter):
    // the fourth try comes 5.6 s or more after the first. Retried every
    // 0.8 to 1.6 s, it would have come by 4.8 s.
    let start = Instant::now();
    let mut gauge = Vec::new();
    while start.elapsed() < Duration::from_millis(5400) {
        gauge.push(connected(&gw.url, "app=forbidden").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tries = lists(&api);
    assert!(
        (2..=3).contains(&tries),
        "{tries} lists in 5.4 s: {:?}",
        api.requests()
    );
    assert!(gauge.iter().all(|g| *g == 0.0), "{gauge:?}");
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let lines = |needle: &str| {
        text.lines()
            .filter(|l| l.contains("selector=app=forbidden") && l.contains(needle))
            .count()
    };
    assert_eq!(lines("answers again"), 0, "{text}");
    assert_eq!(lines("watch failed"), 1, "one WARN a minute:\n{text}");
    assert!(workers(&gw.url).await.is_empty());
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_never_answered_is_given_up_on_and_retried() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "sglang"}), addr));
    api.answer_lists(Lists::Silence);
    let mut cfg = discovering(&api);
    // Watches of 1 s, so an answer silent for 2 s is given up on.
    cfg.discovery.watch_timeout_secs = 1;
    let gw = gateway(cfg).await;
    wait_until("a first list", || async { lists(&api) >= 1 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        connected(&gw.url, "app=sglang").await,
        0.0,
        "connected while the list is unanswered"
    );
    assert!(workers(&gw.url).await.is_empty());

    // The API server answers again: a later list is, and the pod found.
    api.answer_lists(Lists::Pods);
    wait_for_healthy(&gw.url, 1).await;
    assert_eq!(worker_named(&gw.url, "w-0").await.unwrap()["url"], w.url);
    assert!(lists(&api) >= 2, "{:?}", api.requests());
    wait_until("discovery connected", || async {
        connected(&gw.url, "app=sglang").await == 1.0
    })
    .await;
    // Idle watches end after their timeout and resume; no error.
    wait_for_watch(&api, 3).await;
    api.put(set_ready(api.get("w-0"), false));
    wait_for_state(&gw.url, "w-0", "unready").await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_took_a_departed_pods_address_during_a_relist_is_a_worker() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let mut api = FakeApi::start_new().await;
    api.put(pod("old-0", json!({"app": "sglang"}), addr));
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 1).await;

    // While the watch is down, the pod goes and a new one gets its IP and
    // port; history is compacted, so the watch lists again (410 Gone),
    // and the list has the new pod, not the old one.
    api.stop().await;
    api.delete("old-0");
    api.put(pod("new-0", json!({"app": "sglang"}), addr));
    api.compact();
    api.start().await;
    wait_until("new-0 the worker at the address", || async {
        let list = workers(&gw.url).await;
        list.len() == 1 && list[0]["name"] == "new-0" && list[0]["state"] == "healthy"
    })
    .await;
    assert_eq!(worker_named(&gw.url, "new-0").await.unwrap()["url"], w.url);
    assert_all_served_by(&gw.url, &w.url, 4, "after the relist").await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_label_change_gives_the_worker_its_new_model() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    let p = pod("w-0", json!({"app": "sglang", "model": "model-a"}), addr);
    api.put(p.clone());
    let mut cfg = discovering(&api);
    cfg.discovery.model_id_from = Some(ModelIdFrom::Label("model".into()));
    let gw = gateway(cfg).await;
    wait_for_healthy(&gw.url, 1).await;
    assert_eq!(model_ids(&gw.url).await, ["model-a"]);

    let mut relabelled = p;
    relabelled["metadata"]["labels"]["model"] = json!("model-b");
    api.put(relabelled);
    wait_until("w-0 serving model-b", || async {
        model_ids(&gw.url).await == ["model-b"]
            && worker_named(&gw.url, "w-0")
                .await
                .is_some_and(|w| w["state"] == "healthy")
    })
    .await;
    assert_eq!(worker_named(&gw.url, "w-0").await.unwrap()["url"], w.url);
    gw.shutdown().await;
}

/// Whether the captured logs have a line with all of `needles`.
fn logged(logs: &Mutex<Vec<u8>>, needles: &[&str]) -> bool {
    String::from_utf8_lossy(&logs.lock().unwrap())
        .lines()
        .any(|l| needles.iter().all(|n| l.contains(n)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_answer_past_its_bound_is_refused_and_retried() {
    let logs = captured_logs();
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "padded"}), addr));
    // Valid JSON (the list, then whitespace), but past 64 MiB.
    api.answer_lists(Lists::Padded(65 << 20));
    let mut cfg = discovering(&api);
    cfg.discovery.selector = labels(&[("app", "padded")]);
    let gw = gateway(cfg).await;
    wait_until("the list refused", || async {
        logged(
            &logs,
            &["selector=app=padded", "watch failed", "over 64 MiB"],
        )
    })
    .await;
    assert!(workers(&gw.url).await.is_empty());
    assert_eq!(connected(&gw.url, "app=padded").await, 0.0);

    api.answer_lists(Lists::Pods);
    wait_for_healthy(&gw.url, 1).await;
    assert_eq!(worker_named(&gw.url, "w-0").await.unwrap()["url"], w.url);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_event_past_its_bound_is_refused_and_the_known_workers_serve_on() {
    let logs = captured_logs();
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let (b, b_addr) = worker_at(3, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-a", json!({"app": "huge"}), a_addr));
    let mut cfg = discovering(&api);
    cfg.discovery.selector = labels(&[("app", "huge")]);
    let gw = gateway(cfg).await;
    wait_for_healthy(&gw.url, 1).await;
    wait_for_watch(&api, 1).await;

    // One event of 17 MiB: a pod with a huge annotation.
    let mut huge = pod("w-b", json!({"app": "huge"}), b_addr);
    huge["metadata"]["annotations"]["filler"] = json!("x".repeat(17 << 20));
    api.put(huge);
    wait_until("the event refused", || async {
        logged(&logs, &["selector=app=huge", "watch failed", "over 16 MiB"])
    })
    .await;
    let list = workers(&gw.url).await;
    assert_eq!(list.len(), 1, "{list:?}");
    assert_all_served_by(&gw.url, &a.url, 4, "while the watch fails").await;

    // Resumed, the watch meets the event again until history is
    // compacted; the list that follows has the pod (a list's bound is
    // larger than an event's).
    api.compact();
    api.drop_watches();
    wait_for_healthy(&gw.url, 2).await;
    assert_eq!(worker_named(&gw.url, "w-b").await.unwrap()["url"], b.url);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_trickles_on_forever_is_given_up_on_and_retried() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "sglang"}), addr));
    api.answer_lists(Lists::Trickle);
    let mut cfg = discovering(&api);
    // Watches of 1 s, so an answer not over in 2 s is given up on.
    cfg.discovery.watch_timeout_secs = 1;
    let gw = gateway(cfg).await;
    wait_until("a second list", || async { lists(&api) >= 2 }).await;
    assert!(workers(&gw.url).await.is_empty());
    assert_eq!(connected(&gw.url, "app=sglang").await, 0.0);

    api.answer_lists(Lists::Pods);
    wait_for_healthy(&gw.url, 1).await;
    assert_eq!(worker_named(&gw.url, "w-0").await.unwrap()["url"], w.url);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_refused_with_410_gone_as_its_status_relists() {
    let (a, a_addr) = worker_at(2, fast_worker()).await;
    let (_b, b_addr) = worker_at(3, fast_worker()).await;
    let (c, c_addr) = worker_at(4, fast_worker()).await;
    let mut api = FakeApi::start_new().await;
    api.refuse_stale_watches();
    api.put(pod("w-a", json!({"app": "sglang"}), a_addr));
    api.put(pod("w-b", json!({"app": "sglang"}), b_addr));
    let gw = gateway(discovering(&api)).await;
    wait_for_healthy(&gw.url, 2).await;
    wait_for_watch(&api, 1).await;

    // While the watch is down, w-b goes and w-c comes, and history is
    // compacted: resuming is refused with 410, so the watch lists again.
    api.stop().await;
    api.delete("w-b");
    api.put(pod("w-c", json!({"app": "sglang"}), c_addr));
    api.compact();
    api.start().await;
    wait_until("w-b gone and w-c added after the relist", || async {
        let list = workers(&gw.url).await;
        let urls: Vec<&str> = list.iter().filter_map(|w| w["url"].as_str()).collect();
        urls.len() == 2 && urls.contains(&a.url.as_str()) && urls.contains(&c.url.as_str())
    })
    .await;
    assert_eq!(lists(&api), 2, "{:?}", api.requests());
    gw.shutdown().await;
}

/// The router's service account may not list pods (RBAC missing, or the
/// wrong namespace): clients and `/readiness` say that discovery is
/// refused and why, not that the pool is empty and workers should be
/// added by URL; once the API server lists the pods, that note goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_refused_for_want_of_rbac_is_named_in_503s_and_readiness() {
    let (w, addr) = worker_at(2, fast_worker()).await;
    let api = FakeApi::start_new().await;
    api.put(pod("w-0", json!({"app": "sglang"}), addr));
    api.answer_lists(Lists::Status(403));
    let gw = gateway(discovering(&api)).await;
    let ready = || async {
        let r = client()
            .get(format!("{}/readiness", gw.url))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    wait_until("the refusal on /readiness", || async {
        ready().await.1["discovery"][0]["problem"]
            .as_str()
            .is_some_and(|p| p.contains("403"))
    })
    .await;
    let (status, body) = ready().await;
    assert_eq!(status, 503, "{body}");
    let watch = &body["discovery"][0];
    assert_eq!(watch["selector"], "app=sglang", "{body}");
    assert_eq!(watch["namespace"], "llm", "{body}");
    assert_eq!(watch["connected"], false, "{body}");
    let problem = watch["problem"].as_str().unwrap();
    assert!(
        problem.contains("pods is forbidden") && problem.contains("`list` and `watch`"),
        "{problem}"
    );

    let r = post_chat(&gw.url, &chat("while discovery is refused", false)).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("discovery of pods `app=sglang` in namespace llm")
            && message.contains("403")
            && !message.contains("--worker-urls"),
        "{message}"
    );

    // Allowed: the pod found, and the note gone.
    api.answer_lists(Lists::Pods);
    wait_for_healthy(&gw.url, 1).await;
    assert_eq!(worker_named(&gw.url, "w-0").await.unwrap()["url"], w.url);
    wait_until("the note gone", || async {
        let body = ready().await.1;
        body["discovery"][0]["connected"] == true && body["discovery"][0]["problem"].is_null()
    })
    .await;
    gw.shutdown().await;
}

/// Discovery works but no pod matches (a selector with a typo): the 503
/// says what discovery watches, not to add workers by URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_that_matches_no_pod_is_named_in_503s() {
    let api = FakeApi::start_new().await;
    let gw = gateway(discovering(&api)).await;
    wait_until("the list done", || async {
        get_json(&gw.url, "/readiness").await["discovery"][0]["connected"] == true
    })
    .await;
    let r = post_chat(&gw.url, &chat("no pod", false)).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("discovery of pods `app=sglang` in namespace llm has found none serving")
            && !message.contains("--worker-urls"),
        "{message}"
    );
    gw.shutdown().await;
}
