//! The admin API: add, list and remove workers while serving.
//!
//! `POST /workers` takes `{"url": ..., "api_key"?: ..., "models"?: [...]}`
//! and answers 202: the worker is probed and admitted once healthy.
//! `GET /workers` lists every known worker with its state.
//! `DELETE /workers?url=...` removes one; its in-flight requests finish.

use crate::config::WorkerSpec;
use crate::error::GatewayError;
use crate::state::AppState;
use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

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

/// `DELETE /workers?url=...`.
pub(crate) async fn remove(
    State(state): State<Arc<AppState>>,
    Query(q): Query<RemoveQuery>,
) -> Response {
    let Some(url) = q.url else {
        return GatewayError::InvalidRequest("DELETE /workers needs ?url=<worker URL>".into())
            .into_response();
    };
    match state.shared.control.remove(url.clone()).await {
        Ok(()) => Json(json!({"url": url, "state": "removed"})).into_response(),
        Err(err) => err.into_response(),
    }
}
