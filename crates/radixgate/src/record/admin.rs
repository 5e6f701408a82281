//! `/record_trace` on the admin plane (routed, behind the admin gate, by
//! `admin.rs`):
//!
//! - `GET` answers the recording's state: `{"recording": bool, "path",
//!   "max_bytes", "keep", "lines", "dropped", "write_errors",
//!   "rotations"}` (only `recording: false` and zeros when none ran);
//! - `POST {"path": FILE, "max_bytes"?: N, "keep"?: K}` starts recording to
//!   `FILE` inside `record_trace.admin_dir` (replacing a running
//!   recording), sizes defaulting to `record_trace`'s, and answers the new
//!   state;
//! - `DELETE` stops it once everything queued is written, and answers its
//!   final state.
//!
//! A bad body or path is a 400 with an OpenAI-style error body.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::RecordError;
use crate::error::GatewayError;
use crate::state::AppState;

/// The body of `POST /record_trace`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Start {
    path: PathBuf,
    #[serde(default)]
    max_bytes: Option<u64>,
    #[serde(default)]
    keep: Option<u32>,
}

/// `GET /record_trace`.
pub(crate) async fn status(State(state): State<Arc<AppState>>) -> Response {
    Json(state.shared.recorder.status()).into_response()
}

/// `POST /record_trace`.
pub(crate) async fn start(
    State(state): State<Arc<AppState>>,
    req: axum::extract::Request,
) -> Response {
    let body = match crate::admin::body(&state, req).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let start: Start = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(err) => {
            return GatewayError::InvalidRequest(format!(
                "POST /record_trace takes {{\"path\": FILE, \"max_bytes\"?: N, \"keep\"?: K}}: {err}"
            ))
            .into_response();
        }
    };
    if start
        .keep
        .is_some_and(|k| k > crate::config::MAX_RECORD_KEEP)
    {
        return GatewayError::InvalidRequest(format!(
            "keep must be at most {}",
            crate::config::MAX_RECORD_KEEP
        ))
        .into_response();
    }
    let shared = state.shared.clone();
    let started = tokio::task::spawn_blocking(move || {
        let recorder = &shared.recorder;
        let settings = recorder.admin_settings(&start.path, start.max_bytes, start.keep)?;
        recorder.start(settings)
    })
    .await;
    match started {
        Ok(Ok(status)) => Json(status).into_response(),
        Ok(Err(err)) => GatewayError::from(err).into_response(),
        Err(join) => failed(join),
    }
}

/// `DELETE /record_trace`.
pub(crate) async fn stop(State(state): State<Arc<AppState>>) -> Response {
    let shared = state.shared.clone();
    match tokio::task::spawn_blocking(move || shared.recorder.stop()).await {
        Ok(status) => Json(status).into_response(),
        Err(join) => failed(join),
    }
}

/// The blocking task switching the recording failed (it panicked).
fn failed(join: tokio::task::JoinError) -> Response {
    GatewayError::from(RecordError::Thread(std::io::Error::other(join.to_string()))).into_response()
}
