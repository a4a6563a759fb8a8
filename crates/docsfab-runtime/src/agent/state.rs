//! The agent loop of one attempt as a sans-IO state machine ([`AgentLoop`], quinn-proto's
//! shape): the conversation, the answer so far and its continuations, the execution lease and
//! the attempt's account. It takes events (a turn's result, a batch's result, whether the run was
//! cancelled, the time) and answers with the next [`Action`]; it performs no I/O, reads no clock
//! and never waits. The record's [`ReplayRecord`] is made here from the provider's
//! [`ReplayEntry`] (`replay_record`), the one place the driver's account of a replay becomes the
//! record's.

use std::sync::LazyLock;
use std::time::Instant;

use docsfab_boundary::{BoundaryConfig, Redactor, Refusal, Verdict};
use docsfab_policy::class::ProviderFailure;
use docsfab_policy::step::{AttemptFailure, ValidatorRefusal};
use docsfab_provider::driver::{TurnEnd, TurnResult};
use docsfab_provider::outcome::StreamOutcome;
use docsfab_provider::{
    AssistantToolCall, Message, Payload, ReplayEntry, ResponseFormat, ToolSpec, TransportFailure,
    TurnRequest,
};
use docsfab_record::{
    Access, Api, ContractFailure, FaultKind, Gateway, GroundingRecord, LeaseRecord, LeaseStop,
    OutputConstraint, Pricing, ReplayRecord, ToolBatch, TurnRecord, TurnStatus, TurnWarning, Usage,
};
use serde_json::Value;

use super::ending::{
    Answer, Ending, FinalTurn, NoContinuation, after_final_turn, cut_message, fail, judge,
    lease_ended,
};
use super::input::{AttemptInput, TurnEvent};
use super::prompt::{CONTINUE_INSTRUCTION, correction, response_format, system_prompt, tool_specs};
use crate::batch::{self, BatchOutcome, CallReply, RequestedCall};
use crate::composition::{ModelLimits, Step};
use crate::grounding::{self, GroundingBasis};
use crate::ledger::{Checkpoint, ExecutionLease, PreflightFailure, TurnEvidence};

/// What the async driver does next for the agent loop.
pub(super) enum Action {
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
/// [`Action`]; the async driver (`drive`) performs the actions (the provider turn, the tools)
/// and feeds it back.
pub(super) struct AgentLoop<'a> {
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
    turn_warnings: Vec<TurnWarning>,
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

/// What the loop kept of an attempt that ended, for its report (which redacts it).
pub(super) struct Account {
    pub(super) turns: Vec<TurnRecord>,
    pub(super) lease: LeaseRecord,
    pub(super) usage: Usage,
    pub(super) provider_failure: Option<ProviderFailure>,
    pub(super) gateway: Option<Gateway>,
    /// The final answer the attempt ended on, as the model sent it.
    pub(super) final_answer: Option<String>,
    pub(super) grounding: Option<GroundingRecord>,
    /// The structured-output constraint a request that left carried.
    pub(super) output_constraint: Option<OutputConstraint>,
}

impl<'a> AgentLoop<'a> {
    pub(super) fn new(input: &AttemptInput<'a>, deadline: Instant) -> AgentLoop<'a> {
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

    /// The turn events not yet passed to the observer, in order.
    pub(super) fn take_events(&mut self) -> impl Iterator<Item = TurnEvent> + '_ {
        self.events.drain(..)
    }

    /// When the attempt timer fires.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The execution lease, for the tool batch the driver runs against it.
    pub(super) fn lease_mut(&mut self) -> &mut ExecutionLease {
        &mut self.lease
    }

    /// The attempt ended at `ended`: the turns are timed and the account handed over.
    pub(super) fn finish(mut self, ended: Instant) -> Account {
        self.time_turns(ended);
        let lease = self
            .lease
            .record()
            .unwrap_or_else(|| fallback_lease_record(&self.lease, self.limits.max_turns));
        Account {
            output_constraint: self
                .response_format
                .as_ref()
                .filter(|_| self.constraint_sent)
                .map(ResponseFormat::recorded),
            turns: self.turns,
            lease,
            usage: self.usage,
            provider_failure: self.provider_failure,
            gateway: self.gateway,
            final_answer: self.final_answer,
            grounding: self.grounding,
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
    pub(super) fn start(&mut self) -> Action {
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
    pub(super) fn cancelled(&mut self) -> Action {
        self.lease.stop(LeaseStop::Cancelled, None);
        Action::Finish(fail(AttemptFailure::Cancelled, "the attempt was cancelled"))
    }

    /// The lease grants the next turn, begun at `now`, after the host preflight (LSE-2), and the
    /// request is built.
    pub(super) fn begin_turn(
        &mut self,
        preflight: Result<(), PreflightFailure>,
        now: Instant,
    ) -> Action {
        self.turn_starts.push(now);
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
    pub(super) fn turn_ended(&mut self, turn: u32, result: TurnResult) -> Action {
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
                    TurnStatus::Cancelled => TurnStatus::Cancelled,
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
    pub(super) fn batch_ran(&mut self, ran: BatchOutcome) -> Action {
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
    pub(super) fn after_tools(
        &mut self,
        no_progress: bool,
        cancelled: bool,
        now: Instant,
    ) -> Action {
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
        let redactor = redactor_for(self.boundary);
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

/// The redactor when the boundary could not be set up (no provider text is read then): key
/// shapes, escapes and the cap.
static SHAPES_ONLY: LazyLock<Redactor> = LazyLock::new(Redactor::default);

/// The boundary's redactor (it knows the run's key), else key shapes only.
pub(super) fn redactor_for<'b>(boundary: Result<&'b BoundaryConfig, &str>) -> &'b Redactor {
    match boundary {
        Ok(b) => b.redactor(),
        Err(_) => &SHAPES_ONLY,
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

fn replay_record(e: &ReplayEntry) -> ReplayRecord {
    ReplayRecord {
        cause: e.cause,
        provider_error_class: e.provider_error_class,
        wait_ms: e.wait_ms,
        retry_after_ms: e.retry_after_ms,
        held_ms: e.held_ms,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use docsfab_policy::host::StructuredOutput;
    use docsfab_policy::replay::ReplayLimits;
    use docsfab_provider::driver::{EndKind, TurnAccount};
    use docsfab_provider::outcome::FinishReason;
    use docsfab_provider::scripted::ScriptedTransport;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::composition::Tool;
    use crate::workspace::Workspace;

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
                status: TurnStatus::Completed,
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
            let turn = sent_turn(lp.begin_turn(Ok(()), Instant::now()));
            let next = lp.turn_ended(turn, completed("Wrote docs/a", FinishReason::Length));
            assert!(matches!(next, Action::BeginTurn));
            assert!(matches!(
                lp.messages.last(),
                Some(Message::User { text }) if text == CONTINUE_INSTRUCTION
            ));
            let turn = sent_turn(lp.begin_turn(Ok(()), Instant::now()));
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
            let turn = sent_turn(lp.begin_turn(Ok(()), Instant::now()));
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
}
