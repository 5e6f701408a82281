//! The worker model's configuration: cache geometry, batching limits and
//! the timing model, with defaults for Llama-3-8B (BF16) on one H100 SXM.
//!
//! Where the defaults come from (see `crates/radixgate-sim/README.md`,
//! "Defaults and their sources", for the arithmetic):
//! - KV bytes per token of Llama-3-8B: 2 (K and V) x 32 layers x 8 KV heads
//!   x 128 head dim x 2 bytes = 131,072 B (model configuration published
//!   with the weights);
//! - H100 SXM: 80 GB HBM3 at 3.35 TB/s, 989 TFLOPS dense BF16 (NVIDIA's
//!   H100 datasheet);
//! - capacity: ~0.88 of 80 GB minus 16 GB of weights leaves ~54 GB, i.e.
//!   ~400k tokens of KV;
//! - a forward pass reads all weights once (16 GB / 3.35 TB/s = 4.8 ms):
//!   the fixed step cost; each batched token costs 2 x 8B FLOPs (16 GFLOP),
//!   27 us at an assumed 60% of peak; each decoding sequence reads its whole
//!   KV per step, 131,072 B / 3.35 TB/s = 39 ns per context token;
//! - 256 running requests and 8,192 batched tokens per step are the
//!   serving engines' usual defaults (vLLM `max_num_seqs`, SGLang/vLLM
//!   chunked-prefill sizes).

use serde::{Deserialize, Serialize};

use crate::error::SimError;

/// Cache and batching settings of one simulated worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Tokens per KV page (block).
    pub block_size: usize,
    /// KV capacity in tokens (rounded down to whole blocks).
    pub kv_capacity_tokens: usize,
    /// Most requests in the running batch at once.
    pub max_running_requests: usize,
    /// Token budget of one step: prefill tokens plus one per decoding request.
    pub max_batch_tokens: usize,
    /// The timing model.
    pub timing: TimingConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            block_size: 16,
            kv_capacity_tokens: 400_000,
            max_running_requests: 256,
            max_batch_tokens: 8192,
            timing: TimingConfig::default(),
        }
    }
}

impl EngineConfig {
    /// Checks ranges and consistency; a clear message per bad value.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Config(m));
        if !(1..=4096).contains(&self.block_size) {
            return bad(format!(
                "block_size must be in 1..=4096, got {}",
                self.block_size
            ));
        }
        if self.kv_capacity_tokens < self.block_size {
            return bad(format!(
                "kv_capacity_tokens ({}) must hold at least one block of {} tokens",
                self.kv_capacity_tokens, self.block_size
            ));
        }
        if self.kv_capacity_tokens / self.block_size > u32::MAX as usize / 2 {
            return bad("kv_capacity_tokens is too large".into());
        }
        if self.max_running_requests == 0 {
            return bad("max_running_requests must be at least 1".into());
        }
        if self.max_batch_tokens < self.max_running_requests {
            return bad(format!(
                "max_batch_tokens ({}) must be at least max_running_requests ({}): every running request decodes one token per step",
                self.max_batch_tokens, self.max_running_requests
            ));
        }
        self.timing.validate()
    }

    /// Capacity in whole blocks.
    pub fn capacity_blocks(&self) -> usize {
        self.kv_capacity_tokens / self.block_size
    }

    /// Tokens the cache holds in whole blocks: what the worker reports as
    /// SGLang's `max_total_num_tokens`.
    pub fn capacity_tokens(&self) -> usize {
        self.capacity_blocks() * self.block_size
    }
}

/// How long one engine step takes:
/// `(step_base_us + token_us * (prefill_tokens + decode_seqs) +
/// kv_read_ns_per_token * context_tokens_of_decoding_seqs / 1000) / speed`.
///
/// `speed` scales a whole worker (1 = the hardware the constants describe;
/// 0.5 = a worker at half speed, e.g. an older GPU in a newer pool), so a
/// heterogeneous pool is one constant per worker rather than three.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimingConfig {
    /// Fixed cost of a forward pass (reading the weights once), microseconds.
    pub step_base_us: f64,
    /// Compute per batched token (prefill or decode), microseconds.
    pub token_us: f64,
    /// KV read per context token of each decoding sequence, nanoseconds.
    pub kv_read_ns_per_token: f64,
    /// Relative speed of this worker: every step's duration is divided by
    /// it. In 0.001..=100; 1 is the default.
    pub speed: f64,
}

/// The largest accepted `speed` (a worker 100 times faster than the model).
pub const MAX_SPEED: f64 = 100.0;

/// The smallest accepted `speed` (a worker 1000 times slower). Simulated
/// time is stepped through (the load poll, every 100 ms): a speed near 0
/// makes a step last centuries, and the run never ends.
pub const MIN_SPEED: f64 = 1e-3;

/// The largest accepted timing constants: `step_base_us` (a second),
/// `token_us` (10 ms) and `kv_read_ns_per_token` (0.1 ms), each hundreds
/// of times the H100 figures. The simulators step through simulated time
/// (a load poll every 100 ms): with no ceiling, `1e300` made a step last
/// `u64::MAX` nanoseconds and a run never ended.
pub const MAX_TIMING: [(&str, f64); 3] = [
    ("step_base_us", 1e6),
    ("token_us", 1e4),
    ("kv_read_ns_per_token", 1e5),
];

impl Default for TimingConfig {
    fn default() -> Self {
        Self {
            step_base_us: 4_800.0,
            token_us: 27.0,
            kv_read_ns_per_token: 39.0,
            speed: 1.0,
        }
    }
}

impl TimingConfig {
    /// Every constant in 0..=its [`MAX_TIMING`]; `speed` in 0.001..=100.
    pub fn validate(&self) -> Result<(), SimError> {
        check_speed("timing.speed", self.speed)?;
        let values = [self.step_base_us, self.token_us, self.kv_read_ns_per_token];
        for ((name, max), v) in MAX_TIMING.into_iter().zip(values) {
            if !(0.0..=max).contains(&v) {
                return Err(SimError::Config(format!(
                    "timing.{name} must be in 0..={max}, got {v}"
                )));
            }
        }
        Ok(())
    }

    /// Duration of a step with this much work.
    pub fn step_duration(
        &self,
        prefill_tokens: usize,
        decode_seqs: usize,
        decode_context_tokens: usize,
    ) -> std::time::Duration {
        let us = self.step_base_us
            + self.token_us * (prefill_tokens + decode_seqs) as f64
            + self.kv_read_ns_per_token * decode_context_tokens as f64 / 1000.0;
        std::time::Duration::from_nanos((self.scaled_us(us) * 1000.0).round() as u64)
    }

    /// `us` of work at speed 1 as this worker's time, microseconds (for
    /// predictions made outside the engine).
    pub fn scaled_us(&self, us: f64) -> f64 {
        us / self.speed
    }
}

/// Checks a worker speed given as `what`: finite and in 0.001..=100.
pub fn check_speed(what: &str, speed: f64) -> Result<(), SimError> {
    if (MIN_SPEED..=MAX_SPEED).contains(&speed) {
        Ok(())
    } else {
        Err(SimError::Config(format!(
            "{what} must be in {MIN_SPEED}..={MAX_SPEED} (1 = full speed, 0.5 = half), got {speed}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn speed_divides_every_step_and_is_validated() {
        let full = TimingConfig::default();
        let half = TimingConfig {
            speed: 0.5,
            ..TimingConfig::default()
        };
        let fast = TimingConfig {
            speed: 4.0,
            ..TimingConfig::default()
        };
        for (prefill, decode, context) in [(0, 1, 100), (2000, 0, 0), (500, 64, 128_000)] {
            let d = full.step_duration(prefill, decode, context);
            assert!(d > Duration::ZERO);
            let nanos =
                |t: &TimingConfig| t.step_duration(prefill, decode, context).as_nanos() as i128;
            let d = d.as_nanos() as i128;
            // Within rounding to whole nanoseconds.
            assert!(
                (nanos(&half) - 2 * d).abs() <= 2,
                "{} vs 2 x {d}",
                nanos(&half)
            );
            assert!(
                (nanos(&fast) - d / 4).abs() <= 1,
                "{} vs {d} / 4",
                nanos(&fast)
            );
        }
        assert_eq!(half.scaled_us(10.0), 20.0);
        assert!(full.validate().is_ok() && half.validate().is_ok());
        for bad in [0.0, -1.0, 100.5, f64::NAN, f64::INFINITY] {
            let t = TimingConfig {
                speed: bad,
                ..TimingConfig::default()
            };
            let e = t.validate().unwrap_err().to_string();
            assert!(e.contains("timing.speed"), "{e}");
        }
        assert!(check_speed("x", MAX_SPEED).is_ok());
        // A JSON config without `speed` gets full speed.
        let t: TimingConfig = serde_json::from_str(r#"{"token_us": 5.0}"#).unwrap();
        assert_eq!(t.speed, 1.0);
    }

    /// A step time of 1e300 passed the finite and `>= 0` check, made each
    /// step last `u64::MAX` ns of simulated time, and `simulate
    /// --step-base-us 1e300` (or `--token-us`, `--kv-read-ns-per-token`)
    /// hung.
    #[test]
    fn timing_constants_have_a_ceiling() {
        for (name, max) in MAX_TIMING {
            let with = |v: f64| {
                let mut t = TimingConfig::default();
                match name {
                    "step_base_us" => t.step_base_us = v,
                    "token_us" => t.token_us = v,
                    _ => t.kv_read_ns_per_token = v,
                }
                t.validate()
            };
            for bad in [1e300, max * 1.01, f64::INFINITY, f64::NAN, -1.0] {
                let e = with(bad).unwrap_err().to_string();
                assert!(e.contains(name), "{name} = {bad}: {e}");
            }
            assert!(with(max).is_ok() && with(0.0).is_ok(), "{name}");
        }
    }

    /// A speed of 1e-300 passed the `> 0` check and made each step last
    /// centuries of simulated time: `simulate --speed 1e-300` hung.
    #[test]
    fn speed_has_a_floor() {
        for bad in [1e-300, 0.0009] {
            let e = check_speed("--speed", bad).unwrap_err().to_string();
            assert!(e.contains("--speed") && e.contains("0.001"), "{bad}: {e}");
        }
        assert!(check_speed("--speed", 0.001).is_ok());
    }
}
