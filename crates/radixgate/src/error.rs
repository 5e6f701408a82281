//! The gateway's one error type, and the one place errors become HTTP.
//!
//! Every error knows who caused it ([`Origin`]: the client, an upstream
//! worker, or the gateway itself) and whether trying another worker may help
//! ([`GatewayError::retryable`], whose rule is [`crate::retry`]'s).
//! [`GatewayError::status`] is the only mapping
//! from error to HTTP status; clients always get an OpenAI-style JSON body
//! `{"error": {"message", "type", "param", "code"}}`.

use crate::inspect::InspectError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use radixgate_routing::RoutingError;
use std::time::Duration;

/// The status of a request whose client left before its answer (nginx's
/// "client closed request"): it is counted so, and never sent.
pub(crate) const CLIENT_CLOSED_REQUEST: u16 = 499;

/// Who caused an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The request itself is wrong; repeating it will not help.
    Client,
    /// A worker failed or misbehaved.
    Upstream,
    /// The gateway is out of capacity or misconfigured.
    Gateway,
}

/// Everything that can go wrong while serving a request.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The body could not be read as a request of its API.
    #[error(transparent)]
    BadRequest(#[from] InspectError),
    /// A request parameter is missing or malformed.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request body could not be read: its framing is broken (a bad
    /// chunk size).
    #[error("could not read the request body: {0}")]
    BadBody(String),
    /// The client went away before its body was complete: its connection
    /// ended, or it reset its HTTP/2 stream. No answer reaches it; it is
    /// counted as [`CLIENT_CLOSED_REQUEST`], as a request whose client
    /// leaves later is, not as a bad request.
    #[error("the client went away before its request body was complete")]
    ClientLeft,
    /// No worker with this URL is known (admin API).
    #[error("no worker with URL `{url}`")]
    UnknownWorkerUrl {
        /// The URL asked for.
        url: String,
    },
    /// The body is larger than the configured limit.
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The client stopped sending its body before it was complete.
    #[error("the request body did not arrive within {after:?}")]
    BodyTimeout {
        /// The configured body-read timeout.
        after: Duration,
    },
    /// Request bodies held in memory have reached the gateway's budget.
    #[error("the gateway is holding its limit of {budget} bytes of request bodies; retry shortly")]
    BodyBudgetExhausted {
        /// The configured budget in bytes.
        budget: usize,
        /// Whether the body was refused before its end was read (its
        /// connection then cannot carry another request), not an edit of
        /// a body read whole.
        unread: bool,
    },
    /// Every place under `server.max_connections` is taken: a request
    /// beyond the first in flight on one connection (an HTTP/2 stream)
    /// needs a place of its own, as a connection does.
    #[error("the gateway holds its limit of {cap} client connections and streams; retry shortly")]
    ConnectionCap {
        /// The cap (`server.max_connections`, or the metrics port's own).
        cap: usize,
    },
    /// Missing or wrong API key.
    #[error("invalid or missing API key")]
    Unauthorized,
    /// The admin plane refused the caller: no admin key is configured and
    /// the plane is off, or the peer is not on loopback.
    #[error("{reason}")]
    AdminForbidden {
        /// Why, and which setting opens it.
        reason: &'static str,
    },
    /// A worker added at runtime is outside `server.worker_allowlist`.
    #[error("worker `{url}` is not allowed by server.worker_allowlist: {reason}")]
    WorkerNotAllowed {
        /// The worker URL.
        url: String,
        /// Which rule it failed.
        reason: String,
    },
    /// The route exists, but not for this method.
    #[error(
        "method {method} is not allowed on {path}; the Allow header lists the methods that are"
    )]
    MethodNotAllowed {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
    /// No worker serves the requested model.
    #[error("the model `{model}` does not exist or is not served here")]
    UnknownModel {
        /// The requested model.
        model: String,
    },
    /// Under `pd:`, a side's worker listed with the model answered that it
    /// does not serve it, and no other worker of that side is listed with
    /// it (`crate::proxy`'s `pd/served.rs`).
    #[error(
        "the model `{model}` is not served here: {side} worker {worker} is listed with it and \
         answered that it does not serve it{}; no other {side} worker is listed with it",
        cause(message)
    )]
    ModelNotServed {
        /// The requested model.
        model: String,
        /// `prefill` or `decode`.
        side: &'static str,
        /// The worker URL.
        worker: String,
        /// The worker's own error message.
        message: Option<String>,
    },
    /// The request named no model and several are served.
    #[error("`model` is required: this gateway serves {served} models")]
    ModelRequired {
        /// How many models are served.
        served: usize,
    },
    /// No worker for the model is healthy and in rotation (or the pool is
    /// empty); `why` says which workers are pending or unhealthy, and why.
    #[error("no healthy worker is available{}: {why}", for_model(model.as_deref()))]
    NoHealthyWorker {
        /// The model the client asked for, if it named one.
        model: Option<String>,
        /// What the pool looks like: see `health::Board::explain`.
        why: String,
    },
    /// The admission queue is full.
    #[error("too many requests: the queue of {queue_size} is full")]
    QueueFull {
        /// The configured queue size.
        queue_size: usize,
    },
    /// The tenant is over one of its limits.
    #[error(
        "rate limit reached for tenant `{tenant}` on {} per min: limit {per_minute}; \
         please try again in {}s",
        limit.as_str(),
        retry_after_secs(*retry_after)
    )]
    RateLimited {
        /// The tenant's name.
        tenant: String,
        /// Which limit.
        limit: crate::tenants::Limit,
        /// Its value per minute.
        per_minute: u32,
        /// How long until the request would be admitted.
        retry_after: Duration,
    },
    /// The request waited in the admission queue longer than allowed.
    #[error("request waited {waited:?} in the queue without being admitted")]
    QueueTimeout {
        /// How long it waited.
        waited: Duration,
    },
    /// The whole request took longer than the request timeout.
    #[error("request timed out after {after:?}")]
    RequestTimeout {
        /// The configured timeout.
        after: Duration,
    },
    /// A worker could not be reached.
    #[error("could not reach worker {worker}: {source}")]
    Connect {
        /// The worker URL.
        worker: String,
        /// The transport error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A worker broke the connection after the request went out, before
    /// its answer's head (or, for a 2xx, its first body frame).
    #[error("worker {worker} broke the connection before answering: {source}")]
    UpstreamClosed {
        /// The worker URL.
        worker: String,
        /// The transport error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A worker's answer was no answer to the request: a head that cannot
    /// be read (a malformed status line or header, two different
    /// lengths), or a protocol switch (`101`) the request never asked
    /// for. The worker did answer, so it broke no connection (the request
    /// is no suspect, [`crate::retry::Suspects`]); another worker may
    /// answer properly.
    #[error("worker {worker} sent an invalid answer: {why}")]
    UpstreamInvalid {
        /// The worker URL.
        worker: String,
        /// What was wrong with it.
        why: String,
    },
    /// A worker answered with an error status before any byte reached the client.
    #[error("worker {worker} answered {status}{}", cause(message))]
    UpstreamStatus {
        /// The worker URL.
        worker: String,
        /// Its status.
        status: StatusCode,
        /// The worker's own error message (from its body's
        /// `error.message`, `message` or `detail`, or its first bytes).
        message: Option<String>,
        /// The worker's `Retry-After` (a 429 or 503 that says when it
        /// takes requests again): the client's, should this answer be the
        /// last the request gets.
        retry_after: Option<HeaderValue>,
    },
    /// A worker sent no first byte (response head, and first chunk of a
    /// 2xx body) within the first-byte timeout.
    #[error("worker {worker} sent no first byte within {after:?}")]
    FirstByteTimeout {
        /// The worker URL.
        worker: String,
        /// The timeout.
        after: Duration,
    },
    /// The worker was marked unavailable (circuit breaker open, ejected as
    /// an outlier, or failing health checks) while this attempt still
    /// waited for its first byte: the attempt is given up and retried.
    #[error(
        "worker {worker} was marked unavailable while the request waited {after:?} for its first byte"
    )]
    WorkerLost {
        /// The worker URL.
        worker: String,
        /// How long the attempt had waited.
        after: Duration,
        /// Whether the router moved the attempt off a worker that fails
        /// nothing: ejected as an outlier (slow), healthy, its breaker
        /// closed, no hang seen. Not the worker's failure, so its breaker
        /// does not count it.
        moved: bool,
    },
    /// The router panicked while handling the request: a bug, logged (with
    /// where it happened and the request's id) by the panic hook that
    /// `trace::init` installs. The message names no detail of it.
    #[error(
        "the router failed while handling this request (an internal error, logged with this \
         request's id); please retry, and report it if it persists"
    )]
    Internal,
    /// One side of a prefill/decode disaggregated request failed; the
    /// other side was cancelled. Answers as the failure does.
    #[error("{side} worker failed: {source}")]
    Disaggregated {
        /// `prefill` or `decode`.
        side: &'static str,
        /// What went wrong there.
        source: Box<GatewayError>,
    },
    /// A vLLM prefill worker answered without the `kv_transfer_params` the
    /// decode step needs: it runs without a KV connector.
    #[error(
        "prefill worker {worker} answered without kv_transfer_params; start it with a KV connector \
         (vLLM --kv-transfer-config with kv_role kv_producer or kv_both)"
    )]
    NoTransferParams {
        /// The worker URL.
        worker: String,
    },
    /// The route has no meaning in a disaggregated pool.
    #[error(
        "{route} is not served by a prefill/decode disaggregated pool; \
         /generate, /v1/completions and /v1/chat/completions are"
    )]
    NotDisaggregated {
        /// The route.
        route: &'static str,
    },
    /// Retries were exhausted; holds the last attempt's error.
    #[error(
        "gave up after {attempts} attempt{}: {last}",
        if *attempts == 1 { "" } else { "s" }
    )]
    RetriesExhausted {
        /// How many attempts were made.
        attempts: u32,
        /// The last error seen.
        #[source]
        last: Box<GatewayError>,
    },
    /// Workers broke the connection on this request, as engines do when
    /// they crash, and it was not sent to another in case it is what
    /// crashes them ([`crate::retry::MAX_BROKEN_CONNECTIONS`]); holds the
    /// last attempt's error.
    #[error(
        "{broke} worker{} broke the connection on this request before answering{}; it was not sent to another, in case it is what breaks them (last: {last})",
        if *broke == 1 { "" } else { "s" },
        if *before { ", as others did on the same request lately" } else { "" }
    )]
    BrokeWorkers {
        /// How many workers broke the connection on it.
        broke: u32,
        /// Whether the same request had broken workers' connections
        /// before ([`crate::retry::Suspects`]).
        before: bool,
        /// The last error seen.
        #[source]
        last: Box<GatewayError>,
    },
    /// An admin call or worker description was rejected. Only the admin
    /// path builds this; the request path's routing errors convert through
    /// `From<RoutingError>`.
    #[error("{0}")]
    Admin(RoutingError),
    /// The router could not choose a worker for a reason that is neither the
    /// client's nor the pool's (a registry or configuration error the
    /// request path does not expect).
    #[error("routing failed: {0}")]
    Routing(#[source] RoutingError),
    /// The gateway is shutting down and no longer takes this call.
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// A trace recording asked for through the admin API could not start.
    #[error(transparent)]
    RecordTrace(#[from] crate::record::RecordError),
    /// The request has passed through this gateway before (its `Via`
    /// names it): a worker URL leads back here (`crate::via`).
    #[error(
        "the request came back to this router (its Via header names {pseudonym}): a worker URL points at the router itself or at a router that forwards back to it"
    )]
    LoopDetected {
        /// This gateway's pseudonym.
        pseudonym: String,
    },
    /// A route that does not exist.
    #[error("no route for {method} {path}")]
    NotFound {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
    },
    /// A stored Responses API response that no worker asked holds
    /// (`crate::responses`).
    #[error(
        "Response with id '{id}' not found: none of the {asked} workers asked holds it (it was \
         deleted, not stored, or made by a worker that has restarted or left the pool)"
    )]
    ResponseNotFound {
        /// The id asked for.
        id: String,
        /// The workers asked.
        asked: usize,
    },
}

impl GatewayError {
    /// Who caused this error.
    pub fn origin(&self) -> Origin {
        match self {
            Self::BadRequest(_)
            | Self::BadBody(_)
            | Self::ClientLeft
            | Self::InvalidRequest(_)
            | Self::UnknownWorkerUrl { .. }
            | Self::PayloadTooLarge { .. }
            | Self::BodyTimeout { .. }
            | Self::Unauthorized
            | Self::UnknownModel { .. }
            | Self::ModelNotServed { .. }
            | Self::ModelRequired { .. }
            | Self::NotFound { .. }
            | Self::ResponseNotFound { .. }
            | Self::AdminForbidden { .. }
            | Self::WorkerNotAllowed { .. }
            | Self::MethodNotAllowed { .. }
            | Self::Admin(_)
            | Self::RateLimited { .. } => Origin::Client,
            Self::RecordTrace(err) if err.client_caused() => Origin::Client,
            Self::RecordTrace(_) => Origin::Gateway,
            Self::Connect { .. }
            | Self::UpstreamClosed { .. }
            | Self::UpstreamInvalid { .. }
            | Self::UpstreamStatus { .. }
            | Self::FirstByteTimeout { .. }
            | Self::WorkerLost { .. } => Origin::Upstream,
            Self::RetriesExhausted { last, .. } | Self::BrokeWorkers { last, .. } => last.origin(),
            Self::Disaggregated { source, .. } => source.origin(),
            Self::NoTransferParams { .. } => Origin::Upstream,
            Self::NotDisaggregated { .. } => Origin::Client,
            Self::NoHealthyWorker { .. }
            | Self::QueueFull { .. }
            | Self::QueueTimeout { .. }
            | Self::BodyBudgetExhausted { .. }
            | Self::ConnectionCap { .. }
            | Self::RequestTimeout { .. }
            | Self::Routing(_)
            | Self::LoopDetected { .. }
            | Self::Internal
            | Self::ShuttingDown => Origin::Gateway,
        }
    }

    /// Whether sending the same request to another worker may succeed
    /// ([`crate::retry::retryable`], the rule the attempt loop follows).
    pub fn retryable(&self) -> bool {
        crate::retry::retryable(self)
    }

    /// The HTTP status a client sees for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::BadRequest(_)
            | Self::BadBody(_)
            | Self::InvalidRequest(_)
            | Self::ModelRequired { .. } => StatusCode::BAD_REQUEST,
            // nginx's "client closed request"; a valid code, so never the
            // fallback.
            Self::ClientLeft => {
                StatusCode::from_u16(CLIENT_CLOSED_REQUEST).unwrap_or(StatusCode::BAD_REQUEST)
            }
            Self::UnknownWorkerUrl { .. } => StatusCode::NOT_FOUND,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::BodyBudgetExhausted { .. } | Self::ConnectionCap { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::AdminForbidden { .. } | Self::WorkerNotAllowed { .. } => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::UnknownModel { .. }
            | Self::ModelNotServed { .. }
            | Self::NotFound { .. }
            | Self::ResponseNotFound { .. } => StatusCode::NOT_FOUND,
            Self::Admin(err) => match err {
                RoutingError::DuplicateWorker { .. } => StatusCode::CONFLICT,
                RoutingError::UnknownWorker { .. } => StatusCode::NOT_FOUND,
                _ => StatusCode::BAD_REQUEST,
            },
            // Shutting down answers 503 like an empty pool: the client
            // should try again, here or at another replica.
            Self::NoHealthyWorker { .. } | Self::QueueTimeout { .. } | Self::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Routing(_) | Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::LoopDetected { .. } => StatusCode::LOOP_DETECTED,
            Self::RecordTrace(err) if err.client_caused() => StatusCode::BAD_REQUEST,
            Self::RecordTrace(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::QueueFull { .. } | Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::RequestTimeout { .. }
            | Self::FirstByteTimeout { .. }
            | Self::WorkerLost { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Connect { .. } | Self::UpstreamClosed { .. } | Self::UpstreamInvalid { .. } => {
                StatusCode::BAD_GATEWAY
            }
            Self::UpstreamStatus { status, .. } => *status,
            Self::RetriesExhausted { last, .. } | Self::BrokeWorkers { last, .. } => last.status(),
            Self::Disaggregated { source, .. } => source.status(),
            Self::NoTransferParams { .. } => StatusCode::BAD_GATEWAY,
            Self::NotDisaggregated { .. } => StatusCode::NOT_IMPLEMENTED,
        }
    }

    /// The OpenAI error `type` and `code` for this error.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            Self::BadRequest(_) => ("invalid_request_error", "invalid_json"),
            Self::BadBody(_) => ("invalid_request_error", "unreadable_body"),
            Self::ClientLeft => ("invalid_request_error", "client_closed_request"),
            Self::InvalidRequest(_) => ("invalid_request_error", "invalid_request"),
            Self::UnknownWorkerUrl { .. } => ("invalid_request_error", "worker_not_found"),
            Self::PayloadTooLarge { .. } => ("invalid_request_error", "payload_too_large"),
            Self::BodyTimeout { .. } => ("invalid_request_error", "body_read_timeout"),
            Self::BodyBudgetExhausted { .. } => ("service_unavailable", "body_budget_exhausted"),
            Self::ConnectionCap { .. } => ("service_unavailable", "connection_cap"),
            Self::Unauthorized => ("authentication_error", "invalid_api_key"),
            Self::AdminForbidden { .. } => ("permission_error", "admin_forbidden"),
            Self::WorkerNotAllowed { .. } => ("permission_error", "worker_not_allowed"),
            Self::MethodNotAllowed { .. } => ("invalid_request_error", "method_not_allowed"),
            Self::UnknownModel { .. } | Self::ModelNotServed { .. } => {
                ("invalid_request_error", "model_not_found")
            }
            Self::ModelRequired { .. } => ("invalid_request_error", "model_required"),
            Self::NotFound { .. } | Self::ResponseNotFound { .. } => {
                ("invalid_request_error", "not_found")
            }
            Self::Admin(_) => ("invalid_request_error", "invalid_worker"),
            Self::NoHealthyWorker { .. } => ("service_unavailable", "no_healthy_worker"),
            Self::ShuttingDown => ("service_unavailable", "shutting_down"),
            Self::Routing(_) => ("server_error", "routing_error"),
            Self::Internal => ("server_error", "internal_error"),
            Self::LoopDetected { .. } => ("server_error", "loop_detected"),
            Self::RecordTrace(err) if err.client_caused() => {
                ("invalid_request_error", "record_trace_failed")
            }
            Self::RecordTrace(_) => ("server_error", "record_trace_failed"),
            Self::QueueFull { .. } => ("rate_limit_error", "queue_full"),
            // OpenAI's own answer: the type names the limit.
            Self::RateLimited { limit, .. } => (limit.as_str(), "rate_limit_exceeded"),
            Self::QueueTimeout { .. } => ("service_unavailable", "queue_timeout"),
            Self::RequestTimeout { .. } => ("timeout", "request_timeout"),
            Self::Connect { .. } => ("upstream_error", "worker_unreachable"),
            Self::UpstreamClosed { .. } => ("upstream_error", "worker_closed"),
            Self::UpstreamInvalid { .. } => ("upstream_error", "worker_invalid_answer"),
            Self::UpstreamStatus { .. } => ("upstream_error", "worker_error"),
            Self::FirstByteTimeout { .. } => ("timeout", "worker_timeout"),
            Self::WorkerLost { .. } => ("timeout", "worker_unavailable"),
            Self::RetriesExhausted { last, .. } | Self::BrokeWorkers { last, .. } => last.kind(),
            Self::Disaggregated { source, .. } => source.kind(),
            Self::NoTransferParams { .. } => ("upstream_error", "no_kv_transfer_params"),
            Self::NotDisaggregated { .. } => ("invalid_request_error", "not_disaggregated"),
        }
    }

    /// The OpenAI-style JSON error body for this error.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        let param = match self {
            Self::UnknownModel { .. }
            | Self::ModelNotServed { .. }
            | Self::ModelRequired { .. } => Some("model"),
            _ => None,
        };
        serde_json::json!({
            "error": {
                "message": self.to_string(),
                "type": kind,
                "param": param,
                "code": code,
            }
        })
    }

    /// Seconds a client should wait before retrying, for errors where
    /// waiting helps.
    fn retry_after(&self) -> Option<u64> {
        match self {
            Self::QueueFull { .. }
            | Self::QueueTimeout { .. }
            | Self::NoHealthyWorker { .. }
            | Self::BodyBudgetExhausted { .. }
            | Self::ConnectionCap { .. }
            | Self::ShuttingDown => Some(1),
            Self::RateLimited { retry_after, .. } => Some(retry_after_secs(*retry_after)),
            _ => None,
        }
    }

    /// The `Retry-After` of the worker whose error answer this is (or was
    /// the last attempt's), passed on as it said it.
    fn workers_retry_after(&self) -> Option<&HeaderValue> {
        match self {
            Self::UpstreamStatus { retry_after, .. } => retry_after.as_ref(),
            Self::RetriesExhausted { last, .. } | Self::BrokeWorkers { last, .. } => {
                last.workers_retry_after()
            }
            Self::Disaggregated { source, .. } => source.workers_retry_after(),
            _ => None,
        }
    }
}

/// ` for model `m`` when the client named one, else nothing.
fn for_model(model: Option<&str>) -> String {
    model.map_or_else(String::new, |m| format!(" for model `{m}`"))
}

/// Whole seconds to wait, rounded up, at least 1 (`Retry-After: 0` would
/// invite an immediate retry that fails the same way).
fn retry_after_secs(wait: Duration) -> u64 {
    let whole = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    whole.max(1)
}

/// Routing errors on the request path: the client's model is unknown or
/// missing, or no worker can take the request now. Anything else the router
/// might answer is the gateway's own failure ([`GatewayError::Routing`]);
/// admin-path errors are built as [`GatewayError::Admin`] where they arise.
impl From<RoutingError> for GatewayError {
    fn from(err: RoutingError) -> Self {
        match err {
            RoutingError::UnknownModel { model } => Self::UnknownModel { model },
            RoutingError::ModelRequired { available } => Self::ModelRequired {
                served: available.len(),
            },
            // The gateway says more where it knows the pool
            // (`proxy::unavailable`); this is the bare form.
            RoutingError::NoHealthyWorker { model } => Self::NoHealthyWorker {
                model: (model != radixgate_routing::WILDCARD_MODEL).then_some(model),
                why: "none is healthy".to_owned(),
            },
            RoutingError::NoWorkers => Self::NoHealthyWorker {
                model: None,
                why: "the pool is empty".to_owned(),
            },
            other => Self::Routing(other),
        }
    }
}

/// `err`'s answer to `req`, given before its body was read: when it has a
/// body (one not known to be empty), the rest of it is not read, so its
/// connection cannot carry another request; the answer says so
/// (`Connection: close`, as for a 413), or a client that sends its next
/// request on the connection loses it when the server closes it.
pub(crate) fn refused_unread<B: http_body::Body>(
    req: &http::Request<B>,
    err: GatewayError,
) -> Response {
    let mut response = err.into_response();
    if !req.body().is_end_stream() {
        says_close(&mut response);
    }
    response
}

/// Marks `response` as the connection's last (`Connection: close`): the
/// rest of its request's body is not read.
pub(crate) fn says_close(response: &mut Response) {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        if matches!(self, Self::ClientLeft) {
            // 499 has no reason phrase of its own: hyper writes `<none>`.
            response
                .extensions_mut()
                .insert(hyper::ext::ReasonPhrase::from_static(
                    b"Client Closed Request",
                ));
        }
        if matches!(self, Self::Unauthorized) {
            // RFC 9110, 11.6.1: a 401 names the scheme it wants.
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(
            self,
            Self::PayloadTooLarge { .. }
                | Self::BodyTimeout { .. }
                | Self::BodyBudgetExhausted { unread: true, .. }
        ) {
            // The rest of the body is not read, so the connection cannot
            // carry another request: the server closes it, and says so
            // (RFC 9112, 9.6), so that the client stops sending and does
            // not reuse it.
            says_close(&mut response);
        }
        if matches!(self, Self::BrokeWorkers { .. }) {
            // OpenAI's and Anthropic's SDKs retry a 502 on their own unless
            // told not to: a request that workers die on should not be sent
            // again by the client either.
            response
                .headers_mut()
                .insert(SHOULD_RETRY, HeaderValue::from_static("false"));
        }
        if let Some(value) = self.workers_retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, value.clone());
        } else if let Some(secs) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The header by which OpenAI's and Anthropic's client libraries let a
/// server say whether a failed request may be retried.
const SHOULD_RETRY: header::HeaderName = header::HeaderName::from_static("x-should-retry");

/// `: <message>` for a worker's message, nothing without one.
fn cause(message: &Option<String>) -> String {
    message
        .as_deref()
        .map_or_else(String::new, |m| format!(": {m}"))
}

/// An error and its sources on one line, `outer: cause: deeper cause`,
/// leaving out a cause whose text its parent already ends with.
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.ends_with(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Outer(#[source] std::io::Error);
        assert_eq!(chain(&Outer(io)), "client error (Connect): refused");
        #[derive(Debug, thiserror::Error)]
        #[error("tcp connect error: refused")]
        struct Repeats(#[source] std::io::Error);
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(chain(&Repeats(io)), "tcp connect error: refused");
    }

    #[test]
    fn statuses_and_bodies() {
        let unknown = GatewayError::UnknownModel { model: "x".into() };
        assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
        assert_eq!(unknown.origin(), Origin::Client);
        assert_eq!(unknown.body()["error"]["code"], "model_not_found");
        assert_eq!(unknown.body()["error"]["param"], "model");

        let full = GatewayError::QueueFull { queue_size: 3 };
        let response = full.into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn shutting_down_is_a_503_that_says_so() {
        let err = GatewayError::ShuttingDown;
        assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.origin(), Origin::Gateway);
        assert!(!err.retryable());
        let body = err.body();
        assert_eq!(body["error"]["message"], "the gateway is shutting down");
        assert_eq!(body["error"]["type"], "service_unavailable");
        assert_eq!(body["error"]["code"], "shutting_down");
        assert!(body["error"]["param"].is_null());
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn request_path_routing_errors_are_not_admin_errors() {
        let from = |err: RoutingError| GatewayError::from(err);
        let unknown = from(RoutingError::UnknownModel { model: "m".into() });
        assert!(matches!(unknown, GatewayError::UnknownModel { .. }));
        let required = from(RoutingError::ModelRequired {
            available: vec!["a".into(), "b".into()],
        });
        assert!(matches!(
            required,
            GatewayError::ModelRequired { served: 2 }
        ));
        let none = from(RoutingError::NoWorkers);
        assert_eq!(none.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(none.body()["error"]["code"], "no_healthy_worker");
        let unexpected = from(RoutingError::UnknownWorker { id: 3 });
        assert!(matches!(unexpected, GatewayError::Routing(_)));
        assert_eq!(unexpected.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(unexpected.origin(), Origin::Gateway);
        assert_eq!(chain(&unexpected), "routing failed: no worker with id 3");
        // The admin path keeps its own statuses.
        let duplicate = GatewayError::Admin(RoutingError::DuplicateWorker { url: "u".into() });
        assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    }

    #[test]
    fn only_transport_and_server_errors_retry() {
        let status = |s| GatewayError::UpstreamStatus {
            worker: "w".into(),
            status: s,
            message: None,
            retry_after: None,
        };
        assert!(status(StatusCode::INTERNAL_SERVER_ERROR).retryable());
        assert!(status(StatusCode::TOO_MANY_REQUESTS).retryable());
        assert!(!status(StatusCode::BAD_REQUEST).retryable());
        assert!(!GatewayError::Unauthorized.retryable());
        let exhausted = GatewayError::RetriesExhausted {
            attempts: 3,
            last: Box::new(status(StatusCode::SERVICE_UNAVAILABLE)),
        };
        assert_eq!(exhausted.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(exhausted.origin(), Origin::Upstream);
        assert!(
            exhausted
                .to_string()
                .starts_with("gave up after 3 attempts: ")
        );
        let once = GatewayError::RetriesExhausted {
            attempts: 1,
            last: Box::new(status(StatusCode::SERVICE_UNAVAILABLE)),
        };
        assert!(once.to_string().starts_with("gave up after 1 attempt: "));
    }

    /// A worker's `Retry-After` reaches the client as it said it, through
    /// the retries that ended on it; without one the router's own stands.
    #[test]
    fn the_last_workers_retry_after_is_passed_on() {
        let shed = |retry_after: Option<&'static str>| GatewayError::RetriesExhausted {
            attempts: 2,
            last: Box::new(GatewayError::Disaggregated {
                side: "decode",
                source: Box::new(GatewayError::UpstreamStatus {
                    worker: "w".into(),
                    status: StatusCode::TOO_MANY_REQUESTS,
                    message: None,
                    retry_after: retry_after.map(HeaderValue::from_static),
                }),
            }),
        };
        let response = shed(Some("Wed, 21 Oct 2037 07:28:00 GMT")).into_response();
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            response.headers()[header::RETRY_AFTER],
            "Wed, 21 Oct 2037 07:28:00 GMT"
        );
        let response = shed(None).into_response();
        assert!(!response.headers().contains_key(header::RETRY_AFTER));
        let response = GatewayError::NoHealthyWorker {
            model: None,
            why: "none".into(),
        }
        .into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "1");
    }
}
