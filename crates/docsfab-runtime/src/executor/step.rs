//! One step as it runs: its attempts, in order, and the step policy asked once per failed
//! attempt (for a write step, once before and once after its restore), each attempt committed
//! before the wait and the next attempt.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use docsfab_policy::rules::Feedback;
use docsfab_policy::step::{
    self, AttemptFailure, PastAttempt, StepAccess::ReadOnly, StepBudgets, StepDecision,
    WriteDecision, WritePlan, WriteSettlement as PolicySettlement,
};
use docsfab_provider::Gate;
use docsfab_record::{
    Access, AttemptRecord, AttemptStatus, Budget, Retry, RetryDecision, RunStatus, StepFailure,
    WriteRestore,
};
use tokio::time::Instant;

use super::config::RunError;
use super::ctx::{Ctx, emit_finished};
use crate::agent::{self, Answer, AttemptInput, AttemptReport, AttemptSpend, TurnEvent};
use crate::batch::{BeforeWrite, WriteVeto};
use crate::composition::{Step, Tool};
use crate::fanout::WriteClaims;
use crate::grounding::GroundingBasis;
use crate::progress::Progress;
use crate::settlement::settle_attempt;
use crate::snapshot::{RestoreError, WrittenFile};
use crate::store::{ResultBasis, StepEnd, StepLog};

/// Runs a step the store has begun as `step_index`: its attempts, to its end. `claims` is set
/// for an instance of a fan-out step, whose writes must not touch a sibling's paths.
pub(super) async fn run_begun_step(
    ctx: &Ctx<'_>,
    store: &mut (dyn StepLog + Send),
    step: &Step,
    step_index: u32,
    instructions: String,
    claims: Option<&WriteClaims>,
) -> Result<(RunStatus, Option<String>), RunError> {
    ctx.emit(Progress::StepStarted {
        step_id: step.id.clone(),
        access: step.access,
    });
    let run = StepRun {
        ctx,
        step,
        step_index,
        budgets: ctx.cfg.limits.step_budgets(),
        fingerprint: ctx.fingerprint(step, &instructions),
        instructions,
        model: ctx.model.to_owned(),
        claims,
        grounding: grounding_basis(ctx, step),
    };
    // The unknown names of the last ungrounded answer, for the correction that follows it.
    let mut grounding_correction: Option<String> = None;
    let mut past: Vec<PastAttempt> = Vec::new();
    // What is left of the step retry's wait ceiling once its own wait is over: the most the
    // throttle may hold the retry's first request (the policy decides how long, the throttle
    // only when). `None` for the first attempt.
    let mut first_patience: Option<Duration> = None;

    // Every way out of the loop ends the step: its end goes to the store once, below.
    let (end, output_text) = loop {
        let attempt_no = u32::try_from(past.len() + 1).unwrap_or(u32::MAX);
        let budget = step::current_budget(&past);
        ctx.emit(Progress::AttemptStarted {
            step_id: step.id.clone(),
            attempt: attempt_no,
            budget,
        });
        let report = run
            .attempt(
                store,
                attempt_no,
                step::current_feedback(&past),
                first_patience,
                grounding_correction.as_deref(),
            )
            .await;
        // A retry's wait counts from here: recording the attempt (a durable commit) and
        // deciding take time that is part of the wait, not added to it, so the gap on the wire
        // is the recorded waitMs.
        let ended = Instant::now();

        let failure = match &report.result {
            Ok(answer) => {
                let record = attempt_record(attempt_no, budget, &report, None, None);
                let files = ctx.kept_contents(&report);
                store.record_attempt_with_files(ctx.run_id, step_index, &record, &files)?;
                emit_finished(ctx, step, &record);
                let basis = ResultBasis {
                    fingerprint: run.fingerprint.clone(),
                    inputs: report.inputs.clone(),
                    reused_from: None,
                    files_written: None,
                };
                break (succeeded(answer, basis), Some(answer.as_output_text()));
            }
            Err(f) => f.clone(),
        };
        grounding_correction = next_correction(grounding_correction, &failure, &report);

        let (record, decision) = run.decide(&past, &failure, &report, attempt_no, budget);
        // Durable before anything else happens (the next attempt, or the step's end).
        store.record_attempt_with_files(ctx.run_id, step_index, &record, &[])?;
        emit_finished(ctx, step, &record);

        match decision {
            StepDecision::Retry { retry, .. } => {
                past.push(PastAttempt {
                    duration_ms: report.duration_ms,
                    retry,
                });
                if !backoff(ctx, step, attempt_no + 1, ended, retry.wait_ms).await {
                    break (ctx.cancelled_end(), None);
                }
                first_patience = Some(Duration::from_millis(
                    run.budgets
                        .transport_max_delay_ms
                        .saturating_sub(retry.wait_ms),
                ));
            }
            StepDecision::End { failure: f, .. } => {
                let end = match failure {
                    AttemptFailure::Cancelled => ctx.cancelled_end(),
                    _ => failed(naming_unknowns(f, &report)),
                };
                break (end, None);
            }
        }
    };
    store.finish_step(ctx.run_id, step_index, &end)?;
    Ok((end.status, output_text))
}

/// What a step whose contract names members to ground is judged against: the workspace index
/// and the run's pages so far. The index is read once per step, and once for all the instances
/// of a fan-out step (`pages[0]`, `pages[1]`, ... share `pages`'s).
fn grounding_basis(ctx: &Ctx<'_>, step: &Step) -> Option<GroundingBasis> {
    step.contract.as_ref().filter(|c| !c.grounding.is_empty())?;
    let pages = ctx
        .pages
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let group = step.id.split('[').next().unwrap_or(&step.id);
    let mut cached = ctx.grounding.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((read_for, index)) = cached.as_ref()
        && read_for == group
    {
        let index = Arc::clone(index);
        return Some(GroundingBasis { index, pages });
    }
    let (index, _cut) =
        crate::grounding::index_workspace(ctx.workspace.root(), &Default::default());
    let index = Arc::new(index);
    *cached = Some((group.to_owned(), Arc::clone(&index)));
    Some(GroundingBasis { index, pages })
}

/// The grounding correction the next attempt carries: the unknown names of an ungrounded
/// answer; kept across attempts that were not judged (a transport fault), dropped when a
/// judged answer failed for another reason.
fn next_correction(
    previous: Option<String>,
    failure: &AttemptFailure,
    report: &AttemptReport,
) -> Option<String> {
    match failure {
        AttemptFailure::Contract {
            failure: docsfab_record::ContractFailure::Ungrounded,
        } => report.grounding.as_ref().map(crate::grounding::correction),
        AttemptFailure::Contract { .. } | AttemptFailure::CutAnswer => None,
        _ => previous,
    }
}

/// A step's end when an attempt's answer was accepted.
fn succeeded(answer: &Answer, basis: ResultBasis) -> StepEnd {
    StepEnd {
        status: RunStatus::Succeeded,
        failure: None,
        output: answer.record_output(),
        basis: Some(basis),
    }
}

/// A step's end when the policy ended it on `failure`.
/// A step that ended ungrounded says which names its last answer invented (the attempt's
/// message lists them), so the failure alone tells the operator what was wrong.
fn naming_unknowns(mut failure: StepFailure, report: &AttemptReport) -> StepFailure {
    if let (true, Some(why)) = (failure.code == "contract-ungrounded", &report.message) {
        failure.message = format!("{} In the last answer, {why}.", failure.message);
    }
    failure
}

fn failed(failure: StepFailure) -> StepEnd {
    StepEnd {
        status: RunStatus::Failed,
        failure: Some(failure),
        output: None,
        basis: None,
    }
}

/// One step as it runs: what every attempt of it shares.
struct StepRun<'c, 'a> {
    ctx: &'c Ctx<'a>,
    step: &'c Step,
    step_index: u32,
    budgets: StepBudgets,
    /// What the step is asked with, hashed (crate::reuse::fingerprint).
    fingerprint: String,
    /// The step's instructions with earlier outputs substituted.
    instructions: String,
    model: String,
    /// The paths of a fan-out step's instances, when this step is one of them.
    claims: Option<&'c WriteClaims>,
    /// What the step's answers are judged against when its contract asks for grounding
    /// (docs/grounding.md).
    grounding: Option<GroundingBasis>,
}

impl StepRun<'_, '_> {
    /// Runs attempt `attempt_no`, carrying `feedback` (with the unknown names of an ungrounded
    /// answer, `grounding_correction`), and reports its turns to progress. The throttle may
    /// hold its first request at most `first_patience` (see the caller).
    async fn attempt(
        &self,
        store: &mut (dyn StepLog + Send),
        attempt_no: u32,
        feedback: Option<Feedback>,
        first_patience: Option<Duration>,
        grounding_correction: Option<&str>,
    ) -> AttemptReport {
        let (ctx, step) = (self.ctx, self.step);
        let cfg = ctx.cfg;
        let step_id = step.id.clone();
        let sink = cfg.progress.clone();
        let observer = move |event: TurnEvent| {
            if let Some(sink) = &sink {
                sink(&Progress::Turn {
                    step_id: step_id.clone(),
                    attempt: attempt_no,
                    event,
                });
            }
        };
        // A write step commits each write's intent to the store before the write runs, so a
        // process killed mid-attempt still leaves an account of what it wrote.
        let shared = Mutex::new(store);
        let (run_id, step_index, claims) = (ctx.run_id, self.step_index, self.claims);
        let record_intent = |tool: Tool, path: &str| {
            // A sibling instance's path is refused to the model before any intent is kept.
            if let Some(claims) = claims {
                claims.claim(path, &step.id).map_err(WriteVeto::Refused)?;
            }
            shared
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record_write_intent(run_id, step_index, attempt_no, tool.name(), path)
                .map_err(|e| WriteVeto::Unrecorded(e.to_string()))
        };
        let before_write: Option<BeforeWrite<'_>> =
            (step.access == Access::Write).then_some(&record_intent);
        agent::run_attempt(AttemptInput {
            transport: ctx.transport,
            gate: cfg.throttle.as_ref().map(|throttle| Gate {
                throttle,
                provider: &cfg.provider.name,
                first_patience,
            }),
            api: cfg.provider.api,
            model: &self.model,
            step,
            limits: cfg.composition.limits,
            replay_limits: cfg.limits.replay_limits(),
            boundary: ctx.boundary.as_ref().map_err(String::as_str),
            instructions: &self.instructions,
            feedback,
            workspace: ctx.workspace,
            cancel: ctx.cancel,
            observer: &observer,
            before_write,
            spend: AttemptSpend {
                budget: ctx.budget.as_ref(),
                pricing: cfg.provider.spend.pricing,
                include_usage: cfg.provider.spend.include_usage,
                prompt_cache_key: cfg
                    .provider
                    .spend
                    .prompt_caching
                    .then(|| format!("docsfab/{}/{}", cfg.composition.name, step.id)),
            },
            structured_output: cfg.provider.structured_output,
            grounding: self.grounding.as_ref(),
            grounding_correction,
        })
        .await
    }

    /// Decides a failed attempt and builds its record. A write step first proves what it wrote;
    /// a retry that needs a restore only goes ahead once the restore is verified (WRT-1..3).
    fn decide(
        &self,
        past: &[PastAttempt],
        failure: &AttemptFailure,
        report: &AttemptReport,
        attempt_no: u32,
        budget: Budget,
    ) -> (AttemptRecord, StepDecision) {
        let provisional = attempt_record(attempt_no, budget, report, None, None);
        let AfterFailure {
            decision,
            settlement,
            restore,
            restore_error,
        } = self.decide_after_failure(past, failure, report, &provisional);
        // The step's ending failure when it ends, else the attempt's own failure as it stands.
        let facts = decision
            .failure()
            .cloned()
            .unwrap_or_else(|| step::failure_facts(failure));
        let decided = Decided {
            decision: &decision,
            failure,
            facts,
        };
        let mut record = attempt_record(attempt_no, budget, report, Some(decided), settlement);
        record.write_restore = restore;
        if let Some(e) = restore_error {
            // Say which file could not be put back, so the operator knows what to inspect.
            let why = format!("the workspace restore failed: {e}");
            record.message = Some(match record.message.take() {
                Some(m) => format!("{m}; {why}"),
                None => why,
            });
        }
        (record, decision)
    }

    /// Decides the failed attempt, asking the policy once per phase. For a write step the
    /// settlement is computed from the attempt's recorded turns and lease (every batch reconciled
    /// with the lease's counters, WRT-2); when the policy asks for a restore first (WRT-1), the
    /// restore runs and is verified, and the policy's second phase decides on its result.
    fn decide_after_failure(
        &self,
        past: &[PastAttempt],
        failure: &AttemptFailure,
        report: &AttemptReport,
        provisional: &AttemptRecord,
    ) -> AfterFailure {
        let (rules, budgets) = (&self.ctx.cfg.rules, &self.budgets);
        let duration_ms = report.duration_ms;
        if self.step.access == Access::ReadOnly {
            let decision = step::decide(rules, budgets, ReadOnly, past, failure, duration_ms);
            return AfterFailure::decided(decision, None);
        }
        let proven = settle_attempt(provisional).settlement;
        let pending = match step::decide_write(rules, budgets, past, failure, duration_ms, proven) {
            WritePlan::Decided(d) => return AfterFailure::decided(d.decision, Some(d.settlement)),
            WritePlan::RestoreFirst(pending) => pending,
        };
        let restored = report.snapshots.restore();
        let WriteDecision {
            settlement,
            decision,
        } = pending.after_restore(restored.is_ok());
        AfterFailure {
            decision,
            settlement: Some(settlement),
            restore: Some(if restored.is_ok() {
                WriteRestore::Restored
            } else {
                WriteRestore::RestoreFailed
            }),
            restore_error: restored.err(),
        }
    }
}

/// Waits until `wait_ms` after `from` (when the failed attempt ended) before the next attempt,
/// telling progress about once a second. Returns false when the run was cancelled during the
/// wait (the wait ends at once).
async fn backoff(
    ctx: &Ctx<'_>,
    step: &Step,
    next_attempt: u32,
    from: Instant,
    wait_ms: u64,
) -> bool {
    let end = from + Duration::from_millis(wait_ms);
    loop {
        if ctx.cancel.is_cancelled() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        let remaining = end - now;
        ctx.emit(Progress::Backoff {
            step_id: step.id.clone(),
            next_attempt,
            remaining_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX),
        });
        let tick = remaining.min(Duration::from_secs(1));
        tokio::select! {
            biased;
            _ = ctx.cancel.cancelled() => return false,
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

/// What was decided about a failed attempt, and what became of its writes.
struct AfterFailure {
    decision: StepDecision,
    settlement: Option<PolicySettlement>,
    /// Set when a restore of the attempt's writes ran.
    restore: Option<WriteRestore>,
    /// Why that restore failed.
    restore_error: Option<RestoreError>,
}

impl AfterFailure {
    fn decided(decision: StepDecision, settlement: Option<PolicySettlement>) -> AfterFailure {
        AfterFailure {
            decision,
            settlement,
            restore: None,
            restore_error: None,
        }
    }
}

/// What was decided about a failed attempt, for its record.
struct Decided<'a> {
    decision: &'a StepDecision,
    failure: &'a AttemptFailure,
    /// The attempt's failure facts (category, class, code).
    facts: StepFailure,
}

fn attempt_record(
    attempt: u32,
    budget: Budget,
    report: &AttemptReport,
    decided: Option<Decided<'_>>,
    settlement: Option<PolicySettlement>,
) -> AttemptRecord {
    let pf = report.provider_failure;
    let mut record = AttemptRecord {
        attempt,
        budget,
        status: AttemptStatus::Succeeded,
        started_at: report.started_at.clone(),
        provider_error_class: pf.map(|f| f.class),
        http_status: pf.and_then(|f| f.http_status),
        retry_after_ms: pf.and_then(|f| f.retry_after_ms),
        gateway: report.gateway.clone(),
        failure_category: None,
        failure_class: None,
        code: None,
        message: report.message.clone(),
        answer_excerpt: report.answer_excerpt.clone(),
        answer_bytes: report.answer_bytes,
        timeout_kind: None,
        output_constraint: report.output_constraint,
        grounding: report.grounding.clone(),
        retry_rule: None,
        retry: Retry {
            decision: RetryDecision::None,
        },
        wait_ms: None,
        write_settlement: None,
        write_restore: None,
        files_written: Some(report.written.iter().map(WrittenFile::record).collect()),
        usage: report.usage,
        cost_usd: report.cost_usd,
        duration_ms: report.duration_ms,
        lease: report.lease.clone(),
        turns: report.turns.clone(),
    };
    let Some(Decided {
        decision,
        failure,
        facts,
    }) = decided
    else {
        return record;
    };
    record.status = if matches!(failure, AttemptFailure::Cancelled) {
        AttemptStatus::Cancelled
    } else {
        AttemptStatus::Failed
    };
    record.retry = Retry {
        decision: decision.retry_decision(),
    };
    record.retry_rule = Some(decision.retry_rule().to_owned());
    record.wait_ms = decision.wait_ms();
    record.timeout_kind = decision.timeout_kind();
    record.write_settlement = settlement.map(PolicySettlement::recorded);
    record.failure_category = Some(facts.category);
    record.failure_class = Some(facts.failure_class);
    record.code = Some(facts.code);
    record
}
