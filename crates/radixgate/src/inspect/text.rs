//! Long strings (prompts, message contents) read in one quick pass.
//!
//! Asked for a `str`, serde_json goes over a string twice: it looks for its
//! end eight bytes at a time, refusing control characters on the way, then
//! checks all of it for UTF-8. Asked for bytes, it finds the end with
//! `memchr2` (vectorised) and checks nothing; the bytes are checked for
//! UTF-8 here, once, by `simdutf8` (vectorised too). Escapes are decoded as
//! before. `bench/instr_cost.py` (a 4 KiB chat body): 116,892 instructions
//! per whole answer before, 108,233 read as bytes and checked by the
//! standard library, 107,169 checked by `simdutf8`.
//!
//! What a string read this way still refuses: bytes that are not UTF-8 and
//! a lone surrogate escape (`"\ud800"`, which decodes to bytes that are not
//! UTF-8). What it no longer refuses: a raw control character inside the
//! string, which JSON wants escaped. The gateway forwards the body as it
//! came, and the worker that parses it refuses that as it would without
//! the gateway.

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// Deserialises a string, an array or `null` through `visitor`, a string
/// read as bytes (module doc); `null` reaches `visit_unit`, and so would a
/// missing field (serde reads one as `None` this way): only for fields with
/// a default.
pub(super) fn string_seq_or_null<'de, D, V>(d: D, visitor: V) -> Result<V::Value, D::Error>
where
    D: Deserializer<'de>,
    V: Visitor<'de>,
{
    d.deserialize_option(Utf8(visitor))
}

/// Deserialises a string or an array through `visitor`, a string read as
/// bytes (module doc). `null` is refused as the wrong type, and a missing
/// field stays missing (through `deserialize_option` it would read as
/// `null`).
pub(super) fn string_or_seq<'de, D, V>(d: D, visitor: V) -> Result<V::Value, D::Error>
where
    D: Deserializer<'de>,
    V: Visitor<'de>,
{
    d.deserialize_bytes(Utf8(visitor))
}

/// A string field that may be long, read as bytes (module doc).
pub(super) struct Text<'a>(pub(super) Cow<'a, str>);

impl<'de: 'a, 'a> serde::Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_bytes(Utf8(V))
    }
}

/// Hands a string that came as bytes to the visitor inside as a `str`,
/// once it is known to be UTF-8, and everything else as it came.
struct Utf8<V>(V);

fn utf8<E: de::Error>(bytes: &[u8]) -> Result<&str, E> {
    simdutf8::basic::from_utf8(bytes).map_err(|_| E::custom("a string is not valid UTF-8"))
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Utf8<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.0.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        d.deserialize_bytes(self)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<V::Value, E> {
        self.0.visit_borrowed_str(utf8(v)?)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<V::Value, E> {
        self.0.visit_str(utf8(v)?)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<V::Value, E> {
        self.0.visit_borrowed_str(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<V::Value, E> {
        self.0.visit_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<V::Value, E> {
        self.0.visit_string(v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<V::Value, A::Error> {
        self.0.visit_seq(seq)
    }
}
