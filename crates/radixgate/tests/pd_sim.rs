//! Prefill/decode disaggregation end to end: `serve` in front of simulated
//! workers in both roles, whose decode really pulls each prompt's KV from
//! the prefill worker over loopback HTTP (SGLang's bootstrap server, vLLM's
//! remote host and port). What reaches the client is decode's answer with
//! the whole prompt counted as cached; the workers' own counters show the
//! transfer happened; a transfer that never arrives and a prefill worker
//! that dies come back to the client as errors, never a hang.

mod common;

use common::{client, config, gateway, post_chat, wait_for_healthy, wait_until};
use radixgate::config::{Config, PdProtocol, WorkerSpec};
use radixgate_routing::WorkerRole;
use radixgate_sim::server::{FaultConfig, PdConfig, Role, WorkerConfig};
use serde_json::{Value, json};

/// A simulated worker in `role`; a prefill worker serves its pulls on a
/// bootstrap port of its own.
async fn worker(role: Role) -> common::SimWorker {
    let mut c = common::fast_worker();
    c.pd = PdConfig {
        role,
        bootstrap_port: (role == Role::Prefill).then_some(0),
        transfer_timeout_ms: 2_000,
        hold_timeout_ms: 5_000,
        ..PdConfig::default()
    };
    common::sim_worker(c).await
}

fn prefill_spec(w: &common::SimWorker) -> WorkerSpec {
    WorkerSpec::new(w.url.clone())
        .with_role(WorkerRole::Prefill)
        .with_bootstrap_port(w.handle.bootstrap_addr().map(|a| a.port()))
}

fn pd_config(
    protocol: PdProtocol,
    prefill: &[&common::SimWorker],
    decode: &[&common::SimWorker],
) -> Config {
    let mut c = config(&[]);
    c.pd.enabled = true;
    c.pd.protocol = protocol;
    c.pd.skip_prefill_max_uncached_tokens = 0;
    c.workers.extend(prefill.iter().map(|w| prefill_spec(w)));
    c.workers.extend(
        decode
            .iter()
            .map(|w| WorkerSpec::new(w.url.clone()).with_role(WorkerRole::Decode)),
    );
    c
}

fn prompt(i: usize) -> String {
    format!(
        "request {i}: {}",
        "a long shared document about prefill and decode pools. ".repeat(40)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_protocols_move_the_kv_and_decode_answers_with_it_cached() {
    let _ = WorkerConfig::default();
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let prefill = worker(Role::Prefill).await;
        let decode = worker(Role::Decode).await;
        let gw = gateway(pd_config(protocol, &[&prefill], &[&decode])).await;
        wait_for_healthy(&gw.url, 2).await;
        for (i, stream) in [false, true].into_iter().enumerate() {
            let mut body = json!({
                "model": "sim-llama-8b",
                "messages": [{"role": "user", "content": prompt(i)}],
                "max_tokens": 8,
                "stream": stream,
            });
            if stream {
                body["stream_options"] = json!({"include_usage": true});
            }
            let r = post_chat(&gw.url, &body).await;
            assert_eq!(r.status(), 200, "{protocol:?} stream={stream}");
            assert_eq!(
                r.headers()["x-radixgate-worker"].to_str().unwrap(),
                decode.url
            );
            let text = r.text().await.unwrap();
            let usage: Value = if stream {
                text.lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                    .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
                    .unwrap_or_else(|| panic!("no usage in {text}"))
            } else {
                serde_json::from_str::<Value>(&text).unwrap()["usage"].clone()
            };
            let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
            assert!(prompt_tokens > 400, "{usage}");
            assert_eq!(
                usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
                Some(prompt_tokens),
                "decode had the whole prompt from prefill: {usage}"
            );
        }
        assert_eq!(
            common::series_sum(&decode.url, "radixgate_sim_kv_transfers_total").await,
            2.0,
            "{protocol:?}"
        );
        assert_eq!(
            common::series_sum(&prefill.url, "radixgate_sim_kv_pulls_served_total").await,
            2.0
        );
        common::wait_for_zero_load(&gw.url).await;
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_that_never_arrives_and_a_dead_prefill_are_errors() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let prefill = worker(Role::Prefill).await;
        let decode = worker(Role::Decode).await;
        let mut c = pd_config(protocol, &[&prefill], &[&decode]);
        c.retry.max_retries = 0;
        let gw = gateway(c).await;
        wait_for_healthy(&gw.url, 2).await;
        prefill.set_faults(FaultConfig {
            drop_transfers: 1.0,
            ..FaultConfig::default()
        });
        let r = client()
            .post(format!("{}/v1/completions", gw.url))
            .json(&json!({"model": "sim-llama-8b", "prompt": prompt(7), "max_tokens": 4}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_server_error(), "{protocol:?}: {}", r.status());
        let err: Value = r.json().await.unwrap();
        let message = err["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(!message.is_empty(), "{err}");
        // The prefill worker dies: decode cannot pull (SGLang), or step one
        // cannot be sent (vLLM).
        prefill.set_faults(FaultConfig::default());
        prefill.stop.cancel();
        let r = client()
            .post(format!("{}/v1/completions", gw.url))
            .json(&json!({"model": "sim-llama-8b", "prompt": prompt(8), "max_tokens": 4}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_server_error(), "{protocol:?}: {}", r.status());
        wait_until("no load left", || async {
            common::total_load(&gw.url).await == 0
        })
        .await;
        gw.shutdown().await;
    }
}

/// A decode worker whose breaker is half-open takes one probe request; a
/// request that finds it busy and no other decode worker is told so (a 503
/// naming the breaker), with no attempt made: vLLM's prefill is not run
/// for a decode that cannot take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_whose_decode_is_probing_is_told_so_without_an_attempt() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let prefill = worker(Role::Prefill).await;
        let decode = worker(Role::Decode).await;
        let mut c = pd_config(protocol, &[&prefill], &[&decode]);
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.timeout_duration_secs = 1;
        let gw = gateway(c).await;
        wait_for_healthy(&gw.url, 2).await;
        let completion = |i| json!({"model": "sim-llama-8b", "prompt": prompt(i), "max_tokens": 4});
        decode.set_faults(FaultConfig {
            error_rate: 1.0,
            ..FaultConfig::default()
        });
        let r = post_completion(&gw.url, &completion(1)).await;
        assert_eq!(r.status(), 500, "{protocol:?}: opens decode's breaker");
        // Half-open after a second; the probe then takes three.
        decode.set_faults(FaultConfig {
            latency_ms: 3_000,
            ..FaultConfig::default()
        });
        tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
        let url = gw.url.clone();
        let body = completion(2);
        let probe = tokio::spawn(async move { post_completion(&url, &body).await.status() });
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let prefilled = common::series_sum(&prefill.url, "radixgate_sim_requests_total").await;
        let trees = || async {
            let loads = common::get_loads(&gw.url).await;
            loads["workers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| (w["url"].clone(), w["cached_chars"].clone()))
                .collect::<Vec<_>>()
        };
        let before = trees().await;
        let r = post_completion(&gw.url, &completion(3)).await;
        assert_eq!(r.status(), 503, "{protocol:?}");
        assert_eq!(
            trees().await,
            before,
            "{protocol:?}: neither side's tree keeps a prompt not sent"
        );
        let err: Value = r.json().await.unwrap();
        let message = err["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("half-open"), "{protocol:?}: {err}");
        assert_eq!(
            common::series_sum(&prefill.url, "radixgate_sim_requests_total").await,
            prefilled,
            "{protocol:?}: nothing sent to prefill for it"
        );
        assert_eq!(probe.await.unwrap(), 200, "{protocol:?}");
        common::wait_for_zero_load(&gw.url).await;
        gw.shutdown().await;
    }
}

/// The gateway's count of `worker`'s breaker state changes.
async fn breaker_transitions(gateway: &str, worker: &str) -> f64 {
    common::metrics_text(gateway)
        .await
        .lines()
        .filter(|l| l.starts_with("radixgate_circuit_breaker_transitions_total{"))
        .filter(|l| l.contains(&format!("worker=\"{worker}\"")))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

async fn post_completion(url: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{url}/v1/completions"))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// A prefill worker whose KV never reaches decode (its own answers fine)
/// fails each pair it is in at decode. A retry then takes another prefill
/// worker too, so the request is answered; and the failures count on the
/// prefill worker's breaker, not only on the decode workers', so it is
/// left out once its breaker opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_worker_whose_transfers_fail_is_left_out_and_its_requests_answered() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let mut quick = common::fast_worker();
        quick.pd = PdConfig {
            role: Role::Decode,
            transfer_timeout_ms: 300,
            ..PdConfig::default()
        };
        let bad = worker(Role::Prefill).await;
        let good = worker(Role::Prefill).await;
        let d1 = common::sim_worker(quick.clone()).await;
        let d2 = common::sim_worker(quick).await;
        let mut c = pd_config(protocol, &[&bad, &good], &[&d1, &d2]);
        c.circuit_breaker.failure_threshold = 3;
        c.circuit_breaker.timeout_duration_secs = 600;
        let gw = gateway(c).await;
        wait_for_healthy(&gw.url, 4).await;
        bad.set_faults(FaultConfig {
            drop_transfers: 1.0,
            ..FaultConfig::default()
        });
        for i in 0..16 {
            let body = json!({"model": "sim-llama-8b", "prompt": prompt(100 + i), "max_tokens": 4});
            let r = post_completion(&gw.url, &body).await;
            let status = r.status();
            assert_eq!(status, 200, "{protocol:?} {i}: {}", r.text().await.unwrap());
            r.bytes().await.unwrap();
        }
        let served = common::series_sum(&bad.url, "radixgate_sim_requests_total").await;
        assert!(
            served <= 3.0,
            "{protocol:?}: the bad prefill served {served}"
        );
        // The bad prefill's breaker opened; the good one's never moved. (A
        // decode worker's may open too, when every pair it was in failed:
        // it took the same failures, but the bad prefill had them first.)
        common::wait_until("the bad prefill's breaker opened", || async {
            breaker_transitions(&gw.url, &bad.url).await == 1.0
        })
        .await;
        assert_eq!(
            breaker_transitions(&gw.url, &good.url).await,
            0.0,
            "{protocol:?}"
        );
        gw.shutdown().await;
    }
}

/// A prefill worker whose transfers fail, let back in half-open, fails its
/// probe at decode: its breaker opens again, in both protocols (SGLang's
/// prefill side still holds the probe's permit as decode fails; the failure
/// must count all the same, not leave the breaker half-open with its probe
/// given back, taking one failing pair after another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probing_prefill_whose_transfer_fails_opens_its_breaker_again() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let mut quick = common::fast_worker();
        quick.pd = PdConfig {
            role: Role::Decode,
            transfer_timeout_ms: 300,
            ..PdConfig::default()
        };
        let bad = worker(Role::Prefill).await;
        let good = worker(Role::Prefill).await;
        let mut decodes = Vec::new();
        for _ in 0..4 {
            decodes.push(common::sim_worker(quick.clone()).await);
        }
        let mut c = pd_config(
            protocol,
            &[&bad, &good],
            &decodes.iter().collect::<Vec<_>>(),
        );
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.timeout_duration_secs = 1;
        let gw = gateway(c).await;
        wait_for_healthy(&gw.url, 6).await;
        bad.set_faults(FaultConfig {
            drop_transfers: 1.0,
            ..FaultConfig::default()
        });
        let mut i = 0;
        // Until the bad prefill's breaker has opened (1), and then, a
        // second on, until its probe has been sent (2).
        for transitions in [1.0, 2.0] {
            if transitions == 2.0 {
                tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
            }
            while breaker_transitions(&gw.url, &bad.url).await < transitions {
                assert!(i < 40, "{protocol:?}: the bad prefill was never chosen");
                let body =
                    json!({"model": "sim-llama-8b", "prompt": prompt(200 + i), "max_tokens": 4});
                let r = post_completion(&gw.url, &body).await;
                assert_eq!(r.status(), 200, "{protocol:?} {i}");
                r.bytes().await.unwrap();
                i += 1;
            }
        }
        common::wait_until("the bad prefill's breaker opened again", || async {
            breaker_transitions(&gw.url, &bad.url).await >= 3.0
        })
        .await;
        gw.shutdown().await;
    }
}

/// A request every pair answers 500 (here, every prefill worker fails
/// everything; from the router's side the same as a prompt that trips an
/// engine bug on every worker) opens no breaker: the pool serves again as
/// soon as the workers do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_every_pair_answers_500_open_no_breaker() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let p1 = worker(Role::Prefill).await;
        let p2 = worker(Role::Prefill).await;
        let d1 = worker(Role::Decode).await;
        let d2 = worker(Role::Decode).await;
        let gw = gateway(pd_config(protocol, &[&p1, &p2], &[&d1, &d2])).await;
        wait_for_healthy(&gw.url, 4).await;
        for p in [&p1, &p2] {
            p.set_faults(FaultConfig {
                error_rate: 1.0,
                ..FaultConfig::default()
            });
        }
        for i in 0..8 {
            let body = json!({"model": "sim-llama-8b", "prompt": prompt(200 + i), "max_tokens": 4});
            let r = post_completion(&gw.url, &body).await;
            assert_eq!(r.status(), 500, "{protocol:?} {i}");
        }
        for w in [&p1, &p2, &d1, &d2] {
            assert_eq!(
                breaker_transitions(&gw.url, &w.url).await,
                0.0,
                "{protocol:?}"
            );
        }
        for p in [&p1, &p2] {
            p.set_faults(FaultConfig::default());
        }
        let body = json!({"model": "sim-llama-8b", "prompt": prompt(300), "max_tokens": 4});
        let r = post_completion(&gw.url, &body).await;
        assert_eq!(r.status(), 200, "{protocol:?}");
        gw.shutdown().await;
    }
}

/// A decode worker that outlier detection ejected (slow, not broken) is
/// the pair's decode side at once when the other decode worker's breaker
/// opens on a request, as in a co-located pool, rather than the request
/// and those after it being answered 503 until the next evaluation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_left_with_only_an_ejected_decode_worker_is_served_by_it() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let prefill = worker(Role::Prefill).await;
        let fast = worker(Role::Decode).await;
        let slow = worker(Role::Decode).await;
        slow.set_faults(FaultConfig {
            latency_ms: 400,
            ..FaultConfig::default()
        });
        let mut c = pd_config(protocol, &[&prefill], &[&fast, &slow]);
        // Each decode worker gets every other request.
        c.pd.decode_policy = radixgate_routing::PolicyConfig::RoundRobin(Default::default());
        let o = &mut c.outlier_detection;
        o.interval_secs = 1;
        o.min_samples = 3;
        o.min_gap_ms = 200;
        o.latency_factor = 2.0;
        o.base_ejection_secs = 300;
        o.max_ejection_percent = 50;
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.timeout_duration_secs = 3600;
        c.retry.initial_backoff_ms = 0;
        c.retry.max_backoff_ms = 0;
        let gw = gateway(c).await;
        wait_for_healthy(&gw.url, 3).await;
        let completion = |i| json!({"model": "sim-llama-8b", "prompt": prompt(i), "max_tokens": 4, "stream": true});
        for i in 0..8 {
            let r = post_completion(&gw.url, &completion(i)).await;
            assert_eq!(r.status(), 200, "{protocol:?}");
            r.bytes().await.unwrap();
        }
        let ejected = || async {
            common::metrics_text(&gw.url)
                .await
                .lines()
                .find(|l| {
                    l.starts_with("radixgate_outlier_ejected{")
                        && l.contains(&format!("worker=\"{}\"", slow.url))
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        wait_until("the slow decode worker is ejected", || async {
            ejected().await == Some(1.0)
        })
        .await;
        fast.set_faults(FaultConfig {
            refuse: true,
            ..FaultConfig::default()
        });
        for i in 8..11 {
            let r = post_completion(&gw.url, &completion(i)).await;
            let status = r.status();
            let worker = r.headers().get("x-radixgate-worker").cloned();
            let body = r.text().await.unwrap();
            assert_eq!(status, 200, "{protocol:?}, request {i}: {body}");
            assert_eq!(
                worker.unwrap(),
                slow.url.as_str(),
                "{protocol:?}, request {i}"
            );
        }
        gw.shutdown().await;
    }
}

/// A side that is down (its connections refused) was sent nothing: the
/// router's record of its cache does not keep the prompt, as a co-located
/// worker's does not. It kept it, so once the worker was back the prompt's
/// next request went to it as a cache hit (prefill) or predicted held
/// (decode) that was not there. Decode's keeps nothing either where
/// prefill was down: it never got the prompt's KV.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_that_is_down_keeps_no_prompt_on_its_record() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        for down in [Role::Prefill, Role::Decode] {
            let case = format!("{protocol:?} {down:?}");
            let prefill = worker(Role::Prefill).await;
            let decode = worker(Role::Decode).await;
            let mut c = pd_config(protocol, &[&prefill], &[&decode]);
            c.retry.max_retries = 0;
            c.circuit_breaker.enabled = false;
            let gw = gateway(c).await;
            wait_for_healthy(&gw.url, 2).await;
            let side = match down {
                Role::Decode => &decode,
                _ => &prefill,
            };
            side.set_faults(FaultConfig {
                refuse: true,
                ..FaultConfig::default()
            });
            let body = json!({"model": "sim-llama-8b", "prompt": prompt(9), "max_tokens": 4});
            let r = post_completion(&gw.url, &body).await;
            assert_eq!(r.status(), 502, "{case}: {}", r.text().await.unwrap());
            common::wait_for_zero_load(&gw.url).await;
            assert_eq!(
                common::recorded_chars(&gw.url, &side.url).await,
                0,
                "{case}: the record of the side that was down keeps the prompt"
            );
            // Nor does decode's when prefill was down: under SGLang it is
            // sent the request beside prefill, and without prefill's KV it
            // holds nothing of it. (Prefill, with decode down, did compute
            // the prompt, and holds it.)
            if down == Role::Prefill {
                assert_eq!(
                    common::recorded_chars(&gw.url, &decode.url).await,
                    0,
                    "{case}: decode's record keeps a prompt whose prefill failed"
                );
            }
            // Back and served, it does.
            side.set_faults(FaultConfig::default());
            wait_for_healthy(&gw.url, 2).await;
            let r = post_completion(&gw.url, &body).await;
            assert_eq!(r.status(), 200, "{case}");
            common::wait_for_zero_load(&gw.url).await;
            assert!(
                common::recorded_chars(&gw.url, &side.url).await > 0,
                "{case}: served, the prompt is recorded"
            );
            gw.shutdown().await;
        }
    }
}

/// A prefill or decode worker listed with a model (a LoRA adapter) that
/// stops serving it (the adapter unloaded since its models were read)
/// answers the request 404, as vLLM does. As in the co-located loop, the
/// request goes at once to another worker of that side listed with the
/// model, outside `retry.max_retries` (0 here), that worker's models are
/// read again, and its breaker does not count it; where no other worker
/// of that side is listed with it, the client gets 404 `model_not_found`
/// naming the side. Before, the client got the worker's 404 while another
/// worker served the model, until its next models read (30 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_side_that_unloaded_the_model_passes_the_request_to_another_pair() {
    for protocol in [PdProtocol::Sglang, PdProtocol::Vllm] {
        let prefills = [worker(Role::Prefill).await, worker(Role::Prefill).await];
        let decodes = [worker(Role::Decode).await, worker(Role::Decode).await];
        let every = || prefills.iter().chain(&decodes);
        for w in every() {
            w.set_faults(FaultConfig {
                strict_models: true,
                ..FaultConfig::default()
            });
            for adapter in ["sql-lora", "b-lora"] {
                assert_eq!(lora(w, "load", adapter).await, 200);
            }
        }
        let mut c = pd_config(
            protocol,
            &[&prefills[0], &prefills[1]],
            &[&decodes[0], &decodes[1]],
        );
        c.retry.max_retries = 0;
        c.circuit_breaker.failure_threshold = 1;
        c.circuit_breaker.timeout_duration_secs = 3600;
        // Read again only when asked, within the test's time.
        c.health.models_refresh_secs = 3600;
        // The prompt's decode worker is the one that holds it.
        c.pd.decode_policy = radixgate_routing::PolicyConfig::named("cache_aware").unwrap();
        let gw = gateway(c).await;
        wait_for_healthy(&gw.url, 4).await;
        let case = format!("{protocol:?}");
        let body = |model: &str, i| json!({"model": model, "prompt": prompt(i), "max_tokens": 4});
        let by_url = |url: &str| every().find(|w| w.url == url).unwrap();
        let without_sql = json!(["sim-llama-8b", "b-lora"]);

        let r = post_completion(&gw.url, &body("sql-lora", 1)).await;
        assert_eq!(r.status(), 200, "{case}");
        let (prefill, _) = pair(r).await;

        // Prefill's cache hit takes the prompt to it first; it turns it
        // away, and the other prefill worker serves it.
        assert_eq!(lora(by_url(&prefill), "unload", "sql-lora").await, 200);
        let r = post_completion(&gw.url, &body("sql-lora", 1)).await;
        assert_eq!(r.status(), 200, "{case}: {}", r.text().await.unwrap());
        let (other, decode) = pair(r).await;
        assert_ne!(other, prefill, "{case}");
        assert_eq!(not_served(&gw.url, &prefill).await, 1.0, "{case}");
        assert_eq!(breaker_transitions(&gw.url, &prefill).await, 0.0, "{case}");
        wait_until("the prefill worker's models read again", || async {
            models_of(&gw.url, &prefill).await == without_sql
        })
        .await;

        // The same on decode's side: its cache hit takes the prompt back.
        assert_eq!(lora(by_url(&decode), "unload", "sql-lora").await, 200);
        let r = post_completion(&gw.url, &body("sql-lora", 1)).await;
        assert_eq!(r.status(), 200, "{case}: {}", r.text().await.unwrap());
        let (_, last_decode) = pair(r).await;
        assert_ne!(last_decode, decode, "{case}");
        assert_eq!(not_served(&gw.url, &decode).await, 1.0, "{case}");
        assert_eq!(breaker_transitions(&gw.url, &decode).await, 0.0, "{case}");
        wait_until("the decode worker's models read again", || async {
            models_of(&gw.url, &decode).await == without_sql
        })
        .await;
        assert_eq!(
            common::series_sum(&gw.url, "radixgate_pd_failures_total").await,
            0.0,
            "{case}: a side that does not serve the model failed nothing"
        );

        // No prefill worker serves b-lora any more: each is asked, and the
        // client is told. Decode, sent nothing (vLLM) or nothing it could
        // compute (SGLang), keeps no record of the prompt.
        common::wait_for_zero_load(&gw.url).await;
        let decode_chars = || async {
            let mut sum = 0;
            for d in &decodes {
                sum += common::recorded_chars(&gw.url, &d.url).await;
            }
            sum
        };
        let before = decode_chars().await;
        for p in &prefills {
            assert_eq!(lora(p, "unload", "b-lora").await, 200);
        }
        let r = post_completion(&gw.url, &body("b-lora", 2)).await;
        let status = r.status();
        let answer: Value = r.json().await.unwrap();
        assert_eq!(status, 404, "{case}: {answer}");
        assert_eq!(
            answer["error"]["code"], "model_not_found",
            "{case}: {answer}"
        );
        assert_eq!(answer["error"]["param"], "model", "{case}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("`b-lora`") && message.contains("prefill"),
            "{case}: {message}"
        );
        for p in &prefills {
            assert_eq!(breaker_transitions(&gw.url, &p.url).await, 0.0, "{case}");
        }
        common::wait_for_zero_load(&gw.url).await;
        assert_eq!(decode_chars().await, before, "{case}");

        // Nor any decode worker sql-lora: the last one listed is asked.
        assert_eq!(lora(by_url(&last_decode), "unload", "sql-lora").await, 200);
        let r = post_completion(&gw.url, &body("sql-lora", 3)).await;
        let status = r.status();
        let answer: Value = r.json().await.unwrap();
        assert_eq!(status, 404, "{case}: {answer}");
        assert_eq!(
            answer["error"]["code"], "model_not_found",
            "{case}: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("`sql-lora`") && message.contains("decode"),
            "{case}: {message}"
        );
        assert_eq!(
            breaker_transitions(&gw.url, &last_decode).await,
            0.0,
            "{case}"
        );
        common::wait_for_zero_load(&gw.url).await;
        gw.shutdown().await;
    }
}

/// `POST /v1/{op}_lora_adapter` for `name` on a simulated worker: its status.
async fn lora(w: &common::SimWorker, op: &str, name: &str) -> u16 {
    let r = client()
        .post(format!("{}/v1/{op}_lora_adapter", w.url))
        .json(&json!({"lora_name": name, "lora_path": format!("/adapters/{name}")}))
        .send()
        .await
        .unwrap();
    r.status().as_u16()
}

/// The models `/workers` lists for the worker at `url`.
async fn models_of(gateway: &str, url: &str) -> Value {
    let listed = common::workers(gateway).await;
    let found = listed.iter().find(|w| w["url"] == url);
    found.map(|w| w["models"].clone()).unwrap_or_default()
}

/// The prefill and decode workers an answer names; reads it to its end.
async fn pair(r: reqwest::Response) -> (String, String) {
    let header = |name: &str| {
        let value = r
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned());
        value.unwrap_or_default()
    };
    let pair = (
        header("x-radixgate-prefill-worker"),
        header("x-radixgate-worker"),
    );
    r.bytes().await.unwrap();
    pair
}

/// The gateway's count of `worker`'s answers that it does not serve the
/// model it is listed with.
async fn not_served(gateway: &str, worker: &str) -> f64 {
    let series =
        format!("radixgate_upstream_errors_total{{worker=\"{worker}\",kind=\"model_not_served\"}}");
    common::series_value(gateway, &series).await
}
