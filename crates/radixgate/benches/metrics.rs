//! The hot-path cost of recording metrics: nanoseconds per
//! `Metrics::request_done` (one counter and one histogram sample), beside a
//! bare atomic increment as the floor, and the cost of a scrape.
//!
//! Run: `cargo bench -p radixgate --bench metrics`

use criterion::{Criterion, criterion_group, criterion_main};
use radixgate::metrics::Metrics;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const ROUTE: &str = "/v1/chat/completions";

fn bench(c: &mut Criterion) {
    let metrics = Metrics::new();
    let models = ["llama-3-8b", "qwen-2-7b", "mistral-7b"];
    let floor = AtomicU64::new(0);
    let mut group = c.benchmark_group("metrics");
    group.bench_function("atomic_increment_floor", |b| {
        b.iter(|| floor.fetch_add(black_box(1), Ordering::Relaxed))
    });
    let mut i = 0usize;
    group.bench_function("request_done", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            metrics.request_done(
                black_box(ROUTE),
                black_box(200),
                Some(models[i % models.len()]),
                Duration::from_micros(black_box(1500)),
            );
        })
    });
    group.bench_function("worker_in_flight", |b| {
        b.iter(|| metrics.worker_in_flight(black_box("http://127.0.0.1:30001"), black_box(3)))
    });
    group.bench_function("decision", |b| {
        b.iter(|| metrics.decision(black_box("cache_hit")))
    });
    // A scrape with 3 models x 1 route plus the series above.
    group.bench_function("render", |b| b.iter(|| black_box(metrics.render())));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
