//! What following a publisher costs this process, per message: a `zeromq`
//! PUB in the same process publishes `MESSAGES` batches (each `BLOCKS`
//! stored blocks of 16 tokens, as an engine reports a prefill's chunk) at
//! `RATE` a second, and [`run`] follows it; the process's CPU time (user
//! and system, `/proc/self/stat`) from the first batch received to the
//! last is divided by the batches. The publisher's share is in the figure too,
//! the same on both sides of a comparison: build this example at two
//! commits and compare the two figures.
//!
//! `cargo run --release -p radixgate-kv --example subscribe_cost -- [MESSAGES] [RATE] [BLOCKS]`
//! (defaults 20000, 1000, 16).

use std::time::{Duration, Instant};

use bytes::Bytes;
use radixgate_kv::subscribe::{SubscriberConfig, Update, run};
use rmpv::Value;
use tokio::sync::mpsc;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

/// utime + stime of this process, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after = &stat[stat.rfind(')').expect("a comm field") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

/// A batch of `blocks` stored blocks, in SGLang's array shape.
fn payload(seq: u64, blocks: u64) -> Vec<u8> {
    let events = (0..blocks)
        .map(|b| {
            Value::Array(vec![
                Value::from("BlockStored"),
                Value::Array(vec![Value::from(seq * 1_000 + b)]),
                Value::Nil,
                Value::Array((0..16u32).map(|t| Value::from(t + b as u32)).collect()),
                Value::from(16u32),
                Value::Nil,
                Value::Nil,
            ])
        })
        .collect();
    let batch = Value::Array(vec![Value::F64(1.0), Value::Array(events), Value::Nil]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("to a Vec");
    out
}

#[tokio::main]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let messages = args.first().copied().unwrap_or(20_000);
    let rate = args.get(1).copied().unwrap_or(1_000);
    let blocks = args.get(2).copied().unwrap_or(16);
    let mut publisher = PubSocket::new();
    let endpoint = publisher
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("bind")
        .to_string();
    let (tx, mut rx) = mpsc::channel(1024);
    tokio::spawn(run(SubscriberConfig::new(&endpoint, ""), tx));
    let send = |seq: u64| {
        let frames = vec![
            Bytes::from_static(b"kv"),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload(seq, blocks)),
        ];
        ZmqMessage::try_from(frames).expect("frames")
    };
    // Until the subscription has reached the publisher.
    let mut seq = 0;
    loop {
        publisher.send(send(seq)).await.expect("publish");
        seq += 1;
        if let Ok(Some(Update::Batch { .. })) =
            tokio::time::timeout(Duration::from_millis(20), rx.recv()).await
        {
            break;
        }
    }
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {}
    let received = tokio::spawn(async move {
        let mut n = 0;
        while n < messages {
            match rx.recv().await {
                Some(Update::Batch { .. }) => n += 1,
                Some(_) => {}
                None => break,
            }
        }
        n
    });
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    for i in 0..messages {
        tokio::time::sleep_until((started + period * i as u32).into()).await;
        publisher.send(send(seq + i)).await.expect("publish");
    }
    let got = received.await.expect("the counter");
    let cpu = cpu_seconds() - cpu0;
    println!(
        "{got} of {messages} batches ({blocks} blocks, {} bytes each) at {rate}/s: {:.1} us of CPU per batch, {:.1} s",
        payload(0, blocks).len(),
        cpu * 1e6 / got.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
}
