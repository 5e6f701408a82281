//! The radixgate gateway: the HTTP router in front of a pool of LLM workers.
//!
//! [`server::run`] serves a [`config::Config`] on a listener. The request
//! path is [`proxy`]; worker membership and health live in one control task
//! ([`control`], [`health`]); everything a handler shares is in `state`.
//!
//! The library never needs the simulator: `radixgate-sim` is an optional
//! dependency of the `radixgate` binary alone, whose `worker`, `load`,
//! `simulate` and `demo` subcommands sit behind the default `sim` feature.

mod admin;
pub mod admission;
pub mod allowlist;
mod auth;
pub mod body;
pub mod breaker;
pub mod config;
pub mod control;
mod cors;
mod dashboard;
#[cfg(feature = "kubernetes")]
pub mod discovery;
pub mod error;
mod events;
mod health;
mod info;
pub mod inspect;
mod listen;
pub mod metrics;
mod outlier;
pub mod preamble;
pub mod proxy;
mod pulse;
pub mod record;
pub mod reload;
mod responses;
pub mod retry;
pub mod server;
mod state;
pub mod stream;
mod sync;
pub mod tenants;
pub mod trace;
mod upkeep;
pub mod upstream;
pub mod usage;
mod via;
