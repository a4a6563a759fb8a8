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
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use docsfab_provider::ApiKey;
use docsfab_runtime::composition::Access;
use docsfab_runtime::executor::{
    CancelReason, Progress, ProviderSettings, RunConfig, RunError, RunOutcome, run_composition,
};
use docsfab_runtime::progress::human_duration;
use docsfab_runtime::record::{RunRecord, RunStatus};
use docsfab_runtime::store::{RunStore, StoreError, StoreUrl};
use docsfab_runtime::workspace::Workspace;
use tokio_util::sync::CancellationToken;

use crate::error::{CliError, emit};
use crate::home::{Selected, validate_run_inputs};
use crate::progress::{ColorChoice, Reporter, paint, status_style};
use crate::runs::{open_store_url, store_place, store_url, to_json};
use crate::throttle::ThrottlePlan;

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
    crate::preflight::check_provider(
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

/// The provider's key, from the variable host.yaml names. Messages name the variable, never a
/// value.
pub(crate) fn read_key(selected: &Selected<'_>) -> Result<ApiKey, CliError> {
    let var = &selected.provider.api_key_env;
    match std::env::var(var) {
        Ok(key) if !key.is_empty() => Ok(ApiKey::new(key).with_label(var.as_str())),
        Ok(_) | Err(std::env::VarError::NotPresent) => Err(CliError::bad_input(format!(
            "provider {:?} reads its API key from the environment variable {var}, which is not set (or empty); export {var} with the key and run again.",
            selected.provider_name
        ))),
        Err(std::env::VarError::NotUnicode(_)) => Err(CliError::bad_input(format!(
            "provider {:?} reads its API key from the environment variable {var}, which is not valid UTF-8; set {var} to the key as plain text.",
            selected.provider_name
        ))),
    }
}

/// For a composition with a write step: the workspace directory, opened and exclusively locked
/// until the returned file is dropped (the process ends). `None` for a read-only composition.
pub fn lock_workspace(config: &RunConfig) -> Result<Option<std::fs::File>, CliError> {
    if !config
        .composition
        .steps
        .iter()
        .any(|s| s.access == Access::Write)
    {
        return Ok(None);
    }
    let dir = &config.workspace;
    let file = std::fs::File::open(dir).map_err(|e| {
        workspace_refused(&format!(
            "cannot open the workspace {} ({e})",
            dir.display()
        ))
    })?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(CliError::bad_input(format!(
            "the workspace {} is in use by another `docsfab run` with a write step; wait for that run to end (or cancel it), or pass another --workspace.",
            dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(CliError::bad_input(format!(
            "cannot lock the workspace {} for a write step ({e}); use a workspace on a local filesystem that supports file locks.",
            dir.display()
        ))),
    }
}

pub fn check_workspace(dir: &Path) -> Result<(), CliError> {
    Workspace::open(dir)
        .map(|_| ())
        .map_err(|e| workspace_refused(&e.evidence))
}

/// A workspace that cannot be used, with what to do: bad input.
fn workspace_refused(evidence: &str) -> CliError {
    CliError::bad_input(format!(
        "{evidence}; pass --workspace with an existing directory."
    ))
}

pub fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Runtime::new()
        .map_err(|e| CliError::failed(format!("cannot start the async runtime ({e}).")))
}

/// Runs `config` with progress on stderr (coloured as `color` says), the run id first on stdout,
/// and SIGINT/SIGTERM wired to its cancellation token. `config.progress` is replaced.
pub async fn execute(
    mut config: RunConfig,
    store: &mut RunStore,
    color: ColorChoice,
) -> Result<RunOutcome, CliError> {
    let telemetry = crate::telemetry::Telemetry::from_env(&config)?;
    let reporter = Reporter::for_stderr(color);
    let signals = watch_signals(config.cancel.clone(), Arc::clone(&reporter))?;
    let sink_reporter = Arc::clone(&reporter);
    let sink_telemetry = telemetry.clone();
    config.progress = Some(Arc::new(move |p: &Progress| {
        if let Progress::RunStarted { run_id } = p {
            sink_reporter.stdout(&format!("{run_id}\n"));
        }
        sink_reporter.on_event(p);
        if let Some(t) = &sink_telemetry {
            t.observe(p);
        }
    }));
    let result = run_composition(config, store).await;
    signals.abort();
    reporter.finish();
    // After the record is committed, and in the background: the export cannot change the
    // run, its summary or its exit code (main waits for it last).
    if let (Some(t), Ok(outcome)) = (&telemetry, &result)
        && let Ok(Some(record)) = store.load_run(&outcome.run_id)
    {
        t.start_export(&record);
    }
    result.map_err(|e| match e {
        RunError::Workspace(text) => workspace_refused(&text),
        RunError::Transport(e) => CliError::bad_input(format!(
            "{e}; check the provider's baseUrl in host.yaml."
        )),
        RunError::Store(e @ StoreError::Busy { .. }) => CliError::failed(format!(
            "{e}; the run could not be recorded to its end, run it again when fewer docsfab commands share this DOCSFAB_HOME."
        )),
        RunError::Store(e) => CliError::failed(format!(
            "{e}; the run could not be recorded to its end, check DOCSFAB_HOME's disk space and permissions."
        )),
    })
}

/// The first SIGINT or SIGTERM cancels the run (it then ends at once and is recorded
/// `cancelled`); a second one exits without waiting.
fn watch_signals(
    cancel: CancellationToken,
    reporter: Arc<Reporter>,
) -> Result<tokio::task::JoinHandle<()>, CliError> {
    use tokio::signal::unix::{SignalKind, signal};
    let install = |kind: SignalKind| {
        signal(kind)
            .map_err(|e| CliError::failed(format!("cannot install the signal handlers ({e}).")))
    };
    let mut interrupt = install(SignalKind::interrupt())?;
    let mut terminate = install(SignalKind::terminate())?;
    Ok(tokio::spawn(async move {
        let mut seen = false;
        loop {
            let name = tokio::select! {
                _ = interrupt.recv() => "SIGINT",
                _ = terminate.recv() => "SIGTERM",
            };
            if seen {
                let _ = writeln!(
                    std::io::stderr(),
                    "error: {name} received again: exiting now; the run will show as interrupted."
                );
                std::process::exit(130);
            }
            seen = true;
            reporter.cancelling(name);
            cancel.cancel();
        }
    }))
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

/// The files the run wrote and left in place, as the summary names them
/// (`docs/overview.md (1.2 KiB)`), in the order they were first written. Writes of an attempt
/// the host restored are gone from the workspace, so they are not named; the record still
/// lists them under that attempt.
fn files_written(record: &RunRecord) -> Vec<String> {
    let mut sizes: Vec<(&str, u64)> = Vec::new();
    let kept = record
        .steps
        .iter()
        .flat_map(|s| &s.attempts)
        .filter(|a| a.write_restore.is_none())
        .flat_map(|a| a.files_written.iter().flatten());
    for f in kept {
        match sizes.iter_mut().find(|(p, _)| *p == f.path) {
            Some(entry) => entry.1 = f.bytes,
            None => sizes.push((&f.path, f.bytes)),
        }
    }
    sizes
        .into_iter()
        .map(|(path, bytes)| format!("{} ({})", shown_path(path), human_bytes(bytes)))
        .collect()
}

/// A model-chosen path as the terminal may show it: escaped, never raw control characters.
fn shown_path(path: &str) -> String {
    path.escape_debug().to_string()
}

/// `512 B`, `1.2 KiB`, `3.4 MiB`.
fn human_bytes(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else {
        format!("{:.1} MiB", b / (KIB * KIB))
    }
}

/// The most written files the summary names; `runs diff --stat` lists them all.
const FILES_NAMED: usize = 10;

/// A few lines after the id: each step's status, its attempts by budget and its replays, the
/// files written, and where to look further. `colour` paints the status words.
pub fn summary(r: &RunRecord, elapsed: Duration, colour: bool) -> String {
    let status = r.status.as_str();
    let mut out = format!(
        "Run {} {} in {} (composition {})\n",
        r.run_id,
        paint(colour, status_style(status), status),
        human_duration(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)),
        r.composition
    );
    for s in &r.steps {
        let budgets: Vec<&str> = s.attempts.iter().map(|a| a.budget.as_str()).collect();
        let replays: u32 = s
            .attempts
            .iter()
            .flat_map(|a| &a.turns)
            .map(|t| t.provider_retries())
            .sum();
        out.push_str(&format!(
            "  {} ({}): {}; {} attempt{} ({}), {} in-turn replay{}\n",
            s.step_id,
            s.access.as_str(),
            paint(colour, status_style(s.status.as_str()), s.status.as_str()),
            s.attempts.len(),
            if s.attempts.len() == 1 { "" } else { "s" },
            budgets.join(", "),
            replays,
            if replays == 1 { "" } else { "s" }
        ));
        if let Some(f) = &s.failure {
            out.push_str(&format!("    {}: {}\n", f.code, f.message.trim()));
            out.push_str(&format!("    what to do: {}\n", f.remediation.trim()));
        }
    }
    let files = files_written(r);
    if !files.is_empty() {
        let mut named = files.iter().take(FILES_NAMED).cloned().collect::<Vec<_>>();
        if files.len() > FILES_NAMED {
            named.push(format!("+{} more", files.len() - FILES_NAMED));
        }
        out.push_str(&format!("Files written: {}\n", named.join(", ")));
    }
    out.push_str(&format!(
        "Every attempt, turn and retry decision: docsfab runs show {}\n",
        r.run_id
    ));
    if r.steps.iter().any(|s| s.access == Access::Write) {
        out.push_str(&format!(
            "What it wrote, as a diff: docsfab runs diff {}\n",
            r.run_id
        ));
    }
    out
}

/// The exit code of a finished run: 0 succeeded, 1 failed, 130 cancelled.
pub fn conclude(outcome: &RunOutcome, record: &RunRecord) -> Result<(), CliError> {
    let id = &outcome.run_id;
    match outcome.status {
        RunStatus::Succeeded => Ok(()),
        RunStatus::Cancelled => Err(CliError::cancelled(match outcome.cancel_reason {
            Some(CancelReason::JobDeadline { deadline_ms }) => format!(
                "run {id} was cancelled by the job deadline (runtime.deadlineMilliseconds = {deadline_ms} ms); its record is kept, see `docsfab runs show {id}`."
            ),
            _ => {
                format!("run {id} was cancelled; its record is kept, see `docsfab runs show {id}`.")
            }
        })),
        other => {
            let step = record
                .steps
                .iter()
                .find(|s| s.failure.is_some())
                .map(|s| format!(" at step {}", s.step_id))
                .unwrap_or_default();
            Err(CliError::failed(format!(
                "run {id} {}{step}; see `docsfab runs show {id}` for every attempt and what to do.",
                other.as_str()
            )))
        }
    }
}
