//! The `pd:` section: prefill/decode disaggregation (`proxy/pd.rs`,
//! `docs/pd.md`).
//!
//! The workers themselves are listed where all workers are (`workers:`,
//! `--prefill`, `--decode`, `POST /workers`), each with its `role`; this
//! section says that the pool is disaggregated, which engine protocol
//! moves the KV cache, how decode workers are chosen, and when a request
//! skips the prefill pool. The prefill pool is routed by `routing:`.

use super::{ConfigError, invalid};
use radixgate_routing::{PolicyConfig, PowerOfTwoConfig, RoutingError};
use serde::{Deserialize, Serialize};

/// How the KV cache gets from the prefill worker to the decode worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum PdProtocol {
    /// SGLang: the request goes to both workers at once, carrying the
    /// prefill worker's `bootstrap_host`/`bootstrap_port` and a fresh
    /// `bootstrap_room`; decode pulls the KV through the bootstrap server.
    #[default]
    Sglang,
    /// vLLM (NIXL-style connectors): prefill first with
    /// `kv_transfer_params.do_remote_decode` and `max_tokens: 1`, then decode
    /// with the `kv_transfer_params` prefill returned.
    Vllm,
}

impl PdProtocol {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sglang => "sglang",
            Self::Vllm => "vllm",
        }
    }
}

/// Prefill/decode disaggregation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PdConfig {
    /// Serve a disaggregated pool (`--pd-disaggregation`): every worker is
    /// `role: prefill` or `role: decode`, and each request goes to one of
    /// each. Off: every worker is regular.
    pub enabled: bool,
    /// The engines' KV-transfer protocol (`--pd-protocol`).
    pub protocol: PdProtocol,
    /// How a decode worker is chosen (`--decode-policy`), a section like
    /// `routing:` with its `policy:` key. Default power_of_two: decode
    /// time is set by a worker's running batch, not by its prefix cache,
    /// and two random choices keep several router replicas from piling
    /// onto the same least-loaded worker. Written with nothing under it,
    /// that default.
    #[serde(deserialize_with = "decode_section")]
    pub decode_policy: PolicyConfig,
    /// Send a request to its decode worker alone, skipping the prefill
    /// pool, when that worker is predicted to hold all but at most this
    /// many of the prompt's tokens (`--pd-skip-prefill-tokens`); 0 = never.
    /// vLLM only: SGLang's decode server takes no request without its
    /// prefill's bootstrap room, so under SGLang every request is paired.
    /// A whole prompt that short goes to decode alone too.
    /// The prediction is the decode pool's prefix record (every prompt a
    /// decode worker generated from is in its cache), converted to tokens
    /// at the model's learned characters per token. Default 32: two pages
    /// of 16 tokens, a prefill decode runs in about one decode step. Pays
    /// off with a prefix-aware `decode_policy` (cache_aware), which sends a
    /// conversation's next turn back to the decode worker that holds it.
    pub skip_prefill_max_uncached_tokens: usize,
}

/// Decode's default policy (see [`PdConfig::decode_policy`]).
fn default_decode_policy() -> PolicyConfig {
    PolicyConfig::PowerOfTwo(PowerOfTwoConfig::default())
}

/// `decode_policy:` as written; with nothing under it (YAML's null: every
/// key commented out, a chart's empty value), decode's default, as for
/// the key left out, not the routing default `PolicyConfig` has.
fn decode_section<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PolicyConfig, D::Error> {
    Option::<PolicyConfig>::deserialize(d).map(|p| p.unwrap_or_else(default_decode_policy))
}

impl Default for PdConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            protocol: PdProtocol::Sglang,
            decode_policy: default_decode_policy(),
            skip_prefill_max_uncached_tokens: 32,
        }
    }
}

impl PdConfig {
    /// Checks the section; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // Named as in the file, as `routing:`'s keys are
        // (`Config::validate`): `pd.decode_policy.cache_threshold`.
        self.decode_policy.validate().map_err(|e| match e {
            RoutingError::InvalidConfig { field, reason } => ConfigError::InvalidIn {
                section: "pd.decode_policy",
                field,
                reason,
            },
            other => invalid("pd.decode_policy", other.to_string()),
        })?;
        if self.skip_prefill_max_uncached_tokens > MAX_SKIP_TOKENS {
            return Err(invalid(
                "pd.skip_prefill_max_uncached_tokens",
                format!(
                    "must be at most {MAX_SKIP_TOKENS} tokens, got {}",
                    self.skip_prefill_max_uncached_tokens
                ),
            ));
        }
        Ok(())
    }
}

/// Largest skip threshold: beyond a few thousand tokens, decode would run
/// a long prefill itself, which is what disaggregation is there to avoid.
pub const MAX_SKIP_TOKENS: usize = 1 << 16;
