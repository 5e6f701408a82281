//! Request bodies for each API, and reading what comes back.
//!
//! Chat sends `messages` (a text prompt becomes one user message); the
//! completions and `/generate` APIs send text (a chat prompt is rendered by
//! [`Prompt::to_text`]), and so does embeddings (as `input`), which neither
//! streams nor generates; `--api` offers only the three generation APIs. Streams ask for usage in the final chunk
//! (`stream_options.include_usage`). From each response or chunk we read the
//! content text, the usage (`usage.prompt_tokens_details.cached_tokens` for
//! OpenAI, `meta_info` for `/generate`) and the serving worker's name
//! (`system_fingerprint` or `meta_info.worker`; the response header is read
//! by the client).

use serde::Serialize;
use serde_json::{Value, json};

use crate::workload::{Prompt, RequestSpec};

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
    /// Of which served from the prefix cache.
    pub cached_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
}

/// The JSON body for `spec`.
pub fn request_body(spec: &RequestSpec, opts: &BodyOptions) -> Value {
    let mut body = match opts.api {
        Api::ChatCompletions => {
            let messages: Vec<Value> = match &spec.prompt {
                Prompt::Chat(msgs) => msgs
                    .iter()
                    .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
                    .collect(),
                Prompt::Text(t) => vec![json!({"role": "user", "content": t})],
            };
            json!({"messages": messages, "max_tokens": spec.max_tokens})
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
        if opts.stream {
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
    /// Usage, when the piece carries it.
    pub usage: Option<Usage>,
    /// The serving worker, when named in the body.
    pub worker: Option<String>,
    /// An `error` object's message, when the piece is an error.
    pub error: Option<String>,
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
    if let Some(e) = obj.get("error").filter(|e| !e.is_null()) {
        let msg = e
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| e.to_string(), str::to_owned);
        p.error = Some(msg);
        return Ok(p);
    }
    match api {
        Api::ChatCompletions | Api::Completions | Api::Embeddings => {
            let choice = obj.get("choices").and_then(|c| c.get(0));
            p.text = choice.and_then(|c| {
                c.get("delta")
                    .or_else(|| c.get("message"))
                    .and_then(|m| m.get("content"))
                    .or_else(|| c.get("text"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
            if let Some(us) = obj.get("usage").filter(|x| x.is_object()) {
                p.usage = Some(Usage {
                    prompt_tokens: u(&us["prompt_tokens"]),
                    cached_tokens: u(&us["prompt_tokens_details"]["cached_tokens"]),
                    completion_tokens: u(&us["completion_tokens"]),
                });
            }
            p.worker = obj
                .get("system_fingerprint")
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
        Api::Generate => {
            p.text = obj.get("text").and_then(Value::as_str).map(str::to_owned);
            if let Some(meta) = obj.get("meta_info").filter(|x| x.is_object()) {
                if meta.get("prompt_tokens").is_some() {
                    p.usage = Some(Usage {
                        prompt_tokens: u(&meta["prompt_tokens"]),
                        cached_tokens: u(&meta["cached_tokens"]),
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
                cached_tokens: 4,
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
        assert_eq!(p.usage.unwrap().cached_tokens, 8);
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
}
