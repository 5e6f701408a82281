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
//! (127.0.0.0/8, ::1) or nobody. The client key never opens it: a client
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
        (None, AdminAccess::Loopback) if from_loopback(&req) => None,
        (None, AdminAccess::Loopback) => Some(GatewayError::AdminForbidden {
            reason: "without server.admin_api_key (--admin-api-key) the admin API takes only \
                     loopback peers (127.0.0.0/8, ::1)",
        }),
    };
    match refusal {
        Some(err) => {
            let unauthorized = matches!(err, GatewayError::Unauthorized);
            let mut response = err.into_response();
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

/// `GET /workers`.
pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Response {
    Json(json!({"workers": state.shared.control.list().await})).into_response()
}

/// `POST /workers`.
pub(crate) async fn add(State(state): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    let spec: WorkerSpec = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(err) => return GatewayError::BadRequest(err.into()).into_response(),
    };
    let url = spec.url.clone();
    if let Err(reason) = state.shared.config.pd_role_fits(&spec) {
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
pub(crate) async fn remove(
    State(state): State<Arc<AppState>>,
    Query(q): Query<RemoveQuery>,
) -> Response {
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
