//! The worker set's single writer ([`Registry`]) and its lock-free readers
//! ([`Router`]).
//!
//! Concurrency: the current [`WorkerSet`] sits in an `ArcSwap`. Readers load
//! it without locks or contention (`ArcSwap::load`), so the request path
//! never waits for an admin call or a health check. All changes go through
//! `&mut Registry`, which makes the one-writer rule a compile-time fact: the
//! gateway keeps the registry in one task and sends it events. Each change
//! builds a new set and publishes it with one atomic store.
//!
//! Adding or removing a worker also tells the policy, so it can update its
//! per-worker state (tree tenants, hash ring) incrementally; a model whose
//! last worker is removed takes its tree with it.
//!
//! A worker whose models change in place ([`Registry::relist`]: LoRA
//! adapters loaded or unloaded at runtime) keeps its id, so its load,
//! health, breaker and its records in the trees of the models it still
//! serves go on; only its records for the models it left are forgotten.
//!
//! The policy itself sits in a second `ArcSwap`, so a configuration reload
//! can replace it ([`Registry::set_policy`]) while requests keep flowing: a
//! decision already running finishes on the policy it loaded. Health changes
//! keep that state: a worker that was briefly unhealthy comes back with its
//! cache record intact.
//!
//! Decode workers of a disaggregated pool are chosen by a policy of their
//! own ([`Registry::set_decode_policy`], wrapped in a [`Holding`] so the
//! decode pool always has a prefix record); regular and prefill workers
//! share the main policy (its trees keep them apart by tenant).

use crate::policy::{Holding, LeastLoad};
use crate::{CacheAwareConfig, ExactMatches, Observation};
use crate::{
    Decision, Policy, RequestView, RoutingError, WILDCARD_MODEL, Worker, WorkerId, WorkerRole,
    WorkerSet, WorkerSpec, WorkerUrl,
};
use arc_swap::ArcSwap;
use std::sync::Arc;
use tokio::sync::Notify;

/// The single writer of the worker set.
#[derive(Debug)]
pub struct Registry {
    current: Arc<ArcSwap<WorkerSet>>,
    policy: Arc<ArcSwap<Arc<dyn Policy>>>,
    decode_policy: Arc<ArcSwap<Arc<dyn Policy>>>,
    least_load: Arc<LeastLoad>,
    /// Every worker's load-change signal (see [`Router::load_changes`]).
    load_changes: Arc<Notify>,
    next_id: u32,
    /// Where every policy's tie-breaking rotation starts ([`Self::stagger`]).
    stagger: usize,
}

impl Registry {
    /// An empty registry whose changes are reported to `policy`.
    pub fn new(policy: Arc<dyn Policy>) -> Self {
        Self {
            current: Arc::new(ArcSwap::from_pointee(WorkerSet::default())),
            policy: Arc::new(ArcSwap::from_pointee(policy)),
            decode_policy: Arc::new(ArcSwap::from_pointee(Arc::new(Holding::new(
                Arc::new(LeastLoad::new()),
                &CacheAwareConfig::default(),
            )) as Arc<dyn Policy>)),
            least_load: Arc::new(LeastLoad::new()),
            load_changes: Arc::new(Notify::new()),
            next_id: 0,
            stagger: 0,
        }
    }

    /// Starts every policy's tie-breaking rotation at `start`, now and
    /// after a reload ([`Policy::stagger`]): each replica of a router that
    /// shares its pool with others should start at its own place.
    pub fn stagger(&mut self, start: usize) {
        self.stagger = start;
        self.policy.load().stagger(start);
        self.decode_policy.load().stagger(start);
        self.least_load.stagger(start);
    }

    /// A cheap, cloneable handle for the request path.
    pub fn router(&self) -> Router {
        Router {
            current: self.current.clone(),
            policy: self.policy.clone(),
            decode_policy: self.decode_policy.clone(),
            least_load: self.least_load.clone(),
            load_changes: self.load_changes.clone(),
        }
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<WorkerSet> {
        self.current.load_full()
    }

    /// Replaces the policy (a reload changed the routing settings). The new
    /// policy is told about every current worker first, then published;
    /// decisions from then on use it. Its trees start empty.
    pub fn set_policy(&mut self, policy: Arc<dyn Policy>) {
        for worker in self.current.load().workers() {
            if worker.role() != WorkerRole::Decode {
                policy.on_worker_added(worker);
            }
        }
        policy.stagger(self.stagger);
        self.policy.store(Arc::new(policy));
    }

    /// Replaces the decode workers' policy, as [`set_policy`](Self::set_policy)
    /// does the main one; it is wrapped in a [`Holding`] whose own record
    /// (when the policy keeps no trees) is bounded by `bounds`.
    pub fn set_decode_policy(&mut self, policy: Arc<dyn Policy>, bounds: &CacheAwareConfig) {
        let policy: Arc<dyn Policy> = Arc::new(Holding::new(policy, bounds));
        for worker in self.current.load().workers() {
            if worker.role() == WorkerRole::Decode {
                policy.on_worker_added(worker);
            }
        }
        policy.stagger(self.stagger);
        self.decode_policy.store(Arc::new(policy));
    }

    /// The policy decisions are made by now.
    pub fn policy(&self) -> Arc<dyn Policy> {
        Arc::clone(&self.policy.load())
    }

    /// The decode workers' policy.
    pub fn decode_policy(&self) -> Arc<dyn Policy> {
        Arc::clone(&self.decode_policy.load())
    }

    fn policy_of(&self, role: WorkerRole) -> Arc<dyn Policy> {
        Arc::clone(&slot_of(role, &self.policy, &self.decode_policy).load())
    }

    /// Validates and adds a worker, publishing a new snapshot. The worker
    /// keeps the canonical form of the spec's URL.
    pub fn add(&mut self, mut spec: WorkerSpec) -> Result<Arc<Worker>, RoutingError> {
        let url = validate_spec(&spec)?;
        let set = self.current.load_full();
        if let Some(existing) = set.by_url(url.as_str()) {
            return Err(RoutingError::DuplicateWorker {
                url: existing.url().to_owned(),
            });
        }
        let id = WorkerId(self.next_id);
        self.next_id = self.next_id.checked_add(1).ok_or_else(|| {
            RoutingError::config("workers", "more than u32::MAX workers were added")
        })?;
        spec.url = url.into();
        let worker = Arc::new(Worker::new(id, spec).with_load_changes(self.load_changes.clone()));
        self.policy_of(worker.role()).on_worker_added(&worker);
        let mut workers = set.workers().to_vec();
        workers.push(worker.clone());
        self.publish(workers);
        Ok(worker)
    }

    /// Removes a worker, publishing a new snapshot. Requests already routed
    /// to it keep their guards (and the worker) until they finish; the policy
    /// forgets it, since a worker that returns gets a new id.
    pub fn remove(&mut self, id: WorkerId) -> Result<Arc<Worker>, RoutingError> {
        let set = self.current.load_full();
        let worker = set
            .get(id)
            .cloned()
            .ok_or(RoutingError::UnknownWorker { id: id.0 })?;
        let workers = set
            .workers()
            .iter()
            .filter(|w| w.id() != id)
            .cloned()
            .collect();
        // Before the policy forgets it: a decision racing this removal
        // then sees the flag after its insert (see `Router::select_with`).
        worker.set_removed();
        self.publish(workers);
        self.policy_of(worker.role()).on_worker_removed(&worker);
        forget_gone_models(&self.current.load(), &self.policy, &self.decode_policy);
        Ok(worker)
    }

    /// Changes what the worker `id` serves in place and publishes the
    /// pools anew: for a worker that still serves what it served, with
    /// LoRA adapters come or gone (a worker restarted with another model
    /// is removed and added again instead, its records afresh). It keeps
    /// its id, its load and health, its records in the trees of the
    /// models it still serves, and their cost-model fits; its records in
    /// the trees of the models it no longer serves are forgotten, as are
    /// those of the models in `afresh`, which it still serves from a cache
    /// that is not the old one (an adapter loaded again from another
    /// path), with their fits; a model no worker serves any more takes its
    /// tree with it. One snapshot is published, so no request finds the
    /// worker without a model it serves throughout. Requests in flight on
    /// it finish as they are.
    pub fn relist(
        &mut self,
        id: WorkerId,
        models: Vec<String>,
        origins: std::collections::BTreeMap<String, crate::ModelOrigin>,
        max_model_len: Option<u64>,
        afresh: &[String],
    ) -> Result<Arc<Worker>, RoutingError> {
        let set = self.current.load_full();
        let worker = set
            .get(id)
            .cloned()
            .ok_or(RoutingError::UnknownWorker { id: id.0 })?;
        crate::check_models(&models).map_err(|reason| RoutingError::InvalidWorker {
            url: worker.url().to_owned(),
            reason,
        })?;
        // Before its records go: a decision racing this change then sees
        // the new models after its insert (see `Router::select_with`).
        worker.set_serving(models, origins, max_model_len, afresh);
        self.publish(set.workers().to_vec());
        if let Some(trees) = self.policy_of(worker.role()).trees() {
            trees.remove_tenant_where(id.tenant(), |key| {
                !in_pool(&worker, key) || afresh.iter().any(|m| m == key)
            });
        }
        forget_gone_models(&self.current.load(), &self.policy, &self.decode_policy);
        Ok(worker)
    }

    /// Marks a worker healthy or unhealthy and publishes a new snapshot.
    /// Returns whether the health changed. Policy state is kept either way.
    pub fn set_health(&mut self, id: WorkerId, healthy: bool) -> Result<bool, RoutingError> {
        let set = self.current.load_full();
        let worker = set
            .get(id)
            .ok_or(RoutingError::UnknownWorker { id: id.0 })?;
        if worker.is_healthy() == healthy {
            return Ok(false);
        }
        worker.set_healthy(healthy);
        self.publish(set.workers().to_vec());
        Ok(true)
    }

    fn publish(&self, workers: Vec<Arc<Worker>>) {
        let generation = self.current.load().generation() + 1;
        self.current
            .store(Arc::new(WorkerSet::build(generation, workers)));
    }
}

/// The URL rule ([`WorkerUrl::parse`]) plus what only a whole spec can get
/// wrong; returns the canonical URL.
fn validate_spec(spec: &WorkerSpec) -> Result<WorkerUrl, RoutingError> {
    let url = WorkerUrl::parse(&spec.url)?;
    spec.check_models()
        .map_err(|reason| RoutingError::InvalidWorker {
            url: spec.url.clone(),
            reason,
        })?;
    Ok(url)
}

/// The request path's handle: reads the current snapshot without locks and
/// asks the policy. Cheap to clone; `Send + Sync`.
#[derive(Clone, Debug)]
pub struct Router {
    current: Arc<ArcSwap<WorkerSet>>,
    policy: Arc<ArcSwap<Arc<dyn Policy>>>,
    decode_policy: Arc<ArcSwap<Arc<dyn Policy>>>,
    /// For [`Router::select_least_loaded`]; shared by the clones, so ties
    /// rotate over all requests.
    least_load: Arc<LeastLoad>,
    load_changes: Arc<Notify>,
}

/// A routing decision and the pool it was made in.
#[derive(Debug)]
pub struct Routed {
    /// The chosen worker, its load guard and why it was chosen.
    pub decision: Decision,
    /// The pool's model: a served model name, or `None` for the wildcard
    /// pool. Safe as a metrics label, unlike the client's model field,
    /// which may name anything.
    pub model: Option<String>,
}

/// What [`Router::learn`] did with another replica's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// The text was recorded for the worker.
    Inserted,
    /// No worker has that URL here (not discovered yet, or removed).
    UnknownWorker,
    /// That worker does not serve that pool here.
    UnknownModel,
    /// The policy keeps no prefix trees (round_robin, least_load, …).
    NoTrees,
}

impl Router {
    /// Resolves the model's pool and chooses a worker in it, never one in
    /// `exclude` (the workers a retry already tried after a connect error or
    /// a 5xx/429 before the first byte; empty on a first attempt).
    /// cache_aware treats an excluded holder like an unavailable one:
    /// next-best match, tree record kept. The returned [`Decision`] already
    /// holds the load guard.
    pub fn select(
        &self,
        model: Option<&str>,
        text: &str,
        routing_key: Option<&str>,
        exclude: &[WorkerId],
    ) -> Result<Routed, RoutingError> {
        self.select_exact(model, text, routing_key, exclude, None)
    }

    /// Like [`select`](Self::select), with exact matches from engines' KV
    /// events for the workers whose stream is live; the others are matched
    /// in the policy's tree as usual.
    pub fn select_exact(
        &self,
        model: Option<&str>,
        text: &str,
        routing_key: Option<&str>,
        exclude: &[WorkerId],
        exact: Option<ExactMatches<'_>>,
    ) -> Result<Routed, RoutingError> {
        self.select_in(
            WorkerRole::Regular,
            model,
            text,
            routing_key,
            exclude,
            exact,
        )
    }

    /// Like [`select_exact`](Self::select_exact), in the pool of `role`'s
    /// workers, by that role's policy (decode workers have their own).
    pub fn select_in(
        &self,
        role: WorkerRole,
        model: Option<&str>,
        text: &str,
        routing_key: Option<&str>,
        exclude: &[WorkerId],
        exact: Option<ExactMatches<'_>>,
    ) -> Result<Routed, RoutingError> {
        let policy = slot_of(role, &self.policy, &self.decode_policy).load();
        self.select_with(&***policy, role, model, text, routing_key, exclude, exact)
    }

    /// Like [`select`](Self::select), but always the least-loaded available
    /// worker of the pool (ties rotate), whatever the policy: for requests
    /// whose text says nothing about any worker's cache (reranking,
    /// tokenizing, APIs the gateway does not know). Nothing is recorded in
    /// the policy's trees.
    pub fn select_least_loaded(
        &self,
        model: Option<&str>,
        exclude: &[WorkerId],
    ) -> Result<Routed, RoutingError> {
        self.select_least_loaded_in(WorkerRole::Regular, model, exclude)
    }

    /// Like [`select_least_loaded`](Self::select_least_loaded), in the pool
    /// of `role`'s workers.
    pub fn select_least_loaded_in(
        &self,
        role: WorkerRole,
        model: Option<&str>,
        exclude: &[WorkerId],
    ) -> Result<Routed, RoutingError> {
        self.select_with(&*self.least_load, role, model, "", None, exclude, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn select_with(
        &self,
        policy: &dyn Policy,
        role: WorkerRole,
        model: Option<&str>,
        text: &str,
        routing_key: Option<&str>,
        exclude: &[WorkerId],
        exact: Option<ExactMatches<'_>>,
    ) -> Result<Routed, RoutingError> {
        let set = self.current.load();
        let pool = set.resolve_in(role, model)?;
        let req = RequestView::new(pool.model, text)
            .with_routing_key(routing_key)
            .with_exact(exact)
            .with_excluded(exclude);
        let mut decision = if exclude.is_empty() {
            // The common case borrows the pool as is; only a retry pays for
            // a filtered copy.
            policy.select(&req, pool.workers)?
        } else {
            let rest: Vec<Arc<Worker>> = pool
                .workers
                .iter()
                .filter(|w| !exclude.contains(&w.id()))
                .cloned()
                .collect();
            policy.select(&req, &rest)?
        };
        if decision.worker().is_removed() {
            forget_removed(policy, &mut decision, text);
            // Its insert may have made a tree again for a model that left
            // with the worker.
            forget_gone_models(&self.current.load(), &self.policy, &self.decode_policy);
        } else if !in_pool(decision.worker(), pool.model) {
            // Relisted without this model while the decision was made:
            // its insert may have come after the registry forgot the
            // worker's records for it.
            decision.undo_insert(text);
            forget_gone_models(&self.current.load(), &self.policy, &self.decode_policy);
        }
        let model = (pool.model != WILDCARD_MODEL).then(|| pool.model.to_owned());
        Ok(Routed { decision, model })
    }

    /// Notified whenever the own load (in-flight count or pending prefill)
    /// of any worker added through the registry changes: replica sync's
    /// publisher waits on it instead of polling the loads. One permit is
    /// kept while nobody waits, so a change is never missed, and many
    /// changes before the next wait wake it once.
    pub fn load_changes(&self) -> Arc<Notify> {
        self.load_changes.clone()
    }

    /// The current snapshot (for `/v1/models`, `/get_loads` and metrics).
    pub fn snapshot(&self) -> Arc<WorkerSet> {
        self.current.load_full()
    }

    /// Records in the policy's tree for pool `model` that `text` (a routing
    /// text) was sent to the worker at `url`, as another router replica
    /// decided. The worker is found by canonical URL, since each replica
    /// numbers its workers itself. `model` must be a pool key of the
    /// current worker set ([`WILDCARD_MODEL`] for the wildcard pool) served
    /// by that worker, so a peer cannot create trees for made-up models.
    ///
    /// The worker's share of the tree is then kept within its cache, as
    /// after this router's own decisions.
    pub fn learn(&self, model: &str, url: &str, text: &str) -> Learned {
        let (worker, policy) = match self.peer_target(model, url) {
            Ok(found) => found,
            Err(refused) => return refused,
        };
        match policy.trees() {
            Some(trees) => {
                trees.insert_for(model, text, &worker, policy.correction());
                if worker.is_removed() {
                    // Removed while this was recorded: see `forget_removed`.
                    trees.remove_tenant(worker.id().tenant());
                    forget_gone_models(&self.current.load(), &self.policy, &self.decode_policy);
                } else if !in_pool(&worker, model) {
                    // Relisted without the model meanwhile: see `relist`.
                    trees.remove_tenant_where(worker.id().tenant(), |key| key == model);
                    forget_gone_models(&self.current.load(), &self.policy, &self.decode_policy);
                }
                Learned::Inserted
            }
            None => Learned::NoTrees,
        }
    }

    /// Teaches the cost model of the worker at `url` (its fit for pool
    /// `model`) a first token another router replica saw there. Checked as
    /// [`learn`](Self::learn) checks an insert; `NoTrees` stands for a
    /// policy without a cost model here.
    pub fn observe(&self, model: &str, url: &str, seen: Observation) -> Learned {
        let (worker, policy) = match self.peer_target(model, url) {
            Ok(found) => found,
            Err(refused) => return refused,
        };
        match policy.cost_model() {
            Some(cost) => {
                worker.observe_ttft(worker.cost_slot(model), seen.work, seen.elapsed, cost);
                Learned::Inserted
            }
            None => Learned::NoTrees,
        }
    }

    /// The worker at `url` and the policy of its role, if `model` is a pool
    /// of the current worker set that this worker serves: what a peer
    /// replica's message may touch ([`learn`](Self::learn),
    /// [`observe`](Self::observe)).
    fn peer_target(
        &self,
        model: &str,
        url: &str,
    ) -> Result<(Arc<Worker>, Arc<dyn Policy>), Learned> {
        let set = self.current.load();
        let Some(worker) = set.by_url(url) else {
            return Err(Learned::UnknownWorker);
        };
        let known_pool = match set.resolve_in(worker.role(), Some(model)) {
            Ok(pool) => pool.model == model,
            Err(_) => false,
        };
        if !known_pool || !in_pool(worker, model) {
            return Err(Learned::UnknownModel);
        }
        let policy: Arc<dyn Policy> =
            Arc::clone(&slot_of(worker.role(), &self.policy, &self.decode_policy).load());
        Ok((Arc::clone(worker), policy))
    }

    /// The policy decisions are made by now (a reload may replace it).
    pub fn policy(&self) -> Arc<dyn Policy> {
        Arc::clone(&self.policy.load())
    }

    /// The decode workers' policy (see [`Registry::set_decode_policy`]).
    pub fn decode_policy(&self) -> Arc<dyn Policy> {
        Arc::clone(&self.decode_policy.load())
    }

    /// Characters the prefix record of `worker`'s role attributes to it
    /// (see [`Policy::cached_chars`]).
    pub fn cached_chars(&self, worker: &Worker) -> Option<usize> {
        slot_of(worker.role(), &self.policy, &self.decode_policy)
            .load()
            .cached_chars(worker.id())
    }
}

/// Whether `worker` is in the pool keyed `key` now: the wildcard pool's
/// workers name no model, a named model's serve it (or any).
fn in_pool(worker: &Worker, key: &str) -> bool {
    match key {
        WILDCARD_MODEL => worker.models().is_empty(),
        model => worker.serves(model),
    }
}

/// Takes back what `decision` recorded in `policy`'s trees for a worker
/// that was removed while it was being made: the decision loaded the
/// worker set before the removal was published, and its insert may have
/// come after the registry had the policy forget the worker, leaving a
/// record of a tenant that nobody would forget again (tree characters
/// and a correction entry for every such race, for good). Its insert is
/// undone first, so that forgetting the worker again finds nothing of it
/// in flight. The request still goes to the worker, whose requests in
/// flight finish as any removed worker's do.
fn forget_removed(policy: &dyn Policy, decision: &mut Decision, text: &str) {
    decision.undo_insert(text);
    if let Some(trees) = policy.trees() {
        trees.remove_tenant(decision.worker().id().tenant());
    }
}

/// Drops from each policy's trees the models that no worker of `set`
/// whose role the policy chooses for serves any more
/// ([`Trees::retain_models`](crate::policy::Trees)); both policies' roles
/// count for trees the two share.
fn forget_gone_models(
    set: &WorkerSet,
    main: &ArcSwap<Arc<dyn Policy>>,
    decode: &ArcSwap<Arc<dyn Policy>>,
) {
    let (main, decode) = (main.load(), decode.load());
    let shared = match (main.trees(), decode.trees()) {
        (Some(a), Some(b)) => std::ptr::eq(a, b),
        _ => false,
    };
    let main_roles = [WorkerRole::Regular, WorkerRole::Prefill];
    for (policy, roles) in [
        (&main, &main_roles[..]),
        (&decode, &[WorkerRole::Decode][..]),
    ] {
        let roles = if shared { &WorkerRole::ALL[..] } else { roles };
        if let Some(trees) = policy.trees() {
            trees.retain_models(|key| roles.iter().any(|&r| set.has_pool(r, key)));
        }
    }
}

/// Where the policy of `role`'s workers sits: decode workers have their
/// own, regular and prefill workers share the main one.
fn slot_of<'a>(
    role: WorkerRole,
    main: &'a ArcSwap<Arc<dyn Policy>>,
    decode: &'a ArcSwap<Arc<dyn Policy>>,
) -> &'a ArcSwap<Arc<dyn Policy>> {
    match role {
        WorkerRole::Decode => decode,
        WorkerRole::Regular | WorkerRole::Prefill => main,
    }
}
