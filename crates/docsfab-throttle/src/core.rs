//! The admission decision for one provider, as a pure state machine.
//!
//! `admit(now)` says whether a request may be sent now or how long to wait and why;
//! `on_response(..)` feeds back how the request went and what the provider's head said.
//! Four gates, checked in this order:
//!
//! 1. **hold** — after a 429 (or a rate-limit error event) nothing new is sent until the
//!    provider's Retry-After, or the replay wait the caller chose, has passed. Requests already
//!    in flight are not touched.
//! 2. **concurrency** — at most `max_concurrent` requests in flight.
//! 3. **adaptive** — an AIMD window under that cap: +1 after a window's worth of successes,
//!    halved on a 429, never below 1. One congestion event halves it once: a 429 on a request
//!    sent before the last cut is an echo of the same event. Until the provider has answered
//!    once, one request goes alone, so the first head tells the budgets before a burst.
//! 4. **pacing** — each budget the provider reported (requests, tokens, ...). With its size
//!    known, the provider's bucket is mirrored (refill rate learnt from size, remaining and
//!    reset) and a send waits until the mirror holds its cost plus a 5 % reserve; without, what
//!    is left is spread over the time to the reset and the last unit kept in hand. Either way
//!    sends granted after the reported request count against the report, so several requests
//!    in flight do not each spend the same remainder.
//!
//! Time is milliseconds since the Unix epoch, passed in: the state is shared by processes that
//! share no monotonic clock. The state serialises so the store can keep it between processes.

use serde::{Deserialize, Serialize};

use crate::headers::{BudgetKind, MAX_RESET_HORIZON_MS, Observation, RateHeaders};

/// The range of `maxConcurrentRequests` and its default.
pub const MAX_CONCURRENT_RANGE: std::ops::RangeInclusive<u32> = 1..=64;
pub const DEFAULT_MAX_CONCURRENT: u32 = 8;
/// The hold after a 429 that came with neither a Retry-After nor a replay wait.
pub const DEFAULT_HOLD_MS: u64 = 1_000;
/// No hold is longer than this; a provider asking for more is out of quota, and every waiter's
/// attempt deadline ends it sooner anyway.
pub const MAX_HOLD_MS: u64 = 10 * 60 * 1000;

/// `throttle:` in host.yaml.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Shared,
    /// A pass-through: never waits, shares nothing.
    Off,
}

/// One provider's throttle settings from host.yaml.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub mode: Mode,
    max_concurrent: u32,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            mode: Mode::Shared,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
        }
    }
}

/// `maxConcurrentRequests` outside 1..=64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "maxConcurrentRequests is {0}, outside 1..64; set a number of requests in flight from 1 to 64 (default 8)"
)]
pub struct MaxConcurrentOutOfRange(pub u32);

impl Settings {
    pub fn new(mode: Mode, max_concurrent: u32) -> Result<Settings, MaxConcurrentOutOfRange> {
        if !MAX_CONCURRENT_RANGE.contains(&max_concurrent) {
            return Err(MaxConcurrentOutOfRange(max_concurrent));
        }
        Ok(Settings {
            mode,
            max_concurrent,
        })
    }

    pub fn max_concurrent(&self) -> u32 {
        self.max_concurrent
    }
}

/// Why a send has to wait. The names are what records and progress lines show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Concurrency,
    Hold,
    Pacing,
    Adaptive,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Concurrency => "concurrency",
            Reason::Hold => "hold",
            Reason::Pacing => "pacing",
            Reason::Adaptive => "adaptive",
        }
    }
}

/// The answer to "may I send now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send; `seq` names this send when its response is fed back.
    Go { seq: u64 },
    /// Not yet. `until_ms` is when the gate opens by itself; `None` when it opens only as a
    /// request in flight finishes.
    Wait {
        until_ms: Option<u64>,
        reason: Reason,
    },
}

/// How a sent request ended, for the throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An answer; the token counts refine the per-request cost used to pace token budgets.
    Success {
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
    },
    /// HTTP 429 or a rate-limit error event. `wait_ms` is the replay wait the caller will keep
    /// (if it replays); the hold lasts at least that and at least the Retry-After.
    RateLimited { wait_ms: Option<u64> },
    /// Any other failure: it says nothing about the rate limit.
    Failed,
    /// The request was given up (cancelled, deadline) before an answer.
    Abandoned,
}

/// A budget the provider reported, and which send the report was about.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Budget {
    observation: Observation,
    /// The seq of the request whose response carried it.
    seq: u64,
    /// When `remaining` was true (the head's arrival).
    observed_ms: u64,
    /// Units the budget regains per millisecond, learnt from limit, remaining and reset (kept
    /// from an earlier report when this one cannot tell, e.g. a full budget).
    #[serde(default)]
    refill_per_ms: Option<f64>,
    /// The mirrored bucket (with a rate): its level at `level_ms`, after our sends since.
    #[serde(default)]
    level: f64,
    #[serde(default)]
    level_ms: u64,
}

/// One provider's throttle state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThrottleState {
    /// Requests in flight. The store sets it from its live permits before each decision.
    #[serde(skip)]
    in_flight: u32,
    /// Sends granted so far; the next send's seq.
    sends: u64,
    last_send_ms: u64,
    hold_until_ms: u64,
    /// The AIMD window; `None` until the first cut (the window is then the cap).
    window: Option<u32>,
    /// Successes counted towards the next +1.
    acks: u32,
    /// Sends before this seq belong to the congestion event that last cut the window.
    cut_seq: u64,
    budgets: Vec<Budget>,
    /// Whether the provider has answered anything yet. Until it has, one request goes alone:
    /// its head tells the budgets before a burst spends them blind.
    #[serde(default)]
    answered: bool,
    /// Running means of a request's token counts, for the token budgets.
    avg_input: Option<u64>,
    avg_output: Option<u64>,
}

impl ThrottleState {
    pub fn new() -> ThrottleState {
        ThrottleState::default()
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The live permit count, from whoever owns the permits (the store).
    pub fn set_in_flight(&mut self, n: u32) {
        self.in_flight = n;
    }

    /// The end of the current hold (0 or a past instant when there is none).
    pub fn hold_until_ms(&self) -> u64 {
        self.hold_until_ms
    }

    /// The adaptive window under `settings`' cap.
    pub fn window(&self, settings: &Settings) -> u32 {
        self.window
            .unwrap_or(settings.max_concurrent)
            .clamp(1, settings.max_concurrent)
    }

    /// Decides whether a send may go now. Changes the state only on `Go`.
    pub fn admit(&mut self, settings: &Settings, now_ms: u64) -> Admit {
        if settings.mode == Mode::Off {
            return self.grant(now_ms);
        }
        if now_ms < self.hold_until_ms {
            return Admit::Wait {
                until_ms: Some(self.hold_until_ms),
                reason: Reason::Hold,
            };
        }
        if self.in_flight >= settings.max_concurrent {
            return Admit::Wait {
                until_ms: None,
                reason: Reason::Concurrency,
            };
        }
        if self.in_flight >= self.window(settings) || (!self.answered && self.in_flight > 0) {
            return Admit::Wait {
                until_ms: None,
                reason: Reason::Adaptive,
            };
        }
        if let Some(until_ms) = self.pacing_until(now_ms) {
            return Admit::Wait {
                until_ms: Some(until_ms),
                reason: Reason::Pacing,
            };
        }
        self.grant(now_ms)
    }

    fn grant(&mut self, now_ms: u64) -> Admit {
        let costs: Vec<u64> = self
            .budgets
            .iter()
            .map(|b| self.cost(b.observation.kind))
            .collect();
        for (b, cost) in self.budgets.iter_mut().zip(costs) {
            if let (Some(limit), Some(rate)) = (b.observation.limit, b.refill_per_ms) {
                b.level = level_at(b, limit, rate, now_ms) - cost as f64;
                b.level_ms = b.level_ms.max(now_ms);
            }
        }
        let seq = self.sends;
        self.sends = self.sends.saturating_add(1);
        self.last_send_ms = self.last_send_ms.max(now_ms);
        self.in_flight = self.in_flight.saturating_add(1);
        Admit::Go { seq }
    }

    /// The latest instant any reported budget asks the next send to wait for, if later than now.
    fn pacing_until(&self, now_ms: u64) -> Option<u64> {
        self.budgets
            .iter()
            .filter_map(|b| self.budget_until(b, now_ms))
            .max()
    }

    /// The instant one budget lets the next send go, if later than now.
    fn budget_until(&self, b: &Budget, now_ms: u64) -> Option<u64> {
        let cost = self.cost(b.observation.kind);
        let later_sends = self.sends.saturating_sub(b.seq.saturating_add(1));
        match (b.observation.limit, b.refill_per_ms) {
            (Some(limit), Some(rate)) if rate > 0.0 => mirror_until(b, limit, rate, cost, now_ms),
            _ => self.spread_until(b, cost, later_sends, now_ms),
        }
    }

    /// Without a known refill rate: spreads what is left evenly over the time to the reset,
    /// keeping the last unit. With `n` sends left the next may go `1/n` of the way from the last
    /// send to the reset; with one left it waits for the reset.
    fn spread_until(&self, b: &Budget, cost: u64, later_sends: u64, now_ms: u64) -> Option<u64> {
        let reset = b.observation.reset_at_ms;
        if now_ms >= reset {
            return None;
        }
        let units_left = b
            .observation
            .remaining
            .saturating_sub(later_sends.saturating_mul(cost));
        let sends_left = units_left / cost;
        if sends_left <= 1 {
            return Some(reset);
        }
        let anchor = self.last_send_ms.max(b.observed_ms).min(reset);
        let next = anchor + (reset - anchor) / sends_left;
        (now_ms < next).then_some(next)
    }

    /// What one send is expected to spend of a budget (at least 1).
    fn cost(&self, kind: BudgetKind) -> u64 {
        let (i, o) = (self.avg_input.unwrap_or(0), self.avg_output.unwrap_or(0));
        let cost = match kind {
            BudgetKind::Requests => 1,
            BudgetKind::Tokens => i.saturating_add(o),
            BudgetKind::InputTokens => i,
            BudgetKind::OutputTokens => o,
        };
        cost.max(1)
    }

    /// Feeds back how the send `seq` went and what its response head said.
    pub fn on_response(
        &mut self,
        settings: &Settings,
        seq: u64,
        outcome: Outcome,
        headers: &RateHeaders,
        now_ms: u64,
    ) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if settings.mode == Mode::Off {
            return;
        }
        self.observe(seq, headers, now_ms);
        self.answered |= matches!(
            outcome,
            Outcome::Success { .. } | Outcome::RateLimited { .. }
        );
        match outcome {
            Outcome::Success {
                input_tokens,
                output_tokens,
            } => {
                self.avg_input = mean(self.avg_input, input_tokens);
                self.avg_output = mean(self.avg_output, output_tokens);
                self.widen(settings, seq);
            }
            Outcome::RateLimited { wait_ms } => {
                let hold = headers
                    .retry_after_ms
                    .max(wait_ms)
                    .unwrap_or(DEFAULT_HOLD_MS)
                    .min(MAX_HOLD_MS);
                self.hold_until_ms = self.hold_until_ms.max(now_ms.saturating_add(hold));
                self.cut(settings, seq);
            }
            Outcome::Failed | Outcome::Abandoned => {}
        }
    }

    /// Keeps the newest report of each budget: one about an earlier send than the one already
    /// kept is stale (it was measured before sends the kept one already counts). A report
    /// without a learnt rate lapses at its reset; one with a rate stays true by extrapolation
    /// until a newer report replaces it (or for the horizon at most).
    fn observe(&mut self, seq: u64, headers: &RateHeaders, now_ms: u64) {
        self.budgets.retain(|b| {
            b.observation.reset_at_ms > now_ms
                || (b.refill_per_ms.is_some()
                    && now_ms.saturating_sub(b.observed_ms) < MAX_RESET_HORIZON_MS)
        });
        let observed_ms = headers.at_ms.map_or(now_ms, |at| at.min(now_ms));
        for &observation in &headers.observations {
            let later_sends = self.sends.saturating_sub(seq.saturating_add(1));
            let cost = self.cost(observation.kind);
            let kept = self
                .budgets
                .iter_mut()
                .find(|b| b.observation.kind == observation.kind);
            let fresh = Budget {
                observation,
                seq,
                observed_ms,
                refill_per_ms: refill_rate(&observation, observed_ms)
                    .or(kept.as_ref().and_then(|k| k.refill_per_ms)),
                level: observation.remaining as f64 - (later_sends * cost) as f64,
                level_ms: observed_ms,
            };
            match kept {
                Some(kept) if kept.seq > seq => {}
                Some(kept) => *kept = fresh,
                None => self.budgets.push(fresh),
            }
        }
    }

    fn widen(&mut self, settings: &Settings, seq: u64) {
        if seq < self.cut_seq {
            return;
        }
        let window = self.window(settings);
        self.acks = self.acks.saturating_add(1);
        if self.acks >= window {
            self.acks = 0;
            self.window = Some((window + 1).min(settings.max_concurrent));
        }
    }

    fn cut(&mut self, settings: &Settings, seq: u64) {
        if seq < self.cut_seq {
            return;
        }
        self.window = Some((self.window(settings) / 2).max(1));
        self.acks = 0;
        self.cut_seq = self.sends;
    }
}

/// With the budget's size known, the provider's bucket is mirrored: set from each report (less
/// what the sends after the reported one took), refilled at the learnt rate up to the size, and
/// charged by each send we grant. The next send may go once the mirror holds its cost plus a
/// reserve of a twentieth of the budget, so our own traffic never empties it and another client
/// on the same key has room.
fn mirror_until(b: &Budget, limit: u64, rate: f64, cost: u64, now_ms: u64) -> Option<u64> {
    let need = (cost + limit / 20) as f64;
    if level_at(b, limit, rate, now_ms) >= need {
        return None;
    }
    if need > limit as f64 {
        // One send costs more than the budget holds: wait for the provider's reset.
        return Some(b.observation.reset_at_ms.max(now_ms + 1));
    }
    let at = b.level_ms as f64 + ((need - b.level) / rate).ceil();
    Some((at as u64).max(now_ms + 1))
}

/// The mirrored level at `now_ms`.
fn level_at(b: &Budget, limit: u64, rate: f64, now_ms: u64) -> f64 {
    (b.level + rate * now_ms.saturating_sub(b.level_ms) as f64).min(limit as f64)
}

/// Units a budget regains per millisecond: what is missing over the time to fill it (less a
/// margin).
fn refill_rate(o: &Observation, observed_ms: u64) -> Option<f64> {
    let limit = o.limit?;
    let missing = limit.checked_sub(o.remaining).filter(|&m| m > 0)?;
    let to_full = o.reset_at_ms.checked_sub(observed_ms).filter(|&d| d > 0)?;
    // A little under the measured rate: the reset is rounded, the clocks differ, and a send
    // that arrives a hair early is a 429.
    Some(missing as f64 / to_full as f64 * RATE_MARGIN)
}

/// The share of the learnt refill rate the mirror counts on.
const RATE_MARGIN: f64 = 0.97;

/// A running mean weighted 3:1 towards the past, so one odd request moves it a little.
fn mean(avg: Option<u64>, sample: Option<u64>) -> Option<u64> {
    match (avg, sample) {
        (Some(a), Some(s)) => Some((a.saturating_mul(3).saturating_add(s)) / 4),
        (None, s) => s,
        (a, None) => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settings(max: u32) -> Settings {
        Settings::new(Mode::Shared, max).unwrap()
    }

    fn ok() -> Outcome {
        Outcome::Success {
            input_tokens: None,
            output_tokens: None,
        }
    }

    fn go(state: &mut ThrottleState, s: &Settings, now: u64) -> u64 {
        match state.admit(s, now) {
            Admit::Go { seq } => seq,
            other => panic!("expected Go, got {other:?}"),
        }
    }

    /// A state whose provider has answered once (so the first request no longer goes alone).
    fn warm(s: &Settings) -> ThrottleState {
        let mut st = ThrottleState::new();
        let seq = go(&mut st, s, 0);
        st.on_response(s, seq, ok(), &RateHeaders::none(), 0);
        st
    }

    fn requests_left(remaining: u64, reset_at_ms: u64) -> RateHeaders {
        RateHeaders {
            at_ms: None,
            retry_after_ms: None,
            observations: vec![Observation {
                kind: BudgetKind::Requests,
                limit: None,
                remaining,
                reset_at_ms,
            }],
        }
    }

    #[test]
    fn max_concurrent_outside_1_to_64_is_refused_in_one_sentence() {
        assert!(Settings::new(Mode::Shared, 1).is_ok());
        assert!(Settings::new(Mode::Shared, 64).is_ok());
        let e = Settings::new(Mode::Shared, 65).unwrap_err().to_string();
        assert_eq!(e.matches(';').count(), 1, "{e}");
        assert!(e.starts_with("maxConcurrentRequests is 65"), "{e}");
        assert!(Settings::new(Mode::Shared, 0).is_err());
    }

    #[test]
    fn the_cap_makes_the_next_send_wait_for_a_finish() {
        let s = settings(2);
        let mut st = warm(&s);
        let a = go(&mut st, &s, 0);
        go(&mut st, &s, 0);
        assert_eq!(
            st.admit(&s, 0),
            Admit::Wait {
                until_ms: None,
                reason: Reason::Concurrency
            }
        );
        st.on_response(&s, a, ok(), &RateHeaders::none(), 1);
        go(&mut st, &s, 1);
    }

    #[test]
    fn a_429_holds_new_sends_for_the_longer_of_retry_after_and_the_replay_wait() {
        let s = settings(8);
        let mut st = warm(&s);
        let a = go(&mut st, &s, 1_000);
        let b = go(&mut st, &s, 1_000);
        let head = RateHeaders {
            at_ms: None,
            retry_after_ms: Some(2_000),
            observations: vec![],
        };
        st.on_response(
            &s,
            a,
            Outcome::RateLimited { wait_ms: Some(500) },
            &head,
            1_100,
        );
        assert_eq!(
            st.admit(&s, 3_099),
            Admit::Wait {
                until_ms: Some(3_100),
                reason: Reason::Hold
            }
        );
        // The request already in flight is not touched: it finishes normally.
        st.on_response(&s, b, ok(), &RateHeaders::none(), 1_200);
        go(&mut st, &s, 3_100);
    }

    #[test]
    fn one_congestion_event_halves_the_window_once_and_successes_grow_it_back() {
        let s = settings(8);
        let mut st = warm(&s);
        let seqs: Vec<u64> = (0..8).map(|_| go(&mut st, &s, 0)).collect();
        for &q in &seqs {
            st.on_response(
                &s,
                q,
                Outcome::RateLimited { wait_ms: Some(0) },
                &RateHeaders::none(),
                0,
            );
        }
        assert_eq!(st.window(&s), 4, "eight echoes of one event cut once");
        let q: Vec<u64> = (0..4).map(|_| go(&mut st, &s, 10)).collect();
        assert_eq!(
            st.admit(&s, 10),
            Admit::Wait {
                until_ms: None,
                reason: Reason::Adaptive
            }
        );
        for &x in &q {
            st.on_response(&s, x, ok(), &RateHeaders::none(), 11);
        }
        assert_eq!(st.window(&s), 5, "a window of successes adds one");
    }

    #[test]
    fn pacing_spreads_the_remaining_requests_over_the_time_to_reset() {
        let s = settings(8);
        let mut st = ThrottleState::new();
        let a = go(&mut st, &s, 0);
        // 4 left, reset at 1000: the next sends are spaced so the last one waits for the reset.
        st.on_response(&s, a, ok(), &requests_left(4, 1_000), 0);
        let mut grants = vec![];
        let mut now = 0;
        while now < 1_000 {
            match st.admit(&s, now) {
                Admit::Go { seq } => {
                    grants.push(now);
                    st.on_response(&s, seq, ok(), &RateHeaders::none(), now);
                }
                Admit::Wait { until_ms, reason } => {
                    assert_eq!(reason, Reason::Pacing);
                    now = until_ms.unwrap();
                }
            }
        }
        assert_eq!(
            grants,
            vec![250, 500, 750],
            "three sends, the fourth unit kept in hand"
        );
        assert!(matches!(st.admit(&s, 1_000), Admit::Go { .. }));
    }

    #[test]
    fn a_stale_budget_report_does_not_replace_a_newer_one() {
        let s = settings(8);
        let mut st = warm(&s);
        let old = go(&mut st, &s, 0);
        let new = go(&mut st, &s, 0);
        st.on_response(&s, new, ok(), &requests_left(1, 5_000), 10);
        st.on_response(&s, old, ok(), &requests_left(100, 5_000), 20);
        assert_eq!(
            st.admit(&s, 30),
            Admit::Wait {
                until_ms: Some(5_000),
                reason: Reason::Pacing
            }
        );
    }

    #[test]
    fn token_budgets_are_paced_by_the_mean_tokens_of_a_request() {
        let s = settings(8);
        let mut st = ThrottleState::new();
        let a = go(&mut st, &s, 0);
        let head = RateHeaders {
            at_ms: None,
            retry_after_ms: None,
            observations: vec![Observation {
                kind: BudgetKind::Tokens,
                limit: None,
                remaining: 1_500,
                reset_at_ms: 60_000,
            }],
        };
        let used = Outcome::Success {
            input_tokens: Some(900),
            output_tokens: Some(100),
        };
        st.on_response(&s, a, used, &head, 0);
        // 1500 tokens at 1000 a request: one send left, which is kept until the reset.
        assert_eq!(
            st.admit(&s, 1),
            Admit::Wait {
                until_ms: Some(60_000),
                reason: Reason::Pacing
            }
        );
    }

    #[test]
    fn until_the_provider_answers_once_one_request_goes_alone() {
        let s = settings(8);
        let mut st = ThrottleState::new();
        let first = go(&mut st, &s, 0);
        assert_eq!(
            st.admit(&s, 0),
            Admit::Wait {
                until_ms: None,
                reason: Reason::Adaptive
            }
        );
        st.on_response(&s, first, ok(), &RateHeaders::none(), 5);
        for _ in 0..8 {
            go(&mut st, &s, 5);
        }
    }

    #[test]
    fn throttle_off_always_admits() {
        let s = Settings::new(Mode::Off, 1).unwrap();
        let mut st = ThrottleState::new();
        for _ in 0..10 {
            go(&mut st, &s, 0);
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit,
        Finish {
            pick: usize,
            kind: u8,
            retry_after_ms: u64,
            remaining: u64,
            reset_in: u64,
        },
        Tick(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Admit),
            3 => (any::<usize>(), 0u8..4, 0u64..5_000, 0u64..20, 0u64..5_000).prop_map(
                |(pick, kind, retry_after_ms, remaining, reset_in)| Op::Finish { pick, kind, retry_after_ms, remaining, reset_in }
            ),
            2 => (0u64..2_000).prop_map(Op::Tick),
        ]
    }

    proptest! {
        /// Whatever happens, never more than the cap in flight and the window stays in 1..=cap.
        #[test]
        fn never_more_than_the_cap_in_flight(max in 1u32..=64, ops in prop::collection::vec(op(), 1..300)) {
            let s = settings(max);
            let mut st = ThrottleState::new();
            let mut now = 0u64;
            let mut flying: Vec<u64> = vec![];
            for op in ops {
                match op {
                    Op::Admit => {
                        if let Admit::Go { seq } = st.admit(&s, now) {
                            flying.push(seq);
                        }
                    }
                    Op::Finish { pick, kind, retry_after_ms, remaining, reset_in } if !flying.is_empty() => {
                        let seq = flying.remove(pick % flying.len());
                        let outcome = match kind {
                            0 => Outcome::RateLimited { wait_ms: None },
                            1 => Outcome::Failed,
                            _ => ok(),
                        };
                        let head = RateHeaders { at_ms: None,
                            retry_after_ms: Some(retry_after_ms),
                            observations: vec![Observation { kind: BudgetKind::Requests, limit: Some(remaining + 5), remaining, reset_at_ms: now + reset_in }],
                        };
                        st.on_response(&s, seq, outcome, &head, now);
                    }
                    Op::Finish { .. } => {}
                    Op::Tick(d) => now += d,
                }
                prop_assert!(st.in_flight() <= max);
                prop_assert_eq!(st.in_flight() as usize, flying.len());
                let w = st.window(&s);
                prop_assert!((1..=max).contains(&w));
            }
        }

        /// A hold is never shorter than the Retry-After (nor the replay wait) that caused it.
        #[test]
        fn a_hold_is_never_shorter_than_the_retry_after(
            retry_after in prop::option::of(0u64..MAX_HOLD_MS),
            wait in prop::option::of(0u64..MAX_HOLD_MS),
            at in 0u64..1_000_000,
            probe in 0u64..MAX_HOLD_MS,
        ) {
            let s = settings(8);
            let mut st = ThrottleState::new();
            let Admit::Go { seq } = st.admit(&s, at) else { unreachable!() };
            let head = RateHeaders { at_ms: None, retry_after_ms: retry_after, observations: vec![] };
            st.on_response(&s, seq, Outcome::RateLimited { wait_ms: wait }, &head, at);
            let asked = retry_after.max(wait).unwrap_or(DEFAULT_HOLD_MS);
            let t = at + probe;
            if probe < asked {
                prop_assert_eq!(st.admit(&s, t), Admit::Wait { until_ms: Some(at + asked), reason: Reason::Hold });
            } else {
                let admitted = matches!(st.admit(&s, t), Admit::Go { .. });
                prop_assert!(admitted, "not admitted at the end of the hold");
            }
        }

        /// With the budget's size known, the mirrored bucket never admits more sends by any
        /// instant than the provider's bucket could have refilled by then.
        #[test]
        fn the_mirror_never_admits_more_than_the_bucket_refills(
            limit in 1u64..60,
            used in 1u64..60,
            to_full in 100u64..60_000,
            gaps in prop::collection::vec(0u64..3_000, 1..200),
        ) {
            let s = settings(64);
            let mut st = warm(&s);
            let Admit::Go { seq } = st.admit(&s, 0) else { unreachable!() };
            let remaining = limit.saturating_sub(used);
            let head = RateHeaders {
                at_ms: Some(0),
                retry_after_ms: None,
                observations: vec![Observation { kind: BudgetKind::Requests, limit: Some(limit), remaining, reset_at_ms: to_full }],
            };
            st.on_response(&s, seq, ok(), &head, 0);
            let rate = (limit - remaining) as f64 / to_full as f64;
            let (mut now, mut admitted) = (0u64, 0u64);
            for gap in gaps {
                now += gap;
                if let Admit::Go { seq } = st.admit(&s, now) {
                    admitted += 1;
                    st.on_response(&s, seq, ok(), &RateHeaders::none(), now);
                    let supply = remaining as f64 + rate * now as f64;
                    prop_assert!(admitted as f64 <= supply, "{} admitted by {} ms, {} supplied", admitted, now, supply);
                }
            }
        }

        /// Pacing never admits more sends before the reset than the provider said remained,
        /// however the sends are timed and even while earlier ones are still in flight.
        #[test]
        fn pacing_never_admits_more_than_remaining_before_reset(
            remaining in 0u64..40,
            reset_in in 1u64..10_000,
            gaps in prop::collection::vec(0u64..500, 1..200),
            finish_each in any::<bool>(),
        ) {
            let s = settings(64);
            let mut st = ThrottleState::new();
            let Admit::Go { seq } = st.admit(&s, 0) else { unreachable!() };
            st.on_response(&s, seq, ok(), &requests_left(remaining, reset_in), 0);
            let mut now = 0;
            let mut admitted = 0u64;
            for gap in gaps {
                now += gap;
                if now >= reset_in { break; }
                if let Admit::Go { seq } = st.admit(&s, now) {
                    admitted += 1;
                    if finish_each {
                        st.on_response(&s, seq, ok(), &RateHeaders::none(), now);
                    }
                }
            }
            prop_assert!(admitted <= remaining.saturating_sub(1), "{} admitted, {} remained", admitted, remaining);
        }
    }
}
