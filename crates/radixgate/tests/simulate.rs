//! `radixgate simulate` as CI runs it (a small smoke run of the binary), and
//! the simulator's routing text held to what the gateway itself extracts.
//!
//! Both render by the one rule in `radixgate_routing::text`; what the second
//! test still guards is everything around it: the bodies `radixgate load`
//! builds and the gateway's parsing of them must carry the same pieces the
//! simulator renders from the workload directly.

use std::process::Command;

use radixgate::inspect;
use radixgate_routing::Api;
use radixgate_sim::load::BodyOptions;
use radixgate_sim::load::body::request_body;
use radixgate_sim::simulate::text::routing_text;
use radixgate_sim::workload::{
    AgenticConfig, MultiTurnConfig, Poll, SharedPrefixConfig, TextShape, WorkloadConfig,
};

#[test]
fn smoke_run_reports_every_policy_and_the_oracle() {
    let out = Command::new(env!("CARGO_BIN_EXE_radixgate"))
        .args([
            "simulate",
            "--workers",
            "3",
            "--requests",
            "120",
            "--groups",
            "4",
            "--prompts-per-group",
            "8",
            "--system-tokens",
            "256",
            "--output-tokens",
            "4",
            "--sweep",
            "cache_threshold=0.2,0.6",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "cache_aware",
            "cache_aware",
            "prefill_aware",
            "least_load",
            "round_robin",
            "oracle"
        ]
    );
    assert_eq!(rows[1]["params"], "cache_threshold=0.6");
    for r in rows {
        assert_eq!(r["completed"], 120, "{r}");
        assert!(r["hit_rate"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["oracle_fraction"].as_f64().is_some(), "{r}");
    }
    // A setting no chosen policy has is a clear error, not a silent no-op.
    let bad = Command::new(env!("CARGO_BIN_EXE_radixgate"))
        .args([
            "simulate",
            "--policies",
            "round_robin",
            "--sweep",
            "cache_threshold=0.5",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("none of the chosen policies"));
}

#[test]
fn pd_run_reports_each_arm_and_a_bad_shape_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_radixgate"))
        .args([
            "simulate",
            "--pd",
            "2:1",
            "--workload",
            "long-doc",
            "--document-tokens",
            "512",
            "--output-tokens",
            "4",
            "--requests",
            "20",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let arms: Vec<(&str, &str)> = v["arms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["arm"].as_str().unwrap(),
                a["prefill_policy"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        arms,
        [
            ("co-located", "cache_aware"),
            ("pd", "cache_aware"),
            ("pd", "round_robin")
        ]
    );
    for a in v["arms"].as_array().unwrap() {
        assert_eq!(a["completed"], 20, "{a}");
    }
    // The router's and the simulated worker's defaults: power_of_two picks
    // decode workers, the link is 50000000000 bytes per second.
    assert_eq!(v["arms"][1]["decode_policy"], "power_of_two");
    assert_eq!(v["transfer_bandwidth"], 50e9);
    assert!(v["skip_prefill_tokens"].is_null());
    // A bandwidth in GB/s is refused, naming the unit.
    let bad = Command::new(env!("CARGO_BIN_EXE_radixgate"))
        .args(["simulate", "--pd=2:2", "--pd-transfer-bandwidth", "50"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(stderr.contains("bytes per second"), "{stderr}");
    for (shape, says) in [
        ("0:2", "the prefill pool needs at least 1 worker"),
        ("2:0", "the decode pool needs at least 1 worker"),
        ("x", "expected P:D"),
    ] {
        let bad = Command::new(env!("CARGO_BIN_EXE_radixgate"))
            .args(["simulate", &format!("--pd={shape}")])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&bad.stderr);
        assert!(!bad.status.success(), "{shape}");
        assert!(stderr.contains(says), "{shape}: {stderr}");
        assert!(!stderr.contains("panicked"), "{shape}: {stderr}");
    }
}

#[test]
fn simulated_routing_text_is_the_gateways() {
    let workloads = [
        WorkloadConfig::SharedPrefix(SharedPrefixConfig::default()),
        WorkloadConfig::MultiTurn(MultiTurnConfig {
            think_ms: 0.0,
            ..MultiTurnConfig::default()
        }),
        WorkloadConfig::Agentic(AgenticConfig {
            tool_ms: 0.0,
            ..AgenticConfig::default()
        }),
    ];
    for wl in workloads {
        let mut w = wl.build(3, TextShape::default()).unwrap();
        let mut now = std::time::Duration::ZERO;
        for _ in 0..40 {
            let spec = match w.next(now) {
                Poll::Ready(spec) => spec,
                Poll::NotBefore(t) => {
                    now = t;
                    continue;
                }
                Poll::AwaitReply | Poll::Done => break,
            };
            for api in [Api::ChatCompletions, Api::Completions, Api::Generate] {
                let opts = BodyOptions {
                    api,
                    model: Some("m".into()),
                    stream: true,
                };
                let body = serde_json::to_vec(&request_body(&spec, &opts)).unwrap();
                let seen = inspect::inspect(api, &body).unwrap().routing_text;
                assert_eq!(seen, routing_text(&spec.prompt, api), "{api:?}");
            }
            w.on_reply(spec.session, "a reply", now);
        }
    }
}

/// A replica flag with one router and no `replicas` sweep did nothing, and
/// the run said nothing of it; it is refused, naming what it needs. With
/// replicas, or swept, it is taken. And `load --no-model` with a `--model`
/// is refused rather than one of the two ignored.
#[test]
fn flags_that_would_be_ignored_are_refused() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_radixgate"))
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        (out.status.success(), stderr)
    };
    let short = ["simulate", "--requests", "10", "--policies", "round_robin"];
    for flag in [
        &["--no-sync"][..],
        &["--sync-delay-ms", "5"],
        &["--replica-spread", "client-hash"],
    ] {
        let (ok, stderr) = run(&[&short[..], flag].concat());
        assert!(!ok, "{flag:?}");
        assert!(
            stderr.contains(flag[0]) && stderr.contains("--replicas N"),
            "{flag:?}: {stderr}"
        );
        for with in [&["--replicas", "2"][..], &["--sweep", "replicas=1,2"]] {
            let (ok, stderr) = run(&[&short[..], flag, with].concat());
            assert!(ok, "{flag:?} {with:?}: {stderr}");
        }
    }
    let (ok, stderr) = run(&[
        "load",
        "--url",
        "http://127.0.0.1:9",
        "--no-model",
        "--model",
        "m",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("--no-model") && stderr.contains("--model"),
        "{stderr}"
    );
}
