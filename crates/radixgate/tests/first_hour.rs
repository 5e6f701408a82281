//! What a new user meets in the first minutes with the `radixgate` binary:
//! a worker that is not there, an empty pool, a port already taken, logs
//! in a file. Each answer must say what is wrong and what to do, and log
//! files must be plain text.

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The binary with no `RADIXGATE_*` or `NO_COLOR` from the caller's shell.
fn radixgate() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_radixgate"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RADIXGATE_") || key == "RUST_LOG" || key == "NO_COLOR" {
            c.env_remove(key);
        }
    }
    c
}

/// A loopback port nobody listens on (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `radixgate serve`, its stderr read line by line on a thread.
struct Serve {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line read so far.
    seen: Vec<String>,
}

impl Serve {
    /// Starts `serve` on a free loopback port with `args`, and waits for
    /// it to listen; returns it and its address.
    fn start(args: &[&str]) -> (Self, String) {
        let mut child = radixgate()
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut serve = Self {
            child,
            lines,
            seen: Vec::new(),
        };
        let listening = serve.wait_for("radixgate listening");
        let addr = listening
            .split_whitespace()
            .find_map(|field| field.strip_prefix("addr="))
            .unwrap_or_else(|| panic!("no addr in {listening:?}"))
            .to_owned();
        (serve, format!("http://{addr}"))
    }

    /// Waits (at most 20 s) for a line containing `needle`.
    fn wait_for(&mut self, needle: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Lines read so far and any that arrive within `wait`.
    fn drain(&mut self, wait: Duration) -> &[String] {
        while let Ok(line) = self.lines.recv_timeout(wait) {
            self.seen.push(line);
        }
        &self.seen
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
