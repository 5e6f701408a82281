//! How soon a worker that becomes ready gets its first request: from the
//! API server's event (a pod turning Ready) to the first answer the
//! gateway routes to it, measured against the fake API server of the
//! tests, with the real `kube` client in a real gateway. The baseline is
//! the same worker added with `POST /workers` at the same moment: the
//! difference is what discovery adds; the rest is admission (health probes
//! with their default settings: two passing probes, 250 ms apart).
//!
//! Steady traffic (one request after another, round-robin over the pool)
//! runs throughout, so the time measured ends at the first request routed
//! to the new worker, not at the next one a client happened to send.
//!
//! `cargo run -p radixgate --example discovery_latency [TRIALS]` (a debug
//! build is enough: the time is the probe schedule, not CPU).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/k8s/mod.rs"]
mod k8s;

use common::*;
use radixgate::config::Config;
use radixgate_sim::server::WorkerConfig;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

async fn worker_at(host: u8) -> (SimWorker, std::net::SocketAddr) {
    let listener = TcpListener::bind(format!("127.0.0.{host}:0"))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let config = WorkerConfig {
        instant: true,
        ..fast_worker()
    };
    (sim_worker_on(listener, config).await, addr)
}

/// Sends requests one after another until one is answered by `url`;
/// returns when that answer arrived.
async fn first_answer_from(gateway: &str, url: &str) -> Instant {
    let c = client();
    loop {
        let r = c
            .post(format!("{gateway}/v1/chat/completions"))
            .json(&chat("ping", false))
            .send()
            .await
            .unwrap();
        let by = r.headers()["x-radixgate-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        r.bytes().await.unwrap();
        if by == url {
            return Instant::now();
        }
    }
}

fn summary(name: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<22} n={:<3} median {:>6.1} ms  p90 {:>6.1} ms  min {:>6.1} ms  max {:>6.1} ms",
        ms.len(),
        at(0.5),
        at(0.9),
        ms[0],
        ms[ms.len() - 1]
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let trials: u8 = std::env::args()
        .nth(1)
        .map_or(20, |n| n.parse().expect("TRIALS is a number"));
    assert!((1..=100).contains(&trials), "TRIALS is 1..=100");
    let api = k8s::FakeApi::start_new().await;
    let (_base, base_addr) = worker_at(2).await;
    api.put(k8s::pod("base", json!({"app": "sglang"}), base_addr));
    let mut config = Config {
        routing: serde_norway::from_str("policy: round_robin").unwrap(),
        ..Config::default()
    };
    config.discovery.enabled = true;
    config.discovery.kubeconfig = Some(api.kubeconfig.clone());
    config.discovery.namespace = Some("llm".into());
    config.discovery.selector = [("app".to_owned(), "sglang".to_owned())].into();
    config.discovery.port_annotation = Some(k8s::PORT_ANNOTATION.into());
    let health = config.health.clone();
    let gw = gateway(config).await;
    wait_for_healthy(&gw.url, 1).await;
    println!(
        "discovery_latency: {trials} trials; health probes every {} ms while pending, \
         {} passing to admit; round_robin; instant simulated workers on 127.0.0.x",
        health.unhealthy_backoff_initial_ms, health.success_threshold
    );

    let (mut by_event, mut by_admin) = (Vec::new(), Vec::new());
    for i in 0..trials {
        // Through the API server.
        let (w, addr) = worker_at(10 + i).await;
        let name = format!("w-{i}");
        let pod = k8s::pod(&name, json!({"app": "sglang"}), addr);
        api.put(k8s::set_ready(pod.clone(), false));
        let event = Instant::now();
        api.put(pod.clone());
        let first = first_answer_from(&gw.url, &w.url).await;
        by_event.push((first - event).as_secs_f64() * 1e3);
        api.put(k8s::terminating(pod));
        wait_for_healthy(&gw.url, 1).await;
        api.delete(&name);

        // Baseline: the admin API.
        let (w, _) = worker_at(120 + i).await;
        let posted = Instant::now();
        let r = client()
            .post(format!("{}/workers", gw.url))
            .json(&json!({"url": w.url}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        let first = first_answer_from(&gw.url, &w.url).await;
        by_admin.push((first - posted).as_secs_f64() * 1e3);
        client()
            .delete(format!("{}/workers?url={}", gw.url, w.url))
            .send()
            .await
            .unwrap();
        wait_for_healthy(&gw.url, 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    summary("pod Ready event", by_event);
    summary("POST /workers", by_admin);
    gw.shutdown().await;
}
