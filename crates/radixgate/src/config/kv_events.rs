//! The `kv_events:` section: subscribing to the workers' KV-cache event
//! streams (SGLang, vLLM) so routing sees what each worker really holds
//! (see `docs/kv-events.md`).
//!
//! Each worker's publisher is found at `endpoints[url]` when the worker's
//! URL is listed there, else at `tcp://<the worker's host>:<port>`; a worker
//! running `data_parallel_size` ranks publishes rank `r` at `port + r` (and
//! answers replays at `replay_port + r`), as vLLM offsets its ports per
//! data-parallel rank. Its replay socket is at `replay_endpoints[url]` when
//! listed there, else at `replay_port` on its publisher's host, except for
//! a worker whose own publisher port is not `port`: that is an engine
//! beside another on one host, whose replay socket is not the other's, so
//! it has none unless listed (an engine's replay answers with its own
//! batches under the same sequence numbers, which would be taken as this
//! worker's). Matching needs the request's token ids: `tokenizer`
//! names the model's `tokenizer.json` or model directory.

use super::{ConfigError, invalid};
use radixgate_routing::WorkerUrl;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The largest `data_parallel_size`: ranks are keyed in 8 bits.
pub const MAX_DATA_PARALLEL_SIZE: u32 = 256;

/// KV-event subscription.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    /// Subscribe to every worker's publisher (`--kv-events`).
    pub enabled: bool,
    /// The publishers' port on each worker's host (`--kv-events-port`);
    /// SGLang's and vLLM's examples use 5557.
    pub port: u16,
    /// The engines' replay port, if they run one (`--kv-events-replay-port`):
    /// a gap is then filled from it instead of marking the worker stale.
    pub replay_port: Option<u16>,
    /// Topic prefix to subscribe to (`--kv-events-topic`); empty: all.
    pub topic: String,
    /// Data-parallel ranks per worker, each publishing on its own port
    /// (`--kv-events-dp-size`).
    pub data_parallel_size: u32,
    /// Publisher endpoints by worker URL, for workers whose publisher is
    /// not at `tcp://<host>:<port>`, e.g. `{"http://10.0.0.5:8000":
    /// "tcp://10.0.0.5:6000"}` (rank r at the port plus r). A URL is
    /// found in any of its spellings (`http://10.0.0.5:8000/`), as the
    /// workers list takes it.
    pub endpoints: BTreeMap<String, String>,
    /// Replay endpoints by worker URL, for workers whose replay socket is
    /// not at `replay_port` on their publisher's host (rank r at the port
    /// plus r). A worker listed in `endpoints` with a port other than
    /// `port` replays only from here.
    pub replay_endpoints: BTreeMap<String, String>,
    /// The model's `tokenizer.json`, or a model directory holding it and
    /// `tokenizer_config.json` (`--tokenizer`). Without it only requests
    /// that carry token ids (`/generate` with `input_ids`, completions with
    /// a token-id prompt) can be matched; every other one is routed on the
    /// approximate tree, and start-up says so.
    pub tokenizer: Option<PathBuf>,
    /// The models whose requests `tokenizer` reads
    /// (`--kv-events-tokenizer-models a,b`); empty: every model's. In a
    /// pool of several models, one model's tokenizer makes another's
    /// prompts into ids its engines never saw, so their workers' exact
    /// matches would all read 0 and those requests lose their cache
    /// affinity: a request for a model not listed is routed on the
    /// approximate tree (a request that carries its own token ids is
    /// matched whatever its model).
    pub tokenizer_models: Vec<String>,
    /// Whose chat-prompt rules the tokenizer follows: `vllm` or `sglang`
    /// (`--kv-events-engine`).
    pub engine: EngineRules,
    /// Blocks the index keeps per worker rank; past it a worker is taken
    /// as stale (an engine evicts long before: only one that lies gets
    /// there).
    pub max_blocks_per_worker: usize,
    /// Blocks the index keeps in all.
    pub max_blocks_total: usize,
    /// The longest frame, or message, a publisher may send; one that
    /// declares more is cut off before it is read, and its stream counts
    /// as stale (`oversized`), so that a worker that lies cannot make the
    /// router set memory aside for it.
    pub max_message_bytes: u64,
}

/// The smallest `max_message_bytes` taken: an engine's ordinary batch
/// must fit.
const MIN_MESSAGE_BYTES: u64 = 64 << 10;

/// Whose rules a chat request is tokenized by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum EngineRules {
    /// vLLM's.
    #[default]
    Vllm,
    /// SGLang's.
    Sglang,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            port: 5557,
            replay_port: None,
            topic: String::new(),
            data_parallel_size: 1,
            endpoints: BTreeMap::new(),
            replay_endpoints: BTreeMap::new(),
            tokenizer: None,
            tokenizer_models: Vec::new(),
            engine: EngineRules::default(),
            max_blocks_per_worker: 1 << 20,
            max_blocks_total: 1 << 24,
            max_message_bytes: radixgate_kv::subscribe::DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

impl KvEventsConfig {
    /// Checks the numbers and endpoints (the tokenizer is loaded, and so
    /// checked, at start-up).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_DATA_PARALLEL_SIZE).contains(&self.data_parallel_size) {
            return Err(invalid(
                "kv_events.data_parallel_size",
                format!(
                    "must be in 1..={MAX_DATA_PARALLEL_SIZE}, got {}",
                    self.data_parallel_size
                ),
            ));
        }
        let last = u32::from(self.port) + self.data_parallel_size - 1;
        if self.port == 0 || last > u32::from(u16::MAX) {
            return Err(invalid(
                "kv_events.port",
                format!(
                    "ports {}..={last} (one per data-parallel rank) must be in 1..=65535",
                    self.port
                ),
            ));
        }
        if let Some(replay) = self.replay_port {
            let last = u32::from(replay) + self.data_parallel_size - 1;
            if replay == 0 || last > u32::from(u16::MAX) {
                return Err(invalid(
                    "kv_events.replay_port",
                    format!("ports {replay}..={last} must be in 1..=65535"),
                ));
            }
        }
        for (what, map) in [
            ("kv_events.endpoints", &self.endpoints),
            ("kv_events.replay_endpoints", &self.replay_endpoints),
        ] {
            let mut seen = std::collections::BTreeSet::new();
            for (url, endpoint) in map {
                if !seen.insert(WorkerUrl::canonical(url.trim())) {
                    return Err(invalid(
                        what,
                        format!("{url}: another entry names the same worker URL"),
                    ));
                }
                match tcp_port(endpoint) {
                    None => {
                        return Err(invalid(
                            what,
                            format!("{url}: {endpoint:?} is not tcp://HOST:PORT"),
                        ));
                    }
                    Some((host, port)) if is_wildcard(host) => {
                        return Err(invalid(
                            what,
                            format!(
                                "{url}: {endpoint:?} is the engine's bind address, not \
                                 where it is reached; name the worker's host, e.g. \
                                 tcp://10.0.0.5:{port}"
                            ),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        for (key, blocks) in [
            (
                "kv_events.max_blocks_per_worker",
                self.max_blocks_per_worker,
            ),
            ("kv_events.max_blocks_total", self.max_blocks_total),
        ] {
            if blocks == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if self.max_message_bytes < MIN_MESSAGE_BYTES {
            return Err(invalid(
                "kv_events.max_message_bytes",
                format!(
                    "must be at least {MIN_MESSAGE_BYTES} (64 KiB), got {}",
                    self.max_message_bytes
                ),
            ));
        }
        Ok(())
    }

    /// The publisher and replay endpoints of each rank of the worker at
    /// `url` whose host is `host`.
    pub fn endpoints_for(&self, url: &str, host: &str) -> Vec<(String, Option<String>)> {
        let (host, port) = match entry(&self.endpoints, url).and_then(tcp_port) {
            Some((h, p)) => (h.to_owned(), p),
            None => (bracketed(host), self.port),
        };
        // The shared replay port is the default layout's: a publisher on
        // a port of its own has a replay socket of its own, or none.
        let replay = match entry(&self.replay_endpoints, url).and_then(tcp_port) {
            Some((h, p)) => Some((h.to_owned(), p)),
            None if port == self.port => self.replay_port.map(|p| (host.clone(), p)),
            None => None,
        };
        (0..self.data_parallel_size)
            .map(|r| {
                let rank = r as u16;
                let publisher = format!("tcp://{host}:{}", port.saturating_add(rank));
                let replay = replay
                    .as_ref()
                    .map(|(h, p)| format!("tcp://{h}:{}", p.saturating_add(rank)));
                (publisher, replay)
            })
            .collect()
    }
}

/// The entry of `map` for the worker at `url` (its canonical spelling),
/// whichever spelling of it the entry was written in: the pool keeps a
/// worker's URL canonical (no trailing `/`, lower case, no default port),
/// so an entry written as in the workers list was otherwise never found,
/// and the worker was subscribed at its host's default port.
fn entry<'m>(map: &'m BTreeMap<String, String>, url: &str) -> Option<&'m str> {
    map.get(url)
        .or_else(|| {
            map.iter()
                .find(|(k, _)| WorkerUrl::canonical(k.trim()) == url)
                .map(|(_, v)| v)
        })
        .map(String::as_str)
}

/// An IPv6 literal in brackets, as an endpoint (or any `host:port`)
/// needs it.
pub(crate) fn bracketed(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

/// Whether `host` is a bind-to-all address, as in an engine's own
/// `endpoint` setting (`tcp://*:5557`): nothing to dial (`*`), or this
/// host itself (`0.0.0.0`, `::`), never the worker's.
fn is_wildcard(host: &str) -> bool {
    matches!(host, "*" | "0.0.0.0" | "[::]" | "::")
}

/// `tcp://HOST:PORT`'s host and port.
fn tcp_port(endpoint: &str) -> Option<(&str, u16)> {
    let rest = endpoint.strip_prefix("tcp://")?;
    let (host, port) = rest.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    (!host.is_empty() && port > 0).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry is found in any spelling of the worker's URL, and two
    /// entries for one worker are refused, not one of them dropped.
    #[test]
    fn endpoints_are_keyed_by_the_workers_canonical_url() {
        let mut c = KvEventsConfig::default();
        c.endpoints
            .insert("HTTP://Gpu-1:80/".into(), "tcp://10.0.0.5:6000".into());
        assert_eq!(
            c.endpoints_for("http://gpu-1", "gpu-1")[0].0,
            "tcp://10.0.0.5:6000"
        );
        c.validate().unwrap();
        c.endpoints
            .insert("http://gpu-1".into(), "tcp://10.0.0.5:6001".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("kv_events.endpoints"), "{e}");
        assert!(e.contains("same worker URL"), "{e}");
    }

    #[test]
    fn endpoints_follow_the_host_port_and_rank() {
        let c = KvEventsConfig {
            data_parallel_size: 2,
            replay_port: Some(5600),
            ..KvEventsConfig::default()
        };
        assert_eq!(
            c.endpoints_for("http://10.0.0.5:8000", "10.0.0.5"),
            vec![
                (
                    "tcp://10.0.0.5:5557".to_owned(),
                    Some("tcp://10.0.0.5:5600".to_owned())
                ),
                (
                    "tcp://10.0.0.5:5558".to_owned(),
                    Some("tcp://10.0.0.5:5601".to_owned())
                ),
            ]
        );
        assert_eq!(
            c.endpoints_for("http://[::1]:8000", "::1")[0].0,
            "tcp://[::1]:5557"
        );
        let mut c = KvEventsConfig::default();
        c.endpoints.insert(
            "http://127.0.0.1:9000".into(),
            "tcp://127.0.0.1:7000".into(),
        );
        assert_eq!(
            c.endpoints_for("http://127.0.0.1:9000", "127.0.0.1")[0].0,
            "tcp://127.0.0.1:7000"
        );
        // Another engine's replay socket is never a listed publisher's:
        // the shared replay port only where the publisher's port is the
        // default one, else the worker's own or none.
        c.replay_port = Some(5600);
        c.endpoints
            .insert("http://10.0.0.9:8000".into(), "tcp://10.0.0.7:5557".into());
        let replay = |c: &KvEventsConfig, url: &str| c.endpoints_for(url, "h")[0].1.clone();
        assert_eq!(replay(&c, "http://127.0.0.1:9000"), None);
        assert_eq!(
            replay(&c, "http://10.0.0.9:8000").as_deref(),
            Some("tcp://10.0.0.7:5600")
        );
        c.replay_endpoints.insert(
            "http://127.0.0.1:9000".into(),
            "tcp://127.0.0.1:7001".into(),
        );
        assert_eq!(
            replay(&c, "http://127.0.0.1:9000").as_deref(),
            Some("tcp://127.0.0.1:7001")
        );
    }

    #[test]
    fn bad_settings_name_their_key() {
        let err = |c: KvEventsConfig| c.validate().unwrap_err().to_string();
        let e = err(KvEventsConfig {
            data_parallel_size: 0,
            ..KvEventsConfig::default()
        });
        assert!(e.contains("kv_events.data_parallel_size"), "{e}");
        let e = err(KvEventsConfig {
            port: 65535,
            data_parallel_size: 2,
            ..KvEventsConfig::default()
        });
        assert!(e.contains("kv_events.port"), "{e}");
        let mut c = KvEventsConfig::default();
        c.endpoints.insert("http://w:1".into(), "udp://w:2".into());
        let e = err(c);
        assert!(e.contains("kv_events.endpoints"), "{e}");
        let mut c = KvEventsConfig::default();
        c.replay_endpoints
            .insert("http://w:1".into(), "tcp://w".into());
        let e = err(c);
        assert!(e.contains("kv_events.replay_endpoints"), "{e}");
        let e = err(KvEventsConfig {
            max_message_bytes: 65_535,
            ..KvEventsConfig::default()
        });
        assert!(e.contains("kv_events.max_message_bytes"), "{e}");
        assert!(e.contains("65535"), "{e}");
        assert!(KvEventsConfig::default().validate().is_ok());
    }

    /// The engine's own `endpoint` setting (`tcp://*:5557`) is where it
    /// binds, not where it is reached: taken as a worker's endpoint, it
    /// was dialled in vain forever (or, as `0.0.0.0`, reached this host).
    #[test]
    fn an_engines_bind_address_is_refused_as_its_endpoint() {
        for bind in ["tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557"] {
            for replay in [false, true] {
                let mut c = KvEventsConfig::default();
                let map = if replay {
                    &mut c.replay_endpoints
                } else {
                    &mut c.endpoints
                };
                map.insert("http://w:1".into(), bind.into());
                let e = c.validate().unwrap_err().to_string();
                assert!(e.contains("bind address"), "{bind}: {e}");
            }
        }
    }
}
