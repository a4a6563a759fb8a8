//! The run store and the job queue in PostgreSQL (`--store postgres://...`): the same records,
//! calls and refusals as the SQLite store in [`crate::store`], shared by any number of
//! processes on any number of hosts.
//!
//! - Every write is one transaction. Writes to a run first lock its row (`FOR UPDATE`), so a
//!   run's writes and its reaping are serialized and a reaped run takes no more writes.
//! - A run's owner is a worker id ([`docsfab_pg::worker`]), not a pid: a process on another
//!   machine cannot ask the kernel about a pid, but it can read the owner's heartbeat. Opening
//!   the store and [`PgRunStore::reap`] mark `interrupted` every running run whose owner is not
//!   alive, under `FOR UPDATE SKIP LOCKED` so two reapers never both account one run.
//! - The run row is the job: a queued run is a `runs` row with status `queued` and its
//!   [`JobSpec`]; claiming is `SELECT ... FOR UPDATE SKIP LOCKED` on the oldest one.
//! - Records, contexts and specs are kept as the same JSON text SQLite keeps (TEXT, not JSONB:
//!   JSONB would reorder keys), and times are the same RFC 3339 strings, so a record loaded
//!   here equals the one SQLite gives for the same calls.

use std::time::{SystemTime, UNIX_EPOCH};

use docsfab_pg::postgres::{self, GenericClient};
use docsfab_pg::worker::{self, WorkerId};
use docsfab_pg::{Pg, PgError, PgUrl};

use super::{
    CancelRequest, Claimed, JobSpec, RunListing, StepEnd, StepStart, StoreError, end_reason,
    from_json, new_run_id, parse_status, to_json,
};
use crate::record::{
    AttemptRecord, ForEach, InterruptedAttempt, RunContext, RunRecord, RunStatus, RunSummary,
    StepRecord, WriteIntent, rfc3339_utc,
};
use crate::snapshot::WrittenFile;
use crate::written::{self, Kept, Side, StoredWrite};

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
/// id, which owns the runs it creates and claims.
#[derive(Debug)]
pub struct PgRunStore {
    pg: Pg,
    worker: WorkerId,
    interrupted: Vec<String>,
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
        let worker = worker::this_process(url)?;
        let pg = Pg::connect(url)?;
        docsfab_pg::migrate(&pg, "runs", MIGRATIONS)?;
        let mut store = PgRunStore {
            pg,
            worker,
            interrupted: Vec::new(),
        };
        store.interrupted = store.reap()?;
        Ok(store)
    }

    pub fn url(&self) -> &PgUrl {
        self.pg.url()
    }

    /// The worker id that owns this process's runs.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// Always 0: PostgreSQL waits on row locks itself; there is no busy error to retry.
    pub fn busy_retries(&self) -> u32 {
        0
    }

    /// The runs this open found orphaned and marked `interrupted`.
    pub fn interrupted_on_open(&self) -> &[String] {
        &self.interrupted
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
    /// finished attempt. Only a transaction that cannot have committed is run again: one that
    /// lost its connection before `COMMIT` was sent. A lost `COMMIT` may have taken effect, so it
    /// is reported, never repeated.
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

    /// Marks `interrupted` every running run whose owner worker is not alive, accounting the
    /// write intents of its unfinished attempts, and returns their ids. Queued runs have no
    /// owner and are never touched. A run locked by a writer is skipped: its owner is writing,
    /// so it is alive, or the next reap finds it. Nothing is reaped while this process may not
    /// judge others (its own heartbeat failed lately: an outage, see `worker::may_judge`).
    pub fn reap(&mut self) -> Result<Vec<String>, StoreError> {
        let (alive, url) = (worker::alive_condition("w"), self.pg.url().clone());
        self.write(move |tx| {
            // Asked on every try: a reap that began just before an outage and is run again
            // after it must see that this process's beats failed meanwhile.
            if !worker::may_judge(&url) {
                return Ok(Vec::new());
            }
            let query = format!(
                "SELECT r.run_id, r.owner_worker FROM runs r
                 WHERE r.status = 'running'
                   AND NOT EXISTS (SELECT 1 FROM docsfab_workers w
                                   WHERE w.worker_id = r.owner_worker AND {alive})
                 ORDER BY r.queued_seq
                 FOR UPDATE OF r SKIP LOCKED"
            );
            let orphans: Vec<(String, Option<String>)> = tx
                .query(&query, &[])?
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect();
            let ended = now();
            for (run_id, worker) in &orphans {
                account_interrupted_writes(tx, run_id)?;
                let reason = end_reason::owner_worker_gone(worker.as_deref().unwrap_or("?"));
                end_run(tx, run_id, RunStatus::Interrupted, &ended, Some(&reason))?;
            }
            Ok(orphans.into_iter().map(|(run_id, _)| run_id).collect())
        })
    }

    /// Creates a run owned by this process, `running`, and returns its id.
    pub fn create_run(&mut self, composition: &str) -> Result<String, StoreError> {
        let owner = self.worker.as_str().to_owned();
        self.insert_run(composition, None, None, &owner)
    }

    /// Creates a run owned by this process, `running`, with its context stored from its
    /// first moment, and returns its id.
    pub fn create_run_with_context(
        &mut self,
        composition: &str,
        context: &RunContext,
    ) -> Result<String, StoreError> {
        let owner = self.worker.as_str().to_owned();
        self.insert_run(composition, Some(context), None, &owner)
    }

    /// [`Self::create_run_with_context`] that also keeps the composition it runs, so
    /// `runs resume` can start it again.
    pub fn create_run_from(
        &mut self,
        context: &RunContext,
        spec: &JobSpec,
    ) -> Result<String, StoreError> {
        let owner = self.worker.as_str().to_owned();
        self.insert_run(&spec.composition_name, Some(context), Some(spec), &owner)
    }

    /// Creates a run owned by the worker `owner` (tests and supervisors that run the work
    /// elsewhere). SQLite's takes a process `Holder`; here owners are worker ids.
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

    /// Stores the context (workspace, provider, model, version) of a running run: a claimed
    /// run gets it when its worker starts it.
    pub fn set_context(&mut self, run_id: &str, context: &RunContext) -> Result<(), StoreError> {
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

    /// Adds a step to a running run; returns its index (0-based, in start order).
    pub fn begin_step(&mut self, run_id: &str, step: &StepStart) -> Result<u32, StoreError> {
        self.begin_step_for(run_id, step, None)
    }

    /// [`PgRunStore::begin_step`] for an instance of a fan-out step when `for_each` is given.
    pub fn begin_step_for(
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

    /// Records a finished attempt in its own committed transaction. Attempts must arrive
    /// numbered 1, 2, 3, ... per step.
    pub fn record_attempt(
        &mut self,
        run_id: &str,
        step_index: u32,
        attempt: &AttemptRecord,
    ) -> Result<(), StoreError> {
        self.record_attempt_with_files(run_id, step_index, attempt, &[])
    }

    /// [`PgRunStore::record_attempt`], keeping in the same transaction the contents of the
    /// files the attempt changed, bounded as [`crate::written`] says.
    pub fn record_attempt_with_files(
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

    /// Commits the intent to write `path` with `tool` during the still-running attempt
    /// `attempt`, before the write runs (listed in `interruptedAttempt` if the owner dies).
    pub fn record_write_intent(
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

    /// Ends a step with its status, failure and output.
    pub fn finish_step(
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

    /// Ends a running run. Steps still `running` take the run's final status.
    pub fn finish_run(&mut self, run_id: &str, status: RunStatus) -> Result<(), StoreError> {
        self.finish_run_with(run_id, status, None)
    }

    /// [`Self::finish_run`] with `reason`, when given, as the record's `endReason`.
    pub fn finish_run_with(
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

    /// Every run, newest first.
    pub fn list_runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        Ok(self
            .list_run_rows(u32::MAX)?
            .into_iter()
            .map(|row| row.summary)
            .collect())
    }

    /// The newest `limit` runs, newest first, with their step and attempt counts and duration.
    pub fn list_run_rows(&self, limit: u32) -> Result<Vec<RunListing>, StoreError> {
        self.list_run_rows_where(None, limit)
    }

    /// [`PgRunStore::list_run_rows`] of the runs with `status` only, when given.
    pub fn list_run_rows_where(
        &self,
        status: Option<RunStatus>,
        limit: u32,
    ) -> Result<Vec<RunListing>, StoreError> {
        let status = status.map(RunStatus::as_str);
        self.read(move |tx| list_run_rows(tx, status, limit))
    }

    /// How many runs have each status, in status order, statuses with none left out.
    pub fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError> {
        self.read(|tx| {
            // Every status in `RunStatus::ALL` order, zeros included, as SQLite's.
            let mut counts: Vec<(RunStatus, u64)> =
                RunStatus::ALL.iter().map(|s| (*s, 0)).collect();
            for row in tx.query("SELECT status, COUNT(*) FROM runs GROUP BY status", &[])? {
                let status = parse_status(row.get::<_, &str>(0))?;
                if let Some(slot) = counts.iter_mut().find(|(s, _)| *s == status) {
                    slot.1 = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
                }
            }
            Ok(counts)
        })
    }

    /// The files the run's succeeded write attempts changed, in the order the run wrote them.
    pub fn written_files(&self, run_id: &str) -> Result<Vec<StoredWrite>, StoreError> {
        let run_id = run_id.to_owned();
        self.read(move |tx| load_written(tx, &run_id))
    }

    /// The full record of one run, or `None` when there is no such run.
    pub fn load_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let run_id = run_id.to_owned();
        self.read(move |tx| load_run(tx, &run_id))
    }

    // ---- The queue ----------------------------------------------------------------------

    /// A queued run (composition = the spec's name) with its spec kept; returns its id.
    pub fn enqueue(&mut self, spec: &JobSpec) -> Result<String, StoreError> {
        let json = to_json(spec)?;
        let (submitted_at, submitted_ms) = now();
        let run_id = new_run_id(
            &submitted_at,
            &spec.composition_name,
            std::process::id(),
            SystemTime::now(),
        );
        let (id, composition) = (run_id.clone(), spec.composition_name.clone());
        self.write(move |tx| {
            tx.execute(
                "INSERT INTO runs (run_id, composition, status, started_at, started_ms, job_spec)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[
                    &id,
                    &composition,
                    &RunStatus::Queued.as_str(),
                    &submitted_at,
                    &submitted_ms,
                    &json,
                ],
            )?;
            Ok(())
        })?;
        Ok(run_id)
    }

    /// The oldest queued run becomes running, owned by this process, its start the claim time;
    /// `None` when nothing is queued. A row another claimer has locked is skipped, so each
    /// queued run is claimed exactly once however many processes claim.
    pub fn claim_next(&mut self) -> Result<Option<Claimed>, StoreError> {
        let owner = self.worker.as_str().to_owned();
        self.write(move |tx| {
            let Some(row) = tx.query_opt(
                "SELECT run_id, job_spec FROM runs WHERE status = 'queued'
                 ORDER BY queued_seq LIMIT 1 FOR UPDATE SKIP LOCKED",
                &[],
            )?
            else {
                return Ok(None);
            };
            let run_id: String = row.get(0);
            let spec: Option<String> = row.get(1);
            let spec: JobSpec = from_json(spec.as_deref().unwrap_or("null"))?;
            let (started_at, started_ms) = now();
            tx.execute(
                "UPDATE runs SET status = $2, owner_worker = $3, started_at = $4, started_ms = $5
                 WHERE run_id = $1",
                &[
                    &run_id,
                    &RunStatus::Running.as_str(),
                    &owner,
                    &started_at,
                    &started_ms,
                ],
            )?;
            Ok(Some(Claimed { run_id, spec }))
        })
    }

    /// The spec a run was submitted with; `None` for a run not submitted as a job, or no run.
    pub fn job_spec(&self, run_id: &str) -> Result<Option<JobSpec>, StoreError> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let spec: Option<String> = tx
                .query_opt("SELECT job_spec FROM runs WHERE run_id = $1", &[&run_id])?
                .and_then(|row| row.get(0));
            Ok(spec.as_deref().map(from_json).transpose()?)
        })
    }

    /// A queued run is cancelled at once; a running one is flagged for its worker; an ended
    /// one is left as it is.
    pub fn request_cancel(&mut self, run_id: &str) -> Result<CancelRequest, StoreError> {
        let run_id = run_id.to_owned();
        self.write(move |tx| {
            let status = match lock_run(tx, &run_id)? {
                None => return Err(StoreError::UnknownRun(run_id.clone()).into()),
                Some(s) => s,
            };
            match status {
                RunStatus::Queued => {
                    let reason = Some(end_reason::CANCELLED_WHILE_QUEUED);
                    end_run(tx, &run_id, RunStatus::Cancelled, &now(), reason)?;
                    Ok(CancelRequest::CancelledQueued)
                }
                RunStatus::Running => {
                    tx.execute(
                        "UPDATE runs SET cancel_requested = TRUE WHERE run_id = $1",
                        &[&run_id],
                    )?;
                    Ok(CancelRequest::Requested)
                }
                ended => Ok(CancelRequest::AlreadyEnded(ended)),
            }
        })
    }

    /// Whether a cancel was asked for the run (its worker polls this).
    pub fn cancel_requested(&self, run_id: &str) -> Result<bool, StoreError> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            match tx.query_opt(
                "SELECT cancel_requested FROM runs WHERE run_id = $1",
                &[&run_id],
            )? {
                Some(row) => Ok(row.get(0)),
                None => Err(StoreError::UnknownRun(run_id.clone()).into()),
            }
        })
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
    let step = load_step_row(tx, run_id, step_index)?;
    if step.status != RunStatus::Running {
        return Err(StoreError::StepFinished {
            step_id: step.step_id,
            status: step.status.as_str(),
        }
        .into());
    }
    Ok(step)
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

/// For each still-running step of a dead run: the write intents of the attempt that never got
/// recorded go into the step's record as `interruptedAttempt`.
fn account_interrupted_writes(tx: &mut impl GenericClient, run_id: &str) -> TxResult<()> {
    let steps: Vec<i32> = tx
        .query(
            "SELECT step_index FROM steps WHERE run_id = $1 AND status = $2 ORDER BY step_index",
            &[&run_id, &RunStatus::Running.as_str()],
        )?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for index in steps {
        let step_index = from_i32(index);
        let unfinished = next_attempt(tx, run_id, step_index)?;
        let intents: Vec<WriteIntent> = tx
            .query(
                "SELECT tool, path, intended_at FROM write_intents
                 WHERE run_id = $1 AND step_index = $2 AND attempt = $3 ORDER BY seq",
                &[&run_id, &index, &to_i32(unfinished)?],
            )?
            .iter()
            .map(|r| WriteIntent {
                tool: r.get(0),
                path: r.get(1),
                intended_at: r.get(2),
            })
            .collect();
        if intents.is_empty() {
            continue;
        }
        let mut step = load_step_row(tx, run_id, step_index)?;
        step.interrupted_attempt = Some(InterruptedAttempt {
            attempt: unfinished,
            write_intents: intents,
        });
        tx.execute(
            "UPDATE steps SET record = $3 WHERE run_id = $1 AND step_index = $2",
            &[&run_id, &index, &to_json(&step)?],
        )?;
    }
    Ok(())
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
        let status = parse_status(row.get::<_, &str>(2))?;
        runs.push(RunListing {
            summary: RunSummary {
                run_id: row.get(0),
                composition: row.get(1),
                status,
                started_at: row.get(3),
                ended_at: row.get(4),
                resumed_from: super::resumed_from(row.get::<_, Option<&str>>(8)),
            },
            steps: u64::try_from(row.get::<_, i64>(5)).unwrap_or(0),
            attempts: u64::try_from(row.get::<_, i64>(6)).unwrap_or(0),
            // A clock stepped backwards could make it negative: shown as zero, not wrapped.
            duration_ms: row
                .get::<_, Option<i64>>(7)
                .map(|d| u64::try_from(d).unwrap_or(0)),
        });
    }
    Ok(runs)
}

fn load_run(tx: &mut impl GenericClient, run_id: &str) -> TxResult<Option<RunRecord>> {
    let Some(head) = tx.query_opt(
        "SELECT composition, status, started_at, ended_at, context, end_reason FROM runs
         WHERE run_id = $1",
        &[&run_id],
    )?
    else {
        return Ok(None);
    };
    let context: Option<String> = head.get(4);
    let context: Option<RunContext> = context.as_deref().map(from_json).transpose()?;
    let mut steps = Vec::new();
    let step_rows = tx.query(
        "SELECT step_index, status, record FROM steps WHERE run_id = $1 ORDER BY step_index",
        &[&run_id],
    )?;
    for row in step_rows {
        let mut step: StepRecord = from_json(row.get::<_, &str>(2))?;
        step.status = parse_status(row.get::<_, &str>(1))?;
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
    let mut record = RunRecord {
        run_id: run_id.to_owned(),
        composition: head.get(0),
        status: parse_status(head.get::<_, &str>(1))?,
        started_at: head.get(2),
        ended_at: head.get(3),
        workspace: context.as_ref().map(|c| c.workspace.clone()),
        model: context.as_ref().map(|c| c.model.clone()),
        docsfab_version: context.as_ref().map(|c| c.docsfab_version.clone()),
        resumed_from: context.as_ref().and_then(|c| c.resumed_from.clone()),
        provider: context.map(|c| c.provider),
        held_ms: 0,
        usage: docsfab_record::Usage::ZERO,
        cost_usd: None,
        truthfulness: None,
        end_reason: head.get(5),
        steps,
    };
    record.sum_totals();
    Ok(Some(record))
}

/// Stores the files of attempt `attempt` inside the caller's transaction, with the run's
/// contents cap applied as SQLite's store applies it ([`written::under_run_cap`]).
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
    let kepts = written::under_run_cap(u64::try_from(used).unwrap_or(0), files);
    let (index, number) = (to_i32(step_index)?, to_i32(attempt)?);
    for (seq, ((file, _), kept)) in (1_i32..).zip(files.iter().zip(kepts)) {
        let len = |side: &Option<Vec<u8>>| side.as_ref().map_or(0, |b| b.len() as u64);
        let keep = |side: &Option<Vec<u8>>| (kept == Kept::Text).then(|| side.clone()).flatten();
        let bytes = |side: &Option<Vec<u8>>| i64::try_from(len(side)).unwrap_or(i64::MAX);
        tx.execute(
            "INSERT INTO written_files (run_id, step_index, attempt, seq, path, kept,
                 sha256_before, sha256_after, bytes_before, bytes_after, before, after)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            &[
                &run_id,
                &index,
                &number,
                &seq,
                &file.path,
                &kept.as_str(),
                &file.sha256_before,
                &file.sha256_after,
                &i64::try_from(file.bytes_before()).unwrap_or(i64::MAX),
                &bytes(&file.after),
                &keep(&file.before),
                &keep(&file.after),
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
        let path: String = row.get(2);
        let kept: &str = row.get(3);
        let kept = Kept::parse(kept)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown written-file kind {kept:?}")))?;
        let side = |sha256: Option<String>, bytes: i64, content: Option<Vec<u8>>| {
            let text = content
                .map(String::from_utf8)
                .transpose()
                .map_err(|_| StoreError::Corrupt(format!("stored text of {path} is not UTF-8")))?;
            Ok::<_, StoreError>(Side {
                sha256,
                bytes: u64::try_from(bytes).unwrap_or(0),
                text,
            })
        };
        out.push(StoredWrite {
            before: side(row.get(4), row.get(6), row.get(8))?,
            after: side(row.get(5), row.get(7), row.get(9))?,
            step_index: from_i32(row.get(0)),
            attempt: from_i32(row.get(1)),
            path,
            kept,
        });
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
