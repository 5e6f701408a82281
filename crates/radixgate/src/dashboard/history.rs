//! The sampler's memory and arithmetic: readings taken a step apart become
//! rates, interval percentiles and per-step decision counts, and the
//! latest answer of `/dashboard/data` ([`History::push`]).
//!
//! Pure: readings go in, JSON comes out; the sampler task (`sampler.rs`)
//! does the reading. Every figure is a difference between two readings of
//! counters the gateway keeps anyway, so nothing is counted twice and
//! nothing is kept while nobody watches.

use super::prom::{Buckets, Scrape};
use super::recent::{Answered, Predicted};
use hashbrown::HashMap;
use radixgate_routing::WorkerRole;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// Seconds between readings.
pub(crate) const STEP_SECS: u64 = 1;
/// Points kept for the charts: five minutes.
pub(crate) const HISTORY: usize = 300;
/// Steps over which rates and percentiles are taken.
pub(crate) const RATE_WINDOW: usize = 10;
/// Steps over which cache hit rates are taken.
pub(crate) const HIT_WINDOW: usize = 60;

/// One step's reading.
#[derive(Debug, Default)]
pub(crate) struct Reading {
    /// Milliseconds since the Unix epoch (shown).
    pub(crate) at_ms: u64,
    /// Milliseconds on a monotonic clock (rates are taken on it).
    pub(crate) mono_ms: u64,
    /// The routing policy's name.
    pub(crate) policy: &'static str,
    /// A prefill/decode pool's decode policy (`policy` is then prefill's).
    pub(crate) decode_policy: Option<&'static str>,
    /// Seconds since the gateway started.
    pub(crate) uptime_secs: u64,
    /// The metrics, read back.
    pub(crate) scrape: Scrape,
    /// Every known worker, in the order shown.
    pub(crate) workers: Vec<WorkerReading>,
    /// Characters the tree predicted cached, by worker URL, for the
    /// requests answered since the previous reading.
    pub(crate) predicted: HashMap<String, Predicted>,
    /// The last answered requests, newest first.
    pub(crate) recent: Vec<Answered>,
}

/// One worker as read.
#[derive(Clone, Debug, Default)]
pub(crate) struct WorkerReading {
    pub(crate) url: String,
    pub(crate) name: String,
    /// `regular`, or `prefill`/`decode` in a disaggregated pool.
    pub(crate) role: &'static str,
    pub(crate) id: Option<String>,
    /// The admin API's state (`healthy`, `unhealthy`, `draining`, …).
    pub(crate) state: &'static str,
    /// `closed`, `open` or `half_open`.
    pub(crate) breaker: &'static str,
    /// Ejected by outlier detection.
    pub(crate) ejected: bool,
    pub(crate) in_flight: usize,
    /// Requests finished (cumulative).
    pub(crate) processed: u64,
    pub(crate) tree_chars: Option<usize>,
    /// Prompt tokens of its answers that reported cached tokens.
    pub(crate) prompt_tokens: u64,
    /// Cached tokens it reported.
    pub(crate) reported_tokens: u64,
}

/// The cumulative counts of one reading that later readings are diffed
/// against.
#[derive(Debug)]
struct Kept {
    mono_ms: u64,
    answers: u64,
    error_answers: u64,
    decisions: BTreeMap<String, u64>,
    ttft: Buckets,
    latency: Buckets,
    workers: HashMap<String, Counters>,
    predicted: HashMap<String, Predicted>,
}

#[derive(Clone, Debug, Default)]
struct Counters {
    /// The worker these are of (`None` while pending): one removed and
    /// added back at its URL is another, whose own counts start at 0.
    id: Option<String>,
    processed: u64,
    errors: u64,
    prompt_tokens: u64,
    reported_tokens: u64,
}

/// p50, p90 and p99, milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
}

impl Percentiles {
    fn of(b: &Buckets) -> Option<Self> {
        let ms = |q| b.quantile(q).map(|s| s * 1000.0);
        Some(Self {
            p50: ms(0.5)?,
            p90: ms(0.9)?,
            p99: ms(0.99)?,
        })
    }
}

/// One point of the charts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Point {
    /// Milliseconds since the Unix epoch.
    pub(crate) t_ms: u64,
    /// Answers per second over the rate window.
    pub(crate) answers_per_sec: Option<f64>,
    /// 5xx answers per second over the rate window.
    pub(crate) error_answers_per_sec: Option<f64>,
    /// Routing decisions made since the previous point, by branch.
    pub(crate) decisions: BTreeMap<String, u64>,
    /// TTFT percentiles of streamed answers over the rate window.
    pub(crate) ttft_ms: Option<Percentiles>,
    /// Latency percentiles over the rate window.
    pub(crate) latency_ms: Option<Percentiles>,
}

/// One row of the workers table.
#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct WorkerRow {
    pub(crate) url: String,
    pub(crate) name: String,
    pub(crate) role: &'static str,
    pub(crate) id: Option<String>,
    pub(crate) state: &'static str,
    pub(crate) breaker: &'static str,
    pub(crate) ejected: bool,
    pub(crate) in_flight: usize,
    pub(crate) requests_total: u64,
    pub(crate) requests_per_sec: Option<f64>,
    pub(crate) errors_total: u64,
    pub(crate) errors_per_sec: Option<f64>,
    pub(crate) tree_chars: Option<usize>,
    pub(crate) cache_hit_rate: Option<f64>,
    pub(crate) cache_hit_source: Option<&'static str>,
}

/// The pool as a whole, now.
#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct Pool {
    pub(crate) workers: usize,
    pub(crate) available: usize,
    pub(crate) in_flight: usize,
    pub(crate) answers_total: u64,
    pub(crate) error_answers_total: u64,
    pub(crate) answers_per_sec: Option<f64>,
    pub(crate) error_answers_per_sec: Option<f64>,
    pub(crate) ttft_ms: Option<Percentiles>,
    pub(crate) latency_ms: Option<Percentiles>,
    pub(crate) decisions_total: BTreeMap<String, u64>,
}

/// The body of `/dashboard/data` (docs/dashboard.md).
#[derive(Debug, Serialize)]
pub(crate) struct View<'a> {
    pub(crate) sampled_at_ms: u64,
    pub(crate) uptime_secs: u64,
    pub(crate) policy: &'static str,
    pub(crate) decode_policy: Option<&'static str>,
    pub(crate) step_secs: u64,
    pub(crate) rate_window_secs: u64,
    pub(crate) hit_window_secs: u64,
    pub(crate) history_secs: u64,
    pub(crate) pool: Pool,
    pub(crate) workers: Vec<WorkerRow>,
    pub(crate) series: &'a VecDeque<Point>,
    pub(crate) recent: Vec<Answered>,
}

/// Readings since someone started watching.
#[derive(Debug, Default)]
pub(crate) struct History {
    /// The last `HIT_WINDOW + 1` readings' counts, oldest first.
    kept: VecDeque<Kept>,
    /// The last [`HISTORY`] points, oldest first.
    points: VecDeque<Point>,
}

/// `(now - then) / seconds`, when time passed.
fn rate(now: u64, then: u64, ms: u64) -> Option<f64> {
    (ms > 0).then(|| now.saturating_sub(then) as f64 * 1000.0 / ms as f64)
}

impl History {
    /// Takes one reading: adds its point to the charts and returns the
    /// data endpoint's answer as of it.
    pub(crate) fn push(&mut self, reading: Reading) -> serde_json::Result<Vec<u8>> {
        let scrape = &reading.scrape;
        let kept = Kept {
            mono_ms: reading.mono_ms,
            answers: scrape.answers,
            error_answers: scrape.error_answers,
            decisions: scrape.decisions.clone(),
            ttft: scrape.ttft.clone(),
            latency: scrape.latency.clone(),
            workers: reading
                .workers
                .iter()
                .map(|w| {
                    let c = Counters {
                        id: w.id.clone(),
                        processed: w.processed,
                        errors: scrape.upstream_errors.get(&w.url).copied().unwrap_or(0),
                        prompt_tokens: w.prompt_tokens,
                        reported_tokens: w.reported_tokens,
                    };
                    (w.url.clone(), c)
                })
                .collect(),
            predicted: reading.predicted,
        };
        let point = self.point(&kept, reading.at_ms);
        if self.points.len() == HISTORY {
            self.points.pop_front();
        }
        self.points.push_back(point);
        if self.kept.len() > HIT_WINDOW {
            self.kept.pop_front();
        }
        self.kept.push_back(kept);

        let workers: Vec<WorkerRow> = reading.workers.iter().map(|w| self.row(w)).collect();
        let latest = self.points.back().cloned();
        let pool = Pool {
            workers: workers.len(),
            available: workers
                .iter()
                .filter(|w| w.state == "healthy" && w.breaker != "open" && !w.ejected)
                .count(),
            // A disaggregated request holds its decode worker throughout
            // and a prefill worker besides while it prefills: counted
            // once, at decode (prefill's load is on its own row).
            in_flight: workers
                .iter()
                .filter(|w| w.role != WorkerRole::Prefill.as_str())
                .map(|w| w.in_flight)
                .sum(),
            answers_total: scrape.answers,
            error_answers_total: scrape.error_answers,
            answers_per_sec: latest.as_ref().and_then(|p| p.answers_per_sec),
            error_answers_per_sec: latest.as_ref().and_then(|p| p.error_answers_per_sec),
            ttft_ms: latest.as_ref().and_then(|p| p.ttft_ms),
            latency_ms: latest.as_ref().and_then(|p| p.latency_ms),
            decisions_total: scrape.decisions.clone(),
        };
        serde_json::to_vec(&View {
            sampled_at_ms: reading.at_ms,
            uptime_secs: reading.uptime_secs,
            policy: reading.policy,
            decode_policy: reading.decode_policy,
            step_secs: STEP_SECS,
            rate_window_secs: RATE_WINDOW as u64 * STEP_SECS,
            hit_window_secs: HIT_WINDOW as u64 * STEP_SECS,
            history_secs: HISTORY as u64 * STEP_SECS,
            pool,
            workers,
            series: &self.points,
            recent: reading.recent,
        })
    }

    /// The reading `steps` before the newest kept one, or the oldest.
    fn back(&self, steps: usize) -> Option<&Kept> {
        let newest = self.kept.len().checked_sub(1)?;
        self.kept.get(newest.saturating_sub(steps))
    }

    /// The chart point of `now`, against the readings kept before it.
    fn point(&self, now: &Kept, t_ms: u64) -> Point {
        let previous = self.kept.back();
        let decisions = now
            .decisions
            .iter()
            .map(|(branch, &n)| {
                let before = previous
                    .and_then(|p| p.decisions.get(branch))
                    .copied()
                    .unwrap_or(0);
                (branch.clone(), n.saturating_sub(before))
            })
            .filter(|(_, n)| previous.is_some() && *n > 0)
            .collect();
        // The window ends at `now`, which is not kept yet: RATE_WINDOW
        // steps back from it is RATE_WINDOW - 1 back from the newest kept.
        let Some(base) = self.back(RATE_WINDOW - 1) else {
            return Point {
                t_ms,
                answers_per_sec: None,
                error_answers_per_sec: None,
                decisions,
                ttft_ms: None,
                latency_ms: None,
            };
        };
        let ms = now.mono_ms.saturating_sub(base.mono_ms);
        Point {
            t_ms,
            answers_per_sec: rate(now.answers, base.answers, ms),
            error_answers_per_sec: rate(now.error_answers, base.error_answers, ms),
            decisions,
            ttft_ms: Percentiles::of(&now.ttft.since(&base.ttft)),
            latency_ms: Percentiles::of(&now.latency.since(&base.latency)),
        }
    }

    /// A worker's row; `self.kept` already ends with its reading.
    fn row(&self, w: &WorkerReading) -> WorkerRow {
        let now = self
            .kept
            .back()
            .and_then(|k| k.workers.get(&w.url))
            .cloned()
            .unwrap_or_default();
        // This worker's counts in a reading: not those of another worker
        // that was at its URL before (removed and added back).
        fn own<'k>(k: &'k Kept, url: &str, id: &Option<String>) -> Option<&'k Counters> {
            k.workers.get(url).filter(|c| c.id == *id)
        }
        let own = |k| own(k, &w.url, &now.id);
        // Windows start at the reading RATE_WINDOW / HIT_WINDOW steps back
        // (or the oldest). A worker added since (at a new URL, or at one
        // another worker left) counts its own figures from nothing, but its
        // failed attempts are its URL's series, which outlives a worker
        // removed and added back: those count from its first reading in
        // the window.
        let since = |steps: usize| {
            let newest = self.kept.len().checked_sub(1)?;
            let first = newest.saturating_sub(steps);
            let base = self.kept.get(first)?;
            let ms = self.kept.back()?.mono_ms.saturating_sub(base.mono_ms);
            let then = own(base).cloned().unwrap_or_else(|| Counters {
                errors: self
                    .kept
                    .iter()
                    .skip(first)
                    .find_map(own)
                    .map_or(0, |c| c.errors),
                ..Counters::default()
            });
            Some((then, ms))
        };
        // A figure below its base was reset (a worker added back at its
        // URL within the window): it counts from nothing, as Prometheus'
        // `rate()` takes a counter reset.
        let per_sec = |f: fn(&Counters) -> u64| {
            since(RATE_WINDOW).and_then(|(then, ms)| {
                let (now, then) = (f(&now), f(&then));
                rate(now, if now < then { 0 } else { then }, ms)
            })
        };
        let (hit_rate, source) = match since(HIT_WINDOW) {
            Some((then, _)) if now.prompt_tokens > then.prompt_tokens => {
                let prompt = now.prompt_tokens - then.prompt_tokens;
                let cached = now.reported_tokens.saturating_sub(then.reported_tokens);
                (
                    Some((cached as f64 / prompt as f64).min(1.0)),
                    Some("reported"),
                )
            }
            _ => {
                let mut predicted = Predicted::default();
                // Each reading's predictions cover the step that ends at
                // it: the window's first reading's step lies before it.
                let skip = usize::from(self.kept.len() > 1);
                for k in self.kept.iter().skip(skip).filter(|k| own(k).is_some()) {
                    if let Some(p) = k.predicted.get(&w.url) {
                        predicted.add(*p);
                    }
                }
                let rate = predicted.rate();
                (rate, rate.map(|_| "predicted"))
            }
        };
        WorkerRow {
            url: w.url.clone(),
            name: w.name.clone(),
            role: w.role,
            id: w.id.clone(),
            state: w.state,
            breaker: w.breaker,
            ejected: w.ejected,
            in_flight: w.in_flight,
            requests_total: w.processed,
            requests_per_sec: per_sec(|c| c.processed),
            errors_total: now.errors,
            errors_per_sec: per_sec(|c| c.errors),
            tree_chars: w.tree_chars,
            cache_hit_rate: hit_rate,
            cache_hit_source: source,
        }
    }
}

#[cfg(test)]
mod tests;
