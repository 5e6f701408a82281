//! Response bodies of the generation APIs, whole and streamed.
//!
//! One `Reply` describes a generated answer; the functions here render it
//! as an OpenAI chat/completions object, an SGLang `/generate` object, or
//! the SSE events of each API (the Responses and Messages shapes are in
//! `response_events.rs`). Every body names the worker (OpenAI, Responses,
//! Messages: `system_fingerprint`; SGLang: `meta_info.worker`) because
//! routers may drop unknown response headers but pass bodies through.
//!
//! A stream is: the preamble (events sent at once, before the prompt is
//! prefilled: the Responses API's `response.created`), the opening (sent
//! with the first token: chat's assistant role, the Messages API's
//! `message_start`), one event per token, and the closing.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use super::request::Api;

/// A generated answer and its accounting.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) api: Api,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: Arc<str>,
    pub(crate) worker: Arc<str>,
    /// The whole reply text (`completion_tokens * chars_per_token` chars).
    pub(crate) text: String,
    pub(crate) chars_per_token: usize,
    pub(crate) prompt_tokens: usize,
    pub(crate) cached_tokens: usize,
    pub(crate) completion_tokens: usize,
    /// The item's place in a `/generate` batch (0 outside one).
    pub(crate) index: usize,
    /// Whether the stream ends with `data: [DONE]` (not a batch item's:
    /// the batch sends one after all of them).
    pub(crate) done_event: bool,
    /// vLLM prefill: the `kv_transfer_params` a whole answer carries for
    /// the decode step.
    pub(crate) kv_transfer_params: Option<Value>,
}

impl Reply {
    /// The text of output tokens `from..to` (0-based, end exclusive).
    pub(super) fn piece(&self, from: usize, to: usize) -> &str {
        let cpt = self.chars_per_token;
        let end = (to * cpt).min(self.text.len());
        &self.text[(from * cpt).min(end)..end]
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }

    fn meta_info(&self, completion_tokens: usize, finished: bool) -> Value {
        json!({
            "id": self.id,
            "finish_reason": if finished {
                json!({"type": "length", "length": self.completion_tokens})
            } else {
                Value::Null
            },
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": self.cached_tokens,
            "worker": &*self.worker,
        })
    }

    /// The non-streamed response body.
    pub(crate) fn full(&self) -> Value {
        let mut v = self.full_body();
        if let Some(p) = &self.kv_transfer_params {
            v["kv_transfer_params"] = p.clone();
        }
        v
    }

    fn full_body(&self) -> Value {
        match self.api {
            Api::Chat => json!({
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": &*self.model,
                "system_fingerprint": &*self.worker,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": self.text},
                    "logprobs": null,
                    "finish_reason": "length",
                }],
                "usage": self.usage(),
            }),
            Api::Completions => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": &*self.model,
                "system_fingerprint": &*self.worker,
                "choices": [{"index": 0, "text": self.text, "logprobs": null, "finish_reason": "length"}],
                "usage": self.usage(),
            }),
            Api::Generate => json!({
                "text": self.text,
                "meta_info": self.meta_info(self.completion_tokens, true),
            }),
            Api::Responses => self.response_object(true),
            Api::Messages => self.message_object(),
        }
    }

    fn chunk(&self, choice: Value, usage: Option<Value>) -> Value {
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            _ => "text_completion",
        };
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": &*self.model,
            "system_fingerprint": &*self.worker,
            "choices": choice,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    /// Events sent as soon as a stream starts, before the prompt is
    /// prefilled (the Responses API's `response.created`).
    pub(crate) fn preamble(&self) -> Option<Bytes> {
        (self.api == Api::Responses).then(|| self.responses_preamble())
    }

    /// Events sent with the first token (chat: the assistant role).
    pub(crate) fn opening(&self, include_usage: bool) -> Option<Bytes> {
        match self.api {
            Api::Chat => {
                let usage = include_usage.then_some(Value::Null);
                Some(sse(&self.chunk(
                    json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                    usage,
                )))
            }
            Api::Responses => Some(self.responses_opening()),
            Api::Messages => Some(self.messages_opening()),
            Api::Completions | Api::Generate => None,
        }
    }

    /// The event for tokens `from..to`; `last` marks the final token.
    pub(crate) fn tokens(&self, from: usize, to: usize, last: bool, include_usage: bool) -> Bytes {
        let text = self.piece(from, to);
        let finish = if last { json!("length") } else { Value::Null };
        let usage = include_usage.then_some(Value::Null);
        match self.api {
            Api::Chat => sse(&self.chunk(
                json!([{"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": finish}]),
                usage,
            )),
            Api::Completions => sse(&self.chunk(
                json!([{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}]),
                usage,
            )),
            Api::Generate => sse(&json!({
                "text": self.piece(0, to),
                "meta_info": self.meta_info(to, last),
                "index": self.index,
            })),
            Api::Responses => self.responses_delta(from, to),
            Api::Messages => self.messages_delta(from, to),
        }
    }

    /// The closing events: the usage chunk if asked (OpenAI APIs), `[DONE]`;
    /// the Responses and Messages APIs' own final events.
    pub(crate) fn closing(&self, include_usage: bool) -> Vec<Bytes> {
        match self.api {
            Api::Responses => return vec![self.responses_closing()],
            Api::Messages => return vec![self.messages_closing()],
            Api::Chat | Api::Completions | Api::Generate => {}
        }
        let mut out = Vec::new();
        if include_usage && self.api != Api::Generate {
            out.push(sse(&self.chunk(json!([]), Some(self.usage()))));
        }
        if self.done_event {
            out.push(Bytes::from_static(DONE_EVENT));
        }
        out
    }

    /// A zero-token reply finishes without a token event: its final event
    /// (none where the closing events say it all).
    pub(crate) fn empty_finish(&self, include_usage: bool) -> Option<Bytes> {
        let usage = include_usage.then_some(Value::Null);
        match self.api {
            Api::Chat => Some(sse(&self.chunk(
                json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"}]),
                usage,
            ))),
            Api::Completions => Some(sse(&self.chunk(
                json!([{"index": 0, "text": "", "logprobs": null, "finish_reason": "length"}]),
                usage,
            ))),
            Api::Generate => Some(sse(
                &json!({"text": "", "meta_info": self.meta_info(0, true), "index": self.index}),
            )),
            Api::Responses | Api::Messages => None,
        }
    }
}

/// The event that ends an OpenAI or SGLang stream.
pub(crate) const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

/// One SSE event with a name: `event: {name}\ndata: {json}\n\n`.
pub(crate) fn named_sse(name: &str, v: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"event: ");
    buf.extend_from_slice(name.as_bytes());
    buf.extend_from_slice(b"\ndata: ");
    serde_json::to_writer(&mut buf, v).expect("a JSON value serialises");
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

/// One SSE event: `data: {json}\n\n`.
pub(crate) fn sse(v: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut buf, v).expect("a JSON value serialises");
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}
