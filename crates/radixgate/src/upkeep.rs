//! The upkeep tick: every 250 ms, turn time-driven breaker changes (an open
//! breaker whose timeout passed becomes half-open) into the workers' breaker
//! slots, refresh the per-worker and admission gauges, and let the metrics
//! recorder fold its histogram samples. Reads only snapshots and atomics.

use crate::state::{Shared, publish_breaker};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TICK: Duration = Duration::from_millis(250);

pub(crate) async fn run(state: Arc<Shared>, stop: CancellationToken) {
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
                state.metrics.worker_in_flight(gone, 0);
                state.metrics.worker_healthy(gone, false);
                state.metrics.tree_chars(gone, 0);
            }
            known = live;
        }
        for worker in snapshot.workers() {
            let breaker = state.breakers.get(worker.id());
            publish_breaker(worker, breaker.state(now));
            let m = &state.metrics;
            m.breaker(worker.url(), &breaker, now);
            m.worker_in_flight(worker.url(), worker.load());
            m.worker_healthy(worker.url(), worker.is_healthy());
            if let Some(chars) = state.router.policy().cached_chars(worker.id()) {
                m.tree_chars(worker.url(), chars);
            }
        }
        state.metrics.admission(&state.admission);
        state.metrics.run_upkeep();
    }
}
