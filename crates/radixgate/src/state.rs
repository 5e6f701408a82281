//! What every handler shares: configuration, the routing handle, the control
//! handle and the worker client. Built once in [`crate::server`], read-only
//! afterwards (all mutable state lives behind its own handle), so it is
//! shared as a plain `Arc` without locks.

use crate::config::Config;
use crate::control::Control;
use radixgate_routing::Router;
use std::time::Instant;

/// Shared state of one gateway.
pub(crate) struct AppState {
    pub(crate) config: Config,
    pub(crate) router: Router,
    pub(crate) control: Control,
    pub(crate) client: reqwest::Client,
    pub(crate) started: Instant,
}
