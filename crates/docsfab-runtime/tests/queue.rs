//! The run store as `docsfab serve`'s job queue, against real stores and real threads
//! (issue 15): FIFO claiming, exactly-once claims under contention, cancelling, restarts.
//!
//! The cases that must hold on every backend take a [`Place`] and are instantiated per backend
//! by `on_every_backend!`; the SQLite-only ones (a dead process as owner, the schema upgrade of
//! an old file) are plain tests.

use std::collections::BTreeSet;
use std::sync::Barrier;

use docsfab_record::*;
use docsfab_runtime::record::validate_against_schema;
use docsfab_runtime::store::{
    CancelRequest, JobSpec, JobWorkspace, ResumeFrom, ResumeMode, RunStore, StoreError,
    StoreOptions, StoreUrl, end_reason,
};
use docsfab_throttle::process::Holder;
use serde_json::json;

/// A fresh, empty store for one test, kept (directory or database) as long as the value.
struct Place {
    url: StoreUrl,
    _keep: Box<dyn std::any::Any + Send + Sync>,
}

impl Place {
    /// A fresh database; `None` (the case is skipped) without `DOCSFAB_TEST_POSTGRES`.
    fn postgres(label: &str) -> Option<Place> {
        let db = docsfab_pg::testing::fresh_database(label)?;
        Some(Place {
            url: StoreUrl::Postgres(db.url.clone()),
            _keep: Box::new(db),
        })
    }

    fn sqlite() -> Place {
        let dir = tempfile::tempdir().unwrap();
        Place {
            url: StoreUrl::Sqlite(dir.path().join("runs.db")),
            _keep: Box::new(dir),
        }
    }

    /// A connection of its own, as another process would have.
    fn open(&self) -> RunStore {
        RunStore::open_url(&self.url, StoreOptions::default()).unwrap()
    }
}

/// One `#[test]` per backend for each case; the test is `BACKEND::CASE`.
macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $case() {
                super::$case(&super::Place::sqlite());
            })*
        }
        mod postgres {
            $(#[test]
            fn $case() {
                if let Some(place) = super::Place::postgres(stringify!($case)) {
                    super::$case(&place);
                }
            })*
        }
    };
}

on_every_backend!(
    issue15_queued_runs_are_claimed_oldest_first_and_read_as_queued_records,
    issue15_each_queued_run_is_claimed_exactly_once_by_8_competing_stores,
    issue15_cancelling_a_queued_run_ends_it_at_once_with_no_steps,
    issue15_cancelling_a_running_run_sets_the_flag_its_worker_reads,
    issue15_job_spec_round_trips_with_its_json_shape,
    issue15_counts_and_a_status_filtered_listing,
    issue15_a_run_ended_outside_its_steps_keeps_why_as_its_end_reason,
    reaping_a_resume_auto_run_queues_its_resume_in_the_same_transaction_once,
);

fn spec(name: &str) -> JobSpec {
    JobSpec {
        composition_yaml: format!("name: {name}\nsteps: []\n"),
        composition_name: name.into(),
        workspace: JobWorkspace::Path {
            path: format!("/srv/{name}"),
        },
        resume: None,
        resume_from: None,
    }
}

/// A holder that is not alive: this process's pid with another start time, as a reused pid
/// would look.
fn dead_holder() -> Holder {
    let me = Holder::current();
    Holder {
        pid: me.pid,
        start_ticks: me.start_ticks.map(|t| t.wrapping_sub(1)),
    }
}

fn status_of(store: &RunStore, run: &str) -> RunStatus {
    store.load_run(run).unwrap().unwrap().status
}

fn issue15_queued_runs_are_claimed_oldest_first_and_read_as_queued_records(place: &Place) {
    let mut store = place.open();
    assert_eq!(store.url(), &place.url);
    let ids: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| store.enqueue(&spec(n)).unwrap())
        .collect();

    let record = store.load_run(&ids[0]).unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Queued);
    assert_eq!(record.composition, "a");
    assert!(record.steps.is_empty());
    assert_eq!(record.ended_at, None);
    assert_eq!(record.workspace, None);
    assert_eq!(record.provider, None);
    validate_against_schema(&serde_json::to_value(&record).unwrap()).unwrap();

    for (i, expected) in ids.iter().enumerate() {
        let claimed = store.claim_next().unwrap().expect("a queued run");
        assert_eq!(&claimed.run_id, expected, "claim #{i} takes the oldest");
        assert_eq!(claimed.spec, spec(["a", "b", "c"][i]));
        assert_eq!(status_of(&store, expected), RunStatus::Running);
    }
    assert_eq!(store.claim_next().unwrap(), None);
}

fn issue15_each_queued_run_is_claimed_exactly_once_by_8_competing_stores(place: &Place) {
    let queued: BTreeSet<String> = {
        let mut store = place.open();
        (0..50)
            .map(|i| store.enqueue(&spec(&format!("job{i}"))).unwrap())
            .collect()
    };
    assert_eq!(queued.len(), 50);
    let start = Barrier::new(8);
    let claims: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let mut store = place.open();
                    start.wait();
                    let mut mine = Vec::new();
                    while let Some(claimed) = store.claim_next().unwrap() {
                        mine.push(claimed.run_id);
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let distinct: BTreeSet<String> = claims.iter().cloned().collect();
    assert_eq!(claims.len(), 50, "no run is claimed twice");
    assert_eq!(distinct, queued, "every queued run is claimed");
    let store = place.open();
    let counts = store.count_by_status().unwrap();
    assert!(counts.contains(&(RunStatus::Running, 50)), "{counts:?}");
    assert!(counts.contains(&(RunStatus::Queued, 0)), "{counts:?}");
}

fn issue15_cancelling_a_queued_run_ends_it_at_once_with_no_steps(place: &Place) {
    let mut store = place.open();
    let run = store.enqueue(&spec("a")).unwrap();
    assert_eq!(
        store.request_cancel(&run).unwrap(),
        CancelRequest::CancelledQueued
    );
    let record = store.load_run(&run).unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Cancelled);
    assert!(record.ended_at.is_some());
    assert!(record.steps.is_empty());
    assert_eq!(
        record.end_reason.as_deref(),
        Some(end_reason::CANCELLED_WHILE_QUEUED)
    );
    validate_against_schema(&serde_json::to_value(&record).unwrap()).unwrap();
    assert_eq!(
        store.claim_next().unwrap(),
        None,
        "a cancelled run is never claimed"
    );
    assert_eq!(
        store.request_cancel(&run).unwrap(),
        CancelRequest::AlreadyEnded(RunStatus::Cancelled)
    );
    assert!(matches!(
        store.request_cancel("run-19700101-000000-000000"),
        Err(StoreError::UnknownRun(_))
    ));
}

fn issue15_cancelling_a_running_run_sets_the_flag_its_worker_reads(place: &Place) {
    let mut worker = place.open();
    let run = worker.enqueue(&spec("a")).unwrap();
    let claimed = worker.claim_next().unwrap().unwrap();
    assert_eq!(claimed.run_id, run);
    assert!(!worker.cancel_requested(&run).unwrap());

    let mut api = place.open();
    assert_eq!(api.request_cancel(&run).unwrap(), CancelRequest::Requested);
    assert!(worker.cancel_requested(&run).unwrap());
    assert_eq!(
        status_of(&api, &run),
        RunStatus::Running,
        "its worker ends it"
    );

    worker.finish_run(&run, RunStatus::Cancelled).unwrap();
    assert_eq!(
        api.request_cancel(&run).unwrap(),
        CancelRequest::AlreadyEnded(RunStatus::Cancelled)
    );
    assert!(matches!(
        api.cancel_requested("run-19700101-000000-000000"),
        Err(StoreError::UnknownRun(_))
    ));
}

/// A run its steps cannot explain (a served run whose clone failed) keeps the sentence as its
/// `endReason`, read back by any connection; a run that ended through its steps has none.
fn issue15_a_run_ended_outside_its_steps_keeps_why_as_its_end_reason(place: &Place) {
    let mut worker = place.open();
    let failed = worker.enqueue(&spec("clone")).unwrap();
    let ok = worker.enqueue(&spec("fine")).unwrap();
    assert_eq!(worker.claim_next().unwrap().unwrap().run_id, failed);
    assert_eq!(worker.claim_next().unwrap().unwrap().run_id, ok);
    let why = "git clone of file:///nowhere failed: repository not found";
    worker
        .finish_run_because(&failed, RunStatus::Failed, why)
        .unwrap();
    worker.finish_run(&ok, RunStatus::Succeeded).unwrap();
    let other = place.open();
    let record = other.load_run(&failed).unwrap().unwrap();
    assert_eq!(
        (record.status, record.end_reason.as_deref()),
        (RunStatus::Failed, Some(why))
    );
    let value = serde_json::to_value(&record).unwrap();
    assert_eq!(value["endReason"], why);
    validate_against_schema(&value).unwrap();
    let record = other.load_run(&ok).unwrap().unwrap();
    assert_eq!(record.end_reason, None);
    assert_eq!(
        serde_json::to_value(&record).unwrap()["endReason"],
        json!(null)
    );
    // Ending is still once: a second end is refused and the first reason stays.
    assert!(
        worker
            .finish_run_because(&failed, RunStatus::Cancelled, "again")
            .is_err()
    );
    assert_eq!(
        other
            .load_run(&failed)
            .unwrap()
            .unwrap()
            .end_reason
            .as_deref(),
        Some(why)
    );
}

fn issue15_job_spec_round_trips_with_its_json_shape(place: &Place) {
    let mut store = place.open();
    let git = JobSpec {
        composition_yaml: "name: docs\n".into(),
        composition_name: "docs".into(),
        workspace: JobWorkspace::Git {
            git: "file:///srv/repo.git".into(),
            reference: "main".into(),
        },
        resume: None,
        resume_from: None,
    };
    assert_eq!(
        serde_json::to_value(&git).unwrap(),
        json!({
            "compositionYaml": "name: docs\n",
            "compositionName": "docs",
            "workspace": {"git": "file:///srv/repo.git", "ref": "main"}
        })
    );
    let path_spec = spec("b");
    assert_eq!(
        serde_json::to_value(&path_spec).unwrap()["workspace"],
        json!({"path": "/srv/b"})
    );
    let a = store.enqueue(&git).unwrap();
    let b = store.enqueue(&path_spec).unwrap();
    assert_eq!(store.job_spec(&a).unwrap(), Some(git.clone()));
    assert_eq!(store.job_spec(&b).unwrap(), Some(path_spec));
    // Still there after the claim (a rerun resubmits it).
    assert_eq!(store.claim_next().unwrap().unwrap().spec, git);
    assert_eq!(store.job_spec(&a).unwrap(), Some(git));

    let direct = store.create_run("cli").unwrap();
    assert_eq!(store.job_spec(&direct).unwrap(), None);
    assert_eq!(store.job_spec("run-19700101-000000-000000").unwrap(), None);
}

/// SQLite: a run's owner is a process (pid + start time); PostgreSQL's owners are workers.
#[test]
fn issue15_reopening_keeps_queued_runs_queued_and_interrupts_a_dead_owners_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let (queued, dead) = {
        let mut store = RunStore::open(&path).unwrap();
        let queued = [
            store.enqueue(&spec("a")).unwrap(),
            store.enqueue(&spec("b")).unwrap(),
        ];
        let dead = store.create_run_owned_by("gone", dead_holder()).unwrap();
        (queued, dead)
    };
    let mut store = RunStore::open(&path).unwrap();
    assert_eq!(store.interrupted_on_open(), std::slice::from_ref(&dead));
    assert_eq!(status_of(&store, &dead), RunStatus::Interrupted);
    let pid = dead_holder().pid;
    assert_eq!(
        store.load_run(&dead).unwrap().unwrap().end_reason,
        Some(end_reason::owner_process_gone(pid))
    );
    for run in &queued {
        assert_eq!(status_of(&store, run), RunStatus::Queued);
    }
    // reap finds a run whose owner died after the open; a live claim is left alone.
    let claimed = store.claim_next().unwrap().unwrap();
    assert_eq!(claimed.run_id, queued[0]);
    let later = store.create_run_owned_by("gone", dead_holder()).unwrap();
    assert_eq!(store.reap().unwrap(), vec![later.clone()]);
    assert_eq!(status_of(&store, &later), RunStatus::Interrupted);
    assert_eq!(status_of(&store, &queued[0]), RunStatus::Running);
    assert_eq!(status_of(&store, &queued[1]), RunStatus::Queued);
    assert!(store.reap().unwrap().is_empty());
}

fn issue15_counts_and_a_status_filtered_listing(place: &Place) {
    let mut store = place.open();
    let q1 = store.enqueue(&spec("a")).unwrap();
    let q2 = store.enqueue(&spec("b")).unwrap();
    let done = store.create_run("cli").unwrap();
    store.finish_run(&done, RunStatus::Succeeded).unwrap();
    assert_eq!(
        store.count_by_status().unwrap(),
        vec![
            (RunStatus::Queued, 2),
            (RunStatus::Running, 0),
            (RunStatus::Succeeded, 1),
            (RunStatus::Failed, 0),
            (RunStatus::Cancelled, 0),
            (RunStatus::Interrupted, 0),
        ]
    );
    let queued: BTreeSet<String> = store
        .list_run_rows_where(Some(RunStatus::Queued), 10)
        .unwrap()
        .into_iter()
        .map(|row| {
            assert_eq!(row.summary.status, RunStatus::Queued);
            assert_eq!(row.steps, 0);
            assert_eq!(row.duration_ms, None);
            row.summary.run_id
        })
        .collect();
    assert_eq!(queued, BTreeSet::from([q1, q2]));
    assert_eq!(store.list_run_rows_where(None, 10).unwrap().len(), 3);
    assert_eq!(store.list_run_rows_where(None, 1).unwrap().len(), 1);
    assert!(
        store
            .list_run_rows_where(Some(RunStatus::Failed), 10)
            .unwrap()
            .is_empty()
    );
}

/// A store written before the queue existed opens, gains the queue's columns, keeps its runs
/// readable, and queues from then on.
#[test]
fn issue15_a_store_from_before_the_queue_gains_its_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let old = {
        let mut store = RunStore::open(&path).unwrap();
        let run = store.create_run("old").unwrap();
        store.finish_run(&run, RunStatus::Succeeded).unwrap();
        run
    };
    let columns = |conn: &rusqlite::Connection| -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM pragma_table_info('runs')")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "ALTER TABLE runs DROP COLUMN job_spec;
             ALTER TABLE runs DROP COLUMN cancel_requested;
             ALTER TABLE runs DROP COLUMN queued_seq;
             ALTER TABLE runs DROP COLUMN end_reason;",
        )
        .unwrap();
        let cols = columns(&conn);
        assert!(!cols.contains(&"queued_seq".to_owned()), "{cols:?}");
    }
    let mut store = RunStore::open(&path).unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let cols = columns(&conn);
        for name in ["job_spec", "cancel_requested", "queued_seq", "end_reason"] {
            assert!(cols.contains(&name.to_owned()), "{name} missing: {cols:?}");
        }
    }
    assert_eq!(status_of(&store, &old), RunStatus::Succeeded);
    assert!(!store.cancel_requested(&old).unwrap());
    assert_eq!(
        store.request_cancel(&old).unwrap(),
        CancelRequest::AlreadyEnded(RunStatus::Succeeded)
    );
    let run = store.enqueue(&spec("new")).unwrap();
    assert_eq!(store.claim_next().unwrap().unwrap().run_id, run);
}

/// The runs queued to resume `run` (their spec's `resumeFrom`).
fn resumes_of(store: &RunStore, run: &str) -> Vec<String> {
    store
        .list_runs()
        .unwrap()
        .into_iter()
        .map(|summary| summary.run_id)
        .filter(|id| {
            store
                .job_spec(id)
                .unwrap()
                .and_then(|spec| spec.resume_from)
                .is_some_and(|from| from.run_id == run)
        })
        .collect()
}

/// A dead owner's `resume: auto` run is resumed by whichever process reaps it (here another
/// handle's open, as the store a serve job or a command opens), in the transaction that marks
/// it interrupted, and only once: a later reap finds nothing. A run without `resume` is only
/// marked. The resume keeps the run's place in the queue: it is claimed before runs queued
/// after it.
fn reaping_a_resume_auto_run_queues_its_resume_in_the_same_transaction_once(place: &Place) {
    let mut store = place.open();
    let first = store.enqueue(&spec("first")).unwrap();
    let auto = JobSpec {
        resume: Some(ResumeMode::Auto),
        ..spec("auto")
    };
    let dead_auto = store
        .create_run_as(dead_holder(), "auto", None, Some(&auto))
        .unwrap();
    let dead_plain = store
        .create_run_as(dead_holder(), "plain", None, Some(&spec("plain")))
        .unwrap();
    let other = place.open();
    let mut reaped = other.reaped_on_open().to_vec();
    reaped.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    let resumed = reaped
        .iter()
        .find(|r| r.run_id == dead_auto)
        .and_then(|r| r.resumed_as.clone())
        .expect("the resume: auto run was resumed");
    let plain = reaped.iter().find(|r| r.run_id == dead_plain).unwrap();
    assert_eq!(plain.resumed_as, None);
    assert_eq!(reaped.len(), 2, "{reaped:?}");
    assert_eq!(status_of(&store, &dead_auto), RunStatus::Interrupted);
    assert_eq!(status_of(&store, &resumed), RunStatus::Queued);
    assert_eq!(
        store.job_spec(&resumed).unwrap(),
        Some(JobSpec {
            resume: None,
            resume_from: Some(ResumeFrom {
                run_id: dead_auto.clone(),
                rerun_changed: true,
                accept_workspace: true,
            }),
            ..auto
        })
    );
    // Reaped once: neither this handle's reap nor a third open queues another.
    assert!(store.reap().unwrap().is_empty());
    assert!(place.open().reaped_on_open().is_empty());
    assert_eq!(resumes_of(&store, &dead_auto), vec![resumed.clone()]);
    assert!(resumes_of(&store, &dead_plain).is_empty());
    let later = store.enqueue(&spec("later")).unwrap();
    let order: Vec<String> = (0..3)
        .map(|_| store.claim_next().unwrap().unwrap().run_id)
        .collect();
    assert_eq!(order, vec![first, resumed, later]);
}
