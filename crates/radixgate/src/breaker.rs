//! A per-worker circuit breaker: stop sending requests to a worker that keeps
//! failing, and let a few probes through after a pause to see if it is back.
//!
//! States and transitions:
//! - **Closed**: every request is allowed. `failure_threshold` consecutive
//!   failures (a success resets the count) → Open.
//! - **Open**: nothing is allowed until `timeout_duration_secs` have passed
//!   since it opened; the first request after that moves it to HalfOpen.
//! - **HalfOpen**: at most `max_probes` requests (one by default) are in
//!   flight at once. `success_threshold` probe successes → Closed; one probe
//!   failure → Open again, with the timer restarted.
//!
//! Time is always passed in (`now`), never read from a clock inside, so tests
//! drive it deterministically; the only clock read is the instant taken at
//! construction as the origin of the stored timestamps (under
//! `tokio::time::pause()` that is the paused clock).
//!
//! Concurrency: the whole state machine is one `AtomicU64` (state, probes in
//! flight, a counter, and the time it last opened, in milliseconds since the
//! breaker was built) updated by compare-and-swap, so every transition is
//! atomic and no lock is held on the request path. Only the thread whose CAS
//! made a transition counts it.
//!
//! A [`Permit`] is an owned guard: a probe that is dropped without a recorded
//! outcome (the client went away) frees its probe slot, so a half-open breaker
//! can never be wedged by a lost probe. A permit only counts in the period it
//! was issued for: outcomes of requests admitted while Closed are ignored
//! once the breaker has opened, and a probe from an earlier half-open period
//! (recognised by the opening time it carries; openings get strictly
//! increasing stamps) is ignored in a later one.

use crate::config::BreakerConfig;
/// The externally visible state of a breaker: routing's type, so the state
/// this machine decides is the one selection reads from the worker's slot.
pub use radixgate_routing::BreakerState;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// What happened to a request that held a [`Permit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The worker answered well.
    Success,
    /// The worker failed (connect error, 5xx, broken stream: the caller decides).
    Failure,
}

/// The number of probes admitted at once in HalfOpen by [`Breaker::new`].
pub const DEFAULT_HALF_OPEN_PROBES: u32 = 1;

// Layout of the state word, low bits first.
const STATE_BITS: u32 = 2;
const PROBE_BITS: u32 = 8;
const COUNT_BITS: u32 = 14;
const PROBE_SHIFT: u32 = STATE_BITS;
const COUNT_SHIFT: u32 = PROBE_SHIFT + PROBE_BITS;
const STAMP_SHIFT: u32 = COUNT_SHIFT + COUNT_BITS;
const PROBE_MAX: u64 = (1 << PROBE_BITS) - 1;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
/// 40 bits of milliseconds: about 34 years after the breaker was built.
const STAMP_MAX: u64 = (1 << (64 - STAMP_SHIFT)) - 1;

const CLOSED: u64 = 0;
const OPEN: u64 = 1;
const HALF_OPEN: u64 = 2;

/// The decoded state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Word {
    state: u64,
    /// Probes in flight (HalfOpen only).
    probes: u64,
    /// Consecutive failures (Closed) or probe successes (HalfOpen).
    count: u64,
    /// Milliseconds since the origin when it last opened (Open, HalfOpen).
    stamp: u64,
}

impl Word {
    fn unpack(bits: u64) -> Self {
        Self {
            state: bits & ((1 << STATE_BITS) - 1),
            probes: (bits >> PROBE_SHIFT) & PROBE_MAX,
            count: (bits >> COUNT_SHIFT) & COUNT_MAX,
            stamp: bits >> STAMP_SHIFT,
        }
    }

    fn pack(self) -> u64 {
        self.state
            | (self.probes << PROBE_SHIFT)
            | (self.count << COUNT_SHIFT)
            | (self.stamp << STAMP_SHIFT)
    }

    /// Closed, keeping the last opening's stamp so later stamps stay larger.
    fn closed(count: u64, stamp: u64) -> Self {
        Self {
            state: CLOSED,
            probes: 0,
            count,
            stamp,
        }
    }

    /// Open at `now_ms`, strictly later than any earlier opening so that
    /// probes of different half-open periods never share a stamp.
    fn open(now_ms: u64, previous_stamp: u64) -> Self {
        Self {
            state: OPEN,
            probes: 0,
            count: 0,
            stamp: now_ms.max(previous_stamp + 1).min(STAMP_MAX),
        }
    }
}

/// One worker's circuit breaker. Share it as `Arc<Breaker>`.
#[derive(Debug)]
pub struct Breaker {
    enabled: bool,
    failure_threshold: u64,
    success_threshold: u64,
    timeout_ms: u64,
    max_probes: u64,
    origin: Instant,
    word: AtomicU64,
    transitions: AtomicU64,
    /// When an attempt last got no first byte in time, as milliseconds
    /// after `origin` plus one (0: never); see [`Breaker::note_hang`].
    hung_at: AtomicU64,
    /// When an attempt last got its first byte, the same way; see
    /// [`Breaker::note_answer`].
    answered_at: AtomicU64,
}

/// Permission to send one request through a breaker; record its outcome
/// with [`Permit::record`]. Dropping it unrecorded counts as neither success
/// nor failure (and frees a probe slot).
#[derive(Debug)]
#[must_use = "a permit records the request's outcome; dropping it counts nothing"]
pub struct Permit {
    breaker: Arc<Breaker>,
    /// `Some(stamp)` for a half-open probe of the period opened at `stamp`.
    probe: Option<u64>,
    done: bool,
}

impl Breaker {
    /// A breaker admitting [`DEFAULT_HALF_OPEN_PROBES`] probe at a time.
    pub fn new(config: &BreakerConfig) -> Self {
        Self::with_half_open_probes(config, DEFAULT_HALF_OPEN_PROBES)
    }

    /// A breaker admitting up to `max_probes` (at least 1, at most 255)
    /// concurrent probes while half-open. Thresholds above 16,383 are
    /// clamped to it (the width of the packed counter).
    pub fn with_half_open_probes(config: &BreakerConfig, max_probes: u32) -> Self {
        Self {
            enabled: config.enabled,
            failure_threshold: u64::from(config.failure_threshold).clamp(1, COUNT_MAX),
            success_threshold: u64::from(config.success_threshold).clamp(1, COUNT_MAX),
            timeout_ms: config.timeout_duration_secs.saturating_mul(1000),
            max_probes: u64::from(max_probes).clamp(1, PROBE_MAX),
            origin: Instant::now(),
            word: AtomicU64::new(Word::closed(0, 0).pack()),
            transitions: AtomicU64::new(0),
            hung_at: AtomicU64::new(0),
            answered_at: AtomicU64::new(0),
        }
    }

    /// Milliseconds since the origin, plus one: stamp 0 means "never opened",
    /// so a first opening at the origin is not pushed later by the
    /// strictly-increasing rule.
    fn millis(&self, now: Instant) -> u64 {
        let ms = now.saturating_duration_since(self.origin).as_millis();
        u64::try_from(ms)
            .unwrap_or(u64::MAX)
            .saturating_add(1)
            .min(STAMP_MAX)
    }

    fn open_expired(&self, word: Word, now_ms: u64) -> bool {
        now_ms.saturating_sub(word.stamp) >= self.timeout_ms
    }

    /// Atomically applies `step` to the state word until it succeeds or
    /// `step` declines (returns `None`). Returns the old and new words.
    fn update(&self, mut step: impl FnMut(Word) -> Option<Word>) -> Option<(Word, Word)> {
        let mut current = self.word.load(Ordering::Acquire);
        loop {
            let old = Word::unpack(current);
            let new = step(old)?;
            if new == old {
                // Nothing to change (the common closed-breaker admit): a
                // plain load, so the hot path never writes the shared line.
                return Some((old, new));
            }
            match self.word.compare_exchange_weak(
                current,
                new.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if new.state != old.state {
                        self.transitions.fetch_add(1, Ordering::Relaxed);
                    }
                    return Some((old, new));
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Asks to send one request. `None` when the breaker is open (or
    /// half-open with every probe slot taken).
    pub fn try_acquire(self: &Arc<Self>, now: Instant) -> Option<Permit> {
        if !self.enabled {
            return Some(self.permit(None));
        }
        let now_ms = self.millis(now);
        let (_, new) = self.update(|w| match w.state {
            CLOSED => Some(w),
            OPEN if self.open_expired(w, now_ms) => Some(Word {
                state: HALF_OPEN,
                probes: 1,
                count: 0,
                stamp: w.stamp,
            }),
            HALF_OPEN if w.probes < self.max_probes => Some(Word {
                probes: w.probes + 1,
                ..w
            }),
            _ => None,
        })?;
        let probe = (new.state == HALF_OPEN).then_some(new.stamp);
        Some(self.permit(probe))
    }

    fn permit(self: &Arc<Self>, probe: Option<u64>) -> Permit {
        Permit {
            breaker: Arc::clone(self),
            probe,
            done: false,
        }
    }

    /// Whether [`try_acquire`](Self::try_acquire) would admit a request now
    /// (for filtering candidates before choosing; it takes nothing).
    pub fn is_available(&self, now: Instant) -> bool {
        if !self.enabled {
            return true;
        }
        let w = Word::unpack(self.word.load(Ordering::Acquire));
        match w.state {
            CLOSED => true,
            OPEN => self.open_expired(w, self.millis(now)),
            _ => w.probes < self.max_probes,
        }
    }

    /// The state as seen at `now`: an open breaker whose timeout has passed
    /// reports HalfOpen (the next request will probe).
    pub fn state(&self, now: Instant) -> BreakerState {
        if !self.enabled {
            return BreakerState::Closed;
        }
        let w = Word::unpack(self.word.load(Ordering::Acquire));
        match w.state {
            CLOSED => BreakerState::Closed,
            OPEN if !self.open_expired(w, self.millis(now)) => BreakerState::Open,
            _ => BreakerState::HalfOpen,
        }
    }

    /// Notes that an attempt at this worker got no first byte within its
    /// first-byte timeout at `now`: the worker hangs requests.
    pub fn note_hang(&self, now: Instant) {
        self.hung_at.fetch_max(self.ms(now) + 1, Ordering::Relaxed);
    }

    /// Whether an attempt at this worker timed out waiting for its first
    /// byte after `since`.
    pub fn hung_since(&self, since: Instant) -> bool {
        let at = self.hung_at.load(Ordering::Relaxed);
        at != 0 && at - 1 > self.ms(since)
    }

    /// Notes that an attempt at this worker got its first byte at `now`:
    /// the worker answers requests.
    pub fn note_answer(&self, now: Instant) {
        self.answered_at
            .fetch_max(self.ms(now) + 1, Ordering::Relaxed);
    }

    /// Whether an attempt at this worker got its first byte at or after
    /// `since`.
    pub fn answered_since(&self, since: Instant) -> bool {
        // Stored plus one: 0, never, is before any `since`.
        self.answered_at.load(Ordering::Relaxed) > self.ms(since)
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// How many state changes this breaker has made since it was built.
    pub fn transitions(&self) -> u64 {
        self.transitions.load(Ordering::Relaxed)
    }

    /// How long until an open breaker admits a probe (zero unless open).
    pub fn retry_in(&self, now: Instant) -> Duration {
        let w = Word::unpack(self.word.load(Ordering::Acquire));
        if !self.enabled || w.state != OPEN {
            return Duration::ZERO;
        }
        let elapsed = self.millis(now).saturating_sub(w.stamp);
        Duration::from_millis(self.timeout_ms.saturating_sub(elapsed))
    }

    /// Applies an outcome; returns the new state if it changed.
    fn apply(
        &self,
        probe: Option<u64>,
        outcome: Option<Outcome>,
        now: Instant,
    ) -> Option<BreakerState> {
        if !self.enabled {
            return None;
        }
        let now_ms = self.millis(now);
        let (old, new) = self.update(|w| match (probe, w.state) {
            (None, CLOSED) => match outcome? {
                Outcome::Success if w.count == 0 => None,
                Outcome::Success => Some(Word::closed(0, w.stamp)),
                Outcome::Failure if w.count + 1 >= self.failure_threshold => {
                    Some(Word::open(now_ms, w.stamp))
                }
                Outcome::Failure => Some(Word::closed(w.count + 1, w.stamp)),
            },
            (Some(stamp), HALF_OPEN) if stamp == w.stamp => {
                let freed = Word {
                    probes: w.probes.saturating_sub(1),
                    ..w
                };
                match outcome {
                    None => Some(freed),
                    Some(Outcome::Success) if w.count + 1 >= self.success_threshold => {
                        Some(Word::closed(0, w.stamp))
                    }
                    Some(Outcome::Success) => Some(Word {
                        count: w.count + 1,
                        ..freed
                    }),
                    Some(Outcome::Failure) => Some(Word::open(now_ms, w.stamp)),
                }
            }
            // Stale: issued in a period that has ended.
            _ => None,
        })?;
        (old.state != new.state).then(|| decode(new.state))
    }
}

fn decode(state: u64) -> BreakerState {
    match state {
        CLOSED => BreakerState::Closed,
        OPEN => BreakerState::Open,
        _ => BreakerState::HalfOpen,
    }
}

impl Permit {
    /// Records how the request went; returns the breaker's new state if this
    /// outcome changed it (for logs and the transitions metric).
    pub fn record(mut self, outcome: Outcome, now: Instant) -> Option<BreakerState> {
        self.done = true;
        self.breaker.apply(self.probe, Some(outcome), now)
    }

    /// Whether this permit is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done && self.probe.is_some() {
            // The time is irrelevant when no outcome is applied.
            self.breaker.apply(self.probe, None, self.breaker.origin);
        }
    }
}

pub(crate) mod set;
pub(crate) use set::{Breakers, publish_breaker};

#[cfg(test)]
mod tests;
