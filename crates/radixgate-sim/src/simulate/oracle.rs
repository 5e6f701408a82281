//! The oracle: a reference policy only a simulator can have.
//!
//! It reads every engine's true state — the blocks of this prompt each one
//! holds in its KV cache ([`Engine::cache`]), the prefill work queued there
//! ([`Engine::load`]) and its running batch ([`Engine::running_state`]) — and picks the worker with the smallest
//! predicted time to first token under the engine's own timing model:
//!
//! ```text
//! step   = step_base_us + running(w) * token_us + kv_read * decode context(w)
//! wait   = steps until a running slot frees, if all max_running_requests
//!          are taken: the k-th smallest remaining output of the running
//!          requests, k = running + waiting + 1 - max_running_requests
//! work   = pending_prefill_tokens(w) + uncached prompt tokens on w
//! room   = max_batch_tokens - running(w)        (decodes take one each)
//! ttft   = ((wait + ceil(work / room)) * step + work * token_us) / speed(w)
//! ```
//!
//! `speed(w)` is the worker's current `timing.speed` (a slow worker's steps
//! take longer by the same factor, as in the engine).
//!
//! Ties: more cached tokens, then fewer requests in flight, then a rotating
//! start so equal workers share misses. It is greedy (it does not plan for
//! later requests), so it bounds what a router with perfect knowledge of
//! the present can do, not every policy in every case; at light load it
//! maximises the hit of each request.

use crate::engine::Engine;

/// What the oracle predicts for one worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Predicted time to first token, microseconds.
    pub ttft_us: f64,
    /// Prompt tokens the worker would serve from cache.
    pub cached_tokens: usize,
}

/// The prediction for a prompt whose block hashes are `hashes` and length
/// `prompt_len` on `engine`.
pub fn predict(engine: &Engine, hashes: &[u64], prompt_len: usize) -> Prediction {
    let cfg = engine.config();
    let bs = cfg.block_size;
    // The engine never serves the last prompt token from cache.
    let max_hit = prompt_len.saturating_sub(1) / bs;
    let cached = engine.cache().match_blocks(hashes).min(max_hit) * bs;
    let load = engine.load();
    let (context, remaining) = engine.running_state();
    let t = &cfg.timing;
    let running = load.running.min(cfg.max_batch_tokens - 1);
    // One step of the current batch, before this request's prefill tokens.
    let step_us = t.step_base_us
        + t.token_us * running as f64
        + t.kv_read_ns_per_token * context as f64 / 1000.0;
    // Admission: with every running slot taken (and `waiting` ahead), the
    // request waits until that many running requests have finished.
    let wait_steps = match (load.running + load.waiting + 1).checked_sub(cfg.max_running_requests) {
        Some(k) if k > 0 && !remaining.is_empty() => {
            let (rounds, idx) = ((k - 1) / remaining.len(), (k - 1) % remaining.len());
            rounds * remaining[remaining.len() - 1] + remaining[idx]
        }
        _ => 0,
    };
    let work = load.pending_prefill_tokens + (prompt_len - cached);
    let room = cfg.max_batch_tokens - running;
    let steps = work.div_ceil(room).max(1);
    let ttft_us = t.scaled_us((wait_steps + steps) as f64 * step_us + work as f64 * t.token_us);
    Prediction {
        ttft_us,
        cached_tokens: cached,
    }
}

/// The oracle's choice among `engines` (index), with `in_flight[i]` the
/// requests routed to engine i and not finished, and `turn` a rotating
/// counter for ties.
pub fn choose(engines: &[Engine], in_flight: &[usize], tokens: &[u64], turn: usize) -> usize {
    let hashes = engines[0].cache().block_hashes(tokens);
    least_cost(engines.len(), in_flight, turn, |i| {
        let p = predict(&engines[i], &hashes, tokens.len());
        Score {
            cost_us: p.ttft_us,
            cached_tokens: p.cached_tokens,
        }
    })
}

/// How an oracle rates one worker for a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Score {
    /// What the oracle minimises, microseconds.
    pub(super) cost_us: f64,
    /// Prompt tokens the worker would serve from cache (breaks ties).
    pub(super) cached_tokens: usize,
}

/// The index in `0..n` (n > 0) of least `score(i).cost_us`; ties go to
/// more cached tokens, then fewer requests in flight, then the first from a
/// start that rotates with `turn` (so equal workers share misses). Shared
/// by the oracles.
pub(super) fn least_cost(
    n: usize,
    in_flight: &[usize],
    turn: usize,
    mut score: impl FnMut(usize) -> Score,
) -> usize {
    let mut best: Option<(usize, Score)> = None;
    for k in 0..n {
        let i = (turn + k) % n;
        let s = score(i);
        let better = match best {
            None => true,
            Some((b, bs)) => {
                s.cost_us < bs.cost_us
                    || (s.cost_us == bs.cost_us
                        && (s.cached_tokens > bs.cached_tokens
                            || (s.cached_tokens == bs.cached_tokens
                                && in_flight[i] < in_flight[b])))
            }
        };
        if better {
            best = Some((i, s));
        }
    }
    best.map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, EngineRequest};
    use std::time::Duration;

    fn engine() -> Engine {
        Engine::new(EngineConfig {
            kv_capacity_tokens: 4096,
            ..EngineConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn prefers_the_cached_worker_until_its_queue_costs_more() {
        let prompt: Vec<u64> = (0..1000).collect();
        let mut a = engine();
        let b = engine();
        // Warm `a` with the prompt.
        a.submit(
            EngineRequest {
                id: 1,
                prompt: prompt.clone(),
                final_tokens: Vec::new(),
                max_new_tokens: 1,
            },
            Duration::ZERO,
        )
        .unwrap();
        while !a.is_idle() {
            a.step(Duration::ZERO);
        }
        let engines = vec![a, b];
        assert_eq!(choose(&engines, &[0, 0], &prompt, 1), 0);
        let p = predict(&engines[0], &engines[0].cache().block_hashes(&prompt), 1000);
        assert_eq!(p.cached_tokens, 992);
        // A long queue on `a` sends the request to `b`.
        let [mut a, b] = <[Engine; 2]>::try_from(engines).unwrap();
        a.submit(
            EngineRequest {
                id: 2,
                prompt: (5000..7000).collect(),
                final_tokens: Vec::new(),
                max_new_tokens: 1,
            },
            Duration::ZERO,
        )
        .unwrap();
        let engines = vec![a, b];
        assert_eq!(choose(&engines, &[1, 0], &prompt, 0), 1);
        // Equal idle workers: the rotating start decides.
        let fresh = vec![engine(), engine()];
        assert_eq!(choose(&fresh, &[0, 0], &prompt, 0), 0);
        assert_eq!(choose(&fresh, &[0, 0], &prompt, 1), 1);
    }

    #[test]
    fn a_slower_worker_is_predicted_slower_by_its_factor() {
        let prompt: Vec<u64> = (0..1000).collect();
        let mut slow = engine();
        slow.set_speed(0.5).unwrap();
        let hashes = slow.cache().block_hashes(&prompt);
        let full = predict(&engine(), &hashes, prompt.len()).ttft_us;
        let half = predict(&slow, &hashes, prompt.len()).ttft_us;
        assert!((half - 2.0 * full).abs() < 1e-6, "{half} vs 2 x {full}");
        // Equal caches and queues: the fast worker wins from either start.
        let engines = vec![slow, engine()];
        assert_eq!(choose(&engines, &[0, 0], &prompt, 0), 1);
        assert_eq!(choose(&engines, &[0, 0], &prompt, 1), 1);
    }
}
