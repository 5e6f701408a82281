//! What routing reads of a `multipart/form-data` body: an upload, such as
//! the audio of OpenAI's and vLLM's `/v1/audio/transcriptions` and
//! `/v1/audio/translations`, whose `model` is a form field, not JSON.
//! Without it, such a request named no model, and a gateway serving more
//! than one model refused it (400 `model_required`) though the form named
//! one, or sent it to a worker of any model.
//!
//! Only the `model` field and a true `stream` field are read; the body is
//! forwarded as it came. A body that is not a well-formed form names no
//! model here (as before): the worker answers for it. A field given twice
//! counts by its last value, as the Python servers' form parser keeps it.
//! The parts are found with one vectorised search for the delimiter, so a
//! large file costs one pass over its bytes.

use super::Inspected;

/// Longest `model` value read: far above any model name. A longer one is
/// not read as a model (the worker refuses it).
const MODEL_AT_MOST: usize = 1024;

/// The boundary of a `multipart/form-data` content type (its media type in
/// any case, the `boundary` parameter quoted or not), if it is one.
pub(crate) fn boundary(content_type: &[u8]) -> Option<&[u8]> {
    let mut params = content_type.split(|&b| b == b';');
    let media = params.next()?.trim_ascii();
    if !media.eq_ignore_ascii_case(b"multipart/form-data") {
        return None;
    }
    params.find_map(|param| {
        let (name, value) = split_once(param, b'=')?;
        name.trim_ascii()
            .eq_ignore_ascii_case(b"boundary")
            .then(|| unquote(value.trim_ascii()))
            .filter(|b| !b.is_empty())
    })
}

/// Reads the `model` and `stream` fields of a form whose parts are
/// delimited by `boundary`.
pub(crate) fn inspect_form(boundary: &[u8], body: &[u8]) -> Inspected {
    let mut delimiter = Vec::with_capacity(boundary.len() + 4);
    delimiter.extend_from_slice(b"\r\n--");
    delimiter.extend_from_slice(boundary);
    let finder = memchr::memmem::Finder::new(&delimiter);
    let mut inspected = Inspected::default();
    // The first delimiter may open the body (no line end before it).
    let mut at = if body.starts_with(&delimiter[2..]) {
        delimiter.len() - 2
    } else {
        match finder.find(body) {
            Some(found) => found + delimiter.len(),
            None => return inspected,
        }
    };
    loop {
        let rest = &body[at..];
        // The close delimiter, or the end of a broken form.
        if rest.starts_with(b"--") {
            return inspected;
        }
        let Some(headers_at) = memchr::memmem::find(rest, b"\r\n") else {
            return inspected;
        };
        let part = &rest[headers_at + 2..];
        let Some(end) = finder.find(part) else {
            return inspected;
        };
        read_part(&part[..end], &mut inspected);
        at += headers_at + 2 + end + delimiter.len();
    }
}

/// Reads one part (its headers, a blank line, its content) into
/// `inspected` if it is the `model` or the `stream` field.
fn read_part(part: &[u8], inspected: &mut Inspected) {
    let (headers, content) = match memchr::memmem::find(part, b"\r\n\r\n") {
        Some(at) => (&part[..at], &part[at + 4..]),
        // No header at all: the blank line opens the part.
        None if part.starts_with(b"\r\n") => (&b""[..], &part[2..]),
        None => return,
    };
    match field_name(headers) {
        Some(b"model") if content.len() <= MODEL_AT_MOST => {
            inspected.model = std::str::from_utf8(content).ok().map(str::to_owned);
        }
        Some(b"stream") => {
            inspected.stream = ["true", "1", "yes", "on", "t", "y"]
                .iter()
                .any(|t| content.trim_ascii().eq_ignore_ascii_case(t.as_bytes()));
        }
        _ => {}
    }
}

/// The `name` of a part's `Content-Disposition: form-data` header.
fn field_name(headers: &[u8]) -> Option<&[u8]> {
    let value = headers.split(|&b| b == b'\n').find_map(|line| {
        let (name, value) = split_once(line, b':')?;
        name.trim_ascii()
            .eq_ignore_ascii_case(b"content-disposition")
            .then_some(value)
    })?;
    let mut params = value.split(|&b| b == b';');
    if !params
        .next()?
        .trim_ascii()
        .eq_ignore_ascii_case(b"form-data")
    {
        return None;
    }
    params.find_map(|param| {
        let (name, value) = split_once(param, b'=')?;
        name.trim_ascii()
            .eq_ignore_ascii_case(b"name")
            .then(|| unquote(value.trim_ascii()))
    })
}

/// `bytes` split at the first `at`.
fn split_once(bytes: &[u8], at: u8) -> Option<(&[u8], &[u8])> {
    let i = memchr::memchr(at, bytes)?;
    Some((&bytes[..i], &bytes[i + 1..]))
}

/// A parameter's value without its quotes.
fn unquote(value: &[u8]) -> &[u8] {
    value
        .strip_prefix(b"\"")
        .and_then(|v| v.strip_suffix(b"\""))
        .unwrap_or(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(boundary: &str, parts: &[(&str, &str)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (name, value) in parts {
            body.extend_from_slice(
                format!(
                    "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n\
                     {value}\r\n"
                )
                .as_bytes(),
            );
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        body
    }

    #[test]
    fn the_boundary_is_read_from_a_form_content_type_only() {
        assert_eq!(
            boundary(b"multipart/form-data; boundary=abc"),
            Some(&b"abc"[..])
        );
        assert_eq!(
            boundary(b"Multipart/Form-Data;charset=utf-8; BOUNDARY=\"a b\""),
            Some(&b"a b"[..])
        );
        assert_eq!(boundary(b"multipart/form-data"), None);
        assert_eq!(boundary(b"multipart/form-data; boundary=\"\""), None);
        assert_eq!(boundary(b"multipart/mixed; boundary=abc"), None);
        assert_eq!(boundary(b"application/json"), None);
    }

    #[test]
    fn the_model_and_stream_fields_are_read_wherever_they_are() {
        let audio = "RIFF\r\n--abd\r\n\r\n\u{0}\u{7f}";
        let body = form(
            "abc",
            &[("file", audio), ("stream", "True"), ("model", "whisper")],
        );
        let got = inspect_form(b"abc", &body);
        assert_eq!(got.model.as_deref(), Some("whisper"));
        assert!(got.stream);
        let body = form("abc", &[("model", "a"), ("language", "en"), ("model", "b")]);
        let got = inspect_form(b"abc", &body);
        assert_eq!(got.model.as_deref(), Some("b"), "the last one counts");
        assert!(!got.stream);
        // A preamble before the first delimiter is skipped.
        let mut body = b"ignored\r\n".to_vec();
        body.extend(form("abc", &[("model", "m")]));
        assert_eq!(inspect_form(b"abc", &body).model.as_deref(), Some("m"));
    }

    #[test]
    fn a_broken_form_names_no_model() {
        for body in [
            &b""[..],
            b"--abc",
            b"--abc\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm",
            b"--abc\r\nContent-Disposition: form-data; name=\"model\"\r\nm\r\n--abc--",
            b"--abd\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--abd--",
            b"--abc\r\nContent-Disposition: attachment; name=\"model\"\r\n\r\nm\r\n--abc--",
            b"--abc\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n\xff\r\n--abc--",
        ] {
            assert_eq!(inspect_form(b"abc", body), Inspected::default(), "{body:?}");
        }
        let long = "m".repeat(MODEL_AT_MOST + 1);
        let body = form("abc", &[("model", &long)]);
        assert_eq!(inspect_form(b"abc", &body).model, None);
    }
}
