//! The in-flight load handle.
//!
//! A [`LoadGuard`] counts one request on one worker for exactly as long as it
//! lives. It is owned, `Send` and `'static`, so the gateway moves it into the
//! response body and it drops when the stream ends, errors or the client goes
//! away; the simulator holds it until the simulated completion. Dropping is
//! the only way a worker's load goes down, so no code path can forget (or
//! repeat) a decrement.
//!
//! A guard may also carry the prefill work its decision predicted (uncached
//! characters). That part is released by [`LoadGuard::prefill_done`] when the
//! first token arrives, or at drop at the latest; it is released exactly once.

use crate::cost::Estimator;
use crate::{CostModelConfig, Work, Worker};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One request in flight on a worker; releases its load when dropped.
#[must_use = "dropping the guard releases the worker's load at once"]
pub struct LoadGuard {
    worker: Arc<Worker>,
    prefill: usize,
    /// What the decision predicted from, for the cost model to learn from
    /// at the first token; taken once.
    predicted: Option<Predicted>,
}

/// A first token the cost model learned from: the work the decision saw on
/// the worker and the wait. Replica sync hands it to the other replicas
/// ([`Router::observe`](crate::Router::observe)), so that every replica
/// fits each worker on all of the pool's first tokens, not its share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// What the decision saw on the worker.
    pub work: Work,
    /// From the decision to the first token.
    pub elapsed: Duration,
}

/// The facts a TTFT prediction was made from, kept until the first token.
struct Predicted {
    /// The fit of the model the decision was for, held rather than found
    /// again by its place in the worker's list: that place moves when the
    /// list changes in place meanwhile
    /// ([`Registry::relist`](crate::Registry::relist)).
    fit: Arc<Estimator>,
    work: Work,
    cost: CostModelConfig,
}

impl fmt::Debug for Predicted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Predicted")
            .field("work", &self.work)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl LoadGuard {
    /// Counts one more request in flight on `worker`. Policies call this as
    /// part of a decision, so concurrent decisions see each other's load.
    pub fn acquire(worker: Arc<Worker>) -> Self {
        Self::with_prefill(worker, 0)
    }

    /// Like [`acquire`](Self::acquire), also counting `prefill_chars` of
    /// pending prefill work on the worker.
    pub fn with_prefill(worker: Arc<Worker>, prefill_chars: usize) -> Self {
        worker.in_flight.fetch_add(1, Ordering::Relaxed);
        worker
            .pending_prefill
            .fetch_add(prefill_chars, Ordering::Relaxed);
        worker.load_changed();
        Self {
            worker,
            prefill: prefill_chars,
            predicted: None,
        }
    }

    /// Like [`with_prefill`](Self::with_prefill), also keeping what the
    /// cost model predicted from (`work` as the decision saw it, on the
    /// worker's fit `slot`), so [`first_token`](Self::first_token) can
    /// teach the fit.
    pub fn with_prediction(
        worker: Arc<Worker>,
        slot: usize,
        work: Work,
        cost: CostModelConfig,
    ) -> Self {
        let fit = worker.fit(slot);
        let mut guard = Self::with_prefill(worker, work.uncached_chars);
        guard.predicted = Some(Predicted { fit, work, cost });
        guard
    }

    /// The request's first token arrived `elapsed` after the decision: its
    /// prefill work is done (as [`prefill_done`](Self::prefill_done)), and
    /// the worker's cost model learns from the wait, once. Callers pass only
    /// a real first token (a streamed response's first event), not the end
    /// of a whole answer.
    pub fn first_token(&mut self, elapsed: Duration) -> Option<Observation> {
        let learned = self.predicted.take().map(|p| {
            p.fit.observe(p.work, elapsed, &p.cost);
            Observation {
                work: p.work,
                elapsed,
            }
        });
        self.prefill_done();
        learned
    }

    /// The request's first token arrived: its prefill work is done. The
    /// request still counts as in flight until the guard drops. Idempotent.
    pub fn prefill_done(&mut self) {
        let chars = std::mem::take(&mut self.prefill);
        if chars > 0 {
            self.worker
                .pending_prefill
                .fetch_sub(chars, Ordering::Relaxed);
            self.worker.load_changed();
        }
    }

    /// The worker this guard holds load on.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.prefill_done();
        self.worker.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.worker.processed.fetch_add(1, Ordering::Relaxed);
        self.worker.load_changed();
    }
}

impl fmt::Debug for LoadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadGuard")
            .field("worker", &self.worker.id())
            .field("prefill", &self.prefill)
            .field("predicted", &self.predicted)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{WorkerId, WorkerSpec};

    fn assert_send_static<T: Send + 'static>() {}

    #[test]
    fn guard_counts_while_alive() {
        assert_send_static::<LoadGuard>();
        let w = Arc::new(Worker::new(WorkerId(0), WorkerSpec::new("http://a:1")));
        let a = LoadGuard::acquire(w.clone());
        let b = LoadGuard::acquire(w.clone());
        assert_eq!(w.load(), 2);
        drop(a);
        assert_eq!(w.load(), 1);
        drop(b);
        assert_eq!(w.load(), 0);
        assert_eq!(w.processed(), 2);
    }

    #[test]
    fn prefill_is_released_once_at_first_token_or_drop() {
        let w = Arc::new(Worker::new(WorkerId(0), WorkerSpec::new("http://a:1")));
        let mut a = LoadGuard::with_prefill(w.clone(), 100);
        let b = LoadGuard::with_prefill(w.clone(), 30);
        assert_eq!(w.pending_prefill(), 130);
        a.prefill_done();
        a.prefill_done();
        assert_eq!((w.pending_prefill(), w.load()), (30, 2));
        drop(a);
        drop(b);
        assert_eq!((w.pending_prefill(), w.load()), (0, 0));
    }
}
