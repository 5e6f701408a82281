//! Reading what routing needs from a request body, and nothing more.
//!
//! The gateway forwards the client's bytes unchanged, so this module never
//! builds a request to send: it deserialises only the handful of fields that
//! routing needs (model, stream flag, routing text, `user`) into borrowed
//! views and skips everything else with `IgnoredAny`. Unknown fields are
//! therefore neither rejected nor lost.
//!
//! This module only parses. How the parsed pieces become the routing text
//! (roles, turn boundaries, content parts, tool calls, token ids, batches)
//! is `radixgate_routing::text`'s rule, the same one `radixgate simulate`
//! renders its prompts with; the deserialisers below feed its builders.

use radixgate_routing::text::{ContentText, PromptText, RoutingText, Speaker, ToolCallsText};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// The inference APIs the gateway routes (one enum, shared with routing and
/// the simulator).
pub use radixgate_routing::Api;

/// What routing needs from one request body.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Inspected {
    /// The `model` field, if present.
    pub model: Option<String>,
    /// Whether the client asked for a streamed (SSE) response.
    pub stream: bool,
    /// The text the prefix tree is matched against.
    pub routing_text: String,
    /// The `user` field, a fallback sticky-session key.
    pub user: Option<String>,
}

/// Why a body could not be inspected. Always the client's fault.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The body is not JSON, or a field routing reads has the wrong type.
    #[error("invalid JSON body: {0}")]
    Json(#[from] serde_json::Error),
}

/// Reads `body` as a request to `api`.
pub fn inspect(api: Api, body: &[u8]) -> Result<Inspected, InspectError> {
    let mut text = RoutingText::new();
    let (model, stream, user) = match api {
        Api::ChatCompletions => {
            let req: ChatRequest<'_> = serde_json::from_slice(body)?;
            for message in &req.messages.0 {
                message.render(&mut text);
            }
            (req.model, req.stream, req.user)
        }
        Api::Completions => {
            let req: PromptRequest<'_> = serde_json::from_slice(body)?;
            text.push_prompt(&req.prompt.0);
            (req.model, req.stream, req.user)
        }
        Api::Generate => {
            let req: GenerateRequest<'_> = serde_json::from_slice(body)?;
            if let Some(prompt) = req.text.as_ref().or(req.input_ids.as_ref()) {
                text.push_prompt(&prompt.0);
            }
            (req.model, req.stream, None)
        }
        Api::Embeddings => {
            let req: EmbeddingRequest<'_> = serde_json::from_slice(body)?;
            text.push_prompt(&req.input.0);
            (req.model, false, req.user)
        }
    };
    Ok(Inspected {
        model: model.map(Cow::into_owned),
        stream,
        routing_text: text.into_string(),
        user: user.map(Cow::into_owned),
    })
}

#[derive(Deserialize)]
struct ChatRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "null_as_false")]
    stream: bool,
    #[serde(borrow, default)]
    user: Option<Cow<'a, str>>,
    #[serde(borrow)]
    messages: Messages<'a>,
}

#[derive(Deserialize)]
struct Messages<'a>(#[serde(borrow)] Vec<Message<'a>>);

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(default)]
    content: Content,
    #[serde(default)]
    tool_calls: Option<ToolCalls>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
}

impl Message<'_> {
    /// Hands the message's pieces to the routing text rule.
    fn render(&self, out: &mut RoutingText) {
        let speaker = Speaker {
            role: &self.role,
            name: self.name.as_deref(),
            tool_call_id: self.tool_call_id.as_deref(),
        };
        let no_calls = ToolCallsText::default();
        let calls = self.tool_calls.as_ref().map_or(&no_calls, |c| &c.0);
        out.push_message(speaker, &self.content.0, calls);
    }
}

/// Message content: a string, an array of parts, or null. It is rendered as
/// it is read, because a message's fields come in any order.
#[derive(Default)]
struct Content(ContentText);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, an array of content parts, or null")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                let mut content = ContentText::default();
                content.push_text(v);
                Ok(Content(content))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut out = ContentText::default();
                while let Some(part) = seq.next_element::<Part<'de>>()? {
                    part.render(&mut out);
                }
                Ok(Content(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    image_url: Option<UrlField>,
}

impl Part<'_> {
    fn render(&self, out: &mut ContentText) {
        match &self.text {
            Some(text) => out.push_text(text),
            None => out.push_part(
                self.kind.as_deref(),
                self.image_url.as_ref().map(|u| u.0.as_str()),
            ),
        }
    }
}

/// `image_url` is either `{"url": "..."}` or a bare string.
struct UrlField(String);

impl<'de> Deserialize<'de> for UrlField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UrlField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL string or an object with a url")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<UrlField, E> {
                Ok(UrlField(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UrlField, A::Error> {
                let mut url = String::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == "url" {
                        url = map.next_value::<Cow<'de, str>>()?.into_owned();
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(UrlField(url))
            }
        }
        d.deserialize_any(V)
    }
}

/// An assistant message's tool calls (their function names and arguments).
struct ToolCalls(ToolCallsText);

impl<'de> Deserialize<'de> for ToolCalls {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Call<'a> {
            #[serde(borrow, default)]
            function: Option<Function<'a>>,
        }
        #[derive(Deserialize)]
        struct Function<'a> {
            #[serde(borrow, default)]
            name: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            arguments: Option<Cow<'a, str>>,
        }
        let calls = Option::<Vec<Call<'de>>>::deserialize(d)?.unwrap_or_default();
        let mut out = ToolCallsText::default();
        for function in calls.iter().filter_map(|c| c.function.as_ref()) {
            out.push_call(function.name.as_deref(), function.arguments.as_deref());
        }
        Ok(ToolCalls(out))
    }
}

#[derive(Deserialize)]
struct PromptRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "null_as_false")]
    stream: bool,
    #[serde(borrow, default)]
    user: Option<Cow<'a, str>>,
    prompt: TextOrIds,
}

#[derive(Deserialize)]
struct GenerateRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "null_as_false")]
    stream: bool,
    #[serde(default)]
    text: Option<TextOrIds>,
    #[serde(default)]
    input_ids: Option<TextOrIds>,
}

#[derive(Deserialize)]
struct EmbeddingRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    user: Option<Cow<'a, str>>,
    input: TextOrIds,
}

/// A prompt in any of the shapes the APIs allow: a string, token ids, or a
/// batch of either (arrays nest at most two deep). The deserialiser walks
/// the shape and tells the routing text rule where each batch item ends.
struct TextOrIds(PromptText);

impl<'de> Deserialize<'de> for TextOrIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'o> {
            out: &'o mut PromptText,
            depth: u8,
        }
        impl<'de> Visitor<'de> for V<'_> {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, an array of token ids, or an array of those")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
                self.out.push_text(v);
                self.end_batch_item();
                Ok(())
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
                self.out.push_token_id(v);
                Ok(())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
                self.out.push_token_id(v);
                Ok(())
            }
            fn visit_unit<E: de::Error>(self) -> Result<(), E> {
                Ok(())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                if self.depth >= 2 {
                    return Err(de::Error::custom("prompt arrays nest at most two deep"));
                }
                let depth = self.depth + 1;
                while seq
                    .next_element_seed(Item {
                        out: self.out,
                        depth,
                    })?
                    .is_some()
                {}
                self.end_batch_item();
                Ok(())
            }
        }
        impl V<'_> {
            /// Only strings and id arrays inside the outer array are
            /// batch items; a top-level string or id array is the prompt.
            fn end_batch_item(self) {
                if self.depth == 1 {
                    self.out.end_batch_item();
                }
            }
        }
        struct Item<'o> {
            out: &'o mut PromptText,
            depth: u8,
        }
        impl<'de> de::DeserializeSeed<'de> for Item<'_> {
            type Value = ();
            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_any(V {
                    out: self.out,
                    depth: self.depth,
                })
            }
        }
        let mut out = PromptText::default();
        d.deserialize_any(V {
            out: &mut out,
            depth: 0,
        })?;
        Ok(TextOrIds(out))
    }
}

fn null_as_false<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

#[cfg(test)]
mod tests;
