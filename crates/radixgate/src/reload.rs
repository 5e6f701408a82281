//! Reloading the configuration while serving (`SIGHUP`, or a [`Reload`]
//! handle in tests and embedders).
//!
//! A reload asks its loader for a whole new [`Config`] — the binary's loader
//! re-reads the `--config` file and layers the same flags and environment
//! on it as at start-up — and validates all of it (routing policy built,
//! every range checked) before anything changes. A config that fails leaves
//! the running one in place; the error is logged at ERROR with the key and
//! returned to the caller.
//!
//! What a reload changes, for requests that start afterwards:
//! - **workers**: reconciled against the previous config's list, through
//!   the control task's own commands: a URL no longer listed is drained
//!   (out of rotation at once, listed as `draining` with its load until
//!   its requests in flight end, as `DELETE /workers` does), a new one is
//!   added (and probed before it gets traffic), an entry whose key (or a
//!   KV cache size given before and after) alone changed keeps its worker,
//!   in rotation with its tree, with the new value from then on (so
//!   rotating a key shared by every worker does not empty the pool while
//!   they are probed again), and an entry changed otherwise (models,
//!   role) is replaced; a URL only spelled another way (a trailing `/`)
//!   is the same entry. Workers added at runtime through the admin API or
//!   by discovery are left alone, also where the file lists their URL (its
//!   entry is then not added, with a WARN, and each later reload tries it
//!   again, so it is added once the URL is free) or drops it. Requests in
//!   flight on a removed or replaced worker finish normally: no stream is
//!   cut;
//! - **routing**: an unchanged `routing:` section keeps the running policy
//!   and its prefix trees. A changed one builds a new policy and swaps it
//!   in; its trees start empty (they re-learn within a request per prefix),
//!   the eviction timer follows it, and `/get_server_info` shows its
//!   settings;
//! - **keys**: `server.api_key`, `server.admin_api_key`,
//!   `server.metrics_api_key` and the tenants (`tenants:` and the
//!   `--api-key-file` it names, re-read); a tenant whose name and limits are
//!   unchanged keeps what it has already spent, and one whose token limit
//!   changed still owes its overdraft (and what its requests in flight
//!   charge when they end).
//!
//! Everything else (the listening address and port, threads, body limit,
//! timeouts, health, retry, breaker, admission, metrics, log and tracing
//! settings) takes a restart: a reload that changes it says so in a WARN
//! line and keeps the running value.
//!
//! Each reload is counted, `radixgate_config_reloads_total{result}`
//! (`applied`, `refused`: an invalid configuration, the running one stays;
//! `partial`: failed part way), and
//! `radixgate_config_last_reload_successful` is 1 while the last one was
//! applied whole (and before any), 0 otherwise: an operator alerts on it
//! rather than reading the logs for a reload that did not take.
//!
//! Concurrency: one task applies reloads, one at a time, in order; it only
//! sends commands to the control task and stores into `ArcSwap`s, so the
//! request path never waits for it.

use crate::auth::Keys;
use crate::config::{Config, ConfigError};
use crate::control::Control;
use crate::error::GatewayError;
use crate::metrics::{Describe, LabelledCounters, Metrics, OneGauge};
use crate::tenants::Tenants;
use arc_swap::ArcSwap;
use radixgate_routing::{Policy, PolicyConfig, WorkerSpec, WorkerUrl, spawn_eviction};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Builds the configuration a reload should switch to.
pub type Loader = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// A [`Loader`] shared with the thread each reload reads on.
type SharedLoader = std::sync::Arc<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new configuration is invalid; the running one stays.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The gateway is shutting down.
    #[error("the gateway is not running")]
    Stopped,
    /// The new configuration was valid but could not be applied in full.
    #[error(transparent)]
    Apply(#[from] GatewayError),
}

/// What a reload changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// Worker URLs added (probed before they get traffic).
    pub workers_added: Vec<String>,
    /// Worker URLs removed (drained where requests were in flight on them,
    /// or replaced by a changed entry).
    pub workers_removed: Vec<String>,
    /// Worker URLs whose key or KV cache size alone changed, in place:
    /// they stayed in rotation with their trees.
    pub workers_rekeyed: Vec<String>,
    /// Whether a new routing policy replaced the running one.
    pub routing: bool,
    /// Keys that changed (`server.api_key`, `server.admin_api_key`).
    pub keys: Vec<&'static str>,
    /// Settings that changed but take effect only after a restart, as
    /// keys of the file (`server.port`, `sync.auth`).
    pub needs_restart: Vec<String>,
}

impl fmt::Display for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "workers added {:?}, removed {:?}, rekeyed {:?}; routing {}; keys changed {:?}",
            self.workers_added,
            self.workers_removed,
            self.workers_rekeyed,
            if self.routing { "rebuilt" } else { "unchanged" },
            self.keys,
        )
    }
}

type Request = oneshot::Sender<Result<Changes, ReloadError>>;

/// A handle that triggers reloads of a running gateway. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Reload {
    tx: mpsc::Sender<Request>,
}

impl Reload {
    /// Reloads now and waits for the outcome (also logged).
    pub async fn reload(&self) -> Result<Changes, ReloadError> {
        let (reply, outcome) = oneshot::channel();
        self.tx
            .send(reply)
            .await
            .map_err(|_| ReloadError::Stopped)?;
        outcome.await.unwrap_or(Err(ReloadError::Stopped))
    }
}

/// The receiving end, given to [`crate::server::run_reloadable`].
pub struct Reloads {
    rx: mpsc::Receiver<Request>,
    loader: SharedLoader,
}

impl fmt::Debug for Reloads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloads").finish_non_exhaustive()
    }
}

/// A reload handle and its receiving end; `loader` builds each new config.
pub fn channel(loader: Loader) -> (Reload, Reloads) {
    let (tx, rx) = mpsc::channel(4);
    let loader = loader.into();
    (Reload { tx }, Reloads { rx, loader })
}

pub(crate) const RELOADS: Describe = Describe::new(
    "radixgate_config_reloads_total",
    "Configuration reloads, by result: applied, refused (an invalid configuration; the running one stays), partial (failed part way).",
);
pub(crate) const LAST_RELOAD_SUCCESSFUL: Describe = Describe::new(
    "radixgate_config_last_reload_successful",
    "1 while the last configuration reload was applied whole (and before any), 0 after one that was refused or failed part way.",
);

pub(crate) const RESTART_NEEDED: Describe = Describe::new(
    "radixgate_config_restart_needed",
    "1 while the last configuration reload that was applied changed settings only a restart applies (its WARN names them), 0 otherwise: the process runs other settings than its file.",
);

/// The reload task's metric families.
pub(crate) struct ReloadMetrics {
    reloads: LabelledCounters,
    last_successful: OneGauge,
    restart_needed: OneGauge,
}

impl ReloadMetrics {
    pub(crate) fn new(metrics: &Metrics) -> Self {
        let last_successful = metrics.gauge(&LAST_RELOAD_SUCCESSFUL);
        last_successful.set(1.0);
        let restart_needed = metrics.gauge(&RESTART_NEEDED);
        restart_needed.set(0.0);
        Self {
            reloads: metrics.labelled_counters(&RELOADS, "result"),
            last_successful,
            restart_needed,
        }
    }

    fn count(&self, outcome: &Result<Changes, ReloadError>) {
        let result = match outcome {
            Ok(_) => "applied",
            Err(ReloadError::Apply(_)) => "partial",
            Err(_) => "refused",
        };
        self.reloads.increment(result);
        self.last_successful
            .set(if outcome.is_ok() { 1.0 } else { 0.0 });
        // A refused reload changed nothing: the last applied one's say
        // stands.
        if let Ok(changes) = outcome {
            let pending = !changes.needs_restart.is_empty();
            self.restart_needed.set(if pending { 1.0 } else { 0.0 });
        }
    }
}

/// What a reload acts on, handed over by the server at start-up.
pub(crate) struct Target {
    pub(crate) running: Config,
    /// The routing section at start-up, whose tree bounds the decode
    /// pool's prefix record and the KV-event index keep ([`held_bounds`]).
    pub(crate) started_routing: PolicyConfig,
    pub(crate) control: Control,
    pub(crate) keys: Arc<Keys>,
    /// The client API's keys and limits.
    pub(crate) tenants: Arc<ArcSwap<Tenants>>,
    /// The routing settings of the policy in use, as `/get_server_info`
    /// shows them.
    pub(crate) routing: Arc<ArcSwap<PolicyConfig>>,
    /// Stops the running policy's eviction timer.
    pub(crate) eviction: CancellationToken,
    /// The background tasks' token (parent of the eviction timers).
    pub(crate) tasks: CancellationToken,
    pub(crate) metrics: ReloadMetrics,
}

/// A new config from `loader`, read on a thread of its own: the files are
/// wherever the operator put them (a slow network mount, a FIFO), and
/// this runtime also runs the probes and the control task, which a read
/// that hangs stalled (health, admissions, the admin API). Not on the
/// blocking pool either: the runtime waits for that at exit. `None` once
/// `stop` is cancelled (a read still hanging is left to the process's
/// exit).
async fn load(
    loader: &SharedLoader,
    stop: &CancellationToken,
) -> Option<Result<Config, ReloadError>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let loader = loader.clone();
    let reader = std::thread::Builder::new()
        .name("radixgate-reload".to_owned())
        .spawn(move || {
            let _ = tx.send(loader());
        });
    if let Err(err) = reader {
        let reason = format!("no thread to read the configuration on: {err}");
        return Some(Err(invalid(reason)));
    }
    tokio::select! {
        () = stop.cancelled() => None,
        loaded = rx => Some(match loaded {
            Ok(loaded) => loaded.map_err(ReloadError::from),
            Err(_) => Err(invalid("reading the configuration failed".to_owned())),
        }),
    }
}

/// A reload refused for `reason`, naming no one key.
fn invalid(reason: String) -> ReloadError {
    ConfigError::Invalid {
        key: "config",
        reason,
    }
    .into()
}

/// Applies reloads until `target.tasks` is cancelled or every handle is gone.
pub(crate) async fn serve(mut reloads: Reloads, mut target: Target) {
    loop {
        let reply = tokio::select! {
            () = target.tasks.cancelled() => return,
            reply = reloads.rx.recv() => match reply {
                Some(reply) => reply,
                None => return,
            },
        };
        let outcome = match load(&reloads.loader, &target.tasks).await {
            Some(Ok(config)) => target.apply(config).await,
            Some(Err(err)) => Err(err),
            None => return,
        };
        target.metrics.count(&outcome);
        match &outcome {
            Ok(changes) => {
                tracing::info!(%changes, "configuration reloaded");
                if !changes.needs_restart.is_empty() {
                    tracing::warn!(
                        settings = %changes.needs_restart.join(", "),
                        "these settings changed but take effect only after a restart"
                    );
                }
            }
            // Applying goes in steps (keys and tenants, then each worker,
            // then the policy): one that fails leaves those before it done.
            Err(err @ ReloadError::Apply(_)) => tracing::error!(
                error = %crate::error::chain(err),
                "configuration reload failed part way: the keys and tenants, and the worker \
                 changes before the error, took effect; the routing policy did not. Fix the \
                 cause and reload again"
            ),
            Err(err) => tracing::error!(
                error = %crate::error::chain(err),
                "configuration reload failed; the running configuration stays"
            ),
        }
        let _ = reply.send(outcome);
    }
}

/// Worker entries by canonical URL (validation already parsed each one),
/// each spelling its URL so: an entry whose URL is only written another
/// way (`http://w:80/` for `http://w`) is the same entry, not a changed
/// one replaced.
fn by_url(workers: &[WorkerSpec]) -> BTreeMap<String, WorkerSpec> {
    workers
        .iter()
        .filter_map(|w| {
            let url = WorkerUrl::parse(w.url.trim()).ok()?.to_string();
            let spec = WorkerSpec {
                url: url.clone(),
                ..w.clone()
            };
            Some((url, spec))
        })
        .collect()
}

impl Target {
    /// Validates `new` in full, then applies what a reload may change.
    async fn apply(&mut self, new: Config) -> Result<Changes, ReloadError> {
        new.validate()?;
        if new.pd.enabled != self.running.pd.enabled {
            // The workers' roles are checked against the running pool: one
            // that turns disaggregated (or back) needs a restart.
            return Err(ConfigError::Invalid {
                key: "pd.enabled",
                reason: "turning prefill/decode disaggregation on or off needs a restart".into(),
            }
            .into());
        }
        let policy: Option<Arc<dyn Policy>> = if new.routing == self.running.routing {
            None
        } else {
            Some(new.routing.build().map_err(ConfigError::from)?)
        };
        let tenants = self.tenants.load().reloaded(&new)?;
        if tenants.is_open() && !self.tenants.load().is_open() {
            // The last key gone (a keys file rewritten as `[]`, every
            // entry deleted): the client API would take any request,
            // silently. Opening it takes a restart, a deliberate act.
            return Err(ConfigError::Invalid {
                key: "tenants",
                reason: "the reload leaves no client API key (server.api_key, tenants.keys, \
                         tenants.api_key_file), which would open the client API to anyone; \
                         refused, the keys in use kept (a restart without keys opens it)"
                    .into(),
            }
            .into());
        }
        let mut needs_restart = restart_keys(&self.running, &new);
        needs_restart.extend(held_bounds(&self.started_routing, &self.running, &new));
        let mut changes = Changes {
            needs_restart,
            ..Changes::default()
        };

        let old_server = &self.running.server;
        if new.server.api_key != old_server.api_key {
            changes.keys.push("server.api_key");
        }
        if new.server.admin_api_key != old_server.admin_api_key {
            changes.keys.push("server.admin_api_key");
        }
        if new.server.metrics_api_key != old_server.metrics_api_key {
            changes.keys.push("server.metrics_api_key");
        }
        // Also when only the key file's contents changed (but not for the
        // `server.api_key` tenant alone: that key is named above).
        if new.tenants != self.running.tenants
            || (new.server.api_key == old_server.api_key && !tenants.same_as(&self.tenants.load()))
        {
            changes.keys.push("tenants");
        }
        self.keys.store(&new.server);
        self.tenants.store(Arc::new(tenants));
        self.running.server.api_key = new.server.api_key.clone();
        self.running.server.admin_api_key = new.server.admin_api_key.clone();
        self.running.server.metrics_api_key = new.server.metrics_api_key.clone();
        self.running.tenants = new.tenants.clone();

        let (mut old, wanted) = (by_url(&self.running.workers), by_url(&new.workers));
        // An entry whose key or KV cache size alone changed keeps its
        // worker (see `Control::rekey`); it is neither removed nor added
        // below.
        for (url, spec) in &wanted {
            if old.get(url).is_some_and(|was| was != spec)
                && self.control.rekey((*spec).clone()).await
            {
                old.insert(url.clone(), spec.clone());
                changes.workers_rekeyed.push(url.clone());
            }
        }
        for (url, spec) in &old {
            if wanted.get(url) != Some(spec) {
                // A worker no longer listed drains, as `DELETE /workers`
                // does: its requests in flight stay counted and listed
                // until they end, so the operator sees when it is free to
                // stop. One listed otherwise now is replaced at once below.
                // Only the file's own: a discovered pod, or a worker from
                // `POST /workers`, may hold the URL (the entry's add was
                // refused, or it took over once the file's was removed).
                let removed = match wanted.contains_key(url) {
                    true => self.control.remove_configured(url.clone()).await,
                    false => self.control.drain_configured(url.clone()).await.map(drop),
                };
                match removed {
                    // Already removed through the admin API, or another
                    // source's.
                    Ok(()) | Err(GatewayError::UnknownWorkerUrl { .. }) => {}
                    Err(err) => return Err(err.into()),
                }
                changes.workers_removed.push(url.clone());
            }
        }
        // Entries whose URL another source holds: not added, and not the
        // running file's either (see below).
        let mut refused = Vec::new();
        for (url, spec) in &wanted {
            if old.get(url) != Some(spec) {
                // Trusted as at start-up: the operator wrote the file.
                match self.control.add_configured(spec.clone()).await {
                    Ok(()) => {}
                    // Held by another source: the admin API's worker, or
                    // a discovered pod's; a later reload leaves it too.
                    Err(GatewayError::Admin(err)) => {
                        tracing::warn!(
                            worker = %url,
                            %err,
                            "the file's worker entry is not added: another source (discovery \
                             or the admin API) holds its URL, and keeps it"
                        );
                        refused.push(url.as_str());
                        continue;
                    }
                    Err(err) => return Err(err.into()),
                }
                changes.workers_added.push(url.clone());
            }
        }
        // A refused entry is kept out of the running list: the next reload
        // tries to add it again (the URL may be free by then, its holder
        // removed), and a file that drops it has nothing of its own there
        // to drain or to report removed.
        self.running.workers = new.workers;
        if !refused.is_empty() {
            self.running.workers.retain(|w| {
                !WorkerUrl::parse(w.url.trim()).is_ok_and(|u| refused.contains(&&*u.to_string()))
            });
        }

        if let Some(policy) = policy {
            self.control.set_policy(policy.clone()).await?;
            self.eviction.cancel();
            self.eviction = self.tasks.child_token();
            // Detached: it ends with its token, at the next swap or shutdown.
            drop(spawn_eviction(policy, self.eviction.clone()));
            self.routing.store(Arc::new(new.routing.clone()));
            self.running.routing = new.routing;
            changes.routing = true;
        }
        Ok(changes)
    }
}

/// The settings of `new` that differ from `running` in what only a restart
/// applies, as keys of the file: each changed section's changed keys
/// (`server.port`), so the operator's WARN names the setting, not only its
/// section. Every section is named below, so a section added to [`Config`]
/// must be placed here (a reload applies it, or it is reported).
fn restart_keys(running: &Config, new: &Config) -> Vec<String> {
    let Config {
        // Applied by a reload (the server's keys below).
        workers: _,
        routing: _,
        tenants: _,
        server: _,
        discovery,
        health,
        retry,
        circuit_breaker,
        outlier_detection,
        admission,
        metrics,
        sync,
        kv_events,
        record_trace,
        pd,
        responses,
        log,
        tracing,
    } = new;
    let mut server = new.server.clone();
    server.api_key.clone_from(&running.server.api_key);
    server
        .admin_api_key
        .clone_from(&running.server.admin_api_key);
    server
        .metrics_api_key
        .clone_from(&running.server.metrics_api_key);
    let mut keys = Vec::new();
    section(&mut keys, "server", &running.server, &server);
    section(&mut keys, "health", &running.health, health);
    section(&mut keys, "retry", &running.retry, retry);
    section(
        &mut keys,
        "circuit_breaker",
        &running.circuit_breaker,
        circuit_breaker,
    );
    section(&mut keys, "admission", &running.admission, admission);
    section(
        &mut keys,
        "outlier_detection",
        &running.outlier_detection,
        outlier_detection,
    );
    section(&mut keys, "metrics", &running.metrics, metrics);
    section(&mut keys, "discovery", &running.discovery, discovery);
    section(&mut keys, "sync", &running.sync, sync);
    section(&mut keys, "kv_events", &running.kv_events, kv_events);
    section(
        &mut keys,
        "record_trace",
        &running.record_trace,
        record_trace,
    );
    section(&mut keys, "responses", &running.responses, responses);
    section(&mut keys, "log", &running.log, log);
    section(&mut keys, "tracing", &running.tracing, tracing);
    section(&mut keys, "pd", &running.pd, pd);
    keys
}

/// The routing section's tree bounds that parts built at start-up hold
/// on to, as `started` (the routing section at start-up) set them: the
/// decode pool's prefix record in a disaggregated pool (its sizes,
/// eviction and correction) and the KV-event index (the routed text's
/// length), where `running` has them. A reload builds the main policy
/// anew with `new`'s values, not these, and said nothing of it.
fn held_bounds(started: &PolicyConfig, running: &Config, new: &Config) -> Vec<String> {
    use serde_json::{Value, json};
    let (old, now) = (started.tree_bounds(), new.routing.tree_bounds());
    let mut keys = Vec::new();
    let mut held = |by: &str, pick: &dyn Fn(&radixgate_routing::CacheAwareConfig) -> Value| {
        let (old, now) = (pick(&old), pick(&now));
        if old != now {
            keys.extend(
                changed_keys("routing", old, now)
                    .into_iter()
                    .map(|k| format!("{k} (as {by} holds it)")),
            );
        }
    };
    if running.pd.enabled {
        held("the decode pool's prefix record", &|b| {
            json!({
                "max_total_chars": b.max_total_chars,
                "max_tree_size": b.max_tree_size,
                "eviction_interval_secs": b.eviction_interval_secs,
                "max_routing_text_chars": b.max_routing_text_chars,
                "correction": b.correction,
            })
        });
    }
    if running.kv_events.enabled {
        held(
            "the KV-event index",
            &|b| json!({"max_routing_text_chars": b.max_routing_text_chars}),
        );
    }
    keys
}

/// Adds to `keys` what changed of section `name` from `old` to `new`.
fn section<T: PartialEq + serde::Serialize>(keys: &mut Vec<String>, name: &str, old: &T, new: &T) {
    if old != new {
        let value = |v: &T| serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
        keys.extend(changed_keys(name, value(old), value(new)));
    }
}

/// The keys of section `name` whose values differ between `old` and `new`
/// (as the file writes them), or the section's own name where it is not a
/// table of keys or no key tells the change apart.
fn changed_keys(name: &str, old: serde_json::Value, new: serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    let keys: Vec<String> = match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
            names.sort();
            names.dedup();
            names
                .into_iter()
                .filter(|k| old.get(*k) != new.get(*k))
                .map(|k| format!("{name}.{k}"))
                .collect()
        }
        _ => Vec::new(),
    };
    if keys.is_empty() {
        vec![name.to_owned()]
    } else {
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routing section's tree bounds are applied to the main policy,
    /// but not to what holds them from start-up: the decode pool's prefix
    /// record and the KV-event index. A reload that changes them names
    /// them (it said nothing: the policy was rebuilt, they were not).
    #[test]
    fn tree_bounds_held_from_start_up_are_named() {
        use radixgate_routing::{CacheAwareConfig, PolicyConfig};
        let cache_aware = |edit: fn(&mut CacheAwareConfig)| {
            let mut c = CacheAwareConfig::default();
            edit(&mut c);
            PolicyConfig::CacheAware(c)
        };
        let started = cache_aware(|_| {});
        let mut running = Config::default();
        let mut new = running.clone();
        new.routing = cache_aware(|c| c.max_tree_size += 1);
        let held = |running: &Config, new: &Config| held_bounds(&started, running, new);
        assert!(held(&running, &new).is_empty(), "no part holds it");
        running.pd.enabled = true;
        new.pd.enabled = true;
        assert_eq!(
            held(&running, &new),
            ["routing.max_tree_size (as the decode pool's prefix record holds it)"]
        );
        // Still so once a reload applied it to the main policy.
        running.routing = new.routing.clone();
        assert_eq!(held(&running, &new).len(), 1);
        running.kv_events.enabled = true;
        new.kv_events.enabled = true;
        new.routing = cache_aware(|c| c.max_routing_text_chars += 1);
        assert_eq!(
            held(&running, &new),
            [
                "routing.max_routing_text_chars (as the decode pool's prefix record holds it)",
                "routing.max_routing_text_chars (as the KV-event index holds it)",
            ]
        );
    }

    /// Every setting a reload does not apply is named by its key when it
    /// changes: a setting edited and reloaded is never ignored without a
    /// WARN saying which.
    #[test]
    fn every_setting_a_reload_cannot_apply_is_named() {
        let running = Config::default();
        let changed = |edit: fn(&mut Config)| {
            let mut new = Config::default();
            edit(&mut new);
            restart_keys(&running, &new)
        };
        assert!(changed(|_| {}).is_empty());
        assert_eq!(changed(|c| c.record_trace.keep += 1), ["record_trace.keep"]);
        assert_eq!(changed(|c| c.kv_events.port += 1), ["kv_events.port"]);
        assert_eq!(
            changed(|c| c.sync.queue_capacity += 1),
            ["sync.queue_capacity"]
        );
        assert_eq!(
            changed(|c| {
                c.server.idle_timeout_secs += 1;
                c.server.port += 1;
            }),
            ["server.idle_timeout_secs", "server.port"]
        );
        assert_eq!(
            changed(|c| c.metrics.prometheus_port = Some(9000)),
            ["metrics.prometheus_port"]
        );
        // What a reload applies is not named.
        assert!(changed(|c| c.server.api_key = Some("k".into())).is_empty());
        assert!(changed(|c| c.workers.push(WorkerSpec::new("http://w:1"))).is_empty());
    }
}
