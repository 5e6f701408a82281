//! Multi-turn chat: conversations that grow turn by turn with the real
//! replies.
//!
//! Every conversation starts with one system prompt shared by all
//! conversations (`system_tokens`, 0 for none) and a user message of
//! `user_tokens`; after each reply the reply and a new user message are
//! appended and, after an exponentially distributed think time of mean
//! `think_ms`, the whole conversation is sent again, for `turns` turns. The
//! conversation is its own prefix group: keeping it on one worker makes each
//! turn hit the cache of the previous one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::conversation::{Conversations, Script};
use super::rng::{SplitMix64, key};
use super::shared_prefix::positive;
use super::{Message, Poll, Role, SessionId, TextShape, Workload};
use crate::SimError;

const SYSTEM: u64 = 21;
const USER: u64 = 22;
const THINK: u64 = 23;

/// Settings of [`MultiTurn`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MultiTurnConfig {
    /// Conversations in all (0 = as many as the driver asks for).
    pub conversations: u64,
    /// Requests per conversation.
    pub turns: u32,
    /// Length of the system prompt shared by every conversation, tokens.
    pub system_tokens: u64,
    /// Length of each user message, tokens.
    pub user_tokens: u64,
    /// Tokens to generate per reply.
    pub output_tokens: u32,
    /// Mean think time between a reply and the next user message, ms.
    pub think_ms: f64,
}

impl Default for MultiTurnConfig {
    fn default() -> Self {
        Self {
            conversations: 0,
            turns: 6,
            system_tokens: 256,
            user_tokens: 96,
            output_tokens: 128,
            think_ms: 500.0,
        }
    }
}

impl MultiTurnConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), SimError> {
        positive("turns", u64::from(self.turns))?;
        positive("user_tokens", self.user_tokens)?;
        positive("output_tokens", u64::from(self.output_tokens))?;
        pause_ms("think_ms", self.think_ms)
    }
}

/// The longest mean pause, ms: a day. Pauses are exponential draws made
/// `Duration`s, which a mean near `f64::MAX` overflows.
const MAX_PAUSE_MS: f64 = 86_400_000.0;

/// Checks a mean pause between turns, ms: in 0..=a day.
pub(super) fn pause_ms(name: &str, v: f64) -> Result<(), SimError> {
    if !(0.0..=MAX_PAUSE_MS).contains(&v) {
        return Err(SimError::Config(format!(
            "{name} must be in 0..={MAX_PAUSE_MS} milliseconds (a day), got {v}"
        )));
    }
    Ok(())
}

#[derive(Debug)]
struct ChatScript {
    cfg: MultiTurnConfig,
    seed: u64,
    shape: TextShape,
    system: Option<String>,
}

impl Script for ChatScript {
    fn open(&self, session: SessionId) -> (u64, Vec<Message>) {
        let mut msgs = Vec::with_capacity(2);
        if let Some(sys) = &self.system {
            msgs.push(Message::new(Role::System, sys.clone()));
        }
        msgs.push(self.follow_up(session, 0));
        (session, msgs)
    }

    fn follow_up(&self, session: SessionId, turn: u32) -> Message {
        let text = self.shape.tokens(
            key(self.seed, &[USER, session, u64::from(turn)]),
            self.cfg.user_tokens,
        );
        Message::new(Role::User, text)
    }

    fn pause(&self, session: SessionId, turn: u32) -> Duration {
        let mut rng = SplitMix64::new(key(self.seed, &[THINK, session, u64::from(turn)]));
        Duration::from_secs_f64(rng.exp(self.cfg.think_ms) / 1000.0)
    }

    fn turns(&self) -> u32 {
        self.cfg.turns
    }

    fn max_tokens(&self) -> u32 {
        self.cfg.output_tokens
    }
}

/// The multi-turn chat workload.
#[derive(Debug)]
pub struct MultiTurn {
    inner: Conversations<ChatScript>,
}

impl MultiTurn {
    /// Builds the workload (validates `cfg`).
    pub fn new(cfg: MultiTurnConfig, seed: u64, shape: TextShape) -> Result<Self, SimError> {
        cfg.validate()?;
        let system =
            (cfg.system_tokens > 0).then(|| shape.tokens(key(seed, &[SYSTEM]), cfg.system_tokens));
        let limit = cfg.conversations;
        Ok(Self {
            inner: Conversations::new(
                ChatScript {
                    cfg,
                    seed,
                    shape,
                    system,
                },
                limit,
            ),
        })
    }

    /// The settings.
    pub fn config(&self) -> &MultiTurnConfig {
        &self.inner.script().cfg
    }
}

impl Workload for MultiTurn {
    fn next(&mut self, now: Duration) -> Poll {
        self.inner.next(now)
    }

    fn on_reply(&mut self, session: SessionId, reply: &str, now: Duration) {
        self.inner.on_reply(session, reply, now);
    }

    fn on_failure(&mut self, session: SessionId, _now: Duration) {
        self.inner.on_failure(session);
    }
}
