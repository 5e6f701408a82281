//! Draining through a real gateway: a drained worker takes no new request,
//! its requests in flight (streams included) finish, and then it goes.
//! (Draining by a terminating pod is in `discovery/main.rs`.)

mod common;

use common::*;
use radixgate_routing::{PolicyConfig, RoundRobinConfig};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_workers_drains_a_worker_with_a_stream_in_flight() {
    let mut slow = fast_worker();
    slow.engine.timing.step_base_us = 3000.0;
    let a = sim_worker(slow).await;
    let gw = gateway_ready(config(&[&a.url]), 1).await;
    let mut long = chat("a long answer", true);
    long["max_tokens"] = json!(400);
    let mut stream = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&long)
        .send()
        .await
        .unwrap();
    let mut body = String::from_utf8_lossy(&stream.chunk().await.unwrap().unwrap()).into_owned();
    let r: Value = client()
        .delete(format!("{}/workers?url={}", gw.url, a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["state"], "draining");
    let listed = workers(&gw.url).await;
    assert_eq!(listed[0]["state"], "draining", "{listed:?}");
    assert_eq!(listed[0]["load"], 1, "{listed:?}");
    // The in-flight gauge goes on reading its load while it drains (an
    // operator waits for it to reach 0 before stopping the worker).
    let in_flight = format!(
        "radixgate_worker_in_flight_requests{{worker=\"{}\"}} 1",
        a.url
    );
    wait_until("the draining worker's in-flight gauge at 1", || async {
        metrics_text(&gw.url).await.contains(&in_flight)
    })
    .await;
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("no one to take it", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503, "a draining worker takes no new request");
    // Draining again changes nothing.
    let again: Value = client()
        .delete(format!("{}/workers?url={}", gw.url, a.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["state"], "draining");

    while let Some(chunk) = stream.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(!body.contains("\"error\""), "{body}");
    wait_until("the drained worker gone", || async {
        workers(&gw.url).await.is_empty()
    })
    .await;
    let metrics = metrics_text(&gw.url).await;
    assert!(
        metrics.contains("radixgate_worker_drains_total{end=\"finished\"} 1"),
        "{metrics}"
    );
    let drained = format!(
        "radixgate_worker_in_flight_requests{{worker=\"{}\"}} 0",
        a.url
    );
    wait_until("the drained worker's in-flight gauge at 0", || async {
        metrics_text(&gw.url).await.contains(&drained)
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_is_removed_at_once_and_a_drained_url_can_come_back() {
    let a = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url]), 1).await;
    let r = remove_worker(&gw.url, &a.url).await;
    assert_eq!(r["state"], "removed");
    assert!(workers(&gw.url).await.is_empty());
    let r = client()
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": a.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    wait_for_healthy(&gw.url, 1).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drops_readiness_before_the_listener_closes() {
    let a = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&a.url]);
    cfg.server.shutdown_delay_secs = 5;
    let gw = gateway_ready(cfg, 1).await;
    let readiness = || async {
        let r = client()
            .get(format!("{}/readiness", gw.url))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(readiness().await.0, 200);
    gw.stop.cancel();
    let (status, body) = readiness().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "shutting_down");
    // Still accepting, and serving, during the delay: a load balancer that
    // has not yet seen the 503 loses nothing.
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("one more", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    gw.task.await.unwrap().unwrap();
}

/// Through the shutdown delay an HTTP/1 client that keeps its connection
/// open (a keep-alive pool; a Kubernetes Service pins the connection to
/// this pod whatever its endpoints say) is told with each answer to open a
/// new one (`Connection: close`), and its connection closes after the
/// answer, so that its next request finds a replica that stays. Kept open,
/// it went on sending here until the listener closed, and a request sent
/// as its idle connection was closed then was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_clients_are_moved_off_during_the_shutdown_delay() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let a = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&a.url]);
    cfg.server.shutdown_delay_secs = 600;
    let gw = gateway_ready(cfg, 1).await;
    let addr = gw.url.trim_start_matches("http://").to_owned();
    let says_close = |head: &str| {
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("connection: close"))
    };
    let body = chat("kept alive", false).to_string();
    let post = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut kept = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut buf = Vec::new();
    kept.write_all(post.as_bytes()).await.unwrap();
    let (head, _) = read_http_message(&mut kept, &mut buf).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!says_close(&head), "kept alive while serving: {head}");

    gw.stop.cancel();
    wait_until("readiness at 503", || async {
        let r = client()
            .get(format!("{}/readiness", gw.url))
            .send()
            .await
            .unwrap();
        r.status() == 503
    })
    .await;
    // The kept connection's next answer is its last.
    kept.write_all(post.as_bytes()).await.unwrap();
    let (head, _) = read_http_message(&mut kept, &mut buf).await.unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(says_close(&head), "not told to move off: {head}");
    let mut rest = [0u8; 64];
    let closed = tokio::time::timeout(std::time::Duration::from_secs(30), kept.read(&mut rest))
        .await
        .expect("the connection was kept open after its last answer");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    // A new connection is still served (the delay is for load balancers
    // that have not seen the 503 yet), and told the same.
    let mut fresh = tokio::net::TcpStream::connect(&addr).await.unwrap();
    fresh.write_all(post.as_bytes()).await.unwrap();
    let (head, _) = read_http_message(&mut fresh, &mut Vec::new())
        .await
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(says_close(&head), "{head}");
}

/// The gateway serves on through the shutdown delay, so its background
/// tasks must too: the control task (`/workers`, health checks), the
/// metrics upkeep, replica sync. They used to stop at the signal, so that
/// during the delay `/workers` listed nothing and a worker that died was
/// never marked down (requests still arriving went to it), and during the
/// grace period the in-flight gauges froze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_and_the_admin_plane_run_through_the_shutdown_delay() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&a.url, &b.url]);
    cfg.server.shutdown_delay_secs = 600;
    let gw = gateway_ready(cfg, 2).await;
    gw.stop.cancel();
    wait_until("readiness at 503", || async {
        let r = client()
            .get(format!("{}/readiness", gw.url))
            .send()
            .await
            .unwrap();
        r.status() == 503
    })
    .await;
    let listed = workers(&gw.url).await;
    assert_eq!(listed.len(), 2, "{listed:?}");

    a.stop.cancel();
    wait_until("the dead worker marked unhealthy", || async {
        workers(&gw.url)
            .await
            .iter()
            .any(|w| w["url"] == a.url.as_str() && w["state"] == "unhealthy")
    })
    .await;
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat(&format!("during the delay {i}"), false)).await;
        assert_eq!(r.status(), 200);
    }
}

/// A second SIGTERM or Ctrl-C ends the shutdown's grace period at once:
/// the stream still in flight ends with its `shutting_down` error event
/// and the process exits cleanly. It used to be ignored, so a router with
/// a long grace period (the chart's is 600 s) could only be stopped by
/// `kill -9`, which sends the client nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_shutdown_signal_ends_the_grace_period() {
    let w = stalling_worker(vec![
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
    ])
    .await;
    let (mut serve, gw) = process::Serve::start(&[
        "--worker-urls",
        &w.url,
        "--shutdown-grace-period-secs",
        "600",
        "--stall-timeout-secs",
        "600",
    ]);
    serve.wait_for("worker admitted");
    let mut stream = client()
        .post(format!("{gw}/v1/chat/completions"))
        .json(&json!({"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "), "{first:?}");

    serve.signal("TERM");
    serve.wait_for("shutting down");
    serve.signal("INT");
    // A hang guard, not a speed bound: without the second signal's effect
    // the stream runs until the 600 s grace period ends.
    let rest = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let mut rest = Vec::new();
        while let Ok(Some(chunk)) = stream.chunk().await {
            rest.extend_from_slice(&chunk);
        }
        rest
    })
    .await
    .expect("the stream did not end after a second shutdown signal");
    let rest = String::from_utf8(rest).unwrap();
    assert!(rest.contains("\"shutting_down\""), "{rest}");
    assert!(serve.wait_exit(), "a clean exit");
}

/// A request whose worker has not answered yet when the shutdown grace
/// period ends (a non-streamed answer still being generated, a stream
/// before its first token) is answered 503 `shutting_down` with
/// `Retry-After`, as one still queued for admission is. Its connection used
/// to be dropped with no answer at all (curl: "empty reply from server"),
/// which a client cannot tell from a crash, and it was counted as 499, its
/// client gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_unanswered_when_the_grace_period_ends_gets_503() {
    // Sends its answer's head, then never a byte of it.
    let w = stalling_worker(Vec::new()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.shutdown_grace_period_secs = 1;
    let gw = gateway_ready(cfg, 1).await;
    let asked: Vec<_> = [false, true]
        .into_iter()
        .map(|stream| {
            let url = gw.url.clone();
            tokio::spawn(async move {
                let body = json!({
                    "model": "scripted",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": stream,
                });
                post_chat(&url, &body).await
            })
        })
        .collect();
    wait_until("both requests at the worker", || async {
        w.received.lock().len() == 2
    })
    .await;
    gw.stop.cancel();
    for answer in asked {
        // A hang guard only: the grace period is 1 s.
        let r = tokio::time::timeout(std::time::Duration::from_secs(60), answer)
            .await
            .expect("no answer after the grace period")
            .unwrap();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "shutting_down", "{body}");
    }
    gw.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_times_out_forgets_the_worker_but_does_not_cut_its_stream() {
    let mut slow = fast_worker();
    slow.engine.timing.step_base_us = 3000.0;
    let a = sim_worker(slow).await;
    let mut cfg = config(&[&a.url]);
    cfg.server.drain_timeout_secs = 1;
    let gw = gateway_ready(cfg, 1).await;
    let mut long = chat("a very long answer", true);
    long["max_tokens"] = json!(1500);
    let mut stream = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&long)
        .send()
        .await
        .unwrap();
    let mut body = String::from_utf8_lossy(&stream.chunk().await.unwrap().unwrap()).into_owned();
    client()
        .delete(format!("{}/workers?url={}", gw.url, a.url))
        .send()
        .await
        .unwrap();
    wait_until("the drain timed out", || async {
        workers(&gw.url).await.is_empty()
    })
    .await;
    let metrics = metrics_text(&gw.url).await;
    assert!(
        metrics.contains("radixgate_worker_drains_total{end=\"timeout\"} 1"),
        "{metrics}"
    );
    while let Some(chunk) = stream.chunk().await.unwrap() {
        body.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_malformed_drain_query_gets_an_openai_style_error() {
    let a = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url]), 1).await;
    for (query, status) in [("?url=a&url=b", 400), ("", 400), ("?url=%ZZ", 404)] {
        let r = client()
            .delete(format!("{}/workers{query}", gw.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{query}");
        let body: Value = r
            .json()
            .await
            .unwrap_or_else(|e| panic!("{query}: not JSON: {e}"));
        assert_eq!(
            body["error"]["type"], "invalid_request_error",
            "{query}: {body}"
        );
    }
    assert_eq!(workers(&gw.url).await[0]["state"], "healthy");
    gw.shutdown().await;
}

/// DELETE /workers, then POST /workers for the same URL.
async fn remove_and_add_back(gw: &str, url: &str) {
    let r: Value = client()
        .delete(format!("{gw}/workers?url={url}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["state"], "removed");
    let r = client()
        .post(format!("{gw}/workers"))
        .json(&json!({"url": url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    wait_for_healthy(gw, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_back_at_its_url_counts_on_in_its_series() {
    let a = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url]), 1).await;
    let prompt = format!(
        "radixgate_cache_prompt_tokens_total{{worker=\"{}\"}}",
        a.url
    );
    for i in 0..4 {
        let r = post_chat(&gw.url, &chat(&format!("before {i}"), false)).await;
        assert_eq!(r.status(), 200);
    }
    wait_until("the prompt tokens counted", || async {
        series_value(&gw.url, &prompt).await > 0.0
    })
    .await;
    let before = series_value(&gw.url, &prompt).await;

    // The worker at that URL again: a new worker, whose own totals start
    // at 0, but the series is the URL's and counts on from where it was.
    remove_and_add_back(&gw.url, &a.url).await;
    let r = post_chat(&gw.url, &chat("after", false)).await;
    assert_eq!(r.status(), 200);
    wait_until("the answer after the worker came back counted", || async {
        series_value(&gw.url, &prompt).await > before
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_workers_breaker_gauge_does_not_stay_open() {
    let flaky = sim_worker(fast_worker()).await;
    let steady = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&flaky.url, &steady.url]);
    cfg.routing = PolicyConfig::RoundRobin(RoundRobinConfig::default());
    cfg.circuit_breaker.failure_threshold = 2;
    let gw = gateway_ready(cfg, 2).await;
    flaky.set_faults(radixgate_sim::server::FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    for i in 0..6 {
        // Retried on the steady worker while the breaker counts failures.
        let r = post_chat(&gw.url, &chat(&format!("fails {i}"), false)).await;
        assert_eq!(r.status(), 200);
    }
    let state = format!(
        "radixgate_circuit_breaker_state{{worker=\"{}\"}}",
        flaky.url
    );
    wait_until("the breaker open", || async {
        series_value(&gw.url, &state).await == 1.0
    })
    .await;
    let r = remove_worker(&gw.url, &flaky.url).await;
    assert_eq!(r["state"], "removed");
    // Gone from the pool: its series no longer read as an open breaker
    // (an alert on open breakers would fire for a worker that is gone).
    wait_until("the removed worker's breaker gauge at 0", || async {
        series_value(&gw.url, &state).await == 0.0
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_workers_prediction_error_reads_0() {
    let a = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&a.url]), 1).await;
    let error = format!("radixgate_cache_prediction_error{{worker=\"{}\"}}", a.url);
    // A shared prefix the tree predicts cached, which the worker's pages
    // hold only in part: the running error is off 0.
    let shared = "the same long system prompt ".repeat(40);
    for i in 0..8 {
        let r = post_chat(&gw.url, &chat(&format!("{shared} q{i}"), false)).await;
        assert_eq!(r.status(), 200);
    }
    wait_until("a prediction error off 0", || async {
        series_value(&gw.url, &error).await != 0.0
    })
    .await;
    let r = remove_worker(&gw.url, &a.url).await;
    assert_eq!(r["state"], "removed");
    // Gone from the pool: its error reads 0 as its other gauges do, not
    // the last value for the exporter's idle time (an alert on the tree
    // guessing wrong would go on firing for a worker that is gone).
    wait_until("the removed worker's prediction error at 0", || async {
        series_value(&gw.url, &error).await == 0.0
    })
    .await;
    gw.shutdown().await;
}

/// A router restarted under load serves the requests that reach it as
/// soon as it listens: it starts accepting once each configured worker's
/// first probes have an outcome (a worker that is down does not hold it).
/// It used to answer every request of its first quarter second or so 503
/// `no_healthy_worker` ("1 worker pending"), while its probes of a worker
/// that had been up all along were still to pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_router_serves_its_first_requests() {
    let up = sim_worker(fast_worker()).await;
    let down = format!("http://127.0.0.1:{}", process::free_port());
    let (_serve, gw) = process::Serve::start(&["--worker-urls", &up.url, &down]);
    let r = post_chat(&gw, &chat("the first request", false)).await;
    let status = r.status();
    assert_eq!(status, 200, "{}", r.text().await.unwrap());
}

/// While the router holds its start for a worker's first probe (one that
/// takes the connection and never answers, up to the probe's timeout), it
/// does not accept on the client port yet, so its `/readiness` on the
/// metrics port (where the chart probes) says so, 503 `starting`. It
/// answered 200 as soon as another worker was admitted, and a load balancer
/// then sent it connections that waited unserved in the listen backlog
/// until that probe timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_listener_to_accept() {
    let up = sim_worker(fast_worker()).await;
    // Completes the handshake (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let mut cfg = config(&[&up.url, &silent_url]);
    // Far longer than the test: the start waits for this probe throughout.
    cfg.health.timeout_secs = 600;
    let port = process::free_port();
    cfg.metrics.prometheus_port = Some(port);
    cfg.metrics.prometheus_host = Some("127.0.0.1".into());
    let gw = gateway(cfg).await;
    let readiness = format!("http://127.0.0.1:{port}/readiness");
    let get = || async {
        let r = client().get(&readiness).send().await.ok()?;
        let status = r.status().as_u16();
        Some((status, r.json::<Value>().await.ok()?))
    };
    wait_until("the live worker admitted", || async {
        get()
            .await
            .is_some_and(|(_, body)| body["healthy_workers"] == 1)
    })
    .await;
    let (status, body) = get().await.unwrap();
    assert_eq!(status, 503, "ready while not accepting: {body}");
    assert_eq!(body["status"], "starting", "{body}");
    assert_eq!(body["pending_workers"], 1, "{body}");
    gw.stop.cancel();
    gw.task.await.unwrap().unwrap();
    drop(silent);
}

/// The shutdown's log says what it waits for and what it cut, and its
/// last line says it is done: a request queued for admission is counted
/// beside those at a worker, the grace period's end names both, and the
/// process's last line says it shut down. The queued request was left
/// out (`in_flight=1` while two waited), and the last line read "waiting
/// for the requests in flight", the same as from a router killed before
/// it was done (a `terminationGracePeriodSeconds` too short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_log_counts_what_it_waits_for_and_ends_with_its_end() {
    let w = stalling_worker(vec![
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
    ])
    .await;
    let (mut serve, gw) = process::Serve::start(&[
        "--worker-urls",
        &w.url,
        "--max-concurrent-requests",
        "1",
        "--shutdown-grace-period-secs",
        "1",
        "--stall-timeout-secs",
        "600",
    ]);
    serve.wait_for("worker admitted");
    let ask = |stream: bool| {
        let url = gw.clone();
        tokio::spawn(async move {
            let body = json!({"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "stream": stream});
            let r = post_chat(&url, &body).await;
            (r.status(), r.text().await.unwrap_or_default())
        })
    };
    let streaming = ask(true);
    wait_until("the stream at the worker", || async {
        w.received.lock().len() == 1
    })
    .await;
    let queued = ask(false);
    wait_until("the second request queued", || async {
        series_value(&gw, "radixgate_admission_queued_requests").await == 1.0
    })
    .await;

    assert!(serve.terminate(), "a clean exit");
    let (stream, queued) = (streaming.await.unwrap(), queued.await.unwrap());
    assert!(stream.1.contains("\"shutting_down\""), "{stream:?}");
    assert_eq!(queued.0, 503, "{queued:?}");
    let lines = serve.drain(std::time::Duration::from_secs(5)).to_vec();
    let log = lines.join("\n");
    let line = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{log}"))
    };
    let waiting = line("stopped accepting");
    assert!(
        waiting.contains("in_flight=1") && waiting.contains("queued=1"),
        "{waiting}"
    );
    let over = line("grace period over");
    assert!(
        over.contains("in_flight=1") && over.contains("queued=1"),
        "{over}"
    );
    let last = lines.last().unwrap();
    assert!(last.contains("shut down"), "the last line: {last}\n{log}");
}
