//! The gateway's breakers: one [`Breaker`] per worker id, created on first
//! use, and the breaker metrics they own (each worker's state gauge and
//! transition counter).
//!
//! The metrics are refreshed from the breakers themselves on the upkeep
//! tick ([`Breakers::publish`]): the transition counter follows the
//! breaker's own count ([`WorkerTotal`]), so no change is missed or counted
//! twice however often it is published, and the breaker of a worker added
//! back at its URL counts on in that URL's series.
//!
//! The map is a `parking_lot::RwLock`: read for a lookup per attempt (never
//! held across `.await`), written only the first time a worker id is seen
//! and when removed workers are forgotten.

use super::{Breaker, BreakerState};
use crate::config::BreakerConfig;
use crate::metrics::{Describe, Metrics, PerWorker, WorkerTotal};
use ::metrics::Gauge;
use parking_lot::RwLock;
use radixgate_routing::{Worker, WorkerId};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::time::Instant;

pub(crate) const STATE: Describe = Describe::new(
    "radixgate_circuit_breaker_state",
    "Circuit breaker state of each worker: 0 closed, 1 open, 2 half-open.",
);
pub(crate) const TRANSITIONS: Describe = Describe::new(
    "radixgate_circuit_breaker_transitions_total",
    "Circuit breaker state changes of each worker.",
);

/// One circuit breaker per worker id, created on first use.
pub(crate) struct Breakers {
    config: BreakerConfig,
    map: RwLock<HashMap<WorkerId, Arc<Breaker>>>,
    metrics: BreakerMetrics,
}

impl Breakers {
    pub(crate) fn new(config: BreakerConfig, metrics: &Metrics) -> Self {
        Self {
            config,
            map: RwLock::new(HashMap::new()),
            metrics: BreakerMetrics::new(metrics),
        }
    }

    pub(crate) fn get(&self, id: WorkerId) -> Arc<Breaker> {
        if let Some(b) = self.map.read().get(&id) {
            return b.clone();
        }
        self.map
            .write()
            .entry(id)
            .or_insert_with(|| Arc::new(Breaker::new(&self.config)))
            .clone()
    }

    /// Forgets breakers of workers no longer in the pool.
    pub(crate) fn retain(&self, live: impl Fn(WorkerId) -> bool) {
        self.map.write().retain(|id, _| live(*id));
    }

    /// A worker left the pool: its state gauge reads closed (0), as its
    /// other gauges read 0, until the exporter drops the series; left as
    /// it was, an open breaker would go on alerting for a worker that is
    /// gone.
    pub(crate) fn gone(&self, worker: &str) {
        self.metrics.state.set(worker, 0.0);
    }

    /// The upkeep tick's work for one worker: publishes its breaker's state
    /// at `now` into the worker's slot (an open breaker whose timeout passed
    /// reads half-open) and refreshes its metrics.
    pub(crate) fn publish(&self, worker: &Worker, now: Instant) {
        let breaker = self.get(worker.id());
        publish_breaker(worker, breaker.state(now));
        self.metrics
            .record(worker.url(), worker.id(), &breaker, now);
    }
}

/// Publishes a breaker state into the worker's slot, which policies read:
/// the same type on both sides, so nothing is translated.
pub(crate) fn publish_breaker(worker: &Worker, state: BreakerState) {
    worker.set_breaker(state);
}

/// The breaker metric families.
pub(crate) struct BreakerMetrics {
    state: PerWorker<Gauge>,
    transitions: PerWorker<WorkerTotal>,
}

impl BreakerMetrics {
    pub(crate) fn new(metrics: &Metrics) -> Self {
        Self {
            state: metrics.per_worker_gauges(&STATE),
            transitions: metrics.per_worker_totals(&TRANSITIONS),
        }
    }

    /// The breaker of worker `id` at URL `worker` as it stands at `now`:
    /// its state gauge and its transition count (taken from the breaker).
    pub(crate) fn record(&self, worker: &str, id: WorkerId, breaker: &Breaker, now: Instant) {
        let state = f64::from(breaker.state(now).as_gauge());
        self.state.set(worker, state);
        self.transitions
            .with(worker, |c| c.follow(id, breaker.transitions()));
    }
}
