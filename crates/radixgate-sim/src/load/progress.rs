//! A one-line progress display on stderr, drawn only when stderr is a
//! terminal (so logs and pipes stay clean): a bar, requests done and
//! failed, the token hit rate so far, and the time. `radixgate load` draws
//! it, and so does `radixgate demo` through the same load driver.

use std::io::{IsTerminal, Write};
use std::time::Duration;

/// The progress line.
#[derive(Debug)]
pub struct Progress {
    enabled: bool,
    /// Characters of the line last drawn (0: nothing on screen).
    drawn: usize,
}

/// What the line shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// Share of the run done, 0..=1 (of `--requests`, else of `--duration`).
    pub fraction: f64,
    /// Requests finished, failed or not.
    pub done: u64,
    /// Requests failed.
    pub failed: u64,
    /// Token hit rate so far, once a response reported usage.
    pub hit_rate: Option<f64>,
    /// Time since the first request.
    pub elapsed: Duration,
}

impl Snapshot {
    /// The line, e.g. `[#####     ] 120 done, 0 failed, hit 76.3%, 5.0 s`.
    pub fn line(&self) -> String {
        let width = 30;
        let filled = (self.fraction.clamp(0.0, 1.0) * width as f64) as usize;
        let hit = self
            .hit_rate
            .map_or_else(|| "-".to_owned(), |h| format!("{:.1}%", h * 100.0));
        format!(
            "[{}{}] {} done, {} failed, hit {hit}, {:.1} s",
            "#".repeat(filled),
            " ".repeat(width - filled),
            self.done,
            self.failed,
            self.elapsed.as_secs_f64()
        )
    }
}

impl Progress {
    /// A display, on only if `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Self {
        Self {
            enabled: wanted && std::io::stderr().is_terminal(),
            drawn: 0,
        }
    }

    /// Redraws the line.
    pub fn draw(&mut self, now: &Snapshot) {
        if !self.enabled {
            return;
        }
        // A trailing space for the cursor, then blanks over what is left
        // of a longer previous line.
        let line = format!("{} ", now.line());
        let len = line.chars().count();
        let pad = self.drawn.saturating_sub(len);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}{}", " ".repeat(pad));
        let _ = err.flush();
        self.drawn = len.max(self.drawn);
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if self.drawn > 0 {
            let _ = write!(std::io::stderr(), "\r{}\r", " ".repeat(self.drawn));
            self.drawn = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_progress_counts_and_hit_rate() {
        let mut now = Snapshot {
            fraction: 0.5,
            done: 120,
            failed: 2,
            hit_rate: Some(0.7634),
            elapsed: Duration::from_millis(5020),
        };
        assert_eq!(
            now.line(),
            format!(
                "[{}{}] 120 done, 2 failed, hit 76.3%, 5.0 s",
                "#".repeat(15),
                " ".repeat(15)
            )
        );
        now.hit_rate = None;
        now.fraction = 7.0;
        assert!(now.line().starts_with(&format!("[{}]", "#".repeat(30))));
        assert!(now.line().contains(", hit -, "), "{}", now.line());
    }
}
