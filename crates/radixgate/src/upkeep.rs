//! The upkeep tick: every 250 ms, turn time-driven breaker changes (an open
//! breaker whose timeout passed becomes half-open) into the workers' breaker
//! slots, refresh the per-worker and admission gauges, and let the metrics
//! recorder fold its histogram samples. Reads only snapshots and atomics.
//!
//! The per-worker gauges (in flight, healthy, tree characters) are read
//! from the worker set here and nowhere else, so this task owns them
//! ([`WorkerGauges`]); the breakers and admission own theirs and are asked
//! to publish them on each tick.

use crate::metrics::{Describe, Metrics, PerWorker};
use crate::state::Shared;
use ::metrics::Gauge;
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

/// The per-worker gauges the tick refreshes.
pub(crate) struct WorkerGauges {
    in_flight: PerWorker<Gauge>,
    healthy: PerWorker<Gauge>,
    tree_chars: PerWorker<Gauge>,
}

impl WorkerGauges {
    pub(crate) fn new(metrics: &Metrics) -> Self {
        Self {
            in_flight: metrics.per_worker_gauges(&WORKER_IN_FLIGHT),
            healthy: metrics.per_worker_gauges(&WORKER_HEALTHY),
            tree_chars: metrics.per_worker_gauges(&TREE_CHARS),
        }
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
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_generation = u64::MAX;
    let mut known: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let now = tokio::time::Instant::now();
        let snapshot = state.router.snapshot();
        if snapshot.generation() != last_generation {
            last_generation = snapshot.generation();
            state.breakers.retain(|id| snapshot.get(id).is_some());
            let live: HashSet<String> = snapshot
                .workers()
                .iter()
                .map(|w| w.url().to_owned())
                .collect();
            // The exporter keeps a removed worker's series; zero them so no
            // dashboard shows load on a worker that is gone.
            for gone in known.difference(&live) {
                gauges.in_flight(gone, 0);
                gauges.healthy(gone, false);
                gauges.tree_chars(gone, 0);
            }
            known = live;
        }
        for worker in snapshot.workers() {
            state.breakers.publish(worker, now);
            gauges.in_flight(worker.url(), worker.load());
            gauges.healthy(worker.url(), worker.is_healthy());
            if let Some(chars) = state.router.policy().cached_chars(worker.id()) {
                gauges.tree_chars(worker.url(), chars);
            }
        }
        state.admission.publish_metrics();
        state.metrics.run_upkeep();
    }
}
