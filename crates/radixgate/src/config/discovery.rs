//! The `discovery:` section: which Kubernetes pods are workers, and how to
//! reach them.
//!
//! Names follow smg's (`--service-discovery`, `--selector`,
//! `--service-discovery-namespace`, `--service-discovery-port`), so an smg
//! command line ports over. One label selector is one *pool*: the
//! top-level `selector` with the top-level settings, plus any entries of
//! `pools`, each with its own selector and, where it sets them, its own
//! port and model. Every pool is its own watch, with its selector pushed to
//! the API server.
//!
//! In a disaggregated pool (`pd:`), each pool has a `role`: its pods are
//! prefill or decode workers (smg's `--prefill-selector` and
//! `--decode-selector` make one pool of each). A prefill pod's bootstrap
//! port is read from its annotation (`bootstrap_port_annotation`, smg's
//! default `sglang.ai/bootstrap-port`), else it is the pool's
//! `bootstrap_port`, else none (JSON null to decode).

use super::{ConfigError, invalid};
use radixgate_routing::WorkerRole;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Pod discovery from the Kubernetes API server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// Watch the API server for worker pods (`--service-discovery`).
    pub enabled: bool,
    /// Namespace to watch; none = every namespace the router may list
    /// (`--service-discovery-namespace`).
    pub namespace: Option<String>,
    /// Labels a worker pod must all carry (`--selector app=sglang ...`).
    pub selector: BTreeMap<String, String>,
    /// Port the workers listen on (`--service-discovery-port`); smg's
    /// default, 80.
    pub port: u16,
    /// Annotation whose value, when a pod has it, is that pod's port
    /// instead of `port` (`--service-discovery-port-annotation`).
    pub port_annotation: Option<String>,
    /// Where a pod's model comes from: `label:KEY` or `annotation:KEY`
    /// (`--model-id-from`). Unset, or a pod without it: the worker is asked
    /// (`/v1/models`), as for a worker given by URL.
    pub model_id_from: Option<ModelIdFrom>,
    /// Annotation whose value, on a prefill pool's pod, is that pod's
    /// bootstrap port (SGLang's `--disaggregation-bootstrap-port`)
    /// (`--bootstrap-port-annotation`); smg's default,
    /// `sglang.ai/bootstrap-port`. A pool may name its own.
    pub bootstrap_port_annotation: String,
    /// More selectors, each watched on its own (one per model, say, or one
    /// per role of a disaggregated pool).
    pub pools: Vec<PoolConfig>,
    /// A kubeconfig file to use instead of the usual search (in-cluster
    /// service account when in a pod, else `$KUBECONFIG` or
    /// `~/.kube/config`) (`--kubeconfig`).
    pub kubeconfig: Option<PathBuf>,
    /// How long each watch request asks the API server to stay open (its
    /// `timeoutSeconds`; kube-runtime's 290). An answer that stays silent
    /// longer than this and a margin is given up on and retried. Not part
    /// of the file schema: tests shorten it.
    #[serde(skip)]
    pub watch_timeout_secs: u32,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            namespace: None,
            selector: BTreeMap::new(),
            port: 80,
            port_annotation: None,
            model_id_from: None,
            bootstrap_port_annotation: DEFAULT_BOOTSTRAP_PORT_ANNOTATION.to_owned(),
            pools: Vec::new(),
            kubeconfig: None,
            watch_timeout_secs: DEFAULT_WATCH_TIMEOUT_SECS,
        }
    }
}

/// kube-runtime's watch timeout: the API server ends a watch after this
/// many seconds, and the watch resumes from where it was.
pub(crate) const DEFAULT_WATCH_TIMEOUT_SECS: u32 = 290;

/// smg's annotation for a prefill pod's bootstrap port.
pub const DEFAULT_BOOTSTRAP_PORT_ANNOTATION: &str = "sglang.ai/bootstrap-port";

/// One more selector under `discovery.pools`; unset settings are the
/// section's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PoolConfig {
    /// Labels a pod of this pool must all carry (not empty).
    pub selector: BTreeMap<String, String>,
    /// The pool's port.
    pub port: Option<u16>,
    /// The pool's port annotation.
    pub port_annotation: Option<String>,
    /// Where the pool's model comes from.
    pub model_id_from: Option<ModelIdFrom>,
    /// The models this pool's workers serve, when no pod says (neither
    /// asked from the worker nor read from the pod).
    pub models: Vec<String>,
    /// What its pods do: `regular`, or in a disaggregated pool (`pd:`)
    /// `prefill` or `decode`.
    #[serde(skip_serializing_if = "WorkerRole::is_regular")]
    pub role: WorkerRole,
    /// A prefill pool's bootstrap port, for pods without the annotation.
    pub bootstrap_port: Option<u16>,
    /// A prefill pool's bootstrap port annotation, instead of the
    /// section's.
    pub bootstrap_port_annotation: Option<String>,
}

/// A pool with every setting resolved: what one watch needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Its label selector, as the API server takes it (`a=b,c=d`).
    pub selector: String,
    /// What its watch is called in `/readiness`, the metrics and the logs:
    /// its selector, followed by its port (and port annotation) where
    /// another pool watches the same selector on another port.
    pub name: String,
    /// Namespace, or all.
    pub namespace: Option<String>,
    /// Port, unless the pod's annotation says otherwise.
    pub port: u16,
    /// The port annotation.
    pub port_annotation: Option<String>,
    /// Where the model comes from.
    pub model_id_from: Option<ModelIdFrom>,
    /// Models when the pod names none.
    pub models: Vec<String>,
    /// The role of its pods' workers.
    pub role: WorkerRole,
    /// A prefill pool's bootstrap port, unless the pod's annotation says
    /// otherwise.
    pub bootstrap_port: Option<u16>,
    /// A prefill pool's bootstrap port annotation (none for other roles).
    pub bootstrap_port_annotation: Option<String>,
}

/// Where a pod's model id is read from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum ModelIdFrom {
    /// `label:KEY`.
    Label(String),
    /// `annotation:KEY`.
    Annotation(String),
}

impl FromStr for ModelIdFrom {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            Some(("label", key)) if !key.is_empty() => Ok(Self::Label(key.to_owned())),
            Some(("annotation", key)) if !key.is_empty() => Ok(Self::Annotation(key.to_owned())),
            _ => Err(format!("`{text}` is not `label:KEY` or `annotation:KEY`")),
        }
    }
}

impl TryFrom<String> for ModelIdFrom {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl From<ModelIdFrom> for String {
    fn from(from: ModelIdFrom) -> Self {
        from.to_string()
    }
}

impl fmt::Display for ModelIdFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Label(key) => write!(f, "label:{key}"),
            Self::Annotation(key) => write!(f, "annotation:{key}"),
        }
    }
}

/// `k=v` (or `k==v`) as given to `flag` (`--selector`,
/// `--prefill-selector`, ...), whose setting is `key`. A selector here is
/// labels a pod must all carry: Kubernetes' other terms (`k!=v`, `k in
/// (..)`, `k notin (..)`, `k`, `!k`) are refused as such, not read as a
/// strange key (`k!`) whose error would not say why.
pub(crate) fn parse_label(
    key: &'static str,
    flag: &str,
    text: &str,
) -> Result<(String, String), ConfigError> {
    let pair = text.split_once('=').and_then(|(name, value)| {
        let value = value.strip_prefix('=').unwrap_or(value);
        let set_based = |t: &str| t.contains(['!', '(', ')', ' ']);
        (!name.is_empty() && !set_based(name)).then(|| (name.to_owned(), value.to_owned()))
    });
    pair.ok_or_else(|| {
        invalid(
            key,
            format!(
                "{flag} `{text}`: only `key=value` terms are taken (labels a pod must \
                 all carry); `key!=value`, `key in (..)`, `key notin (..)`, `key` and \
                 `!key` are not"
            ),
        )
    })
}

impl DiscoveryConfig {
    /// Every pool to watch: the top-level selector's (when set), then
    /// `pools`, with the section's settings filled in.
    pub fn resolved_pools(&self) -> Vec<Pool> {
        let top = (!self.selector.is_empty()).then(|| PoolConfig {
            selector: self.selector.clone(),
            ..PoolConfig::default()
        });
        let mut pools = top
            .iter()
            .chain(&self.pools)
            .map(|pool| Pool {
                selector: selector_text(&pool.selector),
                name: selector_text(&pool.selector),
                namespace: self.namespace.clone(),
                port: pool.port.unwrap_or(self.port),
                port_annotation: pool
                    .port_annotation
                    .clone()
                    .or_else(|| self.port_annotation.clone()),
                model_id_from: pool
                    .model_id_from
                    .clone()
                    .or_else(|| self.model_id_from.clone()),
                models: pool.models.clone(),
                role: pool.role,
                bootstrap_port: pool.bootstrap_port,
                bootstrap_port_annotation: (pool.role == WorkerRole::Prefill).then(|| {
                    pool.bootstrap_port_annotation
                        .clone()
                        .unwrap_or_else(|| self.bootstrap_port_annotation.clone())
                }),
            })
            .collect::<Vec<_>>();
        // Pools of one selector (pods serving on two ports) are told apart
        // by their ports.
        let shared: Vec<bool> = pools
            .iter()
            .map(|p| pools.iter().filter(|q| q.selector == p.selector).count() > 1)
            .collect();
        for (pool, shared) in pools.iter_mut().zip(shared) {
            if shared {
                pool.name = match &pool.port_annotation {
                    Some(a) => format!("{} port {} or {a}", pool.selector, pool.port),
                    None => format!("{} port {}", pool.selector, pool.port),
                };
            }
        }
        pools
    }

    /// The section's own checks (see [`super::Config::validate`]).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if !cfg!(feature = "kubernetes") {
            return Err(invalid(
                "discovery.enabled",
                "this radixgate was built without Kubernetes support \
                 (cargo feature `kubernetes`)",
            ));
        }
        if self.resolved_pools().is_empty() {
            return Err(invalid(
                "discovery.selector",
                "discovery needs a label selector (--selector app=sglang) \
                 or at least one entry under discovery.pools",
            ));
        }
        if self.port == 0 {
            return Err(invalid("discovery.port", "must be between 1 and 65535"));
        }
        // Two watches of one selector and port would each offer every pod
        // at the same URLs, and the second pool's would all be refused as
        // duplicates. (On other ports, they are pods serving twice.)
        let pools = self.resolved_pools();
        for (i, pool) in pools.iter().enumerate() {
            let same = |p: &Pool| {
                p.selector == pool.selector
                    && p.port == pool.port
                    && p.port_annotation == pool.port_annotation
            };
            if let Some(first) = pools[..i].iter().position(same) {
                let (which, before) = match self.selector.is_empty() {
                    true => (i, format!("entry {first}")),
                    // The top-level selector comes first.
                    false if first == 0 => (i - 1, "discovery.selector".to_owned()),
                    false => (i - 1, format!("entry {}", first - 1)),
                };
                return Err(invalid(
                    "discovery.pools",
                    format!(
                        "entry {which} has the selector and port of {before} (`{}`, {}): each \
                         pool's pods need labels or a port of their own",
                        pool.selector, pool.port
                    ),
                ));
            }
        }
        for (i, pool) in self.pools.iter().enumerate() {
            if pool.selector.is_empty() {
                return Err(invalid(
                    "discovery.pools",
                    format!("entry {i} has an empty selector: it would take every pod"),
                ));
            }
            if pool.port == Some(0) {
                return Err(invalid(
                    "discovery.pools",
                    format!("entry {i}: port must be between 1 and 65535"),
                ));
            }
            // The registry's rule for a worker's models, checked here where
            // the refusal reaches the operator: its pods would otherwise
            // pass their probes and stay pending for good.
            if let Err(why) = radixgate_routing::check_models(&pool.models) {
                return Err(invalid("discovery.pools", format!("entry {i}: {why}")));
            }
            let bootstrap =
                pool.bootstrap_port.is_some() || pool.bootstrap_port_annotation.is_some();
            if bootstrap && pool.role != WorkerRole::Prefill {
                return Err(invalid(
                    "discovery.pools",
                    format!(
                        "entry {i} ({}): bootstrap_port and bootstrap_port_annotation are a \
                         prefill pool's settings (`role: prefill`)",
                        selector_text(&pool.selector)
                    ),
                ));
            }
            if pool.bootstrap_port == Some(0) {
                return Err(invalid(
                    "discovery.pools",
                    format!("entry {i}: bootstrap_port must be between 1 and 65535"),
                ));
            }
            if pool.bootstrap_port_annotation.as_deref() == Some("") {
                return Err(invalid(
                    "discovery.pools",
                    format!("entry {i}: bootstrap_port_annotation must not be empty"),
                ));
            }
        }
        if self.bootstrap_port_annotation.is_empty() {
            return Err(invalid(
                "discovery.bootstrap_port_annotation",
                format!("must not be empty (smg's is {DEFAULT_BOOTSTRAP_PORT_ANNOTATION})"),
            ));
        }
        if let Some(ns) = &self.namespace
            && (ns.len() > 63 || !dns_label(ns))
        {
            // The API server refuses it on every list.
            return Err(invalid(
                "discovery.namespace",
                format!(
                    "`{ns}` is not a namespace name: 1-63 lower-case letters, digits \
                     and `-`, beginning and ending with a letter or digit"
                ),
            ));
        }
        let labels = self
            .pools
            .iter()
            .flat_map(|p| &p.selector)
            .chain(&self.selector);
        for (key, value) in labels {
            if let Some(why) = label_problem(key, value) {
                // Refused here: the API server refuses the selector on
                // every list, and the watch would retry it for ever.
                return Err(invalid(
                    "discovery.selector",
                    format!("`{key}={value}` is not a label a selector can match: {why}"),
                ));
            }
        }
        Ok(())
    }
}

/// Whether `text` is one DNS label as Kubernetes names take it (length
/// aside): lower-case letters, digits and `-`, not empty, beginning and
/// ending with a letter or digit. A namespace is one; a label key's
/// prefix is several, joined by `.`.
fn dns_label(text: &str) -> bool {
    !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

/// What is wrong with the label `key=value` by Kubernetes' rules for label
/// keys and values, if anything. A key is a name, optionally after a DNS
/// subdomain prefix and `/`; a name is 1-63 characters, a value 0-63, of
/// ASCII letters, digits, `-`, `_` and `.`, beginning and ending with a
/// letter or digit; a prefix is at most 253 characters of lower-case
/// letters, digits, `-` and `.`, each of its dot-separated parts beginning
/// and ending with a letter or digit.
fn label_problem(key: &str, value: &str) -> Option<String> {
    fn name_problem(what: &str, text: &str, may_be_empty: bool) -> Option<String> {
        if text.is_empty() {
            return (!may_be_empty).then(|| format!("the {what} is empty"));
        }
        if text.len() > 63 {
            return Some(format!("the {what} is over 63 characters"));
        }
        let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        if !text.chars().all(inner) || !ends(text.chars().next()) || !ends(text.chars().last()) {
            return Some(format!(
                "the {what} `{text}` must be letters, digits, `-`, `_` and `.`, beginning \
                 and ending with a letter or digit"
            ));
        }
        None
    }
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.len() > 253 || !prefix.split('.').all(dns_label))
    {
        return Some(format!(
            "the key's prefix `{prefix}` must be a DNS subdomain (lower-case letters, \
             digits, `-` and `.`, at most 253 characters)"
        ));
    }
    name_problem("key's name", name, false).or_else(|| name_problem("value", value, true))
}

/// `a=b,c=d`, in key order.
pub(crate) fn selector_text(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_namespaces_are_checked_by_kubernetes_rules() {
        for (key, value) in [
            ("app", "sglang"),
            ("sglang.ai/role", "prefill"),
            ("App_Name", "v1.2-rc_3"),
            ("example.com/app", ""),
            ("a", &"v".repeat(63)),
        ] {
            assert_eq!(label_problem(key, value), None, "{key}={value}");
        }
        for (key, value, why) in [
            ("app", "sgl ang", "the value `sgl ang`"),
            ("app", "-x", "the value `-x`"),
            ("app", "x.", "the value `x.`"),
            ("app", &"v".repeat(64), "the value is over 63"),
            ("", "x", "the key's name is empty"),
            ("Example.com/app", "x", "prefix `Example.com`"),
            ("example..com/app", "x", "prefix `example..com`"),
            ("example.com/", "x", "the key's name is empty"),
            ("a/b/c", "x", "the key's name `b/c`"),
            ("app", "a,b", "the value `a,b`"),
            ("app!", "x", "the key's name `app!`"),
        ] {
            let problem = label_problem(key, value).unwrap_or_default();
            assert!(problem.contains(why), "{key}={value}: {problem}");
        }
        let mut c = DiscoveryConfig {
            enabled: true,
            ..DiscoveryConfig::default()
        };
        c.selector.insert("app".into(), "my app".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("discovery.selector") && e.contains("`app=my app`"),
            "{e}"
        );
        c.selector.insert("app".into(), "sglang".into());
        for ns in ["inference", "team-1"] {
            c.namespace = Some(ns.into());
            assert!(c.validate().is_ok(), "{ns}");
        }
        for ns in ["Inference", "team_1", "-x", "", "a.b"] {
            c.namespace = Some(ns.into());
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("discovery.namespace"), "{ns}: {e}");
        }
    }

    /// Two pools of one selector (label order aside) are refused, naming
    /// both; a pool may share labels with another as long as it has more.
    #[test]
    fn two_pools_of_one_selector_are_refused() {
        let parse = |yaml: &str| -> DiscoveryConfig { serde_norway::from_str(yaml).unwrap() };
        let e = parse(
            "enabled: true\npools:\n  - selector: {app: a, tier: gpu}\n    role: prefill\n\
             \n  - selector: {tier: gpu, app: a}\n    role: decode\n",
        )
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("entry 1 has the selector and port of entry 0 (`app=a,tier=gpu`, 80)"),
            "{e}"
        );
        let e = parse("enabled: true\nselector: {app: a}\npools:\n  - selector: {app: a}\n")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("entry 0 has the selector and port of discovery.selector"),
            "{e}"
        );
        parse(
            "enabled: true\nselector: {app: a}\npools:\n  - selector: {app: a, role: p}\n\
             \n  - selector: {app: b}\n",
        )
        .validate()
        .unwrap();
        // Pods serving twice (prefill on one port, decode on another): one
        // selector on two ports is two pools, each watch named apart.
        let two = parse(
            "enabled: true\npools:\n  - selector: {app: a}\n    port: 30000\n    role: prefill\n\
             \n  - selector: {app: a}\n    port: 30001\n    role: decode\n\
             \n  - selector: {app: b}\n",
        );
        two.validate().unwrap();
        let names: Vec<String> = two.resolved_pools().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["app=a port 30000", "app=a port 30001", "app=b"]);
    }

    #[test]
    fn a_selector_flag_takes_equality_terms_and_names_the_others() {
        let parse = |text| parse_label("discovery.selector", "--selector", text);
        let pair = ("app".to_owned(), "sglang".to_owned());
        assert_eq!(parse("app=sglang").ok(), Some(pair.clone()));
        // Kubernetes' other spelling of equality.
        assert_eq!(parse("app==sglang").ok(), Some(pair));
        // `tier in (gpu,cpu)` reaches here cut at its comma.
        for term in [
            "app!=canary",
            "tier in (gpu",
            "cpu)",
            "tier notin (cpu",
            "!canary",
            "app",
        ] {
            let err = parse(term).unwrap_err().to_string();
            assert!(
                err.contains(&format!("--selector `{term}`"))
                    && err.contains("only `key=value` terms"),
                "{term}: {err}"
            );
        }
    }

    #[test]
    fn model_id_from_reads_both_forms_and_refuses_others() {
        assert_eq!(
            "label:model".parse(),
            Ok(ModelIdFrom::Label("model".into()))
        );
        assert_eq!(
            "annotation:sglang.ai/model".parse(),
            Ok(ModelIdFrom::Annotation("sglang.ai/model".into()))
        );
        for bad in ["label:", "model", "env:X", ""] {
            assert!(bad.parse::<ModelIdFrom>().is_err(), "{bad}");
        }
    }

    #[test]
    fn pools_take_the_section_settings_unless_they_set_their_own() {
        let config: DiscoveryConfig = serde_norway::from_str(
            "enabled: true\nselector: {app: a, tier: gpu}\nport: 8000\n\
             model_id_from: label:model\npools:\n  - selector: {app: b}\n    port: 9000\n    models: [m]\n",
        )
        .unwrap();
        config.validate().unwrap();
        let pools = config.resolved_pools();
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[0].selector, "app=a,tier=gpu");
        assert_eq!(pools[0].port, 8000);
        assert_eq!(pools[1].selector, "app=b");
        assert_eq!(pools[1].port, 9000);
        assert_eq!(pools[1].models, ["m"]);
        assert_eq!(
            pools[1].model_id_from,
            Some(ModelIdFrom::Label("model".into()))
        );
        // A pool's models follow a worker's rule: `*` or an empty name is
        // refused here, not left to keep its pods pending for good.
        for bad in ["[\"*\"]", "[\"\"]"] {
            let config: DiscoveryConfig = serde_norway::from_str(&format!(
                "enabled: true\npools:\n  - selector: {{app: b}}\n    models: {bad}\n"
            ))
            .unwrap();
            let err = config.validate().unwrap_err().to_string();
            assert!(
                err.contains("`discovery.pools`: entry 0") && err.contains("`models`"),
                "{bad}: {err}"
            );
        }
        // Not in the file: kube-runtime's, whatever it says.
        assert_eq!(config.watch_timeout_secs, 290);
        assert!(serde_norway::from_str::<DiscoveryConfig>("watch_timeout_secs: 5\n").is_err());
    }

    #[test]
    fn enabled_without_a_selector_is_refused() {
        let config = DiscoveryConfig {
            enabled: true,
            ..DiscoveryConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("label selector"), "{err}");
        let err = serde_norway::from_str::<DiscoveryConfig>("model_id_from: env:X\n").unwrap_err();
        assert!(err.to_string().contains("label:KEY"), "{err}");
    }
}
