//! What every handler shares: configuration, the routing handle, the control
//! handle, the worker clients, admission, breakers and metrics. Built once in
//! [`crate::server`]; every mutable part sits behind its own handle, so the
//! whole is shared as a plain `Arc`.
//!
//! The one thing not shared is the forwarding client's connection pool:
//! each serving thread has its own ([`AppState`] = the [`Shared`] part + that
//! thread's [`Forwarder`]), so a request and the worker connection it rides
//! on are served by the same event loop and never wake another thread.
//! Handlers name which of the two they use (`state.shared.router`,
//! `state.forwarder`): the per-thread part is never mistaken for a shared
//! one.
//!
//! The breakers map is the one lock here: a `parking_lot::RwLock` read for a
//! map lookup per attempt (never held across `.await`), written only the
//! first time a worker id is seen.

use crate::admission::Admission;
use crate::auth::Keys;
use crate::body::BodyLimits;
use crate::breaker::{Breaker, BreakerState};
use crate::config::Config;
use crate::control::Control;
use crate::metrics::Metrics;
use crate::tenants::Tenants;
use crate::upstream::Forwarder;
use parking_lot::RwLock;
use radixgate_routing::{Router, Worker, WorkerId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// What every thread of one gateway shares.
pub(crate) struct Shared {
    /// The validated configuration, as at start-up (a reload changes the
    /// workers, the policy and [`Self::keys`], not this).
    pub(crate) config: Config,
    /// The client and admin keys, replaced by a reload.
    pub(crate) keys: Arc<Keys>,
    /// The request path's lock-free handle on the worker set and policy.
    pub(crate) router: Router,
    /// The control task's handle (admin calls, worker list).
    pub(crate) control: Control,
    /// The client for the gateway's own calls to workers (model info, cache
    /// flush); forwarding uses each thread's [`Forwarder`].
    pub(crate) client: reqwest::Client,
    /// The concurrency limit and its queue.
    pub(crate) admission: Admission,
    /// The size, time and shared memory budget request bodies are read in.
    pub(crate) bodies: BodyLimits,
    /// One circuit breaker per worker.
    pub(crate) breakers: Breakers,
    /// Latency statistics and ejection of slow workers.
    pub(crate) outliers: crate::outlier::Outliers,
    /// Cancelled when shutdown stops waiting for streams: each response
    /// body then ends with an error event before its connection is dropped.
    pub(crate) streams_abort: tokio_util::sync::CancellationToken,
    /// The metrics recorder.
    pub(crate) metrics: Metrics,
    /// Who may call the client API, with their limits. Swapped whole on a
    /// config reload (`Tenants::reloaded`); requests read it lock-free.
    pub(crate) tenants: Arc<arc_swap::ArcSwap<Tenants>>,
    /// When the gateway started (for `uptime_secs`).
    pub(crate) started: Instant,
}

/// One serving thread's view of a gateway: the shared state and the
/// thread's own forwarding pool.
pub(crate) struct AppState {
    /// What all threads share.
    pub(crate) shared: Arc<Shared>,
    /// This thread's own pool of worker connections.
    pub(crate) forwarder: Forwarder,
}

/// One circuit breaker per worker id, created on first use.
pub(crate) struct Breakers {
    config: crate::config::BreakerConfig,
    map: RwLock<HashMap<WorkerId, Arc<Breaker>>>,
}

impl Breakers {
    pub(crate) fn new(config: crate::config::BreakerConfig) -> Self {
        Self {
            config,
            map: RwLock::new(HashMap::new()),
        }
    }

    pub(crate) fn get(&self, id: WorkerId) -> Arc<Breaker> {
        if let Some(b) = self.map.read().get(&id) {
            return b.clone();
        }
        self.map
            .write()
            .entry(id)
            .or_insert_with(|| Arc::new(Breaker::new(&self.config)))
            .clone()
    }

    /// Forgets breakers of workers no longer in the pool.
    pub(crate) fn retain(&self, live: impl Fn(WorkerId) -> bool) {
        self.map.write().retain(|id, _| live(*id));
    }
}

/// Publishes a breaker state into the worker's slot, which policies read:
/// the same type on both sides, so nothing is translated.
pub(crate) fn publish_breaker(worker: &Worker, state: BreakerState) {
    worker.set_breaker(state);
}
