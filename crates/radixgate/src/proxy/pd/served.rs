//! A side listed with the request's model that answers it does not serve
//! it (vLLM's 404 "The model `m` does not exist.": an adapter unloaded, or
//! another model started there, since its models were read).
//!
//! As in the co-located loop: the worker's models are read again (its
//! health checker asks within a second), its breaker counts nothing (the
//! permit goes back without an outcome), its record does not keep the
//! prompt, and it is counted as `model_not_served`. The pair's loop then
//! sends the request at once, outside `retry.max_retries`, to a pair with
//! another worker of that side listed with the model; where none is, the
//! client gets 404 `model_not_found` naming the side.

use super::super::attempt::{ERROR_BODY_WAIT, does_not_serve};
use super::super::{error_message, lists};
use super::Answer2;
use crate::breaker::Permit;
use crate::error::GatewayError;
use crate::state::Shared;
use axum::http::StatusCode;
use radixgate_routing::{Decision, WorkerId, WorkerRole};

/// Whether `answer`, a side's answer that is no success, for a request
/// naming `model`, says that its worker does not serve the model it is
/// listed with. Its error body is read ahead (at most until `deadline`)
/// and kept in front, so that any other answer goes on as it came.
pub(super) async fn refuses_model(
    decision: &Decision,
    model: Option<&str>,
    answer: &mut Answer2,
    deadline: Option<tokio::time::Instant>,
) -> bool {
    let Some(model) = model else {
        return false;
    };
    answer.response.status() == StatusCode::NOT_FOUND
        && lists(decision.worker(), model)
        && does_not_serve(&mut answer.response, model, deadline).await
}

/// Settles a side's answer that [`refuses_model`]: the worker's models
/// read again, its record's insert taken back, its breaker's permit let
/// go uncounted; returns the side's failure.
pub(super) async fn settle(
    shared: &Shared,
    decision: &mut Decision,
    text: &str,
    probe: Permit,
    model: &str,
    answer: Answer2,
) -> GatewayError {
    let worker = decision.worker().clone();
    shared.control.reread_models(worker.url());
    shared
        .request_metrics
        .upstream_error(worker.url(), "model_not_served");
    decision.undo_insert(text);
    drop(probe);
    // Its body was read for its message already: the rest is not waited
    // for long.
    let soon = tokio::time::Instant::now() + ERROR_BODY_WAIT;
    let (message, _) = error_message(answer.response, Some(soon)).await;
    let error = GatewayError::ModelNotServed {
        model: model.to_owned(),
        side: worker.role().as_str(),
        worker: worker.url().to_owned(),
        message,
    };
    answer.trace.failed("model_not_served", &error);
    error
}

/// Whether a worker of `side` other than those `tried` is listed with
/// `model` and available.
pub(super) fn elsewhere(
    shared: &Shared,
    side: WorkerRole,
    model: &str,
    tried: &[WorkerId],
) -> bool {
    let set = shared.router.snapshot();
    set.workers().iter().any(|w| {
        w.role() == side && !tried.contains(&w.id()) && w.is_available() && lists(w, model)
    })
}
