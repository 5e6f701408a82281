//! What one NATS message costs the thread that waits for it, before any of
//! radixgate's own work: the floor under sync's CPU per message at light
//! rates, where each message wakes its reader on its own
//! (docs/sync.md, "What a message costs before radixgate's work").
//!
//! A publisher thread sends `COUNT` messages of `BYTES` bytes at `RATE` a
//! second to a NATS server; two readers take them in turn, each on a
//! thread of its own that measures its own CPU time
//! (`/proc/thread-self/schedstat`, nanoseconds on the CPU) from its first
//! message to its last:
//! - `raw`: a blocking socket speaking the NATS protocol by hand (SUB,
//!   then reads until it has counted the messages): the kernel's wake-up
//!   and the reads, nothing else;
//! - `async-nats`: the client radixgate uses, a subscriber on a
//!   current-thread tokio runtime, as sync's receivers run.
//!
//! With a fifth argument `TICK_MS`, it measures a ticking reader instead,
//! as the load lane runs: asleep between ticks, it reads at each tick what
//! came meanwhile and sends one message (raw, then async-nats): CPU per tick.
//!
//! With a sixth argument `AWAKE_MS`, the same report is written by a
//! thread that is awake anyway every `AWAKE_MS` (as a serving thread is
//! between a stream's chunks), once a period has passed since the last:
//! that thread's CPU per period without reports and with them, twice each
//! in turn. The difference is what a report costs a thread that need not
//! wake for it.
//!
//! `cargo run --release -p radixgate --example nats_wake -- NATS_URL [RATE]
//! [COUNT] [BYTES] [TICK_MS] [AWAKE_MS]` (defaults 100, 1000, 200), with a
//! `nats-server` running at `NATS_URL` (`nats://127.0.0.1:PORT`).

#[path = "support/thread_cpu.rs"]
mod thread_cpu;

use futures::StreamExt;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use thread_cpu::thread_cpu_us;

const SUBJECT: &str = "radixgate.wake.bench";

/// `host:port` of a `nats://host:port` URL.
fn address(url: &str) -> &str {
    url.trim_start_matches("nats://").trim_end_matches('/')
}

/// Sends `count` messages at `rate` a second, after a short pause that
/// lets the reader subscribe.
fn publish(url: &str, rate: f64, count: usize, bytes: usize) -> std::io::Result<()> {
    let mut conn = TcpStream::connect(address(url))?;
    conn.set_nodelay(true)?;
    conn.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")?;
    let mut greeting = [0u8; 4096];
    let _ = conn.read(&mut greeting)?;
    std::thread::sleep(Duration::from_millis(500));
    let payload = vec![b'x'; bytes];
    let start = Instant::now();
    for i in 0..count {
        let mut frame = format!("PUB {SUBJECT} {bytes}\r\n").into_bytes();
        frame.extend_from_slice(&payload);
        frame.extend_from_slice(b"\r\n");
        conn.write_all(&frame)?;
        let due = start + Duration::from_secs_f64((i + 1) as f64 / rate);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    Ok(())
}

/// The raw reader: CPU microseconds per message over `count` messages.
fn read_raw(url: &str, count: usize) -> std::io::Result<f64> {
    let mut conn = TcpStream::connect(address(url))?;
    conn.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\n")?;
    conn.write_all(format!("SUB {SUBJECT} 1\r\nPING\r\n").as_bytes())?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    let mut payload = Vec::new();
    let (mut seen, mut first) = (0, 0.0);
    while seen < count {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if line.starts_with("PING") {
            conn.write_all(b"PONG\r\n")?;
        } else if let Some(header) = line.strip_prefix("MSG ") {
            // MSG <subject> <sid> <bytes>: the payload and its CRLF follow.
            let bytes: usize = header
                .split_whitespace()
                .last()
                .and_then(|b| b.parse().ok())
                .ok_or(std::io::ErrorKind::InvalidData)?;
            payload.resize(bytes + 2, 0);
            reader.read_exact(&mut payload)?;
            if seen == 0 {
                first = thread_cpu_us();
            }
            seen += 1;
        }
    }
    Ok((thread_cpu_us() - first) / (count - 1) as f64)
}

/// The async-nats reader: CPU microseconds per message over `count`.
fn read_async_nats(url: &str, count: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = async_nats::connect(url).await?;
        let mut messages = client.subscribe(SUBJECT).await?;
        client.flush().await?;
        let (mut seen, mut first) = (0, 0.0);
        while seen < count {
            if messages.next().await.is_none() {
                return Err("the subscription ended".into());
            }
            if seen == 0 {
                first = thread_cpu_us();
            }
            seen += 1;
        }
        Ok((thread_cpu_us() - first) / (count - 1) as f64)
    })
}

/// The next multiple of `period` after now, as an `Instant`.
fn next_tick(period: Duration) -> Instant {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let p = period.as_nanos();
    Instant::now() + Duration::from_nanos((p - wall.as_nanos() % p) as u64)
}

/// A raw connection subscribed to the messages, non-blocking, and the
/// frame a tick sends.
fn raw_ticker(url: &str, bytes: usize) -> std::io::Result<(TcpStream, Vec<u8>)> {
    let mut conn = TcpStream::connect(address(url))?;
    conn.set_nodelay(true)?;
    conn.write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false,\"echo\":false}\r\n")?;
    conn.write_all(format!("SUB {SUBJECT} 1\r\n").as_bytes())?;
    conn.set_nonblocking(true)?;
    let mut frame = format!("PUB {SUBJECT}.own {bytes}\r\n").into_bytes();
    frame.extend(std::iter::repeat_n(b'y', bytes));
    frame.extend_from_slice(b"\r\n");
    Ok((conn, frame))
}

/// One raw tick: reads what came (answering the server's pings), sends
/// `frame`.
fn raw_tick(conn: &mut TcpStream, buf: &mut [u8], frame: &[u8]) -> std::io::Result<()> {
    loop {
        match conn.read(buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                if buf[..n].windows(4).any(|w| w == b"PING") {
                    conn.write_all(b"PONG\r\n")?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    conn.write_all(frame)
}

/// A ticking reader, as the load lane: asleep between ticks, not waiting
/// on its socket; at each tick it reads what came and sends one message.
/// Raw: a non-blocking socket read and a write. CPU microseconds a tick.
fn tick_raw(url: &str, period: Duration, ticks: usize, bytes: usize) -> std::io::Result<f64> {
    let (mut conn, frame) = raw_ticker(url, bytes)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut first = 0.0;
    for i in 0..ticks {
        let due = next_tick(period);
        while let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if i == 1 {
            first = thread_cpu_us();
        }
        raw_tick(&mut conn, &mut buf, &frame)?;
    }
    Ok((thread_cpu_us() - first) / (ticks - 1) as f64)
}

/// A thread awake every `awake` that, with `report`, also does the raw
/// tick's read and write once `period` has passed since the last: CPU
/// microseconds per period.
fn tick_inline(
    url: &str,
    period: Duration,
    awake: Duration,
    ticks: usize,
    bytes: usize,
    report: bool,
) -> std::io::Result<f64> {
    let (mut conn, frame) = raw_ticker(url, bytes)?;
    let mut buf = vec![0u8; 64 * 1024];
    let start = Instant::now();
    let first = thread_cpu_us();
    let mut last = Instant::now();
    while start.elapsed() < period * ticks as u32 {
        std::thread::sleep(awake);
        if report && last.elapsed() >= period {
            last = Instant::now();
            raw_tick(&mut conn, &mut buf, &frame)?;
        }
    }
    Ok((thread_cpu_us() - first) / ticks as f64)
}

/// Lets the runtime poll its socket and takes what came, until two rounds
/// in a row bring nothing (as the load lane's `drain`).
async fn drain(messages: &mut async_nats::Subscriber) {
    use futures::FutureExt as _;
    let mut quiet = 0;
    while quiet < 2 {
        tokio::task::yield_now().await;
        let mut got = false;
        while let Some(Some(_)) = messages.next().now_or_never() {
            got = true;
        }
        quiet = if got { 0 } else { quiet + 1 };
    }
}

/// The same with async-nats, driven as the load lane drives it: the
/// runtime runs only inside a tick.
fn tick_async_nats(
    url: &str,
    period: Duration,
    ticks: usize,
    bytes: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (client, mut messages) = runtime.block_on(async {
        let client = async_nats::ConnectOptions::new()
            .no_echo()
            .connect(url)
            .await?;
        let messages = client.subscribe(SUBJECT).await?;
        client.flush().await?;
        Ok::<_, Box<dyn std::error::Error>>((client, messages))
    })?;
    let payload = bytes::Bytes::from(vec![b'y'; bytes]);
    let mut first = 0.0;
    for i in 0..ticks {
        let due = next_tick(period);
        while let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::park_timeout(wait);
        }
        if i == 1 {
            first = thread_cpu_us();
        }
        runtime.block_on(async {
            drain(&mut messages).await;
            let _ = client
                .publish(format!("{SUBJECT}.own"), payload.clone())
                .await;
            drain(&mut messages).await;
        });
    }
    Ok((thread_cpu_us() - first) / (ticks - 1) as f64)
}

/// Runs `measure` on a thread of its own while a publisher thread sends
/// `count` messages of `bytes` at `rate` a second; its figure.
fn beside_publisher(
    url: &str,
    rate: f64,
    count: usize,
    bytes: usize,
    measure: impl FnOnce(String) -> Result<f64, String> + Send + 'static,
) -> Result<f64, Box<dyn std::error::Error>> {
    let publisher = {
        let url = url.to_owned();
        std::thread::spawn(move || publish(&url, rate, count, bytes))
    };
    let url = url.to_owned();
    let cost = std::thread::spawn(move || measure(url))
        .join()
        .map_err(|_| "a reader panicked")??;
    publisher.join().map_err(|_| "the publisher panicked")??;
    Ok(cost)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(url) = args.first().cloned() else {
        return Err("usage: nats_wake NATS_URL [RATE] [COUNT] [BYTES] [TICK_MS] [AWAKE_MS]".into());
    };
    let number = |i: usize, default: f64| -> Result<f64, Box<dyn std::error::Error>> {
        match args.get(i) {
            Some(a) => Ok(a.parse().map_err(|_| format!("not a number: {a}"))?),
            None => Ok(default),
        }
    };
    let rate = number(1, 100.0)?;
    let count = number(2, 1000.0)? as usize;
    let bytes = number(3, 200.0)? as usize;
    if rate <= 0.0 || count < 2 {
        return Err("RATE must be above 0 and COUNT at least 2".into());
    }
    if let Some(tick_ms) = args.get(4) {
        let period = Duration::from_millis(tick_ms.parse()?);
        // As many ticks as the publisher's messages last.
        let ticks = (count as f64 / rate / period.as_secs_f64().max(1e-3)) as usize;
        if period.is_zero() || ticks < 2 {
            return Err("TICK_MS must be above 0 and under COUNT / RATE / 2 seconds".into());
        }
        if let Some(awake) = args.get(5) {
            let awake = Duration::from_millis(awake.parse()?);
            for report in [false, true, false, true] {
                let cost = beside_publisher(&url, rate, count, bytes, move |url| {
                    tick_inline(&url, period, awake, ticks, bytes, report)
                        .map_err(|e| e.to_string())
                })?;
                println!("{{\"inline_report\": {report}, \"cpu_us_per_period\": {cost:.1}}}");
            }
            return Ok(());
        }
        for reader in ["raw", "async-nats"] {
            let cost = beside_publisher(&url, rate, count, bytes, move |url| match reader {
                "raw" => tick_raw(&url, period, ticks, bytes).map_err(|e| e.to_string()),
                _ => tick_async_nats(&url, period, ticks, bytes).map_err(|e| e.to_string()),
            })?;
            println!(
                "{{\"ticker\": \"{reader}\", \"period_ms\": {}, \"rate_per_s\": {rate}, \"ticks\": {ticks}, \"bytes\": {bytes}, \"cpu_us_per_tick\": {cost:.1}}}",
                period.as_millis()
            );
        }
        return Ok(());
    }
    for reader in ["raw", "async-nats"] {
        let cost = beside_publisher(&url, rate, count, bytes, move |url| match reader {
            "raw" => read_raw(&url, count).map_err(|e| e.to_string()),
            _ => read_async_nats(&url, count).map_err(|e| e.to_string()),
        })?;
        println!(
            "{{\"reader\": \"{reader}\", \"rate_per_s\": {rate}, \"messages\": {count}, \"bytes\": {bytes}, \"cpu_us_per_message\": {cost:.1}}}"
        );
    }
    Ok(())
}
