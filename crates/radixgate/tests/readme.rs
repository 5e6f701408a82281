//! The README as a new user follows it: every shell block runs, word for
//! word, and every figure it quotes matches the run or results file it
//! comes from.
//!
//! Each ```sh block is preceded by a comment saying how to run it:
//! - `<!-- readme-test: run -->`: the block as one bash script, which must
//!   exit 0 within five minutes;
//! - `<!-- readme-test: background "TEXT" -->`: the block in the background
//!   until its output shows TEXT; it keeps running for the blocks after it
//!   and is stopped at the next `## ` section;
//! - `<!-- readme-test: each "TEXT" -->`: each line started on its own
//!   until its output shows TEXT, then stopped (alternatives, such as two
//!   ways to start the router on one port);
//! - `<!-- readme-test: skip: REASON -->`.
//!
//! A block without one fails the test, so a new command cannot go
//! unchecked. The blocks run from the repository root with this test's
//! build of `radixgate` first on `PATH` (standing in for `cargo install`),
//! inside a network namespace of their own (`unshare`), so the README's
//! fixed ports (30000, 32100) never meet another test's or a process on
//! the machine, and its example addresses (10.0.0.x) lead nowhere. The one
//! rewrite: `cargo run --release -p radixgate --` becomes `radixgate`, and
//! the `cargo test` line is not run (it is what runs this).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).unwrap()
}

#[derive(Debug, PartialEq)]
enum How {
    Run,
    Background(String),
    Each(String),
    Skip,
}

#[derive(Debug)]
struct Block {
    /// README line of the opening fence.
    line: usize,
    /// The `## ` section it sits in.
    section: usize,
    how: How,
    text: String,
}

/// The README's shell blocks with their directives; panics on a block
/// without one, or a directive it does not know.
fn blocks(readme: &str) -> Vec<Block> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut blocks = Vec::new();
    let mut section = 0;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with("## ") {
            section += 1;
        }
        if line.starts_with("```") && i > 0 {
            let fence = line.trim_start_matches('`');
            let end = (i + 1..lines.len())
                .find(|&j| lines[j].starts_with("```"))
                .unwrap_or_else(|| panic!("README line {}: unclosed block", i + 1));
            if matches!(fence, "sh" | "bash" | "shell" | "console") {
                let directive = lines[i - 1]
                    .strip_prefix("<!-- readme-test: ")
                    .and_then(|d| d.strip_suffix(" -->"))
                    .unwrap_or_else(|| {
                        panic!(
                            "README line {}: a shell block needs a `<!-- readme-test: … -->` \
                             line above it",
                            i + 1
                        )
                    });
                blocks.push(Block {
                    line: i + 1,
                    section,
                    how: parse_how(directive, i + 1),
                    text: lines[i + 1..end].join("\n"),
                });
            }
            i = end;
        }
        i += 1;
    }
    blocks
}

fn parse_how(directive: &str, line: usize) -> How {
    let quoted = |rest: &str| {
        rest.strip_prefix('"')
            .and_then(|r| r.strip_suffix('"'))
            .unwrap_or_else(|| panic!("README line {line}: quote the text to wait for"))
            .to_owned()
    };
    if directive == "run" {
        How::Run
    } else if let Some(rest) = directive.strip_prefix("background ") {
        How::Background(quoted(rest))
    } else if let Some(rest) = directive.strip_prefix("each ") {
        How::Each(quoted(rest))
    } else if directive.starts_with("skip: ") {
        How::Skip
    } else {
        panic!("README line {line}: unknown directive {directive:?}")
    }
}

/// The block as the test runs it: the one rewrite, and the `cargo test`
/// line left out.
fn as_run(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("cargo test"))
        .map(|l| l.replace("cargo run --release -p radixgate --", "radixgate"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Single-quotes `text` for bash.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// One bash script that runs every block in order, each block's output in
/// `logs/block-LINE.log`; it exits non-zero at the first failure, saying
/// which block.
fn script(blocks: &[Block], logs: &Path) -> String {
    let mut s = String::from(
        r#"set -u
ip link set lo up
bg=()
# stop PID: SIGTERM to its process group, then up to 60 s for it to end;
# one that does not is killed and named (a hang here hung the test).
stop() {
  kill -- -"$1" 2>/dev/null
  for _ in $(seq 600); do
    kill -0 "$1" 2>/dev/null || { wait "$1" 2>/dev/null; return 0; }
    sleep 0.1
  done
  kill -9 -- -"$1" 2>/dev/null; wait "$1" 2>/dev/null
  echo "did not stop within 60 s of SIGTERM: process group $1"; return 1
}
stop_background() {
  local stuck=0
  for pid in "${bg[@]}"; do stop "$pid" || stuck=1; done
  bg=()
  return $stuck
}
trap stop_background EXIT
# wait_for LOG TEXT PID: until LOG shows TEXT (120 s), while PID lives.
wait_for() {
  for _ in $(seq 1200); do
    grep -qF -- "$2" "$1" && return 0
    kill -0 "$3" 2>/dev/null || { echo "exited before printing: $2"; return 1; }
    sleep 0.1
  done
  echo "not printed within 120 s: $2"; return 1
}
fail() { echo "README block at line $1 failed: $2"; echo "--- its output:"; cat "$3"; exit 1; }
"#,
    );
    let mut section = 0;
    for block in blocks.iter().filter(|b| b.how != How::Skip) {
        if block.section != section {
            s.push_str("stop_background || fail 0 'a background block did not stop' /dev/null\n");
            section = block.section;
        }
        let log = logs.join(format!("block-{}.log", block.line));
        let log = quote(&log.display().to_string());
        let text = as_run(&block.text);
        let line = block.line;
        let _ = writeln!(s, "echo '== README line {line}'");
        match &block.how {
            How::Run => {
                let _ = writeln!(
                    s,
                    "timeout 300 bash -e -c {} >{log} 2>&1 || fail {line} \"exit $?\" {log}",
                    quote(&text)
                );
            }
            How::Background(wait) => {
                let _ = writeln!(
                    s,
                    "setsid bash -c {} >{log} 2>&1 & bg+=($!)\n\
                     wait_for {log} {} $! || fail {line} 'did not start' {log}",
                    quote(&text),
                    quote(wait)
                );
            }
            How::Each(wait) => {
                for command in text.lines().filter(|l| !l.trim().is_empty()) {
                    let _ = writeln!(
                        s,
                        "setsid bash -c {} >{log} 2>&1 & pid=$!\n\
                         wait_for {log} {} $pid || fail {line} {} {log}\n\
                         stop $pid || fail {line} 'did not stop' {log}",
                        quote(command),
                        quote(wait),
                        quote(&format!("did not start: {command}"))
                    );
                }
            }
            How::Skip => unreachable!(),
        }
    }
    s.push_str(
        "stop_background || fail 0 'a background block did not stop' /dev/null\necho '== every block ran'\n",
    );
    s
}

#[test]
fn every_shell_block_of_the_readme_runs_as_written() {
    let text = readme();
    let blocks = blocks(&text);
    let ran = blocks.iter().filter(|b| b.how != How::Skip).count();
    assert!(ran >= 5, "only {ran} blocks run: {blocks:#?}");

    let work = std::env::temp_dir().join(format!("radixgate-readme-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let script_path = work.join("readme.sh");
    std::fs::write(&script_path, script(&blocks, &work)).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_radixgate")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("unshare")
        .args(["--net", "--map-root-user", "bash"])
        .arg(&script_path)
        .current_dir(repo())
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .output()
        .expect("unshare (util-linux) runs the README in a network namespace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("== every block ran"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The demo's figures in "Results" are the ones the demo prints.
    let demo = blocks
        .iter()
        .find(|b| b.text.contains("-- demo"))
        .expect("the set-up block runs the demo");
    let printed = std::fs::read_to_string(work.join(format!("block-{}.log", demo.line))).unwrap();
    let quoted = demo_figures(&text);
    // The in-process workers run on wall-clock time, so a loaded 2-core
    // machine moves the demo's hit rates: 17 runs here (release and debug
    // builds, some beside two busy loops) gave round_robin 44.1-47.3% and
    // cache_aware 79.7-81.5%, and one CI run 42.6%. Figures left from older
    // code were 4 points off (77.5% against 81.5%). So a figure more than
    // 3 points off gets one more run of the demo (`--no-serve`), and must
    // match that one: a stale figure misses both, a stall misses one.
    let first = demo_hit_rates(&printed);
    if !within(quoted, first, 3.0) {
        let again = Command::new(env!("CARGO_BIN_EXE_radixgate"))
            .args(["demo", "--no-serve"])
            .current_dir(repo())
            .env_remove("RUST_LOG")
            .output()
            .expect("the demo runs again");
        let second = demo_hit_rates(&String::from_utf8_lossy(&again.stdout));
        assert!(
            within(quoted, second, 3.0),
            "README quotes cache_aware and round_robin at {quoted:?}% hit rate; \
             the demo measured {first:?}% and then {second:?}%"
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// The demo's (cache_aware, round_robin) hit rates from its printed table.
fn demo_hit_rates(printed: &str) -> (f64, f64) {
    let hit_rate = |policy: &str| -> f64 {
        let row = printed
            .lines()
            .find(|l| l.starts_with(policy))
            .unwrap_or_else(|| panic!("no {policy} row in the demo's output:\n{printed}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        cols[1].trim_end_matches('%').parse().unwrap()
    };
    (hit_rate("cache_aware"), hit_rate("round_robin"))
}

/// Both pairs of hit rates are within `points` of each other.
fn within(a: (f64, f64), b: (f64, f64), points: f64) -> bool {
    (a.0 - b.0).abs() <= points && (a.1 - b.1).abs() <= points
}

/// The two hit rates the README's "Results" quotes for the demo.
fn demo_figures(readme: &str) -> (f64, f64) {
    let results = section(readme, "## Results");
    let item = results
        .split("\n- ")
        .find(|i| i.starts_with("`radixgate demo`"))
        .expect("Results quotes the demo");
    let percents: Vec<f64> = item
        .split_whitespace()
        .filter_map(|w| {
            w.trim_end_matches([',', ';', '.'])
                .strip_suffix('%')
                .and_then(|n| n.parse().ok())
        })
        .collect();
    assert_eq!(percents.len(), 2, "{item}");
    (percents[0], percents[1])
}

fn section<'a>(readme: &'a str, heading: &str) -> &'a str {
    let start = readme
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading}"));
    let rest = &readme[start + heading.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

/// The rows of a results file's "vs smg" table: (measure, ratio column).
fn versus_smg(file: &str) -> Vec<(String, String)> {
    let Some(start) = file.find("vs smg, same run") else {
        return Vec::new();
    };
    file[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| measure"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            (cols[1].to_owned(), cols[4].to_owned())
        })
        .collect()
}

/// The newest file in bench/results whose "vs smg" table has a row for
/// which `wanted` holds, with those rows.
fn newest_with(wanted: impl Fn(&str) -> bool) -> (String, Vec<(String, String)>) {
    let dir = repo().join("bench/results");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    // Named by start time (`2026-11-30T2003Z-…`), so the order is the age.
    names.sort();
    names
        .into_iter()
        .rev()
        .find_map(|name| {
            let rows = versus_smg(&std::fs::read_to_string(dir.join(&name)).unwrap());
            rows.iter().any(|(m, _)| wanted(m)).then_some((name, rows))
        })
        .expect("a results file against smg")
}

#[test]
fn the_readme_quotes_the_newest_results_against_smg() {
    let text = readme();
    // Compared with line breaks and indents folded to single spaces.
    let results = section(&text, "## Results")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");

    let (quality, rows) = newest_with(|m| m.starts_with("hit rate, "));
    let hits: Vec<f64> = rows
        .iter()
        .filter(|(m, _)| m.starts_with("hit rate, "))
        .map(|(_, r)| r.parse().unwrap())
        .collect();
    let ttft: Vec<f64> = rows
        .iter()
        .filter(|(m, _)| m.starts_with("TTFT mean ms, "))
        .map(|(_, r)| r.trim_end_matches('×').parse().unwrap())
        .collect();
    let (lo, hi) = ttft
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    let expected = format!(
        "[{quality}](bench/results/{quality}): hit rate at or above smg's on {} of {} \
         workloads; mean TTFT {lo:.2}×–{hi:.2}× smg's, lower on {} of {};",
        hits.iter().filter(|&&d| d >= 0.0).count(),
        hits.len(),
        ttft.iter().filter(|&&r| r < 1.0).count(),
        ttft.len(),
    );
    assert!(
        results.contains(&expected),
        "README's Results should read:\n{expected}\n---\n{results}"
    );

    let wrk = "wrk c=32 4KiB";
    let (cost, rows) = newest_with(|m| m.ends_with(wrk));
    let ratio = |measure: &str| {
        rows.iter()
            .find(|(m, _)| m == measure)
            .unwrap_or_else(|| panic!("{cost} lacks {measure}"))
            .1
            .clone()
    };
    let expected = format!(
        "[{cost}](bench/results/{cost}): {} smg's CPU per request under wrk and {} its \
         throughput",
        ratio(&format!("CPU s / 1k req, {wrk}")),
        ratio(&format!("throughput req/s, {wrk}")),
    );
    assert!(
        results.contains(&expected),
        "README's Results should read:\n{expected}\n---\n{results}"
    );
}

#[test]
fn a_shell_block_without_a_directive_is_refused() {
    let unmarked = "## A\n\ntext\n```sh\nradixgate version\n```\n";
    let refused = std::panic::catch_unwind(|| blocks(unmarked));
    assert!(refused.is_err());
    let marked = "## A\n<!-- readme-test: each \"x\" -->\n```sh\na\nb\n```\n```yaml\nk: v\n```\n";
    let found = blocks(marked);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].how, How::Each("x".into()));
    assert_eq!(found[0].text, "a\nb");
}
