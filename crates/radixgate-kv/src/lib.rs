//! radixgate-kv: what workers really hold, from their engines' KV-cache
//! events.
//!
//! - [`wire`] decodes the engines' ZMQ messages (SGLang and vLLM, both
//!   payload shapes) and holds the replay protocol's pure helpers;
//! - [`keys`] computes our own chained block keys from token ids;
//! - [`index`] maps those keys to the workers holding them, per model;
//! - [`subscribe`] follows one engine's publisher over ZMQ (gaps, replay,
//!   reconnects) and reports batches and the stream's standing, each
//!   connection behind a size guard (`guard.rs`).
//!
//! Only [`subscribe`] does I/O. The gateway decides what a stale stream
//! means for routing. The crate README has the measured costs.

pub mod error;
pub mod event;
mod guard;
pub mod index;
pub mod keys;
pub mod subscribe;
pub mod wire;

pub use error::WireError;
pub use event::{BlockStored, EngineHash, EventBatch, KvEvent, Skipped};
pub use index::{
    ApplyStats, IndexLimits, KvIndex, MAX_BLOCK_SIZES, MAX_BLOCK_SIZES_PER_WORKER, WorkerKey,
};
