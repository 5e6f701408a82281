//! The `radixgate` command: parses the command line and runs a subcommand.
//!
//! `serve` is the gateway library's. `worker`, `load`, `simulate`, `tune`
//! and `demo` come from `radixgate-sim` and exist only with the default `sim` feature,
//! so a gateway-only build (`--no-default-features`) compiles no simulator.

#[cfg(feature = "sim")]
mod demo;
#[cfg(feature = "sim")]
mod tune;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

// The request path allocates per request (bodies, headers, futures); glibc's
// malloc was about a tenth of the gateway's CPU under load (perf, see
// bench/README.md), mimalloc's thread-local heaps cost less.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// radixgate: a cache-aware router for pools of LLM inference servers.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Try radixgate with nothing installed: simulated workers, the router,
    /// a cache_aware vs round_robin comparison, then serve until Ctrl-C.
    #[cfg(feature = "sim")]
    Demo(Box<demo::DemoArgs>),
    /// Route requests to a pool of LLM workers (the router).
    Serve(Box<radixgate::config::ServeArgs>),
    /// Serve simulated LLM workers (KV-cache and batching model) for tests
    /// and benchmarks.
    #[cfg(feature = "sim")]
    Worker(Box<radixgate_sim::server::WorkerArgs>),
    /// Drive a workload at servers or routers and report hit rate, latency,
    /// errors and spread.
    #[cfg(feature = "sim")]
    Load(Box<radixgate_sim::load::LoadArgs>),
    /// Replay a workload through the routing policies offline, against
    /// simulated workers in simulated time, and compare them with an oracle.
    #[cfg(feature = "sim")]
    Simulate(Box<radixgate_sim::simulate::SimulateArgs>),
    /// Replay a recording (`serve --record-trace`) over a grid of routing
    /// settings offline and print the best at equal hit rate, its expected
    /// gain and the config lines to paste.
    #[cfg(feature = "sim")]
    Tune(Box<tune::TuneCommand>),
    /// Print the build's version and exit.
    Version,
}

fn main() -> std::process::ExitCode {
    huge_pages_off();
    match run(parse_cli()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // The whole cause chain on one line, without the backtrace a
            // `Result` from main would add. A cause its parent already
            // spelled out is not repeated.
            let message = radixgate::error::chain(err.as_ref());
            eprintln!("radixgate: error: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Parses the command line. clap names a refused value by its flag alone,
/// also where it came from the flag's `RADIXGATE_*` variable (an empty
/// `RADIXGATE_CONFIG` from an unset shell variable or a chart's blank
/// value read "a value is required for '--config'"); a tip then names the
/// variable.
fn parse_cli() -> Cli {
    Cli::try_parse().unwrap_or_else(|mut err| {
        let argv: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if let Some(tip) = from_variable(&err, &argv) {
            use clap::error::{ContextKind, ContextValue};
            let mut tips = match err.get(ContextKind::Suggested) {
                Some(ContextValue::StyledStrs(tips)) => tips.clone(),
                _ => Vec::new(),
            };
            tips.push(tip.into());
            err.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
        }
        err.exit()
    })
}

/// Where `err` refuses a flag's value that its environment variable gave
/// (the variable is set and the flag is not on `argv`), says so.
fn from_variable(err: &clap::Error, argv: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    // "--config <CONFIG>": the flag is its first word.
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let flag = format!("--{long}");
    let given = argv
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| *a == flag || a.starts_with(&format!("{flag}=")));
    if given {
        return None;
    }
    let cli = Cli::command();
    let command = cli.find_subcommand(argv.get(1)?)?;
    let var = command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))?
        .get_env()?
        .to_string_lossy()
        .into_owned();
    let value = std::env::var_os(&var)?;
    let tip = if value.is_empty() {
        format!(
            "{var} is set but empty ({flag} is not on the command line): unset it or give it a value"
        )
    } else {
        format!("{var} gave this value ({flag} is not on the command line): correct it or unset it")
    };
    Some(tip)
}

/// Turns transparent huge pages off for this process, unless the operator
/// set `MIMALLOC_ALLOW_THP` (then mimalloc does as that says). mimalloc asks
/// the kernel for huge pages on its memory (`madvise`), frees pages it has
/// not used for 10 ms back to it, and faults them in again at the next burst:
/// each fault then zeroes 2 MiB. A replica applying its peers' long prompts
/// spent about half its CPU there (docs/sync.md, "Huge pages"); under wrk
/// at full speed it made no difference.
fn huge_pages_off() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(err) = rustix::thread::disable_transparent_huge_pages(true) {
        // Only a kernel without the prctl refuses it; nothing to do then.
        eprintln!("radixgate: transparent huge pages stay on: {err}");
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Version => println!("radixgate {}", env!("CARGO_PKG_VERSION")),
        #[cfg(feature = "sim")]
        Command::Worker(args) => {
            init_logs("info", false);
            tokio::runtime::Runtime::new()?.block_on(radixgate_sim::server::run(*args))?;
        }
        Command::Serve(args) => {
            let config = args.load().context("invalid configuration")?;
            // Requests are served on the gateway's own threads; this
            // runtime only runs probes, control, upkeep and span export.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let level = config.log.filter()?;
            let telemetry = radixgate::trace::init(
                logs(&level, config.log.json),
                Some((&config.tracing, runtime.handle().clone())),
            )?;
            runtime.block_on(async {
                let served = serve(*args, config).await;
                telemetry.shutdown().await;
                served
            })?;
            // The last line: without it, the log of a router killed part
            // way through its shutdown read as that of one that finished.
            tracing::info!("shut down");
        }
        #[cfg(feature = "sim")]
        Command::Load(args) => radixgate_sim::load::main(*args)?,
        #[cfg(feature = "sim")]
        Command::Demo(args) => {
            init_logs("warn", false);
            tokio::runtime::Runtime::new()?.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(ShutdownSignals::new(), shutdown.clone()));
                demo::run(*args, shutdown).await
            })?;
        }
        #[cfg(feature = "sim")]
        Command::Simulate(args) => radixgate_sim::simulate::main(*args)?,
        #[cfg(feature = "sim")]
        Command::Tune(cmd) => tune::run(*cmd)?,
    }
    Ok(())
}

async fn serve(
    args: radixgate::config::ServeArgs,
    config: radixgate::config::Config,
) -> anyhow::Result<()> {
    let addr = (config.server.host.as_str(), config.server.port);
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => anyhow::bail!(
            "cannot listen on {}:{}: the port is in use (another radixgate, or a worker?); \
             choose another with --port (or `server.port` in the config file)",
            addr.0,
            addr.1
        ),
        Err(err) => {
            return Err(err).with_context(|| format!("cannot listen on {}:{}", addr.0, addr.1));
        }
    };
    let (shutdown, now) = (CancellationToken::new(), CancellationToken::new());
    // Handled from here, before the router says it is listening: made in
    // the spawned task, the handlers could come after a SIGTERM sent as
    // soon as it said so (a supervisor's, a script's), which was then lost.
    let signals = ShutdownSignals::new();
    tokio::spawn(shut_down_on_signals(signals, shutdown.clone(), now.clone()));
    // A reload layers the same flags and environment on the re-read file.
    let (reload, reloads) = radixgate::reload::channel(Box::new(move || args.load()));
    reload_on_hangup(reload)?;
    radixgate::server::run_reloadable(listener, config, reloads, shutdown, now).await?;
    Ok(())
}

/// Reloads the configuration on every SIGHUP (whose default action would
/// end the process). The reload task logs each outcome.
fn reload_on_hangup(reload: radixgate::reload::Reload) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the configuration");
                let _ = reload.reload().await;
            }
        });
    }
    #[cfg(not(unix))]
    drop(reload);
    Ok(())
}

/// Cancels `token` on Ctrl-C or SIGTERM.
#[cfg(feature = "sim")]
async fn cancel_on_signal(mut signals: ShutdownSignals, token: CancellationToken) {
    signals.next().await;
    tracing::info!("shutting down");
    token.cancel();
}

/// Cancels `shutdown` on the first Ctrl-C or SIGTERM, and `now` on the
/// next: an operator who will not wait for the grace period (the requests
/// in flight) need not `kill -9`, which would send their clients nothing.
async fn shut_down_on_signals(
    mut signals: ShutdownSignals,
    shutdown: CancellationToken,
    now: CancellationToken,
) {
    signals.next().await;
    tracing::info!("shutting down (a second SIGTERM or Ctrl-C ends the requests in flight now)");
    shutdown.cancel();
    signals.next().await;
    tracing::warn!("second shutdown signal: ending the requests in flight now");
    now.cancel();
}

/// Ctrl-C (SIGINT) and, on Unix, SIGTERM, each as often as they come.
struct ShutdownSignals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Handles both signals from now on (their default action would end
    /// the process at once).
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Self {
                interrupt: signal(SignalKind::interrupt()).ok(),
                terminate: signal(SignalKind::terminate()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits for the next one.
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn one(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = one(&mut self.interrupt) => {}
                () = one(&mut self.terminate) => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Log lines on stderr at `level` (`RUST_LOG` overrides it).
fn logs(level: &str, json: bool) -> radixgate::trace::Logs<'_> {
    radixgate::trace::Logs {
        level,
        json,
        ansi: colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ),
    }
}

/// Logs only, for the subcommands other than `serve`.
#[cfg(feature = "sim")]
fn init_logs(level: &str, json: bool) {
    // Only fails if a subscriber is already installed: keep that one.
    let _ = radixgate::trace::init(logs(level, json), None);
}

/// Whether logs are coloured: only on a terminal, and not when `NO_COLOR`
/// is set to anything but the empty string (no-color.org's rule), so log
/// files and pipes get plain text.
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(std::ffi::OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use super::colour;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }
}
