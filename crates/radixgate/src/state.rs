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
//! Components own their metric families (the request path's are
//! [`RequestMetrics`], the tenants' [`TenantMetrics`]; admission and the
//! breakers keep theirs inside);
//! [`Metrics`] is the recorder they were built from, which `/metrics`
//! renders. No lock is held here; the breakers map's lock is
//! `breaker/set.rs`'s.

use crate::admission::Admission;
use crate::auth::Keys;
use crate::body::BodyLimits;
use crate::breaker::Breakers;
use crate::config::Config;
use crate::control::Control;
use crate::metrics::Metrics;
use crate::proxy::RequestMetrics;
use crate::tenants::{TenantMetrics, Tenants};
use crate::upstream::Forwarder;
use radixgate_routing::{PolicyConfig, Router};
use std::sync::Arc;
use std::time::Instant;

/// What every thread of one gateway shares.
pub(crate) struct Shared {
    /// This gateway's `Via` entry, sent with every request to a worker
    /// and looked for in every request received (`crate::via`).
    pub(crate) via: crate::via::Via,
    /// The validated configuration, as at start-up (a reload changes the
    /// workers, the policy and [`Self::keys`], not this).
    pub(crate) config: Config,
    /// The routing settings the policy in use was built from: those of
    /// start-up until a reload replaces the policy (`/get_server_info`).
    pub(crate) routing: Arc<arc_swap::ArcSwap<PolicyConfig>>,
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
    /// Requests that broke workers' connections lately (a prompt that
    /// crashes engines), retried on no more than one worker.
    pub(crate) suspects: crate::retry::Suspects,
    /// Workers that answered 429 or 503 with `Retry-After`, passed over
    /// until then while others can take their requests.
    pub(crate) paused: crate::retry::Paused,
    /// The retries of every request together, against the requests.
    pub(crate) retry_budget: crate::retry::RetryBudget,
    /// Latency statistics and ejection of slow workers.
    pub(crate) outliers: crate::outlier::Outliers,
    /// Cancelled when shutdown stops waiting for streams: each response
    /// body then ends with an error event, and each request not answered
    /// yet (queued for admission, or waiting for its worker's answer; see
    /// [`AppState::cut_off`]) is answered 503, before its connection is
    /// dropped.
    pub(crate) streams_abort: tokio_util::sync::CancellationToken,
    /// Cancelled when shutdown starts: `/readiness` answers 503 from then
    /// on, before the listener closes.
    pub(crate) shutting_down: tokio_util::sync::CancellationToken,
    /// Set once the serving threads accept on the client port (after the
    /// workers' first probes, see `crate::server`): `/readiness`, which the
    /// metrics port serves before then, answers 503 `starting` until it is.
    pub(crate) accepting: std::sync::atomic::AtomicBool,
    /// The metrics recorder, rendered by `/metrics`.
    pub(crate) metrics: Metrics,
    /// The request path's metric families.
    pub(crate) request_metrics: RequestMetrics,
    /// Who may call the client API, with their limits. Swapped whole on a
    /// config reload (`Tenants::reloaded`); requests read it lock-free.
    pub(crate) tenants: Arc<arc_swap::ArcSwap<Tenants>>,
    /// The tenant families: answers, tokens and refusals by tenant. Kept
    /// here, not in [`Tenants`], so a reload does not replace them.
    pub(crate) tenant_metrics: TenantMetrics,
    /// Replica sync over NATS, when `sync.urls` is set: the request path
    /// queues its decisions here, `/readiness` asks about the warm start.
    pub(crate) sync: Option<crate::sync::SyncHandle>,
    /// The workers' KV-event streams and their exact index, when
    /// `kv_events.enabled`.
    pub(crate) kv_events: Option<Arc<crate::events::KvEvents>>,
    /// The trace recording (`record_trace`), switched at runtime by the
    /// admin API; the request path hands it each finished request.
    pub(crate) recorder: crate::record::Recorder,
    /// When the gateway started (for `uptime_secs`).
    pub(crate) started: Instant,
    /// The live status page's sampler state and request ring.
    pub(crate) dashboard: crate::dashboard::Dashboard,
    /// Whether every serving thread still runs its tasks (`/liveness`).
    pub(crate) pulse: crate::pulse::Pulse,
    /// The client port's connection cap and what it refused, which the
    /// upkeep tick publishes.
    pub(crate) connections: Arc<crate::listen::ConnectionSlots>,
    /// The workers that made the Responses API's stored responses.
    pub(crate) responses: crate::responses::Makers,
}

/// One serving thread's view of a gateway: the shared state and the
/// thread's own forwarding pool.
pub(crate) struct AppState {
    /// What all threads share.
    pub(crate) shared: Arc<Shared>,
    /// This thread's own pool of worker connections.
    pub(crate) forwarder: Forwarder,
    /// This thread's child of [`Shared::streams_abort`], which a request
    /// waits on until its answer's head: one per thread, so that the
    /// requests of different threads do not take one lock to wait.
    pub(crate) cut_off: tokio_util::sync::CancellationToken,
}
