//! The simulated worker HTTP server (`radixgate worker`).
//!
//! Each worker is one [`Engine`] driven by its own task (`driver`), served
//! on its own listener by an accept loop (`listen`) that speaks HTTP/1.1 and
//! h2c and obeys the connection-level fault knobs. Handlers (`routes`,
//! `generate`) share one [`WorkerState`] per worker, immutable except for
//! atomics, the fault knobs and the engine snapshot (each with its reason in
//! its module).
//!
//! Entry points: [`start`] one worker on a bound listener (tests bind port
//! 0), [`start_group`] several that can also administer each other's faults,
//! and [`run`] for the command line.

mod args;
mod conversation;
mod driver;
mod embeddings;
mod faults;
mod generate;
pub mod kv_events;
mod listen;
mod metrics;
pub mod pd;
mod request;
mod response;
mod response_events;
mod routes;
mod stored;
mod utility;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use args::{EngineFlags, WorkerArgs, run};
pub use faults::{FaultConfig, MAX_SLOWDOWN};
pub use kv_events::{EventShape, HashFormat, KvEventsConfig};
pub use listen::WORKER_HEADER;
pub use pd::{PdConfig, Role};
pub use request::MAX_OUTPUT_TOKENS;

use crate::engine::{Engine, EngineConfig, LoadSnapshot};
use crate::error::{SimError, TransferFailure};
use crate::tokens::{DEFAULT_CHARS_PER_TOKEN, TokenSource, Tokenizer};
use driver::EngineHandle;
use faults::Faults;
use kv_events::Publisher;
use metrics::Metrics;

/// The model id reported when none is configured.
pub const DEFAULT_MODEL: &str = "sim-llama-8b";

/// Everything one simulated worker is configured with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The worker's name (response header, `system_fingerprint`,
    /// `meta_info.worker`); empty means `worker-<port>`.
    pub name: String,
    /// The model id served.
    pub model: String,
    /// Characters per token of the tokenizer.
    pub chars_per_token: usize,
    /// Output tokens when a request gives no limit.
    pub default_max_tokens: usize,
    /// Largest accepted request body in bytes.
    pub max_body_bytes: usize,
    /// Answer at once with no simulated compute (router-overhead runs).
    pub instant: bool,
    /// The worker model.
    pub engine: EngineConfig,
    /// Fault knobs at start-up.
    pub faults: FaultConfig,
    /// The KV-event publisher (off unless `kv_events.endpoint` is set).
    pub kv_events: KvEventsConfig,
    /// Prefill/decode disaggregation: the role and the KV transfer.
    pub pd: PdConfig,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            model: DEFAULT_MODEL.to_owned(),
            chars_per_token: DEFAULT_CHARS_PER_TOKEN,
            default_max_tokens: 16,
            max_body_bytes: 32 << 20,
            instant: false,
            engine: EngineConfig::default(),
            faults: FaultConfig::default(),
            kv_events: KvEventsConfig::default(),
            pd: PdConfig::default(),
        }
    }
}

impl WorkerConfig {
    /// Checks every part.
    pub fn validate(&self) -> Result<(), SimError> {
        Tokenizer::new(self.chars_per_token)?;
        if self.model.is_empty() {
            return Err(SimError::Config("model must not be empty".into()));
        }
        if !self.name.chars().all(|c| c.is_ascii_graphic()) {
            return Err(SimError::Config(format!(
                "worker name {:?} must be printable ASCII without spaces (it goes in a header)",
                self.name
            )));
        }
        if self.max_body_bytes == 0 {
            return Err(SimError::Config("max_body_bytes must be positive".into()));
        }
        self.engine.validate()?;
        self.kv_events.validate()?;
        self.pd.validate()?;
        self.faults.validate()
    }
}

/// Shared state of one worker's handlers.
pub(crate) struct WorkerState {
    config: WorkerConfig,
    name: Arc<str>,
    model: Arc<str>,
    /// LoRA adapters loaded at run time (vLLM's `/v1/load_lora_adapter`),
    /// listed in `/v1/models` after the model.
    adapters: parking_lot::Mutex<Vec<String>>,
    /// Reply text (simulated, `chars_per_token` characters per token).
    tokenizer: Tokenizer,
    /// Prompt token ids: what the engine, its cache and KV events see.
    tokens: Arc<dyn TokenSource>,
    engine: EngineHandle,
    faults: Faults,
    metrics: Metrics,
    /// The KV-event publisher, when configured.
    kv_events: Option<Publisher>,
    next_id: AtomicU64,
    /// The Responses API's stored responses (`store`, the default).
    stored: stored::Stored,
    /// Prefill: the KV held per room.
    rooms: pd::Rooms,
    /// Decode: the client KV is pulled with.
    pull: pd::PullClient,
    /// Where decode workers pull this worker's KV: its bootstrap listener,
    /// else its HTTP port (host unspecified: loopback).
    pull_addr: SocketAddr,
    shutdown: CancellationToken,
    /// All workers of this process, for `/admin/workers/{i}/faults`
    /// (set once, after the group is built).
    group: OnceLock<Vec<Arc<WorkerState>>>,
}

impl WorkerState {
    fn load(&self) -> LoadSnapshot {
        self.engine.stats().load
    }

    /// Under `strict_models`, refuses a request whose body names a model
    /// this worker does not serve: its model or an adapter loaded into it
    /// (a body that names none, or is not JSON, is left to its parse).
    fn check_model(&self, body: &[u8]) -> Result<(), SimError> {
        #[derive(serde::Deserialize)]
        struct Named {
            model: Option<String>,
        }
        if !self.faults.strict_models() {
            return Ok(());
        }
        let Ok(Named { model: Some(model) }) = serde_json::from_slice(body) else {
            return Ok(());
        };
        if model == *self.model || self.adapters.lock().contains(&model) {
            return Ok(());
        }
        Err(SimError::ModelNotFound { model })
    }

    /// Applies the request-level fault knobs before any work: `hang` never
    /// answers (until shutdown), `latency_ms` delays, `error_rate` fails.
    /// Returns the knobs as read, for the ones that act later (a stream
    /// that dies after some chunks).
    async fn request_faults(&self) -> Result<FaultConfig, SimError> {
        let faults = self.faults.get();
        if faults.hang {
            // Accepted and never answered: the connection stays open until
            // the client gives up or the worker shuts down.
            self.shutdown.cancelled().await;
            return Err(SimError::EngineGone);
        }
        if faults.latency_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(faults.latency_ms)).await;
        }
        if self.faults.draw_error() {
            return Err(SimError::InjectedFault("error_rate"));
        }
        Ok(faults)
    }
}

/// A running worker.
pub struct WorkerHandle {
    state: Arc<WorkerState>,
    addr: SocketAddr,
    bootstrap: Option<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
    bootstrap_task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for WorkerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerHandle")
            .field("name", &self.name())
            .field("addr", &self.addr)
            .finish()
    }
}

impl WorkerHandle {
    /// The address it serves.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of its KV bootstrap listener (prefill workers started
    /// with a bootstrap port).
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        self.bootstrap
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The current fault knobs.
    pub fn faults(&self) -> FaultConfig {
        self.state.faults.get()
    }

    /// Replaces the fault knobs.
    pub fn set_faults(&self, faults: FaultConfig) -> Result<(), SimError> {
        self.state.faults.set(faults)
    }

    /// The KV-event PUB endpoint as bound (port resolved), while the
    /// publisher is up.
    pub fn kv_events_endpoint(&self) -> Option<String> {
        let p = self.state.kv_events.as_ref()?;
        p.stats.bound.lock().0.clone()
    }

    /// The KV-event replay endpoint as bound, while the publisher is up.
    pub fn kv_events_replay_endpoint(&self) -> Option<String> {
        let p = self.state.kv_events.as_ref()?;
        p.stats.bound.lock().1.clone()
    }

    /// The KV-event publisher's counters (`None` without a publisher).
    pub fn kv_events_counters(&self) -> Option<kv_events::KvEventsCounters> {
        self.state.kv_events.as_ref().map(|p| p.stats.counters())
    }

    /// Waits for the worker to stop (after its shutdown token fires).
    pub async fn join(self) {
        let _ = self.task.await;
        if let Some(t) = self.bootstrap_task {
            let _ = t.await;
        }
    }
}

/// Starts one worker on `listener`; it runs until `shutdown` fires.
pub async fn start(
    listener: TcpListener,
    config: WorkerConfig,
    shutdown: CancellationToken,
) -> Result<WorkerHandle, SimError> {
    let mut group = start_group(vec![(listener, config)], shutdown).await?;
    Ok(group.remove(0))
}

/// Starts one worker on `listener` whose prompts are tokenized by `tokens`
/// (a real tokenizer, say) instead of the simulated tokenizer.
pub async fn start_with_tokens(
    listener: TcpListener,
    config: WorkerConfig,
    tokens: Arc<dyn TokenSource>,
    shutdown: CancellationToken,
) -> Result<WorkerHandle, SimError> {
    let mut group = start_workers(vec![(listener, config, Some(tokens))], shutdown).await?;
    Ok(group.remove(0))
}

/// Starts several workers, each on its listener, that can administer each
/// other's faults; all stop when `shutdown` fires.
pub async fn start_group(
    workers: Vec<(TcpListener, WorkerConfig)>,
    shutdown: CancellationToken,
) -> Result<Vec<WorkerHandle>, SimError> {
    let workers = workers.into_iter().map(|(l, c)| (l, c, None)).collect();
    start_workers(workers, shutdown).await
}

/// A worker to start, with its own token source or (`None`) the simulated
/// tokenizer of its configuration.
type WorkerSpec = (TcpListener, WorkerConfig, Option<Arc<dyn TokenSource>>);

async fn start_workers(
    workers: Vec<WorkerSpec>,
    shutdown: CancellationToken,
) -> Result<Vec<WorkerHandle>, SimError> {
    let mut states = Vec::new();
    let mut prepared = Vec::new();
    for (listener, config, tokens) in workers {
        config.validate()?;
        let addr = listener.local_addr()?;
        let name: Arc<str> = if config.name.is_empty() {
            format!("worker-{}", addr.port()).into()
        } else {
            config.name.clone().into()
        };
        let engine = Engine::new(config.engine.clone())?;
        let faults = Faults::new(config.faults.clone());
        let (kv_events, sink) = if config.kv_events.enabled() {
            let (p, sink) = Publisher::start(
                &config.kv_events,
                config.engine.block_size,
                faults.kv_events(),
                shutdown.clone(),
            )
            .await?;
            (Some(p), Some(sink))
        } else {
            (None, None)
        };
        let tokenizer = Tokenizer::new(config.chars_per_token)?;
        let tokens = tokens.unwrap_or_else(|| Arc::new(tokenizer));
        let bootstrap = match config.pd.bootstrap_port {
            Some(port) => {
                let at = SocketAddr::new(addr.ip(), port);
                let l = TcpListener::bind(at).await.map_err(|e| {
                    SimError::Config(format!(
                        "cannot listen on {at} for KV pulls (--bootstrap-port): {e}"
                    ))
                })?;
                let bound = l.local_addr()?;
                Some((l, bound))
            }
            None => None,
        };
        let mut pull_addr = bootstrap.as_ref().map_or(addr, |b| b.1);
        if pull_addr.ip().is_unspecified() {
            pull_addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let state = Arc::new(WorkerState {
            name,
            model: config.model.clone().into(),
            adapters: parking_lot::Mutex::new(Vec::new()),
            tokenizer,
            tokens,
            engine: EngineHandle::spawn(engine, faults.slowdown(), sink, shutdown.clone()),
            faults,
            metrics: Metrics::default(),
            kv_events,
            next_id: AtomicU64::new(1),
            stored: stored::Stored::default(),
            rooms: pd::Rooms::new(std::time::Duration::from_millis(config.pd.hold_timeout_ms)),
            pull: pd::PullClient::new(),
            pull_addr,
            shutdown: shutdown.clone(),
            group: OnceLock::new(),
            config,
        });
        states.push(state.clone());
        prepared.push((listener, addr, bootstrap, state));
    }
    for s in &states {
        let _ = s.group.set(states.clone());
    }
    Ok(prepared
        .into_iter()
        .map(|(listener, addr, bootstrap, state)| {
            let router = routes::router(state.clone());
            let task = tokio::spawn(listen::serve(listener, addr, router, state.clone()));
            let (bootstrap, bootstrap_task) = match bootstrap {
                Some((l, at)) => {
                    let router = routes::bootstrap_router(state.clone());
                    let t = tokio::spawn(listen::serve(l, at, router, state.clone()));
                    (Some(at), Some(t))
                }
                None => (None, None),
            };
            WorkerHandle {
                state,
                addr,
                bootstrap,
                task,
                bootstrap_task,
            }
        })
        .collect())
}

/// The OpenAI-style error object for `e`.
pub(crate) fn error_json(e: &SimError) -> serde_json::Value {
    let (kind, param, code): (_, _, serde_json::Value) = match e {
        SimError::BadRequest { param, .. } => (
            "invalid_request_error",
            param.clone(),
            "invalid_request".into(),
        ),
        SimError::PayloadTooLarge { .. } => {
            ("invalid_request_error", None, "payload_too_large".into())
        }
        SimError::NotFound(_) => ("invalid_request_error", None, "not_found".into()),
        // vLLM's own: its exception's name as the type, the status as
        // the code.
        SimError::ModelNotFound { .. } => ("NotFoundError", Some("model".to_owned()), 404.into()),
        SimError::ResponseNotFound { param, .. } => (
            "invalid_request_error",
            param.map(str::to_owned),
            "not_found".into(),
        ),
        SimError::InjectedFault(_) => ("server_error", None, "injected_fault".into()),
        SimError::Unavailable(_) => ("server_error", None, "unavailable".into()),
        SimError::KvTransfer { failure, .. } => (
            "server_error",
            None,
            match failure {
                TransferFailure::NotFound => "kv_not_found",
                TransferFailure::PrefillFailed => "kv_prefill_failed",
                TransferFailure::Unreachable => "kv_transfer_failed",
                TransferFailure::TimedOut => "kv_transfer_timeout",
            }
            .into(),
        ),
        SimError::Config(_)
        | SimError::TraceIo { .. }
        | SimError::TraceFormat { .. }
        | SimError::BadUrl { .. }
        | SimError::EngineGone
        | SimError::Routing(_)
        | SimError::TooManyFailures { .. }
        | SimError::NothingFinished
        | SimError::Io(_) => ("server_error", None, "internal_error".into()),
    };
    serde_json::json!({"error": {"message": e.to_string(), "type": kind, "param": param, "code": code}})
}

/// The one place errors become HTTP statuses.
pub(crate) fn error_response(e: &SimError) -> Response {
    let status = match e {
        SimError::BadRequest { .. } => StatusCode::BAD_REQUEST,
        SimError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        SimError::NotFound(_)
        | SimError::ModelNotFound { .. }
        | SimError::ResponseNotFound { .. } => StatusCode::NOT_FOUND,
        SimError::InjectedFault(_)
        | SimError::Config(_)
        | SimError::TraceIo { .. }
        | SimError::TraceFormat { .. }
        | SimError::BadUrl { .. }
        | SimError::Routing(_)
        | SimError::TooManyFailures { .. }
        | SimError::NothingFinished
        | SimError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        SimError::Unavailable(_) | SimError::EngineGone => StatusCode::SERVICE_UNAVAILABLE,
        SimError::KvTransfer { failure, .. } => match failure {
            TransferFailure::NotFound => StatusCode::NOT_FOUND,
            TransferFailure::PrefillFailed => StatusCode::INTERNAL_SERVER_ERROR,
            TransferFailure::Unreachable => StatusCode::BAD_GATEWAY,
            TransferFailure::TimedOut => StatusCode::GATEWAY_TIMEOUT,
        },
    };
    (status, axum::Json(error_json(e))).into_response()
}

/// Reads a request body of at most `limit` bytes.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<Bytes, SimError> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| SimError::PayloadTooLarge { limit })
}
