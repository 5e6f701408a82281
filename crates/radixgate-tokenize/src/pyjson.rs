//! Python's spelling of values, which chat templates were written against.
//!
//! transformers registers `tojson` for chat templates as
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
//! sort_keys=sort_keys)` (transformers' chat template utilities), not Jinja's
//! own HTML-escaping `tojson`. Tool schemas and tool-call arguments reach the
//! prompt through it, so the bytes must match: `", "` and `": "` separators,
//! non-ASCII kept, only `"`, `\` and control characters escaped, floats as
//! Python's `repr` (`1.0`, `1e-05`, `1e+16`).
//!
//! Map keys come out in the order the `serde_json::Value` holds them: the
//! request's order when serde_json's `preserve_order` is on, sorted otherwise.

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// How `json.dumps` lays out containers.
pub(crate) struct Layout {
    /// `indent=`: `None` for one line.
    pub(crate) indent: Option<String>,
    /// `separators=(item, key)`; Python's default depends on `indent`.
    pub(crate) item_sep: String,
    pub(crate) key_sep: String,
    pub(crate) sort_keys: bool,
}

impl Layout {
    pub(crate) fn new(indent: Option<String>) -> Self {
        // json.dumps: separators default to (', ', ': ') when indent is None
        // and (',', ': ') otherwise.
        let item_sep = if indent.is_some() { "," } else { ", " };
        Self {
            indent,
            item_sep: item_sep.into(),
            key_sep: ": ".into(),
            sort_keys: false,
        }
    }
}

/// `json.dumps(value, ensure_ascii=False, ...)`.
pub(crate) fn dumps(value: &Value, layout: &Layout) -> Result<String, Error> {
    let mut out = String::new();
    write_value(&mut out, value, layout, 0)?;
    Ok(out)
}

fn write_value(
    out: &mut String,
    value: &Value,
    layout: &Layout,
    depth: usize,
) -> Result<(), Error> {
    if depth > 256 {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    match value.kind() {
        ValueKind::Undefined => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: value is undefined (not JSON serializable)",
            ));
        }
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String | ValueKind::Bytes => {
            write_string(out, value.as_str().unwrap_or_default())
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, '[', ']', items.len(), layout, depth, |out, i| {
                write_value(out, &items[i], layout, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if layout.sort_keys {
                keys.sort();
            }
            write_container(out, '{', '}', keys.len(), layout, depth, |out, i| {
                let key = &keys[i];
                match key.as_str() {
                    Some(s) => write_string(out, s),
                    // json.dumps turns int/float/bool/None keys into strings.
                    None => {
                        let mut inner = String::new();
                        write_value(&mut inner, key, layout, depth + 1)?;
                        write_string(out, &inner);
                    }
                }
                out.push_str(&layout.key_sep);
                write_value(out, &value.get_item(key)?, layout, depth + 1)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {} is not JSON serializable", value.kind()),
            ));
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    open: char,
    close: char,
    len: usize,
    layout: &Layout,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&layout.item_sep);
        }
        if let Some(indent) = &layout.indent {
            out.push('\n');
            for _ in 0..=depth {
                out.push_str(indent);
            }
        }
        item(out, i)?;
    }
    if let Some(indent) = &layout.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
    out.push(close);
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if !value.is_integer() {
        match f64::try_from(value.clone()) {
            Ok(f) => write_float(out, f, true),
            Err(_) => {
                let _ = write!(out, "{value}");
            }
        }
    } else if let Ok(i) = i64::try_from(value.clone()) {
        let _ = write!(out, "{i}");
    } else if let Ok(u) = u64::try_from(value.clone()) {
        let _ = write!(out, "{u}");
    } else if let Ok(i) = i128::try_from(value.clone()) {
        let _ = write!(out, "{i}");
    } else {
        let _ = write!(out, "{value}");
    }
}

/// Python's `repr(float)` (`json` spells the non-finite ones `NaN`,
/// `Infinity`, `-Infinity`; `repr` spells them `nan`, `inf`, `-inf`).
pub(crate) fn write_float(out: &mut String, f: f64, json: bool) {
    if f.is_nan() {
        out.push_str(if json { "NaN" } else { "nan" });
        return;
    }
    if f.is_infinite() {
        let s = match (json, f > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        };
        out.push_str(s);
        return;
    }
    // Both Rust and Python print the shortest digits that round-trip; they
    // differ in when to switch to exponent form. Python: exponent < -4 or
    // >= 16 (repr uses format 'r', i.e. 17 significant digits' threshold).
    let sci = format!("{f:e}"); // e.g. "1.2345e17", "-1e-5"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let fixed = format!("{f}");
        out.push_str(&fixed);
        if !fixed.contains('.') {
            out.push_str(".0");
        }
    } else {
        out.push_str(mantissa);
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

/// A JSON string with `ensure_ascii=False`.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn float(f: f64) -> String {
        let mut s = String::new();
        write_float(&mut s, f, true);
        s
    }

    #[test]
    fn floats_are_spelled_like_python_repr() {
        // Expected strings are what CPython's repr() prints for these values.
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.0, "123456789012345.0"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (0.1, "0.1"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(float(f), want, "{f}");
        }
    }

    #[test]
    fn dumps_matches_python_defaults() {
        // Keys in sorted order, so the expectation holds with and without
        // serde_json's `preserve_order`.
        let v = Value::from(minijinja::value::Serde(serde_json::json!({
            "b": true, "f": 2.0, "n": 3, "name": "get_weather",
            "note": "naïve \"quoted\"\n\u{1}",
            "parameters": {"required": ["city"], "type": "object", "x": [], "y": {}},
            "z": null
        })));
        assert_eq!(
            dumps(&v, &Layout::new(None)).unwrap(),
            r#"{"b": true, "f": 2.0, "n": 3, "name": "get_weather", "note": "naïve \"quoted\"\n\u0001", "parameters": {"required": ["city"], "type": "object", "x": [], "y": {}}, "z": null}"#
        );
    }

    #[test]
    fn dumps_with_indent_matches_python() {
        let v = Value::from(minijinja::value::Serde(
            serde_json::json!({"a": [1, {"b": null}], "c": {}}),
        ));
        assert_eq!(
            dumps(&v, &Layout::new(Some("  ".into()))).unwrap(),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {}\n}"
        );
    }

    #[test]
    fn undefined_is_an_error() {
        assert!(dumps(&Value::UNDEFINED, &Layout::new(None)).is_err());
    }
}
