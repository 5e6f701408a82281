//! The `radixgate worker` command line and its entry point.
//!
//! Flags map one-to-one onto [`WorkerConfig`] (engine, timing, faults);
//! `--count N` serves N workers on consecutive ports, each with its own
//! engine. Fault flags apply to every worker unless `--fault-workers`
//! names some (0-based indices).

use std::net::{IpAddr, SocketAddr};

use clap::Args;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{FaultConfig, WorkerConfig, start_group};
use crate::engine::{EngineConfig, TimingConfig};
use crate::error::SimError;

/// Flags of `radixgate worker`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port of the first worker; worker i listens on port + i.
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Number of workers (consecutive ports, independent caches).
    #[arg(long, default_value_t = 1)]
    pub count: u16,
    /// Worker name (`<name>-<i>` with --count > 1); default `worker-<port>`.
    #[arg(long)]
    pub name: Option<String>,
    /// Model id served and reported.
    #[arg(long, default_value = super::DEFAULT_MODEL)]
    pub model: String,
    /// Characters per token of the simulated tokenizer.
    #[arg(long, default_value_t = crate::tokens::DEFAULT_CHARS_PER_TOKEN)]
    pub chars_per_token: usize,
    /// Output tokens when a request sets no max_tokens.
    #[arg(long, default_value_t = 16)]
    pub default_max_tokens: usize,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    pub max_body_bytes: usize,
    /// Reply at once, with no simulated compute (measures router overhead).
    #[arg(long)]
    pub instant: bool,
    /// KV page size in tokens.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// KV cache capacity in tokens.
    #[arg(long, default_value_t = 400_000)]
    pub kv_capacity_tokens: usize,
    /// Most requests in the running batch.
    #[arg(long, default_value_t = 256)]
    pub max_running_requests: usize,
    /// Token budget per step (prefill chunk + one per decoding request).
    #[arg(long, default_value_t = 8192)]
    pub max_batch_tokens: usize,
    /// Fixed cost of a step, microseconds.
    #[arg(long, default_value_t = 4800.0)]
    pub step_base_us: f64,
    /// Cost per batched token, microseconds.
    #[arg(long, default_value_t = 27.0)]
    pub token_us: f64,
    /// KV read cost per context token of a decoding request, nanoseconds.
    #[arg(long, default_value_t = 39.0)]
    pub kv_read_ns_per_token: f64,
    /// Fault: fraction of generation requests answered with HTTP 500.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Fault: milliseconds added before each generation request.
    #[arg(long, default_value_t = 0)]
    pub added_latency_ms: u64,
    /// Fault: accept generation requests and never answer.
    #[arg(long)]
    pub hang: bool,
    /// Fault: refuse connections (clear with POST /admin/workers/{i}/faults
    /// on a sibling worker).
    #[arg(long)]
    pub refuse: bool,
    /// Fault: drop streamed responses after this many SSE events.
    #[arg(long)]
    pub die_after_chunks: Option<u32>,
    /// Fault: refuse connections for this many seconds after start.
    #[arg(long, default_value_t = 0.0)]
    pub slow_start_secs: f64,
    /// Fault: health endpoints answer 503.
    #[arg(long)]
    pub unhealthy: bool,
    /// Seed of the error-rate draws (worker i uses seed + i).
    #[arg(long, default_value_t = 0)]
    pub fault_seed: u64,
    /// Apply the fault flags only to these worker indices (e.g. `0,2`).
    #[arg(long, value_delimiter = ',')]
    pub fault_workers: Option<Vec<u16>>,
}

impl WorkerArgs {
    /// The configuration of worker `i` (validated).
    pub fn config(&self, i: u16) -> Result<WorkerConfig, SimError> {
        let faulty = self.fault_workers.as_ref().is_none_or(|w| w.contains(&i));
        let faults = if faulty {
            FaultConfig {
                error_rate: self.error_rate,
                latency_ms: self.added_latency_ms,
                hang: self.hang,
                refuse: self.refuse,
                die_after_chunks: self.die_after_chunks,
                slow_start_secs: self.slow_start_secs,
                unhealthy: self.unhealthy,
                seed: self.fault_seed.wrapping_add(u64::from(i)),
            }
        } else {
            FaultConfig::default()
        };
        let name = match (&self.name, self.count) {
            (None, _) => String::new(),
            (Some(n), 1) => n.clone(),
            (Some(n), _) => format!("{n}-{i}"),
        };
        let c = WorkerConfig {
            name,
            model: self.model.clone(),
            chars_per_token: self.chars_per_token,
            default_max_tokens: self.default_max_tokens,
            max_body_bytes: self.max_body_bytes,
            instant: self.instant,
            engine: EngineConfig {
                block_size: self.block_size,
                kv_capacity_tokens: self.kv_capacity_tokens,
                max_running_requests: self.max_running_requests,
                max_batch_tokens: self.max_batch_tokens,
                timing: TimingConfig {
                    step_base_us: self.step_base_us,
                    token_us: self.token_us,
                    kv_read_ns_per_token: self.kv_read_ns_per_token,
                },
            },
            faults,
        };
        c.validate()?;
        Ok(c)
    }
}

/// Runs `radixgate worker` until Ctrl-C / SIGTERM.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    if args.count == 0 {
        anyhow::bail!("--count must be at least 1");
    }
    if u32::from(args.port) + u32::from(args.count) - 1 > u32::from(u16::MAX) {
        anyhow::bail!(
            "--port {} + --count {} runs past port 65535",
            args.port,
            args.count
        );
    }
    let mut workers = Vec::new();
    for i in 0..args.count {
        let config = args.config(i)?;
        let addr = SocketAddr::new(args.host, args.port + i);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        workers.push((listener, config));
    }
    let shutdown = CancellationToken::new();
    let handles = start_group(workers, shutdown.clone()).await?;
    for h in &handles {
        tracing::info!(worker = h.name(), addr = %h.addr(), "simulated worker listening");
        eprintln!(
            "radixgate worker {} listening on http://{}",
            h.name(),
            h.addr()
        );
    }
    wait_for_signal().await;
    shutdown.cancel();
    for h in handles {
        h.join().await;
    }
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
