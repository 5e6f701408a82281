//! The simulated LLM worker (KV cache and timing model, HTTP server), the
//! workload generators and the `load` tool radixgate is measured with.

mod error;
pub mod load;
pub mod workload;

pub use error::SimError;
