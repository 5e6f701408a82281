//! Seeded, deterministic workload generators, free of HTTP.
//!
//! A [`Workload`] hands out [`RequestSpec`]s and is told the real reply of
//! each request whose session continues (multi-turn chat, agent steps), so a
//! conversation's next turn extends its previous prompt plus the reply the
//! server actually produced. The same objects drive the `load` tool (real
//! time, HTTP) and the offline simulator (simulated time): time is passed in
//! as a [`Duration`] since the start of the run, never read from a clock.
//!
//! Determinism: for a given seed and a given sequence of `next`/`on_reply`
//! calls, the requests are identical. Text is derived from keys (seed,
//! session, turn), so a session's content does not depend on the order in
//! which other sessions' replies arrive.
//!
//! Concurrency: a workload is a plain `&mut self` state machine; a
//! multi-task driver wraps it in a mutex held only for the duration of one
//! call (never across an `.await`).

mod agentic;
mod config;
mod conversation;
mod long_doc;
mod mixed;
mod multi_turn;
pub mod rng;
mod shared_prefix;
mod spec;
pub mod text;
mod trace;
mod zipf;

use std::time::Duration;

pub use agentic::{Agentic, AgenticConfig};
pub use config::WorkloadConfig;
pub use long_doc::{LongDoc, LongDocConfig};
pub use mixed::{Mixed, MixedConfig, MixedPart};
pub use multi_turn::{MultiTurn, MultiTurnConfig};
pub use shared_prefix::{SharedPrefix, SharedPrefixConfig};
pub use spec::{Message, Prompt, RequestSpec, Role, SessionId};
pub use text::TextShape;
pub use trace::{
    MAX_BLOCK_TOKENS, MAX_SPAN_MS, SPEEDUP_RANGE, TraceConfig, TraceRecord, TraceReplay,
    load_model_trace, load_trace,
};
pub use zipf::Zipf;

/// What a workload has for the driver at a given time.
#[derive(Debug, Clone, PartialEq)]
pub enum Poll {
    /// Send this request now.
    Ready(RequestSpec),
    /// Nothing can be sent before this time (a trace gap, a think time).
    NotBefore(Duration),
    /// Nothing can be sent until an outstanding reply (or failure) is
    /// reported.
    AwaitReply,
    /// The workload is exhausted.
    Done,
}

/// A source of requests.
pub trait Workload: Send {
    /// The next request that may be sent at time `now` (since the start).
    /// Session workloads prefer a due follow-up turn over a new session.
    fn next(&mut self, now: Duration) -> Poll;

    /// The reply text of a request of `session` that finished at `now`.
    /// Sessions that continue append it as the assistant's message.
    fn on_reply(&mut self, session: SessionId, reply: &str, now: Duration);

    /// The request of `session` failed: the session ends (it has no reply
    /// to continue from).
    fn on_failure(&mut self, session: SessionId, now: Duration);

    /// Whether requests carry their own arrival times (trace replay) which
    /// the driver must follow instead of its own arrival process.
    fn timestamped(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
