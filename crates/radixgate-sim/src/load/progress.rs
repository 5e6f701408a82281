//! A one-line progress display on stderr, drawn only when stderr is a
//! terminal (so logs and pipes stay clean).

use std::io::{IsTerminal, Write};
use std::time::Duration;

/// The progress line.
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    drawn: bool,
}

impl Progress {
    /// A display, on only if `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Self {
        Self {
            enabled: wanted && std::io::stderr().is_terminal(),
            drawn: false,
        }
    }

    /// Redraws with `done` of `total` (a fraction in 0..=1), counts and time.
    pub fn draw(&mut self, fraction: f64, done: u64, failed: u64, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let width = 30;
        let filled = ((fraction.clamp(0.0, 1.0)) * width as f64) as usize;
        let bar = format!("{}{}", "#".repeat(filled), " ".repeat(width - filled));
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r[{bar}] {done} done, {failed} failed, {:.1} s ",
            elapsed.as_secs_f64()
        );
        let _ = err.flush();
        self.drawn = true;
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr(), "\r{}\r", " ".repeat(70));
            self.drawn = false;
        }
    }
}
