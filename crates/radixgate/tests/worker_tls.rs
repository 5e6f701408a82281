//! Workers behind HTTPS: the router as a process trusting a throwaway CA
//! through `SSL_CERT_FILE` (as the README tells an operator to), and
//! loopback TLS workers whose certificates the `openssl` command made:
//! one valid, and ones that are expired, for another host, or signed by
//! a CA nobody trusts. No assertion is a wall-clock bound.

mod common;

use common::process::Serve;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Runs `openssl ARGS` in `dir`; panics with its error output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed (.ci/run installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory for one test's files.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("radixgate-tls-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A CA named `ca` in `dir` (`ca.pem`, `ca.key`).
fn ca(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=radixgate test {ca}"),
        ],
    );
}

/// A server certificate `name` signed by `ca` in `dir`, for `san`, valid
/// for `days` (negative: expired): its certificate and PKCS#8 key, DER.
fn leaf(dir: &Path, ca: &str, name: &str, san: &str, days: &str) -> (Vec<u8>, Vec<u8>) {
    let file = |suffix: &str| format!("{name}.{suffix}");
    std::fs::write(dir.join(file("cnf")), format!("subjectAltName={san}\n")).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &file("key"),
            "-out",
            &file("csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &file("csr"),
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &file("pem"),
            "-days",
            days,
            "-extfile",
            &file("cnf"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-in",
            &file("pem"),
            "-outform",
            "DER",
            "-out",
            &file("der"),
        ],
    );
    openssl(
        dir,
        &[
            "pkcs8",
            "-topk8",
            "-nocrypt",
            "-in",
            &file("key"),
            "-outform",
            "DER",
            "-out",
            &file("key.der"),
        ],
    );
    (
        std::fs::read(dir.join(file("der"))).unwrap(),
        std::fs::read(dir.join(file("key.der"))).unwrap(),
    )
}

/// What a TLS worker was sent: method and path, and its `Authorization`.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    line: String,
    authorization: Option<String>,
}

/// A worker speaking HTTP/1.1 over TLS with `cert`, answering every GET
/// with a model list and every POST with a chat completion; returns its
/// URL and what it was sent.
fn tls_worker((cert, key): (Vec<u8>, Vec<u8>)) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.into()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
    )
    .unwrap();
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { return };
            let (config, log) = (config.clone(), log.clone());
            std::thread::spawn(move || serve_tls(tcp, config, &log));
        }
    });
    (url, seen)
}

fn serve_tls(tcp: TcpStream, config: Arc<rustls::ServerConfig>, log: &Mutex<Vec<Seen>>) {
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            match tls.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let length: usize = header("content-length").map_or(0, |v| v.parse().unwrap());
        while buf.len() < end + length {
            let mut chunk = [0u8; 4096];
            match tls.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + length);
        let line = head.lines().next().unwrap_or_default().to_owned();
        log.lock().unwrap().push(Seen {
            line: line.clone(),
            authorization: header("authorization"),
        });
        let model = radixgate_sim::server::DEFAULT_MODEL;
        let body = if line.starts_with("POST") {
            format!(
                r#"{{"id":"c","object":"chat.completion","model":"{model}","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}}}"#
            )
        } else {
            format!(r#"{{"object":"list","data":[{{"id":"{model}"}}]}}"#)
        };
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if tls.write_all(answer.as_bytes()).is_err() || tls.flush().is_err() {
            return;
        }
    }
}

/// A config file with quick probes and these workers (YAML flow maps).
fn config_file(dir: &Path, workers: &[String]) -> PathBuf {
    let workers: String = workers.iter().map(|w| format!("  - {w}\n")).collect();
    let path = dir.join("radixgate.yaml");
    std::fs::write(
        &path,
        format!(
            "health:\n  interval_secs: 1\n  failure_threshold: 2\n  success_threshold: 1\n  \
             unhealthy_backoff_initial_ms: 50\n  unhealthy_backoff_max_ms: 200\n\
             workers:\n{workers}"
        ),
    )
    .unwrap();
    path
}

/// A worker that serves plain HTTP: it answers whatever it is sent with
/// a 400, as uvicorn does a TLS handshake.
fn plain_http_worker() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { return };
            let mut first = [0u8; 512];
            let _ = tcp.read(&mut first);
            let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
    });
    url
}

/// The router's `/workers` entry for `url` once its `problem` contains
/// `cause` (or, after 20 s, a panic with the list).
async fn problem(router: &str, url: &str, cause: &str) -> String {
    for _ in 0..200 {
        let listed = common::workers(router).await;
        let entry = listed.iter().find(|w| w["url"] == url).unwrap();
        if let Some(problem) = entry["problem"].as_str()
            && problem.contains(cause)
        {
            assert_eq!(entry["state"], "pending", "{entry}");
            return problem.to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{url}: no problem with {cause:?} in {:?}",
        common::workers(router).await
    );
}

#[tokio::test]
async fn an_https_worker_gets_its_key_and_bad_certificates_are_named() {
    let dir = temp_dir("certs");
    ca(&dir, "ca");
    ca(&dir, "rogue");
    let (good, good_seen) = tls_worker(leaf(&dir, "ca", "good", "IP:127.0.0.1", "1"));
    let (expired, _) = tls_worker(leaf(&dir, "ca", "expired", "IP:127.0.0.1", "-1"));
    let (elsewhere, _) = tls_worker(leaf(&dir, "ca", "elsewhere", "DNS:other.example", "1"));
    let (untrusted, _) = tls_worker(leaf(&dir, "rogue", "untrusted", "IP:127.0.0.1", "1"));
    let plain = plain_http_worker();
    let (tls_as_plain, _) = tls_worker(leaf(&dir, "ca", "as-plain", "IP:127.0.0.1", "1"));
    let tls_as_plain = tls_as_plain.replacen("https://", "http://", 1);
    let file = config_file(
        &dir,
        &[
            format!("{{url: '{good}', api_key: wk-good}}"),
            format!("{{url: '{expired}', api_key: wk-expired}}"),
            format!("{{url: '{elsewhere}', api_key: wk-elsewhere}}"),
            format!("{{url: '{untrusted}', api_key: wk-untrusted}}"),
            format!("{{url: '{plain}', api_key: wk-plain}}"),
            format!("{{url: '{tls_as_plain}', api_key: wk-as-plain}}"),
        ],
    );
    let (mut serve, router) = Serve::start_with_env(
        &[("SSL_CERT_FILE", dir.join("ca.pem").to_str().unwrap())],
        &["--config", file.to_str().unwrap()],
    );
    common::wait_for_healthy(&router, 1).await;
    problem(&router, &expired, "Expired").await;
    problem(&router, &elsewhere, "not valid for name").await;
    problem(&router, &untrusted, "UnknownIssuer").await;
    // The handshake's answer was plain HTTP: said so, not only as
    // rustls's "corrupt message".
    problem(&router, &plain, "its URL is http://, not https://").await;
    // And the other way round: a TLS server's alert is no HTTP answer.
    problem(&router, &tls_as_plain, "its URL is https://, not http://").await;

    let r = common::client()
        .post(format!("{router}/v1/chat/completions"))
        .header("authorization", "Bearer client-key")
        .json(&common::chat("hello over TLS", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let seen = good_seen.lock().unwrap().clone();
    assert!(seen.iter().any(|s| s.line.starts_with("POST")), "{seen:?}");
    for s in &seen {
        assert_eq!(s.authorization.as_deref(), Some("Bearer wk-good"), "{s:?}");
    }
    assert!(serve.terminate());
    let lines = serve.drain(Duration::from_millis(500)).join("\n");
    assert!(lines.contains("not reachable"), "{lines}");
    assert!(!lines.contains("panic"), "{lines}");
    for key in [
        "wk-good",
        "wk-expired",
        "wk-elsewhere",
        "wk-untrusted",
        "wk-plain",
        "wk-as-plain",
    ] {
        assert!(!lines.contains(key), "{key} logged:\n{lines}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
