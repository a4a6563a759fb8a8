//! The step's vocabulary as the record spells it: access, budgets, retry decisions, timeouts,
//! write settlement, contract failures, the step's failure and its transport budget.

use serde::{Deserialize, Serialize};

/// The `writeSettlement` of an attempt in the run record (WRT-3): what the host proved about
/// the writes of a failed attempt of a write step, without the restore that may have followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecordedSettlement {
    /// No filesystem write tool ran.
    NoWrite,
    /// At least one write ran (whatever its result).
    WriteExecuted,
    /// The proof could not be made.
    Unavailable,
}

impl RecordedSettlement {
    /// The record's spelling: `no-write`, `write-executed` or `unavailable`.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordedSettlement::NoWrite => "no-write",
            RecordedSettlement::WriteExecuted => "write-executed",
            RecordedSettlement::Unavailable => "unavailable",
        }
    }
}

/// How the contract judged a reply that was not the JSON object it asks for (STP-9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContractFailure {
    /// Text that is not JSON.
    Prose,
    /// A JSON array where an object is asked for.
    Array,
    /// Nothing, or only whitespace.
    Empty,
    /// A JSON object that fails the step's schema.
    SchemaInvalid,
    /// A JSON object that meets the schema but cites names the workspace does not hold
    /// (`contract.grounding`, docs/grounding.md).
    Ungrounded,
}

impl ContractFailure {
    /// The record's spelling: `prose`, `array`, `empty`, `schema-invalid` or `ungrounded`.
    pub fn as_str(self) -> &'static str {
        match self {
            ContractFailure::Prose => "prose",
            ContractFailure::Array => "array",
            ContractFailure::Empty => "empty",
            ContractFailure::SchemaInvalid => "schema-invalid",
            ContractFailure::Ungrounded => "ungrounded",
        }
    }
}

/// Which timer ended a timed-out attempt (STP-11). `timeoutKind` in the run record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeoutKind {
    /// The host's own attempt timer (`limits.timeoutMs`).
    AttemptDeadline,
    /// The provider's side: HTTP 408 or 504, or the client's request timeout.
    ProviderTimeout,
}

/// The structured-output constraint an attempt's requests carried (`outputConstraint` in the
/// record; `null` when none was sent). The constraint only helps the model: the contract
/// validator still judges every answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputConstraint {
    /// The contract's schema in strict mode (OpenAI `strict: true`; Anthropic's
    /// `output_config.format`, which is always strict): the schema met the strict rules.
    JsonSchemaStrict,
    /// The contract's schema without strict mode (OpenAI `strict: false`): the server may treat
    /// it as a hint or, as llama.cpp does, compile it into a grammar.
    JsonSchema,
    /// Only "some JSON object" (`response_format: {type: json_object}`).
    JsonObject,
}

impl OutputConstraint {
    pub fn as_str(self) -> &'static str {
        match self {
            OutputConstraint::JsonSchemaStrict => "json-schema-strict",
            OutputConstraint::JsonSchema => "json-schema",
            OutputConstraint::JsonObject => "json-object",
        }
    }
}

/// The budget that pays for an attempt (`budget` in the record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Budget {
    /// The step's first attempt, which no budget pays for.
    Initial,
    /// A contract-correction retry (`retry.maxRetries`).
    Contract,
    /// A retry after a transport failure (`retry.maxTransportRetries`).
    Transport,
}

impl Budget {
    /// The record's spelling: `initial`, `contract` or `transport`.
    pub fn as_str(self) -> &'static str {
        match self {
            Budget::Initial => "initial",
            Budget::Contract => "contract",
            Budget::Transport => "transport",
        }
    }

    /// How progress names it beside an attempt: `initial`, `contract budget` or
    /// `transport budget`.
    pub fn label(self) -> &'static str {
        match self {
            Budget::Initial => "initial",
            Budget::Contract => "contract budget",
            Budget::Transport => "transport budget",
        }
    }
}

/// `retryDecision` in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryDecision {
    /// Nothing was decided: the attempt succeeded, or the caller cancelled it.
    None,
    /// Another attempt follows.
    Scheduled,
    /// A retry was allowed by the rules but a budget bound refused it.
    Exhausted,
    /// The failure is never retried.
    Terminal,
    /// A write step whose writes could not be proven away or undone (WRT-2).
    Declined,
}

impl RetryDecision {
    /// `retryScheduled` in the record: true exactly when another attempt follows.
    pub fn is_scheduled(self) -> bool {
        self == RetryDecision::Scheduled
    }
}

/// How a step's ending failure reads in the record and to the operator (`failure` in the run
/// record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepFailure {
    /// What kind of failure ended the step (`contract-violation`, `provider-transient`,
    /// `declined-write-step`, ...): what an operator filters on.
    pub category: String,
    /// Whose side failed: `model-output`, `infrastructure`, `provider`, `host`, `policy` or
    /// `cancelled`.
    pub failure_class: String,
    /// The precise failure (`contract-prose`, `provider-timeout`, `write-restore-failed`, ...).
    pub code: String,
    /// One or two sentences saying what happened; a refused bound names itself here (STP-7).
    pub message: String,
    /// What the operator can do about it.
    pub remediation: String,
    /// For `context-exhausted` after a provider's context-overflow refusal: the token counts
    /// its error gave. Absent otherwise, and in records written before docsfab kept them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextWindow>,
}

/// The sizes a provider's context-overflow refusal reported, in tokens. Each is absent when the
/// server did not say (OpenAI's error code alone says none; llama.cpp and vLLM say most).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContextWindow {
    /// The prompt's size as the server counted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// The model's (or server slot's) context size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_tokens: Option<u64>,
    /// The output the request asked room for (`max_tokens`), when the server named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
}

/// The transport budget a step applies (`transportRetry` in the run record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TransportRetry {
    /// `retry.maxTransportRetries`.
    pub max_transport_retries: u32,
    /// `retry.transportMaxDelayMs`.
    pub transport_max_delay_ms: u64,
    /// `retry.transportMaxElapsedMs`.
    pub transport_max_elapsed_ms: u64,
    /// The base of the transport backoff (`DOCSFAB_RETRY_BASE_DELAY_MS`).
    pub base_delay_ms: u64,
}

/// Whether a step may change the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    ReadOnly,
    Write,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::ReadOnly => "read-only",
            Access::Write => "write",
        }
    }
}
