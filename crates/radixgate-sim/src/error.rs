//! The one error type of the simulation crate.
//!
//! Each variant says where the fault lies: bad configuration or input from
//! the operator/client (`Config`, `BadRequest`, `PayloadTooLarge`, and the
//! load tool's `TraceIo`, `TraceFormat`, `BadUrl`), a
//! deliberately injected fault (`InjectedFault`), or the process itself
//! (`Io`, `EngineGone`), or the other worker of a prefill/decode pair
//! (`KvTransfer`), or the routing code the simulator drives
//! (`Routing`), or the targets a load run measured (`TooManyFailures`,
//! `NothingFinished`: the run itself went as asked). The HTTP server maps
//! these to status codes in exactly one place (`server::error_response`).

use thiserror::Error;

/// Errors of the simulated worker, its engine, the workloads and the load tool.
#[derive(Debug, Error)]
pub enum SimError {
    /// A configuration value is out of range or inconsistent (start-up error).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The client sent a request the worker cannot serve (HTTP 400).
    #[error("{message}")]
    BadRequest {
        /// What was wrong, for the client.
        message: String,
        /// The offending field, when there is one.
        param: Option<String>,
    },
    /// No such endpoint (HTTP 404).
    #[error("no such endpoint: {0}")]
    NotFound(String),
    /// A Responses API id this worker does not hold: never made here,
    /// deleted, or not stored (HTTP 404).
    #[error("Response with id '{id}' not found.")]
    ResponseNotFound {
        /// The id asked for.
        id: String,
        /// The field that named it (`previous_response_id`), if a body did.
        param: Option<&'static str>,
    },
    /// The request names a model this worker does not serve, under the
    /// `strict_models` knob (HTTP 404), in vLLM's words.
    #[error("The model `{model}` does not exist.")]
    ModelNotFound {
        /// The model named.
        model: String,
    },
    /// The request body is larger than the configured limit (HTTP 413).
    #[error("request body exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The configured limit in bytes.
        limit: usize,
    },
    /// A fault injected on purpose by the fault knobs (HTTP 500/503).
    #[error("injected fault: {0}")]
    InjectedFault(&'static str),
    /// The worker is starting or marked unhealthy (HTTP 503).
    #[error("worker unavailable: {0}")]
    Unavailable(&'static str),
    /// The engine task has stopped (shutdown in progress; HTTP 503).
    #[error("engine stopped")]
    EngineGone,
    /// A prefill/decode KV transfer failed: on a prefill worker, a pull
    /// it cannot answer; on a decode worker, a pull that failed or timed
    /// out (the prefill side's fault, or the link's).
    #[error("KV transfer for room {room}: {reason}")]
    KvTransfer {
        /// The room (SGLang) or transfer id (vLLM).
        room: String,
        /// What went wrong, for the client.
        reason: String,
        /// Which failure it is (decides the HTTP status).
        failure: TransferFailure,
    },
    /// A trace file could not be read (operator's fault).
    #[error("cannot read trace file {path}")]
    TraceIo {
        /// The file.
        path: std::path::PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A trace line is not the expected JSON (operator's fault).
    #[error("trace file {path} line {line}: {reason}")]
    TraceFormat {
        /// The file.
        path: std::path::PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A load-tool target URL cannot be used (operator's fault).
    #[error("bad --url {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// `radixgate load` ran, but more of its requests failed than
    /// `--max-error-rate` allows: the targets' fault (or a wrong `--url`),
    /// reported as a failed run so scripts and CI see it.
    #[error(
        "{failed} of {finished} requests failed ({errors}), more than --max-error-rate {max_error_rate} allows{hint}"
    )]
    TooManyFailures {
        /// Requests that failed.
        failed: u64,
        /// Requests that finished, failed or not.
        finished: u64,
        /// The failures by kind, e.g. `connect 200`.
        errors: String,
        /// What to check, when the kinds or the targets say (nothing
        /// listens; the targets that failed every request).
        hint: String,
        /// The `--max-error-rate` given.
        max_error_rate: f64,
    },
    /// `radixgate load` ran, but no request finished, so nothing was
    /// measured.
    #[error("no request finished, so nothing was measured")]
    NothingFinished,
    /// A socket could not be bound or accepted.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// A routing policy could not be built or refused a request (the offline
    /// simulator; a bad `--policies`/`--sweep` value is the operator's fault).
    #[error(transparent)]
    Routing(#[from] radixgate_routing::RoutingError),
}

/// How a KV transfer failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferFailure {
    /// Prefill side: no ready KV for the room (HTTP 404).
    NotFound,
    /// Prefill side: the room's prefill failed or was cancelled (HTTP 500).
    PrefillFailed,
    /// Decode side: the prefill worker could not be reached, dropped the
    /// pull, or answered an error (HTTP 502).
    Unreachable,
    /// Decode side: the KV did not arrive within the transfer timeout
    /// (HTTP 504).
    TimedOut,
}

impl SimError {
    /// A 400-class error about one request field.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::BadRequest {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// Whether retrying the same request elsewhere may succeed.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            Self::InjectedFault(_)
                | Self::Unavailable(_)
                | Self::EngineGone
                | Self::Io(_)
                | Self::KvTransfer { .. }
        )
    }
}
