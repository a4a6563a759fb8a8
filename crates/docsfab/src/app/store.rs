//! The run store as commands open and read it: which store a command uses, how its failures
//! read to an operator, and loading records from it.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use docsfab_record::RunRecord;
use docsfab_runtime::stats::Filter;
use docsfab_runtime::store::{BusyRetry, RunStore, StoreError, StoreOptions, StoreUrl};

use crate::app::error::{CliError, plain_reason};

/// The file name of the run store inside `DOCSFAB_HOME`.
pub const STORE_FILE_NAME: &str = "runs.db";

/// The run store a command uses: the `--store` flag's value (clap fills it from
/// `DOCSFAB_STORE` when the flag is absent), else `sqlite:HOME/runs.db`. A value that is not a
/// store URL is bad input.
pub fn store_url(home_dir: &Path, flag: Option<&str>) -> Result<StoreUrl, CliError> {
    match flag {
        None => Ok(StoreUrl::Sqlite(home_dir.join(STORE_FILE_NAME))),
        Some(text) => StoreUrl::parse(text)
            .map_err(|e| CliError::bad_input(format!("--store (or DOCSFAB_STORE): {e}."))),
    }
}

/// How messages name a store: a SQLite store by its file path (as before there was a choice),
/// PostgreSQL by its URL without the password.
pub fn store_place(url: &StoreUrl) -> String {
    match url {
        StoreUrl::Sqlite(path) => path.display().to_string(),
        StoreUrl::Postgres(pg) => pg.to_string(),
    }
}

/// Whether the store holds anything yet; reading commands create no SQLite file where there
/// is none. A PostgreSQL store is a server's database: it is opened (and migrated) to look.
pub fn store_exists(url: &StoreUrl) -> bool {
    match url {
        StoreUrl::Sqlite(path) => path.exists(),
        StoreUrl::Postgres(_) => true,
    }
}

/// Opens the run store for a command. A failure of a SQLite file is the operator's to fix
/// (permissions, a file that is not a database), so it is bad input; except a store other
/// docsfab processes kept locked past every retry, which is a failure to try again later, as is
/// a PostgreSQL server that does not answer.
///
/// Says on stderr which runs this open found orphaned and marked `interrupted`, and each retry
/// while another docsfab process holds the store past the busy timeout, so a slow command says
/// why it waits.
pub fn open_store_url(url: &StoreUrl) -> Result<RunStore, CliError> {
    open_store_url_within(url, Duration::ZERO)
}

/// [`open_store_url`], waiting up to `patience` for a PostgreSQL server that cannot be reached
/// (`docsfab serve`'s jobs: a restart of the database as a job starts does not fail its run).
pub fn open_store_url_within(url: &StoreUrl, patience: Duration) -> Result<RunStore, CliError> {
    let options = StoreOptions {
        open_patience: patience,
        on_busy: Some(std::sync::Arc::new(|b: &BusyRetry| {
            let _ = writeln!(
                std::io::stderr(),
                "note: the run store is busy with another docsfab process while {}; trying again ({} of {}).",
                b.operation,
                b.retry,
                b.max_retries
            );
        })),
        ..StoreOptions::default()
    };
    let place = store_place(url);
    let store = RunStore::open_url(url, options).map_err(|e| match (e, url) {
        // Not the operator's configuration: another process kept the store locked.
        (e @ StoreError::Busy { .. }, _) => CliError::failed(format!(
            "cannot open the run store {place} ({e}); try again when the other docsfab commands on this DOCSFAB_HOME have finished."
        )),
        // The server answered and refused the URL's credentials or database: configuration.
        (StoreError::Postgres(e), _) if is_config_refusal(&e) => CliError::bad_input(format!(
            "cannot open the run store {place}: {e}; correct the user, password or database in the store URL (--store or DOCSFAB_STORE)."
        )),
        (e, StoreUrl::Postgres(_)) => CliError::failed(format!(
            "cannot open the run store {place} ({e}); check that the PostgreSQL server is running and that the URL's user may create tables in that database."
        )),
        (e, StoreUrl::Sqlite(_)) => {
            let reason = plain_reason(
                &e.to_string(),
                "it is not a docsfab run store of this version, or it is damaged",
            );
            CliError::bad_input(format!(
                "cannot open the run store {place} ({reason}); check that DOCSFAB_HOME is a writable directory and the file is a docsfab run store, or move it aside."
            ))
        }
    })?;
    for id in store.interrupted_on_open() {
        let _ = writeln!(
            std::io::stderr(),
            "note: run {id} was left running by a process that no longer exists; it is now marked interrupted."
        );
    }
    Ok(store)
}

pub(crate) fn read_failed(url: &StoreUrl, e: impl std::fmt::Display) -> CliError {
    let reason = plain_reason(&e.to_string(), "it is damaged or not a docsfab run store");
    CliError::failed(format!(
        "cannot read the run store {} ({reason}); check the file, or move it aside to start a new one.",
        store_place(url)
    ))
}

/// The records of the runs that started in the window (all of them without `--since`); none,
/// and no store created, when there is no store yet.
pub(crate) fn load_records(
    path: &StoreUrl,
    filter: &Filter,
) -> Result<Vec<docsfab_record::RunRecord>, CliError> {
    if !store_exists(path) {
        return Ok(Vec::new());
    }
    records_of(&open_store_url(path)?, path, filter)
}

/// [`load_records`] from a store already open at `path`.
pub(crate) fn records_of(
    store: &RunStore,
    path: &StoreUrl,
    filter: &Filter,
) -> Result<Vec<docsfab_record::RunRecord>, CliError> {
    let failed = |e: docsfab_runtime::store::StoreError| read_failed(path, e);
    let mut records = Vec::new();
    for summary in store.list_runs().map_err(failed)? {
        // The summary's start is enough to skip a run outside the window unread.
        if filter
            .started_at_or_after
            .as_deref()
            .is_some_and(|cut| summary.started_at.as_str() < cut)
        {
            continue;
        }
        if let Some(record) = store.load_run(&summary.run_id).map_err(failed)? {
            records.push(record);
        }
    }
    Ok(records)
}

/// A PostgreSQL refusal that only a corrected URL can fix (bad credentials, no such database).
fn is_config_refusal(e: &docsfab_pg::PgError) -> bool {
    use docsfab_pg::postgres::error::SqlState;
    e.code().is_some_and(|c| {
        [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_CATALOG_NAME,
        ]
        .contains(c)
    })
}

pub fn load_record(store: &RunStore, run_id: &str) -> Result<RunRecord, CliError> {
    let place = store_place(store.url());
    match store.load_run(run_id) {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(CliError::failed(format!(
            "run {run_id} is missing from the run store {place} right after it ran; check that nothing else removes its runs."
        ))),
        Err(e) => Err(CliError::failed(format!(
            "cannot read run {run_id} back from {place} ({e}); inspect it later with `docsfab runs show {run_id}`."
        ))),
    }
}
