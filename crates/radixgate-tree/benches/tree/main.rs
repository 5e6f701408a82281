//! Criterion benchmarks of the radix tree, each racing a baseline measured in
//! the same run:
//! - `match/*` and `insert/*`: prompts of 100 B, 1 KiB, 4 KiB, 16 KiB built as
//!   32 system prompts (half the prompt) × unique suffixes, 16 tenants, a tree
//!   of ~4 M stored characters (and ~16 M for 4 KiB), against a `memcmp`
//!   pass over the same prompt bytes (the physical floor) and a naive
//!   baseline (a list of inserted texts scanned linearly).
//! - `evict/*`: steady-state eviction of 10% of each tenant, on 4 M and 16 M
//!   character trees, against 1% of the 16 M tree and against `stats()`, an
//!   O(nodes) walk (the floor of any scan-based eviction).
//! - `threads/*`: the same 4 KiB match from 1 and 2 threads on one tree,
//!   against the tree behind one exclusive mutex.
//! - bytes per stored character are printed for every tree built.
//! - `cpu p=…` lines: the match and insert figures again in this thread's
//!   CPU time (median of 3 long runs), because on a shared machine wall time
//!   also counts waiting for a core.
//!
//! Run one part with `RADIXGATE_BENCH_ONLY=match_insert|big|evict|threads`
//! (comma-separated).
//!
//! Text: lowercase ASCII and spaces with about 1 in 32 chars `é` and 1 in 64
//! `日`, from a fixed-seed xorshift generator (seed printed).

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::measurement::Measurement;
use criterion::{
    BatchSize, BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use radixgate_tree::{TenantId, Tree, TreeConfig};

mod workload;

use workload::{Built, SIZES, TENANTS, Workload, build, naive_match};

/// Short runs: the benchmark machine has 2 shared cores.
fn tune<M: Measurement>(g: &mut BenchmarkGroup<'_, M>) {
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
}

/// `memcmp` floor: compare each query with a separately allocated copy.
fn bench_memcmp<M: Measurement>(
    g: &mut BenchmarkGroup<'_, M>,
    p: usize,
    queries: &[(String, TenantId)],
) {
    let copies: Vec<(Vec<u8>, Vec<u8>)> = queries
        .iter()
        .map(|(s, _)| (s.as_bytes().to_vec(), s.as_bytes().to_vec()))
        .collect();
    let mut i = 0;
    g.bench_function(BenchmarkId::new("memcmp", p), |b| {
        b.iter(|| {
            i = (i + 1) % copies.len();
            let (x, y) = &copies[i];
            black_box(black_box(x.as_slice()) == black_box(y.as_slice()))
        })
    });
}

/// Runs `op` over and over for about a quarter of a CPU-second, three times,
/// and returns the median run's CPU nanoseconds per op. Long runs keep the
/// scheduler's tick-grained accounting error under about 2%.
fn cpu_ns_per_op(mut op: impl FnMut(usize)) -> f64 {
    let start = Instant::now();
    for i in 0..2_000 {
        op(i);
    }
    let per_op = start.elapsed().as_nanos().max(1) as f64 / 2_000.0;
    let n = ((0.25e9 / per_op) as usize).clamp(2_000, 20_000_000);
    let mut runs: Vec<f64> = (0..3)
        .map(|_| {
            let cpu = thread_cpu_ns();
            for i in 0..n {
                op(i);
            }
            (thread_cpu_ns() - cpu) as f64 / n as f64
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    runs[1]
}

/// The match and insert figures again in this thread's CPU time, which,
/// unlike wall time on a shared machine, leaves out waiting for a core.
fn print_cpu_figures(built: &mut Built, fresh: &Tree) {
    let q = &built.queries;
    let copies: Vec<(Vec<u8>, Vec<u8>)> = q
        .iter()
        .map(|(s, _)| (s.as_bytes().to_vec(), s.as_bytes().to_vec()))
        .collect();
    let floor = cpu_ns_per_op(|i| {
        let (x, y) = &copies[i % copies.len()];
        black_box(black_box(x.as_slice()) == black_box(y.as_slice()));
    });
    let matched = cpu_ns_per_op(|i| {
        black_box(built.tree.prefix_match(black_box(&q[i % q.len()].0)));
    });
    let matched_for = cpu_ns_per_op(|i| {
        let (s, t) = &q[i % q.len()];
        black_box(built.tree.prefix_match_for(black_box(s), *t));
    });
    let existing = cpu_ns_per_op(|i| {
        let (s, t) = &q[i % q.len()];
        built.tree.insert(black_box(s), *t);
    });
    let (mut text, tenant, at) = built.work.template();
    let new_suffix = cpu_ns_per_op(|i| {
        Workload::stamp(&mut text, at, 50_000_000 + i);
        fresh.insert(black_box(&text), tenant);
    });
    let p = built.work.p;
    println!(
        "cpu p={p}: memcmp {floor:.0} ns | match {matched:.0} ns ({:.1}x) | match_for {matched_for:.0} ns ({:.1}x) \
         | insert_existing {existing:.0} ns ({:.1}x) | insert_new_suffix {new_suffix:.0} ns ({:.1}x, includes stamping 8 digits)",
        matched / floor,
        matched_for / floor,
        existing / floor,
        new_suffix / floor
    );
}

/// `RADIXGATE_BENCH_ONLY=threads` (say) skips the other parts' setup too,
/// which criterion's name filter cannot do.
fn wanted(part: &str) -> bool {
    std::env::var("RADIXGATE_BENCH_ONLY").map_or(true, |only| only.split(',').any(|p| p == part))
}

fn match_and_insert(c: &mut Criterion) {
    if !wanted("match_insert") {
        return;
    }
    for p in SIZES {
        let mut built = build(p, 4_000_000, usize::MAX);
        let mut g = c.benchmark_group("match");
        tune(&mut g);
        g.throughput(Throughput::Bytes(p as u64));
        bench_memcmp(&mut g, p, &built.queries);
        let mut i = 0;
        g.bench_function(BenchmarkId::new("tree", p), |b| {
            b.iter(|| {
                i = (i + 1) % built.queries.len();
                black_box(built.tree.prefix_match(black_box(&built.queries[i].0)))
            })
        });
        g.bench_function(BenchmarkId::new("tree_for_tenant", p), |b| {
            b.iter(|| {
                i = (i + 1) % built.queries.len();
                let (q, t) = &built.queries[i];
                black_box(built.tree.prefix_match_for(black_box(q), *t))
            })
        });
        g.sample_size(10);
        g.bench_function(BenchmarkId::new("naive_scan", p), |b| {
            b.iter(|| {
                i = (i + 1) % built.queries.len();
                black_box(naive_match(&built.texts, black_box(&built.queries[i].0)))
            })
        });
        g.finish();

        let mut g = c.benchmark_group("insert");
        tune(&mut g);
        g.throughput(Throughput::Bytes(p as u64));
        bench_memcmp(&mut g, p, &built.queries);
        g.bench_function(BenchmarkId::new("tree_existing", p), |b| {
            b.iter(|| {
                i = (i + 1) % built.queries.len();
                let (q, t) = &built.queries[i];
                built.tree.insert(black_box(q), *t);
            })
        });
        // A new prompt on a known system prompt: the suffix is new, so this
        // pays for one leaf allocation (and, past the bound, inline eviction).
        // Prompts are generated outside the timed closure in batches.
        let bound = built.tree.stats().tenant_chars;
        let fresh = Tree::new(TreeConfig {
            max_total_chars: bound,
            ..TreeConfig::default()
        });
        for (s, t) in &built.texts {
            fresh.insert(s, *t);
        }
        g.bench_function(BenchmarkId::new("tree_new_suffix", p), |b| {
            b.iter_batched_ref(
                || built.work.prompt(),
                |(q, t)| fresh.insert(black_box(q), *t),
                BatchSize::SmallInput,
            )
        });
        let mut naive: Vec<(String, TenantId)> = Vec::new();
        g.bench_function(BenchmarkId::new("naive_push", p), |b| {
            b.iter(|| {
                i = (i + 1) % built.queries.len();
                let (q, t) = &built.queries[i];
                naive.push((black_box(q).clone(), *t));
                if naive.len() > 4096 {
                    naive.clear();
                }
            })
        });
        g.finish();
        print_cpu_figures(&mut built, &fresh);
        let s = fresh.stats();
        println!(
            "after tree_new_suffix p={p}: bound {bound}, tenant chars {}, {:.2} B/char",
            s.tenant_chars,
            s.estimated_bytes as f64 / s.chars as f64
        );
    }
}

fn big_tree(c: &mut Criterion) {
    if !wanted("big") {
        return;
    }
    let p = 4096;
    let built = build(p, 16_000_000, usize::MAX);
    let mut g = c.benchmark_group("match_16M");
    tune(&mut g);
    g.throughput(Throughput::Bytes(p as u64));
    bench_memcmp(&mut g, p, &built.queries);
    let mut i = 0;
    g.bench_function(BenchmarkId::new("tree", p), |b| {
        b.iter(|| {
            i = (i + 1) % built.queries.len();
            black_box(built.tree.prefix_match(black_box(&built.queries[i].0)))
        })
    });
    g.sample_size(10);
    g.bench_function(BenchmarkId::new("naive_scan", p), |b| {
        b.iter(|| {
            i = (i + 1) % built.queries.len();
            black_box(naive_match(&built.texts, black_box(&built.queries[i].0)))
        })
    });
    g.finish();
}

/// Steady-state eviction: evict `percent`% of each tenant (timed), then
/// insert fresh prompts to grow back (untimed).
fn evict_cycle(built: &mut Built, percent: usize) -> Duration {
    let tree = &built.tree;
    let avg = tree.stats().tenant_chars / TENANTS as usize;
    let start = Instant::now();
    let report = tree.evict(avg * (100 - percent) / 100);
    let took = start.elapsed();
    black_box(report);
    while tree.stats().tenant_chars < avg * TENANTS as usize {
        for _ in 0..64 {
            let (s, t) = built.work.prompt();
            tree.insert(&s, t);
        }
    }
    took
}

fn eviction(c: &mut Criterion) {
    if !wanted("evict") {
        return;
    }
    let mut g = c.benchmark_group("evict");
    tune(&mut g);
    g.sample_size(10);
    for (label, chars, percent) in [
        ("10pct_of_4M", 4_000_000, 10),
        ("10pct_of_16M", 16_000_000, 10),
        ("1pct_of_16M", 16_000_000, 1),
    ] {
        let mut built = build(4096, chars, usize::MAX);
        built.texts = Vec::new();
        let before = built.tree.stats();
        let avg = before.tenant_chars / TENANTS as usize;
        let start = Instant::now();
        let r = built.tree.evict(avg * (100 - percent) / 100);
        let took = start.elapsed();
        let after = built.tree.stats();
        println!(
            "evict {label}: first pass {took:?}, took {} chars and {} nodes of {} chars / {} nodes",
            r.evicted_chars,
            before.nodes - after.nodes,
            before.tenant_chars,
            before.nodes
        );
        g.bench_function(label, |b| {
            b.iter_custom(|iters| (0..iters).map(|_| evict_cycle(&mut built, percent)).sum())
        });
        if chars == 16_000_000 && percent == 10 {
            g.bench_function("stats_walk_16M", |b| {
                b.iter(|| black_box(built.tree.stats()))
            });
        }
    }
    g.finish();
}

/// `threads` callers each run `iters` 4 KiB matches at once; returns the
/// slowest caller's time (so equal times mean perfect scaling).
fn run_threads(
    tree: &Arc<Tree>,
    queries: &Arc<Vec<(String, TenantId)>>,
    threads: usize,
    iters: u64,
    lock: Option<&Arc<parking_lot::Mutex<()>>>,
) -> Duration {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let (tree, queries, barrier) =
                (Arc::clone(tree), Arc::clone(queries), Arc::clone(&barrier));
            let lock = lock.map(Arc::clone);
            std::thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                for n in 0..iters as usize {
                    let q = &queries[(n * 7 + k * 13) % queries.len()].0;
                    let _guard = lock.as_ref().map(|l| l.lock());
                    black_box(tree.prefix_match(black_box(q)));
                }
                start.elapsed()
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("bench thread"))
        .max()
        .unwrap_or_default()
}

/// Nanoseconds this thread has spent on a CPU (from the scheduler's stats),
/// so that scaling can be told apart from a machine too busy to give us cores.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Runs `threads` callers for `ops` matches each and prints throughput, the
/// CPU time per match, and how many CPUs the callers really got
/// (sum of on-CPU time / wall time).
fn print_scaling(
    label: &str,
    trees: &[Arc<Tree>],
    queries: &Arc<Vec<(String, TenantId)>>,
    threads: usize,
    lock: Option<&Arc<parking_lot::Mutex<()>>>,
) {
    let ops = 400_000usize;
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|k| {
            let (tree, queries) = (Arc::clone(&trees[k % trees.len()]), Arc::clone(queries));
            let lock = lock.map(Arc::clone);
            std::thread::spawn(move || {
                let cpu = thread_cpu_ns();
                for n in 0..ops {
                    let q = &queries[(n * 7 + k * 13) % queries.len()].0;
                    let _guard = lock.as_ref().map(|l| l.lock());
                    black_box(tree.prefix_match(black_box(q)));
                }
                thread_cpu_ns() - cpu
            })
        })
        .collect();
    let cpu: u64 = handles
        .into_iter()
        .map(|h| h.join().expect("bench thread"))
        .sum();
    let wall = start.elapsed().as_nanos() as f64;
    let total = (ops * threads) as f64;
    println!(
        "scaling {label} x{threads}: {:.2} M matches/s, {:.0} ns CPU per match, CPUs used {:.2}",
        total / wall * 1e3,
        cpu as f64 / total,
        cpu as f64 / wall
    );
}

fn threads(c: &mut Criterion) {
    if !wanted("threads") {
        return;
    }
    let built = build(4096, 4_000_000, usize::MAX);
    let queries = Arc::new(built.queries);
    let tree = Arc::new(built.tree);
    let lock = Arc::new(parking_lot::Mutex::new(()));
    // A second, identical tree: two threads on two trees share no lock, so
    // they show what the hardware itself allows.
    let twin = Arc::new(build(4096, 4_000_000, usize::MAX).tree);
    let one = [Arc::clone(&tree)];
    for n in [1, 2] {
        print_scaling("rwlock_tree", &one, &queries, n, None);
        print_scaling("behind_one_mutex", &one, &queries, n, Some(&lock));
    }
    print_scaling(
        "two_trees_no_shared_lock",
        &[Arc::clone(&tree), twin],
        &queries,
        2,
        None,
    );
    let mut g = c.benchmark_group("threads");
    tune(&mut g);
    for n in [1, 2] {
        g.bench_function(BenchmarkId::new("rwlock_tree", n), |b| {
            b.iter_custom(|iters| run_threads(&tree, &queries, n, iters, None))
        });
        g.bench_function(BenchmarkId::new("behind_one_mutex", n), |b| {
            b.iter_custom(|iters| run_threads(&tree, &queries, n, iters, Some(&lock)))
        });
    }
    g.finish();
}

criterion_group!(benches, match_and_insert, big_tree, eviction, threads);
criterion_main!(benches);
