//! Running a composition: steps in order, each step's attempts, and the run record as it goes.
//!
//! Per step, attempt 1 is paid from the `initial` budget. After each failed attempt the driver
//! asks the step policy once whether to retry, from which budget and after how long:
//! `docsfab_policy::step::decide` for a read-only step, `step::decide_write` with the proven
//! write settlement for a write step, which may answer "restore first" (the restore runs, and
//! `PendingRestore::after_restore` decides on its result). It does what the answer says, records
//! the decision on the attempt, commits the attempt to the run store, and only then waits and
//! starts the next attempt. Every attempt is a fresh
//! [`crate::agent::run_attempt`] with the composition's sealed ceilings and a restored source-read
//! budget (STP-2), so a run that does not fail makes exactly one attempt per step.
//!
//! The run builds one response boundary from the provider's API, the selected model and the
//! API key (as a host secret labelled with its variable), and every attempt checks each
//! completed turn's raw 200 body against it before using it (BND-1, STP-14): the runtime's own
//! turns meet the same check as the composition route's clients.
//!
//! The module's files: this one runs a run (its entries, the run's record around its steps, the
//! steps in order); `config` is what a run is given and how it ends; `ctx` is what every step of
//! the run shares; `step` runs one step's attempts and asks the step policy between them;
//! `instances` runs a fan-out step's instances and `pages` a pages step.
//!
//! Cancellation is one token for the run, a child of the caller's: the caller (Ctrl-C) or the
//! job deadline (`runtime.deadlineMilliseconds`) cancels it, and everything that waits (provider
//! requests, replay backoffs, step backoffs) races it, so the run ends at once and is recorded
//! `cancelled` with the reason.

mod config;
mod ctx;
mod instances;
mod pages;
mod step;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use docsfab_boundary::{BoundaryConfig, Secret};
use docsfab_provider::{HttpConfig, HttpTransport, RunBudget, SpendLimits, Transport};
use docsfab_record::{RunContext, RunLink, RunProvider, RunStatus};

pub use self::config::{
    CancelReason, Carry, ProviderSettings, RunConfig, RunError, RunOutcome, SpendSettings,
};
use self::ctx::{Ctx, step_start};
use self::step::run_begun_step;
use crate::composition::{Composition, Step, output_references};
use crate::reuse::Looks;
use crate::store::RunStore;
use crate::workspace::Workspace;

/// The label of a key found in a response when the key came without one.
const UNLABELLED_KEY: &str = "provider-api-key";

/// The run's response boundary: the provider's API, the selected model, and the key's value as
/// a host secret (a key under 8 bytes cannot be searched for; every known key shape still is).
fn boundary_config(provider: &ProviderSettings, model: &str) -> Result<BoundaryConfig, String> {
    let secrets: Vec<Secret> = provider
        .api_key
        .iter()
        .filter_map(|k| Secret::new(k.label().unwrap_or(UNLABELLED_KEY), k.expose()).ok())
        .collect();
    BoundaryConfig::new(provider.api, model, &secrets).map_err(|e| e.to_string())
}

pub use crate::progress::{Progress, ProgressSink, countdown_text};

/// Runs a composition to its end and returns the run id and its final status. The run is in
/// `store` from its first moment; each finished attempt is committed before the next starts.
pub async fn run_composition(cfg: RunConfig, store: &mut RunStore) -> Result<RunOutcome, RunError> {
    run_over_http(cfg, None, store).await
}

/// [`run_composition`] into a run this process already claimed from the queue
/// ([`crate::store::JobQueue::claim_next`]): that `running` run gets its context and the steps, instead of a
/// new run being created. A claimed run that cannot start (its workspace or transport cannot be
/// set up) is finished `failed`, so it does not stay `running` under a live owner.
pub async fn run_claimed(
    cfg: RunConfig,
    run_id: String,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    run_over_http(cfg, Some(run_id), store).await
}

/// [`run_with_transport`] into an already claimed run (see [`run_claimed`]).
pub async fn run_claimed_with_transport(
    cfg: RunConfig,
    run_id: String,
    workspace: &Workspace,
    transport: &dyn Transport,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    run_into(cfg, Some(run_id), workspace, transport, store).await
}

/// Opens the workspace and the provider's HTTP transport, then runs into `claimed` (or a new
/// run when `None`).
async fn run_over_http(
    cfg: RunConfig,
    claimed: Option<String>,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    let setup = open_workspace(&cfg).and_then(|w| Ok((w, http_transport(&cfg)?)));
    let (workspace, transport) = match setup {
        Ok(ready) => ready,
        Err(e) => {
            if let Some(run_id) = &claimed {
                let _ = store.finish_run_because(run_id, RunStatus::Failed, &e.to_string());
            }
            return Err(e);
        }
    };
    run_into(cfg, claimed, &workspace, &transport, store).await
}

fn open_workspace(cfg: &RunConfig) -> Result<Workspace, RunError> {
    Workspace::open(&cfg.workspace).map_err(|e| RunError::Workspace(e.evidence))
}

fn http_transport(cfg: &RunConfig) -> Result<HttpTransport, RunError> {
    // The raw body is kept for the response boundary (BND-1), which judges it as it is read.
    let mut transport = HttpTransport::new(HttpConfig {
        keep_raw_body: true,
        ..HttpConfig::new(
            cfg.provider.api,
            cfg.provider.base_url.clone(),
            cfg.provider.api_key.clone(),
        )
    })?;
    if let Ok(boundary) = boundary_config(&cfg.provider, &selected_model(cfg)) {
        transport = transport.with_boundary(boundary);
    }
    Ok(transport)
}

/// [`run_composition`] over a given transport (a test or an embedded route may bring its own).
pub async fn run_with_transport(
    cfg: RunConfig,
    workspace: &Workspace,
    transport: &dyn Transport,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    run_into(cfg, None, workspace, transport, store).await
}

/// The one body of every entry above: the run is `claimed` (running already, its context set
/// here) or created now with its context.
async fn run_into(
    cfg: RunConfig,
    claimed: Option<String>,
    workspace: &Workspace,
    transport: &dyn Transport,
    store: &mut RunStore,
) -> Result<RunOutcome, RunError> {
    let context = run_context(&cfg, workspace);
    let run_id = match claimed {
        Some(run_id) => {
            store.set_context(&run_id, &context)?;
            run_id
        }
        None => match &cfg.spec {
            Some(spec) => store.create_run_from(&context, spec)?,
            None => store.create_run_with_context(&cfg.composition.name, &context)?,
        },
    };
    let cancel = cfg.cancel.child_token();
    let deadline_ms = cfg.job_deadline.map_or(cfg.limits.deadline_ms(), |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
    });
    let deadline_fired = Arc::new(AtomicBool::new(false));
    let timer = {
        let cancel = cancel.clone();
        let fired = Arc::clone(&deadline_fired);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(deadline_ms)).await;
            fired.store(true, Ordering::SeqCst);
            cancel.cancel();
        })
    };

    let boundary = boundary_config(&cfg.provider, &selected_model(&cfg));
    let model = selected_model(&cfg);
    let ctx = Ctx {
        model: &model,
        taken: Mutex::new(HashSet::new()),
        grounding: Mutex::new(None),
        pages: Mutex::new(BTreeSet::new()),
        text_needed: text_needed(&cfg.composition),
        cfg: &cfg,
        workspace,
        transport,
        boundary: &boundary,
        cancel: &cancel,
        deadline_fired: &deadline_fired,
        deadline_ms,
        run_id: &run_id,
        budget: RunBudget::new(SpendLimits {
            max_run_tokens: cfg.composition.limits.max_run_tokens,
            max_run_cost_usd: cfg
                .provider
                .spend
                .max_run_cost_usd
                .zip(cfg.provider.spend.pricing),
        }),
    };
    ctx.emit(Progress::RunStarted {
        run_id: run_id.clone(),
    });
    let result = run_steps(&ctx, store).await;
    timer.abort();
    let status = match result {
        Ok(s) => s,
        Err(e) => {
            // Keep the record honest: a run the store could not follow to its end failed, and
            // its steps cannot say why.
            let _ = store.finish_run_because(&run_id, RunStatus::Failed, &e.to_string());
            return Err(e);
        }
    };
    store.finish_run(&run_id, status)?;
    let cancel_reason = (status == RunStatus::Cancelled).then(|| ctx.cancel_reason());
    Ok(RunOutcome {
        run_id,
        status,
        cancel_reason,
    })
}

/// What the record says about where and with what the run worked. The provider's host is its
/// base URL's host and port only, so user information or a query in the URL never reaches it.
fn run_context(cfg: &RunConfig, workspace: &Workspace) -> RunContext {
    let provider = &cfg.provider;
    RunContext {
        workspace: workspace.root().to_string_lossy().into_owned(),
        provider: RunProvider {
            name: provider.name.clone(),
            api: provider.api,
            host: docsfab_policy::host::base_url_host(&provider.base_url)
                .unwrap_or_else(|| "-".to_owned()),
        },
        model: selected_model(cfg),
        docsfab_version: env!("CARGO_PKG_VERSION").to_owned(),
        resumed_from: cfg.carry.as_ref().filter(|c| c.resume).map(|c| RunLink {
            run_id: c.reference.run_id().to_owned(),
        }),
    }
}

/// The composition's model, or the provider's.
fn selected_model(cfg: &RunConfig) -> String {
    cfg.composition
        .model
        .clone()
        .unwrap_or_else(|| cfg.provider.model.clone())
}

async fn run_steps(ctx: &Ctx<'_>, store: &mut RunStore) -> Result<RunStatus, RunError> {
    let mut outputs: BTreeMap<String, String> = BTreeMap::new();
    for step in &ctx.cfg.composition.steps {
        if ctx.cancel.is_cancelled() {
            // Cancelled between steps: the next step is recorded with no attempt and the reason,
            // so the record says why the run stopped.
            let index = store.begin_step(ctx.run_id, &step_start(ctx, step))?;
            store.finish_step(ctx.run_id, index, &ctx.cancelled_end())?;
            return Ok(RunStatus::Cancelled);
        }
        let (status, output) = match &step.fan_out {
            Some(fan) => instances::run_fan_out(ctx, store, step, fan, &outputs).await?,
            None if step.writes_pages() => pages::run_pages_step(ctx, store, step, &outputs)?,
            None => run_step(ctx, store, step, &outputs).await?,
        };
        ctx.emit(Progress::StepFinished {
            step_id: step.id.clone(),
            status,
        });
        match (status, output) {
            (RunStatus::Succeeded, Some(out)) => {
                ctx.note_pages(&out);
                outputs.insert(step.id.clone(), out);
            }
            (RunStatus::Succeeded, None) => {}
            (other, _) => return Ok(other),
        }
    }
    Ok(RunStatus::Succeeded)
}

/// Replaces each `{{steps.ID.output}}` with that step's output text.
pub fn substitute_outputs(text: &str, outputs: &BTreeMap<String, String>) -> String {
    let Ok(refs) = output_references(text) else {
        return text.to_owned();
    };
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for r in refs {
        out.push_str(&text[at..r.range.start]);
        out.push_str(outputs.get(&r.step_id).map_or("", String::as_str));
        at = r.range.end;
    }
    out.push_str(&text[at..]);
    out
}

async fn run_step(
    ctx: &Ctx<'_>,
    store: &mut RunStore,
    step: &Step,
    outputs: &BTreeMap<String, String>,
) -> Result<(RunStatus, Option<String>), RunError> {
    let instructions = substitute_outputs(&step.instructions, outputs);
    let reused = ctx.reusable(
        &step.id,
        &ctx.fingerprint(step, &instructions),
        &mut Looks::default(),
    );
    let step_index = store.begin_step(ctx.run_id, &step_start(ctx, step))?;
    if let Some(at) = reused {
        return ctx.carry_over(&mut **store, step, step_index, at);
    }
    run_begun_step(ctx, &mut **store, step, step_index, instructions, None).await
}

/// The steps whose answer text a later step needs: named in instructions, or fanned out over.
fn text_needed(composition: &Composition) -> HashSet<String> {
    let mut needed = HashSet::new();
    for step in &composition.steps {
        for r in output_references(&step.instructions).unwrap_or_default() {
            needed.insert(r.step_id);
        }
        if let Some(fan) = &step.fan_out {
            needed.insert(fan.step_id.clone());
        }
    }
    needed
}
