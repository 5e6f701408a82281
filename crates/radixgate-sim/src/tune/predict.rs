//! The prediction check: how well the simulator reproduces a recording.
//!
//! The recording is replayed with every request sent to the worker that
//! served it ([`Contender::Pinned`]), against the worker model given to
//! `tune`; each worker's simulated hit rate (cached over prompt tokens) is
//! set beside the one its real answers reported, over the same requests
//! (those whose answer carried a cached-token count). Where the two agree,
//! the worker model and the recording's block hashes hold what the real
//! caches held, and the simulated runs of other settings can be believed
//! as far as routing goes. The current settings' own simulated routing is
//! compared too, over all workers together (its workers are not the
//! recorded ones, so per worker means nothing there).

use std::sync::Arc;

use serde::Serialize;

use super::recording::{Recording, Tally};
use crate::SimError;
use crate::simulate::{Contender, RunStats, SimConfig, cluster};

/// One worker's recorded and simulated hit rates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerCheck {
    /// The worker's URL, as recorded.
    pub worker: String,
    /// Requests it served (replayed).
    pub requests: u64,
    /// Of those, with a reported cached-token count (the ones compared).
    pub reported: u64,
    /// Reported cached over prompt tokens.
    pub recorded_hit_rate: Option<f64>,
    /// Simulated cached over prompt tokens, same requests, same worker.
    pub simulated_hit_rate: Option<f64>,
}

impl WorkerCheck {
    /// Simulated minus recorded hit rate, when both exist.
    pub fn difference(&self) -> Option<f64> {
        Some(self.simulated_hit_rate? - self.recorded_hit_rate?)
    }
}

/// The whole check.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    /// Per worker, in the recording's worker order.
    pub workers: Vec<WorkerCheck>,
    /// Reported hit rate over all workers.
    pub recorded_hit_rate: Option<f64>,
    /// The pinned replay's, over the same requests.
    pub simulated_hit_rate: Option<f64>,
    /// The current settings' own simulated routing, over the same requests
    /// (filled by the caller from its run of them).
    pub policy_hit_rate: Option<f64>,
}

impl Prediction {
    /// The largest per-worker difference, in absolute value.
    pub fn worst_difference(&self) -> Option<f64> {
        self.workers
            .iter()
            .filter_map(WorkerCheck::difference)
            .map(f64::abs)
            .max_by(f64::total_cmp)
    }
}

/// Why there is no prediction check for a recording, if there is none.
pub fn unavailable(rec: &Recording, workers: usize) -> Option<String> {
    if rec.pins().is_none() {
        return Some("the trace names no worker for some requests (not a recording?)".into());
    }
    if rec.workers.len() != workers {
        return Some(format!(
            "the recording names {} workers and --workers is {workers}",
            rec.workers.len()
        ));
    }
    if rec.records.iter().all(|r| r.cached_tokens.is_none()) {
        return Some("no answer in the recording reported cached tokens".into());
    }
    None
}

/// Hit rate of a run over the requests that have a report in `rec`.
pub fn reported_subset(rec: &Recording, stats: &RunStats) -> Tally {
    let mut t = Tally::default();
    for s in stats.served.iter().filter(|s| rec.has_report(s.seq)) {
        t.add(Some((s.prompt_tokens, s.cached_tokens)));
    }
    t
}

/// Replays `rec` pinned to its recorded workers under `cfg` (whose pool
/// must have one worker per recorded URL) and compares per worker.
pub fn pinned(cfg: &SimConfig, rec: &Recording) -> Result<Prediction, SimError> {
    if let Some(why) = unavailable(rec, cfg.workers) {
        return Err(SimError::Config(format!("no prediction check: {why}")));
    }
    let pins = rec.pins().unwrap_or_default();
    let stats = cluster::run(cfg, &Contender::Pinned(Arc::from(pins)))?;
    let mut simulated = vec![Tally::default(); rec.workers.len()];
    for s in stats.served.iter().filter(|s| rec.has_report(s.seq)) {
        simulated[s.worker].add(Some((s.prompt_tokens, s.cached_tokens)));
    }
    let recorded = rec.reported();
    let sum = |ts: &[Tally]| {
        ts.iter().fold(Tally::default(), |mut a, t| {
            a.requests += t.requests;
            a.reported += t.reported;
            a.prompt_tokens += t.prompt_tokens;
            a.cached_tokens += t.cached_tokens;
            a
        })
    };
    Ok(Prediction {
        workers: rec
            .workers
            .iter()
            .zip(recorded.iter().zip(&simulated))
            .map(|(w, (r, s))| WorkerCheck {
                worker: w.clone(),
                requests: r.requests,
                reported: r.reported,
                recorded_hit_rate: r.hit_rate(),
                simulated_hit_rate: s.hit_rate(),
            })
            .collect(),
        recorded_hit_rate: sum(&recorded).hit_rate(),
        simulated_hit_rate: sum(&simulated).hit_rate(),
        policy_hit_rate: None,
    })
}
