//! The gateway's own endpoints: probes, model list, server info, loads,
//! metrics and the cache-flush fan-out (served on the admin plane, see
//! [`crate::admin`]). None of them touches the routing policy.

use crate::error::GatewayError;
use crate::state::AppState;
use crate::upstream::worker_call;
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use radixgate_routing::{ModelOrigin, WorkerRole};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// How long the gateway waits for a worker's answer to its own calls.
const FAN_OUT_TIMEOUT: Duration = Duration::from_secs(10);

/// `/liveness`: the process is up and every serving thread runs its tasks
/// (`crate::pulse`); 503 names a thread that has not for ten seconds.
pub(crate) async fn liveness(State(state): State<Arc<AppState>>) -> Response {
    let stalled = state.shared.pulse.stalled();
    if stalled.is_empty() {
        return Json(json!({"status": "ok"})).into_response();
    }
    let threads: Vec<Value> = stalled
        .iter()
        .map(|s| json!({"thread": s.thread, "unanswered_secs": s.for_secs}))
        .collect();
    tracing::error!(?stalled, "a serving thread has stopped running its tasks");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"status": "serving_thread_stalled", "threads": threads})),
    )
        .into_response()
}

/// `/readiness` and `/health`: at least one worker can take requests (and
/// replica sync, if on, has finished its warm start), and the client port
/// accepts (not yet while the start waits for the workers' first probes,
/// when only the metrics port answers this). With discovery on,
/// the body lists each watch: connected or not, and why not. A disaggregated
/// request takes a worker of each role, so a disaggregated pool needs an
/// available prefill worker and an available decode worker: one left with
/// a single role (its decode pods all gone) answers every request 503.
pub(crate) async fn readiness(State(state): State<Arc<AppState>>) -> Response {
    let snapshot = state.shared.router.snapshot();
    let available = |role: Option<WorkerRole>| {
        snapshot
            .workers()
            .iter()
            .filter(|w| w.is_available() && role.is_none_or(|role| w.role() == role))
            .count()
    };
    let disaggregated = state.shared.config.pd.enabled;
    let missing = match () {
        () if !disaggregated => None,
        () if available(Some(WorkerRole::Prefill)) == 0 => Some("no_healthy_prefill_workers"),
        () if available(Some(WorkerRole::Decode)) == 0 => Some("no_healthy_decode_workers"),
        () => None,
    };
    let available = available(None);
    let shutting_down = state.shared.shutting_down.is_cancelled();
    // Holding its start for the workers' first probes, the router does not
    // accept on the client port yet; the metrics port already answers.
    let starting = !state
        .shared
        .accepting
        .load(std::sync::atomic::Ordering::Acquire);
    // A replica warming up from the sync history is not ready yet (see
    // `crate::sync`): it would route on a tree that does not know the
    // cluster's recent prefixes.
    let warming = state.shared.sync.as_ref().is_some_and(|s| !s.ready());
    let mut body = json!({
        "status": match () {
            () if shutting_down => "shutting_down",
            () if starting => "starting",
            () if warming => "sync_warming_up",
            () if available == 0 => "no_healthy_workers",
            () => missing.unwrap_or("ok"),
        },
        "healthy_workers": available,
        "workers": snapshot.workers().len(),
        // Known but not admitted yet: without it, a router whose workers
        // are all still pending read as one with none configured.
        "pending_workers": state.shared.control.pending(),
    });
    // With discovery on, where each watch stands: a router whose API
    // server refuses it (no RBAC) has no worker, and says why here.
    let watches = state.shared.control.watches().all();
    if !watches.is_empty() {
        body["discovery"] = watches
            .into_iter()
            .map(|(selector, w)| {
                json!({
                    "selector": selector,
                    "namespace": w.namespace,
                    "connected": w.connected,
                    "problem": w.problem,
                })
            })
            .collect();
    }
    let ready = available > 0 && missing.is_none() && !shutting_down && !starting && !warming;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// `/v1/models`: the union of the models the admitted workers serve.
pub(crate) async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    let snapshot = state.shared.router.snapshot();
    let data: Vec<Value> = snapshot
        .models()
        .map(|m| model_entry(&snapshot, m))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: one model's entry as [`models`] lists it, or a
/// 404 `model_not_found`. The OpenAI SDKs' `models.retrieve` asks this,
/// and SGLang answers it; the id is the rest of the path, since Hugging
/// Face names hold a `/`.
///
/// An id that percent-decodes to bytes that are not UTF-8 is the client's
/// error as JSON, not the path extractor's plain-text line.
pub(crate) async fn model(
    State(state): State<Arc<AppState>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, GatewayError> {
    let Path(id) = id.map_err(|err| {
        GatewayError::InvalidRequest(format!(
            "the model id in the path is not a percent-encoded UTF-8 string ({})",
            err.body_text()
        ))
    })?;
    let snapshot = state.shared.router.snapshot();
    let found = snapshot.models().find(|m| *m == id);
    found
        .map(|m| Json(model_entry(&snapshot, m)))
        .ok_or(GatewayError::UnknownModel { model: id })
}

/// A model's entry in the OpenAI model list, with `max_model_len` where
/// its workers said theirs: the least of them, the longest context every
/// one of them takes (clients size their prompts by it). Where its
/// workers' `/v1/models` said more of it (vLLM, SGLang), its `parent`
/// too, as they said it: a LoRA adapter's base model (the first worker's
/// that names one), null for a base model; and its `root`, where every
/// worker that says one says the same (an adapter's path may differ from
/// worker to worker).
fn model_entry(snapshot: &radixgate_routing::WorkerSet, id: &str) -> Value {
    let mut entry = json!({"id": id, "object": "model", "created": 0, "owned_by": "radixgate"});
    let serving = || {
        snapshot
            .workers()
            .iter()
            .filter(|w| w.models().iter().any(|m| m == id))
    };
    if let Some(tokens) = serving().filter_map(|w| w.max_model_len()).min() {
        entry["max_model_len"] = tokens.into();
    }
    let origins: Vec<ModelOrigin> = serving().filter_map(|w| w.origin(id)).collect();
    if origins.is_empty() {
        return entry;
    }
    entry["parent"] = origins
        .iter()
        .find_map(|o| o.parent.clone())
        .map_or(Value::Null, Value::String);
    let mut roots = origins.iter().filter_map(|o| o.root.as_deref());
    if let Some(root) = roots.next()
        && roots.all(|other| other == root)
    {
        entry["root"] = root.into();
    }
    entry
}

/// `/get_server_info`: the gateway's settings (the routing as the last
/// reload left it) and its workers.
pub(crate) async fn server_info(State(state): State<Arc<AppState>>) -> Json<Value> {
    let workers = state.shared.control.list().await;
    Json(json!({
        "router": "radixgate",
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_secs": state.shared.started.elapsed().as_secs(),
        "routing": *state.shared.routing.load_full(),
        "pd": state.shared.config.pd,
        "workers": workers,
    }))
}

/// `/get_loads`: in-flight requests per admitted worker: this replica's own,
/// and what the other replicas last reported (replica sync; 0 without).
pub(crate) async fn loads(State(state): State<Arc<AppState>>) -> Json<Value> {
    let snapshot = state.shared.router.snapshot();
    let workers: Vec<Value> = snapshot
        .workers()
        .iter()
        .map(|w| {
            json!({
                "id": w.id().to_string(),
                "url": w.url(),
                "load": w.load(),
                "pending_prefill_chars": w.pending_prefill(),
                "peer_load": w.peer_load(),
                "peer_pending_prefill_chars": w.peer_pending_prefill(),
                "processed": w.processed(),
                "healthy": w.is_healthy(),
                "available": w.is_available(),
                "cached_chars": state.shared.router.cached_chars(w),
                "ttft_model": ttft_model(w),
            })
        })
        .collect();
    Json(json!({"workers": workers}))
}

/// What the TTFT cost model has learned about a worker, per model it
/// serves: the fitted coefficients once it has seen a first token (until
/// then it predicts with the configured seed, and only the count shows).
fn ttft_model(w: &radixgate_routing::Worker) -> Vec<Value> {
    let served = w.models();
    let models: Vec<&str> = match &*served {
        [] => vec!["*"],
        some => some.iter().map(String::as_str).collect(),
    };
    models
        .into_iter()
        .enumerate()
        .map(|(slot, model)| {
            let observations = w.ttft_observations(slot);
            if observations == 0 {
                return json!({"model": model, "observations": 0});
            }
            // Observed: the fit's own coefficients (the seed is not used).
            let c = w.ttft_coefficients(slot, &radixgate_routing::CostModelConfig::default());
            json!({
                "model": model,
                "observations": observations,
                "base_ms": c.base_ms,
                "prefill_chars_per_sec": c.prefill_chars_per_sec(),
                "per_request_ms": c.per_request_ms,
            })
        })
        .collect()
}

/// `/get_model_info`: answered by an available worker.
pub(crate) async fn model_info(State(state): State<Arc<AppState>>) -> Response {
    let snapshot = state.shared.router.snapshot();
    let Some(worker) = snapshot.workers().iter().find(|w| w.is_available()) else {
        return crate::error::GatewayError::NoHealthyWorker {
            model: None,
            why: state.shared.control.why_unavailable(&snapshot, None),
        }
        .into_response();
    };
    let request = worker_call(
        &state.shared.client,
        reqwest::Method::GET,
        format!("{}/get_model_info", worker.url()),
        worker.api_key().as_deref(),
        FAN_OUT_TIMEOUT,
    );
    match request.send().await {
        // Passed on as it arrives, never held whole: the gateway does not
        // size a worker's answer for it.
        Ok(response) => (
            response.status(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            axum::body::Body::from_stream(response.bytes_stream()),
        )
            .into_response(),
        Err(err) => crate::error::GatewayError::Connect {
            worker: worker.url().to_owned(),
            source: Box::new(err),
        }
        .into_response(),
    }
}

/// `/flush_cache`: tells every admitted worker to drop its prefix cache.
pub(crate) async fn flush_cache(State(state): State<Arc<AppState>>) -> Response {
    let snapshot = state.shared.router.snapshot();
    let calls = snapshot.workers().iter().map(|w| {
        let request = worker_call(
            &state.shared.client,
            reqwest::Method::POST,
            format!("{}/flush_cache", w.url()),
            w.api_key().as_deref(),
            FAN_OUT_TIMEOUT,
        );
        async move {
            match request.send().await {
                Ok(r) => json!({"url": w.url(), "status": r.status().as_u16()}),
                Err(e) => json!({"url": w.url(), "error": e.to_string()}),
            }
        }
    });
    let results = futures::future::join_all(calls).await;
    let all_ok = results.iter().all(|r| {
        r["status"]
            .as_u64()
            .is_some_and(|s| (200..300).contains(&s))
    });
    let status = if all_ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_GATEWAY
    };
    (status, Json(json!({"results": results}))).into_response()
}

/// `/metrics`: Prometheus text exposition. With `server.metrics_api_key`
/// set it asks for that key (the same on the main port and on the
/// Prometheus port, which share this handler); without one it is open, as
/// scrapers usually expect. Its labels name every worker URL, which is why
/// an operator may want it closed.
pub(crate) async fn metrics(
    State(state): State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
) -> Response {
    if let Some(key) = state.shared.keys.metrics.get()
        && !crate::auth::bearer_matches(&headers, &key)
    {
        return crate::error::GatewayError::Unauthorized.into_response();
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.shared.metrics.render(),
    )
        .into_response()
}
