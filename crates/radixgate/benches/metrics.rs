//! The hot-path cost of recording metrics: nanoseconds per
//! `RequestMetrics::request_done` (one counter and one histogram sample),
//! the request path's own families, against
//! the naive use of the same recorder (build a `Key` and register it on every
//! call, what the `metrics` macros do) and a bare atomic increment as the
//! floor; a per-worker gauge set (the upkeep tick's `PerWorker` gauges) and
//! a decision counter; and the cost of one scrape.
//!
//! Run: `cargo bench -p radixgate --bench metrics`

use criterion::{Criterion, criterion_group, criterion_main};
use metrics::{Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::PrometheusBuilder;
use radixgate::metrics::{Describe, Metrics};
use radixgate::proxy::RequestMetrics;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const ROUTE: &str = "/v1/chat/completions";
const MODELS: [&str; 3] = ["llama-3-8b", "qwen-2-7b", "mistral-7b"];
static META: Metadata<'static> = Metadata::new("bench", Level::INFO, None);
/// A per-worker gauge family like the upkeep tick's in-flight gauges.
static WORKER_IN_FLIGHT: Describe = Describe::new(
    "radixgate_worker_in_flight_requests",
    "Requests in flight to each worker.",
);

fn bench(c: &mut Criterion) {
    let registry = Metrics::with_histograms(RequestMetrics::HISTOGRAMS);
    let metrics = RequestMetrics::new(&registry);
    let in_flight = registry.per_worker_gauges(&WORKER_IN_FLIGHT);
    let naive = PrometheusBuilder::new().build_recorder();
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
                Some(MODELS[i % MODELS.len()]),
                Duration::from_micros(black_box(1500)),
            );
        })
    });
    group.bench_function("request_done_naive_register", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let labels = vec![
                Label::from_static_parts("route", black_box(ROUTE)),
                Label::from_static_parts("status", "200"),
                Label::new("model", MODELS[i % MODELS.len()].to_owned()),
            ];
            naive
                .register_counter(&Key::from_parts("requests_total", labels), &META)
                .increment(1);
            let labels = vec![Label::from_static_parts("route", ROUTE)];
            naive
                .register_histogram(&Key::from_parts("latency", labels), &META)
                .record(black_box(0.0015));
        })
    });
    group.bench_function("worker_in_flight", |b| {
        b.iter(|| in_flight.set(black_box("http://127.0.0.1:30001"), black_box(3) as f64))
    });
    group.bench_function("decision", |b| {
        b.iter(|| metrics.decision(black_box("cache_hit")))
    });
    // A scrape of the series above (3 models, 1 route, a few families).
    group.bench_function("render", |b| b.iter(|| black_box(registry.render())));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
