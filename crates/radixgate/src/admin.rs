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
//! admin plane later (a dashboard, a runtime switch) goes in it and so
//! behind the gate. Runtime workers are further held to
//! `server.worker_allowlist` by the control task.

use crate::auth::{RequiredKey, bearer_matches};
use crate::config::{AdminAccess, WorkerSpec};
use crate::error::GatewayError;
use crate::info;
use crate::record::admin as record;
use crate::state::{AppState, Shared};
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::StatusCode;
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
    };
    Router::new()
        .route("/workers", get(list).post(add).delete(remove))
        .route("/flush_cache", post(info::flush_cache))
        .route(
            "/record_trace",
            get(record::status).post(record::start).delete(record::stop),
        )
        .route_layer(axum::middleware::from_fn_with_state(gate_state, gate))
}

/// Who may pass the admin plane's gate.
#[derive(Clone, Debug)]
pub(crate) struct Gate {
    /// `server.admin_api_key` (a reload may replace it); when set, it
    /// alone decides.
    key: RequiredKey,
    /// `server.admin_access`, used only without a key.
    access: AdminAccess,
}

/// Middleware: the admin plane's access rule. The peer address comes from
/// the connection (`ConnectInfo`); a request without one (not from a
/// serving thread) is not taken for loopback.
pub(crate) async fn gate(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let key = gate.key.get();
    let refusal = match (&key, gate.access) {
        (Some(key), _) if bearer_matches(req.headers(), key) => None,
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
        Some(err) => err.into_response(),
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
        let required = RequiredKey::default();
        required.set(key);
        let gate_state = Gate {
            key: required,
            access,
        };
        Router::new()
            .route("/workers", get(|| async { "ok" }))
            .route_layer(axum::middleware::from_fn_with_state(gate_state, gate))
    }

    async fn status(app: &Router, peer: Option<&str>, bearer: Option<&str>) -> StatusCode {
        let mut req = Request::builder().uri("/workers");
        if let Some(key) = bearer {
            req = req.header("authorization", format!("Bearer {key}"));
        }
        let mut req = req.body(Body::empty()).unwrap();
        if let Some(peer) = peer {
            let peer: SocketAddr = peer.parse().unwrap();
            req.extensions_mut().insert(ConnectInfo(peer));
        }
        app.clone().oneshot(req).await.unwrap().status()
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
