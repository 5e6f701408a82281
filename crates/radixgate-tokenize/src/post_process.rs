//! Checks on a `tokenizer.json`'s post-processor that the `tokenizers`
//! crate leaves to encode time.
//!
//! A `TemplateProcessing` post-processor (the one that adds a BOS) is
//! deserialized without checking that its templates can be applied: a
//! single-sequence template naming a special token its `special_tokens` do
//! not define, or naming the pair's second sequence (`$B`), loads fine and
//! then panics inside `encode` on the first request with special tokens.
//! These checks refuse such a file at load instead, naming the fault. Only
//! the single-sequence template is checked: the router never encodes pairs.

use serde_json::Value;

/// Why the post-processor cannot encode a single sequence, if it cannot.
pub(crate) fn check(tokenizer: &tokenizers::Tokenizer) -> Result<(), String> {
    let Some(processor) = tokenizer.get_post_processor() else {
        return Ok(());
    };
    let value = serde_json::to_value(processor)
        .map_err(|e| format!("its post_processor does not serialize: {e}"))?;
    check_value(&value)
}

/// [`check`] of a serialized post-processor, `Sequence`s included.
fn check_value(processor: &Value) -> Result<(), String> {
    match processor.get("type").and_then(Value::as_str) {
        Some("TemplateProcessing") => check_template(processor),
        Some("Sequence") => processor
            .get("processors")
            .and_then(Value::as_array)
            .map_or(Ok(()), |all| all.iter().try_for_each(check_value)),
        _ => Ok(()),
    }
}

fn check_template(processor: &Value) -> Result<(), String> {
    let defined = processor.get("special_tokens");
    let pieces = processor
        .get("single")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for piece in pieces {
        if let Some(id) = piece.pointer("/SpecialToken/id").and_then(Value::as_str)
            && defined.and_then(|d| d.get(id)).is_none()
        {
            return Err(format!(
                "its post_processor's single template uses the special token `{id}`, \
                 which its special_tokens do not define"
            ));
        }
        if piece.pointer("/Sequence/id").and_then(Value::as_str) == Some("B") {
            return Err(
                "its post_processor's single template uses `$B`, the second sequence of a pair"
                    .to_owned(),
            );
        }
    }
    Ok(())
}
