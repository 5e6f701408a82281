//! Chat templates rendered the way transformers renders them.
//!
//! transformers compiles chat templates in a sandboxed Jinja2 environment
//! with `trim_blocks=True`, `lstrip_blocks=True` and the `loopcontrols`
//! extension, and adds a `tojson` filter (Python's `json.dumps` with
//! `ensure_ascii=False`) and two globals, `raise_exception(msg)` and
//! `strftime_now(fmt)`. The render context is the special-token map
//! (`bos_token`, `eos_token`, ...) overlaid with the call's arguments:
//! `messages`, `tools`, `documents`, `add_generation_prompt` and any extra
//! template kwargs. vLLM and SGLang both render through that
//! (`apply_chat_template(..., tokenize=False)`), so this module mirrors it
//! with minijinja:
//! - the same whitespace settings, `break`/`continue`, Python string and dict
//!   methods (`.strip()`, `.items()`, ...) from minijinja-contrib's pycompat;
//! - printed values spelled as Python prints them (`None`, `True`, `1e-05`);
//! - a bounded amount of work per render (minijinja's fuel), so a template
//!   cannot hang the router.
//!
//! The environment is built once at load and shared read-only; rendering
//! takes `&self` and is safe from many threads at once.

use std::path::Path;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, State};

use crate::error::TokenizeError;
use crate::pyjson::{self, Layout};

const NAME: &str = "chat_template";

/// Work one render may do (minijinja's fuel: one an instruction, one per
/// 64 bytes of strings it makes or reads): 4 million instructions, or 256
/// MB of strings. A template's loops run a few hundred instructions per
/// message, so this allows conversations of many thousands of messages and
/// a whole 32 MiB prompt copied a few times over, and stops a runaway
/// template (nested `range` loops, strings doubled) in well under a second
/// of release-build time and a few hundred megabytes. (At 10 million, a
/// template of doubled strings made 781 MB in one render.)
const FUEL: u64 = 4_000_000;

/// A compiled chat template.
#[derive(Debug)]
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    content_parts: bool,
    /// The template's text names a medium (see [`mentions_media`]).
    media: bool,
    wrapped_tools: bool,
}

impl ChatTemplate {
    /// Compile `source`; a syntax error names `origin` and the line.
    pub(crate) fn compile(source: String, origin: &Path) -> Result<Self, TokenizeError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|source| TokenizeError::TemplateSyntax {
                origin: origin.to_path_buf(),
                source,
            })?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        let content_parts = iterates_message_content(&source);
        let media = mentions_media(&source);
        let wrapped_tools = reads_wrapped_tools(&source);
        env.add_template_owned(NAME, source)
            .map_err(|source| TokenizeError::TemplateSyntax {
                origin: origin.to_path_buf(),
                source,
            })?;
        Ok(Self {
            env,
            content_parts,
            media,
            wrapped_tools,
        })
    }

    /// Whether the template reads a tool's fields under its `function`
    /// (`tool.function.name`), and so wants tools in the OpenAI-wrapped
    /// shape; SGLang hands such a template `{type, function}` per tool and
    /// any other the function alone.
    pub(crate) fn wrapped_tools(&self) -> bool {
        self.wrapped_tools
    }

    /// Whether `engine` hands the template content as a list of parts:
    /// one that loops over a message's content, and under SGLang also one
    /// whose text names a medium ([`mentions_media`]).
    pub(crate) fn content_parts(&self, engine: crate::Engine) -> bool {
        self.content_parts || (engine == crate::Engine::Sglang && self.media)
    }

    /// Render with `context` (a map of the template's variables).
    pub(crate) fn render(&self, context: Value) -> Result<String, TokenizeError> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(TokenizeError::TemplateRender)?;
        template
            .render(context)
            .map_err(TokenizeError::TemplateRender)
    }
}

/// Whether `source` has a `{% for ... in message.content %}` loop (also
/// `message['content']`, and `msg`/`m` for the message variable, with
/// filters or a condition after it). vLLM and SGLang both decide a
/// template's "content format" this way (by its parsed loops): such a
/// template gets content as a list of `{"type": "text", "text": ...}` parts,
/// any other gets one string.
pub(crate) fn iterates_message_content(source: &str) -> bool {
    tags(source).filter_map(for_loop).any(|(_, iterable)| {
        ["message", "msg", "m"].iter().any(|var| {
            iterable == format!("{var}.content")
                || iterable == format!("{var}['content']")
                || iterable == format!("{var}[\"content\"]")
        })
    })
}

/// The statements of `source`'s `{% ... %}` tags, trimmed of their
/// whitespace control (`-`, `+`) and spaces, in order; an unclosed tag
/// ends them.
fn tags(source: &str) -> impl Iterator<Item = &str> {
    let mut rest = source;
    std::iter::from_fn(move || {
        let start = rest.find("{%")?;
        let after = &rest[start + 2..];
        let end = after.find("%}")?;
        rest = &after[end + 2..];
        Some(after[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()))
    })
}

/// `s` without its white space.
fn compact(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// A `for VAR in ITERABLE` tag's variable and iterable, compacted, the
/// iterable without its filters or condition.
fn for_loop(tag: &str) -> Option<(String, String)> {
    let (var, iterable) = tag.strip_prefix("for ")?.split_once(" in ")?;
    let iterable = iterable.split('|').next().unwrap_or_default();
    let iterable = iterable.split(" if ").next().unwrap_or_default();
    Some((compact(var), compact(iterable)))
}

/// Whether `source` says "image", "audio", "video" or "vision" anywhere:
/// SGLang takes such a template for a multimodal one, which gets content
/// as a list of parts, before it looks for a loop over content (its
/// `detect_jinja_template_content_format`); vLLM goes by the loops alone.
pub(crate) fn mentions_media(source: &str) -> bool {
    ["image", "audio", "video", "vision"]
        .iter()
        .any(|word| source.contains(word))
}

/// Whether `source` reads `.function` (or `['function']`) of an element
/// of `tools`: a variable of a `{% for X in tools %}` loop, or of a loop
/// over a name `{% set Y = tools %}` bound to it. SGLang decides the shape
/// of the tools it hands a template so, by its parsed loops (in recent
/// versions; before, it handed every template the flat shape); macros that
/// take the list as a parameter are not followed here.
pub(crate) fn reads_wrapped_tools(source: &str) -> bool {
    let mut lists = vec!["tools".to_owned()];
    for tag in tags(source) {
        if let Some((name, value)) = tag.strip_prefix("set ").and_then(|t| t.split_once('='))
            && lists.contains(&compact(value))
        {
            lists.push(compact(name));
        }
    }
    let elements: Vec<String> = tags(source)
        .filter_map(for_loop)
        .filter(|(_, iterable)| lists.contains(iterable))
        .map(|(var, _)| var)
        .collect();
    let compacted = compact(source);
    elements.iter().any(|var| {
        [".function", "['function']", "[\"function\"]"]
            .iter()
            .any(|field| {
                let needle = format!("{var}{field}");
                compacted.match_indices(&needle).any(|(at, _)| {
                    let before = compacted[..at].chars().next_back();
                    let after = compacted[at + needle.len()..].chars().next();
                    let ident =
                        |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                    !ident(before) && !ident(after)
                })
            })
    })
}

/// Print floats as Python's `str()` does (`1e+16`, `1e-05`, `nan`);
/// minijinja already prints `None`, `True`, `False`, integers and strings
/// as Python does, and spells floats in fixed notation only.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut State,
    value: &Value,
) -> Result<(), Error> {
    if value.kind() == ValueKind::Number
        && !value.is_integer()
        && let Ok(f) = f64::try_from(value.clone())
    {
        let mut s = String::new();
        pyjson::write_float(&mut s, f, false);
        return out.write_str(&s).map_err(Error::from);
    }
    minijinja::escape_formatter(out, state, value)
}

/// `tojson(value, indent=None, separators=None, sort_keys=False,
/// ensure_ascii=False)`, as transformers defines it.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            None => Some(v.as_str().map(str::to_owned).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be int or str",
                )
            })?),
        },
    };
    let mut layout = Layout::new(indent);
    let separators: Option<Value> = kwargs.get("separators")?;
    if let Some(seps) = separators.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = seps.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                layout.item_sep = item.as_str().unwrap_or_default().to_owned();
                layout.key_sep = key.as_str().unwrap_or_default().to_owned();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ));
            }
        }
    }
    layout.sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    // ensure_ascii=True is not used by any template we know of; refuse it
    // rather than render different bytes than the engine.
    if kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: ensure_ascii=True is not supported",
        ));
    }
    kwargs.assert_all_used()?;
    pyjson::dumps(value, &layout)
}

/// `raise_exception(message)`: the template rejects this request.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current time (UTC) in a strftime format.
/// transformers uses the engine host's local time; servers mostly run in UTC.
fn strftime_now(format: String) -> Result<String, Error> {
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    let mut out = String::new();
    use std::fmt::Write;
    write!(out, "{}", now.strftime(&format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format with {format:?}"),
        )
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, ctx: serde_json::Value) -> Result<String, TokenizeError> {
        ChatTemplate::compile(source.into(), Path::new("t.jinja"))?
            .render(Value::from(minijinja::value::Serde(ctx)))
    }

    #[test]
    fn blocks_trim_like_transformers() {
        // trim_blocks drops the newline after a tag, lstrip_blocks the
        // indentation before one.
        let out = render(
            "{% for m in messages %}\n    {% if m %}\n[{{ m }}]\n    {% endif %}\n{% endfor %}\n",
            serde_json::json!({"messages": ["a", "b"]}),
        )
        .unwrap();
        assert_eq!(out, "[a]\n[b]\n");
    }

    #[test]
    fn python_methods_loop_controls_and_spelling() {
        let out = render(
            "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}\
             {{ m.content.strip().upper() }};{% endfor %}{{ x }} {{ t }} {{ f }} {{ none }} \
             {{ big }} {{ small }}",
            serde_json::json!({"messages": [{"content": " hi "}, {"content": "yo"}, {"content": "no"}],
                               "x": null, "t": true, "f": 1.0, "big": 1e16, "small": 0.00001}),
        )
        .unwrap();
        assert_eq!(out, "HI;YO;None True 1.0 None 1e+16 1e-05");
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        let out = render(
            "{{ tools | tojson }}|{{ tools | tojson(indent=2) }}|{{ s | tojson }}",
            serde_json::json!({"tools": [{"a": 1}], "s": "é<&>"}),
        )
        .unwrap();
        assert_eq!(out, "[{\"a\": 1}]|[\n  {\n    \"a\": 1\n  }\n]|\"é<&>\"");
    }

    #[test]
    fn tojson_keeps_map_order_unless_sort_keys_and_takes_separators() {
        // A map literal keeps its written order (minijinja preserve_order).
        let out = render(
            "{{ {'b': 1, 'a': [1, 2]} | tojson }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|\
             {{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', ':')) }}",
            serde_json::json!({}),
        )
        .unwrap();
        assert_eq!(
            out,
            "{\"b\": 1, \"a\": [1, 2]}|{\"a\": 2, \"b\": 1}|{\"b\":1,\"a\":[1,2]}"
        );
    }

    #[test]
    fn content_loops_are_detected() {
        for source in [
            "{% for c in message['content'] %}{{ c.text }}{% endfor %}",
            "{%- for part in message.content | selectattr('type', 'eq', 'text') -%}x{% endfor %}",
            "{% for c in m[\"content\"] if c.type == 'text' %}x{% endfor %}",
        ] {
            assert!(iterates_message_content(source), "{source}");
        }
        for source in [
            "{% for message in messages %}{{ message['content'] }}{% endfor %}",
            "{% for t in message.tool_calls %}{% endfor %}",
            "{{ '{% for c in message.content' }}",
        ] {
            assert!(!iterates_message_content(source), "{source}");
        }
    }

    #[test]
    fn a_template_reading_tool_function_is_told_from_one_that_does_not() {
        for wrapped in [
            "{% for tool in tools %}{{ tool.function.name }}{% endfor %}",
            "{%- for t in tools -%}{{ t['function'] | tojson }}{%- endfor %}",
            "{% set ts = tools %}{% for x in ts if x %}{{ x.function }}{% endfor %}",
        ] {
            assert!(reads_wrapped_tools(wrapped), "{wrapped}");
        }
        for flat in [
            "{% for tool in tools %}{{ tool | tojson }}{% endfor %}",
            "{% for tool in tools %}{{ tool.name }}{% endfor %}",
            // `function` of something else, or a longer name.
            "{% for m in messages %}{{ m.function }}{% endfor %}{{ tools }}",
            "{% for tool in tools %}{{ tool.functions }}{% endfor %}",
            "{{ tools | tojson }}",
        ] {
            assert!(!reads_wrapped_tools(flat), "{flat}");
        }
    }

    #[test]
    fn raise_exception_gives_the_templates_message() {
        let err = render(
            "{{ raise_exception('Conversation roles must alternate') }}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(err.is_client_error());
        assert!(
            err.to_string()
                .contains("Conversation roles must alternate"),
            "{err}"
        );
    }

    #[test]
    fn strftime_now_formats_the_date() {
        let out = render("{{ strftime_now('%Y') }}", serde_json::json!({})).unwrap();
        assert_eq!(out.len(), 4);
        assert!(out.starts_with("20"), "{out}");
    }

    #[test]
    fn syntax_errors_name_the_file_and_line() {
        let err = ChatTemplate::compile(
            "ok\n{% for m in messages %}{{ m }".into(),
            Path::new("tokenizer_config.json"),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("tokenizer_config.json") && msg.contains("does not compile"),
            "{msg}"
        );
        assert!(msg.contains("chat_template:2"), "{msg}");
    }

    #[test]
    fn a_runaway_template_stops() {
        let err = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
    }

    /// Fuel pays for the strings a render makes too: a template cannot
    /// make hundreds of megabytes per request. A whole 32 MiB prompt,
    /// copied a few times, still renders.
    #[test]
    fn a_template_that_makes_huge_strings_stops_and_a_huge_prompt_renders() {
        let err = render(
            "{% set a = 'x' * 100000000 %}{% set b = a ~ 'y' %}{{ b | length }}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("fuel"), "{err}");
        let content = "word ".repeat((16 << 20) / 5);
        let out = render(
            "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}",
            serde_json::json!({"messages": [
                {"role": "system", "content": content},
                {"role": "user", "content": content},
            ]}),
        )
        .unwrap();
        assert_eq!(
            out.len(),
            2 * (content.trim().len() + "<|user|>\n".len()) + 2
        );
    }
}
