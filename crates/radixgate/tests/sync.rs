//! Router replicas sharing state over a real `nats-server` started by the
//! tests (loopback, JetStream, its own store), with real simulated workers
//! and in-process gateways.

mod common;
mod sync_support;

use async_nats::jetstream::Context as JetStream;
use async_nats::jetstream::stream::{Config as StreamConfig, DiscardPolicy, StorageType};
use common::*;
use radixgate::config::{Config, StreamStorage};
use radixgate_sim::server::FaultConfig;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use sync_support::{Nats, Partition, client_cert, temp_dir, tls_files};

fn replica_config(nats: &[String], workers: &[&str]) -> Config {
    let mut c = config(workers);
    c.sync.urls = nats.to_vec();
    c.sync.batch_ms = 5;
    c.sync.warmup_timeout_secs = 60;
    c
}

/// A prompt long enough that a repeat of it is a clear cache hit.
fn prompt(tag: &str) -> String {
    format!(
        "{tag}: {}",
        "please summarise the attached quarterly report. ".repeat(12)
    )
}

/// Sends one chat request; returns the worker that served it and the
/// decision's branch.
async fn ask(gateway: &str, text: &str) -> (String, String) {
    let r = client()
        .post(format!("{gateway}/v1/chat/completions"))
        .json(&chat(text, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{text}");
    let (worker, decision) = served_by(r).await;
    let branch = decision
        .split_whitespace()
        .find_map(|p| p.strip_prefix("branch="))
        .unwrap_or_default()
        .to_owned();
    (worker, branch)
}

async fn readiness(gateway: &str) -> u16 {
    client()
        .get(format!("{gateway}/readiness"))
        .send()
        .await
        .map_or(0, |r| r.status().as_u16())
}

async fn wait_ready(gateway: &str) {
    wait_until("readiness 200", || async {
        readiness(gateway).await == 200
    })
    .await;
}

async fn wait_connected(gateway: &str) {
    wait_until("sync connected", || async {
        series_value(gateway, "radixgate_sync_connected").await == 1.0
    })
    .await;
}

/// Three workers; replicas A and B on one NATS.
async fn two_replicas(nats: &Nats) -> (Vec<SimWorker>, Gateway, Gateway) {
    two_replicas_at(&nats.url(), &nats.url()).await
}

/// Three workers; replica A reaching NATS at `a_nats`, B at `b_nats`.
async fn two_replicas_at(a_nats: &str, b_nats: &str) -> (Vec<SimWorker>, Gateway, Gateway) {
    let workers = vec![
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let a = gateway_ready(replica_config(&[a_nats.to_owned()], &urls), 3).await;
    let b = gateway_ready(replica_config(&[b_nats.to_owned()], &urls), 3).await;
    wait_ready(&a.url).await;
    wait_ready(&b.url).await;
    wait_connected(&a.url).await;
    wait_connected(&b.url).await;
    (workers, a, b)
}

/// Two replicas over `nats`, A through a loopback proxy the test can
/// freeze, slow or heal, B directly.
async fn two_replicas_a_through_a_proxy(
    nats: &Nats,
) -> (Partition, Vec<SimWorker>, Gateway, Gateway) {
    let proxy = Partition::in_front_of(nats).await;
    let (workers, a, b) = two_replicas_at(&proxy.url(), &nats.url()).await;
    (proxy, workers, a, b)
}

/// Two workers; replica A with `edit` made to its config, B as is; both
/// ready and connected.
async fn two_replicas_with(
    nats: &Nats,
    edit: impl FnOnce(&mut Config),
) -> (Vec<SimWorker>, Gateway, Gateway) {
    let workers = vec![
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let mut changed = replica_config(&[nats.url()], &urls);
    edit(&mut changed);
    let a = gateway_ready(changed, 2).await;
    let b = gateway_ready(replica_config(&[nats.url()], &urls), 2).await;
    for gw in [&a.url, &b.url] {
        wait_ready(gw).await;
        wait_connected(gw).await;
    }
    (workers, a, b)
}

/// A nats-server config whose one account, the routers' (user `router`,
/// password `s3cret`), has no JetStream, though the server runs it.
const NO_JETSTREAM_ACCOUNT: &str =
    "accounts: { ROUTERS: { users: [ { user: router, password: s3cret } ] } }\n";

/// A NATS server run with the config file `conf` (written into a fresh
/// directory, which also gets the password file of the user `router`).
fn nats_with_config(tag: &str, conf: &str) -> (Nats, std::path::PathBuf) {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("nats.conf"), conf).unwrap();
    std::fs::write(dir.join("password"), "s3cret\n").unwrap();
    let nats = Nats::start(&["-c", dir.join("nats.conf").to_str().unwrap()]);
    (nats, dir)
}

/// A replica of `workers` signing in as `router`, password from `dir`.
fn router_config(nats: &Nats, dir: &std::path::Path, workers: &[&str]) -> Config {
    let mut c = replica_config(&[nats.url()], workers);
    c.sync.auth.user = Some("router".into());
    c.sync.auth.password_file = Some(dir.join("password"));
    c
}

/// Two workers; replicas A and B signing in as `router`, connected.
async fn two_routers(nats: &Nats, dir: &std::path::Path) -> (Vec<SimWorker>, Gateway, Gateway) {
    let workers = vec![
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let a = gateway_ready(router_config(nats, dir, &urls), 2).await;
    let b = gateway_ready(router_config(nats, dir, &urls), 2).await;
    for gw in [&a.url, &b.url] {
        wait_connected(gw).await;
    }
    (workers, a, b)
}

/// Asks `from` to route `text`, then waits until `to` applied the decision
/// to its tree: asking `to` to route is no way to wait, since each ask
/// inserts into its own tree, and two replicas fed the same prompts tend to
/// make the same choices on their own.
async fn ask_and_wait(from: &str, to: &str, text: &str) -> String {
    let learned = || series_value(to, "radixgate_sync_entries_learned_total");
    let learned0 = learned().await;
    let (worker, _) = ask(from, text).await;
    // One routed request is one entry; `to` counts it once it is in its
    // tree. (Counting messages instead is not exact: a load report on core
    // NATS may be lost, and then no count ever matches.) A hang guard, not
    // a speed assertion; on a timeout both replicas' sync series say where
    // the entry stopped.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while learned().await <= learned0 {
        if std::time::Instant::now() > deadline {
            panic!(
                "timed out waiting for {to} learned what {from} routed\n{from}:\n{}\n{to}:\n{}",
                sync_series(from).await,
                sync_series(to).await
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker
}

/// A gateway's `radixgate_sync_*` series, one a line.
async fn sync_series(gateway: &str) -> String {
    metrics_text(gateway)
        .await
        .lines()
        .filter(|l| l.starts_with("radixgate_sync_"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Routes fresh prompts through `from` until `to` learns one: for while
/// decisions may be lost on the way (no live feed yet), where
/// [`ask_and_wait`] would wait on one for ever.
async fn until_decisions_get_through(what: &str, from: &str, to: &str) {
    let learned = || series_value(to, "radixgate_sync_entries_learned_total");
    let mut probe = 0;
    wait_until(what, || {
        probe += 1;
        let text = prompt(&format!("{what}: probe {probe}"));
        async move {
            let before = learned().await;
            ask(from, &text).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
            learned().await > before
        }
    })
    .await;
}

/// Routes `n` fresh prompts through `from`, then checks `to` sends each to
/// the same worker as a cache hit, at its first ask.
async fn assert_propagates(from: &str, to: &str, tag: &str, n: usize) {
    for i in 0..n {
        let text = prompt(&format!("{tag} {i}"));
        let worker = ask_and_wait(from, to, &text).await;
        let (w, branch) = ask(to, &text).await;
        assert_eq!(
            (w.as_str(), branch.as_str()),
            (worker.as_str(), "cache_hit"),
            "{to} did not learn {tag} {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_propagate_between_replicas() {
    let nats = Nats::start(&[]);
    let (_workers, a, b) = two_replicas(&nats).await;
    // Each prompt lands on some worker at A; B sends its repeat there too.
    let mut seen = std::collections::HashSet::new();
    for i in 0..6 {
        let text = prompt(&format!("conversation {i}"));
        let at_a = ask_and_wait(&a.url, &b.url, &text).await;
        seen.insert(at_a.clone());
        let (at_b, branch) = ask(&b.url, &format!("{text} and a follow-up")).await;
        assert_eq!(
            (at_b.as_str(), branch.as_str()),
            (at_a.as_str(), "cache_hit"),
            "B routes A's prefix to A's worker"
        );
    }
    assert!(seen.len() > 1, "the prompts spread over workers: {seen:?}");
    assert_propagates(&b.url, &a.url, "from b", 3).await;
    assert!(series_value(&a.url, "radixgate_sync_messages_sent_total").await > 0.0);
    assert!(series_value(&b.url, "radixgate_sync_bytes_received_total").await > 0.0);
    assert!(
        series_value(&a.url, "radixgate_sync_ignored_total{reason=\"own\"}").await > 0.0,
        "own messages come back and are skipped"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_reaches_the_other_replicas_before_its_answer_does() {
    let nats = Nats::start(&[]);
    let (workers, a, b) = two_replicas(&nats).await;
    // No worker answers: A's request waits for its first byte (a long
    // prefill, a whole answer's decode) while B must already know where
    // its prompt went, or B routes the same prefix blind meanwhile.
    let hang = FaultConfig {
        hang: true,
        ..FaultConfig::default()
    };
    for w in &workers {
        w.set_faults(hang.clone());
    }
    let learned = || series_value(&b.url, "radixgate_sync_entries_learned_total");
    let learned0 = learned().await;
    let text = prompt("unanswered");
    let url = a.url.clone();
    let asked = text.clone();
    let pending = tokio::spawn(async move { ask(&url, &asked).await });
    wait_until("B learns A's decision before its answer", || async {
        learned().await > learned0
    })
    .await;
    assert!(!pending.is_finished(), "the worker answered nothing yet");
    let mut chosen = Vec::new();
    for w in &workers {
        if worker_loads(&a.url, &w.url).await["load"] == 1 {
            chosen.push(w.url.clone());
        }
    }
    assert_eq!(chosen.len(), 1, "A holds its one request: {chosen:?}");
    for w in &workers {
        w.set_faults(FaultConfig::default());
    }
    let (at_b, branch) = ask(&b.url, &format!("{text} and a follow-up")).await;
    assert_eq!(
        (at_b.as_str(), branch.as_str()),
        (chosen[0].as_str(), "cache_hit"),
        "B routes the prefix to where A sent it"
    );
    pending.abort();
    a.shutdown().await;
    b.shutdown().await;
}

/// A fast worker that waits `latency_ms` before it starts on each
/// generation request.
async fn late_worker(latency_ms: u64) -> SimWorker {
    let w = sim_worker(fast_worker()).await;
    w.set_faults(FaultConfig {
        latency_ms,
        ..FaultConfig::default()
    });
    w
}

/// A replica over `workers` (all healthy before it returns) that counts a
/// peer's load report for `load_expiry_ms` after the peer's last one.
async fn replica_keeping_reports(nats: &Nats, workers: &[&str], load_expiry_ms: u64) -> Gateway {
    let mut c = replica_config(&[nats.url()], workers);
    c.sync.load_expiry_ms = load_expiry_ms;
    gateway_ready(c, workers.len()).await
}

/// `n` requests through `gateway`, sent at once and answered in the
/// background: (worker, branch) each.
fn send_at_once(gateway: &str, n: usize) -> Vec<tokio::task::JoinHandle<(String, String)>> {
    (0..n)
        .map(|i| {
            let url = gateway.to_owned();
            tokio::spawn(async move { ask(&url, &prompt(&format!("held {i}"))).await })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_publish_queue_drops_and_counts_and_every_request_is_answered() {
    let nats = Nats::start(&[]);
    // A's publisher sends a decision, then holds the next for a second
    // while its queue has room for one more.
    let (_workers, a, b) = two_replicas_with(&nats, |c| {
        c.sync.queue_capacity = 1;
        c.sync.batch_ms = 1000;
    })
    .await;
    let learned = || series_value(&b.url, "radixgate_sync_entries_learned_total");
    let learned0 = learned().await;
    let n = 20;
    // Every request is answered, whatever the queue holds.
    for r in send_at_once(&a.url, n) {
        r.await.expect("answered");
    }
    let dropped = series_value(
        &a.url,
        "radixgate_sync_dropped_total{reason=\"queue_full\"}",
    )
    .await;
    assert!(dropped >= 1.0, "nothing overflowed: {dropped}");
    // What was not dropped reaches B once the held batch goes.
    let went = learned0 + n as f64 - dropped;
    wait_until("B learned what A did not drop", || async {
        learned().await >= went
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(learned().await, went);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_propagates_and_b_avoids_what_a_loaded() {
    let nats = Nats::start(&[]);
    let slow = late_worker(4_000).await;
    let other = sim_worker(fast_worker()).await;
    // A knows only the slow worker; B knows both.
    let a = gateway_ready(replica_config(&[nats.url()], &[&slow.url]), 1).await;
    // B keeps a report for a minute: only A's next report, not its expiry,
    // can take the load away again.
    let b = replica_keeping_reports(&nats, &[&slow.url, &other.url], 60_000).await;
    wait_connected(&a.url).await;
    wait_connected(&b.url).await;
    let held = send_at_once(&a.url, 100);
    wait_until("A holds 100 requests", || async {
        total_load(&a.url).await == 100
    })
    .await;
    // B's own load is zero on both: only A's reports can make it avoid `slow`.
    for i in 0..10 {
        let (w, branch) = ask(&b.url, &prompt(&format!("fresh {i}"))).await;
        assert_eq!(
            w, other.url,
            "request {i} went to the worker A loaded ({branch})"
        );
        assert_eq!(branch, "imbalanced");
    }
    assert_eq!(peer_load(&b.url, &slow.url).await, 100);
    // The fall reaches B as a report, not by the expiry of the last one.
    fall_reaches(held, &b, &slow.url).await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fall_reaches_a_peer_that_routes_nothing() {
    let nats = Nats::start(&[]);
    let slow = late_worker(1_500).await;
    let a = gateway_ready(replica_config(&[nats.url()], &[&slow.url]), 1).await;
    // B keeps a report for a minute: only A's own report of the fall, not
    // the expiry of the last one, can take the load away. B routes
    // nothing, so nothing B sends wakes A.
    let b = replica_keeping_reports(&nats, &[&slow.url], 60_000).await;
    wait_connected(&a.url).await;
    wait_connected(&b.url).await;
    let held = send_at_once(&a.url, 5);
    // The rise comes with A's decisions.
    wait_until("B hears of A's 5", || async {
        peer_load(&b.url, &slow.url).await == 5
    })
    .await;
    // The fall has no decision to ride with: A's load lane reports it.
    fall_reaches(held, &b, &slow.url).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Waits for the `held` requests to end, then for `b` to count no peer's
/// load on `worker` any more.
async fn fall_reaches(
    held: Vec<tokio::task::JoinHandle<(String, String)>>,
    b: &Gateway,
    worker: &str,
) {
    for h in held {
        h.await.unwrap();
    }
    wait_until("B hears that A's load fell", || async {
        peer_load(&b.url, worker).await == 0
    })
    .await;
}

/// Replica B alone behind a fresh nats-server, with `load_expiry_ms` for
/// peers' reports, and a plain NATS client that plays its peers.
struct Listener {
    nats: Nats,
    worker: SimWorker,
    b: Gateway,
    raw: async_nats::Client,
}

impl Listener {
    async fn start(load_expiry_ms: u64) -> Self {
        let nats = Nats::start(&[]);
        let worker = sim_worker(fast_worker()).await;
        let b = replica_keeping_reports(&nats, &[&worker.url], load_expiry_ms).await;
        wait_ready(&b.url).await;
        wait_connected(&b.url).await;
        let raw = async_nats::connect(nats.url()).await.unwrap();
        Listener {
            nats,
            worker,
            b,
            raw,
        }
    }
}

/// Publishes `m` on the cluster `radixgate`'s subject `kind` and waits
/// until the server has it.
async fn publish_flushed(raw: &async_nats::Client, kind: &str, m: Vec<u8>) {
    raw.publish(format!("radixgate.sync.radixgate.{kind}"), m.into())
        .await
        .unwrap();
    raw.flush().await.unwrap();
}

/// A peer's insert batch carrying its load report (wire format 1, kind 1,
/// flag 2) and no entries, as hand-written bytes: what a replica sends
/// when a batch goes out while its load changed.
fn batch_with_load(instance: u64, seq: u8, worker: &str, in_flight: u8) -> Vec<u8> {
    batch_with_load_sent(instance, seq, worker, in_flight, wall_ms())
}

/// This machine's wall clock, in ms since the Unix epoch.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// [`batch_with_load`], sent at `sent_ms` by its sender's clock.
fn batch_with_load_sent(
    instance: u64,
    seq: u8,
    worker: &str,
    in_flight: u8,
    mut sent_ms: u64,
) -> Vec<u8> {
    // seq, sent_ms (an older report is load gone by now); no strings,
    // window 0, first entry 0, no entries; the load report's number and
    // count.
    let mut body = vec![1];
    while sent_ms >= 0x80 {
        body.push(sent_ms as u8 | 0x80);
        sent_ms >>= 7;
    }
    body.push(sent_ms as u8);
    body.extend_from_slice(&[0, 0, 0, 0, seq, 1]);
    peer_message(1, 2, instance, &body, worker, in_flight)
}

/// A peer's message (wire format 1) of `kind` with `flags`, from replica
/// `peer` of cluster `radixgate`, process `instance`: `body`, then one
/// worker's load (`in_flight`, no prefill pending).
fn peer_message(
    kind: u8,
    flags: u8,
    instance: u64,
    body: &[u8],
    worker: &str,
    in_flight: u8,
) -> Vec<u8> {
    let mut m = vec![b'R', b'G', 1, kind, flags];
    m.extend_from_slice(b"\x09radixgate\x04peer");
    m.extend_from_slice(&instance.to_le_bytes());
    m.extend_from_slice(body);
    m.push(worker.len() as u8);
    m.extend_from_slice(worker.as_bytes());
    m.extend_from_slice(&[in_flight, 0]);
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_report_that_comes_with_an_insert_batch_counts() {
    let Listener {
        nats: _nats,
        worker,
        b,
        raw,
    } = Listener::start(60_000).await;
    // Publishes peers' batches, (instance, report number, in flight) each,
    // then waits for B to count `total` on the worker.
    let step = |batches: &'static [(u64, u8, u8)], total: u64| {
        let (raw, b, worker) = (raw.clone(), b.url.clone(), worker.url.clone());
        async move {
            for &(instance, seq, in_flight) in batches {
                let m = batch_with_load(instance, seq, &worker, in_flight);
                raw.publish("radixgate.sync.radixgate.inserts", m.into())
                    .await
                    .unwrap();
            }
            raw.flush().await.unwrap();
            wait_until(&format!("B counts {total} in flight"), || async {
                peer_load(&b, &worker).await == total
            })
            .await;
        }
    };
    step(&[(42, 5, 7)], 7).await;
    // Numbered with the peer's other reports: an older one that arrives
    // later (a batch outrun by a core report) changes nothing (7 + 10, not
    // 1 + 10, once another peer's report behind it in the stream is in).
    step(&[(42, 4, 1), (43, 1, 10)], 17).await;
    // A newer one replaces it.
    step(&[(42, 6, 2)], 12).await;
    assert_eq!(
        series_value(&b.url, "radixgate_sync_ignored_total{reason=\"malformed\"}").await,
        0.0
    );
    b.shutdown().await;
}

/// A peer's load report on its own (wire format 1, kind 2), as
/// hand-written bytes: one worker.
fn load_report(instance: u64, seq: u8, worker: &str, in_flight: u8) -> Vec<u8> {
    // seq, sent_ms, one worker.
    peer_message(2, 0, instance, &[seq, 0, 1], worker, in_flight)
}

/// [`load_report`], sent at `sent_ms` by its sender's clock.
fn load_report_sent(instance: u64, seq: u8, worker: &str, in_flight: u8, sent_ms: u64) -> Vec<u8> {
    let mut body = vec![seq];
    let mut v = sent_ms;
    while v >= 0x80 {
        body.push(v as u8 | 0x80);
        v >>= 7;
    }
    body.push(v as u8);
    body.push(1);
    peer_message(2, 0, instance, &body, worker, in_flight)
}

/// A peer whose wall clock is well behind this replica's (no NTP on its
/// node): the load reports on its batches count, judged by its own clock
/// as its lane's reports show it; until 2026-12-06 every one was dropped
/// as older than the expiry, uncounted, and balancing heard of its
/// requests only at its lane's next tick. A batch that is old by its
/// sender's clock is still not taken, and is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_clock_behind_has_its_batches_load_reports_counted() {
    let Listener {
        nats: _nats,
        worker,
        b,
        raw,
    } = Listener::start(2_000).await;
    let expired = || series_value(&b.url, "radixgate_sync_ignored_total{reason=\"expired\"}");
    const BEHIND: u64 = 30_000;
    // Its lane's report, read live: 30 s behind.
    let m = load_report_sent(61, 1, &worker.url, 1, wall_ms() - BEHIND);
    publish_flushed(&raw, "load", m).await;
    wait_until("B counts the peer's 1", || async {
        peer_load(&b.url, &worker.url).await == 1
    })
    .await;
    // A batch it sends now, by its clock.
    let m = batch_with_load_sent(61, 2, &worker.url, 5, wall_ms() - BEHIND);
    publish_flushed(&raw, "inserts", m).await;
    wait_until("B counts the skewed peer's batch's 5", || async {
        peer_load(&b.url, &worker.url).await == 5
    })
    .await;
    assert_eq!(expired().await, 0.0);
    // One a minute old by its own clock (sent again after a reconnect):
    // not taken, counted.
    let m = batch_with_load_sent(61, 3, &worker.url, 9, wall_ms() - BEHIND - 60_000);
    publish_flushed(&raw, "inserts", m).await;
    wait_until("the old batch's report counted expired", || async {
        expired().await == 1.0
    })
    .await;
    let load = peer_load(&b.url, &worker.url).await;
    assert!(load == 5 || load == 0, "an expired report counted: {load}");
    b.shutdown().await;
}

/// Messages stamped at times no clock reads (2^63 ms since the epoch and
/// later: a broken or forged sender; the wire allows any number) are read
/// like any other. The clock offsets overflowed: the load lane's thread
/// panicked (debug builds), reading no peer's report again and expiring
/// none that came with a batch, and so did the insert feed, applying no
/// peer's decision again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_at_times_no_clock_reads_leave_sync_reading() {
    let Listener {
        nats: _nats,
        worker,
        b,
        raw,
    } = Listener::start(60_000).await;
    let w = &worker.url;
    publish_flushed(&raw, "load", load_report_sent(61, 1, w, 0, i64::MAX as u64)).await;
    publish_flushed(&raw, "inserts", batch_with_load_sent(61, 2, w, 0, 1 << 63)).await;
    publish_flushed(&raw, "load", load_report_sent(61, 3, w, 0, 1 << 63)).await;
    publish_flushed(&raw, "load", load_report_sent(61, 4, w, 0, u64::MAX)).await;
    // The lane and the insert feed still read: another peer's report on
    // each counts.
    publish_flushed(&raw, "load", load_report_sent(62, 1, w, 4, wall_ms())).await;
    publish_flushed(
        &raw,
        "inserts",
        batch_with_load_sent(63, 1, w, 5, wall_ms()),
    )
    .await;
    wait_until("B counts the other peers' 4 and 5", || async {
        peer_load(&b.url, w).await == 9
    })
    .await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peers_load_report_expires() {
    let Listener {
        nats: _nats,
        worker,
        b,
        raw,
    } = Listener::start(400).await;
    // B routes nothing and its own load is zero: it reads this while
    // waiting on its socket, then keeps its lane ticking only for the
    // report it holds.
    publish_flushed(&raw, "load", load_report(77, 1, &worker.url, 9)).await;
    wait_until("B counts the peer's 9", || async {
        peer_load(&b.url, &worker.url).await == 9
    })
    .await;
    let heard = std::time::Instant::now();
    // The peer goes silent: its report stops counting after the expiry,
    // with no other message to wake B.
    wait_until("the silent peer's report expires", || async {
        peer_load(&b.url, &worker.url).await == 0
    })
    .await;
    assert!(
        heard.elapsed() >= Duration::from_millis(100),
        "{:?}",
        heard.elapsed()
    );
    // A report again: counted again (the lane went back to its socket).
    publish_flushed(&raw, "load", load_report(77, 2, &worker.url, 4)).await;
    wait_until("B counts the peer's 4", || async {
        peer_load(&b.url, &worker.url).await == 4
    })
    .await;
    b.shutdown().await;
}

/// A peer's load report (wire format 1, kind 2) from process `instance`,
/// numbered `seq`: `loads` as (worker URL, in flight), the list `times`
/// over.
fn load_report_of(instance: u64, seq: u64, loads: &[(&str, u64)], times: usize) -> Vec<u8> {
    let var = |m: &mut Vec<u8>, mut v: u64| {
        while v >= 0x80 {
            m.push(v as u8 | 0x80);
            v >>= 7;
        }
        m.push(v as u8);
    };
    let mut m = b"RG\x01\x02\x00\x09radixgate\x04peer".to_vec();
    m.extend_from_slice(&instance.to_le_bytes());
    var(&mut m, seq);
    var(&mut m, 0);
    var(&mut m, (loads.len() * times) as u64);
    for _ in 0..times {
        for &(url, in_flight) in loads {
            var(&mut m, url.len() as u64);
            m.extend_from_slice(url.as_bytes());
            var(&mut m, in_flight);
            var(&mut m, 0);
        }
    }
    m
}

/// Reports that name workers no replica has (a broken or forged sender,
/// a whole message of them each, from many processes) are counted and not
/// kept: kept, every report taken summed them all again, and the load
/// lane fell minutes behind the peers' real reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_reports_naming_workers_no_replica_has_are_counted_and_not_kept() {
    let Listener {
        nats: _nats,
        worker,
        b,
        raw,
    } = Listener::start(300).await;
    let unknown = load_report_of(0, 1, &[("http://x", 1)], 60_000);
    for i in 0..40 {
        let mut m = unknown.clone();
        // The instance, after the magic, version, kind, flags and names.
        m[20..28].copy_from_slice(&(1000 + i as u64).to_le_bytes());
        raw.publish("radixgate.sync.radixgate.load", m.into())
            .await
            .unwrap();
    }
    // A peer that names the worker twice in one report: counted once, as
    // the sum.
    let twice = load_report_of(77, 1, &[(&worker.url, 4), (&worker.url, 5)], 1);
    publish_flushed(&raw, "load", twice).await;
    wait_until("B counts the peer's 9", || async {
        peer_load(&b.url, &worker.url).await == 9
    })
    .await;
    wait_until("the unknown workers counted", || async {
        series_value(
            &b.url,
            "radixgate_sync_ignored_total{reason=\"unknown_worker\"}",
        )
        .await
            >= 40.0
    })
    .await;
    b.shutdown().await;
}

/// The load the other replicas reported on a worker, as `/get_loads` shows it.
async fn peer_load(gateway: &str, worker: &str) -> u64 {
    worker_loads(gateway, worker).await["peer_load"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_token_teaches_every_replicas_cost_model() {
    let nats = Nats::start(&[]);
    let worker = sim_worker(fast_worker()).await;
    let a = gateway_ready(replica_config(&[nats.url()], &[&worker.url]), 1).await;
    let b = gateway_ready(replica_config(&[nats.url()], &[&worker.url]), 1).await;
    wait_connected(&a.url).await;
    wait_connected(&b.url).await;
    assert_eq!(first_tokens_learned(&b.url, &worker.url).await, 0);
    for i in 0..5 {
        let r = post_chat(&a.url, &chat(&prompt(&format!("streamed {i}")), true)).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    // A's fit learned from its 5 streamed first tokens; B routed nothing,
    // and its fit for the same worker learns them through sync.
    assert_eq!(first_tokens_learned(&a.url, &worker.url).await, 5);
    wait_until("B's fit learns A's first tokens", || async {
        first_tokens_learned(&b.url, &worker.url).await == 5
    })
    .await;
    assert_eq!(
        series_value(&b.url, "radixgate_sync_first_tokens_learned_total").await,
        5.0
    );
    // A learns nothing back from its own.
    assert_eq!(first_tokens_learned(&a.url, &worker.url).await, 5);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_token_rides_with_the_next_decision() {
    let nats = Nats::start(&[]);
    // First tokens come 50 ms after each request goes out, well after its
    // decision's batch (`batch_ms` 5 here).
    let worker = late_worker(50).await;
    // A first token with no decision after it goes with the load lane's
    // next report, at most a load period later: a long one here, so that
    // on a slow test machine it cannot go before the next decision does.
    let mut a_config = replica_config(&[nats.url()], &[&worker.url]);
    a_config.sync.load_period_ms = 2_000;
    a_config.sync.load_expiry_ms = 6_000;
    let a = gateway_ready(a_config, 1).await;
    let b = gateway_ready(replica_config(&[nats.url()], &[&worker.url]), 1).await;
    wait_connected(&a.url).await;
    wait_connected(&b.url).await;
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let mut batches = raw
        .subscribe("radixgate.sync.radixgate.inserts")
        .await
        .unwrap();
    raw.flush().await.unwrap();
    for i in 0..5 {
        let r = post_chat(&a.url, &chat(&prompt(&format!("riding {i}")), true)).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    wait_until("B's fit learns A's 5 first tokens", || async {
        first_tokens_learned(&b.url, &worker.url).await == 5
    })
    .await;
    // Five decisions, each in a batch of its own that also carries the
    // request before's first token; the last first token with a load
    // report, not in a batch (these prefills are too short for an early
    // one). One batch per first token would make ten.
    let mut seen = 0;
    while let Ok(Some(_)) = tokio::time::timeout(
        Duration::from_millis(300),
        futures::StreamExt::next(&mut batches),
    )
    .await
    {
        seen += 1;
    }
    assert_eq!(seen, 5, "insert batches A sent");
    a.shutdown().await;
    b.shutdown().await;
}

/// A first token means its request's prefill is done: after a long
/// prefill the load lane reports it (and the lower pending prefill) at
/// once, not at its next tick on the wall-clock grid, which a long period
/// here puts seconds away. After a short one it waits for the tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prefills_first_token_goes_out_before_the_lanes_next_tick() {
    let nats = Nats::start(&[]);
    let worker = late_worker(200).await;
    let mut a_config = replica_config(&[nats.url()], &[&worker.url]);
    a_config.sync.load_period_ms = 4_000;
    a_config.sync.load_expiry_ms = 12_000;
    let a = gateway_ready(a_config, 1).await;
    wait_connected(&a.url).await;
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let mut reports = raw
        .subscribe("radixgate.sync.radixgate.load")
        .await
        .unwrap();
    raw.flush().await.unwrap();
    // Just after a multiple of the period (the grid every replica ticks
    // on): the next tick is 3.6 s or more away.
    let into_period = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 4_000
    };
    wait_until("the start of a period", || async {
        (100..400).contains(&into_period())
    })
    .await;
    let short = prompt("short");
    let long = "please compare every figure of the attached annual report. ".repeat(200);
    assert!(short.len() < 8 * 1024 && long.len() > 10 * 1024);
    let ask_stream = |text: String| {
        let url = a.url.clone();
        tokio::spawn(async move {
            let r = post_chat(&url, &chat(&text, true)).await;
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
        })
    };
    // A short prefill: its first token (after 200 ms) waits for the tick.
    let asked = ask_stream(short);
    assert!(
        !first_token_reported(&mut reports, Duration::from_millis(1_000)).await,
        "a short prefill's first token went out before the tick"
    );
    asked.await.unwrap();
    // A long one: at once, more than two seconds before the tick.
    let sent = std::time::Instant::now();
    let asked = ask_stream(long);
    assert!(
        first_token_reported(&mut reports, Duration::from_millis(1_500)).await,
        "a long prefill's first token waited for the lane's next tick"
    );
    assert!(sent.elapsed() >= Duration::from_millis(150));
    assert!(
        into_period() < 3_500,
        "{} ms into the period",
        into_period()
    );
    asked.await.unwrap();
    a.shutdown().await;
}

/// Whether a load report that carries a first token arrives `within`:
/// flag bit 0, the byte after magic, version and kind.
async fn first_token_reported(reports: &mut async_nats::Subscriber, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        while let Some(m) = futures::StreamExt::next(reports).await {
            if m.payload[4] & 1 == 1 {
                return;
            }
        }
        panic!("the subscription ended");
    })
    .await
    .is_ok()
}

/// First tokens the cost model has learned from for a worker, over its
/// models, as `/get_loads` shows it.
async fn first_tokens_learned(gateway: &str, worker: &str) -> u64 {
    worker_loads(gateway, worker).await["ttft_model"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["observations"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_replica_warms_up_before_it_is_ready() {
    let mut nats = Nats::start(&[]);
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let a = gateway_ready(replica_config(&[nats.url()], &urls), 3).await;
    wait_ready(&a.url).await;
    wait_connected(&a.url).await;
    let mut routed = Vec::new();
    for i in 0..8 {
        let text = prompt(&format!("history {i}"));
        routed.push((ask(&a.url, &text).await.0, text));
    }
    // Let A's last batch reach the stream, then take NATS away: the late
    // replica starts while it cannot replay anything.
    wait_until("A published its decisions", || async {
        series_value(&a.url, "radixgate_sync_ignored_total{reason=\"own\"}").await >= 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    nats.kill();
    let b = gateway(replica_config(&[nats.url()], &urls)).await;
    wait_for_healthy(&b.url, 3).await;
    assert_eq!(readiness(&b.url).await, 503, "warming up");
    nats.restart();
    wait_ready(&b.url).await;
    for (worker, text) in &routed {
        let (w, branch) = ask(&b.url, text).await;
        assert_eq!((&w, branch.as_str()), (worker, "cache_hit"), "{text}");
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A replica that became ready by its warm-up timeout (NATS away as it
/// started) replays the history once NATS is back, as history: its trees
/// learn the decisions, but the first tokens in it do not teach the cost
/// model, and `radixgate_sync_lag_seconds` is not set from batches
/// minutes old. Until 2026-12-06 whatever the feed read once the replica
/// was ready counted as live: the history's first tokens taught, and the
/// lag read the age of the oldest batch replayed last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_replayed_after_the_warmup_timeout_is_not_taken_as_live() {
    let mut nats = Nats::start(&[]);
    // First tokens come after their decision's batch; with a long load
    // period each rides with the next decision's batch, into the stream.
    let worker = late_worker(50).await;
    let mut a_config = replica_config(&[nats.url()], &[&worker.url]);
    a_config.sync.load_period_ms = 2_000;
    a_config.sync.load_expiry_ms = 6_000;
    let a = gateway_ready(a_config, 1).await;
    wait_ready(&a.url).await;
    wait_connected(&a.url).await;
    for i in 0..4 {
        let r = post_chat(&a.url, &chat(&prompt(&format!("history {i}")), true)).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    wait_until("A's four batches came back from the stream", || async {
        series_value(&a.url, "radixgate_sync_ignored_total{reason=\"own\"}").await >= 4.0
    })
    .await;
    nats.kill();
    let mut b_config = replica_config(&[nats.url()], &[&worker.url]);
    b_config.sync.warmup_timeout_secs = 1;
    let b = gateway_ready(b_config, 1).await;
    wait_ready(&b.url).await;
    nats.restart();
    wait_until("B replays A's four decisions", || async {
        series_value(&b.url, "radixgate_sync_entries_learned_total").await == 4.0
    })
    .await;
    assert_eq!(
        series_value(&b.url, "radixgate_sync_first_tokens_learned_total").await,
        0.0,
        "the history's first tokens taught B's cost model"
    );
    assert_eq!(
        series_value(&b.url, "radixgate_sync_lag_seconds").await,
        0.0,
        "a lag read from the history"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_replaying_before_its_workers_are_admitted_keeps_the_history() {
    // NATS stays up, so the late replica replays the stream at once. One
    // worker fails its health checks as it starts: the entries for it wait
    // until it is admitted, rather than being dropped as unknown.
    let nats = Nats::start(&[]);
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<String> = workers.iter().map(|w| w.url.clone()).collect();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let a = gateway_ready(replica_config(&[nats.url()], &urls), 3).await;
    wait_ready(&a.url).await;
    wait_connected(&a.url).await;
    let mut routed = Vec::new();
    for i in 0..12 {
        let text = prompt(&format!("before admission {i}"));
        routed.push((ask(&a.url, &text).await.0, text));
    }
    let late = urls[2];
    assert!(
        routed.iter().any(|(w, _)| w == late),
        "no decision for the third worker: {routed:?}"
    );
    wait_until("A published its decisions", || async {
        series_value(&a.url, "radixgate_sync_ignored_total{reason=\"own\"}").await >= 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The third worker fails its health checks (keeping its cache) while
    // B starts and replays.
    workers[2].set_faults(FaultConfig {
        unhealthy: true,
        ..FaultConfig::default()
    });
    let b = gateway(replica_config(&[nats.url()], &urls)).await;
    wait_for_healthy(&b.url, 2).await;
    wait_ready(&b.url).await;
    workers[2].set_faults(FaultConfig::default());
    wait_for_healthy(&b.url, 3).await;
    // Held entries are retried every 250 ms.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for (worker, text) in &routed {
        let (w, branch) = ask(&b.url, text).await;
        assert_eq!((&w, branch.as_str()), (worker, "cache_hit"), "{text}");
    }
    assert_eq!(
        series_value(
            &b.url,
            "radixgate_sync_ignored_total{reason=\"unknown_worker\"}"
        )
        .await,
        0.0
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A LoRA adapter loaded into a worker at run time is found by each
/// replica at its own next read of the worker's models
/// (`health.models_refresh_secs`, on each replica's own timer): a peer
/// that found it first routes to it, and its decisions reached a replica
/// whose worker did not list the adapter yet. They were dropped as
/// `unknown_model`, so the prefixes the cluster sent to the adapter were
/// lost there for good; they are held as an unknown worker's are, and
/// applied once the worker lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_decision_for_an_adapter_not_listed_here_yet_is_applied_once_it_is() {
    let nats = Nats::start(&[]);
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    // A has found the adapter on the first worker already (its models as
    // the operator lists them stand for a model refresh that came first);
    // B reads its workers' models every second.
    let mut ahead = replica_config(&[nats.url()], &urls);
    ahead.workers[0].models = vec![
        radixgate_sim::server::DEFAULT_MODEL.to_owned(),
        "sql-lora".to_owned(),
    ];
    ahead.workers[1].models = vec![radixgate_sim::server::DEFAULT_MODEL.to_owned()];
    let a = gateway_ready(ahead, 2).await;
    let mut behind = replica_config(&[nats.url()], &urls);
    behind.health.models_refresh_secs = 1;
    let b = gateway_ready(behind, 2).await;
    for gw in [&a.url, &b.url] {
        wait_ready(gw).await;
        wait_connected(gw).await;
    }
    assert!(!model_ids(&b.url).await.contains(&"sql-lora".to_owned()));

    let text = prompt("for the adapter");
    let mut lora = chat(&text, false);
    lora["model"] = serde_json::json!("sql-lora");
    let (by, decision) = served_by(post_chat(&a.url, &lora).await).await;
    assert_eq!(by, workers[0].url, "{decision}");
    // Entries are applied in order: once B learned the next one, it has
    // seen the adapter's.
    ask_and_wait(&a.url, &b.url, &prompt("for the base model")).await;
    let learned = series_value(&b.url, "radixgate_sync_entries_learned_total").await;

    let loaded = client()
        .post(format!("{}/v1/load_lora_adapter", workers[0].url))
        .json(&serde_json::json!({"lora_name": "sql-lora", "lora_path": "/adapters/sql"}))
        .send()
        .await
        .unwrap();
    assert_eq!(loaded.status(), 200);
    wait_until("B lists the adapter", || async {
        model_ids(&b.url).await.contains(&"sql-lora".to_owned())
    })
    .await;
    wait_until("B applied A's decision for the adapter", || async {
        series_value(&b.url, "radixgate_sync_entries_learned_total").await > learned
    })
    .await;
    let (by, decision) = served_by(post_chat(&b.url, &lora).await).await;
    assert_eq!(by, workers[0].url, "{decision}");
    assert!(decision.contains("branch=cache_hit"), "{decision}");
    assert_eq!(
        series_value(
            &b.url,
            "radixgate_sync_ignored_total{reason=\"unknown_model\"}"
        )
        .await,
        0.0
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A NATS server, one worker, and a JetStream handle on the server.
async fn nats_worker_and_jetstream() -> (Nats, SimWorker, JetStream) {
    let nats = Nats::start(&[]);
    let w = sim_worker(fast_worker()).await;
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    (nats, w, js)
}

/// The sync stream's config as the server holds it.
async fn stream_config(js: &JetStream) -> StreamConfig {
    let mut s = js.get_stream("RADIXGATE-radixgate").await.unwrap();
    s.info().await.unwrap().config.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_history_setting_reaches_the_stream_at_the_next_start() {
    let (nats, w, js) = nats_worker_and_jetstream().await;
    let limits = || async {
        let c = stream_config(&js).await;
        (c.max_age.as_secs(), c.max_bytes)
    };
    let with_history = |secs: u64, bytes: u64| {
        let mut c = replica_config(&[nats.url()], &[&w.url]);
        c.sync.history_secs = secs;
        c.sync.history_bytes = bytes;
        c
    };
    let a = gateway_ready(with_history(600, 64 << 20), 1).await;
    wait_ready(&a.url).await;
    assert_eq!(limits().await, (600, 64 << 20));
    a.shutdown().await;
    // Restarted with another setting, it finds the stream it made before.
    let a = gateway_ready(with_history(120, 8 << 20), 1).await;
    wait_ready(&a.url).await;
    assert_eq!(limits().await, (120, 8 << 20));
    a.shutdown().await;
    // Shorter than the duplicate window the server gave the stream when
    // it was made (two minutes): the server refuses a max age under it.
    let a = gateway_ready(with_history(60, 8 << 20), 1).await;
    wait_ready(&a.url).await;
    assert_eq!(limits().await, (60, 8 << 20));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_stream_is_made_as_configured_and_a_stream_found_otherwise_is_kept() {
    let (nats, w, js) = nats_worker_and_jetstream().await;
    let storage = || async { stream_config(&js).await.storage };
    let kept = |kind: StreamStorage| {
        let mut c = replica_config(&[nats.url()], &[&w.url]);
        c.sync.stream_storage = kind;
        c
    };
    let a = gateway_ready(kept(StreamStorage::Memory), 1).await;
    wait_ready(&a.url).await;
    assert_eq!(storage().await, StorageType::Memory);
    let text = prompt("kept in memory");
    ask(&a.url, &text).await;
    wait_until("A's batch is in the stream", || async {
        series_value(&a.url, "radixgate_sync_ignored_total{reason=\"own\"}").await >= 1.0
    })
    .await;
    // A replica configured for a file finds the memory stream, uses it
    // as it is, and warms up from it.
    let b = gateway_ready(kept(StreamStorage::File), 1).await;
    wait_ready(&b.url).await;
    assert_eq!(storage().await, StorageType::Memory);
    let (worker, branch) = ask(&b.url, &text).await;
    assert_eq!(
        (worker.as_str(), branch.as_str()),
        (w.url.as_str(), "cache_hit")
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A stream found that refuses what comes once it is full (made by an
/// operator's or another tool's config with `discard: new`) is given the
/// replicas' policy, oldest dropped first: otherwise every batch past its
/// limit is refused by the server, with no answer to say so (batches are
/// published without asking for one), and the peers stop learning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_found_refusing_new_batches_when_full_is_made_to_drop_old_ones() {
    let nats = Nats::start(&[]);
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    js.create_stream(StreamConfig {
        name: "RADIXGATE-radixgate".into(),
        subjects: vec!["radixgate.sync.radixgate.inserts".into()],
        max_messages: 3,
        discard: DiscardPolicy::New,
        ..Default::default()
    })
    .await
    .unwrap();
    let (_workers, a, b) = two_replicas(&nats).await;
    // Past the stream's three messages, each still reaches B.
    assert_propagates(&a.url, &b.url, "past a full stream", 6).await;
    assert_eq!(stream_config(&js).await.discard, DiscardPolicy::Old);
    a.shutdown().await;
    b.shutdown().await;
}

/// A stream whose batches all aged out (a cluster idle for longer than
/// `history_secs`, overnight say) still counts its last sequence, but has
/// nothing to replay: a replica that starts then is ready at once, not
/// after its whole warm-up wait with a WARN that the warm start did not
/// finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starting_after_the_history_aged_out_is_ready_at_once() {
    let (nats, w, js) = nats_worker_and_jetstream().await;
    let aging = |warmup_timeout_secs| {
        let mut c = replica_config(&[nats.url()], &[&w.url]);
        c.sync.history_secs = 1;
        c.sync.warmup_timeout_secs = warmup_timeout_secs;
        c
    };
    let a = gateway_ready(aging(60), 1).await;
    wait_ready(&a.url).await;
    ask(&a.url, &prompt("aged out")).await;
    wait_until("A's batch is in the stream", || async {
        series_value(&a.url, "radixgate_sync_ignored_total{reason=\"own\"}").await >= 1.0
    })
    .await;
    a.shutdown().await;
    wait_until("the stream's batches aged out", || async {
        let mut s = js.get_stream("RADIXGATE-radixgate").await.unwrap();
        let state = s.info().await.unwrap().state.clone();
        state.messages == 0 && state.last_sequence > 0
    })
    .await;
    // A warm-up wait far longer than the test waits for readiness.
    let b = gateway_ready(aging(3600), 1).await;
    wait_ready(&b.url).await;
    b.shutdown().await;
}

/// A replica (re)started after the stream let go of the text a peer first
/// sent a hot prefix with (a rolling restart ten minutes into a run, or
/// after NATS lost its store) learns that peer's later decisions on the
/// prefix: each referred to the one before, back to that text, so none
/// resolved here, for as long as the peer kept sending the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_after_a_prefix_aged_out_learns_the_peers_repeats_of_it() {
    let (nats, w, js) = nats_worker_and_jetstream().await;
    let aging = || {
        let mut c = replica_config(&[nats.url()], &[&w.url]);
        c.sync.history_secs = 1;
        c
    };
    let system = "You are a careful assistant for the finance team. ".repeat(30);
    let turn = |tag: &str| format!("{system}{tag}");
    let a = gateway_ready(aging(), 1).await;
    wait_ready(&a.url).await;
    wait_connected(&a.url).await;
    ask(&a.url, &turn("first question")).await;
    wait_until("A's batch is in the stream", || async {
        series_value(&a.url, "radixgate_sync_ignored_total{reason=\"own\"}").await >= 1.0
    })
    .await;
    wait_until("the stream's batches aged out", || async {
        let mut s = js.get_stream("RADIXGATE-radixgate").await.unwrap();
        s.info().await.unwrap().state.messages == 0
    })
    .await;
    let b = gateway_ready(aging(), 1).await;
    wait_ready(&b.url).await;
    wait_connected(&b.url).await;
    for i in 0..3 {
        ask_and_wait(&a.url, &b.url, &turn(&format!("question {i}"))).await;
    }
    assert_eq!(
        series_value(
            &b.url,
            "radixgate_sync_ignored_total{reason=\"missing_base\"}"
        )
        .await,
        0.0
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_stops_waiting_after_the_warmup_timeout() {
    let mut nats = Nats::start(&[]);
    let w = sim_worker(fast_worker()).await;
    nats.kill();
    let mut c = replica_config(&[nats.url()], &[&w.url]);
    c.sync.warmup_timeout_secs = 1;
    let b = gateway(c).await;
    wait_for_healthy(&b.url, 1).await;
    assert_eq!(readiness(&b.url).await, 503);
    wait_ready(&b.url).await;
    // And it routes on local state with NATS down.
    ask(&b.url, &prompt("no nats")).await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_killed_mid_run_fails_no_request_and_sync_recovers() {
    let mut nats = Nats::start(&[]);
    let (_workers, a, b) = two_replicas(&nats).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for (k, gw) in [a.url.clone(), b.url.clone()].into_iter().enumerate() {
        let (stop, sent) = (stop.clone(), sent.clone());
        load.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                // `ask` asserts a 200.
                ask(&gw, &prompt(&format!("steady {k} {i}"))).await;
                sent.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    wait_until("steady traffic", || async {
        sent.load(Ordering::Relaxed) > 20
    })
    .await;
    // Both connections: the decisions' and the load lane's.
    let lane = "radixgate_sync_load_lane_connected";
    wait_until("A's load lane connected", || async {
        series_value(&a.url, lane).await == 1.0
    })
    .await;
    nats.kill();
    wait_until("A sees NATS gone", || async {
        series_value(&a.url, "radixgate_sync_connected").await == 0.0
            && series_value(&a.url, lane).await == 0.0
    })
    .await;
    let before = sent.load(Ordering::Relaxed);
    wait_until("traffic goes on without NATS", || async {
        sent.load(Ordering::Relaxed) > before + 20
    })
    .await;
    nats.restart();
    wait_connected(&a.url).await;
    wait_connected(&b.url).await;
    wait_until("A's load lane reconnected", || async {
        series_value(&a.url, lane).await == 1.0
    })
    .await;
    // Traffic went on through the restart without a failed request.
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.expect("no request failed");
    }
    // B's insert feed comes back (a new stream consumer, replaying what it
    // missed) after its load subscription: wait for a decision of A made
    // after all that traffic to reach B's tree, then check strictly.
    let gate = prompt("after restart, first");
    let (at_a, _) = ask(&a.url, &gate).await;
    wait_until("B's insert feed resumed", || async {
        ask(&b.url, &gate).await == (at_a.clone(), "cache_hit".to_owned())
    })
    .await;
    assert_propagates(&a.url, &b.url, "after restart", 3).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// NATS restarted under a running replica (`radixgate serve`, its log
/// read): while it is away the insert feed waits for the connection. Until
/// 2026-12-06 it asked JetStream for the stream meanwhile, each request
/// ran into the 5 s limit, and WARNs said the stream did not answer, then
/// blamed this user's JetStream permissions ("may not use the JetStream
/// API") and said live sync went on over core NATS, when there was no
/// NATS at all: every outage of 15 s or more sent an operator to check
/// permissions. Once NATS is back the stream is read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_away_is_not_reported_as_a_jetstream_permission() {
    let mut nats = Nats::start(&[]);
    let worker = sim_worker(fast_worker()).await;
    let nats_url = nats.url();
    let (mut serve, url) =
        common::process::Serve::start(&["--worker-urls", &worker.url, "--sync-url", &nats_url]);
    let on_stream = || async { series_value(&url, "radixgate_sync_stream").await == 1.0 };
    wait_until("the replica reads the stream", on_stream).await;
    nats.kill();
    // Longer than the check of the stream (every 5 s), the limit on its
    // answer (5 s) and on the next JetStream request's (5 s) together.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        serve.drain(Duration::from_millis(10));
    }
    let blamed: Vec<&String> = serve
        .seen
        .iter()
        .filter(|l| {
            ["JetStream API", "over core NATS", "stream does not answer"]
                .iter()
                .any(|blame| l.contains(blame))
        })
        .collect();
    assert!(blamed.is_empty(), "NATS away, logged as:\n{blamed:#?}");
    assert_eq!(series_value(&url, "radixgate_sync_stream").await, 0.0);
    assert!(
        serve
            .seen
            .iter()
            .any(|l| l.contains("disconnected from NATS")),
        "the outage itself is logged:\n{}",
        serve.seen.join("\n")
    );
    nats.restart();
    wait_until("connected again", || async {
        series_value(&url, "radixgate_sync_connected").await == 1.0
    })
    .await;
    wait_until("the replica reads the stream again", on_stream).await;
    assert!(serve.terminate(), "radixgate serve exited with an error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_replica_routes_alone_and_catches_up_after() {
    let nats = Nats::start(&[]);
    // A reaches NATS through the cable that will be cut; B directly.
    let (cut, _workers, a, b) = two_replicas_a_through_a_proxy(&nats).await;
    assert_propagates(&b.url, &a.url, "before the partition", 2).await;

    cut.freeze();
    let learned = || series_value(&a.url, "radixgate_sync_entries_learned_total");
    let learned0 = learned().await;
    // B goes on routing, and its decisions go into the stream; A hears
    // none of them.
    let mut routed_by_b = Vec::new();
    for i in 0..3 {
        let text = prompt(&format!("during the partition {i}"));
        let (worker, _) = ask(&b.url, &text).await;
        routed_by_b.push((text, worker));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        learned().await,
        learned0,
        "the partition let B's decisions through"
    );
    // A routes on its own meanwhile: every request answered.
    for i in 0..10 {
        ask(&a.url, &prompt(&format!("A alone {i}"))).await;
    }

    // The partition ends after the connections it froze were given up.
    cut.heal();
    wait_until(
        "A caught up on what B routed during the partition",
        || async { learned().await >= learned0 + routed_by_b.len() as f64 },
    )
    .await;
    for (text, worker) in &routed_by_b {
        let (w, branch) = ask(&a.url, text).await;
        assert_eq!(
            (w.as_str(), branch.as_str()),
            (worker.as_str(), "cache_hit"),
            "A did not catch up on {text:.30}"
        );
    }
    // And the link works both ways again.
    wait_connected(&a.url).await;
    assert_propagates(&a.url, &b.url, "after the partition", 2).await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_link_to_nats_shows_as_lag_and_loses_nothing() {
    let nats = Nats::start(&[]);
    let (slow, _workers, a, b) = two_replicas_a_through_a_proxy(&nats).await;
    assert_propagates(&a.url, &b.url, "before the link slowed", 1).await;
    let learned0 = series_value(&b.url, "radixgate_sync_entries_learned_total").await;

    // Every chunk between A and NATS waits 400 ms, each way.
    slow.slow(Duration::from_millis(400));
    let routed_by_a = route_prompts(&a.url, "over a slow link", 4).await;
    assert_learned_once_each(&b.url, learned0, &routed_by_a).await;
    // B's lag gauge tells the slow link (publish to apply, latest batch).
    let lag = series_value(&b.url, "radixgate_sync_lag_seconds").await;
    assert!(lag >= 0.35, "lag {lag} s over a link 400 ms slow");
    // Slow is not down: A's client kept its connection (its pings are
    // answered in 0.8 s), and nothing was dropped or sent again.
    assert_eq!(series_value(&a.url, "radixgate_sync_connected").await, 1.0);
    assert_eq!(
        series_sum(&a.url, "radixgate_sync_dropped_total").await,
        0.0
    );
    assert_eq!(
        series_value(&a.url, "radixgate_sync_batches_resent_total").await,
        0.0
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// Routes `n` prompts tagged `tag` through `gateway`: each text and the
/// worker it went to.
async fn route_prompts(gateway: &str, tag: &str, n: usize) -> Vec<(String, String)> {
    let mut routed = Vec::new();
    for i in 0..n {
        let text = prompt(&format!("{tag} {i}"));
        let (worker, _) = ask(gateway, &text).await;
        routed.push((text, worker));
    }
    routed
}

/// Waits until `to` has learned one entry for each of `routed` since it
/// had learned `learned0`, then checks that it learned each once and
/// routes each text to the same worker as a cache hit.
async fn assert_learned_once_each(to: &str, learned0: f64, routed: &[(String, String)]) {
    let learned = || series_value(to, "radixgate_sync_entries_learned_total");
    let want = learned0 + routed.len() as f64;
    wait_until("the peer learned every decision", || async {
        learned().await >= want
    })
    .await;
    for (text, worker) in routed {
        let (w, branch) = ask(to, text).await;
        assert_eq!(
            (w.as_str(), branch.as_str()),
            (worker.as_str(), "cache_hit"),
            "never learned {text:.40}"
        );
    }
    // Each once: what had reached the stream is not applied again.
    assert_eq!(learned().await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_cut_off_replica_routed_reaches_its_peers_after() {
    let nats = Nats::start(&[]);
    let (cut, _workers, a, b) = two_replicas_a_through_a_proxy(&nats).await;
    assert_propagates(&a.url, &b.url, "before the partition", 1).await;
    let learned0 = series_value(&b.url, "radixgate_sync_entries_learned_total").await;

    cut.freeze();
    // Into a connection that is dead before A's client notices (its pings
    // go unanswered for 10-15 s)...
    let mut routed_by_a = route_prompts(&a.url, "before A noticed", 3).await;
    // ...and once it has given the connection up.
    wait_until("A gave its connection up", || async {
        series_value(&a.url, "radixgate_sync_connected").await == 0.0
    })
    .await;
    routed_by_a.extend(route_prompts(&a.url, "while A knew it was cut off", 3).await);
    assert_eq!(
        series_value(&b.url, "radixgate_sync_entries_learned_total").await,
        learned0,
        "the partition let A's decisions through"
    );

    cut.heal();
    assert_learned_once_each(&b.url, learned0, &routed_by_a).await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_core_nats_what_a_replica_routed_while_disconnected_goes_at_the_reconnect() {
    // No stream for the routers' account: live sync over core NATS only.
    let (nats, dir) = nats_with_config("accounts-cut", NO_JETSTREAM_ACCOUNT);
    let cut = Partition::in_front_of(&nats).await;
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let mut through_the_cut = router_config(&nats, &dir, &urls);
    through_the_cut.sync.urls = vec![cut.url()];
    let a = gateway_ready(through_the_cut, 2).await;
    let b = gateway_ready(router_config(&nats, &dir, &urls), 2).await;
    for gw in [&a.url, &b.url] {
        wait_ready(gw).await;
        wait_connected(gw).await;
    }
    assert_propagates(&a.url, &b.url, "over core NATS", 1).await;
    assert_eq!(series_value(&a.url, "radixgate_sync_stream").await, 0.0);
    let learned0 = series_value(&b.url, "radixgate_sync_entries_learned_total").await;

    cut.freeze();
    wait_until("A gave its connection up", || async {
        series_value(&a.url, "radixgate_sync_connected").await == 0.0
    })
    .await;
    let routed_by_a = route_prompts(&a.url, "while A was disconnected", 3).await;
    cut.heal();
    assert_learned_once_each(&b.url, learned0, &routed_by_a).await;
    assert!(series_value(&a.url, "radixgate_sync_batches_resent_total").await >= 1.0);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_that_goes_quiet_is_given_up_at_its_pings_and_caught_up_after() {
    let nats = Nats::start(&[]);
    let (cut, _workers, a, b) = two_replicas_a_through_a_proxy(&nats).await;
    assert_propagates(&b.url, &a.url, "before the link went quiet", 1).await;
    let learned = || series_value(&a.url, "radixgate_sync_entries_learned_total");
    let learned0 = learned().await;
    // No FIN, no RST: only the client's pings (every 5 s, given up after
    // two unanswered) can tell A its connection is dead.
    cut.freeze();
    let (worker, _) = ask(&b.url, &prompt("while the link is quiet")).await;
    wait_until("A gave its connection up", || async {
        series_value(&a.url, "radixgate_sync_connected").await == 0.0
    })
    .await;
    assert_eq!(learned().await, learned0);
    // The link comes back (new connections pass; the old ones were given
    // up), and A catches up from the stream.
    cut.heal();
    wait_until("A caught up", || async { learned().await > learned0 }).await;
    assert_eq!(
        ask(&a.url, &prompt("while the link is quiet")).await,
        (worker, "cache_hit".to_owned())
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_back_after_nats_lost_its_store_replays_the_new_stream_whole() {
    let mut nats = Nats::start(&[]);
    let (cut, _workers, a, b) = two_replicas_a_through_a_proxy(&nats).await;
    // A's place in the stream moves past a few sequences.
    assert_propagates(&b.url, &a.url, "the old store", 3).await;

    // While A is cut off, NATS comes back with nothing: the stream is made
    // again, and B's decisions fill it past where A was.
    cut.freeze();
    nats.restart_empty();
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(raw);
    let last_sequence = || {
        let js = js.clone();
        async move {
            match js.get_stream("RADIXGATE-radixgate").await {
                Ok(mut s) => s.info().await.map_or(0, |i| i.state.last_sequence),
                Err(_) => 0,
            }
        }
    };
    wait_until("B made the stream again", || async {
        js.get_stream("RADIXGATE-radixgate").await.is_ok()
    })
    .await;
    let mut routed_by_b = Vec::new();
    for i in 0..12 {
        let text = prompt(&format!("the new store {i}"));
        let (worker, _) = ask(&b.url, &text).await;
        routed_by_b.push((text, worker));
        // One batch a decision, so the new stream's sequences pass A's.
        wait_until("B's decision in the new stream", || async {
            last_sequence().await > i
        })
        .await;
    }

    let learned = || series_value(&a.url, "radixgate_sync_entries_learned_total");
    let learned0 = learned().await;
    cut.heal();
    wait_until("A learned the new stream", || async {
        learned().await >= learned0 + routed_by_b.len() as f64
    })
    .await;
    for (text, worker) in &routed_by_b {
        let (w, branch) = ask(&a.url, text).await;
        assert_eq!(
            (w.as_str(), branch.as_str()),
            (worker.as_str(), "cache_hit"),
            "A missed {text:.20}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_jetstream_syncs_live() {
    // JetStream on the server, but not for the routers' account: the
    // stream cannot be made, and live sync still has to work.
    let (nats, dir) = nats_with_config("accounts", NO_JETSTREAM_ACCOUNT);
    let (_workers, a, b) = two_routers(&nats, &dir).await;
    for gw in [&a.url, &b.url] {
        wait_ready(gw).await;
    }
    assert_propagates(&a.url, &b.url, "no jetstream for the account", 2).await;
    a.shutdown().await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_refused_leaves_live_sync_working_until_it_is_made() {
    let nats = Nats::start(&[]);
    // An operator's stream already takes every subject of the routers, so
    // theirs cannot be made (overlapping subjects).
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(raw);
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "AUDIT".into(),
        subjects: vec!["radixgate.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    // B reaches NATS through a cable the test cuts later.
    let cut = Partition::in_front_of(&nats).await;
    let (_workers, a, b) = two_replicas_at(&nats.url(), &cut.url()).await;
    let stream = "radixgate_sync_stream";
    for gw in [&a.url, &b.url] {
        assert_eq!(series_value(gw, stream).await, 0.0);
    }
    assert_propagates(&a.url, &b.url, "beside another stream", 2).await;

    // The operator removes the other stream: the replicas make theirs and
    // read it, so a replica cut off catches up again.
    js.delete_stream("AUDIT").await.unwrap();
    for gw in [&a.url, &b.url] {
        wait_until("the insert feed reads the stream", || async {
            series_value(gw, stream).await == 1.0
        })
        .await;
    }
    let learned = || series_value(&b.url, "radixgate_sync_entries_learned_total");
    cut.freeze();
    let learned0 = learned().await;
    let mut routed_by_a = Vec::new();
    for i in 0..3 {
        let text = prompt(&format!("while B is cut off {i}"));
        routed_by_a.push((ask(&a.url, &text).await.0, text));
    }
    cut.heal();
    wait_until("B caught up from the stream", || async {
        learned().await >= learned0 + routed_by_a.len() as f64
    })
    .await;
    for (worker, text) in &routed_by_a {
        assert_eq!(
            ask(&b.url, text).await,
            (worker.clone(), "cache_hit".to_owned())
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_allowed_only_the_sync_subjects_syncs_live() {
    let (nats, dir) = nats_with_config(
        "permissions",
        "authorization: { users: [ { user: router, password: s3cret, permissions: { publish: \"radixgate.sync.>\", subscribe: [\"radixgate.sync.>\", \"_INBOX.>\"] } } ] }\n",
    );
    let (_workers, a, b) = two_routers(&nats, &dir).await;
    // The server answers the JetStream API with silence here, so live sync
    // starts once the stream's setup timed out (5 s): until
    // then A's decisions are lost to B. Probe until one gets through.
    until_decisions_get_through("B hears A's decisions", &a.url, &b.url).await;
    assert_propagates(&a.url, &b.url, "only the sync subjects", 2).await;
    assert_eq!(series_value(&b.url, "radixgate_sync_stream").await, 0.0);
    a.shutdown().await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

/// Users `full` (anything) and `router` (password `s3cret` both), the
/// latter allowed the sync subjects and, if `js`, the JetStream API.
fn full_and_router(js: bool) -> String {
    let publish = if js {
        "[\"radixgate.sync.>\", \"$JS.API.>\"]"
    } else {
        "\"radixgate.sync.>\""
    };
    format!(
        "authorization: {{ users: [ {{ user: full, password: s3cret }}, {{ user: router, password: s3cret, permissions: {{ publish: {publish}, subscribe: [\"radixgate.sync.>\", \"_INBOX.>\"] }} }} ] }}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_synced_live_before_the_stream_came_replays_the_history() {
    let (nats, dir) = nats_with_config("history", &full_and_router(false));
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    // A makes the stream and routes into it.
    let mut full = router_config(&nats, &dir, &urls);
    full.sync.auth.user = Some("full".into());
    let a = gateway_ready(full, 2).await;
    wait_ready(&a.url).await;
    let history = route_prompts(&a.url, "before B started", 3).await;
    // B may not use the JetStream API (its setup times out), so it syncs
    // live over core NATS and hears A's later decisions first.
    let b = gateway_ready(router_config(&nats, &dir, &urls), 2).await;
    until_decisions_get_through("B hears A live", &a.url, &b.url).await;
    assert_eq!(series_value(&b.url, "radixgate_sync_stream").await, 0.0);
    // Now it may: it reads the stream from its start, and learns what A
    // routed before it heard A live.
    // (JetStream is on from the command line; a reloaded config that does
    // not name its store turns it off.)
    let store = nats.dir.join("store");
    let conf = format!(
        "jetstream: {{ store_dir: {store:?} }}\n{}",
        full_and_router(true)
    );
    std::fs::write(dir.join("nats.conf"), conf).unwrap();
    nats.reload();
    wait_until("B reads the stream", || async {
        series_value(&b.url, "radixgate_sync_stream").await == 1.0
    })
    .await;
    wait_ready(&b.url).await;
    for (text, worker) in &history {
        let (w, branch) = ask(&b.url, text).await;
        assert_eq!(
            (w.as_str(), branch.as_str()),
            (worker.as_str(), "cache_hit"),
            "B never learned {text:.40}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permissions_docs_sync_md_names_are_enough_for_the_stream() {
    let (nats, dir) = nats_with_config(
        "permissions-enough",
        "authorization: { users: [ { user: router, password: s3cret, permissions: { publish: [\"radixgate.sync.>\", \"$JS.API.>\"], subscribe: [\"radixgate.sync.>\", \"_INBOX.>\"] } } ] }\n",
    );
    let w = sim_worker(fast_worker()).await;
    let c = router_config(&nats, &dir, &[&w.url]);
    let a = gateway_ready(c, 1).await;
    wait_ready(&a.url).await;
    assert_eq!(series_value(&a.url, "radixgate_sync_stream").await, 1.0);
    a.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_node_of_a_nats_cluster_fails_no_request_and_sync_goes_on() {
    // Two servers routed into one cluster, JetStream clustered over them.
    let routes = [sync_support::free_port(), sync_support::free_port()];
    let node = |i: usize| {
        let me = format!("nats://127.0.0.1:{}", routes[i]);
        let other = format!("nats://127.0.0.1:{}", routes[1 - i]);
        let name = format!("n{i}");
        Nats::start(&[
            "--cluster_name",
            "routers",
            "--server_name",
            &name,
            "--cluster",
            &me,
            "--routes",
            &other,
        ])
    };
    let mut n0 = node(0);
    let n1 = node(1);
    let urls = [n0.url(), n1.url()];
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let worker_urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let a = gateway_ready(replica_config(&urls, &worker_urls), 2).await;
    let b = gateway_ready(replica_config(&urls, &worker_urls), 2).await;
    for gw in [&a.url, &b.url] {
        wait_connected(gw).await;
    }
    until_decisions_get_through("sync over the cluster", &a.url, &b.url).await;

    // One node goes: the clients move to the other, and with half the
    // cluster gone JetStream has no quorum; live sync goes on regardless.
    n0.kill();
    until_decisions_get_through("sync after losing a node", &a.url, &b.url).await;
    assert_propagates(&a.url, &b.url, "after losing a node", 2).await;
    for g in [a, b] {
        g.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_foreign_messages_are_ignored_and_counted() {
    let nats = Nats::start(&[]);
    let (_workers, a, b) = two_replicas(&nats).await;
    let raw = async_nats::connect(nats.url()).await.unwrap();
    let inserts = "radixgate.sync.radixgate.inserts";
    let load = "radixgate.sync.radixgate.load";
    raw.publish(inserts, "garbage".into()).await.unwrap();
    raw.publish(load, vec![0xff; 4096].into()).await.unwrap();
    raw.publish(inserts, b"RG\x07\x01\x00".to_vec().into())
        .await
        .unwrap();
    raw.publish(inserts, b"RG\x01\x01".to_vec().into())
        .await
        .unwrap();
    raw.flush().await.unwrap();
    wait_until("malformed counted", || async {
        series_value(&b.url, "radixgate_sync_ignored_total{reason=\"malformed\"}").await >= 3.0
            && series_value(&b.url, "radixgate_sync_ignored_total{reason=\"version\"}").await >= 1.0
    })
    .await;
    // A well-formed load report naming another cluster, on our subject.
    let mut foreign = b"RG\x01\x02\x00\x05other\x01x".to_vec();
    foreign.extend_from_slice(&7u64.to_le_bytes());
    foreign.extend_from_slice(&[1, 0, 0]);
    raw.publish(load, foreign.into()).await.unwrap();
    raw.flush().await.unwrap();
    wait_until("foreign cluster counted", || async {
        series_value(
            &b.url,
            "radixgate_sync_ignored_total{reason=\"foreign_cluster\"}",
        )
        .await
            >= 1.0
    })
    .await;
    // Both still route and sync.
    assert_propagates(&a.url, &b.url, "after garbage", 2).await;
    assert_eq!(readiness(&b.url).await, 200);
    a.shutdown().await;
    b.shutdown().await;
}

/// Two replicas of two workers from `config`, each connected to NATS.
async fn two_connected(config: impl Fn() -> Config) -> (Gateway, Gateway) {
    let a = gateway_ready(config(), 2).await;
    let b = gateway_ready(config(), 2).await;
    wait_connected(&a.url).await;
    wait_connected(&b.url).await;
    (a, b)
}

/// `gateway`, whose NATS settings (`why`) the server refuses, has not
/// connected half a second on, and still serves on its local state.
async fn assert_kept_out(gateway: &Gateway, why: &str) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        series_value(&gateway.url, "radixgate_sync_connected").await,
        0.0,
        "a replica with {why} connected"
    );
    ask(&gateway.url, &prompt(why)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_password_works_and_a_wrong_password_never_connects() {
    let nats = Nats::start(&["--user", "router", "--pass", "s3cret"]);
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let dir = temp_dir("creds");
    std::fs::write(dir.join("password"), "s3cret\n").unwrap();
    let with = |password: &str| {
        let mut c = replica_config(&[nats.url()], &urls);
        c.sync.auth.user = Some("router".into());
        c.sync.auth.password_file = Some(dir.join(password));
        c
    };
    std::fs::write(dir.join("wrong"), "guess\n").unwrap();
    let (a, b) = two_connected(|| with("password")).await;
    let c = gateway_ready(with("wrong"), 2).await;
    assert_propagates(&a.url, &b.url, "authenticated", 2).await;
    assert_kept_out(&c, "a wrong password").await;
    for g in [a, b, c] {
        g.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A replica refused its sign-in says so once per connection, naming the
/// setting to check, not once per attempt: until 2026-12-06 each of its
/// two connections logged a WARN every 2 s, for ever, with nothing to say
/// the credentials were what to look at. Then NATS away for a while and
/// back: one WARN per connection, and the reconnect says how many
/// attempts failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_sign_in_is_logged_once_naming_the_setting_to_check() {
    let mut nats = Nats::start(&["--user", "router", "--pass", "s3cret"]);
    let worker = sim_worker(fast_worker()).await;
    let nats_url = nats.url();
    // This build's lines, and the earlier builds' one per attempt.
    let ours = |l: &&String| {
        (l.contains("connect to NATS") || l.contains("NATS client error"))
            && !l.contains("async_nats")
    };
    let (mut wrong, _) = common::process::Serve::start(&[
        "--worker-urls",
        &worker.url,
        "--sync-url",
        &nats_url,
        "--sync-user",
        "router",
        "--sync-password",
        "guess",
    ]);
    // Several attempts of each connection (one every 2 s at most).
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        wrong.drain(Duration::from_millis(10));
    }
    let warned: Vec<&String> = wrong.seen.iter().filter(ours).collect();
    assert_eq!(warned.len(), 2, "one per connection:\n{warned:#?}");
    assert!(
        warned.iter().all(|l| l.contains("sync.auth")),
        "the setting to check is named:\n{warned:#?}"
    );
    assert!(wrong.terminate(), "radixgate serve exited with an error");
    let (mut serve, url) = common::process::Serve::start(&[
        "--worker-urls",
        &worker.url,
        "--sync-url",
        &nats_url,
        "--sync-user",
        "router",
        "--sync-password",
        "s3cret",
    ]);
    wait_until("connected", || async {
        series_value(&url, "radixgate_sync_connected").await == 1.0
    })
    .await;
    nats.kill();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        serve.drain(Duration::from_millis(10));
    }
    nats.restart();
    wait_until("connected again", || async {
        series_value(&url, "radixgate_sync_connected").await == 1.0
            && series_value(&url, "radixgate_sync_load_lane_connected").await == 1.0
    })
    .await;
    serve.drain(Duration::from_millis(200));
    let warned: Vec<&String> = serve.seen.iter().filter(ours).collect();
    assert_eq!(warned.len(), 2, "one per connection:\n{warned:#?}");
    assert!(
        warned.iter().all(|l| !l.contains("sync.auth")),
        "a server away is not blamed on the credentials:\n{warned:#?}"
    );
    let back: Vec<&String> = serve
        .seen
        .iter()
        .filter(|l| l.contains("connected to NATS") && l.contains("failed_attempts"))
        .filter(|l| !l.contains("failed_attempts=0"))
        .collect();
    assert_eq!(back.len(), 2, "each reconnect says so:\n{back:#?}");
    assert!(serve.terminate(), "radixgate serve exited with an error");
}

/// A user the server lets sign in but not publish on the sync subjects (a
/// permission missed in the server's config): each message this replica
/// publishes is refused by the server with an error on the connection,
/// and its peers receive nothing. Each refusal was an ERROR line, a dozen
/// a second under load, and every refused message counted as sent. They
/// are counted as dropped (`refused`), and logged once, naming the
/// subject and the permission to grant, then once a minute with a count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_the_server_refuses_are_counted_and_logged_once() {
    let (nats, dir) = nats_with_config(
        "publish-refused",
        "authorization: { users: [ { user: router, password: s3cret, permissions: { publish: [\"$JS.API.>\"], subscribe: [\"radixgate.sync.>\", \"_INBOX.>\"] } } ] }\n",
    );
    let worker = sim_worker(fast_worker()).await;
    let nats_url = nats.url();
    let (mut serve, url) = common::process::Serve::start(&[
        "--worker-urls",
        &worker.url,
        "--sync-url",
        &nats_url,
        "--sync-user",
        "router",
        "--sync-password",
        "s3cret",
    ]);
    wait_ready(&url).await;
    for i in 0..20 {
        let r = post_chat(&url, &chat(&format!("refused {i}"), false)).await;
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(100)).await;
        serve.drain(Duration::from_millis(1));
    }
    let refused = "radixgate_sync_dropped_total{reason=\"refused\"}";
    wait_until("refusals counted", || async {
        series_value(&url, refused).await >= 20.0
    })
    .await;
    serve.drain(Duration::from_millis(200));
    let logged: Vec<&String> = serve
        .seen
        .iter()
        .filter(|l| l.to_ascii_lowercase().contains("permissions violation"))
        .collect();
    assert!(
        (1..=2).contains(&logged.len()),
        "once per connection at most:\n{logged:#?}"
    );
    assert!(
        logged
            .iter()
            .all(|l| l.contains("publish") && l.contains("radixgate.sync.>")),
        "the permission to grant is named:\n{logged:#?}"
    );
    assert!(serve.terminate(), "radixgate serve exited with an error");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_and_an_nkey_work_and_another_users_seed_never_connects() {
    let dir = temp_dir("token-nkey");
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();

    let nats = Nats::start(&["--auth", "t0ken"]);
    std::fs::write(dir.join("token"), "t0ken\n").unwrap();
    let with_token = || {
        let mut c = replica_config(&[nats.url()], &urls);
        c.sync.auth.token_file = Some(dir.join("token"));
        c
    };
    let (a, b) = two_connected(with_token).await;
    assert_propagates(&a.url, &b.url, "with a token", 1).await;
    for g in [a, b] {
        g.shutdown().await;
    }
    drop(nats);

    let router = nkeys::KeyPair::new_user();
    let stranger = nkeys::KeyPair::new_user();
    std::fs::write(dir.join("router.nk"), router.seed().unwrap()).unwrap();
    std::fs::write(dir.join("stranger.nk"), stranger.seed().unwrap()).unwrap();
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization: {{ users: [ {{ nkey: {} }} ] }}\n",
            router.public_key()
        ),
    )
    .unwrap();
    let nats = Nats::start(&["-c", conf.to_str().unwrap()]);
    let with_seed = |file: &str| {
        let mut c = replica_config(&[nats.url()], &urls);
        c.sync.auth.nkey_seed_file = Some(dir.join(file));
        c
    };
    let (a, b) = two_connected(|| with_seed("router.nk")).await;
    let c = gateway_ready(with_seed("stranger.nk"), 2).await;
    assert_propagates(&a.url, &b.url, "with an nkey", 1).await;
    assert_kept_out(&c, "another user's seed").await;
    for g in [a, b, c] {
        g.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creds_file_signs_in_to_a_server_in_operator_mode() {
    let dir = temp_dir("operator");
    let (conf, creds) = sync_support::operator_mode();
    std::fs::write(dir.join("nats.conf"), conf).unwrap();
    std::fs::write(dir.join("router.creds"), creds).unwrap();
    let nats = Nats::start(&["-c", dir.join("nats.conf").to_str().unwrap()]);
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let with_creds = || {
        let mut c = replica_config(&[nats.url()], &urls);
        c.sync.auth.creds_file = Some(dir.join("router.creds"));
        c
    };
    let (a, b) = two_connected(with_creds).await;
    for gw in [&a.url, &b.url] {
        wait_ready(gw).await;
        // A server in operator mode may refuse the first try at the stream
        // (JetStream not yet on for the account, seen once in CI): the
        // replica syncs over core NATS meanwhile and asks again (1 s on).
        wait_until("the stream made", || async {
            series_value(gw, "radixgate_sync_stream").await == 1.0
        })
        .await;
    }
    assert_propagates(&a.url, &b.url, "signed in with a creds file", 2).await;
    // Without credentials the server lets nobody in.
    let anonymous = gateway_ready(replica_config(&[nats.url()], &urls), 2).await;
    assert_kept_out(&anonymous, "no credentials").await;
    for g in [a, b, anonymous] {
        g.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_works() {
    let certs = temp_dir("tls");
    let (ca, cert, key) = tls_files(&certs);
    let nats = Nats::start(&[
        "--tls",
        "--tlscert",
        cert.to_str().unwrap(),
        "--tlskey",
        key.to_str().unwrap(),
    ]);
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let tls_url = format!("tls://127.0.0.1:{}", nats.port);
    let with_ca = |ca: Option<&std::path::Path>| {
        let mut c = replica_config(std::slice::from_ref(&tls_url), &urls);
        c.sync.tls.required = true;
        c.sync.tls.ca_file = ca.map(|p| p.to_path_buf());
        c
    };
    let (a, b) = two_connected(|| with_ca(Some(&ca))).await;
    let untrusting = gateway_ready(with_ca(None), 2).await;
    assert_propagates(&a.url, &b.url, "over tls", 2).await;
    assert_kept_out(&untrusting, "a server certificate from an unknown CA").await;
    for g in [a, b, untrusting] {
        g.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(certs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_verifies_clients_takes_a_replicas_certificate() {
    let certs = temp_dir("mtls");
    let (ca, cert, key) = tls_files(&certs);
    let (client, client_key) = client_cert(&certs);
    let nats = Nats::start(&[
        "--tls",
        "--tlscert",
        cert.to_str().unwrap(),
        "--tlskey",
        key.to_str().unwrap(),
        "--tlsverify",
        "--tlscacert",
        ca.to_str().unwrap(),
    ]);
    let workers = [
        sim_worker(fast_worker()).await,
        sim_worker(fast_worker()).await,
    ];
    let urls: Vec<&str> = workers.iter().map(|w| w.url.as_str()).collect();
    let tls_url = format!("tls://127.0.0.1:{}", nats.port);
    let with_cert = |cert: bool| {
        let mut c = replica_config(std::slice::from_ref(&tls_url), &urls);
        c.sync.tls.required = true;
        c.sync.tls.ca_file = Some(ca.clone());
        if cert {
            c.sync.tls.cert_file = Some(client.clone());
            c.sync.tls.key_file = Some(client_key.clone());
        }
        c
    };
    let (a, b) = two_connected(|| with_cert(true)).await;
    let anonymous = gateway_ready(with_cert(false), 2).await;
    assert_propagates(&a.url, &b.url, "with client certificates", 2).await;
    assert_kept_out(&anonymous, "no client certificate").await;
    for g in [a, b, anonymous] {
        g.shutdown().await;
    }
    let _ = std::fs::remove_dir_all(certs);
}

/// A NATS server configured with a small `max_payload` (8 KiB here; NATS
/// refuses any larger payload): a text over it goes as its head, and
/// decisions that go out together are split into batches under it, so no
/// decision is lost with a long neighbour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_fit_the_servers_max_payload() {
    let conf_dir = temp_dir("conf");
    let conf = conf_dir.join("nats.conf");
    std::fs::write(&conf, "max_payload: 8192\n").unwrap();
    let nats = Nats::start(&["-c", conf.to_str().unwrap()]);
    let (_workers, a, b) = two_replicas(&nats).await;

    // 22 KB of text: B learns its head, and routes a question on that head
    // to the worker A chose, as a hit.
    let long = format!(
        "long report: {}",
        "the quarter's figures, line by line. ".repeat(600)
    );
    let worker = ask_and_wait(&a.url, &b.url, &long).await;
    // Until A's report that the request ended reaches B, B counts its
    // prefill as queued there, and may spill.
    wait_until("B saw A's request end", || async {
        let loads = worker_loads(&b.url, &worker).await;
        loads["peer_load"] == 0 && loads["peer_pending_prefill_chars"] == 0
    })
    .await;
    let (at_b, branch) = ask(&b.url, &long[..2000]).await;
    assert_eq!(
        (at_b.as_str(), branch.as_str()),
        (worker.as_str(), "cache_hit"),
        "B learned the head of A's long text"
    );
    assert_eq!(
        series_value(&a.url, "radixgate_sync_texts_cut_total").await,
        1.0
    );

    // 16 decisions of 2 KB at once: those that wait for the same batch
    // would make one over 8 KiB.
    let learned = || series_value(&b.url, "radixgate_sync_entries_learned_total");
    let before = learned().await;
    let asks: Vec<_> = (0..16)
        .map(|i| {
            let url = a.url.clone();
            let text = format!(
                "together {i}: {}",
                "a question of two kilobytes. ".repeat(70)
            );
            tokio::spawn(async move { ask(&url, &text).await })
        })
        .collect();
    for h in asks {
        h.await.unwrap();
    }
    wait_until("B learned all 16", || async {
        learned().await >= before + 16.0
    })
    .await;
    assert_eq!(
        series_value(
            &a.url,
            "radixgate_sync_dropped_total{reason=\"publish_error\"}"
        )
        .await,
        0.0
    );
    assert_eq!(
        series_value(&a.url, "radixgate_sync_texts_cut_total").await,
        1.0,
        "2 KB texts go whole"
    );
    a.shutdown().await;
    b.shutdown().await;
    let _ = std::fs::remove_dir_all(conf_dir);
}

/// A replica with prefix references off still resolves the references of a
/// peer that has them on: what it keeps for a sender follows the sender's
/// window, not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_references_off_resolves_a_peers_references() {
    let nats = Nats::start(&[]);
    let (_workers, a, b) = two_replicas_with(&nats, |c| c.sync.reference_window_bytes = 0).await;
    let system = "You are a careful assistant for the finance team. ".repeat(12);
    // B sends the third as a reference to the first, two entries back.
    let first = format!("{system}<user>first question");
    ask(&b.url, &first).await;
    ask(&b.url, &prompt("something unrelated")).await;
    let third = format!("{system}<user>second question");
    let (worker, _) = ask(&b.url, &third).await;
    // A fourth, sent whole: once A learned it, A applied the third too.
    assert_propagates(&b.url, &a.url, "after the reference", 1).await;
    assert_eq!(
        series_value(
            &a.url,
            "radixgate_sync_ignored_total{reason=\"missing_base\"}"
        )
        .await,
        0.0,
        "A dropped a reference it should hold"
    );
    let (w, branch) = ask(&a.url, &third).await;
    assert_eq!(
        (w.as_str(), branch.as_str()),
        (worker.as_str(), "cache_hit")
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A replica whose policy keeps no prefix trees nor cost model
/// (round_robin: another config, or half-way through a rollout of a policy
/// change) cannot apply what its cache_aware peers send: each decision and
/// each first token is counted `ignored{reason="no_trees"}`, as every
/// other message or entry not applied is. Until 2026-12-06 they were
/// dropped uncounted: received, and neither learned nor ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_replica_without_trees_cannot_apply_is_counted() {
    let nats = Nats::start(&[]);
    let (_workers, a, b) = two_replicas_with(&nats, |c| {
        c.routing = radixgate_routing::PolicyConfig::RoundRobin(Default::default());
    })
    .await;
    let no_trees = || series_value(&a.url, "radixgate_sync_ignored_total{reason=\"no_trees\"}");
    // Whole answers: a decision each, no first token.
    for i in 0..3 {
        ask(&b.url, &prompt(&format!("whole {i}"))).await;
    }
    wait_until("A counts B's three decisions", || async {
        no_trees().await == 3.0
    })
    .await;
    // A stream: its decision, and its first token (with B's next batch or
    // on B's load lane).
    let r = post_chat(&b.url, &chat(&prompt("streamed"), true)).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    wait_until("A counts the decision and the first token", || async {
        no_trees().await == 5.0
    })
    .await;
    assert_eq!(
        series_value(&a.url, "radixgate_sync_entries_learned_total").await,
        0.0
    );
    assert_eq!(
        series_value(&a.url, "radixgate_sync_first_tokens_learned_total").await,
        0.0
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_pool_shares_both_roles_records() {
    use radixgate::config::WorkerSpec;
    use radixgate_routing::WorkerRole;
    let nats = Nats::start(&[]);
    let mut prefill = Vec::new();
    for _ in 0..3 {
        let mut c = fast_worker();
        c.pd.role = radixgate_sim::server::Role::Prefill;
        prefill.push(sim_worker(c).await);
    }
    let mut c = fast_worker();
    c.pd.role = radixgate_sim::server::Role::Decode;
    let decode = sim_worker(c).await;
    let pd_replica = || {
        let mut c = replica_config(&[nats.url()], &[]);
        c.pd.enabled = true;
        c.pd.skip_prefill_max_uncached_tokens = 0;
        c.workers = prefill
            .iter()
            .map(|w| {
                // The simulated prefill worker serves its KV pulls on its
                // HTTP port too.
                WorkerSpec::new(w.url.clone())
                    .with_role(WorkerRole::Prefill)
                    .with_bootstrap_port(Some(w.handle.addr().port()))
            })
            .chain([WorkerSpec::new(decode.url.clone()).with_role(WorkerRole::Decode)])
            .collect();
        c
    };
    let a = gateway_ready(pd_replica(), 4).await;
    let b = gateway_ready(pd_replica(), 4).await;
    for g in [&a.url, &b.url] {
        wait_ready(g).await;
        wait_connected(g).await;
    }
    for i in 0..4 {
        let text = prompt(&format!("pd conversation {i}"));
        let learned = || series_value(&b.url, "radixgate_sync_entries_learned_total");
        let before = learned().await;
        let r = client()
            .post(format!("{}/v1/chat/completions", a.url))
            .json(&chat(&text, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let at_a = r.headers()["x-radixgate-prefill-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        // Both decisions: the prefill worker's and the decode worker's.
        wait_until("B learned both of A's decisions", || async {
            learned().await >= before + 2.0
        })
        .await;
        let r = client()
            .post(format!("{}/v1/chat/completions", b.url))
            .json(&chat(&format!("{text} and a follow-up"), false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(
            r.headers()["x-radixgate-prefill-worker"].to_str().unwrap(),
            at_a,
            "B sends A's prefix to A's prefill worker"
        );
        let decision = r.headers()["x-radixgate-decision"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            decision.contains("prefill=[cache_aware branch=cache_hit"),
            "{decision}"
        );
    }
    a.shutdown().await;
    b.shutdown().await;
}
