//! The bench scripts' own checks: the examples in their docstrings, which
//! hold the arithmetic every recorded figure comes from (a target counted
//! as met, a rate over successful requests), run by Python's `doctest`.

use std::path::Path;
use std::process::Command;

#[test]
fn the_report_scripts_examples_hold() {
    examples_hold("bench/report.py");
}

/// bench/run.py's checks of what a run needs, made before anything runs.
#[test]
fn the_run_scripts_examples_hold() {
    examples_hold("bench/run.py");
}

fn examples_hold(script: &str) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("python3")
        .args(["-m", "doctest", "-v", script])
        .current_dir(&repo)
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Something was checked: a script whose examples all vanished would
    // pass with none.
    assert!(text.contains("passed and 0 failed"), "{script}: {text}");
    assert!(!text.contains("\n0 passed"), "{script}: {text}");
}
