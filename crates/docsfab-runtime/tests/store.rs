//! The run store against real SQLite files and real processes.

mod records;

use std::process::{Command, Stdio};

use docsfab_record::*;
use docsfab_runtime::record::validate_against_schema;
use docsfab_runtime::snapshot::WrittenFile;
use docsfab_runtime::store::{BusyRetry, RunStore, StepEnd, StoreError, StoreOptions};
use docsfab_runtime::written::{Kept, MAX_RUN_BYTES, MAX_SIDE_BYTES};
use docsfab_throttle::process::Holder;
use records::*;
use serde_json::json;

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
                basis: None,
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
    assert_eq!(record.steps[0].attempts[1].usage.input_tokens, Some(200));
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
    let owner = Holder::of(child.id());
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
    assert_eq!(record.steps[0].attempts[1].usage.input_tokens, Some(200));
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
    let me = Holder::current();
    let impostor = Holder {
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
            context: None,
        }),
        output: None,
        basis: None,
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

/// Short waits so the busy tests take milliseconds; the observer sends every retry to `tx`.
fn quick_options(retries: u32, tx: std::sync::mpsc::Sender<BusyRetry>) -> StoreOptions {
    let tx = std::sync::Mutex::new(tx);
    StoreOptions {
        busy_timeout: std::time::Duration::from_millis(20),
        busy_retries: retries,
        retry_pause: std::time::Duration::from_millis(5),
        on_busy: Some(std::sync::Arc::new(move |b: &BusyRetry| {
            let _ = tx.lock().unwrap().send(b.clone());
        })),
        ..StoreOptions::default()
    }
}

/// Another connection (as another process would) holding the write lock: `BEGIN IMMEDIATE`.
fn hold_write_lock(path: &std::path::Path) -> rusqlite::Connection {
    let other = rusqlite::Connection::open(path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    other
}

/// Issue 9 finding 3: a writer that finds the store locked past its busy timeout tries the
/// whole transaction again, says so to its observer, and its attempt lands once the lock is
/// released. The holder lets go only after the first retry was reported, so the retry is
/// certain, whatever the machine's speed.
#[test]
fn hardening_store_busy_write_is_retried_and_recorded_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let (tx, rx) = std::sync::mpsc::channel();
    let mut store = RunStore::open_with(&path, quick_options(50, tx)).unwrap();
    let run = store.create_run("q").unwrap();
    let step = store.begin_step(&run, &step_start("s")).unwrap();

    let holder = hold_write_lock(&path);
    let release = std::thread::spawn(move || {
        let first: BusyRetry = rx.recv().unwrap();
        holder.execute_batch("COMMIT").unwrap();
        first
    });
    store
        .record_attempt(&run, step, &attempt(1, RetryDecision::None))
        .unwrap();
    let first = release.join().unwrap();
    assert_eq!(first.operation, "recording an attempt");
    assert_eq!(first.retry, 1);
    assert!(store.busy_retries() >= 1);
    let record = RunStore::open(&path)
        .unwrap()
        .load_run(&run)
        .unwrap()
        .unwrap();
    assert_eq!(record.steps[0].attempts.len(), 1);
}

/// Issue 9 finding 3: the retry is bounded. A lock that is never released ends in one error
/// that says what was being done and how long it waited, and nothing half-written remains.
#[test]
fn hardening_store_busy_retries_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let (tx, rx) = std::sync::mpsc::channel();
    let mut store = RunStore::open_with(&path, quick_options(2, tx)).unwrap();
    let run = store.create_run("q").unwrap();
    let holder = hold_write_lock(&path);
    let err = store.begin_step(&run, &step_start("s")).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Busy {
                operation: "starting a step",
                tries: 3,
                timeout_ms: 20
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the run store stayed locked by another process while starting a step (3 tries, each waiting up to 20 ms)"
    );
    assert_eq!(rx.try_iter().count(), 2);
    drop(holder);
    let record = store.load_run(&run).unwrap().unwrap();
    assert!(record.steps.is_empty());
}

/// Issue 9 finding 3: opening the store and listing runs only read once the file exists, so
/// they do not wait on a writer (WAL readers never block), and `runs list` keeps working while
/// runs write.
#[test]
fn hardening_store_opens_and_reads_while_another_process_holds_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let run = RunStore::open(&path).unwrap().create_run("q").unwrap();
    let holder = hold_write_lock(&path);
    let (tx, rx) = std::sync::mpsc::channel();
    let store = RunStore::open_with(&path, quick_options(0, tx)).unwrap();
    assert_eq!(store.list_runs().unwrap()[0].run_id, run);
    assert!(store.load_run(&run).unwrap().is_some());
    assert_eq!(rx.try_iter().count(), 0);
    drop(holder);
}

/// Issue 9 finding 11: a write intent committed during an attempt that never finished (its
/// process was killed) is listed, with its path, in the step's `interruptedAttempt` on the
/// next open; the intents of recorded attempts are not.
#[test]
fn hardening_write_intents_of_a_killed_attempt_are_listed_on_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut child = Command::new("sleep")
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let owner = Holder::of(child.id());
    let run = {
        let mut store = RunStore::open(&path).unwrap();
        let run = store.create_run_owned_by("q", owner).unwrap();
        let mut start = step_start("pages");
        start.access = Access::Write;
        let step = store.begin_step(&run, &start).unwrap();
        store
            .record_write_intent(&run, step, 1, "write_file", "docs/old.md")
            .unwrap();
        store
            .record_attempt(&run, step, &attempt(1, RetryDecision::Scheduled))
            .unwrap();
        // Attempt 1 is recorded: it takes no more intents.
        assert!(matches!(
            store.record_write_intent(&run, step, 1, "write_file", "docs/late.md"),
            Err(StoreError::AttemptFinished { attempt: 1, .. })
        ));
        store
            .record_write_intent(&run, step, 2, "write_file", "docs/a.md")
            .unwrap();
        store
            .record_write_intent(&run, step, 2, "write_file", "docs/b.md")
            .unwrap();
        run
    };
    child.kill().unwrap();
    child.wait().unwrap();

    let store = RunStore::open(&path).unwrap();
    assert_eq!(store.interrupted_on_open(), std::slice::from_ref(&run));
    let record = store.load_run(&run).unwrap().unwrap();
    let step = &record.steps[0];
    assert_eq!(step.status, RunStatus::Interrupted);
    assert_eq!(step.attempts.len(), 1);
    let unfinished = step.interrupted_attempt.as_ref().unwrap();
    assert_eq!(unfinished.attempt, 2);
    let paths: Vec<&str> = unfinished
        .write_intents
        .iter()
        .map(|w| w.path.as_str())
        .collect();
    assert_eq!(paths, ["docs/a.md", "docs/b.md"]);
    assert_eq!(unfinished.write_intents[0].tool, "write_file");
    validate_against_schema(&serde_json::to_value(&record).unwrap()).unwrap();
}

fn sample_context() -> RunContext {
    RunContext {
        workspace: "/srv/project".into(),
        provider: RunProvider {
            name: "default".into(),
            api: docsfab_record::Api::AnthropicMessages,
            host: "127.0.0.1:8080".into(),
        },
        model: "sim-model".into(),
        docsfab_version: "0.1.0".into(),
        resumed_from: None,
    }
}

/// Issue 11: the run's context is stored when the run is created, so a run still `running`
/// (and one later marked `interrupted`) already names its workspace, provider and model.
#[test]
fn issue11_a_running_run_already_has_its_context() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut store = RunStore::open(&path).unwrap();
    let run = store
        .create_run_with_context("quickstart", &sample_context())
        .unwrap();
    let record = RunStore::open(&path)
        .unwrap()
        .load_run(&run)
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RunStatus::Running);
    assert_eq!(record.workspace.as_deref(), Some("/srv/project"));
    assert_eq!(record.provider, Some(sample_context().provider));
    assert_eq!(record.model.as_deref(), Some("sim-model"));
    assert_eq!(record.docsfab_version.as_deref(), Some("0.1.0"));
    validate_against_schema(&serde_json::to_value(&record).unwrap()).unwrap();
}

/// Issue 11: a store written before runs had a context column (and attempts an excerpt) opens,
/// gains the column, and its runs read back with those fields null.
#[test]
fn issue11_a_store_from_before_the_context_column_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let run = {
        let mut store = RunStore::open(&path).unwrap();
        let run = store.create_run("old").unwrap();
        let step = store.begin_step(&run, &step_start("outline")).unwrap();
        store
            .record_attempt(&run, step, &attempt(1, RetryDecision::None))
            .unwrap();
        store.finish_run(&run, RunStatus::Succeeded).unwrap();
        run
    };
    // Make it the previous version's store: no context column, attempt JSON without the
    // excerpt keys.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute("ALTER TABLE runs DROP COLUMN context", [])
            .unwrap();
        let text: String = conn
            .query_row("SELECT record FROM attempts", [], |r| r.get(0))
            .unwrap();
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let map = value.as_object_mut().unwrap();
        map.remove("answerExcerpt").unwrap();
        map.remove("answerBytes").unwrap();
        conn.execute("UPDATE attempts SET record = ?1", [value.to_string()])
            .unwrap();
    }
    let store = RunStore::open(&path).unwrap();
    let record = store.load_run(&run).unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Succeeded);
    assert_eq!(record.workspace, None);
    assert_eq!(record.provider, None);
    assert_eq!(record.model, None);
    assert_eq!(record.steps[0].attempts[0].answer_excerpt, None);
    let value = serde_json::to_value(&record).unwrap();
    assert_eq!(value["provider"], serde_json::Value::Null);
    validate_against_schema(&value).unwrap();
    // The migrated store takes new runs with a context.
    let mut store = store;
    let new = store
        .create_run_with_context("new", &sample_context())
        .unwrap();
    let record = store.load_run(&new).unwrap().unwrap();
    assert_eq!(record.model.as_deref(), Some("sim-model"));
}

fn written(path: &str, before: Option<Vec<u8>>, after: Option<Vec<u8>>) -> WrittenFile {
    let sha = |b: &Vec<u8>| format!("{:064x}", b.len());
    WrittenFile {
        path: path.into(),
        sha256_before: before.as_ref().map(sha),
        sha256_after: after.as_ref().map(sha),
        before,
        after,
        linked_before: None,
    }
}

/// Issue 21: a file that was a hard link before the write keeps its size and hash in the store,
/// never its content, and says why (`hard-linked`).
#[test]
fn issue21_a_hard_linked_file_keeps_its_size_and_hash_but_no_content() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = RunStore::open(&dir.path().join("runs.db")).unwrap();
    let run = store.create_run("linked").unwrap();
    let step = store.begin_step(&run, &step_start("pages")).unwrap();
    let file = WrittenFile {
        path: "docs/hard.md".into(),
        before: None,
        after: Some(b"# Mine\n".to_vec()),
        sha256_before: Some("a".repeat(64)),
        sha256_after: Some("b".repeat(64)),
        linked_before: Some(24),
    };
    store
        .record_attempt_with_files(
            &run,
            step,
            &attempt(1, RetryDecision::None),
            &[(file, Kept::HardLinked)],
        )
        .unwrap();
    let rows = store.written_files(&run).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].kept, Kept::HardLinked);
    assert_eq!(rows[0].before.bytes, 24);
    assert_eq!(rows[0].before.sha256.as_deref(), Some(&*"a".repeat(64)));
    assert_eq!(rows[0].before.text, None);
    assert_eq!(rows[0].after.text, None, "neither side of it is kept");
}

/// Issue 11: a store made before `written_files` existed (and an attempt recorded without
/// `filesWritten`) opens with the table added, its old run still loads, and new contents go in.
#[test]
fn issue11_a_store_from_before_written_files_gains_the_table_and_keeps_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let mut store = RunStore::open(&path).unwrap();
    let old_run = store.create_run("old").unwrap();
    let step = store.begin_step(&old_run, &step_start("outline")).unwrap();
    store
        .record_attempt(&old_run, step, &attempt(1, RetryDecision::None))
        .unwrap();
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("DROP TABLE written_files").unwrap();
    drop(conn);

    let mut store = RunStore::open(&path).unwrap();
    let old = store.load_run(&old_run).unwrap().unwrap();
    assert_eq!(old.steps[0].attempts[0].files_written, None);
    assert!(store.written_files(&old_run).unwrap().is_empty());
    let run = store.create_run("new").unwrap();
    let step = store.begin_step(&run, &step_start("pages")).unwrap();
    let file = written("docs/a.md", None, Some(b"# A\n".to_vec()));
    store
        .record_attempt_with_files(
            &run,
            step,
            &attempt(1, RetryDecision::None),
            &[(file, Kept::Text)],
        )
        .unwrap();
    let rows = store.written_files(&run).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].after.text.as_deref(), Some("# A\n"));
    assert_eq!(rows[0].before.sha256, None);
}

/// Issue 11: the contents go in with the attempt's record or not at all, and a run keeps at
/// most 64 MiB of them; past that a file keeps its hashes and sizes only (`run-cap`).
#[test]
fn issue11_written_contents_commit_with_their_attempt_and_stop_at_the_run_cap() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = RunStore::open(&dir.path().join("runs.db")).unwrap();
    let run = store.create_run("big").unwrap();
    let step = store.begin_step(&run, &step_start("pages")).unwrap();
    let side = vec![b'a'; MAX_SIDE_BYTES];
    let files: Vec<(WrittenFile, Kept)> = (0..33)
        .map(|i| {
            let f = written(&format!("f{i}.md"), Some(side.clone()), Some(side.clone()));
            (f, Kept::Text)
        })
        .collect();
    // Out of order: refused, and none of its contents stay behind.
    let refused =
        store.record_attempt_with_files(&run, step, &attempt(2, RetryDecision::None), &files[..1]);
    assert!(matches!(refused, Err(StoreError::AttemptOutOfOrder { .. })));
    assert!(store.written_files(&run).unwrap().is_empty());

    store
        .record_attempt_with_files(&run, step, &attempt(1, RetryDecision::None), &files)
        .unwrap();
    let rows = store.written_files(&run).unwrap();
    assert_eq!(rows.len(), 33);
    // 32 files of 2 MiB fill the 64 MiB; the 33rd keeps only its hashes and sizes.
    assert!(rows[..32].iter().all(|r| r.kept == Kept::Text));
    assert_eq!(MAX_RUN_BYTES, 64 << 20);
    assert_eq!(rows[32].kept, Kept::RunCap);
    assert_eq!(rows[32].after.text, None);
    assert_eq!(rows[32].after.bytes, MAX_SIDE_BYTES as u64);
    assert!(rows[32].after.sha256.is_some());
}
