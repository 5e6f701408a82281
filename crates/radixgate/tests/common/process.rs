//! The `radixgate` binary as a process: started on a free loopback port,
//! its stderr read line by line, killed (by its own handle) on drop.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The binary with no `RADIXGATE_*` or `NO_COLOR` from the caller's shell.
pub fn radixgate() -> Command {
    // This module is also compiled into the examples, where cargo sets no
    // binary path (and none of them starts the binary).
    let binary = option_env!("CARGO_BIN_EXE_radixgate").unwrap_or("radixgate");
    let mut c = Command::new(binary);
    for (key, _) in std::env::vars() {
        if key.starts_with("RADIXGATE_") || key == "RUST_LOG" || key == "NO_COLOR" {
            c.env_remove(key);
        }
    }
    c
}

/// A loopback port nobody listens on (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `radixgate serve`, its stderr read line by line on a thread.
pub struct Serve {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
    /// The lines logged before `radixgate listening` that no
    /// [`wait_for`](Self::wait_for) has passed yet: the router logs what
    /// its workers' first probes found before it listens.
    early: std::collections::VecDeque<String>,
}

impl Serve {
    /// Starts `serve` on a free loopback port with `args`, and waits for
    /// it to listen; returns it and its address.
    pub fn start(args: &[&str]) -> (Self, String) {
        Self::start_with_env(&[], args)
    }

    /// [`start`](Self::start), with these environment variables set.
    pub fn start_with_env(env: &[(&str, &str)], args: &[&str]) -> (Self, String) {
        let mut child = radixgate()
            .envs(env.iter().copied())
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut serve = Self {
            child,
            lines,
            seen: Vec::new(),
            early: std::collections::VecDeque::new(),
        };
        let listening = serve.wait_for("radixgate listening");
        serve.early = serve.seen[..serve.seen.len() - 1].iter().cloned().collect();
        // A text line's `addr=…`, or a JSON line's `fields.addr`.
        let addr = listening
            .split_whitespace()
            .find_map(|field| field.strip_prefix("addr="))
            .map(str::to_owned)
            .or_else(|| {
                let line: serde_json::Value = serde_json::from_str(&listening).ok()?;
                line["fields"]["addr"].as_str().map(str::to_owned)
            })
            .unwrap_or_else(|| panic!("no addr in {listening:?}"));
        (serve, format!("http://{addr}"))
    }

    /// Waits (at most 20 s) for a line containing `needle`, passing the
    /// lines before it; a line logged before the router listened counts
    /// too, once.
    pub fn wait_for(&mut self, needle: &str) -> String {
        while let Some(line) = self.early.pop_front() {
            if line.contains(needle) {
                return line;
            }
        }
        loop {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Sends SIGTERM (with `kill`, to this process's id) and waits for it
    /// to exit; returns whether it exited with success. Panics (after
    /// killing it) if it is still running 60 s later: a hang guard.
    pub fn terminate(&mut self) -> bool {
        self.signal("TERM");
        self.wait_exit()
    }

    /// Sends the signal `name` (`TERM`, `INT`, `HUP`) with `kill`, to this
    /// process's id.
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{name} {pid}");
    }

    /// Waits for the process to exit; returns whether it exited with
    /// success. Panics (after killing it) if it is still running 60 s
    /// later: a hang guard.
    pub fn wait_exit(&mut self) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("still running 60 s after the signal");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Lines read so far and any that arrive within `wait`.
    pub fn drain(&mut self, wait: Duration) -> &[String] {
        while let Ok(line) = self.lines.recv_timeout(wait) {
            self.seen.push(line);
        }
        &self.seen
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
