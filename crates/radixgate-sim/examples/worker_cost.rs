//! Measures the CPU cost of `radixgate worker` processes: sends chat
//! requests at a fixed rate, round-robin over the given worker URLs, and
//! reads the worker process's CPU time from `/proc/<pid>/stat` before and
//! after. Prints requests sent/completed, achieved rate, and worker CPU
//! seconds per 1,000 requests and cores used. Linux only; not a test.
//!
//! ```sh
//! radixgate worker --port 31100 --count 8 &   # note its PID
//! cargo run --release -p radixgate-sim --example worker_cost -- \
//!     --pid <PID> --rate 2000 --secs 10 http://127.0.0.1:31100 ... http://127.0.0.1:31107
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("worker pid readable");
    // Fields after the command name (which is in parentheses).
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat, i.e. 11 and 12 here.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[tokio::main]
async fn main() {
    // reqwest is built without a bundled crypto provider (the workspace
    // uses ring): install it before building a client.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut args = std::env::args().skip(1);
    let (mut pid, mut rate, mut secs, mut stream_every, mut urls) =
        (0u32, 2000.0f64, 10.0f64, 0u64, Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--pid" => pid = args.next().unwrap().parse().unwrap(),
            "--rate" => rate = args.next().unwrap().parse().unwrap(),
            "--secs" => secs = args.next().unwrap().parse().unwrap(),
            "--stream-every" => stream_every = args.next().unwrap().parse().unwrap(),
            u => urls.push(u.to_owned()),
        }
    }
    assert!(
        pid > 0 && !urls.is_empty(),
        "usage: --pid PID [--rate R] [--secs S] [--stream-every N] URL..."
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .build()
        .unwrap();
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let system: String = (0..50).map(|i| format!("system rule {i}. ")).collect();
    let total = (rate * secs) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now();
    let c0 = cpu_ticks(pid);
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let due = t0 + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        let url = format!("{}/v1/chat/completions", urls[i as usize % urls.len()]);
        let stream = stream_every > 0 && i % stream_every == 0;
        let body = serde_json::json!({
            "model": "m",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("question {}", i % 1000)}],
            "max_tokens": 16,
            "stream": stream,
        });
        let (client, ok, failed) = (client.clone(), ok.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let r = client.post(url).json(&body).send().await;
            let good = match r {
                Ok(r) if r.status().is_success() => r.bytes().await.is_ok(),
                _ => false,
            };
            if good {
                ok.fetch_add(1, Ordering::Relaxed)
            } else {
                failed.fetch_add(1, Ordering::Relaxed)
            };
        }));
    }
    let sent_in = t0.elapsed();
    for t in tasks {
        let _ = t.await;
    }
    let wall = t0.elapsed();
    let c1 = cpu_ticks(pid);
    let cpu_s = (c1 - c0) as f64 / 100.0; // USER_HZ is 100 on Linux
    let done = ok.load(Ordering::Relaxed);
    println!(
        "workers={} target_rate={rate} sent={total} in {:.2}s completed={done} failed={} wall={:.2}s achieved={:.0} req/s",
        urls.len(),
        sent_in.as_secs_f64(),
        failed.load(Ordering::Relaxed),
        wall.as_secs_f64(),
        done as f64 / wall.as_secs_f64()
    );
    println!(
        "worker process CPU: {cpu_s:.2} s = {:.3} s per 1000 requests = {:.2} cores at the achieved rate",
        cpu_s * 1000.0 / total as f64,
        cpu_s / wall.as_secs_f64()
    );
}
