//! How an attempt ends: the [`Answer`] a finished final answer is judged into, whether a cut
//! answer is continued (STP-10), and the failure and message of each other ending.

use docsfab_policy::step::AttemptFailure;
use docsfab_provider::outcome::FinishReason;
use docsfab_record::{Access, ContractFailure, LeaseStop};
use serde_json::Value;

use crate::composition::Step;
use crate::contract::CompiledContract;

/// The most continuation turns one attempt sends for a text answer cut at the output limit.
/// Two is enough to finish an answer that overran the limit by a little; an answer that needs
/// more was asked too broadly, and the cut-answer retry (with its feedback to answer well inside
/// the limit) is the better remedy than more turns. The lease's `maxTurns` can lower it.
pub const MAX_CONTINUATIONS: u32 = 2;

/// The answer of a successful attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A read-only step's answer object that met its contract.
    Object(Value),
    /// A write step's final text.
    Text(String),
}

impl Answer {
    /// The text `{{steps.ID.output}}` is replaced with in later steps.
    pub fn as_output_text(&self) -> String {
        match self {
            Answer::Object(v) => v.to_string(),
            Answer::Text(t) => t.clone(),
        }
    }

    /// The record's step `output` (the answer object of a read-only step).
    pub fn record_output(&self) -> Option<Value> {
        match self {
            Answer::Object(v) => Some(v.clone()),
            Answer::Text(_) => None,
        }
    }
}

/// How an attempt ended: its answer or failure, and one line for people about a failure.
pub(super) type Ending = (Result<Answer, AttemptFailure>, Option<String>);

pub(super) fn fail(f: AttemptFailure, message: impl Into<String>) -> Ending {
    (Err(f), Some(message.into()))
}

/// Why a cut answer gets no further continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoContinuation {
    /// The attempt already sent [`MAX_CONTINUATIONS`].
    LimitReached,
    /// The execution lease has no provider turn left for one.
    NoTurnLeft,
    /// The answer so far is empty or blank: there is nothing to continue from, and an empty
    /// assistant message is not one every API accepts.
    NothingToContinue,
}

/// What follows a turn that ended without tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FinalTurn {
    /// The answer is finished: judge it.
    Complete,
    /// The answer was cut and may be continued in another provider turn.
    Continue,
    /// The answer was cut with no continuation left: the cut-answer condition (STP-10).
    Cut(NoContinuation),
}

/// Decides from the turn's finish reason, the joined answer so far, the continuations the
/// attempt already sent and the lease's turns, whether a final answer is finished, continued or
/// cut for good. Only the finish reason says "cut": the provider's structured field, not the
/// text.
pub(super) fn after_final_turn(
    finish: Option<&FinishReason>,
    answer_so_far: &str,
    continuations_sent: u32,
    turns_used: u32,
    max_turns: u32,
) -> FinalTurn {
    if finish != Some(&FinishReason::Length) {
        return FinalTurn::Complete;
    }
    if answer_so_far.trim().is_empty() {
        FinalTurn::Cut(NoContinuation::NothingToContinue)
    } else if continuations_sent >= MAX_CONTINUATIONS {
        FinalTurn::Cut(NoContinuation::LimitReached)
    } else if turns_used >= max_turns {
        FinalTurn::Cut(NoContinuation::NoTurnLeft)
    } else {
        FinalTurn::Continue
    }
}

/// The attempt's message for an answer cut with no continuation left.
pub(super) fn cut_message(why: NoContinuation, continuations: u32, max_turns: u32) -> String {
    let after = match continuations {
        0 => String::new(),
        1 => " after 1 continuation".to_owned(),
        n => format!(" after {n} continuations"),
    };
    let reason = match why {
        NoContinuation::LimitReached => {
            format!("an attempt sends at most {MAX_CONTINUATIONS} continuations")
        }
        NoContinuation::NoTurnLeft => {
            format!("the execution lease had no provider turn left (maxTurns {max_turns})")
        }
        NoContinuation::NothingToContinue => "the cut answer had no text to continue".to_owned(),
    };
    format!("the answer was cut at the output limit{after} with no continuation left: {reason}")
}

/// How the attempt ends when the lease stopped it.
pub(super) fn lease_ended(reason: LeaseStop, evidence: Option<String>) -> Ending {
    let why = evidence.clone().unwrap_or_default();
    match reason {
        // The host refused before sending: its evidence is the error text (LSE-2, STP-4).
        LeaseStop::PreflightFailed => {
            let text = format!("host preflight failed: {why}");
            fail(
                AttemptFailure::RefusedBeforeSend {
                    error_text: text.clone(),
                },
                text,
            )
        }
        LeaseStop::NoProgress => fail(
            AttemptFailure::NoProgress,
            "read supervision stopped the attempt: repeated notice-only re-reads without new evidence",
        ),
        // The lease ran out of turns, or the checkpoint refused renewal: the runtime stopped
        // the attempt without an answer. The step retry treats both as no-progress.
        LeaseStop::MaxTurns => fail(
            AttemptFailure::NoProgress,
            "the execution lease used every provider turn (maxTurns) without an answer",
        ),
        LeaseStop::RenewalRefused => fail(
            AttemptFailure::NoProgress,
            format!("the checkpoint refused renewal: {why}"),
        ),
        LeaseStop::Deadline => fail(AttemptFailure::AttemptDeadline, "the attempt timer fired"),
        LeaseStop::Cancelled => fail(AttemptFailure::Cancelled, "the attempt was cancelled"),
        LeaseStop::ProviderFailed | LeaseStop::Answered | LeaseStop::PagesWritten => fail(
            AttemptFailure::RefusedBeforeSend {
                error_text: format!("the lease ended unexpectedly ({reason:?})"),
            },
            "the lease ended unexpectedly",
        ),
    }
}

/// Judges a finished final answer (`text`, joined from `continuations` continuations of a cut
/// answer when there were any): the contract of a read-only step, or the end of a write step.
pub(super) fn judge(
    step: &Step,
    finish: Option<&FinishReason>,
    text: &str,
    continuations: u32,
) -> Ending {
    // Anthropic's stop reason for an answer the context window ended (STP-14): a structured
    // field, like an error code, so it is read; another attempt would meet the same window.
    if matches!(finish, Some(FinishReason::Other(r)) if r == "model_context_window_exceeded") {
        return fail(
            AttemptFailure::ContextExhausted { context: None },
            "the answer ended at the model's context window (stop reason model_context_window_exceeded)",
        );
    }
    if step.access == Access::Write {
        return (Ok(Answer::Text(text.to_owned())), None);
    }
    // A read-only step without a contract answers plain text, as its system prompt asks: any
    // answer but an empty one meets it (an empty one is `contract-empty`, retried as STP-9 says).
    let Some(contract) = &step.contract else {
        return match text.trim().is_empty() {
            false => (Ok(Answer::Text(text.to_owned())), None),
            true => fail(
                AttemptFailure::Contract {
                    failure: ContractFailure::Empty,
                },
                "the answer is empty",
            ),
        };
    };
    let contract = match CompiledContract::new(&contract.schema) {
        Ok(contract) => contract,
        Err(e) => {
            return fail(
                AttemptFailure::RefusedBeforeSend {
                    error_text: e.to_string(),
                },
                e.to_string(),
            );
        }
    };
    match contract.judge(text) {
        Ok(map) => (Ok(Answer::Object(Value::Object(map))), None),
        // The spec's "completed by a continuation and then refused" (STP-10): the fault lies in
        // the answer's length as much as in its content, so the cut-answer retry (answer well
        // inside the limit) decides, not the contract's.
        Err(e) if continuations > 0 => {
            let pieces = if continuations == 1 {
                "1 continuation".to_owned()
            } else {
                format!("{continuations} continuations")
            };
            fail(
                AttemptFailure::CutAnswer,
                format!(
                    "the answer was cut at the output limit, completed by {pieces}, and then refused by the contract: {e}"
                ),
            )
        }
        Err(e) => fail(AttemptFailure::Contract { failure: e.kind }, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUT: Option<&FinishReason> = Some(&FinishReason::Length);

    // Proves STP-10: only a length stop is cut, and a cut answer is continued while the
    // attempt's continuations and the lease's turns last.
    #[test]
    fn a_cut_answer_is_continued_while_continuations_and_turns_last() {
        assert_eq!(
            after_final_turn(CUT, "{\"a\": ", 0, 1, 12),
            FinalTurn::Continue
        );
        assert_eq!(
            after_final_turn(CUT, "{\"a\": ", 1, 2, 12),
            FinalTurn::Continue
        );
        assert_eq!(
            after_final_turn(CUT, "{\"a\": ", MAX_CONTINUATIONS, 3, 12),
            FinalTurn::Cut(NoContinuation::LimitReached)
        );
        assert_eq!(
            after_final_turn(CUT, "{\"a\": ", 0, 4, 4),
            FinalTurn::Cut(NoContinuation::NoTurnLeft)
        );
        assert_eq!(
            after_final_turn(CUT, " \n", 0, 1, 12),
            FinalTurn::Cut(NoContinuation::NothingToContinue)
        );
    }

    #[test]
    fn any_other_finish_reason_is_a_finished_answer() {
        for finish in [
            None,
            Some(FinishReason::Stop),
            Some(FinishReason::ContentFilter),
            Some(FinishReason::Other("model_context_window_exceeded".into())),
        ] {
            assert_eq!(
                after_final_turn(finish.as_ref(), "text", 0, 1, 12),
                FinalTurn::Complete,
                "{finish:?}"
            );
        }
    }

    #[test]
    fn the_cut_message_says_which_case_ended_the_answer() {
        let m = cut_message(NoContinuation::LimitReached, 2, 12);
        assert!(m.contains("after 2 continuations"), "{m}");
        assert!(m.contains("no continuation left"), "{m}");
        let m = cut_message(NoContinuation::NoTurnLeft, 1, 2);
        assert!(m.contains("after 1 continuation with"), "{m}");
        assert!(m.contains("maxTurns 2"), "{m}");
        let m = cut_message(NoContinuation::NothingToContinue, 0, 12);
        assert!(m.contains("output limit with no continuation left"), "{m}");
    }
}
