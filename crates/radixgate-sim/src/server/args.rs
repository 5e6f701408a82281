//! The `radixgate worker` command line and its entry point.
//!
//! Layers, lowest first: built-in defaults, a `--config` JSON file (the
//! serde schema of [`WorkerConfig`], unknown fields rejected), then flags
//! given on the command line; the result is validated before anything
//! binds. `--count N` serves N workers on consecutive ports, each with its
//! own engine. Faults apply to every worker unless `--fault-workers` names
//! some (0-based indices). KV-event endpoints move up by the worker index
//! (worker i publishes on port + i), as engines offset them by
//! data-parallel rank.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{EventShape, FaultConfig, HashFormat, Role, WorkerConfig};
use crate::engine::EngineConfig;
use crate::error::SimError;

/// The first worker's port unless `--port` says otherwise.
const DEFAULT_PORT: u16 = 31000;

/// Flags of `radixgate worker`. Model, engine and fault flags override the
/// `--config` file (JSON of [`WorkerConfig`]), which overrides the built-in
/// defaults shown as `[default: …]`.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port of the first worker; worker i listens on port + i (0: each
    /// picks a free port). Not the router's 30000, so `radixgate serve`
    /// and `radixgate worker` started without `--port` do not collide.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Number of workers (consecutive ports, independent caches).
    #[arg(long, default_value_t = 1)]
    pub count: u16,
    /// A JSON file holding a `WorkerConfig` (its fields are listed in
    /// crates/radixgate-sim/README.md); flags given on the command line
    /// override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Worker name (`<name>-<i>` with --count > 1) [default: worker-<port>].
    #[arg(long)]
    pub name: Option<String>,
    /// Model id served and reported [default: sim-llama-8b].
    #[arg(long)]
    pub model: Option<String>,
    /// Characters per token of the simulated tokenizer [default: 4].
    #[arg(long)]
    pub chars_per_token: Option<usize>,
    /// Output tokens when a request sets no max_tokens [default: 16].
    #[arg(long)]
    pub default_max_tokens: Option<usize>,
    /// Largest request body accepted, in bytes [default: 33554432].
    #[arg(long)]
    pub max_body_bytes: Option<usize>,
    /// Reply at once, with no simulated compute (measures router overhead).
    #[arg(long)]
    pub instant: bool,
    /// The engine's size and timing.
    #[command(flatten)]
    pub engine: EngineFlags,
    /// Fault: fraction of generation requests answered with HTTP 500 [default: 0].
    #[arg(long)]
    pub error_rate: Option<f64>,
    /// Fault: milliseconds added before each generation request [default: 0].
    #[arg(long)]
    pub added_latency_ms: Option<u64>,
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
    /// Fault: refuse connections for this many seconds after start [default: 0].
    #[arg(long)]
    pub slow_start_secs: Option<f64>,
    /// Fault: health endpoints answer 503.
    #[arg(long)]
    pub unhealthy: bool,
    /// Fault: engine steps take this many times longer (1..=1000) [default: 1].
    #[arg(long)]
    pub slowdown: Option<f64>,
    /// Seed of the error-rate draws; worker i uses seed + i [default: 0].
    #[arg(long)]
    pub fault_seed: Option<u64>,
    /// Fault: the KV-event publisher starts stopped (no sockets); clearing
    /// `kv_events_stopped` at run time starts it.
    #[arg(long)]
    pub kv_events_stopped: bool,
    /// Fault: withhold the first N KV-event batches from subscribers (kept
    /// for replay), a sequence gap [default: 0].
    #[arg(long)]
    pub kv_events_drop: Option<u32>,
    /// Fault: the KV-event publisher keeps its sockets but publishes
    /// nothing (a hung publishing thread).
    #[arg(long)]
    pub kv_events_frozen: bool,
    /// Publish KV-cache events (ZeroMQ PUB, vLLM/SGLang wire format) bound
    /// at this endpoint, e.g. tcp://127.0.0.1:5557 (`*` = all interfaces);
    /// worker i uses port + i. Unset: no events.
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// Topic frame of each KV-event message; empty unless set, which every
    /// subscription matches.
    #[arg(long)]
    pub kv_events_topic: Option<String>,
    /// KV-event msgpack layout: tagged arrays (SGLang, older vLLM) or
    /// tagged maps (newer vLLM) [default: array].
    #[arg(long, value_enum)]
    pub kv_events_shape: Option<EventShape>,
    /// Block hashes in KV events as msgpack integers or 8 bytes [default: int].
    #[arg(long, value_enum)]
    pub kv_events_hash: Option<HashFormat>,
    /// Serve KV-event replay (ZeroMQ ROUTER) at this endpoint; worker i
    /// uses port + i. Unset: no replay.
    #[arg(long)]
    pub kv_events_replay_endpoint: Option<String>,
    /// Recent KV-event batches kept for replay [default: 10000].
    #[arg(long)]
    pub kv_events_replay_batches: Option<usize>,
    /// Tokenize prompts with this model's tokenizer (a `tokenizer.json` or a
    /// model directory) instead of the simulated one, so that KV events
    /// carry the ids a router with the same tokenizer computes.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Prefill/decode disaggregation role: `prefill` computes prompts and
    /// holds their KV for decode workers to pull, `decode` pulls it and
    /// decodes; requests without PD fields are served as usual
    /// [default: regular].
    #[arg(long, value_enum)]
    pub role: Option<Role>,
    /// Prefill: also serve the KV pull endpoint (`GET /kv/{room}`) on this
    /// port, the SGLang bootstrap port; worker i uses port + i; 0 picks
    /// free ports. Unset: only on the HTTP port.
    #[arg(long)]
    pub bootstrap_port: Option<u16>,
    /// Decode: pull from this bootstrap port when a request's
    /// `bootstrap_port` is null. Unset: such requests get a 400.
    #[arg(long)]
    pub default_bootstrap_port: Option<u16>,
    /// Decode: KV transfer bandwidth in bytes per second, 1e6..=1e14 (one
    /// 400 Gb/s NIC) [default: 50000000000].
    #[arg(long)]
    pub transfer_bandwidth: Option<f64>,
    /// Decode: KV bytes per prompt token moved, at most 1073741824
    /// (Llama-3-8B, BF16) [default: 131072].
    #[arg(long)]
    pub kv_bytes_per_token: Option<u64>,
    /// Decode: how long to wait for a prefill worker's KV, milliseconds
    /// [default: 30000].
    #[arg(long)]
    pub transfer_timeout_ms: Option<u64>,
    /// Prefill: how long ready KV waits for its pull, and a pull for its
    /// room, milliseconds [default: 60000].
    #[arg(long)]
    pub kv_hold_timeout_ms: Option<u64>,
    /// Fault (prefill): fraction of finished prefills whose KV is never
    /// marked ready, so the decode worker times out [default: 0].
    #[arg(long)]
    pub fault_drop_transfers: Option<f64>,
    /// Fault: a generation request naming a model this worker does not
    /// serve (its model, or a LoRA adapter loaded) is answered 404, as
    /// vLLM answers it.
    #[arg(long)]
    pub strict_models: bool,
    /// Apply the fault flags and file faults only to these worker indices
    /// (e.g. `0,2`); the others start without faults.
    #[arg(long, value_delimiter = ',')]
    pub fault_workers: Option<Vec<u16>>,
}

fn set<T>(slot: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *slot = v;
    }
}

impl WorkerArgs {
    /// The base configuration: the `--config` file or the defaults.
    pub fn base_config(&self) -> Result<WorkerConfig, SimError> {
        let Some(path) = &self.config else {
            return Ok(WorkerConfig::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| SimError::Config(format!("cannot read {}: {e}", path.display())))?;
        serde_json::from_str(&text)
            .map_err(|e| SimError::Config(format!("{}: {e}", path.display())))
    }

    /// The configuration of worker `i` of `base` with the flags applied
    /// (validated).
    pub fn config(&self, base: &WorkerConfig, i: u16) -> Result<WorkerConfig, SimError> {
        let mut c = base.clone();
        let faulty = self.fault_workers.as_ref().is_none_or(|w| w.contains(&i));
        if faulty {
            let f = &mut c.faults;
            set(&mut f.error_rate, self.error_rate);
            set(&mut f.latency_ms, self.added_latency_ms);
            f.hang |= self.hang;
            f.refuse |= self.refuse;
            if self.die_after_chunks.is_some() {
                f.die_after_chunks = self.die_after_chunks;
            }
            set(&mut f.slow_start_secs, self.slow_start_secs);
            f.unhealthy |= self.unhealthy;
            set(&mut f.slowdown, self.slowdown);
            set(&mut f.seed, self.fault_seed);
            f.kv_events_stopped |= self.kv_events_stopped;
            set(&mut f.kv_events_drop, self.kv_events_drop);
            f.kv_events_frozen |= self.kv_events_frozen;
            set(&mut f.drop_transfers, self.fault_drop_transfers);
            f.strict_models |= self.strict_models;
            f.seed = f.seed.wrapping_add(u64::from(i));
        } else {
            c.faults = FaultConfig::default();
        }
        let name = self.name.clone().unwrap_or_else(|| c.name.clone());
        c.name = match (name.is_empty(), self.count) {
            (true, _) => String::new(),
            (false, 1) => name,
            (false, _) => format!("{name}-{i}"),
        };
        set(&mut c.model, self.model.clone());
        set(&mut c.chars_per_token, self.chars_per_token);
        set(&mut c.default_max_tokens, self.default_max_tokens);
        set(&mut c.max_body_bytes, self.max_body_bytes);
        c.instant |= self.instant;
        self.engine.apply(&mut c.engine);
        let k = &mut c.kv_events;
        set(&mut k.endpoint, self.kv_events_endpoint.clone());
        set(&mut k.topic, self.kv_events_topic.clone());
        set(&mut k.shape, self.kv_events_shape);
        set(&mut k.hash, self.kv_events_hash);
        set(
            &mut k.replay_endpoint,
            self.kv_events_replay_endpoint.clone(),
        );
        set(&mut k.replay_batches, self.kv_events_replay_batches);
        c.kv_events = c.kv_events.for_worker(i)?;
        let p = &mut c.pd;
        set(&mut p.role, self.role);
        if self.bootstrap_port.is_some() {
            p.bootstrap_port = self.bootstrap_port;
        }
        if self.default_bootstrap_port.is_some() {
            p.default_bootstrap_port = self.default_bootstrap_port;
        }
        set(&mut p.transfer_bandwidth, self.transfer_bandwidth);
        set(&mut p.kv_bytes_per_token, self.kv_bytes_per_token);
        set(&mut p.transfer_timeout_ms, self.transfer_timeout_ms);
        set(&mut p.hold_timeout_ms, self.kv_hold_timeout_ms);
        c.pd = c.pd.for_worker(i)?;
        c.validate()?;
        Ok(c)
    }
}

/// Engine flags shared by `radixgate worker` and `radixgate simulate`: each
/// one given overrides its key of the engine config.
#[derive(Debug, Clone, Default, Args)]
pub struct EngineFlags {
    /// KV page size in tokens [default: 16].
    #[arg(long)]
    pub block_size: Option<usize>,
    /// KV cache capacity of a worker in tokens [default: 400000].
    #[arg(long)]
    pub kv_capacity_tokens: Option<usize>,
    /// Most requests in a worker's running batch [default: 256].
    #[arg(long)]
    pub max_running_requests: Option<usize>,
    /// Token budget per step: prefill chunk + one per decoding request [default: 8192].
    #[arg(long)]
    pub max_batch_tokens: Option<usize>,
    /// Fixed cost of a step, microseconds, in 0..=1000000 [default: 4800].
    #[arg(long)]
    pub step_base_us: Option<f64>,
    /// Cost per batched token, microseconds, in 0..=10000 [default: 27].
    #[arg(long)]
    pub token_us: Option<f64>,
    /// KV read cost per context token of a decoding request, ns, in
    /// 0..=100000 [default: 39].
    #[arg(long)]
    pub kv_read_ns_per_token: Option<f64>,
    /// Relative speed of the worker: step times are divided by it, so 0.5
    /// is a worker at half speed; in 0.001..=100 [default: 1].
    #[arg(long)]
    pub speed: Option<f64>,
}

impl EngineFlags {
    /// Overrides `e` with every flag that was given.
    pub fn apply(&self, e: &mut EngineConfig) {
        set(&mut e.block_size, self.block_size);
        set(&mut e.kv_capacity_tokens, self.kv_capacity_tokens);
        set(&mut e.max_running_requests, self.max_running_requests);
        set(&mut e.max_batch_tokens, self.max_batch_tokens);
        set(&mut e.timing.step_base_us, self.step_base_us);
        set(&mut e.timing.token_us, self.token_us);
        set(
            &mut e.timing.kv_read_ns_per_token,
            self.kv_read_ns_per_token,
        );
        set(&mut e.timing.speed, self.speed);
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
    let base = args.base_config()?;
    let tokens: Option<Arc<dyn crate::tokens::TokenSource>> = match &args.tokenizer {
        Some(path) => {
            let t = radixgate_tokenize::Tokenizer::load(path)
                .map_err(|e| anyhow::anyhow!("--tokenizer {}: {e}", path.display()))?;
            Some(Arc::new(crate::tokens::ModelTokens(t)))
        }
        None => None,
    };
    let mut workers = Vec::new();
    for i in 0..args.count {
        let config = args.config(&base, i)?;
        // Port 0 asks for a free port, for every worker (not 0 + i).
        let port = if args.port == 0 { 0 } else { args.port + i };
        let addr = SocketAddr::new(args.host, port);
        let listener = TcpListener::bind(addr).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => anyhow::anyhow!(
                "cannot listen on {addr}: the port is in use (another worker, or a \
                     router?); choose free ports with --port (workers take --port .. \
                     --port + --count - 1)"
            ),
            _ => anyhow::anyhow!("cannot listen on {addr}: {e}"),
        })?;
        workers.push((listener, config, tokens.clone()));
    }
    let shutdown = CancellationToken::new();
    let handles = super::start_workers(workers, shutdown.clone()).await?;
    for h in &handles {
        tracing::info!(worker = h.name(), addr = %h.addr(), "simulated worker listening");
        eprintln!(
            "radixgate worker {} listening on http://{}",
            h.name(),
            h.addr()
        );
        if let Some(b) = h.bootstrap_addr() {
            eprintln!(
                "radixgate worker {} serves KV pulls (bootstrap) on http://{b}",
                h.name()
            );
        }
        if let Some(ep) = h.kv_events_endpoint() {
            let replay = h
                .kv_events_replay_endpoint()
                .map_or_else(String::new, |r| format!(", replay on {r}"));
            eprintln!(
                "radixgate worker {} publishes KV events on {ep}{replay}",
                h.name()
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WorkerArgs,
    }

    fn parse(argv: &[&str]) -> WorkerArgs {
        Cli::try_parse_from(std::iter::once("worker").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn flags_override_file_which_overrides_defaults() {
        let dir = std::env::temp_dir().join(format!("rg-sim-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("w.json");
        std::fs::write(
            &file,
            r#"{"model": "from-file", "engine": {"block_size": 32, "timing": {"token_us": 5.0}}}"#,
        )
        .unwrap();
        let a = parse(&[
            "--config",
            file.to_str().unwrap(),
            "--block-size",
            "8",
            "--count",
            "2",
            "--name",
            "w",
        ]);
        let base = a.base_config().unwrap();
        let c = a.config(&base, 1).unwrap();
        assert_eq!(c.model, "from-file");
        assert_eq!(c.engine.block_size, 8);
        assert_eq!(c.engine.timing.token_us, 5.0);
        assert_eq!(c.engine.timing.step_base_us, 4800.0);
        assert_eq!(c.name, "w-1");
        std::fs::write(&file, r#"{"engine": {"blok_size": 32}}"#).unwrap();
        assert!(a.base_config().is_err(), "unknown fields are rejected");
    }

    #[test]
    fn faults_go_only_to_named_workers_and_bad_values_fail() {
        let a = parse(&[
            "--count",
            "3",
            "--error-rate",
            "0.5",
            "--fault-workers",
            "1",
            "--fault-seed",
            "10",
        ]);
        let base = a.base_config().unwrap();
        assert_eq!(a.config(&base, 0).unwrap().faults, FaultConfig::default());
        let f = a.config(&base, 1).unwrap().faults;
        assert_eq!((f.error_rate, f.seed), (0.5, 11));
        let bad = parse(&["--max-batch-tokens", "4"]);
        assert!(bad.config(&bad.base_config().unwrap(), 0).is_err());
        let slow = parse(&["--count", "2", "--slowdown", "4", "--fault-workers", "0"]);
        let base = slow.base_config().unwrap();
        assert_eq!(slow.config(&base, 0).unwrap().faults.slowdown, 4.0);
        assert_eq!(slow.config(&base, 1).unwrap().faults.slowdown, 1.0);
        let bad = parse(&["--slowdown", "0.5"]);
        let e = bad
            .config(&bad.base_config().unwrap(), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("faults.slowdown"), "{e}");
    }

    #[test]
    fn speed_flag_sets_the_timing_and_is_validated() {
        let a = parse(&["--speed", "0.5"]);
        let c = a.config(&a.base_config().unwrap(), 0).unwrap();
        assert_eq!(c.engine.timing.speed, 0.5);
        let d = parse(&[]);
        assert_eq!(
            d.config(&d.base_config().unwrap(), 0)
                .unwrap()
                .engine
                .timing
                .speed,
            1.0
        );
        for bad in ["0", "-2", "101", "NaN"] {
            let flag = format!("--speed={bad}");
            let b = parse(&[flag.as_str()]);
            let e = b
                .config(&b.base_config().unwrap(), 0)
                .unwrap_err()
                .to_string();
            assert!(e.contains("speed"), "{bad}: {e}");
        }
    }

    /// The flags that override the config file show the built-in default
    /// in their help as `[default: …]` (clap cannot: an unset flag must
    /// leave the file's value); setting one to it changes nothing.
    #[test]
    fn stated_defaults_are_the_built_in_ones() {
        use clap::CommandFactory;
        let base = WorkerConfig::default();
        let default = parse(&[]).config(&base, 0).unwrap();
        let mut checked = 0;
        for arg in Cli::command().get_arguments() {
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            let Some((_, value)) = help.split_once("[default: ") else {
                continue;
            };
            let value = value.strip_suffix(']').unwrap();
            if !arg.get_default_values().is_empty() || value.contains('<') {
                continue; // clap's own default, or a pattern (`worker-<port>`)
            }
            let long = format!("--{}", arg.get_long().unwrap());
            let c = parse(&[&long, value]).config(&base, 0).unwrap();
            assert_eq!(c, default, "{long} {value} is not the default");
            checked += 1;
        }
        assert!(checked >= 16, "{checked}");
    }

    #[test]
    fn kv_event_flags_set_the_config_and_move_up_per_worker() {
        let a = parse(&[
            "--count",
            "2",
            "--kv-events-endpoint",
            "tcp://127.0.0.1:5557",
            "--kv-events-replay-endpoint",
            "tcp://*:6557",
            "--kv-events-shape",
            "map",
            "--kv-events-hash",
            "bytes",
            "--kv-events-topic",
            "kv",
            "--kv-events-drop",
            "2",
        ]);
        let base = a.base_config().unwrap();
        let c = a.config(&base, 1).unwrap();
        assert_eq!(c.kv_events.endpoint, "tcp://127.0.0.1:5558");
        assert_eq!(c.kv_events.replay_endpoint, "tcp://0.0.0.0:6558");
        assert_eq!(c.kv_events.shape, EventShape::Map);
        assert_eq!(c.kv_events.hash, HashFormat::Bytes);
        assert_eq!(c.kv_events.topic, "kv");
        assert_eq!(c.faults.kv_events_drop, 2);
        let c0 = a.config(&base, 0).unwrap();
        assert_eq!(c0.kv_events.endpoint, "tcp://127.0.0.1:5557");
        assert_eq!(c0.kv_events.replay_endpoint, "tcp://*:6557");
        let bad = parse(&["--kv-events-endpoint", "ipc:///tmp/kv"]);
        let e = bad
            .config(&bad.base_config().unwrap(), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("kv_events.endpoint"), "{e}");
        let orphan = parse(&["--kv-events-replay-endpoint", "tcp://127.0.0.1:6557"]);
        assert!(orphan.config(&orphan.base_config().unwrap(), 0).is_err());
    }

    #[test]
    fn pd_flags_set_the_config_and_move_up_per_worker() {
        let a = parse(&[
            "--count",
            "2",
            "--role",
            "prefill",
            "--bootstrap-port",
            "8998",
            "--kv-hold-timeout-ms",
            "5000",
            "--fault-drop-transfers",
            "0.5",
            "--strict-models",
        ]);
        let base = a.base_config().unwrap();
        let c = a.config(&base, 1).unwrap();
        assert_eq!(c.pd.role, Role::Prefill);
        assert_eq!(c.pd.bootstrap_port, Some(8999));
        assert_eq!(c.pd.hold_timeout_ms, 5000);
        assert_eq!(c.faults.drop_transfers, 0.5);
        assert!(c.faults.strict_models);
        let d = parse(&[
            "--role",
            "decode",
            "--transfer-bandwidth",
            "1e9",
            "--kv-bytes-per-token",
            "65536",
            "--transfer-timeout-ms",
            "250",
            "--default-bootstrap-port",
            "8998",
        ]);
        let c = d.config(&d.base_config().unwrap(), 0).unwrap();
        assert_eq!(c.pd.role, Role::Decode);
        assert_eq!(
            (c.pd.transfer_bandwidth, c.pd.kv_bytes_per_token),
            (1e9, 65536)
        );
        assert_eq!(c.pd.transfer_timeout_ms, 250);
        assert_eq!(c.pd.default_bootstrap_port, Some(8998));
        for bad in [
            &["--role", "decode", "--bootstrap-port", "8998"][..],
            &["--fault-drop-transfers", "1.5"],
            &["--transfer-bandwidth", "0"],
        ] {
            let b = parse(bad);
            assert!(b.config(&b.base_config().unwrap(), 0).is_err(), "{bad:?}");
        }
    }
}
