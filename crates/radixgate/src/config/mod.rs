//! The gateway's configuration: one serde schema of per-subsystem parts.
//!
//! Layering is file < environment < flags. A YAML file (`--config`) is read
//! into [`Config`] (every struct denies unknown keys, so a typo is a start-up
//! error, and missing keys take their defaults); then every flag the user
//! gave, directly or through its `RADIXGATE_*` environment variable (clap
//! resolves env < flag for each one), overrides its key. [`Config::validate`]
//! runs last and names the offending key. Each subsystem receives only its
//! own part.
//!
//! Flag names follow SGLang's router wherever both have the setting, so an
//! existing command line keeps working.

mod cli;
mod discovery;
mod kv_events;
mod pd;
mod record;
mod routing;
mod sync;
mod telemetry;
mod tenants;
mod validate;

pub use cli::{ServeArgs, SyncArgs};
pub use discovery::{
    DEFAULT_BOOTSTRAP_PORT_ANNOTATION, DiscoveryConfig, ModelIdFrom, Pool, PoolConfig,
};
pub(crate) use kv_events::bracketed;
pub use kv_events::{EngineRules, KvEventsConfig, MAX_DATA_PARALLEL_SIZE};
/// A worker given at start-up (`workers:` entries, `--worker-urls`) or
/// posted to the admin API: routing's own spec, a URL or `{url, api_key?,
/// models?}`. Re-exported here because it is part of this schema.
pub use pd::{MAX_SKIP_TOKENS, PdConfig, PdProtocol};
pub use radixgate_routing::WorkerSpec;
pub use record::{MAX_RECORD_KEEP, RecordTraceConfig};
pub use sync::{
    MAX_REFERENCE_WINDOW_BYTES, StreamStorage, SyncAuth, SyncAuthConfig, SyncConfig, SyncTlsConfig,
};
pub use telemetry::{MAX_REQUEST_ID_HEADERS, TracingConfig, otlp_traces_url};
pub use tenants::{API_KEY_TENANT, ResolvedTenant, TenantSpec, TenantsConfig};
pub use validate::{
    MAX_BACKOFF_MULTIPLIER, MAX_MS, MAX_OUTLIER_FACTOR, MAX_PAYLOAD_SIZE, MAX_REQUESTS,
    MAX_RESPONSE_IDS, MAX_RETRIES, MAX_SECS, MAX_THRESHOLD,
};

use radixgate_routing::{PolicyConfig, RoutingError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// A section written with nothing under it (`sync:` with every key
/// commented out, a chart's empty value) is YAML's null: its defaults, as
/// a section left out is.
pub(crate) fn null_is_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// Everything `radixgate serve` needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listening socket, limits, keys.
    #[serde(deserialize_with = "null_is_default")]
    pub server: ServerConfig,
    /// Workers known at start-up.
    #[serde(deserialize_with = "null_is_default")]
    pub workers: Vec<WorkerSpec>,
    /// Workers found as pods through the Kubernetes API server.
    #[serde(deserialize_with = "null_is_default")]
    pub discovery: DiscoveryConfig,
    /// The routing policy and its settings (`{policy: cache_aware, ...}`;
    /// without `policy:`, cache_aware's).
    #[serde(deserialize_with = "routing::section")]
    pub routing: PolicyConfig,
    /// Active health checking.
    #[serde(deserialize_with = "null_is_default")]
    pub health: HealthConfig,
    /// Retrying failed requests on other workers.
    #[serde(deserialize_with = "null_is_default")]
    pub retry: RetryConfig,
    /// Per-worker circuit breakers.
    #[serde(deserialize_with = "null_is_default")]
    pub circuit_breaker: BreakerConfig,
    /// Ejecting workers much slower than their peers.
    #[serde(deserialize_with = "null_is_default")]
    pub outlier_detection: OutlierConfig,
    /// Concurrency limit and its queue.
    #[serde(deserialize_with = "null_is_default")]
    pub admission: AdmissionConfig,
    /// Named API keys with limits and an admission priority.
    #[serde(deserialize_with = "null_is_default")]
    pub tenants: TenantsConfig,
    /// Prometheus exposition.
    #[serde(deserialize_with = "null_is_default")]
    pub metrics: MetricsConfig,
    /// Sharing routing state with other router replicas over NATS.
    #[serde(deserialize_with = "null_is_default")]
    pub sync: SyncConfig,
    /// The workers' KV-cache event streams (exact prefix matches).
    #[serde(deserialize_with = "null_is_default")]
    pub kv_events: KvEventsConfig,
    /// Recording every routed request as a replayable trace.
    #[serde(deserialize_with = "null_is_default")]
    pub record_trace: RecordTraceConfig,
    /// Prefill/decode disaggregation.
    #[serde(deserialize_with = "null_is_default")]
    pub pd: PdConfig,
    /// Response affinity: which worker made each stored Responses API
    /// response (`crate::responses`).
    #[serde(deserialize_with = "null_is_default")]
    pub responses: ResponsesConfig,
    /// Logging.
    #[serde(deserialize_with = "null_is_default")]
    pub log: LogConfig,
    /// Request ids and OpenTelemetry trace export.
    #[serde(deserialize_with = "null_is_default")]
    pub tracing: TracingConfig,
}

/// The listening socket and request limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to bind.
    pub host: String,
    /// Port to bind.
    pub port: u16,
    /// Largest accepted request body, in bytes. The default, 32 MiB, is
    /// Anthropic's Messages API limit and holds one image at OpenAI's
    /// 20 MB-per-image limit as base64 (about 27 MB) with its prompt; raise
    /// it to about 70 MB to pass OpenAI's 50 MB of image bytes per request.
    /// Text alone never needs this much: a 1M-token prompt is ~4 MB.
    pub max_payload_size: usize,
    /// Longest a request body may take to arrive after its headers, in
    /// seconds; a client that stalls mid-body gets 408. 60 s is nginx's
    /// `client_body_timeout` and lets a full 32 MiB body arrive over a
    /// 5 Mbit/s uplink.
    pub body_read_timeout_secs: u64,
    /// Request-body bytes all connections together may hold in memory at
    /// once (bodies being read, waiting for admission, or kept for retries
    /// until the worker answers); a request that would exceed it gets 503
    /// with `Retry-After`. 1 GiB is 32 bodies at the default size limit or
    /// ~2,000 prompts of 128k tokens, and fits a router pod of 2 GiB or more;
    /// lower it on smaller pods.
    pub max_buffered_body_bytes: usize,
    /// Longest a client connection may take to send a request's headers,
    /// in seconds, counted from the connection's start or its request's
    /// first byte; slower connections (slowloris) are closed. 10 s is far
    /// more than any real client needs for a few hundred bytes of headers.
    pub header_read_timeout_secs: u64,
    /// Seconds a client connection with no request in flight is kept open.
    /// 120 s outlasts the idle timeout of common client pools (Go 90 s,
    /// Python httpx 5 s, aiohttp 15 s, Node 5 s), so the client, not the
    /// router, closes idle connections and no request races a close.
    pub idle_timeout_secs: u64,
    /// Longest a client may go without taking any of its answer while the
    /// router has some for it, in seconds; then its connection is closed,
    /// and with it the request (its admission slot, the worker's stream).
    /// 60 s is nginx's `send_timeout`: a client that stops reading, with
    /// its connection kept open, otherwise holds all of that for as long
    /// as the worker would go on.
    pub client_write_timeout_secs: u64,
    /// Client connections open at once, over all serving threads; beyond
    /// it new connections are closed at once (and a WARN is logged). 0 =
    /// half of the process's open-file limit (`ulimit -n`; 4096 where it
    /// cannot be read), leaving the other half for worker connections,
    /// so a flood of clients hits this cap before the process runs out of
    /// file descriptors. Each request in flight beyond the first on one
    /// connection (HTTP/2 streams) counts as one more connection, since
    /// it takes a worker connection too; one over the cap gets 503.
    pub max_connections: usize,
    /// Longest a request may take end to end, in seconds (0 = no limit).
    /// One that runs out while its body is still arriving is answered 408,
    /// while it is still queued 503, and only once sent to a worker 504.
    pub request_timeout_secs: u64,
    /// How long shutdown waits for in-flight requests, in seconds.
    pub shutdown_grace_period_secs: u64,
    /// Seconds the router keeps accepting after the shutdown signal, with
    /// `/readiness` answering 503, before it closes its listener: time for
    /// load balancers (Kubernetes endpoints) to stop sending it new
    /// connections, so a rolling update of the router loses none. 0 = close
    /// at once. On Kubernetes, 5-10 (and a pod grace period longer than
    /// this plus `shutdown_grace_period_secs`).
    pub shutdown_delay_secs: u64,
    /// Longest a draining worker (`DELETE /workers`, a terminating pod) is
    /// waited for, in seconds: it gets no new requests from the start, and
    /// is removed when its requests in flight are done or this has passed
    /// (those still running are then not cut; the worker ends them).
    /// Default 300, the non-streamed request timeout: Kubernetes' own
    /// grace period (30 s unless the pod sets more) usually ends it first.
    pub drain_timeout_secs: u64,
    /// Key clients must send as `Authorization: Bearer <key>`; none = open
    /// (unless `tenants` lists keys). It is one more tenant, `default`, with
    /// no limits.
    pub api_key: Option<String>,
    /// Key for the admin plane (`/workers`, `/flush_cache`, `/dashboard`).
    /// The client key never opens it; without this key, `admin_access`
    /// decides who may.
    pub admin_api_key: Option<String>,
    /// Who may use the admin plane when no `admin_api_key` is set.
    pub admin_access: AdminAccess,
    /// Key for `/metrics` (main port and `metrics.prometheus_port`); none =
    /// open, as Prometheus scrapers usually expect.
    pub metrics_api_key: Option<String>,
    /// Workers added at runtime (the admin API, later discovery) must match
    /// one entry: a CIDR (`10.0.0.0/8`) for IP-literal URLs, an exact host
    /// name or a `*.suffix` pattern for named ones. Names are never
    /// resolved. Empty = no restriction. Workers from the config file and
    /// flags are trusted: the operator wrote them.
    pub worker_allowlist: Vec<String>,
    /// Web origins whose pages may call the client API from a browser
    /// (CORS): exact origins (`https://chat.example.com`) or `*` for any.
    /// Empty = none: a browser then refuses a page's cross-origin calls,
    /// as before. The admin plane never answers another origin.
    pub cors_allowed_origins: Vec<String>,
    /// Serving threads, each a single-threaded event loop accepting on the
    /// same socket (0 = one per CPU, at most [`MAX_THREADS`]).
    pub threads: usize,
}

/// Who may use the admin plane when no `admin_api_key` is set.
///
/// The default is `loopback`: an operator on the router's own host (a shell,
/// a sidecar, `kubectl exec`) can manage workers without setting up a key,
/// and nobody else can, whatever address the router listens on. With an
/// admin key set this setting is not used: the key decides, from anywhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdminAccess {
    /// Only peers at 127.0.0.0/8 or ::1; no key asked.
    #[default]
    Loopback,
    /// Nobody: every admin call is refused with 403.
    Off,
}

/// Most serving threads a gateway runs (and the cap of `threads: 0`).
pub const MAX_THREADS: usize = 64;

/// Client connections allowed when `max_connections: 0` cannot read the
/// open-file limit.
const FALLBACK_MAX_CONNECTIONS: usize = 4096;

impl ServerConfig {
    /// The number of serving threads to start.
    pub fn serving_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism()
                .map_or(1, usize::from)
                .min(MAX_THREADS),
            n => n,
        }
    }
}

impl ServerConfig {
    /// The keys and the worker allowlist.
    fn validate_access(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("server.api_key", &self.api_key),
            ("server.admin_api_key", &self.admin_api_key),
            ("server.metrics_api_key", &self.metrics_api_key),
        ] {
            match value.as_deref() {
                Some("") => {
                    return Err(invalid(
                        key,
                        "must not be empty (leave it unset for no key)",
                    ));
                }
                Some(k) if k.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                    return Err(invalid(
                        key,
                        "must not contain whitespace or control characters \
                         (it is sent as `Authorization: Bearer <key>`)",
                    ));
                }
                Some(k) if !k.is_ascii() => return Err(invalid(key, tenants::NOT_ASCII)),
                _ => {}
            }
        }
        if self.admin_api_key.is_some() && self.admin_api_key == self.api_key {
            return Err(invalid(
                "server.admin_api_key",
                "must differ from server.api_key: the client key never opens the admin plane",
            ));
        }
        crate::allowlist::Allowlist::parse(&self.worker_allowlist)?;
        Ok(())
    }

    /// The cap on client connections: `max_connections`, or with 0 half
    /// the open-file soft limit (at least 64).
    pub fn connection_cap(&self) -> usize {
        match self.max_connections {
            0 => open_file_limit().map_or(FALLBACK_MAX_CONNECTIONS, |n| (n / 2).max(64)),
            n => n,
        }
    }
}

/// The process's soft limit on open files, from `/proc/self/limits` (Linux;
/// `None` elsewhere or when unlimited).
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 30000,
            max_payload_size: 32 << 20,
            body_read_timeout_secs: 60,
            max_buffered_body_bytes: 1 << 30,
            header_read_timeout_secs: 10,
            idle_timeout_secs: 120,
            client_write_timeout_secs: 60,
            max_connections: 0,
            request_timeout_secs: 1800,
            shutdown_grace_period_secs: 30,
            drain_timeout_secs: 300,
            shutdown_delay_secs: 0,
            api_key: None,
            admin_api_key: None,
            admin_access: AdminAccess::Loopback,
            metrics_api_key: None,
            worker_allowlist: Vec::new(),
            cors_allowed_origins: Vec::new(),
            threads: 0,
        }
    }
}

/// Active health checking. Healthy workers are probed every
/// `interval_secs`; an unhealthy one is probed with exponential back-off
/// from `unhealthy_backoff_initial_ms` up to `unhealthy_backoff_max_ms`, so a
/// worker that comes back is re-admitted within a few seconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Whether to probe at all (off: every worker counts as healthy).
    pub enabled: bool,
    /// Seconds between probes of a healthy worker.
    pub interval_secs: u64,
    /// Seconds before a probe counts as failed.
    pub timeout_secs: u64,
    /// Path probed on each worker.
    pub endpoint: String,
    /// Consecutive failures that mark a worker unhealthy.
    pub failure_threshold: u32,
    /// Consecutive successes that mark a worker healthy again.
    pub success_threshold: u32,
    /// First back-off between probes of an unhealthy worker, in ms.
    pub unhealthy_backoff_initial_ms: u64,
    /// Largest back-off between probes of an unhealthy worker, in ms.
    pub unhealthy_backoff_max_ms: u64,
    /// Seconds between re-reads of a healthy worker's models (and KV cache
    /// size), where the worker reports them: a URL whose server changed
    /// model without failing a probe (a Service whose pods a rolling
    /// update replaced) is routed for its new model within this. 0: read
    /// only on admission and when it comes back healthy.
    pub models_refresh_secs: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_secs: 10,
            timeout_secs: 5,
            endpoint: "/health".into(),
            failure_threshold: 3,
            success_threshold: 2,
            unhealthy_backoff_initial_ms: 250,
            unhealthy_backoff_max_ms: 2000,
            models_refresh_secs: 30,
        }
    }
}

impl HealthConfig {
    /// The longest a healthy worker's model list may go unread here: a
    /// re-read is due `models_refresh_secs` after the last, at a probe,
    /// which takes up to `timeout_secs` and comes every `interval_secs`.
    /// Zero when models are read only on admission and return.
    pub(crate) fn models_lag(&self) -> Duration {
        match self.models_refresh_secs {
            0 => Duration::ZERO,
            refresh => Duration::from_secs(
                refresh
                    .saturating_add(self.interval_secs)
                    .saturating_add(self.timeout_secs),
            ),
        }
    }
}

/// Retrying on another worker: on connect errors and on 5xx/429 before any
/// byte reached the client, never after.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Retries after the first attempt (0 = never retry).
    pub max_retries: u32,
    /// First back-off, in ms.
    pub initial_backoff_ms: u64,
    /// Largest back-off, in ms.
    pub max_backoff_ms: u64,
    /// Growth of the back-off per retry (>= 1).
    pub backoff_multiplier: f64,
    /// Random spread of each back-off, as a fraction of it (0..=1).
    pub jitter_factor: f64,
    /// Seconds an attempt of a streamed request (`stream: true`) may take
    /// until the worker's response head *and* its first body chunk
    /// arrive; then it counts as the worker's failure and is retried
    /// elsewhere (nothing has reached the client yet). SGLang and vLLM send
    /// an event stream's head at once and prefill afterwards, so the head
    /// alone proves nothing: the first chunk is the first token. 0 = none.
    /// Default 60: a 100k-token prefill takes seconds to a few tens of
    /// seconds on current GPUs even for a 70B model, and twice that queued
    /// ahead still fits; a worker silent for a minute is hung, not busy.
    pub first_byte_timeout_secs: u64,
    /// The same for a non-streamed request, whose answer comes whole, so
    /// its first byte only arrives once the generation is done. 0 = none.
    /// Default 300: about 10k output tokens at 35 tokens/s, longer than
    /// most non-streamed answers; a retry after it still fits in the 600 s
    /// an OpenAI SDK client waits by default.
    pub non_stream_timeout_secs: u64,
    /// Seconds a response body may stay silent between two chunks once it
    /// has started; then an event stream ends with an SSE `error` event (a
    /// non-streamed body is cut) and it counts as the worker's failure.
    /// 0 = none. Default 60: decode steps take milliseconds, and a request
    /// the worker pre-empted and re-prefills resumes within seconds.
    pub stall_timeout_secs: u64,
    /// The longest a worker's `Retry-After` is honoured, in seconds: a
    /// worker that answers 429 or 503 naming a wait is passed over while
    /// another worker can take the request, until then (at most this
    /// long). 0 = never. Default 60: an engine shedding a burst names
    /// seconds; a longer wait (a quota's) is checked again each minute.
    pub max_retry_after_secs: u64,
    /// The retries of all requests together may number at most this
    /// percentage of the requests of the last 10 s (plus
    /// `budget_min_per_sec`); over it a failure is its request's answer,
    /// as with `max_retries` spent. 0 = no budget. Default 50: one worker
    /// of two failing everything needs no more, while a pool failing as a
    /// whole is sent 1.5 times its requests, not `max_retries + 1` times.
    pub budget_percent: u32,
    /// Retries a second the budget always allows, so that a gateway with
    /// few requests still retries their failures. Default 10.
    pub budget_min_per_sec: u32,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 3,
            initial_backoff_ms: 50,
            max_backoff_ms: 2000,
            backoff_multiplier: 1.5,
            jitter_factor: 0.2,
            first_byte_timeout_secs: 60,
            non_stream_timeout_secs: 300,
            stall_timeout_secs: 60,
            max_retry_after_secs: 60,
            budget_percent: 50,
            budget_min_per_sec: 10,
        }
    }
}

/// Per-worker circuit breaker: `failure_threshold` consecutive failures
/// open it; after `timeout_duration_secs` one probe request is let through
/// (half-open) and `success_threshold` successes close it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Whether breakers are used at all.
    pub enabled: bool,
    /// Consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// Successes in half-open state that close it.
    pub success_threshold: u32,
    /// Seconds an open breaker waits before half-open.
    pub timeout_duration_secs: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            failure_threshold: 5,
            success_threshold: 2,
            timeout_duration_secs: 10,
        }
    }
}

/// Outlier detection, as Envoy does it for latency: every
/// `interval_secs`, a worker whose time to first byte (an EWMA over its
/// recent attempts) is above `latency_factor` times the median of its
/// peers', and above it by at least `min_gap_ms`, with `min_samples`
/// samples on both sides, is ejected (not selected) for
/// `base_ejection_secs` times the number of times it was ejected, at most
/// `max_ejection_secs`, then returns. It catches the slow-but-alive worker
/// that health checks and breakers miss. At most `max_ejection_percent` of
/// the pool is ejected at once (but one may always be), and never the last
/// available worker of a model in its role (prefill, decode); an ejected
/// worker that its model's other workers of its role leave alone (their
/// breakers open, their health checks failing) returns at the next
/// evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Whether to eject outliers at all.
    pub enabled: bool,
    /// Seconds between evaluations. Default 10 (Envoy's).
    pub interval_secs: u64,
    /// How many times the peers' median a worker's latency must reach
    /// (> 1). Default 5: prompts differ in length and cache-aware routing
    /// keeps long documents on their holders, so a worker may be somewhat
    /// slower than its peers for good reason; five times slower is not.
    pub latency_factor: f64,
    /// Smallest gap above the median, in ms, that may eject (so a pool
    /// answering in milliseconds does not eject over noise). Default 1000.
    pub min_gap_ms: u64,
    /// Samples a worker needs (since it was last ejected) before it is
    /// judged or counted as a peer. Default 20.
    pub min_samples: u32,
    /// Seconds of the first ejection; the n-th lasts n times as long.
    /// Default 30 (Envoy's).
    pub base_ejection_secs: u64,
    /// Longest ejection, in seconds. Default 300 (Envoy's).
    pub max_ejection_secs: u64,
    /// Most of the pool ejected at once, in percent (one worker may always
    /// be). Default 10 (Envoy's).
    pub max_ejection_percent: u32,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval_secs: 10,
            latency_factor: 5.0,
            min_gap_ms: 1000,
            min_samples: 20,
            base_ejection_secs: 30,
            max_ejection_secs: 300,
            max_ejection_percent: 10,
        }
    }
}

/// Admission control: at most `max_concurrent_requests` in flight; up to
/// `queue_size` more wait, each at most `queue_timeout_secs` (0 = no limit).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Concurrency limit; none = unlimited.
    pub max_concurrent_requests: Option<usize>,
    /// Requests that may wait for a slot (0 = reject at once when full).
    pub queue_size: usize,
    /// Seconds a request may wait for a slot (0 = no limit: it waits for
    /// one, within the request timeout).
    pub queue_timeout_secs: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_concurrent_requests: None,
            queue_size: 100,
            queue_timeout_secs: 60,
        }
    }
}

/// Response affinity (`crate::responses`): the ids of Responses API
/// answers, each with the worker that made it, that the gateway keeps so
/// that follow-ups (`previous_response_id`) and requests by id reach it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesConfig {
    /// The most ids kept, the least recently used forgotten first (about
    /// 200 bytes each); 0 keeps none: no affinity.
    pub max_ids: usize,
    /// Seconds an id is kept after its last use.
    pub max_age_secs: u64,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        Self {
            max_ids: 100_000,
            max_age_secs: 24 * 60 * 60,
        }
    }
}

/// Prometheus exposition. `/metrics` is always on the main port; a
/// `prometheus_port` adds a second listener for it and for the probes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Extra port serving `/metrics` and the probes (`/liveness`,
    /// `/readiness`, `/health`), apart from the client port's connection
    /// cap, so that clients filling it cannot fail an orchestrator's probes.
    pub prometheus_port: Option<u16>,
    /// Address for that port (defaults to the server's host).
    pub prometheus_host: Option<String>,
}

/// Logging.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter, e.g. `info` or `radixgate=debug,info`.
    pub level: String,
    /// One JSON object per line instead of text.
    pub json: bool,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            json: false,
        }
    }
}

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file holds no document (nothing, or only comments):
    /// most likely it is being rewritten in place (truncated, not yet
    /// written), so it is not taken for the default config, which has no
    /// workers and no keys.
    #[error(
        "config file {path} is empty (being written?): write `{{}}` for the defaults, and \
         replace the file by renaming a complete one over it"
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The config file is not valid YAML for the schema.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why, with line and column.
        #[source]
        source: serde_norway::Error,
    },
    /// The API key file (`tenants.api_key_file`) could not be read.
    #[error("cannot read API key file {path} (tenants.api_key_file): {source}")]
    ReadKeysFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The API key file holds no document: most likely it is being
    /// rewritten in place, so it is not taken for an empty list, which
    /// (without `server.api_key`) would open the client API to anyone.
    #[error(
        "API key file {path} (tenants.api_key_file) is empty (being written?): write `[]` \
         for no tenants, and replace the file by renaming a complete one over it"
    )]
    EmptyKeysFile {
        /// The file.
        path: PathBuf,
    },
    /// The API key file is not a valid list of tenants.
    #[error("invalid API key file {path}: {source}")]
    KeysFile {
        /// The file.
        path: PathBuf,
        /// Where and why, with line and column.
        #[source]
        source: serde_norway::Error,
    },
    /// The routing settings are out of range.
    #[error(transparent)]
    Routing(#[from] RoutingError),
    /// A value of a section checked by another crate is out of range
    /// (`routing.cache_threshold`).
    #[error("invalid setting `{section}.{field}`: {reason}")]
    InvalidIn {
        /// The section, as in the file (`routing`).
        section: &'static str,
        /// The key within it.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A value is out of range.
    #[error("invalid setting `{key}`: {reason}")]
    Invalid {
        /// The key, as in the file (`retry.jitter_factor`).
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

impl Config {
    /// Reads a YAML config file. Unlike an empty document given as text,
    /// a file with no document in it (nothing, blanks, only comments or a
    /// `---`) is refused: it is what a reload reads while the file is
    /// being rewritten in place, its opening comment perhaps written.
    pub fn from_yaml_file(path: &std::path::Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let no_document = text.trim().is_empty()
            || matches!(
                serde_norway::from_str::<serde_norway::Value>(&text),
                Ok(serde_norway::Value::Null)
            );
        if no_document {
            return Err(ConfigError::Empty { path: path.into() });
        }
        Self::from_yaml(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })
    }

    /// Parses YAML text (an empty document is the default config). A
    /// `routing:` section without `policy:` tunes the default policy,
    /// `cache_aware`. Every error names its key and carries its line and
    /// column.
    pub fn from_yaml(text: &str) -> Result<Self, serde_norway::Error> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let document: serde_norway::Value = serde_norway::from_str(text)?;
        if let Some(found) = unexpanded(&document, &mut String::new()) {
            return Err(serde::de::Error::custom(found));
        }
        routing::check(text, &document)?;
        serde_norway::from_str(text)
    }

    /// How long an attempt may wait for its first byte (`stream`: the
    /// client asked for an event stream), if limited.
    pub fn first_byte_timeout(&self, stream: bool) -> Option<Duration> {
        let secs = if stream {
            self.retry.first_byte_timeout_secs
        } else {
            self.retry.non_stream_timeout_secs
        };
        (secs > 0).then(|| Duration::from_secs(secs))
    }

    /// How long a started response body may stay silent, if limited.
    pub fn stall_timeout(&self) -> Option<Duration> {
        (self.retry.stall_timeout_secs > 0)
            .then(|| Duration::from_secs(self.retry.stall_timeout_secs))
    }

    /// The request timeout, if any.
    pub fn request_timeout(&self) -> Option<Duration> {
        (self.server.request_timeout_secs > 0)
            .then(|| Duration::from_secs(self.server.request_timeout_secs))
    }
}

/// The first string value of `value` (at `path`, as keys are written:
/// `workers[0].api_key`) that holds a `${NAME}` reference, as an error
/// message. The file is read as written: a key written `${WORKER_KEY}`
/// would be sent to workers, or required of clients, as those 14
/// characters, and a URL so written is refused without saying why.
pub(super) fn unexpanded(value: &serde_norway::Value, path: &mut String) -> Option<String> {
    use serde_norway::Value;
    use std::fmt::Write as _;
    match value {
        Value::String(text) => {
            let start = text.find("${")?;
            let end = start + text[start..].find('}')? + 1;
            Some(format!(
                "`{path}` holds `{}`, which is not expanded: the config file is read as \
                 written. Give secrets through the flags' RADIXGATE_* variables (or a \
                 worker's `api_key_env`, a tenant's `key_env`, sync's `*_file`), or expand \
                 the file before radixgate reads it",
                &text[start..end]
            ))
        }
        Value::Sequence(items) => items.iter().enumerate().find_map(|(i, item)| {
            let len = path.len();
            let _ = write!(path, "[{i}]");
            let found = unexpanded(item, path);
            path.truncate(len);
            found
        }),
        Value::Mapping(map) => map.iter().find_map(|(key, item)| {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            match key {
                Value::String(key) => path.push_str(key),
                _ => path.push('?'),
            }
            let found = unexpanded(item, path);
            path.truncate(len);
            found
        }),
        Value::Tagged(tagged) => unexpanded(&tagged.value, path),
        Value::Null | Value::Bool(_) | Value::Number(_) => None,
    }
}

#[cfg(test)]
mod example_tests;
#[cfg(test)]
mod tests;
