//! The admin plane: everything that changes or inspects the worker pool
//! (`/workers`, `/flush_cache`), behind one gate.
//!
//! `POST /workers` takes `{"url": ..., "api_key"?: ..., "models"?: [...]}`
//! and answers 202: the worker is probed and admitted once healthy.
//! `GET /workers` lists every known worker with its state.
//! `DELETE /workers?url=...` drains one: no new requests from then on; it
//! is removed once its requests in flight finish (`"state": "draining"`
//! until then, `"removed"` at once when none is in flight).
//! `POST /flush_cache` tells every worker to drop its prefix cache.
//! `GET`/`POST`/`DELETE /record_trace` show, start and stop the trace
//! recording (`record/admin.rs`).
//!
//! Who may call it ([`gate`]): whoever sends `server.admin_api_key`, from
//! anywhere; without that key, by `server.admin_access`, peers on loopback
//! (127.0.0.0/8, ::1) or nobody. A loopback peer is taken for a local
//! caller (a shell, a sidecar, `kubectl port-forward`) only if nothing in
//! the request says otherwise ([`elsewhere`]): a browser on the host sends
//! a web page's requests from loopback too (a cross-site form's or
//! `fetch`'s `POST /workers`, or a page whose name was rebound to
//! 127.0.0.1), and a proxy on the host (a TLS terminator, a service-mesh
//! sidecar) relays anyone's. The client key never opens it: a client
//! that could add a worker could have the next user's request answered by
//! its own server. [`router`] is the one route group; anything added to the
//! admin plane later (a runtime switch) goes in it and so behind the gate.
//! Runtime workers are further held to `server.worker_allowlist` by the
//! control task.
//!
//! The live status page ([`crate::dashboard`]) sits behind the same gate,
//! which there also takes the key as an HTTP Basic password and answers a
//! refusal with a Basic challenge, so a browser asks for it. Only there:
//! a browser sends remembered Basic credentials with any request to the
//! site, a cross-site form's `POST /workers` included, so the routes that
//! change the pool take the key as a Bearer token alone, which a browser
//! never adds on its own. The dashboard's routes only read.

use crate::auth::{RequiredKey, basic_matches, bearer_matches};
use crate::config::{AdminAccess, WorkerSpec};
use crate::error::GatewayError;
use crate::info;
use crate::record::admin as record;
use crate::state::{AppState, Shared};
use axum::extract::rejection::QueryRejection;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;

/// The admin plane's routes, behind its [`gate`].
pub(crate) fn router(shared: &Shared) -> Router<Arc<AppState>> {
    let gate_state = Gate {
        key: shared.keys.admin.clone(),
        access: shared.config.server.admin_access,
        browser: false,
    };
    let pages = Gate {
        browser: true,
        ..gate_state.clone()
    };
    Router::new()
        .route("/workers", get(list).post(add).delete(remove))
        .route("/flush_cache", post(info::flush_cache))
        .route(
            "/record_trace",
            get(record::status).post(record::start).delete(record::stop),
        )
        .route_layer(axum::middleware::from_fn_with_state(gate_state, gate))
        .merge(
            crate::dashboard::routes()
                .route_layer(axum::middleware::from_fn_with_state(pages, gate)),
        )
}

/// Who may pass the admin plane's gate.
#[derive(Clone, Debug)]
pub(crate) struct Gate {
    /// `server.admin_api_key` (a reload may replace it); when set, it
    /// alone decides.
    key: RequiredKey,
    /// `server.admin_access`, used only without a key.
    access: AdminAccess,
    /// Read-only pages for a browser: the key is also taken as an HTTP
    /// Basic password, and a 401 offers Basic, so the browser asks for it.
    browser: bool,
}

/// The challenge of a browser page's 401 (RFC 7617): any user name, the
/// admin key as the password.
const BASIC_CHALLENGE: &str =
    r#"Basic realm="radixgate admin (password: the admin key)", charset="UTF-8""#;

/// Middleware: the admin plane's access rule. The peer address comes from
/// the connection (`ConnectInfo`); a request without one (not from a
/// serving thread) is not taken for loopback.
pub(crate) async fn gate(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let key = gate.key.get();
    let refusal = match (&key, gate.access) {
        (Some(key), _) if bearer_matches(req.headers(), key) => None,
        (Some(key), _) if gate.browser && basic_matches(req.headers(), key) => None,
        (Some(_), _) => Some(GatewayError::Unauthorized),
        (None, AdminAccess::Off) => Some(GatewayError::AdminForbidden {
            reason: "the admin API is off: set server.admin_api_key (--admin-api-key) to use it",
        }),
        (None, AdminAccess::Loopback) if from_loopback(&req) => {
            elsewhere(&req).map(|reason| GatewayError::AdminForbidden { reason })
        }
        (None, AdminAccess::Loopback) => Some(GatewayError::AdminForbidden {
            reason: "without server.admin_api_key (--admin-api-key) the admin API takes only \
                     loopback peers (127.0.0.0/8, ::1)",
        }),
    };
    match refusal {
        Some(err) => {
            let unauthorized = matches!(err, GatewayError::Unauthorized);
            let mut response = crate::error::refused_unread(&req, err);
            if gate.browser && unauthorized {
                response.headers_mut().append(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(BASIC_CHALLENGE),
                );
            }
            response
        }
        None => next.run(req).await,
    }
}

/// Whether the request's TCP peer is a loopback address (an IPv4-mapped
/// IPv6 one included).
fn from_loopback(req: &Request) -> bool {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(peer)| peer.ip().to_canonical().is_loopback())
}

/// Why a request from a loopback peer is not a local caller's, if it is
/// not: it came through a proxy (it names a client of its own), a browser
/// sent it for a page of another site (`Sec-Fetch-Site`, `Origin`), or it
/// is addressed to a name other than loopback's (DNS rebinding: a page's
/// own name, resolved to 127.0.0.1).
fn elsewhere(req: &Request) -> Option<&'static str> {
    let headers = req.headers();
    const PROXIED: [&str; 5] = [
        "forwarded",
        "x-forwarded-for",
        "x-real-ip",
        "x-forwarded-client-cert",
        "x-envoy-external-address",
    ];
    if PROXIED.iter().any(|name| headers.contains_key(*name)) {
        return Some(
            "without server.admin_api_key (--admin-api-key) the admin API takes only loopback \
             peers, and this request came through a proxy (it names a client of its own)",
        );
    }
    let site = headers.get("sec-fetch-site").map(HeaderValue::as_bytes);
    let origin = headers.get(header::ORIGIN).map(HeaderValue::as_bytes);
    let page_elsewhere = site.is_some_and(|s| s != b"same-origin" && s != b"none")
        || origin.is_some_and(|o| !origin_is_loopback(o));
    if page_elsewhere {
        return Some(
            "without server.admin_api_key (--admin-api-key) the admin API takes only loopback \
             peers, and this request was sent by a web page of another site",
        );
    }
    // The target's authority (HTTP/2's `:authority`, an absolute-form
    // target) comes parsed, its host without the port; `Host` as written.
    let loopback_host = match req.uri().authority() {
        Some(authority) => host_is_loopback(authority.host().as_bytes()),
        None => headers
            .get(header::HOST)
            .is_none_or(|h| host_is_loopback(without_port(h.as_bytes()))),
    };
    if !loopback_host {
        return Some(
            "without server.admin_api_key (--admin-api-key) the admin API takes only loopback \
             peers, addressed as localhost or a loopback address; this request names another host",
        );
    }
    None
}

/// An `Origin` of a loopback host (`http://127.0.0.1:30000`,
/// `http://localhost`); `null` is not.
fn origin_is_loopback(origin: &[u8]) -> bool {
    let Some(rest) = std::str::from_utf8(origin)
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest)
    else {
        return false;
    };
    host_is_loopback(without_port(rest.as_bytes()))
}

/// `host[:port]` or `[v6][:port]` less its port.
fn without_port(authority: &[u8]) -> &[u8] {
    if authority.first() == Some(&b'[') {
        return match authority.iter().position(|&b| b == b']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    match authority.iter().rposition(|&b| b == b':') {
        Some(colon) => &authority[..colon],
        None => authority,
    }
}

/// `localhost` (or a name under it, RFC 6761), or a loopback address
/// (`[::1]` with its brackets).
fn host_is_loopback(host: &[u8]) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    let literal = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(&host);
    literal
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

/// `GET /workers`.
pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({"workers": state.shared.control.list().await})).into_response()
}

/// The largest admin request body: a worker, or a recording's settings,
/// need far less (and `server.max_payload_size` is sized for prompts).
pub(crate) const MAX_BODY: usize = 1 << 20;

/// An admin request's body, read as every body is (`crate::body`: its
/// size, declared or grown, its time, the shared budget), within
/// [`MAX_BODY`], so a refusal is an OpenAI-style error like the others.
/// axum's own extractor waited for a declared oversize body before it
/// refused it, in plain text.
pub(crate) async fn body(state: &AppState, req: Request) -> Result<axum::body::Bytes, Response> {
    let shared = &state.shared.bodies;
    let limits = crate::body::BodyLimits {
        max_size: shared.max_size.min(MAX_BODY),
        ..shared.clone()
    };
    let (parts, body) = req.into_parts();
    crate::body::read(&parts.headers, body, &limits)
        .await
        .map_err(IntoResponse::into_response)
}

/// `POST /workers`.
pub(crate) async fn add(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let body = match body(&state, req).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let spec: WorkerSpec = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(err) => return GatewayError::BadRequest(err.into()).into_response(),
    };
    let url = spec.url.clone();
    if spec.api_key_env.is_some() {
        // The request would name a variable of the router's own
        // environment, whose value then goes to the URL it gives.
        return GatewayError::InvalidRequest(
            "`api_key_env` is for the configuration file; give the worker's `api_key` here".into(),
        )
        .into_response();
    }
    if let Err(reason) = state.shared.config.worker_fits(&spec) {
        return GatewayError::Admin(radixgate_routing::RoutingError::InvalidWorker { url, reason })
            .into_response();
    }
    match state.shared.control.add(spec).await {
        Ok(()) => (
            StatusCode::ACCEPTED,
            Json(json!({"url": url, "state": "pending"})),
        )
            .into_response(),
        Err(err) => err.into_response(),
    }
}

/// Query of `DELETE /workers`.
#[derive(Deserialize)]
pub(crate) struct RemoveQuery {
    url: Option<String>,
}

/// `DELETE /workers?url=...`: a drain (see [`crate::control::Control::drain`]).
/// A query that is not one (`?url=a&url=b`) is a 400 with an OpenAI-style
/// body like the others, not axum's plain-text rejection.
pub(crate) async fn remove(
    State(state): State<Arc<AppState>>,
    query: Result<Query<RemoveQuery>, QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(err) => {
            return GatewayError::InvalidRequest(format!(
                "DELETE /workers takes ?url=<worker URL>: {}",
                err.body_text()
            ))
            .into_response();
        }
    };
    let Some(url) = q.url else {
        return GatewayError::InvalidRequest("DELETE /workers needs ?url=<worker URL>".into())
            .into_response();
    };
    match state.shared.control.drain(url.clone()).await {
        Ok(drained) => Json(json!({"url": url, "state": drained})).into_response(),
        Err(err) => err.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt as _;

    /// The gate in front of a route that answers 200.
    fn gated(key: Option<&str>, access: AdminAccess) -> Router {
        gated_as(key, access, false)
    }

    fn gated_as(key: Option<&str>, access: AdminAccess, browser: bool) -> Router {
        let required = RequiredKey::default();
        required.set(key);
        let gate_state = Gate {
            key: required,
            access,
            browser,
        };
        Router::new()
            .route("/workers", get(|| async { "ok" }))
            .route_layer(axum::middleware::from_fn_with_state(gate_state, gate))
    }

    async fn status(app: &Router, peer: Option<&str>, bearer: Option<&str>) -> StatusCode {
        let auth = bearer.map(|key| format!("Bearer {key}"));
        answer(app, peer, auth.as_deref()).await.status()
    }

    async fn answer(app: &Router, peer: Option<&str>, auth: Option<&str>) -> Response {
        let mut req = Request::builder().uri("/workers");
        if let Some(auth) = auth {
            req = req.header("authorization", auth);
        }
        let mut req = req.body(Body::empty()).unwrap();
        if let Some(peer) = peer {
            let peer: SocketAddr = peer.parse().unwrap();
            req.extensions_mut().insert(ConnectInfo(peer));
        }
        app.clone().oneshot(req).await.unwrap()
    }

    /// The `WWW-Authenticate` challenges of an answer.
    fn challenges(r: &Response) -> Vec<String> {
        r.headers()
            .get_all(header::WWW_AUTHENTICATE)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    #[tokio::test]
    async fn basic_opens_browser_pages_only() {
        // base64("admin:sk-admin") and base64("admin:sk-other").
        let good = "Basic YWRtaW46c2stYWRtaW4=";
        let bad = "Basic YWRtaW46c2stb3RoZXI=";
        let pages = gated_as(Some("sk-admin"), AdminAccess::Loopback, true);
        let api = gated_as(Some("sk-admin"), AdminAccess::Loopback, false);
        let peer = Some("203.0.113.9:5");
        assert_eq!(
            answer(&pages, peer, Some(good)).await.status(),
            StatusCode::OK
        );
        assert_eq!(
            answer(&pages, peer, Some("Bearer sk-admin")).await.status(),
            StatusCode::OK
        );
        for auth in [Some(bad), None] {
            let refused = answer(&pages, peer, auth).await;
            assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
            let offered = challenges(&refused);
            assert!(
                offered.iter().any(|c| c.starts_with("Basic realm=")),
                "{offered:?}"
            );
        }
        // The pool-changing routes never take a browser's Basic credentials,
        // nor offer them.
        let refused = answer(&api, peer, Some(good)).await;
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(challenges(&refused), ["Bearer"]);
        // Without a key, the pages follow admin_access like the rest.
        let open = gated_as(None, AdminAccess::Loopback, true);
        assert_eq!(
            status(&open, Some("127.0.0.1:5"), None).await,
            StatusCode::OK
        );
        assert_eq!(
            answer(&open, peer, Some(good)).await.status(),
            StatusCode::FORBIDDEN
        );
    }

    #[tokio::test]
    async fn without_a_key_only_loopback_peers_pass() {
        let app = gated(None, AdminAccess::Loopback);
        for peer in [
            "127.0.0.1:5",
            "127.0.0.2:5",
            "[::1]:5",
            "[::ffff:127.0.0.1]:5",
        ] {
            assert_eq!(
                status(&app, Some(peer), None).await,
                StatusCode::OK,
                "{peer}"
            );
        }
        for peer in [
            "10.0.0.1:5",
            "192.0.2.2:5",
            "[fd00::2]:5",
            "[::ffff:10.0.0.1]:5",
            "0.0.0.0:5",
        ] {
            assert_eq!(
                status(&app, Some(peer), None).await,
                StatusCode::FORBIDDEN,
                "{peer}"
            );
        }
        // No peer address at all is not loopback.
        assert_eq!(status(&app, None, None).await, StatusCode::FORBIDDEN);
    }

    /// A loopback peer without the key is a local caller only if nothing
    /// says otherwise: a web page of another site, a name other than
    /// loopback's, a proxy relaying a client.
    #[tokio::test]
    async fn without_a_key_a_browser_page_or_a_proxy_on_the_host_is_refused() {
        let app = gated(None, AdminAccess::Loopback);
        let ask = |headers: &[(&'static str, &'static str)]| {
            let app = app.clone();
            let headers = headers.to_vec();
            async move {
                let mut req = Request::builder().uri("/workers");
                for (name, value) in headers {
                    req = req.header(name, value);
                }
                let mut req = req.body(Body::empty()).unwrap();
                req.extensions_mut()
                    .insert(ConnectInfo("127.0.0.1:5".parse::<SocketAddr>().unwrap()));
                app.oneshot(req).await.unwrap().status()
            }
        };
        // What curl, a sidecar on loopback, kubectl port-forward and the
        // router's own status page send.
        for local in [
            &[][..],
            &[("host", "127.0.0.1:30000")],
            &[("host", "localhost:30000")],
            &[("host", "[::1]:30000")],
            &[("host", "LOCALHOST.")],
            &[("host", "router.localhost:8080")],
            &[
                ("host", "127.0.0.1:30000"),
                ("origin", "http://127.0.0.1:30000"),
                ("sec-fetch-site", "same-origin"),
            ],
            &[("host", "localhost:30000"), ("sec-fetch-site", "none")],
        ] {
            assert_eq!(ask(local).await, StatusCode::OK, "{local:?}");
        }
        for elsewhere in [
            &[
                ("host", "127.0.0.1:30000"),
                ("sec-fetch-site", "cross-site"),
            ][..],
            &[("host", "127.0.0.1:30000"), ("sec-fetch-site", "same-site")],
            &[
                ("host", "127.0.0.1:30000"),
                ("origin", "https://evil.example"),
            ],
            &[("host", "127.0.0.1:30000"), ("origin", "null")],
            &[("host", "evil.example:30000")],
            &[("host", "127.0.0.1.evil.example")],
            &[("host", "10.0.0.5:30000")],
            &[
                ("host", "127.0.0.1:30000"),
                ("x-forwarded-for", "203.0.113.9"),
            ],
            &[
                ("host", "127.0.0.1:30000"),
                ("forwarded", "for=203.0.113.9"),
            ],
            &[
                ("host", "127.0.0.1:30000"),
                ("x-forwarded-client-cert", "By=spiffe://x"),
            ],
        ] {
            assert_eq!(ask(elsewhere).await, StatusCode::FORBIDDEN, "{elsewhere:?}");
        }
        // The key decides wherever the request came from.
        let keyed = gated(Some("sk-admin"), AdminAccess::Loopback);
        let mut req = Request::builder()
            .uri("/workers")
            .header("authorization", "Bearer sk-admin")
            .header("host", "evil.example")
            .header("sec-fetch-site", "cross-site")
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(ConnectInfo("127.0.0.1:5".parse::<SocketAddr>().unwrap()));
        assert_eq!(keyed.oneshot(req).await.unwrap().status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn off_refuses_everyone() {
        let app = gated(None, AdminAccess::Off);
        assert_eq!(
            status(&app, Some("127.0.0.1:5"), None).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            status(&app, Some("127.0.0.1:5"), Some("x")).await,
            StatusCode::FORBIDDEN
        );
    }

    #[tokio::test]
    async fn a_key_decides_from_anywhere() {
        for access in [AdminAccess::Loopback, AdminAccess::Off] {
            let app = gated(Some("sk-admin"), access);
            for peer in [Some("127.0.0.1:5"), Some("203.0.113.9:5"), None] {
                assert_eq!(status(&app, peer, Some("sk-admin")).await, StatusCode::OK);
                assert_eq!(
                    status(&app, peer, Some("sk-other")).await,
                    StatusCode::UNAUTHORIZED
                );
                assert_eq!(status(&app, peer, None).await, StatusCode::UNAUTHORIZED);
            }
        }
    }
}
