//! Reading the `routing:` section of a YAML config file, with errors as
//! precise as every other section's: `routing.<key>: why at line L column
//! C`.
//!
//! Serde reads a policy's settings from a buffer (the section is tagged by
//! `policy:`, which may come last), and a buffer has forgotten its lines;
//! it can also only say "unknown field" where the operator needs "this
//! setting is cache_aware's, not round_robin's". So before the file is
//! read into [`Config`](super::Config), [`check`] walks the text once more
//! with the policy already known (from a first, plain parse): every key of
//! the section is checked against that policy's settings
//! ([`PolicyConfig::misplaced_setting`]) and every value is read by the
//! policy's own schema, each from the spot in the text where it stands, so
//! the first error carries the key's path and the value's line and column.
//! What passes, [`section`] then reads for real (the policy defaulting to
//! cache_aware when `policy:` is absent).

use radixgate_routing::{POLICY_KEY, PolicyConfig};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_norway::{Mapping, Value};
use std::fmt;

/// The top-level key of the section.
const SECTION: &str = "routing";

/// Checks the `routing:` section of `text` (already parsed as `document`)
/// key by key, so that an error names `routing.<key>` and its line. Does
/// nothing when the section is absent or is not a mapping (the schema's own
/// error for that has its line).
pub(super) fn check(text: &str, document: &Value) -> Result<(), serde_norway::Error> {
    let Some(section) = document.get(SECTION).and_then(Value::as_mapping) else {
        return Ok(());
    };
    // `None`: the `policy:` value names no policy; that is the error.
    let policy = match section.get(POLICY_KEY) {
        None => Some(PolicyConfig::default()),
        Some(name) => name.as_str().and_then(PolicyConfig::named),
    };
    Document {
        policy: policy.as_ref(),
    }
    .deserialize(serde_norway::Deserializer::from_str(text))
}

/// Reads the section as a [`PolicyConfig`]; a section without `policy:`
/// (or an empty one) tunes the default policy, cache_aware.
pub(super) fn section<'de, D: Deserializer<'de>>(d: D) -> Result<PolicyConfig, D::Error> {
    let mut value = Value::deserialize(d)?;
    if value.is_null() {
        value = Value::Mapping(Mapping::new());
    }
    if let Some(map) = value.as_mapping_mut()
        && !map.contains_key(POLICY_KEY)
    {
        map.insert(POLICY_KEY.into(), PolicyConfig::default().name().into());
    }
    serde_norway::from_value(value).map_err(de::Error::custom)
}

/// The whole document: skips every section but `routing`.
struct Document<'a> {
    policy: Option<&'a PolicyConfig>,
}

impl<'de> DeserializeSeed<'de> for Document<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Document<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a config document")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Value>()? {
            if key.as_str() == Some(SECTION) {
                map.next_value_seed(Section {
                    policy: self.policy,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// The `routing:` mapping: each key is checked, each value read.
struct Section<'a> {
    policy: Option<&'a PolicyConfig>,
}

impl<'de> DeserializeSeed<'de> for Section<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Section<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the routing settings")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            match (key.as_str(), self.policy) {
                (POLICY_KEY, None) => map.next_value_seed(PolicyName)?,
                (_, Some(policy)) if key != POLICY_KEY => {
                    map.next_value_seed(Setting { policy, key: &key })?
                }
                _ => map.next_value::<IgnoredAny>().map(drop)?,
            }
        }
        Ok(())
    }
}

/// A `policy:` value that names no policy: the error, at its position.
struct PolicyName;

impl<'de> DeserializeSeed<'de> for PolicyName {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PolicyName {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = PolicyConfig::NAMES.map(|n| format!("`{n}`"));
        write!(f, "a policy name, one of {}", names.join(", "))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        match PolicyConfig::named(v) {
            Some(_) => Ok(()),
            None => Err(E::unknown_variant(v, &PolicyConfig::NAMES)),
        }
    }
}

/// One setting's value. Its error is raised from inside the visit of the
/// value, where the YAML reader stamps it with the value's path
/// (`routing.<key>`) and position.
struct Setting<'a> {
    policy: &'a PolicyConfig,
    key: &'a str,
}

impl Setting<'_> {
    /// Whether the policy takes the key and `value` is a valid value for it.
    fn judge<E: de::Error>(&self, value: Value) -> Result<(), E> {
        if let Some(why) = self.policy.misplaced_setting(self.key) {
            return Err(E::custom(why));
        }
        let mut alone = Mapping::new();
        alone.insert(POLICY_KEY.into(), self.policy.name().into());
        alone.insert(self.key.into(), value);
        serde_norway::from_value::<PolicyConfig>(Value::Mapping(alone))
            .map(drop)
            .map_err(E::custom)
    }
}

impl<'de> DeserializeSeed<'de> for Setting<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Setting<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a value for routing.{}", self.key)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.judge(v.into())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.judge(v.into())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.judge(v.into())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.judge(v.into())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.judge(v.into())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.judge(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.judge(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let value = Value::deserialize(d)?;
        self.judge(value)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        self.judge(Value::Sequence(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut entries = Mapping::new();
        while let Some((k, v)) = map.next_entry::<Value, Value>()? {
            entries.insert(k, v);
        }
        self.judge(Value::Mapping(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    fn err(yaml: &str) -> String {
        Config::from_yaml(yaml).unwrap_err().to_string()
    }

    #[test]
    fn a_setting_of_another_policy_says_whose_it_is() {
        assert_eq!(
            err("routing: {policy: round_robin, cache_threshold: 0.5}\n"),
            "routing.cache_threshold: applies only to cache_aware; round_robin takes no \
             settings at line 1 column 49"
        );
        // Whatever the order of the keys.
        let e = err("routing:\n  max_tree_size: 10\n  policy: least_load\n");
        assert_eq!(
            e,
            "routing.max_tree_size: applies to cache_aware and prefill_aware; least_load \
             takes no settings at line 2 column 18"
        );
        let e = err("routing:\n  policy: consistent_hash\n  virtual_nodes: 40\n  seed: 3\n");
        assert!(
            e.starts_with("routing.seed: applies to random and power_of_two; consistent_hash takes `virtual_nodes` and `load_factor`"),
            "{e}"
        );
        assert!(e.ends_with("at line 4 column 9"), "{e}");
    }

    #[test]
    fn a_typo_gets_its_line_and_the_closest_key() {
        let e = err("server:\n  port: 1\nrouting:\n  polcy: round_robin\n");
        assert!(
            e.starts_with(
                "routing.polcy: unknown setting (did you mean `policy`?); the keys of \
                 cache_aware are `policy`, `cache_threshold`,"
            ),
            "{e}"
        );
        assert!(e.ends_with("at line 4 column 10"), "{e}");
        let e = err("routing:\n  policy: cache_aware\n  cache_treshold: 0.5\n");
        assert!(
            e.starts_with(
                "routing.cache_treshold: unknown setting (did you mean `cache_threshold`?)"
            ),
            "{e}"
        );
        assert!(e.ends_with("at line 3 column 19"), "{e}");
    }

    #[test]
    fn bad_values_get_their_path_and_line() {
        let e = err("routing:\n  policy: random\n  seed: x\n");
        assert_eq!(
            e,
            "routing.seed: invalid type: string \"x\", expected u64 at line 3 column 9"
        );
        let e = err("routing:\n  hot_spot: {rule: relative_cap, slak: 1}\n");
        assert!(
            e.starts_with("routing.hot_spot: unknown field `slak`, expected `slack` or `factor`"),
            "{e}"
        );
        assert!(e.ends_with("at line 2 column 13"), "{e}");
        let e = err("routing:\n  low_match: smallest\n");
        assert!(
            e.starts_with("routing.low_match: unknown variant `smallest`"),
            "{e}"
        );
        // An unknown policy, as the schema reports it: named, with its line.
        let e = err("routing:\n  policy: fastest\n");
        assert!(
            e.starts_with("routing.policy: unknown variant `fastest`") && e.contains("line 2"),
            "{e}"
        );
    }

    #[test]
    fn other_sections_keep_their_lines_beside_a_routing_section_without_policy() {
        let e = err("routing:\n  cache_threshold: 0.5\nserver:\n  prot: 1\n");
        assert!(
            e.starts_with("server: unknown field `prot`") && e.contains("line 4"),
            "{e}"
        );
        let c = Config::from_yaml("routing:\n").unwrap();
        assert_eq!(c.routing, radixgate_routing::PolicyConfig::default());
        let c = Config::from_yaml("routing: {cache_threshold: 0.5}\n").unwrap();
        assert_eq!(c.routing.name(), "cache_aware");
    }
}
