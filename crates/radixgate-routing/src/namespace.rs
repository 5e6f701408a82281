//! Cache namespaces: what an engine splits its prefix cache by besides the
//! model.
//!
//! vLLM keys its prefix cache by `cache_salt` (and by LoRA adapter, which
//! it serves under the adapter's own model name, so an adapter is already
//! a pool of its own); SGLang by LoRA adapter (`lora_path`) and
//! `extra_key`. Two requests that differ in these never share a cached
//! prefix on a worker, however alike their texts, so routing must not
//! believe they do.
//!
//! The rule: a request outside the shared namespace has its routing text
//! start with a marker, `\u{1}` + 16 hex digits of a stable hash of the
//! namespace + `\u{1}` (18 characters). A text in the shared namespace
//! (no adapter, salt or extra key) stays as it is, except that one which
//! itself starts with `\u{1}` gets one more `\u{1}` in front. Then:
//! - within a namespace the marker is a fixed prefix, so a conversation's
//!   next turn still extends its previous turn's text;
//! - texts of two different namespaces part within the first 17
//!   characters — in the shared namespace a text starts with something
//!   other than `\u{1}`, or with two of them, where a marked one has a hex
//!   digit second; two markers differ in their hex digits — so nothing of
//!   one namespace's prompt ever matches another's (the few marker
//!   characters two may share are far below any useful cache threshold).
//!   Only a 64-bit hash collision would merge two namespaces.
//!
//! Why a marker in the model's tree and not a tree per namespace: the
//! namespace comes from the client (a salt per end user is the usual use),
//! and trees are keyed only by what the worker set bounds (served models).
//! With the marker, every namespace of a model lives in that model's one
//! tree, under its size bound and its eviction, however many salts
//! clients invent.

use crate::mix::hash_bytes;
use std::fmt::Write as _;

/// Starts and ends a namespace marker; a control character no API uses in
/// text, so a shared-namespace text rarely needs escaping.
const MARK: char = '\u{1}';

/// A request's cache namespace: its LoRA adapter, cache salt and extra key,
/// each kept as a hash. Build it with the `with_` methods in any order;
/// empty strings count as absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheNamespace {
    adapter: Option<u64>,
    salt: Option<u64>,
    extra_key: Option<u64>,
}

impl CacheNamespace {
    /// The shared namespace (no adapter, salt or extra key).
    pub fn shared() -> Self {
        Self::default()
    }

    /// Sets the LoRA adapter (SGLang `lora_path` as a string).
    pub fn with_adapter(mut self, name: &str) -> Self {
        self.adapter = (!name.is_empty()).then(|| field_hash(b"adapter", [Some(name)]));
        self
    }

    /// Sets the adapters of a batch (SGLang `lora_path` as a list, one
    /// entry per prompt; `None` or empty for the base model). A batch whose
    /// entries all name one adapter is in that adapter's namespace, one
    /// with none in the shared one; a mixed batch is a namespace of its own.
    pub fn with_batch_adapters<'s>(self, names: impl IntoIterator<Item = Option<&'s str>>) -> Self {
        let names: Vec<&str> = names.into_iter().map(Option::unwrap_or_default).collect();
        match names.split_first() {
            None => self.with_adapter(""),
            Some((first, rest)) if rest.iter().all(|n| n == first) => self.with_adapter(first),
            Some(_) => Self {
                adapter: Some(field_hash(b"adapters", names.iter().map(|n| Some(*n)))),
                ..self
            },
        }
    }

    /// Sets the cache salt (vLLM `cache_salt`).
    pub fn with_salt(mut self, salt: &str) -> Self {
        self.salt = (!salt.is_empty()).then(|| field_hash(b"salt", [Some(salt)]));
        self
    }

    /// Sets the extra cache key (SGLang `extra_key`).
    pub fn with_extra_key(mut self, key: &str) -> Self {
        self.extra_key = (!key.is_empty()).then(|| field_hash(b"extra_key", [Some(key)]));
        self
    }

    /// Whether this is the shared namespace.
    pub fn is_shared(&self) -> bool {
        *self == Self::default()
    }

    /// `text` as routed in this namespace (the rule in the module doc).
    pub(crate) fn apply(&self, text: String) -> String {
        if self.is_shared() {
            if !text.starts_with(MARK) {
                return text;
            }
            let mut out = String::with_capacity(text.len() + 1);
            out.push(MARK);
            out.push_str(&text);
            return out;
        }
        let mut key = Vec::with_capacity(27);
        for part in [self.adapter, self.salt, self.extra_key] {
            match part {
                Some(h) => {
                    key.push(1);
                    key.extend_from_slice(&h.to_le_bytes());
                }
                None => key.push(0),
            }
        }
        let mut out = String::with_capacity(text.len() + 18);
        out.push(MARK);
        // Writing to a String cannot fail.
        let _ = write!(out, "{:016x}", hash_bytes(&key));
        out.push(MARK);
        out.push_str(&text);
        out
    }
}

/// A hash of one field's value(s), each length-prefixed so that no two
/// different lists hash the same bytes.
fn field_hash<'s>(tag: &[u8], values: impl IntoIterator<Item = Option<&'s str>>) -> u64 {
    let mut bytes = tag.to_vec();
    for value in values {
        let value = value.unwrap_or_default().as_bytes();
        bytes.extend_from_slice(&(value.len() as u64).to_le_bytes());
        bytes.extend_from_slice(value);
    }
    hash_bytes(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn common_prefix_chars(a: &str, b: &str) -> usize {
        a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
    }

    fn namespace(kind: u8, value: &str) -> CacheNamespace {
        match kind % 4 {
            0 => CacheNamespace::shared(),
            1 => CacheNamespace::shared().with_salt(value),
            2 => CacheNamespace::shared().with_adapter(value),
            _ => CacheNamespace::shared().with_extra_key(value),
        }
    }

    #[test]
    fn the_shared_namespace_leaves_texts_alone() {
        let shared = CacheNamespace::shared();
        assert!(shared.is_shared());
        assert_eq!(shared.apply("<|user|>\nhi".into()), "<|user|>\nhi");
        assert_eq!(shared.apply(String::new()), "");
        assert_eq!(shared.apply("\u{1}x".into()), "\u{1}\u{1}x");
        assert!(shared.with_salt("").with_adapter("").is_shared());
        assert!(shared.with_batch_adapters([None, Some("")]).is_shared());
    }

    #[test]
    fn markers_name_the_namespace_whatever_the_order() {
        let a = CacheNamespace::shared().with_salt("s").with_adapter("l");
        let b = CacheNamespace::shared().with_adapter("l").with_salt("s");
        assert_eq!(a, b);
        let text = a.apply("hi".into());
        assert_eq!(text.chars().count(), 18 + 2);
        assert!(text.starts_with('\u{1}') && text.ends_with("\u{1}hi"));
        // The same string in different fields is a different namespace.
        let salt = CacheNamespace::shared().with_salt("x");
        let key = CacheNamespace::shared().with_extra_key("x");
        let adapter = CacheNamespace::shared().with_adapter("x");
        assert_ne!(salt.apply(String::new()), key.apply(String::new()));
        assert_ne!(salt.apply(String::new()), adapter.apply(String::new()));
        // A batch of one adapter is that adapter; a mixed batch is neither.
        assert_eq!(
            CacheNamespace::shared().with_batch_adapters([Some("x"), Some("x")]),
            adapter
        );
        let mixed = CacheNamespace::shared().with_batch_adapters([Some("x"), None]);
        assert!(!mixed.is_shared() && mixed != adapter);
        assert_ne!(
            mixed,
            CacheNamespace::shared().with_batch_adapters([None, Some("x")])
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

        /// Within a namespace, a text that extends another still does once
        /// namespaced.
        #[test]
        fn a_namespace_keeps_prefixes(
            kind in 0u8..4,
            value in "[a-z]{1,4}",
            first in "(\u{1}|[a-z<|>\n]){0,8}",
            more in "(\u{1}|[a-z<|>\n]){0,8}",
        ) {
            let ns = namespace(kind, &value);
            let turn1 = ns.apply(first.clone());
            let turn2 = ns.apply(format!("{first}{more}"));
            prop_assert!(turn2.starts_with(&turn1));
        }

        /// Texts of different namespaces part within the marker, before
        /// either one's own text.
        #[test]
        fn namespaces_share_no_text(
            (ka, va) in (0u8..4, "[a-z]{1,4}"),
            (kb, vb) in (0u8..4, "[a-z]{1,4}"),
            text in "(\u{1}|[a-z]){0,12}",
        ) {
            let (a, b) = (namespace(ka, &va), namespace(kb, &vb));
            prop_assume!(a != b);
            let (ta, tb) = (a.apply(text.clone()), b.apply(text.clone()));
            prop_assert!(common_prefix_chars(&ta, &tb) < 17, "{:?} {:?}", ta, tb);
        }
    }
}
