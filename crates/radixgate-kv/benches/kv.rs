//! Benchmarks of radixgate-kv on one core.
//!
//! - `ingest/*`: decode + apply of a balanced event stream (every block
//!   stored is removed later in the same cycle, so the index stays bounded
//!   across iterations), in block events per second; `decode_only/*` is the
//!   decoder's share. Both payload shapes: tagged arrays with integer hashes
//!   (SGLang, older vLLM) and tagged maps with 32-byte hashes (newer vLLM).
//! - `request/*`: a prompt's block keys plus its match against 16 workers,
//!   each holding a different-length prefix of it (block size 16), for 1k,
//!   8k and 32k tokens; `keys_only/*` is the keying share.
//!
//! Run: `cargo bench -p radixgate-kv --bench kv`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use radixgate_kv::wire::decode_payload;
use radixgate_kv::{BlockStored, EngineHash, KvEvent, KvIndex, keys};
use rmpv::Value;

const BLOCK: u32 = 16;
/// Blocks per `BlockStored` event, as an engine reports one scheduler step
/// of one request.
const BLOCKS_PER_EVENT: usize = 8;
const EVENTS_PER_DOC: usize = 4;
const DOCS: usize = 256;

fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("encoding to a Vec cannot fail");
    out
}

fn hash_value(doc: usize, block: usize, as_bytes: bool) -> Value {
    let n = (doc as u64) << 32 | block as u64;
    if as_bytes {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&n.to_le_bytes());
        Value::Binary(b.to_vec())
    } else {
        Value::from(n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

fn event(map: bool, tag: &str, fields: Vec<(&str, Value)>) -> Value {
    if map {
        let mut entries = vec![(Value::from("type"), Value::from(tag))];
        entries.extend(fields.into_iter().map(|(k, v)| (Value::from(k), v)));
        Value::Map(entries)
    } else {
        let mut items = vec![Value::from(tag)];
        items.extend(fields.into_iter().map(|(_, v)| v));
        Value::Array(items)
    }
}

fn batch(events: Vec<Value>) -> Vec<u8> {
    encode(&Value::Array(vec![
        Value::F64(1.7e9),
        Value::Array(events),
        Value::from(0),
    ]))
}

/// One cycle: every document's blocks stored in `EVENTS_PER_DOC` events
/// chained by parent hash, then all of them removed, 64 hashes a batch.
/// Returns the payloads and the number of block events they carry.
fn stream(map: bool) -> (Vec<Vec<u8>>, u64) {
    let mut payloads = Vec::new();
    let mut block_events = 0u64;
    let mut token = 0u32;
    for doc in 0..DOCS {
        for e in 0..EVENTS_PER_DOC {
            let first = e * BLOCKS_PER_EVENT;
            let hashes = (first..first + BLOCKS_PER_EVENT)
                .map(|b| hash_value(doc, b, map))
                .collect();
            let parent = if first == 0 {
                Value::Nil
            } else {
                hash_value(doc, first - 1, map)
            };
            let tokens = (0..BLOCKS_PER_EVENT * BLOCK as usize)
                .map(|_| {
                    token = token.wrapping_add(7919) % 150_000;
                    Value::from(token)
                })
                .collect();
            payloads.push(batch(vec![event(
                map,
                "BlockStored",
                vec![
                    ("block_hashes", Value::Array(hashes)),
                    ("parent_block_hash", parent),
                    ("token_ids", Value::Array(tokens)),
                    ("block_size", Value::from(BLOCK)),
                    ("lora_id", Value::Nil),
                    ("medium", Value::from("GPU")),
                ],
            )]));
            block_events += BLOCKS_PER_EVENT as u64;
        }
    }
    let all: Vec<Value> = (0..DOCS)
        .flat_map(|d| (0..EVENTS_PER_DOC * BLOCKS_PER_EVENT).map(move |b| hash_value(d, b, map)))
        .collect();
    for chunk in all.chunks(64) {
        payloads.push(batch(vec![event(
            map,
            "BlockRemoved",
            vec![
                ("block_hashes", Value::Array(chunk.to_vec())),
                ("medium", Value::from("GPU")),
            ],
        )]));
        block_events += chunk.len() as u64;
    }
    (payloads, block_events)
}

fn ingest(c: &mut Criterion) {
    let mut g = c.benchmark_group("ingest");
    for (name, map) in [("array_int_hashes", false), ("map_bytes_hashes", true)] {
        let (payloads, block_events) = stream(map);
        g.throughput(Throughput::Elements(block_events));
        let mut index = KvIndex::new();
        g.bench_function(BenchmarkId::new("decode_apply", name), |b| {
            b.iter(|| {
                for p in &payloads {
                    let batch = decode_payload(p).expect("valid payload");
                    black_box(index.apply(0, &batch.events));
                }
            })
        });
        assert_eq!(index.blocks(), 0, "the stream is balanced");
        g.bench_function(BenchmarkId::new("decode_only", name), |b| {
            b.iter(|| {
                for p in &payloads {
                    black_box(decode_payload(p).expect("valid payload"));
                }
            })
        });
    }
    g.finish();
}

fn request(c: &mut Criterion) {
    let mut g = c.benchmark_group("request");
    for len in [1_024usize, 8_192, 32_768] {
        let tokens: Vec<u32> = (0..len as u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 150_000)
            .collect();
        let mut index = KvIndex::new();
        let blocks = len / BLOCK as usize;
        // Worker w holds the first (w + 1)/16 of the prompt, under its own
        // engine hashes.
        for w in 0..16u32 {
            let held = blocks * (w as usize + 1) / 16;
            let event = KvEvent::Stored(BlockStored {
                block_hashes: (0..held as u64)
                    .map(|b| EngineHash(b << 8 | u64::from(w)))
                    .collect(),
                parent: None,
                token_ids: tokens[..held * BLOCK as usize].to_vec(),
                block_size: BLOCK,
                lora_id: None,
                extra_keys: Vec::new(),
            });
            index.apply(w, &[event]);
        }
        let probe = keys::block_keys(&tokens, BLOCK as usize);
        assert_eq!(index.match_keys(BLOCK, &probe).len(), 16);
        g.throughput(Throughput::Elements(len as u64));
        g.bench_function(BenchmarkId::new("keys_and_match_16_workers", len), |b| {
            b.iter(|| {
                let k = keys::block_keys(black_box(&tokens), BLOCK as usize);
                black_box(index.match_keys(BLOCK, &k))
            })
        });
        g.bench_function(BenchmarkId::new("keys_only", len), |b| {
            b.iter(|| black_box(keys::block_keys(black_box(&tokens), BLOCK as usize)))
        });
    }
    g.finish();
}

criterion_group!(benches, ingest, request);
criterion_main!(benches);
