//! Flag parsing: defaults, translation, and precise errors.

use clap::Parser;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    load: LoadArgs,
}

fn parse(args: &str) -> Result<LoadArgs, clap::Error> {
    let argv = std::iter::once("load").chain(args.split_whitespace());
    Cli::try_parse_from(argv).map(|c| c.load)
}

fn config_err(args: &str) -> String {
    match parse(args).unwrap().workload_config() {
        Err(SimError::Config(m)) => m,
        other => panic!("{args}: {other:?}"),
    }
}

#[test]
fn defaults_and_flags_reach_the_config_and_plan() {
    let a = parse("--url http://x:1").unwrap();
    assert_eq!(
        a.workload_config().unwrap(),
        WorkloadConfig::SharedPrefix(Default::default())
    );
    let p = a.plan(false).unwrap();
    assert_eq!(
        p.arrivals,
        Arrivals::Closed {
            concurrency: DEFAULT_CONCURRENCY
        }
    );
    assert_eq!(p.max_requests, Some(DEFAULT_REQUESTS));
    let a = parse("--url http://x:1 --workload multi-turn --turns 3 --think-ms 0 --output-tokens 9 --rate 5 --duration 2").unwrap();
    let WorkloadConfig::MultiTurn(c) = a.workload_config().unwrap() else {
        panic!()
    };
    assert_eq!((c.turns, c.think_ms, c.output_tokens), (3, 0.0, 9));
    let p = a.plan(false).unwrap();
    assert_eq!(p.arrivals, Arrivals::Poisson { rate: 5.0 });
    assert_eq!(
        (p.max_requests, p.duration),
        (None, Some(Duration::from_secs(2)))
    );
    let a = parse("--url http://x:1 --workload trace --trace t.jsonl --speedup 10").unwrap();
    let WorkloadConfig::Trace(t) = a.workload_config().unwrap() else {
        panic!()
    };
    assert_eq!(t.speedup, 10.0);
    let p = a.plan(true).unwrap();
    assert_eq!((p.arrivals, p.max_requests), (Arrivals::Timestamps, None));
    let a = parse(
        "--url http://x:1 --workload mixed --mix shared-prefix=1,agentic=3 --steps 2 --groups 5",
    )
    .unwrap();
    let WorkloadConfig::Mixed(m) = a.workload_config().unwrap() else {
        panic!()
    };
    assert_eq!(m.parts.len(), 2);
    assert_eq!(m.parts[1].weight, 3.0);
}

#[test]
fn bad_flags_are_precise_errors() {
    assert!(
        config_err("--url http://x:1 --turns 3")
            .contains("--turns does not apply to --workload shared-prefix")
    );
    assert!(
        config_err("--url http://x:1 --workload agentic --zipf 1 --groups 2")
            .contains("do not apply")
    );
    assert!(config_err("--url http://x:1 --workload trace").contains("needs --trace"));
    assert!(config_err("--url http://x:1 --groups 0").contains("groups must be > 0"));
    assert!(
        config_err("--url http://x:1 --workload mixed --mix trace=1").contains("cannot be blended")
    );
    assert!(config_err("--url http://x:1 --workload mixed --mix agentic").contains("NAME=WEIGHT"));
    assert!(
        config_err("--url http://x:1 --workload mixed --mix agentic=x").contains("not a number")
    );
    assert!(
        config_err("--url http://x:1 --workload-file /nonexistent.json").contains("cannot read")
    );
    assert!(
        parse("--url http://x:1 --rate 1 --concurrency 2").is_err(),
        "clap rejects both"
    );
    assert!(parse("").is_err(), "--url is required");
    let plan_err = |args: &str, ts| match parse(args).unwrap().plan(ts) {
        Err(SimError::Config(m)) => m,
        other => panic!("{args}: {other:?}"),
    };
    assert!(plan_err("--url http://x:1 --rate 0", false).contains("--rate"));
    assert!(plan_err("--url http://x:1 --rate 2", true).contains("timestamps"));
    assert!(plan_err("--url http://x:1 --duration=-1", false).contains("--duration"));
    // Too long is said as such, with the bound (it read "> 0, got 1e30").
    let long = plan_err("--url http://x:1 --duration 1e30", false);
    assert!(long.contains("at most 10000000"), "{long}");
    assert!(plan_err("--url http://x:1 --requests 0", false).contains("--requests"));
    assert!(plan_err("--url http://x:1 --concurrency 0", false).contains("--concurrency"));
    assert!(
        parse("--url http://x:1 --timeout 0")
            .unwrap()
            .request_timeout()
            .is_err()
    );
    assert!(
        parse("--url http://x:1 --chars-per-token 0")
            .unwrap()
            .text_shape()
            .is_err()
    );
    assert_eq!(parse("--url http://x:1").unwrap().max_error_rate, 0.0);
    for bad in ["1.5", "-0.1", "NaN"] {
        let err = parse(&format!("--url http://x:1 --max-error-rate={bad}"))
            .unwrap()
            .max_error_rate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("--max-error-rate"), "{bad}: {err}");
    }
}

/// `--rate` is the mean of the Poisson gaps' inverse: 1e-300 passed the
/// `> 0` check and panicked drawing the first gap as a `Duration`.
#[test]
fn rate_has_a_floor() {
    let plan = |args: &str| parse(args).unwrap().plan(false);
    for bad in ["1e-300", "0.0009"] {
        let e = plan(&format!("--url http://x:1 --rate {bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--rate") && e.contains("0.001"), "{bad}: {e}");
    }
    assert!(plan("--url http://x:1 --rate 0.001").is_ok());
    assert!(plan("--url http://x:1 --rate 1e9").is_ok());
}

/// Closed-loop clients are state kept for the whole run: 10^8 took 6.6 GB
/// in `simulate` before its first request.
#[test]
fn concurrency_has_a_range() {
    let plan = |args: &str| parse(args).unwrap().plan(false);
    for bad in ["0", "100001", "100000000"] {
        let e = plan(&format!("--url http://x:1 --concurrency {bad}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--concurrency must be in 1..=100000"),
            "{bad}: {e}"
        );
    }
    assert!(plan("--url http://x:1 --concurrency 100000").is_ok());
}

/// `--speedup` divides the trace's times: 1e-300 passed the `> 0` check
/// and panicked making the second arrival a `Duration`.
#[test]
fn speedup_has_a_range() {
    let trace = "--url http://x:1 --workload trace --trace t.jsonl";
    for bad in ["1e-300", "0.0009", "1e300", "2e6"] {
        let e = config_err(&format!("{trace} --speedup {bad}"));
        assert!(e.contains("speedup") && e.contains("0.001"), "{bad}: {e}");
    }
    for good in ["0.001", "1000000"] {
        let a = parse(&format!("{trace} --speedup {good}")).unwrap();
        assert!(a.workload_config().is_ok(), "{good}");
    }
}

/// Think and tool times are means of exponential draws: 1e300 ms passed the
/// `>= 0` check and panicked making the first pause a `Duration`.
#[test]
fn think_and_tool_times_are_at_most_a_day() {
    for (workload, flag) in [("multi-turn", "think-ms"), ("agentic", "tool-ms")] {
        let args = |v: &str| format!("--url http://x:1 --workload {workload} --{flag} {v}");
        for bad in ["1e300", "86400001"] {
            let e = config_err(&args(bad));
            let name = flag.replace('-', "_");
            assert!(e.contains(&name) && e.contains("86400000"), "{bad}: {e}");
        }
        assert!(parse(&args("86400000")).unwrap().workload_config().is_ok());
    }
}

/// `--block-tokens` sizes the text of every block: 1e15 passed the `> 0`
/// check and aborted the process allocating the first prompt.
#[test]
fn block_tokens_has_a_ceiling() {
    let trace = "--url http://x:1 --workload trace --trace t.jsonl";
    for bad in ["1000000000000000", "1048577"] {
        let e = config_err(&format!("{trace} --block-tokens {bad}"));
        assert!(
            e.contains("block_tokens") && e.contains("1048576"),
            "{bad}: {e}"
        );
    }
    let a = parse(&format!("{trace} --block-tokens 1048576")).unwrap();
    assert!(a.workload_config().is_ok());
}

#[test]
fn workload_file_uses_the_serde_schema() {
    let dir = std::env::temp_dir().join(format!("radixgate-load-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("w.json");
    std::fs::write(&f, r#"{"long-doc": {"documents": 2}}"#).unwrap();
    let a = parse(&format!("--url http://x:1 --workload-file {}", f.display())).unwrap();
    let WorkloadConfig::LongDoc(c) = a.workload_config().unwrap() else {
        panic!()
    };
    assert_eq!(c.documents, 2);
    std::fs::write(&f, r#"{"long-doc": {"docs": 2}}"#).unwrap();
    assert!(a.workload_config().is_err(), "unknown field rejected");
    let a = parse(&format!(
        "--url http://x:1 --workload-file {} --groups 3",
        f.display()
    ))
    .unwrap();
    assert!(
        a.workload_config()
            .unwrap_err()
            .to_string()
            .contains("--groups")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each workload flag's help states, in `[default: …]`, the default of
/// every workload it applies to: setting a flag to its stated default
/// changes no workload's config.
#[test]
fn workload_flag_help_states_each_workloads_default() {
    use clap::CommandFactory;

    #[derive(Debug, Parser)]
    struct Knobs {
        #[command(flatten)]
        knobs: WorkloadFlags,
    }
    let all = ["shared-prefix", "multi-turn", "long-doc", "agentic"];
    let config = |workload: &str, extra: &str| {
        let trace = if workload == "trace" {
            "--trace t.jsonl"
        } else {
            ""
        };
        parse(&format!(
            "--url http://x:1 --workload {workload} {trace} {extra}"
        ))
        .unwrap()
        .workload_config()
        .unwrap_or_else(|e| panic!("{workload} {extra}: {e}"))
    };
    let mut checked = 0;
    for arg in Knobs::command().get_arguments() {
        let long = arg.get_long().unwrap();
        let help = arg.get_help().unwrap().to_string();
        let (applies, _) = help.split_once(": ").unwrap();
        let workloads: Vec<&str> = if applies == "all but trace" {
            all.to_vec()
        } else {
            applies.split(", ").collect()
        };
        if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
            // A switch: off unless given, and given it changes the config.
            assert!(help.ends_with("[default: off]"), "--{long}: {help}");
            for &workload in &workloads {
                assert_ne!(config(workload, &format!("--{long}")), config(workload, ""));
                checked += 1;
            }
            continue;
        }
        let Some((_, default)) = help.split_once("[default: ") else {
            // The file, and the model picked from it: no value stands
            // for the default.
            assert!(
                matches!(long, "trace" | "trace-model"),
                "--{long} states no default: {help}"
            );
            continue;
        };
        let default = default.strip_suffix(']').unwrap();
        for item in default.split(", ") {
            // `64 shared-prefix and long-doc`, or a value for all of them.
            let (value, named) = match item.split_once(' ') {
                Some((value, names)) => (value, names.split(" and ").collect()),
                None => (item, workloads.clone()),
            };
            for workload in named {
                assert!(workloads.contains(&workload), "--{long}: {workload}");
                assert_eq!(
                    config(workload, &format!("--{long} {value}")),
                    config(workload, ""),
                    "--{long} {value} is not {workload}'s default"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 27, "{checked}");
}
