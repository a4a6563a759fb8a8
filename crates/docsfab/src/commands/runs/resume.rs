//! `docsfab runs resume ID`: a new run of a run that ended `failed`, `cancelled` or
//! `interrupted`, from the composition, provider and workspace it was started with, carrying
//! over every step and fan-out instance that succeeded (docs/resume.md).
//!
//! Everything is checked before anything is recorded: the run (known, ended, not succeeded,
//! its composition kept), the whole configuration as `docsfab run` checks it, the workspace lock
//! of a write run, and the workspace itself against the record (files an interrupted write left,
//! files a finished step read or wrote that changed since). A refusal is one sentence and exit 2.

use std::io::IsTerminal as _;
use std::path::Path;
use std::time::Instant;

use docsfab_runtime::executor::Carry;
use docsfab_runtime::reuse::Reference;
use docsfab_runtime::store::StoreUrl;

use crate::app::carry::{ResumeFlags, check_resume, resumable, resume_workspace};
use crate::app::error::{CliError, emit};
use crate::app::execute::{conclude, execute, lock_workspace, runtime, summary};
use crate::app::launch::{Prepared, Source, prepare};
use crate::app::print::to_json;
use crate::app::progress::ColorChoice;
use crate::app::store::{load_record, open_store_url, store_exists, store_place};

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
    let _workspace_lock = lock_workspace(&config)?;
    let reference = Reference::new(&record, ask.flags.accept_workspace);
    check_resume(&reference, &config.workspace, ask.flags)?;
    config.carry = Some(Carry {
        reference,
        resume: true,
    });
    config.throttle = throttle.open();
    let started = Instant::now();
    let outcome = runtime()?.block_on(execute(config, &mut store, color))?;
    let record = load_record(&store, &outcome.run_id)?;
    if ask.json {
        emit(&format!("{}\n", to_json(&record)?))?;
    } else {
        let colour = color.for_stream(std::io::stdout().is_terminal());
        emit(&summary(&record, started.elapsed(), colour))?;
    }
    conclude(&outcome, &record)
}
