//! cache_aware: send a request to the worker most likely to hold its prefix,
//! unless that unbalances the pool or makes the request wait. The rule is
//! DESIGN §1, step by step, with step 3's guard chosen by `hot_spot`:
//!
//! 1. over the **available** workers of the pool: `min_load`, `max_load`;
//! 2. imbalanced iff `max - min > balance_abs_threshold` and
//!    `max > balance_rel_threshold * min` → shortest queue (the safety net
//!    under every rule; with live KV-event streams, a worker far enough
//!    below the busiest that holds the text or is computing it, if any:
//!    [`CacheAware::relief_holder`]);
//! 3. otherwise longest-prefix match in the model's tree; if
//!    `matched / input > cache_threshold` → a holder of the deepest match
//!    (with `match_granularity_chars` G > 1, a worker whose match is shorter
//!    than the deepest by less than G characters counts as a holder too: a
//!    KV cache reuses whole pages, so a few more matched characters save
//!    nothing), unless the hot-spot rule says it is too busy;
//! 4. otherwise the low-match target (`smallest_tree` or `min_load`), ties
//!    rotating;
//! 5. always insert the text for the chosen worker.
//!
//! ## The `predicted_ttft` rule (default)
//!
//! Every available worker's time to first token for this request is
//! predicted by its cost model (`cost.rs`): queued prefill plus this
//! request's uncached characters (from one walk of the tree,
//! [`Tree::tenant_matches`]), plus its in-flight term. A worker that has not
//! answered yet is taken to be like its answered peers. With `best` the
//! least prediction, the bound is `best * (1 + margin) + slack_ms`:
//! - step 3: the holder with the least prediction (then the most recent) is
//!   taken while its prediction is within the bound plus
//!   `repeat_ms² / reuse_ms`, where `repeat_ms` is what the quickest worker
//!   would spend prefilling again what the holder already holds (a spill
//!   makes the pool compute it again, and delays whatever reaches that
//!   worker meanwhile); otherwise the least-loaded worker (the quickest
//!   of equals) takes it ([`Branch::HotSpotSpill`]) and becomes a holder.
//!   A hot match (the tree's demand share of it × the pool's size ×
//!   `hot_share` reaches its number of holders: it draws more than their
//!   share of the traffic)
//!   goes to the least-loaded worker predicted within `best * (1 +
//!   hot_margin)`, a holder before a non-holder of the same load: the
//!   prefix spreads as its traffic needs, and load stays even although a
//!   holder would be a little quicker;
//! - step 4: the low-match target among the workers within the bound.
//!
//! With live KV-event streams a worker's match is its engine's, except for
//! a text still being computed (its events come once the prefill is done):
//! while a second copy would evict a cached text elsewhere (the caches
//! overflow, or every worker's share of the tree is at its cache's size)
//! the tree's guess counts where a request still in flight sent it
//! ([`CacheAware::copies_evict`]).
//!
//! The decision header shows the chosen worker's prediction and the best
//! alternative's. Cost: one tree walk (the insert then follows its path
//! without comparing the text again, [`Tree::insert_matched`], unless the
//! tree changed shape in between), one pass over the pool (three atomic
//! reads per worker), one tree-size read per candidate in the low-match
//! branch.
//!
//! ## The in-flight rules (`relative_cap`, `off`)
//!
//! The rule before the cost model, kept exactly
//! ([`CacheAwareConfig::seed_rule`]): in step 3 the deepest holder (ties:
//! least loaded, then most recent; never slice order); with G > 1 a less
//! loaded near holder wins; if every deepest holder is unavailable, the best
//! match among available workers, if still above the threshold. A holder
//! over the cap `max(min_load + slack, factor * mean_load)` gives way to the
//! least-loaded worker, which becomes a second holder. Per decision: one
//! tree match, one insert, one pass over the pool's loads; per-worker
//! matches only when every deepest holder is unavailable, or when G > 1 and
//! the best deepest holder runs above the pool's minimum load.
//!
//! State: one [`Tree`] per pool key, created on first use (see `trees.rs`
//! for the map's concurrency), plus a rotating counter for ties. Unhealthy
//! workers keep their tree records; removed workers' records are dropped (a
//! returning worker gets a new id). Under every rule the decision's guard
//! carries the chosen worker's prediction, so the cost model learns from
//! its first token.
//!
//! [`CacheAwareConfig::seed_rule`]: crate::CacheAwareConfig::seed_rule
//! [`Tree::tenant_matches`]: radixgate_tree::Tree::tenant_matches
//! [`Tree::insert_matched`]: radixgate_tree::Tree::insert_matched

use super::trees::{Model, TreeUpkeep};
use super::{Branch, Candidate, Decision, Explanation, Loads, Policy, Trees};
use crate::config::{CacheAwareConfig, HotSpotRule, LowMatchTarget};
use crate::{Coefficients, RequestView, RoutingError, Work, Worker, WorkerId};
use radixgate_tree::{PrefixMatch, Tree};
use smallvec::SmallVec;
use std::cmp::Ordering as CmpOrdering;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The cache-aware policy.
#[derive(Debug)]
pub struct CacheAware {
    config: CacheAwareConfig,
    trees: Trees,
    turn: AtomicUsize,
}

/// What step 3 found.
enum Lookup {
    /// A holder whose match is above the cache threshold.
    Hit(Hit),
    /// No available holder above it; `matched` characters is the match the
    /// explanation reports.
    Miss { matched: usize },
}

/// A holder found by step 3 and how much of the text it holds.
struct Hit {
    /// Slice index of the holder.
    idx: usize,
    /// Characters of the text it holds.
    matched: usize,
    /// Every deepest holder was unavailable; this is the best available one.
    fallback: bool,
}

/// A deepest holder of the text that is available in this pool.
struct Holder {
    at: Candidate,
    /// When the text was last sent to it (the tree's logical clock).
    last_access: u64,
}

/// A worker's own match of the request text.
#[derive(Clone, Copy)]
struct OwnMatch {
    at: Candidate,
    /// Characters of the text it holds.
    matched: usize,
}

/// A decision before it is taken: the worker and what the explanation shows.
struct Choice {
    /// Slice index of the chosen worker.
    idx: usize,
    branch: Branch,
    /// Characters matched for the rule that decided (`None`: imbalanced).
    matched: Option<usize>,
    /// Characters in the request text (0 when it was not matched).
    input: usize,
}

/// One available worker as the `predicted_ttft` rule sees it.
struct Scored {
    at: Candidate,
    /// Characters of the text it holds.
    matched: usize,
    /// `matched` came from the engine's KV events.
    exact: bool,
    /// Characters of the text the tree guesses it holds.
    guess: usize,
    /// When the text's matched part was last sent to it (tree clock).
    last_access: u64,
    /// Its cost-model fit for the request's model.
    slot: usize,
    /// What the request would wait behind there.
    work: Work,
    /// It has answered yet: `coefficients` are its own fit.
    fitted: bool,
    /// The cost model it is predicted by (its fit, or a stand-in).
    coefficients: Coefficients,
    /// The predicted time to first token, milliseconds.
    ttft_ms: f64,
}

/// The `predicted_ttft` rule's bound on "as quick as the best".
#[derive(Clone, Copy)]
struct TtftBound {
    margin: f64,
    overflow_margin: f64,
    slack_ms: f64,
    reuse_ms: f64,
    hot_share: f64,
    hot_margin: f64,
}

impl TtftBound {
    /// The repeated-prefill term of the hit bound: `repeat_ms² / reuse_ms`,
    /// `repeat_ms` being what the `quickest` worker would prefill again of
    /// what `holder` already holds (0 without a `reuse_ms`).
    fn spill_cost_ms(&self, quickest: &Scored, holder: &Scored) -> f64 {
        if self.reuse_ms <= 0.0 {
            return 0.0;
        }
        let repeat_chars = quickest
            .work
            .uncached_chars
            .saturating_sub(holder.work.uncached_chars);
        let repeat_ms = quickest.coefficients.per_kchar_ms * repeat_chars as f64 / 1024.0;
        repeat_ms * repeat_ms / self.reuse_ms
    }
}

/// A worker's cache footprint in a tree, for the smallest-tree target.
struct Footprint {
    at: Candidate,
    /// Characters the tree attributes to it.
    tree_chars: usize,
}

impl CacheAware {
    /// A cache-aware policy. The config should have passed
    /// [`CacheAwareConfig::validate`] ([`PolicyConfig::build`] does that).
    ///
    /// [`PolicyConfig::build`]: crate::PolicyConfig::build
    pub fn new(config: CacheAwareConfig) -> Self {
        Self {
            trees: Trees::new(TreeUpkeep {
                max_total_chars: config.max_total_chars,
                max_tree_size: config.max_tree_size,
                eviction_interval_secs: config.eviction_interval_secs,
                max_routing_text_chars: config.max_routing_text_chars,
            }),
            config,
            turn: AtomicUsize::new(0),
        }
    }

    /// The policy's settings.
    pub fn config(&self) -> &CacheAwareConfig {
        &self.config
    }

    /// The tree of a pool key, if a request for it was routed.
    pub fn tree(&self, model: &str) -> Option<Arc<Tree>> {
        self.trees.get(model)
    }

    #[cfg(test)]
    pub(crate) fn tree_or_create(&self, model: &str) -> Arc<Tree> {
        self.trees.get_or_create(model)
    }

    /// The formula of step 2.
    pub fn is_imbalanced(&self, min_load: usize, max_load: usize) -> bool {
        imbalanced(
            min_load,
            max_load,
            self.config.balance_abs_threshold,
            self.config.balance_rel_threshold,
        )
    }

    fn next_turn(&self) -> usize {
        self.turn.fetch_add(1, Ordering::Relaxed)
    }

    /// Step 3, given the tree's match `m` of the request: the deepest
    /// available holder, or the best available match.
    fn find_hit(
        &self,
        tree: &Tree,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
        loads: &Loads,
        m: &PrefixMatch,
    ) -> Lookup {
        if !self.above_threshold(m.matched_chars, m.input_chars) {
            return Lookup::Miss {
                matched: m.matched_chars,
            };
        }
        // Available holders of the deepest node, by slice index. Pools from
        // the registry are in id order, so a binary search finds a tenant;
        // any other slice falls back to a linear scan.
        let candidates = &loads.candidates;
        let sorted = candidates.is_sorted_by_key(|c| workers[c.idx].id());
        let lookup = |id: WorkerId| -> Option<Candidate> {
            if sorted {
                candidates
                    .binary_search_by_key(&id, |c| workers[c.idx].id())
                    .ok()
                    .map(|k| candidates[k])
            } else {
                candidates
                    .iter()
                    .find(|c| workers[c.idx].id() == id)
                    .copied()
            }
        };
        let best = m
            .tenants
            .iter()
            .filter_map(|hit| {
                lookup(WorkerId(hit.tenant.0)).map(|at| Holder {
                    at,
                    last_access: hit.last_access,
                })
            })
            // least loaded, then most recent
            .min_by(|a, b| {
                a.at.load
                    .cmp(&b.at.load)
                    .then(b.last_access.cmp(&a.last_access))
            });
        if let Some(best) = best {
            let hit = self
                .near_holder(tree, req, workers, loads, m, best.at.load)
                .unwrap_or(Hit {
                    idx: best.at.idx,
                    matched: m.matched_chars,
                    fallback: false,
                });
            return Lookup::Hit(hit);
        }
        // Every deepest holder is unavailable (or outside this pool): the
        // next-best match among the available workers. Rare, so the per-worker
        // query cost is acceptable here.
        let fallback = self
            .own_matches(tree, req, workers, m.input_chars, candidates.iter())
            .collect::<Vec<_>>();
        let deepest = fallback.iter().map(|f| f.matched).max().unwrap_or(0);
        // Within the granularity of the best match: least loaded, then deepest.
        let fallback = fallback
            .into_iter()
            .filter(|f| self.near(f.matched, deepest))
            .min_by(lighter_then_deeper);
        match fallback {
            Some(f) => Lookup::Hit(Hit {
                idx: f.at.idx,
                matched: f.matched,
                fallback: true,
            }),
            None => Lookup::Miss { matched: 0 },
        }
    }

    /// Whether a match of `matched` characters ties with one of `deepest`
    /// under `match_granularity_chars`.
    fn near(&self, matched: usize, deepest: usize) -> bool {
        matched.saturating_add(self.config.match_granularity_chars.max(1)) > deepest
    }

    /// A less-loaded worker than the best deepest holder (`holder_load`)
    /// whose match ties with the deepest one (`m`) under
    /// `match_granularity_chars`: least loaded, then deepest. Walks the tree
    /// once per less-loaded worker, so only when that can change the answer:
    /// a granularity above 1 and a holder above the minimum load.
    fn near_holder(
        &self,
        tree: &Tree,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
        loads: &Loads,
        m: &PrefixMatch,
        holder_load: usize,
    ) -> Option<Hit> {
        if self.config.match_granularity_chars <= 1 || holder_load <= loads.min {
            return None;
        }
        let lighter = loads.candidates.iter().filter(|c| c.load < holder_load);
        self.own_matches(tree, req, workers, m.input_chars, lighter)
            .filter(|f| self.near(f.matched, m.matched_chars))
            .min_by(lighter_then_deeper)
            .map(|f| Hit {
                idx: f.at.idx,
                matched: f.matched,
                fallback: false,
            })
    }

    /// Each candidate's own match of the request, keeping those above the
    /// cache threshold. One tree walk per candidate.
    fn own_matches<'a>(
        &'a self,
        tree: &'a Tree,
        req: &'a RequestView<'_>,
        workers: &'a [Arc<Worker>],
        input: usize,
        candidates: impl Iterator<Item = &'a Candidate> + 'a,
    ) -> impl Iterator<Item = OwnMatch> + 'a {
        candidates
            .map(move |&at| OwnMatch {
                at,
                matched: tree
                    .prefix_match_for(req.text, workers[at.idx].id().tenant())
                    .matched_chars,
            })
            .filter(move |f| self.above_threshold(f.matched, input))
    }

    fn above_threshold(&self, matched: usize, input: usize) -> bool {
        input > 0 && matched as f64 / input as f64 > self.config.cache_threshold
    }

    /// Whether the hot-spot rule lets a holder with `load` take a hit.
    fn hit_allowed(&self, load: usize, loads: &Loads) -> bool {
        match self.config.hot_spot {
            // (`predicted_ttft` decides in `by_ttft`, never here.)
            HotSpotRule::Off | HotSpotRule::PredictedTtft { .. } => true,
            HotSpotRule::RelativeCap { slack, factor } => {
                let cap = (loads.min + slack) as f64;
                let cap = cap.max(factor * loads.mean());
                load as f64 <= cap
            }
        }
    }

    /// Step 4: the slice index of the low-match target, and which it was.
    fn low_match(&self, tree: &Tree, workers: &[Arc<Worker>], loads: &Loads) -> (usize, Branch) {
        match self.config.low_match {
            LowMatchTarget::MinLoad => (
                loads.least_loaded(self.next_turn()),
                Branch::LowMatchMinLoad,
            ),
            LowMatchTarget::SmallestTree => {
                let sized: Vec<Footprint> = loads
                    .candidates
                    .iter()
                    .map(|&at| Footprint {
                        at,
                        tree_chars: tree.tenant_size(workers[at.idx].id().tenant()),
                    })
                    .collect();
                // Smallest tree, then least loaded; the remaining ties rotate.
                let rank = |f: &Footprint| (f.tree_chars, f.at.load);
                let best = sized.iter().map(rank).min().expect("non-empty");
                let ties: Vec<usize> = sized
                    .iter()
                    .filter(|f| rank(f) == best)
                    .map(|f| f.at.idx)
                    .collect();
                (
                    ties[self.next_turn() % ties.len()],
                    Branch::LowMatchSmallestTree,
                )
            }
        }
    }
}

/// Step 2 of the rule: `max - min > abs && max > rel * min`.
pub(crate) fn imbalanced(min_load: usize, max_load: usize, abs: usize, rel: f64) -> bool {
    max_load.saturating_sub(min_load) > abs && max_load as f64 > rel * min_load as f64
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn stagger(&self, start: usize) {
        self.turn.store(start, Ordering::Relaxed);
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        self.decide(self.name(), req, workers)
    }

    fn trees(&self) -> Option<&Trees> {
        Some(&self.trees)
    }

    fn correction(&self) -> Option<crate::CorrectionConfig> {
        Some(self.config.correction)
    }

    fn cost_model(&self) -> Option<&crate::CostModelConfig> {
        Some(&self.config.cost)
    }
}

impl CacheAware {
    /// A decision, explained as policy `name` (prefill_aware runs this
    /// code under its own name).
    pub(crate) fn decide(
        &self,
        name: &'static str,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let capped = RequestView {
            text: self.trees.cap(req.text),
            ..*req
        };
        let req = &capped;
        let loads = Loads::read(req, workers)?;
        let model = self.trees.model(req.model);
        if let HotSpotRule::PredictedTtft {
            margin,
            slack_ms,
            reuse_ms,
            overflow_margin,
            hot_share,
            hot_margin,
        } = self.config.hot_spot
        {
            let bound = TtftBound {
                margin,
                overflow_margin,
                slack_ms,
                reuse_ms,
                hot_share,
                hot_margin,
            };
            return Ok(self.by_ttft(name, req, workers, &loads, model, bound));
        }
        Ok(self.by_rule(name, req, workers, &loads, model))
    }

    /// The in-flight rules (`relative_cap`, `off`): DESIGN §1 as it was
    /// before the cost model, decision for decision. The guard still
    /// carries the cost model's prediction for the chosen worker, so the
    /// fit learns and the header shows it.
    fn by_rule(
        &self,
        name: &'static str,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
        loads: &Loads,
        Model { tree, truth }: Model,
    ) -> Decision {
        let choice = if self.is_imbalanced(loads.min, loads.max) {
            Choice {
                idx: loads.least_loaded(self.next_turn()),
                branch: Branch::Imbalanced,
                matched: None,
                input: 0,
            }
        } else {
            let m = tree.prefix_match(req.text);
            let input = m.input_chars;
            match self.find_hit(&tree, req, workers, loads, &m) {
                Lookup::Hit(hit) => {
                    let load = loads.load_of(hit.idx).unwrap_or(0);
                    if self.hit_allowed(load, loads) {
                        let branch = if hit.fallback {
                            Branch::CacheHitFallback
                        } else {
                            Branch::CacheHit
                        };
                        Choice {
                            idx: hit.idx,
                            branch,
                            matched: Some(hit.matched),
                            input,
                        }
                    } else {
                        let idx = loads.least_loaded(self.next_turn());
                        let matched = tree
                            .prefix_match_for(req.text, workers[idx].id().tenant())
                            .matched_chars;
                        Choice {
                            idx,
                            branch: Branch::HotSpotSpill,
                            matched: Some(matched),
                            input,
                        }
                    }
                }
                Lookup::Miss { matched } => {
                    let (idx, branch) = self.low_match(&tree, workers, loads);
                    Choice {
                        idx,
                        branch,
                        matched: Some(matched),
                        input,
                    }
                }
            }
        };
        let worker = &workers[choice.idx];
        // The chosen worker's work, for the cost model: the match the rule
        // saw, or (imbalanced: none was taken) the whole text uncached.
        let input = match choice.input {
            0 => radixgate_tree::count_chars(req.text),
            n => n,
        };
        let slot = worker.cost_slot(req.model);
        let work = Work {
            queued_chars: worker.routing_pending_prefill(),
            uncached_chars: input.saturating_sub(choice.matched.unwrap_or(0)),
            in_flight: loads.load_of(choice.idx).unwrap_or(0),
        };
        let ttft = worker
            .ttft_coefficients(slot, &self.config.cost)
            .predict_ms(work);
        let bound = self.config.correction.tree_bound(worker, &truth);
        let receipt = tree.insert_within(req.text, worker.id().tenant(), bound);
        truth.count_insert(bound, &receipt);
        let explanation = Explanation {
            matched_chars: choice.matched,
            input_chars: choice.input,
            ttft_ms: Some(ttft as f32),
            ..loads.explain(name, choice.branch, worker, choice.idx)
        };
        Decision::with_prediction(worker, slot, work, self.config.cost, explanation).with_insert(
            tree,
            receipt,
            req.text,
            Some(input),
            truth,
            self.config.correction,
        )
    }

    /// `worker`'s tree size for the smallest-tree target, counted no
    /// higher than the low watermark of its cache bound (at the decision's
    /// `rate`, from
    /// [`CorrectionConfig::bound_rate`](crate::CorrectionConfig::bound_rate)):
    /// a worker whose cache is full has no more room than another full
    /// one, whatever the last eviction left, so among full workers the
    /// least loaded, then the quickest, takes a new prompt.
    fn footprint(&self, tree: &Tree, worker: &Worker, rate: Option<f64>) -> usize {
        let size = tree.tenant_size(worker.id().tenant());
        self.full_from(worker, rate)
            .map_or(size, |full| size.min(full))
    }

    /// The share of the tree from which `worker`'s cache counts as full:
    /// the low watermark of its cache bound at `rate`; `None` while its
    /// size or the model's characters per token is unknown.
    fn full_from(&self, worker: &Worker, rate: Option<f64>) -> Option<usize> {
        let bound = self.config.correction.bound_at(worker, rate)?;
        Some(radixgate_tree::low_watermark(bound))
    }

    /// The `predicted_ttft` rule (module doc, "Cost model").
    fn by_ttft(
        &self,
        name: &'static str,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
        loads: &Loads,
        Model { tree, truth }: Model,
        bound: TtftBound,
    ) -> Decision {
        let cost = &self.config.cost;
        let tm = tree.tenant_matches(req.text, self.config.match_granularity_chars.max(1));
        let input = tm.input_chars;
        // Built in place: a few hundred bytes per worker, moved once less.
        let mut scored: SmallVec<[Scored; 16]> = SmallVec::new();
        // The candidates and the tree's holders are both in id order when
        // the pool comes from the registry: then one merge finds each
        // worker's own match, else a search per worker.
        let in_order = loads.candidates.is_sorted_by_key(|c| workers[c.idx].id());
        let mut holders = tm.tenants.iter().peekable();
        let mut fitted = 0usize;
        let mut deepest = 0;
        // A text still being computed is not in its engine's events yet.
        // While a second copy would evict something else, the worker
        // computing it counts as holding it (`Self::copies_evict`).
        let computing_holds =
            req.exact.is_some() && self.copies_evict(&tree, &truth, workers, loads);
        for &at in &loads.candidates {
            let w = &workers[at.idx];
            let tenant = w.id().tenant();
            let own = if in_order {
                while holders.next_if(|h| h.tenant < tenant).is_some() {}
                holders.next_if(|h| h.tenant == tenant)
            } else {
                tm.get(tenant)
            };
            let slot = w.cost_slot(req.model);
            let fit = w.ttft_fit(slot);
            fitted += usize::from(fit.is_some());
            // A live event stream's exact match, else the tree's guess.
            let exact = req.exact.and_then(|e| e.chars(w.id(), input));
            let guess = own.map_or(0, |o| o.matched_chars);
            let matched = match exact {
                Some(e)
                    if computing_holds
                        && guess > e
                        && own.is_some_and(|o| truth.in_flight_at(tenant, o.last_access)) =>
                {
                    guess
                }
                Some(e) => e,
                None => guess,
            };
            deepest = deepest.max(matched);
            scored.push(Scored {
                at,
                matched,
                exact: exact.is_some_and(|e| e == matched),
                guess,
                last_access: own.map_or(0, |o| o.last_access),
                slot,
                work: Work {
                    queued_chars: w.routing_pending_prefill(),
                    uncached_chars: input - matched,
                    in_flight: at.load,
                },
                fitted: fit.is_some(),
                coefficients: fit.unwrap_or_default(),
                ttft_ms: 0.0,
            });
        }
        // A worker that has not answered yet is taken to be like its
        // answered peers (the mean of their fits), or the seed while none
        // has: a new worker gets traffic and is measured.
        if fitted < scored.len() {
            let stand_in =
                Coefficients::mean(scored.iter().filter(|s| s.fitted).map(|s| s.coefficients))
                    .unwrap_or_else(|| cost.seed());
            for s in scored.iter_mut().filter(|s| !s.fitted) {
                s.coefficients = stand_in;
            }
        }
        // The predictions, the quickest worker (the first of equals) and
        // the least prediction of the others (the header's alternative when
        // the quickest is chosen), in one pass.
        let mut q = 0;
        let mut runner_up: Option<f64> = None;
        for j in 0..scored.len() {
            let t = scored[j].coefficients.predict_ms(scored[j].work);
            scored[j].ttft_ms = t;
            if j > 0 {
                let lead = scored[q].ttft_ms;
                let other = if t.total_cmp(&lead).is_lt() {
                    q = j;
                    lead
                } else {
                    t
                };
                runner_up = Some(runner_up.map_or(other, |m| m.min(other)));
            }
        }
        let quickest = &scored[q];
        let best = quickest.ttft_ms;
        // While the caches overflow a tree's hit is worth less than it
        // looks; matches from a live event stream are the engine's own.
        let margin = if req.exact.is_none() && truth.overflowing() {
            bound.overflow_margin
        } else {
            bound.margin
        };
        let bar = best * (1.0 + margin) + bound.slack_ms;
        let (k, branch) = if self.is_imbalanced(loads.min, loads.max) {
            let k = req
                .exact
                .and_then(|_| self.relief_holder(&scored, loads.max, input))
                .unwrap_or_else(|| {
                    let idx = loads.least_loaded(self.next_turn());
                    scored
                        .iter()
                        .position(|s| s.at.idx == idx)
                        .expect("a candidate")
                });
            (k, Branch::Imbalanced)
        } else {
            if self.above_threshold(deepest, input) {
                // The holders: every worker whose match ties with the
                // deepest available one under the granularity; the
                // quickest of them (the first of equals), then the most
                // recent. Counted on the way, for the hot test.
                let mut first: Option<usize> = None;
                let mut holders = 0usize;
                for (j, s) in scored.iter().enumerate() {
                    if !self.near(s.matched, deepest) {
                        continue;
                    }
                    holders += 1;
                    let ahead = first.is_none_or(|f| {
                        let h = &scored[f];
                        s.ttft_ms
                            .total_cmp(&h.ttft_ms)
                            .then(h.last_access.cmp(&s.last_access))
                            .is_lt()
                    });
                    if ahead {
                        first = Some(j);
                    }
                }
                let k = first.expect("the deepest is among them");
                // A hot match spreads (below). (A share of 0, most
                // matches', is never hot.)
                let hot = bound.hot_share > 0.0
                    && bound.hot_share * tm.share * scored.len() as f64 >= holders as f64;
                // (With exact matches the tree's deepest is no yardstick:
                // a hit is a hit.)
                let hit = if deepest < tm.matched_chars && req.exact.is_none() {
                    Branch::CacheHitFallback
                } else {
                    Branch::CacheHit
                };
                if hot {
                    // The least-loaded worker nearly as quick as the best
                    // (a holder before a non-holder, then the quicker): a
                    // spill costs the short prefix once, piling costs every
                    // request on the busier worker.
                    let cap = best * (1.0 + bound.hot_margin);
                    let k = self.quickest(
                        &scored,
                        |s| s.ttft_ms <= cap,
                        |s| (s.at.load, usize::from(!self.near(s.matched, deepest))),
                    );
                    let branch = if self.near(scored[k].matched, deepest) {
                        hit
                    } else {
                        Branch::HotSpotSpill
                    };
                    (k, branch)
                } else if scored[k].ttft_ms <= bar + bound.spill_cost_ms(quickest, &scored[k]) {
                    (k, hit)
                } else {
                    let k = self.quickest(&scored, |_| true, |s| (0, s.at.load));
                    (k, Branch::HotSpotSpill)
                }
            } else {
                let fast = |s: &Scored| s.ttft_ms <= bar;
                // With exact matches nobody holds the text now. Where the
                // tree last sent it, its requests keep going: computing it
                // again there (if that worker is as quick as the best)
                // keeps one copy instead of spreading it over the pool.
                let affinity = req
                    .exact
                    .and_then(|_| {
                        scored
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| fast(s) && self.above_threshold(s.guess, input))
                            .max_by_key(|(_, s)| (s.guess, s.last_access))
                    })
                    .map(|(k, _)| (k, Branch::LowMatchAffinity));
                if let Some(choice) = affinity {
                    choice
                } else {
                    match self.config.low_match {
                        LowMatchTarget::MinLoad => (
                            self.quickest(&scored, fast, |s| (s.at.load, 0)),
                            Branch::LowMatchMinLoad,
                        ),
                        LowMatchTarget::SmallestTree => {
                            let rate = self.config.correction.bound_rate(&truth);
                            (
                                self.quickest(&scored, fast, |s| {
                                    (self.footprint(&tree, &workers[s.at.idx], rate), s.at.load)
                                }),
                                Branch::LowMatchSmallestTree,
                            )
                        }
                    }
                }
            }
        };
        let chosen = &scored[k];
        let alt = if k == q { runner_up } else { Some(best) };
        let worker = &workers[chosen.at.idx];
        let bound = self.config.correction.tree_bound(worker, &truth);
        let receipt = tree.insert_matched_within(req.text, worker.id().tenant(), &tm, bound);
        truth.count_insert(bound, &receipt);
        let explanation = Explanation {
            matched_chars: Some(chosen.matched),
            input_chars: input,
            ttft_ms: Some(chosen.ttft_ms as f32),
            alt_ttft_ms: alt.map(|v| v as f32),
            exact: chosen.exact,
            ..loads.explain(name, branch, worker, chosen.at.idx)
        };
        Decision::with_prediction(worker, chosen.slot, chosen.work, *cost, explanation).with_insert(
            tree,
            receipt,
            req.text,
            Some(input),
            truth,
            self.config.correction,
        )
    }

    /// Whether, with live event streams, a second copy of a text costs a
    /// cached one elsewhere: the model's caches overflow
    /// ([`ModelTruth::overflowing`](crate::policy::ModelTruth::overflowing)),
    /// or every candidate's share of the tree has reached its cache's low
    /// watermark (sizes known). A request's text is then best sent where
    /// it is being computed, however busy that worker looks with the text
    /// counted uncached there: the engine's events report a prefill only
    /// once it is done, so the request would be predicted to compute it a
    /// second time on the worker already computing it, and spilled. On a
    /// pool whose caches have room the spill is a cheap replica and stays.
    fn copies_evict(
        &self,
        tree: &Tree,
        truth: &crate::policy::ModelTruth,
        workers: &[Arc<Worker>],
        loads: &Loads,
    ) -> bool {
        if truth.overflowing() {
            return true;
        }
        let Some(rate) = self.config.correction.bound_rate(truth) else {
            return false;
        };
        loads.candidates.iter().all(|c| {
            let w = &workers[c.idx];
            self.full_from(w, Some(rate))
                .is_some_and(|full| tree.tenant_size(w.id().tenant()) >= full)
        })
    }

    /// The safety net's target with live event streams: among the workers
    /// whose load alone is imbalanced against the busiest's (`max_load`),
    /// the least loaded of those whose match is the deepest, if that is
    /// above the cache threshold. The match is the engine's or, where
    /// deeper, the tree's guess: a copy still being computed is in the
    /// tree before the engine's events report it, and the next request for
    /// the same text is better sent where it is being computed than to
    /// start a whole prefill on one more worker. A guess of a copy since
    /// evicted costs what the shortest queue would: a whole prefill on a
    /// worker far below the busiest. Index into `scored`.
    fn relief_holder(&self, scored: &[Scored], max_load: usize, input: usize) -> Option<usize> {
        let held = |s: &Scored| s.matched.max(s.guess);
        let relief = || {
            scored
                .iter()
                .enumerate()
                .filter(|(_, s)| self.is_imbalanced(s.at.load, max_load))
        };
        let deepest = relief().map(|(_, s)| held(s)).max()?;
        if !self.above_threshold(deepest, input) {
            return None;
        }
        relief()
            .filter(|(_, s)| self.near(held(s), deepest))
            // least loaded, then most recent
            .min_by(|(_, a), (_, b)| {
                a.at.load
                    .cmp(&b.at.load)
                    .then(b.last_access.cmp(&a.last_access))
            })
            .map(|(k, _)| k)
    }

    /// Among the scored workers that pass `keep`, the one ranked first by
    /// `key`, then by least predicted TTFT; exact ties rotate. Index into
    /// `scored`; `keep` must pass at least the quickest worker.
    fn quickest(
        &self,
        scored: &[Scored],
        keep: impl Fn(&Scored) -> bool,
        key: impl Fn(&Scored) -> (usize, usize),
    ) -> usize {
        let rank = |keep: &dyn Fn(&Scored) -> bool| -> Vec<(usize, (usize, usize), f64)> {
            scored
                .iter()
                .enumerate()
                .filter(|(_, s)| keep(s))
                .map(|(k, s)| (k, key(s), s.ttft_ms))
                .collect()
        };
        let mut ranked = rank(&keep);
        if ranked.is_empty() {
            // Only if a prediction were not a number (the quickest passes
            // any bar): every worker then ranks, rather than none.
            ranked = rank(&|_| true);
        }
        let Some(first) = ranked
            .iter()
            .min_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)))
        else {
            return 0;
        };
        let ties: Vec<usize> = ranked
            .iter()
            .filter(|r| r.1 == first.1 && r.2 == first.2)
            .map(|r| r.0)
            .collect();
        ties[self.next_turn() % ties.len()]
    }
}

/// Orders own matches that tie under the granularity: least loaded first,
/// then the deeper match.
fn lighter_then_deeper(a: &OwnMatch, b: &OwnMatch) -> CmpOrdering {
    a.at.load.cmp(&b.at.load).then(b.matched.cmp(&a.matched))
}
