//! Payload builders for tests: both shapes, built from msgpack values the
//! way msgspec lays them out (see `src/wire/payload.rs` for the sources).

#![allow(dead_code, unreachable_pub)]

use rmpv::Value;

pub fn s(v: &str) -> Value {
    Value::from(v)
}

pub fn int(v: i64) -> Value {
    Value::from(v)
}

pub fn uint(v: u64) -> Value {
    Value::from(v)
}

pub fn bin(v: &[u8]) -> Value {
    Value::Binary(v.to_vec())
}

pub fn tokens(t: &[u32]) -> Value {
    Value::Array(t.iter().map(|&x| Value::from(x)).collect())
}

/// `BlockStored` as a tagged array: tag, block_hashes, parent_block_hash,
/// token_ids, block_size, lora_id, medium.
pub fn stored_array(hashes: Vec<Value>, parent: Value, t: &[u32], bs: u32, medium: Value) -> Value {
    Value::Array(vec![
        s("BlockStored"),
        Value::Array(hashes),
        parent,
        tokens(t),
        Value::from(bs),
        Value::Nil,
        medium,
    ])
}

/// `BlockStored` as a tagged map.
pub fn stored_map(hashes: Vec<Value>, parent: Value, t: &[u32], bs: u32, medium: Value) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), Value::Array(hashes)),
        (s("parent_block_hash"), parent),
        (s("token_ids"), tokens(t)),
        (s("block_size"), Value::from(bs)),
        (s("lora_id"), Value::Nil),
        (s("medium"), medium),
        (s("lora_name"), Value::Nil),
    ])
}

pub fn removed_array(hashes: Vec<Value>, medium: Value) -> Value {
    Value::Array(vec![s("BlockRemoved"), Value::Array(hashes), medium])
}

pub fn removed_map(hashes: Vec<Value>, medium: Value) -> Value {
    Value::Map(vec![
        (s("type"), s("BlockRemoved")),
        (s("block_hashes"), Value::Array(hashes)),
        (s("medium"), medium),
    ])
}

pub fn cleared_array() -> Value {
    Value::Array(vec![s("AllBlocksCleared")])
}

pub fn cleared_map() -> Value {
    Value::Map(vec![(s("type"), s("AllBlocksCleared"))])
}

/// `[ts, events, rank]`.
pub fn batch(events: Vec<Value>, rank: Value) -> Vec<u8> {
    encode(&Value::Array(vec![
        Value::F64(1_700_000_000.5),
        Value::Array(events),
        rank,
    ]))
}

pub fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("encoding to a Vec cannot fail");
    out
}

pub fn frames(seq: u64, payload: Vec<u8>) -> Vec<Vec<u8>> {
    vec![b"kv-events".to_vec(), seq.to_be_bytes().to_vec(), payload]
}

/// A `[ts, [["BlockRemoved", [h; n]]]]` payload of `n` one-byte hashes
/// (`n + 6` msgpack values), written by hand: a tree of `Value`s that
/// size is slow to build.
pub fn removed_of_tiny_hashes(n: usize) -> Vec<u8> {
    let mut p = vec![0x92, 0xcb];
    p.extend_from_slice(&1.5f64.to_be_bytes());
    p.extend_from_slice(&[0x91, 0x92, 0xac]);
    p.extend_from_slice(b"BlockRemoved");
    p.push(0xdd);
    p.extend_from_slice(&(n as u32).to_be_bytes());
    p.resize(p.len() + n, 0x01);
    p
}
