//! The SQLite store as `docsfab serve`'s job queue ([`JobQueue`]): a submitted run is a `queued`
//! row holding its [`JobSpec`]; [`JobQueue::claim_next`] turns the oldest one `running` for this
//! process inside one `BEGIN IMMEDIATE` transaction, so of several processes exactly one gets it.
//!
//! Reaping is here too: the running runs whose owning process is gone are marked `interrupted`
//! (on opening and on every [`JobQueue::reap_runs`]), with the write intents of their
//! unfinished attempts accounted and, in the same transaction, the resume of each one submitted
//! with `resume: auto` queued.

use std::time::SystemTime;

use docsfab_throttle::process::Holder;
use rusqlite::{Connection, OptionalExtension, params};

use docsfab_record::{InterruptedAttempt, RunStatus, WriteIntent, rfc3339_utc};

use super::{SqliteStore, epoch_ms, immediate, load_step_row, next_attempt, run_status};
use crate::store::{
    CancelRequest, Claimed, JobQueue, JobSpec, Reaped, StoreError, end_reason, from_json,
    new_run_id, to_json,
};

impl JobQueue for SqliteStore {
    fn enqueue(&mut self, spec: &JobSpec) -> Result<String, StoreError> {
        let json = to_json(spec)?;
        let now = SystemTime::now();
        let started_at = rfc3339_utc(now);
        let run_id = new_run_id(&started_at, &spec.composition_name, std::process::id(), now);
        self.retrying("queueing the run", |conn| {
            let tx = immediate(conn)?;
            tx.execute(
                "INSERT INTO runs (run_id, composition, status, started_at, started_ms, owner_pid,
                                   job_spec, cancel_requested, queued_seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, 0,
                         (SELECT COALESCE(MAX(queued_seq), 0) + 1 FROM runs))",
                params![
                    run_id,
                    spec.composition_name,
                    RunStatus::Queued.as_str(),
                    started_at,
                    epoch_ms(now),
                    json,
                ],
            )?;
            tx.commit()?;
            Ok(())
        })?;
        Ok(run_id)
    }

    /// The pick and the update are one `BEGIN IMMEDIATE` transaction, so each queued run is
    /// claimed once however many processes ask.
    fn claim_next(&mut self) -> Result<Option<Claimed>, StoreError> {
        let owner = Holder::current();
        self.retrying("claiming a queued run", |conn| {
            let tx = immediate(conn)?;
            let next = tx
                .query_row(
                    // `runs_by_status` narrows this to the queued runs; only they are sorted.
                    "SELECT run_id, job_spec FROM runs WHERE status = ?1
                     ORDER BY queued_seq LIMIT 1",
                    [RunStatus::Queued.as_str()],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)),
                )
                .optional()?;
            let Some((run_id, spec)) = next else {
                return Ok(None);
            };
            let spec: JobSpec = from_json(spec.as_deref().unwrap_or("null"))?;
            let now = SystemTime::now();
            tx.execute(
                "UPDATE runs SET status = ?2, started_at = ?3, started_ms = ?4, owner_pid = ?5,
                                 owner_start = ?6
                 WHERE run_id = ?1",
                params![
                    run_id,
                    RunStatus::Running.as_str(),
                    rfc3339_utc(now),
                    epoch_ms(now),
                    i64::from(owner.pid),
                    owner.start_ticks.and_then(|t| i64::try_from(t).ok()),
                ],
            )?;
            tx.commit()?;
            Ok(Some(Claimed { run_id, spec }))
        })
    }

    fn job_spec(&self, run_id: &str) -> Result<Option<JobSpec>, StoreError> {
        let text = self.retrying("reading a job", |conn| {
            Ok(conn
                .query_row(
                    "SELECT job_spec FROM runs WHERE run_id = ?1",
                    [run_id],
                    |r| r.get::<_, Option<String>>(0),
                )
                .optional()?
                .flatten())
        })?;
        text.as_deref().map(from_json).transpose()
    }

    fn request_cancel(&mut self, run_id: &str) -> Result<CancelRequest, StoreError> {
        self.retrying("cancelling a run", |conn| {
            let tx = immediate(conn)?;
            let status = run_status(&tx, run_id)?;
            let done = match status {
                RunStatus::Queued => {
                    tx.execute(
                        "UPDATE runs SET status = ?2, ended_at = ?3, end_reason = ?4
                         WHERE run_id = ?1",
                        params![
                            run_id,
                            RunStatus::Cancelled.as_str(),
                            rfc3339_utc(SystemTime::now()),
                            end_reason::CANCELLED_WHILE_QUEUED
                        ],
                    )?;
                    CancelRequest::CancelledQueued
                }
                RunStatus::Running => {
                    tx.execute(
                        "UPDATE runs SET cancel_requested = 1 WHERE run_id = ?1",
                        [run_id],
                    )?;
                    CancelRequest::Requested
                }
                ended => CancelRequest::AlreadyEnded(ended),
            };
            tx.commit()?;
            Ok(done)
        })
    }

    fn cancel_requested(&self, run_id: &str) -> Result<bool, StoreError> {
        self.retrying("reading a cancel request", |conn| {
            let flag: Option<Option<i64>> = conn
                .query_row(
                    "SELECT cancel_requested FROM runs WHERE run_id = ?1",
                    [run_id],
                    |r| r.get(0),
                )
                .optional()?;
            match flag {
                None => Err(StoreError::UnknownRun(run_id.to_owned())),
                Some(flag) => Ok(flag.unwrap_or(0) != 0),
            }
        })
    }

    /// As opening does: the running runs whose owning process is gone, and the resumes of
    /// those submitted with `resume: auto`.
    fn reap_runs(&mut self) -> Result<Vec<Reaped>, StoreError> {
        self.mark_orphans_interrupted()
    }
}

impl SqliteStore {
    /// Marks `interrupted` the running runs whose owning process is gone and queues, in the
    /// same transaction, the resume of each submitted with `resume: auto`.
    pub(super) fn mark_orphans_interrupted(&self) -> Result<Vec<Reaped>, StoreError> {
        // Look first without the write lock: almost always there is nothing to mark, and
        // `runs list` beside running runs should not queue for their lock.
        if self
            .retrying("looking for interrupted runs", find_orphans)?
            .is_empty()
        {
            return Ok(Vec::new());
        }
        self.retrying("marking interrupted runs", |conn| {
            let tx = immediate(conn)?;
            // Again under the lock: another process may have marked them meanwhile.
            let orphans = find_orphans(&tx)?;
            let ended_at = rfc3339_utc(SystemTime::now());
            let mut reaped = Vec::with_capacity(orphans.len());
            for (run_id, pid) in orphans {
                let run_id = &run_id;
                account_interrupted_writes(&tx, run_id)?;
                tx.execute(
                    "UPDATE runs SET status = ?2, ended_at = ?3, end_reason = ?4 WHERE run_id = ?1",
                    params![
                        run_id,
                        RunStatus::Interrupted.as_str(),
                        ended_at,
                        end_reason::owner_process_gone(pid)
                    ],
                )?;
                tx.execute(
                    "UPDATE steps SET status = ?2 WHERE run_id = ?1 AND status = ?3",
                    params![
                        run_id,
                        RunStatus::Interrupted.as_str(),
                        RunStatus::Running.as_str()
                    ],
                )?;
                reaped.push(Reaped {
                    run_id: run_id.clone(),
                    resumed_as: queue_auto_resume(&tx, run_id)?,
                });
            }
            tx.commit()?;
            Ok(reaped)
        })
    }
}

/// The `running` runs whose owning process is gone, with that process's id.
fn find_orphans(conn: &Connection) -> Result<Vec<(String, u32)>, StoreError> {
    let mut stmt =
        conn.prepare("SELECT run_id, owner_pid, owner_start FROM runs WHERE status = ?1")?;
    let rows = stmt.query_map([RunStatus::Running.as_str()], |row| {
        Ok((
            row.get::<_, String>(0)?,
            row.get::<_, i64>(1)?,
            row.get::<_, Option<i64>>(2)?,
        ))
    })?;
    let mut orphans = Vec::new();
    for row in rows {
        let (run_id, pid, start) = row?;
        let owner = Holder {
            pid: u32::try_from(pid).unwrap_or(0),
            start_ticks: start.and_then(|s| u64::try_from(s).ok()),
        };
        if owner.pid == 0 || !owner.is_alive() {
            orphans.push((run_id, owner.pid));
        }
    }
    Ok(orphans)
}

/// Inside the reap's transaction, for run `run_id` just marked interrupted: when it was
/// submitted with `resume: auto`, queues its resume ([`JobSpec::auto_resume`]) at the run's own
/// place in the queue (the end of it for a run that never was queued) and returns its id. A
/// spec that cannot be read queues nothing (such a run could not be resumed either).
fn queue_auto_resume(conn: &Connection, run_id: &str) -> Result<Option<String>, StoreError> {
    let (spec, seq): (Option<String>, Option<i64>) = conn.query_row(
        "SELECT job_spec, queued_seq FROM runs WHERE run_id = ?1",
        [run_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let Some(resume) = spec
        .as_deref()
        .and_then(|text| from_json::<JobSpec>(text).ok())
        .and_then(|spec| spec.auto_resume(run_id))
    else {
        return Ok(None);
    };
    let now = SystemTime::now();
    let submitted_at = rfc3339_utc(now);
    let id = new_run_id(
        &submitted_at,
        &resume.composition_name,
        std::process::id(),
        now,
    );
    conn.execute(
        "INSERT INTO runs (run_id, composition, status, started_at, started_ms, owner_pid,
                           job_spec, cancel_requested, queued_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, 0, ?6, 0,
                 COALESCE(?7, (SELECT COALESCE(MAX(queued_seq), 0) + 1 FROM runs)))",
        params![
            id,
            resume.composition_name,
            RunStatus::Queued.as_str(),
            submitted_at,
            epoch_ms(now),
            to_json(&resume)?,
            seq,
        ],
    )?;
    Ok(Some(id))
}

/// For each still-running step of a dead run: the write intents of the attempt that never got
/// recorded go into the step's record as `interruptedAttempt`, so its files are accounted for.
fn account_interrupted_writes(conn: &Connection, run_id: &str) -> Result<(), StoreError> {
    let steps: Vec<u32> = {
        let mut stmt =
            conn.prepare("SELECT step_index FROM steps WHERE run_id = ?1 AND status = ?2")?;
        let rows = stmt.query_map(params![run_id, RunStatus::Running.as_str()], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    for step_index in steps {
        let unfinished = next_attempt(conn, run_id, step_index)?;
        let intents: Vec<WriteIntent> = {
            let mut stmt = conn.prepare(
                "SELECT tool, path, intended_at FROM write_intents
                 WHERE run_id = ?1 AND step_index = ?2 AND attempt = ?3 ORDER BY seq",
            )?;
            let rows = stmt.query_map(params![run_id, step_index, unfinished], |r| {
                Ok(WriteIntent {
                    tool: r.get(0)?,
                    path: r.get(1)?,
                    intended_at: r.get(2)?,
                })
            })?;
            rows.collect::<Result<_, _>>()?
        };
        if intents.is_empty() {
            continue;
        }
        let mut step = load_step_row(conn, run_id, step_index)?;
        step.interrupted_attempt = Some(InterruptedAttempt {
            attempt: unfinished,
            write_intents: intents,
        });
        conn.execute(
            "UPDATE steps SET record = ?3 WHERE run_id = ?1 AND step_index = ?2",
            params![run_id, step_index, to_json(&step)?],
        )?;
    }
    Ok(())
}
