//! What `radixgate simulate` reports, per contender (and sweep point):
//!
//! - token hit rate = Σ cached prompt tokens / Σ prompt tokens over completed
//!   requests (as `radixgate load` computes it from the workers' usage), and
//!   its fraction of the oracle's hit rate in the same run (the greedy
//!   `oracle`'s, or `oracle_ttft`'s when only that one ran);
//! - TTFT mean/p50/p90/p99 and end-to-end mean/p99, simulated milliseconds;
//! - TTFT against the reference: the row's mean and p90 TTFT divided by
//!   those of the oracle row with the lowest mean TTFT in the same run
//!   (`oracle` or `oracle_ttft`; neither is a proven bound, so a ratio
//!   below 1 is possible and means the policy beat both references);
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
use super::{Contender, OracleKind};
use crate::load::Summary;

/// One row: a contender (and sweep point) and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyReport {
    /// `cache_aware`, `oracle`, …
    pub policy: String,
    /// The sweep point (`cache_threshold=0.5 …`), empty for defaults.
    pub params: String,
    /// Which oracle the row is (`None` for policies).
    pub oracle: Option<OracleKind>,
    /// Requests completed.
    pub completed: u64,
    /// Requests refused by the engines (too large for a worker).
    pub failed: u64,
    /// Answers whose reported cached tokens trimmed the policy's tree
    /// (`routing.correction`).
    pub trims: u64,
    /// Token-weighted hit rate.
    pub hit_rate: f64,
    /// `hit_rate` / the oracle's (when the oracle ran and hit anything).
    pub oracle_fraction: Option<f64>,
    /// Time to first token, ms (count, mean, p50, p90, p99, max).
    pub ttft_ms: Option<Summary>,
    /// Mean TTFT / the reference's mean TTFT (see [`SimReport::ttft_reference`]).
    pub ttft_mean_ratio: Option<f64>,
    /// p90 TTFT / the reference's p90 TTFT.
    pub ttft_p90_ratio: Option<f64>,
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
    /// Summarises one run of `who`.
    pub fn new(who: &Contender, params: String, s: &RunStats, wall_secs: f64) -> Self {
        let secs = s.end.as_secs_f64();
        let per_sec = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        let mean = s.completed as f64 / s.per_worker.len().max(1) as f64;
        let max = s.per_worker.iter().copied().max().unwrap_or(0) as f64;
        Self {
            policy: who.name().to_owned(),
            params,
            oracle: who.oracle_kind(),
            completed: s.completed,
            failed: s.failed,
            trims: s.trims,
            hit_rate: if s.prompt_tokens > 0 {
                s.cached_tokens as f64 / s.prompt_tokens as f64
            } else {
                0.0
            },
            oracle_fraction: None,
            ttft_ms: Summary::of(s.ttft_ms.clone()),
            ttft_mean_ratio: None,
            ttft_p90_ratio: None,
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

impl PolicyReport {
    /// The row's name: the policy, and the sweep point if any.
    pub fn label(&self) -> String {
        if self.params.is_empty() {
            self.policy.clone()
        } else {
            format!("{} {}", self.policy, self.params)
        }
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
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
    /// The policies' router replicas, in words, when they ran as several
    /// (one setting for the whole run; a sweep labels each row instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas: Option<String>,
    /// The oracle row the TTFT ratios are relative to: the one with the
    /// lowest mean TTFT (`None` when no oracle ran).
    pub ttft_reference: Option<String>,
    /// One row per contender and sweep point.
    pub rows: Vec<PolicyReport>,
}

impl SimReport {
    /// The row hit rates are relative to: the greedy oracle's, else the
    /// other oracle's.
    fn hit_reference(&self) -> Option<&PolicyReport> {
        self.rows
            .iter()
            .find(|r| r.oracle == Some(OracleKind::Greedy))
            .or_else(|| self.rows.iter().find(|r| r.oracle.is_some()))
    }

    /// Fills every row's fraction of the oracle's hit rate and its TTFT
    /// ratios to the better oracle.
    pub fn relate_to_oracles(&mut self) {
        let hit_reference = self.hit_reference().map(|r| r.hit_rate);
        if let Some(o) = hit_reference.filter(|&o| o > 0.0) {
            for r in &mut self.rows {
                r.oracle_fraction = Some(r.hit_rate / o);
            }
        }
        let reference = self
            .rows
            .iter()
            .filter(|r| r.oracle.is_some())
            .filter_map(|r| r.ttft_ms.map(|t| (r.policy.clone(), t)))
            .min_by(|a, b| a.1.mean.total_cmp(&b.1.mean));
        let Some((name, t)) = reference else {
            return;
        };
        let ratio = |x: f64, by: f64| (by > 0.0).then(|| x / by);
        for r in &mut self.rows {
            if let Some(s) = r.ttft_ms {
                r.ttft_mean_ratio = ratio(s.mean, t.mean);
                r.ttft_p90_ratio = ratio(s.p90, t.p90);
            }
        }
        self.ttft_reference = Some(name);
    }

    /// What each column of [`Self::table`] means, one line each.
    fn legend(&self) -> String {
        let mut lines = vec![
            "hit%      prompt tokens served from a worker's KV cache (token-weighted)".to_owned(),
        ];
        if let Some(o) = self.hit_reference() {
            lines.push(format!("/orcl     hit% / {}'s hit%", o.policy));
        }
        lines.push(
            "ttft_*    time to first token: mean, p50, p90, p99; e2e_*: end to end; \
             simulated ms"
                .into(),
        );
        if let Some(name) = &self.ttft_reference {
            lines.push(format!(
                "mean/r    TTFT mean / {name}'s, p90/r: TTFT p90 / {name}'s (the oracle with \
                 the lowest mean TTFT in this run)"
            ));
        }
        lines.extend([
            "req/s     requests completed per simulated second".to_owned(),
            "spread    the busiest worker's completed requests / the mean per worker (1.00 = \
             even)"
                .into(),
            "work      the same over the tokens each worker computed (uncached prompt + \
             generated)"
                .into(),
            "fail      requests the workers refused (too large for one)".into(),
        ]);
        let kinds: Vec<OracleKind> = self.rows.iter().filter_map(|r| r.oracle).collect();
        if kinds.contains(&OracleKind::Greedy) {
            lines.push(
                "oracle    sees every worker's true cache and queue and sends each request \
                 where its own TTFT is least: a greedy reference, not a bound"
                    .into(),
            );
        }
        if kinds.contains(&OracleKind::Ttft) {
            lines.push(
                "oracle_ttft  the same, also weighing the delay its choice adds to the \
                 requests queued there"
                    .into(),
            );
        }
        let mut out = String::new();
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
        out
    }

    /// "2000 requests per row", or the range when rows differ (a
    /// `--duration` run).
    fn requests_per_row(&self) -> String {
        let per_row = |r: &PolicyReport| r.completed + r.failed;
        let min = self.rows.iter().map(per_row).min().unwrap_or(0);
        let max = self.rows.iter().map(per_row).max().unwrap_or(0);
        let each = if self.rows.iter().any(|r| !r.params.is_empty()) {
            "per policy and sweep point"
        } else {
            "per policy"
        };
        if min == max {
            format!("{min} requests {each}")
        } else {
            format!("{min} to {max} requests {each}")
        }
    }

    /// A note when a policy beats an oracle (visibly, at the table's
    /// precision): the oracles are greedy heuristics, not bounds.
    fn beyond_the_oracle(&self) -> Option<String> {
        let policies = || self.rows.iter().filter(|r| r.oracle.is_none());
        let hit: Vec<String> = policies()
            .filter(|r| r.oracle_fraction.is_some_and(|f| f >= 1.0005))
            .map(PolicyReport::label)
            .collect();
        let ttft: Vec<String> = policies()
            .filter(|r| r.ttft_mean_ratio.is_some_and(|f| f < 0.995))
            .map(PolicyReport::label)
            .collect();
        if hit.is_empty() && ttft.is_empty() {
            return None;
        }
        let mut beats = Vec::new();
        if !hit.is_empty() {
            beats.push(format!(
                "{} cached more than the oracle (/orcl above 1)",
                and_list(&hit)
            ));
        }
        if let (false, Some(reference)) = (ttft.is_empty(), &self.ttft_reference) {
            beats.push(format!(
                "{} had a lower mean TTFT than {reference} (mean/r below 1)",
                and_list(&ttft)
            ));
        }
        Some(format!(
            "note: {}. The oracles are greedy references, not bounds: each request goes \
             where its own TTFT is least, without weighing what that does to the requests \
             after it (which worker keeps which prefix, who queues behind whom), so a \
             policy can do better.\n",
            beats.join("; ")
        ))
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
        if let Some(r) = &self.replicas {
            let _ = writeln!(out, "policies as {r}");
        }
        let width = self
            .rows
            .iter()
            .map(|r| r.policy.len() + r.params.len() + 1)
            .max()
            .unwrap_or(6)
            .max(6);
        let _ = writeln!(
            out,
            "{:<width$}  {:>6} {:>6}  {:>9} {:>9} {:>9} {:>9}  {:>6} {:>6}  {:>9} {:>9}  {:>8} {:>6} {:>6} {:>6}",
            "policy",
            "hit%",
            "/orcl",
            "ttft_mean",
            "ttft_p50",
            "ttft_p90",
            "ttft_p99",
            "mean/r",
            "p90/r",
            "e2e_mean",
            "e2e_p99",
            "req/s",
            "spread",
            "work",
            "fail",
        );
        let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        let ratio = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
        let mut requests = 0;
        let mut wall = 0.0;
        for r in &self.rows {
            let _ = writeln!(
                out,
                "{:<width$}  {:>6.1} {:>6}  {:>9} {:>9} {:>9} {:>9}  {:>6} {:>6}  {:>9} {:>9}  {:>8.1} {:>6.2} {:>6.2} {:>6}",
                r.label(),
                r.hit_rate * 100.0,
                r.oracle_fraction
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
                f(r.ttft_ms.map(|s| s.mean)),
                f(r.ttft_ms.map(|s| s.p50)),
                f(r.ttft_ms.map(|s| s.p90)),
                f(r.ttft_ms.map(|s| s.p99)),
                ratio(r.ttft_mean_ratio),
                ratio(r.ttft_p90_ratio),
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
        out.push_str(&self.legend());
        let _ = writeln!(
            out,
            "{}; {requests} requests simulated in all, in {wall:.2} s of wall time ({:.0} req/s)",
            self.requests_per_row(),
            if wall > 0.0 {
                requests as f64 / wall
            } else {
                0.0
            }
        );
        if let Some(note) = self.beyond_the_oracle() {
            out.push_str(&note);
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
            t.render(&r.label(), &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::args::contender;

    fn row(name: &str, hit: (u64, u64), ttft_ms: &[f64]) -> PolicyReport {
        let stats = RunStats {
            completed: ttft_ms.len() as u64,
            prompt_tokens: hit.1,
            cached_tokens: hit.0,
            ttft_ms: ttft_ms.to_vec(),
            e2e_ms: ttft_ms.to_vec(),
            per_worker: vec![ttft_ms.len() as u64],
            ..RunStats::default()
        };
        PolicyReport::new(&contender(name, 0).unwrap(), String::new(), &stats, 0.0)
    }

    fn report(rows: Vec<PolicyReport>) -> SimReport {
        let mut r = SimReport {
            workload: "w".into(),
            workers: 1,
            arrivals: "a".into(),
            seed: 0,
            api: "/v1/chat/completions".into(),
            replicas: None,
            ttft_reference: None,
            rows,
        };
        r.relate_to_oracles();
        r
    }

    // Ten samples: p90 is the 9th smallest.
    fn ms(base: f64) -> Vec<f64> {
        (1..=10).map(|i| base * i as f64).collect()
    }

    #[test]
    fn ttft_ratios_are_to_the_oracle_with_the_lower_mean() {
        let r = report(vec![
            row("cache_aware", (50, 100), &ms(3.0)),
            row("oracle", (80, 100), &ms(2.0)),
            row("oracle_ttft", (70, 100), &ms(1.5)),
        ]);
        assert_eq!(r.ttft_reference.as_deref(), Some("oracle_ttft"));
        let ca = &r.rows[0];
        assert!((ca.ttft_mean_ratio.unwrap() - 2.0).abs() < 1e-12);
        assert!((ca.ttft_p90_ratio.unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(ca.ttft_ms.unwrap().p90, 27.0);
        assert_eq!(r.rows[2].ttft_mean_ratio, Some(1.0));
        // The hit rate stays relative to the greedy oracle's.
        assert!((ca.oracle_fraction.unwrap() - 0.625).abs() < 1e-12);
        assert_eq!(r.rows[1].oracle, Some(OracleKind::Greedy));
        assert_eq!(ca.oracle, None);
        let text = r.table();
        assert!(
            text.contains("ttft_p90") && text.contains("mean/r"),
            "{text}"
        );
        assert!(text.contains("/ oracle_ttft's"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ttft_reference"], "oracle_ttft");
        assert_eq!(json["rows"][0]["ttft_ms"]["p90"], 27.0);
        assert_eq!(json["rows"][1]["oracle"], "greedy");

        // The greedy one better: it is the reference.
        let r = report(vec![
            row("round_robin", (10, 100), &ms(4.0)),
            row("oracle", (80, 100), &ms(1.0)),
            row("oracle_ttft", (70, 100), &ms(2.0)),
        ]);
        assert_eq!(r.ttft_reference.as_deref(), Some("oracle"));
        assert_eq!(r.rows[2].ttft_mean_ratio, Some(2.0));
        // Only one oracle ran: it is the reference for both.
        let r = report(vec![
            row("round_robin", (10, 100), &ms(4.0)),
            row("oracle_ttft", (20, 100), &ms(2.0)),
        ]);
        assert_eq!(r.rows[0].ttft_mean_ratio, Some(2.0));
        assert_eq!(r.rows[0].oracle_fraction, Some(0.5));
        // No oracle: no ratios, and the table says nothing about them.
        let r = report(vec![row("round_robin", (10, 100), &ms(4.0))]);
        assert_eq!(r.ttft_reference, None);
        assert_eq!(r.rows[0].ttft_mean_ratio, None);
        assert!(!r.table().contains("mean/r    "));
    }

    #[test]
    fn the_table_explains_its_columns_and_a_policy_beating_the_oracle() {
        // cache_aware caches more than the greedy oracle and is quicker.
        let r = report(vec![
            row("cache_aware", (96, 100), &ms(1.0)),
            row("round_robin", (50, 100), &ms(4.0)),
            row("oracle", (95, 100), &ms(2.0)),
        ]);
        let text = r.table();
        for legend in [
            "\n/orcl     hit% / oracle's hit%\n",
            "\nwork      the same over the tokens each worker computed",
            "\nspread    the busiest worker's",
            "\nmean/r    TTFT mean / oracle's",
            "\noracle    sees every worker's true cache",
            "\n10 requests per policy; 30 requests simulated in all",
            "\nnote: cache_aware cached more than the oracle (/orcl above 1); cache_aware \
             had a lower mean TTFT than oracle (mean/r below 1). The oracles are greedy \
             references, not bounds",
        ] {
            assert!(text.contains(legend), "`{legend}` not in:\n{text}");
        }
        assert!(!text.contains("oracle_ttft"), "{text}");
        // No policy above the oracle: no note.
        let r = report(vec![
            row("round_robin", (50, 100), &ms(4.0)),
            row("oracle", (95, 100), &ms(2.0)),
        ]);
        assert!(!r.table().contains("note:"), "{}", r.table());
        // No oracle: no ratio columns explained, no note.
        let mut short = row("round_robin", (50, 100), &ms(4.0));
        short.completed = 7;
        short.params = "cache_threshold=0.1".into();
        let r = report(vec![short, row("round_robin", (50, 100), &ms(4.0))]);
        let text = r.table();
        assert!(
            !text.contains("/orcl     ") && !text.contains("note:"),
            "{text}"
        );
        assert!(
            text.contains("\n7 to 10 requests per policy and sweep point;"),
            "{text}"
        );
    }
}
