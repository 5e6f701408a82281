//! One serde schema naming every workload and its settings, so the load
//! tool, the offline simulator and config files share it.

use serde::{Deserialize, Serialize};

use super::{
    Agentic, AgenticConfig, LongDoc, LongDocConfig, Mixed, MixedConfig, MultiTurn, MultiTurnConfig,
    SharedPrefix, SharedPrefixConfig, TextShape, TraceConfig, TraceReplay, Workload,
};
use crate::SimError;

/// A workload and its settings (externally tagged: `{"shared-prefix": {…}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum WorkloadConfig {
    /// See [`SharedPrefix`].
    SharedPrefix(SharedPrefixConfig),
    /// See [`MultiTurn`].
    MultiTurn(MultiTurnConfig),
    /// See [`LongDoc`].
    LongDoc(LongDocConfig),
    /// See [`Agentic`].
    Agentic(AgenticConfig),
    /// See [`TraceReplay`].
    Trace(TraceConfig),
    /// See [`Mixed`].
    Mixed(MixedConfig),
}

impl WorkloadConfig {
    /// The workload's name as on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            WorkloadConfig::SharedPrefix(_) => "shared-prefix",
            WorkloadConfig::MultiTurn(_) => "multi-turn",
            WorkloadConfig::LongDoc(_) => "long-doc",
            WorkloadConfig::Agentic(_) => "agentic",
            WorkloadConfig::Trace(_) => "trace",
            WorkloadConfig::Mixed(_) => "mixed",
        }
    }

    /// Checks the settings (a trace file is only read by [`Self::build`]).
    pub fn validate(&self) -> Result<(), SimError> {
        match self {
            WorkloadConfig::SharedPrefix(c) => c.validate(),
            WorkloadConfig::MultiTurn(c) => c.validate(),
            WorkloadConfig::LongDoc(c) => c.validate(),
            WorkloadConfig::Agentic(c) => c.validate(),
            WorkloadConfig::Trace(c) => c.validate(),
            WorkloadConfig::Mixed(c) => c.validate(),
        }
    }

    /// Builds the workload for `seed`.
    pub fn build(&self, seed: u64, shape: TextShape) -> Result<Box<dyn Workload>, SimError> {
        if shape.chars_per_token == 0 {
            return Err(SimError::Config("chars_per_token must be > 0".into()));
        }
        Ok(match self {
            WorkloadConfig::SharedPrefix(c) => Box::new(SharedPrefix::new(c.clone(), seed, shape)?),
            WorkloadConfig::MultiTurn(c) => Box::new(MultiTurn::new(c.clone(), seed, shape)?),
            WorkloadConfig::LongDoc(c) => Box::new(LongDoc::new(c.clone(), seed, shape)?),
            WorkloadConfig::Agentic(c) => Box::new(Agentic::new(c.clone(), seed, shape)?),
            WorkloadConfig::Trace(c) => Box::new(TraceReplay::new(c.clone(), seed, shape)?),
            WorkloadConfig::Mixed(c) => Box::new(Mixed::new(c.clone(), seed, shape)?),
        })
    }
}
