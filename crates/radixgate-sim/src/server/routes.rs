//! The worker's routes and its non-generation endpoints: health, server and
//! model info, models list, load, metrics, cache flush, fault admin, the
//! KV pull endpoint of prefill workers (also alone on their bootstrap
//! listener)
//! (generation, embeddings, and reranking, scoring and tokenizing have their
//! own modules).
//!
//! Shapes follow what SGLang and vLLM servers answer on the same paths,
//! closely enough for routers that probe them (model discovery, health,
//! load polling).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::sync::oneshot;

use super::driver::Cmd;
use super::faults::FaultConfig;
use super::{WorkerState, embeddings, error_response, generate, pd, read_body, stored, utility};
use crate::error::SimError;

/// The router of one worker.
pub(crate) fn router(state: Arc<WorkerState>) -> axum::Router {
    axum::Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health))
        .route("/get_server_info", get(server_info))
        .route("/server_info", get(server_info))
        .route("/get_model_info", get(model_info))
        .route("/model_info", get(model_info))
        .route("/v1/models", get(models))
        .route("/get_load", get(load))
        .route("/metrics", get(metrics))
        .route("/flush_cache", post(flush).get(flush))
        .route("/v1/load_lora_adapter", post(load_adapter))
        .route("/v1/unload_lora_adapter", post(unload_adapter))
        .route("/generate", post(generate::generate))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/responses", post(generate::responses))
        .route(
            "/v1/responses/{id}",
            get(stored::get).delete(stored::delete),
        )
        .route("/v1/responses/{id}/cancel", post(stored::cancel))
        .route("/v1/responses/{id}/input_items", get(stored::input_items))
        .route("/v1/messages", post(generate::messages))
        .route("/v1/messages/count_tokens", post(utility::count_tokens))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/rerank", post(utility::rerank))
        .route("/rerank", post(utility::rerank))
        .route("/v2/rerank", post(utility::rerank))
        .route("/v1/score", post(utility::score))
        .route("/score", post(utility::score))
        .route("/tokenize", post(utility::tokenize))
        .route("/detokenize", post(utility::detokenize))
        .route("/kv/{room}", get(pd::kv_handler))
        .route("/admin/faults", get(get_faults).post(set_faults))
        .route(
            "/admin/workers/{index}/faults",
            get(get_peer_faults).post(set_peer_faults),
        )
        .fallback(not_found)
        .with_state(state)
}

/// The router of a prefill worker's bootstrap listener: the KV pull
/// endpoint and health only.
pub(crate) fn bootstrap_router(state: Arc<WorkerState>) -> axum::Router {
    axum::Router::new()
        .route("/kv/{room}", get(pd::kv_handler))
        .route("/health", get(health))
        .fallback(not_found)
        .with_state(state)
}

async fn health(State(s): State<Arc<WorkerState>>) -> Response {
    if s.faults.get().unhealthy {
        return error_response(&SimError::Unavailable("unhealthy (fault knob)"));
    }
    StatusCode::OK.into_response()
}

async fn server_info(State(s): State<Arc<WorkerState>>) -> Json<serde_json::Value> {
    let e = &s.config.engine;
    let load = s.load();
    Json(json!({
        "model_path": &*s.model,
        "tokenizer_path": &*s.model,
        "served_model_name": &*s.model,
        "worker": &*s.name,
        "version": concat!("radixgate-sim ", env!("CARGO_PKG_VERSION")),
        "page_size": e.block_size,
        "max_total_num_tokens": e.capacity_tokens(),
        "max_running_requests": e.max_running_requests,
        "chunked_prefill_size": e.max_batch_tokens,
        "chars_per_token": s.config.chars_per_token,
        "instant": s.config.instant,
        "dp_size": 1,
        // SGLang's names: "null" for a regular worker.
        "disaggregation_mode": match s.config.pd.role {
            pd::Role::Regular => "null",
            pd::Role::Prefill => "prefill",
            pd::Role::Decode => "decode",
        },
        "disaggregation_bootstrap_port": (s.config.pd.role == pd::Role::Prefill)
            .then_some(s.pull_addr.port()),
        "tp_size": 1,
        "timing": e.timing,
        "internal_states": [{"num_running_reqs": load.running, "num_waiting_reqs": load.waiting}],
    }))
}

async fn model_info(State(s): State<Arc<WorkerState>>) -> Json<serde_json::Value> {
    Json(json!({
        "model_path": &*s.model,
        "tokenizer_path": &*s.model,
        "is_generation": true,
    }))
}

async fn models(State(s): State<Arc<WorkerState>>) -> Json<serde_json::Value> {
    let max_model_len = s.config.engine.kv_capacity_tokens;
    let mut data = vec![json!({
        "id": &*s.model,
        "object": "model",
        "created": 0,
        "owned_by": "radixgate-sim",
        "root": &*s.model,
        "max_model_len": max_model_len,
    })];
    // vLLM lists a loaded adapter as a model of its own, its base model
    // as its parent.
    for name in s.adapters.lock().iter() {
        data.push(json!({
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "radixgate-sim",
            "root": name,
            "parent": &*s.model,
            "max_model_len": max_model_len,
        }));
    }
    Json(json!({"object": "list", "data": data}))
}

/// vLLM's `POST /v1/load_lora_adapter` (`{"lora_name", "lora_path"}`): the
/// adapter is listed as a model from then on. The engine's cache, and its
/// KV events, go on as they were.
async fn load_adapter(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    let name = match adapter_name(&s, body).await {
        Ok(name) => name,
        Err(response) => return response,
    };
    let mut adapters = s.adapters.lock();
    if adapters.contains(&name) {
        let message = format!("The lora adapter '{name}' has already been loaded.");
        return error_response(&SimError::bad_request(message, Some("lora_name")));
    }
    adapters.push(name.clone());
    format!("Success: LoRA adapter '{name}' added successfully.").into_response()
}

/// vLLM's `POST /v1/unload_lora_adapter` (`{"lora_name"}`).
async fn unload_adapter(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    let name = match adapter_name(&s, body).await {
        Ok(name) => name,
        Err(response) => return response,
    };
    let mut adapters = s.adapters.lock();
    let before = adapters.len();
    adapters.retain(|a| *a != name);
    if adapters.len() == before {
        let message = format!("The lora adapter '{name}' cannot be found.");
        return error_response(&SimError::bad_request(message, Some("lora_name")));
    }
    format!("Success: LoRA adapter '{name}' removed successfully.").into_response()
}

/// The `lora_name` of an adapter request's body.
async fn adapter_name(s: &WorkerState, body: Body) -> Result<String, Response> {
    let bytes = read_body(body, s.config.max_body_bytes)
        .await
        .map_err(|e| error_response(&e))?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| error_response(&SimError::bad_request(format!("invalid JSON: {e}"), None)))?;
    match value["lora_name"].as_str() {
        Some(name) if !name.is_empty() => Ok(name.to_owned()),
        _ => Err(error_response(&SimError::bad_request(
            "lora_name is required",
            Some("lora_name"),
        ))),
    }
}

async fn load(State(s): State<Arc<WorkerState>>) -> Json<serde_json::Value> {
    let l = s.load();
    let usage = l.kv_used_tokens as f64 / l.kv_capacity_tokens.max(1) as f64;
    Json(json!({
        "worker": &*s.name,
        "running": l.running,
        "waiting": l.waiting,
        "pending_prefill_tokens": l.pending_prefill_tokens,
        "kv_used_tokens": l.kv_used_tokens,
        "kv_cached_tokens": l.kv_cached_tokens,
        "kv_capacity_tokens": l.kv_capacity_tokens,
        "kv_usage": usage,
        "num_reqs": l.running + l.waiting,
        "num_waiting_reqs": l.waiting,
        "num_tokens": l.kv_used_tokens,
    }))
}

async fn metrics(State(s): State<Arc<WorkerState>>) -> Response {
    let mut text = s.metrics.render(&s.name, &s.model, &s.engine.stats());
    if let Some(p) = &s.kv_events {
        text.push_str(&super::metrics::kv_events_text(
            &s.name,
            &s.model,
            &p.stats.counters(),
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn flush(State(s): State<Arc<WorkerState>>) -> Response {
    let (tx, rx) = oneshot::channel();
    if let Err(e) = s.engine.send(Cmd::Flush(tx)) {
        return error_response(&e);
    }
    match rx.await {
        Ok(blocks) => (
            StatusCode::OK,
            format!("Cache flushed ({blocks} blocks evicted).\n"),
        )
            .into_response(),
        Err(_) => error_response(&SimError::EngineGone),
    }
}

async fn get_faults(State(s): State<Arc<WorkerState>>) -> Json<FaultConfig> {
    Json(s.faults.get())
}

async fn set_faults(State(s): State<Arc<WorkerState>>, body: Body) -> Response {
    apply_faults(&s, body).await
}

fn peer(s: &WorkerState, index: usize) -> Result<Arc<WorkerState>, SimError> {
    s.group
        .get()
        .and_then(|g| g.get(index))
        .cloned()
        .ok_or_else(|| {
            SimError::bad_request(
                format!("no worker with index {index} in this process"),
                Some("index"),
            )
        })
}

async fn get_peer_faults(State(s): State<Arc<WorkerState>>, Path(index): Path<usize>) -> Response {
    match peer(&s, index) {
        Ok(p) => Json(p.faults.get()).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn set_peer_faults(
    State(s): State<Arc<WorkerState>>,
    Path(index): Path<usize>,
    body: Body,
) -> Response {
    match peer(&s, index) {
        Ok(p) => apply_faults(&p, body).await,
        Err(e) => error_response(&e),
    }
}

async fn apply_faults(s: &WorkerState, body: Body) -> Response {
    let result = async {
        let bytes = read_body(body, 64 << 10).await?;
        let faults: FaultConfig = serde_json::from_slice(&bytes)
            .map_err(|e| SimError::bad_request(format!("invalid fault knobs: {e}"), None))?;
        s.faults
            .set(faults)
            .map_err(|e| SimError::bad_request(e.to_string(), None))?;
        Ok::<_, SimError>(s.faults.get())
    }
    .await;
    match result {
        Ok(f) => Json(f).into_response(),
        Err(e) => error_response(&e),
    }
}

async fn not_found(uri: axum::http::Uri) -> Response {
    error_response(&SimError::NotFound(uri.path().to_owned()))
}
