//! `radixgate demo`'s comparison, small: real workers, a real gateway, the
//! real load driver. Cache-aware routing must beat round-robin on hit rate
//! on a workload whose prefixes do not all fit one worker's cache.

use clap::Parser;

// The demo is the binary's (it keeps the gateway library free of the
// simulator), so the test compiles its module; the command's serving loop
// is not used here.
#[allow(dead_code)]
#[path = "../src/bin/radixgate/demo.rs"]
mod demo;

use demo::{DemoArgs, compare, load_args, table};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    demo: DemoArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_aware_beats_round_robin_on_hit_rate() {
    let args = Cli::parse_from(["demo", "--requests", "80", "--rate", "40", "--no-serve"]).demo;
    let runs = compare(&args).await.unwrap();
    println!("{}", table(&args, &runs));
    assert_eq!(runs.len(), 2);
    let (aware, rr) = (&runs[0].report, &runs[1].report);
    assert_eq!(
        (runs[0].policy, runs[1].policy),
        ("cache_aware", "round_robin")
    );
    for r in [aware, rr] {
        assert_eq!((r.ok, r.failed), (80, 0), "{:?}", r.errors);
    }
    let (a, b) = (aware.hit_rate.unwrap(), rr.hit_rate.unwrap());
    assert!(a > b + 0.1, "cache_aware {a:.3} vs round_robin {b:.3}");
}

/// Each run draws load's progress line (on a terminal only: load checks).
#[test]
fn runs_show_load_progress() {
    let args = Cli::parse_from(["demo", "--no-serve"]).demo;
    let load = load_args(&args, "http://127.0.0.1:1").unwrap();
    assert!(!load.no_progress);
    assert!(load.plan(false).unwrap().progress);
}
