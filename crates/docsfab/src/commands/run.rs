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

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use docsfab_runtime::executor::{ProviderSettings, RunConfig};
use docsfab_runtime::store::StoreUrl;
use tokio_util::sync::CancellationToken;

use crate::app::error::{CliError, emit};
use crate::app::execute::{
    check_workspace, conclude, execute, lock_workspace, read_key, runtime, summary,
};
use crate::app::home::validate_run_inputs;
use crate::app::print::to_json;
use crate::app::progress::ColorChoice;
use crate::app::store::load_record;
use crate::app::store::{open_store_url, store_url};
use crate::app::throttle::ThrottlePlan;

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
}

pub fn run(args: &RunArgs, color: ColorChoice, store: Option<&str>) -> Result<(), CliError> {
    let (mut config, store_path, throttle) = prepare(args, store)?;
    let _workspace_lock = lock_workspace(&config)?;
    let mut store = open_store_url(&store_path)?;
    config.throttle = throttle.open();
    let started = Instant::now();
    let outcome = runtime()?.block_on(execute(config, &mut store, color))?;
    let record = load_record(&store, &outcome.run_id)?;
    if args.json {
        emit(&format!("{}\n", to_json(&record)?))?;
    } else {
        let colour = color.for_stream(std::io::stdout().is_terminal());
        emit(&summary(&record, started.elapsed(), colour))?;
    }
    conclude(&outcome, &record)
}

/// Checks the whole configuration and builds the run; nothing is written.
fn prepare(
    args: &RunArgs,
    store: Option<&str>,
) -> Result<(RunConfig, StoreUrl, ThrottlePlan), CliError> {
    let path = &args.composition;
    let (ctx, composition) = validate_run_inputs(path, "`docsfab run`", true)?;
    let store = store_url(&ctx.home.dir, store)?;
    for warning in ctx.unknown_env_warnings() {
        // Not eprintln!: a closed stderr must not stop the run.
        let _ = writeln!(std::io::stderr(), "warning: {warning}");
    }
    let selected = ctx.select_provider(&composition, path)?;
    let api_key = read_key(&selected)?;
    crate::app::preflight::check_provider(
        selected.provider_name,
        &selected.provider.base_url,
        &ctx.host.path,
    )?;
    let workspace = match &args.workspace {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().map_err(|e| {
            CliError::bad_input(format!(
                "cannot read the current directory ({e}); pass the workspace with --workspace DIR."
            ))
        })?,
    };
    check_workspace(&workspace)?;
    let config = RunConfig {
        provider: ProviderSettings {
            name: selected.provider_name.to_owned(),
            api: selected.provider.api,
            base_url: selected.provider.base_url.clone(),
            model: selected.model.to_owned(),
            api_key: Some(api_key),
        },
        composition,
        workspace,
        limits: ctx.limits.clone(),
        rules: ctx.rules.clone(),
        cancel: CancellationToken::new(),
        job_deadline: Some(Duration::from_millis(ctx.limits.deadline_ms())),
        progress: None,
        throttle: None,
    };
    let throttle = ThrottlePlan::for_store_url(&ctx.home.dir, &store, &ctx.host);
    Ok((config, store, throttle))
}
