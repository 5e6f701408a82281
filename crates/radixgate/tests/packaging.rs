//! The packaging, held to the code it deploys: the Dockerfile, the Helm
//! chart (`deploy/helm/radixgate`) and the plain manifests rendered from it
//! (`deploy/manifests/radixgate.yaml`).
//!
//! - Every document of the manifests is read into its `k8s-openapi` type
//!   and written back: a field the type does not know (a typo) is lost on
//!   the way and fails the test, and so does a kind it has no type for.
//! - The ConfigMap's `radixgate.yaml` and the Deployment's arguments go
//!   through radixgate's own flag parser and config loader, and then run
//!   the real binary against the fake API server (`k8s/mod.rs`): it finds a
//!   worker pod by the chart's selector, turns ready, serves, and on SIGTERM
//!   drops readiness while it still accepts.
//! - The probes, Service, scrape annotations, RBAC and shutdown timing are
//!   checked against that config.
//! - The chart is linted and rendered by Helm's own engine
//!   (`deploy/render.py`, through the helm-python-sdk package that
//!   `.ci/run` installs); the committed manifests must equal its output,
//!   and other values must give the objects they promise. Without the
//!   package those tests fail: they never skip.

mod common;
mod k8s;
mod manifests;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use manifests::*;
use radixgate_routing::WorkerRole;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn every_manifest_is_read_and_written_back_by_its_kubernetes_type() {
    let m = Manifests::parse(&committed()).unwrap_or_else(|e| panic!("{e}"));
    let kinds: Vec<&str> = m.0.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ConfigMap",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
            "PodDisruptionBudget"
        ]
    );
    // The check itself: a misspelt field, and an unknown kind, fail.
    let mut typo = m.all("Deployment")[0].clone();
    typo["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = json!({});
    let err = check_schema(&typo).unwrap_err();
    assert!(err.contains("readinesProbe"), "{err}");
    assert!(check_schema(&json!({"apiVersion": "v1", "kind": "Secrets"})).is_err());
}

#[test]
fn the_config_map_is_a_config_the_router_loads_with_the_deployments_flags() {
    let m = Manifests::parse(&committed()).unwrap();
    let config = router_config(&m);
    assert_eq!(
        config.server.host, "0.0.0.0",
        "a pod listens on its own address"
    );
    let d = &config.discovery;
    assert!(d.enabled);
    assert_eq!(
        d.selector.get("radixgate/worker").map(String::as_str),
        Some("true")
    );
    assert_eq!(d.namespace.as_deref(), Some("default"));
    assert_eq!(d.resolved_pools().len(), 1);
}

/// The container's port named `name`.
fn container_port(c: &k8s_openapi::api::core::v1::Container, name: &str) -> Option<i32> {
    c.ports
        .as_ref()?
        .iter()
        .find(|p| p.name.as_deref() == Some(name))
        .map(|p| p.container_port)
}

/// The probes, Prometheus' annotations and the Service's ports, as
/// `manifests` render them: the probes' and Prometheus' port is the
/// metrics port (`metrics.prometheus_port`, apart from the client port's
/// connection cap) when `management` says there is one, else the router's.
fn assert_ports(m: &Manifests, management: bool) {
    let config = router_config(m);
    let port = i32::from(config.server.port);
    let deployment: Deployment = m.one("Deployment");
    let c = container(&deployment);
    assert_eq!(
        container_port(&c, "http"),
        Some(port),
        "the container port is server.port"
    );
    let (probe_port, probe_name) = if management {
        let metrics = config.metrics.prometheus_port.expect("a metrics port");
        assert_ne!(i32::from(metrics), port);
        assert_eq!(container_port(&c, "management"), Some(i32::from(metrics)));
        (i32::from(metrics), "management")
    } else {
        assert_eq!(config.metrics.prometheus_port, None);
        assert_eq!(container_port(&c, "management"), None);
        (port, "http")
    };
    for (probe, path) in [
        (&c.liveness_probe, "/liveness"),
        (&c.readiness_probe, "/readiness"),
    ] {
        let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String(probe_name.into()));
    }
    // The clients' Service has the router's port only: what reaches it
    // never reaches the management port's small cap.
    let service: Service = m.one("Service");
    let ports = service.spec.unwrap().ports.unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(
        ports[0].target_port,
        Some(IntOrString::String("http".into()))
    );
    let annotations = deployment
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap();
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], probe_port.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
}

#[test]
fn probes_and_scrapes_use_the_metrics_port_apart_from_client_connections() {
    assert_ports(&Manifests::parse(&committed()).unwrap(), true);
    // Without one, the router's port; the same port twice is refused.
    assert_ports(&rendered(json!({"server": {"managementPort": 0}})), false);
    let err = render(json!({"server": {"managementPort": 30000}})).unwrap_err();
    assert!(
        err.contains("server.managementPort (30000) must differ"),
        "{err}"
    );
    // The port and its address are the chart's: on the pod's address, and
    // refused in `config`.
    let metrics = router_config(&Manifests::parse(&committed()).unwrap()).metrics;
    assert_eq!(metrics.prometheus_port, Some(30001));
    assert_eq!(metrics.prometheus_host.as_deref(), Some("0.0.0.0"));
    for (values, named) in [
        (
            json!({"extraArgs": ["--prometheus-host", "127.0.0.1"]}),
            "extraArgs --prometheus-host",
        ),
        (
            json!({"extraEnv": [{"name": "RADIXGATE_PROMETHEUS_PORT", "value": "1"}]}),
            "extraEnv RADIXGATE_PROMETHEUS_PORT",
        ),
    ] {
        let err = render(values).unwrap_err();
        assert!(err.contains(named), "{named}: {err}");
    }
    for own in ["prometheus_port", "prometheus_host"] {
        let err = render(json!({"config": {"metrics": {own: 1}}})).unwrap_err();
        assert!(
            err.contains("set server.managementPort instead"),
            "{own}: {err}"
        );
    }
    let m = rendered(
        json!({"server": {"managementPort": 0}, "config": {"metrics": {"prometheus_port": 9100}}}),
    );
    assert_eq!(router_config(&m).metrics.prometheus_port, Some(9100));
}

#[test]
fn rbac_lets_the_routers_account_list_and_watch_pods_and_no_more() {
    let m = Manifests::parse(&committed()).unwrap();
    let config = router_config(&m);
    assert_pods_readable(&m, config.discovery.namespace.as_deref());
}

#[test]
fn a_router_rollout_waits_for_its_longest_request() {
    let m = Manifests::parse(&committed()).unwrap();
    let server = router_config(&m).server;
    let deployment: Deployment = m.one("Deployment");
    let spec = deployment.spec.unwrap();
    let rolling = spec.strategy.unwrap().rolling_update.unwrap();
    assert_eq!(
        rolling.max_unavailable,
        Some(IntOrString::Int(0)),
        "a new router is ready before an old one stops"
    );
    let pod = spec.template.spec.unwrap();
    let c = &pod.containers[0];
    let sleep = c
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap()
        .sleep
        .as_ref()
        .unwrap()
        .seconds;
    assert!(sleep > 0);
    assert!(
        server.shutdown_delay_secs > 0,
        "readiness drops before the listener closes"
    );
    assert!(
        server.request_timeout_secs > 0,
        "the longest request is bounded"
    );
    assert!(
        server.shutdown_grace_period_secs >= server.request_timeout_secs,
        "shutdown waits for the longest request"
    );
    let grace = pod.termination_grace_period_seconds.unwrap();
    let needed = sleep
        + i64::try_from(server.shutdown_delay_secs + server.shutdown_grace_period_secs).unwrap();
    assert!(
        grace >= needed + 10,
        "terminationGracePeriodSeconds {grace} < {needed} + 10"
    );
    // Service links would set RADIXGATE_PORT=tcp://... in the pod, which
    // the router reads as --port.
    assert_eq!(pod.enable_service_links, Some(false));
}

#[test]
fn the_router_runs_unprivileged_on_a_read_only_root_as_the_image_says() {
    let m = Manifests::parse(&committed()).unwrap();
    let deployment: Deployment = m.one("Deployment");
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let p = pod.security_context.unwrap();
    assert_eq!(p.run_as_non_root, Some(true));
    let c = pod.containers[0].security_context.clone().unwrap();
    assert_eq!(c.read_only_root_filesystem, Some(true));
    assert_eq!(c.allow_privilege_escalation, Some(false));
    assert_eq!(c.capabilities.unwrap().drop, Some(vec!["ALL".to_owned()]));
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let user = format!(
        "USER {}:{}",
        p.run_as_user.unwrap(),
        p.run_as_group.unwrap()
    );
    assert!(
        dockerfile.lines().any(|l| l == user),
        "the Dockerfile says `{user}`"
    );
}

#[test]
fn selectors_pick_the_router_pods() {
    let m = Manifests::parse(&committed()).unwrap();
    let deployment: Deployment = m.one("Deployment");
    let spec = deployment.spec.unwrap();
    let labels = spec.template.metadata.unwrap().labels.unwrap();
    let picks = |selector: &BTreeMap<String, String>| {
        !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    assert!(picks(&spec.selector.match_labels.unwrap()));
    let service: Service = m.one("Service");
    assert!(picks(&service.spec.unwrap().selector.unwrap()));
    let budget: PodDisruptionBudget = m.one("PodDisruptionBudget");
    assert!(picks(
        &budget.spec.unwrap().selector.unwrap().match_labels.unwrap()
    ));
}

/// A router is unready while no worker can take its requests (the
/// workers' nodes drained first in a cluster upgrade, say). The budget's
/// default policy then refused to evict an unready router while the
/// others were unready too: with two or more replicas, `kubectl drain` of
/// a router's node waited until the workers came back, which may be never
/// while they wait for that drain. An unready router serves nothing new,
/// and an evicted one still gets its whole grace period for what it has in
/// flight, so unready routers may always be evicted.
#[test]
fn the_disruption_budget_never_holds_a_drain_on_routers_without_workers() {
    for m in [
        Manifests::parse(&committed()).unwrap(),
        rendered(json!({"replicaCount": 3, "podDisruptionBudget": {"maxUnavailable": 1}})),
    ] {
        let budget: PodDisruptionBudget = m.one("PodDisruptionBudget");
        let spec = budget.spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(
            spec.unhealthy_pod_eviction_policy.as_deref(),
            Some("AlwaysAllow")
        );
    }
    // The operator may ask for the API server's default instead.
    let m =
        rendered(json!({"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "IfHealthyBudget"}}));
    let budget: PodDisruptionBudget = m.one("PodDisruptionBudget");
    assert_eq!(
        budget
            .spec
            .unwrap()
            .unhealthy_pod_eviction_policy
            .as_deref(),
        Some("IfHealthyBudget")
    );
    let m = rendered(json!({"podDisruptionBudget": {"enabled": false}}));
    assert!(m.all("PodDisruptionBudget").is_empty());
}

#[test]
fn the_dockerfile_builds_with_the_pinned_toolchain_and_serves_the_charts_port() {
    let toolchain = std::fs::read_to_string(repo().join("rust-toolchain.toml")).unwrap();
    let channel = toolchain
        .lines()
        .find_map(|l| l.strip_prefix("channel = "))
        .unwrap()
        .trim_matches('"');
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let from: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(
        from,
        [
            format!("FROM rust:{channel}-alpine AS build").as_str(),
            "FROM scratch"
        ]
    );
    assert!(dockerfile.contains(&format!("RUSTUP_TOOLCHAIN={channel}")));
    assert!(dockerfile.contains("cargo build --release --locked -p radixgate"));
    assert!(
        dockerfile
            .lines()
            .any(|l| l == r#"ENTRYPOINT ["/radixgate"]"#)
    );
    let m = Manifests::parse(&committed()).unwrap();
    let port = router_config(&m).server.port;
    assert!(
        dockerfile.lines().any(|l| l == format!("EXPOSE {port}")),
        "EXPOSE {port}"
    );
}

#[test]
fn the_committed_manifests_are_the_chart_rendered_by_helm() {
    let fresh = render(json!({})).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        fresh == committed(),
        "deploy/manifests/radixgate.yaml differs from the chart; regenerate it:\n  \
         deploy/render.py > deploy/manifests/radixgate.yaml"
    );
}

#[test]
fn values_choose_where_pods_are_watched_and_what_is_granted() {
    let other = rendered(json!({"discovery": {"namespace": "llm"}}));
    assert_eq!(
        router_config(&other).discovery.namespace.as_deref(),
        Some("llm")
    );
    assert_pods_readable(&other, Some("llm"));

    let everywhere = rendered(json!({"discovery": {"allNamespaces": true}}));
    assert_eq!(router_config(&everywhere).discovery.namespace, None);
    assert_pods_readable(&everywhere, None);
    // Releases of one name in two namespaces claim two cluster roles.
    let in_ns = |namespace: &str| {
        let values = json!({"discovery": {"allNamespaces": true}});
        let m = Manifests::parse(&render_in(values, namespace).unwrap()).unwrap();
        let role: ClusterRole = m.one("ClusterRole");
        let binding: ClusterRoleBinding = m.one("ClusterRoleBinding");
        assert_eq!(role.metadata.name.as_ref(), Some(&binding.role_ref.name));
        (role.metadata.name.unwrap(), binding.metadata.name.unwrap())
    };
    let (a, b) = (in_ns("team-a"), in_ns("team-b"));
    assert_ne!(a.0, b.0);
    assert_ne!(a.1, b.1);

    let off =
        rendered(json!({"discovery": {"enabled": false}, "workers": ["http://10.0.0.1:8000"]}));
    let config = router_config(&off);
    assert!(!config.discovery.enabled);
    assert_eq!(config.workers.len(), 1);
    for kind in ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"] {
        assert!(off.all(kind).is_empty(), "{kind} without discovery");
    }
    let deployment: Deployment = off.one("Deployment");
    assert_eq!(
        deployment
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .automount_service_account_token,
        Some(false)
    );

    // Every discovery setting reaches the config under its own key.
    let pools = rendered(json!({"discovery": {
        "port": 30000, "portAnnotation": "example.com/port", "modelIdFrom": "label:model",
        "pools": [{"selector": {"app": "vllm-qwen"}, "port": 8000, "models": ["qwen"],
                   "modelIdFrom": "annotation:m", "portAnnotation": "example.com/qwen-port"}],
    }}));
    let d = router_config(&pools).discovery;
    assert_eq!(
        (d.port, d.port_annotation.as_deref()),
        (30000, Some("example.com/port"))
    );
    assert_eq!(d.model_id_from.as_ref().unwrap().to_string(), "label:model");
    // No selector with pools: the pools alone.
    let resolved = d.resolved_pools();
    assert_eq!(resolved.len(), 1);
    assert_eq!(resolved[0].selector, "app=vllm-qwen");
    assert_eq!(
        (resolved[0].port, resolved[0].models.as_slice()),
        (8000, ["qwen".to_owned()].as_slice())
    );
    assert_eq!(
        resolved[0].model_id_from.as_ref().unwrap().to_string(),
        "annotation:m"
    );
    assert_eq!(
        resolved[0].port_annotation.as_deref(),
        Some("example.com/qwen-port")
    );
}

#[test]
fn a_selector_in_the_values_replaces_the_default_label() {
    // Helm merges a values map into the chart's: a default label kept
    // under the operator's own selector matched none of their pods.
    let selectors = |values: Value| -> Vec<String> {
        let d = router_config(&rendered(values)).discovery;
        d.resolved_pools().into_iter().map(|p| p.selector).collect()
    };
    assert_eq!(selectors(json!({})), ["radixgate/worker=true"]);
    assert_eq!(
        selectors(json!({"discovery": {"selector": {"app": "sglang"}}})),
        ["app=sglang"]
    );
    // With pools and no selector, the pools alone are watched.
    assert_eq!(
        selectors(json!({"discovery": {"pools": [{"selector": {"app": "vllm-qwen"}}]}})),
        ["app=vllm-qwen"]
    );
    // The notes name the labels the router looks for.
    let told = notes(json!({"discovery": {"selector": {"app": "sglang"}}}));
    assert!(
        told.contains("pods labelled app=sglang in namespace"),
        "{told}"
    );
    assert!(told.contains("on port 8000."), "{told}");
    // A pod's port annotation overrides the port: the notes say so.
    let told = notes(json!({"discovery": {"portAnnotation": "example.com/port"}}));
    assert!(
        told.contains("on port 8000 (or the one a pod's example.com/port annotation names)."),
        "{told}"
    );
}

#[test]
fn a_disaggregated_pool_is_discovered_by_role_through_the_chart() {
    let pd = rendered(json!({
        "config": {"pd": {"enabled": true}},
        "discovery": {
            "selector": null,
            "bootstrapPortAnnotation": "example.com/bootstrap-port",
            "pools": [
                {"selector": {"app": "sglang", "component": "prefill"}, "role": "prefill",
                 "bootstrapPort": 8998},
                {"selector": {"app": "sglang", "component": "decode"}, "role": "decode"},
            ],
        },
    }));
    // Loaded and validated as the router does at start-up.
    let config = router_config(&pd);
    assert!(config.pd.enabled);
    let pools = config.discovery.resolved_pools();
    let seen: Vec<(&str, WorkerRole, Option<u16>, Option<&str>)> = pools
        .iter()
        .map(|p| {
            (
                p.selector.as_str(),
                p.role,
                p.bootstrap_port,
                p.bootstrap_port_annotation.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "app=sglang,component=prefill",
                WorkerRole::Prefill,
                Some(8998),
                Some("example.com/bootstrap-port")
            ),
            (
                "app=sglang,component=decode",
                WorkerRole::Decode,
                None,
                None
            ),
        ]
    );
    // Unset, the annotation is smg's default.
    let plain = router_config(&rendered(json!({})));
    assert_eq!(
        plain.discovery.bootstrap_port_annotation,
        "sglang.ai/bootstrap-port"
    );
}

#[test]
fn replicas_share_state_over_nats_when_sync_urls_are_set() {
    // Default: no sync section, so replicas would not share.
    assert!(router_config(&rendered(json!({}))).sync.urls.is_empty());

    let synced = rendered(json!({
        "replicaCount": 3,
        "sync": {
            "urls": ["nats://nats.nats.svc:4222"],
            "cluster": "prod",
            // Credential files (`auth.creds_file` under the mounted Secret)
            // are read at start-up, so none is named here.
            "settings": {"history_secs": 300},
            "secretName": "nats-creds",
        },
    }));
    let sync = router_config(&synced).sync;
    assert_eq!(sync.urls, ["nats://nats.nats.svc:4222"]);
    assert_eq!((sync.cluster.as_str(), sync.history_secs), ("prod", 300));
    let deployment: Deployment = synced.one("Deployment");
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(3));
    let pod = spec.template.spec.unwrap();
    let volume = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some("nats-creds"))
        .expect("the credentials Secret is a volume");
    let mounts = pod.containers[0].volume_mounts.clone().unwrap_or_default();
    assert!(
        mounts
            .iter()
            .any(|m| m.name == volume.name && m.mount_path == "/etc/radixgate-sync"),
        "{mounts:?}"
    );
}

#[test]
fn sync_urls_given_as_one_string_are_a_list() {
    // `--set sync.urls=nats://...` gives Helm a string, not a list: the
    // router refused the config (`expected a sequence`) and never started.
    let one = rendered(json!({"sync": {"urls": "nats://nats.nats.svc:4222"}}));
    assert_eq!(router_config(&one).sync.urls, ["nats://nats.nats.svc:4222"]);
    // `--set sync.urls=nats://a:4222\\,nats://b:4222`: a comma-separated one.
    let two = rendered(json!({"sync": {"urls": "nats://a:4222, nats://b:4222"}}));
    assert_eq!(
        router_config(&two).sync.urls,
        ["nats://a:4222", "nats://b:4222"]
    );
}

#[test]
fn a_workers_port_that_is_not_a_number_is_refused_when_rendered() {
    // A container port's name read as a number was 0: the chart rendered
    // it, and the router refused the config at every start.
    for values in [
        json!({"discovery": {"port": "http"}}),
        json!({"discovery": {"pools": [{"selector": {"app": "x"}, "port": "http"}]}}),
        json!({"discovery": {"port": 70000}}),
    ] {
        let err = render(values.clone()).unwrap_err();
        assert!(err.contains("must be a port number"), "{values}: {err}");
    }
    let pool =
        rendered(json!({"discovery": {"pools": [{"selector": {"app": "x"}, "port": "30000"}]}}));
    assert_eq!(router_config(&pool).discovery.pools[0].port, Some(30000));
}

#[test]
fn the_chart_refuses_timings_that_would_cut_requests() {
    let err = render(json!({"terminationGracePeriodSeconds": 60})).unwrap_err();
    assert!(
        err.contains("terminationGracePeriodSeconds (60) must be at least"),
        "{err}"
    );
    // The defaults' 5 + 5 + 600 s, and a second more: the router still
    // ends the streams it cuts (1 s) and flushes its spans (up to 5 s)
    // after its grace period.
    let err = render(json!({"terminationGracePeriodSeconds": 611})).unwrap_err();
    assert!(err.contains("(620)"), "{err}");
    rendered(json!({"terminationGracePeriodSeconds": 620}));
    let err = render(json!({"server": {"shutdownGracePeriodSecs": 30}})).unwrap_err();
    assert!(
        err.contains("must be at least server.requestTimeoutSecs"),
        "{err}"
    );
    let err = render(json!({"server": {"requestTimeoutSecs": 0}})).unwrap_err();
    assert!(err.contains("must not be 0"), "{err}");
    // Longer than needed is taken as given.
    let m = rendered(json!({"terminationGracePeriodSeconds": 900}));
    let deployment: Deployment = m.one("Deployment");
    assert_eq!(
        deployment
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
            .termination_grace_period_seconds,
        Some(900)
    );
}

#[test]
fn a_service_monitor_is_rendered_only_when_asked_for() {
    let m = rendered(
        json!({"metrics": {"serviceMonitor": {"enabled": true, "labels": {"release": "prom"}}}}),
    );
    let monitors = m.all("ServiceMonitor");
    assert_eq!(monitors.len(), 1);
    let monitor = monitors[0];
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "management");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    // It selects the management port's own Service, not the clients'.
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let selected: Vec<Service> = m
        .all("Service")
        .into_iter()
        .map(|s| serde_json::from_value::<Service>(s.clone()).unwrap())
        .filter(|s| {
            let labels = s.metadata.labels.clone().unwrap_or_default();
            selector
                .iter()
                .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str())
        })
        .collect();
    assert_eq!(selected.len(), 1, "{selector:?}");
    let ports = selected[0].spec.clone().unwrap().ports.unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].name.as_deref(), Some("management"));
    assert_eq!(ports[0].port, 30001);
    // Without a management port, the clients' Service and its port.
    let m = rendered(
        json!({"server": {"managementPort": 0}, "metrics": {"serviceMonitor": {"enabled": true}}}),
    );
    assert_eq!(m.all("Service").len(), 1);
    assert_eq!(
        m.all("ServiceMonitor")[0]["spec"]["endpoints"][0]["port"],
        "http"
    );
    assert!(
        Manifests::parse(&committed())
            .unwrap()
            .all("ServiceMonitor")
            .is_empty()
    );
    // With the metrics key set, the scrape's credentials from a Secret;
    // none without.
    assert!(
        monitor["spec"]["endpoints"][0]
            .get("authorization")
            .is_none()
    );
    let bearer =
        json!({"type": "Bearer", "credentials": {"name": "radixgate-keys", "key": "metrics"}});
    let m = rendered(
        json!({"metrics": {"serviceMonitor": {"enabled": true, "authorization": bearer}}}),
    );
    assert_eq!(
        m.all("ServiceMonitor")[0]["spec"]["endpoints"][0]["authorization"],
        bearer
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_router_finds_a_labelled_pod_serves_and_drops_readiness_on_sigterm() {
    let m = Manifests::parse(&committed()).unwrap();
    let config = router_config(&m);
    let dir = temp_dir("run");
    let args = router_args(&m, &dir);
    let c = container(&m.one("Deployment"));
    let path = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
        probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .clone()
            .unwrap()
    };
    let (liveness, readiness) = (path(&c.liveness_probe), path(&c.readiness_probe));

    // A worker pod labelled as the chart's selector says, where it watches.
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _worker = common::sim_worker_on(listener, common::fast_worker()).await;
    let api = k8s::FakeApi::start_new().await;
    let mut pod = k8s::pod("worker-0", json!(config.discovery.selector), addr);
    pod["metadata"]["namespace"] = json!(config.discovery.namespace);
    api.put(pod);

    // What differs from a cluster: loopback and a free port, the fake API
    // server's kubeconfig instead of the pod's service account, and the
    // test worker's port.
    let mut command = Command::new(env!("CARGO_BIN_EXE_radixgate"));
    for (key, _) in std::env::vars() {
        if key.starts_with("RADIXGATE_") {
            command.env_remove(key);
        }
    }
    let mut child = command
        .args(&args)
        .env("RADIXGATE_HOST", "127.0.0.1")
        .env("RADIXGATE_PORT", "0")
        .env("RADIXGATE_KUBECONFIG", &api.kubeconfig)
        .env("RADIXGATE_SERVICE_DISCOVERY_PORT", addr.port().to_string())
        .env("RADIXGATE_PROMETHEUS_PORT", "0")
        .env("RADIXGATE_PROMETHEUS_HOST", "127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("[radixgate] {line}");
            let parsed = serde_json::from_str(&line)
                .unwrap_or_else(|_| json!({"fields": {"message": line}}));
            if tx.send(parsed).is_err() {
                break;
            }
        }
    });
    let mut router = Router { child, lines };
    // The probes go to the metrics port, as the chart's do.
    let management = router.wait_for("metrics and probes listening");
    let management = format!("http://{}", management["fields"]["addr"].as_str().unwrap());
    let listening = router.wait_for("radixgate listening");
    let url = format!("http://{}", listening["fields"]["addr"].as_str().unwrap());
    let client = common::client();
    let status = |path: String| {
        let client = client.clone();
        let url = management.clone();
        async move {
            client
                .get(format!("{url}{path}"))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    };
    assert_eq!(status(liveness.clone()).await.unwrap(), 200);
    common::wait_until("the pod found and the router ready", || async {
        status(readiness.clone()).await.ok() == Some(200)
    })
    .await;
    let answer = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&common::chat("hello from the chart", false))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.headers()["x-radixgate-worker"],
        format!("http://{addr}").as_str()
    );

    // SIGTERM: readiness drops while the listener still accepts, for the
    // chart's shutdown delay; then the router exits cleanly.
    assert!(config.server.shutdown_delay_secs > 0);
    let kill = Command::new("kill")
        .args(["-TERM", &router.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    router.wait_for("still accepting for the shutdown delay");
    assert_eq!(
        status(readiness).await.unwrap(),
        503,
        "not ready, still accepting"
    );
    let exit = tokio::task::spawn_blocking(move || {
        let status = router.child.wait().unwrap();
        drop(router);
        status
    })
    .await
    .unwrap();
    assert!(exit.success(), "{exit:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// The image's root is read-only and has no temporary directory: a trace
/// recording started through the admin API needs a writable directory,
/// which the chart mounts and names as `record_trace.admin_dir`.
#[test]
fn the_chart_gives_trace_recordings_a_writable_directory() {
    let m = Manifests::parse(&committed()).unwrap();
    let config = router_config(&m);
    let dir = config.record_trace.admin_dir.clone();
    let deployment: Deployment = m.one("Deployment");
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let mounts = pod.containers[0].volume_mounts.clone().unwrap_or_default();
    let mount = mounts
        .iter()
        .find(|m| std::path::Path::new(&m.mount_path) == dir)
        .unwrap_or_else(|| panic!("nothing mounted at record_trace.admin_dir {dir:?}: {mounts:?}"));
    assert_ne!(mount.read_only, Some(true));
    let volume = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == mount.name)
        .expect("the mount's volume");
    assert!(volume.empty_dir.is_some(), "{volume:?}");
    // The operator's own directory wins.
    let m = rendered(json!({"config": {"record_trace": {"admin_dir": "/traces"}}}));
    assert_eq!(
        router_config(&m).record_trace.admin_dir,
        std::path::Path::new("/traces")
    );
}

/// Bytes of a Kubernetes quantity as the chart writes sizes (`1Gi`,
/// `512Mi`, `2G`, or bytes).
fn quantity_bytes(q: &str) -> u64 {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (digits, unit) = units
        .iter()
        .find_map(|(suffix, unit)| q.strip_suffix(suffix).map(|d| (d, *unit)))
        .unwrap_or((q, 1));
    digits.parse::<u64>().unwrap_or_else(|e| panic!("{q}: {e}")) * unit
}

/// A recording started through the admin API rotates through its file
/// and `keep` more, `max_bytes` each: with the router's defaults (256 MiB,
/// 5) up to 1.5 GiB, past the data volume's 1 GiB `sizeLimit`, where the
/// kubelet kills the pod at once, every stream it serves with it, and the
/// recording goes with the volume. The chart's defaults keep one
/// recording within half the volume.
#[test]
fn a_recording_at_the_charts_defaults_fits_its_volume() {
    let fits = |m: &Manifests| {
        let record = router_config(m).record_trace;
        let deployment: Deployment = m.one("Deployment");
        let pod = deployment.spec.unwrap().template.spec.unwrap();
        let data = pod
            .volumes
            .unwrap()
            .into_iter()
            .find_map(|v| v.empty_dir.filter(|_| v.name == "data"))
            .expect("the data volume");
        let limit = quantity_bytes(&data.size_limit.expect("a size limit").0);
        assert!(record.max_bytes > 0, "a recording that never rotates");
        let most = record.max_bytes * (u64::from(record.keep) + 1);
        assert!(
            most <= limit / 2,
            "a recording takes up to {most} bytes, the volume holds {limit}"
        );
    };
    fits(&Manifests::parse(&committed()).unwrap());
    fits(&rendered(json!({"dataVolume": {"sizeLimit": "1Gi"}})));
    // The operator's own sizes win.
    let m = rendered(json!({"config": {"record_trace": {"max_bytes": 1000, "keep": 1}}}));
    let record = router_config(&m).record_trace;
    assert_eq!((record.max_bytes, record.keep), (1000, 1));
}

/// A worker's key from a Secret: the config names a variable, which the
/// container takes from the Secret; the key itself is in neither the
/// values nor the ConfigMap.
#[test]
fn a_workers_key_comes_from_a_secret_not_the_config_map() {
    let m = rendered(json!({"workers": [
        "http://plain:8000",
        {"url": "http://keyed:8000", "models": ["m"],
         "apiKeySecret": {"name": "worker-keys", "key": "keyed"}},
    ]}));
    let config_map: k8s_openapi::api::core::v1::ConfigMap = m.one("ConfigMap");
    let text = &config_map.data.unwrap()["radixgate.yaml"];
    assert!(!text.contains("apiKeySecret"), "{text}");
    let config = radixgate::config::Config::from_yaml(text).unwrap();
    let keyed = &config.workers[1];
    assert_eq!(keyed.url, "http://keyed:8000");
    assert_eq!(keyed.api_key, None);
    let var = keyed.api_key_env.clone().expect("a variable named");
    assert_eq!(config.workers[0].api_key_env, None);
    let deployment: Deployment = m.one("Deployment");
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let env = pod.containers[0].env.clone().unwrap_or_default();
    let from = env
        .iter()
        .find(|e| e.name == var)
        .unwrap_or_else(|| panic!("no {var} in the container's env: {env:?}"));
    let secret = from
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .expect("from a Secret");
    assert_eq!(
        (secret.name.as_str(), secret.key.as_str()),
        ("worker-keys", "keyed")
    );
}

/// The values that stand for radixgate.yaml's sections (`server`,
/// `discovery` and its pools, `sync`) take the chart's own keys; one the
/// chart does not know, radixgate.yaml's spelling say, is refused with
/// where it belongs, as the router refuses an unknown key in its file.
#[test]
fn a_value_the_chart_does_not_know_is_refused_not_dropped() {
    // `server.api_key` was dropped from the config: the router served
    // with no key at all.
    let err = render(json!({"server": {"api_key": "sk-a"}})).unwrap_err();
    assert!(err.contains("server.api_key"), "{err}");
    assert!(err.contains("config.server"), "{err}");
    assert!(err.contains("RADIXGATE_API_KEY"), "{err}");
    for (values, named, hint) in [
        (
            json!({"discovery": {"model_id_from": "label:model"}}),
            "discovery.model_id_from",
            "modelIdFrom",
        ),
        (
            json!({"discovery": {"pools": [
                {"selector": {"app": "a"}},
                {"selector": {"app": "b"}, "portAnnotaion": "example.com/port"},
            ]}}),
            "discovery.pools[1].portAnnotaion",
            "portAnnotation",
        ),
        (
            json!({"sync": {"urls": ["nats://nats:4222"], "history_secs": 300}}),
            "sync.history_secs",
            "sync.settings",
        ),
        // A section of radixgate.yaml at the top of the values.
        (
            json!({"tenants": {"keys": [{"name": "a", "key_env": "A_KEY"}]}}),
            "`tenants`",
            "config.tenants",
        ),
    ] {
        let err = render(values.clone()).unwrap_err();
        assert!(err.contains(named), "{values}: {err}");
        assert!(err.contains(hint), "{values}: {err}");
    }
    // Where it belongs, it is taken.
    let m = rendered(json!({"config": {"server": {"api_key": "sk-a"}}}));
    assert_eq!(router_config(&m).server.api_key.as_deref(), Some("sk-a"));
}

/// The container's `http` port (the Service's target) is `server.port`
/// on `server.host`. A `--port` or `--host` in `extraArgs`, or
/// `RADIXGATE_PORT` or `RADIXGATE_HOST` in `extraEnv`, moved the listener
/// away from it while the probes, on the management port, kept the pod
/// ready: every client connection through the Service was refused.
#[test]
fn the_listeners_port_and_address_are_the_charts_own() {
    let port = |key: &str, value: &str| json!([{"name": key, "value": value}]);
    for (values, named, value) in [
        (
            json!({"extraArgs": ["--port", "8000"]}),
            "extraArgs --port",
            "server.port",
        ),
        (
            json!({"extraArgs": ["--port=8000"]}),
            "extraArgs --port=8000",
            "server.port",
        ),
        (
            json!({"extraArgs": ["--host", "127.0.0.1"]}),
            "extraArgs --host",
            "server.host",
        ),
        (
            json!({"extraEnv": port("RADIXGATE_PORT", "8000")}),
            "extraEnv RADIXGATE_PORT",
            "server.port",
        ),
        (
            json!({"extraEnv": port("RADIXGATE_HOST", "127.0.0.1")}),
            "extraEnv RADIXGATE_HOST",
            "server.host",
        ),
        // Without a management port too.
        (
            json!({"server": {"managementPort": 0}, "extraArgs": ["--port", "8000"]}),
            "extraArgs --port",
            "server.port",
        ),
    ] {
        let err = render(values.clone()).unwrap_err();
        assert!(err.contains(named), "{values}: {err}");
        assert!(err.contains(value), "{values}: {err}");
    }
    // Other flags pass, and reach the router.
    let m = rendered(json!({"extraArgs": ["--policy", "round_robin"]}));
    assert_eq!(
        router_config(&m).server.port,
        u16::try_from(container_port(&container(&m.one("Deployment")), "http").unwrap()).unwrap()
    );
}

/// The keys the chart writes from its own values, given again elsewhere.
/// Under `config` they were overwritten without a word
/// (`config.server.request_timeout_secs: 3600` became 600 and cut the
/// operator's long streams; `config.server.worker_allowlist` became `[]`,
/// a router that takes any worker); as a flag in `extraArgs` or a
/// variable in `extraEnv` they won over the file, and the pod's shutdown
/// no longer covered them (`--request-timeout-secs 3600` beside a
/// 620 s terminationGracePeriodSeconds: a rollout killed streams the
/// router allowed). Each is refused, naming the value to set.
#[test]
fn the_charts_own_keys_are_refused_where_they_would_be_lost_or_win() {
    let var = |name: &str, value: &str| json!([{"name": name, "value": value}]);
    for (values, named, value) in [
        (
            json!({"config": {"server": {"request_timeout_secs": 3600}}}),
            "config.server.request_timeout_secs",
            "server.requestTimeoutSecs",
        ),
        (
            json!({"config": {"server": {"worker_allowlist": ["10.0.0.0/8"]}}}),
            "config.server.worker_allowlist",
            "server.workerAllowlist",
        ),
        (
            json!({"config": {"server": {"shutdown_grace_period_secs": 900}}}),
            "config.server.shutdown_grace_period_secs",
            "server.shutdownGracePeriodSecs",
        ),
        (
            json!({"config": {"discovery": {"selector": {"app": "sglang"}}}}),
            "config.discovery.selector",
            "discovery.selector",
        ),
        (
            json!({"extraArgs": ["--request-timeout-secs", "3600"]}),
            "extraArgs --request-timeout-secs",
            "server.requestTimeoutSecs",
        ),
        (
            json!({"extraArgs": ["--shutdown-grace-period-secs=30"]}),
            "extraArgs --shutdown-grace-period-secs=30",
            "server.shutdownGracePeriodSecs",
        ),
        (
            json!({"extraEnv": var("RADIXGATE_SHUTDOWN_DELAY_SECS", "0")}),
            "extraEnv RADIXGATE_SHUTDOWN_DELAY_SECS",
            "server.shutdownDelaySecs",
        ),
        (
            json!({"extraEnv": var("RADIXGATE_REQUEST_TIMEOUT_SECS", "0")}),
            "extraEnv RADIXGATE_REQUEST_TIMEOUT_SECS",
            "server.requestTimeoutSecs",
        ),
    ] {
        let err = render(values.clone()).unwrap_err();
        assert!(err.contains(named), "{values}: {err}");
        assert!(err.contains(value), "{values}: {err}");
    }
    // Set where the chart reads them, they reach the router; the section's
    // other keys pass through `config`.
    let m = rendered(json!({
        "server": {"requestTimeoutSecs": 3600, "shutdownGracePeriodSecs": 3600,
                   "workerAllowlist": ["10.0.0.0/8"]},
        "config": {"server": {"max_connections": 100},
                   "discovery": {"kubeconfig": "/etc/kube/config"}},
    }));
    let config = router_config(&m);
    assert_eq!(config.server.request_timeout_secs, 3600);
    assert_eq!(config.server.worker_allowlist, ["10.0.0.0/8"]);
    assert_eq!(config.server.max_connections, 100);
    assert_eq!(
        config.discovery.kubeconfig.as_deref(),
        Some(std::path::Path::new("/etc/kube/config"))
    );
}

/// Files the config names (a private CA's bundle, a tokenizer, a keys
/// file) reach the container through the values' extra volumes; a
/// Recreate strategy is rendered without the default's rollingUpdate,
/// which the API server refuses beside it; and discovery turned off
/// writes no `discovery.port`, which the router warns does nothing.
#[test]
fn extra_volumes_a_recreate_strategy_and_discovery_off_render_as_asked() {
    let m = rendered(json!({
        "extraVolumes": [{"name": "tokenizer",
                          "persistentVolumeClaim": {"claimName": "model-files"}}],
        "extraVolumeMounts": [{"name": "tokenizer", "mountPath": "/models", "readOnly": true}],
        "config": {"kv_events": {"tokenizer": "/models/tokenizer.json"}},
        "strategy": {"type": "Recreate"},
    }));
    let deployment: Deployment = m.one("Deployment");
    let spec = deployment.spec.unwrap();
    let strategy = spec.strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("Recreate"));
    assert!(strategy.rolling_update.is_none(), "{strategy:?}");
    let pod = spec.template.spec.unwrap();
    let mounts = pod.containers[0].volume_mounts.clone().unwrap_or_default();
    let mount = mounts
        .iter()
        .find(|m| m.mount_path == "/models")
        .unwrap_or_else(|| panic!("/models not mounted: {mounts:?}"));
    let volume = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == mount.name)
        .expect("the mount's volume");
    assert_eq!(
        volume.persistent_volume_claim.unwrap().claim_name,
        "model-files"
    );
    // The chart's own mounts stay.
    assert!(mounts.iter().any(|m| m.mount_path == "/etc/radixgate"));
    // The default strategy keeps its rollingUpdate.
    let m = Manifests::parse(&committed()).unwrap();
    let deployment: Deployment = m.one("Deployment");
    let strategy = deployment.spec.unwrap().strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert!(strategy.rolling_update.is_some());

    let m = rendered(json!({"discovery": {"enabled": false}, "workers": ["http://w:8000"]}));
    let config_map: k8s_openapi::api::core::v1::ConfigMap = m.one("ConfigMap");
    let text = &config_map.data.unwrap()["radixgate.yaml"];
    let config: Value = serde_norway::from_str(text).unwrap();
    assert_eq!(config["discovery"], json!({"enabled": false}), "{text}");
    assert!(!router_config(&m).discovery.enabled);
}
