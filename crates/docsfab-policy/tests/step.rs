//! The step retry decision (STP-*, CFG-3, CLS-2).

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::rules::{Condition, Feedback, RulesTable};
use docsfab_policy::step::{
    AttemptFailure, PastAttempt, StepAccess, StepBudgets, StepDecision, ValidatorRefusal,
    WriteSettlement, decide,
};
use docsfab_record::{
    Budget, ContractFailure, FaultKind, ProviderErrorClass, RetryDecision, TimeoutKind,
};

fn table() -> RulesTable {
    RulesTable::embedded().expect("the shipped table is valid")
}

fn provider(f: ProviderFailure) -> AttemptFailure {
    AttemptFailure::Provider { failure: f }
}

fn http(status: u16) -> AttemptFailure {
    provider(ProviderFailure::from_http_status(status, None))
}

fn prose() -> AttemptFailure {
    AttemptFailure::Contract {
        failure: ContractFailure::Prose,
    }
}

/// Runs a read-only step whose attempts fail in turn with `failures` (each lasting `duration`),
/// returning every decision.
fn run_step(
    budgets: &StepBudgets,
    access: StepAccess,
    failures: &[AttemptFailure],
    duration_ms: u64,
) -> Vec<StepDecision> {
    let t = table();
    let mut past: Vec<PastAttempt> = Vec::new();
    let mut decisions = Vec::new();
    for f in failures {
        let d = decide(&t, budgets, access, &past, f, duration_ms);
        let next = d.scheduled().copied();
        decisions.push(d);
        match next {
            Some(retry) => past.push(PastAttempt { duration_ms, retry }),
            None => break,
        }
    }
    decisions
}

fn read_only(failures: &[AttemptFailure]) -> Vec<StepDecision> {
    run_step(&StepBudgets::default(), StepAccess::ReadOnly, failures, 10)
}

// Proves CFG-3.
#[test]
fn ten_attempts_at_most_with_defaults_cfg_3() {
    assert_eq!(StepBudgets::default().max_attempts(), 10);
    // Three contract retries and six transport retries, interleaved: the tenth attempt ends it.
    let mut failures = Vec::new();
    for _ in 0..3 {
        failures.push(prose());
        failures.push(http(503));
        failures.push(http(503));
    }
    failures.push(prose());
    failures.push(prose());
    let decisions = read_only(&failures);
    assert_eq!(decisions.len(), 10);
    assert!(decisions[..9].iter().all(StepDecision::retry_scheduled));
    assert_eq!(decisions[9].retry_decision(), RetryDecision::Exhausted);
}

// Proves STP-3.
#[test]
fn class_decides_before_text_stp_3() {
    let t = table();
    let b = StepBudgets::default();
    for f in [
        ProviderFailure::from_fault(FaultKind::ConnectionDropped),
        ProviderFailure::from_http_status(502, None),
        ProviderFailure {
            content_published: true,
            ..ProviderFailure::from_fault(FaultKind::StreamIncomplete)
        },
        ProviderFailure::from_fault(FaultKind::RequestTimeout),
        ProviderFailure::from_http_status(429, None),
    ] {
        let d = decide(&t, &b, StepAccess::ReadOnly, &[], &provider(f), 10);
        assert_eq!(d.retry_decision(), RetryDecision::Scheduled, "{f:?}");
        assert_eq!(d.next_budget(), Some(Budget::Transport), "{f:?}");
    }
    for class in [
        ProviderErrorClass::ContentFilter,
        ProviderErrorClass::Authentication,
        ProviderErrorClass::InvalidRequest,
    ] {
        let mut f = ProviderFailure::from_fault(FaultKind::ConnectionDropped);
        f.class = class;
        let d = decide(&t, &b, StepAccess::ReadOnly, &[], &provider(f), 10);
        assert_eq!(d.retry_decision(), RetryDecision::Terminal, "{class:?}");
        assert!(!d.retry_scheduled());
    }
    // A rate limit without HTTP status (quota inside a 200 stream) is terminal.
    let mut quota = ProviderFailure::from_fault(FaultKind::ErrorEvent);
    quota.class = ProviderErrorClass::RateLimit;
    let d = decide(&t, &b, StepAccess::ReadOnly, &[], &provider(quota), 10);
    assert_eq!(d.retry_decision(), RetryDecision::Terminal);
    assert_eq!(d.retry_rule(), "class-rate-limit-quota");
    assert_eq!(
        d.failure().map(|f| f.category.as_str()),
        Some("provider-quota")
    );
}

// Proves STP-4.
#[test]
fn refused_before_send_is_decided_by_text_stp_4() {
    let t = table();
    let b = StepBudgets::default();
    let refused = |text: &str| AttemptFailure::RefusedBeforeSend {
        error_text: text.to_string(),
    };
    let d = decide(
        &t,
        &b,
        StepAccess::ReadOnly,
        &[],
        &refused("dns error: no such host"),
        0,
    );
    assert_eq!(d.retry_rule(), "text-connection-unavailable");
    assert_eq!(d.next_budget(), Some(Budget::Transport));
    let d = decide(
        &t,
        &b,
        StepAccess::ReadOnly,
        &[],
        &refused("payload digest mismatch"),
        0,
    );
    assert_eq!(d.retry_decision(), RetryDecision::Terminal);
    assert_eq!(d.retry_rule(), "text-payload-digest-mismatch");
    let d = decide(
        &t,
        &b,
        StepAccess::ReadOnly,
        &[],
        &refused("lease preflight failed"),
        0,
    );
    assert_eq!(d.retry_rule(), "default-terminal");
    assert_eq!(
        d.failure().map(|f| f.code.as_str()),
        Some("request-refused")
    );
}

// Proves STP-5.
#[test]
fn transport_faults_never_spend_contract_retries_stp_5() {
    // Six transport faults between contract failures: all three contract retries remain.
    let mut failures = vec![prose()];
    failures.extend(std::iter::repeat_with(|| http(503)).take(6));
    failures.extend([prose(), prose(), prose()]);
    let decisions = read_only(&failures);
    assert_eq!(decisions.len(), 10);
    let budgets: Vec<_> = decisions.iter().map(StepDecision::next_budget).collect();
    assert_eq!(
        budgets
            .iter()
            .filter(|b| **b == Some(Budget::Contract))
            .count(),
        3
    );
    assert_eq!(
        budgets
            .iter()
            .filter(|b| **b == Some(Budget::Transport))
            .count(),
        6
    );
    assert_eq!(decisions[9].retry_decision(), RetryDecision::Exhausted);
    assert_eq!(
        decisions[9].failure().map(|f| f.message.as_str()),
        Some("retry-max-retries-bound: 4 exceeds retry.maxRetries = 3 count.")
    );
}

// Proves STP-5.
#[test]
fn feedback_of_last_judged_attempt_carries_across_transport_stp_5() {
    let decisions = read_only(&[
        prose(),
        http(503),
        AttemptFailure::CutAnswer,
        http(429),
        http(500),
    ]);
    let feedback: Vec<_> = decisions.iter().map(StepDecision::feedback).collect();
    assert_eq!(
        feedback,
        vec![
            Some(Feedback::ReturnOnlyTheJsonObject),
            Some(Feedback::ReturnOnlyTheJsonObject),
            Some(Feedback::AnswerCompletelyInsideLimit),
            Some(Feedback::AnswerCompletelyInsideLimit),
            Some(Feedback::AnswerCompletelyInsideLimit),
        ]
    );
    // A transport fault on the first attempt carries nothing.
    assert_eq!(read_only(&[http(503)])[0].feedback(), None);
}

// Proves STP-6.
#[test]
fn transport_waits_double_from_base_to_cap_stp_6() {
    let b = StepBudgets::default();
    assert_eq!(
        b.transport_schedule(),
        vec![1_000, 2_000, 4_000, 8_000, 16_000, 32_000]
    );
    let waits: Vec<_> = read_only(&vec![http(503); 6])
        .iter()
        .map(|d| d.wait_ms())
        .collect();
    assert_eq!(
        waits,
        [1_000, 2_000, 4_000, 8_000, 16_000, 32_000]
            .map(Some)
            .to_vec()
    );
    let b = StepBudgets {
        base_delay_ms: 20_000,
        ..StepBudgets::default()
    };
    assert_eq!(
        b.transport_schedule(),
        vec![20_000, 40_000, 60_000, 60_000, 60_000, 60_000]
    );
}

// Proves STP-6, STP-7.
#[test]
fn zero_transport_retries_stops_on_first_fault_stp_6_stp_7() {
    let b = StepBudgets {
        max_transport_retries: 0,
        ..StepBudgets::default()
    };
    let d = run_step(&b, StepAccess::ReadOnly, &[http(503)], 10);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].retry_decision(), RetryDecision::Exhausted);
    assert_eq!(
        d[0].failure().map(|f| f.message.as_str()),
        Some("retry-max-transport-retries-bound: 1 exceeds retry.maxTransportRetries = 0 count.")
    );
}

// Proves STP-7.
#[test]
fn seventh_transport_fault_names_the_count_bound_stp_7() {
    let decisions = read_only(&vec![http(503); 7]);
    assert_eq!(decisions.len(), 7);
    let last = &decisions[6];
    assert_eq!(last.retry_decision(), RetryDecision::Exhausted);
    assert!(!last.retry_scheduled());
    assert_eq!(last.retry_rule(), "class-server");
    let failure = last.failure().expect("the step ends");
    assert_eq!(
        failure.message,
        "retry-max-transport-retries-bound: 7 exceeds retry.maxTransportRetries = 6 count."
    );
    assert_eq!(failure.category, "provider-transient");
    assert_eq!(failure.failure_class, "infrastructure");
    assert_eq!(failure.code, "provider-server");
    assert!(
        failure
            .remediation
            .contains("DOCSFAB_READ_ONLY_MAX_TRANSPORT_RETRIES")
    );
}

// Proves STP-6, STP-7.
#[test]
fn elapsed_bound_counts_transport_attempts_and_waits_stp_6_stp_7() {
    let b = StepBudgets {
        transport_max_elapsed_ms: 10_000,
        ..StepBudgets::default()
    };
    // Attempt 1: 3,000 ms + wait 1,000 = 4,000. Attempt 2: 3,000 + 2,000 = 9,000.
    // Attempt 3: 3,000 brings 12,000 with the next wait of 4,000 -> 16,000 > 10,000: refused.
    let decisions = run_step(&b, StepAccess::ReadOnly, &vec![http(503); 3], 3_000);
    assert_eq!(decisions.len(), 3);
    assert_eq!(decisions[1].wait_ms(), Some(2_000));
    assert_eq!(
        decisions[2].failure().map(|f| f.message.as_str()),
        Some(
            "retry-transport-max-elapsed-bound: 16000 exceeds retry.transportMaxElapsedMs = 10000 ms."
        )
    );
    assert_eq!(decisions[2].retry_decision(), RetryDecision::Exhausted);
}

// Proves STP-6.
#[test]
fn attempt_that_crosses_elapsed_bound_still_finishes_stp_6() {
    // The wait fits, so the next attempt starts; a long attempt then crosses the bound while it
    // runs and is decided only when it finishes.
    let b = StepBudgets {
        transport_max_elapsed_ms: 10_000,
        ..StepBudgets::default()
    };
    let t = table();
    let d1 = decide(&t, &b, StepAccess::ReadOnly, &[], &http(503), 8_999);
    assert_eq!(d1.wait_ms(), Some(1_000));
    let past = [PastAttempt {
        duration_ms: 8_999,
        retry: *d1.scheduled().expect("scheduled"),
    }];
    let d2 = decide(&t, &b, StepAccess::ReadOnly, &past, &http(503), 50_000);
    assert_eq!(d2.retry_decision(), RetryDecision::Exhausted);
    // Judged attempts do not count towards the transport elapsed bound.
    let past = [PastAttempt {
        duration_ms: 1_000_000,
        retry: *decide(&t, &b, StepAccess::ReadOnly, &[], &prose(), 1_000_000)
            .scheduled()
            .expect("scheduled"),
    }];
    let d = decide(&t, &b, StepAccess::ReadOnly, &past, &http(503), 1_000);
    assert_eq!(d.wait_ms(), Some(1_000));
}

// Proves STP-15.
#[test]
fn retry_after_with_http_status_lengthens_the_wait_stp_15() {
    let t = table();
    let b = StepBudgets::default();
    let f = provider(ProviderFailure::from_http_status(429, Some(45_000)));
    let d = decide(&t, &b, StepAccess::ReadOnly, &[], &f, 10);
    assert_eq!(d.wait_ms(), Some(45_000));
    // Capped at the transport budget's per-wait ceiling.
    let f = provider(ProviderFailure::from_http_status(503, Some(600_000)));
    assert_eq!(
        decide(&t, &b, StepAccess::ReadOnly, &[], &f, 10).wait_ms(),
        Some(60_000)
    );
    // Without an HTTP status the Retry-After is not honoured.
    let mut ev = ProviderFailure::from_fault(FaultKind::ErrorEvent);
    ev.class = ProviderErrorClass::Server;
    ev.retry_after_ms = Some(45_000);
    assert_eq!(
        decide(&t, &b, StepAccess::ReadOnly, &[], &provider(ev), 10).wait_ms(),
        Some(1_000)
    );
}

// Proves STP-9.
#[test]
fn contract_failures_retry_with_return_only_the_object_stp_9() {
    for failure in [
        ContractFailure::Prose,
        ContractFailure::Array,
        ContractFailure::Empty,
    ] {
        let d = read_only(&[AttemptFailure::Contract { failure }]);
        assert_eq!(d[0].next_budget(), Some(Budget::Contract));
        assert_eq!(d[0].feedback(), Some(Feedback::ReturnOnlyTheJsonObject));
        assert_eq!(d[0].wait_ms(), Some(0));
    }
    let d = read_only(&[AttemptFailure::Contract {
        failure: ContractFailure::SchemaInvalid,
    }]);
    assert_eq!(d[0].feedback(), Some(Feedback::MeetTheContractSchema));
    let b = StepBudgets {
        max_retries: 0,
        ..StepBudgets::default()
    };
    let d = run_step(&b, StepAccess::ReadOnly, &[prose()], 10);
    assert_eq!(d[0].retry_decision(), RetryDecision::Exhausted);
}

// Proves STP-10.
#[test]
fn cut_answer_is_retried_once_by_default_stp_10() {
    let d = read_only(&[AttemptFailure::CutAnswer, AttemptFailure::CutAnswer]);
    assert_eq!(d[0].feedback(), Some(Feedback::AnswerCompletelyInsideLimit));
    assert_eq!(
        d[0].scheduled().and_then(|r| r.condition),
        Some(Condition::CutAnswer)
    );
    assert_eq!(d[1].retry_decision(), RetryDecision::Exhausted);
    assert_eq!(
        d[1].failure().map(|f| f.message.as_str()),
        Some("retry-max-cut-answer-retries-bound: 2 exceeds retry.maxCutAnswerRetries = 1 count.")
    );
    let b = StepBudgets {
        cut_answer_retries: 3,
        ..StepBudgets::default()
    };
    let d = run_step(
        &b,
        StepAccess::ReadOnly,
        &vec![AttemptFailure::CutAnswer; 4],
        10,
    );
    assert_eq!(d.iter().filter(|d| d.retry_scheduled()).count(), 3);
    let b = StepBudgets {
        cut_answer_retries: 0,
        ..StepBudgets::default()
    };
    let d = run_step(&b, StepAccess::ReadOnly, &[AttemptFailure::CutAnswer], 10);
    assert_eq!(d[0].retry_decision(), RetryDecision::Exhausted);
}

// Proves STP-11.
#[test]
fn attempt_deadline_retried_once_and_provider_timeout_from_transport_stp_11() {
    let d = read_only(&[
        AttemptFailure::AttemptDeadline,
        AttemptFailure::AttemptDeadline,
    ]);
    assert_eq!(d[0].timeout_kind(), Some(TimeoutKind::AttemptDeadline));
    assert_eq!(d[0].feedback(), Some(Feedback::ReadOnlyWhatIsNeeded));
    assert_eq!(d[0].next_budget(), Some(Budget::Contract));
    assert_eq!(d[1].retry_decision(), RetryDecision::Exhausted);
    assert_eq!(d[1].timeout_kind(), Some(TimeoutKind::AttemptDeadline));

    // A provider timeout is the transport class `timeout`: it does not spend the timeout budget.
    let d = read_only(&[http(504), http(408), AttemptFailure::AttemptDeadline]);
    assert_eq!(d[0].timeout_kind(), Some(TimeoutKind::ProviderTimeout));
    assert_eq!(d[0].next_budget(), Some(Budget::Transport));
    assert_eq!(d[1].next_budget(), Some(Budget::Transport));
    assert_eq!(d[2].next_budget(), Some(Budget::Contract));
}

// Proves STP-12.
#[test]
fn no_progress_retried_once_with_first_notice_feedback_stp_12() {
    let d = read_only(&[AttemptFailure::NoProgress, AttemptFailure::NoProgress]);
    assert_eq!(d[0].feedback(), Some(Feedback::AnswerAtFirstNotice));
    assert_eq!(d[0].retry_rule(), "condition-no-progress");
    assert_eq!(d[1].retry_decision(), RetryDecision::Exhausted);
}

// Proves STP-13.
#[test]
fn condition_budgets_stay_inside_max_retries_stp_13() {
    // Condition budgets of 3 each cannot buy more than maxRetries = 2 contract retries.
    let b = StepBudgets {
        max_retries: 2,
        cut_answer_retries: 3,
        timeout_retries: 3,
        no_progress_retries: 3,
        ..StepBudgets::default()
    };
    let d = run_step(
        &b,
        StepAccess::ReadOnly,
        &[
            AttemptFailure::CutAnswer,
            AttemptFailure::NoProgress,
            AttemptFailure::AttemptDeadline,
        ],
        10,
    );
    assert_eq!(d.len(), 3);
    assert_eq!(d[2].retry_decision(), RetryDecision::Exhausted);
    // A lowered maxRetries lowers a condition budget to it.
    let b = StepBudgets {
        max_retries: 1,
        cut_answer_retries: 3,
        ..StepBudgets::default()
    };
    let d = run_step(
        &b,
        StepAccess::ReadOnly,
        &vec![AttemptFailure::CutAnswer; 3],
        10,
    );
    assert_eq!(d.len(), 2);
    assert_eq!(
        d[1].failure().map(|f| f.message.as_str()),
        Some("retry-max-retries-bound: 2 exceeds retry.maxRetries = 1 count.")
    );
    // Each condition counts only its own scheduled retries.
    let d = read_only(&[
        AttemptFailure::CutAnswer,
        AttemptFailure::NoProgress,
        AttemptFailure::AttemptDeadline,
    ]);
    assert!(d.iter().all(StepDecision::retry_scheduled));
}

// Proves STP-14.
#[test]
fn terminal_refusals_are_never_retried_stp_14() {
    for f in [
        AttemptFailure::ValidatorTerminal {
            refusal: ValidatorRefusal::CredentialMaterial,
        },
        AttemptFailure::ValidatorTerminal {
            refusal: ValidatorRefusal::AuthorityRefusal,
        },
        AttemptFailure::ContextExhausted { context: None },
    ] {
        let d = read_only(std::slice::from_ref(&f));
        assert_eq!(d[0].retry_decision(), RetryDecision::Terminal, "{f:?}");
        assert!(!d[0].retry_scheduled());
        assert_eq!(d[0].wait_ms(), None);
    }
    // A cancelled attempt ends the step with nothing decided.
    let d = read_only(&[AttemptFailure::Cancelled, prose()]);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].retry_decision(), RetryDecision::None);
    assert!(!d[0].retry_scheduled());
    assert_eq!(
        d[0].failure().map(|f| f.category.as_str()),
        Some("cancelled")
    );
    let d = read_only(&[AttemptFailure::ContextExhausted { context: None }]);
    assert_eq!(
        d[0].failure().map(|f| f.category.as_str()),
        Some("context-exhausted")
    );
    assert_eq!(d[0].retry_rule(), "terminal-context-exhausted");
    // With the counts a server's overflow refusal gave: still terminal, and the failure names
    // the counts and the three levers (what the step reads, what it may answer, the context).
    let context = docsfab_record::ContextWindow {
        prompt_tokens: Some(5000),
        context_tokens: Some(4096),
        output_tokens: None,
    };
    let d = read_only(&[AttemptFailure::ContextExhausted {
        context: Some(context),
    }]);
    assert_eq!(d[0].retry_decision(), RetryDecision::Terminal);
    let failure = d[0].failure().expect("a failure");
    assert_eq!(failure.context, Some(context));
    for part in [
        "The prompt of 5000 tokens plus maxOutputTokens did not fit the model's context of 4096 tokens",
        "limits.sourceReadBytes",
        "limits.maxOutputTokens",
        "llama-server -c",
    ] {
        assert!(
            failure.remediation.contains(part),
            "{}",
            failure.remediation
        );
    }
    let d = read_only(&[AttemptFailure::ValidatorTerminal {
        refusal: ValidatorRefusal::CredentialMaterial,
    }]);
    assert_eq!(
        d[0].failure().map(|f| f.code.as_str()),
        Some("credential-material")
    );
}

// Proves CLS-2.
#[test]
fn stream_incomplete_is_infrastructure_provider_stream_incomplete_cls_2() {
    let f = provider(ProviderFailure {
        content_published: true,
        ..ProviderFailure::from_fault(FaultKind::StreamIncomplete)
    });
    let b = StepBudgets {
        max_transport_retries: 0,
        ..StepBudgets::default()
    };
    let d = run_step(&b, StepAccess::ReadOnly, std::slice::from_ref(&f), 10);
    let failure = d[0].failure().expect("ends");
    assert_eq!(failure.failure_class, "infrastructure");
    assert_eq!(failure.code, "provider-stream-incomplete");
    // With budget left it is retried from the transport budget (CLS-4).
    let d = read_only(&[f]);
    assert_eq!(d[0].next_budget(), Some(Budget::Transport));
    assert_eq!(d[0].retry_rule(), "class-stream-incomplete");
}

// Proves STP-1, WRT-1, WRT-2, WRT-3.
#[test]
fn write_steps_retry_only_settled_transport_failures_stp_1_wrt_1_wrt_2() {
    let t = table();
    let b = StepBudgets::default();
    for s in [
        WriteSettlement::NoWrite,
        WriteSettlement::WriteExecutedAndRestored,
    ] {
        let d = decide(&t, &b, StepAccess::Write(s), &[], &http(503), 10);
        assert_eq!(d.retry_decision(), RetryDecision::Scheduled, "{s:?}");
        assert_eq!(d.next_budget(), Some(Budget::Transport));
    }
    for s in [WriteSettlement::Unavailable, WriteSettlement::RestoreFailed] {
        let d = decide(&t, &b, StepAccess::Write(s), &[], &http(503), 10);
        assert_eq!(d.retry_decision(), RetryDecision::Declined, "{s:?}");
        assert!(!d.retry_scheduled());
        assert_eq!(d.retry_rule(), "write-step-declined");
        assert_eq!(
            d.failure().map(|f| f.category.as_str()),
            Some("declined-write-step")
        );
    }
    // Judged failures keep a write step single-attempt, whatever its settlement.
    let d = decide(
        &t,
        &b,
        StepAccess::Write(WriteSettlement::NoWrite),
        &[],
        &prose(),
        10,
    );
    assert_eq!(d.retry_decision(), RetryDecision::Terminal);
    assert_eq!(d.retry_rule(), "write-step-single-attempt");
    // Terminal classes stay terminal under their class rule.
    let d = decide(
        &t,
        &b,
        StepAccess::Write(WriteSettlement::NoWrite),
        &[],
        &http(401),
        10,
    );
    assert_eq!(d.retry_decision(), RetryDecision::Terminal);
    assert_eq!(d.retry_rule(), "class-authentication");
    assert_eq!(
        WriteSettlement::RestoreFailed.recorded().as_str(),
        "write-executed"
    );
    assert_eq!(
        WriteSettlement::Unavailable.recorded().as_str(),
        "unavailable"
    );
}

#[test]
fn decisions_serialize_to_record_names() {
    let d = read_only(&[http(504)]);
    assert_eq!(
        serde_json::to_value(d[0].retry_decision()).expect("serializes"),
        serde_json::json!("scheduled")
    );
    assert_eq!(
        serde_json::to_value(d[0].timeout_kind()).expect("serializes"),
        serde_json::json!("provider-timeout")
    );
}

// Proves STP-5.
#[test]
fn history_gives_budget_and_feedback_of_the_running_attempt_stp_5() {
    use docsfab_policy::step::{current_budget, current_feedback};
    let t = table();
    let b = StepBudgets::default();
    assert_eq!(current_budget(&[]), Budget::Initial);
    assert_eq!(current_feedback(&[]), None);
    let mut past = Vec::new();
    for f in [prose(), http(503)] {
        let d = decide(&t, &b, StepAccess::ReadOnly, &past, &f, 10);
        past.push(PastAttempt {
            duration_ms: 10,
            retry: *d.scheduled().expect("scheduled"),
        });
    }
    assert_eq!(current_budget(&past), Budget::Transport);
    assert_eq!(
        current_feedback(&past),
        Some(Feedback::ReturnOnlyTheJsonObject)
    );

    let d = decide(
        &t,
        &b,
        StepAccess::ReadOnly,
        &past,
        &AttemptFailure::ContextExhausted { context: None },
        10,
    );
    // The record fields come from the decision's accessors, as the runtime writes them.
    assert_eq!(
        serde_json::to_value(d.retry_decision()).expect("serializes"),
        "terminal"
    );
    assert_eq!(d.retry_rule(), "terminal-context-exhausted");
    assert!(!d.retry_scheduled());
    assert_eq!(d.wait_ms(), None);
    let failure = serde_json::to_value(d.failure()).expect("serializes");
    assert_eq!(failure["category"], "context-exhausted");
    assert_eq!(
        serde_json::to_value(RetryDecision::None).expect("serializes"),
        "none"
    );
}
