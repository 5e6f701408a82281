//! The `radixgate load` command line: its flags, their names, defaults and
//! help, and nothing else. What they mean — the workload config and run
//! plan they translate to, and every check that names a flag — is
//! [`builder`](super::builder)'s, so this file reads as the CLI reference.
//!
//! [`ArrivalFlags`], [`WorkloadKind`] and [`WorkloadFlags`] are shared with
//! `radixgate simulate`, so one workload and arrival description drives
//! both tools.

use std::path::PathBuf;

use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use super::assign::Assign;
use super::body::Api;

/// The `--api` values: the generation APIs by their short names.
/// [`Api`] lives in `radixgate-routing`, which knows nothing of clap, so
/// the names and their help are spelled here.
pub fn api_parser() -> impl TypedValueParser<Value = Api> {
    PossibleValuesParser::new([
        PossibleValue::new("chat").help("`POST /v1/chat/completions`"),
        PossibleValue::new("completions").help("`POST /v1/completions`"),
        PossibleValue::new("generate").help("`POST /generate` (SGLang native)"),
        PossibleValue::new("responses").help("`POST /v1/responses` (OpenAI Responses)"),
        PossibleValue::new("messages").help("`POST /v1/messages` (Anthropic Messages)"),
    ])
    .map(|name| match name.as_str() {
        "completions" => Api::Completions,
        "generate" => Api::Generate,
        "responses" => Api::Responses,
        "messages" => Api::Messages,
        _ => Api::ChatCompletions,
    })
}

/// Which workload to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    /// Groups of prompts sharing a long system prompt.
    SharedPrefix,
    /// Conversations that grow with the real replies.
    MultiTurn,
    /// Many questions about a few long documents.
    LongDoc,
    /// Tool-using agents: long shared prefix, growing context.
    Agentic,
    /// Replay of a Mooncake-style JSONL trace (`--trace`).
    Trace,
    /// A weighted blend (`--mix`).
    Mixed,
}

/// Flags of `radixgate load`.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Base URL of a server or router, e.g. http://127.0.0.1:31000 (repeat,
    /// or separate with commas, for several: requests are spread over them
    /// by --assign).
    #[arg(
        long = "url",
        required = true,
        value_name = "URL",
        value_delimiter = ','
    )]
    pub urls: Vec<String>,
    /// API to call.
    #[arg(long, value_parser = api_parser(), default_value = "chat")]
    pub api: Api,
    /// The `model` field.
    #[arg(long, default_value = "sim-llama-8b")]
    pub model: String,
    /// Leave the `model` field out.
    #[arg(long, conflicts_with = "model")]
    pub no_model: bool,
    /// Ask for whole responses instead of streams (TTFT is then not measured).
    #[arg(long)]
    pub no_stream: bool,
    /// Send this key as `Authorization: Bearer KEY`, for a router started
    /// with an API key or tenants' keys (the same variable as `serve`'s
    /// client key, so one environment drives both).
    #[arg(
        long,
        value_name = "KEY",
        env = "RADIXGATE_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// How requests arrive and when issuing stops.
    #[command(flatten)]
    pub arrival: ArrivalFlags,
    /// Per-request timeout, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub timeout: f64,
    /// Fail (exit status 1, after the report) when more than this fraction
    /// of the finished requests failed, 0..=1; 0 = any failure fails the
    /// run, 1 = never.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.0)]
    pub max_error_rate: f64,
    /// Client-side assignment over several --url.
    #[arg(long, value_enum, default_value_t = Assign::RoundRobin)]
    pub assign: Assign,
    /// Workers behind the URL(s), e.g. a router's pool, so the spread
    /// counts a worker that got no request [default: the workers seen].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub pool_size: Option<u64>,
    /// Seed of the workload and the arrival process.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Never draw the progress line.
    #[arg(long)]
    pub no_progress: bool,
    /// Workload to generate (`trace` when `--trace` is given).
    #[arg(
        long,
        value_enum,
        default_value_t = WorkloadKind::SharedPrefix,
        default_value_if("trace", clap::builder::ArgPredicate::IsPresent, "trace")
    )]
    pub workload: WorkloadKind,
    /// Read the workload from a JSON file (the `WorkloadConfig` schema)
    /// instead of --workload and its flags.
    #[arg(long, value_name = "FILE", conflicts_with = "workload")]
    pub workload_file: Option<PathBuf>,
    /// Characters per token when rendering lengths to text.
    #[arg(long, default_value_t = 4)]
    pub chars_per_token: u32,
    /// Workload settings (each applies to the workloads named in its help).
    #[command(flatten)]
    pub knobs: WorkloadFlags,
}

/// The arrival flags `load` and `simulate` share: how requests arrive
/// (`--rate`, `--concurrency`, or a trace's timestamps) and when issuing
/// stops (`--duration`, `--requests`). The help speaks of `load`;
/// `simulate` rewords `--duration` and `--requests` for its simulated time
/// and its own default.
#[derive(Debug, Clone, Default, Args)]
pub struct ArrivalFlags {
    /// Open loop: Poisson arrivals at this many requests per second (at
    /// least 0.001).
    #[arg(long, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Closed loop: this many clients [default: 8].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Stop issuing after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Stop issuing after this many requests [default: 200, or the whole
    /// trace].
    #[arg(long)]
    pub requests: Option<u64>,
}

/// Workload settings; unset ones take the workload's defaults.
#[derive(Debug, Clone, Default, Args)]
pub struct WorkloadFlags {
    /// shared-prefix: prefix groups [default: 16].
    #[arg(long)]
    pub groups: Option<u64>,
    /// shared-prefix: distinct questions per group [default: 64].
    #[arg(long)]
    pub prompts_per_group: Option<u64>,
    /// shared-prefix, multi-turn: system prompt tokens [default: 2048
    /// shared-prefix, 256 multi-turn].
    #[arg(long)]
    pub system_tokens: Option<u64>,
    /// shared-prefix, long-doc: question tokens [default: 128 shared-prefix,
    /// 48 long-doc].
    #[arg(long)]
    pub question_tokens: Option<u64>,
    /// all but trace: tokens to generate per request [default: 64
    /// shared-prefix and long-doc, 128 multi-turn, 32 agentic].
    #[arg(long)]
    pub output_tokens: Option<u32>,
    /// shared-prefix, long-doc: Zipf exponent over groups/documents, 0 =
    /// uniform [default: 0].
    #[arg(long)]
    pub zipf: Option<f64>,
    /// multi-turn: conversations in all, 0 = unlimited [default: 0].
    #[arg(long)]
    pub conversations: Option<u64>,
    /// multi-turn: turns per conversation [default: 6].
    #[arg(long)]
    pub turns: Option<u32>,
    /// multi-turn: user message tokens [default: 96].
    #[arg(long)]
    pub user_tokens: Option<u64>,
    /// multi-turn: mean think time, ms, at most a day [default: 500].
    #[arg(long)]
    pub think_ms: Option<f64>,
    /// long-doc: documents [default: 4].
    #[arg(long)]
    pub documents: Option<u64>,
    /// long-doc: document tokens [default: 8192].
    #[arg(long)]
    pub document_tokens: Option<u64>,
    /// agentic: distinct agent prefixes [default: 4].
    #[arg(long)]
    pub agents: Option<u64>,
    /// agentic: sessions in all, 0 = unlimited [default: 0].
    #[arg(long)]
    pub sessions: Option<u64>,
    /// agentic: shared prefix (tools + instructions) tokens [default: 4096].
    #[arg(long)]
    pub prefix_tokens: Option<u64>,
    /// agentic: opening task tokens [default: 96].
    #[arg(long)]
    pub task_tokens: Option<u64>,
    /// agentic: tool result tokens per step [default: 64].
    #[arg(long)]
    pub step_tokens: Option<u64>,
    /// agentic: steps per session [default: 8].
    #[arg(long)]
    pub steps: Option<u32>,
    /// agentic: mean tool time between steps, ms, at most a day
    /// [default: 100].
    #[arg(long)]
    pub tool_ms: Option<f64>,
    /// trace: the JSONL file (required with --workload trace).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// trace: time compression, 2 = twice as fast, in 0.001..=1000000
    /// [default: 1].
    #[arg(long)]
    pub speedup: Option<f64>,
    /// trace: records that share a timestamp arrive evenly over the time
    /// to the next distinct one, not all at once (for traces whose times
    /// are rounded to a coarse grid) [default: off].
    #[arg(long)]
    pub spread_bursts: bool,
    /// trace: tokens per hash block, at most 1048576 [default: 512].
    #[arg(long)]
    pub block_tokens: Option<u64>,
    /// trace: cap on tokens generated per request, 0 = as traced
    /// [default: 0].
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
    /// trace: replay only the lines of this model, for a recording of a
    /// router that serves several (each model is its own pool; such a
    /// recording is refused without it); without it, every line.
    #[arg(long, value_name = "NAME")]
    pub trace_model: Option<String>,
    /// mixed: parts and weights, each part taking the flags above
    /// [default: shared-prefix=4,multi-turn=3,agentic=2,long-doc=1].
    #[arg(long)]
    pub mix: Option<String>,
}
