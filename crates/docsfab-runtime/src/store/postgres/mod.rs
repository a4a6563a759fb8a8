//! The run store and the job queue in PostgreSQL (`--store postgres://...`): the same records,
//! calls and refusals as the SQLite store in [`crate::store`], shared by any number of
//! processes on any number of hosts.
//!
//! - Every write is one transaction. Writes to a run first lock its row (`FOR UPDATE`), so a
//!   run's writes and its reaping are serialized and a reaped run takes no more writes.
//! - A run's owner is a worker id ([`docsfab_pg::worker`]), not a pid: a process on another
//!   machine cannot ask the kernel about a pid, but it can read the owner's heartbeat. Opening
//!   the store and [`JobQueue::reap`] mark `interrupted` every running run whose owner is not
//!   alive (`queue.rs`).
//! - The run row is the job: the job queue ([`JobQueue`]: enqueue, claim, cancel, reap) is in
//!   `queue.rs`.
//! - Records, contexts and specs are kept as the same JSON text SQLite keeps (TEXT, not JSONB:
//!   JSONB would reorder keys), and times are the same RFC 3339 strings, so a record loaded
//!   here equals the one SQLite gives for the same calls.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_pg::postgres::{self, GenericClient};
use docsfab_pg::worker::{self, WorkerId};
use docsfab_pg::{Pg, PgError, PgUrl};
use docsfab_throttle::process::Holder;

use super::rows::{
    ListingRow, RunHead, StoredSide, WrittenRow, new_written, status_counts, step_record,
    still_running,
};
use super::{
    JobQueue, JobSpec, Reaped, RunBackend, RunListing, StepEnd, StepLog, StepStart, StoreError,
    from_json, new_run_id, parse_status, to_json,
};
use crate::snapshot::WrittenFile;
use crate::written::{Kept, StoredWrite};
use docsfab_record::{
    AttemptRecord, ForEach, RunContext, RunRecord, RunStatus, StepRecord, rfc3339_utc,
};

mod queue;

// ---- The store ------------------------------------------------------------------------------

/// The schema, one step per version (`docsfab_pg::migrate`, component `runs`). Never edit a
/// step once released: add one.
const MIGRATIONS: &[&str] = &[
    "
CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    composition      TEXT NOT NULL,
    status           TEXT NOT NULL,
    started_at       TEXT NOT NULL,
    started_ms       BIGINT NOT NULL,
    ended_at         TEXT,
    ended_ms         BIGINT,
    owner_worker     TEXT,
    context          TEXT,
    job_spec         TEXT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    queued_seq       BIGSERIAL NOT NULL
);
CREATE INDEX runs_by_start ON runs (started_ms DESC, queued_seq DESC);
CREATE INDEX runs_by_status ON runs (status);
CREATE INDEX runs_queue ON runs (queued_seq) WHERE status = 'queued';
CREATE TABLE steps (
    run_id     TEXT NOT NULL REFERENCES runs (run_id),
    step_index INTEGER NOT NULL,
    step_id    TEXT NOT NULL,
    status     TEXT NOT NULL,
    record     TEXT NOT NULL,
    PRIMARY KEY (run_id, step_index)
);
CREATE TABLE attempts (
    run_id     TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    status     TEXT NOT NULL,
    budget     TEXT NOT NULL,
    record     TEXT NOT NULL,
    PRIMARY KEY (run_id, step_index, attempt),
    FOREIGN KEY (run_id, step_index) REFERENCES steps (run_id, step_index)
);
CREATE TABLE write_intents (
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
CREATE TABLE written_files (
    run_id        TEXT NOT NULL,
    step_index    INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    path          TEXT NOT NULL,
    kept          TEXT NOT NULL,
    sha256_before TEXT,
    sha256_after  TEXT,
    bytes_before  BIGINT NOT NULL,
    bytes_after   BIGINT NOT NULL,
    before        BYTEA,
    after         BYTEA,
    PRIMARY KEY (run_id, step_index, attempt, seq),
    FOREIGN KEY (run_id, step_index) REFERENCES steps (run_id, step_index)
);
",
    "
ALTER TABLE runs ADD COLUMN end_reason TEXT;
",
];

/// An open PostgreSQL run store: one connection (on its own thread) and this process's worker
/// id, which owns the runs it creates and claims. Its clones ([`RunBackend::step_log`]) share
/// the connection.
#[derive(Debug, Clone)]
pub struct PgRunStore {
    pg: Arc<Pg>,
    worker: WorkerId,
    interrupted: Vec<String>,
    reaped: Vec<Reaped>,
}

/// A failure inside a transaction: the server's, or the store's own refusal.
enum TxError {
    Db(postgres::Error),
    Store(StoreError),
}

impl From<postgres::Error> for TxError {
    fn from(e: postgres::Error) -> Self {
        TxError::Db(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

impl docsfab_pg::TxFailure for TxError {
    fn server_error(&self) -> Option<&postgres::Error> {
        match self {
            TxError::Db(e) => Some(e),
            TxError::Store(_) => None,
        }
    }
}

type TxResult<T> = Result<T, TxError>;

impl PgRunStore {
    /// Connects, brings the schema up to date, registers this process as a worker (with its
    /// heartbeat) and marks `interrupted` the running runs whose owner is gone.
    pub fn open(url: &PgUrl) -> Result<PgRunStore, StoreError> {
        PgRunStore::open_within(url, Duration::ZERO)
    }

    /// [`PgRunStore::open`], waiting out an outage of the server (a restart, a failover) for up
    /// to `patience` while connecting and checking the schema: a `docsfab serve` job whose
    /// database restarts as it starts waits for it instead of failing its run.
    pub fn open_within(url: &PgUrl, patience: Duration) -> Result<PgRunStore, StoreError> {
        let (worker, pg) = docsfab_pg::retry_outages(patience, || {
            let worker = worker::this_process(url)?;
            let pg = Pg::connect(url)?;
            docsfab_pg::migrate(&pg, "runs", MIGRATIONS)?;
            Ok((worker, pg))
        })?;
        let mut store = PgRunStore {
            pg: Arc::new(pg),
            worker,
            interrupted: Vec::new(),
            reaped: Vec::new(),
        };
        store.reaped = store.reap_runs()?;
        store.interrupted = store.reaped.iter().map(|r| r.run_id.clone()).collect();
        Ok(store)
    }

    pub fn url(&self) -> &PgUrl {
        self.pg.url()
    }

    /// The worker id that owns this process's runs.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// Runs `f` in one transaction (committed when it returns `Ok`).
    fn write<T: Send + 'static>(
        &self,
        f: impl Fn(&mut postgres::Transaction<'_>) -> TxResult<T> + Send + Sync + 'static,
    ) -> Result<T, StoreError> {
        self.through_outages(false, f)
    }

    /// Runs `f` in one read-only snapshot, so what it reads is consistent while runs write.
    fn read<T: Send + 'static>(
        &self,
        f: impl Fn(&mut postgres::Transaction<'_>) -> TxResult<T> + Send + Sync + 'static,
    ) -> Result<T, StoreError> {
        self.through_outages(true, f)
    }

    /// Runs `f` in one transaction, again while the server cannot be reached (a restart, a
    /// failover, a network cut), for up to [`OUTAGE_PATIENCE`]: a run in flight then loses no
    /// finished attempt. A transaction is never applied twice: one whose `COMMIT` was cut is run
    /// again only once the server says it did not commit
    /// ([`docsfab_pg::Pg::transaction_through_outages`]).
    fn through_outages<T: Send + 'static>(
        &self,
        read_only: bool,
        f: impl Fn(&mut postgres::Transaction<'_>) -> TxResult<T> + Send + Sync + 'static,
    ) -> Result<T, StoreError> {
        let url = self.pg.url().to_string();
        self.pg
            .transaction_through_outages(OUTAGE_PATIENCE, read_only, f)?
            .map_err(|e| into_store_error(e, url))
    }

    /// Creates a run owned by the worker `owner` (tests and supervisors that run the work
    /// elsewhere). [`RunBackend::create_run_owned_by`] takes a process `Holder`; here owners
    /// are worker ids.
    pub fn create_run_owned_by(
        &mut self,
        composition: &str,
        owner: &str,
    ) -> Result<String, StoreError> {
        self.insert_run(composition, None, None, owner)
    }

    fn insert_run(
        &mut self,
        composition: &str,
        context: Option<&RunContext>,
        spec: Option<&JobSpec>,
        owner: &str,
    ) -> Result<String, StoreError> {
        let context = context.map(to_json).transpose()?;
        let spec = spec.map(to_json).transpose()?;
        let (started_at, started_ms) = now();
        let run_id = new_run_id(
            &started_at,
            composition,
            std::process::id(),
            SystemTime::now(),
        );
        let (id, composition, owner) = (run_id.clone(), composition.to_owned(), owner.to_owned());
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO runs (run_id, composition, status, started_at, started_ms,
                                   owner_worker, context, job_spec)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                &[
                    &id,
                    &composition,
                    &RunStatus::Running.as_str(),
                    &started_at,
                    &started_ms,
                    &owner,
                    &context,
                    &spec,
                ],
            )?;
            Ok(())
        })?;
        Ok(run_id)
    }
}

impl StepLog for PgRunStore {
    fn begin_step_for(
        &mut self,
        run_id: &str,
        step: &StepStart,
        for_each: Option<&ForEach>,
    ) -> Result<u32, StoreError> {
        let json = to_json(&step.record(for_each))?;
        let (run_id, step_id) = (run_id.to_owned(), step.step_id.clone());
        self.write(move |tx| {
            require_running(tx, &run_id)?;
            let count: i64 = tx
                .query_one("SELECT COUNT(*) FROM steps WHERE run_id = $1", &[&run_id])?
                .get(0);
            let index = to_i32(count)?;
            tx.execute(
                "INSERT INTO steps (run_id, step_index, step_id, status, record)
                 VALUES ($1, $2, $3, $4, $5)",
                &[
                    &run_id,
                    &index,
                    &step_id,
                    &RunStatus::Running.as_str(),
                    &json,
                ],
            )?;
            Ok(from_i32(index))
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
        let run_id = run_id.to_owned();
        let number = attempt.attempt;
        let (status, budget) = (attempt.status.as_str(), attempt.budget.as_str());
        let files = files.to_vec();
        self.write(move |tx| {
            require_running(tx, &run_id)?;
            let step = require_running_step(tx, &run_id, step_index)?;
            let expected = next_attempt(tx, &run_id, step_index)?;
            if number != expected {
                return Err(StoreError::AttemptOutOfOrder {
                    step_id: step.step_id,
                    expected,
                    got: number,
                }
                .into());
            }
            tx.execute(
                "INSERT INTO attempts (run_id, step_index, attempt, status, budget, record)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &run_id,
                    &to_i32(step_index)?,
                    &to_i32(number)?,
                    &status,
                    &budget,
                    &json,
                ],
            )?;
            insert_written(tx, &run_id, step_index, number, &files)?;
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
        let (run_id, tool, path) = (run_id.to_owned(), tool.to_owned(), path.to_owned());
        self.write(move |tx| {
            require_running(tx, &run_id)?;
            let step = require_running_step(tx, &run_id, step_index)?;
            if attempt < next_attempt(tx, &run_id, step_index)? {
                return Err(StoreError::AttemptFinished {
                    step_id: step.step_id,
                    attempt,
                }
                .into());
            }
            let (index, number) = (to_i32(step_index)?, to_i32(attempt)?);
            let seq: i64 = tx
                .query_one(
                    "SELECT COUNT(*) + 1 FROM write_intents
                     WHERE run_id = $1 AND step_index = $2 AND attempt = $3",
                    &[&run_id, &index, &number],
                )?
                .get(0);
            tx.execute(
                "INSERT INTO write_intents
                     (run_id, step_index, attempt, seq, tool, path, intended_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &run_id,
                    &index,
                    &number,
                    &to_i32(seq)?,
                    &tool,
                    &path,
                    &intended_at,
                ],
            )?;
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
        let (run_id, end) = (run_id.to_owned(), end.clone());
        self.write(move |tx| {
            require_running(tx, &run_id)?;
            let mut step = require_running_step(tx, &run_id, step_index)?;
            end.apply_to(&mut step);
            tx.execute(
                "UPDATE steps SET status = $3, record = $4 WHERE run_id = $1 AND step_index = $2",
                &[
                    &run_id,
                    &to_i32(step_index)?,
                    &end.status.as_str(),
                    &to_json(&step)?,
                ],
            )?;
            Ok(())
        })
    }
}

impl RunBackend for PgRunStore {
    /// Always 0: PostgreSQL waits on row locks itself; there is no busy error to retry.
    fn busy_retries(&self) -> u32 {
        0
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
        let owner = if owner == Holder::current() {
            self.worker.as_str().to_owned()
        } else {
            format!("process/{}", owner.pid)
        };
        self.insert_run(composition, context, spec, &owner)
    }

    fn set_context(&mut self, run_id: &str, context: &RunContext) -> Result<(), StoreError> {
        let (run_id, context) = (run_id.to_owned(), to_json(context)?);
        self.write(move |tx| {
            require_running(tx, &run_id)?;
            tx.execute(
                "UPDATE runs SET context = $2 WHERE run_id = $1",
                &[&run_id, &context],
            )?;
            Ok(())
        })
    }

    fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        self.read(|tx| {
            let rows = tx.query("SELECT status, COUNT(*) FROM runs GROUP BY status", &[])?;
            let counts = rows.iter().map(|row| (row.get::<_, &str>(0), row.get(1)));
            Ok(status_counts(counts)?)
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
        let run_id = run_id.to_owned();
        let reason = reason.map(str::to_owned);
        self.write(move |tx| {
            require_running(tx, &run_id)?;
            end_run(tx, &run_id, status, &now(), reason.as_deref())
        })
    }

    fn list_run_rows_where(
        &self,
        status: Option<RunStatus>,
        limit: u32,
    ) -> Result<Vec<RunListing>, StoreError> {
        let status = status.map(RunStatus::as_str);
        self.read(move |tx| list_run_rows(tx, status, limit))
    }

    fn written_files(&self, run_id: &str) -> Result<Vec<StoredWrite>, StoreError> {
        let run_id = run_id.to_owned();
        self.read(move |tx| load_written(tx, &run_id))
    }

    fn load_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let run_id = run_id.to_owned();
        self.read(move |tx| load_run(tx, &run_id))
    }
}

/// How long a store call keeps trying while the server cannot be reached: a failover's length,
/// comfortably. The run waits meanwhile (its thread sleeps), as it waits for a busy SQLite file.
const OUTAGE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

fn into_store_error(e: TxError, url: String) -> StoreError {
    match e {
        TxError::Store(e) => e,
        TxError::Db(source) => StoreError::Postgres(PgError::Query { url, source }),
    }
}

/// Now as the record shows it and as milliseconds since the epoch.
fn now() -> (String, i64) {
    let t = SystemTime::now();
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    (rfc3339_utc(t), ms)
}

fn to_i32<N: TryInto<i32> + Copy + std::fmt::Display>(n: N) -> Result<i32, StoreError> {
    n.try_into()
        .map_err(|_| StoreError::Corrupt(format!("{n} is out of range for the store")))
}

fn from_i32(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// Locks the run's row for this transaction and returns its status; `None`: no such run.
fn lock_run(tx: &mut impl GenericClient, run_id: &str) -> TxResult<Option<RunStatus>> {
    let row = tx.query_opt(
        "SELECT status FROM runs WHERE run_id = $1 FOR UPDATE",
        &[&run_id],
    )?;
    match row {
        None => Ok(None),
        Some(row) => Ok(Some(parse_status(row.get::<_, &str>(0))?)),
    }
}

/// Refused unless the run is running; holds its row lock until the transaction ends.
fn require_running(tx: &mut impl GenericClient, run_id: &str) -> TxResult<()> {
    match lock_run(tx, run_id)? {
        None => Err(StoreError::UnknownRun(run_id.to_owned()).into()),
        Some(RunStatus::Running) => Ok(()),
        Some(other) => Err(StoreError::NotRunning {
            run_id: run_id.to_owned(),
            status: other.as_str(),
        }
        .into()),
    }
}

/// Ends the run with `status`; its steps still running take the same status.
fn end_run(
    tx: &mut impl GenericClient,
    run_id: &str,
    status: RunStatus,
    (ended_at, ended_ms): &(String, i64),
    reason: Option<&str>,
) -> TxResult<()> {
    tx.execute(
        "UPDATE runs SET status = $2, ended_at = $3, ended_ms = $4, end_reason = $5
         WHERE run_id = $1",
        &[&run_id, &status.as_str(), ended_at, ended_ms, &reason],
    )?;
    tx.execute(
        "UPDATE steps SET status = $2 WHERE run_id = $1 AND status = $3",
        &[&run_id, &status.as_str(), &RunStatus::Running.as_str()],
    )?;
    Ok(())
}

fn load_step_row(
    tx: &mut impl GenericClient,
    run_id: &str,
    step_index: u32,
) -> TxResult<StepRecord> {
    let row = tx.query_opt(
        "SELECT record FROM steps WHERE run_id = $1 AND step_index = $2",
        &[&run_id, &to_i32(step_index)?],
    )?;
    match row {
        Some(row) => Ok(from_json(row.get::<_, &str>(0))?),
        None => Err(StoreError::UnknownStep {
            run_id: run_id.to_owned(),
            step_index,
        }
        .into()),
    }
}

/// The step's record, refused when the step already ended.
fn require_running_step(
    tx: &mut impl GenericClient,
    run_id: &str,
    step_index: u32,
) -> TxResult<StepRecord> {
    Ok(still_running(load_step_row(tx, run_id, step_index)?)?)
}

/// The number the step's next attempt gets: one more than the attempts recorded.
fn next_attempt(tx: &mut impl GenericClient, run_id: &str, step_index: u32) -> TxResult<u32> {
    let n: i64 = tx
        .query_one(
            "SELECT COUNT(*) + 1 FROM attempts WHERE run_id = $1 AND step_index = $2",
            &[&run_id, &to_i32(step_index)?],
        )?
        .get(0);
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}

fn list_run_rows(
    tx: &mut impl GenericClient,
    status: Option<&'static str>,
    limit: u32,
) -> TxResult<Vec<RunListing>> {
    let rows = tx.query(
        "SELECT r.run_id, r.composition, r.status, r.started_at, r.ended_at,
                (SELECT COUNT(*) FROM steps s WHERE s.run_id = r.run_id),
                (SELECT COUNT(*) FROM attempts a WHERE a.run_id = r.run_id),
                r.ended_ms - r.started_ms, r.context
         FROM runs r
         WHERE $1::TEXT IS NULL OR r.status = $1
         ORDER BY r.started_ms DESC, r.queued_seq DESC LIMIT $2",
        &[&status, &i64::from(limit)],
    )?;
    let mut runs = Vec::with_capacity(rows.len());
    for row in rows {
        let row = ListingRow {
            run_id: row.get(0),
            composition: row.get(1),
            status: row.get(2),
            started_at: row.get(3),
            ended_at: row.get(4),
            steps: row.get(5),
            attempts: row.get(6),
            duration_ms: row.get(7),
            context: row.get(8),
        };
        runs.push(row.into_listing()?);
    }
    Ok(runs)
}

fn load_run(tx: &mut impl GenericClient, run_id: &str) -> TxResult<Option<RunRecord>> {
    let Some(row) = tx.query_opt(
        "SELECT composition, status, started_at, ended_at, context, end_reason FROM runs
         WHERE run_id = $1",
        &[&run_id],
    )?
    else {
        return Ok(None);
    };
    let head = RunHead {
        composition: row.get(0),
        status: row.get(1),
        started_at: row.get(2),
        ended_at: row.get(3),
        context: row.get(4),
        end_reason: row.get(5),
    };
    let context = head.context()?;
    let mut steps = Vec::new();
    let step_rows = tx.query(
        "SELECT step_index, status, record FROM steps WHERE run_id = $1 ORDER BY step_index",
        &[&run_id],
    )?;
    for row in step_rows {
        let mut step = step_record(row.get(1), row.get(2))?;
        step.attempts = tx
            .query(
                "SELECT record FROM attempts WHERE run_id = $1 AND step_index = $2
                 ORDER BY attempt",
                &[&run_id, &row.get::<_, i32>(0)],
            )?
            .iter()
            .map(|r| from_json(r.get::<_, &str>(0)))
            .collect::<Result<_, _>>()?;
        steps.push(step);
    }
    Ok(Some(head.into_record(run_id, context, steps)?))
}

/// Stores the files of attempt `attempt` inside the caller's transaction, their contents kept
/// as [`new_written`] says.
fn insert_written(
    tx: &mut impl GenericClient,
    run_id: &str,
    step_index: u32,
    attempt: u32,
    files: &[(WrittenFile, Kept)],
) -> TxResult<()> {
    let used: i64 = tx
        .query_one(
            "SELECT COALESCE(SUM(COALESCE(octet_length(before), 0)
                                 + COALESCE(octet_length(after), 0)), 0)::BIGINT
             FROM written_files WHERE run_id = $1",
            &[&run_id],
        )?
        .get(0);
    let (index, number) = (to_i32(step_index)?, to_i32(attempt)?);
    for row in new_written(u64::try_from(used).unwrap_or(0), files) {
        tx.execute(
            "INSERT INTO written_files (run_id, step_index, attempt, seq, path, kept,
                 sha256_before, sha256_after, bytes_before, bytes_after, before, after)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            &[
                &run_id,
                &index,
                &number,
                &to_i32(row.seq)?,
                &row.file.path,
                &row.kept.as_str(),
                &row.file.sha256_before,
                &row.file.sha256_after,
                &row.bytes_before,
                &row.bytes_after,
                &row.before,
                &row.after,
            ],
        )?;
    }
    Ok(())
}

/// Every stored file of the run, in the order the run wrote them.
fn load_written(tx: &mut impl GenericClient, run_id: &str) -> TxResult<Vec<StoredWrite>> {
    let rows = tx.query(
        "SELECT step_index, attempt, path, kept, sha256_before, sha256_after, bytes_before,
                bytes_after, before, after
         FROM written_files WHERE run_id = $1 ORDER BY step_index, attempt, seq",
        &[&run_id],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let side = |at: usize| StoredSide {
            sha256: row.get(at),
            bytes: row.get(at + 2),
            content: row.get(at + 4),
        };
        let row = WrittenRow {
            step_index: from_i32(row.get(0)),
            attempt: from_i32(row.get(1)),
            path: row.get(2),
            kept: row.get(3),
            before: side(4),
            after: side(5),
        };
        out.push(row.into_write()?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::JobWorkspace;

    #[test]
    fn issue15_job_spec_json_shape_is_the_contracts() {
        let spec = JobSpec {
            composition_yaml: "name: q\n".into(),
            composition_name: "q".into(),
            workspace: JobWorkspace::Git {
                git: "file:///srv/repo".into(),
                reference: "main".into(),
            },
            resume: None,
            resume_from: None,
        };
        let text = to_json(&spec).unwrap();
        assert_eq!(
            text,
            r#"{"compositionYaml":"name: q\n","compositionName":"q","workspace":{"git":"file:///srv/repo","ref":"main"}}"#
        );
        assert_eq!(from_json::<JobSpec>(&text).unwrap(), spec);
        let path: JobWorkspace = from_json(r#"{"path":"/srv/p"}"#).unwrap();
        assert_eq!(
            path,
            JobWorkspace::Path {
                path: "/srv/p".into()
            }
        );
    }
}
