//! What `docsfab run` and `docsfab demo` show on stderr while a run goes.
//!
//! Every event the executor describes becomes one line on stderr, so each replay, each retry
//! decision and each step backoff is visible as it happens. On a terminal an indicatif status
//! line sits below those lines: the step, the attempt and its budget, the turn, the replays so
//! far and a live countdown during any wait. When stderr is not a terminal (a pipe, a CI log)
//! there is no status line, only the plain lines, and a step backoff is announced once rather
//! than once a second.
//!
//! Colour ([`ColorChoice`], the global `--color` flag) only adds escape sequences around the
//! same text: with colour off (a pipe, `NO_COLOR`, `--color never`) every byte is as before. The
//! `run ID` line is left out when stdout, which already begins with the id, is the same
//! terminal: a person would read the id twice, and a pipe still gets it on both streams.

use std::ffi::OsStr;
use std::io::{IsTerminal as _, Write as _};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anstyle::{AnsiColor, Effects, Style};
use docsfab_runtime::agent::TurnEvent;
use docsfab_runtime::executor::{Progress, countdown_text};
use docsfab_runtime::record::{AttemptStatus, RunStatus, TurnStatus};
use indicatif::{ProgressBar, ProgressStyle};

/// `--color`: when docsfab colours its output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal whose TERM is not `dumb`, unless NO_COLOR is set (to anything non-empty).
    #[default]
    Auto,
    /// Always, even into a pipe or a file, and whatever NO_COLOR says.
    Always,
    /// Never.
    Never,
}

impl ColorChoice {
    /// Whether a stream gets colour. `no_color` and `term` are the variables' values; NO_COLOR
    /// counts only when non-empty (no-color.org), and an explicit `--color always` outranks it.
    pub fn enabled(
        self,
        is_terminal: bool,
        term: Option<&OsStr>,
        no_color: Option<&OsStr>,
    ) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                is_terminal
                    && term.is_none_or(|t| t != "dumb")
                    && no_color.is_none_or(OsStr::is_empty)
            }
        }
    }

    /// [`ColorChoice::enabled`] for this process's environment.
    pub fn for_stream(self, is_terminal: bool) -> bool {
        self.enabled(
            is_terminal,
            std::env::var_os("TERM").as_deref(),
            std::env::var_os("NO_COLOR").as_deref(),
        )
    }
}

const GREEN: Style = AnsiColor::Green.on_default();
const RED: Style = AnsiColor::Red.on_default();
const YELLOW: Style = AnsiColor::Yellow.on_default();
const DIM: Style = Style::new().effects(Effects::DIMMED);

/// `text` wrapped in `style`, or as it is when colour is off.
pub fn paint(on: bool, style: Style, text: &str) -> String {
    if on {
        format!("{style}{text}{style:#}")
    } else {
        text.to_owned()
    }
}

/// The colour of a status word: green done, red failed, yellow stopped short.
pub fn status_style(status: &str) -> Style {
    match status {
        "succeeded" | "completed" => GREEN,
        "failed" | "interrupted" => RED,
        _ => YELLOW,
    }
}

/// The colour of one progress line: the outcome of a step, an attempt or a failed turn by its
/// status, waits (replays, backoffs) dimmed. `None` leaves the line plain.
fn line_style(p: &Progress) -> Option<Style> {
    match p {
        Progress::StepFinished { status, .. } => Some(match status {
            RunStatus::Succeeded => GREEN,
            RunStatus::Failed | RunStatus::Interrupted => RED,
            _ => YELLOW,
        }),
        Progress::AttemptFinished { status, .. } => Some(match status {
            AttemptStatus::Succeeded => GREEN,
            AttemptStatus::Cancelled => YELLOW,
            _ => RED,
        }),
        Progress::Turn { event, .. } => match event {
            TurnEvent::Replay { .. } => Some(DIM),
            TurnEvent::Finished { status, .. } if *status != TurnStatus::Completed => Some(RED),
            _ => None,
        },
        Progress::Backoff { .. } => Some(DIM),
        _ => None,
    }
}

/// Whether stdout and stderr are one and the same terminal (the same open device), so a line
/// written to both is seen twice.
pub fn stdout_is_stderr_terminal() -> bool {
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::MetadataExt as _;
    let (out, err) = (std::io::stdout(), std::io::stderr());
    if !out.is_terminal() || !err.is_terminal() {
        return false;
    }
    let meta = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(std::fs::File::from)
            .and_then(|f| f.metadata())
            .map(|m| (m.dev(), m.ino(), m.rdev()))
    };
    matches!((meta(out.as_fd()), meta(err.as_fd())), (Ok(a), Ok(b)) if a == b)
}

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
    /// Colour the lines on stderr.
    colour: bool,
    /// Leave out the `run ID` line (stdout shows the id on the same terminal).
    quiet_run_id: bool,
}

impl Reporter {
    /// A status line when stderr is a terminal, plain lines otherwise; `color` decides colour.
    pub fn for_stderr(color: ColorChoice) -> Arc<Reporter> {
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
            colour: color.for_stream(std::io::stderr().is_terminal()),
            quiet_run_id: stdout_is_stderr_terminal(),
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
                Progress::RunStarted { .. } => print = !self.quiet_run_id,
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
                    TurnEvent::Held { .. } | TurnEvent::ThrottleUnavailable { .. } => {}
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
            match line_style(p) {
                Some(style) => self.line(&paint(self.colour, style, &text)),
                None => self.line(&text),
            }
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
    fn issue11_colour_honours_the_flag_no_color_and_a_dumb_terminal() {
        let os = |s: &'static str| Some(OsStr::new(s));
        let auto = ColorChoice::Auto;
        assert!(auto.enabled(true, os("xterm-256color"), None));
        assert!(
            auto.enabled(true, None, os("")),
            "an empty NO_COLOR is unset"
        );
        assert!(!auto.enabled(true, os("xterm"), os("1")));
        assert!(!auto.enabled(true, os("dumb"), None));
        assert!(!auto.enabled(false, os("xterm"), None));
        assert!(ColorChoice::Always.enabled(false, os("dumb"), os("1")));
        assert!(!ColorChoice::Never.enabled(true, os("xterm"), None));
        assert_eq!(paint(false, RED, "failed"), "failed");
        assert_eq!(paint(true, RED, "failed"), "\u{1b}[31mfailed\u{1b}[0m");
    }

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
