//! KV-cache events: the simulated worker publishes its cache's stores and
//! evictions over ZeroMQ in the wire format of vLLM's and SGLang's
//! publishers, so a router can subscribe to a simulated worker as it would
//! to a real engine.
//!
//! Wire format (facts from vLLM's `vllm/distributed/kv_events.py` and
//! SGLang's `python/sglang/srt/disaggregation/kv_events.py`, which share
//! one design):
//! - a PUB socket; each message is three frames `[topic, sequence,
//!   payload]`: the topic as UTF-8 (empty by default), the batch's
//!   sequence number as 8 bytes big-endian (counting from 0 for each
//!   publisher), and the msgpack-encoded batch;
//! - a batch is one engine step's events (`encode` has the two shapes);
//! - an optional ROUTER socket for replay: a client sends the first
//!   sequence it wants as 8 bytes big-endian; the publisher answers each
//!   buffered batch with that sequence or later as `[sequence, payload]`,
//!   then `[-1 as 8 bytes big-endian, empty]` (`publisher` has the
//!   envelope details);
//! - with data parallelism each rank publishes on `port + rank`; here
//!   worker `i` of `--count N` publishes on `port + i` likewise.
//!
//! Parts: [`KvEventsConfig`] (this file), `encode` (msgpack), `publisher`
//! (the engine-side sink and the socket task).

mod encode;
mod publisher;

use serde::{Deserialize, Serialize};

use crate::error::SimError;

pub use publisher::KvEventsCounters;
pub(crate) use publisher::{EventSink, Publisher};

/// Default number of recent batches kept for replay (vLLM's and SGLang's
/// `buffer_steps` default).
pub const DEFAULT_REPLAY_BATCHES: usize = 10_000;

/// Default capacity, in batches, of the channel from the engine task to
/// the publisher task.
pub const DEFAULT_QUEUE_BATCHES: usize = 1024;

/// How events and batches are laid out in msgpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum EventShape {
    /// Arrays, positional, tag first: a batch is (ts, events, dp_rank)
    /// and an event like ("BlockStored", hashes, parent, tokens,
    /// block_size, lora_id, medium) (SGLang, and vLLM while its structs were
    /// `array_like`).
    #[default]
    Array,
    /// Maps keyed by field name, tagged by `type`: `{"ts", "events",
    /// "data_parallel_rank"}` with events like `{"type": "BlockStored",
    /// "block_hashes": …}` (vLLM since its structs dropped `array_like`).
    Map,
}

/// How block hashes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HashFormat {
    /// A msgpack integer (the 64-bit hash, unsigned).
    #[default]
    Int,
    /// msgpack bin of the hash's 8 bytes, big-endian (vLLM's
    /// `ExternalBlockHash` may be bytes).
    Bytes,
}

/// The KV-event publisher of one worker; off while `endpoint` is empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    /// `tcp://HOST:PORT` the PUB socket binds (`*` for every interface,
    /// port 0 for any free port); empty: no events.
    pub endpoint: String,
    /// Topic frame of every message.
    pub topic: String,
    /// Arrays (SGLang, older vLLM) or maps (newer vLLM).
    pub shape: EventShape,
    /// Block hashes as integers or bytes.
    pub hash: HashFormat,
    /// `tcp://HOST:PORT` of the replay (ROUTER) socket; empty: none.
    pub replay_endpoint: String,
    /// Recent batches kept for replay.
    pub replay_batches: usize,
    /// Batches the engine may queue for the publisher; past that a batch
    /// is dropped, counted, and its sequence number skipped.
    pub queue_batches: usize,
    /// `data_parallel_rank` written in each batch (`null` for none).
    pub data_parallel_rank: Option<u32>,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            topic: String::new(),
            shape: EventShape::default(),
            hash: HashFormat::default(),
            replay_endpoint: String::new(),
            replay_batches: DEFAULT_REPLAY_BATCHES,
            queue_batches: DEFAULT_QUEUE_BATCHES,
            data_parallel_rank: Some(0),
        }
    }
}

impl KvEventsConfig {
    /// Whether events are published at all.
    pub fn enabled(&self) -> bool {
        !self.endpoint.is_empty()
    }

    /// Checks the endpoints and sizes.
    pub fn validate(&self) -> Result<(), SimError> {
        if !self.enabled() {
            if !self.replay_endpoint.is_empty() {
                return Err(SimError::Config(
                    "kv_events.replay_endpoint needs kv_events.endpoint".into(),
                ));
            }
            return Ok(());
        }
        let publish = parse_endpoint("kv_events.endpoint", &self.endpoint)?;
        if !self.replay_endpoint.is_empty() {
            let replay = parse_endpoint("kv_events.replay_endpoint", &self.replay_endpoint)?;
            if replay == publish && publish.1 != 0 {
                return Err(SimError::Config(format!(
                    "kv_events.replay_endpoint must differ from kv_events.endpoint ({})",
                    self.endpoint
                )));
            }
            if self.replay_batches == 0 {
                return Err(SimError::Config(
                    "kv_events.replay_batches must be at least 1 with a replay endpoint".into(),
                ));
            }
        }
        if self.queue_batches == 0 {
            return Err(SimError::Config(
                "kv_events.queue_batches must be at least 1".into(),
            ));
        }
        if self.topic.len() > 1024 {
            return Err(SimError::Config(
                "kv_events.topic must be at most 1024 bytes".into(),
            ));
        }
        Ok(())
    }

    /// The configuration of worker `i` of a group: both ports moved up by
    /// `i` (as engines offset them by data-parallel rank); port 0 stays 0.
    pub fn for_worker(&self, i: u16) -> Result<Self, SimError> {
        let mut c = self.clone();
        for (what, ep) in [
            ("kv_events.endpoint", &mut c.endpoint),
            ("kv_events.replay_endpoint", &mut c.replay_endpoint),
        ] {
            if ep.is_empty() || i == 0 {
                continue;
            }
            let (host, port) = parse_endpoint(what, ep)?;
            if port != 0 {
                let port = port.checked_add(i).ok_or_else(|| {
                    SimError::Config(format!("{what} {ep}: port + worker index passes 65535"))
                })?;
                *ep = format!("tcp://{host}:{port}");
            }
        }
        Ok(c)
    }
}

/// Splits `tcp://HOST:PORT` into host and port; `*` means every interface.
pub(crate) fn parse_endpoint(what: &str, ep: &str) -> Result<(String, u16), SimError> {
    let bad = |why: &str| {
        SimError::Config(format!(
            "{what} {ep:?}: {why} (expected tcp://HOST:PORT, e.g. tcp://127.0.0.1:5557)"
        ))
    };
    let rest = ep
        .strip_prefix("tcp://")
        .ok_or_else(|| bad("only tcp:// endpoints are supported"))?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    let port: u16 = port.parse().map_err(|_| bad("bad port"))?;
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let host = if host == "*" { "0.0.0.0" } else { host };
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_offset_and_fail_clearly() {
        assert_eq!(
            parse_endpoint("e", "tcp://*:5557").unwrap(),
            ("0.0.0.0".to_owned(), 5557)
        );
        assert_eq!(
            parse_endpoint("e", "tcp://[::1]:9").unwrap(),
            ("[::1]".to_owned(), 9)
        );
        for bad in [
            "",
            "ipc:///tmp/x",
            "tcp://host",
            "tcp://:1",
            "tcp://h:99999",
        ] {
            let e = parse_endpoint("kv_events.endpoint", bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("kv_events.endpoint"), "{bad}: {e}");
        }
        let c = KvEventsConfig {
            endpoint: "tcp://127.0.0.1:5557".into(),
            replay_endpoint: "tcp://127.0.0.1:6557".into(),
            ..KvEventsConfig::default()
        };
        c.validate().unwrap();
        let w2 = c.for_worker(2).unwrap();
        assert_eq!(w2.endpoint, "tcp://127.0.0.1:5559");
        assert_eq!(w2.replay_endpoint, "tcp://127.0.0.1:6559");
        let same = KvEventsConfig {
            replay_endpoint: c.endpoint.clone(),
            ..c.clone()
        };
        assert!(same.validate().is_err());
        let orphan = KvEventsConfig {
            endpoint: String::new(),
            ..c
        };
        assert!(orphan.validate().is_err());
        assert!(KvEventsConfig::default().validate().is_ok());
    }
}
