//! The radixgate gateway: the HTTP router in front of a pool of LLM workers.

pub mod admission;
pub mod breaker;
pub mod config;
pub mod error;
pub mod inspect;
pub mod metrics;
pub mod stream;
