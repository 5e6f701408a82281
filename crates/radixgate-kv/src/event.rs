//! The decoded events: what an engine says it stored in, or dropped from,
//! its GPU KV cache.
//!
//! Only GPU-resident blocks reach these types: the decoder drops events for
//! other media (CPU, disk offload tiers) because a request routed for them
//! would still pay a transfer, and the router matches on what a worker can
//! serve from its prefix cache.

use crate::keys;

/// An engine's own handle for one block.
///
/// Engines send block hashes as msgpack integers (signed or unsigned, 64
/// bit) or as byte strings of any length (vLLM's `ExternalBlockHash` is
/// `bytes | int`). We keep one `u64` either way: an integer as its 64-bit
/// two's-complement pattern, a byte string as a 64-bit digest of its bytes
/// (seeded apart from the token-key chain). The handle is only looked up
/// again for a later removal or as a parent, within one worker, so a digest
/// collision (about 2^-64 per pair) could at worst drop or misplace one
/// block of that worker; it costs no more than 8 bytes per entry, where
/// keeping the bytes would cost an allocation each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineHash(pub u64);

impl EngineHash {
    /// The handle of a hash sent as bytes.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self(keys::digest_bytes(bytes))
    }
}

/// `BlockStored`: consecutive full blocks now in the worker's GPU cache.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockStored {
    /// One engine hash per block, in chain order.
    pub block_hashes: Vec<EngineHash>,
    /// The engine hash of the block before the first one; `None` when the
    /// first block starts a sequence.
    pub parent: Option<EngineHash>,
    /// The token ids of all the blocks, `block_size` per block.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// The LoRA adapter the blocks were computed with (`None`: the base
    /// model). Blocks of different adapters never share keys.
    pub lora_id: Option<i64>,
    /// What else each block was computed with besides its tokens (vLLM's
    /// `extra_keys`: a request's `cache_salt`, an adapter's name, a
    /// multimodal input's hash), as a digest per block, 0 where none;
    /// empty where the event names none. A block with some, and every
    /// block after it, is in a cache namespace of its own: it never
    /// shares keys with the same tokens' blocks without.
    pub extra_keys: Vec<u64>,
}

/// One decoded event.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// Blocks stored.
    Stored(BlockStored),
    /// Blocks removed, by engine hash.
    Removed(Vec<EngineHash>),
    /// The worker's whole GPU cache was cleared.
    Cleared,
}

/// Events the decoder skipped, by reason; none of them is an error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Events with a tag this decoder does not know.
    pub unknown_tag: u32,
    /// Events whose `medium` is present and not `GPU`.
    pub other_medium: u32,
}

/// One decoded payload: `[timestamp, events, data_parallel_rank?]`.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// The publisher's timestamp (seconds since the epoch, as sent).
    pub ts: f64,
    /// The GPU events, in order.
    pub events: Vec<KvEvent>,
    /// The publisher's data-parallel rank, when it says.
    pub data_parallel_rank: Option<i64>,
    /// What was skipped.
    pub skipped: Skipped,
}

impl EventBatch {
    /// The block hashes and token ids the batch holds, and one per event:
    /// what its memory grows with.
    pub fn values(&self) -> usize {
        self.events
            .iter()
            .map(|e| match e {
                KvEvent::Stored(s) => 1 + s.block_hashes.len() + s.token_ids.len(),
                KvEvent::Removed(h) => 1 + h.len(),
                KvEvent::Cleared => 1,
            })
            .sum()
    }

    /// The number of blocks the batch's events name (stored plus removed),
    /// the unit of the ingest-rate figures.
    pub fn block_events(&self) -> usize {
        self.events
            .iter()
            .map(|e| match e {
                KvEvent::Stored(s) => s.block_hashes.len(),
                KvEvent::Removed(h) => h.len(),
                KvEvent::Cleared => 1,
            })
            .sum()
    }
}
