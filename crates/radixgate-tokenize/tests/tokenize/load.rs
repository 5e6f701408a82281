//! Loading: from a file, from a directory, and the errors for bad files.

use radixgate_tokenize::testing::{TempDir, TestModel};
use radixgate_tokenize::{Endpoint, TokenizeError, Tokenizer};
use serde_json::json;

#[test]
fn loads_from_a_directory_and_from_its_tokenizer_json_alike() {
    let dir = TestModel::default().write_temp().unwrap();
    let from_dir = Tokenizer::load(dir.path()).unwrap();
    let from_file = Tokenizer::load(dir.path().join("tokenizer.json")).unwrap();
    assert!(from_dir.has_chat_template());
    assert!(
        !from_file.has_chat_template(),
        "a lone file has no template"
    );
    assert_eq!(from_dir.vocab_size(), 1_000);
    let body = json!({"prompt": "The router matches the prefix of each request."});
    let a = from_dir
        .prompt_tokens(Endpoint::Completions, &body)
        .unwrap();
    let b = from_file
        .prompt_tokens(Endpoint::Completions, &body)
        .unwrap();
    assert_eq!(a, b);
    // A trained BPE: fewer tokens than bytes, more than words.
    assert!(a.len() > 8 && a.len() < 40, "{a:?}");
}

#[test]
fn chat_without_a_template_is_a_clear_error() {
    let dir = TestModel {
        chat_template: None,
        ..TestModel::default()
    }
    .write_temp()
    .unwrap();
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    for tok in [
        Tokenizer::load(dir.path()).unwrap(),
        Tokenizer::load(dir.path().join("tokenizer.json")).unwrap(),
    ] {
        let err = tok
            .prompt_tokens(Endpoint::ChatCompletions, &body)
            .unwrap_err();
        assert!(matches!(err, TokenizeError::NoChatTemplate), "{err}");
        assert!(err.to_string().contains("no chat template"), "{err}");
        // Completions need no template.
        tok.prompt_tokens(Endpoint::Completions, &json!({"prompt": "hi"}))
            .unwrap();
    }
}

#[test]
fn missing_paths_and_a_directory_without_tokenizer_json_say_so() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("nope");
    let err = Tokenizer::load(&missing).unwrap_err();
    assert!(matches!(err, TokenizeError::Io { .. }), "{err}");
    assert!(err.to_string().contains("nope"), "{err}");

    let err = Tokenizer::load(dir.path()).unwrap_err();
    assert!(
        matches!(err, TokenizeError::NoTokenizerJson { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("holds no tokenizer.json"), "{err}");
}

#[test]
fn a_bad_tokenizer_json_is_a_clear_error() {
    let dir = TempDir::new().unwrap();
    for (i, text) in [
        "{ not json",
        r#"{"version": "1.0", "model": {"type": "Nope"}}"#,
        "[]",
    ]
    .into_iter()
    .enumerate()
    {
        let file = dir.path().join(format!("bad{i}.json"));
        std::fs::write(&file, text).unwrap();
        let err = Tokenizer::load(&file).unwrap_err();
        assert!(
            matches!(err, TokenizeError::BadTokenizer { .. }),
            "{text}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains("is not a valid tokenizer.json"), "{msg}");
        assert!(msg.contains(&format!("bad{i}.json")), "{msg}");
    }
}

#[test]
fn a_bad_config_or_template_fails_at_load_naming_the_file() {
    let dir = TestModel::default().write_temp().unwrap();
    let config = dir.path().join("tokenizer_config.json");

    std::fs::write(
        &config,
        r#"{"chat_template": "{% for m in messages %}{{ m.content }"}"#,
    )
    .unwrap();
    let err = Tokenizer::load(dir.path()).unwrap_err();
    assert!(matches!(err, TokenizeError::TemplateSyntax { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("tokenizer_config.json") && msg.contains("does not compile"),
        "{msg}"
    );

    std::fs::write(&config, "{ truncated").unwrap();
    let err = Tokenizer::load(dir.path()).unwrap_err();
    assert!(matches!(err, TokenizeError::BadConfig { .. }), "{err}");
    assert!(err.to_string().contains("not valid JSON"), "{err}");

    std::fs::write(&config, r#"{"chat_template": {"default": "x"}}"#).unwrap();
    let err = Tokenizer::load(dir.path()).unwrap_err();
    assert!(err.to_string().contains("`chat_template` must be"), "{err}");
}

#[test]
fn chat_template_jinja_beside_the_config_is_used() {
    let dir = TestModel::default().write_temp().unwrap();
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
    )
    .unwrap();
    let tok = Tokenizer::load(dir.path()).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(tok.render_chat(&body).unwrap(), "[user] hi\n");
}

#[test]
fn named_templates_in_the_config_use_the_default_one() {
    let dir = TestModel::default().write_temp().unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<|bos|>", "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ bos_token }}DEFAULT"}]}"#,
    )
    .unwrap();
    let tok = Tokenizer::load(dir.path()).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(tok.render_chat(&body).unwrap(), "<|bos|>DEFAULT");
}

/// A `tokenizer.json` saved with truncation or padding switched on (a
/// training script's `enable_truncation(512)` is saved with the file) still
/// gives the whole prompt's ids, unpadded: transformers turns both off on
/// every encode that does not ask for them, so vLLM and SGLang compute the
/// whole prompt, and the router must match all of it.
#[test]
fn saved_truncation_and_padding_do_not_change_the_prompt_tokens() {
    let dir = TestModel::default().write_temp().unwrap();
    let file = dir.path().join("tokenizer.json");
    let plain = Tokenizer::load(dir.path()).unwrap();
    let mut saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    saved["truncation"] = json!({
        "direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0,
    });
    saved["padding"] = json!({
        "strategy": {"Fixed": 256}, "direction": "Right", "pad_to_multiple_of": null,
        "pad_id": 0, "pad_type_id": 0, "pad_token": "<|pad|>",
    });
    std::fs::write(&file, serde_json::to_vec(&saved).unwrap()).unwrap();
    let configured = Tokenizer::load(dir.path()).unwrap();

    let body = json!({"prompt": "The router matches the prefix of each request."});
    let want = plain.prompt_tokens(Endpoint::Completions, &body).unwrap();
    assert!(want.len() > 4, "{want:?}");
    assert_eq!(
        configured
            .prompt_tokens(Endpoint::Completions, &body)
            .unwrap(),
        want
    );
    let chat = json!({"messages": [{"role": "user", "content": "hi there, router"}]});
    assert_eq!(
        configured
            .prompt_tokens(Endpoint::ChatCompletions, &chat)
            .unwrap(),
        plain
            .prompt_tokens(Endpoint::ChatCompletions, &chat)
            .unwrap()
    );
    assert_eq!(
        configured.encode("hello", false).unwrap(),
        plain.encode("hello", false).unwrap()
    );
}

/// A post-processor template that names a special token it does not
/// define, or the second sequence of a pair in the single-sequence
/// template, loads in the `tokenizers` crate and panics on the first
/// encode with special tokens: it must be refused at load, naming the
/// fault, not take down each request that reaches it.
#[test]
fn a_post_processor_template_that_cannot_encode_fails_at_load() {
    let dir = TestModel::default().write_temp().unwrap();
    let file = dir.path().join("tokenizer.json");
    let good: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(good["post_processor"]["type"], "TemplateProcessing");

    let mut undefined = good.clone();
    undefined["post_processor"]["special_tokens"] = json!({});
    let mut second = good.clone();
    second["post_processor"]["single"] = json!([{"Sequence": {"id": "B", "type_id": 0}}]);
    let mut nested = good.clone();
    nested["post_processor"] = json!({
        "type": "Sequence",
        "processors": [{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                        "use_regex": true},
                       undefined["post_processor"].clone()],
    });
    for (bad, says) in [(undefined, "<|bos|>"), (second, "$B"), (nested, "<|bos|>")] {
        std::fs::write(&file, serde_json::to_vec(&bad).unwrap()).unwrap();
        let err = Tokenizer::load(dir.path()).unwrap_err();
        assert!(matches!(err, TokenizeError::BadTokenizer { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("is not a valid tokenizer.json"), "{msg}");
        assert!(msg.contains(says), "{msg}");
    }

    std::fs::write(&file, serde_json::to_vec(&good).unwrap()).unwrap();
    let tok = Tokenizer::load(dir.path()).unwrap();
    let ids = tok
        .prompt_tokens(Endpoint::Completions, &json!({"prompt": "hello"}))
        .unwrap();
    assert_eq!(ids[0], tok.encode("<|bos|>", false).unwrap()[0]);
}
