//! Recording production traffic (`record_trace`) end to end: a real gateway
//! in front of real simulated workers on loopback records what it routes;
//! the file replays in `radixgate simulate`, the simulator predicts each
//! worker's reported hit rate from it, no prompt text is in it, the admin
//! API switches and rotates it behind the admin gate, and `tune` on a
//! recording made with bad settings finds settings whose real re-run hits
//! the cache more.

mod common;

use clap::Parser;
use common::*;
use radixgate::config::Config;
use radixgate_routing::{CacheAwareConfig, PolicyConfig};
use radixgate_sim::load::{LoadArgs, LoadReport};
use radixgate_sim::server::WorkerConfig;
use radixgate_sim::simulate::SimulateArgs;
use radixgate_sim::tune::{Recording, TuneArgs};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

#[derive(Parser)]
enum Cli {
    Load(Box<LoadArgs>),
    Simulate(Box<SimulateArgs>),
    Tune(Box<TuneArgs>),
}

fn parse(argv: &str) -> Cli {
    Cli::try_parse_from(std::iter::once("radixgate").chain(argv.split_whitespace())).unwrap()
}

async fn load(argv: &str) -> LoadReport {
    let Cli::Load(args) = parse(&format!("load {argv} --no-progress")) else {
        unreachable!()
    };
    let report = radixgate_sim::load::run(&args).await.unwrap();
    assert_eq!(report.failed, 0, "{}", report.table());
    report
}

/// A fresh directory for one test's files.
fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("radixgate-rec-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every line of a recording, parsed.
fn recorded(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The workers of the prediction and tuning tests: the default timing
/// model (its times, tens of milliseconds a prefill, outweigh a debug
/// build's own costs, so simulated and real runs overlap requests alike;
/// with the common fast worker's microsecond steps the two differed by up
/// to 4.6 points of a worker's hit rate), and a KV cache small enough
/// that the shared-prefix groups do not all fit, so routing decides the
/// hit rate. Written to a file for `simulate` and `tune`.
fn worker_config(dir: &Path) -> (WorkerConfig, PathBuf) {
    let mut w = WorkerConfig::default();
    w.engine.kv_capacity_tokens = 12_000;
    let path = dir.join("worker.json");
    std::fs::write(&path, serde_json::to_string(&w).unwrap()).unwrap();
    (w, path)
}

async fn workers(n: usize, w: &WorkerConfig) -> Vec<SimWorker> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(sim_worker(w.clone()).await);
    }
    out
}

fn urls(ws: &[SimWorker]) -> Vec<&str> {
    ws.iter().map(|w| w.url.as_str()).collect()
}

/// `METHOD /record_trace` on the admin plane, with an optional bearer key:
/// the status and the JSON answer.
async fn admin(gw: &str, method: &str, body: Option<Value>, key: Option<&str>) -> (u16, Value) {
    let url = format!("{gw}/record_trace");
    let c = client();
    let mut req = match method {
        "GET" => c.get(url),
        "POST" => c.post(url),
        "DELETE" => c.delete(url),
        other => panic!("{other}"),
    };
    if let Some(body) = body {
        req = req.json(&body);
    }
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// Waits until the gateway has written `n` lines in all (its counter).
async fn wait_for_lines(gw: &str, n: u64) {
    wait_until(&format!("{n} recorded lines"), || async {
        series_value(gw, "radixgate_record_trace_lines_total").await >= n as f64
    })
    .await;
}

/// Tolerance of the prediction check: each worker's simulated hit rate
/// within 5 points of the one its answers reported (three runs here were
/// within 1.7).
const PREDICTION_TOLERANCE: f64 = 0.05;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_replays_and_predicts_each_workers_hit_rate() {
    let dir = tmp("predict");
    let (w, worker_file) = worker_config(&dir);
    let ws = workers(3, &w).await;
    let path = dir.join("rec.jsonl");
    let mut cfg = config(&urls(&ws));
    cfg.record_trace.path = Some(path.clone());
    let gw = gateway_ready(cfg, 3).await;
    let report = load(&format!(
        "--url {} --workload shared-prefix --groups 6 --rate 30 --requests 150 --seed 3",
        gw.url
    ))
    .await;
    wait_for_lines(&gw.url, 150).await;
    gw.shutdown().await;

    // One line per request, in the Mooncake shape.
    let lines = recorded(&path);
    assert_eq!(lines.len(), 150);
    let served: Vec<&str> = urls(&ws);
    for l in &lines {
        let input = l["input_length"].as_u64().unwrap();
        let blocks = l["hash_ids"].as_array().unwrap().len() as u64;
        assert_eq!(blocks, input.div_ceil(512), "{l}");
        assert!(l["output_length"].as_u64().unwrap() > 0);
        assert!(served.contains(&l["worker"].as_str().unwrap()), "{l}");
        assert_eq!(l["status"], 200);
        assert_eq!(l["lengths"], "usage");
        assert!(
            l["cached_tokens"].is_u64(),
            "the simulated worker reports it"
        );
        assert!(!l["branch"].as_str().unwrap().is_empty());
    }
    // The recorded counts are the workers' own: they add up to what the
    // load tool read from the same answers.
    let sum = |k: &str| lines.iter().map(|l| l[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("input_length"), report.prompt_tokens);
    assert_eq!(sum("cached_tokens"), report.cached_tokens);

    // The file replays in `simulate`, every request.
    let Cli::Simulate(sim) = parse(&format!(
        "simulate --trace {} --workers 3 --policies cache_aware --worker-config {}",
        path.display(),
        worker_file.display()
    )) else {
        unreachable!()
    };
    let replay = sim.execute().unwrap();
    assert_eq!(replay.rows[0].completed, 150, "{}", replay.table());

    // Prediction: the recording replayed as it was routed, per worker.
    let Cli::Tune(tune) = parse(&format!(
        "tune --trace {} --worker-config {}",
        path.display(),
        worker_file.display()
    )) else {
        unreachable!()
    };
    let rec = Recording::load(&path, 512, None, 0).unwrap();
    assert_eq!(rec.workers.len(), 3);
    let sim_cfg = tune.sim_config(3).unwrap();
    let p = radixgate_sim::tune::predict::pinned(&sim_cfg, &rec).unwrap();
    eprintln!("prediction: {p:#?}");
    for w in &p.workers {
        assert!(w.reported >= 20, "{w:?}");
        let (real, sim) = (w.recorded_hit_rate.unwrap(), w.simulated_hit_rate.unwrap());
        assert!(
            (real - sim).abs() <= PREDICTION_TOLERANCE,
            "{}: reported {real:.3}, simulated {sim:.3}",
            w.worker
        );
    }
    // Something to predict: the caches did hit, and not everywhere alike.
    assert!(p.recorded_hit_rate.unwrap() > 0.3, "{p:?}");
    for w in ws {
        w.stop.cancel();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Random letters and digits: no 16-character window of one occurs
/// anywhere else by chance.
fn random_text(seed: u64, chars: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ";
    (0..chars)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_prompt_text_reaches_the_recording() {
    let dir = tmp("privacy");
    let ws = workers(2, &fast_worker()).await;
    let path = dir.join("rec.jsonl");
    let mut cfg = config(&urls(&ws));
    cfg.record_trace.path = Some(path.clone());
    let gw = gateway_ready(cfg, 2).await;
    let model = radixgate_sim::server::DEFAULT_MODEL;
    let c = client();
    let mut prompts = Vec::new();
    // Every API that is routed by its text, short and multi-block prompts,
    // streamed with and without usage; some share a prefix.
    let shared = random_text(99, 3000);
    for i in 0..12u64 {
        let mut text = random_text(i, [40, 700, 5000][i as usize % 3]);
        if i % 4 == 0 {
            text = format!("{shared}{text}");
        }
        let (path, body) = match i % 4 {
            0 => (
                "/v1/chat/completions",
                json!({"model": model, "max_tokens": 5, "stream": true,
                       "messages": [{"role": "system", "content": text}, {"role": "user", "content": "q"}]}),
            ),
            1 => (
                "/v1/chat/completions",
                json!({"model": model, "max_tokens": 5, "stream": true,
                       "stream_options": {"include_usage": true},
                       "messages": [{"role": "user", "content": text}]}),
            ),
            2 => (
                "/v1/completions",
                json!({"model": model, "max_tokens": 5, "prompt": text}),
            ),
            _ => (
                "/generate",
                json!({"text": text, "sampling_params": {"max_new_tokens": 5}}),
            ),
        };
        let r = c
            .post(format!("{}{path}", gw.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        prompts.push(text);
    }
    wait_for_lines(&gw.url, 12).await;
    gw.shutdown().await;

    let file = std::fs::read_to_string(&path).unwrap();
    assert_eq!(file.lines().count(), 12);
    for (i, prompt) in prompts.iter().enumerate() {
        let chars: Vec<char> = prompt.chars().collect();
        for window in chars.windows(16) {
            let window: String = window.iter().collect();
            assert!(
                !file.contains(&window),
                "prompt {i}'s {window:?} is in the recording"
            );
        }
    }
    // A stream without usage still gets lengths, estimated; the one with
    // usage reports them.
    let lines = recorded(&path);
    let estimated: Vec<&Value> = lines
        .iter()
        .filter(|l| l["lengths"] == "estimated")
        .collect();
    assert_eq!(estimated.len(), 3, "the three streams without usage");
    for l in estimated {
        assert!(l["cached_tokens"].is_null());
        // 5 tokens asked; the worker sends one event per token.
        assert_eq!(l["output_length"], 5, "{l}");
        let input = l["input_length"].as_u64().unwrap();
        // The shared 3000 characters and a 40..5000-character prompt, at
        // about 4 characters per token.
        assert!((700..=2400).contains(&input), "{l}");
    }
    // Requests that shared their first 3000 characters share their first
    // block, and only requests that did.
    let first = |l: &Value| l["hash_ids"][0].as_u64().unwrap();
    let firsts: Vec<u64> = lines.iter().map(first).collect();
    let shared_first: Vec<u64> = lines
        .iter()
        .filter(|l| l["input_length"].as_u64().unwrap() > 700 && l["lengths"] == "estimated")
        .map(first)
        .collect();
    assert!(shared_first.windows(2).all(|w| w[0] == w[1]), "{firsts:?}");
    assert_eq!(
        firsts.iter().filter(|&&f| f == shared_first[0]).count(),
        3,
        "{firsts:?}"
    );
    for w in ws {
        w.stop.cancel();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_switches_and_rotates_the_recording_behind_its_gate() {
    // The admin directory one level down, so an escape would land in this
    // test's own fresh directory.
    let top = tmp("admin");
    let dir = top.join("admin");
    std::fs::create_dir_all(&dir).unwrap();
    let ws = workers(1, &fast_worker()).await;
    let mut cfg = config(&urls(&ws));
    cfg.record_trace.admin_dir = dir.clone();
    cfg.server.admin_api_key = Some("sk-admin".into());
    let gw = gateway_ready(cfg, 1).await;
    let key = Some("sk-admin");
    let chat_url = format!("{}/v1/chat/completions", gw.url);
    let send = |n: usize, tag: &'static str| {
        let chat_url = chat_url.clone();
        async move {
            for i in 0..n {
                let r = client()
                    .post(&chat_url)
                    .json(&chat(&format!("{tag} {i}"), false))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
            }
        }
    };

    // Behind the admin gate.
    assert_eq!(admin(&gw.url, "GET", None, None).await.0, 401);
    let body = json!({"path": "t.jsonl", "max_bytes": 1500, "keep": 2});
    assert_eq!(
        admin(&gw.url, "POST", Some(body.clone()), None).await.0,
        401
    );
    assert_eq!(
        admin(&gw.url, "DELETE", None, Some("sk-wrong")).await.0,
        401
    );

    // Off at first: requests are not recorded.
    let (status, state) = admin(&gw.url, "GET", None, key).await;
    assert_eq!((status, &state["recording"]), (200, &json!(false)));
    send(3, "before").await;
    assert_eq!(
        series_value(&gw.url, "radixgate_record_trace_lines_total").await,
        0.0
    );

    // Paths outside the admin directory, and bad bodies, are refused.
    for bad in [
        json!({"path": "../escape.jsonl"}),
        json!({"path": "/etc/escape.jsonl"}),
        json!({"path": "t.jsonl", "keep": 100000}),
        json!({"path": "t.jsonl", "colour": "red"}),
        json!({"file": "t.jsonl"}),
    ] {
        let (status, answer) = admin(&gw.url, "POST", Some(bad.clone()), key).await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert!(answer["error"]["message"].is_string(), "{answer}");
    }
    assert!(!top.join("escape.jsonl").exists());

    // On, with rotation at 1500 bytes keeping two old files.
    let (status, state) = admin(&gw.url, "POST", Some(body), key).await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["recording"], true);
    assert_eq!(state["keep"], 2);
    assert_eq!(
        series_value(&gw.url, "radixgate_record_trace_active").await,
        1.0
    );
    send(20, "during").await;
    wait_for_lines(&gw.url, 20).await;
    let (_, state) = admin(&gw.url, "GET", None, key).await;
    assert_eq!(state["lines"], 20, "{state}");

    // Off again: the answer comes once everything is written.
    let (status, state) = admin(&gw.url, "DELETE", None, key).await;
    assert_eq!(status, 200);
    assert_eq!(state["recording"], false);
    assert_eq!(state["lines"], 20);
    let rotations = state["rotations"].as_u64().unwrap();
    assert!(rotations >= 3, "{state}");
    let path = dir.join("t.jsonl");
    let files = [
        path.clone(),
        PathBuf::from(format!("{}.1", path.display())),
        PathBuf::from(format!("{}.2", path.display())),
    ];
    let mut kept = 0;
    for f in &files {
        let size = std::fs::metadata(f).unwrap().len();
        assert!(size > 0 && size <= 1500, "{}: {size} bytes", f.display());
        kept += recorded(f).len();
    }
    assert!(!PathBuf::from(format!("{}.3", path.display())).exists());
    assert!(kept < 20, "older files beyond keep were dropped");
    assert_eq!(
        series_value(&gw.url, "radixgate_record_trace_active").await,
        0.0
    );
    assert_eq!(
        series_value(&gw.url, "radixgate_record_trace_rotations_total").await,
        rotations as f64
    );
    let newest = recorded(&path).len();
    send(3, "after").await;
    assert_eq!(recorded(&path).len(), newest, "nothing recorded once off");
    gw.shutdown().await;
    for w in ws {
        w.stop.cancel();
    }
    let _ = std::fs::remove_dir_all(&top);
}

/// The routing section of `cfg` with the settings of a tune point.
fn with_point(current: &PolicyConfig, point: &[(String, Value)]) -> PolicyConfig {
    radixgate_sim::simulate::sweep::apply(current, &point.to_vec()).unwrap()
}

/// Serves `argv`'s workload through a fresh gateway with `routing` in
/// front of fresh workers, recording to `record` if given.
async fn serve_workload(
    w: &WorkerConfig,
    routing: PolicyConfig,
    record: Option<&Path>,
    argv: &str,
) -> LoadReport {
    let ws = workers(4, w).await;
    let mut cfg: Config = config(&urls(&ws));
    cfg.routing = routing;
    cfg.record_trace.path = record.map(Path::to_owned);
    let gw = gateway_ready(cfg, 4).await;
    let report = load(&format!("--url {} {argv}", gw.url)).await;
    if record.is_some() {
        wait_for_lines(&gw.url, report.ok).await;
    }
    gw.shutdown().await;
    for w in ws {
        w.stop.cancel();
    }
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tune_on_a_recording_made_with_bad_settings_finds_better_ones() {
    let dir = tmp("tune");
    let (w, worker_file) = worker_config(&dir);
    let workload = "--workload shared-prefix --groups 8 --rate 30 --requests 160 --seed 5";
    // Bad: a hit needs 95% of the prompt matched (the groups' system
    // prompts are about 94% of it), and any load difference is imbalance.
    let bad = PolicyConfig::CacheAware(CacheAwareConfig {
        cache_threshold: 0.95,
        balance_abs_threshold: 0,
        ..CacheAwareConfig::default()
    });
    let path = dir.join("bad.jsonl");
    let before = serve_workload(&w, bad.clone(), Some(&path), workload).await;

    let Cli::Tune(tune) = parse(&format!(
        "tune --trace {} --worker-config {} --cache-threshold 0.3,0.95 \
         --balance-abs-threshold 0,64 --balance-rel-threshold 1.5",
        path.display(),
        worker_file.display()
    )) else {
        unreachable!()
    };
    let report = radixgate_sim::tune::run(&tune, &bad).unwrap();
    eprintln!("{}", report.text());
    let best = report.best.clone().expect("tune finds better settings");
    let tuned = with_point(&bad, &best.point);
    let PolicyConfig::CacheAware(t) = &tuned else {
        panic!()
    };
    assert!(
        t.cache_threshold < 0.95 || t.balance_abs_threshold > 0,
        "{tuned:?}"
    );
    assert!(best.hit_rate > report.current.hit_rate, "{}", report.text());
    assert!(
        report
            .config
            .as_deref()
            .unwrap()
            .contains("cache_threshold")
    );

    // The real re-run with the tuned settings, same workload and seed on
    // fresh workers, hits the cache clearly more.
    let after = serve_workload(&w, tuned, None, workload).await;
    let (hit_before, hit_after) = (before.hit_rate.unwrap(), after.hit_rate.unwrap());
    eprintln!(
        "hit rate {hit_before:.3} -> {hit_after:.3}; mean TTFT {:.1} -> {:.1} ms",
        before.ttft_ms.unwrap().mean,
        after.ttft_ms.unwrap().mean
    );
    assert!(
        hit_after >= hit_before + 0.05,
        "bad {hit_before:.3}, tuned {hit_after:.3}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
