//! What the step policy is told about a failed attempt: why it failed ([`AttemptFailure`]) and,
//! for a write step, what the host proved about its writes ([`StepAccess`], [`WriteSettlement`]).

use docsfab_record::{
    ContextWindow, ContractFailure, ProviderErrorClass, RecordedSettlement, TimeoutKind,
};
use serde::{Deserialize, Serialize};

use crate::class::ProviderFailure;
use crate::rules::Condition;

/// A step's access, and for a write step what the host proved about the failed attempt's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "access", content = "writeSettlement", rename_all = "kebab-case")]
pub enum StepAccess {
    /// The step cannot write, so any retry the rules allow is safe.
    ReadOnly,
    /// The step may write: it retries only after a transport failure, and only when the
    /// settlement proves its writes away or undone (STP-1, WRT-2).
    Write(WriteSettlement),
}

/// What the host proved about writes during the failed attempt of a write step (WRT-1..3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteSettlement {
    /// No filesystem write tool ran.
    NoWrite,
    /// A write ran and the host restored the workspace to its pre-attempt state.
    WriteExecutedAndRestored,
    /// A write ran and the restore failed.
    RestoreFailed,
    /// The proof could not be made (missing result, unreadable ledger, unknown tool, counters
    /// that do not reconcile).
    Unavailable,
}

impl WriteSettlement {
    /// What the attempt's record says about its writes (WRT-3): whether a restore ran, and held,
    /// is not part of it.
    pub fn recorded(self) -> RecordedSettlement {
        match self {
            WriteSettlement::NoWrite => RecordedSettlement::NoWrite,
            WriteSettlement::WriteExecutedAndRestored | WriteSettlement::RestoreFailed => {
                RecordedSettlement::WriteExecuted
            }
            WriteSettlement::Unavailable => RecordedSettlement::Unavailable,
        }
    }

    /// Whether a retry is safe: nothing was written, or it was undone.
    pub(super) fn permits_retry(self) -> bool {
        matches!(
            self,
            WriteSettlement::NoWrite | WriteSettlement::WriteExecutedAndRestored
        )
    }
}

/// A refusal a validator marked terminal (STP-14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ValidatorRefusal {
    /// The answer contained credential material.
    CredentialMaterial,
    /// The answer asked for authority the step does not have. STP-14 names this refusal, but no
    /// validator in docsfab produces it yet (the runtime only refuses credential material); a
    /// validator that judges an answer's requests against the step's access would, and the
    /// policy already keeps it terminal.
    AuthorityRefusal,
}

/// Why an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AttemptFailure {
    /// The reply broke the step's contract.
    Contract { failure: ContractFailure },
    /// The answer was cut at the output limit with no continuation left, or completed by a
    /// continuation and then refused (STP-10).
    CutAnswer,
    /// The host's attempt timer fired (STP-11).
    AttemptDeadline,
    /// The runtime stopped the attempt as no-progress (STP-12).
    NoProgress,
    /// A request that left the host failed; its class decides (STP-3).
    Provider { failure: ProviderFailure },
    /// The host refused the request before sending; only its text is known (STP-4).
    RefusedBeforeSend { error_text: String },
    /// A validator refused the answer terminally (STP-14).
    ValidatorTerminal { refusal: ValidatorRefusal },
    /// The model's context was exhausted (STP-14). `context` holds the token counts the
    /// provider's refusal gave, for the failure's wording and record only: it decides nothing.
    ContextExhausted {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<ContextWindow>,
    },
    /// The run's token or cost budget could not take the next request's worst case, so it was
    /// not sent. `bound` names the budget (`run-max-tokens-bound`, `run-max-cost-bound`) and
    /// `message` is its sentence. Terminal: no retry spends past a run budget.
    BudgetExhausted { bound: String, message: String },
    /// The caller cancelled the attempt.
    Cancelled,
}

impl AttemptFailure {
    /// The judged condition, for failures the condition rules decide.
    pub(super) fn condition(&self) -> Option<Condition> {
        match self {
            AttemptFailure::Contract { failure } => Some(match failure {
                ContractFailure::Prose => Condition::ContractProse,
                ContractFailure::Array => Condition::ContractArray,
                ContractFailure::Empty => Condition::ContractEmpty,
                ContractFailure::SchemaInvalid => Condition::ContractSchemaInvalid,
                ContractFailure::Ungrounded => Condition::ContractUngrounded,
            }),
            AttemptFailure::CutAnswer => Some(Condition::CutAnswer),
            AttemptFailure::AttemptDeadline => Some(Condition::AttemptDeadline),
            AttemptFailure::NoProgress => Some(Condition::NoProgress),
            AttemptFailure::ValidatorTerminal { .. } => Some(Condition::ValidatorTerminal),
            AttemptFailure::ContextExhausted { .. } => Some(Condition::ContextExhausted),
            AttemptFailure::Cancelled => Some(Condition::Cancelled),
            AttemptFailure::Provider { .. }
            | AttemptFailure::RefusedBeforeSend { .. }
            | AttemptFailure::BudgetExhausted { .. } => None,
        }
    }

    /// `attempt-deadline` for the host timer, `provider-timeout` for a provider timeout class.
    pub fn timeout_kind(&self) -> Option<TimeoutKind> {
        match self {
            AttemptFailure::AttemptDeadline => Some(TimeoutKind::AttemptDeadline),
            AttemptFailure::Provider { failure }
                if failure.class == ProviderErrorClass::Timeout =>
            {
                Some(TimeoutKind::ProviderTimeout)
            }
            _ => None,
        }
    }
}

/// The category and rule of a run budget's refusal (docs/cost.md).
pub const BUDGET_EXHAUSTED: &str = "budget-exhausted";
