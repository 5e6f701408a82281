//! Active health checking: one small task per known worker.
//!
//! A healthy worker is probed every `interval_secs`; `failure_threshold`
//! consecutive failed probes mark it unhealthy. An unhealthy (or not yet
//! admitted) worker is probed with exponential back-off from
//! `unhealthy_backoff_initial_ms` to `unhealthy_backoff_max_ms`, and a passing
//! probe is confirmed at the initial back-off, so a worker that comes back is
//! re-admitted within `unhealthy_backoff_max_ms` plus `success_threshold - 1`
//! confirmations — at most 2.25 s with the defaults, the README's "about
//! 2.5 s" — instead of waiting for a long fixed interval.
//!
//! The task only reports transitions to the control task, through the two
//! narrow methods of its handle; it never touches the registry, which has
//! exactly one owner.
//!
//! The schedule is one loop ([`run`]) over a [`Watched`] worker: the real
//! one probes over HTTP and reports to the control task; the tests script
//! one and run the same loop under tokio's paused clock, so the promised
//! admission delay is asserted to the millisecond rather than stated.
//!
//! A worker out of rotation is never silent: the loop warns when a pending
//! worker's probe first fails and when an admitted one is marked unhealthy,
//! naming the cause (`connection refused`, `health check /health answered
//! 503 …`) and the retry interval, then again when the cause changes or a
//! minute has passed ([`Complaint`]). Every probe's outcome also goes on
//! the [`Board`], from which a 503 says why no worker could take a request.

use crate::config::HealthConfig;
use crate::control::Control;
use arc_swap::ArcSwapOption;
use radixgate_routing::{ModelOrigin, WorkerUrl};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

mod board;

pub(crate) use board::Board;

/// A complaint about the same cause is repeated at most this often.
const REPEAT_COMPLAINT: Duration = Duration::from_secs(60);

/// What one health checker watches.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) url: WorkerUrl,
    /// The worker's key, shared with the control task, which changes it in
    /// place when a reload rotates it.
    pub(crate) api_key: Arc<ArcSwapOption<String>>,
    /// Models the operator listed; empty: ask the worker on admission,
    /// and again whenever it comes back healthy.
    pub(crate) models: Vec<String>,
    /// The KV cache's size the operator gave; none: ask the worker once
    /// it is admitted, and again whenever it comes back healthy.
    pub(crate) kv_capacity_tokens: Option<u64>,
    pub(crate) client: reqwest::Client,
    pub(crate) config: HealthConfig,
    pub(crate) control: Control,
    /// Where every probe's outcome is written.
    pub(crate) board: Board,
    /// Notified when a request found the worker not serving a model it
    /// is listed with ([`Board::reread_models`]).
    pub(crate) reread: Arc<tokio::sync::Notify>,
    pub(crate) cancel: CancellationToken,
}

/// Probes `target` until cancelled, reporting admission and health changes.
pub(crate) async fn watch(mut target: Target) {
    let config = target.config.clone();
    let cancel = target.cancel.clone();
    run(&config, &cancel, &mut target).await;
}

/// The two ends of one health checker: the worker it probes and the
/// control task it reports to. A trait so that tests can script the worker
/// and record the reports while [`run`] keeps the schedule.
trait Watched {
    /// Probes once; the reason it failed, if it did.
    async fn probe(&mut self) -> Result<(), String>;
    /// Tells the operator that the worker is out of rotation, and why.
    fn complain(&mut self, complaint: &Complaint);
    /// The first probes passed: asks for the worker's admission; why it
    /// cannot be routed to yet, if it cannot (then it is probed on, out
    /// of rotation, and asked again).
    async fn admit(&mut self) -> Result<(), String>;
    /// The admitted worker's health changed.
    async fn report(&mut self, healthy: bool);
    /// The admitted worker is healthy and `models_refresh_secs` passed
    /// since its models were last read, or it was asked to
    /// ([`Self::asked_to_reread`]): reads them again.
    async fn refresh(&mut self) {}
    /// Until a request asks for the worker's models to be read again.
    async fn asked_to_reread(&self) {
        std::future::pending().await
    }
}

impl Watched for Target {
    async fn probe(&mut self) -> Result<(), String> {
        let outcome = probe(self).await;
        self.board
            .probed(&self.url, outcome.as_ref().err().map(String::as_str));
        outcome
    }

    fn complain(&mut self, complaint: &Complaint) {
        tracing::warn!(worker = %self.url, "worker {} {complaint}", self.url);
    }

    async fn admit(&mut self) -> Result<(), String> {
        let served = if self.models.is_empty() {
            let discovered = discover_models(self).await.inspect_err(|problem| {
                self.board.probed(&self.url, Some(problem));
            })?;
            discovered.unwrap_or_else(|| {
                tracing::warn!(worker = %self.url, "worker reports no model; it will serve any model");
                Served::default()
            })
        } else {
            Served {
                models: self.models.clone(),
                ..Served::default()
            }
        };
        self.control
            .admit(
                self.url.clone(),
                served,
                self.kv_capacity_tokens,
                &self.cancel,
            )
            .await;
        self.read_capacity();
        Ok(())
    }

    async fn report(&mut self, healthy: bool) {
        // Back from a failure, perhaps a restart with another model: asked
        // again, unless the operator listed them. A worker that no longer
        // says keeps the models it said before.
        let models = if healthy && self.models.is_empty() {
            discover_models(self).await.unwrap_or_else(|problem| {
                tracing::warn!(worker = %self.url, "worker {} {problem}", self.url);
                None
            })
        } else {
            None
        };
        self.control
            .report_health(self.url.clone(), healthy, models, &self.cancel)
            .await;
        if healthy {
            // Back from a failure, perhaps a restart with another cache.
            self.read_capacity();
        }
    }

    async fn refresh(&mut self) {
        self.refresh_models().await;
    }

    async fn asked_to_reread(&self) {
        self.reread.notified().await;
        match self.models.is_empty() {
            true => tracing::info!(
                worker = %self.url,
                "worker answered 404 for a model it is listed with; its models are read again"
            ),
            false => tracing::warn!(
                worker = %self.url,
                "worker answered 404 for a model the config lists it with; its requests for \
                 that model go to other workers listed with it"
            ),
        }
    }
}

impl Target {
    /// Re-reads a healthy worker's models and KV cache size, unless the
    /// operator listed them, and hands them to the control task, which
    /// relists the worker only if they changed. A worker that does not
    /// answer keeps what it said before (a probe tells its health).
    async fn refresh_models(&mut self) {
        if self.models.is_empty() {
            match discover_models(self).await {
                Ok(Some(models)) => {
                    self.control
                        .report_health(self.url.clone(), true, Some(models), &self.cancel)
                        .await;
                }
                Ok(None) => {}
                Err(problem) => {
                    tracing::debug!(worker = %self.url, %problem, "models not re-read");
                }
            }
        }
        self.read_capacity();
    }

    /// Asks the worker for its KV cache's size, unless the operator gave
    /// it, beside the probes: the worker is in rotation meanwhile, its tree
    /// bounded only by `max_tree_size` until the answer comes, and one
    /// that hangs on the question (up to a probe's timeout per endpoint)
    /// delays neither its admission nor its next probe. A worker that no
    /// longer says keeps the size it said before.
    fn read_capacity(&self) {
        if self.kv_capacity_tokens.is_some() {
            return;
        }
        let target = self.clone();
        tokio::spawn(async move {
            let tokens = tokio::select! {
                () = target.cancel.cancelled() => return,
                tokens = discover_capacity(&target) => tokens,
            };
            if let Some(tokens) = tokens {
                target
                    .control
                    .set_capacity(target.url.clone(), tokens, &target.cancel)
                    .await;
            }
        });
    }
}

/// The probe schedule, until `cancel`: see the module doc.
async fn run(cfg: &HealthConfig, cancel: &CancellationToken, worker: &mut impl Watched) {
    let initial = Duration::from_millis(cfg.unhealthy_backoff_initial_ms);
    let max = Duration::from_millis(cfg.unhealthy_backoff_max_ms);
    let mut backoff = initial;
    let mut admitted = false;
    let mut healthy = false;
    let (mut successes, mut failures) = (0u32, 0u32);
    // The last complaint while out of rotation: when, and for what cause.
    let mut complained: Option<(Instant, String)> = None;
    // When the worker's models were last read (on admission, on return).
    let mut models_read = Instant::now();
    let refresh = Duration::from_secs(cfg.models_refresh_secs);
    // A request asked for them to be read again (see `REREAD_AFTER`).
    let mut reread = false;
    loop {
        let outcome = if cfg.enabled {
            worker.probe().await
        } else {
            Ok(())
        };
        if cancel.is_cancelled() {
            return;
        }
        let mut ok = outcome.is_ok();
        if ok {
            successes += 1;
            failures = 0;
        } else {
            failures += 1;
            successes = 0;
        }
        let mut outcome = outcome;
        if !healthy && ok && (successes >= cfg.success_threshold || !cfg.enabled) {
            if admitted {
                healthy = true;
                backoff = initial;
                worker.report(healthy).await;
                (models_read, reread) = (Instant::now(), false);
            } else {
                match worker.admit().await {
                    Ok(()) => {
                        healthy = true;
                        backoff = initial;
                        admitted = true;
                        (models_read, reread) = (Instant::now(), false);
                    }
                    // It answers its probes but cannot be routed to as it
                    // is: out of rotation, complained of, and asked again.
                    Err(problem) => {
                        (successes, failures) = (0, failures + 1);
                        (ok, outcome) = (false, Err(problem));
                    }
                }
            }
        } else if healthy && !ok && failures >= cfg.failure_threshold {
            healthy = false;
            worker.report(healthy).await;
        } else if healthy
            && ok
            && (reread || !refresh.is_zero() && models_read.elapsed() >= refresh)
        {
            // A server can change model without failing a probe (a
            // Service's pods replaced by a rolling update, a LoRA adapter
            // unloaded).
            worker.refresh().await;
            (models_read, reread) = (Instant::now(), false);
        }
        match outcome {
            Err(problem) if !healthy => {
                let now = Instant::now();
                let due = complained.as_ref().is_none_or(|(at, said)| {
                    *said != problem || now.duration_since(*at) >= REPEAT_COMPLAINT
                });
                if due {
                    worker.complain(&Complaint {
                        repeat: complained.is_some(),
                        admitted,
                        failures,
                        problem: problem.clone(),
                        retry: max,
                    });
                    complained = Some((now, problem));
                }
            }
            Ok(()) if healthy => complained = None,
            _ => {}
        }
        if !cfg.enabled && admitted {
            // Admitted once; nothing more to watch but the requests that
            // find it not serving a model it is listed with.
            return serve_rereads(cancel, worker, models_read).await;
        }
        let wait = if healthy {
            Duration::from_secs(cfg.interval_secs)
        } else if ok {
            initial
        } else {
            let wait = backoff;
            backoff = (backoff * 2).min(max);
            wait
        };
        let asked = tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => false,
            () = worker.asked_to_reread(), if healthy && !reread => true,
        };
        if asked {
            // Probed and read at once, but not more often than
            // `REREAD_AFTER`: every request a worker turns away asks.
            reread = true;
            if !spaced_from(models_read, cancel).await {
                return;
            }
        }
    }
}

/// The least time between two reads of a worker's models that requests
/// asked for ([`Board::reread_models`]).
const REREAD_AFTER: Duration = Duration::from_secs(1);

/// Waits until [`REREAD_AFTER`] has passed since the models were `read`;
/// false where `cancel` came first.
async fn spaced_from(read: Instant, cancel: &CancellationToken) -> bool {
    let wait = REREAD_AFTER.saturating_sub(read.elapsed());
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(wait) => true,
    }
}

/// With health checks off, after admission: reads the worker's models
/// again whenever a request asks ([`Watched::asked_to_reread`]), not more
/// often than [`REREAD_AFTER`], until `cancel`. Nothing else reads them
/// then: without this, every request for a model the worker stopped
/// serving went to it first and was turned away, for as long as the
/// router ran.
async fn serve_rereads(
    cancel: &CancellationToken,
    worker: &mut impl Watched,
    mut models_read: Instant,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = worker.asked_to_reread() => {}
        }
        if !spaced_from(models_read, cancel).await {
            return;
        }
        worker.refresh().await;
        models_read = Instant::now();
    }
}

/// Why a worker is out of rotation, for the operator's log: the line that
/// follows `worker <url>`.
#[derive(Clone, Debug, PartialEq)]
struct Complaint {
    /// An earlier complaint was made since the worker was last healthy.
    repeat: bool,
    /// The worker was admitted once (so it is now unhealthy, not pending).
    admitted: bool,
    /// Consecutive failed probes.
    failures: u32,
    /// Why the last one failed.
    problem: String,
    /// The longest wait between probes while it fails.
    retry: Duration,
}

impl fmt::Display for Complaint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.admitted, self.repeat) {
            (false, false) => write!(f, "not reachable: {}", self.problem)?,
            (false, true) => write!(
                f,
                "still not reachable after {} probes: {}",
                self.failures, self.problem
            )?,
            (true, false) => write!(
                f,
                "is unhealthy, out of rotation after {} failed health checks: {}",
                self.failures, self.problem
            )?,
            (true, true) => write!(
                f,
                "still unhealthy after {} failed health checks: {}",
                self.failures, self.problem
            )?,
        }
        write!(f, " (retrying every ")?;
        let ms = self.retry.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{} s)", ms / 1000)
        } else {
            write!(f, "{ms} ms)")
        }
    }
}

/// A GET of `path` on the target worker, with its key and the probe timeout.
fn get(target: &Target, path: &str) -> reqwest::RequestBuilder {
    let key = target.api_key.load();
    crate::upstream::worker_call(
        &target.client,
        reqwest::Method::GET,
        format!("{}{path}", target.url),
        key.as_deref().map(String::as_str),
        Duration::from_secs(target.config.timeout_secs),
    )
}

/// One probe: a GET of the health endpoint answered 2xx within the timeout;
/// otherwise why not, in a few words.
async fn probe(target: &Target) -> Result<(), String> {
    let endpoint = &target.config.endpoint;
    let request = get(target, endpoint);
    let response = tokio::select! {
        () = target.cancel.cancelled() => return Err("removed".to_owned()),
        result = request.send() => result,
    };
    match response {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) if r.status() == reqwest::StatusCode::LOOP_DETECTED => Err(format!(
            "health check {endpoint} answered {}: this URL is the router itself, or leads back to it",
            r.status()
        )),
        Ok(r) => Err(format!("health check {endpoint} answered {}", r.status())),
        Err(err) => Err(unreachable_because(&err, target.config.timeout_secs)),
    }
}

/// Why a request to a worker got no answer: the innermost cause, in the
/// words an operator searches for (`connection refused`, `no answer within
/// 5 s`), not reqwest's wrapping of it.
fn unreachable_because(err: &reqwest::Error, timeout_secs: u64) -> String {
    if err.is_timeout() {
        return format!("no answer within {timeout_secs} s");
    }
    let plain = err.url().is_some_and(|url| url.scheme() == "http");
    let mut innermost: &dyn std::error::Error = err;
    while let Some(source) = innermost.source() {
        // What a TLS server sends a plain-HTTP request (an alert record)
        // is no HTTP answer: hyper's "invalid HTTP version parsed" alone
        // does not tell an operator that an `http://` URL names an HTTPS
        // worker.
        if let Some(hyper) = source.downcast_ref::<hyper::Error>()
            && hyper.is_parse()
            && plain
        {
            return format!(
                "{hyper}: the worker's answer was not HTTP; if it serves HTTPS \
                 (a TLS server answers plain HTTP with an alert), its URL is https://, \
                 not http://"
            );
        }
        if let Some(io) = source.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_owned(),
                std::io::ErrorKind::ConnectionReset => "connection reset".to_owned(),
                _ if answered_without_tls(io) => format!(
                    "{io}: the worker answered the TLS handshake with something else; \
                     if it serves plain HTTP, its URL is http://, not https://"
                ),
                _ => io.to_string(),
            };
        }
        innermost = source;
    }
    innermost.to_string()
}

/// Whether a TLS handshake failed because the first bytes back were not
/// TLS at all: rustls's "received corrupt message of type
/// InvalidContentType", which alone does not tell an operator that an
/// `https://` URL names a plain-HTTP worker.
fn answered_without_tls(io: &std::io::Error) -> bool {
    // The TLS stream's error, perhaps wrapped in the connector's own.
    let Some(inner) = io.get_ref() else {
        return false;
    };
    if let Some(io) = inner.downcast_ref::<std::io::Error>() {
        return answered_without_tls(io);
    }
    matches!(
        inner.downcast_ref::<rustls::Error>(),
        Some(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType
        ))
    )
}

/// Most bytes of a worker's answer to a discovery question that are read.
/// A model list of thousands of adapters, or a metrics page with every
/// histogram, stays far below it; a worker that sends more (broken, or
/// lying) is taken as not having answered, instead of filling the
/// gateway's memory for as long as the probe's timeout lets it.
const DISCOVERY_ANSWER_LIMIT: usize = 8 << 20;

/// The body of a 2xx answer to a GET of `path`, read to its end within the
/// probe's timeout and [`DISCOVERY_ANSWER_LIMIT`]; `None` for another
/// answer (the worker has no such page: a 404) or one that is too long
/// (with a WARN). A 401 or 403 is an error that says which key to set: the
/// worker wants a key the router does not send, or not the one it sends.
/// No answer at all, a 5xx, or a body broken off is an error too: the
/// worker did not say, and what it would have said is not taken as
/// nothing (on admission, a worker taken to list no model serves any
/// model until its next read, 30 s later by default).
async fn answer(target: &Target, path: &str) -> Result<Option<bytes::Bytes>, String> {
    answer_or(target, path, Silence::Problem).await
}

/// What a worker that does not answer a question is taken to say.
#[derive(Clone, Copy, PartialEq)]
enum Silence {
    /// Nothing yet: an error, asked again (see [`answer`]).
    Problem,
    /// That it has no such page, as a 404 says: for a fallback asked only
    /// when the worker's own list said it has none.
    NoPage,
}

/// [`answer`], with no answer, a 5xx or a body broken off taken as
/// `silence` says; a 401 or 403 is an error either way.
async fn answer_or(
    target: &Target,
    path: &str,
    silence: Silence,
) -> Result<Option<bytes::Bytes>, String> {
    let silent = |problem: String| match silence {
        Silence::Problem => Err(problem),
        Silence::NoPage => {
            tracing::debug!(worker = %target.url, problem, "taken as no such page");
            Ok(None)
        }
    };
    let mut response = match get(target, path).send().await {
        Ok(response) => response,
        Err(err) => {
            return silent(format!(
                "did not answer {path}: {}",
                crate::error::chain(&err)
            ));
        }
    };
    let status = response.status();
    if status.is_server_error() {
        return silent(format!("answered {path} with {status}"));
    }
    if matches!(status.as_u16(), 401 | 403) {
        let sent = target.api_key.load().is_some();
        return Err(format!(
            "answers {path} with {status}: {}; it is held out of rotation until that key works",
            match sent {
                true =>
                    "it refuses the API key the router sends it (the worker's `api_key` \
                         or `api_key_env`)",
                false =>
                    "it wants an API key, and the router sends it none: set the \
                          worker's `api_key` or `api_key_env`",
            }
        ));
    }
    if !status.is_success() {
        return Ok(None);
    }
    let too_long = || {
        tracing::warn!(
            worker = %target.url,
            path,
            limit_bytes = DISCOVERY_ANSWER_LIMIT,
            "worker's answer is longer than the gateway reads; taken as no answer"
        );
    };
    if response
        .content_length()
        .is_some_and(|length| length > DISCOVERY_ANSWER_LIMIT as u64)
    {
        too_long();
        return Ok(None);
    }
    let mut body = bytes::BytesMut::new();
    loop {
        // A body broken off part-way is no answer, not a shorter one.
        let next = match response.chunk().await {
            Ok(next) => next,
            Err(err) => return silent(format!("broke off its answer to {path}: {err}")),
        };
        let Some(chunk) = next else {
            break;
        };
        if body.len() + chunk.len() > DISCOVERY_ANSWER_LIMIT {
            too_long();
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body.freeze()))
}

/// What a worker's model list says: the models, what it says of each
/// besides its name (a LoRA adapter's parent and root), and the longest
/// context it serves (the least its entries give), where it says.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Served {
    pub(crate) models: Vec<String>,
    pub(crate) origins: BTreeMap<String, ModelOrigin>,
    pub(crate) max_model_len: Option<u64>,
}

/// A worker's `/v1/models` answer. Each entry is read on its own: one
/// the router cannot read (an id that is no string, none at all) is
/// left out with a WARN, not the whole list, which made the worker one
/// that serves any model.
#[derive(Deserialize)]
struct ModelList {
    data: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
    /// vLLM's and SGLang's longest context, in tokens: read as any JSON,
    /// so that a worker that spells it otherwise still has its models read.
    #[serde(default)]
    max_model_len: serde_json::Value,
    /// A LoRA adapter's base model (vLLM, SGLang); null for a base model.
    /// Read as any JSON, like `max_model_len`: a string or nothing.
    #[serde(default)]
    parent: serde_json::Value,
    /// Where the model or adapter was loaded from.
    #[serde(default)]
    root: serde_json::Value,
}

#[derive(Deserialize)]
struct ModelInfo {
    model_path: Option<String>,
}

/// The models a worker serves, from its OpenAI `/v1/models`, else SGLang's
/// `/get_model_info`; `None` if it reports neither; an error if it
/// refuses the router's key (or its lack of one). With
/// them, the longest context it serves, where `/v1/models` says (the least
/// it gives, should its entries differ). An id no request can name (empty,
/// or the wildcard pool's `*`) is left out with a WARN: the registry
/// refuses a worker that lists one, which would keep it out of rotation
/// for good while its probes pass.
async fn discover_models(target: &Target) -> Result<Option<Served>, String> {
    if let Some(body) = answer(target, "/v1/models").await?
        && let Ok(list) = serde_json::from_slice::<ModelList>(&body)
    {
        let entries = list.data.len();
        let mut data: Vec<ModelEntry> = (list.data.into_iter())
            .filter_map(|entry| serde_json::from_value(entry).ok())
            .collect();
        if data.len() < entries {
            tracing::warn!(
                worker = %target.url,
                unreadable = entries - data.len(),
                "worker lists models with no id the router can read; left out"
            );
        }
        data.retain(|m| nameable(target, &m.id));
        if !data.is_empty() {
            let max_model_len = data
                .iter()
                .filter_map(|m| m.max_model_len.as_u64())
                .filter(|&tokens| tokens > 0)
                .min();
            let text =
                |v: &serde_json::Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
            let origins = data
                .iter()
                .map(|m| {
                    let origin = ModelOrigin {
                        parent: text(&m.parent).filter(|p| *p != m.id),
                        root: text(&m.root),
                    };
                    (m.id.clone(), origin)
                })
                .filter(|(_, o)| *o != ModelOrigin::default())
                .collect();
            return Ok(Some(Served {
                models: data.into_iter().map(|m| m.id).collect(),
                origins,
                max_model_len,
            }));
        }
    }
    // SGLang's own page, asked only of a worker whose `/v1/models` gave no
    // list (a 404, or none it could read): a server that is no SGLang may
    // answer it anything, and its silence there is no list either.
    if let Some(body) = answer_or(target, "/get_model_info", Silence::NoPage).await?
        && let Ok(ModelInfo {
            model_path: Some(path),
        }) = serde_json::from_slice::<ModelInfo>(&body)
        && nameable(target, &path)
    {
        return Ok(Some(Served {
            models: vec![path],
            ..Served::default()
        }));
    }
    Ok(None)
}

/// Whether a model id the worker reported can be asked for by name; WARNs
/// when not.
fn nameable(target: &Target, id: &str) -> bool {
    let ok = radixgate_routing::unnameable(id).is_none();
    if !ok {
        tracing::warn!(worker = %target.url, id, "worker reports a model id no request can name; left out");
    }
    ok
}

/// The tokens a worker's KV cache holds, as the worker reports it: SGLang's
/// `/get_server_info` (`max_total_num_tokens`), else vLLM's `/metrics`
/// (`vllm:cache_config_info`, whose labels carry `num_gpu_blocks` and
/// `block_size`); `None` if it reports neither (the tree is then bounded
/// only by `max_tree_size`).
async fn discover_capacity(target: &Target) -> Option<u64> {
    #[derive(Deserialize)]
    struct ServerInfo {
        max_total_num_tokens: Option<u64>,
    }
    if let Ok(Some(body)) = answer(target, "/get_server_info").await
        && let Ok(ServerInfo {
            max_total_num_tokens: Some(tokens),
        }) = serde_json::from_slice::<ServerInfo>(&body)
        && tokens > 0
    {
        return Some(tokens);
    }
    if let Ok(Some(body)) = answer(target, "/metrics").await
        && let Some(tokens) = vllm_cache_tokens(&String::from_utf8_lossy(&body))
    {
        return Some(tokens);
    }
    tracing::debug!(worker = %target.url, "worker reports no KV cache size");
    None
}

/// `num_gpu_blocks × block_size` from vLLM's `vllm:cache_config_info`
/// sample in a Prometheus text exposition; `None` without one, or with a
/// label missing, unreadable or zero.
fn vllm_cache_tokens(metrics: &str) -> Option<u64> {
    let labels = metrics
        .lines()
        .find_map(|line| line.strip_prefix("vllm:cache_config_info{"))?;
    let labels = &labels[..labels.find('}')?];
    let label = |name: &str| -> Option<u64> {
        labels.split(',').find_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            (key.trim() == name).then(|| value.trim().trim_matches('"').parse().ok())?
        })
    };
    let tokens = label("num_gpu_blocks")?.checked_mul(label("block_size")?)?;
    (tokens > 0).then_some(tokens)
}

#[cfg(test)]
mod tests;
