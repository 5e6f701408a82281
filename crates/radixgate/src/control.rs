//! The control task: the one owner of the worker registry.
//!
//! The routing crate's [`Registry`] takes `&mut self` for every change, so
//! exactly one task may own it; everything else — start-up, the admin API,
//! health checkers — calls a method of the [`Control`] handle, which sends
//! that task a private `Command` over a channel and, where it needs an
//! answer, waits on a oneshot reply. A health checker gets just the two
//! methods it needs ([`Control::admit`], [`Control::report_health`]), not
//! the admin replies. The request path never talks to this task: it reads
//! the published snapshot through a `Router`.
//!
//! Workers added while running ([`Control::add`]: the admin API, and any
//! later source such as discovery) are held to `server.worker_allowlist`
//! here, in the one place every source goes through; workers from the
//! config file and flags ([`Control::add_configured`]) are trusted.
//!
//! Workers are known by their canonical URL ([`WorkerUrl`]), so
//! `http://a:1/` and `http://a:1` are one worker here as in the registry.
//!
//! A worker's life: it is *known* from the moment it is added (a health
//! checker starts probing it) and *admitted* into the registry once its
//! first probes pass and its models are known (asked from the worker when
//! the operator did not list them). A worker that was down at start-up is
//! therefore admitted as soon as it answers, and one that later fails its
//! probes stays in the registry, marked unhealthy, so its tree survives a
//! brief outage. Back healthy, a worker whose models were asked of it is
//! asked again; one that now serves others (a restart with another model)
//! is replaced in the registry by one that serves them, its tree afresh.
//! A healthy one is asked every `health.models_refresh_secs` too; one whose
//! LoRA adapters alone came or went keeps its id and its tree for the
//! models it still serves ([`adapters_only`]), unless that is found as it
//! comes back from an outage (a restart drops the adapters loaded at
//! runtime).
//!
//! A source may also hold a worker out of rotation without removing it
//! ([`Control::set_ready`]: discovery, when a pod turns unready): it stays
//! in the registry, marked unhealthy, so its tree record survives as it
//! does for a worker failing its probes; it takes requests again when both
//! its source and its probes say so.
//!
//! Draining ([`Control::drain`]: `DELETE /workers`, a terminating pod, a
//! worker a reload removed) takes a worker out of the registry at once, so
//! no new request goes to it, while the control task keeps its
//! `Arc<Worker>`: requests in flight hold their load guards and finish,
//! `/workers` lists it as `draining` with that load, and the worker is
//! forgotten when its load reaches zero or
//! `server.drain_timeout_secs` has passed (requests still running then are
//! not cut: the worker ends them, or they finish). The control task checks
//! draining workers every [`DRAIN_POLL`] while there are any, and before
//! every listing. Adding a worker at a URL that is draining replaces it: a
//! new pod may take over a departed pod's address.
//!
//! One URL holds one worker, whichever source added it; another source's
//! worker at that URL is refused as a duplicate. So that such a refused
//! worker is not left out for good, every URL the control task lets go
//! of (removed, or drained to its end) is told to the sources that listen
//! ([`Control::freed`]: discovery offers a pod it was refused for it).

use crate::allowlist::Allowlist;
use crate::config::HealthConfig;
use crate::error::GatewayError;
use crate::health::{self, Served};
use crate::metrics::{LabelledCounters, Metrics};
use arc_swap::ArcSwapOption;
use drain::{DRAINS, Draining};
use radixgate_routing::{
    Policy, Registry, RoutingError, WorkerId, WorkerRole, WorkerSet, WorkerSpec, WorkerUrl,
};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

mod drain;
mod watches;

pub use drain::{DRAIN_POLL, Drained};
pub(crate) use watches::Watches;

/// The freed URLs ([`Control::freed`]) a receiver may fall behind by.
const FREED_BACKLOG: usize = 64;

/// A message to the control task; only [`Control`]'s methods build one.
#[derive(Debug)]
enum Command {
    Add {
        spec: WorkerSpec,
        source: Source,
        reply: oneshot::Sender<Result<(), GatewayError>>,
    },
    Remove {
        url: String,
        /// A reload's: leave a worker another source holds.
        configured_only: bool,
        reply: oneshot::Sender<Result<(), GatewayError>>,
    },
    /// A configured worker's entry changed in its key alone: `true` once
    /// changed in place, `false` where it must be replaced.
    Rekey {
        spec: WorkerSpec,
        reply: oneshot::Sender<bool>,
    },
    Drain {
        url: String,
        /// A reload's: leave a worker another source holds.
        configured_only: bool,
        reply: oneshot::Sender<Result<Drained, GatewayError>>,
    },
    /// From discovery: the worker's pod turned ready or unready.
    Ready {
        url: String,
        ready: bool,
        reply: oneshot::Sender<Result<(), GatewayError>>,
    },
    List {
        reply: oneshot::Sender<Vec<WorkerStatus>>,
    },
    /// From a reload: route with this policy from now on.
    SetPolicy {
        policy: Arc<dyn Policy>,
        reply: oneshot::Sender<()>,
    },
    /// From a health checker: first probes passed; these are the models
    /// and the KV cache's size in tokens, if the operator gave it (else
    /// the worker's answer follows as [`Command::Capacity`]).
    ///
    /// Each report from a health checker carries the checker's own token
    /// (`checker`). One whose checker was stopped is ignored: it speaks of
    /// a worker that was removed, perhaps replaced at its URL since (a
    /// reload that changed its models, a restarted pod), and the new
    /// worker is admitted on its own checker's probes and with its own
    /// models.
    Admit {
        url: WorkerUrl,
        served: Served,
        kv_capacity_tokens: Option<u64>,
        checker: CancellationToken,
    },
    /// From a health checker: the worker's health changed. Back healthy,
    /// the models it now reports (and their longest context), where the
    /// checker asked it and it said.
    Health {
        url: WorkerUrl,
        healthy: bool,
        models: Option<Served>,
        checker: CancellationToken,
    },
    /// From a health checker: the admitted worker's KV cache holds this
    /// many tokens, as it reported.
    Capacity {
        url: WorkerUrl,
        tokens: u64,
        checker: CancellationToken,
    },
}

/// Where a worker to add comes from, which decides whether
/// `server.worker_allowlist` applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The config file or flags: the operator wrote it, so it is trusted.
    Configured,
    /// Anything while running (the admin API, discovery): checked.
    Runtime,
}

/// One worker as the admin API shows it.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WorkerStatus {
    /// Base URL.
    pub url: String,
    /// The name decisions use: the URL's `host:port`.
    pub name: String,
    /// Registry id once admitted (`w3`), none while pending.
    pub id: Option<String>,
    /// Models served (empty: any, or not yet known).
    pub models: Vec<String>,
    /// `prefill` or `decode` in a disaggregated pool; absent for a regular
    /// worker.
    #[serde(skip_serializing_if = "WorkerRole::is_regular")]
    pub role: WorkerRole,
    /// A prefill worker's bootstrap port, when configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// Tokens the worker's KV cache holds, configured or reported on
    /// admission; absent where neither says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<u64>,
    /// `pending` (never answered yet), `healthy`, `unhealthy`, `unready`
    /// (held out of rotation by its source: a pod not ready), or
    /// `draining` (out of rotation, its requests in flight finishing).
    pub state: &'static str,
    /// The worker's circuit breaker, once admitted: `closed`, `open`
    /// (failures in a row: no requests until its timeout) or `half_open`
    /// (a probe request allowed), as the upkeep tick last published it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breaker: Option<&'static str>,
    /// Whether outlier detection has ejected the worker for now (it
    /// answered far slower than its peers); absent while pending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ejected: Option<bool>,
    /// Requests in flight through this gateway.
    pub load: usize,
    /// Requests finished.
    pub processed: u64,
    /// Why the last health check failed, while it fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// What the worker reported of its prompt cache against what the
    /// prefix tree predicted, once it has answered with a cached-token
    /// count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheView>,
}

/// A worker's cached-token figures on `/workers`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CacheView {
    /// Answers that reported cached tokens.
    pub reports: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Cached tokens the worker reported.
    pub reported_cached_tokens: u64,
    /// Cached tokens the prefix tree predicted.
    pub predicted_cached_tokens: u64,
    /// Reported cached over prompt tokens: the worker's real hit rate.
    pub reported_hit_rate: Option<f64>,
    /// Running mean of (predicted - reported) / prompt tokens.
    pub prediction_error: f64,
    /// Answers that trimmed the tree.
    pub trims: u64,
    /// Reports ignored as impossible.
    pub invalid_reports: u64,
}

impl CacheView {
    fn of(w: &radixgate_routing::Worker) -> Option<Self> {
        let t = w.cache_truth().snapshot();
        (t.reports > 0 || t.invalid > 0).then(|| Self {
            reports: t.reports,
            prompt_tokens: t.prompt_tokens,
            reported_cached_tokens: t.reported_tokens,
            predicted_cached_tokens: t.predicted_tokens,
            reported_hit_rate: t.reported_hit_rate(),
            prediction_error: t.prediction_error,
            trims: t.trims,
            invalid_reports: t.invalid,
        })
    }
}

/// A cheap, cloneable handle to the control task.
#[derive(Clone, Debug)]
pub struct Control {
    tx: mpsc::Sender<Command>,
    /// What the health checkers last saw of every known worker.
    board: health::Board,
    /// The workers draining now (out of the registry, requests finishing),
    /// as the control task last published them.
    draining: Arc<parking_lot::Mutex<Vec<Arc<radixgate_routing::Worker>>>>,
    /// Every URL the control task lets go of, as it does.
    freed: broadcast::Sender<WorkerUrl>,
    /// What each discovery watch last told of the API server.
    watches: Watches,
}

impl Control {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(make(reply)).await.ok()?;
        answer.await.ok()
    }

    /// Adds a worker found at runtime (the admin API, discovery); it must
    /// pass `server.worker_allowlist`, and starts receiving traffic once its
    /// probes pass.
    pub async fn add(&self, spec: WorkerSpec) -> Result<(), GatewayError> {
        self.add_from(spec, Source::Runtime).await
    }

    /// Adds a worker from the config file or flags: trusted, so not held
    /// to the allowlist.
    pub async fn add_configured(&self, spec: WorkerSpec) -> Result<(), GatewayError> {
        self.add_from(spec, Source::Configured).await
    }

    async fn add_from(&self, spec: WorkerSpec, source: Source) -> Result<(), GatewayError> {
        self.ask(|reply| Command::Add {
            spec,
            source,
            reply,
        })
        .await
        .unwrap_or(Err(shutting_down()))
    }

    /// Takes a worker out of rotation at once and forgets it when its
    /// requests in flight are done, or after `server.drain_timeout_secs`
    /// (see the module doc). Draining a draining worker changes nothing.
    pub async fn drain(&self, url: String) -> Result<Drained, GatewayError> {
        self.ask(|reply| Command::Drain {
            url,
            configured_only: false,
            reply,
        })
        .await
        .unwrap_or(Err(shutting_down()))
    }

    /// [`Control::drain`] for a reload: the worker at `url` only if the
    /// config file or flags added it; one another source holds there (a
    /// discovered pod, a `POST /workers`) is left, as if none were known.
    pub(crate) async fn drain_configured(&self, url: String) -> Result<Drained, GatewayError> {
        self.ask(|reply| Command::Drain {
            url,
            configured_only: true,
            reply,
        })
        .await
        .unwrap_or(Err(shutting_down()))
    }

    /// Holds a worker out of rotation (`ready: false`) or lets it back,
    /// keeping its tree record (see the module doc).
    pub async fn set_ready(&self, url: String, ready: bool) -> Result<(), GatewayError> {
        self.ask(|reply| Command::Ready { url, ready, reply })
            .await
            .unwrap_or(Err(shutting_down()))
    }

    /// Removes a worker by URL at once; requests in flight on it finish
    /// normally, but it is no longer listed.
    pub async fn remove(&self, url: String) -> Result<(), GatewayError> {
        self.ask(|reply| Command::Remove {
            url,
            configured_only: false,
            reply,
        })
        .await
        .unwrap_or(Err(shutting_down()))
    }

    /// [`Control::remove`] for a reload, as [`Control::drain_configured`].
    pub(crate) async fn remove_configured(&self, url: String) -> Result<(), GatewayError> {
        self.ask(|reply| Command::Remove {
            url,
            configured_only: true,
            reply,
        })
        .await
        .unwrap_or(Err(shutting_down()))
    }

    /// Gives the worker at `spec`'s URL `spec`'s key and KV cache size in
    /// place, when its entry differs from `spec` in those alone (`api_key`,
    /// `api_key_env`, and a `kv_capacity_tokens` given before and after):
    /// its requests, health checks and tree go on, where a remove and add
    /// would take it out of rotation until probed again and forget its
    /// tree (a key rotated on every worker at once would leave the pool
    /// empty meanwhile). `false` where it does not apply: a worker not
    /// known, draining, not yet admitted when its size changed, or whose
    /// entry changed otherwise.
    pub async fn rekey(&self, spec: WorkerSpec) -> bool {
        self.ask(|reply| Command::Rekey { spec, reply })
            .await
            .unwrap_or(false)
    }

    /// The URLs no worker holds any more from now on, as the control task
    /// lets go of them (a worker removed, or its drain ended); a receiver
    /// that falls more than [`FREED_BACKLOG`] behind is told it lagged.
    #[cfg(feature = "kubernetes")]
    pub(crate) fn freed(&self) -> broadcast::Receiver<WorkerUrl> {
        self.freed.subscribe()
    }

    /// The workers draining now: out of the registry's snapshot, their
    /// requests in flight finishing (their load is still read, e.g. for the
    /// in-flight gauge).
    pub(crate) fn draining(&self) -> Vec<Arc<radixgate_routing::Worker>> {
        self.draining.lock().clone()
    }

    /// Why no worker serving `model` (any, when `None`) can take a request
    /// now: the tail of a 503's message (see [`health::Board::explain`]),
    /// with the discovery watches that fail; with no worker known at all
    /// and discovery on, what each watch found ([`Watches::explain_empty`]).
    pub(crate) fn why_unavailable(&self, admitted: &WorkerSet, model: Option<&str>) -> String {
        if self.board.is_empty()
            && let Some(why) = self.watches.explain_empty()
        {
            return why;
        }
        let why = self.board.explain(admitted, model);
        match self.watches.explain_failing() {
            Some(failing) => format!("{why}; {failing}"),
            None => why,
        }
    }

    /// What each discovery watch last told of the API server, written by
    /// the watches and read by `/readiness`.
    pub(crate) fn watches(&self) -> &Watches {
        &self.watches
    }

    /// Whether every known worker has been admitted or has failed a
    /// probe (see [`health::Board::settled`]).
    pub(crate) fn probes_settled(&self) -> bool {
        self.board.settled()
    }

    /// Workers known and not admitted yet (see [`health::Board::pending`]).
    pub(crate) fn pending(&self) -> usize {
        self.board.pending()
    }

    /// Has the worker at `url` asked for its models again soon (see
    /// [`health::Board::reread_models`]).
    pub(crate) fn reread_models(&self, url: &str) {
        self.board.reread_models(url);
    }

    /// Every known worker, admitted or pending, in URL order.
    pub async fn list(&self) -> Vec<WorkerStatus> {
        self.ask(|reply| Command::List { reply })
            .await
            .unwrap_or_default()
    }

    /// Replaces the routing policy (a reload changed the routing settings);
    /// the registry tells it about every current worker first.
    pub async fn set_policy(&self, policy: Arc<dyn Policy>) -> Result<(), GatewayError> {
        self.ask(|reply| Command::SetPolicy { policy, reply })
            .await
            .ok_or_else(shutting_down)
    }

    /// From the health checker whose token is `checker`: the worker at
    /// `url` passed its first probes and serves what `served` says; the
    /// control task adds it to the registry, unless that checker was
    /// stopped meanwhile (see [`Command::Admit`]).
    pub(crate) async fn admit(
        &self,
        url: WorkerUrl,
        served: Served,
        kv_capacity_tokens: Option<u64>,
        checker: &CancellationToken,
    ) {
        self.send(Command::Admit {
            url,
            served,
            kv_capacity_tokens,
            checker: checker.clone(),
        })
        .await;
    }

    /// From the health checker whose token is `checker`: the admitted
    /// worker at `url` became healthy or unhealthy; back healthy, it
    /// serves what `models` says, where it was asked and said: a worker
    /// restarted with another model is routed for that one from now on,
    /// and one whose LoRA adapters changed for those it has now.
    pub(crate) async fn report_health(
        &self,
        url: WorkerUrl,
        healthy: bool,
        models: Option<Served>,
        checker: &CancellationToken,
    ) {
        let checker = checker.clone();
        self.send(Command::Health {
            url,
            healthy,
            models,
            checker,
        })
        .await;
    }

    /// From the health checker whose token is `checker`: the worker at
    /// `url` reported that its KV cache holds `tokens`.
    pub(crate) async fn set_capacity(
        &self,
        url: WorkerUrl,
        tokens: u64,
        checker: &CancellationToken,
    ) {
        let checker = checker.clone();
        self.send(Command::Capacity {
            url,
            tokens,
            checker,
        })
        .await;
    }

    async fn send(&self, command: Command) {
        // Only fails when the control task is gone, i.e. during shutdown,
        // when nothing is left to inform.
        let _ = self.tx.send(command).await;
    }
}

fn shutting_down() -> GatewayError {
    GatewayError::ShuttingDown
}

struct Known {
    spec: WorkerSpec,
    id: Option<WorkerId>,
    /// The key its health checker sends.
    api_key: Arc<ArcSwapOption<String>>,
    /// Stops this worker's health checker.
    cancel: CancellationToken,
    /// Set while draining: out of the registry, requests finishing.
    draining: Option<Draining>,
    /// Its health checker's verdict (true from admission).
    healthy: bool,
    /// Its source's verdict ([`Control::set_ready`]; true unless told).
    ready: bool,
    /// Who added it: a reload changes only the config's own.
    source: Source,
}

/// What the control task needs besides the registry: its settings and
/// metric families.
pub(crate) struct Settings {
    /// How health checkers probe.
    pub(crate) health: HealthConfig,
    /// `server.worker_allowlist`, for workers added at runtime.
    pub(crate) allowlist: Allowlist,
    /// `server.drain_timeout_secs`.
    pub(crate) drain_timeout: Duration,
}

/// Starts the control task. It stops when `shutdown` is cancelled (its
/// health checkers with it).
pub(crate) fn spawn(
    registry: Registry,
    client: reqwest::Client,
    settings: Settings,
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> (Control, JoinHandle<()>) {
    let Settings {
        health,
        allowlist,
        drain_timeout,
    } = settings;
    let (tx, rx) = mpsc::channel(256);
    let control = Control {
        tx,
        board: health::Board::default(),
        draining: Arc::default(),
        freed: broadcast::channel(FREED_BACKLOG).0,
        watches: Watches::default(),
    };
    let task = ControlTask {
        registry,
        known: BTreeMap::new(),
        client,
        health,
        allowlist,
        drain_timeout,
        drains: metrics.labelled_counters(&DRAINS, "end"),
        control: control.clone(),
        shutdown,
    };
    (control, tokio::spawn(task.run(rx)))
}

struct ControlTask {
    registry: Registry,
    known: BTreeMap<WorkerUrl, Known>,
    client: reqwest::Client,
    health: HealthConfig,
    /// `server.worker_allowlist`, for [`Source::Runtime`] workers.
    allowlist: Allowlist,
    drain_timeout: Duration,
    drains: LabelledCounters,
    control: Control,
    shutdown: CancellationToken,
}

impl ControlTask {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        loop {
            let draining = self.known.values().any(|k| k.draining.is_some());
            let command = tokio::select! {
                () = self.shutdown.cancelled() => break,
                command = rx.recv() => match command {
                    Some(command) => command,
                    None => break,
                },
                () = tokio::time::sleep(DRAIN_POLL), if draining => {
                    self.sweep_drains();
                    self.publish_draining();
                    continue;
                }
            };
            self.handle(command);
            self.publish_draining();
        }
        for known in self.known.values() {
            known.cancel.cancel();
        }
    }

    /// Publishes the draining workers to [`Control::draining`].
    fn publish_draining(&self) {
        let draining: Vec<_> = self
            .known
            .values()
            .filter_map(|k| k.draining.as_ref().map(|d| d.worker.clone()))
            .collect();
        *self.control.draining.lock() = draining;
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Add {
                spec,
                source,
                reply,
            } => {
                let _ = reply.send(self.add(spec, source));
            }
            Command::Remove {
                url,
                configured_only,
                reply,
            } => {
                let result = self.may_change(&url, configured_only);
                let _ = reply.send(result.and_then(|()| self.remove(&url)));
            }
            Command::Rekey { spec, reply } => {
                let _ = reply.send(self.rekey(spec));
            }
            Command::Drain {
                url,
                configured_only,
                reply,
            } => {
                let result = self.may_change(&url, configured_only);
                let _ = reply.send(result.and_then(|()| self.drain(&url)));
            }
            Command::Ready { url, ready, reply } => {
                let _ = reply.send(self.set_ready(&url, ready));
            }
            Command::List { reply } => {
                self.sweep_drains();
                let _ = reply.send(self.list());
            }
            Command::SetPolicy { policy, reply } => {
                self.registry.set_policy(policy);
                let _ = reply.send(());
            }
            Command::Admit { checker, .. }
            | Command::Health { checker, .. }
            | Command::Capacity { checker, .. }
                if checker.is_cancelled() => {}
            Command::Admit {
                url,
                served,
                kv_capacity_tokens,
                ..
            } => self.admit(url, served, kv_capacity_tokens),
            Command::Capacity { url, tokens, .. } => self.set_capacity(&url, tokens),
            Command::Health {
                url,
                healthy,
                models,
                ..
            } => {
                if let Some(served) = models {
                    // Back from an outage, perhaps a restart, which drops
                    // the adapters loaded at runtime.
                    let back = healthy && self.known.get(&url).is_some_and(|k| !k.healthy);
                    self.relist(&url, served, back);
                }
                let Some(known) = self.known.get_mut(&url) else {
                    return;
                };
                known.healthy = healthy;
                let ready = known.ready;
                if let Some(id) = known.id {
                    match self.registry.set_health(id, healthy && ready) {
                        Ok(true) => tracing::info!(worker = %url, healthy, "worker health changed"),
                        Ok(false) => {}
                        Err(err) => {
                            tracing::warn!(worker = %url, %err, "health update for a removed worker")
                        }
                    }
                }
            }
        }
    }

    fn add(&mut self, spec: WorkerSpec, source: Source) -> Result<(), GatewayError> {
        // Admin API bodies have always been allowed surrounding whitespace;
        // the URL rule itself does not allow it.
        let url = WorkerUrl::parse(spec.url.trim()).map_err(GatewayError::Admin)?;
        if source == Source::Runtime {
            self.allowlist.check(&url)?;
        }
        match self.known.get(&url) {
            // A new worker at a draining one's address (a new pod on a
            // reused IP): the old one's requests keep their guards.
            Some(known) if known.draining.is_some() => {
                tracing::info!(worker = %url, "a new worker replaces the draining one at this URL");
                self.forget(&url, "removed");
            }
            Some(_) => {
                return Err(GatewayError::Admin(RoutingError::DuplicateWorker {
                    url: url.into(),
                }));
            }
            None => {}
        }
        let cancel = self.shutdown.child_token();
        let api_key = Arc::new(ArcSwapOption::from_pointee(spec.api_key.clone()));
        let reread = self.control.board.known(&url);
        tokio::spawn(health::watch(health::Target {
            url: url.clone(),
            api_key: api_key.clone(),
            models: spec.models.clone(),
            kv_capacity_tokens: spec.kv_capacity_tokens,
            client: self.client.clone(),
            config: self.health.clone(),
            control: self.control.clone(),
            board: self.control.board.clone(),
            reread,
            cancel: cancel.clone(),
        }));
        tracing::info!(worker = %url, name = spec.name.as_deref(), "worker added; probing");
        self.known.insert(
            url,
            Known {
                spec,
                id: None,
                api_key,
                cancel,
                draining: None,
                healthy: false,
                ready: true,
                source,
            },
        );
        Ok(())
    }

    /// `Ok` unless `configured_only` (a reload's command) and the worker at
    /// `url` is another source's: that one reads as not known, and the
    /// reload leaves it. (None known there is for the command to report.)
    fn may_change(&self, url: &str, configured_only: bool) -> Result<(), GatewayError> {
        if !configured_only {
            return Ok(());
        }
        let url = &*WorkerUrl::canonical(url.trim());
        match self.known.get(url) {
            Some(known) if known.source != Source::Configured => {
                tracing::info!(worker = %url, "held by another source (discovery or the admin API); the reload leaves it");
                Err(GatewayError::UnknownWorkerUrl {
                    url: url.to_owned(),
                })
            }
            _ => Ok(()),
        }
    }

    fn set_ready(&mut self, url: &str, ready: bool) -> Result<(), GatewayError> {
        let url = &*WorkerUrl::canonical(url.trim());
        let known = self
            .known
            .get_mut(url)
            .ok_or_else(|| GatewayError::UnknownWorkerUrl {
                url: url.to_owned(),
            })?;
        if known.ready == ready {
            return Ok(());
        }
        known.ready = ready;
        tracing::info!(worker = %url, ready, "worker's source changed its readiness");
        if let Some(id) = known.id {
            self.registry
                .set_health(id, known.healthy && ready)
                .map_err(GatewayError::Admin)?;
        }
        Ok(())
    }

    fn remove(&mut self, url: &str) -> Result<(), GatewayError> {
        // Not parsed: a URL that was never accepted is simply not known.
        let url = &*WorkerUrl::canonical(url.trim());
        let (url, known) =
            self.known
                .remove_entry(url)
                .ok_or_else(|| GatewayError::UnknownWorkerUrl {
                    url: url.to_owned(),
                })?;
        known.cancel.cancel();
        self.control.board.forget(url.as_str());
        if known.draining.is_some() {
            self.drains.increment("removed");
        }
        if let Some(id) = known.id {
            self.registry.remove(id).map_err(GatewayError::Admin)?;
        }
        tracing::info!(worker = %url, "worker removed");
        self.let_go(url);
        Ok(())
    }

    /// See [`Control::rekey`].
    fn rekey(&mut self, spec: WorkerSpec) -> bool {
        let url = &*WorkerUrl::canonical(spec.url.trim());
        let Some(known) = self.known.get_mut(url) else {
            return false;
        };
        // What may change in place: the key, and a KV cache size given
        // before and after (one not given is asked of the worker by its
        // health checker, which a change to or from none would have to
        // start or stop: such an entry is replaced). The URL is found
        // canonical above: how each spells it does not matter.
        let fixed = |s: &WorkerSpec| WorkerSpec {
            url: String::new(),
            api_key: None,
            api_key_env: None,
            kv_capacity_tokens: s.kv_capacity_tokens.map(|_| 1),
            ..s.clone()
        };
        if known.draining.is_some()
            || known.source != Source::Configured
            || fixed(&known.spec) != fixed(&spec)
        {
            return false;
        }
        let worker = known
            .id
            .and_then(|id| self.registry.snapshot().get(id).cloned());
        let resized = known.spec.kv_capacity_tokens != spec.kv_capacity_tokens;
        if resized && worker.is_none() {
            // Not admitted yet: its health checker would admit it with the
            // size it was started with.
            return false;
        }
        if known.spec.api_key != spec.api_key {
            known.api_key.store(spec.api_key.clone().map(Arc::new));
            if let Some(worker) = &worker {
                worker.set_api_key(spec.api_key.clone());
            }
            tracing::info!(worker = %url, "worker's API key changed");
        }
        if let Some(tokens) = spec.kv_capacity_tokens
            && resized
            && let Some(worker) = &worker
        {
            // The health checker passes its copy on only at admission.
            worker.set_kv_capacity_tokens(tokens);
            tracing::info!(worker = %url, kv_capacity_tokens = tokens, "worker's KV cache size changed");
        }
        known.spec = spec;
        true
    }

    /// Tells the sources listening ([`Control::freed`]) that no worker
    /// holds `url` any more.
    fn let_go(&self, url: WorkerUrl) {
        // Fails only while nobody listens, when nobody needs to know.
        let _ = self.control.freed.send(url);
    }

    fn admit(&mut self, url: WorkerUrl, served: Served, kv_capacity_tokens: Option<u64>) {
        let Some(known) = self.known.get_mut(&url) else {
            return;
        };
        if known.id.is_some() || known.draining.is_some() {
            return;
        }
        let spec = WorkerSpec {
            url: url.to_string(),
            models: served.models,
            max_model_len: served.max_model_len,
            origins: served.origins,
            kv_capacity_tokens,
            ..known.spec.clone()
        }
        .with_health(known.ready);
        match self.registry.add(spec) {
            Ok(worker) => {
                tracing::info!(worker = %url, id = %worker.id(), models = ?worker.models(), kv_capacity_tokens = ?worker.kv_capacity_tokens(), "worker admitted");
                known.id = Some(worker.id());
                known.healthy = true;
                self.control.board.admitted(&url);
            }
            Err(err) => tracing::error!(worker = %url, %err, "worker could not be admitted"),
        }
    }

    /// The admitted worker at `url` serves what `served` says, read again
    /// (back from a failure, or every `models_refresh_secs`). Where that
    /// changed:
    ///
    /// - LoRA adapters loaded or unloaded at runtime ([`adapters_only`]):
    ///   its model list changes in place, under the same id, so its tree
    ///   records for the base model and the adapters it kept go on (an
    ///   adapter's records are forgotten when it goes, or comes back from
    ///   another path: its cache is not the old one);
    /// - anything else, a restart with another model: it is replaced in
    ///   the registry by one that serves the new models, as it was
    ///   (health, key, KV cache size), its tree afresh, as it would be on
    ///   a worker removed and added again: it told of a cache the restart
    ///   emptied.
    ///
    /// Either way requests for a new model reach it from now on and those
    /// for a model it left no longer do. Any change found when it is
    /// `back` from an outage is taken for a restart: an engine restarted
    /// lists its base model without the adapters loaded into it at
    /// runtime, its cache emptied.
    fn relist(&mut self, url: &WorkerUrl, served: Served, back: bool) {
        let Some(known) = self.known.get_mut(url) else {
            return;
        };
        let Some(id) = known.id else {
            return;
        };
        let Some(worker) = self.registry.snapshot().get(id).cloned() else {
            return;
        };
        let was = Served {
            models: worker.models().to_vec(),
            origins: worker
                .models()
                .iter()
                .filter_map(|m| worker.origin(m).map(|o| (m.clone(), o)))
                .collect(),
            max_model_len: worker.max_model_len(),
        };
        // The same models in another order are the same worker.
        let sorted = |m: &[String]| {
            let mut m = m.to_vec();
            m.sort_unstable();
            m
        };
        if sorted(&was.models) == sorted(&served.models)
            && was.origins == served.origins
            && was.max_model_len == served.max_model_len
        {
            return;
        }
        if !back && adapters_only(&was, &served) {
            // An adapter loaded again from elsewhere: its old records go,
            // as an adapter unloaded's do.
            let reloaded: Vec<String> = served
                .models
                .iter()
                .filter(|m| was.models.contains(m) && was.origins.get(*m) != served.origins.get(*m))
                .cloned()
                .collect();
            let models = served.models.clone();
            match self.registry.relist(
                id,
                served.models,
                served.origins,
                served.max_model_len,
                &reloaded,
            ) {
                Ok(_) => tracing::info!(
                    worker = %url,
                    id = %id,
                    was = ?was.models,
                    models = ?models,
                    "worker's LoRA adapters changed; it is routed for these from now on, its cache record kept"
                ),
                Err(err) => {
                    tracing::error!(worker = %url, %err, "worker's new adapters could not be listed")
                }
            }
            return;
        }
        let spec = WorkerSpec {
            url: url.to_string(),
            models: served.models,
            max_model_len: served.max_model_len,
            origins: served.origins,
            kv_capacity_tokens: worker.kv_capacity_tokens(),
            ..known.spec.clone()
        }
        .with_health(worker.is_healthy());
        known.id = None;
        if let Err(err) = self.registry.remove(id) {
            tracing::warn!(worker = %url, %err, "models changed on a worker already removed");
        }
        match self.registry.add(spec) {
            Ok(relisted) => {
                tracing::info!(
                    worker = %url,
                    id = %relisted.id(),
                    was = ?was.models,
                    models = ?relisted.models(),
                    "worker's models changed; it is routed for these from now on"
                );
                known.id = Some(relisted.id());
            }
            Err(err) => {
                tracing::error!(worker = %url, %err, "worker could not be admitted with its new models")
            }
        }
    }

    /// The admitted worker at `url` reported its KV cache's size.
    fn set_capacity(&mut self, url: &WorkerUrl, tokens: u64) {
        let Some(id) = self.known.get(url).and_then(|known| known.id) else {
            return;
        };
        let Some(worker) = self.registry.snapshot().get(id).cloned() else {
            return;
        };
        let was = worker.kv_capacity_tokens();
        if was != Some(tokens) {
            worker.set_kv_capacity_tokens(tokens);
            tracing::info!(worker = %url, kv_capacity_tokens = tokens, was = ?was, "worker's KV cache size read");
        }
    }

    fn list(&self) -> Vec<WorkerStatus> {
        let snapshot = self.registry.snapshot();
        self.known
            .iter()
            .map(|(url, known)| {
                let draining = known.draining.as_ref().map(|d| &d.worker);
                let worker = known.id.and_then(|id| snapshot.get(id)).or(draining);
                WorkerStatus {
                    url: url.to_string(),
                    name: known
                        .spec
                        .name
                        .clone()
                        .unwrap_or_else(|| url.name().to_owned()),
                    id: worker.map(|w| w.id().to_string()),
                    models: worker.map(|w| w.models().to_vec()).unwrap_or_default(),
                    role: known.spec.role,
                    bootstrap_port: known.spec.bootstrap_port,
                    kv_capacity_tokens: worker.and_then(|w| w.kv_capacity_tokens()),
                    state: match worker {
                        _ if draining.is_some() => "draining",
                        _ if !known.ready => "unready",
                        None => "pending",
                        Some(w) if w.is_healthy() => "healthy",
                        Some(_) => "unhealthy",
                    },
                    breaker: worker.map(|w| w.breaker().as_str()),
                    ejected: worker.map(|w| w.is_ejected()),
                    load: worker.map_or(0, |w| w.load()),
                    processed: worker.map_or(0, |w| w.processed()),
                    problem: self.control.board.problem(url),
                    cache: worker.and_then(|w| CacheView::of(w)),
                }
            })
            .collect()
    }
}

/// Whether a worker that served `was` and now serves `now` is the same
/// engine with LoRA adapters loaded or unloaded: it names a base model
/// (an entry without a `parent`), its base models (and their `root`) are
/// the same and so is its longest context; only adapters (entries naming a `parent`) came or
/// went. A worker whose entries name no parent (an engine without
/// adapters, or one that does not say) is taken to have restarted
/// whenever its list changes, as is one that now serves another base
/// model: either way its cache was emptied.
fn adapters_only(was: &Served, now: &Served) -> bool {
    // With what each says of its root: a base model loaded from
    // elsewhere under the same name is another model.
    let bases = |s: &Served| -> BTreeMap<String, Option<String>> {
        s.models
            .iter()
            .filter_map(|m| match s.origins.get(m) {
                Some(o) if o.is_adapter() => None,
                o => Some((m.clone(), o.and_then(|o| o.root.clone()))),
            })
            .collect()
    };
    let before = bases(was);
    !before.is_empty() && before == bases(now) && was.max_model_len == now.max_model_len
}

#[cfg(test)]
mod tests;
