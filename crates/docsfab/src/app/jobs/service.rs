//! What the API and the job runner of `docsfab serve` share: the run store (where the service's
//! store is, and the API's own open one), the workspace root submissions must lie under, and
//! the state of this process's jobs (the wake-up for the runner, how many runs it runs now,
//! whether it drains, and the sums of the runs it finished for `/metrics`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use docsfab_runtime::store::{Reaped, RunStore, StoreUrl};

use super::metrics::Counters;
use crate::app::error::CliError;

/// One line of the service on the server's stderr, `serve: ` in front.
pub fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "serve: {line}");
}

/// The line for a run a reap marked interrupted that was submitted with `resume: auto`. The
/// store queued its resume in the transaction that marked it
/// ([`docsfab_runtime::store::JobSpec::auto_resume`]): whichever process reaped it (a runner's
/// reap, the store a job or a command opened), the run is resumed, once.
pub fn log_resume(run: &Reaped) {
    if let Some(resumed) = &run.resumed_as {
        log(&format!(
            "run {} had resume: auto; queued its resume as run {resumed}",
            run.run_id
        ));
    }
}

/// How long a job waits for an unreachable PostgreSQL store when it opens its own: the same
/// patience a running job's transactions have.
const JOB_OPEN_PATIENCE: Duration = Duration::from_secs(30);

/// Where the run store is: `--store`/`DOCSFAB_STORE`, else `DOCSFAB_HOME/runs.db`.
#[derive(Debug, Clone)]
pub struct StoreAt {
    url: StoreUrl,
}

impl StoreAt {
    fn locate(home: &Path, flag: Option<&str>) -> Result<StoreAt, CliError> {
        Ok(StoreAt {
            url: crate::app::store::store_url(home, flag)?,
        })
    }

    /// A store of its own (the API shares one; each job opens its own). A PostgreSQL server
    /// that cannot be reached is waited for as a running job waits for it (30 s), so a restart
    /// of the database as a job starts does not fail its run.
    pub fn open(&self) -> Result<RunStore, CliError> {
        crate::app::store::open_store_url_within(&self.url, JOB_OPEN_PATIENCE)
    }

    pub fn url(&self) -> &StoreUrl {
        &self.url
    }
}

/// The job service of one `docsfab serve` process.
pub struct Service {
    pub home: PathBuf,
    pub store_at: StoreAt,
    /// The API's store; used on blocking threads only (`with_store`, `with_store_now`).
    api_store: Mutex<RunStore>,
    pub workspace_root: Option<PathBuf>,
    /// Set by the first SIGTERM/SIGINT: no claims, `/healthz` 503.
    pub draining: AtomicBool,
    /// Wakes the job runner (a run was submitted or re-run here).
    pub wake: tokio::sync::Notify,
    pub running_here: AtomicU64,
    pub metrics: Counters,
}

impl Service {
    /// Checks the workspace root and opens the store (`--store`, else the home's `runs.db`),
    /// which marks `interrupted` the runs it finds orphaned and queues the resume of those
    /// submitted with `resume: auto`.
    pub fn open(
        home: &Path,
        store: Option<&str>,
        workspace_root: Option<&Path>,
    ) -> Result<Service, CliError> {
        let workspace_root = workspace_root.map(check_root).transpose()?;
        let store_at = StoreAt::locate(home, store)?;
        let api_store = store_at.open()?;
        // Opening said which runs it marked interrupted (`app::store`); their resumes:
        api_store.reaped_on_open().iter().for_each(log_resume);
        Ok(Service {
            home: home.to_path_buf(),
            store_at,
            api_store: Mutex::new(api_store),
            workspace_root,
            draining: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            running_here: AtomicU64::new(0),
            metrics: Counters::default(),
        })
    }

    /// Runs `f` on the API's store, on a blocking thread (the store's calls block).
    pub async fn with_store<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut RunStore) -> T + Send + 'static,
    ) -> Result<T, String> {
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || me.with_store_now(f))
            .await
            .map_err(|e| format!("the store call did not finish ({e})"))
    }

    /// Runs `f` on the API's store on this thread, which must be one that may block.
    pub fn with_store_now<T>(&self, f: impl FnOnce(&mut RunStore) -> T) -> T {
        let mut store = self
            .api_store
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(&mut store)
    }

    /// After every run this worker held has ended: others need not wait for its heartbeat to
    /// go stale before they reap what a later crash of the database session might leave.
    pub async fn sign_off(&self) {
        if let StoreUrl::Postgres(url) = self.store_at.url() {
            let url = url.clone();
            let _ = tokio::task::spawn_blocking(move || docsfab_pg::worker::stop(&url)).await;
        }
    }
}

/// The workspace root, canonical; it must be an existing directory.
fn check_root(dir: &Path) -> Result<PathBuf, CliError> {
    match std::fs::canonicalize(dir) {
        Ok(p) if p.is_dir() => Ok(p),
        Ok(_) => Err(CliError::bad_input(format!(
            "the workspace root {} is not a directory; pass --workspace-root with an existing directory.",
            dir.display()
        ))),
        Err(e) => Err(CliError::bad_input(format!(
            "the workspace root {} cannot be used ({}); pass --workspace-root with an existing directory.",
            dir.display(),
            crate::app::error::plain_reason(&e.to_string(), "unknown reason")
        ))),
    }
}
