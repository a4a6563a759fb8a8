//! Runs one turn's tool batch: each call through validation, host authorization, the lease and
//! execution, recorded in the ledger. This is the piece of the agent loop between "the provider
//! answered with tool calls" and the checkpoint.

use docsfab_boundary::Redactor;
use docsfab_record::{CallOutcome, CallResult, LeaseStop, ToolBatch};

use crate::composition::Tool;
use crate::ledger::{BatchBuilder, ExecutionLease};
use crate::tools::{HostFailure, StepTools};

/// Told, before a write tool runs, which tool will write which workspace-relative path; the
/// executor commits it to the run store as a write intent. An error means the write must not
/// run: see [`WriteVeto`].
pub type BeforeWrite<'a> = &'a (dyn Fn(Tool, &str) -> Result<(), WriteVeto> + Send + Sync);

/// Why the executor stopped a write before it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteVeto {
    /// The intent could not be recorded: the host failed, and the batch stops.
    Unrecorded(String),
    /// The path is not this writer's to write (a sibling fan-out instance owns it): the model
    /// gets this sentence as a tool error and may write elsewhere.
    Refused(String),
}

/// A tool call as the provider returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedCall {
    pub id: String,
    pub name: String,
    /// The raw argument text, which may be cut short or not JSON at all.
    pub arguments: String,
}

/// What the model is told about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallReply {
    pub id: String,
    pub text: String,
    /// Whether the reply reports an error (a rejection, a refusal or a tool error), for APIs
    /// that flag tool results as errors. A read-supervision notice is not an error.
    pub is_error: bool,
}

/// The result of running a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    pub batch: ToolBatch,
    /// One reply per call that was answered, in order. Empty after a host failure: the
    /// attempt ends and the model is not asked again.
    pub replies: Vec<CallReply>,
    /// Set when the host failed; the lease has then ended as `preflight-failed` with it.
    pub host_failure: Option<HostFailure>,
}

/// Runs `calls` in order. A rejection or refusal answers the model with an error and runs
/// nothing; an authorized call is counted by the lease before it runs. A host failure stops the
/// batch and ends the lease with its evidence (LSE-2); the call that failed keeps no result, and
/// the calls after it are recorded as refused.
pub fn run_batch(
    tools: &mut StepTools<'_>,
    lease: &mut ExecutionLease,
    calls: &[RequestedCall],
) -> BatchOutcome {
    run_batch_with(tools, lease, calls, None)
}

/// [`run_batch`], calling `before_write` before each authorized write runs. When it fails the
/// write does not run: the batch stops as a host failure with its evidence, like a preflight.
pub fn run_batch_with(
    tools: &mut StepTools<'_>,
    lease: &mut ExecutionLease,
    calls: &[RequestedCall],
    before_write: Option<BeforeWrite<'_>>,
) -> BatchOutcome {
    let mut builder = BatchBuilder::new();
    let mut replies = Vec::new();
    let mut host_failure = None;
    for call in calls {
        if host_failure.is_some() {
            builder.refuse(
                &call.id,
                &call.name,
                "not run: the host failed earlier in the batch",
            );
            continue;
        }
        let reply = |text: String, is_error: bool| CallReply {
            id: call.id.clone(),
            text,
            is_error,
        };
        let valid = match tools.validate(&call.name, &call.arguments) {
            Ok(valid) => valid,
            Err(rejection) => {
                builder.reject(&call.id, &call.name, rejection.reason, &rejection.detail);
                replies.push(reply(format!("error: {}", rejection.detail), true));
                continue;
            }
        };
        let authorized = match tools.authorize(valid) {
            Ok(authorized) => authorized,
            Err(refusal) => {
                // A path that cannot be resolved because the workspace itself is gone is the
                // host's failure, not the model's mistake.
                if let Err(failure) = tools.preflight() {
                    builder.refuse(&call.id, &call.name, "not run: the host preflight failed");
                    lease.stop(LeaseStop::PreflightFailed, Some(failure.evidence.clone()));
                    host_failure = Some(HostFailure {
                        evidence: failure.evidence,
                    });
                    continue;
                }
                let detail = refusal.to_string();
                builder.refuse(&call.id, &call.name, &detail);
                replies.push(reply(format!("error: {detail}"), true));
                continue;
            }
        };
        let tool = authorized.tool();
        let veto = match (before_write, authorized.write_path()) {
            (Some(hook), Some(path)) => hook(tool, path).err().map(|v| (path, v)),
            _ => None,
        };
        if let Some((_, WriteVeto::Refused(detail))) = &veto {
            builder.refuse(&call.id, &call.name, detail);
            replies.push(reply(format!("error: {detail}"), true));
            continue;
        }
        if let Some((path, WriteVeto::Unrecorded(e))) = veto {
            let evidence = format!("the intent to write {path} could not be recorded: {e}");
            builder.refuse(
                &call.id,
                &call.name,
                "not run: the host could not record the write",
            );
            lease.stop(LeaseStop::PreflightFailed, Some(evidence.clone()));
            host_failure = Some(HostFailure { evidence });
            continue;
        }
        if let Err(e) = lease.authorize(tool) {
            let detail = e.to_string();
            builder.refuse(&call.id, &call.name, &detail);
            replies.push(reply(format!("error: {detail}"), true));
            continue;
        }
        let slot = builder.start(&call.id, tool);
        match tools.execute(authorized) {
            Ok(answer) => {
                builder.finish(slot, answer.result);
                let is_error = answer.result == CallResult::ToolError;
                replies.push(reply(answer.text, is_error));
            }
            Err(failure) => {
                lease.stop(LeaseStop::PreflightFailed, Some(failure.evidence.clone()));
                host_failure = Some(failure);
            }
        }
    }
    if host_failure.is_some() {
        replies.clear();
    }
    BatchOutcome {
        batch: builder.build(),
        replies,
        host_failure,
    }
}

/// One call of a turn as progress names it: the tool, what it was pointed at (the path, and a
/// search's pattern) and how it ended. Built from the model's own arguments, so every word of it
/// has passed the redactor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolUse {
    pub tool: String,
    /// `src/lib.rs`, or `"fn main" in src` for a search; `None` when the arguments name nothing
    /// (a `list_files` of the root, or arguments that are not JSON).
    pub target: Option<String>,
    pub outcome: CallOutcome,
}

/// The most characters a target or a refusal's detail keeps in a progress line.
const USE_MAX_CHARS: usize = 80;

/// The calls of a batch as progress names them, in the order they were asked for. `batch` holds
/// one entry per call of `calls`, in the same order (the batch runner pushes one for each).
pub fn tool_uses(calls: &[RequestedCall], batch: &ToolBatch, redactor: &Redactor) -> Vec<ToolUse> {
    calls
        .iter()
        .zip(&batch.calls)
        .map(|(call, entry)| ToolUse {
            tool: redactor.word(&entry.tool),
            target: call_target(&call.arguments).map(|t| redactor.line_capped(&t, USE_MAX_CHARS)),
            outcome: match &entry.outcome {
                CallOutcome::Rejected { reason, detail } => CallOutcome::Rejected {
                    reason: *reason,
                    detail: redactor.line_capped(detail, USE_MAX_CHARS),
                },
                CallOutcome::Refused { detail } => CallOutcome::Refused {
                    detail: redactor.line_capped(detail, USE_MAX_CHARS),
                },
                executed => executed.clone(),
            },
        })
        .collect()
}

/// What a call's arguments point at: its `path`, with a search's `pattern` in front. Read from
/// the raw arguments, so a rejected call still shows what it asked for.
fn call_target(arguments: &str) -> Option<String> {
    let args: serde_json::Value = serde_json::from_str(arguments).ok()?;
    let text = |key: &str| args.get(key).and_then(serde_json::Value::as_str);
    match (text("pattern"), text("path")) {
        // The redactor escapes what a terminal must not see; quotes only mark the pattern's ends.
        (Some(p), Some(path)) => Some(format!("\"{p}\" in {path}")),
        (Some(p), None) => Some(format!("\"{p}\"")),
        (None, Some(path)) => Some(path.to_owned()),
        (None, None) => None,
    }
}
