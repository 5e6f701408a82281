//! Parsing of the OpenAI Responses and Anthropic Messages bodies into the
//! worker's one internal request.
//!
//! Both carry a conversation, which the worker renders with its chat
//! template as it does a chat request's messages, so the same conversation
//! sent through chat, Responses or Messages is the same prompt to the KV
//! cache. Responses: `instructions` is a system message; `input` is a
//! string (one user message) or items — messages, and function calls and
//! their outputs as assistant and tool messages; other items (reasoning,
//! references) are not shown to the model. Messages: `system` (a string or
//! text blocks) is a system message; tool calls and tool results render as
//! text in their messages. Like the servers it imitates, Messages requires
//! `max_tokens`; both stream their usage without being asked.

use serde::Deserialize;
use serde_json::Value;

use super::request::{GenRequest, Prompt, bad, content_text, max_tokens};
use crate::error::SimError;
use crate::tokens::{ChatMessage, render_chat};

#[derive(Deserialize)]
struct ResponsesBody {
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Deserialize)]
struct MessagesBody {
    messages: Vec<AnthropicMessage>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Deserialize)]
struct AnthropicMessage {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

fn message(role: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: role.to_owned(),
        content,
    }
}

fn text_of(v: Option<&Value>) -> &str {
    v.and_then(Value::as_str).unwrap_or_default()
}

/// Parses a `/v1/responses` body.
pub(super) fn responses(body: &[u8], default_max_tokens: usize) -> Result<GenRequest, SimError> {
    let b: ResponsesBody = serde_json::from_slice(body).map_err(bad)?;
    let mut messages = Vec::new();
    if let Some(instructions) = b.instructions {
        messages.push(message("system", instructions));
    }
    let bad_input = || {
        SimError::bad_request(
            "input must be a string or an array of input items",
            Some("input"),
        )
    };
    match b.input {
        Some(Value::String(text)) => messages.push(message("user", text)),
        Some(Value::Array(items)) => {
            for item in items {
                let Value::Object(mut item) = item else {
                    return Err(bad_input());
                };
                match text_of(item.get("type")) {
                    "" | "message" => {
                        let role = text_of(item.get("role")).to_owned();
                        if role.is_empty() {
                            return Err(SimError::bad_request(
                                "a message item needs a role",
                                Some("input"),
                            ));
                        }
                        messages.push(message(&role, content_text(item.remove("content"))?));
                    }
                    "function_call" => {
                        let call = format!(
                            "<tool_call>{}({})</tool_call>",
                            text_of(item.get("name")),
                            text_of(item.get("arguments"))
                        );
                        messages.push(message("assistant", call));
                    }
                    "function_call_output" => {
                        let output = match item.remove("output") {
                            Some(Value::String(s)) => s,
                            other => content_text(other)?,
                        };
                        messages.push(message("tool", output));
                    }
                    _ => {}
                }
            }
        }
        _ => return Err(bad_input()),
    }
    if messages.is_empty() {
        return Err(SimError::bad_request(
            "input must not be empty",
            Some("input"),
        ));
    }
    Ok(GenRequest {
        prompt: Prompt::Text(render_chat(&messages)),
        max_tokens: max_tokens(b.max_output_tokens, default_max_tokens, "max_output_tokens")?,
        stream: b.stream.unwrap_or(false),
        include_usage: true,
    })
}

/// The text of Messages content: a string, or blocks (text, tool calls and
/// results as text, anything else left out).
fn blocks_text(content: Option<Value>, param: &str) -> Result<String, SimError> {
    let blocks = match content {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s),
        Some(Value::Array(blocks)) => blocks,
        Some(_) => {
            return Err(SimError::bad_request(
                "content must be a string or an array of content blocks",
                Some(param),
            ));
        }
    };
    let mut out = String::new();
    for mut block in blocks {
        if !block.is_object() {
            return Err(SimError::bad_request(
                "a content block must be an object",
                Some(param),
            ));
        }
        match text_of(block.get("type")) {
            "tool_use" => {
                let input = block.get("input").map(Value::to_string).unwrap_or_default();
                out.push_str(&format!(
                    "<tool_call>{}({input})</tool_call>",
                    text_of(block.get("name"))
                ));
            }
            "tool_result" => {
                let inner = block.get_mut("content").map(Value::take);
                out.push_str(&blocks_text(inner, param)?);
            }
            _ => out.push_str(text_of(block.get("text"))),
        }
    }
    Ok(out)
}

/// Parses a `/v1/messages` body; `generating` requires `max_tokens` (token
/// counting does not).
pub(super) fn messages(body: &[u8], generating: bool) -> Result<GenRequest, SimError> {
    let b: MessagesBody = serde_json::from_slice(body).map_err(bad)?;
    if b.messages.is_empty() {
        return Err(SimError::bad_request(
            "messages must not be empty",
            Some("messages"),
        ));
    }
    let limit = match b.max_tokens {
        Some(limit) => limit,
        None if !generating => 0,
        None => {
            return Err(SimError::bad_request(
                "max_tokens is required",
                Some("max_tokens"),
            ));
        }
    };
    let mut messages = Vec::with_capacity(b.messages.len() + 1);
    let system = blocks_text(b.system, "system")?;
    if !system.is_empty() {
        messages.push(message("system", system));
    }
    for m in b.messages {
        messages.push(message(&m.role, blocks_text(m.content, "messages")?));
    }
    Ok(GenRequest {
        prompt: Prompt::Text(render_chat(&messages)),
        max_tokens: max_tokens(Some(limit), 0, "max_tokens")?,
        stream: b.stream.unwrap_or(false),
        include_usage: true,
    })
}

#[cfg(test)]
mod tests {
    use super::super::request::{Api, parse};
    use super::*;

    fn prompt(api: Api, body: &str) -> String {
        match parse(api, body.as_bytes(), 16)
            .unwrap()
            .items
            .remove(0)
            .prompt
        {
            Prompt::Text(t) => t,
            Prompt::Ids(_) => panic!("a conversation is text"),
        }
    }

    #[test]
    fn one_conversation_is_one_prompt_through_every_api() {
        let chat = prompt(
            Api::Chat,
            r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}]}"#,
        );
        let responses = prompt(
            Api::Responses,
            r#"{"instructions":"S","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#,
        );
        let messages = prompt(
            Api::Messages,
            r#"{"system":[{"type":"text","text":"S"}],"max_tokens":3,
                "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
        );
        assert_eq!(responses, chat);
        assert_eq!(messages, chat);
        assert_eq!(
            prompt(Api::Responses, r#"{"input":"hi","instructions":"S"}"#),
            chat
        );
    }

    #[test]
    fn tools_and_limits() {
        let r = parse(
            Api::Responses,
            br#"{"input":[{"type":"function_call","name":"f","arguments":"{}","call_id":"c"},
                {"type":"function_call_output","call_id":"c","output":"42"},
                {"type":"reasoning","id":"r"}],"max_output_tokens":5,"stream":true}"#,
            16,
        )
        .unwrap()
        .items
        .remove(0);
        assert!(r.stream && r.include_usage && r.max_tokens == 5);
        let Prompt::Text(t) = r.prompt else { panic!() };
        assert!(t.contains("<tool_call>f({})</tool_call>") && t.contains("tool\n42"));
        let m = prompt(
            Api::Messages,
            r#"{"max_tokens":1,"messages":[{"role":"assistant","content":[
                {"type":"tool_use","id":"t","name":"g","input":{"a":1}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"7"}]}]}"#,
        );
        assert!(m.contains("<tool_call>g({\"a\":1})</tool_call>") && m.contains("user\n7"));
    }

    #[test]
    fn errors_name_the_field() {
        for (api, body, param) in [
            (Api::Responses, r#"{}"#, "input"),
            (Api::Responses, r#"{"input":5}"#, "input"),
            (Api::Responses, r#"{"input":[]}"#, "input"),
            (
                Api::Responses,
                r#"{"input":[{"content":"no role"}]}"#,
                "input",
            ),
            (
                Api::Responses,
                r#"{"input":"x","max_output_tokens":9999999999}"#,
                "max_output_tokens",
            ),
            (Api::Messages, r#"{"messages":[]}"#, "messages"),
            (
                Api::Messages,
                r#"{"messages":[{"role":"user","content":"x"}]}"#,
                "max_tokens",
            ),
            (
                Api::Messages,
                r#"{"max_tokens":1,"messages":[{"role":"user","content":5}]}"#,
                "messages",
            ),
            (
                Api::Messages,
                r#"{"max_tokens":1,"system":{},"messages":[{"role":"user","content":"x"}]}"#,
                "system",
            ),
        ] {
            let e = parse(api, body.as_bytes(), 16).unwrap_err();
            assert!(
                matches!(&e, SimError::BadRequest { param: Some(p), .. } if p == param),
                "{body}: {e:?}"
            );
        }
        assert!(parse(Api::Messages, b"{", 16).is_err());
    }
}
