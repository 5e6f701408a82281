//! The simulated LLM worker (KV cache and timing model, HTTP server), the
//! workload generators, the `load` tool radixgate is measured with, and the
//! offline cluster simulator (`simulate`) that runs the routing policies
//! against the same worker model in simulated time, and `tune`, which runs
//! it over a recording of real traffic to pick the routing settings.

pub mod engine;
pub mod error;
pub mod load;
pub mod server;
pub mod simulate;
pub mod tokens;
pub mod tune;
pub mod workload;

pub use error::SimError;
