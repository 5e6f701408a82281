//! Measures what the index costs per block: resident memory (Linux
//! `/proc/self/statm`) before and after filling an index, against the
//! index's own estimate.
//!
//! Two shapes at 16 workers and block size 16: every worker holding its
//! own prompts (one holder per key), and all workers holding the same
//! prompts (16 holders per key, the lists spill to the heap).
//!
//! Run one shape per process, so that memory freed by one does not hide
//! the next one's cost:
//! `cargo run --release -p radixgate-kv --example memory -- own|shared [BLOCKS_PER_WORKER]`.

use radixgate_kv::{BlockStored, EngineHash, IndexLimits, KvEvent, KvIndex};

const WORKERS: u32 = 16;
const BLOCK: u32 = 16;
const CHAIN: usize = 64;

fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn fill(blocks_per_worker: usize, shared: bool) -> KvIndex {
    let mut index = KvIndex::with_limits(IndexLimits {
        max_blocks_per_worker: blocks_per_worker,
        max_blocks_total: blocks_per_worker * WORKERS as usize,
    });
    for w in 0..WORKERS {
        let salt = if shared { 0 } else { w + 1 };
        for chain in 0..blocks_per_worker / CHAIN {
            // Each chain is its own prompt: its first token tells it apart.
            let tokens: Vec<u32> = (0..CHAIN * BLOCK as usize)
                .map(|i| {
                    if i == 0 {
                        chain as u32
                    } else {
                        (i as u32) ^ (salt << 20)
                    }
                })
                .collect();
            let first = (chain * CHAIN) as u64;
            let event = KvEvent::Stored(BlockStored {
                block_hashes: (first..first + CHAIN as u64)
                    .map(|b| EngineHash(b << 8 | u64::from(w)))
                    .collect(),
                parent: None,
                token_ids: tokens,
                block_size: BLOCK,
                lora_id: None,
                extra_keys: Vec::new(),
            });
            index.apply(w, &[event]);
        }
    }
    index
}

fn main() {
    let mut args = std::env::args().skip(1);
    let shared = match args.next().as_deref() {
        Some("own") | None => false,
        Some("shared") => true,
        Some(other) => {
            eprintln!("unknown shape {other:?}: own or shared");
            std::process::exit(2);
        }
    };
    let blocks_per_worker: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(65_536);
    println!("workers {WORKERS}, block size {BLOCK}, {blocks_per_worker} blocks per worker");
    let before = resident_bytes();
    let index = fill(blocks_per_worker, shared);
    let after = resident_bytes();
    let blocks = index.blocks();
    let rss = match (before, after) {
        (Some(b), Some(a)) => format!("{:.1}", a.saturating_sub(b) as f64 / blocks as f64),
        _ => "n/a".to_owned(),
    };
    println!(
        "{}: {} blocks, {} keys; resident {} B/block; estimate {:.1} B/block",
        if shared {
            "all workers share every prompt"
        } else {
            "each worker its own prompts"
        },
        blocks,
        index.keys(),
        rss,
        index.bytes_estimate() as f64 / blocks as f64,
    );
}
