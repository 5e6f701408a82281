//! The flags of `radixgate serve`, each with its `RADIXGATE_*` variable.
//!
//! Every flag is optional: one that is not given (nor its variable) leaves
//! the file's value, or the default, in place. That is what makes the
//! layering file < env < flags work without a second copy of the defaults.

use super::{Config, ConfigError, WorkerSpec};
use clap::Args;
use clap::builder::BoolishValueParser;
use radixgate_routing::{PolicyConfig, WorkerRole};
use std::path::PathBuf;

/// Command-line flags of `radixgate serve`.
#[derive(Clone, Debug, Default, Args)]
pub struct ServeArgs {
    /// YAML config file; flags and environment variables override it.
    /// SIGHUP re-reads it (with the same flags) and applies the workers,
    /// routing settings and keys; other settings need a restart.
    #[arg(long, env = "RADIXGATE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Worker base URLs (separated by spaces or commas, or repeat the
    /// flag); they replace the config file's `workers` (its prefill and
    /// decode workers stay).
    #[arg(long, num_args = 1.., env = "RADIXGATE_WORKER_URLS", value_delimiter = ',')]
    pub worker_urls: Vec<String>,

    /// Discover workers as pods from the Kubernetes API server (in-cluster
    /// credentials in a pod, else kubeconfig); combines with --worker-urls.
    #[arg(long, env = "RADIXGATE_SERVICE_DISCOVERY", value_parser = BoolishValueParser::new())]
    pub service_discovery: bool,
    /// Labels a worker pod must carry, `key=value` (space-separated, or
    /// repeat the flag); pushed to the API server as a label selector.
    #[arg(long, num_args = 1.., env = "RADIXGATE_SELECTOR", value_delimiter = ',')]
    pub selector: Vec<String>,
    /// Namespace to watch for worker pods [default: all namespaces].
    #[arg(long, env = "RADIXGATE_SERVICE_DISCOVERY_NAMESPACE")]
    pub service_discovery_namespace: Option<String>,
    /// Port of the discovered workers [default: 80].
    #[arg(long, env = "RADIXGATE_SERVICE_DISCOVERY_PORT")]
    pub service_discovery_port: Option<u16>,
    /// Pod annotation whose value is that pod's port, for pools whose pods
    /// differ; a pod without it uses --service-discovery-port.
    #[arg(long, env = "RADIXGATE_SERVICE_DISCOVERY_PORT_ANNOTATION")]
    pub service_discovery_port_annotation: Option<String>,
    /// Where a discovered pod's model id is read: `label:KEY` or
    /// `annotation:KEY`; unset, the worker is asked (/v1/models).
    #[arg(long, env = "RADIXGATE_MODEL_ID_FROM")]
    pub model_id_from: Option<String>,
    /// Labels a prefill worker pod must carry, `key=value` (space-separated,
    /// or repeat the flag): a discovery pool of prefill workers with the
    /// namespace, port and model settings above; replaces the file's
    /// prefill pools. Needs --pd-disaggregation.
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", env = "RADIXGATE_PREFILL_SELECTOR", value_delimiter = ',')]
    pub prefill_selector: Vec<String>,
    /// Labels a decode worker pod must carry, as --prefill-selector: a
    /// discovery pool of decode workers; replaces the file's decode pools.
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", env = "RADIXGATE_DECODE_SELECTOR", value_delimiter = ',')]
    pub decode_selector: Vec<String>,
    /// Pod annotation whose value is a discovered prefill pod's bootstrap
    /// port (SGLang's --disaggregation-bootstrap-port); a pod without it
    /// has its pool's bootstrap_port, else none
    /// [default: sglang.ai/bootstrap-port].
    #[arg(long, value_name = "KEY", env = "RADIXGATE_BOOTSTRAP_PORT_ANNOTATION")]
    pub bootstrap_port_annotation: Option<String>,
    /// Kubeconfig file for discovery, instead of in-cluster credentials,
    /// $KUBECONFIG or ~/.kube/config.
    #[arg(long, env = "RADIXGATE_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Seconds to keep accepting after SIGTERM with /readiness at 503,
    /// before the listener closes (load balancers catch up) [default: 0].
    #[arg(long, env = "RADIXGATE_SHUTDOWN_DELAY_SECS")]
    pub shutdown_delay_secs: Option<u64>,
    /// Seconds a drained worker (DELETE /workers, a terminating pod) is
    /// waited for before it is forgotten [default: 300].
    #[arg(long, env = "RADIXGATE_DRAIN_TIMEOUT_SECS")]
    pub drain_timeout_secs: Option<u64>,

    /// Routing policy [default: cache_aware]. In a disaggregated pool, the
    /// prefill workers' policy.
    #[arg(long, env = "RADIXGATE_POLICY", value_parser = PolicyConfig::NAMES)]
    pub policy: Option<String>,

    /// Serve a prefill/decode disaggregated pool: each request goes to a
    /// prefill worker (--prefill) and a decode worker (--decode).
    #[arg(long, env = "RADIXGATE_PD_DISAGGREGATION", value_parser = BoolishValueParser::new())]
    pub pd_disaggregation: bool,
    /// The engines' KV-transfer protocol in a disaggregated pool
    /// [default: sglang].
    #[arg(long, value_enum, env = "RADIXGATE_PD_PROTOCOL")]
    pub pd_protocol: Option<super::PdProtocol>,
    /// A prefill worker and, for SGLang, its bootstrap port (repeat the
    /// flag per worker): `--prefill http://p0:30000 8998`.
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"])]
    pub prefill: Vec<String>,
    /// A decode worker (repeat the flag, or several URLs after one).
    #[arg(long, num_args = 1.., value_name = "URL", env = "RADIXGATE_DECODE", value_delimiter = ',')]
    pub decode: Vec<String>,
    /// The prefill workers' policy (the same setting as --policy).
    #[arg(long, env = "RADIXGATE_PREFILL_POLICY", value_parser = PolicyConfig::NAMES)]
    pub prefill_policy: Option<String>,
    /// The decode workers' policy [default: power_of_two].
    #[arg(long, env = "RADIXGATE_DECODE_POLICY", value_parser = PolicyConfig::NAMES)]
    pub decode_policy: Option<String>,
    /// vLLM: send a request to its decode worker alone when that worker is
    /// predicted to hold all but at most this many of its prompt's tokens;
    /// 0 = never (SGLang pairs every request) [default: 32].
    #[arg(long, env = "RADIXGATE_PD_SKIP_PREFILL_TOKENS")]
    pub pd_skip_prefill_tokens: Option<usize>,
    /// cache_aware: a hit needs matched/input above this, 0..=1 [default: 0.3].
    #[arg(long, env = "RADIXGATE_CACHE_THRESHOLD")]
    pub cache_threshold: Option<f64>,
    /// cache_aware: imbalance needs max-min load above this [default: 64].
    #[arg(long, env = "RADIXGATE_BALANCE_ABS_THRESHOLD")]
    pub balance_abs_threshold: Option<usize>,
    /// cache_aware: imbalance needs max above this times min, >= 1 [default: 1.5].
    #[arg(long, env = "RADIXGATE_BALANCE_REL_THRESHOLD")]
    pub balance_rel_threshold: Option<f64>,
    /// cache_aware: seconds between tree eviction passes, 0 = never [default: 120].
    #[arg(long, env = "RADIXGATE_EVICTION_INTERVAL_SECS")]
    pub eviction_interval_secs: Option<u64>,
    /// cache_aware: characters per worker kept by eviction [default: 67108864].
    #[arg(long, env = "RADIXGATE_MAX_TREE_SIZE")]
    pub max_tree_size: Option<usize>,
    /// cache_aware, prefill_aware: characters of a request's routing text
    /// matched and inserted; the rest is ignored [default: 262144].
    #[arg(long, env = "RADIXGATE_MAX_ROUTING_TEXT_CHARS")]
    pub max_routing_text_chars: Option<usize>,

    /// Address to bind [default: 127.0.0.1].
    #[arg(long, env = "RADIXGATE_HOST")]
    pub host: Option<String>,
    /// Port to bind [default: 30000].
    #[arg(long, env = "RADIXGATE_PORT")]
    pub port: Option<u16>,
    /// Largest accepted request body in bytes (Anthropic's 32 MiB) [default: 33554432].
    #[arg(long, env = "RADIXGATE_MAX_PAYLOAD_SIZE")]
    pub max_payload_size: Option<usize>,
    /// Seconds a request body may take to arrive; slower gets 408 [default: 60].
    #[arg(long, env = "RADIXGATE_BODY_READ_TIMEOUT_SECS")]
    pub body_read_timeout_secs: Option<u64>,
    /// Request-body bytes held in memory at once over all requests; beyond it 503 [default: 1073741824].
    #[arg(long, env = "RADIXGATE_MAX_BUFFERED_BODY_BYTES")]
    pub max_buffered_body_bytes: Option<usize>,
    /// Seconds a client may take to send request headers (slowloris guard) [default: 10].
    #[arg(long, env = "RADIXGATE_HEADER_READ_TIMEOUT_SECS")]
    pub header_read_timeout_secs: Option<u64>,
    /// Seconds an idle keep-alive client connection is kept open [default: 120].
    #[arg(long, env = "RADIXGATE_IDLE_TIMEOUT_SECS")]
    pub idle_timeout_secs: Option<u64>,
    /// Seconds a client may take none of its answer while the router has some for it; then its connection is closed [default: 60].
    #[arg(long, env = "RADIXGATE_CLIENT_WRITE_TIMEOUT_SECS")]
    pub client_write_timeout_secs: Option<u64>,
    /// Client connections open at once; more are closed at once. 0 = half of `ulimit -n` [default: 0].
    #[arg(long, env = "RADIXGATE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// End-to-end request timeout in seconds, 0 for none [default: 1800].
    #[arg(long, env = "RADIXGATE_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,
    /// Seconds shutdown waits for in-flight requests; a second SIGTERM or
    /// Ctrl-C stops waiting [default: 30].
    #[arg(long, env = "RADIXGATE_SHUTDOWN_GRACE_PERIOD_SECS")]
    pub shutdown_grace_period_secs: Option<u64>,
    /// Serving threads, each its own event loop; 0 = one per CPU [default: 0].
    #[arg(long, env = "RADIXGATE_THREADS")]
    pub threads: Option<usize>,
    /// Key clients must send as `Authorization: Bearer <key>` (the scheme
    /// in any case); unset = the client API is open. Must not be empty.
    #[arg(long, env = "RADIXGATE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// YAML or JSON file listing named API keys (tenants), each with
    /// optional requests/tokens per minute and a priority (high, normal,
    /// low); see examples/radixgate.yaml [config: tenants.api_key_file].
    #[arg(long, env = "RADIXGATE_API_KEY_FILE", value_name = "PATH")]
    pub api_key_file: Option<PathBuf>,
    /// Key for the admin plane (/workers, /flush_cache, /dashboard), from any
    /// address; a browser gives it as the /dashboard password. The client
    /// key (--api-key) never opens it. Unset: --admin-access decides who
    /// may, without a key.
    #[arg(long, env = "RADIXGATE_ADMIN_API_KEY", hide_env_values = true)]
    pub admin_api_key: Option<String>,
    /// Who may use the admin plane when --admin-api-key is unset: `loopback`
    /// = peers at 127.0.0.0/8 or ::1 only, no key asked; `off` = nobody
    /// (403). Ignored when --admin-api-key is set [default: loopback].
    #[arg(long, env = "RADIXGATE_ADMIN_ACCESS", value_parser = ["loopback", "off"])]
    pub admin_access: Option<String>,
    /// Key for /metrics, on the main port and on --prometheus-port; unset =
    /// /metrics is open (as Prometheus scrapers usually expect).
    #[arg(long, env = "RADIXGATE_METRICS_API_KEY", hide_env_values = true)]
    pub metrics_api_key: Option<String>,
    /// Workers added at runtime (POST /workers) must match one entry: a CIDR
    /// or IP (10.0.0.0/8) for IP-literal URLs; a host name or `*.suffix`
    /// (*.svc.cluster.local) for named URLs, never resolved. Workers given at
    /// start-up are trusted. Comma-separated or repeated; unset = any.
    #[arg(long, num_args = 1.., env = "RADIXGATE_WORKER_ALLOWLIST", value_delimiter = ',')]
    pub worker_allowlist: Vec<String>,
    /// Web origins whose pages may call the client API from a browser
    /// (CORS): `https://chat.example.com`, or `*` for any. Comma-separated
    /// or repeated; unset = none.
    #[arg(
        long,
        num_args = 1..,
        env = "RADIXGATE_CORS_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_allowed_origins: Vec<String>,

    /// Seconds between health probes of a healthy worker [default: 10].
    #[arg(long, env = "RADIXGATE_HEALTH_CHECK_INTERVAL_SECS")]
    pub health_check_interval_secs: Option<u64>,
    /// Seconds before a health probe fails [default: 5].
    #[arg(long, env = "RADIXGATE_HEALTH_CHECK_TIMEOUT_SECS")]
    pub health_check_timeout_secs: Option<u64>,
    /// Path probed on each worker [default: /health].
    #[arg(long, env = "RADIXGATE_HEALTH_CHECK_ENDPOINT")]
    pub health_check_endpoint: Option<String>,
    /// Consecutive failed probes that mark a worker unhealthy [default: 3].
    #[arg(long, env = "RADIXGATE_HEALTH_FAILURE_THRESHOLD")]
    pub health_failure_threshold: Option<u32>,
    /// Consecutive good probes that mark it healthy again [default: 2].
    #[arg(long, env = "RADIXGATE_HEALTH_SUCCESS_THRESHOLD")]
    pub health_success_threshold: Option<u32>,
    /// Do not probe workers; treat every worker as healthy.
    #[arg(long, env = "RADIXGATE_DISABLE_HEALTH_CHECK", value_parser = BoolishValueParser::new())]
    pub disable_health_check: bool,

    /// Retries on another worker after a failed attempt [default: 3].
    #[arg(long, env = "RADIXGATE_RETRY_MAX_RETRIES")]
    pub retry_max_retries: Option<u32>,
    /// First retry back-off in ms [default: 50].
    #[arg(long, env = "RADIXGATE_RETRY_INITIAL_BACKOFF_MS")]
    pub retry_initial_backoff_ms: Option<u64>,
    /// Largest retry back-off in ms [default: 2000].
    #[arg(long, env = "RADIXGATE_RETRY_MAX_BACKOFF_MS")]
    pub retry_max_backoff_ms: Option<u64>,
    /// Back-off growth per retry [default: 1.5].
    #[arg(long, env = "RADIXGATE_RETRY_BACKOFF_MULTIPLIER")]
    pub retry_backoff_multiplier: Option<f64>,
    /// Random spread of each back-off, 0..=1 [default: 0.2].
    #[arg(long, env = "RADIXGATE_RETRY_JITTER_FACTOR")]
    pub retry_jitter_factor: Option<f64>,
    /// Seconds a streamed attempt may wait for the worker's head and first
    /// chunk before it is retried elsewhere, 0 for none [default: 60].
    #[arg(long, env = "RADIXGATE_FIRST_BYTE_TIMEOUT_SECS")]
    pub first_byte_timeout_secs: Option<u64>,
    /// The same for a non-streamed attempt (its whole answer), 0 for none
    /// [default: 300].
    #[arg(long, env = "RADIXGATE_NON_STREAM_TIMEOUT_SECS")]
    pub non_stream_timeout_secs: Option<u64>,
    /// Seconds a started response may stay silent before it ends with an
    /// error, 0 for none [default: 60].
    #[arg(long, env = "RADIXGATE_STALL_TIMEOUT_SECS")]
    pub stall_timeout_secs: Option<u64>,
    /// The longest wait a worker's 429 or 503 `Retry-After` passes it over
    /// for, in seconds, 0 to ignore it [default: 60].
    #[arg(long, env = "RADIXGATE_RETRY_MAX_RETRY_AFTER_SECS")]
    pub retry_max_retry_after_secs: Option<u64>,
    /// Retries in all, as a percentage of the requests of the last 10 s,
    /// 0 for no budget [default: 50].
    #[arg(long, env = "RADIXGATE_RETRY_BUDGET_PERCENT")]
    pub retry_budget_percent: Option<u32>,
    /// Retries a second the budget always allows [default: 10].
    #[arg(long, env = "RADIXGATE_RETRY_BUDGET_MIN_PER_SEC")]
    pub retry_budget_min_per_sec: Option<u32>,
    /// Never retry (the same as --retry-max-retries 0).
    #[arg(long, env = "RADIXGATE_DISABLE_RETRIES", value_parser = BoolishValueParser::new())]
    pub disable_retries: bool,

    /// Consecutive failures that open a worker's breaker [default: 5].
    #[arg(long, env = "RADIXGATE_CB_FAILURE_THRESHOLD")]
    pub cb_failure_threshold: Option<u32>,
    /// Half-open successes that close it [default: 2].
    #[arg(long, env = "RADIXGATE_CB_SUCCESS_THRESHOLD")]
    pub cb_success_threshold: Option<u32>,
    /// Seconds an open breaker waits before a probe request [default: 10].
    #[arg(long, env = "RADIXGATE_CB_TIMEOUT_DURATION_SECS")]
    pub cb_timeout_duration_secs: Option<u64>,
    /// Do not use circuit breakers.
    #[arg(long, env = "RADIXGATE_DISABLE_CIRCUIT_BREAKER", value_parser = BoolishValueParser::new())]
    pub disable_circuit_breaker: bool,

    /// Seconds between outlier evaluations [default: 10].
    #[arg(long, env = "RADIXGATE_OUTLIER_INTERVAL_SECS")]
    pub outlier_interval_secs: Option<u64>,
    /// Eject a worker slower than this times its peers' median, > 1 [default: 5].
    #[arg(long, env = "RADIXGATE_OUTLIER_LATENCY_FACTOR")]
    pub outlier_latency_factor: Option<f64>,
    /// ... and slower by at least this many ms [default: 1000].
    #[arg(long, env = "RADIXGATE_OUTLIER_MIN_GAP_MS")]
    pub outlier_min_gap_ms: Option<u64>,
    /// Samples a worker needs before it is judged [default: 20].
    #[arg(long, env = "RADIXGATE_OUTLIER_MIN_SAMPLES")]
    pub outlier_min_samples: Option<u32>,
    /// Seconds of a first ejection; the n-th lasts n times [default: 30].
    #[arg(long, env = "RADIXGATE_OUTLIER_BASE_EJECTION_SECS")]
    pub outlier_base_ejection_secs: Option<u64>,
    /// Longest ejection in seconds [default: 300].
    #[arg(long, env = "RADIXGATE_OUTLIER_MAX_EJECTION_SECS")]
    pub outlier_max_ejection_secs: Option<u64>,
    /// Most of the pool ejected at once, in percent; one may always be [default: 10].
    #[arg(long, env = "RADIXGATE_OUTLIER_MAX_EJECTION_PERCENT")]
    pub outlier_max_ejection_percent: Option<u32>,
    /// Do not eject slow workers.
    #[arg(long, env = "RADIXGATE_DISABLE_OUTLIER_DETECTION", value_parser = BoolishValueParser::new())]
    pub disable_outlier_detection: bool,

    /// Requests in flight at once; -1 for no limit [default: -1].
    #[arg(
        long,
        env = "RADIXGATE_MAX_CONCURRENT_REQUESTS",
        allow_negative_numbers = true
    )]
    pub max_concurrent_requests: Option<i64>,
    /// Requests that may wait for a slot [default: 100].
    #[arg(long, env = "RADIXGATE_QUEUE_SIZE")]
    pub queue_size: Option<usize>,
    /// Seconds a request may wait for a slot, 0 = no limit (the request
    /// timeout still ends the wait) [default: 60].
    #[arg(long, env = "RADIXGATE_QUEUE_TIMEOUT_SECS")]
    pub queue_timeout_secs: Option<u64>,

    /// Stored Responses API responses whose maker is kept, least recently
    /// used out; 0 keeps none [default: 100000].
    #[arg(long, env = "RADIXGATE_RESPONSES_MAX_IDS")]
    pub responses_max_ids: Option<usize>,
    /// Seconds a stored response's maker is kept after its last use
    /// [default: 86400].
    #[arg(long, env = "RADIXGATE_RESPONSES_MAX_AGE_SECS")]
    pub responses_max_age_secs: Option<u64>,

    /// Extra port that serves /metrics and the probes (/liveness,
    /// /readiness, /health), apart from the client port's connection cap.
    #[arg(long, env = "RADIXGATE_PROMETHEUS_PORT")]
    pub prometheus_port: Option<u16>,
    /// Address for --prometheus-port [default: the server's host].
    #[arg(long, env = "RADIXGATE_PROMETHEUS_HOST")]
    pub prometheus_host: Option<String>,

    /// Log filter: a level (error, warn, info, debug, trace; SGLang's
    /// warning and critical too) or TARGET=LEVEL directives, e.g.
    /// `radixgate=debug,info` [default: info].
    #[arg(long, env = "RADIXGATE_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// Log one JSON object per line.
    #[arg(long, env = "RADIXGATE_LOG_JSON", value_parser = BoolishValueParser::new())]
    pub log_json: bool,

    /// Client headers a request id is taken from, first valid one wins
    /// (comma-separated, or repeat the flag); without one the router makes
    /// one. It reaches the worker and the client as x-request-id
    /// [default: x-request-id,x-correlation-id,x-trace-id,request-id].
    #[arg(
        long,
        num_args = 1..,
        env = "RADIXGATE_REQUEST_ID_HEADERS",
        value_delimiter = ','
    )]
    pub request_id_headers: Vec<String>,
    /// Export spans to this OpenTelemetry collector over OTLP/HTTP, e.g.
    /// http://127.0.0.1:4318 (/v1/traces is added to a URL without a
    /// path); unset = no export.
    #[arg(long, env = "RADIXGATE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// The service.name of exported spans [default: radixgate].
    #[arg(long, env = "RADIXGATE_OTLP_SERVICE_NAME", value_name = "NAME")]
    pub otlp_service_name: Option<String>,

    /// Replica sync over NATS.
    #[command(flatten)]
    pub sync: SyncArgs,

    /// Subscribe to the workers' KV-cache event streams (SGLang, vLLM
    /// `--kv-events-config`) and route on what they really hold.
    #[arg(long, env = "RADIXGATE_KV_EVENTS", value_parser = BoolishValueParser::new())]
    pub kv_events: bool,
    /// The event publishers' port on each worker's host [default: 5557];
    /// data-parallel rank r publishes on this port + r.
    #[arg(long, env = "RADIXGATE_KV_EVENTS_PORT")]
    pub kv_events_port: Option<u16>,
    /// The engines' event replay port, if they run one; rank r on this + r.
    #[arg(long, env = "RADIXGATE_KV_EVENTS_REPLAY_PORT")]
    pub kv_events_replay_port: Option<u16>,
    /// Topic prefix to subscribe to [default: all].
    #[arg(long, env = "RADIXGATE_KV_EVENTS_TOPIC")]
    pub kv_events_topic: Option<String>,
    /// Data-parallel ranks per worker [default: 1].
    #[arg(long, env = "RADIXGATE_KV_EVENTS_DP_SIZE")]
    pub kv_events_dp_size: Option<u32>,
    /// Whose chat-prompt rules requests are tokenized by [default: vllm].
    #[arg(long, value_enum, env = "RADIXGATE_KV_EVENTS_ENGINE")]
    pub kv_events_engine: Option<super::EngineRules>,
    /// The model's tokenizer.json, or its model directory (with
    /// tokenizer_config.json for the chat template), for matching requests
    /// against KV events.
    #[arg(long, env = "RADIXGATE_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,
    /// The models whose requests --tokenizer reads (comma-separated, or
    /// repeat the flag) [default: every model's]; another model's are
    /// routed on the approximate tree.
    #[arg(
        long,
        num_args = 1..,
        env = "RADIXGATE_KV_EVENTS_TOKENIZER_MODELS",
        value_delimiter = ','
    )]
    pub kv_events_tokenizer_models: Vec<String>,

    /// Record every routed request to this file, one JSON line each in the
    /// Mooncake trace shape (no prompt text), for `radixgate simulate
    /// --trace` and `radixgate tune --trace`; rotation in `record_trace:`
    /// of the config file. Also switchable at runtime: /record_trace.
    #[arg(long, env = "RADIXGATE_RECORD_TRACE", value_name = "FILE")]
    pub record_trace: Option<PathBuf>,
}

/// The `--sync-*` flags: sharing routing state between router replicas.
#[derive(Clone, Debug, Default, Args)]
pub struct SyncArgs {
    /// NATS server to share routing state with other router replicas,
    /// nats://HOST:PORT or tls://HOST:PORT; repeat for a NATS cluster.
    /// Without it, sync is off.
    #[arg(long = "sync-url", env = "RADIXGATE_SYNC_URL", value_delimiter = ',')]
    pub sync_url: Vec<String>,
    /// Cluster name scoping the sync subjects and stream; replicas sync
    /// only with the same name [default: radixgate].
    #[arg(long, env = "RADIXGATE_SYNC_CLUSTER", value_name = "NAME")]
    pub sync_cluster: Option<String>,
    /// This replica's name in sync messages and logs [default: random].
    #[arg(long, env = "RADIXGATE_SYNC_REPLICA_ID", value_name = "NAME")]
    pub sync_replica_id: Option<String>,
    /// Seconds a starting replica replays recent decisions before
    /// /readiness turns 200 anyway [default: 10].
    #[arg(long, env = "RADIXGATE_SYNC_WARMUP_TIMEOUT_SECS", value_name = "SECS")]
    pub sync_warmup_timeout_secs: Option<u64>,
    /// Seconds of decisions the NATS stream keeps for late replicas
    /// [default: 600].
    #[arg(long, env = "RADIXGATE_SYNC_HISTORY_SECS", value_name = "SECS")]
    pub sync_history_secs: Option<u64>,
    /// Where the NATS server keeps the stream: file (outlives a NATS
    /// restart) or memory [default: file].
    #[arg(long, value_enum, env = "RADIXGATE_SYNC_STREAM_STORAGE")]
    pub sync_stream_storage: Option<super::StreamStorage>,
    /// Refuse a NATS server without TLS.
    #[arg(long, env = "RADIXGATE_SYNC_TLS_REQUIRED", value_parser = BoolishValueParser::new())]
    pub sync_tls_required: bool,
    /// PEM CA certificates to trust for the NATS servers.
    #[arg(long, env = "RADIXGATE_SYNC_TLS_CA", value_name = "PATH")]
    pub sync_tls_ca: Option<PathBuf>,
    /// PEM client certificate for NATS (mutual TLS); needs --sync-tls-key.
    #[arg(long, env = "RADIXGATE_SYNC_TLS_CERT", value_name = "PATH")]
    pub sync_tls_cert: Option<PathBuf>,
    /// PEM key of --sync-tls-cert.
    #[arg(long, env = "RADIXGATE_SYNC_TLS_KEY", value_name = "PATH")]
    pub sync_tls_key: Option<PathBuf>,
    /// NATS token (prefer RADIXGATE_SYNC_TOKEN or --sync-token-file).
    #[arg(long, env = "RADIXGATE_SYNC_TOKEN", hide_env_values = true)]
    pub sync_token: Option<String>,
    /// File holding the NATS token.
    #[arg(long, env = "RADIXGATE_SYNC_TOKEN_FILE", value_name = "PATH")]
    pub sync_token_file: Option<PathBuf>,
    /// NATS user name, with --sync-password or --sync-password-file.
    #[arg(long, env = "RADIXGATE_SYNC_USER")]
    pub sync_user: Option<String>,
    /// NATS password (prefer RADIXGATE_SYNC_PASSWORD or a file).
    #[arg(long, env = "RADIXGATE_SYNC_PASSWORD", hide_env_values = true)]
    pub sync_password: Option<String>,
    /// File holding the NATS password.
    #[arg(long, env = "RADIXGATE_SYNC_PASSWORD_FILE", value_name = "PATH")]
    pub sync_password_file: Option<PathBuf>,
    /// File holding an nkey seed for NATS.
    #[arg(long, env = "RADIXGATE_SYNC_NKEY_SEED_FILE", value_name = "PATH")]
    pub sync_nkey_seed_file: Option<PathBuf>,
    /// NATS .creds file (JWT and nkey seed).
    #[arg(long, env = "RADIXGATE_SYNC_CREDS_FILE", value_name = "PATH")]
    pub sync_creds_file: Option<PathBuf>,
}

impl SyncArgs {
    /// Overrides `sync` with every flag that was given.
    pub fn apply(&self, sync: &mut super::SyncConfig) {
        if !self.sync_url.is_empty() {
            sync.urls = self.sync_url.clone();
        }
        set(&mut sync.cluster, &self.sync_cluster);
        if self.sync_replica_id.is_some() {
            sync.replica_id = self.sync_replica_id.clone();
        }
        set(
            &mut sync.warmup_timeout_secs,
            &self.sync_warmup_timeout_secs,
        );
        set(&mut sync.history_secs, &self.sync_history_secs);
        set(&mut sync.stream_storage, &self.sync_stream_storage);
        switch(
            &mut sync.tls.required,
            true,
            self.sync_tls_required,
            "RADIXGATE_SYNC_TLS_REQUIRED",
        );
        let some = |slot: &mut Option<PathBuf>, v: &Option<PathBuf>| {
            if v.is_some() {
                *slot = v.clone();
            }
        };
        some(&mut sync.tls.ca_file, &self.sync_tls_ca);
        some(&mut sync.tls.cert_file, &self.sync_tls_cert);
        some(&mut sync.tls.key_file, &self.sync_tls_key);
        let a = &mut sync.auth;
        if self.sync_token.is_some() {
            a.token = self.sync_token.clone();
        }
        some(&mut a.token_file, &self.sync_token_file);
        if self.sync_user.is_some() {
            a.user = self.sync_user.clone();
        }
        if self.sync_password.is_some() {
            a.password = self.sync_password.clone();
        }
        some(&mut a.password_file, &self.sync_password_file);
        some(&mut a.nkey_seed_file, &self.sync_nkey_seed_file);
        some(&mut a.creds_file, &self.sync_creds_file);
    }
}

/// The `--prefill URL [BOOTSTRAP_PORT]` occurrences, whose values clap
/// hands over as one list: a value of digits is the port of the URL before
/// it (a URL has a scheme, so the two never mix).
fn prefill_specs(values: &[String]) -> Result<Vec<WorkerSpec>, ConfigError> {
    let mut specs: Vec<WorkerSpec> = Vec::new();
    for value in values {
        if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
            let port = value.parse::<u16>().ok().filter(|p| *p > 0);
            let last = specs.last_mut().filter(|s| s.bootstrap_port.is_none());
            match (last, port) {
                (Some(spec), Some(port)) => spec.bootstrap_port = Some(port),
                (Some(spec), None) => {
                    return Err(super::invalid(
                        "workers",
                        format!(
                            "--prefill {} {value}: the bootstrap port must be between 1 and 65535",
                            spec.url
                        ),
                    ));
                }
                (None, _) => {
                    return Err(super::invalid(
                        "workers",
                        format!("--prefill {value}: a bootstrap port follows its worker's URL"),
                    ));
                }
            }
        } else {
            specs.push(WorkerSpec::new(value.clone()).with_role(WorkerRole::Prefill));
        }
    }
    Ok(specs)
}

/// The default settings of the policy called `name`.
fn policy_named(name: &str) -> Result<PolicyConfig, ConfigError> {
    PolicyConfig::named(name)
        .ok_or_else(|| super::invalid("routing.policy", format!("unknown policy `{name}`")))
}

/// Layers a switch over the file's setting `slot`: given (`on`), it sets
/// `slot` to `sets` (`true` for `--kv-events`, `false` for a `--disable-*`
/// switch). Clap reads a switch that is absent and one whose variable `var`
/// holds a false word (`0`, `no`, `false`) alike, as `on` false; a variable
/// that is set was parsed (another word stops start-up), so a set one says
/// the opposite and overrides the file too (file < environment < flags).
fn switch(slot: &mut bool, sets: bool, on: bool, var: &str) {
    if on {
        *slot = sets;
    } else if std::env::var_os(var).is_some() {
        *slot = !sets;
    }
}

fn set<T: Clone>(slot: &mut T, value: &Option<T>) {
    if let Some(value) = value {
        *slot = value.clone();
    }
}

impl ServeArgs {
    /// Builds the validated config: the file (if any), then these flags.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut config = match &self.config {
            Some(path) => Config::from_yaml_file(path)?,
            None => Config::default(),
        };
        self.apply(&mut config)?;
        config.read_worker_keys()?;
        config.validate()?;
        Ok(config)
    }

    /// Overrides `config` with every flag that was given.
    pub fn apply(&self, config: &mut Config) -> Result<(), ConfigError> {
        if !self.worker_urls.is_empty() {
            // The variable is split at commas by clap; spaces, as the
            // flag takes them, are split here.
            let urls: Vec<&str> = (self.worker_urls.iter())
                .flat_map(|u| u.split_whitespace())
                .collect();
            if urls.is_empty() {
                return Err(super::invalid(
                    "workers",
                    "--worker-urls (RADIXGATE_WORKER_URLS) is given but names no URL",
                ));
            }
            config.workers.retain(|w| w.role != WorkerRole::Regular);
            (config.workers).extend(urls.into_iter().map(WorkerSpec::new));
        }
        self.apply_pd(config)?;
        self.apply_routing(&mut config.routing)?;
        self.apply_discovery(&mut config.discovery)?;
        self.sync.apply(&mut config.sync);
        let k = &mut config.kv_events;
        switch(&mut k.enabled, true, self.kv_events, "RADIXGATE_KV_EVENTS");
        set(&mut k.port, &self.kv_events_port);
        if self.kv_events_replay_port.is_some() {
            k.replay_port = self.kv_events_replay_port;
        }
        set(&mut k.topic, &self.kv_events_topic);
        set(&mut k.data_parallel_size, &self.kv_events_dp_size);
        set(&mut k.engine, &self.kv_events_engine);
        if !self.kv_events_tokenizer_models.is_empty() {
            k.tokenizer_models = self.kv_events_tokenizer_models.clone();
        }
        if self.tokenizer.is_some() {
            k.tokenizer = self.tokenizer.clone();
        }
        if self.record_trace.is_some() {
            config.record_trace.path = self.record_trace.clone();
        }
        let s = &mut config.server;
        set(&mut s.host, &self.host);
        set(&mut s.port, &self.port);
        set(&mut s.max_payload_size, &self.max_payload_size);
        set(&mut s.body_read_timeout_secs, &self.body_read_timeout_secs);
        set(
            &mut s.max_buffered_body_bytes,
            &self.max_buffered_body_bytes,
        );
        set(
            &mut s.header_read_timeout_secs,
            &self.header_read_timeout_secs,
        );
        set(&mut s.idle_timeout_secs, &self.idle_timeout_secs);
        set(
            &mut s.client_write_timeout_secs,
            &self.client_write_timeout_secs,
        );
        set(&mut s.max_connections, &self.max_connections);
        set(&mut s.threads, &self.threads);
        set(&mut s.request_timeout_secs, &self.request_timeout_secs);
        set(&mut s.drain_timeout_secs, &self.drain_timeout_secs);
        set(&mut s.shutdown_delay_secs, &self.shutdown_delay_secs);
        set(
            &mut s.shutdown_grace_period_secs,
            &self.shutdown_grace_period_secs,
        );
        if self.api_key.is_some() {
            s.api_key = self.api_key.clone();
        }
        if self.admin_api_key.is_some() {
            s.admin_api_key = self.admin_api_key.clone();
        }
        if self.api_key_file.is_some() {
            config.tenants.api_key_file = self.api_key_file.clone();
        }
        match self.admin_access.as_deref() {
            None => {}
            Some("off") => s.admin_access = super::AdminAccess::Off,
            Some(_) => s.admin_access = super::AdminAccess::Loopback,
        }
        if self.metrics_api_key.is_some() {
            s.metrics_api_key = self.metrics_api_key.clone();
        }
        if !self.cors_allowed_origins.is_empty() {
            s.cors_allowed_origins = self.cors_allowed_origins.clone();
        }
        if !self.worker_allowlist.is_empty() {
            s.worker_allowlist = self.worker_allowlist.clone();
        }

        let h = &mut config.health;
        set(&mut h.interval_secs, &self.health_check_interval_secs);
        set(&mut h.timeout_secs, &self.health_check_timeout_secs);
        set(&mut h.endpoint, &self.health_check_endpoint);
        set(&mut h.failure_threshold, &self.health_failure_threshold);
        set(&mut h.success_threshold, &self.health_success_threshold);
        switch(
            &mut h.enabled,
            false,
            self.disable_health_check,
            "RADIXGATE_DISABLE_HEALTH_CHECK",
        );

        let r = &mut config.retry;
        set(&mut r.max_retries, &self.retry_max_retries);
        set(&mut r.initial_backoff_ms, &self.retry_initial_backoff_ms);
        set(&mut r.max_backoff_ms, &self.retry_max_backoff_ms);
        set(&mut r.backoff_multiplier, &self.retry_backoff_multiplier);
        set(&mut r.jitter_factor, &self.retry_jitter_factor);
        set(
            &mut r.first_byte_timeout_secs,
            &self.first_byte_timeout_secs,
        );
        set(
            &mut r.non_stream_timeout_secs,
            &self.non_stream_timeout_secs,
        );
        set(&mut r.stall_timeout_secs, &self.stall_timeout_secs);
        set(
            &mut r.max_retry_after_secs,
            &self.retry_max_retry_after_secs,
        );
        set(&mut r.budget_percent, &self.retry_budget_percent);
        set(&mut r.budget_min_per_sec, &self.retry_budget_min_per_sec);
        // Checked here, not by clap: clap takes a variable for its flag,
        // so `RADIXGATE_DISABLE_RETRIES=false` conflicted with any
        // `--retry-max-retries`, naming a flag nobody gave.
        if self.disable_retries {
            if let Some(n) = self.retry_max_retries.filter(|n| *n > 0) {
                return Err(super::invalid(
                    "retry.max_retries",
                    format!(
                        "--disable-retries (RADIXGATE_DISABLE_RETRIES) and --retry-max-retries \
                         {n} (RADIXGATE_RETRY_MAX_RETRIES) contradict each other: give one"
                    ),
                ));
            }
            r.max_retries = 0;
        }

        let o = &mut config.outlier_detection;
        set(&mut o.interval_secs, &self.outlier_interval_secs);
        set(&mut o.latency_factor, &self.outlier_latency_factor);
        set(&mut o.min_gap_ms, &self.outlier_min_gap_ms);
        set(&mut o.min_samples, &self.outlier_min_samples);
        set(&mut o.base_ejection_secs, &self.outlier_base_ejection_secs);
        set(&mut o.max_ejection_secs, &self.outlier_max_ejection_secs);
        set(
            &mut o.max_ejection_percent,
            &self.outlier_max_ejection_percent,
        );
        switch(
            &mut o.enabled,
            false,
            self.disable_outlier_detection,
            "RADIXGATE_DISABLE_OUTLIER_DETECTION",
        );

        let b = &mut config.circuit_breaker;
        set(&mut b.failure_threshold, &self.cb_failure_threshold);
        set(&mut b.success_threshold, &self.cb_success_threshold);
        set(&mut b.timeout_duration_secs, &self.cb_timeout_duration_secs);
        switch(
            &mut b.enabled,
            false,
            self.disable_circuit_breaker,
            "RADIXGATE_DISABLE_CIRCUIT_BREAKER",
        );

        let a = &mut config.admission;
        match self.max_concurrent_requests {
            None => {}
            Some(-1) => a.max_concurrent_requests = None,
            Some(n) => {
                a.max_concurrent_requests = Some(usize::try_from(n).map_err(|_| {
                    super::invalid(
                        "admission.max_concurrent_requests",
                        "must be -1 or at least 1",
                    )
                })?);
            }
        }
        set(&mut a.queue_size, &self.queue_size);
        set(&mut a.queue_timeout_secs, &self.queue_timeout_secs);

        let r = &mut config.responses;
        set(&mut r.max_ids, &self.responses_max_ids);
        set(&mut r.max_age_secs, &self.responses_max_age_secs);

        if self.prometheus_port.is_some() {
            config.metrics.prometheus_port = self.prometheus_port;
        }
        if self.prometheus_host.is_some() {
            config.metrics.prometheus_host = self.prometheus_host.clone();
        }
        set(&mut config.log.level, &self.log_level);
        switch(
            &mut config.log.json,
            true,
            self.log_json,
            "RADIXGATE_LOG_JSON",
        );
        let t = &mut config.tracing;
        if !self.request_id_headers.is_empty() {
            t.request_id_headers = self.request_id_headers.clone();
        }
        if self.otlp_endpoint.is_some() {
            t.otlp_endpoint = self.otlp_endpoint.clone();
        }
        set(&mut t.service_name, &self.otlp_service_name);
        Ok(())
    }

    fn apply_discovery(&self, d: &mut super::DiscoveryConfig) -> Result<(), ConfigError> {
        switch(
            &mut d.enabled,
            true,
            self.service_discovery,
            "RADIXGATE_SERVICE_DISCOVERY",
        );
        if !self.selector.is_empty() {
            d.selector = self
                .selector
                .iter()
                .map(|s| super::discovery::parse_label("discovery.selector", "--selector", s))
                .collect::<Result<_, _>>()?;
        }
        if self.service_discovery_namespace.is_some() {
            d.namespace = self.service_discovery_namespace.clone();
        }
        set(&mut d.port, &self.service_discovery_port);
        if self.service_discovery_port_annotation.is_some() {
            d.port_annotation = self.service_discovery_port_annotation.clone();
        }
        if let Some(from) = &self.model_id_from {
            d.model_id_from = Some(
                from.parse()
                    .map_err(|reason| super::invalid("discovery.model_id_from", reason))?,
            );
        }
        if self.kubeconfig.is_some() {
            d.kubeconfig = self.kubeconfig.clone();
        }
        set(
            &mut d.bootstrap_port_annotation,
            &self.bootstrap_port_annotation,
        );
        for (role, flag, labels) in [
            (
                WorkerRole::Prefill,
                "--prefill-selector",
                &self.prefill_selector,
            ),
            (
                WorkerRole::Decode,
                "--decode-selector",
                &self.decode_selector,
            ),
        ] {
            if labels.is_empty() {
                continue;
            }
            let selector = labels
                .iter()
                .map(|s| super::discovery::parse_label("discovery.pools", flag, s))
                .collect::<Result<_, _>>()?;
            d.pools.retain(|p| p.role != role);
            d.pools.push(super::PoolConfig {
                selector,
                role,
                ..super::PoolConfig::default()
            });
        }
        Ok(())
    }

    /// The disaggregation flags: `--prefill`/`--decode` replace the file's
    /// workers of that role (as `--worker-urls` replaces the regular ones).
    fn apply_pd(&self, config: &mut Config) -> Result<(), ConfigError> {
        let pd = &mut config.pd;
        switch(
            &mut pd.enabled,
            true,
            self.pd_disaggregation,
            "RADIXGATE_PD_DISAGGREGATION",
        );
        set(&mut pd.protocol, &self.pd_protocol);
        set(
            &mut pd.skip_prefill_max_uncached_tokens,
            &self.pd_skip_prefill_tokens,
        );
        if let Some(name) = &self.decode_policy
            && name != pd.decode_policy.name()
        {
            pd.decode_policy = PolicyConfig::named(name).ok_or_else(|| {
                super::invalid("pd.decode_policy", format!("unknown policy `{name}`"))
            })?;
        }
        if !self.prefill.is_empty() {
            let prefill = prefill_specs(&self.prefill)?;
            config.workers.retain(|w| w.role != WorkerRole::Prefill);
            config.workers.extend(prefill);
        }
        if !self.decode.is_empty() {
            config.workers.retain(|w| w.role != WorkerRole::Decode);
            config.workers.extend(
                self.decode
                    .iter()
                    .map(|url| WorkerSpec::new(url.clone()).with_role(WorkerRole::Decode)),
            );
        }
        Ok(())
    }

    fn apply_routing(&self, routing: &mut PolicyConfig) -> Result<(), ConfigError> {
        // Two names of one setting; given both (a flag and the other's
        // variable, say), they must agree.
        if let (Some(policy), Some(prefill)) = (&self.policy, &self.prefill_policy)
            && policy != prefill
        {
            return Err(super::invalid(
                "routing.policy",
                format!(
                    "--policy {policy} (RADIXGATE_POLICY) and --prefill-policy {prefill} \
                     (RADIXGATE_PREFILL_POLICY) are the same setting and disagree: give one"
                ),
            ));
        }
        let policy = self.policy.as_ref().or(self.prefill_policy.as_ref());
        if let Some(name) = policy
            && name != routing.name()
        {
            *routing = policy_named(name)?;
        }
        let tuning = [
            ("--cache-threshold", self.cache_threshold.is_some()),
            (
                "--balance-abs-threshold",
                self.balance_abs_threshold.is_some(),
            ),
            (
                "--balance-rel-threshold",
                self.balance_rel_threshold.is_some(),
            ),
            (
                "--eviction-interval-secs",
                self.eviction_interval_secs.is_some(),
            ),
            ("--max-tree-size", self.max_tree_size.is_some()),
            (
                "--max-routing-text-chars",
                self.max_routing_text_chars.is_some(),
            ),
        ];
        match routing {
            PolicyConfig::CacheAware(c) => {
                set(&mut c.cache_threshold, &self.cache_threshold);
                set(&mut c.balance_abs_threshold, &self.balance_abs_threshold);
                set(&mut c.balance_rel_threshold, &self.balance_rel_threshold);
                set(&mut c.eviction_interval_secs, &self.eviction_interval_secs);
                set(&mut c.max_tree_size, &self.max_tree_size);
                set(&mut c.max_routing_text_chars, &self.max_routing_text_chars);
            }
            PolicyConfig::PrefillAware(c)
                if self.cache_threshold.is_none()
                    && self.balance_abs_threshold.is_none()
                    && self.balance_rel_threshold.is_none() =>
            {
                set(&mut c.eviction_interval_secs, &self.eviction_interval_secs);
                set(&mut c.max_tree_size, &self.max_tree_size);
                set(&mut c.max_routing_text_chars, &self.max_routing_text_chars);
            }
            other => {
                if let Some((flag, _)) = tuning.iter().find(|(_, given)| *given) {
                    return Err(super::invalid(
                        "routing.policy",
                        format!("{flag} applies only to cache_aware, not {}", other.name()),
                    ));
                }
            }
        }
        Ok(())
    }
}
