//! Helpers shared by the policy tests.

use crate::{LoadGuard, Policy, RequestView, Worker, WorkerId, WorkerSpec};
use std::sync::Arc;

/// `n` healthy wildcard workers with ids `0..n`.
pub(crate) fn workers(n: usize) -> Vec<Arc<Worker>> {
    (0..n)
        .map(|i| {
            Arc::new(Worker::new(
                WorkerId(i as u32),
                WorkerSpec::new(format!("http://w{i}:8000")),
            ))
        })
        .collect()
}

/// Puts `n` requests in flight on `w`; they stay until the guards drop.
pub(crate) fn hold(w: &Arc<Worker>, n: usize) -> Vec<LoadGuard> {
    (0..n).map(|_| LoadGuard::acquire(w.clone())).collect()
}

/// Routes `text` for model `m` and releases the load at once.
pub(crate) fn pick(policy: &dyn Policy, workers: &[Arc<Worker>], text: &str) -> WorkerId {
    policy
        .select(&RequestView::new("m", text), workers)
        .expect("a worker")
        .worker()
        .id()
}
