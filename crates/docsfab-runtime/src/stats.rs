//! Retry figures across stored run records, for `docsfab runs stats` (issue 13) and for any
//! later reader of the same figures (a fault model drawn from the store, budget sizing).
//!
//! Pure: [`Stats::from_records`] reads records the caller loaded and a [`Filter`] whose cut-off
//! the caller computed from its clock; nothing here touches the store or the time.
//!
//! What the record lets us count, and the readings chosen where it is silent:
//! - a turn sent one request plus one per replay;
//! - a completed turn's replays are a burst of faults that ended in success; a failed turn that
//!   ended its attempt on a provider failure adds its last request to the burst that gave up;
//! - after a 429 replay, the next request is the next replay's cause, or else the turn's end:
//!   a completed turn answered, and a failed last turn was a 429 again when its attempt records
//!   HTTP 429. Cancelled turns say nothing and are left out.

use std::collections::BTreeMap;

use serde::Serialize;

use docsfab_record::{
    AttemptRecord, AttemptStatus, ReplayCause, RetryDecision, RunRecord, TurnRecord, TurnStatus,
    round_usd,
};

/// The provider name of a record that has none (written before records named their provider).
pub const UNKNOWN_PROVIDER: &str = "(unknown)";

/// Which runs count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Runs started at or after this RFC 3339 UTC time (the record's own format, so the
    /// strings compare as the times do).
    pub started_at_or_after: Option<String>,
    /// Runs whose record names this provider; [`UNKNOWN_PROVIDER`] selects runs that name none.
    pub provider: Option<String>,
}

impl Filter {
    fn admits(&self, r: &RunRecord) -> bool {
        let since_ok = self
            .started_at_or_after
            .as_deref()
            .is_none_or(|cut| r.started_at.as_str() >= cut);
        since_ok && self.provider.as_deref().is_none_or(|p| provider_of(r) == p)
    }
}

/// The provider name a record counts under: its own, else [`UNKNOWN_PROVIDER`].
pub fn provider_of(r: &RunRecord) -> &str {
    r.provider
        .as_ref()
        .map_or(UNKNOWN_PROVIDER, |p| p.name.as_str())
}

/// Counts by a name (a class, a rule, a cause), sorted by name.
pub type Counts = BTreeMap<String, u64>;

/// The figures; the JSON shape `runs stats --json` prints (docs/observability.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Runs counted.
    pub runs: u64,
    /// Runs counted, by the provider their record names.
    pub runs_by_provider: Counts,
    pub steps: u64,
    /// Steps carried over from an earlier run (`reusedFrom`) instead of run; they have no
    /// attempts here.
    pub reused_steps: u64,
    /// Runs that carried at least one step over.
    pub runs_with_reused_steps: u64,
    /// `reusedSteps / steps`; `null` with no step.
    pub reuse_rate: Option<f64>,
    pub attempts: u64,
    pub turns: u64,
    /// Provider requests sent: one per turn plus one per replay.
    pub requests: u64,
    pub replays: Tally,
    /// Step retries: failed attempts after which another attempt was scheduled.
    pub step_retries: Tally,
    /// Faults in a row within a turn, by length.
    pub fault_bursts: Bursts,
    /// After a 429 replay: how often the next request got a 429 again, by the wait before it.
    pub rate_limit_repeats: Vec<RepeatBucket>,
    pub waiting_ms: Waiting,
    /// What every attempt spent.
    pub spent: Tokens,
    /// What attempts that did not succeed spent.
    pub failed_attempt_tokens: Tokens,
    /// What step retries spent: every attempt after a step's first.
    pub retry_attempt_tokens: Tokens,
    /// Steps where a retry was allowed by the rules but a budget refused it.
    pub exhausted_steps: Tally,
}

/// A total and its breakdowns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tally {
    pub total: u64,
    /// By provider error class (`server`, `rate-limit`, ...) for replays; by the attempt's
    /// failure class for step retries and exhausted steps.
    pub by_class: Counts,
    /// By the retry rule that decided; empty for replays (the provider's schedule decides).
    pub by_rule: Counts,
    /// By what failed (`HTTP 503`, `connection-dropped`); empty but for replays.
    pub by_cause: Counts,
}

impl Tally {
    fn add(&mut self, class: &str, rule: Option<&str>, cause: Option<String>) {
        self.total += 1;
        *self.by_class.entry(class.to_owned()).or_default() += 1;
        if let Some(rule) = rule {
            *self.by_rule.entry(rule.to_owned()).or_default() += 1;
        }
        if let Some(cause) = cause {
            *self.by_cause.entry(cause).or_default() += 1;
        }
    }
}

/// How many turns had a burst of each length (faults in a row).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bursts {
    /// Turns that completed, by the faults before their answer (0: the first request answered).
    pub before_success: BTreeMap<u32, u64>,
    /// Turns that failed on the provider, by the faults before they gave up.
    pub before_give_up: BTreeMap<u32, u64>,
}

/// One wait-length bucket of the 429-after-429 figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RepeatBucket {
    /// `<1s`, `1-5s`, `5-20s` or `>=20s`: the wait before the next request.
    pub wait: &'static str,
    /// 429s followed by a request whose outcome is known.
    pub after_429: u64,
    /// Of those, the next request got a 429 too.
    pub another_429: u64,
    /// `another429 / after429`; `null` with no sample.
    pub probability: Option<f64>,
}

const BUCKETS: [(&str, u64); 4] = [
    ("<1s", 1_000),
    ("1-5s", 5_000),
    ("5-20s", 20_000),
    (">=20s", u64::MAX),
];

fn bucket_of(wait_ms: u64) -> usize {
    BUCKETS
        .iter()
        .position(|(_, below)| wait_ms < *below)
        .unwrap_or(BUCKETS.len() - 1)
}

/// Time spent waiting, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Waiting {
    /// Waits before in-turn replays.
    pub replay_waits: u64,
    /// Step backoffs before a scheduled attempt.
    pub step_backoffs: u64,
    /// Requests held by the shared provider throttle (`heldMs`; not a replay, not a backoff).
    pub throttle_holds: u64,
    pub total: u64,
}

/// Usage and cost summed over attempts. Unknown usage is not read as 0: an attempt whose
/// usage is unknown is counted apart and left out of the token sums, and one without a cost
/// (no price, or usage unknown) is left out of `costUsd`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tokens {
    /// Over the attempts whose usage is known (reported or estimated).
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_write_tokens: u64,
    pub cache_read_tokens: u64,
    /// Attempts summed.
    pub attempts: u64,
    /// Attempts whose usage is unknown, so not in the token sums.
    pub unknown_usage_attempts: u64,
    /// Attempts whose usage docsfab estimated in part (a cut stream).
    pub estimated_attempts: u64,
    /// Over the attempts with a cost; `null` when none has one.
    pub cost_usd: Option<f64>,
    /// Attempts without a cost (no price set, or usage unknown).
    pub unpriced_attempts: u64,
}

impl Tokens {
    fn add(&mut self, a: &AttemptRecord) {
        self.attempts += 1;
        let u = &a.usage;
        match (u.input_tokens, u.output_tokens) {
            (Some(i), Some(o)) => {
                self.input_tokens = self.input_tokens.saturating_add(i);
                self.output_tokens = self.output_tokens.saturating_add(o);
                self.cache_write_tokens =
                    self.cache_write_tokens.saturating_add(u.cache_write_tokens);
                self.cache_read_tokens = self.cache_read_tokens.saturating_add(u.cache_read_tokens);
            }
            _ => self.unknown_usage_attempts += 1,
        }
        self.estimated_attempts += u64::from(u.estimated);
        match a.cost_usd {
            Some(c) => self.cost_usd = Some(round_usd(self.cost_usd.unwrap_or(0.0) + c)),
            None => self.unpriced_attempts += 1,
        }
    }
}

impl Stats {
    /// The figures over the records `filter` admits.
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = &'a RunRecord>,
        filter: &Filter,
    ) -> Stats {
        let mut acc = Acc::default();
        for r in records.into_iter().filter(|r| filter.admits(r)) {
            acc.run(r);
        }
        acc.finish()
    }
}

/// The running sums.
#[derive(Default)]
struct Acc {
    stats: Stats,
    /// Per bucket: (429s with a known next outcome, of which 429 again).
    repeats: [(u64, u64); 4],
}

impl Acc {
    fn run(&mut self, r: &RunRecord) {
        let s = &mut self.stats;
        s.runs += 1;
        *s.runs_by_provider
            .entry(provider_of(r).to_owned())
            .or_default() += 1;
        let reused = r.steps.iter().filter(|s| s.reused_from.is_some()).count() as u64;
        s.reused_steps += reused;
        s.runs_with_reused_steps += u64::from(reused > 0);
        for step in &r.steps {
            self.stats.steps += 1;
            let exhausted = step
                .attempts
                .iter()
                .find(|a| a.retry.decision == RetryDecision::Exhausted);
            if let Some(a) = exhausted {
                self.stats
                    .exhausted_steps
                    .add(class_of(a), a.retry_rule.as_deref(), None);
            }
            for a in &step.attempts {
                self.attempt(a);
            }
        }
    }

    fn attempt(&mut self, a: &AttemptRecord) {
        let s = &mut self.stats;
        s.attempts += 1;
        s.spent.add(a);
        if a.status != AttemptStatus::Succeeded {
            s.failed_attempt_tokens.add(a);
        }
        if a.attempt > 1 {
            s.retry_attempt_tokens.add(a);
        }
        if a.retry.decision == RetryDecision::Scheduled {
            s.step_retries
                .add(class_of(a), a.retry_rule.as_deref(), None);
            s.waiting_ms.step_backoffs += a.wait_ms.unwrap_or(0);
        }
        for (i, t) in a.turns.iter().enumerate() {
            let last = i + 1 == a.turns.len();
            // The attempt's provider failure is this turn's last request only when the turn
            // ended the attempt.
            let ended_on_provider = last && a.provider_error_class.is_some();
            let final_429 = ended_on_provider && a.http_status == Some(429);
            self.turn(t, ended_on_provider, final_429);
        }
    }

    fn turn(&mut self, t: &TurnRecord, ended_on_provider: bool, final_429: bool) {
        let s = &mut self.stats;
        let replays = u32::try_from(t.replays.len()).unwrap_or(u32::MAX);
        s.turns += 1;
        s.requests += 1 + u64::from(replays);
        for r in &t.replays {
            s.replays.add(
                r.provider_error_class.as_str(),
                None,
                Some(r.cause.to_string()),
            );
            s.waiting_ms.replay_waits += r.wait_ms;
        }
        s.waiting_ms.throttle_holds += t.held_ms;
        match t.status {
            TurnStatus::Completed => {
                *s.fault_bursts.before_success.entry(replays).or_default() += 1;
            }
            TurnStatus::Failed => {
                let burst = replays + u32::from(ended_on_provider);
                *s.fault_bursts.before_give_up.entry(burst).or_default() += 1;
            }
            TurnStatus::Cancelled => {}
        }
        // The outcome of the request after each replay: the next replay's cause, or the turn's
        // end.
        for (i, r) in t.replays.iter().enumerate() {
            if r.cause != ReplayCause::Status(429) {
                continue;
            }
            let next_429 = match t.replays.get(i + 1) {
                Some(next) => Some(next.cause == ReplayCause::Status(429)),
                None => match t.status {
                    TurnStatus::Completed => Some(false),
                    TurnStatus::Failed => Some(final_429),
                    TurnStatus::Cancelled => None,
                },
            };
            if let Some(again) = next_429 {
                let b = &mut self.repeats[bucket_of(r.wait_ms)];
                b.0 += 1;
                b.1 += u64::from(again);
            }
        }
    }

    fn finish(mut self) -> Stats {
        let w = &mut self.stats.waiting_ms;
        w.total = w.replay_waits + w.step_backoffs + w.throttle_holds;
        let (steps, reused) = (self.stats.steps, self.stats.reused_steps);
        // Counts far below 2^53: exact as floats.
        self.stats.reuse_rate = (steps > 0).then(|| reused as f64 / steps as f64);
        self.stats.rate_limit_repeats = BUCKETS
            .iter()
            .zip(self.repeats)
            .map(|((wait, _), (after, again))| RepeatBucket {
                wait,
                after_429: after,
                another_429: again,
                // Counts far below 2^53: exact as floats.
                probability: (after > 0).then(|| again as f64 / after as f64),
            })
            .collect();
        self.stats
    }
}

/// An attempt's failure class as the record names it, `(none)` when it names none.
fn class_of(a: &AttemptRecord) -> &str {
    a.failure_class.as_deref().unwrap_or("(none)")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use docsfab_record::{
        Access, Budget, Disposition, LeaseRecord, LeaseStop, ProviderErrorClass, ReplayRecord,
        Retry, RunProvider, RunStatus, StepRecord, TransportRetry, Usage,
    };

    use super::*;
    use crate::ledger::BatchBuilder;

    fn replay(status: u16, wait_ms: u64) -> ReplayRecord {
        ReplayRecord {
            cause: ReplayCause::Status(status),
            provider_error_class: if status == 429 {
                ProviderErrorClass::RateLimit
            } else {
                ProviderErrorClass::Server
            },
            wait_ms,
            retry_after_ms: None,
            held_ms: 0,
        }
    }

    fn turn(status: TurnStatus, replays: Vec<ReplayRecord>) -> TurnRecord {
        TurnRecord {
            cost_usd: None,
            turn: 1,
            status,
            replays,
            tool_batch: BatchBuilder::new().build(),
            usage: Usage::ZERO,
            reason: None,
            held_ms: 0,
            duration_ms: None,
            warnings: Vec::new(),
        }
    }

    /// A succeeded attempt of `turns`.
    fn attempt(turns: Vec<TurnRecord>) -> AttemptRecord {
        AttemptRecord {
            cost_usd: None,
            attempt: 1,
            budget: Budget::Initial,
            status: AttemptStatus::Succeeded,
            started_at: "2026-11-29T20:00:00.000Z".into(),
            provider_error_class: None,
            http_status: None,
            retry_after_ms: None,
            gateway: None,
            failure_category: None,
            failure_class: None,
            code: None,
            message: None,
            answer_excerpt: None,
            answer_bytes: None,
            timeout_kind: None,
            output_constraint: None,
            grounding: None,
            retry_rule: None,
            retry: Retry {
                decision: RetryDecision::None,
            },
            wait_ms: None,
            write_settlement: None,
            write_restore: None,
            files_written: None,
            usage: Usage {
                input_tokens: Some(100),
                output_tokens: Some(10),
                ..Usage::ZERO
            },
            duration_ms: 1,
            lease: LeaseRecord {
                max_turns: 12,
                turns_used: 1,
                executed_tool_calls: 0,
                tool_counters: BTreeMap::new(),
                stop_reason: LeaseStop::ProviderFailed,
                disposition: Disposition::Failed,
                evidence: None,
            },
            turns,
        }
    }

    /// An attempt that failed on the provider with `http` after `turns`, then `decision`.
    fn failed(
        turns: Vec<TurnRecord>,
        http: u16,
        decision: RetryDecision,
        wait_ms: Option<u64>,
    ) -> AttemptRecord {
        AttemptRecord {
            status: AttemptStatus::Failed,
            provider_error_class: Some(ProviderErrorClass::Server),
            http_status: Some(http),
            failure_class: Some("infrastructure".into()),
            retry_rule: Some("transport".into()),
            retry: Retry { decision },
            wait_ms,
            ..attempt(turns)
        }
    }

    fn run(started_at: &str, provider: Option<&str>, attempts: Vec<AttemptRecord>) -> RunRecord {
        RunRecord {
            cost_usd: None,
            truthfulness: None,
            usage: docsfab_record::Usage::ZERO,
            run_id: format!("run-{started_at}"),
            composition: "c".into(),
            status: RunStatus::Succeeded,
            started_at: started_at.into(),
            ended_at: None,
            workspace: None,
            provider: provider.map(|name| RunProvider {
                name: name.into(),
                api: docsfab_record::Api::OpenaiChat,
                host: "127.0.0.1".into(),
            }),
            model: None,
            docsfab_version: None,
            held_ms: 0,
            end_reason: None,
            steps: vec![StepRecord {
                cost_usd: None,
                truthfulness: None,
                usage: docsfab_record::Usage::ZERO,
                step_id: "s".into(),
                access: Access::ReadOnly,
                status: RunStatus::Succeeded,
                configured_max_retries: 3,
                effective_max_retries: 3,
                transport_retry: TransportRetry {
                    max_transport_retries: 6,
                    transport_max_delay_ms: 60_000,
                    transport_max_elapsed_ms: 3_600_000,
                    base_delay_ms: 1000,
                },
                failure: None,
                output: None,
                interrupted_attempt: None,
                for_each: None,
                held_ms: 0,
                attempts,
                fingerprint: None,
                inputs: None,
                reused_from: None,
                files_written: None,
            }],
            resumed_from: None,
        }
    }

    /// Issue 13: 503, 503, ok in one turn; 429 (300 ms), 429 (2 s), ok in another; a turn that
    /// gave up after two 503 replays and a third 503, retried by the step after 1.5 s, whose
    /// retry then exhausted the budget on 429 after a 429.
    fn sample() -> Vec<RunRecord> {
        vec![
            run(
                "2026-11-29T10:00:00.000Z",
                Some("sim"),
                vec![attempt(vec![
                    turn(
                        TurnStatus::Completed,
                        vec![replay(503, 100), replay(503, 200)],
                    ),
                    turn(
                        TurnStatus::Completed,
                        vec![replay(429, 300), replay(429, 2000)],
                    ),
                ])],
            ),
            run(
                "2026-11-30T10:00:00.000Z",
                None,
                vec![
                    failed(
                        vec![
                            turn(TurnStatus::Completed, vec![]),
                            turn(TurnStatus::Failed, vec![replay(503, 100), replay(503, 100)]),
                        ],
                        503,
                        RetryDecision::Scheduled,
                        Some(1500),
                    ),
                    failed(
                        vec![turn(TurnStatus::Failed, vec![replay(429, 6000)])],
                        429,
                        RetryDecision::Exhausted,
                        None,
                    ),
                ],
            ),
        ]
    }

    #[test]
    fn issue13_stats_count_requests_replays_retries_bursts_waits_and_failed_tokens() {
        let s = Stats::from_records(&sample(), &Filter::default());
        assert_eq!((s.runs, s.steps, s.attempts, s.turns), (2, 2, 3, 5));
        assert_eq!(
            s.runs_by_provider,
            Counts::from([("(unknown)".into(), 1), ("sim".into(), 1)])
        );
        // 5 turns + 7 replays.
        assert_eq!(s.requests, 12);
        assert_eq!(s.replays.total, 7);
        assert_eq!(
            s.replays.by_class,
            Counts::from([("rate-limit".into(), 3), ("server".into(), 4)])
        );
        assert_eq!(
            s.replays.by_cause,
            Counts::from([("HTTP 429".into(), 3), ("HTTP 503".into(), 4)])
        );
        assert_eq!(s.step_retries.total, 1);
        assert_eq!(
            s.step_retries.by_rule,
            Counts::from([("transport".into(), 1)])
        );
        assert_eq!(
            s.step_retries.by_class,
            Counts::from([("infrastructure".into(), 1)])
        );
        assert_eq!(s.exhausted_steps.total, 1);
        assert_eq!(
            s.fault_bursts.before_success,
            BTreeMap::from([(0, 1), (2, 2)])
        );
        // Two replays and the failing request; one replay and the failing 429.
        assert_eq!(
            s.fault_bursts.before_give_up,
            BTreeMap::from([(2, 1), (3, 1)])
        );
        assert_eq!(
            s.waiting_ms,
            Waiting {
                replay_waits: 8800,
                step_backoffs: 1500,
                throttle_holds: 0,
                total: 10_300
            }
        );
        assert_eq!(
            s.failed_attempt_tokens,
            Tokens {
                input_tokens: 200,
                output_tokens: 20,
                attempts: 2,
                unpriced_attempts: 2,
                ..Tokens::default()
            }
        );
    }

    /// 429 after 429: 300 ms -> 429 again, 2 s -> answered, 6 s -> 429 again (the
    /// attempt's final HTTP 429).
    #[test]
    fn issue13_the_chance_of_another_429_is_counted_by_the_wait_before_it() {
        let s = Stats::from_records(&sample(), &Filter::default());
        let got: Vec<(&str, u64, u64, Option<f64>)> = s
            .rate_limit_repeats
            .iter()
            .map(|b| (b.wait, b.after_429, b.another_429, b.probability))
            .collect();
        assert_eq!(
            got,
            [
                ("<1s", 1, 1, Some(1.0)),
                ("1-5s", 1, 0, Some(0.0)),
                ("5-20s", 1, 1, Some(1.0)),
                (">=20s", 0, 0, None)
            ]
        );
    }

    /// Issue 34: a step carried over is counted as a step and as reused; the rate is over
    /// every step, and a run counts once however many steps it carried over.
    #[test]
    fn issue34_reused_steps_and_runs_that_carried_steps_over_are_counted() {
        let mut records = sample();
        let mut carried = records[0].steps[0].clone();
        carried.attempts.clear();
        carried.reused_from = Some(docsfab_record::StepLink {
            run_id: "run-old".into(),
            step_id: "s".into(),
        });
        records[0].steps.push(carried.clone());
        records[0].steps.push(carried);
        let s = Stats::from_records(&records, &Filter::default());
        assert_eq!(
            (s.steps, s.reused_steps, s.runs_with_reused_steps),
            (4, 2, 1)
        );
        assert_eq!(s.reuse_rate, Some(0.5));
        // The carried steps spent nothing here.
        assert_eq!(s.attempts, 3);
        assert_eq!(
            Stats::from_records(&[], &Filter::default()).reuse_rate,
            None
        );
    }

    /// Issue 12/13: a throttle hold is waiting time of its own, not a replay wait or backoff.
    #[test]
    fn issue13_throttle_holds_are_counted_as_waiting() {
        let mut held = turn(TurnStatus::Completed, vec![]);
        held.held_ms = 700;
        let records = vec![run(
            "2026-11-30T10:00:00.000Z",
            None,
            vec![attempt(vec![held])],
        )];
        let s = Stats::from_records(&records, &Filter::default());
        assert_eq!(s.waiting_ms.throttle_holds, 700);
        assert_eq!(s.waiting_ms.total, 700);
        assert_eq!(s.replays.total, 0);
    }

    #[test]
    fn issue13_the_filter_keeps_runs_since_a_time_and_of_one_provider() {
        let records = sample();
        let since = Filter {
            started_at_or_after: Some("2026-11-30T00:00:00.000Z".into()),
            provider: None,
        };
        assert_eq!(Stats::from_records(&records, &since).runs, 1);
        let sim = Filter {
            provider: Some("sim".into()),
            ..Filter::default()
        };
        let s = Stats::from_records(&records, &sim);
        assert_eq!((s.runs, s.requests), (1, 6));
        let unknown = Filter {
            provider: Some(UNKNOWN_PROVIDER.into()),
            ..Filter::default()
        };
        assert_eq!(Stats::from_records(&records, &unknown).runs, 1);
        let none = Filter {
            provider: Some("other".into()),
            ..Filter::default()
        };
        assert_eq!(
            Stats::from_records(&records, &none),
            Stats {
                rate_limit_repeats: Stats::from_records(&[], &Filter::default()).rate_limit_repeats,
                ..Stats::default()
            }
        );
    }
}
