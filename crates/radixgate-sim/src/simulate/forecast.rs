//! A step-by-step forecast of one engine's queue with one more request
//! appended: when that request's first token would come, and how much
//! later it would make the first tokens of the requests already there.
//!
//! The forecast replays the engine's own scheduler (see
//! [`engine`](crate::engine)) on the engine's true state, step by step,
//! with no further arrivals:
//! - the step under way (if any) ends first, after `busy_for`;
//! - each step admits waiting requests in arrival order while a running
//!   slot is free; gives one token of budget to every decoding request and
//!   the rest to prefill chunks in admission order; lasts the engine's step
//!   time for that work at its current speed;
//! - a request whose prefill completes has its first token at the end of
//!   that step and decodes from the next step on (its context growing by
//!   one token a step) until its output is complete, when its slot frees.
//!
//! Because prefill chunks go out in admission order, the new request's
//! prefill starts only once every request ahead of it has had all the
//! prefill budget it needs: the only requests whose first token it can
//! delay are those whose prefill completes in the step where its own first
//! chunk runs (that step is longer by the chunk). Requests already decoding
//! had their first token; the new request lengthens their steps (their
//! latency to the last token), which is not a TTFT.
//!
//! Simplifications, each documented where it acts: a waiting request's
//! prefill work is what was uncached when it arrived (more may be cached by
//! the time it is admitted); admission is assumed never to be blocked by the
//! KV cache (the engine's head-of-line wait for cache room is not modelled);
//! and the new request's cache hit is what is cached now (a request ahead
//! with the same prefix that completes its prefill first would let the
//! engine find more).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use crate::engine::Engine;

/// The most steps a forecast plays before it gives up and returns the time
/// so far (a lower bound; far beyond any queue the simulator builds).
const MAX_STEPS: u64 = 200_000;

/// What the forecast found for the new request on one engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// Predicted time from now to its first token, microseconds.
    pub ttft_us: f64,
    /// Prompt tokens it would find cached.
    pub cached_tokens: usize,
    /// Requests already on the engine whose first token it would delay.
    pub delayed: usize,
    /// The total delay to their first tokens, microseconds.
    pub added_us: f64,
}

/// A request that has prefill to do, in the order chunks are given out.
#[derive(Debug, Clone, Copy)]
struct Prefill {
    left: usize,
    prompt_tokens: usize,
    max_new_tokens: usize,
    /// The request being forecast.
    new: bool,
}

/// Requests decoding: how many, the sum of their contexts in the current
/// step, and when each leaves.
#[derive(Debug, Default)]
struct Decoders {
    count: usize,
    context: usize,
    /// `(last step it decodes in, its context after that step)`, earliest
    /// first.
    leaving: BinaryHeap<Reverse<(u64, usize)>>,
}

impl Decoders {
    /// A request that decodes `remaining` more tokens from step `first` on,
    /// with `context` tokens of context in that step.
    fn add(&mut self, first: u64, context: usize, remaining: usize) {
        if remaining == 0 {
            return;
        }
        self.count += 1;
        self.context += context;
        let last = first + remaining as u64 - 1;
        self.leaving.push(Reverse((last, context + remaining)));
    }

    /// After step `step`: every context grows by one; those done leave.
    /// Returns how many left.
    fn advance(&mut self, step: u64) -> usize {
        self.context += self.count;
        let mut left = 0;
        while let Some(&Reverse((last, context))) = self.leaving.peek() {
            if last > step {
                break;
            }
            self.leaving.pop();
            self.count -= 1;
            self.context -= context;
            left += 1;
        }
        left
    }
}

/// Forecasts a prompt (block hashes `hashes`, `prompt_len` tokens) appended
/// to `engine`'s queue now, with the step under way (if any) ending after
/// `busy_for`.
pub fn forecast(
    engine: &Engine,
    busy_for: Duration,
    hashes: &[u64],
    prompt_len: usize,
) -> Forecast {
    let cfg = engine.config();
    let t = &cfg.timing;
    let bs = cfg.block_size;
    // The engine never serves the last prompt token from cache.
    let max_hit = prompt_len.saturating_sub(1) / bs;
    let cached = engine.cache().match_blocks(hashes).min(max_hit) * bs;

    let mut decoders = Decoders::default();
    let mut prefilling = VecDeque::new();
    let mut running = 0;
    for r in engine.running_view() {
        running += 1;
        if r.prefill_left == 0 {
            let context = r.prompt_tokens + r.generated;
            decoders.add(0, context, r.max_new_tokens.saturating_sub(r.generated));
        } else {
            prefilling.push_back(Prefill {
                left: r.prefill_left,
                prompt_tokens: r.prompt_tokens,
                max_new_tokens: r.max_new_tokens,
                new: false,
            });
        }
    }
    let mut waiting: VecDeque<Prefill> = engine
        .waiting_view()
        .map(|w| Prefill {
            // At least the last prompt token is always computed.
            left: w.uncached_tokens.max(1),
            prompt_tokens: w.prompt_tokens,
            max_new_tokens: w.max_new_tokens,
            new: false,
        })
        .collect();
    waiting.push_back(Prefill {
        left: (prompt_len - cached).max(1),
        prompt_tokens: prompt_len,
        max_new_tokens: 1,
        new: true,
    });

    let mut now_us = busy_for.as_secs_f64() * 1e6;
    let mut first_chunk_step = None;
    let mut out = Forecast {
        ttft_us: now_us,
        cached_tokens: cached,
        delayed: 0,
        added_us: 0.0,
    };
    for step in 0..MAX_STEPS {
        while running < cfg.max_running_requests {
            let Some(w) = waiting.pop_front() else { break };
            prefilling.push_back(w);
            running += 1;
        }
        let mut budget = cfg.max_batch_tokens.saturating_sub(decoders.count);
        let mut prefill_tokens = 0;
        let mut new_chunk = 0;
        for p in prefilling.iter_mut() {
            if budget == 0 {
                break;
            }
            let chunk = p.left.min(budget);
            p.left -= chunk;
            budget -= chunk;
            prefill_tokens += chunk;
            if p.new {
                new_chunk = chunk;
            }
        }
        if prefill_tokens == 0 && decoders.count == 0 {
            // Nothing can run (not reachable with a valid engine: a free
            // slot admits the head, a full batch has work).
            break;
        }
        let us = t.step_base_us
            + t.token_us * (prefill_tokens + decoders.count) as f64
            + t.kv_read_ns_per_token * decoders.context as f64 / 1000.0;
        now_us += t.scaled_us(us);
        if new_chunk > 0 && first_chunk_step.is_none() {
            first_chunk_step = Some(step);
        }
        let left = decoders.advance(step);
        running -= left;
        // Prefill completes for a prefix of the queue (chunks go in order).
        let mut done_here = 0;
        while let Some(p) = prefilling.front().copied() {
            if p.left > 0 {
                break;
            }
            prefilling.pop_front();
            if p.new {
                out.ttft_us = now_us;
                if first_chunk_step == Some(step) {
                    out.delayed = done_here;
                    out.added_us = done_here as f64 * t.scaled_us(t.token_us * new_chunk as f64);
                }
                return out;
            }
            done_here += 1;
            // First token now; one more per step from the next.
            if p.max_new_tokens > 1 {
                decoders.add(step + 1, p.prompt_tokens + 1, p.max_new_tokens - 1);
            } else {
                running -= 1;
            }
        }
    }
    out.ttft_us = now_us;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, EngineRequest};

    fn engine() -> Engine {
        Engine::new(EngineConfig {
            kv_capacity_tokens: 100_000,
            max_batch_tokens: 2048,
            max_running_requests: 4,
            ..EngineConfig::default()
        })
        .unwrap()
    }

    fn submit(e: &mut Engine, id: u64, prompt: std::ops::Range<u64>, out: usize) {
        e.submit(
            EngineRequest {
                id,
                prompt: prompt.collect(),
                final_tokens: Vec::new(),
                max_new_tokens: out,
            },
            Duration::ZERO,
        )
        .unwrap();
    }

    /// Steps `e` until request `id` has its first token; returns when, µs.
    fn first_token_at(e: &mut Engine, id: u64) -> f64 {
        let mut now = Duration::ZERO;
        for _ in 0..100_000 {
            let out = e.step(now);
            now += out.duration;
            if out.first_token.contains(&id) {
                return now.as_secs_f64() * 1e6;
            }
        }
        panic!("no first token for {id}");
    }

    fn fc(e: &Engine, prompt: std::ops::Range<u64>) -> Forecast {
        let tokens: Vec<u64> = prompt.collect();
        let hashes = e.cache().block_hashes(&tokens);
        forecast(e, Duration::ZERO, &hashes, tokens.len())
    }

    #[test]
    fn matches_the_engine_on_a_queue_with_decodes_chunks_and_a_full_batch() {
        // Queues of mixed prompts and outputs: long enough prompts to need
        // chunking, more requests than running slots, decodes of varying
        // length; some cached prefixes.
        let cases: Vec<Vec<(std::ops::Range<u64>, usize)>> = vec![
            vec![],
            vec![(0..3000, 5)],
            vec![(0..3000, 5), (10_000..10_500, 40), (20_000..24_000, 2)],
            vec![
                (0..100, 300),
                (1000..1100, 3),
                (2000..2900, 1),
                (3000..3100, 20),
                (4000..6500, 7),
                (7000..7010, 9),
            ],
        ];
        for (k, queue) in cases.into_iter().enumerate() {
            for speed in [1.0, 0.5] {
                let mut e = engine();
                e.set_speed(speed).unwrap();
                // A cached prefix for the new request.
                submit(&mut e, 99, 50_000..51_000, 1);
                first_token_at(&mut e, 99);
                for (i, (prompt, out)) in queue.iter().cloned().enumerate() {
                    submit(&mut e, i as u64, prompt, out);
                }
                // Run a step or two first so some are mid-prefill or decoding.
                if k == 3 {
                    e.step(Duration::ZERO);
                    e.step(Duration::ZERO);
                }
                let f = fc(&e, 50_000..51_500);
                assert_eq!(f.cached_tokens, 992, "case {k}");
                submit(&mut e, 1000, 50_000..51_500, 4);
                let real = first_token_at(&mut e, 1000);
                assert!(
                    (f.ttft_us - real).abs() < 1.0,
                    "case {k} speed {speed}: forecast {} vs engine {real}",
                    f.ttft_us
                );
            }
        }
    }

    #[test]
    fn counts_only_the_first_tokens_sharing_its_first_step() {
        // Two short prompts ahead fit in one step with room to spare: the
        // new request's first chunk rides in that step and delays both.
        let mut e = engine();
        submit(&mut e, 1, 0..200, 10);
        submit(&mut e, 2, 1000..1300, 10);
        let f = fc(&e, 5000..5600);
        assert_eq!(f.delayed, 2);
        let token_us = e.config().timing.token_us;
        assert!((f.added_us - 2.0 * 600.0 * token_us).abs() < 1e-6, "{f:?}");
        // The delay is real: with the new request, their first tokens come
        // that much later.
        let alone = {
            let mut e2 = engine();
            submit(&mut e2, 1, 0..200, 10);
            submit(&mut e2, 2, 1000..1300, 10);
            first_token_at(&mut e2, 2)
        };
        submit(&mut e, 3, 5000..5600, 10);
        let with = first_token_at(&mut e, 2);
        assert!(
            (with - alone - 600.0 * token_us).abs() < 1.0,
            "{with} vs {alone}"
        );
        // A queue that fills its steps exactly: the new request starts in a
        // step of its own and delays nobody.
        let mut full = engine();
        submit(&mut full, 1, 0..2048, 10);
        let f = fc(&full, 5000..5600);
        assert_eq!((f.delayed, f.added_us), (0, 0.0));
        // An idle engine: nobody to delay.
        let f = fc(&engine(), 0..100);
        assert_eq!(f.delayed, 0);
    }

    #[test]
    fn the_step_under_way_comes_first() {
        let e = engine();
        let tokens: Vec<u64> = (0..100).collect();
        let hashes = e.cache().block_hashes(&tokens);
        let idle = forecast(&e, Duration::ZERO, &hashes, 100).ttft_us;
        let busy = forecast(&e, Duration::from_millis(7), &hashes, 100).ttft_us;
        assert!((busy - idle - 7000.0).abs() < 1e-6);
    }
}
