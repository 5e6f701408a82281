use super::*;

fn chat(body: &str) -> Inspected {
    inspect(Api::ChatCompletions, body.as_bytes()).expect("valid chat body")
}

#[test]
fn chat_reads_model_stream_user_and_renders_roles() {
    let got = chat(
        r#"{"model":"m","stream":true,"user":"u1","unknown":{"x":[1,2]},
            "messages":[{"role":"system","content":"be brief"},
                        {"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(got.model.as_deref(), Some("m"));
    assert!(got.stream);
    assert_eq!(got.user.as_deref(), Some("u1"));
    assert_eq!(
        got.routing_text,
        "<|system|>\nbe brief<|end|>\n<|user|>\nhi<|end|>\n"
    );
}

#[test]
fn next_turn_extends_previous_turn() {
    let turn1 =
        chat(r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"}]}"#);
    let turn2 = chat(
        r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},
            {"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}"#,
    );
    assert!(turn2.routing_text.starts_with(&turn1.routing_text));
    assert!(turn2.routing_text.len() > turn1.routing_text.len());
}

#[test]
fn roles_are_part_of_the_text() {
    let as_user = chat(r#"{"messages":[{"role":"user","content":"same"}]}"#);
    let as_system = chat(r#"{"messages":[{"role":"system","content":"same"}]}"#);
    assert_ne!(as_user.routing_text, as_system.routing_text);
}

#[test]
fn content_parts_tool_calls_and_escapes() {
    let got = chat(
        r#"{"messages":[
            {"role":"user","name":"ann","content":[{"type":"text","text":"caf\u00e9 "},
                {"type":"image_url","image_url":{"url":"http://x/1.png","detail":"low"}}]},
            {"role":"assistant","content":null,
             "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"42"}]}"#,
    );
    assert_eq!(
        got.routing_text,
        "<|user:ann|>\ncafé <|image_url:http://x/1.png|><|end|>\n\
         <|assistant|>\n<|call:f|>{\"a\":1}<|end|>\n\
         <|tool#c1|>\n42<|end|>\n"
    );
    assert!(!got.stream);
}

/// An inline image (a base64 data URL, Anthropic's base64 source) is
/// named by its digest: the text after it is routed on, and the tree is not
/// handed megabytes per image.
#[test]
fn inline_images_are_named_by_their_digest() {
    let data = "iVBORw0KGgoAAAANSUhEUgAA".repeat(50_000);
    let openai = format!(
        r#"{{"messages":[{{"role":"user","content":[
            {{"type":"image_url","image_url":{{"url":"data:image/png;base64,{data}"}}}},
            {{"type":"text","text":"what is in this picture?"}}]}}]}}"#
    );
    let anthropic = format!(
        r#"{{"max_tokens":8,"messages":[{{"role":"user","content":[
            {{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{data}"}}}},
            {{"type":"text","text":"what is in this picture?"}}]}}]}}"#
    );
    for (api, body) in [(Api::ChatCompletions, openai), (Api::Messages, anthropic)] {
        let text = inspect(api, body.as_bytes()).unwrap().routing_text;
        assert!(text.len() < 200, "{api:?}: {} bytes", text.len());
        assert!(text.contains("digest="), "{api:?}: {text}");
        assert!(text.contains("what is in this picture?"), "{api:?}: {text}");
        let again = inspect(api, body.as_bytes()).unwrap().routing_text;
        assert_eq!(text, again);
    }
}

#[test]
fn stream_null_is_false() {
    assert!(!chat(r#"{"stream":null,"messages":[]}"#).stream);
}

/// `stream` as the engines' pydantic models read it (lax): `"true"`,
/// `1`, `"yes"` and the like are a stream, their opposites and `null` are
/// not, and anything else is refused, as the engines refuse it. Before,
/// anything but a boolean or `null` was refused here, though the engines
/// serve it; and an API the gateway does not know read only `true`.
#[test]
fn stream_reads_as_the_engines_read_it() {
    let read = |stream: &str| {
        let body = format!(r#"{{"model":"m","messages":[],"stream":{stream}}}"#);
        inspect(Api::ChatCompletions, body.as_bytes()).map(|i| i.stream)
    };
    for yes in [
        "true",
        "1",
        r#""true""#,
        r#""TRUE""#,
        r#""yes""#,
        r#""on""#,
        r#""1""#,
    ] {
        assert_eq!(read(yes).ok(), Some(true), "{yes}");
    }
    for no in [
        "false",
        "0",
        "null",
        r#""false""#,
        r#""No""#,
        r#""0""#,
        r#""off""#,
    ] {
        assert_eq!(read(no).ok(), Some(false), "{no}");
    }
    for bad in ["2", "-1", r#""maybe""#, r#""""#, "[]", "{}", "0.5"] {
        assert!(read(bad).is_err(), "{bad}");
    }
    let by_load = |stream: &str| {
        let body = format!(r#"{{"model":"m","stream":{stream}}}"#);
        inspect_model(body.as_bytes()).unwrap().stream
    };
    assert!(by_load(r#""true""#) && by_load("1") && by_load("true"));
    assert!(!by_load(r#""maybe""#) && !by_load("[1]") && !by_load("null"));
}

/// `stream` written as `1.0` or `0.0`: the engines' pydantic models take
/// a float that is exactly 0 or 1 for a boolean (lax), so vLLM and SGLang
/// serve it; before, the router refused it 400, and on routes routed by
/// load an unknown API's `1.0` was read as no stream. Other floats are
/// still refused, as the engines refuse them.
#[test]
fn stream_as_a_float_of_0_or_1_reads_as_the_engines_read_it() {
    let read = |stream: &str| {
        let body = format!(r#"{{"model":"m","messages":[],"stream":{stream}}}"#);
        inspect(Api::ChatCompletions, body.as_bytes()).map(|i| i.stream)
    };
    for (flag, stream) in [
        ("1.0", true),
        ("1e0", true),
        ("0.0", false),
        ("-0.0", false),
    ] {
        assert_eq!(read(flag).ok(), Some(stream), "{flag}");
    }
    for bad in ["0.5", "2.0", "-1.0", "1.5e0"] {
        assert!(read(bad).is_err(), "{bad}");
    }
    let by_load = |stream: &str| {
        let body = format!(r#"{{"model":"m","stream":{stream}}}"#);
        inspect_model(body.as_bytes()).unwrap().stream
    };
    assert!(by_load("1.0"));
    assert!(!by_load("0.0") && !by_load("0.5"));
    // `include_usage` so too: a client that asked with `1.0` keeps the
    // usage event a metered tenant's edit would otherwise take out.
    let asked = |value: &str| {
        let body = format!(
            r#"{{"messages":[],"stream":true,"stream_options":{{"include_usage":{value}}}}}"#
        );
        let read = inspect(Api::ChatCompletions, body.as_bytes()).unwrap();
        read.stream_options.usage_asked()
    };
    assert!(asked("1.0") && asked("1e0") && asked("1"));
    assert!(!asked("0.0") && !asked("0.5") && !asked("10"));
}

#[test]
fn completions_prompt_shapes() {
    let text = |body: &str| {
        inspect(Api::Completions, body.as_bytes())
            .unwrap()
            .routing_text
    };
    assert_eq!(text(r#"{"prompt":"abc"}"#), "abc");
    assert_eq!(text(r#"{"prompt":[1,2,3]}"#), "1 2 3 ");
    assert_eq!(text(r#"{"prompt":["a","b"]}"#), "a\nb\n");
    assert_eq!(text(r#"{"prompt":[[1,2],[3]]}"#), "1 2 \n3 \n");
    // Token-id prompts keep their prefix structure.
    assert!(text(r#"{"prompt":[1,2,3,4]}"#).starts_with(&text(r#"{"prompt":[1,2,3]}"#)));
    assert!(inspect(Api::Completions, br#"{"prompt":[[[1]]]}"#).is_err());
}

#[test]
fn generate_text_or_input_ids() {
    let got = inspect(
        Api::Generate,
        br#"{"text":"hello","stream":true,"sampling_params":{"max_new_tokens":4}}"#,
    )
    .unwrap();
    assert_eq!(
        (got.routing_text.as_str(), got.stream, got.model),
        ("hello", true, None)
    );
    let ids = inspect(Api::Generate, br#"{"input_ids":[5,6]}"#).unwrap();
    assert_eq!(ids.routing_text, "5 6 ");
    assert_eq!(inspect(Api::Generate, b"{}").unwrap().routing_text, "");
}

#[test]
fn embeddings_input() {
    let got = inspect(
        Api::Embeddings,
        br#"{"model":"e","input":"x","stream":true}"#,
    )
    .unwrap();
    assert_eq!((got.routing_text.as_str(), got.stream), ("x", false));
}

/// vLLM's chat embeddings route by their messages, as a chat would.
#[test]
fn embeddings_of_messages_render_as_a_chat() {
    let messages = r#"[{"role":"system","content":"S"},{"role":"user","content":"q"}]"#;
    let body = format!(r#"{{"model":"e","messages":{messages}}}"#);
    let got = inspect(Api::Embeddings, body.as_bytes()).unwrap();
    let as_chat = chat(&format!(r#"{{"messages":{messages}}}"#));
    assert_eq!(got.routing_text, as_chat.routing_text);
    // `input` wins where both are given; neither is refused.
    let both = br#"{"input":"x","messages":[{"role":"user","content":"q"}]}"#;
    assert_eq!(inspect(Api::Embeddings, both).unwrap().routing_text, "x");
    let err = inspect(Api::Embeddings, b"{}").unwrap_err().to_string();
    assert!(err.contains("missing field `input`"), "{err}");
}

/// SGLang's multimodal embedding inputs are batch items: their text, and
/// their media as content parts are rendered (a long one by its digest).
#[test]
fn multimodal_embedding_inputs_are_batch_items() {
    let text = |body: &str| {
        inspect(Api::Embeddings, body.as_bytes())
            .unwrap()
            .routing_text
    };
    let got = text(r#"{"input":[{"text":"a fox"},{"image":"u1","text":"b"}]}"#);
    assert!(got.starts_with("a fox\nb"), "{got}");
    assert!(got.contains("u1"), "{got}");
    assert_ne!(
        got,
        text(r#"{"input":[{"text":"a fox"},{"image":"u2","text":"b"}]}"#)
    );
    let long = "A".repeat(10_000);
    let got = text(&format!(r#"{{"input":[{{"image":"{long}"}}]}}"#));
    assert!(got.len() < 1_000, "{got}");
    // A map is an item of a batch only: not the prompt, nor inside an item.
    for body in [r#"{"input":{"text":"a"}}"#, r#"{"input":[[{"text":"a"}]]}"#] {
        assert!(inspect(Api::Embeddings, body.as_bytes()).is_err(), "{body}");
    }
}

/// vLLM's prompt embeddings stand in for a completion's prompt: nothing to
/// route by, nothing refused.
#[test]
fn prompt_embeddings_stand_in_for_a_prompt() {
    let got = inspect(Api::Completions, br#"{"model":"m","prompt_embeds":"AAAA"}"#).unwrap();
    assert_eq!(
        (got.model.as_deref(), got.routing_text.as_str()),
        (Some("m"), "")
    );
    let both = br#"{"prompt":"p","prompt_embeds":["AAAA"]}"#;
    assert_eq!(inspect(Api::Completions, both).unwrap().routing_text, "p");
}

#[test]
fn bad_bodies_are_errors_not_panics() {
    for body in [
        &b"not json"[..],
        b"",
        b"[]",
        b"{\"messages\":\"x\"}",
        b"{\"model\":1,\"messages\":[]}",
        b"{\"messages\":[{\"content\":\"no role\"}]}",
        b"{\"messages\":[]",
    ] {
        let err = inspect(Api::ChatCompletions, body).unwrap_err();
        assert!(err.to_string().starts_with("invalid JSON body"), "{err}");
    }
    assert!(inspect(Api::Completions, b"{}").is_err());
}

#[test]
fn cache_keys_put_requests_in_namespaces() {
    let chat = |extra: &str| {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}]{extra}}}"#);
        inspect(Api::ChatCompletions, body.as_bytes())
            .unwrap()
            .routing_text
    };
    let shared = chat("");
    let salted = chat(r#","cache_salt":"tenant-a""#);
    assert_ne!(salted, shared);
    assert!(salted.ends_with(&shared), "the marker goes in front");
    assert_eq!(salted, chat(r#","cache_salt":"tenant-a","user":"x""#));
    assert_ne!(salted, chat(r#","cache_salt":"tenant-b""#));
    // Empty or null keys are no keys.
    assert_eq!(chat(r#","cache_salt":"","extra_key":null"#), shared);
    // SGLang's adapter, as a string or a batch of one adapter, and its key.
    let adapter = chat(r#","lora_path":"sql-lora""#);
    assert_ne!(adapter, shared);
    assert_eq!(adapter, chat(r#","lora_path":["sql-lora","sql-lora"]"#));
    assert_eq!(chat(r#","lora_path":[null]"#), shared);
    assert_ne!(chat(r#","extra_key":"k""#), shared);
    // Every API reads them.
    for (api, body) in [
        (Api::Completions, r#"{"prompt":"p","cache_salt":"s"}"#),
        (Api::Generate, r#"{"text":"p","lora_path":"l"}"#),
        (Api::Embeddings, r#"{"input":"p","extra_key":"k"}"#),
        (Api::Responses, r#"{"input":"p","cache_salt":"s"}"#),
        (
            Api::Messages,
            r#"{"messages":[{"role":"user","content":"p"}],"cache_salt":"s"}"#,
        ),
    ] {
        let text = inspect(api, body.as_bytes()).unwrap().routing_text;
        assert!(text.starts_with('\u{1}'), "{api:?}: {text:?}");
    }
    // Wrong types are the client's error.
    for bad in [
        r#","cache_salt":5"#,
        r#","lora_path":{"a":1}"#,
        r#","lora_path":[1]"#,
        r#","extra_key":[]"#,
    ] {
        let body = format!(r#"{{"messages":[]{bad}}}"#);
        let err = inspect(Api::ChatCompletions, body.as_bytes()).unwrap_err();
        assert!(err.to_string().starts_with("invalid JSON body"), "{err}");
    }
}

#[test]
fn next_turn_extends_previous_turn_in_a_namespace() {
    let turn1 = chat(
        r#"{"cache_salt":"s","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"}]}"#,
    );
    let turn2 = chat(
        r#"{"messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},
            {"role":"assistant","content":"a1"},{"role":"user","content":"q2"}],"cache_salt":"s"}"#,
    );
    assert!(turn2.routing_text.starts_with(&turn1.routing_text));
}

#[test]
fn model_only_endpoints() {
    let got =
        inspect_model(br#"{"model":"m","query":"q","documents":["a"],"stream":true}"#).unwrap();
    assert_eq!(
        (got.model.as_deref(), got.stream, got.routing_text.as_str()),
        (Some("m"), true, "")
    );
    // An unknown API's own idea of `stream` is passed over, not refused.
    let got = inspect_model(br#"{"stream":{"mode":"x"},"tokens":[1,2]}"#).unwrap();
    assert_eq!((got.model, got.stream), (None, false));
    for body in [&b"not json"[..], b"", b"{\"model\":7}", b"{\"model\":\"m\""] {
        let err = inspect_model(body).unwrap_err();
        assert!(err.to_string().starts_with("invalid JSON body"), "{err}");
    }
}

/// Long strings are read as bytes and checked for UTF-8 once
/// (`inspect::text`): escapes must decode as serde_json's own `str` reading
/// does, in every place such a string is read.
#[test]
fn long_strings_decode_escapes_as_serde_json_does() {
    let literals = [
        r#""""#,
        r#""plain""#,
        r#""line\nbreak\ttab \"quoted\" back\\slash \/ slash""#,
        r#""caf\u00e9 \ud83d\ude00 and raw café 😀""#,
        r#""\u0000\u001f""#,
    ];
    for literal in literals {
        let s: String = serde_json::from_str(literal).unwrap();
        let chat_text = chat(&format!(
            r#"{{"messages":[{{"role":"user","content":{literal}}}]}}"#
        ));
        assert_eq!(chat_text.routing_text, format!("<|user|>\n{s}<|end|>\n"));
        let part = chat(&format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":{literal}}}]}}]}}"#
        ));
        assert_eq!(part.routing_text, chat_text.routing_text, "{literal}");
        let prompt = format!(r#"{{"prompt":{literal}}}"#);
        let got = inspect(Api::Completions, prompt.as_bytes()).unwrap();
        assert_eq!(got.routing_text, s, "{literal}");
        let responses = format!(r#"{{"instructions":{literal},"input":{literal}}}"#);
        let got = inspect(Api::Responses, responses.as_bytes()).unwrap();
        assert_eq!(
            got.routing_text,
            format!("<|system|>\n{s}<|end|>\n<|user|>\n{s}<|end|>\n"),
            "{literal}"
        );
        let messages = format!(
            r#"{{"system":{literal},"messages":[{{"role":"user","content":[{{"type":"text","text":{literal}}}]}}]}}"#
        );
        let got = inspect(Api::Messages, messages.as_bytes()).unwrap();
        assert_eq!(
            got.routing_text,
            format!("<|system|>\n{s}<|end|>\n<|user|>\n{s}<|end|>\n"),
            "{literal}"
        );
    }
}

#[test]
fn long_strings_that_are_not_utf8_are_refused() {
    let bodies: [&[u8]; 4] = [
        b"{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}",
        b"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\xff\"}]}]}",
        // A lone surrogate escape decodes to bytes that are not UTF-8.
        br#"{"messages":[{"role":"user","content":"\ud800"}]}"#,
        br#"{"messages":[{"role":"user","content":"a\udc00b"}]}"#,
    ];
    for body in bodies {
        let err = inspect(Api::ChatCompletions, body).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid JSON body: a string is not valid UTF-8 at line 1"),
            "{err}"
        );
    }
    let err = inspect(Api::Completions, b"{\"prompt\":\"\xc3\"}").unwrap_err();
    assert!(err.to_string().contains("not valid UTF-8"), "{err}");
}

/// The other side of reading long strings as bytes: a raw control
/// character inside one, which JSON wants escaped, is the worker's to
/// refuse (the body goes to it as it came).
#[test]
fn a_raw_control_character_in_a_long_string_is_passed_on() {
    let got = chat("{\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}]}");
    assert_eq!(got.routing_text, "<|user|>\na\tb<|end|>\n");
}

#[test]
fn a_prompt_is_a_string_or_an_array() {
    for body in [
        &br#"{"prompt":null}"#[..],
        br#"{"prompt":7}"#,
        br#"{"prompt":{}}"#,
    ] {
        let err = inspect(Api::Completions, body).unwrap_err().to_string();
        assert!(
            err.contains("expected a string, an array of token ids"),
            "{err}"
        );
    }
    let err = inspect(Api::Completions, b"{}").unwrap_err().to_string();
    assert!(err.contains("missing field `prompt`"), "{err}");
}

mod long_strings {
    use super::*;
    use proptest::prelude::*;

    /// Bytes that make strings hard: quotes, backslashes, escape letters,
    /// hex digits, control characters, bytes of UTF-8 sequences (whole and
    /// broken), plain letters.
    fn hard_bytes() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(b"\\".to_vec()),
            Just(b"\"".to_vec()),
            Just(b"\\u".to_vec()),
            Just(b"\\ud83d\\ude00".to_vec()),
            Just(b"\\ud800".to_vec()),
            Just("é😀".as_bytes().to_vec()),
            prop::sample::select(b"nrtbf/u0aF9x ".to_vec()).prop_map(|b| vec![b]),
            (0u8..0x20).prop_map(|b| vec![b]),
            (0x80u8..=0xff).prop_map(|b| vec![b]),
        ];
        prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
    }

    fn body(raw: &[u8]) -> Vec<u8> {
        let mut body = br#"{"messages":[{"role":"user","content":""#.to_vec();
        body.extend_from_slice(raw);
        body.extend_from_slice(br#""}]}"#);
        body
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Any text, written by serde_json, routes as that text.
        #[test]
        fn any_text_routes_as_itself(s in any::<String>()) {
            let body = serde_json::json!({"messages": [{"role": "user", "content": s}]});
            let got = inspect(Api::ChatCompletions, body.to_string().as_bytes()).unwrap();
            prop_assert_eq!(got.routing_text, format!("<|user|>\n{s}<|end|>\n"));
        }

        /// Whatever bytes a content string holds: where serde_json reads the
        /// body, inspect reads the same text; where it does not, inspect
        /// refuses it too, unless the one fault is a raw control character
        /// (the worker's to refuse, `inspect/text.rs`).
        #[test]
        fn hostile_content_reads_as_serde_json_reads_it(raw in hard_bytes()) {
            let body = body(&raw);
            let reference = serde_json::from_slice::<serde_json::Value>(&body);
            let got = inspect(Api::ChatCompletions, &body);
            match (reference, got) {
                (Ok(value), Ok(got)) => {
                    let text = value["messages"][0]["content"].as_str().unwrap().to_owned();
                    prop_assert_eq!(got.routing_text, format!("<|user|>\n{text}<|end|>\n"));
                }
                (Ok(_), Err(err)) => prop_assert!(false, "refused what serde_json reads: {err}"),
                (Err(_), Ok(_)) => {
                    let escaped: Vec<u8> = raw
                        .iter()
                        .map(|&b| if b < 0x20 { b'x' } else { b })
                        .collect();
                    prop_assert!(
                        raw.iter().any(|&b| b < 0x20)
                            && serde_json::from_slice::<serde_json::Value>(&self::body(&escaped))
                                .is_ok(),
                        "read what serde_json refuses: {:?}",
                        String::from_utf8_lossy(&raw)
                    );
                }
                (Err(_), Err(_)) => {}
            }
        }
    }
}

/// A UTF-8 byte order mark before the object is passed over, as the
/// Python servers' JSON reader passes it over; before, such a body was
/// refused as "not a JSON object". Anything else before it still is.
#[test]
fn a_byte_order_mark_before_the_object_is_passed_over() {
    let body = "\u{feff}{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    let read = inspect(Api::ChatCompletions, body.as_bytes()).unwrap();
    assert_eq!(read.model.as_deref(), Some("m"));
    assert!(inspect_model(body.as_bytes()).is_ok());
    let twice = format!("\u{feff}{body}");
    assert!(inspect(Api::ChatCompletions, twice.as_bytes()).is_err());
}
