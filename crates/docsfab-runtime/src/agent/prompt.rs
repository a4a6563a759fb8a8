//! What the model is told: the system prompt, the correction a retry carries, the instruction
//! that asks for the rest of a cut answer, the tools it may call and the structured-output
//! constraint of its answer.

use std::fmt::Write as _;

use docsfab_policy::rules::Feedback;
use docsfab_provider::{ResponseFormat, ToolSpec};
use docsfab_record::Access;

use super::input::AttemptInput;
use crate::composition::{ModelLimits, Step, Tool};
use crate::tools;

/// The user message that asks for the rest of a cut answer. The pieces are joined as they
/// are, so anything repeated or added in front would corrupt the joined answer (a JSON object
/// above all).
pub const CONTINUE_INSTRUCTION: &str = "Your answer was cut at the output limit. Continue it exactly where it stopped: do not repeat anything you already wrote and add no preamble, because your reply is appended to it as it is.";

/// The tool specs the model sees for a step.
pub fn tool_specs(offered: &[Tool]) -> Vec<ToolSpec> {
    offered
        .iter()
        .map(|t| ToolSpec {
            name: t.name().to_owned(),
            description: tools::description(*t).to_owned(),
            parameters: tools::parameter_schema(*t),
        })
        .collect()
}

/// The words a correction carries to the model.
pub fn feedback_text(feedback: Feedback, limits: &ModelLimits) -> String {
    match feedback {
        Feedback::ReturnOnlyTheJsonObject => "Your previous answer was not the JSON object this step asks for. Return only the JSON object: no prose, no Markdown fences, no array.".to_owned(),
        Feedback::MeetTheContractSchema => "Your previous answer was a JSON object that did not meet the step's schema. Return only the JSON object, meeting the schema exactly.".to_owned(),
        Feedback::GroundEveryName => "Your previous answer cited names that are not in the workspace. Cite only files and names you read there.".to_owned(),
        Feedback::AnswerCompletelyInsideLimit => format!(
            "Your previous answer was cut at the output limit. Return the complete answer, well inside the limit of {} tokens.",
            limits.max_output_tokens
        ),
        Feedback::ReadOnlyWhatIsNeeded => "Your previous attempt ran out of time. Read only what the answer needs, then answer.".to_owned(),
        Feedback::AnswerAtFirstNotice => "Your previous attempt kept re-reading sources it had already read. When a tool answers with a notice that you already read something, answer at once from what you have.".to_owned(),
    }
}

/// The structured-output constraint of a read-only step with a contract (docs/
/// structured-output.md). The validator judges the answer whatever is sent.
pub(super) fn response_format(input: &AttemptInput<'_>) -> Option<ResponseFormat> {
    let contract = input.step.contract.as_ref()?;
    if input.step.access != Access::ReadOnly {
        return None;
    }
    ResponseFormat::for_contract(
        input.structured_output,
        input.api,
        &input.step.id,
        &contract.schema,
    )
}

/// The correction for this step: a read-only step without a contract answers plain text, so
/// the only contract failure it can earn (an empty answer) is corrected in those words.
/// The unknown names of an ungrounded answer go with their correction.
pub(super) fn correction(input: &AttemptInput<'_>, feedback: Feedback) -> String {
    let step = input.step;
    let text_answer = step.access == Access::ReadOnly && step.contract.is_none();
    match feedback {
        Feedback::ReturnOnlyTheJsonObject if text_answer => {
            "Your previous answer was empty. Answer the step in plain text.".to_owned()
        }
        Feedback::GroundEveryName if input.grounding_correction.is_some() => {
            input.grounding_correction.unwrap_or_default().to_owned()
        }
        _ => feedback_text(feedback, &input.limits),
    }
}

/// The system prompt: what docsfab is, what the step may do and how it answers, then the
/// step's instructions.
pub(super) fn system_prompt(step: &Step, instructions: &str) -> String {
    let mut s = String::from(
        "You are docsfab, carrying out one step of a documentation workflow over the source tree in \
         the workspace. Tool paths are relative to the workspace root.\n",
    );
    match step.access {
        Access::ReadOnly => {
            s.push_str("This step is read-only.");
            match &step.contract {
                Some(c) => {
                    let _ = write!(
                        s,
                        " When you are done, answer with only a JSON object that meets this JSON Schema, and nothing else:\n{}\n",
                        c.schema
                    );
                }
                None => s.push_str(" When you are done, answer in plain text.\n"),
            }
        }
        Access::Write => {
            let _ = writeln!(
                s,
                "This step may write files only under: {}. When you are done, reply with a short summary of what you wrote.",
                step.write_roots.join(", ")
            );
        }
    }
    s.push_str("\nThe step's instructions:\n");
    s.push_str(instructions);
    s
}
