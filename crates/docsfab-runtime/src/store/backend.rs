//! The run store's one interface: [`RunBackend`], which each backend implements once
//! (`sqlite/`, `postgres/`), and its parts [`StepLog`], the calls one step run makes, and
//! [`JobQueue`], `docsfab serve`'s job queue (each backend's `queue.rs`).
//!
//! [`super::RunStore`] holds a `Box<dyn RunBackend + Send>` and hands its methods out through
//! `Deref`, so a caller calls the backend's own method: no operation is written out again
//! between the caller and the backend. Methods with a body here are conveniences written once
//! for every backend in terms of the others.

use std::fmt;

use docsfab_throttle::process::Holder;

use super::{CancelRequest, Claimed, JobSpec, Reaped, RunListing, StepEnd, StepStart, StoreError};
use crate::snapshot::WrittenFile;
use crate::written::{Kept, StoredWrite};
use docsfab_record::{AttemptRecord, ForEach, RunContext, RunRecord, RunStatus, RunSummary};

/// The store calls one step run makes: its start, its attempts, its write intents, its end.
/// The executor runs a step against a `&mut dyn StepLog`: the run's store itself, or, for an
/// instance of a fan-out step, the handle [`RunBackend::step_log`] gave it.
pub trait StepLog {
    /// [`StepLog::begin_step`] for an instance of a fan-out step when `for_each` is given.
    /// Instances take the next indexes like any step, so starting them in element order keeps
    /// the record in element order.
    fn begin_step_for(
        &mut self,
        run_id: &str,
        step: &StepStart,
        for_each: Option<&ForEach>,
    ) -> Result<u32, StoreError>;

    /// [`StepLog::record_attempt`], keeping in the same transaction the contents of the files
    /// the attempt changed (empty when it wrote nothing or its writes were restored), each as
    /// [`crate::written::classify`] judged it (bounded: see [`crate::written`]).
    fn record_attempt_with_files(
        &mut self,
        run_id: &str,
        step_index: u32,
        attempt: &AttemptRecord,
        files: &[(WrittenFile, Kept)],
    ) -> Result<(), StoreError>;

    /// Commits the intent to write `path` (workspace-relative) with `tool` during the attempt
    /// `attempt` that is still running, before the write runs. If the owner dies before the
    /// attempt is recorded, the run's reaping lists these paths in the step's
    /// `interruptedAttempt`.
    fn record_write_intent(
        &mut self,
        run_id: &str,
        step_index: u32,
        attempt: u32,
        tool: &str,
        path: &str,
    ) -> Result<(), StoreError>;

    /// Ends a step with its status, failure, output and (succeeded) result basis.
    fn finish_step(
        &mut self,
        run_id: &str,
        step_index: u32,
        end: &StepEnd,
    ) -> Result<(), StoreError>;

    /// Adds a step to a running run; returns its index (0-based, in start order).
    fn begin_step(&mut self, run_id: &str, step: &StepStart) -> Result<u32, StoreError> {
        self.begin_step_for(run_id, step, None)
    }

    /// Records a finished attempt in its own committed transaction: when this returns `Ok`, the
    /// attempt survives a crash. Attempts must arrive numbered 1, 2, 3, ... per step.
    fn record_attempt(
        &mut self,
        run_id: &str,
        step_index: u32,
        attempt: &AttemptRecord,
    ) -> Result<(), StoreError> {
        self.record_attempt_with_files(run_id, step_index, attempt, &[])
    }
}

/// `docsfab serve`'s job queue, kept in the run store: a submitted job is a `queued` run
/// holding its [`JobSpec`], claimed by exactly one worker; a cancel request is a flag its worker
/// reads; runs whose owner is gone are reaped, and the resume of each one submitted with
/// `resume: auto` is queued. Each backend implements it in its `queue.rs`; it is a part of
/// [`RunBackend`], so an open [`super::RunStore`] reaches these methods too (with this trait in
/// scope).
pub trait JobQueue {
    /// Stores a submitted job as a `queued` run (no owner, no context, no steps; its start time
    /// is the submit time until it is claimed) and returns its id.
    fn enqueue(&mut self, spec: &JobSpec) -> Result<String, StoreError>;

    /// Atomically: the oldest queued run becomes `running`, owned by this process, started
    /// now. Each queued run is claimed once across any number of processes. `None` when
    /// nothing is queued.
    fn claim_next(&mut self) -> Result<Option<Claimed>, StoreError>;

    /// The spec a run was submitted with; `None` for an unknown run or one `docsfab run` made.
    fn job_spec(&self, run_id: &str) -> Result<Option<JobSpec>, StoreError>;

    /// A queued run becomes `cancelled` now; a running one gets its cancel flag set for its
    /// worker; an ended one is left alone. An unknown id is [`StoreError::UnknownRun`].
    fn request_cancel(&mut self, run_id: &str) -> Result<CancelRequest, StoreError>;

    /// Whether someone asked to cancel the run ([`JobQueue::request_cancel`]).
    fn cancel_requested(&self, run_id: &str) -> Result<bool, StoreError>;

    /// Marks `interrupted` the running runs whose owner is gone (accounting the write intents
    /// of their unfinished attempts) and, in the same transaction, queues the resume of each
    /// one submitted with `resume: auto` ([`JobSpec::auto_resume`]). A long-lived process
    /// (`docsfab serve`) calls it on every heartbeat; opening the store does it too. Each run
    /// is reaped once, by whichever process gets to it first.
    fn reap_runs(&mut self) -> Result<Vec<Reaped>, StoreError>;

    /// [`JobQueue::reap_runs`], the ids of the runs it marked `interrupted`.
    fn reap(&mut self) -> Result<Vec<String>, StoreError> {
        Ok(self
            .reap_runs()?
            .into_iter()
            .map(|reaped| reaped.run_id)
            .collect())
    }
}

/// A run store backend: every operation of the store, each written once per backend.
pub trait RunBackend: StepLog + JobQueue + fmt::Debug {
    /// How many times an operation was tried again because the store stayed busy (SQLite;
    /// always 0 on PostgreSQL, which waits on its locks itself).
    fn busy_retries(&self) -> u32;

    /// The runs this open found orphaned and marked `interrupted`.
    fn interrupted_on_open(&self) -> &[String];

    /// The same runs, each with the resume queued for it ([`Reaped`]).
    fn reaped_on_open(&self) -> &[Reaped];

    /// Another handle on this store, for the step records of one instance of a fan-out step:
    /// the instances run together and each records through its own handle. Every handle uses
    /// the store's one connection, one call at a time.
    fn step_log(&self) -> Box<dyn StepLog + Send>;

    /// Creates a run owned by `owner`, `running`, with its context and the spec it runs when
    /// given, and returns its id. A PostgreSQL run's owner is a worker: this process is its
    /// own; any other holder is named by its pid and, never beating, counts as dead.
    fn create_run_as(
        &mut self,
        owner: Holder,
        composition: &str,
        context: Option<&RunContext>,
        spec: Option<&JobSpec>,
    ) -> Result<String, StoreError>;

    /// Stores the context of a running run created without one (a claimed job learns its
    /// workspace, provider and model only when its worker resolves them).
    fn set_context(&mut self, run_id: &str, context: &RunContext) -> Result<(), StoreError>;

    /// How many runs have each status: every status in [`RunStatus::ALL`] order, zeros included.
    fn count_by_status(&self) -> Result<Vec<(RunStatus, u64)>, StoreError>;

    /// Ends a running run with `status`, and `reason`, when given, as the record's
    /// `endReason`. Steps still `running` take the run's final status.
    fn finish_run_with(
        &mut self,
        run_id: &str,
        status: RunStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError>;

    /// The newest `limit` runs (only those with `status` when one is given), newest first,
    /// each with its step and attempt counts and its duration, for `docsfab runs list`.
    fn list_run_rows_where(
        &self,
        status: Option<RunStatus>,
        limit: u32,
    ) -> Result<Vec<RunListing>, StoreError>;

    /// The files the run's succeeded write attempts changed, with their kept contents, in the
    /// order the run wrote them.
    fn written_files(&self, run_id: &str) -> Result<Vec<StoredWrite>, StoreError>;

    /// The full record of one run (one consistent snapshot), or `None` when there is no such
    /// run.
    fn load_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError>;

    /// Creates a run owned by this process, `running`, and returns its id.
    fn create_run(&mut self, composition: &str) -> Result<String, StoreError> {
        self.create_run_as(Holder::current(), composition, None, None)
    }

    /// Creates a run owned by this process, `running`, with its context (workspace, provider,
    /// model, version) stored from its first moment, and returns its id.
    fn create_run_with_context(
        &mut self,
        composition: &str,
        context: &RunContext,
    ) -> Result<String, StoreError> {
        self.create_run_as(Holder::current(), composition, Some(context), None)
    }

    /// [`RunBackend::create_run_with_context`] that also keeps the composition the run runs,
    /// so `docsfab runs resume` can start it again.
    fn create_run_from(
        &mut self,
        context: &RunContext,
        spec: &JobSpec,
    ) -> Result<String, StoreError> {
        self.create_run_as(
            Holder::current(),
            &spec.composition_name,
            Some(context),
            Some(spec),
        )
    }

    /// Creates a run owned by `owner` (tests and supervisors that run the work elsewhere).
    fn create_run_owned_by(
        &mut self,
        composition: &str,
        owner: Holder,
    ) -> Result<String, StoreError> {
        self.create_run_as(owner, composition, None, None)
    }

    /// Ends a running run. Steps still `running` take the run's final status.
    fn finish_run(&mut self, run_id: &str, status: RunStatus) -> Result<(), StoreError> {
        self.finish_run_with(run_id, status, None)
    }

    /// [`RunBackend::finish_run`] for a run its steps cannot explain (a served run that could
    /// not start): `reason`, one sentence, becomes the record's `endReason`.
    fn finish_run_because(
        &mut self,
        run_id: &str,
        status: RunStatus,
        reason: &str,
    ) -> Result<(), StoreError> {
        self.finish_run_with(run_id, status, Some(reason))
    }

    /// Every run, newest first.
    fn list_runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        Ok(self
            .list_run_rows_where(None, u32::MAX)?
            .into_iter()
            .map(|row| row.summary)
            .collect())
    }

    /// The newest `limit` runs, newest first, each with its step and attempt counts and its
    /// duration, for `docsfab runs list`.
    fn list_run_rows(&self, limit: u32) -> Result<Vec<RunListing>, StoreError> {
        self.list_run_rows_where(None, limit)
    }
}
