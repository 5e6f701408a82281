//! Active health checking: one small task per known worker.
//!
//! A healthy worker is probed every `interval_secs`; `failure_threshold`
//! consecutive failed probes mark it unhealthy. An unhealthy (or not yet
//! admitted) worker is probed with exponential back-off from
//! `unhealthy_backoff_initial_ms` to `unhealthy_backoff_max_ms`, and a passing
//! probe is confirmed at the initial back-off, so a worker that comes back is
//! re-admitted within `unhealthy_backoff_max_ms` plus `success_threshold - 1`
//! confirmations — at most 2.25 s with the defaults, the README's "about
//! 2.5 s" — instead of waiting for a long fixed interval.
//!
//! The task only reports transitions to the control task, through the two
//! narrow methods of its handle; it never touches the registry, which has
//! exactly one owner.
//!
//! The schedule is one loop ([`run`]) over a [`Watched`] worker: the real
//! one probes over HTTP and reports to the control task; the tests script
//! one and run the same loop under tokio's paused clock, so the promised
//! admission delay is asserted to the millisecond rather than stated.

use crate::config::HealthConfig;
use crate::control::Control;
use radixgate_routing::WorkerUrl;
use serde::Deserialize;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What one health checker watches.
pub(crate) struct Target {
    pub(crate) url: WorkerUrl,
    pub(crate) api_key: Option<String>,
    /// Models the operator listed; empty: ask the worker on admission.
    pub(crate) models: Vec<String>,
    pub(crate) client: reqwest::Client,
    pub(crate) config: HealthConfig,
    pub(crate) control: Control,
    pub(crate) cancel: CancellationToken,
}

/// Probes `target` until cancelled, reporting admission and health changes.
pub(crate) async fn watch(mut target: Target) {
    let config = target.config.clone();
    let cancel = target.cancel.clone();
    run(&config, &cancel, &mut target).await;
}

/// The two ends of one health checker: the worker it probes and the
/// control task it reports to. A trait so that tests can script the worker
/// and record the reports while [`run`] keeps the schedule.
trait Watched {
    /// Probes once; true if the worker answered well.
    async fn probe(&mut self) -> bool;
    /// The first probes passed: asks for the worker's admission.
    async fn admit(&mut self);
    /// The admitted worker's health changed.
    async fn report(&mut self, healthy: bool);
}

impl Watched for Target {
    async fn probe(&mut self) -> bool {
        probe(self).await
    }

    async fn admit(&mut self) {
        let models = if self.models.is_empty() {
            discover_models(self).await
        } else {
            self.models.clone()
        };
        self.control.admit(self.url.clone(), models).await;
    }

    async fn report(&mut self, healthy: bool) {
        self.control.report_health(self.url.clone(), healthy).await;
    }
}

/// The probe schedule, until `cancel`: see the module doc.
async fn run(cfg: &HealthConfig, cancel: &CancellationToken, worker: &mut impl Watched) {
    let initial = Duration::from_millis(cfg.unhealthy_backoff_initial_ms);
    let max = Duration::from_millis(cfg.unhealthy_backoff_max_ms);
    let mut backoff = initial;
    let mut admitted = false;
    let mut healthy = false;
    let (mut successes, mut failures) = (0u32, 0u32);
    loop {
        let ok = !cfg.enabled || worker.probe().await;
        if ok {
            successes += 1;
            failures = 0;
        } else {
            failures += 1;
            successes = 0;
        }
        if !healthy && ok && (successes >= cfg.success_threshold || !cfg.enabled) {
            healthy = true;
            backoff = initial;
            if admitted {
                worker.report(healthy).await;
            } else {
                worker.admit().await;
                admitted = true;
            }
        } else if healthy && !ok && failures >= cfg.failure_threshold {
            healthy = false;
            worker.report(healthy).await;
        }
        if !cfg.enabled {
            // Admitted once; nothing more to watch.
            return;
        }
        let wait = if healthy {
            Duration::from_secs(cfg.interval_secs)
        } else if ok {
            initial
        } else {
            let wait = backoff;
            backoff = (backoff * 2).min(max);
            wait
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// A GET of `path` on the target worker, with its key and the probe timeout.
fn get(target: &Target, path: &str) -> reqwest::RequestBuilder {
    crate::upstream::worker_call(
        &target.client,
        reqwest::Method::GET,
        format!("{}{path}", target.url),
        target.api_key.as_deref(),
        Duration::from_secs(target.config.timeout_secs),
    )
}

/// One probe: a GET of the health endpoint answered 2xx within the timeout.
async fn probe(target: &Target) -> bool {
    let request = get(target, &target.config.endpoint);
    tokio::select! {
        () = target.cancel.cancelled() => false,
        result = request.send() => matches!(result, Ok(r) if r.status().is_success()),
    }
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
}

#[derive(Deserialize)]
struct ModelInfo {
    model_path: Option<String>,
}

/// The models a worker serves, from its OpenAI `/v1/models`, else SGLang's
/// `/get_model_info`; empty (serves any model) if it reports neither.
async fn discover_models(target: &Target) -> Vec<String> {
    if let Ok(response) = get(target, "/v1/models").send().await
        && response.status().is_success()
        && let Ok(list) = response.json::<ModelList>().await
        && !list.data.is_empty()
    {
        return list.data.into_iter().map(|m| m.id).collect();
    }
    if let Ok(response) = get(target, "/get_model_info").send().await
        && response.status().is_success()
        && let Ok(ModelInfo {
            model_path: Some(path),
        }) = response.json::<ModelInfo>().await
    {
        return vec![path];
    }
    tracing::warn!(worker = %target.url, "worker reports no model; it will serve any model");
    Vec::new()
}

#[cfg(test)]
mod tests;
