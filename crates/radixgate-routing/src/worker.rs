//! One inference worker: its identity and its live state.
//!
//! Identity (id, URL, role) never changes after construction. What the
//! worker serves (its models, what it says of them, their longest context
//! and the cost model's fit for each) is one value swapped whole
//! ([`Registry::relist`](crate::Registry::relist)): LoRA adapters loaded
//! and unloaded at runtime come and go under the same id, where a worker
//! restarted with another model is removed and added again. Live state —
//! health, circuit-breaker state, in-flight load, processed count and the
//! load the worker reports about itself — is held in atomics so that the
//! request path reads it without locks, from any thread.
//!
//! Who writes what:
//! - in-flight load and pending prefill: only
//!   [`LoadGuard`](crate::LoadGuard) (up on creation, down on drop, prefill
//!   also at first token); there is no other way to change them;
//! - health: the [`Registry`](crate::Registry), the single writer of the
//!   worker set, which also publishes a new snapshot on every change;
//! - breaker state, the outlier ejection flag and reported load: the
//!   gateway's health/breaker/outlier tasks.
//!
//! All atomics use relaxed or acquire/release orderings: each value is an
//! independent hint for routing, and no invariant spans two of them.

use crate::correction::CacheTruth;
use crate::cost::{Coefficients, CostModelConfig, Estimator, Work};
use crate::{ModelOrigin, TenantId, WorkerRole, WorkerSpec, WorkerUrl};
use arc_swap::{ArcSwap, ArcSwapOption, Guard};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// Identifies a worker for as long as the process runs; never reused, so a
/// worker removed and added again gets a fresh id (and a fresh cache record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u32);

impl WorkerId {
    /// The tree tenant that records what was routed to this worker.
    pub fn tenant(self) -> TenantId {
        TenantId(self.0)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

/// State of a worker's circuit breaker: the one type for it, shared by
/// the gateway's state machine (which decides it) and selection (which skips
/// an open breaker through the worker's slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Requests flow normally.
    Closed,
    /// Too many consecutive failures: requests are refused until the open
    /// timeout passes, and the worker is not selected.
    Open,
    /// A bounded number of probe requests test the worker; it may be
    /// selected (the gateway limits how often).
    HalfOpen,
}

impl BreakerState {
    /// The value exported as a gauge (and kept in the worker's slot):
    /// 0 closed, 1 open, 2 half-open.
    pub fn as_gauge(self) -> u8 {
        match self {
            Self::Closed => 0,
            Self::Open => 1,
            Self::HalfOpen => 2,
        }
    }

    /// A lower-case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    fn from_gauge(v: u8) -> Self {
        match v {
            1 => Self::Open,
            2 => Self::HalfOpen,
            _ => Self::Closed,
        }
    }
}

/// Load that a worker reports about itself (e.g. from its `/get_load` or
/// `/metrics`). Policies may use it as a hint; the router's own in-flight
/// count stays the authoritative load.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct ReportedLoad {
    /// Requests the worker is running.
    pub running: u32,
    /// Requests waiting in the worker's queue.
    pub waiting: u32,
    /// Fraction of the KV cache in use, `0.0..=1.0`.
    pub kv_usage: f32,
}

/// Bit layout of a packed [`ReportedLoad`]: one atomic word, so a reader
/// never sees `running` from one report and `waiting` from another.
const PRESENT: u64 = 1 << 63;
const FIELD_MASK: u64 = (1 << 24) - 1;

fn pack(load: ReportedLoad) -> u64 {
    let running = u64::from(load.running).min(FIELD_MASK);
    let waiting = u64::from(load.waiting).min(FIELD_MASK);
    let kv = (load.kv_usage.clamp(0.0, 1.0) * 10_000.0).round() as u64;
    PRESENT | running | (waiting << 24) | (kv << 48)
}

fn unpack(word: u64) -> Option<ReportedLoad> {
    if word & PRESENT == 0 {
        return None;
    }
    Some(ReportedLoad {
        running: (word & FIELD_MASK) as u32,
        waiting: ((word >> 24) & FIELD_MASK) as u32,
        kv_usage: ((word >> 48) & 0x7fff) as f32 / 10_000.0,
    })
}

/// A worker's API key as it is now ([`Worker::api_key`]).
pub struct ApiKey(Guard<Option<Arc<String>>>);

impl ApiKey {
    /// The key, if the worker has one.
    pub fn as_deref(&self) -> Option<&str> {
        self.0.as_deref().map(String::as_str)
    }
}

/// The models a worker serves as they are now ([`Worker::models`]): a
/// slice of their names, held while it is read.
pub struct Models(Guard<Arc<Serving>>);

impl Deref for Models {
    type Target = [String];

    fn deref(&self) -> &[String] {
        &self.0.models
    }
}

impl fmt::Debug for Models {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// What a worker serves, replaced whole when that changes in place.
struct Serving {
    models: Vec<String>,
    /// What the worker says of its models besides their names, for those
    /// it says it of.
    origins: BTreeMap<String, ModelOrigin>,
    /// The longest context it serves, if it said.
    max_model_len: Option<u64>,
    /// The TTFT cost model's fit, one per model served (one for a
    /// wildcard worker), in the order of `models`; shared with the next
    /// value for the models both serve.
    cost: Box<[Arc<Estimator>]>,
}

impl Serving {
    /// `models` with the fits `kept` has of them but of those in
    /// `afresh`, fresh ones for the rest.
    fn new(
        models: Vec<String>,
        mut origins: BTreeMap<String, ModelOrigin>,
        max_model_len: Option<u64>,
        kept: Option<&Serving>,
        afresh: &[String],
    ) -> Self {
        origins.retain(|m, _| models.contains(m));
        // A model's fit follows it; a wildcard worker's one fit stays.
        let fit = |model: Option<&String>| -> Arc<Estimator> {
            let kept = kept.and_then(|k| {
                let slot = match model {
                    Some(m) if afresh.contains(m) => None,
                    Some(m) => k.models.iter().position(|x| x == m),
                    None => k.models.is_empty().then_some(0),
                };
                k.cost.get(slot?).cloned()
            });
            kept.unwrap_or_default()
        };
        let cost = if models.is_empty() {
            vec![fit(None)]
        } else {
            models.iter().map(|m| fit(Some(m))).collect()
        };
        Self {
            models,
            origins,
            max_model_len,
            cost: cost.into_boxed_slice(),
        }
    }
}

/// A worker: fixed identity plus live state. Shared as `Arc<Worker>`.
pub struct Worker {
    id: WorkerId,
    url: String,
    /// [`Self::name`]: the spec's name, else the URL's `host:port`.
    name: String,
    /// [`Self::models`] and what goes with them; changed in place by
    /// [`Self::set_serving`].
    serving: ArcSwap<Serving>,
    /// [`Self::api_key`]; a reload that rotates it changes it in place.
    api_key: ArcSwapOption<String>,
    role: WorkerRole,
    bootstrap_port: Option<u16>,
    /// Tokens the KV cache holds; 0: not known. Settable: the gateway asks
    /// the worker after admitting it, and again when it comes back.
    kv_capacity_tokens: AtomicU64,
    healthy: AtomicBool,
    breaker: AtomicU8,
    ejected: AtomicBool,
    /// Set by [`Registry::remove`](crate::Registry::remove) before the
    /// policy forgets the worker (see [`Worker::is_removed`]).
    removed: AtomicBool,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) pending_prefill: AtomicUsize,
    pub(crate) processed: AtomicU64,
    /// Other router replicas' in-flight requests on this worker, as their
    /// latest unexpired reports add up (see [`PeerLoads`](crate::PeerLoads)).
    peer_in_flight: AtomicUsize,
    /// Other replicas' pending prefill characters on this worker.
    peer_prefill: AtomicUsize,
    reported: AtomicU64,
    /// Told whenever `in_flight` or `pending_prefill` changes (by a
    /// [`LoadGuard`](crate::LoadGuard)); shared by every worker of a
    /// registry, so one waiter (replica sync's publisher) hears of any.
    load_changes: Arc<Notify>,
    /// Predicted against reported cached tokens (`correction.rs`).
    truth: CacheTruth,
}

impl Worker {
    /// Builds a worker from a spec. Most callers go through
    /// [`Registry::add`](crate::Registry::add), which validates the spec and
    /// assigns ids; this is public for tests and the offline simulator.
    pub fn new(id: WorkerId, spec: WorkerSpec) -> Self {
        let url = WorkerUrl::canonical(&spec.url).into_owned();
        Self {
            id,
            name: spec
                .name
                .unwrap_or_else(|| WorkerUrl::name_of(&url).to_owned()),
            url,
            serving: ArcSwap::from_pointee(Serving::new(
                spec.models,
                spec.origins,
                spec.max_model_len,
                None,
                &[],
            )),
            api_key: ArcSwapOption::from_pointee(spec.api_key),
            role: spec.role,
            bootstrap_port: spec.bootstrap_port,
            kv_capacity_tokens: AtomicU64::new(spec.kv_capacity_tokens.unwrap_or(0)),
            healthy: AtomicBool::new(spec.healthy),
            breaker: AtomicU8::new(BreakerState::Closed.as_gauge()),
            ejected: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            pending_prefill: AtomicUsize::new(0),
            processed: AtomicU64::new(0),
            peer_in_flight: AtomicUsize::new(0),
            peer_prefill: AtomicUsize::new(0),
            reported: AtomicU64::new(0),
            load_changes: Arc::new(Notify::new()),
            truth: CacheTruth::default(),
        }
    }

    /// Shares `changes` as this worker's load-change signal (see
    /// [`Router::load_changes`](crate::Router::load_changes)).
    pub(crate) fn with_load_changes(mut self, changes: Arc<Notify>) -> Self {
        self.load_changes = changes;
        self
    }

    /// Its own load changed: wakes the signal's waiter, or leaves it a
    /// permit (one atomic operation when nobody waits).
    pub(crate) fn load_changed(&self) {
        self.load_changes.notify_one();
    }

    /// The worker's record of predicted against reported cached tokens.
    pub fn cache_truth(&self) -> &CacheTruth {
        &self.truth
    }

    /// The worker's part in a disaggregated pool.
    pub fn role(&self) -> WorkerRole {
        self.role
    }

    /// A prefill worker's bootstrap port, if configured.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap_port
    }

    /// Tokens the worker's KV cache holds, if known (the spec's, or what
    /// the worker reported since its admission).
    pub fn kv_capacity_tokens(&self) -> Option<u64> {
        Some(self.kv_capacity_tokens.load(Ordering::Relaxed)).filter(|&t| t > 0)
    }

    /// The longest context, in tokens, the worker said it serves when its
    /// models were last read, if it said.
    pub fn max_model_len(&self) -> Option<u64> {
        self.serving.load().max_model_len
    }

    /// What the worker says of `model` besides its name (an adapter's
    /// parent and root), if it serves it and says.
    pub fn origin(&self, model: &str) -> Option<ModelOrigin> {
        self.serving.load().origins.get(model).cloned()
    }

    /// Whether the worker lists `model` as a LoRA adapter (its entry names
    /// a parent); read in place, for the request path.
    pub fn lists_as_adapter(&self, model: &str) -> bool {
        (self.serving.load().origins.get(model)).is_some_and(ModelOrigin::is_adapter)
    }

    /// Replaces what the worker serves, keeping the cost model's fits of
    /// the models it still serves but those in `afresh`: only the
    /// [`Registry`](crate::Registry), which publishes the pools anew.
    pub(crate) fn set_serving(
        &self,
        models: Vec<String>,
        origins: BTreeMap<String, ModelOrigin>,
        max_model_len: Option<u64>,
        afresh: &[String],
    ) {
        let kept = self.serving.load_full();
        self.serving.store(Arc::new(Serving::new(
            models,
            origins,
            max_model_len,
            Some(&kept),
            afresh,
        )));
    }

    /// Sets what [`Self::kv_capacity_tokens`] returns: what the worker
    /// reported after its admission (0: unknown).
    pub fn set_kv_capacity_tokens(&self, tokens: u64) {
        self.kv_capacity_tokens.store(tokens, Ordering::Relaxed);
    }

    /// The worker's id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// A short, stable name for decisions and logs: the name its source
    /// gave (a pod's name), else the URL's `host:port` (`10.0.0.5:30000`).
    /// Unlike the id, which follows admission order, it reads the same in
    /// `/workers`, metrics and the decision header.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Base URL without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Models served (empty: any model), as they are now.
    pub fn models(&self) -> Models {
        Models(self.serving.load())
    }

    /// The API key sent to the worker, as it is now.
    pub fn api_key(&self) -> ApiKey {
        ApiKey(self.api_key.load())
    }

    /// Sets the key sent to the worker from now on (a reload rotated it).
    pub fn set_api_key(&self, key: Option<String>) {
        self.api_key.store(key.map(Arc::new));
    }

    /// Whether health checks consider the worker up.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    pub(crate) fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Release);
    }

    /// Circuit-breaker state.
    pub fn breaker(&self) -> BreakerState {
        BreakerState::from_gauge(self.breaker.load(Ordering::Acquire))
    }

    /// Sets the circuit-breaker state (the gateway's breaker owns it).
    pub fn set_breaker(&self, state: BreakerState) {
        self.breaker.store(state.as_gauge(), Ordering::Release);
    }

    /// Whether outlier detection has ejected the worker (it answers far
    /// slower than its peers) for now.
    pub fn is_ejected(&self) -> bool {
        self.ejected.load(Ordering::Acquire)
    }

    /// Ejects the worker or returns it (the gateway's outlier detection
    /// owns this flag).
    pub fn set_ejected(&self, ejected: bool) {
        self.ejected.store(ejected, Ordering::Release);
    }

    /// Whether the registry removed this worker (requests routed to it
    /// before still hold it). A decision that loaded the worker set just
    /// before the removal was published may still choose it, and record
    /// its text for it after the policy forgot it; the router reads this
    /// after each decision to take such a record back. Sequentially
    /// consistent, as the removal and the decision each write one place
    /// (this flag, the tree) and read the other.
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }

    pub(crate) fn set_removed(&self) {
        self.removed.store(true, Ordering::SeqCst);
    }

    /// Whether policies may choose this worker: healthy, breaker not open,
    /// not ejected as an outlier.
    pub fn is_available(&self) -> bool {
        self.is_healthy() && self.breaker() != BreakerState::Open && !self.is_ejected()
    }

    /// Requests routed to this worker, by this router, whose
    /// [`LoadGuard`](crate::LoadGuard) is still alive. What other replicas
    /// route is [`peer_load`](Self::peer_load); policies read the sum,
    /// [`routing_load`](Self::routing_load).
    pub fn load(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Characters of prompt the worker still has to prefill for requests
    /// routed here: the uncached part each decision predicted, until the
    /// request's first token (or its end). Only
    /// [`LoadGuard`](crate::LoadGuard) changes it.
    pub fn pending_prefill(&self) -> usize {
        self.pending_prefill.load(Ordering::Relaxed)
    }

    /// In-flight requests other router replicas report on this worker
    /// (0 without replica sync).
    pub fn peer_load(&self) -> usize {
        self.peer_in_flight.load(Ordering::Relaxed)
    }

    /// Pending prefill characters other router replicas report on this
    /// worker (0 without replica sync).
    pub fn peer_pending_prefill(&self) -> usize {
        self.peer_prefill.load(Ordering::Relaxed)
    }

    /// Sets what the other replicas report (only [`PeerLoads::apply`]
    /// writes it).
    ///
    /// [`PeerLoads::apply`]: crate::PeerLoads::apply
    pub(crate) fn set_peer_load(&self, in_flight: usize, prefill: usize) {
        self.peer_in_flight.store(in_flight, Ordering::Relaxed);
        self.peer_prefill.store(prefill, Ordering::Relaxed);
    }

    /// The load policies balance on: this router's own in-flight requests
    /// ([`load`](Self::load)) plus those other replicas report
    /// ([`peer_load`](Self::peer_load)).
    pub fn routing_load(&self) -> usize {
        self.load().saturating_add(self.peer_load())
    }

    /// The pending prefill the cost model weighs: own plus other replicas'.
    pub fn routing_pending_prefill(&self) -> usize {
        self.pending_prefill()
            .saturating_add(self.peer_pending_prefill())
    }

    /// Requests routed to this worker that have finished (guard dropped).
    pub fn processed(&self) -> u64 {
        self.processed.load(Ordering::Relaxed)
    }

    /// Records the load the worker last reported about itself.
    pub fn set_reported_load(&self, load: ReportedLoad) {
        self.reported.store(pack(load), Ordering::Relaxed);
    }

    /// The load the worker last reported, if it ever did.
    pub fn reported_load(&self) -> Option<ReportedLoad> {
        unpack(self.reported.load(Ordering::Relaxed))
    }

    /// Which of the worker's cost-model fits serves requests for `model`:
    /// the model's place in [`models`](Self::models), or the first (a
    /// wildcard worker has one fit for everything).
    pub fn cost_slot(&self, model: &str) -> usize {
        self.models().iter().position(|m| m == model).unwrap_or(0)
    }

    /// The TTFT cost model's coefficients for the fit `slot` (`seed` until
    /// it has observed a first token).
    pub fn ttft_coefficients(&self, slot: usize, seed: &CostModelConfig) -> Coefficients {
        self.with_estimator(slot, |e| e.coefficients(&seed.seed()))
    }

    /// The fit `slot`'s own coefficients, `None` until it has observed a
    /// first token.
    pub fn ttft_fit(&self, slot: usize) -> Option<Coefficients> {
        self.with_estimator(slot, Estimator::fitted)
    }

    /// First tokens the fit `slot` has learned from.
    pub fn ttft_observations(&self, slot: usize) -> u64 {
        self.with_estimator(slot, Estimator::observations)
    }

    /// Teaches the fit `slot` that a request which saw `work` here got its
    /// first token after `elapsed`: one another router replica saw
    /// ([`Router::observe`](crate::Router::observe)). A request of this
    /// router teaches the fit its guard holds
    /// ([`LoadGuard::first_token`](crate::LoadGuard::first_token)).
    pub fn observe_ttft(&self, slot: usize, work: Work, elapsed: Duration, cfg: &CostModelConfig) {
        self.with_estimator(slot, |e| e.observe(work, elapsed, cfg));
    }

    /// The fit `slot` itself, for a request to teach at its first token
    /// whatever the worker's list is by then ([`LoadGuard`]): one clone
    /// per request, on the worker chosen alone.
    ///
    /// [`LoadGuard`]: crate::LoadGuard
    pub(crate) fn fit(&self, slot: usize) -> Arc<Estimator> {
        let serving = self.serving.load();
        Arc::clone(serving.cost.get(slot).unwrap_or(&serving.cost[0]))
    }

    /// `f` of the fit `slot`; the first where the models changed since
    /// the slot was read and it has fewer now (a hint either way). Read
    /// in place: an `Arc` clone here, on every worker of every decision,
    /// would bounce its count's cache line between the serving threads.
    fn with_estimator<R>(&self, slot: usize, f: impl FnOnce(&Estimator) -> R) -> R {
        let serving = self.serving.load();
        f(serving.cost.get(slot).unwrap_or(&serving.cost[0]))
    }

    /// Whether this worker serves `model` (a wildcard worker serves all).
    pub fn serves(&self, model: &str) -> bool {
        let models = self.models();
        models.is_empty() || models.iter().any(|m| m == model)
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The API key is deliberately left out: debug output ends up in logs.
        f.debug_struct("Worker")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("models", &self.models())
            .field("healthy", &self.is_healthy())
            .field("breaker", &self.breaker())
            .field("ejected", &self.is_ejected())
            .field("load", &self.load())
            .field("peer_load", &self.peer_load())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_named_by_its_host_and_port() {
        let named = |url: &str| {
            Worker::new(WorkerId(7), WorkerSpec::new(url))
                .name()
                .to_owned()
        };
        assert_eq!(named("http://10.0.0.5:30000/"), "10.0.0.5:30000");
        assert_eq!(named("https://gpu-3.internal"), "gpu-3.internal");
        assert_eq!(named("http://[::1]:8000"), "[::1]:8000");
    }

    #[test]
    fn reported_load_round_trips_and_saturates() {
        let w = Worker::new(WorkerId(1), WorkerSpec::new("http://a:1/"));
        assert_eq!(w.url(), "http://a:1");
        assert_eq!(w.reported_load(), None);
        w.set_reported_load(ReportedLoad {
            running: 7,
            waiting: u32::MAX,
            kv_usage: 0.25,
        });
        let got = w.reported_load().unwrap();
        assert_eq!(got.running, 7);
        assert_eq!(got.waiting, (1 << 24) - 1);
        assert!((got.kv_usage - 0.25).abs() < 1e-4);
    }

    #[test]
    fn availability_follows_health_and_breaker() {
        let w = Worker::new(WorkerId(1), WorkerSpec::new("http://a:1"));
        assert!(w.is_available());
        w.set_breaker(BreakerState::Open);
        assert!(!w.is_available());
        w.set_breaker(BreakerState::HalfOpen);
        assert!(w.is_available());
        w.set_ejected(true);
        assert!(!w.is_available());
        w.set_ejected(false);
        assert!(w.is_available());
        w.set_healthy(false);
        assert!(!w.is_available());
    }

    #[test]
    fn debug_hides_the_api_key() {
        let w = Worker::new(
            WorkerId(1),
            WorkerSpec::new("http://a:1").with_api_key("sekrit"),
        );
        assert!(!format!("{w:?}").contains("sekrit"));
    }
}
