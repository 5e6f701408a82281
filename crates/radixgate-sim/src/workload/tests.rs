//! Workload tests: determinism, shapes, session growth, trace parsing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::trace::parse_trace;
use super::*;

const T0: Duration = Duration::ZERO;

/// Drives a workload in lockstep: every request is answered at once with a
/// reply derived from its seq, `n` requests in all (or until not ready).
fn drain(w: &mut dyn Workload, n: usize) -> Vec<RequestSpec> {
    let mut out = Vec::new();
    let mut now = T0;
    while out.len() < n {
        match w.next(now) {
            Poll::Ready(spec) => {
                if spec.wants_reply {
                    w.on_reply(spec.session, &format!("reply-{}", spec.seq), now);
                }
                out.push(spec);
            }
            Poll::NotBefore(t) => now = t,
            Poll::AwaitReply | Poll::Done => break,
        }
    }
    out
}

fn all_configs() -> Vec<WorkloadConfig> {
    vec![
        WorkloadConfig::SharedPrefix(SharedPrefixConfig {
            zipf: 1.1,
            ..Default::default()
        }),
        WorkloadConfig::MultiTurn(MultiTurnConfig::default()),
        WorkloadConfig::LongDoc(LongDocConfig {
            document_tokens: 512,
            ..Default::default()
        }),
        WorkloadConfig::Agentic(AgenticConfig::default()),
        WorkloadConfig::Mixed(MixedConfig::default()),
    ]
}

#[test]
fn same_seed_same_requests_other_seed_other_text() {
    for cfg in all_configs() {
        let a = drain(cfg.build(7, TextShape::default()).unwrap().as_mut(), 60);
        let b = drain(cfg.build(7, TextShape::default()).unwrap().as_mut(), 60);
        let c = drain(cfg.build(8, TextShape::default()).unwrap().as_mut(), 60);
        assert_eq!(a.len(), 60, "{}", cfg.name());
        assert_eq!(a, b, "{} is not deterministic", cfg.name());
        assert_ne!(a[0].prompt, c[0].prompt, "{}: seed ignored", cfg.name());
    }
}

#[test]
fn shared_prefix_groups_share_the_system_prompt_and_follow_zipf() {
    let cfg = SharedPrefixConfig {
        groups: 8,
        prompts_per_group: 4,
        system_tokens: 100,
        question_tokens: 10,
        zipf: 1.0,
        ..Default::default()
    };
    let mut w = SharedPrefix::new(cfg, 3, TextShape::default()).unwrap();
    let reqs = drain(&mut w, 20_000);
    let mut counts = [0usize; 8];
    for r in &reqs {
        counts[r.group as usize] += 1;
        let Prompt::Chat(m) = &r.prompt else {
            panic!("chat expected")
        };
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].content, w.system_prompt(r.group));
        assert_eq!(m[0].content.len(), 400);
        assert_eq!(m[1].content.len(), 40);
    }
    assert!(
        counts.windows(2).all(|c| c[0] > c[1]),
        "skewed head: {counts:?}"
    );
    let ratio = counts[0] as f64 / counts[7] as f64;
    assert!((5.5..11.0).contains(&ratio), "rank1/rank8 = {ratio}");
    // questions cycle within a group: the 5th prompt of a group repeats its 1st
    let g0: Vec<_> = reqs.iter().filter(|r| r.group == 0).collect();
    assert_eq!(g0[0].prompt, g0[4].prompt);
    assert_ne!(g0[0].prompt, g0[1].prompt);
}

#[test]
fn multi_turn_next_turn_extends_previous_prompt_plus_real_reply() {
    let cfg = MultiTurnConfig {
        conversations: 3,
        turns: 4,
        think_ms: 10.0,
        ..Default::default()
    };
    let mut w = MultiTurn::new(cfg, 1, TextShape::default()).unwrap();
    let mut last: std::collections::HashMap<u64, (String, String)> = Default::default();
    let mut now = T0;
    let mut sent = 0;
    loop {
        match w.next(now) {
            Poll::Ready(spec) => {
                sent += 1;
                let text = spec.prompt.to_text();
                if let Some((prev, reply)) = last.get(&spec.session) {
                    assert!(
                        text.starts_with(&format!("{prev}{reply}")),
                        "turn does not extend the previous prompt + reply"
                    );
                }
                let Prompt::Chat(m) = &spec.prompt else {
                    panic!()
                };
                assert_eq!(m.last().unwrap().role, Role::User);
                let reply = format!("reply to {} at {}", spec.session, spec.seq);
                assert_eq!(
                    spec.wants_reply,
                    m.iter().filter(|m| m.role == Role::User).count() < 4
                );
                w.on_reply(spec.session, &reply, now);
                last.insert(spec.session, (text, reply));
            }
            Poll::NotBefore(t) => {
                assert!(t > now);
                now = t;
            }
            Poll::AwaitReply => panic!("all replies were given"),
            Poll::Done => break,
        }
    }
    assert_eq!(sent, 12, "3 conversations x 4 turns");
}

#[test]
fn sessions_wait_for_replies_and_end_on_failure() {
    let cfg = AgenticConfig {
        sessions: 2,
        steps: 3,
        tool_ms: 0.0,
        ..Default::default()
    };
    let mut w = Agentic::new(cfg, 5, TextShape::default()).unwrap();
    let Poll::Ready(a) = w.next(T0) else { panic!() };
    let Poll::Ready(b) = w.next(T0) else { panic!() };
    assert_eq!(w.next(T0), Poll::AwaitReply);
    w.on_failure(a.session, T0);
    w.on_reply(b.session, "call tool", T0);
    let Poll::Ready(b2) = w.next(T0) else {
        panic!()
    };
    assert_eq!(b2.session, b.session);
    assert_eq!(b2.group, b.group);
    let (Prompt::Chat(m1), Prompt::Chat(m2)) = (&b.prompt, &b2.prompt) else {
        panic!()
    };
    assert_eq!(m2.len(), m1.len() + 2);
    assert_eq!(m2[m1.len()].content, "call tool");
    assert!(m2[m1.len() + 1].content.starts_with("Tool result: "));
    w.on_reply(b.session, "x", T0);
    assert!(matches!(w.next(T0), Poll::Ready(_)));
    w.on_reply(b.session, "y", T0);
    assert_eq!(w.next(T0), Poll::Done);
}

#[test]
fn long_doc_questions_share_their_document_prefix() {
    let cfg = LongDocConfig {
        documents: 2,
        document_tokens: 300,
        ..Default::default()
    };
    let mut w = LongDoc::new(cfg, 2, TextShape::default()).unwrap();
    let reqs = drain(&mut w, 20);
    let doc = |r: &RequestSpec| r.prompt.to_text()[..1200 + 20].to_string();
    for a in &reqs {
        for b in &reqs {
            assert_eq!(doc(a) == doc(b), a.group == b.group);
        }
    }
    assert!(reqs.iter().any(|r| r.group == 1));
}

#[test]
fn mixed_namespaces_sessions_and_routes_replies_back() {
    let mut w = Mixed::new(MixedConfig::default(), 4, TextShape::default()).unwrap();
    let mut reqs = Vec::new();
    let mut now = T0;
    while reqs.len() < 400 {
        // 50 ms between requests, so think times elapse and turns continue
        now += Duration::from_millis(50);
        let Poll::Ready(spec) = w.next(now) else {
            panic!("blend never waits")
        };
        w.on_reply(spec.session, "ok", now);
        reqs.push(spec);
    }
    let mut parts = [0usize; 4];
    for r in &reqs {
        parts[(r.session % 4) as usize] += 1;
    }
    assert!(parts.iter().all(|&p| p > 20), "every part used: {parts:?}");
    // multi-turn sessions (part 1) continued: some session was sent twice
    let mut seen = std::collections::HashSet::new();
    assert!(
        reqs.iter()
            .filter(|r| r.session % 4 == 1)
            .any(|r| !seen.insert(r.session))
    );
}

#[test]
fn config_schema_round_trips_and_rejects_unknown_fields_and_bad_values() {
    for cfg in all_configs() {
        let json = serde_json::to_string(&cfg).unwrap();
        let back: WorkloadConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, cfg);
    }
    let err = serde_json::from_str::<WorkloadConfig>(r#"{"shared-prefix": {"groupz": 3}}"#);
    assert!(err.is_err());
    let ok: WorkloadConfig = serde_json::from_str(r#"{"shared-prefix": {"groups": 3}}"#).unwrap();
    assert!(ok.validate().is_ok());
    for bad in [
        r#"{"shared-prefix": {"groups": 0}}"#,
        r#"{"shared-prefix": {"zipf": -1.0}}"#,
        r#"{"multi-turn": {"think_ms": -5.0}}"#,
        r#"{"trace": {"path": "x", "speedup": 0.0}}"#,
        r#"{"mixed": {"parts": []}}"#,
    ] {
        let cfg: WorkloadConfig = serde_json::from_str(bad).unwrap();
        assert!(
            matches!(cfg.validate(), Err(crate::SimError::Config(_))),
            "{bad}"
        );
    }
}

const SMALL_TRACE: &str = r#"{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 500, "input_length": 1300, "output_length": 7, "hash_ids": [1, 2, 3]}

{"timestamp": 2000, "input_length": 100, "output_length": 0, "hash_ids": [4]}
"#;

fn small_replay(speedup: f64) -> TraceReplay {
    let recs = parse_trace(SMALL_TRACE, Path::new("t"), 512).unwrap();
    let cfg = TraceConfig {
        speedup,
        ..TraceConfig::new("t")
    };
    TraceReplay::from_records(cfg, 0, TextShape::default(), Arc::new(recs))
}

#[test]
fn trace_rendering_keeps_prefixes_lengths_and_partial_blocks() {
    let mut w = small_replay(1.0);
    assert!(w.timestamped());
    let Poll::Ready(a) = w.next(T0) else { panic!() };
    assert_eq!(w.next(T0), Poll::NotBefore(Duration::from_millis(500)));
    let Poll::Ready(b) = w.next(Duration::from_millis(500)) else {
        panic!()
    };
    let (ta, tb) = (a.prompt.to_text(), b.prompt.to_text());
    assert_eq!(ta.len(), 4000);
    assert_eq!(tb.len(), 5200);
    // blocks 1 and 2 are shared: 1024 tokens = 4096 chars, but a's block 2
    // is partial (1000 - 512 = 488 tokens), and a partial block is a prefix
    // of the full one
    assert!(tb.starts_with(&ta));
    assert_ne!(tb[4096..4100], ta[..4]);
    assert_eq!((a.max_tokens, b.max_tokens), (5, 7));
    assert_eq!(a.group, 1);
    let Poll::Ready(c) = w.next(Duration::from_secs(2)) else {
        panic!()
    };
    assert_eq!(c.max_tokens, 1, "zero output length asks for one token");
    assert_eq!(c.prompt.to_text().len(), 400);
    assert_eq!(w.next(Duration::from_secs(9)), Poll::Done);
    // speedup compresses time
    let mut fast = small_replay(4.0);
    let _ = fast.next(T0);
    assert_eq!(fast.next(T0), Poll::NotBefore(Duration::from_millis(125)));
}

#[test]
fn spread_bursts_spaces_equal_timestamps_over_the_gap_to_the_next() {
    let trace = r#"{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [2]}
{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [3]}
{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [4]}
{"timestamp": 3000, "input_length": 10, "output_length": 1, "hash_ids": [5]}
{"timestamp": 4000, "input_length": 10, "output_length": 1, "hash_ids": [6]}
{"timestamp": 4000, "input_length": 10, "output_length": 1, "hash_ids": [7]}
"#;
    let arrivals = |spread_bursts: bool| {
        let recs = parse_trace(trace, Path::new("t"), 512).unwrap();
        let cfg = TraceConfig {
            speedup: 2.0,
            spread_bursts,
            ..TraceConfig::new("t")
        };
        let mut w = TraceReplay::from_records(cfg, 0, TextShape::default(), Arc::new(recs));
        let mut out = Vec::new();
        let mut now = T0;
        loop {
            match w.next(now) {
                Poll::Ready(spec) => out.push((spec.group, spec.arrival.unwrap().as_millis())),
                Poll::NotBefore(t) => now = t,
                Poll::Done => return out,
                other => panic!("{other:?}"),
            }
        }
    };
    // As recorded: four at once, then one, then two at once (halved by
    // the speedup).
    assert_eq!(
        arrivals(false),
        [
            (1, 0),
            (2, 0),
            (3, 0),
            (4, 0),
            (5, 1500),
            (6, 2000),
            (7, 2000)
        ]
    );
    // Spread: the four over the 3 s to the next record, in file order; the
    // last two over the gap before them (1 s).
    assert_eq!(
        arrivals(true),
        [
            (1, 0),
            (2, 375),
            (3, 750),
            (4, 1125),
            (5, 1500),
            (6, 2000),
            (7, 2250)
        ]
    );
}

#[test]
fn trace_errors_name_the_line() {
    let cases = [
        ("{\"timestamp\": 0}\n", 1, "missing field"),
        (
            "{\"timestamp\":0,\"input_length\":10,\"output_length\":1,\"hash_ids\":[]}",
            1,
            "empty",
        ),
        (
            "{\"timestamp\":0,\"input_length\":600,\"output_length\":1,\"hash_ids\":[1]}",
            1,
            "does not fit",
        ),
        ("not json", 1, "expected"),
        ("", 0, "no records"),
    ];
    for (text, line, what) in cases {
        match parse_trace(text, Path::new("f.jsonl"), 512) {
            Err(crate::SimError::TraceFormat {
                line: l, reason, ..
            }) => {
                assert_eq!(l, line, "{text}");
                assert!(reason.contains(what), "{reason} lacks {what}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    let missing = TraceReplay::new(
        TraceConfig::new("/nonexistent/t.jsonl"),
        0,
        TextShape::default(),
    );
    assert!(matches!(missing, Err(crate::SimError::TraceIo { .. })));
}

fn trace_line(timestamp: u64, output_length: u64) -> String {
    format!(
        "{{\"timestamp\":{timestamp},\"input_length\":10,\"output_length\":{output_length},\"hash_ids\":[1]}}\n"
    )
}

fn trace_error(text: &str) -> (usize, String) {
    match parse_trace(text, Path::new("f.jsonl"), 512) {
        Err(crate::SimError::TraceFormat { line, reason, .. }) => (line, reason),
        other => panic!("{text}: {other:?}"),
    }
}

/// `output_length` is what the simulated worker generates (its text is
/// made and tokenized before the engine refuses the request): 4e9 tokens
/// took 6.8 GB and more than 30 s. The HTTP worker's limit holds.
#[test]
fn trace_output_length_is_at_most_a_workers_limit() {
    let ok = trace_line(0, 1 << 20);
    assert!(parse_trace(&ok, Path::new("f.jsonl"), 512).is_ok());
    for out in [(1 << 20) + 1, 4_000_000_000, u64::MAX] {
        let (line, reason) = trace_error(&format!("{ok}{}", trace_line(1, out)));
        assert_eq!(line, 2, "{reason}");
        assert!(
            reason.contains("output_length") && reason.contains("1048576"),
            "{reason}"
        );
    }
}

/// The simulator steps through the trace's time (load polls every
/// 100 simulated ms): a second line at u64::MAX ms hung `simulate`. A
/// trace spans at most a week, in any order of its lines.
#[test]
fn trace_span_is_at_most_a_week() {
    const WEEK_MS: u64 = 7 * 86_400_000;
    let spans = |ts: &[u64]| ts.iter().map(|&t| trace_line(t, 1)).collect::<String>();
    assert!(parse_trace(&spans(&[5, 5 + WEEK_MS, 9]), Path::new("f.jsonl"), 512).is_ok());
    for (ts, bad_line) in [
        (vec![0, u64::MAX], 2),
        (vec![u64::MAX, 0], 2),
        (vec![5, 6 + WEEK_MS], 2),
        (vec![1000, 0, 1001 + WEEK_MS], 3),
    ] {
        let (line, reason) = trace_error(&spans(&ts));
        assert_eq!(line, bad_line, "{ts:?}: {reason}");
        assert!(reason.contains("7 days"), "{reason}");
    }
}

/// A recording (`serve --record-trace`) is written as requests end: its
/// lines replay sorted by arrival, its extra fields are read or ignored, and
/// answers that failed are not replayed.
#[test]
fn recorded_lines_replay_in_time_order_without_failed_answers() {
    let text = r#"{"timestamp": 1700000000900, "input_length": 10, "output_length": 2, "hash_ids": [7], "worker": "http://a", "branch": "cache_hit", "cached_tokens": 8, "status": 200, "model": "m"}
{"timestamp": 1700000000100, "input_length": 600, "output_length": 3, "hash_ids": [5, 6], "worker": "http://b", "cached_tokens": null, "status": 200}
{"timestamp": 1700000000500, "input_length": 20, "output_length": 1, "hash_ids": [9], "worker": "http://a", "status": 503}
{"timestamp": 1700000000100, "input_length": 30, "output_length": 4, "hash_ids": [5]}
"#;
    let recs = parse_trace(text, Path::new("r"), 512).unwrap();
    let times: Vec<u64> = recs.iter().map(|r| r.timestamp % 10_000).collect();
    assert_eq!(times, [100, 100, 500, 900], "sorted, ties in file order");
    assert_eq!(recs[0].input_length, 600);
    assert_eq!(recs[0].worker.as_deref(), Some("http://b"));
    assert_eq!(recs[0].cached_tokens, None);
    assert_eq!(recs[1].worker, None);
    assert_eq!(recs[3].cached_tokens, Some(8));
    assert!(!recs[2].replayed());
    let mut w = TraceReplay::from_records(
        TraceConfig::new("r"),
        0,
        TextShape::default(),
        Arc::new(recs),
    );
    let mut seen = Vec::new();
    let mut now = T0;
    loop {
        match w.next(now) {
            Poll::Ready(spec) => seen.push((spec.seq, spec.max_tokens)),
            Poll::NotBefore(t) => now = t,
            _ => break,
        }
    }
    assert_eq!(seen, [(0, 3), (1, 4), (3, 2)], "the 503 is skipped");
}

/// A recording of failed requests only has nothing to send: `simulate`
/// and `load` printed an empty table and exited 0, as if they had
/// measured.
#[test]
fn a_trace_with_nothing_to_replay_is_refused() {
    let dir = std::env::temp_dir().join(format!("radixgate-sim-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("failed.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 20, \"output_length\": 1, \"hash_ids\": [9], \"status\": 503}\n",
    )
    .unwrap();
    let err = TraceReplay::new(TraceConfig::new(&path), 0, TextShape::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("failed.jsonl") && err.contains("none of its 1 records is replayed"),
        "{err}"
    );
    // Within a limit that keeps only failed ones, the same.
    let mixed = dir.join("mixed.jsonl");
    std::fs::write(
        &mixed,
        "{\"timestamp\": 0, \"input_length\": 20, \"output_length\": 1, \"hash_ids\": [9], \"status\": 503}\n\
         {\"timestamp\": 5, \"input_length\": 20, \"output_length\": 1, \"hash_ids\": [9], \"status\": 200}\n",
    )
    .unwrap();
    let limited = TraceConfig {
        limit: 1,
        ..TraceConfig::new(&mixed)
    };
    let err = TraceReplay::new(limited, 0, TextShape::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("none of its 1 records is replayed"), "{err}");
    assert!(TraceReplay::new(TraceConfig::new(&mixed), 0, TextShape::default()).is_ok());
}

/// The two Mooncake traces shipped in the repository's `traces/`.
fn shipped_traces() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../traces");
    assert!(
        dir.join("mooncake_conversation.jsonl").exists(),
        "{} lacks the shipped traces",
        dir.display()
    );
    dir
}

#[test]
fn real_mooncake_traces_load_and_render_with_shared_blocks() {
    let dir = shipped_traces();
    for (file, count) in [
        ("mooncake_conversation.jsonl", 12_031),
        ("mooncake_synthetic.jsonl", 3_993),
    ] {
        let recs = load_trace(&dir.join(file), 512).unwrap();
        assert_eq!(recs.len(), count, "{file}");
        let cfg = TraceConfig {
            limit: 200,
            speedup: 1000.0,
            ..TraceConfig::new(dir.join(file))
        };
        let mut w = TraceReplay::new(cfg, 0, TextShape::default()).unwrap();
        assert_eq!(w.len(), 200);
        let mut texts = Vec::new();
        let mut now = T0;
        loop {
            match w.next(now) {
                Poll::Ready(spec) => texts.push(spec.prompt.to_text()),
                Poll::NotBefore(t) => now = t,
                _ => break,
            }
        }
        assert_eq!(texts.len(), 200);
        for (rec, text) in recs.iter().zip(&texts) {
            assert_eq!(text.len() as u64, rec.input_length * 4);
        }
        // equal leading ids <=> equal leading 2048-char blocks
        for i in 0..40 {
            for j in 0..40 {
                let (a, b) = (&recs[i], &recs[j]);
                let same = a.hash_ids[0] == b.hash_ids[0];
                let n = 2048.min(texts[i].len()).min(texts[j].len());
                assert_eq!(same, texts[i][..n] == texts[j][..n], "{file} {i} {j}");
            }
        }
    }
}

/// A recording read while the router writes it (or one a killed router
/// left) ends in a line cut short: the lines before it replay, where the
/// whole file was refused. A bad line that a newline ends, or a lone cut
/// line, is still refused.
#[test]
fn a_last_line_cut_short_is_left_out() {
    let whole = format!("{}{}", trace_line(0, 3), trace_line(5, 4));
    let third = trace_line(9, 2);
    let cut = format!("{whole}{}", &third[..third.len() / 2]);
    let recs = parse_trace(&cut, Path::new("f.jsonl"), 512).unwrap();
    assert_eq!(recs.len(), 2);
    let (line, _) = trace_error(&format!("{whole}{}\n", &third[..third.len() / 2]));
    assert_eq!(line, 3, "a bad line a newline ends is refused");
    let (line, _) = trace_error(&third[..third.len() / 2]);
    assert_eq!(line, 1, "a lone cut line is refused");
}

/// A compressed trace (Mooncake's ship gzipped) or one that is not text
/// got "stream did not contain valid UTF-8" with no line or cause; it is
/// named for what it is.
#[test]
fn a_compressed_or_binary_trace_is_named_for_what_it_is() {
    let dir = std::env::temp_dir().join(format!("radixgate-sim-packed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, Vec<u8>, usize, &str); 3] = [
        (
            "t.jsonl.gz",
            vec![0x1f, 0x8b, 8, 0, 0xff],
            0,
            "gzip-compressed",
        ),
        (
            "t.jsonl.zst",
            vec![0x28, 0xb5, 0x2f, 0xfd, 0xff],
            0,
            "zstd-compressed",
        ),
        (
            "t.bin",
            [trace_line(0, 1).as_bytes(), &[0xff, 0xfe]].concat(),
            2,
            "not UTF-8",
        ),
    ];
    for (name, bytes, want_line, want) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        match load_trace(&path, 512) {
            Err(crate::SimError::TraceFormat { line, reason, .. }) => {
                assert_eq!(line, want_line, "{name}: {reason}");
                assert!(reason.contains(want), "{name}: {reason}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
