//! What `docsfab run` and `docsfab runs resume` check and build before a run starts: the whole
//! configuration, the provider and its key, the workspace, and the store. Nothing is written
//! here, so bad input (exit 2) leaves nothing behind.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use docsfab_policy::host::ProviderSpend;
use docsfab_provider::ApiKey;
use docsfab_runtime::executor::{ProviderSettings, RunConfig, SpendSettings};
use docsfab_runtime::store::{JobSpec, JobWorkspace, RunStore, StoreUrl};
use docsfab_runtime::workspace::Workspace;
use tokio_util::sync::CancellationToken;

use crate::app::error::{CliError, emit};
use crate::app::execute::{check_workspace, conclude, execute, read_key, runtime, summary};
use crate::app::home::{Selected, validate_run_file, validate_run_text};
use crate::app::print::to_json;
use crate::app::progress::ColorChoice;
use crate::app::store::{load_record, store_url};
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
        provider: provider_settings(&selected, api_key),
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

/// Runs `config` to its end (progress on stderr, the id first on stdout), then prints its
/// record (`json`) or its summary, and returns the run's exit.
pub fn run_and_report(
    config: RunConfig,
    store: &mut RunStore,
    color: ColorChoice,
    json: bool,
) -> Result<(), CliError> {
    let started = Instant::now();
    let outcome = runtime()?.block_on(execute(config, store, color))?;
    let record = load_record(store, &outcome.run_id)?;
    if json {
        emit(&format!("{}\n", to_json(&record)?))?;
    } else {
        let color = color.for_stream(std::io::stdout().is_terminal());
        emit(&summary(&record, started.elapsed(), color))?;
    }
    conclude(&outcome, &record)
}

/// The provider a run talks to, from the selection host.yaml made, with its key.
pub fn provider_settings(selected: &Selected<'_>, api_key: ApiKey) -> ProviderSettings {
    ProviderSettings {
        name: selected.provider_name.to_owned(),
        api: selected.provider.api,
        base_url: selected.provider.base_url.clone(),
        model: selected.model.to_owned(),
        api_key: Some(api_key),
        spend: spend_settings(&selected.provider.spend),
        structured_output: selected.provider.structured_output(),
    }
}

/// What the runtime needs of host.yaml's usage, price and budget settings.
pub fn spend_settings(s: &ProviderSpend) -> SpendSettings {
    SpendSettings {
        include_usage: s.include_usage,
        prompt_caching: s.prompt_caching,
        pricing: s.pricing,
        max_run_cost_usd: s.max_run_cost_usd,
    }
}

/// The workspace path as the run record keeps it (its canonical form).
pub fn canonical(dir: &Path) -> PathBuf {
    Workspace::open(dir).map_or_else(|_| dir.to_owned(), |w| w.root().to_owned())
}
