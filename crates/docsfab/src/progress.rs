//! What `docsfab run` and `docsfab demo` show on stderr while a run goes.
//!
//! Every event the executor describes becomes one line on stderr, so each replay, each retry
//! decision and each step backoff is visible as it happens. On a terminal an indicatif status
//! line sits below those lines: the step, the attempt and its budget, the turn, the replays so
//! far and a live countdown during any wait. When stderr is not a terminal (a pipe, a CI log)
//! there is no status line, only the plain lines, and a step backoff is announced once rather
//! than once a second.

use std::io::{IsTerminal as _, Write as _};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use docsfab_runtime::agent::TurnEvent;
use docsfab_runtime::executor::{Progress, countdown_text};
use indicatif::{ProgressBar, ProgressStyle};

/// Where the run currently is, for the status line.
#[derive(Debug, Default)]
struct State {
    step: Option<String>,
    attempt: u32,
    budget: &'static str,
    turn: u32,
    /// In-turn replays in the current attempt.
    replays: u32,
    /// A wait in progress: what is waited for, and when it ends.
    waiting: Option<(String, Instant)>,
    /// The step backoff already announced in plain lines: (step, next attempt).
    announced_backoff: Option<(String, u32)>,
    cancelling: bool,
}

/// Shows progress on stderr. Share it as `Arc<Reporter>`; [`Reporter::finish`] removes the
/// status line.
pub struct Reporter {
    bar: Option<ProgressBar>,
    state: Mutex<State>,
}

impl Reporter {
    /// A status line when stderr is a terminal, plain lines otherwise.
    pub fn for_stderr() -> Arc<Reporter> {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
                bar.set_style(style);
            }
            // The tick redraws the message too, which keeps the countdown moving.
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        let reporter = Arc::new(Reporter {
            bar,
            state: Mutex::new(State::default()),
        });
        if reporter.bar.is_some() {
            // The steady tick only redraws; this thread recomputes the countdown text.
            let weak = Arc::downgrade(&reporter);
            std::thread::spawn(move || {
                while let Some(r) = weak.upgrade() {
                    if r.bar.as_ref().is_none_or(ProgressBar::is_finished) {
                        break;
                    }
                    r.refresh();
                    drop(r);
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        }
        reporter
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not silence progress.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One line above the status line (or alone on stderr).
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => {
                let _ = writeln!(std::io::stderr(), "{text}");
            }
        }
    }

    /// Writes `text` to stdout with the status line out of the way, so the two streams do not
    /// share a terminal line. A closed stdout is not an error here: the run goes on regardless.
    pub fn stdout(&self, text: &str) {
        let write = || {
            let _ = crate::error::emit(text);
        };
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }

    /// Handles one executor event.
    pub fn on_event(&self, p: &Progress) {
        let mut print = true;
        {
            let mut s = self.state();
            match p {
                Progress::RunStarted { .. } => {}
                Progress::StepStarted { step_id, .. } => {
                    s.step = Some(step_id.clone());
                    s.attempt = 0;
                    s.turn = 0;
                    s.replays = 0;
                    s.waiting = None;
                }
                Progress::AttemptStarted {
                    attempt, budget, ..
                } => {
                    s.attempt = *attempt;
                    s.budget = budget.label();
                    s.turn = 0;
                    s.replays = 0;
                    s.waiting = None;
                }
                Progress::Turn { event, .. } => match event {
                    TurnEvent::Request { turn, .. } => {
                        s.turn = *turn;
                        s.waiting = None;
                    }
                    TurnEvent::Replay { entry, .. } => {
                        s.replays += 1;
                        s.waiting = Some((
                            "replay".to_owned(),
                            Instant::now() + Duration::from_millis(entry.wait_ms),
                        ));
                    }
                    TurnEvent::Finished { .. } => s.waiting = None,
                },
                Progress::AttemptFinished { .. } => s.waiting = None,
                Progress::Backoff {
                    step_id,
                    next_attempt,
                    remaining_ms,
                } => {
                    s.waiting = Some((
                        format!("attempt {next_attempt}"),
                        Instant::now() + Duration::from_millis(*remaining_ms),
                    ));
                    let key = (step_id.clone(), *next_attempt);
                    if s.announced_backoff.as_ref() == Some(&key) {
                        print = false;
                    } else {
                        s.announced_backoff = Some(key);
                    }
                }
                Progress::StepFinished { .. } => {
                    s.waiting = None;
                }
            }
        }
        if print && let Some(text) = p.describe_line() {
            self.line(&text);
        }
        self.refresh();
    }

    /// Says the run is being cancelled (a signal arrived).
    pub fn cancelling(&self, signal: &str) {
        self.state().cancelling = true;
        self.line(&format!(
            "{signal} received: cancelling the run (send it again to stop at once)"
        ));
        self.refresh();
    }

    /// Redraws the status line from the state.
    fn refresh(&self) {
        let Some(bar) = &self.bar else { return };
        let text = status_text(&self.state(), Instant::now());
        bar.set_message(text);
    }

    /// Removes the status line; the plain lines stay.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The status line: `step outline · attempt 2 (transport budget) · turn 3 · 2 replays · replay in
/// 1.4 s`, or `starting` before the first step.
fn status_text(s: &State, now: Instant) -> String {
    let Some(step) = &s.step else {
        return "starting".to_owned();
    };
    let mut parts = vec![format!("step {step}")];
    if s.attempt > 0 {
        parts.push(format!("attempt {} ({})", s.attempt, s.budget));
    }
    if s.turn > 0 {
        parts.push(format!("turn {}", s.turn));
    }
    if s.replays > 0 {
        parts.push(format!(
            "{} replay{}",
            s.replays,
            if s.replays == 1 { "" } else { "s" }
        ));
    }
    if let Some((what, end)) = &s.waiting {
        let remaining_ms =
            u64::try_from(end.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX);
        parts.push(format!("{what} in {}", countdown_text(remaining_ms)));
    }
    if s.cancelling {
        parts.push("cancelling".to_owned());
    }
    parts.join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_names_step_attempt_turn_replays_and_the_countdown() {
        let now = Instant::now();
        let s = State {
            step: Some("outline".into()),
            attempt: 2,
            budget: "transport budget",
            turn: 3,
            replays: 2,
            waiting: Some(("replay".into(), now + Duration::from_millis(1450))),
            ..State::default()
        };
        assert_eq!(
            status_text(&s, now),
            "step outline · attempt 2 (transport budget) · turn 3 · 2 replays · replay in 1.5 s"
        );
        assert_eq!(status_text(&State::default(), now), "starting");
    }
}
