//! A thread's own CPU time, shared by the measuring examples (`nats_wake`,
//! `wake_cost`).

/// This thread's time on the CPU so far, in microseconds
/// (`/proc/thread-self/schedstat`, nanoseconds).
pub(crate) fn thread_cpu_us() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat (Linux only)");
    let ns: f64 = stat
        .split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .expect("schedstat's first field");
    ns / 1_000.0
}
