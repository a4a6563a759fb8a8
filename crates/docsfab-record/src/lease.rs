//! The tool ledger's and the execution lease's record types (LSE-1..LSE-3): one turn's tool
//! batch, and why the lease stopped.

use serde::{Deserialize, Serialize};

/// Why a tool call was rejected before host authorization (LSE-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RejectReason {
    /// The model named a tool that this step does not offer.
    UnknownTool,
    /// The arguments are not JSON.
    InvalidArguments,
    /// The arguments end before the JSON does (the stream cut the call short).
    TruncatedArguments,
    /// The arguments are JSON but do not meet the tool's parameter schema.
    SchemaMismatch,
}

/// How an executed tool call ended. Tool errors are data the model sees, not host failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CallResult {
    /// The tool returned content.
    Ok,
    /// The tool returned an error message to the model (missing file, budget spent, ...).
    ToolError,
    /// Read supervision answered with a notice instead of content (LSE-4).
    Notice,
}

/// What became of one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum CallOutcome {
    /// Rejected before host authorization; nothing ran.
    Rejected {
        reason: RejectReason,
        detail: String,
    },
    /// Host authorization refused it (a path outside the workspace or outside `writeRoots`);
    /// nothing ran and the model got the reason as a tool error.
    Refused { detail: String },
    /// Authorized and run. `result` is `null` when no result was recorded (the host lost it):
    /// that is missing evidence, never "nothing happened".
    Executed { result: Option<CallResult> },
}

/// One tool call as the ledger keeps it. (serde cannot deny unknown fields beside a flattened
/// enum; the JSON Schema does.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallEntry {
    /// The provider's id for the call.
    pub id: String,
    /// The tool name exactly as the model sent it.
    pub tool: String,
    #[serde(flatten)]
    pub outcome: CallOutcome,
}

/// The tool batch of one turn: counts plus every call. `rejected` counts both rejections and
/// refusals, so `requested = rejected + executed` in a consistent batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolBatch {
    pub requested: u32,
    pub rejected: u32,
    pub executed: u32,
    #[serde(default)]
    pub calls: Vec<ToolCallEntry>,
}

impl ToolBatch {
    /// Whether the counts agree with the calls and every executed call has its result.
    pub fn is_consistent(&self) -> bool {
        let executed = self
            .calls
            .iter()
            .filter(|c| matches!(c.outcome, CallOutcome::Executed { .. }))
            .count();
        let rejected = self.calls.len() - executed;
        let results_present = self
            .calls
            .iter()
            .all(|c| !matches!(c.outcome, CallOutcome::Executed { result: None }));
        count_eq(self.requested, self.calls.len())
            && count_eq(self.executed, executed)
            && count_eq(self.rejected, rejected)
            && results_present
    }
}

fn count_eq(count: u32, len: usize) -> bool {
    usize::try_from(count).ok() == Some(len)
}

/// Why the lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseStop {
    /// The model answered without tool calls; the answer goes to the contract.
    Answered,
    /// All `maxTurns` provider turns are used.
    MaxTurns,
    /// The host's attempt timer fired.
    Deadline,
    /// Read supervision saw repeated notice-only re-reads without new evidence (LSE-4).
    NoProgress,
    /// The executed-call evidence of the last turn did not support renewal (LSE-3).
    RenewalRefused,
    /// A host preflight check failed (LSE-2); `evidence` says which.
    PreflightFailed,
    /// The provider request failed (after any in-turn replays).
    ProviderFailed,
    Cancelled,
    /// A pages step wrote its pages; it sends no request (docs/pages.md).
    PagesWritten,
}

/// What the stop means for the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Disposition {
    /// An answer was delivered for the contract to judge.
    Completed,
    /// A ceiling (turns, time) ended the lease.
    Exhausted,
    /// The host stopped the attempt (no progress, renewal refused).
    Stopped,
    /// The host or the provider failed.
    Failed,
    Cancelled,
}

impl LeaseStop {
    pub fn disposition(self) -> Disposition {
        match self {
            LeaseStop::Answered | LeaseStop::PagesWritten => Disposition::Completed,
            LeaseStop::MaxTurns | LeaseStop::Deadline => Disposition::Exhausted,
            LeaseStop::NoProgress | LeaseStop::RenewalRefused => Disposition::Stopped,
            LeaseStop::PreflightFailed | LeaseStop::ProviderFailed => Disposition::Failed,
            LeaseStop::Cancelled => Disposition::Cancelled,
        }
    }
}
