//! `docsfab runs resume ID`: a new run of a run that ended `failed`, `cancelled` or
//! `interrupted`, from the composition, provider and workspace it was started with, carrying
//! over every step and fan-out instance that succeeded (docs/resume.md).
//!
//! Everything is checked before anything is recorded: the run (known, ended, not succeeded,
//! its composition kept), the whole configuration as `docsfab run` checks it, the workspace lock
//! of a write run, and the workspace itself against the record (files an interrupted write left,
//! files a finished step read or wrote that changed since). A refusal is one sentence and exit 2.

use std::path::Path;

use docsfab_runtime::executor::Carry;
use docsfab_runtime::reuse::Reference;
use docsfab_runtime::store::StoreUrl;

use crate::app::carry::{ResumeFlags, check_resume, resumable, resume_workspace};
use crate::app::error::CliError;
use crate::app::launch::{Prepared, Source, prepare, run_and_report};
use crate::app::progress::ColorChoice;
use crate::app::store::{open_store_url, store_exists, store_place};
use crate::app::workspace_lock;

/// What `runs resume` was asked.
pub struct Resume<'a> {
    pub id: &'a str,
    pub flags: ResumeFlags,
    pub json: bool,
}

pub fn resume(
    path: &StoreUrl,
    store_flag: Option<&str>,
    ask: &Resume<'_>,
    color: ColorChoice,
) -> Result<(), CliError> {
    let id = ask.id;
    if !store_exists(path) {
        return Err(CliError::bad_input(format!(
            "there is no run {id:?} in {}; list the known runs with `docsfab runs list`.",
            store_place(path)
        )));
    }
    let mut store = open_store_url(path)?;
    let (record, spec) = resumable(&store, id)?;
    let workspace = resume_workspace(&record, &spec)?.to_owned();
    let named = format!("the composition of run {id}");
    let Prepared {
        mut config,
        throttle,
        ..
    } = prepare(
        Source::Stored {
            text: &spec.composition_yaml,
            named: Path::new(&named),
        },
        Some(Path::new(&workspace)),
        store_flag,
    )?;
    let _workspace_lock = workspace_lock::hold(&config)?;
    let reference = Reference::new(&record, ask.flags.accept_workspace);
    check_resume(&reference, &config.workspace, ask.flags)?;
    config.carry = Some(Carry {
        reference,
        resume: true,
        allow_lost_pages: false,
    });
    config.throttle = throttle.open();
    run_and_report(config, &mut store, color, ask.json)
}
