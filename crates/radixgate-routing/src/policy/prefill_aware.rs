//! prefill_aware: choose the worker that would start this request soonest,
//! weighing each worker by the prefill work it would have to do.
//!
//! DESIGN §4: the prize is TTFT at an equal hit rate. For every available
//! worker `w` of the pool:
//!
//! ```text
//! cost(w) = (input_chars - matched_chars(w))     this request's uncached prompt
//!         + pending_prefill(w)                   uncached prompt already queued there
//!         + load(w) * load_cost_chars            each running request slows the batch
//! ```
//!
//! and the cheapest worker wins (ties: less loaded, then rotating). A hot
//! prefix therefore stays on its holder only while the holder's queue costs
//! less than prefilling the prefix elsewhere; then it is replicated. The
//! uncached part of the chosen worker is carried by the load guard until the
//! first token (`LoadGuard::prefill_done`) or the end of the request.
//!
//! Cost: one tree match, plus one per-worker match for workers that are not
//! among the deepest holders (O(workers × matched length)) — meant for pools
//! of tens of workers; cache_aware stays the O(1)-in-workers choice. This is
//! a separate policy so the simulator (issue 6) can compare it with
//! cache_aware on TTFT; its parameter is a first guess to be tuned there.

use super::trees::TreeUpkeep;
use super::{Branch, Candidate, Decision, Explanation, Loads, Policy, Trees};
use crate::config::PrefillAwareConfig;
use crate::{RequestView, RoutingError, Worker};
use radixgate_tree::Tree;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The prefill-cost policy.
#[derive(Debug)]
pub struct PrefillAware {
    config: PrefillAwareConfig,
    trees: Trees,
    turn: AtomicUsize,
}

/// One available worker's predicted prefill work for the request.
struct Scored {
    /// The worker and its load.
    at: Candidate,
    /// Characters of the request text it already holds.
    matched: usize,
    /// The cost of the module doc's formula, in characters.
    cost: usize,
}

impl PrefillAware {
    /// A prefill-cost policy (config validated by
    /// [`PrefillAwareConfig::validate`]).
    pub fn new(config: PrefillAwareConfig) -> Self {
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

    /// The tree of a pool key, if a request for it was routed.
    pub fn tree(&self, model: &str) -> Option<Arc<Tree>> {
        self.trees.get(model)
    }
}

impl Policy for PrefillAware {
    fn name(&self) -> &'static str {
        "prefill_aware"
    }

    fn select(
        &self,
        req: &RequestView<'_>,
        workers: &[Arc<Worker>],
    ) -> Result<Decision, RoutingError> {
        let capped = RequestView {
            text: self.trees.cap(req.text),
            ..*req
        };
        let req = &capped;
        let loads = Loads::read(req, workers)?;
        let tree = self.trees.get_or_create(req.model);
        let m = tree.prefix_match(req.text);
        let input = m.input_chars;
        let mut holders: Vec<u32> = m.tenants.iter().map(|h| h.tenant.0).collect();
        holders.sort_unstable();
        let scored: Vec<Scored> = loads
            .candidates
            .iter()
            .map(|&at| {
                let w = &workers[at.idx];
                let matched = if m.matched_chars == 0 {
                    0
                } else if holders.binary_search(&w.id().0).is_ok() {
                    m.matched_chars
                } else {
                    tree.prefix_match_for(req.text, w.id().tenant())
                        .matched_chars
                };
                let cost = (input - matched)
                    .saturating_add(w.pending_prefill())
                    .saturating_add(at.load.saturating_mul(self.config.load_cost_chars));
                Scored { at, matched, cost }
            })
            .collect();
        // Cheapest, then least loaded; the remaining ties rotate.
        let rank = |s: &Scored| (s.cost, s.at.load);
        let best = scored.iter().map(rank).min().expect("non-empty");
        let ties: Vec<&Scored> = scored.iter().filter(|s| rank(s) == best).collect();
        let chosen = ties[self.turn.fetch_add(1, Ordering::Relaxed) % ties.len()];
        let (idx, matched) = (chosen.at.idx, chosen.matched);
        let worker = &workers[idx];
        let receipt = tree.insert(req.text, worker.id().tenant());
        let explanation = Explanation {
            matched_chars: Some(matched),
            input_chars: input,
            ..loads.explain(self.name(), Branch::PrefillCost, worker, idx)
        };
        Ok(Decision::with_prefill(worker, input - matched, explanation)
            .with_insert(tree, receipt, req.text))
    }

    fn trees(&self) -> Option<&Trees> {
        Some(&self.trees)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{hold, workers};
    use super::*;
    use crate::LoadGuard;

    fn policy() -> PrefillAware {
        PrefillAware::new(PrefillAwareConfig {
            load_cost_chars: 10,
            ..PrefillAwareConfig::default()
        })
    }

    fn route(p: &PrefillAware, ws: &[Arc<Worker>], text: &str) -> Decision {
        p.select(&RequestView::new("m", text), ws).unwrap()
    }

    #[test]
    fn the_holder_wins_until_its_queued_prefill_outweighs_a_miss() {
        let p = policy();
        let ws = workers(3);
        let prompt = "x".repeat(1000);
        let tree = p.trees.get_or_create("m");
        tree.insert(&prompt, ws[1].id().tenant());
        let d = route(&p, &ws, &format!("{prompt}?"));
        assert_eq!(d.worker().id(), ws[1].id());
        assert_eq!(d.explanation().branch, Branch::PrefillCost);
        assert_eq!(d.explanation().matched_chars, Some(1000));
        assert_eq!(ws[1].pending_prefill(), 1, "one uncached char predicted");
        drop(d);
        // 1,500 chars of queued prefill on the holder: a full miss elsewhere
        // (1,001 chars) is cheaper.
        let mut queued = LoadGuard::with_prefill(ws[1].clone(), 1500);
        let d = route(&p, &ws, &format!("{prompt}!"));
        assert_ne!(d.worker().id(), ws[1].id());
        assert_eq!(d.explanation().matched_chars, Some(0));
        assert_eq!(d.worker().pending_prefill(), 1001);
        drop(d);
        // Once that prefill is done, the holder is the cheapest again for a
        // text only it holds (it still has one request in flight: cost 10).
        let only_holder = "z".repeat(1000);
        tree.insert(&only_holder, ws[1].id().tenant());
        queued.prefill_done();
        assert_eq!(ws[1].pending_prefill(), 0);
        assert_eq!(route(&p, &ws, &only_holder).worker().id(), ws[1].id());
        drop(queued);
    }

    #[test]
    fn in_flight_load_counts_and_ties_rotate() {
        let p = policy();
        let ws = workers(2);
        let _busy = hold(&ws[0], 3);
        // No match anywhere: equal prefill, worker 0 costs 3 * 10 more.
        assert_eq!(route(&p, &ws, "abc").worker().id(), ws[1].id());
        let idle = workers(4);
        let mut seen = [0usize; 4];
        for i in 0..8 {
            seen[route(&p, &idle, &format!("{i}-distinct")).worker().id().0 as usize] += 1;
        }
        assert_eq!(seen, [2, 2, 2, 2]);
    }

    #[test]
    fn unavailable_workers_are_never_chosen() {
        let p = policy();
        let ws = workers(2);
        p.trees
            .get_or_create("m")
            .insert("held text", ws[0].id().tenant());
        ws[0].set_healthy(false);
        for _ in 0..5 {
            assert_eq!(route(&p, &ws, "held text").worker().id(), ws[1].id());
        }
        ws[1].set_healthy(false);
        assert!(p.select(&RequestView::new("m", "x"), &ws).is_err());
    }
}
