//! What waking a thread costs on this machine, with no radixgate code and
//! no network: the floor under every figure of sync's CPU at light rates
//! (docs/sync.md, "Waking a thread on this machine, and with no idle CPUs").
//!
//! - `sleep PERIOD_MS COUNT`: a thread sleeps `PERIOD_MS` milliseconds
//!   `COUNT` times; its CPU time per wake-up. On an idle machine each
//!   wake-up brings a CPU out of its idle state.
//! - `pingpong COUNT`: two threads hand one byte back and forth `COUNT`
//!   times over a socket pair; the CPU time of both per round trip (two
//!   wake-ups, each finding the other thread just gone to sleep). The
//!   scheduler tends to keep both on one CPU.
//! - `echo PATH` and `pingpong COUNT PATH`: the same between two processes
//!   over a Unix socket at PATH, each pinned to a CPU of its own by
//!   `taskset`, so that every hand-over wakes the other CPU, as a sync
//!   message from one replica to another does. Each prints its own CPU
//!   time per round trip:
//!   `taskset -c 1 wake_cost echo /tmp/w.sock & taskset -c 0 wake_cost
//!   pingpong 20000 /tmp/w.sock`.
//!
//! CPU time is the thread's time on the CPU (`/proc/thread-self/schedstat`,
//! nanoseconds). `bench/wake_cost.sh` runs every mode as is and then with
//! every CPU kept busy by a loop at `SCHED_IDLE` priority (which any woken
//! thread preempts at once), and writes the figures as JSON lines.

#[path = "support/thread_cpu.rs"]
mod thread_cpu;

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};
use thread_cpu::thread_cpu_us;

/// CPU microseconds per wake-up of a thread that sleeps `period` `count`
/// times, and the mean wall time of a period.
fn sleep_cost(period: Duration, count: u32) -> (f64, Duration) {
    let (cpu0, wall0) = (thread_cpu_us(), Instant::now());
    for _ in 0..count {
        std::thread::sleep(period);
    }
    (
        (thread_cpu_us() - cpu0) / f64::from(count),
        wall0.elapsed() / count,
    )
}

/// Sends every byte it reads back until the other end closes; returns the
/// round trips served and this thread's CPU microseconds meanwhile.
fn echo(mut there: UnixStream) -> std::io::Result<(u32, f64)> {
    let cpu0 = thread_cpu_us();
    let (mut served, mut byte) = (0u32, [0u8; 1]);
    while there.read(&mut byte)? == 1 {
        there.write_all(&byte)?;
        served += 1;
    }
    Ok((served, thread_cpu_us() - cpu0))
}

/// Hands one byte to `here` and waits for it back, `count` times: this
/// thread's CPU microseconds per round trip, and the mean wall time of one.
fn pingpong(mut here: UnixStream, count: u32) -> std::io::Result<(f64, Duration)> {
    let (cpu0, wall0) = (thread_cpu_us(), Instant::now());
    let mut byte = [7u8; 1];
    for _ in 0..count {
        here.write_all(&byte)?;
        here.read_exact(&mut byte)?;
    }
    Ok((
        (thread_cpu_us() - cpu0) / f64::from(count),
        wall0.elapsed() / count,
    ))
}

/// CPU microseconds of both threads per round trip of one byte, and the
/// mean wall time of a round trip.
fn pingpong_cost(count: u32) -> std::io::Result<(f64, Duration)> {
    let (here, there) = UnixStream::pair()?;
    let echoing = std::thread::spawn(move || echo(there));
    let (mine, wall) = pingpong(here, count)?;
    let (_, theirs) = echoing.join().expect("the echo thread panicked")?;
    Ok((mine + theirs / f64::from(count), wall))
}

fn usage() -> ! {
    eprintln!(
        "usage: wake_cost sleep PERIOD_MS COUNT | wake_cost pingpong COUNT [PATH] | wake_cost echo PATH"
    );
    std::process::exit(2)
}

fn number(arg: Option<&String>) -> u32 {
    arg.and_then(|a| a.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| usage())
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("sleep") => {
            let (ms, count) = (number(args.get(1)), number(args.get(2)));
            let (cpu, wall) = sleep_cost(Duration::from_millis(u64::from(ms)), count);
            println!(
                "{{\"mode\":\"sleep\",\"period_ms\":{ms},\"count\":{count},\
                 \"cpu_us_per_wake\":{cpu:.1},\"wall_ms_per_period\":{:.3}}}",
                wall.as_secs_f64() * 1e3
            );
        }
        Some("pingpong") => {
            let count = number(args.get(1));
            let (cpu, wall, who) = match args.get(2) {
                Some(path) => {
                    let (cpu, wall) = pingpong(UnixStream::connect(path)?, count)?;
                    (cpu, wall, "this process")
                }
                None => {
                    let (cpu, wall) = pingpong_cost(count)?;
                    (cpu, wall, "both threads")
                }
            };
            println!(
                "{{\"mode\":\"pingpong\",\"count\":{count},\"cpu_of\":\"{who}\",\
                 \"cpu_us_per_round_trip\":{cpu:.1},\"wall_us_per_round_trip\":{:.1}}}",
                wall.as_secs_f64() * 1e6
            );
        }
        Some("echo") => {
            let path = args.get(1).unwrap_or_else(|| usage());
            let _ = std::fs::remove_file(path);
            let listener = UnixListener::bind(path)?;
            let (there, _) = listener.accept()?;
            let (served, cpu) = echo(there)?;
            let _ = std::fs::remove_file(path);
            println!(
                "{{\"mode\":\"echo\",\"count\":{served},\"cpu_of\":\"this process\",\
                 \"cpu_us_per_round_trip\":{:.1}}}",
                cpu / f64::from(served.max(1))
            );
        }
        _ => usage(),
    }
    Ok(())
}
