//! What every step of a run shares ([`Ctx`]: the configuration, the workspace and transport,
//! the response boundary, the cancellation and the deadline, the run budget, what was carried
//! over, the grounding index and the pages answered so far), with the records every kind of step
//! begins and reports the same way.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use docsfab_boundary::BoundaryConfig;
use docsfab_provider::{RunBudget, Transport};
use docsfab_record::{AttemptRecord, RunStatus, StepFailure};
use tokio_util::sync::CancellationToken;

use super::config::{CancelReason, RunConfig, RunError};
use crate::agent::AttemptReport;
use crate::composition::Step;
use crate::progress::Progress;
use crate::reuse::{Asking, Looks, fingerprint};
use crate::snapshot::WrittenFile;
use crate::store::{ResultBasis, StepEnd, StepLog, StepStart};
use crate::workspace::Workspace;
use crate::written::{Kept, classify};

/// The run as each of its steps sees it.
pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a RunConfig,
    pub(super) model: &'a str,
    /// The reference steps already carried over into this run (each stands in once).
    pub(super) taken: Mutex<HashSet<usize>>,
    /// The steps whose answer text a later step inserts or fans out over.
    pub(super) text_needed: HashSet<String>,
    pub(super) workspace: &'a Workspace,
    pub(super) transport: &'a dyn Transport,
    pub(super) boundary: &'a Result<BoundaryConfig, String>,
    pub(super) cancel: &'a CancellationToken,
    pub(super) deadline_fired: &'a AtomicBool,
    pub(super) deadline_ms: u64,
    pub(super) run_id: &'a str,
    /// The run's token and cost budget, shared by every attempt and instance.
    pub(super) budget: Option<RunBudget>,
    /// The workspace's grounding index with the step it was read for (instances of one
    /// fan-out step share it: they are read-only, so the tree does not change between them).
    pub(super) grounding: Mutex<Option<(String, Arc<docsfab_grounding::Index>)>>,
    /// The paths of the pages earlier steps of this run answered: a later page may link them.
    pub(super) pages: Mutex<BTreeSet<String>>,
}

impl Ctx<'_> {
    /// The fingerprint of `step` asked with `instructions` in this run.
    pub(super) fn fingerprint(&self, step: &Step, instructions: &str) -> String {
        let asking = Asking {
            provider: &self.cfg.provider.name,
            api: self.cfg.provider.api,
            model: self.model,
        };
        fingerprint(step, instructions, &self.cfg.composition.limits, asking)
    }

    /// The reference step that can stand in for `step` of group `group` (asked with
    /// `fingerprint`), taken so no other step uses it; judged against the workspace as `looks`
    /// reads it.
    pub(super) fn reusable(
        &self,
        group: &str,
        fingerprint: &str,
        looks: &mut Looks,
    ) -> Option<usize> {
        let reference = &self.cfg.carry.as_ref()?.reference;
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        let at = reference.candidate(group, fingerprint, &taken)?;
        let step = reference.step(at);
        // An answer the record does not keep (a text answer) can stand in only where no later
        // step needs its text.
        if step.output.is_none() && self.text_needed.contains(group) {
            return None;
        }
        if !reference.changed(self.workspace, at, looks).is_empty() {
            return None;
        }
        taken.insert(at);
        Some(at)
    }

    /// Records begun step `step_index` as carried over from reference step `at`, and returns
    /// its output text as later steps see it.
    pub(super) fn carry_over(
        &self,
        store: &mut (dyn StepLog + Send),
        step: &Step,
        step_index: u32,
        at: usize,
    ) -> Result<(RunStatus, Option<String>), RunError> {
        let reference = &self
            .cfg
            .carry
            .as_ref()
            .expect("a carried step has a reference")
            .reference;
        let from = reference.step(at);
        let end = StepEnd {
            status: RunStatus::Succeeded,
            failure: None,
            output: from.output.clone(),
            basis: Some(ResultBasis {
                fingerprint: from.fingerprint.clone().unwrap_or_default(),
                inputs: from.inputs.clone().unwrap_or_default(),
                reused_from: Some(reference.origin(at)),
                files_written: Some(from.result_files().to_vec()),
            }),
        };
        store.finish_step(self.run_id, step_index, &end)?;
        self.emit(Progress::StepReused {
            step_id: step.id.clone(),
            from: reference.origin(at),
        });
        Ok((
            RunStatus::Succeeded,
            Some(
                from.output
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            ),
        ))
    }

    /// Notes the pages an accepted output holds, so later pages may link them.
    pub(super) fn note_pages(&self, output: &str) {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(output) else {
            return;
        };
        self.pages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(crate::grounding::page_paths(&value));
    }

    pub(super) fn emit(&self, p: Progress) {
        if let Some(sink) = &self.cfg.progress {
            sink(&p);
        }
    }

    pub(super) fn cancel_reason(&self) -> CancelReason {
        if self.deadline_fired.load(Ordering::SeqCst) {
            CancelReason::JobDeadline {
                deadline_ms: self.deadline_ms,
            }
        } else {
            CancelReason::Caller
        }
    }

    /// The files a succeeded attempt changed, each judged for the run store (written.rs).
    pub(super) fn kept_contents(&self, report: &AttemptReport) -> Vec<(WrittenFile, Kept)> {
        let default = docsfab_boundary::Redactor::default();
        let redactor = self.boundary.as_ref().map_or(&default, |b| b.redactor());
        report
            .written
            .iter()
            .map(|f| (f.clone(), classify(f, |t| redactor.holds_credential(t))))
            .collect()
    }

    /// The end of a cancelled step, with its failure.
    pub(super) fn cancelled_end(&self) -> StepEnd {
        StepEnd {
            status: RunStatus::Cancelled,
            failure: Some(self.cancelled_failure()),
            output: None,
            basis: None,
        }
    }

    /// The step failure of a cancelled step, naming why it was cancelled.
    fn cancelled_failure(&self) -> StepFailure {
        match self.cancel_reason() {
            CancelReason::Caller => StepFailure {
                category: "cancelled".into(),
                failure_class: "cancelled".into(),
                code: "cancelled".into(),
                message: "The run was cancelled by the caller.".into(),
                remediation: "Run it again when ready.".into(),
                context: None,
            },
            CancelReason::JobDeadline { deadline_ms } => StepFailure {
                category: "cancelled".into(),
                failure_class: "cancelled".into(),
                code: "job-deadline".into(),
                message: format!(
                    "The job deadline fired: runtime.deadlineMilliseconds = {deadline_ms} ms."
                ),
                remediation: "Raise runtime.deadlineMilliseconds (up to its catalog maximum), lower DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES, or seal a shorter timeoutMs.".into(),
                context: None,
            },
        }
    }
}

/// The step as the store starts it: its access and the retry limits it applies.
pub(super) fn step_start(ctx: &Ctx<'_>, step: &Step) -> StepStart {
    let limits = &ctx.cfg.limits;
    StepStart {
        step_id: step.id.clone(),
        access: step.access,
        configured_max_retries: limits.configured_max_retries(),
        effective_max_retries: limits.effective_max_retries(),
        transport_retry: limits.transport_retry(),
    }
}

/// Tells progress that an attempt ended, as its record says.
pub(super) fn emit_finished(ctx: &Ctx<'_>, step: &Step, record: &AttemptRecord) {
    ctx.emit(Progress::AttemptFinished {
        step_id: step.id.clone(),
        attempt: record.attempt,
        status: record.status,
        retry_decision: record.retry.decision,
        retry_rule: record.retry_rule.clone(),
        wait_ms: record.wait_ms,
        message: record.message.clone(),
    });
}
