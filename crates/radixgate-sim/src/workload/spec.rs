//! Requests as plain data: what to send, for which session, when.
//!
//! A [`RequestSpec`] carries no HTTP: the load tool turns it into a chat,
//! completions or `/generate` body, and the offline simulator feeds it to the
//! worker model directly. Chat prompts keep their roles and turn boundaries;
//! [`Prompt::to_text`] renders them for the text APIs with this tool's own
//! fixed template (prefix-stable: a conversation's next turn renders to an
//! extension of its previous prompt plus reply).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Identifies a session (a conversation, an agent run, or one request).
pub type SessionId = u64;

/// The role of a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the assistant.
    System,
    /// The user (or, in agentic workloads, a tool result fed back).
    User,
    /// The model's earlier replies.
    Assistant,
}

impl Role {
    /// The role's name in the OpenAI API.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said.
    pub content: String,
}

impl Message {
    /// A message with the given role and content.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
}

/// The prompt of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Prompt {
    /// A chat conversation (sent as `messages`, or rendered for text APIs).
    Chat(Vec<Message>),
    /// Raw text (sent as `prompt`/`text`, or as one user message for chat).
    Text(String),
}

impl Prompt {
    /// The prompt as text, for APIs that take text. Chat messages are
    /// rendered as `<|role|>\n{content}\n` each, then `<|assistant|>\n`, so
    /// the rendering of a conversation followed by its reply is a prefix of
    /// the rendering of the conversation's next turn.
    pub fn to_text(&self) -> String {
        match self {
            Prompt::Text(t) => t.clone(),
            Prompt::Chat(msgs) => {
                let mut out = String::new();
                for m in msgs {
                    out.push_str("<|");
                    out.push_str(m.role.as_str());
                    out.push_str("|>\n");
                    out.push_str(&m.content);
                    out.push('\n');
                }
                out.push_str("<|assistant|>\n");
                out
            }
        }
    }

    /// The total number of content characters (not counting markers).
    pub fn content_chars(&self) -> usize {
        match self {
            Prompt::Text(t) => t.chars().count(),
            Prompt::Chat(msgs) => msgs.iter().map(|m| m.content.chars().count()).sum(),
        }
    }
}

/// One request a workload wants sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// Sequence number within the workload (0, 1, 2, …).
    pub seq: u64,
    /// The session it belongs to; replies are reported back by this id.
    pub session: SessionId,
    /// The prefix group (shared system prompt, document, agent prefix, first
    /// trace block, or the conversation itself): the routing key for a
    /// perfectly partitioned assignment.
    pub group: u64,
    /// Intrinsic arrival time from the start, for timestamped workloads
    /// (trace replay); `None` when the driver's arrival process decides.
    pub arrival: Option<Duration>,
    /// What to send.
    pub prompt: Prompt,
    /// Tokens to generate.
    pub max_tokens: u32,
    /// Whether a later request of this session will include the reply text
    /// (so a driver must keep it). Whatever this says, a driver reports every
    /// request's outcome exactly once, by `Workload::on_reply` or
    /// `Workload::on_failure`.
    pub wants_reply: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_rendering_is_prefix_stable_across_turns() {
        let turn1 = vec![
            Message::new(Role::System, "be brief"),
            Message::new(Role::User, "hello"),
        ];
        let mut turn2 = turn1.clone();
        turn2.push(Message::new(Role::Assistant, "hi there"));
        turn2.push(Message::new(Role::User, "more"));
        let a = Prompt::Chat(turn1).to_text();
        let b = Prompt::Chat(turn2).to_text();
        assert!(b.starts_with(&format!("{a}hi there")));
        assert_eq!(Prompt::Text("x".into()).to_text(), "x");
    }
}
