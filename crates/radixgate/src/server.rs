//! Building and running a gateway: routes, background tasks, shutdown.
//!
//! [`run`] takes an already-bound listener (tests bind port 0) and a
//! cancellation token. Requests are served by `server.threads` threads,
//! each a single-threaded tokio runtime accepting on its own handle of the
//! listening socket and keeping its own pool of worker connections, so a
//! request is read, routed, forwarded and answered on one thread. Measured
//! side by side with one multi-threaded runtime on a 2-core box, this
//! spent 10-30% less CPU per request, depending on the request rate
//! (cross-thread wake-ups are gone). Shared state is all `Arc`s and locks that are never
//! held across an `.await`, so threads only meet in the routing tree, the
//! admission semaphore and the metrics.
//!
//! Client connections are accepted by [`crate::listen`], which holds them
//! to a header-read and an idle timeout and caps them over all threads.
//!
//! Start-up: the serving threads start accepting once every configured
//! worker is admitted or has failed a probe (bounded, see
//! [`first_probes`]), so that a router restarted under load does not
//! answer its first requests 503 while its probes of workers that were up
//! all along pass; connections made meanwhile wait in the listen backlog,
//! and `/readiness` (which the metrics port serves already) answers 503
//! `starting` until then, so that a load balancer sends none yet.
//!
//! Shutdown: `/readiness` answers 503 at once, and every HTTP/1 answer
//! closes its connection (`crate::listen`); after
//! `server.shutdown_delay_secs` (0 by default), time for load balancers
//! such as Kubernetes endpoints to stop sending new connections, every
//! thread stops accepting; in-flight requests
//! (streams included) get up to `shutdown_grace_period_secs` to finish,
//! then each remaining stream ends with an error event saying so and each
//! request not answered yet (queued for admission, or waiting for its
//! worker's answer: a non-streamed one being generated, a stream before
//! its first token) gets 503 `shutting_down` (up to a second to send
//! them), and the remaining connections are dropped with
//! their runtimes — which drops their bodies and so releases their load. The
//! metrics port (`metrics.prometheus_port`, which serves the probes too,
//! apart from the client connections' cap) accepts until then, and the
//! background tasks (health checks, the control task, metrics upkeep,
//! replica sync, reloads) run until then too. The embedder may cut the
//! shutdown short (the binary does on a second SIGTERM or Ctrl-C): the
//! delay and the grace period then end at once, streams get their error
//! event and queued requests their 503 as above.

use crate::admission::Admission;
use crate::allowlist::Allowlist;
use crate::auth::{Keys, RequireTenant};
use crate::body::{BodyBudget, BodyLimits};
use crate::breaker::Breakers;
use crate::config::Config;
use crate::error::GatewayError;
use crate::inspect::Api;
use crate::listen::{self, ConnectionLimits, ConnectionSlots};
use crate::metrics::Metrics;
use crate::proxy::{Endpoint, RequestMetrics};
use crate::reload::{self, Reloads};
use crate::state::{AppState, Shared};
use crate::tenants::TenantMetrics;
use crate::{admin, control, info, proxy, upkeep, upstream};
use axum::Router;
use axum::extract::{Request, State};
use axum::routing::{get, post};
use radixgate_routing::{Registry, spawn_eviction};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long streams cut at the end of the grace period get to send their
/// error event (and queued requests their 503) before their connections
/// are dropped.
const ABORT_FLUSH: Duration = Duration::from_secs(1);

/// Where the worker clients' trusted CA certificates come from, for a
/// start-up error: a client that loads none cannot be built, even for
/// `http://` workers, and the loader's own words ("No CA certificates were
/// loaded from the system") name neither variable that replaces the
/// system's store.
fn trust_sources() -> String {
    let var = |name: &str| match std::env::var_os(name) {
        Some(value) => format!("{name}={}", value.to_string_lossy()),
        None => format!("{name} unset"),
    };
    format!(
        "trusted CA certificates come from {} and {} when either is set, else from the \
         system's store",
        var("SSL_CERT_FILE"),
        var("SSL_CERT_DIR")
    )
}

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The worker client could not be built (most likely: no trusted CA
    /// certificate could be loaded, whose sources the message names).
    #[error("cannot build the HTTP client: {0} ({sources})", sources = trust_sources())]
    Client(#[from] reqwest::Error),
    /// The forwarding client's TLS set-up failed.
    #[error("cannot set up TLS for the worker client: {0} ({sources})", sources = trust_sources())]
    Tls(#[from] rustls::Error),
    /// A configured worker was rejected.
    #[error("worker rejected: {0}")]
    Worker(#[from] GatewayError),
    /// Kubernetes discovery could not start.
    #[cfg(feature = "kubernetes")]
    #[error(transparent)]
    Discovery(#[from] crate::discovery::DiscoveryError),
    /// `kv_events.tokenizer` could not be loaded.
    #[error("cannot load the tokenizer `kv_events.tokenizer` ({}): {source}", path.display())]
    Tokenizer {
        /// The path given.
        path: std::path::PathBuf,
        /// Why it failed.
        source: radixgate_tokenize::TokenizeError,
    },
    /// The trace recording (`record_trace.path`) could not start.
    #[error(transparent)]
    Record(#[from] crate::record::RecordError),
    /// A listener failed.
    #[error("listener error: {0}")]
    Io(#[from] std::io::Error),
    /// The separate metrics port could not be bound.
    #[error(
        "cannot listen on {host}:{port} for metrics.prometheus_port (--prometheus-port, \
         --prometheus-host): {source}"
    )]
    MetricsListen {
        /// The address asked for.
        host: String,
        /// The port asked for.
        port: u16,
        /// Why it failed.
        source: std::io::Error,
    },
}

fn forwarded(endpoint: Endpoint) -> axum::routing::MethodRouter<Arc<AppState>> {
    post(move |State(state): State<Arc<AppState>>, req: Request| proxy::serve(state, endpoint, req))
}

/// The handler of the requests about a stored Responses API response by
/// its id, sent to the worker that made it (`crate::responses`).
async fn stored_response(
    State(state): State<Arc<AppState>>,
    req: Request,
) -> axum::response::Response {
    proxy::serve(state, Endpoint::StoredResponse, req).await
}

/// The inference APIs, routed by their routing text.
const ROUTED: [Api; 6] = [
    Api::ChatCompletions,
    Api::Completions,
    Api::Generate,
    Api::Embeddings,
    Api::Responses,
    Api::Messages,
];

/// Endpoints whose bodies say nothing about any worker's cache, passed to
/// the least-loaded worker of their model (vLLM's and SGLang's paths; vLLM
/// serves classification and pooling outside `/v1`, SGLang under it, where
/// any `/v1` POST is passed on).
const BY_LOAD: [&str; 9] = [
    "/v1/rerank",
    "/rerank",
    "/v2/rerank",
    "/v1/score",
    "/score",
    "/classify",
    "/pooling",
    "/tokenize",
    "/detokenize",
];

/// The HTTP routes of a gateway, in three groups: the client API (behind
/// `server.api_key`), the admin plane (behind its own gate, see
/// [`admin`]; the client key never opens it) and the open endpoints
/// (probes, and `/metrics`, which checks `server.metrics_api_key` itself).
/// The client API is the inference APIs, the endpoints routed by load, the
/// stored responses of the Responses API (by id, to the worker that made
/// them), and any other `POST /v1/...`, forwarded unrouted (see
/// [`Endpoint`]). A known
/// path with a wrong method is a 405 with an `Allow` header and an
/// OpenAI-style body.
fn routes(state: Arc<AppState>) -> Router {
    let mut api = Router::<Arc<AppState>>::new();
    for inference in ROUTED {
        api = api.route(inference.path(), forwarded(Endpoint::Routed(inference)));
    }
    for path in BY_LOAD {
        api = api.route(path, forwarded(Endpoint::ByLoad(path)));
    }
    let api = api
        .route("/v1/{*rest}", forwarded(Endpoint::Unrouted))
        // A stored response, at the worker that made it; a POST beside
        // it (`/v1/responses/input_tokens`) is any other `/v1` POST.
        .route(
            "/v1/responses/{id}",
            get(stored_response)
                .delete(stored_response)
                .merge(forwarded(Endpoint::Unrouted)),
        )
        .route("/v1/responses/{id}/cancel", post(stored_response))
        .route("/v1/responses/{id}/input_items", get(stored_response))
        .route("/v1/models", get(info::models))
        // A model by its id; a POST below it is still any other `/v1` POST.
        .route(
            "/v1/models/{*id}",
            get(info::model).merge(forwarded(Endpoint::Unrouted)),
        )
        .route("/get_server_info", get(info::server_info))
        .route("/get_model_info", get(info::model_info))
        .route("/get_loads", get(info::loads))
        .route_layer(RequireTenant::new(&state.shared, forwarded_route));

    let admin = admin::router(&state.shared);
    let open = open_routes();

    let routes = api
        .merge(admin)
        .merge(open)
        .fallback(|req: Request| async move {
            let err = GatewayError::NotFound {
                method: req.method().to_string(),
                path: req.uri().path().to_owned(),
            };
            crate::error::refused_unread(&req, err)
        })
        .method_not_allowed_fallback(method_not_allowed);
    // Pages of the allowed origins may call the client API, and only it
    // (`crate::cors`): a preflight is answered before the key is asked,
    // and before the 405 its route would give an `OPTIONS`.
    let routes = match crate::cors::Cors::new(
        &state.shared.config.server.cors_allowed_origins,
        is_client_api,
    ) {
        Some(cors) => routes.layer(axum::middleware::from_fn_with_state(
            cors,
            crate::cors::layer,
        )),
        None => routes,
    };
    routes
        // A request that has been here before is refused first, whatever
        // its route (`crate::via`).
        .layer(crate::via::RefuseLoops::new(&state.shared, forwarded_route))
        // Every answer, the router's own errors included, carries the
        // request's id; every request runs in its spans.
        .layer(crate::trace::request_id::IdentifyRequests::new(
            crate::trace::request_id::RequestIds::new(state.shared.config.tracing.header_names()),
        ))
        .with_state(state)
}

/// The route label (`Endpoint::label`) a request to the client API's
/// `path` with `method` is counted under, if its route forwards it: the
/// path of an inference API or of an endpoint routed by load, or the
/// unrouted `/v1/*` for any other `/v1` path but the model list's, or the
/// requests about a stored response's (which the request path counts
/// under their own label, whatever their method). A label from a fixed
/// set, whatever the path. The information routes (GET) are not counted.
fn forwarded_route(method: &axum::http::Method, path: &str) -> Option<&'static str> {
    if is_stored_response(method, path) {
        return Some(Endpoint::StoredResponse.label());
    }
    if method != axum::http::Method::POST {
        return None;
    }
    let routed = ROUTED.iter().map(|api| Endpoint::Routed(*api));
    let by_load = BY_LOAD.iter().map(|path| Endpoint::ByLoad(path));
    let endpoint = routed
        .chain(by_load)
        .find(|endpoint| endpoint.label() == path)
        .or_else(|| {
            (path.starts_with("/v1/") && path != "/v1/models").then_some(Endpoint::Unrouted)
        })?;
    Some(endpoint.label())
}

/// Whether a request with `method` to `path` is one about a stored
/// response, served by [`stored_response`] (see [`routes`]).
fn is_stored_response(method: &axum::http::Method, path: &str) -> bool {
    use axum::http::Method;
    let Some(rest) = path.strip_prefix("/v1/responses/") else {
        return false;
    };
    let read = method == Method::GET || method == Method::HEAD;
    match rest.split_once('/') {
        None => !rest.is_empty() && (read || method == Method::DELETE),
        Some((id, "cancel")) => !id.is_empty() && method == Method::POST,
        Some((id, "input_items")) => !id.is_empty() && read,
        Some(_) => false,
    }
}

/// Whether `path` is one of the client API's routes (see [`routes`]): the
/// inference APIs, the endpoints routed by load, anything under `/v1/`, and
/// the `get_*` information routes.
fn is_client_api(path: &str) -> bool {
    path.starts_with("/v1/")
        || ROUTED.iter().any(|api| api.path() == path)
        || BY_LOAD.contains(&path)
        || matches!(path, "/get_server_info" | "/get_model_info" | "/get_loads")
}

/// The open endpoints: the probes, and `/metrics` (which checks
/// `server.metrics_api_key` itself). On the client port and on the metrics
/// port.
fn open_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/health", get(info::readiness))
        .route("/readiness", get(info::readiness))
        .route("/liveness", get(info::liveness))
        .route("/metrics", get(info::metrics))
}

/// A known path asked with a method it does not take; axum adds `Allow`.
async fn method_not_allowed(req: Request) -> axum::response::Response {
    let err = GatewayError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
    };
    crate::error::refused_unread(&req, err)
}

/// Connections the separate metrics port keeps open at once.
const METRICS_PORT_CONNECTIONS: usize = 64;
/// The longest the metrics port waits for a request head, or keeps an idle
/// connection open.
const METRICS_PORT_IDLE: Duration = Duration::from_secs(5);

/// Binds the separate metrics port, if one is configured.
async fn metrics_listener(config: &Config) -> Result<Option<TcpListener>, StartError> {
    let Some(port) = config.metrics.prometheus_port else {
        return Ok(None);
    };
    let host = config
        .metrics
        .prometheus_host
        .as_deref()
        .unwrap_or(&config.server.host);
    let listener =
        TcpListener::bind((host, port))
            .await
            .map_err(|source| StartError::MetricsListen {
                host: host.to_owned(),
                port,
                source,
            })?;
    Ok(Some(listener))
}

/// Runs a gateway on `listener` until `shutdown` is cancelled.
///
/// Requests are served by `server.threads` threads of their own, each a
/// single-threaded event loop accepting on the same socket, with its own
/// pool of worker connections: a request never wakes a second thread on
/// its way through. Health probes, the admin's control task, upkeep and
/// eviction run on the caller's runtime.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    let (_, reloads) = reload::channel(Box::new(|| Ok(Config::default())));
    run_reloadable(
        listener,
        config,
        reloads,
        shutdown,
        CancellationToken::new(),
    )
    .await
}

/// [`run`], also applying the reloads asked for through the [`Reload`]
/// handle paired with `reloads` (the binary's on `SIGHUP`); see
/// [`crate::reload`] for what a reload changes. Cancelling `now` after
/// `shutdown` ends the shutdown delay and the grace period at once (the
/// binary's second SIGTERM or Ctrl-C).
///
/// [`Reload`]: crate::reload::Reload
pub async fn run_reloadable(
    listener: TcpListener,
    config: Config,
    reloads: Reloads,
    shutdown: CancellationToken,
    now: CancellationToken,
) -> Result<(), StartError> {
    config.validate()?;
    let tenants = Arc::new(arc_swap::ArcSwap::from_pointee(
        crate::tenants::Tenants::from_config(&config)?,
    ));
    let policy = config
        .routing
        .build()
        .map_err(crate::config::ConfigError::from)?;
    let mut registry = Registry::new(policy.clone());
    if config.pd.enabled {
        let decode = config
            .pd
            .decode_policy
            .build()
            .map_err(crate::config::ConfigError::from)?;
        registry.set_decode_policy(decode, &config.routing.tree_bounds());
    }
    if config.sync.enabled() {
        // Replicas start their tie-breaking rotations apart (a random
        // place each), so that at a cold start they do not all send their
        // first requests to the same worker.
        registry.stagger(rand::random::<u32>() as usize);
    }
    // The decode pool's record (its own, or its policy's trees) is evicted
    // on its own timer; it lives as long as the gateway.
    let decode_policy = registry.decode_policy();
    let router = registry.router();
    let via = crate::via::Via::new();
    let client = upstream::worker_client(via.value())?;
    let forwarder = upstream::Forwarder::new()?;
    // Not a child of `shutdown`: the gateway serves on through the shutdown
    // delay and the grace period, and with it health checks, the admin
    // plane, metrics upkeep and replica sync; they stop once the serving
    // threads have. Whatever way this function returns (an error part-way
    // through start-up included), the background tasks it started stop.
    let tasks = CancellationToken::new();
    let _stop_tasks = tasks.clone().drop_guard();
    // Each component builds its own metric families from this recorder;
    // only histogram buckets must be known before it is built.
    let metrics = Metrics::with_histograms(RequestMetrics::HISTOGRAMS);
    let (control, control_task) = control::spawn(
        registry,
        client.clone(),
        control::Settings {
            health: config.health.clone(),
            allowlist: Allowlist::parse(&config.server.worker_allowlist)?,
            drain_timeout: Duration::from_secs(config.server.drain_timeout_secs),
        },
        &metrics,
        tasks.clone(),
    );
    for worker in &config.workers {
        control.add_configured(worker.clone()).await?;
    }
    #[cfg(feature = "kubernetes")]
    let discovery = match config.discovery.enabled {
        true => {
            crate::discovery::spawn(&config.discovery, control.clone(), &metrics, tasks.clone())
                .await?
        }
        false => Vec::new(),
    };
    // Its own token: a reload that replaces the policy stops this timer.
    let eviction_stop = tasks.child_token();
    let eviction = spawn_eviction(policy, eviction_stop.clone());
    // The decode pool's prefix record is evicted on a timer of its own,
    // for the gateway's lifetime (a reload does not replace it).
    let decode_eviction = config
        .pd
        .enabled
        .then(|| spawn_eviction(decode_policy, tasks.clone()))
        .flatten();
    let grace = Duration::from_secs(config.server.shutdown_grace_period_secs);
    let bodies = BodyLimits {
        max_size: config.server.max_payload_size,
        timeout: Duration::from_secs(config.server.body_read_timeout_secs),
        budget: BodyBudget::new(config.server.max_buffered_body_bytes),
    };
    let connection_limits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(config.server.header_read_timeout_secs),
        idle_timeout: Duration::from_secs(config.server.idle_timeout_secs),
        write_timeout: Duration::from_secs(config.server.client_write_timeout_secs),
        slots: ConnectionSlots::new(config.server.connection_cap()),
        ids: crate::trace::request_id::RequestIds::new(config.tracing.header_names()),
        // `/readiness` answers 503 and HTTP/1 answers close their
        // connections from the same moment.
        draining: CancellationToken::new(),
    };
    let keys = Arc::new(Keys::new(&config.server));
    let routing = Arc::new(arc_swap::ArcSwap::from_pointee(config.routing.clone()));
    let reloader = tokio::spawn(reload::serve(
        reloads,
        reload::Target {
            running: config.clone(),
            started_routing: config.routing.clone(),
            control: control.clone(),
            keys: keys.clone(),
            tenants: tenants.clone(),
            routing: routing.clone(),
            eviction: eviction_stop,
            tasks: tasks.clone(),
            metrics: reload::ReloadMetrics::new(&metrics),
        },
    ));
    let sync = match config.sync.enabled() {
        true => Some(crate::sync::spawn(
            &config.sync,
            config.health.models_lag(),
            router.clone(),
            &metrics,
            tasks.clone(),
        )?),
        false => None,
    };
    let kv_events = match config.kv_events.enabled {
        true => Some(crate::events::KvEvents::spawn(
            &config.kv_events,
            config.routing.tree_bounds().max_routing_text_chars,
            router.clone(),
            &metrics,
            tasks.clone(),
        )?),
        false => None,
    };
    let recorder = crate::record::Recorder::new(&config.record_trace, router.clone(), &metrics)?;
    let streams_abort = CancellationToken::new();
    let shared = Arc::new(Shared {
        via,
        sync,
        kv_events,
        recorder,
        keys,
        admission: Admission::new(&config.admission, &metrics),
        bodies,
        breakers: Breakers::new(config.circuit_breaker.clone(), &metrics),
        suspects: crate::retry::Suspects::default(),
        paused: crate::retry::Paused::default(),
        retry_budget: crate::retry::RetryBudget::new(
            config.retry.budget_percent,
            config.retry.budget_min_per_sec,
        ),
        outliers: crate::outlier::Outliers::new(config.outlier_detection.clone()),
        streams_abort: streams_abort.clone(),
        shutting_down: connection_limits.draining.clone(),
        accepting: std::sync::atomic::AtomicBool::new(false),
        request_metrics: RequestMetrics::new(&metrics),
        responses: crate::responses::Makers::new(&config.responses, &metrics),
        tenant_metrics: TenantMetrics::new(&metrics),
        metrics,
        tenants,
        config,
        routing,
        router,
        control,
        client,
        started: Instant::now(),
        dashboard: crate::dashboard::Dashboard::default(),
        pulse: crate::pulse::Pulse::new(crate::pulse::STALL),
        connections: connection_limits.slots.clone(),
    });
    let upkeep = tokio::spawn(upkeep::run(shared.clone(), tasks.clone()));
    let outliers = tokio::spawn(crate::outlier::run(shared.clone(), tasks.clone()));
    let dashboard = tokio::spawn(crate::dashboard::run(shared.clone(), tasks.clone()));
    // The metrics listener's handler needs no forwarding, but shares the
    // serving threads' state type; its pool stays empty.
    let background = Arc::new(AppState {
        shared: shared.clone(),
        forwarder: forwarder.fresh_pool(),
        cut_off: streams_abort.child_token(),
    });
    // The metrics port serves the probes: it stays up through the shutdown
    // delay (readiness at 503) and the grace period, and stops last.
    let management_stop = CancellationToken::new();
    let _stop_management = management_stop.clone().drop_guard();
    let metrics_server = match metrics_listener(&shared.config).await? {
        Some(listener) => {
            // The probes too: on their own port, apart from the client
            // port's connection cap, clients that fill that cap cannot fail
            // an orchestrator's probes (and have the router restarted,
            // cutting every stream it serves).
            let app = open_routes().with_state(background);
            tracing::info!(
                addr = %listener.local_addr()?,
                "metrics and probes listening"
            );
            // Held to the client port's timeouts (`axum::serve` has none:
            // connections that never sent a request were held open, and
            // with them file descriptors the client port needs), with a
            // cap of its own: a scrape port has a few clients.
            let limits = ConnectionLimits {
                slots: ConnectionSlots::set_by(
                    METRICS_PORT_CONNECTIONS,
                    "the metrics port's own cap",
                ),
                // Probes and scrapes send their request at once, read
                // their answer at once and need no long keep-alive:
                // connections that hold a slot otherwise (idle, headless,
                // or an HTTP/2 window left shut) go within seconds, so that
                // the cap cannot be held for long.
                header_read_timeout: connection_limits.header_read_timeout.min(METRICS_PORT_IDLE),
                idle_timeout: connection_limits.idle_timeout.min(METRICS_PORT_IDLE),
                write_timeout: connection_limits.write_timeout.min(METRICS_PORT_IDLE),
                ids: connection_limits.ids.clone(),
                draining: connection_limits.draining.clone(),
            };
            Some(tokio::spawn(listen::serve(
                listener,
                app,
                limits,
                management_stop.clone(),
            )))
        }
        None => None,
    };

    // Before "listening", which tests and operators wait for.
    let admission = &shared.config.admission;
    let defaults = crate::config::AdmissionConfig::default();
    if admission.max_concurrent_requests.is_none()
        && (admission.queue_size != defaults.queue_size
            || admission.queue_timeout_secs != defaults.queue_timeout_secs)
    {
        tracing::warn!(
            queue_size = admission.queue_size,
            queue_timeout_secs = admission.queue_timeout_secs,
            "admission.queue_size and admission.queue_timeout_secs take effect only with \
             admission.max_concurrent_requests (`--max-concurrent-requests N`): without it \
             every request is admitted at once and none waits in the queue"
        );
    }
    for setting in shared.config.inert_settings() {
        tracing::warn!("{setting}");
    }
    let threads = shared.config.server.serving_threads();
    tracing::info!(
        addr = %listener.local_addr()?,
        threads,
        max_connections = connection_limits.slots_cap(),
        "radixgate listening"
    );
    if shared.config.workers.is_empty() && !shared.config.discovery.enabled {
        tracing::warn!(
            "the worker pool is empty: requests get 503 until workers are added with \
             `--worker-urls URL...`, `workers:` in the config file (reloaded on SIGHUP), \
             or `POST /workers {{\"url\": ...}}` on this listener's admin API"
        );
    }
    // Accepting from the first probes' outcome: a router restarted under
    // load would otherwise answer 503 (workers pending) until its probes
    // of workers that were up all along pass. Connections made meanwhile
    // wait in the listen backlog.
    first_probes(&shared.config.health, &shared.control, &shutdown).await;
    let listener = listener.into_std()?;
    // Not a child of `shutdown`: readiness drops first, accepting stops
    // after the shutdown delay.
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    // Likewise for serving threads already started when a later one fails.
    let _abort_threads = abort.clone().drop_guard();
    let (ended_tx, ended) = tokio::sync::mpsc::unbounded_channel();
    let mut handles = Vec::with_capacity(threads);
    for index in 0..threads {
        let state = Arc::new(AppState {
            shared: shared.clone(),
            forwarder: forwarder.fresh_pool(),
            cut_off: streams_abort.child_token(),
        });
        let thread = ServingThread {
            index,
            shared: shared.clone(),
            listener: listener.try_clone()?,
            app: routes(state),
            limits: connection_limits.clone(),
            stop: stop.clone(),
            abort: abort.clone(),
            ended: ended_tx.clone(),
        };
        handles.push(thread.spawn()?);
    }
    drop((listener, ended_tx));
    // Connections made from here are served: ready (as far as starting goes).
    shared
        .accepting
        .store(true, std::sync::atomic::Ordering::Release);

    // Serve until shutdown, or until a serving thread fails on its own.
    let mut serving = Serving {
        ended,
        running: threads,
        failure: None,
    };
    let delay = Duration::from_secs(shared.config.server.shutdown_delay_secs);
    tokio::select! {
        () = shutdown.cancelled() => {
            shared.shutting_down.cancel();
            if !delay.is_zero() {
                tracing::info!(
                    ?delay,
                    "shutting down: /readiness answers 503; still accepting for the shutdown delay"
                );
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = now.cancelled() => {}
                    _ = serving.one_ended() => {}
                }
            }
        }
        _ = serving.one_ended() => shared.shutting_down.cancel(),
    }
    stop.cancel();
    let (in_flight, queued) = waiting(&shared);
    tracing::info!(
        in_flight,
        queued,
        ?grace,
        "stopped accepting; waiting for the requests in flight"
    );
    // Stopped accepting; give in-flight requests the grace period (or
    // less, when told to stop now), then drop what is left (which releases
    // its load).
    let finished = tokio::select! {
        () = serving.all_ended() => true,
        () = tokio::time::sleep(grace) => {
            let (in_flight, queued) = waiting(&shared);
            tracing::warn!(
                in_flight,
                queued,
                ?grace,
                "grace period over; dropping remaining connections"
            );
            false
        }
        () = now.cancelled() => {
            let (in_flight, queued) = waiting(&shared);
            tracing::warn!(
                in_flight,
                queued,
                "told to stop now; dropping remaining connections"
            );
            false
        }
    };
    if !finished {
        // Streams still running end with an error event first, and get a
        // moment to send it, before their connections are dropped.
        streams_abort.cancel();
        let _ = tokio::time::timeout(ABORT_FLUSH, serving.all_ended()).await;
        abort.cancel();
        serving.all_ended().await;
    }
    let _ = tokio::task::spawn_blocking(move || {
        for handle in handles {
            let _ = handle.join();
        }
    })
    .await;
    tasks.cancel();
    management_stop.cancel();
    // Every request has ended: what the recording queued goes to disk.
    let recording = shared.clone();
    let _ = tokio::task::spawn_blocking(move || recording.recorder.stop()).await;
    let _ = control_task.await;
    #[cfg(feature = "kubernetes")]
    for watch in discovery {
        let _ = watch.await;
    }
    let _ = upkeep.await;
    let _ = reloader.await;
    let _ = outliers.await;
    let _ = dashboard.await;
    if let Some(metrics_server) = metrics_server {
        let _ = metrics_server.await;
    }
    for eviction in [eviction, decode_eviction].into_iter().flatten() {
        let _ = eviction.await;
    }
    match serving.failure {
        Some(err) => Err(err.into()),
        None => Ok(()),
    }
}

/// What the shutdown waits for: the requests at a worker (the workers'
/// loads, draining ones included) and those queued for admission.
fn waiting(shared: &Shared) -> (usize, usize) {
    let in_flight = (shared.router.snapshot().workers().iter())
        .chain(shared.control.draining().iter())
        .map(|w| w.load())
        .sum();
    (in_flight, shared.admission.queued())
}

/// How often the start looks whether the workers' first probes are done.
const FIRST_PROBES_POLL: Duration = Duration::from_millis(10);

/// Waits until every known worker is admitted or has failed a probe (a
/// worker that is down settles at once, one that does not answer at its
/// probe's timeout), or until `shutdown`; at most a probe's timeout and
/// the back-offs between the probes that admit a worker (5.5 s by
/// default), so that a worker that passes its probes but hangs on the
/// question of its models holds the start no longer.
async fn first_probes(
    health: &crate::config::HealthConfig,
    control: &control::Control,
    shutdown: &CancellationToken,
) {
    let backoff = Duration::from_millis(health.unhealthy_backoff_initial_ms);
    let most = Duration::from_secs(health.timeout_secs) + backoff * health.success_threshold;
    let settled = async {
        while !control.probes_settled() {
            tokio::time::sleep(FIRST_PROBES_POLL).await;
        }
    };
    tokio::select! {
        () = settled => {}
        () = tokio::time::sleep(most) => {}
        () = shutdown.cancelled() => {}
    }
}

/// The serving threads still running, as told by their end reports.
struct Serving {
    ended: tokio::sync::mpsc::UnboundedReceiver<std::io::Result<()>>,
    running: usize,
    /// The first error a thread ended with.
    failure: Option<std::io::Error>,
}

impl Serving {
    /// Waits for one more thread to end; false when none is left.
    /// Cancel-safe: nothing is counted until a report is received.
    async fn one_ended(&mut self) -> bool {
        if self.running == 0 {
            return false;
        }
        match self.ended.recv().await {
            Some(result) => {
                self.running -= 1;
                if self.failure.is_none() {
                    self.failure = result.err();
                }
                true
            }
            None => {
                self.running = 0;
                false
            }
        }
    }

    /// Waits until every thread has ended.
    async fn all_ended(&mut self) {
        while self.one_ended().await {}
    }
}

/// One serving thread: a single-threaded runtime running the routes on a
/// handle of the shared listening socket.
struct ServingThread {
    index: usize,
    /// The gateway's state (its `pulse` is told the thread's runtime).
    shared: Arc<Shared>,
    listener: std::net::TcpListener,
    app: Router,
    /// Timeouts and the connection cap (shared by all threads).
    limits: ConnectionLimits,
    /// Stop accepting and drain (graceful shutdown).
    stop: CancellationToken,
    /// Drop every connection now (the grace period is over).
    abort: CancellationToken,
    /// Told once, when the thread's runtime is gone.
    ended: tokio::sync::mpsc::UnboundedSender<std::io::Result<()>>,
}

impl ServingThread {
    fn spawn(self) -> Result<std::thread::JoinHandle<()>, StartError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = std::thread::Builder::new()
            .name(format!("radixgate-serve-{}", self.index))
            .spawn(move || {
                let Self {
                    index,
                    shared,
                    listener,
                    app,
                    limits,
                    stop,
                    abort,
                    ended,
                } = self;
                shared.pulse.started(index, runtime.handle().clone());
                let result = runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener)?;
                    let server = listen::serve(listener, app, limits, stop);
                    tokio::select! {
                        result = server => result,
                        () = abort.cancelled() => Ok(()),
                    }
                });
                shared.pulse.ended(index);
                // Dropping the runtime drops every connection still open.
                drop(runtime);
                let _ = ended.send(result);
            })?;
        Ok(handle)
    }
}
