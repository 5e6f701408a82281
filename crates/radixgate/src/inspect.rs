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
//! The Responses and Anthropic Messages bodies have modules of their own
//! (`responses`, `messages`).
//!
//! A request's cache namespace is read here too: vLLM's `cache_salt`,
//! SGLang's `lora_path` (a string, or a list per batch item) and
//! `extra_key`. The routing text is marked with it
//! ([`CacheNamespace`]), so requests an engine would keep apart in its
//! cache never match each other's prefixes. (vLLM serves a LoRA adapter
//! under its own model name, which is already a pool of its own.)
//!
//! Endpoints routed by load alone (reranking, scoring, tokenizing, APIs the
//! gateway does not know) need only the model: [`inspect_model`], or for
//! an upload (`multipart/form-data`) its form's `model` field (`form`).

use radixgate_routing::CacheNamespace;
use radixgate_routing::text::{ContentText, PromptText, RoutingText, Speaker, ToolCallsText};
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::ops::Range;
use text::Text;

pub(crate) use form::{boundary as form_boundary, inspect_form};

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
    /// The request is in a cache namespace of its own (a LoRA adapter, a
    /// cache salt or an extra key): it shares no cached block with
    /// requests outside it, whatever their token ids.
    pub namespaced: bool,
    /// The `user` field, a fallback sticky-session key.
    pub user: Option<String>,
    /// An OpenAI stream's `stream_options`, where the body has them (read
    /// for tenants whose tokens are metered: `crate::tenants::usage_event`).
    pub stream_options: StreamOptions,
    /// A Responses API request's `previous_response_id`: the stored
    /// response it continues, held by the worker that made it.
    pub previous_response_id: Option<String>,
    /// A Responses API request that asks for its response not to be
    /// stored (`store: false`, or `null`, which the engines read so): no
    /// later request can name it, so its id is not kept.
    pub unstored: bool,
}

/// The `stream_options` of a chat or text completion request: whether the
/// client asked for the usage event, and where to edit the body to ask
/// for it (`crate::tenants`, for a tenant whose tokens are metered).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum StreamOptions {
    /// Not an API that has them: its streams always report usage.
    #[default]
    NotApplicable,
    /// The body has no `stream_options`.
    Absent,
    /// `stream_options: null`, the value at `at`.
    Null {
        /// The value's byte range in the body.
        at: Range<usize>,
    },
    /// An object.
    Object {
        /// Its byte range in the body.
        at: Range<usize>,
        /// Whether the client asked for the usage event: its last
        /// `include_usage` is one a Python worker reads as true (`true`,
        /// `1`, `"true"`, `"yes"`, ...; see [`reads_as_true`]).
        asked: bool,
        /// The byte ranges of its `include_usage` values that are not
        /// (`false`, `0`, `"no"`, `null`, or one a worker refuses).
        declined: Vec<Range<usize>>,
        /// Whether it has no `include_usage` at all (the server's default
        /// decides: vLLM's sends usage, SGLang's does not).
        unset: bool,
    },
    /// Anything else, which a worker refuses.
    Other,
}

impl StreamOptions {
    /// The options as read: `raw` is the value as written, a slice of
    /// `body`.
    fn read(body: &[u8], raw: Option<&RawValue>) -> Self {
        let Some(raw) = raw else {
            return Self::Absent;
        };
        let Some(at) = range_in(body, raw) else {
            // Not a slice of the body after all (serde_json borrows raw
            // values from a slice it reads): nothing to edit in place.
            return Self::NotApplicable;
        };
        if raw.get() == "null" {
            return Self::Null { at };
        }
        let Ok(IncludeUsage(values)) = serde_json::from_str::<IncludeUsage<'_>>(raw.get()) else {
            return Self::Other;
        };
        let declines = |v: &RawValue| !reads_as_true(v.get());
        Self::Object {
            asked: values.last().is_some_and(|v| !declines(v)),
            declined: values
                .iter()
                .filter(|v| declines(v))
                .filter_map(|v| range_in(body, v))
                .collect(),
            unset: values.is_empty(),
            at,
        }
    }

    /// Whether the client asked for the usage event.
    pub fn usage_asked(&self) -> bool {
        matches!(self, Self::Object { asked: true, .. })
    }
}

/// Whether a JSON value, as written, is one the Python servers' request
/// models (pydantic, in its default lax mode) read as a true boolean: the
/// literal, a number equal to 1 (`1`, `1.0`), or a string spelling of
/// true in any case. Anything else is false there, or refused. Read as
/// [`null_as_false`] reads `stream`: the one statement of that rule.
fn reads_as_true(json: &str) -> bool {
    let mut value = serde_json::Deserializer::from_str(json);
    matches!(null_as_false(&mut value), Ok(true))
}

/// The strings a Python worker's pydantic model reads as `true`, in any
/// case.
const TRUE_WORDS: [&str; 6] = ["true", "1", "yes", "on", "t", "y"];

/// Where `raw`, borrowed from `body`, lies in it.
fn range_in(body: &[u8], raw: &RawValue) -> Option<Range<usize>> {
    let text = raw.get();
    let start = (text.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let at = start..start + text.len();
    (body.get(at.clone()) == Some(text.as_bytes())).then_some(at)
}

/// Every `include_usage` value of a `stream_options` object, as written
/// (a key written twice is read twice; JSON readers in Python keep the
/// last). Other keys are skipped unread.
struct IncludeUsage<'a>(Vec<&'a RawValue>);

impl<'de> Deserialize<'de> for IncludeUsage<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IncludeUsage<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut values = Vec::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == "include_usage" {
                        values.push(map.next_value::<&'de RawValue>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(IncludeUsage(values))
            }
        }
        d.deserialize_map(V)
    }
}

/// Why a body could not be inspected. Always the client's fault.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The body is not JSON, or a field routing reads has the wrong type.
    #[error("invalid JSON body: {0}")]
    Json(#[from] serde_json::Error),
    /// The body is JSON, but not an object (serde would read an array as a
    /// struct's fields in order).
    #[error("invalid JSON body: a request is a JSON object")]
    NotAnObject,
}

/// `body` after its UTF-8 byte order mark, if it starts with one: every
/// reader of a request body the router passed ([`inspect`]) passes over
/// it too, or the body would be refused there (a prefill/decode pool's
/// edit) or go unread (KV events' tokenizing).
pub(crate) fn without_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body)
}

/// Refuses a body that does not start with `{` (after white space); a
/// UTF-8 byte order mark before it is passed over, as the Python servers'
/// JSON reader passes it over (some Windows clients write one).
fn object(body: &[u8]) -> Result<&[u8], InspectError> {
    let body = without_bom(body);
    match body.trim_ascii_start().first() {
        Some(b'{') => Ok(body),
        Some(_) => Err(InspectError::NotAnObject),
        // Empty: serde's own "EOF" message says it best.
        None => Ok(body),
    }
}

/// Reads `body` as a request to `api`.
pub fn inspect(api: Api, whole: &[u8]) -> Result<Inspected, InspectError> {
    let body = object(whole)?;
    let mut text = RoutingText::new();
    let mut stream_options = StreamOptions::NotApplicable;
    let mut previous_response_id = None;
    let mut unstored = false;
    let (model, stream, user, keys) = match api {
        Api::ChatCompletions => {
            let req: ChatRequest<'_> = serde_json::from_slice(body)?;
            for message in &req.messages.0 {
                message.render(&mut text);
            }
            stream_options = StreamOptions::read(whole, req.stream_options);
            let keys = cache_keys!(req);
            (req.model, req.stream, req.user, keys)
        }
        Api::Completions => {
            let req: PromptRequest<'_> = serde_json::from_slice(body)?;
            match (&req.prompt, &req.prompt_embeds) {
                (Some(prompt), _) => text.push_prompt(&prompt.0),
                // vLLM's prompt embeddings: no text to route by.
                (None, Some(_)) => {}
                (None, None) => return Err(InspectError::Json(de::Error::missing_field("prompt"))),
            }
            stream_options = StreamOptions::read(whole, req.stream_options);
            let keys = cache_keys!(req);
            (req.model, req.stream, req.user, keys)
        }
        Api::Generate => {
            let req: GenerateRequest<'_> = serde_json::from_slice(body)?;
            if let Some(prompt) = req.text.as_ref().or(req.input_ids.as_ref()) {
                text.push_prompt(&prompt.0);
            }
            let keys = cache_keys!(req);
            (req.model, req.stream, None, keys)
        }
        Api::Embeddings => {
            let req: EmbeddingRequest<'_> = serde_json::from_slice(body)?;
            match (&req.input, &req.messages) {
                (Some(input), _) => text.push_prompt(&input.0),
                // vLLM's chat embeddings: rendered as a chat's messages.
                (None, Some(messages)) => {
                    for message in &messages.0 {
                        message.render(&mut text);
                    }
                }
                (None, None) => return Err(InspectError::Json(de::Error::missing_field("input"))),
            }
            let keys = cache_keys!(req);
            (req.model, false, req.user, keys)
        }
        Api::Responses => {
            let req: responses::Request<'_> = serde_json::from_slice(body)?;
            req.render(&mut text);
            previous_response_id = req.previous_response_id.map(Cow::into_owned);
            unstored = !req.store;
            let keys = cache_keys!(req);
            (req.model, req.stream, req.user, keys)
        }
        Api::Messages => {
            let req: messages::Request<'_> = serde_json::from_slice(body)?;
            req.render(&mut text);
            let keys = cache_keys!(req);
            let user = req.metadata.and_then(|m| m.user_id);
            (req.model, req.stream, user, keys)
        }
    };
    let namespace = keys.namespace();
    Ok(Inspected {
        model: model.map(Cow::into_owned),
        stream,
        namespaced: !namespace.is_shared(),
        routing_text: text.into_string_in(&namespace),
        user: user.map(Cow::into_owned),
        stream_options,
        previous_response_id,
        unstored,
    })
}

/// Reads only the `model` (and a `stream: true`) of a request to an
/// endpoint that is routed by load alone, whatever else its body holds.
/// The body must still be JSON, and `model` a string if present.
pub fn inspect_model(body: &[u8]) -> Result<Inspected, InspectError> {
    #[derive(Deserialize)]
    struct ModelOnly<'a> {
        #[serde(borrow, default)]
        model: Option<Cow<'a, str>>,
        /// An API the gateway does not know decides what its `stream`
        /// means: only `true` is read as a stream, anything else is
        /// passed over, not refused.
        #[serde(default, deserialize_with = "only_true")]
        stream: bool,
    }
    let req: ModelOnly<'_> = serde_json::from_slice(object(body)?)?;
    Ok(Inspected {
        model: req.model.map(Cow::into_owned),
        stream: req.stream,
        ..Inspected::default()
    })
}

/// Whether a value reads as true to a Python worker ([`null_as_false`]),
/// anything else taken for false, never refused.
fn only_true<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(null_as_false(value).unwrap_or(false))
}

/// The fields that put a request in a cache namespace of its own; every
/// request type has them (`cache_keys!` moves them here).
struct CacheKeys<'a> {
    /// vLLM `cache_salt`.
    cache_salt: Option<Cow<'a, str>>,
    /// SGLang `lora_path`.
    lora_path: Option<LoraPath>,
    /// SGLang `extra_key`.
    extra_key: Option<Cow<'a, str>>,
}

/// The [`CacheKeys`] of a parsed request (a struct with the three fields).
macro_rules! cache_keys {
    ($req:expr) => {
        CacheKeys {
            cache_salt: $req.cache_salt,
            lora_path: $req.lora_path,
            extra_key: $req.extra_key,
        }
    };
}
use cache_keys;

impl CacheKeys<'_> {
    fn namespace(&self) -> CacheNamespace {
        let mut ns = CacheNamespace::shared();
        if let Some(salt) = &self.cache_salt {
            ns = ns.with_salt(salt);
        }
        if let Some(key) = &self.extra_key {
            ns = ns.with_extra_key(key);
        }
        match &self.lora_path {
            Some(LoraPath::One(name)) => ns.with_adapter(name),
            Some(LoraPath::Batch(names)) => {
                ns.with_batch_adapters(names.iter().map(|n| n.as_deref()))
            }
            None => ns,
        }
    }
}

/// SGLang's `lora_path`: one adapter, or one per prompt of a batch (`null`
/// for the base model).
enum LoraPath {
    One(String),
    Batch(Vec<Option<String>>),
}

impl<'de> Deserialize<'de> for LoraPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LoraPath;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an adapter name, or a list of adapter names or nulls")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<LoraPath, E> {
                Ok(LoraPath::One(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LoraPath, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<Option<String>>()? {
                    names.push(name);
                }
                Ok(LoraPath::Batch(names))
            }
        }
        d.deserialize_any(V)
    }
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
    /// `stream_options` as written, `null` included (a key present twice is
    /// refused, so this is the only one).
    #[serde(borrow, default, deserialize_with = "raw_value")]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
    #[serde(default)]
    lora_path: Option<LoraPath>,
    #[serde(borrow, default)]
    extra_key: Option<Cow<'a, str>>,
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
        text::string_seq_or_null(d, V)
    }
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(default)]
    image_url: Option<UrlField>,
    /// A file part's id (Responses `input_image`/`input_file`), which names
    /// it when no URL does.
    #[serde(borrow, default)]
    file_id: Option<Cow<'a, str>>,
}

impl Part<'_> {
    fn render(&self, out: &mut ContentText) {
        match &self.text {
            Some(text) => out.push_text(&text.0),
            None => out.push_part(
                self.kind.as_deref(),
                self.image_url
                    .as_ref()
                    .map(|u| u.0.as_str())
                    .or(self.file_id.as_deref()),
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
    /// Required unless `prompt_embeds` stands in for it.
    #[serde(default, deserialize_with = "present")]
    prompt: Option<TextOrIds>,
    /// vLLM's prompt embeddings (with `--enable-prompt-embeds`), which may
    /// replace `prompt`; not read.
    #[serde(default)]
    prompt_embeds: Option<IgnoredAny>,
    /// `stream_options` as written, `null` included (a key present twice is
    /// refused, so this is the only one).
    #[serde(borrow, default, deserialize_with = "raw_value")]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
    #[serde(default)]
    lora_path: Option<LoraPath>,
    #[serde(borrow, default)]
    extra_key: Option<Cow<'a, str>>,
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
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
    #[serde(default)]
    lora_path: Option<LoraPath>,
    #[serde(borrow, default)]
    extra_key: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct EmbeddingRequest<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    user: Option<Cow<'a, str>>,
    /// Required unless `messages` stands in for it.
    #[serde(default, deserialize_with = "present")]
    input: Option<TextOrIds>,
    /// vLLM's chat embeddings: a chat's messages in place of `input`.
    #[serde(borrow, default)]
    messages: Option<Messages<'a>>,
    #[serde(borrow, default)]
    cache_salt: Option<Cow<'a, str>>,
    #[serde(default)]
    lora_path: Option<LoraPath>,
    #[serde(borrow, default)]
    extra_key: Option<Cow<'a, str>>,
}

/// A prompt in any of the shapes the APIs allow: a string, token ids, or a
/// batch of either (arrays nest at most two deep), or of SGLang's
/// multimodal embedding inputs (`{"text": ..., "image": ..., "video": ...}`,
/// rendered as content parts are). The deserialiser walks the shape and
/// tells the routing text rule where each batch item ends.
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
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
                if self.depth != 1 {
                    return Err(de::Error::invalid_type(de::Unexpected::Map, &self));
                }
                let input =
                    MultimodalInput::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let mut content = ContentText::default();
                if let Some(text) = &input.text {
                    content.push_text(&text.0);
                }
                for (kind, source) in [("image", &input.image), ("video", &input.video)] {
                    if let Some(source) = source {
                        content.push_part(Some(kind), Some(source));
                    }
                }
                self.out.push_text(content.as_str());
                self.end_batch_item();
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
        let top = V {
            out: &mut out,
            depth: 0,
        };
        text::string_or_seq(d, top)?;
        Ok(TextOrIds(out))
    }
}

/// One of SGLang's multimodal embedding inputs, an item of a batch.
#[derive(Deserialize)]
struct MultimodalInput<'a> {
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(borrow, default)]
    image: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    video: Option<Cow<'a, str>>,
}

/// A prompt that may be absent; `null` reads as an empty one, as it did
/// when the prompt had to be present.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TextOrIds>, D::Error> {
    TextOrIds::deserialize(d).map(Some)
}

/// A value as written, `null` too (`Option<&RawValue>` would read `null`
/// as absent).
fn raw_value<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A flag (`stream`) as the engines' pydantic models read it, lax: `true`
/// and `false`, `null` (the default, false), `0` and `1` (`0.0` and `1.0`
/// too), and the strings [`reads_as_true`] takes or their opposites
/// (`"false"`, `"0"`, `"no"`, `"off"`, `"f"`, `"n"`), in any case.
/// Anything else is refused, as the engines refuse it.
pub(crate) fn null_as_false<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct Flag;
    impl<'de> Visitor<'de> for Flag {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a boolean (true, false, 0, 1, \"true\", \"false\", ...)")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_none<E: de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_any(self)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
            match v {
                0 | 1 => Ok(v == 1),
                _ => Err(E::invalid_value(de::Unexpected::Unsigned(v), &self)),
            }
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
            match v {
                0 | 1 => Ok(v == 1),
                _ => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
            }
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
            // pydantic's lax mode takes a float that is exactly 0 or 1.
            if v == 0.0 || v == 1.0 {
                Ok(v == 1.0)
            } else {
                Err(E::invalid_value(de::Unexpected::Float(v), &self))
            }
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            let is = |words: &[&str]| words.iter().any(|w| v.eq_ignore_ascii_case(w));
            if is(&TRUE_WORDS) {
                Ok(true)
            } else if is(&["false", "0", "no", "off", "f", "n"]) {
                Ok(false)
            } else {
                Err(E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }
    }
    d.deserialize_any(Flag)
}

mod form;
mod messages;
mod responses;
#[cfg(test)]
mod tests;
mod text;
