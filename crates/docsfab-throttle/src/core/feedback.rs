//! Feeding back how a send went: a response's outcome and head set the mirrored buckets, a
//! success calibrates the token estimates and grows a cut rate back, and a refusal holds, cuts
//! the rate counted on (once per congestion event) or, without headers, learns a request rate;
//! reservations the change overtook are planned again.

use std::collections::VecDeque;

use super::{
    Budget, CREEP, CUT, DEFAULT_LEARNT_PER_MS, FIRST_GUESS, Learnt, MAX_HOLD_MS, MAX_OUTSIDE,
    MIN_FACTOR, MIN_SPAN_MS, Mode, Outcome, PLATEAU, PLATEAU_GROWTH, RACE_MS, RECOVER,
    SIZE_SAMPLES, SLOW_START, SLOW_START_AHEAD, SLOW_START_CUT, SLOW_START_CUT_MEASURED, Sent,
    Settings, ThrottleState,
};
use crate::headers::{BudgetKind, MAX_RESET_HORIZON_MS, Observation, RateHeaders};

impl ThrottleState {
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
        let refused = outcome == Outcome::RateLimited;
        if let Some(s) = self.ledger.iter_mut().find(|s| s.seq == seq) {
            s.refused = refused;
            s.admitted = matches!(outcome, Outcome::Success { .. });
        }
        self.observe(seq, headers, now_ms);
        match outcome {
            Outcome::Success {
                input_tokens,
                output_tokens,
            } => {
                self.answered = true;
                self.answers = self.answers.saturating_add(1).min(64);
                self.calibrate(seq, input_tokens, output_tokens);
                if !self.is_echo(seq) {
                    self.recover();
                }
            }
            Outcome::RateLimited => {
                self.answered = true;
                // Judged before this refusal's own hold moves the model on.
                let echo = self.is_echo(seq);
                if let Some(ask) = headers.retry_after_ms {
                    let until = now_ms.saturating_add(ask.min(MAX_HOLD_MS));
                    if until > self.hold_until_ms {
                        self.hold_until_ms = until;
                        self.void_pending(now_ms);
                    }
                }
                self.refused(seq, headers, now_ms, echo);
            }
            Outcome::Failed | Outcome::Abandoned => {}
        }
    }

    /// The provider's tokens per estimated token, and the mean output of an answer.
    fn calibrate(&mut self, seq: u64, input: Option<u64>, output: Option<u64>) {
        if let (Some(sent), Some(input)) = (self.sent(seq), input)
            && sent.prompt_tokens > 0
            && input > 0
        {
            let sample = (input as f64 / sent.prompt_tokens as f64).clamp(0.25, 4.0);
            self.token_ratio = Some(match self.token_ratio {
                Some(r) => r * 0.75 + sample * 0.25,
                None => sample,
            });
        }
        if let Some(o) = output.filter(|&o| o > 0) {
            self.avg_output = Some(match self.avg_output {
                Some(a) => (a.saturating_mul(3).saturating_add(o)) / 4,
                None => o,
            });
        }
    }

    /// Whether a response belongs to an earlier state of the model: its send was planned
    /// before the last refusal or hold changed it (it says nothing about the rates counted on
    /// now). A send not in the ledger any more is judged by its seq.
    fn is_echo(&self, seq: u64) -> bool {
        self.sent(seq)
            .map_or(seq < self.cut_seq, |s| s.epoch < self.epoch)
    }

    /// A success after the last cut: the rates counted on grow back towards what the provider
    /// says (or, learnt, probe upwards).
    pub(super) fn recover(&mut self) {
        for b in &mut self.budgets {
            b.factor = (b.factor * RECOVER).min(1.0);
        }
        let measured = admitted_rate(&self.ledger);
        if let Some(l) = self.learnt.as_mut() {
            if l.slow_start
                && let Some(m) = measured
                && l.per_ms > m * SLOW_START_AHEAD
            {
                // The sends planned at the slower rates are still going out; growth waits
                // until what the provider admits catches up.
                return;
            }
            l.per_ms *= match l.refused_at_per_ms {
                _ if l.slow_start => SLOW_START,
                // Back quickly to just below the rate that was refused, then only creep.
                Some(refused) if l.per_ms < refused * PLATEAU => PLATEAU_GROWTH,
                _ => CREEP,
            };
        }
    }

    /// A refusal: the bucket that refused is empty now, and unless it is an echo of the last
    /// congestion event (a send granted before the last cut), the rate counted on is cut.
    fn refused(&mut self, seq: u64, headers: &RateHeaders, now_ms: u64, echo: bool) {
        let prompt = self.sent(seq).map_or(0, |s| s.prompt_tokens);
        // The budgets that could not pay for it: those its head reports short, or else the
        // tightest one the mirror knows.
        let reported_short: Vec<BudgetKind> = headers
            .observations
            .iter()
            .filter(|o| (o.remaining as f64) < self.unit_cost(o.kind, prompt))
            .map(|o| o.kind)
            .collect();
        let tightest = self
            .budgets
            .iter()
            .min_by(|a, b| {
                let ra = a.level_at(now_ms) / self.unit_cost(a.kind, prompt);
                let rb = b.level_at(now_ms) / self.unit_cost(b.kind, prompt);
                ra.total_cmp(&rb)
            })
            .map(|b| b.kind);
        let short = if reported_short.is_empty() {
            tightest.into_iter().collect()
        } else {
            reported_short
        };
        for b in self.budgets.iter_mut().filter(|b| short.contains(&b.kind)) {
            // A head that reports the budget already set the mirror (and what other clients
            // took); one that does not leaves only the refusal to learn from: the bucket is
            // empty, and the rate counted on was too high.
            if headers.observations.iter().all(|o| o.kind != b.kind) {
                b.level = b.level_at(now_ms).min(0.0);
                b.level_ms = b.level_ms.max(now_ms);
                if !echo {
                    b.factor = (b.factor * CUT).max(MIN_FACTOR);
                }
            }
        }
        if self.budgets.iter().all(|b| b.per_ms.is_none()) {
            self.learn_from_refusal(seq, headers.retry_after_ms, now_ms, echo);
        }
        if !echo {
            self.cut_seq = self.sends;
            self.void_pending(now_ms);
        }
    }

    /// The model changed (a refusal, a hold): every reservation not sent yet is planned
    /// again, in the order it was made, behind the hold and at the rates now counted on.
    fn void_pending(&mut self, now_ms: u64) {
        self.epoch += 1;
        let mut pending = vec![];
        for (i, s) in self.ledger.iter_mut().enumerate() {
            if s.at_ms > now_ms && !s.refused && !s.admitted {
                s.voided = true;
                pending.push(i);
            }
        }
        for i in 0..self.budgets.len() {
            let b = &self.budgets[i];
            if b.report_ms == 0 {
                continue;
            }
            let later = self.uncounted_costs(b.report_seq, b.report_ms, b.kind);
            let b = &mut self.budgets[i];
            b.level = b.report_level;
            b.level_ms = b.report_ms;
            for (at, cost) in later {
                b.charge(at, cost);
            }
        }
        let restart = now_ms.max(self.hold_until_ms);
        if let Some(l) = self.learnt.as_mut() {
            l.next_ms = restart;
        }
        for i in pending {
            let s = self.ledger[i];
            let at_ms = self
                .pacing_at(restart, s.prompt_tokens)
                .min(s.patience_until_ms.max(now_ms));
            self.charge_all(at_ms, s.prompt_tokens);
            let s = &mut self.ledger[i];
            s.at_ms = at_ms;
            s.voided = false;
            s.epoch = self.epoch;
        }
    }

    /// Without a rate from the headers: the first refusal sets a rate (from Retry-After and the
    /// last admitted send), every later one cuts it.
    fn learn_from_refusal(&mut self, seq: u64, retry_after: Option<u64>, now_ms: u64, echo: bool) {
        let after = now_ms.saturating_add(retry_after.unwrap_or(0));
        match self.learnt.as_mut() {
            Some(l) => {
                if !echo {
                    // Out of slow start the rate the provider was seen to admit is the better
                    // guide to where it refuses; later, the rate refused.
                    let measured = admitted_rate(&self.ledger).unwrap_or(f64::MAX);
                    l.refused_at_per_ms = Some(if l.slow_start {
                        l.per_ms.min(measured)
                    } else {
                        l.per_ms
                    });
                    l.per_ms = if l.slow_start {
                        // Slow start overshot by the steps still in flight: the rate the
                        // provider was seen to admit is the better guide.
                        (l.per_ms * SLOW_START_CUT).min(measured * SLOW_START_CUT_MEASURED)
                    } else {
                        l.per_ms * CUT
                    }
                    .max(1e-6);
                    l.slow_start = false;
                }
                l.next_ms = l.next_ms.max(after);
            }
            None => {
                // The last admitted send before this one emptied the bucket (assume a bucket
                // of one). The refusal says a unit takes longer than the time from that send
                // to this one; the Retry-After says the next unit comes by then at the latest.
                // Start between the two bounds (in proportion), or at one a second.
                let last_admitted = self
                    .ledger
                    .iter()
                    .filter(|s| s.seq < seq && s.admitted)
                    .map(|s| s.at_ms)
                    .max();
                let refused_at = self.sent(seq).map_or(now_ms, |s| s.at_ms);
                let slowest = match (retry_after, last_admitted) {
                    (Some(_), Some(a)) => Some(after.saturating_sub(a)),
                    (Some(ra), None) => Some(ra),
                    (None, _) => None,
                }
                .filter(|&p| p > 0)
                .map(|p| 1.0 / p as f64);
                let fastest = last_admitted
                    .map(|a| refused_at.saturating_sub(a))
                    .filter(|&p| p > 0)
                    .map(|p| 1.0 / p as f64);
                let per_ms = match (slowest, fastest) {
                    (Some(lo), Some(hi)) if hi > lo => (lo * hi).sqrt() * FIRST_GUESS,
                    (Some(lo), _) => lo,
                    (None, _) => DEFAULT_LEARNT_PER_MS,
                };
                self.learnt = Some(Learnt {
                    per_ms,
                    refused_at_per_ms: None,
                    slow_start: true,
                    next_ms: after,
                });
            }
        }
    }

    /// Sets each reported bucket's mirror from the report, unless a newer send's report is
    /// already in it; then charges the sends reserved after the reported one again.
    pub(super) fn observe(&mut self, seq: u64, headers: &RateHeaders, now_ms: u64) {
        let head_ms = headers.at_ms.map_or(now_ms, |at| at.min(now_ms));
        // The provider charged the send when it arrived: its reserved instant, near enough.
        let charged_ms = self.sent(seq).map_or(head_ms, |s| s.at_ms.min(head_ms));
        let races = |b: &Budget| b.report_ms.abs_diff(charged_ms) <= RACE_MS;
        for &o in &headers.observations {
            let idx = match self.budgets.iter().position(|b| b.kind == o.kind) {
                // An older send's head is stale, unless the two raced: then the head that
                // comes back later was charged later, and counts what the earlier one did not.
                Some(i) if self.budgets[i].report_seq > seq && !races(&self.budgets[i]) => continue,
                Some(i) => i,
                None => {
                    self.budgets.push(Budget {
                        kind: o.kind,
                        per_ms: None,
                        burst: 1.0,
                        sizes: vec![],
                        level: 0.0,
                        level_ms: 0,
                        factor: 1.0,
                        outside: 0.0,
                        reset_at_ms: 0,
                        report_seq: 0,
                        report_ms: 0,
                        report_level: 0.0,
                    });
                    self.budgets.len() - 1
                }
            };
            let later = self.uncounted_costs(seq, charged_ms, o.kind);
            let predicted = self.predicted_level(&self.budgets[idx], seq, charged_ms);
            let older = self.budgets[idx].report_seq > seq;
            let before = self.budgets[idx].clone();
            let b = &mut self.budgets[idx];
            set_from_report(b, &o, head_ms, charged_ms);
            if let (Some((predicted, span)), Some(per_ms)) = (predicted, b.per_ms)
                && b.kind == BudgetKind::Requests
                && span >= MIN_SPAN_MS
            {
                let taken = (predicted - b.level).max(0.0) / (per_ms * span as f64);
                b.outside = (b.outside * 0.8 + taken.min(MAX_OUTSIDE) * 0.2).min(MAX_OUTSIDE);
            }
            b.report_level = b.level;
            b.report_seq = seq;
            b.report_ms = charged_ms;
            for (at, cost) in later {
                b.charge(at, cost);
            }
            // A racing older head that leaves more than the newer one did is one that was slow
            // to come back (a long answer), not one charged later: the newer head stands.
            if older && b.level_at(now_ms) > before.level_at(now_ms) {
                *b = before;
            }
        }
        // A budget whose report lapsed (a daily quota past its horizon) is forgotten.
        self.budgets.retain(|b| {
            b.per_ms.is_some()
                || b.reset_at_ms > now_ms
                || now_ms.saturating_sub(b.report_ms) < MAX_RESET_HORIZON_MS
        });
        if self.budgets.iter().any(|b| b.per_ms.is_some()) {
            self.learnt = None;
        }
    }

    /// What the bucket would hold just after the send `seq` if only our own sends since the
    /// previous report had taken from it, and the span that covers (requests only: a request
    /// costs exactly one, so the difference is what other clients took).
    fn predicted_level(&self, b: &Budget, seq: u64, charged_ms: u64) -> Option<(f64, u64)> {
        let per_ms = b.per_ms?;
        if b.report_ms == 0 || seq <= b.report_seq || charged_ms <= b.report_ms {
            return None;
        }
        let (mut level, mut t) = (b.report_level, b.report_ms);
        let ours = self
            .ledger
            .iter()
            .filter(|s| s.seq > b.report_seq && s.seq <= seq && !s.refused && !s.voided);
        for s in ours {
            let at = s.at_ms.max(t).min(charged_ms);
            level = (level + per_ms * (at - t) as f64).min(b.burst) - 1.0;
            t = at;
        }
        level = (level + per_ms * (charged_ms - t) as f64).min(b.burst);
        Some((level, charged_ms - b.report_ms))
    }

    /// The sends a head of the send `seq` (charged at `charged_ms`) may not count, with what
    /// each costs the budget `kind`: the sends reserved after it, and those that raced it
    /// (reserved within `RACE_MS`) and have not been answered yet. Of racing sends, arrival
    /// order at the provider is unknown; answers come back in that order (the provider takes
    /// about as long for each), so a racing send answered already was charged before this one
    /// and is counted in its head, and one still in flight was charged after. Without this, a
    /// burst released together would be charged once too few (two sends let through where the
    /// bucket held one).
    fn uncounted_costs(&self, seq: u64, charged_ms: u64, kind: BudgetKind) -> Vec<(u64, f64)> {
        self.ledger
            .iter()
            .filter(|s| s.seq != seq && !s.refused && !s.voided)
            .filter(|s| {
                let racing = s.at_ms.abs_diff(charged_ms) <= RACE_MS;
                if racing { !s.admitted } else { s.seq > seq }
            })
            .map(|s| (s.at_ms, self.unit_cost(kind, s.prompt_tokens)))
            .collect()
    }
}

/// The rate at which the provider admitted the last sends it admitted (per millisecond), when
/// there are enough of them to tell.
fn admitted_rate(ledger: &VecDeque<Sent>) -> Option<f64> {
    let times: Vec<u64> = ledger
        .iter()
        .rev()
        .filter(|s| s.admitted)
        .take(5)
        .map(|s| s.at_ms)
        .collect();
    let (newest, oldest) = (*times.first()?, *times.last()?);
    (times.len() >= 4 && newest > oldest)
        .then(|| (times.len() - 1) as f64 / (newest - oldest) as f64)
}

/// The bucket as one report describes it: rate from the per-minute limit, size from what is
/// left plus what refills until full, level from the time still missing to full.
fn set_from_report(b: &mut Budget, o: &Observation, head_ms: u64, charged_ms: u64) {
    let to_full = o.reset_at_ms.saturating_sub(head_ms) as f64;
    let remaining = o.remaining as f64;
    b.reset_at_ms = o.reset_at_ms;
    match o.limit.filter(|&l| l > 0) {
        Some(limit) => {
            let per_ms = limit as f64 / 60_000.0;
            b.per_ms = Some(per_ms);
            // Whole units are reported, so the size is the next whole unit above what is left
            // plus what refills until full (a hair less, for a reset rounded up to the ms).
            // The smallest recent estimate wins: a reset rounded to the second only overstates.
            let size = (remaining + per_ms * to_full - 0.01)
                .ceil()
                .clamp(1.0, limit as f64);
            b.sizes.push(size);
            if b.sizes.len() > SIZE_SAMPLES {
                b.sizes.remove(0);
            }
            b.burst = b
                .sizes
                .iter()
                .copied()
                .fold(f64::MAX, f64::min)
                .max(remaining);
            // Whole units are reported; the time to full tells the fraction.
            let level = (b.burst - per_ms * to_full).clamp(remaining, remaining + 0.999);
            b.level = level;
        }
        None => {
            b.per_ms = None;
            b.burst = b.burst.max(remaining).max(1.0);
            b.level = remaining;
        }
    }
    b.level_ms = charged_ms;
}
