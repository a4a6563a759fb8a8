//! One attempt of one step: the agent loop.
//!
//! The loop is a thin driver around state machines that decide on their own:
//! - the execution lease ([`ExecutionLease`](crate::ledger::ExecutionLease)) grants each provider
//!   turn after the host preflight (LSE-2), counts executed tool calls and decides renewal at
//!   each checkpoint from executed-call evidence only (LSE-1, LSE-3);
//! - read supervision ([`ReadSupervisor`](crate::supervision::ReadSupervisor)) answers re-reads with a notice and reports
//!   no-progress (LSE-4);
//! - the provider's replay driver ([`run_turn_gated`](docsfab_provider::driver::run_turn_gated))
//!   runs each turn with its in-turn replays, bounded by the attempt deadline and the
//!   cancellation token (REP-9, REP-10).
//!
//! The loop itself is a sans-IO state machine too (`state::AgentLoop`, quinn-proto's shape): it
//! holds the conversation, the answer so far and its continuations, the lease and the attempt's
//! account, takes events (a turn's result, a batch's result, cancellation, the time) and answers
//! with the next action (send a turn, run a batch, finish). The async `drive::drive` only
//! performs those actions and passes the loop's turn events to the observer.
//!
//! The module's files, from the caller down: this one is the attempt as its caller sees it
//! ([`run_attempt`], its [`AttemptReport`], redacted here); `drive` performs the loop's actions;
//! `state` is the loop; `prompt` is what the model is told and `ending` how an answer is judged
//! and an attempt ends; `input` is what an attempt is given and what its observer hears.
//!
//! What the loop owns is the conversation, the tool calls (validated before host authorization,
//! authorized against the workspace jail, then run) and the attempt's account: its turns, its
//! lease record, its usage and, when it failed, the [`AttemptFailure`] the step retry decides
//! from. Nothing here decides a retry.
//!
//! Every completed turn's raw 200 body passes the response boundary (the check the composition
//! route applies, BND-1) before its outcome is used. Credential material ends the attempt as a
//! terminal validator refusal (STP-14); any other refusal (another model's chunk, a missing
//! identity, a malformed stream) is a provider fault that no transport class fits, so it is
//! recorded as provider class `unknown`, which is never retried. A provider error that names
//! the context window as exceeded ends the attempt as `context-exhausted` (STP-14).
//!
//! A final text answer that the provider ended at the output limit (finish reason `length` /
//! `max_tokens`) is continued inside the attempt before anything judges it (STP-10): the loop
//! sends the conversation plus the partial text and [`CONTINUE_INSTRUCTION`], and joins the
//! pieces. Whether to continue is decided by `after_final_turn` from the finish reason, the
//! continuations already sent ([`MAX_CONTINUATIONS`] at most) and the lease's turns left; each
//! continuation is a provider turn the lease grants like any other. A cut tool batch is not
//! continued: its truncated arguments are rejected before authorization (LSE-1).
//!
//! Everything the account says in words passes the boundary's redactor before it leaves
//! [`run_attempt`]: the message, the lease evidence, a refusal's text and each tool call's id,
//! name and detail. The provider and the model choose parts of those words (an error type, a
//! tool path), and the account is printed, stored and shown again by `runs show`.
//!
//! The tools are [`StepTools`], fresh for each attempt (so the source-read budget is restored,
//! STP-2), and each batch goes through [`run_batch`](crate::batch::run_batch). Tools are
//! synchronous and short; the deadline and the cancellation are checked after each batch.

mod drive;
mod ending;
mod input;
mod prompt;
mod state;

use std::time::{Duration, SystemTime};

use docsfab_boundary::Redactor;
use docsfab_policy::class::ProviderFailure;
use docsfab_policy::rules::Feedback;
use docsfab_policy::step::AttemptFailure;
use docsfab_record::{
    ANSWER_EXCERPT_MAX_BYTES, CallOutcome, Gateway, GroundingRecord, LeaseRecord, OutputConstraint,
    StepInput, ToolBatch, TurnRecord, Usage, rfc3339_utc,
};
use tokio::time::Instant;

use self::drive::drive;
pub use self::ending::{Answer, MAX_CONTINUATIONS};
pub use self::input::{AttemptInput, AttemptSpend, TurnEvent};
pub use self::prompt::{CONTINUE_INSTRUCTION, feedback_text, tool_specs};
use self::state::{AgentLoop, redactor_for};
use crate::snapshot::{WriteSnapshots, WrittenFile};
use crate::tools::{StepTools, ToolPolicy};

/// The account of one finished attempt.
#[derive(Debug)]
pub struct AttemptReport {
    pub result: Result<Answer, AttemptFailure>,
    /// One line for people about how the attempt failed (never holds the API key).
    pub message: Option<String>,
    /// The provider failure that ended the attempt, when one did.
    pub provider_failure: Option<ProviderFailure>,
    /// The gateway the attempt's responses came through, when one was recognised (the last
    /// one any of its turns ended on).
    pub gateway: Option<Gateway>,
    /// The start of the final answer the attempt ended on, redacted, at most
    /// [`ANSWER_EXCERPT_MAX_BYTES`] bytes; `None` when it ended without one.
    pub answer_excerpt: Option<String>,
    /// The size in bytes of that whole answer.
    pub answer_bytes: Option<u64>,
    pub started_at: String,
    pub turns: Vec<TurnRecord>,
    pub lease: LeaseRecord,
    pub usage: Usage,
    /// The structured-output constraint the attempt's requests carried, when one did.
    pub output_constraint: Option<OutputConstraint>,
    /// What the judged answer cited, for a step whose contract asks for grounding.
    pub grounding: Option<GroundingRecord>,
    /// What `usage` cost at the provider's price; `None` without a price or with usage unknown.
    pub cost_usd: Option<f64>,
    pub duration_ms: u64,
    /// What the attempt wrote, to prove away or undo (write steps).
    pub snapshots: WriteSnapshots,
    /// The files the attempt changed, as it left them (taken before any restore).
    pub written: Vec<WrittenFile>,
    /// What the attempt's tools looked at, as it was when they looked.
    pub inputs: Vec<StepInput>,
}

/// A fresh tool set (and so a full source-read budget, STP-2) for this attempt. The retry of an
/// attempt stopped as no-progress asks for the answer at its first notice-only re-read (STP-12).
fn tools_for_attempt<'w>(input: &AttemptInput<'w>) -> StepTools<'w> {
    let tools = StepTools::for_attempt(
        input.workspace,
        ToolPolicy::for_step(input.step, &input.limits),
    );
    if input.feedback == Some(Feedback::AnswerAtFirstNotice) {
        tools.answer_at_first_notice()
    } else {
        tools
    }
}

/// Runs one attempt to its end. Never fails as a Rust error: every way an attempt can end is
/// in the report.
pub async fn run_attempt(input: AttemptInput<'_>) -> AttemptReport {
    let started = Instant::now();
    let started_at = rfc3339_utc(SystemTime::now());
    let deadline = started + Duration::from_millis(input.limits.timeout_ms);
    let mut tools = tools_for_attempt(&input);
    let mut state = AgentLoop::new(&input, deadline.into_std());
    let (result, message) = drive(&input, &mut state, &mut tools).await;
    let mut account = state.finish(Instant::now().into_std());
    let redactor = redactor_for(input.boundary);
    let result = match result {
        Err(AttemptFailure::RefusedBeforeSend { error_text }) => {
            Err(AttemptFailure::RefusedBeforeSend {
                error_text: redactor.line(&error_text),
            })
        }
        other => other,
    };
    let message = message.map(|m| redactor.line(&m));
    account.lease.evidence = account.lease.evidence.map(|e| redactor.line(&e));
    for turn in &mut account.turns {
        redact_batch(&mut turn.tool_batch, redactor);
    }
    let answer = account.final_answer.as_deref();
    let written = written_files(&tools, redactor);
    let inputs = tools.observed().inputs().to_vec();
    AttemptReport {
        result,
        message,
        provider_failure: account.provider_failure,
        gateway: account.gateway,
        answer_excerpt: answer.map(|a| redactor.excerpt(a, ANSWER_EXCERPT_MAX_BYTES)),
        answer_bytes: answer.map(|a| u64::try_from(a.len()).unwrap_or(u64::MAX)),
        started_at,
        turns: account.turns,
        lease: account.lease,
        usage: account.usage,
        grounding: account.grounding,
        output_constraint: account.output_constraint,
        cost_usd: input.spend.pricing.and_then(|p| p.cost(&account.usage)),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        snapshots: tools.into_snapshots(),
        written,
        inputs,
    }
}

/// What the attempt changed. The model chose the paths: one that holds a credential is
/// recorded redacted (the jail already refused control characters in them).
fn written_files(tools: &StepTools<'_>, redactor: &Redactor) -> Vec<WrittenFile> {
    let mut written = tools.snapshots().written_files();
    for file in &mut written {
        if redactor.holds_credential(&file.path) {
            file.path = redactor.line(&file.path);
        }
    }
    written
}

/// The model chooses a call's name and arguments (a path, echoed in a refusal's detail) and the
/// provider its id: all three are redacted before the batch is recorded. Tool names the host
/// knows are plain words and come through unchanged, so the batch still reconciles with the
/// lease's per-tool counters.
fn redact_batch(batch: &mut ToolBatch, redactor: &Redactor) {
    for call in &mut batch.calls {
        call.id = redactor.word(&call.id);
        call.tool = redactor.word(&call.tool);
        match &mut call.outcome {
            CallOutcome::Rejected { detail, .. } | CallOutcome::Refused { detail } => {
                *detail = redactor.line(detail);
            }
            CallOutcome::Executed { .. } => {}
        }
    }
}
