//! What the request path hands the dashboard while someone watches: the
//! last [`RECENT`] answered requests with their decisions, and per worker
//! the characters the prefix tree predicted cached (a hit rate for workers
//! that report no `cached_tokens`).
//!
//! One `parking_lot::Mutex`, held for one push or one drain (never across
//! `.await`); nobody takes it while nobody watches. A plain lock, not a
//! lock-free queue: it is taken once per answered request only while a
//! page is open, and once a second by the sampler.

use hashbrown::HashMap;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::VecDeque;

/// Answered requests kept for the page.
pub(crate) const RECENT: usize = 50;

/// One answered request, as the page lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Answered {
    /// When its response ended, milliseconds since the Unix epoch.
    pub(crate) at_ms: u64,
    /// The route it came in on.
    pub(crate) route: &'static str,
    /// The pool's model (`None`: the wildcard pool).
    pub(crate) model: Option<String>,
    /// The HTTP status the client got.
    pub(crate) status: u16,
    /// `x-radixgate-worker`: the worker's URL.
    pub(crate) worker: String,
    /// `x-radixgate-decision`: the decision's explanation.
    pub(crate) decision: String,
    /// The branch of the policy that decided.
    pub(crate) branch: &'static str,
    /// Time to first token, milliseconds (streamed answers only).
    pub(crate) ttft_ms: Option<f64>,
    /// Arrival to end of body, milliseconds.
    pub(crate) latency_ms: f64,
    /// How the body ended: `complete`, `upstream_error`, `client_gone`,
    /// `shutdown`, `timed_out`.
    pub(crate) end: &'static str,
}

/// Characters the tree matched against those routed, summed over a
/// worker's answers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Predicted {
    /// Matched characters of the routed texts.
    pub(crate) matched_chars: u64,
    /// Characters of the routed texts.
    pub(crate) input_chars: u64,
}

impl Predicted {
    /// Adds `other`'s characters.
    pub(crate) fn add(&mut self, other: Predicted) {
        self.matched_chars += other.matched_chars;
        self.input_chars += other.input_chars;
    }

    /// Matched over routed characters, when any were routed.
    pub(crate) fn rate(&self) -> Option<f64> {
        (self.input_chars > 0).then(|| self.matched_chars as f64 / self.input_chars as f64)
    }
}

/// The ring and the per-worker predictions since the last drain.
#[derive(Debug, Default)]
pub(crate) struct Recent(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// Oldest first, at most [`RECENT`].
    ring: VecDeque<Answered>,
    /// By worker URL, since the last [`Recent::drain`].
    predicted: HashMap<String, Predicted>,
}

impl Recent {
    /// Keeps `answered`, dropping the oldest beyond [`RECENT`], and adds
    /// the decision's `(matched, input)` characters to its worker's count.
    pub(crate) fn push(&self, answered: Answered, matched: Option<(usize, usize)>) {
        let mut inner = self.0.lock();
        if let Some((matched, input)) = matched {
            let add = Predicted {
                matched_chars: matched.min(input) as u64,
                input_chars: input as u64,
            };
            match inner.predicted.get_mut(answered.worker.as_str()) {
                Some(p) => p.add(add),
                None => {
                    inner.predicted.insert(answered.worker.clone(), add);
                }
            }
        }
        if inner.ring.len() == RECENT {
            inner.ring.pop_front();
        }
        inner.ring.push_back(answered);
    }

    /// The kept answers, newest first, and the predictions since the last
    /// drain (which start again from nothing).
    pub(crate) fn drain(&self) -> (Vec<Answered>, HashMap<String, Predicted>) {
        let mut inner = self.0.lock();
        let ring = inner.ring.iter().rev().cloned().collect();
        (ring, std::mem::take(&mut inner.predicted))
    }

    /// Forgets everything (nobody watches any more).
    pub(crate) fn clear(&self) {
        let mut inner = self.0.lock();
        inner.ring = VecDeque::new();
        inner.predicted = HashMap::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(i: u64, worker: &str) -> Answered {
        Answered {
            at_ms: i,
            route: "/v1/chat/completions",
            model: Some("m".into()),
            status: 200,
            worker: worker.into(),
            decision: format!("cache_aware branch=cache_hit worker={worker}"),
            branch: "cache_hit",
            ttft_ms: Some(1.5),
            latency_ms: 3.0,
            end: "complete",
        }
    }

    #[test]
    fn keeps_the_newest_answers_newest_first() {
        let recent = Recent::default();
        for i in 0..(RECENT as u64 + 7) {
            recent.push(answered(i, "w"), None);
        }
        let (ring, _) = recent.drain();
        assert_eq!(ring.len(), RECENT);
        assert_eq!(ring[0].at_ms, RECENT as u64 + 6);
        assert_eq!(ring[RECENT - 1].at_ms, 7);
        // A drain leaves the ring for the next one.
        assert_eq!(recent.drain().0, ring);
        recent.clear();
        assert!(recent.drain().0.is_empty());
    }

    #[test]
    fn predictions_sum_per_worker_until_drained() {
        let recent = Recent::default();
        recent.push(answered(1, "a"), Some((30, 100)));
        recent.push(answered(2, "a"), Some((70, 100)));
        recent.push(answered(3, "b"), Some((5, 10)));
        // Policies that match nothing, and more matched than routed.
        recent.push(answered(4, "c"), None);
        recent.push(answered(5, "d"), Some((50, 40)));
        let (_, predicted) = recent.drain();
        assert_eq!(predicted["a"].rate(), Some(0.5));
        assert_eq!(predicted["b"].rate(), Some(0.5));
        assert!(!predicted.contains_key("c"));
        assert_eq!(predicted["d"].rate(), Some(1.0));
        assert!(recent.drain().1.is_empty());
        assert_eq!(Predicted::default().rate(), None);
    }
}
