//! Operating `radixgate serve`: circuit breakers, admission control and the
//! Prometheus scrape, end to end on loopback.

mod common;

use common::*;
use futures::StreamExt;
use radixgate::proxy::WORKER_HEADER;
use radixgate_routing::{PolicyConfig, RoundRobinConfig};
use radixgate_sim::server::FaultConfig;
use serde_json::{Value, json};

async fn scrape(url: &str) -> prometheus_parse::Scrape {
    let text = metrics_text(url).await;
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned())))
        .expect("valid Prometheus text")
}

fn gauge(scrape: &prometheus_parse::Scrape, name: &str, worker: &str) -> Option<f64> {
    scrape.samples.iter().find_map(|s| match s.value {
        prometheus_parse::Value::Gauge(v)
            if s.metric == name && s.labels.get("worker") == Some(worker) =>
        {
            Some(v)
        }
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_opens_on_failures_and_recovers() {
    let flaky = sim_worker(fast_worker()).await;
    let steady = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&flaky.url, &steady.url]);
    cfg.routing = PolicyConfig::RoundRobin(RoundRobinConfig::default());
    cfg.circuit_breaker.failure_threshold = 2;
    cfg.circuit_breaker.success_threshold = 1;
    cfg.circuit_breaker.timeout_duration_secs = 1;
    let gw = gateway_ready(cfg, 2).await;
    let c = client();
    let send = || {
        c.post(format!("{}/v1/chat/completions", gw.url))
            .json(&chat("breaker", false))
            .send()
    };

    flaky.set_faults(FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    for _ in 0..6 {
        // Retries keep the client whole while the breaker counts failures.
        assert_eq!(send().await.unwrap().status(), 200);
    }
    wait_until("the breaker gauge to show open", || async {
        gauge(
            &scrape(&gw.url).await,
            "radixgate_circuit_breaker_state",
            &flaky.url,
        ) == Some(1.0)
    })
    .await;
    for _ in 0..6 {
        let r = send().await.unwrap();
        assert_eq!(
            r.headers()[WORKER_HEADER],
            steady.url.as_str(),
            "an open breaker is skipped"
        );
    }

    flaky.set_faults(FaultConfig::default());
    wait_until("the flaky worker to be chosen again", || async {
        let r = send().await.unwrap();
        r.headers()[WORKER_HEADER] == flaky.url.as_str()
    })
    .await;
    wait_until("the breaker gauge to show closed", || async {
        gauge(
            &scrape(&gw.url).await,
            "radixgate_circuit_breaker_state",
            &flaky.url,
        ) == Some(0.0)
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_queue_bounds_concurrency() {
    let mut slow = fast_worker();
    slow.engine.timing.step_base_us = 5_000.0;
    let w = sim_worker(slow).await;
    let mut cfg = config(&[&w.url]);
    cfg.admission.max_concurrent_requests = Some(1);
    cfg.admission.queue_size = 1;
    cfg.admission.queue_timeout_secs = 30;
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    let mut long = chat("hold the only slot", true);
    long["max_tokens"] = json!(400);
    let first = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&long)
        .send()
        .await
        .unwrap();
    let mut first = first.bytes_stream();
    first.next().await.unwrap().unwrap();
    // The second waits in the queue; the third finds it full.
    let queued = tokio::spawn({
        let (c, url) = (c.clone(), gw.url.clone());
        async move {
            c.post(format!("{url}/v1/chat/completions"))
                .json(&chat("queued", false))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    wait_until("one queued request", || async {
        let s = scrape(&gw.url).await;
        s.samples.iter().any(|x| {
            x.metric == "radixgate_admission_queued_requests"
                && matches!(x.value, prometheus_parse::Value::Gauge(v) if v == 1.0)
        })
    })
    .await;
    let rejected = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("rejected", false))
        .send()
        .await
        .unwrap();
    assert_eq!(rejected.status(), 429);
    assert!(rejected.headers().contains_key("retry-after"));
    assert_eq!(
        rejected.json::<Value>().await.unwrap()["error"]["code"],
        "queue_full"
    );
    drop(first);
    assert_eq!(queued.await.unwrap(), 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_scrape_is_valid_prometheus_text_with_the_traffic() {
    let w = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let mut cfg = config(&[&w[0].url, &w[1].url]);
    let spare = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    cfg.metrics.prometheus_port = Some(spare.local_addr().unwrap().port());
    drop(spare);
    let gw = gateway_ready(cfg.clone(), 2).await;
    let c = client();
    for i in 0..3 {
        c.post(format!("{}/v1/chat/completions", gw.url))
            .json(&chat(&format!("m{i}"), i == 0))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
    }
    c.post(format!("{}/v1/chat/completions", gw.url))
        .json(&json!({"model": "nope", "messages": []}))
        .send()
        .await
        .unwrap();
    // Worker gauges are refreshed by a periodic tick: wait for one that
    // saw both workers after every answer's load guard was dropped (hyper
    // drops a body shortly after its last byte reaches the client, so a
    // tick can still see one in flight).
    wait_until("gauges of both workers with nothing in flight", || async {
        let s = scrape(&gw.url).await;
        w.iter().all(|x| {
            gauge(&s, "radixgate_worker_healthy", &x.url).is_some()
                && gauge(&s, "radixgate_worker_in_flight_requests", &x.url) == Some(0.0)
        })
    })
    .await;
    let s = scrape(&gw.url).await;
    let count = |metric: &str, label: &str, value: &str| -> f64 {
        s.samples
            .iter()
            .filter(|x| x.metric == metric && x.labels.get(label) == Some(value))
            .map(|x| match x.value {
                prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    assert_eq!(count("radixgate_requests_total", "status", "200"), 3.0);
    assert_eq!(count("radixgate_requests_total", "status", "404"), 1.0);
    assert_eq!(
        count(
            "radixgate_requests_total",
            "model",
            radixgate_sim::server::DEFAULT_MODEL
        ),
        3.0
    );
    assert!(
        s.samples
            .iter()
            .any(|x| x.metric == "radixgate_routing_decisions_total")
    );
    for worker in &w {
        assert_eq!(
            gauge(&s, "radixgate_worker_healthy", &worker.url),
            Some(1.0)
        );
        assert_eq!(
            gauge(&s, "radixgate_worker_in_flight_requests", &worker.url),
            Some(0.0)
        );
    }
    // The separate Prometheus port serves the same families.
    let port = cfg.metrics.prometheus_port.unwrap();
    let other = scrape(&format!("http://127.0.0.1:{port}")).await;
    assert!(
        other
            .samples
            .iter()
            .any(|x| x.metric == "radixgate_requests_total")
    );
    gw.shutdown().await;
}
