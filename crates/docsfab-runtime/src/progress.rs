//! What a run tells the operator while it goes: the [`Progress`] events the executor emits
//! (data only), and the one line of operator text each event reads as ([`Progress::describe`]).
//! The CLI prints these lines and builds its status line from the same events; tests read them
//! too, which is why the wording lives here, beside the events, and not in the CLI.

use std::sync::Arc;

use crate::agent::TurnEvent;
use crate::composition::Access;
use crate::record::{AttemptStatus, Budget, RetryDecision, RunStatus};

/// Something to tell the operator while the run goes.
#[derive(Debug, Clone)]
pub enum Progress {
    /// The run exists in the store (the first event; `docsfab run` prints this id first).
    RunStarted {
        run_id: String,
    },
    StepStarted {
        step_id: String,
        access: Access,
    },
    AttemptStarted {
        step_id: String,
        attempt: u32,
        budget: Budget,
    },
    /// Inside an attempt: a request, an in-turn replay, a turn's end.
    Turn {
        step_id: String,
        attempt: u32,
        event: TurnEvent,
    },
    AttemptFinished {
        step_id: String,
        attempt: u32,
        status: AttemptStatus,
        retry_decision: RetryDecision,
        retry_rule: Option<String>,
        wait_ms: Option<u64>,
        message: Option<String>,
    },
    /// A step backoff is running: `remaining_ms` until attempt `next_attempt` (sent about once a
    /// second).
    Backoff {
        step_id: String,
        next_attempt: u32,
        remaining_ms: u64,
    },
    StepFinished {
        step_id: String,
        status: RunStatus,
    },
}

impl Progress {
    /// One line for the operator, indented by depth (step, attempt, turn); `None` for events
    /// that are only for machines (the request bytes).
    pub fn describe(&self) -> Option<String> {
        Some(match self {
            Progress::RunStarted { run_id } => format!("run {run_id}"),
            Progress::StepStarted { step_id, access } => {
                format!("step {step_id} ({})", access.as_str())
            }
            Progress::AttemptStarted {
                attempt, budget, ..
            } => format!("  attempt {attempt} ({})", budget.label()),
            Progress::Turn { event, .. } => match event {
                TurnEvent::Request { .. } => return None,
                TurnEvent::Replay { turn, entry } => {
                    format!(
                        "    turn {turn}: {} ({}), replaying the same request in {} ms",
                        entry.cause, entry.provider_error_class, entry.wait_ms
                    )
                }
                TurnEvent::Finished {
                    turn,
                    status,
                    requested,
                    rejected,
                    executed,
                } => {
                    let status = status.as_str();
                    if *requested == 0 {
                        format!("    turn {turn}: {status}")
                    } else {
                        format!(
                            "    turn {turn}: {status}; tools requested {requested}, rejected {rejected}, executed {executed}"
                        )
                    }
                }
            },
            Progress::AttemptFinished {
                attempt,
                status,
                retry_decision,
                retry_rule,
                wait_ms,
                message,
                ..
            } => {
                if *status == AttemptStatus::Succeeded {
                    format!("  attempt {attempt} succeeded")
                } else {
                    let why = message.as_deref().unwrap_or("no detail");
                    let rule = retry_rule.as_deref().unwrap_or("none");
                    let decision = match retry_decision {
                        RetryDecision::Scheduled => format!(
                            "retry scheduled by rule {rule} after {} ms",
                            wait_ms.unwrap_or(0)
                        ),
                        RetryDecision::Exhausted => format!("retry budget exhausted (rule {rule})"),
                        RetryDecision::Terminal => format!("not retried (rule {rule})"),
                        RetryDecision::Declined => {
                            format!("retry declined: writes not proven or undone (rule {rule})")
                        }
                        RetryDecision::None => "no retry decided".to_owned(),
                    };
                    let what = if *status == AttemptStatus::Cancelled {
                        "was cancelled"
                    } else {
                        "failed"
                    };
                    format!("  attempt {attempt} {what}: {why}; {decision}")
                }
            }
            Progress::Backoff {
                next_attempt,
                remaining_ms,
                ..
            } => format!(
                "  attempt {next_attempt} starts in {}",
                countdown_text(*remaining_ms)
            ),
            Progress::StepFinished { step_id, status } => {
                format!("step {step_id} {}", status.as_str())
            }
        })
    }
}

/// A wait that remains, as a countdown shows it: seconds with tenths (`1.5 s`), rounded up, so a
/// countdown never shows less than remains and a wait still running never reads `0.0 s`.
pub fn countdown_text(remaining_ms: u64) -> String {
    let tenths = remaining_ms.div_ceil(100);
    format!("{}.{} s", tenths / 10, tenths % 10)
}

/// Where progress goes. Called inline, so keep it quick.
pub type ProgressSink = Arc<dyn Fn(&Progress) + Send + Sync>;

impl Progress {
    /// The step this event is about, when it is about one.
    fn step_id(&self) -> Option<&str> {
        match self {
            Progress::RunStarted { .. } => None,
            Progress::StepStarted { step_id, .. }
            | Progress::AttemptStarted { step_id, .. }
            | Progress::Turn { step_id, .. }
            | Progress::AttemptFinished { step_id, .. }
            | Progress::Backoff { step_id, .. }
            | Progress::StepFinished { step_id, .. } => Some(step_id),
        }
    }

    /// [`Progress::describe`], with the fan-out instance (`pages[3]`) named on the attempt and
    /// turn lines of an instance: instances run at once, so their lines interleave and the
    /// indentation under a `step` line no longer says whose they are.
    pub fn describe_line(&self) -> Option<String> {
        let line = self.describe()?;
        match self.step_id() {
            Some(id) if id.ends_with(']') && line.starts_with(' ') => {
                let body = line.trim_start();
                let indent = &line[..line.len() - body.len()];
                Some(format!("{indent}{id}: {body}"))
            }
            _ => Some(line),
        }
    }
}
