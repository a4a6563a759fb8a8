//! The tools a step offers the model: `list_files`, `read_file`, `search_text` and
//! `write_file`, run inside the workspace jail.
//!
//! A call goes through three stages, each with its own kind of "no":
//! 1. [`StepTools::validate`]: before host authorization. An unknown tool, arguments that are not
//!    JSON or are cut short, or arguments that do not meet the tool's parameter schema are a
//!    [`Rejection`] (LSE-1).
//! 2. [`StepTools::authorize`]: host authorization of the paths. A path outside the workspace,
//!    a write outside `writeRoots`, or a name the filesystem cannot hold (too long, too deep) is
//!    a [`PathRefusal`]; nothing runs.
//! 3. [`StepTools::execute`]: the tool runs. What the model did wrong (a missing file, a spent
//!    read budget, a bad regex) is a [`ToolReply`] with [`CallResult::ToolError`]: data for the
//!    model, and so is a name the filesystem refuses in a write (the directories the write made
//!    are removed again). Only a failure of the host itself (the workspace vanished, an existing
//!    file a write could not snapshot, a disk that is full, read-only or failing) is a
//!    [`HostFailure`], which ends the attempt (LSE-2).
//!
//! `read_file` and `search_text` spend the attempt's source-read budget (`sourceReadBytes`) by
//! the bytes of source they return; a fresh [`StepTools`] per attempt restores it (STP-2).
//!
//! They return the content of regular files with a single link only, judged on the opened
//! descriptor (see `read::open_source`): a hard link can give a workspace name to a file outside
//! it, and a FIFO or device would block the read or never end.
//!
//! This file holds the tools as the model and the attempt see them and the three stages; the
//! tools' work is in `read` (`list_files`, `read_file`, `search_text`, and how a source file is
//! opened and searched) and `write` (`write_file`, and which failure is whose).

mod read;
mod write;

use docsfab_record::{CallResult, RejectReason};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::composition::Tool;
use crate::contract::schema_violations;
use crate::observed::Observed;
use crate::snapshot::WriteSnapshots;
use crate::supervision::ReadSupervisor;
pub use crate::workspace::{MAX_LIST_ENTRIES, SKIPPED_DIRS};
use crate::workspace::{PathRefusal, Resolved, Workspace};

/// Matching lines `search_text` returns at most.
pub const MAX_SEARCH_MATCHES: usize = 200;
/// A matching line longer than this is cut (at a character boundary) in the reply.
pub const MAX_MATCH_LINE_BYTES: usize = 300;
/// Files larger than this are skipped by `search_text`.
pub const MAX_SEARCH_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The tool a model's name refers to, if docsfab has one by that name.
pub fn tool_named(name: &str) -> Option<Tool> {
    Tool::ALL.into_iter().find(|t| t.name() == name)
}

/// The JSON Schema of a tool's parameters, as sent to the model and checked on every call.
pub fn parameter_schema(tool: Tool) -> Value {
    match tool {
        Tool::ListFiles => json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "A directory relative to the workspace; default the workspace root."}},
            "additionalProperties": false
        }),
        Tool::ReadFile => json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "description": "A file relative to the workspace."},
                "offset": {"type": "integer", "minimum": 0, "description": "First byte to read; default 0."},
                "length": {"type": "integer", "minimum": 1, "description": "Bytes to read; default to the end of the file."}
            },
            "required": ["path"],
            "additionalProperties": false
        }),
        Tool::SearchText => json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "minLength": 1, "description": "A regular expression matched against each line."},
                "path": {"type": "string", "description": "A file or directory relative to the workspace; default the workspace root."}
            },
            "required": ["pattern"],
            "additionalProperties": false
        }),
        Tool::WriteFile => json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1, "description": "A file under one of the step's write roots."},
                "content": {"type": "string", "description": "The whole new content of the file."}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        }),
    }
}

/// A one-line description of a tool for the provider's tool list.
pub fn description(tool: Tool) -> &'static str {
    match tool {
        Tool::ListFiles => "List the files under a directory of the workspace, recursively.",
        Tool::ReadFile => "Read a file of the workspace, or a byte range of it.",
        Tool::SearchText => "Search the workspace's text files for lines matching a regex.",
        Tool::WriteFile => "Write a whole file under the step's write roots.",
    }
}

/// A call whose arguments met the tool's parameter schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCall {
    ListFiles {
        path: Option<String>,
    },
    ReadFile {
        path: String,
        offset: Option<u64>,
        length: Option<u64>,
    },
    SearchText {
        pattern: String,
        path: Option<String>,
    },
    WriteFile {
        path: String,
        content: String,
    },
}

impl ToolCall {
    pub fn tool(&self) -> Tool {
        match self {
            ToolCall::ListFiles { .. } => Tool::ListFiles,
            ToolCall::ReadFile { .. } => Tool::ReadFile,
            ToolCall::SearchText { .. } => Tool::SearchText,
            ToolCall::WriteFile { .. } => Tool::WriteFile,
        }
    }
}

#[derive(Deserialize)]
struct ListArgs {
    path: Option<String>,
}
#[derive(Deserialize)]
struct ReadArgs {
    path: String,
    offset: Option<u64>,
    length: Option<u64>,
}
#[derive(Deserialize)]
struct SearchArgs {
    pattern: String,
    path: Option<String>,
}
#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

/// A call rejected before host authorization, with a detail for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Rejection {
    pub reason: RejectReason,
    pub detail: String,
}

/// A call that passed host authorization, with its paths resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    op: Op,
}

impl Authorized {
    pub fn tool(&self) -> Tool {
        match self.op {
            Op::List { .. } => Tool::ListFiles,
            Op::Read { .. } => Tool::ReadFile,
            Op::Search { .. } => Tool::SearchText,
            Op::Write { .. } => Tool::WriteFile,
        }
    }

    /// The workspace-relative path a write call will write (`None` for the other tools).
    pub fn write_path(&self) -> Option<&str> {
        match &self.op {
            Op::Write { target, .. } => Some(&target.rel),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    List {
        target: Resolved,
    },
    Read {
        target: Resolved,
        offset: u64,
        length: Option<u64>,
    },
    Search {
        pattern: String,
        target: Resolved,
    },
    Write {
        target: Resolved,
        content: String,
    },
}

/// What an executed tool answers the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolReply {
    pub result: CallResult,
    pub text: String,
}

impl ToolReply {
    fn ok(text: String) -> ToolReply {
        ToolReply {
            result: CallResult::Ok,
            text,
        }
    }
    fn error(text: String) -> ToolReply {
        ToolReply {
            result: CallResult::ToolError,
            text: format!("error: {text}"),
        }
    }
}

/// The host itself failed while a tool ran; the attempt ends with this evidence (LSE-2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("host failure: {evidence}")]
pub struct HostFailure {
    pub evidence: String,
}

/// The source-read byte budget of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceBudget {
    limit: u64,
    spent: u64,
}

impl SourceBudget {
    pub fn new(limit: u64) -> SourceBudget {
        SourceBudget { limit, spent: 0 }
    }
    pub fn limit(&self) -> u64 {
        self.limit
    }
    pub fn spent(&self) -> u64 {
        self.spent
    }
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.spent)
    }
    /// Spends `bytes` when they fit; otherwise leaves the budget as it is.
    fn try_spend(&mut self, bytes: u64) -> bool {
        if bytes <= self.remaining() {
            self.spent += bytes;
            true
        } else {
            false
        }
    }
    fn refund(&mut self, bytes: u64) {
        self.spent = self.spent.saturating_sub(bytes);
    }
}

/// What one step offers: its tools and, for a write step, its write roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    pub offered: Vec<Tool>,
    /// Empty on read-only steps.
    pub write_roots: Vec<String>,
    /// `sourceReadBytes`.
    pub source_read_bytes: u64,
}

impl ToolPolicy {
    /// The policy of a composition step under the composition's limits.
    pub fn for_step(
        step: &crate::composition::Step,
        limits: &crate::composition::ModelLimits,
    ) -> ToolPolicy {
        ToolPolicy {
            offered: step.tools.clone(),
            write_roots: step.write_roots.clone(),
            source_read_bytes: limits.source_read_bytes,
        }
    }
}

/// The tools of one attempt: a fresh read budget, read supervision and write snapshots.
#[derive(Debug)]
pub struct StepTools<'w> {
    workspace: &'w Workspace,
    policy: ToolPolicy,
    budget: SourceBudget,
    supervisor: ReadSupervisor,
    snapshots: WriteSnapshots,
    /// What the attempt looked at, for reusing its result later.
    observed: Observed,
}

impl<'w> StepTools<'w> {
    /// The tools for a new attempt: nothing read, nothing written, the whole budget.
    pub fn for_attempt(workspace: &'w Workspace, policy: ToolPolicy) -> StepTools<'w> {
        StepTools {
            workspace,
            budget: SourceBudget::new(policy.source_read_bytes),
            supervisor: ReadSupervisor::default(),
            snapshots: WriteSnapshots::new(workspace.root()),
            observed: Observed::default(),
            policy,
        }
    }

    /// For the retry of an attempt stopped as `no-progress`: the first notice-only re-read also
    /// asks the model for its answer (STP-12).
    pub fn answer_at_first_notice(mut self) -> StepTools<'w> {
        self.supervisor = self.supervisor.asking_for_the_answer_at_first_notice();
        self
    }

    pub fn budget(&self) -> SourceBudget {
        self.budget
    }
    pub fn supervisor(&self) -> &ReadSupervisor {
        &self.supervisor
    }
    pub fn snapshots(&self) -> &WriteSnapshots {
        &self.snapshots
    }
    /// The attempt's write snapshots, for a restore after it ends.
    pub fn into_snapshots(self) -> WriteSnapshots {
        self.snapshots
    }
    /// What the attempt's reads, listings and searches looked at.
    pub fn observed(&self) -> &Observed {
        &self.observed
    }

    /// The host preflight for this step (LSE-2).
    pub fn preflight(&self) -> Result<(), crate::ledger::PreflightFailure> {
        self.workspace.preflight(&self.policy.write_roots)
    }

    /// Stage 1: the tool must be offered and the arguments must meet its parameter schema.
    /// Empty arguments count as `{}` (some providers send nothing for a call without
    /// parameters).
    pub fn validate(&self, name: &str, arguments: &str) -> Result<ToolCall, Rejection> {
        let reject = |reason, detail: String| Rejection { reason, detail };
        let Some(tool) = tool_named(name).filter(|t| self.policy.offered.contains(t)) else {
            let offered: Vec<&str> = self.policy.offered.iter().map(|t| t.name()).collect();
            return Err(reject(
                RejectReason::UnknownTool,
                format!(
                    "this step has no tool named {name:?}; its tools are {}",
                    offered.join(", ")
                ),
            ));
        };
        let text = if arguments.trim().is_empty() {
            "{}"
        } else {
            arguments
        };
        let value: Value = serde_json::from_str(text).map_err(|e| {
            if e.is_eof() {
                reject(
                    RejectReason::TruncatedArguments,
                    format!("the arguments of {name} end before the JSON does: {e}"),
                )
            } else {
                reject(
                    RejectReason::InvalidArguments,
                    format!("the arguments of {name} are not JSON: {e}"),
                )
            }
        })?;
        let schema = parameter_schema(tool);
        let mismatch = |detail: String| {
            reject(
                RejectReason::SchemaMismatch,
                format!("the arguments of {name} do not meet its parameters: {detail}"),
            )
        };
        let validator =
            jsonschema::draft202012::new(&schema).map_err(|e| mismatch(e.to_string()))?;
        let errors = schema_violations(&validator, &value);
        if !errors.is_empty() {
            return Err(mismatch(errors.join("; ")));
        }
        let typed = |e: serde_json::Error| mismatch(e.to_string());
        Ok(match tool {
            Tool::ListFiles => {
                let a: ListArgs = serde_json::from_value(value).map_err(typed)?;
                ToolCall::ListFiles { path: a.path }
            }
            Tool::ReadFile => {
                let a: ReadArgs = serde_json::from_value(value).map_err(typed)?;
                ToolCall::ReadFile {
                    path: a.path,
                    offset: a.offset,
                    length: a.length,
                }
            }
            Tool::SearchText => {
                let a: SearchArgs = serde_json::from_value(value).map_err(typed)?;
                ToolCall::SearchText {
                    pattern: a.pattern,
                    path: a.path,
                }
            }
            Tool::WriteFile => {
                let a: WriteArgs = serde_json::from_value(value).map_err(typed)?;
                ToolCall::WriteFile {
                    path: a.path,
                    content: a.content,
                }
            }
        })
    }

    /// Stage 2: host authorization of the call's paths. Nothing runs here.
    pub fn authorize(&self, call: ToolCall) -> Result<Authorized, PathRefusal> {
        let ws = self.workspace;
        let op = match call {
            ToolCall::ListFiles { path } => Op::List {
                target: ws.resolve(path.as_deref().unwrap_or(""))?,
            },
            ToolCall::ReadFile {
                path,
                offset,
                length,
            } => Op::Read {
                target: ws.resolve(&path)?,
                offset: offset.unwrap_or(0),
                length,
            },
            ToolCall::SearchText { pattern, path } => Op::Search {
                target: ws.resolve(path.as_deref().unwrap_or(""))?,
                pattern,
            },
            ToolCall::WriteFile { path, content } => Op::Write {
                target: ws.resolve_for_write(&path, &self.policy.write_roots)?,
                content,
            },
        };
        Ok(Authorized { op })
    }

    /// Stage 3: runs an authorized call.
    pub fn execute(&mut self, call: Authorized) -> Result<ToolReply, HostFailure> {
        match call.op {
            Op::List { target } => {
                self.observed.listing(self.workspace, &target.rel);
                self.list(&target)
            }
            Op::Read {
                target,
                offset,
                length,
            } => {
                self.observed.file(self.workspace, &target.rel);
                self.read(&target, offset, length)
            }
            Op::Search { pattern, target } => {
                // Noted even when nothing is there, so a file that appears later is seen.
                self.observed.file(self.workspace, &target.rel);
                self.search(&pattern, &target)
            }
            Op::Write { target, content } => self.write(&target, &content),
        }
    }
}
