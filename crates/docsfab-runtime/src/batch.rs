//! Runs one turn's tool batch: each call through validation, host authorization, the lease and
//! execution, recorded in the ledger. This is the piece of the agent loop between "the provider
//! answered with tool calls" and the checkpoint.

use crate::composition::Tool;
use crate::ledger::{BatchBuilder, CallResult, ExecutionLease, LeaseStop, ToolBatch};
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
