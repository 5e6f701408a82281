//! Cost of one routing decision: cache_aware (prefix match + insert + load
//! read + guard) against round_robin (load read + guard) in the same run,
//! and `tree_only` (the same match + insert on the same tree, no policy) to
//! show what the policy adds to the tree's own cost; `cache_aware_bounded`
//! is the default over workers that report their KV cache size, as SGLang
//! and vLLM do, so that every insert is bounded by the worker's cache.
//!
//! Workload (shared-prefix): 32 "system prompts", each taking 3/4 of the
//! prompt size, with 8 different tails each (256 distinct prompts). Every
//! prompt is routed once before measuring, so the measured decisions are the
//! steady state of a warm tree: full-length matches and re-inserts. Prompts
//! are ASCII, so a KiB is 1,024 characters. The text generator is a fixed
//! LCG: same prompts every run.
//!
//! Run: `cargo bench -p radixgate-routing --bench decision`
//! (`-- --quick` style filters work as usual, e.g. `-- 'w16/4KiB'`).

#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use radixgate_routing::policy::CacheAware;
use radixgate_routing::{
    CacheAwareConfig, CacheReport, Policy, PolicyConfig, RequestView, TenantId, Worker, WorkerId,
    WorkerSpec,
};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

const GROUPS: usize = 32;
const TAILS: usize = 8;

fn text(seed: u64, len: usize) -> String {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(b'a' + ((x >> 33) % 26) as u8)
        })
        .collect()
}

fn prompts(size: usize) -> Vec<String> {
    let head = size * 3 / 4;
    let mut out = Vec::with_capacity(GROUPS * TAILS);
    for g in 0..GROUPS {
        let system = format!("{g:02}{}", text(g as u64, head - 2));
        for t in 0..TAILS {
            out.push(format!(
                "{system}{}",
                text(1_000 + (g * TAILS + t) as u64, size - head)
            ));
        }
    }
    out
}

fn workers(n: usize, kv_capacity_tokens: Option<u64>) -> Vec<Arc<Worker>> {
    (0..n)
        .map(|i| {
            Arc::new(Worker::new(
                WorkerId(i as u32),
                WorkerSpec::new(format!("http://w{i}:8000"))
                    .with_kv_capacity_tokens(kv_capacity_tokens),
            ))
        })
        .collect()
}

/// Routes `text` and answers as a worker would, 4 characters a token, all
/// of it cached: the model learns its characters per token, so that its
/// trees are bounded by the workers' caches where the sizes are known.
fn decide_and_answer(policy: &dyn Policy, ws: &[Arc<Worker>], text: &str) {
    let mut d = policy
        .select(&RequestView::new("m", text), ws)
        .expect("healthy pool");
    if let Some(feedback) = d.take_cache_feedback() {
        let tokens = (text.len() / 4).max(1) as u64;
        feedback.apply(
            text,
            CacheReport {
                prompt_tokens: tokens,
                cached_tokens: tokens,
            },
        );
    }
}

fn decide(policy: &dyn Policy, ws: &[Arc<Worker>], text: &str) {
    let d = policy
        .select(&RequestView::new("m", text), ws)
        .expect("healthy pool");
    black_box(d.explanation().branch);
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200))
        .sample_size(20);
    for n in [2usize, 16, 64, 256] {
        let ws = workers(n, None);
        for kib in [1usize, 4, 16] {
            let ps = prompts(kib * 1024);
            let label = format!("w{n}/{kib}KiB");
            let cache_aware = Arc::new(CacheAware::new(CacheAwareConfig::default()));
            for p in &ps {
                decide(&*cache_aware, &ws, p);
            }
            // The tree's share of a decision: the same match + insert on the
            // same warm tree, without the policy around it.
            let tree = cache_aware.tree("m").expect("warmed");
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new("tree_only", &label), |b| {
                b.iter(|| {
                    i = (i + 97) % ps.len();
                    let m = tree.prefix_match(&ps[i]);
                    let tenant = m.tenants.first().map_or(TenantId(0), |h| h.tenant);
                    tree.insert(&ps[i], tenant);
                    black_box(m.matched_chars);
                })
            });
            let cache_aware: Arc<dyn Policy> = cache_aware;
            // The rule before the cost model, side by side.
            let seed_rule: Arc<dyn Policy> =
                Arc::new(CacheAware::new(CacheAwareConfig::seed_rule()));
            for p in &ps {
                decide(&*seed_rule, &ws, p);
            }
            let round_robin = PolicyConfig::RoundRobin(Default::default())
                .build()
                .unwrap();
            for (name, policy) in [
                ("cache_aware", &cache_aware),
                ("cache_aware_seed_rule", &seed_rule),
                ("round_robin", &round_robin),
            ] {
                let mut i = 0usize;
                group.bench_function(BenchmarkId::new(name, &label), |b| {
                    b.iter(|| {
                        i = (i + 97) % ps.len();
                        decide(&**policy, &ws, &ps[i]);
                    })
                });
            }
            // The default where the workers report their KV caches (SGLang
            // and vLLM do): every insert is bounded by the worker's cache
            // and counted for the model's eviction rate. 400k tokens each
            // (1.6 M characters at the 4 a token the warm-up teaches):
            // the warm tree fits, so the bound never evicts.
            let sized = workers(n, Some(400_000));
            let bounded: Arc<dyn Policy> = Arc::new(CacheAware::new(CacheAwareConfig::default()));
            for p in &ps {
                decide_and_answer(&*bounded, &sized, p);
            }
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new("cache_aware_bounded", &label), |b| {
                b.iter(|| {
                    i = (i + 97) % ps.len();
                    decide(&*bounded, &sized, &ps[i]);
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
