//! Building and running a gateway: routes, background tasks, shutdown.
//!
//! [`run`] takes an already-bound listener (tests bind port 0) and a
//! cancellation token. Shutdown: the listener stops accepting at once,
//! in-flight requests (streams included) get up to
//! `shutdown_grace_period_secs` to finish, then the remaining connections
//! are dropped — which drops their bodies and so releases their load.

use crate::admission::Admission;
use crate::auth::{RequiredKey, require_key};
use crate::config::Config;
use crate::error::GatewayError;
use crate::inspect::Api;
use crate::metrics::Metrics;
use crate::state::{AppState, Breakers};
use crate::{admin, control, info, proxy, upkeep, upstream};
use axum::Router;
use axum::extract::{Request, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use radixgate_routing::{Registry, spawn_eviction};
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Why a gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The worker client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    /// The forwarding client's TLS set-up failed.
    #[error("cannot set up TLS for the worker client: {0}")]
    Tls(#[from] rustls::Error),
    /// A configured worker was rejected.
    #[error("worker rejected: {0}")]
    Worker(#[from] GatewayError),
    /// A listener failed.
    #[error("listener error: {0}")]
    Io(#[from] std::io::Error),
}

fn inference(api: Api, path: &'static str) -> axum::routing::MethodRouter<Arc<AppState>> {
    post(move |State(state): State<Arc<AppState>>, req: Request| {
        proxy::serve(state, api, path, req)
    })
}

/// The HTTP routes of a gateway.
fn routes(state: Arc<AppState>) -> Router {
    let server = &state.config.server;
    let client_key = RequiredKey(server.api_key.as_deref().map(Arc::from));
    let admin_key = RequiredKey(
        server
            .admin_api_key
            .as_deref()
            .or(server.api_key.as_deref())
            .map(Arc::from),
    );

    let api = Router::<Arc<AppState>>::new()
        .route(
            "/v1/chat/completions",
            inference(Api::ChatCompletions, "/v1/chat/completions"),
        )
        .route(
            "/v1/completions",
            inference(Api::Completions, "/v1/completions"),
        )
        .route("/generate", inference(Api::Generate, "/generate"))
        .route(
            "/v1/embeddings",
            inference(Api::Embeddings, "/v1/embeddings"),
        )
        .route("/v1/models", get(info::models))
        .route("/get_server_info", get(info::server_info))
        .route("/get_model_info", get(info::model_info))
        .route("/get_loads", get(info::loads))
        .route("/flush_cache", post(info::flush_cache))
        .route_layer(axum::middleware::from_fn_with_state(
            client_key,
            require_key,
        ));
    let admin = Router::<Arc<AppState>>::new()
        .route(
            "/workers",
            get(admin::list).post(admin::add).delete(admin::remove),
        )
        .route_layer(axum::middleware::from_fn_with_state(admin_key, require_key));
    let open = Router::<Arc<AppState>>::new()
        .route("/health", get(info::readiness))
        .route("/readiness", get(info::readiness))
        .route("/liveness", get(info::liveness))
        .route("/metrics", get(info::metrics));

    api.merge(admin)
        .merge(open)
        .fallback(|req: Request| async move {
            GatewayError::NotFound {
                method: req.method().to_string(),
                path: req.uri().path().to_owned(),
            }
            .into_response()
        })
        .with_state(state)
}

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
    Ok(Some(TcpListener::bind((host, port)).await?))
}

/// Runs a gateway on `listener` until `shutdown` is cancelled.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    config.validate()?;
    let policy = config
        .routing
        .build()
        .map_err(crate::config::ConfigError::from)?;
    let registry = Registry::new(policy.clone());
    let router = registry.router();
    let client = upstream::client()?;
    let forwarder = upstream::Forwarder::new()?;
    let tasks = shutdown.child_token();
    let (control, control_task) = control::spawn(
        registry,
        client.clone(),
        config.health.clone(),
        tasks.clone(),
    );
    for worker in &config.workers {
        control.add(worker.clone()).await?;
    }
    let eviction = spawn_eviction(policy, tasks.clone());
    let grace = Duration::from_secs(config.server.shutdown_grace_period_secs);
    let state = Arc::new(AppState {
        admission: Admission::new(&config.admission),
        breakers: Breakers::new(config.circuit_breaker.clone()),
        metrics: Metrics::new(),
        config,
        router,
        control,
        client,
        forwarder,
        started: Instant::now(),
    });
    let upkeep = tokio::spawn(upkeep::run(state.clone(), tasks.clone()));
    let metrics_server = match metrics_listener(&state.config).await? {
        Some(listener) => {
            let app = Router::new()
                .route("/metrics", get(info::metrics))
                .with_state(state.clone());
            let stop = tasks.clone();
            Some(tokio::spawn(async move {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await
            }))
        }
        None => None,
    };
    let app = routes(state);

    tracing::info!(addr = %listener.local_addr()?, "radixgate listening");
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        // Streamed tokens must not wait for Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
    });
    let stop = shutdown.clone();
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .into_future();
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => result?,
        () = shutdown.cancelled() => {
            // Stopped accepting; give in-flight requests the grace period.
            if tokio::time::timeout(grace, &mut server).await.is_err() {
                tracing::warn!(?grace, "grace period over; dropping remaining connections");
            }
        }
    }
    tasks.cancel();
    let _ = control_task.await;
    let _ = upkeep.await;
    if let Some(metrics_server) = metrics_server {
        let _ = metrics_server.await;
    }
    if let Some(eviction) = eviction {
        let _ = eviction.await;
    }
    Ok(())
}
