//! Chat completions: the template's rendering and what is encoded.

use radixgate_tokenize::testing::sample_text;
use radixgate_tokenize::{Endpoint, Engine, TokenizeError};
use serde_json::{Value, json};

use crate::{model, model_with_template, special};

const CHAT: Endpoint = Endpoint::ChatCompletions;

#[test]
fn renders_roles_in_order_and_ends_with_the_generation_prompt() {
    let (_dir, tok) = model();
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is the cache?"},
        {"role": "assistant", "content": "On the worker."},
        {"role": "user", "content": "Which one?"}]});
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "<|bos|><|system|>\nBe brief.<|end|>\n<|user|>\nWhere is the cache?<|end|>\n\
         <|assistant|>\nOn the worker.<|end|>\n<|user|>\nWhich one?<|end|>\n<|assistant|>\n"
    );
}

#[test]
fn the_render_is_encoded_without_adding_special_tokens_again() {
    let (_dir, tok) = model();
    let bos = special(&tok, "<|bos|>");
    let body = json!({"messages": [{"role": "user", "content": "the first token"}]});
    let ids = tok.prompt_tokens(CHAT, &body).unwrap();
    let rendered = tok.render_chat(&body).unwrap();
    assert_eq!(ids, tok.encode(&rendered, false).unwrap());
    // The template writes the one BOS; encoding must not add a second.
    assert_eq!(ids[0], bos);
    assert_ne!(ids[1], bos, "{ids:?}");
    assert_eq!(ids.iter().filter(|&&t| t == bos).count(), 1);
    // Role markers are single special tokens, and the prompt ends with the
    // generation prompt `<|assistant|>` `\n`.
    assert_eq!(ids[1], special(&tok, "<|user|>"));
    let n = ids.len();
    assert_eq!(ids[n - 2], special(&tok, "<|assistant|>"));
    assert_eq!(tok.encode("\n", false).unwrap(), vec![ids[n - 1]]);

    // vLLM's `add_special_tokens: true` asks for them on top.
    let mut with = body.clone();
    with["add_special_tokens"] = json!(true);
    let ids2 = tok.prompt_tokens(CHAT, &with).unwrap();
    assert_eq!(ids2[..2], [bos, bos]);
    assert_eq!(ids2[1..], ids[..]);
}

#[test]
fn generation_prompt_follows_the_request_in_vllm_and_is_always_on_in_sglang() {
    let (_dir, tok) = model();
    let body = json!({"add_generation_prompt": false,
                      "messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "<|bos|><|user|>\nhello<|end|>\n"
    );
    let tok = tok.with_engine(Engine::Sglang);
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "<|bos|><|user|>\nhello<|end|>\n<|assistant|>\n"
    );
}

#[test]
fn content_parts_are_joined_as_each_engine_joins_them() {
    let (_dir, tok) = model();
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "text", "text": "second"}]}]});
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "<|bos|><|user|>\nfirst\nsecond<|end|>\n<|assistant|>\n"
    );
    let tok = tok.with_engine(Engine::Sglang);
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "<|bos|><|user|>\nfirst second<|end|>\n<|assistant|>\n"
    );
    // The same text as a plain string gives the same tokens.
    let plain = json!({"messages": [{"role": "user", "content": "first second"}]});
    assert_eq!(
        tok.prompt_tokens(CHAT, &body).unwrap(),
        tok.prompt_tokens(CHAT, &plain).unwrap()
    );
}

#[test]
fn null_content_renders_empty_and_images_are_refused() {
    let (_dir, tok) = model();
    let body = json!({"messages": [{"role": "user", "content": "q"},
                                   {"role": "assistant", "content": null},
                                   {"role": "user", "content": "r"}]});
    assert!(
        tok.render_chat(&body)
            .unwrap()
            .contains("<|assistant|>\n<|end|>\n")
    );
    // A null key is left out, as both engines leave it out: `is defined`
    // is false for it.
    let (_d2, named) = model_with_template(
        "{% for m in messages %}{% if m.name is defined %}[{{ m.name }}]{% endif %}{{ m.content }}{% endfor %}",
    );
    let body = json!({"messages": [{"role": "user", "content": "q", "name": null},
                                   {"role": "user", "content": "r", "name": "bob"}]});
    assert_eq!(named.render_chat(&body).unwrap(), "q[bob]r");
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]});
    let err = tok.prompt_tokens(CHAT, &image).unwrap_err();
    assert!(matches!(err, TokenizeError::Unsupported(_)), "{err}");
}

/// A conversation of `turns` user turns and `turns - 1` replies.
fn conversation(turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": sample_text(60, 1)})];
    for t in 0..turns {
        if t > 0 {
            messages.push(json!({"role": "assistant", "content": sample_text(40, 100 + t as u64)}));
        }
        messages.push(json!({"role": "user", "content": sample_text(30, 200 + t as u64)}));
    }
    json!({"model": "m", "messages": messages})
}

#[test]
fn turn_n_plus_one_starts_with_turn_ns_prompt_tokens() {
    for engine in [Engine::Vllm, Engine::Sglang] {
        let (_dir, tok) = model();
        let tok = tok.with_engine(engine);
        let mut previous: Option<Vec<u32>> = None;
        for turns in 1..=6 {
            let ids = tok.prompt_tokens(CHAT, &conversation(turns)).unwrap();
            if let Some(prev) = &previous {
                assert!(ids.len() > prev.len());
                assert_eq!(
                    &ids[..prev.len()],
                    &prev[..],
                    "{engine:?}: turn {turns} does not extend turn {}",
                    turns - 1
                );
            }
            previous = Some(ids);
        }
    }
}

#[test]
fn a_role_the_template_rejects_is_a_client_error_with_its_message() {
    let (_dir, tok) = model();
    let body = json!({"messages": [{"role": "narrator", "content": "x"}]});
    let err = tok.prompt_tokens(CHAT, &body).unwrap_err();
    assert!(err.is_client_error(), "{err}");
    assert!(err.to_string().contains("unknown role: narrator"), "{err}");
}

#[test]
fn malformed_messages_are_client_errors() {
    let (_dir, tok) = model();
    for (body, needle) in [
        (json!({"model": "m"}), "needs `messages`"),
        (json!({"messages": []}), "`messages` is empty"),
        (json!({"messages": "hi"}), "must be a list"),
        (
            json!({"messages": [{"content": "x"}]}),
            "needs a string `role`",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "content must be",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]}),
            "needs a `type`",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "tools": {}}),
            "`tools` must be a list",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "tools": ["f"]}),
            "`tools`[0] must be an object",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}],
                   "tools": [{"type": "function"}]}),
            "`tools`[0] needs a `function` object",
        ),
    ] {
        let err = tok.prompt_tokens(CHAT, &body).unwrap_err();
        assert!(err.is_client_error(), "{body}: {err}");
        assert!(err.to_string().contains(needle), "{body}: {err}");
    }
}

#[test]
fn tools_reach_the_template_as_python_json() {
    let (_dir, tok) = model();
    let tools = json!([{"function": {
        "description": "Météo", "name": "get_weather",
        "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"}},
        "type": "function"}]);
    let body = json!({"tools": tools, "messages": [{"role": "user", "content": "x"}]});
    let rendered = tok.render_chat(&body).unwrap();
    assert!(
        rendered.starts_with(
            "<|bos|><|system|>\nTools: [{\"type\": \"function\", \"function\": {\"name\": \
             \"get_weather\", \"description\": \"Météo\", \"parameters\": {\"properties\": \
             {\"city\": {\"type\": \"string\"}}, \"type\": \"object\"}}}]<|end|>\n<|user|>\nx"
        ),
        "{rendered}"
    );
    // `tool_choice: "none"`: vLLM still renders them, SGLang drops them.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    assert!(tok.render_chat(&none).unwrap().contains("Tools:"));
    let tok = tok.with_engine(Engine::Sglang);
    assert!(!tok.render_chat(&none).unwrap().contains("Tools:"));
}

#[test]
fn tool_call_arguments_reach_the_template_as_objects() {
    let (_dir, tok) = model_with_template(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}\
         {{ c.function.name }}{{ c.function.arguments | tojson }}|{% endfor %}{% endfor %}",
    );
    let body = json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "2", "type": "function", "function": {"name": "now", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "1", "content": "sunny"}]});
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "get_weather{\"city\": \"Paris\"}|now{}|"
    );
    // Not JSON, or not a string, object or list: vLLM renders `{}` (it
    // keeps a conversation whose history holds a malformed call going);
    // SGLang refuses a string that is not JSON.
    let mut bad = body.clone();
    bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{oops");
    bad["messages"][1]["tool_calls"][1]["function"]["arguments"] = json!(7);
    assert_eq!(tok.render_chat(&bad).unwrap(), "get_weather{}|now{}|");
    // A string that is JSON but not an object is what it parses to.
    let mut list = bad.clone();
    list["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("[1, 2]");
    assert_eq!(tok.render_chat(&list).unwrap(), "get_weather[1, 2]|now{}|");
    let sglang = tok.with_engine(Engine::Sglang);
    let err = sglang.render_chat(&bad).unwrap_err();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
}

#[test]
fn chat_template_kwargs_reach_the_template() {
    let (_dir, tok) = model_with_template(
        "{% if enable_thinking is defined and not enable_thinking %}NO-THINK {% endif %}\
         {{ messages[0].content }}",
    );
    let body = json!({"messages": [{"role": "user", "content": "q"}],
                      "chat_template_kwargs": {"enable_thinking": false}});
    assert_eq!(tok.render_chat(&body).unwrap(), "NO-THINK q");
    let body = json!({"messages": [{"role": "user", "content": "q"}]});
    assert_eq!(tok.render_chat(&body).unwrap(), "q");
}

#[test]
fn continue_final_message_leaves_the_last_reply_open() {
    let (_dir, tok) = model();
    let body = json!({"continue_final_message": true, "add_generation_prompt": false,
        "messages": [{"role": "user", "content": "Name a colour."},
                     {"role": "assistant", "content": "The colour is"}]});
    // vLLM (transformers' rule): cut right after the final message's text.
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "<|bos|><|user|>\nName a colour.<|end|>\n<|assistant|>\nThe colour is"
    );
    // SGLang: drop the message, render with the generation prompt, append it.
    let sglang = tok.with_engine(Engine::Sglang);
    assert_eq!(
        sglang.render_chat(&body).unwrap(),
        "<|bos|><|user|>\nName a colour.<|end|>\n<|assistant|>\nThe colour is"
    );
    // Without continue_final_message SGLang sends a final assistant message
    // as a user message.
    let mut plain = body.clone();
    plain["continue_final_message"] = json!(false);
    assert_eq!(
        sglang.render_chat(&plain).unwrap(),
        "<|bos|><|user|>\nName a colour.<|end|>\n<|user|>\nThe colour is<|end|>\n<|assistant|>\n"
    );
}

#[test]
fn a_template_that_loops_over_content_gets_parts() {
    let (_dir, tok) = model_with_template(
        "{% for message in messages %}<{{ message.role }}>\
         {% for part in message['content'] %}[{{ part.text }}]{% endfor %}{% endfor %}",
    );
    let body = json!({"messages": [
        {"role": "system", "content": "plain"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]});
    // vLLM wraps a string as one text part.
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "<system>[plain]<user>[a][b]"
    );
    // SGLang passes a string as it is (the loop then walks its characters).
    let tok = tok.with_engine(Engine::Sglang);
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "<system>[][][][][]<user>[a][b]"
    );
}

/// The engines parse the body into Python dicts, which keep the keys in
/// the order the client wrote them: so must the render. Tool-call
/// arguments and tool schemas are printed with `tojson` by tool-use
/// templates, and a schema's properties are rarely in sorted order.
#[test]
fn json_in_the_body_keeps_the_clients_key_order() {
    let (_dir, tok) = model_with_template(
        "{% for m in messages %}{% for c in m.tool_calls or [] %}\
         {{ c.function.arguments | tojson }}|{% endfor %}{% endfor %}\
         {{ chat_options | tojson }}",
    );
    // As the router reads it: parsed from the request's bytes.
    let body: Value = serde_json::from_str(
        r#"{"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "get_weather",
                 "arguments": "{\"unit\": \"celsius\", \"city\": \"Paris\"}"}}]}],
            "chat_template_kwargs": {"chat_options": {"zeta": 1, "alpha": 2}}}"#,
    )
    .unwrap();
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "{\"unit\": \"celsius\", \"city\": \"Paris\"}|{\"zeta\": 1, \"alpha\": 2}"
    );
}

/// Both engines hand the template each tool as their request model dumps
/// it (pydantic's `model_dump()`): the declared fields first, in their
/// order, absent ones as null (SGLang's `strict` as false), whatever order
/// the client wrote. Tool-use templates print them with `tojson`.
#[test]
fn tools_reach_the_template_as_the_engine_dumps_them() {
    let (_dir, tok) = model_with_template("{{ tools | tojson }}");
    let body: Value = serde_json::from_str(
        r#"{"messages": [{"role": "user", "content": "x"}], "tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Météo",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"function": {"parameters": {"type": "object"}, "name": "now", "strict": true}}]}"#,
    )
    .unwrap();
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \
         \"description\": \"Météo\", \"parameters\": {\"type\": \"object\", \
         \"properties\": {\"city\": {\"type\": \"string\"}}}}}, \
         {\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": null, \
         \"parameters\": {\"type\": \"object\"}, \"strict\": true}}]"
    );
    // SGLang: the function alone, for a template that does not read
    // `tool.function` (Qwen's, Llama 3's, Hermes's)...
    let sglang = tok.with_engine(Engine::Sglang);
    assert_eq!(
        sglang.render_chat(&body).unwrap(),
        "[{\"description\": \"Météo\", \
         \"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \
         \"properties\": {\"city\": {\"type\": \"string\"}}}, \"strict\": false}, \
         {\"description\": null, \"name\": \"now\", \
         \"parameters\": {\"type\": \"object\"}, \"strict\": true}]"
    );
    // ... and the wrapped tool for one that does (DeepSeek's, MiniMax's).
    let (_dir, tok) = model_with_template(
        "{% for tool in tools %}{{ tool.function.name }}={{ tool | tojson }};{% endfor %}",
    );
    assert_eq!(
        tok.with_engine(Engine::Sglang).render_chat(&body).unwrap(),
        "get_weather={\"type\": \"function\", \"function\": {\"description\": \"Météo\", \
         \"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", \
         \"properties\": {\"city\": {\"type\": \"string\"}}}, \"strict\": false}};\
         now={\"type\": \"function\", \"function\": {\"description\": null, \"name\": \"now\", \
         \"parameters\": {\"type\": \"object\"}, \"strict\": true}};"
    );
}

/// vLLM builds each message afresh for the template from a fixed set of
/// keys (its chat utilities, `_parse_chat_message_content`): `role` and
/// `content`; an assistant's `tool_calls` and `reasoning` (as `reasoning`
/// and `reasoning_content`); a tool reply's `tool_call_id`; a string
/// `name` or `task`; a developer message's `tools`. Anything else the
/// client sent never reaches the template, and an empty `tool_calls` is
/// dropped. SGLang keeps every non-null field of its message model, an
/// empty `tool_calls` included, so a template that tests
/// `'tool_calls' in message` takes its tool-call branch.
#[test]
fn messages_reach_the_template_with_the_keys_each_engine_keeps() {
    let (_dir, tok) = model_with_template("{% for m in messages %}{{ m | tojson }}|{% endfor %}");
    let body: Value = serde_json::from_str(
        r#"{"messages": [
            {"role": "system", "content": "s", "metadata": {"team": "a"}},
            {"role": "user", "name": "bob", "content": "q", "reasoning": "not a user's",
             "tool_call_id": "not a user's", "tool_calls": [], "cache_hint": 1},
            {"role": "assistant", "content": "a", "tool_calls": [],
             "reasoning": "r", "reasoning_content": "read from reasoning"},
            {"role": "tool", "name": "get_weather", "content": "sunny", "tool_call_id": "1"},
            {"role": "user", "content": "thanks", "task": "chat", "name": 7}]}"#,
    )
    .unwrap();
    assert_eq!(
        tok.render_chat(&body).unwrap(),
        "{\"role\": \"system\", \"content\": \"s\"}|\
         {\"role\": \"user\", \"content\": \"q\", \"name\": \"bob\"}|\
         {\"role\": \"assistant\", \"content\": \"a\", \"reasoning\": \"r\", \
         \"reasoning_content\": \"r\"}|\
         {\"role\": \"tool\", \"content\": \"sunny\", \"tool_call_id\": \"1\", \
         \"name\": \"get_weather\"}|\
         {\"role\": \"user\", \"content\": \"thanks\", \"task\": \"chat\"}|"
    );

    let (_dir, tok) = model_with_template(
        "{% for m in messages %}{{ m.role }}{% if 'tool_calls' in m %}+calls{% endif %}|\
         {% endfor %}",
    );
    let body = json!({"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "tool_calls": []},
        {"role": "user", "content": "r"}]});
    assert_eq!(tok.render_chat(&body).unwrap(), "user|assistant|user|");
    let sglang = tok.with_engine(Engine::Sglang);
    assert_eq!(
        sglang.render_chat(&body).unwrap(),
        "user|assistant+calls|user|"
    );
}

/// SGLang, not continuing a final assistant message, replaces it with a
/// new user message of its text alone (serving_chat's
/// `_handle_last_assistant_message`): its name, reasoning and tool calls
/// do not reach the template.
#[test]
fn sglang_turns_a_final_assistant_message_into_a_bare_user_message() {
    let (_dir, tok) = model_with_template("{% for m in messages %}{{ m | tojson }}|{% endfor %}");
    let sglang = tok.with_engine(Engine::Sglang);
    let body = json!({"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "name": "helper", "content": "partial",
         "reasoning_content": "r", "tool_calls": []}]});
    assert_eq!(
        sglang.render_chat(&body).unwrap(),
        "{\"role\": \"user\", \"content\": \"q\"}|{\"role\": \"user\", \"content\": \"partial\"}|"
    );
    // A final assistant message with only tool calls: its null content is
    // the empty string by then, so it goes the same way.
    let body = json!({"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}]});
    assert_eq!(
        sglang.render_chat(&body).unwrap(),
        "{\"role\": \"user\", \"content\": \"q\"}|{\"role\": \"user\", \"content\": \"\"}|"
    );
}

/// SGLang takes a template whose text says "image", "audio", "video" or
/// "vision" for a multimodal one and hands it content as a list of parts
/// even without a loop over content; vLLM goes by its loops alone. The
/// router joined the parts for both.
#[test]
fn sglang_hands_a_template_naming_a_medium_its_content_as_parts() {
    let (_dir, tok) = model_with_template(
        "{# vision model #}{% for m in messages %}\
         {% if m.content is string %}S{% else %}L{% endif %}{% endfor %}",
    );
    let body: Value = serde_json::from_str(
        r#"{"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": "plain"}]}"#,
    )
    .unwrap();
    assert_eq!(tok.render_chat(&body).unwrap(), "SS");
    // A string stays a string under SGLang; a list stays a list.
    assert_eq!(
        tok.with_engine(Engine::Sglang).render_chat(&body).unwrap(),
        "LS"
    );
    // Without the word, SGLang joins the parts too.
    let (_dir, plain) = model_with_template(
        "{% for m in messages %}{% if m.content is string %}S{% else %}L{% endif %}{% endfor %}",
    );
    assert_eq!(
        plain
            .with_engine(Engine::Sglang)
            .render_chat(&body)
            .unwrap(),
        "SS"
    );
}

/// A tool reply whose content is text parts reaches the template as one
/// string under SGLang, joined with spaces, even a template that loops
/// over content (SGLang's `normalize_tool_content`); other messages keep
/// their parts there.
#[test]
fn sglang_joins_a_tool_replys_text_parts_for_any_template() {
    let (_dir, tok) = model_with_template(
        "{% for m in messages %}{% for p in m.content %}[{{ p.text if p is mapping else p }}]\
         {% endfor %};{% endfor %}",
    );
    let body: Value = serde_json::from_str(
        r#"{"messages": [
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}"#,
    )
    .unwrap();
    let sglang = tok.with_engine(Engine::Sglang).render_chat(&body).unwrap();
    // The user's part, the assistant's empty string (no characters to loop
    // over), the tool reply's string, one character at a time.
    assert_eq!(sglang, "[q];;[a][ ][b];");
}

/// vLLM hands every template a tool reply's content as one string, its
/// text parts joined with newlines, even a template that loops over
/// content, which gets other messages' strings as parts.
#[test]
fn vllm_joins_a_tool_replys_text_parts_for_any_template() {
    let (_dir, tok) = model_with_template(
        "{% for m in messages %}{% for p in m.content %}[{{ p.text if p is mapping else p }}]\
         {% endfor %};{% endfor %}",
    );
    let body: Value = serde_json::from_str(
        r#"{"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "cd"}]}"#,
    )
    .unwrap();
    let vllm = tok.with_engine(Engine::Vllm).render_chat(&body).unwrap();
    // The user's string as a part, the assistant's no parts, each tool
    // reply's string one character at a time.
    assert_eq!(vllm, "[q];;[a][\n][b];[c][d];");
}
