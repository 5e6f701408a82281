//! Which policy takes which setting, read from the config types themselves,
//! and what to tell an operator who put a setting under the wrong policy or
//! misspelled it.
//!
//! [`PolicyConfig`] is tagged by `policy:`, so serde alone can only say
//! "unknown field `cache_threshold`, there are no fields" when round_robin
//! gets a cache_aware setting. [`PolicyConfig::misplaced_setting`] says
//! instead which policies the setting belongs to, or, for a key no policy
//! has, the closest real key and the chosen policy's keys.
//!
//! The settings of each policy are the field names serde itself reads
//! ([`FieldNames`] asks the derived `Deserialize` for them), so a setting
//! added to a config struct is known here without a second list.

use crate::config::PolicyConfig;
use serde::Deserialize;
use serde::de::{self, Visitor};
use std::fmt;

/// The key that names the policy.
pub const POLICY_KEY: &str = "policy";

impl PolicyConfig {
    /// Every policy with its default settings, in the order `--policy`
    /// lists them.
    pub fn all() -> [Self; 7] {
        [
            Self::CacheAware(Default::default()),
            Self::PrefillAware(Default::default()),
            Self::RoundRobin(Default::default()),
            Self::Random(Default::default()),
            Self::PowerOfTwo(Default::default()),
            Self::LeastLoad(Default::default()),
            Self::ConsistentHash(Default::default()),
        ]
    }

    /// Every policy's name, as spelled in config files, in the order of
    /// [`Self::all`].
    pub const NAMES: [&'static str; 7] = [
        "cache_aware",
        "prefill_aware",
        "round_robin",
        "random",
        "power_of_two",
        "least_load",
        "consistent_hash",
    ];

    /// The policy called `name` with its default settings.
    pub fn named(name: &str) -> Option<Self> {
        Self::all().into_iter().find(|p| p.name() == name)
    }

    /// The settings this policy takes (besides `policy`), as spelled in
    /// config files, in declaration order.
    pub fn settings(&self) -> &'static [&'static str] {
        match self {
            Self::CacheAware(_) => FieldNames::of::<crate::CacheAwareConfig>(),
            Self::PrefillAware(_) => FieldNames::of::<crate::PrefillAwareConfig>(),
            Self::RoundRobin(_) => FieldNames::of::<crate::RoundRobinConfig>(),
            Self::Random(_) => FieldNames::of::<crate::RandomConfig>(),
            Self::PowerOfTwo(_) => FieldNames::of::<crate::PowerOfTwoConfig>(),
            Self::LeastLoad(_) => FieldNames::of::<crate::LeastLoadConfig>(),
            Self::ConsistentHash(_) => FieldNames::of::<crate::ConsistentHashConfig>(),
        }
    }

    /// `None` when this policy takes `key` (or `key` is `policy`);
    /// otherwise why not, for an error message about `routing.<key>`: the
    /// policies the setting applies to, or, for a key no policy has, the
    /// closest real key and this policy's keys.
    pub fn misplaced_setting(&self, key: &str) -> Option<String> {
        if key == POLICY_KEY || self.settings().contains(&key) {
            return None;
        }
        let takes = |p: &Self| match p.settings() {
            [] => format!("{} takes no settings", p.name()),
            keys => format!("{} takes {}", p.name(), quoted(keys)),
        };
        let owners: Vec<&str> = Self::all()
            .iter()
            .filter(|p| p.settings().contains(&key))
            .map(|p| p.name())
            .collect();
        if !owners.is_empty() {
            let only = if owners.len() == 1 { " only" } else { "" };
            return Some(format!(
                "applies{only} to {}; {}",
                and_list(&owners),
                takes(self)
            ));
        }
        let mut known: Vec<&str> = vec![POLICY_KEY];
        for p in Self::all() {
            for s in p.settings() {
                if !known.contains(s) {
                    known.push(s);
                }
            }
        }
        let hint = closest(key, &known)
            .map(|k| format!(" (did you mean `{k}`?)"))
            .unwrap_or_default();
        let keys = match self.settings() {
            [] => format!(
                "{} takes no settings: its only key is `{POLICY_KEY}`",
                self.name()
            ),
            keys => {
                let all: Vec<&str> = std::iter::once(POLICY_KEY)
                    .chain(keys.iter().copied())
                    .collect();
                format!("the keys of {} are {}", self.name(), quoted(&all))
            }
        };
        Some(format!("unknown setting{hint}; {keys}"))
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

fn quoted(keys: &[&str]) -> String {
    let keys: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
    and_list(&keys.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The candidate nearest to `key` by edit distance, if near enough to be a
/// plausible typo (at most a third of its length, at least one edit).
fn closest<'a>(key: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let limit = (key.chars().count() / 3).max(1);
    candidates
        .iter()
        .map(|c| (edit_distance(key, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars, with an adjacent swap counting as one
/// edit (a common typo).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Rows i-2, i-1 and i of the table.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut row = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        row[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (prev[j] + 1).min(row[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut row);
    }
    prev[b.len()]
}

/// A deserializer that answers nothing but records the field names a
/// derived `Deserialize` of a struct hands it.
struct FieldNames;

/// What [`FieldNames`] ends with: the names, or a type that is no struct.
#[derive(Debug)]
enum Probe {
    Fields(&'static [&'static str]),
    NotAStruct,
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field-name probe")
    }
}

impl std::error::Error for Probe {}

impl de::Error for Probe {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Probe::NotAStruct
    }
}

impl FieldNames {
    /// The field names of struct `T` as serde reads them (renames
    /// applied); empty for a type that is not a struct.
    fn of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
        match T::deserialize(FieldNames) {
            Err(Probe::Fields(fields)) => fields,
            _ => &[],
        }
    }
}

impl<'de> de::Deserializer<'de> for FieldNames {
    type Error = Probe;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Probe> {
        Err(Probe::NotAStruct)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Probe> {
        Err(Probe::Fields(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn misplaced(policy: &str, key: &str) -> Option<String> {
        PolicyConfig::named(policy).unwrap().misplaced_setting(key)
    }

    #[test]
    fn settings_are_the_fields_serde_reads() {
        let ca = PolicyConfig::default();
        assert_eq!(ca.settings()[0], "cache_threshold");
        assert!(ca.settings().contains(&"hot_spot"));
        assert!(ca.settings().contains(&"cost"));
        assert_eq!(
            PolicyConfig::named("consistent_hash").unwrap().settings(),
            ["virtual_nodes", "load_factor"]
        );
        assert!(
            PolicyConfig::named("round_robin")
                .unwrap()
                .settings()
                .is_empty()
        );
        assert!(PolicyConfig::named("fastest").is_none());
    }

    /// `all()` and `NAMES` are hand-written lists; serde's own list of
    /// variants (in its unknown-variant message) keeps them complete.
    #[test]
    fn all_lists_every_policy_serde_knows() {
        let err = serde_json::from_str::<PolicyConfig>(r#"{"policy":"?"}"#)
            .unwrap_err()
            .to_string();
        let expected = err.split_once("expected one of ").unwrap().1;
        let serde_names: Vec<&str> = expected
            .split(", ")
            .map(|n| n.split('`').nth(1).unwrap())
            .collect();
        assert_eq!(serde_names, PolicyConfig::NAMES);
        assert_eq!(PolicyConfig::all().map(|p| p.name()), PolicyConfig::NAMES);
        for p in PolicyConfig::all() {
            let json = format!(r#"{{"policy":"{}"}}"#, p.name());
            assert_eq!(serde_json::from_str::<PolicyConfig>(&json).unwrap(), p);
        }
    }

    #[test]
    fn a_setting_of_another_policy_names_its_policies() {
        assert_eq!(misplaced("cache_aware", "cache_threshold"), None);
        assert_eq!(misplaced("round_robin", "policy"), None);
        assert_eq!(
            misplaced("round_robin", "cache_threshold").unwrap(),
            "applies only to cache_aware; round_robin takes no settings"
        );
        assert_eq!(
            misplaced("round_robin", "max_tree_size").unwrap(),
            "applies to cache_aware and prefill_aware; round_robin takes no settings"
        );
        assert_eq!(
            misplaced("consistent_hash", "seed").unwrap(),
            "applies to random and power_of_two; consistent_hash takes \
             `virtual_nodes` and `load_factor`"
        );
    }

    #[test]
    fn an_unknown_key_gets_the_closest_real_one() {
        let msg = misplaced("cache_aware", "polcy").unwrap();
        assert!(
            msg.starts_with(
                "unknown setting (did you mean `policy`?); the keys of cache_aware are \
                 `policy`, `cache_threshold`, "
            ),
            "{msg}"
        );
        assert!(msg.ends_with(", `cost` and `correction`"), "{msg}");
        let msg = misplaced("cache_aware", "cache_treshold").unwrap();
        assert!(msg.contains("did you mean `cache_threshold`?"), "{msg}");
        let msg = misplaced("random", "virtual_node").unwrap();
        assert!(msg.contains("did you mean `virtual_nodes`?"), "{msg}");
        assert!(
            msg.ends_with("the keys of random are `policy` and `seed`"),
            "{msg}"
        );
        // Nothing close: no guess.
        let msg = misplaced("least_load", "zzz").unwrap();
        assert_eq!(
            msg,
            "unknown setting; least_load takes no settings: its only key is `policy`"
        );
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("policy", "policy"), 0);
        assert_eq!(edit_distance("polcy", "policy"), 1);
        assert_eq!(edit_distance("plocy", "policy"), 2);
        assert_eq!(edit_distance("poilcy", "policy"), 1, "a swap is one edit");
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("seed", ""), 4);
        assert_eq!(closest("sead", &["seed", "policy"]), Some("seed"));
        assert_eq!(closest("x", &["seed"]), None);
    }
}
