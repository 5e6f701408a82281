//! The one error type of the routing crate.
//!
//! Every error says where it came from ([`ErrorOrigin`]) and whether trying
//! again later may help ([`RoutingError::retryable`]), so the gateway can map
//! it to an HTTP status in one place: client errors to 4xx, "no worker can
//! take this right now" to 503, configuration errors to a start-up failure.

use thiserror::Error;

/// Who caused an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorOrigin {
    /// The request itself is wrong (unknown model, missing model).
    Client,
    /// The worker pool cannot take the request right now (all unhealthy).
    Pool,
    /// The operator's configuration or an admin call is wrong.
    Config,
}

/// Everything that can go wrong while configuring the router or choosing a
/// worker.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum RoutingError {
    /// No healthy worker serves the request's model (HTTP 503).
    #[error("no healthy worker is available for model `{model}`")]
    NoHealthyWorker {
        /// The model (pool key) the request was routed for.
        model: String,
    },
    /// No worker serves the requested model at all (HTTP 404).
    #[error("model `{model}` is not served by any worker")]
    UnknownModel {
        /// The model the client asked for.
        model: String,
    },
    /// The request named no model and several are served (HTTP 400).
    #[error("the request names no model and several are served: {}", available.join(", "))]
    ModelRequired {
        /// Models the client can choose from.
        available: Vec<String>,
    },
    /// The pool has no workers at all (HTTP 503).
    #[error("no workers are registered")]
    NoWorkers,
    /// A worker with this URL is already registered (admin API: 409).
    #[error("a worker with URL `{url}` is already registered")]
    DuplicateWorker {
        /// The URL that was added twice.
        url: String,
    },
    /// No registered worker has this id (admin API: 404).
    #[error("no worker with id {id}")]
    UnknownWorker {
        /// The id that was looked up.
        id: u32,
    },
    /// A worker description is malformed (admin API: 400; start-up error).
    #[error("invalid worker `{url}`: {reason}")]
    InvalidWorker {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value is out of range (start-up error).
    #[error("invalid routing configuration: `{field}` {reason}")]
    InvalidConfig {
        /// The configuration key, as spelled in the config file.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
}

impl RoutingError {
    /// Who caused this error.
    pub fn origin(&self) -> ErrorOrigin {
        match self {
            Self::UnknownModel { .. } | Self::ModelRequired { .. } => ErrorOrigin::Client,
            Self::NoHealthyWorker { .. } | Self::NoWorkers => ErrorOrigin::Pool,
            Self::DuplicateWorker { .. }
            | Self::UnknownWorker { .. }
            | Self::InvalidWorker { .. }
            | Self::InvalidConfig { .. } => ErrorOrigin::Config,
        }
    }

    /// Whether the same request may succeed if tried again later (workers may
    /// recover); the gateway uses this to decide on `Retry-After`.
    pub fn retryable(&self) -> bool {
        self.origin() == ErrorOrigin::Pool
    }

    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }
}
