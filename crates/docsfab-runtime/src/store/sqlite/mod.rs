//! The SQLite backend of the run store: run records in one SQLite file (by default
//! `$DOCSFAB_HOME/runs.db`), written as the run goes.
//!
//! Each write is its own transaction, so a finished attempt is durable before the caller starts
//! the next one. Attempts are kept as their JSON record plus a few indexed columns. Opening the
//! store marks as `interrupted` every `running` run whose owning process is gone.
//!
//! Many `docsfab` processes share one store (several runs, `runs list` beside them), so:
//! - every write transaction is `BEGIN IMMEDIATE`: it takes the write lock up front, where the
//!   busy timeout applies. A deferred transaction that reads and then writes must upgrade its
//!   lock, and in WAL mode that upgrade fails at once with `SQLITE_BUSY` (no busy wait) whenever
//!   another process committed since the read began;
//! - the busy timeout is set before anything else touches the file, so opening, the WAL switch
//!   and the schema wait too;
//! - when SQLite is still busy after the timeout, the whole operation is tried again a bounded
//!   number of times, and each retry is reported to the store's [`super::BusyObserver`].
//!
//! A write step's tool calls leave a *write intent* here before each write runs
//! ([`StepLog::record_write_intent`]); when a killed run is found, the intents of the attempt
//! that never finished are put in its step's record as `interruptedAttempt`.
//!
//! The store is also `docsfab serve`'s job queue: [`super::JobQueue`], in `queue.rs`, with the
//! reaping of runs whose owner is gone.
//!
//! A succeeded attempt's record is committed together with the contents of the files it
//! changed (`written_files`, bounded as `crate::written` says), which `docsfab runs diff` reads.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use docsfab_throttle::process::Holder;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::snapshot::WrittenFile;
use crate::written::{Kept, StoredWrite};
use docsfab_record::ForEach;
use docsfab_record::{AttemptRecord, RunContext, RunRecord, RunStatus, StepRecord, rfc3339_utc};

use super::rows::{
    ListingRow, RunHead, StoredSide, WrittenRow, new_written, status_counts, step_record,
    still_running,
};
use super::{
    BusyRetry, JobSpec, Reaped, RunBackend, RunListing, StepEnd, StepLog, StepStart, StoreError,
    StoreOptions, from_json, new_run_id, parse_status, to_json,
};

mod queue;

/// An open SQLite run store (the embedded backend of [`super::RunStore`]). Its clones
/// ([`RunBackend::step_log`]) share its connection and its count of busy retries.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    interrupted: Vec<String>,
    reaped: Vec<Reaped>,
    options: StoreOptions,
    busy_retries: Arc<AtomicU32>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_id      TEXT PRIMARY KEY,
    composition TEXT NOT NULL,
    status      TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    started_ms  INTEGER NOT NULL,
    ended_at    TEXT,
    owner_pid   INTEGER NOT NULL,
    owner_start INTEGER,
    context     TEXT
);
CREATE INDEX IF NOT EXISTS runs_by_start ON runs (started_ms DESC);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status);
CREATE TABLE IF NOT EXISTS steps (
    run_id     TEXT NOT NULL REFERENCES runs (run_id),
    step_index INTEGER NOT NULL,
    step_id    TEXT NOT NULL,
    status     TEXT NOT NULL,
    record     TEXT NOT NULL,
    PRIMARY KEY (run_id, step_index)
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id     TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    status     TEXT NOT NULL,
    budget     TEXT NOT NULL,
    record     TEXT NOT NULL,
    PRIMARY KEY (run_id, step_index, attempt),
    FOREIGN KEY (run_id, step_index) REFERENCES steps (run_id, step_index)
);
CREATE TABLE IF NOT EXISTS write_intents (
    run_id      TEXT NOT NULL,
    step_index  INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    tool        TEXT NOT NULL,
    path        TEXT NOT NULL,
    intended_at TEXT NOT NULL,
    PRIMARY KEY (run_id, step_index, attempt, seq),
    FOREIGN KEY (run_id, step_index) REFERENCES steps (run_id, step_index)
);
";

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`, in WAL mode, with its waits and its busy
    /// observer chosen, and marks as `interrupted` every running run whose owner is no longer
    /// alive. The parent directory is created when missing (a fresh `DOCSFAB_HOME`).
    pub fn open_with(path: &Path, options: StoreOptions) -> Result<SqliteStore, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                path: parent.to_owned(),
                source,
            })?;
        }
        let conn = Connection::open(path)?;
        // First, so that everything below waits for other processes instead of failing.
        conn.busy_timeout(options.busy_timeout)?;
        let mut store = SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            interrupted: Vec::new(),
            reaped: Vec::new(),
            options,
            busy_retries: Arc::new(AtomicU32::new(0)),
        };
        store.retrying("opening the store", |conn| {
            // Switching to WAL needs the lock too; once the file is in WAL mode this only reads.
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            let known: i64 = conn.query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'write_intents'",
                [],
                |r| r.get(0),
            )?;
            if known == 0 {
                let tx = immediate(conn)?;
                tx.execute_batch(SCHEMA)?;
                tx.commit()?;
            }
            add_run_columns(conn)?;
            migrate_written(conn)?;
            Ok(())
        })?;
        store.reaped = store.mark_orphans_interrupted()?;
        store.interrupted = store.reaped.iter().map(|r| r.run_id.clone()).collect();
        Ok(store)
    }

    /// Runs `op` (one whole transaction), trying it again when SQLite is still busy after the
    /// busy timeout, at most `busy_retries` times, with a doubling pause in between.
    fn retrying<T>(
        &self,
        operation: &'static str,
        mut op: impl FnMut(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let max = self.options.busy_retries;
        let mut pause = self.options.retry_pause;
        let mut retry = 0;
        loop {
            // Held for one try: a pause before the next one leaves the connection to the
            // store's other handles.
            let tried = op(&self.conn.lock().unwrap_or_else(PoisonError::into_inner));
            match tried {
                Err(e) if e.is_busy() => {
                    if retry == max {
                        return Err(StoreError::Busy {
                            operation,
                            tries: max + 1,
                            timeout_ms: u64::try_from(self.options.busy_timeout.as_millis())
                                .unwrap_or(u64::MAX),
                        });
                    }
                    retry += 1;
                    self.busy_retries.fetch_add(1, Ordering::Relaxed);
                    if let Some(observer) = &self.options.on_busy {
                        observer(&BusyRetry {
                            operation,
                            retry,
                            max_retries: max,
                        });
                    }
                    std::thread::sleep(pause);
                    pause = pause.saturating_mul(2);
                }
                other => return other,
            }
        }
    }
}

impl StepLog for SqliteStore {
    fn begin_step_for(
        &mut self,
        run_id: &str,
        step: &StepStart,
        for_each: Option<&ForEach>,
    ) -> Result<u32, StoreError> {
        let json = to_json(&step.record(for_each))?;
        self.retrying("starting a step", |conn| {
            let tx = immediate(conn)?;
            require_running(&tx, run_id)?;
            let index: u32 = tx.query_row(
                "SELECT COUNT(*) FROM steps WHERE run_id = ?1",
                [run_id],
                |r| r.get(0),
            )?;
            tx.execute(
                "INSERT INTO steps (run_id, step_index, step_id, status, record)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    run_id,
                    index,
                    step.step_id,
                    RunStatus::Running.as_str(),
                    json
                ],
            )?;
            tx.commit()?;
            Ok(index)
        })
    }

    fn record_attempt_with_files(
        &mut self,
        run_id: &str,
        step_index: u32,
        attempt: &AttemptRecord,
        files: &[(WrittenFile, Kept)],
    ) -> Result<(), StoreError> {
        let json = to_json(attempt)?;
        self.retrying("recording an attempt", |conn| {
            let tx = immediate(conn)?;
            require_running(&tx, run_id)?;
            let step = require_running_step(&tx, run_id, step_index)?;
            let expected = next_attempt(&tx, run_id, step_index)?;
            if attempt.attempt != expected {
                return Err(StoreError::AttemptOutOfOrder {
                    step_id: step.step_id,
                    expected,
                    got: attempt.attempt,
                });
            }
            tx.execute(
                "INSERT INTO attempts (run_id, step_index, attempt, status, budget, record)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    run_id,
                    step_index,
                    attempt.attempt,
                    attempt.status.as_str(),
                    attempt.budget.as_str(),
                    json
                ],
            )?;
            insert_written(&tx, run_id, step_index, attempt.attempt, files)?;
            tx.commit()?;
            Ok(())
        })
    }

    fn record_write_intent(
        &mut self,
        run_id: &str,
        step_index: u32,
        attempt: u32,
        tool: &str,
        path: &str,
    ) -> Result<(), StoreError> {
        let intended_at = rfc3339_utc(SystemTime::now());
        self.retrying("recording a write intent", |conn| {
            let tx = immediate(conn)?;
            require_running(&tx, run_id)?;
            let step = require_running_step(&tx, run_id, step_index)?;
            if attempt < next_attempt(&tx, run_id, step_index)? {
                return Err(StoreError::AttemptFinished {
                    step_id: step.step_id,
                    attempt,
                });
            }
            let seq: u32 = tx.query_row(
                "SELECT COUNT(*) + 1 FROM write_intents
                 WHERE run_id = ?1 AND step_index = ?2 AND attempt = ?3",
                params![run_id, step_index, attempt],
                |r| r.get(0),
            )?;
            tx.execute(
                "INSERT INTO write_intents
                     (run_id, step_index, attempt, seq, tool, path, intended_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![run_id, step_index, attempt, seq, tool, path, intended_at],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    fn finish_step(
        &mut self,
        run_id: &str,
        step_index: u32,
        end: &StepEnd,
    ) -> Result<(), StoreError> {
        if end.status == RunStatus::Running {
            return Err(StoreError::FinishAsRunning);
        }
        self.retrying("finishing a step", |conn| {
            let tx = immediate(conn)?;
            require_running(&tx, run_id)?;
            let mut step = require_running_step(&tx, run_id, step_index)?;
            end.apply_to(&mut step);
            tx.execute(
                "UPDATE steps SET status = ?3, record = ?4 WHERE run_id = ?1 AND step_index = ?2",
                params![run_id, step_index, end.status.as_str(), to_json(&step)?],
            )?;
            tx.commit()?;
            Ok(())
        })
    }
}

impl RunBackend for SqliteStore {
    fn busy_retries(&self) -> u32 {
        self.busy_retries.load(Ordering::Relaxed)
    }

    fn interrupted_on_open(&self) -> &[String] {
        &self.interrupted
    }

    fn reaped_on_open(&self) -> &[Reaped] {
        &self.reaped
    }

    fn step_log(&self) -> Box<dyn StepLog + Send> {
        Box::new(self.clone())
    }

    fn create_run_as(
        &mut self,
        owner: Holder,
        composition: &str,
        context: Option<&RunContext>,
        spec: Option<&JobSpec>,
    ) -> Result<String, StoreError> {
        let context = context.map(to_json).transpose()?;
        let spec = spec.map(to_json).transpose()?;
        let now = SystemTime::now();
        let started_ms = epoch_ms(now);
        let started_at = rfc3339_utc(now);
        let run_id = new_run_id(&started_at, composition, owner.pid, now);
        self.retrying("creating the run", |conn| {
            let tx = immediate(conn)?;
            tx.execute(
                "INSERT INTO runs (run_id, composition, status, started_at, started_ms, owner_pid,
                                   owner_start, context, job_spec)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    run_id,
                    composition,
                    RunStatus::Running.as_str(),
                    started_at,
                    started_ms,
                    i64::from(owner.pid),
                    owner.start_ticks.and_then(|t| i64::try_from(t).ok()),
                    context,
                    spec,
                ],
            )?;
            tx.commit()?;
            Ok(())
        })?;
        Ok(run_id)
    }

    fn set_context(&mut self, run_id: &str, context: &RunContext) -> Result<(), StoreError> {
        let json = to_json(context)?;
        self.retrying("storing the run's context", |conn| {
            let tx = immediate(conn)?;
            require_running(&tx, run_id)?;
            tx.execute(
                "UPDATE runs SET context = ?2 WHERE run_id = ?1",
                params![run_id, json],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        self.retrying("counting runs", |conn| {
            let mut stmt = conn.prepare("SELECT status, COUNT(*) FROM runs GROUP BY status")?;
            let rows: Vec<(String, i64)> = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            status_counts(rows)
        })
    }

    fn finish_run_with(
        &mut self,
        run_id: &str,
        status: RunStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        if status == RunStatus::Running {
            return Err(StoreError::FinishAsRunning);
        }
        self.retrying("finishing the run", |conn| {
            let tx = immediate(conn)?;
            require_running(&tx, run_id)?;
            tx.execute(
                "UPDATE runs SET status = ?2, ended_at = ?3, end_reason = ?4 WHERE run_id = ?1",
                params![
                    run_id,
                    status.as_str(),
                    rfc3339_utc(SystemTime::now()),
                    reason
                ],
            )?;
            tx.execute(
                "UPDATE steps SET status = ?2 WHERE run_id = ?1 AND status = ?3",
                params![run_id, status.as_str(), RunStatus::Running.as_str()],
            )?;
            tx.commit()?;
            Ok(())
        })
    }

    fn list_run_rows_where(
        &self,
        status: Option<RunStatus>,
        limit: u32,
    ) -> Result<Vec<RunListing>, StoreError> {
        self.retrying("listing runs", |conn| list_run_rows(conn, status, limit))
    }

    fn written_files(&self, run_id: &str) -> Result<Vec<StoredWrite>, StoreError> {
        self.retrying("reading written files", |conn| load_written(conn, run_id))
    }

    fn load_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        // One read transaction, so the record is one consistent snapshot even while its run
        // writes.
        self.retrying("reading a run", |conn| {
            let tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Deferred)?;
            let record = load_run(&tx, run_id)?;
            tx.finish()?;
            Ok(record)
        })
    }
}

fn list_run_rows(
    conn: &Connection,
    status: Option<RunStatus>,
    limit: u32,
) -> Result<Vec<RunListing>, StoreError> {
    // julianday() reads the stored RFC 3339 times (`...T20:35:01.123Z`) to the millisecond, so
    // the duration needs no second column and works on stores written before this query.
    let mut stmt = conn.prepare(
        "SELECT r.run_id, r.composition, r.status, r.started_at, r.ended_at,
                (SELECT COUNT(*) FROM steps s WHERE s.run_id = r.run_id),
                (SELECT COUNT(*) FROM attempts a WHERE a.run_id = r.run_id),
                CAST(ROUND((julianday(r.ended_at) - julianday(r.started_at)) * 86400000.0) AS INTEGER),
                r.context
             FROM runs r WHERE ?2 IS NULL OR r.status = ?2
             ORDER BY r.started_ms DESC, r.rowid DESC LIMIT ?1",
    )?;
    let rows = stmt.query_map(params![limit, status.map(RunStatus::as_str)], |r| {
        Ok(ListingRow {
            run_id: r.get(0)?,
            composition: r.get(1)?,
            status: r.get(2)?,
            started_at: r.get(3)?,
            ended_at: r.get(4)?,
            steps: r.get(5)?,
            attempts: r.get(6)?,
            duration_ms: r.get(7)?,
            context: r.get(8)?,
        })
    })?;
    let mut runs = Vec::new();
    for row in rows {
        runs.push(row?.into_listing()?);
    }
    Ok(runs)
}

fn load_run(conn: &Connection, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
    let head = conn
        .query_row(
            "SELECT composition, status, started_at, ended_at, context, end_reason FROM runs
             WHERE run_id = ?1",
            [run_id],
            |r| {
                Ok(RunHead {
                    composition: r.get(0)?,
                    status: r.get(1)?,
                    started_at: r.get(2)?,
                    ended_at: r.get(3)?,
                    context: r.get(4)?,
                    end_reason: r.get(5)?,
                })
            },
        )
        .optional()?;
    let Some(head) = head else {
        return Ok(None);
    };
    let context = head.context()?;
    let mut steps = Vec::new();
    {
        let mut stmt = conn.prepare(
            "SELECT step_index, status, record FROM steps WHERE run_id = ?1
                 ORDER BY step_index",
        )?;
        let rows = stmt.query_map([run_id], |r| {
            Ok((
                r.get::<_, u32>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        for row in rows {
            let (index, status, record) = row?;
            let mut step = step_record(&status, &record)?;
            step.attempts = load_attempts(conn, run_id, index)?;
            steps.push(step);
        }
    }
    head.into_record(run_id, context, steps).map(Some)
}

fn load_attempts(
    conn: &Connection,
    run_id: &str,
    step_index: u32,
) -> Result<Vec<AttemptRecord>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT record FROM attempts WHERE run_id = ?1 AND step_index = ?2 ORDER BY attempt",
    )?;
    let rows = stmt.query_map(params![run_id, step_index], |r| r.get::<_, String>(0))?;
    let mut attempts = Vec::new();
    for row in rows {
        attempts.push(from_json(&row?)?);
    }
    Ok(attempts)
}

/// Columns added to `runs` after its first version, each with its SQL type: `context` (the
/// run's workspace, provider, model), then the queue's `job_spec` (a submitted [`JobSpec`]),
/// `cancel_requested` (0/1), `queued_seq` (FIFO order of queued runs), and `end_reason` (the
/// record's `endReason`).
const ADDED_RUN_COLUMNS: [(&str, &str); 5] = [
    ("context", "TEXT"),
    ("job_spec", "TEXT"),
    ("cancel_requested", "INTEGER DEFAULT 0"),
    ("queued_seq", "INTEGER"),
    ("end_reason", "TEXT"),
];

/// Adds to a store created before them the `runs` columns it lacks; its runs keep nulls there
/// and read as before. Checked without the write lock first: once added, opening only reads.
fn add_run_columns(conn: &Connection) -> Result<(), StoreError> {
    let missing = |conn: &Connection| -> Result<Vec<(&str, &str)>, StoreError> {
        let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('runs')")?;
        let have: Vec<String> = stmt
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        Ok(ADDED_RUN_COLUMNS
            .into_iter()
            .filter(|(name, _)| !have.iter().any(|h| h == name))
            .collect())
    };
    if missing(conn)?.is_empty() {
        return Ok(());
    }
    let tx = immediate(conn)?;
    // Again under the lock: another process may have added them meanwhile.
    for (name, sql_type) in missing(&tx)? {
        tx.execute(
            &format!("ALTER TABLE runs ADD COLUMN {name} {sql_type}"),
            [],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// A write transaction that holds the write lock from its first statement (`BEGIN IMMEDIATE`),
/// so it waits under the busy timeout instead of failing on a lock upgrade later.
fn immediate(conn: &Connection) -> Result<rusqlite::Transaction<'_>, StoreError> {
    Ok(rusqlite::Transaction::new_unchecked(
        conn,
        TransactionBehavior::Immediate,
    )?)
}

/// The number the step's next attempt gets: one more than the attempts recorded.
fn next_attempt(conn: &Connection, run_id: &str, step_index: u32) -> Result<u32, StoreError> {
    Ok(conn.query_row(
        "SELECT COUNT(*) + 1 FROM attempts WHERE run_id = ?1 AND step_index = ?2",
        params![run_id, step_index],
        |r| r.get(0),
    )?)
}

/// The step's record, refused when the step already ended.
fn require_running_step(
    conn: &Connection,
    run_id: &str,
    step_index: u32,
) -> Result<StepRecord, StoreError> {
    still_running(load_step_row(conn, run_id, step_index)?)
}

fn require_running(conn: &Connection, run_id: &str) -> Result<(), StoreError> {
    match run_status(conn, run_id)? {
        RunStatus::Running => Ok(()),
        other => Err(StoreError::NotRunning {
            run_id: run_id.to_owned(),
            status: other.as_str(),
        }),
    }
}

/// The run's status; an unknown run is an error.
fn run_status(conn: &Connection, run_id: &str) -> Result<RunStatus, StoreError> {
    let status: Option<String> = conn
        .query_row("SELECT status FROM runs WHERE run_id = ?1", [run_id], |r| {
            r.get(0)
        })
        .optional()?;
    match status {
        None => Err(StoreError::UnknownRun(run_id.to_owned())),
        Some(s) => parse_status(&s),
    }
}

/// Milliseconds since the Unix epoch (0 for a clock before it).
fn epoch_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn load_step_row(
    conn: &Connection,
    run_id: &str,
    step_index: u32,
) -> Result<StepRecord, StoreError> {
    let record: Option<String> = conn
        .query_row(
            "SELECT record FROM steps WHERE run_id = ?1 AND step_index = ?2",
            params![run_id, step_index],
            |r| r.get(0),
        )
        .optional()?;
    match record {
        Some(text) => from_json(&text),
        None => Err(StoreError::UnknownStep {
            run_id: run_id.to_owned(),
            step_index,
        }),
    }
}

const WRITTEN_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS written_files (
    run_id        TEXT NOT NULL,
    step_index    INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    path          TEXT NOT NULL,
    kept          TEXT NOT NULL,
    sha256_before TEXT,
    sha256_after  TEXT,
    bytes_before  INTEGER NOT NULL,
    bytes_after   INTEGER NOT NULL,
    before        BLOB,
    after         BLOB,
    PRIMARY KEY (run_id, step_index, attempt, seq),
    FOREIGN KEY (run_id, step_index) REFERENCES steps (run_id, step_index)
);
";

/// Adds the table to a store made before it existed (older stores keep working; an older
/// docsfab ignores the table).
fn migrate_written(conn: &Connection) -> Result<(), StoreError> {
    let known: i64 = conn.query_row(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'written_files'",
        [],
        |r| r.get(0),
    )?;
    if known == 0 {
        let tx =
            rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
        tx.execute_batch(WRITTEN_SCHEMA)?;
        tx.commit()?;
    }
    Ok(())
}

/// Stores the files of attempt `attempt`, inside the caller's transaction. A file's contents
/// are kept when [`crate::written::classify`] says text and the run stays within
/// [`crate::written::MAX_RUN_BYTES`].
fn insert_written(
    conn: &Connection,
    run_id: &str,
    step_index: u32,
    attempt: u32,
    files: &[(WrittenFile, Kept)],
) -> Result<(), StoreError> {
    let used: u64 = conn.query_row(
        "SELECT COALESCE(SUM(COALESCE(LENGTH(before), 0) + COALESCE(LENGTH(after), 0)), 0)
         FROM written_files WHERE run_id = ?1",
        [run_id],
        |r| r.get::<_, i64>(0),
    )? as u64;
    for row in new_written(used, files) {
        conn.execute(
            "INSERT INTO written_files (run_id, step_index, attempt, seq, path, kept,
                 sha256_before, sha256_after, bytes_before, bytes_after, before, after)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                run_id,
                step_index,
                attempt,
                row.seq,
                row.file.path,
                row.kept.as_str(),
                row.file.sha256_before,
                row.file.sha256_after,
                row.bytes_before,
                row.bytes_after,
                row.before,
                row.after,
            ],
        )?;
    }
    Ok(())
}

/// Every stored file of the run, in the order the run wrote them (step, attempt, first write).
fn load_written(conn: &Connection, run_id: &str) -> Result<Vec<StoredWrite>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT step_index, attempt, path, kept, sha256_before, sha256_after, bytes_before,
                bytes_after, before, after
         FROM written_files WHERE run_id = ?1 ORDER BY step_index, attempt, seq",
    )?;
    let rows = stmt.query_map([run_id], |r| {
        let side = |at: usize| -> rusqlite::Result<StoredSide> {
            Ok(StoredSide {
                sha256: r.get(at)?,
                bytes: r.get(at + 2)?,
                content: r.get(at + 4)?,
            })
        };
        Ok(WrittenRow {
            step_index: r.get(0)?,
            attempt: r.get(1)?,
            path: r.get(2)?,
            kept: r.get(3)?,
            before: side(4)?,
            after: side(5)?,
        })
    })?;
    let mut out = Vec::new();
    for row in rows {
        out.push(row?.into_write()?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_distinct_and_shaped() {
        let now = SystemTime::now();
        let at = rfc3339_utc(now);
        let a = new_run_id(&at, "q", 1, now);
        let b = new_run_id(&at, "q", 1, now);
        assert_ne!(a, b);
        assert_eq!(a.len(), "run-20261129-203501-abcdef".len(), "{a}");
        assert!(a.starts_with("run-"));
    }
}
