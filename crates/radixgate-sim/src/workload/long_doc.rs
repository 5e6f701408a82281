//! Long-document QA: a few long documents, many short questions about them.
//!
//! Each request is one user message holding document `d` (of
//! `document_tokens` tokens) followed by a fresh question of
//! `question_tokens` tokens; documents are drawn with Zipf skew `zipf`. The
//! document is the shared prefix: a worker that already prefilled it answers
//! the question almost at once, one that did not pays for the whole document.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::rng::{SplitMix64, key};
use super::shared_prefix::{positive, zipf_exponent};
use super::text::append_filler;
use super::{Message, Poll, Prompt, RequestSpec, Role, SessionId, TextShape, Workload, Zipf};
use crate::SimError;

const DOCUMENT: u64 = 11;
const QUESTION: u64 = 12;
const PICK: u64 = 13;
const INSTRUCTIONS: &str = "Answer the question using only the document above.\nQuestion: ";

/// Settings of [`LongDoc`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LongDocConfig {
    /// Number of documents.
    pub documents: u64,
    /// Length of each document, tokens.
    pub document_tokens: u64,
    /// Length of each question, tokens.
    pub question_tokens: u64,
    /// Tokens to generate per answer.
    pub output_tokens: u32,
    /// Zipf exponent over documents (0 = uniform).
    pub zipf: f64,
}

impl Default for LongDocConfig {
    fn default() -> Self {
        Self {
            documents: 4,
            document_tokens: 8192,
            question_tokens: 48,
            output_tokens: 64,
            zipf: 0.0,
        }
    }
}

impl LongDocConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), SimError> {
        positive("documents", self.documents)?;
        positive("document_tokens", self.document_tokens)?;
        positive("question_tokens", self.question_tokens)?;
        positive("output_tokens", u64::from(self.output_tokens))?;
        zipf_exponent(self.zipf)
    }
}

/// The long-document QA workload.
#[derive(Debug)]
pub struct LongDoc {
    cfg: LongDocConfig,
    seed: u64,
    shape: TextShape,
    zipf: Zipf,
    rng: SplitMix64,
    seq: u64,
}

impl LongDoc {
    /// Builds the workload (validates `cfg`).
    pub fn new(cfg: LongDocConfig, seed: u64, shape: TextShape) -> Result<Self, SimError> {
        cfg.validate()?;
        Ok(Self {
            zipf: Zipf::new(cfg.documents, cfg.zipf),
            rng: SplitMix64::new(key(seed, &[PICK])),
            cfg,
            seed,
            shape,
            seq: 0,
        })
    }
}

impl Workload for LongDoc {
    fn next(&mut self, _now: Duration) -> Poll {
        let d = self.zipf.sample(&mut self.rng);
        let seq = self.seq;
        self.seq += 1;
        let doc_chars = self.shape.chars(self.cfg.document_tokens);
        let q_chars = self.shape.chars(self.cfg.question_tokens);
        let mut content = String::with_capacity(doc_chars + q_chars + 64);
        append_filler(&mut content, key(self.seed, &[DOCUMENT, d]), doc_chars);
        content.push_str("\n\n");
        content.push_str(INSTRUCTIONS);
        append_filler(&mut content, key(self.seed, &[QUESTION, seq]), q_chars);
        Poll::Ready(RequestSpec {
            seq,
            session: seq,
            group: d,
            arrival: None,
            prompt: Prompt::Chat(vec![Message::new(Role::User, content)]),
            max_tokens: self.cfg.output_tokens,
            wants_reply: false,
        })
    }

    fn on_reply(&mut self, _session: SessionId, _reply: &str, _now: Duration) {}

    fn on_failure(&mut self, _session: SessionId, _now: Duration) {}
}
