//! The load client against a scripted raw-TCP server: every response shape
//! and every failure kind, without depending on the simulated worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use radixgate_sim::load::{
    Api, Arrivals, Assign, BodyOptions, Client, ErrorKind, Outcome, ReportHeader, RunPlan, Target,
    drive,
};
use radixgate_sim::workload::{
    MultiTurnConfig, Prompt, RequestSpec, SharedPrefixConfig, TextShape, WorkloadConfig,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the scripted server does with one request.
enum Script {
    /// Write these bytes after the status line and headers, then close.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Never answer.
    Hang,
}

async fn read_request(sock: &mut TcpStream) -> Option<Value> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = sock.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return serde_json::from_slice(&buf[end + 4..end + 4 + len]).ok();
        }
    }
}

/// Serves `script` for every request; returns the base URL and a counter.
async fn serve<F>(script: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(Value) -> Script + Send + Sync + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let script = Arc::new(script);
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let script = script.clone();
            let c = c.clone();
            tokio::spawn(async move {
                let Some(req) = read_request(&mut sock).await else {
                    return;
                };
                c.fetch_add(1, Ordering::SeqCst);
                match script(req) {
                    Script::Hang => tokio::time::sleep(Duration::from_secs(3600)).await,
                    Script::Respond {
                        status,
                        headers,
                        body,
                    } => {
                        let mut out = format!("HTTP/1.1 {status} X\r\nconnection: close\r\n");
                        for (k, v) in headers {
                            out.push_str(&format!("{k}: {v}\r\n"));
                        }
                        out.push_str("\r\n");
                        let _ = sock.write_all(out.as_bytes()).await;
                        let _ = sock.write_all(&body).await;
                        let _ = sock.shutdown().await;
                    }
                }
            });
        }
    });
    (url, count)
}

fn json_reply(status: u16, body: &Value, worker: Option<&str>) -> Script {
    let text = body.to_string();
    let mut headers = vec![
        ("content-type".into(), "application/json".into()),
        ("content-length".into(), text.len().to_string()),
    ];
    if let Some(w) = worker {
        headers.push(("x-radixgate-sim-worker".into(), w.into()));
    }
    Script::Respond {
        status,
        headers,
        body: text.into_bytes(),
    }
}

/// An SSE body read until the connection closes.
fn sse_reply(events: &[String]) -> Script {
    let mut body = String::new();
    for e in events {
        body.push_str(&format!("data: {e}\n\n"));
    }
    Script::Respond {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: body.into_bytes(),
    }
}

fn spec(text: &str) -> RequestSpec {
    RequestSpec {
        seq: 0,
        session: 0,
        group: 0,
        arrival: None,
        prompt: Prompt::Text(text.into()),
        max_tokens: 3,
        wants_reply: false,
    }
}

fn client(api: Api, stream: bool, timeout_ms: u64) -> Client {
    let opts = BodyOptions {
        api,
        model: Some("sim-llama-8b".into()),
        stream,
    };
    Client::new(opts, Duration::from_millis(timeout_ms), None)
}

async fn one(url: &str, api: Api, stream: bool) -> Outcome {
    client(api, stream, 5_000)
        .send(0, &Target::parse(url).unwrap(), &spec("hello"))
        .await
}

fn usage(prompt: u64, cached: u64) -> Value {
    serde_json::json!({"prompt_tokens": prompt, "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": cached}})
}

#[tokio::test]
async fn whole_chat_response_with_header_and_usage() {
    let (url, _) = serve(|req| {
        assert_eq!(req["messages"][0]["content"], "hello");
        assert_eq!(req["stream"], false);
        let body = serde_json::json!({"choices": [{"message": {"content": "abc"}}],
            "system_fingerprint": "from-body", "usage": usage(10, 4)});
        json_reply(200, &body, Some("w7"))
    })
    .await;
    let o = one(&url, Api::ChatCompletions, false).await;
    assert_eq!(o.error, None);
    assert_eq!(o.reply, "abc");
    assert_eq!(o.worker.as_deref(), Some("w7"), "header wins over the body");
    assert_eq!(o.usage.unwrap().cached_tokens, Some(4));
    assert!(o.ttft.is_none());
}

#[tokio::test]
async fn streamed_chat_concatenates_deltas_and_reads_final_usage() {
    let (url, _) = serve(|req| {
        assert_eq!(req["stream_options"]["include_usage"], true);
        let chunk = |t: &str| {
            serde_json::json!({"choices": [{"delta": {"content": t}}], "system_fingerprint": "w2"})
                .to_string()
        };
        let fin = serde_json::json!({"choices": [], "usage": usage(20, 16)}).to_string();
        sse_reply(&[chunk(""), chunk("ab"), chunk("cd"), fin, "[DONE]".into()])
    })
    .await;
    let o = one(&url, Api::ChatCompletions, true).await;
    assert_eq!(o.error, None, "{o:?}");
    assert_eq!(o.reply, "abcd");
    assert_eq!(o.worker.as_deref(), Some("w2"), "body field when no header");
    assert_eq!(o.usage.unwrap().prompt_tokens, 20);
    assert!(o.ttft.unwrap() <= o.e2e);
}

#[tokio::test]
async fn generate_stream_text_is_cumulative_and_completions_are_deltas() {
    let (url, _) = serve(|req| {
        if req.get("text").is_some() {
            assert_eq!(req["sampling_params"]["max_new_tokens"], 3);
            let ev = |t: &str, meta: Value| serde_json::json!({"text": t, "meta_info": meta}).to_string();
            let meta = serde_json::json!({"prompt_tokens": 8, "cached_tokens": 4, "completion_tokens": 3, "worker": "g1"});
            sse_reply(&[ev("x", Value::Null), ev("xy", Value::Null), ev("xyz", meta), "[DONE]".into()])
        } else {
            let ev = |t: &str| serde_json::json!({"choices": [{"text": t}]}).to_string();
            sse_reply(&[ev("p"), ev("q"), "[DONE]".into()])
        }
    })
    .await;
    let g = one(&url, Api::Generate, true).await;
    assert_eq!(
        (g.error, g.reply.as_str(), g.worker.as_deref()),
        (None, "xyz", Some("g1"))
    );
    assert_eq!(g.usage.unwrap().cached_tokens, Some(4));
    let c = one(&url, Api::Completions, true).await;
    assert_eq!((c.error, c.reply.as_str()), (None, "pq"));
    assert!(c.usage.is_none());
}

#[tokio::test]
async fn failures_are_classified() {
    let (url, _) = serve(
        |req| match req["messages"][0]["content"].as_str().unwrap_or("") {
            "status" => json_reply(
                503,
                &serde_json::json!({"error": {"message": "busy"}}),
                Some("w1"),
            ),
            "cut" => sse_reply(&[
                serde_json::json!({"choices": [{"delta": {"content": "a"}}]}).to_string(),
            ]),
            "garbage" => Script::Respond {
                status: 200,
                headers: vec![("content-length".into(), "5".into())],
                body: b"nope!".to_vec(),
            },
            "short" => Script::Respond {
                status: 200,
                headers: vec![("content-length".into(), "500".into())],
                body: b"{\"choices\":".to_vec(),
            },
            "error-event" => {
                sse_reply(&[serde_json::json!({"error": {"message": "died"}}).to_string()])
            }
            "no-text" => json_reply(200, &serde_json::json!({"choices": []}), None),
            _ => Script::Hang,
        },
    )
    .await;
    let target = Target::parse(&url).unwrap();
    let cases = [
        ("status", true, ErrorKind::Status(503)),
        ("cut", true, ErrorKind::StreamCut),
        ("garbage", false, ErrorKind::BadBody),
        ("garbage", true, ErrorKind::BadBody),
        ("short", false, ErrorKind::StreamCut),
        ("error-event", true, ErrorKind::StreamError),
        ("no-text", false, ErrorKind::BadBody),
        ("hang", true, ErrorKind::Timeout),
    ];
    for (what, stream, kind) in cases {
        let o = client(Api::ChatCompletions, stream, 300)
            .send(0, &target, &spec(what))
            .await;
        assert_eq!(o.error, Some(kind), "{what} stream={stream}");
    }
    let st = client(Api::ChatCompletions, true, 300)
        .send(0, &target, &spec("status"))
        .await;
    assert_eq!(
        st.worker.as_deref(),
        Some("w1"),
        "failed requests still name the worker"
    );
}

#[tokio::test]
async fn refused_connections_are_connect_errors() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let o = one(&url, Api::ChatCompletions, true).await;
    assert_eq!(o.error, Some(ErrorKind::Connect));
}

fn header(urls: &[String]) -> ReportHeader {
    ReportHeader {
        workload: "test".into(),
        api: "chat".into(),
        stream: true,
        arrivals: "test".into(),
        assign: "test".into(),
        urls: urls.to_vec(),
        seed: 0,
        pool_size: None,
    }
}

fn plan(arrivals: Arrivals, n: u64, assign: Assign) -> RunPlan {
    RunPlan {
        arrivals,
        max_requests: Some(n),
        duration: None,
        seed: 1,
        progress: false,
        ctrl_c: false,
        assign,
    }
}

/// An echo server: replies "r{n}" with usage, naming itself `name`.
async fn echo(name: &'static str) -> (String, Arc<AtomicUsize>) {
    serve(move |req| {
        let n = req["messages"].as_array().map_or(0, Vec::len);
        let body = serde_json::json!({"choices": [{"message": {"content": format!("r{n}")}}],
            "usage": usage(100, 50)});
        json_reply(200, &body, Some(name))
    })
    .await
}

#[tokio::test]
async fn by_group_partitions_groups_over_targets_and_counts_workers() {
    let (a, ca) = echo("a").await;
    let (b, cb) = echo("b").await;
    let cfg = WorkloadConfig::SharedPrefix(SharedPrefixConfig {
        groups: 4,
        system_tokens: 8,
        ..Default::default()
    });
    let targets = vec![Target::parse(&a).unwrap(), Target::parse(&b).unwrap()];
    let urls = vec![a.clone(), b.clone()];
    let report = drive(
        cfg.build(3, TextShape::default()).unwrap(),
        client(Api::ChatCompletions, false, 5_000),
        targets,
        plan(Arrivals::Closed { concurrency: 4 }, 40, Assign::ByGroup),
        header(&urls),
    )
    .await;
    assert_eq!((report.ok, report.failed), (40, 0));
    assert_eq!(ca.load(Ordering::SeqCst) + cb.load(Ordering::SeqCst), 40);
    assert_eq!(report.hit_rate, Some(0.5));
    assert_eq!(report.workers.values().sum::<u64>(), 40);
    assert_eq!(report.per_url.iter().sum::<u64>(), 40);
}

#[tokio::test]
async fn multi_turn_sessions_continue_and_open_loop_stops_at_the_count() {
    let (a, count) = echo("a").await;
    let cfg = WorkloadConfig::MultiTurn(MultiTurnConfig {
        conversations: 3,
        turns: 3,
        think_ms: 1.0,
        user_tokens: 4,
        system_tokens: 0,
        ..Default::default()
    });
    let report = drive(
        cfg.build(3, TextShape::default()).unwrap(),
        client(Api::ChatCompletions, false, 5_000),
        vec![Target::parse(&a).unwrap()],
        plan(Arrivals::Poisson { rate: 500.0 }, 100, Assign::BySession),
        header(std::slice::from_ref(&a)),
    )
    .await;
    // 3 conversations x 3 turns, then the workload is exhausted before 100
    assert_eq!(report.ok, 9);
    assert_eq!(count.load(Ordering::SeqCst), 9);
}

#[tokio::test]
async fn failures_end_sessions_and_are_reported_by_kind() {
    let (a, _) = serve(|_| json_reply(500, &serde_json::json!({}), None)).await;
    let cfg = WorkloadConfig::MultiTurn(MultiTurnConfig {
        conversations: 4,
        turns: 5,
        ..Default::default()
    });
    let report = drive(
        cfg.build(0, TextShape::default()).unwrap(),
        client(Api::ChatCompletions, true, 5_000),
        vec![Target::parse(&a).unwrap()],
        plan(Arrivals::Closed { concurrency: 2 }, 50, Assign::RoundRobin),
        header(std::slice::from_ref(&a)),
    )
    .await;
    assert_eq!(report.failed, 4, "each conversation fails once and ends");
    assert_eq!(report.errors["http_500"], 4);
    assert_eq!(report.hit_rate, None);
}

#[tokio::test]
async fn trace_replay_follows_timestamps_and_duration_stops_a_closed_loop() {
    let (a, count) = echo("a").await;
    let dir = std::env::temp_dir().join(format!("radixgate-load-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.jsonl");
    let mut lines = String::new();
    for i in 0..12u64 {
        lines.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": 600, \"output_length\": 2, \"hash_ids\": [{}, {i}]}}\n",
            i * 100,
            i % 3
        ));
    }
    std::fs::write(&path, lines).unwrap();
    let cfg: WorkloadConfig =
        serde_json::from_value(serde_json::json!({"trace": {"path": path, "speedup": 50.0}}))
            .unwrap();
    let workload = cfg.build(0, TextShape::default()).unwrap();
    assert!(workload.timestamped());
    let mut p = plan(Arrivals::Timestamps, 1000, Assign::ByGroup);
    p.max_requests = None;
    let report = drive(
        workload,
        client(Api::ChatCompletions, false, 5_000),
        vec![Target::parse(&a).unwrap()],
        p,
        header(std::slice::from_ref(&a)),
    )
    .await;
    assert_eq!((report.ok, report.failed), (12, 0));
    assert_eq!(count.load(Ordering::SeqCst), 12);
    std::fs::remove_dir_all(&dir).unwrap();

    let (b, _) = echo("b").await;
    let cfg = WorkloadConfig::SharedPrefix(SharedPrefixConfig::default());
    let mut p = plan(Arrivals::Closed { concurrency: 2 }, 0, Assign::RoundRobin);
    p.max_requests = None;
    p.duration = Some(Duration::from_millis(300));
    let report = drive(
        cfg.build(0, TextShape::default()).unwrap(),
        client(Api::ChatCompletions, false, 5_000),
        vec![Target::parse(&b).unwrap()],
        p,
        header(std::slice::from_ref(&b)),
    )
    .await;
    assert!(report.ok > 0 && report.failed == 0, "{}", report.table());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_path_runs_end_to_end() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        load: radixgate_sim::load::LoadArgs,
    }
    let (a, _) = echo("a").await;
    let (b, _) = echo("b").await;
    let argv = format!(
        "load --url {a} --url {b} --workload multi-turn --conversations 3 --turns 2 --think-ms 0 --rate 200 --requests 50 --assign by-session --no-stream --no-progress"
    );
    let args = Cli::try_parse_from(argv.split_whitespace()).unwrap().load;
    let report = radixgate_sim::load::run(&args).await.unwrap();
    assert_eq!((report.ok, report.failed), (6, 0));
    assert_eq!(report.header.workload, "multi-turn");
    assert_eq!(report.workers.len(), 2);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["hit_rate"], 0.5);
    let bad = Cli::try_parse_from(["load", "--url", "https://x:1"])
        .unwrap()
        .load;
    let err = radixgate_sim::load::run(&bad).await.unwrap_err();
    assert!(err.to_string().contains("https is not supported"), "{err}");
}

/// vLLM leaves `prompt_tokens_details` out of its usage unless started with
/// `--enable-prompt-tokens-details`, and SGLang sends it as `null` unless
/// started with `--enable-cache-report`: such a server says nothing of its
/// cache. The report showed a hit rate of 0.0% for it, read as a router
/// that found no prefix, and blended its prompt tokens into the hit rate
/// of servers that do report.
#[tokio::test]
async fn hit_rate_leaves_out_responses_that_report_no_cached_count() {
    let silent = |details: Option<Value>| {
        move |_req: Value| {
            let mut usage = serde_json::json!({"prompt_tokens": 100, "completion_tokens": 3});
            if let Some(d) = &details {
                usage["prompt_tokens_details"] = d.clone();
            }
            let body = serde_json::json!({"choices": [{"message": {"content": "r"}}],
                "usage": usage});
            json_reply(200, &body, Some("s"))
        }
    };
    let (vllm, _) = serve(silent(None)).await;
    let (sglang, _) = serve(silent(Some(Value::Null))).await;
    let (reporting, _) = echo("a").await;
    let run = |urls: Vec<String>| async move {
        let cfg = WorkloadConfig::SharedPrefix(SharedPrefixConfig {
            system_tokens: 8,
            ..Default::default()
        });
        drive(
            cfg.build(0, TextShape::default()).unwrap(),
            client(Api::ChatCompletions, false, 5_000),
            urls.iter().map(|u| Target::parse(u).unwrap()).collect(),
            plan(Arrivals::Closed { concurrency: 2 }, 8, Assign::RoundRobin),
            header(&urls),
        )
        .await
    };

    let r = run(vec![vllm.clone(), sglang.clone()]).await;
    assert_eq!((r.ok, r.failed, r.responses_without_usage), (8, 0, 0));
    assert_eq!(r.hit_rate, None, "{}", r.table());
    assert_eq!(r.responses_without_cached_count, 8);
    assert_eq!(r.prompt_tokens, 800, "prompt tokens are still counted");
    assert!(
        r.table()
            .contains("hit rate n/a (no cached-token counts reported"),
        "{}",
        r.table()
    );

    // Half report 50 of 100 cached, half say nothing: 50%, not 25%.
    let r = run(vec![reporting, vllm]).await;
    assert_eq!(r.hit_rate, Some(0.5), "{}", r.table());
    assert_eq!(r.responses_without_cached_count, 4);
    assert_eq!((r.prompt_tokens, r.cached_tokens), (800, 200));
    assert!(
        r.table()
            .contains("hit rate 50.0%  (cached 200 of 400 prompt tokens"),
        "{}",
        r.table()
    );
    assert!(
        r.table().contains("4 without a cached count"),
        "{}",
        r.table()
    );
}

/// A reasoning model behind vLLM or SGLang (a reasoning parser on) sends
/// its thinking as `reasoning_content` (vLLM's newer name: `reasoning`)
/// before any `content`, and an answer cut by `max_tokens` while it still
/// thinks has `content: null`. Such a whole answer was a `bad_body`
/// failure, and a stream was timed to its first answer token, the whole
/// thinking phase counted in its TTFT (none at all when it never
/// answered), while the same tokens were counted in its usage.
#[tokio::test]
async fn reasoning_tokens_are_output_for_ttft_and_a_null_content_is_no_failure() {
    let (url, _) = serve(|req| {
        match (
            req["stream"].as_bool().unwrap(),
            req["messages"][0]["content"].as_str().unwrap(),
        ) {
            (false, _) => {
                let body = serde_json::json!({"choices": [{"message": {"role": "assistant",
                    "content": null, "reasoning_content": "hmm"}, "finish_reason": "length"}],
                    "usage": usage(10, 0)});
                json_reply(200, &body, None)
            }
            (true, field) => {
                let chunk =
                    |delta: Value| serde_json::json!({"choices": [{"delta": delta}]}).to_string();
                sse_reply(&[
                    chunk(serde_json::json!({"role": "assistant", "content": ""})),
                    chunk(serde_json::json!({field: "let me think"})),
                    chunk(serde_json::json!({field: " more"})),
                    serde_json::json!({"choices": [], "usage": usage(10, 0)}).to_string(),
                    "[DONE]".into(),
                ])
            }
        }
    })
    .await;
    let target = Target::parse(&url).unwrap();
    let whole = client(Api::ChatCompletions, false, 5_000)
        .send(0, &target, &spec("reasoning_content"))
        .await;
    assert_eq!(whole.error, None, "{whole:?}");
    assert_eq!(whole.reply, "", "thinking is not the reply");
    for field in ["reasoning_content", "reasoning"] {
        let o = client(Api::ChatCompletions, true, 5_000)
            .send(0, &target, &spec(field))
            .await;
        assert_eq!(o.error, None, "{field}: {o:?}");
        assert!(
            o.ttft.is_some(),
            "{field}: the first thinking token is timed"
        );
        assert_eq!(o.reply, "", "{field}");
    }
}
