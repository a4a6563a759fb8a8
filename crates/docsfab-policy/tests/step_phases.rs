//! The questions a step driver asks the policy once each (WRT-1..3, STP-7): the facts of a
//! failure as it stands, and a write step's decision in two phases around a restore.
//!
//! Each test compares the new question with what a driver used to work out by asking
//! `decide` several times (with doctored budgets, or once before and once after a restore),
//! so the answers stay the same decisions.

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::rules::RulesTable;
use docsfab_policy::step::{
    AttemptFailure, Ending, PastAttempt, StepAccess, StepBudgets, StepDecision, ValidatorRefusal,
    WriteDecision, WritePlan, WriteSettlement, decide, decide_write, failure_facts,
};
use docsfab_record::{ContractFailure, FaultKind, RecordedSettlement, RetryDecision};

fn table() -> RulesTable {
    RulesTable::embedded().expect("the shipped table is valid")
}

/// One failure of every kind the policy tells apart.
fn failures() -> Vec<AttemptFailure> {
    let provider = |failure| AttemptFailure::Provider { failure };
    let mut all = vec![
        provider(ProviderFailure::from_http_status(503, None)),
        provider(ProviderFailure::from_http_status(429, Some(5_000))),
        provider(ProviderFailure::from_http_status(400, None)),
        provider(ProviderFailure::from_http_status(401, None)),
        provider(ProviderFailure::from_http_status(504, None)),
        provider(ProviderFailure::from_fault(FaultKind::ConnectionDropped)),
        AttemptFailure::CutAnswer,
        AttemptFailure::AttemptDeadline,
        AttemptFailure::NoProgress,
        AttemptFailure::ContextExhausted { context: None },
        AttemptFailure::Cancelled,
        AttemptFailure::RefusedBeforeSend {
            error_text: "host preflight failed: the workspace is gone".into(),
        },
        AttemptFailure::ValidatorTerminal {
            refusal: ValidatorRefusal::CredentialMaterial,
        },
    ];
    for failure in [
        ContractFailure::Prose,
        ContractFailure::Array,
        ContractFailure::Empty,
        ContractFailure::SchemaInvalid,
    ] {
        all.push(AttemptFailure::Contract { failure });
    }
    all
}

/// Step histories: none, and some retries already spent from each budget.
fn histories(table: &RulesTable, budgets: &StepBudgets) -> Vec<Vec<PastAttempt>> {
    let mut all = vec![Vec::new()];
    for (f, n) in [
        (
            AttemptFailure::Provider {
                failure: ProviderFailure::from_http_status(503, None),
            },
            6,
        ),
        (
            AttemptFailure::Contract {
                failure: ContractFailure::Prose,
            },
            3,
        ),
    ] {
        let mut past = Vec::new();
        for _ in 0..n {
            let d = decide(table, budgets, StepAccess::ReadOnly, &past, &f, 40);
            let Some(retry) = d.scheduled().copied() else {
                break;
            };
            past.push(PastAttempt {
                duration_ms: 40,
                retry,
            });
            all.push(past.clone());
        }
    }
    all
}

// The old driver's probe: `decide` with no budget left, read-only, no history.
fn probed_facts(table: &RulesTable, failure: &AttemptFailure) -> (String, String, String) {
    let none = StepBudgets {
        max_retries: 0,
        max_transport_retries: 0,
        ..StepBudgets::default()
    };
    let f = decide(table, &none, StepAccess::ReadOnly, &[], failure, 0)
        .failure()
        .cloned()
        .expect("with no budget every failure ends the step");
    (f.category, f.failure_class, f.code)
}

// STP-7: the record names an attempt's own failure even when it is retried; that failure now
// comes from one question rather than a probe with doctored budgets.
#[test]
fn failure_facts_name_the_failure_as_the_zero_budget_probe_did() {
    let t = table();
    for failure in failures() {
        let facts = failure_facts(&failure);
        assert_eq!(
            (facts.category, facts.failure_class, facts.code),
            probed_facts(&t, &failure),
            "{failure:?}"
        );
    }
}

/// What a write step's driver used to do: ask as if restored, restore when that retries (or
/// when cancelled), and ask again as `restore-failed` when the restore did not hold.
fn two_asks(
    table: &RulesTable,
    budgets: &StepBudgets,
    past: &[PastAttempt],
    failure: &AttemptFailure,
    proven: RecordedSettlement,
    restore_holds: bool,
) -> (Option<bool>, WriteDecision) {
    let ask = |s| decide(table, budgets, StepAccess::Write(s), past, failure, 40);
    let settlement = match proven {
        RecordedSettlement::NoWrite => WriteSettlement::NoWrite,
        RecordedSettlement::Unavailable => WriteSettlement::Unavailable,
        RecordedSettlement::WriteExecuted => WriteSettlement::WriteExecutedAndRestored,
    };
    let decision = ask(settlement);
    let cancelled = matches!(failure, AttemptFailure::Cancelled);
    if proven != RecordedSettlement::WriteExecuted || !(decision.retry_scheduled() || cancelled) {
        return (
            None,
            WriteDecision {
                settlement,
                decision,
            },
        );
    }
    if restore_holds {
        return (
            Some(true),
            WriteDecision {
                settlement,
                decision,
            },
        );
    }
    let settlement = WriteSettlement::RestoreFailed;
    let decision = if cancelled { decision } else { ask(settlement) };
    (
        Some(false),
        WriteDecision {
            settlement,
            decision,
        },
    )
}

/// The two-phase question, answered with the restore's result when it asks for one.
fn two_phases(
    table: &RulesTable,
    budgets: &StepBudgets,
    past: &[PastAttempt],
    failure: &AttemptFailure,
    proven: RecordedSettlement,
    restore_holds: bool,
) -> (Option<bool>, WriteDecision) {
    match decide_write(table, budgets, past, failure, 40, proven) {
        WritePlan::Decided(d) => (None, d),
        WritePlan::RestoreFirst(pending) => {
            (Some(restore_holds), pending.after_restore(restore_holds))
        }
    }
}

// WRT-1..3: every failure, proof, history and restore result gets the same restore and the same
// decision from the two-phase question as from the driver's old sequence of asks.
#[test]
fn the_two_phase_write_decision_matches_the_old_asks_wrt_1_3() {
    let t = table();
    let budgets = StepBudgets::default();
    let mut restores = 0;
    for past in histories(&t, &budgets) {
        for failure in failures() {
            for proven in [
                RecordedSettlement::NoWrite,
                RecordedSettlement::WriteExecuted,
                RecordedSettlement::Unavailable,
            ] {
                for holds in [true, false] {
                    let new = two_phases(&t, &budgets, &past, &failure, proven, holds);
                    let old = two_asks(&t, &budgets, &past, &failure, proven, holds);
                    assert_eq!(new, old, "{failure:?} {proven:?} holds={holds} {past:?}");
                    restores += usize::from(new.0.is_some());
                }
            }
        }
    }
    assert!(restores > 0, "some case must ask for a restore");
}

// WRT-1: a write that ran is restored before a transport retry; when the restore fails the
// retry is declined as write-restore-failed.
#[test]
fn a_retry_after_a_write_waits_for_the_restore_wrt_1() {
    let t = table();
    let failure = AttemptFailure::Provider {
        failure: ProviderFailure::from_http_status(503, None),
    };
    let plan = decide_write(
        &t,
        &StepBudgets::default(),
        &[],
        &failure,
        40,
        RecordedSettlement::WriteExecuted,
    );
    let WritePlan::RestoreFirst(pending) = plan else {
        panic!("a retry after a write needs a restore first: {plan:?}");
    };
    let held = pending.clone().after_restore(true);
    assert_eq!(held.settlement, WriteSettlement::WriteExecutedAndRestored);
    assert_eq!(held.decision.retry_decision(), RetryDecision::Scheduled);
    let failed = pending.after_restore(false);
    assert_eq!(failed.settlement, WriteSettlement::RestoreFailed);
    assert_eq!(failed.decision.retry_decision(), RetryDecision::Declined);
    assert_eq!(
        failed.decision.failure().map(|f| f.code.as_str()),
        Some("write-restore-failed")
    );
}

// A cancelled attempt's writes are restored too, and the step ends cancelled whether or not the
// restore held; a failure no rule retries needs no restore.
#[test]
fn a_cancelled_write_is_restored_and_ends_cancelled() {
    let t = table();
    let budgets = StepBudgets::default();
    let proven = RecordedSettlement::WriteExecuted;
    let plan = decide_write(&t, &budgets, &[], &AttemptFailure::Cancelled, 40, proven);
    let WritePlan::RestoreFirst(pending) = plan else {
        panic!("a cancelled write is restored: {plan:?}");
    };
    for holds in [true, false] {
        let d = pending.clone().after_restore(holds);
        assert!(matches!(
            d.decision,
            StepDecision::End {
                ending: Ending::Cancelled,
                ..
            }
        ));
    }
    let prose = AttemptFailure::Contract {
        failure: ContractFailure::Prose,
    };
    let plan = decide_write(&t, &budgets, &[], &prose, 40, proven);
    assert!(matches!(plan, WritePlan::Decided(_)), "{plan:?}");
}
