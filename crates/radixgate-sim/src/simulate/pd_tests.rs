//! Tests of prefill/decode runs: the timing of one request, the link, the
//! requests both arms see, the prefill pool's policies, prefill skipping,
//! the report, and `--pd`'s parsing.

use clap::Parser;

use super::pd::{PdArm, PdPlan, PdShape, Transfer, router_policy};
use super::tests::{policy, shared_prefix, small};
use super::*;
use crate::workload::LongDocConfig;

fn long_doc(document_tokens: u64, output_tokens: u32) -> WorkloadConfig {
    docs(3, document_tokens, output_tokens)
}

fn docs(documents: u64, document_tokens: u64, output_tokens: u32) -> WorkloadConfig {
    WorkloadConfig::LongDoc(LongDocConfig {
        documents,
        document_tokens,
        question_tokens: 32,
        output_tokens,
        zipf: 0.0,
    })
}

fn router(name: &str) -> radixgate_routing::PolicyConfig {
    router_policy("--prefill-policy", name, 7).unwrap()
}

fn arm(prefill: usize, decode: usize, prefill_policy: &str) -> PdArm {
    PdArm {
        prefill_workers: prefill,
        decode_workers: decode,
        prefill_policy: router(prefill_policy),
        decode_policy: router("least_load"),
        transfer: Transfer::default(),
        skip_prefill_below: None,
    }
}

#[test]
fn one_request_waits_for_prefill_transfer_and_one_decode_step() {
    let mut cfg = small(2, long_doc(2048, 4), Arrivals::Closed { concurrency: 1 });
    cfg.max_requests = Some(1);
    let a = arm(1, 1, "cache_aware");
    let s = pd_cluster::run(&cfg, &a).unwrap();
    assert_eq!((s.completed, s.failed, s.skipped), (1, 0, 0));
    let n = s.prefill_prompt_tokens as usize;
    assert!(n > 2048, "{n}");
    let timing = &cfg.worker.engine.timing;
    // One prefill step (the prompt fits the step budget), the move over
    // the link, then the decode worker's first step decodes token one.
    let prefill = timing.step_duration(n, 0, 0);
    let transfer = a.transfer.time(n);
    let first_decode = timing.step_duration(0, 1, n);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let expected = ms(prefill) + ms(transfer) + ms(first_decode);
    assert!(
        (s.ttft_ms[0] - expected).abs() < 1e-6,
        "ttft {} vs {expected}",
        s.ttft_ms[0]
    );
    assert!((s.transfer_ms[0] - ms(transfer)).abs() < 1e-6);
    // Three more tokens, one decode step each: three gaps.
    assert_eq!(s.itl_ms.len(), 3);
    assert_eq!(s.completion_tokens, 4);
    // Nothing was cached anywhere: the prompt was computed once, on the
    // prefill worker.
    assert_eq!(s.prefill_cached_tokens, 0);
    assert_eq!(s.computed_prompt_tokens, n as u64);
}

#[test]
fn transfer_time_grows_as_bandwidth_falls() {
    let fast = Transfer::new(100e9, 131_072).unwrap();
    let slow = Transfer::new(1e9, 131_072).unwrap();
    // 8192 tokens of 128 KiB at 1 GB/s: 1.07 s; at 100 GB/s a hundredth.
    assert_eq!(slow.time(8192), Duration::from_nanos(1_073_741_824));
    assert_eq!(fast.time(8192), Duration::from_nanos(10_737_418));
    assert!(Transfer::new(0.0, 1).is_err() && Transfer::new(f64::NAN, 1).is_err());
    assert!(Transfer::new(1e9, 0).is_err());
    // Bytes per second, as `radixgate worker --transfer-bandwidth`: the
    // default is one 400 Gb/s NIC, and a figure in GB/s is refused.
    assert_eq!(Transfer::default().bytes_per_sec, 50e9);
    assert_eq!(Transfer::new(1e6, 1).unwrap().bytes_per_sec, 1e6);
    assert!(Transfer::new(50.0, 1).is_err());

    // One client: no transfer waits for the link, so each takes exactly
    // its prompt's time, and the slower link adds the difference to TTFT.
    let cfg = small(4, long_doc(1024, 8), Arrivals::Closed { concurrency: 1 });
    let mut runs = Vec::new();
    for t in [fast, Transfer::default(), slow] {
        let a = PdArm {
            transfer: t,
            ..arm(2, 2, "cache_aware")
        };
        let s = pd_cluster::run(&cfg, &a).unwrap();
        assert_eq!(s.transfer_ms.len() as u64, s.completed);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        runs.push((mean(&s.transfer_ms), mean(&s.ttft_ms), s));
    }
    for w in runs.windows(2) {
        let ((x0, t0, _), (x1, t1, _)) = (&w[0], &w[1]);
        assert!(x1 > x0, "transfer {x1} vs {x0}");
        assert!(t1 - t0 >= (x1 - x0) * 0.99, "ttft {t1} vs {t0}");
    }
    let (slow_mean, _, s) = &runs[2];
    let per_request = s.prefill_prompt_tokens as f64 / s.completed as f64;
    let expected = per_request * 131_072.0 / 1e9 * 1000.0;
    assert!(
        (slow_mean - expected).abs() < 1e-3,
        "{slow_mean} vs {expected}"
    );
}

#[test]
fn colocated_and_pd_serve_the_same_requests() {
    for arrivals in [
        Arrivals::Poisson { rate: 20.0 },
        Arrivals::Closed { concurrency: 6 },
    ] {
        let mut cfg = small(4, long_doc(1024, 8), arrivals);
        cfg.max_requests = Some(80);
        let co = run(&cfg, &policy("cache_aware")).unwrap();
        let a = arm(2, 2, "cache_aware");
        let pd = pd_cluster::run(&cfg, &a).unwrap();
        assert_eq!(pd, pd_cluster::run(&cfg, &a).unwrap(), "deterministic");
        assert_eq!((co.completed, pd.completed), (80, 80));
        let mut seen_co: Vec<u64> = co.served.iter().map(|s| s.seq).collect();
        let mut seen_pd = pd.seqs.clone();
        seen_co.sort_unstable();
        seen_pd.sort_unstable();
        assert_eq!(seen_co, seen_pd);
        assert_eq!(seen_pd, (0..80).collect::<Vec<_>>());
        // The same prompts and outputs.
        assert_eq!(co.prompt_tokens, pd.prefill_prompt_tokens);
        assert_eq!(co.completion_tokens, pd.completion_tokens);
        // Every output token but each request's first is one gap.
        assert_eq!(co.itl_ms.len() as u64, co.completion_tokens - 80);
        assert_eq!(pd.itl_ms.len() as u64, pd.completion_tokens - 80);
        assert_eq!(pd.per_prefill.iter().sum::<u64>(), 80);
        assert_eq!(pd.per_decode.iter().sum::<u64>(), 80);
        assert!(pd.per_decode.iter().all(|&n| n > 0), "{:?}", pd.per_decode);
    }
}

#[test]
fn decode_is_not_stalled_by_long_prefills() {
    // Long, mostly uncached prompts arriving while others decode:
    // co-located, a decode step that carries a prefill chunk takes the
    // chunk's time.
    let mut cfg = small(4, docs(1000, 6000, 64), Arrivals::Poisson { rate: 8.0 });
    cfg.max_requests = Some(120);
    let co = run(&cfg, &policy("cache_aware")).unwrap();
    let pd = pd_cluster::run(&cfg, &arm(2, 2, "cache_aware")).unwrap();
    let p99 = |v: &[f64]| crate::load::Summary::of(v.to_vec()).unwrap().p99;
    assert!(
        p99(&pd.itl_ms) * 2.0 < p99(&co.itl_ms),
        "pd {} co-located {}",
        p99(&pd.itl_ms),
        p99(&co.itl_ms)
    );
}

#[test]
fn cache_aware_beats_round_robin_on_the_prefill_pool() {
    let cfg = small(4, shared_prefix(0.0), Arrivals::Closed { concurrency: 8 });
    let hit =
        |s: &pd_cluster::PdStats| s.prefill_cached_tokens as f64 / s.prefill_prompt_tokens as f64;
    let ca = pd_cluster::run(&cfg, &arm(3, 1, "cache_aware")).unwrap();
    let rr = pd_cluster::run(&cfg, &arm(3, 1, "round_robin")).unwrap();
    assert!(hit(&ca) > hit(&rr) + 0.03, "{} vs {}", hit(&ca), hit(&rr));
    assert!(ca.computed_prompt_tokens < rr.computed_prompt_tokens);
}

#[test]
fn skipping_prefill_sends_held_prompts_to_decode_alone() {
    let mut cfg = small(4, long_doc(1024, 8), Arrivals::Closed { concurrency: 4 });
    cfg.max_requests = Some(60);
    let base = arm(2, 2, "cache_aware");
    let plain = pd_cluster::run(&cfg, &base).unwrap();
    assert_eq!(plain.skipped, 0);
    // The question and the block holding the last token are never cached:
    // a threshold of 0 skips nothing, one above the question skips.
    let none = PdArm {
        skip_prefill_below: Some(0),
        ..base.clone()
    };
    assert_eq!(pd_cluster::run(&cfg, &none).unwrap().skipped, 0);
    let skip = PdArm {
        skip_prefill_below: Some(128),
        ..base
    };
    let s = pd_cluster::run(&cfg, &skip).unwrap();
    assert_eq!(s.completed, 60);
    assert!(s.skipped > 30, "{}", s.skipped);
    // Skipped requests are not prefills, nor transfers.
    assert_eq!(s.transfer_ms.len() as u64, 60 - s.skipped);
    assert_eq!(s.per_prefill.iter().sum::<u64>(), 60 - s.skipped);
    // The prefill pool's cache held the documents too: what skipping saves
    // is the round trip (prefill queue, transfer), not computation.
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    assert!(
        mean(&s.ttft_ms) < mean(&plain.ttft_ms),
        "{} vs {}",
        mean(&s.ttft_ms),
        mean(&plain.ttft_ms)
    );
}

fn args(extra: &[&str]) -> Result<SimulateArgs, clap::Error> {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimulateArgs,
    }
    let mut argv = vec!["simulate"];
    argv.extend_from_slice(extra);
    Cli::try_parse_from(argv).map(|c| c.sim)
}

#[test]
fn bad_pd_values_are_precise_errors() {
    for (value, says) in [
        ("0:2", "the prefill pool needs at least 1 worker"),
        ("2:0", "the decode pool needs at least 1 worker"),
        ("x", "expected P:D"),
        ("2:x", "the decode worker count \"x\" is not a whole number"),
        (
            "-1:2",
            "the prefill worker count \"-1\" is not a whole number",
        ),
        ("", "expected P:D"),
        ("2:5000", "at most 2048"),
    ] {
        let e = PdShape::parse(value).unwrap_err().to_string();
        assert!(e.contains(&format!("--pd {value:?}")), "{e}");
        assert!(e.contains(says), "{value}: {e}");
        // The same through the flags.
        let a = args(&[&format!("--pd={value}")]).unwrap();
        let e = a.pd_plan().unwrap_err().to_string();
        assert!(e.contains(says), "{value}: {e}");
    }
    assert_eq!(
        PdShape::parse(" 3 : 1 ").unwrap(),
        PdShape {
            prefill: 3,
            decode: 1
        }
    );
    let plan = |extra: &[&str]| args(extra).unwrap().pd_plan();
    let e = plan(&["--pd", "2:2", "--decode-policy", "oracle"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("--decode-policy: oracle is the simulator's reference")
    );
    let e = plan(&["--pd", "2:2", "--prefill-policy", "nope"]).unwrap_err();
    assert!(e.to_string().contains("unknown policy \"nope\""), "{e}");
    let e = plan(&["--pd", "2:2", "--pd-transfer-bandwidth", "0"]).unwrap_err();
    assert!(e.to_string().contains("--pd-transfer-bandwidth"), "{e}");
    let e = plan(&["--pd", "2:2", "--pd-transfer-bandwidth", "50"]).unwrap_err();
    assert!(e.to_string().contains("bytes per second"), "{e}");
    // The router's defaults and vocabulary: power_of_two on decode, bytes
    // per second on the link, --pd-skip-prefill-tokens with 0 = never.
    let p = plan(&["--pd", "2:2"]).unwrap().unwrap();
    assert_eq!(p.decode_policy.name(), "power_of_two");
    assert_eq!(p.transfer, Transfer::default());
    assert_eq!(p.skip_prefill_tokens, None);
    let p = plan(&["--pd", "2:2", "--pd-transfer-bandwidth", "25000000000"]);
    assert_eq!(p.unwrap().unwrap().transfer.bytes_per_sec, 25e9);
    let skip = |n: &str| plan(&["--pd", "2:2", "--pd-skip-prefill-tokens", n]);
    assert_eq!(skip("0").unwrap().unwrap().skip_prefill_tokens, None);
    assert_eq!(skip("32").unwrap().unwrap().skip_prefill_tokens, Some(32));
    let e = skip("65537").unwrap_err().to_string();
    assert!(
        e.contains("--pd-skip-prefill-tokens must be at most 65536"),
        "{e}"
    );
    assert!(args(&["--pd", "2:2", "--pd-skip-prefill-threshold", "8"]).is_err());
    // PD flags need --pd; --pd sizes the pool itself.
    assert!(args(&["--prefill-policy", "round_robin"]).is_err());
    assert!(args(&["--pd", "2:2", "--workers", "4"]).is_err());
    assert!(plan(&[]).unwrap().is_none());
}

#[test]
fn the_report_has_every_arm_in_text_and_json() {
    let a = args(&[
        "--pd",
        "2:1",
        "--workload",
        "long-doc",
        "--document-tokens",
        "512",
        "--output-tokens",
        "4",
        "--requests",
        "30",
        "--pd-skip-prefill-tokens",
        "64",
    ])
    .unwrap();
    let plan: PdPlan = a.pd_plan().unwrap().unwrap();
    let report = plan.execute(&a.sim_config().unwrap()).unwrap();
    let arms: Vec<(&str, &str, &str)> = report
        .arms
        .iter()
        .map(|r| {
            (
                r.arm.as_str(),
                r.workers.as_str(),
                r.prefill_policy.as_str(),
            )
        })
        .collect();
    assert_eq!(
        arms,
        [
            ("co-located", "3", "cache_aware"),
            ("pd", "2P+1D", "cache_aware"),
            ("pd", "2P+1D", "round_robin"),
            ("pd+skip", "2P+1D", "cache_aware"),
        ]
    );
    assert!(report.arms.iter().all(|r| r.completed == 30));
    let text = report.table();
    for s in [
        "PD: 2 prefill + 1 decode workers against 3 co-located; KV moves at 50000000000 B/s (50 GB/s), 131072 B per token",
        "itl_p99",
        "\nitl_*     inter-token latency",
        "\npd+skip   a request whose decode worker holds all but at most 64",
    ] {
        assert!(text.contains(s), "`{s}` not in\n{text}");
    }
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["arms"][1]["decode_policy"], "power_of_two");
    assert_eq!(json["transfer_bandwidth"], 50e9);
    assert_eq!(json["skip_prefill_tokens"], 64);
    assert!(json["arms"][1]["itl_ms"]["p99"].as_f64().unwrap() > 0.0);
    assert!(json["arms"][0]["transfer_ms"].is_null());
}
