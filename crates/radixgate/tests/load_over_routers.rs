//! `radixgate load` spread over several routers: two real gateways in front
//! of the same two real simulated workers, on loopback. The load tool's
//! per-URL counts must be what each router says it served (`/get_loads`'
//! `processed`, summed over its workers).

mod common;

use clap::Parser;
use common::{config, fast_worker, gateway_ready, get_loads, sim_worker};
use radixgate_sim::load::{LoadArgs, LoadReport};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    load: LoadArgs,
}

/// Requests a gateway has finished, over all its workers.
async fn processed(gateway: &str) -> u64 {
    get_loads(gateway).await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["processed"].as_u64().unwrap())
        .sum()
}

async fn load(argv: &str) -> LoadReport {
    let args = Cli::try_parse_from(argv.split_whitespace()).unwrap().load;
    radixgate_sim::load::run(&args).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_spreads_over_two_routers_and_counts_each() {
    let w1 = sim_worker(fast_worker()).await;
    let w2 = sim_worker(fast_worker()).await;
    let workers = [w1.url.as_str(), w2.url.as_str()];
    let a = gateway_ready(config(&workers), 2).await;
    let b = gateway_ready(config(&workers), 2).await;

    // Round-robin, the two URLs as a comma list: half each.
    let report = load(&format!(
        "load --url {},{} --workload shared-prefix --groups 4 --concurrency 4 --requests 40 --no-progress",
        a.url, b.url
    ))
    .await;
    assert_eq!((report.ok, report.failed), (40, 0), "{}", report.table());
    assert_eq!(report.header.urls, [a.url.clone(), b.url.clone()]);
    assert_eq!(report.per_url, [20, 20]);
    assert_eq!((processed(&a.url).await, processed(&b.url).await), (20, 20));
    assert!(report.table().contains("(requests each)"));

    // By client hash (repeated --url): every conversation stays on one
    // router, and each router served what the tool counted for it.
    let report = load(&format!(
        "load --url {} --url {} --workload multi-turn --conversations 5 --turns 3 --think-ms 0 --concurrency 4 --requests 15 --assign client-hash --no-progress",
        a.url, b.url
    ))
    .await;
    assert_eq!((report.ok, report.failed), (15, 0), "{}", report.table());
    assert_eq!(report.per_url.iter().sum::<u64>(), 15);
    assert_eq!(
        (processed(&a.url).await, processed(&b.url).await),
        (20 + report.per_url[0], 20 + report.per_url[1])
    );
    // Whole conversations: each router's share is a multiple of 3 turns
    // (round-robin would split the 15 requests 8 and 7).
    assert!(
        report.per_url.iter().all(|n| n % 3 == 0),
        "{:?}",
        report.per_url
    );
    a.shutdown().await;
    b.shutdown().await;
    w1.stop.cancel();
    w2.stop.cancel();
}

/// A router that checks keys: `--api-key` sends one with every request, on
/// every API, and a run without it fails each request with the router's
/// 401. An empty key is refused before any request is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_sends_its_api_key() {
    let w = sim_worker(fast_worker()).await;
    let mut cfg = config(&[w.url.as_str()]);
    cfg.server.api_key = Some("sk-load".into());
    let gw = gateway_ready(cfg, 1).await;

    for api in ["chat", "completions", "messages", "responses"] {
        let report = load(&format!(
            "load --url {} --api {api} --api-key sk-load --requests 4 --concurrency 2 --no-progress",
            gw.url
        ))
        .await;
        assert_eq!(
            (report.ok, report.failed),
            (4, 0),
            "{api}: {}",
            report.table()
        );
    }
    let report = load(&format!(
        "load --url {} --requests 3 --concurrency 1 --no-progress",
        gw.url
    ))
    .await;
    assert_eq!((report.ok, report.failed), (0, 3), "{}", report.table());
    assert_eq!(
        report.errors.get("http_401"),
        Some(&3),
        "{:?}",
        report.errors
    );

    for (key, why) in [(" ", "is empty"), ("a\nb", "a header cannot carry")] {
        let mut args = Cli::try_parse_from(["load", "--url", &gw.url, "--no-progress"])
            .unwrap()
            .load;
        args.api_key = Some(key.into());
        let err = radixgate_sim::load::run(&args)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("--api-key") && err.contains(why), "{err}");
    }
    gw.shutdown().await;
    w.stop.cancel();
}
