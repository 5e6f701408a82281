//! What reading a request body for routing costs: nanoseconds per
//! `inspect` of a chat completion body whose user message is 4 KiB (the
//! body `bench/instr_cost.py` and `bench/wrk_cpu.sh` send), 64 KiB and
//! 256 KiB long, plain words, and the 64 KiB one with a newline escape
//! every 80 characters (so serde_json hands its text over copied, not
//! borrowed).
//!
//! Run: `cargo bench -p radixgate --bench inspect`. To compare two
//! commits, run it at the first with `-- --save-baseline before` and at
//! the second with `-- --baseline before`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use radixgate::inspect::{Api, inspect};
use std::hint::black_box;

/// A chat body whose user message is `len` characters of repeated words,
/// with `\n` (escaped) every `line` characters if `line` is set.
fn chat_body(len: usize, line: Option<usize>) -> Vec<u8> {
    let words = "the router sends each request to the worker most likely to hold its \
                 prompt prefix in cache unless that overloads it ";
    let mut text: String = words.chars().cycle().take(len).collect();
    if let Some(line) = line {
        let mut lined = String::with_capacity(len + len / line);
        for (i, c) in text.chars().enumerate() {
            if i > 0 && i % line == 0 {
                lined.push('\n');
            }
            lined.push(c);
        }
        text = lined;
    }
    serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "max_tokens": 16,
        "stream": false,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text},
        ],
    }))
    .expect("a JSON body")
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("inspect");
    for (name, body) in [
        ("chat_4k", chat_body(4000, None)),
        ("chat_64k", chat_body(64 * 1024, None)),
        ("chat_256k", chat_body(256 * 1024, None)),
        ("chat_64k_escaped", chat_body(64 * 1024, Some(80))),
    ] {
        let routed = inspect(Api::ChatCompletions, &body).expect("a valid body");
        assert!(routed.routing_text.len() > body.len() / 2);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_function(name, |b| {
            b.iter(|| inspect(Api::ChatCompletions, black_box(&body)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
