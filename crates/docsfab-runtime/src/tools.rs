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
//! descriptor (see [`open_source`]): a hard link can give a workspace name to a file outside
//! it, and a FIFO or device would block the read or never end.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::composition::Tool;
use crate::contract::schema_violations;
use crate::ledger::{CallResult, RejectReason};
use crate::observed::Observed;
use crate::snapshot::{WriteSnapshots, write_atomically};
use crate::supervision::{ReadSupervisor, ReadVerdict};
pub use crate::workspace::{MAX_LIST_ENTRIES, SKIPPED_DIRS};
use crate::workspace::{PathRefusal, Resolved, Workspace, walk};

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

    /// A filesystem error on the model's path is a tool error, unless the workspace itself is
    /// gone, which is the host's failure.
    fn io_error(&self, rel: &str, e: &io::Error) -> Result<ToolReply, HostFailure> {
        self.workspace.preflight(&[]).map_err(|f| HostFailure {
            evidence: f.evidence,
        })?;
        let shown = if rel.is_empty() { "." } else { rel };
        Ok(ToolReply::error(match e.kind() {
            io::ErrorKind::NotFound => format!("{shown} does not exist"),
            _ => format!("{shown}: {e}"),
        }))
    }

    fn list(&mut self, target: &Resolved) -> Result<ToolReply, HostFailure> {
        match fs::metadata(&target.abs) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Ok(ToolReply::error(format!(
                    "{} is a file, not a directory",
                    target.rel
                )));
            }
            Err(e) => return self.io_error(&target.rel, &e),
        }
        let mut entries = Vec::new();
        let complete = walk(&target.abs, self.workspace.root(), &mut |rel, is_dir| {
            entries.push(if is_dir { format!("{rel}/") } else { rel });
            entries.len() < MAX_LIST_ENTRIES
        });
        if let Err(e) = complete.as_ref() {
            return self.io_error(&target.rel, e);
        }
        let mut text = entries.join("\n");
        if complete.ok() == Some(false) {
            text.push_str(&format!(
                "\n[stopped after {MAX_LIST_ENTRIES} entries; list a subdirectory]"
            ));
        }
        self.supervisor.record_evidence();
        Ok(ToolReply::ok(text))
    }

    fn read(
        &mut self,
        target: &Resolved,
        offset: u64,
        length: Option<u64>,
    ) -> Result<ToolReply, HostFailure> {
        let (file, size) = match open_source(&target.abs) {
            Ok((file, meta)) => (file, meta.len()),
            Err(Unreadable::Io(e)) => return self.io_error(&target.rel, &e),
            Err(Unreadable::Special(SpecialKind::Directory)) => {
                return Ok(ToolReply::error(format!(
                    "{} is a directory; use list_files",
                    target.rel
                )));
            }
            Err(refused) => return Ok(ToolReply::error(refused.explain(&target.rel))),
        };
        if offset > size {
            return Ok(ToolReply::error(format!(
                "offset {offset} is past the end of {} ({size} bytes)",
                target.rel
            )));
        }
        let end = length.map_or(size, |l| offset.saturating_add(l).min(size));
        if let ReadVerdict::NoticeOnly { notice } =
            self.supervisor.check_read(&target.rel, offset..end)
        {
            return Ok(ToolReply {
                result: CallResult::Notice,
                text: format!("notice: {notice}"),
            });
        }
        let wanted = end - offset;
        if !self.budget.try_spend(wanted) {
            return Ok(ToolReply::error(format!(
                "reading {} bytes {offset}..{end} needs {wanted} bytes of source, but only {} of \
                 this attempt's {} remain; read a smaller range with offset and length, or \
                 answer with what you have",
                target.rel,
                self.budget.remaining(),
                self.budget.limit()
            )));
        }
        let bytes = match read_range(file, offset, wanted) {
            Ok(b) => b,
            Err(e) => {
                // Nothing was returned, so nothing is spent.
                self.budget.refund(wanted);
                return self.io_error(&target.rel, &e);
            }
        };
        self.supervisor.record_read(&target.rel, offset..end);
        Ok(ToolReply::ok(format!(
            "[{} bytes {offset}..{end} of {size}]\n{}",
            target.rel,
            String::from_utf8_lossy(&bytes)
        )))
    }

    fn search(&mut self, pattern: &str, target: &Resolved) -> Result<ToolReply, HostFailure> {
        let regex = match regex::bytes::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
        {
            Ok(r) => r,
            Err(e) => return Ok(ToolReply::error(format!("the pattern is not a regex: {e}"))),
        };
        let is_dir = match fs::symlink_metadata(&target.abs) {
            Ok(meta) => meta.is_dir(),
            Err(e) => return self.io_error(&target.rel, &e),
        };
        // A single file named by the model is refused with the reason, as read_file would.
        let single = if is_dir {
            None
        } else {
            match open_source(&target.abs) {
                Ok(opened) => Some(opened),
                Err(Unreadable::Io(e)) => return self.io_error(&target.rel, &e),
                Err(refused) => return Ok(ToolReply::error(refused.explain(&target.rel))),
            }
        };
        if let ReadVerdict::NoticeOnly { notice } =
            self.supervisor.check_search(pattern, &target.rel)
        {
            return Ok(ToolReply {
                result: CallResult::Notice,
                text: format!("notice: {notice}"),
            });
        }
        let files = if is_dir {
            match self.files_under(&target.abs) {
                Ok(files) => files,
                Err(e) => return self.io_error(&target.rel, &e),
            }
        } else {
            vec![(target.rel.clone(), target.abs.clone())]
        };
        if is_dir {
            self.observed.listing(self.workspace, &target.rel);
        }
        for (rel, _) in &files {
            self.observed.file(self.workspace, rel);
        }
        let found = find_matches(&regex, files, single);
        if !self.budget.try_spend(found.source_bytes) {
            return Ok(ToolReply::error(format!(
                "the matches hold {} bytes of source, but only {} of this attempt's \
                 {} remain; narrow the pattern or the path, or answer with what you have",
                found.source_bytes,
                self.budget.remaining(),
                self.budget.limit()
            )));
        }
        self.supervisor.record_search(pattern, &target.rel);
        Ok(ToolReply::ok(found.reply_text()))
    }

    /// The regular files under `dir` (workspace-relative and absolute), in walk order.
    fn files_under(&self, dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
        let root = self.workspace.root();
        let mut files = Vec::new();
        walk(dir, root, &mut |rel, is_dir| {
            let abs = root.join(&rel);
            // Only regular files: a symlink found on the walk was not resolved by the jail.
            if !is_dir && fs::symlink_metadata(&abs).is_ok_and(|m| m.is_file()) {
                files.push((rel, abs));
            }
            true
        })?;
        Ok(files)
    }

    fn write(&mut self, target: &Resolved, content: &str) -> Result<ToolReply, HostFailure> {
        if target.abs.is_dir() {
            return Ok(ToolReply::error(format!("{} is a directory", target.rel)));
        }
        let rel = PathBuf::from(&target.rel);
        let mut created = Vec::new();
        let failed = match self.write_creating(target, &rel, content, &mut created) {
            Ok(reply) => return Ok(reply),
            Err(failed) => failed,
        };
        // Whatever went wrong, the directories this call made go again, deepest first, so a
        // failed write leaves nothing behind. They hold nothing: the file was not written.
        let mut left = Vec::new();
        for dir in created.iter().rev() {
            if let Err(e) = fs::remove_dir(self.workspace.root().join(dir)) {
                left.push(format!("{}: {e}", dir.display()));
            }
        }
        let host = |what: &str| HostFailure {
            evidence: format!("{what} {}: {}", target.rel, failed.error),
        };
        self.workspace.preflight(&[]).map_err(|f| HostFailure {
            evidence: f.evidence,
        })?;
        if !left.is_empty() {
            return Err(HostFailure {
                evidence: format!(
                    "could not write {}: {}, and could not remove the directories it created: {}",
                    target.rel,
                    failed.error,
                    left.join("; ")
                ),
            });
        }
        // An existing file the host cannot snapshot (a FIFO, an unreadable file) means the host
        // cannot promise to restore it (WRT-1); unless the name itself was the problem, that is
        // the host's failure, as is a filesystem that cannot hold anything more.
        if failed.stage == WriteStage::Snapshot && !is_name_error(&failed.error) {
            return Err(host("could not snapshot"));
        }
        if is_host_error(&failed.error) {
            return Err(host(failed.stage.what()));
        }
        Ok(ToolReply::error(format!(
            "{} {}: {}; nothing was written, choose another path",
            failed.stage.what(),
            target.rel,
            failed.error
        )))
    }

    /// The steps of a write; the directories made are pushed to `created` as they are made, so
    /// that [`StepTools::write`] can remove them when a later step fails.
    fn write_creating(
        &mut self,
        target: &Resolved,
        rel: &Path,
        content: &str,
        created: &mut Vec<PathBuf>,
    ) -> Result<ToolReply, WriteFailure> {
        // The missing parents are created one by one so the restore can remove exactly them.
        let mut dir = PathBuf::new();
        if let Some(parent) = rel.parent() {
            for part in parent.components() {
                dir.push(part);
                let abs = self.workspace.root().join(&dir);
                match fs::symlink_metadata(&abs) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        return Ok(ToolReply::error(format!(
                            "{} is not a directory",
                            dir.display()
                        )));
                    }
                    Err(_) => {
                        fs::create_dir(&abs).map_err(|e| WriteStage::CreateDir.failed(e))?;
                        created.push(dir.clone());
                        self.snapshots.created_dir(&dir);
                    }
                }
            }
        }
        let links = self
            .snapshots
            .before_write(rel)
            .map_err(|e| WriteStage::Snapshot.failed(e))?;
        write_atomically(&target.abs, content.as_bytes())
            .map_err(|e| WriteStage::Write.failed(e))?;
        self.supervisor.forget(&target.rel);
        self.supervisor.record_evidence();
        let mut reply = format!("wrote {} bytes to {}", content.len(), target.rel);
        if let Some(links) = links {
            reply.push_str(&format!(
                " [it had {links} hard links: the write gave this name a file of its own and the \
                 other names keep the old content, which docsfab neither read back nor kept (one \
                 may be outside the workspace); this attempt cannot be undone, so a failure of \
                 this step is not retried]"
            ));
        }
        Ok(ToolReply::ok(reply))
    }
}

/// Where a write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteStage {
    CreateDir,
    Snapshot,
    Write,
}

impl WriteStage {
    fn what(self) -> &'static str {
        match self {
            WriteStage::CreateDir => "could not create a directory for",
            WriteStage::Snapshot => "could not snapshot",
            WriteStage::Write => "could not write",
        }
    }
    fn failed(self, error: io::Error) -> WriteFailure {
        WriteFailure { stage: self, error }
    }
}

#[derive(Debug)]
struct WriteFailure {
    stage: WriteStage,
    error: io::Error,
}

/// The filesystem refused the name the model chose (too long, a file where a directory should
/// be, a character it does not take): the model can choose another.
fn is_name_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENAMETOOLONG | libc::ENOTDIR | libc::EISDIR | libc::EINVAL | libc::ELOOP)
            | Some(libc::EILSEQ)
    )
}

/// The filesystem cannot take any write (full, read-only, over quota, failing): no other name
/// would do better, so the attempt ends on the host's evidence.
fn is_host_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EROFS | libc::EIO)
    )
}

fn read_range(mut file: fs::File, offset: u64, length: u64) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = Vec::new();
    file.take(length).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A file type a read tool does not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SpecialKind {
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Other,
}

impl SpecialKind {
    /// `None` for a regular file.
    fn of(file_type: fs::FileType) -> Option<SpecialKind> {
        Some(if file_type.is_file() {
            return None;
        } else if file_type.is_dir() {
            SpecialKind::Directory
        } else if file_type.is_symlink() {
            SpecialKind::Symlink
        } else if file_type.is_fifo() {
            SpecialKind::Fifo
        } else if file_type.is_socket() {
            SpecialKind::Socket
        } else if file_type.is_char_device() {
            SpecialKind::CharDevice
        } else if file_type.is_block_device() {
            SpecialKind::BlockDevice
        } else {
            SpecialKind::Other
        })
    }

    fn name(self) -> &'static str {
        match self {
            SpecialKind::Directory => "a directory",
            SpecialKind::Symlink => "a symbolic link",
            SpecialKind::Fifo => "a named pipe (FIFO)",
            SpecialKind::Socket => "a socket",
            SpecialKind::CharDevice => "a character device",
            SpecialKind::BlockDevice => "a block device",
            SpecialKind::Other => "not a regular file",
        }
    }
}

/// Why a read tool does not return a file's content.
#[derive(Debug)]
enum Unreadable {
    /// Not a regular file: reading a FIFO blocks, a device may never end.
    Special(SpecialKind),
    /// The content has this many links; another of them may be outside the workspace.
    Linked(u64),
    Io(io::Error),
}

impl Unreadable {
    /// The tool error the model sees (not for [`Unreadable::Io`], which goes through
    /// [`StepTools::io_error`]).
    fn explain(&self, rel: &str) -> String {
        match self {
            Unreadable::Special(kind) => format!(
                "{rel} is {}, not a regular file; the read tools read regular files only",
                kind.name()
            ),
            Unreadable::Linked(links) => format!(
                "{rel} has {links} hard links; docsfab reads only files with a single link, \
                 because another link to the same content may be outside the workspace"
            ),
            Unreadable::Io(e) => format!("{rel}: {e}"),
        }
    }
}

/// What a search found: the matching lines as shown, the source bytes they hold, and the
/// files skipped for having more than one hard link.
struct Matches {
    lines: Vec<String>,
    source_bytes: u64,
    linked: u64,
}

/// Searches `files` in order, up to [`MAX_SEARCH_MATCHES`] lines. `single` is the already
/// opened file when the model named one file (so it is not opened twice).
fn find_matches(
    regex: &regex::bytes::Regex,
    files: Vec<(String, PathBuf)>,
    mut single: Option<(fs::File, fs::Metadata)>,
) -> Matches {
    let mut found = Matches {
        lines: Vec::new(),
        source_bytes: 0,
        linked: 0,
    };
    'files: for (rel, abs) in files {
        let opened = match single.take() {
            Some(opened) => Ok(opened),
            None => open_source(&abs),
        };
        let (file, meta) = match opened {
            Ok(opened) => opened,
            Err(Unreadable::Linked(_)) => {
                found.linked += 1;
                continue;
            }
            // Swapped for something else since the walk, or unreadable: not source.
            Err(_) => continue,
        };
        if meta.len() > MAX_SEARCH_FILE_BYTES {
            continue;
        }
        let mut bytes = Vec::new();
        // The limit holds even if the file grows after the descriptor's size was read.
        if file
            .take(MAX_SEARCH_FILE_BYTES)
            .read_to_end(&mut bytes)
            .is_err()
        {
            continue;
        }
        if bytes[..bytes.len().min(8192)].contains(&0) {
            continue; // binary
        }
        for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
            if regex.is_match(line) {
                let shown = cut_utf8(line, MAX_MATCH_LINE_BYTES);
                found.source_bytes += shown.len() as u64;
                found.lines.push(format!("{rel}:{}: {shown}", n + 1));
                if found.lines.len() >= MAX_SEARCH_MATCHES {
                    break 'files;
                }
            }
        }
    }
    found
}

impl Matches {
    /// The reply the model gets: the lines, or `no matches`, and a note for a search stopped at
    /// its cap or for skipped hard-linked files.
    fn reply_text(&self) -> String {
        let mut text = if self.lines.is_empty() {
            "no matches".to_owned()
        } else {
            self.lines.join("\n")
        };
        if self.lines.len() >= MAX_SEARCH_MATCHES {
            text.push_str(&format!(
                "\n[stopped after {MAX_SEARCH_MATCHES} matches; narrow the search]"
            ));
        }
        if self.linked > 0 {
            let linked = self.linked;
            let files = if linked == 1 { "file" } else { "files" };
            text.push_str(&format!(
                "\n[skipped {linked} {files} with more than one hard link: another link to the \
                 same content may be outside the workspace, so docsfab does not read it]"
            ));
        }
        text
    }
}

/// Opens a file whose content a read tool may return: a regular file with one link.
///
/// The path is checked first so a special file is never opened (opening a device can have
/// effects), then opened without following a final symlink and without blocking on a FIFO,
/// and the descriptor's own metadata (fstat) decides: whatever replaced the path in between,
/// the content read is that of the file checked. The metadata returned is the descriptor's.
fn open_source(abs: &Path) -> Result<(fs::File, fs::Metadata), Unreadable> {
    let check = |meta: &fs::Metadata| {
        if let Some(kind) = SpecialKind::of(meta.file_type()) {
            return Err(Unreadable::Special(kind));
        }
        if meta.nlink() > 1 {
            return Err(Unreadable::Linked(meta.nlink()));
        }
        Ok(())
    };
    check(&fs::symlink_metadata(abs).map_err(Unreadable::Io)?)?;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(abs)
        .map_err(Unreadable::Io)?;
    let meta = file.metadata().map_err(Unreadable::Io)?;
    check(&meta)?;
    Ok((file, meta))
}

/// At most `max` bytes of `line`, cut back to a character boundary, without a trailing CR.
fn cut_utf8(line: &[u8], max: usize) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    if text.len() <= max {
        return text.into_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write step's tools on a workspace with `docs/`.
    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("docs")).unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        (dir, ws)
    }

    fn policy() -> ToolPolicy {
        ToolPolicy {
            offered: vec![Tool::WriteFile],
            write_roots: vec!["docs/".into()],
            source_read_bytes: 0,
        }
    }

    /// A write of `rel` as if the jail had let it through, so the filesystem's own refusal is
    /// what the write meets: the second line of defence behind the jail's name checks.
    fn unchecked_write(tools: &mut StepTools<'_>, root: &Path, rel: &str) -> ToolReply {
        let target = Resolved {
            rel: rel.to_owned(),
            abs: root.join(rel),
        };
        let op = Op::Write {
            target,
            content: "x".into(),
        };
        tools.execute(Authorized { op }).unwrap()
    }

    fn entries(dir: &Path) -> usize {
        fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn hardening_a_name_the_filesystem_refuses_is_a_tool_error_and_the_made_dirs_go() {
        let (_d, ws) = workspace();
        let root = ws.root().to_owned();
        let mut tools = StepTools::for_attempt(&ws, policy());
        // The file name is refused by the filesystem after `docs/new` was made for it.
        let rel = format!("docs/new/{}.md", "a".repeat(300));
        let reply = unchecked_write(&mut tools, &root, &rel);
        assert_eq!(reply.result, CallResult::ToolError);
        assert!(reply.text.contains("File name too long"), "{}", reply.text);
        assert!(reply.text.contains("nothing was written"), "{}", reply.text);
        assert_eq!(entries(&root.join("docs")), 0, "docs/new was removed");
        tools.snapshots.restore().unwrap();
    }

    #[test]
    fn hardening_a_path_past_path_max_is_a_tool_error_and_leaves_no_directory() {
        let (_d, ws) = workspace();
        let root = ws.root().to_owned();
        let mut tools = StepTools::for_attempt(&ws, policy());
        // As in the finding: directories are made until the path passes PATH_MAX.
        let rel = format!("docs/{}x.md", "dd/".repeat(2_000));
        let reply = unchecked_write(&mut tools, &root, &rel);
        assert_eq!(reply.result, CallResult::ToolError);
        assert!(
            reply
                .text
                .starts_with("error: could not create a directory for"),
            "{}",
            &reply.text[..80]
        );
        assert_eq!(
            entries(&root.join("docs")),
            0,
            "every made directory was removed"
        );
        // The same tools still write a good path.
        let ok = unchecked_write(&mut tools, &root, "docs/ok.md");
        assert_eq!(ok.result, CallResult::Ok);
    }

    #[test]
    fn hardening_only_a_filesystem_that_takes_nothing_is_the_hosts_failure() {
        let os = io::Error::from_raw_os_error;
        for code in [libc::ENOSPC, libc::EDQUOT, libc::EROFS, libc::EIO] {
            assert!(is_host_error(&os(code)), "{code}");
            assert!(!is_name_error(&os(code)), "{code}");
        }
        for code in [
            libc::ENAMETOOLONG,
            libc::ENOTDIR,
            libc::EISDIR,
            libc::EINVAL,
        ] {
            assert!(is_name_error(&os(code)), "{code}");
            assert!(!is_host_error(&os(code)), "{code}");
        }
        // Not a name the model chose: an existing special file the snapshot cannot keep.
        assert!(!is_name_error(&io::Error::other(
            "docs/pipe.md is not a regular file"
        )));
    }
}
