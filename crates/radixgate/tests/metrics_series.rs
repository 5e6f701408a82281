//! The exported `/metrics` series after a fixed script of requests and
//! events, against a committed list (`tests/golden/metrics_series.txt`).
//!
//! This pins what a scrape shows — every family's name, type and help text,
//! every series' labels in their rendered order, histogram buckets, and the
//! values that do not depend on timing (counters, gauges, histogram counts)
//! — so that moving metric code between modules cannot change it unnoticed.
//! The renderer's family order is a hash map's, so lines are compared
//! sorted. The worker's URL (a random port) is written as `W`.
//!
//! Replica sync's families (`radixgate_sync_*`) are pinned apart, in
//! `tests/golden/metrics_series_sync.txt`, from two replicas on a real
//! `nats-server` started by the test; their values depend on batch timing,
//! so only the names, types, help texts and label sets are compared.
//!
//! After an intended change to the exported metrics, regenerate the lists
//! with `RADIXGATE_BLESS=1 cargo test -p radixgate --test metrics_series`
//! and review their diff.
//!
//! The reference for operators, `docs/metrics.md`, is checked here too:
//! one row for every family the source defines, none for another.

mod common;
mod sync_support;

use common::*;
use radixgate_sim::server::FaultConfig;
use serde_json::json;
use std::collections::HashMap;

const GOLDEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/golden/metrics_series.txt"
);
const GOLDEN_SYNC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/golden/metrics_series_sync.txt"
);

/// Compares `got` with the committed list at `path` (or writes it, when
/// blessing).
fn check_golden(path: &str, got: &str, scrape: &str) {
    if std::env::var_os("RADIXGATE_BLESS").is_some() {
        std::fs::write(path, got).unwrap();
    }
    let want = std::fs::read_to_string(path).expect("the committed list");
    assert_eq!(got, want, "/metrics series changed; full scrape:\n{scrape}");
}

/// One line per rendered sample: `family type "help" | series = value`,
/// sorted; timing-dependent values (buckets, sums, open connections)
/// read `*`.
fn series(text: &str, worker: &str) -> Vec<String> {
    let mut help: HashMap<&str, &str> = HashMap::new();
    let mut kind: HashMap<&str, &str> = HashMap::new();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').expect("help text");
            help.insert(name, text);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, text) = rest.split_once(' ').expect("type");
            kind.insert(name, text);
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample value");
        let name = series.split('{').next().expect("name");
        let (family, value) = match ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| kind.contains_key(f)))
        {
            Some(family) if name.ends_with("_count") => (family, value),
            Some(family) => (family, "*"),
            // The scrape's own connection, and its client's idle ones,
            // are counted when the upkeep tick last ran.
            None if name == "radixgate_client_connections" => (name, "*"),
            None => (name, value),
        };
        out.push(format!(
            "{family} {} {:?} | {} = {value}",
            kind.get(family).expect("a TYPE line"),
            help.get(family).expect("a HELP line"),
            series.replace(worker, "W"),
        ));
    }
    out.sort();
    out
}

async fn post(url: String, body: serde_json::Value) -> u16 {
    let r = client().post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    r.bytes().await.unwrap();
    status
}

fn count(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_series_match_the_committed_list() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.admission.max_concurrent_requests = Some(1);
    cfg.admission.queue_size = 0;
    cfg.circuit_breaker.failure_threshold = 2;
    cfg.circuit_breaker.timeout_duration_secs = 600;
    cfg.retry.max_retries = 1;
    // Outlier detection sets each worker's ejected gauge on its tick; the
    // first tick may run before the worker is admitted, so tick often
    // enough to wait for the next one (a lone worker is never ejected).
    cfg.outlier_detection.interval_secs = 1;
    let gw = gateway_ready(cfg, 1).await;
    let chat_url = format!("{}/v1/chat/completions", gw.url);
    let model = radixgate_sim::server::DEFAULT_MODEL;

    // Answered requests: plain, streamed, other routes, an unknown model.
    assert_eq!(post(chat_url.clone(), chat("plain", false)).await, 200);
    assert_eq!(post(chat_url.clone(), chat("streamed", true)).await, 200);
    let completion = json!({"model": model, "prompt": "hello", "max_tokens": 3});
    assert_eq!(
        post(format!("{}/v1/completions", gw.url), completion).await,
        200
    );
    let generate = json!({"text": "hello", "sampling_params": {"max_new_tokens": 3}});
    assert_eq!(post(format!("{}/generate", gw.url), generate).await, 200);
    let nope = json!({"model": "nope", "messages": []});
    assert_eq!(post(chat_url.clone(), nope).await, 404);
    // A /v1 path the gateway has no route for: forwarded, counted unrouted.
    let count_tokens = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        post(format!("{}/v1/messages/count_tokens", gw.url), count_tokens).await,
        200
    );

    // Admission: a slow stream holds the only slot (the worker waits before
    // answering), so the next request is refused at once.
    w.set_faults(FaultConfig {
        latency_ms: 2000,
        ..FaultConfig::default()
    });
    let held = tokio::spawn(post(chat_url.clone(), chat("hold the only slot", true)));
    wait_until("the slot taken", || async {
        total_load(&gw.url).await == 1
    })
    .await;
    // Refused at the gateway, before any worker. The faults stay until
    // then: the router counts the held request before the worker has read
    // its faults, and a worker that read them cleared would answer at once
    // and free the slot.
    assert_eq!(post(chat_url.clone(), chat("refused", false)).await, 429);
    w.set_faults(FaultConfig::default());
    assert_eq!(held.await.unwrap(), 200);
    wait_until("the held stream counted", || async {
        let text = metrics_text(&gw.url).await;
        count(&text, "radixgate_requests_total{") == 8.0
    })
    .await;

    // Worker failures: a broken stream, a 500 that is retried where no
    // other worker is left (so it counts on no breaker: no other worker
    // could tell whether the request or the worker was at fault), and a
    // second broken stream; the two broken streams open the breaker.
    w.set_faults(FaultConfig {
        die_after_chunks: Some(2),
        ..FaultConfig::default()
    });
    assert_eq!(post(chat_url.clone(), chat("broken", true)).await, 200);
    w.set_faults(FaultConfig {
        error_rate: 1.0,
        ..FaultConfig::default()
    });
    assert_ne!(post(chat_url.clone(), chat("failed", false)).await, 200);
    w.set_faults(FaultConfig {
        die_after_chunks: Some(2),
        ..FaultConfig::default()
    });
    assert_eq!(
        post(chat_url.clone(), chat("broken again", true)).await,
        200
    );
    w.set_faults(FaultConfig::default());

    // Gauges are refreshed by the upkeep tick: wait for one that saw the
    // open breaker and the idle worker, and for outlier detection's tick.
    // A request is counted when its body ends, which may come just after
    // the client has read it: wait for all eleven in both families.
    wait_until("gauges and counts after the failures", || async {
        let text = metrics_text(&gw.url).await;
        count(&text, "radixgate_requests_total{") == 11.0
            && count(&text, "radixgate_request_duration_seconds_count{") == 11.0
            && text.contains("radixgate_circuit_breaker_state{")
            && count(&text, "radixgate_circuit_breaker_state{") == 1.0
            && count(&text, "radixgate_worker_in_flight_requests{") == 0.0
            && count(&text, "radixgate_admission_in_flight_requests") == 0.0
            && text.contains("radixgate_outlier_ejected{")
    })
    .await;
    let text = metrics_text(&gw.url).await;
    gw.shutdown().await;

    let got = series(&text, &w.url).join("\n") + "\n";
    check_golden(GOLDEN, &got, &text);
}

/// The sync families of one replica's scrape (none has a worker label),
/// each value `*`.
fn sync_series(tag: &str, text: &str, worker: &str) -> Vec<String> {
    series(text, worker)
        .into_iter()
        .filter(|l| l.starts_with("radixgate_sync_"))
        .map(|l| {
            let (head, _) = l.rsplit_once(" = ").expect("a value");
            format!("{tag} {head} = *")
        })
        .collect()
}

async fn sync_value(gateway: &str, series: &str) -> f64 {
    metrics_text(gateway)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_metrics_series_match_the_committed_list() {
    let mut nats = sync_support::Nats::start(&[]);
    let w = sim_worker(fast_worker()).await;
    let w2 = sim_worker(fast_worker()).await;
    let replica = |workers: &[&str]| {
        let mut c = config(workers);
        c.sync.urls = vec![nats.url()];
        c.sync.batch_ms = 5;
        c
    };
    // A knows a worker B does not: B counts A's decisions for it unknown.
    let a = gateway_ready(replica(&[&w.url, &w2.url]), 2).await;
    let b = gateway_ready(replica(&[&w.url]), 1).await;
    for gw in [&a.url, &b.url] {
        wait_until("sync connected and ready", || async {
            sync_value(gw, "radixgate_sync_connected").await == 1.0
                && client()
                    .get(format!("{gw}/readiness"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
        })
        .await;
    }
    let chat_url = format!("{}/v1/chat/completions", a.url);
    // Until one decision goes to the worker B does not know.
    let mut to_w2 = false;
    for i in 0..20 {
        let text = format!("request {i}: {}", "a long enough prompt ".repeat(20));
        let r = client()
            .post(&chat_url)
            .json(&chat(&text, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        to_w2 |= r.headers()["x-radixgate-worker"] == w2.url.as_str();
        r.bytes().await.unwrap();
        if to_w2 && i >= 1 {
            break;
        }
    }
    assert!(to_w2, "no request went to the second worker");
    wait_until("B applied and skipped A's decisions", || async {
        sync_value(
            &b.url,
            "radixgate_sync_ignored_total{reason=\"unknown_worker\"}",
        )
        .await
            > 0.0
            && sync_value(&a.url, "radixgate_sync_ignored_total{reason=\"own\"}").await > 0.0
            && metrics_text(&b.url)
                .await
                .contains("radixgate_sync_lag_seconds ")
    })
    .await;
    // Garbage, another version, another cluster.
    let raw = async_nats::connect(nats.url()).await.unwrap();
    raw.publish("radixgate.sync.radixgate.inserts", "garbage".into())
        .await
        .unwrap();
    raw.publish(
        "radixgate.sync.radixgate.inserts",
        b"RG\x07\x01\x00".to_vec().into(),
    )
    .await
    .unwrap();
    let mut foreign = b"RG\x01\x02\x00\x05other\x01x".to_vec();
    foreign.extend_from_slice(&7u64.to_le_bytes());
    foreign.extend_from_slice(&[1, 0, 0]);
    raw.publish("radixgate.sync.radixgate.load", foreign.into())
        .await
        .unwrap();
    raw.flush().await.unwrap();
    wait_until("B counted the bad messages", || async {
        let text = metrics_text(&b.url).await;
        ["malformed", "version", "foreign_cluster"]
            .iter()
            .all(|r| text.contains(&format!("radixgate_sync_ignored_total{{reason=\"{r}\"}}")))
    })
    .await;
    // NATS gone: A drops what it cannot publish (the load report its load
    // lane sends while the request is in flight: the request lasts past
    // the lane's next tick, 100 ms, which a fast answer did not always).
    nats.kill();
    wait_until("A disconnected", || async {
        sync_value(&a.url, "radixgate_sync_connected").await == 0.0
    })
    .await;
    for worker in [&w, &w2] {
        worker.set_faults(FaultConfig {
            latency_ms: 300,
            ..FaultConfig::default()
        });
    }
    assert_eq!(
        post(chat_url.clone(), chat("while NATS is down", false)).await,
        200
    );
    wait_until("A dropped a decision", || async {
        sync_value(
            &a.url,
            "radixgate_sync_dropped_total{reason=\"disconnected\"}",
        )
        .await
            > 0.0
    })
    .await;
    let (text_a, text_b) = (metrics_text(&a.url).await, metrics_text(&b.url).await);
    a.shutdown().await;
    b.shutdown().await;
    let mut got = sync_series("A", &text_a, &w.url);
    got.extend(sync_series("B", &text_b, &w.url));
    let got = got.join("\n") + "\n";
    check_golden(GOLDEN_SYNC, &got, &format!("{text_a}\n{text_b}"));
}

/// The metric families the router's source defines: the name in each
/// `Describe::new(` or `Describe::seconds(` under `src/`.
fn families_in_source() -> std::collections::BTreeSet<String> {
    fn walk(dir: &std::path::Path, out: &mut std::collections::BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for start in ["Describe::new(", "Describe::seconds("] {
                for (at, _) in text.match_indices(start) {
                    let rest = &text[at + start.len()..];
                    let Some(open) = rest.find('"') else { continue };
                    let name = &rest[open + 1..];
                    let name = &name[..name.find('"').unwrap()];
                    if name.starts_with("radixgate_") {
                        out.insert(name.to_owned());
                    }
                }
            }
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut out,
    );
    out
}

/// `docs/metrics.md` has one row for every family the source defines, and
/// none for a family it no longer does.
#[test]
fn the_metrics_reference_lists_every_family() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/metrics.md"
    ))
    .unwrap();
    let rows: std::collections::BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|name| name.starts_with("radixgate_"))
        .map(str::to_owned)
        .collect();
    let families = families_in_source();
    assert!(families.len() > 50, "{families:?}");
    let missing: Vec<_> = families.difference(&rows).collect();
    let stale: Vec<_> = rows.difference(&families).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/metrics.md: families without a row {missing:?}, rows of no family {stale:?}"
    );
}
