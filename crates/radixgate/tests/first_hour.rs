//! What a new user meets in the first minutes with the `radixgate` binary:
//! a worker that is not there, an empty pool, a port already taken, logs
//! in a file. Each answer must say what is wrong and what to do, and log
//! files must be plain text.

mod common;

use common::process::{Serve, free_port, radixgate};
use std::net::TcpListener;
use std::time::Duration;

/// POSTs a chat request without a model; (status, body).
async fn chat(base: &str) -> (u16, serde_json::Value) {
    let response = common::client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&serde_json::json!({
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 4
        }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn an_unreachable_worker_is_named_in_the_log_and_in_the_503() {
    let worker = format!("http://127.0.0.1:{}", free_port());
    let (mut serve, base) = Serve::start(&["--worker-urls", &worker]);
    let warned = serve.wait_for("not reachable");
    assert!(
        warned.contains("WARN")
            && warned.contains(&format!(
                "worker {worker} not reachable: connection refused"
            ))
            && warned.contains("(retrying every 2 s)"),
        "{warned}"
    );

    let (status, body) = chat(&base).await;
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        format!(
            "no healthy worker is available: 1 worker pending (never answered a health \
             check): {worker} (connection refused)"
        ),
        "the client sent no model, so none (and no `*`) is named"
    );
    assert_eq!(body["error"]["code"], "no_healthy_worker");

    let listed = common::workers(&base).await;
    let entry = &listed[0];
    assert_eq!(entry["state"], "pending", "{listed:?}");
    assert_eq!(entry["problem"], "connection refused", "{listed:?}");
    assert_eq!(
        entry["name"],
        worker.trim_start_matches("http://"),
        "{listed:?}"
    );
    // Not ready, with the worker it waits for counted (it read as a
    // router with no worker configured at all).
    let r = common::client()
        .get(format!("{base}/readiness"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let ready: serde_json::Value = r.json().await.unwrap();
    assert_eq!(ready["status"], "no_healthy_workers", "{ready}");
    assert_eq!(
        (&ready["workers"], &ready["pending_workers"]),
        (&0.into(), &1.into()),
        "{ready}"
    );

    // Probes go on every 2 s, but the warning is not repeated for a minute.
    let seen = serve.drain(Duration::from_secs(5));
    let warnings = seen.iter().filter(|l| l.contains("not reachable")).count();
    assert_eq!(warnings, 1, "{seen:#?}");
}

#[tokio::test]
async fn an_empty_pool_says_how_to_add_workers_at_start_and_in_the_503() {
    let (mut serve, base) = Serve::start(&[]);
    let warned = serve.wait_for("worker pool is empty");
    assert!(
        warned.contains("--worker-urls") && warned.contains("POST /workers"),
        "{warned}"
    );
    let (status, body) = chat(&base).await;
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("no healthy worker is available: the pool is empty; add workers"),
        "{message}"
    );
}

#[test]
fn logs_to_a_pipe_or_file_carry_no_colour_codes() {
    let (mut serve, _) = Serve::start(&[]);
    serve.wait_for("worker pool is empty");
    let seen = serve.drain(Duration::from_millis(200));
    assert!(
        seen.iter().any(|l| l.contains(" INFO ")),
        "levels are plain words: {seen:#?}"
    );
    assert!(
        seen.iter().all(|l| !l.contains('\u{1b}')),
        "ANSI escapes in a pipe: {seen:#?}"
    );
}

#[test]
fn a_port_in_use_is_an_error_that_suggests_another() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = radixgate()
        .args(["serve", "--host", "127.0.0.1", "--port", &port])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "cannot listen on 127.0.0.1:{port}: the port is in use"
        )) && stderr.contains("--port"),
        "{stderr}"
    );

    let out = radixgate()
        .args(["worker", "--port", &port])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the port is in use") && stderr.contains("--port"),
        "{stderr}"
    );
}

#[test]
fn the_worker_and_the_router_have_different_default_ports() {
    let help = |cmd: &str| {
        let out = radixgate().args([cmd, "--help"]).output().unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let default_port = |text: &str| {
        let line = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--port"))
            .find(|l| l.contains("[default:"))
            .unwrap_or_else(|| panic!("no --port default in {text}"))
            .to_owned();
        let after = line.split_once("[default: ").unwrap().1;
        after[..after.find(']').unwrap()].to_owned()
    };
    let (serve, worker) = (default_port(&help("serve")), default_port(&help("worker")));
    assert_eq!(serve, "30000");
    assert_ne!(
        serve, worker,
        "`serve` and `worker` with defaults would collide"
    );
}
