//! Prefill/decode disaggregation: the worker as a prefill or a decode
//! worker of a PD pair, in both engines' protocols.
//!
//! - SGLang (bootstrap): the router sends the same body, plus
//!   `bootstrap_host`, `bootstrap_port` and `bootstrap_room` (arrays for a
//!   `/generate` batch), to a prefill and a decode worker at once. The
//!   prefill worker computes the prompt and holds its KV under the room;
//!   the decode worker pulls it from the prefill's bootstrap server.
//! - vLLM (NIXL-style two steps): the router first sends the request to a
//!   prefill worker with `kv_transfer_params.do_remote_decode: true`; the
//!   answer carries `kv_transfer_params` naming where the KV is held
//!   (`remote_host`, `remote_port`, `remote_request_id`), which the router
//!   passes to a decode worker in step two.
//!
//! The wire between the two workers is real loopback HTTP: the prefill
//! worker answers `GET /kv/{room}` (long-poll, bounded by the hold timeout)
//! on its bootstrap listener and on its HTTP port (`rooms.rs`); the decode
//! worker pulls it, bounded by its transfer timeout, then waits the time
//! the KV would take to move (`tokens × kv_bytes_per_token / bandwidth`)
//! and decodes with the whole prompt cached (`pull.rs`). Which part a
//! request plays is read from its body (`fields.rs`): the role only says
//! which fields a worker acts on; a request without them is served as a
//! regular worker serves it (the router's prefill-skip path).

mod fields;
mod pull;
mod rooms;

use serde::{Deserialize, Serialize};

use crate::error::SimError;

pub(crate) use fields::{Part, plan};
pub(crate) use pull::{PullClient, Source, transfer};
pub(crate) use rooms::{RoomGuard, Rooms, kv_handler};

/// What a worker does in a prefill/decode pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefill and decode on the same worker (no disaggregation).
    #[default]
    Regular,
    /// Computes prompts and holds their KV for decode workers to pull.
    Prefill,
    /// Pulls prompts' KV from prefill workers and decodes.
    Decode,
}

/// KV bytes per token of the default model, Llama-3-8B in BF16: 2 (K, V)
/// × 32 layers × 8 KV heads × 128 dims × 2 bytes (the same figure the
/// engine's default capacity comes from).
pub const DEFAULT_KV_BYTES_PER_TOKEN: u64 = 131_072;

/// Default KV transfer bandwidth, bytes per second: one 400 Gb/s NIC
/// (InfiniBand NDR / ConnectX-7, one per GPU in an 8-GPU H100 server),
/// 50 GB/s, taken as fully used.
pub const DEFAULT_TRANSFER_BANDWIDTH: f64 = 50e9;

/// The PD settings of one worker (`WorkerConfig.pd`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PdConfig {
    /// The worker's role.
    pub role: Role,
    /// Prefill: also serve the KV pull endpoint on this port (0 = a free
    /// one); worker i of `--count` uses port + i. None: only on the HTTP
    /// port.
    pub bootstrap_port: Option<u16>,
    /// Decode: the bootstrap port to pull from when a request's
    /// `bootstrap_port` is null. None: such a request is refused.
    pub default_bootstrap_port: Option<u16>,
    /// Decode: KV transfer bandwidth in bytes per second.
    pub transfer_bandwidth: f64,
    /// Decode: KV bytes per prompt token moved.
    pub kv_bytes_per_token: u64,
    /// Decode: how long to wait for the prefill's KV to be ready and
    /// answered, in milliseconds.
    pub transfer_timeout_ms: u64,
    /// Prefill: how long ready KV is held for a pull that does not come,
    /// and how long one pull waits for its room, in milliseconds.
    pub hold_timeout_ms: u64,
}

impl Default for PdConfig {
    fn default() -> Self {
        Self {
            role: Role::Regular,
            bootstrap_port: None,
            default_bootstrap_port: None,
            transfer_bandwidth: DEFAULT_TRANSFER_BANDWIDTH,
            kv_bytes_per_token: DEFAULT_KV_BYTES_PER_TOKEN,
            transfer_timeout_ms: 30_000,
            hold_timeout_ms: 60_000,
        }
    }
}

/// The longest accepted timeout.
const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// Least and most transfer bandwidth accepted, bytes per second (1 MB/s,
/// 100 TB/s). With at most [`MAX_KV_BYTES_PER_TOKEN`], a transfer's time
/// is a `Duration` for any prompt a worker holds.
pub const TRANSFER_BANDWIDTH_RANGE: (f64, f64) = (1e6, 1e14);

/// The most KV bytes per token accepted (1 GiB).
pub const MAX_KV_BYTES_PER_TOKEN: u64 = 1 << 30;

impl PdConfig {
    /// Checks ranges and that each setting suits the role.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Config(m));
        let (least, most) = TRANSFER_BANDWIDTH_RANGE;
        if !(least..=most).contains(&self.transfer_bandwidth) {
            return bad(format!(
                "pd.transfer_bandwidth must be in {least}..={most} bytes per second, got {}",
                self.transfer_bandwidth
            ));
        }
        if !(1..=MAX_KV_BYTES_PER_TOKEN).contains(&self.kv_bytes_per_token) {
            return bad(format!(
                "pd.kv_bytes_per_token must be in 1..={MAX_KV_BYTES_PER_TOKEN}, got {}",
                self.kv_bytes_per_token
            ));
        }
        for (name, v) in [
            ("transfer_timeout_ms", self.transfer_timeout_ms),
            ("hold_timeout_ms", self.hold_timeout_ms),
        ] {
            if !(1..=MAX_TIMEOUT_MS).contains(&v) {
                return bad(format!(
                    "pd.{name} must be in 1..={MAX_TIMEOUT_MS} (one hour), got {v}"
                ));
            }
        }
        if self.bootstrap_port.is_some() && self.role != Role::Prefill {
            return bad(
                "pd.bootstrap_port (--bootstrap-port) is for prefill workers (--role prefill)"
                    .into(),
            );
        }
        if self.default_bootstrap_port.is_some() && self.role != Role::Decode {
            return bad(
                "pd.default_bootstrap_port (--default-bootstrap-port) is for decode workers (--role decode)"
                    .into(),
            );
        }
        if self.default_bootstrap_port == Some(0) {
            return bad("pd.default_bootstrap_port must be a port, not 0".into());
        }
        Ok(())
    }

    /// The settings of worker `i` of a group: a bootstrap port moves up by
    /// the index (0 stays 0: each picks a free one).
    pub fn for_worker(&self, i: u16) -> Result<Self, SimError> {
        let mut c = self.clone();
        if let Some(p) = c.bootstrap_port.filter(|&p| p != 0) {
            c.bootstrap_port = Some(p.checked_add(i).ok_or_else(|| {
                SimError::Config(format!(
                    "--bootstrap-port {p} + worker {i} runs past port 65535"
                ))
            })?);
        }
        Ok(c)
    }

    /// The simulated time `tokens` of KV take to move.
    pub fn transfer_time(&self, tokens: usize) -> std::time::Duration {
        std::time::Duration::from_secs_f64(
            tokens as f64 * self.kv_bytes_per_token as f64 / self.transfer_bandwidth,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_time_is_proportional_to_tokens() {
        let c = PdConfig::default();
        // 1,000 tokens of 131,072 B at 50 GB/s: 2.62 ms.
        let t = c.transfer_time(1000).as_secs_f64();
        assert!((t - 0.002_621_44).abs() < 1e-9, "{t}");
        assert_eq!(c.transfer_time(2000), c.transfer_time(1000) * 2);
        assert_eq!(c.transfer_time(0), std::time::Duration::ZERO);
    }

    #[test]
    fn settings_must_suit_the_role_and_ranges() {
        let ok = PdConfig {
            role: Role::Prefill,
            bootstrap_port: Some(8998),
            ..PdConfig::default()
        };
        ok.validate().unwrap();
        assert_eq!(ok.for_worker(2).unwrap().bootstrap_port, Some(9000));
        let free = PdConfig {
            bootstrap_port: Some(0),
            ..ok.clone()
        };
        assert_eq!(free.for_worker(3).unwrap().bootstrap_port, Some(0));
        let wrong_role = PdConfig {
            role: Role::Decode,
            ..ok.clone()
        };
        let e = wrong_role.validate().unwrap_err().to_string();
        assert!(e.contains("--role prefill"), "{e}");
        for bad in [
            PdConfig {
                transfer_bandwidth: 0.0,
                ..PdConfig::default()
            },
            PdConfig {
                transfer_bandwidth: f64::NAN,
                ..PdConfig::default()
            },
            PdConfig {
                kv_bytes_per_token: 0,
                ..PdConfig::default()
            },
            // A transfer's time overflowed a `Duration`: the decode worker
            // panicked on its first request.
            PdConfig {
                transfer_bandwidth: 1e-300,
                ..PdConfig::default()
            },
            PdConfig {
                kv_bytes_per_token: u64::MAX,
                ..PdConfig::default()
            },
            PdConfig {
                transfer_timeout_ms: 0,
                ..PdConfig::default()
            },
            PdConfig {
                default_bootstrap_port: Some(8998),
                ..PdConfig::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let high = PdConfig {
            bootstrap_port: Some(65535),
            ..ok
        };
        assert!(high.for_worker(1).is_err());
    }
}
