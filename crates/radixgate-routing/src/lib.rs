//! Routing decisions for radixgate: workers, their load and health, and the
//! policies that choose a worker for a request. No HTTP lives here.
//!
//! How the pieces fit:
//! - a [`PolicyConfig`] (serde) builds a [`Policy`];
//! - a [`Registry`] is the single writer of the worker set; it publishes
//!   immutable [`WorkerSet`] snapshots and tells the policy of additions and
//!   removals;
//! - a [`Router`] (cloned into every request handler) resolves a request's
//!   model to a [`Pool`] and asks the policy, lock-free;
//! - the resulting [`Decision`] holds a [`LoadGuard`] on the chosen worker
//!   and an [`Explanation`]; the guard's drop is the only way load goes down;
//! - [`spawn_eviction`] runs the policy's tree eviction on a timer.
//!
//! Nothing here reads a wall clock while deciding, so the offline simulator
//! drives the same code in simulated time.

mod config;
mod error;
mod eviction;
mod guard;
mod mix;
pub mod policy;
mod registry;
mod request;
mod snapshot;
mod worker;

pub use config::{
    CacheAwareConfig, ConsistentHashConfig, HotSpotRule, LeastLoadConfig, LowMatchTarget,
    PolicyConfig, PowerOfTwoConfig, PrefillAwareConfig, RandomConfig, RoundRobinConfig,
};
pub use error::{ErrorOrigin, RoutingError};
pub use eviction::spawn_eviction;
pub use guard::LoadGuard;
pub use policy::{Branch, Decision, Explanation, Policy};
pub use radixgate_tree::TenantId;
pub use registry::{Registry, Router};
pub use request::RequestView;
pub use snapshot::{Pool, WILDCARD_MODEL, WorkerSet};
pub use worker::{BreakerState, ReportedLoad, Worker, WorkerId, WorkerSpec};
