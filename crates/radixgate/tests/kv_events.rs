//! KV events end to end: `serve` subscribed to simulated workers that
//! publish their paged caches' stores and evictions over ZeroMQ in the
//! engines' wire format (`radixgate worker --kv-events-endpoint`). Requests
//! are SGLang `/generate` bodies with `input_ids`, which need no tokenizer
//! on either side; the worker caches exactly those ids.

mod common;

use common::*;
use radixgate::config::Config;
use radixgate_sim::server::{FaultConfig, WorkerConfig};
use serde_json::{Value, json};

/// A publisher's endpoint on a port the system picks as it binds (a port
/// picked free beforehand may be taken by another test by then).
const ANY_PORT: &str = "tcp://127.0.0.1:0";

/// A fast worker with a small cache (`blocks` blocks of 16 tokens) that
/// publishes KV events on a fixed port, with a replay socket if asked.
async fn publishing_worker(blocks: usize, replay: bool) -> (SimWorker, String) {
    let mut c: WorkerConfig = fast_worker();
    c.engine.kv_capacity_tokens = blocks * c.engine.block_size;
    c.kv_events.endpoint = ANY_PORT.to_owned();
    if replay {
        c.kv_events.replay_endpoint = ANY_PORT.to_owned();
    }
    let worker = sim_worker(c).await;
    let endpoint = worker.handle.kv_events_endpoint().expect("publishing");
    (worker, endpoint)
}

/// A gateway subscribed to each worker's publisher (and replay socket).
fn events_config(workers: &[(&SimWorker, &str)]) -> Config {
    let urls: Vec<&str> = workers.iter().map(|(w, _)| w.url.as_str()).collect();
    let mut c = config(&urls);
    c.kv_events.enabled = true;
    for (w, endpoint) in workers {
        c.kv_events
            .endpoints
            .insert(w.url.clone(), (*endpoint).to_owned());
    }
    for (w, _) in workers {
        if let Some(replay) = w.handle.kv_events_replay_endpoint() {
            c.kv_events.replay_endpoints.insert(w.url.clone(), replay);
        }
    }
    c
}

/// `n` token ids for prompt `tag` (distinct prompts share no block).
fn ids(tag: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| 1 + tag * 10_000 + i).collect()
}

fn body(ids: &[u32]) -> Value {
    json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
}

/// Sends `/generate` to `url` (a worker or the gateway); returns the
/// serving worker and the decision header (empty from a worker).
async fn generate(url: &str, ids: &[u32]) -> (String, String) {
    let r = client()
        .post(format!("{url}/generate"))
        .json(&body(ids))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    served_by(r).await
}

async fn wait_live(gateway: &str, n: usize) {
    wait_until(&format!("{n} workers live"), || async {
        series_value(gateway, "radixgate_kv_events_live_workers").await == n as f64
    })
    .await;
}

/// Has the worker at `url` empty its cache (its engine reports it).
async fn flush_cache(url: &str) {
    let r = client()
        .post(format!("{url}/flush_cache"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

/// A test model with a ChatML chat template, written to a temporary
/// directory.
fn chatml_model() -> radixgate_tokenize::testing::TempDir {
    use radixgate_tokenize::testing::{CHATML_TEMPLATE, TestModel};
    TestModel {
        chat_template: Some(CHATML_TEMPLATE.to_owned()),
        ..TestModel::default()
    }
    .write_temp()
    .unwrap()
}

/// Makes each worker's stream exact and waits until all are live. A
/// subscriber that joins after a publisher's first batch cannot know what
/// came before (without replay); the engine's `AllBlocksCleared` tells it
/// the cache is empty. So each worker's cache is filled a little and
/// flushed, again until the subscription had joined in time to hear it.
async fn make_live(gateway: &str, workers: &[&SimWorker]) {
    wait_until(&format!("{} workers live", workers.len()), || async {
        for w in workers {
            // (Flushing an empty cache tells nobody anything.)
            generate(&w.url, &ids(9_999, 40)).await;
            flush_cache(&w.url).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        series_value(gateway, "radixgate_kv_events_live_workers").await == workers.len() as f64
    })
    .await;
}

/// What a worker holds that the router never routed: a prompt sent
/// straight to a worker is found there through its events, and the tree
/// alone could not know it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_the_router_never_saw_are_found_through_events() {
    let (w1, e1) = publishing_worker(4096, false).await;
    let (w2, e2) = publishing_worker(4096, false).await;
    let gw = gateway_ready(events_config(&[(&w1, &e1), (&w2, &e2)]), 2).await;
    make_live(&gw.url, &[&w1, &w2]).await;
    for tag in 0..6u32 {
        let holder = if tag % 2 == 0 { &w1 } else { &w2 };
        let prompt = ids(tag, 160);
        let stored = series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await;
        generate(&holder.url, &prompt).await;
        // The events arrive a moment after the answer: its 10 blocks.
        wait_until("the stored blocks to be indexed", || async {
            series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await >= stored + 10.0
        })
        .await;
        let mut extended = prompt.clone();
        extended.extend(ids(100 + tag, 32));
        let (worker, decision) = generate(&gw.url, &extended).await;
        assert_eq!(worker, holder.url, "prompt {tag}: {decision}");
        assert!(decision.contains("index=exact"), "{decision}");
        assert!(decision.contains("branch=cache_hit"), "{decision}");
    }
    gw.shutdown().await;
}

/// The tree remembers a prefix its worker has evicted; the events say it
/// is gone, so the request is not sent there for a hit that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_follows_real_evictions() {
    for events in [true, false] {
        let (w1, e1) = publishing_worker(24, false).await;
        let (w2, e2) = publishing_worker(24, false).await;
        let mut cfg = events_config(&[(&w1, &e1), (&w2, &e2)]);
        cfg.kv_events.enabled = events;
        let gw = gateway_ready(cfg, 2).await;
        if events {
            make_live(&gw.url, &[&w1, &w2]).await;
        }
        let prompt = ids(1, 160);
        let (owner, _) = generate(&gw.url, &prompt).await;
        // Fill the owner's 24-block cache with other prompts, sent to it
        // directly: the router's tree never hears of them.
        for tag in 10..14 {
            generate(&owner, &ids(tag, 320)).await;
        }
        if events {
            // Least recently used first: the prompt's 10 blocks.
            wait_until("the evictions to be indexed", || async {
                series_value(&gw.url, "radixgate_kv_events_blocks_removed_total").await >= 10.0
            })
            .await;
        }
        let (_, decision) = generate(&gw.url, &prompt).await;
        if events {
            assert!(!decision.contains("branch=cache_hit"), "{decision}");
            assert!(decision.contains("match=0.000"), "{decision}");
        } else {
            // The control: the tree alone still predicts the hit.
            assert!(decision.contains("branch=cache_hit"), "{decision}");
        }
        gw.shutdown().await;
    }
}

/// A publisher restart drops the worker's blocks and the stream comes back
/// live; while it is down the worker is matched in the tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_restart_falls_back_to_the_tree_then_recovers() {
    let (w1, e1) = publishing_worker(4096, false).await;
    let (w2, e2) = publishing_worker(4096, false).await;
    let gw = gateway_ready(events_config(&[(&w1, &e1), (&w2, &e2)]), 2).await;
    make_live(&gw.url, &[&w1, &w2]).await;
    let prompt = ids(3, 160);
    let (owner, decision) = generate(&gw.url, &prompt).await;
    let (owner_w, other_w) = if owner == w1.url {
        (&w1, &w2)
    } else {
        (&w2, &w1)
    };
    assert!(!decision.contains("branch=cache_hit"), "{decision}");
    // The publisher goes away: the stream is stale, the worker is matched
    // in the tree (a hit without `index=exact`).
    owner_w.set_faults(FaultConfig {
        kv_events_stopped: true,
        ..FaultConfig::default()
    });
    wait_live(&gw.url, 1).await;
    let (w, decision) = generate(&gw.url, &prompt).await;
    assert_eq!(w, owner, "{decision}");
    assert!(decision.contains("branch=cache_hit"), "{decision}");
    assert!(!decision.contains("index=exact"), "{decision}");
    // It comes back as a new publisher (sequence 0): its next batch makes
    // it live again.
    owner_w.set_faults(FaultConfig::default());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    generate(&owner, &ids(4, 64)).await;
    wait_live(&gw.url, 2).await;
    assert!(
        series_value(
            &gw.url,
            "radixgate_kv_events_stale_total{reason=\"disconnected\"}"
        )
        .await
            + series_value(
                &gw.url,
                "radixgate_kv_events_stale_total{reason=\"restarted\"}"
            )
            .await
            >= 1.0
    );
    // The other worker's stream stayed live throughout.
    let _ = other_w;
    gw.shutdown().await;
}

/// A sequence gap: filled from the engine's replay socket when it has one
/// (the stream stays live), else the worker is stale and matched in the
/// tree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_gap_is_replayed_or_makes_the_worker_stale() {
    for replay in [true, false] {
        let (w1, e1) = publishing_worker(4096, replay).await;
        let gw = gateway_ready(events_config(&[(&w1, &e1)]), 1).await;
        make_live(&gw.url, &[&w1]).await;
        w1.set_faults(FaultConfig {
            kv_events_drop: 1,
            ..FaultConfig::default()
        });
        // The withheld batch, then one that shows the gap.
        generate(&w1.url, &ids(20, 64)).await;
        generate(&w1.url, &ids(21, 64)).await;
        if replay {
            wait_until("the gap filled by replay", || async {
                // 4 blocks, then 4.
                series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await >= 8.0
            })
            .await;
            assert_eq!(
                series_value(&gw.url, "radixgate_kv_events_live_workers").await,
                1.0
            );
            assert_eq!(
                series_value(&gw.url, "radixgate_kv_events_stale_total{reason=\"gap\"}").await,
                0.0
            );
        } else {
            wait_until("the gap seen", || async {
                series_value(&gw.url, "radixgate_kv_events_stale_total{reason=\"gap\"}").await
                    >= 1.0
            })
            .await;
            wait_live(&gw.url, 0).await;
        }
        gw.shutdown().await;
    }
}

/// Chat requests, tokenized by the router with the model's tokenizer and
/// chat template, match the blocks the worker reported for the same
/// conversation sent to it directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_requests_are_tokenized_like_the_worker_and_matched() {
    use radixgate_sim::tokens::ModelTokens;
    use radixgate_tokenize::testing::sample_text;
    let dir = chatml_model();
    let tokens = std::sync::Arc::new(ModelTokens(
        radixgate_tokenize::Tokenizer::load(dir.path()).unwrap(),
    ));
    let mut workers = Vec::new();
    for _ in 0..2 {
        let mut c: WorkerConfig = fast_worker();
        c.kv_events.endpoint = ANY_PORT.to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let handle =
            radixgate_sim::server::start_with_tokens(listener, c, tokens.clone(), stop.clone())
                .await
                .unwrap();
        let url = format!("http://{}", handle.addr());
        let endpoint = handle.kv_events_endpoint().expect("publishing");
        workers.push((SimWorker { handle, url, stop }, endpoint));
    }
    let (w1, e1) = &workers[0];
    let (w2, e2) = &workers[1];
    let mut cfg = events_config(&[(w1, e1), (w2, e2)]);
    cfg.kv_events.tokenizer = Some(dir.path().to_path_buf());
    let gw = gateway_ready(cfg, 2).await;
    make_live(&gw.url, &[w1, w2]).await;
    for tag in 0..4u64 {
        let holder = if tag % 2 == 0 { w1 } else { w2 };
        let system = sample_text(400, tag);
        let ask = |question: &str| {
            json!({"max_tokens": 2, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ]})
        };
        let stored = series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await;
        let r = client()
            .post(format!("{}/v1/chat/completions", holder.url))
            .json(&ask("what does it say?"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        wait_until("the conversation's blocks to be indexed", || async {
            series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await >= stored + 10.0
        })
        .await;
        let r = client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(&ask("and in one word?"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let worker = r.headers()["x-radixgate-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        let decision = r.headers()["x-radixgate-decision"]
            .to_str()
            .unwrap()
            .to_owned();
        r.bytes().await.unwrap();
        assert_eq!(worker, holder.url, "conversation {tag}: {decision}");
        assert!(decision.contains("index=exact"), "{decision}");
        assert!(decision.contains("branch=cache_hit"), "{decision}");
    }
    assert!(
        series_value(
            &gw.url,
            "radixgate_kv_events_requests_total{match=\"exact\"}"
        )
        .await
            >= 4.0
    );
    gw.shutdown().await;
}

/// Only a prompt's first `max_routing_text_chars` are tokenized and
/// matched, as the tree keeps only that much of it: a prompt of any length
/// costs no more than that to match (a 22 MB chat prompt took 9 s of CPU
/// and 3.3 GB before), and the share it finds held is the capped
/// prefix's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_capped_prefix_of_a_prompt_is_matched() {
    let (w1, e1) = publishing_worker(4096, false).await;
    let (w2, e2) = publishing_worker(4096, false).await;
    let mut cfg = events_config(&[(&w1, &e1), (&w2, &e2)]);
    let radixgate_routing::PolicyConfig::CacheAware(c) = &mut cfg.routing else {
        panic!("the default policy is cache_aware");
    };
    c.max_routing_text_chars = 200;
    let gw = gateway_ready(cfg, 2).await;
    make_live(&gw.url, &[&w1, &w2]).await;
    let held = ids(0, 160);
    let stored = series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await;
    generate(&w1.url, &held).await;
    wait_until("the stored blocks to be indexed", || async {
        series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await >= stored + 10.0
    })
    .await;
    // 160 of the first 200 ids are held: a hit. Matched against all 5,000
    // it would be 3% of the prompt, no hit at all.
    let mut long = held.clone();
    long.extend(ids(1, 4_840));
    let (worker, decision) = generate(&gw.url, &long).await;
    assert_eq!(worker, w1.url, "{decision}");
    assert!(decision.contains("index=exact"), "{decision}");
    assert!(decision.contains("branch=cache_hit"), "{decision}");
    gw.shutdown().await;
}

/// A rank over its block limit is matched on the tree, and is matched
/// exactly again once its engine clears its cache (the index holds all of
/// it then); a rank whose blocks were refused before its stream went live
/// does not go live with the refused blocks missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_over_its_block_limit_is_exact_again_once_its_cache_is_cleared() {
    let (w1, e1) = publishing_worker(4096, false).await;
    let mut cfg = events_config(&[(&w1, &e1)]);
    // make_live's prompt is 2 blocks; 160 ids are 10.
    cfg.kv_events.max_blocks_per_worker = 4;
    let gw = gateway_ready(cfg, 1).await;
    make_live(&gw.url, &[&w1]).await;
    let over = "radixgate_kv_events_stale_total{reason=\"over_capacity\"}";
    generate(&w1.url, &ids(1, 160)).await;
    wait_until("the rank over its limit", || async {
        series_value(&gw.url, over).await >= 1.0
    })
    .await;
    wait_live(&gw.url, 0).await;
    flush_cache(&w1.url).await;
    wait_live(&gw.url, 1).await;
    // A new publisher (sequence 0) whose first batch is over the limit.
    w1.set_faults(FaultConfig {
        kv_events_stopped: true,
        ..FaultConfig::default()
    });
    wait_live(&gw.url, 0).await;
    w1.set_faults(FaultConfig::default());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let stored = series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await;
    generate(&w1.url, &ids(2, 160)).await;
    wait_until("the new publisher's batch applied", || async {
        series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await >= stored + 4.0
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        series_value(&gw.url, "radixgate_kv_events_live_workers").await,
        0.0,
        "live with 6 of its 10 blocks refused"
    );
    flush_cache(&w1.url).await;
    wait_live(&gw.url, 1).await;
    gw.shutdown().await;
}

/// A request for a model the tokenizer is not listed for
/// (`kv_events.tokenizer_models`) is routed on the tree, not tokenized
/// into ids its engines never saw; one that carries its own ids is still
/// matched exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_the_tokenizer_is_not_listed_for_is_routed_on_the_tree() {
    let dir = chatml_model();
    let (w1, e1) = publishing_worker(4096, false).await;
    let mut cfg = events_config(&[(&w1, &e1)]);
    cfg.kv_events.tokenizer = Some(dir.path().to_path_buf());
    cfg.kv_events.tokenizer_models = vec!["another-model".into()];
    let gw = gateway_ready(cfg, 1).await;
    make_live(&gw.url, &[&w1]).await;
    let exact = "radixgate_kv_events_requests_total{match=\"exact\"}";
    generate(&gw.url, &ids(3, 64)).await;
    assert_eq!(series_value(&gw.url, exact).await, 1.0);
    // (The simulated worker's own chat ids do not fit the wire's 32 bits,
    // so its stream goes stale after this one: it is the last request.)
    let r = client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&json!({"max_tokens": 2, "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let decision = r.headers()["x-radixgate-decision"]
        .to_str()
        .unwrap()
        .to_owned();
    r.bytes().await.unwrap();
    assert!(!decision.contains("index=exact"), "{decision}");
    let other = "radixgate_kv_events_requests_total{match=\"other_model\"}";
    assert_eq!(series_value(&gw.url, other).await, 1.0);
    assert_eq!(series_value(&gw.url, exact).await, 1.0);
    gw.shutdown().await;
}

/// A worker whose answers deny its events (its publisher hung while its
/// cache changed: here, emptied unreported) is taken off exact matching
/// after eight such answers in a row, and matched exactly again once its
/// engine clears its cache where the stream says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_answers_deny_its_events_is_matched_on_the_tree() {
    let (w1, e1) = publishing_worker(4096, false).await;
    let gw = gateway_ready(events_config(&[(&w1, &e1)]), 1).await;
    make_live(&gw.url, &[&w1]).await;
    let stored = series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await;
    for tag in 0..8 {
        generate(&w1.url, &ids(tag, 400)).await;
    }
    wait_until("the prompts' blocks indexed", || async {
        series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await >= stored + 200.0
    })
    .await;
    // The publisher hangs; the cache is emptied, and nobody is told.
    w1.set_faults(FaultConfig {
        kv_events_frozen: true,
        ..FaultConfig::default()
    });
    flush_cache(&w1.url).await;
    let contradicted = "radixgate_kv_events_stale_total{reason=\"contradicted\"}";
    for tag in 0..8 {
        assert_eq!(
            series_value(&gw.url, contradicted).await,
            0.0,
            "after {tag}"
        );
        let mut prompt = ids(tag, 400);
        prompt.extend(ids(100 + tag, 16));
        let (_, decision) = generate(&gw.url, &prompt).await;
        assert!(decision.contains("index=exact"), "{decision}");
    }
    wait_until("the worker contradicted", || async {
        series_value(&gw.url, contradicted).await == 1.0
    })
    .await;
    wait_live(&gw.url, 0).await;
    let (_, decision) = generate(&gw.url, &ids(0, 400)).await;
    assert!(!decision.contains("index=exact"), "{decision}");
    // The publisher recovers, and the engine clears its cache.
    w1.set_faults(FaultConfig::default());
    flush_cache(&w1.url).await;
    wait_live(&gw.url, 1).await;
    gw.shutdown().await;
}

/// A worker of two data-parallel ranks answers each request from the rank
/// its engine picks, which need not be the one holding the prompt (its
/// events say the worker holds it): such answers deny nothing, and the
/// worker stays matched exactly. Here rank 1's publisher is another
/// engine's, whose cache holds prompts the worker's own rank 0 lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_parallel_worker_answering_from_another_rank_is_not_contradicted() {
    // Two ports in a row, for ranks 0 and 1: rank 0's as it binds, rank
    // 1's the next, tried until it is free.
    let rank = |endpoint: String| async move {
        let mut c: WorkerConfig = fast_worker();
        c.engine.kv_capacity_tokens = 4096 * c.engine.block_size;
        c.kv_events.endpoint = endpoint;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let handle = radixgate_sim::server::start(listener, c, stop.clone()).await;
        handle.map(|handle| {
            let url = format!("http://{}", handle.addr());
            SimWorker { handle, url, stop }
        })
    };
    let mut pair = None;
    for _ in 0..20 {
        let w0 = rank(ANY_PORT.to_owned()).await.unwrap();
        let bound = w0.handle.kv_events_endpoint().expect("publishing");
        let port: u16 = bound.rsplit(':').next().unwrap().parse().unwrap();
        if port == u16::MAX {
            w0.stop.cancel();
            continue;
        }
        match rank(format!("tcp://127.0.0.1:{}", port + 1)).await {
            Ok(w1) => {
                pair = Some((w0, w1, port));
                break;
            }
            Err(_) => w0.stop.cancel(),
        }
    }
    let (w0, w1, port) = pair.expect("two ports in a row");
    let mut c = config(&[w0.url.as_str()]);
    c.kv_events.enabled = true;
    c.kv_events.data_parallel_size = 2;
    c.kv_events
        .endpoints
        .insert(w0.url.clone(), format!("tcp://127.0.0.1:{port}"));
    let gw = gateway_ready(c, 1).await;
    wait_until("both ranks live", || async {
        for w in [&w0, &w1] {
            generate(&w.url, &ids(9_999, 40)).await;
            flush_cache(&w.url).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        series_value(&gw.url, "radixgate_kv_events_live_workers").await == 1.0
    })
    .await;
    let stored = series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await;
    for tag in 0..10 {
        generate(&w1.url, &ids(tag, 400)).await;
    }
    wait_until("rank 1's prompts indexed", || async {
        series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await >= stored + 250.0
    })
    .await;
    for tag in 0..10 {
        let mut prompt = ids(tag, 400);
        prompt.extend(ids(100 + tag, 16));
        let (_, decision) = generate(&gw.url, &prompt).await;
        assert!(decision.contains("index=exact"), "{tag}: {decision}");
    }
    // The answers' reports are read as their bodies end.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let contradicted = "radixgate_kv_events_stale_total{reason=\"contradicted\"}";
    assert_eq!(series_value(&gw.url, contradicted).await, 0.0);
    assert_eq!(
        series_value(&gw.url, "radixgate_kv_events_live_workers").await,
        1.0
    );
    gw.shutdown().await;
}

/// Two engines on one host, each with its own publisher and replay socket:
/// a worker listed in `kv_events.endpoints` asks its gaps of its own
/// replay socket (`kv_events.replay_endpoints`), never of the one at the
/// shared `replay_port`, which is another engine's: that one answers with
/// its own batches under the same sequence numbers, and they were applied
/// as this worker's, which then counted as live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_its_own_endpoint_never_replays_another_engines_batches() {
    let port = |e: &str| e.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    for own_replay in [false, true] {
        let (w1, e1) = publishing_worker(4096, true).await;
        let (w2, e2) = publishing_worker(4096, true).await;
        let r2 = w2.handle.kv_events_replay_endpoint().unwrap();
        let mut cfg = events_config(&[(&w1, &e1), (&w2, &e2)]);
        // The operator's layout: w1 at the default ports, w2 given its own
        // publisher (and, in the second round, its own replay socket).
        cfg.kv_events.port = port(&e1);
        cfg.kv_events.replay_port = Some(port(&w1.handle.kv_events_replay_endpoint().unwrap()));
        cfg.kv_events.endpoints.remove(&w1.url);
        cfg.kv_events.replay_endpoints.clear();
        if own_replay {
            cfg.kv_events.replay_endpoints.insert(w2.url.clone(), r2);
        }
        let gw = gateway_ready(cfg, 2).await;
        make_live(&gw.url, &[&w1, &w2]).await;
        // w1 publishes far more batches than w2: its replay buffer holds
        // the sequence numbers w2's gap will miss.
        for tag in 0..12 {
            generate(&w1.url, &ids(40 + tag, 32)).await;
        }
        let counters = |w: &SimWorker| w.handle.kv_events_counters().unwrap();
        let (w1_replays, w2_replays) = (counters(&w1).replays, counters(&w2).replays);
        w2.set_faults(FaultConfig {
            kv_events_drop: 1,
            ..FaultConfig::default()
        });
        let withheld = ids(60, 64);
        generate(&w2.url, &withheld).await;
        generate(&w2.url, &ids(61, 64)).await;
        if own_replay {
            wait_until("w2's own replay socket asked", || async {
                counters(&w2).replays > w2_replays
            })
            .await;
            wait_live(&gw.url, 2).await;
            // The withheld batch came back: its prompt is held by w2.
            let mut extended = withheld.clone();
            extended.extend(ids(62, 16));
            let (worker, decision) = generate(&gw.url, &extended).await;
            assert_eq!(worker, w2.url, "{decision}");
            assert!(decision.contains("index=exact"), "{decision}");
        } else {
            wait_until("the gap seen", || async {
                series_value(&gw.url, "radixgate_kv_events_stale_total{reason=\"gap\"}").await
                    >= 1.0
            })
            .await;
            wait_live(&gw.url, 1).await;
        }
        assert_eq!(
            counters(&w1).replays,
            w1_replays,
            "w2's gap was asked of w1's replay socket"
        );
        gw.shutdown().await;
    }
}

/// Two workers whose publishers resolve to one endpoint (engines sharing a
/// host at the default port, where each needs its own entry in
/// `kv_events.endpoints`) would both be matched on the one engine's
/// events. Neither is matched exactly while they share it; once one
/// leaves the pool, the other is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_sharing_one_publisher_endpoint_are_not_matched_on_it() {
    let (w1, e1) = publishing_worker(4096, false).await;
    // w2 publishes nothing: what w1's publisher says is not its cache.
    let w2 = sim_worker(fast_worker()).await;
    let mut cfg = events_config(&[(&w1, &e1)]);
    cfg.kv_events.endpoints.clear();
    cfg.kv_events.port = e1.rsplit(':').next().unwrap().parse().unwrap();
    cfg.workers = config(&[w1.url.as_str(), w2.url.as_str()]).workers;
    let gw = gateway_ready(cfg, 2).await;
    wait_until("both workers subscribed", || async {
        series_value(&gw.url, "radixgate_kv_events_workers").await == 2.0
    })
    .await;
    // Until both subscriptions have heard a clear: their streams exact.
    let batches = "radixgate_kv_events_batches_total";
    wait_until("two streams exact", || async {
        let before = series_value(&gw.url, batches).await;
        generate(&w1.url, &ids(9_999, 40)).await;
        flush_cache(&w1.url).await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        series_value(&gw.url, batches).await >= before + 4.0
    })
    .await;
    let prompt = ids(5, 160);
    generate(&w1.url, &prompt).await;
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert_eq!(
        series_value(&gw.url, "radixgate_kv_events_live_workers").await,
        0.0,
        "workers matched on one shared publisher's events"
    );
    let (_, decision) = generate(&gw.url, &prompt).await;
    assert!(!decision.contains("index=exact"), "{decision}");
    // w2 leaves: the endpoint is w1's alone again.
    let r = client()
        .delete(format!("{}/workers?url={}", gw.url, w2.url))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    wait_live(&gw.url, 1).await;
    let mut extended = prompt.clone();
    extended.extend(ids(6, 32));
    let (worker, decision) = generate(&gw.url, &extended).await;
    assert_eq!(worker, w1.url, "{decision}");
    assert!(decision.contains("index=exact"), "{decision}");
    gw.shutdown().await;
}

/// A request in a cache namespace of its own (SGLang's `lora_path` or
/// `extra_key`, vLLM's `cache_salt`) shares no prefix with the engine's
/// blocks of the shared namespace, whose events carry the same token ids:
/// it is not matched on them, but routed on the tree, where its text is
/// apart. Before, such a request was sent to the worker holding the
/// shared namespace's prompt as an exact cache hit that was not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_its_own_cache_namespace_is_not_matched_on_shared_blocks() {
    let (w1, e1) = publishing_worker(4096, false).await;
    let (w2, e2) = publishing_worker(4096, false).await;
    let gw = gateway_ready(events_config(&[(&w1, &e1), (&w2, &e2)]), 2).await;
    make_live(&gw.url, &[&w1, &w2]).await;
    let prompt = ids(7, 160);
    let stored = series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await;
    generate(&w1.url, &prompt).await;
    wait_until("the stored blocks to be indexed", || async {
        series_value(&gw.url, "radixgate_kv_events_blocks_stored_total").await >= stored + 10.0
    })
    .await;
    // The simulated engine keys its cache by token ids alone, so a worker
    // that served a namespaced request publishes the same blocks too.
    let mut holders = vec![w1.url.clone()];
    for (field, value) in [
        ("lora_path", "adapter-a"),
        ("extra_key", "tenant-a"),
        ("cache_salt", "salt-a"),
    ] {
        let mut b = body(&prompt);
        b[field] = json!(value);
        let r = client()
            .post(format!("{}/generate", gw.url))
            .json(&b)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let (worker, decision) = served_by(r).await;
        holders.push(worker);
        assert!(!decision.contains("index=exact"), "{field}: {decision}");
        assert!(
            !decision.contains("branch=cache_hit"),
            "{field}: {decision}"
        );
    }
    assert_eq!(
        series_value(
            &gw.url,
            "radixgate_kv_events_requests_total{match=\"namespaced\"}"
        )
        .await,
        3.0
    );
    // The shared namespace's own request is still matched exactly, on a
    // worker whose engine holds its blocks.
    let (worker, decision) = generate(&gw.url, &prompt).await;
    assert!(
        holders.contains(&worker),
        "{worker} not in {holders:?}: {decision}"
    );
    assert!(decision.contains("index=exact"), "{decision}");
    assert!(decision.contains("match=1.000"), "{decision}");
    gw.shutdown().await;
}

/// `kv_events.endpoints` and `replay_endpoints` are keyed by a worker's
/// URL as the operator wrote it, which the pool keeps in its canonical
/// spelling (no trailing `/`, lower case, no default port). Before, an
/// entry written `http://host:port/`, as in the workers list, was never
/// found: the worker was subscribed at its host's default port instead
/// (nothing there, or another engine's publisher), and never live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_keyed_by_another_spelling_of_the_workers_url_is_used() {
    let (w1, e1) = publishing_worker(4096, true).await;
    let spelled = format!("{}/", w1.url);
    let mut c = config(&[spelled.as_str()]);
    c.kv_events.enabled = true;
    c.kv_events.endpoints.insert(spelled.clone(), e1.clone());
    let replay = w1.handle.kv_events_replay_endpoint().expect("replay");
    c.kv_events.replay_endpoints.insert(spelled, replay);
    let gw = gateway_ready(c, 1).await;
    make_live(&gw.url, &[&w1]).await;
    let prompt = ids(3, 160);
    generate(&w1.url, &prompt).await;
    wait_until("the stored blocks to be indexed", || async {
        series_value(&gw.url, "radixgate_kv_events_index_blocks").await >= 10.0
    })
    .await;
    let (_, decision) = generate(&gw.url, &prompt).await;
    assert!(decision.contains("index=exact"), "{decision}");
    gw.shutdown().await;
}

/// Waits until a prompt the worker at `holder` was sent directly (so the
/// tree never saw it) is routed there as an exact cache hit: `prompt`
/// extended anew at each try, for the worker's own model (it may serve
/// others).
async fn wait_exact_hit(gateway: &str, holder: &SimWorker, prompt: &[u32], tag: u32) {
    let mut tries = 0;
    wait_until("an exact cache hit", || {
        tries += 1;
        let mut extended = prompt.to_vec();
        extended.extend(ids(tag + tries, 32));
        let mut body = body(&extended);
        body["model"] = json!(radixgate_sim::server::DEFAULT_MODEL);
        async move {
            let r = client()
                .post(format!("{gateway}/generate"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let (worker, decision) = served_by(r).await;
            worker == holder.url
                && decision.contains("index=exact")
                && decision.contains("branch=cache_hit")
        }
    })
    .await;
}

/// Loads a LoRA adapter on the simulated worker at `url`, as vLLM's
/// `/v1/load_lora_adapter` does, and waits until the router lists it.
async fn load_adapter(gateway: &str, url: &str, name: &str) {
    let r = client()
        .post(format!("{url}/v1/load_lora_adapter"))
        .json(&json!({"lora_name": name, "lora_path": format!("/adapters/{name}")}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    wait_until("the worker listed with the adapter", || async {
        workers(gateway).await[0]["models"]
            .to_string()
            .contains(name)
    })
    .await;
}

/// One publishing worker behind a gateway that reads its models again
/// every second, its stream live, and a prompt the worker was sent
/// directly (returned) found there exactly.
async fn live_and_holding() -> (SimWorker, Gateway, Vec<u32>) {
    let (w1, e1) = publishing_worker(4096, false).await;
    let mut cfg = events_config(&[(&w1, &e1)]);
    cfg.health.interval_secs = 1;
    cfg.health.models_refresh_secs = 1;
    let gw = gateway_ready(cfg, 1).await;
    make_live(&gw.url, &[&w1]).await;
    let held = ids(1, 160);
    generate(&w1.url, &held).await;
    wait_exact_hit(&gw.url, &w1, &held, 100).await;
    (w1, gw, held)
}

/// A worker listed again under a new id at its URL, its engine never
/// restarted (an operator removed it and added it back), keeps its event
/// stream and its blocks. Before, it was subscribed to afresh as a new
/// worker: the stream it joined had started long before, so it was never
/// exact again, and the worker was matched on the tree until its engine
/// cleared its cache or restarted. (A LoRA adapter loaded at run time,
/// which relisted the worker so too, now keeps its id.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_relisted_at_its_url_keeps_its_event_stream() {
    let (w1, gw, before) = live_and_holding().await;
    let id = workers(&gw.url).await[0]["id"].clone();

    load_adapter(&gw.url, &w1.url, "sql-lora").await;
    assert_eq!(workers(&gw.url).await[0]["id"], id, "listed in place");
    wait_exact_hit(&gw.url, &w1, &before, 200).await;

    let removed = remove_worker(&gw.url, &w1.url).await;
    assert_eq!(removed["state"], "removed", "{removed}");
    let r = client()
        .post(format!("{}/workers", gw.url))
        .json(&json!({"url": w1.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    wait_until("the worker back under a new id", || async {
        let listed = workers(&gw.url).await;
        listed
            .first()
            .is_some_and(|w| w["id"] != id && w["state"] == "healthy")
    })
    .await;
    // Both what it held before and what it caches after are exact hits.
    wait_exact_hit(&gw.url, &w1, &before, 300).await;
    let after = ids(2, 160);
    generate(&w1.url, &after).await;
    wait_exact_hit(&gw.url, &w1, &after, 400).await;
    assert_eq!(
        series_value(&gw.url, "radixgate_kv_events_live_workers").await,
        1.0
    );
    gw.shutdown().await;
}

/// A request for a LoRA adapter is not matched on the base model's blocks:
/// vLLM keys an adapter's blocks apart from the base model's, so the
/// engine cannot reuse them. It was matched there, promised an exact hit
/// the engine did not have, and after 8 such answers the worker was taken
/// as contradicting its events. It is routed on the tree (counted
/// `namespaced`), as a request in its own cache namespace is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_a_lora_adapter_is_not_matched_on_the_base_models_blocks() {
    let (w1, gw, held) = live_and_holding().await;
    load_adapter(&gw.url, &w1.url, "sql-lora").await;
    let mut body = body(&held);
    body["model"] = json!("sql-lora");
    let r = client()
        .post(format!("{}/generate", gw.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, decision) = served_by(r).await;
    assert!(!decision.contains("index=exact"), "{decision}");
    let namespaced = "radixgate_kv_events_requests_total{match=\"namespaced\"}";
    assert_eq!(series_value(&gw.url, namespaced).await, 1.0);
    gw.shutdown().await;
}

/// A stream joined after its engine stored blocks (no replay of its start)
/// reports stores whose parent block the router never heard of: they are
/// skipped, and now counted by reason (they went nowhere, so a live-looking
/// stream that matched nothing gave no sign of why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_blocks_the_index_cannot_take_are_counted() {
    let (w, e) = publishing_worker(4096, false).await;
    // Stored before the router subscribes: unheard of.
    generate(&w.url, &ids(1, 64)).await;
    let gw = gateway_ready(events_config(&[(&w, &e)]), 1).await;
    let skipped = "radixgate_kv_events_blocks_skipped_total{reason=\"unknown_parent\"}";
    let tries = std::sync::atomic::AtomicU32::new(2);
    wait_until("a store under an unheard-of parent counted", || async {
        // The same prompt, longer (each try another way, should the
        // subscription not have joined yet): its new blocks' parent is
        // the last block stored before.
        let mut longer = ids(1, 64);
        let tag = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        longer.extend(ids(tag, 48));
        generate(&w.url, &longer).await;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        series_value(&gw.url, skipped).await > 0.0
    })
    .await;
    gw.shutdown().await;
}
