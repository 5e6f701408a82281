//! Per-request cost of turning a chat completion body into prompt token ids
//! (`Tokenizer::prompt_tokens`), at about 1k, 8k and 32k prompt tokens,
//! against its two parts measured in the same run:
//! - `render/*`: the chat template alone (`render_chat`);
//! - `encode/*`: encoding the already-rendered prompt alone (the floor of
//!   any way to get the ids from the text).
//!
//! Tokenizer: the crate's test tokenizer (byte-level BPE trained in process
//! by the `tokenizers` trainer) at an 8,000-token vocabulary, trained on
//! 200,000 words of the synthetic corpus (`testing::sample_text`, seed 7).
//! Requests: a system prompt (a quarter of the tokens) then alternating
//! user/assistant turns of ~150 words, the last one a user turn; text from
//! `sample_text` with fixed seeds. Token counts are printed.
//!
//! Criterion reports wall time. Because the development machine's two cores
//! are shared, the bench also prints `cpu` lines: this thread's CPU time per
//! request (from `/proc/thread-self/schedstat`), median of 5 runs of at
//! least 0.2 CPU-seconds each.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use radixgate_tokenize::testing::{TestModel, sample_text};
use radixgate_tokenize::{Endpoint, Tokenizer};
use serde_json::{Value, json};

const TARGETS: [(usize, &str); 3] = [(1_000, "1k"), (8_000, "8k"), (32_000, "32k")];

/// A chat body of `words` words of content in all.
fn chat_body(words: usize) -> Value {
    let system = words / 4;
    let mut messages = vec![json!({"role": "system", "content": sample_text(system, 11)})];
    let mut left = words - system;
    let mut turn = 0u64;
    while left > 0 {
        let n = left.min(150);
        let role = if turn.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        };
        messages.push(json!({"role": role, "content": sample_text(n, 1_000 + turn)}));
        left -= n;
        turn += 1;
    }
    if messages.last().and_then(|m| m["role"].as_str()) == Some("assistant") {
        messages.push(json!({"role": "user", "content": "Go on."}));
    }
    json!({"model": "test", "stream": true, "max_tokens": 64, "messages": messages})
}

/// A body of about `target` prompt tokens, and its exact token count.
fn sized_body(tok: &Tokenizer, target: usize) -> (Value, usize) {
    let mut words = target;
    loop {
        let body = chat_body(words);
        let n = tok
            .prompt_tokens(Endpoint::ChatCompletions, &body)
            .expect("tokenizes")
            .len();
        if n.abs_diff(target) * 50 <= target {
            return (body, n);
        }
        words = (words as f64 * target as f64 / n as f64).round() as usize;
    }
}

/// This thread's time on a CPU, in nanoseconds (Linux), if readable.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Median CPU nanoseconds per call of `f`, or `None` off Linux.
fn cpu_per_call(mut f: impl FnMut()) -> Option<f64> {
    let mut runs = Vec::new();
    for _ in 0..5 {
        let start = thread_cpu_ns()?;
        let wall = Instant::now();
        let mut calls = 0u64;
        while thread_cpu_ns()? - start < 200_000_000 && wall.elapsed() < Duration::from_secs(5) {
            f();
            calls += 1;
        }
        runs.push((thread_cpu_ns()? - start) as f64 / calls as f64);
    }
    runs.sort_by(f64::total_cmp);
    Some(runs[runs.len() / 2])
}

fn bench(c: &mut Criterion) {
    let dir = TestModel {
        vocab_size: 8_000,
        corpus_words: 200_000,
        ..TestModel::default()
    }
    .write_temp()
    .expect("test model");
    let tok = Tokenizer::load(dir.path()).expect("loads");
    println!("tokenizer: vocab {}", tok.vocab_size());

    let mut g = c.benchmark_group("chat");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    for (target, label) in TARGETS {
        let (body, tokens) = sized_body(&tok, target);
        let rendered = tok.render_chat(&body).expect("renders");
        println!(
            "{label}: {tokens} tokens, {} messages, {} bytes rendered, {:.2} bytes/token",
            body["messages"].as_array().map_or(0, Vec::len),
            rendered.len(),
            rendered.len() as f64 / tokens as f64
        );
        g.throughput(Throughput::Elements(tokens as u64));
        g.bench_function(BenchmarkId::new("prompt_tokens", label), |b| {
            b.iter(|| {
                tok.prompt_tokens(Endpoint::ChatCompletions, black_box(&body))
                    .expect("tokenizes")
            })
        });
        g.bench_function(BenchmarkId::new("render", label), |b| {
            b.iter(|| tok.render_chat(black_box(&body)).expect("renders"))
        });
        g.bench_function(BenchmarkId::new("encode", label), |b| {
            b.iter(|| tok.encode(black_box(&rendered), false).expect("encodes"))
        });
        let full = cpu_per_call(|| {
            black_box(
                tok.prompt_tokens(Endpoint::ChatCompletions, black_box(&body))
                    .expect("tokenizes"),
            );
        });
        let render = cpu_per_call(|| {
            black_box(tok.render_chat(black_box(&body)).expect("renders"));
        });
        if let (Some(full), Some(render)) = (full, render) {
            println!(
                "cpu {label}: prompt_tokens {:.3} ms/request ({:.0} tokens/cpu-s, {:.2} MB/cpu-s), render {:.3} ms",
                full / 1e6,
                tokens as f64 / (full / 1e9),
                rendered.len() as f64 / (full / 1e3),
                render / 1e6
            );
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
