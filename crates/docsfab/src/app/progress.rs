//! What `docsfab run` and `docsfab demo` show on stderr while a run goes.
//!
//! Every event the executor describes becomes one line on stderr, so each replay, each retry
//! decision and each step backoff is visible as it happens. On a terminal indicatif status
//! lines sit below those lines: the step, the attempt and its budget, the turn, the replays so
//! far and a live countdown during any wait; one line for a plain step, one per running instance
//! while a fan-out step runs (an instance's line goes when it ends). When stderr is not a terminal (a pipe, a CI log)
//! there is no status line, only the plain lines, and a step backoff is announced once rather
//! than once a second.
//!
//! Color ([`ColorChoice`], the global `--color` flag) only adds escape sequences around the
//! same text: with color off (a pipe, `NO_COLOR`, `--color never`) every byte is as before. The
//! `run ID` line is left out when stdout, which already begins with the id, is the same
//! terminal: a person would read the id twice, and a pipe still gets it on both streams.

use std::ffi::OsStr;
use std::io::{IsTerminal as _, Write as _};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anstyle::{AnsiColor, Effects, Style};
use docsfab_record::{AttemptStatus, RunStatus, TurnStatus};
use docsfab_runtime::agent::TurnEvent;
use docsfab_runtime::executor::{Progress, countdown_text};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

/// `--color`: when docsfab colors its output.
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
    /// Whether a stream gets color. `no_color` and `term` are the variables' values; NO_COLOR
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

/// `text` wrapped in `style`, or as it is when color is off.
pub fn paint(on: bool, style: Style, text: &str) -> String {
    if on {
        format!("{style}{text}{style:#}")
    } else {
        text.to_owned()
    }
}

/// The color of a status word: green done, red failed, yellow stopped short.
pub fn status_style(status: &str) -> Style {
    match status {
        "succeeded" | "completed" => GREEN,
        "failed" | "interrupted" => RED,
        _ => YELLOW,
    }
}

/// The color of one progress line: the outcome of a step, an attempt or a failed turn by its
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
            TurnEvent::Warning { .. } => Some(YELLOW),
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

/// Where one running step (or fan-out instance) is, for its status line.
#[derive(Debug, Default)]
struct Lane {
    step: String,
    attempt: u32,
    budget: &'static str,
    turn: u32,
    /// In-turn replays in the current attempt.
    replays: u32,
    /// A wait in progress: what is waited for, and when it ends.
    waiting: Option<(String, Instant)>,
    /// The next attempt whose step backoff was already announced in plain lines.
    announced_backoff: Option<u32>,
    /// The step ended; its line stays only while nothing else runs.
    finished: bool,
}

impl Lane {
    fn new(step: &str) -> Lane {
        Lane {
            step: step.to_owned(),
            ..Lane::default()
        }
    }
}

/// Where the run currently is: one lane per step or fan-out instance still worth a line.
#[derive(Debug, Default)]
struct State {
    lanes: Vec<Lane>,
    cancelling: bool,
}

impl State {
    fn lane(&mut self, step: &str) -> Option<&mut Lane> {
        self.lanes.iter_mut().find(|l| l.step == step)
    }

    /// A step or instance starts: lanes that ended make way; a plain step is the only lane.
    fn start(&mut self, step: &str) {
        if is_instance(step) {
            self.lanes.retain(|l| !l.finished && l.step != step);
        } else {
            self.lanes.clear();
        }
        self.lanes.push(Lane::new(step));
    }
}

/// A fan-out instance's step id reads `pages[3]`.
fn is_instance(step: &str) -> bool {
    step.ends_with(']')
}

/// The live lines on a terminal: a multi-line group with one bar per status line.
struct Screen {
    multi: MultiProgress,
    bars: Mutex<Vec<ProgressBar>>,
}

impl Screen {
    fn new() -> Screen {
        Screen {
            multi: MultiProgress::new(),
            bars: Mutex::new(Vec::new()),
        }
    }

    fn bars(&self) -> MutexGuard<'_, Vec<ProgressBar>> {
        self.bars.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shows `lines`, one bar each: bars are added or removed at the bottom to match.
    fn show(&self, lines: Vec<String>) {
        let mut bars = self.bars();
        while bars.len() < lines.len() {
            let bar = self.multi.add(ProgressBar::new_spinner());
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
                bar.set_style(style);
            }
            // The tick redraws the message too, which keeps the countdown moving.
            bar.enable_steady_tick(Duration::from_millis(100));
            bars.push(bar);
        }
        while bars.len() > lines.len() {
            if let Some(bar) = bars.pop() {
                bar.finish_and_clear();
                self.multi.remove(&bar);
            }
        }
        for (bar, line) in bars.iter().zip(lines) {
            bar.set_message(line);
        }
    }

    fn clear(&self) {
        for bar in self.bars().drain(..) {
            bar.finish_and_clear();
            self.multi.remove(&bar);
        }
    }
}

/// Shows progress on stderr. Share it as `Arc<Reporter>`; [`Reporter::finish`] removes the
/// status lines.
pub struct Reporter {
    screen: Option<Screen>,
    finished: AtomicBool,
    state: Mutex<State>,
    /// Color the lines on stderr.
    color: bool,
    /// Leave out the `run ID` line (stdout shows the id on the same terminal).
    quiet_run_id: bool,
}

impl Reporter {
    /// Status lines when stderr is a terminal, plain lines otherwise; `color` decides color.
    pub fn for_stderr(color: ColorChoice) -> Arc<Reporter> {
        let terminal = std::io::stderr().is_terminal();
        let reporter = Arc::new(Reporter {
            screen: terminal.then(Screen::new),
            finished: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            color: color.for_stream(terminal),
            quiet_run_id: stdout_is_stderr_terminal(),
        });
        if reporter.screen.is_some() {
            reporter.refresh();
            // The steady tick only redraws; this thread recomputes the countdown text.
            let weak = Arc::downgrade(&reporter);
            std::thread::spawn(move || {
                while let Some(r) = weak.upgrade() {
                    if r.finished.load(Ordering::Relaxed) {
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

    /// One line above the status lines (or alone on stderr).
    pub fn line(&self, text: &str) {
        match &self.screen {
            Some(screen) => {
                let _ = screen.multi.println(text);
            }
            None => {
                let _ = writeln!(std::io::stderr(), "{text}");
            }
        }
    }

    /// Writes `text` to stdout with the status lines out of the way, so the two streams do not
    /// share a terminal line. A closed stdout is not an error here: the run goes on regardless.
    pub fn stdout(&self, text: &str) {
        let write = || {
            let _ = crate::app::error::emit(text);
        };
        match &self.screen {
            Some(screen) => screen.multi.suspend(write),
            None => write(),
        }
    }

    /// Handles one executor event.
    pub fn on_event(&self, p: &Progress) {
        let print = match p {
            Progress::RunStarted { .. } => !self.quiet_run_id,
            _ => self.state().apply(p, Instant::now()),
        };
        // The status lines change first, so the line printed above them is not followed by a
        // frame that still shows an instance that has ended.
        self.refresh();
        if print && let Some(text) = p.describe_line() {
            match line_style(p) {
                Some(style) => self.line(&paint(self.color, style, &text)),
                None => self.line(&text),
            }
        }
    }

    /// Says the run is being cancelled (a signal arrived).
    pub fn cancelling(&self, signal: &str) {
        self.state().cancelling = true;
        self.line(&format!(
            "{signal} received: cancelling the run (send it again to stop at once)"
        ));
        self.refresh();
    }

    /// Redraws the status lines from the state.
    fn refresh(&self) {
        let Some(screen) = &self.screen else { return };
        if self.finished.load(Ordering::Relaxed) {
            return;
        }
        let lines = status_lines(&self.state(), Instant::now());
        screen.show(lines);
    }

    /// Removes the status lines; the plain lines stay.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::Relaxed);
        if let Some(screen) = &self.screen {
            screen.clear();
        }
    }
}

impl State {
    /// Follows one event (not `RunStarted`); returns whether its plain line is printed: a step
    /// backoff is announced once per attempt, not with every countdown event.
    fn apply(&mut self, p: &Progress, now: Instant) -> bool {
        match p {
            Progress::RunStarted { .. } | Progress::StepReused { .. } => {}
            Progress::StepStarted { step_id, .. } => self.start(step_id),
            Progress::AttemptStarted {
                step_id,
                attempt,
                budget,
            } => {
                if let Some(l) = self.lane(step_id) {
                    l.attempt = *attempt;
                    l.budget = budget.label();
                    l.turn = 0;
                    l.replays = 0;
                    l.waiting = None;
                }
            }
            Progress::Turn { step_id, event, .. } => {
                let Some(l) = self.lane(step_id) else {
                    return true;
                };
                match event {
                    TurnEvent::Request { turn, .. } => {
                        l.turn = *turn;
                        l.waiting = None;
                    }
                    TurnEvent::Replay { entry, .. } => {
                        l.replays += 1;
                        l.waiting = Some((
                            "replay".to_owned(),
                            now + Duration::from_millis(entry.wait_ms),
                        ));
                    }
                    TurnEvent::Finished { .. } => l.waiting = None,
                    TurnEvent::Held { .. }
                    | TurnEvent::ThrottleUnavailable { .. }
                    | TurnEvent::Warning { .. } => {}
                }
            }
            Progress::AttemptFinished { step_id, .. } => {
                if let Some(l) = self.lane(step_id) {
                    l.waiting = None;
                }
            }
            Progress::Backoff {
                step_id,
                next_attempt,
                remaining_ms,
            } => {
                let Some(l) = self.lane(step_id) else {
                    return true;
                };
                l.waiting = Some((
                    format!("attempt {next_attempt}"),
                    now + Duration::from_millis(*remaining_ms),
                ));
                if l.announced_backoff == Some(*next_attempt) {
                    return false;
                }
                l.announced_backoff = Some(*next_attempt);
            }
            Progress::StepFinished { step_id, .. } => {
                if let Some(l) = self.lane(step_id) {
                    l.waiting = None;
                    l.finished = true;
                }
            }
        }
        true
    }
}

/// The status lines: one per running step or fan-out instance, in the order they started; when
/// none runs, the last one's line stays (as a plain step's does until the next step), or
/// `starting` before the first step. `cancelling` joins the first line.
fn status_lines(s: &State, now: Instant) -> Vec<String> {
    let running: Vec<&Lane> = s.lanes.iter().filter(|l| !l.finished).collect();
    let shown = if running.is_empty() {
        s.lanes.last().into_iter().collect()
    } else {
        running
    };
    let mut lines: Vec<String> = shown.iter().map(|l| lane_text(l, now)).collect();
    if lines.is_empty() {
        lines.push("starting".to_owned());
    }
    if s.cancelling {
        lines[0].push_str(" · cancelling");
    }
    lines
}

/// One status line: `step outline · attempt 2 (transport budget) · turn 3 · 2 replays · replay
/// in 1.4 s`.
fn lane_text(l: &Lane, now: Instant) -> String {
    let mut parts = vec![format!("step {}", l.step)];
    if l.attempt > 0 {
        parts.push(format!("attempt {} ({})", l.attempt, l.budget));
    }
    if l.turn > 0 {
        parts.push(format!("turn {}", l.turn));
    }
    if l.replays > 0 {
        parts.push(format!(
            "{} replay{}",
            l.replays,
            if l.replays == 1 { "" } else { "s" }
        ));
    }
    // A wait that is over (the replayed request is out) no longer counts down.
    if let Some((what, end)) = l.waiting.as_ref().filter(|(_, end)| *end > now) {
        let remaining_ms =
            u64::try_from(end.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX);
        parts.push(format!("{what} in {}", countdown_text(remaining_ms)));
    }
    parts.join(" · ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use docsfab_record::{Access, Budget};

    #[test]
    fn issue11_color_honours_the_flag_no_color_and_a_dumb_terminal() {
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
            lanes: vec![Lane {
                attempt: 2,
                budget: "transport budget",
                turn: 3,
                replays: 2,
                waiting: Some(("replay".into(), now + Duration::from_millis(1450))),
                ..Lane::new("outline")
            }],
            cancelling: true,
        };
        assert_eq!(
            status_lines(&s, now),
            [
                "step outline · attempt 2 (transport budget) · turn 3 · 2 replays · replay in 1.5 s · cancelling"
            ]
        );
        assert_eq!(status_lines(&State::default(), now), ["starting"]);
    }

    fn started(step: &str) -> Progress {
        Progress::StepStarted {
            step_id: step.into(),
            access: Access::Write,
        }
    }

    fn attempt(step: &str, n: u32) -> Progress {
        Progress::AttemptStarted {
            step_id: step.into(),
            attempt: n,
            budget: Budget::Initial,
        }
    }

    fn finished(step: &str) -> Progress {
        Progress::StepFinished {
            step_id: step.into(),
            status: RunStatus::Succeeded,
        }
    }

    /// Issue 12: running instances each get a line, an instance's line goes when it ends, and a
    /// plain step is a single line again.
    #[test]
    fn issue12_each_running_instance_has_its_own_status_line_until_it_ends() {
        let now = Instant::now();
        let mut s = State::default();
        let lines = |s: &State| status_lines(s, now);
        s.apply(&started("outline"), now);
        s.apply(&finished("outline"), now);
        assert_eq!(lines(&s), ["step outline"]);
        for e in [
            started("pages[0]"),
            attempt("pages[0]", 1),
            started("pages[1]"),
            attempt("pages[1]", 1),
        ] {
            s.apply(&e, now);
        }
        assert_eq!(
            lines(&s),
            [
                "step pages[0] · attempt 1 (initial)",
                "step pages[1] · attempt 1 (initial)"
            ]
        );
        s.apply(&finished("pages[0]"), now);
        s.apply(&started("pages[2]"), now);
        assert_eq!(
            lines(&s),
            ["step pages[1] · attempt 1 (initial)", "step pages[2]"]
        );
        s.apply(&finished("pages[2]"), now);
        s.apply(&finished("pages[1]"), now);
        assert_eq!(
            lines(&s).len(),
            1,
            "the last line stays until the next step"
        );
        s.apply(&started("summary"), now);
        assert_eq!(lines(&s), ["step summary"]);
    }

    /// Interleaved backoffs of two instances are each announced once.
    #[test]
    fn issue12_instance_backoffs_are_announced_once_each() {
        let now = Instant::now();
        let mut s = State::default();
        let backoff = |step: &str| Progress::Backoff {
            step_id: step.into(),
            next_attempt: 2,
            remaining_ms: 3000,
        };
        s.apply(&started("pages[0]"), now);
        s.apply(&started("pages[1]"), now);
        let printed: Vec<bool> = ["pages[0]", "pages[1]", "pages[0]", "pages[1]"]
            .iter()
            .map(|id| s.apply(&backoff(id), now))
            .collect();
        assert_eq!(printed, [true, true, false, false]);
        assert_eq!(
            status_lines(&s, now),
            [
                "step pages[0] · attempt 2 in 3.0 s",
                "step pages[1] · attempt 2 in 3.0 s"
            ]
        );
    }
}
