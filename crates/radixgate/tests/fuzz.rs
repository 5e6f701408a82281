//! Fuzzing on stable (issue 11, item 11): property tests that drive
//! arbitrary and near-valid input through every decoder of untrusted bytes.
//!
//! - the request inspector, for every `Api`: arbitrary bytes, and JSON
//!   documents built from the request schemas with wrong types, odd
//!   values, truncations and flipped bytes, so cases get past the first
//!   byte. It never panics, and an error says something;
//! - the response stream wrapper (`stream.rs`): arbitrary bytes in
//!   arbitrary chunks, ending cleanly or breaking off. The bytes pass
//!   through unchanged, a break adds one well-formed SSE error event, and
//!   the watch hears exactly one end;
//! - the load tool's SSE parser: arbitrary bytes in arbitrary chunks never
//!   panic and find the same events however they are chunked; well-formed
//!   streams yield exactly the events a naive reference finds;
//! - the config loader: arbitrary YAML text and near-valid documents built
//!   from the schema's keys, and arbitrary flag lines.
//!
//! Case counts keep the whole file to well under a minute in a debug build
//! on two cores; `PROPTEST_CASES=N` sets every property here to N cases for
//! a longer run (README, "Fuzzing").

use clap::Parser;
use http_body_util::BodyExt;
use proptest::prelude::*;
use radixgate::config::{Config, ServeArgs};
use radixgate::inspect::{Api, inspect};
use radixgate::stream::{StreamEnd, StreamWatch, WatchedBody};
use radixgate_sim::load::sse::SseParser;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

/// `PROPTEST_CASES` if set, else `default`.
fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        // Failures are reported with their minimal input; no files are
        // written next to the sources.
        failure_persistence: None,
        ..ProptestConfig::with_cases(n)
    }
}

const APIS: [Api; 6] = [
    Api::ChatCompletions,
    Api::Completions,
    Api::Generate,
    Api::Embeddings,
    Api::Responses,
    Api::Messages,
];

// ---------------------------------------------------------------- inspect

/// Any JSON value, small and deep enough to reach nested code.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "user",
            "assistant",
            "system",
            "tool",
            "text",
            "image_url",
            "message",
            "function_call",
            "function_call_output",
            "tool_use",
            "tool_result",
            "image",
            ""
        ])
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(field_name(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Field names of the request schemas (so objects hit real fields), or any.
fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "model", "messages", "role", "content", "text", "type", "prompt", "input",
            "stream", "user", "tool_calls", "function", "name", "arguments", "input_ids",
            "sampling_params", "image_url", "url", "tools", "instructions", "system",
            "tool_use_id", "tool_result", "tool_use", "source", "call_id", "output",
            "function_call", "cache_salt", "lora_path", "extra_key", "metadata", "user_id",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,6}",
    ]
}

/// A request body of `api`'s shape with arbitrary values in its fields.
fn near_valid_request() -> impl Strategy<Value = (usize, Value)> {
    let message = prop::collection::btree_map(
        prop::sample::select(vec![
            "role",
            "content",
            "tool_calls",
            "name",
            "type",
            "call_id",
            "output",
            "text",
        ])
        .prop_map(str::to_owned),
        any_json(),
        0..4,
    )
    .prop_map(|m| Value::Object(m.into_iter().collect()));
    (
        0..APIS.len(),
        prop::collection::vec(message, 0..4),
        any_json(),
        any_json(),
        any_json(),
        any::<bool>(),
    )
        .prop_map(|(api, messages, model, payload, stream, stream_flag)| {
            let stream = if stream_flag { json!(true) } else { stream };
            let body = match APIS[api] {
                Api::ChatCompletions => {
                    json!({"model": model, "messages": messages, "stream": stream})
                }
                Api::Completions => json!({"model": model, "prompt": payload, "stream": stream}),
                Api::Generate => json!({"text": payload, "input_ids": model, "stream": stream}),
                Api::Embeddings => json!({"model": model, "input": payload}),
                Api::Responses => json!({
                    "model": model, "input": messages, "instructions": payload, "stream": stream,
                }),
                Api::Messages => json!({
                    "model": model, "messages": messages, "system": payload, "stream": stream,
                    "cache_salt": payload,
                }),
            };
            (api, body)
        })
}

/// How a near-valid body is damaged before inspection.
#[derive(Clone, Debug)]
enum Damage {
    None,
    Truncate(usize),
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        3 => Just(Damage::None),
        1 => any::<usize>().prop_map(Damage::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Damage::Flip(i, b)),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..4))
            .prop_map(|(i, b)| Damage::Insert(i, b)),
    ]
}

fn apply(mut bytes: Vec<u8>, damage: &Damage) -> Vec<u8> {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    match damage {
        Damage::None => {}
        Damage::Truncate(i) => bytes.truncate(at(*i, bytes.len())),
        Damage::Flip(i, b) => {
            let i = at(*i, bytes.len());
            if let Some(slot) = bytes.get_mut(i) {
                *slot ^= b | 1;
            }
        }
        Damage::Insert(i, extra) => {
            let i = at(*i, bytes.len() + 1);
            bytes.splice(i..i, extra.iter().copied());
        }
    }
    bytes
}

fn inspect_cleanly(api: Api, body: &[u8]) -> Option<radixgate::inspect::Inspected> {
    match inspect(api, body) {
        Ok(inspected) => Some(inspected),
        Err(err) => {
            assert!(!err.to_string().is_empty());
            None
        }
    }
}

proptest! {
    #![proptest_config(cases(4_000))]

    #[test]
    fn the_inspector_takes_any_bytes(body in prop::collection::vec(any::<u8>(), 0..256)) {
        for api in APIS {
            inspect_cleanly(api, &body);
        }
    }

    #[test]
    fn the_inspector_takes_near_valid_requests(
        (api, body) in near_valid_request(),
        damage in damage(),
    ) {
        let undamaged = serde_json::to_vec(&body).unwrap();
        let bytes = apply(undamaged, &damage);
        let inspected = inspect_cleanly(APIS[api], &bytes);
        // An accepted body with a string model reports that model.
        if let (Some(inspected), Damage::None) = (inspected, &damage)
            && let Some(model) = body.get("model").and_then(Value::as_str)
            && APIS[api] != Api::Generate
        {
            prop_assert_eq!(inspected.model.as_deref(), Some(model));
        }
    }
}

// ----------------------------------------------------------------- stream

/// Records the ends a watch is told about.
#[derive(Clone, Default)]
struct Ends(Arc<Mutex<Vec<StreamEnd>>>);

struct Watch(Ends);

impl StreamWatch for Watch {
    fn finish(self, end: StreamEnd) {
        self.0.0.lock().unwrap().push(end);
    }
}

/// Arbitrary bytes in arbitrary chunks.
fn chunks() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48), 0..12)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(cases(2_000))]

    #[test]
    fn the_stream_wrapper_passes_any_chunks_and_reports_one_end(
        chunks in chunks(),
        breaks_off in any::<bool>(),
        sse in any::<bool>(),
    ) {
        let mut items: Vec<Result<http_body::Frame<bytes::Bytes>, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(bytes::Bytes::from(c.clone()))))
            .collect();
        if breaks_off {
            items.push(Err(std::io::Error::other("cut")));
        }
        let inner = http_body_util::StreamBody::new(futures::stream::iter(items));
        let ends = Ends::default();
        let body = WatchedBody::new(inner, Watch(ends.clone()), sse);
        let collected = runtime().block_on(body.collect());
        let sent: Vec<u8> = chunks.concat();
        // An event stream that ends inside an event did not end well.
        let failed = breaks_off || (sse && !ends_an_event(&sent));
        match (failed, sse, collected) {
            (false, _, Ok(out)) => prop_assert_eq!(out.to_bytes().to_vec(), sent),
            (true, true, Ok(out)) => {
                let out = out.to_bytes().to_vec();
                // The worker's bytes up to the end of its last whole event
                // (an unfinished one is held back, not sent in part)...
                let whole = (0..=sent.len())
                    .rev()
                    .find(|&end| ends_an_event(&sent[..end]))
                    .unwrap_or(0);
                let sent = sent[..whole].to_vec();
                prop_assert!(out.starts_with(&sent));
                // ...what closes the last event, were it left open (one
                // longer than what is held back), then the error event, an
                // event of its own.
                let rest = &out[sent.len()..];
                let closing = rest.iter().take_while(|&&b| b == b'\n').count();
                prop_assert!(closing <= 2);
                let mut closed = sent.clone();
                closed.extend_from_slice(&rest[..closing]);
                prop_assert!(ends_an_event(&closed), "{:?} left open", String::from_utf8_lossy(&closed));
                prop_assert!(ends_an_event(&out));
                let event = std::str::from_utf8(&rest[closing..]).unwrap();
                let data = event.strip_prefix("data: ").and_then(|e| e.strip_suffix("\n\n"));
                let data: Value = serde_json::from_str(data.unwrap()).unwrap();
                prop_assert!(data["error"]["message"].is_string());
            }
            (true, false, Err(_)) => {}
            (failed, sse, other) => {
                prop_assert!(false, "failed {} sse {}: {:?}", failed, sse, other.map(|_| ()));
            }
        }
        let expected = if failed { StreamEnd::UpstreamError } else { StreamEnd::Complete };
        prop_assert_eq!(ends.0.lock().unwrap().clone(), vec![expected]);
    }
}

/// Whether an event stream's bytes end at an event's end (a blank line),
/// read as the SSE spec reads lines (`\r\n`, `\n` or `\r` ends one);
/// no bytes at all do.
fn ends_an_event(bytes: &[u8]) -> bool {
    let (mut in_line, mut last_blank, mut after_cr) = (false, true, false);
    for &b in bytes {
        match b {
            b'\n' if after_cr => after_cr = false,
            b'\n' | b'\r' => {
                last_blank = !in_line;
                in_line = false;
                after_cr = b == b'\r';
            }
            _ => {
                in_line = true;
                after_cr = false;
            }
        }
    }
    !in_line && last_blank
}

// -------------------------------------------------------------------- SSE

/// `bytes` cut at the given points (taken modulo its length).
fn cut(bytes: &[u8], points: &[usize]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = points
        .iter()
        .map(|p| if bytes.is_empty() { 0 } else { p % bytes.len() })
        .collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
}

fn feed_all(pieces: &[Vec<u8>]) -> Vec<String> {
    let mut parser = SseParser::default();
    pieces.iter().flat_map(|p| parser.feed(p)).collect()
}

/// One well-formed event: data lines (no CR/LF inside), maybe a comment or
/// another field, and the line ending used throughout.
fn event() -> impl Strategy<Value = (Vec<String>, bool, bool)> {
    (
        prop::collection::vec("[^\r\n]{0,16}", 1..3),
        any::<bool>(),
        any::<bool>(),
    )
}

/// The naive reference: the data of each event, lines joined by `\n`.
fn render(events: &[(Vec<String>, bool, bool)], crlf: bool) -> (Vec<u8>, Vec<String>) {
    let nl = if crlf { "\r\n" } else { "\n" };
    let mut text = String::new();
    let mut expected = Vec::new();
    for (lines, comment, id) in events {
        if *comment {
            text.push_str(&format!(": keep-alive{nl}"));
        }
        if *id {
            text.push_str(&format!("id: 7{nl}"));
        }
        for line in lines {
            text.push_str(&format!("data: {line}{nl}"));
        }
        text.push_str(nl);
        // A data value that itself starts with a space keeps it after the
        // one separating space is removed.
        expected.push(lines.join("\n"));
    }
    (text.into_bytes(), expected)
}

proptest! {
    #![proptest_config(cases(3_000))]

    #[test]
    fn the_sse_parser_takes_any_bytes_in_any_chunks(
        bytes in prop::collection::vec(
            prop_oneof![any::<u8>(), Just(b'\n'), Just(b'\r'), Just(b':')], 0..256),
        points in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let whole = feed_all(std::slice::from_ref(&bytes));
        let chunked = feed_all(&cut(&bytes, &points));
        prop_assert_eq!(whole, chunked);
    }

    #[test]
    fn well_formed_sse_yields_the_reference_events(
        events in prop::collection::vec(event(), 0..6),
        crlf in any::<bool>(),
        points in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let (bytes, expected) = render(&events, crlf);
        prop_assert_eq!(feed_all(&cut(&bytes, &points)), expected);
    }
}

// ----------------------------------------------------------------- config

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// A YAML scalar, plausible or not.
fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        (0i64..100).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        prop::sample::select(vec![
            "true",
            "false",
            "null",
            "~",
            ".nan",
            "-.inf",
            "''",
            "[]",
            "{}",
            "cache_aware",
            "round_robin",
            "/health",
            "http://127.0.0.1:1",
            "[http://127.0.0.1:2]",
            "{rule: off}",
            "{rule: relative_cap, slack: 3}",
            "18446744073709551616",
        ])
        .prop_map(str::to_owned),
        "[a-z:/._ -]{0,12}",
    ]
}

/// Keys of the schema by section, so documents get past `deny_unknown_fields`.
const SECTIONS: &[(&str, &[&str])] = &[
    (
        "server",
        &[
            "host",
            "port",
            "max_payload_size",
            "request_timeout_secs",
            "shutdown_grace_period_secs",
            "api_key",
            "admin_api_key",
            "threads",
        ],
    ),
    (
        "routing",
        &[
            "policy",
            "cache_threshold",
            "balance_abs_threshold",
            "balance_rel_threshold",
            "eviction_interval_secs",
            "max_tree_size",
            "max_total_chars",
            "low_match",
            "hot_spot",
            "match_granularity_chars",
            "seed",
            "virtual_nodes",
            "load_factor",
            "cost",
        ],
    ),
    (
        "health",
        &[
            "enabled",
            "interval_secs",
            "timeout_secs",
            "endpoint",
            "failure_threshold",
            "success_threshold",
            "unhealthy_backoff_initial_ms",
            "unhealthy_backoff_max_ms",
            "models_refresh_secs",
        ],
    ),
    (
        "retry",
        &[
            "max_retries",
            "initial_backoff_ms",
            "max_backoff_ms",
            "backoff_multiplier",
            "jitter_factor",
        ],
    ),
    (
        "circuit_breaker",
        &[
            "enabled",
            "failure_threshold",
            "success_threshold",
            "timeout_duration_secs",
        ],
    ),
    (
        "admission",
        &[
            "max_concurrent_requests",
            "queue_size",
            "queue_timeout_secs",
        ],
    ),
    ("metrics", &["prometheus_port", "prometheus_host"]),
    ("log", &["level", "json"]),
    ("workers", &[]),
];

fn near_valid_yaml() -> impl Strategy<Value = String> {
    let entry = (0..SECTIONS.len(), any::<prop::sample::Index>(), scalar());
    prop::collection::vec(entry, 0..8).prop_map(|entries| {
        let mut doc: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
        for (s, key, value) in entries {
            let (section, keys) = SECTIONS[s];
            let line = if keys.is_empty() {
                format!("  - {value}")
            } else {
                format!("  {}: {value}", keys[key.index(keys.len())])
            };
            doc.entry(section).or_default().push(line);
        }
        doc.into_iter()
            .map(|(section, lines)| format!("{section}:\n{}\n", lines.join("\n")))
            .collect()
    })
}

fn load_cleanly(text: &str) {
    match Config::from_yaml(text) {
        Ok(config) => validate_and_run_arithmetic(&config),
        Err(err) => assert!(!err.to_string().is_empty()),
    }
}

/// Validates; an accepted config also runs the request path's duration
/// arithmetic (every retry's back-off, the request deadline).
fn validate_and_run_arithmetic(config: &Config) {
    use rand::SeedableRng;
    match config.validate() {
        Ok(()) => {
            let mut backoff = radixgate::retry::Backoff::new(&config.retry);
            let mut rng = rand::rngs::StdRng::seed_from_u64(0);
            for _ in 0..=config.retry.max_retries {
                let _ = backoff.pause(&mut rng);
            }
            if let Some(after) = config.request_timeout() {
                assert!(std::time::Instant::now().checked_add(after).is_some());
            }
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
}

/// A flag of `serve` with a value, plausible or not.
fn flag_arg() -> impl Strategy<Value = Vec<String>> {
    let flags = prop::sample::select(vec![
        "--worker-urls",
        "--policy",
        "--cache-threshold",
        "--balance-abs-threshold",
        "--balance-rel-threshold",
        "--eviction-interval-secs",
        "--max-tree-size",
        "--host",
        "--port",
        "--max-payload-size",
        "--request-timeout-secs",
        "--shutdown-grace-period-secs",
        "--threads",
        "--api-key",
        "--admin-api-key",
        "--health-check-interval-secs",
        "--health-check-timeout-secs",
        "--health-check-endpoint",
        "--health-failure-threshold",
        "--health-success-threshold",
        "--retry-max-retries",
        "--retry-initial-backoff-ms",
        "--retry-max-backoff-ms",
        "--retry-backoff-multiplier",
        "--retry-jitter-factor",
        "--cb-failure-threshold",
        "--cb-success-threshold",
        "--cb-timeout-duration-secs",
        "--max-concurrent-requests",
        "--queue-size",
        "--queue-timeout-secs",
        "--prometheus-port",
        "--prometheus-host",
        "--log-level",
        "--disable-retries",
        "--disable-health-check",
        "--log-json",
    ]);
    (flags, scalar(), any::<bool>()).prop_map(|(flag, value, joined)| {
        if joined {
            vec![format!("{flag}={value}")]
        } else {
            vec![flag.to_owned(), value]
        }
    })
}

proptest! {
    #![proptest_config(cases(2_000))]

    #[test]
    fn the_config_loader_takes_any_text(text in ".{0,200}") {
        load_cleanly(&text);
    }

    #[test]
    fn the_config_loader_takes_near_valid_documents(text in near_valid_yaml()) {
        load_cleanly(&text);
    }

    #[test]
    fn the_flag_parser_takes_any_flags(args in prop::collection::vec(flag_arg(), 0..6)) {
        let argv = std::iter::once("serve".to_owned()).chain(args.into_iter().flatten());
        if let Ok(cli) = Cli::try_parse_from(argv) {
            // Not validated yet: applying flags to the defaults.
            let mut config = Config::default();
            if cli.serve.apply(&mut config).is_ok() {
                validate_and_run_arithmetic(&config);
            }
        }
    }
}
