//! The offline simulator against the real thing: one `radixgate worker`
//! (in-process, HTTP on port 0) driven by the `load` tool, and the simulator
//! with one worker of the same model, replaying the same seeded workload
//! one request at a time. With no concurrency the order of requests is
//! fixed, so the cache the simulated engine builds must be the worker's,
//! token for token: the same prompt tokens (chat rendering, tokenizer), the
//! same replies fed back into multi-turn sessions, the same cached tokens.

mod common;

use std::time::Duration;

use radixgate_sim::load::{
    Api, Arrivals, Assign, BodyOptions, Client, ReportHeader, RunPlan, Target, drive,
};
use radixgate_sim::simulate::{Contender, SimConfig, run};
use radixgate_sim::workload::{
    AgenticConfig, MultiTurnConfig, SharedPrefixConfig, TextShape, WorkloadConfig,
};

fn header(url: &str) -> ReportHeader {
    ReportHeader {
        workload: "x".into(),
        api: "chat".into(),
        stream: true,
        arrivals: "closed".into(),
        assign: "round_robin".into(),
        urls: vec![url.to_owned()],
        seed: 5,
        pool_size: None,
    }
}

async fn compare(workload: WorkloadConfig, api: Api, requests: u64) {
    let config = common::fast_config();
    let worker = common::spawn(config.clone()).await;
    let client = Client::new(
        BodyOptions {
            api,
            model: Some(config.model.clone()),
            stream: true,
        },
        Duration::from_secs(30),
        None,
    );
    let plan = RunPlan {
        arrivals: Arrivals::Closed { concurrency: 1 },
        max_requests: Some(requests),
        duration: None,
        seed: 5,
        progress: false,
        ctrl_c: false,
        assign: Assign::RoundRobin,
    };
    let real = drive(
        workload.build(5, TextShape::default()).unwrap(),
        client,
        vec![Target::parse(&worker.base).unwrap()],
        plan,
        header(&worker.base),
    )
    .await;
    let sim_cfg = SimConfig {
        workers: 1,
        worker: config,
        workload: workload.clone(),
        shape: TextShape::default(),
        seed: 5,
        api,
        arrivals: Arrivals::Closed { concurrency: 1 },
        max_requests: Some(requests),
        duration: None,
        load_poll: None,
        speeds: Default::default(),
        replicas: Default::default(),
        exact_events: false,
    };
    for who in [Contender::Oracle, Contender::Policy(Default::default())] {
        let sim = run(&sim_cfg, &who).unwrap();
        let name = workload.name();
        assert_eq!(real.failed, 0, "{name}: {:?}", real.errors);
        assert_eq!(sim.completed, real.ok, "{name}");
        assert_eq!(sim.prompt_tokens, real.prompt_tokens, "{name}");
        assert_eq!(sim.completion_tokens, real.completion_tokens, "{name}");
        assert_eq!(sim.cached_tokens, real.cached_tokens, "{name}");
        assert!(
            sim.cached_tokens > 0,
            "{name}: the workload shares prefixes"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_matches_the_worker_token_for_token() {
    let wl = WorkloadConfig::SharedPrefix(SharedPrefixConfig {
        groups: 3,
        prompts_per_group: 4,
        system_tokens: 200,
        question_tokens: 20,
        output_tokens: 6,
        zipf: 0.0,
    });
    compare(wl.clone(), Api::ChatCompletions, 30).await;
    compare(wl, Api::Completions, 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_and_agentic_replies_feed_back_identically() {
    let mt = WorkloadConfig::MultiTurn(MultiTurnConfig {
        conversations: 4,
        turns: 4,
        system_tokens: 64,
        user_tokens: 24,
        output_tokens: 12,
        think_ms: 0.0,
    });
    compare(mt, Api::ChatCompletions, 100).await;
    let ag = WorkloadConfig::Agentic(AgenticConfig {
        agents: 2,
        sessions: 4,
        prefix_tokens: 128,
        task_tokens: 16,
        step_tokens: 16,
        steps: 3,
        output_tokens: 8,
        tool_ms: 0.0,
    });
    compare(ag, Api::ChatCompletions, 100).await;
}
