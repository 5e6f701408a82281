//! Accumulating outcomes into the report: hit rate, latency percentiles,
//! throughput, errors by kind, requests per worker and their spread.
//!
//! Definitions (so numbers from different runs and tools compare):
//! - token hit rate = Σ cached tokens / Σ prompt tokens over successful
//!   responses whose usage reported a cached count (vLLM reports none
//!   without `--enable-prompt-tokens-details`, SGLang's OpenAI APIs none
//!   without `--enable-cache-report`: a response that says nothing of the
//!   cache is left out, not counted as a miss; none at all is n/a);
//! - percentiles are nearest-rank over successful requests;
//! - time per output token (TPOT, the inter-token latency) of one request =
//!   (E2E − TTFT) / (output tokens − 1), over successful streamed requests
//!   that reported more than one output token in their usage (the first
//!   token's time is TTFT's; a whole response has no TTFT);
//! - spread = the busiest worker's request count / the mean count, over the
//!   workers seen in responses, the `--url`s or `--pool-size`, whichever
//!   are more (so a worker that got nothing still counts when it was a
//!   target, or when the caller says it is behind the router); none (n/a)
//!   when a successful response named no worker (a real engine sends no
//!   worker header), since those requests' workers are unknown.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use super::outcome::Outcome;
use crate::SimError;

/// How [`LoadReport::workers`] counts responses that named no worker.
const UNNAMED: &str = "(unnamed)";

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Samples.
    pub count: usize,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// The nearest-rank percentile `p` (0..=100) of ascending `sorted` values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// Summarises samples (`None` when there are none).
    pub fn of(mut values: Vec<f64>) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        Some(Self {
            count: values.len(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: percentile(&values, 50.0),
            p90: percentile(&values, 90.0),
            p99: percentile(&values, 99.0),
            max: values[values.len() - 1],
        })
    }
}

/// Running totals while a load runs.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    ttft_ms: Vec<f64>,
    e2e_ms: Vec<f64>,
    tpot_ms: Vec<f64>,
    ok: u64,
    errors: BTreeMap<String, u64>,
    prompt_tokens: u64,
    /// Prompt tokens of the responses that reported a cached count.
    counted_prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
    without_usage: u64,
    without_cached: u64,
    workers: BTreeMap<String, u64>,
    per_target: BTreeMap<usize, u64>,
    failed_per_target: BTreeMap<usize, u64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One request's time per output token in ms: (E2E − TTFT) / (output
/// tokens − 1), for a streamed request with more than one output token.
pub fn tpot_ms(o: &Outcome) -> Option<f64> {
    let ttft = o.ttft?;
    let tokens = o.usage?.completion_tokens;
    (tokens > 1).then(|| ms(o.e2e.saturating_sub(ttft)) / (tokens - 1) as f64)
}

impl Stats {
    /// Adds one outcome.
    pub fn record(&mut self, o: &Outcome) {
        *self.per_target.entry(o.target).or_default() += 1;
        if let Some(kind) = o.error {
            *self.errors.entry(kind.to_string()).or_default() += 1;
            *self.failed_per_target.entry(o.target).or_default() += 1;
            return;
        }
        self.ok += 1;
        self.e2e_ms.push(ms(o.e2e));
        if let Some(t) = o.ttft {
            self.ttft_ms.push(ms(t));
        }
        if let Some(ms) = tpot_ms(o) {
            self.tpot_ms.push(ms);
        }
        match o.usage {
            Some(u) => {
                self.prompt_tokens += u.prompt_tokens;
                self.completion_tokens += u.completion_tokens;
                match u.cached_tokens {
                    Some(cached) => {
                        self.counted_prompt_tokens += u.prompt_tokens;
                        self.cached_tokens += cached;
                    }
                    None => self.without_cached += 1,
                }
            }
            None => self.without_usage += 1,
        }
        let name = o.worker.clone().unwrap_or_else(|| UNNAMED.into());
        *self.workers.entry(name).or_default() += 1;
    }

    /// Requests finished so far.
    pub fn finished(&self) -> u64 {
        self.ok + self.failed()
    }

    /// Requests failed so far.
    pub fn failed(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Σ cached / Σ prompt tokens so far, over the responses that reported
    /// a cached count (`None` before any did).
    pub fn hit_rate(&self) -> Option<f64> {
        (self.counted_prompt_tokens > 0)
            .then(|| self.cached_tokens as f64 / self.counted_prompt_tokens as f64)
    }

    /// The final report.
    pub fn report(&self, header: ReportHeader, elapsed: Duration) -> LoadReport {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let slots = self
            .workers
            .len()
            .max(header.urls.len())
            .max(header.pool_size.unwrap_or(0))
            .max(1);
        // Every unnamed response under one name would read as one worker
        // that took them all.
        let known = !self.workers.is_empty() && !self.workers.contains_key(UNNAMED);
        let spread = known.then(|| {
            let max = *self.workers.values().max().unwrap_or(&0) as f64;
            let mean = self.ok as f64 / slots as f64;
            max / mean
        });
        // Every --url, in order, those that got nothing included.
        let count = |m: &BTreeMap<usize, u64>| {
            (0..header.urls.len())
                .map(|t| m.get(&t).copied().unwrap_or(0))
                .collect()
        };
        let (per_url, failed_per_url) = (count(&self.per_target), count(&self.failed_per_target));
        LoadReport {
            header,
            elapsed_s: secs,
            sent: self.finished(),
            ok: self.ok,
            failed: self.failed(),
            errors: self.errors.clone(),
            hit_rate: self.hit_rate(),
            prompt_tokens: self.prompt_tokens,
            prompt_tokens_with_cached_count: self.counted_prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.completion_tokens,
            responses_without_usage: self.without_usage,
            responses_without_cached_count: self.without_cached,
            ttft_ms: Summary::of(self.ttft_ms.clone()),
            e2e_ms: Summary::of(self.e2e_ms.clone()),
            tpot_ms: Summary::of(self.tpot_ms.clone()),
            requests_per_s: self.ok as f64 / secs,
            output_tokens_per_s: self.completion_tokens as f64 / secs,
            prompt_tokens_per_s: self.prompt_tokens as f64 / secs,
            workers: self.workers.clone(),
            per_url,
            failed_per_url,
            spread,
        }
    }
}

/// What was run, repeated at the top of the report.
#[derive(Debug, Clone, Serialize)]
pub struct ReportHeader {
    /// Workload name.
    pub workload: String,
    /// API path.
    pub api: String,
    /// Streaming or not.
    pub stream: bool,
    /// Arrival process, in words.
    pub arrivals: String,
    /// Client-side assignment.
    pub assign: String,
    /// Target base URLs.
    pub urls: Vec<String>,
    /// Workload seed.
    pub seed: u64,
    /// Workers behind the URLs (`--pool-size`), when the caller knows.
    pub pool_size: Option<usize>,
}

/// The result of a load run (`--json` prints it as is).
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// What was run.
    pub header: ReportHeader,
    /// Wall time from the first request to the last response, seconds.
    pub elapsed_s: f64,
    /// Requests finished (ok + failed).
    pub sent: u64,
    /// Successful requests.
    pub ok: u64,
    /// Failed requests.
    pub failed: u64,
    /// Failures by kind.
    pub errors: BTreeMap<String, u64>,
    /// Σ cached / Σ prompt tokens over the responses that reported a
    /// cached count (`None` if none did).
    pub hit_rate: Option<f64>,
    /// Σ prompt tokens.
    pub prompt_tokens: u64,
    /// Σ prompt tokens of the responses that reported a cached count (the
    /// hit rate's denominator).
    pub prompt_tokens_with_cached_count: u64,
    /// Σ cached prompt tokens.
    pub cached_tokens: u64,
    /// Σ generated tokens.
    pub completion_tokens: u64,
    /// Successful responses that reported no usage.
    pub responses_without_usage: u64,
    /// Successful responses whose usage had no cached-token count (left
    /// out of the hit rate).
    pub responses_without_cached_count: u64,
    /// Time to the first content or reasoning chunk (streams only).
    pub ttft_ms: Option<Summary>,
    /// End-to-end latency.
    pub e2e_ms: Option<Summary>,
    /// Time per output token, the inter-token latency: (E2E − TTFT) /
    /// (output tokens − 1) per streamed request with more than one output
    /// token.
    pub tpot_ms: Option<Summary>,
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Generated tokens per second.
    pub output_tokens_per_s: f64,
    /// Prompt tokens per second.
    pub prompt_tokens_per_s: f64,
    /// Successful requests per serving worker.
    pub workers: BTreeMap<String, u64>,
    /// Requests (ok or not) per `--url`, in order.
    pub per_url: Vec<u64>,
    /// Failed requests per `--url`, in order.
    pub failed_per_url: Vec<u64>,
    /// Busiest worker's share over the mean share.
    pub spread: Option<f64>,
}

impl LoadReport {
    /// Failed requests over finished ones (`None` when none finished).
    pub fn error_rate(&self) -> Option<f64> {
        (self.sent > 0).then(|| self.failed as f64 / self.sent as f64)
    }

    /// An error when more requests failed than `max_error_rate` (a fraction)
    /// allows, or when none finished (nothing was measured).
    pub fn check_failures(&self, max_error_rate: f64) -> Result<(), SimError> {
        let Some(rate) = self.error_rate() else {
            return Err(SimError::NothingFinished);
        };
        if rate <= max_error_rate {
            return Ok(());
        }
        let errors: Vec<String> = self
            .errors
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        let only_connect = self.errors.keys().all(|k| k == "connect");
        // With several targets, the ones that failed every request they
        // got, by name (one down among others).
        let dead: Vec<&str> = self
            .header
            .urls
            .iter()
            .zip(self.per_url.iter().zip(&self.failed_per_url))
            .filter(|(_, (sent, failed))| **sent > 0 && failed == sent)
            .map(|(url, _)| url.as_str())
            .collect();
        let hint = if self.header.urls.len() > 1 && !dead.is_empty() {
            format!("; every request to {} failed", dead.join(", "))
        } else if only_connect {
            "; is a server listening at every --url?".into()
        } else {
            String::new()
        };
        Err(SimError::TooManyFailures {
            failed: self.failed,
            finished: self.sent,
            errors: format!("{:.1}%: {}", rate * 100.0, errors.join(", ")),
            hint,
            max_error_rate,
        })
    }

    /// A human-readable table.
    pub fn table(&self) -> String {
        let h = &self.header;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "workload {} | api {} | {} | {} | assign {} | seed {}",
            h.workload,
            h.api,
            if h.stream { "stream" } else { "no stream" },
            h.arrivals,
            h.assign,
            h.seed
        );
        if h.urls.len() > 1 {
            let list: Vec<String> = h
                .urls
                .iter()
                .zip(self.per_url.iter().zip(&self.failed_per_url))
                .map(|(u, (n, failed))| match failed {
                    0 => format!("{u} {n}"),
                    f => format!("{u} {n} ({f} failed)"),
                })
                .collect();
            let _ = writeln!(s, "targets  {}  (requests each)", list.join(", "));
        } else {
            let _ = writeln!(s, "targets  {}", h.urls.join(" "));
        }
        let _ = writeln!(
            s,
            "requests {} ok, {} failed in {:.2} s  ({:.1} req/s, {:.0} output tok/s, {:.0} prompt tok/s)",
            self.ok,
            self.failed,
            self.elapsed_s,
            self.requests_per_s,
            self.output_tokens_per_s,
            self.prompt_tokens_per_s
        );
        match self.hit_rate {
            Some(h) => {
                let mut without =
                    format!("{} responses without usage", self.responses_without_usage);
                if self.responses_without_cached_count > 0 {
                    let _ = write!(
                        without,
                        ", {} without a cached count",
                        self.responses_without_cached_count
                    );
                }
                let _ = writeln!(
                    s,
                    "hit rate {:.1}%  (cached {} of {} prompt tokens; {without})",
                    h * 100.0,
                    self.cached_tokens,
                    self.prompt_tokens_with_cached_count
                );
            }
            None if self.responses_without_cached_count > 0 => {
                let _ = writeln!(
                    s,
                    "hit rate n/a (no cached-token counts reported; SGLang needs \
                     --enable-cache-report, vLLM --enable-prompt-tokens-details)"
                );
            }
            None => {
                let _ = writeln!(s, "hit rate n/a (no usage reported)");
            }
        }
        let _ = writeln!(
            s,
            "latency ms       mean      p50      p90      p99      max"
        );
        for (name, sum) in [
            ("ttft", &self.ttft_ms),
            ("e2e", &self.e2e_ms),
            ("tpot", &self.tpot_ms),
        ] {
            match sum {
                Some(m) => {
                    let _ = writeln!(
                        s,
                        "  {name:<8} {:>9.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
                        m.mean, m.p50, m.p90, m.p99, m.max
                    );
                }
                None => {
                    let _ = writeln!(s, "  {name:<8} n/a");
                }
            }
        }
        if let Some(t) = &self.tpot_ms {
            let _ = writeln!(
                s,
                "  (tpot: time per output token = (e2e - ttft) / (output tokens - 1), over {} \
                 streamed requests with more than one token)",
                t.count
            );
        }
        if !self.errors.is_empty() {
            let list: Vec<String> = self
                .errors
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(s, "errors   {}", list.join(", "));
        }
        let list: Vec<String> = self
            .workers
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let spread = self
            .spread
            .map_or_else(|| "n/a".into(), |x| format!("{x:.2}"));
        let _ = writeln!(
            s,
            "workers  {}  (spread max/mean {spread})",
            list.join(", ")
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::body::Usage;
    use super::super::outcome::ErrorKind;
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 90.0), 90.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0], 50.0), 2.0);
        let s = Summary::of(vec![4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.mean, s.p50, s.p90, s.max), (2.5, 2.0, 4.0, 4.0));
        assert!(Summary::of(vec![]).is_none());
    }

    fn ok(worker: &str, prompt: u64, cached: u64, ms: u64) -> Outcome {
        Outcome {
            target: 0,
            worker: Some(worker.into()),
            ttft: Some(Duration::from_millis(ms / 2)),
            e2e: Duration::from_millis(ms),
            usage: Some(Usage {
                prompt_tokens: prompt,
                cached_tokens: Some(cached),
                completion_tokens: 10,
            }),
            reply: String::new(),
            error: None,
        }
    }

    /// Responses without a worker header (a real SGLang or vLLM engine
    /// sends none) were all counted under one name, and `--pool-size 4`
    /// then reported a spread of 4.00, as if one worker had taken every
    /// request.
    #[test]
    fn spread_is_unknown_when_a_response_names_no_worker() {
        let mut st = Stats::default();
        for _ in 0..4 {
            st.record(&Outcome {
                worker: None,
                ..ok("", 100, 0, 10)
            });
        }
        let header = ReportHeader {
            workload: "w".into(),
            api: "chat".into(),
            stream: true,
            arrivals: "x".into(),
            assign: "round-robin".into(),
            urls: vec!["u1".into()],
            seed: 0,
            pool_size: Some(4),
        };
        let r = st.report(header.clone(), Duration::from_secs(1));
        assert_eq!(r.spread, None);
        assert_eq!(r.workers["(unnamed)"], 4);
        assert!(r.table().contains("(spread max/mean n/a)"), "{}", r.table());
        // One named among them: still unknown.
        st.record(&ok("a", 100, 0, 10));
        assert_eq!(st.report(header, Duration::from_secs(1)).spread, None);
    }

    #[test]
    fn hit_rate_is_token_weighted_and_errors_and_spread_are_counted() {
        let mut st = Stats::default();
        st.record(&ok("a", 100, 0, 10));
        st.record(&ok("a", 100, 90, 20));
        st.record(&ok("b", 200, 200, 30));
        let mut bad = ok("b", 0, 0, 5);
        bad.error = Some(ErrorKind::Status(503));
        st.record(&bad);
        bad.error = Some(ErrorKind::StreamCut);
        st.record(&bad);
        let header = ReportHeader {
            workload: "w".into(),
            api: "chat".into(),
            stream: true,
            arrivals: "x".into(),
            assign: "round-robin".into(),
            urls: vec!["u1".into(), "u2".into(), "u3".into()],
            seed: 0,
            pool_size: None,
        };
        let r = st.report(header, Duration::from_secs(2));
        // (0 + 90 + 200) / 400, not the mean of per-request rates (0.6)
        assert!((r.hit_rate.unwrap() - 0.725).abs() < 1e-12);
        assert_eq!((r.ok, r.failed, r.sent), (3, 2, 5));
        assert_eq!(r.errors["http_503"], 1);
        assert_eq!(r.errors["stream_cut"], 1);
        assert_eq!(r.e2e_ms.unwrap().mean, 20.0);
        assert_eq!(r.requests_per_s, 1.5);
        assert_eq!(r.output_tokens_per_s, 15.0);
        // a: 2 of 3 ok requests over 3 targets (mean 1) -> 2.0
        assert_eq!(r.spread, Some(2.0));
        // One URL (a router) with six workers behind it: the mean is 0.5.
        let mut behind = r.header.clone();
        behind.urls.truncate(1);
        behind.pool_size = Some(6);
        assert_eq!(st.report(behind, Duration::from_secs(2)).spread, Some(4.0));
        assert!(r.table().contains("hit rate 72.5%"));
        // (ms - ms / 2) / (10 - 1) per request: 10, 20, 30 ms.
        let tpot = r.tpot_ms.unwrap();
        assert_eq!(tpot.count, 3);
        assert!((tpot.mean - 10.0 / 9.0).abs() < 1e-9, "{tpot:?}");
        assert!((tpot.p99 - 15.0 / 9.0).abs() < 1e-9, "{tpot:?}");
        assert!(r.table().contains("  tpot "), "{}", r.table());
        assert!(r.table().contains("(e2e - ttft) / (output tokens - 1)"));
        assert_eq!(r.per_url, [5, 0, 0], "targets that got nothing count");
        assert!(
            r.table()
                .contains("u1 5 (2 failed), u2 0, u3 0  (requests each)")
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["workers"]["a"], 2);
        assert_eq!(json["tpot_ms"]["count"], 3);
    }

    #[test]
    fn tpot_needs_a_stream_and_two_tokens() {
        let mut o = ok("a", 10, 0, 100);
        assert_eq!(tpot_ms(&o), Some(50.0 / 9.0));
        o.usage = Some(Usage {
            completion_tokens: 1,
            ..o.usage.unwrap()
        });
        assert_eq!(tpot_ms(&o), None, "one token has no gap");
        let mut whole = ok("a", 10, 0, 100);
        whole.ttft = None;
        assert_eq!(tpot_ms(&whole), None, "no TTFT without a stream");
        let mut bare = ok("a", 10, 0, 100);
        bare.usage = None;
        assert_eq!(tpot_ms(&bare), None, "no usage, no token count");
    }

    #[test]
    fn failures_above_the_allowed_rate_fail_the_run() {
        let header = ReportHeader {
            workload: "w".into(),
            api: "chat".into(),
            stream: true,
            arrivals: "x".into(),
            assign: "round-robin".into(),
            urls: vec!["u".into()],
            seed: 0,
            pool_size: None,
        };
        let mut st = Stats::default();
        let nothing = st.report(header.clone(), Duration::from_secs(1));
        assert!(matches!(
            nothing.check_failures(1.0),
            Err(SimError::NothingFinished)
        ));
        for _ in 0..3 {
            st.record(&ok("a", 100, 50, 10));
        }
        let mut refused = ok("a", 0, 0, 1);
        refused.error = Some(ErrorKind::Connect);
        st.record(&refused);
        let r = st.report(header.clone(), Duration::from_secs(1));
        assert_eq!(r.error_rate(), Some(0.25));
        r.check_failures(0.25).unwrap();
        r.check_failures(1.0).unwrap();
        let err = r.check_failures(0.0).unwrap_err().to_string();
        assert_eq!(
            err,
            "1 of 4 requests failed (25.0%: connect 1), more than --max-error-rate 0 allows; \
             is a server listening at every --url?"
        );
        let mut broken = ok("a", 0, 0, 1);
        broken.error = Some(ErrorKind::Status(500));
        st.record(&broken);
        let err = st
            .report(header, Duration::from_secs(1))
            .check_failures(0.1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("(40.0%: connect 1, http_500 1)"), "{err}");
        assert!(!err.contains("listening"), "{err}");
    }

    /// With several --url and one of them down (or answering 503), the
    /// report said only "connect 10" and asked whether a server listened
    /// at every --url: nothing said which target failed. Now each target's
    /// failures are listed beside its requests, and the error names the
    /// targets that failed every request.
    #[test]
    fn each_targets_failures_are_named() {
        let header = ReportHeader {
            workload: "w".into(),
            api: "chat".into(),
            stream: true,
            arrivals: "x".into(),
            assign: "round-robin".into(),
            urls: vec![
                "http://up".into(),
                "http://down".into(),
                "http://busy".into(),
            ],
            seed: 0,
            pool_size: None,
        };
        let mut st = Stats::default();
        for i in 0..9 {
            let mut o = ok("a", 100, 50, 10);
            o.target = i % 3;
            o.error = match o.target {
                1 => Some(ErrorKind::Connect),
                2 if i < 6 => Some(ErrorKind::Status(503)),
                _ => None,
            };
            st.record(&o);
        }
        let r = st.report(header, Duration::from_secs(1));
        assert_eq!(r.failed_per_url, [0, 3, 2]);
        let table = r.table();
        assert!(
            table.contains("http://up 3, http://down 3 (3 failed), http://busy 3 (2 failed)"),
            "{table}"
        );
        let err = r.check_failures(0.0).unwrap_err().to_string();
        assert!(
            err.ends_with("; every request to http://down failed"),
            "{err}"
        );
    }
}
