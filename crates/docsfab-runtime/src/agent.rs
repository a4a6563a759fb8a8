//! One attempt of one step: the agent loop.
//!
//! The loop is a thin driver around state machines that decide on their own:
//! - the execution lease ([`ExecutionLease`]) grants each provider turn after the host preflight
//!   (LSE-2), counts executed tool calls and decides renewal at each checkpoint from
//!   executed-call evidence only (LSE-1, LSE-3);
//! - read supervision ([`ReadSupervisor`](crate::supervision::ReadSupervisor)) answers re-reads with a notice and reports
//!   no-progress (LSE-4);
//! - the provider's replay driver ([`run_turn_gated`]) runs each turn with its in-turn
//!   replays, bounded by the attempt deadline and the cancellation token (REP-9, REP-10).
//!
//! The loop itself is a sans-IO state machine too (`AgentLoop`, quinn-proto's shape): it holds
//! the conversation, the answer so far and its continuations, the lease and the attempt's
//! account, takes events (a turn's result, a batch's result, cancellation, the time) and answers
//! with the next action (send a turn, run a batch, finish). The async `drive` only performs
//! those actions and passes the loop's turn events to the observer.
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
//! STP-2), and each batch goes through [`batch::run_batch`]. Tools are synchronous and short; the
//! deadline and the cancellation are checked after each batch.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use docsfab_boundary::{BoundaryConfig, Redactor, Refusal, Verdict};
use docsfab_policy::class::{FaultKind, ProviderFailure};
use docsfab_policy::host::StructuredOutput;
use docsfab_policy::replay::ReplayLimits;
use docsfab_policy::rules::Feedback;
use docsfab_policy::step::{AttemptFailure, ValidatorRefusal};
use docsfab_provider::outcome::{FinishReason, StreamOutcome};
use docsfab_provider::{
    AssistantToolCall, Gateway, Message, Payload, ReplayEntry, ResponseFormat, RunBudget, Spend,
    ToolSpec, Transport, TransportFailure, TurnEnd, TurnRequest, TurnStatus as ProviderTurnStatus,
    driver::{DriverEvent, Gate, TurnResult, run_turn_gated},
};
use docsfab_record::{Api, GroundingRecord, OutputConstraint, Pricing};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::batch::{self, BatchOutcome, CallReply, RequestedCall, ToolUse};
use crate::composition::{Access, ModelLimits, Step, Tool};
use crate::contract::{CompiledContract, ContractFailure};
use crate::grounding::{self, GroundingBasis};
use crate::ledger::{
    CallOutcome, Checkpoint, ExecutionLease, LeaseStop, PreflightFailure, ToolBatch, TurnEvidence,
};
use crate::record::{
    ANSWER_EXCERPT_MAX_BYTES, LeaseRecord, ReplayRecord, StepInput, TurnRecord, TurnStatus, Usage,
    rfc3339_utc,
};
use crate::snapshot::{WriteSnapshots, WrittenFile};
use crate::tools::{self, StepTools, ToolPolicy};
use crate::workspace::Workspace;

/// The most continuation turns one attempt sends for a text answer cut at the output limit.
/// Two is enough to finish an answer that overran the limit by a little; an answer that needs
/// more was asked too broadly, and the cut-answer retry (with its feedback to answer well inside
/// the limit) is the better remedy than more turns. The lease's `maxTurns` can lower it.
pub const MAX_CONTINUATIONS: u32 = 2;

/// The user message that asks for the rest of a cut answer. The pieces are joined as they
/// are, so anything repeated or added in front would corrupt the joined answer (a JSON object
/// above all).
pub const CONTINUE_INSTRUCTION: &str = "Your answer was cut at the output limit. Continue it exactly where it stopped: do not repeat anything you already wrote and add no preamble, because your reply is appended to it as it is.";

/// Everything one attempt needs. The ceilings in `limits` are the composition's sealed limits;
/// every attempt of a step gets the same ones and a fresh source-read budget (STP-2).
pub struct AttemptInput<'a> {
    pub transport: &'a dyn Transport,
    /// The shared provider throttle every send of the attempt passes; `None` sends at once.
    pub gate: Option<Gate<'a>>,
    pub api: Api,
    pub model: &'a str,
    pub step: &'a Step,
    pub limits: ModelLimits,
    pub replay_limits: ReplayLimits,
    /// The response boundary for the run's provider, selected model and key (BND-1), or why it
    /// could not be built (then nothing is sent). A completed turn whose transport kept no raw
    /// body (an in-memory test transport) has nothing to check; the HTTP transport the executor
    /// builds always keeps it.
    pub boundary: Result<&'a BoundaryConfig, &'a str>,
    /// The step's instructions with `{{steps.ID.output}}` already substituted.
    pub instructions: &'a str,
    /// The correction the step retry carried to this attempt.
    pub feedback: Option<Feedback>,
    pub workspace: &'a Workspace,
    pub cancel: &'a CancellationToken,
    /// Told about each turn as it happens (for progress display and tests).
    pub observer: &'a (dyn Fn(TurnEvent) + Send + Sync),
    /// Called before each write runs (the executor records a write intent); `None` runs writes
    /// unrecorded.
    pub before_write: Option<batch::BeforeWrite<'a>>,
    /// How the attempt asks for usage, prices it and reserves its spend.
    pub spend: AttemptSpend<'a>,
    /// How a contract's schema is sent as a structured-output constraint (host.yaml
    /// `structuredOutput`).
    pub structured_output: StructuredOutput,
    /// The workspace and the run's pages, for a step whose contract asks for grounding.
    pub grounding: Option<&'a GroundingBasis>,
    /// The unknown names the last ungrounded attempt cited, worded for the model; sent with
    /// the `ground-every-name` correction.
    pub grounding_correction: Option<&'a str>,
}

/// What an attempt's requests ask for usage and caching, what its usage is priced at, and the
/// run budget each send reserves from (docs/cost.md).
#[derive(Debug, Clone, Default)]
pub struct AttemptSpend<'a> {
    /// `None`: the run has no token or cost bound.
    pub budget: Option<&'a RunBudget>,
    /// `None`: no price, so `costUsd` stays `null`.
    pub pricing: Option<Pricing>,
    /// OpenAI: ask for the usage chunk.
    pub include_usage: bool,
    /// The step's prompt cache key; `None` asks for no caching.
    pub prompt_cache_key: Option<String>,
}

/// What happens inside an attempt, as it happens.
#[derive(Debug, Clone)]
pub enum TurnEvent {
    /// The lease granted turn `turn`; `payload` is the exact request body about to be sent and
    /// `digest` its SHA-256 (the simulator's request log names the same digest).
    Request {
        turn: u32,
        digest: String,
        payload: Bytes,
    },
    /// The replay driver scheduled an in-turn replay after `wait_ms`.
    Replay { turn: u32, entry: ReplayEntry },
    /// The shared provider throttle held a request of the turn `held_ms` before it was sent;
    /// `reason` is the last gate that made it wait (`hold`, `concurrency`, `adaptive`, `pacing`).
    Held {
        turn: u32,
        held_ms: u64,
        reason: &'static str,
    },
    /// The throttle's shared state could not be used, so requests go unthrottled. Sent once per
    /// process, however often it happens.
    ThrottleUnavailable { message: String },
    /// The turn ended.
    Finished {
        turn: u32,
        status: TurnStatus,
        requested: u32,
        rejected: u32,
        executed: u32,
        /// The batch's calls: tool, target and outcome (redacted), in the order asked for.
        calls: Vec<ToolUse>,
        /// Why a turn that did not complete ended (the turn record's `reason`); `None` when
        /// it completed.
        reason: Option<String>,
    },
    /// Something looked wrong with the turn that decided nothing (the turn record's
    /// `warnings`); sent right after its `Finished`.
    Warning {
        turn: u32,
        warning: docsfab_record::TurnWarning,
    },
}

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
fn response_format(input: &AttemptInput<'_>) -> Option<ResponseFormat> {
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
fn correction(input: &AttemptInput<'_>, feedback: Feedback) -> String {
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

fn system_prompt(step: &Step, instructions: &str) -> String {
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
    let mut state = AgentLoop::new(&input, deadline);
    let (result, message) = drive(&input, &mut state, &mut tools).await;
    state.time_turns(Instant::now());
    let mut lease = state
        .lease
        .record()
        .unwrap_or_else(|| fallback_lease_record(&state.lease, input.limits.max_turns));
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
    lease.evidence = lease.evidence.map(|e| redactor.line(&e));
    for turn in &mut state.turns {
        redact_batch(&mut turn.tool_batch, redactor);
    }
    let answer = state.final_answer.as_deref();
    let written = written_files(&tools, redactor);
    let inputs = tools.observed().inputs().to_vec();
    AttemptReport {
        result,
        message,
        provider_failure: state.provider_failure,
        gateway: state.gateway,
        answer_excerpt: answer.map(|a| redactor.excerpt(a, ANSWER_EXCERPT_MAX_BYTES)),
        answer_bytes: answer.map(|a| u64::try_from(a.len()).unwrap_or(u64::MAX)),
        started_at,
        turns: state.turns,
        lease,
        usage: state.usage,
        grounding: state.grounding.take(),
        output_constraint: state
            .response_format
            .as_ref()
            .filter(|_| state.constraint_sent)
            .map(ResponseFormat::recorded),
        cost_usd: input.spend.pricing.and_then(|p| p.cost(&state.usage)),
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

/// The redactor when the boundary could not be set up (no provider text is read then): key
/// shapes, escapes and the cap.
static SHAPES_ONLY: std::sync::LazyLock<Redactor> = std::sync::LazyLock::new(Redactor::default);

/// The boundary's redactor (it knows the run's key), else key shapes only.
fn redactor_for<'b>(boundary: Result<&'b BoundaryConfig, &str>) -> &'b Redactor {
    match boundary {
        Ok(b) => b.redactor(),
        Err(_) => &SHAPES_ONLY,
    }
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

/// The gateway the response a turn ended on came through: its answer's, or its last failed
/// response's (a failure before any head names none).
fn gateway_of(end: &TurnEnd) -> Option<&Gateway> {
    match end {
        TurnEnd::Completed(outcome) => outcome.gateway.as_deref(),
        TurnEnd::Failed { failure, .. } => failure.body.gateway.as_ref(),
        TurnEnd::DeadlineReached {
            last_failure: Some(failure),
        } => failure.body.gateway.as_ref(),
        TurnEnd::DeadlineReached { last_failure: None }
        | TurnEnd::DigestMismatch { .. }
        | TurnEnd::BudgetExhausted(_)
        | TurnEnd::Cancelled => None,
    }
}

/// A lease that somehow did not end (it always does): recorded as failed, never as answered.
fn fallback_lease_record(lease: &ExecutionLease, max_turns: u32) -> LeaseRecord {
    LeaseRecord {
        max_turns,
        turns_used: lease.turns_used(),
        executed_tool_calls: lease.executed_tool_calls(),
        tool_counters: Default::default(),
        stop_reason: LeaseStop::ProviderFailed,
        disposition: LeaseStop::ProviderFailed.disposition(),
        evidence: Some("the lease did not record its end".to_owned()),
    }
}

type Ending = (Result<Answer, AttemptFailure>, Option<String>);

fn fail(f: AttemptFailure, message: impl Into<String>) -> Ending {
    (Err(f), Some(message.into()))
}

/// What the async driver does next for the agent loop.
enum Action {
    /// Check the cancellation, then run the host preflight and call [`AgentLoop::begin_turn`]
    /// (or [`AgentLoop::cancelled`]).
    BeginTurn,
    /// Send `payload` as turn `turn` with its in-turn replays, then call
    /// [`AgentLoop::turn_ended`].
    Send { turn: u32, payload: Payload },
    /// Run these tool calls as one batch against the workspace and the lease, then call
    /// [`AgentLoop::batch_ran`].
    RunTools { calls: Vec<RequestedCall> },
    /// The batch is recorded and the observer told: call [`AgentLoop::after_tools`] with
    /// read supervision's verdict, whether the run was cancelled, and the time.
    AfterTools,
    /// The attempt is over.
    Finish(Ending),
}

/// A turn that asked for tools, while its batch runs.
struct PendingBatch {
    turn: u32,
    text: String,
    calls: Vec<RequestedCall>,
    replays: Vec<ReplayRecord>,
    usage: Usage,
    /// The batch's account and its replies, once it ran.
    ran: Option<(ToolBatch, Vec<CallReply>)>,
}

/// The agent loop of one attempt without I/O: the conversation, the answer so far and its
/// continuations, the execution lease and the attempt's account. It takes events (a turn's
/// result, a batch's result, whether the run was cancelled, the time) and answers with the next
/// [`Action`]; [`drive`] performs the actions (the provider turn, the tools) and feeds it back.
struct AgentLoop<'a> {
    step: &'a Step,
    api: Api,
    model: &'a str,
    limits: ModelLimits,
    boundary: Result<&'a BoundaryConfig, &'a str>,
    deadline: Instant,
    system: String,
    specs: Vec<ToolSpec>,
    messages: Vec<Message>,
    /// The final answer so far: the text of a cut turn plus its continuations, joined.
    answer: String,
    /// Continuations joined into `answer`.
    answer_continuations: u32,
    /// Continuations sent in the whole attempt (the cap is per attempt, so an answer abandoned
    /// for tool calls does not earn a fresh allowance).
    continuations_sent: u32,
    /// The conversation before the cut answer: each continuation request is this, the joined
    /// answer so far as one assistant message, and the instruction.
    before_answer: usize,
    pending: Option<PendingBatch>,
    /// Turn events for the observer, in order; the driver passes them on.
    events: Vec<TurnEvent>,
    lease: ExecutionLease,
    turns: Vec<TurnRecord>,
    /// When each turn began (the n-th entry for turn n), for the turns' `durationMs`.
    turn_starts: Vec<Instant>,
    usage: Usage,
    provider_failure: Option<ProviderFailure>,
    /// The final answer the attempt ended on (judged, refused or cut), as the model sent it;
    /// `None` while there is none and for a write step that closed without text.
    final_answer: Option<String>,
    /// The provider throttle's hold of the turn being recorded (see `push_turn`).
    turn_held_ms: u64,
    /// The warnings of the turn being recorded (see `push_turn`).
    turn_warnings: Vec<docsfab_record::TurnWarning>,
    /// The gateway the latest response that named one came through (issue 24).
    gateway: Option<Gateway>,
    /// The price of the provider's tokens, for each turn's `costUsd`.
    pricing: Option<Pricing>,
    include_usage: bool,
    prompt_cache_key: Option<String>,
    /// The constraint the step's answer requests carry (`None`: no contract, or none is sent).
    response_format: Option<ResponseFormat>,
    /// Whether a request that left carried it (the record's `outputConstraint`).
    constraint_sent: bool,
    grounding_basis: Option<&'a GroundingBasis>,
    /// What the judged answer cited (the record's `grounding`).
    grounding: Option<GroundingRecord>,
}

impl<'a> AgentLoop<'a> {
    fn new(input: &AttemptInput<'a>, deadline: Instant) -> AgentLoop<'a> {
        let mut opening = String::from("Begin the step.");
        if let Some(f) = input.feedback {
            opening.push_str("\n\nCorrection from the previous attempt: ");
            opening.push_str(&correction(input, f));
        }
        let messages = vec![Message::User { text: opening }];
        AgentLoop {
            step: input.step,
            api: input.api,
            model: input.model,
            limits: input.limits,
            boundary: input.boundary,
            deadline,
            system: system_prompt(input.step, input.instructions),
            specs: tool_specs(&input.step.tools),
            before_answer: messages.len(),
            messages,
            answer: String::new(),
            answer_continuations: 0,
            continuations_sent: 0,
            pending: None,
            events: Vec::new(),
            lease: ExecutionLease::new(input.limits.max_turns),
            turns: Vec::new(),
            turn_starts: Vec::new(),
            usage: Usage::ZERO,
            provider_failure: None,
            final_answer: None,
            turn_held_ms: 0,
            turn_warnings: Vec::new(),
            gateway: None,
            pricing: input.spend.pricing,
            include_usage: input.spend.include_usage,
            prompt_cache_key: input.spend.prompt_cache_key.clone(),
            response_format: response_format(input),
            constraint_sent: false,
            grounding_basis: input.grounding,
            grounding: None,
        }
    }

    /// The constraint of this turn's request. A continuation of a cut answer carries none: it
    /// must go on from the middle of the object, which a JSON constraint would not allow.
    fn turn_constraint(&self) -> Option<ResponseFormat> {
        match self.answer_continuations {
            0 => self.response_format.clone(),
            _ => None,
        }
    }

    /// The first action: nothing is sent without a response boundary (BND-1).
    fn start(&mut self) -> Action {
        match self.boundary {
            Ok(_) => Action::BeginTurn,
            Err(why) => {
                let text = format!("the response boundary cannot be set up: {why}");
                self.lease
                    .stop(LeaseStop::PreflightFailed, Some(text.clone()));
                Action::Finish(fail(
                    AttemptFailure::RefusedBeforeSend {
                        error_text: text.clone(),
                    },
                    text,
                ))
            }
        }
    }

    /// The run was cancelled: the attempt ends here.
    fn cancelled(&mut self) -> Action {
        self.lease.stop(LeaseStop::Cancelled, None);
        Action::Finish(fail(AttemptFailure::Cancelled, "the attempt was cancelled"))
    }

    /// The lease grants the next turn after the host preflight (LSE-2), and the request is built.
    fn begin_turn(&mut self, preflight: Result<(), PreflightFailure>) -> Action {
        let turn = match self.lease.begin_turn(preflight) {
            Ok(n) => n,
            Err(end) => return Action::Finish(lease_ended(end.stop_reason, end.evidence)),
        };
        let request = TurnRequest {
            model: self.model.to_owned(),
            max_output_tokens: self.limits.max_output_tokens,
            system: Some(self.system.clone()),
            messages: self.messages.clone(),
            tools: self.specs.clone(),
            include_usage: self.include_usage,
            prompt_cache_key: self.prompt_cache_key.clone(),
            response_format: self.turn_constraint(),
            tool_choice: None,
        };
        match Payload::build(self.api, &request) {
            Ok(payload) => {
                self.constraint_sent |= request.response_format.is_some();
                Action::Send { turn, payload }
            }
            Err(e) => {
                self.lease
                    .stop(LeaseStop::PreflightFailed, Some(e.to_string()));
                let (batch, usage) = (ToolBatch::default(), Usage::ZERO);
                let reason = Some(format!("the request could not be built: {e}"));
                self.push_turn(turn, TurnStatus::Failed, Vec::new(), batch, usage, reason);
                Action::Finish(fail(
                    AttemptFailure::RefusedBeforeSend {
                        error_text: e.to_string(),
                    },
                    e.to_string(),
                ))
            }
        }
    }

    /// A provider turn ended (after its in-turn replays). A completed turn's raw body passes the
    /// response boundary before anything reads it.
    fn turn_ended(&mut self, turn: u32, result: TurnResult) -> Action {
        let replays: Vec<ReplayRecord> = result.record.replays.iter().map(replay_record).collect();
        let turn_usage = result.record.usage;
        self.usage = self.usage + turn_usage;
        self.turn_held_ms = result.record.held_ms;
        self.turn_warnings = result.record.warnings.clone();
        if let Some(g) = gateway_of(&result.end) {
            self.gateway = Some(g.clone());
        }
        let outcome = match result.end {
            TurnEnd::Completed(outcome) => outcome,
            other => {
                let status = match result.record.status {
                    ProviderTurnStatus::Cancelled => TurnStatus::Cancelled,
                    _ => TurnStatus::Failed,
                };
                let batch = ToolBatch::default();
                let reason = Some(turn_failure_reason(&other, result.record.requests));
                self.finish_turn(turn, status, replays, batch, turn_usage, reason);
                return Action::Finish(turn_failed(self, other));
            }
        };
        if let Ok(boundary) = self.boundary
            && let Some(refusal) = boundary_check(boundary, &outcome)
        {
            let batch = ToolBatch::default();
            let reason = Some(format!(
                "the response boundary refused the answer ({refusal})"
            ));
            self.finish_turn(turn, TurnStatus::Failed, replays, batch, turn_usage, reason);
            return Action::Finish(refused(self, &refusal));
        }
        if outcome.tool_calls.is_empty() {
            self.final_turn(turn, outcome, replays, turn_usage)
        } else {
            self.tool_turn(turn, outcome, replays, turn_usage)
        }
    }

    /// A turn without tool calls: the answer is judged, continued (STP-10) or cut for good.
    fn final_turn(
        &mut self,
        turn: u32,
        outcome: StreamOutcome,
        replays: Vec<ReplayRecord>,
        usage: Usage,
    ) -> Action {
        let batch = ToolBatch::default();
        self.finish_turn(
            turn,
            TurnStatus::Completed,
            replays,
            batch.clone(),
            usage,
            None,
        );
        self.answer.push_str(&outcome.text);
        let max_turns = self.limits.max_turns;
        let finish = outcome.finish_reason.as_ref();
        let next = after_final_turn(
            finish,
            &self.answer,
            self.continuations_sent,
            self.lease.turns_used(),
            max_turns,
        );
        let answered = TurnEvidence {
            batch: &batch,
            no_progress: false,
            assistant_text: &outcome.text,
        };
        if next != FinalTurn::Continue {
            self.keep_final_answer();
        }
        let ending = match next {
            FinalTurn::Continue => return self.continue_answer(),
            FinalTurn::Cut(NoContinuation::NoTurnLeft) => {
                // The turn ceiling, not the answer, ended the lease: say so in the record.
                let why = NoContinuation::NoTurnLeft;
                let text = cut_message(why, self.answer_continuations, max_turns);
                self.lease.stop(LeaseStop::MaxTurns, Some(text.clone()));
                fail(AttemptFailure::CutAnswer, text)
            }
            FinalTurn::Cut(why) => {
                // Ends the lease as answered: the (cut) answer was delivered.
                let _ = self.lease.checkpoint(answered);
                let text = cut_message(why, self.answer_continuations, max_turns);
                fail(AttemptFailure::CutAnswer, text)
            }
            FinalTurn::Complete => {
                // Ends the lease as answered: an empty batch needs no renewal.
                let _ = self.lease.checkpoint(answered);
                let ending = judge(self.step, finish, &self.answer, self.answer_continuations);
                self.grounded(ending)
            }
        };
        Action::Finish(ending)
    }

    /// An answer that met its schema, judged against the workspace when the contract asks for
    /// grounding: an unknown citation makes it `contract-ungrounded` (docs/grounding.md).
    fn grounded(&mut self, ending: Ending) -> Ending {
        let (Ok(Answer::Object(answer)), Some(basis)) = (&ending.0, self.grounding_basis) else {
            return ending;
        };
        let Some(contract) = self
            .step
            .contract
            .as_ref()
            .filter(|c| !c.grounding.is_empty())
        else {
            return ending;
        };
        let record = grounding::check(answer, &contract.grounding, &basis.index, &basis.pages);
        let unknown = record.unknown.len();
        self.grounding = Some(record);
        if unknown == 0 {
            return ending;
        }
        let names: Vec<&str> = self
            .grounding
            .iter()
            .flat_map(|r| &r.unknown)
            .map(|u| u.text.as_str())
            .take(5)
            .collect();
        let more = if unknown > names.len() {
            format!(" and {} more", unknown - names.len())
        } else {
            String::new()
        };
        fail(
            AttemptFailure::Contract {
                failure: ContractFailure::Ungrounded,
            },
            format!(
                "the answer cites {unknown} name(s) the workspace does not hold: {}{more}",
                names.join(", ")
            ),
        )
    }

    /// Asks for the rest of a cut answer. The lease is not checkpointed here: with an empty
    /// batch the checkpoint would end it as answered. The next `begin_turn` still runs the host
    /// preflight and refuses a turn beyond maxTurns, and what triggers the continuation is the
    /// provider's finish reason, never the model's text (LSE-3).
    fn continue_answer(&mut self) -> Action {
        self.continuations_sent += 1;
        self.answer_continuations += 1;
        self.messages.truncate(self.before_answer);
        self.messages.push(Message::Assistant {
            text: self.answer.clone(),
            tool_calls: Vec::new(),
        });
        self.messages.push(Message::User {
            text: CONTINUE_INSTRUCTION.to_owned(),
        });
        Action::BeginTurn
    }

    /// A turn that asked for tools: its calls run as one batch.
    fn tool_turn(
        &mut self,
        turn: u32,
        outcome: StreamOutcome,
        replays: Vec<ReplayRecord>,
        usage: Usage,
    ) -> Action {
        // A continuation answered with tool calls: the model left its cut answer to work on.
        // The conversation keeps what it wrote (and the instruction it got); its next final
        // answer is judged on its own.
        self.answer.clear();
        self.answer_continuations = 0;
        let calls: Vec<RequestedCall> = outcome
            .tool_calls
            .iter()
            .enumerate()
            .map(|(k, c)| RequestedCall {
                id: if c.id.is_empty() {
                    format!("call_{turn}_{k}")
                } else {
                    c.id.clone()
                },
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect();
        self.pending = Some(PendingBatch {
            turn,
            text: outcome.text,
            calls: calls.clone(),
            replays,
            usage,
            ran: None,
        });
        Action::RunTools { calls }
    }

    /// The batch ran: the turn is recorded, and the attempt ends if the host failed (LSE-2).
    fn batch_ran(&mut self, ran: BatchOutcome) -> Action {
        let Some(p) = self.pending.as_mut() else {
            return Action::Finish(fail(
                AttemptFailure::RefusedBeforeSend {
                    error_text: "a tool batch ran without a turn asking for it".to_owned(),
                },
                "internal: a tool batch ran without a turn asking for it",
            ));
        };
        p.ran = Some((ran.batch.clone(), ran.replies));
        let (turn, replays, usage) = (p.turn, std::mem::take(&mut p.replays), p.usage);
        self.finish_turn(turn, TurnStatus::Completed, replays, ran.batch, usage, None);
        match ran.host_failure {
            // The batch already ended the lease with this evidence (LSE-2).
            Some(host) => {
                Action::Finish(lease_ended(LeaseStop::PreflightFailed, Some(host.evidence)))
            }
            None => Action::AfterTools,
        }
    }

    /// After a batch: the attempt ends if the run was cancelled or the attempt timer fired by
    /// `now`; otherwise the replies go back to the model and the lease decides at its checkpoint
    /// whether another turn follows (LSE-3).
    fn after_tools(&mut self, no_progress: bool, cancelled: bool, now: Instant) -> Action {
        let Some(PendingBatch {
            text,
            calls,
            ran: Some((batch, replies)),
            ..
        }) = self.pending.take()
        else {
            return Action::Finish(fail(
                AttemptFailure::RefusedBeforeSend {
                    error_text: "tool results were asked for before the batch ran".to_owned(),
                },
                "internal: tool results were asked for before the batch ran",
            ));
        };
        if cancelled {
            return self.cancelled();
        }
        if now >= self.deadline {
            self.lease.stop(LeaseStop::Deadline, None);
            return Action::Finish(fail(
                AttemptFailure::AttemptDeadline,
                format!(
                    "the attempt timer of {} ms fired while tools ran",
                    self.limits.timeout_ms
                ),
            ));
        }
        self.messages.push(Message::Assistant {
            text: text.clone(),
            tool_calls: calls.iter().map(assistant_tool_call).collect(),
        });
        for r in replies {
            let is_error = r.text.starts_with("error:");
            self.messages.push(Message::ToolResult {
                call_id: r.id,
                content: r.text,
                is_error,
            });
        }
        match self.lease.checkpoint(TurnEvidence {
            batch: &batch,
            no_progress,
            assistant_text: &text,
        }) {
            Checkpoint::Renew => {
                // A later cut answer is continued from the conversation as it is now.
                self.before_answer = self.messages.len();
                Action::BeginTurn
            }
            Checkpoint::Stop(end) => Action::Finish(lease_ended(end.stop_reason, end.evidence)),
        }
    }

    /// Keeps the joined answer the attempt ends on for its excerpt. A write step that closed
    /// without text has none.
    fn keep_final_answer(&mut self) {
        let blank_write = self.step.access == Access::Write && self.answer.trim().is_empty();
        if !blank_write {
            self.final_answer = Some(self.answer.clone());
        }
    }

    /// Records the turn. A reason passes the redactor here, so the record and the observer get
    /// the same safe line (a boundary refusal or a request error can quote provider words).
    fn push_turn(
        &mut self,
        turn: u32,
        status: TurnStatus,
        replays: Vec<ReplayRecord>,
        tool_batch: ToolBatch,
        usage: Usage,
        reason: Option<String>,
    ) {
        let reason = reason.map(|r| redactor_for(self.boundary).line_capped(&r, REASON_MAX_CHARS));
        self.turns.push(TurnRecord {
            turn,
            status,
            replays,
            tool_batch,
            usage,
            cost_usd: self.pricing.and_then(|p| p.cost(&usage)),
            reason,
            held_ms: std::mem::take(&mut self.turn_held_ms),
            duration_ms: None,
            warnings: std::mem::take(&mut self.turn_warnings),
        });
    }

    /// Each turn lasts until the next one begins (an attempt that asked for one more turn and
    /// was refused stops there) or, for the last, until the attempt ended at `ended`.
    fn time_turns(&mut self, ended: Instant) {
        for t in &mut self.turns {
            let n = t.turn as usize;
            let (Some(start), end) = (
                self.turn_starts.get(n.wrapping_sub(1)),
                self.turn_starts.get(n).copied().unwrap_or(ended),
            ) else {
                continue;
            };
            t.duration_ms = Some(
                u64::try_from(end.saturating_duration_since(*start).as_millis())
                    .unwrap_or(u64::MAX),
            );
        }
    }

    /// Records the turn and tells the observer it ended. A tool turn's calls are still pending
    /// here, with the arguments that name their paths.
    fn finish_turn(
        &mut self,
        turn: u32,
        status: TurnStatus,
        replays: Vec<ReplayRecord>,
        batch: ToolBatch,
        usage: Usage,
        reason: Option<String>,
    ) {
        let redactor = match self.boundary {
            Ok(b) => b.redactor(),
            Err(_) => &*SHAPES_ONLY,
        };
        let calls = match &self.pending {
            Some(p) if p.turn == turn => batch::tool_uses(&p.calls, &batch, redactor),
            _ => Vec::new(),
        };
        let (requested, rejected, executed) = (batch.requested, batch.rejected, batch.executed);
        self.push_turn(turn, status, replays, batch, usage, reason);
        let recorded = self.turns.last();
        let reason = recorded.and_then(|t| t.reason.clone());
        let warnings = recorded.map(|t| t.warnings.clone()).unwrap_or_default();
        self.events.push(TurnEvent::Finished {
            turn,
            status,
            requested,
            rejected,
            executed,
            calls,
            reason,
        });
        self.events.extend(
            warnings
                .into_iter()
                .map(|warning| TurnEvent::Warning { turn, warning }),
        );
    }
}

/// A call as it goes back to the model in the assistant message. Arguments that are not a JSON
/// object cannot go back to every API as sent; the rejection the model gets says what was
/// wrong with them.
fn assistant_tool_call(c: &RequestedCall) -> AssistantToolCall {
    AssistantToolCall {
        id: c.id.clone(),
        name: c.name.clone(),
        arguments: if matches!(
            serde_json::from_str::<Value>(&c.arguments),
            Ok(Value::Object(_))
        ) {
            c.arguments.clone()
        } else {
            "{}".to_owned()
        },
    }
}

/// Performs the agent loop's actions: the provider turns (with their replays, bounded by the
/// attempt deadline and the cancellation) and the tool batches, and passes the loop's turn
/// events to the observer as they happen.
async fn drive(
    input: &AttemptInput<'_>,
    lp: &mut AgentLoop<'_>,
    tools: &mut StepTools<'_>,
) -> Ending {
    let mut action = lp.start();
    loop {
        for event in lp.events.drain(..) {
            (input.observer)(event);
        }
        action = match action {
            Action::Finish(ending) => return ending,
            Action::BeginTurn if input.cancel.is_cancelled() => lp.cancelled(),
            Action::BeginTurn => {
                lp.turn_starts.push(Instant::now());
                lp.begin_turn(tools.preflight())
            }
            Action::Send { turn, payload } => {
                (input.observer)(TurnEvent::Request {
                    turn,
                    digest: payload.digest().to_hex(),
                    payload: payload.bytes().clone(),
                });
                let observer = input.observer;
                let mut on_event = |e: DriverEvent<'_>| {
                    if let Some(event) = driver_event(turn, e) {
                        observer(event);
                    }
                };
                // The step retry's ceiling bounds only the attempt's first request.
                let gate = input.gate.map(|g| Gate {
                    first_patience: g.first_patience.filter(|_| turn == 1),
                    ..g
                });
                let spend = input.spend.budget.map(|budget| Spend {
                    budget,
                    max_output_tokens: u64::from(input.limits.max_output_tokens),
                });
                let result = run_turn_gated(
                    input.transport,
                    &input.replay_limits,
                    &payload,
                    input.cancel,
                    Some(lp.deadline),
                    gate,
                    spend,
                    &mut on_event,
                )
                .await;
                lp.turn_ended(turn, result)
            }
            Action::RunTools { calls } => {
                let ran = batch::run_batch_with(tools, &mut lp.lease, &calls, input.before_write);
                lp.batch_ran(ran)
            }
            Action::AfterTools => lp.after_tools(
                tools.supervisor().no_progress(),
                input.cancel.is_cancelled(),
                Instant::now(),
            ),
        };
    }
}

/// The turn event for what the replay driver reported, if the observer hears of it.
fn driver_event(turn: u32, e: DriverEvent<'_>) -> Option<TurnEvent> {
    /// One warning per process: the operator needs to know once, not per request.
    static THROTTLE_WARNED: AtomicBool = AtomicBool::new(false);
    match e {
        DriverEvent::Replay(entry) => Some(TurnEvent::Replay {
            turn,
            entry: *entry,
        }),
        DriverEvent::Held { held_ms, reason } => Some(TurnEvent::Held {
            turn,
            held_ms,
            reason: reason.map_or("hold", |r| r.as_str()),
        }),
        DriverEvent::ThrottleUnavailable(message) => (!THROTTLE_WARNED
            .swap(true, Ordering::Relaxed))
        .then(|| TurnEvent::ThrottleUnavailable {
            message: message.to_owned(),
        }),
    }
}

/// Why a cut answer gets no further continuation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoContinuation {
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
enum FinalTurn {
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
fn after_final_turn(
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
fn cut_message(why: NoContinuation, continuations: u32, max_turns: u32) -> String {
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

fn replay_record(e: &ReplayEntry) -> ReplayRecord {
    ReplayRecord {
        cause: e.cause,
        provider_error_class: e.provider_error_class,
        wait_ms: e.wait_ms,
        retry_after_ms: e.retry_after_ms,
        held_ms: e.held_ms,
    }
}

/// How the attempt ends when the lease stopped it.
fn lease_ended(reason: LeaseStop, evidence: Option<String>) -> Ending {
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

/// BND-1 for the runtime's own turns: the refusal of a completed turn's raw 200 body, if any.
/// The transport usually judged the body while reading it; then that verdict is used.
fn boundary_check(boundary: &BoundaryConfig, outcome: &StreamOutcome) -> Option<Refusal> {
    match outcome.verdict_under(boundary)? {
        Verdict::Pass(_) => None,
        Verdict::Refuse(r) => Some(r),
    }
}

/// How the attempt ends when the boundary refused a completed turn. The message names the
/// reason code and, for credentials, the kind or the key's label: `Refusal`'s Display never
/// holds the matched bytes.
fn refused(st: &mut AgentLoop<'_>, refusal: &Refusal) -> Ending {
    let text = format!(
        "the response boundary refused the provider's answer ({refusal}); none of it was used"
    );
    st.lease.stop(LeaseStop::ProviderFailed, Some(text.clone()));
    if refusal.reason.is_credential() {
        // STP-14: terminal, whatever the budgets; asking again could show the key again.
        return fail(
            AttemptFailure::ValidatorTerminal {
                refusal: ValidatorRefusal::CredentialMaterial,
            },
            text,
        );
    }
    // The provider answered, but not as the selected model or not as a readable stream: a
    // provider fault that no transport class fits. Retrying the same request usually meets the
    // same answer (a model name the provider reports differently), so it is `unknown`.
    let failure = ProviderFailure::from_fault(FaultKind::ErrorEvent);
    st.provider_failure = Some(failure);
    fail(AttemptFailure::Provider { failure }, text)
}

/// STP-14: the provider said the request does not fit the model's context window.
fn context_exhausted(st: &mut AgentLoop<'_>, failure: &TransportFailure) -> Ending {
    st.lease
        .stop(LeaseStop::ProviderFailed, Some(failure.detail.clone()));
    // Recorded too, so the attempt still shows the provider's class and status.
    st.provider_failure = Some(failure.failure);
    fail(
        AttemptFailure::ContextExhausted {
            context: failure.context_window(),
        },
        format!(
            "the provider reported the model's context window exceeded: {}",
            failure.detail
        ),
    )
}

/// The most characters of a turn's `reason`: one short line.
const REASON_MAX_CHARS: usize = 200;

/// A failed or cancelled turn's reason, from structured facts only (the class, the status, the
/// fault label, the request count): the provider's own words stay in the attempt's message.
fn turn_failure_reason(end: &TurnEnd, requests: u32) -> String {
    let after = match requests {
        0 => String::new(),
        1 => " after 1 request".to_owned(),
        n => format!(" after {n} requests"),
    };
    match end {
        TurnEnd::Failed { failure, .. } => {
            let f = &failure.failure;
            let class = f.class.as_str();
            // The class once when the fault's own label says the same.
            let what = match f.http_status {
                Some(status) => format!("HTTP {status} ({class})"),
                None if f.fault.as_str() == class => class.to_owned(),
                None => format!("{} ({class})", f.fault.as_str()),
            };
            let context = if failure.context_exhausted() {
                ", context window exceeded"
            } else {
                ""
            };
            format!("provider fault: {what}{context}{after}")
        }
        TurnEnd::DeadlineReached { .. } => format!("attempt deadline{after}"),
        TurnEnd::DigestMismatch { .. } => {
            "replay refused: the payload digest did not match the first request".to_owned()
        }
        TurnEnd::BudgetExhausted(e) => format!("run budget: {} (nothing sent){after}", e.bound),
        TurnEnd::Cancelled => "cancelled".to_owned(),
        TurnEnd::Completed(_) => "completed".to_owned(),
    }
}

fn turn_failed(st: &mut AgentLoop<'_>, end: TurnEnd) -> Ending {
    match end {
        TurnEnd::Failed { failure, .. } if failure.context_exhausted() => {
            context_exhausted(st, &failure)
        }
        TurnEnd::Failed { failure, .. } => {
            st.lease
                .stop(LeaseStop::ProviderFailed, Some(failure.detail.clone()));
            st.provider_failure = Some(failure.failure);
            fail(
                AttemptFailure::Provider {
                    failure: failure.failure,
                },
                failure.detail,
            )
        }
        TurnEnd::DeadlineReached { .. } => {
            st.lease.stop(LeaseStop::Deadline, None);
            fail(
                AttemptFailure::AttemptDeadline,
                "the attempt timer fired during a provider turn",
            )
        }
        TurnEnd::DigestMismatch { expected, actual } => {
            let text = format!(
                "payload digest mismatch: a replay would have sent {actual} instead of {expected}"
            );
            st.lease.stop(LeaseStop::ProviderFailed, Some(text.clone()));
            fail(
                AttemptFailure::RefusedBeforeSend {
                    error_text: text.clone(),
                },
                text,
            )
        }
        TurnEnd::BudgetExhausted(e) => {
            st.lease
                .stop(LeaseStop::ProviderFailed, Some(e.message.clone()));
            let message = e.message.clone();
            fail(
                AttemptFailure::BudgetExhausted {
                    bound: e.bound.to_owned(),
                    message: e.message,
                },
                message,
            )
        }
        TurnEnd::Cancelled => {
            st.lease.stop(LeaseStop::Cancelled, None);
            fail(AttemptFailure::Cancelled, "the attempt was cancelled")
        }
        TurnEnd::Completed(_) => fail(
            AttemptFailure::RefusedBeforeSend {
                error_text: "a completed turn was handled as failed".to_owned(),
            },
            "internal: a completed turn was handled as failed",
        ),
    }
}

/// Judges a finished final answer (`text`, joined from `continuations` continuations of a cut
/// answer when there were any): the contract of a read-only step, or the end of a write step.
fn judge(step: &Step, finish: Option<&FinishReason>, text: &str, continuations: u32) -> Ending {
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
    use docsfab_provider::driver::{EndKind, TurnAccount};
    use docsfab_provider::scripted::ScriptedTransport;

    /// A completed turn as the replay driver hands it back, with `text` and `finish`.
    fn completed(text: &str, finish: FinishReason) -> TurnResult {
        TurnResult {
            end: TurnEnd::Completed(StreamOutcome {
                http_status: 200,
                text: text.to_owned(),
                content_published: true,
                finish_reason: Some(finish),
                done: true,
                usage: Usage::ZERO,
                tool_calls: Vec::new(),
                models: vec!["m".to_owned()],
                raw_body: None,
                verdict: None,
                rate_headers: Default::default(),
                gateway: None,
            }),
            record: TurnAccount {
                status: ProviderTurnStatus::Completed,
                end: EndKind::Completed,
                provider_retries: 0,
                replays: Vec::new(),
                requests: 1,
                payload_digest: String::new(),
                failure: None,
                stop_reason: None,
                detail: None,
                usage: Usage::ZERO,
                held_ms: 0,
                duration_ms: 1,
                warnings: Vec::new(),
            },
        }
    }

    /// Steps the agent loop of a write step by hand: no transport, no tools, no clock.
    fn with_loop(check: impl FnOnce(&mut AgentLoop<'_>)) {
        let dir = tempfile::tempdir().expect("temp dir");
        let workspace = Workspace::open(dir.path()).expect("workspace");
        let transport = ScriptedTransport::new([]);
        let boundary =
            BoundaryConfig::new(docsfab_record::Api::OpenaiChat, "m", &[]).expect("boundary");
        let step = Step {
            id: "write".to_owned(),
            access: Access::Write,
            instructions: "Write.".to_owned(),
            tools: vec![Tool::WriteFile],
            contract: None,
            write_roots: vec!["docs".to_owned()],
            line: 1,
            fan_out: None,
            pages: Vec::new(),
        };
        let cancel = CancellationToken::new();
        let input = AttemptInput {
            spend: Default::default(),
            structured_output: StructuredOutput::JsonSchema,
            grounding: None,
            grounding_correction: None,
            transport: &transport,
            gate: None,
            api: Api::OpenaiChat,
            model: "m",
            step: &step,
            limits: ModelLimits::default(),
            replay_limits: ReplayLimits::default(),
            boundary: Ok(&boundary),
            instructions: "Write.",
            feedback: None,
            workspace: &workspace,
            cancel: &cancel,
            observer: &|_| {},
            before_write: None,
        };
        let mut lp = AgentLoop::new(&input, Instant::now() + Duration::from_secs(60));
        check(&mut lp);
    }

    fn sent_turn(action: Action) -> u32 {
        match action {
            Action::Send { turn, .. } => turn,
            _ => panic!("expected a turn to send"),
        }
    }

    // STP-10, driven without I/O: a cut answer asks for a continuation, and the pieces are
    // joined into the answer the step judges.
    #[test]
    fn the_loop_continues_a_cut_answer_and_joins_the_pieces_stp_10() {
        with_loop(|lp| {
            assert!(matches!(lp.start(), Action::BeginTurn));
            let turn = sent_turn(lp.begin_turn(Ok(())));
            let next = lp.turn_ended(turn, completed("Wrote docs/a", FinishReason::Length));
            assert!(matches!(next, Action::BeginTurn));
            assert!(matches!(
                lp.messages.last(),
                Some(Message::User { text }) if text == CONTINUE_INSTRUCTION
            ));
            let turn = sent_turn(lp.begin_turn(Ok(())));
            assert_eq!(turn, 2);
            let end = lp.turn_ended(turn, completed(".md", FinishReason::Stop));
            let Action::Finish((Ok(Answer::Text(text)), None)) = end else {
                panic!("the joined answer is the outcome");
            };
            assert_eq!(text, "Wrote docs/a.md");
            assert_eq!(lp.turns.len(), 2);
            assert_eq!(lp.events.len(), 2, "one finished event per turn");
        });
    }

    // Cancellation seen after a tool batch ends the attempt before the model is asked again.
    #[test]
    fn the_loop_ends_cancelled_after_a_batch_when_the_run_was_cancelled() {
        with_loop(|lp| {
            let _ = lp.start();
            let turn = sent_turn(lp.begin_turn(Ok(())));
            let mut result = completed("", FinishReason::ToolCalls);
            if let TurnEnd::Completed(outcome) = &mut result.end {
                outcome
                    .tool_calls
                    .push(docsfab_provider::outcome::ToolCall {
                        id: String::new(),
                        name: "list_files".to_owned(),
                        arguments: "{}".to_owned(),
                        truncated: false,
                    });
            }
            let Action::RunTools { calls } = lp.turn_ended(turn, result) else {
                panic!("a turn with tool calls runs them");
            };
            assert_eq!(calls[0].id, "call_1_0");
            let ran = BatchOutcome {
                batch: ToolBatch::default(),
                replies: Vec::new(),
                host_failure: None,
            };
            assert!(matches!(lp.batch_ran(ran), Action::AfterTools));
            let end = lp.after_tools(false, true, Instant::now());
            assert!(matches!(
                end,
                Action::Finish((Err(AttemptFailure::Cancelled), Some(_)))
            ));
            assert_eq!(lp.turns.len(), 1);
        });
    }

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
