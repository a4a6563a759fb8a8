//! The run store: every run's record, written as the run goes, and `docsfab serve`'s job queue.
//!
//! A [`RunStore`] is an open store in one of the backends, chosen by a [`StoreUrl`]:
//! - `sqlite:PATH` (`store/sqlite/`): the embedded default, one file (`$DOCSFAB_HOME/runs.db`) that
//!   the processes of one host share;
//! - `postgres://...` (`store/postgres/`): one database that workers on many hosts share.
//!
//! Both keep the same records with the same semantics: each write is its own transaction, so a
//! finished attempt is durable before the next begins; opening marks `interrupted` the running
//! runs whose owner is gone; a submitted job is a `queued` run holding its [`JobSpec`], and
//! [`JobQueue::claim_next`] hands each one to exactly one worker.
//!
//! Every operation is a method of [`RunBackend`] (or of its parts [`StepLog`], the calls a step
//! run makes, and [`JobQueue`], the job queue's, in each backend's `queue.rs`), written once in
//! each backend; `RunStore` only opens the backend its URL names and hands those methods out
//! (`Deref`). A backend is added by implementing the traits.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use docsfab_pg::PgUrl;
use sha2::{Digest, Sha256};

use docsfab_record::{
    Access, FileWritten, ForEach, RunContext, RunLink, RunStatus, RunSummary, StepFailure,
    StepInput, StepLink, StepRecord, TransportRetry,
};

mod backend;
mod error;
pub mod postgres;
mod rows;
mod sqlite;

use postgres::PgRunStore;

use sqlite::SqliteStore;

pub use self::backend::{JobQueue, RunBackend, StepLog};
pub use self::error::StoreError;

/// A store operation that SQLite still found busy after the busy timeout, about to be tried
/// again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusyRetry {
    /// What the store was doing, e.g. `recording attempt 2`.
    pub operation: &'static str,
    /// 1 for the first retry.
    pub retry: u32,
    pub max_retries: u32,
}

/// Told about every [`BusyRetry`] (the CLI prints a note on stderr).
pub type BusyObserver = Arc<dyn Fn(&BusyRetry) + Send + Sync>;

/// How the store waits for other processes.
#[derive(Clone)]
pub struct StoreOptions {
    /// SQLite's busy timeout: how long one statement waits for a lock.
    pub busy_timeout: Duration,
    /// How many times a whole operation is tried again when it is still busy after that.
    pub busy_retries: u32,
    /// The pause before each retry, doubled every time.
    pub retry_pause: Duration,
    pub on_busy: Option<BusyObserver>,
    /// How long opening a PostgreSQL store waits out a server that cannot be reached (a
    /// restart, a failover). Zero for commands, which say at once that the server is down;
    /// `docsfab serve`'s jobs wait, since the server answered when the service started.
    pub open_patience: Duration,
}

impl Default for StoreOptions {
    /// Five seconds per try and four retries: a run waits out more than 25 s of other writers
    /// (whose transactions take milliseconds) before it gives up.
    fn default() -> Self {
        StoreOptions {
            busy_timeout: Duration::from_secs(5),
            busy_retries: 4,
            retry_pause: Duration::from_millis(50),
            on_busy: None,
            open_patience: Duration::ZERO,
        }
    }
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("busy_timeout", &self.busy_timeout)
            .field("busy_retries", &self.busy_retries)
            .field("retry_pause", &self.retry_pause)
            .field("on_busy", &self.on_busy.is_some())
            .field("open_patience", &self.open_patience)
            .finish()
    }
}

/// What a step is started with; the rest of its record fills in as it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepStart {
    pub step_id: String,
    pub access: Access,
    pub configured_max_retries: u32,
    pub effective_max_retries: u32,
    pub transport_retry: TransportRetry,
}

impl StepStart {
    /// The step's record as both backends store it when it starts: running, no attempts yet.
    fn record(&self, for_each: Option<&ForEach>) -> StepRecord {
        StepRecord {
            step_id: self.step_id.clone(),
            access: self.access,
            status: RunStatus::Running,
            configured_max_retries: self.configured_max_retries,
            effective_max_retries: self.effective_max_retries,
            transport_retry: self.transport_retry,
            failure: None,
            output: None,
            interrupted_attempt: None,
            for_each: for_each.cloned(),
            held_ms: 0,
            usage: docsfab_record::Usage::ZERO,
            cost_usd: None,
            truthfulness: None,
            fingerprint: None,
            inputs: None,
            reused_from: None,
            files_written: None,
            attempts: Vec::new(),
        }
    }
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEnd {
    pub status: RunStatus,
    pub failure: Option<StepFailure>,
    pub output: Option<serde_json::Value>,
    /// What a succeeded step's result stands on (see [`ResultBasis`]); `None` otherwise.
    pub basis: Option<ResultBasis>,
}

/// What a succeeded step's result stands on: what it was asked and what it looked at, and,
/// when it was carried over from an earlier run instead of run, that step and its files.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultBasis {
    pub fingerprint: String,
    pub inputs: Vec<StepInput>,
    pub reused_from: Option<StepLink>,
    pub files_written: Option<Vec<FileWritten>>,
}

/// The lineage kept in a run's stored context (`None` for none, or a context it cannot read:
/// `load_run` reports that one).
fn resumed_from(context: Option<&str>) -> Option<RunLink> {
    serde_json::from_str::<RunContext>(context?)
        .ok()?
        .resumed_from
}

impl StepEnd {
    /// Writes the end into the step's stored record (both backends).
    fn apply_to(&self, step: &mut StepRecord) {
        step.status = self.status;
        step.failure = self.failure.clone();
        step.output = self.output.clone();
        if let Some(basis) = &self.basis {
            step.fingerprint = Some(basis.fingerprint.clone());
            step.inputs = Some(basis.inputs.clone());
            step.reused_from = basis.reused_from.clone();
            step.files_written = basis.files_written.clone();
        }
    }
}

/// What `docsfab serve` needs to run a submitted job: kept with its queued run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    pub composition_yaml: String,
    pub composition_name: String,
    pub workspace: JobWorkspace,
    /// What becomes of the run when its worker dies: `auto` lets another `docsfab serve`
    /// worker resume it, once (docs/resume.md). Absent: it stays `interrupted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumeMode>,
    /// Set on the job of a resume: the run whose finished steps it carries over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<ResumeFrom>,
}

impl JobSpec {
    /// The job that resumes run `run_id` of this spec on its own once the run's worker died,
    /// when it was submitted with `resume: auto`: the same composition and workspace, carrying
    /// over the finished steps. Nobody is there to answer a refusal, so it reruns changed steps
    /// and keeps what an interrupted write left; it is never resumed again on its own.
    pub fn auto_resume(&self, run_id: &str) -> Option<JobSpec> {
        (self.resume == Some(ResumeMode::Auto)).then(|| JobSpec {
            resume: None,
            resume_from: Some(ResumeFrom {
                run_id: run_id.to_owned(),
                rerun_changed: true,
                accept_workspace: true,
            }),
            ..self.clone()
        })
    }
}

/// A run [`JobQueue::reap_runs`] (or opening the store) marked `interrupted` because its
/// owner is gone, with the resume queued for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    pub run_id: String,
    /// The queued run that resumes it ([`JobSpec::auto_resume`]), for a job submitted with
    /// `resume: auto`: queued in the transaction that marked it interrupted, at the run's own
    /// place in the queue, so whichever process reaps it, the run is resumed, and only once.
    pub resumed_as: Option<String>,
}

/// The run a queued resume carries finished steps over from, and what its operator allowed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeFrom {
    pub run_id: String,
    #[serde(default)]
    pub rerun_changed: bool,
    #[serde(default)]
    pub accept_workspace: bool,
}

/// A job's `resume` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResumeMode {
    /// Another worker resumes the run, once, when its worker died.
    Auto,
}

/// Where a job works: a directory on the worker, or a git repository cloned at a ref.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum JobWorkspace {
    Path {
        path: String,
    },
    Git {
        git: String,
        #[serde(rename = "ref")]
        reference: String,
    },
}

/// A queued run this process now owns, `running`, with the spec it was submitted with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub run_id: String,
    pub spec: JobSpec,
}

/// What [`JobQueue::request_cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelRequest {
    /// The run was still queued: it is `cancelled` now, with no steps.
    CancelledQueued,
    /// The run is running: its worker sees the flag ([`JobQueue::cancel_requested`]) and stops.
    Requested,
    /// The run had ended already, with this status; nothing changed.
    AlreadyEnded(RunStatus),
}

/// One line of `docsfab runs list`: the summary plus figures counted in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunListing {
    pub summary: RunSummary,
    /// Steps recorded (started) for the run.
    pub steps: u64,
    /// Attempts recorded across all its steps.
    pub attempts: u64,
    /// From start to end; `None` while the run has not ended.
    pub duration_ms: Option<u64>,
}

/// Where the run store lives: `sqlite:PATH` or a PostgreSQL URL. `Display` never shows a
/// password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    Sqlite(PathBuf),
    Postgres(PgUrl),
}

/// The one form every refusal of [`StoreUrl::parse`] tells the user to write.
const URL_FORMS: &str = "write sqlite:PATH or postgres://USER:PASSWORD@HOST:PORT/DATABASE";

impl StoreUrl {
    /// Reads `sqlite:PATH` (also `sqlite://PATH`), `postgres://...` or `postgresql://...`.
    /// A refusal is one sentence that names no password.
    pub fn parse(text: &str) -> Result<StoreUrl, String> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("sqlite:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(format!(
                    "the run store URL {text:?} names no file; write sqlite:PATH, e.g. sqlite:/var/lib/docsfab/runs.db"
                ));
            }
            return Ok(StoreUrl::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return PgUrl::parse(text).map(StoreUrl::Postgres);
        }
        Err(match text.split_once("://") {
            // Only the scheme: the rest may hold a password.
            Some((scheme, _)) => {
                format!("the run store URL scheme {scheme:?} is not supported; {URL_FORMS}")
            }
            None if text.is_empty() => format!("the run store URL is empty; {URL_FORMS}"),
            None => format!("{text:?} is not a run store URL; {URL_FORMS}"),
        })
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Postgres(url) => url.fmt(f),
        }
    }
}

/// An open run store, whichever backend holds it. Its operations are the backend's own
/// methods ([`RunBackend`], [`StepLog`], [`JobQueue`]), reached through `Deref`: `store.load_run(id)` calls
/// the backend's `load_run`.
#[derive(Debug)]
pub struct RunStore {
    backend: Box<dyn RunBackend + Send>,
    url: StoreUrl,
}

impl RunStore {
    /// Opens (creating if needed) the SQLite store at `path` and marks as `interrupted` every
    /// running run whose owner is no longer alive. The parent directory is created when missing.
    pub fn open(path: &Path) -> Result<RunStore, StoreError> {
        RunStore::open_with(path, StoreOptions::default())
    }

    /// [`RunStore::open`] with its waits and its busy observer chosen.
    pub fn open_with(path: &Path, options: StoreOptions) -> Result<RunStore, StoreError> {
        Ok(RunStore {
            backend: Box::new(SqliteStore::open_with(path, options)?),
            url: StoreUrl::Sqlite(path.to_owned()),
        })
    }

    /// Opens the store `url` names. `options` are SQLite's waits (PostgreSQL waits on its own
    /// locks and has no busy retries) and PostgreSQL's `open_patience`.
    pub fn open_url(url: &StoreUrl, options: StoreOptions) -> Result<RunStore, StoreError> {
        match url {
            StoreUrl::Sqlite(path) => RunStore::open_with(path, options),
            StoreUrl::Postgres(pg) => Ok(RunStore {
                backend: Box::new(PgRunStore::open_within(pg, options.open_patience)?),
                url: url.clone(),
            }),
        }
    }

    /// Where this store lives.
    pub fn url(&self) -> &StoreUrl {
        &self.url
    }
}

impl Deref for RunStore {
    type Target = dyn RunBackend + Send;

    fn deref(&self) -> &Self::Target {
        &*self.backend
    }
}

impl DerefMut for RunStore {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut *self.backend
    }
}

// Shared by both backends: the record's JSON columns, statuses and run ids are the same.
fn parse_status(text: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown status {text:?}")))
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// `run-YYYYMMDD-HHMMSS-xxxxxx`: sortable by start second, with six hex digits of a digest of
/// the start instant, the owner and a process-wide counter so ids created together differ.
fn new_run_id(started_at: &str, composition: &str, pid: u32, now: SystemTime) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut hasher = Sha256::new();
    hasher.update(nanos.to_le_bytes());
    hasher.update(pid.to_le_bytes());
    hasher.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    hasher.update(composition.as_bytes());
    let digest = hex::encode(hasher.finalize());
    let compact: String = started_at
        .chars()
        .take(19)
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect();
    let (date, time) = compact.split_once('T').unwrap_or((&compact, ""));
    format!("run-{date}-{time}-{}", &digest[..6])
}

/// The sentences a store writes as a run's `endReason` when it ends the run itself, not through
/// its steps. One home, so both backends say the same thing.
pub mod end_reason {
    /// A queued run cancelled before any worker claimed it.
    pub const CANCELLED_WHILE_QUEUED: &str = "cancelled while queued, before a worker claimed it";

    /// A run whose owning process (SQLite store) is gone.
    pub fn owner_process_gone(pid: u32) -> String {
        format!("the process that ran it (pid {pid}) ended while the run was running")
    }

    /// A run whose owning worker (PostgreSQL store) stopped heartbeating.
    pub fn owner_worker_gone(worker: &str) -> String {
        format!("its worker {worker} stopped sending heartbeats while the run was running")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue15_store_urls_parse_and_never_show_a_password() {
        assert_eq!(
            StoreUrl::parse("sqlite:/var/lib/docsfab/runs.db"),
            Ok(StoreUrl::Sqlite("/var/lib/docsfab/runs.db".into()))
        );
        assert_eq!(
            StoreUrl::parse("sqlite://rel/runs.db"),
            Ok(StoreUrl::Sqlite("rel/runs.db".into()))
        );
        let pg = StoreUrl::parse("postgresql://docsfab:s3cret@10.0.0.5:5432/docsfab").unwrap();
        assert!(matches!(pg, StoreUrl::Postgres(_)));
        assert!(!pg.to_string().contains("s3cret"), "{pg}");
        assert!(!format!("{pg:?}").contains("s3cret"), "{pg:?}");
        assert_eq!(
            StoreUrl::Sqlite("/x/runs.db".into()).to_string(),
            "sqlite:/x/runs.db"
        );
        for bad in ["", "sqlite:", "runs.db", "mysql://root:s3cret@db/x"] {
            let e = StoreUrl::parse(bad).unwrap_err();
            assert!(e.contains("sqlite:PATH"), "{bad}: {e}");
            assert!(!e.contains("s3cret"), "{bad}: {e}");
        }
    }
}
