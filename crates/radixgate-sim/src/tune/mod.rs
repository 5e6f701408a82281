//! `radixgate tune`: the routing settings that would have served a
//! recording best.
//!
//! A recording of production traffic (`radixgate serve --record-trace`,
//! one Mooncake-format line per request with the worker that served it
//! and the cached tokens it reported) is replayed by the offline
//! simulator ([`crate::simulate`]) at its own timestamps, against a pool of
//! the given worker model:
//!
//! 1. the prediction check ([`predict`]): each request pinned to the
//!    worker that served it; simulated against recorded hit rate per
//!    worker, and the current settings' own simulated routing against the
//!    recorded total;
//! 2. the current settings (the gateway config's `routing:` section,
//!    passed in by the binary, or the defaults), then every point of the
//!    grid of `cache_threshold` × `balance_abs_threshold` ×
//!    `balance_rel_threshold` (and any `--sweep` axis) applied to them;
//! 3. the choice ([`search::choose`]): the lowest mean TTFT among the
//!    points whose hit rate is at least the current settings' minus
//!    `--hit-tolerance` points; its gain over the current settings and
//!    the config lines that set it.
//!
//! Layout: [`args`] (flags), [`recording`] (the file, its workers and
//! reports), [`predict`], [`search`] (grid, parallel runs, choice),
//! [`report`] (text and JSON).

pub mod args;
pub mod predict;
pub mod recording;
pub mod report;
pub mod search;

use radixgate_routing::PolicyConfig;

pub use args::TuneArgs;
pub use predict::Prediction;
pub use recording::Recording;
pub use report::TuneReport;

use crate::SimError;
use crate::simulate::Contender;
use search::Outcome;

/// Runs the whole tuning of `args`' recording, `current` being the
/// settings it is measured against.
pub fn run(args: &TuneArgs, current: &PolicyConfig) -> Result<TuneReport, SimError> {
    current.validate()?;
    let tolerance = args.tolerance()?;
    let axes = args.axes()?;
    let grid = search::grid(current, &axes)?;
    // The replay's ranges before the file is read with them: read in
    // blocks of 0 tokens, its first line "did not fit 2 blocks of 0 tokens".
    args.trace_config().validate()?;
    let rec = Recording::load(
        &args.trace,
        args.block_tokens,
        args.model.as_deref(),
        args.requests.unwrap_or(0),
    )?;
    if rec.replayed() == 0 {
        return Err(SimError::Config(format!(
            "{}: none of its {} requests is replayed (no line has a 2xx status): nothing to \
             tune on",
            rec.path.display(),
            rec.records.len()
        )));
    }
    let workers = match args.workers {
        Some(n) => n,
        None if rec.workers.is_empty() => {
            return Err(SimError::Config(format!(
                "{} names no workers (not a recording?): give the pool size with --workers",
                rec.path.display()
            )));
        }
        None => rec.workers.len(),
    };
    let cfg = args.sim_config(workers)?;
    let no_prediction = predict::unavailable(&rec, workers);
    let mut prediction = match no_prediction {
        None => Some(predict::pinned(&cfg, &rec)?),
        Some(_) => None,
    };
    let mut contenders = vec![Contender::Policy(current.clone())];
    contenders.extend(grid.iter().map(|(_, p)| Contender::Policy(p.clone())));
    let mut stats = search::run_all(&cfg, &contenders, args.threads())?.into_iter();
    let base = stats.next().expect("the current settings ran");
    // With nothing completed every run's TTFT is NaN and no point can be
    // quicker: "nothing to change" would be a verdict without data.
    if base.completed == 0 {
        return Err(SimError::Config(format!(
            "none of the {} replayed requests of {} completed in the simulation ({} refused \
             by the simulated workers as larger than their KV cache of {} tokens): nothing \
             to tune on",
            rec.replayed(),
            rec.path.display(),
            base.failed,
            cfg.worker.engine.capacity_tokens()
        )));
    }
    if let Some(p) = prediction.as_mut() {
        p.policy_hit_rate = predict::reported_subset(&rec, &base).hit_rate();
    }
    // The current settings' values of the swept keys, for the label.
    let current_point = axes
        .iter()
        .map(|a| (a.key.clone(), setting(current, &a.key)))
        .collect();
    let current_run = Outcome::of(current_point, &base);
    let runs: Vec<Outcome> = grid
        .into_iter()
        .zip(stats)
        .map(|((point, _), s)| Outcome::of(point, &s))
        .collect();
    let best = search::choose(&current_run, &runs, tolerance).map(|i| runs[i].clone());
    Ok(TuneReport {
        trace: args.trace.display().to_string(),
        model: args.model.clone(),
        requests: rec.records.len(),
        replayed: rec.replayed(),
        span_secs: rec.span_secs(),
        workers,
        policy: current.name().into(),
        equal_hit_rate: format!(
            "\"equal hit rate\" = at least the current settings' hit rate minus {} points",
            args.hit_tolerance
        ),
        hit_tolerance_points: args.hit_tolerance,
        prediction,
        no_prediction,
        ttft_change_pct: best
            .as_ref()
            .map(|b| (b.ttft_mean_ms / current_run.ttft_mean_ms - 1.0) * 100.0),
        hit_rate_change_points: best
            .as_ref()
            .map(|b| (b.hit_rate - current_run.hit_rate) * 100.0),
        config: best
            .as_ref()
            .map(|b| search::yaml_lines(current.name(), &b.point)),
        current: current_run,
        best,
        runs,
    })
}

/// The value of the (dotted) setting `key` in `cfg`'s serde form.
fn setting(cfg: &PolicyConfig, key: &str) -> serde_json::Value {
    let mut v = serde_json::to_value(cfg).unwrap_or_default();
    for part in key.split('.') {
        v = v.get(part).cloned().unwrap_or_default();
    }
    v
}

/// The command: tunes and prints the report (text, or JSON with `--json`).
pub fn main(args: &TuneArgs, current: &PolicyConfig) -> Result<(), SimError> {
    let report = run(args, current)?;
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| SimError::Io(std::io::Error::other(e)))?;
        println!("{text}");
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TuneArgs,
    }

    fn tune(trace: &std::path::Path, more: &[&str]) -> Result<TuneReport, SimError> {
        let mut argv = vec![
            "tune",
            "--trace",
            trace.to_str().unwrap(),
            "--block-tokens",
            "16",
        ];
        argv.extend(more);
        let cli = Cli::try_parse_from(argv).unwrap();
        run(&cli.args, &PolicyConfig::default())
    }

    /// A recording with nothing to replay (every answer a 500), or whose
    /// requests the simulated workers all refuse, was "tuned": every run's
    /// TTFT was NaN, and the report said the current settings were the
    /// quickest at equal hit rate, nothing to change.
    #[test]
    fn a_recording_with_nothing_completed_is_an_error_not_a_verdict() {
        let dir = std::env::temp_dir().join(format!("radixgate-tune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = |t: u64, status: u16| {
            format!(
                "{{\"timestamp\": {t}, \"input_length\": 64, \"output_length\": 2, \
                 \"hash_ids\": [1, 2, 3, 4], \"worker\": \"http://a\", \
                 \"cached_tokens\": 0, \"status\": {status}}}\n"
            )
        };
        let failed = dir.join("failed.jsonl");
        std::fs::write(&failed, line(0, 500) + &line(10, 503)).unwrap();
        let e = tune(&failed, &["--workers", "2"]).unwrap_err().to_string();
        assert!(e.contains("none of its 2 requests is replayed"), "{e}");
        let ok = dir.join("ok.jsonl");
        std::fs::write(&ok, line(0, 200) + &line(10, 200)).unwrap();
        // 64 prompt + 2 output tokens do not fit a 64-token cache.
        let e = tune(&ok, &["--kv-capacity-tokens", "64"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("none of the 2 replayed requests") && e.contains("2 refused"),
            "{e}"
        );
        // A flag out of range is named as such, not blamed on the file.
        let mut argv = vec!["tune", "--trace", ok.to_str().unwrap()];
        argv.extend(["--block-tokens", "0"]);
        let cli = Cli::try_parse_from(argv).unwrap();
        let e = run(&cli.args, &PolicyConfig::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("block_tokens must be in 1..="), "{e}");
        // Room for them: a report.
        let report = tune(&ok, &["--kv-capacity-tokens", "4096"]).unwrap();
        assert_eq!(report.current.completed, 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A recording of a router serving two models (each on its own
    /// workers) was tuned as one pool: every setting's run sent one model's
    /// requests to the other's workers, and the report printed those
    /// figures as the recording's, with nothing said. Now such a recording
    /// is refused unless `--model` picks the pool to tune.
    #[test]
    fn a_recording_of_two_models_is_tuned_one_model_at_a_time() {
        let dir =
            std::env::temp_dir().join(format!("radixgate-tune-models-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut text = String::new();
        for i in 0..12u64 {
            let (model, worker) = match i % 3 {
                0 => ("llama", "http://a"),
                1 => ("llama", "http://b"),
                _ => ("qwen", "http://c"),
            };
            text += &format!(
                "{{\"timestamp\": {}, \"input_length\": 40, \"output_length\": 2, \
                 \"hash_ids\": [{}, {i}, 7], \"model\": \"{model}\", \"worker\": \"{worker}\", \
                 \"cached_tokens\": 16, \"status\": 200}}\n",
                i * 10,
                i % 3
            );
        }
        let path = dir.join("two.jsonl");
        std::fs::write(&path, text).unwrap();
        let e = tune(&path, &["--kv-capacity-tokens", "4096"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("2 models") && e.contains("llama (8 lines)") && e.contains("qwen (4 lines)"),
            "{e}"
        );
        assert!(e.contains("--model"), "{e}");
        let llama = tune(&path, &["--kv-capacity-tokens", "4096", "--model", "llama"]).unwrap();
        assert_eq!((llama.requests, llama.workers), (8, 2));
        let checked: Vec<&str> = llama
            .prediction
            .as_ref()
            .expect("a prediction check")
            .workers
            .iter()
            .map(|w| w.worker.as_str())
            .collect();
        assert_eq!(checked, ["http://a", "http://b"]);
        assert_eq!(llama.current.completed, 8);
        let e = tune(&path, &["--model", "mistral"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no line of model \"mistral\"") && e.contains("qwen"),
            "{e}"
        );
        // `simulate` and `load` replay through the same loader.
        let shape = crate::workload::TextShape { chars_per_token: 4 };
        let cfg = |model: Option<&str>| crate::workload::TraceConfig {
            block_tokens: 16,
            model: model.map(str::to_owned),
            ..crate::workload::TraceConfig::new(&path)
        };
        let e = crate::workload::TraceReplay::new(cfg(None), 0, shape)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--trace-model"), "{e}");
        let qwen = crate::workload::TraceReplay::new(cfg(Some("qwen")), 0, shape).unwrap();
        assert_eq!(qwen.len(), 4);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
