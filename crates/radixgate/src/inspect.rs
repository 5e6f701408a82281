//! Reading what routing needs from a request body, and nothing more.
//!
//! The gateway forwards the client's bytes unchanged, so this module never
//! builds a request to send: it deserialises only the handful of fields that
//! routing needs (model, stream flag, routing text, `user`) into borrowed
//! views and skips everything else with `IgnoredAny`. Unknown fields are
//! therefore neither rejected nor lost.
//!
//! The routing text of a chat request renders every message with its role and
//! a turn boundary, one message after another. Rendering is per message and
//! append-only, so the text of turn N+1 (the same messages plus the reply and
//! a new user message) always extends the text of turn N, and a
//! conversation's next turn matches the prefix its previous turn left in the
//! tree.

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt::{self, Write as _};

/// The inference APIs the gateway routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// OpenAI `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `/v1/completions`.
    Completions,
    /// SGLang `/generate`.
    Generate,
    /// OpenAI `/v1/embeddings`.
    Embeddings,
}

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
    let mut text = String::new();
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
            req.prompt.render(&mut text);
            (req.model, req.stream, req.user)
        }
        Api::Generate => {
            let req: GenerateRequest<'_> = serde_json::from_slice(body)?;
            match (&req.text, &req.input_ids) {
                (Some(t), _) => t.render(&mut text),
                (None, Some(ids)) => ids.render(&mut text),
                (None, None) => {}
            }
            (req.model, req.stream, None)
        }
        Api::Embeddings => {
            let req: EmbeddingRequest<'_> = serde_json::from_slice(body)?;
            req.input.render(&mut text);
            (req.model, false, req.user)
        }
    };
    Ok(Inspected {
        model: model.map(Cow::into_owned),
        stream,
        routing_text: text,
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
    /// Appends `<|role|>` (with name and tool call id), the content, any tool
    /// calls, then the turn boundary.
    fn render(&self, out: &mut String) {
        out.push_str("<|");
        out.push_str(&self.role);
        if let Some(name) = &self.name {
            out.push(':');
            out.push_str(name);
        }
        if let Some(id) = &self.tool_call_id {
            out.push('#');
            out.push_str(id);
        }
        out.push_str("|>\n");
        out.push_str(&self.content.0);
        if let Some(calls) = &self.tool_calls {
            out.push_str(&calls.0);
        }
        out.push_str("<|end|>\n");
    }
}

/// Message content flattened to text: a string, or the text of an array of
/// parts (non-text parts are rendered as a marker naming their type and URL,
/// so two requests with different images do not look identical).
#[derive(Default)]
struct Content(String);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, an array of content parts, or null")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content(v.to_owned()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut out = String::new();
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
    fn render(&self, out: &mut String) {
        if let Some(text) = &self.text {
            out.push_str(text);
            return;
        }
        out.push_str("<|");
        out.push_str(self.kind.as_deref().unwrap_or("part"));
        if let Some(url) = &self.image_url {
            out.push(':');
            out.push_str(&url.0);
        }
        out.push_str("|>");
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

/// Assistant tool calls rendered as `<|call:name|>arguments` per call.
struct ToolCalls(String);

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
        let mut out = String::new();
        for function in calls.iter().filter_map(|c| c.function.as_ref()) {
            out.push_str("<|call:");
            out.push_str(function.name.as_deref().unwrap_or(""));
            out.push_str("|>");
            out.push_str(function.arguments.as_deref().unwrap_or(""));
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
/// batch of either. Token ids render as decimal numbers each followed by a
/// space, which keeps the prefix structure of the id sequence; the items of
/// a batch are separated by a newline.
struct TextOrIds(String);

impl TextOrIds {
    fn render(&self, out: &mut String) {
        out.push_str(&self.0);
    }
}

impl<'de> Deserialize<'de> for TextOrIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'o> {
            out: &'o mut String,
            depth: u8,
        }
        impl<'de> Visitor<'de> for V<'_> {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, an array of token ids, or an array of those")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
                self.out.push_str(v);
                self.end_batch_item();
                Ok(())
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
                let _ = write!(self.out, "{v} ");
                Ok(())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
                let _ = write!(self.out, "{v} ");
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
            /// Items of a batch (strings or id arrays inside the outer
            /// array) each end with a newline.
            fn end_batch_item(self) {
                if self.depth == 1 {
                    self.out.push('\n');
                }
            }
        }
        struct Item<'o> {
            out: &'o mut String,
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
        let mut out = String::new();
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
