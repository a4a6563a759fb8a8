//! The earlier run a run carries finished steps over from (docs/resume.md): the run `docsfab
//! runs resume ID` resumes and what refuses it, and the run `docsfab run --reuse [RUN]` reuses.
//! `serve`'s resume goes through the same checks.

use std::io::Write as _;
use std::path::Path;

use docsfab_record::{RunRecord, RunStatus};
use docsfab_runtime::reuse::{Changed, Looks, Reference};
use docsfab_runtime::store::{JobSpec, JobWorkspace, RunStore};
use docsfab_runtime::workspace::Workspace;

use crate::app::error::CliError;
use crate::app::store::{read_failed, store_place};

/// What the operator allows a resume to do about a workspace that is not as the run left it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ResumeFlags {
    /// Run again the finished steps whose files changed (and what depends on them) instead of
    /// refusing.
    pub rerun_changed: bool,
    /// Keep the files an interrupted write left as they are, and run that step again over them.
    pub accept_workspace: bool,
}

/// The record of run `id`; an unknown id is bad input.
pub fn find_record(store: &RunStore, id: &str) -> Result<RunRecord, CliError> {
    store
        .load_run(id)
        .map_err(|e| read_failed(store.url(), e))?
        .ok_or_else(|| {
            CliError::bad_input(format!(
                "there is no run {id:?} in {}; list the known runs with `docsfab runs list`.",
                store_place(store.url())
            ))
        })
}

/// The run `id` to resume and the composition it was started with. Refused (bad input): an
/// unknown run, one that succeeded or has not ended, one whose composition was not kept.
pub fn resumable(store: &RunStore, id: &str) -> Result<(RunRecord, JobSpec), CliError> {
    let record = find_record(store, id)?;
    match record.status {
        RunStatus::Succeeded => {
            return Err(CliError::bad_input(format!(
                "run {id} succeeded, so there is nothing to resume; to run its composition again reusing the steps whose inputs did not change, use `docsfab run COMPOSITION --reuse {id}`."
            )));
        }
        RunStatus::Running | RunStatus::Queued => {
            return Err(CliError::bad_input(format!(
                "run {id} is still {}; wait for it to end (or cancel it), then resume it.",
                record.status.as_str()
            )));
        }
        RunStatus::Failed | RunStatus::Cancelled | RunStatus::Interrupted => {}
    }
    let spec = store
        .job_spec(id)
        .map_err(|e| read_failed(store.url(), e))?
        .ok_or_else(|| {
            CliError::bad_input(format!(
                "run {id} keeps no composition (it was recorded before docsfab kept them); run the composition again with `docsfab run COMPOSITION --reuse {id}` to reuse its finished steps."
            ))
        })?;
    Ok((record, spec))
}

/// The directory a resumed run works in: the one the original run recorded.
pub fn resume_workspace<'r>(record: &'r RunRecord, spec: &'r JobSpec) -> Result<&'r str, CliError> {
    if let Some(ws) = record.workspace.as_deref() {
        return Ok(ws);
    }
    match &spec.workspace {
        JobWorkspace::Path { path } => Ok(path),
        JobWorkspace::Git { git, .. } => Err(CliError::bad_input(format!(
            "run {} worked in a clone of {git} that no longer exists; resume it through `docsfab serve` (POST /api/runs/{}/resume), which clones it again.",
            record.run_id, record.run_id
        ))),
    }
}

/// Refuses a resume (bad input, nothing recorded) when an interrupted write left files the record
/// cannot account for (unless `--accept-workspace`), or when a file a finished step read or
/// wrote changed since (unless `--rerun-changed`); each sentence names the files.
pub fn check_resume(
    reference: &Reference,
    workspace: &Path,
    flags: ResumeFlags,
) -> Result<(), CliError> {
    let id = reference.run_id();
    let ws = Workspace::open(workspace).map_err(|e| {
        CliError::bad_input(format!(
            "run {id} worked in {}, which cannot be used now ({}); put the workspace back to resume it.",
            workspace.display(),
            e.evidence
        ))
    })?;
    if !flags.accept_workspace {
        let unaccounted = reference.unaccounted(&ws);
        if !unaccounted.is_empty() {
            return Err(CliError::bad_input(format!(
                "run {id} was interrupted while writing {}, and the record cannot account for what they hold now; restore them (for example with `git checkout`) or pass --accept-workspace to keep them as they are and run that step again.",
                shown_list(unaccounted.into_iter())
            )));
        }
    }
    if flags.rerun_changed {
        return Ok(());
    }
    let changed = changed_under_finished_steps(reference, &ws);
    if changed.is_empty() {
        return Ok(());
    }
    let named = changed
        .iter()
        .map(|c| format!("{} (step {})", c.path, c.step_id));
    Err(CliError::bad_input(format!(
        "the workspace changed since run {id} in files its finished steps read or wrote: {}; pass --rerun-changed to run those steps (and what depends on them) again, or put the files back.",
        shown_list(named)
    )))
}

/// Every file under a finished step of the reference that changed since.
fn changed_under_finished_steps(reference: &Reference, ws: &Workspace) -> Vec<Changed> {
    let mut looks = Looks::default();
    let mut changed: Vec<Changed> = reference
        .finished()
        .flat_map(|at| reference.changed(ws, at, &mut looks))
        .collect();
    changed.sort();
    changed.dedup();
    changed
}

/// The run `docsfab run --reuse [RUN]` reuses: `explicit`, else the newest succeeded run of the
/// composition `name` on `workspace` (none: a note on stderr, and every step runs).
pub fn reuse_reference(
    store: &RunStore,
    explicit: Option<&str>,
    name: &str,
    workspace: &Path,
) -> Result<Option<RunRecord>, CliError> {
    if let Some(id) = explicit {
        return find_record(store, id).map(Some);
    }
    let summaries = store.list_runs().map_err(|e| read_failed(store.url(), e))?;
    let wanted = workspace.display().to_string();
    for summary in summaries {
        if summary.status != RunStatus::Succeeded || summary.composition != name {
            continue;
        }
        let record = find_record(store, &summary.run_id)?;
        if record.workspace.as_deref() == Some(wanted.as_str()) {
            return Ok(Some(record));
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "note: --reuse found no succeeded run of composition {name} on {wanted}; every step runs."
    );
    Ok(None)
}

/// At most 10 names, escaped, then how many more.
fn shown_list(names: impl Iterator<Item = String>) -> String {
    let names: Vec<String> = names.map(|n| n.escape_debug().to_string()).collect();
    let mut shown = names
        .iter()
        .take(10)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 10 {
        shown.push_str(&format!(" and {} more", names.len() - 10));
    }
    shown
}
