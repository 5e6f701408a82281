//! Outlier detection: eject, for a while, a worker that answers far slower
//! than its peers, as Envoy's outlier detection does. It catches what the
//! health check and the breaker miss: the slow-but-alive worker whose
//! `/health` answers at once while its requests crawl (a thermally
//! throttled GPU, a worker swapping its KV cache, a noisy neighbour).
//!
//! The attempt loop ([`crate::proxy`]) reports each attempt's time to first
//! byte ([`Outliers::sample`]; a first-byte timeout counts as a sample of
//! the timeout itself, so a hung worker's mean rises too) — for a stream
//! that opens before its prefill (a Responses or Messages preamble, an SSE
//! comment), its time to first token, which its response body reports —
//! except for a
//! generated whole answer, whose first byte waits for its whole decode,
//! and for an error answer, which served nothing: a worker shedding
//! everything at once would read as the quickest
//! (`Endpoint::times_its_worker`). Consecutive
//! failures are the circuit breaker's business, not repeated here. Every
//! `interval_secs`, [`Outliers::evaluate`] compares each worker's
//! exponentially weighted mean latency with the median of its peers'
//! (the workers of its role serving the same models, with at least
//! `min_samples` samples each: a large model's workers, or decode workers,
//! are slower than a small model's or prefill workers without being
//! outliers): above `latency_factor`
//! times the median, and by at least `min_gap_ms`, it is ejected for
//! `base_ejection_secs` × the number of times it was ejected (at most
//! `max_ejection_secs`). An ejected worker's slot in the routing crate's
//! [`Worker`] is set, which `is_available()` reads, so every policy skips
//! it just as it skips an open breaker. When its time is up it returns
//! with its samples cleared (it is judged afresh), and each evaluation it
//! passes as a non-outlier lowers its ejection count by one (Envoy's
//! decay). At most `max_ejection_percent` of the pool is ejected at once
//! (one worker always may be), and never a worker whose models no other
//! available worker of its role serves (a prefill worker cannot decode);
//! an ejected worker in that plight later (its peers' breakers opened, or
//! they fail health checks) returns at the next evaluation, before its
//! time is up, or at once when a request finds no other worker
//! ([`Outliers::rescue`], from the attempt loops; its ejected gauge
//! follows at the next evaluation).
//!
//! The detector's metric families ([`OutlierMetrics`]: ejections and the
//! ejected gauge of each worker) are recorded only by [`run`], which builds
//! them.
//!
//! Time is passed in (`now`, tokio's clock), so tests run under a paused
//! clock. Concurrency: the statistics sit behind one `parking_lot::Mutex`,
//! held for a few arithmetic operations per attempt and for one pass over
//! the pool per evaluation; never across an `.await`.

use crate::config::OutlierConfig;
use crate::metrics::{Describe, Metrics, PerWorker};
use crate::state::Shared;
use ::metrics::{Counter, Gauge};
use parking_lot::Mutex;
use radixgate_routing::{Worker, WorkerId};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) const EJECTIONS: Describe = Describe::new(
    "radixgate_outlier_ejections_total",
    "Times outlier detection ejected each worker (far slower than its peers).",
);
pub(crate) const EJECTED: Describe = Describe::new(
    "radixgate_outlier_ejected",
    "Whether each worker is ejected by outlier detection now (1) or not (0).",
);

/// Weight of the newest sample in a worker's latency mean.
const EWMA_ALPHA: f64 = 0.3;

/// What one worker's recent attempts looked like.
#[derive(Debug, Default)]
struct Stats {
    /// Exponentially weighted mean time to first byte, in ms.
    latency_ms: f64,
    /// Samples since the worker was (re)admitted.
    samples: u32,
    /// Ejections so far, less one per evaluation passed since.
    times_ejected: u32,
    /// Until when it is ejected.
    ejected_until: Option<Instant>,
}

/// A change outlier detection made.
#[derive(Debug)]
pub(crate) enum Event {
    /// A worker was ejected.
    Ejected {
        worker: Arc<Worker>,
        /// For how long.
        duration: Duration,
        /// Its latency mean, ms.
        latency_ms: f64,
        /// Its peers' median, ms.
        median_ms: f64,
    },
    /// An ejected worker's time is up.
    Returned { worker: Arc<Worker> },
}

/// Per-worker latency statistics and the ejection rule.
#[derive(Debug)]
pub(crate) struct Outliers {
    config: OutlierConfig,
    stats: Mutex<HashMap<WorkerId, Stats>>,
}

impl Outliers {
    pub(crate) fn new(config: OutlierConfig) -> Self {
        Self {
            config,
            stats: Mutex::new(HashMap::new()),
        }
    }

    /// How often [`Outliers::evaluate`] should run.
    pub(crate) fn interval(&self) -> Duration {
        Duration::from_secs(self.config.interval_secs.max(1))
    }

    /// One attempt at `worker` got its first byte after `latency`.
    pub(crate) fn sample(&self, worker: WorkerId, latency: Duration) {
        if !self.config.enabled {
            return;
        }
        let ms = latency.as_secs_f64() * 1000.0;
        let mut stats = self.stats.lock();
        let s = stats.entry(worker).or_default();
        s.latency_ms = if s.samples == 0 {
            ms
        } else {
            s.latency_ms + EWMA_ALPHA * (ms - s.latency_ms)
        };
        s.samples = s.samples.saturating_add(1);
    }

    /// Returns at once, before their time is up, the ejected workers among
    /// `workers` whose models no other available worker of their role
    /// serves: what [`Outliers::evaluate`] does at its next interval, done
    /// by a request that found no worker to take it (a peer's breaker
    /// opened on this very request, or before the next evaluation). A
    /// slow worker is better than a 503. Says which returned (none: the
    /// request's failure stands).
    pub(crate) fn rescue(&self, workers: &[Arc<Worker>]) -> Vec<Arc<Worker>> {
        let mut returned = Vec::new();
        if !workers.iter().any(|w| w.is_ejected()) {
            return returned;
        }
        let mut stats = self.stats.lock();
        for w in workers {
            let Some(s) = stats.get_mut(&w.id()) else {
                continue;
            };
            if s.ejected_until.is_some() && !others_serve(w, workers) {
                readmit(s, w);
                returned.push(w.clone());
            }
        }
        returned
    }

    /// Returns workers whose ejection is over and ejects new outliers among
    /// `workers` (the whole current pool); sets their flags and reports
    /// what changed.
    pub(crate) fn evaluate(&self, workers: &[Arc<Worker>], now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        let mut stats = self.stats.lock();
        stats.retain(|id, _| workers.iter().any(|w| w.id() == *id));
        for w in workers {
            let Some(s) = stats.get_mut(&w.id()) else {
                continue;
            };
            // Its time is up, or no other available worker serves one of
            // its models any more (their breakers opened, they fail health
            // checks): a slow worker is better than none, and the model's
            // requests were answered 503 for the rest of the ejection.
            // In pool order, so that of two ejected workers left alone
            // one returns.
            let over = s.ejected_until.is_some_and(|until| until <= now);
            if over || (s.ejected_until.is_some() && !others_serve(w, workers)) {
                readmit(s, w);
                events.push(Event::Returned { worker: w.clone() });
            }
        }
        if !self.config.enabled {
            return events;
        }
        // Judged: workers in the pool with enough samples, not ejected.
        let judged: Vec<(usize, f64)> = workers
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                let s = stats.get(&w.id())?;
                (s.ejected_until.is_none() && s.samples >= self.config.min_samples)
                    .then_some((i, s.latency_ms))
            })
            .collect();
        let mut outliers: Vec<(usize, f64, f64)> = Vec::new();
        for &(i, latency) in &judged {
            // Judged against the workers that do the same work: a large
            // model's workers, or decode workers (their first byte waits
            // for a prefill), are slower than a small model's or prefill
            // workers without being outliers.
            let peers: Vec<f64> = judged
                .iter()
                .filter(|&&(j, _)| j != i && alike(&workers[i], &workers[j]))
                .map(|&(_, l)| l)
                .collect();
            let Some(median) = median(peers) else {
                continue;
            };
            let gap = latency - median;
            if latency > self.config.latency_factor * median && gap >= self.config.min_gap_ms as f64
            {
                outliers.push((i, latency, median));
            } else if let Some(s) = stats.get_mut(&workers[i].id()) {
                s.times_ejected = s.times_ejected.saturating_sub(1);
            }
        }
        // Worst first, within the cap.
        outliers.sort_by(|a, b| (b.1 / b.2.max(1e-9)).total_cmp(&(a.1 / a.2.max(1e-9))));
        let cap = ((workers.len() as u64 * u64::from(self.config.max_ejection_percent)) / 100)
            .max(u64::from(self.config.max_ejection_percent > 0)) as usize;
        let mut ejected = workers.iter().filter(|w| w.is_ejected()).count();
        for (i, latency_ms, median_ms) in outliers {
            let worker = &workers[i];
            if ejected >= cap || !others_serve(worker, workers) {
                continue;
            }
            let Some(s) = stats.get_mut(&worker.id()) else {
                continue;
            };
            s.times_ejected = s.times_ejected.saturating_add(1);
            let duration = Duration::from_secs(
                self.config
                    .base_ejection_secs
                    .saturating_mul(u64::from(s.times_ejected))
                    .min(self.config.max_ejection_secs),
            );
            s.ejected_until = Some(now + duration);
            worker.set_ejected(true);
            ejected += 1;
            events.push(Event::Ejected {
                worker: worker.clone(),
                duration,
                latency_ms,
                median_ms,
            });
        }
        events
    }
}

/// Ends `w`'s ejection: it is judged afresh from its next samples.
fn readmit(s: &mut Stats, w: &Worker) {
    s.ejected_until = None;
    s.samples = 0;
    s.latency_ms = 0.0;
    w.set_ejected(false);
}

/// The median of `values` (the mean of the middle two for an even count).
fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

/// Whether `a` and `b` do the same work, so that their latencies compare:
/// one role, the same models.
fn alike(a: &Worker, b: &Worker) -> bool {
    if a.role() != b.role() || a.models().len() != b.models().len() {
        return false;
    }
    a.models().iter().all(|m| b.serves(m))
}

/// Whether every model `worker` serves is served by another available
/// worker of its role too (ejecting it must not empty a model's pool; a
/// prefill worker cannot stand in for a decode worker, nor the reverse).
fn others_serve(worker: &Worker, workers: &[Arc<Worker>]) -> bool {
    let others = || {
        workers
            .iter()
            .filter(move |o| o.id() != worker.id() && o.role() == worker.role() && o.is_available())
    };
    if worker.models().is_empty() {
        return others().any(|o| o.models().is_empty());
    }
    worker
        .models()
        .iter()
        .all(|m| others().any(|o| o.serves(m)))
}

/// The outlier metric families.
pub(crate) struct OutlierMetrics {
    ejections: PerWorker<Counter>,
    ejected: PerWorker<Gauge>,
}

impl OutlierMetrics {
    pub(crate) fn new(metrics: &Metrics) -> Self {
        Self {
            ejections: metrics.per_worker_counters(&EJECTIONS),
            ejected: metrics.per_worker_gauges(&EJECTED),
        }
    }

    /// Outlier detection ejected a worker.
    pub(crate) fn ejection(&self, worker: &str) {
        self.ejections.with(worker, |c| c.increment(1));
    }

    /// Whether a worker is ejected by outlier detection now.
    pub(crate) fn ejected(&self, worker: &str, ejected: bool) {
        self.ejected.set(worker, if ejected { 1.0 } else { 0.0 });
    }
}

/// Runs [`Outliers::evaluate`] every interval over the current pool, with a
/// log line and metrics for each change, until `stop`. A worker that left
/// the pool reads not ejected (0) from then on, as its other gauges read 0.
pub(crate) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let metrics = OutlierMetrics::new(&shared.metrics);
    // The workers whose gauge was set at the last evaluation.
    let mut shown: HashSet<String> = HashSet::new();
    let mut ticks = tokio::time::interval(shared.outliers.interval());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let snapshot = shared.router.snapshot();
        let events = shared.outliers.evaluate(snapshot.workers(), Instant::now());
        for event in events {
            match event {
                Event::Ejected {
                    worker,
                    duration,
                    latency_ms,
                    median_ms,
                } => {
                    tracing::warn!(
                        worker = worker.url(),
                        ?duration,
                        latency_ms = latency_ms.round(),
                        peers_median_ms = median_ms.round(),
                        "outlier ejected: far slower than its peers"
                    );
                    metrics.ejection(worker.url());
                }
                Event::Returned { worker } => {
                    tracing::info!(worker = worker.url(), "outlier returned to the pool");
                }
            }
        }
        let live: HashSet<String> = snapshot
            .workers()
            .iter()
            .map(|w| w.url().to_owned())
            .collect();
        for gone in shown.difference(&live) {
            metrics.ejected(gone, false);
        }
        for worker in snapshot.workers() {
            metrics.ejected(worker.url(), worker.is_ejected());
        }
        shown = live;
    }
}

#[cfg(test)]
mod tests;
