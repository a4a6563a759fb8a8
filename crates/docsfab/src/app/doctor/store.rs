//! The run store as doctor finds it (`--store`, `DOCSFAB_STORE`, else the home's `runs.db`),
//! opened as `run` opens it: credentials or a database the server refuses are bad
//! configuration; a server that does not answer is a warning (it may be down for now); a SQLite
//! store that does not exist yet is left uncreated.

use docsfab_record::RunStatus;
use docsfab_runtime::store::{RunStore, StoreUrl};

use crate::app::error::CliError;

/// The run store as doctor found it.
pub struct StoreCheck {
    pub url: StoreUrl,
    pub state: StoreState,
}

pub enum StoreState {
    /// A SQLite file that does not exist yet: the first run creates it.
    NotCreated,
    /// Opened; how many runs it holds in each status (statuses with none left out).
    Open { counts: Vec<(RunStatus, u64)> },
    /// It could not be opened for a reason that may pass (a server down, a busy file): the
    /// warning sentence, which names the store and what to check.
    Unreachable(String),
}

/// Opens the store as `run` would, and returns it open when it could be read (for the goodput
/// line). A refusal that is configuration (a password or database the server rejects, a file
/// that is not a store) is returned as the error `run` would give.
pub fn check_store(url: &StoreUrl) -> Result<(StoreCheck, Option<RunStore>), CliError> {
    let url = url.clone();
    if let StoreUrl::Sqlite(path) = &url
        && !path.exists()
    {
        let state = StoreState::NotCreated;
        return Ok((StoreCheck { url, state }, None));
    }
    let (state, opened) = match crate::app::store::open_store_url(&url) {
        Err(e) if e.kind == crate::app::error::ErrorKind::BadInput => return Err(e),
        Err(e) => (StoreState::Unreachable(e.message), None),
        Ok(store) => match store.count_by_status() {
            Ok(counts) => (
                StoreState::Open {
                    counts: counts.into_iter().filter(|(_, n)| *n > 0).collect(),
                },
                Some(store),
            ),
            Err(e) => (
                StoreState::Unreachable(crate::app::store::read_failed(&url, e).message),
                None,
            ),
        },
    };
    Ok((StoreCheck { url, state }, opened))
}

impl StoreCheck {
    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self.url {
            StoreUrl::Sqlite(_) => "sqlite",
            StoreUrl::Postgres(_) => "postgres",
        }
    }
}
