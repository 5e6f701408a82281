//! Reading a request body the way the engine reads it: which endpoint, which
//! prompt, and which options change the prompt's tokens.
//!
//! Facts this follows (from the engines' OpenAI-compatible servers):
//! - `/v1/completions` (vLLM): `prompt` is a string, a list of token ids, or
//!   a list of those; `add_special_tokens` defaults to true (a BOS where the
//!   tokenizer adds one). Ids are used as given.
//! - `/generate` (SGLang): `text` or `input_ids` (either may be a batch);
//!   text is encoded with the tokenizer's default, i.e. with special tokens.
//! - `/v1/chat/completions`: the messages go through the chat template with
//!   `add_generation_prompt=True`, and the rendered text is encoded *without*
//!   adding special tokens again (vLLM's `add_special_tokens` defaults to
//!   false for chat; SGLang passes `add_special_tokens=False` where the
//!   tokenizer would add some), because the template already wrote them.
//!
//! The two engines differ in details that change the tokens, so the engine is
//! a setting ([`Engine`]); see its variants.

use serde_json::{Map, Value};

use crate::error::{TokenizeError, invalid};

/// An inference endpoint whose body names a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// OpenAI `/v1/chat/completions`: messages through the chat template.
    ChatCompletions,
    /// OpenAI `/v1/completions`: a text or token-id prompt.
    Completions,
    /// SGLang native `/generate`: `text` or `input_ids`.
    Generate,
}

impl Endpoint {
    /// The endpoint served at `path`, if it is one of these.
    pub fn from_path(path: &str) -> Option<Self> {
        match path {
            "/v1/chat/completions" => Some(Self::ChatCompletions),
            "/v1/completions" => Some(Self::Completions),
            "/generate" => Some(Self::Generate),
            _ => None,
        }
    }

    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
            Self::Generate => "/generate",
        }
    }
}

/// Whose rules to follow where vLLM and SGLang prepare a chat prompt
/// differently. The text and id endpoints are the same under both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Engine {
    /// vLLM: text parts of a message's content are joined with `"\n"`;
    /// `add_generation_prompt` (default true), `continue_final_message` and
    /// `add_special_tokens` (default false) are taken from the request; tools
    /// reach the template even with `tool_choice: "none"`.
    #[default]
    Vllm,
    /// SGLang: text parts are joined with `" "`; the generation prompt is
    /// always added; a final assistant message with text content is sent
    /// as a user message of that text alone (no name, reasoning or tool
    /// calls) unless `continue_final_message`, in which case its text
    /// follows the generation prompt; `tool_choice: "none"` drops the tools.
    Sglang,
}

/// What the body asks the engine to compute.
#[derive(Debug)]
pub(crate) enum Prompt<'a> {
    /// Token ids given in the body: no tokenizer needed.
    Ids(Vec<u32>),
    /// A text to encode.
    Text {
        text: &'a str,
        add_special_tokens: bool,
    },
    /// A chat completion request.
    Chat(&'a Map<String, Value>),
}

/// Classify `body` for `endpoint`.
pub(crate) fn prompt_of(endpoint: Endpoint, body: &Value) -> Result<Prompt<'_>, TokenizeError> {
    let Value::Object(map) = body else {
        return Err(invalid("the body must be a JSON object"));
    };
    match endpoint {
        Endpoint::ChatCompletions => Ok(Prompt::Chat(map)),
        Endpoint::Completions => {
            if map.get("prompt_embeds").is_some_and(|v| !v.is_null()) {
                return Err(TokenizeError::Unsupported("prompt_embeds"));
            }
            let prompt = map
                .get("prompt")
                .ok_or_else(|| invalid("/v1/completions needs `prompt`"))?;
            let add_special_tokens = flag(map, "add_special_tokens", true)?;
            text_or_ids(prompt, "prompt", add_special_tokens)
        }
        Endpoint::Generate => {
            if map.get("input_embeds").is_some_and(|v| !v.is_null()) {
                return Err(TokenizeError::Unsupported("input_embeds"));
            }
            let text = map.get("text").filter(|v| !v.is_null());
            let ids = map.get("input_ids").filter(|v| !v.is_null());
            match (text, ids) {
                (Some(_), Some(_)) => Err(invalid(
                    "/generate takes either `text` or `input_ids`, not both",
                )),
                (None, None) => Err(invalid("/generate needs `text` or `input_ids`")),
                (Some(text), None) => text_or_ids_strict(text, "text", true, Kind::Text),
                (None, Some(ids)) => text_or_ids_strict(ids, "input_ids", true, Kind::Ids),
            }
        }
    }
}

#[derive(PartialEq)]
enum Kind {
    Text,
    Ids,
}

/// `/generate`'s fields each hold one kind.
fn text_or_ids_strict<'a>(
    value: &'a Value,
    field: &str,
    add_special_tokens: bool,
    kind: Kind,
) -> Result<Prompt<'a>, TokenizeError> {
    let prompt = text_or_ids(value, field, add_special_tokens)?;
    match (&prompt, kind) {
        (Prompt::Text { .. }, Kind::Text) | (Prompt::Ids(_), Kind::Ids) => Ok(prompt),
        (_, Kind::Text) => Err(invalid(format!("`{field}` must be a string"))),
        (_, Kind::Ids) => Err(invalid(format!("`{field}` must be a list of token ids"))),
    }
}

/// A string, a list of ids, or a batch of one of those.
fn text_or_ids<'a>(
    value: &'a Value,
    field: &str,
    add_special_tokens: bool,
) -> Result<Prompt<'a>, TokenizeError> {
    match value {
        Value::String(text) => {
            if text.is_empty() {
                return Err(invalid(format!("`{field}` is empty")));
            }
            Ok(Prompt::Text {
                text,
                add_special_tokens,
            })
        }
        Value::Array(items) => match items.first() {
            None => Err(invalid(format!("`{field}` is empty"))),
            Some(Value::Number(_)) => ids(items, field).map(Prompt::Ids),
            Some(Value::String(_) | Value::Array(_)) => {
                if items.len() > 1 {
                    // One request, one worker, one prefix: a batch has several.
                    return Err(TokenizeError::Unsupported(
                        "a batch of several prompts in one request",
                    ));
                }
                match &items[0] {
                    Value::Array(inner) if inner.first().is_some_and(Value::is_array) => Err(
                        invalid(format!("`{field}` nests lists of token ids too deeply")),
                    ),
                    inner => text_or_ids(inner, field, add_special_tokens),
                }
            }
            Some(_) => Err(invalid(format!(
                "`{field}` must be a string, a list of token ids, or a list of those"
            ))),
        },
        _ => Err(invalid(format!(
            "`{field}` must be a string, a list of token ids, or a list of those"
        ))),
    }
}

fn ids(items: &[Value], field: &str) -> Result<Vec<u32>, TokenizeError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    invalid(format!(
                        "`{field}`[{i}] is {v}, not a token id (an integer in 0..2^32)"
                    ))
                })
        })
        .collect()
}

/// An optional boolean field.
pub(crate) fn flag(
    map: &Map<String, Value>,
    key: &str,
    default: bool,
) -> Result<bool, TokenizeError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(invalid(format!("`{key}` must be a boolean, got {other}"))),
    }
}

/// [`body_token_ids`] of a body whose prompt is one flat, non-empty list of
/// ids (`/generate` `input_ids`, a `/v1/completions` `prompt`), read from
/// its bytes without building a JSON tree: a tree holds each id as a value
/// of its own, about ten times the body's size (a 30 MB body of 3.5
/// million ids took 332 MB). `None` for any other body, which is then to
/// be read as a [`Value`]: a text prompt, a batch, both fields, a field of
/// the wrong type, an error; the answer for those is that path's.
pub fn flat_token_ids(endpoint: Endpoint, bytes: &[u8]) -> Option<Vec<u32>> {
    use serde::de::IgnoredAny;
    #[derive(serde::Deserialize)]
    struct Generate {
        #[serde(default)]
        input_ids: Option<FlatIds>,
        #[serde(default)]
        text: Option<IgnoredAny>,
        #[serde(default)]
        input_embeds: Option<IgnoredAny>,
    }
    #[derive(serde::Deserialize)]
    struct Completions {
        #[serde(default)]
        prompt: Option<FlatIds>,
        #[serde(default)]
        prompt_embeds: Option<IgnoredAny>,
        /// Read only so that a value of the wrong type leaves the body to
        /// the tree of values, which refuses it.
        #[serde(default, rename = "add_special_tokens")]
        _add_special_tokens: Option<bool>,
    }
    let ids = match endpoint {
        Endpoint::Generate => match serde_json::from_slice::<Generate>(bytes).ok()? {
            Generate {
                input_ids: Some(FlatIds(ids)),
                text: None,
                input_embeds: None,
            } => ids,
            _ => return None,
        },
        Endpoint::Completions => match serde_json::from_slice::<Completions>(bytes).ok()? {
            Completions {
                prompt: Some(FlatIds(ids)),
                prompt_embeds: None,
                ..
            } => ids,
            _ => return None,
        },
        Endpoint::ChatCompletions => return None,
    };
    (!ids.is_empty()).then_some(ids)
}

/// A list of token ids, or a batch of exactly one such list (which the
/// tree of values reads as that list), read without keeping anything but
/// the ids; any other shape is an error, which leaves the body to the tree.
struct FlatIds(Vec<u32>);

impl<'de> serde::Deserialize<'de> for FlatIds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{Error, SeqAccess, Visitor};
        /// An array's first item: an id, or a whole list of ids.
        enum First {
            Id(u32),
            List(Vec<u32>),
        }
        impl<'de> serde::Deserialize<'de> for First {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = First;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a token id or a list of them")
                    }
                    fn visit_u64<E: Error>(self, n: u64) -> Result<First, E> {
                        u32::try_from(n).map(First::Id).map_err(E::custom)
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<First, A::Error> {
                        let ids: Vec<u32> = serde::Deserialize::deserialize(
                            serde::de::value::SeqAccessDeserializer::new(seq),
                        )?;
                        Ok(First::List(ids))
                    }
                }
                d.deserialize_any(V)
            }
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FlatIds;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of token ids, or a list of one such list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FlatIds, A::Error> {
                match seq.next_element::<First>()? {
                    None => Ok(FlatIds(Vec::new())),
                    Some(First::Id(first)) => {
                        let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0) + 1);
                        ids.push(first);
                        while let Some(id) = seq.next_element::<u32>()? {
                            ids.push(id);
                        }
                        Ok(FlatIds(ids))
                    }
                    Some(First::List(ids)) => match seq.next_element::<serde::de::IgnoredAny>()? {
                        None => Ok(FlatIds(ids)),
                        Some(_) => Err(A::Error::custom("a batch of several prompts")),
                    },
                }
            }
        }
        d.deserialize_seq(V)
    }
}

/// The token ids a body carries itself — `/generate`'s `input_ids`, or a
/// `/v1/completions` prompt given as ids — so that no tokenizer is needed.
/// `Ok(None)` when the body carries text (or chat messages) instead.
pub fn body_token_ids(endpoint: Endpoint, body: &Value) -> Result<Option<Vec<u32>>, TokenizeError> {
    match prompt_of(endpoint, body)? {
        Prompt::Ids(ids) => Ok(Some(ids)),
        Prompt::Text { .. } | Prompt::Chat(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ids_of(endpoint: Endpoint, body: Value) -> Result<Option<Vec<u32>>, TokenizeError> {
        body_token_ids(endpoint, &body)
    }

    #[test]
    fn paths_map_to_endpoints_and_back() {
        for e in [
            Endpoint::ChatCompletions,
            Endpoint::Completions,
            Endpoint::Generate,
        ] {
            assert_eq!(Endpoint::from_path(e.path()), Some(e));
        }
        assert_eq!(Endpoint::from_path("/v1/embeddings"), None);
    }

    #[test]
    fn flat_ids_are_read_from_the_bytes_as_the_tree_would_read_them() {
        use Endpoint::*;
        let cases = [
            (Generate, json!({"input_ids": [1, 2, 3]}), true),
            (
                Generate,
                json!({"input_ids": [1], "text": null, "sampling_params": {"max_new_tokens": 2}}),
                true,
            ),
            (Generate, json!({"input_ids": [4294967295u64, 0]}), true),
            (Completions, json!({"prompt": [7, 8]}), true),
            (
                Completions,
                json!({"prompt": [7], "add_special_tokens": false}),
                true,
            ),
            // A batch of one list of ids is that list.
            (Generate, json!({"input_ids": [[4, 5]]}), true),
            (Completions, json!({"prompt": [[9]]}), true),
            // Everything else is left to the tree of values.
            (Generate, json!({"input_ids": [[4, 5], [6]]}), false),
            (Generate, json!({"input_ids": [[]]}), false),
            (Generate, json!({"input_ids": [[[4]]]}), false),
            (Generate, json!({"input_ids": [[4], 5]}), false),
            (Generate, json!({"input_ids": [4, [5]]}), false),
            (Generate, json!({"input_ids": []}), false),
            (Generate, json!({"input_ids": [1, 4294967296u64]}), false),
            (Generate, json!({"input_ids": [1.0]}), false),
            (Generate, json!({"input_ids": [-1]}), false),
            (Generate, json!({"input_ids": [1], "text": "x"}), false),
            (
                Generate,
                json!({"input_ids": [1], "input_embeds": [[0.5]]}),
                false,
            ),
            (Generate, json!({"text": "hi"}), false),
            (Generate, json!([1, 2]), false),
            (Completions, json!({"prompt": "text"}), false),
            (
                Completions,
                json!({"prompt": [7], "add_special_tokens": "yes"}),
                false,
            ),
            (
                Completions,
                json!({"prompt": [7], "prompt_embeds": "e"}),
                false,
            ),
            (ChatCompletions, json!({"messages": []}), false),
        ];
        for (endpoint, body, flat) in cases {
            let bytes = serde_json::to_vec(&body).unwrap();
            let fast = flat_token_ids(endpoint, &bytes);
            assert_eq!(fast.is_some(), flat, "{body}");
            if let Some(fast) = fast {
                assert_eq!(
                    Some(fast),
                    body_token_ids(endpoint, &body).unwrap(),
                    "{body}"
                );
            }
        }
        // A key given twice: the tree keeps the last, so the bytes defer.
        let twice = br#"{"input_ids": [1], "input_ids": [2]}"#;
        assert_eq!(flat_token_ids(Generate, twice), None);
        assert_eq!(flat_token_ids(Generate, b"not json"), None);
    }

    #[test]
    fn ids_without_a_tokenizer() {
        use Endpoint::*;
        assert_eq!(
            ids_of(Generate, json!({"input_ids": [1, 2, 3]})).unwrap(),
            Some(vec![1, 2, 3])
        );
        assert_eq!(
            ids_of(Generate, json!({"input_ids": [[4, 5]]})).unwrap(),
            Some(vec![4, 5])
        );
        assert_eq!(
            ids_of(Completions, json!({"prompt": [7, 8]})).unwrap(),
            Some(vec![7, 8])
        );
        assert_eq!(
            ids_of(Completions, json!({"prompt": [[9]]})).unwrap(),
            Some(vec![9])
        );
        assert_eq!(
            ids_of(Completions, json!({"prompt": "text"})).unwrap(),
            None
        );
        assert_eq!(
            ids_of(Generate, json!({"text": "t", "input_ids": null})).unwrap(),
            None
        );
        assert_eq!(
            ids_of(ChatCompletions, json!({"messages": []})).unwrap(),
            None
        );
    }

    #[test]
    fn malformed_prompts_are_client_errors_that_say_why() {
        use Endpoint::*;
        for (endpoint, body, needle) in [
            (
                Generate,
                json!({"input_ids": [1, -2]}),
                "`input_ids`[1] is -2",
            ),
            (
                Generate,
                json!({"input_ids": [1, 4294967296u64]}),
                "not a token id",
            ),
            (Generate, json!({"input_ids": [1.5]}), "not a token id"),
            (Generate, json!({"input_ids": []}), "is empty"),
            (
                Generate,
                json!({"input_ids": "12"}),
                "must be a list of token ids",
            ),
            (Generate, json!({"text": [1, 2]}), "`text` must be a string"),
            (Generate, json!({"text": "a", "input_ids": [1]}), "not both"),
            (
                Generate,
                json!({"sampling_params": {}}),
                "needs `text` or `input_ids`",
            ),
            (Completions, json!({"max_tokens": 3}), "needs `prompt`"),
            (Completions, json!({"prompt": ""}), "is empty"),
            (Completions, json!({"prompt": {"a": 1}}), "must be a string"),
            (Completions, json!({"prompt": [true]}), "must be a string"),
            (Completions, json!({"prompt": [[[1]]]}), "too deeply"),
            (
                Completions,
                json!({"prompt": "x", "add_special_tokens": "yes"}),
                "must be a boolean",
            ),
            (Completions, json!([1, 2]), "must be a JSON object"),
        ] {
            let err = ids_of(endpoint, body.clone()).unwrap_err();
            assert!(err.is_client_error(), "{body}: {err}");
            assert!(err.to_string().contains(needle), "{body}: {err}");
        }
    }

    #[test]
    fn batches_and_embeddings_are_refused_as_unsupported() {
        use Endpoint::*;
        for (endpoint, body) in [
            (Completions, json!({"prompt": ["a", "b"]})),
            (Completions, json!({"prompt": [[1], [2]]})),
            (Generate, json!({"input_ids": [[1], [2]]})),
            (Generate, json!({"text": ["a", "b"]})),
            (Generate, json!({"input_embeds": [[0.1]]})),
            (Completions, json!({"prompt_embeds": "AAAA"})),
        ] {
            let err = ids_of(endpoint, body.clone()).unwrap_err();
            assert!(
                matches!(err, TokenizeError::Unsupported(_)),
                "{body}: {err}"
            );
        }
    }
}
