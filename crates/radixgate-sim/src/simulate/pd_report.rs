//! What `radixgate simulate --pd P:D` reports, per arm:
//!
//! - hit rate: prompt tokens found in the prefill worker's cache / prompt
//!   tokens prefilled, on the prefill pool (a co-located arm: its pool);
//!   requests sent to decode alone are not prefills and are not counted;
//! - TTFT mean/p50/p99, simulated ms; in a PD arm, prefill queue + prefill
//!   + transfer + decode queue + first decode step;
//! - inter-token latency (ITL) mean/p99: every gap between two consecutive
//!   output tokens of a request, so one token held up by a long prefill in
//!   the same step shows in the p99;
//! - end-to-end latency mean/p99, and in PD the transfer (link wait + move);
//! - throughput: completed requests and output tokens per simulated second,
//!   up to the last completion;
//! - prompt tokens computed by every engine (what prefill skipping saves).

use serde::Serialize;

use super::cluster::RunStats;
use super::pd::PdArm;
use super::pd_cluster::PdStats;
use crate::load::Summary;
use radixgate_routing::PolicyConfig;

/// One arm's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArmReport {
    /// `co-located`, `pd` or `pd+skip`.
    pub arm: String,
    /// `4` (co-located) or `2P+2D`.
    pub workers: String,
    /// The prefill pool's policy (the co-located pool's).
    pub prefill_policy: String,
    /// The decode pool's policy (`None` co-located).
    pub decode_policy: Option<String>,
    /// Requests completed.
    pub completed: u64,
    /// Requests refused (too large for a worker).
    pub failed: u64,
    /// Requests that went to decode alone.
    pub skipped: u64,
    /// Token-weighted hit rate of the prefill pool (co-located: the pool).
    pub hit_rate: f64,
    /// Prompt tokens computed by every engine.
    pub computed_prompt_tokens: u64,
    /// Time to first token, ms.
    pub ttft_ms: Option<Summary>,
    /// Gaps between consecutive output tokens, ms.
    pub itl_ms: Option<Summary>,
    /// End-to-end latency, ms.
    pub e2e_ms: Option<Summary>,
    /// From a prefill's end to its KV on the decode worker, ms (PD only).
    pub transfer_ms: Option<Summary>,
    /// Completed requests per simulated second.
    pub throughput_rps: f64,
    /// Output tokens per simulated second.
    pub output_tokens_per_s: f64,
    /// Completed requests per worker (co-located), or per decode worker.
    pub per_worker: Vec<u64>,
    /// Prefills per prefill worker (PD only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub per_prefill_worker: Vec<u64>,
    /// Simulated seconds up to the last completion.
    pub simulated_secs: f64,
    /// Wall-clock seconds this arm took.
    pub wall_secs: f64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b > 0 { a as f64 / b as f64 } else { 0.0 }
}

fn per_sec(x: u64, secs: f64) -> f64 {
    if secs > 0.0 { x as f64 / secs } else { 0.0 }
}

impl ArmReport {
    /// The co-located pool's run.
    pub fn colocated(policy: &PolicyConfig, s: &RunStats, wall_secs: f64) -> Self {
        let secs = s.end.as_secs_f64();
        Self {
            arm: "co-located".into(),
            workers: s.per_worker.len().to_string(),
            prefill_policy: policy.name().into(),
            decode_policy: None,
            completed: s.completed,
            failed: s.failed,
            skipped: 0,
            hit_rate: ratio(s.cached_tokens, s.prompt_tokens),
            computed_prompt_tokens: s.prompt_tokens - s.cached_tokens,
            ttft_ms: Summary::of(s.ttft_ms.clone()),
            itl_ms: Summary::of(s.itl_ms.clone()),
            e2e_ms: Summary::of(s.e2e_ms.clone()),
            transfer_ms: None,
            throughput_rps: per_sec(s.completed, secs),
            output_tokens_per_s: per_sec(s.completion_tokens, secs),
            per_worker: s.per_worker.clone(),
            per_prefill_worker: Vec::new(),
            simulated_secs: secs,
            wall_secs,
        }
    }

    /// A PD arm's run.
    pub fn pd(name: &str, arm: &PdArm, s: &PdStats, wall_secs: f64) -> Self {
        let secs = s.end.as_secs_f64();
        Self {
            arm: name.into(),
            workers: format!("{}P+{}D", arm.prefill_workers, arm.decode_workers),
            prefill_policy: arm.prefill_policy.name().into(),
            decode_policy: Some(arm.decode_policy.name().into()),
            completed: s.completed,
            failed: s.failed,
            skipped: s.skipped,
            hit_rate: ratio(s.prefill_cached_tokens, s.prefill_prompt_tokens),
            computed_prompt_tokens: s.computed_prompt_tokens,
            ttft_ms: Summary::of(s.ttft_ms.clone()),
            itl_ms: Summary::of(s.itl_ms.clone()),
            e2e_ms: Summary::of(s.e2e_ms.clone()),
            transfer_ms: Summary::of(s.transfer_ms.clone()),
            throughput_rps: per_sec(s.completed, secs),
            output_tokens_per_s: per_sec(s.completion_tokens, secs),
            per_worker: s.per_decode.clone(),
            per_prefill_worker: s.per_prefill.clone(),
            simulated_secs: secs,
            wall_secs,
        }
    }
}

/// The whole `--pd` report.
#[derive(Debug, Clone, Serialize)]
pub struct PdReport {
    /// Workload name.
    pub workload: String,
    /// The arrival process, in words.
    pub arrivals: String,
    /// Seed.
    pub seed: u64,
    /// API whose routing text was used.
    pub api: String,
    /// Prefill workers of the PD arms.
    pub prefill_workers: usize,
    /// Decode workers of the PD arms.
    pub decode_workers: usize,
    /// KV transfer bandwidth, bytes per second.
    pub transfer_bandwidth: f64,
    /// KV bytes per prompt token.
    pub kv_bytes_per_token: u64,
    /// The skip-prefill arm's `--pd-skip-prefill-tokens`, when it ran.
    pub skip_prefill_tokens: Option<usize>,
    /// One row per arm.
    pub arms: Vec<ArmReport>,
}

impl PdReport {
    /// The report as a text table.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {}  arrivals {}  api {}  seed {}",
            self.workload, self.arrivals, self.api, self.seed
        );
        let _ = writeln!(
            out,
            "PD: {} prefill + {} decode workers against {} co-located; KV moves at {} B/s ({} GB/s), {} B per token",
            self.prefill_workers,
            self.decode_workers,
            self.prefill_workers + self.decode_workers,
            self.transfer_bandwidth,
            self.transfer_bandwidth / 1e9,
            self.kv_bytes_per_token
        );
        let _ = writeln!(
            out,
            "{:<10} {:>7}  {:<13} {:<13} {:>6}  {:>9} {:>9}  {:>8} {:>8}  {:>9} {:>9}  {:>8}  {:>7} {:>8}  {:>10} {:>7} {:>4}",
            "arm",
            "workers",
            "prefill",
            "decode",
            "hit%",
            "ttft_mean",
            "ttft_p99",
            "itl_mean",
            "itl_p99",
            "e2e_mean",
            "e2e_p99",
            "xfer",
            "req/s",
            "tok/s",
            "computed",
            "skipped",
            "fail",
        );
        let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"));
        let f2 = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
        for a in &self.arms {
            let _ = writeln!(
                out,
                "{:<10} {:>7}  {:<13} {:<13} {:>6.1}  {:>9} {:>9}  {:>8} {:>8}  {:>9} {:>9}  {:>8}  {:>7.2} {:>8.0}  {:>10} {:>7} {:>4}",
                a.arm,
                a.workers,
                a.prefill_policy,
                a.decode_policy.as_deref().unwrap_or("-"),
                a.hit_rate * 100.0,
                f(a.ttft_ms.map(|s| s.mean)),
                f(a.ttft_ms.map(|s| s.p99)),
                f2(a.itl_ms.map(|s| s.mean)),
                f2(a.itl_ms.map(|s| s.p99)),
                f(a.e2e_ms.map(|s| s.mean)),
                f(a.e2e_ms.map(|s| s.p99)),
                f(a.transfer_ms.map(|s| s.mean)),
                a.throughput_rps,
                a.output_tokens_per_s,
                a.computed_prompt_tokens,
                a.skipped,
                a.failed,
            );
        }
        let mut legend = vec![
            "hit%      prompt tokens found in the prefill worker's cache (co-located: the worker's), \
             token-weighted"
                .to_owned(),
            "ttft_*    time to first token, simulated ms; PD: prefill queue + prefill + transfer + \
             decode queue + first decode step"
                .into(),
            "itl_*     inter-token latency: every gap between consecutive output tokens of a \
             request, ms"
                .into(),
            "e2e_*     end to end, ms; xfer: mean ms from a prefill's end to its KV on the \
             decode worker (link wait + transfer)"
                .into(),
            "req/s     completed requests, tok/s output tokens, per simulated second".into(),
            "computed  prompt tokens computed by all workers (not found cached)".into(),
        ];
        if let Some(t) = self.skip_prefill_tokens {
            legend.push(format!(
                "pd+skip   a request whose decode worker holds all but at most {t} of its prompt \
                 tokens goes to decode alone (skipped)"
            ));
        }
        for line in legend {
            out.push_str(&line);
            out.push('\n');
        }
        let requests: u64 = self.arms.iter().map(|a| a.completed + a.failed).sum();
        let wall: f64 = self.arms.iter().map(|a| a.wall_secs).sum();
        let _ = writeln!(
            out,
            "{requests} requests simulated in all, in {wall:.2} s of wall time"
        );
        out
    }
}
