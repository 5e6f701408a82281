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

/// Starts `serve` and waits for it to listen (true) or exit (false).
fn starts(c: &mut Command) -> bool {
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
    ] {
        assert!(help.contains(flag), "{flag} missing from serve --help");
    }
    // The admin plane's rule is stated where the flags are.
    for rule in [
        "never opens it",
        "127.0.0.0/8 or ::1",
        "[default: loopback]",
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
    std::fs::remove_dir_all(&dir).unwrap();
    let (ok, err) = run(radixgate().args(["serve", "--worker-urls", "localhost:8000"]));
    assert!(!ok);
    assert!(err.contains("must start with http://"), "{err}");
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
