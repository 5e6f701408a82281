//! The Anthropic Messages API body (`POST /v1/messages`): what routing
//! reads of it, rendered by the routing text rule
//! (`radixgate_routing::text`).
//!
//! `system` (a string or text blocks) renders first, as a system message,
//! whatever its place in the JSON object; then each message, its content a
//! string or blocks. Messages and blocks are rendered as they are read, so
//! a body of many small ones is never held as a list of them (a 32 MiB body
//! of empty blocks read into a list took gigabytes). A block's fields come
//! in any order, so each block is read whole and then rendered: text as text, `tool_use` as a tool call (its
//! `input` as JSON, keys sorted, so the same call renders the same however
//! the client orders it), `tool_result` as a marker with its id and then
//! its content, anything else as a part marker naming its source.

use super::{LoraPath, Text, null_as_false};
use radixgate_routing::text::{ContentText, RoutingText, Speaker, ToolCallsText};
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// A Messages API request, as far as routing reads it.
#[derive(Deserialize)]
pub(super) struct Request<'a> {
    #[serde(borrow, default)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "null_as_false")]
    pub(super) stream: bool,
    /// `metadata.user_id`, the sticky-session fallback (as `user` is for
    /// the OpenAI APIs).
    #[serde(borrow, default)]
    pub(super) metadata: Option<Metadata<'a>>,
    #[serde(default)]
    system: Blocks,
    messages: Messages,
    #[serde(borrow, default)]
    pub(super) cache_salt: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) lora_path: Option<LoraPath>,
    #[serde(borrow, default)]
    pub(super) extra_key: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(super) struct Metadata<'a> {
    #[serde(borrow, default)]
    pub(super) user_id: Option<Cow<'a, str>>,
}

impl Request<'_> {
    /// The system prompt first (if any), then the messages in order.
    pub(super) fn render(&self, out: &mut RoutingText) {
        if self.system.any {
            out.push_message(
                Speaker::role("system"),
                &self.system.content,
                &self.system.calls,
            );
        }
        out.append(&self.messages.0);
    }
}

/// `messages`, rendered one by one as they are read.
struct Messages(RoutingText);

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Messages;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of messages")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = RoutingText::new();
                while let Some(message) = seq.next_element::<Message<'de>>()? {
                    let content = &message.content;
                    out.push_message(
                        Speaker::role(&message.role),
                        &content.content,
                        &content.calls,
                    );
                }
                Ok(Messages(out))
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default)]
    content: Blocks,
}

/// Content: a string (one text block), a list of blocks, or absent;
/// rendered block by block as it is read.
#[derive(Default)]
struct Blocks {
    content: ContentText,
    calls: ToolCallsText,
    /// Whether there was any block.
    any: bool,
}

impl<'de> Deserialize<'de> for Blocks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Blocks;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of content blocks")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let mut blocks = Blocks::default();
                blocks.push(&Block::text(Cow::Borrowed(v)));
                Ok(blocks)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Blocks::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut blocks = Blocks::default();
                while let Some(block) = seq.next_element::<Block<'de>>()? {
                    blocks.push(&block);
                }
                Ok(blocks)
            }
        }
        super::text::string_seq_or_null(d, V)
    }
}

impl Blocks {
    fn push(&mut self, block: &Block<'_>) {
        block.render(&mut self.content, &mut self.calls);
        self.any = true;
    }
}

/// One content block, every field routing may read.
#[derive(Deserialize, Default)]
struct Block<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(borrow, default)]
    thinking: Option<Text<'a>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    /// A tool call's arguments: any JSON.
    #[serde(default)]
    input: Option<serde_json::Value>,
    #[serde(borrow, default)]
    tool_use_id: Option<Cow<'a, str>>,
    /// A tool result's content: a string or blocks.
    #[serde(default)]
    content: Option<Blocks>,
    #[serde(borrow, default)]
    source: Option<Source<'a>>,
}

/// Where an image or document block's data is: a URL, inline data or a
/// file id, whichever it has.
#[derive(Deserialize)]
struct Source<'a> {
    #[serde(borrow, default)]
    url: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    file_id: Option<Cow<'a, str>>,
}

impl<'a> Block<'a> {
    fn text(text: Cow<'a, str>) -> Self {
        Self {
            kind: Some(Cow::Borrowed("text")),
            text: Some(Text(text)),
            ..Self::default()
        }
    }

    fn render(&self, content: &mut ContentText, calls: &mut ToolCallsText) {
        match self.kind.as_deref() {
            Some("tool_use") => {
                let arguments = self.input.as_ref().map(serde_json::Value::to_string);
                calls.push_call(self.name.as_deref(), arguments.as_deref());
            }
            Some("tool_result") => {
                content.push_part(Some("tool_result"), self.tool_use_id.as_deref());
                if let Some(inner) = &self.content {
                    content.append(&inner.content);
                    calls.append(&inner.calls);
                }
            }
            Some("thinking") => {
                content.push_part(Some("thinking"), None);
                content.push_text(self.thinking.as_ref().map_or("", |t| &t.0));
            }
            kind => match &self.text {
                Some(text) => content.push_text(&text.0),
                None => {
                    let source = self.source.as_ref().and_then(|s| {
                        s.url
                            .as_deref()
                            .or(s.data.as_deref())
                            .or(s.file_id.as_deref())
                    });
                    content.push_part(kind, source);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Api, inspect};

    fn text(body: &str) -> String {
        inspect(Api::Messages, body.as_bytes())
            .expect("valid Messages body")
            .routing_text
    }

    #[test]
    fn system_first_and_model_stream_user() {
        let got = inspect(
            Api::Messages,
            br#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,
                 "system":"be brief","model":"m","stream":true,"metadata":{"user_id":"u"}}"#,
        )
        .unwrap();
        assert_eq!(
            got.routing_text,
            "<|system|>\nbe brief<|end|>\n<|user|>\nhi<|end|>\n"
        );
        assert_eq!((got.model.as_deref(), got.stream), (Some("m"), true));
        assert_eq!(got.user.as_deref(), Some("u"));
        // System blocks render as their text, as a string system does.
        let blocks = text(
            r#"{"system":[{"type":"text","text":"be "},{"type":"text","text":"brief",
                "cache_control":{"type":"ephemeral"}}],
                "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
        );
        assert_eq!(blocks, got.routing_text);
        assert_eq!(text(r#"{"messages":[],"system":null}"#), "");
    }

    #[test]
    fn blocks_render_by_kind() {
        let got = text(
            r#"{"messages":[
                {"role":"user","content":[{"type":"text","text":"see "},
                    {"type":"image","source":{"type":"url","url":"http://x/1.png"}},
                    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAA"}}]},
                {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},
                    {"type":"text","text":"calling"},
                    {"type":"tool_use","id":"t1","name":"f","input":{"b":2,"a":[1]}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1",
                    "content":[{"type":"text","text":"42"}]},
                    {"type":"tool_result","tool_use_id":"t2","content":"43","is_error":true}]}
            ]}"#,
        );
        assert_eq!(
            got,
            "<|user|>\nsee <|image:http://x/1.png|><|image:AAA|><|end|>\n\
             <|assistant|>\n<|thinking|>hmcalling<|call:f|>{\"b\":2,\"a\":[1]}<|end|>\n\
             <|user|>\n<|tool_result:t1|>42<|tool_result:t2|>43<|end|>\n"
        );
    }

    #[test]
    fn next_turn_extends_previous_turn() {
        let turn1 = text(
            r#"{"model":"m","max_tokens":9,"system":"S",
                "messages":[{"role":"user","content":"q1"}]}"#,
        );
        let turn2 = text(
            r#"{"messages":[{"role":"user","content":"q1"},
                {"role":"assistant","content":[{"type":"text","text":"a1"},
                    {"type":"tool_use","id":"t1","name":"f","input":{}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"},
                    {"type":"text","text":"q2"}]}],
                "system":[{"type":"text","text":"S"}],"model":"m","max_tokens":9}"#,
        );
        assert!(turn2.starts_with(&turn1) && turn2.len() > turn1.len());
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for body in [
            &b"{}"[..],
            b"{\"messages\":\"hi\"}",
            b"{\"messages\":[{\"content\":\"no role\"}]}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
            b"{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}",
            b"{\"messages\":[],\"system\":{\"text\":\"x\"}}",
            b"{\"messages\":[],\"metadata\":{\"user_id\":3}}",
            b"not json",
        ] {
            let err = inspect(Api::Messages, body).unwrap_err();
            assert!(err.to_string().starts_with("invalid JSON body"), "{err}");
        }
    }
}
