//! The msgpack payload of one event batch, in either shape.
//!
//! Field lists and order follow the engines' msgspec structs (vLLM
//! `vllm/distributed/kv_events.py`, SGLang
//! `python/sglang/srt/disaggregation/kv_events.py`):
//! - `EventBatch`: `ts` (float seconds since the epoch), `events`,
//!   `data_parallel_rank` (int; a default of `None` that msgspec's
//!   `omit_defaults` leaves out when unset);
//! - `BlockStored`: `block_hashes`, `parent_block_hash` (or nil),
//!   `token_ids`, `block_size`, `lora_id` (nil here), `medium` (`"GPU"`);
//!   vLLM's map form also always carries `lora_name` (nil here), a field
//!   with no default;
//! - `BlockRemoved`: `block_hashes`, `medium`;
//! - `AllBlocksCleared`: no fields.
//!
//! msgspec's `tag=True` names an event by its class name: the first element
//! of the array form, the `type` key of the map form. The array form is
//! what `array_like=True` structs encode to; the map form is what they
//! encode to without it (vLLM dropped `array_like` from `EventBatch` and
//! `KVCacheEvent`, so there the batch itself is a map too).
//!
//! Written with `rmp`'s low-level writers straight into one buffer: no
//! value tree per event. Writing into a `Vec` cannot fail.

use rmp::encode as w;

use super::{EventShape, HashFormat};
use crate::engine::CacheEvent;

/// The `medium` of every event: the simulated cache is GPU memory.
const MEDIUM_GPU: &str = "GPU";

/// How to write one batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Format {
    pub(crate) shape: EventShape,
    pub(crate) hash: HashFormat,
    pub(crate) block_size: usize,
    pub(crate) data_parallel_rank: Option<u32>,
}

/// The msgpack payload of a batch of `events` stamped `ts`.
pub(crate) fn encode_batch(f: &Format, ts: f64, events: &[CacheEvent]) -> Vec<u8> {
    let tokens: usize = events
        .iter()
        .map(|e| match e {
            CacheEvent::Stored { tokens, .. } => tokens.len(),
            _ => 0,
        })
        .sum();
    let mut out = Vec::with_capacity(64 + 40 * events.len() + 9 * tokens);
    let o = &mut out;
    let fields = 2 + u32::from(f.data_parallel_rank.is_some());
    match f.shape {
        EventShape::Array => ok(w::write_array_len(o, fields)),
        EventShape::Map => {
            ok(w::write_map_len(o, fields));
            ok(w::write_str(o, "ts"));
        }
    }
    ok(w::write_f64(o, ts));
    if f.shape == EventShape::Map {
        ok(w::write_str(o, "events"));
    }
    ok(w::write_array_len(o, len32(events.len())));
    for e in events {
        event(o, f, e);
    }
    if let Some(rank) = f.data_parallel_rank {
        if f.shape == EventShape::Map {
            ok(w::write_str(o, "data_parallel_rank"));
        }
        ok(w::write_uint(o, u64::from(rank)));
    }
    out
}

fn event(o: &mut Vec<u8>, f: &Format, e: &CacheEvent) {
    let map = f.shape == EventShape::Map;
    // Writes the tag and opens the container for `n` fields after it.
    let open = |o: &mut Vec<u8>, tag: &str, n: u32| {
        if map {
            ok(w::write_map_len(o, n + 1));
            ok(w::write_str(o, "type"));
        } else {
            ok(w::write_array_len(o, n + 1));
        }
        ok(w::write_str(o, tag));
    };
    let key = |o: &mut Vec<u8>, k: &str| {
        if map {
            ok(w::write_str(o, k));
        }
    };
    match e {
        CacheEvent::Stored {
            hashes,
            parent,
            tokens,
        } => {
            open(o, "BlockStored", if map { 7 } else { 6 });
            key(o, "block_hashes");
            hash_list(o, f, hashes);
            key(o, "parent_block_hash");
            match parent {
                Some(p) => hash(o, f, *p),
                None => ok(w::write_nil(o)),
            }
            key(o, "token_ids");
            ok(w::write_array_len(o, len32(tokens.len())));
            for &t in tokens {
                ok(w::write_uint(o, t));
            }
            key(o, "block_size");
            ok(w::write_uint(o, f.block_size as u64));
            key(o, "lora_id");
            ok(w::write_nil(o));
            key(o, "medium");
            ok(w::write_str(o, MEDIUM_GPU));
            if map {
                key(o, "lora_name");
                ok(w::write_nil(o));
            }
        }
        CacheEvent::Removed { hashes } => {
            open(o, "BlockRemoved", 2);
            key(o, "block_hashes");
            hash_list(o, f, hashes);
            key(o, "medium");
            ok(w::write_str(o, MEDIUM_GPU));
        }
        CacheEvent::Cleared => open(o, "AllBlocksCleared", 0),
    }
}

fn hash_list(o: &mut Vec<u8>, f: &Format, hashes: &[u64]) {
    ok(w::write_array_len(o, len32(hashes.len())));
    for &h in hashes {
        hash(o, f, h);
    }
}

fn hash(o: &mut Vec<u8>, f: &Format, h: u64) {
    match f.hash {
        HashFormat::Int => ok(w::write_uint(o, h)),
        HashFormat::Bytes => ok(w::write_bin(o, &h.to_be_bytes())),
    }
}

/// A msgpack container length: the cache never logs 2^32 items at once.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Writing into a `Vec<u8>` cannot fail; the writers return `Result`
/// because they take any `io::Write`.
fn ok<T, E: std::fmt::Debug>(r: Result<T, E>) {
    r.expect("writing msgpack into a Vec cannot fail");
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value;

    fn decode(b: &[u8]) -> Value {
        let mut r = b;
        let v = rmpv::decode::read_value(&mut r).unwrap();
        assert!(r.is_empty(), "one value, nothing after it");
        v
    }

    fn events() -> Vec<CacheEvent> {
        vec![
            CacheEvent::Stored {
                hashes: vec![u64::MAX, 7],
                parent: Some(3),
                tokens: vec![1, 2, 3, 4, 5, 6, 7, 8],
            },
            CacheEvent::Removed { hashes: vec![9] },
            CacheEvent::Cleared,
        ]
    }

    #[test]
    fn array_shape_is_positional_with_the_tag_first() {
        let f = Format {
            shape: EventShape::Array,
            hash: HashFormat::Int,
            block_size: 4,
            data_parallel_rank: None,
        };
        let v = decode(&encode_batch(&f, 1.5, &events()));
        let want = Value::Array(vec![
            Value::F64(1.5),
            Value::Array(vec![
                Value::Array(vec![
                    "BlockStored".into(),
                    Value::Array(vec![u64::MAX.into(), 7u64.into()]),
                    3u64.into(),
                    Value::Array((1u64..=8).map(Value::from).collect()),
                    4u64.into(),
                    Value::Nil,
                    "GPU".into(),
                ]),
                Value::Array(vec![
                    "BlockRemoved".into(),
                    Value::Array(vec![9u64.into()]),
                    "GPU".into(),
                ]),
                Value::Array(vec!["AllBlocksCleared".into()]),
            ]),
        ]);
        assert_eq!(v, want, "no rank: left out, as msgspec omits a default");
    }

    #[test]
    fn map_shape_is_keyed_and_tagged_by_type_with_byte_hashes() {
        let f = Format {
            shape: EventShape::Map,
            hash: HashFormat::Bytes,
            block_size: 4,
            data_parallel_rank: Some(2),
        };
        let v = decode(&encode_batch(&f, 2.0, &events()[..2]));
        let b = |h: u64| Value::Binary(h.to_be_bytes().to_vec());
        let m = |kv: Vec<(&str, Value)>| {
            Value::Map(kv.into_iter().map(|(k, v)| (k.into(), v)).collect())
        };
        let want = m(vec![
            ("ts", Value::F64(2.0)),
            (
                "events",
                Value::Array(vec![
                    m(vec![
                        ("type", "BlockStored".into()),
                        ("block_hashes", Value::Array(vec![b(u64::MAX), b(7)])),
                        ("parent_block_hash", b(3)),
                        (
                            "token_ids",
                            Value::Array((1u64..=8).map(Value::from).collect()),
                        ),
                        ("block_size", 4u64.into()),
                        ("lora_id", Value::Nil),
                        ("medium", "GPU".into()),
                        ("lora_name", Value::Nil),
                    ]),
                    m(vec![
                        ("type", "BlockRemoved".into()),
                        ("block_hashes", Value::Array(vec![b(9)])),
                        ("medium", "GPU".into()),
                    ]),
                ]),
            ),
            ("data_parallel_rank", 2u64.into()),
        ]);
        assert_eq!(v, want);
    }
}
