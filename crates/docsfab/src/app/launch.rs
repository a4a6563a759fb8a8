//! What `docsfab run` and `docsfab runs resume` check and build before a run starts: the whole
//! configuration, the provider and its key, the workspace, and the store. Nothing is written
//! here, so bad input (exit 2) leaves nothing behind.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use docsfab_runtime::executor::{ProviderSettings, RunConfig};
use docsfab_runtime::store::{JobSpec, JobWorkspace, StoreUrl};
use docsfab_runtime::workspace::Workspace;
use tokio_util::sync::CancellationToken;

use crate::app::error::CliError;
use crate::app::execute::{check_workspace, read_key};
use crate::app::home::{validate_run_file, validate_run_text};
use crate::app::store::store_url;
use crate::app::throttle::ThrottlePlan;

/// Where a run's composition comes from.
pub enum Source<'a> {
    /// A file given on the command line.
    File(&'a Path),
    /// The composition a run was started with, kept in the store; `named` is how messages name
    /// it (e.g. `the composition of run ID`).
    Stored { text: &'a str, named: &'a Path },
}

/// A run ready to start: its configuration (with the composition kept as its `spec`), its
/// store and its throttle.
pub struct Prepared {
    pub config: RunConfig,
    pub store: StoreUrl,
    pub throttle: ThrottlePlan,
}

/// Checks the whole configuration and builds the run; nothing is written.
pub fn prepare(
    source: Source<'_>,
    workspace: Option<&Path>,
    store: Option<&str>,
) -> Result<Prepared, CliError> {
    let (ctx, composition, text, named) = match source {
        Source::File(path) => {
            let (ctx, composition, text) = validate_run_file(path, "`docsfab run`")?;
            (ctx, composition, text, path)
        }
        Source::Stored { text, named } => {
            let (ctx, composition) = validate_run_text(text, named, true)?;
            (ctx, composition, text.to_owned(), named)
        }
    };
    let store = store_url(&ctx.home.dir, store)?;
    for warning in ctx.unknown_env_warnings() {
        // Not eprintln!: a closed stderr must not stop the run.
        let _ = writeln!(std::io::stderr(), "warning: {warning}");
    }
    let selected = ctx.select_provider(&composition, named)?;
    let api_key = read_key(&selected)?;
    crate::app::preflight::check_provider(
        selected.provider_name,
        &selected.provider.base_url,
        &ctx.host.path,
    )?;
    let workspace = match workspace {
        Some(dir) => dir.to_owned(),
        None => std::env::current_dir().map_err(|e| {
            CliError::bad_input(format!(
                "cannot read the current directory ({e}); pass the workspace with --workspace DIR."
            ))
        })?,
    };
    check_workspace(&workspace)?;
    let spec = JobSpec {
        composition_yaml: text,
        composition_name: composition.name.clone(),
        workspace: JobWorkspace::Path {
            path: canonical(&workspace).display().to_string(),
        },
        resume: None,
        resume_from: None,
    };
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
        carry: None,
        spec: Some(spec),
    };
    let throttle = ThrottlePlan::for_store_url(&ctx.home.dir, &store, &ctx.host);
    Ok(Prepared {
        config,
        store,
        throttle,
    })
}

/// The workspace path as the run record keeps it (its canonical form).
pub fn canonical(dir: &Path) -> PathBuf {
    Workspace::open(dir).map_or_else(|_| dir.to_owned(), |w| w.root().to_owned())
}
