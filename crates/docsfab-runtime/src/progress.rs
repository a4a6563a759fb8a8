//! What a run tells the operator while it goes: the [`Progress`] events the executor emits
//! (data only), and the one line of operator text each event reads as ([`Progress::describe`]).
//! The CLI prints these lines and builds its status line from the same events; tests read them
//! too, which is why the wording lives here, beside the events, and not in the CLI.

use std::sync::Arc;

use docsfab_record::{
    Access, AttemptStatus, Budget, CallOutcome, CallResult, RejectReason, RetryDecision, RunStatus,
    StepLink, TurnStatus,
};

use crate::agent::TurnEvent;
use crate::batch::ToolUse;

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
    /// A step was not run: an earlier run's result for it was carried over (docs/resume.md).
    StepReused {
        step_id: String,
        from: StepLink,
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
            Progress::StepReused { step_id, from } => format!(
                "step {step_id} reused from run {} ({}): its inputs are unchanged, no request sent",
                from.run_id, from.step_id
            ),
            Progress::AttemptStarted {
                attempt, budget, ..
            } => format!("  attempt {attempt} ({})", budget.label()),
            Progress::Turn { event, .. } => match event {
                TurnEvent::Request { .. } => return None,
                TurnEvent::Replay { turn, entry } => {
                    format!(
                        "    turn {turn}: {} ({}), replaying the same request in {}",
                        entry.cause,
                        entry.provider_error_class,
                        ms_and_human(entry.wait_ms)
                    )
                }
                // A short hold is normal pacing; only one a person would notice gets a line.
                TurnEvent::Held {
                    turn,
                    held_ms,
                    reason,
                } if *held_ms >= HELD_LINE_MS => format!(
                    "    turn {turn}: held {} by the provider throttle ({reason})",
                    ms_and_human(*held_ms)
                ),
                TurnEvent::Held { .. } => return None,
                TurnEvent::ThrottleUnavailable { message } => {
                    format!("warning: {message}; provider requests go unthrottled")
                }
                TurnEvent::Finished {
                    turn,
                    status,
                    calls,
                    reason,
                    ..
                } => turn_line(*turn, *status, calls, reason.as_deref()),
                TurnEvent::Warning { turn, warning } => {
                    format!("    turn {turn}: warning: {}", warning.describe())
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
                            "retry scheduled by rule {rule} after {}",
                            ms_and_human(wait_ms.unwrap_or(0))
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

/// The most calls a turn line names; the rest are counted (`+3 more`).
const CALLS_SHOWN: usize = 5;

/// `    turn 2: completed; read_file src/lib.rs, list_files src`, or `    turn 3: failed: why`.
fn turn_line(turn: u32, status: TurnStatus, calls: &[ToolUse], reason: Option<&str>) -> String {
    let mut line = format!("    turn {turn}: {}", status.as_str());
    if status != TurnStatus::Completed {
        line.push_str(": ");
        line.push_str(reason.unwrap_or("no reason recorded"));
    }
    if !calls.is_empty() {
        let mut named: Vec<String> = calls.iter().take(CALLS_SHOWN).map(call_text).collect();
        if calls.len() > CALLS_SHOWN {
            named.push(format!("+{} more", calls.len() - CALLS_SHOWN));
        }
        line.push_str("; ");
        line.push_str(&named.join(", "));
    }
    line
}

/// One call: `read_file src/lib.rs`, with why it did not run or what it returned instead of
/// content (`write_file ../x (refused: ...)`, `read_file a.rs (tool error)`).
fn call_text(call: &ToolUse) -> String {
    let mut text = call.tool.clone();
    if let Some(target) = &call.target {
        text.push(' ');
        text.push_str(target);
    }
    let note = match &call.outcome {
        CallOutcome::Rejected { reason, .. } => Some(format!(
            "rejected: {}",
            match reason {
                RejectReason::UnknownTool => "no such tool in this step",
                RejectReason::InvalidArguments => "arguments are not JSON",
                RejectReason::TruncatedArguments => "arguments cut short",
                RejectReason::SchemaMismatch => "arguments do not meet the tool's schema",
            }
        )),
        CallOutcome::Refused { detail } => Some(format!("refused: {detail}")),
        CallOutcome::Executed {
            result: Some(CallResult::Ok),
        } => None,
        CallOutcome::Executed {
            result: Some(CallResult::ToolError),
        } => Some("tool error".to_owned()),
        CallOutcome::Executed {
            result: Some(CallResult::Notice),
        } => Some("re-read notice".to_owned()),
        CallOutcome::Executed { result: None } => Some("no result recorded".to_owned()),
    };
    if let Some(note) = note {
        text.push_str(&format!(" ({note})"));
    }
    text
}

/// A wait that remains, as a countdown shows it: seconds with tenths (`1.5 s`), rounded up, so a
/// countdown never shows less than remains and a wait still running never reads `0.0 s`. From a
/// minute on, the whole seconds left in human units (`3m 05s`).
pub fn countdown_text(remaining_ms: u64) -> String {
    if remaining_ms >= 60_000 {
        return human_duration(remaining_ms.div_ceil(1000) * 1000);
    }
    let tenths = remaining_ms.div_ceil(100);
    format!("{}.{} s", tenths / 10, tenths % 10)
}

/// A duration as a person reads it, in its two largest units: `850 ms`, `4.2 s`, `16 s`,
/// `3m 05s`, `3h 30m`, `2d 4h`. Truncated, never rounded up, so `59999` reads `59.9 s`, not a
/// minute. The one duration wording of every operator text (progress, `run`, `runs`).
pub fn human_duration(ms: u64) -> String {
    let secs = ms / 1000;
    let (mins, hours, days) = (secs / 60, secs / 3600, secs / 86_400);
    if ms < 1000 {
        format!("{ms} ms")
    } else if mins == 0 {
        let tenths = (ms % 1000) / 100;
        if tenths == 0 {
            format!("{secs} s")
        } else {
            format!("{secs}.{tenths} s")
        }
    } else if hours == 0 {
        format!("{mins}m {:02}s", secs % 60)
    } else if days == 0 {
        format!("{hours}h {:02}m", mins % 60)
    } else {
        format!("{days}d {}h", hours % 24)
    }
}

/// A throttle hold at least this long gets its own progress line.
pub const HELD_LINE_MS: u64 = 1000;

/// The exact milliseconds, and the human form beside them when it says something more
/// (`16000 ms (16 s)`, but `400 ms`).
pub fn ms_and_human(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{ms} ms ({})", human_duration(ms))
    }
}

/// Where progress goes. Called inline, so keep it quick.
pub type ProgressSink = Arc<dyn Fn(&Progress) + Send + Sync>;

impl Progress {
    /// The step this event is about, when it is about one.
    fn step_id(&self) -> Option<&str> {
        match self {
            Progress::RunStarted { .. } => None,
            Progress::StepStarted { step_id, .. }
            | Progress::StepReused { step_id, .. }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn held(held_ms: u64) -> Progress {
        Progress::Turn {
            step_id: "pages[1]".into(),
            attempt: 1,
            event: TurnEvent::Held {
                turn: 2,
                held_ms,
                reason: "hold",
            },
        }
    }

    #[test]
    fn issue12_a_hold_of_a_second_or_more_gets_one_line_and_a_shorter_one_none() {
        assert_eq!(
            held(3200).describe().as_deref(),
            Some("    turn 2: held 3200 ms (3.2 s) by the provider throttle (hold)")
        );
        assert_eq!(held(999).describe(), None);
    }

    #[test]
    fn issue11_durations_read_in_human_units() {
        assert_eq!(human_duration(0), "0 ms");
        assert_eq!(human_duration(850), "850 ms");
        assert_eq!(human_duration(4_250), "4.2 s");
        assert_eq!(human_duration(16_000), "16 s");
        assert_eq!(human_duration(59_999), "59.9 s");
        assert_eq!(human_duration(185_000), "3m 05s");
        assert_eq!(human_duration(12_600_000), "3h 30m");
        assert_eq!(human_duration(187_200_000), "2d 4h");
        assert_eq!(ms_and_human(400), "400 ms");
        assert_eq!(ms_and_human(16_000), "16000 ms (16 s)");
        assert_eq!(countdown_text(1_450), "1.5 s");
        assert_eq!(countdown_text(184_001), "3m 05s");
    }

    fn call(tool: &str, target: Option<&str>, outcome: CallOutcome) -> ToolUse {
        ToolUse {
            tool: tool.to_owned(),
            target: target.map(str::to_owned),
            outcome,
        }
    }

    #[test]
    fn issue11_a_turn_line_names_its_tools_and_why_one_did_not_run() {
        let ok = CallOutcome::Executed {
            result: Some(CallResult::Ok),
        };
        let calls = vec![
            call("read_file", Some("src/lib.rs"), ok.clone()),
            call("list_files", None, ok.clone()),
            call(
                "write_file",
                Some("../x"),
                CallOutcome::Refused {
                    detail: "outside the workspace".into(),
                },
            ),
            call(
                "grep",
                None,
                CallOutcome::Rejected {
                    reason: RejectReason::UnknownTool,
                    detail: String::new(),
                },
            ),
        ];
        assert_eq!(
            turn_line(2, TurnStatus::Completed, &calls, None),
            "    turn 2: completed; read_file src/lib.rs, list_files, write_file ../x (refused: outside the workspace), grep (rejected: no such tool in this step)"
        );
        let many = vec![call("read_file", Some("a"), ok); 8];
        assert!(turn_line(1, TurnStatus::Completed, &many, None).ends_with("read_file a, +3 more"));
        assert_eq!(
            turn_line(
                3,
                TurnStatus::Failed,
                &[],
                Some("HTTP 503 after 8 requests")
            ),
            "    turn 3: failed: HTTP 503 after 8 requests"
        );
    }
}
