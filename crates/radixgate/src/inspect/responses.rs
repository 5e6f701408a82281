//! The OpenAI Responses API body (`POST /v1/responses`): what routing reads
//! of it, rendered by the routing text rule (`radixgate_routing::text`).
//!
//! `instructions` renders first, as a system message, whatever its place in
//! the JSON object; then `input`, a string (one user message) or a list of
//! items. A client that carries its conversation itself resends the earlier
//! items and the model's output items before each new input, so each turn's
//! text extends the turn before. One that sends `previous_response_id`
//! instead carries only the new input, which is all routing can see: its
//! history is the worker's to keep, and the request goes to that worker
//! (`crate::responses`).

use super::{Content, LoraPath, null_as_false};
use radixgate_routing::text::{ContentText, RoutingText, Speaker, ToolCallsText};
use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// A Responses API request, as far as routing reads it.
#[derive(Deserialize)]
pub(super) struct Request<'a> {
    #[serde(borrow, default)]
    pub(super) model: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "null_as_false")]
    pub(super) stream: bool,
    #[serde(borrow, default)]
    pub(super) user: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    instructions: Option<super::Text<'a>>,
    #[serde(borrow, default)]
    input: Input<'a>,
    #[serde(borrow, default)]
    pub(super) cache_salt: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) lora_path: Option<LoraPath>,
    #[serde(borrow, default)]
    pub(super) extra_key: Option<Cow<'a, str>>,
    /// The stored response this one continues (`crate::responses`).
    #[serde(borrow, default)]
    pub(super) previous_response_id: Option<Cow<'a, str>>,
    /// Whether the response is to be stored: absent, it is (the API's
    /// default); `null` is read as the engines read it, as false.
    #[serde(default = "stored_unless_said", deserialize_with = "null_as_false")]
    pub(super) store: bool,
}

fn stored_unless_said() -> bool {
    true
}

impl Request<'_> {
    /// Instructions first, then the input items in order.
    pub(super) fn render(&self, out: &mut RoutingText) {
        if let Some(instructions) = &self.instructions {
            out.push_plain_message("system", &instructions.0);
        }
        match &self.input {
            Input::None => {}
            Input::Text(text) => out.push_plain_message("user", text),
            Input::Items(items) => out.append(items),
        }
    }
}

/// `input`: a string, a list of items (rendered one by one as they are
/// read, so a body of many small items is never held as a list of them),
/// or absent.
#[derive(Default)]
enum Input<'a> {
    #[default]
    None,
    Text(Cow<'a, str>),
    Items(RoutingText),
}

impl<'de: 'a, 'a> Deserialize<'de> for Input<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Input<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of input items")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Input::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Input::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Input::None)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = RoutingText::new();
                while let Some(item) = seq.next_element::<Item<'de>>()? {
                    item.render(&mut items);
                }
                Ok(Input::Items(items))
            }
        }
        super::text::string_seq_or_null(d, V)
    }
}

/// One input item: a message, a function call or its output, or any other
/// item (reasoning, references), which routing tells apart by type and id.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(default)]
    content: Content,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    call_id: Option<Cow<'a, str>>,
    /// A function call's output: a string or content parts.
    #[serde(default)]
    output: Content,
}

impl Item<'_> {
    fn render(&self, out: &mut RoutingText) {
        let none = ToolCallsText::default();
        match self.kind.as_deref() {
            None | Some("message") => {
                let role = self.role.as_deref().unwrap_or("message");
                out.push_message(Speaker::role(role), &self.content.0, &none);
            }
            Some("function_call") => {
                let mut call = ToolCallsText::default();
                call.push_call(self.name.as_deref(), self.arguments.as_deref());
                out.push_message(Speaker::role("assistant"), &ContentText::default(), &call);
            }
            Some("function_call_output") => {
                let speaker = Speaker {
                    tool_call_id: self.call_id.as_deref(),
                    ..Speaker::role("tool")
                };
                out.push_message(speaker, &self.output.0, &none);
            }
            Some(other) => {
                let speaker = Speaker {
                    name: self.id.as_deref(),
                    ..Speaker::role(other)
                };
                out.push_message(speaker, &self.content.0, &none);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Api, inspect};

    fn text(body: &str) -> String {
        inspect(Api::Responses, body.as_bytes())
            .expect("valid Responses body")
            .routing_text
    }

    #[test]
    fn instructions_come_first_wherever_they_are() {
        let got = inspect(
            Api::Responses,
            br#"{"input":"hi","model":"m","stream":true,"user":"u","instructions":"be brief"}"#,
        )
        .unwrap();
        assert_eq!(
            got.routing_text,
            "<|system|>\nbe brief<|end|>\n<|user|>\nhi<|end|>\n"
        );
        assert_eq!((got.model.as_deref(), got.stream), (Some("m"), true));
        assert_eq!(got.user.as_deref(), Some("u"));
        // A string input reads as a one-message chat would.
        let chat = inspect(
            Api::ChatCompletions,
            br#"{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        assert_eq!(got.routing_text, chat.routing_text);
        assert_eq!(text("{}"), "");
        assert_eq!(text(r#"{"input":null}"#), "");
    }

    #[test]
    fn items_render_by_kind() {
        let got = text(
            r#"{"input":[
                {"role":"user","content":[{"type":"input_text","text":"look "},
                    {"type":"input_image","image_url":"http://x/1.png"},
                    {"type":"input_image","file_id":"file-9"}]},
                {"type":"reasoning","id":"rs_1","summary":[]},
                {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},
                {"type":"function_call_output","call_id":"c1","output":"42"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}
            ]}"#,
        );
        assert_eq!(
            got,
            "<|user|>\nlook <|input_image:http://x/1.png|><|input_image:file-9|><|end|>\n\
             <|reasoning:rs_1|>\n<|end|>\n\
             <|assistant|>\n<|call:f|>{\"a\":1}<|end|>\n\
             <|tool#c1|>\n42<|end|>\n\
             <|assistant|>\ndone<|end|>\n"
        );
    }

    #[test]
    fn next_turn_extends_previous_turn() {
        let turn1 =
            text(r#"{"instructions":"S","input":[{"role":"user","content":"q1"}],"model":"m"}"#);
        // Turn 2 resends turn 1's items, the model's output items, a tool
        // round trip and the new question.
        let turn2 = text(
            r#"{"model":"m","input":[{"role":"user","content":"q1"},
                {"type":"message","id":"msg_1","role":"assistant","status":"completed",
                 "content":[{"type":"output_text","text":"a1","annotations":[]}]},
                {"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},
                {"type":"function_call_output","call_id":"c1","output":[{"type":"input_text","text":"r"}]},
                {"role":"user","content":[{"type":"input_text","text":"q2"}]}],
             "instructions":"S"}"#,
        );
        assert!(turn2.starts_with(&turn1) && turn2.len() > turn1.len());
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for body in [
            &b"{\"input\":5}"[..],
            b"{\"input\":[\"text\"]}",
            b"{\"input\":[{\"role\":\"user\",\"content\":{\"text\":\"x\"}}]}",
            b"{\"instructions\":[1]}",
            b"{\"input\":\"x\"",
            b"[]",
        ] {
            let err = inspect(Api::Responses, body).unwrap_err();
            assert!(err.to_string().starts_with("invalid JSON body"), "{err}");
        }
    }
}
