//! The security rules of `radixgate serve`, end to end on loopback: who may
//! use the admin plane, which worker URLs are accepted, the `/metrics` key,
//! the bearer scheme, and errors for wrong methods.

mod common;

use common::*;
use serde_json::{Value, json};

/// The OpenAI-style error code of a response, after checking its status.
async fn error_code(r: reqwest::Response, status: u16) -> String {
    assert_eq!(r.status(), status);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].is_string(), "{body}");
    body["error"]["code"].as_str().unwrap_or_default().to_owned()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_urls_with_userinfo_path_query_or_fragment_are_refused() {
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(config(&[&w.url]), 1).await;
    let c = client();
    let port = w.url.rsplit(':').next().unwrap();
    for (bad, why) in [
        (format!("http://attacker:secret@127.0.0.1:{port}"), "user information"),
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
