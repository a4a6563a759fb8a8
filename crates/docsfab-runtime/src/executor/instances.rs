//! Running a fan-out step: one instance per element of the array its `forEach` names, up to
//! `concurrency` at once, each an ordinary step run (its own attempts, budgets, lease, record)
//! under the id `STEP[INDEX]`.
//!
//! Instances are futures polled together on the run's task, not spawned tasks: they borrow the
//! run's context, and all their work is waiting on the provider, so one task loses nothing. Each
//! records through its own handle on the run's store ([`crate::store::RunBackend::step_log`]),
//! which uses the store's one connection one call at a time. An instance begins in the store
//! when it is launched, and launches go in element order, so the record lists instances in
//! index order whatever order they finish in.
//!
//! Fail-fast: once an instance ends other than succeeded, no further instance is launched; the
//! running ones finish (or, on Ctrl-C, end cancelled like any step), and instances never
//! launched have no record.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use serde_json::Value;

use super::config::RunError;
use super::ctx::{Ctx, step_start};
use super::step::run_begun_step;
use crate::composition::{FanOut, Step};
use crate::fanout::{WriteClaims, instance_id, output_array, render_instructions, resolve_items};
use crate::progress::Progress;
use crate::reuse::Looks;
use crate::store::{RunStore, StepEnd, StepLog};
use docsfab_record::{ForEach, RunStatus, StepFailure};

/// How one instance ended.
struct Ended {
    index: usize,
    status: RunStatus,
    /// The instance's answer as the fan-out's output array holds it.
    answer: Option<Value>,
}

/// Runs fan-out step `step` over the elements `fan` names and returns the step's status and,
/// when it succeeded, the output array later steps see.
pub(super) async fn run_fan_out(
    ctx: &Ctx<'_>,
    store: &mut RunStore,
    step: &Step,
    fan: &FanOut,
    outputs: &BTreeMap<String, String>,
) -> Result<(RunStatus, Option<String>), RunError> {
    let items = match resolve_items(fan, outputs) {
        Ok(items) => items,
        Err(why) => {
            // Nothing to run: the step is recorded once, under its own id, with the reason.
            let index = store.begin_step(ctx.run_id, &step_start(ctx, step))?;
            let end = failed_end(&step.id, fan, &why);
            store.finish_step(ctx.run_id, index, &end)?;
            return Ok((end.status, None));
        }
    };
    if items.is_empty() {
        // An empty array is a fan-out with nothing to do: one record, succeeded, no attempts.
        let index = store.begin_step(ctx.run_id, &step_start(ctx, step))?;
        let end = StepEnd {
            status: RunStatus::Succeeded,
            failure: None,
            output: None,
            basis: None,
        };
        store.finish_step(ctx.run_id, index, &end)?;
        return Ok((RunStatus::Succeeded, Some(output_array(Vec::new()))));
    }

    // Which instances an earlier run answers, judged once before any instance runs, so a
    // sibling's writes never sway the judgement.
    let reused = reusable_instances(ctx, step, &items, outputs);
    let claims = WriteClaims::default();
    let mut answers: Vec<Option<Value>> = vec![None; items.len()];
    let mut worst = RunStatus::Succeeded;
    let mut running = FuturesUnordered::new();
    let mut next = 0;
    let limit = usize::try_from(fan.concurrency).unwrap_or(1).max(1);
    loop {
        while worst == RunStatus::Succeeded
            && !ctx.cancel.is_cancelled()
            && running.len() < limit
            && next < items.len()
        {
            let launched = Launch {
                ctx,
                step,
                fan,
                index: next,
                item: &items[next],
                outputs,
                claims: &claims,
            };
            // Begun in the store now, in element order, so the record keeps that order.
            let begun = launched.begin(&mut **store)?;
            if let Some(at) = reused[next] {
                let (_, text) = ctx.carry_over(&mut **store, &begun.step, begun.step_index, at)?;
                answers[next] = Some(answer_value(&begun.step, text.unwrap_or_default()));
                next += 1;
                continue;
            }
            running.push(launched.run(store.step_log(), begun));
            next += 1;
        }
        let Some(ended) = running.next().await else {
            break;
        };
        let Ended {
            index,
            status,
            answer,
        } = ended?;
        if status == RunStatus::Succeeded {
            answers[index] = answer;
        } else if worst == RunStatus::Succeeded || status == RunStatus::Cancelled {
            worst = status;
        }
    }
    if worst == RunStatus::Succeeded && ctx.cancel.is_cancelled() && next < items.len() {
        // Cancelled before every instance could start: the step did not finish its work.
        worst = RunStatus::Cancelled;
    }
    let output = (worst == RunStatus::Succeeded).then(|| output_array(answers));
    Ok((worst, output))
}

/// One instance about to launch.
struct Launch<'l, 'a> {
    ctx: &'l Ctx<'a>,
    step: &'l Step,
    fan: &'l FanOut,
    index: usize,
    item: &'l Value,
    outputs: &'l BTreeMap<String, String>,
    claims: &'l WriteClaims,
}

/// An instance the store has begun: its step as it runs, and its index in the store.
struct Begun {
    step: Step,
    step_index: u32,
}

impl Launch<'_, '_> {
    /// Begins the instance in the store as `STEP[INDEX]` with its `forEach` object.
    fn begin(&self, store: &mut dyn StepLog) -> Result<Begun, RunError> {
        let mut step = self.step.clone();
        step.id = instance_id(&self.step.id, self.index);
        step.fan_out = None;
        let for_each = ForEach {
            step: self.step.id.clone(),
            index: u32::try_from(self.index).unwrap_or(u32::MAX),
            item: self.item.clone(),
        };
        let start = step_start(self.ctx, &step);
        let step_index = store.begin_step_for(self.ctx.run_id, &start, Some(&for_each))?;
        Ok(Begun { step, step_index })
    }

    /// Runs the begun instance to its end.
    async fn run(
        self,
        mut store: Box<dyn StepLog + Send>,
        begun: Begun,
    ) -> Result<Ended, RunError> {
        let ctx = self.ctx;
        let Begun { step, step_index } = begun;
        let ended = |status, answer| Ended {
            index: self.index,
            status,
            answer,
        };
        let instructions =
            match render_instructions(&step.instructions, self.item, self.index, self.outputs) {
                Ok(text) => text,
                Err(why) => {
                    // The element lacks what the instructions insert: the instance fails unrun.
                    let end = StepEnd {
                        status: RunStatus::Failed,
                        failure: Some(member_failure(self.fan, &step.id, &why)),
                        output: None,
                        basis: None,
                    };
                    store.finish_step(ctx.run_id, step_index, &end)?;
                    ctx.emit(Progress::StepFinished {
                        step_id: step.id.clone(),
                        status: RunStatus::Failed,
                    });
                    return Ok(ended(RunStatus::Failed, None));
                }
            };
        let (status, text) = run_begun_step(
            ctx,
            &mut *store,
            &step,
            step_index,
            instructions,
            Some(self.claims),
        )
        .await?;
        ctx.emit(Progress::StepFinished {
            step_id: step.id.clone(),
            status,
        });
        let answer = text.map(|t| answer_value(&step, t));
        Ok(ended(status, answer))
    }
}

/// An instance's answer as the fan-out's output array holds it: a step with a contract
/// answers an object; any other answer is its text.
fn answer_value(step: &Step, text: String) -> Value {
    match step.contract {
        Some(_) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
        None => Value::String(text),
    }
}

/// Per element, the reference step that stands in for its instance, if any.
fn reusable_instances(
    ctx: &Ctx<'_>,
    step: &Step,
    items: &[Value],
    outputs: &BTreeMap<String, String>,
) -> Vec<Option<usize>> {
    if ctx.cfg.carry.is_none() {
        return vec![None; items.len()];
    }
    let mut looks = Looks::default();
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let text = render_instructions(&step.instructions, item, index, outputs).ok()?;
            ctx.reusable(&step.id, &ctx.fingerprint(step, &text), &mut looks)
        })
        .collect()
}

/// The end of a fan-out step whose array could not be read from the earlier answer.
fn failed_end(step_id: &str, fan: &FanOut, why: &str) -> StepEnd {
    StepEnd {
        status: RunStatus::Failed,
        failure: Some(StepFailure {
            category: "fan-out-input".into(),
            failure_class: "model-output".into(),
            code: "for-each-not-array".into(),
            message: format!("Step {step_id} could not fan out: {why}."),
            remediation: format!(
                "Make the contract of step {} require {} as an array, so a wrong answer is retried there.",
                fan.step_id,
                path_text(fan)
            ),
            context: None,
        }),
        output: None,
        basis: None,
    }
}

/// An instance whose element lacks a member its instructions insert.
fn member_failure(fan: &FanOut, instance: &str, why: &str) -> StepFailure {
    StepFailure {
        category: "fan-out-input".into(),
        failure_class: "model-output".into(),
        code: "item-member-missing".into(),
        message: format!("Instance {instance} was not run: {why}."),
        remediation: format!(
            "Make the contract of step {} require that member in every element, or drop it from the instructions.",
            fan.step_id
        ),
        context: None,
    }
}

/// The members down to the array, or "its answer" for the whole answer.
fn path_text(fan: &FanOut) -> String {
    if fan.path.is_empty() {
        "its answer".to_owned()
    } else {
        fan.path.join(".")
    }
}
