//! The routing text: how a request becomes the text the prefix tree matches.
//!
//! This rule decides hit rates, so it has one home, here, and everyone who
//! needs it calls it: the gateway's body inspection (`radixgate::inspect`,
//! which only parses JSON and feeds the pieces in) and the offline
//! simulator (`radixgate simulate`, which renders its generated prompts).
//! There is no second copy to keep equal.
//!
//! The rule, per [`Api`]:
//! - chat: every message renders as `<|role[:name][#tool_call_id]|>\n`,
//!   its content, its tool calls, then the turn boundary `<|end|>\n`.
//!   Rendering is per message and append-only, so the text of turn N+1 (the
//!   same messages plus the reply and a new user message) always extends the
//!   text of turn N, and a conversation's next turn matches the prefix its
//!   previous turn left in the tree. Roles are part of the text, so the same
//!   words said by the system and by the user do not look alike.
//! - content parts: text parts render as their text; any other part as a
//!   marker `<|type[:url]|>`, so two requests with different images differ.
//!   A source longer than [`LONG_SOURCE_BYTES`] (an image's base64 data
//!   URL: megabytes) is named by its digest and length instead,
//!   `<|type:digest=<32 hex digits>/<bytes>|>`: the same image still makes
//!   the same text, but the tree does not take a few hundred tokens of
//!   image for a million characters of prompt (which would fill its model
//!   of the worker's cache, and cut the text after the image off at
//!   `max_routing_text_chars`). The digest is two fixed-seed foldhash
//!   hashes: the same in every process of one build, so replicas agree.
//! - tool calls: `<|call:name|>arguments` per call.
//! - prompts (completions, `/generate`, embeddings): text as is; token ids
//!   as decimal numbers each followed by a space, which keeps the prefix
//!   structure of the id sequence; each item of a batch ends with a newline.
//! - Responses API: `instructions` first, as a `system` message; then
//!   `input`: a string is one `user` message, an array renders item by item
//!   — a message as chat does, a `function_call` as an `assistant` message
//!   holding that one call, a `function_call_output` as a `tool` message
//!   with its `call_id`, any other item as a message whose role is its
//!   `type` and whose name is its `id`. The next turn resends the items and
//!   the model's output items before its new input, so it extends the text
//!   of the turn before, as chat does.
//! - Anthropic Messages: `system` (a string or text blocks) first, as a
//!   `system` message; then each message as chat renders it. Blocks render
//!   into the message: text as its text, `tool_use` as a tool call whose
//!   arguments are its `input` as JSON, `tool_result` as the marker
//!   `<|tool_result:tool_use_id|>` and then its content, `thinking` as the
//!   marker `<|thinking|>` and its text, any other block as the part marker
//!   `<|type[:source]|>` (an image's URL or data, so different images
//!   differ).
//!
//! A request in a cache namespace of its own (a LoRA adapter, a cache salt)
//! has its text marked with it, so that it never matches another
//! namespace's prefixes ([`CacheNamespace`], [`RoutingText::into_string_in`]).
//!
//! Parts that may arrive in any order in a JSON object (a message's content
//! before its role, `/generate`'s `text` beside `input_ids`) are built as
//! their own fragments ([`ContentText`], [`ToolCallsText`], [`PromptText`])
//! and appended to the [`RoutingText`] once the whole object is read.
//! Everything here is pure string building: no I/O, no JSON.

use crate::namespace::CacheNamespace;
use std::fmt::{Display, Write as _};

/// The inference APIs a request can come in on: the gateway's routes, the
/// load tool's `--api` and the simulator's routing text all speak of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// OpenAI `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `/v1/completions`.
    Completions,
    /// SGLang `/generate`.
    Generate,
    /// OpenAI `/v1/embeddings`.
    Embeddings,
    /// OpenAI Responses API, `/v1/responses`.
    Responses,
    /// Anthropic Messages API, `/v1/messages`.
    Messages,
}

impl Api {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Api::ChatCompletions => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Generate => "/generate",
            Api::Embeddings => "/v1/embeddings",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
        }
    }

    /// Whether requests carry a conversation of role-tagged messages (and
    /// so render by the chat rule), rather than a prompt.
    pub fn is_conversation(self) -> bool {
        matches!(self, Api::ChatCompletions | Api::Responses | Api::Messages)
    }
}

/// Who says a chat message: its role and the optional `name` and
/// `tool_call_id`, all of which are part of the routing text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Speaker<'a> {
    /// The `role` field (`system`, `user`, `assistant`, `tool`, ...).
    pub role: &'a str,
    /// The `name` field, if present.
    pub name: Option<&'a str>,
    /// The `tool_call_id` field of a tool result, if present.
    pub tool_call_id: Option<&'a str>,
}

impl<'a> Speaker<'a> {
    /// A speaker with only a role.
    pub fn role(role: &'a str) -> Self {
        Self {
            role,
            name: None,
            tool_call_id: None,
        }
    }
}

/// One message's content rendered as routing text: a string, or the parts
/// of a content array one after another.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContentText(String);

impl ContentText {
    /// Appends text (a string content, or a part that carries text).
    pub fn push_text(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// Appends a part without text as the marker `<|type[:url]|>`; a part
    /// without a type is called `part`. A URL (or inline data) longer than
    /// [`LONG_SOURCE_BYTES`] is written as its digest (see the module doc).
    pub fn push_part(&mut self, kind: Option<&str>, url: Option<&str>) {
        self.0.push_str("<|");
        self.0.push_str(kind.unwrap_or("part"));
        if let Some(url) = url {
            self.0.push(':');
            if url.len() > LONG_SOURCE_BYTES {
                push_digest(&mut self.0, url);
            } else {
                self.0.push_str(url);
            }
        }
        self.0.push_str("|>");
    }

    /// Appends content rendered apart (a tool result's own content).
    pub fn append(&mut self, other: &ContentText) {
        self.0.push_str(&other.0);
    }

    /// The content so far.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A part's source longer than this many bytes is named by its digest in
/// the routing text.
pub const LONG_SOURCE_BYTES: usize = 256;

/// `digest=<32 hex digits>/<bytes>` for `source`.
fn push_digest(out: &mut String, source: &str) {
    use std::hash::BuildHasher as _;
    // Fixed seeds: the digest must not change from one process to the next.
    let hash = |seed| foldhash::fast::FixedState::with_seed(seed).hash_one(source);
    let _ = write!(
        out,
        "digest={:016x}{:016x}/{}",
        hash(0x7261_6469_7867_6174),
        hash(0x6d65_6469_6120_7061),
        source.len()
    );
}

/// An assistant message's tool calls rendered as routing text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCallsText(String);

impl ToolCallsText {
    /// Appends one call as `<|call:name|>arguments` (missing parts empty).
    pub fn push_call(&mut self, name: Option<&str>, arguments: Option<&str>) {
        self.0.push_str("<|call:");
        self.0.push_str(name.unwrap_or(""));
        self.0.push_str("|>");
        self.0.push_str(arguments.unwrap_or(""));
    }

    /// Appends calls rendered apart (inside a tool result's content).
    pub fn append(&mut self, other: &ToolCallsText) {
        self.0.push_str(&other.0);
    }

    /// The calls so far.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A prompt rendered as routing text: a string, token ids, or a batch of
/// either. The caller walks the prompt's shape and says where each batch
/// item ends.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptText(String);

impl PromptText {
    /// Appends prompt text as is.
    pub fn push_text(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// Appends one token id as a decimal number and a space.
    pub fn push_token_id(&mut self, id: impl Display) {
        // Writing to a String cannot fail.
        let _ = write!(self.0, "{id} ");
    }

    /// Ends one item of a batch (a string or an id array inside the outer
    /// array) with a newline, so items do not run into each other.
    pub fn end_batch_item(&mut self) {
        self.0.push('\n');
    }

    /// The prompt so far.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The text one request is routed by, built in request order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutingText(String);

impl RoutingText {
    /// An empty text.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends messages rendered apart (those a body lists before the part
    /// that renders first, such as a system prompt given after them).
    pub fn append(&mut self, other: &RoutingText) {
        self.0.push_str(&other.0);
    }

    /// Appends one chat message: `<|role[:name][#id]|>\n`, the content, the
    /// tool calls, then the turn boundary `<|end|>\n`.
    pub fn push_message(
        &mut self,
        speaker: Speaker<'_>,
        content: &ContentText,
        tool_calls: &ToolCallsText,
    ) {
        self.open_message(speaker);
        self.0.push_str(content.as_str());
        self.0.push_str(tool_calls.as_str());
        self.close_message();
    }

    /// Appends one chat message with a role and plain text content only,
    /// rendered exactly as [`push_message`](Self::push_message) would.
    pub fn push_plain_message(&mut self, role: &str, content: &str) {
        self.open_message(Speaker::role(role));
        self.0.push_str(content);
        self.close_message();
    }

    /// Appends a prompt (completions, `/generate`, embeddings).
    pub fn push_prompt(&mut self, prompt: &PromptText) {
        self.0.push_str(prompt.as_str());
    }

    /// Appends a plain text prompt, as [`push_prompt`](Self::push_prompt)
    /// would for a prompt that is one string.
    pub fn push_prompt_str(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The finished text.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The finished text as routed in `namespace`: marked with it, unless
    /// it is the shared one (see [`CacheNamespace`]).
    pub fn into_string_in(self, namespace: &CacheNamespace) -> String {
        namespace.apply(self.0)
    }

    fn open_message(&mut self, speaker: Speaker<'_>) {
        self.0.push_str("<|");
        self.0.push_str(speaker.role);
        if let Some(name) = speaker.name {
            self.0.push(':');
            self.0.push_str(name);
        }
        if let Some(id) = speaker.tool_call_id {
            self.0.push('#');
            self.0.push_str(id);
        }
        self.0.push_str("|>\n");
    }

    fn close_message(&mut self) {
        self.0.push_str("<|end|>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(messages: &[(&str, &str)]) -> String {
        let mut t = RoutingText::new();
        for (role, content) in messages {
            t.push_plain_message(role, content);
        }
        t.into_string()
    }

    #[test]
    fn messages_keep_roles_and_turn_boundaries() {
        assert_eq!(
            chat(&[("system", "be brief"), ("user", "hi")]),
            "<|system|>\nbe brief<|end|>\n<|user|>\nhi<|end|>\n"
        );
        assert_ne!(chat(&[("user", "same")]), chat(&[("system", "same")]));
    }

    #[test]
    fn a_long_source_is_named_by_its_digest_and_length() {
        let part = |url: &str| {
            let mut content = ContentText::default();
            content.push_part(Some("image_url"), Some(url));
            content.as_str().to_owned()
        };
        let short = format!("http://x/{}", "a".repeat(LONG_SOURCE_BYTES - 9));
        assert_eq!(part(&short), format!("<|image_url:{short}|>"));
        let image = format!("data:image/png;base64,{}", "iVBORw0KGgo".repeat(100_000));
        let marker = part(&image);
        assert!(marker.len() < 80, "{marker}");
        assert!(marker.ends_with(&format!("/{}|>", image.len())), "{marker}");
        assert_eq!(part(&image), marker, "the same image, the same text");
        let mut other = image.clone();
        other.pop();
        other.push('A');
        assert_ne!(part(&other), marker, "a byte apart, another text");
        // A known value: the digest must not change between processes
        // (replicas share each other's inserts); a new foldhash that
        // changed it would show here.
        assert_eq!(
            part(&"d".repeat(300)),
            "<|image_url:digest=64f81590c73025caf3bd5f1f81f736ae/300|>"
        );
    }

    #[test]
    fn next_turn_extends_previous_turn() {
        let turn1 = chat(&[("system", "S"), ("user", "q1")]);
        let turn2 = chat(&[
            ("system", "S"),
            ("user", "q1"),
            ("assistant", "a1"),
            ("user", "q2"),
        ]);
        assert!(turn2.starts_with(&turn1) && turn2.len() > turn1.len());
    }

    #[test]
    fn names_parts_and_tool_calls() {
        let mut t = RoutingText::new();
        let mut content = ContentText::default();
        content.push_text("café ");
        content.push_part(Some("image_url"), Some("http://x/1.png"));
        content.push_part(None, None);
        let speaker = Speaker {
            name: Some("ann"),
            ..Speaker::role("user")
        };
        t.push_message(speaker, &content, &ToolCallsText::default());
        let mut calls = ToolCallsText::default();
        calls.push_call(Some("f"), Some("{\"a\":1}"));
        calls.push_call(None, None);
        t.push_message(Speaker::role("assistant"), &ContentText::default(), &calls);
        let tool = Speaker {
            tool_call_id: Some("c1"),
            ..Speaker::role("tool")
        };
        let mut result = ContentText::default();
        result.push_text("42");
        t.push_message(tool, &result, &ToolCallsText::default());
        assert_eq!(
            t.as_str(),
            "<|user:ann|>\ncafé <|image_url:http://x/1.png|><|part|><|end|>\n\
             <|assistant|>\n<|call:f|>{\"a\":1}<|call:|><|end|>\n\
             <|tool#c1|>\n42<|end|>\n"
        );
        let mut plain = RoutingText::new();
        plain.push_plain_message("tool", "42");
        let mut full = RoutingText::new();
        full.push_message(Speaker::role("tool"), &result, &ToolCallsText::default());
        assert_eq!(plain, full);
    }

    #[test]
    fn prompts_keep_the_prefix_structure_of_ids() {
        let ids = |ids: &[u64]| {
            let mut p = PromptText::default();
            for id in ids {
                p.push_token_id(id);
            }
            p
        };
        assert_eq!(ids(&[1, 2, 3]).as_str(), "1 2 3 ");
        assert!(
            ids(&[1, 2, 3, 4])
                .as_str()
                .starts_with(ids(&[1, 2, 3]).as_str())
        );
        let mut batch = PromptText::default();
        batch.push_text("a");
        batch.end_batch_item();
        batch.push_token_id(-3i64);
        batch.end_batch_item();
        let mut t = RoutingText::new();
        t.push_prompt(&batch);
        assert_eq!(t.into_string(), "a\n-3 \n");
        let mut s = RoutingText::new();
        s.push_prompt_str("abc");
        assert_eq!(s.as_str(), "abc");
    }

    #[test]
    fn api_paths() {
        assert_eq!(Api::ChatCompletions.path(), "/v1/chat/completions");
        assert_eq!(Api::Completions.path(), "/v1/completions");
        assert_eq!(Api::Generate.path(), "/generate");
        assert_eq!(Api::Embeddings.path(), "/v1/embeddings");
        assert_eq!(Api::Responses.path(), "/v1/responses");
        assert_eq!(Api::Messages.path(), "/v1/messages");
        assert!(Api::Messages.is_conversation() && !Api::Generate.is_conversation());
    }
}
