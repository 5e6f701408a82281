//! Kubernetes pod discovery: one watch per pool (label selector), turning
//! pod events into the control task's commands.
//!
//! Discovery is a *source* of workers like the admin API: it only calls
//! [`Control::add`] (held to `server.worker_allowlist` like any runtime
//! worker), [`Control::drain`], [`Control::remove`] and
//! [`Control::set_ready`], and never touches the registry. Static workers
//! and discovered ones live side by side.
//!
//! Per pod (see `pod.rs` for what the object says):
//! - first seen serving → added, named after the pod;
//! - turned unready → held out of rotation, its tree record kept;
//!   ready again → back;
//! - terminating, finished (its phase `Failed` or `Succeeded`: evicted,
//!   say, its object kept with its IP until someone deletes it) or
//!   deleted → drained: no new requests at once, removed when its requests
//!   in flight are done, its address free for the next pod;
//! - its URL changed (a new IP, a new port), its bootstrap port or its
//!   models (its label or annotation) → the old one removed, the new one
//!   added;
//! - refused by the control task (the allowlist, another worker at its
//!   URL) → not offered again until its URL changes or that URL is freed:
//!   a pod of this watch leaves it (after a relist, a new pod on a
//!   departed pod's IP and port is listed before the departed one is
//!   found gone), or the control task lets go of it, whichever source
//!   held it (a static worker dropped by a reload or DELETE /workers:
//!   the pod at its address, still serving, takes it over).
//!
//! A discovered worker has its pool's role (`regular`, or `prefill` or
//! `decode` in a disaggregated pool), and a prefill pod its bootstrap port
//! (its annotation's, else the pool's).
//!
//! The watch is kube-runtime's watcher with the selector pushed to the API
//! server: a broken watch resumes from the last resource version it saw, a
//! `410 Gone` (as a watch event, or as the status of the watch request)
//! starts over with a fresh list, after which pods missing from it are
//! treated as deleted. While the API server cannot be reached, or
//! refuses the list (no RBAC), the router keeps routing to what it knows;
//! the watch retries with back-off (0.8 s doubling to 30 s, jittered, and
//! not started over until a list completes or the watch brings a change),
//! a WARN says so (at most once a minute), and
//! `radixgate_discovery_connected` reads 0, and the control handle's
//! `Watches` keep the API server's reason, which
//! a 503 for want of a worker and `/readiness` give. It reads 1 once a list
//! completed, the API server accepted a watch (told by the client's layer,
//! `answer.rs`: a watch resumed after an outage brings nothing while no pod
//! changes) or the watch brought a change: the watcher's `Init` comes
//! before the list is even asked for. An answer that stays
//! silent longer than a watch is asked to stay open (290 s, as
//! kube-runtime's) and a tenth more is given up on and retried, so a list
//! or watch sent to an API server host that died with the connection open
//! does not wait forever; so is one not over within that time of being
//! asked (a list trickled a byte at a time). A list answer over 64 MiB, or
//! a watch event over 16 MiB, is given up on and retried the same way (see
//! `answer.rs`).
//!
//! A malformed object is logged (once per pod and resource version) and
//! skipped; what it was before stays as it was. Log lines carry the first
//! 1 KiB of an error's text: serde quotes a wrong value whole.
//!
//! Concurrency: each pool's task owns its own map of the pods it tracks;
//! nothing here is shared but the control handle and metric families.

mod answer;
mod object;
mod pod;

use crate::config::{DiscoveryConfig, Pool};
use crate::control::Control;
use crate::metrics::{Describe, Family, LabelledCounters, Metrics};
use futures::StreamExt as _;
use kube::Api;
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use metrics::{Gauge, Label};
use object::RawPod;
use pod::Seen;
use radixgate_routing::WorkerSpec;
use radixgate_routing::WorkerUrl;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, broadcast};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A WARN about the same unreachable API server is repeated this often.
const REPEAT_WARNING: Duration = Duration::from_secs(60);

/// The longest wait between tries, should the back-off give none (kube's
/// grows from 0.8 s to 30 s, jittered up to twice that).
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The most of an error's text a log line carries: serde quotes a wrong
/// value whole, and the API server's messages are its own to size.
const LOGGED_TEXT: usize = 1024;

const CONNECTED: Describe = Describe::new(
    "radixgate_discovery_connected",
    "Whether each discovery watch (by label selector) is connected to the Kubernetes \
     API server (1: a list completed, a watch was accepted or a change came since the last \
     error) or retrying (0); \
     while 0 the router routes to the workers it knows.",
);
const EVENTS: Describe = Describe::new(
    "radixgate_discovery_events_total",
    "Pod discovery events: `applied` (a pod added or changed), `deleted`, `relisted` \
     (a fresh list completed, at start or after 410 Gone), `malformed` (an object skipped), \
     `error` (the watch failed and retries).",
);

/// Why discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// No usable cluster configuration (in-cluster or kubeconfig).
    #[error("discovery: no Kubernetes configuration: {0}")]
    Config(String),
    /// The client could not be built from it.
    #[error("discovery: cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// The cluster's client settings: in a pod, its service account
/// (in-cluster); elsewhere `$KUBECONFIG` or `~/.kube/config`;
/// `discovery.kubeconfig` overrides both.
async fn kube_config(config: &DiscoveryConfig) -> Result<kube::Config, DiscoveryError> {
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| DiscoveryError::Config(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| DiscoveryError::Config(format!("{}: {e}", path.display())))?
        }
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            kube::Config::incluster().map_err(|e| DiscoveryError::Config(e.to_string()))?
        }
        None => kube::Config::from_kubeconfig(&Default::default())
            .await
            .map_err(|e| DiscoveryError::Config(e.to_string()))?,
    };
    let mut kube_config = kube_config;
    // kube reads answers with no timeout: a list, or the start of a watch,
    // sent to an API server that took it and went silent (its host gone
    // with the connection open) waited forever.
    kube_config.read_timeout = Some(read_timeout(config.watch_timeout_secs));
    // Counted from the request, not from when its pooled connection went
    // idle.
    kube_config.reset_reader_on_write = true;
    Ok(kube_config)
}

/// One pool's client: `answered` is told each time the API server accepts
/// one of its watches, which the watcher itself does not say.
fn client(
    kube_config: kube::Config,
    watch_timeout_secs: u32,
    answered: Arc<Notify>,
) -> Result<kube::Client, DiscoveryError> {
    // kube reads answers without a size bound, and a timeout that only
    // silence trips (see `answer.rs`).
    let deadline = read_timeout(watch_timeout_secs);
    Ok(kube::client::ClientBuilder::try_from(kube_config)?
        .with_layer(&answer::Bounded { deadline, answered })
        .build())
}

/// How long an answer from the API server may stay silent, and how long
/// it may take in all: longer than a watch asks to stay open, since a
/// watch sends nothing while no pod changes until the API server ends it.
fn read_timeout(watch_timeout_secs: u32) -> Duration {
    let watch = Duration::from_secs(watch_timeout_secs.max(1).into());
    watch + (watch / 10).max(Duration::from_secs(1))
}

/// The discovery metric families, shared by every pool's task.
struct DiscoveryMetrics {
    connected: Family<Box<str>, Gauge>,
    events: LabelledCounters,
}

impl DiscoveryMetrics {
    fn connected(&self, selector: &str, connected: bool) {
        self.connected.with(
            selector,
            || selector.into(),
            || vec![Label::new("selector", selector.to_owned())],
            |g| g.set(if connected { 1.0 } else { 0.0 }),
        );
    }
}

/// Starts one watch per pool of `config` (which must be enabled). They
/// stop with `stop`.
pub(crate) async fn spawn(
    config: &DiscoveryConfig,
    control: Control,
    metrics: &Metrics,
    stop: CancellationToken,
) -> Result<Vec<JoinHandle<()>>, DiscoveryError> {
    let kube_config = kube_config(config).await?;
    let metrics = Arc::new(DiscoveryMetrics {
        connected: metrics.gauges(&CONNECTED),
        events: metrics.labelled_counters(&EVENTS, "event"),
    });
    // Every pool's client before any watch starts: one that cannot be
    // built is a start-up error, with no watch left running.
    let pools = config
        .resolved_pools()
        .into_iter()
        .map(|pool| {
            let answered = Arc::new(Notify::new());
            let client = client(
                kube_config.clone(),
                config.watch_timeout_secs,
                answered.clone(),
            )?;
            Ok((pool, client, answered))
        })
        .collect::<Result<Vec<_>, DiscoveryError>>()?;
    Ok(pools
        .into_iter()
        .map(|(pool, client, answered)| {
            tracing::info!(
                selector = %pool.name,
                namespace = pool.namespace.as_deref().unwrap_or("(all)"),
                role = %pool.role,
                "discovery: watching pods"
            );
            let watch = PoolWatch {
                api: match &pool.namespace {
                    Some(ns) => Api::namespaced(client, ns),
                    None => Api::all(client),
                },
                answered,
                pool,
                watch_timeout_secs: config.watch_timeout_secs.max(1),
                freed: control.freed(),
                control: control.clone(),
                metrics: metrics.clone(),
                pods: BTreeMap::new(),
                listing: None,
                complained: BTreeMap::new(),
                refused: BTreeMap::new(),
            };
            tokio::spawn(watch.run(stop.clone()))
        })
        .collect())
}

/// One pool's watch and the pods it turned into workers.
struct PoolWatch {
    api: Api<RawPod>,
    /// Told each time the API server accepts one of this pool's watches.
    answered: Arc<Notify>,
    pool: Pool,
    /// The `timeoutSeconds` each watch asks for.
    watch_timeout_secs: u32,
    control: Control,
    /// The URLs the control task lets go of ([`Control::freed`]).
    freed: broadcast::Receiver<WorkerUrl>,
    metrics: Arc<DiscoveryMetrics>,
    /// Pods (by `namespace/name`) this watch made workers, by URL.
    pods: BTreeMap<String, Tracked>,
    /// During a (re)list: the pods listed so far.
    listing: Option<BTreeSet<String>>,
    /// Malformed objects already logged: pod key → resource version.
    complained: BTreeMap<String, String>,
    /// Pods the control task refused (the allowlist, a duplicate URL),
    /// by key, with what they were offered: not offered again until their
    /// URL changes, or that URL is freed.
    refused: BTreeMap<String, WorkerSpec>,
}

/// A pod this watch sent to the control task.
struct Tracked {
    url: String,
    /// The bootstrap port it was added with.
    bootstrap_port: Option<u16>,
    /// The models it was added with.
    models: Vec<String>,
    /// Whether it was last told ready.
    ready: bool,
}

impl PoolWatch {
    async fn run(mut self, stop: CancellationToken) {
        let config = watcher::Config::default()
            .labels(&self.pool.selector)
            .timeout(self.watch_timeout_secs);
        let mut events = watcher::watcher(self.api.clone(), config.clone()).boxed();
        // Ours, not `.default_backoff()`'s: that one starts over on any
        // `Ok`, and a failed list is followed by an `Init` at once, so a
        // list that keeps failing was retried every 0.8 s.
        let mut backoff = DefaultBackoff::default();
        // Since when the API server has failed us, while it does.
        let mut outage: Option<Instant> = None;
        // The last WARN: at most one a minute, however often it flaps.
        let mut warned: Option<Instant> = None;
        self.metrics.connected(&self.pool.name, false);
        self.control
            .watches()
            .started(&self.pool.name, self.pool.namespace.as_deref());
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => event,
                freed = self.freed.recv() => {
                    self.let_go(freed).await;
                    continue;
                }
                // Connected, though the back-off is not started over: a
                // watch accepted and then failed at once is retried no
                // faster.
                () = self.answered.notified() => {
                    self.answers(&mut outage);
                    continue;
                }
            };
            match event {
                None => return,
                Some(Ok(event)) => {
                    // `Init` comes before the list is asked for, and a page
                    // of it before the rest: neither says the API server
                    // answers a whole list or a watch.
                    if !matches!(event, Event::Init | Event::InitApply(_)) {
                        backoff.reset();
                        self.answers(&mut outage);
                    }
                    self.handle(event).await;
                }
                Some(Err(err)) => {
                    self.metrics.events.increment("error");
                    self.metrics.connected(&self.pool.name, false);
                    self.control
                        .watches()
                        .failed(&self.pool.name, problem(&err));
                    let now = Instant::now();
                    outage.get_or_insert(now);
                    if warned.is_none_or(|at| now.duration_since(at) >= REPEAT_WARNING) {
                        warned = Some(now);
                        tracing::warn!(
                            selector = %self.pool.name,
                            error = %excerpt(&err.to_string()),
                            workers = self.pods.len(),
                            "discovery: the Kubernetes API server watch failed; routing \
                             continues to the workers known, retrying with back-off"
                        );
                    }
                    // kube-runtime relists on a 410 sent as a watch event,
                    // but one that refuses the watch request itself was
                    // retried from the same version for good.
                    if gone(&err) {
                        events = watcher::watcher(self.api.clone(), config.clone()).boxed();
                    }
                    let pause = backoff.next().unwrap_or(MAX_BACKOFF);
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }

    /// The API server answers: a list completed, a watch was accepted, or
    /// it brought a change.
    fn answers(&self, outage: &mut Option<Instant>) {
        if let Some(since) = outage.take() {
            tracing::info!(
                selector = %self.pool.name,
                down_for = ?since.elapsed(),
                "discovery: the Kubernetes API server answers again"
            );
        }
        self.metrics.connected(&self.pool.name, true);
        self.control.watches().answers(&self.pool.name);
    }

    async fn handle(&mut self, event: Event<RawPod>) {
        match event {
            Event::Init => self.listing = Some(BTreeSet::new()),
            Event::InitApply(raw) => {
                if let (Some(listing), Some(key)) = (&mut self.listing, pod::key(&raw)) {
                    listing.insert(key);
                }
                self.apply(&raw).await;
            }
            Event::InitDone => {
                // Counted when complete: a list that failed half-way is
                // started over (another `Init`) and counted once.
                self.metrics.events.increment("relisted");
                let listed = self.listing.take().unwrap_or_default();
                // The pods not listed are gone. Those never made workers
                // are forgotten first, so that none is offered an address
                // freed below.
                self.refused.retain(|key, _| listed.contains(key));
                self.complained.retain(|key, _| listed.contains(key));
                let gone: Vec<String> = self
                    .pods
                    .keys()
                    .filter(|k| !listed.contains(*k))
                    .cloned()
                    .collect();
                for key in gone {
                    self.gone(&key, "no longer listed").await;
                }
            }
            Event::Apply(raw) => self.apply(&raw).await,
            Event::Delete(raw) => {
                self.metrics.events.increment("deleted");
                if let Some(key) = pod::key(&raw) {
                    self.gone(&key, "deleted").await;
                }
            }
        }
    }

    /// A pod was added or changed (or listed).
    async fn apply(&mut self, raw: &RawPod) {
        self.metrics.events.increment("applied");
        let Some(key) = pod::key(raw) else {
            self.malformed("(unnamed)", raw, "it has no metadata.name");
            return;
        };
        let seen = match pod::read(raw, &self.pool) {
            Ok(seen) => seen,
            Err(why) => {
                self.malformed(&key, raw, &why);
                return;
            }
        };
        self.complained.remove(&key);
        let name = raw.metadata.name.clone().unwrap_or_default();
        match (seen, self.pods.get(&key)) {
            (Seen::Ready(endpoint), Some(tracked))
                if tracked.url == endpoint.url
                    && tracked.bootstrap_port == endpoint.bootstrap_port
                    && tracked.models == endpoint.models =>
            {
                if !tracked.ready {
                    let url = tracked.url.clone();
                    self.ready(&key, &url, true).await;
                }
            }
            (Seen::Ready(endpoint), None)
                if self
                    .refused
                    .get(&key)
                    .is_some_and(|spec| spec.url == endpoint.url) => {}
            (Seen::Ready(endpoint), tracked) => {
                let moved_from = tracked.map(|old| old.url.clone());
                if let Some(old) = &moved_from {
                    tracing::info!(
                        pod = %key,
                        from = %old,
                        to = %endpoint.url,
                        bootstrap_port = ?endpoint.bootstrap_port,
                        models = ?endpoint.models,
                        "discovery: pod moved or changed"
                    );
                    self.pods.remove(&key);
                    self.forget(old, self.control.remove(old.clone()).await);
                }
                let spec = WorkerSpec::new(endpoint.url)
                    .with_models(endpoint.models)
                    .with_name(name)
                    .with_role(self.pool.role)
                    .with_bootstrap_port(endpoint.bootstrap_port);
                self.offer(key, spec).await;
                if let Some(old) = moved_from {
                    self.freed(&old).await;
                }
            }
            (Seen::NotReady(why), Some(tracked)) => {
                if tracked.ready {
                    let url = tracked.url.clone();
                    tracing::info!(pod = %key, why, "discovery: pod out of rotation");
                    self.ready(&key, &url, false).await;
                }
            }
            (Seen::Terminating, Some(_)) => self.gone(&key, "terminating").await,
            (Seen::Finished, Some(_)) => self.gone(&key, "finished (evicted or exited)").await,
            // A refused pod is offered again once it serves again, as it
            // then is; none is offered an address freed meanwhile.
            (Seen::NotReady(_) | Seen::Terminating | Seen::Finished, None) => {
                self.refused.remove(&key);
            }
        }
    }

    /// Offers the pod's worker to the control task.
    async fn offer(&mut self, key: String, spec: WorkerSpec) {
        let (url, bootstrap_port, models) =
            (spec.url.clone(), spec.bootstrap_port, spec.models.clone());
        match self.control.add(spec.clone()).await {
            Ok(()) => {
                tracing::info!(
                    pod = %key,
                    %url,
                    role = %self.pool.role,
                    ?bootstrap_port,
                    "discovery: pod is a worker"
                );
                self.refused.remove(&key);
                self.pods.insert(
                    key,
                    Tracked {
                        url,
                        bootstrap_port,
                        models,
                        ready: true,
                    },
                );
            }
            Err(err) => {
                tracing::warn!(
                    pod = %key,
                    %url,
                    %err,
                    "discovery: pod not added (offered again when its address changes, or when a pod of this watch leaves that address)"
                );
                self.refused.insert(key, spec);
            }
        }
    }

    /// A pod of this watch left `url`. A pod refused for it is offered
    /// it: after a relist, a pod that took a departed pod's IP and port
    /// while the watch was down can be listed before the departed one is
    /// found gone.
    async fn freed(&mut self, url: &str) {
        if self.pods.values().any(|tracked| tracked.url == url) {
            return;
        }
        let waiting = self
            .refused
            .iter()
            .find(|(_, spec)| spec.url == url)
            .map(|(key, _)| key.clone());
        if let Some(key) = waiting
            && let Some(spec) = self.refused.remove(&key)
        {
            self.offer(key, spec).await;
        }
    }

    /// The control task let go of a URL (see [`Control::freed`]): a pod
    /// refused for it is offered it. Behind by more than the control
    /// task keeps, every refused pod is offered again.
    async fn let_go(&mut self, freed: Result<WorkerUrl, broadcast::error::RecvError>) {
        match freed {
            Ok(url) => self.freed(url.as_str()).await,
            Err(broadcast::error::RecvError::Lagged(_)) => {
                let urls: BTreeSet<String> =
                    self.refused.values().map(|spec| spec.url.clone()).collect();
                for url in urls {
                    self.freed(&url).await;
                }
            }
            // Not while this watch holds its `Control`, a sender.
            Err(broadcast::error::RecvError::Closed) => {}
        }
    }

    async fn ready(&mut self, key: &str, url: &str, ready: bool) {
        match self.control.set_ready(url.to_owned(), ready).await {
            Ok(()) => {
                if let Some(tracked) = self.pods.get_mut(key) {
                    tracked.ready = ready;
                }
            }
            Err(err) => {
                // Removed behind our back (DELETE /workers): no longer ours.
                tracing::info!(pod = %key, %err, "discovery: worker no longer known");
                self.pods.remove(key);
            }
        }
    }

    /// The pod is terminating or gone: drain its worker.
    async fn gone(&mut self, key: &str, why: &str) {
        self.refused.remove(key);
        self.complained.remove(key);
        let Some(tracked) = self.pods.remove(key) else {
            return;
        };
        match self.control.drain(tracked.url.clone()).await {
            Ok(drained) => {
                tracing::info!(pod = %key, url = %tracked.url, why, ?drained, "discovery: pod leaving")
            }
            Err(err) => tracing::info!(pod = %key, %err, "discovery: worker already gone"),
        }
        self.freed(&tracked.url).await;
    }

    fn forget(&self, url: &str, result: Result<(), crate::error::GatewayError>) {
        if let Err(err) = result {
            tracing::info!(%url, %err, "discovery: worker already gone");
        }
    }

    fn malformed(&mut self, key: &str, raw: &RawPod, why: &str) {
        self.metrics.events.increment("malformed");
        let version = raw.metadata.resource_version.clone().unwrap_or_default();
        if self.complained.get(key) == Some(&version) {
            return;
        }
        self.complained.insert(key.to_owned(), version.clone());
        tracing::warn!(
            pod = %key,
            resource_version = %version,
            selector = %self.pool.name,
            "discovery: skipping a malformed pod object: {}",
            excerpt(why)
        );
    }
}

/// `text`, or its head and how long it was, to be logged.
fn excerpt(text: &str) -> Cow<'_, str> {
    if text.len() <= LOGGED_TEXT {
        return Cow::Borrowed(text);
    }
    let head = &text[..text.floor_char_boundary(LOGGED_TEXT)];
    Cow::Owned(format!("{head}... ({} bytes)", text.len()))
}

/// What went wrong, in a line for a 503 and `/readiness`: the API
/// server's own message where it sent one (which names the service
/// account and the namespace it may not list), and for a 403 what the
/// router needs.
fn problem(err: &watcher::Error) -> String {
    let status = match err {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(&**status),
        watcher::Error::WatchError(status) => Some(&**status),
        _ => None,
    };
    let text = match status {
        Some(status) if status.code == 403 => format!(
            "the API server answered 403 ({}): the router's service account needs \
             `list` and `watch` on pods there",
            status.message
        ),
        Some(status) => format!(
            "the API server answered {} {}: {}",
            status.code, status.reason, status.message
        ),
        None => err.to_string(),
    };
    excerpt(&text).into_owned()
}

/// Whether the API server refused to resume a watch: `410 Gone`, its
/// version compacted away.
fn gone(err: &watcher::Error) -> bool {
    matches!(err, watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 410)
}

#[cfg(test)]
mod tests;
