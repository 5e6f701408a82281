//! The Responses API's stored responses, kept as vLLM and SGLang keep
//! them: in the memory of the worker that made them. A response made with
//! `store` (the default) can be fetched, deleted, cancelled and its input
//! listed by its id, and named as `previous_response_id` by the next
//! request, on this worker only: any other answers 404, as an engine does,
//! which is what a router in front of several workers must route around.
//!
//! A `background` response (stored only) is answered at once, `queued`
//! and without usage, as the engines answer one; it is stored finished,
//! so the next request by its id reads its output and usage.
//!
//! At most [`MAX_STORED`] responses are kept, the oldest forgotten first.
//! One lock, held for a map operation and never across an `.await`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{WorkerState, error_response};
use crate::error::SimError;

/// The most responses one worker keeps.
const MAX_STORED: usize = 100_000;

/// The stored responses of one worker, by id.
#[derive(Default)]
pub(super) struct Stored(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    by_id: HashMap<String, Value>,
    /// Ids in the order they were stored, for the bound.
    order: VecDeque<String>,
}

/// What a `/v1/responses` body says about storing.
#[derive(Deserialize)]
struct Fields {
    #[serde(default)]
    previous_response_id: Option<String>,
    /// Absent: stored (the API's default); `null` is not, as the
    /// engines read it (`if request.store and ...`).
    #[serde(default = "stored_unless_said")]
    store: Option<bool>,
    /// Answered at once, its work left to run (`null`: not).
    #[serde(default)]
    background: Option<bool>,
    #[serde(default)]
    stream: Option<bool>,
}

fn stored_unless_said() -> Option<bool> {
    Some(true)
}

/// How a Responses request stands with the store.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Storing {
    /// Whether its response is to be stored.
    pub(super) store: bool,
    /// Whether it is answered at once, `queued` (stored, not streamed).
    pub(super) background: bool,
}

impl Stored {
    /// Checks a `/v1/responses` body: its `previous_response_id`, if any,
    /// must be held here (else the engine's 404).
    pub(super) fn check(&self, body: &[u8]) -> Result<Storing, SimError> {
        // A body the request parser refuses is refused there.
        let Ok(fields) = serde_json::from_slice::<Fields>(body) else {
            return Ok(Storing::default());
        };
        if let Some(id) = fields.previous_response_id
            && !self.0.lock().by_id.contains_key(&id)
        {
            return Err(SimError::ResponseNotFound {
                id,
                param: Some("previous_response_id"),
            });
        }
        let store = fields.store.unwrap_or(false);
        let background = fields.background.unwrap_or(false);
        if background && !store {
            return Err(SimError::bad_request(
                "background responses must be stored (store: true)",
                Some("background"),
            ));
        }
        if background && fields.stream.unwrap_or(false) {
            return Err(SimError::bad_request(
                "the simulated worker does not stream a background response",
                Some("stream"),
            ));
        }
        Ok(Storing { store, background })
    }

    /// Keeps `response` (a response object) under its `id`.
    pub(super) fn keep(&self, response: Value) {
        let Some(id) = response
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            return;
        };
        let mut kept = self.0.lock();
        if kept.by_id.insert(id.clone(), response).is_none() {
            kept.order.push_back(id);
        }
        while kept.order.len() > MAX_STORED {
            if let Some(old) = kept.order.pop_front() {
                kept.by_id.remove(&old);
            }
        }
    }

    fn get(&self, id: &str) -> Option<Value> {
        self.0.lock().by_id.get(id).cloned()
    }

    fn remove(&self, id: &str) -> bool {
        let mut kept = self.0.lock();
        let removed = kept.by_id.remove(id).is_some();
        if removed {
            kept.order.retain(|k| k != id);
        }
        removed
    }
}

fn not_found(id: String) -> Response {
    error_response(&SimError::ResponseNotFound { id, param: None })
}

/// `GET /v1/responses/{id}`.
pub(super) async fn get(State(s): State<Arc<WorkerState>>, Path(id): Path<String>) -> Response {
    match s.stored.get(&id) {
        Some(response) => Json(response).into_response(),
        None => not_found(id),
    }
}

/// `DELETE /v1/responses/{id}`.
pub(super) async fn delete(State(s): State<Arc<WorkerState>>, Path(id): Path<String>) -> Response {
    match s.stored.remove(&id) {
        true => Json(json!({"id": id, "object": "response", "deleted": true})).into_response(),
        false => not_found(id),
    }
}

/// `POST /v1/responses/{id}/cancel`: the simulated worker has finished
/// every response it stored, so it answers the response as it is.
pub(super) async fn cancel(State(s): State<Arc<WorkerState>>, Path(id): Path<String>) -> Response {
    get(State(s), Path(id)).await
}

/// `GET /v1/responses/{id}/input_items`: an empty list (the simulated
/// worker does not keep the input).
pub(super) async fn input_items(
    State(s): State<Arc<WorkerState>>,
    Path(id): Path<String>,
) -> Response {
    match s.stored.get(&id) {
        Some(_) => Json(json!({
            "object": "list",
            "data": [],
            "first_id": null,
            "last_id": null,
            "has_more": false,
        }))
        .into_response(),
        None => not_found(id),
    }
}
