//! The composition file: a named sequence of steps, the provider and model they run on, and the
//! model limits sealed for every attempt.
//!
//! Parsing is strict: an unknown field anywhere is refused with the file, the field and the line.
//! In particular the model limits have no retry field (CFG-6); retries are a host decision, so a
//! composition cannot quietly multiply the live model calls it makes. After the shape, the
//! meaning is checked: unique step ids, tools each step may use, write roots only on write steps,
//! and `{{steps.ID.output}}` only naming a step that runs earlier.
//!
//! This file holds the composition as the runtime reads it; `parse` reads and checks the file
//! (`Composition::parse`), and `placeholder` finds the `{{...}}` placeholders of instructions.
//!
//! Defaults for absent limits (documented in `docs/configuration.md`):
//! `timeoutMs` 1,800,000, `maxTurns` 16, `maxOutputTokens` 8,192, `sourceReadBytes` 524,288.

mod parse;
mod placeholder;

use serde::{Deserialize, Serialize};

pub use self::placeholder::{
    OutputRef, Placeholder, PlaceholderAt, output_references, placeholders,
};

/// The attempt timer when a composition does not set `limits.timeoutMs`.
pub const DEFAULT_TIMEOUT_MS: u64 = 1_800_000;
/// Provider turns per attempt when `limits.maxTurns` is absent.
pub const DEFAULT_MAX_TURNS: u32 = 16;
/// The response ceiling per turn when `limits.maxOutputTokens` is absent.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 8_192;
/// Source bytes the read tools may return per attempt when `limits.sourceReadBytes` is absent.
pub const DEFAULT_SOURCE_READ_BYTES: u64 = 524_288;
/// The provider used when a composition names none.
pub const DEFAULT_PROVIDER: &str = "default";

/// A parsed and checked composition.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Composition {
    pub name: String,
    /// A provider name from `host.yaml`.
    pub provider: String,
    /// The selected model; `None` means the provider's default model.
    pub model: Option<String>,
    pub limits: ModelLimits,
    /// In run order; never empty.
    pub steps: Vec<Step>,
}

/// The ceilings sealed for every attempt of every step. There is deliberately no retry field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelLimits {
    /// The attempt timer, in milliseconds.
    pub timeout_ms: u64,
    /// Provider turns per attempt (the execution lease).
    pub max_turns: u32,
    /// Response ceiling per turn.
    pub max_output_tokens: u32,
    /// Source bytes the read tools may return per attempt; restored for every attempt.
    pub source_read_bytes: u64,
    /// Tokens the whole run may spend, every attempt of every instance counted; `None` is no
    /// bound. Each request reserves its worst case before it leaves (docs/cost.md).
    pub max_run_tokens: Option<u64>,
}

impl Default for ModelLimits {
    fn default() -> Self {
        ModelLimits {
            timeout_ms: DEFAULT_TIMEOUT_MS,
            max_turns: DEFAULT_MAX_TURNS,
            max_output_tokens: DEFAULT_MAX_OUTPUT_TOKENS,
            source_read_bytes: DEFAULT_SOURCE_READ_BYTES,
            max_run_tokens: None,
        }
    }
}

use docsfab_record::Access;

/// The tools a step may offer the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    ListFiles,
    ReadFile,
    SearchText,
    WriteFile,
}

impl Tool {
    pub const ALL: [Tool; 4] = [
        Tool::ListFiles,
        Tool::ReadFile,
        Tool::SearchText,
        Tool::WriteFile,
    ];

    /// The name the model sees.
    pub fn name(self) -> &'static str {
        match self {
            Tool::ListFiles => "list_files",
            Tool::ReadFile => "read_file",
            Tool::SearchText => "search_text",
            Tool::WriteFile => "write_file",
        }
    }

    /// Whether the tool changes the workspace.
    pub fn writes(self) -> bool {
        matches!(self, Tool::WriteFile)
    }
}

/// The JSON answer a step must return.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Contract {
    /// A JSON Schema, already checked to compile.
    pub schema: serde_json::Value,
    /// The answer's members whose citations must exist in the workspace
    /// (`contract.grounding`, docs/grounding.md): dotted paths, `*` for every array item. A
    /// string there is read as Markdown; an array of strings as a list of workspace paths.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub grounding: Vec<String>,
}

/// One step of a composition.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub id: String,
    pub access: Access,
    /// May contain `{{steps.ID.output}}` naming earlier steps; see [`output_references`].
    pub instructions: String,
    /// Without duplicates, in the order written.
    pub tools: Vec<Tool>,
    pub contract: Option<Contract>,
    /// Workspace-relative path prefixes `write_file` may touch; empty on read-only steps.
    pub write_roots: Vec<String>,
    /// The line of the step's `id` in the file, for messages.
    pub line: u64,
    /// Set on a fan-out step: one instance runs per element of an earlier step's array.
    #[serde(rename = "forEach")]
    pub fan_out: Option<FanOut>,
    /// Set on a pages step (docs/pages.md): the earlier read-only steps whose accepted page
    /// answers (`{path, markdown}`) it writes, with no provider request. Such a step has no
    /// instructions, tools, contract or `forEach`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pages: Vec<String>,
}

impl Step {
    /// Whether the step writes earlier steps' pages instead of asking a model.
    pub fn writes_pages(&self) -> bool {
        !self.pages.is_empty()
    }
}

/// The default number of fan-out instances that run at once.
pub const DEFAULT_CONCURRENCY: u32 = 4;
/// The most fan-out instances that may run at once.
pub const MAX_CONCURRENCY: u32 = 16;

/// A step's `forEach: steps.ID.output.PATH` and its `concurrency`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FanOut {
    /// The earlier read-only step whose answer holds the array.
    pub step_id: String,
    /// Members from the answer object down to the array; empty for the answer itself.
    pub path: Vec<String>,
    /// Instances at once, 1..=16.
    pub concurrency: u32,
}

impl FanOut {
    /// The reference as written: `steps.ID.output.PATH`.
    pub fn source(&self) -> String {
        let mut s = format!("steps.{}.output", self.step_id);
        for m in &self.path {
            s.push('.');
            s.push_str(m);
        }
        s
    }
}

/// A composition file that cannot be used. Its message is one sentence with the file, the line
/// where known, what is wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}{}: {message}.", location(*.line, *.column))]
pub struct CompositionError {
    pub path: String,
    pub line: Option<u64>,
    pub column: Option<u64>,
    /// The field at fault, when one is (e.g. `limits.maxRetries`, `steps[1].writeRoots`).
    pub field: Option<String>,
    pub message: String,
}

fn location(line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" line {l}, column {c}"),
        (Some(l), None) => format!(" line {l}"),
        _ => String::new(),
    }
}

impl Composition {
    /// The step with `id`, if any.
    pub fn step(&self, id: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.id == id)
    }
}
