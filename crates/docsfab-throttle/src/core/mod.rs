//! The admission decision for one provider, as a pure state machine.
//!
//! The throttle decides *when* a request leaves, never *how long* the retry policy waits: the
//! caller says how long this request may be held at most (`Ask::patience_until_ms`, from the
//! policy's ceilings for the wait before it) and the attempt deadline, and the core never holds
//! a request past either. One request's own backoff is never stored here, so it never holds
//! anyone else.
//!
//! `admit(now, ask)` answers with a reservation: send at `at_ms` (now or later). The gates, in
//! this order:
//!
//! 1. **concurrency** — at most `maxConcurrentRequests` in flight: a hard cap, the only gate that
//!    is not bounded by the patience (it waits for a finish, bounded by the deadline).
//! 2. **adaptive** — until the provider has answered once, one request goes alone, so its head
//!    tells the budgets before a burst spends them blind (bounded by the patience).
//! 3. **hold** — after a 429 nothing new leaves before the provider's own Retry-After has passed
//!    (bounded by the patience, so a waiter never waits longer than its policy allows).
//! 4. **pacing** — a mirror of each of the provider's buckets (requests, tokens, ...). The
//!    rate comes from the header's per-minute `limit` (never read as a burst allowance), the
//!    bucket's size from `remaining` and the time to full, the level from each report. A send
//!    is charged at its reservation, so later decisions queue behind it (first come, first
//!    served, across processes). Without any header, a request rate is learnt from refusals.
//!
//! This file holds the settings, the state and the admission (with the leases of the fast path);
//! `feedback` is how a response or a refusal changes the state.
//!
//! Time is milliseconds since the Unix epoch, passed in: the state is shared by processes that
//! share no monotonic clock. The state serialises so the store can keep it between processes.

mod feedback;

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::headers::{BudgetKind, RateHeaders};

/// The range of `maxConcurrentRequests` and its default.
pub const MAX_CONCURRENT_RANGE: std::ops::RangeInclusive<u32> = 1..=64;
pub const DEFAULT_MAX_CONCURRENT: u32 = 8;
/// No stored hold is longer than this; a provider asking for more is out of quota, and every
/// waiter's own ceilings end it much sooner anyway.
pub const MAX_HOLD_MS: u64 = 10 * 60 * 1000;

/// The share of the header's rate the mirror counts on: the reset is rounded, the clocks
/// differ, a send planned for an instant reaches the provider tens of milliseconds late on a
/// loaded machine while the next may not, and a send that arrives a hair early is a 429.
const RATE_MARGIN: f64 = 0.96;
/// After a refusal the rate counted on is cut to this share (once per congestion event).
const CUT: f64 = 0.85;
/// Each success grows a cut rate back by this factor, up to the header's rate.
const RECOVER: f64 = 1.002;
/// While a learnt rate has never been refused since it was set, each success grows it faster.
const SLOW_START: f64 = 1.1;
/// Slow start grows a learnt rate no further than this many times the rate admitted lately.
const SLOW_START_AHEAD: f64 = 2.0;
/// The cut at the refusal that ends slow start: undoes the step that overshot, and a margin.
const SLOW_START_CUT: f64 = 0.85;
const SLOW_START_CUT_MEASURED: f64 = 0.9;
/// A learnt rate below this share of the rate last refused grows back by `PLATEAU_GROWTH` a
/// success; above it by `CREEP`.
const PLATEAU: f64 = 0.9;
const PLATEAU_GROWTH: f64 = 1.01;
const CREEP: f64 = 1.0005;
/// The lowest share of the header's rate the learning may go down to.
const MIN_FACTOR: f64 = 0.2;
/// How many recent sends the state remembers (for replaying reports over later sends and for
/// learning). More than the largest cap, so a report about a send in flight finds it.
const LEDGER: usize = 96;
/// How many recent size estimates a budget keeps.
const SIZE_SAMPLES: usize = 8;
/// How long a lease lasts: how soon a hold or pacing set elsewhere reaches a process that
/// admits from a lease.
pub const LEASE_MS: u64 = 250;
/// The most sends one lease allows.
const LEASE_SENDS: u32 = 256;
/// The shortest span between two reports that says something about other clients.
const MIN_SPAN_MS: u64 = 200;
/// Sends reserved this close together may reach the provider in either order (the send's own
/// jitter on a loaded host is tens of milliseconds), so a head of one may or may not count the
/// others: see `ThrottleState::observe`.
const RACE_MS: u64 = 50;
/// At most this share of a key is taken to be someone else's.
const MAX_OUTSIDE: f64 = 0.8;
/// The share of the first estimate (between what a refusal and its Retry-After bound) that
/// slow start begins at.
const FIRST_GUESS: f64 = 0.9;
/// The first rate learnt without headers or Retry-After: one request a second.
const DEFAULT_LEARNT_PER_MS: f64 = 1.0 / 1_000.0;

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

/// Why a send had to wait. The names are what records and progress lines show.
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

/// What one request asks of the throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// The request's prompt tokens, estimated from the bytes it sends: what it costs a token
    /// budget (its own, not an average).
    pub prompt_tokens: u64,
    /// The latest instant the time gates (adaptive, hold, pacing) may hold it: the policy's
    /// ceiling for the wait before this send. Past it the request goes as the policy says.
    pub patience_until_ms: u64,
    /// The attempt deadline: a reservation after it is refused and nothing is charged.
    pub deadline_ms: Option<u64>,
}

impl Ask {
    /// A request with no token estimate that the time gates may hold until the deadline.
    pub fn plain(deadline_ms: Option<u64>) -> Ask {
        Ask {
            prompt_tokens: 0,
            patience_until_ms: deadline_ms.unwrap_or(u64::MAX),
            deadline_ms,
        }
    }
}

/// The answer to "when may I send?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Reserved: send at `at_ms` (now or later); `seq` names the send when its response is fed
    /// back. `reason` is the gate that put `at_ms` later than now.
    Go {
        seq: u64,
        at_ms: u64,
        reason: Option<Reason>,
    },
    /// No slot: ask again when a request in flight finishes.
    Full { reason: Reason },
    /// The earliest instant the gates allow is past the deadline; nothing was reserved.
    PastDeadline { until_ms: u64, reason: Reason },
}

/// How a sent request ended, for the throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An answer; the token counts calibrate the prompt estimate and the output cost.
    Success {
        input_tokens: Option<u64>,
        output_tokens: Option<u64>,
    },
    /// HTTP 429 or a rate-limit error event. The hold lasts the Retry-After of its head; the
    /// caller's own replay wait is not the throttle's business and is not reported.
    RateLimited,
    /// Any other failure: it says nothing about the rate limit.
    Failed,
    /// The request was given up (cancelled, deadline) before an answer.
    Abandoned,
}

/// A send the state remembers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Sent {
    seq: u64,
    /// The reserved instant: when the provider charged it, as far as the mirror knows.
    at_ms: u64,
    prompt_tokens: u64,
    /// Refused by the provider: it took nothing from the buckets.
    #[serde(default)]
    refused: bool,
    /// Answered (not refused, not failed before an answer).
    #[serde(default)]
    admitted: bool,
    /// The state's epoch when it was reserved: a refusal or a hold since voids the reservation.
    #[serde(default)]
    epoch: u64,
    /// Being planned again (after a refusal or a hold): takes nothing until it is.
    #[serde(default)]
    voided: bool,
    /// The latest instant the time gates may hold it (its `Ask`).
    #[serde(default)]
    patience_until_ms: u64,
}

/// A grant to admit requests in-process, without a decision of the store each (see
/// [`ThrottleState::lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Requests that may be in flight at once under it.
    pub slots: u32,
    /// Requests that may be sent under it in all.
    pub sends: u32,
    /// The seq of its first send; its sends take `first_seq..first_seq + sends`.
    pub first_seq: u64,
    /// When it lapses (the store's clock).
    pub until_ms: u64,
}

/// Why no lease was granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoLease {
    /// Sending is paced (a hold, a learnt rate, the probe, a bucket under half): every
    /// request is decided in the store.
    Paced,
    /// Unpaced, but every slot this process may have is taken: it waits for one locally and
    /// asks again soon; its demand stays on record so the holders make room.
    Full,
}

/// This process's max-min fair part of a cap of `cap` requests in flight, given what the other
/// holders want (`others`, each at least the slots they hold) and `singles` requests that each
/// want one (permits decided in the store and waiters queued there). Holders wanting less than
/// an equal part keep what they want; the rest is split evenly among the others, at least one
/// each while any is left.
pub fn fair_share(cap: u32, others: &[u32], singles: u32) -> u32 {
    let mut left = cap.saturating_sub(singles);
    let mut wants = others.to_vec();
    wants.sort_unstable();
    let mut sharers = wants.len() as u32 + 1;
    for w in wants {
        if w.saturating_mul(sharers) > left {
            break;
        }
        left -= w;
        sharers -= 1;
    }
    match left / sharers {
        0 if left > 0 => 1,
        n => n,
    }
}

/// What was sent under a lease, given back when it is renewed or ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseReport {
    /// Sends answered (successes).
    pub answered: u32,
    /// Sends the lease allowed and nobody used.
    pub unused: u32,
    /// Over the answers with usage: their prompt-token estimates and the provider's counts.
    pub prompt_tokens: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// The newest response head among them, with its send's seq.
    pub newest_head: Option<(u64, RateHeaders)>,
}

/// One of the provider's buckets, mirrored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Budget {
    kind: BudgetKind,
    /// Units per millisecond the provider says it grants (its per-minute `limit` / 60,000);
    /// `None` when the head gave no limit.
    per_ms: Option<f64>,
    /// The bucket's size, learnt from `remaining` and the time to full: the smallest of the
    /// recent estimates in `sizes`.
    burst: f64,
    #[serde(default)]
    sizes: Vec<f64>,
    /// The mirrored level at `level_ms` (which may be in the future: the last reservation).
    level: f64,
    level_ms: u64,
    /// Share of `per_ms` the refusals say we may count on (cut by each, grown back by
    /// successes).
    factor: f64,
    /// Share of `per_ms` other clients of the key take, learnt from what the reports say is
    /// left against what our own sends alone would have left.
    #[serde(default)]
    outside: f64,
    /// Without a limit: the reported reset, when the bucket is full again.
    reset_at_ms: u64,
    /// The send whose report set the mirror last, when it was charged, and the level the
    /// report gave for that instant (after the send).
    report_seq: u64,
    report_ms: u64,
    #[serde(default)]
    report_level: f64,
}

impl Budget {
    /// Units per millisecond the mirror refills at.
    fn rate(&self) -> Option<f64> {
        self.per_ms
            .map(|r| r * RATE_MARGIN * self.factor * (1.0 - self.outside))
            .filter(|r| *r > 0.0)
    }

    fn level_at(&self, t: u64) -> f64 {
        match self.rate() {
            Some(rate) if t > self.level_ms => {
                (self.level + rate * (t - self.level_ms) as f64).min(self.burst)
            }
            _ => self.level,
        }
    }

    /// The earliest instant at or after `t` the bucket holds `cost`; never before the last
    /// reservation, so sends leave in the order they asked.
    fn earliest(&self, t: u64, cost: f64) -> u64 {
        let start = t.max(self.level_ms);
        let need = cost.min(self.burst);
        let level = self.level_at(start);
        if level >= need {
            return start;
        }
        match self.rate() {
            Some(rate) => start.saturating_add(((need - level) / rate).ceil() as u64),
            // No rate: the bucket is whole again at its reset.
            None => self.reset_at_ms.max(start),
        }
    }

    fn charge(&mut self, t: u64, cost: f64) {
        let at = t.max(self.level_ms);
        self.level = self.level_at(at) - cost.min(self.burst);
        self.level_ms = at;
    }
}

/// A request rate learnt from refusals, for a provider that sends no rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Learnt {
    per_ms: f64,
    /// The rate the last refusal came at: growth slows down as it gets near.
    #[serde(default)]
    refused_at_per_ms: Option<f64>,
    /// Not refused since it was set: grow fast.
    slow_start: bool,
    /// The last reservation: sends are spaced `1 / per_ms` apart.
    next_ms: u64,
}

/// One provider's throttle state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThrottleState {
    /// Requests in flight. The store sets it from its live permits before each decision.
    #[serde(skip)]
    in_flight: u32,
    /// Sends granted so far; the next send's seq.
    sends: u64,
    hold_until_ms: u64,
    /// Whether the provider has answered anything yet, and how often (up to a point).
    #[serde(default)]
    answered: bool,
    #[serde(default)]
    answers: u32,
    budgets: Vec<Budget>,
    #[serde(default)]
    learnt: Option<Learnt>,
    /// Refusals of sends before this seq belong to the congestion event that last cut a rate.
    #[serde(default)]
    cut_seq: u64,
    /// Moves on at every cut and every new hold: reservations made before are void, and are
    /// made again when they come due ([`ThrottleState::confirm`]).
    #[serde(default)]
    epoch: u64,
    #[serde(default)]
    ledger: VecDeque<Sent>,
    /// Provider tokens per estimated prompt token, learnt from the answers' usage.
    #[serde(default)]
    token_ratio: Option<f64>,
    /// Running mean of an answer's output tokens (what a send costs an output budget).
    #[serde(default)]
    avg_output: Option<u64>,
    /// Running mean of a send's prompt-token estimate: what a lease's sends are counted at.
    #[serde(default)]
    avg_prompt: Option<u64>,
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

    /// Grants a lease when sending is unpaced: no hold, no refusal-learnt rate, the probe window
    /// open to the cap, and every mirrored bucket at least half full. A process holding a
    /// lease admits up to `slots` requests at once, `sends` in all, without asking the store,
    /// until `until_ms`; what they did comes back in a [`LeaseReport`]. `in_flight` counts the
    /// other holders (permits and leases) and the waiters ahead, as for `admit`.
    ///
    /// `share` is this process's fair part of the cap (see [`fair_share`]): a lease never
    /// holds more, so a process that came first cannot keep the cap from one that came later.
    pub fn lease(
        &mut self,
        settings: &Settings,
        now_ms: u64,
        want: u32,
        share: u32,
    ) -> Result<Lease, NoLease> {
        if settings.mode == Mode::Off
            || now_ms < self.hold_until_ms
            || !self.answered
            || self.learnt.is_some()
            || self.probe_window() < settings.max_concurrent
        {
            return Err(NoLease::Paced);
        }
        let free = settings.max_concurrent.saturating_sub(self.in_flight);
        let slots = want.clamp(1, settings.max_concurrent).min(free).min(share);
        if slots == 0 {
            return Err(NoLease::Full);
        }
        // What the buckets can spare without coming near empty: half of each stays. A leased
        // send is counted at the mean prompt of the sends decided so far.
        let prompt = self.avg_prompt.unwrap_or(0);
        let mut sends = LEASE_SENDS;
        for b in &self.budgets {
            let cost = self.unit_cost(b.kind, prompt);
            let spare = match b.per_ms {
                Some(_) => b.level_at(now_ms) - b.burst * 0.5,
                None if now_ms >= b.reset_at_ms => f64::MAX,
                None => b.level - b.burst * 0.5,
            };
            sends = sends.min((spare / cost).floor().max(0.0) as u32);
        }
        if sends == 0 {
            return Err(NoLease::Paced);
        }
        for i in 0..self.budgets.len() {
            let cost = self.unit_cost(self.budgets[i].kind, prompt) * f64::from(sends);
            let b = &mut self.budgets[i];
            let at = now_ms.max(b.level_ms);
            b.level = b.level_at(at) - cost;
            b.level_ms = at;
        }
        let first_seq = self.sends;
        self.sends = self.sends.saturating_add(u64::from(sends));
        self.in_flight = self.in_flight.saturating_add(slots);
        Ok(Lease {
            slots,
            sends,
            first_seq,
            until_ms: now_ms.saturating_add(LEASE_MS),
        })
    }

    /// Folds back what was sent under a lease: the answers (as successes), the newest head, and
    /// the sends not used (given back to the mirrors).
    pub fn settle(&mut self, settings: &Settings, report: &LeaseReport, now_ms: u64) {
        if settings.mode == Mode::Off {
            return;
        }
        if let Some((seq, headers)) = &report.newest_head {
            self.observe(*seq, headers, now_ms);
        }
        if report.answered > 0 {
            self.answered = true;
            self.answers = self.answers.saturating_add(report.answered).min(64);
            for _ in 0..report.answered.min(64) {
                self.recover();
            }
            if report.prompt_tokens > 0 && report.input_tokens > 0 {
                let sample =
                    (report.input_tokens as f64 / report.prompt_tokens as f64).clamp(0.25, 4.0);
                self.token_ratio = Some(match self.token_ratio {
                    Some(r) => r * 0.75 + sample * 0.25,
                    None => sample,
                });
            }
            if report.output_tokens > 0 {
                let mean = report.output_tokens / u64::from(report.answered);
                self.avg_output = Some(match self.avg_output {
                    Some(a) => (a.saturating_mul(3).saturating_add(mean)) / 4,
                    None => mean,
                });
            }
        }
        // Unused sends were charged when the lease was granted.
        let prompt = self.avg_prompt.unwrap_or(0);
        for i in 0..self.budgets.len() {
            let back = self.unit_cost(self.budgets[i].kind, prompt) * f64::from(report.unused);
            let b = &mut self.budgets[i];
            b.level = (b.level + back).min(b.burst);
        }
    }

    /// Whether a head leaves every budget it reports at least half full: a lease may go on.
    /// Below that, pacing matters again and the lease is handed back at once.
    pub fn head_is_ample(headers: &RateHeaders) -> bool {
        let head_ms = headers.at_ms.unwrap_or(0);
        headers.retry_after_ms.is_none()
            && headers.observations.iter().all(|o| {
                let to_full = o.reset_at_ms.saturating_sub(head_ms) as f64;
                let size = match o.limit {
                    Some(l) => o.remaining as f64 + l as f64 / 60_000.0 * to_full,
                    None => return to_full == 0.0,
                };
                o.remaining as f64 >= size * 0.5
            })
    }

    /// While nothing is known of the provider's limits (no answer yet, or answers without any
    /// rate-limit header and no refusal yet), the requests in flight double with each answer
    /// after the first: 1, 1, 2, 4, ... So a provider that says nothing is probed, not flooded.
    fn probe_window(&self) -> u32 {
        if !self.budgets.is_empty() || self.learnt.is_some() {
            return u32::MAX;
        }
        // The largest power of two not above the answers so far: each round of answers doubles.
        1u32 << (31 - self.answers.max(1).leading_zeros())
    }

    /// Decides when a send may go. Changes the state only on `Go`.
    pub fn admit(&mut self, settings: &Settings, now_ms: u64, ask: &Ask) -> Admit {
        if settings.mode == Mode::Off {
            return self.grant(now_ms, now_ms, None, ask);
        }
        if self.in_flight >= settings.max_concurrent {
            return Admit::Full {
                reason: Reason::Concurrency,
            };
        }
        let patient = now_ms < ask.patience_until_ms;
        if patient && self.in_flight >= self.probe_window() {
            return Admit::Full {
                reason: Reason::Adaptive,
            };
        }
        let (mut at_ms, mut reason) = (now_ms, None);
        if self.hold_until_ms > at_ms {
            (at_ms, reason) = (self.hold_until_ms, Some(Reason::Hold));
        }
        let paced = self.pacing_at(at_ms, ask.prompt_tokens);
        if paced > at_ms {
            (at_ms, reason) = (paced, Some(Reason::Pacing));
        }
        // The policy's ceiling wins: past it the request goes as the policy would send it.
        at_ms = at_ms.min(ask.patience_until_ms.max(now_ms));
        if let (Some(deadline), Some(r)) = (ask.deadline_ms, reason)
            && at_ms > deadline
        {
            return Admit::PastDeadline {
                until_ms: at_ms,
                reason: r,
            };
        }
        let reason = reason.filter(|_| at_ms > now_ms);
        self.grant(now_ms, at_ms, reason, ask)
    }

    /// The earliest instant at or after `t` every bucket holds this send's cost.
    fn pacing_at(&self, t: u64, prompt_tokens: u64) -> u64 {
        let budgets = self
            .budgets
            .iter()
            .map(|b| b.earliest(t, self.unit_cost(b.kind, prompt_tokens)));
        let learnt = self.learnt.map(|l| l.next_ms.max(t));
        budgets.chain(learnt).max().unwrap_or(t).max(t)
    }

    /// What one send is expected to spend of a budget.
    fn unit_cost(&self, kind: BudgetKind, prompt_tokens: u64) -> f64 {
        let prompt = prompt_tokens as f64 * self.token_ratio.unwrap_or(1.0);
        let output = self.avg_output.unwrap_or(0) as f64;
        match kind {
            BudgetKind::Requests => 1.0,
            BudgetKind::Tokens => (prompt + output).max(1.0),
            BudgetKind::InputTokens => prompt.max(1.0),
            BudgetKind::OutputTokens => output.max(1.0),
        }
    }

    fn grant(&mut self, now_ms: u64, at_ms: u64, reason: Option<Reason>, ask: &Ask) -> Admit {
        self.charge_all(at_ms, ask.prompt_tokens);
        if ask.prompt_tokens > 0 {
            self.avg_prompt = Some(match self.avg_prompt {
                Some(a) => (a.saturating_mul(3).saturating_add(ask.prompt_tokens)) / 4,
                None => ask.prompt_tokens,
            });
        }
        let seq = self.sends;
        self.sends = self.sends.saturating_add(1);
        self.in_flight = self.in_flight.saturating_add(1);
        self.ledger.push_back(Sent {
            seq,
            at_ms: at_ms.max(now_ms),
            prompt_tokens: ask.prompt_tokens,
            refused: false,
            admitted: false,
            epoch: self.epoch,
            voided: false,
            patience_until_ms: ask.patience_until_ms.max(now_ms),
        });
        while self.ledger.len() > LEDGER {
            self.ledger.pop_front();
        }
        Admit::Go { seq, at_ms, reason }
    }

    /// Asked by a request that slept until its reservation came due: the instant it may go
    /// at, later than planned when a refusal or a hold since moved the reservations not sent
    /// yet (in the order they were made, so the requests a hold stopped leave spaced out, not
    /// all together when it ends, and never past their patience).
    pub fn confirm(&self, seq: u64, now_ms: u64) -> u64 {
        self.sent(seq).map_or(now_ms, |s| s.at_ms.max(now_ms))
    }

    fn sent(&self, seq: u64) -> Option<Sent> {
        self.ledger.iter().find(|s| s.seq == seq).copied()
    }

    /// Charges one send at `at_ms` to every mirror and to the learnt schedule.
    fn charge_all(&mut self, at_ms: u64, prompt_tokens: u64) {
        for i in 0..self.budgets.len() {
            let cost = self.unit_cost(self.budgets[i].kind, prompt_tokens);
            self.budgets[i].charge(at_ms, cost);
        }
        if let Some(l) = self.learnt.as_mut() {
            l.next_ms = l.next_ms.max(at_ms) + (1.0 / l.per_ms).ceil() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headers::Observation;
    use proptest::prelude::*;

    /// Issue 25: the cap is split max-min fairly between the holders that want it.
    #[test]
    fn issue25_a_fair_share_gives_the_small_what_they_want_and_splits_the_rest() {
        assert_eq!(fair_share(64, &[], 0), 64, "alone: the whole cap");
        assert_eq!(
            fair_share(64, &[50], 0),
            32,
            "two wanting more than half: half each"
        );
        assert_eq!(fair_share(64, &[10], 0), 54, "one wanting little: the rest");
        assert_eq!(fair_share(64, &[10, 50], 0), 27);
        assert_eq!(fair_share(64, &[64, 64, 64], 0), 16);
        assert_eq!(
            fair_share(8, &[], 6),
            2,
            "waiters in the store each want one"
        );
        assert_eq!(
            fair_share(4, &[4, 4, 4, 4, 4], 0),
            1,
            "at least one while any is left"
        );
        assert_eq!(fair_share(4, &[], 9), 0, "nothing left");
    }

    proptest! {
        /// Issue 25: every holder asking for its fair share never overbooks the cap.
        #[test]
        fn issue25_fair_shares_never_sum_past_the_cap(
            wants in proptest::collection::vec(1u32..80, 1..6),
            cap in 1u32..=64,
        ) {
            prop_assume!(wants.len() as u32 <= cap);
            let total: u32 = (0..wants.len())
                .map(|i| {
                    let others: Vec<u32> =
                        wants.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, w)| *w).collect();
                    fair_share(cap, &others, 0).min(wants[i])
                })
                .sum();
            prop_assert!(total <= cap, "{wants:?} at cap {cap}: {total}");
        }
    }

    fn settings(max: u32) -> Settings {
        Settings::new(Mode::Shared, max).unwrap()
    }

    fn ok() -> Outcome {
        Outcome::Success {
            input_tokens: None,
            output_tokens: None,
        }
    }

    fn ask() -> Ask {
        Ask::plain(None)
    }

    fn go(state: &mut ThrottleState, s: &Settings, now: u64) -> (u64, u64) {
        match state.admit(s, now, &ask()) {
            Admit::Go { seq, at_ms, .. } => (seq, at_ms),
            other => panic!("expected Go, got {other:?}"),
        }
    }

    /// A state whose provider has answered enough times, without rate-limit headers, for the
    /// probe window to be open to the cap.
    fn warm(s: &Settings) -> ThrottleState {
        let mut st = ThrottleState::new();
        for _ in 0..8 {
            let (seq, _) = go(&mut st, s, 0);
            st.on_response(s, seq, ok(), &RateHeaders::none(), 0);
        }
        st
    }

    /// An OpenAI head: `limit` a minute, `remaining` left, full again in `to_full` ms.
    fn head(limit: u64, remaining: u64, to_full: u64, at: u64) -> RateHeaders {
        RateHeaders {
            at_ms: Some(at),
            retry_after_ms: None,
            observations: vec![Observation {
                kind: BudgetKind::Requests,
                limit: Some(limit),
                remaining,
                reset_at_ms: at + to_full,
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
    fn the_cap_makes_the_next_send_wait_for_a_finish_whatever_the_patience() {
        let s = settings(2);
        let mut st = warm(&s);
        let (a, _) = go(&mut st, &s, 0);
        go(&mut st, &s, 0);
        let impatient = Ask {
            patience_until_ms: 0,
            ..ask()
        };
        assert_eq!(
            st.admit(&s, 0, &impatient),
            Admit::Full {
                reason: Reason::Concurrency
            }
        );
        st.on_response(&s, a, ok(), &RateHeaders::none(), 1);
        go(&mut st, &s, 1);
    }

    /// REP-8, issue 20: a 429's hold lasts the provider's Retry-After, not the replay wait the
    /// refused request chose (its own backoff never holds anyone else).
    #[test]
    fn rep_8_a_429_holds_new_sends_for_its_retry_after_only() {
        let s = settings(8);
        let mut st = warm(&s);
        let (a, _) = go(&mut st, &s, 1_000);
        let (b, _) = go(&mut st, &s, 1_000);
        let head = RateHeaders {
            at_ms: None,
            retry_after_ms: Some(2_000),
            observations: vec![],
        };
        st.on_response(&s, a, Outcome::RateLimited, &head, 1_100);
        match st.admit(&s, 1_200, &ask()) {
            Admit::Go { at_ms, reason, .. } => {
                assert!(at_ms >= 3_100, "{at_ms}");
                assert_eq!(reason, Some(Reason::Hold));
            }
            other => panic!("{other:?}"),
        }
        // The request already in flight is not touched: it finishes normally.
        st.on_response(&s, b, ok(), &RateHeaders::none(), 1_200);
    }

    /// Issue 20: the hold yields to the policy's ceiling (the patience) and refuses what would
    /// end past the deadline without charging anything.
    #[test]
    fn a_hold_never_outlasts_the_patience_and_is_refused_past_the_deadline() {
        let s = settings(8);
        let mut st = warm(&s);
        let (a, _) = go(&mut st, &s, 0);
        let head = RateHeaders {
            at_ms: None,
            retry_after_ms: Some(30_000),
            observations: vec![],
        };
        st.on_response(&s, a, Outcome::RateLimited, &head, 0);
        let patient_500 = Ask {
            prompt_tokens: 0,
            patience_until_ms: 500,
            deadline_ms: Some(2_000),
        };
        assert!(matches!(
            st.admit(&s, 0, &patient_500),
            Admit::Go {
                at_ms: 500,
                reason: Some(Reason::Hold),
                ..
            }
        ));
        let no_ceiling = Ask {
            patience_until_ms: u64::MAX,
            ..patient_500
        };
        let sends = st.sends;
        assert!(matches!(
            st.admit(&s, 0, &no_ceiling),
            Admit::PastDeadline { until_ms, reason: Reason::Hold | Reason::Pacing } if until_ms >= 30_000
        ));
        assert_eq!(st.sends, sends, "nothing reserved");
    }

    /// Issue 20, the quantized shape OpenAI documents: 120 a minute enforced as one request per
    /// half second. The header's limit is a per-minute figure, not a burst: sends are spaced
    /// about 500 ms apart, never let through together.
    #[test]
    fn a_per_minute_limit_with_a_bucket_of_one_spaces_sends_half_a_second_apart() {
        let s = settings(8);
        let mut st = ThrottleState::new();
        let (a, _) = go(&mut st, &s, 0);
        st.on_response(&s, a, ok(), &head(120, 0, 500, 200), 200);
        let times: Vec<u64> = (0..6).map(|_| go(&mut st, &s, 200).1).collect();
        // 500 ms a unit, counted at 96 % of the rate: about 521 ms apart.
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            assert!((500..=540).contains(&gap), "{times:?}");
        }
        assert!(times[0] >= 500 && times[0] <= 540, "{times:?}");
    }

    #[test]
    fn a_bucket_of_ten_lets_ten_go_at_once_then_paces() {
        let s = settings(64);
        let mut st = ThrottleState::new();
        let (a, _) = go(&mut st, &s, 0);
        st.on_response(&s, a, ok(), &head(120, 9, 500, 0), 0);
        let times: Vec<u64> = (0..12).map(|_| go(&mut st, &s, 0).1).collect();
        assert!(times[..9].iter().all(|&t| t == 0), "{times:?}");
        assert!(times[9] >= 500, "{times:?}");
    }

    #[test]
    fn a_stale_budget_report_does_not_replace_a_newer_one() {
        let s = settings(8);
        let mut st = warm(&s);
        let (old, _) = go(&mut st, &s, 0);
        let (new, _) = go(&mut st, &s, 0);
        st.on_response(&s, new, ok(), &head(60, 0, 1_000, 10), 10);
        st.on_response(&s, old, ok(), &head(60, 50, 100, 20), 20);
        let (_, at) = go(&mut st, &s, 30);
        assert!(at >= 1_000, "{at}");
    }

    /// Issue 20: a token budget is charged the request's own prompt tokens.
    #[test]
    fn token_budgets_are_charged_each_requests_own_prompt_tokens() {
        let s = settings(8);
        let mut st = ThrottleState::new();
        let (a, _) = go(&mut st, &s, 0);
        // 60,000 tokens a minute (one a millisecond), a bucket of 10,000 holding 2,000 now.
        let head = RateHeaders {
            at_ms: Some(0),
            retry_after_ms: None,
            observations: vec![Observation {
                kind: BudgetKind::InputTokens,
                limit: Some(60_000),
                remaining: 2_000,
                reset_at_ms: 8_000,
            }],
        };
        st.on_response(&s, a, ok(), &head, 0);
        let small = Ask {
            prompt_tokens: 1_000,
            ..ask()
        };
        let big = Ask {
            prompt_tokens: 5_000,
            ..ask()
        };
        assert!(matches!(
            st.admit(&s, 0, &small),
            Admit::Go { at_ms: 0, .. }
        ));
        // 1,000 left; 5,000 needs 4,000 more at 0.96 a millisecond.
        match st.admit(&s, 0, &big) {
            Admit::Go { at_ms, reason, .. } => {
                assert!((4_000..=4_200).contains(&at_ms), "{at_ms}");
                assert_eq!(reason, Some(Reason::Pacing));
            }
            other => panic!("{other:?}"),
        }
    }

    /// Issue 20 (the zoo's prompt-token shape, on the wire): sends released together reach the
    /// provider in either order. The head that comes back first was charged first and does not
    /// count the others still in flight; the mirror charges them, so a third send waits for
    /// the tokens instead of being let through where the bucket holds none.
    #[test]
    fn issue20_a_head_does_not_count_the_sends_that_raced_it_and_are_still_in_flight() {
        let s = settings(8);
        let tokens = |remaining: u64, at_ms: u64| RateHeaders {
            at_ms: Some(at_ms),
            retry_after_ms: None,
            observations: vec![Observation {
                kind: BudgetKind::InputTokens,
                limit: Some(60_000),
                remaining,
                // One token a millisecond: full again after what is missing.
                reset_at_ms: at_ms + (10_000 - remaining),
            }],
        };
        let big = Ask {
            prompt_tokens: 4_000,
            ..ask()
        };
        let mut st = ThrottleState::new();
        let Admit::Go { seq: first, .. } = st.admit(&s, 0, &ask()) else {
            panic!()
        };
        st.on_response(&s, first, ok(), &tokens(10_000, 0), 0);
        let admit = |st: &mut ThrottleState, t| match st.admit(&s, t, &big) {
            Admit::Go { seq, at_ms, .. } => (seq, at_ms),
            other => panic!("{other:?}"),
        };
        let (a, at_a) = admit(&mut st, 10);
        let (b, at_b) = admit(&mut st, 10);
        assert_eq!((at_a, at_b), (10, 10), "the bucket holds both");
        // The provider took b first: its head counts b only (10,000 - 4,000), and comes back
        // first, with a still in flight.
        st.on_response(&s, b, ok(), &tokens(6_000, 210), 210);
        let (_, at_c) = admit(&mut st, 215);
        assert!(
            at_c >= 10 + 2_000,
            "a third send waits for 4,000 tokens past a's charge (at {at_c})"
        );
        // a's head, charged after b's, comes back after it: it counts both and is kept,
        // though its seq is older.
        st.on_response(&s, a, ok(), &tokens(2_000, 212), 212);
        let (_, at_d) = admit(&mut st, 220);
        assert!(at_d > at_c, "{at_d} after {at_c}");
    }

    /// Issue 20: a provider that says nothing of its limits is probed, not flooded: 1, 1, 2, 4
    /// requests in flight as it answers; one rate-limit header opens the window to the cap.
    #[test]
    fn a_provider_that_says_nothing_is_probed_one_two_four() {
        let s = settings(8);
        let mut st = ThrottleState::new();
        for window in [1, 1, 2, 4, 8] {
            let seqs: Vec<u64> = (0..window).map(|_| go(&mut st, &s, 0).0).collect();
            assert_eq!(
                st.admit(&s, 0, &ask()),
                Admit::Full {
                    reason: if window == 8 {
                        Reason::Concurrency
                    } else {
                        Reason::Adaptive
                    }
                },
                "window {window}"
            );
            // One answer at a time widens it, as each answer comes.
            for q in seqs {
                st.on_response(&s, q, ok(), &RateHeaders::none(), 0);
            }
        }
        let mut fresh = ThrottleState::new();
        let (a, _) = go(&mut fresh, &s, 0);
        fresh.on_response(&s, a, ok(), &head(600, 10, 1_000, 0), 0);
        for _ in 0..8 {
            go(&mut fresh, &s, 0);
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

    /// Issue 20: without headers, the first refusal sets a rate from its Retry-After and the
    /// last admitted send; sends are then spaced by it.
    #[test]
    fn without_headers_a_refusal_teaches_a_request_rate() {
        let s = settings(8);
        let mut st = warm(&s);
        let (a, _) = go(&mut st, &s, 0);
        st.on_response(&s, a, ok(), &RateHeaders::none(), 200);
        let (b, _) = go(&mut st, &s, 200);
        let refusal = RateHeaders {
            at_ms: Some(200),
            retry_after_ms: Some(300),
            observations: vec![],
        };
        st.on_response(&s, b, Outcome::RateLimited, &refusal, 200);
        let times: Vec<u64> = (0..3).map(|_| go(&mut st, &s, 200).1).collect();
        // Nothing before the Retry-After; then one unit takes between what the refusal (200 ms
        // after an admitted send) and the Retry-After (500 ms after it) say.
        assert_eq!(times[0], 500, "{times:?}");
        let gap = times[1] - times[0];
        assert!((200..=500).contains(&gap), "{times:?}");
        assert_eq!(times[2] - times[1], gap, "{times:?}");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit(u64),
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
            3 => (0u64..20_000).prop_map(Op::Admit),
            3 => (any::<usize>(), 0u8..4, 0u64..5_000, 0u64..20, 0u64..5_000).prop_map(
                |(pick, kind, retry_after_ms, remaining, reset_in)| Op::Finish { pick, kind, retry_after_ms, remaining, reset_in }
            ),
            2 => (0u64..2_000).prop_map(Op::Tick),
        ]
    }

    proptest! {
        /// Whatever happens: never more than the cap in flight, never a reservation past the
        /// patience or before now, never one past the deadline.
        #[test]
        fn never_more_than_the_cap_nor_past_the_patience(max in 1u32..=64, ops in prop::collection::vec(op(), 1..300)) {
            let s = settings(max);
            let mut st = ThrottleState::new();
            let mut now = 0u64;
            let mut flying: Vec<u64> = vec![];
            for op in ops {
                match op {
                    Op::Admit(patience) => {
                        let a = Ask { prompt_tokens: patience % 3_000, patience_until_ms: now + patience, deadline_ms: Some(now + 10_000) };
                        match st.admit(&s, now, &a) {
                            Admit::Go { seq, at_ms, .. } => {
                                prop_assert!(at_ms >= now && at_ms <= now + patience, "{} not in {}..={}", at_ms, now, now + patience);
                                flying.push(seq);
                            }
                            Admit::PastDeadline { until_ms, .. } => prop_assert!(until_ms > now + 10_000),
                            Admit::Full { .. } => {}
                        }
                    }
                    Op::Finish { pick, kind, retry_after_ms, remaining, reset_in } if !flying.is_empty() => {
                        let seq = flying.remove(pick % flying.len());
                        let outcome = match kind {
                            0 => Outcome::RateLimited,
                            1 => Outcome::Failed,
                            _ => ok(),
                        };
                        let head = RateHeaders { at_ms: Some(now),
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
            }
        }

        /// A hold is never shorter than the Retry-After that caused it (patience allowing).
        #[test]
        fn a_hold_is_never_shorter_than_the_retry_after(
            retry_after in 0u64..MAX_HOLD_MS,
            at in 0u64..1_000_000,
            probe in 0u64..MAX_HOLD_MS,
        ) {
            let s = settings(8);
            let mut st = warm(&s);
            let Admit::Go { seq, .. } = st.admit(&s, at, &ask()) else { unreachable!() };
            let head = RateHeaders { at_ms: None, retry_after_ms: Some(retry_after), observations: vec![] };
            st.on_response(&s, seq, Outcome::RateLimited, &head, at);
            let t = at + probe;
            let Admit::Go { at_ms, .. } = st.admit(&s, t, &ask()) else { unreachable!() };
            prop_assert!(at_ms >= at + retry_after, "{} before {}", at_ms, at + retry_after);
        }

        /// The mirror of a per-minute limit never reserves more sends by any instant than the
        /// provider's bucket (size `burst`, refilled at limit a minute) could have let through.
        #[test]
        fn the_mirror_never_reserves_more_than_the_bucket_refills(
            limit in 1u64..600,
            burst_pick in 0u64..600,
            asks in prop::collection::vec(0u64..3_000, 1..120),
        ) {
            let burst = 1 + burst_pick % limit;
            let s = settings(64);
            let mut st = ThrottleState::new();
            let Admit::Go { seq, .. } = st.admit(&s, 0, &ask()) else { unreachable!() };
            let per_ms = limit as f64 / 60_000.0;
            // The provider's bucket was full and took the first send.
            let to_full = (1.0 / per_ms).ceil() as u64;
            st.on_response(&s, seq, ok(), &head(limit, burst - 1, to_full, 0), 0);
            let mut now = 0u64;
            let mut reserved = vec![];
            for gap in asks {
                now += gap;
                if let Admit::Go { seq, at_ms, .. } = st.admit(&s, now, &ask()) {
                    reserved.push(at_ms);
                    st.on_response(&s, seq, ok(), &RateHeaders::none(), at_ms);
                }
            }
            reserved.sort_unstable();
            for (i, &first) in reserved.iter().enumerate() {
                for (j, &last) in reserved.iter().enumerate().skip(i) {
                    let allowed = burst as f64 + per_ms * (last - first) as f64 + 1e-6;
                    prop_assert!((j - i + 1) as f64 <= allowed, "{} sends in {} ms", j - i + 1, last - first);
                }
            }
        }
    }
}
