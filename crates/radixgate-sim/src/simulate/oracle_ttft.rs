//! `oracle_ttft`: a second all-knowing reference, which weighs what a
//! choice costs the requests already queued, not only the request itself.
//!
//! For each worker it [`forecast`]s the engine's true queue with the
//! request appended, replaying the engine's scheduler step by step (the step
//! under way, FIFO admission into free running slots, one decode token per
//! running request, prefill chunks in admission order, step times from the
//! engine's timing at its current speed, decodes that end and free their
//! slots), and picks the worker with the least
//!
//! ```text
//! own predicted TTFT + TTFT added to the requests already on that worker
//! ```
//!
//! What that sum contains, exactly: the added term is the request's first
//! prefill chunk times `token_us / speed`, once for every request whose
//! first token comes in the same step as that chunk — the only requests
//! whose first token a newcomer can delay, since prefill is served in
//! admission order. So it is small, and zero when the queue ahead fills its
//! steps exactly or the worker is idle.
//!
//! What it does not account for:
//! - latency to the last token: the requests already decoding get longer
//!   steps while the request prefills, and every step is longer while it
//!   decodes (their TTFT is already fixed, so this is not a TTFT cost);
//! - requests that have not arrived yet: the work it leaves on a worker
//!   delays later arrivals there, and the prefix it caches there may save
//!   them prefill — the effects that decide TTFT under load, and the reason
//!   a greedy router piles work on the holders of hot prefixes;
//! - the forecast's simplifications (see [`forecast`]): admission never
//!   waits for cache room, a waiting request's prefill is what was uncached
//!   when it arrived, and the request's own hit is what is cached now.
//!
//! It is a heuristic reference, not a bound: neither it nor the greedy
//! [`oracle`](super::oracle) is an optimal TTFT schedule, and a policy may
//! beat either. Its own-TTFT forecast is more exact than the greedy oracle's
//! closed formula (it follows decodes ending, slots freeing and requests
//! ahead turning into decoders, and it includes the step under way). Which
//! of the two does better depends on the load, so the report measures every
//! row against the better of them in each run (`ttft_mean_ratio`,
//! `ttft_p90_ratio`).
//!
//! Measured when it was added (release build, 6,000 requests, seed 1, the
//! loads of `docs/defaults.md` at 4 workers and shared-prefix / zipf also
//! at 8; mean TTFT ms, `oracle_ttft` vs `oracle`): lower in 5 of 8 cells —
//! zipf 17.4 vs 20.2 (4 workers) and 15.3 vs 19.1 (8), multi-turn 12.1 vs
//! 13.9, long-doc 94.6 vs 107.5, shared-prefix at 8 workers 41.7 vs 75.3 —
//! equal on mixed (12.8), and worse on shared-prefix at 4 workers (70.8 vs
//! 62.3) and agentic (15.1 vs 14.2). cache_aware beat both oracles on
//! shared-prefix at 4 and 8 workers (53.8 and 37.2 ms). On `simulate
//! --workers 4 --workload shared-prefix --groups 8 --zipf 2.0
//! --question-tokens 512 --rate 60 --requests 3000 --seed 1`: 11.3 vs
//! 12.3 ms mean, 39.5 vs 58.4 ms p99.
//!
//! Ties break as the greedy oracle's do: more cached tokens, fewer requests
//! in flight, then a rotating start.
//!
//! [`forecast`]: super::forecast

use std::time::Duration;

use super::forecast::forecast;
use super::oracle::{Score, least_cost};
use crate::engine::Engine;

/// The choice among `engines` (index) for a prompt of `tokens`, with
/// `busy_for[i]` the time left in engine i's step under way (zero when
/// idle), `in_flight[i]` the requests routed to engine i and not finished,
/// and `turn` a rotating counter for ties.
pub fn choose(
    engines: &[Engine],
    busy_for: &[Duration],
    in_flight: &[usize],
    tokens: &[u64],
    turn: usize,
) -> usize {
    let Some(first) = engines.first() else {
        return 0;
    };
    let hashes = first.cache().block_hashes(tokens);
    least_cost(engines.len(), in_flight, turn, |i| {
        let f = forecast(&engines[i], busy_for[i], &hashes, tokens.len());
        Score {
            cost_us: f.ttft_us + f.added_us,
            cached_tokens: f.cached_tokens,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, EngineRequest};

    fn engine() -> Engine {
        Engine::new(EngineConfig {
            kv_capacity_tokens: 100_000,
            ..EngineConfig::default()
        })
        .unwrap()
    }

    fn submit(e: &mut Engine, id: u64, prompt: std::ops::Range<u64>) {
        e.submit(
            EngineRequest {
                id,
                prompt: prompt.collect(),
                final_tokens: Vec::new(),
                max_new_tokens: 4,
            },
            Duration::ZERO,
        )
        .unwrap();
    }

    #[test]
    fn weighs_the_delay_it_causes_and_the_step_under_way() {
        // Default timing: 4.8 ms a step, 27 us a token, 8192 tokens a step.
        let prompt: Vec<u64> = (50_000..50_600).collect();
        // `a`: 7,500 tokens of prefill ahead in two requests; the request's
        // 600 fit in the same step: first token after 4.8 + 27 x 8100 us =
        // 223.5 ms, and both requests ahead wait 27 x 600 us = 16.2 ms more.
        let mut a = engine();
        submit(&mut a, 1, 0..4000);
        submit(&mut a, 2, 10_000..13_500);
        // `b`: one request that fills a step exactly; the new one runs in
        // the next step, with that request decoding: 226.0 + 21.3 ms =
        // 247.3 ms, and delays nobody.
        let mut b = engine();
        submit(&mut b, 1, 0..8192);
        let hashes = a.cache().block_hashes(&prompt);
        let fa = forecast(&a, Duration::ZERO, &hashes, prompt.len());
        let fb = forecast(&b, Duration::ZERO, &hashes, prompt.len());
        assert!((fa.ttft_us - 223_500.0).abs() < 1e-6, "{fa:?}");
        assert_eq!((fa.delayed, fa.added_us), (2, 32_400.0));
        assert!((fb.ttft_us - 247_330.527).abs() < 1e-3, "{fb:?}");
        assert_eq!((fb.delayed, fb.added_us), (0, 0.0));
        let engines = [a, b];
        // The greedy oracle takes `a` (its own TTFT is lower); this one
        // takes `b` (223.5 + 32.4 > 247.3).
        assert_eq!(
            super::super::oracle::choose(&engines, &[0, 0], &prompt, 0),
            0
        );
        let zero = [Duration::ZERO; 2];
        assert_eq!(choose(&engines, &zero, &[0, 0], &prompt, 0), 1);
        assert_eq!(choose(&engines, &zero, &[0, 0], &prompt, 1), 1);
        // The step under way counts: with 100 ms left on `b`, `a` wins.
        let busy = [Duration::ZERO, Duration::from_millis(100)];
        assert_eq!(choose(&engines, &busy, &[0, 0], &prompt, 0), 0);
    }

    #[test]
    fn prefers_the_cache_and_the_faster_worker_like_the_greedy_oracle() {
        let prompt: Vec<u64> = (0..2000).collect();
        let mut warm = engine();
        submit(&mut warm, 1, 0..2000);
        for _ in 0..10 {
            warm.step(Duration::ZERO);
        }
        assert!(warm.is_idle());
        let zero = [Duration::ZERO; 2];
        let engines = [engine(), warm];
        assert_eq!(choose(&engines, &zero, &[0, 0], &prompt, 0), 1);
        let mut slow = engine();
        slow.set_speed(0.5).unwrap();
        let engines = [slow, engine()];
        assert_eq!(choose(&engines, &zero, &[0, 0], &prompt, 0), 1);
        // Equal idle workers: the rotating start decides.
        let engines = [engine(), engine()];
        assert_eq!(choose(&engines, &zero, &[0, 0], &prompt, 0), 0);
        assert_eq!(choose(&engines, &zero, &[0, 0], &prompt, 1), 1);
    }
}
