//! How a failed attempt reads in the record: the category, class, code, message and remedy of
//! each failure, and the sentence of a budget bound or a declined write step that ends a step.

use docsfab_record::{ContextWindow, ContractFailure, ProviderErrorClass, StepFailure};

use super::attempt::{AttemptFailure, BUDGET_EXHAUSTED, ValidatorRefusal, WriteSettlement};
use crate::class::ProviderFailure;

/// The record fields of a failure, before any bound is named.
pub(super) struct Facts {
    category: &'static str,
    failure_class: &'static str,
    code: String,
    message: String,
    remediation: std::borrow::Cow<'static, str>,
    /// The token counts of a context overflow, carried to the failure record.
    context: Option<ContextWindow>,
}

/// The facts of an answer the contract refused: what it was, and what to do about it.
fn contract_facts(failure: ContractFailure) -> Facts {
    let (code, message, remediation) = match failure {
        ContractFailure::Ungrounded => (
            "contract-ungrounded",
            "The model's answer cites names the workspace does not hold.".to_owned(),
            "The attempts list each unknown name with the nearest real ones; have the step read the sources it documents (give it read_file and search_text), or lower what it must cite.",
        ),
        other => {
            let (code, what) = match other {
                ContractFailure::Array => ("contract-array", "a JSON array"),
                ContractFailure::Empty => ("contract-empty", "an empty reply"),
                ContractFailure::SchemaInvalid => {
                    ("contract-schema-invalid", "an object that fails the schema")
                }
                ContractFailure::Prose | ContractFailure::Ungrounded => ("contract-prose", "prose"),
            };
            (
                code,
                format!(
                    "The model returned {what} where the step's contract asks for a JSON object."
                ),
                "Make the step's instructions ask for the JSON object plainly, or choose a model that follows the contract.",
            )
        }
    };
    Facts {
        category: "contract-violation",
        failure_class: "model-output",
        code: code.to_owned(),
        message,
        remediation: std::borrow::Cow::Borrowed(remediation),
        context: None,
    }
}

impl Facts {
    pub(super) fn of(failure: &AttemptFailure) -> Facts {
        let fact = |category, failure_class, code: &str, message: &str, remediation| Facts {
            category,
            failure_class,
            code: code.to_string(),
            message: message.to_string(),
            remediation: std::borrow::Cow::Borrowed(remediation),
            context: None,
        };
        match failure {
            AttemptFailure::Contract { failure } => contract_facts(*failure),
            AttemptFailure::CutAnswer => fact(
                "cut-answer",
                "model-output",
                "cut-answer",
                "The answer was cut at the output limit.",
                "Raise the composition's maxOutputTokens or ask for a shorter answer.",
            ),
            AttemptFailure::AttemptDeadline => fact(
                "attempt-deadline",
                "host",
                "attempt-deadline",
                "The attempt timer fired before the model answered.",
                "Raise the composition's timeoutMs or narrow what the step reads.",
            ),
            AttemptFailure::NoProgress => fact(
                "no-progress",
                "model-output",
                "no-progress",
                "The model kept re-reading sources without new evidence.",
                "Narrow the step's instructions so the model can answer from what it read.",
            ),
            AttemptFailure::Provider { failure } => provider_facts(failure),
            AttemptFailure::RefusedBeforeSend { error_text } => fact(
                "request-refused",
                "host",
                "request-refused",
                &format!("docsfab refused the request before sending it: {error_text}"),
                "Fix the cause named in the message; the rules table decides whether such a refusal is retried.",
            ),
            AttemptFailure::ValidatorTerminal { refusal } => {
                let (code, message) = match refusal {
                    ValidatorRefusal::CredentialMaterial => (
                        "credential-material",
                        "The answer contained credential material and was refused.",
                    ),
                    ValidatorRefusal::AuthorityRefusal => (
                        "authority-refusal",
                        "The answer asked for authority the step does not have and was refused.",
                    ),
                };
                fact(
                    "validator-terminal",
                    "policy",
                    code,
                    message,
                    "Review the step's sources and instructions; this refusal is never retried.",
                )
            }
            AttemptFailure::ContextExhausted { context } => context_facts(*context),
            AttemptFailure::BudgetExhausted { bound, message } => fact(
                BUDGET_EXHAUSTED,
                "host",
                bound,
                message,
                "Raise the composition's limits.maxRunTokens or the provider's budget.maxRunCostUsd in host.yaml, or make the run smaller; no retry spends past a run budget.",
            ),
            AttemptFailure::Cancelled => fact(
                "cancelled",
                "cancelled",
                "cancelled",
                "The step was cancelled.",
                "Run it again when ready.",
            ),
        }
    }

    /// The failure record. When a budget bound refused the retry, the message is the bound's
    /// sentence and the remediation says how to widen or avoid it (STP-7).
    pub(super) fn failure(&self, bound: Option<String>) -> StepFailure {
        let (message, remediation) = match bound {
            Some(bound) => (bound, bound_remediation(self.category).to_string()),
            None => (self.message.clone(), self.remediation.to_string()),
        };
        StepFailure {
            category: self.category.to_string(),
            failure_class: self.failure_class.to_string(),
            code: self.code.clone(),
            message,
            remediation,
            context: self.context,
        }
    }
}

fn bound_remediation(category: &str) -> &'static str {
    match category {
        "provider-throttled" | "provider-transient" | "request-refused" => {
            "The provider kept failing in transport; check its status and the network, then run again. DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES (0..6) sets the transport budget."
        }
        _ => {
            "The model did not meet the step within its correction budget; adjust the step's instructions or model, then run again. DOCSFAB_READ_ONLY_MAX_RETRIES (0..3) and the condition budgets set that budget."
        }
    }
}

fn provider_facts(f: &ProviderFailure) -> Facts {
    let (category, failure_class, remediation) = match f.class {
        ProviderErrorClass::RateLimit if f.is_throttled() => (
            "provider-throttled",
            "infrastructure",
            "Wait for the provider's throttle to clear, or lower the request rate.",
        ),
        ProviderErrorClass::Network
        | ProviderErrorClass::Server
        | ProviderErrorClass::Timeout
        | ProviderErrorClass::StreamIncomplete => (
            "provider-transient",
            "infrastructure",
            "Check the provider's status and the network, then run again.",
        ),
        ProviderErrorClass::RateLimit => (
            "provider-quota",
            "provider",
            "Check the provider account's quota; a retry does not outlast it.",
        ),
        ProviderErrorClass::Authentication => (
            "provider-refused",
            "provider",
            "Check the API key named by apiKeyEnv in host.yaml and its permissions.",
        ),
        ProviderErrorClass::ContentFilter => (
            "provider-refused",
            "provider",
            "The provider's content filter refused the request; change the step's inputs.",
        ),
        // A 404 is as often a base URL without its version path as an unknown model.
        ProviderErrorClass::InvalidRequest if f.http_status == Some(404) => (
            "provider-refused",
            "provider",
            "The provider answered 404: check the model name and that providers.NAME.baseUrl ends with the API's version path (such as /v1); `docsfab doctor --probe` tells which.",
        ),
        ProviderErrorClass::InvalidRequest => (
            "provider-refused",
            "provider",
            "The provider rejected the request as sent; check the model name and limits.",
        ),
        ProviderErrorClass::Unknown => (
            "provider-refused",
            "provider",
            "Inspect the attempt's provider error in `docsfab runs show`.",
        ),
    };
    let status = match (f.http_status, f.declared_status) {
        (Some(s), _) => format!(" (HTTP {s})"),
        (None, Some(s)) => format!(" (declared status {s})"),
        (None, None) => String::new(),
    };
    Facts {
        category,
        failure_class,
        code: format!("provider-{}", f.class),
        message: format!(
            "The provider request failed with class {}{status}.",
            f.class
        ),
        remediation: std::borrow::Cow::Borrowed(remediation),
        context: None,
    }
}

/// How a context overflow reads (STP-14): the sizes the provider gave, and the three levers an
/// operator has (what the step reads, what it may answer, and the model's context).
fn context_facts(context: Option<ContextWindow>) -> Facts {
    let c = context.unwrap_or_default();
    let prompt = c.prompt_tokens.map_or_else(
        || "the prompt".to_owned(),
        |n| format!("the prompt of {n} tokens"),
    );
    let output = c.output_tokens.map_or_else(
        || "maxOutputTokens".to_owned(),
        |n| format!("the {n} output tokens asked for (maxOutputTokens)"),
    );
    let window = c.context_tokens.map_or_else(
        || "the model's context".to_owned(),
        |n| format!("the model's context of {n} tokens"),
    );
    Facts {
        category: "context-exhausted",
        failure_class: "model-output",
        code: "context-exhausted".to_string(),
        message: "The model's context window was exhausted.".to_string(),
        remediation: std::borrow::Cow::Owned(format!(
            "{} plus {output} did not fit {window}; lower limits.sourceReadBytes or limits.maxOutputTokens, split the step, or use a model or server with a larger context (llama-server -c, Ollama num_ctx, vLLM --max-model-len).",
            upper_first(&prompt)
        )),
        context,
    }
}

fn upper_first(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().chain(chars).collect::<String>()
    })
}

pub(super) fn declined_failure(facts: &Facts, settlement: WriteSettlement) -> StepFailure {
    let (code, why) = match settlement {
        WriteSettlement::RestoreFailed => (
            "write-restore-failed",
            "a write ran and the workspace could not be restored",
        ),
        _ => (
            "write-settlement-unavailable",
            "the host could not prove which writes ran",
        ),
    };
    StepFailure {
        category: "declined-write-step".to_string(),
        failure_class: facts.failure_class.to_string(),
        code: code.to_string(),
        message: format!(
            "{} The retry was declined because {why}.",
            as_sentence(&facts.message)
        ),
        remediation: "Inspect the workspace for partial writes, restore it, then run again."
            .to_string(),
        context: None,
    }
}

/// `text` ending in a full stop, so another sentence can follow it.
fn as_sentence(text: &str) -> String {
    let text = text.trim_end();
    if text.ends_with(['.', '!', '?']) {
        text.to_string()
    } else {
        format!("{text}.")
    }
}
