//! Log lines held to a length: a line longer than [`MAX_LINE`] bytes is
//! written as its first [`HEAD`] bytes and its length.
//!
//! The router's own lines quote what they are about in bounded excerpts,
//! but a dependency may log what it was sent whole (the Kubernetes client
//! logs a list answer it could not parse, up to the 64 MiB discovery
//! reads), and one such line per retry can be tens of megabytes: more than
//! a log collector takes, and as much again in memory while it is
//! formatted. A cut JSON line is written as a JSON line of its own (level,
//! target and message saying so, the head as a string field), so that the
//! collector still parses every line.
//!
//! The formatter writes each event with one `write_all`, which is where
//! the length is seen: [`CappedLine`] overrides it.

use std::io::{self, Write};
use tracing_subscriber::fmt::MakeWriter;

/// The longest line written whole, in bytes.
pub const MAX_LINE: usize = 64 << 10;

/// What is kept of a longer line, in bytes (less, to end on a character).
pub const HEAD: usize = 4 << 10;

/// Makes a [`CappedLine`] over what `make` gives: stderr in the router.
#[derive(Clone, Copy, Debug)]
pub struct Capped<F> {
    make: F,
    json: bool,
}

impl Capped<fn() -> io::Stderr> {
    /// Lines to stderr; `json`: the format's lines are JSON objects.
    pub fn stderr(json: bool) -> Self {
        Self::new(io::stderr, json)
    }
}

impl<F> Capped<F> {
    /// Lines to what `make` gives.
    pub fn new(make: F, json: bool) -> Self {
        Self { make, json }
    }
}

impl<'a, F, W> MakeWriter<'a> for Capped<F>
where
    F: Fn() -> W + 'a,
    W: Write,
{
    type Writer = CappedLine<W>;

    fn make_writer(&'a self) -> CappedLine<W> {
        CappedLine {
            inner: (self.make)(),
            json: self.json,
        }
    }
}

/// One event's writer: a line over [`MAX_LINE`] bytes is cut.
#[derive(Debug)]
pub struct CappedLine<W> {
    inner: W,
    json: bool,
}

impl<W: Write> Write for CappedLine<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Whatever is written goes as one line: never partly.
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, line: &[u8]) -> io::Result<()> {
        if line.len() <= MAX_LINE {
            return self.inner.write_all(line);
        }
        let head = String::from_utf8_lossy(&line[..HEAD]);
        // The lossy head may end in half a character: U+FFFD, dropped.
        let head = head.trim_end_matches('\u{fffd}');
        let cut = if self.json {
            let mut cut = serde_json::json!({
                "level": "WARN",
                "target": module_path!(),
                "fields": {
                    "message": format!("a log line of {} bytes was cut to its first {} (the rest is not written)", line.len(), head.len()),
                    "head": head,
                },
            })
            .to_string();
            cut.push('\n');
            cut
        } else {
            format!(
                "{head} … [a log line of {} bytes, cut to its first {}]\n",
                line.len(),
                head.len()
            )
        };
        self.inner.write_all(cut.as_bytes())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn written(json: bool, line: &str) -> String {
        let out = Shared::default();
        let sink = out.clone();
        let capped = Capped::new(move || sink.clone(), json);
        capped.make_writer().write_all(line.as_bytes()).unwrap();
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_line_up_to_the_cap_is_written_whole_and_a_longer_one_cut() {
        let whole = format!("{}\n", "a".repeat(MAX_LINE - 1));
        assert_eq!(written(false, &whole), whole);
        let long = format!("{}\n", "é".repeat(MAX_LINE));
        let cut = written(false, &long);
        assert!(cut.len() < HEAD + 100, "{} bytes", cut.len());
        assert!(cut.starts_with("éé"), "{cut}");
        assert!(cut.ends_with(&format!(
            "{} bytes, cut to its first {}]\n",
            long.len(),
            HEAD
        )));
    }

    #[test]
    fn a_cut_json_line_is_a_json_line() {
        let long = format!(
            "{{\"level\":\"WARN\",\"fields\":{{\"message\":\"{}\"}}}}\n",
            "x".repeat(MAX_LINE)
        );
        let cut = written(true, &long);
        assert!(
            cut.ends_with('\n') && cut.len() < HEAD + 300,
            "{}",
            cut.len()
        );
        let line: serde_json::Value = serde_json::from_str(cut.trim_end()).unwrap();
        assert_eq!(line["level"], "WARN");
        assert!(
            line["fields"]["head"]
                .as_str()
                .unwrap()
                .starts_with("{\"level\"")
        );
        let message = line["fields"]["message"].as_str().unwrap();
        assert!(message.contains(&long.len().to_string()), "{message}");
    }
}
