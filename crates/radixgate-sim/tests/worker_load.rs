//! The load tool against in-process simulated workers on loopback: every
//! API streamed and not, cache hits, partitioning, multi-turn continuity and
//! fault knobs seen by the client as the right error kinds.

use std::time::Duration;

use radixgate_sim::load::{
    Api, Arrivals, Assign, BodyOptions, Client, LoadReport, ReportHeader, RunPlan, Target, drive,
};
use radixgate_sim::server::{FaultConfig, WorkerConfig, WorkerHandle, start_group};
use radixgate_sim::workload::{MultiTurnConfig, SharedPrefixConfig, TextShape, WorkloadConfig};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// `n` workers named w0.. with a fast timing model and `kv` tokens of cache.
async fn workers(n: usize, kv: usize) -> (Vec<WorkerHandle>, CancellationToken) {
    let shutdown = CancellationToken::new();
    let mut specs = Vec::new();
    for i in 0..n {
        let mut cfg = WorkerConfig {
            name: format!("w{i}"),
            ..Default::default()
        };
        cfg.engine.kv_capacity_tokens = kv;
        cfg.engine.timing.step_base_us = 200.0;
        cfg.engine.timing.token_us = 1.0;
        specs.push((TcpListener::bind("127.0.0.1:0").await.unwrap(), cfg));
    }
    (
        start_group(specs, shutdown.clone()).await.unwrap(),
        shutdown,
    )
}

fn targets(ws: &[WorkerHandle]) -> Vec<Target> {
    ws.iter()
        .map(|w| Target::parse(&format!("http://{}", w.addr())).unwrap())
        .collect()
}

/// One load run's settings.
#[derive(Clone, Copy)]
struct Run {
    api: Api,
    stream: bool,
    requests: u64,
    concurrency: usize,
    assign: Assign,
    timeout: Duration,
}

const RUN: Run = Run {
    api: Api::ChatCompletions,
    stream: true,
    requests: 24,
    concurrency: 4,
    assign: Assign::RoundRobin,
    timeout: Duration::from_secs(30),
};

async fn run(ws: &[WorkerHandle], cfg: &WorkloadConfig, r: Run) -> LoadReport {
    let t = targets(ws);
    let header = ReportHeader {
        workload: cfg.name().into(),
        api: r.api.path().into(),
        stream: r.stream,
        arrivals: "test".into(),
        assign: r.assign.name().into(),
        urls: t.iter().map(|t| t.base().to_owned()).collect(),
        seed: 1,
        pool_size: None,
    };
    let plan = RunPlan {
        arrivals: Arrivals::Closed {
            concurrency: r.concurrency,
        },
        max_requests: Some(r.requests),
        duration: None,
        seed: 1,
        progress: false,
        ctrl_c: false,
        assign: r.assign,
    };
    let opts = BodyOptions {
        api: r.api,
        model: Some("sim-llama-8b".into()),
        stream: r.stream,
    };
    let workload = cfg.build(1, TextShape::default()).unwrap();
    drive(
        workload,
        Client::new(opts, r.timeout, None),
        t,
        plan,
        header,
    )
    .await
}

fn shared_prefix(groups: u64) -> WorkloadConfig {
    WorkloadConfig::SharedPrefix(SharedPrefixConfig {
        groups,
        prompts_per_group: 50,
        system_tokens: 512,
        question_tokens: 16,
        output_tokens: 4,
        zipf: 0.0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_streamed_and_not_reports_hits_usage_and_workers() {
    let (ws, shutdown) = workers(2, 100_000).await;
    for api in [
        Api::ChatCompletions,
        Api::Completions,
        Api::Generate,
        Api::Responses,
        Api::Messages,
    ] {
        for stream in [true, false] {
            let r = run(&ws, &shared_prefix(2), Run { api, stream, ..RUN }).await;
            let what = format!("{api:?} stream={stream}: {}", r.table());
            assert_eq!((r.ok, r.failed), (24, 0), "{what}");
            assert!(r.hit_rate.unwrap() > 0.5, "{what}");
            assert_eq!(r.responses_without_usage, 0, "{what}");
            assert_eq!(r.completion_tokens, 24 * 4, "{what}");
            assert_eq!(r.workers.keys().collect::<Vec<_>>(), ["w0", "w1"], "{what}");
            assert_eq!(r.workers.values().sum::<u64>(), 24, "{what}");
            assert_eq!(r.ttft_ms.is_some(), stream, "{what}");
            // Every streamed request had 4 tokens, so 3 gaps to time.
            match (&r.tpot_ms, &r.e2e_ms) {
                (Some(t), Some(e)) => {
                    assert!(stream, "{what}");
                    assert_eq!(t.count, 24, "{what}");
                    assert!(t.mean > 0.0 && t.mean < e.mean, "{what}");
                }
                (t, _) => assert!(!stream && t.is_none(), "{what}"),
            }
        }
    }
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioning_by_group_beats_round_robin_when_caches_are_small() {
    // 16 groups of ~530 prompt tokens over 4 workers of 3,000 tokens: a
    // worker holds its 4 groups when partitioned, not all 16 when it sees
    // every group. One client, so the request order is deterministic.
    let cfg = shared_prefix(16);
    let one = Run {
        requests: 160,
        concurrency: 1,
        ..RUN
    };
    let (rr_ws, s1) = workers(4, 3_000).await;
    let rr = run(&rr_ws, &cfg, one).await;
    s1.cancel();
    let (pg_ws, s2) = workers(4, 3_000).await;
    let by_group = Run {
        assign: Assign::ByGroup,
        ..one
    };
    let pg = run(&pg_ws, &cfg, by_group).await;
    s2.cancel();
    let (h_rr, h_pg) = (rr.hit_rate.unwrap(), pg.hit_rate.unwrap());
    assert!(
        h_pg > h_rr + 0.3,
        "by-group {h_pg:.3} vs round-robin {h_rr:.3}"
    );
    assert_eq!((rr.failed, pg.failed), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_turns_hit_the_previous_turn_and_reply() {
    let (ws, shutdown) = workers(1, 100_000).await;
    let cfg = WorkloadConfig::MultiTurn(MultiTurnConfig {
        conversations: 4,
        turns: 4,
        system_tokens: 0,
        user_tokens: 64,
        output_tokens: 32,
        think_ms: 0.0,
    });
    let r = run(
        &ws,
        &cfg,
        Run {
            requests: 100,
            concurrency: 2,
            assign: Assign::BySession,
            ..RUN
        },
    )
    .await;
    assert_eq!((r.ok, r.failed), (16, 0), "{}", r.table());
    // Without a shared system prompt, hits can only come from a
    // conversation's own earlier turns and the worker's real replies.
    assert!(r.hit_rate.unwrap() > 0.5, "{}", r.table());
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_knobs_are_counted_as_the_right_error_kind() {
    let (ws, shutdown) = workers(1, 100_000).await;
    let cfg = shared_prefix(1);
    let knob = |f: fn(&mut FaultConfig)| {
        let mut c = FaultConfig::default();
        f(&mut c);
        c
    };
    let cases = [
        (knob(|c| c.error_rate = 1.0), true, "http_500"),
        (knob(|c| c.die_after_chunks = Some(2)), true, "stream_cut"),
        (knob(|c| c.hang = true), false, "timeout"),
        (knob(|c| c.refuse = true), true, "connect"),
    ];
    for (faults, stream, kind) in cases {
        let refuse = faults.refuse;
        ws[0].set_faults(faults).unwrap();
        if refuse {
            // The listener closes asynchronously; a connection that lands
            // in its backlog meanwhile is reset (a transport error), not
            // refused. Wait until connecting fails.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while tokio::net::TcpStream::connect(ws[0].addr()).await.is_ok() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the listener did not close"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let quick = Run {
            stream,
            requests: 6,
            concurrency: 2,
            timeout: Duration::from_millis(500),
            ..RUN
        };
        let r = run(&ws, &cfg, quick).await;
        assert_eq!(r.errors.get(kind), Some(&6), "{kind}: {:?}", r.errors);
        assert_eq!(r.ok, 0, "{kind}");
    }
    ws[0].set_faults(FaultConfig::default()).unwrap();
    // Clearing `refuse` reopens the listener asynchronously: wait for it
    // (the deadline only turns a hang into a failure).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(ws[0].addr()).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener did not reopen"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = run(&ws, &cfg, Run { requests: 6, ..RUN }).await;
    assert_eq!(
        r.ok, 6,
        "recovers when the knobs are cleared: {:?}",
        r.errors
    );
    shutdown.cancel();
}
