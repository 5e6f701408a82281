//! What `radixgate simulate` reports, per contender (and sweep point):
//!
//! - token hit rate = Σ cached prompt tokens / Σ prompt tokens over completed
//!   requests (as `radixgate load` computes it from the workers' usage), and
//!   its fraction of the oracle's hit rate in the same run;
//! - TTFT mean/p50/p99 and end-to-end mean/p99, simulated milliseconds;
//! - throughput: completed requests and output tokens per simulated second
//!   (up to the last completion);
//! - spread: the busiest worker's completed requests / the mean per worker
//!   (1.0 is perfectly even); work spread: the same over the tokens each
//!   worker computed (uncached prompt + generated), which differs from the
//!   request spread when short and long requests mix;
//! - with `--timeline-secs`, the per-worker [`Timeline`] (printed after the
//!   table in the text report).

use serde::Serialize;

use super::cluster::RunStats;
use super::timeline::Timeline;
use crate::load::Summary;

/// One row: a contender (and sweep point) and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyReport {
    /// `cache_aware`, `oracle`, …
    pub policy: String,
    /// The sweep point (`cache_threshold=0.5 …`), empty for defaults.
    pub params: String,
    /// Requests completed.
    pub completed: u64,
    /// Requests refused by the engines (too large for a worker).
    pub failed: u64,
    /// Token-weighted hit rate.
    pub hit_rate: f64,
    /// `hit_rate` / the oracle's (when the oracle ran and hit anything).
    pub oracle_fraction: Option<f64>,
    /// Time to first token, ms.
    pub ttft_ms: Option<Summary>,
    /// End-to-end latency, ms.
    pub e2e_ms: Option<Summary>,
    /// Completed requests per simulated second.
    pub throughput_rps: f64,
    /// Output tokens per simulated second.
    pub output_tokens_per_s: f64,
    /// Busiest worker's share / mean share.
    pub spread: f64,
    /// Busiest worker's computed tokens / the mean.
    pub work_spread: f64,
    /// Completed requests per worker.
    pub per_worker: Vec<u64>,
    /// Simulated seconds up to the last completion.
    pub simulated_secs: f64,
    /// Wall-clock seconds this run took.
    pub wall_secs: f64,
    /// Per-worker dispatches and TTFT per window of simulated time, when
    /// asked for (`--timeline-secs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
}

impl PolicyReport {
    /// Summarises one run.
    pub fn new(policy: &str, params: String, s: &RunStats, wall_secs: f64) -> Self {
        let secs = s.end.as_secs_f64();
        let per_sec = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        let mean = s.completed as f64 / s.per_worker.len().max(1) as f64;
        let max = s.per_worker.iter().copied().max().unwrap_or(0) as f64;
        Self {
            policy: policy.to_owned(),
            params,
            completed: s.completed,
            failed: s.failed,
            hit_rate: if s.prompt_tokens > 0 {
                s.cached_tokens as f64 / s.prompt_tokens as f64
            } else {
                0.0
            },
            oracle_fraction: None,
            ttft_ms: Summary::of(s.ttft_ms.clone()),
            e2e_ms: Summary::of(s.e2e_ms.clone()),
            throughput_rps: per_sec(s.completed as f64),
            output_tokens_per_s: per_sec(s.completion_tokens as f64),
            spread: if mean > 0.0 { max / mean } else { 0.0 },
            work_spread: max_over_mean(&s.work_tokens),
            per_worker: s.per_worker.clone(),
            simulated_secs: secs,
            wall_secs,
            timeline: None,
        }
    }
}

fn max_over_mean(v: &[u64]) -> f64 {
    let mean = v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
    let max = v.iter().copied().max().unwrap_or(0) as f64;
    if mean > 0.0 { max / mean } else { 0.0 }
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// Workload name.
    pub workload: String,
    /// Workers in the pool.
    pub workers: usize,
    /// The arrival process, in words.
    pub arrivals: String,
    /// Seed.
    pub seed: u64,
    /// API whose routing text was used.
    pub api: String,
    /// One row per contender and sweep point.
    pub rows: Vec<PolicyReport>,
}

impl SimReport {
    /// Fills every row's fraction of the oracle's hit rate.
    pub fn relate_to_oracle(&mut self) {
        let oracle = self
            .rows
            .iter()
            .find(|r| r.policy == "oracle")
            .map(|r| r.hit_rate);
        if let Some(o) = oracle.filter(|&o| o > 0.0) {
            for r in &mut self.rows {
                r.oracle_fraction = Some(r.hit_rate / o);
            }
        }
    }

    /// The report as a text table.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {}  workers {}  arrivals {}  api {}  seed {}",
            self.workload, self.workers, self.arrivals, self.api, self.seed
        );
        let width = self
            .rows
            .iter()
            .map(|r| r.policy.len() + r.params.len() + 1)
            .max()
            .unwrap_or(6)
            .max(6);
        let _ = writeln!(
            out,
            "{:<width$}  {:>6} {:>6}  {:>9} {:>9} {:>9}  {:>9} {:>9}  {:>8} {:>6} {:>6} {:>6}",
            "policy",
            "hit%",
            "/orcl",
            "ttft_mean",
            "ttft_p50",
            "ttft_p99",
            "e2e_mean",
            "e2e_p99",
            "req/s",
            "spread",
            "work",
            "fail",
        );
        let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        let mut requests = 0;
        let mut wall = 0.0;
        for r in &self.rows {
            let name = if r.params.is_empty() {
                r.policy.clone()
            } else {
                format!("{} {}", r.policy, r.params)
            };
            let _ = writeln!(
                out,
                "{:<width$}  {:>6.1} {:>6}  {:>9} {:>9} {:>9}  {:>9} {:>9}  {:>8.1} {:>6.2} {:>6.2} {:>6}",
                name,
                r.hit_rate * 100.0,
                r.oracle_fraction
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
                f(r.ttft_ms.map(|s| s.mean)),
                f(r.ttft_ms.map(|s| s.p50)),
                f(r.ttft_ms.map(|s| s.p99)),
                f(r.e2e_ms.map(|s| s.mean)),
                f(r.e2e_ms.map(|s| s.p99)),
                r.throughput_rps,
                r.spread,
                r.work_spread,
                r.failed,
            );
            requests += r.completed + r.failed;
            wall += r.wall_secs;
        }
        let mut timelines = self
            .rows
            .iter()
            .filter_map(|r| r.timeline.as_ref().map(|t| (r, t)))
            .peekable();
        if let Some((_, t)) = timelines.peek() {
            let _ = writeln!(
                out,
                "timeline per {} s of simulated time: requests dispatched / mean TTFT ms, per worker",
                t.window_secs
            );
        }
        for (r, t) in timelines {
            let name = if r.params.is_empty() {
                r.policy.clone()
            } else {
                format!("{} {}", r.policy, r.params)
            };
            t.render(&name, &mut out);
        }
        let _ = writeln!(
            out,
            "latencies in simulated ms; {requests} requests simulated in {wall:.2} s of wall time ({:.0} req/s)",
            if wall > 0.0 {
                requests as f64 / wall
            } else {
                0.0
            }
        );
        out
    }
}
