//! One simulated step on a virtual clock.
//!
//! For docsfab the loop is the executor's and the driver's, with every decision delegated: a
//! failed request goes to `replay::decide` (replay after its wait, or end the turn), a failed
//! attempt goes to `step::decide` (retry after its wait from a budget, or end the step), and the
//! host attempt timer fires when a request would outlast it. Each attempt is one turn.

use docsfab_policy::replay::{self, PastReplay, ReplayDecision, StopReason, Window};
use docsfab_policy::step::{self, AttemptFailure, Ending, PastAttempt, StepAccess, StepDecision};

use crate::model::{FaultModel, Outcome, Provider};
use crate::policy::{DocsfabPolicy, PeerPreset, Policy};
use crate::rng::Rng;

/// A bound that ended a turn, an attempt or a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bound {
    /// The general replay window's attempts (`maxAttemptsPerTurn`).
    ReplayAttempts,
    /// The throttle window's attempts (`maxThrottledAttemptsPerTurn`).
    ThrottledAttempts,
    /// A replay window's summed wait.
    ReplayDelay,
    /// A replay wait would cross the attempt deadline.
    ReplayDeadline,
    /// The host attempt timer fired during a request.
    AttemptTimer,
    /// The step layer's budgets refused another attempt.
    StepExhausted,
    /// The failure is never retried.
    Terminal,
    /// A peer client's `max_retries`.
    PeerRetries,
}

impl Bound {
    pub const ALL: [Bound; 8] = [
        Bound::ReplayAttempts,
        Bound::ThrottledAttempts,
        Bound::ReplayDelay,
        Bound::ReplayDeadline,
        Bound::AttemptTimer,
        Bound::StepExhausted,
        Bound::Terminal,
        Bound::PeerRetries,
    ];

    /// The name reports use.
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::ReplayAttempts => "replay-attempts",
            Bound::ThrottledAttempts => "throttled-attempts",
            Bound::ReplayDelay => "replay-delay",
            Bound::ReplayDeadline => "replay-deadline",
            Bound::AttemptTimer => "attempt-timer",
            Bound::StepExhausted => "step-exhausted",
            Bound::Terminal => "terminal",
            Bound::PeerRetries => "peer-retries",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// What happened to one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepResult {
    pub success: bool,
    /// Virtual time from the first request to the answer or the end.
    pub elapsed_ms: u64,
    pub requests: u32,
    pub attempts: u32,
    /// Time spent in retry and replay waits.
    pub waited_ms: u64,
    /// Every wait, in order (for hand-checked tests).
    pub waits: Vec<u64>,
    bounds: u16,
}

impl StepResult {
    /// Whether `b` ended some turn, attempt or the step.
    pub fn hit(&self, b: Bound) -> bool {
        self.bounds & b.bit() != 0
    }

    fn wait(&mut self, now: &mut u64, ms: u64) {
        *now += ms;
        self.waited_ms += ms;
        self.waits.push(ms);
    }
}

/// Simulates one step of `policy` against `model`.
pub fn step(policy: &Policy, model: &FaultModel, rng: &mut Rng) -> StepResult {
    match policy {
        Policy::Docsfab(p) => docsfab_step(p, model, rng),
        Policy::Peer(p) => peer_step(p, model, rng),
    }
}

fn docsfab_step(p: &DocsfabPolicy, model: &FaultModel, rng: &mut Rng) -> StepResult {
    let mut r = StepResult::default();
    let mut provider = Provider::default();
    let mut now = 0u64;
    let mut last_wait = 0u64;
    let mut history: Vec<PastAttempt> = Vec::new();
    loop {
        r.attempts += 1;
        let start = now;
        let deadline = start.saturating_add(p.attempt_timer_ms);
        let mut replays: Vec<PastReplay> = Vec::new();
        let failure = loop {
            r.requests += 1;
            let (outcome, latency) = model.draw(&mut provider, last_wait, rng);
            if now.saturating_add(latency) > deadline {
                now = deadline;
                r.bounds |= Bound::AttemptTimer.bit();
                break AttemptFailure::AttemptDeadline;
            }
            now += latency;
            let Outcome::Fault(f) = outcome else {
                r.success = true;
                r.elapsed_ms = now;
                return r;
            };
            match replay::decide(&p.replay, &replays, &f, now, Some(deadline)) {
                ReplayDecision::Replay { wait_ms, .. } => {
                    r.wait(&mut now, wait_ms);
                    last_wait = wait_ms;
                    replays.push(PastReplay {
                        failure: f,
                        wait_ms,
                    });
                }
                ReplayDecision::Stop { reason } => {
                    r.bounds |= stop_bound(reason).map_or(0, Bound::bit);
                    break AttemptFailure::Provider { failure: f };
                }
            }
        };
        let duration = now - start;
        match step::decide(
            &p.rules,
            &p.budgets,
            StepAccess::ReadOnly,
            &history,
            &failure,
            duration,
        ) {
            StepDecision::Retry { retry, .. } => {
                r.wait(&mut now, retry.wait_ms);
                last_wait = retry.wait_ms;
                history.push(PastAttempt {
                    duration_ms: duration,
                    retry,
                });
            }
            StepDecision::End { ending, .. } => {
                let b = match ending {
                    Ending::Exhausted => Bound::StepExhausted,
                    _ => Bound::Terminal,
                };
                r.bounds |= b.bit();
                r.elapsed_ms = now;
                return r;
            }
        }
    }
}

/// The bound a replay stop names, if it is one (a non-replayable class is not a bound).
fn stop_bound(reason: StopReason) -> Option<Bound> {
    match reason {
        StopReason::AttemptsExhausted {
            window: Window::General,
            ..
        } => Some(Bound::ReplayAttempts),
        StopReason::AttemptsExhausted {
            window: Window::Throttle,
            ..
        } => Some(Bound::ThrottledAttempts),
        StopReason::DelayExhausted { .. } => Some(Bound::ReplayDelay),
        StopReason::Deadline => Some(Bound::ReplayDeadline),
        StopReason::NotReplayable | StopReason::ContentPublished => None,
    }
}

fn peer_step(p: &PeerPreset, model: &FaultModel, rng: &mut Rng) -> StepResult {
    let mut r = StepResult {
        attempts: 1,
        ..StepResult::default()
    };
    let mut provider = Provider::default();
    let mut now = 0u64;
    let mut last_wait = 0u64;
    for n in 0..=p.max_retries {
        r.requests += 1;
        let (outcome, latency) = model.draw(&mut provider, last_wait, rng);
        now += latency;
        let Outcome::Fault(f) = outcome else {
            r.success = true;
            break;
        };
        if !p.retries(&f) {
            r.bounds |= Bound::Terminal.bit();
            break;
        }
        if n == p.max_retries {
            r.bounds |= Bound::PeerRetries.bit();
            break;
        }
        let u = rng.unit();
        last_wait = p.wait_ms(n + 1, f.retry_after_ms, u);
        r.wait(&mut now, last_wait);
    }
    r.elapsed_ms = now;
    r
}
