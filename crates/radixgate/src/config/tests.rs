use super::*;
use clap::Parser;
use radixgate_routing::{PolicyConfig, WorkerRole};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn args(argv: &[&str]) -> ServeArgs {
    Cli::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))
        .unwrap()
        .serve
}

#[test]
fn defaults_are_valid() {
    Config::default().validate().unwrap();
    assert_eq!(Config::from_yaml("").unwrap(), Config::default());
}

/// A section with nothing under it (every key commented out) is YAML's
/// null: its defaults, as `routing:` already was, where every other
/// section was refused with "invalid type: unit value". Its keys are still
/// checked when it has any.
#[test]
fn an_empty_section_is_its_defaults() {
    let sections = [
        "server",
        "workers",
        "discovery",
        "routing",
        "health",
        "retry",
        "circuit_breaker",
        "outlier_detection",
        "admission",
        "tenants",
        "metrics",
        "sync",
        "kv_events",
        "record_trace",
        "pd",
        "responses",
        "log",
        "tracing",
    ];
    let all: String = sections.iter().map(|s| format!("{s}:\n")).collect();
    assert_eq!(Config::from_yaml(&all).unwrap(), Config::default());
    for s in sections {
        assert_eq!(
            Config::from_yaml(&format!("{s}: ~\n")).unwrap(),
            Config::default(),
            "{s}"
        );
    }
    let sync = Config::from_yaml("sync:\n  tls:\n  auth:\n").unwrap();
    assert_eq!(sync.sync, Config::default().sync);
    // `pd.decode_policy` is a section like `routing:`: empty, decode's
    // default (power_of_two), not the routing default.
    let pd = Config::from_yaml("pd:\n  decode_policy:\n").unwrap();
    assert_eq!(pd.pd, Config::default().pd);
    let err = Config::from_yaml("health:\n  bogus: 1\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `bogus`"), "{err}");
    let err = Config::from_yaml("server: 5\n").unwrap_err().to_string();
    assert!(err.contains("invalid type: integer"), "{err}");
}

#[test]
fn yaml_parts_and_worker_forms() {
    let config = Config::from_yaml(
        "server: {port: 8080}\n\
         workers:\n  - http://a:1\n  - {url: 'http://b:2', api_key: k, models: [m]}\n\
         retry: {max_retries: 0}\n",
    )
    .unwrap();
    assert_eq!(config.server.port, 8080);
    assert_eq!(config.server.host, "127.0.0.1", "unset keys keep defaults");
    assert_eq!(config.workers[0], WorkerSpec::new("http://a:1"));
    assert_eq!(config.workers[1].url, "http://b:2");
    assert_eq!(config.workers[1].api_key.as_deref(), Some("k"));
    assert_eq!(config.workers[1].models, ["m"]);
    assert_eq!(config.retry.max_retries, 0);
    config.validate().unwrap();
}

#[test]
fn unknown_keys_are_errors_with_location() {
    let err = Config::from_yaml("server:\n  prot: 1\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `prot`"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    assert!(Config::from_yaml("sever: {}\n").is_err());
    assert!(Config::from_yaml("workers: [{url: 'http://a', modles: [m]}]\n").is_err());
}

#[test]
fn flags_override_file() {
    let dir = std::env::temp_dir().join(format!("radixgate-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.yaml");
    std::fs::write(
        &file,
        "server: {port: 1111, host: 0.0.0.0}\nadmission: {queue_size: 7}\n",
    )
    .unwrap();
    let config = args(&[
        "--config",
        file.to_str().unwrap(),
        "--port",
        "2222",
        "--worker-urls",
        "http://x:1",
        "http://y:2",
        "--max-concurrent-requests",
        "-1",
        "--disable-retries",
    ])
    .load()
    .unwrap();
    assert_eq!(config.server.port, 2222);
    assert_eq!(config.server.host, "0.0.0.0");
    assert_eq!(config.admission.queue_size, 7);
    assert_eq!(config.admission.max_concurrent_requests, None);
    assert_eq!(config.retry.max_retries, 0);
    assert_eq!(config.workers.len(), 2);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_values_name_their_key() {
    let cases: [(&[&str], &str); 7] = [
        (&["--retry-jitter-factor", "1.5"], "retry.jitter_factor"),
        (&["--threads", "65"], "server.threads"),
        (
            &["--retry-backoff-multiplier", "0.5"],
            "retry.backoff_multiplier",
        ),
        (
            &["--max-concurrent-requests", "0"],
            "admission.max_concurrent_requests",
        ),
        (
            &["--max-concurrent-requests", "-3"],
            "admission.max_concurrent_requests",
        ),
        (&["--health-check-endpoint", "health"], "health.endpoint"),
        (&["--worker-urls", "localhost:8000"], "workers"),
    ];
    for (argv, key) in cases {
        let err = args(argv).load().unwrap_err().to_string();
        assert!(err.contains(key), "{argv:?}: {err}");
    }
    let missing = args(&["--config", "/nonexistent/radixgate.yaml"])
        .load()
        .unwrap_err();
    assert!(
        missing.to_string().contains("cannot read config file"),
        "{missing}"
    );
}

/// The metrics port may equal the client port only on another address:
/// each is then a listener of its own (an overlapping pair, `0.0.0.0` and
/// `127.0.0.1`, is refused by the bind, naming the metrics port).
#[test]
fn metrics_port_clashes_only_on_the_same_host() {
    let same = ["--port", "9000", "--prometheus-port", "9000"];
    let err = args(&same).load().unwrap_err().to_string();
    assert!(err.contains("metrics.prometheus_port"), "{err}");
    let named_same = [
        "--host",
        "10.0.0.5",
        "--port",
        "9000",
        "--prometheus-port",
        "9000",
        "--prometheus-host",
        "10.0.0.5",
    ];
    assert!(args(&named_same).load().is_err());
    let apart = [
        "--host",
        "10.0.0.5",
        "--port",
        "9000",
        "--prometheus-port",
        "9000",
        "--prometheus-host",
        "127.0.0.1",
    ];
    let config = args(&apart).load().unwrap();
    assert_eq!(config.metrics.prometheus_port, Some(9000));
}

#[test]
fn serving_threads_default_to_one_per_cpu() {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let config = args(&[]).load().unwrap();
    assert_eq!(config.server.serving_threads(), cpus.min(MAX_THREADS));
    let config = args(&["--threads", "3"]).load().unwrap();
    assert_eq!(config.server.threads, 3);
    assert_eq!(config.server.serving_threads(), 3);
}

/// Checked after parsing (clap would take a variable for its flag): a
/// count of retries with retries disabled is refused, naming both; a
/// count of 0 agrees.
#[test]
fn retries_flag_conflicts_with_disable() {
    let refused = args(&["--disable-retries", "--retry-max-retries", "2"]).load();
    let err = refused.unwrap_err().to_string();
    assert!(
        err.contains("--disable-retries") && err.contains("--retry-max-retries 2"),
        "{err}"
    );
    let config = args(&["--disable-retries", "--retry-max-retries", "0"]).load();
    assert_eq!(config.unwrap().retry.max_retries, 0);
}

/// The URL rule itself is routing's (`WorkerUrl::parse`); this is that a
/// worker entry goes through it and a rejection names the key.
#[test]
fn url_validation() {
    let with_worker = |url: &str| Config {
        workers: vec![WorkerSpec::new(url)],
        ..Config::default()
    };
    for good in [
        "http://a",
        "http://a:80",
        "https://a.b/",
        "http://[::1]:8000",
        "http://[::1]",
    ] {
        with_worker(good)
            .validate()
            .unwrap_or_else(|e| panic!("{good}: {e}"));
    }
    for bad in [
        "a:80",
        "ftp://a",
        "http://",
        "http://:80",
        "http://a:99999",
        "http://[::1",
        "https://a.b/c",
        "http://u:p@a:80",
        "http://a:80?x",
    ] {
        let err = with_worker(bad).validate().unwrap_err().to_string();
        assert!(err.contains("`workers`: entry 0"), "{bad}: {err}");
    }
}

#[test]
fn policy_flags() {
    let config = args(&[
        "--policy",
        "cache_aware",
        "--cache-threshold",
        "0.5",
        "--max-tree-size",
        "1000",
    ])
    .load()
    .unwrap();
    match &config.routing {
        PolicyConfig::CacheAware(c) => {
            assert_eq!(c.cache_threshold, 0.5);
            assert_eq!(c.max_tree_size, 1000);
        }
        other => panic!("{other:?}"),
    }
    let rr = args(&["--policy", "round_robin"]).load().unwrap();
    assert_eq!(rr.routing.name(), "round_robin");
    let err = args(&["--policy", "round_robin", "--cache-threshold", "0.5"])
        .load()
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("--cache-threshold applies only to cache_aware"),
        "{err}"
    );
    let err = args(&["--cache-threshold", "1.5"]).load().unwrap_err();
    assert!(
        err.to_string().contains("`routing.cache_threshold`"),
        "{err}"
    );
    assert!(Cli::try_parse_from(["serve", "--policy", "fastest"]).is_err());
}

/// A value out of range in the decode pool's policy is named as in the
/// file, `pd.decode_policy.KEY`, as one of `routing:` is: not the key
/// without its section, under the routing crate's own wording.
#[test]
fn a_decode_policy_value_out_of_range_is_named_with_its_section() {
    let file = Config::from_yaml(
        "pd: {enabled: true, decode_policy: {policy: cache_aware, cache_threshold: 1.5}}\n\
         workers:\n  - {url: 'http://p0:30000', role: prefill}\n\
         \x20 - {url: 'http://d0:30000', role: decode}\n",
    )
    .unwrap();
    let err = file.validate().unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid setting `pd.decode_policy.cache_threshold`: must be between 0 and 1, got 1.5"
    );
}

#[test]
fn routing_section_in_yaml() {
    let config =
        Config::from_yaml("routing: {policy: consistent_hash, virtual_nodes: 40}\n").unwrap();
    assert_eq!(config.routing.name(), "consistent_hash");
    assert!(Config::from_yaml("routing: {policy: round_robin, cache_threshold: 0.2}\n").is_err());
    // Without `policy:` the section tunes the default policy.
    let config = Config::from_yaml("routing:\n  cache_threshold: 0.5\n").unwrap();
    match &config.routing {
        PolicyConfig::CacheAware(c) => assert_eq!(c.cache_threshold, 0.5),
        other => panic!("expected cache_aware, got {}", other.name()),
    }
    let err = Config::from_yaml("routing:\n  cache_treshold: 0.5\n").unwrap_err();
    assert!(err.to_string().contains("cache_treshold"), "{err}");
    // Elsewhere a mistake still points at its line.
    let err = Config::from_yaml("server:\n  port: 1\n  prot: 2\n").unwrap_err();
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn prefill_aware_takes_the_tree_flags_but_not_the_thresholds() {
    let c = args(&["--policy", "prefill_aware", "--max-tree-size", "500"])
        .load()
        .unwrap();
    assert!(matches!(&c.routing, PolicyConfig::PrefillAware(p) if p.max_tree_size == 500));
    let err = args(&["--policy", "prefill_aware", "--cache-threshold", "0.5"])
        .load()
        .unwrap_err();
    assert!(
        err.to_string().contains("applies only to cache_aware"),
        "{err}"
    );
}

#[test]
fn tenants_come_from_the_section_and_the_api_key_file_flag() {
    let config = Config::from_yaml(
        "tenants:\n  keys:\n    - {name: a, key: sk-a, requests_per_minute: 60, priority: high}\n",
    )
    .unwrap();
    config.validate().unwrap();
    let resolved = config.tenants.resolve(Some("sk-legacy")).unwrap();
    let names: Vec<_> = resolved.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, [API_KEY_TENANT, "a"]);
    assert!(
        !format!("{resolved:?}{config:?}").contains("sk-"),
        "Debug hides keys"
    );

    let mut config = Config::default();
    args(&["--api-key-file", "/nonexistent/keys.yaml"])
        .apply(&mut config)
        .unwrap();
    assert_eq!(
        config.tenants.api_key_file.as_deref(),
        Some(std::path::Path::new("/nonexistent/keys.yaml"))
    );
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("/nonexistent/keys.yaml"), "{err}");
}

/// A keys file with no document in it (truncated, or only its opening
/// comment written so far) stops loading, named, instead of being read as
/// no tenants, which would leave the client API open; `[]` says "none".
#[test]
fn an_emptied_api_key_file_is_refused_not_read_as_no_tenants() {
    let dir = std::env::temp_dir().join(format!("radixgate-config-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("emptied-keys.yaml");
    let load = |text: &str| {
        std::fs::write(&file, text).unwrap();
        args(&["--api-key-file", file.to_str().unwrap()]).load()
    };
    for empty in ["", " \n\n", "# tenants\n", "---\n"] {
        let err = load(empty).expect_err(empty).to_string();
        assert!(
            err.contains("empty")
                && err.contains("tenants.api_key_file")
                && err.contains("emptied-keys.yaml"),
            "{empty:?}: {err}"
        );
    }
    let config = load("[]\n").unwrap();
    assert!(config.tenants.resolve(None).unwrap().is_empty());
}

/// A `${NAME}` in the file is not expanded; taken as written, a key so
/// written was the literal text, so the error names where it is and what
/// to do instead.
#[test]
fn unexpanded_variables_are_refused_with_their_place() {
    for (yaml, place, found) in [
        (
            "workers: [{url: 'http://a:1', api_key: '${WORKER_KEY}'}]\n",
            "`workers[0].api_key`",
            "`${WORKER_KEY}`",
        ),
        (
            "server:\n  api_key: sk-${ENV}-x\n",
            "`server.api_key`",
            "`${ENV}`",
        ),
        (
            "workers: ['http://${HOST}:8000']\n",
            "`workers[0]`",
            "`${HOST}`",
        ),
        (
            "sync:\n  urls: ['nats://n:4222']\n  auth: {token: '${T}'}\n",
            "`sync.auth.token`",
            "`${T}`",
        ),
    ] {
        let err = Config::from_yaml(yaml).expect_err(yaml).to_string();
        assert!(
            err.contains(place) && err.contains(found) && err.contains("not expanded"),
            "{yaml}: {err}"
        );
    }
    // A `$` of a key's own, or a `${` never closed, is the key's text.
    for yaml in [
        "server:\n  api_key: 'a$b{c}'\n",
        "server:\n  api_key: 'a${b'\n",
    ] {
        Config::from_yaml(yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
    }
    let dir = std::env::temp_dir().join(format!("radixgate-config-vars-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys.yaml");
    std::fs::write(&file, "- {name: team-a, key: '${TEAM_A_KEY}'}\n").unwrap();
    let err = args(&["--api-key-file", file.to_str().unwrap()])
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`[0].key`") && err.contains("keys.yaml"),
        "{err}"
    );
}

#[test]
fn bad_inline_tenants_are_named() {
    let check = |yaml: &str, api_key: Option<&str>, needles: &[&str]| {
        let mut config = Config::from_yaml(yaml).unwrap();
        config.server.api_key = api_key.map(str::to_owned);
        let err = config.validate().unwrap_err().to_string();
        for needle in needles {
            assert!(err.contains(needle), "`{needle}` not in: {err}");
        }
        assert!(!err.contains("sk-1"), "no key in: {err}");
    };
    let keys = |list: &str| format!("tenants:\n  keys: [{list}]\n");
    check(
        &keys("{name: a, key: sk-1}, {name: b, key: sk-1}"),
        None,
        &["tenants.keys", "entry 1 (`b`)", "same key as `a`"],
    );
    check(
        &keys("{name: default, key: sk-2}"),
        Some("sk-1"),
        &["entry 0 (`default`)", "already used"],
    );
    check(
        &keys("{name: a, key: sk-1, key_env: X}"),
        None,
        &["not both"],
    );
    check(&keys("{name: '', key: sk-1}"), None, &["entry 0", "name"]);
    check(
        &keys("{name: 'a b', key: sk-1}"),
        None,
        &["entry 0", "name"],
    );
    check(&keys("{name: a, key: 'sk-1 x'}"), None, &["whitespace"]);
    check(
        &keys("{name: a, key: sk-1, tokens_per_minute: 0}"),
        None,
        &["tokens_per_minute", "at least 1"],
    );
    assert!(Config::from_yaml("tenants: {keys: [{name: a, key: k, rpm: 1}]}").is_err());
}

#[test]
fn access_settings() {
    let config = Config::from_yaml(
        "server:\n  admin_access: off\n  metrics_api_key: m\n  \
         worker_allowlist: [10.0.0.0/8, '*.svc.cluster.local']\n",
    )
    .unwrap();
    config.validate().unwrap();
    assert_eq!(config.server.admin_access, AdminAccess::Off);
    assert_eq!(config.server.metrics_api_key.as_deref(), Some("m"));
    assert_eq!(config.server.worker_allowlist.len(), 2);
    assert_eq!(Config::default().server.admin_access, AdminAccess::Loopback);
    assert!(Config::from_yaml("server: {admin_access: remote}").is_err());

    let flags = args(&[
        "--admin-access",
        "off",
        "--metrics-api-key",
        "m",
        "--worker-allowlist",
        "10.0.0.0/8,*.svc",
    ]);
    let config = flags.load().unwrap();
    assert_eq!(config.server.admin_access, AdminAccess::Off);
    assert_eq!(config.server.worker_allowlist, ["10.0.0.0/8", "*.svc"]);

    let invalid = |edit: fn(&mut ServerConfig)| {
        let mut config = Config::default();
        edit(&mut config.server);
        config.validate().unwrap_err().to_string()
    };
    let err = invalid(|s| s.api_key = Some(String::new()));
    assert!(
        err.contains("server.api_key") && err.contains("empty"),
        "{err}"
    );
    let err = invalid(|s| s.admin_api_key = Some(String::new()));
    assert!(err.contains("server.admin_api_key"), "{err}");
    let err = invalid(|s| s.metrics_api_key = Some("a b".into()));
    assert!(
        err.contains("server.metrics_api_key") && err.contains("whitespace"),
        "{err}"
    );
    let err = invalid(|s| s.admin_api_key = Some("clé".into()));
    assert!(
        err.contains("server.admin_api_key") && err.contains("ASCII") && !err.contains("clé"),
        "{err}"
    );
    let err = invalid(|s| {
        s.api_key = Some("k".into());
        s.admin_api_key = Some("k".into());
    });
    assert!(
        err.contains("server.admin_api_key") && err.contains("must differ"),
        "{err}"
    );
    let err = invalid(|s| s.worker_allowlist = vec!["10.0.0.0/40".into()]);
    assert!(
        err.contains("server.worker_allowlist") && err.contains("entry 0"),
        "{err}"
    );
}

#[test]
fn connection_and_body_limits_are_flags_and_validated() {
    let c = args(&[
        "--body-read-timeout-secs",
        "5",
        "--max-buffered-body-bytes",
        "100000000",
        "--header-read-timeout-secs",
        "3",
        "--idle-timeout-secs",
        "30",
        "--client-write-timeout-secs",
        "7",
        "--max-connections",
        "200",
    ])
    .load()
    .unwrap();
    assert_eq!(c.server.body_read_timeout_secs, 5);
    assert_eq!(c.server.max_buffered_body_bytes, 100_000_000);
    assert_eq!(c.server.header_read_timeout_secs, 3);
    assert_eq!(c.server.idle_timeout_secs, 30);
    assert_eq!(c.server.client_write_timeout_secs, 7);
    assert_eq!(c.server.connection_cap(), 200);
    assert!(Config::default().server.connection_cap() >= 64);
    let cases: [(&[&str], &str); 6] = [
        (
            &["--body-read-timeout-secs", "0"],
            "server.body_read_timeout_secs",
        ),
        (
            &["--header-read-timeout-secs", "18446744073709551615"],
            "server.header_read_timeout_secs",
        ),
        (&["--idle-timeout-secs", "0"], "server.idle_timeout_secs"),
        (
            &["--client-write-timeout-secs", "0"],
            "server.client_write_timeout_secs",
        ),
        (
            &["--max-buffered-body-bytes", "1000"],
            "server.max_buffered_body_bytes",
        ),
        (
            &[
                "--max-payload-size",
                "2000",
                "--max-buffered-body-bytes",
                "1999",
            ],
            "server.max_buffered_body_bytes",
        ),
    ];
    for (argv, key) in cases {
        let err = args(argv).load().unwrap_err().to_string();
        assert!(err.contains(key), "{argv:?}: {err}");
    }
}

#[test]
fn an_smg_discovery_command_line_ports_over() {
    let c = args(&[
        "--service-discovery",
        "--selector",
        "app=sglang",
        "tier=gpu",
        "--service-discovery-namespace",
        "llm",
        "--service-discovery-port",
        "30000",
        "--model-id-from",
        "annotation:sglang.ai/model",
        "--drain-timeout-secs",
        "60",
    ])
    .load();
    #[cfg(not(feature = "kubernetes"))]
    assert!(c.unwrap_err().to_string().contains("without Kubernetes"));
    #[cfg(feature = "kubernetes")]
    {
        let c = c.unwrap();
        assert!(c.discovery.enabled);
        assert_eq!(c.server.drain_timeout_secs, 60);
        let pools = c.discovery.resolved_pools();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].selector, "app=sglang,tier=gpu");
        assert_eq!(pools[0].namespace.as_deref(), Some("llm"));
        assert_eq!(pools[0].port, 30000);
        assert_eq!(
            pools[0].model_id_from,
            Some(ModelIdFrom::Annotation("sglang.ai/model".into()))
        );
    }
    for (bad, needle) in [
        (&["--selector", "app"][..], "key=value"),
        (&["--model-id-from", "env:X"][..], "label:KEY"),
        (&["--service-discovery"][..], "discovery"),
    ] {
        let err = args(bad).load().unwrap_err().to_string();
        assert!(err.contains(needle), "{bad:?}: {err}");
    }
}

#[test]
fn pd_flags_build_a_disaggregated_pool() {
    let a = args(&[
        "--pd-disaggregation",
        "--pd-protocol",
        "vllm",
        "--prefill",
        "http://p0:30000",
        "8998",
        "--prefill",
        "http://p1:30000",
        "--decode",
        "http://d0:30000",
        "--decode",
        "http://d1:30000",
        "--decode-policy",
        "least_load",
        "--prefill-policy",
        "round_robin",
        "--pd-skip-prefill-tokens",
        "0",
    ]);
    let c = a.load().unwrap();
    assert!(c.pd.enabled);
    assert_eq!(c.pd.protocol, PdProtocol::Vllm);
    assert_eq!(c.pd.decode_policy.name(), "least_load");
    assert_eq!(c.routing.name(), "round_robin");
    assert_eq!(c.pd.skip_prefill_max_uncached_tokens, 0);
    let roles: Vec<(&str, WorkerRole, Option<u16>)> = c
        .workers
        .iter()
        .map(|w| (w.url.as_str(), w.role, w.bootstrap_port))
        .collect();
    assert_eq!(
        roles,
        vec![
            ("http://p0:30000", WorkerRole::Prefill, Some(8998)),
            ("http://p1:30000", WorkerRole::Prefill, None),
            ("http://d0:30000", WorkerRole::Decode, None),
            ("http://d1:30000", WorkerRole::Decode, None),
        ]
    );
    // The file form says the same.
    let file = Config::from_yaml(
        "pd: {enabled: true, decode_policy: {policy: cache_aware, cache_threshold: 0.5}}\n\
         workers:\n  - {url: 'http://p0:30000', role: prefill, bootstrap_port: 8998}\n\
         \x20 - {url: 'http://d0:30000', role: decode}\n",
    )
    .unwrap();
    file.validate().unwrap();
    assert_eq!(file.workers[0].bootstrap_port, Some(8998));
    assert_eq!(file.pd.protocol, PdProtocol::Sglang);
}

#[test]
fn pd_roles_must_fit_the_pool() {
    let err = |argv: &[&str]| args(argv).load().unwrap_err().to_string();
    let e = err(&[
        "--pd-disaggregation",
        "--worker-urls",
        "http://w:1",
        "--decode",
        "http://d:1",
    ]);
    assert!(
        e.contains("entry 0 (http://w:1)") && e.contains("role: prefill"),
        "{e}"
    );
    let e = err(&["--prefill", "http://p:1"]);
    assert!(
        e.contains("`role: prefill` needs a disaggregated pool"),
        "{e}"
    );
    let e = err(&["--pd-disaggregation", "--prefill", "http://p:1"]);
    assert!(e.contains("needs at least one decode worker"), "{e}");
    let e = err(&[
        "--pd-disaggregation",
        "--prefill",
        "http://p:1",
        "0",
        "--decode",
        "http://d:1",
    ]);
    assert!(
        e.contains("bootstrap port must be between 1 and 65535"),
        "{e}"
    );
    let e = err(&[
        "--pd-disaggregation",
        "--decode",
        "http://d:1",
        "--prefill",
        "8998",
    ]);
    assert!(
        e.contains("a bootstrap port follows its worker's URL"),
        "{e}"
    );
    let bad = Config::from_yaml(
        "pd: {enabled: true}\nworkers:\n  - {url: 'http://d:1', role: decode, bootstrap_port: 1}\n  - {url: 'http://p:1', role: prefill}\n",
    )
    .unwrap()
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("bootstrap_port is a prefill worker's setting"),
        "{bad}"
    );
    let bad = Config::from_yaml("pd: {skip_prefill_max_uncached_tokens: 99999999}\n")
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(bad.contains("pd.skip_prefill_max_uncached_tokens"), "{bad}");
    // With discovery on, the static lists may be empty: the pools have
    // the roles.
    let c = Config::from_yaml(
        "pd: {enabled: true}\ndiscovery:\n  enabled: true\n  pools:\n\
         \x20   - {selector: {app: p}, role: prefill}\n    - {selector: {app: d}, role: decode}\n",
    )
    .unwrap();
    #[cfg(feature = "kubernetes")]
    c.validate().unwrap();
    #[cfg(not(feature = "kubernetes"))]
    assert!(c.validate().is_err());
}

#[cfg(feature = "kubernetes")]
#[test]
fn pd_selectors_are_discovery_pools_with_their_roles() {
    let file = Config::from_yaml(
        "discovery:\n  pools:\n    - {selector: {app: old-prefill}, role: prefill}\n\
         \x20   - {selector: {app: old-decode}, role: decode, port: 9000}\n",
    )
    .unwrap();
    let mut c = file.clone();
    args(&[
        "--service-discovery",
        "--pd-disaggregation",
        "--prefill-selector",
        "app=sglang",
        "role=prefill",
        "--decode-selector",
        "app=sglang,role=decode",
        "--service-discovery-namespace",
        "llm",
        "--service-discovery-port",
        "30000",
        "--model-id-from",
        "label:model",
        "--bootstrap-port-annotation",
        "example.com/bootstrap",
    ])
    .apply(&mut c)
    .unwrap();
    c.validate().unwrap();
    let pools = c.discovery.resolved_pools();
    let seen: Vec<(&str, WorkerRole, u16, Option<&str>)> = pools
        .iter()
        .map(|p| {
            (
                p.selector.as_str(),
                p.role,
                p.port,
                p.bootstrap_port_annotation.as_deref(),
            )
        })
        .collect();
    // Each flag replaces the file's pools of its role.
    assert_eq!(
        seen,
        [
            (
                "app=sglang,role=prefill",
                WorkerRole::Prefill,
                30000,
                Some("example.com/bootstrap")
            ),
            ("app=sglang,role=decode", WorkerRole::Decode, 30000, None),
        ]
    );
    for pool in &pools {
        assert_eq!(pool.namespace.as_deref(), Some("llm"));
        assert_eq!(pool.model_id_from, Some(ModelIdFrom::Label("model".into())));
    }
    // ... and keeps the other role's.
    let mut c = file.clone();
    args(&[
        "--service-discovery",
        "--pd-disaggregation",
        "--prefill-selector",
        "app=new-prefill",
    ])
    .apply(&mut c)
    .unwrap();
    c.validate().unwrap();
    let pools: Vec<(String, WorkerRole, u16)> = c
        .discovery
        .resolved_pools()
        .into_iter()
        .map(|p| (p.selector, p.role, p.port))
        .collect();
    assert_eq!(
        pools,
        [
            ("app=old-decode".to_owned(), WorkerRole::Decode, 9000),
            ("app=new-prefill".to_owned(), WorkerRole::Prefill, 80),
        ]
    );
    // Unset, the annotation is smg's; a pool may name its own and a fixed
    // port for pods without it.
    let c = Config::from_yaml(
        "pd: {enabled: true}\ndiscovery:\n  enabled: true\n  pools:\n\
         \x20   - {selector: {app: p}, role: prefill}\n\
         \x20   - {selector: {app: q}, role: prefill, bootstrap_port: 8998, bootstrap_port_annotation: b/p}\n\
         \x20   - {selector: {app: d}, role: decode}\n",
    )
    .unwrap();
    c.validate().unwrap();
    let pools = c.discovery.resolved_pools();
    assert_eq!(
        pools[0].bootstrap_port_annotation.as_deref(),
        Some("sglang.ai/bootstrap-port")
    );
    assert_eq!(pools[0].bootstrap_port, None);
    assert_eq!(pools[1].bootstrap_port_annotation.as_deref(), Some("b/p"));
    assert_eq!(pools[1].bootstrap_port, Some(8998));
    assert_eq!(pools[2].bootstrap_port_annotation, None);
}

#[cfg(feature = "kubernetes")]
#[test]
fn discovery_pools_roles_must_fit_the_pool() {
    let err = |argv: &[&str]| {
        let mut full = vec!["--service-discovery"];
        full.extend_from_slice(argv);
        args(&full).load().unwrap_err().to_string()
    };
    let e = err(&[
        "--pd-disaggregation",
        "--selector",
        "app=sglang",
        "--prefill-selector",
        "app=p",
        "--decode-selector",
        "app=d",
    ]);
    assert!(
        e.starts_with(
            "invalid setting `discovery.selector`: `app=sglang` would discover regular workers"
        ) && e.contains("--prefill-selector and --decode-selector"),
        "{e}"
    );
    let e = err(&["--prefill-selector", "app=p"]);
    assert!(
        e.contains(
            "`discovery.pools`: entry 0 (app=p): `role: prefill` needs a disaggregated pool"
        ),
        "{e}"
    );
    let e = err(&["--pd-disaggregation", "--prefill-selector", "app=p"]);
    assert!(
        e.contains("needs at least one decode worker") && e.contains("--decode-selector"),
        "{e}"
    );
    // A static decode worker is enough beside a prefill pool.
    args(&[
        "--service-discovery",
        "--pd-disaggregation",
        "--prefill-selector",
        "app=p",
        "--decode",
        "http://d:1",
    ])
    .load()
    .unwrap();
    let e = err(&["--pd-disaggregation", "--decode-selector", "app"]);
    assert!(
        e.contains("`discovery.pools`: --decode-selector `app`: only `key=value` terms"),
        "{e}"
    );
    let e = err(&[
        "--pd-disaggregation",
        "--prefill-selector",
        "app=p",
        "--decode-selector",
        "app=d",
        "--bootstrap-port-annotation",
        "",
    ]);
    assert!(e.contains("discovery.bootstrap_port_annotation"), "{e}");
    let file = |pools: &str| {
        Config::from_yaml(&format!(
            "pd: {{enabled: true}}\ndiscovery:\n  enabled: true\n  pools:\n\
             \x20   - {{selector: {{app: d}}, role: decode}}\n{pools}"
        ))
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string()
    };
    let e = file("    - {selector: {app: w}}\n");
    assert!(
        e.contains("entry 1 (app=w): a disaggregated pool (pd.enabled, --pd-disaggregation) has only prefill and decode workers"),
        "{e}"
    );
    let e = file("    - {selector: {app: x}, role: decode, bootstrap_port: 8998}\n");
    assert!(
        e.contains("entry 1 (app=x): bootstrap_port and bootstrap_port_annotation are a prefill pool's settings"),
        "{e}"
    );
    let e = file("    - {selector: {app: p}, role: prefill, bootstrap_port: 0}\n");
    assert!(
        e.contains("entry 1: bootstrap_port must be between 1 and 65535"),
        "{e}"
    );
    let e = file("    - {selector: {app: p}, role: prefill, bootstrap_port_annotation: ''}\n");
    assert!(
        e.contains("entry 1: bootstrap_port_annotation must not be empty"),
        "{e}"
    );
}

#[test]
fn the_sync_stream_storage_comes_from_the_file_or_the_flag_and_nothing_else() {
    assert_eq!(Config::default().sync.stream_storage, StreamStorage::File);
    let by_file = Config::from_yaml("sync: {stream_storage: memory}\n").unwrap();
    assert_eq!(by_file.sync.stream_storage, StreamStorage::Memory);
    let by_flag = args(&["--sync-stream-storage", "memory"]).load().unwrap();
    assert_eq!(by_flag.sync.stream_storage, StreamStorage::Memory);
    let err = Config::from_yaml("sync: {stream_storage: disk}\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sync.stream_storage") && err.contains("`disk`"),
        "{err}"
    );
    assert!(
        Cli::try_parse_from(["serve", "--sync-stream-storage", "disk"]).is_err(),
        "an unknown kind is refused"
    );
}

#[test]
fn a_worker_entry_may_give_its_kv_cache_size() {
    let c = Config::from_yaml(
        "workers:\n  - {url: 'http://a:30000', kv_capacity_tokens: 400000}\n  - 'http://b:30000'\n",
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.workers[0].kv_capacity_tokens, Some(400_000));
    assert_eq!(c.workers[1].kv_capacity_tokens, None);
    for bad in ["-1", "lots"] {
        let e = Config::from_yaml(&format!(
            "workers:\n  - {{url: 'http://a:30000', kv_capacity_tokens: {bad}}}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("workers"), "{e}");
    }
    // 0 read as "not known" while keeping the worker from being asked.
    let e = Config::from_yaml("workers:\n  - {url: 'http://a:30000', kv_capacity_tokens: 0}\n")
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("workers") && e.contains("kv_capacity_tokens must be at least 1"),
        "{e}"
    );
}

/// A listed model no request can name is refused at load, the entry
/// named: the registry refused the worker on admission, so it stayed
/// pending for good.
#[test]
fn a_worker_listing_a_model_no_request_can_name_is_refused() {
    for models in ["['*']", "[m, '']"] {
        let yaml = format!("workers:\n  - {{url: 'http://a:30000', models: {models}}}\n");
        let e = Config::from_yaml(&yaml)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("entry 0") && e.contains("`models`"),
            "{models}: {e}"
        );
    }
}

/// A worker's key no `Authorization` header can carry is refused, the
/// entry named and the key not echoed.
#[test]
fn a_worker_key_no_header_carries_is_refused() {
    // YAML double-quoted scalars: a newline, a leading space, nothing.
    for key in [r#""sk-1\n""#, r#"" sk-1""#, r#""""#] {
        let yaml = format!("workers:\n  - {{url: 'http://a:30000', api_key: {key}}}\n");
        let e = Config::from_yaml(&yaml)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("entry 0") && e.contains("api_key must be"),
            "{key}: {e}"
        );
        assert!(!e.contains("sk-1"), "{key}: {e}");
    }
}

/// A worker's key may come from an environment variable the file names
/// (cargo sets `CARGO_PKG_NAME` for the tests it runs); a missing one, an
/// empty one or both forms at once stop loading, the entry named.
#[test]
fn a_worker_key_can_come_from_the_environment() {
    let dir = std::env::temp_dir().join(format!("radixgate-config-keyenv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.yaml");
    let load = |workers: &str| {
        std::fs::write(&file, format!("workers:\n{workers}")).unwrap();
        args(&["--config", file.to_str().unwrap()]).load()
    };
    let config = load("  - {url: http://w:1, api_key_env: CARGO_PKG_NAME}\n").unwrap();
    assert_eq!(
        config.workers[0].api_key.as_deref(),
        Some(env!("CARGO_PKG_NAME"))
    );
    for (workers, said) in [
        (
            "  - http://v:1\n  - {url: http://w:1, api_key_env: RADIXGATE_TEST_NO_SUCH_VARIABLE}\n",
            "RADIXGATE_TEST_NO_SUCH_VARIABLE",
        ),
        (
            "  - {url: http://w:1, api_key: k, api_key_env: CARGO_PKG_NAME}\n",
            "not both",
        ),
    ] {
        let err = load(workers).unwrap_err().to_string();
        assert!(err.contains("workers") && err.contains(said), "{err}");
    }
    let err = load(
        "  - http://v:1\n  - {url: http://w:1, api_key_env: RADIXGATE_TEST_NO_SUCH_VARIABLE}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("entry 1"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// A worker listed twice, in two spellings of one URL, is refused with
/// both entries named, before anything starts.
#[test]
fn a_worker_listed_twice_is_refused_naming_both_entries() {
    for (a, b) in [
        ("http://127.0.0.1:1", "http://127.0.0.1:1/"),
        ("http://Localhost:1", "http://localhost:1"),
        ("http://127.0.0.1:1", "'http://[::ffff:127.0.0.1]:01'"),
        ("'http://[::1]:1'", "'http://[0::1]:1'"),
        // The scheme's default port, spelled out or not, is one server.
        ("http://127.0.0.1", "http://127.0.0.1:80"),
        ("https://w.example:443", "https://W.example/"),
        ("'http://[::1]:0080'", "'http://[::1]'"),
    ] {
        let config = Config::from_yaml(&format!("workers:\n  - {a}\n  - http://c:3\n  - {b}\n"))
            .expect("parses");
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("workers"), "{err}");
        assert!(
            err.contains("entries 0") && err.contains(" and 2 "),
            "{err}"
        );
        assert!(
            err.contains(a.trim_matches('\'')) && err.contains(b.trim_matches('\'')),
            "{err}"
        );
    }
}

/// `--worker-urls` (and `RADIXGATE_WORKER_URLS`, which clap splits at
/// commas only) takes URLs separated by spaces or commas, and replaces
/// the file's workers; one that names no URL is refused, not taken for
/// an empty pool. Before, a variable separated by spaces, as the help
/// said, was refused as one URL "containing whitespace".
#[test]
fn worker_urls_split_at_spaces_and_commas_and_replace_the_files() {
    let mut config = Config {
        workers: vec![WorkerSpec::new("http://127.0.0.1:9")],
        ..Config::default()
    };
    let listed = "http://127.0.0.1:1  http://127.0.0.1:2";
    args(&["--worker-urls", listed, "http://127.0.0.1:3"])
        .apply(&mut config)
        .unwrap();
    let urls: Vec<&str> = config.workers.iter().map(|w| w.url.as_str()).collect();
    assert_eq!(
        urls,
        [
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            "http://127.0.0.1:3"
        ]
    );
    let err = args(&["--worker-urls", " "])
        .load()
        .unwrap_err()
        .to_string();
    assert!(err.contains("names no URL"), "{err}");
}

/// `responses.*` has flags (and their variables), checked as the file's
/// keys are.
#[test]
fn responses_settings_have_flags() {
    let flags = ["--responses-max-ids", "0", "--responses-max-age-secs", "60"];
    let config = args(&flags).load().unwrap();
    assert_eq!(config.responses.max_ids, 0);
    assert_eq!(config.responses.max_age_secs, 60);
    let refused = args(&["--responses-max-age-secs", "0"]).load();
    let err = refused.unwrap_err().to_string();
    assert!(err.contains("responses.max_age_secs"), "{err}");
}
