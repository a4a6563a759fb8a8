//! The run store's error, shared by both backends.

use rusqlite::ErrorCode;

/// A failure of the run store. Messages say what failed; the CLI adds what to do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the run store failed: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot create the run store's directory {path}: {source}")]
    CreateDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("a stored record is unreadable: {0}")]
    Corrupt(String),
    #[error("no run {0}")]
    UnknownRun(String),
    #[error("run {run_id} has no step #{step_index}")]
    UnknownStep { run_id: String, step_index: u32 },
    #[error("run {run_id} is {status}, not running")]
    NotRunning {
        run_id: String,
        status: &'static str,
    },
    #[error("attempt {got} recorded out of order: step {step_id} expects attempt {expected}")]
    AttemptOutOfOrder {
        step_id: String,
        expected: u32,
        got: u32,
    },
    #[error("step {step_id} is {status}; it takes no more attempts")]
    StepFinished {
        step_id: String,
        status: &'static str,
    },
    #[error("a run cannot be finished as running")]
    FinishAsRunning,
    #[error(
        "the run store stayed locked by another process while {operation} ({tries} tries, each waiting up to {timeout_ms} ms)"
    )]
    Busy {
        operation: &'static str,
        tries: u32,
        timeout_ms: u64,
    },
    #[error("attempt {attempt} of step {step_id} already finished; it takes no more writes")]
    AttemptFinished { step_id: String, attempt: u32 },
    // h15-pgrun: the PostgreSQL store's failures (store_pg.rs). PgError names the server by
    // its redacted URL, so the message never holds the password.
    #[error("the run store failed: {0}")]
    Postgres(#[from] docsfab_pg::PgError),
}

impl StoreError {
    /// SQLite's "busy" or "locked": another connection holds the lock. Worth trying again.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(
            self,
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _))
                if matches!(e.code, ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
        )
    }
}
