//! One usage object read in a single pass over its bytes, keeping only the
//! fields a report uses.
//!
//! Every answer's tail is read this way (the cached-token count feeds the
//! routing correction), so the reader is written for that: it walks the
//! object once, compares each key with the few names it knows, reads a
//! known count straight into a [`Count`], and steps over everything else
//! while checking it is well-formed JSON. It accepts what `serde_json`
//! accepts for such an object and refuses what it refuses (the tests
//! compare the two): a malformed object, a key that is not valid UTF-8, or
//! a count field whose value `serde_json` would not read gives `None`.
//! Where a known field appears twice the last one counts, as a JSON map
//! keeps it.

/// A count as the worker gave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Count {
    /// A non-negative integer that fits in 64 bits.
    Int(u64),
    /// Any other value but `null`: negative, fractional, too large, not a
    /// number.
    Other,
}

impl Count {
    pub(super) fn as_u64(self) -> Option<u64> {
        match self {
            Count::Int(n) => Some(n),
            Count::Other => None,
        }
    }
}

/// The fields of a usage object that any API's report uses; each `None`
/// when missing or `null`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Fields {
    pub(super) total_tokens: Option<Count>,
    pub(super) prompt_tokens: Option<Count>,
    pub(super) input_tokens: Option<Count>,
    pub(super) cache_read_input_tokens: Option<Count>,
    pub(super) cache_creation_input_tokens: Option<Count>,
    pub(super) completion_tokens: Option<Count>,
    pub(super) output_tokens: Option<Count>,
    /// SGLang's `meta_info.cached_tokens`.
    pub(super) cached_tokens: Option<Count>,
    /// `prompt_tokens_details.cached_tokens`; `None` also when the details
    /// are not an object.
    pub(super) prompt_details_cached: Option<Count>,
    /// `input_tokens_details.cached_tokens`, the same way.
    pub(super) input_details_cached: Option<Count>,
}

/// The object at the start of `bytes` (which must open with `{`), if it is
/// complete and well-formed; what follows it is not read.
pub(super) fn read(bytes: &[u8]) -> Option<Fields> {
    let mut r = Reader { bytes, at: 0 };
    let mut out = Fields::default();
    r.members(|r, key| {
        let slot = match key {
            b"total_tokens" => &mut out.total_tokens,
            b"prompt_tokens" => &mut out.prompt_tokens,
            b"input_tokens" => &mut out.input_tokens,
            b"cache_read_input_tokens" => &mut out.cache_read_input_tokens,
            b"cache_creation_input_tokens" => &mut out.cache_creation_input_tokens,
            b"completion_tokens" => &mut out.completion_tokens,
            b"output_tokens" => &mut out.output_tokens,
            b"cached_tokens" => &mut out.cached_tokens,
            b"prompt_tokens_details" => return r.details(&mut out.prompt_details_cached),
            b"input_tokens_details" => return r.details(&mut out.input_details_cached),
            _ => return r.skip_value(),
        };
        *slot = r.count(1)?;
        Some(())
    })?;
    Some(out)
}

/// The bytes a string's plain run stops at: its end, an escape, a control
/// character, a byte of a non-ASCII character.
static STOPS: [bool; 256] = {
    let mut stops = [false; 256];
    let mut b = 0;
    while b < 256 {
        stops[b] = b < 0x20 || b >= 0x80 || b == b'"' as usize || b == b'\\' as usize;
        b += 1;
    }
    stops
};

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Consumes `byte` after any whitespace.
    fn expect(&mut self, byte: u8) -> Option<()> {
        self.skip_space();
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// The object at the cursor, calling `member` with the cursor on each
    /// value (after the `:`) and its key, unescaped.
    fn members(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.expect(b'{')?;
        self.skip_space();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            self.skip_space();
            let key = self.key()?;
            self.expect(b':')?;
            match key {
                Key::Plain(start, end) => {
                    let bytes = self.bytes;
                    member(self, &bytes[start..end])?;
                }
                Key::Escaped(key) => member(self, key.as_bytes())?,
            }
            self.skip_space();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A key: its bytes where it has no escape (checked to be UTF-8), else
    /// unescaped by `serde_json` (rare enough not to need a reader of its
    /// own).
    fn key(&mut self) -> Option<Key> {
        let start = self.at;
        let (end, escaped, ascii) = self.string()?;
        if escaped {
            let key = serde_json::from_slice::<String>(&self.bytes[start..end + 1]).ok()?;
            return Some(Key::Escaped(key));
        }
        let inner = &self.bytes[start + 1..end];
        if !ascii {
            std::str::from_utf8(inner).ok()?;
        }
        Some(Key::Plain(start + 1, end))
    }

    /// The string at the cursor: the index of its closing quote, whether it
    /// has an escape, and whether it is all ASCII. Control characters and
    /// unknown escapes are refused; what a `\u` escape encodes is not
    /// checked here (nor by `serde_json` in a value it skips).
    fn string(&mut self) -> Option<(usize, bool, bool)> {
        if self.peek()? != b'"' {
            return None;
        }
        self.at += 1;
        let (mut escaped, mut ascii) = (false, true);
        loop {
            // Plain characters in one tight loop, then the one that is not.
            let rest = self.bytes.get(self.at..)?;
            let plain = rest.iter().position(|&b| STOPS[usize::from(b)])?;
            self.at += plain + 1;
            match rest[plain] {
                b'"' => return Some((self.at - 1, escaped, ascii)),
                b'\\' => {
                    escaped = true;
                    match self.peek()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 1,
                        b'u' => {
                            let hex = self.bytes.get(self.at + 1..self.at + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.at += 5;
                        }
                        _ => return None,
                    }
                }
                0x80.. => ascii = false,
                _ => return None,
            }
        }
    }

    /// A count field's value, inside `depth` objects: `None` for `null`,
    /// else what it is. A value that is not a count is checked as
    /// `serde_json` reads it into a `Value` (its strings' escapes and UTF-8,
    /// its numbers' range, its nesting within the recursion limit).
    fn count(&mut self, depth: usize) -> Option<Option<Count>> {
        self.skip_space();
        let start = self.at;
        let count = match self.peek()? {
            b'n' => return self.literal(b"null").map(|()| None),
            b'-' | b'0'..=b'9' => self.number()?,
            _ => {
                self.skip_value()?;
                Count::Other
            }
        };
        if count == Count::Other {
            as_value(&self.bytes[start..self.at], depth)?;
        }
        Some(Some(count))
    }

    /// A `*_tokens_details` value: an object's `cached_tokens` goes to
    /// `slot`; any other value leaves `None` there (a string or a number
    /// checked as `serde_json` reads one, an array stepped over).
    fn details(&mut self, slot: &mut Option<Count>) -> Option<()> {
        self.skip_space();
        let start = self.at;
        match self.peek()? {
            b'{' => {
                let mut cached = None;
                self.members(|r, key| match key {
                    b"cached_tokens" => {
                        cached = r.count(2)?;
                        Some(())
                    }
                    _ => r.skip_value(),
                })?;
                *slot = cached;
                return Some(());
            }
            b'"' | b'-' | b'0'..=b'9' => {
                self.skip_value()?;
                as_value(&self.bytes[start..self.at], 1)?;
            }
            _ => self.skip_value()?,
        }
        *slot = None;
        Some(())
    }

    /// A number as JSON writes it: a non-negative integer within 64 bits
    /// is an [`Count::Int`], any other (a minus sign, a fraction, an
    /// exponent, too many digits) is [`Count::Other`].
    fn number(&mut self) -> Option<Count> {
        let negative = self.peek()? == b'-';
        if negative {
            self.at += 1;
        }
        let mut value = Some(0u64);
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                while let Some(digit @ b'0'..=b'9') = self.peek() {
                    self.at += 1;
                    value = value
                        .and_then(|v| v.checked_mul(10))
                        .and_then(|v| v.checked_add(u64::from(digit - b'0')));
                }
            }
            _ => return None,
        }
        let mut integer = !negative;
        if self.peek() == Some(b'.') {
            self.at += 1;
            integer = false;
            self.digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            integer = false;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.digits()?;
        }
        Some(match (integer, value) {
            (true, Some(n)) => Count::Int(n),
            _ => Count::Other,
        })
    }

    /// One or more digits.
    fn digits(&mut self) -> Option<()> {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        (self.at > start).then_some(())
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// Steps over the value at the cursor, checking that it is well-formed
    /// as `serde_json` checks a value it ignores: at any depth (it is read
    /// without recursion), its strings' escapes but not what they encode.
    fn skip_value(&mut self) -> Option<()> {
        // The containers open around the cursor, innermost last: true for
        // an object. Nothing is allocated unless a value nests.
        let mut open: Vec<bool> = Vec::new();
        loop {
            self.skip_space();
            match self.peek()? {
                b'{' | b'[' => {
                    let object = self.peek() == Some(b'{');
                    self.at += 1;
                    self.skip_space();
                    if self.peek()? == if object { b'}' } else { b']' } {
                        self.at += 1;
                    } else {
                        open.push(object);
                        if object {
                            self.member_key()?;
                        }
                        continue;
                    }
                }
                b'"' => {
                    self.string()?;
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                b'-' | b'0'..=b'9' => {
                    self.number()?;
                }
                _ => return None,
            }
            // A value ended: close what ends with it, up to the next one.
            loop {
                let Some(&object) = open.last() else {
                    return Some(());
                };
                self.skip_space();
                match self.peek()? {
                    b',' => {
                        self.at += 1;
                        if object {
                            self.member_key()?;
                        }
                        break;
                    }
                    b'}' if object => {
                        self.at += 1;
                        open.pop();
                    }
                    b']' if !object => {
                        self.at += 1;
                        open.pop();
                    }
                    _ => return None,
                }
            }
        }
    }

    /// An ignored object's key and its `:`.
    fn member_key(&mut self) -> Option<()> {
        self.skip_space();
        self.string()?;
        self.expect(b':')
    }
}

/// Whether `serde_json` reads `value`, met inside `depth` objects, into a
/// `Value` (the rare path: a count that is not one, details that are a
/// string or a number). Wrapped in as many arrays so that its recursion
/// limit counts the same.
fn as_value(value: &[u8], depth: usize) -> Option<()> {
    let mut wrapped = Vec::with_capacity(value.len() + 2 * depth);
    wrapped.resize(depth, b'[');
    wrapped.extend_from_slice(value);
    wrapped.resize(wrapped.len() + depth, b']');
    serde_json::from_slice::<serde_json::Value>(&wrapped)
        .ok()
        .map(drop)
}

/// A key as found: its span in the bytes, or unescaped.
enum Key {
    Plain(usize, usize),
    Escaped(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    /// The reader this one replaced (`serde`'s derive, the details read by
    /// hand, keeping the last), as the reference. It refuses an object
    /// with a known field twice; the cases below never repeat one.
    #[derive(Deserialize)]
    struct Reference {
        total_tokens: Option<serde_json::Value>,
        prompt_tokens: Option<serde_json::Value>,
        input_tokens: Option<serde_json::Value>,
        cache_read_input_tokens: Option<serde_json::Value>,
        cache_creation_input_tokens: Option<serde_json::Value>,
        completion_tokens: Option<serde_json::Value>,
        output_tokens: Option<serde_json::Value>,
        cached_tokens: Option<serde_json::Value>,
        prompt_tokens_details: Option<ReferenceDetails>,
        input_tokens_details: Option<ReferenceDetails>,
    }

    #[derive(Default)]
    struct ReferenceDetails {
        cached_tokens: Option<serde_json::Value>,
    }

    impl<'de> Deserialize<'de> for ReferenceDetails {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
            struct Read;
            impl<'de> Visitor<'de> for Read {
                type Value = ReferenceDetails;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("any JSON value")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                    let mut out = ReferenceDetails::default();
                    while let Some(key) = map.next_key::<String>()? {
                        match key.as_str() {
                            "cached_tokens" => out.cached_tokens = map.next_value()?,
                            _ => {
                                map.next_value::<IgnoredAny>()?;
                            }
                        }
                    }
                    Ok(out)
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    Ok(ReferenceDetails::default())
                }
                fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                    Ok(ReferenceDetails::default())
                }
                fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                    Ok(ReferenceDetails::default())
                }
                fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                    Ok(ReferenceDetails::default())
                }
                fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                    Ok(ReferenceDetails::default())
                }
                fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                    Ok(ReferenceDetails::default())
                }
                fn visit_unit<E>(self) -> Result<Self::Value, E> {
                    Ok(ReferenceDetails::default())
                }
            }
            d.deserialize_any(Read)
        }
    }

    fn reference(bytes: &[u8]) -> Option<Fields> {
        let r = Reference::deserialize(&mut serde_json::Deserializer::from_slice(bytes)).ok()?;
        let count =
            |v: Option<serde_json::Value>| v.map(|v| v.as_u64().map_or(Count::Other, Count::Int));
        Some(Fields {
            total_tokens: count(r.total_tokens),
            prompt_tokens: count(r.prompt_tokens),
            input_tokens: count(r.input_tokens),
            cache_read_input_tokens: count(r.cache_read_input_tokens),
            cache_creation_input_tokens: count(r.cache_creation_input_tokens),
            completion_tokens: count(r.completion_tokens),
            output_tokens: count(r.output_tokens),
            cached_tokens: count(r.cached_tokens),
            prompt_details_cached: count(r.prompt_tokens_details.and_then(|d| d.cached_tokens)),
            input_details_cached: count(r.input_tokens_details.and_then(|d| d.cached_tokens)),
        })
    }

    const KNOWN: [&str; 10] = [
        "total_tokens",
        "prompt_tokens",
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "completion_tokens",
        "output_tokens",
        "cached_tokens",
        "prompt_tokens_details",
        "input_tokens_details",
    ];

    /// Values of every kind, well-formed or not, as bytes.
    fn value() -> impl Strategy<Value = Vec<u8>> {
        let leaf = prop_oneof![
            prop::sample::select(vec![
                "0",
                "7",
                "16",
                "18446744073709551615",
                "18446744073709551616",
                "-0",
                "-5",
                "-9223372036854775809",
                "2.5",
                "1e3",
                "1E+2",
                "1e400",
                "-1e400",
                "1e-400",
                "01",
                "-",
                "1.",
                ".5",
                "1e",
                "true",
                "false",
                "null",
                "nul",
                "nulll",
                "tru",
                "\"3\"",
                "\"\"",
                "\"a\\\"b\"",
                "\"\\ud800\"",
                "\"\\udc00\"",
                "\"\\ud83d\\ude00\"",
                "\"\\u00e9\"",
                "\"\\x\"",
                "\"\\u12\"",
                "\"\u{e9}\"",
                "\"\t\"",
                "\"abc",
                "}",
                "]",
                ",",
                "",
            ])
            .prop_map(|s| s.as_bytes().to_vec()),
            Just(b"\"\xff\"".to_vec()),
            any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(|items| {
                    let mut out = b"[".to_vec();
                    out.extend(items.join(&b","[..]));
                    out.push(b']');
                    out
                }),
                prop::collection::vec(
                    (
                        prop::sample::select(vec![
                            "cached_tokens",
                            "audio_tokens",
                            "x",
                            "",
                            "\u{043a}",
                        ]),
                        inner
                    ),
                    0..4
                )
                .prop_map(|members| object(
                    members
                        .iter()
                        .map(|(k, v)| (format!("\"{k}\"").into_bytes(), v.clone()))
                )),
            ]
        })
    }

    fn object(members: impl Iterator<Item = (Vec<u8>, Vec<u8>)>) -> Vec<u8> {
        let mut out = b"{".to_vec();
        for (i, (key, value)) in members.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend(key);
            out.extend(b" : ");
            out.extend(value);
        }
        out.push(b'}');
        out
    }

    /// A key: a known one (spelled plainly or with an escape) or another.
    fn key(known: usize, escaped: bool) -> Vec<u8> {
        match (KNOWN.get(known), escaped) {
            (Some(name), false) => format!("\"{name}\"").into_bytes(),
            (Some(name), true) => {
                format!("\"\\u{:04x}{}\"", name.as_bytes()[0], &name[1..]).into_bytes()
            }
            (None, false) => b"\"system_fingerprint\"".to_vec(),
            (None, true) => b"\"\xc3\x28\"".to_vec(),
        }
    }

    /// Objects with each known field at most once, unknown ones besides,
    /// then perhaps cut short or with one byte changed.
    fn usage_object() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::sample::subsequence(
                (0..KNOWN.len() + 2).collect::<Vec<_>>(),
                0..=KNOWN.len() + 2,
            ),
            prop::collection::vec((any::<bool>(), value()), KNOWN.len() + 2),
            prop::option::of(any::<prop::sample::Index>()),
            prop::option::of((any::<prop::sample::Index>(), any::<u8>())),
        )
            .prop_map(|(fields, values, cut, change)| {
                let mut out = object(fields.into_iter().map(|i| {
                    let (escaped, value) = values[i].clone();
                    (key(i, escaped), value)
                }));
                if let Some((at, byte)) = change {
                    let at = at.index(out.len());
                    out[at] = byte;
                }
                if let Some(cut) = cut {
                    out.truncate(cut.index(out.len() + 1));
                }
                out
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn reads_what_serde_json_reads(bytes in usage_object()) {
            prop_assert_eq!(
                read(&bytes),
                reference(&bytes),
                "{}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }

    #[test]
    fn whole_objects_read_as_serde_json_reads_them() {
        for text in [
            &br#"{"completion_tokens":16,"prompt_tokens":16,"prompt_tokens_details":{"cached_tokens":0},"total_tokens":32}"#[..],
            br#"{ "prompt_tokens" : 7 , "prompt_tokens_details" : { "cached_tokens" : null } }"#,
            br#"{"input_tokens":9,"input_tokens_details":{"cached_tokens":8,"x":[1,{"y":"}"}]},"output_tokens":1}"#,
            br#"{"prompt_tokens_details":"\ud800"}"#,
            br#"{"prompt_tokens_details":["\ud800"]}"#,
            br#"{"prompt_tokens_details":1e400}"#,
            br#"{"prompt_tokens":"\ud800"}"#,
            br#"{"prompt_tokens":["\ud800"]}"#,
            br#"{"x":"\ud800","prompt_tokens":3}"#,
            br#"{"prompt_tokens":3} trailing"#,
            br#"{"prompt_tokens":3,}"#,
            br#"{,"prompt_tokens":3}"#,
            br#"{"prompt_tokens" 3}"#,
            br#"{}"#,
            b"{\"prompt_tokens\":3\x0c}",
        ] {
            assert_eq!(read(text), reference(text), "{}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn nesting_is_refused_where_serde_json_refuses_it() {
        for depth in [1, 2, 124, 125, 126, 127, 128, 129, 300] {
            let nested = |open: &str, close: &str| {
                let mut out = b"{\"x\":".to_vec();
                out.extend(open.repeat(depth - 1).as_bytes());
                out.extend(b"1");
                out.extend(close.repeat(depth - 1).as_bytes());
                out.push(b'}');
                out
            };
            for text in [nested("[", "]"), nested("{\"a\":", "}")] {
                assert_eq!(read(&text), reference(&text), "depth {depth}");
            }
            let mut deep = b"{\"prompt_tokens_details\":".to_vec();
            deep.extend("[".repeat(depth).as_bytes());
            deep.extend("]".repeat(depth).as_bytes());
            deep.push(b'}');
            assert_eq!(read(&deep), reference(&deep), "details, depth {depth}");
            // A count's value is read as a `Value`, whose nesting counts.
            for (open, close) in [
                ("{\"prompt_tokens\":", "}"),
                ("{\"prompt_tokens_details\":{\"cached_tokens\":", "}}"),
            ] {
                let mut count = open.as_bytes().to_vec();
                count.extend("[".repeat(depth).as_bytes());
                count.extend("]".repeat(depth).as_bytes());
                count.extend(close.as_bytes());
                assert_eq!(read(&count), reference(&count), "{open} depth {depth}");
            }
        }
        assert!(read(b"{\"x\":1}").is_some());
    }

    #[test]
    fn a_field_given_twice_counts_as_given_last() {
        let fields = read(br#"{"prompt_tokens":7,"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":3},"prompt_tokens_details":null}"#).unwrap();
        assert_eq!(fields.prompt_tokens, Some(Count::Int(9)));
        assert_eq!(fields.prompt_details_cached, None);
        let fields = read(br#"{"cached_tokens":1,"cached_tokens":"x"}"#).unwrap();
        assert_eq!(fields.cached_tokens, Some(Count::Other));
        let fields =
            read(br#"{"prompt_tokens_details":{"cached_tokens":2,"cached_tokens":5}}"#).unwrap();
        assert_eq!(fields.prompt_details_cached, Some(Count::Int(5)));
    }
}
