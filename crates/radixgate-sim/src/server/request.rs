//! Parsing of the generation APIs into one internal request (the
//! Responses and Messages bodies in `conversation.rs`).
//!
//! The worker is lenient like the servers it imitates: unknown fields are
//! ignored (routers and SDKs add their own), but what it needs must be well
//! formed, or the client gets a 400 naming the field.

use serde::Deserialize;
use serde_json::Value;

use crate::error::SimError;
use crate::tokens::{ChatMessage, render_chat};

/// Which API a request came in on (decides the response shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// OpenAI `/v1/chat/completions`.
    Chat,
    /// OpenAI `/v1/completions`.
    Completions,
    /// SGLang `/generate`.
    Generate,
    /// OpenAI `/v1/responses`.
    Responses,
    /// Anthropic `/v1/messages`.
    Messages,
}

/// What to generate from.
#[derive(Debug, Clone)]
pub(crate) enum Prompt {
    /// Text (chat already rendered with its template).
    Text(String),
    /// Token ids (SGLang `input_ids`).
    Ids(Vec<u64>),
}

/// A parsed generation request.
#[derive(Debug, Clone)]
pub(crate) struct GenRequest {
    pub(crate) prompt: Prompt,
    pub(crate) max_tokens: usize,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
}

/// The most output tokens one request may ask for.
pub const MAX_OUTPUT_TOKENS: usize = 1 << 20;

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<MessageBody>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct MessageBody {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Value,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct GenerateBody {
    #[serde(default)]
    text: Option<Value>,
    #[serde(default)]
    input_ids: Option<Value>,
    #[serde(default)]
    sampling_params: Option<SamplingParams>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Deserialize, Default)]
struct SamplingParams {
    #[serde(default)]
    max_new_tokens: Option<u64>,
}

pub(super) fn bad(e: serde_json::Error) -> SimError {
    SimError::bad_request(format!("invalid request body: {e}"), None)
}

pub(super) fn max_tokens(v: Option<u64>, default: usize, param: &str) -> Result<usize, SimError> {
    match v {
        None => Ok(default),
        Some(n) if n as usize <= MAX_OUTPUT_TOKENS => Ok(n as usize),
        Some(n) => Err(SimError::bad_request(
            format!("{param} = {n} exceeds the limit of {MAX_OUTPUT_TOKENS}"),
            Some(param),
        )),
    }
}

pub(super) fn content_text(content: Option<Value>) -> Result<String, SimError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                if let Some(t) = p.get("text").and_then(Value::as_str) {
                    out.push_str(t);
                }
            }
            Ok(out)
        }
        Some(_) => Err(SimError::bad_request(
            "message content must be a string or an array of parts",
            Some("messages"),
        )),
    }
}

fn prompt_text(v: Value, param: &str) -> Result<String, SimError> {
    match v {
        Value::String(s) => Ok(s),
        Value::Array(mut items) if items.len() == 1 && items[0].is_string() => Ok(items
            .pop()
            .and_then(|s| s.as_str().map(str::to_owned))
            .unwrap_or_default()),
        _ => Err(SimError::bad_request(
            format!("{param} must be a string (or a list of exactly one string)"),
            Some(param),
        )),
    }
}

/// A parsed request body: one request, or a `/generate` batch (`text` a
/// list of strings, or `input_ids` a list of lists), answered as a list.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// The requests, in the batch's order (one outside a batch).
    pub(crate) items: Vec<GenRequest>,
    /// Whether the body was a batch (even of one).
    pub(crate) batch: bool,
}

/// The prompts of a `/generate` body and whether it is a batch.
fn generate_prompts(
    text: Option<Value>,
    ids: Option<Value>,
) -> Result<(Vec<Prompt>, bool), SimError> {
    let ids_of = |v: Value, param: &str| -> Result<Vec<u64>, SimError> {
        serde_json::from_value(v).map_err(|_| {
            SimError::bad_request(
                format!("{param} must be a list of token ids (or a list of such lists)"),
                Some("input_ids"),
            )
        })
    };
    match (text, ids) {
        (Some(Value::Array(items)), _) => {
            let prompts = items
                .into_iter()
                .map(|t| match t {
                    Value::String(s) => Ok(Prompt::Text(s)),
                    _ => Err(SimError::bad_request(
                        "text must be a string or a list of strings",
                        Some("text"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((prompts, true))
        }
        (Some(t), _) => Ok((vec![Prompt::Text(prompt_text(t, "text")?)], false)),
        (None, Some(Value::Array(items))) if items.first().is_some_and(Value::is_array) => {
            let prompts = items
                .into_iter()
                .map(|v| ids_of(v, "input_ids[i]").map(Prompt::Ids))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((prompts, true))
        }
        (None, Some(v)) => Ok((vec![Prompt::Ids(ids_of(v, "input_ids")?)], false)),
        (None, None) => Err(SimError::bad_request(
            "one of text or input_ids is required",
            Some("text"),
        )),
    }
}

/// Parses `body` for `api` (see [`Parsed`]).
pub(crate) fn parse(api: Api, body: &[u8], default_max_tokens: usize) -> Result<Parsed, SimError> {
    if api == Api::Generate {
        return parse_generate(body, default_max_tokens);
    }
    Ok(Parsed {
        items: vec![parse_one(api, body, default_max_tokens)?],
        batch: false,
    })
}

fn parse_generate(body: &[u8], default_max_tokens: usize) -> Result<Parsed, SimError> {
    let b: GenerateBody = serde_json::from_slice(body).map_err(bad)?;
    let (prompts, batch) = generate_prompts(b.text, b.input_ids)?;
    if prompts.is_empty() {
        return Err(SimError::bad_request(
            "a batch needs at least one prompt",
            Some("text"),
        ));
    }
    let sp = b.sampling_params.unwrap_or_default();
    let max_tokens = max_tokens(
        sp.max_new_tokens,
        default_max_tokens,
        "sampling_params.max_new_tokens",
    )?;
    let stream = b.stream.unwrap_or(false);
    let items = prompts
        .into_iter()
        .map(|prompt| GenRequest {
            prompt,
            max_tokens,
            stream,
            include_usage: true,
        })
        .collect();
    Ok(Parsed { items, batch })
}

fn parse_one(api: Api, body: &[u8], default_max_tokens: usize) -> Result<GenRequest, SimError> {
    match api {
        Api::Chat => {
            let b: ChatBody = serde_json::from_slice(body).map_err(bad)?;
            if b.messages.is_empty() {
                return Err(SimError::bad_request(
                    "messages must not be empty",
                    Some("messages"),
                ));
            }
            let messages = b
                .messages
                .into_iter()
                .map(|m| {
                    Ok(ChatMessage {
                        role: m.role,
                        content: content_text(m.content)?,
                    })
                })
                .collect::<Result<Vec<_>, SimError>>()?;
            let (v, param) = match (b.max_completion_tokens, b.max_tokens) {
                (Some(n), _) => (Some(n), "max_completion_tokens"),
                (None, n) => (n, "max_tokens"),
            };
            Ok(GenRequest {
                prompt: Prompt::Text(render_chat(&messages)),
                max_tokens: max_tokens(v, default_max_tokens, param)?,
                stream: b.stream.unwrap_or(false),
                include_usage: b
                    .stream_options
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            })
        }
        Api::Completions => {
            let b: CompletionBody = serde_json::from_slice(body).map_err(bad)?;
            Ok(GenRequest {
                prompt: Prompt::Text(prompt_text(b.prompt, "prompt")?),
                max_tokens: max_tokens(b.max_tokens, default_max_tokens, "max_tokens")?,
                stream: b.stream.unwrap_or(false),
                include_usage: b
                    .stream_options
                    .and_then(|o| o.include_usage)
                    .unwrap_or(false),
            })
        }
        // `parse` takes /generate bodies apart (batches); one item here.
        Api::Generate => parse_generate(body, default_max_tokens)?
            .items
            .into_iter()
            .next()
            .ok_or_else(|| SimError::bad_request("no prompt", Some("text"))),
        Api::Responses => super::conversation::responses(body, default_max_tokens),
        Api::Messages => super::conversation::messages(body, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_takes_max_completion_tokens_and_parts() {
        let body = br#"{"model":"x","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
            "max_completion_tokens":5,"max_tokens":9,"stream":true,"stream_options":{"include_usage":true},"extra":1}"#;
        let r = parse(Api::Chat, body, 16).unwrap().items.remove(0);
        assert_eq!(r.max_tokens, 5);
        assert!(r.stream && r.include_usage);
        let Prompt::Text(t) = r.prompt else { panic!() };
        assert_eq!(t, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn errors_name_the_field() {
        assert!(parse(Api::Chat, b"{", 16).is_err());
        assert!(parse(Api::Chat, br#"{"messages":[]}"#, 16).is_err());
        let e = parse(Api::Completions, br#"{"prompt":5}"#, 16).unwrap_err();
        assert!(matches!(e, SimError::BadRequest { param: Some(ref p), .. } if p == "prompt"));
        assert!(parse(Api::Generate, br#"{"sampling_params":{}}"#, 16).is_err());
        assert!(parse(Api::Completions, br#"{"prompt":"a","max_tokens":-1}"#, 16).is_err());
        let r = parse(Api::Generate, br#"{"input_ids":[1,2,3]}"#, 7).unwrap();
        assert_eq!((r.items[0].max_tokens, r.batch), (7, false));
        assert!(parse(Api::Generate, br#"{"text":["a", 5]}"#, 16).is_err());
        assert!(parse(Api::Generate, br#"{"input_ids":[[1], "x"]}"#, 16).is_err());
        assert!(parse(Api::Generate, br#"{"text":[]}"#, 16).is_err());
    }

    #[test]
    fn generate_lists_are_batches() {
        let r = parse(Api::Generate, br#"{"text":["a", "b"]}"#, 16).unwrap();
        assert!(r.batch);
        assert_eq!(r.items.len(), 2);
        let r = parse(Api::Generate, br#"{"input_ids":[[1, 2], [3]]}"#, 16).unwrap();
        assert!(r.batch);
        assert!(matches!(&r.items[1].prompt, Prompt::Ids(ids) if ids == &[3]));
        let r = parse(Api::Generate, br#"{"text":["one"]}"#, 16).unwrap();
        assert!(
            r.batch,
            "a list of one is a batch of one, answered as a list"
        );
        let r = parse(Api::Generate, br#"{"text":"one"}"#, 16).unwrap();
        assert!(!r.batch);
    }
}
