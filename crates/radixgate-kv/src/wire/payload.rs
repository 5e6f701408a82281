//! The msgpack payload of one message: an event batch.
//!
//! Both engines encode with msgspec. Facts this decoder relies on, from
//! vLLM's `vllm/distributed/kv_events.py` and SGLang's
//! `python/sglang/srt/disaggregation/kv_events.py` (public sources, several
//! versions read):
//!
//! - The batch is `EventBatch(ts: float, events: list, data_parallel_rank:
//!   int | None = None)`, `array_like` in SGLang and in vLLM through 2025,
//!   so `[ts, events]` or `[ts, events, rank]` (`omit_defaults` drops a
//!   trailing default). One later vLLM version encodes it as a map with
//!   those three names, so both are read.
//! - Events are tagged structs (`tag=True`: the tag is the class name, and
//!   the tag field of a map is `"type"`). As arrays (SGLang, vLLM through
//!   2025) the tag comes first and fields follow in declaration order:
//!   `BlockStored`: block_hashes, parent_block_hash, token_ids, block_size,
//!   lora_id, then (vLLM) medium, lora_name, and later optional fields
//!   (extra_keys, group_idx, ...); `BlockRemoved`: block_hashes, then (vLLM)
//!   medium, group_idx, ...; `AllBlocksCleared`: nothing. Since 2026 vLLM
//!   drops `array_like` on events, so they arrive as maps with those names.
//! - `medium` is `"GPU"` for the GPU cache (vLLM's `MEDIUM_GPU`); other
//!   tiers ("CPU", offload tiers) are skipped here. Missing or nil means GPU
//!   (SGLang and older vLLM have no medium field).
//! - Hashes are `int` (SGLang, older vLLM) or `bytes | int` (vLLM's
//!   `ExternalBlockHash`).
//! - vLLM's `extra_keys` is `list[tuple | None] | None`, one entry per
//!   block: what else the block's hash was computed with (a multimodal
//!   input's hash, the adapter's name, the request's `cache_salt`).
//!
//! Leniency: unknown map keys and extra trailing array fields are ignored,
//! so newer engines' additions decode; unknown tags are counted and
//! skipped. Strictness: a missing or mistyped field we need fails the whole
//! batch, because applying half of a batch would silently desynchronise the
//! index.

use rmpv::ValueRef;

use crate::error::WireError;
use crate::event::{BlockStored, EngineHash, EventBatch, KvEvent, Skipped};
use crate::keys;

/// Our payloads nest at most 5 deep (batch, events, event, hashes, hash);
/// newer optional fields (extra_keys) add 2. The bound keeps hostile
/// nesting from recursing deep.
const MAX_DEPTH: usize = 16;

/// The most msgpack values one payload may hold (each map entry counts
/// two). The decoder first builds a tree of the payload's values at about
/// 40 bytes each, so a payload of one-byte values within the size limit
/// (64 MiB by default) took 2.6 GB to decode; this bound keeps that under
/// about 170 MB. An engine's batch for a million-token prompt at one token
/// per block (SGLang's default page) is about 2 Mi values.
pub const MAX_PAYLOAD_VALUES: usize = 1 << 22;

/// Decodes one msgpack payload into an event batch. A payload of more than
/// [`MAX_PAYLOAD_VALUES`] values is refused before it is decoded.
pub fn decode_payload(bytes: &[u8]) -> Result<EventBatch, WireError> {
    // Every value takes at least a byte: a payload no longer than the
    // limit is not counted (an engine's ordinary batch is a few KiB; the
    // count cost 13% of decoding one).
    if bytes.len() > MAX_PAYLOAD_VALUES
        && count_values(bytes, MAX_PAYLOAD_VALUES) > MAX_PAYLOAD_VALUES
    {
        return Err(WireError::TooManyValues {
            limit: MAX_PAYLOAD_VALUES,
        });
    }
    let mut rd = bytes;
    let value = rmpv::decode::read_value_ref_with_max_depth(&mut rd, MAX_DEPTH)?;
    if !rd.is_empty() {
        return Err(WireError::TrailingBytes(rd.len()));
    }
    batch(&value)
}

fn batch(value: &ValueRef<'_>) -> Result<EventBatch, WireError> {
    let (ts, events, rank) = match value {
        ValueRef::Array(items) => (items.first(), items.get(1), items.get(2)),
        ValueRef::Map(entries) => (
            field(entries, "ts"),
            field(entries, "events"),
            field(entries, "data_parallel_rank"),
        ),
        _ => return Err(WireError::shape("payload", "an array or a map")),
    };
    let ts = match ts {
        Some(ValueRef::F64(f)) => *f,
        Some(ValueRef::F32(f)) => f64::from(*f),
        Some(ValueRef::Integer(i)) => i.as_f64().unwrap_or(f64::NAN),
        _ => return Err(WireError::shape("ts", "a number")),
    };
    let Some(ValueRef::Array(items)) = events else {
        return Err(WireError::shape("events", "an array"));
    };
    let data_parallel_rank = match rank {
        None | Some(ValueRef::Nil) => None,
        Some(ValueRef::Integer(i)) => Some(
            i.as_i64()
                .ok_or(WireError::shape("data_parallel_rank", "an i64"))?,
        ),
        Some(_) => return Err(WireError::shape("data_parallel_rank", "an integer or nil")),
    };
    let mut out = EventBatch {
        ts,
        events: Vec::with_capacity(items.len()),
        data_parallel_rank,
        skipped: Skipped::default(),
    };
    for item in items {
        event(item, &mut out)?;
    }
    Ok(out)
}

/// The fields of one event, whichever shape it came in.
struct Fields<'v, 'a> {
    tag: &'v str,
    shape: Shape<'v, 'a>,
}

enum Shape<'v, 'a> {
    /// The fields after the tag, in declaration order.
    Array(&'v [ValueRef<'a>]),
    Map(&'v [(ValueRef<'a>, ValueRef<'a>)]),
}

impl<'v, 'a> Fields<'v, 'a> {
    /// Field `index` (after the tag) of the array shape, `name` of the map
    /// shape.
    fn get(&self, index: usize, name: &str) -> Option<&'v ValueRef<'a>> {
        match self.shape {
            Shape::Array(items) => items.get(index),
            Shape::Map(entries) => field(entries, name),
        }
    }
}

fn event(value: &ValueRef<'_>, out: &mut EventBatch) -> Result<(), WireError> {
    let fields = match value {
        ValueRef::Array(items) => match items.split_first() {
            Some((tag, rest)) => Fields {
                tag: as_str(tag).ok_or(WireError::shape("event", "a tag string first"))?,
                shape: Shape::Array(rest),
            },
            None => return Err(WireError::shape("event", "a non-empty array")),
        },
        ValueRef::Map(entries) => Fields {
            tag: field(entries, "type")
                .and_then(as_str)
                .ok_or(WireError::shape("event", "a \"type\" string"))?,
            shape: Shape::Map(entries),
        },
        _ => return Err(WireError::shape("event", "an array or a map")),
    };
    match fields.tag {
        "BlockStored" => {
            let at = "BlockStored";
            let block_hashes = hashes(fields.get(0, "block_hashes"), at)?;
            let parent = match fields.get(1, "parent_block_hash") {
                None if matches!(fields.shape, Shape::Array(_)) => {
                    return Err(WireError::shape(at, "parent_block_hash"));
                }
                None | Some(ValueRef::Nil) => None,
                Some(v) => Some(hash(v, at)?),
            };
            let token_ids = tokens(fields.get(2, "token_ids"))?;
            let block_size = match fields.get(3, "block_size") {
                Some(ValueRef::Integer(i)) => i
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|&n| n > 0),
                _ => None,
            }
            .ok_or(WireError::shape("block_size", "a positive u32"))?;
            let lora_id = match fields.get(4, "lora_id") {
                None | Some(ValueRef::Nil) => None,
                Some(ValueRef::Integer(i)) => {
                    Some(i.as_i64().ok_or(WireError::shape("lora_id", "an i64"))?)
                }
                Some(_) => return Err(WireError::shape("lora_id", "an integer or nil")),
            };
            if !on_gpu(fields.get(5, "medium"))? {
                out.skipped.other_medium += 1;
                return Ok(());
            }
            let named = matches!(fields.shape, Shape::Map(_));
            let extra_keys = extra_keys(fields.get(7, "extra_keys"), block_hashes.len(), named)?;
            out.events.push(KvEvent::Stored(BlockStored {
                block_hashes,
                parent,
                token_ids,
                block_size,
                lora_id,
                extra_keys,
            }));
        }
        "BlockRemoved" => {
            let block_hashes = hashes(fields.get(0, "block_hashes"), "BlockRemoved")?;
            if !on_gpu(fields.get(1, "medium"))? {
                out.skipped.other_medium += 1;
                return Ok(());
            }
            out.events.push(KvEvent::Removed(block_hashes));
        }
        "AllBlocksCleared" => out.events.push(KvEvent::Cleared),
        _ => out.skipped.unknown_tag += 1,
    }
    Ok(())
}

fn field<'v, 'a>(
    entries: &'v [(ValueRef<'a>, ValueRef<'a>)],
    name: &str,
) -> Option<&'v ValueRef<'a>> {
    entries
        .iter()
        .find(|(k, _)| as_str(k) == Some(name))
        .map(|(_, v)| v)
}

fn as_str<'v>(value: &'v ValueRef<'_>) -> Option<&'v str> {
    match value {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

/// vLLM's `extra_keys` (`list[tuple | None] | None`, one entry per block):
/// a digest of each block's entry, 0 for nil or empty; empty for nil,
/// missing, or no block with any. The digest is of the entry's msgpack
/// bytes, so that any two entries that differ (two salts, two images)
/// differ. Another shape is refused where the field is `named` (a map);
/// in an array, where the field is only a place, another engine's or
/// version's field may stand there: it is taken for none.
fn extra_keys(
    value: Option<&ValueRef<'_>>,
    blocks: usize,
    named: bool,
) -> Result<Vec<u64>, WireError> {
    let entries = match value {
        None | Some(ValueRef::Nil) => return Ok(Vec::new()),
        Some(ValueRef::Array(entries)) if entries.len() == blocks => entries,
        Some(_) if !named => return Ok(Vec::new()),
        Some(_) => {
            return Err(WireError::shape(
                "extra_keys",
                "nil or an array of one entry per block",
            ));
        }
    };
    let mut bytes = Vec::new();
    let digest = |entry: &ValueRef<'_>, bytes: &mut Vec<u8>| match entry {
        ValueRef::Nil => 0,
        ValueRef::Array(items) if items.is_empty() => 0,
        entry => {
            bytes.clear();
            // Writing to a Vec does not fail.
            let _ = rmpv::encode::write_value_ref(bytes, entry);
            keys::digest_bytes(bytes).max(1)
        }
    };
    let digests: Vec<u64> = entries.iter().map(|e| digest(e, &mut bytes)).collect();
    match digests.iter().all(|&d| d == 0) {
        true => Ok(Vec::new()),
        false => Ok(digests),
    }
}

/// Missing or nil medium is GPU; a string is compared case-insensitively.
fn on_gpu(medium: Option<&ValueRef<'_>>) -> Result<bool, WireError> {
    match medium {
        None | Some(ValueRef::Nil) => Ok(true),
        Some(v) => as_str(v)
            .map(|s| s.eq_ignore_ascii_case("GPU"))
            .ok_or(WireError::shape("medium", "a string or nil")),
    }
}

fn hash(value: &ValueRef<'_>, at: &'static str) -> Result<EngineHash, WireError> {
    match value {
        // Signed values keep their two's-complement bit pattern.
        ValueRef::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|n| n as u64))
            .map(EngineHash)
            .ok_or(WireError::shape(at, "block hashes as integers or bytes")),
        ValueRef::Binary(b) => Ok(EngineHash::from_bytes(b)),
        _ => Err(WireError::shape(at, "block hashes as integers or bytes")),
    }
}

fn hashes(value: Option<&ValueRef<'_>>, at: &'static str) -> Result<Vec<EngineHash>, WireError> {
    match value {
        Some(ValueRef::Array(items)) => items.iter().map(|v| hash(v, at)).collect(),
        _ => Err(WireError::shape(at, "block_hashes as an array")),
    }
}

fn tokens(value: Option<&ValueRef<'_>>) -> Result<Vec<u32>, WireError> {
    let Some(ValueRef::Array(items)) = value else {
        return Err(WireError::shape("token_ids", "an array"));
    };
    items
        .iter()
        .map(|v| match v {
            ValueRef::Integer(i) => i.as_u64().and_then(|n| u32::try_from(n).ok()),
            _ => None,
        })
        .collect::<Option<Vec<u32>>>()
        .ok_or(WireError::shape("token_ids", "integers in 0..2^32"))
}

/// Counts the msgpack values in `bytes` (an array's elements and a map's
/// keys and values each count), reading only markers and lengths, and stops
/// once past `limit` (returning `limit + 1`). Bytes that are not msgpack,
/// or end early, end the count where they begin: the decoder then says
/// what is wrong with them.
pub fn count_values(bytes: &[u8], limit: usize) -> usize {
    let mut at = 0usize;
    // Read a big-endian length of `n` bytes.
    let length = |at: &mut usize, n: usize| -> Option<u64> {
        let field = bytes.get(*at..*at + n)?;
        *at += n;
        Some(field.iter().fold(0u64, |v, &b| (v << 8) | u64::from(b)))
    };
    let mut pending: u64 = 1;
    let mut count = 0usize;
    while pending > 0 {
        if count > limit {
            return limit + 1;
        }
        let Some(&marker) = bytes.get(at) else {
            break;
        };
        at += 1;
        pending -= 1;
        count += 1;
        // Bytes of payload after the marker, and values it holds.
        let (skip, holds) = match marker {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, 0),
            0x80..=0x8f => (0, 2 * u64::from(marker & 0x0f)),
            0x90..=0x9f => (0, u64::from(marker & 0x0f)),
            0xa0..=0xbf => (u64::from(marker & 0x1f), 0),
            0xcc | 0xd0 => (1, 0),
            0xcd | 0xd1 => (2, 0),
            0xca | 0xce | 0xd2 => (4, 0),
            0xcb | 0xcf | 0xd3 => (8, 0),
            // fixext: a type byte and 1, 2, 4, 8 or 16 bytes.
            0xd4..=0xd8 => (1 + (1 << (marker - 0xd4)), 0),
            // bin and str: a length, then the bytes.
            0xc4 | 0xd9 => (length(&mut at, 1).unwrap_or(u64::MAX), 0),
            0xc5 | 0xda => (length(&mut at, 2).unwrap_or(u64::MAX), 0),
            0xc6 | 0xdb => (length(&mut at, 4).unwrap_or(u64::MAX), 0),
            // ext: a length, a type byte, then the bytes.
            0xc7 => (length(&mut at, 1).map_or(u64::MAX, |n| n + 1), 0),
            0xc8 => (length(&mut at, 2).map_or(u64::MAX, |n| n + 1), 0),
            0xc9 => (length(&mut at, 4).map_or(u64::MAX, |n| n + 1), 0),
            0xdc => (0, length(&mut at, 2).unwrap_or(0)),
            0xdd => (0, length(&mut at, 4).unwrap_or(0)),
            0xde => (0, length(&mut at, 2).map_or(0, |n| 2 * n)),
            0xdf => (0, length(&mut at, 4).map_or(0, |n| 2 * n)),
            // 0xc1 is never used.
            _ => break,
        };
        match usize::try_from(skip).ok().and_then(|n| at.checked_add(n)) {
            Some(next) if next <= bytes.len() => at = next,
            _ => break,
        }
        pending = pending.saturating_add(holds);
    }
    count
}
