//! The `radixgate` binary as a user meets it: help, precise start-up errors,
//! and the layering file < environment < flags.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn radixgate() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_radixgate"));
    // Start from a clean slate: no RADIXGATE_* from the caller's shell.
    for (key, _) in std::env::vars() {
        if key.starts_with("RADIXGATE_") {
            c.env_remove(key);
        }
    }
    c
}

/// Runs to completion; returns (success, stderr).
fn run(c: &mut Command) -> (bool, String) {
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Spawns `c` and reads its stderr until it listens (true; still running)
/// or exits (false).
fn spawn_listening(c: &mut Command) -> (std::process::Child, bool) {
    let mut child = c
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut listening = false;
    for line in lines {
        if line.unwrap().contains("radixgate listening") {
            listening = true;
            break;
        }
    }
    (child, listening)
}

/// Starts `serve` and waits for it to listen (true) or exit (false).
fn starts(c: &mut Command) -> bool {
    let (mut child, listening) = spawn_listening(c);
    let _ = child.kill();
    let _ = child.wait();
    listening
}

#[test]
fn help_lists_the_sglang_compatible_flags() {
    let out = radixgate().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--worker-urls",
        "--policy",
        "--cache-threshold",
        "--balance-abs-threshold",
        "--balance-rel-threshold",
        "--eviction-interval-secs",
        "--max-tree-size",
        "--api-key",
        "--prometheus-port",
        "--health-check-interval-secs",
        "--retry-max-retries",
        "--cb-failure-threshold",
        "--max-concurrent-requests",
        "--queue-size",
        "--queue-timeout-secs",
        "--request-timeout-secs",
        "--log-level",
        "--log-json",
        "--config",
        "--admin-api-key",
        "--admin-access",
        "--metrics-api-key",
        "--worker-allowlist",
        // smg's discovery flags.
        "--service-discovery",
        "--selector",
        "--service-discovery-namespace",
        "--service-discovery-port",
        "--model-id-from",
        "--drain-timeout-secs",
        // ... and its disaggregated pool's.
        "--prefill-selector",
        "--decode-selector",
        "--bootstrap-port-annotation",
    ] {
        assert!(help.contains(flag), "{flag} missing from serve --help");
    }
    // The admin plane's rule is stated where the flags are.
    for rule in [
        "never opens it",
        "127.0.0.0/8 or ::1",
        "[default: loopback]",
        // smg's annotation for a prefill pod's bootstrap port.
        "[default: sglang.ai/bootstrap-port]",
    ] {
        assert!(help.contains(rule), "`{rule}` missing from serve --help");
    }
}

#[test]
fn empty_keys_are_start_up_errors() {
    for (flag, key) in [
        ("--api-key", "server.api_key"),
        ("--admin-api-key", "server.admin_api_key"),
        ("--metrics-api-key", "server.metrics_api_key"),
    ] {
        let (ok, err) = run(radixgate().args(["serve", "--port", "0", flag, ""]));
        assert!(!ok, "{flag} ''");
        assert!(
            err.contains(key) && err.contains("must not be empty"),
            "{flag}: {err}"
        );
    }
    // An empty variable (say, from an unset shell variable) is no better.
    let (ok, err) = run(radixgate()
        .args(["serve", "--port", "0"])
        .env("RADIXGATE_API_KEY", ""));
    assert!(!ok && err.contains("server.api_key"), "{err}");
    let dir = std::env::temp_dir().join(format!("radixgate-cli-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("empty-key.yaml");
    std::fs::write(&file, "server:\n  metrics_api_key: ''\n").unwrap();
    let (ok, err) =
        run(radixgate().args(["serve", "--port", "0", "--config", file.to_str().unwrap()]));
    assert!(!ok && err.contains("server.metrics_api_key"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    // The client key never doubles as the admin key.
    let (ok, err) = run(radixgate().args([
        "serve",
        "--port",
        "0",
        "--api-key",
        "k",
        "--admin-api-key",
        "k",
    ]));
    assert!(!ok && err.contains("server.admin_api_key"), "{err}");
    let (ok, err) =
        run(radixgate().args(["serve", "--port", "0", "--worker-allowlist", "10.0.0.0/33"]));
    assert!(!ok && err.contains("server.worker_allowlist"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_settings_are_precise_start_up_errors() {
    let (ok, err) = run(radixgate().args(["serve", "--port", "0", "--cache-threshold", "2"]));
    assert!(!ok);
    assert!(err.contains("cache_threshold"), "{err}");
    let (ok, err) = run(radixgate().args(["serve", "--config", "/no/such/file.yaml"]));
    assert!(!ok);
    assert!(
        err.contains("cannot read config file /no/such/file.yaml"),
        "{err}"
    );
    // A cause is printed once, not again after the message that quotes it.
    let dir = std::env::temp_dir().join(format!("radixgate-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(&file, "server:\n  prot: 1\n").unwrap();
    let (ok, err) = run(radixgate().args(["serve", "--config", file.to_str().unwrap()]));
    assert!(!ok);
    assert_eq!(err.matches("unknown field `prot`").count(), 1, "{err}");
    // A routing setting under a policy that does not take it: whose it
    // is, and where.
    std::fs::write(
        &file,
        "server:\n  port: 0\nrouting:\n  policy: round_robin\n  cache_threshold: 0.5\n",
    )
    .unwrap();
    let (ok, err) = run(radixgate().args(["serve", "--config", file.to_str().unwrap()]));
    assert!(!ok);
    assert!(
        err.contains(
            "routing.cache_threshold: applies only to cache_aware; round_robin takes no \
             settings at line 5 column 20"
        ),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let (ok, err) = run(radixgate().args(["serve", "--worker-urls", "localhost:8000"]));
    assert!(!ok);
    assert!(err.contains("must start with http://"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A trace recording that cannot be written: which file, and why.
    let (ok, err) = run(radixgate().args([
        "serve",
        "--port",
        "0",
        "--record-trace",
        "/no/such/dir/trace.jsonl",
    ]));
    assert!(!ok);
    assert!(
        err.contains("cannot open the trace recording /no/such/dir/trace.jsonl"),
        "{err}"
    );
    // An OTLP collector's port out of range: no export could ever reach it.
    let err = stderr_until(
        radixgate().args([
            "serve",
            "--port",
            "0",
            "--otlp-endpoint",
            "http://127.0.0.1:99999",
        ]),
        "radixgate listening",
    );
    assert!(
        err.contains("tracing.otlp_endpoint") && err.contains("bad port `99999` (1-65535)"),
        "{err}"
    );
    // A tune without a trace file, or on one that is not a trace.
    let (ok, err) = run(radixgate().args(["tune", "--trace", "/no/such/trace.jsonl"]));
    assert!(!ok);
    assert!(err.contains("/no/such/trace.jsonl"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // A grid value that is no finite number is named with its flag, where
    // the routing setting refused it as a string under `--sweep`.
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../traces/mooncake_synthetic.jsonl"
    );
    for (flag, value, want) in [
        (
            "--cache-threshold",
            "0.1,NaN",
            "--cache-threshold: NaN is not a finite number",
        ),
        (
            "--balance-rel-threshold",
            "inf",
            "--balance-rel-threshold: inf is not a finite",
        ),
        (
            "--sweep",
            "hot_spot.margin=0.5,nan",
            "nan is not a finite number",
        ),
    ] {
        let (ok, err) =
            run(radixgate().args(["tune", "--trace", trace, "--workers", "2", flag, value]));
        assert!(!ok, "{flag} {value}");
        assert!(err.contains(want), "{flag} {value}: {err}");
    }
}

/// Spawns `c` and collects its stderr until a line holds `needle`, it
/// exits, or 20 s pass; then ends it.
fn stderr_until(c: &mut Command, needle: &str) -> String {
    let mut child = c
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut seen = String::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        let Ok(line) = rx.recv_timeout(left) else {
            break;
        };
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(needle) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

/// What `serve --port 0 FLAGS` logs up to "radixgate listening" (the start-up
/// warnings come before it).
fn start_up_log(flags: &[&str]) -> String {
    stderr_until(
        radixgate().args(["serve", "--port", "0"]).args(flags),
        "radixgate listening",
    )
}

/// Queue settings without a concurrency limit do nothing: said at start-up,
/// naming the setting that is missing, rather than left for an operator
/// to find under load that nothing ever queues.
#[test]
fn queue_settings_without_a_concurrency_limit_are_warned_of() {
    let needle = "take effect only with admission.max_concurrent_requests";
    let err = stderr_until(
        radixgate().args(["serve", "--port", "0", "--queue-size", "500"]),
        needle,
    );
    assert!(err.contains(needle), "{err}");
    assert!(err.contains("--max-concurrent-requests N"), "{err}");
    // With a limit, or with the queue as it comes, nothing is said.
    let quiet = start_up_log(&["--queue-size", "500", "--max-concurrent-requests", "8"]);
    assert!(!quiet.contains(needle), "{quiet}");
    let quiet = start_up_log(&[]);
    assert!(!quiet.contains(needle), "{quiet}");
}

#[test]
fn log_levels_are_checked_and_take_sglangs_names() {
    // SGLang's router takes Python's names: `warning` shows the warnings.
    let err = stderr_until(
        radixgate().args(["serve", "--port", "0", "--log-level", "warning"]),
        "the worker pool is empty",
    );
    assert!(err.contains("the worker pool is empty"), "{err}");
    assert!(!err.contains("radixgate listening"), "{err}");
    // A word that is no level would silence every line: refused, named,
    // from the flag, its variable or the file alike.
    let mut flag = radixgate();
    flag.args(["serve", "--port", "0", "--log-level", "verbose"]);
    let mut variable = radixgate();
    variable
        .args(["serve", "--port", "0"])
        .env("RADIXGATE_LOG_LEVEL", "verbose");
    for mut c in [flag, variable] {
        let err = stderr_until(&mut c, "radixgate: error");
        assert!(
            err.contains("invalid setting `log.level`: `verbose`")
                && err.contains("is not a level"),
            "{err}"
        );
    }
    let err = stderr_until(
        radixgate().args(["serve", "--port", "0", "--log-level", "radixgate=loud"]),
        "radixgate: error",
    );
    assert!(err.contains("`loud` is not a level"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn role_selectors_are_read_from_flags_and_environment_and_checked() {
    // A prefill selector, from its variable, without a disaggregated pool.
    let (ok, err) = run(radixgate()
        .args(["serve", "--port", "0", "--service-discovery"])
        .env("RADIXGATE_PREFILL_SELECTOR", "app=sglang,component=prefill"));
    assert!(!ok);
    assert!(
        err.contains(
            "entry 0 (app=sglang,component=prefill): `role: prefill` needs a disaggregated pool"
        ),
        "{err}"
    );
    // A disaggregated pool with a regular selector.
    let (ok, err) = run(radixgate()
        .args([
            "serve",
            "--port",
            "0",
            "--service-discovery",
            "--pd-disaggregation",
            "--selector",
            "app=sglang",
            "--prefill-selector",
            "app=p",
        ])
        .env("RADIXGATE_DECODE_SELECTOR", "app=d"));
    assert!(!ok);
    assert!(
        err.contains("discovery.selector") && err.contains("would discover regular workers"),
        "{err}"
    );
    let (ok, err) = run(radixgate()
        .args([
            "serve",
            "--port",
            "0",
            "--service-discovery",
            "--pd-disaggregation",
            "--prefill-selector",
            "app=p",
            "--decode-selector",
            "app=d",
        ])
        .env("RADIXGATE_BOOTSTRAP_PORT_ANNOTATION", ""));
    assert!(!ok);
    assert!(err.contains("discovery.bootstrap_port_annotation"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn file_then_environment_then_flags() {
    let dir = std::env::temp_dir().join(format!("radixgate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad-threshold.yaml");
    std::fs::write(
        &file,
        "routing: {policy: cache_aware, cache_threshold: 2.0}\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();

    // The file alone is invalid...
    let (ok, err) = run(radixgate().args(["serve", "--port", "0", "--config", file]));
    assert!(!ok, "{err}");
    // ...the environment overrides it...
    assert!(starts(
        radixgate()
            .args(["serve", "--port", "0", "--config", file])
            .env("RADIXGATE_CACHE_THRESHOLD", "0.5")
    ));
    // ...and a flag overrides the environment.
    let (ok, err) = run(radixgate()
        .args(["serve", "--port", "0", "--cache-threshold", "3"])
        .env("RADIXGATE_CACHE_THRESHOLD", "0.5"));
    assert!(!ok && err.contains("cache_threshold"), "{err}");
    assert!(starts(
        radixgate()
            .args(["serve", "--port", "0", "--cache-threshold", "0.5"])
            .env("RADIXGATE_CACHE_THRESHOLD", "3")
    ));
    std::fs::remove_dir_all(dir).unwrap();
}

/// clap names a refused value by its flag; where the value came from the
/// flag's variable, the message names the variable too.
#[test]
fn a_refused_value_from_a_variable_names_the_variable() {
    let (ok, err) = run(radixgate().arg("serve").env("RADIXGATE_CONFIG", ""));
    assert!(!ok, "{err}");
    assert!(
        err.contains("RADIXGATE_CONFIG is set but empty")
            && err.contains("--config is not on the command line"),
        "{err}"
    );
    let (ok, err) = run(radixgate().arg("serve").env("RADIXGATE_PORT", "80a"));
    assert!(!ok, "{err}");
    assert!(
        err.contains("invalid value '80a' for '--port")
            && err.contains("RADIXGATE_PORT gave this value"),
        "{err}"
    );
    // The flag given, the variable is not what was refused.
    for argv in [
        &["serve", "--port", "80b"][..],
        &["serve", "--port=80b"][..],
    ] {
        let (ok, err) = run(radixgate().args(argv).env("RADIXGATE_PORT", "8000"));
        assert!(!ok && err.contains("'80b'"), "{err}");
        assert!(!err.contains("RADIXGATE_PORT"), "{err}");
    }
}

/// A loopback port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

/// A `radixgate worker` process on an ephemeral port, killed on drop.
struct Workers {
    child: std::process::Child,
    url: String,
}

impl Workers {
    fn start(extra: &[&str]) -> Self {
        let mut child = radixgate()
            .args(["worker", "--port", "0", "--instant"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let line = lines
            .find_map(|l| l.ok().filter(|l| l.contains("listening on ")))
            .expect("the worker did not start");
        let url = line.rsplit(' ').next().unwrap().to_owned();
        // Keep draining stderr so the worker never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, url }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn load(url: &str, extra: &[&str]) -> (bool, String, String) {
    let out = radixgate()
        .args(["load", "--url", url, "--requests", "20", "--no-progress"])
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_metrics_port_in_use_is_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let (ok, err) = run(radixgate().args(["serve", "--port", "0", "--prometheus-port", &port]));
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "cannot listen on 127.0.0.1:{port} for metrics.prometheus_port (--prometheus-port"
        )),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A trust store that yields no certificate (an image without a CA
/// bundle, `SSL_CERT_FILE` at a missing or empty file) stops the start-up:
/// the error names where the certificates were looked for, which the
/// loader's own "No CA certificates were loaded from the system" did not.
#[test]
fn a_trust_store_with_no_certificate_is_named() {
    let dir = std::env::temp_dir().join(format!("radixgate-cli-trust-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let missing = dir.join("missing.pem");
    for file in [&empty, &missing] {
        let (ok, err) = run(radixgate()
            .env_remove("SSL_CERT_DIR")
            .env("SSL_CERT_FILE", file)
            .args([
                "serve",
                "--port",
                "0",
                "--worker-urls",
                "http://127.0.0.1:9",
            ]));
        assert!(!ok, "{err}");
        assert!(
            err.contains(&format!("SSL_CERT_FILE={}", file.display()))
                && err.contains("SSL_CERT_DIR unset"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn load_fails_when_requests_fail() {
    // Nothing listens: every request fails, the run fails, and says why.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let (ok, stdout, stderr) = load(&dead, &["--timeout", "5"]);
    assert!(!ok, "{stdout}{stderr}");
    assert!(
        stderr.contains("20 of 20 requests failed (100.0%: connect 20)")
            && stderr.contains("--max-error-rate 0")
            && stderr.contains("is a server listening"),
        "{stderr}"
    );
    assert!(stdout.contains("0 ok, 20 failed"), "report first: {stdout}");
    // Even a lenient threshold does not pass a run where all failed.
    let (ok, _, stderr) = load(&dead, &["--max-error-rate", "0.99"]);
    assert!(!ok && stderr.contains("--max-error-rate 0.99"), "{stderr}");
    let (ok, _, stderr) = load(&dead, &["--max-error-rate", "2"]);
    assert!(!ok && stderr.contains("from 0 to 1"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // Healthy simulated workers: the run passes.
    let healthy = Workers::start(&[]);
    let (ok, stdout, stderr) = load(&healthy.url, &[]);
    assert!(ok, "{stdout}{stderr}");
    assert!(stdout.contains("20 ok, 0 failed"), "{stdout}");

    // Half the requests get HTTP 500: failed at the default threshold,
    // passed at one above the observed rate.
    let faulty = Workers::start(&["--error-rate", "0.5"]);
    let (ok, _, stderr) = load(&faulty.url, &[]);
    assert!(!ok && stderr.contains("http_500"), "{stderr}");
    assert!(!stderr.contains("listening"), "{stderr}");
    let (ok, stdout, stderr) = load(&faulty.url, &["--max-error-rate", "1"]);
    assert!(ok, "{stdout}{stderr}");
}

/// Every subcommand states defaults one way, clap's `[default: …]`: no
/// `(default …)`, `default:` or `by default` prose, no bare `[16]`.
#[test]
fn help_states_defaults_one_way() {
    let out = radixgate().arg("--help").output().unwrap();
    let top = String::from_utf8(out.stdout).unwrap();
    let commands: Vec<&str> = top
        .split_once("Commands:")
        .unwrap()
        .1
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    for expected in [
        "demo", "serve", "worker", "load", "simulate", "tune", "version",
    ] {
        assert!(commands.contains(&expected), "{expected} in {commands:?}");
    }
    for command in commands {
        for flag in ["--help", "-h"] {
            let out = radixgate().args([command, flag]).output().unwrap();
            let help = String::from_utf8(out.stdout).unwrap();
            // Every `[…]` is clap's: a default, a variable, possible
            // values, a config key, or a usage placeholder (`[OPTIONS]`).
            for group in help.split('[').skip(1) {
                let inner = group.split(']').next().unwrap();
                let clap_own = ["default: ", "env: ", "possible values: ", "config: "]
                    .iter()
                    .any(|p| inner.starts_with(p))
                    || inner.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                assert!(clap_own, "{command} {flag}: `[{inner}]` in:\n{help}");
            }
            // "default" appears only as `[default: …]` (or in a flag name).
            let lower = help.to_lowercase();
            for (at, _) in lower.match_indices("default") {
                let before = &lower[..at];
                let ok = before.ends_with('[') && lower[at..].starts_with("default: ")
                    || before.ends_with("--")
                    || before.ends_with('<');
                assert!(
                    ok,
                    "{command} {flag}: `{}`",
                    &help[at.saturating_sub(30)..at + 20]
                );
            }
        }
    }
}

/// The demo's progress line is for terminals: into a pipe, no `\r` redraws.
#[test]
fn demo_draws_no_progress_line_into_a_pipe() {
    let out = radixgate()
        .args([
            "demo",
            "--no-serve",
            "--workers",
            "2",
            "--requests",
            "8",
            "--rate",
            "50",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains('\r'), "{stderr:?}");
    assert!(
        stderr.contains("radixgate demo: cache_aware: 8 requests"),
        "{stderr}"
    );
}

/// The `THP_enabled` line of a process's /proc status: 0 once the process
/// turned transparent huge pages off for itself.
fn thp_enabled(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .expect("a THP_enabled line (Linux 5.0 on)")
        .trim()
        .to_owned()
}

/// `serve`'s THP_enabled once it listens.
fn serving_thp(c: &mut Command) -> String {
    let (mut child, listening) = spawn_listening(c.args(["serve", "--port", "0"]));
    assert!(listening, "serve started");
    let thp = thp_enabled(child.id());
    let _ = child.kill();
    let _ = child.wait();
    thp
}

#[cfg(target_os = "linux")]
#[test]
fn the_router_runs_without_transparent_huge_pages_unless_asked() {
    assert_eq!(serving_thp(&mut radixgate()), "0");
    // MIMALLOC_ALLOW_THP=1 leaves the flag as the process inherited it.
    let inherited = thp_enabled(std::process::id());
    assert_eq!(
        serving_thp(radixgate().env("MIMALLOC_ALLOW_THP", "1")),
        inherited
    );
}

/// `demo --workers` is held to what one process can serve: a number far
/// past it is refused at once, naming the flag and its range (it ran for
/// half a minute and ended in "Too many open files").
#[test]
fn demo_workers_past_its_range_is_refused_at_once() {
    for workers in ["0", "100000"] {
        let (ok, err) = run(radixgate().args(["demo", "--no-serve", "--workers", workers]));
        assert!(!ok, "{workers}");
        assert!(
            err.contains("--workers") && err.contains("1..=64"),
            "{workers}: {err}"
        );
    }
}

/// A switch's variable takes the words operators write (`1`, `yes`, `on`;
/// `0`, `no`, `off`), as well as `true` and `false`; anything else is a
/// start-up error naming the flag.
#[test]
fn switch_variables_take_one_and_zero_and_yes_and_no() {
    for (value, json) in [
        ("1", true),
        ("yes", true),
        ("On", true),
        ("0", false),
        ("no", false),
    ] {
        let mut child = radixgate()
            .args(["serve", "--port", "0"])
            .env("RADIXGATE_LOG_JSON", value)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let listening = BufReader::new(child.stderr.take().unwrap())
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("radixgate listening"));
        let _ = child.kill();
        let _ = child.wait();
        let line = listening.unwrap_or_else(|| panic!("{value}: did not start"));
        assert_eq!(line.starts_with('{'), json, "{value}: {line}");
    }
    let (ok, err) = run(radixgate()
        .args(["serve", "--port", "0"])
        .env("RADIXGATE_LOG_JSON", "maybe"));
    assert!(!ok && err.contains("--log-json"), "{err}");
}

/// One server listed with and without its scheme's default port is one
/// worker listed twice: start-up stops naming both entries, rather than
/// probing, counting and routing to it as two workers.
#[test]
fn a_worker_with_and_without_its_default_port_is_listed_twice() {
    let serve = |urls: [&str; 2]| {
        let mut c = radixgate();
        c.args(["serve", "--port", "0", "--worker-urls"]).args(urls);
        c
    };
    let urls = ["http://127.0.0.1", "http://127.0.0.1:80/"];
    assert!(!starts(&mut serve(urls)), "{urls:?} started");
    let (ok, err) = run(&mut serve(urls));
    assert!(!ok);
    assert!(
        err.contains("workers") && err.contains("entries 0") && err.contains("list it once"),
        "{err}"
    );
}

/// A setting of a feature that is off does nothing: said at start-up,
/// naming the setting and the switch it needs, rather than taken without
/// a word (`--pd-protocol vllm` without `--pd-disaggregation` left the
/// pool regular, `--selector` without `--service-discovery` discovered
/// nothing, `--kv-events-port` without `--kv-events` subscribed to
/// nothing).
#[test]
fn settings_of_a_feature_that_is_off_are_warned_of() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["--pd-protocol", "vllm"],
            "`pd.protocol` is set but does nothing without `pd.enabled` (--pd-disaggregation",
        ),
        (
            &["--selector", "app=sglang"],
            "`discovery.selector` is set but does nothing without `discovery.enabled` \
             (--service-discovery",
        ),
        (
            &["--kv-events-port", "6000"],
            "`kv_events.port` is set but does nothing without `kv_events.enabled` (--kv-events",
        ),
        (
            &["--prometheus-host", "0.0.0.0"],
            "`metrics.prometheus_host` is set but does nothing without \
             `metrics.prometheus_port` (--prometheus-port",
        ),
        (
            &["--disable-circuit-breaker", "--cb-failure-threshold", "9"],
            "`circuit_breaker.failure_threshold` is set but does nothing without \
             `circuit_breaker.enabled`",
        ),
    ];
    for (flags, needle) in cases {
        let err = start_up_log(flags);
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
    // With the feature on, or with nothing of it set, nothing is said.
    let needle = "is set but does nothing without";
    let quiet = start_up_log(&["--prometheus-port", "0", "--prometheus-host", "127.0.0.1"]);
    assert!(!quiet.contains(needle), "{quiet}");
    let quiet = start_up_log(&[]);
    assert!(!quiet.contains(needle), "{quiet}");
}

/// A switch's variable set to false overrides the file's `true`, as the
/// documented layering (file < environment < flags) says: it was read
/// as "not given", and the file's setting stayed on without a word.
#[test]
fn a_switch_variable_set_to_false_overrides_the_file() {
    let dir = std::env::temp_dir().join(format!("radixgate-switch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("switches.yaml");
    std::fs::write(
        &file,
        "log: {json: true}\npd: {enabled: true}\n\
         circuit_breaker: {enabled: false}\nworkers: [\"http://127.0.0.1:9\"]\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    // The file alone: a disaggregated pool with a regular worker.
    let (ok, err) = run(radixgate().args(["serve", "--port", "0", "--config", file]));
    assert!(!ok && err.contains("disaggregated pool"), "{err}");
    let mut child = radixgate()
        .args(["serve", "--port", "0", "--config", file])
        .env("RADIXGATE_PD_DISAGGREGATION", "false")
        .env("RADIXGATE_LOG_JSON", "0")
        .env("RADIXGATE_DISABLE_CIRCUIT_BREAKER", "no")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let lines: Vec<String> = BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .take_while(|line| !line.contains("radixgate listening"))
        .chain(std::iter::once(String::new()))
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    std::fs::remove_dir_all(dir).unwrap();
    let seen = lines.join("\n");
    assert!(!seen.contains("error"), "did not start: {seen}");
    assert!(!seen.contains("\"level\""), "log.json stayed on: {seen}");
}

/// Only the prefix policies (cache_aware, prefill_aware) read the workers'
/// KV events: under another one the router subscribed to every worker and
/// tokenized every prompt for nothing, and said nothing of it.
#[test]
fn kv_events_under_a_policy_that_reads_none_are_warned_of() {
    let needle = "`kv_events.enabled` does nothing for routing with \
                  `routing.policy: round_robin`";
    let err = start_up_log(&["--kv-events", "--policy", "round_robin"]);
    assert!(err.contains(needle), "{err}");
    assert!(err.contains("cache_aware or prefill_aware"), "{err}");
    // Under a policy that reads them, or with them off, nothing is said.
    let quiet = "`kv_events.enabled` does nothing";
    for flags in [
        &["--kv-events", "--policy", "prefill_aware"][..],
        &["--kv-events"],
        &["--policy", "round_robin"],
    ] {
        let log = start_up_log(flags);
        assert!(log.contains("radixgate listening"), "{flags:?}: {log}");
        assert!(!log.contains(quiet), "{flags:?}: {log}");
    }
}

/// Clap counted a flag's variable as the flag itself: a switch's variable
/// set to its false word (`RADIXGATE_DISABLE_RETRIES=false`, as a chart
/// writes its defaults) refused `--retry-max-retries 5` as "cannot be used
/// with '--disable-retries'", a flag nobody gave, and `RADIXGATE_POLICY`
/// refused `--prefill-policy` though both named the same policy.
#[test]
fn variables_conflict_with_flags_only_where_they_disagree() {
    let mut c = radixgate();
    c.args(["serve", "--port", "0", "--retry-max-retries", "5"])
        .env("RADIXGATE_DISABLE_RETRIES", "false");
    assert!(starts(&mut c));
    let mut c = radixgate();
    c.args(["serve", "--port", "0", "--prefill-policy", "round_robin"])
        .env("RADIXGATE_POLICY", "round_robin");
    assert!(starts(&mut c));
    assert!(starts(radixgate().args([
        "serve",
        "--port",
        "0",
        "--disable-retries",
        "--retry-max-retries",
        "0"
    ])));
    // A real contradiction is refused, naming both flags and variables.
    let (ok, err) = run(radixgate()
        .args(["serve", "--port", "0", "--retry-max-retries", "5"])
        .env("RADIXGATE_DISABLE_RETRIES", "1"));
    assert!(!ok, "{err}");
    assert!(
        err.contains("--disable-retries (RADIXGATE_DISABLE_RETRIES)")
            && err.contains("--retry-max-retries 5 (RADIXGATE_RETRY_MAX_RETRIES)"),
        "{err}"
    );
    let (ok, err) = run(radixgate()
        .args(["serve", "--port", "0", "--prefill-policy", "cache_aware"])
        .env("RADIXGATE_POLICY", "round_robin"));
    assert!(!ok, "{err}");
    assert!(
        err.contains("--policy round_robin (RADIXGATE_POLICY)")
            && err.contains("--prefill-policy cache_aware (RADIXGATE_PREFILL_POLICY)"),
        "{err}"
    );
}

/// Each KV-event block limit is named by its own key when it is out of
/// range: `max_blocks_total: 0` was reported as `max_blocks_per_worker`.
#[test]
fn a_kv_event_block_limit_is_named_by_its_own_key() {
    let dir = std::env::temp_dir().join(format!("radixgate-blocks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for key in ["max_blocks_total", "max_blocks_per_worker"] {
        let file = dir.join(format!("{key}.yaml"));
        std::fs::write(&file, format!("kv_events: {{{key}: 0}}\n")).unwrap();
        let (ok, err) =
            run(radixgate().args(["serve", "--port", "0", "--config", file.to_str().unwrap()]));
        assert!(!ok, "{err}");
        assert!(
            err.contains(&format!(
                "invalid setting `kv_events.{key}`: must be at least 1"
            )),
            "{err}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}
