//! cache_aware: send a request to the worker most likely to hold its prefix,
//! unless that unbalances the pool. The rule is DESIGN §1, step by step:
//!
//! 1. over the **available** workers of the pool: `min_load`, `max_load`;
//! 2. imbalanced iff `max - min > balance_abs_threshold` and
//!    `max > balance_rel_threshold * min` → shortest queue;
//! 3. otherwise longest-prefix match in the model's tree; if
//!    `matched / input > cache_threshold` → the deepest holder (ties: least
//!    loaded, then most recent; never slice order). With
//!    `match_granularity_chars` G > 1, a worker whose match is shorter than
//!    the deepest by less than G characters ties too (a KV cache reuses
//!    whole pages, so a few more matched characters save nothing): least
//!    loaded wins, then the deeper match. If every deepest holder
//!    is unavailable, the best match among available workers, if still above
//!    the threshold. A holder over the hot-spot cap (below) gives way to the
//!    least-loaded worker;
//! 4. otherwise the low-match target: least loaded, or smallest tree
//!    (configurable), ties rotating;
//! 5. always insert the text for the chosen worker.
//!
//! Hot-spot rule ([`HotSpotRule::RelativeCap`]): a hit is taken only if the
//! holder's load is at most `max(min_load + slack, factor * mean_load)`.
//! Otherwise the least-loaded worker takes the request and, since the text
//! is inserted for it, becomes a second holder of the hot prefix; later
//! requests for that prefix then split between the holders by load. Affinity
//! survives (hits stay on holders) while no worker runs far above the mean.
//!
//! State: one [`Tree`] per pool key, created on first use (see `trees.rs`
//! for the map's concurrency), plus a rotating counter for ties. Unhealthy
//! workers keep their tree records; removed workers' records are dropped (a
//! returning worker gets a new id). Per decision: one tree match, one insert,
//! one pass over the pool's loads; per-worker matches only when every deepest
//! holder is unavailable, or when `match_granularity_chars` > 1 and the best
//! deepest holder runs above the pool's minimum load (then one per less-loaded
//! worker).

use super::trees::Trees;
use super::{Branch, Decision, Explanation, Loads, Policy};
use crate::config::{CacheAwareConfig, HotSpotRule, LowMatchTarget};
use crate::{RequestView, RoutingError, Worker, WorkerId};
use radixgate_tree::Tree;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The cache-aware policy.
#[derive(Debug)]
pub struct CacheAware {
    config: CacheAwareConfig,
    trees: Trees,
    turn: AtomicUsize,
}

/// What step 3 found: a holder and how much of the text it holds.
struct Hit {
    idx: usize,
    matched: usize,
    fallback: bool,
}

impl CacheAware {
    /// A cache-aware policy. The config should have passed
    /// [`CacheAwareConfig::validate`] ([`PolicyConfig::build`] does that).
    ///
    /// [`PolicyConfig::build`]: crate::PolicyConfig::build
    pub fn new(config: CacheAwareConfig) -> Self {
        Self {
            trees: Trees::new(config.max_total_chars),
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

    /// Step 3: the deepest available holder, or the best available match.
    fn find_hit(
        &self,
        tree: &Tree,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
        loads: &Loads,
    ) -> (usize, usize, Option<Hit>) {
        let m = tree.prefix_match(req.text);
        let input = m.input_chars;
        if !self.above_threshold(m.matched_chars, input) {
            return (m.matched_chars, input, None);
        }
        // Available holders of the deepest node, by slice index. Pools from
        // the registry are in id order, so a binary search finds a tenant;
        // any other slice falls back to a linear scan.
        let sorted = loads.entries.is_sorted_by_key(|&(i, _)| workers[i].id());
        let lookup = |id: WorkerId| -> Option<(usize, usize)> {
            if sorted {
                loads
                    .entries
                    .binary_search_by_key(&id, |&(i, _)| workers[i].id())
                    .ok()
                    .map(|k| loads.entries[k])
            } else {
                loads
                    .entries
                    .iter()
                    .find(|&&(i, _)| workers[i].id() == id)
                    .copied()
            }
        };
        let best = m
            .tenants
            .iter()
            .filter_map(|hit| {
                lookup(WorkerId(hit.tenant.0)).map(|(idx, load)| (load, hit.last_access, idx))
            })
            // least loaded, then most recent
            .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        if let Some((load, _, idx)) = best {
            let hit = self
                .near_holder(tree, req, workers, loads, (m.matched_chars, input), load)
                .unwrap_or(Hit {
                    idx,
                    matched: m.matched_chars,
                    fallback: false,
                });
            return (m.matched_chars, input, Some(hit));
        }
        // Every deepest holder is unavailable (or outside this pool): the
        // next-best match among the available workers. Rare, so the per-worker
        // query cost is acceptable here.
        let fallback = self
            .own_matches(tree, req, workers, input, loads.entries.iter())
            .collect::<Vec<_>>();
        let deepest = fallback.iter().map(|f| f.0).max().unwrap_or(0);
        // Within the granularity of the best match: least loaded, then deepest.
        let fallback = fallback
            .into_iter()
            .filter(|&(matched, _, _)| self.near(matched, deepest))
            .min_by(lighter_then_deeper);
        let matched = fallback.map_or(0, |f| f.0);
        (
            matched,
            input,
            fallback.map(|(matched, _, idx)| Hit {
                idx,
                matched,
                fallback: true,
            }),
        )
    }

    /// Whether a match of `matched` characters ties with one of `deepest`
    /// under `match_granularity_chars`.
    fn near(&self, matched: usize, deepest: usize) -> bool {
        matched.saturating_add(self.config.match_granularity_chars.max(1)) > deepest
    }

    /// A less-loaded worker than the best deepest holder (`holder_load`)
    /// whose match ties with the deepest one (`deepest` of `input`
    /// characters) under `match_granularity_chars`: least loaded, then
    /// deepest. Walks the tree once per less-loaded worker, so only when
    /// that can change the answer: a granularity above 1 and a holder above
    /// the minimum load.
    fn near_holder(
        &self,
        tree: &Tree,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
        loads: &Loads,
        (deepest, input): (usize, usize),
        holder_load: usize,
    ) -> Option<Hit> {
        if self.config.match_granularity_chars <= 1 || holder_load <= loads.min {
            return None;
        }
        let lighter = loads
            .entries
            .iter()
            .filter(|&&(_, load)| load < holder_load);
        self.own_matches(tree, req, workers, input, lighter)
            .filter(|&(matched, _, _)| self.near(matched, deepest))
            .min_by(lighter_then_deeper)
            .map(|(matched, _, idx)| Hit {
                idx,
                matched,
                fallback: false,
            })
    }

    /// Each candidate's (slice index, load) with its own match of the
    /// request, as (matched chars, load, slice index), keeping those above
    /// the cache threshold. One tree walk per candidate.
    fn own_matches<'a>(
        &'a self,
        tree: &'a Tree,
        req: &'a RequestView<'_>,
        workers: &'a [Arc<Worker>],
        input: usize,
        candidates: impl Iterator<Item = &'a (usize, usize)> + 'a,
    ) -> impl Iterator<Item = (usize, usize, usize)> + 'a {
        candidates
            .map(move |&(idx, load)| {
                let tm = tree.prefix_match_for(req.text, workers[idx].id().tenant());
                (tm.matched_chars, load, idx)
            })
            .filter(move |&(matched, _, _)| self.above_threshold(matched, input))
    }

    fn above_threshold(&self, matched: usize, input: usize) -> bool {
        input > 0 && matched as f64 / input as f64 > self.config.cache_threshold
    }

    /// Whether the hot-spot rule lets a holder with `load` take a hit.
    fn hit_allowed(&self, load: usize, loads: &Loads) -> bool {
        match self.config.hot_spot {
            HotSpotRule::Off => true,
            HotSpotRule::RelativeCap { slack, factor } => {
                let cap = (loads.min + slack) as f64;
                let cap = cap.max(factor * loads.mean());
                load as f64 <= cap
            }
        }
    }

    fn low_match(&self, tree: &Tree, workers: &[Arc<Worker>], loads: &Loads) -> (usize, Branch) {
        match self.config.low_match {
            LowMatchTarget::MinLoad => (
                loads.least_loaded(self.next_turn()),
                Branch::LowMatchMinLoad,
            ),
            LowMatchTarget::SmallestTree => {
                let sized: Vec<(usize, usize, usize)> = loads
                    .entries
                    .iter()
                    .map(|&(i, load)| (tree.tenant_size(workers[i].id().tenant()), load, i))
                    .collect();
                let best = sized.iter().map(|e| (e.0, e.1)).min().expect("non-empty");
                let ties: Vec<usize> = sized
                    .iter()
                    .filter(|e| (e.0, e.1) == best)
                    .map(|e| e.2)
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

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let loads = Loads::read(req, workers)?;
        let tree = self.tree_or_create(req.model);
        let (idx, branch, matched, input) = if self.is_imbalanced(loads.min, loads.max) {
            let idx = loads.least_loaded(self.next_turn());
            (idx, Branch::Imbalanced, None, 0)
        } else {
            match self.find_hit(&tree, req, workers, &loads) {
                (_, input, Some(hit)) => {
                    let load = loads.load_of(hit.idx).unwrap_or(0);
                    if self.hit_allowed(load, &loads) {
                        let branch = if hit.fallback {
                            Branch::CacheHitFallback
                        } else {
                            Branch::CacheHit
                        };
                        (hit.idx, branch, Some(hit.matched), input)
                    } else {
                        let idx = loads.least_loaded(self.next_turn());
                        let matched = tree
                            .prefix_match_for(req.text, workers[idx].id().tenant())
                            .matched_chars;
                        (idx, Branch::HotSpotSpill, Some(matched), input)
                    }
                }
                (matched, input, None) => {
                    let (idx, branch) = self.low_match(&tree, workers, &loads);
                    (idx, branch, Some(matched), input)
                }
            }
        };
        let worker = &workers[idx];
        tree.insert(req.text, worker.id().tenant());
        let explanation = Explanation {
            matched_chars: matched,
            input_chars: input,
            ..loads.explain(self.name(), branch, worker, idx)
        };
        Ok(Decision::new(worker, explanation))
    }

    fn on_worker_removed(&self, worker: &Worker) {
        self.trees.remove_tenant(worker.id().tenant());
    }

    fn evict_now(&self) -> usize {
        self.trees.evict(self.config.max_tree_size)
    }

    fn eviction_interval(&self) -> Option<Duration> {
        (self.config.eviction_interval_secs > 0)
            .then(|| Duration::from_secs(self.config.eviction_interval_secs))
    }

    fn cached_chars(&self, worker: WorkerId) -> Option<usize> {
        Some(self.trees.tenant_chars(worker.tenant()))
    }
}

/// Orders (matched chars, load, slice index) candidates whose matches tie:
/// least loaded first, then the deeper match.
fn lighter_then_deeper(a: &(usize, usize, usize), b: &(usize, usize, usize)) -> std::cmp::Ordering {
    a.1.cmp(&b.1).then(b.0.cmp(&a.0))
}
