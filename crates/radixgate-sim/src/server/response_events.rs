//! The Responses API's and the Anthropic Messages API's answers, whole and
//! streamed, in the shapes those APIs define.
//!
//! Responses: a response object; a stream of named events, each with its
//! `type` and a `sequence_number`: `response.created` and
//! `response.in_progress` at once (before the prompt is prefilled, as vLLM
//! and OpenAI send them), the output item and its text part opening with
//! the first token, one `response.output_text.delta` per token, then the
//! item's closing events and the final `response.incomplete` (the worker
//! always stops at the token limit) carrying `usage` with `input_tokens`,
//! `output_tokens` and `input_tokens_details.cached_tokens`.
//!
//! Messages: a message object; a stream of named events: `message_start`
//! (usage with `input_tokens` — the uncached part — and
//! `cache_read_input_tokens`) and the text block's start with the first
//! token, one `content_block_delta` per token, then `content_block_stop`,
//! `message_delta` (stop reason `max_tokens`, usage with only
//! `output_tokens`, as Anthropic sends it) and `message_stop`.
//!
//! Neither stream ends with `data: [DONE]`.

use bytes::Bytes;
use serde_json::{Value, json};

use super::response::{Reply, named_sse};

/// Responses stream events before the first token's.
const RESPONSES_BEFORE_TOKENS: usize = 4;

impl Reply {
    fn response_usage(&self) -> Value {
        json!({
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }

    fn item_id(&self) -> String {
        format!("msg_{}", self.id)
    }

    /// The output message item, with the text so far.
    fn output_item(&self, text: &str, status: &str) -> Value {
        json!({
            "type": "message",
            "id": self.item_id(),
            "status": status,
            "role": "assistant",
            "content": if status == "in_progress" {
                json!([])
            } else {
                json!([self.text_part(text)])
            },
        })
    }

    fn text_part(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": []})
    }

    /// A response object: finished (with output and usage), or just begun.
    pub(super) fn response_object(&self, finished: bool) -> Value {
        let (status, output, usage, incomplete) = if finished {
            (
                "incomplete",
                json!([self.output_item(&self.text, "incomplete")]),
                self.response_usage(),
                json!({"reason": "max_output_tokens"}),
            )
        } else {
            ("in_progress", json!([]), Value::Null, Value::Null)
        };
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "model": &*self.model,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "output": output,
            "usage": usage,
            "system_fingerprint": &*self.worker,
        })
    }

    fn response_event(&self, kind: &str, seq: usize, mut fields: Value) -> Bytes {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(seq);
        named_sse(kind, &fields)
    }

    pub(super) fn responses_preamble(&self) -> Bytes {
        let begun = self.response_object(false);
        let mut out = self
            .response_event("response.created", 0, json!({"response": begun}))
            .to_vec();
        out.extend_from_slice(&self.response_event(
            "response.in_progress",
            1,
            json!({"response": begun}),
        ));
        Bytes::from(out)
    }

    pub(super) fn responses_opening(&self) -> Bytes {
        let mut out = self
            .response_event(
                "response.output_item.added",
                2,
                json!({"output_index": 0, "item": self.output_item("", "in_progress")}),
            )
            .to_vec();
        out.extend_from_slice(&self.response_event(
            "response.content_part.added",
            3,
            json!({"item_id": self.item_id(), "output_index": 0, "content_index": 0,
                   "part": self.text_part("")}),
        ));
        Bytes::from(out)
    }

    pub(super) fn responses_delta(&self, from: usize, to: usize) -> Bytes {
        self.response_event(
            "response.output_text.delta",
            RESPONSES_BEFORE_TOKENS + from,
            json!({"item_id": self.item_id(), "output_index": 0, "content_index": 0,
                   "delta": self.piece(from, to)}),
        )
    }

    pub(super) fn responses_closing(&self) -> Bytes {
        let seq = RESPONSES_BEFORE_TOKENS + self.completion_tokens;
        let at = json!({"item_id": self.item_id(), "output_index": 0, "content_index": 0});
        let with = |mut v: Value, key: &str, value: Value| {
            v[key] = value;
            v
        };
        let events = [
            self.response_event(
                "response.output_text.done",
                seq,
                with(at.clone(), "text", json!(self.text)),
            ),
            self.response_event(
                "response.content_part.done",
                seq + 1,
                with(at, "part", self.text_part(&self.text)),
            ),
            self.response_event(
                "response.output_item.done",
                seq + 2,
                json!({"output_index": 0, "item": self.output_item(&self.text, "incomplete")}),
            ),
            self.response_event(
                "response.incomplete",
                seq + 3,
                json!({"response": self.response_object(true)}),
            ),
        ];
        Bytes::from(events.concat())
    }

    fn message_usage(&self) -> Value {
        json!({
            "input_tokens": self.prompt_tokens - self.cached_tokens.min(self.prompt_tokens),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached_tokens,
            "output_tokens": self.completion_tokens,
        })
    }

    /// The whole message object.
    pub(super) fn message_object(&self) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": &*self.model,
            "content": [{"type": "text", "text": self.text}],
            "stop_reason": "max_tokens",
            "stop_sequence": null,
            "usage": self.message_usage(),
            "system_fingerprint": &*self.worker,
        })
    }

    pub(super) fn messages_opening(&self) -> Bytes {
        let mut usage = self.message_usage();
        usage["output_tokens"] = json!(0);
        let start = json!({
            "type": "message_start",
            "message": {
                "id": self.id,
                "type": "message",
                "role": "assistant",
                "model": &*self.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": usage,
                "system_fingerprint": &*self.worker,
            },
        });
        let block = json!({
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        });
        let mut out = named_sse("message_start", &start).to_vec();
        out.extend_from_slice(&named_sse("content_block_start", &block));
        Bytes::from(out)
    }

    pub(super) fn messages_delta(&self, from: usize, to: usize) -> Bytes {
        named_sse(
            "content_block_delta",
            &json!({
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": self.piece(from, to)},
            }),
        )
    }

    pub(super) fn messages_closing(&self) -> Bytes {
        let events = [
            named_sse(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            ),
            named_sse(
                "message_delta",
                &json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                    "usage": {"output_tokens": self.completion_tokens},
                }),
            ),
            named_sse("message_stop", &json!({"type": "message_stop"})),
        ];
        Bytes::from(events.concat())
    }
}
