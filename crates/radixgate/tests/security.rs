//! The security rules of `radixgate serve`, end to end on loopback: who may
//! use the admin plane, which worker URLs are accepted, the `/metrics` key,
//! the bearer scheme, and errors for wrong methods.

mod common;

use common::*;
use radixgate::config::{AdminAccess, Config};
use serde_json::{Value, json};
use std::net::IpAddr;

/// The OpenAI-style error code of a response, after checking its status.
async fn error_code(r: reqwest::Response, status: u16) -> String {
    assert_eq!(r.status(), status);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_plane_never_takes_the_client_key() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.api_key = Some("sk-client".into());
    cfg.server.admin_api_key = Some("sk-admin".into());
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    let workers = format!("{}/workers", gw.url);
    let flush = format!("{}/flush_cache", gw.url);

    for key in ["sk-client", "sk-wrong"] {
        let r = c.get(&workers).bearer_auth(key).send().await.unwrap();
        assert_eq!(error_code(r, 401).await, "invalid_api_key", "{key}");
        let r = c.post(&flush).bearer_auth(key).send().await.unwrap();
        assert_eq!(error_code(r, 401).await, "invalid_api_key", "{key}");
        let r = c
            .post(&workers)
            .bearer_auth(key)
            .json(&json!({"url": "http://127.0.0.1:1"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{key}");
        let r = c
            .delete(format!("{workers}?url={}", w.url))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{key}");
    }
    // The admin key works for both, and nothing above changed the pool.
    let r = c.post(&flush).bearer_auth("sk-admin").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let list: Value = c
        .get(&workers)
        .bearer_auth("sk-admin")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["workers"].as_array().unwrap().len(), 1, "{list}");
    // ...and the admin key is not a client key.
    let r = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth("sk-admin")
        .json(&chat("hi", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    gw.shutdown().await;
}

/// A tenant's key is a client key too: one that is also the admin key,
/// listed in the file or in the key file it names, would let that client
/// change the pool, so the config is refused with the tenant named.
#[test]
fn no_tenant_key_may_be_the_admin_key() {
    let keys = std::env::temp_dir().join(format!(
        "radixgate-admin-tenant-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&keys, "- {name: from-file, key: sk-admin}\n").unwrap();
    for tenants in [
        "  keys:\n    - {name: team-a, key: sk-a}\n    - {name: inline, key: sk-admin}\n"
            .to_owned(),
        format!("  api_key_file: {}\n", keys.display()),
    ] {
        let text = format!("server:\n  admin_api_key: sk-admin\ntenants:\n{tenants}");
        let err = Config::from_yaml(&text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("server.admin_api_key"), "{err}");
        assert!(
            err.contains("`inline`") || err.contains("`from-file`"),
            "{err}"
        );
        assert!(!err.contains("sk-admin"), "a key is never shown: {err}");
    }
    let _ = std::fs::remove_file(&keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_urls_with_userinfo_path_query_or_fragment_are_refused() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let c = client();
    let port = w.url.rsplit(':').next().unwrap();
    for (bad, why) in [
        (
            format!("http://attacker:secret@127.0.0.1:{port}"),
            "user information",
        ),
        (format!("http://127.0.0.1:{port}/v1"), "path"),
        (format!("http://127.0.0.1:{port}/?next=x"), "query"),
        (format!("http://127.0.0.1:{port}#x"), "fragment"),
    ] {
        let r = c
            .post(format!("{}/workers", gw.url))
            .json(&json!({"url": bad}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        let body: Value = r.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{bad}: {message}");

        // The same rule holds for the config file and flags.
        let err = config(&[&bad]).validate().unwrap_err().to_string();
        assert!(err.contains("workers") && err.contains(why), "{bad}: {err}");
    }
    // A key from the router's environment is for its config file: a
    // request naming a variable would send its value to the URL it gives.
    let r = c
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": format!("http://127.0.0.2:{port}"), "api_key_env": "HOME"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("api_key_env"),
        "{body}"
    );
    let list: Value = c
        .get(format!("{}/workers", gw.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["workers"].as_array().unwrap().len(), 1, "{list}");
    gw.shutdown().await;
}

/// `POST /workers` of `body` at `gateway`, which must answer 400: the
/// error's message.
async fn refused_add(gateway: &str, body: &Value) -> String {
    let r = client()
        .post(format!("{gateway}/workers"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "{body}");
    let answer: Value = r.json().await.unwrap();
    answer["error"]["message"].as_str().unwrap().to_owned()
}

/// A `POST /workers` body of the wrong shape is told which field is wrong
/// and how, not that it "did not match any variant".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_body_of_the_wrong_shape_names_its_fault() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    for (body, why) in [
        (
            json!({"url": 5}),
            "invalid type: integer `5`, expected a string",
        ),
        (
            json!({"url": "http://127.0.0.2:1", "models": "m"}),
            "invalid type: string \"m\", expected a sequence",
        ),
        (
            json!({"url": "http://127.0.0.2:1", "modles": ["m"]}),
            "unknown field `modles`",
        ),
        (json!({"api_key": "k"}), "missing field `url`"),
        (json!(["http://127.0.0.2:1"]), "invalid type: sequence"),
    ] {
        let message = refused_add(&gw.url, &body).await;
        assert!(message.contains(why), "{body}: {message}");
    }
    assert_eq!(workers(&gw.url).await.len(), 1);
    gw.shutdown().await;
}

/// A model no request can name (empty, or the wildcard pool's `*`) is
/// refused when the worker is posted, naming the field: accepted, the
/// worker's probes passed and the registry refused it on admission, so it
/// stayed pending for good, listed with no problem, and every 503 said it
/// had never answered a health check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_posted_with_a_model_no_request_can_name_is_refused() {
    let w = sim_worker(fast_worker()).await;
    let other = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    for models in [json!(["*"]), json!(["m", ""])] {
        let body = json!({"url": other.url, "models": models});
        let message = refused_add(&gw.url, &body).await;
        assert!(message.contains("models"), "{body}: {message}");
    }
    assert_eq!(workers(&gw.url).await.len(), 1);
    gw.shutdown().await;
}

/// An admin body over its limit is refused like any other fault of the
/// request, with an OpenAI-style 413, on every admin route that takes one;
/// the pool is left as it was. (Headers only: the body is never sent.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_body_over_its_limit_gets_an_openai_style_413() {
    use tokio::io::AsyncWriteExt as _;
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    for path in ["/workers", "/record_trace"] {
        let mut s = tokio::net::TcpStream::connect(gw.url.trim_start_matches("http://"))
            .await
            .unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: 10000000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        // A hang guard, not a speed bound: the body never comes.
        let mut buf = Vec::new();
        let answer = read_http_message(&mut s, &mut buf);
        let (head, body) = tokio::time::timeout(std::time::Duration::from_secs(60), answer)
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer; the router waits for the body"))
            .expect("an answer, not a close");
        assert!(head.starts_with("HTTP/1.1 413"), "{path}: {head}");
        let body: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{path}: {e}: {}", String::from_utf8_lossy(&body)));
        assert_eq!(body["error"]["code"], "payload_too_large", "{path}: {body}");
    }
    assert_eq!(workers(&gw.url).await.len(), 1);
    gw.shutdown().await;
}

/// A worker's key goes out as `Authorization: Bearer <key>`: one that no
/// header can carry (a pasted key with its newline) is refused when the
/// worker is added, naming the key, not accepted to stay pending for good
/// behind "failed to parse header value".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_key_no_header_can_carry_is_refused() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    for key in ["sk-1\n", "sk-\u{7f}1", " sk-1", "sk-1\r\nX-Evil: 1"] {
        let body = json!({"url": "http://127.0.0.2:1", "api_key": key});
        let message = refused_add(&gw.url, &body).await;
        assert!(message.contains("api_key"), "{key:?}: {message}");
        assert!(
            !message.contains("sk-"),
            "{key:?}: the key echoed: {message}"
        );
    }
    assert_eq!(workers(&gw.url).await.len(), 1);
    gw.shutdown().await;
}

/// A host name is case-insensitive: the worker at `http://LOCALHOST:p` is
/// the one at `http://localhost:p/`, added once, and removed by either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_url_spelled_with_another_case_is_the_same_worker() {
    let w = sim_worker(fast_worker()).await;
    let port = w.url.rsplit(':').next().unwrap().to_owned();
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let c = client();
    let post = |url: String| {
        c.post(format!("{}/workers", gw.url))
            .json(&json!({"url": url}))
            .send()
    };
    assert_eq!(
        post(format!("http://LocalHost:{port}"))
            .await
            .unwrap()
            .status(),
        202
    );
    for twin in [
        format!("http://localhost:{port}/"),
        format!("http://LOCALHOST:{port}"),
    ] {
        let r = post(twin.clone()).await.unwrap();
        assert_eq!(r.status(), 409, "{twin}");
    }
    let listed: Vec<Value> = workers(&gw.url).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed
            .iter()
            .any(|w| w["url"] == format!("http://localhost:{port}")),
        "{listed:?}"
    );
    let r = c
        .delete(format!("{}/workers?url=http://LOCALHOST:{port}/", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(workers(&gw.url).await.len(), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_scheme_is_case_insensitive() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.api_key = Some("sk-client".into());
    cfg.server.admin_api_key = Some("sk-admin".into());
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let r = c
            .post(format!("{}/v1/chat/completions", gw.url))
            .header("authorization", format!("{scheme} sk-client"))
            .json(&chat("hi", false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
        let r = c
            .get(format!("{}/workers", gw.url))
            .header("authorization", format!("{scheme} sk-admin"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    // The scheme is case-insensitive, the key is not.
    let r = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("authorization", "bearer SK-CLIENT")
        .json(&chat("hi", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .header("authorization", "Basic sk-client")
        .json(&chat("hi", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    gw.shutdown().await;
}

/// Anthropic's SDKs send their key as `x-api-key`: the client API takes
/// it where no `Authorization` is sent, and, as a Bearer key is, it goes no
/// further than the router. The admin plane does not take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_api_takes_an_x_api_key_and_keeps_it_from_the_worker() {
    let w = sim_worker(fast_worker()).await;
    let t = common::tap::tap(&w.url).await;
    let mut cfg = config(&[&t.url]);
    cfg.server.api_key = Some("sk-client".into());
    cfg.server.admin_api_key = Some("sk-admin".into());
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    let messages = json!({"model": radixgate_sim::server::DEFAULT_MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]});
    let send = |key: &'static str| {
        c.post(format!("{}/v1/messages", gw.url))
            .header("x-api-key", key)
            .json(&messages)
            .send()
    };
    let r = send("sk-client").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        t.last("x-api-key"),
        None,
        "the client's key went to the worker"
    );
    assert_eq!(t.last("authorization"), None);
    assert_eq!(send("sk-wrong").await.unwrap().status(), 401);
    // A Bearer key, when sent, is the one judged.
    let r = c
        .post(format!("{}/v1/messages", gw.url))
        .header("authorization", "Bearer sk-wrong")
        .header("x-api-key", "sk-client")
        .json(&messages)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .get(format!("{}/workers", gw.url))
        .header("x-api-key", "sk-admin")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_method_is_a_405_with_a_json_error_and_allow() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let c = client();
    for (method, path, allow) in [
        (reqwest::Method::GET, "/v1/chat/completions", "POST"),
        (reqwest::Method::PUT, "/generate", "POST"),
        (reqwest::Method::POST, "/v1/models", "GET"),
        (reqwest::Method::PATCH, "/workers", "GET"),
    ] {
        let r = c
            .request(method.clone(), format!("{}{path}", gw.url))
            .send()
            .await
            .unwrap();
        let allowed = r.headers()["allow"].to_str().unwrap().to_owned();
        assert!(allowed.contains(allow), "{method} {path}: Allow {allowed}");
        assert_eq!(
            error_code(r, 405).await,
            "method_not_allowed",
            "{method} {path}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_key_the_admin_plane_is_loopback_only_or_off() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.api_key = Some("sk-client".into());
    assert_eq!(
        cfg.server.admin_access,
        AdminAccess::Loopback,
        "the default"
    );

    // Loopback (the default): a local operator needs no key.
    let gw = gateway_ready(cfg.clone(), 1).await;
    let c = client();
    let r = c.get(format!("{}/workers", gw.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(format!("{}/flush_cache", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    gw.shutdown().await;

    // Off: nobody, with the client key or without.
    cfg.server.admin_access = AdminAccess::Off;
    let gw = gateway_ready(cfg, 1).await;
    for key in [None, Some("sk-client")] {
        let with_key = |b: reqwest::RequestBuilder| match key {
            Some(k) => b.bearer_auth(k),
            None => b,
        };
        let calls = [
            c.get(format!("{}/workers", gw.url)),
            c.post(format!("{}/workers", gw.url))
                .json(&json!({"url": "http://127.0.0.1:1"})),
            c.delete(format!("{}/workers?url={}", gw.url, w.url)),
            c.post(format!("{}/flush_cache", gw.url)),
        ];
        for call in calls {
            let r = with_key(call).send().await.unwrap();
            assert_eq!(r.status(), 403, "{key:?}");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"]["code"], "admin_forbidden", "{body}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains("admin_api_key"), "{message}");
        }
    }
    // The pool is untouched and the client API still serves.
    let r = c
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth("sk-client")
        .json(&chat("still here", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    gw.shutdown().await;
}

/// A network namespace of this test's own, joined to the host by a veth
/// pair: the gateway listens on the host end, a client runs inside the
/// namespace, so the gateway's peer really is off loopback, and the
/// traffic never leaves this machine. Deleted (with its veth pair) on drop.
/// Needs root and iproute2 (`.ci/run` installs `iproute2` and `curl`).
struct Netns {
    name: String,
    host_ip: IpAddr,
}

impl Netns {
    fn new() -> Self {
        let id = std::process::id();
        let name = format!("rgsec{id}");
        // A /30 per process, so concurrent runs do not collide.
        let net = format!("10.213.{}.{}", (id / 64) % 250, (id % 64) * 4);
        let base: std::net::Ipv4Addr = net.parse().unwrap();
        let host = std::net::Ipv4Addr::from(u32::from(base) + 1);
        let inner = std::net::Ipv4Addr::from(u32::from(base) + 2);
        let (outer_dev, inner_dev) = (format!("rgh{id}"), format!("rgn{id}"));
        let ns = Self {
            name: name.clone(),
            host_ip: IpAddr::V4(host),
        };
        for args in [
            vec!["netns", "add", &name],
            vec![
                "link", "add", &outer_dev, "type", "veth", "peer", "name", &inner_dev,
            ],
            vec!["link", "set", &inner_dev, "netns", &name],
            vec!["addr", "add", &format!("{host}/30"), "dev", &outer_dev],
            vec!["link", "set", &outer_dev, "up"],
            vec![
                "-n",
                &name,
                "addr",
                "add",
                &format!("{inner}/30"),
                "dev",
                &inner_dev,
            ],
            vec!["-n", &name, "link", "set", &inner_dev, "up"],
            vec!["-n", &name, "link", "set", "lo", "up"],
        ] {
            let out = std::process::Command::new("ip")
                .args(&args)
                .output()
                .expect("`ip` (iproute2) must be installed: .ci/run installs it");
            assert!(
                out.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        ns
    }

    /// `curl` from inside the namespace: the status code and the body.
    async fn curl(&self, args: &[&str]) -> (u16, Value) {
        let out = tokio::process::Command::new("ip")
            .args(["netns", "exec", &self.name, "curl", "-sS", "-m", "20"])
            .args(["-w", "\n%{http_code}"])
            .args(args)
            .output()
            .await
            .expect("`curl` must be installed: .ci/run installs it");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "curl {args:?}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (body, status) = text.rsplit_once('\n').unwrap();
        (
            status.trim().parse().unwrap(),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }
}

impl Netns {
    /// Waits, asking from inside the namespace, until the gateway has its
    /// one worker admitted.
    async fn wait_for_healthy(&self, gateway: &str) {
        let url = format!("{gateway}/readiness");
        wait_until("the worker admitted", || async {
            let (status, body) = self.curl(&[&url]).await;
            status == 200 && body["healthy_workers"].as_u64() == Some(1)
        })
        .await;
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair with it.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A gateway listening on `ip` (port 0).
async fn gateway_on(ip: IpAddr, config: Config) -> Gateway {
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(radixgate::server::run(listener, config, stop.clone()));
    Gateway { url, stop, task }
}

/// A real TCP peer off loopback: a client in a network namespace of the
/// test's own calls the gateway over a veth pair, so the peer address the
/// gateway sees is the namespace's. (Binding 127.0.0.2 would not do: it is
/// loopback too.) `admin::tests` covers the same rule with hand-set peers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_off_loopback_is_refused_without_the_admin_key() {
    let ns = Netns::new();
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_on(ns.host_ip, config(&[&w.url])).await;
    ns.wait_for_healthy(&gw.url).await;
    let workers = format!("{}/workers", gw.url);
    let (status, body) = ns.curl(&[&workers]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("admin_forbidden"))
    );
    let flush = format!("{}/flush_cache", gw.url);
    let (status, body) = ns.curl(&["-X", "POST", &flush]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (403, Some("admin_forbidden"))
    );
    let add = r#"{"url": "http://127.0.0.1:1"}"#;
    let (status, _) = ns
        .curl(&["-H", "content-type: application/json", "-d", add, &workers])
        .await;
    assert_eq!(status, 403);
    // The client API is served to the same peer.
    let chat_body = chat("remote", false).to_string();
    let chat_url = format!("{}/v1/chat/completions", gw.url);
    let (status, body) = ns
        .curl(&[
            "-H",
            "content-type: application/json",
            "-d",
            &chat_body,
            &chat_url,
        ])
        .await;
    assert_eq!(status, 200, "{body}");
    gw.shutdown().await;

    // With an admin key, the key decides, from anywhere.
    let mut cfg = config(&[&w.url]);
    cfg.server.admin_api_key = Some("sk-admin".into());
    let gw = gateway_on(ns.host_ip, cfg).await;
    ns.wait_for_healthy(&gw.url).await;
    let workers = format!("{}/workers", gw.url);
    let (status, body) = ns.curl(&[&workers]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    let (status, _) = ns
        .curl(&["-H", "authorization: Bearer sk-admin", &workers])
        .await;
    assert_eq!(status, 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_workers_must_match_the_allowlist() {
    let a = sim_worker(fast_worker()).await;
    let b = sim_worker(fast_worker()).await;
    let port = b.url.rsplit(':').next().unwrap().to_owned();
    let c = client();
    let post = |gw: &str, url: String| {
        c.post(format!("{gw}/workers"))
            .json(&json!({"url": url}))
            .send()
    };

    // A configured worker is trusted even outside the allowlist.
    let mut cfg = config(&[&a.url]);
    cfg.server.worker_allowlist = vec!["10.0.0.0/8".into(), "*.svc.cluster.local".into()];
    let gw = gateway_ready(cfg, 1).await;
    let r = post(&gw.url, b.url.clone()).await.unwrap();
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "worker_not_allowed");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("server.worker_allowlist") && message.contains("10.0.0.0/8"),
        "{message}"
    );
    let r = post(&gw.url, format!("http://localhost:{port}"))
        .await
        .unwrap();
    assert_eq!(error_code(r, 403).await, "worker_not_allowed");
    let named = "http://sglang-0.llm.svc.cluster.local:30000".to_owned();
    assert_eq!(post(&gw.url, named.clone()).await.unwrap().status(), 202);
    let r = c
        .delete(format!("{}/workers?url={named}", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    gw.shutdown().await;

    // A network that holds the worker admits it; a name is not resolved to
    // check it against networks.
    let mut cfg = config(&[&a.url]);
    cfg.server.worker_allowlist = vec!["127.0.0.0/8".into()];
    let gw = gateway_ready(cfg, 1).await;
    let r = post(&gw.url, format!("http://localhost:{port}"))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("not resolved"), "{message}");
    assert_eq!(post(&gw.url, b.url.clone()).await.unwrap().status(), 202);
    wait_for_healthy(&gw.url, 2).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_their_key_when_one_is_set() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.api_key = Some("sk-client".into());
    cfg.server.metrics_api_key = Some("sk-metrics".into());
    let spare = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = spare.local_addr().unwrap().port();
    cfg.metrics.prometheus_port = Some(port);
    drop(spare);
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    for base in [gw.url.clone(), format!("http://127.0.0.1:{port}")] {
        let metrics = format!("{base}/metrics");
        let r = c.get(&metrics).send().await.unwrap();
        assert_eq!(error_code(r, 401).await, "invalid_api_key", "{base}");
        let r = c
            .get(&metrics)
            .bearer_auth("sk-client")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            401,
            "{base}: the client key is not the metrics key"
        );
        let r = c
            .get(&metrics)
            .header("authorization", "bearer sk-metrics")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{base}");
        assert!(r.text().await.unwrap().contains("radixgate_"), "{base}");
    }
    gw.shutdown().await;

    // Without a metrics key, /metrics stays open to scrapers, even when
    // the client API has a key.
    let mut cfg = config(&[&w.url]);
    cfg.server.api_key = Some("sk-client".into());
    let gw = gateway_ready(cfg, 1).await;
    let r = c.get(format!("{}/metrics", gw.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    gw.shutdown().await;
}

/// Pages of the origins in `cors_allowed_origins` may call the client API
/// from a browser: a preflight is answered before the key is asked, and
/// each answer names the origin. Other origins get nothing of it, and the
/// admin plane answers no origin at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_origins_may_call_the_client_api_and_no_other() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.api_key = Some("sk-client".into());
    cfg.server.admin_api_key = Some("sk-admin".into());
    cfg.server.cors_allowed_origins = vec!["https://chat.example".into()];
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    let preflight = |path: &str, origin: &'static str| {
        c.request(reqwest::Method::OPTIONS, format!("{}{path}", gw.url))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
    };
    let r = preflight("/v1/chat/completions", "https://chat.example")
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://chat.example");
    assert!(
        h["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST")
    );
    assert_eq!(
        h["access-control-allow-headers"],
        "authorization, content-type"
    );
    // The call itself still needs the key, and names the origin.
    let call = |origin: &'static str, key: Option<&'static str>| {
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        let mut request = c
            .post(format!("{}/v1/chat/completions", gw.url))
            .header("origin", origin)
            .json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send()
    };
    let r = call("https://chat.example", None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://chat.example"
    );
    let r = call("https://chat.example", Some("sk-client"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://chat.example");
    assert!(
        h["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .contains("x-radixgate-worker")
    );
    // Another origin: no preflight answer, no allowance.
    let r = preflight("/v1/chat/completions", "https://evil.example")
        .await
        .unwrap();
    assert_eq!(error_code(r, 405).await, "method_not_allowed");
    let r = call("https://evil.example", Some("sk-client"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    // The admin plane answers no origin.
    let r = preflight("/workers", "https://chat.example").await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    assert_ne!(r.status(), 204);
    gw.shutdown().await;
}

/// Engines answer pages of any origin by default (SGLang echoes the page's
/// origin and allows credentials; vLLM sends `*`). Behind the router its
/// own `cors_allowed_origins` decides alone: a worker's CORS headers never
/// reach the client, or a page of an origin the operator did not list (or
/// of any origin, with none listed) could read answers the router calls
/// private.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_cors_headers_never_reach_the_client() {
    use axum::http::HeaderMap;
    use axum::routing::{get, post};
    // A worker that answers CORS as SGLang's middleware does.
    async fn permissive(headers: HeaderMap) -> impl axum::response::IntoResponse {
        let origin = headers
            .get("origin")
            .and_then(|o| o.to_str().ok())
            .unwrap_or("*")
            .to_owned();
        (
            [
                ("access-control-allow-origin", origin),
                ("access-control-allow-credentials", "true".to_owned()),
                ("access-control-expose-headers", "x-secret".to_owned()),
            ],
            axum::Json(json!({
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            })),
        )
    }
    let models = json!({"data": [{"id": radixgate_sim::server::DEFAULT_MODEL}]});
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(move || async move { axum::Json(models) }))
        .route("/v1/chat/completions", post(permissive));
    let (worker, stop) = serve_app(app).await;
    let call = |gw: String, origin: &'static str| async move {
        client()
            .post(format!("{gw}/v1/chat/completions"))
            .header("origin", origin)
            .json(&chat("hi", false))
            .send()
            .await
            .unwrap()
    };
    for listed in [vec![], vec!["https://chat.example".to_owned()]] {
        let mut cfg = config(&[&worker]);
        cfg.server.cors_allowed_origins = listed.clone();
        let gw = gateway_ready(cfg, 1).await;
        let r = call(gw.url.clone(), "https://evil.example").await;
        assert_eq!(r.status(), 200);
        let h = r.headers();
        for name in [
            "access-control-allow-origin",
            "access-control-allow-credentials",
            "access-control-expose-headers",
        ] {
            assert!(h.get(name).is_none(), "{listed:?}: {name} passed: {h:?}");
        }
        if !listed.is_empty() {
            // A listed origin gets the router's answer, not the worker's.
            let r = call(gw.url.clone(), "https://chat.example").await;
            assert_eq!(r.status(), 200);
            let h = r.headers();
            assert_eq!(h["access-control-allow-origin"], "https://chat.example");
            assert!(h.get("access-control-allow-credentials").is_none(), "{h:?}");
            let exposed = h["access-control-expose-headers"].to_str().unwrap();
            assert!(!exposed.contains("x-secret"), "{exposed}");
        }
        gw.shutdown().await;
    }
    stop.cancel();
}

/// The `x-radixgate-*` headers are the router's own account of a request
/// (which worker, why, which prefill worker). A worker's answer carrying
/// any of them (another radixgate behind this one, or a worker that lies)
/// must not pass for the router's: without PD a worker's
/// `x-radixgate-prefill-worker` reached the client as if this router had
/// paired the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_radixgate_headers_never_reach_the_client() {
    use axum::routing::{get, post};
    async fn claims() -> impl axum::response::IntoResponse {
        (
            [
                ("x-radixgate-worker", "http://elsewhere:1"),
                ("x-radixgate-decision", "made up"),
                ("x-radixgate-prefill-worker", "http://elsewhere:2"),
                ("x-radixgate-note", "1"),
                ("x-radixgate", "kept"),
            ],
            axum::Json(json!({
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            })),
        )
    }
    let models = json!({"data": [{"id": radixgate_sim::server::DEFAULT_MODEL}]});
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(move || async move { axum::Json(models) }))
        .route("/v1/chat/completions", post(claims));
    let (worker, stop) = serve_app(app).await;
    let gw = gateway_ready(config(&[&worker]), 1).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat("hi", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers();
    assert_eq!(h.get_all("x-radixgate-worker").iter().count(), 1, "{h:?}");
    assert_eq!(h["x-radixgate-worker"], worker.as_str());
    assert_eq!(h.get_all("x-radixgate-decision").iter().count(), 1, "{h:?}");
    assert_ne!(h["x-radixgate-decision"], "made up");
    assert!(h.get("x-radixgate-prefill-worker").is_none(), "{h:?}");
    assert!(h.get("x-radixgate-note").is_none(), "{h:?}");
    assert_eq!(h["x-radixgate"], "kept");
    gw.shutdown().await;
    stop.cancel();
}

/// A URL that spells out its scheme's default port names the server one
/// without it names: `POST /workers` of `http://h:80` beside a configured
/// `http://h` was taken for a second worker (two entries, two trees, twice
/// the load counted for one server), and `DELETE` by one spelling missed
/// the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_is_one_worker_with_its_default_port_written_or_not() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url, "http://127.0.0.3"]), 1).await;
    let c = client();
    let r = c
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": "HTTP://127.0.0.3:80/"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("already registered"), "{message}");
    let listed = |c: reqwest::Client| {
        let url = format!("{}/workers", gw.url);
        async move {
            let list: Value = c.get(url).send().await.unwrap().json().await.unwrap();
            list["workers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w["url"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let urls = listed(c.clone()).await;
    assert_eq!(urls.len(), 2, "{urls:?}");
    assert!(urls.contains(&"http://127.0.0.3".to_owned()), "{urls:?}");
    let r = c
        .delete(format!("{}/workers?url=http://127.0.0.3:80", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(listed(c.clone()).await, vec![w.url.clone()]);
    gw.shutdown().await;
}

/// A page of an allowed origin may do with a stored response (Responses
/// API) what the client API takes: fetch it, cancel it, and delete it. A
/// browser sends a `DELETE` only after a preflight allowing it; the
/// preflight's answer allowed GET and POST alone, so the page's delete
/// never left the browser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_an_allowed_origin_may_delete_its_stored_response() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[&w.url]);
    cfg.server.api_key = Some("sk-client".into());
    cfg.server.cors_allowed_origins = vec!["https://chat.example".into()];
    let gw = gateway_ready(cfg, 1).await;
    let c = client();
    let made = c
        .post(format!("{}/v1/responses", gw.url))
        .bearer_auth("sk-client")
        .json(&json!({"model": radixgate_sim::server::DEFAULT_MODEL, "input": "hello"}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 200);
    let made: Value = made.json().await.unwrap();
    let id = made["id"].as_str().expect("the response's id").to_owned();
    let url = format!("{}/v1/responses/{id}", gw.url);
    let r = c
        .request(reqwest::Method::OPTIONS, &url)
        .header("origin", "https://chat.example")
        .header("access-control-request-method", "DELETE")
        .header("access-control-request-headers", "authorization")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://chat.example");
    let allowed = h["access-control-allow-methods"].to_str().unwrap();
    assert!(
        allowed.split(',').any(|m| m.trim() == "DELETE"),
        "the preflight allows {allowed}"
    );
    // The delete the browser then sends.
    let r = c
        .delete(&url)
        .header("origin", "https://chat.example")
        .bearer_auth("sk-client")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://chat.example"
    );
    let deleted: Value = r.json().await.unwrap();
    assert_eq!(deleted["deleted"], true, "{deleted}");
    gw.shutdown().await;
}
