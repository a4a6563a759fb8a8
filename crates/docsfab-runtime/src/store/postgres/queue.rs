//! The PostgreSQL store as `docsfab serve`'s job queue ([`JobQueue`]): the run row is the job,
//! a queued run is a `runs` row with status `queued` and its [`JobSpec`]; claiming is
//! `SELECT ... FOR UPDATE SKIP LOCKED` on the oldest one.
//!
//! Reaping is here too: opening the store and [`JobQueue::reap_runs`] mark `interrupted` every
//! running run whose owner worker is not alive, under `FOR UPDATE SKIP LOCKED` so two reapers
//! never both account one run, and queue in the same transaction the resume of each one
//! submitted with `resume: auto`.

use std::time::SystemTime;

use docsfab_pg::postgres::GenericClient;
use docsfab_pg::worker;

use docsfab_record::{InterruptedAttempt, RunStatus, WriteIntent};

use super::{
    PgRunStore, TxResult, end_run, from_i32, load_step_row, lock_run, next_attempt, now, to_i32,
};
use crate::store::{
    CancelRequest, Claimed, JobQueue, JobSpec, Reaped, StoreError, end_reason, from_json,
    new_run_id, to_json,
};

impl JobQueue for PgRunStore {
    fn enqueue(&mut self, spec: &JobSpec) -> Result<String, StoreError> {
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

    /// A row another claimer has locked is skipped (`FOR UPDATE SKIP LOCKED`), so each queued
    /// run is claimed exactly once however many processes claim.
    fn claim_next(&mut self) -> Result<Option<Claimed>, StoreError> {
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

    fn job_spec(&self, run_id: &str) -> Result<Option<JobSpec>, StoreError> {
        let run_id = run_id.to_owned();
        self.read(move |tx| {
            let spec: Option<String> = tx
                .query_opt("SELECT job_spec FROM runs WHERE run_id = $1", &[&run_id])?
                .and_then(|row| row.get(0));
            Ok(spec.as_deref().map(from_json).transpose()?)
        })
    }

    fn request_cancel(&mut self, run_id: &str) -> Result<CancelRequest, StoreError> {
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

    fn cancel_requested(&self, run_id: &str) -> Result<bool, StoreError> {
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

    /// Marks `interrupted` every running run whose owner worker is not alive, accounting the
    /// write intents of its unfinished attempts, queues the resume of each submitted with
    /// `resume: auto`, and returns them. Queued runs have no owner and are never touched. A run
    /// locked by a writer is skipped: its owner is writing, so it is alive, or the next reap
    /// finds it. The marks and the resumes commit together or not at all, so a reaper that
    /// dies, or a database that restarts, leaves either both or neither (and the next reap
    /// does it). Nothing is reaped while this process may not judge others (its own heartbeat
    /// failed lately: an outage, see `worker::may_judge`).
    fn reap_runs(&mut self) -> Result<Vec<Reaped>, StoreError> {
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
            let mut reaped = Vec::with_capacity(orphans.len());
            for (run_id, worker) in orphans {
                account_interrupted_writes(tx, &run_id)?;
                let reason = end_reason::owner_worker_gone(worker.as_deref().unwrap_or("?"));
                end_run(tx, &run_id, RunStatus::Interrupted, &ended, Some(&reason))?;
                let resumed_as = queue_auto_resume(tx, &run_id)?;
                reaped.push(Reaped { run_id, resumed_as });
            }
            Ok(reaped)
        })
    }
}

/// Inside the reap's transaction, for run `run_id` just marked interrupted: when it was
/// submitted with `resume: auto`, queues its resume ([`JobSpec::auto_resume`]) with the run's
/// own `queued_seq`, so it is claimed before every run submitted after it, and returns its id.
/// A spec that cannot be read queues nothing (such a run could not be resumed either).
fn queue_auto_resume(tx: &mut impl GenericClient, run_id: &str) -> TxResult<Option<String>> {
    let row = tx.query_one(
        "SELECT job_spec, queued_seq FROM runs WHERE run_id = $1",
        &[&run_id],
    )?;
    let spec: Option<String> = row.get(0);
    let seq: i64 = row.get(1);
    let Some(resume) = spec
        .as_deref()
        .and_then(|text| from_json::<JobSpec>(text).ok())
        .and_then(|spec| spec.auto_resume(run_id))
    else {
        return Ok(None);
    };
    let (submitted_at, submitted_ms) = now();
    let id = new_run_id(
        &submitted_at,
        &resume.composition_name,
        std::process::id(),
        SystemTime::now(),
    );
    tx.execute(
        "INSERT INTO runs (run_id, composition, status, started_at, started_ms, job_spec,
                           queued_seq)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &id,
            &resume.composition_name,
            &RunStatus::Queued.as_str(),
            &submitted_at,
            &submitted_ms,
            &to_json(&resume)?,
            &seq,
        ],
    )?;
    Ok(Some(id))
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
