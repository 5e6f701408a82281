//! The upkeep tick: every 250 ms, turn time-driven breaker changes (an open
//! breaker whose timeout passed becomes half-open) into the workers' breaker
//! slots, refresh the per-worker and admission gauges, and let the metrics
//! recorder fold its histogram samples. Reads only snapshots and atomics.
//!
//! The per-worker gauges (in flight, healthy, tree characters) and the
//! routing correction's per-worker figures (predicted against reported
//! cached tokens, trims, prediction error) are read
//! from the worker set here and nowhere else, so this task owns them
//! ([`WorkerGauges`]); the breakers and admission own theirs and are asked
//! to publish them on each tick.

use crate::metrics::{Describe, Family, Metrics, PerWorker, WorkerTotal};
use crate::state::Shared;
use ::metrics::{Gauge, Label};
use radixgate_routing::Worker;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TICK: Duration = Duration::from_millis(250);

pub(crate) const WORKER_IN_FLIGHT: Describe = Describe::new(
    "radixgate_worker_in_flight_requests",
    "Requests in flight to each worker.",
);
pub(crate) const WORKER_HEALTHY: Describe = Describe::new(
    "radixgate_worker_healthy",
    "Whether each worker passes health checks (1) or not (0).",
);
pub(crate) const TREE_CHARS: Describe = Describe::new(
    "radixgate_tree_characters",
    "Characters of routed text the prefix tree holds for each worker.",
);

pub(crate) const CACHE_PROMPT_TOKENS: Describe = Describe::new(
    "radixgate_cache_prompt_tokens_total",
    "Prompt tokens of the answers from each worker that reported cached tokens.",
);
pub(crate) const CACHE_PREDICTED_TOKENS: Describe = Describe::new(
    "radixgate_cache_predicted_tokens_total",
    "Cached prompt tokens the prefix tree predicted for each worker, over the answers that reported cached tokens.",
);
pub(crate) const CACHE_REPORTED_TOKENS: Describe = Describe::new(
    "radixgate_cache_reported_tokens_total",
    "Cached prompt tokens each worker reported (over radixgate_cache_prompt_tokens_total: its real hit rate).",
);
pub(crate) const CACHE_TRIMS: Describe = Describe::new(
    "radixgate_cache_trims_total",
    "Answers whose cached tokens fell more than a KV page short of the prediction, so the prefix tree forgot what the worker had evicted.",
);
pub(crate) const CACHE_INVALID_REPORTS: Describe = Describe::new(
    "radixgate_cache_invalid_reports_total",
    "Cached-token reports from each worker ignored as impossible (more than the prompt, over 2^24 prompt tokens, negative, not a number).",
);
pub(crate) const CACHE_PREDICTION_ERROR: Describe = Describe::new(
    "radixgate_cache_prediction_error",
    "Running mean of (predicted - reported cached tokens) / prompt tokens of each worker's recent answers; positive: the tree over-predicts.",
);

pub(crate) const CACHE_EVICTION_RATE: Describe = Describe::new(
    "radixgate_cache_eviction_rate",
    "Share of each model's recent answers (the last 256) whose cached tokens showed an eviction the prefix tree did not know of; from 0.01 the pool counts as overflowing and cache_aware spills hits by hot_spot.overflow_margin.",
);

pub(crate) const CACHE_BOUND_EVICTION_RATE: Describe = Describe::new(
    "radixgate_cache_bound_eviction_rate",
    "Share of each model's recent tree inserts (the last 256) that evicted a worker's oldest prefixes to keep its share of the tree within its KV cache (correction.capacity_bound); from 0.01 the pool counts as overflowing, as with radixgate_cache_eviction_rate.",
);

/// The per-worker gauges the tick refreshes.
pub(crate) struct WorkerGauges {
    in_flight: PerWorker<Gauge>,
    healthy: PerWorker<Gauge>,
    tree_chars: PerWorker<Gauge>,
    cache: CacheSeries,
    eviction_rate: Family<String, Gauge>,
    bound_eviction_rate: Family<String, Gauge>,
}

/// The correction's per-worker figures: counters following the workers'
/// own totals (`radixgate_routing::correction::CacheTruth`) on every tick.
struct CacheSeries {
    prompt: PerWorker<WorkerTotal>,
    predicted: PerWorker<WorkerTotal>,
    reported: PerWorker<WorkerTotal>,
    trims: PerWorker<WorkerTotal>,
    invalid: PerWorker<WorkerTotal>,
    error: PerWorker<Gauge>,
}

impl WorkerGauges {
    pub(crate) fn new(metrics: &Metrics) -> Self {
        Self {
            in_flight: metrics.per_worker_gauges(&WORKER_IN_FLIGHT),
            healthy: metrics.per_worker_gauges(&WORKER_HEALTHY),
            tree_chars: metrics.per_worker_gauges(&TREE_CHARS),
            cache: CacheSeries {
                prompt: metrics.per_worker_totals(&CACHE_PROMPT_TOKENS),
                predicted: metrics.per_worker_totals(&CACHE_PREDICTED_TOKENS),
                reported: metrics.per_worker_totals(&CACHE_REPORTED_TOKENS),
                trims: metrics.per_worker_totals(&CACHE_TRIMS),
                invalid: metrics.per_worker_totals(&CACHE_INVALID_REPORTS),
                error: metrics.per_worker_gauges(&CACHE_PREDICTION_ERROR),
            },
            eviction_rate: metrics.gauges(&CACHE_EVICTION_RATE),
            bound_eviction_rate: metrics.gauges(&CACHE_BOUND_EVICTION_RATE),
        }
    }

    /// A model's eviction rate now.
    pub(crate) fn eviction_rate(&self, model: &str, rate: f64) {
        Self::set_for_model(&self.eviction_rate, model, rate);
    }

    /// A model's bound eviction rate now.
    pub(crate) fn bound_eviction_rate(&self, model: &str, rate: f64) {
        Self::set_for_model(&self.bound_eviction_rate, model, rate);
    }

    fn set_for_model(family: &Family<String, Gauge>, model: &str, value: f64) {
        family.with(
            model,
            || model.to_owned(),
            || vec![Label::new("model", model.to_owned())],
            |g| g.set(value),
        );
    }

    /// A worker's predicted against reported cached tokens, once it has
    /// answered with a report (valid or not).
    pub(crate) fn cache_truth(&self, worker: &Worker) {
        let t = worker.cache_truth().snapshot();
        if t.reports == 0 && t.invalid == 0 {
            return;
        }
        let (c, url, id) = (&self.cache, worker.url(), worker.id());
        c.prompt.with(url, |s| s.follow(id, t.prompt_tokens));
        c.predicted.with(url, |s| s.follow(id, t.predicted_tokens));
        c.reported.with(url, |s| s.follow(id, t.reported_tokens));
        c.trims.with(url, |s| s.follow(id, t.trims));
        c.invalid.with(url, |s| s.follow(id, t.invalid));
        c.error.set(url, t.prediction_error);
    }

    /// A worker left the pool: its prediction error reads 0, as its other
    /// gauges do, rather than its last value until the exporter drops it.
    pub(crate) fn prediction_error_gone(&self, worker: &str) {
        self.cache.error.set(worker, 0.0);
    }

    /// Requests in flight to a worker now.
    pub(crate) fn in_flight(&self, worker: &str, in_flight: usize) {
        self.in_flight.set(worker, in_flight as f64);
    }

    /// Whether a worker is healthy now.
    pub(crate) fn healthy(&self, worker: &str, healthy: bool) {
        self.healthy.set(worker, if healthy { 1.0 } else { 0.0 });
    }

    /// Characters the prefix tree holds for a worker now.
    pub(crate) fn tree_chars(&self, worker: &str, chars: usize) {
        self.tree_chars.set(worker, chars as f64);
    }
}

pub(crate) async fn run(state: Arc<Shared>, stop: CancellationToken) {
    let gauges = WorkerGauges::new(&state.metrics);
    let connections = crate::listen::ConnectionMetrics::new(&state.metrics);
    // Only while spans are exported: their series mean nothing otherwise.
    let spans = crate::trace::exporting().then(|| crate::trace::SpanMetrics::new(&state.metrics));
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_generation = u64::MAX;
    let mut last_draining: Vec<String> = Vec::new();
    let mut known: HashSet<String> = HashSet::new();
    // The models whose eviction rates were published last tick.
    let mut rated: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let now = tokio::time::Instant::now();
        let snapshot = state.router.snapshot();
        // Draining workers are out of the snapshot, their requests still
        // in flight: their load is published until their drain ends.
        let draining = state.control.draining();
        let draining_now: Vec<&str> = draining.iter().map(|w| w.url()).collect();
        if snapshot.generation() != last_generation || draining_now != last_draining {
            last_generation = snapshot.generation();
            last_draining = draining_now.iter().map(|u| (*u).to_owned()).collect();
            state.breakers.retain(|id| snapshot.get(id).is_some());
            let live: HashSet<String> = snapshot
                .workers()
                .iter()
                .chain(draining.iter())
                .map(|w| w.url().to_owned())
                .collect();
            // A removed worker's series stay for the exporter's idle time
            // (`crate::metrics`), then go; zeroed meanwhile so no dashboard
            // shows load on a worker that is gone.
            for gone in known.difference(&live) {
                gauges.in_flight(gone, 0);
                gauges.healthy(gone, false);
                gauges.tree_chars(gone, 0);
                gauges.prediction_error_gone(gone);
                state.breakers.gone(gone);
                state.metrics.forget_worker(gone);
            }
            for added in live.difference(&known) {
                state.metrics.revive_worker(added);
            }
            known = live;
        }
        for worker in &draining {
            gauges.in_flight(worker.url(), worker.load());
        }
        for worker in snapshot.workers() {
            state.breakers.publish(worker, now);
            gauges.in_flight(worker.url(), worker.load());
            gauges.healthy(worker.url(), worker.is_healthy());
            // A policy without trees (a reload to round_robin) holds none.
            let chars = state.router.cached_chars(worker).unwrap_or(0);
            gauges.tree_chars(worker.url(), chars);
            gauges.cache_truth(worker);
        }
        let mut rated_now = HashSet::new();
        if let Some(trees) = state.router.policy().trees() {
            for (model, rate) in trees.eviction_rates() {
                gauges.eviction_rate(&model, rate);
                rated_now.insert(model);
            }
            for (model, rate) in trees.bound_eviction_rates() {
                gauges.bound_eviction_rate(&model, rate);
                rated_now.insert(model);
            }
        }
        // A model whose tree is gone (its workers removed, a reload to a
        // policy without trees) reads 0, as a removed worker's gauges do,
        // not its last rate: an alert on it would go on for nothing.
        for gone in rated.difference(&rated_now) {
            gauges.eviction_rate(gone, 0.0);
            gauges.bound_eviction_rate(gone, 0.0);
        }
        rated = rated_now;
        state.admission.publish_metrics();
        connections.publish(&state.connections);
        if let Some(spans) = &spans {
            spans.publish();
        }
        state.metrics.run_upkeep();
    }
}
