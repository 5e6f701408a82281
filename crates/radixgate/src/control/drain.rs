//! Draining (see the parent module's doc): the control task's half of
//! [`Control::drain`](super::Control::drain). A drained worker leaves the
//! registry at once and stays known, with its `Arc<Worker>`, until its
//! load is zero or its deadline passed.

use super::ControlTask;
use crate::error::GatewayError;
use crate::metrics::Describe;
use radixgate_routing::{Worker, WorkerUrl};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often the control task looks at the load of draining workers.
pub const DRAIN_POLL: Duration = Duration::from_millis(50);

/// Drains, by how they ended.
pub(crate) const DRAINS: Describe = Describe::new(
    "radixgate_worker_drains_total",
    "Workers drained (DELETE /workers, a terminating pod, one a reload removed), \
     by how the drain ended: \
     `finished` (no request left in flight), `timeout` (server.drain_timeout_secs passed) \
     or `removed` (removed outright, or replaced by a new worker at its URL, while draining).",
);

/// What [`Control::drain`](super::Control::drain) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Drained {
    /// Nothing was in flight (or the worker was never admitted): it is gone.
    Removed,
    /// Out of rotation; its requests in flight are finishing.
    Draining,
}

/// A worker out of rotation whose requests in flight are finishing.
pub(super) struct Draining {
    /// Held so its load stays readable; the requests' guards hold it too.
    pub(super) worker: Arc<Worker>,
    /// When the drain gives up waiting.
    pub(super) deadline: Instant,
}

impl ControlTask {
    /// Out of the registry now; forgotten once idle (see the module doc).
    pub(super) fn drain(&mut self, url: &str) -> Result<Drained, GatewayError> {
        let url = &*WorkerUrl::canonical(url.trim());
        let known = self
            .known
            .get_mut(url)
            .ok_or_else(|| GatewayError::UnknownWorkerUrl {
                url: url.to_owned(),
            })?;
        if known.draining.is_some() {
            return Ok(Drained::Draining);
        }
        known.cancel.cancel();
        let worker = match known.id.take() {
            Some(id) => Some(self.registry.remove(id).map_err(GatewayError::Admin)?),
            None => None,
        };
        match worker {
            Some(worker) if worker.load() > 0 => {
                tracing::info!(
                    worker = %url,
                    in_flight = worker.load(),
                    "worker draining: no new requests; waiting for those in flight"
                );
                known.draining = Some(Draining {
                    worker,
                    deadline: Instant::now() + self.drain_timeout,
                });
                Ok(Drained::Draining)
            }
            _ => {
                self.drains.increment("finished");
                self.control.board.forget(url);
                tracing::info!(worker = %url, "worker drained (nothing in flight) and removed");
                if let Some((url, _)) = self.known.remove_entry(url) {
                    self.let_go(url);
                }
                Ok(Drained::Removed)
            }
        }
    }

    /// Forgets draining workers that are idle or out of time.
    pub(super) fn sweep_drains(&mut self) {
        let now = Instant::now();
        let done: Vec<(WorkerUrl, &'static str)> = self
            .known
            .iter()
            .filter_map(|(url, known)| {
                let draining = known.draining.as_ref()?;
                if draining.worker.load() == 0 {
                    Some((url.clone(), "finished"))
                } else if now >= draining.deadline {
                    tracing::warn!(
                        worker = %url,
                        in_flight = draining.worker.load(),
                        timeout = ?self.drain_timeout,
                        "drain timed out; forgetting the worker with requests still in flight \
                         (they are not cut)"
                    );
                    Some((url.clone(), "timeout"))
                } else {
                    None
                }
            })
            .collect();
        for (url, end) in done {
            self.forget(&url, end);
            self.let_go(url);
        }
    }

    /// Drops a draining worker's entry; `end` is how its drain ended. The
    /// caller lets its URL go where no new worker takes it at once.
    pub(super) fn forget(&mut self, url: &WorkerUrl, end: &'static str) {
        if self.known.remove(url).is_some() {
            self.drains.increment(end);
            self.control.board.forget(url.as_str());
            tracing::info!(worker = %url, end, "worker drained and removed");
        }
    }
}
