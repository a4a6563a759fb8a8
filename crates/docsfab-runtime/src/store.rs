//! The run store: run records in SQLite (`$DOCSFAB_HOME/runs.db`), written as the run goes.
//!
//! Each write is its own transaction, so a finished attempt is durable before the caller starts
//! the next one. Attempts are kept as their JSON record plus a few indexed columns. Opening the
//! store marks as `interrupted` every `running` run whose owning process is gone.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::record::{
    AttemptRecord, RunRecord, RunStatus, RunSummary, StepAccess, StepFailure, StepRecord,
    TransportRetryBudget, rfc3339_utc,
};

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
}

/// The process that owns a running run: its id and its start time in clock ticks since boot
/// (field 22 of `/proc/PID/stat`), which tells a live owner from a reused process id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub start_ticks: Option<u64>,
}

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start_ticks: process_start_ticks(pid),
        }
    }

    /// Whether the process is still the one that created the run. A zombie counts as gone.
    pub fn is_alive(&self) -> bool {
        let Some(stat) = read_stat(self.pid) else {
            return false;
        };
        if stat.state == 'Z' || stat.state == 'X' {
            return false;
        }
        match self.start_ticks {
            Some(ticks) => stat.start_ticks == Some(ticks),
            None => true,
        }
    }
}

struct ProcStat {
    state: char,
    start_ticks: Option<u64>,
}

fn read_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses `/proc/PID/stat`. The command name (field 2) may hold spaces and parentheses, so the
/// fields are counted from the last `)`: state is field 3, starttime field 22.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start_ticks = fields.nth(18).and_then(|f| f.parse().ok());
    Some(ProcStat { state, start_ticks })
}

/// The start time of a process in clock ticks since boot, where `/proc` offers it.
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    read_stat(pid)?.start_ticks
}

/// What a step is started with; the rest of its record fills in as it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepStart {
    pub step_id: String,
    pub access: StepAccess,
    pub configured_max_retries: u32,
    pub effective_max_retries: u32,
    pub transport_retry: TransportRetryBudget,
}

/// How a step ended.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEnd {
    pub status: RunStatus,
    pub failure: Option<StepFailure>,
    pub output: Option<serde_json::Value>,
}

/// An open run store.
#[derive(Debug)]
pub struct RunStore {
    conn: Connection,
    interrupted: Vec<String>,
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
    owner_start INTEGER
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
";

impl RunStore {
    /// Opens (creating if needed) the store at `path`, in WAL mode, and marks as `interrupted`
    /// every running run whose owner is no longer alive.
    /// The parent directory is created when missing (a fresh `DOCSFAB_HOME`).
    pub fn open(path: &Path) -> Result<RunStore, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::CreateDir {
                path: parent.to_owned(),
                source,
            })?;
        }
        let conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(SCHEMA)?;
        let mut store = RunStore {
            conn,
            interrupted: Vec::new(),
        };
        store.interrupted = store.mark_orphans_interrupted()?;
        Ok(store)
    }

    /// The runs this open found orphaned and marked `interrupted`.
    pub fn interrupted_on_open(&self) -> &[String] {
        &self.interrupted
    }

    fn mark_orphans_interrupted(&mut self) -> Result<Vec<String>, StoreError> {
        let tx = self.conn.transaction()?;
        let orphans: Vec<String> = {
            let mut stmt =
                tx.prepare("SELECT run_id, owner_pid, owner_start FROM runs WHERE status = ?1")?;
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
                let owner = Owner {
                    pid: u32::try_from(pid).unwrap_or(0),
                    start_ticks: start.and_then(|s| u64::try_from(s).ok()),
                };
                if owner.pid == 0 || !owner.is_alive() {
                    orphans.push(run_id);
                }
            }
            orphans
        };
        let ended_at = rfc3339_utc(SystemTime::now());
        for run_id in &orphans {
            tx.execute(
                "UPDATE runs SET status = ?2, ended_at = ?3 WHERE run_id = ?1",
                params![run_id, RunStatus::Interrupted.as_str(), ended_at],
            )?;
            tx.execute(
                "UPDATE steps SET status = ?2 WHERE run_id = ?1 AND status = ?3",
                params![
                    run_id,
                    RunStatus::Interrupted.as_str(),
                    RunStatus::Running.as_str()
                ],
            )?;
        }
        tx.commit()?;
        Ok(orphans)
    }

    /// Creates a run owned by this process, `running`, and returns its id.
    pub fn create_run(&mut self, composition: &str) -> Result<String, StoreError> {
        self.create_run_owned_by(composition, Owner::current())
    }

    /// Creates a run owned by `owner` (tests and supervisors that run the work elsewhere).
    pub fn create_run_owned_by(
        &mut self,
        composition: &str,
        owner: Owner,
    ) -> Result<String, StoreError> {
        let now = SystemTime::now();
        let started_ms = now
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let started_at = rfc3339_utc(now);
        let run_id = new_run_id(&started_at, composition, owner.pid, now);
        self.conn.execute(
            "INSERT INTO runs (run_id, composition, status, started_at, started_ms, owner_pid,
                               owner_start)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                run_id,
                composition,
                RunStatus::Running.as_str(),
                started_at,
                started_ms,
                i64::from(owner.pid),
                owner.start_ticks.and_then(|t| i64::try_from(t).ok()),
            ],
        )?;
        Ok(run_id)
    }

    /// Adds a step to a running run; returns its index (0-based, in start order).
    pub fn begin_step(&mut self, run_id: &str, step: &StepStart) -> Result<u32, StoreError> {
        let tx = self.conn.transaction()?;
        require_running(&tx, run_id)?;
        let index: u32 = tx.query_row(
            "SELECT COUNT(*) FROM steps WHERE run_id = ?1",
            [run_id],
            |r| r.get(0),
        )?;
        let record = StepRecord {
            step_id: step.step_id.clone(),
            access: step.access,
            status: RunStatus::Running,
            configured_max_retries: step.configured_max_retries,
            effective_max_retries: step.effective_max_retries,
            transport_retry: step.transport_retry,
            failure: None,
            output: None,
            attempts: Vec::new(),
        };
        tx.execute(
            "INSERT INTO steps (run_id, step_index, step_id, status, record)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                run_id,
                index,
                step.step_id,
                RunStatus::Running.as_str(),
                to_json(&record)?
            ],
        )?;
        tx.commit()?;
        Ok(index)
    }

    /// Records a finished attempt in its own committed transaction: when this returns `Ok`, the
    /// attempt survives a crash. Attempts must arrive numbered 1, 2, 3, ... per step.
    pub fn record_attempt(
        &mut self,
        run_id: &str,
        step_index: u32,
        attempt: &AttemptRecord,
    ) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        require_running(&tx, run_id)?;
        let step = load_step_row(&tx, run_id, step_index)?;
        if step.status != RunStatus::Running {
            return Err(StoreError::StepFinished {
                step_id: step.step_id,
                status: step.status.as_str(),
            });
        }
        let expected: u32 = tx.query_row(
            "SELECT COUNT(*) + 1 FROM attempts WHERE run_id = ?1 AND step_index = ?2",
            params![run_id, step_index],
            |r| r.get(0),
        )?;
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
                to_json(attempt)?
            ],
        )?;
        tx.commit()?;
        Ok(())
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
        let tx = self.conn.transaction()?;
        require_running(&tx, run_id)?;
        let mut step = load_step_row(&tx, run_id, step_index)?;
        if step.status != RunStatus::Running {
            return Err(StoreError::StepFinished {
                step_id: step.step_id,
                status: step.status.as_str(),
            });
        }
        step.status = end.status;
        step.failure = end.failure.clone();
        step.output = end.output.clone();
        tx.execute(
            "UPDATE steps SET status = ?3, record = ?4 WHERE run_id = ?1 AND step_index = ?2",
            params![run_id, step_index, end.status.as_str(), to_json(&step)?],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Ends a running run. Steps still `running` take the run's final status.
    pub fn finish_run(&mut self, run_id: &str, status: RunStatus) -> Result<(), StoreError> {
        if status == RunStatus::Running {
            return Err(StoreError::FinishAsRunning);
        }
        let tx = self.conn.transaction()?;
        require_running(&tx, run_id)?;
        tx.execute(
            "UPDATE runs SET status = ?2, ended_at = ?3 WHERE run_id = ?1",
            params![run_id, status.as_str(), rfc3339_utc(SystemTime::now())],
        )?;
        tx.execute(
            "UPDATE steps SET status = ?2 WHERE run_id = ?1 AND status = ?3",
            params![run_id, status.as_str(), RunStatus::Running.as_str()],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// Every run, newest first.
    pub fn list_runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT run_id, composition, status, started_at, ended_at FROM runs
             ORDER BY started_ms DESC, rowid DESC",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
            ))
        })?;
        let mut runs = Vec::new();
        for row in rows {
            let (run_id, composition, status, started_at, ended_at) = row?;
            runs.push(RunSummary {
                status: parse_status(&status)?,
                run_id,
                composition,
                started_at,
                ended_at,
            });
        }
        Ok(runs)
    }

    /// The full record of one run, or `None` when there is no such run.
    pub fn load_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let head = self
            .conn
            .query_row(
                "SELECT composition, status, started_at, ended_at FROM runs WHERE run_id = ?1",
                [run_id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, Option<String>>(3)?,
                    ))
                },
            )
            .optional()?;
        let Some((composition, status, started_at, ended_at)) = head else {
            return Ok(None);
        };
        let mut steps = Vec::new();
        {
            let mut stmt = self.conn.prepare(
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
                let mut step: StepRecord = from_json(&record)?;
                step.status = parse_status(&status)?;
                step.attempts = self.load_attempts(run_id, index)?;
                steps.push(step);
            }
        }
        Ok(Some(RunRecord {
            run_id: run_id.to_owned(),
            composition,
            status: parse_status(&status)?,
            started_at,
            ended_at,
            steps,
        }))
    }

    fn load_attempts(
        &self,
        run_id: &str,
        step_index: u32,
    ) -> Result<Vec<AttemptRecord>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT record FROM attempts WHERE run_id = ?1 AND step_index = ?2 ORDER BY attempt",
        )?;
        let rows = stmt.query_map(params![run_id, step_index], |r| r.get::<_, String>(0))?;
        let mut attempts = Vec::new();
        for row in rows {
            attempts.push(from_json(&row?)?);
        }
        Ok(attempts)
    }
}

fn require_running(conn: &Connection, run_id: &str) -> Result<(), StoreError> {
    let status: Option<String> = conn
        .query_row("SELECT status FROM runs WHERE run_id = ?1", [run_id], |r| {
            r.get(0)
        })
        .optional()?;
    match status {
        None => Err(StoreError::UnknownRun(run_id.to_owned())),
        Some(s) => match parse_status(&s)? {
            RunStatus::Running => Ok(()),
            other => Err(StoreError::NotRunning {
                run_id: run_id.to_owned(),
                status: other.as_str(),
            }),
        },
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_a_command_holding_spaces_and_parens() {
        let text = "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 50 18446744073709551615";
        let stat = parse_stat(text).unwrap();
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.start_ticks, Some(987_654));
    }

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = Owner::current();
        assert!(me.start_ticks.is_some());
        assert!(me.is_alive());
        let reused = Owner {
            pid: me.pid,
            start_ticks: me.start_ticks.map(|t| t + 1),
        };
        assert!(!reused.is_alive());
    }

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
