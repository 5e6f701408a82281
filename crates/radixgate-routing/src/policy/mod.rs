//! The [`Policy`] trait, the [`Decision`] a policy returns, and the helpers
//! every policy shares.
//!
//! A policy chooses among the workers it is given and returns a decision that
//! already holds the chosen worker's [`LoadGuard`], so the load counts from
//! the moment of the decision and concurrent decisions see each other. It
//! only ever returns an available worker (healthy, breaker not open) from the
//! slice; if there is none it answers [`RoutingError::NoHealthyWorker`].
//!
//! Policies read no clocks: recency comes from the tree's logical clock and
//! randomness from a seeded generator, so the offline simulator replays the
//! same decisions in simulated time.

mod cache_aware;
mod consistent_hash;
mod explain;
mod holding;
mod least_load;
mod power_of_two;
mod prefill_aware;
mod random;
mod round_robin;
mod trees;

pub use cache_aware::CacheAware;
pub use consistent_hash::ConsistentHash;
pub use explain::{Branch, Explanation, Rendered};
pub use holding::Holding;
pub use least_load::LeastLoad;
pub use power_of_two::PowerOfTwo;
pub use prefill_aware::PrefillAware;
pub use random::Random;
pub use round_robin::RoundRobin;
pub use trees::Trees;

use crate::correction::{CacheFeedback, CorrectionConfig, InFlight, ModelTruth};
use crate::{CostModelConfig, LoadGuard, Observation, RequestView, RoutingError, Worker, WorkerId};
use radixgate_tree::{Insertion, Tree};
use smallvec::SmallVec;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Chooses a worker for a request.
pub trait Policy: Send + Sync + fmt::Debug {
    /// The policy's configuration name (`cache_aware`, `round_robin`, …),
    /// for logs and metrics labels.
    fn name(&self) -> &'static str;

    /// Chooses an available worker of `workers` for `req` and takes its load.
    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError>;

    /// Starts the policy's tie-breaking rotation at `start` (by default
    /// there is none). Replicas of one router each start theirs elsewhere:
    /// with the same rotation, replicas that see the same state (a cold
    /// start: empty trees, no fits yet) break every tie alike, and their
    /// first requests all land on one worker before any hears of the
    /// others' (docs/replicas.md, "Ties at a cold start").
    fn stagger(&self, start: usize) {
        let _ = start;
    }

    /// A worker joined the pool.
    fn on_worker_added(&self, worker: &Arc<Worker>) {
        let _ = worker;
    }

    /// The per-model prefix trees the policy keeps, if it keeps any. The
    /// tree upkeep below (forgetting a removed worker, eviction, the cache
    /// record) is implemented once, on [`Trees`], and reached through this.
    fn trees(&self) -> Option<&Trees> {
        None
    }

    /// The settings that correct the policy's trees (among them the bound
    /// of each worker's share by its cache), if it keeps trees: a peer
    /// replica's decisions are recorded within the same bounds as the
    /// policy's own ([`Router::learn`](crate::Router::learn)).
    fn correction(&self) -> Option<CorrectionConfig> {
        None
    }

    /// The TTFT cost model's settings, if the policy learns one (a peer
    /// replica's first tokens teach this replica's fits with them:
    /// [`Router::observe`](crate::Router::observe)).
    fn cost_model(&self) -> Option<&CostModelConfig> {
        None
    }

    /// A worker left the pool for good; forget its state (by default: its
    /// records in the policy's trees).
    fn on_worker_removed(&self, worker: &Worker) {
        if let Some(trees) = self.trees() {
            trees.remove_tenant(worker.id().tenant());
        }
    }

    /// Runs one eviction pass now (synchronously); returns the characters
    /// evicted. The periodic task ([`spawn_eviction`](crate::spawn_eviction))
    /// only calls this on a timer.
    fn evict_now(&self) -> usize {
        self.trees().map_or(0, Trees::evict_now)
    }

    /// How often the background eviction should run; `None`: never.
    fn eviction_interval(&self) -> Option<Duration> {
        self.trees().and_then(Trees::eviction_interval)
    }

    /// Characters the policy's trees attribute to `worker`, over all models
    /// (for metrics); `None` for policies without a cache record.
    fn cached_chars(&self, worker: WorkerId) -> Option<usize> {
        self.trees().map(|t| t.tenant_chars(worker.tenant()))
    }
}

/// A policy's choice: the load guard on the chosen worker and why, and
/// for the prefix-aware policies, the tree insert the decision made.
#[derive(Debug)]
pub struct Decision {
    guard: LoadGuard,
    explanation: Explanation,
    inserted: Option<TreeInsert>,
}

/// The insert a decision made into a tree, kept so the gateway can take it
/// back when the worker rejects the request ([`Decision::undo_insert`]).
#[derive(Debug)]
struct TreeInsert {
    tree: Arc<Tree>,
    receipt: Insertion,
    /// Bytes of the (capped) routing text that were inserted.
    text_len: usize,
    /// Its characters, where the policy counted them on the way.
    text_chars: Option<usize>,
    /// The model's correction state and the correction's settings.
    model: Arc<ModelTruth>,
    correction: CorrectionConfig,
    /// This insert, registered as in flight on its worker until the
    /// answer is read or the decision dropped.
    in_flight: InFlight,
    /// The oldest insert then in flight on the worker.
    settled_before: u64,
}

impl Decision {
    /// Takes load on `worker` and records why it was chosen.
    pub fn new(worker: &Arc<Worker>, explanation: Explanation) -> Self {
        Self::with_prefill(worker, 0, explanation)
    }

    /// Like [`new`](Self::new), also counting `prefill_chars` of predicted
    /// prefill work on the worker (see [`LoadGuard::prefill_done`]).
    pub fn with_prefill(
        worker: &Arc<Worker>,
        prefill_chars: usize,
        explanation: Explanation,
    ) -> Self {
        Self {
            guard: LoadGuard::with_prefill(worker.clone(), prefill_chars),
            explanation,
            inserted: None,
        }
    }

    /// Like [`new`](Self::new), with the cost model's prediction: the
    /// guard counts `work.uncached_chars` as pending prefill, and its first
    /// token teaches the worker's fit `slot` ([`LoadGuard::first_token`]).
    pub fn with_prediction(
        worker: &Arc<Worker>,
        slot: usize,
        work: crate::Work,
        cost: crate::CostModelConfig,
        explanation: Explanation,
    ) -> Self {
        Self {
            guard: LoadGuard::with_prediction(worker.clone(), slot, work, cost),
            explanation,
            inserted: None,
        }
    }

    /// The request's first token arrived `elapsed` after the decision (see
    /// [`LoadGuard::first_token`]); what the cost model learned, if it did.
    pub fn first_token(&mut self, elapsed: Duration) -> Option<Observation> {
        self.guard.first_token(elapsed)
    }

    /// Records that the decision inserted `text` (the capped routing text,
    /// of `text_chars` characters where the policy counted them) into
    /// `tree` with `receipt`; `model` and `correction` are for the answer's
    /// [`CacheFeedback`].
    pub(crate) fn with_insert(
        mut self,
        tree: Arc<Tree>,
        receipt: Insertion,
        text: &str,
        text_chars: Option<usize>,
        model: Arc<ModelTruth>,
        correction: CorrectionConfig,
    ) -> Self {
        let (in_flight, settled_before) = model.register(receipt.tenant(), receipt.time());
        self.inserted = Some(TreeInsert {
            tree,
            receipt,
            text_len: text.len(),
            text_chars,
            model,
            correction,
            in_flight,
            settled_before,
        });
        self
    }

    /// Characters of the routing text the chosen worker was predicted to
    /// hold before this decision (its tree record, before the decision's
    /// own insert); `None` for decisions that inserted into no tree.
    pub fn held_chars(&self) -> Option<usize> {
        self.inserted.as_ref().map(|i| i.receipt.held_chars())
    }

    /// What the answer's cached-token count is checked against (see
    /// `correction.rs`); `None` for decisions that inserted into no tree
    /// (or whose insert was taken back). Taken once: the insert can no
    /// longer be undone after.
    pub fn take_cache_feedback(&mut self) -> Option<CacheFeedback> {
        self.inserted.take().map(|i| CacheFeedback {
            tree: i.tree,
            receipt: i.receipt,
            text_len: i.text_len,
            text_chars: i.text_chars,
            model: i.model,
            _in_flight: Some(i.in_flight),
            settled_before: i.settled_before,
            config: i.correction,
            worker: self.guard.worker().clone(),
        })
    }

    /// Takes back the tree insert this decision made, for a request the
    /// worker rejected (a 4xx other than 429: the prompt never reached its
    /// cache). `text` is the routing text the request was routed with (the
    /// policy capped it; the same cap is applied here). Removes only what
    /// this insert added for the chosen worker (see
    /// [`Tree::undo_insert`]); returns the characters removed, 0 for
    /// policies that keep no tree. Taken once: a second call does nothing.
    pub fn undo_insert(&mut self, text: &str) -> usize {
        let Some(TreeInsert {
            tree,
            receipt,
            text_len,
            ..
        }) = self.inserted.take()
        else {
            return 0;
        };
        match text.get(..text_len) {
            Some(inserted) => tree.undo_insert(inserted, receipt),
            None => 0,
        }
    }

    /// The part of `text` (the routing text the request was routed with)
    /// that this decision inserted into its tree: what another router
    /// replica must insert to learn the same. `None` when nothing was
    /// inserted (a policy without trees) or the insert was taken back.
    pub fn inserted_text<'t>(&self, text: &'t str) -> Option<&'t str> {
        self.inserted.as_ref().and_then(|i| text.get(..i.text_len))
    }

    /// The chosen worker.
    pub fn worker(&self) -> &Arc<Worker> {
        self.guard.worker()
    }

    /// Why it was chosen.
    pub fn explanation(&self) -> &Explanation {
        &self.explanation
    }

    /// Why it was chosen, as the one line of the `x-radixgate-decision`
    /// header, naming the worker by [`Worker::name`].
    pub fn rendered(&self) -> Rendered<'_> {
        self.explanation.render(self.worker().name())
    }

    /// The guard, to move into the response body; the explanation is `Copy`
    /// and can be taken first.
    pub fn into_guard(self) -> LoadGuard {
        self.guard
    }
}

/// One available worker as a decision sees it: where it is in the slice the
/// policy was given, and its load when the decision began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Index into the workers slice.
    pub(crate) idx: usize,
    /// In-flight requests.
    pub(crate) load: usize,
}

/// Loads of the available workers, read once per decision so that every
/// branch of a decision reasons about the same numbers. A worker's load is
/// its [`routing_load`](Worker::routing_load): this router's in-flight
/// requests plus those other replicas report.
#[derive(Debug)]
pub(crate) struct Loads {
    /// The available workers, in slice order (so by `idx`, ascending);
    /// inline up to 16 (no allocation per decision for most pools).
    pub(crate) candidates: SmallVec<[Candidate; 16]>,
    /// Smallest load among them.
    pub(crate) min: usize,
    /// Largest load among them.
    pub(crate) max: usize,
    /// Sum of their loads.
    pub(crate) sum: usize,
}

impl Loads {
    /// Reads the loads of the available workers; `NoHealthyWorker` if none.
    pub(crate) fn read(
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Self, RoutingError> {
        let mut candidates = SmallVec::with_capacity(workers.len());
        let (mut min, mut max, mut sum) = (usize::MAX, 0, 0);
        for (idx, w) in workers.iter().enumerate() {
            if w.is_available() {
                let load = w.routing_load();
                min = min.min(load);
                max = max.max(load);
                sum += load;
                candidates.push(Candidate { idx, load });
            }
        }
        if candidates.is_empty() {
            return Err(RoutingError::NoHealthyWorker {
                model: req.model.to_owned(),
            });
        }
        Ok(Self {
            candidates,
            min,
            max,
            sum,
        })
    }

    /// Mean in-flight load of the available workers.
    pub(crate) fn mean(&self) -> f64 {
        self.sum as f64 / self.candidates.len() as f64
    }

    /// The load of the worker at slice index `idx`, if it is available.
    pub(crate) fn load_of(&self, idx: usize) -> Option<usize> {
        self.candidates
            .binary_search_by_key(&idx, |c| c.idx)
            .ok()
            .map(|k| self.candidates[k].load)
    }

    /// Slice index of a least-loaded worker. Ties are broken by `turn`
    /// (callers pass a rotating counter or a random number), never by slice
    /// order, so a burst of equal-load decisions spreads over the tied
    /// workers instead of piling onto the first.
    pub(crate) fn least_loaded(&self, turn: usize) -> usize {
        let least = || self.candidates.iter().filter(|c| c.load == self.min);
        let pick = turn % least().count();
        least().nth(pick).expect("pick < ties").idx
    }

    /// An explanation skeleton for a choice of slice index `idx`.
    pub(crate) fn explain(
        &self,
        policy: &'static str,
        branch: Branch,
        worker: &Worker,
        idx: usize,
    ) -> Explanation {
        Explanation {
            policy,
            branch,
            worker: worker.id(),
            matched_chars: None,
            input_chars: 0,
            load: self.load_of(idx).unwrap_or(0),
            min_load: self.min,
            max_load: self.max,
            available: self.candidates.len(),
            ttft_ms: None,
            alt_ttft_ms: None,
            exact: false,
        }
    }
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod simple_tests;

#[cfg(test)]
mod undo_tests;
