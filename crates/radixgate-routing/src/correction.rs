//! Correction from `cached_tokens`: what the workers say they held, against
//! what the tree predicted.
//!
//! The tree records what was sent where and forgets by its own clock; a
//! worker's KV cache forgets by its own, usually much sooner. Every
//! OpenAI-compatible worker reports, with each answer, how many prompt
//! tokens it found cached. A decision that inserted into a tree hands out a
//! [`CacheFeedback`] (the tree, the tenant, the characters the tree said
//! the worker held, the insert's time); when the answer's usage arrives the
//! gateway (or the simulator) calls [`CacheFeedback::apply`]:
//!
//! - the model's characters per token are learned from `prompt_tokens`
//!   against the routed text's length ([`TokenRate`], a clipped running
//!   mean: one odd answer moves it little);
//! - the prediction in tokens is `held chars / chars per token`, at this
//!   request's own ratio (its text's length over its `prompt_tokens`:
//!   texts of one model differ, and at the model's mean a long full hit
//!   can read as a shortfall of many pages); when the
//!   worker reports more than one KV page less
//!   ([`CorrectionConfig::page_tokens`]), it had evicted the rest, and the
//!   tree forgets, for that worker, every text through the first lost
//!   character that was sent before this request
//!   ([`radixgate_tree::Tree::trim`]; what was sent since, this request
//!   included, the worker has just computed);
//! - the worker's [`CacheTruth`] counts predicted and reported cached
//!   tokens (their ratio to prompt tokens is the honest hit rate), trims,
//!   invalid reports, and keeps a running prediction error.
//!
//! A report with `cached_tokens > prompt_tokens`, `prompt_tokens == 0` or
//! `prompt_tokens` over [`MAX_PROMPT_TOKENS`] (a worker's lie, which would
//! swamp the worker's sums for good) is counted as invalid and changes
//! nothing; so is one the gateway could
//! not read as counts (negative, not a number). Everything here runs once
//! per answer, after its last byte, never on the pass-through.
//!
//! Concurrency: [`TokenRate`] is a `parking_lot::Mutex` around two numbers
//! (held for a few instructions, once per answer); [`CacheTruth`] is
//! atomics, each an independent counter.

use crate::RoutingError;
use crate::Worker;
use parking_lot::Mutex;
use radixgate_tree::TenantId;
use radixgate_tree::{Insertion, Tree};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Settings of the correction (`routing.correction`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorrectionConfig {
    /// Trim the tree when a worker reports holding clearly less than it
    /// predicted. Off: the figures are still counted, nothing is trimmed.
    pub enabled: bool,
    /// The workers' KV page (block) size in tokens: a shortfall of up to
    /// one page is paging, not eviction. Default 16 (vLLM's default block
    /// size and the simulated worker's; SGLang's radix cache defaults to
    /// pages of 1 token, where 16 is merely conservative).
    pub page_tokens: usize,
    /// Keep each worker's share of a model's tree within the worker's KV
    /// cache (its `kv_capacity_tokens`, at the model's learned characters
    /// per token): what the tree holds beyond it, least recently used
    /// first, the cache has most likely evicted too. Only where the
    /// capacity is known (reported since admission or configured) and once the
    /// model's characters per token have been learned.
    pub capacity_bound: bool,
}

impl Default for CorrectionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            page_tokens: 16,
            capacity_bound: true,
        }
    }
}

/// Largest `page_tokens`.
const MAX_PAGE_TOKENS: usize = 4096;

impl CorrectionConfig {
    /// The most characters `worker`'s share of the tree of the model
    /// `truth` counts for should hold ([`Self::capacity_bound`]); `None`:
    /// unbounded (off, capacity unknown, or nothing learned yet).
    pub(crate) fn tree_bound(&self, worker: &Worker, truth: &ModelTruth) -> Option<usize> {
        self.bound_at(worker, self.bound_rate(truth))
    }

    /// The model's characters per token for [`Self::bound_at`]: `None`
    /// with the bound off or nothing learned yet. Read once for a decision
    /// that bounds several workers (a lock).
    pub(crate) fn bound_rate(&self, truth: &ModelTruth) -> Option<f64> {
        self.capacity_bound
            .then(|| truth.rate.chars_per_token())
            .flatten()
    }

    /// [`Self::tree_bound`] at the model's `chars_per_token`, as
    /// [`Self::bound_rate`] read it.
    pub(crate) fn bound_at(&self, worker: &Worker, chars_per_token: Option<f64>) -> Option<usize> {
        let tokens = worker.kv_capacity_tokens()?;
        Some((tokens as f64 * chars_per_token?) as usize).filter(|&chars| chars > 0)
    }

    /// Checks ranges; the error names the offending key.
    pub fn validate(&self) -> Result<(), RoutingError> {
        if !(1..=MAX_PAGE_TOKENS).contains(&self.page_tokens) {
            return Err(RoutingError::config(
                "correction.page_tokens",
                format!(
                    "must be between 1 and {MAX_PAGE_TOKENS}, got {}",
                    self.page_tokens
                ),
            ));
        }
        Ok(())
    }
}

/// The counts one answer reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheReport {
    /// `prompt_tokens` (or the API's equivalent).
    pub prompt_tokens: u64,
    /// `cached_tokens` (or the API's equivalent).
    pub cached_tokens: u64,
}

/// What [`CacheFeedback::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corrected {
    /// The report was impossible and was ignored (counted).
    Invalid,
    /// Counted; the tree was right, or correction is off.
    Counted {
        /// The prediction, in tokens.
        predicted_tokens: u64,
    },
    /// Counted, and the worker's claims were trimmed.
    Trimmed {
        /// The prediction, in tokens.
        predicted_tokens: u64,
        /// Characters the tree forgot.
        chars: usize,
    },
}

/// One model's correction state: its characters per token, and the
/// decisions whose answers are still out, per worker.
///
/// Why the second: the tree claims a prompt for its worker from the moment
/// of the decision, but the worker holds it only once it has computed it.
/// An answer that reports less cached than predicted may be short because
/// an earlier request with the same prefix is still queued there, not
/// because anything was evicted. So a trim drops only claims from before
/// the oldest decision still in flight on that worker when this request
/// was decided: those requests had all been answered, their prompts
/// computed, so what of them the worker no longer held, it had evicted.
#[derive(Debug, Default)]
pub struct ModelTruth {
    rate: TokenRate,
    /// The share of answers that trimmed, a running mean over the last
    /// [`EVICTION_WINDOW`] answers (f64 bits).
    evictions: AtomicU64,
    /// Answers counted into `evictions`.
    answers: AtomicU64,
    /// The share of bounded inserts that evicted to keep their worker's
    /// share of the tree within its cache, a running mean over the last
    /// [`EVICTION_WINDOW`] of them (f64 bits).
    bound_evictions: AtomicU64,
    /// Bounded inserts counted into `bound_evictions`.
    bounded_inserts: AtomicU64,
    /// Insert times of decisions in flight, per worker, oldest first (a
    /// count per time: the tree's clock is per model, one insert per tick).
    /// A sorted deque, not a map: times arrive nearly in order and leave
    /// nearly in order, and an emptied deque keeps its buffer, so a
    /// decision allocates nothing here.
    in_flight: Mutex<HashMap<TenantId, InFlightTimes, BuildHasherDefault<TenantHasher>>>,
}

/// One worker's in-flight insert times, sorted, each with its count.
type InFlightTimes = VecDeque<(u64, u32)>;

/// Answers the eviction rate is a running mean over.
pub const EVICTION_WINDOW: u64 = 256;

/// The eviction rate from which a pool counts as overflowing: one answer in
/// a hundred. On the workloads of `docs/defaults.md` whose working set the
/// caches hold, fewer than one answer in a thousand trims; where it exceeds
/// them (the Mooncake traces), two in a hundred or more.
pub const OVERFLOW_RATE: f64 = 0.01;

/// Folds `sample` into the running mean kept as f64 bits in `mean`, as the
/// `n`-th sample (capped by the caller to its window: older samples then
/// fade).
fn fold_mean(mean: &AtomicU64, sample: f64, n: u64) {
    let weight = 1.0 / n as f64;
    let _ = mean.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        let m = f64::from_bits(bits);
        Some((m + (sample - m) * weight).to_bits())
    });
}

/// Hashes a tenant id with one multiplication: ids are small distinct
/// integers from the router itself, never from a client, so SipHash's
/// defence against chosen keys buys nothing on this per-decision path.
#[derive(Default)]
struct TenantHasher(u64);

impl Hasher for TenantHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: spreads consecutive ids over the high bits,
        // which the table's probe uses.
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl ModelTruth {
    /// The model's characters per token.
    pub fn rate(&self) -> &TokenRate {
        &self.rate
    }

    /// Registers a decision's insert at `time` for `tenant` until the
    /// returned handle drops; also returns the oldest insert time then in
    /// flight for `tenant` (`u64::MAX` if none).
    pub(crate) fn register(self: &Arc<Self>, tenant: TenantId, time: u64) -> (InFlight, u64) {
        let mut map = self.in_flight.lock();
        let times = map.entry(tenant).or_default();
        let oldest = times.front().map_or(u64::MAX, |&(t, _)| t);
        match times.binary_search_by_key(&time, |&(t, _)| t) {
            Ok(at) => times[at].1 += 1,
            Err(at) => times.insert(at, (time, 1)),
        }
        drop(map);
        let handle = InFlight {
            model: self.clone(),
            tenant,
            time,
        };
        (handle, oldest)
    }

    /// Whether a decision's insert at tree time `time` for `tenant` is
    /// still in flight (its answer not read yet): the text is being
    /// computed on that worker, or held by a request running there.
    pub(crate) fn in_flight_at(&self, tenant: TenantId, time: u64) -> bool {
        self.in_flight
            .lock()
            .get(&tenant)
            .is_some_and(|times| times.binary_search_by_key(&time, |&(t, _)| t).is_ok())
    }

    /// The share of this model's recent answers that showed an eviction
    /// (a trim): a running mean over the last [`EVICTION_WINDOW`] answers,
    /// 0 until [`EVICTION_WINDOW`] have been counted.
    pub fn eviction_rate(&self) -> f64 {
        if self.answers.load(Ordering::Relaxed) < EVICTION_WINDOW {
            return 0.0;
        }
        f64::from_bits(self.evictions.load(Ordering::Relaxed))
    }

    /// The pool's caches no longer hold what it sends them: at least
    /// [`OVERFLOW_RATE`] of its recent answers showed an eviction, or of
    /// its recent inserts had to evict to keep a worker's share of the
    /// tree within its cache. The second is what a tree so bounded shows:
    /// it forgets before the worker does, so correction finds little left
    /// to trim (on the Mooncake conversation trace at 8 workers 35 trims
    /// in 4,000 answers, under the rate).
    pub fn overflowing(&self) -> bool {
        self.eviction_rate() >= OVERFLOW_RATE || self.bound_eviction_rate() >= OVERFLOW_RATE
    }

    /// The share of this model's recent bounded inserts that evicted
    /// (`correction.capacity_bound`): a running mean over the last
    /// [`EVICTION_WINDOW`] of them, 0 until that many were counted.
    pub fn bound_eviction_rate(&self) -> f64 {
        if self.bounded_inserts.load(Ordering::Relaxed) < EVICTION_WINDOW {
            return 0.0;
        }
        f64::from_bits(self.bound_evictions.load(Ordering::Relaxed))
    }

    /// Counts an insert made within `bound`, which evicted or not (see
    /// its receipt); one without a bound is not counted.
    pub(crate) fn count_insert(&self, bound: Option<usize>, receipt: &Insertion) {
        if bound.is_some() {
            self.count_bounded_insert(receipt.bound_evicted() > 0);
        }
    }

    /// Counts one insert made within its worker's cache bound, which
    /// evicted or not.
    fn count_bounded_insert(&self, evicted: bool) {
        let n = self.bounded_inserts.fetch_add(1, Ordering::Relaxed) + 1;
        let sample = if evicted { 1.0 } else { 0.0 };
        fold_mean(&self.bound_evictions, sample, n.min(EVICTION_WINDOW));
    }

    /// Counts one answer, which trimmed or not.
    pub(crate) fn count_answer(&self, trimmed: bool) {
        let n = self.answers.fetch_add(1, Ordering::Relaxed) + 1;
        let sample = if trimmed { 1.0 } else { 0.0 };
        fold_mean(&self.evictions, sample, n.min(EVICTION_WINDOW));
    }

    /// Drops a removed worker's entry if nothing of it is in flight (one
    /// still in use then stays behind, empty: a few dozen bytes).
    pub(crate) fn forget(&self, tenant: TenantId) {
        let mut map = self.in_flight.lock();
        if map.get(&tenant).is_some_and(VecDeque::is_empty) {
            map.remove(&tenant);
        }
    }
}

/// A decision's insert still in flight; deregisters when dropped (the
/// answer was read, or the decision was dropped unanswered).
#[derive(Debug)]
pub(crate) struct InFlight {
    model: Arc<ModelTruth>,
    tenant: TenantId,
    time: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // A worker's entry stays when it empties (its next decision reuses
        // it without allocating) until the worker is removed
        // ([`ModelTruth::forget`]).
        let mut map = self.model.in_flight.lock();
        if let Some(times) = map.get_mut(&self.tenant)
            && let Ok(at) = times.binary_search_by_key(&self.time, |&(t, _)| t)
        {
            times[at].1 -= 1;
            if times[at].1 == 0 {
                times.remove(at);
            }
        }
    }
}

/// The most prompt tokens a report is believed for: 2^24, past any
/// context window (the trace recorder's bound too).
pub const MAX_PROMPT_TOKENS: u64 = 1 << 24;

/// One model's characters per token, learned from the answers.
#[derive(Debug, Default)]
pub struct TokenRate {
    state: Mutex<RateState>,
}

#[derive(Debug, Default, Clone, Copy)]
struct RateState {
    samples: u64,
    chars_per_token: f64,
}

/// The characters per token any tokenizer gives, the first sample
/// included: about 1 for CJK text, 3-5 for English and code; the bounds
/// leave room for templates and prompts of ids.
const PLAUSIBLE_CHARS_PER_TOKEN: (f64, f64) = (0.25, 32.0);

/// After this many samples the mean becomes a moving one (weight 1/64).
const RATE_WINDOW: u64 = 64;

impl TokenRate {
    /// Learns from one answer: `chars` characters of routed text were
    /// `tokens` prompt tokens. A sample is held to what a tokenizer could
    /// give ([`PLAUSIBLE_CHARS_PER_TOKEN`]), and clipped to within a factor
    /// 2 of the current estimate, before it counts.
    pub fn observe(&self, chars: usize, tokens: u64) {
        if chars == 0 || tokens == 0 {
            return;
        }
        let (low, high) = PLAUSIBLE_CHARS_PER_TOKEN;
        let sample = (chars as f64 / tokens as f64).clamp(low, high);
        let mut s = self.state.lock();
        if s.samples == 0 {
            s.chars_per_token = sample;
        } else {
            let est = s.chars_per_token;
            let clipped = sample.clamp(est / 2.0, est * 2.0);
            let weight = 1.0 / (s.samples + 1).min(RATE_WINDOW) as f64;
            s.chars_per_token = est + (clipped - est) * weight;
        }
        s.samples += 1;
    }

    /// The current estimate; `None` before the first sample.
    pub fn chars_per_token(&self) -> Option<f64> {
        let s = *self.state.lock();
        (s.samples > 0).then_some(s.chars_per_token)
    }
}

/// One worker's record of predicted against reported cached tokens.
#[derive(Debug, Default)]
pub struct CacheTruth {
    reports: AtomicU64,
    prompt_tokens: AtomicU64,
    predicted_tokens: AtomicU64,
    reported_tokens: AtomicU64,
    trims: AtomicU64,
    trimmed_chars: AtomicU64,
    invalid: AtomicU64,
    /// `f64` bits of the moving mean of `(predicted - reported) /
    /// prompt_tokens` (positive: the tree over-predicts).
    error: AtomicU64,
}

/// A snapshot of a [`CacheTruth`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CacheTruthSnapshot {
    /// Valid reports counted.
    pub reports: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Cached tokens the tree predicted for them.
    pub predicted_tokens: u64,
    /// Cached tokens the worker reported.
    pub reported_tokens: u64,
    /// Reports that trimmed the tree.
    pub trims: u64,
    /// Characters those trims removed.
    pub trimmed_chars: u64,
    /// Impossible or unreadable reports, ignored.
    pub invalid: u64,
    /// Moving mean of `(predicted - reported) / prompt_tokens` over recent
    /// reports (weight 1/64); 0 before the first.
    pub prediction_error: f64,
}

impl CacheTruthSnapshot {
    /// Reported cached tokens over prompt tokens: the hit rate the worker
    /// itself reports; `None` before the first report.
    pub fn reported_hit_rate(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.reported_tokens as f64 / self.prompt_tokens as f64)
    }
}

impl CacheTruth {
    /// Counts a report that could not be used.
    pub fn invalid(&self) {
        self.invalid.fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self, report: CacheReport, predicted: u64) {
        let n = self.reports.fetch_add(1, Ordering::Relaxed) + 1;
        self.prompt_tokens
            .fetch_add(report.prompt_tokens, Ordering::Relaxed);
        self.predicted_tokens
            .fetch_add(predicted, Ordering::Relaxed);
        self.reported_tokens
            .fetch_add(report.cached_tokens, Ordering::Relaxed);
        let sample = (predicted as f64 - report.cached_tokens as f64) / report.prompt_tokens as f64;
        fold_mean(&self.error, sample, n.min(RATE_WINDOW));
    }

    /// The figures so far.
    pub fn snapshot(&self) -> CacheTruthSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheTruthSnapshot {
            reports: get(&self.reports),
            prompt_tokens: get(&self.prompt_tokens),
            predicted_tokens: get(&self.predicted_tokens),
            reported_tokens: get(&self.reported_tokens),
            trims: get(&self.trims),
            trimmed_chars: get(&self.trimmed_chars),
            invalid: get(&self.invalid),
            prediction_error: f64::from_bits(get(&self.error)),
        }
    }
}

/// What a decision's tree insert needs to be checked against the answer.
#[derive(Debug)]
pub struct CacheFeedback {
    pub(crate) tree: Arc<Tree>,
    pub(crate) receipt: Insertion,
    /// Bytes of the routing text the decision inserted (the capped text).
    pub(crate) text_len: usize,
    /// Its characters, where the policy counted them.
    pub(crate) text_chars: Option<usize>,
    pub(crate) model: Arc<ModelTruth>,
    /// This decision, in flight until the feedback drops (held for its
    /// `Drop`, never read).
    pub(crate) _in_flight: Option<InFlight>,
    /// The oldest insert in flight on the worker when this one was decided
    /// (`u64::MAX`: none); a trim drops only claims older than it.
    pub(crate) settled_before: u64,
    pub(crate) config: CorrectionConfig,
    pub(crate) worker: Arc<Worker>,
}

impl CacheFeedback {
    /// The worker the decision chose.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// Keeps of `text` (the full routing text) only what [`Self::apply`]
    /// reads of it later, the inserted (capped) part, its characters
    /// counted now: a response then holds at most the tree's cap of the
    /// prompt while it streams, not the whole prompt. `apply` is then
    /// given the kept text.
    pub fn keep_inserted(&mut self, text: &mut String) {
        let Some(beyond) = text.get(self.text_len..) else {
            return;
        };
        if beyond.is_empty() {
            return;
        }
        self.text_chars = Some(match self.text_chars {
            Some(chars) => chars + radixgate_tree::count_chars(beyond),
            None => radixgate_tree::count_chars(text),
        });
        text.truncate(self.text_len);
        text.shrink_to_fit();
    }

    /// Checks the answer's `report` for the request routed with `text`
    /// (the full routing text, as given to the router) against the
    /// prediction, counts it on the worker and, when the worker held more
    /// than a page less than predicted, trims the tree.
    pub fn apply(self, text: &str, report: CacheReport) -> Corrected {
        let truth = self.worker.cache_truth();
        if report.prompt_tokens == 0
            || report.prompt_tokens > MAX_PROMPT_TOKENS
            || report.cached_tokens > report.prompt_tokens
        {
            truth.invalid();
            return Corrected::Invalid;
        }
        let (Some(inserted), Some(beyond)) = (text.get(..self.text_len), text.get(self.text_len..))
        else {
            truth.invalid();
            return Corrected::Invalid;
        };
        // The routing text's characters: the policy counted the inserted
        // part (a 4 KiB prompt is ~2,000 instructions to count again).
        let text_chars = match self.text_chars {
            Some(chars) => chars + radixgate_tree::count_chars(beyond),
            None => radixgate_tree::count_chars(text),
        };
        self.model.rate.observe(text_chars, report.prompt_tokens);
        // This request's own characters per token: the held prefix is part
        // of its text, so its ratio converts it better than the model's
        // mean over other texts. (An empty text held nothing: any ratio
        // predicts 0 for it.)
        let cpt = (text_chars as f64 / report.prompt_tokens as f64).max(f64::MIN_POSITIVE);
        let held = self.receipt.held_chars();
        // Engines count whole pages: the prediction is floored to a page
        // too, so that paging alone never reads as a shortfall.
        let page = self.config.page_tokens.max(1) as u64;
        let predicted =
            ((held as f64 / cpt).round() as u64).min(report.prompt_tokens) / page * page;
        truth.count(report, predicted);
        let corrected = 'trim: {
            let short = predicted.saturating_sub(report.cached_tokens);
            if !self.config.enabled || short <= page {
                break 'trim Corrected::Counted {
                    predicted_tokens: predicted,
                };
            }
            let keep = ((report.cached_tokens as f64 * cpt).floor() as usize).min(held);
            let chars = self.tree.trim(
                inserted,
                self.receipt.tenant(),
                keep,
                self.receipt.time().min(self.settled_before),
            );
            if chars == 0 {
                break 'trim Corrected::Counted {
                    predicted_tokens: predicted,
                };
            }
            truth.trims.fetch_add(1, Ordering::Relaxed);
            truth
                .trimmed_chars
                .fetch_add(chars as u64, Ordering::Relaxed);
            Corrected::Trimmed {
                predicted_tokens: predicted,
                chars,
            }
        };
        self.model
            .count_answer(matches!(corrected, Corrected::Trimmed { .. }));
        corrected
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{WorkerId, WorkerSpec};

    #[test]
    fn in_flight_entries_are_reused_and_forgotten_with_their_worker() {
        let model = Arc::new(ModelTruth::default());
        let (a, oldest) = model.register(TenantId(1), 5);
        assert_eq!(oldest, u64::MAX);
        let (b, oldest) = model.register(TenantId(1), 7);
        assert_eq!(oldest, 5);
        drop(a);
        assert_eq!(model.register(TenantId(1), 9).1, 7);
        drop(b);
        // Empty, the entry stays for the worker's next decision...
        assert_eq!(model.in_flight.lock().len(), 1);
        assert_eq!(model.register(TenantId(1), 11).1, u64::MAX);
        // ...until the worker is removed.
        model.forget(TenantId(1));
        assert!(model.in_flight.lock().is_empty());
        let (c, _) = model.register(TenantId(2), 12);
        model.forget(TenantId(2));
        assert_eq!(model.in_flight.lock().len(), 1, "still in flight");
        drop(c);
    }

    #[test]
    fn the_eviction_rate_is_the_recent_share_of_trimming_answers() {
        let model = ModelTruth::default();
        // Not judged before a whole window of answers.
        for _ in 0..EVICTION_WINDOW - 1 {
            model.count_answer(true);
        }
        assert_eq!(model.eviction_rate(), 0.0);
        assert!(!model.overflowing());
        model.count_answer(true);
        assert_eq!(model.eviction_rate(), 1.0);
        assert!(model.overflowing());
        // A long run of answers that did not trim brings it down.
        for _ in 0..4 * EVICTION_WINDOW {
            model.count_answer(false);
        }
        assert!(model.eviction_rate() < 0.02, "{}", model.eviction_rate());
        for _ in 0..4 * EVICTION_WINDOW {
            model.count_answer(false);
        }
        assert!(!model.overflowing(), "{}", model.eviction_rate());
        // One trim in a hundred answers holds it at the threshold.
        let steady = ModelTruth::default();
        for i in 0..20 * EVICTION_WINDOW {
            steady.count_answer(i % 50 == 0);
        }
        assert!(steady.overflowing(), "{}", steady.eviction_rate());
    }

    #[test]
    fn inserts_that_evict_to_stay_within_the_caches_mean_overflow_too() {
        // The trees kept within the workers' caches leave correction
        // little to trim: their own evictions say the caches are full.
        let model = ModelTruth::default();
        for _ in 0..EVICTION_WINDOW - 1 {
            model.count_bounded_insert(true);
        }
        assert!(!model.overflowing(), "not judged before a whole window");
        model.count_bounded_insert(true);
        assert_eq!(model.bound_eviction_rate(), 1.0);
        assert!(model.overflowing());
        assert_eq!(model.eviction_rate(), 0.0, "no answer trimmed");
        // Caches that hold the working set: no insert evicts.
        let fits = ModelTruth::default();
        for i in 0..20 * EVICTION_WINDOW {
            fits.count_bounded_insert(i % 500 == 0);
        }
        assert!(!fits.overflowing(), "{}", fits.bound_eviction_rate());
        for i in 0..20 * EVICTION_WINDOW {
            fits.count_bounded_insert(i % 50 == 0);
        }
        assert!(fits.overflowing(), "{}", fits.bound_eviction_rate());
    }

    #[test]
    fn the_rate_learns_and_one_odd_answer_moves_it_little() {
        let rate = TokenRate::default();
        assert_eq!(rate.chars_per_token(), None);
        for _ in 0..10 {
            rate.observe(400, 100);
        }
        assert_eq!(rate.chars_per_token(), Some(4.0));
        rate.observe(400_000, 1);
        let after = rate.chars_per_token().unwrap();
        assert!((4.0..=4.4).contains(&after), "{after}");
        rate.observe(0, 10);
        rate.observe(10, 0);
        assert_eq!(rate.chars_per_token(), Some(after));
    }

    /// A first answer that no tokenizer could give (a worker that lies:
    /// one token for a long prompt) does not set the estimate far off; the
    /// honest answers after it bring it back.
    #[test]
    fn a_first_answer_no_tokenizer_gives_is_held_to_what_one_could() {
        let (low, high) = PLAUSIBLE_CHARS_PER_TOKEN;
        for (chars, tokens, bound) in [(400_000, 1, high), (1, 400_000, low)] {
            let rate = TokenRate::default();
            rate.observe(chars, tokens);
            assert_eq!(rate.chars_per_token(), Some(bound));
            // Slowly, since every sample is clipped to a factor 2 of the
            // estimate: within 10% after 150 answers at 4.
            for _ in 0..150 {
                rate.observe(400, 100);
            }
            let after = rate.chars_per_token().unwrap();
            assert!(
                (3.6..=4.4).contains(&after),
                "{after} after {chars}/{tokens}"
            );
        }
    }

    /// A tree where worker 0 holds `held` and `other` (sent before), and a
    /// decision's feedback for `text` sent now; the rate knows 4 chars per
    /// token.
    fn setup(held: &str, other: &str, text: &str, config: CorrectionConfig) -> CacheFeedback {
        let tree = Arc::new(Tree::default());
        let worker = Arc::new(Worker::new(
            WorkerId(0),
            WorkerSpec::new("http://127.0.0.1:1"),
        ));
        tree.insert(held, worker.id().tenant());
        tree.insert(other, worker.id().tenant());
        let receipt = tree.insert(text, worker.id().tenant());
        let model = Arc::new(ModelTruth::default());
        model.rate().observe(4000, 1000);
        let (in_flight, settled_before) = model.register(worker.id().tenant(), receipt.time());
        CacheFeedback {
            tree,
            receipt,
            text_len: text.len(),
            text_chars: None,
            model,
            _in_flight: Some(in_flight),
            settled_before,
            config,
            worker,
        }
    }

    #[test]
    fn the_policys_count_of_the_inserted_text_stands_for_counting_it_again() {
        // Three bytes a character, and a routing text longer than the
        // inserted (capped) part: the rate learns the whole text's
        // characters either way.
        let inserted = "日".repeat(300);
        let text = format!("{inserted}{}", "本".repeat(100));
        let learned = |text_chars: Option<usize>| {
            let mut f = setup("", "", &inserted, CorrectionConfig::default());
            f.text_chars = text_chars;
            let model = f.model.clone();
            f.apply(
                &text,
                CacheReport {
                    prompt_tokens: 100,
                    cached_tokens: 0,
                },
            );
            model.rate().chars_per_token().unwrap()
        };
        let counted = learned(None);
        assert_eq!(learned(Some(300)), counted);
        assert_ne!(learned(Some(900)), counted, "the count is used");
        // Keeping only the inserted part, counted first, learns the same.
        for text_chars in [None, Some(300)] {
            let mut f = setup("", "", &inserted, CorrectionConfig::default());
            f.text_chars = text_chars;
            let model = f.model.clone();
            let mut kept = text.clone();
            f.keep_inserted(&mut kept);
            assert_eq!(kept, inserted);
            f.apply(
                &kept,
                CacheReport {
                    prompt_tokens: 100,
                    cached_tokens: 0,
                },
            );
            assert_eq!(model.rate().chars_per_token().unwrap(), counted);
        }
    }

    #[test]
    fn a_shortfall_of_more_than_a_page_trims_and_paging_does_not() {
        let prefix = "p".repeat(400); // 100 tokens
        let text = format!("{prefix}{}", "q".repeat(400));
        let other = format!("{prefix}{}", "r".repeat(40));
        let report = |cached| CacheReport {
            prompt_tokens: 200,
            cached_tokens: cached,
        };
        // Predicted 100 tokens (96 after paging); 90 reported: paging.
        let f = setup(&prefix, &other, &text, CorrectionConfig::default());
        let tree = f.tree.clone();
        let worker = f.worker.clone();
        let model = f.model.clone();
        assert_eq!(
            f.apply(&text, report(90)),
            Corrected::Counted {
                predicted_tokens: 96
            }
        );
        let evictions = |m: &ModelTruth| {
            (
                m.answers.load(Ordering::Relaxed),
                f64::from_bits(m.evictions.load(Ordering::Relaxed)),
            )
        };
        assert_eq!(evictions(&model), (1, 0.0));
        assert_eq!(
            tree.prefix_match_for(&other, worker.id().tenant())
                .matched_chars,
            440
        );
        // 40 reported: more than a page short. The older sibling goes from
        // char 161 on; the request's own path stays.
        let f = setup(&prefix, &other, &text, CorrectionConfig::default());
        let (tree, worker, model) = (f.tree.clone(), f.worker.clone(), f.model.clone());
        assert_eq!(
            f.apply(&text, report(40)),
            Corrected::Trimmed {
                predicted_tokens: 96,
                chars: 40
            }
        );
        assert_eq!(evictions(&model), (1, 1.0), "a trim counts as an eviction");
        assert_eq!(
            tree.prefix_match_for(&other, worker.id().tenant())
                .matched_chars,
            400
        );
        assert_eq!(
            tree.prefix_match_for(&text, worker.id().tenant())
                .matched_chars,
            800
        );
        let t = worker.cache_truth().snapshot();
        assert_eq!((t.reports, t.trims, t.trimmed_chars), (1, 1, 40));
        assert_eq!(
            (t.predicted_tokens, t.reported_tokens, t.prompt_tokens),
            (96, 40, 200)
        );
        assert!((t.prediction_error - 56.0 / 200.0).abs() < 1e-9);
        // Off: counted, never trimmed.
        let off = CorrectionConfig {
            enabled: false,
            ..CorrectionConfig::default()
        };
        let f = setup(&prefix, &other, &text, off);
        assert!(matches!(
            f.apply(&text, report(0)),
            Corrected::Counted { .. }
        ));
    }

    #[test]
    fn the_prediction_uses_the_requests_own_characters_per_token() {
        // The model's other texts ran at 2 chars per token; this one runs
        // at 4 (800 chars, 200 tokens), and the worker held all 400 chars
        // of the prefix: 100 tokens. At the model's mean the prefix would
        // read as 200 tokens, and a full hit as a shortfall.
        let prefix = "p".repeat(400);
        let text = format!("{prefix}{}", "q".repeat(400));
        let f = setup(&prefix, &prefix, &text, CorrectionConfig::default());
        for _ in 0..400 {
            f.model.rate().observe(2000, 1000);
        }
        assert!(f.model.rate().chars_per_token().unwrap() < 2.1);
        let tree = f.tree.clone();
        let tenant = f.worker.id().tenant();
        let report = CacheReport {
            prompt_tokens: 200,
            cached_tokens: 100,
        };
        assert_eq!(
            f.apply(&text, report),
            Corrected::Counted {
                predicted_tokens: 96
            }
        );
        assert_eq!(tree.prefix_match_for(&text, tenant).matched_chars, 800);
    }

    #[test]
    fn a_request_still_in_flight_on_the_worker_keeps_its_claim() {
        let prefix = "p".repeat(400);
        let old = format!("{prefix}{}", "o".repeat(40));
        let queued = format!("{prefix}{}", "r".repeat(40));
        let text = format!("{prefix}{}", "q".repeat(400));
        let tree = Arc::new(Tree::default());
        let worker = Arc::new(Worker::new(
            WorkerId(0),
            WorkerSpec::new("http://127.0.0.1:1"),
        ));
        let tenant = worker.id().tenant();
        let model = Arc::new(ModelTruth::default());
        model.rate().observe(4000, 1000);
        // `old` was answered; `queued` is decided and still in flight.
        tree.insert(&old, tenant);
        let q = tree.insert(&queued, tenant);
        let (queued_in_flight, _) = model.register(tenant, q.time());
        let receipt = tree.insert(&text, tenant);
        let (in_flight, settled_before) = model.register(tenant, receipt.time());
        assert_eq!(settled_before, q.time());
        let f = CacheFeedback {
            tree: tree.clone(),
            receipt,
            text_len: text.len(),
            text_chars: None,
            model: model.clone(),
            _in_flight: Some(in_flight),
            settled_before,
            config: CorrectionConfig::default(),
            worker,
        };
        let report = CacheReport {
            prompt_tokens: 200,
            cached_tokens: 0,
        };
        assert!(matches!(
            f.apply(&text, report),
            Corrected::Trimmed { chars: 40, .. }
        ));
        assert_eq!(tree.prefix_match_for(&old, tenant).matched_chars, 400);
        assert_eq!(tree.prefix_match_for(&queued, tenant).matched_chars, 440);
        // Both answered: nothing is in flight any more.
        drop(queued_in_flight);
        assert_eq!(model.register(tenant, u64::MAX - 1).1, u64::MAX);
    }

    #[test]
    fn impossible_reports_are_counted_and_ignored() {
        let f = setup("abc", "abd", "abcdef", CorrectionConfig::default());
        let worker = f.worker.clone();
        let impossible = CacheReport {
            prompt_tokens: 5,
            cached_tokens: 6,
        };
        assert_eq!(f.apply("abcdef", impossible), Corrected::Invalid);
        let f = CacheFeedback {
            worker: worker.clone(),
            ..setup("abc", "abd", "abcdef", CorrectionConfig::default())
        };
        let empty = CacheReport {
            prompt_tokens: 0,
            cached_tokens: 0,
        };
        assert_eq!(f.apply("abcdef", empty), Corrected::Invalid);
        let f = CacheFeedback {
            worker: worker.clone(),
            ..setup("abc", "abd", "abcdef", CorrectionConfig::default())
        };
        // Not the text the decision inserted (shorter than it).
        let fine = CacheReport {
            prompt_tokens: 5,
            cached_tokens: 0,
        };
        assert_eq!(f.apply("ab", fine), Corrected::Invalid);
        let f = CacheFeedback {
            worker: worker.clone(),
            ..setup("abc", "abd", "abcdef", CorrectionConfig::default())
        };
        let lie = CacheReport {
            prompt_tokens: MAX_PROMPT_TOKENS + 1,
            cached_tokens: 0,
        };
        assert_eq!(f.apply("abcdef", lie), Corrected::Invalid);
        let t = worker.cache_truth().snapshot();
        assert_eq!((t.invalid, t.reports, t.prompt_tokens), (4, 0, 0));
    }
}
