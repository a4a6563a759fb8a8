//! `docsfab run F`: validate everything, then run the composition with the run store recording.
//!
//! Order matters: host.yaml, the environment limits, the rules table, the composition, the
//! provider it names, the provider's key variable and the workspace are all checked before the
//! run store is opened, so bad input (exit 2) leaves nothing behind. Then the run: the first line
//! on stdout is the run id alone, printed and flushed the moment the run exists in the store, so
//! a script can follow it with `docsfab runs show ID` even while it runs. Progress goes to
//! stderr. The summary at the end names the files the run wrote and the commands that show the
//! rest (`runs show`, `runs diff`). SIGINT and SIGTERM cancel the run through its cancellation token: every wait stops at
//! once, the run is recorded `cancelled` and the exit code is 130. A second signal exits at once
//! (the run is then found `interrupted` by the next command that opens the store).
//!
//! A composition with a write step holds an exclusive advisory lock (`flock`) on the workspace
//! directory itself for the whole run, so no lock file lands in the user's tree and a killed
//! run's lock goes with its process. A second write run on the same workspace is refused at
//! once, before anything is recorded (exit 2): two runs writing, and restoring, the same files
//! would undo each other's work, and waiting silently behind a run that may take an hour helps
//! nobody. Read-only runs take no lock and may run beside anything.

use std::path::PathBuf;

use clap::Args;
use docsfab_runtime::executor::Carry;
use docsfab_runtime::reuse::Reference;

use crate::app::carry::reuse_reference;
use crate::app::error::CliError;
use crate::app::launch::{Prepared, Source, canonical, prepare, run_and_report};
use crate::app::progress::ColorChoice;
use crate::app::store::open_store_url;
use crate::app::workspace_lock;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The composition file to run.
    #[arg(value_name = "COMPOSITION")]
    pub composition: PathBuf,
    /// The directory the tools work in (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// After the id line, print the run record (as `docsfab runs show ID --json`) instead of
    /// the summary.
    #[arg(long)]
    pub json: bool,
    /// Reuse, with no request, every step whose inputs are identical to one of run RUN
    /// (default: the newest succeeded run of this composition on this workspace); see
    /// docs/resume.md.
    #[arg(long, value_name = "RUN", num_args = 0..=1, default_missing_value = "")]
    pub reuse: Option<String>,
    /// With --reuse: let a pages step write fewer pages than the reused run did, even where
    /// the dropped pages' sources still exist (otherwise it stops before writing and names
    /// them; docs/pages.md).
    #[arg(long, requires = "reuse")]
    pub allow_lost_pages: bool,
}

pub fn run(args: &RunArgs, color: ColorChoice, store: Option<&str>) -> Result<(), CliError> {
    let Prepared {
        mut config,
        store: store_path,
        throttle,
    } = prepare(
        Source::File(&args.composition),
        args.workspace.as_deref(),
        store,
    )?;
    let _workspace_lock = workspace_lock::hold(&config)?;
    let mut store = open_store_url(&store_path)?;
    if let Some(run) = &args.reuse {
        let explicit = Some(run.as_str()).filter(|r| !r.is_empty());
        let workspace = canonical(&config.workspace);
        config.carry = reuse_reference(&store, explicit, &config.composition.name, &workspace)?
            .map(|record| Carry {
                reference: Reference::new(&record, false),
                resume: false,
                allow_lost_pages: args.allow_lost_pages,
            });
    }
    config.throttle = throttle.open();
    run_and_report(config, &mut store, color, args.json)
}
