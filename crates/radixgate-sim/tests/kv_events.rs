//! The simulated worker's KV-event publisher seen from a real ZeroMQ
//! subscriber and replay client on loopback: the wire format (three
//! frames, msgpack in both shapes, both hash formats), stores with chained
//! parents and the worker's own token ids, evictions, a flush, replay, and
//! the gap and restart faults. Payloads are decoded with `rmpv`, by field
//! name or position as a subscriber written from the engines' structs
//! would, not with the encoder under test.
//!
//! No upper bound on time is asserted: receives wait with a generous
//! deadline that only turns a hang into a failure.

mod common;

use std::time::Duration;

use common::*;
use radixgate_sim::engine::KvCache;
use radixgate_sim::server::{EventShape, FaultConfig, HashFormat, KvEventsConfig, WorkerConfig};
use rmpv::Value;
use serde_json::json;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const BLOCK: usize = 4;
const WAIT: Duration = Duration::from_secs(10);

/// A fast worker with one token per character, 4-token blocks and a cache
/// of `blocks` blocks, publishing on a free loopback port.
fn config(blocks: usize, shape: EventShape, hash: HashFormat, replay: bool) -> WorkerConfig {
    let mut c = fast_config();
    c.chars_per_token = 1;
    c.engine.block_size = BLOCK;
    c.engine.kv_capacity_tokens = blocks * BLOCK;
    c.engine.max_batch_tokens = 256;
    c.kv_events = KvEventsConfig {
        endpoint: "tcp://127.0.0.1:0".into(),
        topic: "kv".into(),
        shape,
        hash,
        replay_endpoint: if replay {
            "tcp://127.0.0.1:0".into()
        } else {
            String::new()
        },
        ..KvEventsConfig::default()
    };
    c
}

/// One received message: sequence and decoded payload (with its bytes).
#[derive(Debug, Clone)]
struct Msg {
    seq: u64,
    raw: Vec<u8>,
    batch: Value,
}

/// An event decoded shape-independently.
#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u64>,
        block_size: u64,
        medium: String,
    },
    Removed {
        hashes: Vec<u64>,
    },
    Cleared,
}

struct Sub {
    sock: SubSocket,
    shape: EventShape,
    hash: HashFormat,
}

impl Sub {
    async fn connect(endpoint: &str, shape: EventShape, hash: HashFormat) -> Self {
        let mut sock = SubSocket::new();
        sock.subscribe("kv").await.unwrap();
        sock.connect(endpoint).await.unwrap();
        Self { sock, shape, hash }
    }

    async fn recv_within(&mut self, d: Duration) -> Option<Msg> {
        let m = tokio::time::timeout(d, self.sock.recv())
            .await
            .ok()?
            .unwrap();
        let frames = m.into_vec();
        assert_eq!(frames.len(), 3, "three frames: topic, sequence, payload");
        assert_eq!(&frames[0][..], b"kv");
        assert_eq!(frames[1].len(), 8, "sequence is 8 bytes");
        let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
        let raw = frames[2].to_vec();
        let batch = rmpv::decode::read_value(&mut &raw[..]).expect("payload is msgpack");
        Some(Msg { seq, raw, batch })
    }

    async fn recv(&mut self) -> Msg {
        self.recv_within(WAIT).await.expect("a KV-event message")
    }

    /// The batch's events, checking the batch's own layout.
    fn events(&self, m: &Msg) -> Vec<Ev> {
        let (ts, events, rank) = match self.shape {
            EventShape::Array => {
                let a = m.batch.as_array().expect("array batch");
                assert_eq!(a.len(), 3, "[ts, events, data_parallel_rank]");
                (&a[0], &a[1], &a[2])
            }
            EventShape::Map => (
                field(&m.batch, "ts"),
                field(&m.batch, "events"),
                field(&m.batch, "data_parallel_rank"),
            ),
        };
        let ts = ts.as_f64().expect("float timestamp");
        assert!(ts > 1.7e9, "seconds since the epoch: {ts}");
        assert_eq!(rank.as_u64(), Some(0));
        events
            .as_array()
            .expect("event list")
            .iter()
            .map(|e| self.event(e))
            .collect()
    }

    fn event(&self, e: &Value) -> Ev {
        match self.shape {
            EventShape::Array => {
                let a = e.as_array().expect("array event");
                let tag = a[0].as_str().expect("tag first");
                self.build(tag, &|i, _| a[i + 1].clone(), a.len() - 1)
            }
            EventShape::Map => {
                let tag = field(e, "type").as_str().expect("type tag");
                let n = e.as_map().unwrap().len() - 1;
                self.build(tag, &|_, k| field(e, k).clone(), n)
            }
        }
    }

    /// Builds an event from its fields, `get(position, name)`.
    fn build(&self, tag: &str, get: &dyn Fn(usize, &str) -> Value, n: usize) -> Ev {
        let hashes = |v: Value| -> Vec<u64> {
            v.as_array()
                .expect("hash list")
                .iter()
                .map(|h| self.hash(h))
                .collect()
        };
        match tag {
            "BlockStored" => {
                let expected = match self.shape {
                    EventShape::Array => 6,
                    EventShape::Map => 7,
                };
                assert_eq!(n, expected, "BlockStored fields");
                assert!(get(4, "lora_id").is_nil());
                if self.shape == EventShape::Map {
                    assert!(get(6, "lora_name").is_nil());
                }
                let parent = get(1, "parent_block_hash");
                Ev::Stored {
                    hashes: hashes(get(0, "block_hashes")),
                    parent: (!parent.is_nil()).then(|| self.hash(&parent)),
                    tokens: get(2, "token_ids")
                        .as_array()
                        .expect("token ids")
                        .iter()
                        .map(|t| t.as_u64().expect("token id"))
                        .collect(),
                    block_size: get(3, "block_size").as_u64().unwrap(),
                    medium: get(5, "medium").as_str().unwrap().to_owned(),
                }
            }
            "BlockRemoved" => {
                assert_eq!(n, 2, "BlockRemoved fields");
                assert_eq!(get(1, "medium").as_str(), Some("GPU"));
                Ev::Removed {
                    hashes: hashes(get(0, "block_hashes")),
                }
            }
            "AllBlocksCleared" => {
                assert_eq!(n, 0);
                Ev::Cleared
            }
            other => panic!("unknown event {other}"),
        }
    }

    fn hash(&self, h: &Value) -> u64 {
        match self.hash {
            HashFormat::Int => h.as_u64().expect("integer hash"),
            HashFormat::Bytes => {
                let b = h.as_slice().expect("bytes hash");
                u64::from_be_bytes(b.try_into().expect("8 bytes"))
            }
        }
    }

    /// Makes sure the subscription is live (a PUB drops messages until
    /// the subscriber has joined): stores one block per try until an event
    /// arrives, then flushes and reads up to the `AllBlocksCleared`, so the
    /// cache starts empty. Returns the last sequence seen.
    async fn join(&mut self, base: &str) -> u64 {
        for k in 0..100 {
            let (s, _, _) = post(
                base,
                "/generate",
                json!({"text": format!("warm{k:04}"), "sampling_params": {"max_new_tokens": 1}}),
            )
            .await;
            assert_eq!(s, 200);
            if self.recv_within(Duration::from_millis(200)).await.is_some() {
                let (s, _, _) = post(base, "/flush_cache", json!({})).await;
                assert_eq!(s, 200);
                loop {
                    let m = self.recv().await;
                    if self.events(&m).contains(&Ev::Cleared) {
                        return m.seq;
                    }
                }
            }
        }
        panic!("the subscriber never received an event");
    }
}

fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_map()
        .expect("map")
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no field {key} in {v}"))
}

/// The worker's token ids for `text`, from its own `/tokenize`.
async fn tokenize(base: &str, text: &str) -> Vec<u64> {
    let (s, _, v) = post(base, "/tokenize", json!({"prompt": text})).await;
    assert_eq!(s, 200);
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// Runs `/generate` on `text` and returns the reply text.
async fn generate(base: &str, text: &str, max_new_tokens: u32) -> String {
    let (s, _, v) = post(
        base,
        "/generate",
        json!({"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    v["text"].as_str().unwrap().to_owned()
}

/// Reads events until `done` holds for what was collected.
async fn collect_until(sub: &mut Sub, done: impl Fn(&[Ev]) -> bool) -> (Vec<Msg>, Vec<Ev>) {
    let mut msgs = Vec::new();
    let mut evs = Vec::new();
    while !done(&evs) {
        let m = sub.recv().await;
        evs.extend(sub.events(&m));
        msgs.push(m);
    }
    (msgs, evs)
}

fn stored_blocks(evs: &[Ev]) -> usize {
    evs.iter()
        .map(|e| match e {
            Ev::Stored { hashes, .. } => hashes.len(),
            _ => 0,
        })
        .sum()
}

/// A request's full blocks are reported as stored, in chained runs whose
/// parents and token ids are the worker's own, with the cache's hashes.
async fn stores_are_chained_with_the_workers_tokens(shape: EventShape, hash: HashFormat) {
    let w = spawn(config(64, shape, hash, false)).await;
    let ep = w.handle.kv_events_endpoint().expect("bound");
    let mut sub = Sub::connect(&ep, shape, hash).await;
    let last = sub.join(&w.base).await;
    let prompt = "the quick brown fox jumps over"; // 30 tokens: 7 full blocks
    let reply = generate(&w.base, prompt, 6).await;
    // Prompt + reply: 36 tokens, 9 blocks, all cached when it finishes.
    let tokens = tokenize(&w.base, &format!("{prompt}{reply}")).await;
    assert_eq!(tokens.len(), 36);
    let (msgs, evs) = collect_until(&mut sub, |e| stored_blocks(e) >= 9).await;
    assert_eq!(msgs[0].seq, last + 1, "sequence continues without a gap");
    for pair in msgs.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1);
    }
    let expected = KvCache::new(BLOCK, 64).block_hashes(&tokens);
    let mut chain: Vec<u64> = Vec::new();
    let mut chain_tokens: Vec<u64> = Vec::new();
    for e in &evs {
        let Ev::Stored {
            hashes,
            parent,
            tokens: t,
            block_size,
            medium,
        } = e
        else {
            panic!("only stores expected on an empty, large cache: {e:?}");
        };
        assert_eq!(*block_size, BLOCK as u64);
        assert_eq!(medium, "GPU");
        assert_eq!(*parent, chain.last().copied(), "parent is the block before");
        assert_eq!(t.len(), hashes.len() * BLOCK);
        chain.extend(hashes);
        chain_tokens.extend(t);
    }
    assert_eq!(chain, expected, "the cache's chain hashes");
    assert_eq!(chain_tokens, tokens[..36], "the worker's token ids");
    // The prompt's 7 blocks come first (prefill), the rest at the finish.
    assert!(matches!(&evs[0], Ev::Stored { hashes, .. } if hashes.len() == 7));
}

#[tokio::test]
async fn stores_in_array_shape_with_int_hashes() {
    stores_are_chained_with_the_workers_tokens(EventShape::Array, HashFormat::Int).await;
}

#[tokio::test]
async fn stores_in_map_shape_with_bytes_hashes() {
    stores_are_chained_with_the_workers_tokens(EventShape::Map, HashFormat::Bytes).await;
}

/// A small cache that overflows reports the evicted blocks, each one that
/// was stored before, and the least recently used request's first.
async fn evictions_are_reported(shape: EventShape, hash: HashFormat) {
    // 10 blocks: two requests of 4 cached blocks fit, a third evicts.
    let w = spawn(config(10, shape, hash, false)).await;
    let ep = w.handle.kv_events_endpoint().expect("bound");
    let mut sub = Sub::connect(&ep, shape, hash).await;
    sub.join(&w.base).await;
    let mut held = std::collections::HashSet::new();
    let mut removed = Vec::new();
    let mut first_blocks = Vec::new();
    for text in ["aaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbb", "ccccccccccccccc"] {
        // 15 tokens + 1 generated: 4 full blocks each when finished.
        let reply = generate(&w.base, text, 1).await;
        let tokens = tokenize(&w.base, &format!("{text}{reply}")).await;
        let hashes = KvCache::new(BLOCK, 10).block_hashes(&tokens);
        first_blocks.push(hashes.clone());
        let want: std::collections::HashSet<u64> = hashes.into_iter().collect();
        let mut got = std::collections::HashSet::new();
        while got != want {
            let m = sub.recv().await;
            for e in sub.events(&m) {
                match e {
                    Ev::Stored { hashes, .. } => {
                        for h in hashes {
                            assert!(held.insert(h), "stored twice");
                            got.insert(h);
                        }
                    }
                    Ev::Removed { hashes } => {
                        for h in hashes {
                            assert!(held.remove(&h), "removed a block never stored");
                            removed.push(h);
                        }
                    }
                    Ev::Cleared => panic!("no flush here"),
                }
            }
        }
    }
    // 12 blocks made, room for 10: the first request's two deepest go
    // (leaves first), while it was least recently used.
    assert_eq!(removed.len(), 2, "{removed:?}");
    let a = &first_blocks[0];
    assert_eq!(removed, vec![a[3], a[2]]);
    assert_eq!(held.len(), 10);
}

#[tokio::test]
async fn evictions_in_array_shape() {
    evictions_are_reported(EventShape::Array, HashFormat::Int).await;
}

#[tokio::test]
async fn evictions_in_map_shape() {
    evictions_are_reported(EventShape::Map, HashFormat::Bytes).await;
}

/// Asks the replay socket for every batch from `start`, as a REQ client
/// frames it (empty delimiter, 8-byte big-endian start); returns
/// `(sequence, payload)` pairs up to the end marker, which is checked.
async fn replay(endpoint: &str, start: u64) -> Vec<(i64, Vec<u8>)> {
    let mut d = DealerSocket::new();
    d.connect(endpoint).await.unwrap();
    let req: ZmqMessage = vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&start.to_be_bytes()),
    ]
    .try_into()
    .unwrap();
    d.send(req).await.unwrap();
    let mut out = Vec::new();
    loop {
        let m = tokio::time::timeout(WAIT, d.recv())
            .await
            .expect("a replay answer")
            .unwrap()
            .into_vec();
        assert_eq!(m.len(), 3, "[delimiter, sequence, payload]");
        assert!(m[0].is_empty(), "the REQ envelope's delimiter");
        let seq = i64::from_be_bytes(m[1][..].try_into().expect("8-byte sequence"));
        if seq == -1 {
            assert!(m[2].is_empty(), "the end marker has an empty payload");
            return out;
        }
        out.push((seq, m[2].to_vec()));
    }
}

#[tokio::test]
async fn replay_returns_buffered_batches_from_a_sequence_then_the_end_marker() {
    let (shape, hash) = (EventShape::Array, HashFormat::Int);
    let w = spawn(config(64, shape, hash, true)).await;
    let ep = w.handle.kv_events_endpoint().expect("bound");
    let replay_ep = w.handle.kv_events_replay_endpoint().expect("replay bound");
    let mut sub = Sub::connect(&ep, shape, hash).await;
    sub.join(&w.base).await;
    // Each request stores its prompt's blocks, then more at its finish.
    for text in ["first prompt here", "second prompt here", "third prompt"] {
        generate(&w.base, text, 4).await;
    }
    let mut live = Vec::new();
    while let Some(m) = sub.recv_within(Duration::from_millis(500)).await {
        live.push(m);
    }
    assert!(live.len() >= 4, "{} batches", live.len());
    let start = live[1].seq;
    let got = replay(&replay_ep, start).await;
    // Everything buffered from `start` on, in order, byte for byte; the
    // subscriber saw every batch from live[1] on.
    let want: Vec<(i64, Vec<u8>)> = live[1..]
        .iter()
        .map(|m| (m.seq as i64, m.raw.clone()))
        .collect();
    assert_eq!(got, want);
    // A start past the newest batch: only the end marker.
    assert!(
        replay(&replay_ep, live.last().unwrap().seq + 1)
            .await
            .is_empty()
    );
    assert_eq!(w.handle.kv_events_counters().unwrap().replays, 2);
}

#[tokio::test]
async fn drop_fault_makes_a_gap_that_replay_fills() {
    let (shape, hash) = (EventShape::Map, HashFormat::Int);
    let w = spawn(config(64, shape, hash, true)).await;
    let ep = w.handle.kv_events_endpoint().expect("bound");
    let replay_ep = w.handle.kv_events_replay_endpoint().expect("replay bound");
    let mut sub = Sub::connect(&ep, shape, hash).await;
    let last = sub.join(&w.base).await;
    w.handle
        .set_faults(FaultConfig {
            kv_events_drop: 1,
            ..FaultConfig::default()
        })
        .unwrap();
    // Two requests, one after the other: at least two batches.
    generate(&w.base, "one request prompt", 2).await;
    generate(&w.base, "another prompt", 2).await;
    let m = sub.recv().await;
    assert_eq!(m.seq, last + 2, "one sequence number skipped");
    let gap = replay(&replay_ep, last + 1).await;
    assert_eq!(
        gap[0].0,
        (last + 1) as i64,
        "the withheld batch is replayed"
    );
    assert_eq!(gap[1], (m.seq as i64, m.raw.clone()));
    let evs = sub.events(&Msg {
        seq: gap[0].0 as u64,
        batch: rmpv::decode::read_value(&mut &gap[0].1[..]).unwrap(),
        raw: gap[0].1.clone(),
    });
    assert!(
        matches!(&evs[0], Ev::Stored { parent: None, .. }),
        "{evs:?}"
    );
    assert_eq!(w.handle.kv_events_counters().unwrap().withheld, 1);
}

#[tokio::test]
async fn stop_fault_closes_the_publisher_and_a_restart_counts_from_zero() {
    let (shape, hash) = (EventShape::Array, HashFormat::Bytes);
    let w = spawn(config(64, shape, hash, false)).await;
    let ep = w.handle.kv_events_endpoint().expect("bound");
    let mut sub = Sub::connect(&ep, shape, hash).await;
    sub.join(&w.base).await;
    // Enough batches that the old sequence is well above where a new
    // publisher's is after a few warm-up requests.
    for k in 0..30 {
        generate(&w.base, &format!("{k:03} request number"), 1).await;
    }
    let mut last = 0;
    while let Some(m) = sub.recv_within(Duration::from_millis(300)).await {
        last = m.seq;
    }
    assert!(last >= 30, "{last}");
    w.handle
        .set_faults(FaultConfig {
            kv_events_stopped: true,
            ..FaultConfig::default()
        })
        .unwrap();
    // The fault reaches the publisher task asynchronously.
    let deadline = tokio::time::Instant::now() + WAIT;
    while w.handle.kv_events_endpoint().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "never stopped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    generate(&w.base, "made while stopped", 2).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while w.handle.kv_events_counters().unwrap().dropped_stopped == 0 {
        assert!(tokio::time::Instant::now() < deadline, "nothing discarded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(sub.recv_within(Duration::from_millis(300)).await.is_none());
    w.handle.set_faults(FaultConfig::default()).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while w.handle.kv_events_endpoint().as_deref() != Some(ep.as_str()) {
        assert!(tokio::time::Instant::now() < deadline, "never restarted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The same subscriber reconnects by itself; the new publisher counts
    // from 0 again, below what the old one had reached.
    let after = sub.join(&w.base).await;
    assert!(after < last + 1, "sequence restarted: {after} after {last}");
}

#[tokio::test]
async fn no_publisher_without_an_endpoint_and_bad_endpoints_fail_at_start() {
    let w = spawn(fast_config()).await;
    assert!(w.handle.kv_events_endpoint().is_none());
    assert!(w.handle.kv_events_counters().is_none());
    let mut c = config(8, EventShape::Array, HashFormat::Int, false);
    c.kv_events.endpoint = "tcp://127.0.0.1".into();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let e = radixgate_sim::server::start(listener, c, stop.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("kv_events.endpoint"), "{e}");
    // A port already taken is a clear error too.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = config(8, EventShape::Array, HashFormat::Int, false);
    c.kv_events.endpoint = format!("tcp://{}", taken.local_addr().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = radixgate_sim::server::start(listener, c, stop)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot bind kv_events.endpoint"), "{e}");
}

/// A token source standing in for a real tokenizer: one id per byte.
#[derive(Debug)]
struct ByteTokens;

impl radixgate_sim::tokens::TokenSource for ByteTokens {
    fn tokenize(&self, text: &str) -> Vec<u64> {
        text.bytes().map(|b| 1000 + u64::from(b)).collect()
    }
}

/// Events carry the ids the worker's token source gives, and a prompt
/// given as `input_ids` is cached, and reported, as those very ids.
#[tokio::test]
async fn events_carry_a_plugged_token_sources_ids_and_input_ids_as_given() {
    let (shape, hash) = (EventShape::Array, HashFormat::Int);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    let handle = radixgate_sim::server::start_with_tokens(
        listener,
        config(64, shape, hash, false),
        std::sync::Arc::new(ByteTokens),
        stop,
    )
    .await
    .unwrap();
    let base = format!("http://{}", handle.addr());
    let mut sub = Sub::connect(&handle.kv_events_endpoint().unwrap(), shape, hash).await;
    sub.join(&base).await;
    assert_eq!(tokenize(&base, "hi").await, vec![1000 + 104, 1000 + 105]);
    generate(&base, "abcdefghi", 1).await;
    let (_, evs) = collect_until(&mut sub, |e| stored_blocks(e) >= 2).await;
    let Ev::Stored { tokens, .. } = &evs[0] else {
        panic!("{evs:?}")
    };
    let want: Vec<u64> = "abcdefgh".bytes().map(|b| 1000 + u64::from(b)).collect();
    assert_eq!(tokens, &want, "the token source's ids");
    let ids: Vec<u64> = (5..14).collect();
    let (s, _, v) = post(
        &base,
        "/generate",
        json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (_, evs) = collect_until(&mut sub, |e| {
        e.iter()
            .any(|e| matches!(e, Ev::Stored { parent: None, tokens, .. } if tokens[0] == 5))
    })
    .await;
    let first = evs.iter().find_map(|e| match e {
        Ev::Stored {
            parent: None,
            tokens,
            ..
        } => Some(tokens),
        _ => None,
    });
    assert_eq!(first.unwrap()[..8], ids[..8], "input_ids as given");
}
