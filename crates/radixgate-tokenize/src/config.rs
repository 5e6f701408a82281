//! What `tokenizer_config.json` (and its sibling template files) says about
//! chat: the template and the special-token strings it refers to.
//!
//! Shapes accepted, as Hugging Face model directories write them:
//! - `chat_template`: a string, or a list of `{"name", "template"}` of which
//!   the one named `default` is used (transformers picks "default" when no
//!   name is asked for);
//! - `bos_token`, `eos_token`, `unk_token`, `pad_token`, `sep_token`,
//!   `cls_token`, `mask_token`: a string, an `AddedToken` object
//!   (`{"content": "<s>", ...}`) or null;
//! - newer checkpoints keep the template in `chat_template.jinja` (raw
//!   Jinja) or `chat_template.json` (`{"chat_template": ...}`) beside the
//!   config; when one is there it is used.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::TokenizeError;

/// The special-token names that transformers hands every chat template
/// (its `special_tokens_map`).
pub(crate) const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// The chat-relevant part of a model directory.
#[derive(Debug, Default)]
pub(crate) struct ChatConfig {
    /// The template source and the file it came from.
    pub(crate) template: Option<(String, PathBuf)>,
    /// `(name, content)` of each special token the config names.
    pub(crate) special_tokens: Vec<(&'static str, String)>,
}

impl ChatConfig {
    /// Read a model directory's config files; none of them is required.
    pub(crate) fn load_dir(dir: &Path) -> Result<Self, TokenizeError> {
        let config_path = dir.join("tokenizer_config.json");
        let mut config = match read_optional(&config_path)? {
            Some(text) => Self::parse(&text, &config_path)?,
            None => Self::default(),
        };
        let jinja_path = dir.join("chat_template.jinja");
        let json_path = dir.join("chat_template.json");
        if let Some(text) = read_optional(&jinja_path)? {
            config.template = Some((text, jinja_path));
        } else if let Some(text) = read_optional(&json_path)? {
            let value = parse_json(&text, &json_path)?;
            let template = value
                .get("chat_template")
                .ok_or_else(|| bad(&json_path, "has no `chat_template` key"))?;
            if let Some(source) = pick_template(template, &json_path)? {
                config.template = Some((source, json_path));
            }
        }
        Ok(config)
    }

    /// Parse the text of a `tokenizer_config.json`.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<Self, TokenizeError> {
        let value = parse_json(text, path)?;
        let Value::Object(map) = &value else {
            return Err(bad(path, "is not a JSON object"));
        };
        let template = match map.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(t) => pick_template(t, path)?.map(|s| (s, path.to_path_buf())),
        };
        let mut special_tokens = Vec::new();
        for key in SPECIAL_TOKEN_KEYS {
            match map.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => special_tokens.push((key, s.clone())),
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => special_tokens.push((key, s.clone())),
                    _ => {
                        return Err(bad(
                            path,
                            format!("`{key}` is an object without a string `content`"),
                        ));
                    }
                },
                Some(_) => {
                    return Err(bad(
                        path,
                        format!("`{key}` must be a string or an AddedToken object"),
                    ));
                }
            }
        }
        Ok(Self {
            template,
            special_tokens,
        })
    }
}

/// A template given as a string, or as a list of named templates.
fn pick_template(value: &Value, path: &Path) -> Result<Option<String>, TokenizeError> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Array(items) => {
            let mut names = Vec::new();
            for item in items {
                let name = item.get("name").and_then(Value::as_str);
                let template = item.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_owned())),
                    (Some(n), Some(_)) => names.push(n.to_owned()),
                    _ => {
                        return Err(bad(
                            path,
                            "`chat_template` list entries must be {\"name\": string, \"template\": string}",
                        ));
                    }
                }
            }
            Err(bad(
                path,
                format!("`chat_template` lists templates {names:?} but none is named \"default\""),
            ))
        }
        _ => Err(bad(
            path,
            "`chat_template` must be a string or a list of named templates",
        )),
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, TokenizeError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizeError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_json(text: &str, path: &Path) -> Result<Value, TokenizeError> {
    serde_json::from_str(text).map_err(|e| bad(path, format!("is not valid JSON: {e}")))
}

fn bad(path: &Path, reason: impl Into<String>) -> TokenizeError {
    TokenizeError::BadConfig {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ChatConfig, TokenizeError> {
        ChatConfig::parse(text, Path::new("tokenizer_config.json"))
    }

    #[test]
    fn template_as_string_and_tokens_as_strings_or_objects() {
        let c = parse(
            r#"{"chat_template": "T", "bos_token": "<s>",
                "eos_token": {"content": "</s>", "lstrip": false, "special": true},
                "pad_token": null}"#,
        )
        .unwrap();
        assert_eq!(c.template.unwrap().0, "T");
        assert_eq!(
            c.special_tokens,
            vec![("bos_token", "<s>".into()), ("eos_token", "</s>".into())]
        );
    }

    #[test]
    fn named_templates_pick_default() {
        let c = parse(
            r#"{"chat_template": [{"name": "tool_use", "template": "A"},
                                  {"name": "default", "template": "B"}]}"#,
        )
        .unwrap();
        assert_eq!(c.template.unwrap().0, "B");
    }

    #[test]
    fn named_templates_without_default_is_an_error_naming_them() {
        let e = parse(r#"{"chat_template": [{"name": "rag", "template": "A"}]}"#).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("none is named \"default\"") && msg.contains("rag"),
            "{msg}"
        );
    }

    #[test]
    fn malformed_configs_say_what_is_wrong() {
        for (text, needle) in [
            ("{not json", "not valid JSON"),
            ("[1]", "not a JSON object"),
            (r#"{"chat_template": 3}"#, "must be a string or a list"),
            (r#"{"bos_token": 3}"#, "`bos_token` must be"),
            (
                r#"{"eos_token": {"special": true}}"#,
                "without a string `content`",
            ),
            (r#"{"chat_template": [{"template": "x"}]}"#, "list entries"),
        ] {
            let msg = parse(text).unwrap_err().to_string();
            assert!(msg.contains(needle), "{text}: {msg}");
            assert!(msg.contains("tokenizer_config.json"), "{msg}");
        }
    }

    #[test]
    fn no_template_is_not_an_error_at_load() {
        let c = parse(r#"{"model_max_length": 4096}"#).unwrap();
        assert!(c.template.is_none());
    }
}
