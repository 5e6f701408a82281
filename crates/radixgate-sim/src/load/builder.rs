//! What the `radixgate load` and `radixgate simulate` flags mean: their
//! translation into a workload config, an arrival plan and a run plan.
//! Every inconsistency is an error naming the flag. The flags themselves
//! (names, defaults, help) are in [`args`](super::args).

use std::collections::BTreeSet;
use std::time::Duration;

use super::args::{ArrivalFlags, LoadArgs, WorkloadFlags, WorkloadKind};
use super::driver::{Arrivals, RunPlan};
use crate::SimError;
use crate::workload::{
    AgenticConfig, LongDocConfig, MixedConfig, MixedPart, MultiTurnConfig, SharedPrefixConfig,
    TextShape, TraceConfig, WorkloadConfig,
};

/// Requests sent when neither `--requests` nor `--duration` is given
/// (except for trace replay, which then plays the whole trace).
pub const DEFAULT_REQUESTS: u64 = 200;
/// Closed-loop clients when neither `--rate` nor `--concurrency` is given.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// The least `--rate`, requests a second: one in about 17 minutes. The
/// gaps between arrivals are drawn as `Duration`s, with a mean of 1/rate
/// seconds, which a rate near 0 overflows.
pub const MIN_RATE: f64 = 1e-3;
/// The most closed-loop clients: each is state (and, for `load`, a task
/// with a connection) kept for the whole run; 10^8 of them took 6.6 GB in
/// `simulate` before its first request.
pub const MAX_CONCURRENCY: usize = 100_000;

/// What the arrival flags say once checked: how requests arrive and when
/// issuing stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArrivalPlan {
    /// How requests are started.
    pub arrivals: Arrivals,
    /// Stop issuing after this many requests.
    pub max_requests: Option<u64>,
    /// Stop issuing after this long.
    pub duration: Option<Duration>,
}

impl ArrivalFlags {
    /// The arrival process `--rate` / `--concurrency` describe: trace
    /// timestamps for a timestamped workload, Poisson at `--rate`, else a
    /// closed loop.
    pub fn arrivals(&self, timestamped: bool) -> Result<Arrivals, SimError> {
        if timestamped {
            if self.rate.is_some() || self.concurrency.is_some() {
                return Err(SimError::Config(
                    "trace replay paces requests by its timestamps: drop --rate/--concurrency and use --speedup".into(),
                ));
            }
            Ok(Arrivals::Timestamps)
        } else if let Some(rate) = self.rate {
            if !rate.is_finite() || rate < MIN_RATE {
                return Err(SimError::Config(format!(
                    "--rate must be at least {MIN_RATE} requests a second, got {rate}"
                )));
            }
            Ok(Arrivals::Poisson { rate })
        } else {
            let concurrency = self.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
            if concurrency == 0 || concurrency > MAX_CONCURRENCY {
                return Err(SimError::Config(format!(
                    "--concurrency must be in 1..={MAX_CONCURRENCY}, got {concurrency}"
                )));
            }
            Ok(Arrivals::Closed { concurrency })
        }
    }

    /// The arrivals and stops, given whether the workload is timestamped
    /// and the tool's request count when neither `--requests` nor
    /// `--duration` is given (a timestamped workload then plays whole).
    pub fn plan(&self, timestamped: bool, default_requests: u64) -> Result<ArrivalPlan, SimError> {
        let arrivals = self.arrivals(timestamped)?;
        let duration = self.duration.map(|d| secs("--duration", d)).transpose()?;
        if self.requests == Some(0) {
            return Err(SimError::Config("--requests must be > 0".into()));
        }
        let max_requests = match (self.requests, duration, timestamped) {
            (Some(n), _, _) => Some(n),
            (None, None, false) => Some(default_requests),
            _ => None,
        };
        Ok(ArrivalPlan {
            arrivals,
            max_requests,
            duration,
        })
    }
}

/// Records which flags a workload used, to reject the others.
struct Used<'a> {
    flags: &'a WorkloadFlags,
    names: BTreeSet<&'static str>,
}

macro_rules! take {
    ($u:expr, $field:ident, $name:literal, $target:expr) => {
        $u.names.insert($name);
        if let Some(v) = $u.flags.$field.clone() {
            $target = v;
        }
    };
}

impl Used<'_> {
    fn shared_prefix(&mut self) -> WorkloadConfig {
        let mut c = SharedPrefixConfig::default();
        take!(self, groups, "--groups", c.groups);
        take!(
            self,
            prompts_per_group,
            "--prompts-per-group",
            c.prompts_per_group
        );
        take!(self, system_tokens, "--system-tokens", c.system_tokens);
        take!(
            self,
            question_tokens,
            "--question-tokens",
            c.question_tokens
        );
        take!(self, output_tokens, "--output-tokens", c.output_tokens);
        take!(self, zipf, "--zipf", c.zipf);
        WorkloadConfig::SharedPrefix(c)
    }

    fn multi_turn(&mut self) -> WorkloadConfig {
        let mut c = MultiTurnConfig::default();
        take!(self, conversations, "--conversations", c.conversations);
        take!(self, turns, "--turns", c.turns);
        take!(self, system_tokens, "--system-tokens", c.system_tokens);
        take!(self, user_tokens, "--user-tokens", c.user_tokens);
        take!(self, output_tokens, "--output-tokens", c.output_tokens);
        take!(self, think_ms, "--think-ms", c.think_ms);
        WorkloadConfig::MultiTurn(c)
    }

    fn long_doc(&mut self) -> WorkloadConfig {
        let mut c = LongDocConfig::default();
        take!(self, documents, "--documents", c.documents);
        take!(
            self,
            document_tokens,
            "--document-tokens",
            c.document_tokens
        );
        take!(
            self,
            question_tokens,
            "--question-tokens",
            c.question_tokens
        );
        take!(self, output_tokens, "--output-tokens", c.output_tokens);
        take!(self, zipf, "--zipf", c.zipf);
        WorkloadConfig::LongDoc(c)
    }

    fn agentic(&mut self) -> WorkloadConfig {
        let mut c = AgenticConfig::default();
        take!(self, agents, "--agents", c.agents);
        take!(self, sessions, "--sessions", c.sessions);
        take!(self, prefix_tokens, "--prefix-tokens", c.prefix_tokens);
        take!(self, task_tokens, "--task-tokens", c.task_tokens);
        take!(self, step_tokens, "--step-tokens", c.step_tokens);
        take!(self, steps, "--steps", c.steps);
        take!(self, output_tokens, "--output-tokens", c.output_tokens);
        take!(self, tool_ms, "--tool-ms", c.tool_ms);
        WorkloadConfig::Agentic(c)
    }

    fn trace(&mut self) -> Result<WorkloadConfig, SimError> {
        self.names.insert("--trace");
        let Some(path) = self.flags.trace.clone() else {
            return Err(SimError::Config(
                "--workload trace needs --trace FILE".into(),
            ));
        };
        let mut c = TraceConfig::new(path);
        take!(self, speedup, "--speedup", c.speedup);
        take!(self, block_tokens, "--block-tokens", c.block_tokens);
        self.names.insert("--spread-bursts");
        c.spread_bursts = self.flags.spread_bursts;
        take!(
            self,
            max_output_tokens,
            "--max-output-tokens",
            c.max_output_tokens
        );
        self.names.insert("--trace-model");
        c.model = self.flags.trace_model.clone();
        Ok(WorkloadConfig::Trace(c))
    }

    fn mixed(&mut self) -> Result<WorkloadConfig, SimError> {
        self.names.insert("--mix");
        let Some(spec) = self.flags.mix.clone() else {
            let mut c = MixedConfig::default();
            for p in &mut c.parts {
                p.workload = self.single(p.workload.name())?;
            }
            return Ok(WorkloadConfig::Mixed(c));
        };
        let mut parts = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, weight) = item
                .split_once('=')
                .ok_or_else(|| SimError::Config(format!("--mix: {item:?} is not NAME=WEIGHT")))?;
            let weight: f64 = weight.trim().parse().map_err(|_| {
                SimError::Config(format!(
                    "--mix: weight {weight:?} of {name} is not a number"
                ))
            })?;
            parts.push(MixedPart {
                weight,
                workload: self.single(name.trim())?,
            });
        }
        Ok(WorkloadConfig::Mixed(MixedConfig { parts }))
    }

    fn single(&mut self, name: &str) -> Result<WorkloadConfig, SimError> {
        Ok(match name {
            "shared-prefix" => self.shared_prefix(),
            "multi-turn" => self.multi_turn(),
            "long-doc" => self.long_doc(),
            "agentic" => self.agentic(),
            other => {
                return Err(SimError::Config(format!(
                    "--mix: {other:?} cannot be blended (use shared-prefix, multi-turn, long-doc, agentic)"
                )));
            }
        })
    }

    fn unused(&self) -> Vec<&'static str> {
        let f = self.flags;
        let set: [(&'static str, bool); 26] = [
            ("--groups", f.groups.is_some()),
            ("--prompts-per-group", f.prompts_per_group.is_some()),
            ("--system-tokens", f.system_tokens.is_some()),
            ("--question-tokens", f.question_tokens.is_some()),
            ("--output-tokens", f.output_tokens.is_some()),
            ("--zipf", f.zipf.is_some()),
            ("--conversations", f.conversations.is_some()),
            ("--turns", f.turns.is_some()),
            ("--user-tokens", f.user_tokens.is_some()),
            ("--think-ms", f.think_ms.is_some()),
            ("--documents", f.documents.is_some()),
            ("--document-tokens", f.document_tokens.is_some()),
            ("--agents", f.agents.is_some()),
            ("--sessions", f.sessions.is_some()),
            ("--prefix-tokens", f.prefix_tokens.is_some()),
            ("--task-tokens", f.task_tokens.is_some()),
            ("--step-tokens", f.step_tokens.is_some()),
            ("--steps", f.steps.is_some()),
            ("--tool-ms", f.tool_ms.is_some()),
            ("--trace", f.trace.is_some()),
            ("--speedup", f.speedup.is_some()),
            ("--block-tokens", f.block_tokens.is_some()),
            ("--spread-bursts", f.spread_bursts),
            ("--max-output-tokens", f.max_output_tokens.is_some()),
            ("--trace-model", f.trace_model.is_some()),
            ("--mix", f.mix.is_some()),
        ];
        set.iter()
            .filter(|(name, given)| *given && !self.names.contains(name))
            .map(|(name, _)| *name)
            .collect()
    }
}

fn kind_name(kind: WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::SharedPrefix => "shared-prefix",
        WorkloadKind::MultiTurn => "multi-turn",
        WorkloadKind::LongDoc => "long-doc",
        WorkloadKind::Agentic => "agentic",
        WorkloadKind::Trace => "trace",
        WorkloadKind::Mixed => "mixed",
    }
}

/// The workload that `--workload`, `--workload-file` and the workload
/// flags describe (validated): shared by `load` and `simulate`, so both
/// tools accept the same workload description.
pub fn workload_config(
    workload: WorkloadKind,
    workload_file: Option<&std::path::Path>,
    knobs: &WorkloadFlags,
) -> Result<WorkloadConfig, SimError> {
    if let Some(path) = &workload_file {
        let mut used = Used {
            flags: knobs,
            names: BTreeSet::new(),
        };
        if let Some(flag) = used.unused().first() {
            return Err(SimError::Config(format!(
                "{flag} cannot be combined with --workload-file"
            )));
        }
        used.names.clear();
        let text = std::fs::read_to_string(path).map_err(|e| {
            SimError::Config(format!(
                "cannot read --workload-file {}: {e}",
                path.display()
            ))
        })?;
        let cfg: WorkloadConfig = serde_json::from_str(&text)
            .map_err(|e| SimError::Config(format!("--workload-file {}: {e}", path.display())))?;
        cfg.validate()?;
        return Ok(cfg);
    }
    let mut used = Used {
        flags: knobs,
        names: BTreeSet::new(),
    };
    let cfg = match workload {
        WorkloadKind::Trace => used.trace()?,
        WorkloadKind::Mixed => used.mixed()?,
        k => used.single(kind_name(k))?,
    };
    let unused = used.unused();
    if !unused.is_empty() {
        let verb = if unused.len() == 1 { "does" } else { "do" };
        return Err(SimError::Config(format!(
            "{} {verb} not apply to --workload {}",
            unused.join(", "),
            kind_name(workload)
        )));
    }
    cfg.validate()?;
    Ok(cfg)
}

impl LoadArgs {
    /// The workload these flags describe (validated).
    pub fn workload_config(&self) -> Result<WorkloadConfig, SimError> {
        workload_config(self.workload, self.workload_file.as_deref(), &self.knobs)
    }

    /// The text shape (`--chars-per-token`).
    pub fn text_shape(&self) -> Result<TextShape, SimError> {
        if self.chars_per_token == 0 {
            return Err(SimError::Config("--chars-per-token must be > 0".into()));
        }
        Ok(TextShape {
            chars_per_token: self.chars_per_token,
        })
    }

    /// The per-request timeout.
    pub fn request_timeout(&self) -> Result<Duration, SimError> {
        secs("--timeout", self.timeout)
    }

    /// The `Authorization` header `--api-key` asks for, if any: refused
    /// when empty (a variable set to nothing would otherwise send `Bearer `
    /// and fail every request with a 401) or not sendable as a header.
    pub fn authorization(&self) -> Result<Option<http::HeaderValue>, SimError> {
        let Some(key) = self.api_key.as_deref() else {
            return Ok(None);
        };
        let bad = |why: &str| SimError::Config(format!("--api-key (or RADIXGATE_API_KEY) {why}"));
        if key.trim().is_empty() {
            return Err(bad("is empty"));
        }
        let mut value = http::HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| bad("holds a character a header cannot carry"))?;
        value.set_sensitive(true);
        Ok(Some(value))
    }

    /// The fraction of failed requests a run may have (`--max-error-rate`).
    pub fn max_error_rate(&self) -> Result<f64, SimError> {
        let v = self.max_error_rate;
        if !(0.0..=1.0).contains(&v) {
            return Err(SimError::Config(format!(
                "--max-error-rate must be a fraction from 0 to 1, got {v}"
            )));
        }
        Ok(v)
    }

    /// The run plan, given whether the workload is timestamped.
    pub fn plan(&self, timestamped: bool) -> Result<RunPlan, SimError> {
        let ArrivalPlan {
            arrivals,
            max_requests,
            duration,
        } = self.arrival.plan(timestamped, DEFAULT_REQUESTS)?;
        Ok(RunPlan {
            arrivals,
            max_requests,
            duration,
            seed: self.seed,
            progress: !self.no_progress,
            ctrl_c: true,
            assign: self.assign,
        })
    }
}

/// The most seconds a `load` duration or timeout may be (about 116 days).
const MAX_SECS: f64 = 1e7;

/// A positive, finite number of seconds from flag `flag` (at most
/// [`MAX_SECS`]).
fn secs(flag: &str, v: f64) -> Result<Duration, SimError> {
    if !v.is_finite() || v <= 0.0 || v > MAX_SECS {
        return Err(SimError::Config(format!(
            "{flag} must be a number of seconds above 0 and at most {MAX_SECS}, got {v}"
        )));
    }
    Ok(Duration::from_secs_f64(v))
}

#[cfg(test)]
#[path = "builder_tests.rs"]
mod tests;
