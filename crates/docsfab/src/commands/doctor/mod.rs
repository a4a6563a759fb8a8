//! `docsfab doctor`: validate everything a run would read at startup (host.yaml, the
//! environment, the rules table and optionally a composition), then print every effective limit
//! with its source, the transport retry budget and the retry envelope of one read-only step.
//! The checks, the DNS pre-flight, the store check and `--probe` are `crate::app::doctor`'s;
//! this module parses the flags and prints the report as text ([`text`]) or JSON ([`json`]),
//! the probe's part in [`probe`].
//!
//! Exit 0 when the configuration is valid, even with warnings; exit 2 with one sentence on
//! stderr at the first problem; with `--probe`, the probe's verdict decides. Secrets are never
//! printed: for each provider doctor says only whether the variable it names is set.

mod json;
mod probe;
mod text;

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::app::doctor::{Ask, check};
use crate::app::error::{CliError, emit};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// A composition file to check; its limits.timeoutMs is the attempt timer of the envelope.
    #[arg(long, value_name = "FILE")]
    pub composition: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Send one minimal real request ("ping", one output token, never replayed) to a provider
    /// and report reachability, the key, the model and the round-trip time (exit 0 answered or
    /// throttled, 2 bad configuration, 1 unreachable or failing).
    #[arg(long)]
    pub probe: bool,
    /// The provider --probe sends to (default: the composition's provider with --composition,
    /// otherwise "default").
    #[arg(long, value_name = "NAME", requires = "probe")]
    pub provider: Option<String>,
}

pub fn run(args: &DoctorArgs, store: Option<&str>) -> Result<(), CliError> {
    let ask = Ask {
        composition: args.composition.as_deref(),
        probe: args.probe,
        provider: args.provider.as_deref(),
    };
    let report = match check(&ask, store) {
        Ok(r) => r,
        Err(e) => {
            if args.json {
                emit(&format!(
                    "{}\n",
                    json!({"valid": false, "error": e.message})
                ))?;
            }
            return Err(e);
        }
    };
    if args.json {
        emit(&format!("{:#}\n", json::to_json(&report)))?;
    } else {
        emit(&text::to_text(&report))?;
    }
    match &report.probe {
        Some(p) => p.conclusion(),
        None => Ok(()),
    }
}
