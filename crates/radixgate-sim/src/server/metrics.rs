//! Per-worker counters and the Prometheus text of `/metrics`.
//!
//! Request-level counters are atomics bumped by handlers (lock-free: many
//! handlers, no ordering needs between counters, so `Relaxed`). Engine-level
//! numbers (queue, KV use, prefix hits) come from the engine task's latest
//! snapshot. Metric names: our own `radixgate_sim_*`, plus the few SGLang
//! and vLLM gauge names that routers and dashboards commonly read.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::driver::EngineStats;
use super::kv_events::KvEventsCounters;
use super::response::Reply;
use crate::error::SimError;

/// Request counters of one worker.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    /// Generation requests received.
    pub(crate) requests: AtomicU64,
    /// Generation requests completed.
    pub(crate) completed: AtomicU64,
    /// Answered 400/413.
    pub(crate) client_errors: AtomicU64,
    /// Failed by an injected fault.
    pub(crate) injected_errors: AtomicU64,
    /// Other server-side failures.
    pub(crate) server_errors: AtomicU64,
    /// Prompt tokens of completed requests.
    pub(crate) prompt_tokens: AtomicU64,
    /// Cached prompt tokens of completed requests (prefix hits).
    pub(crate) cached_tokens: AtomicU64,
    /// Output tokens of completed requests.
    pub(crate) completion_tokens: AtomicU64,
    /// Requests whose client went away before they reached the engine
    /// (a decode request waiting for its KV); the engine counts the rest.
    pub(crate) cancelled_outside_engine: AtomicU64,
    /// Decode: requests waiting for their KV now (a gauge).
    pub(crate) kv_transfers_waiting: AtomicU64,
    /// Decode: KV transfers completed.
    pub(crate) kv_transfers: AtomicU64,
    /// Decode: KV transfers that failed or timed out.
    pub(crate) kv_transfer_errors: AtomicU64,
    /// Decode: prompt tokens of KV moved in.
    pub(crate) kv_transfer_tokens: AtomicU64,
    /// Decode: simulated transfer time, microseconds.
    pub(crate) kv_transfer_micros: AtomicU64,
    /// Prefill: pulls answered with KV.
    pub(crate) kv_pulls_served: AtomicU64,
    /// Prefill: KV never marked ready (the `drop_transfers` fault).
    pub(crate) kv_transfers_dropped: AtomicU64,
}

impl Metrics {
    /// Adds `n` to one counter.
    pub(crate) fn count(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn count_error(&self, e: &SimError) {
        let c = match e {
            SimError::BadRequest { .. }
            | SimError::PayloadTooLarge { .. }
            | SimError::NotFound(_)
            | SimError::ModelNotFound { .. }
            | SimError::ResponseNotFound { .. } => &self.client_errors,
            SimError::InjectedFault(_) | SimError::Unavailable(_) => &self.injected_errors,
            _ => &self.server_errors,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_done(&self, r: &Reply) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(r.prompt_tokens as u64, Ordering::Relaxed);
        self.cached_tokens
            .fetch_add(r.cached_tokens as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(r.completion_tokens as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_instant(&self, r: &Reply) {
        self.record_done(r);
    }

    /// The Prometheus exposition text.
    pub(crate) fn render(&self, worker: &str, model: &str, stats: &EngineStats) -> String {
        let l = &stats.load;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let usage = if l.kv_capacity_tokens == 0 {
            0.0
        } else {
            l.kv_used_tokens as f64 / l.kv_capacity_tokens as f64
        };
        let prompt = get(&self.prompt_tokens);
        let cached = get(&self.cached_tokens);
        let hit_rate = if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        };
        let labels = format!("worker=\"{worker}\",model_name=\"{model}\"");
        let mut out = String::with_capacity(2048);
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
            );
        };
        metric(
            "radixgate_sim_running_requests",
            "gauge",
            "Requests in the running batch.",
            l.running as f64,
        );
        metric(
            "radixgate_sim_waiting_requests",
            "gauge",
            "Requests in the waiting queue.",
            l.waiting as f64,
        );
        metric(
            "radixgate_sim_pending_prefill_tokens",
            "gauge",
            "Prompt tokens not yet computed (waiting and running).",
            l.pending_prefill_tokens as f64,
        );
        metric(
            "radixgate_sim_kv_used_tokens",
            "gauge",
            "KV tokens in use.",
            l.kv_used_tokens as f64,
        );
        metric(
            "radixgate_sim_kv_cached_tokens",
            "gauge",
            "KV tokens of reusable prefix cache.",
            l.kv_cached_tokens as f64,
        );
        metric(
            "radixgate_sim_kv_capacity_tokens",
            "gauge",
            "KV capacity in tokens.",
            l.kv_capacity_tokens as f64,
        );
        metric(
            "radixgate_sim_kv_usage_ratio",
            "gauge",
            "KV tokens in use over capacity.",
            usage,
        );
        metric(
            "radixgate_sim_requests_total",
            "counter",
            "Generation requests received.",
            get(&self.requests) as f64,
        );
        metric(
            "radixgate_sim_requests_completed_total",
            "counter",
            "Generation requests completed.",
            get(&self.completed) as f64,
        );
        metric(
            "radixgate_sim_client_errors_total",
            "counter",
            "Requests answered 400 or 413.",
            get(&self.client_errors) as f64,
        );
        metric(
            "radixgate_sim_injected_errors_total",
            "counter",
            "Requests failed by a fault knob.",
            get(&self.injected_errors) as f64,
        );
        metric(
            "radixgate_sim_server_errors_total",
            "counter",
            "Other failed requests.",
            get(&self.server_errors) as f64,
        );
        metric(
            "radixgate_sim_prompt_tokens_total",
            "counter",
            "Prompt tokens of completed requests.",
            prompt as f64,
        );
        metric(
            "radixgate_sim_cached_tokens_total",
            "counter",
            "Prompt tokens found in the prefix cache (completed requests).",
            cached as f64,
        );
        metric(
            "radixgate_sim_generation_tokens_total",
            "counter",
            "Output tokens of completed requests.",
            get(&self.completion_tokens) as f64,
        );
        metric(
            "radixgate_sim_cancelled_total",
            "counter",
            "Requests cancelled by their client (in the engine, or waiting for their KV).",
            (stats.counters.cancelled + get(&self.cancelled_outside_engine)) as f64,
        );
        metric(
            "radixgate_sim_kv_transfers_waiting",
            "gauge",
            "Decode: requests waiting for their prompt's KV.",
            get(&self.kv_transfers_waiting) as f64,
        );
        metric(
            "radixgate_sim_kv_transfers_total",
            "counter",
            "Decode: prompt KV transfers pulled from prefill workers.",
            get(&self.kv_transfers) as f64,
        );
        metric(
            "radixgate_sim_kv_transfer_errors_total",
            "counter",
            "Decode: KV pulls that failed or timed out.",
            get(&self.kv_transfer_errors) as f64,
        );
        metric(
            "radixgate_sim_kv_transfer_tokens_total",
            "counter",
            "Decode: prompt tokens of KV moved in.",
            get(&self.kv_transfer_tokens) as f64,
        );
        metric(
            "radixgate_sim_kv_transfer_seconds_total",
            "counter",
            "Decode: simulated KV transfer time.",
            get(&self.kv_transfer_micros) as f64 / 1e6,
        );
        metric(
            "radixgate_sim_kv_pulls_served_total",
            "counter",
            "Prefill: KV pulls answered.",
            get(&self.kv_pulls_served) as f64,
        );
        metric(
            "radixgate_sim_kv_transfers_dropped_total",
            "counter",
            "Prefill: KV never marked ready (drop_transfers fault).",
            get(&self.kv_transfers_dropped) as f64,
        );
        metric(
            "radixgate_sim_busy_seconds_total",
            "counter",
            "Simulated compute time.",
            stats.counters.busy.as_secs_f64(),
        );
        // Names SGLang and vLLM servers export, for routers and dashboards.
        metric(
            "sglang:num_running_reqs",
            "gauge",
            "Running requests (SGLang name).",
            l.running as f64,
        );
        metric(
            "sglang:num_queue_reqs",
            "gauge",
            "Waiting requests (SGLang name).",
            l.waiting as f64,
        );
        metric(
            "sglang:token_usage",
            "gauge",
            "KV usage ratio (SGLang name).",
            usage,
        );
        metric(
            "sglang:cache_hit_rate",
            "gauge",
            "Prefix cache hit rate (SGLang name).",
            hit_rate,
        );
        metric(
            "vllm:num_requests_running",
            "gauge",
            "Running requests (vLLM name).",
            l.running as f64,
        );
        metric(
            "vllm:num_requests_waiting",
            "gauge",
            "Waiting requests (vLLM name).",
            l.waiting as f64,
        );
        metric(
            "vllm:gpu_cache_usage_perc",
            "gauge",
            "KV usage ratio (vLLM name).",
            usage,
        );
        out
    }
}

/// The KV-event publisher's counters as Prometheus text.
pub(crate) fn kv_events_text(worker: &str, model: &str, c: &KvEventsCounters) -> String {
    let labels = format!("worker=\"{worker}\",model_name=\"{model}\"");
    let mut out = String::with_capacity(1024);
    for (name, help, v) in [
        (
            "published",
            "KV-event batches sent to subscribers.",
            c.published,
        ),
        (
            "dropped_overflow",
            "KV-event batches dropped on a full publisher queue (each a sequence gap).",
            c.dropped_overflow,
        ),
        (
            "dropped_stopped",
            "KV-event batches lost while the publisher was stopped (fault).",
            c.dropped_stopped,
        ),
        (
            "withheld",
            "KV-event batches withheld from subscribers by the drop fault.",
            c.withheld,
        ),
        ("replays", "KV-event replay requests answered.", c.replays),
    ] {
        let name = format!("radixgate_sim_kv_events_{name}_total");
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {v}"
        );
    }
    out
}
