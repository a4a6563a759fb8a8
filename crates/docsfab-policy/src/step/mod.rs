//! The step retry decision (STP-*): after an attempt of a step fails, retry it (from which
//! budget, after how long, with what correction) or end the step (and how the failure reads).
//!
//! Three kinds of budget pay for retries:
//! - the contract budget (`retry.maxRetries`) pays for every retry after an attempt whose answer
//!   the step judged (a contract failure or a condition such as a cut answer);
//! - the condition budgets (cut answer, attempt deadline, no progress) bound how many of those
//!   contract retries one condition may take, always inside `retry.maxRetries`;
//! - the transport budget pays for retries after attempts that delivered nothing to judge (a
//!   retryable provider class, or refused-before-send text the rules send to transport).
//!
//! The budgets never share a count, so a step makes at most `1 + maxRetries +
//! maxTransportRetries` attempts (CFG-3).
//!
//! [`decide`] is pure. The caller keeps the step's history as the [`PastAttempt`]s built from the
//! [`ScheduledRetry`] of each earlier decision.
//!
//! This file holds the budgets and the decision; `attempt` is what the policy is told about a
//! failed attempt (why it failed and, for a write step, what the host proved of its writes), and
//! `facts` how a failure reads in the record: its category, class, code, message and remedy.

mod attempt;
mod facts;

use docsfab_record::{Budget, RecordedSettlement, RetryDecision, StepFailure, TimeoutKind};
use serde::{Deserialize, Serialize};

pub use self::attempt::{
    AttemptFailure, BUDGET_EXHAUSTED, StepAccess, ValidatorRefusal, WriteSettlement,
};
use self::facts::{Facts, declined_failure};
use crate::replay::exponential_ms;
use crate::rules::{Condition, Feedback, RuleAction, RulesTable};

/// The effective step retry limits (after catalog, host and environment resolution).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepBudgets {
    /// `retry.maxRetries`: contract-correction retries.
    pub max_retries: u32,
    /// `retry.maxTransportRetries`.
    pub max_transport_retries: u32,
    /// `DOCSFAB_RETRY_BASE_DELAY_MS`: the base of the transport backoff.
    pub base_delay_ms: u64,
    /// `retry.transportMaxDelayMs`: the cap on one transport wait.
    pub transport_max_delay_ms: u64,
    /// `retry.transportMaxElapsedMs`: transport-failed attempts plus their waits.
    pub transport_max_elapsed_ms: u64,
    /// `DOCSFAB_READ_ONLY_MAX_CUT_ANSWER_RETRIES`.
    pub cut_answer_retries: u32,
    /// `DOCSFAB_READ_ONLY_MAX_TIMEOUT_RETRIES` (host attempt deadline only).
    pub timeout_retries: u32,
    /// `DOCSFAB_READ_ONLY_MAX_NO_PROGRESS_RETRIES`.
    pub no_progress_retries: u32,
}

impl Default for StepBudgets {
    /// The catalog defaults.
    fn default() -> Self {
        StepBudgets {
            max_retries: 3,
            max_transport_retries: 6,
            base_delay_ms: 1_000,
            transport_max_delay_ms: 60_000,
            transport_max_elapsed_ms: 3_600_000,
            cut_answer_retries: 1,
            timeout_retries: 1,
            no_progress_retries: 1,
        }
    }
}

impl StepBudgets {
    /// The most attempts one step can make (CFG-3).
    pub fn max_attempts(&self) -> u64 {
        1 + u64::from(self.max_retries) + u64::from(self.max_transport_retries)
    }

    /// The wait before transport retry `k` (1-based): exponential from the base, lengthened to
    /// the failure's Retry-After when it has one, capped at `transport_max_delay_ms` either way.
    pub fn transport_wait(&self, k: u32, retry_after_ms: Option<u64>) -> u64 {
        exponential_ms(self.base_delay_ms, k)
            .max(retry_after_ms.unwrap_or(0))
            .min(self.transport_max_delay_ms)
    }

    /// Every transport wait the budget allows when attempts fail instantly and send no
    /// Retry-After: with the defaults 1,000, 2,000, 4,000, 8,000, 16,000 and 32,000 ms.
    #[cfg(any(test, feature = "testing"))]
    pub fn transport_schedule(&self) -> Vec<u64> {
        (1..=self.max_transport_retries)
            .map(|k| self.transport_wait(k, None))
            .collect()
    }

    /// A condition's budget, never above `max_retries` (STP-13, CFG-7).
    fn condition_budget(&self, condition: Condition) -> Option<u32> {
        let own = match condition {
            Condition::CutAnswer => self.cut_answer_retries,
            Condition::AttemptDeadline => self.timeout_retries,
            Condition::NoProgress => self.no_progress_retries,
            _ => return None,
        };
        Some(own.min(self.max_retries))
    }
}

/// A retry the step scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledRetry {
    /// The budget that pays for the next attempt: `contract` (`retry.maxRetries`, with the
    /// condition budgets inside it) or `transport` (`retry.maxTransportRetries`, with its delay
    /// and elapsed bounds); never `initial`, which pays only for a step's first attempt.
    pub budget: Budget,
    /// The condition budget the retry also spends, if any.
    pub condition: Option<Condition>,
    /// The correction the next attempt carries (STP-5: carried across transport retries).
    pub feedback: Option<Feedback>,
    /// The wait before the next attempt.
    pub wait_ms: u64,
}

/// An earlier attempt of the step: how long it ran and the retry scheduled after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PastAttempt {
    /// How long the attempt ran; transport-failed attempts count toward the elapsed bound.
    pub duration_ms: u64,
    /// The retry decided after it.
    pub retry: ScheduledRetry,
}

/// How a step ends without another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ending {
    /// The rules allowed a retry but a budget bound refused it.
    Exhausted,
    /// The rules never retry this failure.
    Terminal,
    /// A write step's retry, refused because its writes could not be proven away or undone.
    Declined,
    /// The caller cancelled: nothing was decided, so the record's `retryDecision` is `none`.
    Cancelled,
}

/// The decision about a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum StepDecision {
    /// Make another attempt, as scheduled, under the rule with id `rule`.
    Retry {
        rule: String,
        retry: ScheduledRetry,
        timeout_kind: Option<TimeoutKind>,
    },
    /// End the step with `failure`, under the rule with id `rule`.
    End {
        ending: Ending,
        rule: String,
        failure: StepFailure,
        timeout_kind: Option<TimeoutKind>,
    },
}

impl StepDecision {
    /// `retryDecision`.
    pub fn retry_decision(&self) -> RetryDecision {
        match self {
            StepDecision::Retry { .. } => RetryDecision::Scheduled,
            StepDecision::End { ending, .. } => match ending {
                Ending::Exhausted => RetryDecision::Exhausted,
                Ending::Terminal => RetryDecision::Terminal,
                Ending::Declined => RetryDecision::Declined,
                Ending::Cancelled => RetryDecision::None,
            },
        }
    }

    /// `retryScheduled`.
    pub fn retry_scheduled(&self) -> bool {
        matches!(self, StepDecision::Retry { .. })
    }

    /// `retryRule`: the rule that decided.
    pub fn retry_rule(&self) -> &str {
        match self {
            StepDecision::Retry { rule, .. } | StepDecision::End { rule, .. } => rule,
        }
    }

    /// `waitMs`: the wait before the next attempt, when one follows.
    pub fn wait_ms(&self) -> Option<u64> {
        self.scheduled().map(|r| r.wait_ms)
    }

    /// The budget of the next attempt, when one follows.
    #[cfg(any(test, feature = "testing"))]
    pub fn next_budget(&self) -> Option<Budget> {
        self.scheduled().map(|r| r.budget)
    }

    /// The feedback for the next attempt, when one follows.
    pub fn feedback(&self) -> Option<Feedback> {
        self.scheduled().and_then(|r| r.feedback)
    }

    /// The retry scheduled, when one follows.
    pub fn scheduled(&self) -> Option<&ScheduledRetry> {
        match self {
            StepDecision::Retry { retry, .. } => Some(retry),
            StepDecision::End { .. } => None,
        }
    }

    /// The failure that ends the step, when it ends.
    pub fn failure(&self) -> Option<&StepFailure> {
        match self {
            StepDecision::Retry { .. } => None,
            StepDecision::End { failure, .. } => Some(failure),
        }
    }

    /// `timeoutKind`.
    pub fn timeout_kind(&self) -> Option<TimeoutKind> {
        match self {
            StepDecision::Retry { timeout_kind, .. } | StepDecision::End { timeout_kind, .. } => {
                *timeout_kind
            }
        }
    }
}

/// The budget paying for the attempt after `past`: `initial` for the first attempt, else the
/// budget of the retry scheduled before it.
pub fn current_budget(past: &[PastAttempt]) -> Budget {
    past.last().map_or(Budget::Initial, |p| p.retry.budget)
}

/// The feedback the attempt after `past` carries: that of the retry scheduled before it.
pub fn current_feedback(past: &[PastAttempt]) -> Option<Feedback> {
    past.last().and_then(|p| p.retry.feedback)
}

/// Decides the failed attempt `past.len() + 1` of a step that ran for `duration_ms`.
///
/// Order: the provider class first (STP-3), then the condition or the refused-before-send text
/// (STP-4), through the rules table (STP-8); then the write settlement of a write step (STP-1,
/// WRT-1/2); then the budget that would pay.
///
/// The transport elapsed bound (STP-6) sums the durations of the step's transport-failed
/// attempts, this one included, and the waits scheduled after them. A retry is refused when that
/// sum plus the next wait would exceed the bound; so the bound can only be crossed while an
/// attempt runs, and that attempt still finishes.
pub fn decide(
    table: &RulesTable,
    budgets: &StepBudgets,
    access: StepAccess,
    past: &[PastAttempt],
    failure: &AttemptFailure,
    duration_ms: u64,
) -> StepDecision {
    let timeout_kind = failure.timeout_kind();
    let facts = Facts::of(failure);
    let ruling = Ruling::of(table, failure);
    let end = |ending: Ending, rule: String, failure: StepFailure| StepDecision::End {
        ending,
        rule,
        failure,
        timeout_kind,
    };

    // 1. What the rules say, before any budget; 2. what a write step's settlement allows.
    if let Some((ending, rule, failure)) =
        refused_before_budget(table, access, failure, &ruling, &facts)
    {
        return end(ending, rule, failure);
    }

    // 3. The budget.
    let retry = match ruling.action {
        RuleAction::Transport => transport_retry(budgets, past, failure, duration_ms),
        // Terminal was refused above; what remains is a contract retry.
        RuleAction::Contract | RuleAction::Terminal => contract_retry(budgets, past, &ruling),
    };
    match retry {
        Ok(retry) => StepDecision::Retry {
            rule: ruling.rule,
            retry,
            timeout_kind,
        },
        Err(bound) => end(Ending::Exhausted, ruling.rule, facts.failure(Some(bound))),
    }
}

/// The failure of an attempt as it stands, before any decision: its category, class, code,
/// message and remediation. The record of an attempt that is retried still names its failure;
/// this is where those fields come from (the decision's own failure wins when the step ends).
pub fn failure_facts(failure: &AttemptFailure) -> StepFailure {
    Facts::of(failure).failure(None)
}

/// What a write step's driver must do with a failed attempt, asked once with what the host
/// proved about its writes (WRT-1..3): either the decision is final, or the attempt's writes
/// must be restored first and [`PendingRestore::after_restore`] gives the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritePlan {
    /// No restore is needed: record `settlement` and act on `decision`.
    Decided(WriteDecision),
    /// Restore the attempt's writes (and verify the restore), then ask
    /// [`PendingRestore::after_restore`] with whether it held.
    RestoreFirst(PendingRestore),
}

/// A write step's final decision with the settlement its attempt records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteDecision {
    pub settlement: WriteSettlement,
    pub decision: StepDecision,
}

/// The second phase of a write step's decision: waiting for the restore's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRestore {
    restored: StepDecision,
    restore_failed: StepDecision,
}

impl PendingRestore {
    /// The decision once the restore ran: as planned when it held, otherwise the step is decided
    /// as `restore-failed` (a retry is declined; a cancelled step still ends cancelled).
    pub fn after_restore(self, restore_held: bool) -> WriteDecision {
        if restore_held {
            WriteDecision {
                settlement: WriteSettlement::WriteExecutedAndRestored,
                decision: self.restored,
            }
        } else {
            WriteDecision {
                settlement: WriteSettlement::RestoreFailed,
                decision: self.restore_failed,
            }
        }
    }
}

/// Phase one of a write step's decision (WRT-1..3). `proven` is what the host proved about the
/// failed attempt's writes before any restore. A write that ran is decided as if restored, and
/// restored only when that decision retries, or when the attempt was cancelled (a cancelled
/// run leaves the workspace as it found it).
pub fn decide_write(
    table: &RulesTable,
    budgets: &StepBudgets,
    past: &[PastAttempt],
    failure: &AttemptFailure,
    duration_ms: u64,
    proven: RecordedSettlement,
) -> WritePlan {
    let decide_as = |settlement| {
        decide(
            table,
            budgets,
            StepAccess::Write(settlement),
            past,
            failure,
            duration_ms,
        )
    };
    let settlement = match proven {
        RecordedSettlement::NoWrite => WriteSettlement::NoWrite,
        RecordedSettlement::Unavailable => WriteSettlement::Unavailable,
        RecordedSettlement::WriteExecuted => WriteSettlement::WriteExecutedAndRestored,
    };
    let decision = decide_as(settlement);
    let cancelled = matches!(failure, AttemptFailure::Cancelled);
    if proven != RecordedSettlement::WriteExecuted || !(decision.retry_scheduled() || cancelled) {
        return WritePlan::Decided(WriteDecision {
            settlement,
            decision,
        });
    }
    WritePlan::RestoreFirst(PendingRestore {
        restored: decision,
        restore_failed: decide_as(WriteSettlement::RestoreFailed),
    })
}

/// What the rules table says about a failure, before any budget or settlement.
struct Ruling {
    rule: String,
    action: RuleAction,
    feedback: Option<Feedback>,
    condition: Option<Condition>,
}

impl Ruling {
    fn of(table: &RulesTable, failure: &AttemptFailure) -> Ruling {
        let ruling = |rule: &str, action, feedback, condition| Ruling {
            rule: rule.to_string(),
            action,
            feedback,
            condition,
        };
        match failure {
            AttemptFailure::Provider { failure: f } => {
                let r = table.class_rule(f);
                // The class policy is the floor: a table validated against it agrees, and a
                // head status that is not repeatable keeps even a transient class terminal.
                let action = if r.action == RuleAction::Transport && !f.is_transport_retryable() {
                    RuleAction::Terminal
                } else {
                    r.action
                };
                ruling(r.id, action, None, None)
            }
            AttemptFailure::RefusedBeforeSend { error_text } => {
                let (id, action) = table.text_rule(error_text);
                ruling(id, action, None, None)
            }
            AttemptFailure::BudgetExhausted { .. } => {
                ruling(BUDGET_EXHAUSTED, RuleAction::Terminal, None, None)
            }
            _ => match failure.condition() {
                Some(c) => {
                    let r = table.condition_rule(c);
                    ruling(&r.id, r.action, r.feedback, Some(c))
                }
                None => ruling(&table.default_rule().id, RuleAction::Terminal, None, None),
            },
        }
    }
}

/// The ending when the step stops before any budget is asked: a cancelled attempt, a terminal
/// rule, or a write step whose failure or settlement allows no retry (STP-1, WRT-2).
fn refused_before_budget(
    table: &RulesTable,
    access: StepAccess,
    failure: &AttemptFailure,
    ruling: &Ruling,
    facts: &Facts,
) -> Option<(Ending, String, StepFailure)> {
    if matches!(failure, AttemptFailure::Cancelled) {
        return Some((Ending::Cancelled, ruling.rule.clone(), facts.failure(None)));
    }
    if ruling.action == RuleAction::Terminal {
        return Some((Ending::Terminal, ruling.rule.clone(), facts.failure(None)));
    }
    let StepAccess::Write(settlement) = access else {
        return None;
    };
    if ruling.action != RuleAction::Transport {
        let rule = table.write_rules().single_attempt.clone();
        return Some((Ending::Terminal, rule, facts.failure(None)));
    }
    if !settlement.permits_retry() {
        let rule = table.write_rules().declined.clone();
        return Some((Ending::Declined, rule, declined_failure(facts, settlement)));
    }
    None
}

/// A transport retry, or the sentence of the bound that refuses it (STP-6, STP-15).
fn transport_retry(
    budgets: &StepBudgets,
    past: &[PastAttempt],
    failure: &AttemptFailure,
    duration_ms: u64,
) -> Result<ScheduledRetry, String> {
    let used = count(past, |r| r.budget == Budget::Transport);
    let k = used.saturating_add(1);
    if k > budgets.max_transport_retries {
        return Err(format!(
            "retry-max-transport-retries-bound: {k} exceeds retry.maxTransportRetries = {} count.",
            budgets.max_transport_retries
        ));
    }
    let retry_after = match failure {
        // STP-15: only a Retry-After recorded with the response's HTTP status counts.
        AttemptFailure::Provider { failure: f } if f.http_status.is_some() => f.retry_after_ms,
        _ => None,
    };
    let wait = budgets.transport_wait(k, retry_after);
    let elapsed = past
        .iter()
        .filter(|p| p.retry.budget == Budget::Transport)
        .fold(duration_ms, |sum, p| {
            sum.saturating_add(p.duration_ms)
                .saturating_add(p.retry.wait_ms)
        });
    let with_wait = elapsed.saturating_add(wait);
    if with_wait > budgets.transport_max_elapsed_ms {
        return Err(format!(
            "retry-transport-max-elapsed-bound: {with_wait} exceeds retry.transportMaxElapsedMs = {} ms.",
            budgets.transport_max_elapsed_ms
        ));
    }
    Ok(ScheduledRetry {
        budget: Budget::Transport,
        condition: None,
        feedback: carried_feedback(past),
        wait_ms: wait,
    })
}

/// A contract retry, or the sentence of the bound that refuses it: `retry.maxRetries`, then the
/// condition's own budget inside it (STP-13).
fn contract_retry(
    budgets: &StepBudgets,
    past: &[PastAttempt],
    ruling: &Ruling,
) -> Result<ScheduledRetry, String> {
    let used = count(past, |r| r.budget == Budget::Contract);
    let n = used.saturating_add(1);
    if n > budgets.max_retries {
        return Err(format!(
            "retry-max-retries-bound: {n} exceeds retry.maxRetries = {} count.",
            budgets.max_retries
        ));
    }
    let condition = ruling.condition;
    if let Some(c) = condition
        && let Some(limit) = budgets.condition_budget(c)
        && let Some((name, key)) = condition_bound(c)
    {
        let m = count(past, |r| r.condition == Some(c)).saturating_add(1);
        if m > limit {
            return Err(format!("{name}: {m} exceeds {key} = {limit} count."));
        }
    }
    Ok(ScheduledRetry {
        budget: Budget::Contract,
        condition,
        feedback: ruling.feedback,
        wait_ms: 0,
    })
}

fn count(past: &[PastAttempt], pred: impl Fn(&ScheduledRetry) -> bool) -> u32 {
    let n = past.iter().filter(|p| pred(&p.retry)).count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The feedback the last judged attempt earned (STP-5): the feedback of the latest contract
/// retry, which every later transport retry carries on.
fn carried_feedback(past: &[PastAttempt]) -> Option<Feedback> {
    past.iter()
        .rev()
        .find(|p| p.retry.budget == Budget::Contract)
        .and_then(|p| p.retry.feedback)
}

/// The bound name and catalog key a condition budget reports when it refuses; `None` for
/// conditions that have no budget of their own.
fn condition_bound(c: Condition) -> Option<(&'static str, &'static str)> {
    match c {
        Condition::CutAnswer => Some((
            "retry-max-cut-answer-retries-bound",
            "retry.maxCutAnswerRetries",
        )),
        Condition::AttemptDeadline => {
            Some(("retry-max-timeout-retries-bound", "retry.maxTimeoutRetries"))
        }
        Condition::NoProgress => Some((
            "retry-max-no-progress-retries-bound",
            "retry.maxNoProgressRetries",
        )),
        _ => None,
    }
}
