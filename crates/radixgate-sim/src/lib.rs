//! The simulated LLM worker (KV cache and timing model, HTTP server), the
//! workload generators and the `load` tool radixgate is measured with.

pub mod engine;
pub mod error;
pub mod load;
pub mod server;
pub mod tokens;
pub mod workload;

pub use error::SimError;
