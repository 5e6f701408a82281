//! `examples/radixgate.yaml` claims to show every key with its default.
//! These tests hold it to that, with the key set taken from the config
//! types (their serde form), so a key added to the schema fails here until
//! the example shows it.

use super::*;
use crate::admission::Priority;
use serde_norway::Value;
use std::collections::BTreeSet;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/radixgate.yaml");

fn example_text() -> String {
    std::fs::read_to_string(EXAMPLE).unwrap()
}

/// Every key path of `value` (`server.port`, `routing.cost.window`); the
/// entries of a list share its path (`workers.url`).
fn walk(prefix: &str, value: &Value, paths: &mut BTreeSet<String>) {
    if let Some(items) = value.as_sequence() {
        for item in items {
            walk(prefix, item, paths);
        }
    }
    let Some(map) = value.as_mapping() else {
        return;
    };
    // (A comment that reads as YAML may have keys of any kind.)
    for (key, child) in map {
        let Some(key) = key.as_str() else { continue };
        let path = if prefix.is_empty() {
            key.to_owned()
        } else {
            format!("{prefix}.{key}")
        };
        walk(&path, child, paths);
        paths.insert(path);
    }
}

fn paths_of<T: serde::Serialize>(prefix: &str, value: &T) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    walk(prefix, &serde_norway::to_value(value).unwrap(), &mut paths);
    paths
}

/// The variant names serde accepts for the tag `tag` of `T`, from its own
/// unknown-variant message.
fn variants<T: serde::de::DeserializeOwned>(tag: &str) -> Vec<String> {
    let err = serde_norway::from_str::<T>(&format!("{tag}: '?'"))
        .err()
        .expect("`?` is no variant")
        .to_string();
    let expected = err.split_once("expected").expect("a list of variants").1;
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The keys the example shows commented out (`# api_key: ...`, `# seed:
/// null`, `#   - name: ...`, `# hot_spot: {rule: off}`): every key of a
/// comment that reads as a YAML mapping.
fn commented_keys(text: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for line in text.lines() {
        let Some((_, comment)) = line.split_once('#') else {
            continue;
        };
        let comment = comment.trim().trim_start_matches("- ");
        if let Ok(value @ Value::Mapping(_)) = serde_norway::from_str::<Value>(comment) {
            let mut paths = BTreeSet::new();
            walk("", &value, &mut paths);
            keys.extend(paths.iter().map(|p| last(p).to_owned()));
        }
    }
    keys
}

fn last(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

#[test]
fn the_example_file_is_valid_and_spells_out_the_defaults() {
    let example = Config::from_yaml_file(std::path::Path::new(EXAMPLE)).unwrap();
    example.validate().unwrap();
    // Apart from its two workers, the example shows exactly the defaults.
    assert_eq!(example.workers.len(), 2);
    let without_workers = Config {
        workers: Vec::new(),
        ..example
    };
    assert_eq!(without_workers, Config::default());
}

/// Every key of the schema: each one the defaults have is set in the file
/// (or, where its default is unset, shown commented out); the settings of
/// the other policies and hot-spot rules, and the fields of a worker and a
/// tenant entry, are shown at least commented out; and every policy and
/// rule is named.
#[test]
fn the_example_file_shows_every_key() {
    let text = example_text();
    let example: Value = serde_norway::from_str(&text).unwrap();
    let mut set = BTreeSet::new();
    walk("", &example, &mut set);
    let commented = commented_keys(&text);
    let shown = |path: &str| set.contains(path) || commented.contains(last(path));

    let defaults = serde_norway::to_value(Config::default()).unwrap();
    let mut missing: BTreeSet<String> = paths_of("", &Config::default())
        .into_iter()
        .filter(|path| {
            // An unset optional key is shown commented out, with an example.
            let unset = path
                .split('.')
                .try_fold(&defaults, |v, k| v.get(k))
                .is_some_and(Value::is_null);
            if unset {
                !shown(path)
            } else {
                !set.contains(path)
            }
        })
        .collect();

    // The other policies' settings, and the hot-spot rules' fields.
    let mut alternatives = BTreeSet::new();
    for name in variants::<radixgate_routing::PolicyConfig>("policy") {
        if !text.contains(&name) {
            missing.insert(format!("policy {name}"));
        }
        let policy = radixgate_routing::PolicyConfig::named(&name).unwrap();
        alternatives.extend(paths_of("routing", &policy));
    }
    for rule in variants::<radixgate_routing::HotSpotRule>("rule") {
        if !text.contains(&rule) {
            missing.insert(format!("hot_spot rule {rule}"));
        }
        let value: radixgate_routing::HotSpotRule =
            serde_norway::from_str(&format!("rule: {rule}")).unwrap();
        alternatives.extend(paths_of("routing.hot_spot", &value));
    }
    // One entry of each list, with every optional field set.
    alternatives.extend(paths_of(
        "workers",
        &WorkerSpec::new("http://w:1")
            .with_models(["m"])
            .with_api_key("k"),
    ));
    alternatives.extend(paths_of(
        "discovery.pools",
        &PoolConfig {
            selector: [("app".to_owned(), "p".to_owned())].into(),
            port: Some(1),
            port_annotation: Some("a".into()),
            model_id_from: Some(ModelIdFrom::Label("m".into())),
            models: vec!["m".into()],
            role: radixgate_routing::WorkerRole::Prefill,
            bootstrap_port: Some(1),
            bootstrap_port_annotation: Some("b".into()),
        },
    ));
    alternatives.extend(paths_of(
        "tenants.keys",
        &TenantSpec {
            name: "t".into(),
            key: Some("k".into()),
            key_env: Some("K".into()),
            requests_per_minute: Some(1),
            tokens_per_minute: Some(1),
            priority: Priority::High,
        },
    ));
    missing.extend(alternatives.into_iter().filter(|path| !shown(path)));
    assert!(
        missing.is_empty(),
        "examples/radixgate.yaml does not show: {}",
        Vec::from_iter(missing).join(", ")
    );
}

#[test]
fn comments_and_variants_are_read() {
    let keys =
        commented_keys("a: 1  # b: 2\n# - c: {d: e}\n# prose, not a key: as here\n# rule: off\n");
    for k in ["b", "c", "d", "rule"] {
        assert!(keys.contains(k), "{k} in {keys:?}");
    }
    assert!(!keys.contains("a"));
    assert_eq!(
        variants::<radixgate_routing::HotSpotRule>("rule"),
        ["off", "relative_cap", "predicted_ttft"]
    );
}
