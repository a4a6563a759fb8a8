//! Running a composition from the command line (`run`, `demo`, `serve`'s jobs): the async
//! runtime, the provider key, the workspace checks, progress and signals, and how the run's
//! outcome becomes an exit code.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use docsfab_provider::ApiKey;
use docsfab_record::{Access, RunRecord, RunStatus};
use docsfab_runtime::executor::{
    CancelReason, Progress, RunConfig, RunError, RunOutcome, run_composition,
};
use docsfab_runtime::progress::human_duration;
use docsfab_runtime::store::{RunStore, StoreError};
use docsfab_runtime::workspace::Workspace;
use tokio_util::sync::CancellationToken;

use crate::app::error::CliError;
use crate::app::home::Selected;
use crate::app::progress::{ColorChoice, Reporter, paint, status_style};

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

/// Runs `config` with progress on stderr (colored as `color` says), the run id first on stdout,
/// and SIGINT/SIGTERM wired to its cancellation token. `config.progress` is replaced.
pub async fn execute(
    mut config: RunConfig,
    store: &mut RunStore,
    color: ColorChoice,
) -> Result<RunOutcome, CliError> {
    let telemetry = crate::app::telemetry::Telemetry::from_env(&config)?;
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
/// files written, and where to look further. `color` paints the status words.
pub fn summary(r: &RunRecord, elapsed: Duration, color: bool) -> String {
    let status = r.status.as_str();
    let mut out = format!(
        "Run {} {} in {} (composition {})\n",
        r.run_id,
        paint(color, status_style(status), status),
        human_duration(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)),
        r.composition
    );
    if let Some(from) = &r.resumed_from {
        out.push_str(&format!("  resumed from run {}\n", from.run_id));
    }
    out.push_str(&format!(
        "  spent: {}, {}\n",
        r.usage,
        docsfab_record::shown_cost(r.cost_usd)
    ));
    for s in &r.steps {
        if let Some(from) = &s.reused_from {
            out.push_str(&format!(
                "  {} ({}): {}; reused from run {} ({}), no request\n",
                s.step_id,
                s.access.as_str(),
                paint(color, status_style(s.status.as_str()), s.status.as_str()),
                from.run_id,
                from.step_id
            ));
            continue;
        }
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
            paint(color, status_style(s.status.as_str()), s.status.as_str()),
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
