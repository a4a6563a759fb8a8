//! The run store against real SQLite files and real processes.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use docsfab_runtime::ledger::{Disposition, StopReason};
use docsfab_runtime::record::*;
use docsfab_runtime::store::{
    Owner, RunStore, StepEnd, StepStart, StoreError, process_start_ticks,
};
use serde_json::json;

fn step_start(id: &str) -> StepStart {
    StepStart {
        step_id: id.into(),
        access: StepAccess::ReadOnly,
        configured_max_retries: 3,
        effective_max_retries: 2,
        transport_retry: TransportRetryBudget {
            max_transport_retries: 6,
            transport_max_delay_ms: 60_000,
            transport_max_elapsed_ms: 3_600_000,
            base_delay_ms: 1000,
        },
    }
}

fn attempt(n: u32, decision: RetryDecision) -> AttemptRecord {
    AttemptRecord {
        attempt: n,
        budget: if n == 1 {
            AttemptBudget::Initial
        } else {
            AttemptBudget::Transport
        },
        status: if decision == RetryDecision::None {
            AttemptStatus::Succeeded
        } else {
            AttemptStatus::Failed
        },
        started_at: rfc3339_utc(std::time::SystemTime::now()),
        provider_error_class: None,
        http_status: None,
        retry_after_ms: None,
        failure_category: None,
        failure_class: None,
        code: None,
        message: None,
        timeout_kind: None,
        retry_rule: None,
        retry: Retry { decision },
        wait_ms: decision.is_scheduled().then_some(1000),
        write_settlement: None,
        usage: Usage {
            input_tokens: 100 * u64::from(n),
            output_tokens: 7,
        },
        duration_ms: 1234,
        lease: LeaseRecord {
            max_turns: 12,
            turns_used: 1,
            executed_tool_calls: 0,
            tool_counters: BTreeMap::new(),
            stop_reason: StopReason::ProviderFailed,
            disposition: Disposition::Failed,
            evidence: None,
        },
        turns: vec![],
    }
}

/// Requirement: OPS-1.
#[test]
fn full_run_round_trips_and_meets_the_schema_ops_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut store = RunStore::open(&path).unwrap();
    let run = store.create_run("quickstart").unwrap();
    let step = store.begin_step(&run, &step_start("outline")).unwrap();
    store
        .record_attempt(&run, step, &attempt(1, RetryDecision::Scheduled))
        .unwrap();
    store
        .record_attempt(&run, step, &attempt(2, RetryDecision::None))
        .unwrap();
    store
        .finish_step(
            &run,
            step,
            &StepEnd {
                status: RunStatus::Succeeded,
                failure: None,
                output: Some(json!({"modules": []})),
            },
        )
        .unwrap();
    store.finish_run(&run, RunStatus::Succeeded).unwrap();

    let record = RunStore::open(&path)
        .unwrap()
        .load_run(&run)
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RunStatus::Succeeded);
    assert!(record.ended_at.is_some());
    assert_eq!(record.steps.len(), 1);
    assert_eq!(record.steps[0].effective_max_retries, 2);
    assert_eq!(record.steps[0].output, Some(json!({"modules": []})));
    let numbers: Vec<u32> = record.steps[0].attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(numbers, [1, 2]);
    assert_eq!(record.steps[0].attempts[1].usage.input_tokens, 200);
    validate_against_schema(&serde_json::to_value(&record).unwrap()).unwrap();
}

#[test]
fn store_uses_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    drop(RunStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

#[test]
fn a_recorded_attempt_is_visible_to_another_connection_before_the_next_begins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut writer = RunStore::open(&path).unwrap();
    let run = writer.create_run("q").unwrap();
    let step = writer.begin_step(&run, &step_start("s")).unwrap();
    writer
        .record_attempt(&run, step, &attempt(1, RetryDecision::Scheduled))
        .unwrap();
    // A second, independent connection (as a crash-recovering process would have) sees it.
    let reader = RunStore::open(&path).unwrap();
    let seen = reader.load_run(&run).unwrap().unwrap();
    assert_eq!(seen.steps[0].attempts.len(), 1);
    assert_eq!(
        seen.status,
        RunStatus::Running,
        "owner is alive: not interrupted"
    );
}

#[test]
fn attempts_out_of_order_and_writes_to_finished_runs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = RunStore::open(&dir.path().join("runs.db")).unwrap();
    let run = store.create_run("q").unwrap();
    let step = store.begin_step(&run, &step_start("s")).unwrap();
    let err = store
        .record_attempt(&run, step, &attempt(2, RetryDecision::None))
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::AttemptOutOfOrder {
            expected: 1,
            got: 2,
            ..
        }
    ));
    assert!(matches!(
        store.record_attempt(&run, 9, &attempt(1, RetryDecision::None)),
        Err(StoreError::UnknownStep { step_index: 9, .. })
    ));
    assert!(matches!(
        store.finish_run(&run, RunStatus::Running),
        Err(StoreError::FinishAsRunning)
    ));
    store.finish_run(&run, RunStatus::Failed).unwrap();
    assert!(matches!(
        store.record_attempt(&run, step, &attempt(1, RetryDecision::None)),
        Err(StoreError::NotRunning { .. })
    ));
    assert!(matches!(
        store.finish_run("run-nope", RunStatus::Failed),
        Err(StoreError::UnknownRun(_))
    ));
    assert!(store.load_run("run-nope").unwrap().is_none());
}

#[test]
fn runs_are_listed_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = RunStore::open(&dir.path().join("runs.db")).unwrap();
    let first = store.create_run("one").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let second = store.create_run("two").unwrap();
    let third = store.create_run("three").unwrap();
    store.finish_run(&first, RunStatus::Cancelled).unwrap();
    let list = store.list_runs().unwrap();
    let ids: Vec<&str> = list.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, [third.as_str(), second.as_str(), first.as_str()]);
    assert_eq!(list[2].status, RunStatus::Cancelled);
    assert_eq!(list[2].composition, "one");
    assert!(list[0].ended_at.is_none());
    let json = serde_json::to_value(&list[0]).unwrap();
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 5);
    for key in ["runId", "composition", "status", "startedAt", "endedAt"] {
        assert!(json.get(key).is_some(), "{key}");
    }
}

/// A run owned by a real process that is then killed with SIGKILL is found on the next open
/// and marked interrupted, with every attempt it had finished.
#[test]
fn run_of_a_killed_owner_is_interrupted_with_its_attempts_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut child = Command::new("sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let owner = Owner {
        pid: child.id(),
        start_ticks: process_start_ticks(child.id()),
    };
    assert!(owner.start_ticks.is_some());
    let (run, done) = {
        let mut store = RunStore::open(&path).unwrap();
        let run = store.create_run_owned_by("quickstart", owner).unwrap();
        let done = store.create_run("finished").unwrap();
        store.finish_run(&done, RunStatus::Succeeded).unwrap();
        let step = store.begin_step(&run, &step_start("outline")).unwrap();
        store
            .record_attempt(&run, step, &attempt(1, RetryDecision::Scheduled))
            .unwrap();
        store
            .record_attempt(&run, step, &attempt(2, RetryDecision::Scheduled))
            .unwrap();
        (run, done)
    };
    // While the owner lives, reopening leaves the run alone.
    let store = RunStore::open(&path).unwrap();
    assert!(store.interrupted_on_open().is_empty());
    assert_eq!(
        store.load_run(&run).unwrap().unwrap().status,
        RunStatus::Running
    );
    drop(store);

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let store = RunStore::open(&path).unwrap();
    assert_eq!(store.interrupted_on_open(), std::slice::from_ref(&run));
    let record = store.load_run(&run).unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Interrupted);
    assert!(record.ended_at.is_some());
    assert_eq!(record.steps[0].status, RunStatus::Interrupted);
    assert_eq!(record.steps[0].attempts.len(), 2);
    assert_eq!(record.steps[0].attempts[1].usage.input_tokens, 200);
    validate_against_schema(&serde_json::to_value(&record).unwrap()).unwrap();
    assert_eq!(
        store.load_run(&done).unwrap().unwrap().status,
        RunStatus::Succeeded,
        "a finished run is never touched"
    );
}

#[test]
fn a_reused_process_id_is_not_mistaken_for_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let me = Owner::current();
    let impostor = Owner {
        pid: me.pid,
        start_ticks: me.start_ticks.map(|t| t.wrapping_sub(1)),
    };
    let run = RunStore::open(&path)
        .unwrap()
        .create_run_owned_by("q", impostor)
        .unwrap();
    let store = RunStore::open(&path).unwrap();
    assert_eq!(
        store.load_run(&run).unwrap().unwrap().status,
        RunStatus::Interrupted
    );
}

#[test]
fn a_finished_step_takes_no_more_attempts_and_a_fresh_home_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("home/.docsfab/runs.db");
    let mut store = RunStore::open(&path).unwrap();
    let run = store.create_run("q").unwrap();
    let step = store.begin_step(&run, &step_start("s")).unwrap();
    let end = StepEnd {
        status: RunStatus::Failed,
        failure: Some(StepFailure {
            category: "contract".into(),
            failure_class: "model-output".into(),
            code: "contract-prose".into(),
            message: "the answer is prose".into(),
            remediation: "tighten the instructions".into(),
        }),
        output: None,
    };
    store.finish_step(&run, step, &end).unwrap();
    assert!(matches!(
        store.record_attempt(&run, step, &attempt(1, RetryDecision::None)),
        Err(StoreError::StepFinished { .. })
    ));
    assert!(matches!(
        store.finish_step(&run, step, &end),
        Err(StoreError::StepFinished { .. })
    ));
    let record = store.load_run(&run).unwrap().unwrap();
    assert_eq!(record.steps[0].failure, end.failure);
    assert_eq!(record.steps[0].status, RunStatus::Failed);
}
