//! Request bodies for each API, and reading what comes back.
//!
//! Chat sends `messages` (a text prompt becomes one user message); the
//! Responses API sends the same messages as `input` items; the Anthropic
//! Messages API sends the leading system messages as `system` text blocks
//! and the rest as `messages` ([`split_system`]). The completions and
//! `/generate` APIs send text (a chat prompt is rendered by
//! [`Prompt::to_text`]), and so does embeddings (as `input`), which neither
//! streams nor generates. OpenAI streams ask for usage in the final chunk
//! (`stream_options.include_usage`); Responses and Messages streams always
//! report it. From each response or event we read the content text, a
//! reasoning model's thinking (apart: it times the first token but is not
//! the reply), the usage (`usage.prompt_tokens_details.cached_tokens` for OpenAI,
//! `meta_info` for `/generate`, `input_tokens_details.cached_tokens` for
//! Responses, `cache_read_input_tokens` for Messages; a missing or `null`
//! cached count is kept apart from 0, since a server that does not report
//! its cache is not one that found nothing there) and the serving
//! worker's name (`system_fingerprint` or `meta_info.worker`; the response
//! header is read by the client). Responses and Messages streams end with a
//! final event instead of `data: [DONE]` ([`Piece::done`]).

use serde::Serialize;
use serde_json::{Value, json};

use crate::workload::{Prompt, RequestSpec, Role};

/// Which HTTP API to speak: the one enum of `radixgate-routing`.
pub use radixgate_routing::Api;

/// How requests are written.
#[derive(Debug, Clone)]
pub struct BodyOptions {
    /// The API.
    pub api: Api,
    /// The `model` field (`None` leaves it out).
    pub model: Option<String>,
    /// Whether to stream.
    pub stream: bool,
}

/// Token counts a server reported for one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Of which served from the prefix cache; `None` when the server did
    /// not say (vLLM without `--enable-prompt-tokens-details`, SGLang
    /// without `--enable-cache-report`), which is not a count of 0.
    pub cached_tokens: Option<u64>,
    /// Generated tokens.
    pub completion_tokens: u64,
}

/// The messages a conversation API carries for `prompt` (a text prompt
/// becomes one user message).
pub(crate) fn conversation(prompt: &Prompt) -> Vec<(Role, &str)> {
    match prompt {
        Prompt::Chat(msgs) => msgs.iter().map(|m| (m.role, m.content.as_str())).collect(),
        Prompt::Text(t) => vec![(Role::User, t.as_str())],
    }
}

/// A conversation as the Messages API carries it: the leading system
/// messages (its `system` blocks), then the rest, where a later system
/// message goes as a user message (the API has no system role there).
pub(crate) fn split_system<'a>(
    messages: &[(Role, &'a str)],
) -> (Vec<&'a str>, Vec<(Role, &'a str)>) {
    let lead = messages
        .iter()
        .take_while(|(role, _)| *role == Role::System)
        .count();
    let system = messages[..lead].iter().map(|(_, c)| *c).collect();
    let rest = messages[lead..]
        .iter()
        .map(|&(role, c)| match role {
            Role::System => (Role::User, c),
            other => (other, c),
        })
        .collect();
    (system, rest)
}

fn role_messages(messages: &[(Role, &str)]) -> Vec<Value> {
    messages
        .iter()
        .map(|(role, content)| json!({"role": role.as_str(), "content": content}))
        .collect()
}

/// The JSON body for `spec`.
pub fn request_body(spec: &RequestSpec, opts: &BodyOptions) -> Value {
    let mut body = match opts.api {
        Api::ChatCompletions => json!({
            "messages": role_messages(&conversation(&spec.prompt)),
            "max_tokens": spec.max_tokens,
        }),
        Api::Responses => json!({
            "input": role_messages(&conversation(&spec.prompt)),
            "max_output_tokens": spec.max_tokens,
        }),
        Api::Messages => {
            let (system, rest) = split_system(&conversation(&spec.prompt));
            let mut body = json!({
                "messages": role_messages(&rest),
                "max_tokens": spec.max_tokens,
            });
            if !system.is_empty() {
                let blocks: Vec<Value> = system
                    .iter()
                    .map(|t| json!({"type": "text", "text": t}))
                    .collect();
                body["system"] = json!(blocks);
            }
            body
        }
        Api::Completions => json!({"prompt": spec.prompt.to_text(), "max_tokens": spec.max_tokens}),
        Api::Generate => json!({
            "text": spec.prompt.to_text(),
            "sampling_params": {"max_new_tokens": spec.max_tokens},
        }),
        Api::Embeddings => {
            let mut body = json!({"input": spec.prompt.to_text()});
            if let Some(m) = &opts.model {
                body["model"] = json!(m);
            }
            return body;
        }
    };
    let obj = body.as_object_mut().expect("built as an object");
    if opts.api != Api::Generate {
        if let Some(m) = &opts.model {
            obj.insert("model".into(), json!(m));
        }
        let has_stream_options = !matches!(opts.api, Api::Responses | Api::Messages);
        if opts.stream && has_stream_options {
            obj.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    obj.insert("stream".into(), json!(opts.stream));
    body
}

/// What one response body or stream chunk says.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Piece {
    /// Content text: the full reply, a stream delta, or — for `/generate`
    /// streams — the text so far.
    pub text: Option<String>,
    /// Thinking text a reasoning model sent apart from the content (chat
    /// `reasoning_content` or `reasoning`, a Messages `thinking_delta`, a
    /// Responses `response.reasoning_text.delta`): output tokens, so a
    /// stream's first token may be one, but not part of the reply.
    pub reasoning: Option<String>,
    /// Usage, when the piece carries it.
    pub usage: Option<Usage>,
    /// The serving worker, when named in the body.
    pub worker: Option<String>,
    /// An `error` object's message, when the piece is an error.
    pub error: Option<String>,
    /// The stream's final event (Responses and Messages streams end with
    /// one instead of `[DONE]`).
    pub done: bool,
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Reads a response body or a stream chunk of `api`. `Err` when the JSON is
/// not an object.
pub fn read_piece(api: Api, v: &Value) -> Result<Piece, String> {
    let Some(obj) = v.as_object() else {
        return Err("body is not a JSON object".into());
    };
    let mut p = Piece::default();
    // A Responses API failure nests its error in the response object.
    let error = obj
        .get("error")
        .or_else(|| obj.get("response").and_then(|r| r.get("error")));
    if let Some(e) = error.filter(|e| !e.is_null()) {
        let msg = e
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| e.to_string(), str::to_owned);
        p.error = Some(msg);
        return Ok(p);
    }
    // A Responses API stream's error event carries its message at the top.
    if obj.get("type").and_then(Value::as_str) == Some("error") {
        let msg = obj
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| v.to_string(), str::to_owned);
        p.error = Some(msg);
        return Ok(p);
    }
    match api {
        Api::ChatCompletions | Api::Completions | Api::Embeddings => {
            let choice = obj.get("choices").and_then(|c| c.get(0));
            let message = choice.and_then(|c| c.get("message"));
            p.text = match message.filter(|m| m.is_object()) {
                // A whole answer: its content is null when the model only
                // thought (cut by max_tokens) or only called tools.
                Some(m) => Some(m["content"].as_str().unwrap_or_default().to_owned()),
                None => choice.and_then(|c| {
                    c.get("delta")
                        .and_then(|d| d.get("content"))
                        .or_else(|| c.get("text"))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                }),
            };
            p.reasoning = message
                .or_else(|| choice.and_then(|c| c.get("delta")))
                .and_then(|m| {
                    ["reasoning_content", "reasoning"]
                        .iter()
                        .find_map(|k| m.get(k).and_then(Value::as_str))
                })
                .map(str::to_owned);
            if let Some(us) = obj.get("usage").filter(|x| x.is_object()) {
                p.usage = Some(Usage {
                    prompt_tokens: u(&us["prompt_tokens"]),
                    cached_tokens: us["prompt_tokens_details"]["cached_tokens"].as_u64(),
                    completion_tokens: u(&us["completion_tokens"]),
                });
            }
            p.worker = obj
                .get("system_fingerprint")
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
        Api::Responses => read_response(obj, &mut p),
        Api::Messages => read_message(obj, &mut p),
        Api::Generate => {
            p.text = obj.get("text").and_then(Value::as_str).map(str::to_owned);
            if let Some(meta) = obj.get("meta_info").filter(|x| x.is_object()) {
                if meta.get("prompt_tokens").is_some() {
                    p.usage = Some(Usage {
                        prompt_tokens: u(&meta["prompt_tokens"]),
                        cached_tokens: meta["cached_tokens"].as_u64(),
                        completion_tokens: u(&meta["completion_tokens"]),
                    });
                }
                p.worker = meta
                    .get("worker")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
            }
        }
    }
    Ok(p)
}

fn worker_of(obj: &serde_json::Map<String, Value>) -> Option<String> {
    obj.get("system_fingerprint")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// The text of every part of type `kind` in `content` (an array of parts).
fn part_texts(content: Option<&Value>, kind: &str) -> String {
    content
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|part| part["type"] == kind)
        .filter_map(|part| part["text"].as_str())
        .collect()
}

/// A Responses API body (a response object) or stream event.
fn read_response(obj: &serde_json::Map<String, Value>, p: &mut Piece) {
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("");
    let response = match kind {
        "response.output_text.delta" => {
            p.text = obj.get("delta").and_then(Value::as_str).map(str::to_owned);
            return;
        }
        "response.reasoning_text.delta" => {
            p.reasoning = obj.get("delta").and_then(Value::as_str).map(str::to_owned);
            return;
        }
        "response.completed" | "response.incomplete" => {
            p.done = true;
            match obj.get("response").and_then(Value::as_object) {
                Some(r) => r,
                None => return,
            }
        }
        // A whole response object, not an event.
        "" => {
            let output = obj.get("output").and_then(Value::as_array);
            p.text = Some(
                output
                    .into_iter()
                    .flatten()
                    .map(|item| part_texts(item.get("content"), "output_text"))
                    .collect(),
            );
            obj
        }
        _ => return,
    };
    if let Some(us) = response.get("usage").filter(|x| x.is_object()) {
        p.usage = Some(Usage {
            prompt_tokens: u(&us["input_tokens"]),
            cached_tokens: us["input_tokens_details"]["cached_tokens"].as_u64(),
            completion_tokens: u(&us["output_tokens"]),
        });
    }
    p.worker = worker_of(response);
}

/// An Anthropic usage object: `input_tokens` leaves out the tokens read
/// from (or written to) the prompt cache, so the prompt is their sum.
fn anthropic_usage(us: &Value) -> Usage {
    let cached = us["cache_read_input_tokens"].as_u64();
    Usage {
        prompt_tokens: u(&us["input_tokens"])
            + cached.unwrap_or(0)
            + u(&us["cache_creation_input_tokens"]),
        cached_tokens: cached,
        completion_tokens: u(&us["output_tokens"]),
    }
}

/// A Messages API body (a message object) or stream event. The stream
/// reports the prompt in `message_start` and the output in
/// `message_delta`; the client keeps the larger of each count.
fn read_message(obj: &serde_json::Map<String, Value>, p: &mut Piece) {
    match obj.get("type").and_then(Value::as_str).unwrap_or("") {
        "message" => {
            p.text = Some(part_texts(obj.get("content"), "text"));
            p.usage = obj.get("usage").map(anthropic_usage);
            p.worker = worker_of(obj);
        }
        "message_start" => {
            let message = obj.get("message");
            p.usage = message.and_then(|m| m.get("usage")).map(anthropic_usage);
            p.worker = message.and_then(Value::as_object).and_then(worker_of);
        }
        "content_block_delta" => {
            let delta = obj.get("delta");
            let field = |name: &str| {
                delta
                    .and_then(|d| d.get(name))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            };
            p.text = field("text");
            p.reasoning = field("thinking");
        }
        "message_delta" => p.usage = obj.get("usage").map(anthropic_usage),
        "message_stop" => p.done = true,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Message, Role};

    fn spec(prompt: Prompt) -> RequestSpec {
        RequestSpec {
            seq: 0,
            session: 0,
            group: 0,
            arrival: None,
            prompt,
            max_tokens: 7,
            wants_reply: false,
        }
    }

    #[test]
    fn bodies_per_api() {
        let chat = spec(Prompt::Chat(vec![
            Message::new(Role::System, "s"),
            Message::new(Role::User, "u"),
        ]));
        let o = |api, stream, model: Option<&str>| BodyOptions {
            api,
            stream,
            model: model.map(str::to_owned),
        };
        let b = request_body(&chat, &o(Api::ChatCompletions, true, Some("m")));
        assert_eq!(b["messages"][0]["role"], "system");
        assert_eq!(b["messages"][1]["content"], "u");
        assert_eq!(b["model"], "m");
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["max_tokens"], 7);
        let b = request_body(&chat, &o(Api::Completions, false, None));
        assert!(b.get("model").is_none() && b.get("stream_options").is_none());
        assert_eq!(b["prompt"], chat.prompt.to_text());
        let b = request_body(
            &spec(Prompt::Text("t".into())),
            &o(Api::Generate, true, Some("m")),
        );
        assert_eq!(b["text"], "t");
        assert_eq!(b["sampling_params"]["max_new_tokens"], 7);
        assert_eq!(b["stream"], true);
        let b = request_body(
            &spec(Prompt::Text("t".into())),
            &o(Api::ChatCompletions, false, None),
        );
        assert_eq!(b["messages"][0]["role"], "user");
        let b = request_body(&chat, &o(Api::Embeddings, true, Some("e")));
        assert_eq!(b, json!({"input": chat.prompt.to_text(), "model": "e"}));
    }

    #[test]
    fn pieces_are_read_from_every_shape() {
        let full = json!({"choices": [{"message": {"content": "hi"}}], "system_fingerprint": "w1",
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}});
        let p = read_piece(Api::ChatCompletions, &full).unwrap();
        assert_eq!(p.text.as_deref(), Some("hi"));
        assert_eq!(p.worker.as_deref(), Some("w1"));
        assert_eq!(
            p.usage,
            Some(Usage {
                prompt_tokens: 10,
                cached_tokens: Some(4),
                completion_tokens: 2
            })
        );
        let delta = json!({"choices": [{"delta": {"content": "h"}}], "usage": null});
        let p = read_piece(Api::ChatCompletions, &delta).unwrap();
        assert_eq!((p.text.as_deref(), p.usage), (Some("h"), None));
        let comp = json!({"choices": [{"text": "abc"}]});
        assert_eq!(
            read_piece(Api::Completions, &comp).unwrap().text.as_deref(),
            Some("abc")
        );
        let generate = json!({"text": "x", "meta_info": {"prompt_tokens": 8, "cached_tokens": 8, "completion_tokens": 1, "worker": "w2"}});
        let p = read_piece(Api::Generate, &generate).unwrap();
        assert_eq!(p.worker.as_deref(), Some("w2"));
        assert_eq!(p.usage.unwrap().cached_tokens, Some(8));
        let err = json!({"error": {"message": "boom", "type": "server_error"}});
        assert_eq!(
            read_piece(Api::ChatCompletions, &err)
                .unwrap()
                .error
                .as_deref(),
            Some("boom")
        );
        assert!(read_piece(Api::ChatCompletions, &json!([1])).is_err());
    }

    #[test]
    fn responses_and_messages_bodies_carry_the_conversation() {
        let chat = spec(Prompt::Chat(vec![
            Message::new(Role::System, "s1"),
            Message::new(Role::System, "s2"),
            Message::new(Role::User, "u"),
            Message::new(Role::System, "late"),
        ]));
        let o = |api| BodyOptions {
            api,
            stream: true,
            model: Some("m".into()),
        };
        let b = request_body(&chat, &o(Api::Responses));
        assert_eq!(b["input"][0], json!({"role": "system", "content": "s1"}));
        assert_eq!(b["input"].as_array().unwrap().len(), 4);
        assert_eq!(b["max_output_tokens"], 7);
        assert_eq!((&b["model"], &b["stream"]), (&json!("m"), &json!(true)));
        assert!(b.get("stream_options").is_none());
        let b = request_body(&chat, &o(Api::Messages));
        assert_eq!(
            b["system"],
            json!([{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}])
        );
        assert_eq!(
            b["messages"],
            json!([{"role": "user", "content": "u"}, {"role": "user", "content": "late"}])
        );
        assert_eq!(b["max_tokens"], 7);
        assert!(b.get("stream_options").is_none());
        let text = request_body(&spec(Prompt::Text("t".into())), &o(Api::Messages));
        assert!(text.get("system").is_none());
    }

    #[test]
    fn responses_and_messages_pieces() {
        let usage = |prompt_tokens, cached_tokens: Option<u64>, completion_tokens| Usage {
            prompt_tokens,
            cached_tokens,
            completion_tokens,
        };
        let whole = json!({"object": "response", "error": null, "system_fingerprint": "w1",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi "},
                {"type": "output_text", "text": "there"}]}],
            "usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2}});
        let p = read_piece(Api::Responses, &whole).unwrap();
        assert_eq!(p.text.as_deref(), Some("hi there"));
        assert_eq!(
            (p.usage, p.worker.as_deref()),
            (Some(usage(9, Some(4), 2)), Some("w1"))
        );
        let delta = json!({"type": "response.output_text.delta", "delta": "x"});
        assert_eq!(
            read_piece(Api::Responses, &delta).unwrap().text.as_deref(),
            Some("x")
        );
        let created = json!({"type": "response.created", "response": {"usage": null}});
        assert_eq!(
            read_piece(Api::Responses, &created).unwrap(),
            Piece::default()
        );
        let end = json!({"type": "response.incomplete", "response": {"usage": {"input_tokens": 3, "output_tokens": 1}}});
        let p = read_piece(Api::Responses, &end).unwrap();
        assert!(p.done && p.usage == Some(usage(3, None, 1)));
        // A stream's error event: its message at the top, no `error` key.
        let event = json!({"type": "error", "code": "server_error", "message": "gone", "param": null,
            "sequence_number": 4});
        assert_eq!(
            read_piece(Api::Responses, &event).unwrap().error.as_deref(),
            Some("gone")
        );
        let failed = json!({"type": "response.failed", "response": {"error": {"message": "boom"}}});
        assert_eq!(
            read_piece(Api::Responses, &failed)
                .unwrap()
                .error
                .as_deref(),
            Some("boom")
        );

        let whole = json!({"type": "message", "content": [{"type": "text", "text": "ok"}],
            "usage": {"input_tokens": 2, "cache_read_input_tokens": 6, "output_tokens": 3}});
        let p = read_piece(Api::Messages, &whole).unwrap();
        assert_eq!(
            (p.text.as_deref(), p.usage),
            (Some("ok"), Some(usage(8, Some(6), 3)))
        );
        let start = json!({"type": "message_start", "message": {"system_fingerprint": "w2",
            "usage": {"input_tokens": 5, "output_tokens": 0}}});
        let p = read_piece(Api::Messages, &start).unwrap();
        assert_eq!(
            (p.usage, p.worker.as_deref()),
            (Some(usage(5, None, 0)), Some("w2"))
        );
        let delta =
            json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "y"}});
        assert_eq!(
            read_piece(Api::Messages, &delta).unwrap().text.as_deref(),
            Some("y")
        );
        let end = json!({"type": "message_delta", "usage": {"output_tokens": 4}});
        assert_eq!(
            read_piece(Api::Messages, &end).unwrap().usage,
            Some(usage(0, None, 4))
        );
        let thinking = json!({"type": "content_block_delta",
            "delta": {"type": "thinking_delta", "thinking": "hm"}});
        let p = read_piece(Api::Messages, &thinking).unwrap();
        assert_eq!((p.text, p.reasoning.as_deref()), (None, Some("hm")));
        let thinking = json!({"type": "response.reasoning_text.delta", "delta": "hm"});
        let p = read_piece(Api::Responses, &thinking).unwrap();
        assert_eq!((p.text, p.reasoning.as_deref()), (None, Some("hm")));
        assert!(
            read_piece(Api::Messages, &json!({"type": "message_stop"}))
                .unwrap()
                .done
        );
        let err =
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}});
        assert_eq!(
            read_piece(Api::Messages, &err).unwrap().error.as_deref(),
            Some("busy")
        );
    }
}
