//! Agentic / tool-use sessions: a long shared prefix (tool definitions and
//! instructions), then many short steps whose context keeps growing.
//!
//! There are `agents` distinct prefixes of `prefix_tokens` tokens (each
//! session uses one, chosen from its id); a session opens with a task of
//! `task_tokens`, and after each reply (the model's "tool call") a tool
//! result of `step_tokens` is appended — as a user message, since not every
//! server accepts the `tool` role without tool-call ids — and, after a tool
//! time of mean `tool_ms`, the session steps again, `steps` times. The agent
//! prefix is the prefix group.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::conversation::{Conversations, Script};
use super::multi_turn::pause_ms;
use super::rng::{SplitMix64, key};
use super::shared_prefix::positive;
use super::{Message, Poll, Role, SessionId, TextShape, Workload};
use crate::SimError;

const PREFIX: u64 = 31;
const TASK: u64 = 32;
const RESULT: u64 = 33;
const TOOL_TIME: u64 = 34;
const PICK: u64 = 35;

/// Settings of [`Agentic`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgenticConfig {
    /// Distinct agent prefixes (tools + instructions).
    pub agents: u64,
    /// Sessions in all (0 = as many as the driver asks for).
    pub sessions: u64,
    /// Length of each agent prefix, tokens.
    pub prefix_tokens: u64,
    /// Length of a session's opening task, tokens.
    pub task_tokens: u64,
    /// Length of each tool result, tokens.
    pub step_tokens: u64,
    /// Requests per session.
    pub steps: u32,
    /// Tokens to generate per step (the tool call).
    pub output_tokens: u32,
    /// Mean tool execution time between steps, ms.
    pub tool_ms: f64,
}

impl Default for AgenticConfig {
    fn default() -> Self {
        Self {
            agents: 4,
            sessions: 0,
            prefix_tokens: 4096,
            task_tokens: 96,
            step_tokens: 64,
            steps: 8,
            output_tokens: 32,
            tool_ms: 100.0,
        }
    }
}

impl AgenticConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), SimError> {
        positive("agents", self.agents)?;
        positive("prefix_tokens", self.prefix_tokens)?;
        positive("task_tokens", self.task_tokens)?;
        positive("step_tokens", self.step_tokens)?;
        positive("steps", u64::from(self.steps))?;
        positive("output_tokens", u64::from(self.output_tokens))?;
        pause_ms("tool_ms", self.tool_ms)
    }
}

#[derive(Debug)]
struct AgentScript {
    cfg: AgenticConfig,
    seed: u64,
    shape: TextShape,
    prefixes: Vec<String>,
}

impl Script for AgentScript {
    fn open(&self, session: SessionId) -> (u64, Vec<Message>) {
        let agent = key(self.seed, &[PICK, session]) % self.cfg.agents;
        let task = self
            .shape
            .tokens(key(self.seed, &[TASK, session]), self.cfg.task_tokens);
        let msgs = vec![
            Message::new(Role::System, self.prefixes[agent as usize].clone()),
            Message::new(Role::User, task),
        ];
        (agent, msgs)
    }

    fn follow_up(&self, session: SessionId, turn: u32) -> Message {
        let mut text = String::from("Tool result: ");
        text.push_str(&self.shape.tokens(
            key(self.seed, &[RESULT, session, u64::from(turn)]),
            self.cfg.step_tokens,
        ));
        Message::new(Role::User, text)
    }

    fn pause(&self, session: SessionId, turn: u32) -> Duration {
        let mut rng = SplitMix64::new(key(self.seed, &[TOOL_TIME, session, u64::from(turn)]));
        Duration::from_secs_f64(rng.exp(self.cfg.tool_ms) / 1000.0)
    }

    fn turns(&self) -> u32 {
        self.cfg.steps
    }

    fn max_tokens(&self) -> u32 {
        self.cfg.output_tokens
    }
}

/// The agentic workload.
#[derive(Debug)]
pub struct Agentic {
    inner: Conversations<AgentScript>,
}

impl Agentic {
    /// Builds the workload (validates `cfg`).
    pub fn new(cfg: AgenticConfig, seed: u64, shape: TextShape) -> Result<Self, SimError> {
        cfg.validate()?;
        let prefixes = (0..cfg.agents)
            .map(|a| shape.tokens(key(seed, &[PREFIX, a]), cfg.prefix_tokens))
            .collect();
        let limit = cfg.sessions;
        Ok(Self {
            inner: Conversations::new(
                AgentScript {
                    cfg,
                    seed,
                    shape,
                    prefixes,
                },
                limit,
            ),
        })
    }
}

impl Workload for Agentic {
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
