//! A chat request's messages and options, prepared for the template as the
//! engine prepares them.
//!
//! Both engines (vLLM's chat utilities, SGLang's serving_chat):
//! - give a template that takes content as a string the text parts joined
//!   (`"\n"` in vLLM, `" "` in SGLang), and a template that loops over
//!   `message.content` a list of `{"type": "text", "text": ...}` parts (vLLM
//!   also wraps a plain string as one part; SGLang leaves it a string, and
//!   gives parts also to a template whose text names a medium, see
//!   [`crate::template::mentions_media`]);
//! - give a message with `content: null` the empty string;
//! - leave out keys whose value is null (vLLM passes only the keys it
//!   knows, see [`vllm_keys`]; SGLang every field of its message model,
//!   an empty `tool_calls` included);
//! - parse an assistant tool call's `arguments` from its JSON string into an
//!   object (tool-use templates expect a mapping there), `{}` when empty;
//! - pass `tools` (each as the engine's request model dumps it: its
//!   declared fields first, in their order, absent ones as null),
//!   `chat_template_kwargs` (merged into the context) and, in vLLM,
//!   `documents`.

use minijinja::Value as JinjaValue;
use serde_json::{Map, Value};

use crate::error::{TokenizeError, invalid};
use crate::request::{Engine, flag};

/// The template's context and how to finish the prompt.
pub(crate) struct PreparedChat {
    /// `messages`, `tools`, `add_generation_prompt`, ... (special tokens are
    /// added by the caller, under these).
    pub(crate) context: Map<String, Value>,
    /// vLLM's `continue_final_message`: cut the render after the final
    /// message's text (transformers' rule).
    pub(crate) continue_final: Option<String>,
    /// SGLang's `continue_final_message`: text appended after the render.
    pub(crate) append: Option<String>,
    /// Encode the render with special tokens (vLLM's request option).
    pub(crate) add_special_tokens: bool,
}

/// Read `body` (a chat completion request) under `engine`'s rules.
///
/// `content_parts`: the template iterates over a message's content (see
/// [`crate::template::iterates_message_content`]), so content goes to it as
/// a list of parts rather than a string. `wrapped_tools`: the template
/// reads a tool's fields under its `function` (see
/// [`crate::template::reads_wrapped_tools`]).
pub(crate) fn prepare(
    body: &Map<String, Value>,
    engine: Engine,
    content_parts: bool,
    wrapped_tools: bool,
) -> Result<PreparedChat, TokenizeError> {
    let messages = match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(invalid("`messages` is empty")),
        Some(_) => return Err(invalid("`messages` must be a list")),
        None => return Err(invalid("/v1/chat/completions needs `messages`")),
    };
    let mut prepared = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        prepared.push(message_for_template(message, i, engine, content_parts)?);
    }

    let continue_final_message = flag(body, "continue_final_message", false)?;
    let mut add_generation_prompt = flag(body, "add_generation_prompt", true)?;
    let add_special_tokens = flag(body, "add_special_tokens", false)?;
    let mut continue_final = None;
    let mut append = None;
    let last_is_assistant = prepared
        .last()
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        == Some("assistant");

    match engine {
        Engine::Vllm => {
            if continue_final_message {
                if add_generation_prompt && body.contains_key("add_generation_prompt") {
                    return Err(invalid(
                        "`continue_final_message` and `add_generation_prompt` cannot both be true",
                    ));
                }
                add_generation_prompt = false;
                let text = final_text(prepared.last()).ok_or_else(|| {
                    invalid("`continue_final_message` is set but the final message has no text")
                })?;
                continue_final = Some(text);
            }
        }
        Engine::Sglang => {
            add_generation_prompt = true;
            if last_is_assistant
                && let Some(last) = prepared.last_mut()
                && let Some(Value::String(text)) = last.get("content").cloned()
            {
                if continue_final_message {
                    prepared.pop();
                    append = Some(text);
                } else {
                    // A new message of the text alone: the reply's name,
                    // reasoning and tool calls do not reach the template.
                    *last = Map::from_iter([
                        ("role".to_owned(), Value::String("user".into())),
                        ("content".to_owned(), Value::String(text)),
                    ]);
                }
            }
        }
    }

    let mut context = Map::new();
    if let Some(kwargs) = body.get("chat_template_kwargs").filter(|v| !v.is_null()) {
        let Value::Object(kwargs) = kwargs else {
            return Err(invalid("`chat_template_kwargs` must be an object"));
        };
        for (k, v) in kwargs {
            context.insert(k.clone(), v.clone());
        }
    }
    if engine == Engine::Sglang
        && let Some(effort) = body.get("reasoning_effort").filter(|v| !v.is_null())
    {
        context
            .entry("reasoning_effort")
            .or_insert_with(|| effort.clone());
    }
    context.insert(
        "messages".into(),
        Value::Array(prepared.into_iter().map(Value::Object).collect()),
    );
    context.insert("tools".into(), tools(body, engine, wrapped_tools)?);
    if engine == Engine::Vllm
        && let Some(docs) = body.get("documents").filter(|v| !v.is_null())
    {
        context.insert("documents".into(), docs.clone());
    }
    context.insert(
        "add_generation_prompt".into(),
        Value::Bool(add_generation_prompt),
    );
    Ok(PreparedChat {
        context,
        continue_final,
        append,
        add_special_tokens: engine == Engine::Vllm && add_special_tokens,
    })
}

/// One message, normalised.
fn message_for_template(
    message: &Value,
    i: usize,
    engine: Engine,
    content_parts: bool,
) -> Result<Map<String, Value>, TokenizeError> {
    let Value::Object(message) = message else {
        return Err(invalid(format!("`messages`[{i}] must be an object")));
    };
    let role = match message.get("role") {
        Some(Value::String(r)) => r,
        _ => return Err(invalid(format!("`messages`[{i}] needs a string `role`"))),
    };
    let mut was_list = false;
    let texts: Vec<&str> = match message.get("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(parts)) => {
            was_list = true;
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    (Some("text"), _) => {
                        return Err(invalid(format!(
                            "`messages`[{i}].content[{j}] is a text part without a string `text`"
                        )));
                    }
                    (Some(_), _) => {
                        // An image or audio part: its tokens come from the
                        // engine's multimodal processor, which we cannot
                        // reproduce.
                        return Err(TokenizeError::Unsupported(
                            "non-text content parts (images, audio)",
                        ));
                    }
                    (None, _) => {
                        return Err(invalid(format!(
                            "`messages`[{i}].content[{j}] needs a `type`"
                        )));
                    }
                }
            }
            texts
        }
        Some(_) => {
            return Err(invalid(format!(
                "`messages`[{i}].content must be a string, a list of parts, or null"
            )));
        }
    };
    let content = match (content_parts, engine) {
        // A tool reply of text parts: SGLang joins them whatever the
        // template (its `normalize_tool_content`, in recent versions).
        (_, Engine::Sglang) if role == "tool" => Value::String(texts.join(" ")),
        // vLLM joins them with newlines, and a string stays one, whatever
        // the template (its chat utilities normalise a tool reply's
        // content so).
        (_, Engine::Vllm) if role == "tool" => Value::String(texts.join("\n")),
        // A template that loops over content gets parts: vLLM wraps a string
        // as one text part; SGLang passes a string as it is.
        (true, _) if was_list || engine == Engine::Vllm => Value::Array(
            texts
                .iter()
                .map(|t| serde_json::json!({"type": "text", "text": t}))
                .collect(),
        ),
        (_, Engine::Vllm) => Value::String(texts.join("\n")),
        (_, Engine::Sglang) => Value::String(texts.join(" ")),
    };
    let mut out = match engine {
        Engine::Vllm => vllm_keys(message, role, content),
        Engine::Sglang => {
            let mut out = Map::with_capacity(message.len());
            for (k, v) in message {
                if !v.is_null() {
                    out.insert(k.clone(), v.clone());
                }
            }
            out.insert("content".into(), content);
            out
        }
    };
    if role == "assistant"
        && let Some(Value::Array(calls)) = out.get_mut("tool_calls")
    {
        for call in calls.iter_mut() {
            parse_arguments(call, i, engine)?;
        }
    }
    Ok(out)
}

/// The message as vLLM builds it for the template: `role` and `content`,
/// then only the keys its chat utilities copy over. An assistant's
/// `tool_calls` (an empty list dropped, which keeps templates that test
/// `'tool_calls' in message` on the plain reply) and its `reasoning`, given
/// as both `reasoning` and `reasoning_content` (a client's
/// `reasoning_content` is not read); a tool reply's `tool_call_id`; a
/// string `name` or `task`; a developer message's `tools`, null when
/// absent. Whatever else the client sent never reaches the template.
fn vllm_keys(message: &Map<String, Value>, role: &str, content: Value) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("role".into(), Value::String(role.to_owned()));
    out.insert("content".into(), content);
    let given = |key: &str| message.get(key).filter(|v| !v.is_null());
    match role {
        "assistant" => {
            if let Some(calls) = given("tool_calls")
                && calls.as_array().is_none_or(|c| !c.is_empty())
            {
                out.insert("tool_calls".into(), calls.clone());
            }
            if let Some(reasoning) = given("reasoning") {
                out.insert("reasoning".into(), reasoning.clone());
                out.insert("reasoning_content".into(), reasoning.clone());
            }
        }
        // Copied when present, even as null.
        "tool" => {
            if let Some(id) = message.get("tool_call_id") {
                out.insert("tool_call_id".into(), id.clone());
            }
        }
        _ => {}
    }
    for key in ["name", "task"] {
        if let Some(v @ Value::String(_)) = message.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if role == "developer" {
        let tools = message.get("tools").cloned().unwrap_or(Value::Null);
        out.insert("tools".into(), tools);
    }
    out
}

/// `function.arguments` from a JSON string to a value. vLLM makes a string
/// that is not JSON, or arguments neither a string, an object nor a list,
/// an empty object (a malformed call kept in a conversation's history
/// would fail every later turn otherwise); under SGLang, which refuses
/// such a request, a string that is not JSON cannot be tokenized.
fn parse_arguments(call: &mut Value, i: usize, engine: Engine) -> Result<(), TokenizeError> {
    let Some(function) = call.get_mut("function").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let empty = || Value::Object(Map::new());
    let parsed = match function.get("arguments") {
        None | Some(Value::Null) => empty(),
        Some(Value::String(s)) if s.is_empty() => empty(),
        Some(Value::String(s)) => match serde_json::from_str(s) {
            Ok(parsed) => parsed,
            Err(_) if engine == Engine::Vllm => empty(),
            Err(e) => {
                return Err(invalid(format!(
                    "`messages`[{i}]: a tool call's `arguments` is not valid JSON: {e}"
                )));
            }
        },
        Some(other @ (Value::Object(_) | Value::Array(_))) => other.clone(),
        Some(_) if engine == Engine::Vllm => empty(),
        Some(other) => other.clone(),
    };
    function.insert("arguments".into(), parsed);
    Ok(())
}

/// The tools the template sees (`null` when none), each as the engine's
/// request model dumps it: vLLM hands every template the whole tool;
/// SGLang the function alone, unless the template reads `tool.function`
/// (`wrapped`).
fn tools(body: &Map<String, Value>, engine: Engine, wrapped: bool) -> Result<Value, TokenizeError> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => return Ok(Value::Null),
        Some(Value::Array(t)) => t,
        Some(_) => return Err(invalid("`tools` must be a list")),
    };
    let mut chosen: Vec<&Value> = tools.iter().collect();
    if engine == Engine::Sglang {
        match body.get("tool_choice") {
            Some(Value::String(s)) if s == "none" => return Ok(Value::Null),
            // A named tool choice: SGLang gives the template only that tool.
            Some(Value::Object(c)) => {
                let name = c.get("function").and_then(|f| f.get("name"));
                chosen.retain(|t| t.get("function").and_then(|f| f.get("name")) == name);
            }
            _ => {}
        }
        // SGLang passes no tools at all for an empty list.
        if chosen.is_empty() {
            return Ok(Value::Null);
        }
    }
    let dumped = chosen
        .into_iter()
        .enumerate()
        .map(|(i, tool)| dump_tool(tool, i, engine, wrapped))
        .collect::<Result<_, _>>()?;
    Ok(Value::Array(dumped))
}

/// One tool as the engine's request model dumps it (`model_dump()`), which
/// is what its template prints: the models' fields in their declared
/// order, absent ones as their defaults, whatever order the client wrote.
/// vLLM: `type`, then `function` (`name`, `description`, `parameters`,
/// then the client's other keys, which its models keep), then the tool's
/// other keys. SGLang: the function alone (`description`, `name`,
/// `parameters`, `strict`, default false), or for a template that reads
/// `tool.function` (`wrapped`), `type` then that function; other keys are
/// dropped.
fn dump_tool(
    tool: &Value,
    i: usize,
    engine: Engine,
    wrapped: bool,
) -> Result<Value, TokenizeError> {
    let Value::Object(tool) = tool else {
        return Err(invalid(format!("`tools`[{i}] must be an object")));
    };
    let Some(Value::Object(function)) = tool.get("function") else {
        return Err(invalid(format!("`tools`[{i}] needs a `function` object")));
    };
    let given = |map: &Map<String, Value>, key: &str| map.get(key).cloned().unwrap_or(Value::Null);
    let mut dumped_function = Map::new();
    let declared: &[&str] = match engine {
        Engine::Vllm => &["name", "description", "parameters"],
        Engine::Sglang => &["description", "name", "parameters"],
    };
    for key in declared {
        dumped_function.insert((*key).to_owned(), given(function, key));
    }
    let mut dumped = Map::new();
    let kind = tool
        .get("type")
        .cloned()
        .unwrap_or_else(|| Value::String("function".into()));
    dumped.insert("type".into(), kind);
    match engine {
        Engine::Vllm => {
            for (k, v) in function {
                if !dumped_function.contains_key(k) {
                    dumped_function.insert(k.clone(), v.clone());
                }
            }
            dumped.insert("function".into(), Value::Object(dumped_function));
            for (k, v) in tool {
                if !dumped.contains_key(k) {
                    dumped.insert(k.clone(), v.clone());
                }
            }
        }
        Engine::Sglang => {
            let strict = function
                .get("strict")
                .filter(|v| !v.is_null())
                .cloned()
                .unwrap_or(Value::Bool(false));
            dumped_function.insert("strict".into(), strict);
            if !wrapped {
                return Ok(Value::Object(dumped_function));
            }
            dumped.insert("function".into(), Value::Object(dumped_function));
        }
    }
    Ok(Value::Object(dumped))
}

/// The text to continue: the final message's content (for a list of parts,
/// its last text part — transformers' rule).
fn final_text(message: Option<&Map<String, Value>>) -> Option<String> {
    let text = match message?.get("content")? {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .rev()
            .find_map(|p| p.get("text").and_then(Value::as_str))?
            .to_owned(),
        _ => return None,
    };
    (!text.trim().is_empty()).then_some(text)
}

/// Cut `rendered` after the final message's text, as transformers does for
/// `continue_final_message`: at the last occurrence of the stripped text,
/// keeping the message's trailing whitespace only where the template kept it.
pub(crate) fn cut_after_final(
    rendered: &str,
    final_message: &str,
) -> Result<String, TokenizeError> {
    let stripped = final_message.trim();
    let Some(at) = rendered.rfind(stripped) else {
        return Err(invalid(
            "`continue_final_message` is set but the chat template does not reproduce the final \
             message's text",
        ));
    };
    let lstripped = final_message.trim_start();
    // transformers compares the rendered slice with the unstripped message,
    // so trailing whitespace is kept only when the message has no leading
    // whitespace and the template reproduced it.
    let end = if lstripped.len() == final_message.len() && rendered[at..].starts_with(final_message)
    {
        at + final_message.len()
    } else {
        at + stripped.len()
    };
    Ok(rendered[..end].to_owned())
}

/// `context` plus the special tokens (request kwargs win, as in transformers,
/// where the call's kwargs overlay the special-token map).
pub(crate) fn context_value(
    special_tokens: &[(&'static str, String)],
    context: Map<String, Value>,
) -> JinjaValue {
    let mut full = Map::with_capacity(context.len() + special_tokens.len());
    for (k, v) in special_tokens {
        full.insert((*k).to_owned(), Value::String(v.clone()));
    }
    full.extend(context);
    JinjaValue::from(minijinja::value::Serde(Value::Object(full)))
}
