//! The in-turn replay driver: one provider turn, that is one request and its replays.
//!
//! The driver is thin on purpose. After each failed request it asks
//! `docsfab_policy::replay::decide` what to do and does exactly that: wait and send the same
//! bytes again, or end the turn. What it owns is what the pure policy cannot: the clock, the
//! sockets (through a [`Transport`]), cancellation, and the byte-identity check.
//!
//! * **Identical payload (REP-12).** The digest of the first request's bytes is taken when the
//!   turn starts. Before every replay the bytes about to be sent are hashed again and compared;
//!   on a mismatch the turn fails closed and nothing is sent. [`PayloadSource`] is the seam that
//!   lets a test hand the driver different bytes to prove it.
//! * **Cancellation (REP-9).** Every wait and every request in flight races the caller's
//!   [`CancellationToken`]; a cancelled turn ends at once and is recorded `cancelled`, not as a
//!   provider failure.
//! * **Deadline (REP-10).** The attempt deadline is a tokio [`Instant`]. `now` and the deadline
//!   go into `decide` as milliseconds since the turn started (one monotonic scale), so a wait
//!   that would cross the deadline is never started; a request still in flight at the deadline
//!   is dropped and the turn ends on it.
//! * **Published content (REP-14, CLS-4).** A failure after answer content was published is
//!   never replayed; the break ends the turn and the step layer decides.
//! * **Below the turn governor (REP-11).** [`run_turn`] takes only a transport, the replay
//!   limits, the payload, a cancellation token and a deadline. The turn governor, the turn
//!   ledger and the execution lease live in `docsfab-runtime`, which depends on this crate and
//!   never the reverse, so a replay cannot consume a provider turn, append a ledger entry or run
//!   a lease preflight: the code that could do so is not reachable from here.
//!
//! * **Shared provider throttle.** With a [`Gate`], every send (the first and each replay)
//!   first takes a permit from `docsfab_throttle::Throttle`, bounded by the same cancellation
//!   and deadline, and gives it back with how the request went and its rate-limit headers. A
//!   429 is reported before this turn's own backoff starts, so every other sender holds at
//!   once. The wait is the turn's `heldMs`: not a replay, not replay wait, so the windows and
//!   the attempt count mean what they meant. A throttle that cannot be read fails open: the
//!   request goes unthrottled and the caller is told once per event ([`DriverEvent`]).
//!
//! Time comes only from `tokio::time`, so tests run the exact schedules on a paused clock.

use std::time::Duration;

use bytes::Bytes;
use docsfab_policy::class::ProviderFailure;
use docsfab_policy::replay::{
    PastReplay, ReplayDecision, ReplayLimits, StopReason, Window, decide,
};
use docsfab_record::{ProviderErrorClass, ReplayCause, TurnStatus, TurnWarning, Usage};
use docsfab_throttle::{
    AcquireError, Outcome as ThrottleOutcome, Permit, Reason, Request, Throttle,
};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::{Exhausted, Reservation, RunBudget, worst_prompt_tokens};
use crate::outcome::{StreamOutcome, TransportFailure};
use crate::request::{Payload, PayloadDigest};
use crate::transport::Transport;
use crate::truncation::prompt_truncated;

/// Where the driver gets the bytes for each request of the turn.
///
/// A [`Payload`] gives its one immutable buffer every time, so in production the digest check
/// cannot fail; the trait exists so a test can prove the check runs before every replay.
pub trait PayloadSource: Send + Sync {
    /// The digest of the turn's first request, taken when the payload was serialized.
    fn digest(&self) -> PayloadDigest;
    /// The bytes to send as request `attempt` of the turn (1-based).
    fn bytes_for_attempt(&self, attempt: u32) -> Bytes;
}

impl PayloadSource for Payload {
    fn digest(&self) -> PayloadDigest {
        Payload::digest(self)
    }

    fn bytes_for_attempt(&self, _attempt: u32) -> Bytes {
        self.bytes().clone()
    }
}

/// One replay of the turn (REP-13): why the request before it failed and how long the driver
/// waited before sending it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayEntry {
    #[serde(flatten)]
    pub cause: ReplayCause,
    pub provider_error_class: ProviderErrorClass,
    pub wait_ms: u64,
    /// The Retry-After the failed response carried, in ms.
    pub retry_after_ms: Option<u64>,
    /// The window that judged the failure.
    pub window: Window,
    /// How long the shared throttle held the replay after its wait. `wait_ms + held_ms` is the
    /// gap on the wire between the failed request and this one.
    #[serde(default)]
    pub held_ms: u64,
}

/// Why the turn ended, without the data [`TurnEnd`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndKind {
    Completed,
    ProviderFailure,
    Deadline,
    DigestMismatch,
    BudgetExhausted,
    Cancelled,
}

/// The replay driver's account of one turn (camelCase JSON); the agent loop turns it into the
/// run record's `TurnRecord`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnAccount {
    pub status: TurnStatus,
    pub end: EndKind,
    /// How many replays the policy scheduled: `replays.len()`.
    pub provider_retries: u32,
    pub replays: Vec<ReplayEntry>,
    /// Requests actually sent. `providerRetries + 1`, except when the turn was cancelled or
    /// refused during a backoff (then the last scheduled replay was never sent).
    pub requests: u32,
    /// SHA-256 of the payload, hex; every request of the turn sent exactly these bytes.
    pub payload_digest: String,
    /// The failure that ended the turn, when a provider failure did.
    pub failure: Option<ProviderFailure>,
    pub stop_reason: Option<StopReason>,
    /// One line for people about how the turn ended; never holds the API key.
    pub detail: Option<String>,
    /// Time the shared provider throttle held this turn's requests before they were sent.
    /// Not replay wait: it spends no replay window.
    #[serde(default)]
    pub held_ms: u64,
    /// Tokens over every request of the turn, failed ones included.
    pub usage: Usage,
    pub duration_ms: u64,
    /// What looked wrong with the answer without deciding anything (a prompt the server cut).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<TurnWarning>,
}

/// How the turn ended, with what the runtime needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
// The answer is the common end of a turn, so it stays inline rather than boxed.
#[allow(clippy::large_enum_variant)]
pub enum TurnEnd {
    /// The provider answered.
    Completed(StreamOutcome),
    /// The last request failed and the policy stopped the turn.
    Failed {
        failure: TransportFailure,
        stop: StopReason,
    },
    /// The attempt deadline passed with a request in flight or before one could be sent.
    DeadlineReached {
        last_failure: Option<TransportFailure>,
    },
    /// The bytes of a replay did not match the first request's digest; nothing was sent.
    DigestMismatch {
        expected: PayloadDigest,
        actual: PayloadDigest,
    },
    /// The run's budget could not take the next request's worst case; it was not sent.
    BudgetExhausted(Exhausted),
    /// The caller cancelled the turn.
    Cancelled,
}

/// The run budget a turn's sends reserve from, and the output ceiling each request asks for.
#[derive(Debug, Clone, Copy)]
pub struct Spend<'a> {
    pub budget: &'a RunBudget,
    pub max_output_tokens: u64,
}

/// A finished turn: how it ended, and its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnResult {
    pub end: TurnEnd,
    pub record: TurnAccount,
}

/// The shared provider throttle a turn's sends pass, and the provider's host.yaml name (the
/// throttle's key).
#[derive(Debug, Clone, Copy)]
pub struct Gate<'a> {
    pub throttle: &'a Throttle,
    pub provider: &'a str,
    /// The most the throttle may hold the turn's first request: what is left of the ceiling of
    /// the wait before it (a step retry's first turn: the budget's delay ceiling less the
    /// step's own wait). `None`: the replay policy's per-wait ceiling, as for any send.
    pub first_patience: Option<Duration>,
}

/// What the driver tells its caller while a turn runs.
#[derive(Debug, Clone, Copy)]
pub enum DriverEvent<'a> {
    /// A replay was scheduled (before its wait).
    Replay(&'a ReplayEntry),
    /// The throttle held the request `held_ms` before it was sent; `reason` is the last gate
    /// that made it wait.
    Held {
        held_ms: u64,
        reason: Option<Reason>,
    },
    /// The throttle's shared state could not be read or written; the request went (or its
    /// result was kept) without it. One sentence naming `throttle.db`.
    ThrottleUnavailable(&'a str),
}

/// Runs one provider turn with in-turn replay. See the module docs for the rules it keeps.
pub async fn run_turn(
    transport: &dyn Transport,
    limits: &ReplayLimits,
    payload: &dyn PayloadSource,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
) -> TurnResult {
    run_turn_observed(transport, limits, payload, cancel, deadline, &mut |_| {}).await
}

/// [`run_turn`], calling `on_replay` as each replay is scheduled (before its wait), so a caller
/// can show retries as they happen.
pub async fn run_turn_observed(
    transport: &dyn Transport,
    limits: &ReplayLimits,
    payload: &dyn PayloadSource,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
    on_replay: &mut (dyn FnMut(&ReplayEntry) + Send),
) -> TurnResult {
    let mut on_event = |e: DriverEvent<'_>| {
        if let DriverEvent::Replay(entry) = e {
            on_replay(entry);
        }
    };
    run_turn_gated(
        transport,
        limits,
        payload,
        cancel,
        deadline,
        None,
        None,
        &mut on_event,
    )
    .await
}

/// [`run_turn_observed`] with every send reserving its worst case from `spend` (the run's
/// budget) and passing `gate` (the shared provider throttle) when there are, and the caller
/// told of holds and throttle trouble too.
#[allow(clippy::too_many_arguments)]
pub async fn run_turn_gated(
    transport: &dyn Transport,
    limits: &ReplayLimits,
    payload: &dyn PayloadSource,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
    gate: Option<Gate<'_>>,
    spend: Option<Spend<'_>>,
    on_event: &mut (dyn FnMut(DriverEvent<'_>) + Send),
) -> TurnResult {
    let started = Instant::now();
    let ms_since_start = |t: Instant| duration_ms(t.saturating_duration_since(started));
    let deadline_ms = deadline.map(ms_since_start);

    let expected = payload.digest();
    let mut turn = Turn::new(started, expected);
    let mut attempt: u32 = 1;
    let mut last_failure: Option<TransportFailure> = None;
    let mut last_window = Window::Throttle;
    loop {
        let bytes = payload.bytes_for_attempt(attempt);
        if let Some((end, detail)) = refuse_to_send(
            expected,
            &bytes,
            attempt,
            cancel,
            deadline,
            &mut last_failure,
        ) {
            return turn.finish(end, detail);
        }

        let reservation = match reserve(spend, bytes.len()) {
            Ok(r) => r,
            Err(e) => {
                let detail = Some(e.message.clone());
                return turn.finish(TurnEnd::BudgetExhausted(e), detail);
            }
        };
        let request = Request {
            prompt_tokens: estimated_prompt_tokens(&bytes),
            patience: turn.patience(gate, limits, last_window),
        };
        let passed = pass_gate(gate, &request, cancel, deadline, &mut turn, on_event).await;
        let permit = match passed {
            Ok(permit) => permit,
            Err(GateRefusal::Cancelled) => return turn.finish(TurnEnd::Cancelled, None),
            Err(GateRefusal::Deadline(detail)) => {
                return turn.finish(TurnEnd::DeadlineReached { last_failure }, Some(detail));
            }
        };

        turn.requests = turn.requests.saturating_add(1);
        let sent_bytes = bytes.len();
        let sent = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                turn.usage = turn.usage + dropped_usage(sent_bytes);
                return turn.finish(TurnEnd::Cancelled, None);
            }
            _ = sleep_until_opt(deadline) => {
                turn.usage = turn.usage + dropped_usage(sent_bytes);
                return turn.finish(
                    TurnEnd::DeadlineReached { last_failure },
                    Some("the attempt deadline passed while the request was in flight".into()),
                );
            }
            sent = transport.send(bytes) => sent,
        };

        let mut failed = match sent {
            Ok(mut outcome) => {
                outcome.usage = answered_usage(outcome.usage, &outcome);
                settle(reservation, &outcome.usage);
                turn.warnings
                    .extend(prompt_truncated(sent_bytes as u64, &outcome.usage));
                return turn.completed(outcome, permit, on_event);
            }
            Err(f) => f,
        };
        *failed.usage = billed_usage(&failed, sent_bytes);
        settle(reservation, &failed.usage);
        turn.usage = turn.usage + *failed.usage;
        let now_ms = ms_since_start(Instant::now());
        let decision = judge(limits, &turn.past, &failed, now_ms, deadline_ms);

        // Before this turn's own wait, so other senders hold from now on.
        let (reported, head) = throttle_report(&failed);
        give_back(permit, reported, &head, on_event);
        let (wait_ms, window) = match decision {
            ReplayDecision::Stop { reason } => {
                let detail = Some(failed.detail.clone());
                return turn.finish(
                    TurnEnd::Failed {
                        failure: failed,
                        stop: reason,
                    },
                    detail,
                );
            }
            ReplayDecision::Replay { wait_ms, window } => (wait_ms, window),
        };

        turn.replay(failed.failure, wait_ms, window, on_event);
        last_window = window;

        tokio::select! {
            biased;
            _ = cancel.cancelled() => return turn.finish(TurnEnd::Cancelled, None),
            _ = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
        }
        last_failure = Some(failed);
        attempt = attempt.saturating_add(1);
    }
}

/// The replay policy's decision on a failed send. The policy already refuses to replay a
/// published stream (REP-14); the driver holds the line too, because replaying one would show
/// the user an answer twice.
fn judge(
    limits: &ReplayLimits,
    past: &[PastReplay],
    failed: &TransportFailure,
    now_ms: u64,
    deadline_ms: Option<u64>,
) -> ReplayDecision {
    let decision = decide(limits, past, &failed.failure, now_ms, deadline_ms);
    if failed.failure.content_published && matches!(decision, ReplayDecision::Replay { .. }) {
        return ReplayDecision::Stop {
            reason: StopReason::ContentPublished,
        };
    }
    decision
}

/// Why a request is not sent at all: a payload that changed, a cancel, or a deadline already
/// past. The end and its detail.
fn refuse_to_send(
    expected: PayloadDigest,
    bytes: &[u8],
    attempt: u32,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
    last_failure: &mut Option<TransportFailure>,
) -> Option<(TurnEnd, Option<String>)> {
    let actual = PayloadDigest::of(bytes);
    if actual != expected {
        return Some((
            TurnEnd::DigestMismatch { expected, actual },
            Some(format!(
                "request {attempt} of the turn would not send the same bytes as the first (digest {actual} instead of {expected}); nothing was sent"
            )),
        ));
    }
    if cancel.is_cancelled() {
        return Some((TurnEnd::Cancelled, None));
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Some((
            TurnEnd::DeadlineReached {
                last_failure: last_failure.take(),
            },
            Some("the attempt deadline passed before the request could be sent".into()),
        ));
    }
    None
}

/// Why the gate ended the turn instead of letting its request go.
enum GateRefusal {
    Cancelled,
    /// The deadline would pass first; the detail for the turn's end.
    Deadline(String),
}

/// Takes the throttle's permit for `request` when there is a gate, counting the time held on
/// the turn and telling the caller of a hold. A throttle that cannot be used lets the request
/// go without a permit.
async fn pass_gate(
    gate: Option<Gate<'_>>,
    request: &Request,
    cancel: &CancellationToken,
    deadline: Option<Instant>,
    turn: &mut Turn,
    on_event: &mut (dyn FnMut(DriverEvent<'_>) + Send),
) -> Result<Option<Permit>, GateRefusal> {
    let Some(gate) = gate else { return Ok(None) };
    match gate
        .throttle
        .acquire_for(gate.provider, request, cancel, deadline)
        .await
    {
        Ok(permit) => {
            turn.held(permit.held_ms());
            if let Some(reason) = permit.held_for() {
                on_event(DriverEvent::Held {
                    held_ms: permit.held_ms(),
                    reason: Some(reason),
                });
            }
            Ok(Some(permit))
        }
        Err(AcquireError::Cancelled { held_ms }) => {
            turn.held(held_ms);
            Err(GateRefusal::Cancelled)
        }
        Err(AcquireError::Deadline { held_ms, reason }) => {
            turn.held(held_ms);
            Err(GateRefusal::Deadline(format!(
                "the provider throttle ({}) would not let the request go before the attempt deadline; it was not sent",
                reason.as_str()
            )))
        }
        // Fail open: a broken shared file must not turn into a provider failure or a replay;
        // the operator is told and the request goes as it would without one.
        Err(AcquireError::Store(e)) => {
            on_event(DriverEvent::ThrottleUnavailable(&e.to_string()));
            Ok(None)
        }
    }
}

/// What the throttle is told of a failed send: a refusal only for a rate limit (only the
/// provider's own ask holds the other senders; this request's backoff is its own and is not
/// reported), with the head carrying the Retry-After the policy judged by (the head's own, or
/// one a recognised gateway relayed), so both layers hear the same ask.
fn throttle_report(failed: &TransportFailure) -> (ThrottleOutcome, docsfab_throttle::RateHeaders) {
    let rate_limited = failed.failure.http_status == Some(429)
        || failed.failure.class == ProviderErrorClass::RateLimit;
    let reported = if rate_limited {
        ThrottleOutcome::RateLimited
    } else {
        ThrottleOutcome::Failed
    };
    let mut head = failed.body.rate_headers.clone();
    head.retry_after_ms = head.retry_after_ms.or(failed.failure.retry_after_ms);
    (reported, head)
}

/// The running account of a turn.
struct Turn {
    started: Instant,
    expected: PayloadDigest,
    replays: Vec<ReplayEntry>,
    past: Vec<PastReplay>,
    requests: u32,
    usage: Usage,
    held_ms: u64,
    warnings: Vec<TurnWarning>,
}

impl Turn {
    /// Counts a hold of the request about to go: the turn's total, and the replay's own.
    /// Records a replay of the failed send: its entry (told to the caller) and the failure the
    /// policy judges the next one by.
    fn replay(
        &mut self,
        f: ProviderFailure,
        wait_ms: u64,
        window: Window,
        on_event: &mut (dyn FnMut(DriverEvent<'_>) + Send),
    ) {
        let entry = ReplayEntry {
            cause: match f.http_status {
                Some(s) => ReplayCause::Status(s),
                None => ReplayCause::Fault(f.fault),
            },
            provider_error_class: f.class,
            wait_ms,
            retry_after_ms: f.retry_after_ms,
            window,
            held_ms: 0,
        };
        self.replays.push(entry);
        self.past.push(PastReplay {
            failure: f,
            wait_ms,
        });
        on_event(DriverEvent::Replay(&entry));
    }

    /// How long the gate may hold the next send: for the turn's first, what the gate says
    /// (a step retry's transport ceiling less its wait), else the replay policy's ceilings less
    /// the wait already made.
    fn patience(&self, gate: Option<Gate<'_>>, limits: &ReplayLimits, window: Window) -> Duration {
        let first = match self.replays.last() {
            None => gate.and_then(|g| g.first_patience),
            Some(_) => None,
        };
        first.unwrap_or_else(|| Duration::from_millis(self.replay_patience_ms(limits, window)))
    }

    /// The turn's answer came: the throttle hears its usage and head, and the turn ends.
    fn completed(
        mut self,
        outcome: StreamOutcome,
        permit: Option<Permit>,
        on_event: &mut (dyn FnMut(DriverEvent<'_>) + Send),
    ) -> TurnResult {
        self.usage = self.usage + outcome.usage;
        let reported = ThrottleOutcome::Success {
            input_tokens: outcome.usage.input_tokens,
            output_tokens: outcome.usage.output_tokens,
        };
        give_back(permit, reported, &outcome.rate_headers, on_event);
        self.finish(TurnEnd::Completed(outcome), None)
    }

    fn new(started: Instant, expected: PayloadDigest) -> Turn {
        Turn {
            started,
            expected,
            replays: Vec::new(),
            past: Vec::new(),
            requests: 0,
            usage: Usage::ZERO,
            held_ms: 0,
            warnings: Vec::new(),
        }
    }

    fn held(&mut self, held_ms: u64) {
        self.held_ms = self.held_ms.saturating_add(held_ms);
        if let Some(last) = self.replays.last_mut() {
            last.held_ms = last.held_ms.saturating_add(held_ms);
        }
    }

    /// How long the throttle may hold the next send: what the policy's ceilings leave of the
    /// wait before it. For a replay, the per-wait ceiling less the wait the policy chose, and
    /// what is left of the judging window's summed wait (waits and holds of the turn so far);
    /// for a first send, the per-wait ceiling.
    fn replay_patience_ms(&self, limits: &ReplayLimits, window: Window) -> u64 {
        let Some(last) = self.replays.last() else {
            return limits.max_delay_ms;
        };
        let spent = self.replays.iter().fold(0u64, |sum, r| {
            sum.saturating_add(r.wait_ms).saturating_add(r.held_ms)
        });
        let per_wait = limits.max_delay_ms.saturating_sub(last.wait_ms);
        let total = limits.max_total_delay(window).saturating_sub(spent);
        per_wait.min(total)
    }

    fn finish(self, end: TurnEnd, detail: Option<String>) -> TurnResult {
        let (status, kind, failure, stop_reason) = match &end {
            TurnEnd::Completed(_) => (TurnStatus::Completed, EndKind::Completed, None, None),
            TurnEnd::Failed { failure, stop } => (
                TurnStatus::Failed,
                EndKind::ProviderFailure,
                Some(failure.failure),
                Some(*stop),
            ),
            TurnEnd::DeadlineReached { last_failure } => (
                TurnStatus::Failed,
                EndKind::Deadline,
                last_failure.as_ref().map(|f| f.failure),
                None,
            ),
            TurnEnd::DigestMismatch { .. } => {
                (TurnStatus::Failed, EndKind::DigestMismatch, None, None)
            }
            TurnEnd::BudgetExhausted(_) => {
                (TurnStatus::Failed, EndKind::BudgetExhausted, None, None)
            }
            TurnEnd::Cancelled => (TurnStatus::Cancelled, EndKind::Cancelled, None, None),
        };
        let record = TurnAccount {
            status,
            end: kind,
            provider_retries: u32::try_from(self.replays.len()).unwrap_or(u32::MAX),
            replays: self.replays,
            requests: self.requests,
            payload_digest: self.expected.to_hex(),
            failure,
            stop_reason,
            detail,
            usage: self.usage,
            held_ms: self.held_ms,
            duration_ms: duration_ms(self.started.elapsed()),
            warnings: self.warnings,
        };
        TurnResult { end, record }
    }
}

/// Returns the permit with how the request went. A store error changes nothing about the turn.
fn give_back(
    permit: Option<Permit>,
    outcome: ThrottleOutcome,
    headers: &docsfab_throttle::RateHeaders,
    on_event: &mut (dyn FnMut(DriverEvent<'_>) + Send),
) {
    if let Some(permit) = permit
        && let Err(e) = permit.finish(outcome, headers)
    {
        on_event(DriverEvent::ThrottleUnavailable(&e.to_string()));
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Reserves the request's worst case when the run has a budget.
fn reserve(spend: Option<Spend<'_>>, bytes: usize) -> Result<Option<Reservation>, Exhausted> {
    let Some(s) = spend else { return Ok(None) };
    s.budget
        .reserve(worst_prompt_tokens(bytes), s.max_output_tokens)
        .map(Some)
}

fn settle(reservation: Option<Reservation>, usage: &Usage) {
    if let Some(r) = reservation {
        r.settle(usage);
    }
}

/// Output tokens estimated from answer bytes: the same four bytes a token as the prompt's.
fn estimated_output_tokens(answer_bytes: u64) -> u64 {
    answer_bytes / 4
}

/// A finished answer's usage: as reported, with a missing output count estimated from the
/// answer's bytes when the input was reported. An answer that reported nothing stays unknown:
/// the stream ended as it should, so there is nothing to say it was cut short of its usage.
fn answered_usage(reported: Usage, outcome: &StreamOutcome) -> Usage {
    if reported.input_tokens.is_none() || reported.output_tokens.is_some() {
        return reported;
    }
    let bytes: usize = outcome.text.len()
        + outcome
            .tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len())
            .sum::<usize>();
    Usage {
        output_tokens: Some(estimated_output_tokens(bytes as u64)),
        estimated: true,
        ..reported
    }
}

/// What a failed request is counted as having cost. A refusal with an error status before any
/// stream is not billed by the providers (0). Anything else that was sent (a cut stream, an
/// error event, no answer at all) keeps what the provider reported and estimates the rest: the
/// prompt from the bytes sent, the output from the answer bytes that arrived, marked
/// `estimated`. docsfab cannot know whether such a request was processed, so it counts it as
/// if it was.
fn billed_usage(failed: &TransportFailure, sent_bytes: usize) -> Usage {
    let reported = *failed.usage;
    if failed.failure.http_status.is_some_and(|s| s != 200) && !reported.is_known() {
        return Usage::ZERO;
    }
    if reported.is_known() {
        return reported;
    }
    Usage {
        input_tokens: Some(
            reported
                .input_tokens
                .unwrap_or_else(|| estimated_prompt_tokens_len(sent_bytes)),
        ),
        output_tokens: Some(
            reported
                .output_tokens
                .unwrap_or_else(|| estimated_output_tokens(failed.answer_bytes)),
        ),
        estimated: true,
        ..reported
    }
}

/// What a request dropped in flight (the attempt deadline, a cancel) is counted as: it was
/// sent, so it may be billed, but what had arrived of its answer is dropped with it. Its prompt
/// is estimated from the bytes sent and its output stays unknown, so the turn's usage is
/// unknown, never 0. (The run budget keeps the request's worst case as spent.)
fn dropped_usage(sent_bytes: usize) -> Usage {
    Usage {
        input_tokens: Some(estimated_prompt_tokens_len(sent_bytes)),
        output_tokens: None,
        estimated: true,
        ..Usage::ZERO
    }
}

fn estimated_prompt_tokens_len(len: usize) -> u64 {
    (len as u64 / 4).max(1)
}

/// A request's prompt tokens, estimated from the bytes it sends (about four bytes a token, the
/// usual rule for English text and JSON); the throttle learns the provider's own ratio from the
/// answers' usage.
fn estimated_prompt_tokens(bytes: &[u8]) -> u64 {
    estimated_prompt_tokens_len(bytes.len())
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
