//! Read-only views of an engine's queue, request by request, for
//! predictions made outside the engine (the simulator's oracles): what each
//! running request still has to prefill and decode, and what each waiting
//! one will need, in the order the scheduler serves them.
//!
//! Views are plain values built on demand; they borrow nothing and never
//! change the engine.

use super::Engine;

/// A request in the running batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunningView {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens not yet computed (0 once its prefill is done).
    pub prefill_left: usize,
    /// Output tokens produced so far.
    pub generated: usize,
    /// Output tokens it will produce in all.
    pub max_new_tokens: usize,
}

/// A request in the waiting queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitingView {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens that were not cached when it arrived (its prefill
    /// work, unless the cache changes before it is admitted).
    pub uncached_tokens: usize,
    /// Output tokens it will produce.
    pub max_new_tokens: usize,
}

impl Engine {
    /// The running batch in admission order (the order prefill chunks are
    /// given out).
    pub fn running_view(&self) -> impl ExactSizeIterator<Item = RunningView> + '_ {
        self.running.iter().map(|r| RunningView {
            prompt_tokens: r.req.prompt.len(),
            prefill_left: r.prefill_left(),
            generated: r.generated,
            max_new_tokens: r.req.max_new_tokens,
        })
    }

    /// The waiting queue in arrival order (the order of admission).
    pub fn waiting_view(&self) -> impl ExactSizeIterator<Item = WaitingView> + '_ {
        self.waiting.iter().map(|w| WaitingView {
            prompt_tokens: w.req.prompt.len(),
            uncached_tokens: w.uncached_at_arrival,
            max_new_tokens: w.req.max_new_tokens,
        })
    }
}
