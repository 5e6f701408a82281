//! The worker model: a deterministic state machine of one LLM server
//! (paged prefix cache + continuous batching + timing), driven by a
//! caller-supplied clock.
//!
//! Use: [`Engine::submit`] requests as they arrive; call [`Engine::step`]
//! whenever the engine is idle-or-done-with-its-last-step. A step picks its
//! batch *now*, advances the state, and returns how long the step takes and
//! what it produced; the caller makes those results visible at `now +
//! duration` (the HTTP server sleeps that long; an offline simulator
//! schedules an event) and calls `step` again then. Requests submitted
//! during a step join the next one. An empty outcome means idle: wait for
//! the next submission.
//!
//! Scheduling (FIFO, no skipping): the waiting queue is admitted in arrival
//! order while there is a running slot and the head's cache reservation
//! fits; a head that does not fit blocks those behind it (fairness over
//! utilisation, as SGLang's default FCFS does). A step's token budget goes
//! first to one decode token per running, prefilled request, then to prefill
//! chunks in admission order (chunked prefill). The last prefill chunk
//! yields the first output token; each later step yields one more.
//!
//! Cache: at admission a request pins its cached prefix (full blocks, at
//! most up to the token before its last prompt token, since the last one is
//! always computed) and reserves blocks for the rest of its prompt and its
//! output, so running requests never need preemption. When its prefill
//! completes its prompt blocks join the prefix tree (later requests can hit
//! them); when it finishes, the blocks of prompt + reply
//! (`EngineRequest::final_tokens`) join the tree unpinned.
//!
//! Transferred requests ([`Engine::submit_transferred`]): a decode worker of
//! a prefill/decode pair receives the prompt's KV from the prefill worker;
//! at admission the prompt's full blocks enter the tree (reusing those
//! already cached), nothing is prefilled, and the request decodes from its
//! first step with the whole prompt counted as cached.
//!
//! Concurrency: none; one owner drives it (a tokio task, or a simulator loop).

pub mod cache;
pub mod config;
pub mod view;

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

pub use cache::{CacheEvent, KvCache, PinnedPath};
pub use config::{EngineConfig, MAX_SPEED, MIN_SPEED, TimingConfig, check_speed};
pub use view::{RunningView, WaitingView};

use crate::error::SimError;

/// A request id chosen by the caller; unique among live requests.
pub type ReqId = u64;

/// A generation request as the engine sees it: tokens only.
#[derive(Debug, Clone)]
pub struct EngineRequest {
    /// Caller-chosen id.
    pub id: ReqId,
    /// Prompt token ids.
    pub prompt: Vec<u64>,
    /// Tokens of prompt text + reply text, cached when the request finishes
    /// (as SGLang caches finished requests). Empty: cache the prompt only.
    pub final_tokens: Vec<u64>,
    /// Output tokens to generate (no early stop).
    pub max_new_tokens: usize,
}

/// What one step did.
#[derive(Debug, Default, Clone)]
pub struct StepOutcome {
    /// How long the step takes; its results hold at `now + duration`.
    pub duration: Duration,
    /// Prompt tokens computed in this step.
    pub prefill_tokens: usize,
    /// Requests that decoded a token in this step.
    pub decode_seqs: usize,
    /// Requests admitted into the running batch at the start of this step,
    /// with the prompt tokens each found cached.
    pub admitted: Vec<(ReqId, usize)>,
    /// Every request that produced output tokens: `(id, tokens so far)`.
    pub progressed: Vec<(ReqId, usize)>,
    /// Requests whose first output token came from this step.
    pub first_token: Vec<ReqId>,
    /// Requests that completed in this step.
    pub finished: Vec<Finished>,
}

impl StepOutcome {
    /// True when the engine had nothing to do.
    pub fn is_idle(&self) -> bool {
        self.prefill_tokens == 0 && self.decode_seqs == 0 && self.finished.is_empty()
    }
}

/// A completed request's accounting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The request.
    pub id: ReqId,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens found in the cache at admission.
    pub cached_tokens: usize,
    /// Output tokens generated.
    pub completion_tokens: usize,
    /// Time from submission to admission into the running batch.
    pub queued: Duration,
}

/// A read-only snapshot of the engine's load.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LoadSnapshot {
    /// Requests in the running batch.
    pub running: usize,
    /// Requests in the waiting queue.
    pub waiting: usize,
    /// Prompt tokens not yet computed, waiting and running (a waiting
    /// request counts its prompt less the cache hit it had on arrival).
    pub pending_prefill_tokens: usize,
    /// KV tokens in use (tree + reservations).
    pub kv_used_tokens: usize,
    /// KV tokens of reusable (unpinned) prefix cache.
    pub kv_cached_tokens: usize,
    /// KV capacity in tokens.
    pub kv_capacity_tokens: usize,
}

/// Cumulative counters since creation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Requests admitted into the running batch.
    pub admitted: u64,
    /// Requests completed.
    pub finished: u64,
    /// Requests cancelled by the caller.
    pub cancelled: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Of those, found in the cache (prefix hits).
    pub cached_tokens: u64,
    /// Output tokens produced.
    pub generated_tokens: u64,
    /// Steps run.
    pub steps: u64,
    /// Simulated busy time.
    pub busy: Duration,
}

struct Waiting {
    req: EngineRequest,
    arrival: Duration,
    /// Block hashes of the prompt, computed once at submission.
    hashes: Vec<u64>,
    /// Prompt tokens not cached at submission (for the load report).
    uncached_at_arrival: usize,
    /// The prompt's KV arrived from another worker (disaggregated
    /// prefill): nothing to compute, the whole prompt counts as cached.
    transferred: bool,
}

struct Running {
    req: EngineRequest,
    prompt_hashes: Vec<u64>,
    queued: Duration,
    path: PinnedPath,
    reserved: usize,
    cached: usize,
    prefilled: usize,
    generated: usize,
}

impl Running {
    fn prefill_left(&self) -> usize {
        self.req.prompt.len() - self.prefilled
    }
}

/// One simulated worker's model.
pub struct Engine {
    config: EngineConfig,
    cache: KvCache,
    waiting: VecDeque<Waiting>,
    /// Sum of `uncached_at_arrival` over `waiting` (kept so that load
    /// reports cost O(running), not O(waiting x prompt)).
    waiting_prefill: usize,
    running: Vec<Running>,
    ids: HashSet<ReqId>,
    counters: EngineCounters,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("load", &self.load())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Engine {
    /// A fresh engine; fails on an invalid configuration.
    pub fn new(config: EngineConfig) -> Result<Self, SimError> {
        config.validate()?;
        Ok(Self {
            cache: KvCache::new(config.block_size, config.capacity_blocks()),
            config,
            waiting: VecDeque::new(),
            waiting_prefill: 0,
            running: Vec::new(),
            ids: HashSet::new(),
            counters: EngineCounters::default(),
        })
    }

    /// The configuration (with the current speed).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Changes the worker's speed (`timing.speed`, validated): steps started
    /// from now on take their work's time divided by `speed`; a step already
    /// under way keeps the duration it was given.
    pub fn set_speed(&mut self, speed: f64) -> Result<(), SimError> {
        check_speed("speed", speed)?;
        self.config.timing.speed = speed;
        Ok(())
    }

    /// Queues a request. Fails if its id is live, or if it could never fit
    /// in the cache even when empty (it would block the queue forever).
    pub fn submit(&mut self, req: EngineRequest, now: Duration) -> Result<(), SimError> {
        self.enqueue(req, now, false)
    }

    /// Queues a request whose prompt KV was computed elsewhere and moved
    /// here (a decode worker of a prefill/decode pair): at admission the
    /// prompt's blocks enter this cache as if computed, the whole prompt
    /// counts as cached (`Finished::cached_tokens` = prompt length), and
    /// the request only decodes. Fails as [`Engine::submit`] does.
    pub fn submit_transferred(
        &mut self,
        req: EngineRequest,
        now: Duration,
    ) -> Result<(), SimError> {
        self.enqueue(req, now, true)
    }

    fn enqueue(
        &mut self,
        req: EngineRequest,
        now: Duration,
        transferred: bool,
    ) -> Result<(), SimError> {
        if self.ids.contains(&req.id) {
            return Err(SimError::bad_request(
                format!("duplicate request id {}", req.id),
                None,
            ));
        }
        let need = self.blocks_needed(&req);
        if need > self.cache.capacity_blocks() {
            return Err(SimError::bad_request(
                format!(
                    "request needs {} KV tokens (prompt {} + output {}), more than this worker's capacity of {}",
                    need * self.config.block_size,
                    req.prompt.len(),
                    req.max_new_tokens,
                    self.cache.capacity_blocks() * self.config.block_size
                ),
                Some("max_tokens"),
            ));
        }
        self.ids.insert(req.id);
        let hashes = self.cache.block_hashes(&req.prompt);
        let uncached_at_arrival = if transferred {
            0
        } else {
            req.prompt.len() - self.hit_blocks(&hashes, req.prompt.len()) * self.config.block_size
        };
        self.waiting_prefill += uncached_at_arrival;
        self.waiting.push_back(Waiting {
            req,
            arrival: now,
            hashes,
            uncached_at_arrival,
            transferred,
        });
        Ok(())
    }

    /// Drops a request wherever it is (client went away). Its pages are
    /// unpinned; computed blocks already in the tree stay cached. Returns
    /// whether it was live.
    pub fn cancel(&mut self, id: ReqId) -> bool {
        if !self.ids.remove(&id) {
            return false;
        }
        self.counters.cancelled += 1;
        if let Some(i) = self.waiting.iter().position(|w| w.req.id == id) {
            let w = self.waiting.remove(i).expect("index from position");
            self.waiting_prefill -= w.uncached_at_arrival;
        } else if let Some(i) = self.running.iter().position(|r| r.req.id == id) {
            let r = self.running.remove(i);
            self.cache.release(r.path, r.reserved);
        }
        true
    }

    /// Runs one step at `now`: admits, batches, advances. See the module doc.
    pub fn step(&mut self, now: Duration) -> StepOutcome {
        let mut out = StepOutcome::default();
        self.admit(now, &mut out.admitted);
        let mut budget = self.config.max_batch_tokens;
        let mut context = 0;
        // Decode: one token per prefilled, unfinished request.
        let mut decoding = Vec::new();
        for (i, r) in self.running.iter().enumerate() {
            if r.prefill_left() == 0 && r.generated < r.req.max_new_tokens {
                decoding.push(i);
                context += r.req.prompt.len() + r.generated;
            }
        }
        budget -= decoding.len();
        // Prefill chunks in admission order.
        let mut chunks = Vec::new();
        for (i, r) in self.running.iter().enumerate() {
            if budget == 0 {
                break;
            }
            let left = r.prefill_left();
            if left > 0 {
                let chunk = left.min(budget);
                budget -= chunk;
                chunks.push((i, chunk));
            }
        }
        out.decode_seqs = decoding.len();
        out.prefill_tokens = chunks.iter().map(|c| c.1).sum();
        if out.decode_seqs == 0 && out.prefill_tokens == 0 {
            // Only a transferred request with nothing to generate can be
            // complete without a step.
            self.retire(&mut out);
            return out;
        }
        out.duration =
            self.config
                .timing
                .step_duration(out.prefill_tokens, out.decode_seqs, context);
        for i in decoding {
            let r = &mut self.running[i];
            r.generated += 1;
            out.progressed.push((r.req.id, r.generated));
            if r.generated == 1 {
                // A transferred prompt's first token comes from a decode
                // step, not from a prefill's end.
                out.first_token.push(r.req.id);
            }
        }
        for (i, chunk) in chunks {
            self.running[i].prefilled += chunk;
            if self.running[i].prefill_left() == 0 {
                self.on_prefill_done(i, &mut out);
            }
        }
        self.counters.steps += 1;
        self.counters.busy += out.duration;
        self.counters.generated_tokens += out.progressed.len() as u64;
        self.retire(&mut out);
        out
    }

    /// True when nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Evicts all unpinned cache (`/flush_cache`); returns blocks evicted.
    pub fn flush_cache(&mut self) -> usize {
        self.cache.flush()
    }

    /// Tokens of `tokens` that a request would find cached now (read-only).
    pub fn cached_prefix_tokens(&self, tokens: &[u64]) -> usize {
        self.cache.cached_prefix_tokens(tokens)
    }

    /// The cache, read-only (for oracles).
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Starts or stops logging the cache's stores and evictions
    /// ([`KvCache::record_events`]); for a worker that publishes KV events.
    pub fn record_cache_events(&mut self, on: bool) {
        self.cache.record_events(on);
    }

    /// The cache events logged since the last call, oldest first.
    pub fn take_cache_events(&mut self) -> Vec<CacheEvent> {
        self.cache.take_events()
    }

    /// Current load.
    pub fn load(&self) -> LoadSnapshot {
        let running_prefill: usize = self.running.iter().map(Running::prefill_left).sum();
        let bs = self.config.block_size;
        LoadSnapshot {
            running: self.running.len(),
            waiting: self.waiting.len(),
            pending_prefill_tokens: self.waiting_prefill + running_prefill,
            kv_used_tokens: self.cache.used_blocks() * bs,
            kv_cached_tokens: self.cache.unpinned_blocks() * bs,
            kv_capacity_tokens: self.cache.capacity_blocks() * bs,
        }
    }

    /// The running batch as an oracle sees it: the context tokens the
    /// decoding requests read per step, and each running request's output
    /// tokens still to generate, ascending (the order its slot frees up).
    pub fn running_state(&self) -> (usize, Vec<usize>) {
        let mut context = 0;
        let mut remaining: Vec<usize> = self
            .running
            .iter()
            .map(|r| {
                if r.prefill_left() == 0 {
                    context += r.req.prompt.len() + r.generated;
                }
                r.req.max_new_tokens.saturating_sub(r.generated).max(1)
            })
            .collect();
        remaining.sort_unstable();
        (context, remaining)
    }

    /// Cumulative counters.
    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    /// Cache hit in blocks (never covering the last prompt token).
    fn hit_blocks(&self, hashes: &[u64], prompt_len: usize) -> usize {
        self.cache
            .match_blocks(hashes)
            .min(self.max_hit_blocks(prompt_len))
    }

    fn max_hit_blocks(&self, prompt_len: usize) -> usize {
        prompt_len.saturating_sub(1) / self.config.block_size
    }

    /// Blocks the request needs if nothing were cached.
    fn blocks_needed(&self, req: &EngineRequest) -> usize {
        let tokens = (req.prompt.len() + req.max_new_tokens).max(req.final_tokens.len());
        tokens.div_ceil(self.config.block_size)
    }

    fn admit(&mut self, now: Duration, admitted: &mut Vec<(ReqId, usize)>) {
        while self.running.len() < self.config.max_running_requests {
            let Some(head) = self.waiting.front() else {
                break;
            };
            let matched = if head.transferred {
                // Every full block of the prompt may be reused: nothing of
                // it is computed here.
                self.cache.match_blocks(&head.hashes)
            } else {
                self.hit_blocks(&head.hashes, head.req.prompt.len())
            };
            let need = self.blocks_needed(&head.req) - matched;
            let Some(path) = self.cache.acquire(&head.hashes, matched, need) else {
                break;
            };
            let w = self.waiting.pop_front().expect("head exists");
            self.waiting_prefill -= w.uncached_at_arrival;
            let cached = if w.transferred {
                w.req.prompt.len()
            } else {
                matched * self.config.block_size
            };
            self.counters.admitted += 1;
            self.counters.prompt_tokens += w.req.prompt.len() as u64;
            self.counters.cached_tokens += cached as u64;
            admitted.push((w.req.id, cached));
            let mut r = Running {
                queued: now.saturating_sub(w.arrival),
                path,
                reserved: need,
                cached,
                prefilled: cached,
                generated: 0,
                prompt_hashes: w.hashes,
                req: w.req,
            };
            if w.transferred {
                // The moved KV enters the tree now, as a local prefill's
                // does when it completes.
                let new =
                    self.cache
                        .extend(&r.path, &r.prompt_hashes, &r.req.prompt, &mut r.reserved);
                let old = std::mem::replace(&mut r.path, new);
                self.cache.release(old, 0);
            }
            self.running.push(r);
        }
    }

    fn on_prefill_done(&mut self, i: usize, out: &mut StepOutcome) {
        let r = &mut self.running[i];
        let new = self
            .cache
            .extend(&r.path, &r.prompt_hashes, &r.req.prompt, &mut r.reserved);
        let old = std::mem::replace(&mut r.path, new);
        self.cache.release(old, 0);
        if r.req.max_new_tokens > 0 {
            r.generated = 1;
            out.progressed.push((r.req.id, 1));
            out.first_token.push(r.req.id);
        }
    }

    /// Moves finished requests out, caching prompt + reply.
    fn retire(&mut self, out: &mut StepOutcome) {
        let mut i = 0;
        while i < self.running.len() {
            let r = &self.running[i];
            if r.prefill_left() > 0 || r.generated < r.req.max_new_tokens {
                i += 1;
                continue;
            }
            let mut r = self.running.remove(i);
            if !r.req.final_tokens.is_empty() {
                let hashes = self.cache.block_hashes(&r.req.final_tokens);
                let full =
                    self.cache
                        .extend(&r.path, &hashes, &r.req.final_tokens, &mut r.reserved);
                let old = std::mem::replace(&mut r.path, full);
                self.cache.release(old, 0);
            }
            self.cache.release(r.path, r.reserved);
            self.ids.remove(&r.req.id);
            self.counters.finished += 1;
            out.finished.push(Finished {
                id: r.req.id,
                prompt_tokens: r.req.prompt.len(),
                cached_tokens: r.cached,
                completion_tokens: r.generated,
                queued: r.queued,
            });
        }
    }
}

#[cfg(test)]
mod tests;
