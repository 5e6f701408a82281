//! Routing decisions for radixgate: workers, their load and health, and the
//! policies that choose a worker for a request. No HTTP lives here.
//!
//! How the pieces fit:
//! - a [`PolicyConfig`] (serde) builds a [`Policy`];
//! - a [`Registry`] is the single writer of the worker set; it publishes
//!   immutable [`WorkerSet`] snapshots and tells the policy of additions and
//!   removals;
//! - a [`Router`] (cloned into every request handler) resolves a request's
//!   model to a [`Pool`] and asks the policy, lock-free, leaving out the
//!   workers a retry already tried ([`Router::select`] → [`Routed`]);
//! - the resulting [`Decision`] holds a [`LoadGuard`] on the chosen worker
//!   and an [`Explanation`]; the guard's drop is the only way load goes down;
//! - [`PeerLoads`] and [`Router::learn`] take in what other router
//!   replicas report (their load, their decisions), so every replica routes
//!   on the pool's whole state;
//! - [`ExactMatches`] carry what engines' KV events say each worker holds,
//!   for the workers whose event stream is live ([`Router::select_exact`]);
//! - [`spawn_eviction`] runs the policy's tree eviction on a timer;
//! - [`text`] turns a request into its [`RoutingText`], the one rule both
//!   the gateway and the simulator use, marked with its [`CacheNamespace`]
//!   when the engine would keep its cache apart.
//!
//! Nothing here reads a wall clock while deciding, so the offline simulator
//! drives the same code in simulated time.
//!
//! ```
//! use radixgate_routing::{PolicyConfig, Registry, WorkerSpec};
//!
//! let policy = PolicyConfig::default().build()?; // cache_aware, validated
//! let mut registry = Registry::new(policy);       // the one writer
//! registry.add(WorkerSpec::new("http://10.0.0.1:30000").with_models(["llama"]))?;
//! registry.add(WorkerSpec::new("http://10.0.0.2:30000").with_models(["llama"]))?;
//! let router = registry.router();                 // cloned into handlers
//!
//! let routed = router.select(Some("llama"), "<user>hello", None, &[])?;
//! assert_eq!(routed.model.as_deref(), Some("llama")); // the metrics label
//! let decision = routed.decision;
//! let header = decision.rendered().to_string(); // x-radixgate-decision
//! let mut guard = decision.into_guard();          // lives in the response body
//! assert_eq!(guard.worker().load(), 1);
//! guard.prefill_done();                            // first token arrived
//! drop(guard);                                     // end of stream: load released
//! assert!(header.starts_with("cache_aware branch="));
//! # Ok::<(), radixgate_routing::RoutingError>(())
//! ```

mod config;
pub mod correction;
pub mod cost;
mod error;
mod eviction;
mod exact;
mod guard;
mod mix;
mod namespace;
mod peer_load;
pub mod policy;
mod registry;
mod request;
mod settings;
mod snapshot;
mod spec;
pub mod text;
mod worker;

pub use config::{
    CacheAwareConfig, ConsistentHashConfig, HotSpotRule, LeastLoadConfig, LowMatchTarget,
    PolicyConfig, PowerOfTwoConfig, PrefillAwareConfig, RandomConfig, RoundRobinConfig,
};
pub use correction::{CacheFeedback, CacheReport, CacheTruthSnapshot, Corrected, CorrectionConfig};
pub use cost::{Coefficients, CostModelConfig, Work};
pub use error::{ErrorOrigin, RoutingError};
pub use eviction::spawn_eviction;
pub use exact::ExactMatches;
pub use guard::{LoadGuard, Observation};
pub use namespace::CacheNamespace;
pub use peer_load::{PeerLoad, PeerLoads};
pub use policy::{Branch, Decision, Explanation, Policy, Rendered};
pub use radixgate_tree::TenantId;
pub use registry::{Learned, Registry, Routed, Router};
pub use request::RequestView;
pub use settings::POLICY_KEY;
pub use snapshot::{Pool, WILDCARD_MODEL, WorkerSet};
pub use spec::{ModelOrigin, WorkerRole, WorkerSpec, WorkerUrl, check_models, unnameable};
pub use text::{Api, RoutingText};
pub use worker::{ApiKey, BreakerState, Models, ReportedLoad, Worker, WorkerId};
