//! Resuming through `docsfab serve` (docs/resume.md): `POST /api/runs/{id}/resume` queues a
//! new run that carries over the finished steps of `id`, refused as `docsfab runs resume`
//! refuses; a job submitted with `resume: auto` is queued again so, once, when its worker died
//! (by the store, in the transaction that marks the run interrupted; `service::log_resume` says
//! so);
//! and at claim time the worker builds the resumed run's reference and checks its workspace
//! again (it may be another host's, or a fresh clone).

use std::path::Path;

use docsfab_runtime::executor::Carry;
use docsfab_runtime::reuse::Reference;
use docsfab_runtime::store::{JobSpec, JobWorkspace, ResumeFrom, RunStore};

use crate::app::carry::{ResumeFlags, check_resume, find_record, resumable, resume_workspace};
use crate::app::error::CliError;

/// Queues the resume of run `id` and returns the new run's id.
pub fn queue(
    store: &mut RunStore,
    id: &str,
    flags: ResumeFlags,
    root: Option<&Path>,
) -> Result<String, CliError> {
    let (record, spec) = resumable(store, id)?;
    if let JobWorkspace::Path { .. } = &spec.workspace {
        let dir = resume_workspace(&record, &spec)?;
        // Under the server's workspace root, as a submission must be.
        super::submit::path_workspace(root, dir)?;
        let reference = Reference::new(&record, flags.accept_workspace);
        check_resume(&reference, Path::new(dir), flags)?;
    }
    store
        .enqueue(&resume_job(&spec, id, flags))
        .map_err(|e| CliError::failed(format!("cannot queue the resume of run {id} ({e}).")))
}

/// The job of a resume of `id`: its composition and workspace, resumed at most once.
fn resume_job(spec: &JobSpec, id: &str, flags: ResumeFlags) -> JobSpec {
    JobSpec {
        resume: None,
        resume_from: Some(ResumeFrom {
            run_id: id.to_owned(),
            rerun_changed: flags.rerun_changed,
            accept_workspace: flags.accept_workspace,
        }),
        ..spec.clone()
    }
}

/// At claim time: what a resumed job carries over, checked against its workspace now.
/// `Err` is why the run fails without starting.
pub fn carry(store: &RunStore, spec: &JobSpec, workspace: &Path) -> Result<Option<Carry>, String> {
    let Some(from) = &spec.resume_from else {
        return Ok(None);
    };
    let record = find_record(store, &from.run_id).map_err(|e| e.message)?;
    let flags = ResumeFlags {
        rerun_changed: from.rerun_changed,
        accept_workspace: from.accept_workspace,
    };
    let reference = Reference::new(&record, flags.accept_workspace);
    check_resume(&reference, workspace, flags).map_err(|e| e.message)?;
    Ok(Some(Carry {
        reference,
        resume: true,
        allow_lost_pages: false,
    }))
}
