//! radixgate-kv: what workers really hold, from their engines' KV-cache
//! events.
//!
//! - [`wire`] decodes the engines' ZMQ messages (SGLang and vLLM, both
//!   payload shapes) and holds the replay protocol's pure helpers;
//! - [`keys`] computes our own chained block keys from token ids;
//! - [`index`] maps those keys to the workers holding them, per model.
//!
//! The library does no I/O: the gateway owns the sockets and decides what a
//! gap or a decoding error means for routing (see the crate README for the
//! measured costs).

pub mod error;
pub mod event;
pub mod index;
pub mod keys;
pub mod wire;

pub use error::WireError;
pub use event::{BlockStored, EngineHash, EventBatch, KvEvent, Skipped};
pub use index::{ApplyStats, IndexLimits, KvIndex, WorkerKey};
