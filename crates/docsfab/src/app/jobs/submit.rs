//! A submitted run, checked as `docsfab run` checks its inputs: the composition (through the
//! same `home::validate_run_inputs`), the provider it names, the provider's key variable, and
//! the workspace. The job runner repeats the checks when it claims the run (host.yaml may have
//! changed meanwhile) and then builds the run's configuration from them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use docsfab_runtime::composition::Composition;
use docsfab_runtime::executor::RunConfig;
use docsfab_runtime::store::{JobSpec, JobWorkspace, StoreUrl};
use tokio_util::sync::CancellationToken;

use super::clone;
use crate::app::error::CliError;
use crate::app::home::{HostContext, validate_run_inputs};
use crate::app::throttle::ThrottlePlan;

/// How a submitted composition is named in messages (never by the temporary file it is checked
/// from).
pub const SUBMITTED: &str = "the submitted composition";

/// The checks of `docsfab run` on the composition text: the host configuration, the
/// composition, its provider and that provider's base URL. Messages name
/// [`SUBMITTED`], never the temporary file.
pub fn validate_composition(
    home: &Path,
    yaml: &str,
) -> Result<(HostContext, Composition), CliError> {
    let dir = home.join("serve").join("submitted");
    std::fs::create_dir_all(&dir).map_err(|e| {
        CliError::failed(format!(
            "cannot prepare {} to check submitted compositions ({e}).",
            dir.display()
        ))
    })?;
    let path = dir.join(temp_name());
    std::fs::write(&path, yaml).map_err(|e| {
        CliError::failed(format!(
            "cannot write the submitted composition to {} to check it ({e}).",
            dir.display()
        ))
    })?;
    let checked = validate_run_inputs(&path, "POST /api/runs", true);
    let _ = std::fs::remove_file(&path);
    checked.map_err(|e| CliError {
        kind: e.kind,
        message: unname(&e.message, &path),
    })
}

/// `the composition /x/y.yaml ...` becomes `the submitted composition ...`; any other mention
/// of the temporary path too. There is no file for the submitter to fix: the advice names the
/// composition instead.
fn unname(message: &str, path: &Path) -> String {
    let shown = path.display().to_string();
    message
        .replace(
            "; fix the file",
            "; fix the composition and submit it again",
        )
        .replace(&format!("the composition {shown}"), SUBMITTED)
        .replace(
            &format!("The composition {shown}"),
            "The submitted composition",
        )
        .replace(&shown, SUBMITTED)
}

fn temp_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{nanos}.yaml",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A submission checked whole: the spec to enqueue.
pub fn check(
    home: &Path,
    root: Option<&Path>,
    yaml: &str,
    workspace: JobWorkspace,
) -> Result<JobSpec, CliError> {
    let (ctx, composition) = validate_composition(home, yaml)?;
    let selected = ctx.select_provider(&composition, Path::new(SUBMITTED))?;
    crate::app::execute::read_key(&selected).map_err(|e| CliError {
        kind: e.kind,
        message: e
            .message
            .replace("and run again", "and restart docsfab serve"),
    })?;
    match &workspace {
        JobWorkspace::Path { path } => {
            path_workspace(root, path)?;
        }
        JobWorkspace::Git { git, reference } => check_git(git, reference)?,
    }
    Ok(JobSpec {
        composition_yaml: yaml.to_owned(),
        composition_name: composition.name.clone(),
        workspace,
        resume: None,
        resume_from: None,
    })
}

/// A path workspace: relative paths are taken under the root; the canonical directory must lie
/// under the (canonical) root.
pub fn path_workspace(root: Option<&Path>, path: &str) -> Result<PathBuf, CliError> {
    let Some(root) = root else {
        return Err(CliError::bad_input(
            "this server accepts no path workspaces because it was started without --workspace-root; start docsfab serve with --workspace-root DIR, or submit a git workspace.",
        ));
    };
    let given = root.join(path);
    let canonical = std::fs::canonicalize(&given).map_err(|e| {
        CliError::bad_input(format!(
            "the workspace {path:?} cannot be used ({}); submit an existing directory under the workspace root {}.",
            crate::app::error::plain_reason(&e.to_string(), "unknown reason"),
            root.display()
        ))
    })?;
    if !canonical.starts_with(root) {
        return Err(CliError::bad_input(format!(
            "the workspace {path:?} is not under the workspace root {}; submit a directory inside it.",
            root.display()
        )));
    }
    if !canonical.is_dir() {
        return Err(CliError::bad_input(format!(
            "the workspace {path:?} is not a directory; submit a directory under the workspace root {}.",
            root.display()
        )));
    }
    Ok(canonical)
}

/// A git workspace names a URL and a ref, neither of which may look like an option to git.
fn check_git(url: &str, reference: &str) -> Result<(), CliError> {
    if url.trim().is_empty() || url.starts_with('-') {
        return Err(CliError::bad_input(
            "the workspace's git URL is empty or starts with '-'; submit {\"git\": \"URL\", \"ref\": \"REF\"} with the repository's URL.",
        ));
    }
    if reference.trim().is_empty() || reference.starts_with('-') {
        return Err(CliError::bad_input(
            "the workspace's git ref is empty or starts with '-'; submit {\"git\": \"URL\", \"ref\": \"REF\"} with a branch, tag or commit.",
        ));
    }
    Ok(())
}

/// Everything a claimed run needs, checked again now and resolved: the run's configuration and
/// the throttle to open. `Err` is the reason the run fails without starting.
pub fn prepare(
    home: &Path,
    store: &StoreUrl,
    root: Option<&Path>,
    run_id: &str,
    spec: &JobSpec,
    cancel: CancellationToken,
) -> Result<(RunConfig, ThrottlePlan), String> {
    let (ctx, composition) =
        validate_composition(home, &spec.composition_yaml).map_err(|e| e.message)?;
    let selected = ctx
        .select_provider(&composition, Path::new(SUBMITTED))
        .map_err(|e| e.message)?;
    let api_key = crate::app::execute::read_key(&selected).map_err(|e| e.message)?;
    crate::app::preflight::check_provider(
        selected.provider_name,
        &selected.provider.base_url,
        &ctx.host.path,
    )
    .map_err(|e| e.message)?;
    let workspace = match &spec.workspace {
        JobWorkspace::Path { path } => path_workspace(root, path).map_err(|e| e.message)?,
        JobWorkspace::Git { git, reference } => {
            let bound = clone::Bound {
                cancel: &cancel,
                until: Instant::now() + Duration::from_millis(ctx.limits.deadline_ms()),
            };
            clone::clone(home, run_id, git, reference, &bound)?
        }
    };
    crate::app::execute::check_workspace(&workspace).map_err(|e| e.message)?;
    let config = RunConfig {
        provider: crate::app::launch::provider_settings(&selected, api_key),
        composition,
        workspace,
        limits: ctx.limits.clone(),
        rules: ctx.rules.clone(),
        cancel,
        job_deadline: Some(Duration::from_millis(ctx.limits.deadline_ms())),
        progress: None,
        throttle: None,
        carry: None,
        // A claimed job's composition is kept with its queued run already.
        spec: None,
    };
    let throttle = ThrottlePlan::for_store_url(&ctx.home.dir, store, &ctx.host);
    Ok((config, throttle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue15_messages_name_the_submitted_composition_not_the_temp_file() {
        let p = Path::new("/h/serve/submitted/1-2-3.yaml");
        assert_eq!(
            unname(
                "the composition /h/serve/submitted/1-2-3.yaml line 2: bad",
                p
            ),
            "the submitted composition line 2: bad"
        );
        assert_eq!(
            unname("in /h/serve/submitted/1-2-3.yaml", p),
            "in the submitted composition"
        );
    }
}
