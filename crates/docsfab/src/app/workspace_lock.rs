//! The workspace lock: a run with a write step holds an exclusive advisory lock (`flock`) on
//! its workspace directory itself for its whole life, so no lock file lands in the user's tree
//! and a killed run's lock goes with its process. Two forms over one lock: [`hold`] tries once
//! and refuses a held workspace (`docsfab run`, `runs resume`: exit 2 before anything is
//! recorded); [`wait`] tries again every 200 ms until the run's deadline or its cancellation
//! (a job of `docsfab serve`). A read-only composition takes no lock.

use std::fs::{File, TryLockError};
use std::path::Path;
use std::time::{Duration, Instant};

use docsfab_record::Access;
use docsfab_runtime::executor::RunConfig;
use tokio_util::sync::CancellationToken;

use crate::app::error::CliError;

/// How long a run waiting for its workspace lock waits before it tries again.
const RETRY: Duration = Duration::from_millis(200);

/// Why the lock was not taken.
#[derive(Debug)]
pub enum Refusal {
    /// The workspace directory cannot be opened.
    Open(std::io::Error),
    /// Another write run holds it ([`hold`] only).
    Held,
    /// The filesystem does not take the lock.
    Unsupported(std::io::Error),
    /// The run was cancelled while it waited ([`wait`] only).
    Cancelled,
    /// The run's deadline passed while it waited ([`wait`] only).
    DeadlinePassed,
}

impl Refusal {
    /// The refusal as one sentence about the workspace `dir`, without its final period.
    pub fn describe(&self, dir: &Path) -> String {
        let dir = dir.display();
        match self {
            Refusal::Open(e) => format!("cannot open the workspace {dir} ({e})"),
            Refusal::Held => format!(
                "the workspace {dir} is in use by another `docsfab run` with a write step; wait for that run to end (or cancel it), or pass another --workspace"
            ),
            Refusal::Unsupported(e) => format!(
                "cannot lock the workspace {dir} for a write step ({e}); use a workspace on a local filesystem that supports file locks"
            ),
            Refusal::Cancelled => {
                "cancelled while waiting for its workspace, which another write run holds"
                    .to_owned()
            }
            Refusal::DeadlinePassed => {
                format!("its job deadline passed while another write run held the workspace {dir}")
            }
        }
    }
}

/// Whether `config`'s composition writes, and so needs the lock.
fn needed(config: &RunConfig) -> bool {
    config
        .composition
        .steps
        .iter()
        .any(|s| s.access == Access::Write)
}

/// One try at the lock on `file`: `Ok(false)` while another process holds it.
fn try_once(file: &File) -> Result<bool, Refusal> {
    match file.try_lock() {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(e)) => Err(Refusal::Unsupported(e)),
    }
}

/// The workspace directory, opened and exclusively locked until the returned file is dropped
/// (the process ends); refused at once when another run holds it. `None` for a read-only
/// composition. Every refusal is bad input, as `docsfab run` words it.
pub fn hold(config: &RunConfig) -> Result<Option<File>, CliError> {
    if !needed(config) {
        return Ok(None);
    }
    let dir = &config.workspace;
    let refused = |r: Refusal| {
        let advice = match r {
            Refusal::Open(_) => "; pass --workspace with an existing directory.",
            _ => ".",
        };
        CliError::bad_input(format!("{}{advice}", r.describe(dir)))
    };
    let file = File::open(dir).map_err(|e| refused(Refusal::Open(e)))?;
    match try_once(&file) {
        Ok(true) => Ok(Some(file)),
        Ok(false) => Err(refused(Refusal::Held)),
        Err(r) => Err(refused(r)),
    }
}

/// As [`hold`], but while another run holds the lock, tries again every 200 ms until
/// `deadline` or `cancel`; `waiting` is called once, the first time the lock is found held.
pub fn wait(
    config: &RunConfig,
    deadline: Instant,
    cancel: &CancellationToken,
    waiting: impl FnOnce(),
) -> Result<Option<File>, Refusal> {
    if !needed(config) {
        return Ok(None);
    }
    let file = File::open(&config.workspace).map_err(Refusal::Open)?;
    let mut waiting = Some(waiting);
    loop {
        if try_once(&file)? {
            return Ok(Some(file));
        }
        if let Some(tell) = waiting.take() {
            tell();
        }
        if cancel.is_cancelled() {
            return Err(Refusal::Cancelled);
        }
        if Instant::now() >= deadline {
            return Err(Refusal::DeadlinePassed);
        }
        std::thread::sleep(RETRY);
    }
}
