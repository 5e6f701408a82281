//! The live status page in a real browser: a gateway in front of 64
//! simulated workers under load, its `/dashboard` opened by a headless
//! Chromium (Debian's `chromium`; `.ci/run` installs it), whose rendered
//! DOM is read back (`--dump-dom`) twice.
//!
//! Chromium runs with its own throwaway profile, resolves nothing but
//! loopback, listens on no port (no remote debugging), and is stopped by
//! its process group if it outlives its time. A machine without it fails
//! this test with a message saying so: the page is only checked in a
//! browser.

mod common;

use common::{chat, client, fast_worker, gateway_ready, pd_sim_worker, sim_worker};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const WORKERS: usize = 64;
const KEY: &str = "sk-admin-dashboard-test";

/// The `chromium` on `PATH`, or a failure that says how to get it.
fn chromium() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("chromium"))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "this test drives a real headless Chromium and found no `chromium` on PATH: \
                 install Debian's `chromium` package (`apt-get install chromium`; .ci/run \
                 installs it when missing)"
            )
        })
}

/// Whether this process runs as root (Chromium's sandbox refuses root).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The DOM of `url` after Chromium has run its scripts for `budget_ms` of
/// virtual time (which waits for network fetches).
async fn dump_dom(url: &str, budget_ms: u64) -> String {
    let Browsed { dom, stderr, .. } = browse(url, budget_ms).await;
    assert!(
        dom.contains("<html"),
        "no page from chromium: {dom}\n{stderr}"
    );
    dom
}

/// What one headless Chromium run left: the page's DOM (empty when the
/// page did not load), its standard error, and its net log (Chromium's own
/// record of every request and response, headers included).
struct Browsed {
    dom: String,
    stderr: String,
    net_log: String,
}

/// What Chromium left for `url` after `budget_ms` of virtual time.
async fn browse(url: &str, budget_ms: u64) -> Browsed {
    browse_with(url, format!("--virtual-time-budget={budget_ms}")).await
}

/// What Chromium left for `url`, run for as long as `clock` (its flag)
/// says: virtual time, which waits for every fetch, or real time
/// (`--timeout`), for a page whose fetch never ends.
async fn browse_with(url: &str, clock: String) -> Browsed {
    let profile = std::env::temp_dir().join(format!(
        "radixgate-dashboard-chromium-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    let net_log = profile.with_extension("netlog.json");
    let mut command = tokio::process::Command::new(chromium());
    command
        .arg("--headless")
        .arg("--disable-gpu")
        .arg("--no-first-run")
        .arg("--no-default-browser-check")
        .arg("--disable-extensions")
        .arg("--disable-background-networking")
        .arg("--disable-component-update")
        .arg("--disable-sync")
        .arg("--disable-dev-shm-usage")
        // Names resolve to nothing; loopback addresses are used as they are.
        .arg("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--log-net-log={}", net_log.display()))
        .arg(clock)
        .arg("--dump-dom")
        .arg(url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        // Its own process group, so a hung browser and its helpers can be
        // stopped together.
        .process_group(0);
    if is_root() {
        command.arg("--no-sandbox");
    }
    let child = command.spawn().expect("chromium starts");
    let pid = child.id().expect("a running child has a pid");
    let out = match tokio::time::timeout(Duration::from_secs(120), child.wait_with_output()).await {
        Ok(out) => out.expect("chromium runs"),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
            panic!("chromium (pid {pid}) did not finish within 120 s (a hang guard)");
        }
    };
    let _ = std::fs::remove_dir_all(&profile);
    let logged = std::fs::read_to_string(&net_log).unwrap_or_default();
    let _ = std::fs::remove_file(&net_log);
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "chromium failed ({}): {dom}\n{stderr}",
        out.status
    );
    Browsed {
        dom,
        stderr,
        net_log: logged,
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher as _, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// The text of the element with `id` in a dumped DOM.
fn text_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let open = start + dom[start..].find('>').unwrap() + 1;
    let close = open + dom[open..].find('<').unwrap();
    &dom[open..close]
}

/// An attribute of the element with `id`.
fn attr_of<'a>(dom: &'a str, id: &str, attr: &str) -> &'a str {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page"));
    let tag = &dom[dom[..start].rfind('<').unwrap()..start + dom[start..].find('>').unwrap()];
    let at = tag
        .find(&format!("{attr}=\""))
        .unwrap_or_else(|| panic!("#{id} has no {attr}: {tag}"));
    let value = &tag[at + attr.len() + 2..];
    &value[..value.find('"').unwrap()]
}

/// The markup of the SVG chart `id`.
fn chart<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("<svg id=\"{id}\""))
        .unwrap_or_else(|| panic!("no chart {id}"));
    &dom[start..start + dom[start..].find("</svg>").unwrap()]
}

/// The largest `data-points` of the lines drawn in a chart.
fn points_drawn(svg: &str) -> u64 {
    svg.match_indices("data-points=\"")
        .map(|(i, m)| {
            let v = &svg[i + m.len()..];
            v[..v.find('"').unwrap()].parse::<u64>().unwrap()
        })
        .max()
        .unwrap_or(0)
}

/// The row of the worker at `url` in the workers table.
fn row<'a>(dom: &'a str, url: &str) -> &'a str {
    let start = dom
        .find(&format!("<tr data-worker=\"{url}\""))
        .unwrap_or_else(|| panic!("no row for worker {url}"));
    &dom[start..start + dom[start..].find("</tr>").unwrap()]
}

/// Streamed chat requests over a few shared prefixes, `lanes` at a time,
/// until `stop` is set.
fn drive_load(
    gateway: String,
    lanes: usize,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<u64>> {
    (0..lanes)
        .map(|lane| {
            let (gateway, stop) = (gateway.clone(), stop.clone());
            tokio::spawn(async move {
                let c = client();
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let group = sent % 8;
                    let text = format!(
                        "You are assistant number {group}. Answer briefly and politely. \
                         Question {lane}-{sent}: what is {sent} plus {lane}?"
                    );
                    if let Ok(r) = c
                        .post(format!("{gateway}/v1/chat/completions"))
                        .json(&chat(&text, true))
                        .send()
                        .await
                    {
                        let _ = r.bytes().await;
                    }
                    sent += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                sent
            })
        })
        .collect()
}

async fn data(gateway: &str) -> Value {
    let r = client()
        .get(format!("{gateway}/dashboard/data"))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_live_in_a_real_browser_behind_the_admin_key() {
    // Fails here, before anything starts, on a machine without it.
    chromium();
    let mut workers = Vec::with_capacity(WORKERS);
    for _ in 0..WORKERS {
        workers.push(sim_worker(fast_worker()).await);
    }
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let mut config = common::config(&urls);
    config.server.admin_api_key = Some(KEY.into());
    let gw = gateway_ready(config, WORKERS).await;
    let base = gw.url.clone();

    // The admin key is enforced on the page, its script and its data; a
    // browser is asked for it (Basic), and may give it as the password.
    let c = client();
    for path in ["/dashboard", "/dashboard/app.js", "/dashboard/data"] {
        let r = c.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without a key");
        let offered: Vec<_> = r
            .headers()
            .get_all("www-authenticate")
            .iter()
            .cloned()
            .collect();
        assert!(
            offered
                .iter()
                .any(|v| v.to_str().unwrap().starts_with("Basic ")),
            "{path}: {offered:?}"
        );
        let body = r.text().await.unwrap();
        assert!(!body.contains("workers"), "{path} leaked data: {body}");
        let r = c
            .get(format!("{base}{path}"))
            .basic_auth("anyone", Some("not-the-key"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path} with a wrong password");
        let r = c
            .get(format!("{base}{path}"))
            .basic_auth("anyone", Some(KEY))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path} with the key as password");
    }
    // The routes that change the pool take no Basic credentials.
    let r = c
        .post(format!("{base}/workers"))
        .basic_auth("anyone", Some(KEY))
        .json(&serde_json::json!({"url": "http://127.0.0.1:9"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // Load, and a worker that goes down while the page is open.
    let stop = Arc::new(AtomicBool::new(false));
    let load = drive_load(base.clone(), 6, stop.clone());
    let first = data(&base).await;
    assert_eq!(first["workers"].as_array().unwrap().len(), WORKERS);
    // Two readings with TTFT and latency percentiles, so that the charts
    // have two points to draw whatever the page's first fetch finds (the
    // browser's virtual time runs its refreshes far quicker than the
    // sampler's one reading a second).
    common::wait_until("two TTFT and latency points on the data endpoint", || {
        let base = base.clone();
        async move {
            let data = data(&base).await;
            let charted =
                |p: &Value| p["ttft_ms"]["p50"].is_number() && p["latency_ms"]["p50"].is_number();
            data["pool"]["ttft_ms"]["p50"].is_number()
                && data["series"]
                    .as_array()
                    .is_some_and(|s| s.iter().filter(|p| charted(p)).count() >= 2)
        }
    })
    .await;

    // Without the key, the browser gets the refusal, not the page.
    let port = base.trim_start_matches("http://127.0.0.1:");
    // (Headless Chromium shows an empty page after a refused challenge; a
    // browser that showed the refusal would show its JSON. Either way its
    // net log holds the gateway's 401 and its Basic challenge.)
    let refused = browse(&format!("http://127.0.0.1:{port}/dashboard"), 2000).await;
    assert!(!refused.dom.contains("data-worker"), "{}", refused.dom);
    let challenged = refused.net_log.contains(" 401 Unauthorized")
        && refused
            .net_log
            .contains("radixgate admin (password: the admin key)");
    assert!(
        refused.dom.contains("invalid_api_key") || challenged,
        "neither a refusal shown nor a 401 with the Basic challenge in the net log:\n{}\n{}",
        refused.dom,
        refused.stderr
    );

    // With it: every worker's row, and charts with data.
    let page = format!("http://admin:{KEY}@127.0.0.1:{port}/dashboard");
    let dom = dump_dom(&page, 3000).await;
    assert_eq!(attr_of(&dom, "status", "class"), "pill");
    assert!(dom.contains("data-state=\"live\""), "{dom}");
    assert_eq!(dom.matches("<tr data-worker=").count(), WORKERS, "{dom}");
    for w in &workers {
        let r = row(&dom, &w.url);
        assert!(r.contains("healthy"), "{r}");
    }
    let ttft = chart(&dom, "chart-ttft");
    assert!(points_drawn(ttft) >= 2, "TTFT chart: {ttft}");
    let latency = chart(&dom, "chart-latency");
    assert!(points_drawn(latency) >= 2, "latency chart: {latency}");
    let decisions = chart(&dom, "chart-decisions");
    assert!(decisions.contains("<rect class=\"bar"), "{decisions}");
    assert!(dom.contains("cache_aware branch="), "last decisions: {dom}");
    let answered: u64 = text_of(&dom, "answers-total").parse().unwrap();
    let sampled: u64 = attr_of(&dom, "sampled-at", "data-ms").parse().unwrap();
    assert!(answered > 0);

    // A worker goes down; on a second read the numbers have moved on and
    // its row says so.
    let down = &workers[WORKERS - 1];
    down.stop.cancel();
    common::wait_until("the stopped worker marked unhealthy", || {
        let base = base.clone();
        let url = down.url.clone();
        async move {
            data(&base).await["workers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w["url"] == url.as_str() && w["state"] == "unhealthy")
        }
    })
    .await;
    let dom2 = dump_dom(&page, 3000).await;
    let answered2: u64 = text_of(&dom2, "answers-total").parse().unwrap();
    let sampled2: u64 = attr_of(&dom2, "sampled-at", "data-ms").parse().unwrap();
    assert!(sampled2 > sampled, "sampled at {sampled} then {sampled2}");
    assert!(answered2 > answered, "answers {answered} then {answered2}");
    assert!(
        row(&dom2, &down.url).contains("unhealthy"),
        "{}",
        row(&dom2, &down.url)
    );
    assert_eq!(dom2.matches("<tr data-worker=").count(), WORKERS);

    stop.store(true, Ordering::Relaxed);
    let mut sent = 0;
    for lane in load {
        sent += lane.await.unwrap();
    }
    assert!(sent > 0);
    gw.shutdown().await;
    for w in workers {
        w.stop.cancel();
    }
}

/// A page of another origin (another loopback port) calls the client API
/// from a real browser: with its origin in `cors_allowed_origins` the
/// browser's preflight and call go through and the page reads the answer
/// and the router's headers; without it, the browser refuses the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_an_allowed_origin_calls_the_api_from_a_real_browser() {
    let w = sim_worker(fast_worker()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page_origin = format!("http://{}", listener.local_addr().unwrap());
    let gateways = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let page = {
        let gateways = gateways.clone();
        axum::Router::new().route(
            "/{n}",
            axum::routing::get(move |axum::extract::Path(n): axum::extract::Path<usize>| {
                let gateway = gateways.lock().unwrap()[n].clone();
                async move {
                    axum::response::Html(format!(
                        r#"<html><body><pre id="result">pending</pre><script>
fetch("{gateway}/v1/chat/completions", {{
  method: "POST",
  headers: {{"content-type": "application/json", "authorization": "Bearer sk-client"}},
  body: JSON.stringify({{messages: [{{role: "user", content: "hi"}}], max_tokens: 2}})
}})
  .then(r => r.json().then(j => "status " + r.status + " worker " + r.headers.get("x-radixgate-worker")
      + (j.choices ? " answered" : " " + JSON.stringify(j))))
  .catch(e => "refused: " + e)
  .then(t => {{ document.getElementById("result").textContent = t; }});
</script></body></html>"#
                    ))
                }
            }),
        )
    };
    let served = tokio::spawn(async move { axum::serve(listener, page).await });
    let mut runs = Vec::new();
    for allowed in [true, false] {
        let mut cfg = common::config(&[&w.url]);
        cfg.server.api_key = Some("sk-client".into());
        if allowed {
            cfg.server.cors_allowed_origins = vec![page_origin.clone()];
        }
        let gw = gateway_ready(cfg, 1).await;
        let n = {
            let mut g = gateways.lock().unwrap();
            g.push(gw.url.clone());
            g.len() - 1
        };
        let dom = dump_dom(&format!("{page_origin}/{n}"), 5_000).await;
        runs.push(text_of(&dom, "result").to_owned());
        gw.shutdown().await;
    }
    assert_eq!(
        runs[0],
        format!("status 200 worker {} answered", w.url),
        "allowed"
    );
    assert!(runs[1].starts_with("refused: "), "not allowed: {}", runs[1]);
    served.abort();
}

/// Has the worker `failing` answer every request 500, then sends `n`
/// chats through the gateway at `base`: their statuses.
async fn fail_chats(
    c: &reqwest::Client,
    base: &str,
    failing: &common::SimWorker,
    n: usize,
) -> Vec<reqwest::StatusCode> {
    failing.set_faults(radixgate_sim::server::FaultConfig {
        error_rate: 1.0,
        ..Default::default()
    });
    let mut statuses = Vec::new();
    for i in 0..n {
        let r = c
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat(&format!("fails {i}"), false))
            .send()
            .await
            .unwrap();
        statuses.push(r.status());
    }
    statuses
}

/// The row of the worker at `url` in a data reading, if listed.
fn data_row<'a>(data: &'a Value, url: &str) -> Option<&'a Value> {
    data["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == url)
}

/// A worker removed and added back at its URL once the rate window has
/// passed: its failed-attempt counter is the URL's (it counts on from
/// where it was), and none of those old failures happened in the window,
/// so neither the data nor the page in a real browser shows it failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_back_shows_no_errors_from_before_it_was_removed() {
    chromium();
    let flaky = sim_worker(fast_worker()).await;
    let steady = sim_worker(fast_worker()).await;
    let mut config = common::config(&[&flaky.url, &steady.url]);
    config.server.admin_api_key = Some(KEY.into());
    config.routing = radixgate_routing::PolicyConfig::RoundRobin(Default::default());
    let gw = gateway_ready(config, 2).await;
    let base = gw.url.clone();
    let c = client();
    // Watched from the start; the flaky worker's failures are retried on
    // the steady one.
    data(&base).await;
    for status in fail_chats(&c, &base, &flaky, 6).await {
        assert_eq!(status, 200);
    }
    common::wait_until("the flaky worker's failures on the data", || {
        let (base, url) = (base.clone(), flaky.url.clone());
        async move {
            data_row(&data(&base).await, &url)
                .is_some_and(|w| w["errors_total"].as_u64().unwrap_or(0) >= 2)
        }
    })
    .await;
    let failed = data_row(&data(&base).await, &flaky.url).unwrap()["errors_total"]
        .as_u64()
        .unwrap();

    // Removed, and gone for longer than the rate window.
    let r = c
        .delete(format!("{base}/workers?url={}", flaky.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let gone_at = loop {
        let d = data(&base).await;
        if data_row(&d, &flaky.url).is_none() {
            break d["sampled_at_ms"].as_u64().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let window = data(&base).await["rate_window_secs"].as_u64().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(window + 30);
    loop {
        let d = data(&base).await;
        if d["sampled_at_ms"].as_u64().unwrap() > gone_at + (window + 1) * 1000 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the sampler stopped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Back, mended.
    flaky.set_faults(radixgate_sim::server::FaultConfig::default());
    let r = c
        .post(format!("{base}/workers"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"url": flaky.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    // Every reading from its first one back: its errors since start still
    // count the old failures, its errors per second none of them.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut first_back = None;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never came back"
        );
        let d = data(&base).await;
        if let Some(row) = data_row(&d, &flaky.url) {
            assert_eq!(row["errors_total"], failed, "{row}");
            assert!(
                row["errors_per_sec"].is_null() || row["errors_per_sec"] == 0.0,
                "a worker added back shows its failures from before as new: {row}"
            );
            let at = d["sampled_at_ms"].as_u64().unwrap();
            if at >= *first_back.get_or_insert(at) + 2000 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And the page in a real browser shows no error rate on its row.
    let port = base.trim_start_matches("http://127.0.0.1:");
    let dom = dump_dom(
        &format!("http://admin:{KEY}@127.0.0.1:{port}/dashboard"),
        2000,
    )
    .await;
    let r = row(&dom, &flaky.url);
    assert!(!r.contains("status-err"), "{r}");
    gw.shutdown().await;
    flaky.stop.cancel();
    steady.stop.cancel();
}

/// A worker removed and added back at its URL within the windows (a pod
/// restarted at the same address, `DELETE` then `POST /workers`) is a new
/// worker: its request rate and cache hit rate count from its admission,
/// so its hit rate, in the data and on the page in a real browser, is
/// the one `/workers` shows for it. Before, the windows took the old
/// worker's counts at that URL as the new one's starting point: the
/// rates were the new worker's counts less the old one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_back_within_the_window_shows_its_own_hit_rate() {
    chromium();
    let sim = sim_worker(fast_worker()).await;
    let mut config = common::config(&[&sim.url]);
    config.server.admin_api_key = Some(KEY.into());
    let gw = gateway_ready(config, 1).await;
    let base = gw.url.clone();
    let c = client();
    let ask = |text: String| {
        let (c, base) = (c.clone(), base.clone());
        async move {
            let r = c
                .post(format!("{base}/v1/chat/completions"))
                .json(&chat(&text, false))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        }
    };
    let listed = || {
        let (c, base, url) = (c.clone(), base.clone(), sim.url.clone());
        async move {
            let v: Value = c
                .get(format!("{base}/workers"))
                .bearer_auth(KEY)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["workers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|w| w["url"] == url)
                .cloned()
        }
    };
    // The first worker answers prompts it has not seen (few cached
    // tokens), and is watched: the windows start with its counts.
    const OLD: usize = 5;
    for i in 0..OLD {
        ask(format!(
            "Prompt {i} of the first worker: {}",
            "word ".repeat(60 + i)
        ))
        .await;
    }
    let first = data(&base).await;
    let old = data_row(&first, &sim.url).unwrap()["id"].clone();
    assert_eq!(data_row(&first, &sim.url).unwrap()["requests_total"], OLD);

    // Removed and added back at once.
    let r = c
        .delete(format!("{base}/workers?url={}", sim.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c
        .post(format!("{base}/workers"))
        .bearer_auth(KEY)
        .json(&serde_json::json!({"url": sim.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    common::wait_until("the worker back and healthy", || {
        let listed = listed();
        let old = old.clone();
        async move {
            listed
                .await
                .is_some_and(|w| w["state"] == "healthy" && w["id"] != old)
        }
    })
    .await;
    // The new worker answers one prompt again and again: mostly cached,
    // and more prompt tokens than the first worker's.
    for _ in 0..3 * OLD {
        ask(format!(
            "The same prompt every time: {}",
            "word ".repeat(64)
        ))
        .await;
    }
    let worker = listed().await.unwrap();
    let done = worker["processed"].as_u64().unwrap();
    let truth = worker["cache"]["reported_hit_rate"].as_f64().unwrap();
    let v = loop {
        let v = data(&base).await;
        if data_row(&v, &sim.url).is_some_and(|w| w["requests_total"] == done) {
            break v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The hit window still starts before the removal: the first worker's
    // counts are in it.
    let hit_window = v["hit_window_secs"].as_u64().unwrap() as usize;
    assert!(
        v["series"].as_array().unwrap().len() <= hit_window,
        "this run outlasted the hit window ({hit_window} readings)"
    );
    let w = data_row(&v, &sim.url).unwrap();
    assert_eq!(w["cache_hit_source"], "reported", "{w}");
    let shown = w["cache_hit_rate"].as_f64().unwrap();
    assert!(
        (shown - truth).abs() < 1e-9,
        "/workers says {truth}, the data {shown}: {w}"
    );
    assert!(
        truth < 0.99,
        "the new worker's prompts were all cached: {w}"
    );
    // The page in a real browser shows the same.
    let port = base.trim_start_matches("http://127.0.0.1:");
    let dom = dump_dom(
        &format!("http://admin:{KEY}@127.0.0.1:{port}/dashboard"),
        2000,
    )
    .await;
    let r = row(&dom, &sim.url);
    let hit = &r[r.find("class=\"num hit\"").expect("a hit rate cell")..];
    let hit = &hit[hit.find('>').unwrap() + 1..];
    let pct: f64 = hit[..hit.find('%').unwrap()].parse().unwrap();
    assert!(
        (pct - truth * 100.0).abs() <= 0.51,
        "page {pct}%, /workers {truth}: {r}"
    );
    assert!(hit.contains(">R<"), "{r}");
    gw.shutdown().await;
    sim.stop.cancel();
}

/// A disaggregated pool: each request holds a decode worker and, while it
/// prefills, a prefill worker too. The pool's "in flight" counts requests,
/// once each, in the data and on the page in a real browser; each
/// worker's row keeps its own load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_request_is_in_flight_once_on_the_pool() {
    use radixgate_routing::WorkerRole;
    use radixgate_sim::server::Role;
    chromium();
    let prefill = pd_sim_worker(Role::Prefill).await;
    let decode = pd_sim_worker(Role::Decode).await;
    let mut config = common::config(&[]);
    config.server.admin_api_key = Some(KEY.into());
    config.pd.enabled = true;
    config.pd.protocol = radixgate::config::PdProtocol::Sglang;
    config.pd.decode_policy = radixgate_routing::PolicyConfig::RoundRobin(Default::default());
    config.workers = vec![
        radixgate::config::WorkerSpec::new(prefill.url.clone())
            .with_role(WorkerRole::Prefill)
            .with_bootstrap_port(prefill.handle.bootstrap_addr().map(|a| a.port())),
        radixgate::config::WorkerSpec::new(decode.url.clone()).with_role(WorkerRole::Decode),
    ];
    let gw = gateway_ready(config, 2).await;
    let base = gw.url.clone();
    data(&base).await;
    // Prefill takes the requests and does not answer yet: each request is
    // in flight at both workers.
    prefill.set_faults(radixgate_sim::server::FaultConfig {
        hang: true,
        ..Default::default()
    });
    const REQUESTS: u64 = 3;
    let sent: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move {
                let _ = client()
                    .post(format!("{base}/v1/chat/completions"))
                    .json(&chat(&format!("held {i}"), false))
                    .send()
                    .await;
            })
        })
        .collect();
    common::wait_until("every request held at both workers", || {
        let (base, p, d) = (base.clone(), prefill.url.clone(), decode.url.clone());
        async move {
            let v = data(&base).await;
            [p, d].iter().all(|url| {
                data_row(&v, url).is_some_and(|w| w["in_flight"].as_u64() == Some(REQUESTS))
            })
        }
    })
    .await;
    let v = data(&base).await;
    assert_eq!(v["pool"]["in_flight"], REQUESTS, "{}", v["pool"]);
    let port = base.trim_start_matches("http://127.0.0.1:");
    let dom = dump_dom(
        &format!("http://admin:{KEY}@127.0.0.1:{port}/dashboard"),
        2000,
    )
    .await;
    assert_eq!(text_of(&dom, "in-flight"), REQUESTS.to_string());
    // Each pool's policy: the page showed prefill's as the only one.
    assert_eq!(
        (v["policy"].as_str(), v["decode_policy"].as_str()),
        (Some("cache_aware"), Some("round_robin"))
    );
    assert!(
        text_of(&dom, "policy").starts_with("policy prefill cache_aware · decode round_robin"),
        "{}",
        text_of(&dom, "policy")
    );
    for r in sent {
        r.abort();
    }
    gw.shutdown().await;
    prefill.stop.cancel();
    decode.stop.cancel();
}

/// The dashboard page's files, each with its content type.
const PAGE_FILES: [(&str, &str); 3] = [
    ("/dashboard", "text/html; charset=utf-8"),
    ("/dashboard/app.js", "text/javascript; charset=utf-8"),
    ("/dashboard/style.css", "text/css; charset=utf-8"),
];

/// A router serving `files` (path, content type) as the gateway at
/// `gateway` answered them, each body passed through `edit` (given the
/// path) first.
async fn page_copy(
    gateway: &str,
    files: &[(&'static str, &'static str)],
    edit: impl Fn(&str, String) -> String,
) -> axum::Router {
    let c = client();
    let mut served = axum::Router::new();
    for &(path, kind) in files {
        let r = c.get(format!("{gateway}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let body = edit(path, r.text().await.unwrap());
        served = served.route(
            path,
            axum::routing::get(move || async move {
                ([(axum::http::header::CONTENT_TYPE, kind)], body)
            }),
        );
    }
    served
}

/// A data read that never ends (a connection gone silent: a dead tunnel,
/// a host gone) fails after its timeout, and the page says it is not
/// updating. Before, the read waited for good: the page went on showing
/// "live" with frozen numbers, and never asked again. The page is served
/// here from the gateway's own, beside a data endpoint that never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_read_that_never_ends_shows_the_page_is_not_updating() {
    chromium();
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(common::config(&[&w.url]), 1).await;
    let served = page_copy(&gw.url, &PAGE_FILES, |path, body| {
        if path != "/dashboard" {
            return body;
        }
        // Chromium dumps the page at its load event: an image that comes
        // after the page's timeout holds it till then.
        let body = body.replace("</body>", "<img src=\"/late\" alt=\"\"></body>");
        assert!(body.contains("/late"), "{body}");
        body
    })
    .await;
    let served = served
        .route(
            "/dashboard/data",
            axum::routing::get(std::future::pending::<&'static str>),
        )
        .route(
            "/late",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_secs(8)).await;
                ""
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page = format!("http://{}/dashboard", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, served).await });
    // Real time (virtual time would wait for the read for good): the
    // page's 5 s timeout, then the late image's load event.
    let Browsed { dom, stderr, .. } = browse_with(&page, "--timeout=30000".into()).await;
    assert!(
        dom.contains("<html"),
        "no page from chromium: {dom}\n{stderr}"
    );
    assert_eq!(text_of(&dom, "status"), "not updating", "{dom}");
    assert!(text_of(&dom, "message").contains("Cannot reach the router"));
    gw.shutdown().await;
}

/// A router that still answers but has stopped taking readings (its
/// sampler stuck: the data endpoint serves its last reading again and
/// again) is shown as not updating, with the time of that reading.
/// Before, the page went on showing "live" with the frozen figures. The
/// page is served here from the gateway's own, beside a data endpoint
/// that answers one real reading of it every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_reading_again_and_again_shows_the_page_is_not_updating() {
    chromium();
    let w = sim_worker(fast_worker()).await;
    let gw = gateway_ready(common::config(&[&w.url]), 1).await;
    let data = [("/dashboard/data", "application/json")];
    let served = page_copy(&gw.url, &[&PAGE_FILES[..], &data].concat(), |_, body| body).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let page = format!("http://{}/dashboard", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, served).await });
    // Ten reads of the same reading, a second apart in virtual time.
    let dom = dump_dom(&page, 10_000).await;
    assert_eq!(text_of(&dom, "status"), "not updating", "{dom}");
    assert!(
        text_of(&dom, "message").contains("has taken no new reading since"),
        "{dom}"
    );
    assert!(dom.contains("data-worker="), "the last figures still shown");
    gw.shutdown().await;
}

/// A draining worker is out of the routing snapshot the sampler reads
/// most figures from: its row said breaker `closed`, whatever its breaker
/// was, where `/workers` said `open`. The data now says what `/workers`
/// says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_workers_breaker_is_the_one_workers_shows() {
    let w = sim_worker(fast_worker()).await;
    // No admin key: the admin API takes loopback peers.
    let mut config = common::config(&[&w.url]);
    config.circuit_breaker.failure_threshold = 2;
    config.retry.max_retries = 0;
    let gw = gateway_ready(config, 1).await;
    let base = gw.url.clone();
    let c = client();
    data(&base).await;
    // One request held in flight, so that the removed worker drains.
    w.set_faults(radixgate_sim::server::FaultConfig {
        latency_ms: 4000,
        ..Default::default()
    });
    let held = {
        let (c, base) = (c.clone(), base.clone());
        tokio::spawn(async move {
            c.post(format!("{base}/v1/chat/completions"))
                .json(&chat("held", false))
                .send()
                .await
                .map(|r| r.status())
        })
    };
    common::wait_until("the held request in flight", || {
        let (base, url) = (base.clone(), w.url.clone());
        async move { data_row(&data(&base).await, &url).is_some_and(|r| r["in_flight"] == 1) }
    })
    .await;
    // Then failures open its breaker.
    for status in fail_chats(&c, &base, &w, 3).await {
        assert!(status.is_server_error(), "{status}");
    }
    let removed = common::remove_worker(&base, &w.url).await;
    assert_eq!(removed["state"], "draining", "{removed}");
    let listed = common::workers(&base)
        .await
        .into_iter()
        .find(|r| r["url"] == w.url.as_str())
        .unwrap();
    assert_eq!(listed["state"], "draining", "{listed}");
    assert_eq!(listed["breaker"], "open", "{listed}");
    common::wait_until("the draining row on the data", || {
        let (base, url) = (base.clone(), w.url.clone());
        async move { data_row(&data(&base).await, &url).is_some_and(|r| r["state"] == "draining") }
    })
    .await;
    let row = data_row(&data(&base).await, &w.url).cloned().unwrap();
    assert_eq!(row["breaker"], listed["breaker"], "{row}");
    assert_eq!(row["ejected"], listed["ejected"], "{row}");
    let _ = held.await;
    gw.shutdown().await;
}
