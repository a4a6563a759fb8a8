//! Write settlement reconciles every batch of every turn with the lease (WRT-1..3).

use std::fs;

use docsfab_policy::class::ProviderFailure;
use docsfab_policy::rules::RulesTable;
use docsfab_policy::step::{self, AttemptFailure, StepBudgets, WritePlan};
use docsfab_record::{
    AttemptRecord, AttemptStatus, Budget, CallOutcome, CallResult, FaultKind, LeaseRecord,
    RecordedSettlement, RejectReason, Retry, RetryDecision, ToolBatch, TurnRecord, TurnStatus,
    Usage,
};
use docsfab_runtime::batch::{RequestedCall, run_batch};
use docsfab_runtime::composition::Tool;
use docsfab_runtime::ledger::{BatchBuilder, Checkpoint, ExecutionLease, TurnEvidence};
use docsfab_runtime::settlement::{settle, settle_attempt};
use docsfab_runtime::tools::{StepTools, ToolPolicy};
use docsfab_runtime::workspace::Workspace;
use proptest::prelude::*;

fn call(id: &str, name: &str, arguments: &str) -> RequestedCall {
    RequestedCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

/// Runs the given turns of a write step on a real workspace and returns its batches and lease.
fn run_write_attempt(turns: &[Vec<RequestedCall>]) -> (Vec<ToolBatch>, LeaseRecord) {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("docs")).unwrap();
    fs::write(dir.path().join("README.md"), "# readme\n").unwrap();
    let ws = Workspace::open(dir.path()).unwrap();
    let mut tools = StepTools::for_attempt(
        &ws,
        ToolPolicy {
            offered: vec![Tool::ReadFile, Tool::WriteFile],
            write_roots: vec!["docs/".into()],
            source_read_bytes: 10_000,
        },
    );
    let mut lease = ExecutionLease::new(10);
    let mut batches = Vec::new();
    for calls in turns {
        lease.begin_turn(tools.preflight()).unwrap();
        let out = run_batch(&mut tools, &mut lease, calls);
        let decision = lease.checkpoint(TurnEvidence {
            batch: &out.batch,
            no_progress: false,
            assistant_text: "",
        });
        batches.push(out.batch);
        if decision != Checkpoint::Renew {
            break;
        }
    }
    // The attempt then failed (say, a transport fault on the next turn).
    lease.stop(docsfab_record::LeaseStop::ProviderFailed, None);
    (batches, lease.record().unwrap())
}

/// Requirement: WRT-2, WRT-3.
#[test]
fn an_attempt_that_only_read_settles_as_no_write_wrt_2_wrt_3() {
    let (batches, lease) = run_write_attempt(&[
        vec![call("a", "read_file", r#"{"path":"README.md"}"#)],
        vec![
            call("b", "write_file", r#"{"path":"src/x.rs","content":"x"}"#),
            call("c", "write_fil", r#"{}"#),
        ],
    ]);
    let s = settle(&batches, &lease);
    assert_eq!(s.settlement, RecordedSettlement::NoWrite, "{:?}", s.reason);
    assert_eq!(next_move(s.settlement), "retry");
}

/// Requirement: WRT-1, WRT-3.
#[test]
fn an_executed_write_settles_as_write_executed_and_needs_a_restore_wrt_1_wrt_3() {
    let (batches, lease) = run_write_attempt(&[vec![
        call("a", "read_file", r#"{"path":"README.md"}"#),
        call("b", "write_file", r#"{"path":"docs/a.md","content":"A"}"#),
    ]]);
    let s = settle(&batches, &lease);
    assert_eq!(s.settlement, RecordedSettlement::WriteExecuted);
    assert_eq!(next_move(s.settlement), "restore-then-retry");
}

fn written() -> (Vec<ToolBatch>, LeaseRecord) {
    run_write_attempt(&[
        vec![call("a", "read_file", r#"{"path":"README.md"}"#)],
        vec![call(
            "b",
            "write_file",
            r#"{"path":"docs/a.md","content":"A"}"#,
        )],
    ])
}

fn assert_unavailable(batches: &[ToolBatch], lease: &LeaseRecord, why: &str) {
    let s = settle(batches, lease);
    assert_eq!(s.settlement, RecordedSettlement::Unavailable, "{why}");
    assert_eq!(next_move(s.settlement), "decline");
    assert!(s.reason.is_some());
}

/// Requirement: WRT-2.
#[test]
fn a_missing_result_is_unavailable_wrt_2() {
    let (mut batches, lease) = written();
    batches[1].calls[0].outcome = CallOutcome::Executed { result: None };
    assert_unavailable(&batches, &lease, "missing result");
}

/// Requirement: WRT-2.
#[test]
fn an_unknown_executed_tool_is_unavailable_wrt_2() {
    let (mut batches, mut lease) = written();
    batches[0].calls[0].tool = "run_shell".into();
    assert_unavailable(&batches, &lease, "unknown tool in a batch");
    let (batches, _) = written();
    lease.tool_counters.insert("run_shell".into(), 0);
    assert_unavailable(&batches, &lease, "unknown tool in the counters");
}

/// Requirement: WRT-2.
#[test]
fn inconsistent_counters_are_unavailable_wrt_2() {
    let (batches, lease) = written();
    let mut hidden_write = lease.clone();
    hidden_write.tool_counters.insert("write_file".into(), 2);
    assert_unavailable(
        &batches,
        &hidden_write,
        "per-tool counter above the batches",
    );

    let mut total = lease.clone();
    total.executed_tool_calls = 3;
    assert_unavailable(&batches, &total, "lease total above the batches");

    let mut dropped = lease.clone();
    dropped.tool_counters.remove("read_file");
    assert_unavailable(&batches, &dropped, "a counter missing");

    let mut batches = batches;
    batches[1].executed = 0;
    assert_unavailable(
        &batches,
        &lease,
        "a batch count that disagrees with its calls",
    );
}

/// Requirement: WRT-2.
#[test]
fn a_missing_turn_is_unavailable_wrt_2() {
    let (batches, lease) = written();
    // Only the first turn's batch survived: the write of turn 2 is unaccounted for.
    assert_unavailable(&batches[..1], &lease, "a turn's batch missing");
}

/// What the executor does after a transport failure of a write step whose attempt settled so:
/// it asks the step policy, as production does (WRT-1).
fn next_move(settlement: RecordedSettlement) -> &'static str {
    let table = RulesTable::embedded().expect("the shipped table is valid");
    let failure = AttemptFailure::Provider {
        failure: ProviderFailure::from_fault(FaultKind::ConnectionDropped),
    };
    match step::decide_write(
        &table,
        &StepBudgets::default(),
        &[],
        &failure,
        10,
        settlement,
    ) {
        WritePlan::RestoreFirst(_) => "restore-then-retry",
        WritePlan::Decided(d) if d.decision.retry_scheduled() => "retry",
        WritePlan::Decided(_) => "decline",
    }
}

/// The failed attempt record the executor settles: one turn per batch, and the lease.
fn attempt_record(batches: Vec<ToolBatch>, lease: LeaseRecord) -> AttemptRecord {
    let turns = batches
        .into_iter()
        .zip(1..)
        .map(|(tool_batch, turn)| TurnRecord {
            cost_usd: None,
            turn,
            status: TurnStatus::Completed,
            replays: vec![],
            tool_batch,
            usage: Usage::ZERO,
            reason: None,
            held_ms: 0,
            duration_ms: None,
            warnings: Vec::new(),
        })
        .collect();
    AttemptRecord {
        cost_usd: None,
        attempt: 1,
        budget: Budget::Initial,
        status: AttemptStatus::Failed,
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
        usage: Usage::ZERO,
        duration_ms: 10,
        lease,
        turns,
    }
}

/// Requirement: WRT-2.
#[test]
fn an_attempt_whose_turns_disagree_with_its_lease_is_unavailable_wrt_2() {
    let (batches, lease) = written();
    let mut attempt = attempt_record(batches, lease);
    assert_eq!(
        settle_attempt(&attempt).settlement,
        RecordedSettlement::WriteExecuted
    );
    // A turn lost from the record: the lease still counts it.
    attempt.turns.pop();
    let s = settle_attempt(&attempt);
    assert_eq!(s.settlement, RecordedSettlement::Unavailable);
    let reason = s.reason.expect("an unavailable settlement says why");
    assert!(reason.contains("its lease 2"), "{reason}");
}

proptest! {
    /// Requirement: WRT-2.
    /// For any ledger the host built itself, the settlement is never unavailable and says
    /// write-executed exactly when a write_file call executed; raising any counter by one makes
    /// it unavailable.
    #[test]
    fn consistent_ledgers_settle_and_any_counter_drift_is_unavailable_wrt_2(
        turns in proptest::collection::vec(
            proptest::collection::vec((0u8..3, 0u8..4), 0..4), 1..6),
        drift_pick in any::<prop::sample::Index>(),
    ) {
        let tools = [Tool::ListFiles, Tool::ReadFile, Tool::SearchText, Tool::WriteFile];
        let mut lease = ExecutionLease::new(10);
        let mut batches = Vec::new();
        let mut any_write = false;
        for calls in &turns {
            lease.begin_turn(Ok(())).unwrap();
            let mut b = BatchBuilder::new();
            for (i, (kind, t)) in calls.iter().enumerate() {
                let tool = tools[usize::from(*t)];
                match kind {
                    0 => b.reject(&i.to_string(), tool.name(), RejectReason::SchemaMismatch, ""),
                    1 => b.refuse(&i.to_string(), tool.name(), "outside"),
                    _ => {
                        lease.authorize(tool).unwrap();
                        let slot = b.start(&i.to_string(), tool);
                        b.finish(slot, CallResult::ToolError);
                        any_write |= tool.writes();
                    }
                }
            }
            let batch = b.build();
            let _ = lease.checkpoint(TurnEvidence { batch: &batch, no_progress: false, assistant_text: "" });
            batches.push(batch);
            if lease.end().is_some() {
                break;
            }
        }
        lease.stop(docsfab_record::LeaseStop::ProviderFailed, None);
        let record = lease.record().unwrap();
        let s = settle(&batches, &record);
        let expected = if any_write { RecordedSettlement::WriteExecuted } else { RecordedSettlement::NoWrite };
        prop_assert_eq!(s.settlement, expected);

        let mut drifted = record.clone();
        let name = tools[drift_pick.index(tools.len())].name().to_owned();
        *drifted.tool_counters.entry(name).or_insert(0) += 1;
        prop_assert_eq!(settle(&batches, &drifted).settlement, RecordedSettlement::Unavailable);
    }
}
