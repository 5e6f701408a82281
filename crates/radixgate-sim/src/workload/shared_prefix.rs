//! Shared-prefix groups: many prompts share one of a few long system prompts.
//!
//! Group `g` has a system prompt of `system_tokens` tokens; each request is
//! that system prompt plus one of `prompts_per_group` questions of
//! `question_tokens` tokens. Groups are drawn with Zipf skew `zipf` (0 =
//! uniform); within a group the questions are taken in turn, so a prompt
//! repeats only after all of its group's questions were sent. Every request
//! is its own session. This is the workload where the prefix-aware routing
//! wins most: a worker that holds group `g`'s system prompt skips its prefill.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rng::{SplitMix64, key};
use super::{Message, Poll, Prompt, RequestSpec, Role, SessionId, TextShape, Workload, Zipf};
use crate::SimError;

const SYSTEM: u64 = 1;
const QUESTION: u64 = 2;
const PICK: u64 = 3;

/// Settings of [`SharedPrefix`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedPrefixConfig {
    /// Number of prefix groups.
    pub groups: u64,
    /// Distinct questions per group.
    pub prompts_per_group: u64,
    /// Length of each group's system prompt, tokens.
    pub system_tokens: u64,
    /// Length of each question, tokens.
    pub question_tokens: u64,
    /// Tokens to generate per request.
    pub output_tokens: u32,
    /// Zipf exponent over groups (0 = uniform).
    pub zipf: f64,
}

impl Default for SharedPrefixConfig {
    fn default() -> Self {
        Self {
            groups: 16,
            prompts_per_group: 64,
            system_tokens: 2048,
            question_tokens: 128,
            output_tokens: 64,
            zipf: 0.0,
        }
    }
}

impl SharedPrefixConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), SimError> {
        positive("groups", self.groups)?;
        positive("prompts_per_group", self.prompts_per_group)?;
        positive("output_tokens", u64::from(self.output_tokens))?;
        if self.system_tokens + self.question_tokens == 0 {
            return Err(SimError::Config(
                "shared-prefix: system_tokens + question_tokens must be > 0".into(),
            ));
        }
        zipf_exponent(self.zipf)
    }
}

pub(super) fn positive(name: &str, v: u64) -> Result<(), SimError> {
    if v == 0 {
        return Err(SimError::Config(format!("{name} must be > 0")));
    }
    Ok(())
}

pub(super) fn zipf_exponent(s: f64) -> Result<(), SimError> {
    if !s.is_finite() || !(0.0..=10.0).contains(&s) {
        return Err(SimError::Config(format!(
            "zipf exponent must be in 0..=10, got {s}"
        )));
    }
    Ok(())
}

/// The shared-prefix workload.
#[derive(Debug)]
pub struct SharedPrefix {
    cfg: SharedPrefixConfig,
    seed: u64,
    shape: TextShape,
    zipf: Zipf,
    rng: SplitMix64,
    next_question: Vec<u64>,
    seq: u64,
}

impl SharedPrefix {
    /// Builds the workload (validates `cfg`).
    pub fn new(cfg: SharedPrefixConfig, seed: u64, shape: TextShape) -> Result<Self, SimError> {
        cfg.validate()?;
        Ok(Self {
            zipf: Zipf::new(cfg.groups, cfg.zipf),
            rng: SplitMix64::new(key(seed, &[PICK])),
            next_question: vec![0; cfg.groups as usize],
            cfg,
            seed,
            shape,
            seq: 0,
        })
    }

    /// The system prompt of group `g`.
    pub fn system_prompt(&self, g: u64) -> String {
        self.shape
            .tokens(key(self.seed, &[SYSTEM, g]), self.cfg.system_tokens)
    }
}

impl Workload for SharedPrefix {
    fn next(&mut self, _now: Duration) -> Poll {
        let g = self.zipf.sample(&mut self.rng);
        let q = self.next_question[g as usize];
        self.next_question[g as usize] = (q + 1) % self.cfg.prompts_per_group;
        let question = self
            .shape
            .tokens(key(self.seed, &[QUESTION, g, q]), self.cfg.question_tokens);
        let mut messages = Vec::with_capacity(2);
        if self.cfg.system_tokens > 0 {
            messages.push(Message::new(Role::System, self.system_prompt(g)));
        }
        messages.push(Message::new(Role::User, question));
        let seq = self.seq;
        self.seq += 1;
        Poll::Ready(RequestSpec {
            seq,
            session: seq,
            group: g,
            arrival: None,
            prompt: Prompt::Chat(messages),
            max_tokens: self.cfg.output_tokens,
            wants_reply: false,
        })
    }

    fn on_reply(&mut self, _session: SessionId, _reply: &str, _now: Duration) {}

    fn on_failure(&mut self, _session: SessionId, _now: Duration) {}
}
