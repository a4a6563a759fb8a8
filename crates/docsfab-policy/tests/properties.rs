//! Property tests over arbitrary failure sequences (CFG-3, REP-1, REP-7, REP-10, STP-6, STP-13).

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::replay::{self, PastReplay, ReplayDecision, ReplayLimits};
use docsfab_policy::rules::RulesTable;
use docsfab_policy::step::{
    self, AttemptFailure, PastAttempt, StepAccess, StepBudgets, ValidatorRefusal, WriteSettlement,
};
use docsfab_record::{Budget, ContractFailure, FaultKind, ProviderErrorClass};
use proptest::prelude::*;

fn provider_failure() -> impl Strategy<Value = ProviderFailure> {
    let status = prop_oneof![
        Just(429u16),
        Just(503),
        Just(408),
        Just(504),
        Just(400),
        Just(401),
        100u16..700
    ];
    let fault = prop_oneof![
        Just(FaultKind::ConnectRefused),
        Just(FaultKind::ConnectionDropped),
        Just(FaultKind::RequestTimeout),
        Just(FaultKind::BodyCut),
        Just(FaultKind::StreamIncomplete),
        Just(FaultKind::ContentFilter),
        Just(FaultKind::Dns),
        Just(FaultKind::ConnectTimeout),
        Just(FaultKind::Tls),
        Just(FaultKind::Reset),
    ];
    let class = prop::sample::select(ProviderErrorClass::ALL.to_vec());
    prop_oneof![
        (status, prop::option::of(0u64..500_000))
            .prop_map(|(s, ra)| ProviderFailure::from_http_status(s, ra)),
        fault.prop_map(ProviderFailure::from_fault),
        (class, prop::option::of(100u16..600)).prop_map(|(class, declared)| {
            let mut f = ProviderFailure::from_fault(FaultKind::ErrorEvent);
            f.class = class;
            f.declared_status = declared;
            f
        }),
    ]
    .prop_flat_map(|f| {
        any::<bool>().prop_map(move |p| ProviderFailure {
            content_published: p,
            ..f
        })
    })
}

fn attempt_failure() -> impl Strategy<Value = AttemptFailure> {
    prop_oneof![
        4 => provider_failure().prop_map(|failure| AttemptFailure::Provider { failure }),
        1 => prop::sample::select(vec![
            ContractFailure::Prose,
            ContractFailure::Array,
            ContractFailure::Empty,
            ContractFailure::SchemaInvalid,
        ])
        .prop_map(|failure| AttemptFailure::Contract { failure }),
        1 => Just(AttemptFailure::CutAnswer),
        1 => Just(AttemptFailure::AttemptDeadline),
        1 => Just(AttemptFailure::NoProgress),
        1 => prop::sample::select(vec![
            "connection refused",
            "payload digest mismatch",
            "anything else",
        ])
        .prop_map(|t| AttemptFailure::RefusedBeforeSend { error_text: t.to_string() }),
        1 => Just(AttemptFailure::ValidatorTerminal { refusal: ValidatorRefusal::AuthorityRefusal }),
        1 => Just(AttemptFailure::ContextExhausted { context: None }),
    ]
}

fn step_budgets() -> impl Strategy<Value = StepBudgets> {
    (
        0u32..=3,
        0u32..=6,
        0u64..=60_000,
        0u64..=60_000,
        0u64..=3_600_000,
        0u32..=3,
        0u32..=3,
        0u32..=3,
    )
        .prop_map(
            |(mr, mt, base, max_delay, elapsed, cut, to, np)| StepBudgets {
                max_retries: mr,
                max_transport_retries: mt,
                base_delay_ms: base,
                transport_max_delay_ms: max_delay,
                transport_max_elapsed_ms: elapsed,
                cut_answer_retries: cut,
                timeout_retries: to,
                no_progress_retries: np,
            },
        )
}

fn access() -> impl Strategy<Value = StepAccess> {
    prop_oneof![
        3 => Just(StepAccess::ReadOnly),
        1 => prop::sample::select(vec![
            WriteSettlement::NoWrite,
            WriteSettlement::WriteExecutedAndRestored,
            WriteSettlement::RestoreFailed,
            WriteSettlement::Unavailable,
        ])
        .prop_map(StepAccess::Write),
    ]
}

fn replay_limits() -> impl Strategy<Value = ReplayLimits> {
    (
        0u64..=500,
        0u64..=20_000,
        0u64..=60_000,
        1u32..=8,
        1u32..=24,
        0u64..=380_000,
    )
        .prop_map(
            |(base, max, total, attempts, throttled, throttled_total)| ReplayLimits {
                base_delay_ms: base,
                max_delay_ms: max,
                max_total_delay_ms: total,
                max_attempts_per_turn: attempts,
                max_throttled_attempts_per_turn: throttled,
                max_throttled_total_delay_ms: throttled_total,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // Proves CFG-3, STP-6, STP-13.
    /// CFG-3: attempts never exceed 1 + maxRetries + maxTransportRetries; STP-13: contract
    /// retries (condition retries among them) never exceed maxRetries; STP-6: no transport wait
    /// exceeds its cap, and the transport elapsed sum with the scheduled wait stays in bound.
    #[test]
    fn step_attempts_stay_within_budgets_cfg_3_stp_6_stp_13(
        budgets in step_budgets(),
        access in access(),
        failures in prop::collection::vec((attempt_failure(), 0u64..2_000_000), 1..40),
    ) {
        let table = RulesTable::embedded().expect("valid");
        let mut past: Vec<PastAttempt> = Vec::new();
        let mut attempts = 0u64;
        for (failure, duration_ms) in &failures {
            attempts += 1;
            let d = step::decide(&table, &budgets, access, &past, failure, *duration_ms);
            let Some(retry) = d.scheduled().copied() else { break };
            // A retry is paid from `contract` or `transport`; `initial` is the first attempt's.
            prop_assert_ne!(retry.budget, Budget::Initial);
            if retry.budget == Budget::Transport {
                prop_assert!(retry.wait_ms <= budgets.transport_max_delay_ms);
            }
            past.push(PastAttempt { duration_ms: *duration_ms, retry });
            let elapsed: u64 = past
                .iter()
                .filter(|p| p.retry.budget == Budget::Transport)
                .map(|p| p.duration_ms + p.retry.wait_ms)
                .sum();
            prop_assert!(elapsed <= budgets.transport_max_elapsed_ms);
            let contract = past.iter().filter(|p| p.retry.budget == Budget::Contract).count();
            prop_assert!(contract as u64 <= u64::from(budgets.max_retries));
        }
        prop_assert!(attempts <= budgets.max_attempts());
        if let StepAccess::Write(_) = access {
            prop_assert!(past.iter().all(|p| p.retry.budget == Budget::Transport));
        }
    }

    // Proves REP-1, REP-7, REP-10.
    /// REP-1, REP-7, REP-10: a replay never exceeds the deciding window's attempt bound, the
    /// turn's summed wait never exceeds that window's cap, no wait exceeds maxDelayMs, and no
    /// wait crosses the deadline.
    #[test]
    fn replays_stay_within_the_deciding_window_rep_1_rep_7_rep_10(
        limits in replay_limits(),
        failures in prop::collection::vec(provider_failure(), 1..40),
        start in 0u64..1_000_000,
        deadline_after in prop::option::of(0u64..500_000),
        step in 0u64..10_000,
    ) {
        let deadline = deadline_after.map(|d| start + d);
        let mut past: Vec<PastReplay> = Vec::new();
        let mut now = start;
        for failure in &failures {
            match replay::decide(&limits, &past, failure, now, deadline) {
                ReplayDecision::Replay { wait_ms, window } => {
                    prop_assert!(failure.is_transport_retryable() && !failure.content_published);
                    prop_assert_eq!(window, replay::window_of(failure));
                    // This replay is attempt past.len() + 2 of the turn.
                    prop_assert!(past.len() as u64 + 2 <= u64::from(limits.max_attempts(window)));
                    prop_assert!(wait_ms <= limits.max_delay_ms);
                    let summed: u64 = past.iter().map(|p| p.wait_ms).sum::<u64>() + wait_ms;
                    prop_assert!(summed <= limits.max_total_delay(window));
                    if let Some(d) = deadline {
                        prop_assert!(now + wait_ms <= d);
                    }
                    past.push(PastReplay { failure: *failure, wait_ms });
                    now += wait_ms + step;
                }
                ReplayDecision::Stop { .. } => break,
            }
        }
    }

    // Proves REP-1.
    /// No input makes the replay decision panic (saturating arithmetic throughout).
    #[test]
    fn replay_never_panics_on_extreme_inputs_rep_1(
        base in any::<u64>(), max in any::<u64>(), total in any::<u64>(),
        attempts in any::<u32>(), throttled in any::<u32>(), throttled_total in any::<u64>(),
        waits in prop::collection::vec(any::<u64>(), 0..30),
        failure in provider_failure(), now in any::<u64>(), deadline in prop::option::of(any::<u64>()),
        retry_after in prop::option::of(any::<u64>()),
    ) {
        let limits = ReplayLimits {
            base_delay_ms: base,
            max_delay_ms: max,
            max_total_delay_ms: total,
            max_attempts_per_turn: attempts,
            max_throttled_attempts_per_turn: throttled,
            max_throttled_total_delay_ms: throttled_total,
        };
        let past: Vec<_> = waits.iter().map(|&wait_ms| PastReplay { failure, wait_ms }).collect();
        let failure = ProviderFailure { retry_after_ms: retry_after, ..failure };
        let _ = replay::decide(&limits, &past, &failure, now, deadline);
    }

    // Proves STP-6.
    /// No input makes the step decision panic.
    #[test]
    fn step_never_panics_on_extreme_inputs_stp_6(
        mr in any::<u32>(), mt in any::<u32>(), base in any::<u64>(), max in any::<u64>(),
        elapsed in any::<u64>(), c in any::<u32>(),
        failure in attempt_failure(), durations in prop::collection::vec(any::<u64>(), 0..20),
        duration in any::<u64>(), access in access(),
    ) {
        let table = RulesTable::embedded().expect("valid");
        let budgets = StepBudgets {
            max_retries: mr,
            max_transport_retries: mt,
            base_delay_ms: base,
            transport_max_delay_ms: max,
            transport_max_elapsed_ms: elapsed,
            cut_answer_retries: c,
            timeout_retries: c,
            no_progress_retries: c,
        };
        let past: Vec<_> = durations
            .iter()
            .map(|&d| PastAttempt {
                duration_ms: d,
                retry: step::ScheduledRetry {
                    budget: if d % 2 == 0 { Budget::Transport } else { Budget::Contract },
                    condition: None,
                    feedback: None,
                    wait_ms: d,
                },
            })
            .collect();
        let _ = step::decide(&table, &budgets, access, &past, &failure, duration);
    }
}
