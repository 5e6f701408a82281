//! `/v1/completions` and `/generate`, with and without a tokenizer.

use radixgate_tokenize::{Endpoint, TokenizeError, body_token_ids};
use serde_json::json;

use crate::{model, special};

#[test]
fn completion_text_gets_the_tokenizers_bos_unless_asked_not_to() {
    let (_dir, tok) = model();
    let bos = special(&tok, "<|bos|>");
    let text = "The worker holds the prefix.";
    let plain = tok.encode(text, false).unwrap();
    let ids = tok
        .prompt_tokens(Endpoint::Completions, &json!({"prompt": text}))
        .unwrap();
    assert_eq!(ids[0], bos);
    assert_eq!(ids[1..], plain[..]);
    let ids = tok
        .prompt_tokens(
            Endpoint::Completions,
            &json!({"prompt": [text], "add_special_tokens": false}),
        )
        .unwrap();
    assert_eq!(ids, plain);
}

#[test]
fn completion_ids_pass_through_unchanged() {
    let (_dir, tok) = model();
    for body in [
        json!({"prompt": [5, 900, 7]}),
        json!({"prompt": [[5, 900, 7]]}),
    ] {
        assert_eq!(
            tok.prompt_tokens(Endpoint::Completions, &body).unwrap(),
            vec![5, 900, 7]
        );
    }
}

#[test]
fn generate_text_is_encoded_like_a_completion() {
    let (_dir, tok) = model();
    let text = "Tokens, not text: <|user|> stays one token.";
    let a = tok
        .prompt_tokens(Endpoint::Generate, &json!({"text": text}))
        .unwrap();
    let b = tok
        .prompt_tokens(Endpoint::Completions, &json!({"prompt": text}))
        .unwrap();
    assert_eq!(a, b);
    assert!(a.contains(&special(&tok, "<|user|>")), "{a:?}");
}

#[test]
fn generate_input_ids_need_no_tokenizer() {
    let body = json!({"input_ids": [1, 2, 3, 40000], "sampling_params": {"max_new_tokens": 8}});
    assert_eq!(
        body_token_ids(Endpoint::Generate, &body).unwrap(),
        Some(vec![1, 2, 3, 40000])
    );
    // With a tokenizer, the same ids.
    let (_dir, tok) = model();
    assert_eq!(
        tok.prompt_tokens(Endpoint::Generate, &body).unwrap(),
        vec![1, 2, 3, 40000]
    );
    // Text needs one: no ids in the body.
    assert_eq!(
        body_token_ids(Endpoint::Generate, &json!({"text": "hi"})).unwrap(),
        None
    );
    let err = body_token_ids(Endpoint::Generate, &json!({"input_ids": [1, "2"]})).unwrap_err();
    assert!(matches!(err, TokenizeError::InvalidBody(_)), "{err}");
}

#[test]
fn a_prompts_prefix_is_its_first_characters_tokens() {
    let (_dir, tok) = model();
    let text = "The worker holds the prefix of a long prompt, and the router asks it. ".repeat(40);
    let whole = tok
        .prompt_tokens(Endpoint::Completions, &json!({"prompt": text}))
        .unwrap();
    for max_chars in [1, 100, 1_000, 2_000] {
        let cut = tok
            .prompt_prefix_tokens(Endpoint::Completions, &json!({"prompt": text}), max_chars)
            .unwrap();
        // The cut text's tokens are the whole text's but for the last one
        // or two, which the cut may split.
        assert!(cut.len() < whole.len(), "{max_chars}: {} tokens", cut.len());
        let same = cut.len().saturating_sub(2);
        assert_eq!(cut[..same], whole[..same], "{max_chars}");
    }
    // A cap past the prompt's end changes nothing; ids are cut by count.
    let all = tok
        .prompt_prefix_tokens(Endpoint::Completions, &json!({"prompt": text}), 1 << 20)
        .unwrap();
    assert_eq!(all, whole);
    let ids = tok
        .prompt_prefix_tokens(Endpoint::Completions, &json!({"prompt": [5, 900, 7]}), 2)
        .unwrap();
    assert_eq!(ids, vec![5, 900]);
}

#[test]
fn a_chat_prompts_prefix_is_cut_after_its_template() {
    let (_dir, tok) = model();
    let body = json!({"messages": [{"role": "user", "content": "Summarise this. ".repeat(500)}]});
    let whole = tok.prompt_tokens(Endpoint::ChatCompletions, &body).unwrap();
    let rendered = tok.render_chat(&body).unwrap();
    let cut = tok
        .prompt_prefix_tokens(Endpoint::ChatCompletions, &body, 300)
        .unwrap();
    assert!(rendered.chars().count() > 300);
    assert!(
        cut.len() < whole.len() / 4,
        "{} of {}",
        cut.len(),
        whole.len()
    );
    let same = cut.len() - 2;
    assert_eq!(cut[..same], whole[..same]);
}
