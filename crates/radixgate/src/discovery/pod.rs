//! What one pod object says about one worker: pure functions of the object
//! and the pool's settings, so every rule is tested without an API server.
//!
//! A pod is a worker when it is `Running`, its `Ready` condition is
//! `True`, it has a pod IP and it is not terminating (no
//! `deletionTimestamp`). One whose phase is `Failed` or `Succeeded` is
//! finished: its containers are done for good (evicted, say), though its
//! object, IP and all, may stay until someone deletes it. Its URL is
//! `http://<pod IP>:<port>`, the port being the pool's, or the pod's port
//! annotation when the pool names one and the pod has it, spelled as the
//! control task spells URLs (`:80` unwritten), which is how it tells this
//! watch of a URL it let go of. A prefill pool's pod has a bootstrap port:
//! its bootstrap port annotation's value, else the pool's. A value that cannot
//! be right (a port or bootstrap port annotation that is not a port, an IP
//! that is not an address) makes the object malformed: it is reported,
//! never guessed around.

use super::object::RawPod;
use crate::config::{ModelIdFrom, Pool};
use k8s_openapi::api::core::v1::Pod;
use radixgate_routing::WorkerUrl;
use std::net::IpAddr;

/// A pod as far as routing cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Serving: send it requests.
    Ready(Endpoint),
    /// Known but not taking requests now (not ready, not yet running, no
    /// IP); why, in a few words.
    NotReady(&'static str),
    /// Shutting down: drain it.
    Terminating,
    /// Its phase is over (`Failed`: evicted, say; `Succeeded`): it never
    /// serves again, whenever its object goes. Drain it.
    Finished,
}

/// Where a serving pod is reached and what it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `http://<ip>:<port>`, canonical ([`WorkerUrl::canonical`]: without
    /// `:80`).
    pub(crate) url: String,
    /// From the pod's label or annotation, else the pool's (may be empty:
    /// ask the worker).
    pub(crate) models: Vec<String>,
    /// A prefill pod's bootstrap port, when it has one.
    pub(crate) bootstrap_port: Option<u16>,
}

/// `namespace/name`, the key a pod is tracked by; `None` without a name.
pub(crate) fn key(pod: &RawPod) -> Option<String> {
    let name = pod.metadata.name.as_deref().filter(|n| !n.is_empty())?;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
    Some(format!("{namespace}/{name}"))
}

/// Reads a pod: what it means for routing, or why the object is malformed.
pub(crate) fn read(raw: &RawPod, pool: &Pool) -> Result<Seen, String> {
    let pod: Pod = serde_json::from_value(raw.body.clone())
        .map_err(|err| format!("not a valid Pod object: {err}"))?;
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(Seen::Terminating);
    }
    let Some(status) = &pod.status else {
        return Ok(Seen::NotReady("no status yet"));
    };
    match status.phase.as_deref() {
        Some("Running") => {}
        Some("Failed" | "Succeeded") => return Ok(Seen::Finished),
        _ => return Ok(Seen::NotReady("not running")),
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return Ok(Seen::NotReady("not ready"));
    }
    let Some(ip) = status.pod_ip.as_deref().filter(|ip| !ip.is_empty()) else {
        return Ok(Seen::NotReady("no pod IP"));
    };
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("status.podIP `{ip}` is not an IP address"))?;
    let port = annotated_port(&pod, pool.port_annotation.as_ref())?.unwrap_or(pool.port);
    let bootstrap_port =
        annotated_port(&pod, pool.bootstrap_port_annotation.as_ref())?.or(pool.bootstrap_port);
    let url = match ip {
        IpAddr::V4(ip) => format!("http://{ip}:{port}"),
        IpAddr::V6(ip) => format!("http://[{ip}]:{port}"),
    };
    // As the control task spells it: the URLs it lets go of are matched
    // against this one.
    let url = WorkerUrl::canonical(&url).into_owned();
    Ok(Seen::Ready(Endpoint {
        url,
        models: models(&pod, pool),
        bootstrap_port,
    }))
}

/// The port in the pod's annotation `key`, if the pool names one and the
/// pod has it.
fn annotated_port(pod: &Pod, key: Option<&String>) -> Result<Option<u16>, String> {
    let annotated = key.and_then(|key| Some((key, pod.metadata.annotations.as_ref()?.get(key)?)));
    match annotated {
        None => Ok(None),
        Some((key, value)) => match value.trim().parse::<u16>() {
            Ok(port) if port > 0 => Ok(Some(port)),
            _ => Err(format!(
                "annotation {key}=`{}` is not a port (1-65535)",
                value.escape_debug()
            )),
        },
    }
}

/// The model from the pod's label or annotation, else the pool's models.
/// An empty value, or the wildcard pool's `*` (which names no model, and
/// would keep the worker out of rotation for good), counts as none.
fn models(pod: &Pod, pool: &Pool) -> Vec<String> {
    let (map, key) = match &pool.model_id_from {
        Some(ModelIdFrom::Label(key)) => (&pod.metadata.labels, key),
        Some(ModelIdFrom::Annotation(key)) => (&pod.metadata.annotations, key),
        None => return pool.models.clone(),
    };
    match map
        .as_ref()
        .and_then(|m| m.get(key))
        .filter(|m| radixgate_routing::unnameable(m).is_none())
    {
        Some(model) => vec![model.clone()],
        None => pool.models.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use radixgate_routing::WorkerRole;
    use serde_json::{Value, json};

    fn pool() -> Pool {
        Pool {
            selector: "app=sglang".into(),
            name: "app=sglang".into(),
            namespace: None,
            port: 8000,
            port_annotation: Some("radixgate/port".into()),
            model_id_from: Some(ModelIdFrom::Label("model".into())),
            models: Vec::new(),
            role: WorkerRole::Regular,
            bootstrap_port: None,
            bootstrap_port_annotation: None,
        }
    }

    fn pod(patch: impl FnOnce(&mut Value)) -> RawPod {
        let mut body = json!({
            "metadata": {"name": "w-0", "namespace": "llm", "resourceVersion": "7",
                         "labels": {"app": "sglang", "model": "llama"}},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        });
        patch(&mut body);
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn a_running_ready_pod_with_an_ip_is_a_worker() {
        let p = pod(|_| {});
        assert_eq!(key(&p).as_deref(), Some("llm/w-0"));
        assert_eq!(
            read(&p, &pool()),
            Ok(Seen::Ready(Endpoint {
                url: "http://10.0.0.5:8000".into(),
                models: vec!["llama".into()],
                bootstrap_port: None,
            }))
        );
        let v6 = pod(|b| b["status"]["podIP"] = json!("fd00::5"));
        assert!(
            matches!(read(&v6, &pool()), Ok(Seen::Ready(e)) if e.url == "http://[fd00::5]:8000")
        );
        let on_80 = Pool { port: 80, ..pool() };
        assert!(matches!(read(&v6, &on_80), Ok(Seen::Ready(e)) if e.url == "http://[fd00::5]"));
    }

    #[test]
    fn anything_short_of_serving_is_not_ready_and_deletion_wins() {
        for (patch, why) in [
            (json!({"phase": "Pending"}), "not running"),
            (
                json!({"conditions": [{"type": "Ready", "status": "False"}]}),
                "not ready",
            ),
            (json!({"conditions": []}), "not ready"),
            (json!({"podIP": null}), "no pod IP"),
        ] {
            let p = pod(|b| {
                for (k, v) in patch.as_object().unwrap() {
                    b["status"][k] = v.clone();
                }
            });
            assert_eq!(read(&p, &pool()), Ok(Seen::NotReady(why)), "{patch}");
        }
        let gone = pod(|b| b["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z"));
        assert_eq!(read(&gone, &pool()), Ok(Seen::Terminating));
        let bare = pod(|b| {
            b.as_object_mut()
                .unwrap()
                .remove("status")
                .map(drop)
                .unwrap()
        });
        assert_eq!(read(&bare, &pool()), Ok(Seen::NotReady("no status yet")));
    }

    #[test]
    fn a_pod_whose_containers_are_done_for_good_is_finished() {
        // Evicted (the object stays, its IP in it), or run to its end.
        for phase in ["Failed", "Succeeded"] {
            let p = pod(|b| {
                b["status"]["phase"] = json!(phase);
                b["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
            });
            assert_eq!(read(&p, &pool()), Ok(Seen::Finished), "{phase}");
        }
        // Not known to be over: a node out of touch may come back.
        let p = pod(|b| b["status"]["phase"] = json!("Unknown"));
        assert_eq!(read(&p, &pool()), Ok(Seen::NotReady("not running")));
    }

    #[test]
    fn the_port_annotation_and_the_model_source_are_read() {
        let p = pod(|b| b["metadata"]["annotations"] = json!({"radixgate/port": "31000"}));
        assert!(
            matches!(read(&p, &pool()), Ok(Seen::Ready(e)) if e.url == "http://10.0.0.5:31000")
        );
        let by_annotation = Pool {
            model_id_from: Some(ModelIdFrom::Annotation("m".into())),
            models: vec!["fallback".into()],
            ..pool()
        };
        let p = pod(|b| b["metadata"]["annotations"] = json!({"m": "qwen"}));
        assert!(matches!(read(&p, &by_annotation), Ok(Seen::Ready(e)) if e.models == ["qwen"]));
        let p = pod(|_| {});
        assert!(matches!(read(&p, &by_annotation), Ok(Seen::Ready(e)) if e.models == ["fallback"]));
        // `*` names no model: the pool's, not a worker the registry refuses.
        let p = pod(|b| b["metadata"]["annotations"] = json!({"m": "*"}));
        assert!(matches!(read(&p, &by_annotation), Ok(Seen::Ready(e)) if e.models == ["fallback"]));
    }

    #[test]
    fn a_prefill_pod_has_its_annotated_bootstrap_port_else_the_pool_s() {
        let prefill = Pool {
            role: WorkerRole::Prefill,
            bootstrap_port: Some(8998),
            bootstrap_port_annotation: Some("sglang.ai/bootstrap-port".into()),
            ..pool()
        };
        let bootstrap = |p: &RawPod, pool: &Pool| match read(p, pool) {
            Ok(Seen::Ready(e)) => Ok(e.bootstrap_port),
            other => Err(format!("{other:?}")),
        };
        let annotated =
            pod(|b| b["metadata"]["annotations"] = json!({"sglang.ai/bootstrap-port": " 9100 "}));
        assert_eq!(bootstrap(&annotated, &prefill), Ok(Some(9100)));
        assert_eq!(bootstrap(&pod(|_| {}), &prefill), Ok(Some(8998)));
        let no_fixed = Pool {
            bootstrap_port: None,
            ..prefill.clone()
        };
        assert_eq!(bootstrap(&pod(|_| {}), &no_fixed), Ok(None));
        // A pool without the annotation (decode, regular) never reads it.
        assert_eq!(bootstrap(&annotated, &pool()), Ok(None));
        for bad in ["0", "65536", "port", ""] {
            let p =
                pod(|b| b["metadata"]["annotations"] = json!({"sglang.ai/bootstrap-port": bad}));
            let err = read(&p, &prefill).unwrap_err();
            assert!(
                err.contains(&format!(
                    "annotation sglang.ai/bootstrap-port=`{bad}` is not a port"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn malformed_objects_say_what_is_wrong() {
        let p = pod(|b| b["metadata"]["annotations"] = json!({"radixgate/port": "http"}));
        assert!(read(&p, &pool()).unwrap_err().contains("radixgate/port"));
        let p = pod(|b| b["status"]["podIP"] = json!("10.0.0.999"));
        assert!(read(&p, &pool()).unwrap_err().contains("10.0.0.999"));
        let p = pod(|b| b["status"] = json!("running"));
        assert!(read(&p, &pool()).unwrap_err().contains("not a valid Pod"));
        let p = pod(|b| b["metadata"]["name"] = json!(5));
        assert_eq!(key(&p), None);
    }
}
