//! Support for the packaging tests: the manifests read and checked
//! against their `k8s-openapi` types, the router's view of them (its
//! config and arguments, through its own parser and loader), the chart
//! rendered by Helm's engine (`deploy/render.py`), and the router process
//! started as the Deployment starts it.

#![allow(dead_code, unreachable_pub)]

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::core::v1::{ConfigMap, Container, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use radixgate::config::{Config, ServeArgs};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn committed() -> String {
    std::fs::read_to_string(repo().join("deploy/manifests/radixgate.yaml")).unwrap()
}

/// The documents of a manifest stream, each checked against its type.
pub struct Manifests(pub Vec<Value>);

impl Manifests {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut docs = Vec::new();
        for (i, part) in text.split("\n---\n").enumerate() {
            let doc: Value =
                serde_norway::from_str(part).map_err(|e| format!("document {i}: not YAML: {e}"))?;
            if doc.is_null() {
                continue; // comments only
            }
            check_schema(&doc).map_err(|e| format!("document {i}: {e}"))?;
            docs.push(doc);
        }
        Ok(Self(docs))
    }

    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.0.iter().filter(|d| d["kind"] == kind).collect()
    }

    /// The one object of `kind`, typed.
    pub fn one<T: DeserializeOwned>(&self, kind: &str) -> T {
        let all = self.all(kind);
        assert_eq!(all.len(), 1, "want one {kind}, have {}", all.len());
        serde_json::from_value(all[0].clone()).unwrap()
    }
}

/// `doc` read into the `k8s-openapi` type of its kind and written back
/// unchanged; an unknown kind is an error.
pub fn check_schema(doc: &Value) -> Result<(), String> {
    match doc["kind"].as_str().unwrap_or("") {
        "Deployment" => round_trip::<Deployment>(doc),
        "Service" => round_trip::<Service>(doc),
        "ServiceAccount" => round_trip::<ServiceAccount>(doc),
        "ConfigMap" => round_trip::<ConfigMap>(doc),
        "Role" => round_trip::<Role>(doc),
        "RoleBinding" => round_trip::<RoleBinding>(doc),
        "ClusterRole" => round_trip::<ClusterRole>(doc),
        "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(doc),
        "PodDisruptionBudget" => round_trip::<PodDisruptionBudget>(doc),
        "ServiceMonitor" => service_monitor(doc),
        other => Err(format!("kind `{other}` has no type to check it against")),
    }
}

pub fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).unwrap();
    match first_difference(doc, &back, String::new()) {
        None => Ok(()),
        Some(path) => Err(format!("`{path}` is not what the schema reads back")),
    }
}

/// Where `a` and `b` first differ, as a dotted path.
pub fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.keys()
                .chain(y.keys())
                .find_map(|k| match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => first_difference(p, q, format!("{at}.{k}")),
                    _ => Some(format!("{at}.{k}")),
                })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, format!("{at}[{i}]"))),
        _ => (a != b).then_some(at),
    }
}

/// The Prometheus Operator's type is not in `k8s-openapi`: its few fields
/// are checked by hand.
pub fn service_monitor(doc: &Value) -> Result<(), String> {
    let known = ["apiVersion", "kind", "metadata", "spec"];
    let spec = ["selector", "endpoints"];
    let endpoint = ["port", "path", "interval", "authorization"];
    let only = |v: &Value, keys: &[&str]| {
        v.as_object()
            .is_some_and(|o| o.keys().all(|k| keys.contains(&k.as_str())))
    };
    if doc["apiVersion"] != "monitoring.coreos.com/v1"
        || !only(doc, &known)
        || !only(&doc["spec"], &spec)
        || !doc["spec"]["endpoints"]
            .as_array()
            .is_some_and(|e| e.iter().all(|e| only(e, &endpoint)))
    {
        return Err(format!("not a ServiceMonitor this test knows: {doc}"));
    }
    Ok(())
}

pub fn container(deployment: &Deployment) -> Container {
    let pod = deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    assert_eq!(pod.containers.len(), 1);
    pod.containers[0].clone()
}

/// `radixgate serve`'s own flags, as the binary parses them.
#[derive(Parser)]
pub struct Serve {
    #[command(flatten)]
    pub args: ServeArgs,
}

/// What the Deployment's container runs: the ConfigMap's file written out,
/// and its arguments with `--config` pointed there; checks that the path
/// is where the volume puts that file.
pub fn router_args(m: &Manifests, dir: &Path) -> Vec<String> {
    let deployment: Deployment = m.one("Deployment");
    let config_map: ConfigMap = m.one("ConfigMap");
    let c = container(&deployment);
    assert!(
        c.command.is_none(),
        "the image's ENTRYPOINT is the binary; arguments go to it"
    );
    let args = c.args.clone().unwrap();
    assert_eq!(args[0], "serve", "{args:?}");
    let at = args.iter().position(|a| a == "--config").expect("--config");
    let path = Path::new(&args[at + 1]);
    let mount = c
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|v| path.starts_with(&v.mount_path))
        .expect("--config lies in a mounted volume");
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let volume = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(
        volume.config_map.unwrap().name,
        config_map.metadata.name.unwrap(),
        "the volume is the ConfigMap"
    );
    let key = path
        .strip_prefix(&mount.mount_path)
        .unwrap()
        .to_str()
        .unwrap();
    let text = &config_map.data.unwrap()[key];
    let file = dir.join(key);
    std::fs::write(&file, text).unwrap();
    let mut args = args;
    args[at + 1] = file.to_str().unwrap().to_owned();
    args
}

/// The config the router builds from the Deployment's arguments, through
/// the real flag parser and loader (file, flags, validation).
pub fn router_config(m: &Manifests) -> Config {
    let dir = temp_dir("config");
    let args = router_args(m, &dir);
    // `serve` stands where clap expects the program's name.
    let parsed = Serve::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let config = parsed.args.load().unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_dir_all(dir).unwrap();
    config
}

/// A fresh directory of its own (tests run in parallel in one process).
pub fn temp_dir(tag: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "radixgate-packaging-{tag}-{}-{n}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The chart rendered by Helm's engine with `values` over its defaults,
/// for release `radixgate` in namespace `default`; `Err` is Helm's message.
pub fn render(values: Value) -> Result<String, String> {
    render_in(values, "default")
}

/// [`render`], the release being in `namespace`.
pub fn render_in(values: Value, namespace: &str) -> Result<String, String> {
    let out = Command::new("python3")
        .arg(repo().join("deploy/render.py"))
        .args(["--set-json", &values.to_string()])
        .args(["--namespace", namespace])
        .output()
        .expect("python3 runs deploy/render.py");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'helm_python'"),
        "deploy/render.py needs Helm's SDK: pip install helm-python-sdk==0.2.2 (.ci/run installs it)"
    );
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(stderr.into_owned())
    }
}

/// The chart's NOTES.txt rendered with `values` over its defaults.
pub fn notes(values: Value) -> String {
    let out = Command::new("python3")
        .arg(repo().join("deploy/render.py"))
        .args(["--set-json", &values.to_string(), "--notes"])
        .output()
        .expect("python3 runs deploy/render.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn rendered(values: Value) -> Manifests {
    let text = render(values.clone()).unwrap_or_else(|e| panic!("{values}: {e}"));
    Manifests::parse(&text).unwrap_or_else(|e| panic!("{values}: {e}"))
}

/// The RBAC objects grant get, list and watch on pods in `namespace` (or
/// everywhere) to the Deployment's service account.
pub fn assert_pods_readable(m: &Manifests, namespace: Option<&str>) {
    let deployment: Deployment = m.one("Deployment");
    let account = deployment
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .service_account_name
        .unwrap();
    let accounts: Vec<ServiceAccount> = m
        .all("ServiceAccount")
        .into_iter()
        .map(|a| serde_json::from_value(a.clone()).unwrap())
        .collect();
    assert!(
        accounts
            .iter()
            .any(|a| a.metadata.name.as_deref() == Some(&account))
    );
    let (rules, role_name, role_ns, binding) = match namespace {
        Some(_) => {
            let role: Role = m.one("Role");
            let binding: RoleBinding = m.one("RoleBinding");
            assert_eq!(binding.metadata.namespace, role.metadata.namespace);
            assert_eq!(binding.role_ref.kind, "Role");
            (
                role.rules.unwrap(),
                role.metadata.name.unwrap(),
                role.metadata.namespace,
                (binding.role_ref, binding.subjects.unwrap()),
            )
        }
        None => {
            assert!(m.all("Role").is_empty() && m.all("RoleBinding").is_empty());
            let role: ClusterRole = m.one("ClusterRole");
            let binding: ClusterRoleBinding = m.one("ClusterRoleBinding");
            assert_eq!(binding.role_ref.kind, "ClusterRole");
            (
                role.rules.unwrap(),
                role.metadata.name.unwrap(),
                None,
                (binding.role_ref, binding.subjects.unwrap()),
            )
        }
    };
    assert_eq!(
        role_ns.as_deref(),
        namespace,
        "the Role is where the pods are watched"
    );
    let (role_ref, subjects) = binding;
    assert_eq!(role_ref.name, role_name);
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == account
            && s.namespace.as_deref() == Some("default")),
        "{subjects:?}"
    );
    let grants = |verb: &str| {
        rules.iter().any(|r| {
            r.api_groups
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g.is_empty()))
                && r.resources
                    .as_ref()
                    .is_some_and(|x| x.iter().any(|x| x == "pods"))
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    for verb in ["list", "watch"] {
        assert!(grants(verb), "no `{verb}` on pods: {rules:?}");
    }
    // Discovery lists and watches; nothing more is granted.
    for verb in ["get", "create", "update", "patch", "delete", "*"] {
        assert!(
            !grants(verb),
            "`{verb}` on pods is more than discovery needs: {rules:?}"
        );
    }
}

/// The router process, started as the Deployment starts it; its stderr
/// (JSON log lines, as the chart configures) arrives on a channel.
pub struct Router {
    pub child: std::process::Child,
    pub lines: std::sync::mpsc::Receiver<Value>,
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Router {
    /// The next log line whose message contains `text` (a hang guard of a
    /// minute, not a speed assertion).
    pub fn wait_for(&self, text: &str) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no `{text}` log line from radixgate"));
            if line["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(text))
            {
                return line;
            }
        }
    }
}
